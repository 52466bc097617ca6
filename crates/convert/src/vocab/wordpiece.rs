//! BERT WordPiece vocabulary (llama.cpp `conversion/bert.py`, `BertModel.set_vocab`): the
//! id-ordered tokens of `tokenizer.json` (or `vocab.txt`), rewritten to llama.cpp's "phantom space"
//! form, tokenizer model `bert`, the pre-tokenizer hash, and the special tokens.

use super::special::SpecialVocab;
use super::{token_type, VocabNotes};
use crate::hf::{HfConfig, HfError};
use gguf::{Array, Metadata, Value};
use serde_json::Value as J;
use std::collections::HashMap;
use std::path::Path;

// BertModel.set_vocab: phantom(): control tokens stay, `##x` continues a word as `x`, and every
// other token starts a word, marked with U+2581.
fn phantom(tok: &str, ty: i32) -> String {
    if ty == token_type::CONTROL {
        tok.to_string()
    } else if let Some(rest) = tok.strip_prefix("##") {
        rest.to_string()
    } else {
        format!("\u{2581}{tok}")
    }
}

fn read_json(path: &Path) -> Option<J> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// A special token string from tokenizer_config.json / special_tokens_map.json, else BERT's default.
fn special_str(tc: &Option<J>, map: &Option<J>, key: &str, default: &str) -> String {
    let of = |j: &Option<J>| match j.as_ref()?.get(key)? {
        J::String(s) => Some(s.clone()),
        J::Object(o) => o.get("content").and_then(J::as_str).map(String::from),
        _ => None,
    };
    of(tc).or_else(|| of(map)).unwrap_or_else(|| default.to_string())
}

/// Tokens and types from `vocab.txt` when there is no `tokenizer.json`, as transformers'
/// `BertTokenizer` builds them: one token per line (a repeated token keeps its last line), the
/// unk/sep/pad/cls/mask strings are special added tokens (CONTROL).
fn vocab_txt(dir: &Path, cfg: &HfConfig) -> Result<(Vec<String>, Vec<i32>), HfError> {
    let path = dir.join("vocab.txt");
    let text = std::fs::read_to_string(&path).map_err(|source| HfError::Io {
        path: path.clone(),
        source,
    })?;
    let mut ids: HashMap<&str, u64> = HashMap::new();
    for (i, line) in text.split_inclusive('\n').enumerate() {
        ids.insert(line.strip_suffix('\n').unwrap_or(line), i as u64);
    }
    let by_id: HashMap<u64, &str> = ids.iter().map(|(t, i)| (*i, *t)).collect();
    let tc = read_json(&dir.join("tokenizer_config.json"));
    let map = read_json(&dir.join("special_tokens_map.json"));
    let specials: Vec<String> = [
        ("unk_token", "[UNK]"),
        ("sep_token", "[SEP]"),
        ("pad_token", "[PAD]"),
        ("cls_token", "[CLS]"),
        ("mask_token", "[MASK]"),
    ]
    .iter()
    .map(|(k, d)| special_str(&tc, &map, k, d))
    .collect();
    let max_id = by_id.keys().copied().max().map_or(0, |m| m + 1);
    let vocab_size = cfg.get("vocab_size").and_then(J::as_u64).unwrap_or(max_id);
    if max_id > vocab_size {
        return Err(HfError::Invalid {
            path,
            problem: format!("vocab.txt has {max_id} tokens but config.json vocab_size is {vocab_size}"),
        });
    }
    let mut tokens = Vec::with_capacity(vocab_size as usize);
    let mut types = Vec::with_capacity(vocab_size as usize);
    for i in 0..vocab_size {
        match by_id.get(&i) {
            None => {
                tokens.push(format!("[PAD{i}]"));
                types.push(token_type::UNUSED);
            }
            Some(t) => {
                let special = specials.iter().any(|s| s == t);
                types.push(if special {
                    token_type::CONTROL
                } else {
                    token_type::NORMAL
                });
                tokens.push(t.to_string());
            }
        }
    }
    Ok((tokens, types))
}

/// The check-text hash of a `vocab.txt`-only tokenizer, built the way transformers converts a slow
/// `BertTokenizer` to a fast one (BertNormalizer, BertPreTokenizer, WordPiece, BertProcessing).
fn vocab_txt_hash(dir: &Path) -> Option<String> {
    use tokenizers::models::wordpiece::WordPiece;
    use tokenizers::normalizers::BertNormalizer;
    use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
    use tokenizers::processors::bert::BertProcessing;
    let tc = read_json(&dir.join("tokenizer_config.json"));
    let map = read_json(&dir.join("special_tokens_map.json"));
    let flag = |k: &str| tc.as_ref().and_then(|c| c.get(k)).and_then(J::as_bool);
    let unk = special_str(&tc, &map, "unk_token", "[UNK]");
    let cls = special_str(&tc, &map, "cls_token", "[CLS]");
    let sep = special_str(&tc, &map, "sep_token", "[SEP]");
    let vocab_path = dir.join("vocab.txt");
    let model = WordPiece::from_file(vocab_path.to_str()?).unk_token(unk).build().ok()?;
    let id = |t: &str| tokenizers::Model::token_to_id(&model, t);
    let (cls_id, sep_id) = (id(&cls)?, id(&sep)?);
    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_normalizer(Some(BertNormalizer::new(
        true,
        flag("tokenize_chinese_chars").unwrap_or(true),
        flag("strip_accents"),
        flag("do_lower_case").unwrap_or(true),
    )));
    tok.with_pre_tokenizer(Some(BertPreTokenizer));
    tok.with_post_processor(Some(BertProcessing::new((sep, sep_id), (cls, cls_id))));
    super::hash_ids(&tok)
}

/// `BertModel.set_vocab`: `tokenizer.ggml.token_type_count`, the WordPiece vocabulary as tokenizer
/// model `bert`, and `SpecialVocab` (cls/sep/mask/pad/unk ids, add-bos/eos/sep flags, normalizer).
pub fn set_vocab_wordpiece(
    dir: &Path,
    cfg: &HfConfig,
    m: &mut Metadata,
    notes: &mut VocabNotes,
) -> Result<(), HfError> {
    let (tokens, types, pre) = if dir.join("tokenizer.json").is_file() {
        let (tokens, types, tj) = super::vocab_base(dir, cfg)?;
        let model_type = tj.pointer("/model/type").and_then(J::as_str).unwrap_or("WordPiece");
        let pre = super::pre_tokenizer(dir, model_type, notes);
        (tokens, types, pre)
    } else if dir.join("vocab.txt").is_file() {
        let (tokens, types) = vocab_txt(dir, cfg)?;
        let hash = vocab_txt_hash(dir);
        let pre = super::pre_from_hash(hash, "WordPiece", notes);
        (tokens, types, pre)
    } else {
        return Err(HfError::Invalid {
            path: dir.to_path_buf(),
            problem: "no tokenizer.json or vocab.txt: cannot build the BERT WordPiece vocabulary".into(),
        });
    };
    // "we need this to validate the size of the token_type embeddings"
    let type_count = cfg.get("type_vocab_size").and_then(J::as_u64).unwrap_or(1);
    m.insert("tokenizer.ggml.token_type_count", Value::U32(type_count as u32));
    let n_vocab = tokens.len();
    let tokens: Vec<String> = tokens.iter().zip(&types).map(|(t, &ty)| phantom(t, ty)).collect();
    m.insert("tokenizer.ggml.model", Value::String("bert".into()));
    m.insert("tokenizer.ggml.pre", Value::String(pre));
    m.insert(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(tokens.iter().collect())),
    );
    m.insert("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    SpecialVocab::load(dir, false, None, Some(n_vocab)).write(m);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phantom_space() {
        assert_eq!(phantom("[CLS]", token_type::CONTROL), "[CLS]");
        assert_eq!(phantom("##ing", token_type::NORMAL), "ing");
        assert_eq!(phantom("the", token_type::NORMAL), "\u{2581}the");
        assert_eq!(phantom("[PAD7]", token_type::UNUSED), "\u{2581}[PAD7]");
    }
}
