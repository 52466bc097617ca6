//! hf2q's per-tensor quantization plan equals llama-quantize's (`--dry-run`, llama.cpp b11434) for
//! every model shape and file type in the plan fixtures, with and without an importance matrix.
//! With `HF2Q_FIXTURES` set, every shape of `$HF2Q_FIXTURES/plans` (which must exist); otherwise the
//! committed subset in `tests/data/plans`.

use convert::plan::{plan, ModelFacts, PlanOptions, PlanTensor, Target};
use gguf::GgmlType;
use serde_json::Value as J;
use std::path::PathBuf;

fn plan_files() -> Vec<PathBuf> {
    let dir = match std::env::var_os("HF2Q_FIXTURES") {
        Some(d) => PathBuf::from(d).join("plans"),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/plans"),
    };
    assert!(dir.is_dir(), "plan fixtures missing: {}", dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json") && p.file_name().unwrap() != "verification.json")
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no plan fixtures in {}", dir.display());
    files
}

fn first_u32(v: &J) -> u32 {
    match v {
        J::Array(a) => a[0].as_u64().unwrap() as u32,
        v => v.as_u64().unwrap() as u32,
    }
}

fn facts(d: &J) -> ModelFacts {
    let p = &d["plan_inputs"];
    let arch = p["general.architecture"].as_str().unwrap().to_string();
    let get = |k: &str| p.get(format!("{arch}.{k}"));
    ModelFacts {
        n_layer_all: first_u32(get("block_count").unwrap()),
        n_expert: get("expert_count").map(first_u32).unwrap_or(0),
        n_head: first_u32(get("attention.head_count").unwrap()),
        n_head_kv: get("attention.head_count_kv").map(first_u32).unwrap_or(0),
        arch,
    }
}

#[test]
fn plans_match_llama_quantize() {
    let mut checked = 0;
    for file in plan_files() {
        let d: J = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let shape = d["shape"].as_str().unwrap().to_string();
        let facts = facts(&d);
        let tensors: Vec<PlanTensor> = d["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| PlanTensor {
                name: t["name"].as_str().unwrap().into(),
                shape: t["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap())
                    .collect(),
                ty: GgmlType::from_name(t["source_type"].as_str().unwrap()).unwrap(),
            })
            .collect();
        for (key, has_imatrix) in [("plans", false), ("plans_imatrix", true)] {
            for ftype in d["ftypes"].as_array().unwrap() {
                let ftype = ftype.as_str().unwrap();
                let mut expected = &d[key][ftype];
                if expected.as_str() == Some("same as plans") {
                    expected = &d["plans"][ftype];
                }
                let target = Target::parse(ftype).unwrap_or_else(|| panic!("unknown ftype {ftype}"));
                let opts = PlanOptions {
                    has_imatrix,
                    ..Default::default()
                };
                let got = plan(&facts, &tensors, target, &opts);
                let ctx = format!(
                    "{shape} {ftype} {}",
                    if has_imatrix { "with imatrix" } else { "without imatrix" }
                );
                if let Some(err) = expected.get("error") {
                    assert_eq!(got.map(|_| ()).unwrap_err().0, err.as_str().unwrap(), "{ctx}: error");
                    checked += 1;
                    continue;
                }
                let got = got.unwrap_or_else(|e| panic!("{ctx}: {e}"));
                let mut diffs = Vec::new();
                for e in &got {
                    let want = expected[&e.name]
                        .as_str()
                        .unwrap_or_else(|| panic!("{ctx}: no expectation for {}", e.name));
                    if e.target.name() != want {
                        diffs.push(format!("{}: llama-quantize {want}, hf2q {}", e.name, e.target.name()));
                    }
                }
                assert!(
                    diffs.is_empty(),
                    "{ctx}: {} of {} tensors differ:\n{}",
                    diffs.len(),
                    got.len(),
                    diffs[..diffs.len().min(12)].join("\n")
                );
                if !has_imatrix {
                    let needs = d["needs_imatrix"].as_array().unwrap().iter().any(|x| x == ftype);
                    let missing = convert::plan::missing_imatrix(&got, &opts).is_some();
                    assert_eq!(missing, needs, "{ctx}: needs imatrix");
                    let fallbacks = got.iter().filter(|e| e.fallback).count() as u64;
                    let want_fb = d["fallback_counts"].get(ftype).and_then(|v| v.as_u64()).unwrap_or(0);
                    assert_eq!(fallbacks, want_fb, "{ctx}: fallback count");
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 100, "only {checked} plans checked");
}

#[test]
fn target_names() {
    assert_eq!(Target::parse("q4_k_m").unwrap().name(), "Q4_K_M");
    assert_eq!(Target::parse("Q4_K").unwrap().name(), "Q4_K_M");
    assert_eq!(Target::parse("copy"), Some(Target::Copy));
    assert_eq!(Target::parse("Q7_K"), None);
}
