//! The per-tensor quantization plan: which ggml type each tensor of a model gets for a file type,
//! exactly as `llama-quantize` (llama.cpp b11434, `src/llama-quant.cpp`: `tensor_allows_quantization`,
//! `llama_tensor_get_type`, `llama_tensor_get_type_impl`, `tensor_type_fallback`,
//! `tensor_requires_imatrix`) decides it, from the tensor list and a few hyper-parameters alone.
//!
//! Counters (the n-th `attn_v`, the n-th `ffn_down`) advance in llama-quantize's processing order:
//! block index first, then name (`llama_model_loader::weight_name_comparer`); [`plan`] sorts into
//! that order itself and returns entries in the caller's order.

use gguf::arch::key;
use gguf::Tensor as T;
use gguf::{GgmlType, Metadata};

/// A llama.cpp file type (`general.file_type`), or `COPY` (every tensor keeps its type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Copy,
    Ftype(u32),
}

// llama_ftype ids used by the rules (include/llama.h).
mod ft {
    pub const F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q4_0: u32 = 2;
    pub const Q4_1: u32 = 3;
    pub const Q8_0: u32 = 7;
    pub const Q5_0: u32 = 8;
    pub const Q5_1: u32 = 9;
    pub const Q2_K: u32 = 10;
    pub const Q3_K_S: u32 = 11;
    pub const Q3_K_M: u32 = 12;
    pub const Q3_K_L: u32 = 13;
    pub const Q4_K_S: u32 = 14;
    pub const Q4_K_M: u32 = 15;
    pub const Q5_K_S: u32 = 16;
    pub const Q5_K_M: u32 = 17;
    pub const Q6_K: u32 = 18;
    pub const IQ2_XXS: u32 = 19;
    pub const IQ2_XS: u32 = 20;
    pub const Q2_K_S: u32 = 21;
    pub const IQ3_XS: u32 = 22;
    pub const IQ3_XXS: u32 = 23;
    pub const IQ1_S: u32 = 24;
    pub const IQ4_NL: u32 = 25;
    pub const IQ3_S: u32 = 26;
    pub const IQ3_M: u32 = 27;
    pub const IQ2_S: u32 = 28;
    pub const IQ2_M: u32 = 29;
    pub const IQ4_XS: u32 = 30;
    pub const IQ1_M: u32 = 31;
    pub const BF16: u32 = 32;
    pub const TQ1_0: u32 = 36;
    pub const TQ2_0: u32 = 37;
    pub const MXFP4_MOE: u32 = 38;
    pub const NVFP4: u32 = 39;
    pub const Q1_0: u32 = 40;
    pub const Q2_0: u32 = 41;
}

impl Target {
    /// Parse a file type name as llama-quantize accepts it, case-insensitively (`q4_k_m`, `Q4_K`
    /// for Q4_K_M, `COPY`).
    pub fn parse(name: &str) -> Option<Target> {
        let up = name.trim().to_ascii_uppercase();
        let canonical = match up.as_str() {
            "COPY" => return Some(Target::Copy),
            "Q3_K" => "Q3_K_M",
            "Q4_K" => "Q4_K_M",
            "Q5_K" => "Q5_K_M",
            s => s,
        };
        gguf::file_type::file_type_id(canonical).map(Target::Ftype)
    }

    pub fn name(self) -> &'static str {
        match self {
            Target::Copy => "COPY",
            Target::Ftype(id) => gguf::file_type::file_type_name(id.into()).unwrap_or("?"),
        }
    }

    /// `llama_ftype_get_default_type`.
    pub fn default_type(self) -> Option<GgmlType> {
        use GgmlType as G;
        let Target::Ftype(f) = self else { return None };
        Some(match f {
            ft::Q4_0 => G::Q4_0,
            ft::Q4_1 => G::Q4_1,
            ft::Q5_0 => G::Q5_0,
            ft::Q5_1 => G::Q5_1,
            ft::Q8_0 => G::Q8_0,
            ft::F16 => G::F16,
            ft::BF16 => G::BF16,
            ft::F32 => G::F32,
            ft::Q1_0 => G::Q1_0,
            ft::Q2_0 => G::Q2_0,
            ft::MXFP4_MOE => G::MXFP4,
            ft::NVFP4 => G::NVFP4,
            ft::Q2_K_S | ft::Q2_K => G::Q2_K,
            ft::IQ3_XS => G::IQ3_S,
            ft::Q3_K_S | ft::Q3_K_M | ft::Q3_K_L => G::Q3_K,
            ft::Q4_K_S | ft::Q4_K_M => G::Q4_K,
            ft::Q5_K_S | ft::Q5_K_M => G::Q5_K,
            ft::Q6_K => G::Q6_K,
            ft::TQ1_0 => G::TQ1_0,
            ft::TQ2_0 => G::TQ2_0,
            ft::IQ2_XXS => G::IQ2_XXS,
            ft::IQ2_XS | ft::IQ2_S => G::IQ2_XS,
            ft::IQ2_M => G::IQ2_S,
            ft::IQ3_XXS => G::IQ3_XXS,
            ft::IQ1_S => G::IQ1_S,
            ft::IQ1_M => G::IQ1_M,
            ft::IQ4_NL => G::IQ4_NL,
            ft::IQ4_XS => G::IQ4_XS,
            ft::IQ3_S | ft::IQ3_M => G::IQ3_S,
            _ => return None,
        })
    }
}

/// The hyper-parameters the rules read (`llama_model::hparams` after `load_hparams`).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFacts {
    pub arch: String,
    /// `<arch>.block_count` (includes multi-token-prediction blocks).
    pub n_layer_all: u32,
    pub n_expert: u32,
    /// Attention heads and KV heads of layer 0.
    pub n_head: u32,
    pub n_head_kv: u32,
}

impl ModelFacts {
    /// Read from GGUF metadata (`head_count` may be a per-layer array: layer 0 counts).
    pub fn from_metadata(m: &Metadata) -> Result<ModelFacts, PlanError> {
        let arch = m
            .architecture()
            .ok_or_else(|| PlanError("metadata has no general.architecture".into()))?
            .to_string();
        let first = |key: &str| -> Option<u64> {
            match m.get(&format!("{arch}.{key}"))? {
                gguf::Value::Array(a) => a.get(0).and_then(|v| v.as_u64()),
                v => v.as_u64(),
            }
        };
        Ok(ModelFacts {
            n_layer_all: first(key::BLOCK_COUNT)
                .ok_or_else(|| PlanError(format!("metadata has no {arch}.block_count")))?
                as u32,
            n_expert: first(key::EXPERT_COUNT).unwrap_or(0) as u32,
            n_head: first(key::ATTN_HEAD_COUNT).unwrap_or(0) as u32,
            n_head_kv: first(key::ATTN_HEAD_COUNT_KV)
                .or_else(|| first(key::ATTN_HEAD_COUNT))
                .unwrap_or(0) as u32,
            arch,
        })
    }

    fn n_gqa(&self) -> u32 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    /// `LLM_TYPE_70B`: Llama with 80 layers and grouped-query attention.
    fn is_70b(&self) -> bool {
        self.arch == "llama" && self.n_layer_all == 80 && self.n_head != self.n_head_kv
    }
}

/// llama-quantize's options that change the plan.
#[derive(Debug, Clone, Default)]
pub struct PlanOptions {
    pub has_imatrix: bool,
    /// `--pure`: no per-category mixing.
    pub pure: bool,
    /// `--leave-output-tensor`.
    pub leave_output_tensor: bool,
    pub output_tensor_type: Option<GgmlType>,
    pub token_embedding_type: Option<GgmlType>,
    /// `--tensor-type REGEX=TYPE`, first match wins.
    pub tensor_types: Vec<(regex::Regex, GgmlType)>,
}

/// A tensor as the plan sees it: name, ggml `ne` shape and current type.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanTensor {
    pub name: String,
    pub shape: Vec<u64>,
    pub ty: GgmlType,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlanEntry {
    pub name: String,
    pub source: GgmlType,
    pub target: GgmlType,
    /// Whether llama-quantize treats the tensor as quantizable at all.
    pub allows_quantization: bool,
    /// The target type needs an importance matrix (`tensor_requires_imatrix`).
    pub requires_imatrix: bool,
    /// The row length forced a fallback type.
    pub fallback: bool,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct PlanError(pub String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttentionQ,
    AttentionK,
    AttentionV,
    AttentionKvB,
    AttentionQkv,
    AttentionOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

// llama-quant.cpp: tensor_get_category
fn category(name: &str) -> Category {
    use Category::*;
    if name == T::Output.weight() {
        Output
    } else if name == T::TokenEmbd.weight() || name == T::PerLayerTokenEmbd.weight() {
        TokenEmbd
    } else if name.contains("attn_qkv.weight") {
        AttentionQkv
    } else if name.contains("attn_kv_b.weight") {
        AttentionKvB
    } else if name.contains("attn_v.weight") {
        AttentionV
    } else if name.contains("attn_k.weight") {
        AttentionK
    } else if name.contains("attn_q.weight") {
        AttentionQ
    } else if name.contains("attn_output.weight") {
        AttentionOutput
    } else if name.contains("ffn_up") {
        FfnUp
    } else if name.contains("ffn_gate") {
        FfnGate
    } else if name.contains("ffn_down") {
        FfnDown
    } else {
        Other
    }
}

fn is_attn_v(c: Category) -> bool {
    matches!(
        c,
        Category::AttentionV | Category::AttentionQkv | Category::AttentionKvB
    )
}

/// `ggml_n_dims`: trailing dimensions of size 1 do not count.
fn n_dims(shape: &[u64]) -> usize {
    (1..shape.len()).rev().find(|&i| shape[i] > 1).map_or(1, |i| i + 1)
}

// llama-quant.cpp: tensor_allows_quantization (the subset of name rules that can match the
// architectures hf2q supports is the whole list; all of it is kept so GGUF→GGUF requantization of
// other models follows llama-quantize too).
fn allows_quantization(t: &PlanTensor, opts: &PlanOptions) -> bool {
    const NEVER: &[&str] = &[
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ];
    let name = t.name.as_str();
    n_dims(&t.shape) >= 2
        && name.ends_with("weight")
        && !(opts.leave_output_tensor && name == T::Output.weight())
        && name != T::PositionEmbd.weight()
        && name != T::TokenTypes.weight()
        && !NEVER.iter().any(|p| name.contains(p))
}

// llama-quant.cpp: tensor_type_fallback
fn fallback(t: &PlanTensor, target: GgmlType) -> Result<(GgmlType, bool), PlanError> {
    use GgmlType as G;
    let ncols = t.shape[0];
    if ncols.is_multiple_of(target.block_size()) {
        return Ok((target, false));
    }
    let mut ty = match target {
        G::IQ1_S | G::IQ1_M | G::IQ2_XXS | G::IQ2_XS | G::IQ2_S | G::IQ3_XXS | G::IQ3_S | G::IQ4_XS => G::IQ4_NL,
        G::Q2_0 | G::Q2_K | G::Q3_K | G::TQ1_0 | G::TQ2_0 => G::Q4_0,
        G::Q4_K => G::Q5_0,
        G::Q5_K => G::Q5_1,
        G::Q6_K => G::Q8_0,
        t if t.block_size() <= 32 => t,
        t => return Err(PlanError(format!("no tensor type fallback is defined for type {t}"))),
    };
    if !ncols.is_multiple_of(ty.block_size()) {
        ty = G::F16;
    }
    Ok((ty, true))
}

// llama-quant.cpp: tensor_requires_imatrix
fn requires_imatrix(name: &str, ty: GgmlType, target: Target) -> bool {
    use GgmlType as G;
    if matches!(category(name), Category::TokenEmbd | Category::Output) {
        return false;
    }
    match ty {
        G::IQ3_XXS | G::IQ2_XXS | G::IQ2_XS | G::IQ2_S | G::IQ1_M | G::IQ1_S => true,
        G::Q2_K => target == Target::Ftype(ft::Q2_K_S),
        _ => false,
    }
}

/// llama-quantize's processing order (`weight_name_comparer`): block index, then name.
pub fn processing_order(names: &[&str]) -> Vec<usize> {
    fn layer(n: &str) -> i64 {
        n.strip_prefix("blk.")
            .and_then(|r| {
                let digits: String = r.chars().take_while(|c| c.is_ascii_digit()).collect();
                digits.parse().ok()
            })
            .unwrap_or(-1)
    }
    let mut idx: Vec<usize> = (0..names.len()).collect();
    idx.sort_by(|&a, &b| (layer(names[a]), names[a].as_bytes()).cmp(&(layer(names[b]), names[b].as_bytes())));
    idx
}

struct State<'a> {
    facts: &'a ModelFacts,
    ftype: u32,
    has_imatrix: bool,
    has_tied_embeddings: bool,
    n_attention_wv: i32,
    n_layer: i32,
    i_attention_wv: i32,
    i_ffn_down: i32,
    i_ffn_gate: i32,
    i_ffn_up: i32,
}

impl State<'_> {
    fn use_more_bits(i: i32, n: i32) -> bool {
        i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
    }

    /// (i_layer, n_layer) of a per-layer tensor; with experts, from the name.
    fn layer_info(&self, counter: i32, name: &str) -> Result<(i32, i32), PlanError> {
        let n_layer = self.n_layer;
        if self.facts.n_expert.max(1) > 1 {
            let i = name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next())
                .and_then(|d| d.parse::<i32>().ok())
                .ok_or_else(|| PlanError(format!("Failed to determine layer for tensor {name}")))?;
            if i < 0 || i >= n_layer {
                return Err(PlanError(format!(
                    "Bad layer {i} for tensor {name}. Must be in [0, {n_layer})"
                )));
            }
            return Ok((i, n_layer));
        }
        Ok((counter, n_layer))
    }

    // llama-quant.cpp: llama_tensor_get_type_impl
    fn get_type_impl(
        &mut self,
        mut ty: GgmlType,
        t: &PlanTensor,
        cat: Category,
        opts: &PlanOptions,
    ) -> Result<GgmlType, PlanError> {
        use Category as C;
        use GgmlType as G;
        let f = self.ftype;
        let n_gqa = self.facts.n_gqa();
        let n_expert = self.facts.n_expert;
        let is = |list: &[u32]| list.contains(&f);
        if cat == C::Output || (self.has_tied_embeddings && cat == C::TokenEmbd) {
            if let Some(o) = opts.output_tensor_type {
                ty = o;
            } else if f == ft::MXFP4_MOE || !t.shape[0].is_multiple_of(ty.block_size()) {
                ty = G::Q8_0;
            } else if is(&[
                ft::IQ2_XXS,
                ft::IQ2_XS,
                ft::IQ3_XXS,
                ft::IQ1_S,
                ft::IQ2_S,
                ft::IQ2_M,
                ft::IQ1_M,
            ]) {
                ty = G::Q5_K;
            } else if ty != G::Q8_0 {
                ty = G::Q6_K;
            }
        } else if f == ft::MXFP4_MOE {
            ty = if t.shape.get(2).copied().unwrap_or(1) > 1 {
                G::MXFP4
            } else {
                G::Q8_0
            };
        } else if cat == C::TokenEmbd {
            if let Some(o) = opts.token_embedding_type {
                ty = o;
            } else if is(&[ft::IQ2_XXS, ft::IQ2_XS, ft::IQ1_S, ft::IQ1_M]) {
                ty = G::Q2_K;
            } else if is(&[ft::IQ2_S, ft::IQ2_M, ft::IQ3_XXS]) {
                ty = G::IQ3_S;
            } else if is(&[ft::TQ1_0, ft::TQ2_0, ft::Q2_0]) {
                ty = G::Q4_K;
            }
        } else if is(&[ft::IQ2_XXS, ft::IQ2_XS, ft::IQ1_S, ft::IQ2_S, ft::IQ2_M, ft::IQ1_M]) {
            let s_or_m = is(&[ft::IQ2_S, ft::IQ2_M]);
            if is_attn_v(cat) {
                ty = if n_gqa >= 4 || n_expert >= 4 {
                    G::Q4_K
                } else if s_or_m {
                    G::IQ3_S
                } else {
                    G::Q2_K
                };
                self.i_attention_wv += 1;
            } else if n_expert == 8 && cat == C::AttentionK {
                ty = G::Q4_K;
            } else if cat == C::FfnDown {
                if self.i_ffn_down < self.n_layer / 8 {
                    ty = if s_or_m { G::IQ3_S } else { G::Q2_K };
                }
                self.i_ffn_down += 1;
            } else if cat == C::AttentionOutput {
                if n_expert == 8 {
                    ty = G::Q5_K;
                } else if is(&[ft::IQ1_S, ft::IQ1_M]) {
                    ty = G::IQ2_XXS;
                } else if s_or_m {
                    ty = G::IQ3_S;
                }
            }
        } else if is_attn_v(cat) {
            if f == ft::Q2_K {
                ty = if n_gqa >= 4 { G::Q4_K } else { G::Q3_K };
            } else if f == ft::Q2_K_S && n_gqa >= 4 {
                ty = G::Q4_K;
            } else if f == ft::IQ3_XXS {
                ty = if n_gqa >= 4 {
                    G::Q4_K
                } else if !self.has_imatrix {
                    G::IQ3_S
                } else {
                    G::IQ3_XXS
                };
            } else if (is(&[ft::IQ3_XS, ft::IQ3_S]) && n_gqa >= 4) || f == ft::IQ3_M {
                ty = G::Q4_K;
            } else if f == ft::Q3_K_M {
                ty = if self.i_attention_wv < 2 { G::Q5_K } else { G::Q4_K };
            } else if f == ft::Q3_K_L || (is(&[ft::IQ4_NL, ft::IQ4_XS]) && n_gqa >= 4) {
                ty = G::Q5_K;
            } else if is(&[ft::Q4_K_M, ft::Q5_K_M]) && Self::use_more_bits(self.i_attention_wv, self.n_attention_wv) {
                ty = G::Q6_K;
            } else if f == ft::Q4_K_S && self.i_attention_wv < 4 {
                ty = G::Q5_K;
            }
            if self.facts.is_70b() && matches!(ty, G::Q3_K | G::Q4_K) {
                ty = G::Q5_K;
            }
            if n_expert == 8 {
                ty = G::Q8_0;
            }
            self.i_attention_wv += 1;
        } else if cat == C::AttentionK {
            if n_expert == 8 {
                ty = G::Q8_0;
            } else if f == ft::IQ3_XS {
                ty = G::IQ3_XXS;
            } else if f == ft::IQ3_XXS {
                ty = G::IQ2_S;
            }
        } else if cat == C::AttentionQ {
            if f == ft::IQ3_XS {
                ty = G::IQ3_XXS;
            } else if f == ft::IQ3_XXS {
                ty = G::IQ2_S;
            }
        } else if cat == C::FfnDown {
            let (i, n) = self.layer_info(self.i_ffn_down, &t.name)?;
            if f == ft::Q2_K {
                ty = G::Q3_K;
            } else if f == ft::Q2_K_S {
                if i < n / 8 {
                    ty = G::Q4_K;
                }
            } else if f == ft::IQ3_XXS && !self.has_imatrix {
                ty = if i < n / 8 { G::Q4_K } else { G::Q3_K };
            } else if f == ft::Q3_K_M {
                // `arch != FALCON || use_more_bits` is always true for the architectures here.
                ty = if i < n / 16 { G::Q5_K } else { G::Q4_K };
            } else if f == ft::IQ3_M && (i < n / 8 || (n_expert == 8 && Self::use_more_bits(i, n))) {
                ty = G::Q4_K;
            } else if f == ft::Q3_K_L {
                ty = G::Q5_K;
            } else if f == ft::Q4_K_M {
                if Self::use_more_bits(i, n) {
                    ty = G::Q6_K;
                }
            } else if i < n / 8 && is(&[ft::IQ4_NL, ft::IQ4_XS]) && !self.has_imatrix {
                ty = G::Q5_K;
            } else if f == ft::Q5_K_M && Self::use_more_bits(i, n) {
                ty = G::Q6_K;
            } else if f == ft::Q4_K_S && i < n / 8 {
                ty = G::Q5_K;
            } else if is(&[ft::Q4_0, ft::Q5_0]) && self.has_imatrix && i < n / 8 {
                ty = if f == ft::Q4_0 { G::Q4_1 } else { G::Q5_1 };
            }
            self.i_ffn_down += 1;
        } else if cat == C::AttentionOutput {
            if n_expert == 8 {
                if is(&[
                    ft::Q2_K,
                    ft::IQ3_XS,
                    ft::IQ3_XXS,
                    ft::Q3_K_S,
                    ft::Q3_K_M,
                    ft::IQ4_NL,
                    ft::Q4_K_S,
                    ft::Q4_K_M,
                    ft::IQ3_S,
                    ft::IQ3_M,
                    ft::IQ4_XS,
                ]) {
                    ty = G::Q5_K;
                }
            } else if f == ft::Q2_K {
                ty = G::Q3_K;
            } else if f == ft::IQ3_XXS {
                ty = G::IQ3_S;
            } else if f == ft::Q3_K_M || f == ft::IQ3_M {
                ty = G::Q4_K;
            } else if f == ft::Q3_K_L {
                ty = G::Q5_K;
            }
        } else if cat == C::AttentionQkv {
            if is(&[ft::Q3_K_M, ft::Q3_K_L, ft::IQ3_M]) {
                ty = G::Q4_K;
            } else if f == ft::Q4_K_M {
                ty = G::Q5_K;
            } else if f == ft::Q5_K_M {
                ty = G::Q6_K;
            }
        } else if cat == C::FfnGate || cat == C::FfnUp {
            let counter = if cat == C::FfnGate {
                self.i_ffn_gate
            } else {
                self.i_ffn_up
            };
            let (i, n) = self.layer_info(counter, &t.name)?;
            if f == ft::IQ3_XS && i >= n / 8 && i < 7 * n / 8 {
                ty = G::IQ3_XXS;
            }
            if cat == C::FfnGate {
                self.i_ffn_gate += 1;
            } else {
                self.i_ffn_up += 1;
            }
        }
        Ok(ty)
    }
}

/// The plan for `tensors` (in any order; entries come back in the same order).
pub fn plan(
    facts: &ModelFacts,
    tensors: &[PlanTensor],
    target: Target,
    opts: &PlanOptions,
) -> Result<Vec<PlanEntry>, PlanError> {
    let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    let order = processing_order(&names);
    let cats: Vec<Category> = tensors.iter().map(|t| category(&t.name)).collect();
    let ftype = match target {
        Target::Ftype(f) => f,
        Target::Copy => 0,
    };
    let default_type = target.default_type();
    if target != Target::Copy && default_type.is_none() {
        return Err(PlanError(format!("invalid output file type {ftype}")));
    }
    let mut st = State {
        facts,
        ftype,
        has_imatrix: opts.has_imatrix,
        has_tied_embeddings: !cats.contains(&Category::Output),
        n_attention_wv: cats.iter().filter(|c| is_attn_v(**c)).count() as i32,
        n_layer: facts.n_layer_all as i32,
        i_attention_wv: 0,
        i_ffn_down: 0,
        i_ffn_gate: 0,
        i_ffn_up: 0,
    };
    let mut out: Vec<Option<PlanEntry>> = vec![None; tensors.len()];
    for &i in &order {
        let t = &tensors[i];
        let cat = cats[i];
        let allows = default_type.is_some() && allows_quantization(t, opts);
        let mut fell_back = false;
        let target_ty = match default_type {
            Some(default) if allows => {
                // llama-quant.cpp: llama_tensor_get_type
                if let (Some(te), Category::TokenEmbd) = (opts.token_embedding_type, cat) {
                    let named = t.name == T::PerLayerTokenEmbd.weight()
                        && opts.tensor_types.iter().any(|(re, _)| re.is_match(&t.name));
                    if !named {
                        te
                    } else {
                        resolve(&mut st, default, t, cat, opts, &mut fell_back)?
                    }
                } else if let (Some(o), Category::Output) = (opts.output_tensor_type, cat) {
                    o
                } else {
                    resolve(&mut st, default, t, cat, opts, &mut fell_back)?
                }
            }
            _ => t.ty,
        };
        out[i] = Some(PlanEntry {
            name: t.name.clone(),
            source: t.ty,
            target: target_ty,
            allows_quantization: allows,
            requires_imatrix: requires_imatrix(&t.name, target_ty, target),
            fallback: fell_back,
        });
    }
    Ok(out.into_iter().map(|e| e.expect("every tensor planned")).collect())
}

fn resolve(
    st: &mut State,
    default: GgmlType,
    t: &PlanTensor,
    cat: Category,
    opts: &PlanOptions,
    fell_back: &mut bool,
) -> Result<GgmlType, PlanError> {
    let mut ty = default;
    if !default.is_quantized() {
        return Ok(ty);
    }
    let mut manual = false;
    if let Some((_, q)) = opts.tensor_types.iter().find(|(re, _)| re.is_match(&t.name)) {
        ty = *q;
        manual = true;
    }
    if !manual && !opts.pure {
        ty = st.get_type_impl(ty, t, cat, opts)?;
    }
    let (ty, fb) = fallback(t, ty)?;
    *fell_back = fb;
    Ok(ty)
}

/// Whether any tensor of the plan needs an importance matrix that was not given (llama-quantize
/// refuses such a quantization).
pub fn missing_imatrix<'a>(entries: &'a [PlanEntry], opts: &PlanOptions) -> Option<&'a PlanEntry> {
    if opts.has_imatrix {
        return None;
    }
    entries.iter().find(|e| e.allows_quantization && e.requires_imatrix)
}
