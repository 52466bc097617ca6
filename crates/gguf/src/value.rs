//! GGUF metadata values: the 13 value types, typed arrays (nested to any depth) and the
//! ordered key → value map of a file.

use indexmap::IndexMap;
use std::fmt;

/// The GGUF metadata value type ids (`gguf_type` in `ggml/include/gguf.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Short name used on the command line (`u32:7`) and in JSON output.
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "str",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    pub fn from_name(name: &str) -> Option<ValueType> {
        use ValueType::*;
        Some(match name {
            "u8" => U8,
            "i8" => I8,
            "u16" => U16,
            "i16" => I16,
            "u32" => U32,
            "i32" => I32,
            "f32" => F32,
            "bool" => Bool,
            "str" | "string" => String,
            "u64" => U64,
            "i64" => I64,
            "f64" => F64,
            _ => return None,
        })
    }

    /// Encoded size of a scalar of this type; strings and arrays have a fixed-size prefix only.
    pub fn min_encoded_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            String => 8,    // u64 length
            Array => 4 + 8, // element type + u64 count
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A homogeneous array. Arrays of arrays hold inner arrays that may each have their own
/// element type, as GGUF allows.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(StrArray),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Full type description, e.g. `u32`, `array[str]`, `array[array[i32]]`.
    pub fn type_string(&self) -> String {
        match self {
            Value::Array(a) => a.type_string(),
            v => v.value_type().name().to_string(),
        }
    }

    /// Integer value of any integer type, widened.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Unsigned integer value of any integer type that fits in u64.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Parse a command-line value of an explicit type (`u32` + `"7"`). Arrays are not accepted here.
    pub fn parse_typed(ty: ValueType, text: &str) -> Result<Value, String> {
        fn num<T: std::str::FromStr>(text: &str, ty: ValueType) -> Result<T, String> {
            text.trim()
                .parse::<T>()
                .map_err(|_| format!("`{text}` is not a valid {ty} value"))
        }
        Ok(match ty {
            ValueType::U8 => Value::U8(num(text, ty)?),
            ValueType::I8 => Value::I8(num(text, ty)?),
            ValueType::U16 => Value::U16(num(text, ty)?),
            ValueType::I16 => Value::I16(num(text, ty)?),
            ValueType::U32 => Value::U32(num(text, ty)?),
            ValueType::I32 => Value::I32(num(text, ty)?),
            ValueType::U64 => Value::U64(num(text, ty)?),
            ValueType::I64 => Value::I64(num(text, ty)?),
            ValueType::F32 => Value::F32(num(text, ty)?),
            ValueType::F64 => Value::F64(num(text, ty)?),
            ValueType::Bool => match text.trim() {
                "true" | "1" => Value::Bool(true),
                "false" | "0" => Value::Bool(false),
                _ => return Err(format!("`{text}` is not a valid bool value (use true or false)")),
            },
            ValueType::String => Value::String(text.to_string()),
            ValueType::Array => return Err("array values cannot be given on the command line".into()),
        })
    }
}

impl Array {
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `array[<elem>]`; for arrays of arrays the first inner array names the inner type
    /// (`array[array]` when there is none to look at).
    pub fn type_string(&self) -> String {
        match self {
            Array::Array(inner) => match inner.first() {
                Some(a) => format!("array[{}]", a.type_string()),
                None => "array[array]".to_string(),
            },
            a => format!("array[{}]", a.elem_type().name()),
        }
    }

    /// Element `i` as a scalar value (arrays of arrays yield `Value::Array`).
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(i)?),
            Array::I8(v) => Value::I8(*v.get(i)?),
            Array::U16(v) => Value::U16(*v.get(i)?),
            Array::I16(v) => Value::I16(*v.get(i)?),
            Array::U32(v) => Value::U32(*v.get(i)?),
            Array::I32(v) => Value::I32(*v.get(i)?),
            Array::F32(v) => Value::F32(*v.get(i)?),
            Array::Bool(v) => Value::Bool(*v.get(i)?),
            Array::String(v) => Value::String(v.get(i)?.to_string()),
            Array::Array(v) => Value::Array(v.get(i)?.clone()),
            Array::U64(v) => Value::U64(*v.get(i)?),
            Array::I64(v) => Value::I64(*v.get(i)?),
            Array::F64(v) => Value::F64(*v.get(i)?),
        })
    }

    pub fn as_strings(&self) -> Option<&StrArray> {
        match self {
            Array::String(v) => Some(v),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(v) => write!(f, "{v:?}"),
            Value::Array(a) => write!(f, "[{} x {}]", a.len(), a.type_string()),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

/// An array of strings stored in one buffer (vocabularies have 10^5 entries; one allocation
/// instead of one per token).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StrArray {
    buf: String,
    /// End offset in `buf` of each string.
    ends: Vec<usize>,
}

impl StrArray {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with_capacity(strings: usize, bytes: usize) -> Self {
        StrArray {
            buf: String::with_capacity(bytes),
            ends: Vec::with_capacity(strings),
        }
    }
    pub fn push(&mut self, s: &str) {
        self.buf.push_str(s);
        self.ends.push(self.buf.len());
    }
    pub fn len(&self) -> usize {
        self.ends.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.buf[start..end])
    }
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).expect("index in range"))
    }
    /// The first `n` strings (all of them if there are fewer).
    pub fn truncated(&self, n: usize) -> StrArray {
        self.iter().take(n).collect()
    }
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(String::from).collect()
    }
    pub fn shrink_to_fit(&mut self) {
        self.buf.shrink_to_fit();
        self.ends.shrink_to_fit();
    }
}

impl fmt::Debug for StrArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<S: AsRef<str>> FromIterator<S> for StrArray {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut a = StrArray::new();
        for s in iter {
            a.push(s.as_ref());
        }
        a
    }
}

impl<S: AsRef<str>> From<Vec<S>> for StrArray {
    fn from(v: Vec<S>) -> Self {
        v.into_iter().collect()
    }
}

/// The ordered metadata of a GGUF file. Order is kept so that a file can be rewritten byte for byte.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: IndexMap<String, Value>,
}

impl Metadata {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.get(key)
    }
    pub fn contains_key(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }
    /// Insert or replace; a replaced key keeps its position, a new key goes to the end.
    pub fn insert(&mut self, key: impl Into<String>, value: Value) -> Option<Value> {
        self.entries.insert(key.into(), value)
    }
    /// Remove a key, keeping the order of the others.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        self.entries.shift_remove(key)
    }
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(|k| k.as_str())
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(Value::as_bool)
    }
    pub fn get_array(&self, key: &str) -> Option<&Array> {
        self.get(key).and_then(Value::as_array)
    }

    /// `general.architecture`, the prefix of most model keys.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str(crate::keys::ARCHITECTURE)
    }
}

impl FromIterator<(String, Value)> for Metadata {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Self {
        Metadata {
            entries: iter.into_iter().collect(),
        }
    }
}
