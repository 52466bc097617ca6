//! all-MiniLM-L6-v2 (the real model, converted by `hf2q convert` to F32, F16 and Q8_0) against
//! sentence-transformers' embeddings of 60 sentences of mixed length and language
//! (`data/embeddings`, made by `make_reference.py`): cosine ≥ 0.9999 for F32/F16, ≥ 0.999 for Q8_0.
//! Also `hf2q embed` on the command line.

mod common;

use common::minilm_dir;
use engine::backend::cpu::Cpu;
use engine::model::bert::Bert;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

fn hf2q() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hf2q"))
}

fn convert(ty: &str, out: &std::path::Path) {
    let st = hf2q()
        .arg("convert")
        .arg(minilm_dir())
        .args(["--quant", ty, "-o"])
        .arg(out)
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
}

#[test]
fn minilm_matches_sentence_transformers() {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/embeddings");
    let sentences: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(data.join("minilm_sentences.json")).unwrap()).unwrap();
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("minilm_st_reference.json")).unwrap()).unwrap();
    let want: Vec<Vec<f64>> = reference["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
        .collect();
    let n_tokens: Vec<u64> = reference["n_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(sentences.len() >= 50);
    let tmp = tempfile::tempdir().unwrap();
    for (ty, min_cos) in [("f32", 0.9999), ("f16", 0.9999), ("q8_0", 0.999)] {
        let path = tmp.path().join(format!("minilm.{ty}.gguf"));
        convert(ty, &path);
        let gguf = engine::model::open_gguf(&path).unwrap();
        let m = Bert::load(Arc::new(Cpu::new(2).unwrap().with_exact_activations()), &gguf, &path).unwrap();
        let tok = engine::tokenizer::Tokenizer::from_gguf(gguf.metadata()).unwrap();
        let inputs: Vec<Vec<u32>> = sentences.iter().map(|s| tok.encode(s, true, false).unwrap()).collect();
        let lens: Vec<u64> = inputs.iter().map(|i| i.len() as u64).collect();
        assert_eq!(lens, n_tokens, "token counts differ from the HF tokenizer's");
        let got = m.embed(&inputs, None, true).unwrap();
        let mut worst = 1f64;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let cos: f64 = g.iter().zip(w).map(|(a, b)| *a as f64 * b).sum();
            worst = worst.min(cos);
            assert!(cos >= min_cos, "{ty}: sentence {i} {:?}: cosine {cos}", sentences[i]);
        }
        eprintln!(
            "{ty}: lowest cosine to sentence-transformers over {} sentences: {worst:.7}",
            got.len()
        );
    }
}

#[test]
fn embed_command_prints_unit_vectors() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("minilm.f16.gguf");
    convert("f16", &path);
    let out = hf2q()
        .args(["embed", "-m"])
        .arg(&path)
        .args(["--json", "Hello", "The sky is blue."])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Vec<Vec<f64>> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.len(), 2);
    for x in &v {
        assert_eq!(x.len(), 384);
        let n: f64 = x.iter().map(|a| a * a).sum::<f64>().sqrt();
        assert!((n - 1.0).abs() < 1e-5, "{n}");
    }
    // Too long: a clear error naming the limit, or truncation when asked.
    let long = "word ".repeat(600);
    let out = hf2q().args(["embed", "-m"]).arg(&path).arg(&long).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("at most 512"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = hf2q()
        .args(["embed", "-m"])
        .arg(&path)
        .arg("--truncate")
        .arg(&long)
        .output()
        .unwrap();
    assert!(out.status.success());
}

/// The production GEMM path (weights decoded to f32 once, blocked GEMM over the batch) against the
/// scalar reference kept beside it (`HF2Q_KERNEL=scalar`: each weight row dequantized per call,
/// products summed in f64), through `hf2q embed` on the reference sentences, F16 and Q8_0. The two
/// differ only in f32 against f64 summation (~1e-6 relative per product sum), far inside a cosine
/// of 1 − 1e-6.
#[test]
fn gemm_path_agrees_with_the_scalar_reference() {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/embeddings");
    let sentences: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(data.join("minilm_sentences.json")).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("sentences.txt");
    let lines: Vec<String> = sentences.iter().map(|s| s.replace(['\n', '\r'], " ")).collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    for ty in ["f16", "q8_0"] {
        let path = tmp.path().join(format!("minilm.{ty}.gguf"));
        convert(ty, &path);
        let run = |scalar: bool| -> Vec<Vec<f64>> {
            let mut c = hf2q();
            c.args(["embed", "--json", "-t", "2", "-m"])
                .arg(&path)
                .arg("-f")
                .arg(&input);
            if scalar {
                c.env("HF2Q_KERNEL", "scalar");
            }
            let out = c.output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            serde_json::from_slice(&out.stdout).unwrap()
        };
        let (fast, reference) = (run(false), run(true));
        assert_eq!(fast.len(), reference.len());
        let mut worst = 1f64;
        for (i, (a, b)) in fast.iter().zip(&reference).enumerate() {
            let cos: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
            worst = worst.min(cos);
            assert!(
                cos >= 1.0 - 1e-6,
                "{ty}: input {i}: cosine {cos} between the GEMM and scalar paths"
            );
        }
        eprintln!("{ty}: lowest cosine between the GEMM and the scalar reference path: {worst:.9}");
    }
}
