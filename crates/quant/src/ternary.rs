//! TQ1_0 and TQ2_0: ternary {-1, 0, 1} weights (BitNet b1.58, TriLMs) with one f16 scale per 256
//! values. TQ1_0 packs five trits per byte (base 3, scaled to fill the byte), TQ2_0 four 2-bit
//! codes per byte. ggml ignores the importance matrix for both (`quantize_tq1_0`, `quantize_tq2_0`).

use crate::fp::{get_f16, put_f16, F16Bytes};
use crate::{Codec, GgmlType};

const QK_K: usize = 256;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockTq1_0 {
    /// Five trits per byte.
    pub qs: [u8; (QK_K - 4 * QK_K / 64) / 5],
    /// Four trits per byte.
    pub qh: [u8; QK_K / 64],
    pub d: F16Bytes,
}
const _: () = assert!(std::mem::size_of::<BlockTq1_0>() == 54);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockTq2_0 {
    /// Four 2-bit codes per byte.
    pub qs: [u8; QK_K / 4],
    pub d: F16Bytes,
}
const _: () = assert!(std::mem::size_of::<BlockTq2_0>() == 66);

pub(crate) const CODECS: &[Codec] = &[
    Codec {
        ty: GgmlType::TQ1_0,
        quantize: Some(quantize_tq1_0),
        dequantize: dequantize_tq1_0,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::TQ2_0,
        quantize: Some(quantize_tq2_0),
        dequantize: dequantize_tq2_0,
        requires_imatrix: false,
    },
];

/// Absolute max and its reciprocal (0 for an all-zero block), as both ternary quantizers compute them.
fn scale_of(x: &[f32]) -> (f32, f32) {
    let mut amax = 0f32;
    for &v in x {
        let a = v.abs();
        amax = if amax > a { amax } else { a }; // ggml's MAX(amax, fabsf(v))
    }
    let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
    (amax, id)
}

/// `lroundf(v * id) + 1`: the trit -1, 0, 1 as 0, 1, 2.
#[inline]
fn trit(v: f32, id: f32) -> i32 {
    (v * id).round() as i32 + 1
}

/// Pack trits (most significant first) into one byte: base-3 number scaled by 256/243, rounded up.
#[inline]
fn pack_trits(trits: impl Iterator<Item = i32>) -> u8 {
    let q = trits.fold(0u8, |q, t| q.wrapping_mul(3).wrapping_add(t as u8));
    (q as u32 * 256).div_ceil(243) as u8
}

/// One row of TQ1_0 (`quantize_row_tq1_0_ref`; `quantize_tq1_0` ignores the imatrix).
fn quantize_tq1_0(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockTq1_0] = bytemuck::cast_slice_mut(dst);
    for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK_K)) {
        let (d, id) = scale_of(x);
        y.d = put_f16(d);
        // bytes 0..32: values 0..160, byte m holds x[m + 32n] for n = 0..5
        let (x5a, rest) = x.split_at(5 * 32);
        for m in 0..32 {
            y.qs[m] = pack_trits((0..5).map(|n| trit(x5a[m + n * 32], id)));
        }
        // bytes 32..48: values 160..240, byte m holds x[m + 16n]
        let (x5b, x4) = rest.split_at(5 * 16);
        for m in 0..16 {
            y.qs[32 + m] = pack_trits((0..5).map(|n| trit(x5b[m + n * 16], id)));
        }
        // qh: values 240..256, four trits per byte, shifted up by one trit
        for j in 0..4 {
            let trits = (0..4).map(|m| trit(x4[j + m * 4], id)).chain(std::iter::once(0));
            y.qh[j] = pack_trits(trits);
        }
    }
}

/// One row of TQ2_0 (`quantize_row_tq2_0_ref`; `quantize_tq2_0` ignores the imatrix).
fn quantize_tq2_0(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockTq2_0] = bytemuck::cast_slice_mut(dst);
    for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK_K)) {
        let (d, id) = scale_of(x);
        y.d = put_f16(d);
        for (qs, xc) in y.qs.chunks_exact_mut(32).zip(x.chunks_exact(4 * 32)) {
            for (m, q) in qs.iter_mut().enumerate() {
                *q = (0..4).fold(0u8, |acc, n| {
                    let xi = trit(xc[m + n * 32], id);
                    acc.wrapping_add(((xi & 3) << (2 * n)) as u8)
                });
            }
        }
    }
}

/// The trit stored at position `n` (0 = most significant) of a packed byte.
#[inline]
fn unpack_trit(q: u8, n: usize) -> i16 {
    const POW3: [u8; 6] = [1, 3, 9, 27, 81, 243];
    let q = q.wrapping_mul(POW3[n]);
    ((q as u16 * 3) >> 8) as i16
}

/// `dequantize_row_tq1_0`.
fn dequantize_tq1_0(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::dequantize_tq1_0_avx2(src, dst) };
    }
    dequantize_tq1_0_scalar(src, dst)
}

/// The scalar reference for [`dequantize_tq1_0`].
fn dequantize_tq1_0_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockTq1_0] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = get_f16(b.d);
        let mut out = y.iter_mut();
        let mut put = |t: i16| *out.next().unwrap() = (t - 1) as f32 * d;
        for group in [&b.qs[..32], &b.qs[32..]] {
            for n in 0..5 {
                for &q in group {
                    put(unpack_trit(q, n));
                }
            }
        }
        for n in 0..4 {
            for &q in &b.qh {
                put(unpack_trit(q, n));
            }
        }
    }
}

/// `dequantize_row_tq2_0`.
fn dequantize_tq2_0(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::dequantize_tq2_0_avx2(src, dst) };
    }
    dequantize_tq2_0_scalar(src, dst)
}

/// The scalar reference for [`dequantize_tq2_0`].
fn dequantize_tq2_0_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockTq2_0] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = get_f16(b.d);
        for (qs, yc) in b.qs.chunks_exact(32).zip(y.chunks_exact_mut(4 * 32)) {
            for l in 0..4 {
                for (m, &q) in qs.iter().enumerate() {
                    let c = ((q >> (2 * l)) & 3) as i8;
                    yc[l * 32 + m] = (c - 1) as f32 * d;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! AVX2 dequantization: the trit / 2-bit code of 8 bytes at a time in i32 lanes, then
    //! `(t - 1) as f32 * d` as in the scalar code.
    use super::*;
    use std::arch::x86_64::*;

    /// 8 bytes from `q` as i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(q: &[u8]) -> __m256i {
        assert!(q.len() >= 8);
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.as_ptr() as *const __m128i))
    }

    /// `y[0..8] = (t - 1) as f32 * d` for i32 lanes `t`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn put8(y: &mut [f32], t: __m256i, d: __m256) {
        assert!(y.len() >= 8);
        let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(t, _mm256_set1_epi32(1)));
        _mm256_storeu_ps(y.as_mut_ptr(), _mm256_mul_ps(v, d));
    }

    /// [`unpack_trit`] of 8 bytes: `((q * 3^n mod 256) * 3) >> 8`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn trits8(q: __m256i, pow3: __m256i) -> __m256i {
        let m = _mm256_and_si256(_mm256_mullo_epi32(q, pow3), _mm256_set1_epi32(0xff));
        _mm256_srli_epi32::<8>(_mm256_add_epi32(m, _mm256_add_epi32(m, m)))
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_tq1_0_avx2(src: &[u8], dst: &mut [f32]) {
        const POW3: [i32; 5] = [1, 3, 9, 27, 81];
        let blocks: &[BlockTq1_0] = bytemuck::cast_slice(src);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
            let d = _mm256_set1_ps(get_f16(b.d));
            let mut o = 0;
            for group in [&b.qs[..32], &b.qs[32..]] {
                for p in POW3 {
                    let pw = _mm256_set1_epi32(p);
                    for c in group.chunks_exact(8) {
                        put8(&mut y[o..o + 8], trits8(load8(c), pw), d);
                        o += 8;
                    }
                }
            }
            // qh: 4 bytes, trits n = 0..3 of each, in the order n-major
            let qh = _mm256_setr_epi32(
                b.qh[0] as i32,
                b.qh[1] as i32,
                b.qh[2] as i32,
                b.qh[3] as i32,
                b.qh[0] as i32,
                b.qh[1] as i32,
                b.qh[2] as i32,
                b.qh[3] as i32,
            );
            put8(
                &mut y[o..o + 8],
                trits8(qh, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3)),
                d,
            );
            put8(
                &mut y[o + 8..o + 16],
                trits8(qh, _mm256_setr_epi32(9, 9, 9, 9, 27, 27, 27, 27)),
                d,
            );
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_tq2_0_avx2(src: &[u8], dst: &mut [f32]) {
        let blocks: &[BlockTq2_0] = bytemuck::cast_slice(src);
        let three = _mm256_set1_epi32(3);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
            let d = _mm256_set1_ps(get_f16(b.d));
            for (qs, yc) in b.qs.chunks_exact(32).zip(y.chunks_exact_mut(4 * 32)) {
                for (k, c) in qs.chunks_exact(8).enumerate() {
                    let q = load8(c);
                    for l in 0..4 {
                        let t = _mm256_and_si256(_mm256_srlv_epi32(q, _mm256_set1_epi32(2 * l as i32)), three);
                        put8(&mut yc[l * 32 + 8 * k..l * 32 + 8 * k + 8], t, d);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_dequantize_matches_scalar() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut state = 0x1234_5678_9abc_def0u64;
        let bytes: Vec<u8> = (0..54 * 66 * 64)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let n = bytes.len() / 54 * QK_K;
        let (mut a, mut b) = (vec![0f32; n], vec![1f32; n]);
        dequantize_tq1_0_scalar(&bytes, &mut a);
        unsafe { x86::dequantize_tq1_0_avx2(&bytes, &mut b) };
        assert!(bits(&a) == bits(&b), "TQ1_0");
        let n = bytes.len() / 66 * QK_K;
        let (mut a, mut b) = (vec![0f32; n], vec![1f32; n]);
        dequantize_tq2_0_scalar(&bytes, &mut a);
        unsafe { x86::dequantize_tq2_0_avx2(&bytes, &mut b) };
        assert!(bits(&a) == bits(&b), "TQ2_0");
    }

    #[test]
    fn ternary_values_round_trip() {
        let src: Vec<f32> = (0..QK_K).map(|i| [-2.0, 0.0, 2.0][i * 7 % 3]).collect();
        for (q, dq, bytes) in [
            (
                quantize_tq1_0 as crate::QuantizeRow,
                dequantize_tq1_0 as crate::DequantizeRow,
                54,
            ),
            (quantize_tq2_0, dequantize_tq2_0, 66),
        ] {
            let mut buf = vec![0u8; bytes];
            q(&src, &mut buf, None);
            let mut y = vec![0f32; QK_K];
            dq(&buf, &mut y);
            assert_eq!(y, src);
        }
    }
}
