//! Split models open as one; files larger than 4 GiB are read with 64-bit offsets; a failed or
//! abandoned write leaves nothing under the final name.

mod common;
use common::*;
use gguf::{GgmlType, GgufError, GgufFile, GgufModel, GgufWriter, Metadata, TensorSpec, Value};
use std::path::Path;

fn write_shard(path: &Path, no: u16, count: u16, total: i32, tensors: &[(&str, u64)]) {
    let mut m = Metadata::new();
    m.insert("general.architecture", Value::String("llama".into()));
    m.insert("split.no", Value::U16(no));
    m.insert("split.count", Value::U16(count));
    m.insert("split.tensors.count", Value::I32(total));
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|(n, len)| TensorSpec {
            name: n.to_string(),
            ty: GgmlType::F32,
            shape: vec![*len],
        })
        .collect();
    let mut w = GgufWriter::create(path, &m, &specs).unwrap();
    for (i, (_, len)) in tensors.iter().enumerate() {
        w.write_tensor(&tensor_bytes(i + no as usize * 10, len * 4)).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn split_model_opens_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let p = |i| dir.path().join(format!("m-{i:05}-of-00003.gguf"));
    write_shard(&p(1), 0, 3, 4, &[("a", 8), ("b", 4)]);
    write_shard(&p(2), 1, 3, 4, &[("c", 16)]);
    write_shard(&p(3), 2, 3, 4, &[("d", 2)]);
    // Any shard may be named.
    for start in [p(1), p(2)] {
        let m = GgufModel::open(&start).unwrap();
        assert_eq!(m.files().len(), 3);
        assert_eq!(
            m.tensors().map(|(_, t)| t.name.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c", "d"]
        );
        assert_eq!(m.tensor_data("c").unwrap(), tensor_bytes(10, 64));
        assert_eq!(m.tensor_data("d").unwrap(), tensor_bytes(20, 8));
    }
    // A missing shard is named.
    std::fs::remove_file(p(3)).unwrap();
    let e = GgufModel::open(p(1)).err().unwrap().to_string();
    assert!(e.contains("shard 3 of 3 is missing"), "{e}");
    // A shard that claims the wrong position.
    write_shard(&p(3), 1, 3, 4, &[("d", 2)]);
    let e = GgufModel::open(p(1)).err().unwrap().to_string();
    assert!(e.contains("expected `split.no` = 2"), "{e}");
    // Wrong total.
    write_shard(&p(3), 2, 3, 4, &[("d", 2)]);
    write_shard(&p(1), 0, 3, 5, &[("a", 8), ("b", 4)]);
    let e = GgufModel::open(p(1)).err().unwrap().to_string();
    assert!(e.contains("`split.tensors.count` is 5 but the shards hold 4"), "{e}");
}

#[test]
fn single_file_model() {
    let m = GgufModel::open(smollm2()).unwrap();
    assert_eq!(m.files().len(), 1);
    assert_eq!(m.n_tensors(), 272);
    assert_eq!(m.tensor_data("output_norm.weight").unwrap().len(), 576 * 4);
}

#[test]
fn file_larger_than_4_gib() {
    // A sparse file: a 4.5 GiB F32 tensor followed by a small one past the 4 GiB mark.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.gguf");
    let mut m = Metadata::new();
    m.insert("general.architecture", Value::String("llama".into()));
    let big = 4608u64 << 20; // bytes
    let specs = [
        TensorSpec {
            name: "big".into(),
            ty: GgmlType::F32,
            shape: vec![1 << 20, big / 4 / (1 << 20)],
        },
        TensorSpec {
            name: "tail".into(),
            ty: GgmlType::F32,
            shape: vec![8],
        },
    ];
    let (header, infos) = gguf::writer::encode_header(3, &m, &specs).unwrap();
    let f = std::fs::File::create(&path).unwrap();
    use std::io::{Seek, SeekFrom, Write};
    let mut f = f;
    f.write_all(&header).unwrap();
    let tail_at = header.len() as u64 + infos[1].offset;
    assert!(tail_at > 1 << 32);
    f.seek(SeekFrom::Start(tail_at)).unwrap();
    f.write_all(&tensor_bytes(0, 32)).unwrap();
    f.set_len(tail_at + 32).unwrap();
    drop(f);
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.tensor("big").unwrap().n_bytes(), Some(big));
    assert_eq!(g.tensor_data(g.tensor("tail").unwrap()), tensor_bytes(0, 32));
    assert!(g.file_size() > 1 << 32);
}

#[test]
fn abandoned_or_failed_write_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("out.gguf");
    let m = every_value_type();
    // Dropped before finish: no file under the final name, no temporary left behind.
    {
        let mut w = GgufWriter::create(&dest, &m, &specs()).unwrap();
        w.write_data(&[1, 2, 3]).unwrap();
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // Wrong data size and finishing early are errors, and still leave nothing.
    let mut w = GgufWriter::create(&dest, &m, &specs()).unwrap();
    let e = w.write_tensor(&[0; 5]).unwrap_err();
    assert!(e.to_string().contains("takes 24 bytes, got 5"), "{e}");
    let e = w.finish().unwrap_err();
    assert!(
        matches!(e, GgufError::Write { .. }) && e.to_string().contains("incomplete"),
        "{e}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // An existing file is untouched by a failed rewrite.
    std::fs::write(&dest, b"precious").unwrap();
    drop(GgufWriter::create(&dest, &m, &specs()).unwrap());
    assert_eq!(std::fs::read(&dest).unwrap(), b"precious");
    // Unwritable destination directory.
    let e = GgufWriter::create(dir.path().join("no/such/dir/x.gguf"), &m, &[])
        .err()
        .unwrap();
    assert!(e.to_string().contains("create temporary file"), "{e}");
    // Invalid declarations are refused before anything is written.
    let long = TensorSpec {
        name: "x".repeat(64),
        ty: GgmlType::F32,
        shape: vec![1],
    };
    assert!(GgufWriter::create(&dest, &m, &[long])
        .err()
        .unwrap()
        .to_string()
        .contains("at most 63"));
    let bad = TensorSpec {
        name: "q".into(),
        ty: GgmlType::Q4_K,
        shape: vec![100],
    };
    assert!(GgufWriter::create(&dest, &m, &[bad])
        .err()
        .unwrap()
        .to_string()
        .contains("whole number of q4_K blocks"));
}
