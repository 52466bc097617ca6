//! Writing then reading reproduces metadata and tensors; reading then writing reproduces the
//! file byte for byte (synthetic files and the real SmolLM2 GGUF).

mod common;
use common::*;
use gguf::{GgufFile, GgufWriter, TensorSpec, Value};

fn write_synthetic(path: &std::path::Path, m: &gguf::Metadata, version: u32) {
    let specs = specs();
    let mut w = GgufWriter::create_version(path, version, m, &specs).unwrap();
    for (i, t) in w.tensors().to_vec().iter().enumerate() {
        w.write_tensor(&tensor_bytes(i, t.n_bytes().unwrap())).unwrap();
    }
    w.finish().unwrap();
}

fn rewrite(src: &GgufFile, dest: &std::path::Path) {
    gguf::rewrite::rewrite_with_metadata(src, src.metadata(), dest).unwrap();
}

#[test]
fn every_value_type_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    for (alignment, version) in [(None, 3), (Some(64u32), 3), (Some(1), 3), (Some(4096), 2)] {
        let mut m = every_value_type();
        if let Some(a) = alignment {
            m.insert("general.alignment", Value::U32(a));
        }
        let p = dir.path().join(format!("v{version}-a{alignment:?}.gguf"));
        write_synthetic(&p, &m, version);
        let f = GgufFile::open(&p).unwrap();
        assert_eq!(f.version(), version);
        // NaN payloads compare unequal; compare bit patterns for that key and values for the rest.
        for (k, v) in m.iter() {
            let got = f.metadata().get(k).unwrap_or_else(|| panic!("key {k} missing"));
            match (v, got) {
                (Value::F32(a), Value::F32(b)) => assert_eq!(a.to_bits(), b.to_bits(), "{k}"),
                _ => assert_eq!(v, got, "{k}"),
            }
        }
        assert_eq!(
            f.metadata().keys().collect::<Vec<_>>(),
            m.keys().collect::<Vec<_>>(),
            "key order"
        );
        let a = u64::from(alignment.unwrap_or(32));
        assert_eq!(f.header().alignment, a);
        assert_eq!(f.header().data_offset % a, 0);
        for (i, (t, s)) in f.tensors().iter().zip(specs()).enumerate() {
            assert_eq!(TensorSpec::from(t), s);
            assert_eq!(t.offset % a, 0);
            assert_eq!(
                f.tensor_data(t),
                tensor_bytes(i, t.n_bytes().unwrap()),
                "tensor {}",
                t.name
            );
        }
        // read → write reproduces the file exactly
        let p2 = dir.path().join("again.gguf");
        rewrite(&f, &p2);
        assert_eq!(
            std::fs::read(&p).unwrap(),
            std::fs::read(&p2).unwrap(),
            "byte-identical rewrite (alignment {a})"
        );
    }
}

#[test]
fn no_tensors_file_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("vocab-only.gguf");
    let m = every_value_type();
    GgufWriter::create(&p, &m, &[]).unwrap().finish().unwrap();
    let f = GgufFile::open(&p).unwrap();
    assert!(f.tensors().is_empty());
    assert_eq!(f.metadata().len(), m.len());
}

#[test]
fn smollm2_round_trips_byte_for_byte() {
    let src = smollm2();
    let f = GgufFile::open(&src).unwrap();
    assert_eq!(f.tensors().len(), 272);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("copy.gguf");
    rewrite(&f, &out);
    let (a, b) = (std::fs::read(&src).unwrap(), std::fs::read(&out).unwrap());
    assert_eq!(a.len(), b.len(), "file size");
    if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
        panic!("first differing byte at offset {i}");
    }
}
