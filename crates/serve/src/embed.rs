//! `/v1/embeddings`: one engine thread per embedding model. A request is refused at once (400)
//! when it has more inputs or tokens than `--embed-max-inputs` / `--embed-max-tokens`. Accepted
//! requests queue to the thread, which runs their inputs in bounded batches: each batch takes one
//! input from every waiting request in turn (so a large request cannot starve a small one) up to a
//! token budget sized to about [`BATCH_SECONDS`] of work, and a request whose client has gone away
//! is dropped before the next batch. When the thread goes idle it hands freed memory back to the OS.

use crate::error::ApiError;
use engine::backend::Backend;
use engine::model::l2_normalize;
use engine::model::{Encoder, Pooling};
use engine::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// Work per batched forward: a client that leaves stops costing CPU within about this long.
const BATCH_SECONDS: f64 = 0.2;
/// Token budget of the first batch, before a speed was measured; and the bounds of the budget.
const FIRST_BATCH_TOKENS: usize = 64;
const MAX_BATCH_TOKENS: usize = 8192;
/// How long the thread waits idle before giving freed memory back to the OS.
const IDLE_TRIM: std::time::Duration = std::time::Duration::from_millis(500);

/// Per-request limits (OpenAI's: 2,048 inputs, 300,000 tokens).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_inputs: usize,
    pub max_tokens: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_inputs: 2048,
            max_tokens: 300_000,
        }
    }
}

struct Job {
    inputs: Vec<Vec<u32>>,
    /// Vectors of the inputs embedded so far (in order), and the next input to batch.
    done: Vec<Vec<f32>>,
    next: usize,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, ApiError>>,
}

/// Counters for `/metrics`.
#[derive(Default)]
struct Counters {
    waiting: AtomicU64,
    inputs: AtomicU64,
    tokens: AtomicU64,
    busy_micros: AtomicU64,
}

/// A snapshot of an embedder's counters.
pub struct Stats {
    /// Requests queued or being embedded.
    pub waiting: u64,
    pub inputs: u64,
    pub tokens: u64,
    pub busy_micros: u64,
}

pub struct Embedder {
    pub id: String,
    pub created: u64,
    pub dim: usize,
    pub max_tokens: usize,
    limits: Limits,
    /// `--pooling`: how vectors are pooled, when not as the model says.
    pooling: Option<Pooling>,
    tokenizer: Arc<Tokenizer>,
    tx: SyncSender<Job>,
    counters: Arc<Counters>,
}

impl Embedder {
    pub fn start<B: Backend>(
        id: String,
        backend: Arc<B>,
        gguf: &Arc<gguf::GgufModel>,
        path: &Path,
        queue_capacity: usize,
        limits: Limits,
        pooling: Option<Pooling>,
    ) -> engine::Result<Embedder> {
        let model = engine::model::load_encoder(backend, gguf, path)?;
        let tokenizer = Tokenizer::from_gguf(gguf.metadata())
            .map_err(|e| engine::EngineError::Model(format!("{}: tokenizer: {e}", path.display())))?;
        let capacity = queue_capacity.max(1);
        let (tx, rx) = sync_channel::<Job>(capacity);
        let (dim, max_tokens) = (model.n_embd(), model.n_ctx_train());
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        crate::spawn_thread(format!("hf2q-embed-{id}"), move || {
            run(model, rx, capacity, pooling, &c)
        })
        .map_err(|e| engine::EngineError::Backend(format!("cannot start the embedding thread: {e}")))?;
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(Embedder {
            id,
            created,
            dim,
            max_tokens,
            limits,
            pooling,
            tokenizer: Arc::new(tokenizer),
            tx,
            counters,
        })
    }

    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        Stats {
            waiting: c.waiting.load(Ordering::Relaxed),
            inputs: c.inputs.load(Ordering::Relaxed),
            tokens: c.tokens.load(Ordering::Relaxed),
            busy_micros: c.busy_micros.load(Ordering::Relaxed),
        }
    }

    /// Validate an OpenAI embeddings request, embed its inputs and build the response. `native`:
    /// the request came to llama-server's own `/embeddings` route, which alone can answer with
    /// per-token vectors (`--pooling none`), in llama-server's form.
    pub async fn request(&self, b: &Map<String, Value>, native: bool) -> Result<Value, ApiError> {
        let per_token = self.pooling == Some(Pooling::None);
        if per_token && !native {
            return Err(ApiError::bad_request(format!(
                "model {} is served with --pooling none (one vector per token), which /v1/embeddings \
                 cannot return: send the request to /embeddings, or serve the model with another --pooling",
                self.id
            ))
            .with_code("pooling_none"));
        }
        let texts_or_ids = inputs_of(b.get("input").or_else(|| if native { b.get("content") } else { None }))?;
        if texts_or_ids.len() > self.limits.max_inputs {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "the request has {} inputs; this server takes at most {} per request (--embed-max-inputs)",
                    texts_or_ids.len(),
                    self.limits.max_inputs
                ),
            ));
        }
        let base64 = match b.get("encoding_format") {
            None | Some(Value::Null) => false,
            Some(Value::String(f)) if f == "float" => false,
            Some(Value::String(f)) if f == "base64" => true,
            Some(f) => {
                return Err(ApiError::invalid(
                    "encoding_format",
                    format!("'encoding_format' must be \"float\" or \"base64\", got {f}"),
                ))
            }
        };
        let truncate = match b.get("truncate") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(t)) => *t,
            Some(_) => return Err(ApiError::invalid("truncate", "'truncate' must be a boolean")),
        };
        let dims = match b.get("dimensions") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let d = v
                    .as_u64()
                    .filter(|&d| d >= 1)
                    .ok_or_else(|| ApiError::invalid("dimensions", "'dimensions' must be a positive integer"))?
                    as usize;
                if d > self.dim {
                    return Err(ApiError::invalid(
                        "dimensions",
                        format!("the model's vectors have {} dimensions; {d} were asked for", self.dim),
                    ));
                }
                Some(d)
            }
        };
        // Tokenizing a few thousand inputs takes a while: off the async workers.
        let inputs = tokio::task::block_in_place(|| self.tokenize(texts_or_ids, truncate))?;
        let n_tokens: usize = inputs.iter().map(Vec::len).sum();
        let n_inputs = inputs.len();
        let (reply, rx) = oneshot::channel();
        let job = Job {
            inputs,
            done: Vec::with_capacity(n_inputs),
            next: 0,
            reply,
        };
        self.counters.waiting.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.counters.waiting.fetch_sub(1, Ordering::Relaxed);
                return Err(ApiError::busy());
            }
            Err(TrySendError::Disconnected(_)) => {
                self.counters.waiting.fetch_sub(1, Ordering::Relaxed);
                return Err(ApiError::unavailable("the embedding engine stopped"));
            }
        }
        // Dropping `rx` (the client left, the handler was dropped) cancels the remaining batches.
        let vectors = rx
            .await
            .map_err(|_| ApiError::internal("the embedding engine stopped"))??;
        if per_token {
            // llama-server's form: per input, its token vectors.
            let rows: Vec<Value> = vectors
                .into_iter()
                .enumerate()
                .map(|(i, v)| {
                    let toks: Vec<&[f32]> = v.chunks(self.dim).collect();
                    json!({"index": i, "embedding": toks})
                })
                .collect();
            return Ok(Value::Array(rows));
        }
        let data: Vec<Value> = vectors
            .into_iter()
            .enumerate()
            .map(|(i, mut v)| {
                if let Some(d) = dims {
                    // Matryoshka: keep the leading dimensions, back to unit length.
                    v.truncate(d);
                    l2_normalize(&mut v);
                }
                let emb = if base64 { Value::String(b64(&v)) } else { json!(v) };
                json!({"object": "embedding", "index": i, "embedding": emb})
            })
            .collect();
        Ok(json!({"object": "list", "data": data, "model": self.id,
                  "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}))
    }

    /// Token ids of every input, checked against the vocabulary, the model's input length and the
    /// per-request token limit.
    fn tokenize(&self, texts_or_ids: Vec<Input>, truncate: bool) -> Result<Vec<Vec<u32>>, ApiError> {
        let n_vocab = self.tokenizer.n_vocab();
        let mut inputs = Vec::with_capacity(texts_or_ids.len());
        let mut total = 0usize;
        for (i, x) in texts_or_ids.into_iter().enumerate() {
            let mut ids = match x {
                Input::Text(t) => self
                    .tokenizer
                    .encode(&t, true, false)
                    .map_err(|e| ApiError::bad_request(format!("input {i}: {e}")))?,
                Input::Ids(ids) => ids,
                // Token ids and text in one input: the text pieces tokenized without special
                // tokens, in order (the ids say where the specials go).
                Input::Mixed(pieces) => {
                    let mut ids = Vec::new();
                    for p in pieces {
                        match p {
                            Input::Text(t) => ids.extend(
                                self.tokenizer
                                    .encode(&t, false, false)
                                    .map_err(|e| ApiError::bad_request(format!("input {i}: {e}")))?,
                            ),
                            Input::Ids(x) => ids.extend(x),
                            Input::Mixed(_) => unreachable!("pieces are flat"),
                        }
                    }
                    ids
                }
            };
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(ApiError::invalid(
                    "input",
                    format!("input {i}: token id {bad} is outside the vocabulary of {n_vocab}"),
                ));
            }
            if ids.is_empty() {
                return Err(ApiError::invalid("input", format!("input {i} is empty")));
            }
            if ids.len() > self.max_tokens {
                if !truncate {
                    return Err(ApiError::invalid(
                        "input",
                        format!(
                            "input {i} is too large: {} tokens; the model takes at most {} (send \"truncate\": true to cut it)",
                            ids.len(),
                            self.max_tokens
                        ),
                    )
                    .with_code("context_length_exceeded"));
                }
                let last = *ids.last().unwrap_or(&0);
                ids.truncate(self.max_tokens);
                if let Some(l) = ids.last_mut() {
                    *l = last;
                }
            }
            total += ids.len();
            if total > self.limits.max_tokens {
                return Err(ApiError::invalid(
                    "input",
                    format!(
                        "the request's inputs have more than {} tokens together, this server's limit per \
                         request (--embed-max-tokens)",
                        self.limits.max_tokens
                    ),
                ));
            }
            inputs.push(ids);
        }
        Ok(inputs)
    }
}

enum Input {
    Text(String),
    Ids(Vec<u32>),
    /// Token ids and text pieces of one input, in order.
    Mixed(Vec<Input>),
}

/// The inputs of an embeddings request: OpenAI's forms (a string, strings, token ids, arrays of
/// token ids) and llama-server's (an input mixing token ids and strings, and input objects
/// `{"prompt_string": s}` / `{"content": [text parts]}`; this server embeds text only).
fn inputs_of(v: Option<&Value>) -> Result<Vec<Input>, ApiError> {
    let shape = || {
        ApiError::invalid(
            "input",
            "'input' must be a string, an array of strings, an array of token ids, or an array of such arrays \
             (or input objects with \"content\" / \"prompt_string\")",
        )
    };
    let id = |x: &Value| x.as_u64().and_then(|v| u32::try_from(v).ok());
    // One input given as an array: token ids, or token ids and strings.
    let pieces = |a: &[Value]| -> Result<Input, ApiError> {
        if let Some(ids) = a.iter().map(id).collect::<Option<Vec<u32>>>() {
            return Ok(Input::Ids(ids));
        }
        a.iter()
            .map(|x| match x {
                Value::String(s) => Ok(Input::Text(s.clone())),
                x => id(x).map(|t| Input::Ids(vec![t])).ok_or_else(shape),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Input::Mixed)
    };
    let object = |o: &serde_json::Map<String, Value>| -> Result<Input, ApiError> {
        if let Some(Value::String(s)) = o.get("prompt_string") {
            return Ok(Input::Text(s.clone()));
        }
        // `content` is a list of parts (llama-server refuses a bare string there too).
        match o.get("content") {
            Some(Value::Array(parts)) if !parts.is_empty() => {
                crate::api::text_parts(parts, "").map(Input::Text).map_err(|ty| {
                    ApiError::invalid(
                        "input",
                        format!("input content part {ty} is not text: this embedding model takes text only"),
                    )
                })
            }
            _ => Err(shape()),
        }
    };
    match v {
        Some(Value::String(s)) => Ok(vec![Input::Text(s.clone())]),
        Some(Value::Object(o)) => Ok(vec![object(o)?]),
        Some(Value::Array(a)) if a.is_empty() => Err(shape()),
        // Only ids and strings, at least one id: one input (all strings: one input each).
        Some(Value::Array(a))
            if a.iter().any(|x| id(x).is_some()) && a.iter().all(|x| x.is_string() || id(x).is_some()) =>
        {
            Ok(vec![pieces(a)?])
        }
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(Input::Text(s.clone())),
                Value::Array(p) if !p.is_empty() => pieces(p),
                Value::Object(o) => object(o),
                _ => Err(shape()),
            })
            .collect(),
        _ => Err(shape()),
    }
}

fn run<B: Backend>(
    model: Box<dyn Encoder<B>>,
    rx: Receiver<Job>,
    capacity: usize,
    pooling: Option<Pooling>,
    counters: &Counters,
) {
    let mut active: VecDeque<Job> = VecDeque::new();
    let mut budget = FIRST_BATCH_TOKENS;
    loop {
        if active.is_empty() {
            // Idle: once nothing has come for a moment (the last replies are serialised and sent
            // by then, on other threads), hand freed memory back, then wait.
            match rx.recv_timeout(IDLE_TRIM) {
                Ok(j) => active.push_back(j),
                Err(RecvTimeoutError::Timeout) => {
                    release_free_memory();
                    match rx.recv() {
                        Ok(j) => active.push_back(j),
                        Err(_) => return,
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        while active.len() < capacity {
            match rx.try_recv() {
                Ok(j) => active.push_back(j),
                Err(_) => break,
            }
        }
        // Clients that left: their remaining inputs are not embedded.
        let before = active.len();
        active.retain(|j| !j.reply.is_closed());
        counters
            .waiting
            .fetch_sub((before - active.len()) as u64, Ordering::Relaxed);
        if active.is_empty() {
            continue;
        }
        // One input from each request in turn, up to the budget (at least one input).
        let mut batch: Vec<(usize, usize)> = Vec::new();
        let mut tokens = 0usize;
        'fill: loop {
            let mut took = false;
            for (k, j) in active.iter_mut().enumerate() {
                let Some(ids) = j.inputs.get(j.next) else { continue };
                if tokens > 0 && tokens + ids.len() > budget {
                    break 'fill;
                }
                tokens += ids.len();
                batch.push((k, j.next));
                j.next += 1;
                took = true;
            }
            if !took {
                break;
            }
        }
        let all: Vec<Vec<u32>> = batch.iter().map(|&(k, i)| active[k].inputs[i].clone()).collect();
        let t0 = Instant::now();
        let result = model.embed(&all, pooling, pooling != Some(Pooling::None));
        let took = t0.elapsed();
        drop(all);
        counters
            .busy_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        // Size the next batch to BATCH_SECONDS at the speed just measured.
        let per_token = took.as_secs_f64() / tokens.max(1) as f64;
        budget = ((BATCH_SECONDS / per_token.max(1e-9)) as usize).clamp(1, MAX_BATCH_TOKENS);
        match result {
            Ok(vecs) => {
                counters.inputs.fetch_add(vecs.len() as u64, Ordering::Relaxed);
                counters.tokens.fetch_add(tokens as u64, Ordering::Relaxed);
                // Batches take inputs in order per request, so each vector goes to the end of its
                // request's list.
                for (&(k, _), v) in batch.iter().zip(vecs) {
                    active[k].done.push(v);
                }
            }
            Err(e) => {
                let err: ApiError = e.into();
                let mut failed: Vec<usize> = batch.iter().map(|&(k, _)| k).collect();
                failed.sort_unstable();
                failed.dedup();
                for &k in failed.iter().rev() {
                    if let Some(j) = active.remove(k) {
                        counters.waiting.fetch_sub(1, Ordering::Relaxed);
                        let _ = j.reply.send(Err(err.clone()));
                    }
                }
                continue;
            }
        }
        let mut k = 0;
        while k < active.len() {
            if active[k].done.len() == active[k].inputs.len() {
                let j = active.remove(k).expect("index in range");
                counters.waiting.fetch_sub(1, Ordering::Relaxed);
                let _ = j.reply.send(Ok(j.done));
            } else {
                k += 1;
            }
        }
        // The next batch starts with another request.
        active.rotate_left(1.min(active.len()));
    }
}

/// Give the heap's free pages back to the OS (glibc keeps them otherwise, so one large batch would
/// hold its peak memory for the life of the process).
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Standard base64 of the vector's little-endian f32 bytes (OpenAI's `encoding_format: base64`).
fn b64(v: &[f32]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for k in 0..4 {
            if k <= c.len() {
                out.push(T[(n >> (18 - 6 * k)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_rfc4648() {
        let v = [f32::from_le_bytes(*b"Man!")];
        assert_eq!(super::b64(&v), "TWFuIQ==");
    }
}
