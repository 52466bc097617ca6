//! HF → GGUF tensor names, one table (a subset of gguf-py's `tensor_mapping.py` for the families
//! hf2q converts). `{bid}` stands for the block index; the `.weight` / `.bias` suffix is kept.

/// (HF name template, GGUF name template, models the alias comes from)
pub const TENSOR_NAMES: &[(&str, &str, &str)] = &[
    ("model.embed_tokens", "token_embd", "llama, qwen2, qwen3, gemma"),
    ("model.norm", "output_norm", "llama, qwen2, qwen3"),
    ("lm_head", "output", "llama, qwen2, qwen3"),
    (
        "model.layers.{bid}.input_layernorm",
        "blk.{bid}.attn_norm",
        "llama, qwen2, qwen3",
    ),
    (
        "model.layers.{bid}.self_attn.q_proj",
        "blk.{bid}.attn_q",
        "llama, qwen2, qwen3",
    ),
    (
        "model.layers.{bid}.self_attn.k_proj",
        "blk.{bid}.attn_k",
        "llama, qwen2, qwen3",
    ),
    (
        "model.layers.{bid}.self_attn.v_proj",
        "blk.{bid}.attn_v",
        "llama, qwen2, qwen3",
    ),
    (
        "model.layers.{bid}.self_attn.o_proj",
        "blk.{bid}.attn_output",
        "llama, qwen2, qwen3",
    ),
    ("model.layers.{bid}.self_attn.q_norm", "blk.{bid}.attn_q_norm", "qwen3"),
    ("model.layers.{bid}.self_attn.k_norm", "blk.{bid}.attn_k_norm", "qwen3"),
    (
        "model.layers.{bid}.post_attention_layernorm",
        "blk.{bid}.ffn_norm",
        "llama, qwen2, qwen3",
    ),
    (
        "model.layers.{bid}.mlp.gate_proj",
        "blk.{bid}.ffn_gate",
        "llama, qwen2, qwen3",
    ),
    (
        "model.layers.{bid}.mlp.up_proj",
        "blk.{bid}.ffn_up",
        "llama, qwen2, qwen3",
    ),
    (
        "model.layers.{bid}.mlp.down_proj",
        "blk.{bid}.ffn_down",
        "llama, qwen2, qwen3",
    ),
    ("model.layers.{bid}.mlp.gate", "blk.{bid}.ffn_gate_inp", "qwen3moe"),
    (
        "model.layers.{bid}.mlp.experts.gate_proj",
        "blk.{bid}.ffn_gate_exps",
        "qwen3moe (stacked experts)",
    ),
    (
        "model.layers.{bid}.mlp.experts.up_proj",
        "blk.{bid}.ffn_up_exps",
        "qwen3moe (stacked experts)",
    ),
    (
        "model.layers.{bid}.mlp.experts.down_proj",
        "blk.{bid}.ffn_down_exps",
        "qwen3moe (stacked experts)",
    ),
    // gemma (gemma3, gemma4); `post_attention_layernorm` is ATTN_POST_NORM there (arch/gemma.rs)
    (
        "model.layers.{bid}.pre_feedforward_layernorm",
        "blk.{bid}.ffn_norm",
        "gemma3, gemma4",
    ),
    (
        "model.layers.{bid}.post_feedforward_layernorm",
        "blk.{bid}.post_ffw_norm",
        "gemma3, gemma4",
    ),
    (
        "model.layers.{bid}.pre_feedforward_layernorm_2",
        "blk.{bid}.pre_ffw_norm_2",
        "gemma4",
    ),
    (
        "model.layers.{bid}.post_feedforward_layernorm_1",
        "blk.{bid}.post_ffw_norm_1",
        "gemma4",
    ),
    (
        "model.layers.{bid}.post_feedforward_layernorm_2",
        "blk.{bid}.post_ffw_norm_2",
        "gemma4",
    ),
    ("model.layers.{bid}.router.proj", "blk.{bid}.ffn_gate_inp", "gemma4"),
    (
        "model.layers.{bid}.experts.gate_up_proj",
        "blk.{bid}.ffn_gate_up_exps",
        "gemma4",
    ),
    (
        "model.layers.{bid}.experts.down_proj",
        "blk.{bid}.ffn_down_exps",
        "gemma4",
    ),
    (
        "model.layers.{bid}.layer_scalar",
        "blk.{bid}.layer_output_scale",
        "gemma4",
    ),
    (
        "model.embed_tokens_per_layer",
        "per_layer_token_embd",
        "gemma3n, gemma4",
    ),
    (
        "model.per_layer_model_projection",
        "per_layer_model_proj",
        "gemma3n, gemma4",
    ),
    (
        "model.per_layer_projection_norm",
        "per_layer_proj_norm",
        "gemma3n, gemma4",
    ),
    (
        "model.layers.{bid}.per_layer_input_gate",
        "blk.{bid}.inp_gate",
        "gemma3n, gemma4",
    ),
    (
        "model.layers.{bid}.per_layer_projection",
        "blk.{bid}.proj",
        "gemma3n, gemma4",
    ),
    (
        "model.layers.{bid}.post_per_layer_input_norm",
        "blk.{bid}.post_norm",
        "gemma3n, gemma4",
    ),
    // qwen35 (Gated DeltaNet linear attention, shared expert, MTP/nextn)
    (
        "model.layers.{bid}.linear_attn.in_proj_qkv",
        "blk.{bid}.attn_qkv",
        "qwen3.5",
    ),
    (
        "model.layers.{bid}.linear_attn.in_proj_z",
        "blk.{bid}.attn_gate",
        "qwen3.5",
    ),
    (
        "model.layers.{bid}.linear_attn.in_proj_a",
        "blk.{bid}.ssm_alpha",
        "qwen3.5",
    ),
    (
        "model.layers.{bid}.linear_attn.in_proj_b",
        "blk.{bid}.ssm_beta",
        "qwen3.5",
    ),
    (
        "model.layers.{bid}.linear_attn.conv1d",
        "blk.{bid}.ssm_conv1d",
        "qwen3next",
    ),
    (
        "model.layers.{bid}.linear_attn.dt_proj",
        "blk.{bid}.ssm_dt",
        "qwen3next",
    ),
    ("model.layers.{bid}.linear_attn.A_log", "blk.{bid}.ssm_a", "qwen3next"),
    ("model.layers.{bid}.linear_attn.norm", "blk.{bid}.ssm_norm", "qwen3next"),
    (
        "model.layers.{bid}.linear_attn.out_proj",
        "blk.{bid}.ssm_out",
        "qwen3next",
    ),
    (
        "model.layers.{bid}.mlp.shared_expert.gate_proj",
        "blk.{bid}.ffn_gate_shexp",
        "qwen2moe",
    ),
    (
        "model.layers.{bid}.mlp.shared_expert.up_proj",
        "blk.{bid}.ffn_up_shexp",
        "qwen2moe",
    ),
    (
        "model.layers.{bid}.mlp.shared_expert.down_proj",
        "blk.{bid}.ffn_down_shexp",
        "qwen2moe",
    ),
    (
        "model.layers.{bid}.mlp.shared_expert_gate",
        "blk.{bid}.ffn_gate_inp_shexp",
        "qwen2moe",
    ),
    ("model.layers.{bid}.eh_proj", "blk.{bid}.nextn.eh_proj", "nextn (mtp)"),
    (
        "model.layers.{bid}.embed_tokens",
        "blk.{bid}.nextn.embed_tokens",
        "nextn (mtp)",
    ),
    ("model.layers.{bid}.enorm", "blk.{bid}.nextn.enorm", "nextn (mtp)"),
    ("model.layers.{bid}.hnorm", "blk.{bid}.nextn.hnorm", "nextn (mtp)"),
    (
        "model.layers.{bid}.shared_head.head",
        "blk.{bid}.nextn.shared_head_head",
        "nextn (mtp)",
    ),
    (
        "model.layers.{bid}.shared_head.norm",
        "blk.{bid}.nextn.shared_head_norm",
        "nextn (mtp)",
    ),
    // bert
    ("embeddings.word_embeddings", "token_embd", "bert, nomic-bert"),
    ("embeddings.token_type_embeddings", "token_types", "bert, nomic-bert"),
    ("embeddings.position_embeddings", "position_embd", "bert"),
    ("embeddings.LayerNorm", "token_embd_norm", "bert"),
    ("encoder.layer.{bid}.attention.self.query", "blk.{bid}.attn_q", "bert"),
    ("encoder.layer.{bid}.attention.self.key", "blk.{bid}.attn_k", "bert"),
    ("encoder.layer.{bid}.attention.self.value", "blk.{bid}.attn_v", "bert"),
    (
        "encoder.layer.{bid}.attention.output.dense",
        "blk.{bid}.attn_output",
        "bert",
    ),
    (
        "encoder.layer.{bid}.attention.output.LayerNorm",
        "blk.{bid}.attn_output_norm",
        "bert",
    ),
    ("encoder.layer.{bid}.intermediate.dense", "blk.{bid}.ffn_up", "bert"),
    ("encoder.layer.{bid}.output.dense", "blk.{bid}.ffn_down", "bert"),
    (
        "encoder.layer.{bid}.output.LayerNorm",
        "blk.{bid}.layer_output_norm",
        "bert",
    ),
    ("emb_ln", "token_embd_norm", "nomic-bert"),
    ("encoder.layers.{bid}.attn.Wqkv", "blk.{bid}.attn_qkv", "nomic-bert"),
    (
        "encoder.layers.{bid}.attn.out_proj",
        "blk.{bid}.attn_output",
        "nomic-bert",
    ),
    ("encoder.layers.{bid}.norm1", "blk.{bid}.attn_output_norm", "nomic-bert"),
    ("encoder.layers.{bid}.mlp.fc11", "blk.{bid}.ffn_up", "nomic-bert"),
    ("encoder.layers.{bid}.mlp.fc12", "blk.{bid}.ffn_gate", "nomic-bert"),
    ("encoder.layers.{bid}.mlp.fc2", "blk.{bid}.ffn_down", "nomic-bert"),
    (
        "encoder.layers.{bid}.norm2",
        "blk.{bid}.layer_output_norm",
        "nomic-bert",
    ),
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
    let (_, gguf, _) = TENSOR_NAMES.iter().find(|(hf, _, _)| *hf == templ)?;
    let mapped = match &bid {
        Some(b) => gguf.replace("{bid}", b),
        None => gguf.to_string(),
    };
    Some(format!("{mapped}{suffix}"))
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
