//! `/v1/embeddings`: one engine thread per embedding model. Requests queue to it; the thread takes
//! every request waiting (up to a token budget) and runs their inputs in one batched forward, so
//! concurrent requests share the work.

use crate::error::ApiError;
use engine::backend::cpu::Cpu;
use engine::model::bert::{l2_normalize, Bert};
use engine::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use tokio::sync::oneshot;

/// Tokens per batched forward across requests.
const BATCH_TOKENS: usize = 8192;

struct Job {
    inputs: Vec<Vec<u32>>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, ApiError>>,
}

pub struct Embedder {
    pub id: String,
    pub created: u64,
    pub dim: usize,
    pub max_tokens: usize,
    tokenizer: Arc<Tokenizer>,
    tx: SyncSender<Job>,
}

impl Embedder {
    pub fn start(
        id: String,
        cpu: Arc<Cpu>,
        gguf: &Arc<gguf::GgufModel>,
        path: &Path,
        queue_capacity: usize,
    ) -> engine::Result<Embedder> {
        let model = Bert::load(cpu, gguf, path)?;
        let tokenizer = Tokenizer::from_gguf(gguf.metadata())
            .map_err(|e| engine::EngineError::Model(format!("{}: tokenizer: {e}", path.display())))?;
        let (tx, rx) = sync_channel::<Job>(queue_capacity.max(1));
        let (dim, max_tokens) = (model.n_embd, model.n_ctx_train);
        std::thread::Builder::new()
            .name(format!("hf2q-embed-{id}"))
            .spawn(move || run(model, rx))
            .map_err(|e| engine::EngineError::Backend(format!("cannot start the embedding thread: {e}")))?;
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(Embedder {
            id,
            created,
            dim,
            max_tokens,
            tokenizer: Arc::new(tokenizer),
            tx,
        })
    }

    /// Validate an OpenAI embeddings request, embed its inputs and build the response.
    pub async fn request(&self, b: &Map<String, Value>) -> Result<Value, ApiError> {
        let truncate = b.get("truncate").and_then(Value::as_bool).unwrap_or(false);
        let texts_or_ids =
            match b.get("input") {
                Some(Value::String(s)) => vec![Input::Text(s.clone())],
                Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_string) => a
                    .iter()
                    .map(|v| Input::Text(v.as_str().unwrap_or_default().to_string()))
                    .collect(),
                Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => {
                    vec![Input::Ids(
                        a.iter().filter_map(Value::as_u64).map(|v| v as u32).collect(),
                    )]
                }
                Some(Value::Array(a))
                    if !a.is_empty()
                        && a.iter()
                            .all(|x| x.as_array().is_some_and(|y| y.iter().all(Value::is_u64))) =>
                {
                    a.iter()
                        .map(|x| {
                            Input::Ids(
                                x.as_array()
                                    .into_iter()
                                    .flatten()
                                    .filter_map(Value::as_u64)
                                    .map(|v| v as u32)
                                    .collect(),
                            )
                        })
                        .collect()
                }
                _ => return Err(ApiError::invalid(
                    "input",
                    "'input' must be a string, an array of strings, an array of token ids, or an array of such arrays",
                )),
            };
        let base64 = match b.get("encoding_format").and_then(Value::as_str) {
            None | Some("float") => false,
            Some("base64") => true,
            Some(f) => {
                return Err(ApiError::invalid(
                    "encoding_format",
                    format!("encoding_format {f:?} is not float or base64"),
                ))
            }
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
        let n_vocab = self.tokenizer.n_vocab();
        let mut inputs = Vec::with_capacity(texts_or_ids.len());
        for (i, x) in texts_or_ids.into_iter().enumerate() {
            let mut ids = match x {
                Input::Text(t) => self
                    .tokenizer
                    .encode(&t, true, false)
                    .map_err(|e| ApiError::bad_request(format!("input {i}: {e}")))?,
                Input::Ids(ids) => {
                    if let Some(bad) = ids.iter().find(|&&t| t as usize >= n_vocab) {
                        return Err(ApiError::invalid(
                            "input",
                            format!("input {i}: token id {bad} is outside the vocabulary of {n_vocab}"),
                        ));
                    }
                    ids
                }
            };
            if ids.is_empty() {
                return Err(ApiError::invalid("input", format!("input {i} is empty")));
            }
            if ids.len() > self.max_tokens {
                if !truncate {
                    return Err(ApiError::invalid(
                        "input",
                        format!(
                            "input {i} has {} tokens; the model takes at most {} (send \"truncate\": true to cut it)",
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
            inputs.push(ids);
        }
        let n_tokens: usize = inputs.iter().map(Vec::len).sum();
        let (reply, rx) = oneshot::channel();
        match self.tx.try_send(Job { inputs, reply }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(ApiError::busy()),
            Err(TrySendError::Disconnected(_)) => return Err(ApiError::unavailable("the embedding engine stopped")),
        }
        let vectors = rx
            .await
            .map_err(|_| ApiError::internal("the embedding engine stopped"))??;
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
}

enum Input {
    Text(String),
    Ids(Vec<u32>),
}

fn run(model: Bert<Cpu>, rx: Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        let mut tokens: usize = jobs[0].inputs.iter().map(Vec::len).sum();
        while tokens < BATCH_TOKENS {
            match rx.try_recv() {
                Ok(j) => {
                    tokens += j.inputs.iter().map(Vec::len).sum::<usize>();
                    jobs.push(j);
                }
                Err(_) => break,
            }
        }
        let all: Vec<Vec<u32>> = jobs.iter().flat_map(|j| j.inputs.iter().cloned()).collect();
        match model.embed(&all, true) {
            Ok(mut vecs) => {
                for j in jobs {
                    let rest = vecs.split_off(j.inputs.len());
                    let _ = j.reply.send(Ok(std::mem::replace(&mut vecs, rest)));
                }
            }
            Err(e) => {
                let err: ApiError = e.into();
                for j in jobs {
                    let _ = j.reply.send(Err(err.clone()));
                }
            }
        }
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
