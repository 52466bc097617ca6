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

/// Naming from `_name_or_path` (when it is a model id, not a path) and then the directory name,
/// filling only the fields `n` (from the model card) leaves unset.
pub fn naming_from(mut n: Naming, dir_name: &str, name_or_path: Option<&str>, total_params: i64) -> Naming {
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
        let n = naming_from(Naming::default(), "qwen3-0.6b-random", None, 596_049_920);
        assert_eq!(n.name.as_deref(), Some("Qwen3 0.6b Random"));
        assert_eq!(n.basename.as_deref(), Some("qwen3"));
        assert_eq!(n.finetune.as_deref(), Some("random"));
        assert_eq!(n.size_label.as_deref(), Some("0.6B"));
        let n = naming_from(Naming::default(), "qwen3_moe", None, 1_214_336);
        assert_eq!(
            (n.name.as_deref(), n.basename, n.size_label),
            (Some("Qwen3_Moe"), None, None)
        );
        let n = naming_from(Naming::default(), "SmolLM2-135M-Instruct", None, 134_515_008);
        assert_eq!(n.name.as_deref(), Some("SmolLM2 135M Instruct"));
        assert_eq!(
            (n.basename.as_deref(), n.finetune.as_deref(), n.size_label.as_deref()),
            (Some("SmolLM2"), Some("Instruct"), Some("135M"))
        );
    }
}

/// A value of the model card's YAML front matter.
#[derive(Debug, Clone, PartialEq)]
pub enum CardValue {
    Null,
    Bool(bool),
    /// An integer or float, as written.
    Number(String),
    Str(String),
    List(Vec<CardValue>),
    Map(Vec<(String, CardValue)>),
}

impl CardValue {
    fn from_yaml(y: &yaml_rust2::Yaml) -> CardValue {
        use yaml_rust2::Yaml;
        match y {
            Yaml::String(s) => CardValue::Str(s.clone()),
            Yaml::Integer(i) => CardValue::Number(i.to_string()),
            Yaml::Real(r) => CardValue::Number(r.clone()),
            Yaml::Boolean(b) => CardValue::Bool(*b),
            Yaml::Array(a) => CardValue::List(a.iter().map(CardValue::from_yaml).collect()),
            Yaml::Hash(h) => CardValue::Map(
                h.iter()
                    .filter_map(|(k, v)| Some((CardValue::from_yaml(k).text()?, CardValue::from_yaml(v))))
                    .collect(),
            ),
            Yaml::Null | Yaml::BadValue | Yaml::Alias(_) => CardValue::Null,
        }
    }

    /// The text of a string or number value (what gguf-py would write as a string).
    pub fn text(&self) -> Option<String> {
        match self {
            CardValue::Str(s) | CardValue::Number(s) => Some(s.clone()),
            CardValue::Bool(b) => Some(if *b { "True" } else { "False" }.to_string()),
            _ => None,
        }
    }

    /// A list's elements, or a single value as a list of one (`use_array_model_card_metadata`).
    fn items(&self) -> Vec<CardValue> {
        match self {
            CardValue::List(l) => l.clone(),
            CardValue::Null | CardValue::Map(_) => Vec::new(),
            v => vec![v.clone()],
        }
    }
}

/// The YAML front matter of a model directory's `README.md` (metadata.py: `load_model_card`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelCard(pub Vec<(String, CardValue)>);

impl ModelCard {
    /// Reads the front matter between a first line `---` and the next `---` line, with the two
    /// textual fixes gguf-py applies before parsing (`- no` quoted, tabs as two spaces). A card
    /// that is not YAML is ignored with a warning.
    pub fn load(dir: &std::path::Path) -> ModelCard {
        let path = dir.join("README.md");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return ModelCard::default();
        };
        let mut lines = text.lines();
        if lines.next() != Some("---") {
            return ModelCard::default();
        }
        let mut yaml = String::new();
        for l in lines.take_while(|l| *l != "---") {
            yaml.push_str(l);
            yaml.push('\n');
        }
        let yaml = yaml.replace("- no\n", "- \"no\"\n").replace('\t', "  ");
        match ModelCard::parse(&yaml) {
            Ok(card) => card,
            Err(e) => {
                tracing::warn!("{}: model card front matter ignored: {e}", path.display());
                ModelCard::default()
            }
        }
    }

    /// Parses YAML front matter (without the `---` lines); anything but a mapping is empty.
    pub fn parse(yaml: &str) -> Result<ModelCard, String> {
        let docs = yaml_rust2::YamlLoader::load_from_str(yaml).map_err(|e| e.to_string())?;
        Ok(match docs.first().map(CardValue::from_yaml) {
            Some(CardValue::Map(m)) => ModelCard(m),
            _ => ModelCard::default(),
        })
    }

    /// The value of `key` when the card has it (possibly null).
    pub fn get(&self, key: &str) -> Option<&CardValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The first of `keys` with a non-null value, as text (`use_model_card_metadata` applied
    /// to each key in turn).
    fn first_text(&self, keys: &[&str]) -> Option<String> {
        keys.iter()
            .filter_map(|k| self.get(k))
            .find(|v| **v != CardValue::Null)
            .and_then(CardValue::text)
    }
}

/// The naming fields a model card sets itself (metadata.py: `apply_metadata_heuristic`, before
/// the `_name_or_path` and directory-name heuristics, which only fill what is left unset).
pub fn card_naming(card: &ModelCard) -> Naming {
    Naming {
        name: card.first_text(&["name", "model_name"]),
        organization: card.first_text(&["organization", "model_organization"]),
        basename: card.first_text(&["basename", "model_basename", "model_type"]),
        finetune: card.first_text(&["finetune", "model_finetune"]),
        version: card.first_text(&["version", "model_version"]),
        size_label: card.first_text(&["size_label", "model_size_label"]),
    }
}

/// The `general.*` keys gguf-py's `Metadata.set_gguf_meta_model` writes, in its order, from the
/// naming (card first, then heuristics), the size label and the model card. Empty strings and
/// empty lists are left out, as `GGUFWriter.add_string` / `add_array` do.
pub fn general_metadata(
    card: &ModelCard,
    naming: &Naming,
    size_label: Option<String>,
    total_params: i64,
) -> Vec<(String, gguf::Value)> {
    use gguf::{Array, Value};
    let mut out = Vec::new();
    let put = |out: &mut Vec<(String, Value)>, key: &str, v: Option<String>| {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            out.push((key.to_string(), Value::String(v)));
        }
    };
    put(&mut out, "general.name", naming.name.clone());
    put(
        &mut out,
        "general.author",
        card.first_text(&["author", "model_author", "model_creator"]),
    );
    put(&mut out, "general.version", naming.version.clone());
    put(&mut out, "general.organization", naming.organization.clone());
    put(&mut out, "general.finetune", naming.finetune.clone());
    put(&mut out, "general.basename", naming.basename.clone());
    put(
        &mut out,
        "general.description",
        card.first_text(&["description", "model_description"]),
    );
    put(&mut out, "general.size_label", size_label);
    let license = card
        .0
        .iter()
        .find(|(k, v)| k == "license" && *v != CardValue::Null)
        .map(|(_, v)| v);
    let license = match license {
        Some(CardValue::List(l)) => Some(l.iter().filter_map(CardValue::text).collect::<Vec<_>>().join(",")),
        Some(v) => v.text(),
        None => None,
    };
    put(&mut out, "general.license", license);
    put(&mut out, "general.license.name", card.first_text(&["license_name"]));
    put(&mut out, "general.license.link", card.first_text(&["license_link"]));
    for (key, fields) in [
        ("general.source.url", ["url", "model_url"]),
        ("general.source.doi", ["doi", "model_doi"]),
        ("general.source.uuid", ["uuid", "model_uuid"]),
        ("general.source.repo_url", ["repo_url", "model_repo_url"]),
    ] {
        put(&mut out, key, card.first_text(&fields));
    }

    // Base models and datasets: ids become name, organization, version and a Hub URL; Hub URLs
    // are parsed the same way; mappings are taken as they are.
    let hub_url = regex::Regex::new(r"^https?://huggingface.co/([^/]+/[^/]+)$").expect("valid pattern");
    let entry = |v: &CardValue, is_dataset: bool| -> Vec<(String, String)> {
        let mut e: Vec<(String, String)> = Vec::new();
        let id_fields = |e: &mut Vec<(String, String)>, id: &str, with_url: bool| {
            let (full, org, _, _, version, _) = model_id_components(id, total_params);
            if let Some(f) = &full {
                e.push(("name".into(), id_to_title(f)));
            }
            if let Some(o) = &org {
                e.push(("organization".into(), id_to_title(o)));
            }
            if let Some(v) = version {
                e.push(("version".into(), v));
            }
            if let (true, Some(o), Some(f)) = (with_url, org, full) {
                // (sic: the converter writes the model URL form for datasets too)
                e.push(("repo_url".into(), format!("https://huggingface.co/{o}/{f}")));
            }
        };
        match v {
            CardValue::Str(id) => {
                if ["http://", "https://", "ssh://"].iter().any(|p| id.starts_with(p)) {
                    e.push(("repo_url".into(), id.clone()));
                    if id.contains("huggingface.co") {
                        if let Some(c) = hub_url.captures(id) {
                            id_fields(&mut e, &c[1], false);
                        }
                    }
                } else {
                    id_fields(&mut e, id, true);
                }
            }
            CardValue::Map(m) => {
                for (k, v) in m {
                    if let Some(t) = v.text() {
                        e.push((k.clone(), t));
                    }
                }
            }
            _ => tracing::warn!(
                "model card: {} entry {v:?} not in a known format",
                if is_dataset { "dataset" } else { "base model" }
            ),
        }
        e
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
    for (kind, keys, is_dataset) in [
        ("base_model", ["base_model", "base_models", "base_model_sources"], false),
        ("dataset", ["datasets", "dataset", "dataset_sources"], true),
    ] {
        // The first of the keys that is present, even with a null value.
        let Some(v) = keys.iter().find_map(|k| card.get(k)) else {
            continue;
        };
        let ids = match v {
            CardValue::List(l) => l.clone(),
            CardValue::Str(_) => vec![v.clone()],
            _ => Vec::new(),
        };
        let es: Vec<_> = ids.iter().map(|id| entry(id, is_dataset)).collect();
        out.push((format!("general.{kind}.count"), Value::U32(es.len() as u32)));
        for (i, e) in es.iter().enumerate() {
            for field in order {
                let v = e.iter().find(|(f, _)| f == field).map(|(_, v)| v.clone());
                put(&mut out, &format!("general.{kind}.{i}.{field}"), v);
            }
        }
    }
    for (key, fields) in [
        ("general.tags", ["tags", "pipeline_tag"]),
        ("general.languages", ["languages", "language"]),
    ] {
        let items: Vec<String> = fields
            .iter()
            .filter_map(|k| card.get(k))
            .flat_map(CardValue::items)
            .filter_map(|v| v.text())
            .collect();
        if !items.is_empty() {
            out.push((key.to_string(), Value::Array(Array::String(items.iter().collect()))));
        }
    }
    out
}

/// The `general.sampling.*` keys from `generation_config.json` (metadata.py: `Metadata.load`;
/// the first keys `set_gguf_meta_model` writes). A file that is not valid JSON is ignored, as
/// there.
pub fn sampling_metadata(dir: &std::path::Path) -> Vec<(String, gguf::Value)> {
    use gguf::Value;
    let Ok(text) = std::fs::read_to_string(dir.join("generation_config.json")) else {
        return Vec::new();
    };
    let Ok(serde_json::Value::Object(g)) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    let get = |keys: &[&str]| keys.iter().find_map(|k| g.get(*k)).filter(|v| !v.is_null());
    let mut out = Vec::new();
    if let Some(s) = get(&["sequence"]).and_then(|v| v.as_str()).filter(|s| !s.is_empty()) {
        out.push(("general.sampling.sequence".to_string(), Value::String(s.to_string())));
    }
    // (gguf key, generation_config keys, integer?) in set_gguf_meta_model's order
    let fields: [(&str, &[&str], bool); 11] = [
        ("top_k", &["top_k"], true),
        ("top_p", &["top_p"], false),
        ("min_p", &["min_p"], false),
        ("xtc_probability", &["xtc_probability"], false),
        ("xtc_threshold", &["xtc_threshold"], false),
        ("temp", &["temperature"], false),
        ("penalty_last_n", &["penalty_last_n"], true),
        ("penalty_repeat", &["penalty_repeat", "repetition_penalty"], false),
        ("mirostat", &["mirostat"], true),
        ("mirostat_tau", &["mirostat_tau"], false),
        ("mirostat_eta", &["mirostat_eta"], false),
    ];
    for (name, keys, int) in fields {
        let Some(v) = get(keys) else { continue };
        let key = format!("general.sampling.{name}");
        if int {
            if let Some(i) = v.as_i64() {
                out.push((key, Value::I32(i as i32)));
            }
        } else if let Some(x) = v.as_f64() {
            out.push((key, Value::F32(x as f32)));
        }
    }
    out
}
