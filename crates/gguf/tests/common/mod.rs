//! Helpers shared by the gguf integration tests.
#![allow(dead_code)]

use gguf::{Array, GgmlType, Metadata, TensorSpec, Value};
use std::path::PathBuf;

/// The real SmolLM2 GGUF fetched by `scripts/fetch-models`. Tests that need it fail (never skip)
/// when it is missing.
pub fn smollm2() -> PathBuf {
    let dir = std::env::var_os("HF2Q_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/hf2q/models"));
    let p = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-models first (the README's test command does)",
        p.display()
    );
    p
}

/// Seeded xorshift64* — deterministic, no dependency.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Metadata exercising every value type, empty and nested arrays, and non-ASCII strings.
pub fn every_value_type() -> Metadata {
    let mut m = Metadata::new();
    m.insert("general.architecture", Value::String("llama".into()));
    m.insert("t.u8", Value::U8(250));
    m.insert("t.i8", Value::I8(-100));
    m.insert("t.u16", Value::U16(65000));
    m.insert("t.i16", Value::I16(-32000));
    m.insert("t.u32", Value::U32(4_000_000_000));
    m.insert("t.i32", Value::I32(-2_000_000_000));
    m.insert("t.f32", Value::F32(1e-5));
    m.insert("t.f32_nan", Value::F32(f32::from_bits(0x7fc0_1234)));
    m.insert("t.bool", Value::Bool(true));
    m.insert("t.str", Value::String("héllo wörld ✓ \u{0}".into()));
    m.insert("t.empty_str", Value::String(String::new()));
    m.insert("t.u64", Value::U64(u64::MAX));
    m.insert("t.i64", Value::I64(i64::MIN));
    m.insert("t.f64", Value::F64(-1.0e300));
    m.insert("a.u8", Value::Array(Array::U8(vec![1, 2, 3])));
    m.insert("a.i8", Value::Array(Array::I8(vec![-1, 2])));
    m.insert("a.u16", Value::Array(Array::U16(vec![7])));
    m.insert("a.i16", Value::Array(Array::I16(vec![-7, 8])));
    m.insert("a.u32", Value::Array(Array::U32(vec![1, 2])));
    m.insert("a.i32", Value::Array(Array::I32(vec![-3])));
    m.insert("a.f32", Value::Array(Array::F32(vec![0.5, -0.25, f32::INFINITY])));
    m.insert("a.bool", Value::Array(Array::Bool(vec![true, false, true])));
    m.insert("a.str", Value::Array(Array::String(vec!["a", "", "ü"].into())));
    m.insert("a.u64", Value::Array(Array::U64(vec![u64::MAX, 0])));
    m.insert("a.i64", Value::Array(Array::I64(vec![i64::MIN])));
    m.insert("a.f64", Value::Array(Array::F64(vec![1.5])));
    m.insert("a.empty", Value::Array(Array::F32(vec![])));
    m.insert(
        "a.nested",
        Value::Array(Array::Array(vec![
            Array::I32(vec![1, 2, 3]),
            Array::String(vec!["x"].into()),
            Array::Array(vec![Array::U8(vec![9]), Array::Array(vec![])]),
            Array::Bool(vec![]),
        ])),
    );
    m
}

pub fn specs() -> Vec<TensorSpec> {
    vec![
        TensorSpec {
            name: "a".into(),
            ty: GgmlType::F32,
            shape: vec![3, 2],
        },
        TensorSpec {
            name: "b".into(),
            ty: GgmlType::Q4_0,
            shape: vec![64],
        },
        TensorSpec {
            name: "empty".into(),
            ty: GgmlType::F16,
            shape: vec![0],
        },
        TensorSpec {
            name: "c".into(),
            ty: GgmlType::Q4_K,
            shape: vec![256, 1, 1, 2],
        },
    ]
}

/// Deterministic bytes for tensor `i` of `n` bytes.
pub fn tensor_bytes(i: usize, n: u64) -> Vec<u8> {
    (0..n).map(|j| (j as usize * 31 + i * 7) as u8).collect()
}
