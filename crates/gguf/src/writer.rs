//! Streaming GGUF writer.
//!
//! The header, metadata and tensor infos are written first (offsets are computed from the
//! declared shapes and types), then tensor data is appended in declaration order, in as many
//! pieces as the caller likes, with alignment padding after each tensor (as `gguf.cpp` and
//! gguf-py do). The file is written under a temporary name in the destination directory and
//! only renamed into place by [`GgufWriter::finish`] after an fsync; dropping an unfinished
//! writer removes the temporary file, so no half-written file ever appears under the final name.

use crate::error::{GgufError, Result};
use crate::ggml_type::GgmlType;
use crate::keys;
use crate::reader::{TensorInfo, MAGIC, MAX_DIMS};
use crate::value::{Array, Metadata, Value};
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// ggml's `GGML_MAX_NAME`: llama.cpp refuses tensor names of this length or longer.
pub const MAX_TENSOR_NAME: usize = 64;

/// A tensor to be written: everything but its offset, which the writer assigns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub ty: GgmlType,
    /// ggml `ne` order: row length first.
    pub shape: Vec<u64>,
}

impl From<&TensorInfo> for TensorSpec {
    fn from(t: &TensorInfo) -> Self {
        TensorSpec {
            name: t.name.clone(),
            ty: t.ty,
            shape: t.shape.clone(),
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => le!(v),
        Array::U16(v) => le!(v),
        Array::I16(v) => le!(v),
        Array::U32(v) => le!(v),
        Array::I32(v) => le!(v),
        Array::F32(v) => le!(v),
        Array::U64(v) => le!(v),
        Array::I64(v) => le!(v),
        Array::F64(v) => le!(v),
        Array::Bool(v) => out.extend(v.iter().map(|&b| b as u8)),
        Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
        Array::Array(v) => v.iter().for_each(|a| put_array(out, a)),
    }
}

/// Encode one value (without its type tag).
pub fn encode_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// The alignment a metadata set asks for, validated.
pub fn alignment_of(metadata: &Metadata) -> std::result::Result<u64, String> {
    match metadata.get(keys::ALIGNMENT) {
        None => Ok(keys::DEFAULT_ALIGNMENT as u64),
        Some(Value::U32(a)) if a.is_power_of_two() => Ok(*a as u64),
        Some(v) => Err(format!(
            "`{}` must be a u32 power of two, found {} {v}",
            keys::ALIGNMENT,
            v.type_string()
        )),
    }
}

/// Encode header, metadata and tensor infos (with offsets assigned in order), padded to the
/// alignment. Returns the bytes and the infos with their offsets.
pub fn encode_header(
    version: u32,
    metadata: &Metadata,
    tensors: &[TensorSpec],
) -> std::result::Result<(Vec<u8>, Vec<TensorInfo>), String> {
    if version != 2 && version != 3 {
        return Err(format!("cannot write GGUF version {version} (2 or 3)"));
    }
    let alignment = alignment_of(metadata)?;
    let mut names = HashSet::new();
    let mut infos = Vec::with_capacity(tensors.len());
    let mut offset = 0u64;
    for t in tensors {
        if t.name.len() >= MAX_TENSOR_NAME {
            return Err(format!(
                "tensor name `{}` is {} bytes; llama.cpp allows at most {}",
                t.name,
                t.name.len(),
                MAX_TENSOR_NAME - 1
            ));
        }
        if !names.insert(t.name.as_str()) {
            return Err(format!("duplicate tensor name `{}`", t.name));
        }
        if t.shape.len() > MAX_DIMS as usize {
            return Err(format!(
                "tensor `{}` has {} dimensions, at most {MAX_DIMS}",
                t.name,
                t.shape.len()
            ));
        }
        let info = TensorInfo {
            name: t.name.clone(),
            shape: t.shape.clone(),
            ty: t.ty,
            offset,
        };
        let size = info.n_bytes().ok_or_else(|| {
            format!(
                "tensor `{}`: shape {:?} is not a whole number of {} blocks ({} values each)",
                t.name,
                t.shape,
                t.ty,
                t.ty.block_size()
            )
        })?;
        offset = offset
            .checked_add(size)
            .and_then(|o| o.checked_add(alignment - 1))
            .map(|o| o / alignment * alignment)
            .ok_or("total tensor size overflows")?;
        infos.push(info);
    }

    let mut out = Vec::with_capacity(1 << 16);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata.iter() {
        put_str(&mut out, k);
        out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
        encode_value(&mut out, v);
    }
    for t in &infos {
        put_str(&mut out, &t.name);
        out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for d in &t.shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ty.id().to_le_bytes());
        out.extend_from_slice(&t.offset.to_le_bytes());
    }
    let padded = (out.len() as u64).div_ceil(alignment) * alignment;
    out.resize(padded as usize, 0);
    Ok((out, infos))
}

/// Temporary file beside the destination, removed on drop unless persisted.
struct TempFile {
    path: PathBuf,
    keep: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Writes one GGUF file; see the module docs.
pub struct GgufWriter {
    dest: PathBuf,
    tmp: TempFile,
    out: BufWriter<File>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    /// Index of the tensor being written and bytes of it written so far.
    current: usize,
    written: u64,
}

impl GgufWriter {
    /// Start writing `dest` (GGUF v3).
    pub fn create(dest: impl AsRef<Path>, metadata: &Metadata, tensors: &[TensorSpec]) -> Result<GgufWriter> {
        Self::create_version(dest, 3, metadata, tensors)
    }

    pub fn create_version(
        dest: impl AsRef<Path>,
        version: u32,
        metadata: &Metadata,
        tensors: &[TensorSpec],
    ) -> Result<GgufWriter> {
        let dest = dest.as_ref().to_path_buf();
        let werr = |problem: String| GgufError::Write {
            path: dest.clone(),
            problem,
        };
        let (header, infos) = encode_header(version, metadata, tensors).map_err(werr)?;
        let alignment = alignment_of(metadata).map_err(werr)?;
        let file_name = dest
            .file_name()
            .ok_or_else(|| werr("destination has no file name".into()))?
            .to_string_lossy()
            .into_owned();
        if dest.is_dir() {
            return Err(werr("destination is a directory".into()));
        }
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let io = |op, source| GgufError::Io {
            path: dest.clone(),
            op,
            source,
        };
        let mut n = 0u32;
        let (file, tmp_path) = loop {
            let tmp_path = dir.join(format!(".{file_name}.{}.{n}.tmp", std::process::id()));
            match OpenOptions::new().write(true).create_new(true).open(&tmp_path) {
                Ok(f) => break (f, tmp_path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(io("create temporary file", e)),
            }
        };
        let tmp = TempFile {
            path: tmp_path,
            keep: false,
        };
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&header).map_err(|e| io("write header", e))?;
        Ok(GgufWriter {
            dest,
            tmp,
            out,
            tensors: infos,
            alignment,
            current: 0,
            written: 0,
        })
    }

    /// The tensor infos with their assigned offsets.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Index of the tensor whose data is expected next (== number of tensors when done).
    pub fn next_tensor(&self) -> usize {
        self.current
    }

    fn io(&self, op: &'static str, source: std::io::Error) -> GgufError {
        GgufError::Io {
            path: self.dest.clone(),
            op,
            source,
        }
    }

    fn pad_current(&mut self) -> Result<()> {
        let size = self.written;
        let pad = size.div_ceil(self.alignment) * self.alignment - size;
        const ZEROS: [u8; 256] = [0; 256];
        let mut left = pad as usize;
        while left > 0 {
            let n = left.min(ZEROS.len());
            self.out
                .write_all(&ZEROS[..n])
                .map_err(|e| self.io("write padding", e))?;
            left -= n;
        }
        Ok(())
    }

    /// Move past tensors that hold no data (a dimension of 0) when no byte of them is written.
    fn skip_empty_tensors(&mut self) {
        while self.written == 0 && self.tensors.get(self.current).is_some_and(|t| t.n_bytes() == Some(0)) {
            self.current += 1;
        }
    }

    /// Append bytes of tensor data. A call may cover part of a tensor, or finish one tensor and
    /// continue into the next; tensors are filled in declaration order.
    pub fn write_data(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            self.skip_empty_tensors();
            let Some(t) = self.tensors.get(self.current) else {
                return Err(GgufError::Write {
                    path: self.dest.clone(),
                    problem: format!("{} bytes of tensor data beyond the last declared tensor", bytes.len()),
                });
            };
            let size = t.n_bytes().expect("checked in encode_header");
            let n = ((size - self.written) as usize).min(bytes.len());
            self.out
                .write_all(&bytes[..n])
                .map_err(|e| self.io("write tensor data", e))?;
            self.written += n as u64;
            bytes = &bytes[n..];
            if self.written == size {
                self.pad_current()?;
                self.current += 1;
                self.written = 0;
            }
        }
        Ok(())
    }

    /// Write the whole data of the next tensor; its length must match the declared size.
    pub fn write_tensor(&mut self, bytes: &[u8]) -> Result<()> {
        let Some(t) = self.tensors.get(self.current) else {
            return Err(GgufError::Write {
                path: self.dest.clone(),
                problem: "all declared tensors are already written".into(),
            });
        };
        let size = t.n_bytes().expect("checked");
        if self.written != 0 || bytes.len() as u64 != size {
            return Err(GgufError::Write {
                path: self.dest.clone(),
                problem: format!(
                    "tensor `{}` ({} {:?}) takes {size} bytes, got {}{}",
                    t.name,
                    t.ty,
                    t.shape,
                    bytes.len(),
                    if self.written != 0 {
                        " after a partial write"
                    } else {
                        ""
                    }
                ),
            });
        }
        if size == 0 {
            self.current += 1;
            return Ok(());
        }
        self.write_data(bytes)
    }

    /// Flush, fsync and atomically rename the file into place.
    pub fn finish(mut self) -> Result<()> {
        self.skip_empty_tensors();
        if self.current != self.tensors.len() {
            let t = &self.tensors[self.current];
            return Err(GgufError::Write {
                path: self.dest.clone(),
                problem: format!(
                    "tensor data incomplete: `{}` (#{} of {}) has {} of {} bytes",
                    t.name,
                    self.current,
                    self.tensors.len(),
                    self.written,
                    t.n_bytes().unwrap_or(0)
                ),
            });
        }
        self.out.flush().map_err(|e| self.io("flush", e))?;
        self.out.get_ref().sync_all().map_err(|e| self.io("fsync", e))?;
        std::fs::rename(&self.tmp.path, &self.dest).map_err(|e| self.io("rename into place", e))?;
        self.tmp.keep = true;
        if let Some(dir) = self.dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            // Make the rename durable; failure here is not fatal on filesystems without dir fsync.
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }
}
