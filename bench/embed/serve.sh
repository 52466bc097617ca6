#!/usr/bin/env bash
# /v1/embeddings under 8 concurrent clients sending 64 passages each (serve_clients.py) against
# `hf2q embed` on the same 512 passages, ROUNDS rounds (default 3), on a model and passage file
# of a run.sh run directory. Appends JSON lines to OUT_DIR/serve.jsonl.
#
# usage: bench/embed/serve.sh OUT_DIR [MODEL.gguf]
set -euo pipefail
out=$1; m=${2:-$1/minilm.f16.gguf}
here=$(cd "$(dirname "$0")" && pwd)
hf2q=${HF2Q:-target/release/hf2q}
threads=${THREADS:-2}
head -512 "$out/passages/short.txt" > "$out/passages/short512.txt"
log=$(mktemp)
"$hf2q" serve -m "$m" --port 0 -t "$threads" 2> "$log" &
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$log"' EXIT
until grep -q 'ready' "$log"; do sleep 0.1; done
url=http://$(sed -n 's/.*listening on http:\/\///p' "$log")
id=$(basename "$m" .gguf)
echo "python3 $here/serve_clients.py $url $id $out/passages/short512.txt 8 1" >> "$out/commands.txt"
echo "$hf2q embed -m $m -f $out/passages/short512.txt -t $threads" >> "$out/commands.txt"
for round in $(seq 1 "${ROUNDS:-3}"); do
  r=$(python3 "$here/serve_clients.py" "$url" "$id" "$out/passages/short512.txt" 8 1)
  echo "{\"round\": $round, ${r#\{}" >> "$out/serve.jsonl"
  t0=$(date +%s.%N); "$hf2q" embed -m "$m" -f "$out/passages/short512.txt" -t "$threads" > /dev/null; t1=$(date +%s.%N)
  echo "{\"round\": $round, \"tool\": \"hf2q embed\", \"passages\": 512, \"seconds\": $(echo "$t1 - $t0" | bc)}" >> "$out/serve.jsonl"
done
curl -s "$url/metrics" | grep '^hf2q_embedding' >> "$out/serve-metrics.txt"
cat "$out/serve.jsonl"
