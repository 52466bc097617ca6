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
fn quantize_q2_0(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockQ2_0] = bytemuck::cast_slice_mut(dst);
    for (y, x) in blocks.iter_mut().zip(src.chunks_exact(QK2_0)) {
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
                // (int)roundf(w*id) + 1, clamped to the codes 0..=3
                let c = ((w * id).round() as i32 + 1).clamp(0, 3);
                q | ((c as u8) << (2 * k))
            });
        }
    }
}

/// `dequantize_row_q1_0`.
fn dequantize_q1_0(src: &[u8], dst: &mut [f32]) {
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
fn dequantize_q2_0(src: &[u8], dst: &mut [f32]) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
