//! Chat templates: the model's own Jinja template (`tokenizer.chat_template`) rendered with
//! minijinja the way transformers' `apply_chat_template` renders it with jinja2
//! (transformers/utils/chat_template_utils.py): `trim_blocks` and `lstrip_blocks` on, loop
//! controls, Python string/dict methods (minijinja-contrib `pycompat`), `raise_exception`,
//! `strftime_now`, and a `tojson` that writes what Python's `json.dumps` writes.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;
use serde_json::{Map, Value as J};

/// Chat templates known by name (`--chat-template NAME`).
pub mod builtin;

const TEMPLATE_NAME: &str = "chat_template";

#[derive(thiserror::Error, Debug)]
pub enum ChatError {
    #[error("GGUF metadata `tokenizer.chat_template` should be a string, found {0}")]
    BadType(String),
    #[error("chat template does not compile{}: {message}", at_line(*.line))]
    Syntax { line: Option<usize>, message: String },
    #[error("chat template failed{}: {message}", at_line(*.line))]
    Render { line: Option<usize>, message: String },
    #[error("chat template raised an exception{}: {message}", at_line(*.line))]
    Raised { line: Option<usize>, message: String },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" at line {l}")).unwrap_or_default()
}

/// One message of a conversation, as the OpenAI API and HF templates see it.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    /// A string, or a list of content parts (`{"type": "text", "text": ..}`), or null.
    pub content: J,
    /// Everything else the template may read: `tool_calls`, `tool_call_id`, `name`,
    /// `reasoning_content`, ...
    pub extra: Map<String, J>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: J::String(content.into()),
            extra: Map::new(),
        }
    }
}

impl Serialize for ChatMessage {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(2 + self.extra.len()))?;
        m.serialize_entry("role", &self.role)?;
        m.serialize_entry("content", &self.content)?;
        for (k, v) in &self.extra {
            if k != "role" && k != "content" {
                m.serialize_entry(k, v)?;
            }
        }
        m.end()
    }
}

/// A compiled chat template with the BOS / EOS texts it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The template of a GGUF model, or `None` when the file has none.
    pub fn from_gguf(
        meta: &gguf::Metadata,
        tok: &crate::tokenizer::Tokenizer,
    ) -> Result<Option<ChatTemplate>, ChatError> {
        let Some(v) = meta.get("tokenizer.chat_template") else {
            return Ok(None);
        };
        let source = v.as_str().ok_or_else(|| ChatError::BadType(v.type_string()))?;
        let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or("").to_string();
        ChatTemplate::new(source, &text(tok.bos()), &text(tok.eos())).map(Some)
    }

    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        let source_owned = source.to_string();
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| ChatError::Syntax {
                line: e.line(),
                message: detail(&e),
            })?;
        Ok(ChatTemplate {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
            source: source_owned,
        })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The prompt text for `messages`. `tools` is the OpenAI `tools` array; `kwargs` become
    /// template variables too (e.g. `enable_thinking`).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&J>,
        add_generation_prompt: bool,
        kwargs: &Map<String, J>,
    ) -> Result<String, ChatError> {
        let mut ctx = Map::new();
        for (k, v) in kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        ctx.insert(
            "messages".into(),
            serde_json::to_value(messages).expect("messages serialise"),
        );
        ctx.insert("tools".into(), tools.cloned().unwrap_or(J::Null));
        ctx.insert("add_generation_prompt".into(), J::Bool(add_generation_prompt));
        ctx.insert("bos_token".into(), J::String(self.bos.clone()));
        ctx.insert("eos_token".into(), J::String(self.eos.clone()));
        let tmpl = self.env.get_template(TEMPLATE_NAME).expect("added in new()");
        tmpl.render(Value::from_serialize(&ctx)).map_err(|e| {
            let message = detail(&e);
            let line = e.line();
            if e.kind() == ErrorKind::InvalidOperation && message.starts_with(RAISED) {
                ChatError::Raised {
                    line,
                    message: message[RAISED.len()..].to_string(),
                }
            } else {
                ChatError::Render { line, message }
            }
        })
    }
}

const RAISED: &str = "raise_exception: ";

/// The error's own words and those of its causes, without minijinja's source dump.
fn detail(e: &Error) -> String {
    let mut s = match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    };
    if e.kind() == ErrorKind::InvalidOperation {
        if let Some(d) = e.detail() {
            s = d.to_string();
        }
    }
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        s.push_str(&format!(" (caused by: {c})"));
        cause = c.source();
    }
    s
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, format!("{RAISED}{message}")))
}

/// The current UTC time formatted with a strftime pattern (the common specifiers).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(secs, &format)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `secs` since the Unix epoch (UTC) formatted like Python's `strftime`.
pub fn strftime(secs: i64, format: &str) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, mi, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let is_leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let before: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = before[(m - 1) as usize] + d + i64::from(is_leap && m > 2);
    let month = MONTHS[(m - 1) as usize];
    let day = DAYS[weekday];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('-') => match chars.next() {
                Some('d') => out.push_str(&d.to_string()),
                Some('m') => out.push_str(&m.to_string()),
                Some(o) => {
                    out.push_str("%-");
                    out.push(o);
                }
                None => out.push_str("%-"),
            },
            Some('B') => out.push_str(month),
            Some('b') | Some('h') => out.push_str(&month[..3]),
            Some('A') => out.push_str(day),
            Some('a') => out.push_str(&day[..3]),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('I') => out.push_str(&format!("{:02}", if h % 12 == 0 { 12 } else { h % 12 })),
            Some('p') => out.push_str(if h < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mi:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('F') => out.push_str(&format!("{y}-{m:02}-{d:02}")),
            Some('T') => out.push_str(&format!("{h:02}:{mi:02}:{s:02}")),
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)` (Python's default separators, no HTML escaping).
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(usize::try_from(v).unwrap_or(0)),
        }),
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let a = v.get_item(&Value::from(0))?;
            let b = v.get_item(&Value::from(1))?;
            (
                a.as_str().unwrap_or(",").to_string(),
                b.as_str().unwrap_or(":").to_string(),
            )
        }
        _ => (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string()),
    };
    let json =
        serde_json::to_value(&value).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    let opts = PyJson {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    opts.write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

struct PyJson {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl PyJson {
    fn newline(&self, level: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && (c as u32) > 0x7e) => {
                    let mut buf = [0u16; 2];
                    for u in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }

    fn write(&self, v: &J, level: usize, out: &mut String) {
        match v {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Number(n) => match n.as_f64() {
                Some(f) if n.is_f64() => out.push_str(&py_float(f)),
                _ => out.push_str(&n.to_string()),
            },
            J::String(s) => self.string(s, out),
            J::Array(a) => {
                if a.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(level + 1, out);
                    self.write(x, level + 1, out);
                }
                self.newline(level, out);
                out.push(']');
            }
            J::Object(m) => {
                if m.is_empty() {
                    out.push_str("{}");
                    return;
                }
                let mut entries: Vec<(&String, &J)> = m.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, x)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(level + 1, out);
                    self.string(k, out);
                    out.push_str(&self.key_sep);
                    self.write(x, level + 1, out);
                }
                self.newline(level, out);
                out.push('}');
            }
        }
    }
}

/// Python's `repr(float)`: shortest round-trip digits, always with a `.0` or exponent.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let s = format!("{f:?}");
    // Rust prints 1e20 as "1e20" and 1e-7 as "1e-7"; Python as "1e+20" and "1e-07".
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s,
    }
}
