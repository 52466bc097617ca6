//! SentencePiece vocabularies: `tokenizer.model` (a protobuf `ModelProto`, parsed here from the
//! wire format) as `TextModel._create_vocab_sentencepiece` / `_set_vocab_sentencepiece` read it
//! (llama.cpp `conversion/base.py`), and the SentencePiece-style BPE `tokenizer.json` that gguf-py's
//! `LlamaHfVocab` reads (`gguf-py/gguf/vocab.py`).

use super::special::SpecialVocab;
use super::{does_token_look_special, token_type};
use crate::hf::{HfConfig, HfError};
use gguf::{Array, Metadata, Value};
use serde_json::Value as J;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// sentencepiece `ModelProto.SentencePiece.Type` (same numbering as gguf-py `TokenType`).
pub mod piece_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

#[derive(Debug, Clone, PartialEq)]
pub struct SpmPiece {
    pub piece: String,
    pub score: f32,
    /// [`piece_type`]; NORMAL when the field is absent.
    pub kind: i32,
}

/// The parts of a `ModelProto` the converter (and a reader of the result) cares about.
#[derive(Debug, Clone)]
pub struct SpmModel {
    pub pieces: Vec<SpmPiece>,
    /// `TrainerSpec.model_type` (1 UNIGRAM, 2 BPE, 3 WORD, 4 CHAR); UNIGRAM when absent.
    pub model_type: i32,
    /// `TrainerSpec.byte_fallback`.
    pub byte_fallback: bool,
    /// `NormalizerSpec.add_dummy_prefix` (default true).
    pub add_dummy_prefix: bool,
    /// `NormalizerSpec.remove_extra_whitespaces` (default true).
    pub remove_extra_whitespaces: bool,
}

/// A minimal protobuf wire-format reader.
struct Wire<'a> {
    buf: &'a [u8],
    pos: usize,
}

enum Field<'a> {
    Varint(u64),
    Fixed32(u32),
    Fixed64,
    Bytes(&'a [u8]),
}

impl<'a> Wire<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Wire { buf, pos: 0 }
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or("truncated field")?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// The next (field number, value), or `None` at the end.
    fn next(&mut self) -> Result<Option<(u64, Field<'a>)>, String> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let (num, wt) = (key >> 3, key & 7);
        let f = match wt {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Field::Fixed64
            }
            2 => {
                let n = self.varint()? as usize;
                Field::Bytes(self.take(n)?)
            }
            5 => Field::Fixed32(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes"))),
            other => return Err(format!("unsupported wire type {other} (field {num})")),
        };
        Ok(Some((num, f)))
    }
}

fn parse_piece(buf: &[u8]) -> Result<SpmPiece, String> {
    let mut p = SpmPiece {
        piece: String::new(),
        score: 0.0,
        kind: piece_type::NORMAL,
    };
    let mut w = Wire::new(buf);
    while let Some((num, f)) = w.next()? {
        match (num, f) {
            (1, Field::Bytes(b)) => {
                p.piece = String::from_utf8(b.to_vec()).map_err(|_| "piece is not valid UTF-8".to_string())?
            }
            (2, Field::Fixed32(bits)) => p.score = f32::from_bits(bits),
            (3, Field::Varint(v)) => p.kind = v as i32,
            _ => {}
        }
    }
    Ok(p)
}

/// Parse a serialized `sentencepiece.ModelProto`.
pub fn parse_model(buf: &[u8]) -> Result<SpmModel, String> {
    let mut m = SpmModel {
        pieces: Vec::new(),
        model_type: 1,
        byte_fallback: false,
        add_dummy_prefix: true,
        remove_extra_whitespaces: true,
    };
    let mut w = Wire::new(buf);
    while let Some((num, f)) = w.next()? {
        match (num, f) {
            (1, Field::Bytes(b)) => m
                .pieces
                .push(parse_piece(b).map_err(|e| format!("piece {}: {e}", m.pieces.len()))?),
            (2, Field::Bytes(b)) => {
                // TrainerSpec: model_type = 3, byte_fallback = 35
                let mut t = Wire::new(b);
                while let Some((n, f)) = t.next()? {
                    match (n, f) {
                        (3, Field::Varint(v)) => m.model_type = v as i32,
                        (35, Field::Varint(v)) => m.byte_fallback = v != 0,
                        _ => {}
                    }
                }
            }
            (3, Field::Bytes(b)) => {
                // NormalizerSpec: add_dummy_prefix = 3, remove_extra_whitespaces = 4
                let mut t = Wire::new(b);
                while let Some((n, f)) = t.next()? {
                    match (n, f) {
                        (3, Field::Varint(v)) => m.add_dummy_prefix = v != 0,
                        (4, Field::Varint(v)) => m.remove_extra_whitespaces = v != 0,
                        _ => {}
                    }
                }
            }
            (1..=3, _) => return Err(format!("field {num} of ModelProto has the wrong wire type")),
            _ => {}
        }
    }
    if m.pieces.is_empty() {
        return Err("no pieces".into());
    }
    Ok(m)
}

/// Read and parse `dir/tokenizer.model`.
pub fn load(dir: &Path) -> Result<SpmModel, HfError> {
    let path = dir.join("tokenizer.model");
    let buf = std::fs::read(&path).map_err(|source| HfError::Io {
        path: path.clone(),
        source,
    })?;
    parse_model(&buf).map_err(|e| HfError::Invalid {
        path,
        problem: format!("not a SentencePiece model: {e}"),
    })
}

fn read_json(path: &Path) -> Result<Option<J>, HfError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| HfError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map(Some).map_err(|e| HfError::Invalid {
        path: path.to_path_buf(),
        problem: format!("malformed JSON: {e}"),
    })
}

/// Parallel token lists, in id order.
#[derive(Debug, Clone, Default)]
pub struct TokenList {
    pub tokens: Vec<String>,
    pub scores: Vec<f32>,
    /// gguf-py `TokenType`.
    pub types: Vec<i32>,
}

/// `_create_vocab_sentencepiece`: tokens, scores and token types, padded to the config's vocab size.
pub fn create_vocab_sentencepiece(dir: &Path, cfg: &HfConfig) -> Result<TokenList, HfError> {
    let spm = load(dir)?;
    let vocab_size = cfg
        .find_u64(&["vocab_size_per_layer_input", "vocab_size"])
        .filter(|&v| v > 0)
        .map_or(spm.pieces.len(), |v| v as usize);
    let mut tokens: Vec<String> = (0..vocab_size).map(|i| format!("[PAD{i}]")).collect();
    let mut scores = vec![-10000.0f32; vocab_size];
    let mut types = vec![token_type::UNUSED; vocab_size];
    for (id, p) in spm.pieces.iter().enumerate().take(vocab_size) {
        // SentencePieceProcessor.IsUnknown / IsControl / IsUnused / IsByte, else NORMAL
        types[id] = match p.kind {
            piece_type::UNKNOWN | piece_type::CONTROL | piece_type::UNUSED | piece_type::BYTE => p.kind,
            _ => piece_type::NORMAL,
        };
        tokens[id] = p.piece.clone();
        scores[id] = p.score;
    }
    if let Some(J::Object(added)) = read_json(&dir.join("added_tokens.json"))? {
        for (key, id) in added {
            let Some(id) = id.as_u64().map(|i| i as usize).filter(|&i| i < vocab_size) else {
                continue;
            };
            tokens[id] = key;
            scores[id] = -1000.0;
            types[id] = token_type::USER_DEFINED;
        }
    }
    if let Some(tc) = read_json(&dir.join("tokenizer_config.json"))? {
        if let Some(J::Object(dec)) = tc.get("added_tokens_decoder") {
            for (id, data) in dec {
                let Some(id) = id.parse::<usize>().ok().filter(|&i| i < vocab_size) else {
                    continue;
                };
                let Some(mut token) = data.get("content").and_then(J::as_str).map(String::from) else {
                    continue;
                };
                if data.get("special").and_then(J::as_bool).unwrap_or(false) || does_token_look_special(&token) {
                    types[id] = token_type::CONTROL;
                } else {
                    token = token.replace('\u{2581}', " ");
                    types[id] = token_type::USER_DEFINED;
                }
                scores[id] = -1000.0;
                tokens[id] = token;
            }
        }
    }
    Ok(TokenList { tokens, scores, types })
}

/// `_set_vocab_sentencepiece`: tokenizer model `llama`, pre `default`, tokens, scores, types and
/// the special vocabulary (no merges).
pub fn set_vocab_sentencepiece(dir: &Path, cfg: &HfConfig, m: &mut Metadata) -> Result<(), HfError> {
    let TokenList { tokens, scores, types } = create_vocab_sentencepiece(dir, cfg)?;
    m.insert("tokenizer.ggml.model", Value::String("llama".into()));
    m.insert("tokenizer.ggml.pre", Value::String("default".into()));
    let n = tokens.len();
    m.insert(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(tokens.iter().collect())),
    );
    m.insert("tokenizer.ggml.scores", Value::Array(Array::F32(scores)));
    m.insert("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    SpecialVocab::load(dir, false, None, Some(n)).write(m);
    Ok(())
}

fn special_content(v: &J) -> Option<String> {
    match v {
        J::String(s) => Some(s.clone()),
        J::Object(o) => o.get("content").and_then(J::as_str).map(String::from),
        _ => None,
    }
}

/// gguf-py `LlamaHfVocab.all_tokens()`: the base vocabulary of a SentencePiece-style BPE
/// `tokenizer.json` (byte fallback, `Sequence` decoder) in id order, then the added tokens above
/// it; every score is -1000. Token types: `<0xNN>` BYTE, the tokenizer's special tokens CONTROL,
/// others NORMAL (added non-special tokens USER_DEFINED).
pub fn llama_hf_vocab(dir: &Path) -> Result<Vec<(String, f32, i32)>, HfError> {
    let path = dir.join("tokenizer.json");
    let invalid = |problem: String| HfError::Invalid {
        path: path.clone(),
        problem,
    };
    let tj = read_json(&path)?.ok_or_else(|| HfError::Io {
        path: path.clone(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer.json not found"),
    })?;
    let model = tj.get("model").ok_or_else(|| invalid("no `model` object".into()))?;
    let is_bpe = model.get("type").and_then(J::as_str) == Some("BPE");
    let flag = |k: &str, d: bool| model.get(k).and_then(J::as_bool).unwrap_or(d);
    if is_bpe && flag("ignore_merges", false) && !flag("byte_fallback", true) {
        return Err(invalid(
            "a Llama 3 style BPE tokenizer cannot be read as a SentencePiece-style vocabulary".into(),
        ));
    }
    if !is_bpe || !flag("byte_fallback", false) || tj.pointer("/decoder/type").and_then(J::as_str) != Some("Sequence") {
        return Err(invalid(
            "expected a SentencePiece-style BPE tokenizer (BPE model with byte_fallback and a Sequence decoder)".into(),
        ));
    }
    let base = model
        .get("vocab")
        .and_then(J::as_object)
        .ok_or_else(|| invalid("no model.vocab object".into()))?;
    // get_vocab(): the model vocabulary plus the added tokens
    let mut vocab: HashMap<String, u64> = HashMap::new();
    for (tok, id) in base {
        let id = id
            .as_u64()
            .ok_or_else(|| invalid(format!("vocab entry `{tok}` has no integer id")))?;
        vocab.insert(tok.clone(), id);
    }
    let vocab_size_base = vocab.len() as u64;
    let mut added: Vec<(String, u64)> = Vec::new();
    for t in tj.get("added_tokens").and_then(J::as_array).into_iter().flatten() {
        if let (Some(c), Some(id)) = (t.get("content").and_then(J::as_str), t.get("id").and_then(J::as_u64)) {
            vocab.insert(c.to_string(), id);
            added.push((c.to_string(), id));
        }
    }
    added.sort_by_key(|(_, id)| *id);
    let added_above: Vec<(String, u64)> = added.into_iter().filter(|(_, id)| *id >= vocab_size_base).collect();
    // all_special_tokens: the named special tokens and the extra special tokens of tokenizer_config.json
    let mut special_ids: HashSet<u64> = HashSet::new();
    let mut specials: HashMap<String, u64> = HashMap::new();
    if let Some(tc) = read_json(&dir.join("tokenizer_config.json"))? {
        let mut names: Vec<String> = ["bos", "eos", "unk", "sep", "pad", "cls", "mask"]
            .iter()
            .filter_map(|t| tc.get(format!("{t}_token")).and_then(special_content))
            .collect();
        for key in ["additional_special_tokens", "extra_special_tokens"] {
            if let Some(J::Array(a)) = tc.get(key) {
                names.extend(a.iter().filter_map(special_content));
            }
        }
        for n in names {
            let id = *vocab.get(&n).ok_or_else(|| {
                invalid(format!(
                    "special token `{n}` of tokenizer_config.json is not in the vocabulary"
                ))
            })?;
            special_ids.insert(id);
            specials.insert(n, id);
        }
    }
    let reverse: HashMap<u64, &String> = vocab.iter().map(|(t, id)| (*id, t)).collect();
    let is_byte = |t: &str| {
        let b = t.as_bytes();
        b.len() == 6 && t.starts_with("<0x") && t.ends_with('>') && b[3].is_ascii_hexdigit() && b[4].is_ascii_hexdigit()
    };
    let kind = |id: u64, text: &str| {
        if is_byte(text) {
            token_type::BYTE
        } else if special_ids.contains(&id) {
            token_type::CONTROL
        } else {
            token_type::NORMAL
        }
    };
    let mut out = Vec::with_capacity(vocab_size_base as usize + added_above.len());
    for id in 0..vocab_size_base {
        let tok = reverse
            .get(&id)
            .ok_or_else(|| invalid(format!("no token has id {id} (ids must be contiguous)")))?;
        out.push(((*tok).clone(), -1000.0, kind(id, tok)));
    }
    for (text, _) in added_above {
        let ty = match specials.get(&text) {
            Some(&id) => kind(id, ""),
            None => token_type::USER_DEFINED,
        };
        out.push((text, -1000.0, ty));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u64, wt: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![((num << 3) | wt) as u8];
        if wt == 2 {
            v.push(payload.len() as u8);
        }
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn parses_pieces_and_specs() {
        let mut piece = field(1, 2, b"<unk>");
        piece.extend(field(2, 5, &(-1.5f32).to_le_bytes()));
        piece.extend(field(3, 0, &[2]));
        let mut model = field(1, 2, &piece);
        model.extend(field(1, 2, &field(1, 2, "\u{2581}a".as_bytes())));
        // trainer_spec: model_type BPE (2), byte_fallback (35 → two-byte key)
        let trainer = [vec![0x18, 2], vec![0x98, 0x02, 1]].concat();
        model.extend(field(2, 2, &trainer));
        model.extend(field(3, 2, &[0x18, 0]));
        let m = parse_model(&model).unwrap();
        assert_eq!(m.pieces.len(), 2);
        assert_eq!(
            m.pieces[0],
            SpmPiece {
                piece: "<unk>".into(),
                score: -1.5,
                kind: piece_type::UNKNOWN
            }
        );
        assert_eq!(m.pieces[1].kind, piece_type::NORMAL);
        assert_eq!(m.pieces[1].score, 0.0);
        assert_eq!(m.model_type, 2);
        assert!(m.byte_fallback);
        assert!(!m.add_dummy_prefix);
        assert!(parse_model(&model[..model.len() - 1]).is_err());
    }
}
