//! GGUF parsing and validation (`ggml/src/gguf.cpp` is the behaviour reference) and the
//! memory-mapped file view.
//!
//! Layout of a GGUF v2/v3 file (little-endian):
//! `"GGUF" | u32 version | u64 n_tensors | u64 n_kv | n_kv × (key, u32 type, value)
//!  | n_tensors × (name, u32 n_dims, n_dims × u64 ne, u32 ggml_type, u64 offset)
//!  | padding to alignment | tensor data (each tensor at data_start + offset)`.
//!
//! Every length and count read from the file is checked against the bytes that remain before
//! anything is allocated from it, so a corrupt or hostile file yields an error, never a panic or
//! an allocation larger than the file.

use crate::error::{GgufError, Result};
use crate::ggml_type::GgmlType;
use crate::keys;
use crate::value::{Array, Metadata, StrArray, Value, ValueType};
use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 4] = b"GGUF";
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays inside arrays that we accept.
pub const MAX_ARRAY_DEPTH: u32 = 16;

/// One tensor's entry in the tensor-info table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml `ne` order: row length first.
    pub shape: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Bytes of tensor data, or `None` if the row length is not a whole number of blocks or the
    /// size overflows.
    pub fn n_bytes(&self) -> Option<u64> {
        let row = self.ty.row_bytes(*self.shape.first().unwrap_or(&1))?;
        self.shape.iter().skip(1).try_fold(row, |acc, &d| acc.checked_mul(d))
    }
}

/// Everything before the tensor data.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
}

impl Header {
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Bounds-checked little-endian cursor. `ctx` closures build error context only on failure.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn truncated(&self, what: String, needed: u64) -> GgufError {
        GgufError::Truncated {
            path: self.path.to_path_buf(),
            what,
            offset: self.pos as u64,
            needed,
            file_size: self.buf.len() as u64,
        }
    }

    fn invalid(&self, what: String, offset: usize, problem: String) -> GgufError {
        GgufError::Invalid {
            path: self.path.to_path_buf(),
            what,
            offset: offset as u64,
            problem,
        }
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.truncated(what(), n));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A string as a slice of the input (validated UTF-8).
    fn str(&mut self, what: &dyn Fn() -> String) -> Result<&'a str> {
        let at = self.pos;
        let len = self.u64(&|| format!("{} (string length)", what()))?;
        if len > self.remaining() {
            return Err(self.invalid(
                what(),
                at,
                format!(
                    "string length {len} exceeds the {} bytes left in the file (corrupt or truncated)",
                    self.remaining()
                ),
            ));
        }
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map_err(|e| {
            self.invalid(
                what(),
                at,
                format!(
                    "string is not valid UTF-8 (invalid byte at string offset {})",
                    e.valid_up_to()
                ),
            )
        })
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        self.str(what).map(str::to_owned)
    }

    fn value_type(&mut self, what: &dyn Fn() -> String) -> Result<ValueType> {
        let at = self.pos;
        let id = self.u32(&|| format!("{} (value type)", what()))?;
        ValueType::from_id(id)
            .ok_or_else(|| self.invalid(what(), at, format!("unknown value type {id} (expected 0..=12)")))
    }

    fn value(&mut self, ty: ValueType, what: &dyn Fn() -> String, depth: u32) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => Value::Bool(self.bool(what)?),
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.array_value(what, depth)?),
        })
    }

    fn bool(&mut self, what: &dyn Fn() -> String) -> Result<bool> {
        let at = self.pos;
        match self.array::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.invalid(what(), at, format!("bool value must be 0 or 1, found {b}"))),
        }
    }

    fn array_value(&mut self, what: &dyn Fn() -> String, depth: u32) -> Result<Array> {
        let at = self.pos;
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.invalid(
                what(),
                at,
                format!("arrays nested deeper than {MAX_ARRAY_DEPTH} levels"),
            ));
        }
        let elem = self.value_type(&|| format!("{} (array element type)", what()))?;
        let count = self.u64(&|| format!("{} (array length)", what()))?;
        let min = count.checked_mul(elem.min_encoded_size());
        if min.is_none_or(|m| m > self.remaining()) {
            return Err(self.invalid(
                what(),
                at,
                format!(
                    "array of {count} {elem} elements needs at least {} bytes, but only {} remain in the file (corrupt or truncated)",
                    min.map_or("2^64".to_string(), |m| m.to_string()),
                    self.remaining()
                ),
            ));
        }
        // `count` is now bounded by the bytes left in the file.
        let n = count as usize;
        macro_rules! scalars {
            ($variant:ident, $t:ty) => {{
                let bytes = self.take(count * elem.min_encoded_size(), what)?;
                Array::$variant(
                    bytes
                        .chunks_exact(std::mem::size_of::<$t>())
                        .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk size")))
                        .collect(),
                )
            }};
        }
        Ok(match elem {
            ValueType::U8 => Array::U8(self.take(count, what)?.to_vec()),
            ValueType::I8 => Array::I8(self.take(count, what)?.iter().map(|&b| b as i8).collect()),
            ValueType::U16 => scalars!(U16, u16),
            ValueType::I16 => scalars!(I16, i16),
            ValueType::U32 => scalars!(U32, u32),
            ValueType::I32 => scalars!(I32, i32),
            ValueType::F32 => scalars!(F32, f32),
            ValueType::U64 => scalars!(U64, u64),
            ValueType::I64 => scalars!(I64, i64),
            ValueType::F64 => scalars!(F64, f64),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.bool(&|| format!("{} element {i}", what()))?);
                }
                Array::Bool(v)
            }
            ValueType::String => {
                // Grow with the data actually parsed rather than trusting `count` for the
                // allocation: a String is 24 bytes in memory but may be 8 bytes in the file.
                let mut v = StrArray::with_capacity(n.min(1 << 12), 0);
                for i in 0..n {
                    v.push(self.str(&|| format!("{} element {i}", what()))?);
                }
                v.shrink_to_fit();
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n.min(1 << 10));
                for i in 0..n {
                    v.push(self.array_value(&|| format!("{} element {i}", what()), depth + 1)?);
                }
                v.shrink_to_fit();
                Array::Array(v)
            }
        })
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

/// Parse and validate the header of a GGUF file held in `buf` (normally the whole mapped file).
/// `path` is only used in error messages. Tensor data ranges are checked against `buf.len()`.
pub fn parse_header(buf: &[u8], path: &Path) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0, path };
    if buf.len() < 4 || &buf[..4] != MAGIC {
        let found = if buf.is_empty() {
            "an empty file".to_string()
        } else {
            format!("{:?}", String::from_utf8_lossy(&buf[..buf.len().min(4)]))
        };
        return Err(GgufError::BadMagic {
            path: path.to_path_buf(),
            found,
        });
    }
    c.pos = 4;
    let version = c.u32(&|| "GGUF version".into())?;
    if version != 2 && version != 3 {
        let hint = if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
            " — this looks like a big-endian GGUF, which is not supported"
        } else if version == 1 {
            " — GGUF v1 files predate 64-bit counts; re-convert the model"
        } else {
            ""
        };
        return Err(GgufError::Version {
            path: path.to_path_buf(),
            version,
            hint,
        });
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata key/value count".into())?;

    // Minimum encoded sizes: a key/value is at least 8 (key length) + 4 (type) + 1 bytes; a
    // tensor info at least 8 + 4 + 4 + 8 bytes.
    let min_kv = n_kv.checked_mul(13);
    if min_kv.is_none_or(|m| m > c.remaining()) {
        return Err(c.invalid(
            "metadata key/value count".into(),
            16,
            format!(
                "{n_kv} entries cannot fit in the {} bytes left in the file",
                c.remaining()
            ),
        ));
    }
    let min_ti = n_tensors.checked_mul(24);
    if min_ti.is_none_or(|m| m > c.remaining()) {
        return Err(c.invalid(
            "tensor count".into(),
            8,
            format!(
                "{n_tensors} tensor infos cannot fit in the {} bytes left in the file",
                c.remaining()
            ),
        ));
    }

    let mut metadata = Metadata::new();
    let mut alignment_at = None;
    for i in 0..n_kv {
        let at = c.pos;
        let key = c.string(&|| format!("metadata entry {i} key"))?;
        let ty = c.value_type(&|| format!("metadata key `{key}`"))?;
        let value = c.value(ty, &|| format!("metadata key `{key}`"), 0)?;
        if key == keys::ALIGNMENT {
            alignment_at = Some(at);
        }
        if metadata.insert(key.clone(), value).is_some() {
            return Err(c.invalid(format!("metadata key `{key}`"), at, "duplicate key".into()));
        }
    }

    let alignment = match (metadata.get(keys::ALIGNMENT), alignment_at) {
        (None, _) => keys::DEFAULT_ALIGNMENT as u64,
        (Some(Value::U32(a)), _) if a.is_power_of_two() => *a as u64,
        (Some(v), at) => {
            return Err(c.invalid(
                format!("metadata key `{}`", keys::ALIGNMENT),
                at.unwrap_or(0),
                format!("expected a u32 power of two, found {} {v}", v.type_string()),
            ))
        }
    };

    let mut tensors = Vec::with_capacity((n_tensors as usize).min(1 << 14));
    let mut names = HashSet::new();
    let mut info_offsets = Vec::with_capacity(tensors.capacity());
    for i in 0..n_tensors {
        let at = c.pos;
        let name = c.string(&|| format!("tensor info {i} name"))?;
        let what = || format!("tensor info {i} (`{name}`)");
        let dims_at = c.pos;
        let n_dims = c.u32(&|| format!("{} dimension count", what()))?;
        if n_dims > MAX_DIMS {
            return Err(c.invalid(
                what(),
                dims_at,
                format!("{n_dims} dimensions, at most {MAX_DIMS} are allowed"),
            ));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            let ne = c.u64(&|| format!("{} dimension {d}", what()))?;
            if ne > i64::MAX as u64 {
                return Err(c.invalid(what(), dims_at, format!("dimension {d} is {ne}, larger than 2^63-1")));
            }
            shape.push(ne);
        }
        let type_at = c.pos;
        let type_id = c.u32(&|| format!("{} type", what()))?;
        let ty = GgmlType::from_id(type_id).ok_or_else(|| {
            c.invalid(
                what(),
                type_at,
                format!("unknown ggml type id {type_id} (this build knows ids 0-3, 6-30, 34, 35, 39-42)"),
            )
        })?;
        let offset = c.u64(&|| format!("{} data offset", what()))?;
        if !names.insert(name.clone()) {
            return Err(c.invalid(what(), at, "duplicate tensor name".into()));
        }
        info_offsets.push(at);
        tensors.push(TensorInfo {
            name,
            shape,
            ty,
            offset,
        });
    }

    let data_offset = align_up(c.pos as u64, alignment).expect("header position is small");
    let file_size = buf.len() as u64;
    if !tensors.is_empty() && data_offset > file_size {
        return Err(GgufError::Truncated {
            path: path.to_path_buf(),
            what: "padding before the tensor data section".into(),
            offset: c.pos as u64,
            needed: data_offset - c.pos as u64,
            file_size,
        });
    }

    // Validate each tensor's data range, then overlaps in offset order.
    let terr = |t: &TensorInfo, problem: String| GgufError::Tensor {
        path: path.to_path_buf(),
        tensor: t.name.clone(),
        problem,
    };
    let mut ranges = Vec::with_capacity(tensors.len());
    for t in &tensors {
        let ne0 = t.shape.first().copied().unwrap_or(1);
        if !ne0.is_multiple_of(t.ty.block_size()) {
            return Err(terr(
                t,
                format!(
                    "row length {ne0} is not a multiple of the {} block size {}",
                    t.ty,
                    t.ty.block_size()
                ),
            ));
        }
        let size = t
            .n_bytes()
            .ok_or_else(|| terr(t, format!("shape {:?} overflows the size of a file", t.shape)))?;
        if !t.offset.is_multiple_of(alignment) {
            return Err(terr(
                t,
                format!(
                    "data offset {} is not a multiple of the alignment {alignment}",
                    t.offset
                ),
            ));
        }
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(size));
        match end {
            Some(end) if end <= file_size => ranges.push((start.unwrap(), end, t)),
            _ => {
                return Err(GgufError::Truncated {
                    path: path.to_path_buf(),
                    what: format!("data of tensor `{}` ({} {:?})", t.name, t.ty, t.shape),
                    offset: start.unwrap_or(u64::MAX),
                    needed: size,
                    file_size,
                })
            }
        }
    }
    ranges.sort_by_key(|r| (r.0, r.1));
    for w in ranges.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if b.0 < a.1 {
            return Err(terr(
                b.2,
                format!(
                    "data [{}, {}) overlaps tensor `{}` at [{}, {})",
                    b.0, b.1, a.2.name, a.0, a.1
                ),
            ));
        }
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// A GGUF file mapped into memory, with its validated header.
pub struct GgufFile {
    path: PathBuf,
    map: Option<memmap2::Mmap>,
    header: Header,
}

impl GgufFile {
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let io = |op, source| GgufError::Io {
            path: path.to_path_buf(),
            op,
            source,
        };
        let meta = std::fs::metadata(path).map_err(|e| io("open", e))?;
        if meta.is_dir() {
            return Err(GgufError::Invalid {
                path: path.to_path_buf(),
                what: "path".into(),
                offset: 0,
                problem: "is a directory, expected a GGUF file".into(),
            });
        }
        let file = File::open(path).map_err(|e| io("open", e))?;
        let map = if meta.len() == 0 {
            None
        } else {
            // SAFETY: the map is read-only; we never hand out references that outlive `self`.
            // A file truncated by another process while mapped can still fault (as in every
            // mmap-based reader, llama.cpp included).
            Some(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io("mmap", e))?)
        };
        let bytes: &[u8] = map.as_deref().unwrap_or(&[]);
        let header = parse_header(bytes, path)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            header,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn header(&self) -> &Header {
        &self.header
    }
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }
    pub fn version(&self) -> u32 {
        self.header.version
    }
    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
    pub fn file_size(&self) -> u64 {
        self.bytes().len() as u64
    }

    /// Zero-copy view of a tensor's data (ranges were validated at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.header.data_offset + t.offset) as usize;
        let len = t.n_bytes().expect("validated at open") as usize;
        &self.bytes()[start..start + len]
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensor(name)
    }
}
