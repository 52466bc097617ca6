//! Importance matrices for `--imatrix`, in llama-imatrix's GGUF format (`<tensor>.in_sum2` F32
//! `[ne0, n_mat]` and `<tensor>.counts` F32 `[1, n_mat]`) or the legacy `.dat` format, normalised
//! exactly as `llama-quantize` does (`tools/quantize/quantize.cpp`: `load_imatrix`;
//! `common/imatrix-loader.cpp`).

use gguf::{GgmlType, GgufFile, Metadata, Value};
use std::collections::HashMap;
use std::path::Path;

#[derive(Debug, Clone, Default)]
pub struct Imatrix {
    /// Per tensor name: `ne0 × n_expert` weights.
    pub data: HashMap<String, Vec<f32>>,
    /// The path as given (recorded in the output, as llama-quantize does).
    pub file: String,
    pub datasets: Vec<String>,
    pub chunk_count: i64,
}

#[derive(Debug, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct ImatrixError {
    pub path: String,
    pub problem: String,
}

impl Imatrix {
    pub fn get(&self, name: &str) -> Option<&Vec<f32>> {
        self.data.get(name)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.data.contains_key(name)
    }

    /// Load a GGUF or legacy imatrix file.
    pub fn load(path: &Path) -> Result<Imatrix, ImatrixError> {
        let err = |problem: String| ImatrixError {
            path: path.display().to_string(),
            problem,
        };
        let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let mut im = if bytes.starts_with(b"GGUF") {
            Self::load_gguf(path)?
        } else {
            Self::load_legacy(&bytes).map_err(err)?
        };
        im.file = path.display().to_string();
        if im.data.is_empty() {
            return Err(err("no importance-matrix entries".into()));
        }
        for (name, v) in &im.data {
            if let Some(x) = v.iter().find(|x| !x.is_finite()) {
                return Err(err(format!("imatrix contains non-finite value {x} (tensor `{name}`)")));
            }
        }
        Ok(im)
    }

    fn load_gguf(path: &Path) -> Result<Imatrix, ImatrixError> {
        let err = |problem: String| ImatrixError {
            path: path.display().to_string(),
            problem,
        };
        let f = GgufFile::open(path).map_err(|e| err(e.to_string()))?;
        let m = f.metadata();
        let datasets = m
            .get_array("imatrix.datasets")
            .and_then(|a| a.as_strings())
            .map(|a| a.to_vec())
            .unwrap_or_default();
        let has_metadata = m.contains_key("imatrix.datasets")
            && m.contains_key("imatrix.chunk_count")
            && m.contains_key("imatrix.chunk_size");
        if !has_metadata {
            return Err(err(
                "GGUF imatrix without imatrix.datasets / chunk_count / chunk_size metadata".into(),
            ));
        }
        let chunk_count = m.get_u64("imatrix.chunk_count").unwrap_or(0) as i64;
        let f32s = |name: &str| -> Result<Option<Vec<f32>>, ImatrixError> {
            let Some(t) = f.tensor(name) else { return Ok(None) };
            if t.ty != GgmlType::F32 {
                return Err(err(format!("tensor `{name}` is {}, expected f32", t.ty)));
            }
            Ok(Some(
                f.tensor_data(t)
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ))
        };
        let mut data = HashMap::new();
        for t in f.tensors() {
            let Some(name) = t.name.strip_suffix(".in_sum2") else {
                continue;
            };
            let sums = f32s(&t.name)?.expect("listed");
            let counts = f32s(&format!("{name}.counts"))?
                .ok_or_else(|| err(format!("`{name}.in_sum2` has no `{name}.counts`")))?;
            if counts.is_empty() || sums.len() % counts.len() != 0 {
                return Err(err(format!(
                    "`{name}`: {} sums do not divide into {} counts",
                    sums.len(),
                    counts.len()
                )));
            }
            let ne0 = sums.len() / counts.len();
            let mut e = vec![0f32; sums.len()];
            for (j, &c) in counts.iter().enumerate() {
                let count = c.round() as i64 as f32; // std::lround, then back to float
                for i in 0..ne0 {
                    e[j * ne0 + i] = if count > 0.0 { sums[j * ne0 + i] / count } else { 1.0 };
                }
            }
            data.insert(name.to_string(), e);
        }
        Ok(Imatrix {
            data,
            file: String::new(),
            datasets,
            chunk_count,
        })
    }

    fn load_legacy(b: &[u8]) -> Result<Imatrix, String> {
        let mut pos = 0usize;
        let i32_at = |pos: &mut usize| -> Option<i32> {
            let v = i32::from_le_bytes(b.get(*pos..*pos + 4)?.try_into().ok()?);
            *pos += 4;
            Some(v)
        };
        let n = i32_at(&mut pos)
            .filter(|&n| n >= 1)
            .ok_or("not a GGUF file and not a legacy imatrix (bad entry count)")?;
        let mut data = HashMap::new();
        for i in 0..n {
            let len = i32_at(&mut pos)
                .filter(|&l| l >= 0)
                .ok_or(format!("entry {i}: truncated name length"))? as usize;
            let name = b.get(pos..pos + len).ok_or(format!("entry {i}: truncated name"))?;
            let name = String::from_utf8_lossy(name).into_owned();
            pos += len;
            let ncall = i32_at(&mut pos).ok_or(format!("entry `{name}`: truncated"))?;
            let nval = i32_at(&mut pos)
                .filter(|&v| v >= 1)
                .ok_or(format!("entry `{name}`: bad value count"))? as usize;
            let raw = b
                .get(pos..pos + nval * 4)
                .ok_or(format!("entry `{name}`: truncated values"))?;
            pos += nval * 4;
            let sums = raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            // Legacy sums hold (raw/count)*ncall: divide by ncall.
            let e: Vec<f32> = if ncall > 0 {
                sums.map(|s| s / ncall as f32).collect()
            } else {
                sums.collect()
            };
            data.insert(name, e);
        }
        let mut chunk_count = 0;
        let mut datasets = Vec::new();
        if pos < b.len() {
            if let Some(c) = i32_at(&mut pos) {
                chunk_count = c as i64;
                if let Some(len) = i32_at(&mut pos).filter(|&l| l > 0) {
                    if let Some(s) = b.get(pos..pos + len as usize) {
                        datasets.push(String::from_utf8_lossy(s).into_owned());
                    }
                }
            }
        }
        Ok(Imatrix {
            data,
            file: String::new(),
            datasets,
            chunk_count,
        })
    }

    /// `--include-weights` / `--exclude-weights` (substring matches, as llama-quantize).
    pub fn filter(&mut self, include: &[String], exclude: &[String]) {
        if !exclude.is_empty() {
            self.data.retain(|k, _| !exclude.iter().any(|x| k.contains(x.as_str())));
        }
        if !include.is_empty() {
            self.data.retain(|k, _| include.iter().any(|x| k.contains(x.as_str())));
        }
    }

    /// The `quantize.imatrix.*` keys llama-quantize appends to the output metadata.
    pub fn write_metadata(&self, m: &mut Metadata) {
        let clip = |s: &str| s.chars().take(127).collect::<String>();
        m.remove("quantize.imatrix.file");
        m.insert("quantize.imatrix.file", Value::String(clip(&self.file)));
        if let Some(d) = self.datasets.first() {
            m.remove("quantize.imatrix.dataset");
            m.insert("quantize.imatrix.dataset", Value::String(clip(d)));
        }
        m.remove("quantize.imatrix.entries_count");
        m.insert("quantize.imatrix.entries_count", Value::U32(self.data.len() as u32));
        if self.chunk_count > 0 {
            m.remove("quantize.imatrix.chunks_count");
            m.insert("quantize.imatrix.chunks_count", Value::U32(self.chunk_count as u32));
        }
    }
}
