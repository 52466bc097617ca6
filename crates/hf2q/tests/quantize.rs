//! `hf2q quantize` writes byte-for-byte the file llama.cpp's `llama-quantize` writes, on the real
//! SmolLM2 GGUF (expected SHA-256s recorded in `data/smollm2_llama_quantize.sha256`), and refuses
//! what llama-quantize refuses.

use std::path::PathBuf;
use std::process::Command;

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

fn sha256(path: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut f = std::fs::File::open(path).unwrap();
    std::io::copy(&mut f, &mut h).unwrap();
    format!("{:x}", h.finalize())
}

#[test]
fn byte_identical_to_llama_quantize_on_smollm2() {
    let dir = tempfile::tempdir().unwrap();
    let expected = include_str!("data/smollm2_llama_quantize.sha256");
    for line in expected.lines() {
        let (ftype, hash) = line.split_once(' ').unwrap();
        let out = dir.path().join(format!("{ftype}.gguf"));
        let o = Command::new(env!("CARGO_BIN_EXE_hf2q"))
            .args([
                "quantize",
                "--allow-requantize",
                smollm2().to_str().unwrap(),
                out.to_str().unwrap(),
                ftype,
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{ftype}: {}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(sha256(&out), hash, "{ftype}: output differs from llama-quantize's");
        std::fs::remove_file(&out).unwrap();
    }
}

#[test]
fn byte_identical_to_llama_quantize_with_imatrix() {
    // Run from a folder holding the imatrix under the name llama-quantize was given: the path is
    // recorded in the output (`quantize.imatrix.file`).
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/smollm2.imatrix.gguf"),
        dir.path().join("smollm2.imatrix.gguf"),
    )
    .unwrap();
    for line in include_str!("data/smollm2_llama_quantize_imatrix.sha256").lines() {
        let (ftype, hash) = line.split_once(' ').unwrap();
        let out = format!("{ftype}.gguf");
        let o = Command::new(env!("CARGO_BIN_EXE_hf2q"))
            .current_dir(dir.path())
            .args(["quantize", "--allow-requantize", "--imatrix", "smollm2.imatrix.gguf"])
            .args([smollm2().to_str().unwrap(), out.as_str(), ftype])
            .output()
            .unwrap();
        assert!(o.status.success(), "{ftype}: {}", String::from_utf8_lossy(&o.stderr));
        let path = dir.path().join(&out);
        assert_eq!(
            sha256(&path),
            hash,
            "{ftype} with imatrix: output differs from llama-quantize's"
        );
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn refuses_like_llama_quantize() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.gguf");
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_hf2q")).args(args).output().unwrap();
    let m = smollm2();
    let m = m.to_str().unwrap();
    let o = out.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["quantize", m, o, "Q4_K_M"],
            "requantizing from type q4_1 is disabled",
        ),
        (
            vec!["quantize", "--allow-requantize", m, o, "IQ2_XXS"],
            "requires an importance matrix",
        ),
        (vec!["quantize", m, o, "Q7_K"], "unknown file type `Q7_K`"),
        (
            vec!["quantize", m, o, "Q8_0", "--tensor-type", "attn=q9_9"],
            "unknown ggml type `q9_9`",
        ),
        (
            vec!["quantize", m, o, "Q8_0", "--tensor-type", "(=q8_0"],
            "--tensor-type",
        ),
        (vec!["quantize", "/no/such.gguf", o, "Q8_0"], "no such file"),
    ] {
        let r = run(&args);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(3), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: expected `{needle}` in {err}");
        assert!(!out.exists(), "{args:?} left an output file");
    }
    // --dry-run prints the plan and writes nothing.
    let r = run(&["quantize", "--dry-run", m, o, "Q4_K_M"]);
    assert!(r.status.success());
    let plan = String::from_utf8_lossy(&r.stdout);
    assert!(
        plan.contains("blk.0.ffn_down.weight") && plan.contains("(fallback)") && plan.contains("Q4_K_M:"),
        "{plan}"
    );
    assert!(!out.exists());
}
