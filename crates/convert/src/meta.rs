//! `general.*` metadata the converter derives from the model directory and the tensor list
//! (gguf-py `metadata.py` / `utility.py`: `size_label`, `model_weight_count_rounded_notation`).

/// Python's `str.title()`: upper-case the first letter of each run of letters, lower-case the rest.
pub fn python_title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_cased = false;
    for c in s.chars() {
        if c.is_alphabetic() {
            if prev_cased {
                out.extend(c.to_lowercase());
            } else {
                out.extend(c.to_uppercase());
            }
            prev_cased = true;
        } else {
            out.push(c);
            prev_cased = false;
        }
    }
    out
}

/// utility.py: model_weight_count_rounded_notation
pub fn rounded_count(n: u64, min_digits: usize) -> String {
    let v = n as f64;
    let (scaled, suffix) = if v > 1e12 {
        (v * 1e-12, "T")
    } else if v > 1e9 {
        (v * 1e-9, "B")
    } else if v > 1e6 {
        (v * 1e-6, "M")
    } else {
        (v * 1e-3, "K")
    };
    // Python's round() is half-to-even; str() of the int, leading zeros stripped.
    let r = scaled.round_ties_even() as i64;
    let digits = r.to_string().trim_start_matches('0').len();
    let fix = min_digits.saturating_sub(digits);
    format!("{scaled:.fix$}{suffix}")
}

/// Parameter counts as `GGUFWriter.get_total_parameter_count` computes them from (name, shape).
pub fn parameter_counts<'a>(tensors: impl Iterator<Item = (&'a str, &'a [usize])>) -> (u64, u64, u64, u64) {
    let (mut total, mut shared, mut expert, mut expert_sum, mut n_expert_tensors) = (0u64, 0u64, 0u64, 0u64, 0u64);
    for (name, shape) in tensors {
        let size: u64 = shape.iter().map(|&d| d as u64).product();
        if name.contains("_exps.") && shape.len() >= 3 {
            let count = shape[shape.len() - if name.contains(".bias") { 2 } else { 3 }] as u64;
            expert += size / count.max(1);
            expert_sum += count;
            n_expert_tensors += 1;
        } else {
            shared += size;
        }
        total += size;
    }
    let expert_count = expert_sum.checked_div(n_expert_tensors).unwrap_or(0);
    (total, shared, expert, expert_count)
}

/// utility.py: size_label
pub fn size_label(total: u64, shared: u64, expert: u64, expert_count: u64) -> String {
    if expert_count > 0 {
        format!("{expert_count}x{}", rounded_count(shared + expert, 2))
    } else {
        rounded_count(total, 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_and_labels() {
        assert_eq!(python_title("qwen3_5_moe_text"), "Qwen3_5_Moe_Text");
        assert_eq!(python_title("deepseek_v4"), "Deepseek_V4");
        assert_eq!(rounded_count(623_360, 2), "623K");
        assert_eq!(rounded_count(2_432_000, 2), "2.4M");
        assert_eq!(rounded_count(134_515_008, 2), "135M");
        assert_eq!(size_label(0, 1_000_000, 500_000, 4), "4x1.5M");
    }
}

/// The naming metadata gguf-py derives from a model id or directory name (`metadata.py`:
/// `Metadata.get_model_id_components`, `id_to_title`, and the `_name_or_path` / directory-name
/// fallbacks of `apply_metadata_heuristic`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Naming {
    pub name: Option<String>,
    pub organization: Option<String>,
    pub basename: Option<String>,
    pub finetune: Option<String>,
    pub version: Option<String>,
    pub size_label: Option<String>,
}

fn fullmatch(re: &str, s: &str) -> bool {
    regex::Regex::new(&format!("(?i)^(?:{re})$"))
        .expect("valid pattern")
        .is_match(s)
}

/// metadata.py: Metadata.id_to_title
pub fn id_to_title(s: &str) -> String {
    s.trim()
        .replace('-', " ")
        .split_whitespace()
        .map(|w| {
            let lower = w.chars().all(|c| !c.is_uppercase()) && w.chars().any(|c| c.is_lowercase());
            if lower
                && !regex::Regex::new(r"^(v\d+(?:\.\d+)*|\d.*)$")
                    .expect("valid")
                    .is_match(w)
            {
                python_title(w)
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// metadata.py: Metadata.get_model_id_components → (full name, org, basename, finetune, version, size label)
#[allow(clippy::type_complexity)]
pub fn model_id_components(
    model_id: &str,
    total_params: i64,
) -> (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
) {
    if model_id.contains(' ') {
        return (Some(model_id.to_string()), None, None, None, None, None);
    }
    let (mut org, full) = match model_id.split_once('/') {
        Some((o, f)) => (Some(o.to_string()), f.to_string()),
        None => (None, model_id.to_string()),
    };
    if org.as_deref().is_some_and(|o| o.starts_with('.')) {
        org = None;
    }
    let mut parts: Vec<String> = full.split('-').filter(|p| !p.is_empty()).map(String::from).collect();
    let mut types: Vec<Vec<&str>> = vec![Vec::new(); parts.len()];
    for i in 0..parts.len() {
        let part = parts[i].clone();
        if fullmatch(r"(v|iter)?\d+([.]\d+)*", &part) {
            types[i].push("version");
        } else if fullmatch(r"i?q\d(_\w)*|b?fp?(16|32)", &part) {
            types[i].push("type");
            parts[i] = part.to_uppercase();
        } else if i > 0
            && fullmatch(
                r"(([A]|\d+[x])?\d+([._]\d+)?[KMBT][\d]?|small|mini|medium|large|x?xl)",
                &part,
            )
        {
            let mut p: Vec<char> = part.replace('_', ".").chars().collect();
            // bloom-7b1 notation
            if p.last().is_some_and(|c| c.is_ascii_digit()) && p.len() >= 2 {
                let n = p.len();
                let (a, b) = (p[n - 2], p[n - 1]);
                p.truncate(n - 2);
                p.extend(['.', b, a]);
            }
            let n = p.len();
            if n > 1 && p[n - 2].is_ascii_digit() && "kmbt".contains(p[n - 1]) {
                p[n - 1] = p[n - 1].to_ascii_uppercase();
            }
            let mut s: String = p.iter().collect();
            if total_params != 0 {
                let last = s.chars().last().unwrap_or(' ');
                if let (Ok(v), Some(exp)) = (s[..s.len() - last.len_utf8()].parse::<f64>(), " KMBT".find(last)) {
                    let label = v * 1000f64.powi(exp as i32);
                    let tp = total_params as f64;
                    let far = (total_params < 0 && label < (total_params.abs() / 8) as f64)
                        || (total_params > 0 && (label - tp).abs() > (7 * total_params / 8) as f64);
                    if far {
                        types[i].push("finetune");
                        let l = s.pop().expect("non-empty");
                        s.push(l.to_ascii_lowercase());
                    }
                }
            }
            if types[i].is_empty() {
                types[i].push("size_label");
            }
            parts[i] = s;
        } else if i > 0 && fullmatch(r"chat|instruct|vision|lora", &part) {
            if total_params < 0 && part.eq_ignore_ascii_case("lora") {
                types[i].push("type");
            } else {
                types[i].push("finetune");
            }
        }
    }
    let has_numeric_size = parts
        .iter()
        .zip(&types)
        .any(|(p, t)| t.contains(&"size_label") && p.chars().any(|c| c.is_ascii_digit()));
    if has_numeric_size {
        for (p, t) in parts.iter().zip(types.iter_mut()) {
            if t.contains(&"size_label") && p.chars().all(|c| c.is_alphabetic()) {
                t.retain(|x| *x != "size_label");
            }
        }
    }
    let mut at_start = true;
    for (p, t) in parts.iter().zip(types.iter_mut()) {
        if at_start && ((t.is_empty() && p.chars().next().is_some_and(|c| c.is_alphabetic())) || t.contains(&"version"))
        {
            t.push("basename");
        } else {
            at_start = false;
            if t.is_empty() {
                t.push("finetune");
            }
        }
    }
    for t in types.iter_mut().rev() {
        if t.contains(&"basename") && t.len() > 1 {
            t.retain(|x| *x != "basename");
        } else {
            break;
        }
    }
    let join = |want: &str, exclude: Option<&str>| {
        let mut seen = Vec::new();
        for (p, t) in parts.iter().zip(&types) {
            if t.contains(&want)
                && exclude.is_none_or(|e| !t.contains(&e))
                && (want != "size_label" || !seen.contains(p))
            {
                seen.push(p.clone());
            }
        }
        (!seen.is_empty()).then(|| seen.join("-"))
    };
    let mut basename = join("basename", None);
    let size_label = join("size_label", None);
    let finetune = join("finetune", None);
    let version = join("version", Some("basename"));
    if size_label.is_none() && finetune.is_none() && version.is_none() {
        basename = None;
    }
    (Some(full), org, basename, finetune, version, size_label)
}

/// Naming from `_name_or_path` (when it is a model id, not a path) and then the directory name.
pub fn naming(dir_name: &str, name_or_path: Option<&str>, total_params: i64) -> Naming {
    let mut n = Naming::default();
    let mut apply = |id: &str| {
        let (full, org, basename, finetune, version, size_label) = model_id_components(id, total_params);
        if n.name.is_none() {
            n.name = full.as_deref().map(id_to_title);
        }
        if n.organization.is_none() {
            n.organization = org.as_deref().map(id_to_title);
        }
        n.basename = n.basename.take().or(basename);
        n.finetune = n.finetune.take().or(finetune);
        n.version = n.version.take().or(version);
        n.size_label = n.size_label.take().or(size_label);
    };
    if let Some(p) = name_or_path.filter(|p| p.matches('/').count() <= 1) {
        apply(p);
    }
    apply(dir_name);
    n
}

#[cfg(test)]
mod naming_tests {
    use super::*;

    #[test]
    fn directory_names() {
        let n = naming("qwen3-0.6b-random", None, 596_049_920);
        assert_eq!(n.name.as_deref(), Some("Qwen3 0.6b Random"));
        assert_eq!(n.basename.as_deref(), Some("qwen3"));
        assert_eq!(n.finetune.as_deref(), Some("random"));
        assert_eq!(n.size_label.as_deref(), Some("0.6B"));
        let n = naming("qwen3_moe", None, 1_214_336);
        assert_eq!(
            (n.name.as_deref(), n.basename, n.size_label),
            (Some("Qwen3_Moe"), None, None)
        );
        let n = naming("SmolLM2-135M-Instruct", None, 134_515_008);
        assert_eq!(n.name.as_deref(), Some("SmolLM2 135M Instruct"));
        assert_eq!(
            (n.basename.as_deref(), n.finetune.as_deref(), n.size_label.as_deref()),
            (Some("SmolLM2"), Some("Instruct"), Some("135M"))
        );
    }
}

/// A value of the model card's YAML front matter, as far as the converter uses it.
#[derive(Debug, Clone, PartialEq)]
pub enum CardValue {
    Str(String),
    List(Vec<String>),
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    let s = s
        .strip_prefix('"')
        .and_then(|x| x.strip_suffix('"'))
        .or_else(|| s.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')))
        .unwrap_or(s);
    s.to_string()
}

/// The YAML front matter of `README.md` (metadata.py: `load_model_card`), for the flat keys model
/// cards use: `key: value`, `key: [a, b]` and block lists (`key:` then `- item` lines). Nested
/// mappings are skipped.
pub fn load_model_card(dir: &std::path::Path) -> Vec<(String, CardValue)> {
    let Ok(text) = std::fs::read_to_string(dir.join("README.md")) else {
        return Vec::new();
    };
    let mut lines = text.lines();
    if lines.next() != Some("---") {
        return Vec::new();
    }
    let body: Vec<String> = lines
        .take_while(|l| *l != "---")
        .map(|l| l.replace('\t', "  "))
        .collect();
    let mut out: Vec<(String, CardValue)> = Vec::new();
    let mut i = 0;
    while i < body.len() {
        let line = &body[i];
        i += 1;
        if line.trim().is_empty()
            || line.trim_start().starts_with('#')
            || line.starts_with(' ')
            || line.starts_with('-')
        {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim().to_string(), value.trim());
        if value.is_empty() {
            let mut items = Vec::new();
            while i < body.len() {
                let l = body[i].trim_start();
                if let Some(item) = l.strip_prefix("- ") {
                    items.push(unquote(item));
                    i += 1;
                } else if l.is_empty() {
                    i += 1;
                } else {
                    break;
                }
            }
            // Indented mappings (not lists) are not used by the converter's card fields here.
            while i < body.len() && body[i].starts_with(' ') {
                i += 1;
            }
            if !items.is_empty() {
                out.push((key, CardValue::List(items)));
            }
        } else if let Some(inner) = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
            out.push((
                key,
                CardValue::List(inner.split(',').map(unquote).filter(|s| !s.is_empty()).collect()),
            ));
        } else {
            out.push((key, CardValue::Str(unquote(value))));
        }
    }
    out
}

/// The `general.*` keys gguf-py's `Metadata.set_gguf_meta_model` writes after the size label:
/// license, base models, datasets, tags, languages (from the model card).
pub fn card_metadata(card: &[(String, CardValue)], total_params: i64) -> Vec<(String, gguf::Value)> {
    use gguf::{Array, Value};
    let get = |k: &str| card.iter().find(|(key, _)| key == k).map(|(_, v)| v);
    let list = |v: Option<&CardValue>| -> Vec<String> {
        match v {
            Some(CardValue::Str(s)) => vec![s.clone()],
            Some(CardValue::List(l)) => l.clone(),
            None => Vec::new(),
        }
    };
    let mut out = Vec::new();
    match get("license") {
        Some(CardValue::Str(s)) => out.push(("general.license".to_string(), Value::String(s.clone()))),
        Some(CardValue::List(l)) => out.push(("general.license".to_string(), Value::String(l.join(",")))),
        None => {}
    }
    for (k, field) in [
        ("license_name", "general.license.name"),
        ("license_link", "general.license.link"),
    ] {
        if let Some(CardValue::Str(s)) = get(k) {
            out.push((field.to_string(), Value::String(s.clone())));
        }
    }
    // Base models and datasets: "org/name" ids become name, organization and a Hub URL.
    let entries = |ids: Vec<String>| -> Vec<Vec<(&'static str, String)>> {
        ids.into_iter()
            .map(|id| {
                let mut e = Vec::new();
                if id.starts_with("http://") || id.starts_with("https://") || id.starts_with("ssh://") {
                    e.push(("repo_url", id));
                    return e;
                }
                let (full, org, _, _, version, _) = model_id_components(&id, total_params);
                if let Some(f) = &full {
                    e.push(("name", id_to_title(f)));
                }
                if let Some(o) = &org {
                    e.push(("organization", id_to_title(o)));
                }
                if let Some(v) = version {
                    e.push(("version", v));
                }
                if let (Some(o), Some(f)) = (org, full) {
                    // (sic: the converter writes the model URL form for datasets too)
                    e.push(("repo_url", format!("https://huggingface.co/{o}/{f}")));
                }
                e
            })
            .collect()
    };
    let order = [
        "name",
        "author",
        "version",
        "organization",
        "description",
        "url",
        "doi",
        "uuid",
        "repo_url",
    ];
    for (kind, keys) in [
        ("base_model", ["base_model", "base_models", "base_model_sources"]),
        ("dataset", ["datasets", "dataset", "dataset_sources"]),
    ] {
        let Some(v) = keys.iter().find_map(|k| get(k)) else {
            continue;
        };
        let es = entries(list(Some(v)));
        out.push((format!("general.{kind}.count"), Value::U32(es.len() as u32)));
        for (i, e) in es.iter().enumerate() {
            for field in order {
                if let Some((_, val)) = e.iter().find(|(f, _)| *f == field) {
                    out.push((format!("general.{kind}.{i}.{field}"), Value::String(val.clone())));
                }
            }
        }
    }
    let mut tags = list(get("tags"));
    tags.extend(list(get("pipeline_tag")));
    if get("tags").is_some() || get("pipeline_tag").is_some() {
        out.push((
            "general.tags".to_string(),
            Value::Array(Array::String(tags.iter().collect())),
        ));
    }
    let mut langs = list(get("languages"));
    langs.extend(list(get("language")));
    if get("languages").is_some() || get("language").is_some() {
        out.push((
            "general.languages".to_string(),
            Value::Array(Array::String(langs.iter().collect())),
        ));
    }
    out
}
