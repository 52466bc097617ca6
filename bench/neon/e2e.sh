#!/usr/bin/env bash
# hf2q (cross-built for aarch64, NEON kernels) and llama.cpp b11434 (cross-built for aarch64 with
# GCC 12, armv8.2-a+dotprod) under qemu-user on the same model and text: perplexity and a greedy
# completion. Correctness only: qemu says nothing about speed.
# usage: bench/neon/e2e.sh OUT_DIR LLAMA_ARM_BIN_DIR MODEL.gguf TEXT
set -euo pipefail
out=$1; bin=$2; model=$3; text=$4
mkdir -p "$out"
q="qemu-aarch64 -L /usr/aarch64-linux-gnu"
hf2q=${HF2Q_ARM:-target/aarch64-unknown-linux-gnu/release/hf2q}
name=$(basename "$model" .gguf)
{
  echo "# $(date -u +%FT%TZ) $(uname -srm), $(qemu-aarch64 --version | head -1)"
  echo "working tree: $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (dirty)')"
} > "$out/machine.txt"
run() { echo "$*" >> "$out/commands.txt"; "$@"; }
run $q "$hf2q" perplexity -m "$model" -f "$text" -c 512 -t 2 > "$out/$name.hf2q.ppl.txt" 2>&1
run $q "$bin/llama-perplexity" -m "$model" -f "$text" -c 512 -t 2 > "$out/$name.llama.ppl.txt" 2>&1
p="The capital of France is"
run $q "$hf2q" generate -m "$model" -p "$p" -n 24 --temp 0 -t 2 > "$out/$name.hf2q.gen.txt" 2>/dev/null
run $q "$bin/llama-completion" -m "$model" -p "$p" -n 24 --temp 0 -t 2 -no-cnv --no-display-prompt \
  > "$out/$name.llama.gen.txt" 2>/dev/null
grep -h "Final estimate" "$out/$name".*.ppl.txt
cat "$out/$name.hf2q.gen.txt"; echo; cat "$out/$name.llama.gen.txt"; echo
