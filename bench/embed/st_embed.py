#!/usr/bin/env python3
"""sentence-transformers on one passage file: torch.set_num_threads(THREADS), batch 32 (the
library's default), max_seq_length 512 (the model's position limit; the default 256 would cut the
long passages that the GGUF tools read whole). Prints one JSON line: passages, seconds of
encode() (model loading excluded), passages/s.

usage: st_embed.py MODEL_DIR PASSAGES.txt THREADS"""
import json
import sys
import time

import torch
from sentence_transformers import SentenceTransformer

model_dir, path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(threads)
texts = [l for l in open(path, encoding="utf-8").read().splitlines() if l.strip()]
m = SentenceTransformer(model_dir, device="cpu")
m.max_seq_length = 512
m.encode(texts[:8])  # warm-up
t = time.perf_counter()
m.encode(texts, batch_size=32)
s = time.perf_counter() - t
print(json.dumps({"tool": "sentence-transformers", "passages": len(texts), "seconds": s, "passages_per_s": len(texts) / s}))
