//! `hf2q serve --spec ngram` on the real SmolLM2 model: speculative decoding inside continuous
//! batching gives llama.cpp's golden greedy replies (plain and streamed, two at a time), counts its
//! checks in `/metrics`, and sampled requests run to their token limit.

mod common;

use common::server::Server;
use serde_json::{json, Value};

fn q4_1_goldens() -> Vec<(String, String)> {
    let g: Value = serde_json::from_str(include_str!("data/goldens/smollm2_chat_goldens.json")).unwrap();
    g.as_array()
        .unwrap()
        .iter()
        .filter(|x| x["quant"] == "Q4_1")
        .map(|x| {
            (
                x["prompt"].as_str().unwrap().to_string(),
                x["text"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn metric(body: &str, name: &str) -> u64 {
    body.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{body}"))
}

#[test]
fn speculative_replies_are_the_goldens() {
    let s = std::sync::Arc::new(Server::start(&[
        "--parallel",
        "2",
        "--spec",
        "ngram",
        "--draft-max",
        "6",
    ]));
    let cases = q4_1_goldens();
    let mut handles = Vec::new();
    for k in 0..6 {
        let (prompt, want) = cases[k % cases.len()].clone();
        let s = s.clone();
        handles.push(std::thread::spawn(move || {
            let req = json!({"temperature": 0, "max_tokens": 64, "stream": k % 2 == 0,
                             "messages": [{"role": "user", "content": prompt}]});
            let (st, _, body) = s.request("POST", "/v1/chat/completions", Some(&req.to_string()), None);
            assert_eq!(st, 200, "{body}");
            assert_eq!(common::server::chat_text(&body, k % 2 == 0), want, "request {k}");
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    // A reply that repeats its prompt: drafts are checked and most are kept.
    let text = "one two three four five six seven eight nine ten ".repeat(6);
    let req = json!({"temperature": 0, "max_tokens": 48,
                     "messages": [{"role": "user", "content": format!("Repeat exactly: {text}")}]});
    let (st, r) = s.json("POST", "/v1/chat/completions", req, None);
    assert_eq!(st, 200, "{r}");
    let (_, _, m) = s.request("GET", "/metrics", None, None);
    let (checks, drafted, accepted) = (
        metric(&m, "hf2q_spec_checks_total"),
        metric(&m, "hf2q_spec_draft_tokens_total"),
        metric(&m, "hf2q_spec_accepted_tokens_total"),
    );
    assert!(
        checks > 0 && drafted >= checks && accepted <= drafted,
        "{checks} {drafted} {accepted}"
    );
    // Sampled requests keep drafts with their probability; they end at their token limit.
    let req = json!({"temperature": 0.9, "seed": 5, "max_tokens": 40, "top_k": 20,
                     "messages": [{"role": "user", "content": format!("Repeat exactly: {text}")}]});
    let (st, r) = s.json("POST", "/v1/chat/completions", req, None);
    assert_eq!(st, 200, "{r}");
    let n = r["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(
        n <= 40 && (r["choices"][0]["finish_reason"] == "length") == (n == 40),
        "{r}"
    );
}
