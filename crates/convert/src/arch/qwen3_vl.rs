//! `Qwen3VLForConditionalGeneration` → `qwen3vl`, the text model only (llama.cpp
//! `conversion/qwen3vl.py`, `Qwen3VLTextModel`): Qwen3 layers with interleaved M-RoPE
//! (`rope.dimension_sections`) and the deepstack layer count. The vision tower (`model.visual.*`,
//! including the deepstack mergers) belongs to the separate mmproj conversion and is skipped.

use super::qwen::Qwen3;
use super::text::{set_text_parameters, Keys};
use super::{always_skipped, base_filter, map_or_err, Ctx, Family, OutTensor};
use crate::hf::HfError;
use gguf::arch::key;
use gguf::Arch;
use gguf::{Metadata, Value};
use serde_json::Value as J;

pub struct Qwen3Vl;

/// `len(vision_config.deepstack_visual_indexes)` (from `thinker_config` for Omni-style configs).
fn deepstack_layers(ctx: &Ctx) -> Result<u32, HfError> {
    let vision = match ctx.cfg.get("thinker_config") {
        Some(t) => t.get("vision_config"),
        None => ctx.cfg.get("vision_config"),
    };
    match vision.and_then(|v| v.get("deepstack_visual_indexes")) {
        None | Some(J::Null) => Ok(0),
        Some(J::Array(a)) => Ok(a.len() as u32),
        Some(other) => Err(ctx.invalid(format!(
            "vision_config.deepstack_visual_indexes should be a list, found {other}"
        ))),
    }
}

/// `Qwen3VLTextModel.filter_tensors`: drop `thinker.`, then TextModel's multimodal filter (the
/// vision tower and its deepstack mergers give `None`).
fn text_name(name: &str) -> Option<String> {
    base_filter(&name.replace("thinker.", ""))
}

impl Family for Qwen3Vl {
    fn gguf_arch(&self, _ctx: &Ctx) -> Arch {
        Arch::Qwen3Vl
    }
    fn set_parameters(&self, ctx: &Ctx, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
        set_text_parameters(ctx, Arch::Qwen3Vl.name(), m, file_type)?;
        m.insert(
            Keys(Arch::Qwen3Vl.name()).k(key::N_DEEPSTACK_LAYERS),
            Value::U32(deepstack_layers(ctx)?),
        );
        Ok(())
    }
    /// `Qwen3Model.set_vocab` (via `Qwen2Model`). `tensors` cannot record notes (it sees `&Ctx`), so
    /// the note on the skipped vision tower is added here, where the pipeline lends `&mut Ctx`.
    fn set_vocab(&self, ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
        let skipped: Vec<String> = ctx
            .hf
            .tensors()
            .iter()
            .filter(|t| text_name(&t.name).is_none())
            .map(|t| t.name.clone())
            .collect();
        if let Some(first) = skipped.first() {
            ctx.notes.push(format!(
                "skipped {} vision-tower tensors (e.g. `{first}`): this converts the text model only; \
                 llama.cpp writes the vision encoder to a separate mmproj GGUF",
                skipped.len()
            ));
        }
        Qwen3.set_vocab(ctx, m)
    }
    fn tensors(&self, ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
        let mut out = Vec::new();
        for t in ctx.hf.tensors() {
            let Some(name) = text_name(&t.name) else { continue };
            if always_skipped(&name) {
                continue;
            }
            out.push(OutTensor::from_hf(map_or_err(ctx, &name)?, t));
        }
        Ok(out)
    }
}
