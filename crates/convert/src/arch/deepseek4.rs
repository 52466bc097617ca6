//! `DeepseekV4ForCausalLM` → GGUF `deepseek4` (llama.cpp `conversion/deepseek.py`,
//! `DeepseekV4Model`): hyper-connections (`hc_*`), compressed sparse / heavily compressed attention
//! (compressor and lightning-indexer tensors), attention sinks, grouped low-rank output (`o_groups`),
//! q/kv LoRA, hash-routed first layers (`tid2eid`), sqrtsoftplus expert scores and routed scaling.
//!
//! The checkpoint is read in its release layout only (as the converter does): routed experts are
//! FP4 codes with E8M0 scales and are written as MXFP4 whatever the output type, other weights keep
//! their source type (BF16 / F32; FP8 weights are dequantized and written as Q8_0), and the file is
//! MOSTLY_MXFP4_MOE. Multi-token-prediction (`mtp.*`) tensors are skipped, as in a plain conversion.

use super::deepseek4_weights::{fp8_dequantized, is_fp8, mxfp4_experts, tid2eid};
use super::text::{set_text_parameters, Keys};
use super::{base_filter, block_id, dir_name, Ctx, Family, OutTensor};
use crate::hf::HfError;
use crate::vocab;
use gguf::arch::key;
use gguf::Arch;
use gguf::Tensor as T;
use gguf::{Array, GgmlType, Metadata, Value};
use safetensors::Dtype;
use serde_json::Value as J;

pub struct DeepseekV4;

/// `LlamaFileType.MOSTLY_MXFP4_MOE`, set by `DeepseekV4Model.prepare_tensors` for every output type.
const MOSTLY_MXFP4_MOE: u32 = 38;

/// `_map_dsv4_tensor_name`: model-level names.
const ROOT_NAMES: &[(&str, T, &str)] = &[
    ("embed.weight", T::TokenEmbd, "weight"),
    ("norm.weight", T::OutputNorm, "weight"),
    ("head.weight", T::Output, "weight"),
    ("hc_head_fn", T::OutputHcFn, "weight"),
    ("hc_head_base", T::OutputHcBase, "weight"),
    ("hc_head_scale", T::OutputHcScale, "weight"),
];

/// `_map_dsv4_tensor_name`: per-layer names (`layers.N.<hf>` → `blk.N.<gguf>`).
const LAYER_NAMES: &[(&str, T, &str)] = &[
    ("hc_attn_fn", T::HcAttnFn, "weight"),
    ("hc_attn_base", T::HcAttnBase, "weight"),
    ("hc_attn_scale", T::HcAttnScale, "weight"),
    ("hc_ffn_fn", T::HcFfnFn, "weight"),
    ("hc_ffn_base", T::HcFfnBase, "weight"),
    ("hc_ffn_scale", T::HcFfnScale, "weight"),
    ("attn.attn_sink", T::AttnSinks, "weight"),
    ("attn.wq_a.weight", T::AttnQA, "weight"),
    ("attn.wq_b.weight", T::AttnQB, "weight"),
    ("attn.q_norm.weight", T::AttnQANorm, "weight"),
    ("attn.wkv.weight", T::AttnKv, "weight"),
    ("attn.kv_norm.weight", T::AttnKvANorm, "weight"),
    ("attn.wo_a.weight", T::AttnOutputA, "weight"),
    ("attn.wo_b.weight", T::AttnOutputB, "weight"),
    ("attn.compressor.ape", T::AttnCompressorApe, "weight"),
    ("attn.compressor.wkv.weight", T::AttnCompressorKv, "weight"),
    ("attn.compressor.wgate.weight", T::AttnCompressorGate, "weight"),
    ("attn.compressor.norm.weight", T::AttnCompressorNorm, "weight"),
    ("attn.indexer.wq_b.weight", T::IndexerAttnQB, "weight"),
    ("attn.indexer.weights_proj.weight", T::IndexerProj, "weight"),
    ("attn.indexer.compressor.ape", T::IndexerCompressorApe, "weight"),
    ("attn.indexer.compressor.wkv.weight", T::IndexerCompressorKv, "weight"),
    (
        "attn.indexer.compressor.wgate.weight",
        T::IndexerCompressorGate,
        "weight",
    ),
    (
        "attn.indexer.compressor.norm.weight",
        T::IndexerCompressorNorm,
        "weight",
    ),
    ("attn_norm.weight", T::AttnNorm, "weight"),
    ("ffn_norm.weight", T::FfnNorm, "weight"),
    ("ffn.gate.weight", T::FfnGateInp, "weight"),
    ("ffn.gate.bias", T::FfnExpProbsB, "bias"),
    ("ffn.gate.bias_vl", T::FfnExpProbsBVl, "bias"),
    ("ffn.gate.tid2eid", T::FfnGateTid2eid, "weight"),
    ("ffn.shared_experts.w1.weight", T::FfnGateShexp, "weight"),
    ("ffn.shared_experts.w2.weight", T::FfnDownShexp, "weight"),
    ("ffn.shared_experts.w3.weight", T::FfnUpShexp, "weight"),
];

/// Routed expert projections: (HF name, GGUF tensor), in the order the converter writes them.
const EXPERT_PROJS: &[(&str, T)] = &[("w1", T::FfnGateExps), ("w2", T::FfnDownExps), ("w3", T::FfnUpExps)];

fn map_name(ctx: &Ctx, name: &str) -> Result<String, HfError> {
    if let Some((_, t, suffix)) = ROOT_NAMES.iter().find(|(h, _, _)| *h == name) {
        return Ok(t.with(0, suffix));
    }
    let unsupported = || ctx.invalid(format!("unsupported DeepSeek-V4 tensor `{name}`"));
    let rest = name.strip_prefix("layers.").ok_or_else(unsupported)?;
    let (bid, tail) = rest.split_once('.').ok_or_else(unsupported)?;
    if bid.is_empty() || !bid.bytes().all(|b| b.is_ascii_digit()) {
        return Err(unsupported());
    }
    let (_, t, suffix) = LAYER_NAMES
        .iter()
        .find(|(h, _, _)| *h == tail)
        .ok_or_else(unsupported)?;
    Ok(t.with(bid.parse().map_err(|_| unsupported())?, suffix))
}

/// `layers.N.ffn.experts.E.w{1,2,3}.{weight,scale}` → (N, E).
fn routed_expert(name: &str) -> Option<(usize, usize)> {
    let rest = name.strip_prefix("layers.")?;
    let (bid, rest) = rest.split_once(".ffn.experts.")?;
    let (eid, tail) = rest.split_once('.')?;
    if !matches!(
        tail,
        "w1.weight" | "w2.weight" | "w3.weight" | "w1.scale" | "w2.scale" | "w3.scale"
    ) {
        return None;
    }
    Some((bid.parse().ok()?, eid.parse().ok()?))
}

/// The hash-routing tables of hash layers: converted, but first (`generate_extra_tensors`).
const WRITTEN_FIRST: &str = "written first";

/// Why a checkpoint tensor is deliberately not converted (`filter_tensors`, `modify_tensors`), if it is not.
fn skip_reason(name: &str, n_hash: usize) -> Option<&'static str> {
    if name.starts_with("mtp.") {
        return Some("multi-token-prediction (mtp.*) tensors, as in a conversion without MTP");
    }
    if name.starts_with("aligner.") || name.starts_with("image_") || base_filter(name).is_none() {
        return Some("vision tensors (text-only conversion)");
    }
    let hash_layer = block_id(name).is_some_and(|b| (b as usize) < n_hash);
    if name.ends_with(".ffn.gate.tid2eid") && !hash_layer {
        return Some("tid2eid tables of layers past num_hash_layers (unused)");
    }
    // hash layers route text tokens by tid2eid (and image tokens by bias_vl): gate.bias is unused
    if name.ends_with(".ffn.gate.bias") && hash_layer {
        return Some("gate.bias tensors of hash-routed layers (unused)");
    }
    if name.ends_with(".ffn.gate.tid2eid") {
        return Some(WRITTEN_FIRST);
    }
    None
}

/// The notes for the tensors [`skip_reason`] leaves out.
fn skip_notes(ctx: &Ctx) -> Vec<String> {
    let n_hash = ctx.cfg.get("num_hash_layers").and_then(J::as_u64).unwrap_or(0) as usize;
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for t in ctx.hf.tensors() {
        match skip_reason(&t.name, n_hash) {
            Some(WRITTEN_FIRST) | None => {}
            Some(r) => match counts.iter_mut().find(|(k, _)| *k == r) {
                Some((_, n)) => *n += 1,
                None => counts.push((r, 1)),
            },
        }
    }
    counts.into_iter().map(|(r, n)| format!("skipped {n} {r}")).collect()
}

fn req<'a>(ctx: &'a Ctx, key: &str) -> Result<&'a J, HfError> {
    ctx.cfg
        .get(key)
        .ok_or_else(|| ctx.invalid(format!("config.json: missing DeepSeek-V4 hyper-parameter `{key}`")))
}

fn req_u32(ctx: &Ctx, key: &str) -> Result<u32, HfError> {
    req(ctx, key)?
        .as_u64()
        .map(|v| v as u32)
        .ok_or_else(|| ctx.invalid(format!("config.json: `{key}` must be a non-negative integer")))
}

fn req_f32(ctx: &Ctx, key: &str) -> Result<f32, HfError> {
    req(ctx, key)?
        .as_f64()
        .map(|v| v as f32)
        .ok_or_else(|| ctx.invalid(format!("config.json: `{key}` must be a number")))
}

impl Family for DeepseekV4 {
    fn gguf_arch(&self, _ctx: &Ctx) -> Arch {
        Arch::Deepseek4
    }

    // DeepseekV4Model.__init__: a default chat template is added before anything else; the
    // tokenizer's own template (set_vocab) later replaces its value in place.
    fn init_metadata(&self, ctx: &Ctx, m: &mut Metadata) {
        let template = if dir_name(&ctx.dir).contains("0731") {
            include_str!("templates/deepseek-ai-DeepSeek-V4-Flash-0731.jinja")
        } else {
            include_str!("templates/deepseek-ai-DeepSeek-V4.jinja")
        };
        m.insert("tokenizer.chat_template", Value::String(template.into()));
    }

    // DeepseekV4Model.set_gguf_parameters
    fn set_parameters(&self, ctx: &Ctx, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
        set_text_parameters(ctx, Arch::Deepseek4.name(), m, file_type)?;
        let k = Keys(Arch::Deepseek4.name());
        let u = |m: &mut Metadata, key: &str, hp: &str| -> Result<(), HfError> {
            m.insert(k.k(key), Value::U32(req_u32(ctx, hp)?));
            Ok(())
        };
        let f = |m: &mut Metadata, key: &str, hp: &str| -> Result<(), HfError> {
            m.insert(k.k(key), Value::F32(req_f32(ctx, hp)?));
            Ok(())
        };
        let block_count = req_u32(ctx, "num_hidden_layers")? as usize;
        u(m, key::ROPE_DIMENSION_COUNT, "qk_rope_head_dim")?;
        u(m, key::ATTN_Q_LORA_RANK, "q_lora_rank")?;
        u(m, key::ATTN_SLIDING_WINDOW, "sliding_window")?;
        u(m, key::EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size")?;
        u(m, key::EXPERT_SHARED_COUNT, "n_shared_experts")?;
        f(m, key::EXPERT_WEIGHTS_SCALE, "routed_scaling_factor")?;
        let norm = req(ctx, "norm_topk_prob")?
            .as_bool()
            .ok_or_else(|| ctx.invalid("config.json: `norm_topk_prob` must be a boolean"))?;
        m.insert(k.k(key::EXPERT_WEIGHTS_NORM), Value::Bool(norm));
        let limit = req_f32(ctx, "swiglu_limit")?;
        m.insert(
            k.k(key::SWIGLU_CLAMP_EXP),
            Value::Array(Array::F32(vec![limit; block_count])),
        );
        m.insert(
            k.k(key::SWIGLU_CLAMP_SHEXP),
            Value::Array(Array::F32(vec![limit; block_count])),
        );
        u(m, key::ATTN_INDEXER_HEAD_COUNT, "index_n_heads")?;
        u(m, key::ATTN_INDEXER_KEY_LENGTH, "index_head_dim")?;
        u(m, key::ATTN_INDEXER_TOP_K, "index_topk")?;
        u(m, key::ATTN_OUTPUT_GROUP_COUNT, "o_groups")?;
        u(m, key::ATTN_OUTPUT_LORA_RANK, "o_lora_rank")?;
        let ratios = req(ctx, "compress_ratios")?
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|v| v.as_i64().map(|x| x as i32))
                    .collect::<Option<Vec<i32>>>()
            })
            .ok_or_else(|| ctx.invalid("config.json: `compress_ratios` must be a list of integers"))?;
        m.insert(k.k(key::ATTN_COMPRESS_RATIOS), Value::Array(Array::I32(ratios)));
        f(m, key::ATTN_COMPRESS_ROPE_FREQ_BASE, "compress_rope_theta")?;
        u(m, key::HYPER_CONNECTION_COUNT, "hc_mult")?;
        u(m, key::HYPER_CONNECTION_SINKHORN_ITERATIONS, "hc_sinkhorn_iters")?;
        f(m, key::HYPER_CONNECTION_EPSILON, "hc_eps")?;
        u(m, key::HASH_LAYER_COUNT, "num_hash_layers")?;
        let out_len = req_u32(ctx, "hidden_size")? * req_u32(ctx, "hc_mult")?;
        m.insert(k.k(key::EMBEDDING_LENGTH_OUT), Value::U32(out_len));
        Ok(())
    }

    // TextModel.set_vocab → _set_vocab_gpt2
    fn set_vocab(&self, ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
        let mut notes = vocab::VocabNotes::default();
        vocab::set_vocab_gpt2(&ctx.dir, &ctx.cfg, m, &mut notes)?;
        ctx.notes.extend(notes.warnings);
        // tensors() cannot record notes (it sees `ctx` read-only); the skipped tensors are noted here.
        let skipped = skip_notes(ctx);
        ctx.notes.extend(skipped);
        Ok(())
    }

    fn tensors(&self, ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
        let n_layer = req_u32(ctx, "num_hidden_layers")? as usize;
        let n_hash = req_u32(ctx, "num_hash_layers")? as usize;
        let n_expert = req_u32(ctx, "n_routed_experts")? as usize;
        // generate_extra_tensors: the hash-routing tables, then every layer's stacked experts.
        let mut out = Vec::new();
        for bid in 0..n_hash {
            let src = format!("layers.{bid}.ffn.gate.tid2eid");
            let t = ctx
                .hf
                .get(&src)
                .ok_or_else(|| ctx.invalid(format!("missing hash routing tensor `{src}`")))?;
            out.push(tid2eid(ctx, T::FfnGateTid2eid.blk(bid), t)?);
        }
        for bid in 0..n_layer {
            for (proj, gguf) in EXPERT_PROJS {
                out.push(mxfp4_experts(ctx, gguf.blk(bid), bid, proj, n_expert)?);
            }
        }
        // get_tensors → filter_tensors → modify_tensors for everything else.
        for t in ctx.hf.tensors() {
            if skip_reason(&t.name, n_hash).is_some() {
                continue;
            }
            let name = base_filter(&t.name).expect("skip_reason checks base_filter");
            if let Some((bid, eid)) = routed_expert(&name) {
                if bid >= n_layer || eid >= n_expert {
                    return Err(ctx.invalid(format!(
                        "routed expert tensor `{name}` is outside {n_layer} layers × {n_expert} experts"
                    )));
                }
                continue; // written above
            }
            if let Some(base) = name.strip_suffix(".scale") {
                let weight = format!("{base}.weight");
                if ctx.hf.get(&weight).is_some_and(is_fp8) {
                    continue; // dequant_model: folded into its FP8 weight
                }
            }
            let gguf_name = map_name(ctx, &name)?;
            if is_fp8(t) {
                let scale = name.strip_suffix(".weight").map(|b| format!("{b}.scale"));
                match scale.filter(|s| ctx.hf.get(s).is_some()) {
                    Some(scale) => out.push(fp8_dequantized(ctx, gguf_name, t, &scale)?),
                    None => return Err(ctx.invalid(format!("FP8 tensor `{name}` has no `.scale` tensor"))),
                }
                continue;
            }
            if !matches!(t.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
                return Err(ctx.invalid(format!(
                    "tensor `{}` has dtype {:?}, which the DeepSeek-V4 converter cannot write",
                    t.name, t.dtype
                )));
            }
            out.push(OutTensor::from_hf(gguf_name, t));
        }
        Ok(out)
    }

    // tensor_force_quant: source F32 tensors stay F32 and 2-D BF16 ones BF16, whatever the output type.
    fn force_type(&self, ctx: &Ctx, t: &OutTensor, _outtype: GgmlType) -> Option<GgmlType> {
        match ctx.hf.get(&t.source)?.dtype {
            Dtype::F32 => Some(GgmlType::F32),
            Dtype::BF16 if t.shape.len() >= 2 => Some(GgmlType::BF16),
            _ => None,
        }
    }

    fn file_type(&self, _ctx: &Ctx, _ftype: u32) -> u32 {
        MOSTLY_MXFP4_MOE
    }
}

#[cfg(test)]
mod tests {
    use super::routed_expert;

    #[test]
    fn recognises_routed_experts() {
        assert_eq!(routed_expert("layers.2.ffn.experts.3.w1.scale"), Some((2, 3)));
        assert_eq!(routed_expert("layers.0.ffn.experts.0.w3.weight"), Some((0, 0)));
        assert_eq!(routed_expert("layers.0.ffn.shared_experts.w1.weight"), None);
        assert_eq!(routed_expert("layers.0.ffn.experts.0.w4.weight"), None);
    }
}
