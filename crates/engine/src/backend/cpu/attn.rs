//! Softmax attention over the KV cache, following ggml's CPU flash attention
//! (`ggml-cpu/ops.cpp`, ggml_compute_forward_flash_attn_ext_f16): an online softmax per query row
//! and head. For fewer than 64 query rows ggml takes its `one_chunk` path, which rounds Q to f16
//! and accumulates V·softmax in an f16 vector; longer batches use its tiled f32 path. Both are
//! reproduced so that hf2q's numbers follow llama.cpp's.

use super::{simd, Cpu, CpuBuf, CpuKv, SyncPtr};
use crate::backend::{AttnArgs, KvType};
use gguf::GgmlType;
use quant::dot;
use quant::fp::f16_to_f32;
use rayon::prelude::*;

/// ggml's `GGML_FA_TILE_Q`: batches of at least this many query rows take the f32 path.
const TILE_Q: usize = 64;

pub(super) fn attention(cpu: &Cpu, q: &CpuBuf, kv: &CpuKv, a: &AttnArgs, out: &mut CpuBuf) {
    out.set_shape(q.rows, a.n_head * a.head_dim);
    if a.rows >= TILE_Q && kv.ty == KvType::F16 {
        batched_f32(q, kv, a, out)
    } else {
        per_row(cpu, q, kv, a, out)
    }
}

/// The visible key range of query row `i`.
fn key_range(a: &AttnArgs, i: usize) -> std::ops::Range<usize> {
    let p = a.pos0 + i;
    let end = if a.causal { p + 1 } else { a.pos0 + a.rows };
    let start = a.window.map_or(0, |w| (p + 1).saturating_sub(w));
    start..end
}

/// Long batches (ggml's tiled f32 path): K and V of each KV head are converted to f32 once, then
/// every (head, query row) runs an f32 softmax over its visible keys.
fn batched_f32(q: &CpuBuf, kv: &CpuKv, a: &AttnArgs, out: &mut CpuBuf) {
    let hd = a.head_dim;
    let n_keys = a.pos0 + a.rows;
    let group = a.n_head / a.n_kv_head;
    let rb = kv.row_bytes;
    let convert = |cache: &[u8]| -> Vec<Vec<f32>> {
        (0..a.n_kv_head)
            .into_par_iter()
            .map(|kh| {
                let mut f = vec![0f32; n_keys * hd];
                for j in 0..n_keys {
                    let off = j * rb + kh * hd * 2;
                    simd::f16_to_f32s(&cache[off..off + 2 * hd], &mut f[j * hd..(j + 1) * hd]);
                }
                f
            })
            .collect()
    };
    let kf = convert(&kv.k[a.layer]);
    let vf = convert(&kv.v[a.layer]);
    let outp = SyncPtr(out.data.as_mut_ptr());
    let out_cols = out.cols;
    const ROWS: usize = 16;
    let n_blocks = a.rows.div_ceil(ROWS);
    (0..a.n_head * n_blocks).into_par_iter().for_each(|task| {
        let (h, blk) = (task / n_blocks, task % n_blocks);
        let (kh, ks, vs) = (h / group, &kf[h / group], &vf[h / group]);
        let _ = kh;
        let mut scores = vec![0f32; n_keys];
        let mut acc = vec![0f32; hd];
        for i in blk * ROWS..((blk + 1) * ROWS).min(a.rows) {
            let qrow = &q.row(a.row0 + i)[h * hd..(h + 1) * hd];
            let range = key_range(a, i);
            let mut m = f32::NEG_INFINITY;
            for j in range.clone() {
                let s = simd::dot(qrow, &ks[j * hd..(j + 1) * hd]) * a.scale;
                scores[j] = s;
                m = m.max(s);
            }
            acc.fill(0.0);
            let sum = simd::softmax_exp(&mut scores[range.clone()], m) as f32;
            for j in range {
                simd::axpy(&mut acc, &vs[j * hd..(j + 1) * hd], scores[j]);
            }
            let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            // SAFETY: row (row0 + i), head h belongs to this task only.
            unsafe {
                let dst = std::slice::from_raw_parts_mut(outp.at((a.row0 + i) * out_cols + h * hd), hd);
                for (d, &v) in dst.iter_mut().zip(&acc) {
                    *d = v * inv;
                }
            }
        }
    });
}

/// Short batches and decoding (ggml's `one_chunk` path), one task per (query row, head).
fn per_row(cpu: &Cpu, q: &CpuBuf, kv: &CpuKv, a: &AttnArgs, out: &mut CpuBuf) {
    let hd = a.head_dim;
    let group = a.n_head / a.n_kv_head;
    let outp = SyncPtr(out.data.as_mut_ptr());
    let out_cols = out.cols;
    let task = |idx: usize| {
        let (i, h) = (idx / a.n_head, idx % a.n_head);
        let range = key_range(a, i);
        let kh = h / group;
        let qrow = &q.row(a.row0 + i)[h * hd..(h + 1) * hd];
        let k = &kv.k[a.layer];
        let v = &kv.v[a.layer];
        let rb = kv.row_bytes;
        let mut res = vec![0f32; hd];
        match kv.ty {
            KvType::F16 => {
                let head_off = kh * hd * 2;
                let krow = |ic: usize| &k[ic * rb + head_off..ic * rb + head_off + 2 * hd];
                let vrow = |ic: usize| &v[ic * rb + head_off..ic * rb + head_off + 2 * hd];
                one_chunk_f16(qrow, range, a.scale, krow, vrow, &mut res);
            }
            KvType::Q8_0 => {
                let head_off = kh * hd / 32 * 34;
                let blen = hd / 32 * 34;
                let mut q8 = vec![0u8; dot::act_row_bytes(GgmlType::Q8_0, hd)];
                dot::quantize_act(GgmlType::Q8_0, qrow, &mut q8);
                let kern = dot::kernel(GgmlType::Q8_0, cpu.path).expect("Q8_0 kernel");
                let codec = quant::codec(GgmlType::Q8_0).expect("Q8_0 codec");
                online_f32(range, a.scale, &mut res, |ic, vf: &mut Vec<f32>| {
                    let mut s = [0f32];
                    let kb = &k[ic * rb + head_off..ic * rb + head_off + blen];
                    (kern.dot)(GgmlType::Q8_0, hd, kb, &[&q8], &mut s);
                    (codec.dequantize)(&v[ic * rb + head_off..ic * rb + head_off + blen], vf);
                    s[0]
                });
            }
        }
        // SAFETY: row (row0 + i), head h is written by this task only.
        unsafe {
            let dst = outp.at((a.row0 + i) * out_cols + h * hd);
            std::ptr::copy_nonoverlapping(res.as_ptr(), dst, hd);
        }
    };
    let n = a.rows * a.n_head;
    if n > 1 {
        (0..n).into_par_iter().for_each(task);
    } else {
        (0..n).for_each(task);
    }
}

/// ggml's `one_chunk`: Q rounded to f16, KQ in f32, the V accumulator kept in f16.
fn one_chunk_f16<'a>(
    q: &[f32],
    range: std::ops::Range<usize>,
    scale: f32,
    krow: impl Fn(usize) -> &'a [u8],
    vrow: impl Fn(usize) -> &'a [u8],
    out: &mut [f32],
) {
    let hd = q.len();
    let mut q16 = vec![0u8; 2 * hd];
    dot::quantize_act(GgmlType::F16, q, &mut q16);
    let mut acc = vec![0u16; hd];
    let (mut s_sum, mut m) = (0f32, f32::NEG_INFINITY);
    for ic in range {
        let s = simd::dot_f16(krow(ic), &q16) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > m {
            let old = m;
            m = s;
            ms = (old - m).exp();
            simd::scale_f16(&mut acc, ms);
        } else {
            vs = (s - m).exp();
        }
        simd::mad_f16(&mut acc, vrow(ic), vs);
        // `S = S*ms + vs`, contracted to an FMA in ggml's build.
        s_sum = s_sum.mul_add(ms, vs);
    }
    let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
    for (o, &a) in out.iter_mut().zip(&acc) {
        *o = f16_to_f32(a) * inv;
    }
}

/// Online softmax with an f32 accumulator; `row(ic, v)` returns the unscaled KQ value and
/// fills `v` with the value row.
fn online_f32(
    range: std::ops::Range<usize>,
    scale: f32,
    out: &mut [f32],
    mut row: impl FnMut(usize, &mut Vec<f32>) -> f32,
) {
    let hd = out.len();
    let mut acc = vec![0f32; hd];
    let mut v = vec![0f32; hd];
    let (mut s_sum, mut m) = (0f32, f32::NEG_INFINITY);
    for ic in range {
        let s = row(ic, &mut v) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > m {
            let old = m;
            m = s;
            ms = (old - m).exp();
            simd::scale(&mut acc, ms);
        } else {
            vs = (s - m).exp();
        }
        simd::axpy(&mut acc, &v, vs);
        s_sum = s_sum * ms + vs;
    }
    let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
    for (o, &a) in out.iter_mut().zip(&acc) {
        *o = a * inv;
    }
}
