//! A bounded soak of `hf2q serve` (SmolLM2 and MiniLM, `--parallel 4`, a queue of 24): 64
//! concurrent clients, each making five requests drawn from a seeded mix of streamed and unary
//! chat, `n = 2`, stop strings, `json_schema`, completions and embeddings; a third of the streams
//! are dropped mid-reply and some requests are dropped while they wait in the queue. At the end:
//! no 5xx, every client that stayed connected got its whole answer or a 429, the slots, the queue
//! and the KV positions in use are back to 0 (the prefix cache is reported apart), resident memory
//! stayed bounded, and a normal request answers within a second.

mod common;

use common::server::{minilm_gguf, rss_bytes, split_response, Server};
use common::smollm2;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SMOL: &str = "SmolLM2-135M-Instruct.Q4_1";
const CLIENTS: usize = 64;
const REQUESTS_EACH: usize = 5;

#[derive(Default, Debug)]
struct Tally {
    ok: usize,
    busy: usize,
    dropped_streaming: usize,
    dropped_queued: usize,
    /// Anything else: (what, status, body).
    bad: Vec<(String, u16, String)>,
}

/// A small deterministic generator (xorshift64*), one per client.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn request(kind: u64, rng: &mut Rng) -> (&'static str, Value) {
    let topics = ["owls", "rivers", "bread", "stars", "chess", "rain", "maps", "bees"];
    let topic = topics[rng.below(topics.len() as u64) as usize];
    let (max_tokens, seed, n_inputs) = (16 + rng.below(16), rng.below(1000), 1 + rng.below(24));
    let chat = |extra: Value| {
        let mut b = json!({"model": SMOL, "max_tokens": max_tokens, "temperature": 0.7, "seed": seed,
                           "messages": [{"role": "user", "content": format!("Tell me about {topic}.")}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    match kind {
        0 => (
            "/v1/chat/completions",
            chat(json!({"stream": true, "stream_options": {"include_usage": true}})),
        ),
        1 => ("/v1/chat/completions", chat(json!({}))),
        2 => ("/v1/chat/completions", chat(json!({"n": 2, "stream": true}))),
        3 => ("/v1/chat/completions", chat(json!({"stop": [".", "\n"]}))),
        4 => (
            "/v1/chat/completions",
            chat(
                json!({"max_tokens": 48, "response_format": {"type": "json_schema", "json_schema": {"name": "t",
                "schema": {"type": "object", "properties": {"fact": {"type": "string", "maxLength": 20}}, "required": ["fact"]}}}}),
            ),
        ),
        5 => (
            "/v1/completions",
            json!({"model": SMOL, "prompt": format!("A poem about {topic}:"), "max_tokens": 16, "stream": true}),
        ),
        _ => (
            "/v1/embeddings",
            json!({"model": "minilm", "input": (0..n_inputs).map(|i| format!("{topic} sentence {i}")).collect::<Vec<_>>()}),
        ),
    }
}

/// How a client treats its request: read the whole answer, drop it after the first streamed
/// data, or drop it right after sending (while it waits in the queue).
#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    Complete,
    DropMidStream,
    DropQueued,
}

fn run_one(addr: &str, path: &str, body: &Value, how: Behaviour, tally: &Mutex<Tally>) {
    let body = body.to_string();
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(100))).unwrap();
    write!(
        c,
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let streaming = body.contains("\"stream\":true");
    match how {
        Behaviour::DropQueued => {
            std::thread::sleep(Duration::from_millis(20));
            drop(c);
            tally.lock().unwrap().dropped_queued += 1;
            return;
        }
        Behaviour::DropMidStream if streaming => {
            let mut got = Vec::new();
            let mut buf = [0u8; 2048];
            while !String::from_utf8_lossy(&got).contains("data: {") {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            drop(c);
            let text = String::from_utf8_lossy(&got).into_owned();
            let (st, _, _) = split_response(&text);
            let mut t = tally.lock().unwrap();
            match st {
                200 => t.dropped_streaming += 1,
                429 => t.busy += 1,
                _ => t.bad.push((path.to_string(), st, text)),
            }
            return;
        }
        _ => {}
    }
    let mut raw = Vec::new();
    let _ = c.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (st, _, b) = split_response(&text);
    let complete = match st {
        200 if streaming => b.trim_end().ends_with("data: [DONE]") && !b.contains("\"error\""),
        200 => serde_json::from_str::<Value>(&b).is_ok_and(|v| v.get("error").is_none()),
        _ => false,
    };
    let mut t = tally.lock().unwrap();
    if complete {
        t.ok += 1;
    } else if st == 429 {
        t.busy += 1;
    } else {
        t.bad.push((path.to_string(), st, b));
    }
}

#[test]
fn sixty_four_mixed_clients_leave_the_server_clean() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Arc::new(Server::start_with(
        &[smollm2(), minilm_gguf(tmp.path())],
        &["--parallel", "4", "--queue-capacity", "24", "--ctx", "1024"],
    ));
    // Warm up once (the JSON grammar is built on first use), then note the resident memory.
    let (st, _) = s.json("POST", "/v1/embeddings", json!({"input": "warm"}), None);
    assert_eq!(st, 200);
    let rss0 = rss_bytes(s.pid());
    let tally = Arc::new(Mutex::new(Tally::default()));
    let t0 = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (s, tally) = (s.clone(), tally.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((c as u64 + 1) * 0x1000_0001));
                for _ in 0..REQUESTS_EACH {
                    let kind = rng.below(7);
                    let (path, body) = request(kind, &mut rng);
                    let how = match (c % 3, rng.below(4)) {
                        (0, _) => Behaviour::DropMidStream,
                        (_, 0) => Behaviour::DropQueued,
                        _ => Behaviour::Complete,
                    };
                    run_one(&s.addr, path, &body, how, &tally);
                }
                if std::env::var_os("HF2Q_SOAK_TRACE").is_some() {
                    eprintln!("client {c} done");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let took = t0.elapsed();
    let t = tally.lock().unwrap();
    eprintln!("soak: {took:?}, {t:?}");
    assert!(t.bad.is_empty(), "unexpected answers: {:#?}", t.bad);
    assert!(t.ok > CLIENTS, "too few completed requests: {t:?}");
    // Everything given back: slots, queue, KV in use, embedding work.
    for (sample, want) in [
        (format!("hf2q_active_slots{{model=\"{SMOL}\"}}"), 0.0),
        (format!("hf2q_queue_depth{{model=\"{SMOL}\"}}"), 0.0),
        (format!("hf2q_kv_tokens{{model=\"{SMOL}\"}}"), 0.0),
        ("hf2q_embedding_requests_waiting{model=\"minilm\"}".to_string(), 0.0),
    ] {
        s.wait_metric(&sample, want, Duration::from_secs(10));
    }
    let m = s.request("GET", "/metrics", None, None).2;
    // (/readyz answers 503 while the models load, before the soak.)
    assert!(
        !m.lines()
            .any(|l| l.starts_with("hf2q_requests_total") && !l.contains("/readyz") && l.contains("status=\"5")),
        "{m}"
    );
    let rss = rss_bytes(s.pid());
    eprintln!("RSS {} MiB before, {} MiB after", rss0 >> 20, rss >> 20);
    // The KV budget (4 slots × 1024 positions, f16: ~90 MiB for this model) and the batch buffers
    // bound what the server may add; 512 MiB is far above that and far below a leak.
    assert!(
        rss < rss0 + (512 << 20),
        "RSS grew from {} to {} MiB",
        rss0 >> 20,
        rss >> 20
    );
    let t = Instant::now();
    let (st, r) = s.json(
        "POST",
        "/v1/chat/completions",
        json!({"max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": "What is 2 + 3?"}]}),
        None,
    );
    let answered = t.elapsed();
    eprintln!("a normal request after the soak: {answered:?}");
    assert_eq!(st, 200, "{r}");
    assert!(answered < Duration::from_secs(1), "took {answered:?}");
}
