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

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

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

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

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
        let body = |(t, o): (usize, &mut [f32])| {
            for (ch, o) in o.iter_mut().enumerate() {
                let mut sum = 0f32;
                for j in 0..kk {
                    sum += ext(t + j)[ch] * wv[ch * kk + j];
                }
                *o = silu(sum);
            }
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
    let e = h.g[t].exp();
    for x in m.iter_mut() {
        *x *= e;
    }
    for (j, row) in m.chunks_mut(hk).enumerate() {
        let d = (v[j] - dot(row, k)) * h.beta[t];
        for (x, &kv) in row.iter_mut().zip(k) {
            *x += d * kv;
        }
        out[j] = dot(row, q);
    }
}

/// Tokens `t0 .. t0 + n` as one chunk (torch_chunk_gated_delta_rule on one chunk): the UT
/// transform of the chunk's updates, the read of the state before it plus the chunk's own
/// attention, then the state after it. `out` takes `head_v` values per token.
fn chunk(m: &mut [f32], hk: usize, hv: usize, h: &HeadIn<'_>, t0: usize, n: usize, out: &mut [f32]) {
    let q = |i: usize| &h.q[(t0 + i) * hk..(t0 + i + 1) * hk];
    let k = |i: usize| &h.k[(t0 + i) * hk..(t0 + i + 1) * hk];
    let v = |i: usize| &h.v[(t0 + i) * h.v_stride..(t0 + i) * h.v_stride + hv];
    let beta = &h.beta[t0..t0 + n];
    // Cumulative log decay within the chunk.
    let mut cum = vec![0f32; n];
    let mut acc = 0f32;
    for (i, c) in cum.iter_mut().enumerate() {
        acc += h.g[t0 + i];
        *c = acc;
    }
    // a[i][j] (j < i) = β_i (k_i · k_j) exp(c_i - c_j); u = (I + a)⁻¹ β v, w = (I + a)⁻¹ β exp(c) k.
    let mut a = vec![0f32; n * n];
    for i in 0..n {
        for j in 0..i {
            a[i * n + j] = beta[i] * dot(k(i), k(j)) * (cum[i] - cum[j]).exp();
        }
    }
    let mut u = vec![0f32; n * hv];
    let mut w = vec![0f32; n * hk];
    for i in 0..n {
        let (done, rest) = u.split_at_mut(i * hv);
        let ui = &mut rest[..hv];
        for (x, &vv) in ui.iter_mut().zip(v(i)) {
            *x = beta[i] * vv;
        }
        let (wdone, wrest) = w.split_at_mut(i * hk);
        let wi = &mut wrest[..hk];
        let s = beta[i] * cum[i].exp();
        for (x, &kv) in wi.iter_mut().zip(k(i)) {
            *x = s * kv;
        }
        for j in 0..i {
            let aij = a[i * n + j];
            for (x, &y) in ui.iter_mut().zip(&done[j * hv..(j + 1) * hv]) {
                *x -= aij * y;
            }
            for (x, &y) in wi.iter_mut().zip(&wdone[j * hk..(j + 1) * hk]) {
                *x -= aij * y;
            }
        }
    }
    // v_new = u - w·S (S read through its rows: column jv of S is row jv of m).
    let mut vnew = u;
    for i in 0..n {
        let wi = &w[i * hk..(i + 1) * hk];
        for (jv, row) in m.chunks(hk).enumerate() {
            vnew[i * hv + jv] -= dot(wi, row);
        }
    }
    // out_i = exp(c_i) q_i·S + Σ_{j ≤ i} (q_i · k_j) exp(c_i - c_j) v_new_j
    for i in 0..n {
        let o = &mut out[i * hv..(i + 1) * hv];
        let ec = cum[i].exp();
        for (jv, row) in m.chunks(hk).enumerate() {
            o[jv] = ec * dot(q(i), row);
        }
        for j in 0..=i {
            let s = dot(q(i), k(j)) * (cum[i] - cum[j]).exp();
            for (x, &y) in o.iter_mut().zip(&vnew[j * hv..(j + 1) * hv]) {
                *x += s * y;
            }
        }
    }
    // S' = exp(c_last) S + Σ_j exp(c_last - c_j) k_j ⊗ v_new_j
    let last = cum[n - 1];
    let el = last.exp();
    let decay: Vec<f32> = cum.iter().map(|&c| (last - c).exp()).collect();
    for (jv, row) in m.chunks_mut(hk).enumerate() {
        for x in row.iter_mut() {
            *x *= el;
        }
        for j in 0..n {
            let s = decay[j] * vnew[j * hv + jv];
            for (x, &kv) in row.iter_mut().zip(k(j)) {
                *x += s * kv;
            }
        }
    }
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
        let norm = |x: &[f32], f: f32| -> Vec<f32> {
            let sum: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
            let inv = 1.0 / (sum as f32 + l.eps).sqrt();
            x.iter().map(|&v| v * inv * f).collect()
        };
        let per_head = |base: usize, f: f32| -> Vec<Vec<f32>> {
            (0..nk)
                .map(|kh| {
                    (0..n)
                        .flat_map(|t| norm(&qkv.row(row0 + t)[base + kh * hk..base + (kh + 1) * hk], f))
                        .collect()
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
