//! HF → GGUF tensor names, one table (a subset of gguf-py's `tensor_mapping.py` for the families
//! hf2q converts). `{bid}` stands for the block index; the `.weight` / `.bias` suffix is kept.
//! The GGUF side is a [`gguf::Tensor`] of the shared architecture table.

use gguf::Tensor as T;

/// (HF name template, GGUF tensor, models the alias comes from)
pub const TENSOR_NAMES: &[(&str, T, &str)] = &[
    ("model.embed_tokens", T::TokenEmbd, "llama, qwen2, qwen3, gemma"),
    ("model.norm", T::OutputNorm, "llama, qwen2, qwen3"),
    ("lm_head", T::Output, "llama, qwen2, qwen3"),
    ("model.layers.{bid}.input_layernorm", T::AttnNorm, "llama, qwen2, qwen3"),
    ("model.layers.{bid}.self_attn.q_proj", T::AttnQ, "llama, qwen2, qwen3"),
    ("model.layers.{bid}.self_attn.k_proj", T::AttnK, "llama, qwen2, qwen3"),
    ("model.layers.{bid}.self_attn.v_proj", T::AttnV, "llama, qwen2, qwen3"),
    (
        "model.layers.{bid}.self_attn.o_proj",
        T::AttnOutput,
        "llama, qwen2, qwen3",
    ),
    ("model.layers.{bid}.self_attn.q_norm", T::AttnQNorm, "qwen3"),
    ("model.layers.{bid}.self_attn.k_norm", T::AttnKNorm, "qwen3"),
    (
        "model.layers.{bid}.post_attention_layernorm",
        T::FfnNorm,
        "llama, qwen2, qwen3",
    ),
    ("model.layers.{bid}.mlp.gate_proj", T::FfnGate, "llama, qwen2, qwen3"),
    ("model.layers.{bid}.mlp.up_proj", T::FfnUp, "llama, qwen2, qwen3"),
    ("model.layers.{bid}.mlp.down_proj", T::FfnDown, "llama, qwen2, qwen3"),
    ("model.layers.{bid}.mlp.gate", T::FfnGateInp, "qwen3moe"),
    (
        "model.layers.{bid}.mlp.experts.gate_proj",
        T::FfnGateExps,
        "qwen3moe (stacked experts)",
    ),
    (
        "model.layers.{bid}.mlp.experts.up_proj",
        T::FfnUpExps,
        "qwen3moe (stacked experts)",
    ),
    (
        "model.layers.{bid}.mlp.experts.down_proj",
        T::FfnDownExps,
        "qwen3moe (stacked experts)",
    ),
    // gemma (gemma3, gemma4); `post_attention_layernorm` is ATTN_POST_NORM there (arch/gemma.rs)
    (
        "model.layers.{bid}.pre_feedforward_layernorm",
        T::FfnNorm,
        "gemma3, gemma4",
    ),
    (
        "model.layers.{bid}.post_feedforward_layernorm",
        T::FfnPostNorm,
        "gemma3, gemma4",
    ),
    (
        "model.layers.{bid}.pre_feedforward_layernorm_2",
        T::FfnPreNorm2,
        "gemma4",
    ),
    (
        "model.layers.{bid}.post_feedforward_layernorm_1",
        T::FfnPostNorm1,
        "gemma4",
    ),
    (
        "model.layers.{bid}.post_feedforward_layernorm_2",
        T::FfnPostNorm2,
        "gemma4",
    ),
    ("model.layers.{bid}.router.proj", T::FfnGateInp, "gemma4"),
    ("model.layers.{bid}.experts.gate_up_proj", T::FfnGateUpExps, "gemma4"),
    ("model.layers.{bid}.experts.down_proj", T::FfnDownExps, "gemma4"),
    ("model.layers.{bid}.layer_scalar", T::LayerOutputScale, "gemma4"),
    ("model.embed_tokens_per_layer", T::PerLayerTokenEmbd, "gemma3n, gemma4"),
    (
        "model.per_layer_model_projection",
        T::PerLayerModelProj,
        "gemma3n, gemma4",
    ),
    (
        "model.per_layer_projection_norm",
        T::PerLayerProjNorm,
        "gemma3n, gemma4",
    ),
    (
        "model.layers.{bid}.per_layer_input_gate",
        T::PerLayerInpGate,
        "gemma3n, gemma4",
    ),
    (
        "model.layers.{bid}.per_layer_projection",
        T::PerLayerProj,
        "gemma3n, gemma4",
    ),
    (
        "model.layers.{bid}.post_per_layer_input_norm",
        T::PerLayerPostNorm,
        "gemma3n, gemma4",
    ),
    // qwen35 (Gated DeltaNet linear attention, shared expert, MTP/nextn)
    ("model.layers.{bid}.linear_attn.in_proj_qkv", T::AttnQkv, "qwen3.5"),
    ("model.layers.{bid}.linear_attn.in_proj_z", T::AttnGate, "qwen3.5"),
    ("model.layers.{bid}.linear_attn.in_proj_a", T::SsmAlpha, "qwen3.5"),
    ("model.layers.{bid}.linear_attn.in_proj_b", T::SsmBeta, "qwen3.5"),
    ("model.layers.{bid}.linear_attn.conv1d", T::SsmConv1d, "qwen3next"),
    ("model.layers.{bid}.linear_attn.dt_proj", T::SsmDt, "qwen3next"),
    ("model.layers.{bid}.linear_attn.A_log", T::SsmA, "qwen3next"),
    ("model.layers.{bid}.linear_attn.norm", T::SsmNorm, "qwen3next"),
    ("model.layers.{bid}.linear_attn.out_proj", T::SsmOut, "qwen3next"),
    (
        "model.layers.{bid}.mlp.shared_expert.gate_proj",
        T::FfnGateShexp,
        "qwen2moe",
    ),
    (
        "model.layers.{bid}.mlp.shared_expert.up_proj",
        T::FfnUpShexp,
        "qwen2moe",
    ),
    (
        "model.layers.{bid}.mlp.shared_expert.down_proj",
        T::FfnDownShexp,
        "qwen2moe",
    ),
    (
        "model.layers.{bid}.mlp.shared_expert_gate",
        T::FfnGateInpShexp,
        "qwen2moe",
    ),
    ("model.layers.{bid}.eh_proj", T::NextnEhProj, "nextn (mtp)"),
    ("model.layers.{bid}.embed_tokens", T::NextnEmbedTokens, "nextn (mtp)"),
    ("model.layers.{bid}.enorm", T::NextnEnorm, "nextn (mtp)"),
    ("model.layers.{bid}.hnorm", T::NextnHnorm, "nextn (mtp)"),
    (
        "model.layers.{bid}.shared_head.head",
        T::NextnSharedHeadHead,
        "nextn (mtp)",
    ),
    (
        "model.layers.{bid}.shared_head.norm",
        T::NextnSharedHeadNorm,
        "nextn (mtp)",
    ),
    // bert
    ("embeddings.word_embeddings", T::TokenEmbd, "bert, nomic-bert"),
    ("embeddings.token_type_embeddings", T::TokenTypes, "bert, nomic-bert"),
    ("embeddings.position_embeddings", T::PositionEmbd, "bert"),
    ("embeddings.LayerNorm", T::TokenEmbdNorm, "bert"),
    ("encoder.layer.{bid}.attention.self.query", T::AttnQ, "bert"),
    ("encoder.layer.{bid}.attention.self.key", T::AttnK, "bert"),
    ("encoder.layer.{bid}.attention.self.value", T::AttnV, "bert"),
    ("encoder.layer.{bid}.attention.output.dense", T::AttnOutput, "bert"),
    (
        "encoder.layer.{bid}.attention.output.LayerNorm",
        T::AttnOutputNorm,
        "bert",
    ),
    ("encoder.layer.{bid}.intermediate.dense", T::FfnUp, "bert"),
    ("encoder.layer.{bid}.output.dense", T::FfnDown, "bert"),
    ("encoder.layer.{bid}.output.LayerNorm", T::LayerOutputNorm, "bert"),
    ("emb_ln", T::TokenEmbdNorm, "nomic-bert"),
    ("encoder.layers.{bid}.attn.Wqkv", T::AttnQkv, "nomic-bert"),
    ("encoder.layers.{bid}.attn.out_proj", T::AttnOutput, "nomic-bert"),
    ("encoder.layers.{bid}.norm1", T::AttnOutputNorm, "nomic-bert"),
    ("encoder.layers.{bid}.mlp.fc11", T::FfnUp, "nomic-bert"),
    ("encoder.layers.{bid}.mlp.fc12", T::FfnGate, "nomic-bert"),
    ("encoder.layers.{bid}.mlp.fc2", T::FfnDown, "nomic-bert"),
    ("encoder.layers.{bid}.norm2", T::LayerOutputNorm, "nomic-bert"),
];

/// Map an HF tensor name (with `.weight`/`.bias`) to its GGUF name, or `None` if unmapped.
pub fn map_name(name: &str) -> Option<String> {
    let (base, suffix) = [".weight", ".bias"]
        .iter()
        .find_map(|s| name.strip_suffix(s).map(|b| (b, *s)))
        .unwrap_or((name, ""));
    // Replace the first all-digit dot-separated part with {bid}.
    let mut bid = None;
    let templ: Vec<String> = base
        .split('.')
        .map(|p| {
            if bid.is_none() && !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                bid = Some(p.to_string());
                "{bid}".to_string()
            } else {
                p.to_string()
            }
        })
        .collect();
    let templ = templ.join(".");
    let (_, t, _) = TENSOR_NAMES.iter().find(|(hf, _, _)| *hf == templ)?;
    let bid = match bid {
        Some(b) => b.parse().ok()?,
        None => 0,
    };
    Some(format!("{}{suffix}", t.base(bid)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn maps_names() {
        assert_eq!(
            super::map_name("model.layers.12.self_attn.q_proj.weight").as_deref(),
            Some("blk.12.attn_q.weight")
        );
        assert_eq!(
            super::map_name("model.layers.0.self_attn.k_proj.bias").as_deref(),
            Some("blk.0.attn_k.bias")
        );
        assert_eq!(
            super::map_name("model.embed_tokens.weight").as_deref(),
            Some("token_embd.weight")
        );
        assert_eq!(super::map_name("model.layers.0.unknown.weight"), None);
    }
}
