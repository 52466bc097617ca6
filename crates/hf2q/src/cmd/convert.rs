//! `hf2q convert DIR --quant TYPE -o OUT.gguf`: HuggingFace directory → GGUF, tensor for tensor what
//! llama.cpp's `convert_hf_to_gguf.py` (+ `llama-quantize` for quantized types) writes.

use super::quantize::plan_options;
use crate::error::{CliError, CliResult};
use convert::plan::Target;
use convert::requant::QuantizeOptions;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ConvertArgs {
    /// HuggingFace model directory (config.json, *.safetensors, tokenizer files).
    pub dir: PathBuf,
    /// Output file type: bf16 (default), f16, f32, q8_0, or any llama-quantize type (Q4_K_M, IQ4_XS, …).
    #[arg(long, short = 'q', default_value = "bf16")]
    pub quant: String,
    /// Output GGUF path (written atomically).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Drop the multi-token-prediction layers (Qwen3.5/3.6), as convert_hf_to_gguf.py --no-mtp.
    #[arg(long)]
    pub no_mtp: bool,
    #[command(flatten)]
    pub plan: super::quantize::PlanArgs,
}

pub fn run(args: ConvertArgs) -> CliResult {
    let target = Target::parse(&args.quant).ok_or_else(|| {
        CliError::input(format!(
            "unknown --quant `{}` (e.g. bf16, f16, q8_0, Q4_K_M, IQ4_XS)",
            args.quant
        ))
    })?;
    if !args.dir.is_dir() {
        return Err(CliError::input(format!(
            "{}: not a directory (expected a HuggingFace model directory)",
            args.dir.display()
        )));
    }
    let output = args
        .output
        .clone()
        .ok_or_else(|| CliError::input("missing -o OUT.gguf"))?;
    let opts = QuantizeOptions {
        plan: plan_options(&args.plan)?,
        imatrix: super::quantize::load_imatrix(&args.plan)?,
        ..Default::default()
    };
    let t0 = std::time::Instant::now();
    let copts = convert::pipeline::ConvertOptions { no_mtp: args.no_mtp };
    let summary = convert::pipeline::convert_with(&args.dir, &output, target, &opts, &copts).map_err(|e| {
        if e.is_invalid_input() {
            CliError::input(e.to_string())
        } else {
            CliError::runtime(e.to_string())
        }
    })?;
    for n in &summary.notes {
        tracing::warn!("{n}");
    }
    eprintln!(
        "hf2q convert: {} ({}) → {} [{}], {} tensors in {:.2}s",
        summary.hf_architecture,
        summary.architecture,
        output.display(),
        target.name(),
        summary.tensors.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
