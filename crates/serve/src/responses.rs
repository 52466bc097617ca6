//! `POST /v1/responses` (OpenAI's Responses API, which Codex CLI and the `openai` SDKs'
//! `client.responses` speak), `GET` and `DELETE /v1/responses/{id}`. A request is translated into
//! a chat request (its items into messages, its tools and formats into chat fields) and runs
//! through the same pipeline as `/v1/chat/completions`; the reply comes back as output items, or
//! as the Responses event stream. Stored responses (`store`, default true) keep their conversation
//! so that `previous_response_id` continues it, in a bounded least-recently-used map.

use super::{new_item_id as new_id, now, prepare_chat, single, ApiError, AppState, Finish, Shared};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use single::Delta;
use std::collections::VecDeque;

/// Responses kept for `previous_response_id` and `GET /v1/responses/{id}`.
pub const STORE_CAPACITY: usize = 256;

/// A stored response: what `GET` returns, and the conversation (chat messages) it ended.
struct Stored {
    id: String,
    response: Value,
    messages: Vec<Value>,
}

/// The bounded store (least recently used first).
#[derive(Default)]
pub struct Store {
    items: VecDeque<Stored>,
}

impl Store {
    fn get(&mut self, id: &str) -> Option<&Stored> {
        let i = self.items.iter().position(|s| s.id == id)?;
        let s = self.items.remove(i)?;
        self.items.push_back(s);
        self.items.back()
    }
    fn put(&mut self, s: Stored) {
        self.items.retain(|o| o.id != s.id);
        if self.items.len() >= STORE_CAPACITY {
            self.items.pop_front();
        }
        self.items.push_back(s);
    }
    fn remove(&mut self, id: &str) -> bool {
        let n = self.items.len();
        self.items.retain(|o| o.id != id);
        self.items.len() != n
    }
}

/// What the translation keeps besides the chat body.
struct Ctx {
    /// Names of the request's custom (freeform) tools: their calls carry `input`, not arguments.
    custom: Vec<String>,
    /// The conversation sent to the model, without the instructions (for `previous_response_id`).
    history: Vec<Value>,
    store: bool,
    /// Echoed request fields.
    echo: Map<String, Value>,
}

fn invalid(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(param, msg)
}

/// The text of a content value: a string, or an array of text parts.
fn text_of(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (k, p) in parts.iter().enumerate() {
                let ty = p.get("type").and_then(Value::as_str).unwrap_or("");
                match (ty, p.get("text").and_then(Value::as_str)) {
                    ("input_text" | "output_text" | "text" | "summary_text" | "reasoning_text", Some(t)) => {
                        out.push_str(t)
                    }
                    ("refusal", _) => {
                        out.push_str(p.get("refusal").and_then(Value::as_str).unwrap_or(""));
                    }
                    ("input_image" | "input_file" | "input_audio", _) => {
                        return Err(invalid(
                            param,
                            format!("{param}[{k}]: {ty} parts are not supported (this server's models read text)"),
                        ))
                    }
                    _ => {
                        return Err(invalid(
                            param,
                            format!(
                                "{param}[{k}] must be a text part (input_text or output_text with a string 'text')"
                            ),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(invalid(
            param,
            format!("{param} must be a string or an array of content parts"),
        )),
    }
}

/// `input` items → chat messages, appended to `msgs` (which may hold an earlier conversation).
fn items_to_messages(input: &Value, msgs: &mut Vec<Value>) -> Result<(), ApiError> {
    let items = match input {
        Value::String(s) => {
            msgs.push(json!({"role": "user", "content": s}));
            return Ok(());
        }
        Value::Array(a) => a,
        _ => return Err(invalid("input", "'input' must be a string or an array of items")),
    };
    // Call ids seen so far (earlier turns included), for checking outputs against their calls.
    let mut calls: Vec<String> = msgs
        .iter()
        .filter_map(|m| m.get("tool_calls").and_then(Value::as_array))
        .flatten()
        .filter_map(|c| c.get("id").and_then(Value::as_str).map(str::to_string))
        .collect();
    let mut reasoning: Option<String> = None;
    for (i, it) in items.iter().enumerate() {
        let p = format!("input[{i}]");
        let o = it
            .as_object()
            .ok_or_else(|| invalid(&p, format!("{p} must be an object")))?;
        let ty = o.get("type").and_then(Value::as_str).unwrap_or("message");
        // An assistant message to hang a call on: the last one if it is the assistant's turn.
        let assistant = |msgs: &mut Vec<Value>, reasoning: &mut Option<String>| -> usize {
            let last_is_assistant = msgs.last().is_some_and(|m| m["role"] == "assistant");
            if last_is_assistant {
                let m = msgs.last_mut().expect("checked");
                if m.get("tool_calls").is_none() {
                    m["tool_calls"] = json!([]);
                }
            } else {
                let mut m = json!({"role": "assistant", "content": null, "tool_calls": []});
                if let Some(r) = reasoning.take() {
                    m["reasoning_content"] = json!(r);
                }
                msgs.push(m);
            }
            msgs.len() - 1
        };
        match ty {
            "message" => {
                let role = o.get("role").and_then(Value::as_str).unwrap_or("");
                if !matches!(role, "user" | "assistant" | "system" | "developer") {
                    return Err(invalid(
                        &p,
                        format!("{p}.role {role:?} is not user, assistant, system or developer"),
                    ));
                }
                let text = text_of(o.get("content").unwrap_or(&Value::Null), &format!("{p}.content"))?;
                let mut m = json!({"role": role, "content": text});
                if role == "assistant" {
                    if let Some(r) = reasoning.take() {
                        m["reasoning_content"] = json!(r);
                    }
                }
                msgs.push(m);
            }
            "function_call" | "custom_tool_call" => {
                let s = |k: &str| o.get(k).and_then(Value::as_str);
                let name = s("name")
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| invalid(&p, format!("{p}.name must be a non-empty string")))?;
                let call_id = s("call_id")
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| invalid(&p, format!("{p}.call_id must be a non-empty string")))?;
                let arguments = if ty == "function_call" {
                    let a = s("arguments").ok_or_else(|| invalid(&p, format!("{p}.arguments must be a string")))?;
                    if !serde_json::from_str::<Value>(a).is_ok_and(|v| v.is_object()) {
                        return Err(invalid(&p, format!("{p}.arguments must be a JSON object as text")));
                    }
                    a.to_string()
                } else {
                    let input = s("input").ok_or_else(|| invalid(&p, format!("{p}.input must be a string")))?;
                    json!({"input": input}).to_string()
                };
                let k = assistant(msgs, &mut reasoning);
                if let Some(tc) = msgs[k]["tool_calls"].as_array_mut() {
                    tc.push(
                        json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}),
                    );
                }
                calls.push(call_id.to_string());
            }
            "function_call_output" | "custom_tool_call_output" => {
                let call_id = o
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(&p, format!("{p}.call_id must be a string")))?;
                if !calls.iter().any(|c| c == call_id) {
                    return Err(invalid(
                        &p,
                        format!("{p}: no function_call with call_id {call_id:?} comes before this output"),
                    ));
                }
                let out = text_of(o.get("output").unwrap_or(&Value::Null), &format!("{p}.output"))?;
                msgs.push(json!({"role": "tool", "tool_call_id": call_id, "content": out}));
            }
            "reasoning" => {
                let mut t = String::new();
                for key in ["content", "summary"] {
                    if let Some(v) = o.get(key).filter(|v| !v.is_null()) {
                        let s = text_of(v, &format!("{p}.{key}"))?;
                        if t.is_empty() {
                            t = s;
                        }
                    }
                }
                reasoning = Some(t);
            }
            other => {
                return Err(invalid(
                    &format!("{p}.type"),
                    format!(
                        "{p}.type {other:?} is not supported (message, function_call, function_call_output, \
                         custom_tool_call, custom_tool_call_output, reasoning)"
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// The request's tools → chat tools; custom (freeform) tools become function tools taking one
/// string `input`, described as such.
fn tools_to_chat(tools: &Value) -> Result<(Vec<Value>, Vec<String>), ApiError> {
    let arr = tools
        .as_array()
        .ok_or_else(|| invalid("tools", "'tools' must be an array"))?;
    let (mut out, mut custom) = (Vec::new(), Vec::new());
    for (i, t) in arr.iter().enumerate() {
        let ty = t.get("type").and_then(Value::as_str).unwrap_or("");
        let name = t.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
        let desc = t.get("description").cloned().unwrap_or(Value::Null);
        match (ty, name) {
            ("function", Some(name)) => {
                let params = t.get("parameters").filter(|p| !p.is_null()).cloned();
                let params = params.unwrap_or_else(|| json!({"type": "object", "properties": {}}));
                out.push(
                    json!({"type": "function", "function": {"name": name, "description": desc, "parameters": params}}),
                );
            }
            ("custom", Some(name)) => {
                let mut d = desc.as_str().unwrap_or("").to_string();
                if let Some(f) = t
                    .get("format")
                    .filter(|f| f.get("type").and_then(Value::as_str) == Some("grammar"))
                {
                    let syntax = f.get("syntax").and_then(Value::as_str).unwrap_or("");
                    let def = f.get("definition").and_then(Value::as_str).unwrap_or("");
                    d.push_str(&format!("\nThe input follows this {syntax} grammar:\n{def}"));
                }
                out.push(json!({"type": "function", "function": {"name": name, "description": d,
                    "parameters": {"type": "object", "properties": {"input": {"type": "string",
                        "description": "the tool's freeform input"}}, "required": ["input"]}}}));
                custom.push(name.to_string());
            }
            ("function" | "custom", None) => {
                return Err(invalid("tools", format!("tools[{i}].name must be a non-empty string")))
            }
            _ => {
                return Err(invalid(
                    "tools",
                    format!("tools[{i}].type {ty:?} is not supported (function and custom tools are)"),
                ))
            }
        }
    }
    Ok((out, custom))
}

/// A Responses request → a chat request body, and what the reply needs.
fn to_chat(b: &Map<String, Value>, prev: Option<&[Value]>) -> Result<(Map<String, Value>, Ctx), ApiError> {
    let mut c = Map::new();
    for k in [
        "model",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stream",
        "parallel_tool_calls",
        // llama-server's telemetry extensions.
        "timings_per_token",
        "return_progress",
    ] {
        if let Some(v) = b.get(k).filter(|v| !v.is_null()) {
            c.insert(k.into(), v.clone());
        }
    }
    if let Some(v) = b.get("max_output_tokens").filter(|v| !v.is_null()) {
        if v.as_u64().is_none_or(|n| n < 1) {
            return Err(invalid(
                "max_output_tokens",
                "'max_output_tokens' must be a positive integer",
            ));
        }
        c.insert("max_tokens".into(), v.clone());
    }
    let store = match b.get("store") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(s)) => *s,
        Some(_) => return Err(invalid("store", "'store' must be a boolean")),
    };
    let mut msgs = Vec::new();
    match b.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => msgs.push(json!({"role": "system", "content": s})),
        Some(_) => return Err(invalid("instructions", "'instructions' must be a string")),
    }
    let n_instr = msgs.len();
    if let Some(p) = prev {
        msgs.extend(p.iter().cloned());
    }
    let (tools, custom) = match b.get("tools").filter(|t| !t.is_null()) {
        Some(t) => tools_to_chat(t)?,
        None => (Vec::new(), Vec::new()),
    };
    let input = b
        .get("input")
        .filter(|v| !v.is_null())
        .ok_or_else(|| invalid("input", "'input' is required (a string or an array of items)"))?;
    items_to_messages(input, &mut msgs)?;
    if msgs.len() == n_instr {
        return Err(invalid("input", "'input' holds no message"));
    }
    if !tools.is_empty() {
        c.insert("tools".into(), Value::Array(tools));
    }
    match b.get("tool_choice").filter(|v| !v.is_null()) {
        None => {}
        Some(Value::String(s)) => {
            c.insert("tool_choice".into(), json!(s));
        }
        Some(o) => match (
            o.get("type").and_then(Value::as_str),
            o.get("name").and_then(Value::as_str),
        ) {
            (Some("function" | "custom"), Some(name)) => {
                c.insert(
                    "tool_choice".into(),
                    json!({"type": "function", "function": {"name": name}}),
                );
            }
            _ => {
                return Err(invalid(
                    "tool_choice",
                    "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": …}",
                ))
            }
        },
    }
    if let Some(t) = b.get("text").filter(|v| !v.is_null()) {
        match t.get("format").filter(|f| !f.is_null()) {
            None => {}
            Some(f) => match f.get("type").and_then(Value::as_str) {
                Some("text") => {}
                Some("json_object") => {
                    c.insert("response_format".into(), json!({"type": "json_object"}));
                }
                Some("json_schema") => {
                    let schema = f
                        .get("schema")
                        .filter(|s| s.is_object())
                        .ok_or_else(|| invalid("text.format", "a json_schema format needs a 'schema' object"))?;
                    c.insert(
                        "response_format".into(),
                        json!({"type": "json_schema", "json_schema": {"name": f.get("name"), "schema": schema}}),
                    );
                }
                _ => {
                    return Err(invalid(
                        "text.format",
                        "text.format.type must be text, json_object or json_schema",
                    ))
                }
            },
        }
    }
    if let Some(r) = b.get("reasoning").filter(|v| !v.is_null()) {
        let effort = r.get("effort").and_then(Value::as_str);
        if let Some(e) = effort {
            if !matches!(e, "none" | "minimal" | "low" | "medium" | "high" | "xhigh") {
                return Err(invalid(
                    "reasoning.effort",
                    format!("reasoning.effort {e:?} is not none, minimal, low, medium or high"),
                ));
            }
            // Templates take `enable_thinking` (Qwen3, Gemma 4) or `reasoning_effort` (gpt-oss).
            c.insert(
                "chat_template_kwargs".into(),
                json!({"enable_thinking": !matches!(e, "none" | "minimal"), "reasoning_effort": e}),
            );
        }
    }
    let history = msgs[n_instr..].to_vec();
    c.insert("messages".into(), Value::Array(msgs));
    // The Responses API answers a final assistant item with a new message (no prefill).
    c.insert("add_generation_prompt".into(), Value::Bool(true));
    let mut echo = Map::new();
    for k in [
        "instructions",
        "max_output_tokens",
        "metadata",
        "parallel_tool_calls",
        "previous_response_id",
        "reasoning",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_p",
        "truncation",
        "user",
    ] {
        echo.insert(k.into(), b.get(k).cloned().unwrap_or(Value::Null));
    }
    Ok((
        c,
        Ctx {
            custom,
            history,
            store,
            echo,
        },
    ))
}

fn output_item_of_call(call: &crate::tools::Call, custom: &[String]) -> Value {
    let call_id = new_id("call");
    if custom.contains(&call.name) {
        let input = serde_json::from_str::<Value>(&call.arguments)
            .ok()
            .and_then(|v| v.get("input").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_default();
        json!({"type": "custom_tool_call", "id": new_id("ctc"), "call_id": call_id, "name": call.name,
               "input": input, "status": "completed"})
    } else {
        json!({"type": "function_call", "id": new_id("fc"), "call_id": call_id, "name": call.name,
               "arguments": call.arguments, "status": "completed"})
    }
}

/// The assistant turn as a chat message (for the stored conversation).
fn assistant_message(thought: &str, text: &str, calls: &[Value]) -> Value {
    let mut m = json!({"role": "assistant", "content": text});
    if !thought.is_empty() {
        m["reasoning_content"] = json!(thought);
    }
    if !calls.is_empty() {
        let tc: Vec<Value> = calls
            .iter()
            .map(|c| {
                let args = match c["type"].as_str() {
                    Some("custom_tool_call") => json!({"input": c["input"]}).to_string(),
                    _ => c["arguments"].as_str().unwrap_or("{}").to_string(),
                };
                json!({"id": c["call_id"], "type": "function", "function": {"name": c["name"], "arguments": args}})
            })
            .collect();
        m["tool_calls"] = Value::Array(tc);
        if text.is_empty() {
            m["content"] = Value::Null;
        }
    }
    m
}

/// The response object around `output`.
#[allow(clippy::too_many_arguments)]
fn response_object(
    id: &str,
    created: u64,
    model: &str,
    ctx: &Ctx,
    status: &str,
    output: Vec<Value>,
    usage: Value,
    incomplete: Value,
) -> Value {
    let mut r = json!({"id": id, "object": "response", "created_at": created, "status": status,
        "error": null, "incomplete_details": incomplete, "model": model, "output": output,
        "usage": usage, "store": ctx.store});
    for (k, v) in &ctx.echo {
        r[k] = v.clone();
    }
    if r["tools"].is_null() {
        r["tools"] = json!([]);
    }
    if r["tool_choice"].is_null() {
        r["tool_choice"] = json!("auto");
    }
    if r["parallel_tool_calls"].is_null() {
        r["parallel_tool_calls"] = json!(true);
    }
    if r["text"].is_null() {
        r["text"] = json!({"format": {"type": "text"}});
    }
    if r["metadata"].is_null() {
        r["metadata"] = json!({});
    }
    if r["truncation"].is_null() {
        r["truncation"] = json!("disabled");
    }
    r
}

fn usage_of(s: &single::Summary, reasoning_tokens: usize) -> Value {
    json!({"input_tokens": s.prompt_tokens, "input_tokens_details": {"cached_tokens": s.cached_tokens},
           "output_tokens": s.completion_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
           "total_tokens": s.prompt_tokens + s.completion_tokens})
}

fn status_of(s: &single::Summary) -> (&'static str, Value) {
    match s.finish {
        Finish::Length => ("incomplete", json!({"reason": "max_output_tokens"})),
        _ => ("completed", Value::Null),
    }
}

pub async fn create(State(st): State<Shared>, body: Bytes) -> Response {
    match create_inner(st, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/responses/input_tokens`: the input's tokens as a `responses.create` with the same
/// body would send them to the model (instructions, tools, `previous_response_id` included).
pub async fn input_tokens(State(st): State<Shared>, body: Bytes) -> Response {
    let r = async {
        let b = super::api::object(&body)?;
        super::ensure_loaded(&st, b.get("model").and_then(Value::as_str)).await?;
        let prev = previous(&st, &b)?;
        let (mut chat, _) = to_chat(&b, prev.as_deref())?;
        chat.remove("stream");
        let p = prepare_chat(&st, &chat)?;
        Ok::<_, ApiError>(
            Json(json!({"object": "response.input_tokens", "input_tokens": p.prompt.len()})).into_response(),
        )
    };
    r.await.unwrap_or_else(|e| e.into_response())
}

/// The stored conversation `previous_response_id` names, if any.
fn previous(st: &Shared, b: &Map<String, Value>) -> Result<Option<Vec<Value>>, ApiError> {
    Ok(match b.get("previous_response_id").filter(|v| !v.is_null()) {
        None => None,
        Some(Value::String(id)) => {
            let mut store = st.responses.lock().unwrap_or_else(|e| e.into_inner());
            let s = store.get(id).ok_or_else(|| {
                ApiError::invalid(
                    "previous_response_id",
                    format!("no stored response {id:?} (responses are kept when 'store' is not false, the last {STORE_CAPACITY})"),
                )
                .with_code("previous_response_not_found")
            })?;
            Some(s.messages.clone())
        }
        Some(_) => {
            return Err(invalid(
                "previous_response_id",
                "'previous_response_id' must be a string",
            ))
        }
    })
}

async fn create_inner(st: Shared, body: Bytes) -> Result<Response, ApiError> {
    let b = super::api::object(&body)?;
    super::ensure_loaded(&st, b.get("model").and_then(Value::as_str)).await?;
    let prev = previous(&st, &b)?;
    let (chat, ctx) = to_chat(&b, prev.as_deref())?;
    let p = prepare_chat(&st, &chat)?;
    let stream = p.stream;
    let model = p.worker.id.clone();
    let requested = b.get("model").and_then(Value::as_str).map(str::to_string);
    let tokenizer = p.worker.model.clone();
    let rx = single::start(&st, p)?;
    let id = new_id("resp");
    let created = now();
    let count = move |t: &str| tokenizer.tokenizer.encode(t, false, false).map_or(0, |v| v.len());
    if !stream {
        let r = single::collect(rx).await?;
        let s = r.summary.clone().expect("collect returns a summary");
        let mut output = Vec::new();
        if !r.thought.is_empty() {
            output.push(json!({"type": "reasoning", "id": new_id("rs"), "summary": [],
                               "content": [{"type": "reasoning_text", "text": r.thought}]}));
        }
        let calls: Vec<Value> = r.calls.iter().map(|c| output_item_of_call(c, &ctx.custom)).collect();
        if !r.text.is_empty() || calls.is_empty() {
            output.push(
                json!({"type": "message", "id": new_id("msg"), "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": r.text, "annotations": [], "logprobs": []}]}),
            );
        }
        output.extend(calls.iter().cloned());
        let (status, incomplete) = status_of(&s);
        let resp = response_object(
            &id,
            created,
            &model,
            &ctx,
            status,
            output,
            usage_of(&s, count(&r.thought)),
            incomplete,
        );
        save(&st, &ctx, &id, &resp, assistant_message(&r.thought, &r.text, &calls));
        return Ok(super::served_by(
            Json(resp).into_response(),
            requested.as_deref(),
            &model,
        ));
    }
    let served = model.clone();
    Ok(super::served_by(
        stream_response(st, rx, id, created, model, ctx, Box::new(count)),
        requested.as_deref(),
        &served,
    ))
}

fn save(st: &AppState, ctx: &Ctx, id: &str, resp: &Value, reply: Value) {
    if !ctx.store {
        return;
    }
    let mut messages = ctx.history.clone();
    messages.push(reply);
    st.responses.lock().unwrap_or_else(|e| e.into_inner()).put(Stored {
        id: id.to_string(),
        response: resp.clone(),
        messages,
    });
}

/// Which output item is open while streaming.
#[derive(Clone, Copy, PartialEq)]
enum Open {
    None,
    Reasoning,
    Message,
}

struct Streamer {
    /// llama-server's `timings` so far (`timings_per_token`), added to the events.
    timings: Option<Value>,
    seq: u64,
    output: Vec<Value>,
    open: Open,
    thought: String,
    text: String,
    calls: Vec<Value>,
}

impl Streamer {
    fn ev(&mut self, ty: &str, mut data: Value) -> SseEvent {
        data["type"] = json!(ty);
        data["sequence_number"] = json!(self.seq);
        if let Some(t) = &self.timings {
            data["timings"] = t.clone();
        }
        self.seq += 1;
        SseEvent::default().event(ty).data(data.to_string())
    }

    fn close(&mut self, out: &mut Vec<SseEvent>) {
        let idx = self.output.len().saturating_sub(1);
        match self.open {
            Open::None => {}
            Open::Reasoning => {
                let item_id = self.output[idx]["id"].clone();
                let t = self.thought.clone();
                out.push(self.ev(
                    "response.reasoning_text.done",
                    json!({"item_id": item_id, "output_index": idx, "content_index": 0, "text": t}),
                ));
                self.output[idx]["content"] = json!([{"type": "reasoning_text", "text": t}]);
                let item = self.output[idx].clone();
                out.push(self.ev("response.output_item.done", json!({"output_index": idx, "item": item})));
            }
            Open::Message => {
                let item_id = self.output[idx]["id"].clone();
                let t = self.text.clone();
                let part = json!({"type": "output_text", "text": t, "annotations": [], "logprobs": []});
                out.push(self.ev(
                    "response.output_text.done",
                    json!({"item_id": item_id, "output_index": idx, "content_index": 0, "text": t, "logprobs": []}),
                ));
                out.push(self.ev(
                    "response.content_part.done",
                    json!({"item_id": item_id, "output_index": idx, "content_index": 0, "part": part}),
                ));
                self.output[idx]["content"] = json!([part]);
                self.output[idx]["status"] = json!("completed");
                let item = self.output[idx].clone();
                out.push(self.ev("response.output_item.done", json!({"output_index": idx, "item": item})));
            }
        }
        self.open = Open::None;
    }
}

fn stream_response(
    st: Shared,
    rx: tokio::sync::mpsc::UnboundedReceiver<Delta>,
    id: String,
    created: u64,
    model: String,
    ctx: Ctx,
    count: Box<dyn Fn(&str) -> usize + Send>,
) -> Response {
    let keep_alive = KeepAlive::new().interval(st.cfg.sse_keepalive);
    {
        let mut s = Streamer {
            timings: None,
            seq: 0,
            output: Vec::new(),
            open: Open::None,
            thought: String::new(),
            text: String::new(),
            calls: Vec::new(),
        };
        let skeleton = response_object(
            &id,
            created,
            &model,
            &ctx,
            "in_progress",
            Vec::new(),
            Value::Null,
            Value::Null,
        );
        let first = vec![
            s.ev("response.created", json!({"response": skeleton})),
            s.ev("response.in_progress", json!({"response": skeleton})),
        ];
        let events = super::async_stream(rx, move |d| {
            let mut out = Vec::new();
            let mut end = false;
            match d {
                None => end = true,
                Some(Delta::Thought(t)) => {
                    if s.open != Open::Reasoning {
                        s.close(&mut out);
                        let item = json!({"type": "reasoning", "id": new_id("rs"), "summary": [], "content": []});
                        s.output.push(item.clone());
                        s.open = Open::Reasoning;
                        let idx = s.output.len() - 1;
                        out.push(s.ev("response.output_item.added", json!({"output_index": idx, "item": item})));
                    }
                    let idx = s.output.len() - 1;
                    let item_id = s.output[idx]["id"].clone();
                    s.thought.push_str(&t);
                    out.push(s.ev(
                        "response.reasoning_text.delta",
                        json!({"item_id": item_id, "output_index": idx, "content_index": 0, "delta": t}),
                    ));
                }
                Some(Delta::Text(t)) => {
                    if s.open != Open::Message {
                        s.close(&mut out);
                        let item = json!({"type": "message", "id": new_id("msg"), "status": "in_progress",
                                          "role": "assistant", "content": []});
                        s.output.push(item.clone());
                        s.open = Open::Message;
                        let idx = s.output.len() - 1;
                        out.push(s.ev(
                            "response.output_item.added",
                            json!({"output_index": idx, "item": item.clone()}),
                        ));
                        out.push(s.ev(
                            "response.content_part.added",
                            json!({"item_id": item["id"], "output_index": idx, "content_index": 0,
                                   "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
                        ));
                    }
                    let idx = s.output.len() - 1;
                    let item_id = s.output[idx]["id"].clone();
                    s.text.push_str(&t);
                    out.push(s.ev(
                        "response.output_text.delta",
                        json!({"item_id": item_id, "output_index": idx, "content_index": 0, "delta": t, "logprobs": []}),
                    ));
                }
                Some(Delta::Call(c)) => {
                    s.close(&mut out);
                    let done = output_item_of_call(&c, &ctx.custom);
                    let custom = done["type"] == "custom_tool_call";
                    let mut added = done.clone();
                    added["status"] = json!("in_progress");
                    added[if custom { "input" } else { "arguments" }] = json!("");
                    s.output.push(added.clone());
                    let idx = s.output.len() - 1;
                    out.push(s.ev(
                        "response.output_item.added",
                        json!({"output_index": idx, "item": added}),
                    ));
                    let (delta_ty, done_ty, key) = if custom {
                        (
                            "response.custom_tool_call_input.delta",
                            "response.custom_tool_call_input.done",
                            "input",
                        )
                    } else {
                        (
                            "response.function_call_arguments.delta",
                            "response.function_call_arguments.done",
                            "arguments",
                        )
                    };
                    let value = done[key].clone();
                    out.push(s.ev(
                        delta_ty,
                        json!({"item_id": done["id"], "output_index": idx, "delta": value}),
                    ));
                    out.push(s.ev(
                        done_ty,
                        json!({"item_id": done["id"], "output_index": idx, key: value, "name": done["name"]}),
                    ));
                    s.output[idx] = done.clone();
                    out.push(s.ev(
                        "response.output_item.done",
                        json!({"output_index": idx, "item": done.clone()}),
                    ));
                    s.calls.push(done);
                }
                Some(Delta::Progress(pr)) => {
                    // llama-server's prefill progress, as an in_progress event.
                    let skeleton = json!({"id": id, "object": "response", "status": "in_progress"});
                    let mut e = json!({"response": skeleton});
                    e["prompt_progress"] = pr.json();
                    out.push(s.ev("response.in_progress", e));
                }
                Some(Delta::Timings(t)) => s.timings = Some(t),
                Some(Delta::Done(sum)) => {
                    s.timings = Some(sum.timings.clone());
                    if s.output.is_empty() {
                        // An empty reply is still one (empty) message.
                        let item = json!({"type": "message", "id": new_id("msg"), "status": "in_progress",
                                          "role": "assistant", "content": []});
                        s.output.push(item.clone());
                        s.open = Open::Message;
                        out.push(s.ev(
                            "response.output_item.added",
                            json!({"output_index": 0, "item": item.clone()}),
                        ));
                        out.push(s.ev(
                            "response.content_part.added",
                            json!({"item_id": item["id"], "output_index": 0, "content_index": 0,
                                   "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
                        ));
                    }
                    s.close(&mut out);
                    let (status, incomplete) = status_of(&sum);
                    let resp = response_object(
                        &id,
                        created,
                        &model,
                        &ctx,
                        status,
                        s.output.clone(),
                        usage_of(&sum, count(&s.thought)),
                        incomplete,
                    );
                    save(&st, &ctx, &id, &resp, assistant_message(&s.thought, &s.text, &s.calls));
                    let ty = if status == "completed" {
                        "response.completed"
                    } else {
                        "response.incomplete"
                    };
                    out.push(s.ev(ty, json!({"response": resp})));
                    end = true;
                }
                Some(Delta::Error(e)) => {
                    out.push(s.ev("error", json!({"code": e.code, "message": e.message, "param": e.param})));
                    end = true;
                }
            }
            (out, end)
        });
        let initial = tokio_stream::iter(first.into_iter().map(Ok));
        Sse::new(tokio_stream::StreamExt::chain(initial, events))
            .keep_alive(keep_alive)
            .into_response()
    }
}

pub async fn get(State(st): State<Shared>, Path(id): Path<String>) -> Response {
    let mut store = st.responses.lock().unwrap_or_else(|e| e.into_inner());
    match store.get(&id) {
        Some(s) => Json(s.response.clone()).into_response(),
        None => ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no stored response {id:?}"),
        )
        .into_response(),
    }
}

pub async fn delete(State(st): State<Shared>, Path(id): Path<String>) -> Response {
    let removed = st.responses.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    if removed {
        Json(json!({"id": id, "object": "response.deleted", "deleted": true})).into_response()
    } else {
        ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no stored response {id:?}"),
        )
        .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn items_become_chat_messages() {
        let (c, ctx) = to_chat(
            &body(json!({"model": "m", "instructions": "be brief", "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "call it"}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
            ], "max_output_tokens": 20, "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}})),
            None,
        )
        .unwrap();
        let m = c["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[1], json!({"role": "user", "content": "weather?"}));
        assert_eq!(m[2]["role"], "assistant");
        assert_eq!(m[2]["reasoning_content"], "call it");
        assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "get_weather");
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}));
        assert_eq!(c["max_tokens"], 20);
        assert_eq!(c["response_format"]["type"], "json_schema");
        // The stored history leaves the instructions out.
        assert_eq!(ctx.history.len(), 3);
    }

    #[test]
    fn bad_items_name_the_field() {
        let e = |v: Value| to_chat(&body(v), None).err().unwrap();
        let x = e(json!({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}));
        assert_eq!(x.param.as_deref(), Some("input[0]"));
        assert!(x.message.contains("no function_call"), "{}", x.message);
        let x = e(json!({"input": [{"type": "web_search_call"}]}));
        assert_eq!(x.param.as_deref(), Some("input[0].type"));
        let x = e(json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}));
        assert!(x.message.contains("input_image"), "{}", x.message);
        let x = e(json!({"input": "hi", "tools": [{"type": "web_search"}]}));
        assert_eq!(x.param.as_deref(), Some("tools"));
        let x = e(json!({"input": 3}));
        assert_eq!(x.param.as_deref(), Some("input"));
        let x = e(json!({"input": "hi", "max_output_tokens": 0}));
        assert_eq!(x.param.as_deref(), Some("max_output_tokens"));
    }

    #[test]
    fn custom_tools_are_text_tools() {
        let (c, ctx) = to_chat(
            &body(json!({"input": "patch it", "tools": [{"type": "custom", "name": "apply_patch",
                "description": "apply a patch", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}]})),
            None,
        )
        .unwrap();
        assert_eq!(ctx.custom, vec!["apply_patch"]);
        let f = &c["tools"][0]["function"];
        assert_eq!(f["parameters"]["required"], json!(["input"]));
        assert!(f["description"].as_str().unwrap().contains("lark grammar"));
        let call = crate::tools::Call {
            name: "apply_patch".into(),
            arguments: json!({"input": "*** Begin Patch"}).to_string(),
        };
        let item = output_item_of_call(&call, &ctx.custom);
        assert_eq!(item["type"], "custom_tool_call");
        assert_eq!(item["input"], "*** Begin Patch");
    }

    #[test]
    fn the_store_is_bounded_and_lru() {
        let mut s = Store::default();
        for i in 0..STORE_CAPACITY + 1 {
            s.put(Stored {
                id: format!("r{i}"),
                response: json!({}),
                messages: Vec::new(),
            });
            if i == 0 {
                assert!(s.get("r0").is_some());
            }
        }
        assert!(s.get("r0").is_none(), "the oldest is dropped");
        assert!(s.remove("r1"));
        assert!(!s.remove("r1"));
    }
}
