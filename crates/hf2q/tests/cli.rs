//! The `hf2q` binary end to end: `info` against the `gguf` PyPI package's reading of the real
//! SmolLM2 GGUF, `gguf-patch` changing exactly what was asked, `doctor`, `completions`, and a
//! table of bad inputs that must each exit with code 3 and a one-line message.

use gguf::{GgufFile, Value};
use serde_json::Value as J;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn smollm2() -> PathBuf {
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

fn minilm_dir() -> PathBuf {
    let p = smollm2().with_file_name("all-MiniLM-L6-v2");
    assert!(p.is_dir(), "{} is missing: run scripts/fetch-models first", p.display());
    p
}

fn hf2q(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hf2q"))
        .args(args)
        .output()
        .expect("run hf2q")
}

fn ok(args: &[&str]) -> String {
    let o = hf2q(args);
    assert!(
        o.status.success(),
        "hf2q {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn info_text_summarises_smollm2() {
    let out = ok(&["info", smollm2().to_str().unwrap()]);
    for needle in [
        "architecture    llama",
        "parameters      134.52 M (134515008)",
        "file type       Q4_1 (3)",
        "q4_1: 210 tensors",
        "q8_0: 1 tensors",
        "f32: 61 tensors",
        "context length  8192",
        "embedding       576",
        "layers          30",
        "heads           9",
        "kv heads        3",
        "49152 tokens, model gpt2, pre-tokenizer smollm",
        "bos 1 \"<|im_start|>\"",
        "chat template   yes",
    ] {
        assert!(out.contains(needle), "missing `{needle}` in:\n{out}");
    }
    let tensors = ok(&["info", "--tensors", smollm2().to_str().unwrap()]);
    assert!(tensors.contains("token_embd.weight") && tensors.contains("[576, 49152]"));
    assert_eq!(tensors.lines().filter(|l| l.contains(".weight")).count(), 272);
}

/// Compare a JSON value from `hf2q info --json --full` with the gguf-py reading of it.
fn same_value(ty: &str, ours: &J, theirs: &J) -> bool {
    match (ours, theirs) {
        (J::Array(a), J::Array(b)) => {
            let inner = ty
                .strip_prefix("array[")
                .and_then(|t| t.strip_suffix(']'))
                .unwrap_or(ty);
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_value(inner, x, y))
        }
        // f32 values: equal after rounding both to f32 (JSON texts of the same f32 may differ).
        (J::Number(x), J::Number(y)) if ty == "f32" => x.as_f64().map(|v| v as f32) == y.as_f64().map(|v| v as f32),
        (J::Number(x), J::Number(y)) if ty == "f64" => x.as_f64() == y.as_f64(),
        _ => ours == theirs,
    }
}

#[test]
fn info_json_agrees_with_gguf_py() {
    let expected: J =
        serde_json::from_str(include_str!("data/smollm2_gguf_py.json")).expect("expected JSON from gguf_py_dump.py");
    let ours: J = serde_json::from_str(&ok(&["info", "--json", "--full", smollm2().to_str().unwrap()])).unwrap();
    let (em, om) = (
        expected["metadata"].as_object().unwrap(),
        ours["metadata"].as_object().unwrap(),
    );
    assert_eq!(
        em.keys().collect::<Vec<_>>(),
        om.keys().collect::<Vec<_>>(),
        "same keys in the same order"
    );
    for (k, e) in em {
        let o = &om[k];
        assert_eq!(o["type"], e["type"], "type of {k}");
        let ty = e["type"].as_str().unwrap();
        assert!(
            same_value(ty, &o["value"], &e["value"]),
            "value of {k}: ours {} vs gguf-py {}",
            o["value"],
            e["value"]
        );
    }
    assert_eq!(expected["header"]["GGUF.version"], ours["version"]);
    let (et, ot) = (
        expected["tensors"].as_array().unwrap(),
        ours["tensors"].as_array().unwrap(),
    );
    assert_eq!(et.len(), ot.len());
    for (e, o) in et.iter().zip(ot) {
        assert_eq!(e["name"], o["name"]);
        assert!(
            e["type"]
                .as_str()
                .unwrap()
                .eq_ignore_ascii_case(o["type"].as_str().unwrap()),
            "type of {}",
            e["name"]
        );
        assert_eq!(e["shape"], o["shape"], "shape of {}", e["name"]);
        assert_eq!(e["file_offset"], o["file_offset"], "offset of {}", e["name"]);
        assert_eq!(e["size"], o["size"], "size of {}", e["name"]);
    }
    // Without --full, long arrays are summarised.
    let short: J = serde_json::from_str(&ok(&["info", "--json", smollm2().to_str().unwrap()])).unwrap();
    let tokens = &short["metadata"]["tokenizer.ggml.tokens"];
    assert_eq!(tokens["summarized"], true);
    assert_eq!(tokens["length"], 49152);
    assert_eq!(short["summary"]["parameters"], 134515008);
}

#[test]
fn info_on_hf_directory() {
    let out = ok(&["info", minilm_dir().to_str().unwrap()]);
    assert!(out.contains("architecture    BertModel"), "{out}");
    assert!(out.contains("22.71 M"), "{out}");
    assert!(out.contains("tokenizer.json"), "{out}");
    assert!(out.contains("convertible     yes"), "{out}");
    let j: J = serde_json::from_str(&ok(&["info", "--json", minilm_dir().to_str().unwrap()])).unwrap();
    assert_eq!(j["n_tensors"], 104);
    assert_eq!(j["shards"][0]["file"], "model.safetensors");
    assert_eq!(j["convertible"], true);
}

/// Every key except `changed` has the same type and value, and every tensor the same bytes.
fn assert_only_changed(src: &Path, dst: &Path, changed: &[&str]) {
    let (a, b) = (GgufFile::open(src).unwrap(), GgufFile::open(dst).unwrap());
    for (k, v) in a.metadata().iter() {
        if !changed.contains(&k) {
            assert_eq!(b.metadata().get(k), Some(v), "key {k} must be unchanged");
        }
    }
    for k in b.metadata().keys() {
        assert!(
            a.metadata().contains_key(k) || changed.contains(&k),
            "unexpected new key {k}"
        );
    }
    assert_eq!(a.tensors().len(), b.tensors().len());
    for (ta, tb) in a.tensors().iter().zip(b.tensors()) {
        assert_eq!((&ta.name, ta.ty, &ta.shape), (&tb.name, tb.ty, &tb.shape));
        assert!(
            a.tensor_data(ta) == b.tensor_data(tb),
            "tensor {} bytes differ",
            ta.name
        );
        assert_eq!(tb.offset % b.header().alignment, 0);
    }
}

#[test]
fn gguf_patch_changes_exactly_what_was_asked() {
    let dir = tempfile::tempdir().unwrap();
    let src = smollm2();
    let out = dir.path().join("patched.gguf");
    let template = dir.path().join("t.jinja");
    std::fs::write(&template, "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
    let diff = ok(&[
        "gguf-patch",
        src.to_str().unwrap(),
        "--set",
        "general.name=str:My Model",
        "--set",
        "my.new_key=u32:7",
        "--set",
        "llama.context_length=u64:4096",
        "--delete",
        "general.license",
        "--chat-template",
        template.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        diff.contains("~ general.name: str \"Smollm2 135M 8k Lc100K Mix1 Ep2\" -> str \"My Model\""),
        "{diff}"
    );
    assert!(diff.contains("+ my.new_key: u32 7"), "{diff}");
    assert!(diff.contains("- general.license"), "{diff}");
    let changed = [
        "general.name",
        "my.new_key",
        "llama.context_length",
        "general.license",
        "tokenizer.chat_template",
    ];
    assert_only_changed(&src, &out, &changed);
    let p = GgufFile::open(&out).unwrap();
    let m = p.metadata();
    assert_eq!(m.get("general.name"), Some(&Value::String("My Model".into())));
    assert_eq!(m.get("my.new_key"), Some(&Value::U32(7)));
    assert_eq!(m.get("llama.context_length"), Some(&Value::U64(4096)));
    assert!(m.get("general.license").is_none());
    assert_eq!(
        m.get_str("tokenizer.chat_template"),
        Some("{% for m in messages %}{{ m.content }}{% endfor %}")
    );
    // The changed key keeps its position.
    let keys: Vec<&str> = m.keys().collect();
    assert_eq!(keys[2], "general.name");

    // --dry-run writes nothing.
    let dry = dir.path().join("dry.gguf");
    let d = ok(&[
        "gguf-patch",
        src.to_str().unwrap(),
        "--set",
        "a=bool:true",
        "--dry-run",
        "-o",
        dry.to_str().unwrap(),
    ]);
    assert!(d.contains("+ a: bool true"));
    assert!(!dry.exists());

    // --in-place on a copy: replaced atomically, tensors untouched.
    let copy = dir.path().join("copy.gguf");
    std::fs::copy(&out, &copy).unwrap();
    ok(&[
        "gguf-patch",
        copy.to_str().unwrap(),
        "--delete",
        "my.new_key",
        "--in-place",
    ]);
    assert_only_changed(&out, &copy, &["my.new_key"]);
    assert!(GgufFile::open(&copy).unwrap().metadata().get("my.new_key").is_none());
    // No temporary files left over.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
}

#[test]
fn doctor_and_completions() {
    let out = ok(&["doctor"]);
    for needle in ["cpu", "simd", "memory", "nvidia driver", "cache dir", "free disk"] {
        assert!(out.contains(needle), "doctor output lacks {needle}:\n{out}");
    }
    let j: J = serde_json::from_str(&ok(&["doctor", "--json"])).unwrap();
    assert!(j["cpu"]["logical_cores"].as_u64().unwrap() >= 1);
    assert!(j["cuda"].is_object());
    let bash = ok(&["completions", "bash"]);
    assert!(bash.contains("gguf-patch") && bash.contains("doctor"));
    let help = ok(&["--help"]);
    for c in ["info", "gguf-patch", "doctor", "completions"] {
        assert!(help.contains(c));
    }
}

#[test]
fn bad_input_exits_3_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let not_gguf = d.join("notes.txt");
    std::fs::write(&not_gguf, "hello, this is not a model").unwrap();
    let truncated = d.join("trunc.gguf");
    let bytes = std::fs::read(smollm2()).unwrap();
    std::fs::write(&truncated, &bytes[..100_000]).unwrap();
    let data_cut = d.join("datacut.gguf");
    std::fs::write(&data_cut, &bytes[..bytes.len() - 1000]).unwrap();
    let model = smollm2();
    let m = model.to_str().unwrap();
    let out = d.join("o.gguf");
    let o = out.to_str().unwrap();
    let missing = d.join("missing.gguf");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["info", missing.to_str().unwrap()], "no such file"),
        (vec!["info", d.to_str().unwrap()], "no config.json"),
        (vec!["info", not_gguf.to_str().unwrap()], "not a GGUF file"),
        (vec!["info", truncated.to_str().unwrap()], "truncated"),
        (
            vec!["info", data_cut.to_str().unwrap()],
            "data of tensor `output_norm.weight`",
        ),
        (vec!["gguf-patch", m, "--set", "a=u33:1", "-o", o], "unknown type `u33`"),
        (vec!["gguf-patch", m, "--set", "a=u8:300", "-o", o], "not a valid u8"),
        (vec!["gguf-patch", m, "--set", "a=f32:abc", "-o", o], "not a valid f32"),
        (vec!["gguf-patch", m, "--set", "novalue", "-o", o], "KEY=TYPE:VALUE"),
        (vec!["gguf-patch", m, "--delete", "no.such.key", "-o", o], "no such key"),
        (vec!["gguf-patch", m, "--set", "a=u8:1"], "-o OUT or --in-place"),
        (vec!["gguf-patch", m, "-o", o], "nothing to do"),
        (
            vec!["gguf-patch", m, "--set", "general.alignment=u32:48", "-o", o],
            "power of two",
        ),
        (
            vec!["gguf-patch", missing.to_str().unwrap(), "--set", "a=u8:1", "-o", o],
            "no such file",
        ),
        (
            vec!["gguf-patch", truncated.to_str().unwrap(), "--set", "a=u8:1", "-o", o],
            "truncated",
        ),
        (
            vec!["gguf-patch", m, "--chat-template", missing.to_str().unwrap(), "-o", o],
            "--chat-template",
        ),
        (vec!["info"], "PATH"),
        (vec!["frobnicate"], "unrecognized subcommand"),
        (vec!["info", m, "--log-level", "bogus=="], "invalid --log-level"),
    ];
    for (args, needle) in cases {
        let r = hf2q(&args);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(3), "hf2q {args:?} should exit 3; stderr: {err}");
        assert!(
            err.contains(needle),
            "hf2q {args:?}: stderr should mention `{needle}`: {err}"
        );
        if !needle.contains("subcommand") && !needle.contains("PATH") {
            assert_eq!(
                err.trim_end().lines().count(),
                1,
                "one-line message for {args:?}: {err}"
            );
        }
        assert!(!out.exists(), "no output file after a failure of {args:?}");
    }
}

/// Regression: `hf2q info FILE | head` panicked ("failed printing to stdout: Broken pipe", with a
/// backtrace). Every command that prints ends quietly on a closed pipe.
#[test]
fn closed_pipe_ends_quietly() {
    let bin = env!("CARGO_BIN_EXE_hf2q");
    let m = smollm2();
    for args in [
        format!("info --tensors '{}'", m.display()),
        format!("info --json --full '{}'", m.display()),
        "completions bash".to_string(),
    ] {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("'{bin}' {args} | head -c 10 > /dev/null"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args}: {err}"
        );
    }
}

/// `bench --parallel` runs llama-batched-bench's test: per count B a prompt row and a decode row
/// (aggregate tokens/s), in JSON with `n_parallel`; a count of 0 is refused.
#[test]
fn bench_parallel_reports_batched_rows() {
    let m = smollm2();
    let m = m.to_str().unwrap();
    let o = hf2q(&[
        "bench",
        "-m",
        m,
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "1",
        "-t",
        "2",
        "--parallel",
        "1,3",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).expect("bench --json prints JSON");
    let got: Vec<(String, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["test"].as_str().unwrap_or("").to_string(),
                r["n_parallel"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let want = [("pp16 x1", 1), ("tg4 x1", 1), ("pp16 x3", 3), ("tg4 x3", 3)];
    assert_eq!(
        got,
        want.iter().map(|&(t, b)| (t.to_string(), b)).collect::<Vec<_>>(),
        "{rows:?}"
    );
    for r in &rows {
        assert!(r["avg_ts"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    }
    let o = hf2q(&["bench", "-m", m, "--parallel", "0"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("--parallel"), "{err}");
}

/// `--device cuda` without a GPU is a clear error (exit 3) naming what is missing, for a command
/// and for the server, before anything loads.
#[test]
fn device_cuda_without_a_gpu_is_refused() {
    if engine::backend::select::cuda_present() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "NOT RUN: --device cuda refusal (this machine has a GPU)"
        );
        return;
    }
    let m = smollm2();
    let m = m.to_str().unwrap();
    for args in [
        vec!["generate", "-m", m, "--device", "cuda", "-p", "hi", "-n", "1"],
        vec!["bench", "-m", m, "--device", "cuda:1", "-p", "8", "-n", "1", "-r", "1"],
        vec!["serve", "-m", m, "--device", "cuda"],
    ] {
        let o = hf2q(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {err}");
        assert!(err.contains("NVIDIA driver"), "{args:?}: {err}");
    }
}

/// Two models that would be served under one id, and more aliases than models, are refused
/// before anything loads; so is `--device` with a device this build cannot run on.
#[test]
fn serve_refuses_ambiguous_model_ids() {
    let m = smollm2();
    let m = m.to_str().unwrap();
    for (args, needle) in [
        (vec!["serve", "-m", m, "-m", m], "two models would be served as"),
        (
            vec!["serve", "-m", m, "--alias", "a", "--alias", "b"],
            "2 --alias for 1 models",
        ),
        (vec!["serve", "-m", m, "--device", "tpu"], "--device"),
    ] {
        let o = hf2q(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
