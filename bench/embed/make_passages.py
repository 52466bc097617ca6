#!/usr/bin/env python3
"""The passage sets of the embeddings benchmark, cut from the Alice in Wonderland text that the
perplexity test ships (crates/hf2q/tests/data/perplexity): OUT/short.txt, 1,000 passages of
8-40 words, and OUT/long.txt, 200 passages of 280 words (~390 MiniLM tokens, all within the model's 512). One passage a line,
seeded, so every tool reads the same bytes.

usage: make_passages.py OUT_DIR"""
import pathlib
import random
import sys

root = pathlib.Path(__file__).resolve().parents[2]
words = (root / "crates/hf2q/tests/data/perplexity/alice_in_wonderland.txt").read_text().split()
rng = random.Random(20261201)
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)


def passages(n, lo, hi):
    got = []
    for _ in range(n):
        k = rng.randint(lo, hi)
        start = rng.randrange(0, len(words) - k)
        got.append(" ".join(words[start : start + k]))
    return got


(out / "short.txt").write_text("\n".join(passages(1000, 8, 40)) + "\n")
(out / "long.txt").write_text("\n".join(passages(200, 280, 280)) + "\n")
