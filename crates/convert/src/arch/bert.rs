//! `BertModel` / `BertForMaskedLM` → GGUF `bert` and `NomicBertModel` → `nomic-bert`
//! (llama.cpp `conversion/bert.py`, `BertModel`, `NomicBertModel`): encoders for embeddings, with
//! a WordPiece vocabulary, non-causal attention and the sentence-transformers pooling type.

use super::text::{set_text_parameters, Keys};
use super::{always_skipped, base_filter, map_or_err, Ctx, Family, OutTensor};
use crate::hf::HfError;
use crate::vocab;
use gguf::arch::key;
use gguf::Arch;
use gguf::{Array, Metadata, Value};
use serde_json::Value as J;

pub struct Bert;
pub struct NomicBert;

/// gguf-py `PoolingType`.
mod pooling {
    pub const MEAN: u32 = 1;
    pub const CLS: u32 = 2;
    pub const LAST: u32 = 3;
}

fn read_json(ctx: &Ctx, path: &std::path::Path) -> Result<J, HfError> {
    let text = std::fs::read_to_string(path).map_err(|source| HfError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ctx.invalid(format!("{}: malformed JSON: {e}", path.display())))
}

/// `TextModel._try_set_pooling_type`: the pooling of the sentence-transformers `Pooling` module
/// (`modules.json` → `<path>/config.json`), and the pooling before a classification head.
pub fn try_set_pooling_type(ctx: &Ctx, arch: &str, m: &mut Metadata) -> Result<(), HfError> {
    let k = Keys(arch);
    let mode = |s: &str| match s {
        "mean" => Some(pooling::MEAN),
        "cls" => Some(pooling::CLS),
        "lasttoken" => Some(pooling::LAST),
        _ => None,
    };
    let modules_path = ctx.dir.join("modules.json");
    if modules_path.is_file() {
        let modules = read_json(ctx, &modules_path)?;
        let pooling_path = modules.as_array().into_iter().flatten().find_map(|module| {
            let ty = module.get("type").and_then(J::as_str)?;
            ty.ends_with("Pooling")
                .then(|| module.get("path").and_then(J::as_str).unwrap_or("").to_string())
        });
        if let Some(p) = pooling_path {
            let cfg = read_json(ctx, &ctx.dir.join(&p).join("config.json"))?;
            let on = |key: &str| cfg.get(key).is_some_and(|v| v.as_bool().unwrap_or(false));
            let ty = if on("pooling_mode_mean_tokens") {
                pooling::MEAN
            } else if on("pooling_mode_cls_token") {
                pooling::CLS
            } else if on("pooling_mode_lasttoken") {
                pooling::LAST
            } else if let Some(t) = cfg.get("pooling_mode").and_then(J::as_str).and_then(mode) {
                t
            } else {
                return Err(ctx.invalid(format!(
                    "{p}/config.json: only MEAN, CLS and LAST pooling are supported"
                )));
            };
            m.insert(k.k(key::POOLING_TYPE), Value::U32(ty));
        }
    }
    if let Some(cp) = ctx.cfg.get("classifier_pooling") {
        let t = cp
            .as_str()
            .filter(|s| matches!(*s, "cls" | "mean"))
            .and_then(mode)
            .ok_or_else(|| ctx.invalid(format!("unsupported classifier_pooling {cp}")))?;
        m.insert(k.k(key::CLASSIFIER_POOLING_TYPE), Value::U32(t));
    }
    Ok(())
}

/// `BertModel.__init__`: `id2label`, unless it is the two dummy labels AutoConfig adds.
fn classifier_labels(ctx: &Ctx) -> Option<Vec<String>> {
    let labels = ctx.cfg.get("id2label")?.as_object()?;
    if labels.len() == 2 && labels.get("0").and_then(J::as_str) == Some("LABEL_0") {
        return None;
    }
    let mut v: Vec<(i64, String)> = labels
        .iter()
        .map(|(k, l)| {
            (
                k.parse().unwrap_or(i64::MAX),
                l.as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    v.sort();
    (!v.is_empty()).then(|| v.into_iter().map(|(_, l)| l).collect())
}

/// `BertModel.set_gguf_parameters`.
fn bert_parameters(ctx: &Ctx, arch: &str, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
    set_text_parameters(ctx, arch, m, file_type)?;
    let k = Keys(arch);
    m.insert(k.k(key::ATTN_CAUSAL), Value::Bool(false));
    try_set_pooling_type(ctx, arch, m)?;
    if let Some(labels) = classifier_labels(ctx) {
        m.insert(
            k.k(key::CLASSIFIER_OUTPUT_LABELS),
            Value::Array(Array::String(labels.iter().collect())),
        );
    }
    Ok(())
}

fn bert_vocab(ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
    let mut notes = vocab::VocabNotes::default();
    vocab::wordpiece::set_vocab_wordpiece(&ctx.dir, &ctx.cfg, m, &mut notes)?;
    ctx.notes.extend(notes.warnings);
    Ok(())
}

/// `BertModel.filter_tensors` (+ `TextModel.filter_tensors`): the `bert.` prefix and old
/// `gamma`/`beta` names are normalised; the pooler and the pre-training heads are dropped.
fn bert_filter(name: &str) -> Option<String> {
    let mut n = name.strip_prefix("bert.").unwrap_or(name).to_string();
    if let Some(b) = n.strip_suffix(".gamma") {
        n = format!("{b}.weight");
    }
    if let Some(b) = n.strip_suffix(".beta") {
        n = format!("{b}.bias");
    }
    if matches!(
        n.as_str(),
        "embeddings.position_ids" | "pooler.dense.weight" | "pooler.dense.bias"
    ) || n.starts_with("cls.predictions")
        || n.starts_with("cls.seq_relationship")
    {
        return None;
    }
    base_filter(&n)
}

fn bert_tensors(ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
    let mut out = Vec::new();
    for t in ctx.hf.tensors() {
        let Some(name) = bert_filter(&t.name) else { continue };
        if always_skipped(&name) {
            continue;
        }
        out.push(OutTensor::from_hf(map_or_err(ctx, &name)?, t));
    }
    Ok(out)
}

impl Family for Bert {
    fn gguf_arch(&self, _ctx: &Ctx) -> Arch {
        Arch::Bert
    }
    fn set_parameters(&self, ctx: &Ctx, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
        bert_parameters(ctx, Arch::Bert.name(), m, file_type)
    }
    fn set_vocab(&self, ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
        bert_vocab(ctx, m)
    }
    fn tensors(&self, ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
        bert_tensors(ctx)
    }
}

/// `NomicBertModel.__init__`: the checks on the published nomic-embed configuration, and the
/// context length: n_positions 8192 with max_trained_positions 2048 means 2048 (v1, v1.5).
fn nomic_n_positions(ctx: &Ctx) -> Result<u64, HfError> {
    let raw = |k: &str| ctx.cfg.merged.get(k);
    if raw("moe_every_n_layers").is_some_and(|v| !v.is_null() && v != &J::from(0) && v != &J::Bool(false)) {
        return Err(ctx.invalid(
            "NomicBertModel with MoE layers (nomic-embed-text-v2-moe, GGUF nomic-bert-moe) is not supported by this version",
        ));
    }
    let tok_type = std::fs::read_to_string(ctx.dir.join("tokenizer.json"))
        .ok()
        .and_then(|s| serde_json::from_str::<J>(&s).ok())
        .and_then(|j| j.pointer("/model/type").and_then(J::as_str).map(String::from));
    match tok_type.as_deref() {
        Some("WordPiece") => {}
        Some("Unigram") => {
            return Err(
                ctx.invalid("NomicBertModel with an XLM-RoBERTa (Unigram) tokenizer is not supported by this version")
            )
        }
        Some(other) => return Err(ctx.invalid(format!("NomicBertModel: unknown tokenizer type `{other}`"))),
        None => return Err(ctx.invalid("NomicBertModel: tokenizer.json with a model type is required")),
    }
    let npos = ctx.cfg.req_u64(&["n_positions"])?;
    let mtp = ctx.cfg.get("max_trained_positions").and_then(J::as_u64).unwrap_or(2048);
    let n_ctx = match (npos, mtp) {
        (8192, 2048) => 2048,
        (2048, 2048) => 512,
        _ => {
            return Err(ctx.invalid(format!(
                "NomicBertModel: unrecognized parameters n_positions={npos}, max_trained_positions={mtp}"
            )))
        }
    };
    let expect = |key: &str, ok: &dyn Fn(&J) -> bool, want: &str| -> Result<(), HfError> {
        match raw(key) {
            Some(v) if ok(v) => Ok(()),
            got => Err(ctx.invalid(format!(
                "NomicBertModel: config.json `{key}` must be {want} (got {})",
                got.map_or("nothing".to_string(), |v| v.to_string())
            ))),
        }
    };
    expect("activation_function", &|v| v == "swiglu", "\"swiglu\"")?;
    for key in [
        "causal",
        "qkv_proj_bias",
        "mlp_fc1_bias",
        "mlp_fc2_bias",
        "prenorm",
        "rotary_emb_interleaved",
    ] {
        expect(key, &|v| v == &J::Bool(false), "false")?;
    }
    expect("rotary_emb_fraction", &|v| v.as_f64() == Some(1.0), "1.0")?;
    expect("rotary_emb_scale_base", &|v| v.is_null(), "null")?;
    Ok(n_ctx)
}

impl Family for NomicBert {
    fn gguf_arch(&self, _ctx: &Ctx) -> Arch {
        Arch::NomicBert
    }
    fn set_parameters(&self, ctx: &Ctx, m: &mut Metadata, file_type: u32) -> Result<(), HfError> {
        let n_ctx = nomic_n_positions(ctx)?;
        bert_parameters(ctx, Arch::NomicBert.name(), m, file_type)?;
        // The rewritten n_positions is the context length unless an earlier alias is present
        // (TextModel.set_gguf_parameters' find_hparam order); insert keeps the key's position.
        if ctx.cfg.find(&["max_position_embeddings", "n_ctx"]).is_none() {
            m.insert(Arch::NomicBert.key(key::CONTEXT_LENGTH), Value::U32(n_ctx as u32));
        }
        Ok(())
    }
    fn set_vocab(&self, ctx: &mut Ctx, m: &mut Metadata) -> Result<(), HfError> {
        bert_vocab(ctx, m)
    }
    fn tensors(&self, ctx: &Ctx) -> Result<Vec<OutTensor>, HfError> {
        nomic_n_positions(ctx)?;
        bert_tensors(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::bert_filter;

    #[test]
    fn filters_bert_names() {
        assert_eq!(
            bert_filter("bert.encoder.layer.0.output.LayerNorm.gamma").as_deref(),
            Some("encoder.layer.0.output.LayerNorm.weight")
        );
        assert_eq!(bert_filter("pooler.dense.weight"), None);
        assert_eq!(bert_filter("cls.predictions.bias"), None);
        assert_eq!(bert_filter("embeddings.position_ids"), None);
    }
}
