//! `hf2q serve` under abuse and odd-but-ordinary traffic: one regression test per defect found
//! when the server was attacked and used as agents use it (bounded embeddings work that stops when
//! the client leaves, queued streams kept alive and dropped from the queue on disconnect, header
//! and body timeouts, a connection limit, JSON errors on every route, tool round trips without
//! `tools`, model-kind errors, KV metrics, the json_schema guarantee, plain-text logs, a free port).

mod common;

use common::server::{bin, cpu_seconds, error_object, minilm_gguf, rss_bytes, split_response, Server};
use common::smollm2;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SMOL: &str = "SmolLM2-135M-Instruct.Q4_1";

fn post(body: &Value) -> Vec<u8> {
    let b = body.to_string();
    format!(
        "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    )
    .into_bytes()
}

/// Regression: 20,000 inputs in one ~200 KB request kept both cores busy for minutes. Past
/// `--embed-max-inputs` (2,048) or `--embed-max-tokens` the request is a 400 naming the limit.
#[test]
fn embeddings_over_the_request_limits_are_400() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Server::start_with(&[minilm_gguf(tmp.path())], &["--embed-max-tokens", "1000"]);
    let many = vec!["hi"; 20_000];
    let t = Instant::now();
    let (st, r) = s.json("POST", "/v1/embeddings", json!({"input": many}), None);
    eprintln!("20,000 inputs answered {st} in {:?}", t.elapsed());
    assert_eq!(st, 400, "{r}");
    assert_eq!(r["error"]["param"], "input");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("--embed-max-inputs"),
        "{r}"
    );
    let long = vec!["a sentence of several words"; 300];
    let (st, r) = s.json("POST", "/v1/embeddings", json!({"input": long}), None);
    assert_eq!(st, 400, "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("--embed-max-tokens"),
        "{r}"
    );
    // Within the limits it works.
    let (st, r) = s.json("POST", "/v1/embeddings", json!({"input": ["hi", "there"]}), None);
    assert_eq!(st, 200, "{r}");
    // Regression: `encoding_format: 1` was accepted as float.
    let (st, r) = s.json(
        "POST",
        "/v1/embeddings",
        json!({"input": "hi", "encoding_format": 1}),
        None,
    );
    assert_eq!(
        (st, r["error"]["param"].as_str()),
        (400, Some("encoding_format")),
        "{r}"
    );
}

/// Regression: a 2,048-input request whose client left kept the CPU busy until every input was
/// embedded, and requests behind it waited. Now its remaining batches are dropped: measured as
/// the server's CPU time over the second after the client left plus one second.
#[test]
fn abandoned_embeddings_stop_using_the_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Server::start_with(&[minilm_gguf(tmp.path())], &[]);
    let mut c = TcpStream::connect(&s.addr).unwrap();
    // 2,048 inputs of ~50 tokens: several seconds of work even on a fast machine.
    let text = "the quick brown fox jumps over the lazy dog and keeps running far away ".repeat(3);
    c.write_all(&post(&json!({"input": vec![text; 2048]}))).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let busy0 = cpu_seconds(s.pid());
    // Still working when the client leaves (else the test would show nothing).
    c.set_nonblocking(true).unwrap();
    let mut probe = [0u8; 1];
    assert!(c.read(&mut probe).is_err(), "the request finished within a second");
    drop(c);
    std::thread::sleep(Duration::from_secs(1));
    let after = cpu_seconds(s.pid());
    std::thread::sleep(Duration::from_secs(1));
    let idle = cpu_seconds(s.pid()) - after;
    eprintln!(
        "CPU seconds: {:.2} in the second after the client left, {idle:.2} in the next second",
        after - busy0
    );
    // Two cores flat out would be 2.0 s per second; an idle server uses next to nothing.
    assert!(idle < 0.2, "the server still used {idle:.2} CPU seconds per second");
    let t = Instant::now();
    let (st, r) = s.json("POST", "/v1/embeddings", json!({"input": "Hello!"}), None);
    assert_eq!(st, 200, "{r}");
    eprintln!("a single input after the abandoned request: {:?}", t.elapsed());
}

/// Regression: a large embeddings request raised RSS for good (0.78 to 2.93 GB in the report).
/// Half a second after the embedding thread goes idle, freed memory goes back to the OS.
#[test]
fn embeddings_give_their_memory_back() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Server::start_with(&[minilm_gguf(tmp.path())], &[]);
    let (st, _) = s.json("POST", "/v1/embeddings", json!({"input": "warm"}), None);
    assert_eq!(st, 200);
    std::thread::sleep(Duration::from_secs(1));
    let idle = rss_bytes(s.pid());
    let text = "the quick brown fox jumps over the lazy dog and keeps running far away ".repeat(3);
    let (st, r) = s.json("POST", "/v1/embeddings", json!({"input": vec![text; 2048]}), None);
    assert_eq!(st, 200);
    assert_eq!(r["data"].as_array().unwrap().len(), 2048);
    let peak = rss_bytes(s.pid());
    std::thread::sleep(Duration::from_secs(2));
    let after = rss_bytes(s.pid());
    eprintln!(
        "RSS idle {} MiB, after the request {} MiB, 2 s later {} MiB",
        idle >> 20,
        peak >> 20,
        after >> 20
    );
    // The vectors, their JSON and the batch buffers are ~150 MiB here; 48 MiB of slack covers
    // allocator bookkeeping and thread stacks.
    assert!(
        after < idle + (48 << 20),
        "RSS stayed at {} MiB (idle {} MiB)",
        after >> 20,
        idle >> 20
    );
}

/// Regression: one large embeddings request made every request behind it wait (a single
/// "Hello!" took 26.7 s). Batches now take inputs from every waiting request in turn.
#[test]
fn a_small_embeddings_request_is_not_starved_by_a_large_one() {
    let tmp = tempfile::tempdir().unwrap();
    let s = std::sync::Arc::new(Server::start_with(&[minilm_gguf(tmp.path())], &[]));
    let t0 = Instant::now();
    let big = {
        let s = s.clone();
        std::thread::spawn(move || {
            let (st, _) = s.json(
                "POST",
                "/v1/embeddings",
                json!({"input": vec!["hello there ".repeat(16); 600]}),
                None,
            );
            (st, t0.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let (st, r) = s.json("POST", "/v1/embeddings", json!({"input": "Hello!"}), None);
    let small = t.elapsed();
    let small_done = t0.elapsed();
    assert_eq!(st, 200, "{r}");
    let (st, big) = big.join().unwrap();
    assert_eq!(st, 200);
    eprintln!("600 inputs of 32 words took {big:?}; one input sent 0.5 s later took {small:?}");
    if big <= t.duration_since(t0) {
        eprintln!("NOT RUN: the large request ended before the small one was sent ({big:?}), so this machine cannot show starvation");
        return;
    }
    // Behind the whole large request the small one would end after it; taking inputs from both in
    // turn, it ends first. (An order, not a ratio of times: a 3x ratio failed once on a loaded
    // 2-core CI run, 895 ms against 302 ms, with the small one done ~90 ms before the large one.)
    assert!(
        small_done < big,
        "the small request waited for the large one (done at {small_done:?}, the large at {big:?})"
    );
}

/// Regression: a queued stream got its headers and then nothing until a slot freed, and a client
/// that left while queued kept its place (and kept adding to the 429s). Now SSE comments keep it
/// alive, and it leaves the queue as soon as the client goes.
#[test]
fn queued_streams_get_keepalives_and_leave_the_queue_on_disconnect() {
    let s = std::sync::Arc::new(Server::start(&[
        "--parallel",
        "1",
        "--queue-capacity",
        "1",
        "--sse-keepalive",
        "0.3",
    ]));
    // Occupy the only slot.
    let long = json!({"max_tokens": 400, "temperature": 1, "seed": 1, "logit_bias": {"0": -100, "1": -100, "2": -100},
                      "messages": [{"role": "user", "content": "Tell me a very long story."}]});
    let runner = {
        let s = s.clone();
        std::thread::spawn(move || s.json("POST", "/v1/chat/completions", long, None).0)
    };
    s.wait_metric(
        &format!("hf2q_active_slots{{model=\"{SMOL}\"}}"),
        1.0,
        Duration::from_secs(30),
    );
    let body = json!({"stream": true, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let mut c = TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    c.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut got = Vec::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(1500) {
        let mut buf = [0u8; 1024];
        if let Ok(n) = c.read(&mut buf) {
            got.extend_from_slice(&buf[..n]);
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(!text.contains("data:"), "the slot was free after all: {text}");
    let comments = text.matches("\n:").count();
    assert!(comments >= 2, "expected keep-alive comments while queued: {text:?}");
    assert_eq!(s.metric(&format!("hf2q_queue_depth{{model=\"{SMOL}\"}}")), Some(1.0));
    // The client leaves: its place is free at once, so a new request is queued, not a 429.
    drop(c);
    s.wait_metric(
        &format!("hf2q_queue_depth{{model=\"{SMOL}\"}}"),
        0.0,
        Duration::from_secs(2),
    );
    let (st, head, _) = s.request("POST", "/v1/chat/completions", Some(&body), None);
    assert_eq!(st, 200, "{head}");
    assert_eq!(runner.join().unwrap(), 200);
}

/// Regression: a body shorter than its Content-Length held a connection forever (slowloris).
#[test]
fn slow_bodies_and_heads_time_out() {
    let s = Server::start(&["--body-timeout", "1", "--header-timeout", "1"]);
    let t = Instant::now();
    let raw = s.raw(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":",
        Duration::from_secs(10),
    );
    let (st, head, body) = split_response(&raw);
    assert_eq!(st, 408, "{raw}");
    let e = error_object(st, &head, &body);
    assert!(
        e["error"]["message"].as_str().unwrap().contains("--body-timeout"),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    // A head that never ends: the connection is closed.
    let t = Instant::now();
    let raw = s.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", Duration::from_secs(10));
    assert!(t.elapsed() < Duration::from_secs(8), "{:?} {raw}", t.elapsed());
}

/// Past `--max-connections` a client gets a JSON 503 at once instead of a hung connection.
#[test]
fn connections_past_the_limit_get_503() {
    let s = Server::start(&["--max-connections", "2", "--header-timeout", "30"]);
    // The readiness probes' connections have closed; hold two idle ones open.
    std::thread::sleep(Duration::from_millis(200));
    let _a = TcpStream::connect(&s.addr).unwrap();
    let _b = TcpStream::connect(&s.addr).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let raw = s.raw(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", Duration::from_secs(5));
    let (st, head, body) = split_response(&raw);
    assert_eq!(st, 503, "{raw}");
    let e = error_object(st, &head, &body);
    assert!(
        e["error"]["message"].as_str().unwrap().contains("--max-connections"),
        "{e}"
    );
    drop((_a, _b));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.request("GET", "/health", None, None).0, 200);
}

/// Regression: framing errors were `text/plain`, a bad Content-Length an empty 400, a wrong
/// method an empty 405. Every error on every route is OpenAI's JSON error object.
#[test]
fn every_error_is_json() {
    let s = Server::start(&[]);
    let cases: &[(&str, &[u8], u16)] = &[
        (
            "bad chunked framing",
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
            400,
        ),
        (
            "negative Content-Length",
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
            400,
        ),
        ("GET on a POST route", b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        ("POST on a GET route", b"POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405),
        ("unknown route", b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        ("garbage request line", b"\x01\x02 nonsense\r\n\r\n", 400),
        (
            "body over the limit",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n",
            413,
        ),
        (
            "invalid UTF-8 body",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n\xff\xfe\xfd\xfc",
            400,
        ),
    ];
    for (what, raw, want) in cases {
        let got = s.raw(raw, Duration::from_secs(5));
        let (st, head, body) = split_response(&got);
        assert_eq!(st, *want, "{what}: {got}");
        error_object(st, &head, &body);
    }
}

/// Regression: the follow-up of a tool round trip without `tools` in the request failed in the
/// template ("tried to use + operator on unsupported types string and none").
#[test]
fn tool_round_trip_without_tools_renders() {
    let s = Server::start(&[]);
    let msgs = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    ]);
    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"messages": msgs, "max_tokens": 8, "temperature": 0}),
        None,
    );
    assert_eq!(st, 200, "{r}");
    assert!(r["choices"][0]["message"]["content"].is_string(), "{r}");
}

/// Regression: a chat request naming the embedding model said it "does not exist".
#[test]
fn chat_naming_the_embedding_model_is_400() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Server::start_with(&[smollm2(), minilm_gguf(tmp.path())], &[]);
    for route in ["/v1/chat/completions", "/v1/completions"] {
        let (st, r) = s.json(
            "POST",
            route,
            json!({"model": "minilm", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}),
            None,
        );
        assert_eq!(st, 400, "{route}: {r}");
        assert_eq!(r["error"]["param"], "model");
        assert!(
            r["error"]["message"].as_str().unwrap().contains("embedding model"),
            "{r}"
        );
    }
    // An unknown name goes to the one chat model (the embedding model does not count), which the
    // reply names; with several chat models it is a 404 listing them (serve.rs).
    let body = json!({"model": "gpt-x", "prompt": "hi", "max_tokens": 2}).to_string();
    let (st, head, b) = s.request("POST", "/v1/completions", Some(&body), None);
    assert_eq!(st, 200, "{b}");
    assert!(head.to_ascii_lowercase().contains("x-hf2q-model: smollm2"), "{head}");
}

/// Regression: `hf2q_kv_tokens` counted the prefix cache with the positions in use, so an idle
/// server never read 0.
#[test]
fn kv_metrics_separate_use_from_cache() {
    let s = Server::start(&[]);
    let (st, _) = s.json(
        "POST",
        "/v1/completions",
        json!({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}),
        None,
    );
    assert_eq!(st, 200);
    s.wait_metric(
        &format!("hf2q_active_slots{{model=\"{SMOL}\"}}"),
        0.0,
        Duration::from_secs(30),
    );
    assert_eq!(s.metric(&format!("hf2q_kv_tokens{{model=\"{SMOL}\"}}")), Some(0.0));
    // The 12 kept tokens hold one page of the pool (64 positions).
    assert_eq!(
        s.metric(&format!("hf2q_kv_cached_tokens{{model=\"{SMOL}\"}}")),
        Some(64.0)
    );
}

/// Regression: the README said a json_schema reply always parses, but one cut off by
/// `max_tokens` cannot. What holds: `finish_reason: "length"` says so, and the text is a prefix
/// of a valid document; the README says exactly that.
#[test]
fn json_schema_cut_by_max_tokens_says_length() {
    let s = Server::start(&[]);
    let schema = json!({"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]});
    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"max_tokens": 6, "temperature": 0,
               "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
               "messages": [{"role": "user", "content": "Write a long story as JSON."}]}),
        None,
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    let text = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(serde_json::from_str::<Value>(text).is_err(), "{text}");
    assert!(text.trim_start().starts_with('{'), "{text}");
    let readme = include_str!("../../../README.md");
    assert!(
        readme.contains("`finish_reason: \"length\"`) is a valid prefix of such a document but not a whole one"),
        "the README must state what a cut-off structured reply is"
    );
}

/// Regression: logs written to a pipe or a file carried ANSI colour codes.
#[test]
fn logs_to_a_pipe_have_no_colour() {
    let out = Command::new(bin())
        .args([
            "--log-level",
            "info",
            "generate",
            "-p",
            "Hi",
            "-n",
            "2",
            "-t",
            "1",
            "-m",
        ])
        .arg(smollm2())
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("INFO"), "no log lines to check: {err}");
    assert!(!err.contains('\u{1b}'), "ANSI escape in piped logs: {err:?}");
}

/// Regression (README command 1): with port 8080 taken, `serve` failed after minutes of work.
/// Without `--port` it now takes the next free port and says which; an explicit `--port` that is
/// taken is still an error naming the flag.
#[test]
fn serve_picks_a_free_port_when_8080_is_taken() {
    // Hold 8080 (if something else holds it already, that serves as well).
    let _hold = std::net::TcpListener::bind("127.0.0.1:8080");
    let mut child = Command::new(bin())
        .args(["serve", "-t", "1", "-m"])
        .arg(smollm2())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stderr.take().unwrap()));
    let mut said_in_use = false;
    let addr = loop {
        let line = lines.next().expect("server exited").unwrap();
        said_in_use |= line.contains("port 8080 is in use");
        if let Some(a) = line.strip_prefix("hf2q serve: listening on http://") {
            break a.to_string();
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(said_in_use, "no note about the taken port");
    assert!(!addr.ends_with(":8080"), "{addr}");
    let out = Command::new(bin())
        .args(["serve", "--port", "8080", "-m"])
        .arg(smollm2())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--port"));
}

/// Regression (README command 1): `generate` ended without a newline, so the next command's
/// output continued its last line. Piped stdout stays exactly the text; the line ends on stderr.
#[test]
fn generate_ends_its_line_in_a_combined_log() {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' generate -m '{}' -p 'The capital of France is' -n 2 --temp 0 -t 2 2>&1",
            bin().display(),
            smollm2().display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.ends_with('\n'), "{text:?}");
}
