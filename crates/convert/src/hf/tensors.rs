//! The safetensors of a model directory, read through mmap with the `safetensors` crate, in the
//! order llama.cpp's converter visits them: shards in sorted file-name order (from
//! `model.safetensors.index.json` when present), tensors sorted by name within each shard
//! (`gguf-py` `SafetensorsLocal`).

use super::HfError;
use safetensors::Dtype;
use std::path::{Path, PathBuf};

/// One tensor of the checkpoint (shape in PyTorch order, outermost first).
#[derive(Debug, Clone)]
pub struct HfTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    shard: usize,
    start: usize,
    end: usize,
}

impl HfTensor {
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

pub struct HfTensors {
    shards: Vec<(PathBuf, memmap2::Mmap)>,
    tensors: Vec<HfTensor>,
}

fn invalid(path: &Path, problem: String) -> HfError {
    HfError::Invalid {
        path: path.to_path_buf(),
        problem,
    }
}

impl HfTensors {
    pub fn open(dir: &Path) -> Result<HfTensors, HfError> {
        let files = super::safetensors_files(dir)?;
        if files.is_empty() {
            return Err(invalid(dir, "no *.safetensors files".into()));
        }
        let mut shards = Vec::new();
        let mut tensors = Vec::new();
        for (i, f) in files.iter().enumerate() {
            let file = std::fs::File::open(f).map_err(|source| HfError::Io {
                path: f.clone(),
                source,
            })?;
            // SAFETY: read-only map of a file we do not modify.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| HfError::Io {
                path: f.clone(),
                source,
            })?;
            let (header_len, meta) = safetensors::SafeTensors::read_metadata(&map[..])
                .map_err(|e| invalid(f, format!("invalid or truncated safetensors file: {e}")))?;
            let data_start = 8 + header_len;
            let mut names: Vec<(String, &safetensors::tensor::TensorInfo)> = meta.tensors().into_iter().collect();
            names.sort_by(|a, b| a.0.cmp(&b.0));
            for (name, info) in names {
                let (s, e) = info.data_offsets;
                if data_start + e > map.len() {
                    return Err(invalid(
                        f,
                        format!("tensor `{name}` data ends past the end of the file (truncated shard?)"),
                    ));
                }
                tensors.push(HfTensor {
                    name: name.clone(),
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    shard: i,
                    start: data_start + s,
                    end: data_start + e,
                });
            }
            shards.push((f.clone(), map));
        }
        Ok(HfTensors { shards, tensors })
    }

    pub fn tensors(&self) -> &[HfTensor] {
        &self.tensors
    }

    pub fn get(&self, name: &str) -> Option<&HfTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Raw bytes of a tensor.
    pub fn bytes(&self, t: &HfTensor) -> &[u8] {
        &self.shards[t.shard].1[t.start..t.end]
    }

    pub fn shard_path(&self, t: &HfTensor) -> &Path {
        &self.shards[t.shard].0
    }

    /// A floating-point tensor widened to f32 (exact for F32/F16/BF16, as `torch.to(float32)`).
    pub fn f32(&self, t: &HfTensor) -> Result<Vec<f32>, HfError> {
        self.f32_range(t, 0, t.n_elements())
    }

    /// Elements `[start, end)` of a tensor (row-major) widened to f32.
    pub fn f32_range(&self, t: &HfTensor, start: usize, end: usize) -> Result<Vec<f32>, HfError> {
        let width = match t.dtype {
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I64 => 8,
            _ => 1,
        };
        let all = self.bytes(t);
        let b = &all[(start * width).min(all.len())..(end * width).min(all.len())];
        let float = |ty: gguf::GgmlType| {
            let mut v = vec![0f32; b.len() / width];
            quant::dequantize_into(ty, b, &mut v).expect("float types have one-value blocks");
            v
        };
        let v: Vec<f32> = match t.dtype {
            // Through quant's float conversions (vectorised, same values as the scalar formulas).
            Dtype::F32 => float(gguf::GgmlType::F32),
            Dtype::F16 => float(gguf::GgmlType::F16),
            Dtype::BF16 => float(gguf::GgmlType::BF16),
            Dtype::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
                .collect(),
            Dtype::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as f32)
                .collect(),
            d => {
                return Err(invalid(
                    self.shard_path(t),
                    format!(
                        "tensor `{}` has dtype {d:?}, which hf2q cannot convert (supported: F32, F16, BF16)",
                        t.name
                    ),
                ))
            }
        };
        if v.len() != end - start {
            return Err(invalid(
                self.shard_path(t),
                format!("tensor `{}`: data size does not match shape {:?}", t.name, t.shape),
            ));
        }
        Ok(v)
    }

    /// Tell the kernel the tensor's pages are no longer needed, so they leave this process's
    /// resident set (they stay in the page cache; a later read maps them again).
    pub fn release(&self, t: &HfTensor) {
        self.release_bytes(t, t.start, t.end);
    }

    /// Ask the kernel to start reading a tensor's bytes now (read-ahead while other work runs).
    pub fn prefetch(&self, t: &HfTensor) {
        let map = &self.shards[t.shard].1;
        let page = 4096;
        let start = t.start / page * page;
        let _ = map.advise_range(memmap2::Advice::WillNeed, start, t.end - start);
    }

    /// [`Self::release`] for elements `[start, end)` of a tensor.
    pub fn release_elements(&self, t: &HfTensor, start: usize, end: usize) {
        let width = (t.end - t.start) / t.n_elements().max(1);
        self.release_bytes(t, t.start + start * width, (t.start + end * width).min(t.end));
    }

    fn release_bytes(&self, t: &HfTensor, start: usize, end: usize) {
        let map = &self.shards[t.shard].1;
        let page = 4096;
        let start = start.div_ceil(page) * page;
        let end = end / page * page;
        if end > start {
            // SAFETY: read-only file mapping; DONTNEED only drops this process's mapping of the
            // pages, which are read again from the file if touched later.
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
        }
    }
}
