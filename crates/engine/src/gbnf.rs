//! llama.cpp's GBNF grammars (the `grammar` field llama-server takes; syntax of
//! `grammars/README.md` there) translated into the Lark dialect llguidance reads, so that a
//! GBNF-constrained request is enforced by the same engine as JSON schemas and tool calls.
//!
//! Rules `name ::= body` become `name: body` (dashes in names become underscores, `root` becomes
//! `start`); string literals are re-escaped as JSON strings; character classes and `.` become
//! regular expressions; groups, alternatives and the repetitions `* + ? {m} {m,} {m,n}` carry over.

/// Translate a GBNF grammar; the error says where it is malformed.
pub fn to_lark(src: &str) -> Result<String, String> {
    let mut p = Parser {
        s: src.as_bytes(),
        i: 0,
        src,
    };
    let mut rules = Vec::new();
    loop {
        p.skip(true);
        if p.i >= p.s.len() {
            break;
        }
        let name = p.name().ok_or_else(|| p.err("a rule name"))?;
        p.skip(false);
        if !p.eat("::=") {
            return Err(p.err("`::=`"));
        }
        let body = p.alternatives(false)?;
        rules.push(format!("{}: {body}", rule_name(&name)));
    }
    if !rules.iter().any(|r| r.starts_with("start:")) {
        return Err("the grammar has no `root` rule".into());
    }
    Ok(rules.join("\n"))
}

fn rule_name(n: &str) -> String {
    if n == "root" {
        return "start".into();
    }
    // Lark rule names are lowercase identifiers; keep them apart from translated ones.
    let mut out = String::from("g_");
    for c in n.chars() {
        out.push(if c == '-' { '_' } else { c.to_ascii_lowercase() });
    }
    out
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    src: &'a str,
}

impl Parser<'_> {
    fn err(&self, want: &str) -> String {
        let line = self.src[..self.i.min(self.src.len())].matches('\n').count() + 1;
        format!("GBNF line {line}: expected {want}")
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    /// Skip spaces and comments; newlines too when `newlines` (between rules, or inside groups).
    fn skip(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' | b'\r' => self.i += 1,
                b'\n' if newlines => self.i += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.i += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn eat(&mut self, t: &str) -> bool {
        if self.s[self.i..].starts_with(t.as_bytes()) {
            self.i += t.len();
            true
        } else {
            false
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.i;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        {
            self.i += 1;
        }
        (self.i > start).then(|| self.src[start..self.i].to_string())
    }

    /// Whether a new rule (`name ::=`) starts at the current position.
    fn at_rule_start(&self) -> bool {
        let mut j = self.i;
        while j < self.s.len() && (self.s[j].is_ascii_alphanumeric() || self.s[j] == b'-' || self.s[j] == b'_') {
            j += 1;
        }
        if j == self.i {
            return false;
        }
        while j < self.s.len() && (self.s[j] == b' ' || self.s[j] == b'\t') {
            j += 1;
        }
        self.s[j..].starts_with(b"::=")
    }

    /// `seq | seq | …`; outside groups a rule ends at a line that starts the next rule.
    fn alternatives(&mut self, nested: bool) -> Result<String, String> {
        let mut alts = vec![self.sequence(nested)?];
        loop {
            self.skip(nested);
            if self.eat("|") {
                alts.push(self.sequence(nested)?);
            } else {
                break;
            }
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self, nested: bool) -> Result<String, String> {
        let mut items = Vec::new();
        loop {
            // Outside a group a newline ends the rule when the next line starts another rule
            // (or the grammar ends); otherwise the rule goes on there (llama.cpp is stricter:
            // it continues only inside parentheses).
            self.skip(nested);
            if !nested && self.peek() == Some(b'\n') {
                self.skip(true);
                if self.peek().is_none() || self.at_rule_start() {
                    break;
                }
            }
            let Some(c) = self.peek() else { break };
            let item = match c {
                b'"' => self.literal()?,
                b'[' => self.class()?,
                b'.' => {
                    self.i += 1;
                    "/(?s:.)/".to_string()
                }
                b'(' => {
                    self.i += 1;
                    let inner = self.alternatives(true)?;
                    self.skip(true);
                    if !self.eat(")") {
                        return Err(self.err("`)`"));
                    }
                    format!("({inner})")
                }
                c if c.is_ascii_alphanumeric() || c == b'-' || c == b'_' => {
                    if self.at_rule_start() {
                        break;
                    }
                    rule_name(&self.name().ok_or_else(|| self.err("a rule name"))?)
                }
                _ => break,
            };
            items.push(item + &self.repetition()?);
        }
        if items.is_empty() {
            // An empty alternative matches the empty string.
            return Ok("\"\"".into());
        }
        Ok(items.join(" "))
    }

    fn repetition(&mut self) -> Result<String, String> {
        Ok(match self.peek() {
            Some(b'*') | Some(b'+') | Some(b'?') => {
                self.i += 1;
                (self.s[self.i - 1] as char).to_string()
            }
            Some(b'{') => {
                let start = self.i;
                while self.peek().is_some_and(|c| c != b'}') {
                    self.i += 1;
                }
                if !self.eat("}") {
                    return Err(self.err("`}`"));
                }
                let inner = self.src[start + 1..self.i - 1].replace(' ', "");
                let ok = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
                let valid = match inner.split_once(',') {
                    None => !inner.is_empty() && ok(&inner),
                    Some((a, b)) => !a.is_empty() && ok(a) && ok(b),
                };
                if !valid {
                    return Err(self.err("a repetition {m}, {m,} or {m,n}"));
                }
                format!("{{{inner}}}")
            }
            _ => String::new(),
        })
    }

    /// One escaped character after `\`, as a char.
    fn escape(&mut self) -> Result<char, String> {
        let c = self.peek().ok_or_else(|| self.err("an escape"))?;
        self.i += 1;
        let hex = |p: &mut Self, n: usize| -> Result<char, String> {
            let h = p.src.get(p.i..p.i + n).ok_or_else(|| p.err("hex digits"))?;
            let v = u32::from_str_radix(h, 16).map_err(|_| p.err("hex digits"))?;
            p.i += n;
            char::from_u32(v).ok_or_else(|| p.err("a valid code point"))
        };
        Ok(match c {
            b'n' => '\n',
            b't' => '\t',
            b'r' => '\r',
            b'x' => hex(self, 2)?,
            b'u' => hex(self, 4)?,
            b'U' => hex(self, 8)?,
            b'\\' | b'"' | b'[' | b']' | b'-' | b'^' => c as char,
            _ => {
                return Err(self.err("a known escape (\\n \\t \\r \\xHH \\uHHHH \\UHHHHHHHH \\\\ \\\" \\[ \\] \\- \\^)"))
            }
        })
    }

    /// The next character of a literal or class ending at `close`: `None` at the closing byte
    /// (consumed), `Some((char, escaped))` otherwise.
    fn next_char(&mut self, close: u8, what: &str) -> Result<Option<(char, bool)>, String> {
        match self.peek() {
            None => Err(self.err(what)),
            Some(c) if c == close => {
                self.i += 1;
                Ok(None)
            }
            Some(b'\\') => {
                self.i += 1;
                Ok(Some((self.escape()?, true)))
            }
            Some(_) => {
                let ch = self.src[self.i..]
                    .chars()
                    .next()
                    .ok_or_else(|| self.err("a character"))?;
                self.i += ch.len_utf8();
                Ok(Some((ch, false)))
            }
        }
    }

    fn literal(&mut self) -> Result<String, String> {
        self.i += 1;
        let mut text = String::new();
        while let Some((ch, _)) = self.next_char(b'"', "the closing `\"`")? {
            text.push(ch);
        }
        Ok(serde_json::to_string(&text).unwrap_or_default())
    }

    fn class(&mut self) -> Result<String, String> {
        self.i += 1;
        let mut out = String::from("[");
        if self.eat("^") {
            out.push('^');
        }
        while let Some((ch, escaped)) = self.next_char(b']', "the closing `]`")? {
            if ch == '-' && !escaped {
                out.push('-');
                continue;
            }
            // Inside a Rust regex class: escape what is special there, and `/` for Lark.
            match ch {
                '\\' | ']' | '[' | '^' | '-' | '&' | '~' | '/' => {
                    out.push('\\');
                    out.push(ch);
                }
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\x{{{:x}}}", c as u32)),
                c => out.push(c),
            }
        }
        out.push(']');
        Ok(format!("/{out}/"))
    }
}

#[cfg(test)]
mod tests {
    use super::to_lark;

    #[test]
    fn translates_rules_literals_classes_and_repetitions() {
        let g = "# yes or no\nroot ::= answer \" \"? [0-9]{1,3}\nanswer ::= (\"yes\" | \"no\")\n  | \"maybe\\n\"\n";
        let l = to_lark(g).unwrap();
        assert_eq!(
            l,
            "start: g_answer \" \"? /[0-9]/{1,3}\ng_answer: (\"yes\" | \"no\") | \"maybe\\n\""
        );
        let l = to_lark("root ::= [^\"\\\\] json-value\njson-value ::= . | \"\\x41\"").unwrap();
        assert_eq!(l, "start: /[^\"\\\\]/ g_json_value\ng_json_value: /(?s:.)/ | \"A\"");
    }

    #[test]
    fn malformed_grammars_say_where() {
        assert!(to_lark("root ::= \"open").unwrap_err().contains("line 1"));
        assert!(to_lark("root = \"x\"").unwrap_err().contains("::="));
        assert!(to_lark("other ::= \"x\"").unwrap_err().contains("root"));
        assert!(to_lark("root ::= (\"a\"\n\n").unwrap_err().contains(")"));
        assert!(to_lark("root ::= \"a\"{x}").unwrap_err().contains("repetition"));
    }
}
