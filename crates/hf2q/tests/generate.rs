//! `hf2q generate` on the real SmolLM2-135M-Instruct: greedy chat completions equal llama.cpp's
//! (goldens and the script that made them in `data/goldens/`), and bad input fails cleanly.
//!
//! The Q8_0 and Q4_K_M models are made here from the fetched Q4_1 with `hf2q quantize`
//! (byte-identical to llama-quantize's output, checked by `tests/quantize.rs`).

mod common;

use common::{models_dir, smollm2};
use std::path::{Path, PathBuf};
use std::process::Command;

fn hf2q() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hf2q"))
}

fn quantize(src: &Path, dir: &Path, ty: &str) -> PathBuf {
    let out = dir.join(format!("SmolLM2-135M-Instruct.{ty}.gguf"));
    let st = hf2q()
        .args(["quantize", "--allow-requantize"])
        .arg(src)
        .arg(&out)
        .arg(ty)
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    out
}

/// Greedy chat reply, one token per step.
fn chat(model: &Path, prompt: &str) -> String {
    chat_with(model, prompt, &["--spec", "off"])
}

fn chat_with(model: &Path, prompt: &str, extra: &[&str]) -> String {
    let out = hf2q()
        .args(["generate", "-m"])
        .arg(model)
        .args(["--chat", "-p", prompt, "-n", "64", "--temp", "0", "-t", "2"])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn greedy_chat_matches_llama_cpp() {
    let src = smollm2();
    let tmp = tempfile::tempdir().unwrap();
    let goldens: serde_json::Value =
        serde_json::from_str(include_str!("data/goldens/smollm2_chat_goldens.json")).unwrap();
    let mut models = std::collections::HashMap::new();
    models.insert("Q4_1".to_string(), src.clone());
    for ty in ["Q8_0", "Q4_K_M"] {
        models.insert(ty.to_string(), quantize(&src, tmp.path(), ty));
    }
    // Q4_K_M needs llama.cpp's orders for K-quants: Q4_K as its repacked q4_K_8x8 GEMM/GEMV sum
    // (repack.cpp), Q6_K batches as its tiled matmul (ggml-cpu/tiled), Q6_K single tokens as
    // vec_dot; Q5_0 and Q8_0 (the fallbacks for 576-wide rows) as vec_dot.
    for g in goldens.as_array().unwrap() {
        let (q, prompt, want) = (
            g["quant"].as_str().unwrap(),
            g["prompt"].as_str().unwrap(),
            g["text"].as_str().unwrap(),
        );
        let got = chat(&models[q], prompt);
        assert_eq!(got, want, "{q} {prompt:?}");
        // Speculative decoding (n-gram drafts checked a step at a time) gives the same bytes.
        for k in ["3", "16"] {
            let got = chat_with(&models[q], prompt, &["--spec", "ngram", "--draft-max", k]);
            assert_eq!(got, want, "{q} {prompt:?} with --spec ngram --draft-max {k}");
        }
    }
}

#[test]
fn raw_prompt_streams_only_generated_text() {
    let out = hf2q()
        .args(["generate", "-m"])
        .arg(smollm2())
        .args(["-p", "The capital of France is", "-n", "8", "--temp", "0", "-t", "2"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        " Paris.\n\nThe United States has"
    );
}

#[test]
fn same_seed_same_text() {
    let run = |seed: &str| {
        let out = hf2q()
            .args(["generate", "-m"])
            .arg(smollm2())
            .args([
                "-p",
                "Once upon a time",
                "-n",
                "24",
                "--temp",
                "1.0",
                "--seed",
                seed,
                "-t",
                "2",
            ])
            .output()
            .unwrap();
        assert!(out.status.success());
        out.stdout
    };
    assert_eq!(run("7"), run("7"));
    assert_ne!(run("7"), run("8"));
}

#[test]
fn bad_input_is_a_clear_error() {
    let model = smollm2();
    let fails = |args: &[&str], needle: &str| {
        let out = hf2q().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    };
    let m = model.to_str().unwrap();
    let long = "word ".repeat(100);
    fails(&["generate", "-m", m, "-p", &long, "--ctx", "32"], "context holds 32");
    fails(&["generate", "-m", m, "-p", "hi", "--top-p", "0"], "top_p");
    fails(
        &["generate", "-m", "/nonexistent.gguf", "-p", "hi"],
        "no such model file",
    );
    fails(&["generate", "-m", m, "-p", "hi", "--kv-type", "q4"], "KV cache type");

    // A GGUF of an architecture the engine does not run yet (BERT).
    let tmp = tempfile::tempdir().unwrap();
    let bert = tmp.path().join("minilm.gguf");
    let dir = models_dir().join("all-MiniLM-L6-v2");
    let st = hf2q()
        .arg("convert")
        .arg(&dir)
        .args(["--quant", "f16", "-o"])
        .arg(&bert)
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    fails(
        &["generate", "-m", bert.to_str().unwrap(), "-p", "hi"],
        "architecture \"bert\" is not supported",
    );

    // A corrupted file: the SmolLM2 header with its tensor data cut off.
    let bytes = std::fs::read(&model).unwrap();
    let cut = tmp.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = hf2q()
        .args(["generate", "-m", cut.to_str().unwrap(), "-p", "hi"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}

/// `hf2q perplexity -c 512 -t 2` of `model` on the Alice text: its stdout, and the recorded
/// llama-perplexity figures `json` (in `data/perplexity`).
fn perplexity_on_alice(model: &Path, json: &str) -> (String, serde_json::Value) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/perplexity");
    let want = serde_json::from_str(&std::fs::read_to_string(dir.join(json)).unwrap()).unwrap();
    let out = hf2q()
        .args(["perplexity", "-m"])
        .arg(model)
        .arg("-f")
        .arg(dir.join("alice_in_wonderland.txt"))
        .args(["-c", "512", "-t", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8(out.stdout).unwrap(), want)
}

/// The running values perplexity printed (`[1]17.1234,[2]…`), as printed.
fn running_values(text: &str) -> Vec<&str> {
    text.split('[')
        .skip(1)
        .filter_map(|s| {
            s.split_once(']')
                .map(|(_, v)| v.split([',', '\n']).next().unwrap().trim())
        })
        .collect()
}

/// A JSON array of strings.
fn strings(v: &serde_json::Value) -> Vec<&str> {
    v.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect()
}

/// `hf2q perplexity` on a public-domain text equals llama-perplexity's value on the same file.
/// Where the AVX2 kernels run (they follow ggml's lane order, and prompt attention follows its
/// tiled path operation by operation) every printed running value and the final line are
/// identical; elsewhere (the scalar kernels sum in another order) within the 0.1 %.
#[test]
fn perplexity_matches_llama_perplexity() {
    let (text, want) = perplexity_on_alice(&smollm2(), "llama_perplexity.json");
    let line = text
        .lines()
        .find(|l| l.starts_with("Final estimate: PPL = "))
        .expect("final line");
    let ppl: f64 = line["Final estimate: PPL = ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let chunks = text.matches("],").count() + text.matches(']').count() - text.matches("],").count();
    assert_eq!(chunks as u64, want["chunks"].as_u64().unwrap(), "{text}");
    let peer = want["ppl"].as_f64().unwrap();
    let rel = (ppl - peer).abs() / peer;
    eprintln!("hf2q PPL {ppl} vs llama-perplexity {peer}: relative difference {rel:.2e}");
    assert!(rel < 1e-3, "PPL {ppl} vs llama-perplexity {peer}");
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
        let running = running_values(&text);
        let want_running = strings(&want["running"]);
        assert_eq!(running, want_running, "running values");
        assert_eq!(
            line.trim(),
            format!(
                "Final estimate: PPL = {peer:.4} +/- {:.5}",
                want["ppl_error"].as_f64().unwrap()
            )
        );
    }
}

/// Gemma 3 270M (a real trained base model, Q4_K_M: Q8_0, Q5_0, Q4_K and Q6_K matrices) continues
/// raw prompts exactly as llama.cpp b11434 does (goldens and the script that made them in
/// `data/goldens/`).
#[test]
fn gemma3_greedy_matches_llama_cpp() {
    let model = models_dir().join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        model.is_file(),
        "{} is missing: run scripts/fetch-models first",
        model.display()
    );
    let goldens: serde_json::Value = serde_json::from_str(include_str!("data/goldens/gemma3_goldens.json")).unwrap();
    for g in goldens.as_array().unwrap() {
        let prompt = g["prompt"].as_str().unwrap();
        let out = hf2q()
            .args(["generate", "-m"])
            .arg(&model)
            .args(["-p", prompt, "-n", "48", "--temp", "0", "-t", "2", "--spec", "off"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            g["text"].as_str().unwrap(),
            "{prompt:?}"
        );
        let out = hf2q()
            .args(["generate", "-m"])
            .arg(&model)
            .args(["-p", prompt, "-n", "48", "--temp", "0", "-t", "2", "--spec", "ngram"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            g["text"].as_str().unwrap(),
            "{prompt:?} with --spec ngram"
        );
    }
}

/// `hf2q perplexity` on Gemma 3 270M prints llama-perplexity's values: all 59 running values of
/// c=512 and the final line equal those of `llama-perplexity -b 512` (one chunk per step;
/// `data/perplexity/gemma3_llama_perplexity.json`). llama-perplexity's default four chunks per
/// step change its own last step's values (chunks 57 and 59); hf2q's do not depend on how many
/// chunks run together.
#[test]
fn gemma3_perplexity_matches_llama_perplexity() {
    let model = models_dir().join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        model.is_file(),
        "{} is missing: run scripts/fetch-models first",
        model.display()
    );
    let (text, want) = perplexity_on_alice(&model, "gemma3_llama_perplexity.json");
    let final_line = format!(
        "Final estimate: PPL = {:.4} +/- {:.5}",
        want["ppl_one_chunk_per_step"].as_f64().unwrap(),
        want["ppl_error_one_chunk_per_step"].as_f64().unwrap()
    );
    assert!(text.contains(&final_line), "{final_line} not in {text}");
    assert_eq!(
        running_values(&text),
        strings(&want["running_one_chunk_per_step"]),
        "{text}"
    );
}
