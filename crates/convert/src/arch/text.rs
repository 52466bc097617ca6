//! What every text model writes: `TextModel.__init__`'s rope-parameter normalisation and
//! `TextModel.set_gguf_parameters` (llama.cpp `conversion/base.py`).

use super::Ctx;
use crate::hf::HfError;
use gguf::arch::key;
use gguf::{Array, Metadata, Value};
use serde_json::{Map, Value as J};

/// `rope_parameters` (or legacy `rope_scaling`) with the global theta / partial factor mirrored in.
pub fn rope_parameters(ctx: &Ctx) -> Map<String, J> {
    let cfg = &ctx.cfg;
    let mut rp = match cfg.get("rope_parameters").or_else(|| cfg.get("rope_scaling")) {
        Some(J::Object(o)) => o.clone(),
        _ => Map::new(),
    };
    if !rp.contains_key("full_attention") && !rp.contains_key("sliding_attention") {
        let theta = cfg
            .find(&[
                "global_rope_theta",
                "rope_global_theta",
                "rope_theta_global",
                "rope_theta",
                "rotary_emb_base",
            ])
            .cloned();
        let local = cfg
            .find(&[
                "local_rope_theta",
                "rope_local_theta",
                "rope_theta_local",
                "swa_rope_theta",
                "rope_local_base_freq",
            ])
            .cloned();
        let partial = cfg
            .find(&["partial_rotary_factor", "rope_pct", "rope_percent"])
            .cloned();
        let orig = cfg.find(&["original_max_position_embeddings"]).cloned();
        if let Some(l) = local {
            let mut o = Map::new();
            o.insert("rope_theta".into(), l);
            rp.insert("sliding_attention".into(), J::Object(o));
        }
        if !rp.contains_key("rope_theta") {
            if let Some(t) = theta {
                rp.insert("rope_theta".into(), t);
            }
        }
        if !rp.contains_key("rope_type") {
            if let Some(t) = rp.get("type").cloned() {
                rp.insert("rope_type".into(), t);
            }
        }
        if !rp.contains_key("partial_rotary_factor") {
            if let Some(p) = partial {
                rp.insert("partial_rotary_factor".into(), p);
            }
        }
        if !rp.contains_key("original_max_position_embeddings") {
            if let Some(o) = orig {
                rp.insert("original_max_position_embeddings".into(), o);
            }
        }
    }
    rp
}

/// The rope parameters of full-attention layers.
pub fn full_attention_rope(rp: &Map<String, J>) -> Map<String, J> {
    match rp.get("full_attention") {
        Some(J::Object(o)) => o.clone(),
        _ => rp.clone(),
    }
}

/// `{arch}.key` helper.
pub struct Keys<'a>(pub &'a str);
impl Keys<'_> {
    pub fn k(&self, key: &str) -> String {
        format!("{}.{key}", self.0)
    }
}

fn u32_of(v: &J) -> Option<u32> {
    v.as_u64().map(|x| x as u32)
}

fn f32_of(v: &J) -> Option<f32> {
    v.as_f64().map(|x| x as f32)
}

/// `TextModel.set_gguf_parameters`.
pub fn set_text_parameters(ctx: &Ctx, arch: &str, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
    let cfg = &ctx.cfg;
    let k = Keys(arch);
    let block_count = cfg.req_u64(&["n_layers", "num_hidden_layers", "n_layer", "num_layers"])?;
    m.insert(k.k(key::BLOCK_COUNT), Value::U32(block_count as u32));
    let put_u32 = |m: &mut Metadata, key: &str, keys: &[&str]| {
        if let Some(v) = cfg.find(keys).and_then(u32_of) {
            m.insert(k.k(key), Value::U32(v));
        }
    };
    put_u32(
        m,
        key::CONTEXT_LENGTH,
        &[
            "max_position_embeddings",
            "n_ctx",
            "n_positions",
            "max_length",
            "max_sequence_length",
            "model_max_length",
        ],
    );
    put_u32(m, key::EMBEDDING_LENGTH, &["hidden_size", "n_embd", "dim"]);
    put_u32(
        m,
        key::FEED_FORWARD_LENGTH,
        &[
            "prefix_dense_intermediate_size",
            "dense_intermediate_size",
            "intermediate_size",
            "n_inner",
            "hidden_dim",
        ],
    );
    put_u32(m, key::ATTN_HEAD_COUNT, &["num_attention_heads", "n_head", "n_heads"]);
    put_u32(m, key::ATTN_HEAD_COUNT_KV, &["num_key_value_heads", "n_kv_heads"]);
    if cfg.get("is_causal") == Some(&J::Bool(false)) {
        m.insert(k.k(key::ATTN_CAUSAL), Value::Bool(false));
    }
    let rp_all = rope_parameters(ctx);
    let rp = full_attention_rope(&rp_all);
    if let Some(rope_type) = rp.get("rope_type").and_then(J::as_str) {
        let factor = rp.get("factor").and_then(f32_of);
        match (rope_type, factor) {
            ("linear", Some(f)) => {
                m.insert(k.k(key::ROPE_SCALING_TYPE), Value::String("linear".into()));
                m.insert(k.k(key::ROPE_SCALING_FACTOR), Value::F32(f));
            }
            ("yarn", Some(f)) => {
                m.insert(k.k(key::ROPE_SCALING_TYPE), Value::String("yarn".into()));
                m.insert(k.k(key::ROPE_SCALING_FACTOR), Value::F32(f));
                let orig = rp
                    .get("original_max_position_embeddings")
                    .and_then(u32_of)
                    .ok_or_else(|| ctx.invalid("yarn rope scaling without original_max_position_embeddings"))?;
                m.insert(k.k(key::ROPE_SCALING_ORIG_CTX_LEN), Value::U32(orig));
                if let Some(v) = rp.get("extrapolation_factor").and_then(f32_of) {
                    m.insert(k.k(key::ROPE_SCALING_YARN_EXT_FACTOR), Value::F32(v));
                }
                if let Some(v) = rp
                    .get("attention_factor")
                    .or_else(|| rp.get("attn_factor"))
                    .and_then(f32_of)
                {
                    m.insert(k.k(key::ROPE_SCALING_YARN_ATTN_FACTOR), Value::F32(v));
                }
                if let Some(v) = rp.get("beta_fast").and_then(f32_of) {
                    m.insert(k.k(key::ROPE_SCALING_YARN_BETA_FAST), Value::F32(v));
                }
                if let Some(v) = rp.get("beta_slow").and_then(f32_of) {
                    m.insert(k.k(key::ROPE_SCALING_YARN_BETA_SLOW), Value::F32(v));
                }
            }
            ("su" | "longrope", _) => {
                m.insert(k.k(key::ROPE_SCALING_TYPE), Value::String("longrope".into()));
            }
            _ => {}
        }
    }
    if let Some(J::Array(sections)) = rp_all.get("mrope_section") {
        let mut s: Vec<i32> = sections.iter().filter_map(|v| v.as_i64().map(|x| x as i32)).collect();
        s.resize(s.len().max(4), 0);
        s.truncate(4);
        m.insert(k.k(key::ROPE_DIMENSION_SECTIONS), Value::Array(Array::I32(s)));
    }
    if let Some(t) = rp.get("rope_theta").and_then(f32_of) {
        m.insert(k.k(key::ROPE_FREQ_BASE), Value::F32(t));
    }
    if let Some(t) = rp_all
        .get("sliding_attention")
        .and_then(|s| s.get("rope_theta"))
        .and_then(f32_of)
    {
        m.insert(k.k(key::ROPE_FREQ_BASE_SWA), Value::F32(t));
    }
    if let Some(e) = cfg.find(&["rms_norm_eps", "norm_eps"]).and_then(f32_of) {
        m.insert(k.k(key::ATTN_LAYERNORM_RMS_EPS), Value::F32(e));
    }
    if let Some(e) = cfg
        .find(&["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"])
        .and_then(f32_of)
    {
        m.insert(k.k(key::ATTN_LAYERNORM_EPS), Value::F32(e));
    }
    put_u32(
        m,
        key::EXPERT_COUNT,
        &["num_local_experts", "num_experts", "n_routed_experts"],
    );
    put_u32(
        m,
        key::EXPERT_USED_COUNT,
        &["num_experts_per_tok", "num_experts_per_token", "top_k_experts"],
    );
    put_u32(m, key::EXPERT_GROUP_COUNT, &["n_group"]);
    put_u32(m, key::EXPERT_GROUP_USED_COUNT, &["topk_group"]);
    if let Some(f) = cfg
        .find(&[
            "score_function",
            "scoring_func",
            "score_func",
            "moe_router_activation",
            "moe_router_activation_func",
            "expert_selection_fn",
        ])
        .and_then(J::as_str)
    {
        let v = match f {
            "softmax" => 1,
            "sigmoid" => 2,
            "sqrtsoftplus" => 4,
            other => return Err(ctx.invalid(format!("unsupported expert score gating function `{other}`"))),
        };
        m.insert(k.k(key::EXPERT_GATING_FUNC), Value::U32(v));
    }
    if let Some(hd) = cfg.get("head_dim").and_then(u32_of) {
        m.insert(k.k(key::ATTN_KEY_LENGTH), Value::U32(hd));
        m.insert(k.k(key::ATTN_VALUE_LENGTH), Value::U32(hd));
    }
    m.insert(gguf::keys::FILE_TYPE, Value::U32(file_type));
    Ok(())
}
