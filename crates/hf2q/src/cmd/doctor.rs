//! `hf2q doctor`: what this machine offers hf2q.

use super::human_bytes;
use crate::error::CliResult;
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// hf2q's cache directory: `$HF2Q_CACHE`, else `$XDG_CACHE_HOME/hf2q`, else `~/.cache/hf2q`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HF2Q_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("hf2q");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("hf2q")
}

/// Free bytes on the filesystem holding `path` (or its nearest existing ancestor).
fn free_disk(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let c = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

pub fn run(args: DoctorArgs) -> CliResult {
    let cpu = engine::device::cpu_info();
    let cuda = engine::device::probe_cuda();
    // With a GPU: open it and compile (or load from the cache) the backend's kernels.
    let kernels: Option<Result<String, String>> =
        (!cuda.gpus.is_empty()).then(|| engine::backend::cuda::check(0).map_err(|e| e.to_string()));
    let cache = cache_dir();
    let free = free_disk(&cache);
    if args.json {
        let j = json!({
            "version": env!("CARGO_PKG_VERSION"),
            "cpu": cpu,
            "cuda": cuda,
            "cuda_backend": kernels.as_ref().map(|k| match k {
                Ok(s) => json!({"ok": true, "detail": s}),
                Err(e) => json!({"ok": false, "error": e}),
            }),
            "cache_dir": cache,
            "cache_dir_exists": cache.is_dir(),
            "free_disk_bytes": free,
        });
        println!("{}", serde_json::to_string_pretty(&j).expect("serialisable"));
        return Ok(());
    }
    let row = |k: &str, v: String| println!("{k:<15} {v}");
    row("hf2q", env!("CARGO_PKG_VERSION").into());
    row(
        "cpu",
        format!("{} ({}, {} logical cores)", cpu.model, cpu.arch, cpu.logical_cores),
    );
    row(
        "simd",
        if cpu.features.is_empty() {
            "none detected".into()
        } else {
            cpu.features.join(" ")
        },
    );
    row("cpu kernels", cpu.kernel_path.into());
    let mem = match (cpu.mem_total_bytes, cpu.mem_available_bytes) {
        (Some(t), Some(a)) => format!("{} total, {} available", human_bytes(t), human_bytes(a)),
        (Some(t), None) => format!("{} total", human_bytes(t)),
        _ => "unknown".into(),
    };
    row("memory", mem);
    match &cuda.driver_library {
        Some(lib) => row(
            "nvidia driver",
            format!(
                "{lib} (CUDA driver API {})",
                cuda.driver_version.as_deref().unwrap_or("?")
            ),
        ),
        None => row("nvidia driver", "not found".into()),
    }
    if cuda.gpus.is_empty() {
        row(
            "gpus",
            format!("none ({})", cuda.problem.as_deref().unwrap_or("no GPU")),
        );
    } else {
        for g in &cuda.gpus {
            row(
                &format!("gpu {}", g.ordinal),
                format!(
                    "{} ({}, compute {}.{})",
                    g.name,
                    human_bytes(g.total_mem_bytes),
                    g.compute_capability.0,
                    g.compute_capability.1
                ),
            );
        }
    }
    row(
        "nvrtc",
        cuda.nvrtc_library.clone().unwrap_or_else(|| "not found".into()),
    );
    match &kernels {
        Some(Ok(s)) => row("cuda backend", s.clone()),
        Some(Err(e)) => row("cuda backend", format!("NOT USABLE: {e}")),
        None => row("cuda backend", "no GPU".into()),
    }
    row(
        "cublas",
        cuda.cublas_library.clone().unwrap_or_else(|| "not found".into()),
    );
    row(
        "cache dir",
        format!(
            "{}{}",
            cache.display(),
            if cache.is_dir() { "" } else { " (not created yet)" }
        ),
    );
    row("free disk", free.map(human_bytes).unwrap_or_else(|| "unknown".into()));
    Ok(())
}
