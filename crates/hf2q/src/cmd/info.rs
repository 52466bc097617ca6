//! `hf2q info PATH`: describe a GGUF file (or split model) or a HuggingFace model directory.

use super::{human_bytes, human_count};
use crate::error::{CliError, CliResult};
use crate::json;
use gguf::{GgmlType, GgufModel, Metadata, Value};
use serde_json::{json, Value as J};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct InfoArgs {
    /// A .gguf file (any shard of a split model) or a HuggingFace model directory.
    pub path: PathBuf,
    /// Also list every tensor (name, type, shape, size, offset).
    #[arg(long)]
    pub tensors: bool,
    /// Print everything as JSON: all metadata and the tensor table.
    #[arg(long)]
    pub json: bool,
    /// With --json: print long arrays (vocabularies, merges) in full instead of summarised.
    #[arg(long)]
    pub full: bool,
}

pub fn run(args: InfoArgs) -> CliResult {
    if !args.path.exists() {
        return Err(CliError::input(format!(
            "{}: no such file or directory",
            args.path.display()
        )));
    }
    if args.path.is_dir() {
        return hf_dir(&args);
    }
    let model = GgufModel::open(&args.path)?;
    let s = Summary::of(&model);
    if args.json {
        let out = json!({
            "path": args.path,
            "format": "gguf",
            "version": model.files()[0].version(),
            "files": model.files().iter().map(|f| json!({
                "path": f.path(), "size": f.file_size(), "alignment": f.header().alignment,
                "data_offset": f.header().data_offset, "n_tensors": f.tensors().len(),
            })).collect::<Vec<_>>(),
            "summary": s.to_json(),
            "metadata": model.metadata().iter().map(|(k, v)| (k.to_string(), json::value(v, args.full))).collect::<serde_json::Map<_, _>>(),
            "tensors": model.tensors().map(|(f, t)| json!({
                "name": t.name,
                "type": t.ty.name(),
                "shape": t.shape,
                "offset": t.offset,
                "file_offset": f.header().data_offset + t.offset,
                "size": t.n_bytes(),
                "file": f.path().file_name().map(|n| n.to_string_lossy().into_owned()),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("JSON values serialise"));
        return Ok(());
    }
    s.print(&args, &model);
    if args.tensors {
        println!();
        println!(
            "{:>5}  {:<48} {:<8} {:<26} {:>12} {:>14}",
            "#", "name", "type", "shape", "bytes", "offset"
        );
        for (i, (f, t)) in model.tensors().enumerate() {
            let shape = format!("{:?}", t.shape);
            println!(
                "{i:>5}  {:<48} {:<8} {:<26} {:>12} {:>14}",
                t.name,
                t.ty.name(),
                shape,
                t.n_bytes().unwrap_or(0),
                f.header().data_offset + t.offset
            );
        }
    }
    Ok(())
}

struct Summary {
    architecture: Option<String>,
    name: Option<String>,
    parameters: u64,
    file_type: Option<(u64, Option<&'static str>)>,
    /// ggml type → (tensor count, bytes)
    type_mix: BTreeMap<GgmlType, (u64, u64)>,
    hparams: Vec<(&'static str, String, J)>,
    tokenizer_model: Option<String>,
    tokenizer_pre: Option<String>,
    vocab_size: Option<usize>,
    special: Vec<(String, u64, Option<String>)>,
    chat_template_bytes: Option<usize>,
    total_bytes: u64,
    n_files: usize,
}

const SPECIAL_TOKENS: &[(&str, &str)] = &[
    ("bos", "tokenizer.ggml.bos_token_id"),
    ("eos", "tokenizer.ggml.eos_token_id"),
    ("eot", "tokenizer.ggml.eot_token_id"),
    ("eom", "tokenizer.ggml.eom_token_id"),
    ("unk", "tokenizer.ggml.unknown_token_id"),
    ("sep", "tokenizer.ggml.seperator_token_id"),
    ("pad", "tokenizer.ggml.padding_token_id"),
    ("mask", "tokenizer.ggml.mask_token_id"),
];

/// Architecture-prefixed hyper-parameters shown by `info` (llama.cpp `LLM_KV_*` names).
const HPARAMS: &[(&str, &str)] = &[
    ("context length", "context_length"),
    ("embedding", "embedding_length"),
    ("layers", "block_count"),
    ("heads", "attention.head_count"),
    ("kv heads", "attention.head_count_kv"),
    ("ffn", "feed_forward_length"),
    ("experts", "expert_count"),
    ("experts used", "expert_used_count"),
    ("rope base", "rope.freq_base"),
];

fn short(v: &Value) -> (String, J) {
    match v {
        Value::Array(a) if a.len() > 8 => {
            let head: Vec<String> = (0..4).filter_map(|i| a.get(i)).map(|x| x.to_string()).collect();
            (
                format!("[{}, … ({} values)]", head.join(", "), a.len()),
                json::value(v, false),
            )
        }
        Value::Array(a) => {
            let all: Vec<String> = (0..a.len()).filter_map(|i| a.get(i)).map(|x| x.to_string()).collect();
            (format!("[{}]", all.join(", ")), json::scalar(v))
        }
        v => (v.to_string(), json::scalar(v)),
    }
}

impl Summary {
    fn of(model: &GgufModel) -> Summary {
        let m: &Metadata = model.metadata();
        let arch = m.architecture().map(String::from);
        let mut type_mix = BTreeMap::new();
        let mut parameters = 0;
        for (_, t) in model.tensors() {
            parameters += t.n_elements();
            let e = type_mix.entry(t.ty).or_insert((0, 0));
            e.0 += 1;
            e.1 += t.n_bytes().unwrap_or(0);
        }
        let mut hparams = Vec::new();
        if let Some(a) = &arch {
            for (label, key) in HPARAMS {
                if let Some(v) = m.get(&format!("{a}.{key}")) {
                    let (text, j) = short(v);
                    hparams.push((*label, text, j));
                }
            }
        }
        let tokens = m.get_array("tokenizer.ggml.tokens").and_then(|a| a.as_strings());
        let special = SPECIAL_TOKENS
            .iter()
            .filter_map(|(label, key)| {
                let id = m.get_u64(key)?;
                let text = tokens.and_then(|t| t.get(id as usize)).map(String::from);
                Some((label.to_string(), id, text))
            })
            .collect();
        Summary {
            name: m.get_str(gguf::keys::NAME).map(String::from),
            parameters,
            file_type: m
                .get_u64(gguf::keys::FILE_TYPE)
                .map(|id| (id, gguf::file_type::file_type_name(id))),
            type_mix,
            hparams,
            tokenizer_model: m.get_str("tokenizer.ggml.model").map(String::from),
            tokenizer_pre: m.get_str("tokenizer.ggml.pre").map(String::from),
            vocab_size: tokens.map(|t| t.len()),
            special,
            chat_template_bytes: m.get_str(gguf::keys::CHAT_TEMPLATE).map(str::len),
            total_bytes: model.total_bytes(),
            n_files: model.files().len(),
            architecture: arch,
        }
    }

    fn to_json(&self) -> J {
        json!({
            "architecture": self.architecture,
            "name": self.name,
            "parameters": self.parameters,
            "file_type": self.file_type.map(|(id, name)| json!({"id": id, "name": name})),
            "type_mix": self.type_mix.iter().map(|(t, (n, b))| json!({"type": t.name(), "tensors": n, "bytes": b})).collect::<Vec<_>>(),
            "hparams": self.hparams.iter().map(|(k, _, j)| (k.to_string(), j.clone())).collect::<serde_json::Map<_, _>>(),
            "tokenizer": {
                "model": self.tokenizer_model, "pre": self.tokenizer_pre, "vocab_size": self.vocab_size,
                "special": self.special.iter().map(|(l, id, t)| (l.clone(), json!({"id": id, "text": t}))).collect::<serde_json::Map<_, _>>(),
            },
            "chat_template": self.chat_template_bytes.is_some(),
            "total_bytes": self.total_bytes,
        })
    }

    fn print(&self, args: &InfoArgs, model: &GgufModel) {
        let row = |k: &str, v: String| println!("{k:<15} {v}");
        let files = if self.n_files > 1 {
            format!(", {} files", self.n_files)
        } else {
            String::new()
        };
        row(
            "file",
            format!(
                "{} ({}, GGUF v{}{files})",
                args.path.display(),
                human_bytes(self.total_bytes),
                model.files()[0].version()
            ),
        );
        row(
            "architecture",
            self.architecture
                .clone()
                .unwrap_or_else(|| "(none: general.architecture missing)".into()),
        );
        if let Some(n) = &self.name {
            row("name", n.clone());
        }
        row(
            "parameters",
            format!("{} ({})", human_count(self.parameters), self.parameters),
        );
        if let Some((id, name)) = self.file_type {
            row("file type", format!("{} ({id})", name.unwrap_or("unknown")));
        }
        let mix: Vec<String> = self
            .type_mix
            .iter()
            .map(|(t, (n, b))| format!("{t}: {n} tensors, {}", human_bytes(*b)))
            .collect();
        row("tensor types", mix.join("; "));
        for (label, text, _) in &self.hparams {
            row(label, text.clone());
        }
        match (&self.tokenizer_model, self.vocab_size) {
            (Some(model), vocab) => {
                let pre = self
                    .tokenizer_pre
                    .as_deref()
                    .map(|p| format!(", pre-tokenizer {p}"))
                    .unwrap_or_default();
                let vocab = vocab.map(|v| format!("{v} tokens, ")).unwrap_or_default();
                row("tokenizer", format!("{vocab}model {model}{pre}"));
            }
            (None, _) => row("tokenizer", "none".into()),
        }
        if !self.special.is_empty() {
            let sp: Vec<String> = self
                .special
                .iter()
                .map(|(l, id, t)| match t {
                    Some(t) => format!("{l} {id} {t:?}"),
                    None => format!("{l} {id}"),
                })
                .collect();
            row("special tokens", sp.join(", "));
        }
        row(
            "chat template",
            match self.chat_template_bytes {
                Some(n) => format!("yes ({n} bytes)"),
                None => "no".into(),
            },
        );
    }
}

fn hf_dir(args: &InfoArgs) -> CliResult {
    let s = convert::hf::inspect(&args.path)?;
    let family = s.architecture.as_deref().and_then(convert::arch::family_for);
    let convertible = match (&s.architecture, family) {
        (Some(_), Some(_)) => "yes".to_string(),
        (Some(a), None) => format!("no: hf2q has no converter for `{a}`"),
        (None, _) => "no: config.json names no architecture".to_string(),
    };
    if args.json {
        let mut j = serde_json::to_value(&s).expect("serialisable");
        j["format"] = J::from("huggingface");
        j["convertible"] = J::from(family.is_some());
        println!("{}", serde_json::to_string_pretty(&j).expect("serialisable"));
        return Ok(());
    }
    let row = |k: &str, v: String| println!("{k:<15} {v}");
    row("directory", args.path.display().to_string());
    row(
        "architecture",
        s.architecture
            .clone()
            .unwrap_or_else(|| "(config.json has no `architectures`)".into()),
    );
    if let Some(t) = &s.model_type {
        row("model type", t.clone());
    }
    row(
        "parameters",
        format!("{} ({})", human_count(s.parameters), s.parameters),
    );
    let dtypes: Vec<String> = s
        .dtypes
        .iter()
        .map(|(d, n)| format!("{d}: {}", human_count(*n)))
        .collect();
    row("dtypes", dtypes.join(", "));
    let shards: Vec<String> = s
        .shards
        .iter()
        .map(|sh| format!("{} ({}, {} tensors)", sh.file, human_bytes(sh.bytes), sh.tensors))
        .collect();
    row("shards", shards.join(", "));
    row(
        "tokenizer",
        if s.tokenizer_files.is_empty() {
            "no tokenizer files".into()
        } else {
            s.tokenizer_files.join(", ")
        },
    );
    row("convertible", convertible);
    Ok(())
}
