//! Q1_0 and Q2_0: sign bits with a mean-|x| f16 scale per 128 values (Q1_0), and 2-bit codes
//! {-1, 0, 1, 2}·d with an absolute-max f16 scale per 64 values (Q2_0). `quantize_q1_0` and
//! `quantize_q2_0` take an importance matrix but quantize the same way with or without it.

use crate::fp::{get_f16, put_f16, F16Bytes};
use crate::{Codec, GgmlType};

const QK1_0: usize = 128;
const QK2_0: usize = 64;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ1_0 {
    pub d: F16Bytes,
    /// One sign bit per value, LSB first: 1 for x >= 0.
    pub qs: [u8; QK1_0 / 8],
}
const _: () = assert!(std::mem::size_of::<BlockQ1_0>() == 18);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ2_0 {
    pub d: F16Bytes,
    /// Four 2-bit codes per byte, low bits first; code c stands for (c - 1)·d.
    pub qs: [u8; QK2_0 / 4],
}
const _: () = assert!(std::mem::size_of::<BlockQ2_0>() == 18);

pub(crate) const CODECS: &[Codec] = &[
    Codec {
        ty: GgmlType::Q1_0,
        quantize: Some(quantize_q1_0),
        dequantize: dequantize_q1_0,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::Q2_0,
        quantize: Some(quantize_q2_0),
        dequantize: dequantize_q2_0,
        requires_imatrix: false,
    },
];

/// One row of Q1_0 (`quantize_row_q1_0_ref`, which `quantize_q1_0` calls with or without imatrix).
fn quantize_q1_0(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockQ1_0] = bytemuck::cast_slice_mut(dst);
    for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK1_0)) {
        let mut sum_abs = 0f32;
        for &v in x {
            sum_abs += v.abs();
        }
        y.d = put_f16(sum_abs / QK1_0 as f32);
        for (q, xc) in y.qs.iter_mut().zip(x.chunks_exact(8)) {
            *q = xc
                .iter()
                .enumerate()
                .fold(0u8, |q, (bit, &v)| if v >= 0.0 { q | (1 << bit) } else { q });
        }
    }
}

/// One row of Q2_0 (`quantize_row_q2_0_ref`, which `quantize_q2_0` calls with or without imatrix).
fn quantize_q2_0_scalar(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockQ2_0] = bytemuck::cast_slice_mut(dst);
    for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK2_0)) {
        q2_0_ref(x, y);
    }
}

/// One block of `quantize_row_q2_0_ref`.
fn q2_0_ref(x: &[f32], y: &mut BlockQ2_0) {
    let mut amax = 0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
        }
    }
    let d = amax;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    y.d = put_f16(d);
    for (q, xc) in y.qs.iter_mut().zip(x.chunks_exact(4)) {
        *q = xc.iter().enumerate().fold(0u8, |q, (k, &w)| {
            // (int)roundf(w*id) + 1, clamped to the codes 0..=3. The addition wraps, as it always
            // did in release builds (it overflows only for an infinite w*id, i.e. a subnormal
            // or infinite amax), so that debug builds do not panic on such blocks.
            let c = ((w * id).round() as i32).wrapping_add(1).clamp(0, 3);
            q | ((c as u8) << (2 * k))
        });
    }
}

/// `dequantize_row_q1_0`.
fn dequantize_q1_0_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ1_0] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK1_0)) {
        let d = get_f16(b.d);
        let neg_d = -d;
        for (&q, yc) in b.qs.iter().zip(y.chunks_exact_mut(8)) {
            for (bit, v) in yc.iter_mut().enumerate() {
                *v = if (q >> bit) & 1 != 0 { d } else { neg_d };
            }
        }
    }
}

/// `dequantize_row_q2_0`.
fn dequantize_q2_0_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ2_0] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK2_0)) {
        let d = get_f16(b.d);
        for (&q, yc) in b.qs.iter().zip(y.chunks_exact_mut(4)) {
            for (k, v) in yc.iter_mut().enumerate() {
                let c = ((q >> (2 * k)) & 3) as i32;
                *v = (c - 1) as f32 * d;
            }
        }
    }
}

fn quantize_q2_0(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    if crate::legacy::has_avx2() {
        // SAFETY: AVX2 is available (checked above).
        unsafe { x86::quantize_q2_0(src, bytemuck::cast_slice_mut(dst)) };
        return;
    }
    quantize_q2_0_scalar(src, dst, imatrix)
}

fn dequantize_q1_0(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::legacy::has_avx2() {
        // SAFETY: AVX2 is available (checked above).
        unsafe { x86::dequantize_q1_0(bytemuck::cast_slice(src), dst) };
        return;
    }
    dequantize_q1_0_scalar(src, dst)
}

fn dequantize_q2_0(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::legacy::has_avx2() {
        // SAFETY: AVX2 is available (checked above).
        unsafe { x86::dequantize_q2_0(bytemuck::cast_slice(src), dst) };
        return;
    }
    dequantize_q2_0_scalar(src, dst)
}

/// AVX2 kernels, same f32 operations per value as the scalar code (see `legacy::x86`).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use crate::legacy::x86::{abs_max, pack_bytes, SAFE_MIN};
    use std::arch::x86_64::*;

    /// `(int)roundf(v)` (half away from zero) for |v| < 2^23, NaN lanes as 0 (Rust's `as`).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn round_away(v: __m256) -> __m256i {
        let v = _mm256_and_ps(v, _mm256_cmp_ps::<_CMP_ORD_Q>(v, v));
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
        // v - trunc(v) is exact; a fraction of at least one half steps away from zero
        let frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0), _mm256_sub_ps(v, t));
        let up = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
        let one = _mm256_or_ps(_mm256_set1_ps(1.0), _mm256_and_ps(v, _mm256_set1_ps(-0.0)));
        _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(up, one)))
    }

    /// Four 2-bit codes (bytes 0..=3) per dword → one byte per dword (`b0 | b1<<2 | b2<<4 | b3<<6`).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn pack2(b: __m256i) -> __m256i {
        let w = _mm256_maddubs_epi16(b, _mm256_set1_epi32(0x4010_0401));
        _mm256_madd_epi16(w, _mm256_set1_epi16(1))
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_q2_0(src: &[f32], blocks: &mut [BlockQ2_0]) {
        for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK2_0)) {
            let x: &[f32; QK2_0] = x.try_into().unwrap();
            let mut v = [_mm256_setzero_ps(); 8];
            for (i, v) in v.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(x.as_ptr().add(8 * i));
            }
            let amax = abs_max(&v);
            // Outside this range (zero, subnormal or infinite amax) `w * id` may be infinite or
            // NaN for finite w and the scalar code's saturating casts matter: scalar path.
            if !(SAFE_MIN..=f32::MAX).contains(&amax) {
                q2_0_ref(x, y);
                continue;
            }
            let d = amax;
            let id = _mm256_set1_ps(1.0 / d);
            y.d = put_f16(d);
            let (zero, three, one) = (_mm256_setzero_si256(), _mm256_set1_epi32(3), _mm256_set1_epi32(1));
            let mut c = [zero; 8];
            for (c, &v) in c.iter_mut().zip(&v) {
                let q = _mm256_add_epi32(round_away(_mm256_mul_ps(v, id)), one);
                *c = _mm256_max_epi32(_mm256_min_epi32(q, three), zero);
            }
            let e0 = pack2(pack_bytes(&[c[0], c[1], c[2], c[3]]));
            let e1 = pack2(pack_bytes(&[c[4], c[5], c[6], c[7]]));
            // dwords e0[0..8], e1[0..8] → 16 bytes in order
            let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(e0, e1));
            let q = _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p));
            _mm_storeu_si128(y.qs.as_mut_ptr().cast(), q);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_q1_0(blocks: &[BlockQ1_0], dst: &mut [f32]) {
        let bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK1_0)) {
            let d = get_f16(b.d);
            let (dv, nv) = (_mm256_set1_ps(d), _mm256_set1_ps(-d));
            for (&q, yc) in b.qs.iter().zip(y.chunks_exact_mut(8)) {
                let set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(q as i32), bit), bit);
                _mm256_storeu_ps(yc.as_mut_ptr(), _mm256_blendv_ps(nv, dv, _mm256_castsi256_ps(set)));
            }
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_q2_0(blocks: &[BlockQ2_0], dst: &mut [f32]) {
        let shifts = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK2_0)) {
            let dv = _mm256_set1_ps(get_f16(b.d));
            for (q, yc) in b.qs.chunks_exact(2).zip(y.chunks_exact_mut(8)) {
                let bytes = _mm256_setr_epi32(
                    q[0] as i32,
                    q[0] as i32,
                    q[0] as i32,
                    q[0] as i32,
                    q[1] as i32,
                    q[1] as i32,
                    q[1] as i32,
                    q[1] as i32,
                );
                let c = _mm256_and_si256(_mm256_srlv_epi32(bytes, shifts), _mm256_set1_epi32(3));
                let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(c, _mm256_set1_epi32(1)));
                _mm256_storeu_ps(yc.as_mut_ptr(), _mm256_mul_ps(v, dv));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::test_data::{check_dequantize, check_quantize};

    #[test]
    fn q2_0_fast_path_matches_scalar() {
        check_quantize("q2_0", QK2_0, 18, QK2_0 / 2, quantize_q2_0, quantize_q2_0_scalar, true);
        check_dequantize("q2_0", QK2_0, 18, dequantize_q2_0, dequantize_q2_0_scalar);
    }

    #[test]
    fn q1_0_fast_dequantize_matches_scalar() {
        check_dequantize("q1_0", QK1_0, 18, dequantize_q1_0, dequantize_q1_0_scalar);
    }

    #[test]
    fn q2_0_codes_round_trip() {
        let src: Vec<f32> = (0..QK2_0).map(|i| [-1.0, 0.0, 1.0][i % 3] * 0.5).collect();
        let mut q = [0u8; 18];
        quantize_q2_0(&src, &mut q, None);
        let mut y = [0f32; QK2_0];
        dequantize_q2_0(&q, &mut y);
        assert_eq!(&y[..], &src[..]);
    }

    #[test]
    fn q1_0_signs_and_mean_scale() {
        let src: Vec<f32> = (0..QK1_0).map(|i| if i % 3 == 0 { -2.0 } else { 2.0 }).collect();
        let mut q = [0u8; 18];
        quantize_q1_0(&src, &mut q, None);
        let mut y = [0f32; QK1_0];
        dequantize_q1_0(&q, &mut y);
        assert_eq!(&y[..], &src[..]);
    }
}
