//! K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (super-blocks of 256 values with quantized sub-block
//! scales) and Q8_K (the 8-bit intermediate type), bit-identical to ggml
//! (`ggml/src/ggml-quants.c`, llama.cpp b11434).
//!
//! Without an importance matrix each type follows `quantize_row_qX_K_ref`; with one, the
//! `quantize_row_qX_K_impl` path that `quantize_qX_K` takes when `quant_weights` is given.
//! Block layouts follow `ggml/src/ggml-common.h`; every field is a byte array so blocks have
//! alignment 1 and can be cast from row bytes.

mod fast;
pub(crate) mod helpers;
mod q2_k;
mod q3_k;
mod q4_k;
mod q5_k;
mod q6_k;
mod q8_k;

use crate::fp::F16Bytes;
use crate::{Codec, GgmlType};
use helpers::QK_K;

/// Q2_K: 16 sub-blocks of 16, `x ≈ d * scale * q - dmin * min`, 2-bit quants, 4-bit scales/mins.
// ggml-common.h: block_q2_K
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ2K {
    /// Low nibble: scale, high nibble: min, per sub-block.
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: F16Bytes,
    pub dmin: F16Bytes,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

/// Q3_K: 16 sub-blocks of 16, `x ≈ d * (scale - 32) * (q - 4)`, 3-bit quants, 6-bit scales.
// ggml-common.h: block_q3_K
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ3K {
    /// High bit of each quant.
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of each quant.
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: F16Bytes,
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

/// Q4_K: 8 sub-blocks of 32, `x ≈ d * scale * q - dmin * min`, 4-bit quants, 6-bit scales/mins.
// ggml-common.h: block_q4_K
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4K {
    pub d: F16Bytes,
    pub dmin: F16Bytes,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// Q5_K: as Q4_K with a fifth bit per quant in `qh`.
// ggml-common.h: block_q5_K
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5K {
    pub d: F16Bytes,
    pub dmin: F16Bytes,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

/// Q6_K: 16 sub-blocks of 16, `x ≈ d * scale * (q - 32)`, 6-bit quants, signed 8-bit scales.
// ggml-common.h: block_q6_K
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits of each quant.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of each quant.
    pub qh: [u8; QK_K / 4],
    /// Signed (i8) sub-block scales.
    pub scales: [u8; QK_K / 16],
    pub d: F16Bytes,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

/// Q8_K: `x ≈ d * q` with an f32 scale, signed 8-bit quants and per-16 sums of the quants.
// ggml-common.h: block_q8_K
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8K {
    /// f32, little-endian.
    pub d: [u8; 4],
    /// Signed (i8) quants.
    pub qs: [u8; QK_K],
    /// i16 little-endian sums of each 16 quants.
    pub bsums: [[u8; 2]; QK_K / 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

pub(crate) const CODECS: &[Codec] = &[
    Codec {
        ty: GgmlType::Q2_K,
        quantize: Some(q2_k::quantize_row),
        dequantize: q2_k::dequantize_row,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::Q3_K,
        quantize: Some(q3_k::quantize_row),
        dequantize: q3_k::dequantize_row,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::Q4_K,
        quantize: Some(q4_k::quantize_row),
        dequantize: q4_k::dequantize_row,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::Q5_K,
        quantize: Some(q5_k::quantize_row),
        dequantize: q5_k::dequantize_row,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::Q6_K,
        quantize: Some(q6_k::quantize_row),
        dequantize: q6_k::dequantize_row,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::Q8_K,
        quantize: Some(q8_k::quantize_row),
        dequantize: q8_k::dequantize_row,
        requires_imatrix: false,
    },
];

/// Runs `f(x, block, weights)` for each super-block of a row, with the block's slice of the
/// importance matrix when there is one (ggml indexes `quant_weights + QK_K*i`).
// ggml-quants.c: the super-block loop of quantize_row_qX_K_ref / quantize_row_qX_K_impl
fn for_each_block<B: bytemuck::Pod>(
    src: &[f32],
    dst: &mut [u8],
    imatrix: Option<&[f32]>,
    mut f: impl FnMut(&[f32; QK_K], &mut B, Option<&[f32; QK_K]>),
) {
    let blocks: &mut [B] = bytemuck::cast_slice_mut(dst);
    assert_eq!(
        src.len(),
        blocks.len() * QK_K,
        "row length does not match the output blocks"
    );
    for (i, (x, y)) in src.chunks_exact(QK_K).zip(blocks.iter_mut()).enumerate() {
        let qw = imatrix.map(|w| w[i * QK_K..(i + 1) * QK_K].try_into().unwrap());
        f(x.try_into().unwrap(), y, qw);
    }
}

/// Runs `f(block, out)` for each block of `src` and its 256 outputs in `dst`.
// ggml-quants.c: the block loop of dequantize_row_qX_K
fn for_each_dequant<B: bytemuck::Pod>(src: &[u8], dst: &mut [f32], mut f: impl FnMut(&B, &mut [f32; QK_K])) {
    let blocks: &[B] = bytemuck::cast_slice(src);
    assert_eq!(
        dst.len(),
        blocks.len() * QK_K,
        "output length does not match the input blocks"
    );
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        f(b, y.try_into().unwrap());
    }
}

#[cfg(test)]
mod fast_tests;
#[cfg(test)]
mod tests;
