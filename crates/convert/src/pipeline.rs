//! `hf2q convert`: HF directory → GGUF in one streaming pass.
//!
//! F32/F16/BF16/Q8_0 follow `convert_hf_to_gguf.py --outtype` (its per-tensor type rules in
//! `ModelBase.prepare_tensors`). Every other file type gives what `convert_hf_to_gguf.py
//! --outtype T` followed by `llama-quantize` gives, with T the checkpoint's own precision, so that
//! nothing is rounded on the way: bf16 when its matrices are all BF16, f16 when they are all F16,
//! f32 otherwise. That conversion is planned in memory, then re-typed by [`crate::plan`] and
//! written in llama-quantize's order with its metadata.
//!
//! Memory: tensor data is produced, converted and written one tensor at a time (the largest tensor
//! in f32 plus its quantized bytes); the input is memory-mapped.

use crate::arch::{self, Ctx, OutTensor};
use crate::hf::{HfConfig, HfError, HfTensors};
use crate::meta;
use crate::plan::{self, ModelFacts, PlanTensor, Target};
use crate::requant::{self, QuantizeError, QuantizeOptions};
use gguf::Tensor as T;
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
        || name == T::PositionEmbd.weight()
        || name == T::TokenTypes.weight()
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
        tensors.iter().find(|t| t.name == T::TokenEmbd.weight()),
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
    let arch_name = family.gguf_arch(ctx).name();
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
    // metadata.py: the model card's fields first, then `_name_or_path`, then the directory name.
    let card = meta::ModelCard::load(&ctx.dir);
    let naming = meta::naming_from(
        meta::card_naming(&card),
        &arch::dir_name(&ctx.dir),
        name_or_path.as_deref(),
        total as i64,
    );
    let size_label = naming
        .size_label
        .clone()
        .or_else(|| (total > 0).then(|| meta::size_label(total, shared, expert, n_expert)));
    // Metadata.set_gguf_meta_model order: sampling defaults, then the general.* fields.
    for (k, v) in meta::sampling_metadata(&ctx.dir) {
        m.insert(k, v);
    }
    for (k, v) in meta::general_metadata(&card, &naming, size_label, total as i64) {
        m.insert(k, v);
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

/// Where a conversion stands, reported before each tensor is written.
pub struct ProgressEvent<'a> {
    /// Index of the tensor about to be written, and the number of tensors.
    pub tensor: usize,
    pub tensors: usize,
    /// Output tensor data written so far, and in all.
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub name: &'a str,
}

/// Receives a [`ProgressEvent`] before each tensor is written.
pub type Progress = Box<dyn Fn(&ProgressEvent) + Send + Sync>;

/// Calls `progress` (if any) before each of `specs` is written, with the output bytes so far.
pub(crate) struct ProgressTracker<'a> {
    progress: Option<&'a Progress>,
    sizes: Vec<u64>,
    total: u64,
    done: u64,
}

impl<'a> ProgressTracker<'a> {
    pub(crate) fn new(progress: Option<&'a Progress>, specs: &[TensorSpec]) -> Self {
        let sizes: Vec<u64> = specs
            .iter()
            .map(|s| {
                let rows: u64 = s.shape.iter().skip(1).product();
                let first = s.shape.first().copied().unwrap_or(1);
                s.ty.row_bytes(first).unwrap_or(0) * rows
            })
            .collect();
        let total = sizes.iter().sum();
        ProgressTracker {
            progress,
            sizes,
            total,
            done: 0,
        }
    }

    /// Tensor `i` (with the name `name`) is about to be written.
    pub(crate) fn tensor(&mut self, i: usize, name: &str) {
        if let Some(p) = self.progress {
            p(&ProgressEvent {
                tensor: i,
                tensors: self.sizes.len(),
                bytes_done: self.done,
                bytes_total: self.total,
                name,
            });
        }
        self.done += self.sizes.get(i).copied().unwrap_or(0);
    }
}

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
        if t.shape.is_empty() && t.name != T::RopeFreqs.weight() {
            return Err(ctx
                .invalid(format!("tensor `{}` (from `{}`) has no dimensions", t.name, t.source))
                .into());
        }
    }
    let summary_arch = family.gguf_arch(&ctx).name().to_string();
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
    let (mid, mid_ftype) = lossless_outtype(&ctx);
    let bf16_types: Vec<GgmlType> = tensors
        .iter()
        .map(|t| outtype_tensor_type(&ctx, family, t, mid))
        .collect();
    let bf16_file_type = family.file_type(&ctx, mid_ftype);
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

/// The `--outtype` that keeps the checkpoint's values exactly (and its file type id): bf16 when
/// every floating-point matrix is BF16, f16 when every one is F16, else f32.
fn lossless_outtype(ctx: &Ctx) -> (GgmlType, u32) {
    use safetensors::Dtype;
    let floats: Vec<Dtype> = ctx
        .hf
        .tensors()
        .iter()
        .filter(|t| t.shape.len() >= 2 && matches!(t.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16))
        .map(|t| t.dtype)
        .collect();
    if !floats.is_empty() && floats.iter().all(|&d| d == Dtype::BF16) {
        (GgmlType::BF16, 32)
    } else if !floats.is_empty() && floats.iter().all(|&d| d == Dtype::F16) {
        (GgmlType::F16, 1)
    } else {
        (GgmlType::F32, 0)
    }
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
    /// The type of the planned lossless conversion this tensor is requantized from (llama-quantize path).
    intermediate: Option<GgmlType>,
}

/// Values converted per slab when a tensor is streamed from the checkpoint (16 MiB of f32; the
/// reader thread keeps at most three slabs in flight).
const SLAB_VALUES: usize = 4 << 20;

/// Data read for one tensor (or one slab of a streamed tensor), ahead of its conversion.
enum Loaded {
    /// Bytes written as they are (a tensor kept in its fixed type).
    Raw(Vec<u8>),
    /// The whole tensor's f32 values, plus its stored bytes when it is requantized from a fixed type.
    Whole(Vec<f32>, Option<Vec<u8>>),
    /// Rows `[r0, r1)` of an unmodified checkpoint tensor; `exact` when the checkpoint stores it in
    /// the intermediate's type (its values then survive that conversion unchanged).
    Slab {
        r0: usize,
        r1: usize,
        data: Vec<f32>,
        exact: bool,
    },
}

fn streamable(item: &Item) -> bool {
    item.t.rows_from.is_some() && item.t.raw.is_none() && item.t.shape.len() <= 2
}

fn row_split(t: &OutTensor) -> (usize, usize, usize) {
    let total: usize = t.shape.iter().product();
    let n_per_row = t.shape.last().copied().unwrap_or(1).max(1);
    (total / n_per_row, n_per_row, (SLAB_VALUES / n_per_row).max(1))
}

/// Read every item's data in order (run on its own thread, one step ahead of the conversion).
fn produce(ctx: &Ctx, items: &[Item], tx: std::sync::mpsc::SyncSender<Result<Loaded, ConvertError>>) {
    let load =
        |item: &Item, tx: &std::sync::mpsc::SyncSender<Result<Loaded, ConvertError>>| -> Result<bool, ConvertError> {
            let (t, s) = (item.t, &item.spec);
            if let Some((raw_ty, make_raw)) = &t.raw {
                if *raw_ty == s.ty {
                    return Ok(tx.send(Ok(Loaded::Raw(make_raw(&ctx.hf)?))).is_ok());
                }
            }
            if streamable(item) {
                let src = t.rows_from.as_deref().expect("streamable");
                let h = ctx
                    .hf
                    .get(src)
                    .ok_or_else(|| ctx.invalid(format!("tensor `{src}` disappeared")))?;
                if h.n_elements() != t.shape.iter().product::<usize>() {
                    return Err(ctx
                        .invalid(format!(
                            "tensor `{src}` has shape {:?}, expected {:?}",
                            h.shape, t.shape
                        ))
                        .into());
                }
                let (n_rows, n_per_row, slab_rows) = row_split(t);
                let mut r0 = 0;
                loop {
                    let r1 = (r0 + slab_rows).min(n_rows);
                    let data = ctx.hf.f32_range(h, r0 * n_per_row, r1 * n_per_row)?;
                    ctx.hf.release_elements(h, r0 * n_per_row, r1 * n_per_row);
                    let exact = match item.intermediate {
                        Some(GgmlType::BF16) => h.dtype == safetensors::Dtype::BF16,
                        Some(GgmlType::F16) => h.dtype == safetensors::Dtype::F16,
                        _ => true,
                    };
                    if tx.send(Ok(Loaded::Slab { r0, r1, data, exact })).is_err() {
                        return Ok(false);
                    }
                    r0 = r1;
                    if r0 >= n_rows {
                        return Ok(true);
                    }
                }
            }
            let data = (t.make)(&ctx.hf)?;
            let raw = match (&t.raw, item.intermediate) {
                (Some((_, make_raw)), Some(mid)) if !matches!(mid, GgmlType::BF16 | GgmlType::F16 | GgmlType::F32) => {
                    Some(make_raw(&ctx.hf)?)
                }
                _ => None,
            };
            if let Some(h) = ctx.hf.get(&t.source) {
                ctx.hf.release(h);
            }
            Ok(tx.send(Ok(Loaded::Whole(data, raw))).is_ok())
        };
    for item in items {
        match load(item, &tx) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        }
    }
}

/// The values llama-quantize would read back from an intermediate conversion to `mid`.
fn round_to(mid: Option<GgmlType>, data: &mut [f32]) {
    match mid {
        Some(GgmlType::BF16) => {
            for v in data.iter_mut() {
                *v = quant::fp::bf16_to_f32(quant::fp::f32_to_bf16(*v));
            }
        }
        Some(GgmlType::F16) => {
            for v in data.iter_mut() {
                *v = quant::fp::f16_to_f32(quant::fp::f32_to_f16(*v));
            }
        }
        _ => {}
    }
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
    let (tx, rx) = std::sync::mpsc::sync_channel(2);
    std::thread::scope(|scope| -> Result<(), ConvertError> {
        scope.spawn(|| produce(ctx, items, tx));
        let next = || {
            rx.recv()
                .map_err(|_| ctx.invalid("reading the input stopped unexpectedly"))?
        };
        let mut tracker = ProgressTracker::new(copts.progress.as_ref(), &specs);
        for (n, item) in items.iter().enumerate() {
            let (t, s) = (item.t, &item.spec);
            tracker.tensor(n, &t.name);
            let im = match item.intermediate {
                Some(mid) if s.ty != mid => opts.imatrix.as_ref().and_then(|m| m.get(&t.name)).map(|v| v.as_slice()),
                _ => None,
            };
            let (mut sq, mut count, mut total_bytes, mut measured) = (0f64, 0usize, 0u64, false);
            let mut convert = |data: &[f32], source: Option<&[f32]>, ne: &[u64]| -> Result<Vec<u8>, ConvertError> {
                let bytes = encode(&t.name, data, ne, s.ty, im)?;
                if let Some(src) = source {
                    let back = quant::dequantize(s.ty, &bytes, src.len())
                        .map_err(|e| QuantizeError::Invalid(e.to_string()))?;
                    sq += src
                        .iter()
                        .zip(&back)
                        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
                        .sum::<f64>();
                    count += src.len();
                    measured = true;
                }
                Ok(bytes)
            };
            match next()? {
                Loaded::Raw(bytes) => {
                    w.write_tensor(&bytes)?;
                    total_bytes = bytes.len() as u64;
                }
                Loaded::Whole(mut data, raw) => {
                    check_len(ctx, t, &data)?;
                    let source = copts.measure_error.then(|| data.clone());
                    if matches!(item.intermediate, Some(GgmlType::BF16 | GgmlType::F16)) {
                        round_to(item.intermediate, &mut data);
                    } else if let (Some((raw_ty, _)), Some(bytes)) = (&t.raw, raw) {
                        // Requantized from the stored type, as llama-quantize --allow-requantize does.
                        data = quant::dequantize(*raw_ty, &bytes, data.len())
                            .map_err(|e| QuantizeError::Invalid(format!("tensor `{}`: {e}", t.name)))?;
                    }
                    let bytes = convert(&data, source.as_deref(), &s.shape)?;
                    w.write_tensor(&bytes)?;
                    total_bytes = bytes.len() as u64;
                }
                Loaded::Slab {
                    mut r0,
                    mut r1,
                    mut data,
                    exact,
                } => {
                    let (n_rows, n_per_row, _) = row_split(t);
                    loop {
                        let source = copts.measure_error.then(|| data.clone());
                        if !exact {
                            round_to(item.intermediate, &mut data);
                        }
                        let bytes = convert(&data, source.as_deref(), &[n_per_row as u64, (r1 - r0) as u64])?;
                        w.write_data(&bytes)?;
                        total_bytes += bytes.len() as u64;
                        if r1 >= n_rows {
                            break;
                        }
                        match next()? {
                            Loaded::Slab {
                                r0: a, r1: b, data: d, ..
                            } => (r0, r1, data) = (a, b, d),
                            _ => {
                                return Err(ctx
                                    .invalid(format!("tensor `{}`: slab stream out of order", t.name))
                                    .into())
                            }
                        }
                    }
                }
            }
            let rmse = measured.then(|| (sq / count.max(1) as f64).sqrt());
            stats.push(TensorStat {
                name: t.name.clone(),
                ty: s.ty,
                ne: s.shape.clone(),
                bytes: total_bytes,
                rmse,
            });
        }
        Ok(())
    })?;
    w.finish()?;
    Ok(stats)
}
