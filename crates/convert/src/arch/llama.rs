//! `LlamaForCausalLM` (Llama 2/3, SmolLM) and `MistralForCausalLM` → GGUF `llama`
//! (llama.cpp `conversion/llama.py`, `LlamaModel`).

use super::text::{full_attention_rope, rope_parameters, set_text_parameters, Keys};
use super::{always_skipped, base_filter, map_or_err, Ctx, Family, OutTensor};
use crate::hf::{HfError, HfTensor};
use crate::vocab;
use gguf::arch::key;
use gguf::Arch;
use gguf::Tensor;
use gguf::{Metadata, Value};
use serde_json::Value as J;

pub struct Llama;

/// Undo HF's rotary row order for Q/K (`LlamaModel.permute`): rows grouped (head, half, r) become
/// (head, r, half). Works on any tensor whose first dimension is the row dimension.
pub fn permute_rows(data: &[f32], shape: &[usize], n_head: usize) -> Vec<f32> {
    let rows = shape[0];
    let cols: usize = shape[1..].iter().product();
    let r = rows / n_head / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..n_head {
        for i in 0..r {
            for t in 0..2 {
                let dst = h * 2 * r + i * 2 + t;
                let src = h * 2 * r + t * r + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

fn head_counts(ctx: &Ctx) -> Result<(usize, usize), HfError> {
    let n_head = ctx.cfg.req_u64(&["n_heads", "num_attention_heads"])? as usize;
    let n_kv = ctx
        .cfg
        .find_u64(&["n_kv_heads", "num_key_value_heads"])
        .map_or(n_head, |v| v as usize);
    Ok((n_head, n_kv))
}

/// A tensor permuted for rotary embeddings, checked against the head count.
pub fn permuted(ctx: &Ctx, name: String, t: &HfTensor, n_head: usize) -> Result<OutTensor, HfError> {
    if n_head == 0 || !t.shape[0].is_multiple_of(n_head * 2) {
        return Err(ctx.invalid(format!(
            "tensor `{}` has {} rows, not a multiple of 2 × {n_head} heads",
            t.name, t.shape[0]
        )));
    }
    let src = t.name.clone();
    let shape = t.shape.clone();
    Ok(OutTensor {
        rows_from: None,
        name,
        shape: t.shape.clone(),
        source: t.name.clone(),
        make: Box::new(move |hf| {
            let t = hf.get(&src).expect("listed");
            Ok(permute_rows(&hf.f32(t)?, &shape, n_head))
        }),
        raw: None,
    })
}

/// `LlamaModel.generate_extra_tensors`: `rope_freqs.weight` for Llama 3 rope scaling.
pub fn llama3_rope_freqs(ctx: &Ctx) -> Option<OutTensor> {
    let rp = full_attention_rope(&rope_parameters(ctx));
    if !rp
        .get("rope_type")
        .and_then(J::as_str)
        .is_some_and(|t| t.eq_ignore_ascii_case("llama3"))
    {
        return None;
    }
    let f = |k: &str, d: f64| rp.get(k).and_then(J::as_f64).unwrap_or(d);
    let base = f("rope_theta", 10000.0);
    let dim = ctx
        .cfg
        .get("head_dim")
        .and_then(J::as_u64)
        .or_else(|| Some(ctx.cfg.get("hidden_size")?.as_u64()? / ctx.cfg.get("num_attention_heads")?.as_u64()?))?
        as usize;
    let factor = f("factor", 8.0);
    let low = f("low_freq_factor", 1.0);
    let high = f("high_freq_factor", 4.0);
    let old_ctx = f("original_max_position_embeddings", 8192.0);
    // torch float32 arithmetic, as the converter computes it
    let low_wavelen = old_ctx / low;
    let high_wavelen = old_ctx / high;
    let factors: Vec<f32> = (0..dim / 2)
        .map(|j| {
            let e = (2 * j) as f32 / dim as f32;
            let freq = 1.0f32 / (base as f32).powf(e);
            let wavelen = (2.0 * std::f64::consts::PI) as f32 / freq;
            if (wavelen as f64) < high_wavelen {
                1.0
            } else if (wavelen as f64) > low_wavelen {
                factor as f32
            } else {
                let smooth = (old_ctx as f32 / wavelen - low as f32) / (high as f32 - low as f32);
                1.0 / ((1.0 - smooth) / factor as f32 + smooth)
            }
        })
        .collect();
    let shape = vec![factors.len()];
    Some(OutTensor {
        rows_from: None,
        name: Tensor::RopeFreqs.weight(),
        shape,
        source: "(generated)".into(),
        make: Box::new(move |_| Ok(factors.clone())),
        raw: None,
    })
}

impl Family for Llama {
    fn gguf_arch(&self, _ctx: &Ctx) -> Arch {
        Arch::Llama
    }

    fn set_parameters(&self, ctx: &Ctx, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
        set_text_parameters(ctx, Arch::Llama.name(), m, file_type)?;
        let k = Keys(Arch::Llama.name());
        let vocab_size = ctx.cfg.req_u64(&["vocab_size"])?;
        m.insert(k.k(key::VOCAB_SIZE), Value::U32(vocab_size as u32));
        let rope_dim = match ctx.cfg.get("head_dim").and_then(J::as_u64) {
            Some(d) => d,
            None => ctx.cfg.req_u64(&["hidden_size"])? / ctx.cfg.req_u64(&["num_attention_heads"])?,
        };
        m.insert(k.k(key::ROPE_DIMENSION_COUNT), Value::U32(rope_dim as u32));
        Ok(())
    }

    fn set_vocab(&self, ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
        if let Some(b) = vocab::add_space_prefix(&ctx.dir) {
            m.insert("tokenizer.ggml.add_space_prefix", Value::Bool(b));
        }
        if ctx.dir.join("tokenizer.model").is_file() {
            return Err(ctx.invalid(
                "SentencePiece tokenizer.model vocabularies are not supported by this version of hf2q convert",
            ));
        }
        let mut notes = vocab::VocabNotes::default();
        vocab::set_vocab_gpt2(&ctx.dir, &ctx.cfg, m, &mut notes)?;
        ctx.notes.extend(notes.warnings);
        if ctx.cfg.get("vocab_size").and_then(J::as_u64) == Some(49152) {
            // LlamaModel.set_vocab: "Apply to granite small models only"
            m.insert("tokenizer.ggml.add_bos_token", Value::Bool(false));
        }
        Ok(())
    }

    fn tensors(&self, ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
        let (n_head, n_kv) = head_counts(ctx)?;
        let mut out: Vec<OutTensor> = llama3_rope_freqs(ctx).into_iter().collect();
        for t in ctx.hf.tensors() {
            let Some(mut name) = base_filter(&t.name).map(|n| n.replace("text_model.", "")) else {
                continue;
            };
            if always_skipped(&name) {
                continue;
            }
            if ctx.hf_arch == "LlamaModel" {
                name = format!("model.{name}");
            }
            if name.contains("block_sparse_moe.experts") {
                return Err(ctx.invalid(format!(
                    "Mixtral-style expert tensor `{}` is not supported by this version",
                    t.name
                )));
            }
            let gguf_name = map_or_err(ctx, &name)?;
            if name.ends_with("q_proj.weight") || name.ends_with("q_proj.bias") {
                out.push(permuted(ctx, gguf_name, t, n_head)?);
            } else if name.ends_with("k_proj.weight") || name.ends_with("k_proj.bias") {
                out.push(permuted(ctx, gguf_name, t, n_kv)?);
            } else {
                out.push(OutTensor::from_hf(gguf_name, t));
            }
        }
        Ok(out)
    }
}
