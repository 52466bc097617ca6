//! Q3_K: 3-bit quants (2 low bits in `qs`, the high bit in `hmask`) in 16 sub-blocks of 16, with
//! signed 6-bit sub-block scales.

use super::helpers::{make_q3_quants, make_qx_quants, pack_2bit, requant_sym, QK_K};
use super::{for_each_block, for_each_dequant, BlockQ3K};
use crate::fp::{get_f16, nearest_int, put_f16};

// ggml-quants.c: quantize_q3_K (ref path without an imatrix, impl path with one)
pub(super) fn quantize_row(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    for_each_block(src, dst, imatrix, |x, y: &mut BlockQ3K, qw| match qw {
        None => quantize_block_ref(x, y),
        Some(qw) => quantize_block_impl(x, y, qw),
    });
}

// ggml-quants.c: quantize_row_q3_K_ref (one super-block)
fn quantize_block_ref(x: &[f32; QK_K], y: &mut BlockQ3K) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];

    let mut max_scale = 0f32;
    let mut amax = 0f32;
    for j in 0..QK_K / 16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * (j + 1)], &mut levels[16 * j..16 * (j + 1)], true);
        let scale = scales[j].abs();
        if scale > amax {
            amax = scale;
            max_scale = scales[j];
        }
    }

    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        let mut ls = [0u8; QK_K / 16];
        for (l, &scale) in ls.iter_mut().zip(&scales) {
            // ggml stores the rounded value in an int8_t before clamping.
            let v = nearest_int(iscale * scale) as i8;
            *l = ((v as i32).clamp(-32, 31) + 32) as u8;
        }
        y.scales = pack_scales(&ls);
        y.d = put_f16(1.0 / iscale);
    } else {
        y.scales = [0; 12];
        y.d = put_f16(0.0);
    }
    finish_block(x, y, &mut levels);
}

// ggml-quants.c: quantize_row_q3_K_impl (one super-block)
fn quantize_block_impl(x: &[f32; QK_K], y: &mut BlockQ3K, qw: &[f32; QK_K]) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    let mut weight = [0f32; 16];
    let mut sw = [0f32; QK_K / 16];
    let mut ls = [0i8; QK_K / 16];

    let mut sumx2 = 0f32;
    for &v in x {
        sumx2 += v * v;
    }
    let sigma2 = 2.0 * sumx2 / QK_K as f32;
    for j in 0..QK_K / 16 {
        let xs = &x[16 * j..16 * (j + 1)];
        for l in 0..16 {
            weight[l] = qw[16 * j + l] * (sigma2 + xs[l] * xs[l]).sqrt();
        }
        let mut sumw = 0f32;
        for &w in &weight {
            sumw += w;
        }
        sw[j] = sumw;
        scales[j] = make_qx_quants(4, xs, &mut levels[16 * j..16 * (j + 1)], 1, Some(&weight));
    }

    let d_block = make_qx_quants(32, &scales, &mut ls, 1, Some(&sw));
    y.scales = pack_scales(&ls.map(|l| l as u8));
    y.d = put_f16(d_block);
    finish_block(x, y, &mut levels);
}

/// Packs sixteen 6-bit scales: low nibbles in bytes 0..8, the 2 high bits in bytes 8..12.
// ggml-quants.c: the scale packing loop of quantize_row_q3_K_ref / quantize_row_q3_K_impl
pub(super) fn pack_scales(ls: &[u8; QK_K / 16]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (j, &l) in ls.iter().enumerate() {
        if j < 8 {
            s[j] = l & 0xF;
        } else {
            s[j - 8] |= (l & 0xF) << 4;
        }
        s[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
    }
    s
}

/// Signed scale of sub-block `j` (the stored 6-bit value minus 32).
// ggml-quants.c: the scale unpacking of quantize_row_q3_K_ref (same values as dequantize_row_q3_K)
pub(super) fn scale(s: &[u8; 12], j: usize) -> i32 {
    let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
    let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i32 - 32
}

/// Requantizes with the stored scales, then splits the quants into `hmask` and `qs`.
// ggml-quants.c: the tail of quantize_row_q3_K_ref / quantize_row_q3_K_impl
fn finish_block(x: &[f32; QK_K], y: &mut BlockQ3K, levels: &mut [i8; QK_K]) {
    let dall = get_f16(y.d);
    for j in 0..QK_K / 16 {
        let d = dall * scale(&y.scales, j) as f32;
        if d == 0.0 {
            continue;
        }
        requant_sym(&x[16 * j..16 * (j + 1)], d, -4, 3, 4, &mut levels[16 * j..16 * (j + 1)]);
    }

    // The high bit of quants 0..32 goes to bit 0 of hmask[0..32], of 32..64 to bit 1, etc.
    y.hmask = [0; QK_K / 8];
    let mut low = [0u8; QK_K];
    for (j, (&l, lo)) in levels.iter().zip(low.iter_mut()).enumerate() {
        if l > 3 {
            y.hmask[j % (QK_K / 8)] |= 1 << (j / (QK_K / 8));
            *lo = (l - 4) as u8;
        } else {
            *lo = l as u8;
        }
    }
    pack_2bit(&low, &mut y.qs);
}

// ggml-quants.c: dequantize_row_q3_K
pub(super) fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::fast::has_avx2() {
        // SAFETY: AVX2 is available.
        return for_each_dequant(src, dst, |b: &BlockQ3K, y| unsafe { super::fast::dequant_q3_k(b, y) });
    }
    dequantize_row_scalar(src, dst)
}

/// The scalar reference of [`dequantize_row`].
pub(super) fn dequantize_row_scalar(src: &[u8], dst: &mut [f32]) {
    for_each_dequant(src, dst, |b: &BlockQ3K, y| {
        let d_all = get_f16(b.d);
        let mut out = y.iter_mut();
        let mut is = 0;
        let mut m = 1u8;
        for q in b.qs.chunks_exact(32) {
            for shift in (0..8).step_by(2) {
                for half in 0..2 {
                    let dl = d_all * scale(&b.scales, is) as f32;
                    is += 1;
                    let range = 16 * half..16 * (half + 1);
                    for (&qv, &hm) in q[range.clone()].iter().zip(&b.hmask[range]) {
                        let v = ((qv >> shift) & 3) as i32 - if hm & m != 0 { 0 } else { 4 };
                        *out.next().unwrap() = dl * v as f32;
                    }
                }
                m <<= 1;
            }
        }
    });
}
