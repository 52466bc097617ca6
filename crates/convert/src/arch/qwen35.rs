//! Qwen3.5 / Qwen3.6: `Qwen3_5ForConditionalGeneration` and `Qwen3_5ForCausalLM` → `qwen35`,
//! `Qwen3_5MoeForConditionalGeneration` and `Qwen3_5MoeForCausalLM` → `qwen35moe`
//! (llama.cpp `conversion/qwen.py`: `Qwen3_5TextModel` / `Qwen3_5MoeTextModel`, built from
//! `_Qwen35MRopeMixin`, `_LinearAttentionVReorderBase`, `Qwen3NextModel`, `_QwenMtpMixin` and
//! `Qwen2MoeModel`).
//!
//! The text model alternates Gated DeltaNet (linear attention, `ssm_*` tensors) and gated full
//! attention layers (q_proj carries the output gate, partial rotary, interleaved MRoPE). The
//! multi-token-prediction block (`mtp.*`) becomes an extra layer after the last decoder layer,
//! unless `--no-mtp`. The vision tower of the conditional-generation classes is skipped.

use super::text::{rope_parameters, set_text_parameters, Keys};
use super::{always_skipped, base_filter, block_id, map_or_err, Ctx, Family, OutTensor};
use crate::hf::{HfError, HfTensor, HfTensors};
use crate::vocab;
use gguf::arch::key;
use gguf::Arch;
use gguf::Tensor;
use gguf::{Array, Metadata, Value};
use serde_json::Value as J;
use std::collections::BTreeMap;

pub struct Qwen35;
pub struct Qwen35Moe;

/// `_Qwen35MRopeMixin._QWEN35_DEFAULT_MROPE_SECTION`
const DEFAULT_MROPE_SECTION: [i32; 4] = [11, 11, 10, 0];

/// The linear-attention (Gated DeltaNet) head layout.
#[derive(Debug, Clone, Copy)]
struct LinearDims {
    n_k: usize,
    n_v: usize,
    head_k: usize,
    head_v: usize,
}

impl LinearDims {
    fn read(ctx: &Ctx) -> Result<LinearDims, HfError> {
        let g = |k: &str| ctx.cfg.req_u64(&[k]).map(|v| v as usize);
        let d = LinearDims {
            n_k: g("linear_num_key_heads")?,
            n_v: g("linear_num_value_heads")?,
            head_k: g("linear_key_head_dim")?,
            head_v: g("linear_value_head_dim")?,
        };
        if d.n_k == 0 || d.n_v == 0 || !d.n_v.is_multiple_of(d.n_k) {
            return Err(ctx.invalid(format!(
                "linear_num_value_heads ({}) must be a non-zero multiple of linear_num_key_heads ({})",
                d.n_v, d.n_k
            )));
        }
        Ok(d)
    }

    /// `_LinearAttentionVReorderBase.modify_tensors` only reorders when the head counts differ.
    fn reorders(&self) -> bool {
        self.n_k != self.n_v
    }

    fn v_per_k(&self) -> usize {
        self.n_v / self.n_k
    }
}

/// `_QwenMtpMixin.__init__`: (decoder layers, MTP layers written), the MTP count being 0 with
/// `--no-mtp`. A plain conversion of a checkpoint without MTP layers fails, as in llama.cpp.
fn mtp_layers(ctx: &Ctx) -> Result<(u64, u64), HfError> {
    let n_layer = ctx.cfg.req_u64(&["num_hidden_layers"])?;
    if ctx.no_mtp {
        return Ok((n_layer, 0));
    }
    let mut n_mtp = ctx.cfg.find_u64(&["mtp_num_hidden_layers"]).unwrap_or(0);
    if n_mtp == 0 {
        // Qwen3-Next style: counted from the `mtp.layers.N.*` tensors (`opt_num_mtp_layers`).
        n_mtp = ctx
            .hf
            .tensors()
            .iter()
            .filter_map(|t| {
                let n = base_filter(&t.name)?;
                let n = n.strip_prefix("model.").filter(|r| r.starts_with("mtp.")).unwrap_or(&n);
                let parts: Vec<&str> = n.splitn(4, '.').collect();
                (parts.len() == 4 && parts[0] == "mtp" && parts[1] == "layers")
                    .then(|| parts[2].parse::<u64>().ok())
                    .flatten()
                    .map(|i| i + 1)
            })
            .max()
            .unwrap_or(0);
    }
    if n_mtp == 0 {
        return Err(ctx.invalid(format!(
            "{} checkpoint has no multi-token-prediction (MTP) layers (no `mtp_num_hidden_layers` in \
             config.json and no `mtp.layers.*` tensors); convert it with --no-mtp \
             (llama.cpp's converter fails here too: `assert self.opt_num_mtp_layers != 0`)",
            ctx.hf_arch
        )));
    }
    Ok((n_layer, n_mtp))
}

/// `_QwenMtpMixin.filter_tensors` on top of `TextModel.filter_tensors`: the HF name the rest of
/// the converter sees, or `None` when the tensor is skipped.
fn filter_name(ctx: &Ctx, name: &str, orig_blocks: u64) -> Option<String> {
    let mut n = base_filter(name)?;
    if n.starts_with("model.mtp.") {
        n = n.replacen("model.", "", 1);
    }
    if n.starts_with("mtp.") {
        if ctx.no_mtp {
            return None;
        }
        let parts: Vec<&str> = n.splitn(4, '.').collect();
        if parts.len() == 4
            && parts[1] == "layers"
            && !parts[2].is_empty()
            && parts[2].bytes().all(|b| b.is_ascii_digit())
        {
            let idx: u64 = parts[2].parse().ok()?;
            return Some(format!("model.layers.{}.{}", orig_blocks + idx, parts[3]));
        }
        let remap = |p: &str| match p {
            "fc" => Some("eh_proj"),
            "pre_fc_norm_embedding" => Some("enorm"),
            "pre_fc_norm_hidden" => Some("hnorm"),
            "norm" => Some("shared_head.norm"),
            _ => None,
        };
        if parts.len() == 3 {
            if let Some(r) = remap(parts[1]) {
                return Some(format!("model.layers.{orig_blocks}.{r}.{}", parts[2]));
            }
        }
    }
    Some(n)
}

/// The GGUF name: `post_attention_layernorm` is `ATTN_POST_NORM` in the qwen35 tensor list
/// (not `FFN_NORM`, which the shared table gives it); the rest comes from the shared table.
fn gguf_name(ctx: &Ctx, name: &str) -> Result<String, HfError> {
    if let Some(b) = name
        .strip_prefix("model.layers.")
        .and_then(|r| r.strip_suffix(".post_attention_layernorm.weight"))
    {
        if !b.is_empty() && b.bytes().all(|c| c.is_ascii_digit()) {
            if let Ok(b) = b.parse() {
                return Ok(Tensor::AttnPostNorm.blk(b));
            }
        }
    }
    map_or_err(ctx, name)
}

/// One weight transform, applied in order to the f32 data.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// `_reorder_v_heads` on the rows from `offset` on (grouped-by-K → tiled V heads).
    ReorderRows { offset: usize, head: usize },
    /// `_reorder_v_heads` on the columns (the input dimension).
    ReorderCols { head: usize },
    /// `A_log` → `-exp(A_log)`.
    NegExp,
    /// `(1 + w)` RMSNorm weights stored as `w + 1`.
    AddOne,
}

/// Row permutation of `_reorder_v_heads`: output row `i` takes input row `perm[i]`.
fn v_perm(d: &LinearDims, head: usize) -> Vec<usize> {
    let vpk = d.v_per_k();
    let mut perm = Vec::with_capacity(d.n_v * head);
    for j in 0..vpk {
        for k in 0..d.n_k {
            for x in 0..head {
                perm.push((k * vpk + j) * head + x);
            }
        }
    }
    perm
}

fn apply(ops: &[Op], d: &LinearDims, shape: &[usize], mut data: Vec<f32>) -> Vec<f32> {
    let rows = shape.first().copied().unwrap_or(1);
    let cols: usize = shape.iter().skip(1).product();
    for op in ops {
        match *op {
            Op::ReorderRows { offset, head } => {
                let perm = v_perm(d, head);
                let old = data[offset * cols..].to_vec();
                for (i, &p) in perm.iter().enumerate() {
                    data[(offset + i) * cols..(offset + i + 1) * cols].copy_from_slice(&old[p * cols..(p + 1) * cols]);
                }
            }
            Op::ReorderCols { head } => {
                let perm = v_perm(d, head);
                let mut row = vec![0f32; cols];
                for r in 0..rows {
                    let src = &data[r * cols..(r + 1) * cols];
                    for (i, &p) in perm.iter().enumerate() {
                        row[i] = src[p];
                    }
                    data[r * cols..(r + 1) * cols].copy_from_slice(&row);
                }
            }
            Op::NegExp => data.iter_mut().for_each(|v| *v = -v.exp()),
            Op::AddOne => data.iter_mut().for_each(|v| *v += 1.0),
        }
    }
    data
}

/// A tensor read from one HF tensor, reshaped to `shape` and transformed by `ops`.
fn transformed(name: String, t: &HfTensor, shape: Vec<usize>, ops: Vec<Op>, d: LinearDims) -> OutTensor {
    if ops.is_empty() && shape == t.shape {
        return OutTensor::from_hf(name, t);
    }
    let src = t.name.clone();
    let sh = shape.clone();
    OutTensor {
        rows_from: None,
        name,
        shape,
        source: t.name.clone(),
        make: Box::new(move |hf| {
            let t = hf.get(&src).expect("tensor listed at planning time");
            Ok(apply(&ops, &d, &sh, hf.f32(t)?))
        }),
        raw: None,
    }
}

/// `_LinearAttentionVReorderBase.modify_tensors` + `Qwen3NextModel.modify_tensors`: the
/// (renamed) HF name, the output shape and the transforms of one tensor.
fn plan_tensor(ctx: &Ctx, name: &str, t: &HfTensor, d: &LinearDims) -> Result<(String, Vec<usize>, Vec<Op>), HfError> {
    let mut name = name.to_string();
    let mut shape = t.shape.clone();
    let mut ops = Vec::new();
    let bad = |what: &str| {
        ctx.invalid(format!(
            "tensor `{}` has shape {:?}, {what} (linear attention: {} key heads × {}, {} value heads × {})",
            t.name, t.shape, d.n_k, d.head_k, d.n_v, d.head_v
        ))
    };
    let qk = d.n_k * d.head_k;
    let v_dim = d.n_v * d.head_v;
    if name.contains("linear_attn.") {
        // shapes are checked for every checkpoint, reordered or not
        let rows = shape.first().copied().unwrap_or(0);
        if name.contains(".in_proj_qkv.") {
            if shape.len() != 2 || rows != 2 * qk + v_dim {
                return Err(bad(&format!("expected [{}, hidden]", 2 * qk + v_dim)));
            }
            if d.reorders() {
                ops.push(Op::ReorderRows {
                    offset: 2 * qk,
                    head: d.head_v,
                });
            }
        } else if name.contains(".in_proj_z.") {
            if shape.len() != 2 || rows != v_dim {
                return Err(bad(&format!("expected [{v_dim}, hidden]")));
            }
            if d.reorders() {
                ops.push(Op::ReorderRows {
                    offset: 0,
                    head: d.head_v,
                });
            }
        } else if name.contains(".in_proj_b.") || name.contains(".in_proj_a.") {
            if shape.len() != 2 || rows != d.n_v {
                return Err(bad(&format!("expected [{}, hidden]", d.n_v)));
            }
            if d.reorders() {
                ops.push(Op::ReorderRows { offset: 0, head: 1 });
            }
        } else if name.contains(".A_log") || name.contains(".dt_bias") || name.contains(".dt_proj") {
            if shape.last() != Some(&d.n_v) {
                return Err(bad(&format!("expected {} values (one per value head)", d.n_v)));
            }
            if d.reorders() {
                ops.push(if shape.len() == 1 {
                    Op::ReorderRows { offset: 0, head: 1 }
                } else {
                    Op::ReorderCols { head: 1 }
                });
            }
        } else if name.contains(".conv1d") {
            // `squeeze()`: [channels, 1, kernel] → [channels, kernel]
            shape.retain(|&x| x != 1);
            if shape.len() != 2 || shape[0] != 2 * qk + v_dim {
                return Err(bad(&format!("expected [{}, 1, kernel]", 2 * qk + v_dim)));
            }
            if d.reorders() {
                ops.push(Op::ReorderRows {
                    offset: 2 * qk,
                    head: d.head_v,
                });
            }
        } else if name.contains(".out_proj.") {
            if shape.len() != 2 || shape[1] != v_dim {
                return Err(bad(&format!("expected [hidden, {v_dim}]")));
            }
            if d.reorders() {
                ops.push(Op::ReorderCols { head: d.head_v });
            }
        }
    }
    // Qwen3NextModel.modify_tensors
    if name.ends_with(".A_log") {
        ops.push(Op::NegExp);
    } else if name.ends_with(".dt_bias") {
        name = format!("{}.dt_proj.bias", name.trim_end_matches(".dt_bias"));
    } else if name.contains("conv1d") {
        shape.retain(|&x| x != 1);
    } else if name.ends_with("norm.weight") && !name.ends_with("linear_attn.norm.weight") {
        ops.push(Op::AddOne);
    }
    if name.contains("in_proj_qkvz") || name.contains("in_proj_ba") {
        return Err(ctx.invalid(format!(
            "tensor `{}`: the fused Qwen3-Next linear-attention layout is not a Qwen3.5 layout",
            t.name
        )));
    }
    Ok((name, shape, ops))
}

/// Experts of one block waiting to be stacked (`Qwen2MoeModel.modify_tensors`).
#[derive(Default)]
struct ExpertBlock {
    /// HF name after filtering → source tensor.
    seen: BTreeMap<String, HfTensor>,
}

/// Stacked experts `[n_expert, rows, cols]` from one 2-D tensor per expert.
fn stacked(ctx: &Ctx, name: String, parts: Vec<HfTensor>) -> Result<OutTensor, HfError> {
    let shape0 = parts[0].shape.clone();
    if shape0.len() != 2 || parts.iter().any(|p| p.shape != shape0) {
        return Err(ctx.invalid(format!(
            "expert tensors for `{name}` must all be 2-D with the same shape (`{}` is {:?})",
            parts[0].name, parts[0].shape
        )));
    }
    let mut shape = vec![parts.len()];
    shape.extend(&shape0);
    let srcs: Vec<String> = parts.iter().map(|p| p.name.clone()).collect();
    Ok(OutTensor {
        rows_from: None,
        name,
        shape,
        source: parts[0].name.clone(),
        make: Box::new(move |hf: &HfTensors| {
            let mut out = Vec::new();
            for s in &srcs {
                out.extend(hf.f32(hf.get(s).expect("listed"))?);
            }
            Ok(out)
        }),
        raw: None,
    })
}

/// Half of a fused `experts.gate_up_proj` `[n_expert, 2·n_ff, n_embd]` (gate first).
fn gate_up_half(name: String, t: &HfTensor, second: bool) -> OutTensor {
    let (e, rows2, cols) = (t.shape[0], t.shape[1], t.shape[2]);
    let n_ff = rows2 / 2;
    let src = t.name.clone();
    OutTensor {
        rows_from: None,
        name,
        shape: vec![e, n_ff, cols],
        source: t.name.clone(),
        make: Box::new(move |hf| {
            let all = hf.f32(hf.get(&src).expect("listed"))?;
            let mut out = Vec::with_capacity(e * n_ff * cols);
            for x in 0..e {
                let start = (x * rows2 + if second { n_ff } else { 0 }) * cols;
                out.extend_from_slice(&all[start..start + n_ff * cols]);
            }
            Ok(out)
        }),
        raw: None,
    }
}

fn tensors(ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
    let d = LinearDims::read(ctx)?;
    // fails early for a plain conversion of a checkpoint without MTP layers
    mtp_layers(ctx)?;
    let orig_blocks = ctx
        .cfg
        .req_u64(&["n_layers", "num_hidden_layers", "n_layer", "num_layers"])?;
    let n_experts = ctx.cfg.find_u64(&["num_local_experts", "num_experts"]);
    let mut experts: BTreeMap<u32, ExpertBlock> = BTreeMap::new();
    let mut out = Vec::new();
    for t in ctx.hf.tensors() {
        let Some(name) = filter_name(ctx, &t.name, orig_blocks) else {
            continue;
        };
        if always_skipped(&name) {
            continue;
        }
        let (name, shape, ops) = plan_tensor(ctx, &name, t, &d)?;
        // Qwen2MoeModel.modify_tensors: fused or per-expert tensors
        let base = name.trim_end_matches(".weight");
        if base.ends_with("mlp.experts.down_proj") {
            if shape.len() != 3 {
                return Err(ctx.invalid(format!("tensor `{}` must be 3-D [experts, rows, cols]", t.name)));
            }
            out.push(OutTensor::from_hf(gguf_name(ctx, &format!("{base}.weight"))?, t));
            continue;
        }
        if base.ends_with("mlp.experts.gate_up_proj") {
            if shape.len() != 3 || shape[1] % 2 != 0 {
                return Err(ctx.invalid(format!("Unexpected gate_up_proj shape for `{}`: {:?}", t.name, t.shape)));
            }
            let stem = base.trim_end_matches(".gate_up_proj");
            out.push(gate_up_half(
                gguf_name(ctx, &format!("{stem}.gate_proj.weight"))?,
                t,
                false,
            ));
            out.push(gate_up_half(
                gguf_name(ctx, &format!("{stem}.up_proj.weight"))?,
                t,
                true,
            ));
            continue;
        }
        if name.contains("experts") {
            let n_exp = n_experts.ok_or_else(|| {
                ctx.invalid(format!(
                    "tensor `{}` is an expert, but config.json has no num_experts",
                    t.name
                ))
            })? as usize;
            let bid =
                block_id(&name).ok_or_else(|| ctx.invalid(format!("expert tensor `{}` has no block index", t.name)))?;
            let block = experts.entry(bid).or_default();
            block.seen.insert(name.clone(), t.clone());
            if block.seen.len() >= n_exp * 3 {
                let mut block = experts.remove(&bid).expect("present");
                for w in ["down_proj", "gate_proj", "up_proj"] {
                    let mut parts = Vec::with_capacity(n_exp);
                    for x in 0..n_exp {
                        let en = format!("model.layers.{bid}.mlp.experts.{x}.{w}.weight");
                        parts.push(block.seen.remove(&en).ok_or_else(|| {
                            ctx.invalid(format!("block {bid}: missing expert tensor `{en}` (from `{}`)", t.name))
                        })?);
                    }
                    let merged = format!("model.layers.{bid}.mlp.experts.{w}.weight");
                    out.push(stacked(ctx, gguf_name(ctx, &merged)?, parts)?);
                }
                if !block.seen.is_empty() {
                    experts.insert(bid, block);
                }
            }
            continue;
        }
        let gname = gguf_name(ctx, &name)?;
        out.push(transformed(gname, t, shape, ops, d));
    }
    let left: Vec<&str> = experts
        .values()
        .flat_map(|b| b.seen.values().map(|t| t.name.as_str()))
        .collect();
    if !left.is_empty() {
        return Err(ctx.invalid(format!("Unprocessed experts (incomplete expert set): {left:?}")));
    }
    Ok(out)
}

fn set_parameters(ctx: &Ctx, arch: &str, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
    let (n_layer, n_mtp) = mtp_layers(ctx)?;
    let block_count = n_layer + n_mtp;
    set_text_parameters(ctx, arch, m, file_type)?;
    let k = Keys(arch);
    // TextModel.set_gguf_parameters writes the block count extended by the MTP layers
    m.insert(k.k(key::BLOCK_COUNT), Value::U32(block_count as u32));
    let u32_key = |m: &mut Metadata, key: &str, v: u64| {
        m.insert(k.k(key), Value::U32(v as u32));
    };
    // Qwen2MoeModel.set_gguf_parameters
    if let Some(v) = ctx.cfg.find_u64(&["moe_intermediate_size"]) {
        u32_key(m, key::EXPERT_FEED_FORWARD_LENGTH, v);
    }
    if let Some(v) = ctx.cfg.find_u64(&["shared_expert_intermediate_size"]) {
        u32_key(m, key::EXPERT_SHARED_FEED_FORWARD_LENGTH, v);
    }
    // _QwenMtpMixin.set_gguf_parameters
    if n_mtp > 0 {
        u32_key(m, key::NEXTN_PREDICT_LAYERS, n_mtp);
    }
    // Qwen3NextModel.set_gguf_parameters
    let req = |key: &str| ctx.cfg.req_u64(&[key]);
    u32_key(m, key::SSM_CONV_KERNEL, req("linear_conv_kernel_dim")?);
    u32_key(m, key::SSM_STATE_SIZE, req("linear_key_head_dim")?);
    u32_key(m, key::SSM_GROUP_COUNT, req("linear_num_key_heads")?);
    u32_key(m, key::SSM_TIME_STEP_RANK, req("linear_num_value_heads")?);
    u32_key(
        m,
        key::SSM_INNER_SIZE,
        req("linear_value_head_dim")? * req("linear_num_value_heads")?,
    );
    if let Some(lt) = ctx.cfg.get("layer_types") {
        let lt = lt
            .as_array()
            .ok_or_else(|| ctx.invalid("config.json `layer_types` is not a list"))?;
        if lt.len() as u64 != n_layer {
            return Err(ctx.invalid(format!(
                "layer_types has {} entries, expected num_hidden_layers ({n_layer})",
                lt.len()
            )));
        }
        let mut recurrent: Vec<bool> = lt.iter().map(|t| t.as_str() == Some("linear_attention")).collect();
        recurrent.resize(block_count as usize, false);
        m.insert(k.k(key::ATTN_RECURRENT_LAYERS), Value::Array(Array::Bool(recurrent)));
    }
    u32_key(
        m,
        key::FULL_ATTENTION_INTERVAL,
        ctx.cfg.find_u64(&["full_attention_interval"]).unwrap_or(4),
    );
    let head_dim = match ctx.cfg.find_u64(&["head_dim"]) {
        Some(h) => h,
        None => req("hidden_size")? / req("num_attention_heads")?.max(1),
    };
    let rp = rope_parameters(ctx);
    let partial = rp.get("partial_rotary_factor").and_then(J::as_f64).unwrap_or(0.25);
    u32_key(m, key::ROPE_DIMENSION_COUNT, (head_dim as f64 * partial) as u64);
    // _Qwen35MRopeMixin.set_gguf_parameters
    if !rp.contains_key("mrope_section") {
        m.insert(
            k.k(key::ROPE_DIMENSION_SECTIONS),
            Value::Array(Array::I32(DEFAULT_MROPE_SECTION.to_vec())),
        );
    }
    Ok(())
}

/// `TextModel.set_vocab` (`_set_vocab_gpt2`), plus the notes on what the conversion leaves out.
fn set_vocab(ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
    let mut notes = vocab::VocabNotes::default();
    vocab::set_vocab_gpt2(&ctx.dir, &ctx.cfg, m, &mut notes)?;
    ctx.notes.extend(notes.warnings);
    let vision = ctx
        .hf
        .tensors()
        .iter()
        .filter(|t| base_filter(&t.name).is_none())
        .count();
    if vision > 0 {
        ctx.notes.push(format!(
            "skipped {vision} vision-tower tensors (model.visual.*): only the text model is converted"
        ));
    }
    let mtp = ctx
        .hf
        .tensors()
        .iter()
        .filter(|t| t.name.starts_with("mtp.") || t.name.starts_with("model.mtp."))
        .count();
    if !ctx.no_mtp && mtp == 0 {
        // as in llama.cpp, `mtp_num_hidden_layers` alone extends the block count
        ctx.notes.push(
            "config.json declares MTP layers but the checkpoint has no `mtp.*` tensors; the block count \
             includes them anyway (as llama.cpp's converter writes it): consider --no-mtp"
                .into(),
        );
    }
    if ctx.no_mtp && mtp > 0 {
        ctx.notes.push(format!(
            "--no-mtp: dropped {mtp} multi-token-prediction tensors (mtp.*)"
        ));
    }
    Ok(())
}

impl Family for Qwen35 {
    fn gguf_arch(&self, _ctx: &Ctx) -> Arch {
        Arch::Qwen35
    }
    fn set_parameters(&self, ctx: &Ctx, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
        set_parameters(ctx, Arch::Qwen35.name(), m, file_type)
    }
    fn set_vocab(&self, ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
        set_vocab(ctx, m)
    }
    fn tensors(&self, ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
        tensors(ctx)
    }
}

impl Family for Qwen35Moe {
    fn gguf_arch(&self, _ctx: &Ctx) -> Arch {
        Arch::Qwen35Moe
    }
    fn set_parameters(&self, ctx: &Ctx, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
        set_parameters(ctx, Arch::Qwen35Moe.name(), m, file_type)
    }
    fn set_vocab(&self, ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
        set_vocab(ctx, m)
    }
    fn tensors(&self, ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
        tensors(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_heads_go_from_grouped_to_tiled() {
        let d = LinearDims {
            n_k: 2,
            n_v: 4,
            head_k: 1,
            head_v: 1,
        };
        // grouped [K0v0, K0v1, K1v0, K1v1] → tiled [K0v0, K1v0, K0v1, K1v1]
        assert_eq!(v_perm(&d, 1), vec![0, 2, 1, 3]);
        assert_eq!(v_perm(&d, 2), vec![0, 1, 4, 5, 2, 3, 6, 7]);
        let cols = apply(&[Op::ReorderCols { head: 1 }], &d, &[1, 4], vec![0., 1., 2., 3.]);
        assert_eq!(cols, vec![0., 2., 1., 3.]);
        let rows = apply(
            &[Op::ReorderRows { offset: 1, head: 1 }],
            &d,
            &[5],
            vec![9., 0., 1., 2., 3.],
        );
        assert_eq!(rows, vec![9., 0., 2., 1., 3.]);
    }
}
