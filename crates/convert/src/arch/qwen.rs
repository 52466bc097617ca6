//! `Qwen2ForCausalLM` → `qwen2` (QKV biases) and `Qwen3ForCausalLM` → `qwen3` (per-head Q/K
//! RMSNorm) (llama.cpp `conversion/qwen.py`, `Qwen2Model`, `Qwen3Model`).

use super::text::set_text_parameters;
use super::{always_skipped, base_filter, map_or_err, Ctx, Family, OutTensor};
use crate::hf::HfError;
use crate::vocab;
use gguf::Arch;
use gguf::Metadata;

pub struct Qwen2;
pub struct Qwen3;

fn qwen_vocab(ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
    if ctx.dir.join("tokenizer.model").is_file() {
        return Err(
            ctx.invalid("SentencePiece tokenizer.model vocabularies are not supported by this version of hf2q convert")
        );
    }
    let mut notes = vocab::VocabNotes::default();
    vocab::set_vocab_gpt2(&ctx.dir, &ctx.cfg, m, &mut notes)?;
    ctx.notes.extend(notes.warnings);
    Ok(())
}

fn qwen_tensors(ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
    let mut out = Vec::new();
    for t in ctx.hf.tensors() {
        let Some(mut name) = base_filter(&t.name) else { continue };
        if always_skipped(&name) {
            continue;
        }
        if ctx.hf_arch == "Qwen2Model" {
            name = format!("model.{name}");
        }
        out.push(OutTensor::from_hf(map_or_err(ctx, &name)?, t));
    }
    Ok(out)
}

impl Family for Qwen2 {
    fn gguf_arch(&self, _ctx: &Ctx) -> Arch {
        Arch::Qwen2
    }
    fn set_parameters(&self, ctx: &Ctx, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
        set_text_parameters(ctx, Arch::Qwen2.name(), m, file_type)
    }
    fn set_vocab(&self, ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
        qwen_vocab(ctx, m)
    }
    fn tensors(&self, ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
        qwen_tensors(ctx)
    }
}

impl Family for Qwen3 {
    fn gguf_arch(&self, _ctx: &Ctx) -> Arch {
        Arch::Qwen3
    }
    fn set_parameters(&self, ctx: &Ctx, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
        set_text_parameters(ctx, Arch::Qwen3.name(), m, file_type)
    }
    fn set_vocab(&self, ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
        qwen_vocab(ctx, m)
    }
    fn tensors(&self, ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
        qwen_tensors(ctx)
    }
}
