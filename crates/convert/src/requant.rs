//! GGUF → GGUF quantization (`hf2q quantize`), producing the same file as `llama-quantize`
//! (`src/llama-quant.cpp`, `llama_model_quantize_impl`): the same metadata (input keys in order,
//! then `general.quantization_version` and `general.file_type` re-appended, split keys removed),
//! tensors in llama-quantize's processing order with the per-tensor types of [`crate::plan`], and
//! tensor data from `quant` (bit-identical to `ggml_quantize_chunk`).
//!
//! Memory: tensors are converted one at a time in slabs of at most [`SLAB_VALUES`] values; a
//! tensor kept in its type is copied straight from the mapped input.

use crate::plan::{self, ModelFacts, PlanEntry, PlanOptions, PlanTensor, Target};
use gguf::{GgmlType, GgufModel, GgufWriter, Metadata, TensorSpec, Value};
use std::path::Path;

/// Values converted per slab (64 MiB of f32).
pub const SLAB_VALUES: usize = 16 << 20;
/// `GGML_QNT_VERSION`.
pub const QUANTIZATION_VERSION: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error("{0}")]
    Plan(#[from] plan::PlanError),
    #[error("{0}")]
    Invalid(String),
}

impl QuantizeError {
    /// Bad input or arguments (as opposed to an I/O failure while writing).
    pub fn is_invalid_input(&self) -> bool {
        match self {
            QuantizeError::Gguf(e) => e.is_invalid_input(),
            _ => true,
        }
    }
}

pub use crate::imatrix::Imatrix;

#[derive(Default)]
pub struct QuantizeOptions {
    pub plan: PlanOptions,
    /// `--allow-requantize`: quantize tensors that are already quantized (through f32).
    pub allow_requantize: bool,
    pub imatrix: Option<Imatrix>,
}

/// The dimensions gguf.cpp writes for a tensor: `ggml_n_dims` drops trailing 1s (at least one
/// dimension is kept), so e.g. a `[256, 1]` shared-expert gate comes out of llama-quantize 1-D.
pub fn ggml_dims(ne: &[u64]) -> Vec<u64> {
    let n = ne.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
    ne[..n.min(ne.len())].to_vec()
}

/// The plan llama-quantize would follow for `model`, in its processing (and output) order.
pub fn plan_model(model: &GgufModel, target: Target, opts: &QuantizeOptions) -> Result<Vec<PlanEntry>, QuantizeError> {
    let facts = ModelFacts::from_metadata(model.metadata())?;
    let tensors: Vec<PlanTensor> = model
        .tensors()
        .map(|(_, t)| PlanTensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            ty: t.ty,
        })
        .collect();
    let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    let order = plan::processing_order(&names);
    let mut popts = opts.plan.clone();
    popts.has_imatrix = opts.imatrix.is_some();
    let entries = plan::plan(&facts, &tensors, target, &popts)?;
    Ok(order.into_iter().map(|i| entries[i].clone()).collect())
}

/// The output metadata: input keys, then `general.quantization_version` and `general.file_type`
/// re-appended (gguf.cpp's set = remove + append), split keys removed.
pub fn output_metadata(input: &Metadata, file_type: u32) -> Metadata {
    let mut m = input.clone();
    for k in [
        gguf::keys::SPLIT_NO,
        gguf::keys::SPLIT_COUNT,
        gguf::keys::SPLIT_TENSORS_COUNT,
    ] {
        m.remove(k);
    }
    m.remove("general.quantization_version");
    m.insert("general.quantization_version", Value::U32(QUANTIZATION_VERSION));
    m.remove(gguf::keys::FILE_TYPE);
    m.insert(gguf::keys::FILE_TYPE, Value::U32(file_type));
    m
}

/// [`output_metadata`] plus the `quantize.imatrix.*` keys when an importance matrix is used.
pub fn output_metadata_with(input: &Metadata, file_type: u32, opts: &QuantizeOptions) -> Metadata {
    let mut m = output_metadata(input, file_type);
    if let Some(im) = &opts.imatrix {
        im.write_metadata(&mut m);
    }
    m
}

/// Check the plan against what llama-quantize refuses, before anything is written.
pub fn check_plan(entries: &[PlanEntry], opts: &QuantizeOptions) -> Result<(), QuantizeError> {
    for e in entries {
        if e.target == e.source {
            continue;
        }
        if e.requires_imatrix {
            match &opts.imatrix {
                None => {
                    return Err(QuantizeError::Invalid(format!(
                        "this quantization requires an importance matrix (--imatrix): tensor `{}` would be {}",
                        e.name, e.target
                    )))
                }
                Some(m) if !m.contains_key(&e.name) => {
                    return Err(QuantizeError::Invalid(format!(
                        "missing importance matrix for tensor `{}` in a very low-bit quantization ({})",
                        e.name, e.target
                    )))
                }
                _ => {}
            }
        }
        if e.source.is_quantized() && !opts.allow_requantize {
            return Err(QuantizeError::Invalid(format!(
                "requantizing from type {} is disabled (tensor `{}`); pass --allow-requantize",
                e.source, e.name
            )));
        }
        if quant::codec(e.target).and_then(|c| c.quantize).is_none() {
            return Err(QuantizeError::Invalid(format!(
                "hf2q cannot write ggml type {} (tensor `{}`)",
                e.target, e.name
            )));
        }
        if e.source != GgmlType::F32 && quant::codec(e.source).is_none() {
            return Err(QuantizeError::Invalid(format!(
                "hf2q cannot read ggml type {} (tensor `{}`)",
                e.source, e.name
            )));
        }
    }
    Ok(())
}

/// Quantize `input` to `output` (atomically). Returns the plan that was applied.
pub fn quantize_file(
    input: &Path,
    output: &Path,
    target: Target,
    opts: &QuantizeOptions,
) -> Result<Vec<PlanEntry>, QuantizeError> {
    quantize_file_with(input, output, target, opts, None)
}

/// [`quantize_file`] reporting its progress to `progress` before each tensor.
pub fn quantize_file_with(
    input: &Path,
    output: &Path,
    target: Target,
    opts: &QuantizeOptions,
    progress: Option<&crate::pipeline::Progress>,
) -> Result<Vec<PlanEntry>, QuantizeError> {
    let model = GgufModel::open(input)?;
    let entries = plan_model(&model, target, opts)?;
    check_plan(&entries, opts)?;
    let file_type = match target {
        Target::Ftype(f) => f,
        Target::Copy => model.metadata().get_u64(gguf::keys::FILE_TYPE).unwrap_or(0) as u32,
    };
    let metadata = output_metadata_with(model.metadata(), file_type, opts);
    let specs: Vec<TensorSpec> = entries
        .iter()
        .map(|e| {
            let (_, t) = model.tensor(&e.name).expect("planned from this model");
            TensorSpec {
                name: e.name.clone(),
                ty: e.target,
                shape: ggml_dims(&t.shape),
            }
        })
        .collect();
    let mut w = GgufWriter::create(output, &metadata, &specs)?;
    let mut tracker = crate::pipeline::ProgressTracker::new(progress, &specs);
    let mut f32_buf = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        tracker.tensor(i, &e.name);
        let (file, t) = model.tensor(&e.name).expect("planned from this model");
        let data = file.tensor_data(t);
        if e.target == e.source {
            w.write_data(data)?;
            continue;
        }
        let n_per_row = t.shape[0] as usize;
        let rows_per_expert = t.shape.get(1).copied().unwrap_or(1) as usize;
        let n_rows = (t.n_elements() / t.shape[0].max(1)) as usize;
        let src_row = quant::row_bytes(e.source, n_per_row).map_err(|err| QuantizeError::Invalid(err.to_string()))?;
        let dst_row = quant::row_bytes(e.target, n_per_row).map_err(|err| QuantizeError::Invalid(err.to_string()))?;
        let imatrix = opts.imatrix.as_ref().and_then(|m| m.get(&e.name));
        if let Some(im) = imatrix {
            let n_expert = t.shape.get(2).copied().unwrap_or(1) as usize;
            if im.len() != n_per_row * n_expert {
                return Err(QuantizeError::Invalid(format!(
                    "imatrix size {} is different from tensor size {} for {}",
                    im.len(),
                    n_per_row * n_expert,
                    e.name
                )));
            }
        }
        // Slabs never cross an expert boundary, so each uses one expert's importance weights.
        let slab_rows = (SLAB_VALUES / n_per_row.max(1)).clamp(1, rows_per_expert.max(1));
        let mut out = Vec::new();
        let mut row = 0;
        while row < n_rows {
            let expert = row / rows_per_expert;
            let end = (row + slab_rows).min((expert + 1) * rows_per_expert).min(n_rows);
            let src = &data[row * src_row..end * src_row];
            let values: &[f32] = if e.source == GgmlType::F32 {
                bytemuck::cast_slice(src)
            } else {
                f32_buf.resize((end - row) * n_per_row, 0.0);
                quant::dequantize_into(e.source, src, &mut f32_buf)
                    .map_err(|err| QuantizeError::Invalid(err.to_string()))?;
                &f32_buf
            };
            out.resize((end - row) * dst_row, 0);
            let im = imatrix.map(|m| &m[expert * n_per_row..(expert + 1) * n_per_row]);
            quant::quantize_into(e.target, values, &mut out, n_per_row, im)
                .map_err(|err| QuantizeError::Invalid(format!("tensor `{}`: {err}", e.name)))?;
            w.write_data(&out)?;
            row = end;
        }
    }
    w.finish()?;
    Ok(entries)
}
