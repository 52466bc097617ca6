//! `hf2q convert` end to end: a real model converts, `--report` records what it should, and bad
//! input (missing config, unknown architecture, missing or truncated shard, a tensor that does not
//! match the config, an unsupported dtype, an unwritable output path) exits 3 with a one-line
//! message and leaves no output file.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn llama_fixture() -> PathBuf {
    let base = match std::env::var_os("HF2Q_FIXTURES") {
        Some(d) => PathBuf::from(d).join("tiny"),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../convert/tests/data/tiny"),
    };
    let p = base.join("llama");
    assert!(p.join("config.json").is_file(), "{} missing", p.display());
    p
}

fn hf2q(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hf2q"))
        .args(args)
        .output()
        .expect("run hf2q")
}

/// A writable copy of the llama fixture.
fn copy_fixture(dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(llama_fixture()).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
        }
    }
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut j);
    std::fs::write(p, serde_json::to_string_pretty(&j).unwrap()).unwrap();
}

#[test]
fn converts_with_report() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("llama.q4km.gguf");
    let report = tmp.path().join("report.json");
    let o = hf2q(&[
        "convert",
        llama_fixture().to_str().unwrap(),
        "--quant",
        "q4_k_m",
        "-o",
        out.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["architecture"]["gguf"], "llama");
    assert_eq!(r["target"], "Q4_K_M");
    let files = r["input"]["files"].as_array().unwrap();
    let st = files
        .iter()
        .find(|f| f["path"] == "model.safetensors")
        .expect("safetensors hashed");
    assert_eq!(st["sha256"].as_str().unwrap().len(), 64);
    let tensors = r["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 12);
    let q = tensors.iter().find(|t| t["name"] == "blk.0.attn_q.weight").unwrap();
    assert_eq!(q["type"], "q4_K");
    let e = q["rmse"].as_f64().unwrap();
    assert!(e > 0.0 && e < 0.01, "q4_K rmse {e} of N(0,0.02) weights");
    assert!(r["peak_rss_bytes"].as_u64().unwrap() > 0);
    assert!(r["timings"]["convert_s"].as_f64().unwrap() > 0.0);
    // The written file is readable and says what it is.
    let info = hf2q(&["info", out.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&info.stdout).contains("Q4_K_M"));
}

#[test]
fn bad_input_exits_3_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let out = t.join("out.gguf");

    let no_config = t.join("no_config");
    copy_fixture(&no_config);
    std::fs::remove_file(no_config.join("config.json")).unwrap();

    let unknown_arch = t.join("unknown_arch");
    copy_fixture(&unknown_arch);
    edit_config(&unknown_arch, |j| {
        j["architectures"] = serde_json::json!(["FrobnicatorForCausalLM"])
    });

    let missing_shard = t.join("missing_shard");
    copy_fixture(&missing_shard);
    std::fs::rename(
        missing_shard.join("model.safetensors"),
        missing_shard.join("model-00001-of-00002.safetensors"),
    )
    .unwrap();
    std::fs::write(
        missing_shard.join("model.safetensors.index.json"),
        r#"{"metadata": {}, "weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();

    let truncated = t.join("truncated");
    copy_fixture(&truncated);
    let st = truncated.join("model.safetensors");
    let len = std::fs::metadata(&st).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&st)
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    let wrong_shape = t.join("wrong_shape");
    copy_fixture(&wrong_shape);
    edit_config(&wrong_shape, |j| j["hidden_size"] = serde_json::json!(512));

    // An I16 tensor (same width as BF16): rewrite one dtype in the safetensors header in place.
    let bad_dtype = t.join("bad_dtype");
    copy_fixture(&bad_dtype);
    let st = bad_dtype.join("model.safetensors");
    let mut bytes = std::fs::read(&st).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let key = "\"model.norm.weight\":{\"dtype\":\"BF16\"";
    let at = header.find(key).expect("header layout");
    let patched = header.replacen(key, "\"model.norm.weight\":{\"dtype\":\"I16\" ", 1);
    assert_eq!(patched.len(), header.len(), "{at}");
    bytes[8..8 + n].copy_from_slice(patched.as_bytes());
    std::fs::write(&st, bytes).unwrap();

    let s = |p: &Path| p.to_str().unwrap().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![s(&t.join("nope")), "-o".into(), s(&out)], "not a directory"),
        (vec![s(&no_config), "-o".into(), s(&out)], "no config.json"),
        (
            vec![s(&unknown_arch), "-o".into(), s(&out)],
            "unsupported architecture `FrobnicatorForCausalLM`",
        ),
        (
            vec![s(&missing_shard), "-o".into(), s(&out)],
            "model-00002-of-00002.safetensors",
        ),
        (vec![s(&truncated), "-o".into(), s(&out)], "truncated"),
        (vec![s(&wrong_shape), "-o".into(), s(&out)], "hidden_size 512"),
        (vec![s(&bad_dtype), "-o".into(), s(&out)], "dtype I16"),
        (
            vec![s(&llama_fixture()), "-o".into(), s(&t.join("no/such/dir/out.gguf"))],
            "no/such/dir",
        ),
        (
            vec![
                s(&llama_fixture()),
                "--quant".into(),
                "q9_k".into(),
                "-o".into(),
                s(&out),
            ],
            "unknown --quant `q9_k`",
        ),
        (vec![s(&llama_fixture())], "-o OUT.gguf"),
    ];
    for (args, needle) in cases {
        let mut full = vec!["convert".to_string()];
        full.extend(args.clone());
        let refs: Vec<&str> = full.iter().map(|s| s.as_str()).collect();
        let r = hf2q(&refs);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(3), "{args:?} should exit 3: {err}");
        assert!(err.contains(needle), "{args:?}: expected `{needle}` in: {err}");
        assert_eq!(
            err.trim_end().lines().filter(|l| l.starts_with("error:")).count(),
            1,
            "{err}"
        );
        assert!(!out.exists(), "{args:?} left an output file");
    }
    // No temporary files left behind in the output directory.
    let stray: Vec<_> = std::fs::read_dir(t)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

/// The real all-MiniLM-L6-v2 converted to F16 is byte-identical to what llama.cpp's converter wrote
/// for it (`data/minilm_f16_llama_cpp.json`: the file's SHA-256, plus per-tensor and per-key
/// expectations that say where a difference is), model-card metadata from README.md included.
/// Regression: the pre-tokenizer hash is listed twice in llama.cpp's table; the last entry
/// (`jina-v2-en`) wins, as in the Python `if` chain.
#[test]
fn real_minilm_matches_llama_cpp_conversion() {
    use gguf::{GgufFile, Value};
    use sha2::{Digest, Sha256};
    let models = std::env::var_os("HF2Q_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/hf2q/models"));
    let dir = models.join("all-MiniLM-L6-v2");
    assert!(dir.is_dir(), "{} missing: run scripts/fetch-models", dir.display());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("minilm.f16.gguf");
    let o = hf2q(&[
        "convert",
        dir.to_str().unwrap(),
        "--quant",
        "f16",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let expected: serde_json::Value = serde_json::from_str(include_str!("data/minilm_f16_llama_cpp.json")).unwrap();
    let f = GgufFile::open(&out).unwrap();
    let et = expected["tensors"].as_array().unwrap();
    assert_eq!(et.len(), f.tensors().len());
    for (t, e) in f.tensors().iter().zip(et) {
        assert_eq!(e[0], t.name.as_str());
        assert!(e[1].as_str().unwrap().eq_ignore_ascii_case(t.ty.name()), "{}", t.name);
        assert_eq!(e[2], serde_json::json!(t.shape), "{}", t.name);
        assert_eq!(
            e[3].as_str().unwrap(),
            format!("{:x}", Sha256::digest(f.tensor_data(t))),
            "{} bytes",
            t.name
        );
    }
    let json_of = |v: &Value| -> serde_json::Value {
        match v {
            Value::Array(a) => serde_json::Value::Array((0..a.len()).map(|i| scalar(&a.get(i).unwrap())).collect()),
            v => scalar(v),
        }
    };
    for (k, e) in expected["metadata_except_model_card"].as_object().unwrap() {
        let v = f.metadata().get(k).unwrap_or_else(|| panic!("missing key {k}"));
        let got = json_of(v);
        match e.get("length") {
            Some(len) => {
                let a = got.as_array().unwrap();
                assert_eq!(len.as_u64(), Some(a.len() as u64), "{k} length");
                assert_eq!(
                    &serde_json::Value::Array(a[..64].to_vec()),
                    &e["first64"],
                    "{k} first 64"
                );
            }
            None => assert!(same(e, &got), "{k}: llama.cpp {e}, hf2q {got}"),
        }
    }
    assert_eq!(f.metadata().get_str("tokenizer.ggml.pre"), Some("jina-v2-en"));
    assert_eq!(f.metadata().get_str("general.license"), Some("apache-2.0"));
    let file = std::fs::read(&out).unwrap();
    assert_eq!(
        format!("{:x}", Sha256::digest(&file)),
        expected["file_sha256"].as_str().unwrap(),
        "whole file"
    );
}

fn scalar(v: &gguf::Value) -> serde_json::Value {
    use gguf::Value;
    match v {
        Value::F32(x) => serde_json::json!(f64::from(*x)),
        Value::F64(x) => serde_json::json!(x),
        Value::String(s) => serde_json::json!(s),
        Value::Bool(b) => serde_json::json!(b),
        v => serde_json::json!(v.as_i128().unwrap() as i64),
    }
}

/// JSON equality with f32 values compared after rounding to f32.
fn same(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    match (a, b) {
        (serde_json::Value::Number(x), serde_json::Value::Number(y)) => {
            x.as_f64().map(|v| v as f32) == y.as_f64().map(|v| v as f32)
        }
        _ => a == b,
    }
}

/// `convert --quant Q4_K_M` of an F32 checkpoint (all-MiniLM-L6-v2) quantizes the exact f32
/// weights: byte for byte what `convert --quant f32` then `quantize … Q4_K_M` writes (which equals
/// `convert_hf_to_gguf.py --outtype f32` + `llama-quantize`), not a bf16-rounded copy.
#[test]
fn quantized_convert_of_an_f32_checkpoint_quantizes_exact_weights() {
    let dir = common::minilm_dir();
    let tmp = tempfile::tempdir().unwrap();
    let p = |n: &str| tmp.path().join(n).to_str().unwrap().to_string();
    let d = dir.to_str().unwrap();
    assert!(hf2q(&["convert", d, "-o", &p("direct.gguf"), "--quant", "Q4_K_M"])
        .status
        .success());
    assert!(hf2q(&["convert", d, "-o", &p("f32.gguf"), "--quant", "f32"])
        .status
        .success());
    assert!(hf2q(&["quantize", &p("f32.gguf"), &p("two_steps.gguf"), "Q4_K_M"])
        .status
        .success());
    let a = std::fs::read(p("direct.gguf")).unwrap();
    let b = std::fs::read(p("two_steps.gguf")).unwrap();
    assert!(a == b, "convert --quant Q4_K_M differs from f32 + quantize");
}
