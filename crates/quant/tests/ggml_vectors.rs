//! Every codec against ggml's own output (`shared/fixtures/quant`, made with `ggml_quantize_chunk`
//! and `to_float` of llama.cpp b11434): quantized bytes equal with and without an importance
//! matrix, dequantized floats equal bit for bit. With `HF2Q_FIXTURES` set, the full fixture set is
//! used (and must exist); otherwise the committed `r512` subset in `tests/data/quant`.

use quant::GgmlType;
use serde_json::Value as J;
use std::path::PathBuf;

fn fixture_dir() -> PathBuf {
    match std::env::var_os("HF2Q_FIXTURES") {
        Some(d) => {
            let p = PathBuf::from(d).join("quant");
            assert!(
                p.join("manifest.json").is_file(),
                "HF2Q_FIXTURES is set but {} has no manifest.json",
                p.display()
            );
            p
        }
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant"),
    }
}

fn read_f32(p: &std::path::Path) -> Vec<f32> {
    let b = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Check one ggml type against every input set of the fixtures.
fn check_type(name: &str) {
    let dir = fixture_dir();
    let manifest: J = serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let ty = GgmlType::from_name(name).unwrap_or_else(|| panic!("unknown type {name}"));
    let mut checked = 0;
    for set in manifest["sets"].as_array().unwrap() {
        let Some(t) = set["types"].get(name) else { continue };
        let n_per_row = set["n_per_row"].as_u64().unwrap() as usize;
        let input = read_f32(&dir.join(set["input"].as_str().unwrap()));
        let imatrix = read_f32(&dir.join(set["imatrix"].as_str().unwrap()));
        let bs = ty.block_size() as usize;
        let bb = ty.type_size() as usize;
        let row_bytes = n_per_row / bs * bb;
        let codec = quant::codec(ty).unwrap_or_else(|| panic!("no codec for {name}"));
        assert_eq!(
            codec.requires_imatrix,
            t["requires_imatrix"].as_bool().unwrap(),
            "{name}: requires_imatrix"
        );
        for (variant, im) in [("plain", None), ("imatrix", Some(&imatrix[..]))] {
            let Some(v) = t.get(variant) else {
                // ggml cannot quantize this type without an imatrix: neither may we.
                assert_eq!(
                    quant::quantize(ty, &input, n_per_row, None),
                    Err(quant::QuantError::RequiresImatrix(ty)),
                    "{name} must refuse to quantize without an imatrix"
                );
                continue;
            };
            let expected = std::fs::read(dir.join(v["quantized"].as_str().unwrap())).unwrap();
            let got = quant::quantize(ty, &input, n_per_row, im).unwrap_or_else(|e| panic!("{name} {variant}: {e}"));
            assert_eq!(got.len(), expected.len(), "{name} {variant}: output size");
            if let Some(i) = got.iter().zip(&expected).position(|(a, b)| a != b) {
                let (row, in_row) = (i / row_bytes, i % row_bytes);
                let (block, byte) = (in_row / bb, in_row % bb);
                let b0 = row * row_bytes + block * bb;
                let desc = set["rows"].get(row).and_then(|r| r.as_str()).unwrap_or("?");
                panic!(
                    "{name} {variant} set {}: first difference at row {row} ({desc}), block {block}, byte {byte}\n  ggml: {:?}\n  hf2q: {:?}",
                    set["name"],
                    &expected[b0..b0 + bb],
                    &got[b0..b0 + bb]
                );
            }
            // The serial (single-threaded) path gives the same bytes.
            assert!(
                quant::quantize_serial(ty, &input, n_per_row, im).unwrap() == got,
                "{name}: serial vs parallel"
            );

            let deq_expected = read_f32(&dir.join(v["dequantized"].as_str().unwrap()));
            let deq = quant::dequantize(ty, &expected, input.len()).unwrap();
            if let Some(i) = deq
                .iter()
                .zip(&deq_expected)
                .position(|(a, b)| a.to_bits() != b.to_bits())
            {
                panic!(
                    "{name} {variant} dequantize set {}: value {i} (row {}, block {}): ggml {} ({:#010x}), hf2q {} ({:#010x})",
                    set["name"],
                    i / n_per_row,
                    (i % n_per_row) / bs,
                    deq_expected[i],
                    deq_expected[i].to_bits(),
                    deq[i],
                    deq[i].to_bits()
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 0, "no fixture vectors for {name}");
}

macro_rules! vector_tests {
    ($($fn_name:ident => $ty:literal,)*) => { $( #[test] fn $fn_name() { check_type($ty); } )* };
}

vector_tests! {
    f16 => "F16",
    bf16 => "BF16",
    q4_0 => "Q4_0",
    q4_1 => "Q4_1",
    q5_0 => "Q5_0",
    q5_1 => "Q5_1",
    q8_0 => "Q8_0",
    q2_k => "Q2_K",
    q3_k => "Q3_K",
    q4_k => "Q4_K",
    q5_k => "Q5_K",
    q6_k => "Q6_K",
    iq4_nl => "IQ4_NL",
    iq4_xs => "IQ4_XS",
    tq1_0 => "TQ1_0",
    tq2_0 => "TQ2_0",
    iq2_xxs => "IQ2_XXS",
    iq2_xs => "IQ2_XS",
    iq2_s => "IQ2_S",
    iq3_xxs => "IQ3_XXS",
    iq3_s => "IQ3_S",
    iq1_s => "IQ1_S",
    iq1_m => "IQ1_M",
    q1_0 => "Q1_0",
    q2_0 => "Q2_0",
    mxfp4 => "MXFP4",
    nvfp4 => "NVFP4",
}

#[test]
fn fixtures_cover_every_quantizable_type() {
    // Every type the fixtures hold is in the test list above, and vice versa.
    let manifest: J =
        serde_json::from_str(&std::fs::read_to_string(fixture_dir().join("manifest.json")).unwrap()).unwrap();
    let mut names: Vec<&str> = manifest["sets"][0]["types"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    names.sort();
    assert_eq!(names.len(), 27, "{names:?}");
}
