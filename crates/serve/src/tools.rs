//! Tool calling. The request's `tools` go to the model's chat template; the reply is parsed back
//! into OpenAI `tool_calls` in the format of the model family, recognised from its template
//! ([`ToolFormat`]): Hermes/Qwen `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, Llama 3.x
//! JSON `{"name": …, "parameters": {…}}`, Mistral `[TOOL_CALLS][{"name": …, "arguments": {…}}]` and
//! the newer Mistral `[TOOL_CALLS]name[ARGS]{…}`, Gemma 4's
//! `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>`, and Qwen 3.5 / Qwen3-Coder's
//! `<tool_call><function=NAME><parameter=KEY>value</parameter></function></tool_call>`. Control tokens (`<|python_tag|>`,
//! `[TOOL_CALLS]`, `[ARGS]`) are not part of the reply text, so the parsers accept the calls with
//! or without them. For a template that knows nothing of tools, the tool list and the Hermes format
//! are described in a system message. With `tool_choice` `required` or a named function, decoding
//! is constrained (llguidance) to calls of that format whose arguments validate against the tool's
//! JSON schema.

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

/// How a model family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Hermes, Qwen 2.5/3, SmolLM3).
    Hermes,
    /// `<|python_tag|>{"name": …, "parameters": {…}}` (Llama 3.1-3.3; the tag is optional).
    Llama3,
    /// `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]` (Mistral v3 templates, e.g. Nemo).
    MistralList,
    /// `[TOOL_CALLS]name[ARGS]{…}` (Mistral templates from Small 3.2 / Devstral on).
    MistralArgs,
    /// `<|tool_call>call:NAME{key:value,…}<tool_call|>` with strings in `<|"|>` quotes and bare
    /// keys (Gemma 4; llama.cpp common/parsers/gemma4.cpp).
    Gemma4,
    /// `<tool_call>\n<function=NAME>\n<parameter=KEY>\nvalue\n</parameter>\n…</function>\n</tool_call>`
    /// (Qwen 3.5 / 3.6, Qwen3-Coder; llama.cpp common/parsers/qwen3-coder.cpp).
    QwenXml,
}

pub const GEMMA4_OPEN: &str = "<|tool_call>";
pub const GEMMA4_CLOSE: &str = "<tool_call|>";
/// Gemma 4's string quote.
const GQ: &str = "<|\"|>";

impl ToolFormat {
    /// The format a chat template renders tool calls in; `None` when it does not handle tools
    /// (the tools then go into a system message in the Hermes format).
    pub fn of_template(source: &str) -> Option<ToolFormat> {
        if !source.contains("tools") {
            return None;
        }
        if source.contains("<|tool_call>call:") {
            return Some(ToolFormat::Gemma4);
        }
        if source.contains("<function=") && source.contains("<parameter=") {
            return Some(ToolFormat::QwenXml);
        }
        if source.contains("[TOOL_CALLS]") {
            Some(if source.contains("[ARGS]") {
                ToolFormat::MistralArgs
            } else {
                ToolFormat::MistralList
            })
        } else if source.contains(OPEN) {
            Some(ToolFormat::Hermes)
        } else if source.contains("<|python_tag|>") || source.contains("ipython") {
            Some(ToolFormat::Llama3)
        } else {
            None
        }
    }
}

impl ToolFormat {
    /// The tags around each call of the formats that wrap calls (cut out of streamed text as
    /// each closes).
    fn tags(self) -> Option<(&'static str, &'static str)> {
        match self {
            ToolFormat::Hermes | ToolFormat::QwenXml => Some((OPEN, CLOSE)),
            ToolFormat::Gemma4 => Some((GEMMA4_OPEN, GEMMA4_CLOSE)),
            _ => None,
        }
    }

    /// A call from the text between a wrapping format's tags.
    fn tagged_call(self, body: &str) -> Option<Call> {
        match self {
            ToolFormat::Gemma4 => gemma4_call(body),
            ToolFormat::QwenXml => qwen_xml_call(body),
            _ => serde_json::from_str::<Value>(body.trim())
                .ok()
                .as_ref()
                .and_then(call_of),
        }
    }
}

/// `call:NAME{…}` of a Gemma 4 call, its arguments turned into JSON.
fn gemma4_call(body: &str) -> Option<Call> {
    let rest = body.trim().strip_prefix("call:")?;
    let brace = rest.find('{')?;
    let name = rest[..brace].trim();
    if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || "_-.".contains(c)) {
        return None;
    }
    let mut p = Gemma4Parser { s: &rest[brace..] };
    let args = p.value()?;
    if !p.s.trim().is_empty() || !args.is_object() {
        return None;
    }
    Some(Call {
        name: name.to_string(),
        arguments: args.to_string(),
    })
}

/// `<function=NAME>` and its `<parameter=KEY>\nvalue\n</parameter>` entries of a Qwen 3.5 call,
/// the arguments as a JSON object. A value that reads as a JSON number, boolean, null, array or
/// object is that value, any other its text (llama.cpp decides by the tool's schema, which the
/// reply parser does not see: a string parameter whose whole value looks like a number comes back
/// as a number).
fn qwen_xml_call(body: &str) -> Option<Call> {
    let rest = body.trim().strip_prefix("<function=")?;
    let gt = rest.find('>')?;
    let name = rest[..gt].trim();
    if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || "_-.".contains(c)) {
        return None;
    }
    let mut rest = rest[gt + 1..].trim_start();
    let mut args = Map::new();
    loop {
        if let Some(r) = rest.strip_prefix("</function>") {
            if !r.trim().is_empty() {
                return None;
            }
            break;
        }
        let r = rest.strip_prefix("<parameter=")?;
        let gt = r.find('>')?;
        let key = r[..gt].trim();
        let r = &r[gt + 1..];
        let end = r.find("</parameter>")?;
        let raw = &r[..end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let v = match serde_json::from_str::<Value>(raw.trim()) {
            Ok(v) if !v.is_string() => v,
            _ => Value::String(raw.to_string()),
        };
        if key.is_empty() {
            return None;
        }
        args.insert(key.to_string(), v);
        rest = r[end + "</parameter>".len()..].trim_start();
    }
    Some(Call {
        name: name.to_string(),
        arguments: Value::Object(args).to_string(),
    })
}

/// Gemma 4's argument syntax: objects with bare (or quoted) keys, `<|"|>`-quoted strings,
/// arrays, numbers, booleans and null.
struct Gemma4Parser<'a> {
    s: &'a str,
}

impl Gemma4Parser<'_> {
    fn ws(&mut self) {
        self.s = self.s.trim_start();
    }

    fn eat(&mut self, t: &str) -> bool {
        self.ws();
        match self.s.strip_prefix(t) {
            Some(r) => {
                self.s = r;
                true
            }
            None => false,
        }
    }

    fn string(&mut self) -> Option<String> {
        let r = self.s.strip_prefix(GQ)?;
        let end = r.find(GQ)?;
        self.s = &r[end + GQ.len()..];
        Some(r[..end].to_string())
    }

    fn key(&mut self) -> Option<String> {
        self.ws();
        if self.s.starts_with(GQ) {
            return self.string();
        }
        let end = self.s.find(':')?;
        let k = self.s[..end].trim();
        (!k.is_empty()).then(|| {
            self.s = &self.s[end..];
            k.to_string()
        })
    }

    fn value(&mut self) -> Option<Value> {
        self.ws();
        if self.s.starts_with(GQ) {
            return self.string().map(Value::String);
        }
        if self.eat("{") {
            let mut m = Map::new();
            if self.eat("}") {
                return Some(Value::Object(m));
            }
            loop {
                let k = self.key()?;
                if !self.eat(":") {
                    return None;
                }
                let v = self.value()?;
                m.insert(k, v);
                if self.eat(",") {
                    continue;
                }
                return self.eat("}").then_some(Value::Object(m));
            }
        }
        if self.eat("[") {
            let mut a = Vec::new();
            if self.eat("]") {
                return Some(Value::Array(a));
            }
            loop {
                a.push(self.value()?);
                if self.eat(",") {
                    continue;
                }
                return self.eat("]").then_some(Value::Array(a));
            }
        }
        // A number, true / false / null, or a bare word (kept as a string).
        let end = self.s.find([',', '}', ']']).unwrap_or(self.s.len());
        let word = self.s[..end].trim();
        if word.is_empty() {
            return None;
        }
        self.s = &self.s[end..];
        Some(match word {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            "null" => Value::Null,
            w => serde_json::from_str::<serde_json::Number>(w)
                .map(Value::Number)
                .unwrap_or_else(|_| Value::String(w.to_string())),
        })
    }
}

/// Assistant `tool_calls` whose `arguments` are JSON text get them as objects, which templates
/// written for tools expect (they serialise them with `tojson`).
pub fn arguments_as_objects(messages: &mut [ChatMessage]) {
    for m in messages.iter_mut().filter(|m| m.role == "assistant") {
        let Some(Value::Array(calls)) = m.extra.get_mut("tool_calls") else {
            continue;
        };
        for c in calls.iter_mut() {
            let Some(f) = c.get_mut("function") else { continue };
            let parsed = f
                .get("arguments")
                .and_then(Value::as_str)
                .and_then(|a| serde_json::from_str::<Value>(a).ok())
                .filter(Value::is_object);
            if let Some(obj) = parsed {
                f["arguments"] = obj;
            }
        }
    }
}

/// For templates without tool support: describe the tools in a system message, and turn earlier
/// assistant calls and tool results into plain text the model can read.
pub fn inline_tools(messages: &mut Vec<ChatMessage>, req: &ToolRequest) {
    let mut sys = String::from(
        "You can call functions. To call one, reply with exactly\n<tool_call>\n{\"name\": \"FUNCTION\", \"arguments\": {…}}\n</tool_call>\nAvailable functions (JSON):\n",
    );
    sys.push_str(&req.tools.to_string());
    inline_history(messages);
    match messages.first_mut() {
        Some(m) if m.role == "system" => {
            let old = m.content.as_str().unwrap_or("").to_string();
            m.content = Value::String(format!("{old}\n\n{sys}"));
        }
        _ => messages.insert(0, ChatMessage::new("system", sys)),
    }
}

/// For templates without tool support: earlier assistant calls become `<tool_call>` text and tool
/// results user messages, so the conversation renders with or without `tools` in the request.
pub fn inline_history(messages: &mut [ChatMessage]) {
    for m in messages.iter_mut() {
        if m.role == "assistant" {
            if let Some(calls) = m.extra.remove("tool_calls").and_then(|c| c.as_array().cloned()) {
                let mut text = text_of(&m.content);
                for c in calls {
                    let f = &c["function"];
                    let args: Value = match &f["arguments"] {
                        Value::String(a) => serde_json::from_str(a).unwrap_or(Value::String(a.clone())),
                        other => other.clone(),
                    };
                    text.push_str(&format!(
                        "{OPEN}\n{}\n{CLOSE}",
                        json!({"name": f["name"], "arguments": args})
                    ));
                }
                m.content = Value::String(text);
            }
        } else if m.role == "tool" {
            m.role = "user".into();
            m.content = Value::String(format!("Function result: {}", text_of(&m.content)));
        }
    }
}

/// An assistant message that only calls tools often has `"content": null`; templates concatenate
/// it with strings, so it becomes `""` (which every template treats as empty).
pub fn empty_call_content(messages: &mut [ChatMessage]) {
    for m in messages.iter_mut() {
        if m.role == "assistant" && m.content.is_null() && m.extra.contains_key("tool_calls") {
            m.content = Value::String(String::new());
        }
    }
}

/// The text of a message's content: a string, or its text parts joined.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// `schema` with `"additionalProperties": false` on every object schema that does not say,
/// the default of llama.cpp's JSON-schema grammars (`grammars/README.md`: fewer hallucinated
/// keys) where JSON Schema itself would allow any extra property.
pub fn closed_objects(schema: &Value) -> Value {
    match schema {
        Value::Object(m) => {
            let mut out: serde_json::Map<String, Value> =
                m.iter().map(|(k, v)| (k.clone(), closed_objects(v))).collect();
            let is_object = match m.get("type") {
                Some(Value::String(t)) => t == "object",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
                _ => false,
            };
            if is_object && !m.contains_key("additionalProperties") {
                out.insert("additionalProperties".into(), Value::Bool(false));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(closed_objects).collect()),
        other => other.clone(),
    }
}

/// The Lark grammar of one forced call in `format`.
pub fn forced_grammar(req: &ToolRequest, format: ToolFormat) -> Option<String> {
    let forced = req.forced.as_ref()?;
    let chosen: Vec<(String, Value)> = req
        .schemas
        .iter()
        .filter(|(n, _)| forced.as_ref().is_none_or(|f| f == n))
        .map(|(n, p)| (n.clone(), closed_objects(p)))
        .collect();
    let one_of = |args_key: &str| {
        let alternatives: Vec<Value> = chosen
            .iter()
            .map(|(n, p)| {
                json!({"type": "object", "properties": {"name": {"const": n}, args_key: p},
                       "required": ["name", args_key], "additionalProperties": false})
            })
            .collect();
        if alternatives.len() == 1 {
            alternatives[0].clone()
        } else {
            json!({"anyOf": alternatives})
        }
    };
    Some(match format {
        ToolFormat::Gemma4 => {
            let mut rules = Vec::new();
            let alts: Vec<String> = chosen
                .iter()
                .enumerate()
                .map(|(i, (n, p))| {
                    let args = gemma4_rule(p, &format!("a{i}"), &mut rules);
                    format!(
                        "{} {args}",
                        serde_json::to_string(&format!("{GEMMA4_OPEN}call:{n}")).unwrap_or_default()
                    )
                })
                .collect();
            let close = serde_json::to_string(GEMMA4_CLOSE).unwrap_or_default();
            let mut g = format!("start: ({}) {close}\n", alts.join(" | "));
            for r in rules {
                g.push_str(&r);
                g.push('\n');
            }
            g
        }
        ToolFormat::Hermes => format!(
            "start: \"{OPEN}\\n\" call \"\\n{CLOSE}\"\ncall: %json {}\n",
            one_of("arguments")
        ),
        ToolFormat::QwenXml => qwen_xml_grammar(&chosen),
        ToolFormat::Llama3 => format!("start: call\ncall: %json {}\n", one_of("parameters")),
        ToolFormat::MistralList => format!("start: \"[\" call \"]\"\ncall: %json {}\n", one_of("arguments")),
        ToolFormat::MistralArgs => {
            let alts: Vec<String> = chosen
                .iter()
                .enumerate()
                .map(|(i, (n, _))| format!("{} args{i}", serde_json::to_string(n).unwrap_or_default()))
                .collect();
            let mut g = format!("start: {}\n", alts.join(" | "));
            for (i, (_, p)) in chosen.iter().enumerate() {
                g.push_str(&format!("args{i}: %json {p}\n"));
            }
            g
        }
    })
}

/// A Lark rule (named `name`, helpers pushed to `rules`) for a value of `schema` written in
/// Gemma 4's argument syntax: objects list their required properties in schema order (bare keys),
/// strings are `<|"|>`-quoted without `<` inside, numbers, booleans, null, arrays, enums.
fn gemma4_rule(schema: &Value, name: &str, rules: &mut Vec<String>) -> String {
    let lit = |t: &str| serde_json::to_string(t).unwrap_or_default();
    let q = lit(GQ);
    let body = if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        let alts: Vec<String> = e
            .iter()
            .map(|v| match v {
                Value::String(t) => format!("{q} {} {q}", lit(t)),
                other => lit(&other.to_string()),
            })
            .collect();
        alts.join(" | ")
    } else {
        match schema.get("type").and_then(Value::as_str).unwrap_or("string") {
            "object" => {
                let props = schema.get("properties").and_then(Value::as_object);
                let required: Vec<&str> = schema
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let parts: Vec<String> = required
                    .iter()
                    .enumerate()
                    .map(|(j, k)| {
                        let sub = props.and_then(|p| p.get(*k)).cloned().unwrap_or(json!({}));
                        let r = gemma4_rule(&sub, &format!("{name}_{j}"), rules);
                        format!("{} {r}", lit(&format!("{k}:")))
                    })
                    .collect();
                format!("\"{{\" {} \"}}\"", parts.join(" \",\" "))
            }
            "array" => {
                let item = gemma4_rule(schema.get("items").unwrap_or(&json!({})), &format!("{name}_i"), rules);
                format!("\"[\" ({item} (\",\" {item})*)? \"]\"")
            }
            "integer" => "/-?[0-9]+/".to_string(),
            "number" => "/-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?/".to_string(),
            "boolean" => "\"true\" | \"false\"".to_string(),
            "null" => "\"null\"".to_string(),
            _ => format!("{q} /[^<]*/ {q}"),
        }
    };
    rules.push(format!("{name}: {body}"));
    name.to_string()
}

/// A forced grammar (`start: …` first) that first closes an open reasoning block with `close` and
/// a blank line: for prompts that start the reply inside one, a forced call skips the thinking.
pub fn after_reasoning(grammar: &str, close: &str) -> String {
    let lit = serde_json::to_string(&format!("{close}\n\n")).unwrap_or_default();
    match grammar.strip_prefix("start:") {
        Some(rest) => format!("start: {lit} call_after_reasoning\ncall_after_reasoning:{rest}"),
        None => grammar.to_string(),
    }
}

/// A forced Qwen 3.5 call to one of `chosen` (name, parameters schema), as its template writes one:
/// each property of the schema in order (the required ones always, the others optional), string
/// values as text without `<`, enums as their values, other types as JSON of their schema.
fn qwen_xml_grammar(chosen: &[(String, Value)]) -> String {
    let lit = |t: &str| serde_json::to_string(t).unwrap_or_default();
    let alts: Vec<String> = (0..chosen.len()).map(|i| format!("f{i}")).collect();
    let mut g = format!(
        "start: {} ({}) {}\n",
        lit(&format!("{OPEN}\n")),
        alts.join(" | "),
        lit(&format!("</function>\n{CLOSE}"))
    );
    for (i, (name, p)) in chosen.iter().enumerate() {
        let required: Vec<&str> = p
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut parts = vec![lit(&format!("<function={name}>\n"))];
        let props = p
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for (j, (k, sub)) in props.iter().enumerate() {
            let value = if let Some(e) = sub.get("enum").and_then(Value::as_array) {
                let alts: Vec<String> = e
                    .iter()
                    .map(|v| match v {
                        Value::String(t) => lit(t),
                        other => lit(&other.to_string()),
                    })
                    .collect();
                format!("({})", alts.join(" | "))
            } else if sub.get("type").and_then(Value::as_str) == Some("string") {
                "/[^<]*/".to_string()
            } else {
                format!("%json {sub}")
            };
            g.push_str(&format!(
                "p{i}_{j}: {} {value} {}\n",
                lit(&format!("<parameter={k}>\n")),
                lit("\n</parameter>\n")
            ));
            let opt = if required.contains(&k.as_str()) { "" } else { "?" };
            parts.push(format!("p{i}_{j}{opt}"));
        }
        g.push_str(&format!("f{i}: {}\n", parts.join(" ")));
    }
    g
}

/// One parsed call.
#[derive(Debug, PartialEq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// A call from a JSON object with a string `name` and object `arguments` / `parameters`.
fn call_of(v: &Value) -> Option<Call> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or(json!({}));
    // Some models send the arguments as JSON text.
    let args = match args {
        Value::String(s) => serde_json::from_str::<Value>(&s).ok().filter(Value::is_object)?,
        Value::Object(_) => args,
        _ => return None,
    };
    Some(Call {
        name,
        arguments: args.to_string(),
    })
}

/// Split a reply into text content and tool calls in `format` (a reply that does not hold
/// well-formed calls stays text).
pub fn parse_reply_as(text: &str, format: ToolFormat) -> (String, Vec<Call>) {
    let t = text.trim();
    let whole_text = || (t.to_string(), Vec::new());
    match format {
        ToolFormat::Hermes | ToolFormat::Gemma4 | ToolFormat::QwenXml => parse_tagged(text, format),
        ToolFormat::Llama3 => {
            // One or more objects, separated by whitespace or `;`.
            let body = t.strip_prefix("<|python_tag|>").unwrap_or(t);
            if !body.starts_with('{') {
                return whole_text();
            }
            let mut calls = Vec::new();
            let mut rest = body;
            while !rest.is_empty() {
                let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
                let Some(Ok(v)) = it.next() else { return whole_text() };
                let Some(c) = call_of(&v) else { return whole_text() };
                calls.push(c);
                rest = rest[it.byte_offset()..].trim_start_matches(|c: char| c.is_whitespace() || c == ';');
            }
            (String::new(), calls)
        }
        ToolFormat::MistralList => {
            let (content, body) = match t.find("[TOOL_CALLS]") {
                Some(i) => (t[..i].trim(), t[i + "[TOOL_CALLS]".len()..].trim()),
                None if t.starts_with("[{") => ("", t),
                None => return whole_text(),
            };
            match serde_json::from_str::<Value>(body) {
                Ok(Value::Array(items)) if !items.is_empty() => {
                    let calls: Option<Vec<Call>> = items.iter().map(call_of).collect();
                    match calls {
                        Some(calls) => (content.to_string(), calls),
                        None => whole_text(),
                    }
                }
                _ => whole_text(),
            }
        }
        ToolFormat::MistralArgs => {
            // `name{…}` (with `[TOOL_CALLS]` / `[ARGS]` when rendered), possibly several.
            let (content, mut rest) = match t.find("[TOOL_CALLS]") {
                Some(i) => (t[..i].trim(), &t[i..]),
                None => ("", t),
            };
            let mut calls = Vec::new();
            loop {
                rest = rest.trim_start();
                rest = rest.strip_prefix("[TOOL_CALLS]").unwrap_or(rest);
                if rest.is_empty() {
                    break;
                }
                let name_len = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-' || c == '.'))
                    .unwrap_or(rest.len());
                if name_len == 0 {
                    return whole_text();
                }
                let name = &rest[..name_len];
                let after = rest[name_len..].trim_start();
                let after = after.strip_prefix("[ARGS]").unwrap_or(after);
                let mut it = serde_json::Deserializer::from_str(after).into_iter::<Value>();
                let Some(Ok(args @ Value::Object(_))) = it.next() else {
                    return whole_text();
                };
                calls.push(Call {
                    name: name.to_string(),
                    arguments: args.to_string(),
                });
                rest = &after[it.byte_offset()..];
            }
            if calls.is_empty() {
                return whole_text();
            }
            (content.to_string(), calls)
        }
    }
}

/// Split a Hermes-format reply into text content and tool calls (calls whose JSON does not parse
/// stay text): the streaming parser run over the whole reply.
pub fn parse_reply(text: &str) -> (String, Vec<Call>) {
    parse_tagged(text, ToolFormat::Hermes)
}

/// [`parse_reply`] for a format that wraps each call in tags.
fn parse_tagged(text: &str, format: ToolFormat) -> (String, Vec<Call>) {
    let mut s = ToolStream::new(format, true);
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for p in pieces {
        match p {
            Piece::Text(t) => content.push_str(&t),
            Piece::Call(c) => calls.push(c),
        }
    }
    (content, calls)
}

/// What a streamed reply yields as it goes: text for `content`, or a complete call.
#[derive(Debug, PartialEq)]
pub enum Piece {
    Text(String),
    Call(Call),
}

/// Streams a reply that may hold tool calls: text goes out as soon as it cannot be part of a call,
/// each call as soon as it is complete. Hermes calls are cut out of the text as their closing tag
/// arrives (text around them streams); for the other formats a reply that starts like a call is
/// held to its end and parsed whole, any other reply streams as text. Whitespace-only text is held
/// until more text follows, and leading whitespace is dropped, so the streamed content matches the
/// complete reply's trimmed content.
pub struct ToolStream {
    format: ToolFormat,
    buf: String,
    /// Hermes: inside `<tool_call>`; others: holding a reply that starts like a call.
    holding: bool,
    /// Other formats: whether the reply was recognised as text.
    text_mode: bool,
    started: bool,
    /// Whitespace held back from the end of the text so far.
    ws: String,
    /// `parallel_tool_calls: false`: calls after the first are dropped.
    parallel: bool,
    calls: usize,
}

impl ToolStream {
    pub fn new(format: ToolFormat, parallel: bool) -> ToolStream {
        ToolStream {
            format,
            buf: String::new(),
            holding: false,
            text_mode: false,
            started: false,
            ws: String::new(),
            parallel,
            calls: 0,
        }
    }

    /// Calls emitted so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Text for the content: leading whitespace of the reply dropped, whitespace at the end of a
    /// piece held back until more text follows (and dropped at the end), as the complete reply's
    /// content is trimmed.
    fn text(&mut self, s: &str, out: &mut Vec<Piece>) {
        let s = if self.started { s } else { s.trim_start() };
        let body = s.trim_end();
        if body.is_empty() {
            if self.started {
                self.ws.push_str(s);
            }
            return;
        }
        self.started = true;
        let piece = format!("{}{body}", std::mem::take(&mut self.ws));
        self.ws = s[body.len()..].to_string();
        out.push(Piece::Text(piece));
    }

    fn call(&mut self, c: Call, out: &mut Vec<Piece>) {
        if self.parallel || self.calls == 0 {
            self.calls += 1;
            out.push(Piece::Call(c));
        }
    }

    /// Emit all of `buf` but its last `keep` bytes.
    fn flush_text(&mut self, keep: usize, out: &mut Vec<Piece>) {
        let end = self.buf.len() - keep;
        let s: String = self.buf.drain(..end).collect();
        self.text(&s, out);
    }

    pub fn push(&mut self, s: &str) -> Vec<Piece> {
        self.buf.push_str(s);
        let mut out = Vec::new();
        match self.format {
            f @ (ToolFormat::Hermes | ToolFormat::Gemma4 | ToolFormat::QwenXml) => {
                let (open, close) = f.tags().expect("a tagged format");
                loop {
                    if self.holding {
                        let Some(p) = self.buf.find(close) else { break };
                        let raw = format!("{open}{}{close}", &self.buf[..p]);
                        let call = f.tagged_call(&self.buf[..p]);
                        self.buf.drain(..p + close.len());
                        self.holding = false;
                        match call {
                            Some(c) => self.call(c, &mut out),
                            None => self.text(&raw, &mut out),
                        }
                    } else if let Some(p) = self.buf.find(open) {
                        let before = self.buf[..p].to_string();
                        self.buf.drain(..p + open.len());
                        self.text(&before, &mut out);
                        self.holding = true;
                    } else {
                        // Keep a tail that could still become the opening tag.
                        let keep = (1..open.len())
                            .rev()
                            .find(|&k| {
                                self.buf.len() >= k
                                    && self.buf.is_char_boundary(self.buf.len() - k)
                                    && open.starts_with(&self.buf[self.buf.len() - k..])
                            })
                            .unwrap_or(0);
                        self.flush_text(keep, &mut out);
                        break;
                    }
                }
            }
            _ if self.text_mode => self.flush_text(0, &mut out),
            _ if self.holding => {}
            format => {
                let t = self.buf.trim_start();
                let looks_like_call = match format {
                    ToolFormat::Llama3 => {
                        if t.is_empty() {
                            None
                        } else {
                            Some(t.starts_with('{') || t.starts_with("<|python_tag|>"))
                        }
                    }
                    ToolFormat::MistralList => {
                        if t.is_empty() {
                            None
                        } else {
                            Some(t.starts_with('[') || t.starts_with("[TOOL_CALLS]"))
                        }
                    }
                    _ => {
                        // `name{` or `name[ARGS]`: undecided while only name characters came.
                        let t = t.strip_prefix("[TOOL_CALLS]").unwrap_or(t);
                        match t.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-' || c == '.')) {
                            None => None,
                            Some(0) => Some(t.starts_with("[TOOL_CALLS]")),
                            Some(k) => Some(t[k..].starts_with('{') || t[k..].starts_with("[ARGS]")),
                        }
                    }
                };
                match looks_like_call {
                    None => {}
                    Some(true) => self.holding = true,
                    Some(false) => {
                        self.text_mode = true;
                        self.flush_text(0, &mut out);
                    }
                }
            }
        }
        out
    }

    /// The end of the reply: what is left, as text or calls.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match self.format {
            f @ (ToolFormat::Hermes | ToolFormat::Gemma4 | ToolFormat::QwenXml) if self.holding => {
                // An unterminated call stays text, as in the complete reply.
                let open = f.tags().expect("a tagged format").0;
                self.text(&format!("{open}{rest}"), &mut out);
            }
            ToolFormat::Hermes | ToolFormat::Gemma4 | ToolFormat::QwenXml => self.text(&rest, &mut out),
            format if self.holding || !self.text_mode => {
                let (content, calls) = parse_reply_as(&rest, format);
                self.text(&content, &mut out);
                for c in calls {
                    self.call(c, &mut out);
                }
            }
            _ => self.text(&rest, &mut out),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma4_calls_parse_stream_and_force() {
        use ToolFormat::Gemma4;
        let tpl = "{%- if tools %}<|tool>{% endif %}{{- '<|tool_call>call:' + function['name'] + '{' -}}";
        assert_eq!(ToolFormat::of_template(tpl), Some(Gemma4));
        let reply = "Checking.<|tool_call>call:get_weather{city:<|\"|>Paris, FR<|\"|>,days:3,units:[<|\"|>c<|\"|>],opts:{hourly:true,x:null}}<tool_call|>";
        let (c, calls) = parse_reply_as(reply, Gemma4);
        assert_eq!(c, "Checking.");
        assert_eq!(
            names_args(&calls),
            vec![(
                "get_weather",
                r#"{"city":"Paris, FR","days":3,"units":["c"],"opts":{"hourly":true,"x":null}}"#
            )]
        );
        // Two calls, and a malformed one that stays text.
        let two = "<|tool_call>call:a{}<tool_call|><|tool_call>call:b{n:-1.5}<tool_call|>";
        assert_eq!(
            names_args(&parse_reply_as(two, Gemma4).1),
            vec![("a", "{}"), ("b", r#"{"n":-1.5}"#)]
        );
        let bad = "<|tool_call>call:a{x:<|\"|>open}<tool_call|>";
        let (c, calls) = parse_reply_as(bad, Gemma4);
        assert!(calls.is_empty());
        assert_eq!(c, bad);
        // Streamed a few bytes at a time: text before the call, then the call when it closes.
        let mut st = ToolStream::new(Gemma4, true);
        let mut pieces = Vec::new();
        for ch in reply.as_bytes().chunks(3) {
            pieces.extend(st.push(std::str::from_utf8(ch).unwrap_or("")));
        }
        pieces.extend(st.finish());
        let calls: Vec<&Piece> = pieces.iter().filter(|p| matches!(p, Piece::Call(_))).collect();
        assert_eq!(calls.len(), 1, "{pieces:?}");
        let text: String = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text, "Checking.");
        // The forced grammar is valid Lark and names the tool with its required arguments.
        let req = ToolRequest {
            tools: json!([]),
            names: vec!["get_weather".into()],
            forced: Some(None),
            schemas: vec![(
                "get_weather".into(),
                json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                       "unit": {"enum": ["c", "f"]}}, "required": ["city", "days", "unit"]}),
            )],
            parallel: true,
        };
        let g = forced_grammar(&req, Gemma4).unwrap();
        assert!(
            g.starts_with("start: (\"<|tool_call>call:get_weather\" a0) \"<tool_call|>\""),
            "{g}"
        );
        assert!(
            g.contains("a0: \"{\" \"city:\" a0_0 \",\" \"days:\" a0_1 \",\" \"unit:\" a0_2 \"}\""),
            "{g}"
        );
        let tok = std::sync::Arc::new(
            engine::tokenizer::Tokenizer::from_gguf(&gguf_tokenizer_meta()).expect("a small tokenizer"),
        );
        let f = engine::grammar::GrammarFactory::new(tok).unwrap();
        assert!(f.lark(&g).is_ok(), "{g}");
    }

    #[test]
    fn qwen_xml_calls_parse_stream_and_force() {
        use ToolFormat::QwenXml;
        let tpl = "{%- if tools %}{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + k + '>\\n' }}{% endif %}";
        assert_eq!(ToolFormat::of_template(tpl), Some(QwenXml));
        let reply = "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, FR\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"hourly\": true}\n</parameter>\n<parameter=note>\ntwo\nlines\n</parameter>\n</function>\n</tool_call>";
        let (c, calls) = parse_reply_as(reply, QwenXml);
        assert_eq!(c.trim(), "Let me check.");
        assert_eq!(
            names_args(&calls),
            vec![(
                "get_weather",
                r#"{"city":"Paris, FR","days":3,"opts":{"hourly":true},"note":"two\nlines"}"#
            )]
        );
        // Two calls; one without its closing function tag stays text.
        let two = "<tool_call>\n<function=a>\n</function>\n</tool_call>\n<tool_call>\n<function=b>\n<parameter=n>\n-1.5\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(
            names_args(&parse_reply_as(two, QwenXml).1),
            vec![("a", "{}"), ("b", r#"{"n":-1.5}"#)]
        );
        let bad = "<tool_call>\n<function=a>\n<parameter=x>\n1\n</parameter>\n</tool_call>";
        assert!(parse_reply_as(bad, QwenXml).1.is_empty());
        // Streamed a few bytes at a time: the text, then the call when it closes.
        let mut st = ToolStream::new(QwenXml, true);
        let mut pieces = Vec::new();
        for ch in reply.as_bytes().chunks(3) {
            pieces.extend(st.push(std::str::from_utf8(ch).unwrap_or("")));
        }
        pieces.extend(st.finish());
        assert_eq!(
            pieces.iter().filter(|p| matches!(p, Piece::Call(_))).count(),
            1,
            "{pieces:?}"
        );
        // The forced grammar is valid Lark: the function, its parameters in schema order (the
        // optional one optional), and after an open reasoning block its closing first.
        let req = ToolRequest {
            tools: json!([]),
            names: vec!["get_weather".into()],
            forced: Some(None),
            schemas: vec![(
                "get_weather".into(),
                json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                       "unit": {"enum": ["c", "f"]}}, "required": ["city", "days"]}),
            )],
            parallel: true,
        };
        let g = forced_grammar(&req, QwenXml).unwrap();
        assert!(g.contains("f0: \"<function=get_weather>\\n\" p0_0 p0_1 p0_2?"), "{g}");
        assert!(g.contains("p0_2: \"<parameter=unit>\\n\" (\"c\" | \"f\")"), "{g}");
        let thinking = after_reasoning(&g, "</think>");
        assert!(
            thinking.starts_with("start: \"</think>\\n\\n\" call_after_reasoning\n"),
            "{thinking}"
        );
        let tok = std::sync::Arc::new(
            engine::tokenizer::Tokenizer::from_gguf(&gguf_tokenizer_meta()).expect("a small tokenizer"),
        );
        let f = engine::grammar::GrammarFactory::new(tok).unwrap();
        assert!(f.lark(&g).is_ok(), "{g}");
        assert!(f.lark(&thinking).is_ok(), "{thinking}");
    }

    /// The metadata of a tiny byte-level tokenizer (every byte a token) for grammar checks.
    fn gguf_tokenizer_meta() -> gguf::Metadata {
        use gguf::Value as V;
        let mut m = gguf::Metadata::new();
        m.insert("tokenizer.ggml.model", V::String("gpt2".into()));
        let bytes: Vec<String> = (0u8..=255).map(|b| byte_char(b).to_string()).collect();
        let mut toks = gguf::StrArray::new();
        for t in &bytes {
            toks.push(t);
        }
        toks.push("<eos>");
        m.insert("tokenizer.ggml.tokens", V::Array(gguf::Array::String(toks)));
        m.insert(
            "tokenizer.ggml.merges",
            V::Array(gguf::Array::String(gguf::StrArray::new())),
        );
        m.insert("tokenizer.ggml.eos_token_id", V::U32(256));
        m
    }

    /// GPT-2's byte-to-character map.
    fn byte_char(b: u8) -> char {
        let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        if printable(b) {
            return b as char;
        }
        let mut n = 0u32;
        for x in 0u8..b {
            if !printable(x) {
                n += 1;
            }
        }
        char::from_u32(256 + n).unwrap()
    }

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

    fn names_args(calls: &[Call]) -> Vec<(&str, &str)> {
        calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect()
    }

    #[test]
    fn llama3_json_calls() {
        use ToolFormat::Llama3;
        let (c, calls) = parse_reply_as(r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#, Llama3);
        assert_eq!(
            (c.as_str(), names_args(&calls)),
            ("", vec![("get_weather", r#"{"city":"Paris"}"#)])
        );
        let (_, calls) = parse_reply_as(
            r#"<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": "{\"x\": 1}"}"#,
            Llama3,
        );
        assert_eq!(names_args(&calls), vec![("a", "{}"), ("b", r#"{"x":1}"#)]);
        for text in [
            "The weather is fine.",
            r#"{"city": "Paris"}"#,
            r#"{"name": "a", "parameters": {}} trailing"#,
        ] {
            let (c, calls) = parse_reply_as(text, Llama3);
            assert!(calls.is_empty() && c == text, "{text}");
        }
    }

    #[test]
    fn mistral_calls() {
        use ToolFormat::{MistralArgs, MistralList};
        let (c, calls) = parse_reply_as(
            r#"[{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123def"}]"#,
            MistralList,
        );
        assert_eq!(
            (c.as_str(), names_args(&calls)),
            ("", vec![("get_weather", r#"{"city":"Paris"}"#)])
        );
        let (c, calls) = parse_reply_as(r#"Sure. [TOOL_CALLS][{"name": "f", "arguments": {}}]"#, MistralList);
        assert_eq!((c.as_str(), names_args(&calls)), ("Sure.", vec![("f", "{}")]));
        let (c, calls) = parse_reply_as("[1, 2]", MistralList);
        assert!(calls.is_empty() && c == "[1, 2]");

        let (c, calls) = parse_reply_as(r#"get_weather{"city": "Paris"}"#, MistralArgs);
        assert_eq!(
            (c.as_str(), names_args(&calls)),
            ("", vec![("get_weather", r#"{"city":"Paris"}"#)])
        );
        let (_, calls) = parse_reply_as(r#"[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{}"#, MistralArgs);
        assert_eq!(names_args(&calls), vec![("a", r#"{"x":1}"#), ("b", "{}")]);
        let (c, calls) = parse_reply_as("Hello there.", MistralArgs);
        assert!(calls.is_empty() && c == "Hello there.");
    }

    #[test]
    fn call_arguments_become_objects_for_templates() {
        let mut m = ChatMessage::new("assistant", "");
        m.extra.insert(
            "tool_calls".into(),
            json!([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
                   {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}}]),
        );
        let mut msgs = vec![m];
        arguments_as_objects(&mut msgs);
        let calls = &msgs[0].extra["tool_calls"];
        assert_eq!(calls[0]["function"]["arguments"], json!({"x": 1}));
        assert_eq!(calls[1]["function"]["arguments"], "not json");
    }

    /// Feed `reply` in pieces of `step` bytes (on char boundaries) and collect what comes out.
    fn stream(format: ToolFormat, reply: &str, step: usize) -> (String, Vec<(String, String)>) {
        let mut s = ToolStream::new(format, true);
        let mut out = Vec::new();
        let chars: Vec<char> = reply.chars().collect();
        for chunk in chars.chunks(step) {
            out.extend(s.push(&chunk.iter().collect::<String>()));
        }
        out.extend(s.finish());
        let mut text = String::new();
        let mut calls = Vec::new();
        for p in out {
            match p {
                Piece::Text(t) => text.push_str(&t),
                Piece::Call(c) => calls.push((c.name, c.arguments)),
            }
        }
        (text, calls)
    }

    #[test]
    fn streamed_calls_equal_the_complete_reply() {
        use ToolFormat::*;
        let cases = [
            (Hermes, "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"),
            (Hermes, "  Plain answer with a < sign and <tool not a call."),
            (Hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>"),
            (Hermes, "<tool_call>broken</tool_call> then text"),
            (Hermes, "text <tool_call>{\"name\": \"unterminated\""),
            (Llama3, "{\"name\": \"f\", \"parameters\": {\"x\": 1}}"),
            (Llama3, "The answer is 4."),
            (Llama3, "{\"not\": \"a call\"}"),
            (MistralList, "[{\"name\": \"f\", \"arguments\": {}}]"),
            (MistralList, "Sure, here it is."),
            (MistralArgs, "get_weather{\"city\": \"Paris\"}"),
            (MistralArgs, "Hello there, friend."),
            (MistralArgs, "word"),
        ];
        for (format, reply) in cases {
            let (content, calls) = parse_reply_as(reply, format);
            let want = (
                content,
                calls.into_iter().map(|c| (c.name, c.arguments)).collect::<Vec<_>>(),
            );
            for step in [1, 2, 3, 7, 1000] {
                assert_eq!(stream(format, reply, step), want, "{format:?} {reply:?} step {step}");
            }
        }
        // Text before a Hermes call goes out before the call is complete.
        let mut s = ToolStream::new(Hermes, true);
        assert_eq!(s.push("Checking now. "), vec![Piece::Text("Checking now.".into())]);
        assert!(s.push("\n").is_empty());
        assert!(s.push("<tool_c").is_empty());
        assert!(s.push("all>{\"name\": \"f\", ").is_empty());
        let out = s.push("\"arguments\": {}}</tool_call>");
        assert!(matches!(&out[..], [Piece::Call(c)] if c.name == "f"), "{out:?}");
        // parallel_tool_calls false: one call only.
        let mut s = ToolStream::new(Hermes, false);
        let out = s.push("<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>");
        assert_eq!(out.len(), 1);
        assert_eq!(s.calls(), 1);
    }

    #[test]
    fn object_schemas_are_closed_unless_they_say_otherwise() {
        let s = json!({"type": "object", "properties": {
            "city": {"type": "string"},
            "type": {"type": ["object", "null"], "properties": {"a": {"type": "integer"}}},
            "open": {"type": "object", "additionalProperties": true},
            "list": {"type": "array", "items": {"type": "object"}}}});
        let c = closed_objects(&s);
        assert_eq!(c["additionalProperties"], false);
        assert_eq!(c["properties"]["type"]["additionalProperties"], false);
        assert_eq!(c["properties"]["open"]["additionalProperties"], true);
        assert_eq!(c["properties"]["list"]["items"]["additionalProperties"], false);
        // Not schemas of objects: the properties map itself and non-object schemas.
        assert!(c["properties"].get("additionalProperties").is_none());
        assert!(c["properties"]["city"].get("additionalProperties").is_none());
    }

    #[test]
    fn formats_are_recognised_from_templates() {
        use ToolFormat::*;
        let f = ToolFormat::of_template;
        assert_eq!(f("{% for tool in tools %}<tool_call>{% endfor %}"), Some(Hermes));
        assert_eq!(f("{% if tools %}<|python_tag|>{% endif %}"), Some(Llama3));
        assert_eq!(
            f("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"),
            Some(MistralList)
        );
        assert_eq!(
            f("{% if tools %}{% endif %}[TOOL_CALLS]{{ name }}[ARGS]"),
            Some(MistralArgs)
        );
        assert_eq!(f("{{ messages }}"), None);
    }
}
