//! `hf2q generate`: stream text from a GGUF model. `-p TEXT` is fed verbatim (special tokens in
//! it are recognised, no template); `--chat` applies the model's chat template, interactively
//! when stdin is a terminal. Only generated text goes to stdout; everything else to stderr.

use super::runtime::{ModelArgs, ModelJob};
use crate::error::{CliError, CliResult};
use clap::Args;
use engine::backend::Backend;
use engine::chat::ChatMessage;
use engine::generate::{generate, Finish, GenerateParams, Generated, LoadedModel, Session};
use engine::sampler::SamplingParams;
use std::io::{BufRead, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt text, fed verbatim (with --chat: the user's message).
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file", conflicts_with = "prompt")]
    pub prompt_file: Option<PathBuf>,
    /// Apply the model's chat template (interactive when stdin is a terminal and no prompt is given).
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// Extra chat-template variables as a JSON object, e.g. '{"enable_thinking": false}'.
    #[arg(long)]
    pub chat_kwargs: Option<String>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n_predict: usize,
    /// Context size in tokens (0 = the model's training context).
    #[arg(short = 'c', long = "ctx", default_value_t = 4096)]
    pub ctx: usize,
    /// Prompt tokens per forward step.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop when this text is generated (repeatable; not printed).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// Speculative decoding.
#[derive(Args, Clone, Debug)]
pub struct SpecArgs {
    /// Propose tokens ahead and check them in one step: `ngram` looks them up in the prompt and
    /// the text so far (strong when the reply quotes or edits text of the prompt), `mtp` asks the
    /// model's multi-token-prediction layer (Qwen 3.5 / 3.6 checkpoints converted with it), `off` decodes
    /// one token per step, `auto` is ngram on the CPU and on CUDA (measured on both).
    /// The output is the same either way with greedy sampling (--temp 0), and has the same
    /// distribution otherwise [default: auto for generate, off for serve and bench]
    #[arg(long = "spec", value_parser = parse_spec)]
    pub mode: Option<engine::spec::SpecMode>,
    /// Most tokens proposed per step (at most 16; drafts grow to it while all are kept and shrink
    /// after misses). 16 by measurement: with the faster CPU decoding of 2026-12-03 a check's extra
    /// rows cost more of a step than before, and longer drafts on text the reply copies made
    /// up for it (bench/runs/2026-12-03-xeon-2c/spec-after-cpu-speedups).
    #[arg(long, default_value_t = 16, value_parser = parse_draft_max)]
    pub draft_max: usize,
}

fn parse_draft_max(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(k) if (1..=engine::spec::MAX_DRAFT).contains(&k) => Ok(k),
        _ => Err(format!(
            "expected a number of tokens from 1 to {}, got {s:?}",
            engine::spec::MAX_DRAFT
        )),
    }
}

fn parse_spec(s: &str) -> Result<engine::spec::SpecMode, String> {
    engine::spec::SpecMode::parse(s).ok_or_else(|| format!("expected auto, ngram, mtp or off, got {s:?}"))
}

#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Temperature (0 = greedy).
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1.0 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0.0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1.0 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Add BIAS to a token's logit: TOKEN_ID=BIAS (repeatable).
    #[arg(long = "logit-bias", value_parser = parse_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// RNG seed (default: random, printed to stderr).
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
}

fn parse_bias(s: &str) -> Result<(u32, f32), String> {
    let (t, b) = s
        .split_once('=')
        .ok_or_else(|| format!("expected TOKEN_ID=BIAS, got {s:?}"))?;
    let t = t
        .trim()
        .parse()
        .map_err(|_| format!("bad token id {t:?} in --logit-bias"))?;
    let b = b
        .trim()
        .parse()
        .map_err(|_| format!("bad bias {b:?} in --logit-bias"))?;
    Ok((t, b))
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        let seed = self.seed.unwrap_or_else(|| {
            let s = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            if self.temp > 0.0 {
                eprintln!("seed: {s}");
            }
            s
        });
        SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            penalty_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: self.logit_bias.clone(),
            seed,
        }
    }
}

pub fn run(args: GenerateArgs) -> CliResult {
    let sampling = args.sampling.params();
    sampling.validate().map_err(CliError::input)?;
    let kwargs = match &args.chat_kwargs {
        None => serde_json::Map::new(),
        Some(s) => match serde_json::from_str(s) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => {
                return Err(CliError::input(format!(
                    "--chat-kwargs must be a JSON object, got {s:?}"
                )))
            }
        },
    };
    let file_prompt = match &args.prompt_file {
        Some(p) => Some(std::fs::read_to_string(p).map_err(|e| CliError::input(format!("{}: {e}", p.display())))?),
        None => None,
    };
    let prompt = args.prompt.clone().or(file_prompt);
    args.model.run(Generate {
        args: &args,
        sampling,
        kwargs,
        prompt,
    })
}

/// The part of `generate` that runs on the loaded model.
struct Generate<'a> {
    args: &'a GenerateArgs,
    sampling: SamplingParams,
    kwargs: serde_json::Map<String, serde_json::Value>,
    prompt: Option<String>,
}

impl ModelJob for Generate<'_> {
    fn run<B: Backend>(self, _backend: Arc<B>, m: LoadedModel<B>) -> CliResult {
        let Generate {
            args,
            sampling,
            kwargs,
            prompt,
        } = self;
        run_loaded(args, sampling, kwargs, prompt, m)
    }
}

fn run_loaded<B: Backend>(
    args: &GenerateArgs,
    sampling: SamplingParams,
    kwargs: serde_json::Map<String, serde_json::Value>,
    prompt: Option<String>,
    m: LoadedModel<B>,
) -> CliResult {
    let n_ctx = if args.ctx == 0 {
        m.model.info().n_ctx_train
    } else {
        args.ctx
    };
    let mut session = Session::new(&m, n_ctx, args.model.kv_type, args.batch)?;
    let params = GenerateParams {
        max_tokens: args.n_predict,
        sampling,
        stop: args.stop.clone(),
        ignore_eos: args.ignore_eos,
        n_batch: args.batch,
        logprobs: None,
        spec: args.spec.mode.unwrap_or(engine::spec::SpecMode::Auto),
        draft_max: args.spec.draft_max,
    };
    if !args.chat {
        let text = match prompt {
            Some(p) => p,
            None if !std::io::stdin().is_terminal() => {
                let mut s = String::new();
                std::io::stdin()
                    .read_to_string(&mut s)
                    .map_err(|e| CliError::input(format!("reading stdin: {e}")))?;
                s
            }
            None => {
                return Err(CliError::input(
                    "no prompt: give -p TEXT, -f FILE, pipe text on stdin, or use --chat",
                ))
            }
        };
        let tokens = m.tokenize_prompt(&text)?;
        let g = stream(&m, &mut session, &tokens, &params)?;
        end_line();
        report(&g);
        return Ok(());
    }
    let template = m
        .template
        .as_ref()
        .ok_or_else(|| CliError::input(format!("{}: the model has no chat template", m.path.display())))?;
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(ChatMessage::new("system", s.as_str()));
    }
    let interactive = prompt.is_none() && std::io::stdin().is_terminal();
    let mut pending = match prompt {
        Some(p) => Some(p),
        None if !interactive => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| CliError::input(format!("reading stdin: {e}")))?;
            Some(s)
        }
        None => None,
    };
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        let user = match pending.take() {
            Some(u) => u,
            None if interactive => {
                eprint!("\n> ");
                let _ = std::io::stderr().flush();
                match lines.next() {
                    Some(Ok(l)) if l.trim() == "/exit" => break,
                    Some(Ok(l)) => l,
                    _ => break,
                }
            }
            None => break,
        };
        messages.push(ChatMessage::new("user", user));
        let text = template
            .render(&messages, None, true, &kwargs)
            .map_err(|e| CliError::input(format!("chat template: {e}")))?;
        let tokens = chat_tokens(&m, &text)?;
        let g = stream(&m, &mut session, &tokens, &params)?;
        end_line();
        report(&g);
        messages.push(ChatMessage::new("assistant", g.text.clone()));
        if !interactive {
            break;
        }
    }
    Ok(())
}

/// Tokens of a rendered chat: BOS per the model's flag unless the template already wrote it.
pub fn chat_tokens<B: Backend>(m: &LoadedModel<B>, text: &str) -> CliResult<Vec<u32>> {
    let mut toks = m
        .tokenizer
        .encode(text, true, true)
        .map_err(|e| CliError::input(format!("tokenizing: {e}")))?;
    if let Some(bos) = m.tokenizer.bos() {
        if toks.len() >= 2 && toks[0] == bos && toks[1] == bos {
            toks.remove(0);
        }
    }
    Ok(toks)
}

fn stream<B: Backend>(
    m: &LoadedModel<B>,
    session: &mut Session<B>,
    tokens: &[u32],
    params: &GenerateParams,
) -> CliResult<Generated> {
    let mut out = std::io::stdout().lock();
    let g = generate(m, session, tokens, params, |piece| {
        // A closed stdout (e.g. `| head`) stops generation quietly.
        out.write_all(piece.as_bytes()).and_then(|_| out.flush()).is_ok()
    })?;
    Ok(g)
}

/// End the reply's line. On a terminal it goes to stdout; otherwise stdout stays exactly the
/// generated text and the newline goes to stderr, so that in a combined log (`2>&1`, a terminal
/// showing stderr) what follows starts on its own line.
fn end_line() {
    if std::io::stdout().is_terminal() {
        println!();
    } else {
        eprintln!();
    }
}

fn report(g: &Generated) {
    let rate = |n: usize, d: std::time::Duration| {
        if d.as_secs_f64() > 0.0 {
            n as f64 / d.as_secs_f64()
        } else {
            0.0
        }
    };
    let why = match g.finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::Cancelled => "cancelled",
    };
    tracing::info!(
        "prompt {} tokens ({:.1} tok/s), generated {} tokens ({:.1} tok/s), finish: {why}",
        g.prompt_tokens,
        rate(g.prompt_tokens, g.prefill_time),
        g.tokens.len(),
        rate(g.tokens.len().saturating_sub(1), g.decode_time)
    );
    if g.spec.checks > 0 {
        tracing::info!(
            "speculative: {} checks, {} tokens drafted, {} accepted ({:.1} %), {:.2} tokens per check",
            g.spec.checks,
            g.spec.drafted,
            g.spec.accepted,
            100.0 * g.spec.acceptance(),
            g.spec.tokens_per_check()
        );
    }
}
