//! Paths and helpers shared by the integration tests that use the real models (fetched by scripts/fetch-models
//! into `$HF2Q_MODELS`, default `~/.cache/hf2q/models`; a missing model fails the test).

#![allow(dead_code)]

pub mod server;

use std::path::PathBuf;

pub fn models_dir() -> PathBuf {
    std::env::var_os("HF2Q_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/hf2q/models"))
}

pub fn smollm2() -> PathBuf {
    let p = models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-models first",
        p.display()
    );
    p
}

pub fn minilm_dir() -> PathBuf {
    let dir = models_dir().join("all-MiniLM-L6-v2");
    assert!(
        dir.join("config.json").is_file(),
        "{} is missing: run scripts/fetch-models first",
        dir.display()
    );
    dir
}

/// Where scripts/fetch-models installs the `openai` Python package (for `PYTHONPATH`).
pub fn pylib() -> PathBuf {
    let dir = models_dir().join("pylib");
    assert!(
        dir.join("openai").is_dir(),
        "{} has no openai package: run scripts/fetch-models first",
        dir.display()
    );
    dir
}

/// A JSON array of number arrays (a reference's logits, one row per position) as f32 rows.
pub fn json_rows(v: &serde_json::Value) -> Vec<Vec<f32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}
