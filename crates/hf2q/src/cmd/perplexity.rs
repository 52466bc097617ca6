//! `hf2q perplexity`: perplexity of a text file the way llama.cpp's `llama-perplexity` computes it
//! (`tools/perplexity/perplexity.cpp`, `perplexity()`): the file is tokenized whole (BOS per the
//! model), cut into chunks of `-c` tokens, the first token of each chunk replaced by BOS when the
//! model adds one, and only the second half of each chunk is scored. Prints the running value per
//! chunk and `Final estimate: PPL = X +/- Y`.

use super::runtime::{ModelArgs, ModelJob};
use crate::error::{CliError, CliResult};
use clap::Args;
use engine::backend::Backend;
use engine::generate::LoadedModel;
use engine::model::{Logits, SeqStep};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to evaluate.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Tokens per chunk.
    #[arg(short = 'c', long = "ctx", default_value_t = 512)]
    pub ctx: usize,
    /// Evaluate at most this many chunks (-1 = all).
    #[arg(long = "chunks", default_value_t = -1, allow_hyphen_values = true)]
    pub chunks: i64,
    /// Chunks evaluated together in one batched forward step.
    #[arg(long = "parallel", default_value_t = 4)]
    pub parallel: usize,
}

pub fn run(args: PerplexityArgs) -> CliResult {
    let text = std::fs::read(&args.file).map_err(|e| CliError::input(format!("{}: {e}", args.file.display())))?;
    let text = String::from_utf8_lossy(&text);
    if args.ctx < 4 {
        return Err(CliError::input(format!(
            "-c {}: the context must hold at least 4 tokens",
            args.ctx
        )));
    }
    args.model.run(Perplexity {
        args: &args,
        text: &text,
    })
}

struct Perplexity<'a> {
    args: &'a PerplexityArgs,
    text: &'a str,
}

impl ModelJob for Perplexity<'_> {
    fn run<B: Backend>(self, _backend: Arc<B>, m: LoadedModel<B>) -> CliResult {
        perplexity(self.args, self.text, m)
    }
}

fn perplexity<B: Backend>(args: &PerplexityArgs, text: &str, m: LoadedModel<B>) -> CliResult {
    let t0 = Instant::now();
    let mut tokens = m
        .tokenizer
        .encode(text, true, false)
        .map_err(|e| CliError::input(format!("tokenizing: {e}")))?;
    eprintln!(
        "tokenized {} into {} tokens in {:.2} s",
        args.file.display(),
        tokens.len(),
        t0.elapsed().as_secs_f64()
    );
    let n_ctx = args.ctx;
    if tokens.len() < 2 * n_ctx {
        return Err(CliError::input(format!(
            "{} tokenizes to {} tokens; a context of {n_ctx} needs at least {}",
            args.file.display(),
            tokens.len(),
            2 * n_ctx
        )));
    }
    let max_chunks = tokens.len() / n_ctx;
    let n_chunk = if args.chunks < 0 {
        max_chunks
    } else {
        (args.chunks as usize).min(max_chunks)
    };
    let add_bos = m.tokenizer.add_bos();
    let bos = m.tokenizer.bos();
    let first = n_ctx / 2;
    let n_seq = args.parallel.max(1);
    let model = &m.model;
    let mut kvs: Vec<_> = (0..n_seq)
        .map(|_| model.new_kv(n_ctx, args.model.kv_type))
        .collect::<Result<_, _>>()?;
    let mut scratch = model.scratch(n_ctx * n_seq);
    eprintln!("calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, batch of {n_seq} chunks");
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let start = Instant::now();
    let mut out = std::io::stdout().lock();
    for i in (0..n_chunk).step_by(n_seq) {
        let k = n_seq.min(n_chunk - i);
        let chunks: Vec<Vec<u32>> = (0..k)
            .map(|s| {
                let beg = (i + s) * n_ctx;
                let mut c = tokens[beg..beg + n_ctx].to_vec();
                if let (true, Some(b)) = (add_bos, bos) {
                    c[0] = b;
                }
                c
            })
            .collect();
        let mut steps: Vec<SeqStep<'_, _>> = kvs
            .iter_mut()
            .zip(&chunks)
            .map(|(kv, c)| SeqStep {
                kv,
                tokens: c,
                pos0: 0,
                // Only the scored half needs logits (perplexity.cpp marks the same outputs).
                logits: Logits::From(first),
            })
            .collect();
        let logits = model.forward(&mut scratch, &mut steps)?;
        drop(steps);
        for s in 0..k {
            let beg = (i + s) * n_ctx;
            for j in first..n_ctx - 1 {
                let row = &logits[s * (n_ctx - first) + j - first];
                let target = tokens[beg + j + 1] as usize;
                let lp = log_prob(row, target);
                nll -= lp;
                nll2 += lp * lp;
            }
            count += n_ctx - 1 - first;
            let _ = write!(out, "[{}]{:.4},", i + s + 1, (nll / count as f64).exp());
            let _ = out.flush();
        }
        if i == 0 {
            let per = start.elapsed().as_secs_f64();
            eprintln!(
                "{per:.2} seconds per pass - ETA {:.2} minutes",
                per * n_chunk.div_ceil(n_seq) as f64 / 60.0
            );
        }
    }
    let _ = writeln!(out);
    // perplexity.cpp: nll2/count - (nll/count)^2, sample standard error over count - 1.
    let mean = nll / count as f64;
    let var = nll2 / count as f64 - mean * mean;
    let ppl = mean.exp();
    if var > 0.0 {
        let _ = writeln!(
            out,
            "Final estimate: PPL = {ppl:.4} +/- {:.5}",
            (var / (count as f64 - 1.0)).sqrt() * ppl
        );
    } else {
        let _ = writeln!(out, "Final estimate: PPL = {ppl:.4}");
    }
    tokens.clear();
    Ok(())
}

/// log softmax(row)[target] in f64.
fn log_prob(row: &[f32], target: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    row[target] as f64 - max - sum.ln()
}
