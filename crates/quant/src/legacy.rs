//! The original block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (weights) and Q8_1 (activations),
//! blocks of 32 values (`ggml/src/ggml-quants.c`, `ggml/src/ggml-common.h`).
//!
//! Without an importance matrix each block is quantized by the `quantize_row_*_ref` functions;
//! with one, Q4_0/Q5_0 search the scale with `make_qx_quants` and Q4_1/Q5_1 with
//! `make_qkx3_quants`, weighting each value by `imatrix[j] * sqrt(sigma2 + x[j]^2)`
//! (`quantize_row_q4_0_impl` etc.). Q8_0 ignores the importance matrix, as ggml does.

use crate::fp::{get_f16, put_f16, F16Bytes};
use crate::k_quants::helpers::{make_qkx3_quants, make_qx_quants};
use crate::Codec;
use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;

pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: F16Bytes,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4_1 {
    pub d: F16Bytes,
    pub m: F16Bytes,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ5_0 {
    pub d: F16Bytes,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ5_1 {
    pub d: F16Bytes,
    pub m: F16Bytes,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: F16Bytes,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ8_1 {
    pub d: F16Bytes,
    /// d * sum(qs)
    pub s: F16Bytes,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

/// The value of largest magnitude (first one wins ties), as the `_ref` quantizers pick it.
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `sum(x^2) / n` over the row, the variance term of the legacy imatrix weights.
fn row_sigma2(x: &[f32]) -> f32 {
    let mut sum_x2 = 0.0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    sum_x2 / x.len() as f32
}

/// Per-value weights of one block: `qw[j] * sqrt(sigma2 + x[j]^2)`.
fn block_weights(xb: &[f32], qw: &[f32], sigma2: f32) -> [f32; QK] {
    let mut w = [0f32; QK];
    for j in 0..QK {
        w[j] = qw[j] * (sigma2 + xb[j] * xb[j]).sqrt();
    }
    w
}

/// Pack 5-bit values: low nibbles into `qs`, fifth bits into the 32-bit `qh`.
fn pack5(l: &[u8; QK], qs: &mut [u8; QK / 2], qh: &mut [u8; 4]) {
    let mut h = 0u32;
    for j in 0..QK / 2 {
        let (x0, x1) = (l[j], l[j + QK / 2]);
        qs[j] = (x0 & 0x0f) | ((x1 & 0x0f) << 4);
        h |= (((x0 & 0x10) as u32) >> 4) << j;
        h |= (((x1 & 0x10) as u32) >> 4) << (j + QK / 2);
    }
    *qh = h.to_le_bytes();
}

// ggml-quants.c: quantize_row_q4_0_ref
fn q4_0_ref(x: &[f32], y: &mut BlockQ4_0) {
    let d = signed_absmax(x) / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y.d = put_f16(d);
    for j in 0..QK / 2 {
        let x0 = x[j] * id;
        let x1 = x[j + QK / 2] * id;
        // (int8_t) truncates toward zero; the float→int cast saturates like x86's cvttss2si would
        // not, but |x*id| <= 8 here so both agree.
        let xi0 = ((x0 + 8.5) as i8).min(15) as u8;
        let xi1 = ((x1 + 8.5) as i8).min(15) as u8;
        y.qs[j] = xi0 | (xi1 << 4);
    }
}

// ggml-quants.c: quantize_row_q4_0_impl (with importance weights)
fn quantize_q4_0_scalar(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockQ4_0] = bytemuck::cast_slice_mut(dst);
    match imatrix {
        None => {
            for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
                q4_0_ref(x, y);
            }
        }
        Some(qw) => q4_0_imatrix(src, blocks, qw, block_weights),
    }
}

fn q4_0_imatrix(src: &[f32], blocks: &mut [BlockQ4_0], qw: &[f32], weights: impl Fn(&[f32], &[f32], f32) -> [f32; QK]) {
    let sigma2 = row_sigma2(src);
    let mut l = [0i8; QK];
    for ((y, xb), qw) in blocks.iter_mut().zip(src.chunks_exact(QK)).zip(qw.chunks_exact(QK)) {
        let w = weights(xb, qw, sigma2);
        let d = make_qx_quants(8, xb, &mut l, 1, Some(&w));
        y.d = put_f16(d);
        for j in 0..QK / 2 {
            y.qs[j] = (l[j] as u8) | ((l[j + QK / 2] as u8) << 4);
        }
    }
}

fn dequantize_q4_0_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ4_0] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = get_f16(b.d);
        for j in 0..QK / 2 {
            y[j] = ((b.qs[j] & 0x0f) as i32 - 8) as f32 * d;
            y[j + QK / 2] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

// ggml-quants.c: quantize_row_q4_1_ref
fn q4_1_ref(x: &[f32], y: &mut BlockQ4_1) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y.d = put_f16(d);
    y.m = put_f16(min);
    for j in 0..QK / 2 {
        let x0 = (x[j] - min) * id;
        let x1 = (x[j + QK / 2] - min) * id;
        let xi0 = ((x0 + 0.5) as i8).min(15) as u8;
        let xi1 = ((x1 + 0.5) as i8).min(15) as u8;
        y.qs[j] = xi0 | (xi1 << 4);
    }
}

// ggml-quants.c: quantize_row_q4_1_impl
fn quantize_q4_1_scalar(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockQ4_1] = bytemuck::cast_slice_mut(dst);
    match imatrix {
        None => {
            for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
                q4_1_ref(x, y);
            }
        }
        Some(qw) => q4_1_imatrix(src, blocks, qw, block_weights),
    }
}

fn q4_1_imatrix(src: &[f32], blocks: &mut [BlockQ4_1], qw: &[f32], weights: impl Fn(&[f32], &[f32], f32) -> [f32; QK]) {
    let sigma2 = row_sigma2(src);
    let mut l = [0u8; QK];
    for ((y, xb), qw) in blocks.iter_mut().zip(src.chunks_exact(QK)).zip(qw.chunks_exact(QK)) {
        let w = weights(xb, qw, sigma2);
        let (d, min) = make_qkx3_quants(15, xb, Some(&w), &mut l, -0.9, 0.05, 36, false);
        y.d = put_f16(d);
        y.m = put_f16(-min);
        for j in 0..QK / 2 {
            y.qs[j] = l[j] | (l[j + QK / 2] << 4);
        }
    }
}

fn dequantize_q4_1_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ4_1] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (get_f16(b.d), get_f16(b.m));
        for j in 0..QK / 2 {
            y[j] = (b.qs[j] & 0x0f) as f32 * d + m;
            y[j + QK / 2] = (b.qs[j] >> 4) as f32 * d + m;
        }
    }
}

// ggml-quants.c: quantize_row_q5_0_ref
fn q5_0_ref(x: &[f32], y: &mut BlockQ5_0) {
    let d = signed_absmax(x) / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y.d = put_f16(d);
    let mut l = [0u8; QK];
    for j in 0..QK {
        l[j] = ((x[j] * id + 16.5) as i8).min(31) as u8;
    }
    pack5(&l, &mut y.qs, &mut y.qh);
}

// ggml-quants.c: quantize_row_q5_0_impl
fn quantize_q5_0_scalar(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockQ5_0] = bytemuck::cast_slice_mut(dst);
    match imatrix {
        None => {
            for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
                q5_0_ref(x, y);
            }
        }
        Some(qw) => q5_0_imatrix(src, blocks, qw, block_weights),
    }
}

fn q5_0_imatrix(src: &[f32], blocks: &mut [BlockQ5_0], qw: &[f32], weights: impl Fn(&[f32], &[f32], f32) -> [f32; QK]) {
    let sigma2 = row_sigma2(src);
    let mut l = [0i8; QK];
    for ((y, xb), qw) in blocks.iter_mut().zip(src.chunks_exact(QK)).zip(qw.chunks_exact(QK)) {
        let w = weights(xb, qw, sigma2);
        let d = make_qx_quants(16, xb, &mut l, 1, Some(&w));
        y.d = put_f16(d);
        pack5(&l.map(|v| v as u8), &mut y.qs, &mut y.qh);
    }
}

fn dequantize_q5_0_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ5_0] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = get_f16(b.d);
        let qh = u32::from_le_bytes(b.qh);
        for j in 0..QK / 2 {
            let xh0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
            y[j] = (((b.qs[j] & 0x0f) | xh0) as i32 - 16) as f32 * d;
            y[j + QK / 2] = (((b.qs[j] >> 4) | xh1) as i32 - 16) as f32 * d;
        }
    }
}

// ggml-quants.c: quantize_row_q5_1_ref
fn q5_1_ref(x: &[f32], y: &mut BlockQ5_1) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y.d = put_f16(d);
    y.m = put_f16(min);
    let mut l = [0u8; QK];
    for j in 0..QK {
        // (uint8_t) of a float in [0, 31.5]
        l[j] = ((x[j] - min) * id + 0.5) as u8;
    }
    pack5(&l, &mut y.qs, &mut y.qh);
}

// ggml-quants.c: quantize_row_q5_1_impl
fn quantize_q5_1_scalar(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockQ5_1] = bytemuck::cast_slice_mut(dst);
    match imatrix {
        None => {
            for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
                q5_1_ref(x, y);
            }
        }
        Some(qw) => q5_1_imatrix(src, blocks, qw, block_weights),
    }
}

fn q5_1_imatrix(src: &[f32], blocks: &mut [BlockQ5_1], qw: &[f32], weights: impl Fn(&[f32], &[f32], f32) -> [f32; QK]) {
    let sigma2 = row_sigma2(src);
    let mut l = [0u8; QK];
    for ((y, xb), qw) in blocks.iter_mut().zip(src.chunks_exact(QK)).zip(qw.chunks_exact(QK)) {
        let w = weights(xb, qw, sigma2);
        let (d, min) = make_qkx3_quants(31, xb, Some(&w), &mut l, -0.9, 0.05, 36, false);
        y.d = put_f16(d);
        y.m = put_f16(-min);
        pack5(&l, &mut y.qs, &mut y.qh);
    }
}

fn dequantize_q5_1_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ5_1] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (get_f16(b.d), get_f16(b.m));
        let qh = u32::from_le_bytes(b.qh);
        for j in 0..QK / 2 {
            let xh0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
            y[j] = ((b.qs[j] & 0x0f) | xh0) as f32 * d + m;
            y[j + QK / 2] = ((b.qs[j] >> 4) | xh1) as f32 * d + m;
        }
    }
}

/// Q8 scale of a block: `amax / 127` and its inverse (0 for an all-zero block).
fn q8_scale(x: &[f32]) -> (f32, f32) {
    let mut amax = 0.0f32;
    for &v in x {
        amax = amax.max(v.abs());
    }
    let d = amax / 127.0;
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

// ggml-quants.c: quantize_row_q8_0_ref (quantize_q8_0 ignores the importance matrix)
fn quantize_q8_0(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 is available (checked above).
        return unsafe { x86::quantize_q8_0(src, bytemuck::cast_slice_mut(dst)) };
    }
    quantize_q8_0_scalar(src, dst, imatrix)
}

/// The scalar reference of [`quantize_q8_0`].
fn quantize_q8_0_scalar(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockQ8_0] = bytemuck::cast_slice_mut(dst);
    for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
        let (d, id) = q8_scale(x);
        y.d = put_f16(d);
        for (q, &v) in y.qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
        }
    }
}

fn dequantize_q8_0_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ8_0] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = get_f16(b.d);
        for (v, &q) in y.iter_mut().zip(&b.qs) {
            *v = q as f32 * d;
        }
    }
}

// ggml-quants.c: quantize_row_q8_1_ref
fn quantize_q8_1(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockQ8_1] = bytemuck::cast_slice_mut(dst);
    for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
        let (d, id) = q8_scale(x);
        y.d = put_f16(d);
        let mut sum = 0i32;
        for j in 0..QK / 2 {
            y.qs[j] = (x[j] * id).round() as i8;
            y.qs[j + QK / 2] = (x[j + QK / 2] * id).round() as i8;
            sum += y.qs[j] as i32 + y.qs[j + QK / 2] as i32;
        }
        y.s = put_f16(sum as f32 * d);
    }
}

// ggml-cpu quants.c: dequantize of Q8_1 is qs * d (the `s` field only serves dot products)
fn dequantize_q8_1_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ8_1] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = get_f16(b.d);
        for (v, &q) in y.iter_mut().zip(&b.qs) {
            *v = q as f32 * d;
        }
    }
}

/// Whether the AVX2 kernels can run (std caches the CPUID probe, so this is a load and a test).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// Row quantizer dispatch: the AVX2 kernel where available (same bytes), the scalar code otherwise.
macro_rules! dispatch_quantize {
    ($name:ident, $scalar:ident, $block:ty, $simd:ident, $imatrix:ident) => {
        fn $name(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                let blocks: &mut [$block] = bytemuck::cast_slice_mut(dst);
                match imatrix {
                    // SAFETY: AVX2 is available (checked above).
                    None => unsafe { x86::$simd(src, blocks) },
                    // SAFETY: as above.
                    Some(qw) => $imatrix(src, blocks, qw, |x, q, s| unsafe { x86::block_weights(x, q, s) }),
                }
                return;
            }
            $scalar(src, dst, imatrix)
        }
    };
}

/// Block dequantizer dispatch, as [`dispatch_quantize`].
macro_rules! dispatch_dequantize {
    ($name:ident, $scalar:ident, $simd:ident) => {
        fn $name(src: &[u8], dst: &mut [f32]) {
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                // SAFETY: AVX2 is available (checked above).
                unsafe { x86::$simd(bytemuck::cast_slice(src), dst) };
                return;
            }
            $scalar(src, dst)
        }
    };
}

dispatch_quantize!(
    quantize_q4_0,
    quantize_q4_0_scalar,
    BlockQ4_0,
    quantize_q4_0,
    q4_0_imatrix
);
dispatch_quantize!(
    quantize_q4_1,
    quantize_q4_1_scalar,
    BlockQ4_1,
    quantize_q4_1,
    q4_1_imatrix
);
dispatch_quantize!(
    quantize_q5_0,
    quantize_q5_0_scalar,
    BlockQ5_0,
    quantize_q5_0,
    q5_0_imatrix
);
dispatch_quantize!(
    quantize_q5_1,
    quantize_q5_1_scalar,
    BlockQ5_1,
    quantize_q5_1,
    q5_1_imatrix
);
dispatch_dequantize!(dequantize_q4_0, dequantize_q4_0_scalar, dequantize_q4_0);
dispatch_dequantize!(dequantize_q4_1, dequantize_q4_1_scalar, dequantize_q4_1);
dispatch_dequantize!(dequantize_q5_0, dequantize_q5_0_scalar, dequantize_q5_0);
dispatch_dequantize!(dequantize_q5_1, dequantize_q5_1_scalar, dequantize_q5_1);
dispatch_dequantize!(dequantize_q8_0, dequantize_q8_0_scalar, dequantize_q8_0);
dispatch_dequantize!(dequantize_q8_1, dequantize_q8_1_scalar, dequantize_q8_1);

/// AVX2 kernels. Each performs the scalar code's f32 operations on eight values at a time, in the
/// same per-value order (no FMA, no reassociated sums); maxima and minima are exact in any order.
/// Float→int conversions truncate (`cvttps2dq`, like C's casts and Rust's `as` in range); blocks
/// where that range argument does not hold (zero, subnormal, non-finite scales) go to the scalar
/// code, so every block gets the scalar path's bytes.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// Blocks whose largest magnitude is below this (2^-100) take the scalar path: above it, and
    /// finite, the scale and its inverse are normal floats, so `|x * id|` stays within a rounding
    /// error of the code range and truncating conversion agrees with Rust's saturating `as`.
    pub(crate) const SAFE_MIN: f32 = 7.888_609e-31;

    /// The 32 values of a block as four vectors.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn load32(x: &[f32; QK]) -> [__m256; 4] {
        let p = x.as_ptr();
        [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ]
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn abs_ps(v: __m256) -> __m256 {
        _mm256_andnot_ps(_mm256_set1_ps(-0.0), v)
    }

    /// Largest lane (no NaN lanes).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)))
    }

    /// Smallest lane (no NaN lanes).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn hmin(v: __m256) -> f32 {
        let m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let m = _mm_min_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_min_ss(m, _mm_shuffle_ps(m, m, 1)))
    }

    /// Largest |x| of the vectors, NaN lanes ignored (`max_ps(a, b)` returns `b` when `a` is NaN,
    /// and the accumulators never hold NaN).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn abs_max(v: &[__m256]) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 2];
        for (i, &x) in v.iter().enumerate() {
            acc[i & 1] = _mm256_max_ps(abs_ps(x), acc[i & 1]);
        }
        hmax(_mm256_max_ps(acc[0], acc[1]))
    }

    /// The value of largest magnitude, first one on ties (`signed_absmax`), or `None` when that
    /// magnitude is not in `[SAFE_MIN, f32::MAX]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn signed_absmax_checked(v: &[__m256; 4], x: &[f32; QK]) -> Option<f32> {
        let amax = abs_max(v);
        if !(SAFE_MIN..=f32::MAX).contains(&amax) {
            return None;
        }
        let m = _mm256_set1_ps(amax);
        let mut mask = 0u32;
        for (i, &x) in v.iter().enumerate() {
            let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(abs_ps(x), m);
            mask |= (_mm256_movemask_ps(eq) as u32) << (8 * i);
        }
        // amax is one of the |x| (and not NaN), so the mask is not empty.
        Some(x[mask.trailing_zeros() as usize & (QK - 1)])
    }

    /// `(min, max)` as `min_max` finds them, NaN lanes ignored. A zero result may have the other
    /// sign than the scalar search's (±0 compare equal): callers send those blocks to the scalar path.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn min_max(v: &[__m256; 4]) -> (f32, f32) {
        let mut mn = _mm256_set1_ps(f32::MAX);
        let mut mx = _mm256_set1_ps(-f32::MAX);
        for &x in v {
            mn = _mm256_min_ps(x, mn);
            mx = _mm256_max_ps(x, mx);
        }
        (hmin(mn), hmax(mx))
    }

    /// `clamp(trunc(x * id + off), 0, hi)` per value. In the safe range `x * id + off` is NaN or
    /// within [-1, hi + 1]; truncation matches the scalar cast and a NaN (`cvttps` gives i32::MIN)
    /// becomes 0, as Rust's `as` makes it.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn codes(v: &[__m256; 4], id: f32, off: f32, hi: i32) -> [__m256i; 4] {
        let (idv, offv) = (_mm256_set1_ps(id), _mm256_set1_ps(off));
        let (lo, hi) = (_mm256_setzero_si256(), _mm256_set1_epi32(hi));
        let mut l = [lo; 4];
        for (l, &x) in l.iter_mut().zip(v) {
            let t = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(x, idv), offv));
            *l = _mm256_max_epi32(_mm256_min_epi32(t, hi), lo);
        }
        l
    }

    /// As [`codes`] for `(x - min) * id + 0.5`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn codes_min(v: &[__m256; 4], min: f32, id: f32, hi: i32) -> [__m256i; 4] {
        let (mv, idv, half) = (_mm256_set1_ps(min), _mm256_set1_ps(id), _mm256_set1_ps(0.5));
        let (lo, hi) = (_mm256_setzero_si256(), _mm256_set1_epi32(hi));
        let mut l = [lo; 4];
        for (l, &x) in l.iter_mut().zip(v) {
            let t = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(x, mv), idv), half);
            *l = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvttps_epi32(t), hi), lo);
        }
        l
    }

    /// 32 int32 codes in 0..=255 → 32 bytes in order.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn pack_bytes(l: &[__m256i; 4]) -> __m256i {
        let p01 = _mm256_packs_epi32(l[0], l[1]);
        let p23 = _mm256_packs_epi32(l[2], l[3]);
        let b = _mm256_packus_epi16(p01, p23);
        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// `qs[j] = (b[j] & 15) | (b[j + 16] & 15) << 4`.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn nibbles(b: __m256i, qs: &mut [u8; QK / 2]) {
        let m = _mm_set1_epi8(0x0f);
        let lo = _mm_and_si128(_mm256_castsi256_si128(b), m);
        let hi = _mm_and_si128(_mm256_extracti128_si256::<1>(b), m);
        _mm_storeu_si128(qs.as_mut_ptr().cast(), _mm_or_si128(lo, _mm_slli_epi16::<4>(hi)));
    }

    /// `pack5` of 32 codes in 0..=31.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn pack5(l: &[__m256i; 4], qs: &mut [u8; QK / 2], qh: &mut [u8; 4]) {
        let b = pack_bytes(l);
        nibbles(b, qs);
        // bit 4 of each byte to its top bit (bytes are < 32, so nothing crosses into bit 7 of the next)
        *qh = (_mm256_movemask_epi8(_mm256_slli_epi16::<3>(b)) as u32).to_le_bytes();
    }

    /// `qw[j] * sqrt(sigma2 + x[j]^2)` (`block_weights`; vector sqrt is correctly rounded too).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn block_weights(xb: &[f32], qw: &[f32], sigma2: f32) -> [f32; QK] {
        let (xb, qw): (&[f32; QK], &[f32; QK]) = (xb.try_into().unwrap(), qw.try_into().unwrap());
        let s2 = _mm256_set1_ps(sigma2);
        let mut w = [0f32; QK];
        for j in (0..QK).step_by(8) {
            let x = _mm256_loadu_ps(xb.as_ptr().add(j));
            let q = _mm256_loadu_ps(qw.as_ptr().add(j));
            let r = _mm256_mul_ps(q, _mm256_sqrt_ps(_mm256_add_ps(s2, _mm256_mul_ps(x, x))));
            _mm256_storeu_ps(w.as_mut_ptr().add(j), r);
        }
        w
    }

    /// `round(x * id) as i8` per value, `round` rounding halves away from zero as C's `roundf`:
    /// truncate, then step away from zero when the exact remainder is at least one half. With
    /// `|x| * id` within rounding of 127 the result is in range; NaN lanes become 0 as with `as`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_q8_0(src: &[f32], blocks: &mut [BlockQ8_0]) {
        let (half, one, sign) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0), _mm256_set1_ps(-0.0));
        for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
            let x: &[f32; QK] = x.try_into().unwrap();
            let v = load32(x);
            let amax = abs_max(&v);
            if !(SAFE_MIN..=f32::MAX).contains(&amax) {
                let y: &mut [BlockQ8_0] = std::slice::from_mut(y);
                quantize_q8_0_scalar(x, bytemuck::cast_slice_mut(y), None);
                continue;
            }
            let d = amax / 127.0;
            y.d = put_f16(d);
            let idv = _mm256_set1_ps(1.0 / d);
            let mut l = [_mm256_setzero_si256(); 4];
            for (l, &x) in l.iter_mut().zip(&v) {
                let p = _mm256_mul_ps(x, idv);
                let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
                let away = _mm256_cmp_ps::<_CMP_GE_OQ>(abs_ps(_mm256_sub_ps(p, t)), half);
                let step = _mm256_and_ps(away, _mm256_or_ps(one, _mm256_and_ps(p, sign)));
                let r = _mm256_cvttps_epi32(_mm256_add_ps(t, step));
                *l = _mm256_and_si256(r, _mm256_castps_si256(_mm256_cmp_ps::<_CMP_ORD_Q>(p, p)));
            }
            let b = _mm256_packs_epi16(_mm256_packs_epi32(l[0], l[1]), _mm256_packs_epi32(l[2], l[3]));
            let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(y.qs.as_mut_ptr().cast(), b);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_q4_0(src: &[f32], blocks: &mut [BlockQ4_0]) {
        for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
            let x: &[f32; QK] = x.try_into().unwrap();
            let v = load32(x);
            let Some(max) = signed_absmax_checked(&v, x) else {
                q4_0_ref(x, y);
                continue;
            };
            let d = max / -8.0;
            y.d = put_f16(d);
            nibbles(pack_bytes(&codes(&v, 1.0 / d, 8.5, 15)), &mut y.qs);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_q5_0(src: &[f32], blocks: &mut [BlockQ5_0]) {
        for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
            let x: &[f32; QK] = x.try_into().unwrap();
            let v = load32(x);
            let Some(max) = signed_absmax_checked(&v, x) else {
                q5_0_ref(x, y);
                continue;
            };
            let d = max / -16.0;
            y.d = put_f16(d);
            pack5(&codes(&v, 1.0 / d, 16.5, 31), &mut y.qs, &mut y.qh);
        }
    }

    /// `(min, d)` of an affine block when it can take the vector path: `d` normal (so `id` is
    /// finite and `(x - min) * id <= n + rounding`) and neither bound a zero of uncertain sign.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn affine_scale(v: &[__m256; 4], n: f32) -> Option<(f32, f32)> {
        let (min, max) = min_max(v);
        let d = (max - min) / n;
        (d.is_normal() && min != 0.0 && max != 0.0).then_some((min, d))
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_q4_1(src: &[f32], blocks: &mut [BlockQ4_1]) {
        for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
            let x: &[f32; QK] = x.try_into().unwrap();
            let v = load32(x);
            let Some((min, d)) = affine_scale(&v, 15.0) else {
                q4_1_ref(x, y);
                continue;
            };
            y.d = put_f16(d);
            y.m = put_f16(min);
            nibbles(pack_bytes(&codes_min(&v, min, 1.0 / d, 15)), &mut y.qs);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_q5_1(src: &[f32], blocks: &mut [BlockQ5_1]) {
        for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
            let x: &[f32; QK] = x.try_into().unwrap();
            let v = load32(x);
            let Some((min, d)) = affine_scale(&v, 31.0) else {
                q5_1_ref(x, y);
                continue;
            };
            y.d = put_f16(d);
            y.m = put_f16(min);
            pack5(&codes_min(&v, min, 1.0 / d, 31), &mut y.qs, &mut y.qh);
        }
    }

    /// Store `(q - off) * d [+ m]` of the 32 byte codes `lo` (values 0..16) and `hi` (16..32).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store_codes(lo: __m128i, hi: __m128i, off: i32, d: f32, m: Option<f32>, y: &mut [f32]) {
        let y: &mut [f32; QK] = y.try_into().unwrap();
        let (offv, dv) = (_mm256_set1_epi32(off), _mm256_set1_ps(d));
        let parts = [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)];
        for (i, &p) in parts.iter().enumerate() {
            let q = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(p), offv));
            let mut r = _mm256_mul_ps(q, dv);
            if let Some(m) = m {
                r = _mm256_add_ps(r, _mm256_set1_ps(m));
            }
            _mm256_storeu_ps(y.as_mut_ptr().add(8 * i), r);
        }
    }

    /// Low and high nibbles of the 16 `qs` bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn split_nibbles(qs: &[u8; QK / 2]) -> (__m128i, __m128i) {
        let q = _mm_loadu_si128(qs.as_ptr().cast());
        let m = _mm_set1_epi8(0x0f);
        (_mm_and_si128(q, m), _mm_and_si128(_mm_srli_epi16::<4>(q), m))
    }

    /// The fifth bits of `qh` as 0x10 bytes for values 0..16 and 16..32.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn fifth_bits(qh: [u8; 4]) -> (__m128i, __m128i) {
        // byte i of the broadcast holds qh byte i / 8; select bit i % 8 of it
        let h = _mm_set1_epi32(u32::from_le_bytes(qh) as i32);
        let sel = _mm_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let lo = _mm_shuffle_epi8(h, _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
        let hi = _mm_shuffle_epi8(h, _mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
        (bit_to_0x10(lo, sel), bit_to_0x10(hi, sel))
    }

    /// 0x10 where `b & sel == sel`, else 0.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn bit_to_0x10(b: __m128i, sel: __m128i) -> __m128i {
        _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(b, sel), sel), _mm_set1_epi8(0x10))
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_q4_0(blocks: &[BlockQ4_0], dst: &mut [f32]) {
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
            let (lo, hi) = split_nibbles(&b.qs);
            store_codes(lo, hi, 8, get_f16(b.d), None, y);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_q4_1(blocks: &[BlockQ4_1], dst: &mut [f32]) {
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
            let (lo, hi) = split_nibbles(&b.qs);
            store_codes(lo, hi, 0, get_f16(b.d), Some(get_f16(b.m)), y);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_q5_0(blocks: &[BlockQ5_0], dst: &mut [f32]) {
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
            let (lo, hi) = split_nibbles(&b.qs);
            let (hlo, hhi) = fifth_bits(b.qh);
            store_codes(_mm_or_si128(lo, hlo), _mm_or_si128(hi, hhi), 16, get_f16(b.d), None, y);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_q5_1(blocks: &[BlockQ5_1], dst: &mut [f32]) {
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
            let (lo, hi) = split_nibbles(&b.qs);
            let (hlo, hhi) = fifth_bits(b.qh);
            let (d, m) = (get_f16(b.d), get_f16(b.m));
            store_codes(_mm_or_si128(lo, hlo), _mm_or_si128(hi, hhi), 0, d, Some(m), y);
        }
    }

    /// `qs[j] * d` for 32 signed bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store_q8(qs: &[i8; QK], d: f32, y: &mut [f32]) {
        let y: &mut [f32; QK] = y.try_into().unwrap();
        let dv = _mm256_set1_ps(d);
        for i in 0..4 {
            let q = _mm_loadl_epi64(qs.as_ptr().add(8 * i).cast());
            let r = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), dv);
            _mm256_storeu_ps(y.as_mut_ptr().add(8 * i), r);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_q8_0(blocks: &[BlockQ8_0], dst: &mut [f32]) {
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
            store_q8(&b.qs, get_f16(b.d), y);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_q8_1(blocks: &[BlockQ8_1], dst: &mut [f32]) {
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
            store_q8(&b.qs, get_f16(b.d), y);
        }
    }
}

pub(crate) const CODECS: &[Codec] = &[
    Codec {
        ty: GgmlType::Q4_0,
        quantize: Some(quantize_q4_0),
        dequantize: dequantize_q4_0,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::Q4_1,
        quantize: Some(quantize_q4_1),
        dequantize: dequantize_q4_1,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::Q5_0,
        quantize: Some(quantize_q5_0),
        dequantize: dequantize_q5_0,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::Q5_1,
        quantize: Some(quantize_q5_1),
        dequantize: dequantize_q5_1,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::Q8_0,
        quantize: Some(quantize_q8_0),
        dequantize: dequantize_q8_0,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::Q8_1,
        quantize: Some(quantize_q8_1),
        dequantize: dequantize_q8_1,
        requires_imatrix: false,
    },
];

/// Seeded inputs for the agreement tests of the fast paths (this module and the other families).
#[cfg(test)]
pub(crate) mod test_data {
    pub(crate) struct Rng(pub u64);
    impl Rng {
        pub fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        pub fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        pub fn uniform(&mut self) -> f64 {
            ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }
        pub fn gauss(&mut self) -> f64 {
            (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
        }
        pub fn sign(&mut self) -> f32 {
            if self.next() & 1 == 0 {
                1.0
            } else {
                -1.0
            }
        }
    }

    /// `rows` rows of `n` values; every `block` values come from one of a mix of distributions:
    /// gaussians from 1e-30 to 1e30, zeros (±0), constants, one-hot, ±huge, subnormal, half-integer
    /// multiples of a power of two (rounding ties for every scale derived from such a block),
    /// equal-magnitude ±c (sign ties), and gaussians with NaN or ±inf among them.
    pub(crate) fn mixed_rows(rows: usize, n: usize, block: usize, seed: u64) -> Vec<f32> {
        let mut r = Rng(seed);
        let mut out = Vec::with_capacity(rows * n);
        while out.len() < rows * n {
            let kind = r.below(16);
            let scale = [1e-30, 1e-6, 1e-3, 0.02, 1.0, 1e3, 1e20, 1e30][r.below(8) as usize];
            let e = r.below(40) as i32 - 20;
            let m = [1, 2, 4, 8, 12, 16, 31, 32][r.below(8) as usize] as i64;
            let c = (r.gauss() * 3.0) as f32;
            let hot = r.below(block as u64) as usize;
            for j in 0..block {
                let g = r.gauss() as f32;
                let v = match kind {
                    0..=3 => g * scale,
                    4 => 0.0,
                    5 => 0.0 * r.sign(),
                    6 => c,
                    7 => {
                        if j == hot {
                            c
                        } else {
                            0.0
                        }
                    }
                    8 => r.sign() * (1e37 + r.uniform() as f32 * 3.3e38),
                    9 => g * 1e-40,
                    10 | 11 => (r.below(4 * m as u64 + 1) as i64 - 2 * m) as f32 * 0.5 * 2f32.powi(e),
                    12 => r.sign() * c,
                    13 => {
                        if r.below(8) == 0 {
                            f32::NAN
                        } else {
                            g
                        }
                    }
                    14 => {
                        if j == hot {
                            r.sign() * f32::INFINITY
                        } else {
                            g
                        }
                    }
                    _ => {
                        // LLM-like: N(0, 0.02) with rare outliers
                        if r.below(100) == 0 {
                            g * 0.2
                        } else {
                            g * 0.02
                        }
                    }
                };
                out.push(v);
            }
        }
        out.truncate(rows * n);
        out
    }

    /// An importance matrix of `n` weights in [0.1, 2.1], with a few zeros.
    pub(crate) fn imatrix(n: usize, seed: u64) -> Vec<f32> {
        let mut r = Rng(seed);
        (0..n)
            .map(|_| {
                if r.below(50) == 0 {
                    0.0
                } else {
                    (0.1 + 2.0 * r.uniform()) as f32
                }
            })
            .collect()
    }

    pub(crate) fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut r = Rng(seed);
        (0..len).map(|_| r.next() as u8).collect()
    }

    /// Quantize `rows` with both row functions, with and without an imatrix; assert equal bytes.
    /// `dist` is the run length of one distribution in [`mixed_rows`].
    pub(crate) fn check_quantize(
        name: &str,
        block: usize,
        block_bytes: usize,
        dist: usize,
        fast: crate::QuantizeRow,
        scalar: crate::QuantizeRow,
        with_imatrix: bool,
    ) {
        let (rows, n) = (2048, 8 * block);
        let src = mixed_rows(rows, n, dist, 0x5eed ^ (block * 1000 + dist) as u64);
        let im = imatrix(n, 7);
        let row_bytes = n / block * block_bytes;
        let variants: &[Option<&[f32]>] = if with_imatrix { &[None, Some(&im)] } else { &[None] };
        for &w in variants {
            let (mut a, mut b) = (vec![0u8; row_bytes], vec![0u8; row_bytes]);
            for (i, x) in src.chunks_exact(n).enumerate() {
                fast(x, &mut a, w);
                scalar(x, &mut b, w);
                for k in 0..n / block {
                    let blk = k * block_bytes..(k + 1) * block_bytes;
                    assert_eq!(
                        a[blk.clone()],
                        b[blk],
                        "{name} imatrix={} row {i} block {k}: {:?}",
                        w.is_some(),
                        &x[k * block..(k + 1) * block]
                    );
                }
            }
        }
    }

    /// Dequantize random bytes with both functions; assert bit-equal floats.
    pub(crate) fn check_dequantize(
        name: &str,
        block: usize,
        block_bytes: usize,
        fast: crate::DequantizeRow,
        scalar: crate::DequantizeRow,
    ) {
        let nb = 20000;
        let src = random_bytes(nb * block_bytes, 0xde9 ^ block as u64);
        let (mut a, mut b) = (vec![0f32; nb * block], vec![0f32; nb * block]);
        fast(&src, &mut a);
        scalar(&src, &mut b);
        // Bit-exact, except that when both the scale and the offset are NaN, which NaN `q * d + m`
        // returns depends on the operand order the compiler picks for the (commutative) addition.
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "{name} value {i}: {x} vs {y}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_data::{check_dequantize, check_quantize};
    use super::*;

    #[test]
    fn q4_0_fast_path_matches_scalar() {
        check_quantize("q4_0", QK, 18, QK, quantize_q4_0, quantize_q4_0_scalar, true);
        check_dequantize("q4_0", QK, 18, dequantize_q4_0, dequantize_q4_0_scalar);
    }

    #[test]
    fn q4_1_fast_path_matches_scalar() {
        check_quantize("q4_1", QK, 20, QK, quantize_q4_1, quantize_q4_1_scalar, true);
        check_dequantize("q4_1", QK, 20, dequantize_q4_1, dequantize_q4_1_scalar);
    }

    #[test]
    fn q5_0_fast_path_matches_scalar() {
        check_quantize("q5_0", QK, 22, QK, quantize_q5_0, quantize_q5_0_scalar, true);
        check_dequantize("q5_0", QK, 22, dequantize_q5_0, dequantize_q5_0_scalar);
    }

    #[test]
    fn q5_1_fast_path_matches_scalar() {
        check_quantize("q5_1", QK, 24, QK, quantize_q5_1, quantize_q5_1_scalar, true);
        check_dequantize("q5_1", QK, 24, dequantize_q5_1, dequantize_q5_1_scalar);
    }

    #[test]
    fn q8_0_fast_quantize_matches_scalar() {
        check_quantize("q8_0", QK, 34, QK, quantize_q8_0, quantize_q8_0_scalar, false);
    }

    #[test]
    fn q8_fast_dequantize_matches_scalar() {
        check_dequantize("q8_0", QK, 34, dequantize_q8_0, dequantize_q8_0_scalar);
        check_dequantize("q8_1", QK, 36, dequantize_q8_1, dequantize_q8_1_scalar);
    }
}
