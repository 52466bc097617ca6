//! The architecture table shared by `convert` (which writes GGUF files) and the engine (which
//! reads them): each GGUF `general.architecture` with the tensors it may contain, the tensor names
//! (gguf-py's `constants.py` `TENSOR_NAMES`, llama.cpp's `LLM_TENSOR_NAMES`) and the
//! `{arch}.*` hyper-parameter keys (`Keys.LLM`, `Keys.Attention`, `Keys.Rope`, … there). Neither
//! crate spells a tensor name or an architecture key as a string literal of its own.

macro_rules! tensors {
    ($($v:ident => $name:literal,)*) => {
        /// A GGUF tensor kind. Names in a block are `blk.{bid}.<name>`; the others stand alone.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Tensor { $($v,)* }

        impl Tensor {
            /// Every tensor kind.
            pub const ALL: &'static [Tensor] = &[$(Tensor::$v,)*];

            /// The name template (`blk.{bid}.attn_q`, `token_embd`), without `.weight` / `.bias`.
            pub const fn template(self) -> &'static str {
                match self { $(Tensor::$v => $name,)* }
            }
        }
    };
}

tensors! {
    TokenEmbd => "token_embd",
    TokenEmbdNorm => "token_embd_norm",
    TokenTypes => "token_types",
    PositionEmbd => "position_embd",
    Output => "output",
    OutputNorm => "output_norm",
    RopeFreqs => "rope_freqs",
    PerLayerTokenEmbd => "per_layer_token_embd",
    PerLayerModelProj => "per_layer_model_proj",
    PerLayerProjNorm => "per_layer_proj_norm",
    OutputHcFn => "output_hc_fn",
    OutputHcBase => "output_hc_base",
    OutputHcScale => "output_hc_scale",
    AttnNorm => "blk.{bid}.attn_norm",
    AttnQ => "blk.{bid}.attn_q",
    AttnK => "blk.{bid}.attn_k",
    AttnV => "blk.{bid}.attn_v",
    AttnQkv => "blk.{bid}.attn_qkv",
    AttnOutput => "blk.{bid}.attn_output",
    AttnQNorm => "blk.{bid}.attn_q_norm",
    AttnKNorm => "blk.{bid}.attn_k_norm",
    AttnPostNorm => "blk.{bid}.post_attention_norm",
    AttnOutputNorm => "blk.{bid}.attn_output_norm",
    AttnGate => "blk.{bid}.attn_gate",
    AttnSinks => "blk.{bid}.attn_sinks",
    AttnQA => "blk.{bid}.attn_q_a",
    AttnQB => "blk.{bid}.attn_q_b",
    AttnQANorm => "blk.{bid}.attn_q_a_norm",
    AttnKv => "blk.{bid}.attn_kv",
    AttnKvANorm => "blk.{bid}.attn_kv_a_norm",
    AttnOutputA => "blk.{bid}.attn_output_a",
    AttnOutputB => "blk.{bid}.attn_output_b",
    AttnCompressorApe => "blk.{bid}.attn_compressor_ape",
    AttnCompressorKv => "blk.{bid}.attn_compressor_kv",
    AttnCompressorGate => "blk.{bid}.attn_compressor_gate",
    AttnCompressorNorm => "blk.{bid}.attn_compressor_norm",
    IndexerAttnQB => "blk.{bid}.indexer.attn_q_b",
    IndexerProj => "blk.{bid}.indexer.proj",
    IndexerCompressorApe => "blk.{bid}.indexer_compressor_ape",
    IndexerCompressorKv => "blk.{bid}.indexer_compressor_kv",
    IndexerCompressorGate => "blk.{bid}.indexer_compressor_gate",
    IndexerCompressorNorm => "blk.{bid}.indexer_compressor_norm",
    HcAttnFn => "blk.{bid}.hc_attn_fn",
    HcAttnBase => "blk.{bid}.hc_attn_base",
    HcAttnScale => "blk.{bid}.hc_attn_scale",
    HcFfnFn => "blk.{bid}.hc_ffn_fn",
    HcFfnBase => "blk.{bid}.hc_ffn_base",
    HcFfnScale => "blk.{bid}.hc_ffn_scale",
    FfnNorm => "blk.{bid}.ffn_norm",
    FfnGate => "blk.{bid}.ffn_gate",
    FfnUp => "blk.{bid}.ffn_up",
    FfnDown => "blk.{bid}.ffn_down",
    FfnPostNorm => "blk.{bid}.post_ffw_norm",
    FfnPreNorm2 => "blk.{bid}.pre_ffw_norm_2",
    FfnPostNorm1 => "blk.{bid}.post_ffw_norm_1",
    FfnPostNorm2 => "blk.{bid}.post_ffw_norm_2",
    FfnGateInp => "blk.{bid}.ffn_gate_inp",
    FfnGateExps => "blk.{bid}.ffn_gate_exps",
    FfnUpExps => "blk.{bid}.ffn_up_exps",
    FfnDownExps => "blk.{bid}.ffn_down_exps",
    FfnGateUpExps => "blk.{bid}.ffn_gate_up_exps",
    FfnGateShexp => "blk.{bid}.ffn_gate_shexp",
    FfnUpShexp => "blk.{bid}.ffn_up_shexp",
    FfnDownShexp => "blk.{bid}.ffn_down_shexp",
    FfnGateInpShexp => "blk.{bid}.ffn_gate_inp_shexp",
    FfnGateTid2eid => "blk.{bid}.ffn_gate_tid2eid",
    FfnExpProbsB => "blk.{bid}.exp_probs_b",
    FfnExpProbsBVl => "blk.{bid}.exp_probs_b_vl",
    LayerOutputNorm => "blk.{bid}.layer_output_norm",
    LayerOutputScale => "blk.{bid}.layer_output_scale",
    PerLayerInpGate => "blk.{bid}.inp_gate",
    PerLayerProj => "blk.{bid}.proj",
    PerLayerPostNorm => "blk.{bid}.post_norm",
    SsmA => "blk.{bid}.ssm_a",
    SsmAlpha => "blk.{bid}.ssm_alpha",
    SsmBeta => "blk.{bid}.ssm_beta",
    SsmConv1d => "blk.{bid}.ssm_conv1d",
    SsmDt => "blk.{bid}.ssm_dt",
    SsmNorm => "blk.{bid}.ssm_norm",
    SsmOut => "blk.{bid}.ssm_out",
    NextnEhProj => "blk.{bid}.nextn.eh_proj",
    NextnEmbedTokens => "blk.{bid}.nextn.embed_tokens",
    NextnEnorm => "blk.{bid}.nextn.enorm",
    NextnHnorm => "blk.{bid}.nextn.hnorm",
    NextnSharedHeadHead => "blk.{bid}.nextn.shared_head_head",
    NextnSharedHeadNorm => "blk.{bid}.nextn.shared_head_norm",
}

impl Tensor {
    /// Whether the tensor belongs to a block (`blk.{bid}.…`).
    pub fn in_block(self) -> bool {
        self.template().starts_with("blk.")
    }

    /// The name without a suffix; `bid` is the block index (ignored outside blocks).
    pub fn base(self, bid: usize) -> String {
        match self.template().strip_prefix("blk.{bid}.") {
            Some(rest) => format!("blk.{bid}.{rest}"),
            None => self.template().to_string(),
        }
    }

    /// `<name>.weight` of a tensor outside the blocks (`token_embd.weight`).
    pub fn weight(self) -> String {
        self.with(0, "weight")
    }

    /// `blk.{bid}.<name>.weight`.
    pub fn blk(self, bid: usize) -> String {
        self.with(bid, "weight")
    }

    /// The name with a suffix (`weight`, `bias`, `scale`).
    pub fn with(self, bid: usize, suffix: &str) -> String {
        format!("{}.{suffix}", self.base(bid))
    }

    /// Splits a full tensor name into its kind, block index and suffix
    /// (`blk.3.attn_q.weight` → (AttnQ, Some(3), "weight"); `blk.0.ssm_a` → (SsmA, Some(0), "")).
    pub fn parse(name: &str) -> Option<(Tensor, Option<usize>, &str)> {
        let (bid, rest) = match name.strip_prefix("blk.") {
            Some(r) => {
                let (b, rest) = r.split_once('.')?;
                (Some(b.parse::<usize>().ok()?), rest)
            }
            None => (None, name),
        };
        let find = |base: &str| {
            Tensor::ALL.iter().copied().find(|t| {
                let tpl = t.template();
                match bid {
                    Some(_) => tpl.strip_prefix("blk.{bid}.") == Some(base),
                    None => !tpl.starts_with("blk.") && tpl == base,
                }
            })
        };
        // A few tensors have no suffix (`blk.N.ssm_a`).
        if let Some(t) = find(rest) {
            return Some((t, bid, ""));
        }
        let (base, suffix) = rest.rsplit_once('.')?;
        let t = find(base)?;
        Some((t, bid, suffix))
    }
}

macro_rules! archs {
    ($($v:ident => $name:literal: [$($t:ident),* $(,)?],)*) => {
        /// A GGUF architecture (`general.architecture`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Arch { $($v,)* }

        impl Arch {
            pub const ALL: &'static [Arch] = &[$(Arch::$v,)*];

            pub const fn name(self) -> &'static str {
                match self { $(Arch::$v => $name,)* }
            }

            /// The tensors a file of this architecture may contain (gguf-py's `MODEL_TENSORS`,
            /// restricted to what hf2q writes and reads).
            pub fn tensors(self) -> &'static [Tensor] {
                use Tensor::*;
                match self { $(Arch::$v => &[$($t,)*],)* }
            }
        }
    };
}

archs! {
    Llama => "llama": [TokenEmbd, Output, OutputNorm, RopeFreqs, AttnNorm, AttnQ, AttnK, AttnV,
        AttnOutput, FfnNorm, FfnGate, FfnUp, FfnDown],
    Qwen2 => "qwen2": [TokenEmbd, Output, OutputNorm, AttnNorm, AttnQ, AttnK, AttnV, AttnOutput,
        FfnNorm, FfnGate, FfnUp, FfnDown],
    Qwen3 => "qwen3": [TokenEmbd, Output, OutputNorm, AttnNorm, AttnQ, AttnK, AttnV, AttnOutput,
        AttnQNorm, AttnKNorm, FfnNorm, FfnGate, FfnUp, FfnDown],
    Qwen3Moe => "qwen3moe": [TokenEmbd, Output, OutputNorm, AttnNorm, AttnQ, AttnK, AttnV,
        AttnOutput, AttnQNorm, AttnKNorm, FfnNorm, FfnGateInp, FfnGateExps, FfnUpExps, FfnDownExps],
    Qwen3Vl => "qwen3vl": [TokenEmbd, Output, OutputNorm, AttnNorm, AttnQ, AttnK, AttnV,
        AttnOutput, AttnQNorm, AttnKNorm, FfnNorm, FfnGate, FfnUp, FfnDown],
    Qwen35 => "qwen35": [TokenEmbd, Output, OutputNorm, AttnNorm, AttnQ, AttnK, AttnV, AttnQkv,
        AttnGate, AttnOutput, AttnQNorm, AttnKNorm, AttnPostNorm, FfnGate, FfnUp, FfnDown, SsmA,
        SsmAlpha, SsmBeta, SsmConv1d, SsmDt, SsmNorm, SsmOut, NextnEhProj, NextnEmbedTokens,
        NextnEnorm, NextnHnorm, NextnSharedHeadHead, NextnSharedHeadNorm],
    Qwen35Moe => "qwen35moe": [TokenEmbd, Output, OutputNorm, AttnNorm, AttnQ, AttnK, AttnV,
        AttnQkv, AttnGate, AttnOutput, AttnQNorm, AttnKNorm, AttnPostNorm, FfnGateInp, FfnGateExps,
        FfnUpExps, FfnDownExps, FfnGateShexp, FfnUpShexp, FfnDownShexp, FfnGateInpShexp, SsmA,
        SsmAlpha, SsmBeta, SsmConv1d, SsmDt, SsmNorm, SsmOut, NextnEhProj, NextnEmbedTokens,
        NextnEnorm, NextnHnorm, NextnSharedHeadHead, NextnSharedHeadNorm],
    Gemma3 => "gemma3": [TokenEmbd, Output, OutputNorm, AttnNorm, AttnQ, AttnK, AttnV, AttnOutput,
        AttnQNorm, AttnKNorm, AttnPostNorm, FfnNorm, FfnGate, FfnUp, FfnDown, FfnPostNorm],
    Gemma4 => "gemma4": [TokenEmbd, Output, OutputNorm, RopeFreqs, PerLayerTokenEmbd,
        PerLayerModelProj, PerLayerProjNorm, AttnNorm, AttnQ, AttnK, AttnV, AttnOutput, AttnQNorm,
        AttnKNorm, AttnPostNorm, FfnNorm, FfnGate, FfnUp, FfnDown, FfnPostNorm, FfnPreNorm2,
        FfnPostNorm1, FfnPostNorm2, FfnGateInp, FfnGateUpExps, FfnDownExps, LayerOutputScale,
        PerLayerInpGate, PerLayerProj, PerLayerPostNorm],
    Deepseek4 => "deepseek4": [TokenEmbd, Output, OutputNorm, OutputHcFn, OutputHcBase,
        OutputHcScale, AttnNorm, AttnSinks, AttnQA, AttnQB, AttnQANorm, AttnKv, AttnKvANorm,
        AttnOutputA, AttnOutputB, AttnCompressorApe, AttnCompressorKv, AttnCompressorGate,
        AttnCompressorNorm, IndexerAttnQB, IndexerProj, IndexerCompressorApe, IndexerCompressorKv,
        IndexerCompressorGate, IndexerCompressorNorm, HcAttnFn, HcAttnBase, HcAttnScale, HcFfnFn,
        HcFfnBase, HcFfnScale, FfnNorm, FfnGateInp, FfnGateExps, FfnUpExps, FfnDownExps,
        FfnGateShexp, FfnUpShexp, FfnDownShexp, FfnGateTid2eid, FfnExpProbsB, FfnExpProbsBVl],
    Bert => "bert": [TokenEmbd, TokenEmbdNorm, TokenTypes, PositionEmbd, AttnQ, AttnK, AttnV,
        AttnOutput, AttnOutputNorm, FfnUp, FfnDown, LayerOutputNorm],
    NomicBert => "nomic-bert": [TokenEmbd, TokenEmbdNorm, TokenTypes, AttnQkv, AttnOutput,
        AttnOutputNorm, FfnGate, FfnUp, FfnDown, LayerOutputNorm],
}

impl Arch {
    pub fn parse(name: &str) -> Option<Arch> {
        Arch::ALL.iter().copied().find(|a| a.name() == name)
    }

    /// The metadata key `{arch}.{key}` (`key` one of the [`key`] constants).
    pub fn key(self, key: &str) -> String {
        format!("{}.{key}", self.name())
    }
}

/// The `{arch}.*` hyper-parameter keys, without the architecture prefix (gguf-py `Keys`).
pub mod key {
    pub const VOCAB_SIZE: &str = "vocab_size";
    pub const CONTEXT_LENGTH: &str = "context_length";
    pub const EMBEDDING_LENGTH: &str = "embedding_length";
    pub const EMBEDDING_LENGTH_OUT: &str = "embedding_length_out";
    pub const EMBEDDING_LENGTH_PER_LAYER_INPUT: &str = "embedding_length_per_layer_input";
    pub const BLOCK_COUNT: &str = "block_count";
    pub const FEED_FORWARD_LENGTH: &str = "feed_forward_length";
    pub const EXPERT_FEED_FORWARD_LENGTH: &str = "expert_feed_forward_length";
    pub const EXPERT_SHARED_FEED_FORWARD_LENGTH: &str = "expert_shared_feed_forward_length";
    pub const EXPERT_COUNT: &str = "expert_count";
    pub const EXPERT_USED_COUNT: &str = "expert_used_count";
    pub const EXPERT_SHARED_COUNT: &str = "expert_shared_count";
    pub const EXPERT_GROUP_COUNT: &str = "expert_group_count";
    pub const EXPERT_GROUP_USED_COUNT: &str = "expert_group_used_count";
    pub const EXPERT_WEIGHTS_SCALE: &str = "expert_weights_scale";
    pub const EXPERT_WEIGHTS_NORM: &str = "expert_weights_norm";
    pub const EXPERT_GATING_FUNC: &str = "expert_gating_func";
    pub const SWIGLU_CLAMP_EXP: &str = "swiglu_clamp_exp";
    pub const SWIGLU_CLAMP_SHEXP: &str = "swiglu_clamp_shexp";
    pub const POOLING_TYPE: &str = "pooling_type";
    pub const FINAL_LOGIT_SOFTCAPPING: &str = "final_logit_softcapping";
    pub const NEXTN_PREDICT_LAYERS: &str = "nextn_predict_layers";
    pub const FULL_ATTENTION_INTERVAL: &str = "full_attention_interval";
    pub const N_DEEPSTACK_LAYERS: &str = "n_deepstack_layers";
    pub const HASH_LAYER_COUNT: &str = "hash_layer_count";
    pub const CLASSIFIER_OUTPUT_LABELS: &str = "classifier.output_labels";
    pub const CLASSIFIER_POOLING_TYPE: &str = "classifier.pooling_type";

    pub const ATTN_HEAD_COUNT: &str = "attention.head_count";
    pub const ATTN_HEAD_COUNT_KV: &str = "attention.head_count_kv";
    pub const ATTN_KEY_LENGTH: &str = "attention.key_length";
    pub const ATTN_VALUE_LENGTH: &str = "attention.value_length";
    pub const ATTN_KEY_LENGTH_SWA: &str = "attention.key_length_swa";
    pub const ATTN_VALUE_LENGTH_SWA: &str = "attention.value_length_swa";
    pub const ATTN_LAYERNORM_EPS: &str = "attention.layer_norm_epsilon";
    pub const ATTN_LAYERNORM_RMS_EPS: &str = "attention.layer_norm_rms_epsilon";
    pub const ATTN_CAUSAL: &str = "attention.causal";
    pub const ATTN_SLIDING_WINDOW: &str = "attention.sliding_window";
    pub const ATTN_SLIDING_WINDOW_PATTERN: &str = "attention.sliding_window_pattern";
    pub const ATTN_SHARED_KV_LAYERS: &str = "attention.shared_kv_layers";
    pub const ATTN_RECURRENT_LAYERS: &str = "attention.recurrent_layers";
    pub const ATTN_COMPRESS_RATIOS: &str = "attention.compress_ratios";
    pub const ATTN_COMPRESS_ROPE_FREQ_BASE: &str = "attention.compress_rope_freq_base";
    pub const ATTN_Q_LORA_RANK: &str = "attention.q_lora_rank";
    pub const ATTN_OUTPUT_LORA_RANK: &str = "attention.output_lora_rank";
    pub const ATTN_OUTPUT_GROUP_COUNT: &str = "attention.output_group_count";
    pub const ATTN_INDEXER_HEAD_COUNT: &str = "attention.indexer.head_count";
    pub const ATTN_INDEXER_KEY_LENGTH: &str = "attention.indexer.key_length";
    pub const ATTN_INDEXER_TOP_K: &str = "attention.indexer.top_k";

    pub const ROPE_DIMENSION_COUNT: &str = "rope.dimension_count";
    pub const ROPE_DIMENSION_COUNT_SWA: &str = "rope.dimension_count_swa";
    pub const ROPE_DIMENSION_SECTIONS: &str = "rope.dimension_sections";
    pub const ROPE_FREQ_BASE: &str = "rope.freq_base";
    pub const ROPE_FREQ_BASE_SWA: &str = "rope.freq_base_swa";
    pub const ROPE_SCALING_TYPE: &str = "rope.scaling.type";
    pub const ROPE_SCALING_FACTOR: &str = "rope.scaling.factor";
    pub const ROPE_SCALING_ATTN_FACTOR: &str = "rope.scaling.attn_factor";
    pub const ROPE_SCALING_ORIG_CTX_LEN: &str = "rope.scaling.original_context_length";
    pub const ROPE_SCALING_YARN_EXT_FACTOR: &str = "rope.scaling.yarn_ext_factor";
    pub const ROPE_SCALING_YARN_ATTN_FACTOR: &str = "rope.scaling.yarn_attn_factor";
    pub const ROPE_SCALING_YARN_BETA_FAST: &str = "rope.scaling.yarn_beta_fast";
    pub const ROPE_SCALING_YARN_BETA_SLOW: &str = "rope.scaling.yarn_beta_slow";

    pub const SSM_CONV_KERNEL: &str = "ssm.conv_kernel";
    pub const SSM_INNER_SIZE: &str = "ssm.inner_size";
    pub const SSM_STATE_SIZE: &str = "ssm.state_size";
    pub const SSM_TIME_STEP_RANK: &str = "ssm.time_step_rank";
    pub const SSM_GROUP_COUNT: &str = "ssm.group_count";

    pub const HYPER_CONNECTION_COUNT: &str = "hyper_connection.count";
    pub const HYPER_CONNECTION_EPSILON: &str = "hyper_connection.epsilon";
    pub const HYPER_CONNECTION_SINKHORN_ITERATIONS: &str = "hyper_connection.sinkhorn_iterations";

    /// Every key above (for checking files and tables against this list).
    pub const ALL: &[&str] = &[
        VOCAB_SIZE,
        CONTEXT_LENGTH,
        EMBEDDING_LENGTH,
        EMBEDDING_LENGTH_OUT,
        EMBEDDING_LENGTH_PER_LAYER_INPUT,
        BLOCK_COUNT,
        FEED_FORWARD_LENGTH,
        EXPERT_FEED_FORWARD_LENGTH,
        EXPERT_SHARED_FEED_FORWARD_LENGTH,
        EXPERT_COUNT,
        EXPERT_USED_COUNT,
        EXPERT_SHARED_COUNT,
        EXPERT_GROUP_COUNT,
        EXPERT_GROUP_USED_COUNT,
        EXPERT_WEIGHTS_SCALE,
        EXPERT_WEIGHTS_NORM,
        EXPERT_GATING_FUNC,
        SWIGLU_CLAMP_EXP,
        SWIGLU_CLAMP_SHEXP,
        POOLING_TYPE,
        FINAL_LOGIT_SOFTCAPPING,
        NEXTN_PREDICT_LAYERS,
        FULL_ATTENTION_INTERVAL,
        N_DEEPSTACK_LAYERS,
        HASH_LAYER_COUNT,
        CLASSIFIER_OUTPUT_LABELS,
        CLASSIFIER_POOLING_TYPE,
        ATTN_HEAD_COUNT,
        ATTN_HEAD_COUNT_KV,
        ATTN_KEY_LENGTH,
        ATTN_VALUE_LENGTH,
        ATTN_KEY_LENGTH_SWA,
        ATTN_VALUE_LENGTH_SWA,
        ATTN_LAYERNORM_EPS,
        ATTN_LAYERNORM_RMS_EPS,
        ATTN_CAUSAL,
        ATTN_SLIDING_WINDOW,
        ATTN_SLIDING_WINDOW_PATTERN,
        ATTN_SHARED_KV_LAYERS,
        ATTN_RECURRENT_LAYERS,
        ATTN_COMPRESS_RATIOS,
        ATTN_COMPRESS_ROPE_FREQ_BASE,
        ATTN_Q_LORA_RANK,
        ATTN_OUTPUT_LORA_RANK,
        ATTN_OUTPUT_GROUP_COUNT,
        ATTN_INDEXER_HEAD_COUNT,
        ATTN_INDEXER_KEY_LENGTH,
        ATTN_INDEXER_TOP_K,
        ROPE_DIMENSION_COUNT,
        ROPE_DIMENSION_COUNT_SWA,
        ROPE_DIMENSION_SECTIONS,
        ROPE_FREQ_BASE,
        ROPE_FREQ_BASE_SWA,
        ROPE_SCALING_TYPE,
        ROPE_SCALING_FACTOR,
        ROPE_SCALING_ATTN_FACTOR,
        ROPE_SCALING_ORIG_CTX_LEN,
        ROPE_SCALING_YARN_EXT_FACTOR,
        ROPE_SCALING_YARN_ATTN_FACTOR,
        ROPE_SCALING_YARN_BETA_FAST,
        ROPE_SCALING_YARN_BETA_SLOW,
        SSM_CONV_KERNEL,
        SSM_INNER_SIZE,
        SSM_STATE_SIZE,
        SSM_TIME_STEP_RANK,
        SSM_GROUP_COUNT,
        HYPER_CONNECTION_COUNT,
        HYPER_CONNECTION_EPSILON,
        HYPER_CONNECTION_SINKHORN_ITERATIONS,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(Tensor::AttnQ.blk(12), "blk.12.attn_q.weight");
        assert_eq!(Tensor::TokenEmbd.weight(), "token_embd.weight");
        assert_eq!(Tensor::FfnGateInp.with(3, "scale"), "blk.3.ffn_gate_inp.scale");
        for &t in Tensor::ALL {
            let n = t.with(7, "bias");
            let bid = t.in_block().then_some(7);
            assert_eq!(Tensor::parse(&n), Some((t, bid, "bias")), "{n}");
        }
        assert_eq!(Tensor::parse("blk.x.attn_q.weight"), None);
        assert_eq!(Tensor::parse("blk.1.nonsense.weight"), None);
        assert_eq!(Tensor::parse("attn_q.weight"), None);
    }

    #[test]
    fn tables_are_consistent() {
        let mut names: Vec<_> = Tensor::ALL.iter().map(|t| t.template()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Tensor::ALL.len(), "two tensor kinds share a name");
        let mut keys = key::ALL.to_vec();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), key::ALL.len(), "a key is listed twice");
        for &a in Arch::ALL {
            assert_eq!(Arch::parse(a.name()), Some(a));
            assert!(a.tensors().contains(&Tensor::TokenEmbd), "{a:?}");
        }
        assert_eq!(Arch::Qwen3Moe.key(key::EXPERT_COUNT), "qwen3moe.expert_count");
    }
}
