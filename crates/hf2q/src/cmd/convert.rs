//! `hf2q convert DIR --quant TYPE -o OUT.gguf`: HuggingFace directory → GGUF, tensor for tensor what
//! llama.cpp's `convert_hf_to_gguf.py` (+ `llama-quantize` for quantized types) writes.
//! `hf2q convert --repo ORG/NAME [--revision REV]` first downloads the repository's files into the
//! cache (`convert::hub`), then converts that snapshot folder the same way.

use super::quantize::plan_options;
use crate::error::{CliError, CliResult};
use convert::plan::Target;
use convert::requant::QuantizeOptions;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ConvertArgs {
    /// HuggingFace model directory (config.json, *.safetensors, tokenizer files); or --repo.
    pub dir: Option<PathBuf>,
    /// Download ORG/NAME from the HuggingFace Hub ($HF_ENDPOINT, $HF_TOKEN) into the cache
    /// ($HF2Q_CACHE/hub, default ~/.cache/hf2q/hub), resumably and verified, then convert it.
    #[arg(long, value_name = "ORG/NAME")]
    pub repo: Option<String>,
    /// Branch, tag or commit of --repo (default main).
    #[arg(long, value_name = "REV")]
    pub revision: Option<String>,
    /// Output file type: bf16 (default), f16, f32, q8_0, or any llama-quantize type (Q4_K_M, IQ4_XS, …).
    /// A llama-quantize type gives what `convert_hf_to_gguf.py --outtype T` + `llama-quantize` give,
    /// T the checkpoint's own precision (bf16 for a BF16 checkpoint, f16 for F16, f32 otherwise),
    /// so the weights are quantized from their exact values.
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
    match (&args.dir, &args.repo) {
        (Some(_), Some(_)) => {
            return Err(CliError::input(
                "give either a model directory DIR or --repo ORG/NAME, not both",
            ))
        }
        (None, None) => return Err(CliError::input("missing the model: DIR or --repo ORG/NAME")),
        _ => {}
    }
    if let Some(dir) = &args.dir {
        if args.revision.is_some() {
            return Err(CliError::input("--revision applies to --repo only"));
        }
        if !dir.is_dir() {
            return Err(CliError::input(format!(
                "{}: not a directory (expected a HuggingFace model directory)",
                dir.display()
            )));
        }
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
    // Everything is checked: now download, if asked to.
    let (dir, source) = match (&args.dir, &args.repo) {
        (Some(dir), _) => (dir.clone(), None),
        (None, Some(repo)) => {
            let revision = args.revision.as_deref().unwrap_or("main");
            let snap = download(repo, revision)?;
            let source = serde_json::json!({"repo": repo, "revision": revision, "commit": snap.commit});
            (snap.dir, Some(source))
        }
        (None, None) => unreachable!("checked above"),
    };
    let t0 = std::time::Instant::now();
    let bar = progress_bar();
    let progress = bar.clone().map(progress_callback);
    let copts = convert::pipeline::ConvertOptions {
        no_mtp: args.no_mtp,
        measure_error: args.report.is_some(),
        progress,
    };
    let summary = convert::pipeline::convert_with(&dir, &output, target, &opts, &copts).map_err(|e| {
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
        write_report(path, &dir, source, target, &output, &summary, convert_s)?;
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

/// Download `repo` at `revision` into the cache (or find it there), with a byte progress bar on a
/// terminal; returns the snapshot.
pub fn download(repo: &str, revision: &str) -> CliResult<convert::hub::Snapshot> {
    use convert::hub::Event;
    let opts = convert::hub::HubOptions::from_env(super::doctor::cache_dir().join("hub"));
    let bar = progress_bar();
    let mut progress = |e: Event| {
        let Some(b) = &bar else { return };
        match e {
            Event::Start { file, offset, size } => {
                b.reset();
                b.set_length(size.unwrap_or(0));
                b.set_position(offset);
                b.set_message(file.to_string());
            }
            Event::Bytes { done, .. } => b.set_position(done),
            Event::Done { .. } => {}
        }
    };
    let t0 = std::time::Instant::now();
    let result = convert::hub::download(repo, revision, &opts, &mut progress);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let snap = result.map_err(|e| {
        if e.is_invalid_input() {
            CliError::input(e.to_string())
        } else {
            CliError::runtime(e.to_string())
        }
    })?;
    if snap.downloaded.is_empty() {
        tracing::info!("{repo}@{revision}: all files cached in {}", snap.dir.display());
    } else {
        eprintln!(
            "hf2q convert: downloaded {} file(s), {} of {repo}@{} in {:.1}s into {}",
            snap.downloaded.len(),
            super::human_bytes(snap.bytes_downloaded),
            &snap.commit[..snap.commit.len().min(12)],
            t0.elapsed().as_secs_f64(),
            snap.dir.display()
        );
    }
    Ok(snap)
}

/// A progress bar on stderr when it is a terminal; nothing otherwise. Its position is output
/// bytes (so the rate and ETA follow the data, not the tensor count).
pub fn progress_bar() -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let b = indicatif::ProgressBar::new(0);
    b.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} {bytes_per_sec}, ETA {eta} {wide_msg}")
            .expect("valid template"),
    );
    Some(b)
}

/// Moves `bar` with the converter's progress events: bytes written, and which tensor of how many.
pub fn progress_callback(bar: indicatif::ProgressBar) -> convert::pipeline::Progress {
    Box::new(move |e: &convert::pipeline::ProgressEvent| {
        bar.set_length(e.bytes_total);
        bar.set_position(e.bytes_done);
        bar.set_message(format!("tensor {}/{} {}", e.tensor + 1, e.tensors, e.name));
    })
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

#[allow(clippy::too_many_arguments)]
fn write_report(
    path: &std::path::Path,
    dir: &std::path::Path,
    source: Option<serde_json::Value>,
    target: Target,
    output: &std::path::Path,
    summary: &convert::pipeline::ConvertSummary,
    convert_s: f64,
) -> CliResult {
    let t0 = std::time::Instant::now();
    let mut files = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| CliError::runtime(format!("{}: {e}", dir.display())))?
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
    let mut input = serde_json::json!({"dir": dir, "files": files});
    if let Some(source) = source {
        input["hub"] = source;
    }
    let report = serde_json::json!({
        "hf2q_version": env!("CARGO_PKG_VERSION"),
        "input": input,
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
