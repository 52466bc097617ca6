"""A numpy model of kernels/mmq.cu, to check its layouts and index arithmetic without a GPU.

usage: python3 bench/cuda/mmq_model.py        (needs numpy and gguf from PyPI)

It builds random Q4_K / Q6_K / Q8_0 weights, tiles them byte by byte as `tile_*` does, lays the
activations out as common.cuh's act_q8 does (both flavours, with the CPU backend's numbers), and
runs each warp's unit loop lane by lane with the mma fragments as the PTX ISA defines them
(mma.m16n8k32 / m16n8k16 .s8: A rows groupID and groupID + 8, columns tig·4 + i (+16); B rows
tig·4 + i (+16), column groupID; C rows groupID (+8), columns 2·tig + i). The outputs are
compared with the exact product of the dequantized weights (gguf-py) and activations. What it
cannot check is the hardware itself: that the fragment layout is the ISA's is assumed by both.
"""
import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

rng = np.random.default_rng(1)
f32 = np.float32


def rand_weights(ty, m, n):
    """Random valid blocks (small f16 scales, random quants), (m, row_bytes) uint8."""
    if ty == T.Q8_0:
        nb, bs = n // 32, 34
        raw = rng.integers(0, 256, size=(m, nb, bs), dtype=np.uint8)
        d = (rng.random((m, nb)) * 0.02 + 0.001).astype(np.float16)
        raw[:, :, 0:2] = d.view(np.uint8).reshape(m, nb, 2)
    elif ty == T.Q4_K:
        nb, bs = n // 256, 144
        raw = rng.integers(0, 256, size=(m, nb, bs), dtype=np.uint8)
        dd = (rng.random((m, nb, 2)) * 0.01 + 0.001).astype(np.float16)
        raw[:, :, 0:4] = dd.view(np.uint8).reshape(m, nb, 4)
    else:
        nb, bs = n // 256, 210
        raw = rng.integers(0, 256, size=(m, nb, bs), dtype=np.uint8)
        d = (rng.random((m, nb)) * 0.01 + 0.001).astype(np.float16)
        raw[:, :, 208:210] = d.view(np.uint8).reshape(m, nb, 2)
    return raw.reshape(m, nb * bs)


def rint(v):
    return np.rint(v).astype(np.int64)  # half to even, as __float2int_rn


def act_pos(k):
    kk = k & 255
    j, w = kk >> 5, kk & 31
    return (k & ~255) + ((w & 15) >> 2) * 64 + j * 8 + (w & 3) + ((w >> 4) << 2)


def act_q8(x, n_pad):
    """Both flavours of one row: (q0, d0, qk, dk) in the kernels' layout, and the values."""
    n = len(x)
    v = np.zeros(n_pad, f32)
    v[:n] = x
    pos = act_pos(np.arange(n_pad))
    q0 = np.zeros(n_pad, np.int8)
    d0 = np.zeros(n_pad // 32, f32)
    qk = np.zeros(n_pad, np.int8)
    dk = np.zeros(n_pad // 32, f32)
    for b in range(n_pad // 32):
        blk = v[32 * b : 32 * b + 32]
        amax = f32(np.abs(blk).max())
        d = f32(amax / f32(127))
        idv = f32(f32(127) / amax) if amax != 0 else f32(0)
        q = rint((blk * idv).astype(f32))
        q0[pos[32 * b : 32 * b + 32]] = q
        d0[b] = f32(np.float16(d))
    for u in range(n_pad // 256):
        blk = v[256 * u : 256 * u + 256]
        a = np.abs(blk)
        amax = a.max()
        q = np.zeros(256, np.int64)
        d = f32(0)
        if amax != 0:
            mx = blk[int(np.argmax(a == amax))]
            iscale = f32(f32(-127) / mx)
            q = np.minimum(rint((iscale * blk).astype(f32)), 127)
            d = f32(f32(1) / iscale)
        qk[pos[256 * u : 256 * u + 256]] = q
        dk[8 * u : 8 * u + 8] = d
    return q0, d0, qk, dk


def unpos(q, n_pad):
    """Values in element order from the kernels' layout."""
    return q[act_pos(np.arange(n_pad))]


# ---- tiling (tile_src_* of mmq.cu, the same expressions)
def src_q4_k(p):
    if p < 64:
        return p >> 2, p & 3, 0
    if p < 256:
        p -= 64
        return p // 12, 4 + p % 12, 0
    p -= 256
    i, lane, slot, byte = p >> 9, (p & 511) >> 4, (p & 15) >> 2, p & 3
    return (lane >> 2) + 8 * (slot & 1), 16 + 32 * i + 4 * ((lane & 3) + 4 * (slot >> 1)) + byte, 0


def src_q6_k(p):
    if p < 32:
        return p >> 1, 208 + (p & 1), 0
    if p < 288:
        p -= 32
        return p >> 4, 192 + (p & 15), 0
    if p < 2336:
        p -= 288
        lane, idx, byte = p >> 6, (p & 63) >> 2, p & 3
        rs, hh, q1, n2 = idx & 1, (idx >> 1) & 1, (idx >> 2) & 1, idx >> 3
        return (lane >> 2) + 8 * rs, 64 * n2 + 32 * q1 + 16 * hh + 4 * (lane & 3) + byte, 0
    p -= 2336
    lane, idx, byte = p >> 5, (p & 31) >> 2, p & 3
    rs, hh, n2 = idx & 1, (idx >> 1) & 1, idx >> 2
    return (lane >> 2) + 8 * rs, 128 + 32 * n2 + 16 * hh + 4 * (lane & 3) + byte, 0


def src_q8_0(p):
    if p < 256:
        blk = (p & 15) >> 1
        return p >> 4, 34 * blk + (p & 1), blk
    p -= 256
    j, lane, slot, byte = p >> 9, (p & 511) >> 4, (p & 15) >> 2, p & 3
    return (lane >> 2) + 8 * (slot & 1), 34 * j + 2 + 4 * ((lane & 3) + 4 * (slot >> 1)) + byte, j


TYPES = {
    T.Q4_K: (2304, 144, src_q4_k),
    T.Q6_K: (3360, 210, src_q6_k),
    T.Q8_0: (4352, 272, src_q8_0),
}


def tile(ty, raw, m, n):
    UB, SUB, src = TYPES[ty]
    U = (n + 255) // 256
    nb = n // 32 if ty == T.Q8_0 else n // 256
    tiles = (m + 15) // 16
    maps = [src(p) for p in range(UB)]
    out = np.zeros((tiles, U, UB), np.uint8)
    for t in range(tiles):
        for u in range(U):
            for p, (r, off, blk) in enumerate(maps):
                row = t * 16 + r
                ok = row < m and ((u * 8 + blk < nb) if ty == T.Q8_0 else u < nb)
                if ok:
                    out[t, u, p] = raw[row, u * SUB + off]
    return out


# ---- fragments
def lanes():
    l = np.arange(32)
    return l >> 2, l & 3


def bytes_s8(w):
    """(32,) u32 -> (32, 4) signed bytes."""
    w = np.asarray(w, np.uint32)
    return np.stack([((w >> (8 * i)) & 0xFF).astype(np.uint8).view(np.int8) for i in range(4)], 1).astype(np.int64)


def mma_k32(a, b):
    g, tig = lanes()
    A = np.zeros((16, 32), np.int64)
    B = np.zeros((32, 8), np.int64)
    for L in range(32):
        for i in range(4):
            A[g[L], tig[L] * 4 + i] = bytes_s8(a[0])[L, i]
            A[g[L] + 8, tig[L] * 4 + i] = bytes_s8(a[1])[L, i]
            A[g[L], 16 + tig[L] * 4 + i] = bytes_s8(a[2])[L, i]
            A[g[L] + 8, 16 + tig[L] * 4 + i] = bytes_s8(a[3])[L, i]
            B[tig[L] * 4 + i, g[L]] = bytes_s8(b[0])[L, i]
            B[16 + tig[L] * 4 + i, g[L]] = bytes_s8(b[1])[L, i]
    D = A @ B
    return np.stack([D[g, 2 * tig], D[g, 2 * tig + 1], D[g + 8, 2 * tig], D[g + 8, 2 * tig + 1]])


def mma_k16(a0, a1, b0):
    g, tig = lanes()
    A = np.zeros((16, 16), np.int64)
    B = np.zeros((16, 8), np.int64)
    for L in range(32):
        for i in range(4):
            A[g[L], tig[L] * 4 + i] = bytes_s8(a0)[L, i]
            A[g[L] + 8, tig[L] * 4 + i] = bytes_s8(a1)[L, i]
            B[tig[L] * 4 + i, g[L]] = bytes_s8(b0)[L, i]
    D = A @ B
    return np.stack([D[g, 2 * tig], D[g, 2 * tig + 1], D[g + 8, 2 * tig], D[g + 8, 2 * tig + 1]])


def u32s(blob, off):
    """(32,) words at byte offsets off (array)."""
    off = np.asarray(off)
    return (blob[off].astype(np.uint32) | (blob[off + 1].astype(np.uint32) << 8)
            | (blob[off + 2].astype(np.uint32) << 16) | (blob[off + 3].astype(np.uint32) << 24))


def h2f(h):
    return np.asarray(h, np.uint16).view(np.float16).astype(f32)


def fma(a, b, c):
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(f32)


class Act:
    def __init__(self, q, d, n_pad, c0, t):
        self.q, self.d, self.n_pad, self.c0, self.t = q, d, n_pad, c0, t

    def b(self, nt, u, j):
        g, tig = lanes()
        col = np.minimum(self.c0 + nt * 8 + g, self.t - 1)
        base = u * 256 + tig * 64 + j * 8
        w0 = np.array([int.from_bytes(self.q[c, o : o + 4].tobytes(), "little") for c, o in zip(col, base)], np.uint32)
        w1 = np.array([int.from_bytes(self.q[c, o + 4 : o + 8].tobytes(), "little") for c, o in zip(col, base)], np.uint32)
        return w0, w1

    def dd(self, nt, which, u, j):
        g, tig = lanes()
        col = np.minimum(self.c0 + nt * 8 + 2 * tig + which, self.t - 1)
        return self.d[col, u * 8 + j]


def unit_q4_k(s, x, u, NT, acc):
    g, tig = lanes()
    lane = np.arange(32)
    dm = [u32s(s, 4 * g), u32s(s, 4 * (g + 8))]

    def scales(off):
        s0, s1, s2 = u32s(s, off), u32s(s, off + 4), u32s(s, off + 8)
        sc0 = s0 & 0x3F3F3F3F
        mn0 = s1 & 0x3F3F3F3F
        sc1 = (s2 & 0x0F0F0F0F) | (((s0 >> 6) & 0x03030303) << 4)
        mn1 = ((s2 >> 4) & 0x0F0F0F0F) | (((s1 >> 6) & 0x03030303) << 4)
        return (sc0, sc1), (mn0, mn1)

    sr = [scales(64 + 12 * g), scales(64 + 12 * (g + 8))]
    s1 = np.zeros((NT, 4, 32), np.int64)
    cm = np.zeros((NT, 4, 32), np.int64)
    for j in range(8):
        base = 256 + (j >> 1) * 512 + lane * 16
        w = [u32s(s, base + 4 * i) for i in range(4)]
        sh = 4 * (j & 1)
        a = [(wi >> sh) & 0x0F0F0F0F for wi in w]
        sg = (sr[0][0][j >> 2] >> (8 * (j & 3))) & 0xFF
        sg8 = (sr[1][0][j >> 2] >> (8 * (j & 3))) & 0xFF
        mg = ((sr[0][1][j >> 2] >> (8 * (j & 3))) & 0xFF) * 0x01010101
        mg8 = ((sr[1][1][j >> 2] >> (8 * (j & 3))) & 0xFF) * 0x01010101
        for nt in range(NT):
            b = x.b(nt, u, j)
            c = mma_k32(a, b)
            s1[nt, 0] += sg * c[0]
            s1[nt, 1] += sg * c[1]
            s1[nt, 2] += sg8 * c[2]
            s1[nt, 3] += sg8 * c[3]
            cm[nt] += mma_k32([mg, mg8, mg, mg8], b)
    d = [h2f(dm[0] & 0xFFFF), h2f(dm[1] & 0xFFFF)]
    dmin = [h2f(dm[0] >> 16), h2f(dm[1] >> 16)]
    for nt in range(NT):
        dx = [x.dd(nt, 0, u, 0), x.dd(nt, 1, u, 0)]
        for e in range(4):
            r = e >> 1
            v = fma(dx[e & 1] * d[r], s1[nt, e].astype(f32), -((dx[e & 1] * dmin[r]) * cm[nt, e].astype(f32)))
            acc[nt, e] = (acc[nt, e] + v).astype(f32)


def unit_q6_k(s, x, u, NT, acc):
    g, tig = lanes()
    lane = np.arange(32)
    sc = [s[32 + 16 * g[:, None] + np.arange(16)].view(np.int8).astype(np.int64),
          s[32 + 16 * (g[:, None] + 8) + np.arange(16)].view(np.int8).astype(np.int64)]
    si = np.zeros((NT, 4, 32), np.int64)
    for jb in range(8):
        bs = [x.b(nt, u, jb) for nt in range(NT)]
        for half in range(2):
            j16 = 2 * jb + half
            n2, qq, hh = j16 >> 3, (j16 & 7) >> 1, j16 & 1
            q1, nib = qq & 1, qq >> 1
            a = []
            for rs in range(2):
                iw = ((n2 * 2 + q1) * 2 + hh) * 2 + rs
                ih = (n2 * 2 + hh) * 2 + rs
                lw = u32s(s, 288 + lane * 64 + 4 * iw)
                hw = u32s(s, 2336 + lane * 32 + 4 * ih)
                v = ((lw >> (4 * nib)) & 0x0F0F0F0F) | (((hw >> (2 * qq)) & 0x03030303) << 4)
                vb = bytes_s8(v) - 32  # __vsub4
                a.append((vb.astype(np.uint8).astype(np.uint32) * (1 << (8 * np.arange(4)))).sum(1).astype(np.uint32))
            k = 8 * n2 + hh + 2 * qq
            s0, s8 = sc[0][:, k], sc[1][:, k]
            for nt in range(NT):
                c = mma_k16(a[0], a[1], bs[nt][1] if half else bs[nt][0])
                si[nt, 0] += s0 * c[0]
                si[nt, 1] += s0 * c[1]
                si[nt, 2] += s8 * c[2]
                si[nt, 3] += s8 * c[3]
    d = [h2f(s[2 * g].astype(np.uint16) | (s[2 * g + 1].astype(np.uint16) << 8)),
         h2f(s[2 * (g + 8)].astype(np.uint16) | (s[2 * (g + 8) + 1].astype(np.uint16) << 8))]
    for nt in range(NT):
        dx = [x.dd(nt, 0, u, 0), x.dd(nt, 1, u, 0)]
        for e in range(4):
            v = (dx[e & 1] * d[e >> 1]) * si[nt, e].astype(f32)
            acc[nt, e] = (acc[nt, e] + v).astype(f32)


def unit_q8_0(s, x, u, NT, acc):
    g, tig = lanes()
    lane = np.arange(32)
    for j in range(8):
        base = 256 + j * 512 + lane * 16
        w = [u32s(s, base + 4 * i) for i in range(4)]
        dw = [h2f(s[16 * g + 2 * j].astype(np.uint16) | (s[16 * g + 2 * j + 1].astype(np.uint16) << 8)),
              h2f(s[16 * (g + 8) + 2 * j].astype(np.uint16) | (s[16 * (g + 8) + 2 * j + 1].astype(np.uint16) << 8))]
        for nt in range(NT):
            c = mma_k32(w, x.b(nt, u, j))
            dx = [x.dd(nt, 0, u, j), x.dd(nt, 1, u, j)]
            for e in range(4):
                acc[nt, e] = fma(dx[e & 1] * dw[e >> 1], c[e].astype(f32), acc[nt, e])


UNITS = {T.Q4_K: unit_q4_k, T.Q6_K: unit_q6_k, T.Q8_0: unit_q8_0}


def mmq(ty, tiled, m, U, qa, ad, n_pad, t, NT):
    out = np.full((t, m), np.nan, f32)
    ct = (t + NT * 8 - 1) // (NT * 8)
    g, tig = lanes()
    for tile_i in range(tiled.shape[0]):
        for c in range(ct):
            c0 = c * NT * 8
            x = Act(qa, ad, n_pad, c0, t)
            parts = []
            for warp in range(4):
                acc = np.zeros((NT, 4, 32), f32)
                for u in range(U * warp // 4, U * (warp + 1) // 4):
                    UNITS[ty](tiled[tile_i, u], x, u, NT, acc)
                part = np.zeros((NT * 8, 16), f32)
                for nt in range(NT):
                    for e in range(4):
                        part[nt * 8 + 2 * tig + (e & 1), g + 8 * (e >> 1)] = acc[nt, e]
                parts.append(part)
            s = ((parts[0] + parts[1]) + parts[2]) + parts[3]
            for col in range(NT * 8):
                for row in range(16):
                    o, r = tile_i * 16 + row, c0 + col
                    if o < m and r < t:
                        out[r, o] = s[col, row]
    return out


def check(ty, m, n, t, NT):
    raw = rand_weights(ty, m, n)
    w = gguf.quants.dequantize(raw, ty).reshape(m, n).astype(np.float64)
    n_pad = (n + 255) // 256 * 256
    U = n_pad // 256
    x = rng.standard_normal((t, n)).astype(f32)
    qa = np.zeros((t, n_pad), np.int8)
    ad = np.zeros((t, n_pad // 32), f32)
    xv = np.zeros((t, n_pad))
    for r in range(t):
        q0, d0, qk, dk = act_q8(x[r], n_pad)
        q, d = (q0, d0) if ty == T.Q8_0 else (qk, dk)
        qa[r], ad[r] = q, d
        xv[r] = unpos(q, n_pad) * np.repeat(d, 32)
    tiled = tile(ty, raw, m, n)
    got = mmq(ty, tiled, m, U, qa, ad, n_pad, t, NT)
    want = xv[:, :n] @ w.T
    mag = np.abs(xv[:, :n]) @ np.abs(w.T)
    err = np.abs(got - want) / (mag + 1e-12)
    print(f"{ty.name} m={m} n={n} t={t} NT={NT}: max error {np.nanmax(err):.2e} of Σ|w·x|, unwritten {np.isnan(got).sum()}")
    assert not np.isnan(got).any() and np.nanmax(err) < 1e-5, "mismatch"
    return got


def u32at(b, p):
    return int(b[p]) | (int(b[p + 1]) << 8) | (int(b[p + 2]) << 16) | (int(b[p + 3]) << 24)


def h16(b, p):
    return float(np.frombuffer(bytes(b[p : p + 2]), np.float16)[0])


def scale_min_k4(j, q):
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def deq8_tiled(ty, b, r, kk):
    """decode_tiled_t's values kk .. kk + 7 of row r of a blob (the same expressions)."""
    if ty == T.Q4_K:
        sb, l = kk >> 5, kk & 31
        wd = l >> 2
        sc, mn = scale_min_k4(sb, [int(v) for v in b[64 + 12 * r : 76 + 12 * r]])
        d, m = h16(b, 4 * r) * sc, h16(b, 4 * r + 2) * mn
        lane, slot = 4 * (r & 7) + (wd & 3), (wd >> 2) * 2 + (r >> 3)
        p = 256 + (sb >> 1) * 512 + lane * 16 + slot * 4
        q = [u32at(b, p), u32at(b, p + 16)]
        sh = 4 * (sb & 1)
        return [d * ((q[i >> 2] >> (8 * (i & 3) + sh)) & 0xF) - m for i in range(8)]
    if ty == T.Q6_K:
        n2, rr = kk >> 7, kk & 127
        qt, l = rr >> 5, rr & 31
        hh, t0 = l >> 4, (l & 15) >> 2
        rs, lane = r >> 3, 4 * (r & 7) + t0
        iw, ih = ((n2 * 2 + (qt & 1)) * 2 + hh) * 2 + rs, (n2 * 2 + hh) * 2 + rs
        pl, ph = 288 + lane * 64 + 4 * iw, 2336 + lane * 32 + 4 * ih
        ql, qh = [u32at(b, pl), u32at(b, pl + 64)], [u32at(b, ph), u32at(b, ph + 32)]
        d = h16(b, 2 * r) * float(b[32 + 16 * r + 8 * n2 + hh + 2 * qt:][:1].view(np.int8)[0])
        s_, hs = (qt >> 1) * 4, 2 * qt
        return [d * ((((ql[i >> 2] >> (8 * (i & 3) + s_)) & 0xF) | (((qh[i >> 2] >> (8 * (i & 3) + hs)) & 3) << 4)) - 32) for i in range(8)]
    j, wd = kk >> 5, (kk & 31) >> 2
    lane, slot = 4 * (r & 7) + (wd & 3), (wd >> 2) * 2 + (r >> 3)
    p = 256 + j * 512 + lane * 16 + slot * 4
    q = [u32at(b, p), u32at(b, p + 16)]
    d = h16(b, 16 * r + 2 * j)
    return [float(np.uint8((q[i >> 2] >> (8 * (i & 3))) & 0xFF).view(np.int8)) * d for i in range(8)]


def check_decode(ty, m, n):
    raw = rand_weights(ty, m, n)
    w = gguf.quants.dequantize(raw, ty).reshape(m, n)
    t = tile(ty, raw, m, n)
    U = t.shape[1]
    got = np.array([[v for j in range(0, n, 8) for v in deq8_tiled(ty, t[o // 16, j >> 8], o & 15, j & 255)] for o in range(m)])
    err = np.abs(got - w).max()
    print(f"decode_tiled {ty.name} m={m} n={n}: max |error| {err:.2e}")
    assert err < 1e-6 * max(1.0, np.abs(w).max())


if __name__ == "__main__":
    for ty, m, n in [(T.Q4_K, 20, 512), (T.Q6_K, 18, 512), (T.Q8_0, 17, 576)]:
        check_decode(ty, m, n)
    check(T.Q8_0, 24, 576, 3, 1)
    check(T.Q4_K, 20, 512, 5, 1)
    check(T.Q6_K, 17, 512, 9, 2)
    check(T.Q8_0, 16, 256, 10, 2)
    check(T.Q4_K, 16, 1024, 2, 1)
    # The same rows give the same outputs alone and among others, bit for bit.
    raw_seed = rng.bit_generator.state
    print("ok")
