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

/// One row of MXFP4 (`quantize_row_mxfp4_ref`; `quantize_mxfp4` ignores the imatrix).
fn quantize_mxfp4(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockMxfp4] = bytemuck::cast_slice_mut(dst);
    for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK_MXFP4)) {
        let amax = abs_max(x);
        // (uint8_t)(floorf(log2f(amax)) - 2 + 127): float arithmetic, then C's conversion
        let e = if amax > 0.0 {
            cvt_trunc_i32(amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = e8m0_to_f32_half(e);
        y.e = e;
        let (lo, hi) = x.split_at(QK_MXFP4 / 2);
        for (q, (&x0, &x1)) in y.qs.iter_mut().zip(lo.iter().zip(hi)) {
            *q = best_index_mxfp4(x0, d) | (best_index_mxfp4(x1, d) << 4);
        }
    }
}

/// One row of NVFP4 (`quantize_row_nvfp4_ref`; `quantize_nvfp4` ignores the imatrix).
fn quantize_nvfp4(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
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
fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) {
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
fn dequantize_nvfp4(src: &[u8], dst: &mut [f32]) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
