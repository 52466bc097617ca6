//! `Gemma3ForCausalLM` / `Gemma3ForConditionalGeneration` → `gemma3` and `Gemma4ForCausalLM` /
//! `Gemma4ForConditionalGeneration` → `gemma4` (llama.cpp `conversion/gemma.py`, `Gemma3Model`,
//! `Gemma4Model`). Multimodal towers of the conditional-generation checkpoints are skipped (the
//! converter writes them to a separate mmproj file).

use super::text::{full_attention_rope, rope_parameters, set_text_parameters, Keys};
use super::{always_skipped, base_filter, block_id, map_or_err, Ctx, Family, OutTensor};
use crate::hf::{HfError, HfTensor};
use crate::vocab::{self, spm, token_type};
use gguf::arch::key;
use gguf::Arch;
use gguf::Tensor;
use gguf::{Array, Metadata, Value};
use serde_json::Value as J;

pub struct Gemma3;
pub struct Gemma4;

/// Number of real vocabulary rows of `token_embd` (`Gemma3Model.modify_tensors` drops the rest).
fn real_vocab_rows(ctx: &Ctx) -> Result<usize, HfError> {
    if ctx.dir.join("tokenizer.model").is_file() {
        return Ok(spm::create_vocab_sentencepiece(&ctx.dir, &ctx.cfg)?.tokens.len());
    }
    let path = ctx.dir.join("tokenizer.json");
    let text = std::fs::read_to_string(&path).map_err(|source| HfError::Io {
        path: path.clone(),
        source,
    })?;
    let tj: J = serde_json::from_str(&text).map_err(|e| HfError::Invalid {
        path: path.clone(),
        problem: format!("malformed JSON: {e}"),
    })?;
    let n_vocab = tj.pointer("/model/vocab").and_then(J::as_object).map(|o| o.len());
    let n_added = tj.get("added_tokens").and_then(J::as_array).map(|a| a.len());
    match (n_vocab, n_added) {
        (Some(v), Some(a)) => Ok(v + a),
        _ => Err(HfError::Invalid {
            path,
            problem: "expected `model.vocab` and `added_tokens`".into(),
        }),
    }
}

/// A tensor copied with optional row truncation and a constant added to every value.
fn transformed(name: String, t: &HfTensor, max_rows: Option<usize>, shift: f32) -> OutTensor {
    let mut shape = t.shape.clone();
    if let (Some(r), Some(first)) = (max_rows, shape.first_mut()) {
        *first = (*first).min(r);
    }
    let n: usize = shape.iter().product();
    let src = t.name.clone();
    OutTensor {
        rows_from: None,
        name,
        shape,
        source: t.name.clone(),
        make: Box::new(move |hf| {
            let t = hf.get(&src).expect("tensor listed at planning time");
            let mut v = hf.f32(t)?;
            v.truncate(n);
            if shift != 0.0 {
                v.iter_mut().for_each(|x| *x += shift);
            }
            Ok(v)
        }),
        raw: None,
    }
}

/// `ModelBase.modify_tensors` name mapping, with the Gemma meaning of `post_attention_layernorm`
/// (gguf-py maps it to ATTN_POST_NORM for the Gemma architectures, which have no FFN_NORM alias).
fn gemma_name(ctx: &Ctx, name: &str) -> Result<String, HfError> {
    if let (Some(bid), true) = (
        block_id(name),
        name.starts_with("model.layers.") && name.ends_with(".post_attention_layernorm.weight"),
    ) {
        return Ok(Tensor::AttnPostNorm.blk(bid as usize));
    }
    map_or_err(ctx, name)
}

/// The tensors of both generations (`Gemma3Model.modify_tensors`, `Gemma4Model.filter_tensors` /
/// `modify_tensors`); `v4` selects Gemma 4's naming and leaves norms unshifted.
fn gemma_tensors(ctx: &Ctx, v4: bool) -> Result<Vec<OutTensor>, HfError> {
    let mut out = Vec::new();
    let mut vocab_rows = None;
    for t in ctx.hf.tensors() {
        let mut name = t.name.clone();
        if v4 {
            // Gemma4Model.filter_tensors: parameters without a `.weight` suffix get one
            if name.ends_with("per_dim_scale") || name.ends_with("layer_scalar") {
                name.push_str(".weight");
            }
            if name.contains(".experts.")
                && ![".weight", ".weight_scale", ".weight_scale_2", ".input_scale"]
                    .iter()
                    .any(|s| name.ends_with(s))
            {
                name.push_str(".weight");
            }
        }
        // multimodal towers: counted in the notes by `skipped_note`
        let Some(name) = base_filter(&name) else { continue };
        if always_skipped(&name) {
            continue;
        }
        if v4 && name.ends_with("router.scale") {
            let bid = block_id(&name).ok_or_else(|| ctx.invalid(format!("tensor `{}` has no layer index", t.name)))?;
            out.push(OutTensor::from_hf(Tensor::FfnGateInp.with(bid as usize, "scale"), t));
            continue;
        }
        if v4 && name.contains(".per_expert_scale") {
            let bid = block_id(&name).ok_or_else(|| ctx.invalid(format!("tensor `{}` has no layer index", t.name)))?;
            out.push(OutTensor::from_hf(Tensor::FfnDownExps.with(bid as usize, "scale"), t));
            continue;
        }
        let max_rows = if name.contains("embed_tokens.weight") {
            if vocab_rows.is_none() {
                vocab_rows = Some(real_vocab_rows(ctx)?);
            }
            vocab_rows
        } else {
            None
        };
        // Gemma3RMSNorm computes x * (1 + w); Gemma 4's norms store the full weight
        let shift = if !v4 && name.ends_with("norm.weight") { 1.0 } else { 0.0 };
        let gguf_name = gemma_name(ctx, &name)?;
        out.push(transformed(gguf_name, t, max_rows, shift));
    }
    Ok(out)
}

fn u32_value(v: u64) -> Value {
    Value::U32(v as u32)
}

/// `Gemma3Model.set_gguf_parameters` (after `TextModel.set_gguf_parameters`).
fn gemma3_parameters(ctx: &Ctx, arch: &str, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
    set_text_parameters(ctx, arch, m, file_type)?;
    let cfg = &ctx.cfg;
    let k = Keys(arch);
    let u = |key: &str, default: u64| cfg.get(key).and_then(J::as_u64).unwrap_or(default);
    m.insert(
        k.k(key::CONTEXT_LENGTH),
        u32_value(u("max_position_embeddings", 131072)),
    );
    m.insert(k.k(key::ATTN_HEAD_COUNT), u32_value(u("num_attention_heads", 8)));
    let eps = cfg.get("rms_norm_eps").and_then(J::as_f64).unwrap_or(1e-6);
    m.insert(k.k(key::ATTN_LAYERNORM_RMS_EPS), Value::F32(eps as f32));
    m.insert(k.k(key::ATTN_KEY_LENGTH), u32_value(u("head_dim", 256)));
    m.insert(k.k(key::ATTN_VALUE_LENGTH), u32_value(u("head_dim", 256)));
    // the global layers' theta
    let theta = full_attention_rope(&rope_parameters(ctx))
        .get("rope_theta")
        .and_then(J::as_f64)
        .unwrap_or(1_000_000.0);
    m.insert(k.k(key::ROPE_FREQ_BASE), Value::F32(theta as f32));
    if cfg.get("attn_logit_softcapping").is_some() {
        return Err(ctx.invalid("attn_logit_softcapping is set, but Gemma 3 and later have no attention softcapping"));
    }
    if let Some(cap) = cfg
        .get("final_logit_softcapping")
        .and_then(J::as_f64)
        .filter(|&c| c != 0.0)
    {
        m.insert(k.k(key::FINAL_LOGIT_SOFTCAPPING), Value::F32(cap as f32));
    }
    if cfg.get("sliding_window_pattern").and_then(J::as_u64) != Some(1) {
        let w = cfg.req_u64(&["sliding_window"])?;
        m.insert(k.k(key::ATTN_SLIDING_WINDOW), u32_value(w));
    }
    m.insert(k.k(key::ATTN_HEAD_COUNT_KV), u32_value(u("num_key_value_heads", 4)));
    Ok(())
}

/// A full-attention layer's value from `per_layer_config` (when the flat key is absent).
fn full_layer_value(ctx: &Ctx, flat: &str, per_layer: &str) -> Option<u64> {
    if let Some(v) = ctx.cfg.get(flat).and_then(J::as_u64) {
        return Some(v);
    }
    let plc = ctx.cfg.get("per_layer_config")?.as_object()?;
    let types = ctx.cfg.get("layer_types").and_then(J::as_array)?;
    plc.iter().find_map(|(idx, lc)| {
        let i: usize = idx.parse().ok()?;
        (types.get(i)?.as_str()? == "full_attention").then_some(())?;
        lc.get(per_layer)?.as_u64()
    })
}

fn swa_layers(ctx: &Ctx) -> Result<Vec<bool>, HfError> {
    let types = ctx
        .cfg
        .get("layer_types")
        .and_then(J::as_array)
        .ok_or_else(|| ctx.invalid("missing hyper-parameter `layer_types`"))?;
    Ok(types.iter().map(|t| t.as_str() == Some("sliding_attention")).collect())
}

fn global_head_dim(ctx: &Ctx) -> Result<u64, HfError> {
    full_layer_value(ctx, "global_head_dim", "head_dim")
        .ok_or_else(|| ctx.invalid("missing `global_head_dim` (or a full-attention `head_dim` in per_layer_config)"))
}

/// `Gemma4Model.set_gguf_parameters`.
fn gemma4_parameters(ctx: &Ctx, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
    let arch = Arch::Gemma4.name();
    gemma3_parameters(ctx, arch, m, file_type)?;
    let cfg = &ctx.cfg;
    let k = Keys(arch);
    let n_shared = cfg.req_u64(&["num_kv_shared_layers"])?;
    m.insert(k.k(key::ATTN_SHARED_KV_LAYERS), u32_value(n_shared));
    let n_pl = cfg.get("hidden_size_per_layer_input").and_then(J::as_u64).unwrap_or(0);
    m.insert(k.k(key::EMBEDDING_LENGTH_PER_LAYER_INPUT), u32_value(n_pl));
    let swa = swa_layers(ctx)?;
    m.insert(
        k.k(key::ATTN_SLIDING_WINDOW_PATTERN),
        Value::Array(Array::Bool(swa.clone())),
    );
    let hd_full = global_head_dim(ctx)?;
    let hd_swa = cfg.req_u64(&["head_dim"])?;
    m.insert(k.k(key::ATTN_KEY_LENGTH), u32_value(hd_full));
    m.insert(k.k(key::ATTN_VALUE_LENGTH), u32_value(hd_full));
    m.insert(k.k(key::ATTN_KEY_LENGTH_SWA), u32_value(hd_swa));
    m.insert(k.k(key::ATTN_VALUE_LENGTH_SWA), u32_value(hd_swa));
    if let Some(e) = cfg.find_u64(&["expert_intermediate_size", "moe_intermediate_size"]) {
        m.insert(k.k(key::EXPERT_FEED_FORWARD_LENGTH), u32_value(e));
    }
    let n_layer = cfg.req_u64(&["n_layers", "num_hidden_layers", "n_layer", "num_layers"])?;
    if cfg.get("use_double_wide_mlp").and_then(J::as_bool).unwrap_or(false) {
        // KV-shared layers have an MLP twice as wide
        let n_ff = cfg.req_u64(&["intermediate_size"])? as i32;
        let first_shared = n_layer.saturating_sub(n_shared);
        let arr = (0..n_layer)
            .map(|il| if il < first_shared { n_ff } else { n_ff * 2 })
            .collect();
        m.insert(k.k(key::FEED_FORWARD_LENGTH), Value::Array(Array::I32(arr)));
    }
    if let (Some(kv_full), Some(kv_swa)) = (
        full_layer_value(ctx, "num_global_key_value_heads", "num_key_value_heads"),
        cfg.get("num_key_value_heads").and_then(J::as_u64),
    ) {
        let arr = swa.iter().map(|&s| if s { kv_swa } else { kv_full } as i32).collect();
        m.insert(k.k(key::ATTN_HEAD_COUNT_KV), Value::Array(Array::I32(arr)));
    }
    // the full layers' partial rotation is expressed through rope_freqs (see gemma4_rope_freqs)
    let prf_swa = rope_parameters(ctx)
        .get("partial_rotary_factor")
        .and_then(J::as_f64)
        .unwrap_or(1.0);
    m.insert(k.k(key::ROPE_DIMENSION_COUNT), u32_value(hd_full));
    m.insert(
        k.k(key::ROPE_DIMENSION_COUNT_SWA),
        u32_value((hd_swa as f64 * prf_swa) as u64),
    );
    Ok(())
}

/// `Gemma4Model.generate_extra_tensors`: the full layers' "proportional" rope keeps only the first
/// `partial_rotary_factor` of each half rotating; the other frequencies get a factor of 1e30.
fn gemma4_rope_freqs(ctx: &Ctx) -> Result<OutTensor, HfError> {
    let rp = ctx
        .cfg
        .get("rope_parameters")
        .and_then(|r| r.get("full_attention"))
        .ok_or_else(|| ctx.invalid("missing `rope_parameters.full_attention`"))?;
    let rope_type = rp.get("rope_type").and_then(J::as_str);
    if rope_type != Some("proportional") {
        return Err(ctx.invalid(format!(
            "full-attention rope_type {rope_type:?} is not supported (expected \"proportional\")"
        )));
    }
    let hd_full = global_head_dim(ctx)? as f64;
    let prf = rp
        .get("partial_rotary_factor")
        .and_then(J::as_f64)
        .ok_or_else(|| ctx.invalid("missing `rope_parameters.full_attention.partial_rotary_factor`"))?;
    let n_rot = (hd_full * prf / 2.0) as usize;
    let n_unrot = ((hd_full / 2.0) as usize).saturating_sub(n_rot);
    let values: Vec<f32> = std::iter::repeat_n(1.0f32, n_rot)
        .chain(std::iter::repeat_n(1e30f32, n_unrot))
        .collect();
    Ok(OutTensor {
        rows_from: None,
        name: Tensor::RopeFreqs.weight(),
        shape: vec![values.len()],
        source: "(generated)".into(),
        make: Box::new(move |_| Ok(values.clone())),
        raw: None,
    })
}

fn skipped_note(ctx: &mut Ctx) {
    let n = ctx
        .hf
        .tensors()
        .iter()
        .filter(|t| base_filter(&t.name).is_none())
        .count();
    if n > 0 {
        ctx.notes.push(format!(
            "{n} vision/audio tensors skipped: this is a text-only conversion (llama.cpp writes them to a separate mmproj file)"
        ));
    }
}

impl Family for Gemma3 {
    fn gguf_arch(&self, _ctx: &Ctx) -> Arch {
        Arch::Gemma3
    }

    fn set_parameters(&self, ctx: &Ctx, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
        gemma3_parameters(ctx, Arch::Gemma3.name(), m, file_type)
    }

    // Gemma3Model.set_vocab
    fn set_vocab(&self, ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
        skipped_note(ctx);
        if ctx.dir.join("tokenizer.model").is_file() {
            spm::set_vocab_sentencepiece(&ctx.dir, &ctx.cfg, m)?;
            m.insert("tokenizer.ggml.add_space_prefix", Value::Bool(false));
        } else {
            let mut notes = vocab::VocabNotes::default();
            vocab::set_vocab_gpt2(&ctx.dir, &ctx.cfg, m, &mut notes)?;
            ctx.notes.extend(notes.warnings);
        }
        Ok(())
    }

    fn tensors(&self, ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
        gemma_tensors(ctx, false)
    }
}

/// Tokens Gemma 4 always renders, so that the chat parser can read them.
const GEMMA4_VISIBLE: &[&str] = &[
    "<|channel>",
    "<channel|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    "<|\"|>",
];

impl Family for Gemma4 {
    fn gguf_arch(&self, _ctx: &Ctx) -> Arch {
        Arch::Gemma4
    }

    fn set_parameters(&self, ctx: &Ctx, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
        gemma4_parameters(ctx, m, file_type)
    }

    // Gemma4Model.set_vocab: LlamaHfVocab tokens under tokenizer model "gemma4", with merges
    fn set_vocab(&self, ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
        skipped_note(ctx);
        let all = spm::llama_hf_vocab(&ctx.dir)?;
        let mut tokens = Vec::with_capacity(all.len());
        let mut scores = Vec::with_capacity(all.len());
        let mut types = Vec::with_capacity(all.len());
        for (text, score, ty) in all {
            types.push(if GEMMA4_VISIBLE.contains(&text.as_str()) {
                token_type::USER_DEFINED
            } else {
                ty
            });
            tokens.push(text);
            scores.push(score);
        }
        m.insert("tokenizer.ggml.model", Value::String("gemma4".into()));
        m.insert(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(tokens.iter().collect())),
        );
        m.insert("tokenizer.ggml.scores", Value::Array(Array::F32(scores)));
        m.insert("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
        vocab::special::SpecialVocab::load(&ctx.dir, true, None, None).write(m);
        m.insert("tokenizer.ggml.add_space_prefix", Value::Bool(false));
        m.insert("tokenizer.ggml.add_bos_token", Value::Bool(true));
        Ok(())
    }

    fn tensors(&self, ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
        let mut out = vec![gemma4_rope_freqs(ctx)?];
        out.extend(gemma_tensors(ctx, true)?);
        Ok(out)
    }
}
