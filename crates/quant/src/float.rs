//! Plain float types: F32 (copy), F16 and BF16 (round to nearest even, as
//! `ggml_fp32_to_fp16_row` and `ggml_fp32_to_bf16_row_ref` in `ggml/src/ggml.c`).

use crate::fp::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::Codec;
use gguf::GgmlType;

fn quantize_f32(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    dst.copy_from_slice(bytemuck::cast_slice(src));
}

fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes(s.try_into().expect("4 bytes"));
    }
}

fn quantize_f16(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    for (d, &s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f32_to_f16(s).to_le_bytes());
    }
}

fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

fn quantize_bf16(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    for (d, &s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f32_to_bf16(s).to_le_bytes());
    }
}

fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
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
