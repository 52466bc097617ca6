#!/usr/bin/env bash
# Embeddings throughput, side by side in one run on one machine: `hf2q embed` (default, exact
# mode) vs sentence-transformers (PyTorch CPU) vs llama.cpp b11434's `llama-embedding`, on
# all-MiniLM-L6-v2 converted by hf2q to F16 and F32 GGUF, two passage sets (make_passages.py),
# THREADS threads (default 2), ROUNDS rounds (default 3; the host drifts). Wall time of each CLI
# includes loading its model; sentence-transformers is timed around encode() only.
#
# usage: bench/embed/run.sh OUT_DIR LLAMA_BIN_DIR MINILM_HF_DIR PYTHON_WITH_SENTENCE_TRANSFORMERS
set -euo pipefail
out=$1; bin=$2; hfdir=$3; py=$4
here=$(cd "$(dirname "$0")" && pwd)
hf2q=${HF2Q:-target/release/hf2q}
threads=${THREADS:-2}
rounds=${ROUNDS:-3}
mkdir -p "$out"
{
  echo "# $(date -u +%FT%TZ) $(uname -srm)"
  grep -m1 'model name' /proc/cpuinfo
  grep -m1 '^flags' /proc/cpuinfo
  echo "threads: $threads"
  "$hf2q" --version
  echo "working tree: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
  "$py" -c 'import torch, sentence_transformers as s; print("torch", torch.__version__, "sentence-transformers", s.__version__)'
} > "$out/machine.txt"
python3 "$here/make_passages.py" "$out/passages"
for ty in f16 f32; do
  "$hf2q" convert "$hfdir" --quant $ty -o "$out/minilm.$ty.gguf" 2>/dev/null
done
wall() { local t0 t1; t0=$(date +%s.%N); "$@" > /dev/null 2>&1; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
: > "$out/results.jsonl"
for round in $(seq 1 "$rounds"); do
  for set in short long; do
    p="$out/passages/$set.txt"
    n=$(grep -c . "$p")
    echo "== round $round: $set" >&2
    r=$("$py" "$here/st_embed.py" "$hfdir" "$p" "$threads")
    echo "{\"round\": $round, \"set\": \"$set\", \"model\": \"hf\", ${r#\{}" >> "$out/results.jsonl"
    for ty in f16 f32; do
      m="$out/minilm.$ty.gguf"
      s=$(wall "$hf2q" embed -m "$m" -f "$p" -t "$threads")
      echo "{\"round\": $round, \"set\": \"$set\", \"model\": \"$ty\", \"tool\": \"hf2q\", \"passages\": $n, \"seconds\": $s}" >> "$out/results.jsonl"
      s=$(wall "$bin/llama-embedding" -m "$m" -f "$p" -t "$threads" --pooling mean -b 8192 -ub 8192 -c 8192)
      echo "{\"round\": $round, \"set\": \"$set\", \"model\": \"$ty\", \"tool\": \"llama-embedding\", \"passages\": $n, \"seconds\": $s}" >> "$out/results.jsonl"
    done
  done
done
cat > "$out/commands.txt" <<CMDS
$py $here/st_embed.py $hfdir PASSAGES $threads
$hf2q embed -m MODEL.gguf -f PASSAGES -t $threads
$bin/llama-embedding -m MODEL.gguf -f PASSAGES -t $threads --pooling mean -b 8192 -ub 8192 -c 8192
CMDS
python3 "$here/report.py" "$out" > "$out/README.md"
cat "$out/README.md"
