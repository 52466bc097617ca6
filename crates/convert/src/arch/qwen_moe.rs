//! `Qwen3MoeForCausalLM` → `qwen3moe` (llama.cpp `conversion/qwen.py`, `Qwen2MoeModel`,
//! `Qwen3MoeModel`): Qwen3 attention (per-head Q/K RMSNorm) with a routed sparse MLP whose
//! per-expert `mlp.experts.N.{gate,up,down}_proj` matrices are stacked into 3-D `ffn_*_exps`.

use super::text::{set_text_parameters, Keys};
use super::{always_skipped, base_filter, block_id, map_or_err, Ctx, Family, OutTensor};
use crate::hf::{HfError, HfTensor};
use crate::vocab;
use gguf::arch::key;
use gguf::Arch;
use gguf::{Metadata, Value};
use std::collections::BTreeMap;

pub struct Qwen3Moe;

/// `Qwen2MoeModel.set_gguf_parameters`: the text parameters plus the expert FFN sizes.
pub fn set_moe_parameters(ctx: &Ctx, arch: &str, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
    set_text_parameters(ctx, arch, m, file_type)?;
    let k = Keys(arch);
    if let Some(v) = ctx.cfg.find_u64(&["moe_intermediate_size"]) {
        m.insert(k.k(key::EXPERT_FEED_FORWARD_LENGTH), Value::U32(v as u32));
    }
    if let Some(v) = ctx.cfg.find_u64(&["shared_expert_intermediate_size"]) {
        m.insert(k.k(key::EXPERT_SHARED_FEED_FORWARD_LENGTH), Value::U32(v as u32));
    }
    Ok(())
}

/// `find_hparam(["num_local_experts", "num_experts"])`.
fn expert_count(ctx: &Ctx) -> Result<usize, HfError> {
    let n = ctx.cfg.req_u64(&["num_local_experts", "num_experts"])? as usize;
    if n == 0 {
        return Err(ctx.invalid("the expert count (`num_experts`) is 0 but the checkpoint has expert tensors"));
    }
    Ok(n)
}

/// One GGUF tensor stacking the 2-D expert matrices `srcs` (in expert order) along a new outer
/// dimension (`torch.stack(datas, dim=0)`); the data is read only when the tensor is written.
fn stacked(ctx: &Ctx, name: String, source: String, srcs: &[&HfTensor]) -> Result<OutTensor, HfError> {
    let first = srcs[0];
    for t in srcs {
        if t.shape.len() != 2 || t.shape != first.shape {
            return Err(ctx.invalid(format!(
                "expert tensor `{}` has shape {:?}; expected a matrix shaped like `{}` {:?}",
                t.name, t.shape, first.name, first.shape
            )));
        }
    }
    let names: Vec<String> = srcs.iter().map(|t| t.name.clone()).collect();
    let mut shape = vec![srcs.len()];
    shape.extend_from_slice(&first.shape);
    Ok(OutTensor {
        rows_from: None,
        name,
        shape,
        source,
        make: Box::new(move |hf| {
            let mut data = Vec::new();
            for n in &names {
                let t = hf.get(n).expect("listed at planning time");
                data.extend(hf.f32(t)?);
            }
            Ok(data)
        }),
        raw: None,
    })
}

/// One half of a fused `[n_expert, 2 * n_ff, n_embd]` `gate_up_proj` (split on dim -2: the gate
/// is the first `n_ff` rows of each expert, up the rest).
fn gate_up_half(name: String, t: &HfTensor, second: bool) -> OutTensor {
    let (n_expert, rows, cols) = (t.shape[0], t.shape[1], t.shape[2]);
    let half = rows / 2;
    let src = t.name.clone();
    OutTensor {
        rows_from: None,
        name,
        shape: vec![n_expert, half, cols],
        source: t.name.clone(),
        make: Box::new(move |hf| {
            let data = hf.f32(hf.get(&src).expect("listed at planning time"))?;
            let skip = if second { half * cols } else { 0 };
            Ok(data
                .chunks(rows * cols)
                .flat_map(|e| e[skip..skip + half * cols].iter().copied())
                .collect())
        }),
        raw: None,
    }
}

/// `Qwen2MoeModel.modify_tensors` over the (filtered) checkpoint: per-expert matrices are
/// collected per block and stacked once all `3 × n_expert` have arrived (at the position of the
/// last one, as the converter emits them); fused `experts.{gate_up,down}_proj` pass through.
pub fn qwen_moe_tensors(ctx: &Ctx, rename: impl Fn(&str) -> String) -> Result<Vec<OutTensor>, HfError> {
    let mut out = Vec::new();
    let mut pending: BTreeMap<u32, BTreeMap<String, &HfTensor>> = BTreeMap::new();
    for t in ctx.hf.tensors() {
        let Some(name) = base_filter(&rename(&t.name)) else {
            continue;
        };
        if always_skipped(&name) {
            continue;
        }
        if name.ends_with("mlp.experts.down_proj") || name.ends_with("mlp.experts.down_proj.weight") {
            // HF [n_expert, n_embd, n_ff] → GGML {n_ff, n_embd, n_expert}
            if t.shape.len() != 3 {
                return Err(ctx.invalid(format!("fused expert tensor `{}` is not 3-D: {:?}", t.name, t.shape)));
            }
            let mapped = format!("{}.weight", name.trim_end_matches(".weight"));
            out.push(OutTensor::from_hf(map_or_err(ctx, &mapped)?, t));
        } else if name.ends_with("mlp.experts.gate_up_proj") || name.ends_with("mlp.experts.gate_up_proj.weight") {
            if t.shape.len() != 3 || t.shape[1] % 2 != 0 {
                return Err(ctx.invalid(format!("unexpected gate_up_proj shape for `{}`: {:?}", t.name, t.shape)));
            }
            let base = name.trim_end_matches(".weight").trim_end_matches(".gate_up_proj");
            out.push(gate_up_half(
                map_or_err(ctx, &format!("{base}.gate_proj.weight"))?,
                t,
                false,
            ));
            out.push(gate_up_half(
                map_or_err(ctx, &format!("{base}.up_proj.weight"))?,
                t,
                true,
            ));
        } else if name.contains("experts") {
            let n_expert = expert_count(ctx)?;
            let bid =
                block_id(&name).ok_or_else(|| ctx.invalid(format!("expert tensor `{}` has no block index", t.name)))?;
            let blk = pending.entry(bid).or_default();
            blk.insert(name, t);
            if blk.len() < n_expert * 3 {
                continue;
            }
            // merge the experts into one 3-D tensor per projection
            for w in ["down_proj", "gate_proj", "up_proj"] {
                let mut srcs = Vec::with_capacity(n_expert);
                for xid in 0..n_expert {
                    let ename = format!("model.layers.{bid}.mlp.experts.{xid}.{w}.weight");
                    srcs.push(blk.remove(&ename).ok_or_else(|| {
                        ctx.invalid(format!(
                            "block {bid} has {} expert tensors but no `{ename}` (expected experts 0..{n_expert} \
                             with gate_proj, up_proj and down_proj)",
                            n_expert * 3
                        ))
                    })?);
                }
                let merged = format!("model.layers.{bid}.mlp.experts.{w}.weight");
                let source = format!("model.layers.{bid}.mlp.experts.*.{w}.weight");
                out.push(stacked(ctx, map_or_err(ctx, &merged)?, source, &srcs)?);
            }
        } else {
            out.push(OutTensor::from_hf(map_or_err(ctx, &name)?, t));
        }
    }
    if let Some((bid, blk)) = pending.iter().find(|(_, b)| !b.is_empty()) {
        // `prepare_tensors`: "Unprocessed experts"; name what is missing and what is unknown.
        let n_expert = expert_count(ctx)?;
        let expected: Vec<String> = (0..n_expert)
            .flat_map(|x| {
                ["down_proj", "gate_proj", "up_proj"].map(|w| format!("model.layers.{bid}.mlp.experts.{x}.{w}.weight"))
            })
            .collect();
        let missing: Vec<&String> = expected.iter().filter(|e| !blk.contains_key(*e)).take(4).collect();
        let unknown: Vec<&str> = blk
            .keys()
            .filter(|k| !expected.contains(k))
            .map(String::as_str)
            .take(4)
            .collect();
        let mut problem = format!(
            "unprocessed expert tensors in block {bid} ({} of {} per-expert matrices present)",
            blk.len(),
            n_expert * 3
        );
        if !missing.is_empty() {
            problem += &format!("; missing {missing:?}");
        }
        if !unknown.is_empty() {
            problem += &format!("; not a gate/up/down matrix of experts 0..{n_expert}: {unknown:?}");
        }
        return Err(ctx.invalid(problem));
    }
    Ok(out)
}

impl Family for Qwen3Moe {
    fn gguf_arch(&self, _ctx: &Ctx) -> Arch {
        Arch::Qwen3Moe
    }
    fn set_parameters(&self, ctx: &Ctx, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
        set_moe_parameters(ctx, Arch::Qwen3Moe.name(), m, file_type)
    }
    /// `TextModel.set_vocab` (`_set_vocab_gpt2`).
    fn set_vocab(&self, ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
        let mut notes = vocab::VocabNotes::default();
        vocab::set_vocab_gpt2(&ctx.dir, &ctx.cfg, m, &mut notes)?;
        ctx.notes.extend(notes.warnings);
        Ok(())
    }
    fn tensors(&self, ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
        qwen_moe_tensors(ctx, |n| n.to_string())
    }
}
