//! Softmax attention over the KV cache, following ggml's CPU flash attention
//! (`ggml-cpu/ops.cpp`, ggml_compute_forward_flash_attn_ext_f16): an online softmax per query row
//! and head. For fewer than 64 query rows ggml takes its `one_chunk` path, which rounds Q to f16
//! and accumulates V·softmax in an f16 vector; longer batches use its tiled f32 path. Both are
//! reproduced so that hf2q's numbers follow llama.cpp's.

use super::{Cpu, CpuBuf, CpuKv, SyncPtr};
use crate::backend::{AttnArgs, KvType};
use gguf::GgmlType;
use quant::dot::{self, KernelPath};
use quant::fp::{f16_to_f32, f32_to_f16};
use rayon::prelude::*;

/// ggml's `GGML_FA_TILE_Q`: batches of at least this many query rows take the f32 path.
const TILE_Q: usize = 64;

pub(super) fn attention(cpu: &Cpu, q: &CpuBuf, kv: &CpuKv, a: &AttnArgs, out: &mut CpuBuf) {
    let hd = a.head_dim;
    out.set_shape(q.rows, a.n_head * hd);
    let group = a.n_head / a.n_kv_head;
    let f16_path = a.rows < TILE_Q;
    let outp = SyncPtr(out.data.as_mut_ptr());
    let out_cols = out.cols;
    let avx2 = cpu.path == KernelPath::Avx2;
    let task = |idx: usize| {
        let outp = outp;
        let (i, h) = (idx / a.n_head, idx % a.n_head);
        let p = a.pos0 + i;
        let end = if a.causal { p + 1 } else { a.pos0 + a.rows };
        let start = a.window.map_or(0, |w| (p + 1).saturating_sub(w));
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
                if f16_path {
                    one_chunk_f16(qrow, start..end, a.scale, krow, vrow, avx2, &mut res);
                } else {
                    let mut kf = vec![0f32; hd];
                    online_f32(start..end, a.scale, &mut res, |ic, vf: &mut Vec<f32>| {
                        f16_row(krow(ic), &mut kf);
                        f16_row(vrow(ic), vf);
                        dot_f32(qrow, &kf)
                    });
                }
            }
            KvType::Q8_0 => {
                let head_off = kh * hd / 32 * 34;
                let blen = hd / 32 * 34;
                let mut q8 = vec![0u8; blen];
                dot::quantize_act(GgmlType::Q8_0, qrow, &mut q8);
                let kern = dot::kernel(GgmlType::Q8_0, cpu.path).expect("Q8_0 kernel");
                let codec = quant::codec(GgmlType::Q8_0).expect("Q8_0 codec");
                online_f32(start..end, a.scale, &mut res, |ic, vf: &mut Vec<f32>| {
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
            let dst = outp.0.add((a.row0 + i) * out_cols + h * hd);
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

fn f16_row(src: &[u8], dst: &mut [f32]) {
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// ggml's `one_chunk`: Q rounded to f16, KQ in f32, the V accumulator kept in f16.
fn one_chunk_f16<'a>(
    q: &[f32],
    range: std::ops::Range<usize>,
    scale: f32,
    krow: impl Fn(usize) -> &'a [u8],
    vrow: impl Fn(usize) -> &'a [u8],
    avx2: bool,
    out: &mut [f32],
) {
    let hd = q.len();
    let mut q16 = vec![0u8; 2 * hd];
    dot::quantize_act(GgmlType::F16, q, &mut q16);
    let q16f: Vec<f32> = q16
        .chunks_exact(2)
        .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
        .collect();
    let mut acc = vec![0u16; hd];
    let (mut s_sum, mut m) = (0f32, f32::NEG_INFINITY);
    for ic in range {
        let kr = krow(ic);
        let s = if avx2 {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the AVX2 path was detected (F16C and FMA included); both rows hold hd f16.
            unsafe {
                dot::avx2::f16_dot_one(hd, kr.as_ptr(), q16.as_ptr())
            }
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!()
        } else {
            kr.chunks_exact(2)
                .zip(&q16f)
                .map(|(b, &y)| f16_to_f32(u16::from_le_bytes([b[0], b[1]])) * y)
                .sum()
        } * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > m {
            let old = m;
            m = s;
            ms = (old - m).exp();
            for a in acc.iter_mut() {
                *a = f32_to_f16(f16_to_f32(*a) * ms);
            }
        } else {
            vs = (s - m).exp();
        }
        for (a, b) in acc.iter_mut().zip(vrow(ic).chunks_exact(2)) {
            let vv = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            *a = f32_to_f16(vv.mul_add(vs, f16_to_f32(*a)));
        }
        s_sum = s_sum * ms + vs;
    }
    let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
    for (o, &a) in out.iter_mut().zip(&acc) {
        *o = f16_to_f32(a) * inv;
    }
}

/// Online softmax with an f32 accumulator; `row(ic, v)` returns the scaled-before KQ value and
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
            acc.iter_mut().for_each(|a| *a *= ms);
        } else {
            vs = (s - m).exp();
        }
        for (a, &x) in acc.iter_mut().zip(&v) {
            *a = x.mul_add(vs, *a);
        }
        s_sum = s_sum * ms + vs;
    }
    let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
    for (o, &a) in out.iter_mut().zip(&acc) {
        *o = a * inv;
    }
}
