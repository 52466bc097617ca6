#!/usr/bin/env python3
"""Summarise bench/embed/run.sh's results.jsonl: passages/s per tool, model and set (median over
rounds), and hf2q's ratios to each peer per round with their median."""
import json
import pathlib
import statistics
import sys

out = pathlib.Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "results.jsonl").read_text().splitlines() if l.strip()]
for r in rows:
    r["pps"] = r["passages"] / float(r["seconds"])
print("# Embeddings throughput (passages/s)\n")
print((out / "machine.txt").read_text().split("\n")[0].lstrip("# "), "\n")
print("| set | model | hf2q | sentence-transformers | llama-embedding | hf2q / ST (median of rounds) | hf2q / llama (median) |")
print("|---|---|---:|---:|---:|---:|---:|")
for s in ["short", "long"]:
    for ty in ["f16", "f32"]:
        rounds = sorted({r["round"] for r in rows})
        h, st, ll, rs, rl = [], [], [], [], []
        for k in rounds:
            get = lambda tool, model: [r["pps"] for r in rows if r["round"] == k and r["set"] == s and r["tool"] == tool and r["model"] == model]
            a, b, c = get("hf2q", ty), get("sentence-transformers", "hf"), get("llama-embedding", ty)
            if a and b and c:
                h.append(a[0]); st.append(b[0]); ll.append(c[0])
                rs.append(a[0] / b[0]); rl.append(a[0] / c[0])
        if h:
            m = statistics.median
            print(f"| {s} | {ty} | {m(h):.1f} | {m(st):.1f} | {m(ll):.1f} | {m(rs):.2f}x ({', '.join(f'{x:.2f}' for x in rs)}) | {m(rl):.2f}x ({', '.join(f'{x:.2f}' for x in rl)}) |")
print("\nCommands: see commands.txt; raw figures: results.jsonl.")
