//! MXFP4 and NVFP4: 4-bit E2M1 values with a power-of-two E8M0 scale per 32 values (MXFP4) or an
//! unsigned E4M3 scale per 16 values (NVFP4, 64-value blocks). ggml ignores the importance matrix
//! for both (`quantize_mxfp4`, `quantize_nvfp4`).

use crate::{Codec, GgmlType};

/// E2M1 values, doubled (`kvalues_mxfp4` = `kvalues_fp4` in `ggml/src/ggml-common.h`).
const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

const QK_MXFP4: usize = 32;
const QK_NVFP4: usize = 64;
const QK_NVFP4_SUB: usize = 16;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockMxfp4 {
    /// E8M0 scale exponent.
    pub e: u8,
    pub qs: [u8; QK_MXFP4 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockMxfp4>() == 17);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockNvfp4 {
    /// UE4M3 scales, one per 16-value sub-block.
    pub d: [u8; QK_NVFP4 / QK_NVFP4_SUB],
    pub qs: [u8; QK_NVFP4 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockNvfp4>() == 36);

pub(crate) const CODECS: &[Codec] = &[
    Codec {
        ty: GgmlType::MXFP4,
        quantize: Some(quantize_mxfp4),
        dequantize: dequantize_mxfp4,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::NVFP4,
        quantize: Some(quantize_nvfp4),
        dequantize: dequantize_nvfp4,
        requires_imatrix: false,
    },
];

/// 2^k as f32 for a k in the normal range.
#[inline]
fn exp2i(k: i32) -> f32 {
    debug_assert!((-126..=127).contains(&k));
    f32::from_bits(((k + 127) as u32) << 23)
}

/// E8M0 → f32 (`ggml_e8m0_to_fp32`): 2^(x-127), with x = 0 as 2^-127.
#[inline]
pub fn e8m0_to_f32(x: u8) -> f32 {
    f32::from_bits(if x == 0 { 0x0040_0000 } else { (x as u32) << 23 })
}

/// Half of E8M0 → f32 (`ggml_e8m0_to_fp32_half`, `GGML_E8M0_TO_FP32_HALF`): 2^(x-128).
#[inline]
pub fn e8m0_to_f32_half(x: u8) -> f32 {
    f32::from_bits(if x < 2 {
        0x0020_0000 << x
    } else {
        ((x - 1) as u32) << 23
    })
}

/// UE4M3 → f32, halved to match the doubled `KVALUES_MXFP4` (`ggml_ue4m3_to_fp32`).
#[inline]
pub fn ue4m3_to_f32(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let exp = ((x >> 3) & 0xf) as i32;
    let man = (x & 7) as f32;
    let raw = if exp == 0 {
        man * exp2i(-9)
    } else {
        (1.0 + man / 8.0) * exp2i(exp - 7)
    };
    raw * 0.5
}

/// f32 → UE4M3, mantissa rounded half up, saturating at 448 (`ggml_fp32_to_ue4m3`).
#[inline]
pub fn f32_to_ue4m3(x: f32) -> u8 {
    // `!(x > 0)` also catches NaN
    if x.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return 0;
    }
    let x = if x > 448.0 { 448.0 } else { x };
    let bits = x.to_bits();
    let fp32_exp = ((bits >> 23) & 0xff) as i32 - 127;
    let fp32_man = ((bits >> 20) & 7) as i32;
    let mut exp = fp32_exp + 7;
    if exp <= 0 {
        // subnormal: man * 2^-9
        let man = ((x * 512.0 + 0.5) as i32).min(7);
        return if man < 1 { 0 } else { man as u8 };
    }
    if exp >= 15 {
        return 0x7e;
    }
    let mut man = fp32_man + ((bits >> 19) & 1) as i32;
    if man > 7 {
        man = 0;
        exp += 1;
        if exp >= 15 {
            return 0x7e;
        }
    }
    ((exp << 3) | man) as u8
}

/// C's `(int)` conversion of a float as x86-64 performs it (`cvttss2si`): truncation toward zero,
/// with NaN and out-of-range values giving `i32::MIN`.
#[inline]
fn cvt_trunc_i32(f: f32) -> i32 {
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&f) {
        // NaN is in no range
        i32::MIN
    } else {
        f as i32
    }
}

/// Index of the E2M1 value nearest to `x` at scale `e`, first one on ties (`best_index_mxfp4`).
#[inline]
fn best_index_mxfp4(x: f32, e: f32) -> u8 {
    let mut best_index = 0;
    let mut best_err = (KVALUES_MXFP4[0] as f32 * e - x).abs();
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (k as f32 * e - x).abs();
        if err < best_err {
            best_index = i;
            best_err = err;
        }
    }
    best_index as u8
}

/// Largest |x|, updated only on strictly greater values (the loop in both FP4 quantizers).
#[inline]
fn abs_max(x: &[f32]) -> f32 {
    let mut amax = 0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
        }
    }
    amax
}

/// E8M0 exponent of a block: `(uint8_t)(floorf(log2f(amax)) - 2 + 127)`, float arithmetic then
/// C's conversion; 0 for an all-zero block.
#[inline]
fn mxfp4_exponent(amax: f32) -> u8 {
    if amax > 0.0 {
        cvt_trunc_i32(amax.log2().floor() - 2.0 + 127.0) as u8
    } else {
        0
    }
}

/// One row of MXFP4 (`quantize_row_mxfp4_ref`; `quantize_mxfp4` ignores the imatrix).
fn quantize_mxfp4_scalar(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockMxfp4] = bytemuck::cast_slice_mut(dst);
    for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK_MXFP4)) {
        let e = mxfp4_exponent(abs_max(x));
        let d = e8m0_to_f32_half(e);
        y.e = e;
        let (lo, hi) = x.split_at(QK_MXFP4 / 2);
        for (q, (&x0, &x1)) in y.qs.iter_mut().zip(lo.iter().zip(hi)) {
            *q = best_index_mxfp4(x0, d) | (best_index_mxfp4(x1, d) << 4);
        }
    }
}

/// One row of NVFP4 (`quantize_row_nvfp4_ref`; `quantize_nvfp4` ignores the imatrix).
fn quantize_nvfp4_scalar(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockNvfp4] = bytemuck::cast_slice_mut(dst);
    for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK_NVFP4)) {
        let subs = x.chunks_exact(QK_NVFP4_SUB);
        let qs = y.qs.chunks_exact_mut(QK_NVFP4_SUB / 2);
        for ((ds, qs), xb) in y.d.iter_mut().zip(qs).zip(subs) {
            // amax / 6 maps the largest E2M1 value (6) onto amax
            let ue = f32_to_ue4m3(abs_max(xb) / 6.0);
            *ds = ue;
            let d = ue4m3_to_f32(ue);
            let (lo, hi) = xb.split_at(QK_NVFP4_SUB / 2);
            for (q, (&x0, &x1)) in qs.iter_mut().zip(lo.iter().zip(hi)) {
                *q = best_index_mxfp4(x0, d) | (best_index_mxfp4(x1, d) << 4);
            }
        }
    }
}

/// `dequantize_row_mxfp4`.
fn dequantize_mxfp4_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockMxfp4] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_MXFP4)) {
        let d = e8m0_to_f32_half(b.e);
        for (j, &q) in b.qs.iter().enumerate() {
            y[j] = KVALUES_MXFP4[(q & 0xf) as usize] as f32 * d;
            y[j + QK_MXFP4 / 2] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
        }
    }
}

/// `dequantize_row_nvfp4`.
fn dequantize_nvfp4_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockNvfp4] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_NVFP4)) {
        let subs =
            b.qs.chunks_exact(QK_NVFP4_SUB / 2)
                .zip(y.chunks_exact_mut(QK_NVFP4_SUB));
        for (&ds, (qs, yb)) in b.d.iter().zip(subs) {
            let d = ue4m3_to_f32(ds);
            for (j, &q) in qs.iter().enumerate() {
                yb[j] = KVALUES_MXFP4[(q & 0xf) as usize] as f32 * d;
                yb[j + QK_NVFP4_SUB / 2] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
            }
        }
    }
}

macro_rules! dispatch {
    (quantize $name:ident, $scalar:ident, $simd:ident) => {
        fn $name(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
            #[cfg(target_arch = "x86_64")]
            if crate::legacy::has_avx2() {
                // SAFETY: AVX2 is available (checked above).
                unsafe { x86::$simd(src, bytemuck::cast_slice_mut(dst)) };
                return;
            }
            $scalar(src, dst, imatrix)
        }
    };
    (dequantize $name:ident, $scalar:ident, $simd:ident) => {
        fn $name(src: &[u8], dst: &mut [f32]) {
            #[cfg(target_arch = "x86_64")]
            if crate::legacy::has_avx2() {
                // SAFETY: AVX2 is available (checked above).
                unsafe { x86::$simd(bytemuck::cast_slice(src), dst) };
                return;
            }
            $scalar(src, dst)
        }
    };
}

dispatch!(quantize quantize_mxfp4, quantize_mxfp4_scalar, quantize_mxfp4);
dispatch!(quantize quantize_nvfp4, quantize_nvfp4_scalar, quantize_nvfp4);
dispatch!(dequantize dequantize_mxfp4, dequantize_mxfp4_scalar, dequantize_mxfp4);
dispatch!(dequantize dequantize_nvfp4, dequantize_nvfp4_scalar, dequantize_nvfp4);

/// AVX2 kernels. The nearest-value search computes the scalar code's errors `|k*d - x|` with the
/// same f32 operations, eight values at a time; every value takes this path (no range conditions).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use crate::legacy::x86::{abs_max, abs_ps, nibbles, pack_bytes};
    use std::arch::x86_64::*;

    /// `k * d` for the eight non-negative E2M1 values k (`KVALUES_MXFP4[0..8]`), broadcast.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn grid(d: f32) -> [__m256; 8] {
        let mut g = [_mm256_setzero_ps(); 8];
        for (g, &k) in g.iter_mut().zip(&KVALUES_MXFP4[..8]) {
            *g = _mm256_set1_ps(k as f32 * d);
        }
        g
    }

    /// `best_index_mxfp4` of eight values. The negative codes 8 + j mirror the positive ones
    /// (`fl(-k*d - x) = -fl(k*d + |x|)` for x < 0), so the search runs over j = 0..8 against |x|:
    /// for x >= 0 a negative code's error is never below its positive twin's (monotone rounding
    /// of |k*d - x| <= k*d + x), and for x < 0 the positive codes j >= 1 never beat code 0's |x|,
    /// while the negative ones have exactly the errors |k_j*d - |x||, in the same order. Code 8
    /// (-0) ties with code 0, which comes first. NaN x keeps code 0, as in the scalar search.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn best_index(x: __m256, g: &[__m256; 8]) -> __m256i {
        let a = abs_ps(x);
        let neg = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_setzero_ps()));
        let mut best = abs_ps(_mm256_sub_ps(g[0], a));
        let mut idx = _mm256_setzero_si256();
        for (j, &kd) in g.iter().enumerate().skip(1) {
            let err = abs_ps(_mm256_sub_ps(kd, a));
            let lt = _mm256_cmp_ps::<_CMP_LT_OQ>(err, best);
            // min_ps(err, best) is `err < best ? err : best`, the scalar update
            best = _mm256_min_ps(err, best);
            idx = _mm256_blendv_epi8(idx, _mm256_set1_epi32(j as i32), _mm256_castps_si256(lt));
        }
        let mirrored = _mm256_and_si256(neg, _mm256_cmpgt_epi32(idx, _mm256_setzero_si256()));
        _mm256_or_si256(idx, _mm256_and_si256(mirrored, _mm256_set1_epi32(8)))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load<const N: usize>(x: &[f32]) -> [__m256; N] {
        assert!(x.len() >= 8 * N);
        let mut v = [_mm256_setzero_ps(); N];
        for (i, v) in v.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(x.as_ptr().add(8 * i));
        }
        v
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_mxfp4(src: &[f32], blocks: &mut [BlockMxfp4]) {
        for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK_MXFP4)) {
            let v = load::<4>(x);
            let e = mxfp4_exponent(abs_max(&v));
            let g = grid(e8m0_to_f32_half(e));
            y.e = e;
            let c = [
                best_index(v[0], &g),
                best_index(v[1], &g),
                best_index(v[2], &g),
                best_index(v[3], &g),
            ];
            nibbles(pack_bytes(&c), &mut y.qs);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_nvfp4(src: &[f32], blocks: &mut [BlockNvfp4]) {
        for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK_NVFP4)) {
            let v = load::<8>(x);
            let mut u = [_mm256_setzero_si256(); 4];
            for (s, (u, ds)) in u.iter_mut().zip(&mut y.d).enumerate() {
                let (lo, hi) = (v[2 * s], v[2 * s + 1]);
                // amax / 6 maps the largest E2M1 value (6) onto amax
                let ue = f32_to_ue4m3(abs_max(&[lo, hi]) / 6.0);
                *ds = ue;
                let g = grid(ue4m3_to_f32(ue));
                // byte j of the sub-block: code of value j | code of value j + 8 << 4
                *u = _mm256_or_si256(best_index(lo, &g), _mm256_slli_epi32::<4>(best_index(hi, &g)));
            }
            _mm256_storeu_si256(y.qs.as_mut_ptr().cast(), pack_bytes(&u));
        }
    }

    /// `KVALUES_MXFP4[c] as f32 * d` for the 16 codes (one per byte) of `codes`, into `y[0..16]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store_e2m1(codes: __m128i, d: f32, y: &mut [f32]) {
        let table = _mm_loadu_si128(KVALUES_MXFP4.as_ptr().cast());
        let k = _mm_shuffle_epi8(table, codes);
        let dv = _mm256_set1_ps(d);
        let y: &mut [f32; 16] = y.try_into().unwrap();
        let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(k));
        let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(k)));
        _mm256_storeu_ps(y.as_mut_ptr(), _mm256_mul_ps(lo, dv));
        _mm256_storeu_ps(y.as_mut_ptr().add(8), _mm256_mul_ps(hi, dv));
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_mxfp4(blocks: &[BlockMxfp4], dst: &mut [f32]) {
        let m = _mm_set1_epi8(0x0f);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_MXFP4)) {
            let d = e8m0_to_f32_half(b.e);
            let q = _mm_loadu_si128(b.qs.as_ptr().cast());
            let (lo, hi) = y.split_at_mut(QK_MXFP4 / 2);
            store_e2m1(_mm_and_si128(q, m), d, lo);
            store_e2m1(_mm_and_si128(_mm_srli_epi16::<4>(q), m), d, hi);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_nvfp4(blocks: &[BlockNvfp4], dst: &mut [f32]) {
        let m = _mm_set1_epi8(0x0f);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_NVFP4)) {
            let q = _mm_loadu_si128(b.qs.as_ptr().cast());
            let q2 = _mm_loadu_si128(b.qs.as_ptr().add(16).cast());
            // sub-block s: bytes 8s..8s+8; its values are the 8 low nibbles then the 8 high ones
            for (s, (&ds, yb)) in b.d.iter().zip(y.chunks_exact_mut(QK_NVFP4_SUB)).enumerate() {
                let bytes = match s {
                    0 => q,
                    1 => _mm_srli_si128::<8>(q),
                    2 => q2,
                    _ => _mm_srli_si128::<8>(q2),
                };
                let codes = _mm_unpacklo_epi64(_mm_and_si128(bytes, m), _mm_and_si128(_mm_srli_epi16::<4>(bytes), m));
                store_e2m1(codes, ue4m3_to_f32(ds), yb);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::test_data::{check_dequantize, check_quantize};

    #[test]
    fn mxfp4_fast_path_matches_scalar() {
        check_quantize(
            "mxfp4",
            QK_MXFP4,
            17,
            QK_MXFP4,
            quantize_mxfp4,
            quantize_mxfp4_scalar,
            true,
        );
        check_dequantize("mxfp4", QK_MXFP4, 17, dequantize_mxfp4, dequantize_mxfp4_scalar);
    }

    #[test]
    fn nvfp4_fast_path_matches_scalar() {
        // distributions drawn per block and per 16-value sub-block
        check_quantize(
            "nvfp4",
            QK_NVFP4,
            36,
            QK_NVFP4,
            quantize_nvfp4,
            quantize_nvfp4_scalar,
            true,
        );
        check_quantize(
            "nvfp4",
            QK_NVFP4,
            36,
            QK_NVFP4_SUB,
            quantize_nvfp4,
            quantize_nvfp4_scalar,
            false,
        );
        check_dequantize("nvfp4", QK_NVFP4, 36, dequantize_nvfp4, dequantize_nvfp4_scalar);
    }

    #[test]
    fn e8m0_helpers() {
        assert_eq!(e8m0_to_f32(127), 1.0);
        assert_eq!(e8m0_to_f32(0), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32_half(127), 0.5);
        assert_eq!(e8m0_to_f32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32_half(0), 2f32.powi(-128));
        for x in 1..=254u8 {
            assert_eq!(e8m0_to_f32_half(x), e8m0_to_f32(x) / 2.0);
        }
    }

    #[test]
    fn ue4m3_round_trip() {
        // every code below the top binade maps back to itself (ggml sends that binade to 0x7e)
        for x in 1..0x78u8 {
            let v = ue4m3_to_f32(x) * 2.0;
            assert_eq!(f32_to_ue4m3(v), x, "{x:#04x}");
        }
        assert_eq!(f32_to_ue4m3(1000.0), 0x7e);
        assert_eq!(f32_to_ue4m3(300.0), 0x7e);
        assert_eq!(f32_to_ue4m3(-1.0), 0);
        assert_eq!(f32_to_ue4m3(f32::NAN), 0);
        assert_eq!(ue4m3_to_f32(0x38), 0.5); // 1.0 halved
    }

    #[test]
    fn mxfp4_exponent_conversion_like_x86() {
        assert_eq!(cvt_trunc_i32(-8.0) as u8, 248);
        assert_eq!(cvt_trunc_i32(f32::INFINITY), i32::MIN);
        assert_eq!(cvt_trunc_i32(2.9), 2);
    }
}
