//! OpenAI request bodies, validated into typed values before they reach the engine. Unknown fields
//! are ignored (as OpenAI does); a field of the wrong type or with an invalid value is a 400 that
//! names it; features this server does not implement yet are a 400 that says so, never ignored.

use crate::error::ApiError;
use engine::chat::ChatMessage;
use engine::sampler::SamplingParams;
use serde_json::{Map, Value};

/// The validated common part of chat and text completion requests.
pub struct Valid {
    pub model: Option<String>,
    pub sampling: SamplingParams,
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Choices per request (`n`).
    pub n: usize,
    /// `top_logprobs` when `logprobs` is on.
    pub logprobs: Option<usize>,
    /// Structured output: `Some(None)` any JSON object, `Some(Some(schema))` a JSON schema.
    pub format: Option<Option<Value>>,
    /// Left-truncate the prompt to its last N tokens (vLLM's `truncate_prompt_tokens`).
    pub truncate_prompt_tokens: Option<usize>,
    /// llama-server's `verbose`: the reply carries the `__verbose` debug object.
    pub verbose: bool,
    /// llama-server's `grammar` (GBNF), as a Lark grammar.
    pub grammar: Option<String>,
    /// The request gave a `seed` (else the server's `--seed`, if any, or a random one).
    pub seeded: bool,
    /// llama-server's `timings_per_token`: streamed chunks carry the `timings` so far.
    pub timings_per_token: bool,
    /// llama-server's `return_progress`: a streamed reply reports the prompt's prefill
    /// (`prompt_progress`) as it goes.
    pub return_progress: bool,
}

fn field<'a>(body: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    body.get(name).filter(|v| !v.is_null())
}

fn number(body: &Map<String, Value>, name: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
    match field(body, name) {
        None => Ok(None),
        Some(v) => {
            let x = v
                .as_f64()
                .ok_or_else(|| ApiError::invalid(name, format!("'{name}' must be a number")))?;
            if !(lo..=hi).contains(&x) {
                return Err(ApiError::invalid(
                    name,
                    format!("'{name}' must be between {lo} and {hi}, got {x}"),
                ));
            }
            Ok(Some(x))
        }
    }
}

fn integer(body: &Map<String, Value>, name: &str, lo: u64) -> Result<Option<u64>, ApiError> {
    match field(body, name) {
        None => Ok(None),
        Some(v) => {
            let x = v
                .as_u64()
                .ok_or_else(|| ApiError::invalid(name, format!("'{name}' must be a non-negative integer")))?;
            if x < lo {
                return Err(ApiError::invalid(name, format!("'{name}' must be at least {lo}")));
            }
            Ok(Some(x))
        }
    }
}

fn boolean(body: &Map<String, Value>, name: &str) -> Result<bool, ApiError> {
    match field(body, name) {
        None => Ok(false),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| ApiError::invalid(name, format!("'{name}' must be a boolean"))),
    }
}

/// Parse a JSON object body; malformed JSON or a non-object is a 400.
pub fn object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_request("the request body must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!(
            "malformed JSON in the request body: {e}"
        ))),
    }
}

/// The fields shared by chat (`chat` = true) and text completions.
pub fn common(body: &Map<String, Value>, chat: bool) -> Result<Valid, ApiError> {
    // llama-server's GBNF `grammar`, translated for llguidance.
    let grammar = match field(body, "grammar") {
        None => None,
        Some(Value::String(g)) => {
            Some(engine::gbnf::to_lark(g).map_err(|e| ApiError::invalid("grammar", format!("'grammar': {e}")))?)
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "grammar",
                "'grammar' must be a string (a GBNF grammar)",
            ))
        }
    };
    let model = match field(body, "model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::invalid("model", "'model' must be a string")),
    };
    let n = integer(body, "n", 1)?.unwrap_or(1) as usize;
    if n > 16 {
        return Err(ApiError::invalid("n", "'n' must be at most 16"));
    }
    let logprobs = if chat {
        let on = boolean(body, "logprobs")?;
        let top = integer(body, "top_logprobs", 0)?;
        if top.is_some_and(|t| t > 20) {
            return Err(ApiError::invalid(
                "top_logprobs",
                "'top_logprobs' must be between 0 and 20",
            ));
        }
        if top.is_some() && !on {
            return Err(ApiError::invalid(
                "top_logprobs",
                "'top_logprobs' needs 'logprobs': true",
            ));
        }
        on.then(|| top.unwrap_or(0) as usize)
    } else {
        // Legacy completions: `logprobs` is the number of alternatives per token (0-20; OpenAI
        // allows 5, vLLM 20).
        match field(body, "logprobs") {
            None | Some(Value::Null) => None,
            Some(_) => {
                let k = integer(body, "logprobs", 0)?.unwrap_or(0);
                if k > 20 {
                    return Err(ApiError::invalid("logprobs", "'logprobs' must be between 0 and 20"));
                }
                Some(k as usize)
            }
        }
    };
    if grammar.is_some() && field(body, "response_format").is_some() {
        return Err(ApiError::invalid(
            "grammar",
            "'grammar' cannot be combined with response_format",
        ));
    }
    // llama-server's top-level `json_schema` (a schema object) is a json_schema response format.
    if let Some(js) = field(body, "json_schema") {
        if field(body, "response_format").is_some() {
            return Err(ApiError::invalid(
                "json_schema",
                "'json_schema' cannot be combined with response_format",
            ));
        }
        if !js.is_object() {
            return Err(ApiError::invalid(
                "json_schema",
                "'json_schema' must be a JSON schema object",
            ));
        }
        if grammar.is_some() {
            return Err(ApiError::invalid(
                "grammar",
                "'grammar' cannot be combined with json_schema",
            ));
        }
    }
    let format = match field(body, "response_format") {
        None => field(body, "json_schema").map(|js| Some(crate::tools::closed_objects(js))),
        Some(rf) => match rf.get("type").and_then(Value::as_str).unwrap_or("") {
            "text" => None,
            "json_object" => Some(None),
            "json_schema" => {
                let schema = rf
                    .get("json_schema")
                    .and_then(|j| j.get("schema"))
                    .filter(|s| s.is_object())
                    .ok_or_else(|| {
                        ApiError::invalid("response_format", "json_schema needs a 'json_schema.schema' object")
                    })?;
                Some(Some(crate::tools::closed_objects(schema)))
            }
            ty => {
                return Err(ApiError::invalid(
                    "response_format",
                    format!("response_format type {ty:?} is not text, json_object or json_schema"),
                ))
            }
        },
    };
    // OpenAI defaults: temperature 1, top_p 1; llama.cpp's server extensions top_k, min_p,
    // repetition_penalty default off.
    let mut s = SamplingParams {
        temperature: number(body, "temperature", 0.0, 2.0)?.unwrap_or(1.0) as f32,
        top_p: number(body, "top_p", 0.0, 1.0)?.unwrap_or(1.0) as f32,
        top_k: integer(body, "top_k", 0)?.unwrap_or(0) as usize,
        min_p: number(body, "min_p", 0.0, 1.0)?.unwrap_or(0.0) as f32,
        presence_penalty: number(body, "presence_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32,
        frequency_penalty: number(body, "frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32,
        repeat_penalty: number(body, "repetition_penalty", 0.0, 10.0)?.unwrap_or(1.0) as f32,
        penalty_last_n: 64,
        logit_bias: Vec::new(),
        seed: 0,
    };
    if s.top_p == 0.0 {
        return Err(ApiError::invalid("top_p", "'top_p' must be greater than 0"));
    }
    if s.repeat_penalty == 0.0 {
        return Err(ApiError::invalid(
            "repetition_penalty",
            "'repetition_penalty' must be greater than 0",
        ));
    }
    s.seed = match field(body, "seed") {
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
        Some(v) => v
            .as_i64()
            .ok_or_else(|| ApiError::invalid("seed", "'seed' must be an integer"))? as u64,
    };
    if let Some(b) = field(body, "logit_bias") {
        let m = b
            .as_object()
            .ok_or_else(|| ApiError::invalid("logit_bias", "'logit_bias' must be an object of token id → bias"))?;
        for (k, v) in m {
            let id: u32 = k
                .parse()
                .map_err(|_| ApiError::invalid("logit_bias", format!("logit_bias key {k:?} is not a token id")))?;
            let bias = v.as_f64().filter(|b| (-100.0..=100.0).contains(b));
            let bias = bias.ok_or_else(|| {
                ApiError::invalid(
                    "logit_bias",
                    format!("logit_bias of {id} must be a number in [-100, 100]"),
                )
            })?;
            s.logit_bias.push((id, bias as f32));
        }
    }
    let stop = match field(body, "stop") {
        None => Vec::new(),
        Some(Value::String(x)) => vec![x.clone()],
        Some(Value::Array(a)) => {
            let v: Option<Vec<String>> = a.iter().map(|x| x.as_str().map(str::to_string)).collect();
            let v = v.ok_or_else(|| ApiError::invalid("stop", "'stop' must be a string or an array of strings"))?;
            if v.len() > 4 {
                return Err(ApiError::invalid("stop", "at most 4 stop sequences"));
            }
            v
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "stop",
                "'stop' must be a string or an array of strings",
            ))
        }
    };
    let max_tokens = match integer(body, "max_completion_tokens", 1)? {
        Some(n) => Some(n as usize),
        None => integer(body, "max_tokens", 1)?.map(|n| n as usize),
    };
    let stream = boolean(body, "stream")?;
    let include_usage = match field(body, "stream_options") {
        None => false,
        Some(o) => o.get("include_usage").and_then(Value::as_bool).unwrap_or(false),
    };
    Ok(Valid {
        model,
        sampling: s,
        max_tokens,
        stop,
        stream,
        include_usage,
        n,
        logprobs,
        format,
        truncate_prompt_tokens: integer(body, "truncate_prompt_tokens", 1)?.map(|k| k as usize),
        grammar,
        seeded: field(body, "seed").is_some(),
        timings_per_token: boolean(body, "timings_per_token")?,
        return_progress: boolean(body, "return_progress")?,
        verbose: match body.get("verbose") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ApiError::invalid("verbose", "'verbose' must be a boolean")),
        },
    })
}

/// The text of content parts (`{"type": "text", "text": …}`), joined with `sep`; else the first
/// other part's type (for the caller's error).
pub fn text_parts(parts: &[Value], sep: &str) -> Result<String, String> {
    let mut text = String::new();
    for (i, p) in parts.iter().enumerate() {
        match (
            p.get("type").and_then(Value::as_str),
            p.get("text").and_then(Value::as_str),
        ) {
            (Some("text"), Some(t)) => {
                if i > 0 {
                    text.push_str(sep);
                }
                text.push_str(t)
            }
            (ty, _) => return Err(ty.map_or("a part without a type".into(), |t| format!("{t:?}"))),
        }
    }
    Ok(text)
}

/// `messages` of a chat request as template messages.
pub fn messages(body: &Map<String, Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let arr = field(body, "messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::invalid("messages", "'messages' must be a non-empty array"))?;
    if arr.is_empty() {
        return Err(ApiError::invalid("messages", "'messages' must be a non-empty array"));
    }
    let mut out = Vec::with_capacity(arr.len());
    for (i, m) in arr.iter().enumerate() {
        let o = m
            .as_object()
            .ok_or_else(|| ApiError::invalid("messages", format!("messages[{i}] must be an object")))?;
        let role = o.get("role").and_then(Value::as_str).unwrap_or("");
        if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
            return Err(ApiError::invalid(
                "messages",
                format!("messages[{i}].role {role:?} is not one of system, user, assistant, tool"),
            ));
        }
        let content = match o.get("content") {
            None | Some(Value::Null) => Value::Null,
            Some(Value::String(s)) => Value::String(s.clone()),
            // Text parts are joined, one per line (as llama-server and vLLM join them): templates
            // of text models expect a string. A final assistant message that is continued has
            // them joined with a blank line (llama-server's rule, applied in `prepare_chat`).
            Some(Value::Array(parts)) => Value::String(text_parts(parts, "\n").map_err(|ty| {
                ApiError::invalid(
                    "messages",
                    format!("messages[{i}].content: only text parts are supported, not {ty}"),
                )
            })?),
            Some(_) => {
                return Err(ApiError::invalid(
                    "messages",
                    format!("messages[{i}].content must be a string or an array of parts"),
                ))
            }
        };
        let mut extra = Map::new();
        for (k, v) in o {
            if k != "role" && k != "content" {
                extra.insert(k.clone(), v.clone());
            }
        }
        let role = if role == "developer" { "system" } else { role };
        out.push(ChatMessage {
            role: role.to_string(),
            content,
            extra,
        });
    }
    Ok(out)
}
