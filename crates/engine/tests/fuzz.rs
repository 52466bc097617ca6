//! Fuzzing the tokenizers (proptest, seeded, a few seconds): random bytes (made into text the way a
//! server receives it, lossy UTF-8, control characters and special-token look-alikes included) are
//! encoded with and without special-token parsing, and random ids decoded and stream-decoded, by
//! SmolLM2's byte-level BPE and by all-MiniLM-L6-v2's WordPiece (converted here; both models come
//! from scripts/fetch-models).
//! No panic; every id in range; decoding never fails.

use engine::tokenizer::{StreamDecoder, Tokenizer};
use gguf::GgufFile;
use proptest::prelude::*;
use std::path::PathBuf;
use std::sync::OnceLock;

fn models() -> PathBuf {
    std::env::var_os("HF2Q_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/hf2q/models"))
}

fn smollm2() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let p = models().join("SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(
            p.is_file(),
            "{} is missing: run scripts/fetch-models first",
            p.display()
        );
        Tokenizer::from_gguf(GgufFile::open(&p).unwrap().metadata()).unwrap()
    })
}

fn wordpiece() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let dir = models().join("all-MiniLM-L6-v2");
        assert!(
            dir.join("config.json").is_file(),
            "{} is missing: run scripts/fetch-models first",
            dir.display()
        );
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("bert.gguf");
        convert::pipeline::convert(
            &dir,
            &out,
            convert::plan::Target::parse("f32").unwrap(),
            &convert::requant::QuantizeOptions::default(),
        )
        .unwrap();
        Tokenizer::from_gguf(GgufFile::open(&out).unwrap().metadata()).unwrap()
    })
}

/// Text a client could send: arbitrary bytes as lossy UTF-8, pieces of special tokens, odd
/// whitespace and combining marks.
fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..24).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        Just("<|im_start|>".to_string()),
        Just("<|im_end".to_string()),
        Just("[CLS]".to_string()),
        Just("[UNK]##".to_string()),
        Just("\u{0301}\u{200d}\u{feff}".to_string()),
        Just(" \t\r\n\u{a0}".to_string()),
        "\\PC{0,16}",
    ];
    prop::collection::vec(piece, 0..8).prop_map(|v| v.concat())
}

fn check(tok: &Tokenizer, s: &str, ids: &[u32]) -> Result<(), TestCaseError> {
    for special in [false, true] {
        if let Ok(got) = tok.encode(s, special, special) {
            prop_assert!(
                got.iter().all(|&t| (t as usize) < tok.n_vocab()),
                "id out of range for {:?}",
                s
            );
            let _ = tok.decode(&got, special);
        }
    }
    let n = tok.n_vocab() as u32;
    let ids: Vec<u32> = ids.iter().map(|&i| i % n).collect();
    let _ = tok.decode(&ids, true);
    let _ = tok.decode(&ids, false);
    let mut sd = StreamDecoder::new(true);
    for &i in &ids {
        let _ = sd.push(tok, i);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn bpe_tokenizer_never_panics(s in text(), ids in prop::collection::vec(any::<u32>(), 0..16)) {
        check(smollm2(), &s, &ids)?;
    }

    #[test]
    fn wordpiece_tokenizer_never_panics(s in text(), ids in prop::collection::vec(any::<u32>(), 0..16)) {
        check(wordpiece(), &s, &ids)?;
    }
}
