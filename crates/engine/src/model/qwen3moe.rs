//! Qwen3-MoE (`qwen3moe`): the Qwen3 attention (per-head Q/K RMS norm) of the Llama graph with a
//! mixture-of-experts FFN in every layer: softmax over the router's logits, top-k experts, their
//! weights renormalised when `norm_topk_prob` (llama.cpp `src/models/qwen3moe.cpp`; transformers
//! `modeling_qwen3_moe.py`).

use super::blocks::{Ffn, LayerFfn, Moe, Routing};
use super::llama::Llama;
use super::Keys;
use crate::backend::Backend;
use crate::{EngineError, Result};
use gguf::GgufModel;
use std::path::Path;
use std::sync::Arc;

pub fn load<B: Backend>(backend: Arc<B>, gguf: &Arc<GgufModel>, path: &Path) -> Result<Llama<B>> {
    let k = Keys {
        meta: gguf.metadata(),
        arch: "qwen3moe",
        path,
    };
    let n_expert = k.u("expert_count")?;
    let n_used = k.u("expert_used_count")?;
    let n_ff = k.u("expert_feed_forward_length")?;
    if n_used == 0 || n_used > n_expert {
        return Err(EngineError::Model(format!(
            "{}: {n_used} experts used per token out of {n_expert}",
            path.display()
        )));
    }
    // llama.cpp llama-model.cpp: qwen3moe always renormalises the selected experts' weights
    // (expert_weights_norm defaults to true for this architecture).
    let normalize = gguf.metadata().get_bool(&k.key("expert_weights_norm")).unwrap_or(true);
    let routing = Routing {
        n_expert,
        k: n_used,
        softmax_first: true,
        normalize,
    };
    Llama::load_with(backend, gguf, path, |l, i, p| {
        let n = |s: &str| format!("blk.{i}.{s}");
        let gate = l.mats(&n("ffn_gate_exps.weight"), p.n_embd, n_ff, n_expert)?;
        let up = l.mats(&n("ffn_up_exps.weight"), p.n_embd, n_ff, n_expert)?;
        let down = l.mats(&n("ffn_down_exps.weight"), n_ff, p.n_embd, n_expert)?;
        Ok(LayerFfn::Moe(Moe {
            router: l.mat(&n("ffn_gate_inp.weight"), &[p.n_embd, n_expert])?,
            experts: Ffn::stack(gate, up, down),
            routing,
            n_ff,
        }))
    })
}
