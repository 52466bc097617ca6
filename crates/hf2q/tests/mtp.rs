//! Multi-token prediction (MTP) on the tiny Qwen 3.5 fixture (`$HF2Q_FIXTURES/tiny/qwen3_5`,
//! random weights, one MTP block), converted by hf2q to F32:
//! - the MTP head's logits against a PyTorch reference built from transformers' blocks
//!   (`data/mtp/qwen3_5_mtp.py`, `qwen3_5_mtp.json`);
//! - greedy generation with `--spec mtp` gives the same tokens and bytes as without speculation,
//!   through the engine and through the CLI;
//! - the same through the server (continuous batching, two requests at a time), with the checks
//!   counted in `/metrics`;
//! - `--spec mtp` on a model without MTP layers fails naming the model;
//! - GGUF copies made here: both heads zeroed (every draft kept), and the `qwen3_5_moe` fixture
//!   (which has no MTP layers) given an MTP block built from its own full-attention MoE layer.
//!
//! Without `HF2Q_FIXTURES` these tests do not run, and say so.

mod common;

use common::server::Server;
use convert::plan::Target;
use convert::requant::QuantizeOptions;
use engine::backend::cpu::Cpu;
use engine::backend::KvType;
use engine::generate::{generate, GenerateParams, Generated, LoadedModel, Session};
use engine::model::{HiddenRows, Logits, SeqStep};
use engine::spec::SpecMode;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

fn fixture(model: &str, what: &str) -> Option<PathBuf> {
    let Some(root) = std::env::var_os("HF2Q_FIXTURES") else {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "NOT RUN: {what} (set HF2Q_FIXTURES to the full fixtures)"
        );
        return None;
    };
    let d = PathBuf::from(root).join("tiny").join(model);
    assert!(d.is_dir(), "fixture missing: {}", d.display());
    Some(d)
}

/// The fixture converted to F32 (`--no-mtp` for those converted so in `expected/commands.txt`).
fn convert(dir: &Path, tmp: &Path, no_mtp: bool) -> PathBuf {
    let out = tmp.join("model.f32.gguf");
    let copts = convert::pipeline::ConvertOptions {
        no_mtp,
        ..Default::default()
    };
    convert::pipeline::convert_with(
        dir,
        &out,
        Target::parse("f32").unwrap(),
        &QuantizeOptions::default(),
        &copts,
    )
    .unwrap();
    out
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// `params`' generation after `prompt` in a fresh 128-position session.
fn run(m: &LoadedModel<Cpu>, prompt: &[u32], params: &GenerateParams) -> Generated {
    let mut session = Session::new(m, 128, KvType::F16, 32).unwrap();
    generate(m, &mut session, prompt, params, |_| true).unwrap()
}

/// Greedy decoding of `max_tokens` tokens (EOS ignored) with speculation `spec`.
fn greedy(max_tokens: usize, spec: SpecMode, draft_max: usize, n_batch: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: engine::sampler::SamplingParams::greedy(),
        ignore_eos: true,
        spec,
        draft_max,
        n_batch,
        ..GenerateParams::default()
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// The MTP head's logits for the prompt's positions (each paired with the next token, the last
/// with the target's greedy token) and for a second, chained draft, against the reference. Bound
/// 5e-3, the fixtures' F32 logits tolerance (`engine_tiny.rs`: the f16 KV cache and the f16 Q
/// rounding of llama.cpp's CPU flash attention, ~1e-3 expected): the MTP block is one more
/// attention layer of the same kind, over hidden states that carry the decoder's own deviation.
#[test]
fn mtp_head_matches_the_reference() {
    let Some(dir) = fixture("qwen3_5", "MTP head against its reference") else {
        return;
    };
    let r: serde_json::Value = serde_json::from_str(include_str!("data/mtp/qwen3_5_mtp.json")).unwrap();
    let prompt = ids(&r["input_ids"]);
    let toks = ids(&r["mtp_tokens"]);
    let want = common::json_rows(&r["logits"]);
    let tmp = tempfile::tempdir().unwrap();
    let path = convert(&dir, tmp.path(), false);
    let gguf = engine::model::open_gguf(&path).unwrap();
    let m = engine::model::load(Arc::new(Cpu::new(2).unwrap()), &gguf, &path).unwrap();
    assert_eq!(m.mtp_layers(), 1);
    let mut scratch = m.scratch(16);
    let mut kv = m.new_kv(32, KvType::F16).unwrap();
    let n = prompt.len();
    let best = m
        .forward_argmax(
            &mut scratch,
            &mut [SeqStep {
                kv: &mut kv,
                tokens: &prompt,
                pos0: 0,
                logits: Logits::Last,
            }],
        )
        .unwrap();
    assert_eq!(
        best[0] as u64,
        r["target_next"].as_u64().unwrap(),
        "the target's greedy token"
    );
    let rows: Vec<usize> = (0..n).collect();
    let mut step = SeqStep {
        kv: &mut kv,
        tokens: &toks[..n],
        pos0: 0,
        logits: Logits::All,
    };
    let guess = m
        .forward_mtp_argmax(&mut scratch, std::slice::from_mut(&mut step), HiddenRows::Target(&rows))
        .unwrap();
    let mut worst = 0.0f32;
    for (i, w) in want.iter().enumerate().take(n) {
        let got = m.logits_row(&mut scratch, i).unwrap();
        worst = worst.max(max_diff(&got, w));
    }
    // The chain: the last row's guess, paired with that row's MTP hidden state, one position on.
    assert_eq!(guess[n - 1], toks[n], "the MTP head's first draft");
    let chained = m
        .forward_mtp_argmax(
            &mut scratch,
            &mut [SeqStep {
                kv: &mut kv,
                tokens: &toks[n..],
                pos0: n,
                logits: Logits::Last,
            }],
            HiddenRows::Mtp(&[n - 1]),
        )
        .unwrap();
    let got = m.logits_row(&mut scratch, 0).unwrap();
    let chain_diff = max_diff(&got, &want[n]);
    eprintln!("MTP logits: max |diff| {worst:.2e} over {n} rows, chained draft {chain_diff:.2e}");
    assert!(worst < 5e-3, "MTP logits differ from the reference by {worst}");
    assert!(chain_diff < 5e-3, "chained MTP logits differ by {chain_diff}");
    let argmax = ids(&r["mtp_argmax"]);
    assert_eq!(guess, argmax[..n], "the MTP head's argmax per row");
    assert_eq!(chained[0], argmax[n]);
}

/// Greedy decoding with MTP drafts (each checked row computed as a decode step would compute it)
/// gives the tokens decoding without drafts gives, for several draft lengths and with the prompt
/// fed in chunks (the MTP layer's cache filled chunk by chunk).
#[test]
fn mtp_speculation_keeps_the_greedy_tokens() {
    let Some(dir) = fixture("qwen3_5", "greedy tokens with MTP drafts") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let path = convert(&dir, tmp.path(), false);
    let m = LoadedModel::load(Arc::new(Cpu::new(2).unwrap()), &path).unwrap();
    let prompt: Vec<u32> = (0..21u32).map(|i| (i * 7919 + 13) % 1000).collect();
    let run = |spec: SpecMode, k: usize, n_batch: usize| run(&m, &prompt, &greedy(60, spec, k, n_batch));
    let want = run(SpecMode::Off, 1, 32);
    assert_eq!(want.tokens.len(), 60);
    for (k, n_batch) in [(1, 32), (3, 32), (8, 5)] {
        let g = run(SpecMode::Mtp, k, n_batch);
        eprintln!("--spec mtp --draft-max {k} (prefill steps of {n_batch}): {:?}", g.spec);
        assert!(g.spec.checks > 0, "no MTP drafts were checked");
        assert_eq!(g.tokens, want.tokens, "greedy tokens with MTP drafts (--draft-max {k})");
        assert_eq!(g.text, want.text);
    }
}

/// A copy of an F32 qwen3_5 GGUF with both output heads zero (an all-zero `output.weight` and
/// `blk.2.nextn.shared_head_head.weight`): the target always chooses token 0 and the MTP head
/// always drafts it, so every draft is kept (`bench/spec/mtp_zero_heads.py` makes the same file).
fn with_zero_heads(src: &Path, dst: &Path) {
    use gguf::{GgmlType, GgufFile, GgufWriter, TensorSpec};
    let f = GgufFile::open(src).unwrap();
    let emb = f.tensor("token_embd.weight").unwrap().clone();
    assert_eq!(emb.ty, GgmlType::F32);
    let mut specs: Vec<TensorSpec> = f.tensors().iter().map(TensorSpec::from).collect();
    for name in ["output.weight", "blk.2.nextn.shared_head_head.weight"] {
        specs.push(TensorSpec {
            name: name.into(),
            ty: GgmlType::F32,
            shape: emb.shape.clone(),
        });
    }
    let mut w = GgufWriter::create(dst, f.metadata(), &specs).unwrap();
    for t in f.tensors() {
        w.write_tensor(f.tensor_data(t)).unwrap();
    }
    let zeros = vec![0u8; emb.n_elements() as usize * 4];
    w.write_tensor(&zeros).unwrap();
    w.write_tensor(&zeros).unwrap();
    w.finish().unwrap();
}

/// With every draft kept (zero heads), checks of several rows go through: the MTP layer pairs
/// each check's kept rows with their tokens, the tokens are those of decoding without drafts,
/// and a check gives up to `--draft-max` + 1 tokens.
#[test]
fn mtp_kept_drafts_keep_the_greedy_tokens() {
    let Some(dir) = fixture("qwen3_5", "MTP drafts all kept") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let src = convert(&dir, tmp.path(), false);
    let path = tmp.path().join("zero-heads.gguf");
    with_zero_heads(&src, &path);
    let m = LoadedModel::load(Arc::new(Cpu::new(2).unwrap()), &path).unwrap();
    let prompt: Vec<u32> = (0..13u32).map(|i| (i * 7919 + 5) % 1000).collect();
    let n_batch = GenerateParams::default().n_batch;
    let run = |spec: SpecMode, k: usize| run(&m, &prompt, &greedy(50, spec, k, n_batch));
    let want = run(SpecMode::Off, 1);
    for k in [1, 4, 16] {
        let g = run(SpecMode::Mtp, k);
        eprintln!("zero heads, --draft-max {k}: {:?}", g.spec);
        assert_eq!(g.tokens, want.tokens, "--draft-max {k}");
        assert!(g.spec.drafted > 0 && g.spec.accepted == g.spec.drafted, "{:?}", g.spec);
        assert!(g.spec.tokens_per_check() > 1.9, "{:?}", g.spec);
    }
}

/// A copy of an F32 Qwen 3.5 GGUF without MTP layers given one (the `qwen3_5_moe` fixture has
/// none): the decoder's first full-attention layer (attention, MoE and shared expert) copied as the
/// MTP block's layer, a pseudo-random `nextn.eh_proj` (uniform in ±0.05) and unit norms, and the
/// block count and `nextn_predict_layers` raised by one.
fn with_mtp_block(src: &Path, dst: &Path) {
    use gguf::{GgmlType, GgufFile, GgufWriter, TensorSpec, Value};
    let f = GgufFile::open(src).unwrap();
    let mut md = f.metadata().clone();
    let arch = md.get_str("general.architecture").unwrap().to_string();
    let n = md.get_u64(&format!("{arch}.block_count")).unwrap();
    let e = md.get_u64(&format!("{arch}.embedding_length")).unwrap();
    md.insert(format!("{arch}.block_count"), Value::U32(n as u32 + 1));
    md.insert(format!("{arch}.nextn_predict_layers"), Value::U32(1));
    let full = (0..n)
        .find(|i| f.tensor(&format!("blk.{i}.attn_q.weight")).is_some())
        .unwrap();
    let from = format!("blk.{full}.");
    let mut specs: Vec<TensorSpec> = f.tensors().iter().map(TensorSpec::from).collect();
    let mut data: Vec<Vec<u8>> = f.tensors().iter().map(|t| f.tensor_data(t).to_vec()).collect();
    for t in f.tensors().iter().filter(|t| t.name.starts_with(&from)) {
        specs.push(TensorSpec {
            name: t.name.replacen(&from, &format!("blk.{n}."), 1),
            ..TensorSpec::from(t)
        });
        data.push(f.tensor_data(t).to_vec());
    }
    let f32s = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut seed = 12345u64;
    let eh: Vec<f32> = (0..2 * e * e)
        .map(|_| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
        })
        .collect();
    let ones = vec![1.0f32; e as usize];
    for (name, shape, v) in [
        ("nextn.eh_proj", vec![2 * e, e], eh),
        ("nextn.enorm", vec![e], ones.clone()),
        ("nextn.hnorm", vec![e], ones.clone()),
        ("nextn.shared_head_norm", vec![e], ones),
    ] {
        specs.push(TensorSpec {
            name: format!("blk.{n}.{name}.weight"),
            ty: GgmlType::F32,
            shape,
        });
        data.push(f32s(v));
    }
    let mut w = GgufWriter::create(dst, &md, &specs).unwrap();
    for d in &data {
        w.write_tensor(d).unwrap();
    }
    w.finish().unwrap();
}

/// The MoE family with an MTP block (its layer a MoE layer with a shared expert): greedy tokens
/// with MTP drafts equal those without, the prompt fed whole and in chunks.
#[test]
fn mtp_moe_speculation_keeps_the_greedy_tokens() {
    let Some(dir) = fixture("qwen3_5_moe", "MoE with an MTP block") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let src = convert(&dir, tmp.path(), true);
    let path = tmp.path().join("moe-mtp.gguf");
    with_mtp_block(&src, &path);
    let m = LoadedModel::load(Arc::new(Cpu::new(2).unwrap()), &path).unwrap();
    assert_eq!(m.model.mtp_layers(), 1);
    let prompt: Vec<u32> = (0..17u32).map(|i| (i * 7919 + 3) % 1000).collect();
    let run = |spec: SpecMode, k: usize, n_batch: usize| run(&m, &prompt, &greedy(48, spec, k, n_batch));
    let want = run(SpecMode::Off, 1, 32);
    for (k, n_batch) in [(2, 32), (6, 4)] {
        let g = run(SpecMode::Mtp, k, n_batch);
        eprintln!("qwen3_5_moe + MTP block, --draft-max {k}: {:?}", g.spec);
        assert!(g.spec.checks > 0);
        assert_eq!(g.tokens, want.tokens, "--draft-max {k}, prefill steps of {n_batch}");
    }
}

/// Sampling with MTP drafts (each kept with its probability under the sampler's chain,
/// `Sampler::sample_draft`, whose distribution test is the sampler's own) runs to its token limit
/// through the checks; with top-k 1 it is greedy decoding and gives its tokens.
#[test]
fn mtp_speculation_with_sampling() {
    let Some(dir) = fixture("qwen3_5", "sampling with MTP drafts") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let path = convert(&dir, tmp.path(), false);
    let m = LoadedModel::load(Arc::new(Cpu::new(2).unwrap()), &path).unwrap();
    let prompt: Vec<u32> = (0..9u32).map(|i| (i * 104_729 + 7) % 1000).collect();
    let run = |spec: SpecMode, top_k: usize| {
        let mut params = greedy(40, spec, 3, GenerateParams::default().n_batch);
        params.sampling = engine::sampler::SamplingParams {
            temperature: 0.9,
            top_k,
            seed: 7,
            ..Default::default()
        };
        run(&m, &prompt, &params)
    };
    let g = run(SpecMode::Mtp, 0);
    assert_eq!(g.tokens.len(), 40);
    assert!(g.spec.checks > 0);
    assert_eq!(run(SpecMode::Mtp, 1).tokens, run(SpecMode::Off, 1).tokens);
}

/// `--spec mtp` on a Qwen 3.5 model converted without its MTP layers fails before generating,
/// naming the file and saying what is missing (engine and CLI, exit code 3).
#[test]
fn mtp_needs_mtp_layers() {
    let Some(dir) = fixture("qwen3_5_moe", "--spec mtp without MTP layers") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let path = convert(&dir, tmp.path(), true);
    let m = LoadedModel::load(Arc::new(Cpu::new(2).unwrap()), &path).unwrap();
    let mut session = Session::new(&m, 64, KvType::F16, 16).unwrap();
    let params = GenerateParams {
        spec: SpecMode::Mtp,
        ..GenerateParams::default()
    };
    let e = generate(&m, &mut session, &[1, 2, 3], &params, |_| true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.f32.gguf") && e.contains("multi-token-prediction"),
        "{e}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_hf2q"))
        .args(["generate", "-m"])
        .arg(&path)
        .args(["-p", "hello", "-n", "4", "--spec", "mtp"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("multi-token-prediction"), "{err}");
}

/// The CLI's greedy output with `--spec mtp` is the same bytes as with `--spec off`.
#[test]
fn cli_mtp_output_equals_plain_decoding() {
    let Some(dir) = fixture("qwen3_5", "CLI --spec mtp vs off") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let path = convert(&dir, tmp.path(), false);
    let gen = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_hf2q"))
            .args(["generate", "-m"])
            .arg(&path)
            .args([
                "-p",
                "the quick brown fox",
                "-n",
                "48",
                "--temp",
                "0",
                "-t",
                "2",
                "--ignore-eos",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    let want = gen(&["--spec", "off"]);
    assert!(!want.is_empty());
    for k in ["2", "6"] {
        assert_eq!(
            gen(&["--spec", "mtp", "--draft-max", k]),
            want,
            "--spec mtp --draft-max {k}"
        );
    }
}

/// `hf2q serve --spec mtp --parallel 2`: greedy completions of two prompts sent together are the
/// same as `--spec off` gives, and `/metrics` counts the MTP checks; a model without MTP layers is
/// refused at start.
#[test]
fn serve_mtp_replies_equal_plain_decoding() {
    let Some(dir) = fixture("qwen3_5", "serve --spec mtp") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let path = convert(&dir, tmp.path(), false);
    let prompts = ["the quick brown fox", "one two three four five six"];
    let replies = |spec: &str| {
        let s = Arc::new(Server::start_with(
            std::slice::from_ref(&path),
            &["-c", "256", "--parallel", "2", "--spec", spec, "--draft-max", "4"],
        ));
        let threads: Vec<_> = prompts
            .iter()
            .map(|p| {
                let s = s.clone();
                let body = serde_json::json!({
                    "prompt": p, "max_tokens": 40, "temperature": 0, "ignore_eos": true});
                std::thread::spawn(move || {
                    let (st, v) = s.json("POST", "/v1/completions", body, None);
                    assert_eq!(st, 200, "{v}");
                    v["choices"][0]["text"].as_str().unwrap().to_string()
                })
            })
            .collect();
        let texts: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let body = s.request("GET", "/metrics", None, None).2;
        let checks: f64 = body
            .lines()
            .find(|l| l.starts_with("hf2q_spec_checks_total{"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no hf2q_spec_checks_total in /metrics:\n{body}"));
        (texts, checks)
    };
    let (want, _) = replies("off");
    let (got, checks) = replies("mtp");
    assert_eq!(got, want, "replies with --spec mtp");
    assert!(checks > 0.0, "no MTP checks counted in /metrics");

    let moe = fixture("qwen3_5_moe", "serve --spec mtp without MTP layers").unwrap();
    let tmp2 = tempfile::tempdir().unwrap();
    let no_mtp = convert(&moe, tmp2.path(), true);
    let out = Command::new(env!("CARGO_BIN_EXE_hf2q"))
        .args(["serve", "-m"])
        .arg(&no_mtp)
        .args(["--spec", "mtp", "--port", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("multi-token-prediction"), "{err}");
}
