//! Q8_K: the 8-bit intermediate type of the K-quant dot products: `x ≈ d * q` with an f32 `d`
//! and signed 8-bit quants, plus the sum of each 16 quants.

use super::helpers::QK_K;
use super::{for_each_block, for_each_dequant, BlockQ8K};
use crate::fp::nearest_int;

/// ggml has no importance-matrix path for Q8_K; the matrix is ignored.
// ggml-quants.c: quantize_row_q8_K_ref
pub(super) fn quantize_row(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    for_each_block(src, dst, None, |x, y: &mut BlockQ8K, _| quantize_block(x, y));
}

// ggml-quants.c: quantize_row_q8_K_ref (one block)
fn quantize_block(x: &[f32; QK_K], y: &mut BlockQ8K) {
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax == 0.0 {
        // ggml leaves bsums untouched here; they are the sums of zero quants, so write zeros.
        *y = bytemuck::Zeroable::zeroed();
        return;
    }
    // -127 rather than -128: ggml's IQ2_XXS dot products rely on the quants staying in ±127.
    let iscale = -127.0 / max;
    for (q, &v) in y.qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8 as u8;
    }
    for (s, q) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
        let sum: i32 = q.iter().map(|&v| v as i8 as i32).sum();
        *s = (sum as i16).to_le_bytes();
    }
    y.d = (1.0 / iscale).to_le_bytes();
}

// ggml-quants.c: dequantize_row_q8_K
pub(super) fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::fast::has_avx2() {
        // SAFETY: AVX2 is available.
        return for_each_dequant(src, dst, |b: &BlockQ8K, y| unsafe { super::fast::dequant_q8_k(b, y) });
    }
    dequantize_row_scalar(src, dst)
}

/// The scalar reference of [`dequantize_row`].
pub(super) fn dequantize_row_scalar(src: &[u8], dst: &mut [f32]) {
    for_each_dequant(src, dst, |b: &BlockQ8K, y| {
        let d = f32::from_le_bytes(b.d);
        for (out, &q) in y.iter_mut().zip(&b.qs) {
            *out = d * (q as i8) as f32;
        }
    });
}
