//! A sequence's logits do not depend on what is batched with it: the real Gemma 3 270M (Q4_K_M:
//! Q8_0, Q5_0, Q4_K and Q6_K matrices) and SmolLM2 (Q4_1) decode the same bits alone and in a
//! step with other sequences' prefill and decode rows, which is what lets the server promise the
//! same reply under load. The same for a MoE (the Qwen3-MoE fixture in Q4_K_M), whose experts
//! multiply rows from several sequences together.

mod common;

use engine::backend::cpu::Cpu;
use engine::backend::KvType;
use engine::model::{Logits, Model, SeqStep};
use std::sync::Arc;

fn run(m: &dyn Model<Cpu>, prompts: &[Vec<u32>], steps: usize) -> Vec<Vec<Vec<f32>>> {
    let mut scratch = m.scratch(256);
    let mut kvs: Vec<_> = prompts.iter().map(|_| m.new_kv(128, KvType::F16).unwrap()).collect();
    let mut out = vec![Vec::new(); prompts.len()];
    let mut next: Vec<Vec<u32>> = prompts.to_vec();
    let mut pos = vec![0usize; prompts.len()];
    for _ in 0..steps {
        let mut seqs: Vec<SeqStep<'_, Cpu>> = kvs
            .iter_mut()
            .zip(&next)
            .zip(&pos)
            .map(|((kv, t), &p)| SeqStep {
                kv,
                tokens: t,
                pos0: p,
                logits: Logits::Last,
            })
            .collect();
        let l = m.forward(&mut scratch, &mut seqs).unwrap();
        drop(seqs);
        for (i, row) in l.into_iter().enumerate() {
            pos[i] += next[i].len();
            next[i] = vec![engine::sampler::argmax(&row)];
            out[i].push(row);
        }
    }
    out
}

fn check(path: &std::path::Path) {
    let gguf = engine::model::open_gguf(path).unwrap();
    let m = engine::model::load(Arc::new(Cpu::new(2).unwrap()), &gguf, path).unwrap();
    let n_vocab = m.info().n_vocab as u32;
    let prompts: Vec<Vec<u32>> = [
        (1..6).map(|i| 100 + i * 7).collect(),
        (1..12).map(|i| 300 + i * 5).collect(),
        vec![2000, 17],
        (1..30).map(|i| 900 + i).collect::<Vec<u32>>(),
    ]
    .into_iter()
    .map(|p| p.into_iter().map(|t| t % n_vocab).collect())
    .collect();
    let together = run(&*m, &prompts, 6);
    for (i, p) in prompts.iter().enumerate() {
        let alone = run(&*m, std::slice::from_ref(p), 6);
        for (s, (a, b)) in alone[0].iter().zip(&together[i]).enumerate() {
            assert!(
                a == b,
                "{}: sequence {i}, step {s}: logits differ alone and batched",
                path.display()
            );
        }
    }
}

#[test]
fn gemma3_logits_do_not_depend_on_the_batch() {
    let p = common::models_dir().join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-models first",
        p.display()
    );
    check(&p);
}

#[test]
fn smollm2_logits_do_not_depend_on_the_batch() {
    check(&common::smollm2());
}

/// A random Qwen3-MoE checkpoint (f32 safetensors) with the fixture's tokenizer, wide enough
/// (512) that a row spans two K-quant super-blocks, so the order in which a kernel sums them can
/// depend on how many rows it multiplies together (the fixture's 256-wide rows cannot show it).
fn write_moe_checkpoint(fixture: &std::path::Path, dir: &std::path::Path) {
    let (e, ff, n_exp, hd, vocab) = (512usize, 512usize, 8usize, 64usize, 1024usize);
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap()).unwrap();
    for (k, v) in [
        ("hidden_size", e),
        ("intermediate_size", ff),
        ("moe_intermediate_size", ff),
        ("num_experts", n_exp),
        ("num_attention_heads", 8),
        ("num_key_value_heads", 2),
        ("head_dim", hd),
        ("num_hidden_layers", 2),
    ] {
        cfg[k] = serde_json::json!(v);
    }
    cfg["dtype"] = serde_json::json!("float32");
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture.join(f), dir.join(f)).unwrap();
    }
    let mut tensors: Vec<(String, Vec<usize>)> = vec![("model.embed_tokens.weight".into(), vec![vocab, e])];
    for l in 0..2 {
        let p = |s: &str| format!("model.layers.{l}.{s}.weight");
        tensors.push((p("input_layernorm"), vec![e]));
        tensors.push((p("post_attention_layernorm"), vec![e]));
        tensors.push((p("self_attn.q_proj"), vec![8 * hd, e]));
        tensors.push((p("self_attn.k_proj"), vec![2 * hd, e]));
        tensors.push((p("self_attn.v_proj"), vec![2 * hd, e]));
        tensors.push((p("self_attn.o_proj"), vec![e, 8 * hd]));
        tensors.push((p("self_attn.q_norm"), vec![hd]));
        tensors.push((p("self_attn.k_norm"), vec![hd]));
        tensors.push((p("mlp.gate"), vec![n_exp, e]));
        for x in 0..n_exp {
            tensors.push((p(&format!("mlp.experts.{x}.gate_proj")), vec![ff, e]));
            tensors.push((p(&format!("mlp.experts.{x}.up_proj")), vec![ff, e]));
            tensors.push((p(&format!("mlp.experts.{x}.down_proj")), vec![e, ff]));
        }
    }
    tensors.push(("model.norm.weight".into(), vec![e]));
    // safetensors: u64 header length, JSON header, then the data.
    let mut header = serde_json::Map::new();
    let mut data: Vec<u8> = Vec::new();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for (name, shape) in &tensors {
        let n: usize = shape.iter().product();
        let start = data.len();
        let norm = shape.len() == 1;
        for _ in 0..n {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            let v = if norm { 1.0 + 0.2 * u } else { 0.08 * u };
            data.extend_from_slice(&v.to_le_bytes());
        }
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let h = serde_json::Value::Object(header).to_string().into_bytes();
    let mut file = (h.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&h);
    file.extend_from_slice(&data);
    std::fs::write(dir.join("model.safetensors"), file).unwrap();
}

#[test]
fn moe_logits_do_not_depend_on_the_batch() {
    let Some(root) = std::env::var_os("HF2Q_FIXTURES").map(|d| std::path::PathBuf::from(d).join("tiny")) else {
        eprintln!(
            "NOT RUN: MoE batch invariance (set HF2Q_FIXTURES to the full fixtures for tiny/qwen3_moe's tokenizer)"
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let hf = tmp.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    write_moe_checkpoint(&root.join("qwen3_moe"), &hf);
    let out = tmp.path().join("moe.Q4_K_M.gguf");
    convert::pipeline::convert(
        &hf,
        &out,
        convert::plan::Target::parse("Q4_K_M").unwrap(),
        &convert::requant::QuantizeOptions::default(),
    )
    .unwrap();
    check(&out);
}
