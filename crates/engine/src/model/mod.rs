//! Model graphs, one file per architecture family, and the table that maps a GGUF
//! `general.architecture` to its graph.

pub mod batch;
pub mod bert;
pub mod blocks;
pub mod gemma;
pub mod llama;
pub mod qwen35;
pub mod qwen3moe;

pub use batch::{decode_greedy, HiddenRows, KvLayer, Logits, Model, ModelInfo, RecurrentLayer, Scratch, SeqStep, PAGE};
pub use bert::{l2_normalize, Pooling};

use crate::backend::{Backend, KvType, Rope, WeightSource};
use crate::{EngineError, Result};
use gguf::arch::key;
use gguf::{GgufModel, Metadata};
use std::path::Path;
use std::sync::Arc;

/// What a graph needs from the GGUF metadata of a decoder-only model.
#[derive(Clone, Debug)]
pub struct DecoderParams {
    pub arch: String,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub eps: f32,
    pub n_ctx_train: usize,
    pub rope: Rope,
}

/// The graph that runs an architecture (one file per family).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Llama,
    Qwen3Moe,
    Gemma3,
    Gemma4,
    /// Qwen 3.5 / 3.6 hybrids (Gated DeltaNet + gated attention).
    Qwen35,
}

/// One row of the engine's side of the architecture table (`gguf::Arch`, shared with convert):
/// the graph that runs it and how it wants its rope.
pub struct Arch {
    pub arch: gguf::Arch,
    pub family: Family,
    /// NeoX-style rotation (rotates i with i + n_rot/2) instead of adjacent pairs.
    pub rope_neox: bool,
}

const fn row(arch: gguf::Arch, family: Family, rope_neox: bool) -> Arch {
    Arch {
        arch,
        family,
        rope_neox,
    }
}

/// Decoder architectures the engine runs (llama.cpp's `llama_model_rope_type` gives the rope style).
pub const ARCHITECTURES: &[Arch] = &[
    row(gguf::Arch::Llama, Family::Llama, false),
    row(gguf::Arch::Qwen2, Family::Llama, true),
    row(gguf::Arch::Qwen3, Family::Llama, true),
    row(gguf::Arch::Qwen3Moe, Family::Qwen3Moe, true),
    row(gguf::Arch::Gemma3, Family::Gemma3, true),
    row(gguf::Arch::Gemma4, Family::Gemma4, true),
    row(gguf::Arch::Qwen35, Family::Qwen35, true),
    row(gguf::Arch::Qwen35Moe, Family::Qwen35, true),
];

/// An embedding model (encoder) of any family in [`ENCODERS`], held by `embed` and the server's
/// `/v1/embeddings` without naming the family.
pub trait Encoder<B: Backend>: Send + Sync {
    /// Width of the vectors.
    fn n_embd(&self) -> usize;
    /// The most tokens one input may have.
    fn n_ctx_train(&self) -> usize;
    /// One pooled vector per input (L2-normalised when `normalize`), the inputs batched together,
    /// pooled as the model says or as `pooling` overrides; [`Pooling::None`]: each input's token
    /// states (`n_embd` per token), never normalised.
    fn embed(&self, inputs: &[Vec<u32>], pooling: Option<Pooling>, normalize: bool) -> Result<Vec<Vec<f32>>>;
}

impl<B: Backend> Encoder<B> for bert::Bert<B> {
    fn n_embd(&self) -> usize {
        self.n_embd
    }
    fn n_ctx_train(&self) -> usize {
        self.n_ctx_train
    }
    fn embed(&self, inputs: &[Vec<u32>], pooling: Option<Pooling>, normalize: bool) -> Result<Vec<Vec<f32>>> {
        bert::Bert::embed(self, inputs, pooling, normalize)
    }
}

/// Encoder architectures the engine runs (one graph, `bert.rs`).
pub const ENCODERS: &[gguf::Arch] = &[gguf::Arch::Bert, gguf::Arch::NomicBert];

/// Whether a GGUF architecture is an encoder (served by `/v1/embeddings`, not by the text routes).
pub fn is_encoder(arch_name: &str) -> bool {
    ENCODERS.iter().any(|a| a.name() == arch_name)
}

/// Load an encoder of any family in [`ENCODERS`].
pub fn load_encoder<B: Backend>(backend: Arc<B>, gguf: &Arc<GgufModel>, path: &Path) -> Result<Box<dyn Encoder<B>>> {
    let arch_name = gguf.metadata().architecture().unwrap_or_default();
    if !is_encoder(arch_name) {
        let known: Vec<_> = ENCODERS.iter().map(|a| a.name()).collect();
        return Err(EngineError::Unsupported(format!(
            "{}: architecture {arch_name:?} is not an embedding model (embedding models: {})",
            path.display(),
            known.join(", ")
        )));
    }
    backend.reserve_weights(gguf.total_bytes(), &path.display().to_string())?;
    Ok(Box::new(bert::Bert::load(backend, gguf, path)?))
}

/// Load a decoder of any family in the table.
pub fn load<B: Backend>(backend: Arc<B>, gguf: &Arc<GgufModel>, path: &Path) -> Result<Box<dyn Model<B>>> {
    let arch_name = gguf.metadata().architecture().unwrap_or_default();
    let a = arch(arch_name).ok_or_else(|| unsupported(arch_name, path))?;
    backend.reserve_weights(gguf.total_bytes(), &path.display().to_string())?;
    Ok(match a.family {
        Family::Llama => Box::new(llama::Llama::load(backend, gguf, path)?),
        Family::Qwen3Moe => Box::new(qwen3moe::load(backend, gguf, path)?),
        Family::Gemma3 | Family::Gemma4 => Box::new(gemma::Gemma::load(backend, gguf, path)?),
        Family::Qwen35 => Box::new(qwen35::Qwen35::load(backend, gguf, path)?),
    })
}

fn unsupported(arch_name: &str, path: &Path) -> EngineError {
    let known: Vec<_> = ARCHITECTURES.iter().map(|a| a.arch.name()).collect();
    EngineError::Unsupported(format!(
        "{}: architecture {arch_name:?} is not supported by the engine yet (supported: {})",
        path.display(),
        known.join(", ")
    ))
}

pub fn arch(name: &str) -> Option<&'static Arch> {
    ARCHITECTURES.iter().find(|a| a.arch.name() == name)
}

/// Reads `{arch}.*` metadata keys, naming the file when one is missing.
pub(crate) struct Keys<'a> {
    pub meta: &'a Metadata,
    pub arch: &'a str,
    pub path: &'a Path,
}

impl Keys<'_> {
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    pub fn u(&self, k: &str) -> Result<usize> {
        let key = self.key(k);
        self.meta
            .get_u64(&key)
            .map(|v| v as usize)
            .ok_or_else(|| self.missing(&key))
    }
    pub fn u_or(&self, k: &str, d: usize) -> usize {
        self.meta.get_u64(&self.key(k)).map_or(d, |v| v as usize)
    }
    pub fn f_or(&self, k: &str, d: f32) -> f32 {
        self.meta.get_f64(&self.key(k)).map_or(d, |v| v as f32)
    }
    fn missing(&self, key: &str) -> EngineError {
        EngineError::Model(format!(
            "{}: metadata key {key} is missing or not an integer",
            self.path.display()
        ))
    }
}

impl DecoderParams {
    pub fn info(&self) -> ModelInfo {
        ModelInfo {
            arch: self.arch.clone(),
            n_vocab: self.n_vocab,
            n_embd: self.n_embd,
            n_layer: self.n_layer,
            n_ctx_train: self.n_ctx_train,
        }
    }

    pub fn from_metadata(meta: &Metadata, path: &Path) -> Result<DecoderParams> {
        let arch_name = meta
            .architecture()
            .ok_or_else(|| EngineError::Model(format!("{}: general.architecture is missing", path.display())))?;
        let a = arch(arch_name).ok_or_else(|| unsupported(arch_name, path))?;
        let k = Keys {
            meta,
            arch: arch_name,
            path,
        };
        let n_embd = k.u(key::EMBEDDING_LENGTH)?;
        let n_head = k.u(key::ATTN_HEAD_COUNT)?;
        let n_head_kv = k.u_or(key::ATTN_HEAD_COUNT_KV, n_head);
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(EngineError::Model(format!(
                "{}: {n_head} attention heads cannot share {n_head_kv} KV heads",
                path.display()
            )));
        }
        let head_dim = k.u_or(key::ATTN_KEY_LENGTH, n_embd / n_head);
        let n_rot = k.u_or(key::ROPE_DIMENSION_COUNT, head_dim);
        if n_rot > head_dim || !n_rot.is_multiple_of(2) {
            return Err(EngineError::Model(format!(
                "{}: rope dimension {n_rot} does not fit heads of {head_dim}",
                path.display()
            )));
        }
        let n_vocab = meta
            .get_array("tokenizer.ggml.tokens")
            .map(|a| a.len())
            .or_else(|| meta.get_u64(&k.key(key::VOCAB_SIZE)).map(|v| v as usize))
            .ok_or_else(|| EngineError::Model(format!("{}: no tokenizer.ggml.tokens", path.display())))?;
        let n_ctx_train = k.u_or(key::CONTEXT_LENGTH, 4096);
        let scaling = meta.get_str(&k.key(key::ROPE_SCALING_TYPE)).unwrap_or("none");
        let factor = k.f_or(key::ROPE_SCALING_FACTOR, 0.0);
        let freq_scale = if matches!(scaling, "linear" | "yarn") && factor > 0.0 {
            1.0 / factor
        } else {
            1.0
        };
        // llama.cpp llama-model.cpp / llama-context.cpp: YaRN gets ext_factor 1 and its own attn factor.
        let ext_factor = if scaling == "yarn" { 1.0 } else { 0.0 };
        let rope = Rope {
            n_dims: n_rot,
            neox: a.rope_neox,
            freq_base: k.f_or(key::ROPE_FREQ_BASE, 10000.0),
            freq_scale,
            ext_factor,
            attn_factor: k.f_or(key::ROPE_SCALING_ATTN_FACTOR, 1.0),
            beta_fast: k.f_or(key::ROPE_SCALING_YARN_BETA_FAST, 32.0),
            beta_slow: k.f_or(key::ROPE_SCALING_YARN_BETA_SLOW, 1.0),
            n_ctx_orig: k.u_or(key::ROPE_SCALING_ORIG_CTX_LEN, n_ctx_train),
            freq_factors: None,
        };
        Ok(DecoderParams {
            arch: arch_name.to_string(),
            n_vocab,
            n_embd,
            n_layer: k.u(key::BLOCK_COUNT)?,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: k.u(key::FEED_FORWARD_LENGTH)?,
            eps: k.f_or(key::ATTN_LAYERNORM_RMS_EPS, 1e-5),
            n_ctx_train,
            rope,
        })
    }
}

/// The gate and up halves of a fused expert stack, one weight per expert each.
pub(crate) type GateUp<B> = (Vec<<B as Backend>::Weight>, Vec<<B as Backend>::Weight>);

/// Loads named tensors from a GGUF into backend weights, checking shapes.
pub(crate) struct Loader<'a, B: Backend> {
    pub backend: &'a B,
    pub gguf: &'a Arc<GgufModel>,
    pub path: &'a Path,
}

impl<B: Backend> Loader<'_, B> {
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<B::Weight> {
        self.opt(name, shape)?
            .ok_or_else(|| EngineError::Model(format!("{}: tensor {name} is missing", self.path.display())))
    }

    pub fn opt(&self, name: &str, shape: &[usize]) -> Result<Option<B::Weight>> {
        self.load(name, shape, false)
    }

    fn load(&self, name: &str, shape: &[usize], matmul_only: bool) -> Result<Option<B::Weight>> {
        let Some((file, info)) = self.gguf.tensor(name) else {
            return Ok(None);
        };
        let want: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        let mut have = info.shape.clone();
        while have.len() > want.len() && have.last() == Some(&1) {
            have.pop();
        }
        if have != want {
            return Err(EngineError::Model(format!(
                "{}: tensor {name} has shape {:?}, expected {:?}",
                self.path.display(),
                info.shape,
                want
            )));
        }
        if quant::dot::vec_dot_type(info.ty).is_none() && quant::codec(info.ty).is_none() {
            return Err(EngineError::Unsupported(format!(
                "{}: tensor {name} has type {}, which the engine cannot compute with",
                self.path.display(),
                info.ty.name()
            )));
        }
        let w = self.backend.load_weight(WeightSource {
            name,
            ty: info.ty,
            shape: &info.shape,
            data: file.tensor_data(info),
            matmul_only,
            owner: self.gguf.clone(),
        })?;
        Ok(Some(w))
    }

    /// A small tensor's values on the host (rope factors, scalar scales), decoded from any type
    /// with a codec; `None` when the file has no such tensor.
    pub fn host(&self, name: &str) -> Result<Option<Vec<f32>>> {
        let Some((file, info)) = self.gguf.tensor(name) else {
            return Ok(None);
        };
        let codec = quant::codec(info.ty).ok_or_else(|| {
            EngineError::Model(format!(
                "{}: tensor {name} has type {}, which cannot be decoded",
                self.path.display(),
                info.ty.name()
            ))
        })?;
        let mut v = vec![0f32; info.n_elements() as usize];
        (codec.dequantize)(file.tensor_data(info), &mut v);
        Ok(Some(v))
    }

    /// A stack of `n` matrices `[cols, rows, n]` (a MoE layer's experts), one weight per matrix.
    pub fn mats(&self, name: &str, cols: usize, rows: usize, n: usize) -> Result<Vec<B::Weight>> {
        Ok(self
            .mats_rows(name, cols, rows, n, std::slice::from_ref(&(0..rows)))?
            .pop()
            .unwrap_or_default())
    }

    /// A stack of `n` fused gate-and-up matrices `[cols, 2·rows, n]`: per matrix, the first `rows`
    /// rows are the gate, the next `rows` the up projection (llama-graph.cpp build_moe_ffn).
    pub fn mats_split(&self, name: &str, cols: usize, rows: usize, n: usize) -> Result<GateUp<B>> {
        let halves = self.mats_rows(name, cols, 2 * rows, n, &[0..rows, rows..2 * rows])?;
        let mut it = halves.into_iter();
        Ok((it.next().unwrap_or_default(), it.next().unwrap_or_default()))
    }

    /// A stack of `n` matrices `[cols, rows, n]`, each cut into the row ranges `parts`: one weight
    /// list per part.
    fn mats_rows(
        &self,
        name: &str,
        cols: usize,
        rows: usize,
        n: usize,
        parts: &[std::ops::Range<usize>],
    ) -> Result<Vec<Vec<B::Weight>>> {
        let (file, info) = self
            .gguf
            .tensor(name)
            .ok_or_else(|| EngineError::Model(format!("{}: tensor {name} is missing", self.path.display())))?;
        let want = [cols as u64, rows as u64, n as u64];
        if info.shape != want {
            return Err(EngineError::Model(format!(
                "{}: tensor {name} has shape {:?}, expected {want:?}",
                self.path.display(),
                info.shape
            )));
        }
        if quant::dot::vec_dot_type(info.ty).is_none() {
            return Err(EngineError::Unsupported(format!(
                "{}: tensor {name} has type {}, which has no matrix-multiplication kernel",
                self.path.display(),
                info.ty.name()
            )));
        }
        let data = file.tensor_data(info);
        let rb = data.len() / (rows * n).max(1);
        parts
            .iter()
            .map(|part| {
                let shape = [cols as u64, part.len() as u64];
                (0..n)
                    .map(|e| {
                        let start = (e * rows + part.start) * rb;
                        self.backend.load_weight(WeightSource {
                            name,
                            ty: info.ty,
                            shape: &shape,
                            data: &data[start..start + part.len() * rb],
                            matmul_only: true,
                            owner: self.gguf.clone(),
                        })
                    })
                    .collect()
            })
            .collect()
    }

    /// A matrix used only in matmuls: its type must have a dot kernel.
    pub fn mat(&self, name: &str, shape: &[usize]) -> Result<B::Weight> {
        self.opt_mat(name, shape)?
            .ok_or_else(|| EngineError::Model(format!("{}: tensor {name} is missing", self.path.display())))
    }

    /// [`Loader::mat`] for a matrix that may be absent.
    pub fn opt_mat(&self, name: &str, shape: &[usize]) -> Result<Option<B::Weight>> {
        let Some(w) = self.load(name, shape, true)? else {
            return Ok(None);
        };
        let ty = self.backend.weight_type(&w);
        if quant::dot::vec_dot_type(ty).is_none() {
            return Err(EngineError::Unsupported(format!(
                "{}: tensor {name} has type {}, which has no matrix-multiplication kernel",
                self.path.display(),
                ty.name()
            )));
        }
        Ok(Some(w))
    }
}

/// Options for loading a model.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    pub kv_type: KvType,
}

/// Open a GGUF and check its architecture before loading anything.
pub fn open_gguf(path: &Path) -> Result<Arc<GgufModel>> {
    let g = GgufModel::open(path).map_err(|e| EngineError::Model(e.to_string()))?;
    Ok(Arc::new(g))
}
