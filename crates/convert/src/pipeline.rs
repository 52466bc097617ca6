//! `hf2q convert`: HF directory → GGUF in one streaming pass.
//!
//! F32/F16/BF16/Q8_0 follow `convert_hf_to_gguf.py --outtype` (its per-tensor type rules in
//! `ModelBase.prepare_tensors`). Every other file type gives what `convert_hf_to_gguf.py
//! --outtype bf16` followed by `llama-quantize` gives: the bf16 conversion is planned in memory,
//! then re-typed by [`crate::plan`] and written in llama-quantize's order with its metadata.
//!
//! Memory: tensor data is produced, converted and written one tensor at a time (the largest tensor
//! in f32 plus its quantized bytes); the input is memory-mapped.

use crate::arch::{self, Ctx, OutTensor};
use crate::hf::{HfConfig, HfError, HfTensors};
use crate::meta;
use crate::plan::{self, ModelFacts, PlanTensor, Target};
use crate::requant::{self, QuantizeError, QuantizeOptions};
use gguf::{GgmlType, GgufWriter, Metadata, TensorSpec, Value};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Hf(#[from] HfError),
    #[error(transparent)]
    Quantize(#[from] QuantizeError),
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
}

impl ConvertError {
    pub fn is_invalid_input(&self) -> bool {
        match self {
            ConvertError::Hf(HfError::Io { source, .. }) => source.kind() == std::io::ErrorKind::NotFound,
            ConvertError::Hf(_) => true,
            ConvertError::Quantize(e) => e.is_invalid_input(),
            ConvertError::Gguf(e) => e.is_invalid_input(),
        }
    }
}

/// What was written, for the summary and the report.
#[derive(Debug, Clone)]
pub struct ConvertSummary {
    pub architecture: String,
    pub hf_architecture: String,
    /// Every tensor as written, in file order.
    pub tensors: Vec<TensorStat>,
    pub notes: Vec<String>,
}

/// The `--outtype` file types of convert_hf_to_gguf.py that hf2q reproduces directly.
fn outtype(target: Target) -> Option<(u32, GgmlType)> {
    match target {
        Target::Ftype(0) => Some((0, GgmlType::F32)),
        Target::Ftype(1) => Some((1, GgmlType::F16)),
        Target::Ftype(32) => Some((32, GgmlType::BF16)),
        Target::Ftype(7) => Some((7, GgmlType::Q8_0)),
        _ => None,
    }
}

/// Tensors the converter always keeps in F32 (`prepare_tensors`: 1-D, norms, routers, positional
/// and token-type embeddings, conv1d state weights, and anything not ending in `.weight`).
fn forced_f32(name: &str, n_dims: usize) -> bool {
    const F32_PARTS: &[&str] = &[
        ".ffn_gate_inp.weight",
        ".ffn_gate_inp_shexp.weight",
        ".ssm_conv1d.weight",
        ".shortconv.conv.weight",
        ".time_mix_first.weight",
        ".time_mix_w1.weight",
        ".time_mix_w2.weight",
        ".time_mix_decay_w1.weight",
        ".time_mix_decay_w2.weight",
        ".time_mix_lerp_fused.weight",
        ".altup_correct_coef.weight",
        ".altup_predict_coef.weight",
        ".ssm_conv1d_q.weight",
        ".ssm_conv1d_k.weight",
        ".ssm_conv1d_v.weight",
        ".indexer.proj.weight",
    ];
    n_dims <= 1
        || name.ends_with("_norm.weight")
        || name == "position_embd.weight"
        || name == "token_types.weight"
        || F32_PARTS.iter().any(|p| name.contains(p))
        || !(name.ends_with(".weight") || name.ends_with(".lora_a") || name.ends_with(".lora_b"))
}

/// The type `convert_hf_to_gguf.py --outtype <ty>` gives a tensor.
fn outtype_tensor_type(ctx: &Ctx, family: &dyn arch::Family, t: &OutTensor, ty: GgmlType) -> GgmlType {
    if let Some((raw_ty, _)) = &t.raw {
        return *raw_ty;
    }
    let forced = family.force_type(ctx, t, ty);
    if t.shape.len() <= 1 || t.name.ends_with("_norm.weight") {
        return GgmlType::F32;
    }
    if let Some(f) = forced {
        return f;
    }
    if forced_f32(&t.name, t.shape.len()) {
        return GgmlType::F32;
    }
    // gguf-py refuses a Q8_0 row that is not a whole number of blocks; the converter falls back to F16.
    if ty == GgmlType::Q8_0 && t.shape.last().is_none_or(|&n| n % 32 != 0) {
        return GgmlType::F16;
    }
    ty
}

/// Cross-check tensor shapes against the hyper-parameters before anything is written.
fn validate(ctx: &Ctx, m: &Metadata, tensors: &[OutTensor]) -> Result<(), HfError> {
    let arch = m.architecture().unwrap_or_default();
    if let (Some(n_embd), Some(t)) = (
        m.get_u64(&format!("{arch}.embedding_length")),
        tensors.iter().find(|t| t.name == "token_embd.weight"),
    ) {
        if t.shape.len() != 2 || t.shape[1] as u64 != n_embd {
            return Err(ctx.invalid(format!(
                "tensor `{}` has shape {:?}, but config.json says hidden_size {n_embd} (expected [vocab, {n_embd}])",
                t.source, t.shape
            )));
        }
    }
    Ok(())
}

fn metadata(
    ctx: &mut Ctx,
    family: &dyn arch::Family,
    tensors: &[OutTensor],
    file_type: u32,
) -> Result<Metadata, HfError> {
    let arch_name = family.gguf_arch(ctx);
    let mut m = Metadata::new();
    m.insert(gguf::keys::ARCHITECTURE, Value::String(arch_name.into()));
    family.init_metadata(ctx, &mut m);
    m.insert("general.type", Value::String("model".into()));
    let (total, shared, expert, n_expert) =
        meta::parameter_counts(tensors.iter().map(|t| (t.name.as_str(), t.shape.as_slice())));
    let name_or_path = ctx
        .cfg
        .raw
        .get("_name_or_path")
        .and_then(|v| v.as_str())
        .map(String::from);
    let naming = meta::naming(&arch::dir_name(&ctx.dir), name_or_path.as_deref(), total as i64);
    let size_label = naming
        .size_label
        .clone()
        .or_else(|| (total > 0).then(|| meta::size_label(total, shared, expert, n_expert)));
    // Metadata.set_gguf_meta_model order
    let general = [
        ("general.name", naming.name.clone()),
        ("general.version", naming.version.clone()),
        ("general.organization", naming.organization.clone()),
        ("general.finetune", naming.finetune.clone()),
        ("general.basename", naming.basename.clone()),
        ("general.size_label", size_label),
    ];
    for (k, v) in general {
        if let Some(v) = v {
            m.insert(k, Value::String(v));
        }
    }
    family.set_parameters(ctx, &mut m, file_type)?;
    m.insert(
        "general.quantization_version",
        Value::U32(requant::QUANTIZATION_VERSION),
    );
    family.set_vocab(ctx, &mut m)?;
    validate(ctx, &m, tensors)?;
    Ok(m)
}

/// Open a model directory for conversion.
pub fn open(dir: &Path) -> Result<(Ctx, &'static dyn arch::Family), ConvertError> {
    let cfg = HfConfig::load(dir)?;
    let hf_arch = cfg
        .architecture()
        .ok_or_else(|| HfError::Invalid {
            path: cfg.path.clone(),
            problem: "config.json has no `architectures`".into(),
        })?
        .to_string();
    let family = arch::family_for(&hf_arch).ok_or_else(|| HfError::Invalid {
        path: cfg.path.clone(),
        problem: format!(
            "unsupported architecture `{hf_arch}` (this version converts: {})",
            arch::supported_architectures().join(", ")
        ),
    })?;
    let hf = HfTensors::open(dir)?;
    Ok((
        Ctx {
            dir: dir.to_path_buf(),
            cfg,
            hf,
            hf_arch,
            no_mtp: false,
            notes: Vec::new(),
        },
        family,
    ))
}

/// Convert `dir` to `out` with file type `target`.
pub fn convert(dir: &Path, out: &Path, target: Target, opts: &QuantizeOptions) -> Result<ConvertSummary, ConvertError> {
    convert_with(dir, out, target, opts, &ConvertOptions::default())
}

/// Called before each tensor is written: (index, count, name).
pub type Progress = Box<dyn Fn(usize, usize, &str) + Send + Sync>;

/// Options of `hf2q convert` beyond the file type.
#[derive(Default)]
pub struct ConvertOptions {
    /// Drop multi-token-prediction layers (`--no-mtp`).
    pub no_mtp: bool,
    /// Measure each tensor's quantization error (for `--report`).
    pub measure_error: bool,
    pub progress: Option<Progress>,
}

pub fn convert_with(
    dir: &Path,
    out: &Path,
    target: Target,
    opts: &QuantizeOptions,
    copts: &ConvertOptions,
) -> Result<ConvertSummary, ConvertError> {
    let (mut ctx, family) = open(dir)?;
    ctx.no_mtp = copts.no_mtp;
    let tensors = family.tensors(&ctx)?;
    // Validate shapes before anything is written: every tensor must be a whole number of rows.
    for t in &tensors {
        if t.shape.is_empty() && t.name != "rope_freqs.weight" {
            return Err(ctx
                .invalid(format!("tensor `{}` (from `{}`) has no dimensions", t.name, t.source))
                .into());
        }
    }
    let summary_arch = family.gguf_arch(&ctx).to_string();
    if let Some((file_type, ty)) = outtype(target) {
        let types: Vec<GgmlType> = tensors
            .iter()
            .map(|t| outtype_tensor_type(&ctx, family, t, ty))
            .collect();
        let file_type = family.file_type(&ctx, file_type);
        let m = metadata(&mut ctx, family, &tensors, file_type)?;
        let specs: Vec<TensorSpec> = tensors
            .iter()
            .zip(&types)
            .map(|(t, &ty)| TensorSpec {
                name: t.name.clone(),
                ty,
                shape: t.ne(),
            })
            .collect();
        let items: Vec<Item> = tensors
            .iter()
            .zip(specs)
            .map(|(t, spec)| Item {
                t,
                spec,
                intermediate: None,
            })
            .collect();
        let stats = write_tensors(&ctx, out, &m, &items, opts, copts)?;
        return Ok(summary(&ctx, summary_arch, stats));
    }
    // Planned bf16 conversion, then llama-quantize.
    let Target::Ftype(ftype) = target else {
        return Err(ctx
            .invalid("COPY is not a conversion target; use bf16, f16 or f32")
            .into());
    };
    let bf16_types: Vec<GgmlType> = tensors
        .iter()
        .map(|t| outtype_tensor_type(&ctx, family, t, GgmlType::BF16))
        .collect();
    let bf16_file_type = family.file_type(&ctx, 32);
    let bf16_meta = metadata(&mut ctx, family, &tensors, bf16_file_type)?;
    let facts = ModelFacts::from_metadata(&bf16_meta).map_err(QuantizeError::from)?;
    let ptensors: Vec<PlanTensor> = tensors
        .iter()
        .zip(&bf16_types)
        .map(|(t, &ty)| PlanTensor {
            name: t.name.clone(),
            shape: t.ne(),
            ty,
        })
        .collect();
    let mut popts = opts.plan.clone();
    popts.has_imatrix = opts.imatrix.is_some();
    let entries = plan::plan(&facts, &ptensors, target, &popts).map_err(QuantizeError::from)?;
    // Tensors the converter itself writes in a fixed quantized type (e.g. DeepSeek-V4's MXFP4 experts)
    // are requantized from their stored values: `hf2q convert --quant T` gives what
    // `llama-quantize --allow-requantize` makes of the bf16 conversion (plain llama-quantize refuses).
    let checked: Vec<plan::PlanEntry> = entries
        .iter()
        .zip(&tensors)
        .map(|(e, t)| {
            let mut e = e.clone();
            if t.raw.is_some() && e.source.is_quantized() {
                e.source = GgmlType::F32;
            }
            e
        })
        .collect();
    requant::check_plan(&checked, opts)?;
    let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    let order = plan::processing_order(&names);
    let m = requant::output_metadata_with(&bf16_meta, ftype, opts);
    let items: Vec<Item> = order
        .iter()
        .map(|&i| Item {
            t: &tensors[i],
            spec: TensorSpec {
                name: tensors[i].name.clone(),
                ty: entries[i].target,
                shape: requant::ggml_dims(&tensors[i].ne()),
            },
            intermediate: Some(bf16_types[i]),
        })
        .collect();
    let stats = write_tensors(&ctx, out, &m, &items, opts, copts)?;
    Ok(summary(&ctx, summary_arch, stats))
}

fn summary(ctx: &Ctx, architecture: String, tensors: Vec<TensorStat>) -> ConvertSummary {
    ConvertSummary {
        architecture,
        hf_architecture: ctx.hf_arch.clone(),
        tensors,
        notes: ctx.notes.clone(),
    }
}

/// Convert one tensor's f32 data to `ty` bytes, with an optional importance matrix.
fn encode(
    name: &str,
    data: &[f32],
    ne: &[u64],
    ty: GgmlType,
    imatrix: Option<&[f32]>,
) -> Result<Vec<u8>, QuantizeError> {
    let n_per_row = ne.first().copied().unwrap_or(1).max(1) as usize;
    let rows_per_expert = ne.get(1).copied().unwrap_or(1) as usize;
    if let (Some(im), true) = (imatrix, ne.len() >= 3) {
        // Per-expert importance weights: quantize expert by expert.
        let mut out = Vec::new();
        for (e, chunk) in data.chunks(n_per_row * rows_per_expert).enumerate() {
            let w = &im[e * n_per_row..(e + 1) * n_per_row];
            out.extend(
                quant::quantize(ty, chunk, n_per_row, Some(w))
                    .map_err(|err| QuantizeError::Invalid(format!("tensor `{name}`: {err}")))?,
            );
        }
        return Ok(out);
    }
    quant::quantize(ty, data, n_per_row, imatrix)
        .map_err(|err| QuantizeError::Invalid(format!("tensor `{name}`: {err}")))
}

fn check_len(ctx: &Ctx, t: &OutTensor, data: &[f32]) -> Result<(), HfError> {
    let n: usize = t.shape.iter().product();
    if data.len() != n {
        return Err(ctx.invalid(format!(
            "tensor `{}` (from `{}`): expected {n} values for shape {:?}, got {}",
            t.name,
            t.source,
            t.shape,
            data.len()
        )));
    }
    Ok(())
}

/// One tensor as written, for the report.
#[derive(Debug, Clone)]
pub struct TensorStat {
    pub name: String,
    pub ty: GgmlType,
    pub ne: Vec<u64>,
    pub bytes: u64,
    /// Root-mean-square error of the stored values against the f32 values they came from
    /// (only computed when [`ConvertOptions::measure_error`] is set).
    pub rmse: Option<f64>,
}

struct Item<'a> {
    t: &'a OutTensor,
    spec: TensorSpec,
    /// The type of the planned bf16 conversion this tensor is requantized from (llama-quantize path).
    intermediate: Option<GgmlType>,
}

/// Values converted per slab when a tensor is streamed from the checkpoint (64 MiB of f32).
const SLAB_VALUES: usize = 16 << 20;

/// Convert an unmodified checkpoint tensor slab by slab: bounded memory whatever its size.
fn stream_rows(
    ctx: &Ctx,
    w: &mut GgufWriter,
    item: &Item,
    src: &str,
    opts: &QuantizeOptions,
    copts: &ConvertOptions,
) -> Result<TensorStat, ConvertError> {
    let (t, s) = (item.t, &item.spec);
    let h = ctx
        .hf
        .get(src)
        .ok_or_else(|| ctx.invalid(format!("tensor `{src}` disappeared")))?;
    let total: usize = t.shape.iter().product();
    if h.n_elements() != total {
        return Err(ctx
            .invalid(format!(
                "tensor `{src}` has shape {:?}, expected {:?}",
                h.shape, t.shape
            ))
            .into());
    }
    let n_per_row = t.shape.last().copied().unwrap_or(1).max(1);
    let n_rows = total / n_per_row;
    let slab_rows = (SLAB_VALUES / n_per_row).max(1);
    let im = match item.intermediate {
        Some(mid) if s.ty != mid => opts.imatrix.as_ref().and_then(|m| m.get(&t.name)).map(|v| v.as_slice()),
        _ => None,
    };
    let (mut sq, mut bytes_total) = (0f64, 0u64);
    let mut r0 = 0;
    while r0 < n_rows {
        let r1 = (r0 + slab_rows).min(n_rows);
        let mut data = ctx.hf.f32_range(h, r0 * n_per_row, r1 * n_per_row)?;
        let source = copts.measure_error.then(|| data.clone());
        if item.intermediate == Some(GgmlType::BF16) {
            // The values llama-quantize would read back from the bf16 conversion.
            for v in data.iter_mut() {
                *v = quant::fp::bf16_to_f32(quant::fp::f32_to_bf16(*v));
            }
        }
        let bytes = encode(&t.name, &data, &[n_per_row as u64, (r1 - r0) as u64], s.ty, im)?;
        if let Some(src) = &source {
            let back = quant::dequantize(s.ty, &bytes, src.len()).map_err(|e| QuantizeError::Invalid(e.to_string()))?;
            sq += src
                .iter()
                .zip(&back)
                .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
                .sum::<f64>();
        }
        w.write_data(&bytes)?;
        ctx.hf.release_elements(h, r0 * n_per_row, r1 * n_per_row);
        bytes_total += bytes.len() as u64;
        r0 = r1;
    }
    ctx.hf.release(h);
    let rmse = copts.measure_error.then(|| (sq / total.max(1) as f64).sqrt());
    Ok(TensorStat {
        name: t.name.clone(),
        ty: s.ty,
        ne: s.shape.clone(),
        bytes: bytes_total,
        rmse,
    })
}

fn rmse(a: &[f32], b: &[f32]) -> f64 {
    let sum: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum();
    (sum / a.len().max(1) as f64).sqrt()
}

fn write_tensors(
    ctx: &Ctx,
    out: &Path,
    m: &Metadata,
    items: &[Item],
    opts: &QuantizeOptions,
    copts: &ConvertOptions,
) -> Result<Vec<TensorStat>, ConvertError> {
    let specs: Vec<TensorSpec> = items.iter().map(|i| i.spec.clone()).collect();
    let mut w = GgufWriter::create(out, m, &specs)?;
    let mut stats = Vec::with_capacity(items.len());
    for (n, item) in items.iter().enumerate() {
        let (t, s) = (item.t, &item.spec);
        // Overlap reading the next tensor from disk with converting this one.
        if let Some(h) = items
            .get(n + 1)
            .and_then(|next| ctx.hf.get(next.t.rows_from.as_deref().unwrap_or(&next.t.source)))
        {
            ctx.hf.prefetch(h);
        }
        if let Some(p) = &copts.progress {
            p(n, items.len(), &t.name);
        }
        if let Some((raw_ty, make_raw)) = &t.raw {
            if *raw_ty == s.ty {
                let bytes = make_raw(&ctx.hf)?;
                w.write_tensor(&bytes)?;
                stats.push(TensorStat {
                    name: t.name.clone(),
                    ty: s.ty,
                    ne: s.shape.clone(),
                    bytes: bytes.len() as u64,
                    rmse: None,
                });
                continue;
            }
        }
        if let (Some(src), None, true) = (&t.rows_from, &t.raw, t.shape.len() <= 2) {
            let stat = stream_rows(ctx, &mut w, item, src, opts, copts)?;
            stats.push(stat);
            continue;
        }
        let mut data = (t.make)(&ctx.hf)?;
        if let Some(h) = ctx.hf.get(&t.source) {
            ctx.hf.release(h);
        }
        check_len(ctx, t, &data)?;
        let source = copts.measure_error.then(|| data.clone());
        let mut im = None;
        if let Some(mid) = item.intermediate {
            if mid == GgmlType::BF16 {
                // The values llama-quantize would read back from the bf16 conversion.
                for v in data.iter_mut() {
                    *v = quant::fp::bf16_to_f32(quant::fp::f32_to_bf16(*v));
                }
            } else if let Some((raw_ty, make_raw)) = &t.raw {
                // Requantized from the stored type, as llama-quantize --allow-requantize does.
                data = quant::dequantize(*raw_ty, &make_raw(&ctx.hf)?, data.len())
                    .map_err(|e| QuantizeError::Invalid(format!("tensor `{}`: {e}", t.name)))?;
            }
            if s.ty != mid {
                im = opts.imatrix.as_ref().and_then(|m| m.get(&t.name)).map(|v| v.as_slice());
            }
        }
        let bytes = encode(&t.name, &data, &s.shape, s.ty, im)?;
        let err = match &source {
            Some(src) => Some(rmse(
                src,
                &quant::dequantize(s.ty, &bytes, src.len()).map_err(|e| QuantizeError::Invalid(e.to_string()))?,
            )),
            None => None,
        };
        w.write_tensor(&bytes)?;
        stats.push(TensorStat {
            name: t.name.clone(),
            ty: s.ty,
            ne: s.shape.clone(),
            bytes: bytes.len() as u64,
            rmse: err,
        });
    }
    w.finish()?;
    Ok(stats)
}
