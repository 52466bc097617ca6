//! Sampling one token from a logits row with the OpenAI defaults (temperature 1, no cut), top-p
//! 0.95, and llama.cpp's defaults (top-k 40, top-p 0.95, min-p 0.05), at SmolLM2's and Llama 3's
//! vocabularies: the chain in integer masses (`Sampler::sample`) against the chain it replaced
//! (a sort of the whole row and f32 softmaxes, kept here as `sorted_chain`).
//! Then a step's draws for 16 streams at 128,256: the CPU backend's `sample_rows` and
//! `sample_rows_on_host` (a GPU's rows read back), both drawing the rows in parallel, against the
//! same draws one row after another.
//! `cargo bench -p engine --bench sampler`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use engine::sampler::{by_logit, Rng, Sampler, SamplingParams};

/// The previous chain: the candidates sorted, top-k / top-p / min-p on f32 softmaxes, a draw.
fn sorted_chain(p: &SamplingParams, row: &[f32], u: f64) -> u32 {
    let softmax = |v: &[f32]| {
        let m = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = v.iter().map(|l| (l - m).exp()).collect();
        let s: f32 = e.iter().sum();
        e.into_iter().map(|x| x / s).collect::<Vec<f32>>()
    };
    let mut cand: Vec<(u32, f32)> = row
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_nan())
        .map(|(i, &l)| (i as u32, l))
        .collect();
    if p.top_k > 0 && p.top_k < cand.len() {
        cand.select_nth_unstable_by(p.top_k - 1, by_logit);
        cand.truncate(p.top_k);
    }
    cand.sort_by(by_logit);
    if p.top_p < 1.0 {
        let probs = softmax(&cand.iter().map(|c| c.1).collect::<Vec<_>>());
        let mut cum = 0f64;
        let keep = probs.iter().position(|&x| {
            cum += x as f64;
            cum >= p.top_p as f64
        });
        cand.truncate(keep.map_or(cand.len(), |k| k + 1));
    }
    if p.min_p > 0.0 {
        let t = cand[0].1 + p.min_p.ln();
        let keep = cand.iter().take_while(|c| c.1 >= t).count();
        cand.truncate(keep.max(1));
    }
    let probs = softmax(&cand.iter().map(|c| c.1 / p.temperature).collect::<Vec<_>>());
    let mut cum = 0f64;
    for (c, x) in cand.iter().zip(&probs) {
        cum += *x as f64;
        if u < cum {
            return c.0;
        }
    }
    cand.last().map_or(0, |c| c.0)
}

fn chains(c: &mut Criterion) {
    let mut g = c.benchmark_group("sample_one_token");
    g.sample_size(30);
    for vocab in [49_152usize, 128_256] {
        let mut rng = Rng::new(1);
        // Logit-like rows: most values a few units around 0, a tail of likely tokens above.
        let row: Vec<f32> = (0..vocab)
            .map(|i| {
                let x = (rng.next_f64() + rng.next_f64() + rng.next_f64() - 1.5) as f32 * 4.0;
                if i % 997 == 0 {
                    x + 12.0
                } else {
                    x
                }
            })
            .collect();
        let sets = [
            (
                "openai_default",
                SamplingParams {
                    temperature: 1.0,
                    top_k: 0,
                    top_p: 1.0,
                    min_p: 0.0,
                    ..Default::default()
                },
            ),
            (
                "top_p_0.95",
                SamplingParams {
                    temperature: 1.0,
                    top_k: 0,
                    top_p: 0.95,
                    min_p: 0.0,
                    ..Default::default()
                },
            ),
            ("llama_cpp_default", SamplingParams::default()),
        ];
        for (name, p) in sets {
            let id = format!("{name}/{vocab}");
            g.bench_with_input(BenchmarkId::new("masses", &id), &(), |b, _| {
                let mut s = Sampler::new(p.clone());
                b.iter(|| s.sample(&mut row.clone()))
            });
            g.bench_with_input(BenchmarkId::new("sorted_chain", &id), &(), |b, _| {
                let mut r = Rng::new(2);
                b.iter(|| sorted_chain(&p, &row.clone(), r.next_f64()))
            });
        }
    }
    g.finish();
}

fn step_draws(c: &mut Criterion) {
    use engine::backend::{cpu::Cpu, Backend, SampleAsk};
    use engine::sampler::masses::{sample_row, Cuts};
    let mut g = c.benchmark_group("step_draws");
    g.sample_size(20);
    let (streams, vocab) = (16usize, 128_256usize);
    let cpu = Cpu::new(0).expect("cpu backend");
    let mut rng = Rng::new(3);
    let data: Vec<f32> = (0..streams * vocab)
        .map(|_| (rng.next_f64() + rng.next_f64() + rng.next_f64() - 1.5) as f32 * 4.0)
        .collect();
    let mut x = cpu.alloc(streams, vocab);
    cpu.write(&mut x, streams, vocab, &data);
    let p = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..Default::default()
    };
    let asks: Vec<SampleAsk> = (0..streams)
        .map(|row| SampleAsk {
            row,
            changes: Vec::new(),
            cuts: Cuts::of(&p),
            u: rng.next_f64(),
        })
        .collect();
    g.bench_function("openai_default/16x128256/cpu_sample_rows", |b| {
        b.iter(|| cpu.sample_rows(&x, &asks))
    });
    g.bench_function("openai_default/16x128256/sample_rows_on_host", |b| {
        b.iter(|| engine::backend::sample_rows_on_host(&cpu, &x, &asks))
    });
    g.bench_function("openai_default/16x128256/one_by_one", |b| {
        b.iter(|| {
            asks.iter()
                .map(|a| sample_row(&mut cpu.read_rows(&x, a.row, 1), a))
                .collect::<Vec<u32>>()
        })
    });
    g.finish();
}

criterion_group!(benches, chains, step_draws);
criterion_main!(benches);
