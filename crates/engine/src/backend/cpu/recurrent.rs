//! The CPU's ops of hybrid models' linear-attention (Gated DeltaNet) layers: the causal
//! convolution over a sequence's rows with its state (llama.cpp `ggml-cpu/ops.cpp`
//! ssm_conv; transformers `causal_conv1d_update`), and the gated delta rule (transformers
//! `modeling_qwen3_5.py` torch_recurrent_gated_delta_rule and torch_chunk_gated_delta_rule;
//! llama.cpp `models/delta-net-base.cpp`).
//!
//! The delta rule runs token by token for single rows (decode) and in chunks for longer runs. Chunks
//! end at multiples of [`CHUNK`] positions (absolute, not relative to the step) and at the positions
//! where a state copy is kept, so a sequence is cut the same way whether its prompt was computed
//! whole or resumed from a cached prefix. State layout per value head: `head_v` rows of `head_k`
//! values, row j being column j of the key × value state (llama.cpp's transposed layout), so every
//! product with a key or query vector is a contiguous dot product.

use super::{CpuBuf, CpuKv, CpuStep, CpuWeight};
use crate::backend::DeltaNetLayer;
use rayon::prelude::*;

/// Positions per chunk of the chunked delta rule (transformers' and llama.cpp's 64).
pub(crate) const CHUNK: usize = 64;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

// ggml_softplus / torch.nn.functional.softplus (threshold 20: linear above it)
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

use super::simd::{axpy, dot, gemm, scale, silu, FlushSubnormals, GEMM_ROWS};

/// `out = silu(conv(x))` per sequence, continuing from and updating each sequence's conv state.
pub(super) fn ssm_conv(
    x: &CpuBuf,
    w: &CpuWeight,
    step: &CpuStep,
    kvs: &mut [&mut CpuKv],
    l: &DeltaNetLayer,
    out: &mut CpuBuf,
) {
    let (c, kk) = (l.conv_dim(), l.kernel);
    let kr = kk - 1;
    assert_eq!(x.cols, c, "ssm_conv: rows of {} values for {c} channels", x.cols);
    assert_eq!(
        (w.row_len(), w.n_rows()),
        (kk, c),
        "ssm_conv: weight of shape {:?} for {c} channels of width {kk}",
        w.shape
    );
    let wv = quant::dequantize(w.ty, w.bytes(), kk * c).expect("a conv weight of a decodable type");
    // Tap-major: tap j's weights of every channel together.
    let mut wt = vec![0f32; kk * c];
    for (ch, taps) in wv.chunks_exact(kk).enumerate() {
        for (j, &w) in taps.iter().enumerate() {
            wt[j * c + ch] = w;
        }
    }
    out.shape_from(x.rows, &x.runs, c);
    for (kv, s) in kvs.iter_mut().zip(&step.plan.seqs) {
        if s.rows == 0 {
            continue;
        }
        let r = kv.rec.as_mut().expect("ssm_conv on a cache without recurrent layers");
        let slot = r.layout.slot(l.layer);
        assert_eq!(
            (slot.shape.conv_rows, slot.shape.conv_dim),
            (kr, c),
            "ssm_conv: the cache's conv state of layer {} does not fit",
            l.layer
        );
        // The step's state update has begun: until the last recurrent layer ends it, the state
        // holds no whole position (a failed step leaves it unusable, not wrong).
        if r.layout.slots.iter().position(|s| s.is_some()) == Some(l.layer) {
            r.seq.pos = usize::MAX;
        }
        let wanted = r.seq.wanted_in(s.pos0, s.rows);
        let state = &r.data[slot.conv..slot.conv + kr * c];
        // Row i of the state followed by the step's rows.
        let ext = |i: usize| -> &[f32] {
            if i < kr {
                &state[i * c..(i + 1) * c]
            } else {
                x.row(s.row0 + i - kr)
            }
        };
        // Per row: the taps summed in order over whole rows (each channel's sum as before: a product
        // then an add per tap), then the SiLU as a vector.
        let body = |(t, o): (usize, &mut [f32])| {
            o.fill(0.0);
            for j in 0..kk {
                for ((s, &x), &w) in o.iter_mut().zip(ext(t + j)).zip(&wt[j * c..(j + 1) * c]) {
                    *s += x * w;
                }
            }
            silu(o);
        };
        let rows = &mut out.data[s.row0 * c..(s.row0 + s.rows) * c];
        if s.rows > 1 {
            rows.par_chunks_mut(c).enumerate().for_each(body);
        } else {
            rows.chunks_mut(c).enumerate().for_each(body);
        }
        let window = |end: usize| -> Vec<f32> { (end..end + kr).flat_map(|i| ext(i).iter().copied()).collect() };
        let copies: Vec<(usize, Vec<f32>)> = wanted.iter().map(|&p| (p, window(p - s.pos0))).collect();
        let fresh = window(s.rows);
        let r = kv.rec.as_mut().expect("checked");
        r.data[slot.conv..slot.conv + kr * c].copy_from_slice(&fresh);
        for (p, vals) in copies {
            kv.put_copy(p, slot.conv, &vals, false);
        }
    }
}

/// One sequence's per-token inputs of one value head.
struct HeadIn<'a> {
    /// Normalised, scaled queries and normalised keys, `head_k` per token.
    q: &'a [f32],
    k: &'a [f32],
    /// Values, `head_v` per token (a strided view: token t at `v[t * v_stride ..]`).
    v: &'a [f32],
    v_stride: usize,
    /// Log decay and learning rate per token.
    g: Vec<f32>,
    beta: Vec<f32>,
}

/// Token `t`: decay, delta-rule update, read (torch_recurrent_gated_delta_rule).
fn recurrent_token(m: &mut [f32], hk: usize, hv: usize, h: &HeadIn<'_>, t: usize, out: &mut [f32]) {
    let (q, k) = (&h.q[t * hk..(t + 1) * hk], &h.k[t * hk..(t + 1) * hk]);
    let v = &h.v[t * h.v_stride..t * h.v_stride + hv];
    let decay = h.g[t].exp();
    // Row by row (the decay applied to a row just before its update, the same products as a
    // whole-state pass first, one pass over the state instead of two).
    for (j, row) in m.chunks_mut(hk).enumerate() {
        scale(row, decay);
        let d = (v[j] - dot(row, k)) * h.beta[t];
        axpy(row, k, d);
        out[j] = dot(row, q);
    }
}

/// Tokens `t0 .. t0 + n` as one chunk (torch_chunk_gated_delta_rule on one chunk), in matrix
/// products (`simd::gemm`; the chunk's rows padded with zeros to its row blocks): the UT transform
/// T = (I + A)⁻¹ of the chunk's updates by forward substitution, U = T·βV and W = T·βe^c·K, the
/// new values U - W·S, the read of the state before the chunk plus the chunk's own attention,
/// then the state after it. `out` takes `head_v` values per token.
fn chunk(m: &mut [f32], hk: usize, hv: usize, h: &HeadIn<'_>, t0: usize, n: usize, out: &mut [f32]) {
    let np = n.next_multiple_of(GEMM_ROWS);
    let beta = &h.beta[t0..t0 + n];
    // Cumulative log decay within the chunk.
    let mut cum = vec![0f32; n];
    let mut acc = 0f32;
    for (i, c) in cum.iter_mut().enumerate() {
        acc += h.g[t0 + i];
        *c = acc;
    }
    // The chunk's keys and queries (np × hk), keys transposed (hk × np), values times β (np × hv).
    let rows = |x: &[f32]| -> Vec<f32> {
        let mut r = vec![0f32; np * hk];
        r[..n * hk].copy_from_slice(&x[t0 * hk..(t0 + n) * hk]);
        r
    };
    let (km, qm) = (rows(h.k), rows(h.q));
    let kt = transpose(&km, np, hk);
    let mut bv = vec![0f32; np * hv];
    let mut bk = vec![0f32; np * hk];
    for i in 0..n {
        let v = &h.v[(t0 + i) * h.v_stride..(t0 + i) * h.v_stride + hv];
        for (x, &y) in bv[i * hv..(i + 1) * hv].iter_mut().zip(v) {
            *x = beta[i] * y;
        }
        let s = beta[i] * cum[i].exp();
        for (x, &y) in bk[i * hk..(i + 1) * hk].iter_mut().zip(&km[i * hk..(i + 1) * hk]) {
            *x = s * y;
        }
    }
    let mut kk = vec![0f32; np * np];
    gemm(&mut kk, &km, &kt, np, hk, np);
    // T = (I + A)⁻¹, A[i][j] = β_i (k_i · k_j) exp(c_i - c_j) for j < i: row i of T is
    // e_i - Σ_{l < i} A[i][l] · row l (rows l < i have nothing past column l).
    let mut t = vec![0f32; np * np];
    for i in 0..n {
        let (done, rest) = t.split_at_mut(i * np);
        let ti = &mut rest[..np];
        ti[i] = 1.0;
        for l in 0..i {
            let a = beta[i] * kk[i * np + l] * (cum[i] - cum[l]).exp();
            axpy(&mut ti[..=l], &done[l * np..l * np + l + 1], -a);
        }
    }
    // vnew = T·βV - (T·βe^c·K)·S, S (hk × hv) the state as a matrix (m holds it transposed).
    let mut vnew = vec![0f32; np * hv];
    gemm(&mut vnew, &t, &bv, np, np, hv);
    let mut w = vec![0f32; np * hk];
    gemm(&mut w, &t, &bk, np, np, hk);
    for x in &mut w {
        *x = -*x;
    }
    let s = transpose(m, hv, hk);
    gemm(&mut vnew, &w, &s, np, hk, hv);
    // out_i = exp(c_i) q_i·S + Σ_{j ≤ i} (q_i · k_j) exp(c_i - c_j) vnew_j
    let mut o = vec![0f32; np * hv];
    gemm(&mut o, &qm, &s, np, hk, hv);
    for i in 0..n {
        scale(&mut o[i * hv..(i + 1) * hv], cum[i].exp());
    }
    let mut p = vec![0f32; np * np];
    gemm(&mut p, &qm, &kt, np, hk, np);
    for i in 0..n {
        for j in 0..np {
            p[i * np + j] = if j <= i {
                p[i * np + j] * (cum[i] - cum[j]).exp()
            } else {
                0.0
            };
        }
    }
    gemm(&mut o, &p, &vnew, np, np, hv);
    out[..n * hv].copy_from_slice(&o[..n * hv]);
    // S' = exp(c_last) S + Σ_j exp(c_last - c_j) k_j ⊗ vnew_j; in m's layout (row jv: column jv of
    // S) that is exp(c_last) m + Dᵀ·K with D_j = exp(c_last - c_j) vnew_j (rows padded to blocks).
    let last = cum[n - 1];
    let hvp = hv.next_multiple_of(GEMM_ROWS);
    let mut dt = vec![0f32; hvp * np];
    for j in 0..n {
        let d = (last - cum[j]).exp();
        for jv in 0..hv {
            dt[jv * np + j] = d * vnew[j * hv + jv];
        }
    }
    let mut upd = vec![0f32; hvp * hk];
    gemm(&mut upd, &dt, &km, hvp, np, hk);
    scale(m, last.exp());
    for (x, &y) in m.iter_mut().zip(&upd) {
        *x += y;
    }
}

/// `x` (rows × cols, row-major) transposed.
fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

/// Where a sequence's rows are cut: at multiples of [`CHUNK`] positions and at kept copies.
fn segments(pos0: usize, rows: usize, wanted: &[usize]) -> Vec<(usize, usize)> {
    let mut cuts: Vec<usize> = (pos0 + 1..pos0 + rows)
        .filter(|p| p.is_multiple_of(CHUNK) || wanted.contains(p))
        .map(|p| p - pos0)
        .collect();
    cuts.push(rows);
    let mut at = 0;
    cuts.into_iter()
        .map(|end| {
            let s = (at, end - at);
            at = end;
            s
        })
        .collect()
}

/// The gated delta rule for every sequence of the step (see `Backend::gated_delta_net`).
#[allow(clippy::too_many_arguments)]
pub(super) fn gated_delta_net(
    qkv: &CpuBuf,
    alpha: &CpuBuf,
    beta: &CpuBuf,
    dt_bias: &CpuWeight,
    a: &CpuWeight,
    step: &CpuStep,
    kvs: &mut [&mut CpuKv],
    l: &DeltaNetLayer,
    out: &mut CpuBuf,
) {
    let (nk, nv, hk, hv) = (l.n_k_heads, l.n_v_heads, l.head_k, l.head_v);
    let c = l.conv_dim();
    assert_eq!(
        qkv.cols, c,
        "gated_delta_net: rows of {} values, expected {c}",
        qkv.cols
    );
    assert!(
        alpha.cols == nv && beta.cols == nv && nk > 0 && nv.is_multiple_of(nk),
        "gated_delta_net: {} / {} gate columns for {nv} value heads over {nk} key heads",
        alpha.cols,
        beta.cols
    );
    let (dt, av) = (dt_bias.vector(), a.vector());
    let width = nv * hv;
    out.shape_from(qkv.rows, &qkv.runs, width);
    let scale = 1.0 / (hk as f32).sqrt();
    for (kv, s) in kvs.iter_mut().zip(&step.plan.seqs) {
        if s.rows == 0 {
            continue;
        }
        let (n, row0) = (s.rows, s.row0);
        // Normalised queries and keys per key head: [head][token][hk].
        let per_head = |base: usize, f: f32| -> Vec<Vec<f32>> {
            (0..nk)
                .map(|kh| {
                    let mut h = vec![0f32; n * hk];
                    for (t, o) in h.chunks_exact_mut(hk).enumerate() {
                        let x = &qkv.row(row0 + t)[base + kh * hk..base + (kh + 1) * hk];
                        let sum: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
                        let inv = 1.0 / (sum as f32 + l.eps).sqrt();
                        for (o, &v) in o.iter_mut().zip(x) {
                            *o = v * inv * f;
                        }
                    }
                    h
                })
                .collect()
        };
        let (qs, ks) = (per_head(0, scale), per_head(nk * hk, 1.0));
        let r = kv
            .rec
            .as_mut()
            .expect("gated_delta_net on a cache without recurrent layers");
        let slot = r.layout.slot(l.layer);
        assert_eq!(
            (slot.shape.heads, slot.shape.head_k, slot.shape.head_v),
            (nv, hk, hv),
            "gated_delta_net: the cache's delta state of layer {} does not fit",
            l.layer
        );
        let wanted = r.seq.wanted_in(s.pos0, n);
        let segs = segments(s.pos0, n, &wanted);
        let state = &mut r.data[slot.ssm..slot.ssm + nv * hv * hk];
        // Per value head: its outputs (n × hv) and its state at each kept position.
        let results: Vec<(Vec<f32>, Vec<Vec<f32>>)> = state
            .par_chunks_mut(hv * hk)
            .enumerate()
            .map(|(h, m)| {
                // (Decays drive products below 1.2e-38; see FlushSubnormals.)
                let _flush = FlushSubnormals::new();
                let head = HeadIn {
                    q: &qs[h % nk],
                    k: &ks[h % nk],
                    v: &qkv.data[row0 * c + 2 * nk * hk + h * hv..],
                    v_stride: c,
                    g: (0..n)
                        .map(|t| av[h] * softplus(alpha.row(row0 + t)[h] + dt[h]))
                        .collect(),
                    beta: (0..n).map(|t| sigmoid(beta.row(row0 + t)[h])).collect(),
                };
                let mut o = vec![0f32; n * hv];
                let mut kept = Vec::new();
                for &(t0, len) in &segs {
                    if len == 1 {
                        recurrent_token(m, hk, hv, &head, t0, &mut o[t0 * hv..(t0 + 1) * hv]);
                    } else {
                        chunk(m, hk, hv, &head, t0, len, &mut o[t0 * hv..(t0 + len) * hv]);
                    }
                    if wanted.contains(&(s.pos0 + t0 + len)) {
                        kept.push(m.to_vec());
                    }
                }
                (o, kept)
            })
            .collect();
        for (h, (o, _)) in results.iter().enumerate() {
            for t in 0..n {
                out.data[(row0 + t) * width + h * hv..(row0 + t) * width + (h + 1) * hv]
                    .copy_from_slice(&o[t * hv..(t + 1) * hv]);
            }
        }
        let last = r.layout.is_last(l.layer);
        for (i, &p) in wanted.iter().enumerate() {
            let vals: Vec<f32> = results.iter().flat_map(|(_, kept)| kept[i].iter().copied()).collect();
            kv.put_copy(p, slot.ssm, &vals, true);
        }
        if last {
            let r = kv.rec.as_mut().expect("checked");
            r.seq.advance(s.pos0 + n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_cut_at_absolute_chunk_ends_and_kept_positions() {
        assert_eq!(segments(0, 100, &[]), vec![(0, 64), (64, 36)]);
        assert_eq!(segments(60, 10, &[]), vec![(0, 4), (4, 6)]);
        assert_eq!(segments(60, 10, &[62, 70]), vec![(0, 2), (2, 2), (4, 6)]);
        assert_eq!(segments(5, 1, &[6]), vec![(0, 1)]);
    }

    /// One chunk equals the same tokens one by one (the two forms of the delta rule).
    #[test]
    fn chunked_equals_recurrent() {
        let (hk, hv, n) = (8, 6, 11);
        let vals = crate::backend::tests::values(n * (2 * hk + hv + 2) + hk * hv, 5);
        let mut it = vals.into_iter();
        let mut take = |k: usize| -> Vec<f32> { (0..k).map(|_| it.next().unwrap()).collect() };
        let unit = |v: Vec<f32>| -> Vec<f32> {
            v.chunks(hk)
                .flat_map(|c| {
                    let s = dot(c, c).sqrt();
                    c.iter().map(move |x| x / s).collect::<Vec<_>>()
                })
                .collect()
        };
        let (q, k, v) = (unit(take(n * hk)), unit(take(n * hk)), take(n * hv));
        let g: Vec<f32> = take(n).iter().map(|x| -0.5 * x.abs()).collect();
        let beta: Vec<f32> = take(n).iter().map(|x| sigmoid(*x)).collect();
        let m0 = take(hk * hv);
        let head = HeadIn {
            q: &q,
            k: &k,
            v: &v,
            v_stride: hv,
            g,
            beta,
        };
        let (mut ma, mut mb) = (m0.clone(), m0);
        let (mut oa, mut ob) = (vec![0f32; n * hv], vec![0f32; n * hv]);
        chunk(&mut ma, hk, hv, &head, 0, n, &mut oa);
        for t in 0..n {
            recurrent_token(&mut mb, hk, hv, &head, t, &mut ob[t * hv..(t + 1) * hv]);
        }
        for (x, y) in oa.iter().zip(&ob).chain(ma.iter().zip(&mb)) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
    }
}
