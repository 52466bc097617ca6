//! Reading a HuggingFace model directory: `config.json`, safetensors shards (single file or
//! `model.safetensors.index.json`), and which tokenizer files are present.

pub mod config;
pub mod tensors;

pub use config::HfConfig;
pub use tensors::{HfTensor, HfTensors};

use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {problem}")]
    Invalid { path: PathBuf, problem: String },
}

impl HfError {
    fn invalid(path: &Path, problem: impl Into<String>) -> Self {
        HfError::Invalid {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }
}

/// The tokenizer and template files a conversion may read.
pub const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.txt",
];

#[derive(Debug, Clone, Serialize)]
pub struct ShardSummary {
    pub file: String,
    pub bytes: u64,
    pub tensors: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct HfSummary {
    pub path: PathBuf,
    pub architecture: Option<String>,
    pub model_type: Option<String>,
    pub parameters: u64,
    /// dtype → number of parameters stored in it.
    pub dtypes: BTreeMap<String, u64>,
    pub shards: Vec<ShardSummary>,
    pub tokenizer_files: Vec<String>,
    pub n_tensors: usize,
}

fn read_json(path: &Path) -> Result<serde_json::Value, HfError> {
    let text = std::fs::read_to_string(path).map_err(|source| HfError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| HfError::invalid(path, format!("malformed JSON: {e}")))
}

/// The safetensors files of a model: those listed in `model.safetensors.index.json`, else every
/// `*.safetensors` in the directory.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, HfError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let j = read_json(&index)?;
        let map = j
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| HfError::invalid(&index, "missing object `weight_map`"))?;
        let mut files: Vec<String> = map.values().filter_map(|v| v.as_str().map(String::from)).collect();
        files.sort();
        files.dedup();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| HfError::Io {
            path: dir.to_path_buf(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    Ok(files)
}

/// Summarise a model directory from its config and safetensors headers (no tensor data is read).
pub fn inspect(dir: &Path) -> Result<HfSummary, HfError> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Err(HfError::invalid(
            dir,
            "no config.json: not a HuggingFace model directory",
        ));
    }
    let config = read_json(&config_path)?;
    let architecture = config
        .get("architectures")
        .and_then(|a| a.as_array())
        .and_then(|a| a.first())
        .and_then(|a| a.as_str())
        .map(String::from);
    let model_type = config.get("model_type").and_then(|m| m.as_str()).map(String::from);

    let files = safetensors_files(dir)?;
    if files.is_empty() {
        return Err(HfError::invalid(dir, "no *.safetensors files"));
    }
    let mut summary = HfSummary {
        path: dir.to_path_buf(),
        architecture,
        model_type,
        parameters: 0,
        dtypes: BTreeMap::new(),
        shards: Vec::new(),
        tokenizer_files: TOKENIZER_FILES
            .iter()
            .filter(|f| dir.join(f).is_file())
            .map(|f| f.to_string())
            .collect(),
        n_tensors: 0,
    };
    for f in files {
        let file = std::fs::File::open(&f).map_err(|source| HfError::Io {
            path: f.clone(),
            source,
        })?;
        let len = file
            .metadata()
            .map_err(|source| HfError::Io {
                path: f.clone(),
                source,
            })?
            .len();
        // SAFETY: read-only map of a file we do not modify.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| HfError::Io {
            path: f.clone(),
            source,
        })?;
        let (_, meta) = safetensors::SafeTensors::read_metadata(&map[..])
            .map_err(|e| HfError::invalid(&f, format!("invalid safetensors header: {e}")))?;
        let tensors = meta.tensors();
        for info in tensors.values() {
            let n: u64 = info.shape.iter().map(|&d| d as u64).product();
            summary.parameters += n;
            *summary.dtypes.entry(format!("{:?}", info.dtype)).or_default() += n;
        }
        summary.n_tensors += tensors.len();
        summary.shards.push(ShardSummary {
            file: f.file_name().unwrap_or_default().to_string_lossy().into_owned(),
            bytes: len,
            tensors: tensors.len(),
        });
    }
    Ok(summary)
}
