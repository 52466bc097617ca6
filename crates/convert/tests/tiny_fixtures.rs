//! `hf2q convert` (and `hf2q quantize` from hf2q's own bf16 conversion) against what llama.cpp
//! b11434 wrote for the tiny fixture models (`shared/fixtures/tiny/expected/*.json`): every
//! metadata key (order, type, value; long arrays by SHA-256 of their GGUF encoding), every tensor
//! (order, name, type, shape, offset, size, SHA-256 of its bytes) and the file size.
//!
//! With `HF2Q_FIXTURES` set, the models come from `$HF2Q_FIXTURES/tiny` (which must exist);
//! otherwise from the committed subset in `tests/data/tiny`. Only the families this version
//! converts are listed in `SUPPORTED`; the others are listed in `NOT_YET_SUPPORTED` so the gap is
//! visible here, not skipped silently.

use convert::plan::Target;
use convert::requant::QuantizeOptions;
use gguf::{Array, GgufFile, Value};
use serde_json::Value as J;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

const SUPPORTED: &[&str] = &[
    "llama",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma3",
    "gemma4",
    "gemma4_moe",
    "gemma4_ple",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "deepseek_v4",
    "qwen3_vl",
    "bert",
    "nomic_bert",
];
#[allow(dead_code)]
const NOT_YET_SUPPORTED: &[&str] = &[];

fn tiny_dir() -> PathBuf {
    let dir = match std::env::var_os("HF2Q_FIXTURES") {
        Some(d) => PathBuf::from(d).join("tiny"),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny"),
    };
    assert!(
        dir.join("expected").is_dir(),
        "tiny fixtures missing: {}",
        dir.display()
    );
    dir
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::U8(_) => "UINT8",
        Value::I8(_) => "INT8",
        Value::U16(_) => "UINT16",
        Value::I16(_) => "INT16",
        Value::U32(_) => "UINT32",
        Value::I32(_) => "INT32",
        Value::F32(_) => "FLOAT32",
        Value::Bool(_) => "BOOL",
        Value::String(_) => "STRING",
        Value::Array(_) => "ARRAY",
        Value::U64(_) => "UINT64",
        Value::I64(_) => "INT64",
        Value::F64(_) => "FLOAT64",
    }
}

fn scalar_json(v: &Value) -> J {
    match v {
        Value::F32(x) => J::from(f64::from(*x)),
        Value::F64(x) => J::from(*x),
        Value::String(s) => J::from(s.as_str()),
        Value::Bool(b) => J::from(*b),
        v => J::from(v.as_i128().unwrap() as i64),
    }
}

/// Compare one GGUF with an expected description; returns the differences.
fn diff(path: &Path, expected: &J) -> Vec<String> {
    let f = GgufFile::open(path).unwrap();
    let mut d = Vec::new();
    if expected["file_size"].as_u64() != Some(f.file_size()) {
        d.push(format!(
            "file size: expected {}, got {}",
            expected["file_size"],
            f.file_size()
        ));
    }
    let em = expected["metadata"].as_object().unwrap();
    let ours: Vec<(&str, &Value)> = f.metadata().iter().collect();
    let ek: Vec<&String> = em.keys().collect();
    let ok: Vec<&str> = ours.iter().map(|(k, _)| *k).collect();
    if ek.iter().map(|s| s.as_str()).collect::<Vec<_>>() != ok {
        d.push(format!("metadata keys differ:\n  expected {ek:?}\n  got      {ok:?}"));
    }
    for (k, v) in &ours {
        let Some(e) = em.get(*k) else { continue };
        if e["type"] != type_name(v) {
            d.push(format!("{k}: type {} expected, got {}", e["type"], type_name(v)));
            continue;
        }
        match v {
            Value::Array(a) => {
                if e["length"].as_u64() != Some(a.len() as u64) {
                    d.push(format!("{k}: length {} expected, got {}", e["length"], a.len()));
                } else if let Some(h) = e.get("sha256") {
                    let mut enc = Vec::new();
                    gguf::writer::encode_value(&mut enc, v);
                    let hash = format!("{:x}", Sha256::digest(&enc[12..]));
                    if h.as_str() != Some(hash.as_str()) {
                        let first: Vec<J> = (0..a.len().min(8)).map(|i| scalar_json(&a.get(i).unwrap())).collect();
                        d.push(format!(
                            "{k}: array hash differs (first8 expected {}, got {first:?})",
                            e["first8"]
                        ));
                    }
                } else {
                    let got: Vec<J> = (0..a.len()).map(|i| scalar_json(&a.get(i).unwrap())).collect();
                    if e["value"] != J::Array(got.clone()) {
                        d.push(format!("{k}: expected {}, got {got:?}", e["value"]));
                    }
                }
                let _ = Array::U8(vec![]);
            }
            v => {
                let got = scalar_json(v);
                let same = match v {
                    Value::F32(x) => e["value"].as_f64().map(|y| y as f32) == Some(*x),
                    _ => e["value"] == got,
                };
                if !same {
                    let show = |j: &J| j.to_string().chars().take(120).collect::<String>();
                    d.push(format!("{k}: expected {}, got {}", show(&e["value"]), show(&got)));
                }
            }
        }
    }
    let et = expected["tensors"].as_array().unwrap();
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    let enames: Vec<&str> = et.iter().map(|t| t["name"].as_str().unwrap()).collect();
    if names != enames {
        d.push(format!(
            "tensor order differs:\n  expected {enames:?}\n  got      {names:?}"
        ));
    }
    for (t, e) in f.tensors().iter().zip(et) {
        let ty = t.ty.name().to_uppercase();
        let ne: Vec<u64> = e["ne"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        if e["type"].as_str().map(str::to_uppercase) != Some(ty.clone()) || ne != t.shape {
            d.push(format!(
                "{}: expected {} {:?}, got {} {:?}",
                t.name, e["type"], ne, ty, t.shape
            ));
            continue;
        }
        let hash = format!("{:x}", Sha256::digest(f.tensor_data(t)));
        if e["sha256"].as_str() != Some(hash.as_str()) {
            d.push(format!("{}: data differs ({} {:?})", t.name, ty, t.shape));
        }
        if e["offset"].as_u64() != Some(f.header().data_offset + t.offset) {
            d.push(format!(
                "{}: offset {} expected, got {}",
                t.name,
                e["offset"],
                f.header().data_offset + t.offset
            ));
        }
    }
    d
}

/// The variants of one model: (variant name like `convert.bf16` / `quantize.Q4_K_M`, expected JSON).
fn variants(tiny: &Path, model: &str) -> Vec<(String, J)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(tiny.join("expected")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let Some(rest) = name
            .strip_prefix(&format!("{model}."))
            .and_then(|r| r.strip_suffix(".json"))
        else {
            continue;
        };
        if rest.starts_with("convert.")
            || rest.starts_with("quantize.")
            || rest.starts_with("quantize-allow-requantize.")
        {
            v.push((
                rest.to_string(),
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap(),
            ));
        }
    }
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The `hf2q convert` options a fixture was converted with (`expected/commands.txt`).
fn convert_options(model: &str) -> convert::pipeline::ConvertOptions {
    convert::pipeline::ConvertOptions {
        no_mtp: matches!(model, "qwen3_5_moe" | "qwen3_5_text" | "qwen3_5_moe_text"),
        ..Default::default()
    }
}

fn check_model(model: &str) {
    let copts = convert_options(model);
    let tiny = tiny_dir();
    let dir = tiny.join(model);
    let tmp = tempfile::tempdir().unwrap();
    let vs = variants(&tiny, model);
    assert!(vs.len() >= 4, "{model}: only {} expected variants", vs.len());
    // hf2q's own bf16 conversion, input of `hf2q quantize`.
    let bf16 = tmp.path().join(format!("{model}.bf16.gguf"));
    convert::pipeline::convert_with(
        &dir,
        &bf16,
        Target::parse("bf16").unwrap(),
        &QuantizeOptions::default(),
        &copts,
    )
    .unwrap();
    let mut failures = Vec::new();
    for (variant, expected) in &vs {
        let (kind, ftype) = variant.split_once('.').unwrap();
        // `quantize-allow-requantize.T`: llama-quantize --allow-requantize (DeepSeek-V4, whose bf16
        // conversion has MXFP4 experts). `hf2q convert --quant T` gives the same without a flag.
        let allow_requantize = kind == "quantize-allow-requantize";
        let kind = if allow_requantize { "quantize" } else { kind };
        let target = Target::parse(ftype).unwrap_or_else(|| panic!("{model}: unknown ftype {ftype}"));
        // `hf2q convert --quant f16|bf16|f32|q8_0` mirrors `convert_hf_to_gguf.py --outtype`; the
        // llama-quantize result for those types (`quantize.F16` …) is `hf2q quantize`'s.
        let outtype_ftype = matches!(ftype, "F16" | "BF16" | "F32" | "Q8_0");
        if kind == "convert" || !outtype_ftype {
            let out = tmp.path().join(format!("{model}.{variant}.gguf"));
            let r = convert::pipeline::convert_with(&dir, &out, target, &QuantizeOptions::default(), &copts);
            if let Err(e) = r {
                failures.push(format!("{model} {variant}: convert failed: {e}"));
                continue;
            }
            for d in diff(&out, expected) {
                failures.push(format!("{model} {variant} (hf2q convert): {d}"));
            }
        }
        if kind == "quantize" {
            let q = tmp.path().join(format!("{model}.{variant}.requant.gguf"));
            let qopts = QuantizeOptions {
                allow_requantize,
                ..Default::default()
            };
            if let Err(e) = convert::requant::quantize_file(&bf16, &q, target, &qopts) {
                failures.push(format!("{model} {variant}: hf2q quantize failed: {e}"));
                continue;
            }
            for d in diff(&q, expected) {
                failures.push(format!("{model} {variant} (hf2q quantize from bf16): {d}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures[..failures.len().min(40)].join("\n")
    );
}

#[test]
fn llama() {
    check_model("llama");
}

/// Whether the fixture `model` is here (always with `HF2Q_FIXTURES`). When it is not, one line
/// says so past the test harness's output capture, so a green fresh-clone run is not mistaken for
/// the full matrix.
fn present(model: &str) -> bool {
    if tiny_dir().join(model).is_dir() || std::env::var_os("HF2Q_FIXTURES").is_some() {
        return true;
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "NOT RUN: convert fixture {model} (not in the committed subset; set HF2Q_FIXTURES to the full fixtures)"
    );
    false
}

#[test]
fn qwen2() {
    if present("qwen2") {
        check_model("qwen2");
    }
}

#[test]
fn qwen3() {
    if present("qwen3") {
        check_model("qwen3");
    }
}

fn check_if_present(model: &str) {
    if present(model) {
        check_model(model);
    }
}

fn qwen3_5_fixture(model: &str) {
    check_if_present(model);
}

#[test]
fn gemma3() {
    check_if_present("gemma3");
}

#[test]
fn gemma4() {
    check_if_present("gemma4");
}

#[test]
fn gemma4_moe() {
    check_if_present("gemma4_moe");
}

#[test]
fn gemma4_ple() {
    check_if_present("gemma4_ple");
}

#[test]
fn deepseek_v4() {
    if present("deepseek_v4") {
        check_model("deepseek_v4");
        // Like llama-quantize, `hf2q quantize` refuses the MXFP4 experts without --allow-requantize.
        let tmp = tempfile::tempdir().unwrap();
        let bf16 = tmp.path().join("bf16.gguf");
        let dir = tiny_dir().join("deepseek_v4");
        convert::pipeline::convert(&dir, &bf16, Target::parse("bf16").unwrap(), &QuantizeOptions::default()).unwrap();
        let q = tmp.path().join("q4.gguf");
        let err =
            convert::requant::quantize_file(&bf16, &q, Target::parse("Q4_K_M").unwrap(), &QuantizeOptions::default())
                .unwrap_err();
        assert!(err.to_string().contains("requantizing from type mxfp4"), "{err}");
    }
}

#[test]
fn qwen3_5() {
    qwen3_5_fixture("qwen3_5");
}

#[test]
fn qwen3_5_moe() {
    qwen3_5_fixture("qwen3_5_moe");
}

#[test]
fn qwen3_5_text() {
    qwen3_5_fixture("qwen3_5_text");
}

#[test]
fn qwen3_5_moe_text() {
    qwen3_5_fixture("qwen3_5_moe_text");
}

/// A plain conversion of a Qwen3.5 checkpoint without MTP layers fails, as in llama.cpp
/// (`convert.bf16.without-extra-args`: `assert self.opt_num_mtp_layers != 0`).
#[test]
fn qwen3_5_without_mtp_needs_no_mtp() {
    for model in ["qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"] {
        let dir = tiny_dir().join(model);
        if !dir.is_dir() {
            continue;
        }
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out.gguf");
        let err = convert::pipeline::convert(&dir, &out, Target::parse("bf16").unwrap(), &QuantizeOptions::default())
            .expect_err(model)
            .to_string();
        assert!(err.contains("--no-mtp") && err.contains("MTP"), "{model}: {err}");
    }
    // The MTP fixture with --no-mtp: the `mtp.*` tensors are dropped (and reported), as is the vision tower.
    let dir = tiny_dir().join("qwen3_5");
    if dir.is_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out.gguf");
        let copts = convert::pipeline::ConvertOptions {
            no_mtp: true,
            ..Default::default()
        };
        let s = convert::pipeline::convert_with(
            &dir,
            &out,
            Target::parse("bf16").unwrap(),
            &QuantizeOptions::default(),
            &copts,
        )
        .unwrap();
        assert!(s.tensors.iter().all(|t| !t.name.starts_with("blk.2.")));
        assert_eq!(s.tensors.len(), 27);
        assert!(s.notes.iter().any(|n| n.contains("--no-mtp")), "{:?}", s.notes);
        assert!(s.notes.iter().any(|n| n.contains("vision")), "{:?}", s.notes);
        let f = GgufFile::open(&out).unwrap();
        assert_eq!(f.metadata().get_u64("qwen35.block_count"), Some(2));
        assert!(f.metadata().get("qwen35.nextn_predict_layers").is_none());
    }
}

#[test]
fn qwen3_moe() {
    if present("qwen3_moe") {
        check_model("qwen3_moe");
    }
}

#[test]
fn qwen3_vl() {
    if present("qwen3_vl") {
        check_model("qwen3_vl");
    }
}

#[test]
fn bert() {
    if present("bert") {
        check_model("bert");
    }
}

#[test]
fn nomic_bert() {
    if present("nomic_bert") {
        check_model("nomic_bert");
    }
}

#[test]
fn supported_list_matches_the_architecture_table() {
    // Every supported fixture model's architecture is in the table, and every fixture model is
    // either supported or listed as not yet supported.
    let tiny = tiny_dir();
    for model in SUPPORTED {
        let cfg = tiny.join(model).join("config.json");
        if !cfg.is_file() {
            assert!(std::env::var_os("HF2Q_FIXTURES").is_none(), "{model}: fixture missing");
            let _ = present(model);
            continue;
        }
        let c: J = serde_json::from_str(&std::fs::read_to_string(cfg).unwrap()).unwrap();
        let arch = c["architectures"][0].as_str().unwrap();
        assert!(
            convert::arch::family_for(arch).is_some(),
            "{model}: {arch} not in the architecture table"
        );
    }
    for model in NOT_YET_SUPPORTED {
        assert!(!SUPPORTED.contains(model), "{model} listed twice");
    }
}

/// The metadata llama.cpp's converter takes from a model card's YAML front matter (nested
/// mappings, merged base models as ids, Hub URLs, other URLs and mappings, lists in both styles,
/// the `- no` and tab fixes) and from `generation_config.json`'s sampling defaults: the committed
/// tiny llama with `tests/data/card/{README.md,generation_config.json}` laid over it, against
/// llama.cpp b11434's conversion of the same directory (`tests/data/card/make_expected.sh`).
#[test]
fn model_card_and_sampling_defaults_match_llama_cpp() {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let tmp = tempfile::tempdir().unwrap();
    // The directory name takes part in the naming heuristics: the same as make_expected.sh's.
    let dir = tmp.path().join("card-test");
    std::fs::create_dir(&dir).unwrap();
    for e in std::fs::read_dir(data.join("tiny/llama")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    for f in ["README.md", "generation_config.json"] {
        std::fs::copy(data.join("card").join(f), dir.join(f)).unwrap();
    }
    let out = tmp.path().join("out.gguf");
    convert::pipeline::convert(&dir, &out, Target::parse("bf16").unwrap(), &QuantizeOptions::default()).unwrap();
    let expected: J = serde_json::from_str(&std::fs::read_to_string(data.join("card/expected.json")).unwrap()).unwrap();
    let d = diff(&out, &expected);
    assert!(d.is_empty(), "differences from llama.cpp:\n{}", d.join("\n"));
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&out).unwrap()));
    assert_eq!(
        Some(sha.as_str()),
        expected["file_sha256"].as_str(),
        "whole-file SHA-256"
    );
}

/// The architecture table (`gguf::arch`) describes every file llama.cpp wrote for the fixtures:
/// each `general.architecture` is a row, each tensor one of that row's tensors, each `{arch}.*` key
/// one of the listed keys. (A family the table misses could not be read by name in the engine.)
#[test]
fn the_architecture_table_covers_every_expected_file() {
    let dir = tiny_dir().join("expected");
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".json") || !name.contains(".convert.") {
            continue;
        }
        files += 1;
        let d: J = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let arch_name = d["metadata"]["general.architecture"]["value"].as_str().unwrap();
        let arch =
            gguf::Arch::parse(arch_name).unwrap_or_else(|| panic!("{name}: architecture {arch_name} not in the table"));
        for t in d["tensors"].as_array().unwrap() {
            let tn = t["name"].as_str().unwrap();
            let (kind, _, _) = gguf::Tensor::parse(tn).unwrap_or_else(|| panic!("{name}: tensor {tn} has no kind"));
            assert!(
                arch.tensors().contains(&kind),
                "{name}: {tn} ({kind:?}) is not listed for {arch_name}"
            );
        }
        let prefix = format!("{arch_name}.");
        for k in d["metadata"].as_object().unwrap().keys() {
            if let Some(rest) = k.strip_prefix(&prefix) {
                assert!(gguf::arch::key::ALL.contains(&rest), "{name}: key {k} is not listed");
            }
        }
    }
    assert!(files > 0, "no conversion results in {}", dir.display());
    eprintln!(
        "architecture table checked against {files} expected conversions in {}",
        dir.display()
    );
}
