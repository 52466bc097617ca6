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
fn quantize_q4_0(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockQ4_0] = bytemuck::cast_slice_mut(dst);
    let Some(qw) = imatrix else {
        for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
            q4_0_ref(x, y);
        }
        return;
    };
    let sigma2 = row_sigma2(src);
    let mut l = [0i8; QK];
    for ((y, xb), qw) in blocks.iter_mut().zip(src.chunks_exact(QK)).zip(qw.chunks_exact(QK)) {
        let w = block_weights(xb, qw, sigma2);
        let d = make_qx_quants(8, xb, &mut l, 1, Some(&w));
        y.d = put_f16(d);
        for j in 0..QK / 2 {
            y.qs[j] = (l[j] as u8) | ((l[j + QK / 2] as u8) << 4);
        }
    }
}

fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
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
fn quantize_q4_1(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockQ4_1] = bytemuck::cast_slice_mut(dst);
    let Some(qw) = imatrix else {
        for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
            q4_1_ref(x, y);
        }
        return;
    };
    let sigma2 = row_sigma2(src);
    let mut l = [0u8; QK];
    for ((y, xb), qw) in blocks.iter_mut().zip(src.chunks_exact(QK)).zip(qw.chunks_exact(QK)) {
        let w = block_weights(xb, qw, sigma2);
        let (d, min) = make_qkx3_quants(15, xb, Some(&w), &mut l, -0.9, 0.05, 36, false);
        y.d = put_f16(d);
        y.m = put_f16(-min);
        for j in 0..QK / 2 {
            y.qs[j] = l[j] | (l[j + QK / 2] << 4);
        }
    }
}

fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
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
fn quantize_q5_0(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockQ5_0] = bytemuck::cast_slice_mut(dst);
    let Some(qw) = imatrix else {
        for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
            q5_0_ref(x, y);
        }
        return;
    };
    let sigma2 = row_sigma2(src);
    let mut l = [0i8; QK];
    for ((y, xb), qw) in blocks.iter_mut().zip(src.chunks_exact(QK)).zip(qw.chunks_exact(QK)) {
        let w = block_weights(xb, qw, sigma2);
        let d = make_qx_quants(16, xb, &mut l, 1, Some(&w));
        y.d = put_f16(d);
        pack5(&l.map(|v| v as u8), &mut y.qs, &mut y.qh);
    }
}

fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
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
fn quantize_q5_1(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockQ5_1] = bytemuck::cast_slice_mut(dst);
    let Some(qw) = imatrix else {
        for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
            q5_1_ref(x, y);
        }
        return;
    };
    let sigma2 = row_sigma2(src);
    let mut l = [0u8; QK];
    for ((y, xb), qw) in blocks.iter_mut().zip(src.chunks_exact(QK)).zip(qw.chunks_exact(QK)) {
        let w = block_weights(xb, qw, sigma2);
        let (d, min) = make_qkx3_quants(31, xb, Some(&w), &mut l, -0.9, 0.05, 36, false);
        y.d = put_f16(d);
        y.m = put_f16(-min);
        pack5(&l, &mut y.qs, &mut y.qh);
    }
}

fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
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
fn quantize_q8_0(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockQ8_0] = bytemuck::cast_slice_mut(dst);
    for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK)) {
        let (d, id) = q8_scale(x);
        y.d = put_f16(d);
        for (q, &v) in y.qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
        }
    }
}

fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
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
fn dequantize_q8_1(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ8_1] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = get_f16(b.d);
        for (v, &q) in y.iter_mut().zip(&b.qs) {
            *v = q as f32 * d;
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
