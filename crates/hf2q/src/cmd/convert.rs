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
    /// Write a JSON report: inputs with SHA-256, per-tensor type and quantization RMSE, timings, peak memory.
    #[arg(long, value_name = "FILE.json")]
    pub report: Option<PathBuf>,
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
    let bar = progress_bar();
    let progress: Option<convert::pipeline::Progress> = bar.clone().map(|b| {
        Box::new(move |i: usize, n: usize, name: &str| {
            b.set_length(n as u64);
            b.set_position(i as u64);
            b.set_message(name.to_string());
        }) as convert::pipeline::Progress
    });
    let copts = convert::pipeline::ConvertOptions {
        no_mtp: args.no_mtp,
        measure_error: args.report.is_some(),
        progress,
    };
    let summary = convert::pipeline::convert_with(&args.dir, &output, target, &opts, &copts).map_err(|e| {
        if e.is_invalid_input() {
            CliError::input(e.to_string())
        } else {
            CliError::runtime(e.to_string())
        }
    })?;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let convert_s = t0.elapsed().as_secs_f64();
    for n in &summary.notes {
        tracing::warn!("{n}");
    }
    if let Some(path) = &args.report {
        write_report(path, &args, target, &output, &summary, convert_s)?;
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

/// A progress bar on stderr when it is a terminal; nothing otherwise.
fn progress_bar() -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let b = indicatif::ProgressBar::new(0);
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} tensors, {elapsed} elapsed, ETA {eta} {wide_msg}",
        )
        .expect("valid template"),
    );
    Some(b)
}

fn sha256_file(path: &std::path::Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut f = std::fs::File::open(path)?;
    std::io::copy(&mut f, &mut h)?;
    Ok(format!("{:x}", h.finalize()))
}

/// Peak resident memory of this process (`VmHWM`), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

fn write_report(
    path: &std::path::Path,
    args: &ConvertArgs,
    target: Target,
    output: &std::path::Path,
    summary: &convert::pipeline::ConvertSummary,
    convert_s: f64,
) -> CliResult {
    let t0 = std::time::Instant::now();
    let mut files = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&args.dir)
        .map_err(|e| CliError::runtime(format!("{}: {e}", args.dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    entries.sort();
    for p in entries {
        let bytes = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        let sha = sha256_file(&p).map_err(|e| CliError::runtime(format!("{}: {e}", p.display())))?;
        files.push(serde_json::json!({"path": p.file_name().map(|n| n.to_string_lossy().into_owned()), "bytes": bytes, "sha256": sha}));
    }
    let hash_s = t0.elapsed().as_secs_f64();
    let report = serde_json::json!({
        "hf2q_version": env!("CARGO_PKG_VERSION"),
        "input": {"dir": args.dir, "files": files},
        "architecture": {"huggingface": summary.hf_architecture, "gguf": summary.architecture},
        "target": target.name(),
        "output": {"path": output, "bytes": std::fs::metadata(output).map(|m| m.len()).ok()},
        "tensors": summary.tensors.iter().map(|t| serde_json::json!({
            "name": t.name, "type": t.ty.name(), "shape": t.ne, "bytes": t.bytes, "rmse": t.rmse,
        })).collect::<Vec<_>>(),
        "notes": summary.notes,
        "timings": {"convert_s": convert_s, "hash_inputs_s": hash_s},
        "peak_rss_bytes": peak_rss_bytes(),
    });
    let text = serde_json::to_string_pretty(&report).expect("serialisable");
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| CliError::runtime(format!("--report {}: {e}", path.display())))
}
