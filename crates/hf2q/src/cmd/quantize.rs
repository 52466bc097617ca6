//! `hf2q quantize IN.gguf OUT.gguf TYPE`: GGUF → GGUF quantization with llama-quantize's per-tensor
//! plan and options, producing the same file.

use super::human_bytes;
use crate::error::{CliError, CliResult};
use convert::plan::Target;
use convert::requant::{self, QuantizeOptions};
use gguf::GgmlType;
use std::path::PathBuf;

/// llama-quantize's options that change the per-tensor plan.
#[derive(clap::Args, Default)]
pub struct PlanArgs {
    /// Give every quantizable tensor the file type's default type (no per-category mix).
    #[arg(long)]
    pub pure: bool,
    /// Leave output.weight in its current type.
    #[arg(long)]
    pub leave_output_tensor: bool,
    /// ggml type for output.weight (e.g. q8_0).
    #[arg(long, value_name = "TYPE")]
    pub output_tensor_type: Option<String>,
    /// ggml type for token_embd.weight.
    #[arg(long, value_name = "TYPE")]
    pub token_embedding_type: Option<String>,
    /// Override the type of tensors whose name matches REGEX (first match wins). Repeatable.
    #[arg(long = "tensor-type", value_name = "REGEX=TYPE")]
    pub tensor_type: Vec<String>,
    /// Importance matrix (llama-imatrix GGUF or legacy .dat), as llama-quantize --imatrix.
    #[arg(long, value_name = "FILE")]
    pub imatrix: Option<PathBuf>,
    /// Use importance data only for tensors whose name contains this. Repeatable.
    #[arg(long = "include-weights", value_name = "NAME")]
    pub include_weights: Vec<String>,
    /// Ignore importance data for tensors whose name contains this. Repeatable.
    #[arg(long = "exclude-weights", value_name = "NAME", conflicts_with = "include_weights")]
    pub exclude_weights: Vec<String>,
}

#[derive(clap::Args)]
pub struct QuantizeArgs {
    /// Input GGUF (any shard of a split model).
    pub input: PathBuf,
    /// Output GGUF (written atomically).
    pub output: PathBuf,
    /// File type, as llama-quantize names it: Q4_K_M, Q8_0, IQ4_XS, F16, BF16, COPY, … (case-insensitive).
    pub ftype: String,
    /// Quantize tensors that are already quantized (through f32), as llama-quantize --allow-requantize.
    #[arg(long)]
    pub allow_requantize: bool,
    #[command(flatten)]
    pub plan: PlanArgs,
    /// Print the per-tensor plan (tensor → type, bytes) and write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

fn ggml_type(arg: &str, what: &str) -> CliResult<GgmlType> {
    GgmlType::from_name(arg)
        .ok_or_else(|| CliError::input(format!("{what}: unknown ggml type `{arg}` (e.g. q8_0, q4_K, f16)")))
}

/// Load and filter the importance matrix, if one was given.
pub fn load_imatrix(args: &PlanArgs) -> CliResult<Option<convert::imatrix::Imatrix>> {
    let Some(p) = &args.imatrix else {
        if !args.include_weights.is_empty() || !args.exclude_weights.is_empty() {
            return Err(CliError::input("--include-weights/--exclude-weights need --imatrix"));
        }
        return Ok(None);
    };
    let mut im = convert::imatrix::Imatrix::load(p).map_err(|e| CliError::input(e.to_string()))?;
    im.filter(&args.include_weights, &args.exclude_weights);
    Ok(Some(im))
}

/// Parse the plan flags into plan options.
pub fn plan_options(args: &PlanArgs) -> CliResult<convert::plan::PlanOptions> {
    let mut o = convert::plan::PlanOptions {
        pure: args.pure,
        leave_output_tensor: args.leave_output_tensor,
        ..Default::default()
    };
    o.output_tensor_type = args
        .output_tensor_type
        .as_deref()
        .map(|t| ggml_type(t, "--output-tensor-type"))
        .transpose()?;
    o.token_embedding_type = args
        .token_embedding_type
        .as_deref()
        .map(|t| ggml_type(t, "--token-embedding-type"))
        .transpose()?;
    for tt in &args.tensor_type {
        let (re, ty) = tt
            .rsplit_once('=')
            .filter(|(re, _)| !re.is_empty())
            .ok_or_else(|| CliError::input(format!("--tensor-type `{tt}`: expected REGEX=TYPE")))?;
        let re = regex::Regex::new(re).map_err(|e| CliError::input(format!("--tensor-type `{tt}`: {e}")))?;
        o.tensor_types.push((re, ggml_type(ty, "--tensor-type")?));
    }
    Ok(o)
}

pub fn run(args: QuantizeArgs) -> CliResult {
    let target = Target::parse(&args.ftype).ok_or_else(|| {
        CliError::input(format!(
            "unknown file type `{}` (e.g. Q4_K_M, Q8_0, IQ4_XS, F16, BF16, COPY)",
            args.ftype
        ))
    })?;
    let opts = QuantizeOptions {
        allow_requantize: args.allow_requantize,
        plan: plan_options(&args.plan)?,
        imatrix: load_imatrix(&args.plan)?,
    };
    if !args.input.is_file() {
        return Err(CliError::input(format!("{}: no such file", args.input.display())));
    }
    let to_cli = |e: requant::QuantizeError| {
        if e.is_invalid_input() {
            CliError::input(e.to_string())
        } else {
            CliError::runtime(e.to_string())
        }
    };
    if args.dry_run {
        let model = gguf::GgufModel::open(&args.input)?;
        let entries = requant::plan_model(&model, target, &opts).map_err(to_cli)?;
        let (mut before, mut after) = (0u64, 0u64);
        for e in &entries {
            let (_, t) = model.tensor(&e.name).expect("planned from this model");
            let n_rows = t.n_elements() / t.shape[0].max(1);
            let old = t.n_bytes().unwrap_or(0);
            let new = e.target.row_bytes(t.shape[0]).unwrap_or(0) * n_rows;
            before += old;
            after += new;
            let mark = if e.fallback { " (fallback)" } else { "" };
            println!(
                "{:<48} {:>8} -> {:<8} {:>12}{mark}",
                e.name,
                e.source.name(),
                e.target.name(),
                human_bytes(new)
            );
        }
        let n: u64 = entries
            .iter()
            .map(|e| model.tensor(&e.name).map_or(0, |(_, t)| t.n_elements()))
            .sum();
        println!(
            "{}: {} -> {} ({:.2} bits per weight)",
            target.name(),
            human_bytes(before),
            human_bytes(after),
            after as f64 * 8.0 / n.max(1) as f64
        );
        if let Some(e) = convert::plan::missing_imatrix(&entries, &opts.plan) {
            eprintln!(
                "warning: this quantization will require an importance matrix (tensor `{}` → {})",
                e.name, e.target
            );
        }
        return Ok(());
    }
    let t0 = std::time::Instant::now();
    let bar = super::convert::progress_bar();
    let progress = bar.clone().map(super::convert::progress_callback);
    let result = requant::quantize_file_with(&args.input, &args.output, target, &opts, progress.as_ref());
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let entries = result.map_err(to_cli)?;
    let changed = entries.iter().filter(|e| e.target != e.source).count();
    eprintln!(
        "hf2q quantize: {} tensors ({} converted) → {} in {:.2}s",
        entries.len(),
        changed,
        args.output.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
