//! The engine's encoder graphs on the compact `bert` and `nomic_bert` fixtures, converted by hf2q
//! to F32 and F16: last hidden states and mean-pooled, L2-normalised embeddings against
//! transformers' fp32 outputs (`reference.json`).
//!
//! Tolerance: hidden states are LayerNorm outputs of order 1 (std ≈ 1.0); the engine keeps K/V in
//! f16 (relative rounding 2^-11 ≈ 4.9e-4, shrunk by the softmax average) and, for F16 weights,
//! rounds activations to f16 before each product. Measured: 1.8-2.2e-4 for both; held to 2e-3
//! absolute. The pooled unit vectors must agree to cosine ≥ 0.99999 (measured 0.9999999).

use convert::plan::Target;
use convert::requant::QuantizeOptions;
use engine::backend::cpu::Cpu;
use engine::model::bert::Bert;
use std::path::PathBuf;
use std::sync::Arc;

fn dir(model: &str) -> PathBuf {
    match std::env::var_os("HF2Q_FIXTURES") {
        Some(d) => {
            let d = PathBuf::from(d).join("tiny").join(model);
            assert!(d.is_dir(), "fixture missing: {}", d.display());
            d
        }
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/tiny_encoders")
            .join(model),
    }
}

fn check(model: &str, ftype: &str, tol: f32, min_cos: f64) {
    let d = dir(model);
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("reference.json")).unwrap()).unwrap();
    let ids: Vec<u32> = r["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m.gguf");
    convert::pipeline::convert(&d, &out, Target::parse(ftype).unwrap(), &QuantizeOptions::default()).unwrap();
    let gguf = engine::model::open_gguf(&out).unwrap();
    let m = Bert::load(Arc::new(Cpu::new(2).unwrap()), &gguf, &out).unwrap();

    // The tokenizer built from the GGUF gives the reference ids.
    let tok = engine::tokenizer::Tokenizer::from_gguf(gguf.metadata()).unwrap();
    assert_eq!(tok.encode(r["prompt"].as_str().unwrap(), true, false).unwrap(), ids);

    let h = m.hidden_states(std::slice::from_ref(&ids)).unwrap().remove(0);
    let want: Vec<f32> = r["last_hidden_state"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32))
        .collect();
    assert_eq!(h.len(), want.len());
    let worst = h.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    eprintln!("{model} {ftype}: max |Δhidden| = {worst:.2e} (tolerance {tol:.0e})");
    assert!(worst <= tol, "{model} {ftype}: hidden states differ by {worst}");

    // Pooled: the same input alone and batched with two other inputs of other lengths.
    let other1: Vec<u32> = ids[..5].to_vec();
    let other2: Vec<u32> = ids.iter().rev().copied().collect();
    let batch = m.embed(&[other1, ids.clone(), other2], None, true).unwrap();
    let alone = m.embed(std::slice::from_ref(&ids), None, true).unwrap().remove(0);
    assert_eq!(batch[1], alone, "batching changes an input's vector");
    let pooled: Vec<f64> = r["mean_pooled_l2norm"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let cos: f64 = alone.iter().zip(&pooled).map(|(a, b)| *a as f64 * b).sum();
    eprintln!("{model} {ftype}: cosine to transformers {cos:.7}");
    assert!(cos >= min_cos, "{model} {ftype}: cosine {cos}");
}

#[test]
fn bert() {
    check("bert", "f32", 2e-3, 0.99999);
    check("bert", "f16", 2e-3, 0.99999);
}

#[test]
fn nomic_bert() {
    check("nomic_bert", "f32", 2e-3, 0.99999);
    check("nomic_bert", "f16", 2e-3, 0.99999);
}
