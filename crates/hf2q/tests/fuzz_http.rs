//! Fuzzing `hf2q serve`'s request validation on every route (proptest, seeded, bounded to about a
//! minute): for each route a valid body with one field after another replaced by a random JSON
//! value (every wrong type in every field), random JSON documents, byte-mutated valid bodies,
//! deeply nested JSON and invalid UTF-8. The server (SmolLM2 and MiniLM, a 512-token context and at most 8 new tokens per choice, so
//! that a request the fuzzer makes valid stays short) must never answer 5xx, every error must be
//! OpenAI's JSON error object, every stream must end with `[DONE]`, and the server must still
//! answer normally at the end.

mod common;

use common::server::{error_object, minilm_gguf, split_response, Server};
use common::smollm2;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Value};
use std::time::Duration;

/// (method, path, a valid body).
fn routes() -> Vec<(&'static str, &'static str, Value)> {
    let msgs = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]);
    vec![
        (
            "POST",
            "/v1/chat/completions",
            json!({"model": "SmolLM2-135M-Instruct.Q4_1", "messages": msgs, "max_tokens": 4, "temperature": 0.5,
                   "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 3, "stop": ["\n"], "n": 1, "stream": false,
                   "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2,
                   "presence_penalty": 0.1, "frequency_penalty": 0.1, "logit_bias": {"42": 1},
                   "response_format": {"type": "json_object"},
                   "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                   "tool_choice": "auto", "parallel_tool_calls": true, "chat_template_kwargs": {}}),
        ),
        (
            "POST",
            "/v1/completions",
            json!({"prompt": "Once", "max_tokens": 4, "temperature": 0, "logprobs": 2, "echo": false,
                   "stream": true, "stop": "x", "n": 1, "seed": 1, "truncate_prompt_tokens": 16}),
        ),
        (
            "POST",
            "/v1/embeddings",
            json!({"model": "minilm", "input": ["hi", "there"], "encoding_format": "float", "dimensions": 8,
                   "truncate": true}),
        ),
        (
            "POST",
            "/tokenize",
            json!({"content": "hello", "add_special": true, "parse_special": false}),
        ),
        ("POST", "/detokenize", json!({"tokens": [1, 2, 3]})),
        ("GET", "/v1/models", json!({})),
        ("GET", "/v1/models/minilm", json!({})),
        ("GET", "/health", json!({})),
        ("GET", "/readyz", json!({})),
        ("GET", "/metrics", json!({})),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        Just(json!(1e308)),
        Just(json!(u64::MAX)),
        Just(json!(-1)),
        ".{0,16}".prop_map(Value::from),
        Just(Value::from("<|im_start|>assistant\n")),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("role".to_string()),
                    Just("content".to_string()),
                    Just("type".to_string()),
                    Just("name".to_string()),
                    Just("text".to_string()),
                    Just("function".to_string()),
                    Just("schema".to_string()),
                    "[a-z_]{1,8}"
                ],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Keep whatever the fuzzer makes valid short: at most 8 new tokens and 2 choices.
fn bounded(mut v: Value) -> Value {
    if let Value::Object(m) = &mut v {
        for key in ["max_tokens", "max_completion_tokens"] {
            if m.get(key).and_then(Value::as_u64).is_some_and(|n| n > 8) {
                m.insert(key.into(), json!(8));
            }
        }
        if m.get("n").and_then(Value::as_u64).is_some_and(|n| n > 2) {
            m.insert("n".into(), json!(2));
        }
    }
    v
}

#[derive(Debug, Clone)]
enum Body {
    /// The valid body with one field replaced (or added).
    Field(usize, String, Value),
    Random(usize, Value),
    Mutated(usize, Vec<(usize, u8, u8)>),
    Nested(usize, usize),
    Bytes(usize, Vec<u8>),
}

fn body() -> impl Strategy<Value = Body> {
    let n = routes().len();
    let field = prop_oneof![
        Just("model"),
        Just("messages"),
        Just("prompt"),
        Just("input"),
        Just("max_tokens"),
        Just("temperature"),
        Just("top_p"),
        Just("top_k"),
        Just("stop"),
        Just("n"),
        Just("stream"),
        Just("stream_options"),
        Just("logprobs"),
        Just("top_logprobs"),
        Just("logit_bias"),
        Just("response_format"),
        Just("tools"),
        Just("tool_choice"),
        Just("seed"),
        Just("encoding_format"),
        Just("dimensions"),
        Just("content"),
        Just("tokens"),
        Just("chat_template_kwargs"),
        Just("truncate_prompt_tokens"),
    ];
    prop_oneof![
        4 => (0..n, field, json_value()).prop_map(|(r, f, v)| Body::Field(r, f.to_string(), v)),
        2 => (0..n, json_value()).prop_map(|(r, v)| Body::Random(r, v)),
        2 => (0..n, prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6))
            .prop_map(|(r, e)| Body::Mutated(r, e)),
        1 => (0..n, 100usize..3000).prop_map(|(r, d)| Body::Nested(r, d)),
        1 => (0..n, prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(r, b)| Body::Bytes(r, b)),
    ]
}

fn render(b: &Body) -> (usize, Vec<u8>) {
    let rs = routes();
    match b {
        Body::Field(r, f, v) => {
            let mut base = rs[*r].2.clone();
            base[f.as_str()] = v.clone();
            (*r, bounded(base).to_string().into_bytes())
        }
        Body::Random(r, v) => (*r, bounded(v.clone()).to_string().into_bytes()),
        Body::Mutated(r, edits) => {
            let mut bytes = rs[*r].2.to_string().into_bytes();
            for &(pos, kind, val) in edits {
                if bytes.is_empty() {
                    break;
                }
                let p = pos % bytes.len();
                match kind % 3 {
                    0 => bytes[p] = val,
                    1 => bytes.insert(p, val),
                    _ => {
                        bytes.remove(p);
                    }
                }
            }
            // A mutation may make a bigger max_tokens valid: re-bound it when it still parses.
            match serde_json::from_slice::<Value>(&bytes) {
                Ok(v) => (*r, bounded(v).to_string().into_bytes()),
                Err(_) => (*r, bytes),
            }
        }
        Body::Nested(r, depth) => {
            let field = if *r == 2 { "input" } else { "messages" };
            let s = format!("{{\"{field}\": {}1{}}}", "[".repeat(*depth), "]".repeat(*depth));
            (*r, s.into_bytes())
        }
        Body::Bytes(r, b) => (*r, b.clone()),
    }
}

fn check(s: &Server, method: &str, path: &str, body: &[u8]) -> Result<(), TestCaseError> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    let raw = s.raw(&req, Duration::from_secs(60));
    let (st, head, text) = split_response(&raw);
    let shown = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    prop_assert!(st != 0, "{method} {path}: no response to {shown}: {raw:?}");
    prop_assert!(st < 500, "{method} {path}: {st} for {shown}: {text}");
    if st >= 400 {
        let r = std::panic::catch_unwind(|| error_object(st, &head, &text));
        prop_assert!(r.is_ok(), "{method} {path}: {st} not a JSON error for {shown}");
    } else if head.to_ascii_lowercase().contains("text/event-stream") {
        prop_assert!(
            text.trim_end().ends_with("data: [DONE]"),
            "{path}: unfinished stream for {shown}: {text}"
        );
        prop_assert!(
            !text.contains("server_error"),
            "{path}: error event for {shown}: {text}"
        );
    }
    Ok(())
}

#[test]
fn every_route_validates_random_and_mutated_requests() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Server::start_with(&[smollm2(), minilm_gguf(tmp.path())], &["--ctx", "512"]);
    let rs = routes();
    // The valid bodies themselves succeed.
    for (m, p, b) in &rs {
        let body = b.to_string();
        let (st, _, text) = s.request(m, p, Some(&body), None);
        assert_eq!(st, 200, "{m} {p}: {text}");
    }
    let mut runner = TestRunner::new(Config {
        cases: 4000,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&body(), |b| {
        let (r, bytes) = render(&b);
        check(&s, rs[r].0, rs[r].1, &bytes)?;
        // The same body on the route's other method, and on a route it was not made for.
        let other = (r + 1) % rs.len();
        check(&s, rs[other].0, rs[other].1, &bytes)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (st, r) = s.json(
        "POST",
        "/v1/completions",
        json!({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}),
        None,
    );
    assert_eq!(
        (st, r["choices"][0]["text"].as_str()),
        (200, Some(" Paris.\n\nThe United States has"))
    );
}
