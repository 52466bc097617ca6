//! `hf2q serve`: an OpenAI-compatible HTTP server over the engine.
//!
//! Requests are parsed and validated ([`api`]) into typed values, turned into prompt tokens (the
//! model's chat template for chat completions), and queued to the model's engine thread
//! ([`worker`]); text comes back through a channel and is sent as one JSON response or as
//! server-sent events. Every error is OpenAI's error object with the right status ([`error`]).
//! Each model decodes `--parallel` sequences together with continuous batching (requests beyond
//! that queue, bounded; a full queue is a 429); tools, structured output, logprobs and `n > 1` are
//! answered with a clear 400 until they exist.

mod anthropic;
pub mod api;
mod chat;
pub mod conn;
pub mod embed;
pub mod error;
mod metrics;
mod models;
pub mod prefix;
pub mod reasoning;
mod respond;
mod responses;
pub mod routes;
mod single;
pub mod tools;
pub mod worker;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use engine::backend::select::{with_backend, BackendOptions, Device, WithBackend};
use engine::backend::Backend;
use engine::generate::{Finish, GenerateParams, LoadedModel};
use error::ApiError;
use models::{ensure_loaded, load_models, models_in, LazyModel, Loader};
use respond::{async_stream, record, respond, Timing};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use worker::Worker;

#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub host: String,
    pub port: u16,
    pub models: Vec<PathBuf>,
    /// Ids to serve the models under, in order (`--alias`); the others go by file stem.
    pub aliases: Vec<String>,
    /// Every GGUF file of this directory is served, loaded on first use (`--models-dir`).
    pub models_dir: Option<PathBuf>,
    /// Memory the loaded models may take together (`--models-memory`, bytes).
    pub models_memory: Option<u64>,
    pub api_key: Option<String>,
    pub threads: usize,
    /// The compute device (`--device`).
    pub device: Device,
    pub ctx: usize,
    pub queue_capacity: usize,
    pub max_body_bytes: usize,
    /// Sequences decoded together per model (continuous batching slots).
    pub parallel: usize,
    /// Most prompt tokens prefilled per step (`None`: the backend's default,
    /// `Backend::prefill_chunk`).
    pub prefill_chunk: Option<usize>,
    /// Origins allowed by CORS (`*` for any); empty: no CORS headers.
    pub cors_origins: Vec<String>,
    /// KV memory shared by a model's slots and prefix cache (default: parallel × ctx positions).
    pub kv_budget: Option<KvBudget>,
    /// Directory keeping prefix-cache blocks across restarts.
    pub kv_persist: Option<PathBuf>,
    pub kv_persist_max_bytes: u64,
    /// Connection limit and header read timeout.
    pub conn: conn::ConnLimits,
    /// Time a client has to send a request's whole body.
    pub body_timeout: std::time::Duration,
    /// Interval of SSE keep-alive comments while a stream has nothing else to send.
    pub sse_keepalive: std::time::Duration,
    /// Per-request limits of `/v1/embeddings`.
    pub embed_limits: embed::Limits,
    /// When `port` is taken, listen on another free port instead of failing (the default port).
    pub port_fallback: bool,
    /// `--chat-template-file`: a Jinja chat template used instead of the models' own.
    pub chat_template: Option<String>,
    /// `--pooling`: how embedding models pool their token states, when not as the model says.
    pub pooling: Option<engine::model::Pooling>,
    /// `--seed`: the sampling seed of requests that give none (else each gets a random one).
    pub seed: Option<u64>,
    /// `--debug-responses`: non-streamed chat and completions replies carry llama-server's
    /// `__verbose` object (the rendered prompt), as a request's `"verbose": true` asks.
    pub debug_responses: bool,
    /// `--spec`, `--draft-max`: speculative decoding of every request.
    pub spec: engine::spec::SpecMode,
    pub draft_max: usize,
}

/// `--kv-budget`: KV cache positions, or bytes converted with the model's bytes per position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KvBudget {
    Positions(usize),
    Bytes(u64),
}

impl KvBudget {
    /// `65536` (positions) or a size with a unit (`2GiB`, `512MiB`, `100MB`, `4096KiB`).
    pub fn parse(s: &str) -> Result<KvBudget, String> {
        let s = s.trim();
        if let Ok(n) = s.parse::<usize>() {
            return if n == 0 {
                Err("the KV budget must be at least one position".into())
            } else {
                Ok(KvBudget::Positions(n))
            };
        }
        parse_bytes(s).map(KvBudget::Bytes)
    }

    fn positions(self, position_bytes: usize) -> usize {
        match self {
            KvBudget::Positions(n) => n,
            KvBudget::Bytes(b) => (b / position_bytes.max(1) as u64) as usize,
        }
    }
}

/// A byte size: a number with an optional unit B, KB, MB, GB, KiB, MiB, GiB (case-insensitive).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 2GiB, 512MiB, 65536)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        u => {
            return Err(format!(
                "unknown size unit `{u}` in `{s}` (B, KB, MB, GB, KiB, MiB, GiB)"
            ))
        }
    };
    let v = num * mult;
    if !(1.0..1.8e19).contains(&v) {
        return Err(format!("`{s}` is not a usable size"));
    }
    Ok(v as u64)
}

struct AppState {
    cfg: ServeConfig,
    ready: AtomicBool,
    /// Stored Responses-API responses (`previous_response_id`).
    responses: std::sync::Mutex<responses::Store>,
    /// Models of `--models-dir`, loaded on first use.
    lazy: Vec<LazyModel>,
    /// Loads one model on the backend of the startup models (set once they are loaded).
    loader: std::sync::OnceLock<Loader>,
    /// Memory of each loaded model (`--models-memory` accounting), by id.
    footprints: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    workers: RwLock<Vec<Arc<Worker>>>,
    embedders: RwLock<Vec<Arc<embed::Embedder>>>,
    metrics: metrics::Metrics,
    fingerprint: String,
}

type Shared = Arc<AppState>;

/// Bind, then load the models in the background (`/readyz` turns 200 once they are loaded), and
/// serve until SIGINT/SIGTERM; in-flight requests finish before the process exits.
pub async fn run(cfg: ServeConfig) -> Result<(), String> {
    let listener = bind(&cfg).await?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let state = Arc::new(AppState {
        cfg: cfg.clone(),
        ready: AtomicBool::new(false),
        responses: Default::default(),
        lazy: match &cfg.models_dir {
            Some(d) => models_in(d)?,
            None => Vec::new(),
        },
        loader: std::sync::OnceLock::new(),
        footprints: Default::default(),
        workers: RwLock::new(Vec::new()),
        embedders: RwLock::new(Vec::new()),
        metrics: metrics::Metrics::default(),
        fingerprint: format!("hf2q-{}", env!("CARGO_PKG_VERSION")),
    });
    let loader = state.clone();
    let load = tokio::task::spawn_blocking(move || {
        load_models(&loader)?;
        eprintln!("{}", try_it(&loader, &local));
        Ok(())
    });
    eprintln!("hf2q serve: listening on http://{local}");
    let app = router(state.clone());
    let server = conn::serve(listener, app, cfg.conn, shutdown_signal());
    // A failed load ends the server with its error; a successful one leaves this pending forever.
    let load_failed = async move {
        match load.await {
            Ok(Ok(())) => std::future::pending::<String>().await,
            Ok(Err(e)) => e,
            Err(e) => e.to_string(),
        }
    };
    let r = tokio::select! {
        r = server => r.map_err(|e| e.to_string()),
        e = load_failed => Err(e),
    };
    // The models go (their engine threads end after their requests) and the process waits for
    // those threads: a GPU model's memory is freed before the driver is torn down at exit, and
    // prefix-cache blocks being written reach the disk.
    drop(state);
    let _ = tokio::task::spawn_blocking(|| join_threads(std::time::Duration::from_secs(30))).await;
    r
}

/// The server's own threads (engines, embedders, the prefix-cache writer), joined at shutdown.
static THREADS: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>> = std::sync::Mutex::new(Vec::new());

/// Start a server thread that shutdown waits for.
pub(crate) fn spawn_thread(name: String, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    let h = std::thread::Builder::new().name(name).spawn(f)?;
    let mut all = THREADS.lock().unwrap_or_else(|e| e.into_inner());
    // Threads of models unloaded earlier have ended: forget them.
    all.retain(|h| !h.is_finished());
    all.push(h);
    Ok(())
}

/// Wait up to `limit` for the server's threads to end (each ends once its model is dropped and
/// its requests are done); a thread still running then is left to the process exit, said on stderr.
fn join_threads(limit: std::time::Duration) {
    let deadline = std::time::Instant::now() + limit;
    let mut all = std::mem::take(&mut *THREADS.lock().unwrap_or_else(|e| e.into_inner()));
    while !all.is_empty() && std::time::Instant::now() < deadline {
        let (done, running): (Vec<_>, Vec<_>) = all.into_iter().partition(|h| h.is_finished());
        for h in done {
            let _ = h.join();
        }
        all = running;
        if !all.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    for h in &all {
        eprintln!(
            "hf2q serve: thread {} still running at exit",
            h.thread().name().unwrap_or("?")
        );
    }
}

/// Listen on `--host`:`--port`; when the default port is taken, on the next free one (said on
/// stderr) rather than failing after the models were fetched and converted.
async fn bind(cfg: &ServeConfig) -> Result<tokio::net::TcpListener, String> {
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let err = match tokio::net::TcpListener::bind(&addr).await {
        Ok(l) => return Ok(l),
        Err(e) => e,
    };
    if cfg.port_fallback && err.kind() == std::io::ErrorKind::AddrInUse {
        let next = (cfg.port.saturating_add(1)..=cfg.port.saturating_add(20)).chain([0]);
        for port in next {
            if let Ok(l) = tokio::net::TcpListener::bind((cfg.host.as_str(), port)).await {
                let got = l.local_addr().map_or(port, |a| a.port());
                eprintln!(
                    "hf2q serve: port {} is in use; using port {got} instead (choose one with --port)",
                    cfg.port
                );
                return Ok(l);
            }
        }
    }
    Err(format!(
        "cannot listen on {addr}: {err} (choose another port with --port)"
    ))
}

/// Ready-to-paste requests for the loaded models (the API key, if any, as `$HF2Q_API_KEY`).
fn try_it(state: &AppState, local: &std::net::SocketAddr) -> String {
    let auth = if state.cfg.api_key.is_some() {
        " -H \"Authorization: Bearer $HF2Q_API_KEY\""
    } else {
        ""
    };
    let mut out = String::from("hf2q serve: ready; try:");
    if let Some(w) = state.workers.read().unwrap_or_else(|e| e.into_inner()).first() {
        let body = json!({"model": w.id, "messages": [{"role": "user", "content": "Hello! Who are you?"}]});
        out.push_str(&format!(
            "\n  curl http://{local}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'"
        ));
    }
    if let Some(e) = state.embedders.read().unwrap_or_else(|e| e.into_inner()).first() {
        let body = json!({"model": e.id, "input": "Hello!"});
        out.push_str(&format!(
            "\n  curl http://{local}/v1/embeddings -H 'Content-Type: application/json'{auth} -d '{body}'"
        ));
    }
    out
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    eprintln!("hf2q serve: shutting down after in-flight requests");
}

use chat::{apply_template, chat_input_tokens, prepare_chat};

fn router(state: Shared) -> Router {
    Router::new()
        .route(routes::CHAT_COMPLETIONS, post(chat_completions))
        .route(routes::COMPLETIONS, post(completions))
        .route(routes::EMBEDDINGS, post(embeddings))
        .route(routes::MODELS, get(list_models))
        .route(routes::MODEL, get(get_model))
        .route(routes::RESPONSES, post(responses::create))
        .route(routes::RESPONSE, get(responses::get).delete(responses::delete))
        .route(routes::MESSAGES, post(anthropic::create))
        .route(routes::COUNT_TOKENS, post(anthropic::count_tokens))
        .route(routes::RESPONSE_INPUT_TOKENS, post(responses::input_tokens))
        .route(routes::CHAT_INPUT_TOKENS, post(chat_input_tokens))
        .route("/chat/completions/input_tokens", post(chat_input_tokens))
        .route("/responses/input_tokens", post(responses::input_tokens))
        // llama-server serves the OpenAI routes without the /v1 prefix too (clients configured
        // with a base URL that lacks it).
        .route("/chat/completions", post(chat_completions))
        .route("/completions", post(completions))
        .route("/embeddings", post(native_embeddings))
        .route("/embedding", post(native_embeddings))
        .route("/models", get(list_models))
        .route("/responses", post(responses::create))
        .route("/messages", post(anthropic::create))
        .route("/messages/count_tokens", post(anthropic::count_tokens))
        .route(routes::TOKENIZE, post(tokenize))
        .route(routes::DETOKENIZE, post(detokenize))
        .route("/apply-template", post(apply_template))
        .route(routes::HEALTH, get(|| async { Json(json!({"status": "ok"})) }))
        .route(routes::READYZ, get(readyz))
        .route(routes::METRICS, get(metrics))
        .fallback(|req: axum::extract::Request| async move {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("no such route: {} {}", req.method(), req.uri().path()),
            )
        })
        .method_not_allowed_fallback(|req: axum::extract::Request| async move {
            let allow = if req.uri().path().starts_with("/v1/responses/") {
                "GET, DELETE"
            } else if req.uri().path().starts_with("/v1/models")
                || [routes::HEALTH, routes::READYZ, routes::METRICS, "/models"].contains(&req.uri().path())
            {
                "GET"
            } else {
                "POST"
            };
            let mut r = ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                format!("{} {} is not served; use {allow}", req.method(), req.uri().path()),
            )
            .into_response();
            r.headers_mut()
                .insert("allow", axum::http::HeaderValue::from_static(allow));
            r
        })
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// API key, body size limit and per-route request counting around every handler.
async fn guard(State(st): State<Shared>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let origin = req
        .headers()
        .get("origin")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let allowed = origin
        .as_deref()
        .filter(|o| st.cfg.cors_origins.iter().any(|a| a == "*" || a == o))
        .map(|o| {
            if st.cfg.cors_origins.iter().any(|a| a == "*") {
                "*".to_string()
            } else {
                o.to_string()
            }
        });
    if req.method() == axum::http::Method::OPTIONS && allowed.is_some() {
        let mut r = StatusCode::NO_CONTENT.into_response();
        cors_headers(&mut r, allowed.as_deref());
        return r;
    }
    let mut resp = guarded(&st, req, next).await;
    cors_headers(&mut resp, allowed.as_deref());
    resp
}

fn cors_headers(r: &mut Response, allowed: Option<&str>) {
    let Some(origin) = allowed else { return };
    let h = r.headers_mut();
    if let Ok(v) = axum::http::HeaderValue::from_str(origin) {
        h.insert("access-control-allow-origin", v);
    }
    h.insert("vary", axum::http::HeaderValue::from_static("Origin"));
    h.insert(
        "access-control-allow-methods",
        axum::http::HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    h.insert(
        "access-control-allow-headers",
        axum::http::HeaderValue::from_static("authorization, content-type"),
    );
}

async fn guarded(st: &Shared, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let path = req.uri().path().to_string();
    let open = path == routes::HEALTH || path == routes::READYZ;
    let resp = if !open && !authorized(st, req.headers()) {
        if path.starts_with(routes::MESSAGES) {
            anthropic::error_response(ApiError::unauthorized())
        } else {
            ApiError::unauthorized().into_response()
        }
    } else {
        match read_body(st, req).await {
            Ok(req) => next.run(req).await,
            Err(e) => e.into_response(),
        }
    };
    let route = if path.starts_with("/v1/models/") {
        routes::MODEL.to_string()
    } else if path.starts_with("/v1/responses/") && path != routes::RESPONSE_INPUT_TOKENS {
        routes::RESPONSE.to_string()
    } else {
        path
    };
    *st.metrics
        .requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry((route, resp.status().as_u16()))
        .or_default() += 1;
    resp
}

/// The whole request body, read before the handler runs: within `--max-body-bytes` (413) and
/// `--body-timeout` (408, so a client that sends less than its Content-Length cannot hold a
/// connection), with framing errors (bad chunked encoding) as a JSON 400.
async fn read_body(st: &AppState, req: axum::extract::Request) -> Result<axum::extract::Request, ApiError> {
    use tokio_stream::StreamExt;
    let limit = st.cfg.max_body_bytes;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body exceeds {limit} bytes (--max-body-bytes)"),
        )
    };
    let declared = req
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let (parts, body) = req.into_parts();
    let mut data = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::with_capacity(declared.unwrap_or(0) as usize);
    let read = async {
        while let Some(chunk) = data.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::bad_request(format!(
                    "the request body could not be read (malformed chunked encoding or a body shorter \
                     than its Content-Length): {e}"
                ))
            })?;
            if buf.len() + chunk.len() > limit {
                return Err(too_large());
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(())
    };
    match tokio::time::timeout(st.cfg.body_timeout, read).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "the request body did not arrive within {} s (--body-timeout)",
                    st.cfg.body_timeout.as_secs_f64()
                ),
            )
            .with_code("request_timeout"))
        }
    }
    Ok(axum::extract::Request::from_parts(parts, axum::body::Body::from(buf)))
}

/// `Authorization: Bearer KEY`, or Anthropic's `x-api-key: KEY`.
fn authorized(st: &AppState, h: &HeaderMap) -> bool {
    let Some(key) = &st.cfg.api_key else { return true };
    let bearer = h
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let x_api_key = h.get("x-api-key").and_then(|v| v.to_str().ok());
    bearer.or(x_api_key).is_some_and(|k| k == key)
}

/// Says in a header which model served a request that named another one (see `worker`).
fn served_by(mut r: Response, requested: Option<&str>, served: &str) -> Response {
    if requested.is_some_and(|m| m != served) {
        if let Ok(v) = axum::http::HeaderValue::from_str(served) {
            r.headers_mut().insert("x-hf2q-model", v);
        }
    }
    r
}

/// The text model a request names (or the first one). An embedding model named by a text route
/// is a 400 saying so; an unknown name is a 404 listing every served model.
fn worker(st: &AppState, model: Option<&str>) -> Result<Arc<Worker>, ApiError> {
    if !st.ready.load(Ordering::Acquire) {
        return Err(ApiError::unavailable("the model is still loading"));
    }
    let ws = st.workers.read().unwrap_or_else(|e| e.into_inner());
    let es = st.embedders.read().unwrap_or_else(|e| e.into_inner());
    let not_text = |id: &str| {
        ApiError::invalid(
            "model",
            format!("{id} is an embedding model: it does not generate text (send it to /v1/embeddings)"),
        )
        .with_code("model_not_supported")
    };
    match model {
        None => ws.first().cloned().ok_or_else(|| match es.first() {
            Some(e) => not_text(&e.id),
            None => ApiError::unavailable("no model loaded"),
        }),
        // With one chat model, a name it does not have (agents often send a fixed "gpt-4o") is
        // that model, as llama-server does; the reply says which (`x-hf2q-model`, and the log).
        Some(id)
            if ws.len() == 1
                && st.lazy.is_empty()
                && !ws.iter().any(|w| w.id == id)
                && !es.iter().any(|e| e.id == id) =>
        {
            tracing::info!("request for model {id:?} served by {}, the only chat model", ws[0].id);
            Ok(ws[0].clone())
        }
        Some(id) => ws.iter().find(|w| w.id == id).cloned().ok_or_else(|| {
            if es.iter().any(|e| e.id == id) {
                return not_text(id);
            }
            let mut known: Vec<&str> = ws
                .iter()
                .map(|w| w.id.as_str())
                .chain(es.iter().map(|e| e.id.as_str()))
                .collect();
            for l in &st.lazy {
                if !known.contains(&l.id.as_str()) {
                    known.push(&l.id);
                }
            }
            ApiError::not_found(format!(
                "the model {id:?} does not exist (served: {})",
                known.join(", ")
            ))
        }),
    }
}

async fn metrics(State(st): State<Shared>) -> Response {
    ([("content-type", "text/plain; version=0.0.4")], metrics::render(&st)).into_response()
}

async fn readyz(State(st): State<Shared>) -> Response {
    if st.ready.load(Ordering::Acquire) {
        Json(json!({"status": "ready"})).into_response()
    } else {
        ApiError::unavailable("the model is still loading").into_response()
    }
}

/// OpenAI's model object.
fn model_object(id: &str, created: u64) -> Value {
    json!({"id": id, "object": "model", "created": created, "owned_by": "hf2q"})
}

async fn list_models(State(st): State<Shared>) -> Response {
    let mut data: Vec<Value> = st
        .workers
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|w| model_object(&w.id, w.created))
        .collect();
    for e in st.embedders.read().unwrap_or_else(|e| e.into_inner()).iter() {
        data.push(model_object(&e.id, e.created));
    }
    for m in data.iter_mut() {
        m["loaded"] = json!(true);
    }
    for l in &st.lazy {
        if !data.iter().any(|m| m["id"] == l.id.as_str()) {
            let mut m = model_object(&l.id, 0);
            m["loaded"] = json!(false);
            data.push(m);
        }
    }
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn get_model(State(st): State<Shared>, Path(id): Path<String>) -> Response {
    if let Some(e) = st
        .embedders
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|e| e.id == id)
    {
        return Json(model_object(&e.id, e.created)).into_response();
    }
    // Exactly this id: the one-model fallback of the generation routes does not apply to a lookup.
    let found = st
        .workers
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|w| w.id == id)
        .map(|w| model_object(&w.id, w.created));
    if let Some(m) = found {
        return Json(m).into_response();
    }
    if st.lazy.iter().any(|l| l.id == id) {
        let mut m = model_object(&id, 0);
        m["loaded"] = json!(false);
        return Json(m).into_response();
    }
    match worker(&st, Some(&id)) {
        Ok(_) => ApiError::not_found(format!("the model {id:?} does not exist")).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn embeddings(State(st): State<Shared>, body: Bytes) -> Response {
    embeddings_at(st, body, false).await
}

/// llama-server's `/embeddings` and `/embedding`: OpenAI's reply, or with `--pooling none` its own
/// per-token form.
async fn native_embeddings(State(st): State<Shared>, body: Bytes) -> Response {
    embeddings_at(st, body, true).await
}

async fn embeddings_at(st: Shared, body: Bytes, native: bool) -> Response {
    let b = match api::object(&body) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    if !st.ready.load(Ordering::Acquire) {
        return ApiError::unavailable("the model is still loading").into_response();
    }
    let model = b.get("model").and_then(Value::as_str);
    if let Err(e) = ensure_loaded(&st, model).await {
        return e.into_response();
    }
    let emb = {
        let es = st.embedders.read().unwrap_or_else(|e| e.into_inner());
        let ws = st.workers.read().unwrap_or_else(|e| e.into_inner());
        match model {
            None => es.first().cloned(),
            Some(id) => es.iter().find(|e| e.id == id).cloned().or_else(|| {
                // One embedding model serves names it does not have (clients send
                // "text-embedding-3-small"), unless the name is a chat model's.
                let only = es.len() == 1 && st.lazy.is_empty() && !ws.iter().any(|w| w.id == id);
                only.then(|| es[0].clone())
            }),
        }
    };
    let Some(emb) = emb else {
        return match worker(&st, model) {
            Ok(w) => ApiError::invalid(
                "model",
                format!(
                    "{} is not an embedding model (architecture {})",
                    w.id, w.model.info.arch
                ),
            )
            .into_response(),
            Err(e) => e.into_response(),
        };
    };
    match emb.request(&b, native).await {
        Ok(r) => Json(r).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn tokenize(State(st): State<Shared>, body: Bytes) -> Response {
    let r = (|| {
        let b = api::object(&body)?;
        let w = worker(&st, b.get("model").and_then(Value::as_str))?;
        let content = b
            .get("content")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid("content", "'content' must be a string"))?;
        let add_special = b.get("add_special").and_then(Value::as_bool).unwrap_or(false);
        let parse_special = b.get("parse_special").and_then(Value::as_bool).unwrap_or(true);
        let with_pieces = match b.get("with_pieces") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(p)) => *p,
            Some(_) => return Err(ApiError::invalid("with_pieces", "'with_pieces' must be a boolean")),
        };
        let tok = &w.model.tokenizer;
        let toks = tok
            .encode(content, add_special, parse_special)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if !with_pieces {
            return Ok::<_, ApiError>(Json(json!({"tokens": toks})).into_response());
        }
        // llama-server's `with_pieces`: each token's text, or its bytes when they are not UTF-8.
        let pieces: Vec<Value> = toks
            .iter()
            .map(|&id| {
                let bytes = tok.token_bytes(id, true);
                let piece = match String::from_utf8(bytes.clone()) {
                    Ok(s) => json!(s),
                    Err(_) => json!(bytes),
                };
                json!({"id": id, "piece": piece})
            })
            .collect();
        Ok(Json(json!({"tokens": pieces})).into_response())
    })();
    r.unwrap_or_else(|e| e.into_response())
}

async fn detokenize(State(st): State<Shared>, body: Bytes) -> Response {
    let r = (|| {
        let b = api::object(&body)?;
        let w = worker(&st, b.get("model").and_then(Value::as_str))?;
        let toks = b
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or_else(|| ApiError::invalid("tokens", "'tokens' must be an array of token ids"))?;
        let mut ids = Vec::with_capacity(toks.len());
        for t in toks {
            let id = t.as_u64().filter(|&v| (v as usize) < w.model.tokenizer.n_vocab());
            ids.push(id.ok_or_else(|| {
                ApiError::invalid(
                    "tokens",
                    format!(
                        "{t} is not a token id of this model ({} tokens)",
                        w.model.tokenizer.n_vocab()
                    ),
                )
            })? as u32);
        }
        Ok::<_, ApiError>(Json(json!({"content": w.model.tokenizer.decode(&ids, true)})).into_response())
    })();
    r.unwrap_or_else(|e| e.into_response())
}

fn finish_reason(f: Finish) -> &'static str {
    match f {
        Finish::Length => "length",
        _ => "stop",
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn new_id(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}-{:x}{:04x}", t, N.fetch_add(1, Ordering::Relaxed) & 0xffff)
}

/// An id in the Responses and Messages APIs' style: `resp_…`, `msg_…`, `toolu_…`.
fn new_item_id(prefix: &str) -> String {
    new_id(prefix).replacen('-', "_", 1)
}

/// What a completion job needs besides its prompt.
struct Prepared {
    worker: Arc<Worker>,
    prompt: Vec<u32>,
    params: GenerateParams,
    stream: bool,
    include_usage: bool,
    n: usize,
    format: Option<Option<Value>>,
    /// Parse replies for tool calls.
    tools: bool,
    /// Return every parsed call (`parallel_tool_calls`), or only the first.
    tools_parallel: bool,
    /// How the model writes tool calls (from its template).
    tool_format: tools::ToolFormat,
    /// A Lark grammar every reply must follow (forced tool call).
    grammar: Option<String>,
    /// Thinking model: its reasoning markers, and whether the reply starts inside them.
    reasoning: Option<(reasoning::Markers, bool)>,
    /// The chat template's output (chat requests).
    rendered: String,
    /// Add llama-server's `__verbose` debug object to a non-streamed reply.
    verbose: bool,
    /// llama-server's telemetry in streamed replies: `timings` in every chunk, `prompt_progress`.
    timings_per_token: bool,
    return_progress: bool,
}

fn prepare(w: Arc<Worker>, mut prompt: Vec<u32>, v: api::Valid) -> Result<Prepared, ApiError> {
    if let Some(keep) = v.truncate_prompt_tokens {
        // vLLM's extension: keep the last `keep` tokens of the prompt.
        if prompt.len() > keep {
            prompt.drain(..prompt.len() - keep);
        }
    }
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    if prompt.len() >= w.n_ctx {
        return Err(ApiError::context_exceeded(
            format!(
                "the prompt has {} tokens but the context of {} holds {} (prompt and at least one generated token)",
                prompt.len(),
                w.id,
                w.n_ctx
            ),
            prompt.len(),
            w.n_ctx,
        ));
    }
    let room = w.n_ctx - prompt.len();
    // Without max_tokens a reply may run to the end of the context, or of the KV budget when that
    // is smaller (a request with a larger explicit max_tokens is refused by the scheduler).
    let default_room = w.n_ctx.min(w.kv_capacity).saturating_sub(prompt.len()).max(1);
    let max_tokens = v.max_tokens.unwrap_or(default_room).min(room);
    for &(id, _) in &v.sampling.logit_bias {
        if id as usize >= w.model.tokenizer.n_vocab() {
            return Err(ApiError::invalid(
                "logit_bias",
                format!(
                    "token id {id} is outside the vocabulary of {}",
                    w.model.tokenizer.n_vocab()
                ),
            ));
        }
    }
    let grammar = v.grammar.clone();
    let mut sampling = v.sampling;
    if let (false, Some(seed)) = (v.seeded, w.seed) {
        sampling.seed = seed;
    }
    let params = GenerateParams {
        max_tokens,
        sampling,
        stop: v.stop,
        ignore_eos: false,
        n_batch: 512,
        logprobs: v.logprobs,
        spec: w.spec,
        draft_max: w.draft_max,
    };
    Ok(Prepared {
        worker: w,
        prompt,
        params,
        stream: v.stream,
        include_usage: v.include_usage,
        n: v.n,
        format: v.format,
        tools: false,
        tools_parallel: true,
        tool_format: tools::ToolFormat::Hermes,
        grammar,
        reasoning: None,
        rendered: String::new(),
        verbose: v.verbose,
        timings_per_token: v.timings_per_token,
        return_progress: v.return_progress,
    })
}

async fn chat_completions(State(st): State<Shared>, body: Bytes) -> Response {
    let b = match api::object(&body) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let requested = b.get("model").and_then(Value::as_str).map(str::to_string);
    if let Err(e) = ensure_loaded(&st, requested.as_deref()).await {
        return e.into_response();
    }
    match prepare_chat(&st, &b) {
        Ok(p) => {
            let served = p.worker.id.clone();
            served_by(respond(st, p, true).await, requested.as_deref(), &served)
        }
        Err(e) => e.into_response(),
    }
}

async fn completions(State(st): State<Shared>, body: Bytes) -> Response {
    if let Ok(b) = api::object(&body) {
        if let Err(e) = ensure_loaded(&st, b.get("model").and_then(Value::as_str)).await {
            return e.into_response();
        }
    }
    let prepared = (|| {
        let b = api::object(&body)?;
        let v = api::common(&b, false)?;
        let w = worker(&st, v.model.as_deref())?;
        let prompt = match b.get("prompt") {
            Some(Value::String(s)) => w
                .model
                .tokenizer
                .encode(s, true, true)
                .map_err(|e| ApiError::bad_request(e.to_string()))?,
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => w
                .model
                .tokenizer
                .encode(a[0].as_str().unwrap_or(""), true, true)
                .map_err(|e| ApiError::bad_request(e.to_string()))?,
            Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => {
                let n = w.model.tokenizer.n_vocab();
                let ids: Vec<u32> = a.iter().filter_map(Value::as_u64).map(|v| v as u32).collect();
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= n) {
                    return Err(ApiError::invalid(
                        "prompt",
                        format!("token id {bad} is outside the vocabulary of {n}"),
                    ));
                }
                ids
            }
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "'prompt' must be a string or an array of token ids",
                ))
            }
        };
        Ok((v.model.clone(), prepare(w, prompt, v)?))
    })();
    match prepared {
        Ok((requested, p)) => {
            let served = p.worker.id.clone();
            served_by(respond(st, p, false).await, requested.as_deref(), &served)
        }
        Err(e) => e.into_response(),
    }
}

/// OpenAI's logprobs entry of one token.
#[cfg(test)]
mod tests {
    use engine::chat::{ChatMessage, ChatTemplate};

    /// Regression: a template failure said only "chat template failed at line 4"; it now names
    /// the first message that fails to render as well.
    #[test]
    fn template_errors_name_the_message_and_line() {
        let tpl = ChatTemplate::new(
            "{% for m in messages %}\n{{ m.role }}: \n{{ m.content + '\\n' }}\n{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let mut msgs = vec![ChatMessage::new("user", "hi"), ChatMessage::new("assistant", "x")];
        msgs.push(ChatMessage::new("user", "again"));
        msgs[1].content = serde_json::Value::Null;
        let kwargs = serde_json::Map::new();
        let e = tpl.render(&msgs, None, true, &kwargs).unwrap_err();
        let api = super::chat::template_error(&tpl, &msgs, None, &kwargs, e);
        assert_eq!(api.param.as_deref(), Some("messages"));
        assert!(
            api.message.contains("at message 1 (role \"assistant\")"),
            "{}",
            api.message
        );
        assert!(api.message.contains("line 3"), "{}", api.message);
    }
}
