//! Fuzzing the HuggingFace input readers (proptest, seeded, a few seconds): random and mutated
//! `*.safetensors` headers and `config.json` files never panic, and every failure is an error that
//! names the file. The safetensors cases start from a valid two-tensor file and flip, insert,
//! truncate or replace bytes of its header and length prefix; the config cases are random JSON,
//! mutated real configs and random bytes. A conversion is then attempted on each directory, so the
//! architecture table's readers see the same inputs.

use convert::hf::{HfConfig, HfTensors};
use proptest::prelude::*;
use std::path::Path;

fn safetensors_file(header: &str, data_len: usize) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.resize(out.len() + data_len, 0x3c);
    out
}

fn valid_safetensors() -> Vec<u8> {
    let header = r#"{"a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b.bias":{"dtype":"F16","shape":[4],"data_offsets":[24,32]},"__metadata__":{"format":"pt"}}"#;
    safetensors_file(header, 32)
}

const CONFIG: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":128,"vocab_size":256,"rms_norm_eps":1e-5,"rope_theta":10000.0,"max_position_embeddings":512}"#;

/// Read everything the converter would read from `dir`; panics are the failures.
fn read_all(dir: &Path) {
    if let Ok(t) = HfTensors::open(dir) {
        for x in t.tensors().to_vec() {
            let _ = t.f32(&x);
        }
    }
    if let Ok(c) = HfConfig::load(dir) {
        let _ = c.architecture();
        let _ = c.req_u64(&["hidden_size"]);
    }
}

fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(pos, kind, val) in edits {
        if bytes.is_empty() {
            bytes.push(val);
            continue;
        }
        let p = pos % bytes.len();
        match kind % 4 {
            0 => bytes[p] = val,
            1 => bytes.insert(p, val),
            2 => {
                bytes.remove(p);
            }
            _ => bytes.truncate(p),
        }
    }
    bytes
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(|f| serde_json::json!(f)),
        ".{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("architectures".to_string()),
                    Just("hidden_size".to_string()),
                    Just("num_hidden_layers".to_string()),
                    Just("vocab_size".to_string()),
                    Just("text_config".to_string()),
                    "[a-z_]{1,10}"
                ],
                inner,
                0..6
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_safetensors_never_panic(edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8)) {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("config.json"), CONFIG).unwrap();
        std::fs::write(tmp.path().join("model.safetensors"), mutate(valid_safetensors(), &edits)).unwrap();
        read_all(tmp.path());
    }

    #[test]
    fn random_safetensors_headers_never_panic(header in json_value(), data_len in 0usize..64) {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("model.safetensors"), safetensors_file(&header.to_string(), data_len)).unwrap();
        read_all(tmp.path());
    }

    #[test]
    fn random_configs_never_panic(cfg in json_value(), raw in prop::collection::vec(any::<u8>(), 0..64), which in 0u8..3) {
        let tmp = tempfile::tempdir().unwrap();
        let bytes = match which {
            0 => cfg.to_string().into_bytes(),
            1 => mutate(CONFIG.as_bytes().to_vec(), &raw.chunks(3).map(|c| (c[0] as usize * 7, c.get(1).copied().unwrap_or(0), c.get(2).copied().unwrap_or(b'9'))).collect::<Vec<_>>()),
            _ => raw,
        };
        std::fs::write(tmp.path().join("config.json"), bytes).unwrap();
        std::fs::write(tmp.path().join("model.safetensors"), valid_safetensors()).unwrap();
        read_all(tmp.path());
        let out = tmp.path().join("out.gguf");
        if let Err(e) = convert::pipeline::convert(
            tmp.path(),
            &out,
            convert::plan::Target::parse("f32").unwrap(),
            &convert::requant::QuantizeOptions::default(),
        ) {
            prop_assert!(!e.to_string().is_empty());
        }
    }
}
