"""Compare two HF2Q_DUMP files (engine/src/debug.rs: name, 4 dims, f32 values per tensor) tensor by
tensor: max |a - b| and that relative to max |a|, in order, to find where two backends part.

usage: python3 bench/cuda/dump_diff.py A.dump B.dump
"""
import struct, sys

import numpy as np


def read(path):
    out, data = [], open(path, "rb").read()
    o = 0
    while o < len(data):
        (n,) = struct.unpack_from("<I", data, o); o += 4
        name = data[o:o + n].decode(); o += n
        dims = struct.unpack_from("<4q", data, o); o += 32
        (cnt,) = struct.unpack_from("<Q", data, o); o += 8
        v = np.frombuffer(data, "<f4", cnt, o); o += 4 * cnt
        out.append((name, dims, v))
    return out


a, b = read(sys.argv[1]), read(sys.argv[2])
for (na, da, va), (nb, db, vb) in zip(a, b):
    if na != nb or va.shape != vb.shape:
        print(f"{na} / {nb}: shapes {da} / {db} differ"); continue
    d = np.abs(va.astype(np.float64) - vb)
    scale = max(np.abs(va).max(), 1e-30)
    print(f"{na:24} max|Δ| {d.max():.3e}  rel {d.max() / scale:.3e}  mean|Δ| {d.mean():.3e}")
la, lb = a[-1][2], b[-1][2]
n_vocab = a[-1][1][0]
la, lb = la[-n_vocab:], lb[-n_vocab:]
for name, l in (("A", la), ("B", lb)):
    top = np.argsort(-l)[:5]
    print(name, "top-5 of the last row:", [(int(t), round(float(l[t]), 4)) for t in top])
