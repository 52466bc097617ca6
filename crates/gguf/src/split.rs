//! Models split over several files (`<name>-00001-of-00003.gguf`, written by `llama-gguf-split`),
//! opened as one. Naming and keys follow `llama_split_path` in `src/llama.cpp` and
//! `tools/gguf-split/gguf-split.cpp`.

use crate::error::{GgufError, Result};
use crate::keys;
use crate::reader::{GgufFile, TensorInfo};
use crate::value::Metadata;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// If `path` names a split shard, its prefix, shard number (1-based) and count.
pub fn parse_split_name(path: &Path) -> Option<(PathBuf, u32, u32)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    // <prefix>-NNNNN-of-MMMMM
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    if no.len() != 5 || count.len() != 5 {
        return None;
    }
    let no: u32 = no.parse().ok()?;
    let count: u32 = count.parse().ok()?;
    Some((path.with_file_name(prefix), no, count))
}

/// Path of shard `no` (1-based) of `count` for a prefix (`llama_split_path`).
pub fn split_path(prefix: &Path, no: u32, count: u32) -> PathBuf {
    let name = format!(
        "{}-{no:05}-of-{count:05}.gguf",
        prefix.file_name().unwrap_or_default().to_string_lossy()
    );
    prefix.with_file_name(name)
}

/// A model stored in one GGUF file or split over several.
pub struct GgufModel {
    files: Vec<GgufFile>,
    /// (file index, tensor index within that file), in file then declaration order.
    order: Vec<(usize, usize)>,
    by_name: HashMap<String, usize>,
}

impl GgufModel {
    /// Open a single file or, when its metadata says it is one shard of several, every shard.
    /// Any shard's path may be given.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufModel> {
        let path = path.as_ref();
        let first = GgufFile::open(path)?;
        let count = first.metadata().get_u64(keys::SPLIT_COUNT).unwrap_or(1);
        if count <= 1 {
            return Self::from_files(vec![first]);
        }
        let serr = |problem: String| GgufError::Split {
            path: path.to_path_buf(),
            problem,
        };
        let count = u32::try_from(count).map_err(|_| serr(format!("`split.count` is {count}")))?;
        let (prefix, _, named_count) = parse_split_name(path).ok_or_else(|| {
            serr(format!(
                "file has `split.count` = {count} but its name does not end in -NNNNN-of-{count:05}.gguf"
            ))
        })?;
        if named_count != count {
            return Err(serr(format!(
                "file name says {named_count} shards but `split.count` is {count}"
            )));
        }
        let mut files = Vec::with_capacity(count as usize);
        for no in 1..=count {
            let p = split_path(&prefix, no, count);
            let f = if p == path {
                GgufFile::open(&p)?
            } else {
                GgufFile::open(&p).map_err(|e| match e {
                    GgufError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                        serr(format!("shard {no} of {count} is missing: {}", p.display()))
                    }
                    e => e,
                })?
            };
            let m = f.metadata();
            let (fno, fcount) = (m.get_u64(keys::SPLIT_NO), m.get_u64(keys::SPLIT_COUNT));
            if fno != Some(u64::from(no - 1)) || fcount != Some(u64::from(count)) {
                return Err(GgufError::Split {
                    path: p,
                    problem: format!(
                        "expected `split.no` = {} and `split.count` = {count}, found {:?} and {:?}",
                        no - 1,
                        fno,
                        fcount
                    ),
                });
            }
            files.push(f);
        }
        let model = Self::from_files(files)?;
        if let Some(total) = model.files[0].metadata().get_u64(keys::SPLIT_TENSORS_COUNT) {
            if total != model.order.len() as u64 {
                return Err(serr(format!(
                    "`split.tensors.count` is {total} but the shards hold {} tensors",
                    model.order.len()
                )));
            }
        }
        Ok(model)
    }

    fn from_files(files: Vec<GgufFile>) -> Result<GgufModel> {
        let mut order = Vec::new();
        let mut by_name = HashMap::new();
        for (fi, f) in files.iter().enumerate() {
            for (ti, t) in f.tensors().iter().enumerate() {
                if by_name.insert(t.name.clone(), order.len()).is_some() {
                    return Err(GgufError::Split {
                        path: f.path().to_path_buf(),
                        problem: format!("tensor `{}` appears in more than one shard", t.name),
                    });
                }
                order.push((fi, ti));
            }
        }
        Ok(GgufModel { files, order, by_name })
    }

    /// The first (or only) file, whose metadata describes the model.
    pub fn metadata(&self) -> &Metadata {
        self.files[0].metadata()
    }
    pub fn files(&self) -> &[GgufFile] {
        &self.files
    }
    pub fn n_tensors(&self) -> usize {
        self.order.len()
    }
    /// All tensors across shards with the file each lives in.
    pub fn tensors(&self) -> impl Iterator<Item = (&GgufFile, &TensorInfo)> {
        self.order
            .iter()
            .map(|&(f, t)| (&self.files[f], &self.files[f].tensors()[t]))
    }
    pub fn tensor(&self, name: &str) -> Option<(&GgufFile, &TensorInfo)> {
        let &(f, t) = self.order.get(*self.by_name.get(name)?)?;
        Some((&self.files[f], &self.files[f].tensors()[t]))
    }
    pub fn tensor_data(&self, name: &str) -> Option<&[u8]> {
        self.tensor(name).map(|(f, t)| f.tensor_data(t))
    }
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(GgufFile::file_size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        let p = Path::new("/m/model-00002-of-00003.gguf");
        let (prefix, no, count) = parse_split_name(p).unwrap();
        assert_eq!((prefix.as_path(), no, count), (Path::new("/m/model"), 2, 3));
        assert_eq!(split_path(&prefix, 1, 3), Path::new("/m/model-00001-of-00003.gguf"));
        assert!(parse_split_name(Path::new("model.gguf")).is_none());
        assert!(parse_split_name(Path::new("model-1-of-3.gguf")).is_none());
    }
}
