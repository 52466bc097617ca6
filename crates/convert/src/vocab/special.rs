//! Special token ids, add-BOS/EOS flags, merges and the chat template, read the way gguf-py's
//! `SpecialVocab` reads them (`gguf-py/gguf/vocab.py`): `tokenizer.json` (merges, normalizer,
//! post-processor), `tokenizer_config.json` (token strings, add_*_token, chat_template),
//! `chat_template.jinja`/`.json`, then `config.json` ids.

use gguf::{Array, Metadata, Value};
use indexmap::IndexMap;
use serde_json::{Map, Value as J};
use std::path::Path;

pub const DEFAULT_TYPES: &[&str] = &["bos", "eos", "unk", "sep", "pad", "cls", "mask"];

#[derive(Debug, Default)]
pub struct SpecialVocab {
    pub merges: Vec<String>,
    /// In insertion order (the order keys are written).
    pub special_token_ids: IndexMap<String, u32>,
    pub add_special_token: IndexMap<String, bool>,
    pub chat_template: Option<String>,
    pub normalizer_lowercase: Option<bool>,
    pub normalizer_strip_accents: Option<bool>,
    types: Vec<String>,
    n_vocab: Option<usize>,
}

fn read_json(path: &Path) -> Option<J> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn special_id_of(tc: &J) -> Option<String> {
    match tc {
        J::String(s) => Some(s.clone()),
        J::Object(o) => o.get("content").and_then(J::as_str).map(String::from),
        _ => None,
    }
}

fn str_field(o: &Option<Map<String, J>>, key: &str) -> Option<String> {
    o.as_ref()?
        .get(key)
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .map(String::from)
}

impl SpecialVocab {
    pub fn load(dir: &Path, load_merges: bool, types: Option<&[&str]>, n_vocab: Option<usize>) -> SpecialVocab {
        let mut sv = SpecialVocab {
            types: types.unwrap_or(DEFAULT_TYPES).iter().map(|s| s.to_string()).collect(),
            n_vocab,
            ..Default::default()
        };
        sv.load_tokenizer_json(dir, load_merges);
        sv.load_config_json(dir);
        if load_merges && sv.merges.is_empty() {
            sv.load_merges_txt(dir);
        }
        sv
    }

    fn set_special(&mut self, typ: &str, id: Option<i64>) {
        let Some(id) = id.filter(|&i| i >= 0) else { return };
        if self.n_vocab.is_none_or(|n| (id as usize) < n) && !self.special_token_ids.contains_key(typ) {
            self.special_token_ids.insert(typ.to_string(), id as u32);
        }
    }

    fn parse_normalizer(&mut self, n: &J) {
        match n.get("type").and_then(J::as_str) {
            Some("Lowercase") => self.normalizer_lowercase = Some(true),
            Some("StripAccents") => self.normalizer_strip_accents = Some(true),
            Some("BertNormalizer") => {
                if let Some(b) = n.get("lowercase").and_then(J::as_bool) {
                    self.normalizer_lowercase = Some(b);
                }
                if let Some(b) = n.get("strip_accents").and_then(J::as_bool) {
                    self.normalizer_strip_accents = Some(b);
                }
            }
            Some("Sequence") => {
                for m in n.get("normalizers").and_then(J::as_array).into_iter().flatten() {
                    self.parse_normalizer(m);
                }
            }
            _ => {}
        }
    }

    // vocab.py: SpecialVocab._try_load_load_tokenizer_json
    fn load_tokenizer_json(&mut self, dir: &Path, load_merges: bool) {
        let tokenizer = read_json(&dir.join("tokenizer.json"));
        let mut added_tokens: Vec<J> = Vec::new();
        if let Some(t) = &tokenizer {
            if load_merges {
                if let Some(merges) = t
                    .pointer("/model/merges")
                    .and_then(J::as_array)
                    .filter(|m| !m.is_empty())
                {
                    if merges[0].is_string() {
                        self.merges = merges.iter().filter_map(|m| m.as_str().map(String::from)).collect();
                    } else {
                        // [a, b] pairs: spaces inside a part are encoded as U+0120 (' ' + 256)
                        self.merges = merges
                            .iter()
                            .filter_map(|p| p.as_array())
                            .map(|pair| {
                                pair.iter()
                                    .filter_map(|s| s.as_str())
                                    .map(|s| {
                                        s.chars()
                                            .map(|c| if c == ' ' { '\u{120}' } else { c })
                                            .collect::<String>()
                                    })
                                    .collect::<Vec<_>>()
                                    .join(" ")
                            })
                            .collect();
                    }
                }
            }
            if let Some(n) = t.get("normalizer").filter(|n| !n.is_null()) {
                self.parse_normalizer(&n.clone());
            }
            added_tokens = t.get("added_tokens").and_then(J::as_array).cloned().unwrap_or_default();
        }
        let mut tc: Option<Map<String, J>> = read_json(&dir.join("tokenizer_config.json")).and_then(|j| match j {
            J::Object(o) => Some(o),
            _ => None,
        });
        if let Some(t) = &tokenizer {
            let mut special_bos =
                str_field(&tc, "bos_token").or_else(|| tc.as_ref()?.get("bos_token").and_then(special_id_of));
            let mut special_cls = str_field(&tc, "cls_token");
            let mut special_eos =
                str_field(&tc, "eos_token").or_else(|| tc.as_ref()?.get("eos_token").and_then(special_id_of));
            let special_sep = str_field(&tc, "sep_token");
            if special_bos.is_none() {
                if let (Some(cls), Some(c)) = (&special_cls, tc.as_mut()) {
                    c.insert("bos_token".into(), J::String(cls.clone()));
                    special_bos = Some(cls.clone());
                }
            }
            if special_eos.is_none() {
                if let (Some(sep), Some(c)) = (&special_sep, tc.as_mut()) {
                    c.insert("eos_token".into(), J::String(sep.clone()));
                    special_eos = Some(sep.clone());
                }
            }
            if let Some(pp) = t.get("post_processor").filter(|p| !p.is_null()) {
                let procs: Vec<J> = pp
                    .get("processors")
                    .and_then(J::as_array)
                    .cloned()
                    .unwrap_or_else(|| vec![pp.clone()]);
                for p in procs {
                    match p.get("type").and_then(J::as_str) {
                        Some("ByteLevel") => {
                            self.add_special_token.entry("bos".into()).or_insert(false);
                            self.add_special_token.entry("eos".into()).or_insert(false);
                        }
                        Some("RobertaProcessing") => {
                            self.add_special_token.insert("bos".into(), true);
                            self.add_special_token.insert("eos".into(), true);
                            self.add_special_token.insert("sep".into(), true);
                            if let Some(c) = tc.as_mut() {
                                if special_cls.is_none() {
                                    let cls = p
                                        .pointer("/cls/0")
                                        .and_then(J::as_str)
                                        .map(String::from)
                                        .or(special_bos.clone());
                                    c.insert("cls_token".into(), cls.map(J::String).unwrap_or(J::Null));
                                }
                                if special_sep.is_none() {
                                    let sep = p
                                        .pointer("/sep/0")
                                        .and_then(J::as_str)
                                        .map(String::from)
                                        .or(special_eos.clone());
                                    c.insert("sep_token".into(), sep.map(J::String).unwrap_or(J::Null));
                                }
                            }
                        }
                        Some("TemplateProcessing") => {
                            let single = p.get("single").and_then(J::as_array).cloned().unwrap_or_default();
                            let tok = |e: &J| e.pointer("/SpecialToken/id").and_then(J::as_str).map(String::from);
                            let (mut special_first, mut special_last) = (None, None);
                            if single.len() > 1 {
                                special_first = tok(&single[0]);
                                if let Some(first) = special_first.clone() {
                                    match tc.as_mut() {
                                        None => special_bos = Some(first.clone()),
                                        Some(c) => {
                                            if Some(&first) != special_bos.as_ref()
                                                && Some(&first) != special_cls.as_ref()
                                            {
                                                if special_bos.is_none() {
                                                    c.insert("bos_token".into(), J::String(first.clone()));
                                                    special_bos = Some(first.clone());
                                                }
                                                if special_cls.is_none() {
                                                    c.insert("cls_token".into(), J::String(first.clone()));
                                                    special_cls = Some(first.clone());
                                                }
                                            }
                                        }
                                    }
                                    let is =
                                        Some(&first) == special_bos.as_ref() || Some(&first) == special_cls.as_ref();
                                    self.add_special_token.insert("bos".into(), is);
                                }
                                special_last = tok(&single[single.len() - 1]);
                                if let Some(last) = special_last.clone() {
                                    match tc.as_mut() {
                                        None => special_eos = Some(last.clone()),
                                        Some(c) => {
                                            if Some(&last) != special_eos.as_ref() {
                                                if !self.types.iter().any(|t| t == "eot") {
                                                    self.types.push("eot".into());
                                                    c.insert(
                                                        "eot_token".into(),
                                                        special_eos.clone().map(J::String).unwrap_or(J::Null),
                                                    );
                                                } else if !self.types.iter().any(|t| t == "eom") {
                                                    self.types.push("eom".into());
                                                    c.insert(
                                                        "eom_token".into(),
                                                        special_eos.clone().map(J::String).unwrap_or(J::Null),
                                                    );
                                                }
                                                c.insert("eos_token".into(), J::String(last.clone()));
                                                special_eos = Some(last.clone());
                                            }
                                        }
                                    }
                                    self.add_special_token
                                        .insert("eos".into(), Some(&last) == special_eos.as_ref());
                                }
                            }
                            // vocab.py: the pair template without the single template's leading/trailing
                            // specials must be `A <sep> [<sep>] B`; that decides add_sep.
                            let pair = p.get("pair").and_then(J::as_array).cloned().unwrap_or_default();
                            if !pair.is_empty() {
                                let start = usize::from(special_first.is_some() && tok(&pair[0]) == special_first);
                                let stop = pair.len()
                                    - usize::from(special_last.is_some() && tok(&pair[pair.len() - 1]) == special_last);
                                let inner = if start < stop { &pair[start..stop] } else { &[][..] };
                                let seq = |e: &J| e.pointer("/Sequence/id").and_then(J::as_str).map(String::from);
                                let is_sep =
                                    |s: &String| Some(s) == special_sep.as_ref() || Some(s) == special_eos.as_ref();
                                if inner.len() > 2
                                    && seq(&inner[0]).as_deref() == Some("A")
                                    && seq(&inner[inner.len() - 1]).as_deref() == Some("B")
                                {
                                    let mid = &inner[1..inner.len() - 1];
                                    let mut add_sep =
                                        tok(&mid[0]).is_some_and(|s| is_sep(&s)) && special_last.is_none();
                                    if mid.len() == 2 && tok(&mid[1]).is_some_and(|s| is_sep(&s)) {
                                        add_sep = true;
                                    }
                                    self.add_special_token.insert("sep".into(), add_sep);
                                    if add_sep && special_sep.is_none() {
                                        if let Some(c) = tc.as_mut() {
                                            c.insert(
                                                "sep_token".into(),
                                                special_eos.clone().map(J::String).unwrap_or(J::Null),
                                            );
                                        }
                                    }
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        let Some(tc) = tc else { return };
        let jinja = dir.join("chat_template.jinja");
        let alt = if jinja.is_file() {
            std::fs::read_to_string(&jinja).ok()
        } else {
            read_json(&dir.join("chat_template.json"))
                .and_then(|j| j.get("chat_template").and_then(J::as_str).map(String::from))
        };
        self.chat_template = match tc.get("chat_template") {
            Some(J::String(s)) => Some(s.clone()),
            Some(_) => None,
            None => alt,
        };
        for typ in self.types.clone() {
            if let Some(b) = tc.get(&format!("add_{typ}_token")).and_then(J::as_bool) {
                self.add_special_token.entry(typ.clone()).or_insert(b);
            }
            let Some(content) = tc.get(&format!("{typ}_token")).and_then(special_id_of) else {
                continue;
            };
            let id = added_tokens
                .iter()
                .find(|t| t.get("content").and_then(J::as_str) == Some(content.as_str()))
                .and_then(|t| t.get("id").and_then(J::as_i64));
            self.set_special(&typ, id);
        }
    }

    // vocab.py: SpecialVocab._try_load_load_config_json
    fn load_config_json(&mut self, dir: &Path) {
        let Some(cfg) = read_json(&dir.join("config.json")) else {
            return;
        };
        for typ in self.types.clone() {
            let key = format!("{typ}_token_id");
            let id = cfg
                .get(&key)
                .filter(|v| !v.is_null())
                .or_else(|| cfg.pointer(&format!("/text_config/{key}")));
            self.set_special(&typ, id.and_then(J::as_i64));
        }
    }

    fn load_merges_txt(&mut self, dir: &Path) {
        let Ok(text) = std::fs::read_to_string(dir.join("merges.txt")) else {
            return;
        };
        self.merges = text
            .lines()
            .enumerate()
            .filter(|(i, l)| !(*i == 0 && l.trim().starts_with('#')))
            .filter_map(|(_, l)| {
                let parts: Vec<&str> = l.split_whitespace().collect();
                (parts.len() == 2).then(|| format!("{} {}", parts[0], parts[1]))
            })
            .collect();
    }

    /// `SpecialVocab.add_to_gguf`: merges, ids, add flags, chat template, normalizer flags.
    pub fn write(&self, m: &mut Metadata) {
        if !self.merges.is_empty() {
            m.insert(
                "tokenizer.ggml.merges",
                Value::Array(Array::String(self.merges.iter().collect())),
            );
        }
        for (typ, id) in &self.special_token_ids {
            // gguf-py has no writer for cls (SpecialVocab logs "No handler" and skips it).
            if typ == "cls" {
                continue;
            }
            let key = match typ.as_str() {
                "sep" => "tokenizer.ggml.seperator_token_id".to_string(),
                "pad" => "tokenizer.ggml.padding_token_id".to_string(),
                "unk" => "tokenizer.ggml.unknown_token_id".to_string(),
                t => format!("tokenizer.ggml.{t}_token_id"),
            };
            m.insert(key, Value::U32(*id));
        }
        for (typ, b) in &self.add_special_token {
            if matches!(typ.as_str(), "bos" | "eos" | "sep") {
                m.insert(format!("tokenizer.ggml.add_{typ}_token"), Value::Bool(*b));
            }
        }
        if let Some(t) = &self.chat_template {
            m.insert("tokenizer.chat_template", Value::String(t.clone()));
        }
        if let Some(b) = self.normalizer_lowercase {
            m.insert("tokenizer.ggml.normalizer.lowercase", Value::Bool(b));
        }
        if let Some(b) = self.normalizer_strip_accents {
            m.insert("tokenizer.ggml.normalizer.strip_accents", Value::Bool(b));
        }
    }
}
