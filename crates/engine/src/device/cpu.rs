//! CPU model, core count, memory and the SIMD features detected at run time.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct CpuInfo {
    pub model: String,
    pub arch: &'static str,
    pub logical_cores: usize,
    /// SIMD features relevant to the kernels, as detected at run time.
    pub features: Vec<&'static str>,
    /// The widest kernel family the CPU backend will select.
    pub kernel_path: &'static str,
    pub mem_total_bytes: Option<u64>,
    pub mem_available_bytes: Option<u64>,
}

/// Detected SIMD features, in the order they matter to kernel selection.
pub fn simd_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut f = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($name:tt),*) => { $( if std::arch::is_x86_feature_detected!($name) { f.push($name); } )* };
        }
        probe!(
            "sse3",
            "ssse3",
            "fma",
            "f16c",
            "avx",
            "avx2",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512vnni",
            "avx512bf16",
            "avxvnni"
        );
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! probe {
            ($($name:tt),*) => { $( if std::arch::is_aarch64_feature_detected!($name) { f.push($name); } )* };
        }
        probe!("neon", "dotprod", "fp16", "i8mm", "sve", "sve2");
    }
    f
}

/// Name of the kernel family a CPU with `features` gets.
pub fn kernel_path(features: &[&str]) -> &'static str {
    let has = |n| features.contains(&n);
    if has("avx512f") && has("avx512bw") && has("avx512vnni") {
        "avx512-vnni"
    } else if has("avx512f") && has("avx512bw") {
        "avx512"
    } else if has("avx2") && has("fma") {
        "avx2"
    } else if has("neon") && has("dotprod") {
        "neon-dotprod"
    } else if has("neon") {
        "neon"
    } else {
        "scalar"
    }
}

fn meminfo_kib(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()
}

pub fn cpu_info() -> CpuInfo {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name") || l.starts_with("Model") || l.starts_with("Hardware"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let features = simd_features();
    CpuInfo {
        model,
        arch: std::env::consts::ARCH,
        logical_cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        kernel_path: kernel_path(&features),
        features,
        mem_total_bytes: meminfo_kib(&meminfo, "MemTotal:").map(|k| k * 1024),
        mem_available_bytes: meminfo_kib(&meminfo, "MemAvailable:").map(|k| k * 1024),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_path_prefers_widest() {
        assert_eq!(
            kernel_path(&["avx2", "fma", "avx512f", "avx512bw", "avx512vnni"]),
            "avx512-vnni"
        );
        assert_eq!(kernel_path(&["avx2", "fma"]), "avx2");
        assert_eq!(kernel_path(&["neon"]), "neon");
        assert_eq!(kernel_path(&[]), "scalar");
    }

    #[test]
    fn meminfo_parse() {
        let t = "MemTotal:       24576000 kB\nMemAvailable:   1000 kB\n";
        assert_eq!(meminfo_kib(t, "MemTotal:"), Some(24576000));
        assert_eq!(meminfo_kib(t, "MemAvailable:"), Some(1000));
        assert_eq!(meminfo_kib(t, "Nope:"), None);
    }
}
