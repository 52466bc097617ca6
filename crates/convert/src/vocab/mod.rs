//! Tokenizer metadata as llama.cpp's converter writes it (`conversion/base.py`: `get_vocab_base`,
//! `_set_vocab_gpt2`, `get_vocab_base_pre`), from `tokenizer.json` and friends.

pub mod pre_hashes;
pub mod special;
pub mod spm;
pub mod wordpiece;

use crate::hf::{HfConfig, HfError};
use gguf::{Array, Metadata, Value};
use serde_json::Value as J;
use special::SpecialVocab;
use std::collections::HashMap;
use std::path::Path;

/// gguf-py `TokenType`.
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// Notes for the conversion report (e.g. an unknown pre-tokenizer).
#[derive(Debug, Default, Clone)]
pub struct VocabNotes {
    pub warnings: Vec<String>,
}

// conversion/base.py: TextModel.does_token_look_special
pub fn does_token_look_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<\u{ff5c}") && t.ends_with("\u{ff5c}>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

fn read_tokenizer_json(dir: &Path) -> Result<J, HfError> {
    let path = dir.join("tokenizer.json");
    let text = std::fs::read_to_string(&path).map_err(|source| HfError::Io {
        path: path.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| HfError::Invalid {
        path,
        problem: format!("malformed JSON: {e}"),
    })
}

/// The `tokenizer.ggml.pre` value: the known pre-tokenizer whose check-text hash matches, else the
/// fallback `gpt-2` (byte-level BPE) or `bert-bge` (WordPiece), with a warning — what the reference
/// fixtures' converter does (`shared/fixtures/tiny/README.md`).
pub fn pre_tokenizer(dir: &Path, model_type: &str, notes: &mut VocabNotes) -> String {
    pre_from_hash(check_hash(dir), model_type, notes)
}

/// `tokenizer.ggml.pre` for a check-text hash (see [`pre_tokenizer`]).
pub fn pre_from_hash(hash: Option<String>, model_type: &str, notes: &mut VocabNotes) -> String {
    if let Some(h) = &hash {
        // The Python is a chain of `if chkhsh == …: res = …` (not elif): a hash listed twice
        // (e.g. bge-small and jina-v2-en share one) takes the last entry.
        if let Some((_, name, _)) = pre_hashes::KNOWN_PRE_TOKENIZERS.iter().rev().find(|(k, _, _)| k == h) {
            return name.to_string();
        }
    }
    let fallback = if model_type == "WordPiece" { "bert-bge" } else { "gpt-2" };
    notes.warnings.push(format!(
        "BPE pre-tokenizer not recognized (chkhsh {}); using `{fallback}`, the closest match for a plain {} tokenizer",
        hash.as_deref().unwrap_or("unavailable"),
        if model_type == "WordPiece" {
            "WordPiece"
        } else {
            "GPT-2 byte-level"
        }
    ));
    fallback.to_string()
}

/// sha256 of `str(tokenizer.encode(CHECK_TEXT))` (Python list formatting).
pub fn check_hash(dir: &Path) -> Option<String> {
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).ok()?;
    hash_ids(&tok)
}

/// The check-text hash of a tokenizer. transformers' `encode` turns off the truncation and padding
/// that a tokenizer.json may carry (e.g. sentence-transformers' 128-token limit), so they are off here.
pub fn hash_ids(tok: &tokenizers::Tokenizer) -> Option<String> {
    use sha2::{Digest, Sha256};
    let mut tok = tok.clone();
    tok.with_truncation(None).ok()?;
    tok.with_padding(None);
    let enc = tok.encode(pre_hashes::CHECK_TEXT, true).ok()?;
    let ids: Vec<String> = enc.get_ids().iter().map(|i| i.to_string()).collect();
    let text = format!("[{}]", ids.join(", "));
    Some(format!("{:x}", Sha256::digest(text.as_bytes())))
}

/// The id-ordered token list and types (`get_vocab_base`), with the vocab padded to the
/// config's `vocab_size` with `[PADn]` unused tokens.
pub fn vocab_base(dir: &Path, cfg: &HfConfig) -> Result<(Vec<String>, Vec<i32>, J), HfError> {
    let tj = read_tokenizer_json(dir)?;
    let path = dir.join("tokenizer.json");
    let mut by_id: HashMap<u64, String> = HashMap::new();
    let vocab = tj
        .pointer("/model/vocab")
        .and_then(J::as_object)
        .ok_or_else(|| HfError::Invalid {
            path: path.clone(),
            problem: "no model.vocab object".into(),
        })?;
    for (tok, id) in vocab {
        if let Some(id) = id.as_u64() {
            by_id.insert(id, tok.clone());
        }
    }
    // added tokens: id → (special, normalized)
    let mut added: HashMap<u64, (bool, bool)> = HashMap::new();
    for t in tj.get("added_tokens").and_then(J::as_array).into_iter().flatten() {
        let (Some(id), Some(content)) = (t.get("id").and_then(J::as_u64), t.get("content").and_then(J::as_str)) else {
            continue;
        };
        by_id.insert(id, content.to_string());
        added.insert(
            id,
            (
                t.get("special").and_then(J::as_bool).unwrap_or(false),
                t.get("normalized").and_then(J::as_bool).unwrap_or(true),
            ),
        );
    }
    let max_id = by_id.keys().copied().max().map_or(0, |m| m + 1);
    let vocab_size = cfg.get("vocab_size").and_then(J::as_u64).unwrap_or(max_id);
    if max_id > vocab_size {
        return Err(HfError::Invalid {
            path,
            problem: format!(
                "tokenizer has token id {} but config.json vocab_size is {vocab_size}",
                max_id - 1
            ),
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
            Some(tok) => match added.get(&i) {
                Some((special, _)) if *special || does_token_look_special(tok) => {
                    types.push(token_type::CONTROL);
                    tokens.push(tok.clone());
                }
                Some(_) => {
                    types.push(token_type::USER_DEFINED);
                    tokens.push(tok.replace('\u{2581}', " "));
                }
                None => {
                    types.push(token_type::NORMAL);
                    tokens.push(tok.clone());
                }
            },
        }
    }
    Ok((tokens, types, tj))
}

/// `_set_vocab_gpt2`: byte-level BPE vocabulary, merges and special tokens.
pub fn set_vocab_gpt2(dir: &Path, cfg: &HfConfig, m: &mut Metadata, notes: &mut VocabNotes) -> Result<(), HfError> {
    let (tokens, types, tj) = vocab_base(dir, cfg)?;
    let model_type = tj
        .pointer("/model/type")
        .and_then(J::as_str)
        .unwrap_or("BPE")
        .to_string();
    let pre = pre_tokenizer(dir, &model_type, notes);
    m.insert("tokenizer.ggml.model", Value::String("gpt2".into()));
    m.insert("tokenizer.ggml.pre", Value::String(pre));
    m.insert(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(tokens.iter().collect())),
    );
    m.insert("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    SpecialVocab::load(dir, true, None, None).write(m);
    Ok(())
}

/// `add_prefix_space` from tokenizer_config.json, written by LlamaModel.set_vocab before the vocab.
pub fn add_space_prefix(dir: &Path) -> Option<bool> {
    let j: J = serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).ok()?).ok()?;
    j.get("add_prefix_space").and_then(J::as_bool)
}
