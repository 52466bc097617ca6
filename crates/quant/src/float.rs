//! Plain float types: F32 (copy), F16 and BF16 (round to nearest even, as
//! `ggml_fp32_to_fp16_row` and `ggml_fp32_to_bf16_row_ref` in `ggml/src/ggml.c`).

use crate::fp::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::Codec;
use gguf::GgmlType;

fn quantize_f32(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    dst.copy_from_slice(bytemuck::cast_slice(src));
}

#[cfg_attr(all(target_endian = "little", not(test)), allow(dead_code))]
fn dequantize_f32_scalar(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes(s.try_into().expect("4 bytes"));
    }
}

fn quantize_f16(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    for (d, &s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f32_to_f16(s).to_le_bytes());
    }
}

fn dequantize_f16_scalar(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

fn quantize_bf16_scalar(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    for (d, &s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f32_to_bf16(s).to_le_bytes());
    }
}

fn dequantize_bf16_scalar(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    // On a little-endian target the bytes are the floats: a copy (dst is aligned, src need not be).
    #[cfg(target_endian = "little")]
    bytemuck::cast_slice_mut::<f32, u8>(dst).copy_from_slice(src);
    #[cfg(not(target_endian = "little"))]
    dequantize_f32_scalar(src, dst);
}

fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::legacy::has_avx2() {
        // SAFETY: AVX2 is available (checked above).
        unsafe { x86::dequantize_f16(src, dst) };
        return;
    }
    dequantize_f16_scalar(src, dst)
}

fn quantize_bf16(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    if crate::legacy::has_avx2() {
        // SAFETY: AVX2 is available (checked above).
        unsafe { x86::quantize_bf16(src, dst) };
        return;
    }
    quantize_bf16_scalar(src, dst, imatrix)
}

fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::legacy::has_avx2() {
        // SAFETY: AVX2 is available (checked above).
        unsafe { x86::dequantize_bf16(src, dst) };
        return;
    }
    dequantize_bf16_scalar(src, dst)
}

/// AVX2 kernels: the scalar conversions' integer arithmetic, eight values at a time; tails of
/// fewer than 16 values go through the scalar functions.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::fp::{bf16_to_f32, f16_to_f32, f32_to_bf16};
    use std::arch::x86_64::*;

    /// `f32_to_bf16` of the eight floats whose bits are `u`, as eight u32 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn bf16_bits(u: __m256i) -> __m256i {
        let abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fff_ffff));
        let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f80_0000));
        let hi = _mm256_srli_epi32::<16>(u);
        let bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
        let rne = _mm256_srli_epi32::<16>(_mm256_add_epi32(u, bias));
        let quiet = _mm256_or_si256(hi, _mm256_set1_epi32(64));
        _mm256_blendv_epi8(rne, quiet, nan)
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
        let mut d = dst.chunks_exact_mut(32);
        let mut s = src.chunks_exact(16);
        for (d, s) in (&mut d).zip(&mut s) {
            let u0 = _mm256_loadu_si256(s.as_ptr().cast());
            let u1 = _mm256_loadu_si256(s.as_ptr().add(8).cast());
            // lanes ≤ 0xffff, so the signed→u16 saturating pack keeps them; it interleaves the
            // 128-bit halves, which the permute puts back in order
            let p = _mm256_packus_epi32(bf16_bits(u0), bf16_bits(u1));
            let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(p);
            _mm256_storeu_si256(d.as_mut_ptr().cast(), p);
        }
        for (d, &s) in d.into_remainder().chunks_exact_mut(2).zip(s.remainder()) {
            d.copy_from_slice(&f32_to_bf16(s).to_le_bytes());
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
        let mut d = dst.chunks_exact_mut(8);
        let mut s = src.chunks_exact(16);
        for (d, s) in (&mut d).zip(&mut s) {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(s.as_ptr().cast()));
            _mm256_storeu_si256(d.as_mut_ptr().cast(), _mm256_slli_epi32::<16>(h));
        }
        for (d, s) in d.into_remainder().iter_mut().zip(s.remainder().chunks_exact(2)) {
            *d = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
        }
    }

    /// `f16_to_f32` of eight u32 lanes holding f16 bits: normal values rebias the exponent,
    /// inf/NaN keep their payload, subnormals are `mant * 2^-24` (exact), the sign is or'ed in.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn f16_bits_to_f32(h: __m256i) -> __m256 {
        let sign = _mm256_slli_epi32::<16>(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)));
        let em = _mm256_and_si256(h, _mm256_set1_epi32(0x7fff));
        let shifted = _mm256_slli_epi32::<13>(em);
        let normal = _mm256_add_epi32(shifted, _mm256_set1_epi32(112 << 23));
        let infnan = _mm256_or_si256(shifted, _mm256_set1_epi32(0x7f80_0000));
        let sub = _mm256_castps_si256(_mm256_mul_ps(
            _mm256_cvtepi32_ps(em),
            _mm256_set1_ps(f32::from_bits(0x3380_0000)),
        ));
        let is_infnan = _mm256_cmpgt_epi32(em, _mm256_set1_epi32(0x7bff));
        let is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x400), em);
        let r = _mm256_blendv_epi8(normal, infnan, is_infnan);
        let r = _mm256_blendv_epi8(r, sub, is_sub);
        _mm256_castsi256_ps(_mm256_or_si256(r, sign))
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
        let mut d = dst.chunks_exact_mut(8);
        let mut s = src.chunks_exact(16);
        for (d, s) in (&mut d).zip(&mut s) {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(s.as_ptr().cast()));
            _mm256_storeu_ps(d.as_mut_ptr(), f16_bits_to_f32(h));
        }
        for (d, s) in d.into_remainder().iter_mut().zip(s.remainder().chunks_exact(2)) {
            *d = f16_to_f32(u16::from_le_bytes([s[0], s[1]]));
        }
    }
}

pub(crate) const CODECS: &[Codec] = &[
    Codec {
        ty: GgmlType::F32,
        quantize: Some(quantize_f32),
        dequantize: dequantize_f32,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::F16,
        quantize: Some(quantize_f16),
        dequantize: dequantize_f16,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::BF16,
        quantize: Some(quantize_bf16),
        dequantize: dequantize_bf16,
        requires_imatrix: false,
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::test_data::{check_dequantize, check_quantize, mixed_rows};

    #[test]
    fn bf16_fast_path_matches_scalar() {
        check_quantize("bf16", 1, 2, 1, quantize_bf16, quantize_bf16_scalar, true);
        // every rounding case: all 2^16 low halves under a few high halves, plus a ragged tail
        let mut src: Vec<f32> = (0..1u32 << 16)
            .flat_map(|lo| [0x3f80u32, 0x7f80, 0xff80, 0x0000, 0x7fff, 0x8001].map(|hi| f32::from_bits(hi << 16 | lo)))
            .collect();
        src.extend(mixed_rows(1, 1000 + 7, 16, 3));
        let (mut a, mut b) = (vec![0u8; src.len() * 2], vec![0u8; src.len() * 2]);
        quantize_bf16(&src, &mut a, None);
        quantize_bf16_scalar(&src, &mut b, None);
        assert!(a == b);
        check_dequantize("bf16", 1, 2, dequantize_bf16, dequantize_bf16_scalar);
    }

    #[test]
    fn f16_and_f32_fast_dequantize_match_scalar() {
        // every f16 value, then random bytes with a ragged tail
        let all: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
        let (mut a, mut b) = (vec![0f32; 1 << 16], vec![0f32; 1 << 16]);
        dequantize_f16(&all, &mut a);
        dequantize_f16_scalar(&all, &mut b);
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
        check_dequantize("f16", 1, 2, dequantize_f16, dequantize_f16_scalar);
        check_dequantize("f32", 1, 4, dequantize_f32, dequantize_f32_scalar);
        let (mut a, mut b) = (vec![0f32; 13], vec![0f32; 13]);
        dequantize_f16(&all[..26], &mut a);
        dequantize_f16_scalar(&all[..26], &mut b);
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
