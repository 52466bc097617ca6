//! Q4_K: 4-bit quants in 8 sub-blocks of 32, with 6-bit sub-block scales and mins. The scale
//! search and requantization here are shared with Q5_K, which differs only in `nmax` and the
//! search parameters.

use super::helpers::{get_scale_min_k4, make_qkx_groups, make_qp_quants, pack_scale_min_k4, requant_asym, QK_K};
use super::{for_each_block, for_each_dequant, BlockQ4K};
use crate::fp::{get_f16, nearest_int, put_f16};

/// Quants, packed scales/mins and the two f16 super-block scales of one Q4_K/Q5_K block.
pub(super) struct ScaledLevels {
    pub levels: [u8; QK_K],
    pub scales: [u8; 12],
    pub d: [u8; 2],
    pub dmin: [u8; 2],
}

/// Sub-block search without an importance matrix, then 6-bit quantization of the sub-block
/// scales and mins against their maxima.
// ggml-quants.c: quantize_row_q4_K_ref / quantize_row_q5_K_ref (scale part)
pub(super) fn search_ref(x: &[f32; QK_K], nmax: i32, rmin: f32, rdelta: f32, nstep: i32) -> ScaledLevels {
    let mut levels = [0u8; QK_K];
    let mut weights = [0f32; QK_K];
    let mut mins = [0f32; QK_K / 32];
    let mut scales = [0f32; QK_K / 32];
    for (xs, ws) in x.chunks_exact(32).zip(weights.chunks_exact_mut(32)) {
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in ws.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
    }
    make_qkx_groups(
        false,
        false,
        nmax,
        32,
        x,
        &weights,
        &mut levels,
        (rmin, rdelta, nstep),
        &mut scales,
        &mut mins,
    );
    let mut max_scale = 0f32;
    let mut max_min = 0f32;
    for (&scale, &min) in scales.iter().zip(&mins) {
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }

    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    // ggml stores the rounded values in uint8_t before clamping to 63.
    let ls = scales.map(|s| (nearest_int(inv_scale * s) as u8).min(63));
    let lm = mins.map(|m| (nearest_int(inv_min * m) as u8).min(63));
    ScaledLevels {
        levels,
        scales: pack_scale_min_k4(&ls, &lm),
        d: put_f16(max_scale / 63.0),
        dmin: put_f16(max_min / 63.0),
    }
}

/// Sub-block search weighted by the importance matrix, then `make_qp_quants` for the sub-block
/// scales and mins. `clamp_63` applies Q5_K's (no-op in practice) `MIN(63, …)` that Q4_K lacks.
// ggml-quants.c: quantize_row_q4_K_impl / quantize_row_q5_K_impl (scale part)
pub(super) fn search_impl(x: &[f32; QK_K], qw: &[f32; QK_K], nmax: i32, clamp_63: bool) -> ScaledLevels {
    let mut levels = [0u8; QK_K];
    let mut weights = [0f32; QK_K];
    let mut sw = [0f32; QK_K / 32];
    let mut mins = [0f32; QK_K / 32];
    let mut scales = [0f32; QK_K / 32];
    let mut ls = [0u8; QK_K / 32];
    let mut lm = [0u8; QK_K / 32];

    let mut sum_x2 = 0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    let sigma2 = 2.0 * sum_x2 / QK_K as f32;
    for (w, (&q, &v)) in weights.iter_mut().zip(qw.iter().zip(x)) {
        *w = q * (sigma2 + v * v).sqrt();
    }
    for (s, ws) in sw.iter_mut().zip(weights.chunks_exact(32)) {
        let mut sumw = 0f32;
        for &w in ws {
            sumw += w;
        }
        *s = sumw;
    }
    make_qkx_groups(
        true,
        false,
        nmax,
        32,
        x,
        &weights,
        &mut levels,
        (-0.9, 0.05, 36),
        &mut scales,
        &mut mins,
    );

    let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
    if clamp_63 {
        ls = ls.map(|l| l.min(63));
        lm = lm.map(|l| l.min(63));
    }
    ScaledLevels {
        levels,
        scales: pack_scale_min_k4(&ls, &lm),
        d: put_f16(d_block),
        dmin: put_f16(m_block),
    }
}

/// Re-derives the quants (`0..=nmax`) from the stored scales and mins; sub-blocks with a zero
/// scale keep the quants the search found.
// ggml-quants.c: the requantization loop of quantize_row_q4_K_ref (and q4_K/q5_K ref/impl)
pub(super) fn requantize(x: &[f32; QK_K], s: &mut ScaledLevels, nmax: i32) {
    let dall = get_f16(s.d);
    let mall = get_f16(s.dmin);
    for j in 0..QK_K / 32 {
        let (sc, m) = get_scale_min_k4(j, &s.scales);
        let d = dall * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = mall * m as f32;
        requant_asym(
            &x[32 * j..32 * (j + 1)],
            d,
            dm,
            nmax,
            &mut s.levels[32 * j..32 * (j + 1)],
        );
    }
}

// ggml-quants.c: quantize_q4_K (ref path without an imatrix, impl path with one)
pub(super) fn quantize_row(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    for_each_block(src, dst, imatrix, |x, y: &mut BlockQ4K, qw| {
        let mut s = match qw {
            None => search_ref(x, 15, -1.0, 0.1, 20),
            Some(qw) => search_impl(x, qw, 15, false),
        };
        requantize(x, &mut s, 15);
        y.d = s.d;
        y.dmin = s.dmin;
        y.scales = s.scales;
        for (qs, l) in y.qs.chunks_exact_mut(32).zip(s.levels.chunks_exact(64)) {
            for k in 0..32 {
                qs[k] = l[k] | (l[k + 32] << 4);
            }
        }
    });
}

// ggml-quants.c: dequantize_row_q4_K
pub(super) fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::fast::has_avx2() {
        // SAFETY: AVX2 is available.
        return for_each_dequant(src, dst, |b: &BlockQ4K, y| unsafe {
            super::fast::dequant_q45_k(get_f16(b.d), get_f16(b.dmin), &b.scales, &b.qs, None, y)
        });
    }
    dequantize_row_scalar(src, dst)
}

/// The scalar reference of [`dequantize_row`].
pub(super) fn dequantize_row_scalar(src: &[u8], dst: &mut [f32]) {
    for_each_dequant(src, dst, |b: &BlockQ4K, y| {
        let d = get_f16(b.d);
        let min = get_f16(b.dmin);
        for (j, (q, out)) in b.qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (sc1, m1) = get_scale_min_k4(2 * j, &b.scales);
            let (sc2, m2) = get_scale_min_k4(2 * j + 1, &b.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            for l in 0..32 {
                out[l] = d1 * (q[l] & 0xF) as f32 - m1;
                out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    });
}
