//! The architecture table: HF `architectures[0]` → the family that converts it. Each family reads
//! hyper-parameters into GGUF metadata and maps HF tensors to GGUF tensors (with their weight
//! transforms), following llama.cpp's `conversion/<family>.py`.

pub mod bert;
pub mod deepseek4;
pub mod deepseek4_weights;
pub mod gemma;
pub mod llama;
pub mod qwen;
pub mod qwen35;
pub mod qwen3_vl;
pub mod qwen_moe;
pub mod tensor_names;
pub mod text;

use crate::hf::{HfConfig, HfError, HfTensor, HfTensors};
use gguf::Metadata;
use std::path::{Path, PathBuf};

/// Everything a family sees of the model being converted.
pub struct Ctx {
    pub dir: PathBuf,
    pub cfg: HfConfig,
    pub hf: HfTensors,
    /// The HF architecture string (`architectures[0]`).
    pub hf_arch: String,
    /// `--no-mtp`: drop multi-token-prediction layers (Qwen3.5/3.6).
    pub no_mtp: bool,
    /// Messages for the user and the report (skipped vision tensors, tokenizer fallbacks, …).
    pub notes: Vec<String>,
}

impl Ctx {
    pub fn invalid(&self, problem: impl Into<String>) -> HfError {
        HfError::Invalid {
            path: self.dir.clone(),
            problem: problem.into(),
        }
    }
}

/// Produces the f32 data of an output tensor (torch order, row-major).
pub type MakeData = Box<dyn Fn(&HfTensors) -> Result<Vec<f32>, HfError> + Send + Sync>;
/// Produces the bytes of a tensor that is written in a fixed ggml type (e.g. experts that arrive
/// already in MXFP4, repacked losslessly).
pub type MakeRaw = Box<dyn Fn(&HfTensors) -> Result<Vec<u8>, HfError> + Send + Sync>;

/// One tensor of the output GGUF, known before any data is read.
pub struct OutTensor {
    pub name: String,
    /// PyTorch order (outermost first); the GGUF `ne` is this reversed.
    pub shape: Vec<usize>,
    /// The HF tensor it came from (for messages and `tensor_force_quant`).
    pub source: String,
    pub make: MakeData,
    /// When set, the tensor is stored in this type with these bytes whatever the output type
    /// (`raw_dtype` in the Python converter); `make` must still give its f32 values (used when
    /// llama-quantize would requantize it).
    pub raw: Option<(gguf::GgmlType, MakeRaw)>,
    /// Set when the tensor is an unmodified checkpoint tensor: its rows can then be streamed in
    /// slabs straight from the mapped file instead of materialising the whole tensor.
    pub rows_from: Option<String>,
}

impl OutTensor {
    /// A tensor copied from the checkpoint (widened to f32).
    pub fn from_hf(name: String, t: &HfTensor) -> OutTensor {
        let src = t.name.clone();
        OutTensor {
            name,
            shape: t.shape.clone(),
            source: t.name.clone(),
            make: Box::new(move |hf| {
                let t = hf.get(&src).expect("tensor listed at planning time");
                hf.f32(t)
            }),
            raw: None,
            rows_from: Some(t.name.clone()),
        }
    }

    /// The GGUF `ne` (innermost first).
    pub fn ne(&self) -> Vec<u64> {
        self.shape.iter().rev().map(|&d| d as u64).collect()
    }
}

/// A model family: metadata and tensors.
pub trait Family: Sync {
    /// `general.architecture`.
    fn gguf_arch(&self, ctx: &Ctx) -> gguf::Arch;
    /// Model hyper-parameters, written after `general.*` (`set_gguf_parameters`), including
    /// `general.file_type` at the point the Python converter writes it.
    fn set_parameters(&self, ctx: &Ctx, m: &mut Metadata, file_type: u32) -> Result<(), HfError>;
    /// Metadata the converter writes in the model's `__init__`, right after `general.architecture`
    /// (e.g. a default chat template whose value the tokenizer's own template replaces in place).
    fn init_metadata(&self, _ctx: &Ctx, _m: &mut Metadata) {}
    /// Tokenizer metadata (`set_vocab`).
    fn set_vocab(&self, ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError>;
    /// The output tensors in the order the converter writes them.
    fn tensors(&self, ctx: &Ctx) -> Result<Vec<OutTensor>, HfError>;
    /// `tensor_force_quant`: a family-specific type for a tensor under a `--outtype`-style file
    /// type (`outtype` is F32/F16/BF16/Q8_0), or `None` for the common rules.
    fn force_type(&self, _ctx: &Ctx, _t: &OutTensor, _outtype: gguf::GgmlType) -> Option<gguf::GgmlType> {
        None
    }
    /// The `general.file_type` actually written for a conversion to `ftype` (e.g. a model whose
    /// experts arrive as MXFP4 is MOSTLY_MXFP4_MOE even when converted to bf16).
    fn file_type(&self, _ctx: &Ctx, ftype: u32) -> u32 {
        ftype
    }
}

/// (HF architecture, family)
pub fn families() -> &'static [(&'static str, &'static dyn Family)] {
    &[
        ("LlamaForCausalLM", &llama::Llama),
        ("MistralForCausalLM", &llama::Llama),
        ("Qwen2ForCausalLM", &qwen::Qwen2),
        ("Qwen3ForCausalLM", &qwen::Qwen3),
        ("DeepseekV4ForCausalLM", &deepseek4::DeepseekV4),
        ("Gemma3ForCausalLM", &gemma::Gemma3),
        ("Gemma3ForConditionalGeneration", &gemma::Gemma3),
        ("Gemma4ForCausalLM", &gemma::Gemma4),
        ("Gemma4ForConditionalGeneration", &gemma::Gemma4),
        ("Qwen3_5ForConditionalGeneration", &qwen35::Qwen35),
        ("Qwen3_5ForCausalLM", &qwen35::Qwen35),
        ("Qwen3_5MoeForConditionalGeneration", &qwen35::Qwen35Moe),
        ("Qwen3_5MoeForCausalLM", &qwen35::Qwen35Moe),
        ("Qwen3MoeForCausalLM", &qwen_moe::Qwen3Moe),
        ("Qwen3VLForConditionalGeneration", &qwen3_vl::Qwen3Vl),
        ("BertModel", &bert::Bert),
        ("BertForMaskedLM", &bert::Bert),
        ("NomicBertModel", &bert::NomicBert),
    ]
}

pub fn family_for(hf_arch: &str) -> Option<&'static dyn Family> {
    families().iter().find(|(a, _)| *a == hf_arch).map(|(_, f)| *f)
}

pub fn supported_architectures() -> Vec<&'static str> {
    families().iter().map(|(a, _)| *a).collect()
}

/// `ModelBase.filter_tensors` + `TextModel.filter_tensors`: multimodal tensors are skipped, and
/// `language_model.` is dropped from names. Returns `None` for skipped tensors.
pub fn base_filter(name: &str) -> Option<String> {
    const SKIP_PREFIX: &[&str] = &[
        "mlp",
        "vit.",
        "vpm.",
        "siglip2.",
        "conformer.",
        "merger.",
        "resampler.",
        "sound_encoder.",
        "sound_projection.",
        "speech_embeddings.",
    ];
    const SKIP_CONTAINS: &[&str] = &[
        "visual.",
        "vision.",
        "audio.",
        "talker.",
        "vision_",
        "audio_",
        "token2wav.",
        "code2wav.",
        "projector.",
        "pre_mm_projector_norm",
        "image_newline",
        "view_seperator",
        "patch_embed",
        "patch_embedding",
        "patch_merger.",
        "patch_merge_mlp.",
        "model.connector.",
    ];
    if SKIP_PREFIX.iter().any(|p| name.starts_with(p)) || SKIP_CONTAINS.iter().any(|p| name.contains(p)) {
        return None;
    }
    let mut n = name.to_string();
    if n.ends_with("e_score_correction_bias") {
        n = n.replace("e_score_correction_bias", "e_score_correction.bias");
    }
    if n.contains("language_model.") {
        n = n.replace("language_model.", "");
    }
    Some(n)
}

/// Tensors the converter always drops (`prepare_tensors`).
pub fn always_skipped(name: &str) -> bool {
    name.ends_with(".attention.masked_bias")
        || name.ends_with(".attention.bias")
        || name.ends_with(".rotary_emb.inv_freq")
}

/// The block id of an HF tensor name: its first all-digit part.
pub fn block_id(name: &str) -> Option<u32> {
    name.split('.')
        .find(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|p| p.parse().ok())
}

/// Map a name or fail with an error naming the tensor (an unmapped tensor is never skipped silently).
pub fn map_or_err(ctx: &Ctx, name: &str) -> Result<String, HfError> {
    tensor_names::map_name(name).ok_or_else(|| {
        ctx.invalid(format!(
            "cannot map tensor `{name}` of {} to a GGUF name (unsupported layout or architecture variant)",
            ctx.hf_arch
        ))
    })
}

pub fn dir_name(dir: &Path) -> String {
    dir.canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into())
}
