//! `hf2q serve` end to end on the real SmolLM2 model: OpenAI-shaped responses (plain and
//! streamed) whose greedy text equals llama.cpp's golden reply, prefix reuse reported in
//! `cached_tokens`, auth, OpenAI-shaped errors, tokenize/detokenize, metrics, graceful SIGTERM.
//! The client is a few lines of HTTP/1.1 over a TCP socket (no client library needed).

mod common;

use common::server::Server;
use common::smollm2;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// llama.cpp's greedy chat replies for the Q4_1 model: (prompt, reply) pairs.
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

fn golden_q4_1() -> (String, String) {
    q4_1_goldens().swap_remove(0)
}

#[test]
fn chat_completions_plain_and_streamed_match_llama_cpp() {
    let s = Server::start(&["--api-key", "sekret"]);
    let key = Some("sekret");
    let (prompt, want) = golden_q4_1();
    let req = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "temperature": 0, "max_tokens": 64,
                     "messages": [{"role": "user", "content": prompt}], "future_field": 1});
    let (st, r) = s.json("POST", "/v1/chat/completions", req.clone(), key);
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["object"], "chat.completion");
    assert!(r["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    assert_eq!(r["choices"][0]["message"]["content"], want.as_str());
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(r["usage"]["prompt_tokens"], 37);
    assert_eq!(r["usage"]["completion_tokens"], 64);
    assert_eq!(r["usage"]["total_tokens"], 101);

    // Streamed, same prompt: the text is the same and the prompt prefix comes from the cache.
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let (st, head, body) = s.request("POST", "/v1/chat/completions", Some(&sreq.to_string()), key);
    assert_eq!(st, 200);
    assert!(head.to_ascii_lowercase().contains("text/event-stream"), "{head}");
    let events: Vec<&str> = body.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).collect();
    assert_eq!(*events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, want);
    let fin = chunks
        .iter()
        .find(|c| c["choices"][0]["finish_reason"].is_string())
        .unwrap();
    assert_eq!(fin["choices"][0]["finish_reason"], "length");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 64);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 36);
}

#[test]
fn completions_tokenize_models_metrics() {
    let s = Server::start(&[]);
    let (st, r) = s.json(
        "POST",
        "/v1/completions",
        json!({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}),
        None,
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["choices"][0]["text"], " Paris.\n\nThe United States has");
    let (st, r) = s.json("POST", "/tokenize", json!({"content": "<|im_start|>hello"}), None);
    assert_eq!(st, 200);
    let toks = r["tokens"].clone();
    assert_eq!(toks[0], 1);
    let (st, r) = s.json("POST", "/detokenize", json!({"tokens": toks}), None);
    assert_eq!((st, r["content"].as_str().unwrap()), (200, "<|im_start|>hello"));
    let (st, r) = s.json("GET", "/v1/models", json!({}), None);
    assert_eq!(st, 200);
    assert_eq!(r["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
    // The engine updates its gauges just after the reply went out: wait for the slot to be idle.
    let t = Instant::now();
    let m = loop {
        let (st, _, m) = s.request("GET", "/metrics", None, None);
        assert_eq!(st, 200);
        if m.contains("hf2q_active_slots{model=\"SmolLM2-135M-Instruct.Q4_1\"} 0") {
            break m;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{m}");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        m.contains("hf2q_requests_total{route=\"/v1/completions\",status=\"200\"} 1"),
        "{m}"
    );
    assert!(m.contains("hf2q_completion_tokens_total 8"), "{m}");
    assert!(m.contains("hf2q_time_to_first_token_seconds_count 1"), "{m}");
    assert!(m.contains("hf2q_request_duration_seconds_count 1"), "{m}");
    assert!(m.contains("hf2q_inter_token_latency_seconds_count"), "{m}");
    // The completion's 5 prompt + 8 generated tokens (minus the last, never fed) stay cached in
    // one page of 64 positions; nothing is in use by a request any more.
    assert!(
        m.contains("hf2q_kv_cached_tokens{model=\"SmolLM2-135M-Instruct.Q4_1\"} 64"),
        "{m}"
    );
    assert!(
        m.contains("hf2q_kv_tokens{model=\"SmolLM2-135M-Instruct.Q4_1\"} 0"),
        "{m}"
    );
    assert!(
        m.contains("hf2q_kv_capacity_tokens{model=\"SmolLM2-135M-Instruct.Q4_1\"} 16384"),
        "{m}"
    );
}

#[test]
fn errors_are_openai_shaped() {
    let s = Server::start(&["--api-key", "k", "--ctx", "64"]);
    let key = Some("k");
    let err = |st: u16, r: &Value, want: u16, needle: &str| {
        assert_eq!(st, want, "{r}");
        let e = &r["error"];
        assert!(e["message"].as_str().unwrap().contains(needle), "{r}");
        assert!(e["type"].is_string(), "{r}");
    };
    let (st, r) = s.json("GET", "/v1/models", json!({}), None);
    err(st, &r, 401, "API key");
    let (st, _, _) = s.request("GET", "/health", None, None);
    assert_eq!(st, 200);
    let (st, _, b) = s.request("POST", "/v1/chat/completions", Some("{not json"), key);
    err(st, &serde_json::from_str(&b).unwrap(), 400, "malformed JSON");
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": msgs, "temperature": "hot"}),
        key,
    );
    err(st, &r, 400, "temperature");
    assert_eq!(r["error"]["param"], "temperature");
    // With one chat model, a name it does not have is that model (as llama-server answers agents
    // that send a fixed "gpt-4"), and the reply says which served it.
    let body = json!({"messages": msgs, "model": "gpt-4", "max_tokens": 2}).to_string();
    let (st, head, b) = s.request("POST", "/v1/chat/completions", Some(&body), key);
    assert_eq!(st, 200, "{b}");
    let served = smollm2().file_stem().unwrap().to_string_lossy().into_owned();
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("x-hf2q-model: {}", served.to_ascii_lowercase())),
        "{head}"
    );
    // llama-server's GBNF `grammar` constrains the reply; a malformed one is a 400 naming it.
    let g = "root ::= answer \".\"\nanswer ::= \"yes\" | \"no\"";
    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": msgs, "grammar": g, "max_tokens": 8}),
        key,
    );
    assert_eq!(st, 200, "{r}");
    let reply = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(reply == "yes." || reply == "no.", "{reply:?}");
    let (st, r) = s.json(
        "POST",
        "/v1/completions",
        json!({"prompt": "Answer:", "grammar": "root ::= [0-9]{2} \"!\"", "max_tokens": 8}),
        key,
    );
    assert_eq!(st, 200, "{r}");
    let text = r["choices"][0]["text"].as_str().unwrap();
    assert!(
        text.len() == 3 && text.ends_with('!') && text[..2].bytes().all(|b| b.is_ascii_digit()),
        "{text:?}"
    );
    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": msgs, "grammar": "root ::= \"open"}),
        key,
    );
    err(st, &r, 400, "grammar");
    // llama-server's /tokenize with pieces, and /apply-template.
    let (st, r) = s.json(
        "POST",
        "/tokenize",
        json!({"content": "Hello world", "with_pieces": true}),
        key,
    );
    assert_eq!(st, 200, "{r}");
    let pieces: String = r["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["piece"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(pieces, "Hello world", "{r}");
    assert!(r["tokens"][0]["id"].is_u64(), "{r}");
    let (st, r) = s.json("POST", "/apply-template", json!({"messages": msgs}), key);
    assert_eq!(st, 200, "{r}");
    assert!(r["prompt"].as_str().unwrap().contains("hi"), "{r}");
    let (st, r) = s.json("POST", "/v1/chat/completions", json!({"messages": msgs, "n": 17}), key);
    err(st, &r, 400, "at most 16");
    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": msgs, "top_logprobs": 3}),
        key,
    );
    err(st, &r, 400, "needs 'logprobs'");
    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": [{"role": "wizard", "content": "x"}]}),
        key,
    );
    err(st, &r, 400, "wizard");
    let long = "word ".repeat(200);
    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": long}]}),
        key,
    );
    err(st, &r, 400, "context");
    assert_eq!(r["error"]["code"], "context_length_exceeded");
    // Left truncation when the request asks for it.
    let (st, r) = s.json(
        "POST",
        "/v1/completions",
        json!({"prompt": long, "truncate_prompt_tokens": 32, "max_tokens": 4}),
        key,
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["usage"]["prompt_tokens"], 32);
    let (st, r) = s.json("POST", "/v1/completions", json!({"prompt": [1, 999999]}), key);
    err(st, &r, 400, "999999");
    let (st, r) = s.json("POST", "/v1/embeddings", json!({"input": "x"}), key);
    err(st, &r, 400, "not an embedding model");
    let (st, r) = s.json("GET", "/nope", json!({}), key);
    err(st, &r, 404, "no such route");
}

#[test]
fn sigterm_shuts_down_cleanly() {
    let mut s = Server::start(&[]);
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "server did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Four conversations at once (continuous batching over 2 slots, the rest queued): each reply is
/// exactly llama.cpp's golden greedy reply, as when run alone.
#[test]
fn concurrent_requests_get_the_same_replies() {
    let s = std::sync::Arc::new(Server::start(&["--parallel", "2"]));
    let cases = q4_1_goldens();
    let mut handles = Vec::new();
    for k in 0..4 {
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
}

/// `n` choices share the request (each its own sequence, seeds seed+i) and `logprobs` report the
/// sampled token's log-probability with the `top_logprobs` alternatives, plain and streamed.
#[test]
fn n_choices_and_logprobs() {
    let s = Server::start(&["--parallel", "2"]);
    let (prompt, want) = golden_q4_1();
    let req = json!({"temperature": 0, "max_tokens": 64, "n": 2, "logprobs": true, "top_logprobs": 3,
                     "messages": [{"role": "user", "content": prompt}]});
    let (st, r) = s.json("POST", "/v1/chat/completions", req.clone(), None);
    assert_eq!(st, 200, "{r}");
    let choices = r["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["content"], want.as_str());
        let lps = c["logprobs"]["content"].as_array().unwrap();
        assert_eq!(lps.len(), 64);
        let mut joined = String::new();
        for lp in lps {
            let top = lp["top_logprobs"].as_array().unwrap();
            assert_eq!(top.len(), 3);
            // Greedy: the chosen token is the most likely one.
            assert_eq!(top[0]["token"], lp["token"]);
            assert!(lp["logprob"].as_f64().unwrap() <= 0.0);
            assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
            joined.push_str(lp["token"].as_str().unwrap());
        }
        assert_eq!(joined, want);
    }
    assert_eq!(r["usage"]["completion_tokens"], 128);

    let mut sreq = req;
    sreq["stream"] = json!(true);
    let (st, _, body) = s.request("POST", "/v1/chat/completions", Some(&sreq.to_string()), None);
    assert_eq!(st, 200);
    let mut texts = [String::new(), String::new()];
    let mut n_lp = [0, 0];
    for e in body
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
    {
        let c: Value = serde_json::from_str(e).unwrap();
        let ch = &c["choices"][0];
        let i = ch["index"].as_u64().unwrap() as usize;
        if let Some(t) = ch["delta"]["content"].as_str() {
            texts[i].push_str(t);
        }
        n_lp[i] += ch["logprobs"]["content"].as_array().map_or(0, |a| a.len());
    }
    assert_eq!(texts, [want.clone(), want]);
    assert_eq!(n_lp, [64, 64]);
}

/// `/v1/embeddings` with all-MiniLM-L6-v2 (converted by hf2q) served next to the chat model:
/// strings, arrays, token ids, base64, Matryoshka `dimensions`, length limit and truncation.
#[test]
fn embeddings_route() {
    let tmp = tempfile::tempdir().unwrap();
    let minilm = tmp.path().join("minilm.gguf");
    let dir = smollm2().parent().unwrap().join("all-MiniLM-L6-v2");
    let st = Command::new(env!("CARGO_BIN_EXE_hf2q"))
        .arg("convert")
        .arg(&dir)
        .args(["--quant", "f16", "-o"])
        .arg(&minilm)
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let s = Server::start_with(&[smollm2(), minilm], &[]);
    let emb = |body: Value| s.json("POST", "/v1/embeddings", body, None);
    let (st, r) = emb(json!({"model": "minilm", "input": ["Hello", "The sky is blue."]}));
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["object"], "list");
    let v0: Vec<f64> = r["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(v0.len(), 384);
    assert_eq!(r["data"][1]["index"], 1);
    assert!(r["usage"]["prompt_tokens"].as_u64().unwrap() >= 5);
    // A single string equals the first element of the batch.
    let (_, one) = emb(json!({"model": "minilm", "input": "Hello"}));
    assert_eq!(one["data"][0]["embedding"], r["data"][0]["embedding"]);
    // base64 carries the same f32 values.
    let (_, b) = emb(json!({"model": "minilm", "input": "Hello", "encoding_format": "base64"}));
    let bytes = unb64(b["data"][0]["embedding"].as_str().unwrap());
    let fv: Vec<f32> = bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(fv, v0.iter().map(|&x| x as f32).collect::<Vec<_>>());
    // dimensions: the leading 64 values, back to unit length.
    let (_, d) = emb(json!({"model": "minilm", "input": "Hello", "dimensions": 64}));
    let dv: Vec<f64> = d["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(dv.len(), 64);
    let norm: f64 = v0[..64].iter().map(|x| x * x).sum::<f64>().sqrt();
    for (a, b) in dv.iter().zip(&v0[..64]) {
        assert!((a - b / norm).abs() < 1e-6);
    }
    let (st, r) = emb(json!({"model": "minilm", "input": "Hello", "dimensions": 999}));
    assert_eq!(st, 400, "{r}");
    assert_eq!(r["error"]["param"], "dimensions");
    // Token ids work as input.
    let (st, _) = emb(json!({"model": "minilm", "input": [101, 7592, 102]}));
    assert_eq!(st, 200);
    // llama-server's input forms: objects with text content (the same vector as the string), and
    // token ids mixed with text in one input (the text's tokens in place, no specials added).
    let (_, hello) = emb(json!({"model": "minilm", "input": "Hello world"}));
    for input in [
        json!({"prompt_string": "Hello world"}),
        json!({"content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}]}),
    ] {
        let (st, r) = emb(json!({"model": "minilm", "input": input}));
        assert_eq!(st, 200, "{input}: {r}");
        assert_eq!(r["data"][0]["embedding"], hello["data"][0]["embedding"], "{input}");
    }
    let (_, ids) = emb(json!({"model": "minilm", "input": [101, 7592, 2088, 102]}));
    let (st, mixed) = emb(json!({"model": "minilm", "input": [101, "Hello world", 102]}));
    assert_eq!(st, 200, "{mixed}");
    assert_eq!(
        mixed["data"][0]["embedding"], ids["data"][0]["embedding"],
        "mixed ids and text"
    );
    assert_eq!(mixed["data"].as_array().unwrap().len(), 1);
    let (st, r) = emb(json!({"model": "minilm", "input": ["Hello world", [101, 7592, 102], {"prompt_string": "x"}]}));
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["data"].as_array().unwrap().len(), 3);
    assert_eq!(r["data"][0]["embedding"], hello["data"][0]["embedding"]);
    for bad in [
        json!([]),
        json!({"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}),
        json!({"content": [{"type": "unknown"}]}),
        json!({"content": "a bare string"}),
        json!([1.5]),
        json!({"other": 1}),
    ] {
        let (st, r) = emb(json!({"model": "minilm", "input": bad}));
        assert_eq!(st, 400, "{bad}: {r}");
        assert_eq!(r["error"]["param"], "input", "{bad}");
    }
    // Too long: 400 naming the limit, or truncation when asked.
    let long = "word ".repeat(600);
    let (st, r) = emb(json!({"model": "minilm", "input": long}));
    assert_eq!(st, 400, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("at most 512"));
    let (st, _) = emb(json!({"model": "minilm", "input": long, "truncate": true}));
    assert_eq!(st, 200);
    // The chat model is not an embedding model.
    let (st, r) = emb(json!({"model": "SmolLM2-135M-Instruct.Q4_1", "input": "x"}));
    assert_eq!(st, 400, "{r}");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not an embedding model"));
    let (_, models) = s.json("GET", "/v1/models", json!({}), None);
    assert_eq!(models["data"].as_array().unwrap().len(), 2);
}

/// `--pooling none` (llama-server's): `/embeddings` answers each input's token vectors (as
/// llama-server does, not normalised, one per token with [CLS] and [SEP]), `/v1/embeddings` a 400
/// saying why; `--pooling cls` changes the pooled vector.
#[test]
fn embedding_pooling_options() {
    let tmp = tempfile::tempdir().unwrap();
    let minilm = common::server::minilm_gguf(tmp.path());
    let pooled = |p: &str| {
        let s = Server::start_with(std::slice::from_ref(&minilm), &["--pooling", p]);
        let (st, r) = s.json("POST", "/v1/embeddings", json!({"input": "hello hello hello"}), None);
        assert_eq!(st, 200, "{r}");
        r["data"][0]["embedding"].clone()
    };
    assert_ne!(pooled("mean"), pooled("cls"));
    let s = Server::start_with(std::slice::from_ref(&minilm), &["--pooling", "none"]);
    let (st, r) = s.json("POST", "/embeddings", json!({"input": "hello hello hello"}), None);
    assert_eq!(st, 200, "{r}");
    let toks = r[0]["embedding"].as_array().unwrap();
    assert_eq!(toks.len(), 5, "[CLS] hello hello hello [SEP]");
    for t in toks {
        let v: Vec<f64> = t.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(v.len(), 384);
        let norm: f64 = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() > 1e-3, "not normalised: {norm}");
    }
    let (st, r) = s.json("POST", "/v1/embeddings", json!({"input": "hello"}), None);
    assert_eq!(st, 400, "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("--pooling none"),
        "{r}"
    );
}

fn unb64(s: &str) -> Vec<u8> {
    const T: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let vals: Vec<u32> = s
        .bytes()
        .filter(|&c| c != b'=')
        .map(|c| T.find(c as char).unwrap() as u32)
        .collect();
    for ch in vals.chunks(4) {
        let mut n = 0u32;
        for (i, v) in ch.iter().enumerate() {
            n |= v << (18 - 6 * i);
        }
        for i in 0..ch.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

/// `response_format`: json_schema and json_object replies always parse and validate, also when
/// sampling at temperature 1 (llguidance masks every step).
#[test]
fn structured_output() {
    let s = Server::start(&["--parallel", "4"]);
    let schema = json!({"type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"], "additionalProperties": false});
    let req = json!({"messages": [{"role": "user", "content": "Give me a person as JSON."}],
        "temperature": 1.0, "seed": 11, "n": 4, "max_tokens": 120,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "strict": true, "schema": schema}}});
    let (st, r) = s.json("POST", "/v1/chat/completions", req, None);
    assert_eq!(st, 200, "{r}");
    for c in r["choices"].as_array().unwrap() {
        assert_eq!(c["finish_reason"], "stop", "{c}");
        let text = c["message"]["content"].as_str().unwrap();
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 2, "{text}");
        assert!(o["name"].as_str().is_some_and(|n| n.chars().count() <= 20), "{text}");
        assert!(o["age"].as_u64().is_some_and(|a| a <= 150), "{text}");
    }
    let req = json!({"messages": [{"role": "user", "content": "List three colors."}], "temperature": 0,
        "max_tokens": 100, "response_format": {"type": "json_object"}});
    let (st, r) = s.json("POST", "/v1/chat/completions", req, None);
    assert_eq!(st, 200, "{r}");
    let text = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(serde_json::from_str::<Value>(text).unwrap().is_object(), "{text}");
    let bad = json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}});
    let (st, r) = s.json("POST", "/v1/chat/completions", bad, None);
    assert_eq!(st, 400, "{r}");
    assert_eq!(r["error"]["param"], "response_format");
}

#[test]
fn cors_preflight_and_headers() {
    let s = Server::start(&["--cors-origin", "http://app.example"]);
    let req = |method: &str, origin: &str| {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        write!(c, "{method} /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\n\r\n").unwrap();
        let mut raw = String::new();
        c.read_to_string(&mut raw).unwrap();
        raw.to_ascii_lowercase()
    };
    let pre = req("OPTIONS", "http://app.example");
    assert!(pre.starts_with("http/1.1 204"), "{pre}");
    assert!(pre.contains("access-control-allow-origin: http://app.example"), "{pre}");
    let get = req("GET", "http://app.example");
    assert!(
        get.starts_with("http/1.1 200") && get.contains("access-control-allow-origin"),
        "{get}"
    );
    let other = req("GET", "http://evil.example");
    assert!(!other.contains("access-control-allow-origin"), "{other}");
}

/// Tools: `tool_choice` required / named constrain the reply to one call whose arguments validate
/// against the tool's schema (plain and streamed); bad tool specs are 400s.
#[test]
fn tool_calls() {
    let s = Server::start(&[]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": false}}}]);
    let msgs = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let check_args = |a: &str| {
        let v: Value = serde_json::from_str(a).unwrap_or_else(|e| panic!("arguments not JSON ({e}): {a}"));
        assert!(v["city"].as_str().is_some_and(|c| c.chars().count() <= 30), "{a}");
        assert!(
            ["celsius", "fahrenheit"].contains(&v["unit"].as_str().unwrap_or("")),
            "{a}"
        );
        assert_eq!(v.as_object().unwrap().len(), 2, "{a}");
    };
    for (choice, temp) in [
        (json!("required"), 0.0),
        (json!({"type": "function", "function": {"name": "get_weather"}}), 1.0),
    ] {
        let req = json!({"messages": msgs, "tools": tools, "tool_choice": choice, "temperature": temp, "seed": 3, "max_tokens": 100});
        let (st, r) = s.json("POST", "/v1/chat/completions", req.clone(), None);
        assert_eq!(st, 200, "{r}");
        let c = &r["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{r}");
        let call = &c["message"]["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert!(call["id"].as_str().unwrap().starts_with("call-"));
        assert_eq!(call["function"]["name"], "get_weather");
        check_args(call["function"]["arguments"].as_str().unwrap());

        let mut sreq = req;
        sreq["stream"] = json!(true);
        let (st, _, body) = s.request("POST", "/v1/chat/completions", Some(&sreq.to_string()), None);
        assert_eq!(st, 200);
        let chunks = sse_chunks(&body);
        let call = chunks
            .iter()
            .find_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0).cloned())
            .expect("a tool_calls delta");
        assert_eq!(call["index"], 0);
        check_args(call["function"]["arguments"].as_str().unwrap());
        assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "tool_calls"));
    }
    let bad =
        json!({"messages": msgs, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}});
    let (st, r) = s.json("POST", "/v1/chat/completions", bad, None);
    assert_eq!((st, r["error"]["param"].as_str()), (400, Some("tool_choice")), "{r}");
    let bad = json!({"messages": msgs, "tools": tools, "parallel_tool_calls": "yes"});
    let (st, r) = s.json("POST", "/v1/chat/completions", bad, None);
    assert_eq!(
        (st, r["error"]["param"].as_str()),
        (400, Some("parallel_tool_calls")),
        "{r}"
    );
    let bad = json!({"messages": msgs, "tools": [{"type": "retrieval"}]});
    let (st, r) = s.json("POST", "/v1/chat/completions", bad, None);
    assert_eq!((st, r["error"]["param"].as_str()), (400, Some("tools")), "{r}");
}

/// A chat request whose prompt is a few hundred tokens long (`topic` makes it distinct).
fn long_chat(topic: &str, max_tokens: usize) -> Value {
    let system = format!(
        "You are a careful assistant for a museum about {topic}. Visitors ask about the exhibits, the \
         opening hours (nine to five, closed on Mondays), the café on the second floor, the guided tours \
         every hour on the hour, the accessible entrance on the east side, the cloakroom, the shop, the \
         library of old maps and letters, and the temporary exhibition about {topic} in the west wing. \
         Answer in one or two friendly sentences, do not invent prices, and suggest the information desk \
         for anything you do not know. The museum was founded a long time ago by a society of people who \
         cared about {topic}, and it keeps growing every year with gifts from the public. \
         School groups should book a week ahead; the education team runs workshops on weekday mornings. \
         Photography without flash is allowed everywhere except in the rooms with old paper. Dogs are \
         welcome in the garden but not inside, except assistance dogs, which are welcome everywhere. \
         The nearest bus stop is two minutes away and the car park closes an hour after the museum."
    );
    json!({"temperature": 0, "max_tokens": max_tokens,
           "messages": [{"role": "system", "content": system},
                        {"role": "user", "content": format!("Tell me one thing about {topic}.")}]})
}

fn reply(r: &Value) -> (String, u64, u64) {
    (
        r["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        r["usage"]["prompt_tokens"].as_u64().unwrap(),
        r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
    )
}

/// Server flags for the --kv-persist tests: 64-token prefill chunks (one cache block each).
fn persist_args<'a>(parallel: &'a str, dir: &'a str) -> [&'a str; 8] {
    [
        "--parallel",
        parallel,
        "--prefill-chunk",
        "64",
        "--ctx",
        "1024",
        "--kv-persist",
        dir,
    ]
}

/// The prefix cache across slots and across restarts. With `--prefill-chunk 64` every block of
/// the prompt is computed exactly as a cached block is later imported, so a reply that uses cached
/// blocks must equal the first, uncached reply bit for bit.
#[test]
fn prefix_cache_is_shared_across_slots_and_persists() {
    let dir = tempfile::tempdir().unwrap();
    let persist = dir.path().to_str().unwrap().to_string();
    let args = persist_args("2", &persist);
    let req = long_chat("lighthouses", 24);
    let (first, n_prompt, cached_first) = {
        let s = std::sync::Arc::new(Server::start(&args));
        let (st, r) = s.json("POST", "/v1/chat/completions", req.clone(), None);
        assert_eq!(st, 200, "{r}");
        let (text, n, cached) = reply(&r);
        assert!(n > 3 * 64, "the prompt should span several blocks: {n} tokens");
        // (so that a cached count from the cache's blocks differs from a slot's own n - 1)
        assert_ne!((n - 1) % 64, 0);
        // Keep the slot that holds this prompt busy with a longer request (sharing the template's
        // first tokens, it goes to that slot), so the repeat lands on the other slot.
        let busy = {
            let s = s.clone();
            std::thread::spawn(move || {
                let (st, r) = s.json("POST", "/v1/chat/completions", long_chat("volcanoes", 160), None);
                assert_eq!(st, 200, "{r}");
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        let (st, r) = s.json("POST", "/v1/chat/completions", req.clone(), None);
        assert_eq!(st, 200, "{r}");
        let (again, _, cached_again) = reply(&r);
        assert_eq!(again, text, "reply with blocks from the other slot");
        assert_eq!(cached_again, (n - 1) / 64 * 64, "whole blocks from the prefix cache");
        busy.join().unwrap();
        let metrics = s.request("GET", "/metrics", None, None).2;
        assert!(
            !metrics.contains("hf2q_prefix_cache_blocks{model=\"SmolLM2-135M-Instruct.Q4_1\"} 0\n"),
            "{metrics}"
        );
        (text, n, cached)
    };
    assert_eq!(cached_first, 0);
    let block_files = |d: &std::path::Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(d)
            .unwrap()
            .flat_map(|e| std::fs::read_dir(e.unwrap().path()).unwrap())
            .map(|e| e.unwrap().path())
            .collect()
    };
    // Blocks are written in the background; they are on disk shortly after.
    let t = Instant::now();
    while block_files(dir.path()).len() < (n_prompt as usize - 1) / 64 {
        assert!(t.elapsed() < Duration::from_secs(20), "blocks not persisted");
        std::thread::sleep(Duration::from_millis(50));
    }

    // A restart: the blocks come back from disk.
    {
        let s = Server::start(&args);
        let (st, r) = s.json("POST", "/v1/chat/completions", req.clone(), None);
        assert_eq!(st, 200, "{r}");
        let (text, _, cached) = reply(&r);
        assert_eq!(cached, (n_prompt - 1) / 64 * 64, "blocks from --kv-persist");
        assert_eq!(text, first);
    }

    // Damaged blocks and a half-written leftover: discarded at start, never used.
    let files = block_files(dir.path());
    for f in &files {
        let mut b = std::fs::read(f).unwrap();
        let mid = b.len() / 2;
        b[mid] ^= 0x55;
        std::fs::write(f, b).unwrap();
    }
    let leftover = files[0].with_file_name(".tmp-leftover.kvb.1");
    std::fs::write(&leftover, b"half a block").unwrap();
    {
        let s = Server::start(&args);
        assert!(!leftover.exists(), "temporary leftovers are removed at start");
        for f in &files {
            assert!(!f.exists(), "{} was corrupt and should be gone", f.display());
        }
        let (st, r) = s.json("POST", "/v1/chat/completions", req.clone(), None);
        assert_eq!(st, 200, "{r}");
        let (text, _, cached) = reply(&r);
        assert_eq!(cached, 0, "nothing usable was left on disk");
        assert_eq!(text, first);
    }
}

/// `kill -9` while blocks are being written: after a restart nothing half-written is served and
/// replies that use the surviving blocks equal the replies computed without them.
#[test]
fn kv_persist_survives_kill_9_during_writes() {
    let dir = tempfile::tempdir().unwrap();
    let persist = dir.path().to_str().unwrap().to_string();
    let args = persist_args("4", &persist);
    let topics = ["rivers", "glaciers", "deserts", "forests", "islands", "canyons"];
    let mut want = Vec::new();
    {
        let s = std::sync::Arc::new(Server::start(&args));
        // Each request leaves the whole blocks of the tokens it fed (prompt and reply) behind.
        let mut blocks = 0;
        for t in &topics[..2] {
            let (st, r) = s.json("POST", "/v1/chat/completions", long_chat(t, 16), None);
            assert_eq!(st, 200, "{r}");
            want.push(reply(&r).0);
            blocks += (r["usage"]["total_tokens"].as_u64().unwrap() as usize - 1) / 64;
        }
        // More prompts at once, each ending right after its prompt, so that all their blocks are
        // written together; the server is killed as soon as the first of them reaches the disk.
        let count = |d: &std::path::Path| -> usize {
            std::fs::read_dir(d)
                .unwrap()
                .flat_map(|e| std::fs::read_dir(e.unwrap().path()).unwrap())
                .count()
        };
        let t0 = Instant::now();
        while count(dir.path()) < blocks {
            assert!(t0.elapsed() < Duration::from_secs(20), "first blocks not persisted");
            std::thread::sleep(Duration::from_millis(20));
        }
        let before = count(dir.path());
        let hs: Vec<_> = topics[2..]
            .iter()
            .map(|t| {
                let (s, req) = (s.clone(), long_chat(t, 1));
                std::thread::spawn(move || {
                    let _ = std::panic::catch_unwind(|| {
                        s.request("POST", "/v1/chat/completions", Some(&req.to_string()), None)
                    });
                })
            })
            .collect();
        let t0 = Instant::now();
        while count(dir.path()) == before && t0.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(s.child.id() as i32, libc::SIGKILL) };
        for h in hs {
            let _ = h.join();
        }
    }
    let s = Server::start(&args);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flat_map(|e| std::fs::read_dir(e.unwrap().path()).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| n.ends_with(".kvb") && !n.starts_with(".tmp-")),
        "{names:?}"
    );
    for (t, w) in topics[..2].iter().zip(&want) {
        let (st, r) = s.json("POST", "/v1/chat/completions", long_chat(t, 16), None);
        assert_eq!(st, 200, "{r}");
        let (text, n, cached) = reply(&r);
        assert_eq!(cached, (n - 1) / 64 * 64, "{t}: blocks from disk");
        assert_eq!(&text, w, "{t}");
    }
}

/// One KV budget for all slots: a request that can never fit is refused naming the budget; two
/// that cannot run together run one after the other, each with its own unchanged reply. The pool
/// hands out pages of 64 positions, so a budget of 300 positions holds 4 pages (256).
#[test]
fn kv_budget_is_shared_and_never_truncates() {
    let s = std::sync::Arc::new(Server::start(&[
        "--parallel",
        "2",
        "--ctx",
        "512",
        "--kv-budget",
        "300",
    ]));
    let mut too_big = long_chat("bridges", 400);
    too_big["max_tokens"] = json!(400);
    let (st, r) = s.json("POST", "/v1/chat/completions", too_big.clone(), None);
    assert_eq!(st, 400, "{r}");
    assert_eq!(r["error"]["code"], "kv_budget_exceeded");
    assert!(r["error"]["message"].as_str().unwrap().contains("--kv-budget"), "{r}");
    // Without max_tokens the reply may use what the budget leaves after the prompt.
    let mut open_ended = too_big;
    open_ended.as_object_mut().unwrap().remove("max_tokens");
    let (st, r) = s.json("POST", "/v1/chat/completions", open_ended, None);
    assert_eq!(st, 200, "{r}");
    assert!(r["usage"]["total_tokens"].as_u64().unwrap() <= 256, "{r}");

    let short = |topic: &str| json!({"temperature": 0, "max_tokens": 140, "messages": [{"role": "user", "content": format!("Write about {topic}.")}]});
    // Alone first (reference replies), then both at once: 2 × (prompt + 140) > 256 positions.
    let alone: Vec<String> = ["owls", "tides"]
        .iter()
        .map(|t| reply(&s.json("POST", "/v1/chat/completions", short(t), None).1).0)
        .collect();
    let hs: Vec<_> = ["owls", "tides"]
        .iter()
        .map(|t| {
            let (s, req) = (s.clone(), short(t));
            std::thread::spawn(move || {
                let (st, r) = s.json("POST", "/v1/chat/completions", req, None);
                assert_eq!(st, 200, "{r}");
                (reply(&r).0, Instant::now())
            })
        })
        .collect();
    let got: Vec<(String, Instant)> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(got[0].0, alone[0]);
    assert_eq!(got[1].0, alone[1]);
    let m = s.request("GET", "/metrics", None, None).2;
    let used = kv_held(&m);
    assert!(used <= 256, "KV positions held {used} exceed the budget");
    assert!(
        m.contains("hf2q_kv_capacity_tokens{model=\"SmolLM2-135M-Instruct.Q4_1\"} 256"),
        "{m}"
    );
}

/// The KV positions `/metrics` reports held (running requests' and kept for reuse).
fn kv_held(metrics: &str) -> usize {
    ["hf2q_kv_tokens{", "hf2q_kv_cached_tokens{"]
        .iter()
        .map(|name| {
            metrics
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or_else(|| panic!("no {name} in {metrics}"))
        })
        .sum()
}

/// A request that starts inside a page the prefix cache holds too (its prompt departs from the
/// slot's last one within the first block) writes into a copy of that page: the budget counts it,
/// and when the budget has no page to spare, that block is fed again instead. Watched from
/// `/metrics` while the request runs, the positions held never exceed the budget (a page each
/// way: one 64-position page over was what CI saw once), and the replies are the same.
#[test]
fn kv_budget_counts_pages_copied_on_write() {
    let s = std::sync::Arc::new(Server::start(&[
        "--parallel",
        "1",
        "--ctx",
        "512",
        "--kv-budget",
        "256",
    ]));
    let ask = |topic: &str, max_tokens: usize| {
        json!({"temperature": 0, "max_tokens": max_tokens,
               "messages": [{"role": "user", "content": format!("Write a long story about {topic}, with many details.")}]})
    };
    // B alone (reference), then A (its first block now in the cache), then B again while watched.
    let b_alone = reply(&s.json("POST", "/v1/chat/completions", ask("tides", 200), None).1);
    let (st, a) = s.json("POST", "/v1/chat/completions", ask("owls", 60), None);
    let total = a["usage"]["total_tokens"].as_u64().unwrap_or(0);
    assert!(st == 200 && total > 65, "A must fill the first block: {a}");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (s, done) = (s.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut most, mut polls) = (0, 0);
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                most = most.max(kv_held(&s.request("GET", "/metrics", None, None).2));
                polls += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            (most, polls)
        })
    };
    let (st, r) = s.json("POST", "/v1/chat/completions", ask("tides", 200), None);
    done.store(true, std::sync::atomic::Ordering::Release);
    let (most, polls) = watcher.join().unwrap();
    assert_eq!(st, 200, "{r}");
    let b = reply(&r);
    assert_eq!(b.0, b_alone.0, "the same reply whatever the cache held");
    assert!(
        b.1 + 200 > 192,
        "the request must need the whole budget: {} prompt tokens",
        b.1
    );
    assert!(polls > 3, "watched only {polls} times");
    assert!(most <= 256, "KV positions held {most} exceed the budget of 256");
}

/// Legacy `/v1/completions` logprobs (`logprobs: k`): tokens that spell the text, their
/// log-probabilities, `k` alternatives each (the sampled token first under greedy decoding) and
/// character offsets; the stream carries the same values token by token.
#[test]
fn completions_logprobs() {
    let s = Server::start(&[]);
    let req = json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "logprobs": 3});
    let (st, r) = s.json("POST", "/v1/completions", req.clone(), None);
    assert_eq!(st, 200, "{r}");
    let c = &r["choices"][0];
    let lp = &c["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.concat(), c["text"].as_str().unwrap());
    let values: Vec<f64> = lp["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(values.len(), tokens.len());
    let mut at = 0;
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(offsets[i], at);
        at += t.chars().count() as u64;
        assert!(values[i] <= 0.0);
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert_eq!(top.len(), 3, "{top:?}");
        // Greedy: the chosen token is the most likely alternative.
        let best = top.values().map(|v| v.as_f64().unwrap()).fold(f64::MIN, f64::max);
        assert_eq!(top[*t].as_f64().unwrap(), values[i]);
        assert_eq!(best, values[i]);
    }
    let mut sreq = req;
    sreq["stream"] = json!(true);
    let (st, _, body) = s.request("POST", "/v1/completions", Some(&sreq.to_string()), None);
    assert_eq!(st, 200);
    let streamed: Vec<Value> = sse_chunks(&body)
        .into_iter()
        .filter(|c| !c["choices"][0]["logprobs"].is_null())
        .collect();
    let st_tokens: Vec<String> = streamed
        .iter()
        .map(|c| c["choices"][0]["logprobs"]["tokens"][0].as_str().unwrap().to_string())
        .collect();
    assert_eq!(st_tokens, tokens);
    let st_offsets: Vec<u64> = streamed
        .iter()
        .map(|c| c["choices"][0]["logprobs"]["text_offset"][0].as_u64().unwrap())
        .collect();
    assert_eq!(st_offsets, offsets);
    // Out of range is refused, naming the parameter.
    let (st, r) = s.json("POST", "/v1/completions", json!({"prompt": "x", "logprobs": 21}), None);
    assert_eq!((st, r["error"]["param"].as_str()), (400, Some("logprobs")), "{r}");
}

/// Tool calls in the Llama 3.x JSON and both Mistral formats: SmolLM2 with small templates that
/// render tools and calls the way those families' templates do (tests/data/tool_templates). A
/// forced call (required, named; plain and streamed) comes back as OpenAI `tool_calls`, and the
/// round trip with the tool's result renders through the template (arguments as objects).
#[test]
fn tool_call_formats_of_other_families() {
    let dir = tempfile::tempdir().unwrap();
    let names = ["llama3", "mistral_list", "mistral_args"];
    let mut models = Vec::new();
    for name in names {
        let out = dir.path().join(format!("{name}.gguf"));
        let tpl = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/tool_templates/{name}.jinja"));
        let st = Command::new(env!("CARGO_BIN_EXE_hf2q"))
            .arg("gguf-patch")
            .arg(smollm2())
            .arg("--chat-template")
            .arg(&tpl)
            .arg("-o")
            .arg(&out)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
        models.push(out);
    }
    let s = Server::start_with(&models, &["--parallel", "1"]);
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "description": "Current time in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    ]);
    let ask = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    for name in names {
        for choice in [
            json!("required"),
            json!({"type": "function", "function": {"name": "get_weather"}}),
        ] {
            let req = json!({"model": name, "messages": ask, "tools": tools, "tool_choice": choice,
                             "temperature": 0, "max_tokens": 64});
            let (st, r) = s.json("POST", "/v1/chat/completions", req.clone(), None);
            assert_eq!(st, 200, "{name}: {r}");
            let c = &r["choices"][0];
            assert_eq!(c["finish_reason"], "tool_calls", "{name} {choice}: {r}");
            let call = &c["message"]["tool_calls"][0];
            let fname = call["function"]["name"].as_str().unwrap();
            assert!(
                fname == "get_weather" || (choice == "required" && fname == "get_time"),
                "{name}: {r}"
            );
            let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
            assert!(args["city"].is_string(), "{name}: {args}");

            // Streamed: the same call as a tool_calls delta.
            let mut sreq = req.clone();
            sreq["stream"] = json!(true);
            let (st, _, body) = s.request("POST", "/v1/chat/completions", Some(&sreq.to_string()), None);
            assert_eq!(st, 200);
            let delta = sse_chunks(&body)
                .into_iter()
                .find(|c| c["choices"][0]["delta"]["tool_calls"].is_array())
                .unwrap_or_else(|| panic!("{name}: no tool_calls delta in {body}"));
            assert_eq!(delta["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], fname);

            // Round trip: the call and its result go back through the template.
            let follow = json!({"model": name, "tools": tools, "temperature": 0, "max_tokens": 24, "messages": [
                ask[0],
                {"role": "assistant", "content": null, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "{\"temp_c\": 18}"}
            ]});
            let (st, r) = s.json("POST", "/v1/chat/completions", follow, None);
            assert_eq!(st, 200, "{name}: {r}");
            let m = &r["choices"][0]["message"];
            assert!(m["content"].is_string() || m["tool_calls"].is_array(), "{name}: {r}");
        }
    }
}

/// The JSON chunks of an SSE body (without the final `[DONE]`).
fn sse_chunks(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("not JSON ({err}): {e}")))
        .collect()
}

/// Text of a streamed chat reply (content deltas joined) and its finish reason.
fn streamed_text(body: &str) -> (String, String) {
    let chunks = sse_chunks(body);
    let text = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let fin = chunks
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str())
        .unwrap_or_default()
        .to_string();
    (text, fin)
}

/// The same seed and prompt give the same sampled text, alone and while other requests run; a
/// `stop` string ends the reply before it (plain and streamed).
#[test]
fn seeds_reproduce_and_stop_strings_stop() {
    let s = std::sync::Arc::new(Server::start(&["--parallel", "4"]));
    let (prompt, golden) = golden_q4_1();
    let sampled = json!({"temperature": 1.0, "top_p": 0.95, "seed": 42, "max_tokens": 40,
                         "messages": [{"role": "user", "content": prompt}]});
    let (st, r) = s.json("POST", "/v1/chat/completions", sampled.clone(), None);
    assert_eq!(st, 200, "{r}");
    let a = reply(&r).0;
    let (_, r) = s.json("POST", "/v1/chat/completions", sampled.clone(), None);
    assert_eq!(reply(&r).0, a, "same seed, same text");
    let mut other = sampled.clone();
    other["seed"] = json!(43);
    let hs: Vec<_> = (0..4)
        .map(|k| {
            let s = s.clone();
            let req = if k % 2 == 0 { sampled.clone() } else { other.clone() };
            std::thread::spawn(move || reply(&s.json("POST", "/v1/chat/completions", req, None).1).0)
        })
        .collect();
    let got: Vec<String> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(got[0], a, "same seed while other requests run");
    assert_eq!(got[2], a);
    assert_eq!(got[1], got[3], "seed 43 is reproducible too");
    assert_ne!(got[1], a, "another seed samples another text");

    // Stop strings: the greedy golden reply cut before the stop string's first occurrence.
    let words: Vec<&str> = golden.split_whitespace().collect();
    let stop = format!(" {}", words[words.len() / 2]);
    let cut = &golden[..golden.find(&stop).unwrap()];
    let req = json!({"temperature": 0, "max_tokens": 64, "stop": [stop, "never-appears"],
                     "messages": [{"role": "user", "content": prompt}]});
    let (st, r) = s.json("POST", "/v1/chat/completions", req.clone(), None);
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["choices"][0]["message"]["content"], cut);
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let mut sreq = req;
    sreq["stream"] = json!(true);
    let (_, _, body) = s.request("POST", "/v1/chat/completions", Some(&sreq.to_string()), None);
    assert_eq!(streamed_text(&body), (cut.to_string(), "stop".to_string()));
}

/// Sixteen streaming clients at once over the default four slots: every stream completes with
/// exactly the reply the model gives alone.
#[test]
fn sixteen_concurrent_streaming_clients() {
    let s = std::sync::Arc::new(Server::start(&[]));
    let cases = q4_1_goldens();
    let hs: Vec<_> = (0..16)
        .map(|k| {
            let (prompt, want) = cases[k % cases.len()].clone();
            let s = s.clone();
            std::thread::spawn(move || {
                let req = json!({"temperature": 0, "max_tokens": 64, "stream": true,
                                 "stream_options": {"include_usage": true},
                                 "messages": [{"role": "user", "content": prompt}]});
                let (st, _, body) = s.request("POST", "/v1/chat/completions", Some(&req.to_string()), None);
                assert_eq!(st, 200, "{body}");
                assert!(body.trim_end().ends_with("data: [DONE]"), "client {k}");
                let (text, fin) = streamed_text(&body);
                assert_eq!(text, want, "client {k}");
                assert!(fin == "length" || fin == "stop", "client {k}: {fin}");
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// A client that goes away mid-stream frees its slot: the only slot serves the next request
/// long before the abandoned reply (up to 6000 tokens) could have finished.
#[test]
fn a_dropped_stream_frees_its_slot() {
    let s = Server::start(&["--parallel", "1", "--ctx", "8192"]);
    let mut c = TcpStream::connect(&s.addr).unwrap();
    // End-of-turn tokens are banned, so only max_tokens (or the disconnect) can end the reply.
    let body =
        json!({"stream": true, "temperature": 0, "max_tokens": 6000, "logit_bias": {"0": -100, "1": -100, "2": -100},
                      "messages": [{"role": "user", "content": "Count from one to a thousand."}]})
        .to_string();
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Read until a few tokens have arrived: the request is decoding in the only slot.
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while String::from_utf8_lossy(&got).matches("data: ").count() < 4 {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "stream ended early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    let active = || -> usize {
        let m = s.request("GET", "/metrics", None, None).2;
        m.lines()
            .find(|l| l.starts_with("hf2q_active_slots{"))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(active(), 1);
    drop(c);
    // The slot is free again within a few steps.
    let t = Instant::now();
    while active() != 0 {
        // Generous for a loaded machine, yet far less than the 6000 tokens of the reply take.
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the dropped stream still holds its slot"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("slot freed {:?} after the client left", t.elapsed());
    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"temperature": 0, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}),
        None,
    );
    assert_eq!(st, 200, "{r}");
}

/// 413 for a body over --max-body-bytes and 429 with Retry-After for a full queue, both with an
/// OpenAI error body.
#[test]
fn body_limit_and_full_queue() {
    let s = std::sync::Arc::new(Server::start(&[
        "--max-body-bytes",
        "2000",
        "--parallel",
        "1",
        "--queue-capacity",
        "1",
    ]));
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(3000)}]}).to_string();
    let (st, _, b) = s.request("POST", "/v1/chat/completions", Some(&big), None);
    assert_eq!(st, 413, "{b}");
    let e: Value = serde_json::from_str(&b).unwrap();
    assert!(e["error"]["message"].is_string(), "{b}");
    // One request decoding, one queued: further ones are turned away.
    let long =
        json!({"temperature": 0, "max_tokens": 300, "messages": [{"role": "user", "content": "Tell a long story."}]});
    let hs: Vec<_> = (0..6)
        .map(|_| {
            let (s, req) = (s.clone(), long.to_string());
            std::thread::spawn(move || s.request("POST", "/v1/chat/completions", Some(&req), None))
        })
        .collect();
    let results: Vec<(u16, String, String)> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let busy: Vec<&(u16, String, String)> = results.iter().filter(|r| r.0 == 429).collect();
    assert!(
        !busy.is_empty(),
        "{:?}",
        results.iter().map(|r| r.0).collect::<Vec<_>>()
    );
    assert!(results.iter().all(|r| r.0 == 200 || r.0 == 429));
    for (_, head, body) in busy {
        assert!(head.to_ascii_lowercase().contains("retry-after:"), "{head}");
        let e: Value = serde_json::from_str(body).unwrap();
        assert!(e["error"]["message"].is_string(), "{body}");
    }
}

/// With tools offered but a text answer, the streamed reply still arrives token by token (not held
/// to the end) and equals the unary reply's content.
#[test]
fn text_replies_stream_while_tools_are_offered() {
    let s = Server::start(&[]);
    let req = json!({"temperature": 0, "max_tokens": 30,
        "tools": [{"type": "function", "function": {"name": "get_weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "messages": [{"role": "user", "content": "Write one sentence about the sea."}]});
    let (st, r) = s.json("POST", "/v1/chat/completions", req.clone(), None);
    assert_eq!(st, 200, "{r}");
    assert!(r["choices"][0]["message"]["tool_calls"].is_null(), "{r}");
    let content = r["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let mut sreq = req;
    sreq["stream"] = json!(true);
    let (_, _, body) = s.request("POST", "/v1/chat/completions", Some(&sreq.to_string()), None);
    let deltas = sse_chunks(&body)
        .into_iter()
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count();
    assert!(deltas > 5, "content came in {deltas} pieces");
    assert_eq!(streamed_text(&body), (content, "stop".to_string()));
}

/// Once loaded, the server prints ready-to-paste requests; the printed chat request works as is.
#[test]
fn prints_a_ready_to_paste_request() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hf2q"))
        .arg("serve")
        .arg("-m")
        .arg(smollm2())
        .args(["--port", "0", "-t", "2"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let curl = loop {
        let line = lines.next().expect("server exited").unwrap();
        if let Some(c) = line.trim().strip_prefix("curl http://") {
            break c.to_string();
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let (url, rest) = curl.split_once(' ').unwrap();
    assert!(url.ends_with("/v1/chat/completions"), "{curl}");
    let body: Value = serde_json::from_str(rest.split_once("-d '").unwrap().1.trim_end_matches('\'')).unwrap();
    assert_eq!(body["model"], "SmolLM2-135M-Instruct.Q4_1");
    // The same request against a server of the same model.
    let s = Server::start(&[]);
    let (st, r) = s.json("POST", "/v1/chat/completions", body, None);
    assert_eq!(st, 200, "{r}");
    assert!(r["choices"][0]["message"]["content"].is_string());
}

/// With several chat models, a request naming none of them is a 404 that lists them (the
/// one-model fallback applies only when there is no choice to make); `--alias` names a model.
#[test]
fn unknown_models_are_404_when_several_chat_models_are_served() {
    let gemma = common::models_dir().join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        gemma.is_file(),
        "{} is missing: run scripts/fetch-models first",
        gemma.display()
    );
    let s = Server::start_with(&[smollm2(), gemma], &["--alias", "tiny-chat"]);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": msgs, "model": "gpt-4", "max_tokens": 2}),
        None,
    );
    assert_eq!(st, 404, "{r}");
    let m = r["error"]["message"].as_str().unwrap();
    assert!(m.contains("gemma-3-270m-q4_k_m") && m.contains("tiny-chat"), "{m}");
    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": msgs, "model": "tiny-chat", "max_tokens": 2}),
        None,
    );
    assert_eq!((st, r["model"].as_str()), (200, Some("tiny-chat")), "{r}");
    let (st, r) = s.json(
        "POST",
        "/v1/completions",
        json!({"prompt": "The sky is", "model": "gemma-3-270m-q4_k_m", "max_tokens": 2}),
        None,
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["model"], "gemma-3-270m-q4_k_m");
}

/// `--models-dir` with `--models-memory` for two of three models: requests alternating between
/// the three all succeed (loads and unloads in /metrics), concurrent requests for a model being
/// loaded wait for it, `/v1/models` lists all three with `loaded`, and a model that can never fit
/// is a 503 with Retry-After naming the sizes.
#[test]
fn models_dir_loads_and_unloads_under_a_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["a", "b", "c"] {
        std::os::unix::fs::symlink(smollm2(), dir.path().join(format!("{name}.gguf"))).unwrap();
    }
    let d = dir.path().to_str().unwrap();
    // One model: its 94 MiB file and a 512-position KV pool (~12 MiB); two fit in 250 MiB.
    let s = Server::start_with(
        &[],
        &[
            "--models-dir",
            d,
            "--models-memory",
            "250MiB",
            "-c",
            "512",
            "--parallel",
            "1",
        ],
    );
    let (st, r) = s.json("GET", "/v1/models", json!({}), None);
    assert_eq!(st, 200);
    let listed: Vec<(String, bool)> = r["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap().to_string(), m["loaded"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        listed,
        vec![("a".into(), false), ("b".into(), false), ("c".into(), false)]
    );
    let ask = |id: &str| {
        s.json(
            "POST",
            "/v1/completions",
            json!({"model": id, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}),
            None,
        )
    };
    let mut texts = Vec::new();
    for id in ["a", "b", "c", "a", "b", "c"] {
        let (st, r) = ask(id);
        assert_eq!(st, 200, "{id}: {r}");
        assert_eq!(r["model"], id);
        texts.push(r["choices"][0]["text"].as_str().unwrap().to_string());
    }
    // The same file under three names: the same greedy text every time.
    assert!(texts.iter().all(|t| t == &texts[0]), "{texts:?}");
    assert_eq!(s.metric("hf2q_model_loads_total"), Some(6.0));
    assert_eq!(s.metric("hf2q_model_unloads_total"), Some(4.0));
    assert_eq!(s.metric("hf2q_models_loaded"), Some(2.0));
    // Three concurrent requests for the model that is not loaded: all wait for its one load.
    let (st, r) = s.json("GET", "/v1/models", json!({}), None);
    assert_eq!(st, 200);
    let cold = r["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["loaded"] == false)
        .map(|m| m["id"].as_str().unwrap().to_string())
        .expect("one model is unloaded");
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..3).map(|_| sc.spawn(|| ask(&cold))).collect();
        for h in hs {
            let (st, r) = h.join().unwrap();
            assert_eq!(st, 200, "{r}");
        }
    });
    assert_eq!(s.metric("hf2q_model_loads_total"), Some(7.0));
    drop(s);
    // A budget smaller than one model: a 503 with Retry-After that names the sizes.
    let s = Server::start_with(&[], &["--models-dir", d, "--models-memory", "50MiB"]);
    let body = json!({"model": "a", "prompt": "x", "max_tokens": 1}).to_string();
    let (st, head, b) = s.request("POST", "/v1/completions", Some(&body), None);
    assert_eq!(st, 503, "{b}");
    assert!(head.to_ascii_lowercase().contains("retry-after"), "{head}");
    assert!(b.contains("50.0 MiB") && b.contains("can never be loaded"), "{b}");
}
