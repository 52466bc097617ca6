//! Each kind of malformed file yields an error that names what was wrong and where.

mod common;
use gguf::{parse_header, GgufError, GgufFile};
use std::path::Path;

/// Little-endian GGUF byte builder for hand-made (and deliberately broken) files.
#[derive(Default)]
struct B(Vec<u8>);
impl B {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> B {
        let mut b = B::default();
        b.0.extend_from_slice(b"GGUF");
        b.u32(version).u64(n_tensors).u64(n_kv);
        b
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn s(&mut self, v: &str) -> &mut Self {
        self.u64(v.len() as u64);
        self.0.extend_from_slice(v.as_bytes());
        self
    }
    /// key of type u32
    fn kv_u32(&mut self, k: &str, v: u32) -> &mut Self {
        self.s(k).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, shape: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.s(name).u32(shape.len() as u32);
        for d in shape {
            self.u64(*d);
        }
        self.u32(ty).u64(offset)
    }
    fn pad_to(&mut self, a: usize) -> &mut Self {
        while !self.0.len().is_multiple_of(a) {
            self.0.push(0);
        }
        self
    }
    fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

fn err(b: &B) -> String {
    match parse_header(&b.0, Path::new("x.gguf")) {
        Ok(h) => panic!("expected an error, parsed {h:?}"),
        Err(e) => e.to_string(),
    }
}

fn assert_err(b: &B, needles: &[&str]) {
    let e = err(b);
    for n in needles {
        assert!(e.contains(n), "error `{e}` should contain `{n}`");
    }
    assert!(e.starts_with("x.gguf: "), "error names the file: {e}");
}

#[test]
fn valid_minimal_file_parses() {
    let mut b = B::header(3, 1, 1);
    b.kv_u32("k", 1).tensor("t", &[8], 0, 0).pad_to(32).zeros(32);
    let h = parse_header(&b.0, Path::new("x.gguf")).unwrap();
    assert_eq!(h.tensors[0].name, "t");
}

#[test]
fn bad_magic() {
    let b = B(b"GGML\x03\0\0\0".to_vec());
    assert_err(&b, &["not a GGUF file", "magic", "\"GGML\""]);
    assert_err(&B(vec![]), &["empty file"]);
}

#[test]
fn unsupported_versions() {
    assert_err(&B::header(1, 0, 0), &["version 1", "v1"]);
    assert_err(&B::header(4, 0, 0), &["unsupported GGUF version 4"]);
    assert_err(&B::header(3u32.swap_bytes(), 0, 0), &["big-endian"]);
}

#[test]
fn truncated_header() {
    let b = B(B::header(3, 0, 0).0[..10].to_vec());
    assert_err(
        &b,
        &["truncated", "tensor count", "offset 8", "needs 8 bytes", "ends at 10"],
    );
}

#[test]
fn absurd_counts() {
    assert_err(&B::header(3, 0, u64::MAX), &["metadata key/value count", "cannot fit"]);
    assert_err(&B::header(3, 1 << 40, 0), &["tensor count", "cannot fit"]);
}

#[test]
fn absurd_string_length() {
    let mut b = B::header(3, 0, 1);
    b.u64(u64::MAX - 3).zeros(16);
    assert_err(&b, &["metadata entry 0 key", "string length", "exceeds"]);
}

#[test]
fn unknown_value_type() {
    let mut b = B::header(3, 0, 1);
    b.s("my.key").u32(13).u32(0);
    assert_err(&b, &["`my.key`", "unknown value type 13"]);
}

#[test]
fn absurd_array_length() {
    let mut b = B::header(3, 0, 1);
    b.s("arr").u32(9).u32(8).u64(1 << 50);
    assert_err(&b, &["`arr`", "array of 1125899906842624 str elements"]);
}

#[test]
fn invalid_bool_and_utf8() {
    let mut b = B::header(3, 0, 1);
    b.s("flag").u32(7);
    b.0.push(2);
    assert_err(&b, &["`flag`", "bool value must be 0 or 1, found 2"]);
    let mut b = B::header(3, 0, 1);
    b.s("s").u32(8).u64(2);
    b.0.extend_from_slice(&[0xff, 0xfe]);
    assert_err(&b, &["`s`", "not valid UTF-8"]);
}

#[test]
fn deep_nesting_is_refused() {
    let mut b = B::header(3, 0, 1);
    b.s("deep").u32(9);
    for _ in 0..40 {
        b.u32(9).u64(1);
    }
    b.u32(4).u64(0);
    assert_err(&b, &["`deep`", "nested deeper"]);
}

#[test]
fn duplicate_key() {
    let mut b = B::header(3, 0, 2);
    b.kv_u32("dup", 1).kv_u32("dup", 2);
    assert_err(&b, &["`dup`", "duplicate key", "offset 43"]);
}

#[test]
fn bad_alignment() {
    let mut b = B::header(3, 0, 1);
    b.kv_u32("general.alignment", 48);
    assert_err(&b, &["general.alignment", "power of two", "48"]);
    let mut b = B::header(3, 0, 1);
    b.s("general.alignment").u32(10).u64(32);
    assert_err(&b, &["general.alignment", "u32 power of two", "u64"]);
}

#[test]
fn duplicate_tensor_name() {
    let mut b = B::header(3, 2, 0);
    b.tensor("t", &[8], 0, 0).tensor("t", &[8], 0, 32).pad_to(32).zeros(64);
    assert_err(&b, &["`t`", "duplicate tensor name"]);
}

#[test]
fn unknown_ggml_type() {
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[32], 31, 0).pad_to(32).zeros(32);
    assert_err(&b, &["`w`", "unknown ggml type id 31"]);
}

#[test]
fn too_many_dims() {
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[1, 1, 1, 1, 1], 0, 0);
    assert_err(&b, &["`w`", "5 dimensions"]);
}

#[test]
fn row_not_multiple_of_block() {
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[100], 12, 0).pad_to(32).zeros(4096);
    assert_err(&b, &["`w`", "row length 100", "q4_K block size 256"]);
}

#[test]
fn misaligned_tensor_offset() {
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[4], 0, 4).pad_to(32).zeros(64);
    assert_err(&b, &["`w`", "data offset 4 is not a multiple of the alignment 32"]);
}

#[test]
fn overlapping_tensors() {
    let mut b = B::header(3, 2, 0);
    b.tensor("a", &[16], 0, 0)
        .tensor("b", &[8], 0, 32)
        .pad_to(32)
        .zeros(128);
    assert_err(&b, &["`b`", "overlaps tensor `a`"]);
}

#[test]
fn data_past_end_of_file() {
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[1024], 0, 0).pad_to(32).zeros(100);
    assert_err(&b, &["truncated", "data of tensor `w`", "needs 4096 bytes"]);
}

#[test]
fn shape_overflow() {
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[1 << 40, 1 << 40], 0, 0).pad_to(32);
    assert_err(&b, &["`w`", "overflows"]);
}

#[test]
fn file_level_errors() {
    let dir = tempfile::tempdir().unwrap();
    let e = GgufFile::open(dir.path()).err().unwrap();
    assert!(e.to_string().contains("is a directory"), "{e}");
    let e = GgufFile::open(dir.path().join("missing.gguf")).err().unwrap();
    assert!(matches!(e, GgufError::Io { .. }) && e.is_invalid_input(), "{e}");
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(GgufFile::open(&empty).err().unwrap().to_string().contains("empty file"));
}
