//! Q6_K: 6-bit quants (low 4 bits in `ql`, high 2 in `qh`) in 16 sub-blocks of 16, with signed
//! 8-bit sub-block scales.

use super::helpers::{make_qx_quants, requant_sym, GROUP_MAX_EPS, QK_K};
use super::{for_each_block, for_each_dequant, BlockQ6K};
use crate::fp::{get_f16, nearest_int, put_f16};

// ggml-quants.c: quantize_q6_K (ref path without an imatrix, impl path with one)
pub(super) fn quantize_row(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    for_each_block(src, dst, imatrix, quantize_block);
}

/// The ref and impl paths differ only in the weights given to `make_qx_quants` (x² or the
/// importance matrix).
// ggml-quants.c: quantize_row_q6_K_ref / quantize_row_q6_K_impl (one super-block)
fn quantize_block(x: &[f32; QK_K], y: &mut BlockQ6K, qw: Option<&[f32; QK_K]>) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];

    let mut max_scale = 0f32;
    let mut max_abs_scale = 0f32;
    for (ib, scale_out) in scales.iter_mut().enumerate() {
        let range = 16 * ib..16 * (ib + 1);
        let w = qw.map(|w| &w[range.clone()]);
        let scale = make_qx_quants(32, &x[range.clone()], &mut levels[range], 1, w);
        *scale_out = scale;
        let abs_scale = scale.abs();
        if abs_scale > max_abs_scale {
            max_abs_scale = abs_scale;
            max_scale = scale;
        }
    }

    if max_abs_scale < GROUP_MAX_EPS {
        *y = bytemuck::Zeroable::zeroed();
        y.d = put_f16(0.0);
        return;
    }

    let iscale = -128.0 / max_scale;
    y.d = put_f16(1.0 / iscale);
    for (s, &scale) in y.scales.iter_mut().zip(&scales) {
        *s = nearest_int(iscale * scale).min(127) as i8 as u8;
    }

    let dall = get_f16(y.d);
    for j in 0..QK_K / 16 {
        let d = dall * (y.scales[j] as i8) as f32;
        if d == 0.0 {
            continue;
        }
        requant_sym(
            &x[16 * j..16 * (j + 1)],
            d,
            -32,
            31,
            32,
            &mut levels[16 * j..16 * (j + 1)],
        );
    }

    // Per 128 quants: ql[0..32] holds quants 0..32 (low nibble) and 64..96 (high nibble),
    // ql[32..64] quants 32..64 and 96..128; qh[0..32] the top 2 bits of all four.
    let l = levels.map(|l| l as u8);
    for ((ql, qh), l) in
        y.ql.chunks_exact_mut(64)
            .zip(y.qh.chunks_exact_mut(32))
            .zip(l.chunks_exact(128))
    {
        for k in 0..32 {
            let (l1, l2, l3, l4) = (l[k], l[k + 32], l[k + 64], l[k + 96]);
            ql[k] = (l1 & 0xF) | ((l3 & 0xF) << 4);
            ql[k + 32] = (l2 & 0xF) | ((l4 & 0xF) << 4);
            qh[k] = (l1 >> 4) | ((l2 >> 4) << 2) | ((l3 >> 4) << 4) | ((l4 >> 4) << 6);
        }
    }
}

// ggml-quants.c: dequantize_row_q6_K
pub(super) fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::fast::has_avx2() {
        // SAFETY: AVX2 is available.
        return for_each_dequant(src, dst, |b: &BlockQ6K, y| unsafe { super::fast::dequant_q6_k(b, y) });
    }
    dequantize_row_scalar(src, dst)
}

/// The scalar reference of [`dequantize_row`].
pub(super) fn dequantize_row_scalar(src: &[u8], dst: &mut [f32]) {
    for_each_dequant(src, dst, |b: &BlockQ6K, y| {
        let d = get_f16(b.d);
        let chunks = b.ql.chunks_exact(64).zip(b.qh.chunks_exact(32));
        for (n, ((ql, qh), out)) in chunks.zip(y.chunks_exact_mut(128)).enumerate() {
            let sc = &b.scales[8 * n..8 * (n + 1)];
            let scale = |i: usize| d * (sc[i] as i8) as f32;
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                out[l] = scale(is) * q1 as f32;
                out[l + 32] = scale(is + 2) * q2 as f32;
                out[l + 64] = scale(is + 4) * q3 as f32;
                out[l + 96] = scale(is + 6) * q4 as f32;
            }
        }
    });
}
