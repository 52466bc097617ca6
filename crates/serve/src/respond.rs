//! Answering a prepared chat or text completion: one engine job per choice, the reply as one JSON
//! object or as an SSE stream, the latency metrics of each request.
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::generate::Finish;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

use crate::error::ApiError;
use crate::worker::{Event, Job, Progress};
use crate::{finish_reason, new_id, now, reasoning, tools, AppState, Prepared, Shared};
pub(crate) fn logprob_json(tok: &engine::tokenizer::Tokenizer, lp: &engine::generate::TokenLogprob) -> Value {
    let entry = |id: u32, logprob: f32| {
        let bytes = tok.token_bytes(id, true);
        json!({"token": String::from_utf8_lossy(&bytes), "logprob": logprob, "bytes": bytes})
    };
    let mut e = entry(lp.token, lp.logprob);
    e["top_logprobs"] = Value::Array(lp.top.iter().map(|&(id, l)| entry(id, l)).collect());
    e
}

/// The legacy completions `logprobs` object of some tokens: their strings, log-probabilities,
/// alternatives (string → log-probability) and character offsets in the completion text,
/// counted from `offset` (the characters of text returned before them).
pub(crate) fn completion_logprobs_json(
    tok: &engine::tokenizer::Tokenizer,
    lps: &[engine::generate::TokenLogprob],
    mut offset: usize,
) -> Value {
    let text = |id: u32| String::from_utf8_lossy(&tok.token_bytes(id, true)).into_owned();
    let (mut tokens, mut values, mut tops, mut offsets) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for lp in lps {
        let s = text(lp.token);
        offsets.push(offset);
        offset += s.chars().count();
        tokens.push(Value::String(s));
        values.push(json!(lp.logprob));
        let mut top = serde_json::Map::new();
        for &(id, l) in &lp.top {
            top.entry(text(id)).or_insert(json!(l));
        }
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets})
}

/// OpenAI `tool_calls` entries (with `index` in stream deltas).
pub(crate) fn tool_calls_json(calls: &[tools::Call], with_index: bool) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let mut v = json!({"id": new_id("call"), "type": "function",
                                   "function": {"name": c.name, "arguments": c.arguments}});
                if with_index {
                    v["index"] = json!(k);
                }
                v
            })
            .collect(),
    )
}

/// Queue one job per choice (`n`; seeds `seed + i`) and answer with one JSON object or an SSE
/// stream whose chunks carry the choice index.
pub(crate) async fn respond(st: Shared, mut p: Prepared, chat: bool) -> Response {
    p.verbose |= st.cfg.debug_responses;
    let w = p.worker.clone();
    // One channel for every choice: when the client goes away its receiver is dropped, and the
    // jobs leave the queue (or their slots) at once.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Event)>();
    for i in 0..p.n {
        let mut params = p.params.clone();
        params.sampling.seed = params.sampling.seed.wrapping_add(i as u64);
        let built = match (&p.grammar, &p.format) {
            (Some(lark), _) => Some(w.grammar().and_then(|g| g.lark(lark).map_err(ApiError::from))),
            (None, Some(schema)) => Some(
                w.grammar()
                    .and_then(|g| g.json(schema.as_ref()).map_err(ApiError::from)),
            ),
            (None, None) => None,
        };
        let constraint = match built {
            None => None,
            Some(Ok(c)) => Some(c),
            Some(Err(e)) => return e.into_response(),
        };
        if let Err(e) = w.submit(Job {
            choice: i,
            constraint,
            prompt: p.prompt.clone(),
            params,
            events: tx.clone(),
        }) {
            return e.into_response();
        }
    }
    drop(tx);
    let mut timing = Timing::new();
    let id = new_id(if chat { "chatcmpl" } else { "cmpl" });
    let created = now();
    let object = if chat { "chat.completion" } else { "text_completion" };
    let want_logprobs = p.params.logprobs.is_some();
    let with_tools = p.tools;
    let tool_format = p.tool_format;
    let p_parallel = p.tools_parallel;
    let parse_calls = move |text: &str| {
        let (content, mut calls) = tools::parse_reply_as(text, tool_format);
        if !p.tools_parallel {
            calls.truncate(1);
        }
        (content, calls)
    };
    let reasoning_mode = p.reasoning;
    let usage = |pt: usize, ct: usize, cached: usize| {
        json!({"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct,
               "prompt_tokens_details": {"cached_tokens": cached}})
    };
    let tokz = w.model.clone();
    if !p.stream {
        let mut texts = vec![String::new(); p.n];
        let mut lps: Vec<Vec<Value>> = vec![Vec::new(); p.n];
        let mut raw_lps: Vec<Vec<engine::generate::TokenLogprob>> = vec![Vec::new(); p.n];
        let mut finishes: Vec<Option<Finish>> = vec![None; p.n];
        let (mut pt, mut ct, mut cached) = (0, 0, 0);
        let mut telemetry = Telemetry::default();
        while let Some((i, ev)) = rx.recv().await {
            timing.observe(&st, &ev);
            telemetry.observe(&ev);
            match ev {
                Event::Progress(_) => {}
                Event::Token(t, lp) => {
                    texts[i].push_str(&t);
                    if let Some(lp) = lp {
                        if chat {
                            lps[i].push(logprob_json(&tokz.tokenizer, &lp));
                        } else {
                            raw_lps[i].push(lp);
                        }
                    }
                }
                Event::Error(e) => return e.into_response(),
                Event::Done {
                    finish,
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                    ..
                } => {
                    finishes[i] = Some(finish);
                    pt = prompt_tokens;
                    ct += completion_tokens;
                    cached = cached.max(cached_tokens);
                }
            }
        }
        if finishes.iter().any(Option::is_none) {
            return ApiError::internal("the engine stopped before finishing").into_response();
        }
        record(&st, pt, ct, cached);
        let choices: Vec<Value> = (0..p.n)
            .map(|i| {
                let fin = finish_reason(finishes[i].unwrap_or(Finish::Stop));
                let logprobs = if want_logprobs { json!({"content": lps[i]}) } else { Value::Null };
                let (thought, text) = match reasoning_mode {
                    Some((m, inside)) => reasoning::split(&texts[i], inside, m),
                    None => (String::new(), texts[i].clone()),
                };
                let calls = if with_tools { parse_calls(&text) } else { (String::new(), Vec::new()) };
                let mut choice = if chat && !calls.1.is_empty() {
                    let content = if calls.0.is_empty() { Value::Null } else { Value::String(calls.0) };
                    json!({"index": i, "message": {"role": "assistant", "content": content, "tool_calls": tool_calls_json(&calls.1, false)},
                           "logprobs": logprobs, "finish_reason": "tool_calls"})
                } else if chat {
                    json!({"index": i, "message": {"role": "assistant", "content": text}, "logprobs": logprobs, "finish_reason": fin})
                } else {
                    let logprobs = if want_logprobs {
                        completion_logprobs_json(&tokz.tokenizer, &raw_lps[i], 0)
                    } else {
                        Value::Null
                    };
                    json!({"index": i, "text": texts[i], "logprobs": logprobs, "finish_reason": fin})
                };
                if chat && !thought.is_empty() {
                    choice["message"]["reasoning_content"] = Value::String(thought);
                }
                choice
            })
            .collect();
        let mut body = json!({"id": id, "object": object, "created": created, "model": w.id,
            "system_fingerprint": st.fingerprint, "choices": choices, "usage": usage(pt, ct, cached),
            "timings": telemetry.timings()});
        if p.verbose {
            // llama-server's debug object: what the model was given.
            let prompt = if chat {
                p.rendered.clone()
            } else {
                tokz.tokenizer.decode(&p.prompt, false)
            };
            body["__verbose"] = json!({"prompt": prompt, "prompt_tokens": p.prompt.len(), "content": texts[0]});
        }
        return Json(body).into_response();
    }
    let chunk_object = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let (model, fp, include_usage, n) = (w.id.clone(), st.fingerprint.clone(), p.include_usage, p.n);
    let chunk_json = move |choice: Value, usage_v: Option<Value>| {
        let mut c = json!({"id": id, "object": chunk_object, "created": created, "model": model,
                           "system_fingerprint": fp, "choices": [choice]});
        if let Some(u) = usage_v {
            c["choices"] = json!([]);
            c["usage"] = u;
        } else if include_usage {
            c["usage"] = Value::Null;
        }
        c
    };
    let chunk = chunk_json;
    let (timings_per_token, return_progress) = (p.timings_per_token, p.return_progress);
    let mut telemetry: Vec<Telemetry> = (0..n).map(|_| Telemetry::default()).collect();
    let mut started = vec![false; n];
    let mut toolstreams: Vec<tools::ToolStream> = (0..n)
        .map(|_| tools::ToolStream::new(tool_format, p_parallel))
        .collect();
    // Content and complete calls of a reply with tools, as chunks (calls numbered per choice).
    let tool_pieces = move |i: usize,
                            pieces: Vec<tools::Piece>,
                            first_call: usize,
                            out: &mut Vec<Value>,
                            chunk: &dyn Fn(Value, Option<Value>) -> Value| {
        let mut k = first_call;
        for piece in pieces {
            match piece {
                tools::Piece::Text(c) => out.push(chunk(
                    json!({"index": i, "delta": {"content": c}, "logprobs": null, "finish_reason": null}),
                    None,
                )),
                tools::Piece::Call(c) => {
                    let mut calls = tool_calls_json(&[c], true);
                    calls[0]["index"] = json!(k);
                    k += 1;
                    out.push(chunk(
                        json!({"index": i, "delta": {"tool_calls": calls}, "logprobs": null, "finish_reason": null}),
                        None,
                    ));
                }
            }
        }
    };
    // Characters of completion text streamed so far per choice (legacy logprobs' text_offset).
    let mut streamed_chars = vec![0usize; n];
    let mut splitters: Vec<Option<reasoning::Splitter>> = (0..n)
        .map(|_| reasoning_mode.map(|(m, inside)| reasoning::Splitter::new(inside, m)))
        .collect();
    let mut done = 0usize;
    let (mut ct, mut cached) = (0, 0);
    // Comments every --sse-keepalive while nothing else is sent (a request waiting for a slot,
    // a long prefill), so clients and proxies see the stream alive.
    let keep_alive = KeepAlive::new().interval(st.cfg.sse_keepalive);
    let done_marker = || Value::String("[DONE]".into());
    let stream = async_stream(rx, move |ev| -> (Vec<SseEvent>, bool) {
        let mut out: Vec<Value> = Vec::new();
        let Some((i, ev)) = ev else { return (Vec::new(), true) };
        timing.observe(&st, &ev);
        telemetry[i].observe(&ev);
        if let Event::Progress(pr) = &ev {
            // llama-server's prompt_progress, in a chunk of its own (the first one opens the
            // assistant message, as the first chunk always does).
            if return_progress {
                let delta = if !started[i] && chat {
                    started[i] = true;
                    json!({"role": "assistant", "content": null})
                } else {
                    json!({})
                };
                let choice = if chat {
                    json!({"index": i, "delta": delta, "logprobs": null, "finish_reason": null})
                } else {
                    json!({"index": i, "text": "", "logprobs": null, "finish_reason": null})
                };
                let mut c = chunk(choice, None);
                c["prompt_progress"] = pr.json();
                out.push(c);
            }
            return (sse(out), false);
        }
        if chat && !started[i] {
            started[i] = true;
            // Like llama-server, `content: null` in the role delta (OpenAI sends ""; clients read
            // both as no text).
            out.push(chunk(json!({"index": i, "delta": {"role": "assistant", "content": null}, "logprobs": null, "finish_reason": null}), None));
        }
        let opened = out.len();
        let (mut out, last) = match ev {
            Event::Progress(_) => (out, false),
            Event::Token(t, lp) if splitters[i].is_some() || with_tools => {
                let (thought, text) = match &mut splitters[i] {
                    Some(sp) => sp.push(&t),
                    None => (String::new(), t),
                };
                if !thought.is_empty() {
                    out.push(chunk(json!({"index": i, "delta": {"reasoning_content": thought}, "logprobs": null, "finish_reason": null}), None));
                }
                if with_tools {
                    // Text streams as soon as it cannot be part of a call, calls once complete.
                    let before = toolstreams[i].calls();
                    let pieces = toolstreams[i].push(&text);
                    tool_pieces(i, pieces, before, &mut out, &chunk);
                } else if !text.is_empty() || lp.is_some() {
                    let logprobs = match lp {
                        Some(lp) => json!({"content": [logprob_json(&tokz.tokenizer, &lp)]}),
                        None => Value::Null,
                    };
                    out.push(chunk(
                        json!({"index": i, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": null}),
                        None,
                    ));
                }
                (out, false)
            }
            Event::Token(t, lp) => {
                let choice = if chat {
                    let logprobs = match lp {
                        Some(lp) => json!({"content": [logprob_json(&tokz.tokenizer, &lp)]}),
                        None => Value::Null,
                    };
                    json!({"index": i, "delta": {"content": t}, "logprobs": logprobs, "finish_reason": null})
                } else {
                    let logprobs = match lp {
                        Some(lp) => completion_logprobs_json(&tokz.tokenizer, &[lp], streamed_chars[i]),
                        None => Value::Null,
                    };
                    streamed_chars[i] += t.chars().count();
                    json!({"index": i, "text": t, "logprobs": logprobs, "finish_reason": null})
                };
                out.push(chunk(choice, None));
                (out, false)
            }
            Event::Done {
                finish,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                ..
            } => {
                let pt = prompt_tokens;
                ct += completion_tokens;
                cached = cached.max(cached_tokens);
                let mut reason = finish_reason(finish);
                if let Some(sp) = &mut splitters[i] {
                    let (thought, text) = sp.finish();
                    if !thought.is_empty() {
                        out.push(chunk(json!({"index": i, "delta": {"reasoning_content": thought}, "logprobs": null, "finish_reason": null}), None));
                    }
                    if with_tools {
                        let before = toolstreams[i].calls();
                        let pieces = toolstreams[i].push(&text);
                        tool_pieces(i, pieces, before, &mut out, &chunk);
                    } else if !text.is_empty() {
                        out.push(chunk(
                            json!({"index": i, "delta": {"content": text}, "logprobs": null, "finish_reason": null}),
                            None,
                        ));
                    }
                }
                if with_tools {
                    let before = toolstreams[i].calls();
                    let pieces = toolstreams[i].finish();
                    tool_pieces(i, pieces, before, &mut out, &chunk);
                    if toolstreams[i].calls() > 0 {
                        reason = "tool_calls";
                    }
                }
                let choice = if chat {
                    json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": reason})
                } else {
                    json!({"index": i, "text": "", "logprobs": null, "finish_reason": finish_reason(finish)})
                };
                out.push(chunk(choice, None));
                done += 1;
                let last = done == n;
                if last {
                    record(&st, pt, ct, cached);
                    if include_usage {
                        out.push(chunk(Value::Null, Some(usage(pt, ct, cached))));
                    }
                    out.push(done_marker());
                }
                (out, last)
            }
            Event::Error(e) => {
                out.push(e.body());
                out.push(done_marker());
                return (sse(out), true);
            }
        };
        // llama-server's timings: in the last chunk of a reply, and with timings_per_token in
        // every chunk with text.
        let end = out.iter().rposition(|c| c.get("id").is_some());
        for (k, c) in out.iter_mut().enumerate().skip(opened) {
            if c.get("id").is_some() && ((last && Some(k) == end) || timings_per_token) {
                c["timings"] = telemetry[i].timings();
            }
        }
        (sse(out), last)
    });
    Sse::new(stream).keep_alive(keep_alive).into_response()
}

/// Chunks as SSE events (`"[DONE]"` as itself).
fn sse(chunks: Vec<Value>) -> Vec<SseEvent> {
    chunks
        .into_iter()
        .map(|c| match c {
            Value::String(s) => SseEvent::default().data(s),
            c => SseEvent::default().data(c.to_string()),
        })
        .collect()
}

/// Latency metrics of one request, observed as its events arrive.
pub(crate) struct Timing {
    t0: std::time::Instant,
    last: Option<std::time::Instant>,
}

impl Timing {
    pub(crate) fn new() -> Timing {
        Timing {
            t0: std::time::Instant::now(),
            last: None,
        }
    }

    pub(crate) fn observe(&mut self, st: &AppState, ev: &Event) {
        let now = std::time::Instant::now();
        match ev {
            Event::Token(..) => {
                match self.last {
                    None => st.metrics.ttft.observe((now - self.t0).as_secs_f64()),
                    Some(l) => st.metrics.itl.observe((now - l).as_secs_f64()),
                }
                self.last = Some(now);
            }
            Event::Done {
                prompt_tokens,
                completion_tokens,
                ..
            } => {
                st.metrics.e2e.observe((now - self.t0).as_secs_f64());
                st.metrics.prompt_len.observe(*prompt_tokens as f64);
                st.metrics.completion_len.observe(*completion_tokens as f64);
            }
            Event::Progress(_) | Event::Error(_) => {}
        }
    }
}

pub(crate) fn record(st: &AppState, p: usize, c: usize, cached: usize) {
    st.metrics.prompt_tokens.fetch_add(p as u64, Ordering::Relaxed);
    st.metrics.completion_tokens.fetch_add(c as u64, Ordering::Relaxed);
    st.metrics.cached_tokens.fetch_add(cached as u64, Ordering::Relaxed);
}

/// Turn engine events into SSE events until `f` says the stream is complete. When the client goes
/// away the SSE stream is dropped and the forwarding task ends at once (it watches for that), which
/// drops the engine's receiver: queued jobs leave the queue, running ones stop at their next step.
pub(crate) fn async_stream<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
    mut f: impl FnMut(Option<T>) -> (Vec<SseEvent>, bool) + Send + 'static,
) -> impl tokio_stream::Stream<Item = Result<SseEvent, std::convert::Infallible>> + Send {
    let (otx, orx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = otx.closed() => return,
            };
            let end_of_input = ev.is_none();
            let (events, complete) = f(ev);
            for e in events {
                if otx.send(Ok(e)).is_err() {
                    return;
                }
            }
            if complete || end_of_input {
                return;
            }
        }
    });
    tokio_stream::wrappers::UnboundedReceiverStream::new(orx)
}

/// llama-server's `timings` of one reply (prompt and generation counts, milliseconds and rates),
/// observed from its events: exact once the reply is done, so far while it streams.
#[derive(Default)]
pub(crate) struct Telemetry {
    progress: Option<Progress>,
    /// When the prompt was done (its last chunk's progress, or the first token).
    prefilled: Option<std::time::Instant>,
    tokens: usize,
    /// Completion tokens, prompt and generation milliseconds, from the engine.
    done: Option<(usize, f64, f64)>,
}

impl Telemetry {
    pub(crate) fn observe(&mut self, ev: &Event) {
        match ev {
            Event::Progress(p) => {
                self.progress = Some(*p);
                if p.processed == p.total {
                    self.prefilled.get_or_insert_with(std::time::Instant::now);
                }
            }
            Event::Token(..) => {
                self.tokens += 1;
                self.prefilled.get_or_insert_with(std::time::Instant::now);
            }
            Event::Done {
                completion_tokens,
                prompt_ms,
                predicted_ms,
                ..
            } => self.done = Some((*completion_tokens, *prompt_ms, *predicted_ms)),
            Event::Error(_) => {}
        }
    }

    pub(crate) fn timings(&self) -> Value {
        let p = self.progress.unwrap_or(Progress {
            total: 0,
            cache: 0,
            processed: 0,
            ms: 0.0,
        });
        let (n_gen, prompt_ms, gen_ms) = self.done.unwrap_or_else(|| {
            let gen_ms = self.prefilled.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
            (self.tokens, p.ms, gen_ms)
        });
        let n_prompt = p.total - p.cache;
        let per = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
        let rate = |ms: f64, n: usize| if ms > 0.0 { 1e3 * n as f64 / ms } else { 0.0 };
        json!({"cache_n": p.cache, "prompt_n": n_prompt, "prompt_ms": prompt_ms,
               "prompt_per_token_ms": per(prompt_ms, n_prompt), "prompt_per_second": rate(prompt_ms, n_prompt),
               "predicted_n": n_gen, "predicted_ms": gen_ms,
               "predicted_per_token_ms": per(gen_ms, n_gen), "predicted_per_second": rate(gen_ms, n_gen)})
    }
}
