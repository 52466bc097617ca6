//! Prometheus metrics: request counts by route and status, latency and length histograms, token
//! counters, and per-model gauges (queue, slots, KV positions in use apart from those kept for
//! reuse, prefix-cache blocks, embedding work).

use crate::AppState;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub(crate) struct Metrics {
    pub requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub prompt_len: Histogram,
    pub completion_len: Histogram,
    /// Models of --models-dir loaded on demand, and unloaded to make room.
    pub model_loads: AtomicU64,
    pub model_unloads: AtomicU64,
}

/// A Prometheus histogram with fixed upper bounds.
pub(crate) struct Histogram {
    bounds: &'static [f64],
    state: Mutex<(Vec<u64>, f64, u64)>,
}

const SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const TOKENS: &[f64] = &[1.0, 8.0, 32.0, 128.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 32768.0];

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            state: Mutex::new((vec![0; bounds.len()], 0.0, 0)),
        }
    }
    pub fn observe(&self, v: f64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for (b, c) in self.bounds.iter().zip(st.0.iter_mut()) {
            if v <= *b {
                *c += 1;
            }
        }
        st.1 += v;
        st.2 += 1;
    }
    fn render(&self, name: &str, help: &str, out: &mut String) {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
        for (b, c) in self.bounds.iter().zip(&st.0) {
            out.push_str(&format!("{name}_bucket{{le=\"{b}\"}} {c}\n"));
        }
        out.push_str(&format!(
            "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}\n",
            st.2, st.1, st.2
        ));
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            ttft: Histogram::new(SECONDS),
            itl: Histogram::new(SECONDS),
            e2e: Histogram::new(SECONDS),
            prompt_len: Histogram::new(TOKENS),
            completion_len: Histogram::new(TOKENS),
            model_loads: AtomicU64::new(0),
            model_unloads: AtomicU64::new(0),
        }
    }
}

/// A per-model gauge: name, help text, and how to read it.
type Gauge<M, V> = (&'static str, &'static str, fn(&M) -> V);

/// The Prometheus text of `/metrics`.
pub(crate) fn render(st: &AppState) -> String {
    let mut out = String::new();
    out.push_str("# HELP hf2q_requests_total HTTP requests by route and status.\n# TYPE hf2q_requests_total counter\n");
    for ((route, status), n) in st.metrics.requests.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        out.push_str(&format!(
            "hf2q_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}\n"
        ));
    }
    for (name, help, v) in [
        (
            "hf2q_prompt_tokens_total",
            "Prompt tokens processed.",
            &st.metrics.prompt_tokens,
        ),
        (
            "hf2q_completion_tokens_total",
            "Tokens generated.",
            &st.metrics.completion_tokens,
        ),
        (
            "hf2q_prefix_cache_hit_tokens_total",
            "Prompt tokens reused from the KV cache.",
            &st.metrics.cached_tokens,
        ),
        (
            "hf2q_model_loads_total",
            "Models of --models-dir loaded on demand.",
            &st.metrics.model_loads,
        ),
        (
            "hf2q_model_unloads_total",
            "Idle models unloaded to make room under --models-memory.",
            &st.metrics.model_unloads,
        ),
    ] {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
            v.load(Ordering::Relaxed)
        ));
    }
    let m = &st.metrics;
    m.ttft.render(
        "hf2q_time_to_first_token_seconds",
        "Request arrival to first generated token.",
        &mut out,
    );
    m.itl.render(
        "hf2q_inter_token_latency_seconds",
        "Time between generated tokens of a stream.",
        &mut out,
    );
    m.e2e.render(
        "hf2q_request_duration_seconds",
        "Request arrival to the last token.",
        &mut out,
    );
    m.prompt_len
        .render("hf2q_prompt_tokens", "Prompt length per request.", &mut out);
    m.completion_len
        .render("hf2q_completion_tokens", "Generated tokens per request.", &mut out);
    let workers = st.workers.read().unwrap_or_else(|e| e.into_inner()).clone();
    let n_embed = st.embedders.read().unwrap_or_else(|e| e.into_inner()).len();
    out.push_str(&format!(
        "# HELP hf2q_models_loaded Models loaded now.\n# TYPE hf2q_models_loaded gauge\nhf2q_models_loaded {}\n",
        workers.len() + n_embed
    ));
    let gauges: [Gauge<crate::worker::Worker, usize>; 6] = [
        ("hf2q_queue_depth", "Requests waiting for a slot.", |w| w.queue_depth()),
        ("hf2q_active_slots", "Sequences being decoded.", |w| w.active_slots()),
        (
            "hf2q_kv_tokens",
            "KV cache positions reserved by the requests being served (0 when idle).",
            |w| w.kv().active,
        ),
        (
            "hf2q_kv_cached_tokens",
            "KV cache positions kept for reuse: the prefix cache and idle slots' last tokens.",
            |w| w.kv().cached,
        ),
        (
            "hf2q_kv_capacity_tokens",
            "KV cache positions of the budget (--kv-budget).",
            |w| w.kv_capacity,
        ),
        ("hf2q_prefix_cache_blocks", "Prefix-cache blocks in memory.", |w| {
            w.prefix_blocks()
        }),
    ];
    for (name, help, value) in gauges {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for w in &workers {
            out.push_str(&format!("{name}{{model=\"{}\"}} {}\n", w.id, value(w)));
        }
    }
    let spec: [Gauge<crate::worker::Worker, usize>; 3] = [
        ("hf2q_spec_checks_total", "Speculative decoding: steps that checked drafted tokens.", |w| {
            w.spec_stats().checks
        }),
        ("hf2q_spec_draft_tokens_total", "Speculative decoding: tokens drafted and checked.", |w| {
            w.spec_stats().drafted
        }),
        (
            "hf2q_spec_accepted_tokens_total",
            "Speculative decoding: drafted tokens that were the model's own (accepted tokens per check: (accepted + checks) / checks).",
            |w| w.spec_stats().accepted,
        ),
    ];
    for (name, help, value) in spec {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
        for w in &workers {
            out.push_str(&format!("{name}{{model=\"{}\"}} {}\n", w.id, value(w)));
        }
    }
    let embedders = st.embedders.read().unwrap_or_else(|e| e.into_inner()).clone();
    let embed_gauges: [Gauge<crate::embed::Embedder, f64>; 6] = [
        (
            "hf2q_embedding_requests_waiting",
            "Embedding requests queued or being embedded.",
            |e| e.stats().waiting as f64,
        ),
        ("hf2q_embedding_inputs_total", "Inputs (passages) embedded.", |e| {
            e.stats().inputs as f64
        }),
        ("hf2q_embedding_tokens_total", "Tokens embedded.", |e| {
            e.stats().tokens as f64
        }),
        (
            "hf2q_embedding_seconds_total",
            "Seconds spent in embedding forwards.",
            |e| e.stats().busy_micros as f64 / 1e6,
        ),
        (
            "hf2q_embedding_tokens_per_second",
            "Tokens embedded per second of forward time, since start.",
            |e| {
                let s = e.stats();
                s.tokens as f64 * 1e6 / s.busy_micros.max(1) as f64
            },
        ),
        (
            "hf2q_embedding_inputs_per_second",
            "Inputs (passages) embedded per second of forward time, since start.",
            |e| {
                let s = e.stats();
                s.inputs as f64 * 1e6 / s.busy_micros.max(1) as f64
            },
        ),
    ];
    for (name, help, value) in embed_gauges {
        let kind = if name.ends_with("_total") { "counter" } else { "gauge" };
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for e in &embedders {
            out.push_str(&format!("{name}{{model=\"{}\"}} {}\n", e.id, value(e)));
        }
    }
    out
}
