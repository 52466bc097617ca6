//! `hf2q bench`: prompt-processing and generation speed in the shape of llama.cpp's `llama-bench`
//! (`tools/llama-bench/llama-bench.cpp`): `ppN` feeds N tokens in one batch into an empty cache,
//! `tgN` decodes N tokens one at a time from an empty cache; each test runs once to warm up, then
//! `-r` times; the table shows mean ± sample standard deviation of tokens per second.
//! `--parallel B,…` measures batched decoding as llama.cpp's `llama-batched-bench`
//! (`tools/batched-bench/batched-bench.cpp`) does: B sequences each get a prompt of `-p` tokens,
//! then all B decode `-n` tokens together, one row each per step; `ppP xB` is the prompts' tokens
//! per second, `tgN xB` the aggregate decode tokens per second (B·N over the decode time).

use super::runtime::{ModelArgs, ModelJob};
use crate::error::{CliError, CliResult};
use clap::Args;
use engine::backend::Backend;
use engine::generate::LoadedModel;
use engine::model::{Logits, Scratch, SeqStep};
use std::sync::Arc;
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths to test (comma-separated; 0 skips).
    #[arg(short = 'p', long = "n-prompt", default_value = "512", value_delimiter = ',')]
    pub n_prompt: Vec<usize>,
    /// Generation lengths to test (comma-separated; 0 skips).
    #[arg(short = 'n', long = "n-gen", default_value = "128", value_delimiter = ',')]
    pub n_gen: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Tokens per forward step while processing the prompt.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch: usize,
    /// Concurrent sequences for batched tests (comma-separated, as llama-batched-bench's -npl):
    /// each gets a prompt of each -p length, then all decode each -n length together.
    #[arg(long, value_delimiter = ',')]
    pub parallel: Vec<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Speculative decoding in the tg test (`--spec ngram`: n-gram drafts from the tokens so far;
    /// `--spec mtp`: drafts from the model's MTP layer; greedy): its acceptance and tokens per
    /// check are reported.
    #[command(flatten)]
    pub spec: super::generate::SpecArgs,
}

struct Row {
    test: String,
    n: usize,
    /// Concurrent sequences (1 for the single-sequence tests).
    seqs: usize,
    samples: Vec<f64>,
    /// Speculative decoding's counts over the measured repetitions (`--spec`).
    spec: Option<engine::spec::SpecStats>,
}

pub fn run(args: BenchArgs) -> CliResult {
    if args.reps == 0 {
        return Err(CliError::input("-r must be at least 1"));
    }
    if args.parallel.contains(&0) {
        return Err(CliError::input(
            "--parallel: each count of sequences must be at least 1",
        ));
    }
    args.model.run(Bench(&args))
}

struct Bench<'a>(&'a BenchArgs);

impl ModelJob for Bench<'_> {
    fn run<B: Backend>(self, cpu: Arc<B>, m: LoadedModel<B>) -> CliResult {
        bench(self.0, &*cpu, m)
    }
}

fn bench<B: Backend>(args: &BenchArgs, cpu: &B, m: LoadedModel<B>) -> CliResult {
    let n_vocab = m.model.info().n_vocab as u64;
    let bos = m.tokenizer.bos().unwrap_or(0);
    // llama-bench feeds random tokens (after a BOS); a fixed LCG keeps runs comparable.
    let mut seed = 0x2545F4914F6CDD1Du64;
    let mut prompt = move |n: usize| -> Vec<u32> {
        let mut toks: Vec<u32> = (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                ((seed >> 33) % n_vocab) as u32
            })
            .collect();
        if let Some(t) = toks.first_mut() {
            *t = bos;
        }
        toks
    };
    let rows = if args.parallel.is_empty() {
        single(args, &m, &mut prompt, bos)?
    } else {
        batched(args, &m, &mut prompt)?
    };
    let batch = args.batch.max(1);
    let file_size = std::fs::metadata(&args.model.model).map(|md| md.len()).unwrap_or(0);
    let name = model_label(&m);
    let backend = cpu.name();
    if args.json {
        let out: Vec<_> = rows
            .iter()
            .map(|r| {
                let (mean, sd) = stats(&r.samples);
                serde_json::json!({
                    "model_filename": args.model.model.display().to_string(),
                    "model_type": name,
                    "model_size": file_size,
                    "backend": backend,
                    "n_threads": cpu.threads(),
                    "n_batch": batch,
                    "type_k": format!("{:?}", args.model.kv_type).to_lowercase(),
                    "test": r.test,
                    "n_tokens": r.n,
                    "n_parallel": r.seqs,
                    "avg_ts": mean,
                    "stddev_ts": sd,
                    "samples_ts": r.samples,
                    "spec_checks": r.spec.map(|s| s.checks),
                    "spec_drafted": r.spec.map(|s| s.drafted),
                    "spec_accepted": r.spec.map(|s| s.accepted),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return Ok(());
    }
    println!("| model | size | backend | threads | test | t/s |");
    println!("| --- | ---: | --- | ---: | ---: | ---: |");
    for r in &rows {
        let (mean, sd) = stats(&r.samples);
        println!(
            "| {name} | {} | {backend} | {} | {} | {mean:.2} ± {sd:.2} |",
            super::human_bytes(file_size),
            cpu.threads(),
            r.test
        );
    }
    for r in rows.iter().filter_map(|r| r.spec.map(|s| (r, s))) {
        let (r, s) = r;
        println!(
            "{}: {} checks, {} tokens drafted, {} accepted ({:.1} %), {:.2} tokens per check",
            r.test,
            s.checks,
            s.drafted,
            s.accepted,
            100.0 * s.acceptance(),
            s.tokens_per_check()
        );
    }
    Ok(())
}

/// `toks` fed into `kv` from position 0 in chunks of `batch` tokens; the last token's logits.
fn prefill<B: Backend>(
    m: &LoadedModel<B>,
    scratch: &mut Scratch,
    kv: &mut B::Kv,
    toks: &[u32],
    batch: usize,
) -> Result<Vec<f32>, CliError> {
    let mut last = Vec::new();
    for (i, chunk) in toks.chunks(batch).enumerate() {
        let logits = if (i + 1) * batch >= toks.len() {
            Logits::Last
        } else {
            Logits::None
        };
        let mut l = m.model.forward(
            scratch,
            &mut [SeqStep {
                kv: &mut *kv,
                tokens: chunk,
                pos0: i * batch,
                logits,
            }],
        )?;
        if let Some(l) = l.pop() {
            last = l;
        }
    }
    Ok(last)
}

/// llama-bench's tests: `ppN` (N tokens into an empty cache) and `tgN` (N tokens decoded one at a
/// time from an empty cache).
fn single<B: Backend>(
    args: &BenchArgs,
    m: &LoadedModel<B>,
    prompt: &mut impl FnMut(usize) -> Vec<u32>,
    bos: u32,
) -> Result<Vec<Row>, CliError> {
    let model = &m.model;
    let max_ctx = args
        .n_prompt
        .iter()
        .chain(&args.n_gen)
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let mut kv = model.new_kv(max_ctx, args.model.kv_type)?;
    let batch = args.batch.max(1);
    let mut scratch = model.scratch(batch);
    let mut rows = Vec::new();
    for &n in args.n_prompt.iter().filter(|&&n| n > 0) {
        let mut samples = Vec::new();
        for rep in 0..=args.reps {
            let toks = prompt(n);
            let t = Instant::now();
            prefill(m, &mut scratch, &mut kv, &toks, batch)?;
            if rep > 0 {
                samples.push(n as f64 / t.elapsed().as_secs_f64());
            }
        }
        rows.push(Row {
            test: format!("pp{n}"),
            n,
            seqs: 1,
            samples,
            spec: None,
        });
    }
    for &n in args.n_gen.iter().filter(|&&n| n > 0) {
        let mut samples = Vec::new();
        let spec = args
            .spec
            .mode
            .unwrap_or(engine::spec::SpecMode::Off)
            .on(m.model.backend().as_ref());
        if spec == engine::spec::SpecMode::Mtp && model.mtp_layers() == 0 {
            return Err(engine::generate::no_mtp(&m.path, &model.info().arch).into());
        }
        if matches!(spec, engine::spec::SpecMode::Ngram | engine::spec::SpecMode::Mtp) {
            let mtp = spec == engine::spec::SpecMode::Mtp;
            let mut stats = engine::spec::SpecStats::default();
            for rep in 0..=args.reps {
                let t = Instant::now();
                let st = decode_spec(m, &mut scratch, &mut kv, bos, n, args.spec.draft_max, mtp)?;
                if rep > 0 {
                    samples.push(n as f64 / t.elapsed().as_secs_f64());
                    stats.add(&st);
                }
            }
            rows.push(Row {
                test: format!("tg{n} {}", if mtp { "mtp" } else { "ngram" }),
                n,
                seqs: 1,
                samples,
                spec: Some(stats),
            });
            continue;
        }
        for rep in 0..=args.reps {
            let t = Instant::now();
            // Greedy, the token found where the logits are; on a GPU each step's token fed to
            // the next on the device (`engine::model::decode_greedy`).
            engine::model::decode_greedy(model.as_ref(), &mut scratch, &mut kv, bos, 0, n, |_| true)?;
            if rep > 0 {
                samples.push(n as f64 / t.elapsed().as_secs_f64());
            }
        }
        rows.push(Row {
            test: format!("tg{n}"),
            n,
            seqs: 1,
            samples,
            spec: None,
        });
    }
    Ok(rows)
}

/// Greedy decoding of `n` tokens after `bos` with n-gram drafts (or the model's MTP drafts when
/// `mtp`) checked a step at a time (the rows of a check computed as decode steps would compute
/// them); returns what speculation did.
fn decode_spec<B: Backend>(
    m: &LoadedModel<B>,
    scratch: &mut engine::model::Scratch,
    kv: &mut B::Kv,
    bos: u32,
    n: usize,
    draft_max: usize,
    mtp: bool,
) -> Result<engine::spec::SpecStats, CliError> {
    let model = &m.model;
    let b = model.backend();
    let mut drafter = engine::spec::NgramDrafter::new(draft_max);
    let mut mtp_drafter = engine::spec::MtpDrafter::new(draft_max);
    let mut hist = vec![bos];
    let (mut tok, mut pos) = (bos, 0);
    b.kv_restore(kv, 0);
    while pos < n {
        let drafts = if mtp {
            // Nothing to pair before the first step: the first token is decoded alone.
            mtp_drafter.propose(model.as_ref(), scratch, kv, tok, n - pos - 1)?
        } else {
            drafter.propose(&hist, n - pos - 1)
        };
        let fed: Vec<u32> = std::iter::once(tok).chain(drafts.iter().copied()).collect();
        let marks: Vec<usize> = (pos + 1..pos + fed.len()).collect();
        b.kv_keep_states(kv, &marks);
        let logits = if drafts.is_empty() { Logits::Last } else { Logits::Each };
        let am = model.forward_argmax(
            scratch,
            &mut [SeqStep {
                kv,
                tokens: &fed,
                pos0: pos,
                logits,
            }],
        )?;
        let kept = drafts.iter().zip(&am).take_while(|(d, a)| d == a).count();
        hist.extend_from_slice(&am[..=kept]);
        if mtp {
            mtp_drafter.target_step(0, pos, fed[1..=kept].to_vec());
        }
        tok = am[kept];
        pos += kept + 1;
        if !drafts.is_empty() {
            b.kv_restore(kv, pos);
            if mtp {
                mtp_drafter.feedback(drafts.len(), kept);
            } else {
                drafter.feedback(drafts.len(), kept);
            }
        }
    }
    Ok(if mtp { mtp_drafter.stats } else { drafter.stats })
}

/// The `--parallel` tests: for each count B, prompt length P and decode length N, B sequences
/// (caches of P + N positions) are prefilled one after the other in chunks of `-b`, then decode N
/// steps of B rows (greedy, each from its own logits). One warm-up run, then `-r`.
fn batched<B: Backend>(
    args: &BenchArgs,
    m: &LoadedModel<B>,
    prompt: &mut impl FnMut(usize) -> Vec<u32>,
) -> Result<Vec<Row>, CliError> {
    let model = &m.model;
    let batch = args.batch.max(1);
    let mut rows = Vec::new();
    for &b in &args.parallel {
        for &p in args.n_prompt.iter().filter(|&&p| p > 0) {
            for &n in args.n_gen.iter().filter(|&&n| n > 0) {
                let mut kvs = (0..b)
                    .map(|_| model.new_kv(p + n, args.model.kv_type))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut scratch = model.scratch(batch.max(b));
                let (mut pp, mut tg) = (Vec::new(), Vec::new());
                for rep in 0..=args.reps {
                    let prompts: Vec<Vec<u32>> = (0..b).map(|_| prompt(p)).collect();
                    let t = Instant::now();
                    let mut last = Vec::with_capacity(b);
                    for (kv, toks) in kvs.iter_mut().zip(&prompts) {
                        let l = prefill(m, &mut scratch, kv, toks, batch)?;
                        last.push([engine::sampler::argmax(&l)]);
                    }
                    let t_pp = t.elapsed().as_secs_f64();
                    let t = Instant::now();
                    for step in 0..n {
                        let mut seqs: Vec<SeqStep<'_, B>> = kvs
                            .iter_mut()
                            .zip(&last)
                            .map(|(kv, tok)| SeqStep {
                                kv,
                                tokens: tok,
                                pos0: p + step,
                                logits: Logits::Last,
                            })
                            .collect();
                        let l = model.forward_argmax(&mut scratch, &mut seqs)?;
                        drop(seqs);
                        for (tok, &l) in last.iter_mut().zip(&l) {
                            tok[0] = l;
                        }
                    }
                    if rep > 0 {
                        pp.push((b * p) as f64 / t_pp);
                        tg.push((b * n) as f64 / t.elapsed().as_secs_f64());
                    }
                }
                rows.push(Row {
                    test: format!("pp{p} x{b}"),
                    n: p,
                    seqs: b,
                    samples: pp,
                    spec: None,
                });
                rows.push(Row {
                    test: format!("tg{n} x{b}"),
                    n,
                    seqs: b,
                    samples: tg,
                    spec: None,
                });
            }
        }
    }
    Ok(rows)
}

fn model_label<B: Backend>(m: &LoadedModel<B>) -> String {
    let ty = gguf::GgufFile::open(&m.path)
        .ok()
        .and_then(|f| f.metadata().get_u64("general.file_type"))
        .and_then(|t| gguf::file_type::file_type_name(t).map(|s| s.to_string()))
        .unwrap_or_else(|| "?".into());
    format!("{} {}", m.model.info().arch, ty)
}

/// Mean and sample standard deviation.
fn stats(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}
