//! Tool calling. The request's `tools` go to the model's chat template; the reply is parsed back
//! into OpenAI `tool_calls`. The wire format is the Hermes/Qwen one, `<tool_call>{"name": …,
//! "arguments": {…}}</tool_call>`, which templates written for tools use; for a template that knows
//! nothing of tools, the tool list and that format are described in a system message. With
//! `tool_choice` `required` or a named function, decoding is constrained (llguidance) to one call
//! whose arguments validate against the tool's JSON schema.

use crate::error::ApiError;
use engine::chat::ChatMessage;
use serde_json::{json, Map, Value};

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// What the request asks of tools.
pub struct ToolRequest {
    pub tools: Value,
    pub names: Vec<String>,
    /// Constrain to a call: `None` (auto), `Some(None)` (any tool, required), `Some(Some(name))`.
    pub forced: Option<Option<String>>,
    pub schemas: Vec<(String, Value)>,
    /// `parallel_tool_calls` (default true): several calls may be returned at once.
    pub parallel: bool,
}

/// `tools` + `tool_choice` (`None` when there are no tools or `tool_choice` is `none`).
pub fn parse(body: &Map<String, Value>) -> Result<Option<ToolRequest>, ApiError> {
    let Some(tools) = body.get("tools").filter(|t| !t.is_null()) else {
        return Ok(None);
    };
    let arr = tools
        .as_array()
        .ok_or_else(|| ApiError::invalid("tools", "'tools' must be an array"))?;
    if arr.is_empty() {
        return Ok(None);
    }
    let mut names = Vec::new();
    let mut schemas = Vec::new();
    for (i, t) in arr.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::invalid(
                "tools",
                format!("tools[{i}].type must be \"function\""),
            ));
        }
        let f = t
            .get("function")
            .ok_or_else(|| ApiError::invalid("tools", format!("tools[{i}].function is missing")))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                ApiError::invalid("tools", format!("tools[{i}].function.name must be a non-empty string"))
            })?;
        let params = f
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        names.push(name.to_string());
        schemas.push((name.to_string(), params));
    }
    let forced = match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => None,
            "none" => return Ok(None),
            "required" => Some(None),
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice {other:?} is not auto, none or required"),
                ))
            }
        },
        Some(o) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": …}}",
                    )
                })?;
            if !names.iter().any(|n| n == name) {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice names {name:?}, which is not in 'tools'"),
                ));
            }
            Some(Some(name.to_string()))
        }
    };
    let parallel = match body.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::invalid(
                "parallel_tool_calls",
                "'parallel_tool_calls' must be a boolean",
            ))
        }
    };
    Ok(Some(ToolRequest {
        tools: tools.clone(),
        names,
        forced,
        schemas,
        parallel,
    }))
}

/// Whether the template renders `tools` itself.
pub fn template_knows_tools(source: &str) -> bool {
    source.contains("tools") && source.contains(OPEN)
}

/// For templates without tool support: describe the tools in a system message, and turn earlier
/// assistant calls and tool results into plain text the model can read.
pub fn inline_tools(messages: &mut Vec<ChatMessage>, req: &ToolRequest) {
    let mut sys = String::from(
        "You can call functions. To call one, reply with exactly\n<tool_call>\n{\"name\": \"FUNCTION\", \"arguments\": {…}}\n</tool_call>\nAvailable functions (JSON):\n",
    );
    sys.push_str(&req.tools.to_string());
    for m in messages.iter_mut() {
        if m.role == "assistant" {
            if let Some(calls) = m.extra.remove("tool_calls").and_then(|c| c.as_array().cloned()) {
                let mut text = m.content.as_str().unwrap_or("").to_string();
                for c in calls {
                    let f = &c["function"];
                    let args: Value = f["arguments"]
                        .as_str()
                        .and_then(|a| serde_json::from_str(a).ok())
                        .unwrap_or(Value::Null);
                    text.push_str(&format!(
                        "{OPEN}\n{}\n{CLOSE}",
                        json!({"name": f["name"], "arguments": args})
                    ));
                }
                m.content = Value::String(text);
            }
        } else if m.role == "tool" {
            m.role = "user".into();
            m.content = Value::String(format!("Function result: {}", m.content.as_str().unwrap_or("")));
        }
    }
    match messages.first_mut() {
        Some(m) if m.role == "system" => {
            let old = m.content.as_str().unwrap_or("").to_string();
            m.content = Value::String(format!("{old}\n\n{sys}"));
        }
        _ => messages.insert(0, ChatMessage::new("system", sys)),
    }
}

/// The Lark grammar of one forced call.
pub fn forced_grammar(req: &ToolRequest) -> Option<String> {
    let forced = req.forced.as_ref()?;
    let alternatives: Vec<Value> = req
        .schemas
        .iter()
        .filter(|(n, _)| forced.as_ref().is_none_or(|f| f == n))
        .map(|(n, p)| {
            json!({"type": "object", "properties": {"name": {"const": n}, "arguments": p},
                   "required": ["name", "arguments"], "additionalProperties": false})
        })
        .collect();
    let schema = if alternatives.len() == 1 {
        alternatives[0].clone()
    } else {
        json!({"anyOf": alternatives})
    };
    Some(format!(
        "start: \"{OPEN}\\n\" call \"\\n{CLOSE}\"\ncall: %json {schema}\n"
    ))
}

/// One parsed call.
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// Split a reply into text content and tool calls (calls whose JSON does not parse stay text).
pub fn parse_reply(text: &str) -> (String, Vec<Call>) {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        let Some(end) = after.find(CLOSE) else { break };
        let body = after[..end].trim();
        match serde_json::from_str::<Value>(body) {
            Ok(v) if v.get("name").and_then(Value::as_str).is_some() => {
                content.push_str(&rest[..start]);
                let args = v
                    .get("arguments")
                    .or_else(|| v.get("parameters"))
                    .cloned()
                    .unwrap_or(json!({}));
                calls.push(Call {
                    name: v["name"].as_str().unwrap_or_default().to_string(),
                    arguments: args.to_string(),
                });
            }
            _ => content.push_str(&rest[..start + OPEN.len() + end + CLOSE.len()]),
        }
        rest = &after[end + CLOSE.len()..];
    }
    content.push_str(rest);
    (content.trim().to_string(), calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_calls_and_keeps_text() {
        let (c, calls) = parse_reply(
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        );
        assert_eq!(c, "Let me check.");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        let (c, calls) = parse_reply("<tool_call>not json</tool_call> plain");
        assert!(calls.is_empty());
        assert_eq!(c, "<tool_call>not json</tool_call> plain");
    }
}
