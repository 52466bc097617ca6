//! Q5_K: 5-bit quants (low 4 bits in `qs`, the fifth in `qh`) in 8 sub-blocks of 32, with 6-bit
//! sub-block scales and mins; the scale search is Q4_K's with `nmax` 31.

use super::helpers::{get_scale_min_k4, QK_K};
use super::q4_k::{requantize, search_impl, search_ref};
use super::{for_each_block, for_each_dequant, BlockQ5K};
use crate::fp::get_f16;

// ggml-quants.c: quantize_q5_K (quantize_row_q5_K_ref without an imatrix, quantize_row_q5_K_impl with one)
pub(super) fn quantize_row(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    for_each_block(src, dst, imatrix, |x, y: &mut BlockQ5K, qw| {
        let mut s = match qw {
            None => search_ref(x, 31, -0.5, 0.1, 15),
            Some(qw) => search_impl(x, qw, 31, true),
        };
        requantize(x, &mut s, 31);
        y.d = s.d;
        y.dmin = s.dmin;
        y.scales = s.scales;
        // Quants n..n+32 and n+32..n+64 of each 64 share 32 bytes of qs (low, high nibble); their
        // fifth bits go to qh bits 2k and 2k+1 for the k-th group of 64.
        y.qh = [0; QK_K / 8];
        for (k, (ql, l)) in y.qs.chunks_exact_mut(32).zip(s.levels.chunks_exact(64)).enumerate() {
            let (m1, m2) = (1u8 << (2 * k), 2u8 << (2 * k));
            for j in 0..32 {
                let mut l1 = l[j];
                if l1 > 15 {
                    l1 -= 16;
                    y.qh[j] |= m1;
                }
                let mut l2 = l[j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    y.qh[j] |= m2;
                }
                ql[j] = l1 | (l2 << 4);
            }
        }
    });
}

// ggml-quants.c: dequantize_row_q5_K
pub(super) fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::fast::has_avx2() {
        // SAFETY: AVX2 is available.
        return for_each_dequant(src, dst, |b: &BlockQ5K, y| unsafe {
            super::fast::dequant_q45_k(get_f16(b.d), get_f16(b.dmin), &b.scales, &b.qs, Some(&b.qh), y)
        });
    }
    dequantize_row_scalar(src, dst)
}

/// The scalar reference of [`dequantize_row`].
pub(super) fn dequantize_row_scalar(src: &[u8], dst: &mut [f32]) {
    for_each_dequant(src, dst, |b: &BlockQ5K, y| {
        let d = get_f16(b.d);
        let min = get_f16(b.dmin);
        for (j, (ql, out)) in b.qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (sc1, m1) = get_scale_min_k4(2 * j, &b.scales);
            let (sc2, m2) = get_scale_min_k4(2 * j + 1, &b.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
            for l in 0..32 {
                let hi1 = if b.qh[l] & u1 != 0 { 16 } else { 0 };
                let hi2 = if b.qh[l] & u2 != 0 { 16 } else { 0 };
                out[l] = d1 * ((ql[l] & 0xF) + hi1) as f32 - m1;
                out[l + 32] = d2 * ((ql[l] >> 4) + hi2) as f32 - m2;
            }
        }
    });
}
