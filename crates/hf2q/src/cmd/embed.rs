//! `hf2q embed`: one vector per input from a BERT / Nomic-BERT GGUF, pooled as the model says and
//! L2-normalised (as sentence-transformers does for these models) unless `--no-normalize`. Weights
//! are decoded to f32 once and multiplied by f32 activations with a blocked GEMM over each batch
//! (see `Cpu::with_exact_activations`).

use super::runtime::ModelArgs;
use crate::error::{CliError, CliResult};
use clap::Args;
use engine::backend::select::{with_backend, BackendOptions, WithBackend};
use engine::backend::Backend;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Texts to embed (one vector each).
    pub texts: Vec<String>,
    /// Read inputs from a file, one per line (`-` for stdin).
    #[arg(short = 'f', long = "file", conflicts_with = "texts")]
    pub file: Option<PathBuf>,
    /// Print a JSON array of vectors instead of one line of numbers per input.
    #[arg(long)]
    pub json: bool,
    /// Skip the L2 normalisation.
    #[arg(long)]
    pub no_normalize: bool,
    /// Cut inputs longer than the model's maximum instead of failing.
    #[arg(long)]
    pub truncate: bool,
    /// Gone: it multiplied by ggml-style quantized activations, which is now 3.5× slower than the
    /// default f32 GEMM path and less accurate. Accepted (with a warning) so scripts keep working.
    #[arg(long, hide = true)]
    pub fast: bool,
    /// Inputs per forward step.
    #[arg(short = 'b', long = "batch", default_value_t = 64)]
    pub batch: usize,
}

pub fn run(args: EmbedArgs) -> CliResult {
    let mut texts = args.texts.clone();
    if let Some(f) = &args.file {
        let mut s = String::new();
        if f.as_os_str() == "-" {
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| CliError::input(format!("reading stdin: {e}")))?;
        } else {
            s = std::fs::read_to_string(f).map_err(|e| CliError::input(format!("{}: {e}", f.display())))?;
        }
        texts = s.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect();
    } else if texts.is_empty() && !std::io::stdin().is_terminal() {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| CliError::input(format!("reading stdin: {e}")))?;
        texts = s.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect();
    }
    if texts.is_empty() {
        return Err(CliError::input(
            "nothing to embed: give texts, -f FILE, or lines on stdin",
        ));
    }
    if !args.model.model.is_file() {
        return Err(CliError::input(format!(
            "{}: no such model file",
            args.model.model.display()
        )));
    }
    if args.fast {
        eprintln!("warning: --fast is gone: the default path is faster and exact; ignoring it");
    }
    let opts = BackendOptions {
        exact_activations: true,
        ..args.model.options()?
    };
    with_backend(&opts, Embed { args: &args, texts })?
}

struct Embed<'a> {
    args: &'a EmbedArgs,
    texts: Vec<String>,
}

impl WithBackend for Embed<'_> {
    type Output = CliResult;
    fn run<B: Backend>(self, backend: Arc<B>) -> CliResult {
        embed(self.args, &self.texts, backend)
    }
}

fn embed<B: Backend>(args: &EmbedArgs, texts: &[String], backend: Arc<B>) -> CliResult {
    let gguf = engine::model::open_gguf(&args.model.model)?;
    let m = engine::model::load_encoder(backend, &gguf, &args.model.model)?;
    let tok = engine::tokenizer::Tokenizer::from_gguf(gguf.metadata())
        .map_err(|e| CliError::input(format!("{}: tokenizer: {e}", args.model.model.display())))?;
    let mut inputs = Vec::with_capacity(texts.len());
    for (i, t) in texts.iter().enumerate() {
        let mut ids = tok
            .encode(t, true, false)
            .map_err(|e| CliError::input(format!("input {i}: {e}")))?;
        if ids.len() > m.n_ctx_train() {
            if !args.truncate {
                return Err(CliError::input(format!(
                    "input {i} has {} tokens; the model takes at most {} (use --truncate)",
                    ids.len(),
                    m.n_ctx_train()
                )));
            }
            let last = *ids.last().unwrap_or(&0);
            ids.truncate(m.n_ctx_train());
            if let Some(l) = ids.last_mut() {
                *l = last; // keep the closing separator
            }
        }
        inputs.push(ids);
    }
    let mut vectors = Vec::with_capacity(inputs.len());
    for chunk in inputs.chunks(args.batch.max(1)) {
        vectors.extend(m.embed(chunk, None, !args.no_normalize)?);
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let _ = writeln!(out, "{}", serde_json::to_string(&vectors).unwrap_or_default());
    } else {
        for v in &vectors {
            let line: Vec<String> = v.iter().map(|x| format!("{x:.7}")).collect();
            let _ = writeln!(out, "{}", line.join(" "));
        }
    }
    Ok(())
}
