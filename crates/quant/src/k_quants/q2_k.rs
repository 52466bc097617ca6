//! Q2_K: 2-bit quants in 16 sub-blocks of 16, with 4-bit sub-block scales and mins.

use super::helpers::{make_qkx_groups, make_qp_quants, pack_2bit, requant_asym, QK_K};
use super::{for_each_block, for_each_dequant, BlockQ2K};
use crate::fp::{get_f16, nearest_int, put_f16};

// ggml-quants.c: quantize_q2_K (ref path without an imatrix, impl path with one)
pub(super) fn quantize_row(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    for_each_block(src, dst, imatrix, |x, y: &mut BlockQ2K, qw| match qw {
        None => quantize_block_ref(x, y),
        Some(qw) => quantize_block_impl(x, y, qw),
    });
}

// ggml-quants.c: quantize_row_q2_K_ref (one super-block)
fn quantize_block_ref(x: &[f32; QK_K], y: &mut BlockQ2K) {
    const Q4SCALE: f32 = 15.0;
    let mut levels = [0u8; QK_K];
    let weights = x.map(f32::abs);
    let mut mins = [0f32; QK_K / 16];
    let mut scales = [0f32; QK_K / 16];
    make_qkx_groups(
        false,
        true,
        3,
        16,
        x,
        &weights,
        &mut levels,
        (-0.5, 0.1, 15),
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

    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for (s, &scale) in y.scales.iter_mut().zip(&scales) {
            *s = nearest_int(iscale * scale) as u8;
        }
        y.d = put_f16(max_scale / Q4SCALE);
    } else {
        y.scales = [0; QK_K / 16];
        y.d = put_f16(0.0);
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for (s, &min) in y.scales.iter_mut().zip(&mins) {
            *s |= (nearest_int(iscale * min) << 4) as u8;
        }
        y.dmin = put_f16(max_min / Q4SCALE);
    } else {
        y.dmin = put_f16(0.0);
    }
    requantize(x, y, &mut levels);
    pack_2bit(&levels, &mut y.qs);
}

// ggml-quants.c: quantize_row_q2_K_impl (one super-block)
fn quantize_block_impl(x: &[f32; QK_K], y: &mut BlockQ2K, qw: &[f32; QK_K]) {
    let mut levels = [0u8; QK_K];
    let mut mins = [0f32; QK_K / 16];
    let mut scales = [0f32; QK_K / 16];
    let mut sw = [0f32; QK_K / 16];
    let mut weight = [0f32; QK_K];
    let mut ls = [0u8; QK_K / 16];
    let mut lm = [0u8; QK_K / 16];

    let mut sumx2 = 0f32;
    for &v in x {
        sumx2 += v * v;
    }
    let sigma2 = sumx2 / QK_K as f32;
    for (w, (&q, &v)) in weight.iter_mut().zip(qw.iter().zip(x)) {
        *w = q * (sigma2 + v * v).sqrt();
    }
    for (s, ws) in sw.iter_mut().zip(weight.chunks_exact(16)) {
        for &w in ws {
            *s += w;
        }
    }
    make_qkx_groups(
        true,
        false,
        3,
        16,
        x,
        &weight,
        &mut levels,
        (-0.9, 0.05, 36),
        &mut scales,
        &mut mins,
    );

    let dm = make_qp_quants(15, &scales, &mut ls, &sw);
    let mm = make_qp_quants(15, &mins, &mut lm, &sw);
    y.d = put_f16(dm);
    y.dmin = put_f16(mm);
    for j in 0..QK_K / 16 {
        y.scales[j] = ls[j] | (lm[j] << 4);
    }
    requantize(x, y, &mut levels);
    pack_2bit(&levels, &mut y.qs);
}

/// Re-derives the quants from the stored (rounded) scales and mins; sub-blocks with a zero scale
/// keep the quants the search found.
// ggml-quants.c: the requantization loop of quantize_row_q2_K_ref / quantize_row_q2_K_impl
fn requantize(x: &[f32; QK_K], y: &BlockQ2K, levels: &mut [u8; QK_K]) {
    let dall = get_f16(y.d);
    let mall = get_f16(y.dmin);
    for j in 0..QK_K / 16 {
        let d = dall * (y.scales[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = mall * (y.scales[j] >> 4) as f32;
        requant_asym(&x[16 * j..16 * (j + 1)], d, dm, 3, &mut levels[16 * j..16 * (j + 1)]);
    }
}

// ggml-quants.c: dequantize_row_q2_K
pub(super) fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::fast::has_avx2() {
        // SAFETY: AVX2 is available.
        return for_each_dequant(src, dst, |b: &BlockQ2K, y| unsafe { super::fast::dequant_q2_k(b, y) });
    }
    dequantize_row_scalar(src, dst)
}

/// The scalar reference of [`dequantize_row`].
pub(super) fn dequantize_row_scalar(src: &[u8], dst: &mut [f32]) {
    for_each_dequant(src, dst, |b: &BlockQ2K, y| {
        let d = get_f16(b.d);
        let min = get_f16(b.dmin);
        let mut out = y.iter_mut();
        let mut is = 0;
        for q in b.qs.chunks_exact(32) {
            for shift in (0..8).step_by(2) {
                for half in q.chunks_exact(16) {
                    let sc = b.scales[is];
                    is += 1;
                    let dl = d * (sc & 0xF) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for &qv in half {
                        *out.next().unwrap() = dl * ((qv >> shift) & 3) as f32 - ml;
                    }
                }
            }
        }
    });
}
