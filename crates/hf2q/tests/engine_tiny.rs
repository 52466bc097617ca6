//! The engine's logits on the compact llama, qwen2 and qwen3 fixtures (`../shared/fixtures/tiny`),
//! converted by hf2q to F32 and F16, against transformers' fp32 logits in `reference.json`.
//!
//! With `HF2Q_FIXTURES` set, all three models come from `$HF2Q_FIXTURES/tiny` (which must exist);
//! otherwise the committed llama copy in `crates/convert/tests/data/tiny` is used.
//!
//! Tolerances: the engine keeps the KV cache in f16 and, for batches under 64 rows, rounds Q to
//! f16 and accumulates softmax·V in an f16 vector, exactly as llama.cpp's CPU flash attention
//! does. Each of those roundings has relative error ≤ 2^-11 ≈ 4.9e-4 on values of order 1, and
//! the fixtures' logits have a standard deviation of ~0.33, so the expected deviation from fp32
//! transformers is ~1e-3 (measured 0.9-1.1e-3; llama.cpp's own log-probs on these fixtures differ
//! from transformers' by up to ~4e-4, `llamacpp_check.json`). F32 is held to 5e-3 absolute. F16
//! weights also round the activations to f16 before every matmul (ggml's `vec_dot_type` of F16),
//! one more 2^-11 rounding per product input (measured 1.0-1.3e-3): 1e-2.

use convert::plan::Target;
use convert::requant::QuantizeOptions;
use engine::backend::cpu::Cpu;
use engine::backend::KvType;
use engine::model::llama::{Llama, Logits, SeqStep};
use std::path::PathBuf;
use std::sync::Arc;

fn tiny_dir() -> (PathBuf, bool) {
    match std::env::var_os("HF2Q_FIXTURES") {
        Some(d) => {
            let d = PathBuf::from(d).join("tiny");
            assert!(d.join("llama").is_dir(), "tiny fixtures missing: {}", d.display());
            (d, true)
        }
        None => (
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../convert/tests/data/tiny"),
            false,
        ),
    }
}

struct Reference {
    ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn reference(dir: &std::path::Path) -> Reference {
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let ids = r["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let logits = r["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    Reference { ids, logits }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn check(model: &str, ftype: &str, tol: f32) {
    let (root, _) = tiny_dir();
    let dir = root.join(model);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join(format!("{model}.{ftype}.gguf"));
    convert::pipeline::convert(&dir, &out, Target::parse(ftype).unwrap(), &QuantizeOptions::default()).unwrap();
    let gguf = engine::model::open_gguf(&out).unwrap();
    let cpu = Arc::new(Cpu::new(2).unwrap());
    let m = Llama::load(cpu, &gguf, &out).unwrap();
    let r = reference(&dir);
    let mut scratch = m.scratch(64);

    // The whole prompt in one step, logits for every position.
    let mut kv = m.new_kv(64, KvType::F16).unwrap();
    let all = m
        .forward(
            &mut scratch,
            &mut [SeqStep {
                kv: &mut kv,
                tokens: &r.ids,
                pos0: 0,
                logits: Logits::All,
            }],
        )
        .unwrap();
    assert_eq!(all.len(), r.ids.len());
    let worst = all
        .iter()
        .zip(&r.logits)
        .map(|(a, b)| max_diff(a, b))
        .fold(0.0, f32::max);
    eprintln!("{model} {ftype}: batched max |Δlogit| = {worst:.2e} (tolerance {tol:.0e})");
    assert!(worst <= tol, "{model} {ftype}: batched logits differ by {worst}");

    // Token by token through the KV cache: the same numbers.
    let mut kv = m.new_kv(64, KvType::F16).unwrap();
    let mut worst = 0f32;
    for (i, t) in r.ids.iter().enumerate() {
        let l = m
            .forward(
                &mut scratch,
                &mut [SeqStep {
                    kv: &mut kv,
                    tokens: &[*t],
                    pos0: i,
                    logits: Logits::Last,
                }],
            )
            .unwrap();
        worst = worst.max(max_diff(&l[0], &r.logits[i]));
    }
    eprintln!("{model} {ftype}: incremental max |Δlogit| = {worst:.2e}");
    assert!(worst <= tol, "{model} {ftype}: incremental logits differ by {worst}");
}

fn run(model: &str) {
    let (root, full) = tiny_dir();
    if !full && !root.join(model).is_dir() {
        // Only llama is committed; the full matrix runs in CI with HF2Q_FIXTURES. Say so past the
        // harness's output capture, so a green fresh-clone run is not taken for the full matrix.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "NOT RUN: engine fixture {model} (only llama is committed; set HF2Q_FIXTURES to the full fixtures)"
        );
        return;
    }
    check(model, "f32", 5e-3);
    check(model, "f16", 1e-2);
}

#[test]
fn llama() {
    run("llama");
}

#[test]
fn qwen2() {
    run("qwen2");
}

#[test]
fn qwen3() {
    run("qwen3");
}
