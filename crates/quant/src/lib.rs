//! ggml's tensor types as codecs: quantize (with or without an importance matrix) and dequantize,
//! bit-identical to ggml (`ggml_quantize_chunk` and the types' `to_float` in
//! `ggml/src/ggml-quants.c`, llama.cpp b11434).
//!
//! One table ([`codec`]) maps each [`GgmlType`] to its row quantizer and block dequantizer. The
//! layouts (block size, bytes per block) come from the `gguf` crate's type table. Quantization runs
//! row by row (rows are independent in every ggml type), spread over all cores with rayon;
//! dequantization runs over chunks of blocks.
//!
//! Families, one module each: [`float`] (F32, F16, BF16), [`legacy`] (Q4_0 … Q8_1), [`k_quants`]
//! (Q2_K … Q8_K), [`iq4`] (IQ4_NL, IQ4_XS), [`iq_grid`] (the lattice-codebook IQ1/IQ2/IQ3 types),
//! [`ternary`] (TQ1_0, TQ2_0), [`fp4`] (MXFP4, NVFP4), [`low_bit`] (Q1_0, Q2_0).

pub mod fp;

pub mod dot;
pub mod float;
pub mod fp4;
pub mod iq4;
pub mod iq_grid;
pub mod k_quants;
pub mod legacy;
pub mod low_bit;
pub mod ternary;

pub use gguf::GgmlType;
use rayon::prelude::*;

/// Quantize one row: `src` holds `n_per_row` values, `dst` exactly the row's bytes;
/// `imatrix`, when given, holds one importance weight per column (`n_per_row` values).
pub type QuantizeRow = fn(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>);
/// Dequantize whole blocks: `src` holds `dst.len() / block_size` blocks.
pub type DequantizeRow = fn(src: &[u8], dst: &mut [f32]);

/// One entry of the codec table (ggml's `type_traits` + `ggml_quantize_chunk`'s dispatch).
pub struct Codec {
    pub ty: GgmlType,
    /// `None` for types ggml cannot quantize to.
    pub quantize: Option<QuantizeRow>,
    pub dequantize: DequantizeRow,
    /// ggml refuses to quantize these without an importance matrix
    /// (`ggml_quantize_requires_imatrix`).
    pub requires_imatrix: bool,
}

/// Every codec, gathered from the family modules.
fn all_codecs() -> impl Iterator<Item = &'static Codec> {
    [
        float::CODECS,
        legacy::CODECS,
        k_quants::CODECS,
        iq4::CODECS,
        ternary::CODECS,
        fp4::CODECS,
        low_bit::CODECS,
    ]
    .into_iter()
    .chain(iq_grid::CODECS.iter().copied())
    .flatten()
}

/// The codec for `ty`, if hf2q implements it.
pub fn codec(ty: GgmlType) -> Option<&'static Codec> {
    all_codecs().find(|c| c.ty == ty)
}

/// Types hf2q can quantize to.
pub fn quantizable_types() -> Vec<GgmlType> {
    all_codecs().filter(|c| c.quantize.is_some()).map(|c| c.ty).collect()
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QuantError {
    #[error("no codec for ggml type {0}")]
    Unsupported(GgmlType),
    #[error("ggml type {0} can be read but not written")]
    NotQuantizable(GgmlType),
    #[error("quantizing to {0} requires an importance matrix (--imatrix)")]
    RequiresImatrix(GgmlType),
    #[error("row length {n} is not a multiple of the {ty} block size {block}")]
    RowLength { ty: GgmlType, n: usize, block: usize },
    #[error("{what}: expected {expected} values, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
}

/// Below this many values a (de)quantization runs on the calling thread.
const PARALLEL_MIN_VALUES: usize = 1 << 16;

/// Bytes of one row of `n` values of `ty`.
pub fn row_bytes(ty: GgmlType, n: usize) -> Result<usize, QuantError> {
    ty.row_bytes(n as u64).map(|b| b as usize).ok_or(QuantError::RowLength {
        ty,
        n,
        block: ty.block_size() as usize,
    })
}

/// Quantize rows of `n_per_row` values into `dst` (which must be exactly the right size), in
/// parallel over rows. Same bytes as `ggml_quantize_chunk(ty, src, dst, 0, nrows, n_per_row, imatrix)`.
pub fn quantize_into(
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<(), QuantError> {
    quantize_into_with(ty, src, dst, n_per_row, imatrix, true)
}

/// [`quantize_into`], optionally on the calling thread only (`parallel = false`).
pub fn quantize_into_with(
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
    parallel: bool,
) -> Result<(), QuantError> {
    let c = codec(ty).ok_or(QuantError::Unsupported(ty))?;
    let q = c.quantize.ok_or(QuantError::NotQuantizable(ty))?;
    if c.requires_imatrix && imatrix.is_none() {
        return Err(QuantError::RequiresImatrix(ty));
    }
    let rb = row_bytes(ty, n_per_row)?;
    if n_per_row == 0 || !src.len().is_multiple_of(n_per_row) {
        return Err(QuantError::Length {
            what: "input (whole rows)",
            expected: n_per_row,
            got: src.len(),
        });
    }
    let n_rows = src.len() / n_per_row;
    if dst.len() != n_rows * rb {
        return Err(QuantError::Length {
            what: "output bytes",
            expected: n_rows * rb,
            got: dst.len(),
        });
    }
    if let Some(w) = imatrix {
        if w.len() != n_per_row {
            return Err(QuantError::Length {
                what: "importance matrix",
                expected: n_per_row,
                got: w.len(),
            });
        }
    }
    // Small jobs (or a one-thread pool) run inline: handing them to the pool costs more than the work.
    if !parallel || rayon::current_num_threads() == 1 || src.len() < PARALLEL_MIN_VALUES {
        for (d, s) in dst.chunks_mut(rb).zip(src.chunks(n_per_row)) {
            q(s, d, imatrix);
        }
    } else {
        let rows_per_task = (PARALLEL_MIN_VALUES / 4 / n_per_row).max(1);
        dst.par_chunks_mut(rb)
            .zip(src.par_chunks(n_per_row))
            .with_min_len(rows_per_task)
            .for_each(|(d, s)| q(s, d, imatrix));
    }
    Ok(())
}

/// Quantize rows of `n_per_row` values; see [`quantize_into`].
pub fn quantize(ty: GgmlType, src: &[f32], n_per_row: usize, imatrix: Option<&[f32]>) -> Result<Vec<u8>, QuantError> {
    let rb = row_bytes(ty, n_per_row)?;
    let n_rows = src.len().checked_div(n_per_row).unwrap_or(0);
    let mut dst = vec![0u8; n_rows * rb];
    quantize_into(ty, src, &mut dst, n_per_row, imatrix)?;
    Ok(dst)
}

/// Single-threaded quantization (the reference path for tests and benchmarks).
pub fn quantize_serial(
    ty: GgmlType,
    src: &[f32],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<Vec<u8>, QuantError> {
    let c = codec(ty).ok_or(QuantError::Unsupported(ty))?;
    let q = c.quantize.ok_or(QuantError::NotQuantizable(ty))?;
    if c.requires_imatrix && imatrix.is_none() {
        return Err(QuantError::RequiresImatrix(ty));
    }
    let rb = row_bytes(ty, n_per_row)?;
    let mut dst = vec![0u8; src.len() / n_per_row * rb];
    for (d, s) in dst.chunks_mut(rb).zip(src.chunks(n_per_row)) {
        q(s, d, imatrix);
    }
    Ok(dst)
}

/// Dequantize `dst.len()` values from `src`, in parallel. Same floats as ggml's `to_float`.
pub fn dequantize_into(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let c = codec(ty).ok_or(QuantError::Unsupported(ty))?;
    let bs = ty.block_size() as usize;
    let bb = ty.type_size() as usize;
    if !dst.len().is_multiple_of(bs) {
        return Err(QuantError::RowLength {
            ty,
            n: dst.len(),
            block: bs,
        });
    }
    let need = dst.len() / bs * bb;
    if src.len() != need {
        return Err(QuantError::Length {
            what: "quantized bytes",
            expected: need,
            got: src.len(),
        });
    }
    // Chunks of 256 blocks keep scheduling overhead small relative to the work.
    const BLOCKS: usize = 256;
    if rayon::current_num_threads() == 1 || dst.len() < PARALLEL_MIN_VALUES {
        (c.dequantize)(src, dst);
    } else {
        dst.par_chunks_mut(BLOCKS * bs)
            .zip(src.par_chunks(BLOCKS * bb))
            .for_each(|(d, s)| (c.dequantize)(s, d));
    }
    Ok(())
}

pub fn dequantize(ty: GgmlType, src: &[u8], n: usize) -> Result<Vec<f32>, QuantError> {
    let mut dst = vec![0f32; n];
    dequantize_into(ty, src, &mut dst)?;
    Ok(dst)
}
