//! The GGUF tokenizer against llama.cpp and transformers:
//! - SmolLM2-135M-Instruct (gpt2 BPE, pre `smollm`): ids equal `llama-tokenize`'s for the strings
//!   in `data/smollm2_tokens.json` (made by `data/make_smollm2_tokens.py`), with and without
//!   special-token parsing; decoding gives the text back; streaming never splits a character.
//! - the tiny fixture models (`shared/fixtures/tiny`, converted here by hf2q's own `convert`):
//!   ids equal `reference.json`'s `input_ids` (transformers' tokenizer with special tokens).
//!   With `HF2Q_FIXTURES` set, every family in `TINY` from `$HF2Q_FIXTURES/tiny` (which must exist);
//!   otherwise the committed tiny llama (`crates/convert/tests/data/tiny/llama`).
//! - malformed metadata gives errors that name the key, never a panic.

use convert::plan::Target;
use convert::requant::QuantizeOptions;
use engine::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};
use gguf::{Array, GgufFile, Metadata, StrArray, Value};
use serde_json::Value as J;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn smollm2_path() -> PathBuf {
    let dir = std::env::var_os("HF2Q_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/hf2q/models"));
    let p = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-models first",
        p.display()
    );
    p
}

fn smollm2() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let f = GgufFile::open(smollm2_path()).expect("open SmolLM2");
        Tokenizer::from_gguf(f.metadata()).expect("SmolLM2 tokenizer")
    })
}

fn golden() -> J {
    serde_json::from_str(include_str!("data/smollm2_tokens.json")).expect("golden JSON")
}

fn ids(v: &J) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn smollm2_matches_llama_tokenize() {
    let tok = smollm2();
    let g = golden();
    let mut failures = Vec::new();
    let cases = g["cases"].as_array().unwrap();
    assert!(cases.len() >= 40);
    for c in cases {
        let text = c["text"].as_str().unwrap();
        for (key, parse_special) in [("ids", true), ("ids_no_parse_special", false)] {
            let want = ids(&c[key]);
            let got = tok.encode(text, true, parse_special).unwrap();
            if got != want {
                failures.push(format!(
                    "{text:?} parse_special={parse_special}:\n  llama.cpp {want:?}\n  hf2q      {got:?}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_metadata_view() {
    let tok = smollm2();
    assert_eq!(tok.n_vocab(), 49152);
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert!(!tok.add_bos());
    assert_eq!(tok.token_text(1), Some("<|im_start|>"));
    assert_eq!(tok.token_id("<|im_end|>"), Some(2));
    assert_eq!(tok.token_id("no such token"), None);
    assert_eq!(tok.token_text(49152), None);
    // <|im_end|> is eos; <|endoftext|> ends generation by name, as in llama.cpp.
    assert!(tok.is_eog(2));
    assert!(tok.is_eog(0));
    assert!(!tok.is_eog(1));
    assert!(!tok.is_eog(19556));
    // Control tokens render only with `special`.
    assert_eq!(tok.token_bytes(1, true), b"<|im_start|>");
    assert!(tok.token_bytes(1, false).is_empty());
    assert!(tok.token_bytes(99_999, true).is_empty());
    let e = tok.try_token_bytes(99_999, true).unwrap_err().to_string();
    assert!(e.contains("99999") && e.contains("49152"), "{e}");
    // add_special adds nothing for this model (add_bos_token = false).
    assert_eq!(
        tok.encode("Hello world", true, true).unwrap(),
        tok.encode("Hello world", false, true).unwrap()
    );
}

#[test]
fn smollm2_decode_round_trips() {
    let tok = smollm2();
    for c in golden()["cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        let with_special = tok.encode(text, false, true).unwrap();
        assert_eq!(tok.decode(&with_special, true), text, "special=true");
        let plain = tok.encode(text, false, false).unwrap();
        assert_eq!(tok.decode(&plain, false), text, "plain text");
    }
    let chat = tok.encode("<|im_start|>user\nhi<|im_end|>", false, true).unwrap();
    assert_eq!(tok.decode(&chat, false), "user\nhi");
}

#[test]
fn stream_decoder_never_splits_a_character() {
    let tok = smollm2();
    let text = "emoji 😀🎉👍🏽 中文字符 café — ok";
    let ids = tok.encode(text, false, false).unwrap();
    // Some token must hold an incomplete character for the test to mean anything.
    assert!(
        ids.iter()
            .any(|&id| std::str::from_utf8(&tok.token_bytes(id, false)).is_err()),
        "no token splits a character"
    );
    let mut dec = StreamDecoder::new(false);
    let mut out = String::new();
    for &id in &ids {
        let piece = dec.push(tok, id);
        assert!(!piece.contains('\u{FFFD}'), "split character in {piece:?}");
        out.push_str(&piece);
    }
    out.push_str(&dec.finish());
    assert_eq!(out, text);

    // An unfinished character at the end is flushed lossily.
    let mut dec = StreamDecoder::new(false);
    let partial: Vec<u32> = ids
        .iter()
        .copied()
        .take_while(|&id| std::str::from_utf8(&tok.token_bytes(id, false)).is_ok())
        .collect();
    let broken = ids[partial.len()];
    let mut s: String = partial.iter().map(|&id| dec.push(tok, id)).collect();
    s.push_str(&dec.push(tok, broken));
    assert!(!s.contains('\u{FFFD}'));
    assert!(dec.finish().contains('\u{FFFD}'));
}

// ---- tiny fixture models ----

/// Families whose `reference.json` ids are checked. Others in shared/fixtures/tiny share one of
/// these tokenizer shapes (byte-level BPE, SentencePiece, WordPiece).
const TINY: &[&str] = &["llama", "qwen2", "qwen3", "gemma3", "bert"];

fn convert_meta(dir: &Path) -> Metadata {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m.gguf");
    convert::pipeline::convert(dir, &out, Target::parse("f32").unwrap(), &QuantizeOptions::default())
        .unwrap_or_else(|e| panic!("convert {}: {e}", dir.display()));
    GgufFile::open(&out).unwrap().metadata().clone()
}

fn check_tiny(name: &str, dir: &Path, reference: &J) {
    let tok = Tokenizer::from_gguf(&convert_meta(dir)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let prompt = reference["prompt"].as_str().unwrap();
    let add_special = reference["add_special_tokens"].as_bool().unwrap_or(true);
    let want = ids(&reference["input_ids"]);
    let got = tok.encode(prompt, add_special, true).unwrap();
    assert_eq!(got, want, "{name}: ids of {prompt:?}");
}

#[test]
fn tiny_fixtures_match_transformers() {
    match std::env::var_os("HF2Q_FIXTURES") {
        Some(root) => {
            let tiny = PathBuf::from(root).join("tiny");
            assert!(tiny.is_dir(), "tiny fixtures missing: {}", tiny.display());
            for name in TINY {
                let dir = tiny.join(name);
                let reference: J =
                    serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
                check_tiny(name, &dir, &reference);
            }
        }
        None => {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../convert/tests/data/tiny/llama");
            assert!(dir.is_dir(), "committed tiny llama missing: {}", dir.display());
            let mut reference: J = serde_json::from_str(include_str!("data/tiny_llama_reference.json")).unwrap();
            reference["add_special_tokens"] = J::Bool(true);
            check_tiny("llama", &dir, &reference);
        }
    }
}

// ---- hand-made vocabularies ----

fn strs(v: &[&str]) -> Value {
    Value::Array(Array::String(v.iter().collect::<StrArray>()))
}

/// A small SentencePiece vocabulary: scores decide the merges.
fn spm_meta() -> Metadata {
    let mut m = Metadata::new();
    let mut tokens = vec!["<unk>", "<s>", "</s>"];
    let bytes: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
    tokens.extend(bytes.iter().map(String::as_str));
    let words = [
        "▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "llo", "hello", "▁hello", "▁w", "or", "▁wor", "▁world",
        "ld",
    ];
    tokens.extend(words);
    let mut scores = vec![0.0f32; 3 + 256];
    let mut types = vec![2, 3, 3];
    types.extend(std::iter::repeat_n(6, 256));
    for (i, _) in words.iter().enumerate() {
        scores.push(-(i as f32));
        types.push(1);
    }
    m.insert("tokenizer.ggml.model", Value::String("llama".into()));
    m.insert("tokenizer.ggml.tokens", strs(&tokens));
    m.insert("tokenizer.ggml.scores", Value::Array(Array::F32(scores)));
    m.insert("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    m.insert("tokenizer.ggml.bos_token_id", Value::U32(1));
    m.insert("tokenizer.ggml.eos_token_id", Value::U32(2));
    m
}

#[test]
fn spm_merges_by_score_with_byte_fallback() {
    let tok = Tokenizer::from_gguf(&spm_meta()).unwrap();
    let id = |t: &str| tok.token_id(t).unwrap();
    assert!(tok.add_bos());
    let got = tok.encode("hello world", true, true).unwrap();
    assert_eq!(got, vec![1, id("▁hello"), id("▁world")]);
    // "é" is no token: its two UTF-8 bytes become byte tokens; `▁` renders as a space.
    let got = tok.encode("hé", false, false).unwrap();
    assert_eq!(got, vec![id("▁"), id("h"), id("<0xC3>"), id("<0xA9>")]);
    assert_eq!(tok.decode(&got, false), " hé");
    // A control token in the text resets the space prefix, as in llama.cpp.
    let got = tok.encode("hello</s>hello", false, true).unwrap();
    assert_eq!(got, vec![id("▁hello"), 2, id("▁hello")]);
    assert!(tok.is_eog(2));
}

#[test]
fn spm_add_space_prefix_false() {
    let mut m = spm_meta();
    m.insert("tokenizer.ggml.add_space_prefix", Value::Bool(false));
    let tok = Tokenizer::from_gguf(&m).unwrap();
    let id = |t: &str| tok.token_id(t).unwrap();
    assert_eq!(tok.encode("hello", false, false).unwrap(), vec![id("hello")]);
}

fn bpe_meta() -> Metadata {
    let mut m = Metadata::new();
    m.insert("tokenizer.ggml.model", Value::String("gpt2".into()));
    m.insert("tokenizer.ggml.pre", Value::String("gpt-2".into()));
    m.insert("tokenizer.ggml.tokens", strs(&["a", "b", "ab", "Ġ", "Ġab", "<|end|>"]));
    m.insert("tokenizer.ggml.merges", strs(&["a b", "Ġ ab"]));
    m.insert(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vec![1, 1, 1, 1, 1, 3])),
    );
    m
}

#[test]
fn bpe_small_vocabulary() {
    let tok = Tokenizer::from_gguf(&bpe_meta()).unwrap();
    assert_eq!(tok.encode("ab ab", false, true).unwrap(), vec![2, 4]);
    assert_eq!(tok.encode("ab<|end|>", false, true).unwrap(), vec![2, 5]);
    assert_eq!(tok.decode(&[2, 4, 5], true), "ab ab<|end|>");
    assert_eq!(tok.decode(&[2, 4, 5], false), "ab ab");
    assert!(tok.is_eog(5));
}

fn err(m: &Metadata) -> String {
    match Tokenizer::from_gguf(m) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_metadata_is_an_error_naming_the_key() {
    let mut m = bpe_meta();
    m.remove("tokenizer.ggml.tokens");
    assert!(err(&m).contains("tokenizer.ggml.tokens"));

    let mut m = bpe_meta();
    m.remove("tokenizer.ggml.merges");
    assert!(err(&m).contains("tokenizer.ggml.merges"));

    let mut m = bpe_meta();
    m.insert("tokenizer.ggml.merges", Value::Array(Array::U32(vec![1, 2])));
    assert!(err(&m).contains("tokenizer.ggml.merges"));

    let mut m = bpe_meta();
    m.insert("tokenizer.ggml.eos_token_id", Value::U32(6));
    let e = err(&m);
    assert!(e.contains("tokenizer.ggml.eos_token_id") && e.contains('6'), "{e}");

    let mut m = bpe_meta();
    m.insert("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![1, 1])));
    assert!(err(&m).contains("tokenizer.ggml.token_type"));

    let mut m = bpe_meta();
    m.insert("tokenizer.ggml.model", Value::String("rwkv".into()));
    assert!(err(&m).contains("rwkv"));

    let mut m = bpe_meta();
    m.insert("tokenizer.ggml.pre", Value::String("no-such-pre".into()));
    assert!(err(&m).contains("no-such-pre"));

    let mut m = bpe_meta();
    m.insert("tokenizer.ggml.tokens", strs(&["a", "b", "a"]));
    assert!(matches!(
        Tokenizer::from_gguf(&m),
        Err(TokenizerError::DuplicateToken { .. })
    ));

    let mut m = spm_meta();
    m.insert("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.0; 3])));
    assert!(err(&m).contains("tokenizer.ggml.scores"));

    // Malformed merges (no space) are skipped, as llama.cpp never matches them.
    let mut m = bpe_meta();
    m.insert("tokenizer.ggml.merges", strs(&["ab", "", "a b"]));
    let tok = Tokenizer::from_gguf(&m).unwrap();
    assert_eq!(tok.encode("ab", false, false).unwrap(), vec![2]);

    assert!(err(&Metadata::new()).contains("tokenizer.ggml.model"));
}
