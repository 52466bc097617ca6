//! The engine's logits on the compact decoder fixtures (`../shared/fixtures/tiny`: llama, qwen2,
//! qwen3, qwen3_moe, gemma3, gemma4, gemma4_moe, gemma4_ple), converted by hf2q to F32 and F16,
//! against transformers' fp32 logits in `reference.json`, and the greedy continuation against
//! `greedy_new_tokens`. Q8_0 and Q4_K_M conversions must load and give finite logits.
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
//! one more 2^-11 rounding per product input (measured 1.0-1.3e-3): 1e-2. The Gemma graphs add
//! the GELU of ggml's f16 table (its output rounded to f16: 2^-11 relative) and, in Gemma 4, K
//! and V norms whose outputs are stored in f16; llama.cpp's own log-probabilities on these fixtures
//! differ from transformers' by up to 2.2e-3 (`llamacpp_check.json`, gemma4_ple), so the Gemma
//! families are held to 1e-2 (F32) and 2e-2 (F16) on logits. Gemma 4 (measured 7-9e-3) sits near that
//! bound because it attends with scale 1 over RMS-normed q/k: the f16 cache's rounding of K alone moves
//! transformers' own log-probabilities by 3.8-7.3e-3 on these fixtures (`bench/engine/kv_rounding.py`,
//! bench/runs/2026-12-01-epyc-zen5-2c/engine-families/gemma4-tolerance.md).

mod common;

use common::server::Server;
use convert::plan::Target;
use convert::requant::QuantizeOptions;
use engine::backend::cpu::Cpu;
use engine::backend::{Backend, KvType};
use engine::model::{Logits, Model, SeqStep};
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
    greedy: Vec<u32>,
}

fn reference(dir: &std::path::Path) -> Reference {
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let ids = r["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let logits = common::json_rows(&r["logits"]);
    let greedy = r["greedy_new_tokens"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_u64().unwrap() as u32).collect())
        .unwrap_or_default();
    Reference { ids, logits, greedy }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn load(model: &str, ftype: &str, tmp: &std::path::Path) -> Box<dyn Model<Cpu>> {
    load_on(Arc::new(Cpu::new(2).unwrap()), model, ftype, tmp)
}

fn load_on<B: Backend>(b: Arc<B>, model: &str, ftype: &str, tmp: &std::path::Path) -> Box<dyn Model<B>> {
    let (root, _) = tiny_dir();
    let dir = root.join(model);
    let out = tmp.join(format!("{model}.{ftype}.gguf"));
    // The Qwen 3.5 fixtures other than `qwen3_5` have no MTP layers: converted with --no-mtp, as
    // in `expected/commands.txt`.
    let copts = convert::pipeline::ConvertOptions {
        no_mtp: matches!(model, "qwen3_5_moe" | "qwen3_5_text" | "qwen3_5_moe_text"),
        ..Default::default()
    };
    convert::pipeline::convert_with(
        &dir,
        &out,
        Target::parse(ftype).unwrap(),
        &QuantizeOptions::default(),
        &copts,
    )
    .unwrap();
    let gguf = engine::model::open_gguf(&out).unwrap();
    engine::model::load(b, &gguf, &out).unwrap()
}

/// The logits of every position of `ids`, fed in one step into a fresh cache.
fn prompt_logits<B: Backend>(m: &dyn Model<B>, ids: &[u32]) -> Vec<Vec<f32>> {
    let mut scratch = m.scratch(64);
    let mut kv = m.new_kv(64, KvType::F16).unwrap();
    let all = m
        .forward(
            &mut scratch,
            &mut [SeqStep {
                kv: &mut kv,
                tokens: ids,
                pos0: 0,
                logits: Logits::All,
            }],
        )
        .unwrap();
    assert_eq!(all.len(), ids.len());
    all
}

/// Greedy decoding after the prompt, one token at a time through the cache.
fn greedy<B: Backend>(m: &dyn Model<B>, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut scratch = m.scratch(64);
    let mut kv = m.new_kv(prompt.len() + n + 1, KvType::F16).unwrap();
    let mut l = m
        .forward(
            &mut scratch,
            &mut [SeqStep {
                kv: &mut kv,
                tokens: prompt,
                pos0: 0,
                logits: Logits::Last,
            }],
        )
        .unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        let t = engine::sampler::argmax(&l[0]);
        out.push(t);
        l = m
            .forward(
                &mut scratch,
                &mut [SeqStep {
                    kv: &mut kv,
                    tokens: &[t],
                    pos0: prompt.len() + i,
                    logits: Logits::Last,
                }],
            )
            .unwrap();
    }
    out
}

fn check(model: &str, ftype: &str, tol: f32) {
    check_on(Arc::new(Cpu::new(2).unwrap()), model, ftype, tol, true);
}

/// The logits checks on backend `b`; with `serve`, the greedy continuation through the server too.
fn check_on<B: Backend>(b: Arc<B>, model: &str, ftype: &str, tol: f32, serve: bool) {
    let (root, _) = tiny_dir();
    let dir = root.join(model);
    let tmp = tempfile::tempdir().unwrap();
    let name = b.name();
    let m = load_on(b, model, ftype, tmp.path());
    let r = reference(&dir);
    let mut scratch = m.scratch(64);

    // The whole prompt in one step, logits for every position.
    let all = prompt_logits(&*m, &r.ids);
    let worst = all
        .iter()
        .zip(&r.logits)
        .map(|(a, b)| max_diff(a, b))
        .fold(0.0, f32::max);
    let lp = |v: &[f32]| engine::sampler::log_softmax(v);
    let worst_lp = all
        .iter()
        .zip(&r.logits)
        .map(|(a, b)| max_diff(&lp(a), &lp(b)))
        .fold(0.0, f32::max);
    let (a, b) = (lp(all.last().unwrap()), lp(r.logits.last().unwrap()));
    let mut top: Vec<usize> = (0..b.len()).collect();
    top.sort_by(|&i, &j| b[j].total_cmp(&b[i]));
    let last_top5 = top[..5].iter().map(|&i| (a[i] - b[i]).abs()).fold(0.0, f32::max);
    eprintln!("{model} {ftype} on {name}: batched max |Δlogit| = {worst:.2e} (tolerance {tol:.0e}), max |Δlogprob| = {worst_lp:.2e}, last-row top-5 |Δlogprob| = {last_top5:.2e}");
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

    if ftype == "f32" && !r.greedy.is_empty() {
        let got = greedy(&*m, &r.ids, r.greedy.len());
        assert_eq!(got, r.greedy, "{model}: greedy continuation on {name}");
        drop(m);
        if serve {
            through_serve(model, &tmp.path().join(format!("{model}.{ftype}.gguf")), &r, tol);
        }
    }
}

/// The same through `hf2q serve`: `/v1/completions` with the prompt as token ids, greedy, with
/// logprobs: the text is the reference continuation's, and the first token's log-probability is
/// transformers' within the logits tolerance (a log-probability moves by at most twice the largest
/// logit error).
fn through_serve(model: &str, gguf: &std::path::Path, r: &Reference, tol: f32) {
    let g = engine::model::open_gguf(gguf).unwrap();
    let tok = engine::tokenizer::Tokenizer::from_gguf(g.metadata()).unwrap();
    // The prompt text tokenizes to transformers' ids.
    let prompt: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tiny_dir().0.join(model).join("reference.json")).unwrap()).unwrap();
    let ids = tok.encode(prompt["prompt"].as_str().unwrap(), true, false).unwrap();
    assert_eq!(ids, r.ids, "{model}: tokenization of the reference prompt");
    let want = tok.decode(&r.greedy, false);
    let s = Server::start_with(&[gguf.to_path_buf()], &["-c", "128"]);
    let req = serde_json::json!({"prompt": r.ids, "max_tokens": r.greedy.len(), "temperature": 0,
        "logprobs": 1});
    let (st, v) = s.json("POST", "/v1/completions", req, None);
    assert_eq!(st, 200, "{model}: {v}");
    let c = &v["choices"][0];
    assert_eq!(c["text"].as_str(), Some(want.as_str()), "{model}: served greedy text");
    let first = c["logprobs"]["token_logprobs"][0].as_f64().unwrap() as f32;
    let lp = engine::sampler::log_softmax(r.logits.last().unwrap());
    let expect = lp[r.greedy[0] as usize];
    assert!(
        (first - expect).abs() <= 2.0 * tol,
        "{model}: served first-token logprob {first} vs transformers {expect}"
    );
    eprintln!("{model}: served text and first logprob match ({first:.5} vs {expect:.5})");
}

/// A quantized conversion loads and gives finite logits for the whole prompt.
fn runs_quantized(model: &str, ftype: &str) {
    let (root, _) = tiny_dir();
    let tmp = tempfile::tempdir().unwrap();
    let m = load(model, ftype, tmp.path());
    let r = reference(&root.join(model));
    let all = prompt_logits(&*m, &r.ids);
    assert!(
        all.iter().flatten().all(|v| v.is_finite()),
        "{model} {ftype}: non-finite logits"
    );
    let worst = all
        .iter()
        .zip(&r.logits)
        .map(|(a, b)| max_diff(a, b))
        .fold(0.0, f32::max);
    eprintln!("{model} {ftype}: max |Δlogit| = {worst:.2e} (quantized, not bounded)");
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
    let gemma = model.starts_with("gemma");
    check(model, "f32", if gemma { 1e-2 } else { 5e-3 });
    check(model, "f16", if gemma { 2e-2 } else { 1e-2 });
    if model != "llama" || full {
        runs_quantized(model, "q8_0");
        runs_quantized(model, "q4_k_m");
    }
}

#[test]
fn llama() {
    run("llama");
}

/// The CPU attending in f32 (`Cpu::with_f32_attention`, the reference of the quantized checks on
/// CUDA) follows transformers within the same F32 tolerances (llama; gemma4_moe, the most
/// sensitive family, with the full fixtures).
#[test]
fn cpu_f32_attention() {
    let (root, _) = tiny_dir();
    for (model, tol) in [("llama", 5e-3), ("gemma4_moe", 1e-2)] {
        if !root.join(model).is_dir() {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "NOT RUN: engine fixture {model} with f32 attention (not in {}; set HF2Q_FIXTURES)",
                root.display()
            );
            continue;
        }
        check_on(
            Arc::new(Cpu::new(2).unwrap().with_f32_attention()),
            model,
            "f32",
            tol,
            false,
        );
    }
}

#[test]
fn qwen2() {
    run("qwen2");
}

#[test]
fn qwen3() {
    run("qwen3");
}

#[test]
fn qwen3_moe() {
    run("qwen3_moe");
}

#[test]
fn gemma3() {
    run("gemma3");
}

#[test]
fn gemma4() {
    run("gemma4");
}

#[test]
fn gemma4_moe() {
    run("gemma4_moe");
}

#[test]
fn gemma4_ple() {
    run("gemma4_ple");
}

#[test]
fn qwen3_5() {
    run("qwen3_5");
}

#[test]
fn qwen3_5_moe() {
    run("qwen3_5_moe");
}

#[test]
fn qwen3_5_text() {
    run("qwen3_5_text");
}

#[test]
fn qwen3_5_moe_text() {
    run("qwen3_5_moe_text");
}

/// The Qwen 3.5 fixtures other than llama's committed copy need `HF2Q_FIXTURES`; a run without
/// them says so and returns false.
fn have_fixture(model: &str, what: &str) -> bool {
    let (root, full) = tiny_dir();
    if !full && !root.join(model).is_dir() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "NOT RUN: {what} (set HF2Q_FIXTURES to the full fixtures)"
        );
        return false;
    }
    true
}

/// Token ids for the hybrid tests: `n` ordinary tokens (below the fixtures' special ids), a
/// different sequence per seed.
fn ids(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7919 + seed * 104_729 + 13) % 1000).collect()
}

/// Chunked prefill equals token-by-token recurrence: a 150-token sequence (three chunks of the
/// delta rule, cut at positions 64 and 128) fed whole, in steps of 37 tokens and token by token
/// gives the same logits at every position. Steps of 37 and single tokens attend on the same
/// per-row path (f16 Q, f16 accumulation) and differ by f32 reorderings only (the delta rule's
/// chunked vs recurrent form, batched products), but a last-bit difference can flip the f16
/// rounding of a cached K or V value (2^-11 relative), which moves these logits (std ~0.33) by up to
/// ~1e-3: bound 1e-3 (measured 1.3e-4; the op test `recurrent` checks the two forms of the rule
/// alone to 1e-4 of the outputs' scale). The whole sequence attends on the tiled f32 path, which
/// differs from the per-row path by the f16 roundings the F32 fixture tolerance covers (5e-3).
#[test]
fn qwen3_5_chunked_prefill_equals_recurrence() {
    if !have_fixture("qwen3_5_text", "qwen3_5 chunked prefill vs recurrence") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let m = load("qwen3_5_text", "f32", tmp.path());
    let toks = ids(150, 1);
    let feed = |step: usize| -> Vec<Vec<f32>> {
        let mut scratch = m.scratch(160);
        let mut kv = m.new_kv(256, KvType::F16).unwrap();
        let mut out = Vec::new();
        for (i, chunk) in toks.chunks(step).enumerate() {
            out.extend(
                m.forward(
                    &mut scratch,
                    &mut [SeqStep {
                        kv: &mut kv,
                        tokens: chunk,
                        pos0: i * step,
                        logits: Logits::All,
                    }],
                )
                .unwrap(),
            );
        }
        out
    };
    let (whole, steps, single) = (feed(150), feed(37), feed(1));
    let worst = |a: &[Vec<f32>], b: &[Vec<f32>]| a.iter().zip(b).map(|(x, y)| max_diff(x, y)).fold(0.0, f32::max);
    let (d_steps, d_whole) = (worst(&steps, &single), worst(&whole, &single));
    eprintln!(
        "qwen3_5_text: max |Δlogit| steps of 37 vs token by token {d_steps:.2e}, whole vs token by token {d_whole:.2e}"
    );
    assert!(d_steps <= 1e-3, "chunked vs recurrent delta rule: {d_steps}");
    assert!(d_whole <= 5e-3, "whole prompt vs token by token: {d_whole}");
}

/// Rollback of drafted tokens on a hybrid model: five drafts fed in one step with a state
/// checkpoint after each, the sequence cut back to the first two (`kv_restore`: K/V by length, the
/// recurrent state from the checkpoint), then the right continuation: its logits equal those of a
/// run that only ever saw the two accepted drafts. Bound 1e-3: the two runs cut the same tokens
/// into different steps (f32 reorderings, which can flip an f16 rounding of a cached K/V value, as
/// in `qwen3_5_chunked_prefill_equals_recurrence`).
#[test]
fn qwen3_5_rollback_to_a_checkpoint() {
    if !have_fixture("qwen3_5_text", "qwen3_5 rollback") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let m = load("qwen3_5_text", "f32", tmp.path());
    let b = m.backend().clone();
    let (prompt, drafts, truth) = (ids(33, 6), ids(5, 7), ids(6, 8));
    let mut scratch = m.scratch(64);
    let step = |kv: &mut <Cpu as Backend>::Kv, scratch: &mut engine::model::Scratch, toks: &[u32], pos0: usize| {
        m.forward(
            scratch,
            &mut [SeqStep {
                kv,
                tokens: toks,
                pos0,
                logits: Logits::All,
            }],
        )
        .unwrap()
    };
    let mut straight = m.new_kv(64, KvType::F16).unwrap();
    step(&mut straight, &mut scratch, &prompt, 0);
    step(&mut straight, &mut scratch, &drafts[..2], 33);
    let want = step(&mut straight, &mut scratch, &truth, 35);
    let mut kv = m.new_kv(64, KvType::F16).unwrap();
    step(&mut kv, &mut scratch, &prompt, 0);
    b.kv_keep_states(&mut kv, &[34, 35, 36, 37, 38]);
    step(&mut kv, &mut scratch, &drafts, 33);
    assert_eq!(b.kv_state_pos(&kv), Some(38));
    // A step that does not start where the state ends is refused.
    let err = m.forward(
        &mut scratch,
        &mut [SeqStep {
            kv: &mut kv,
            tokens: &truth,
            pos0: 35,
            logits: Logits::Last,
        }],
    );
    assert!(err.is_err(), "a step at 35 over a state at 38");
    assert_eq!(b.kv_restore(&mut kv, 35), 35);
    let got = step(&mut kv, &mut scratch, &truth, 35);
    let worst = got.iter().zip(&want).map(|(a, w)| max_diff(a, w)).fold(0.0, f32::max);
    eprintln!("qwen3_5_text: after a rollback max |Δlogit| = {worst:.2e}");
    assert!(worst <= 1e-3, "logits after a rollback differ by {worst}");
}

/// The prefix cache on a hybrid model through `serve`: a second request sharing a 200-token prefix
/// resumes from the recurrent-state copy kept with the prefix's last whole page (position 192),
/// from the same slot, from the prefix cache after the slot served another prompt, and from
/// `--kv-persist` after a restart; each reports 192 cached tokens (`timings.prompt_n`: the rest)
/// and replies exactly as a server that computed the whole prompt. With `--prefill-chunk 64` every
/// step of the prompt is the same with and without the cache, so the replies are bit for bit equal.
#[test]
fn qwen3_5_prefix_cache_through_serve() {
    if !have_fixture("qwen3_5_text", "qwen3_5 prefix cache through serve") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tmp.path().join("qwen3_5_text.f32.gguf");
    drop(load("qwen3_5_text", "f32", tmp.path()));
    let prefix = ids(200, 2);
    let with = |tail: u32| -> Vec<u32> { prefix.iter().copied().chain(ids(30, tail)).collect() };
    let (pa, pb) = (with(3), with(4));
    let ask = |s: &Server, prompt: &[u32]| -> (String, u64, u64, f64) {
        let req = serde_json::json!({"prompt": prompt, "max_tokens": 8, "temperature": 0});
        let (st, v) = s.json("POST", "/v1/completions", req, None);
        assert_eq!(st, 200, "{v}");
        (
            v["choices"][0]["text"].as_str().unwrap().to_string(),
            v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
            v["timings"]["prompt_n"].as_u64().unwrap(),
            v["timings"]["prompt_ms"].as_f64().unwrap(),
        )
    };
    let persist = tmp.path().join("kv");
    let persist = persist.to_str().unwrap();
    let base = ["--parallel", "1", "--prefill-chunk", "64", "--ctx", "1024"];
    let cold = {
        let s = Server::start_with(std::slice::from_ref(&gguf), &base);
        ask(&s, &pb)
    };
    assert_eq!((cold.1, cold.2), (0, 230));
    let mut args = base.to_vec();
    args.extend(["--kv-persist", persist]);
    let check = |what: &str, got: (String, u64, u64, f64)| {
        eprintln!(
            "qwen3_5 prefix cache, {what}: cached {} of 230, prompt {:.1} ms (cold {:.1} ms)",
            got.1, got.3, cold.3
        );
        assert_eq!((got.1, got.2), (192, 38), "{what}: cached tokens");
        assert_eq!(got.0, cold.0, "{what}: reply");
    };
    {
        let s = Server::start_with(std::slice::from_ref(&gguf), &args);
        assert_eq!(ask(&s, &pa).1, 0);
        check("the same slot", ask(&s, &pb));
        // Another prompt takes the slot; the prefix comes back from the prefix cache.
        assert_eq!(ask(&s, &ids(150, 5)).1, 0);
        check("the prefix cache", ask(&s, &pb));
        // Blocks are written in the background: wait for the prefix's three while the server
        // lives (it is killed when dropped), counting whole blocks only (a block is written under
        // a temporary name, then renamed).
        let t = std::time::Instant::now();
        let files = || -> usize {
            std::fs::read_dir(persist)
                .map(|d| {
                    d.flatten()
                        .flat_map(|e| std::fs::read_dir(e.path()).into_iter().flatten())
                        .flatten()
                        .filter(|f| !f.file_name().to_string_lossy().starts_with(".tmp-"))
                        .count()
                })
                .unwrap_or(0)
        };
        while files() < 3 {
            assert!(t.elapsed().as_secs() < 20, "blocks not persisted");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let s = Server::start_with(std::slice::from_ref(&gguf), &args);
    check("--kv-persist after a restart", ask(&s, &pb));
}

/// Qwen 3.5's tool calls through serve, with Qwen3.5-4B's own chat template
/// (tests/data/tool_templates/qwen3_5.jinja; the fixtures carry Qwen3's): a required call is
/// forced in its `<tool_call><function=…><parameter=…>` syntax — after closing the thinking block
/// the template opens — and comes back as an OpenAI `tool_calls` entry whose arguments follow the
/// schema (the model is random: only the grammar makes the call, the schema leaves it no open-ended
/// value), plainly and streamed, with empty reasoning; the call and its result render back
/// through the template.
#[test]
fn qwen3_5_forced_tool_call_through_serve() {
    if !have_fixture("qwen3_5_text", "qwen3_5 tool call through serve") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tmp.path().join("qwen3_5_text.f32.gguf");
    drop(load("qwen3_5_text", "f32", tmp.path()));
    let tpl = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tool_templates/qwen3_5.jinja");
    let s = Server::start_with(&[gguf], &["-c", "2048", "--chat-template-file", tpl.to_str().unwrap()]);
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "metric": {"type": "boolean"},
            "days": {"enum": [1, 2, 3]}},
        "required": ["city", "metric", "days"]}}}]);
    let ask = serde_json::json!([{"role": "user", "content": "Weather in Paris?"}]);
    let req = serde_json::json!({"messages": ask, "tools": tools, "tool_choice": "required",
        "temperature": 0, "max_tokens": 200});
    let (st, v) = s.json("POST", "/v1/chat/completions", req.clone(), None);
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    let call = &c["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{v}");
    let args: serde_json::Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(
        args["city"].is_string() && args["metric"].is_boolean() && args["days"].is_i64(),
        "{args}"
    );
    assert!(
        c["message"]["reasoning_content"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{v}"
    );
    // Streamed: the same call as a tool_calls delta.
    let mut sreq = req.clone();
    sreq["stream"] = serde_json::json!(true);
    let (st, _, body) = s.request("POST", "/v1/chat/completions", Some(&sreq.to_string()), None);
    assert_eq!(st, 200);
    assert!(
        body.contains("\"tool_calls\"") && body.contains("get_weather"),
        "no tool_calls delta in {body}"
    );
    // Round trip: the call and its result go back through the template.
    let follow = serde_json::json!({"tools": tools, "temperature": 0, "max_tokens": 8, "messages": [
        ask[0],
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "{\"temp_c\": 18}"}]});
    let (st, v) = s.json("POST", "/v1/chat/completions", follow, None);
    assert_eq!(st, 200, "{v}");
}

/// Gemma 4 through serve with its own chat template: a required tool call is forced in Gemma 4's
/// call syntax and comes back as an OpenAI `tool_calls` entry whose arguments follow the schema
/// (the model is random: only the grammar makes the call, so the schema leaves it no open-ended
/// value to ramble in).
#[test]
fn gemma4_forced_tool_call_through_serve() {
    let (root, full) = tiny_dir();
    if !full && !root.join("gemma4").is_dir() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "NOT RUN: gemma4 tool call through serve (set HF2Q_FIXTURES to the full fixtures)"
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("gemma4.f32.gguf");
    convert::pipeline::convert(
        &root.join("gemma4"),
        &out,
        Target::parse("f32").unwrap(),
        &QuantizeOptions::default(),
    )
    .unwrap();
    let s = Server::start_with(&[out], &["-c", "512"]);
    let req = serde_json::json!({
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "metric": {"type": "boolean"},
                "days": {"enum": [1, 2, 3]}},
            "required": ["city", "metric", "days"]}}}],
        "tool_choice": "required", "temperature": 0, "max_tokens": 200});
    let (st, v) = s.json("POST", "/v1/chat/completions", req, None);
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    let call = &c["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{v}");
    let args: serde_json::Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(
        args["city"].is_string() && args["metric"].is_boolean() && args["days"].is_i64(),
        "{args}"
    );
}

/// Speculative decoding (n-gram drafts, each checked row computed as a decode step would
/// compute it) gives every fixture's greedy continuation token for token — on the hybrid models
/// the recurrent state goes back to the last kept draft through its per-token checkpoints.
#[test]
fn speculation_keeps_the_greedy_tokens() {
    use engine::generate::{generate, GenerateParams, LoadedModel, Session};
    let (root, full) = tiny_dir();
    let models: &[&str] = if full {
        &[
            "llama",
            "qwen3",
            "qwen3_moe",
            "gemma3",
            "gemma4",
            "qwen3_5",
            "qwen3_5_moe_text",
        ]
    } else {
        &["llama"]
    };
    for &model in models {
        let r = reference(&root.join(model));
        if r.greedy.is_empty() {
            continue;
        }
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(format!("{model}.f32.gguf"));
        drop(load_on(Arc::new(Cpu::new(2).unwrap()), model, "f32", tmp.path()));
        let m = LoadedModel::load(Arc::new(Cpu::new(2).unwrap()), &path).unwrap();
        for k in [2, 5] {
            let mut session = Session::new(&m, 64, KvType::F16, 64).unwrap();
            let params = GenerateParams {
                max_tokens: r.greedy.len(),
                sampling: engine::sampler::SamplingParams::greedy(),
                ignore_eos: true,
                spec: engine::spec::SpecMode::Ngram,
                draft_max: k,
                ..GenerateParams::default()
            };
            let g = generate(&m, &mut session, &r.ids, &params, |_| true).unwrap();
            eprintln!("{model} --draft-max {k}: {:?}", g.spec);
            assert_eq!(
                g.tokens, r.greedy,
                "{model}: greedy tokens with speculation (--draft-max {k})"
            );
        }
    }
}

/// The CUDA backend on GPU 0, or None after a visible line saying `what` did not run (no GPU).
fn cuda_or_skip(what: &str) -> Option<Arc<engine::backend::cuda::Cuda>> {
    if !engine::backend::select::cuda_present() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "NOT RUN: {what} (no NVIDIA GPU or driver on this machine)"
        );
        return None;
    }
    Some(Arc::new(
        engine::backend::cuda::Cuda::new(0).expect("the CUDA backend on a machine with a GPU"),
    ))
}

/// `decode_greedy` (each step's token fed to the next on the device where the backend can, the
/// host reading a step behind) gives the tokens of one-step-at-a-time greedy decoding on the same
/// backend, and stopping it part way leaves a cache the decoding goes on from.
fn decode_greedy_follows<B: Backend>(b: Arc<B>, model: &str) {
    let (root, _) = tiny_dir();
    let r = reference(&root.join(model));
    let tmp = tempfile::tempdir().unwrap();
    let m = load_on(b.clone(), model, "f32", tmp.path());
    let n = 8;
    let want = greedy(m.as_ref(), &r.ids, n);
    let p0 = r.ids.len() - 1;
    let mut scratch = m.scratch(64);
    let mut kv = m.new_kv(r.ids.len() + n + 1, KvType::F16).unwrap();
    let prefill = |kv: &mut <B as Backend>::Kv, scratch: &mut engine::model::Scratch| {
        m.forward(
            scratch,
            &mut [SeqStep {
                kv,
                tokens: &r.ids[..p0],
                pos0: 0,
                logits: Logits::None,
            }],
        )
        .unwrap();
    };
    prefill(&mut kv, &mut scratch);
    let mut got = Vec::new();
    let k = engine::model::decode_greedy(m.as_ref(), &mut scratch, &mut kv, r.ids[p0], p0, n, |t| {
        got.push(t);
        true
    })
    .unwrap();
    assert_eq!((k, &got), (n, &want), "{model} on {}: decode_greedy", b.name());
    // Stopped after 3 (a fourth step already begun is dropped), then on from there.
    let mut kv = m.new_kv(r.ids.len() + n + 1, KvType::F16).unwrap();
    prefill(&mut kv, &mut scratch);
    let mut got = Vec::new();
    let k = engine::model::decode_greedy(m.as_ref(), &mut scratch, &mut kv, r.ids[p0], p0, n, |t| {
        got.push(t);
        got.len() < 3
    })
    .unwrap();
    assert_eq!(k, 3);
    engine::model::decode_greedy(m.as_ref(), &mut scratch, &mut kv, got[2], p0 + 3, n - 3, |t| {
        got.push(t);
        true
    })
    .unwrap();
    assert_eq!(got, want, "{model} on {}: decode_greedy stopped and resumed", b.name());
}

#[test]
fn decode_greedy_on_cpu() {
    if !have_fixture("llama", "decode_greedy") {
        return;
    }
    decode_greedy_follows(Arc::new(Cpu::new(2).unwrap()), "llama");
}

/// The same on CUDA, where the tokens are fed on the device (GPU 0).
#[test]
fn decode_greedy_on_cuda() {
    let Some(b) = cuda_or_skip("decode_greedy on CUDA") else {
        return;
    };
    assert!(b.feeds_tokens(), "the CUDA backend feeds tokens on the device");
    for model in ["llama", "qwen3_moe"] {
        if have_fixture(model, "decode_greedy on CUDA") {
            decode_greedy_follows(b.clone(), model);
        }
    }
}

/// The same fixtures, F32 and F16, on the CUDA backend with the same tolerances (GPU 0). Without a
/// GPU this does not run, and says so.
#[test]
fn fixtures_on_cuda() {
    use std::io::Write;
    let Some(b) = cuda_or_skip("engine fixtures on CUDA") else {
        return;
    };
    let (root, _) = tiny_dir();
    // (The quantized files' checks are gathered, so that one run shows every model's.)
    let mut failed = Vec::new();
    for model in [
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
    ] {
        if !root.join(model).is_dir() {
            let _ = writeln!(
                std::io::stderr(),
                "NOT RUN: engine fixture {model} on CUDA (not in {})",
                root.display()
            );
            continue;
        }
        let gemma = model.starts_with("gemma");
        check_on(b.clone(), model, "f32", if gemma { 1e-2 } else { 5e-3 }, false);
        check_on(b.clone(), model, "f16", if gemma { 2e-2 } else { 1e-2 }, false);
        for ftype in ["q8_0", "q4_k_m"] {
            failed.extend(quantized_follows_cpu(
                b.clone(),
                model,
                ftype,
                if gemma { 0.2 } else { 3e-2 },
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "quantized files on CUDA against the CPU: {failed:#?}"
    );
}

/// A quantized conversion on backend `b` against the CPU backend on the same file, the whole
/// prompt in one step. The CUDA backend multiplies Q8_0 and the K-quants as integers from the
/// CPU's rounded activations (equal up to f32 summation order) and attends in f32; the CPU
/// reference here attends in f32 too (`Cpu::with_f32_attention`: ggml's CPU flash attention, which
/// the CPU follows by default, rounds Q and softmax·V to f16 for short batches, and on these
/// sensitive random models that alone moves the Q8_0 logits by up to 0.32 (gemma4_moe), 0.058
/// (gemma4_ple), 8e-3 (llama): HF2Q_DUMP on one prompt, bench/runs/2026-12-03-h200/cuda-session4).
/// The default CPU's difference is printed beside it. What is left is the products of other types
/// (f16 tensor cores for prompts) and summation orders; the activations' rounding to 127 levels per
/// block turns such small differences into a whole quantization step (1/127 of the block's largest
/// value; for the K-quants' q8_K one scale covers all 256 values of these fixtures' rows) wherever
/// a value sits near a rounding boundary. Measured on an H200 against the default CPU
/// (bench/runs/2026-12-03-h200/cuda-mmq/call5): Llama and Qwen fixtures 1.1-1.6e-2 (Q8_0) and
/// 1.6-2.2e-2 (Q4_K_M) — an order of magnitude under what the quantization itself moves the logits
/// from transformers' (0.2-0.4 for Q4_K_M), and a layout or indexing fault moves them by whole
/// units: held to 3e-2. Gemma 4 attends with scale 1 over normed q/k: its logits move ~20× more
/// than the others' under the same rounding (F32 on CUDA against transformers 5.9e-3, the others
/// 2.5-3.6e-4): the Gemma families are held to 0.2.
fn quantized_follows_cpu<B: Backend>(b: Arc<B>, model: &str, ftype: &str, tol: f32) -> Option<String> {
    let (root, _) = tiny_dir();
    let r = reference(&root.join(model));
    let tmp = tempfile::tempdir().unwrap();
    let name = b.name();
    let gpu = load_on(b, model, ftype, tmp.path());
    let cpu = load_on(
        Arc::new(Cpu::new(2).unwrap().with_f32_attention()),
        model,
        ftype,
        tmp.path(),
    );
    let cpu16 = load(model, ftype, tmp.path());
    let (g, c) = (prompt_logits(&*gpu, &r.ids), prompt_logits(&*cpu, &r.ids));
    let batched = g.iter().zip(&c).map(|(a, b)| max_diff(a, b)).fold(0.0, f32::max);
    let c16 = prompt_logits(&*cpu16, &r.ids);
    let vs16 = g.iter().zip(&c16).map(|(a, b)| max_diff(a, b)).fold(0.0, f32::max);
    let n = r.ids.len().min(12);
    let (gs, cs) = (greedy(&*gpu, &r.ids[..n], 8), greedy(&*cpu, &r.ids[..n], 8));
    eprintln!("{model} {ftype} on {name} vs the CPU attending in f32: batched max |Δlogit| = {batched:.2e} (tolerance {tol:.0e}; {vs16:.2e} from the default CPU's f16 attention); greedy {gs:?} / {cs:?}");
    (batched > tol).then(|| format!("{model} {ftype}: {name}'s logits differ from the CPU's by {batched}"))
}
