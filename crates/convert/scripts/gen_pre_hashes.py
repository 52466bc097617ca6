#!/usr/bin/env python3
"""Generate crates/convert/src/vocab/pre_hashes.rs from llama.cpp's conversion/base.py
(get_vocab_base_pre): the known BPE pre-tokenizer hashes and the check text they hash.

    python3 gen_pre_hashes.py <llama.cpp source dir> > ../src/vocab/pre_hashes.rs
"""
import re
import sys

src = open(f"{sys.argv[1]}/conversion/base.py", encoding="utf-8").read()
body = src[src.index("# Marker: Start get_vocab_base_pre"):src.index("# Marker: End get_vocab_base_pre")]
pairs = re.findall(r'if chkhsh == "([0-9a-f]{64})":\s*\n\s*# ref: (\S+)\s*\n\s*res = "([^"]+)"', body)
ns = {}
exec("chktxt = " + re.search(r"chktxt = (.*)\n", body).group(1), ns)
print("//! Known BPE pre-tokenizers, identified by the SHA-256 of the token ids of a fixed check text")
print("//! (llama.cpp b11434 `conversion/base.py`, `get_vocab_base_pre`; generated from that file by")
print("//! `crates/convert/scripts/gen_pre_hashes.py`). Data only.")
print()
print("/// The text whose token ids are hashed.")
def rust_literal(text):
    out = []
    for c in text:
        if c == "\\" or c == '"':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif 32 <= ord(c) < 127:
            out.append(c)
        else:
            out.append("\\u{%x}" % ord(c))
    return '"' + "".join(out) + '"'


print(f"pub const CHECK_TEXT: &str = {rust_literal(ns['chktxt'])};")
print()
print("/// (chkhsh, `tokenizer.ggml.pre` value, reference model repository)")
print("pub const KNOWN_PRE_TOKENIZERS: &[(&str, &str, &str)] = &[")
for h, ref, res in pairs:
    repo = "/".join(ref.rstrip("/").split("/")[-2:])
    print(f'    ("{h}", "{res}", "{repo}"),')
print("];")
