//! Qwen3-MoE (`qwen3moe`): the Qwen3 attention (per-head Q/K RMS norm) of the Llama graph with a
//! mixture-of-experts FFN in every layer: softmax over the router's logits, top-k experts, their
//! weights renormalised when `norm_topk_prob` (llama.cpp `src/models/qwen3moe.cpp`; transformers
//! `modeling_qwen3_moe.py`).

use super::blocks::{Ffn, LayerFfn, Moe, Routing};
use super::llama::Llama;
use super::Keys;
use crate::backend::Backend;
use crate::{EngineError, Result};
use gguf::arch::key;
use gguf::GgufModel;
use gguf::Tensor as T;
use std::path::Path;
use std::sync::Arc;

pub fn load<B: Backend>(backend: Arc<B>, gguf: &Arc<GgufModel>, path: &Path) -> Result<Llama<B>> {
    let k = Keys {
        meta: gguf.metadata(),
        arch: "qwen3moe",
        path,
    };
    let n_expert = k.u(key::EXPERT_COUNT)?;
    let n_used = k.u(key::EXPERT_USED_COUNT)?;
    let n_ff = k.u(key::EXPERT_FEED_FORWARD_LENGTH)?;
    if n_used == 0 || n_used > n_expert {
        return Err(EngineError::Model(format!(
            "{}: {n_used} experts used per token out of {n_expert}",
            path.display()
        )));
    }
    // llama.cpp llama-model.cpp: qwen3moe always renormalises the selected experts' weights
    // (expert_weights_norm defaults to true for this architecture).
    let normalize = gguf
        .metadata()
        .get_bool(&k.key(key::EXPERT_WEIGHTS_NORM))
        .unwrap_or(true);
    let routing = Routing {
        n_expert,
        k: n_used,
        softmax_first: true,
        normalize,
    };
    Llama::load_with(backend, gguf, path, |l, i, p| {
        let gate = l.mats(&T::FfnGateExps.blk(i), p.n_embd, n_ff, n_expert)?;
        let up = l.mats(&T::FfnUpExps.blk(i), p.n_embd, n_ff, n_expert)?;
        let down = l.mats(&T::FfnDownExps.blk(i), n_ff, p.n_embd, n_expert)?;
        Ok(LayerFfn::Moe(Moe {
            router: l.mat(&T::FfnGateInp.blk(i), &[p.n_embd, n_expert])?,
            experts: Ffn::stack(gate, up, down),
            routing,
            n_ff,
        }))
    })
}
