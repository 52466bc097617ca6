"""The bytes of weights a decode step reads for one token, from `hf2q info --tensors FILE`'s table
(the MoE roofline of #19: bytes a token × tokens/s ÷ the copy bandwidth).

usage: python3 bench/cuda/active_bytes.py INFO_TXT [EXPERTS_USED]

Every tensor counts whole, except the token embedding (one row of it is read) and the experts'
stacked tensors (`*_exps`: EXPERTS_USED of their experts are read; by default the file's own
"experts used" line, 8 for Qwen3-30B-A3B). The KV cache and activations are left out.
"""
import re
import sys

path = sys.argv[1]
used = int(sys.argv[2]) if len(sys.argv) > 2 else None
row = re.compile(r"^\s*\d+\s+(\S+)\s+(\S+)\s+\[([0-9, ]+)\]\s+(\d+)\s+\d+\s*$")
total = 0.0
parts = {"embedding row": 0.0, "experts": 0.0, "other": 0.0}
n = 0
lines = open(path).read().splitlines()
for line in lines:
    m = re.match(r"^experts used\s+(\d+)\s*$", line)
    if m and used is None:
        used = int(m.group(1))
for line in lines:
    m = row.match(line)
    if not m:
        continue
    n += 1
    name, shape, size = m.group(1), [int(x) for x in m.group(3).split(",")], int(m.group(4))
    if name == "token_embd.weight":
        b, k = size / shape[-1], "embedding row"
    elif "_exps" in name:
        if used is None:
            sys.exit(f"active_bytes: {name} is an experts' tensor, and {path} names no experts used: pass it")
        b, k = size * used / shape[-1], "experts"
    else:
        b, k = size, "other"
    parts[k] += b
    total += b
if n == 0:
    sys.exit(f"active_bytes: no tensor rows in {path} (is it `hf2q info --tensors` output?)")
print(f"{n} tensors, {used or 0} experts used; per token: " + ", ".join(f"{k} {v / 1e9:.4f} GB" for k, v in parts.items()) + f"; total {total / 1e9:.4f} GB")
