//! `hf2q serve` on a real Gemma 3 (Gemma 3 270M Q4_K_M, fetched by scripts/fetch-models): many
//! concurrent streams give the replies each gives alone, and a prefix repeated across slots is
//! served from shared KV pages (reported in `cached_tokens`, counted once in the pool).

mod common;

use common::server::Server;
use serde_json::{json, Value};
use std::sync::Arc;

fn gemma3() -> std::path::PathBuf {
    let p = common::models_dir().join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-models first",
        p.display()
    );
    p
}

fn complete(s: &Server, prompt: &str, max_tokens: usize) -> Value {
    // (text prompts: the server adds BOS)
    let (st, r) = s.json(
        "POST",
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}),
        None,
    );
    assert_eq!(st, 200, "{r}");
    r
}

fn metric(m: &str, name: &str) -> usize {
    m.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or_else(|| panic!("{name} missing from {m}"))
        .parse()
        .unwrap()
}

/// 16 streams at once on 16 slots: each reply equals the one its prompt gets alone. A reply
/// depends on the prompt and on how much of it came from a cache (a prompt resumed after cached
/// tokens is cut into other steps, and Gemma's Q4_K/Q6_K products sum a row in an order that
/// depends on how many rows are multiplied together, as llama.cpp's do); so that only concurrency
/// differs, the prompts are token ids without BOS that share no first token, on fresh servers:
/// nothing is ever reused.
#[test]
fn sixteen_concurrent_streams_match_one_at_a_time() {
    let words = [
        "Mars",
        "Venus",
        "Jupiter",
        "Saturn",
        "Rivers",
        "Mountains",
        "Bread",
        "Music",
        "Cats",
        "Trains",
        "Winter",
        "Oceans",
        "Bees",
        "Libraries",
        "Volcanoes",
        "Chess",
    ];
    let one = Server::start_with(&[gemma3()], &["--parallel", "1", "--ctx", "256"]);
    let prompts: Vec<Value> = words
        .iter()
        .map(|w| {
            one.json(
                "POST",
                "/tokenize",
                json!({"content": format!("{w} are interesting because")}),
                None,
            )
            .1["tokens"]
                .clone()
        })
        .collect();
    let firsts: std::collections::HashSet<String> = prompts.iter().map(|p| p[0].to_string()).collect();
    assert_eq!(firsts.len(), 16, "the prompts' first tokens differ");
    let ask = |s: &Server, p: &Value| {
        let (st, r) = s.json(
            "POST",
            "/v1/completions",
            json!({"prompt": p, "max_tokens": 24, "temperature": 0}),
            None,
        );
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{r}");
        r["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let alone: Vec<String> = prompts.iter().map(|p| ask(&one, p)).collect();
    drop(one);
    let s = Arc::new(Server::start_with(&[gemma3()], &["--parallel", "16", "--ctx", "256"]));
    let hs: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (s, p) = (s.clone(), p.clone());
            std::thread::spawn(move || ask(&s, &p))
        })
        .collect();
    for (i, h) in hs.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), alone[i], "stream {i} ({})", words[i]);
    }
}

/// A long prefix left by one request is mapped into four concurrent requests on other slots:
/// each reports it in `cached_tokens` and replies as without the cache, and the pool holds the
/// prefix's pages once (copies would need four times the prefix's positions on their own).
#[test]
fn a_repeated_prefix_is_served_from_shared_pages() {
    let s = Arc::new(Server::start_with(&[gemma3()], &["--parallel", "4", "--ctx", "1024"]));
    let prefix: String = (0..40)
        .map(|i| format!("Line {i}: the quick brown fox jumps over the lazy dog. "))
        .collect();
    let (_, t) = s.json("POST", "/tokenize", json!({"content": prefix}), None);
    let n_prefix = t["tokens"].as_array().unwrap().len();
    assert!(n_prefix >= 4 * 64, "prefix of {n_prefix} tokens");
    let full_blocks = n_prefix / 64 * 64;
    // Replies without any cache to compare with (a fresh server per suffix would be slow: the
    // first request of each suffix on this server runs before any of its blocks are cached).
    let suffixes = ["Summary:", "Count:", "Animal:", "Colour:"];
    let reference = Server::start_with(&[gemma3()], &["--parallel", "1", "--ctx", "1024"]);
    let want: Vec<String> = suffixes
        .iter()
        .map(|x| {
            // The one slot is reset between prompts that share nothing: a different first word.
            let r = complete(&reference, &format!("{prefix}{x}"), 16);
            let _ = complete(&reference, "Unrelated.", 1);
            r["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    drop(reference);
    let first = complete(&s, &format!("{prefix}Hello:"), 4);
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{first}");
    let hs: Vec<_> = suffixes
        .iter()
        .map(|x| {
            let (s, p) = (s.clone(), format!("{prefix}{x}"));
            std::thread::spawn(move || complete(&s, &p, 16))
        })
        .collect();
    let got: Vec<Value> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    for (i, r) in got.iter().enumerate() {
        let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() as usize;
        assert!(
            cached >= full_blocks,
            "request {i}: cached {cached} of {n_prefix} prefix tokens"
        );
        assert_eq!(r["choices"][0]["text"].as_str().unwrap(), want[i], "request {i}");
    }
    let m = s.request("GET", "/metrics", None, None).2;
    let held = metric(&m, "hf2q_kv_tokens{") + metric(&m, "hf2q_kv_cached_tokens{");
    assert!(
        held < 4 * full_blocks,
        "the pool holds {held} positions: the {full_blocks}-token prefix was copied, not shared"
    );
    eprintln!("prefix {n_prefix} tokens, pool holds {held} positions after 5 requests on 4 slots");
}
