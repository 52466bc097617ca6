#!/usr/bin/env python3
"""Merge the JSON lines of bench/quant/run.sh into a markdown table with ratios."""
import json, sys, pathlib

out = pathlib.Path(sys.argv[1])
def load(name):
    d = {}
    p = out / name
    if p.exists():
        for line in p.read_text().splitlines():
            r = json.loads(line)
            d[(r["type"].lower(), r["variant"])] = r
    return d

ggml, h1, h2 = load("ggml.jsonl"), load("hf2q-1t.jsonl"), load("hf2q-2t.jsonl")
print((out / "setup.txt").read_text())
print("| type | variant | ggml 1 thread (Mvalues/s) | hf2q 1 thread | ratio hf2q/ggml | hf2q 2 threads | 2t/1t scaling | same bytes |")
print("|---|---|---:|---:|---:|---:|---:|---|")
for key, g in ggml.items():
    mv = lambda r: r["values"] / r["median_s"] / 1e6
    a, b = h1.get(key), h2.get(key)
    if not a:
        print(f"| {key[0]} | {key[1]} | {mv(g):.1f} | — | — | — | — | not implemented |")
        continue
    print(f"| {key[0]} | {key[1]} | {mv(g):.1f} | {mv(a):.1f} | {mv(a)/mv(g):.2f}x | {mv(b):.1f} | {mv(b)/mv(a):.2f}x | {'yes' if a['hash'] == g['hash'] and b['hash'] == g['hash'] else 'NO'} |")
