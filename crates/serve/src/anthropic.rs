//! `POST /v1/messages` and `POST /v1/messages/count_tokens` (Anthropic's Messages API, which
//! Claude Code and the `anthropic` SDKs speak). A request is translated into a chat request
//! (system, content blocks, tools, tool_choice, stop sequences, thinking) and runs through the
//! chat pipeline; the reply comes back as content blocks or as the Messages event stream. Errors
//! are Anthropic-shaped (`{"type": "error", "error": {"type", "message"}}`).

use super::{new_item_id as new_id, prepare_chat, single, ApiError, Finish, Shared};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use single::Delta;

/// An [`ApiError`] in Anthropic's shape, with the field renamed where the chat pipeline named its
/// own field.
pub fn error_response(e: ApiError) -> Response {
    let kind = match e.status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        s if s.is_server_error() => "api_error",
        _ => "invalid_request_error",
    };
    let mut r = (e.status, Json(error_body(kind, &e))).into_response();
    if e.status == StatusCode::TOO_MANY_REQUESTS || e.status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert("retry-after", axum::http::HeaderValue::from_static("1"));
    }
    r
}

fn error_body(kind: &str, e: &ApiError) -> Value {
    let field = e.param.as_deref().map(|p| match p {
        "stop" => "stop_sequences",
        p => p,
    });
    let message = match field {
        Some(f) if !e.message.contains(f) => format!("{f}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

fn invalid(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(param, msg)
}

/// The text of a `system` value or a `tool_result` content: a string or text blocks.
fn text_blocks(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (k, b) in blocks.iter().enumerate() {
                match (
                    b.get("type").and_then(Value::as_str),
                    b.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => {
                        if !out.is_empty() {
                            out.push('\n');
                        }
                        out.push_str(t)
                    }
                    (Some(ty @ ("image" | "document")), _) => {
                        return Err(invalid(
                            param,
                            format!("{param}[{k}]: {ty} input is not supported: this server's models read text"),
                        ))
                    }
                    _ => return Err(invalid(param, format!("{param}[{k}] must be a text block"))),
                }
            }
            Ok(out)
        }
        _ => Err(invalid(
            param,
            format!("{param} must be a string or an array of text blocks"),
        )),
    }
}

/// A Messages request → a chat request body. `count` is for count_tokens (no `max_tokens`).
fn to_chat(b: &Map<String, Value>, count: bool) -> Result<Map<String, Value>, ApiError> {
    let mut c = Map::new();
    for k in ["model", "temperature", "top_p", "top_k", "stream"] {
        if let Some(v) = b.get(k).filter(|v| !v.is_null()) {
            c.insert(k.into(), v.clone());
        }
    }
    match b.get("max_tokens").filter(|v| !v.is_null()) {
        Some(v) if v.as_u64().is_some_and(|n| n >= 1) => {
            c.insert("max_tokens".into(), v.clone());
        }
        Some(_) => return Err(invalid("max_tokens", "max_tokens must be a positive integer")),
        None if count => {}
        None => return Err(invalid("max_tokens", "max_tokens: Field required")),
    }
    match b.get("stop_sequences").filter(|v| !v.is_null()) {
        None => {}
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            c.insert("stop".into(), Value::Array(a.clone()));
        }
        Some(_) => return Err(invalid("stop_sequences", "stop_sequences must be an array of strings")),
    }
    let mut msgs = Vec::new();
    if let Some(s) = b.get("system").filter(|v| !v.is_null()) {
        msgs.push(json!({"role": "system", "content": text_blocks(s, "system")?}));
    }
    let arr = b
        .get("messages")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| invalid("messages", "messages must be a non-empty array"))?;
    let mut tool_uses: Vec<String> = Vec::new();
    for (i, m) in arr.iter().enumerate() {
        let p = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if !matches!(role, "user" | "assistant") {
            return Err(invalid(&p, format!("{p}.role {role:?} is not user or assistant")));
        }
        let blocks = match m.get("content") {
            Some(Value::String(s)) => {
                msgs.push(json!({"role": role, "content": s}));
                continue;
            }
            Some(Value::Array(a)) => a,
            _ => {
                return Err(invalid(
                    &p,
                    format!("{p}.content must be a string or an array of blocks"),
                ))
            }
        };
        let (mut text, mut thinking, mut calls) = (String::new(), String::new(), Vec::new());
        for (k, blk) in blocks.iter().enumerate() {
            let bp = format!("{p}.content[{k}]");
            let ty = blk.get("type").and_then(Value::as_str).unwrap_or("");
            let s = |key: &str| blk.get(key).and_then(Value::as_str);
            match (role, ty) {
                (_, "text") => {
                    text.push_str(s("text").ok_or_else(|| invalid(&bp, format!("{bp}.text must be a string")))?)
                }
                ("assistant", "thinking") => thinking.push_str(s("thinking").unwrap_or("")),
                ("assistant", "redacted_thinking") => {}
                ("assistant", "tool_use") => {
                    let id = s("id")
                        .filter(|x| !x.is_empty())
                        .ok_or_else(|| invalid(&bp, format!("{bp}.id must be a non-empty string")))?;
                    let name = s("name")
                        .filter(|x| !x.is_empty())
                        .ok_or_else(|| invalid(&bp, format!("{bp}.name must be a non-empty string")))?;
                    let input = blk
                        .get("input")
                        .filter(|v| v.is_object())
                        .ok_or_else(|| invalid(&bp, format!("{bp}.input must be an object")))?;
                    calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}));
                    tool_uses.push(id.to_string());
                }
                ("user", "tool_result") => {
                    let id =
                        s("tool_use_id").ok_or_else(|| invalid(&bp, format!("{bp}.tool_use_id must be a string")))?;
                    if !tool_uses.iter().any(|u| u == id) {
                        return Err(invalid(
                            &bp,
                            format!("{bp}: tool_use_id {id:?} matches no earlier tool_use block"),
                        ));
                    }
                    let mut out = text_blocks(blk.get("content").unwrap_or(&Value::Null), &format!("{bp}.content"))?;
                    if blk.get("is_error").and_then(Value::as_bool) == Some(true) {
                        out = format!("Error: {out}");
                    }
                    msgs.push(json!({"role": "tool", "tool_call_id": id, "content": out}));
                }
                (_, "image" | "document") => {
                    return Err(invalid(
                        &bp,
                        format!("{bp}: {ty} input is not supported: this server's models read text"),
                    ))
                }
                _ => {
                    return Err(invalid(
                        &format!("{bp}.type"),
                        format!("{bp}.type {ty:?} is not a {role} content block this server takes"),
                    ))
                }
            }
        }
        if role == "assistant" {
            let mut am = json!({"role": "assistant", "content": text});
            if !thinking.is_empty() {
                am["reasoning_content"] = json!(thinking);
            }
            if !calls.is_empty() {
                am["tool_calls"] = Value::Array(calls);
                if text.is_empty() {
                    am["content"] = Value::Null;
                }
            }
            msgs.push(am);
        } else if !text.is_empty() || blocks.is_empty() {
            msgs.push(json!({"role": "user", "content": text}));
        }
    }
    c.insert("messages".into(), Value::Array(msgs));
    if let Some(t) = b.get("tools").filter(|v| !v.is_null()) {
        let arr = t.as_array().ok_or_else(|| invalid("tools", "tools must be an array"))?;
        let mut tools = Vec::new();
        for (i, t) in arr.iter().enumerate() {
            let ty = t.get("type").and_then(Value::as_str).unwrap_or("custom");
            if ty != "custom" {
                return Err(invalid(
                    "tools",
                    format!("tools[{i}].type {ty:?} is a server tool this server does not run (custom tools with an input_schema are)"),
                ));
            }
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| invalid("tools", format!("tools[{i}].name must be a non-empty string")))?;
            let schema = t
                .get("input_schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| invalid("tools", format!("tools[{i}].input_schema must be an object")))?;
            tools.push(json!({"type": "function", "function": {"name": name,
                "description": t.get("description").cloned().unwrap_or(Value::Null), "parameters": schema}}));
        }
        if !tools.is_empty() {
            c.insert("tools".into(), Value::Array(tools));
        }
    }
    if let Some(tc) = b.get("tool_choice").filter(|v| !v.is_null()) {
        let choice = match (
            tc.get("type").and_then(Value::as_str),
            tc.get("name").and_then(Value::as_str),
        ) {
            (Some("auto"), _) => json!("auto"),
            (Some("any"), _) => json!("required"),
            (Some("none"), _) => json!("none"),
            (Some("tool"), Some(name)) => json!({"type": "function", "function": {"name": name}}),
            _ => return Err(invalid(
                "tool_choice",
                "tool_choice must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": …}",
            )),
        };
        c.insert("tool_choice".into(), choice);
        if tc.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true) {
            c.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    let mut kwargs = Map::new();
    if let Some(t) = b.get("thinking").filter(|v| !v.is_null()) {
        let on = match t.get("type").and_then(Value::as_str) {
            Some("enabled" | "adaptive" | "between_tools") => true,
            Some("disabled") => false,
            _ => {
                return Err(invalid(
                    "thinking",
                    "thinking.type must be enabled, adaptive, between_tools or disabled",
                ))
            }
        };
        kwargs.insert("enable_thinking".into(), json!(on));
    }
    if let Some(o) = b.get("output_config").filter(|v| !v.is_null()) {
        if let Some(e) = o.get("effort").filter(|v| !v.is_null()) {
            let e = e
                .as_str()
                .filter(|e| matches!(*e, "low" | "medium" | "high" | "xhigh" | "max"))
                .ok_or_else(|| {
                    invalid(
                        "output_config.effort",
                        "output_config.effort must be low, medium, high, xhigh or max",
                    )
                })?;
            kwargs.insert("reasoning_effort".into(), json!(e));
        }
        if let Some(f) = o.get("format").filter(|v| !v.is_null()) {
            let schema = f
                .get("schema")
                .filter(|s| s.is_object() && f.get("type").and_then(Value::as_str) == Some("json_schema"))
                .ok_or_else(|| {
                    invalid(
                        "output_config.format",
                        "output_config.format must be {\"type\": \"json_schema\", \"schema\": {…}}",
                    )
                })?;
            c.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}),
            );
        }
    }
    if !kwargs.is_empty() {
        c.insert("chat_template_kwargs".into(), Value::Object(kwargs));
    }
    Ok(c)
}

fn stop_reason(s: &single::Summary) -> (&'static str, Value) {
    if s.calls > 0 {
        return ("tool_use", Value::Null);
    }
    match (&s.finish, &s.stop) {
        (Finish::Length, _) => ("max_tokens", Value::Null),
        (_, Some(seq)) => ("stop_sequence", json!(seq)),
        _ => ("end_turn", Value::Null),
    }
}

fn tool_use_block(c: &crate::tools::Call) -> Value {
    let input = serde_json::from_str::<Value>(&c.arguments).unwrap_or_else(|_| json!({}));
    json!({"type": "tool_use", "id": new_id("toolu"), "name": c.name, "input": input})
}

fn usage(s: &single::Summary) -> Value {
    // Anthropic counts tokens read from the cache apart from input_tokens.
    json!({"input_tokens": s.prompt_tokens - s.cached_tokens.min(s.prompt_tokens),
           "cache_read_input_tokens": s.cached_tokens, "cache_creation_input_tokens": 0,
           "output_tokens": s.completion_tokens})
}

pub async fn create(State(st): State<Shared>, body: Bytes) -> Response {
    match create_inner(st, body).await {
        Ok(r) => r,
        Err(e) => error_response(e),
    }
}

async fn create_inner(st: Shared, body: Bytes) -> Result<Response, ApiError> {
    let b = super::api::object(&body)?;
    super::ensure_loaded(&st, b.get("model").and_then(Value::as_str)).await?;
    let chat = to_chat(&b, false)?;
    let p = prepare_chat(&st, &chat)?;
    let stream = p.stream;
    let model = p.worker.id.clone();
    let requested = b.get("model").and_then(Value::as_str).map(str::to_string);
    let prompt_tokens = p.prompt.len();
    let rx = single::start(&st, p)?;
    let id = new_id("msg");
    if !stream {
        let r = single::collect(rx).await?;
        let s = r.summary.clone().expect("collect returns a summary");
        let mut content = Vec::new();
        if !r.thought.is_empty() {
            content.push(json!({"type": "thinking", "thinking": r.thought, "signature": ""}));
        }
        if !r.text.is_empty() {
            content.push(json!({"type": "text", "text": r.text}));
        }
        content.extend(r.calls.iter().map(tool_use_block));
        let (reason, seq) = stop_reason(&s);
        let r = Json(json!({"id": id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": reason, "stop_sequence": seq, "usage": usage(&s)}))
        .into_response();
        return Ok(super::served_by(r, requested.as_deref(), &model));
    }
    let served = model.clone();
    Ok(super::served_by(
        stream_response(st, rx, id, model, prompt_tokens),
        requested.as_deref(),
        &served,
    ))
}

fn ev(ty: &str, data: Value) -> SseEvent {
    SseEvent::default().event(ty).data(data.to_string())
}

fn stream_response(
    st: Shared,
    rx: tokio::sync::mpsc::UnboundedReceiver<Delta>,
    id: String,
    model: String,
    prompt_tokens: usize,
) -> Response {
    let keep_alive = KeepAlive::new().interval(st.cfg.sse_keepalive);
    {
        let start = json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant",
            "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": prompt_tokens, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0, "output_tokens": 0}}});
        let first = vec![ev("message_start", start), ev("ping", json!({"type": "ping"}))];
        // The open block: its index and kind ("thinking" or "text").
        let mut open: Option<(usize, &'static str)> = None;
        let mut next = 0usize;
        let close = |open: &mut Option<(usize, &'static str)>, out: &mut Vec<SseEvent>| {
            if let Some((i, kind)) = open.take() {
                if kind == "thinking" {
                    out.push(ev(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i, "delta": {"type": "signature_delta", "signature": ""}}),
                    ));
                }
                out.push(ev(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": i}),
                ));
            }
        };
        let events = super::async_stream(rx, move |d| {
            let mut out = Vec::new();
            let mut end = false;
            match d {
                None => end = true,
                Some(Delta::Thought(t)) | Some(Delta::Text(t)) if t.is_empty() => {}
                Some(d @ (Delta::Thought(_) | Delta::Text(_))) => {
                    let (kind, t) = match d {
                        Delta::Thought(t) => ("thinking", t),
                        Delta::Text(t) => ("text", t),
                        _ => unreachable!("matched above"),
                    };
                    if open.map(|o| o.1) != Some(kind) {
                        close(&mut open, &mut out);
                        let block = if kind == "thinking" {
                            json!({"type": "thinking", "thinking": "", "signature": ""})
                        } else {
                            json!({"type": "text", "text": ""})
                        };
                        out.push(ev(
                            "content_block_start",
                            json!({"type": "content_block_start", "index": next, "content_block": block}),
                        ));
                        open = Some((next, kind));
                        next += 1;
                    }
                    let i = open.map_or(0, |o| o.0);
                    let delta = if kind == "thinking" {
                        json!({"type": "thinking_delta", "thinking": t})
                    } else {
                        json!({"type": "text_delta", "text": t})
                    };
                    out.push(ev(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i, "delta": delta}),
                    ));
                }
                Some(Delta::Progress(_) | Delta::Timings(_)) => {}
                Some(Delta::Call(c)) => {
                    close(&mut open, &mut out);
                    let mut block = tool_use_block(&c);
                    let input = block["input"].to_string();
                    block["input"] = json!({});
                    out.push(ev(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": next, "content_block": block}),
                    ));
                    out.push(ev(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": next,
                               "delta": {"type": "input_json_delta", "partial_json": input}}),
                    ));
                    out.push(ev(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": next}),
                    ));
                    next += 1;
                }
                Some(Delta::Done(s)) => {
                    close(&mut open, &mut out);
                    let (reason, seq) = stop_reason(&s);
                    out.push(ev(
                        "message_delta",
                        json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                               "usage": usage(&s)}),
                    ));
                    out.push(ev("message_stop", json!({"type": "message_stop"})));
                    end = true;
                }
                Some(Delta::Error(e)) => {
                    out.push(ev("error", error_body("api_error", &e)));
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

/// `POST /v1/messages/count_tokens`: the prompt's tokens as the model would see it.
pub async fn count_tokens(State(st): State<Shared>, body: Bytes) -> Response {
    let r = (|| {
        let b = super::api::object(&body)?;
        let mut chat = to_chat(&b, true)?;
        chat.remove("stream");
        let p = prepare_chat(&st, &chat)?;
        Ok::<_, ApiError>(p.prompt.len())
    })();
    match r {
        Ok(n) => Json(json!({"input_tokens": n})).into_response(),
        Err(e) => error_response(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn blocks_become_chat_messages() {
        let c = to_chat(
            &body(json!({"model": "m", "max_tokens": 50, "system": [{"type": "text", "text": "be brief"}],
                "stop_sequences": ["END"], "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
                "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}],
                "messages": [
                    {"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "use the tool", "signature": "s"},
                        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}]}]}
                ]})),
            false,
        )
        .unwrap();
        let m = c["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[2]["reasoning_content"], "use the tool");
        assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "t1", "content": "sunny"}));
        assert_eq!(m.len(), 4);
        assert_eq!(c["stop"], json!(["END"]));
        assert_eq!(c["tool_choice"], "required");
        assert_eq!(c["parallel_tool_calls"], false);
        assert_eq!(c["tools"][0]["function"]["parameters"], json!({"type": "object"}));
    }

    #[test]
    fn bad_blocks_name_the_field() {
        let e = |v: Value| to_chat(&body(v), false).err().unwrap();
        let x = e(json!({"messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(x.param.as_deref(), Some("max_tokens"));
        let x = e(
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "r"}]}]}),
        );
        assert_eq!(x.param.as_deref(), Some("messages[0].content[0]"));
        let x = e(json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]}));
        assert_eq!(x.param.as_deref(), Some("messages[0].content[0].type"));
        let x = e(json!({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}));
        assert_eq!(x.param.as_deref(), Some("messages[0]"));
        let x = e(
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
        );
        assert_eq!(x.param.as_deref(), Some("tools"));
        assert!(to_chat(&body(json!({"messages": [{"role": "user", "content": "x"}]})), true).is_ok());
    }

    #[test]
    fn errors_are_anthropic_shaped() {
        let b = error_body(
            "invalid_request_error",
            &ApiError::invalid("stop", "at most 4 stop sequences"),
        );
        assert_eq!(b["type"], "error");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert!(b["error"]["message"].as_str().unwrap().starts_with("stop_sequences: "));
    }
}
