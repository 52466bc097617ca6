//! A sequence's logits do not depend on what is batched with it: the real Gemma 3 270M (Q4_K_M:
//! Q8_0, Q5_0, Q4_K and Q6_K matrices) and SmolLM2 (Q4_1) decode the same bits alone and in a
//! step with other sequences' prefill and decode rows, which is what lets the server promise the
//! same reply under load.

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
    let prompts: Vec<Vec<u32>> = vec![
        (1..6).map(|i| 100 + i * 7).collect(),
        (1..12).map(|i| 300 + i * 5).collect(),
        vec![2000, 17],
        (1..30).map(|i| 900 + i).collect(),
    ];
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
