//! `config.json` as the converter reads it: multimodal checkpoints' `text_config` is merged onto
//! the root (`TextModel.__init__` in llama.cpp's `conversion/base.py`), and `find_hparam` takes the
//! first of several alternative key names.

use super::HfError;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct HfConfig {
    pub path: PathBuf,
    /// The file as written.
    pub raw: Map<String, Value>,
    /// Root keys overlaid with `text_config`.
    pub merged: Map<String, Value>,
}

impl HfConfig {
    pub fn load(dir: &Path) -> Result<HfConfig, HfError> {
        let path = dir.join("config.json");
        if !path.is_file() {
            return Err(HfError::Invalid {
                path: dir.to_path_buf(),
                problem: "no config.json: not a HuggingFace model directory".into(),
            });
        }
        let text = std::fs::read_to_string(&path).map_err(|source| HfError::Io {
            path: path.clone(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|e| HfError::Invalid {
            path: path.clone(),
            problem: format!("malformed JSON: {e}"),
        })?;
        let Value::Object(raw) = value else {
            return Err(HfError::Invalid {
                path,
                problem: "expected a JSON object".into(),
            });
        };
        let mut merged = raw.clone();
        if let Some(Value::Object(text)) = raw.get("text_config") {
            for (k, v) in text {
                merged.insert(k.clone(), v.clone());
            }
        }
        Ok(HfConfig { path, raw, merged })
    }

    /// `architectures[0]`.
    pub fn architecture(&self) -> Option<&str> {
        self.raw.get("architectures")?.as_array()?.first()?.as_str()
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.merged.get(key).filter(|v| !v.is_null())
    }

    /// The first present key of `keys` (`find_hparam(..., optional=True)`).
    pub fn find(&self, keys: &[&str]) -> Option<&Value> {
        keys.iter().find_map(|k| self.get(k))
    }

    pub fn find_u64(&self, keys: &[&str]) -> Option<u64> {
        self.find(keys).and_then(Value::as_u64)
    }

    pub fn find_f64(&self, keys: &[&str]) -> Option<f64> {
        self.find(keys).and_then(Value::as_f64)
    }

    fn missing(&self, keys: &[&str]) -> HfError {
        HfError::Invalid {
            path: self.path.clone(),
            problem: format!("missing hyper-parameter (one of {keys:?})"),
        }
    }

    /// A required integer hyper-parameter.
    pub fn req_u64(&self, keys: &[&str]) -> Result<u64, HfError> {
        self.find_u64(keys).ok_or_else(|| self.missing(keys))
    }
}
