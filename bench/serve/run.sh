#!/usr/bin/env bash
# Serving throughput and latency: hf2q serve vs llama-server (llama.cpp b11434), same GGUF, same
# machine, same run, same prompts: streaming greedy chat at 1, 4, 8 and 16 concurrent clients
# (bench/serve/load.py), each server with as many slots as clients and 2048 tokens of context
# per slot, 2 threads, continuous batching on.
#
#   bench/serve/run.sh OUT_DIR MODEL.gguf LLAMA_SERVER [ROUNDS] [MAX_TOKENS]
set -euo pipefail
OUT=$1; MODEL=$2; LS=$3; ROUNDS=${4:-2}; MAXTOK=${5:-128}
HF2Q=${HF2Q:-target/release/hf2q}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"; : > "$OUT/results.jsonl"; : > "$OUT/commands.txt"
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "model: $MODEL ($(du -h "$MODEL" | cut -f1)); rounds $ROUNDS per client; max_tokens $MAXTOK; temperature 0"
  echo "hf2q: $($HF2Q --version)"
} > "$OUT/setup.txt"
wait_ready() { # url
  for _ in $(seq 600); do
    curl -sf --noproxy '*' "$1" >/dev/null 2>&1 && return 0; sleep 0.2
  done; echo "server did not become ready: $1" >&2; return 1
}
PORT=18431
NAME=$(basename "$MODEL" .gguf)  # hf2q serves a model under its file stem (llama-server takes any name)
for C in 1 4 8 16; do
  for engine in llama hf2q; do
    if [ $engine = hf2q ]; then
      cmd=("$HF2Q" serve -m "$MODEL" --port $PORT -t 2 --parallel "$C" --ctx 2048)
      ready="http://127.0.0.1:$PORT/readyz"
    else
      cmd=("$LS" -m "$MODEL" --port $PORT -t 2 -np "$C" -c $((2048 * C)) -cb --no-webui)
      ready="http://127.0.0.1:$PORT/health"
    fi
    echo "${cmd[*]}" >> "$OUT/commands.txt"
    "${cmd[@]}" > "$OUT/$engine.$C.log" 2>&1 &
    pid=$!
    wait_ready "$ready"
    # one untimed warm-up request, then the level
    python3 "$HERE/load.py" "http://127.0.0.1:$PORT/v1" "$NAME" 1 1 8 > /dev/null
    r=$(python3 "$HERE/load.py" "http://127.0.0.1:$PORT/v1" "$NAME" "$C" "$ROUNDS" "$MAXTOK")
    echo "{\"engine\":\"$engine\",\"result\":$r}" | tee -a "$OUT/results.jsonl"
    kill $pid; wait $pid 2>/dev/null || true
  done
done
python3 - "$OUT" <<'PY' | tee "$OUT/report.md"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "results.jsonl").read_text().splitlines()]
by = {(r["engine"], r["result"]["concurrency"]): r["result"] for r in rows}
print((out / "setup.txt").read_text())
print("| clients | hf2q tok/s | llama-server tok/s | ratio | hf2q TTFT p50 / p99 (s) | llama-server TTFT p50 / p99 (s) | TTFT p50 ratio (llama/hf2q) |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for c in sorted({k[1] for k in by}):
    h, l = by[("hf2q", c)], by[("llama", c)]
    print(f"| {c} | {h['tokens_per_s']:.1f} | {l['tokens_per_s']:.1f} | {h['tokens_per_s']/l['tokens_per_s']:.2f}x "
          f"| {h['ttft_p50_s']:.3f} / {h['ttft_p99_s']:.3f} | {l['ttft_p50_s']:.3f} / {l['ttft_p99_s']:.3f} "
          f"| {l['ttft_p50_s']/h['ttft_p50_s']:.2f}x |")
PY
