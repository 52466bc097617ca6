#!/bin/bash
# MTP speculation on the tiny Qwen 3.5 fixture (random weights, one MTP block), CPU, 2 threads:
# `hf2q bench -p 0 -n 128` with --spec off, ngram and mtp (--draft-max 1, 4, 16) on
#   1. the fixture converted to F32 as it is;
#   2. the same file with both output heads zero (mtp_zero_heads.py --zero-target-head): the
#      target then always chooses token 0 and the MTP head always drafts token 0, so every draft
#      is kept: the cost of the machinery at 100 % acceptance.
# usage: bench/spec/mtp.sh HF2Q FIXTURES_DIR LLAMA_CPP_SRC OUT_DIR   (DEVICE=cuda: on the GPU;
#        the zero-heads file needs gguf-py, in LLAMA_CPP_SRC or installed: skipped, saying so, without)
set -eu
H=$1; FIX=$2; SRC=$3; OUT=$4
DEV=${DEVICE:-cpu}
mkdir -p "$OUT"
"$H" convert "$FIX/tiny/qwen3_5" -q f32 -o "$OUT/qwen3_5.f32.gguf"
files=qwen3_5.f32
if PYTHONPATH="$SRC/gguf-py" python3 "$(dirname "$0")/mtp_zero_heads.py" "$OUT/qwen3_5.f32.gguf" \
    "$OUT/qwen3_5.zero-heads.f32.gguf" --zero-target-head; then
  files="$files qwen3_5.zero-heads.f32"
else
  echo "NOT RUN: the zero-heads file (no gguf-py)"
fi
for m in $files; do
  echo "## $m ($DEV)"
  "$H" bench -m "$OUT/$m.gguf" --device $DEV -p 0 -n 128 -r 5 -t 2 --spec off | tail -1
  for s in ngram mtp; do
    for k in 1 4 16; do
      echo "# --spec $s --draft-max $k"
      "$H" bench -m "$OUT/$m.gguf" --device $DEV -p 0 -n 128 -r 5 -t 2 --spec $s --draft-max $k | tail -2
    done
  done
done
