//! Finding the CUDA libraries at run time and compiling the kernels with NVRTC.
//!
//! Nothing CUDA is linked at build time (cudarc with dynamic loading): a machine without the
//! driver or NVRTC gets an error naming what is missing. The kernels are the `.cu` files beside
//! this module, included as strings and compiled for the device's compute capability on first use;
//! the machine code (cubin) is cached on disk under `$HF2Q_CACHE/cuda/`, keyed by a hash of the
//! source, the options, the architecture and the NVRTC version.

use crate::{EngineError, Result};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use std::ffi::{c_char, CString};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;

const COMMON: &str = include_str!("kernels/common.cuh");
const QUANT: &str = include_str!("kernels/quant.cuh");

/// The kernel modules: name and source (each compiled with the common headers in front). The
/// matrix-vector kernels are one module per row count (`MMV_R`, `kernels/matmul.cu`), so that
/// compiling them (most of the compile time) is spread over threads (`compile_all`).
pub const MODULES: &[(&str, &str)] = &[
    ("ops", include_str!("kernels/ops.cu")),
    (
        "matmul1",
        concat!("#define MMV_R 1\n", include_str!("kernels/matmul.cu")),
    ),
    (
        "matmul2",
        concat!("#define MMV_R 2\n", include_str!("kernels/matmul.cu")),
    ),
    (
        "matmul4",
        concat!("#define MMV_R 4\n", include_str!("kernels/matmul.cu")),
    ),
    (
        "matmul8",
        concat!("#define MMV_R 8\n", include_str!("kernels/matmul.cu")),
    ),
    ("mmq", include_str!("kernels/mmq.cu")),
    ("attention", include_str!("kernels/attention.cu")),
    ("recurrent", include_str!("kernels/recurrent.cu")),
    ("sample", include_str!("kernels/sample.cu")),
];

/// Where the CUDA toolkit's libraries usually are, for libraries not on the loader's path.
fn library_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        if let Some(p) = std::env::var_os(var) {
            dirs.push(PathBuf::from(&p).join("lib64"));
            dirs.push(PathBuf::from(p).join("lib"));
        }
    }
    dirs.push("/usr/local/cuda/lib64".into());
    dirs.push("/usr/local/cuda/targets/x86_64-linux/lib".into());
    dirs.push("/usr/lib/x86_64-linux-gnu".into());
    // pip's nvidia-cuda-nvrtc wheels (PyTorch environments).
    for root in ["/usr/local/lib", "/usr/lib", "/opt"] {
        if let Ok(rd) = std::fs::read_dir(root) {
            for e in rd.flatten() {
                let p = e.path();
                for sub in ["site-packages", "dist-packages"] {
                    dirs.push(p.join(sub).join("nvidia/cu13/lib"));
                    dirs.push(p.join(sub).join("nvidia/cuda_nvrtc/lib"));
                }
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir("/opt") {
        for e in rd.flatten() {
            for py in ["python3.12", "python3.11", "python3.13", "python3.10"] {
                let sp = e.path().join(".venv/lib").join(py).join("site-packages/nvidia");
                dirs.push(sp.join("cu13/lib"));
                dirs.push(sp.join("cuda_nvrtc/lib"));
            }
        }
    }
    dirs
}

/// Load NVRTC before cudarc looks for it by name: `$HF2Q_NVRTC` (a path), else the first
/// `libnvrtc.so.*` in the usual toolkit directories. A library loaded here is found by its name
/// afterwards (the dynamic loader matches already loaded libraries by soname).
pub fn preload_nvrtc() -> Option<String> {
    static FOUND: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            // SAFETY: the presence check only opens the library.
            if unsafe { nvrtc_sys::is_culib_present() } {
                return Some("libnvrtc (on the loader's path)".into());
            }
            let mut candidates: Vec<PathBuf> = std::env::var_os("HF2Q_NVRTC").map(PathBuf::from).into_iter().collect();
            for d in library_dirs() {
                for n in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
                    candidates.push(d.join(n));
                }
            }
            for c in candidates {
                if !c.exists() {
                    continue;
                }
                // SAFETY: loading the vendor's NVRTC runs its initialisers, as cudarc's own load would.
                if let Ok(lib) = unsafe { libloading::Library::new(&c) } {
                    // Kept loaded for the life of the process.
                    std::mem::forget(lib);
                    return Some(c.display().to_string());
                }
            }
            None
        })
        .clone()
}

fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HF2Q_CACHE") {
        return PathBuf::from(d).join("cuda");
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("hf2q/cuda");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache/hf2q/cuda")
}

fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    let rc = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(EngineError::Backend(format!("nvrtcVersion failed: {rc:?}")));
    }
    Ok((major, minor))
}

/// Module `body`'s whole source and its NVRTC options for compute capability `cc`. `defines`
/// ("NAME[=V] ...", or comma-separated; HF2Q_CUDA_DEFINE): macros for the kernels' variants kept to
/// be compared (e.g. DECODE_SCALAR_STORES, mmq.cu), each a -D option (so a part of the cache key) of
/// the modules whose own .cu file names it, so the others are not compiled again (a macro tested only
/// in common.cuh or quant.cuh would reach no module).
fn program(body: &str, cc: (i32, i32), defines: &str) -> (String, Vec<String>) {
    let mut opts = vec![
        format!("--gpu-architecture=sm_{}{}", cc.0, cc.1),
        "--std=c++17".to_string(),
    ];
    opts.extend(
        defines
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|d| !d.is_empty() && body.contains(d.split('=').next().unwrap_or(d)))
            .map(|d| format!("-D{d}")),
    );
    (format!("{COMMON}{QUANT}{body}"), opts)
}

/// The cubin of module `name` for compute capability `cc` (e.g. (9, 0)), from the disk cache or
/// compiled now. Returns the bytes and whether it was compiled (not cached).
pub fn module_cubin(name: &str, body: &str, cc: (i32, i32)) -> Result<(Vec<u8>, bool)> {
    if preload_nvrtc().is_none() {
        return Err(EngineError::Backend(
            "NVRTC (libnvrtc.so.13) was not found: install the CUDA toolkit or the nvidia-cuda-nvrtc \
             package, or set HF2Q_NVRTC to the library's path"
                .into(),
        ));
    }
    let version = nvrtc_version()?;
    let (src, opts) = program(body, cc, &std::env::var("HF2Q_CUDA_DEFINE").unwrap_or_default());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&src, &opts, version, env!("CARGO_PKG_VERSION")).hash(&mut h);
    let path = cache_dir().join(format!("{name}-sm{}{}-{:016x}.cubin", cc.0, cc.1, h.finish()));
    if let Ok(bytes) = std::fs::read(&path) {
        if !bytes.is_empty() {
            return Ok((bytes, false));
        }
    }
    let cubin = compile(name, &src, &opts)?;
    // The cache is an optimisation: a read-only or full disk only costs the next start a compile.
    if std::fs::create_dir_all(path.parent().expect("cache file has a parent")).is_ok() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &cubin).is_ok() && std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok((cubin, true))
}

/// `module_cubin` of every module for compute capability `cc`, in parallel (one thread a module:
/// NVRTC compiles programs of different threads at once), in `MODULES`' order.
pub fn compile_all(cc: (i32, i32)) -> Vec<Result<(Vec<u8>, bool)>> {
    std::thread::scope(|s| {
        let jobs: Vec<_> = MODULES
            .iter()
            .map(|&(name, body)| s.spawn(move || module_cubin(name, body, cc)))
            .collect();
        jobs.into_iter()
            .zip(MODULES)
            .map(|(j, (name, _))| {
                j.join().unwrap_or_else(|_| {
                    Err(EngineError::Backend(format!(
                        "compiling module {name}: the thread panicked"
                    )))
                })
            })
            .collect()
    })
}

fn compile(name: &str, src: &str, opts: &[String]) -> Result<Vec<u8>> {
    let fail =
        |what: &str, e: &dyn std::fmt::Debug| EngineError::Backend(format!("NVRTC {what} of module {name}: {e:?}"));
    let csrc = CString::new(src).map_err(|e| fail("source", &e))?;
    let cname = CString::new(format!("{name}.cu")).map_err(|e| fail("name", &e))?;
    let prog = nvrtc::create_program(&csrc, Some(&cname)).map_err(|e| fail("create", &e))?;
    // SAFETY: `prog` is a valid program until destroyed below; options are NUL-free strings.
    let res = unsafe { nvrtc::compile_program(prog, opts) };
    let out = (|| {
        if let Err(e) = res {
            // SAFETY: as above.
            let log = unsafe { nvrtc::get_program_log(prog) }.unwrap_or_default();
            let log: Vec<u8> = log.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
            return Err(EngineError::Backend(format!(
                "NVRTC could not compile module {name} ({e:?}):\n{}",
                String::from_utf8_lossy(&log)
            )));
        }
        let mut size = 0usize;
        // SAFETY: compiled program; valid out-pointer, then a buffer of that size.
        unsafe {
            let rc = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size);
            if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                return Err(fail("cubin size", &rc));
            }
            let mut buf = vec![0 as c_char; size];
            let rc = nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr());
            if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(fail("cubin", &rc));
            }
            Ok(buf.into_iter().map(|c| c as u8).collect())
        }
    })();
    // SAFETY: destroyed once.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every module compiles for Hopper (sm_90) with NVRTC; needs NVRTC only, no GPU
    /// (`scripts/fetch-models` puts NVIDIA's into the models folder).
    #[test]
    fn kernels_compile_for_sm90() {
        if std::env::var_os("HF2Q_NVRTC").is_none() {
            let models = std::env::var_os("HF2Q_MODELS")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/hf2q/models")));
            if let Some(lib) = models.map(|m| m.join("nvrtc/libnvrtc.so.13")).filter(|p| p.exists()) {
                // SAFETY: set before any thread of this test reads it; other tests do not read it.
                std::env::set_var("HF2Q_NVRTC", lib);
            }
        }
        if preload_nvrtc().is_none() {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "NOT RUN: CUDA kernels compile check (no NVRTC: run scripts/fetch-models)"
            );
            return;
        }
        // Through `compile_all` (the modules in parallel) into an empty cache, then again: every
        // module from the cache, the same bytes.
        let dir = tempfile::tempdir().unwrap();
        // SAFETY: as above; only this test compiles kernels on a machine without a GPU.
        std::env::set_var("HF2Q_CACHE", dir.path());
        let built = |want_fresh: bool| -> Vec<Vec<u8>> {
            let out = compile_all((9, 0));
            MODULES
                .iter()
                .zip(out)
                .map(|((name, _), r)| {
                    let (cubin, fresh) = r.unwrap_or_else(|e| panic!("module {name}: {e}"));
                    assert_eq!(fresh, want_fresh, "module {name}: compiled now {fresh}");
                    cubin
                })
                .collect()
        };
        let cubins = built(true);
        assert_eq!(built(false), cubins, "the cached cubins differ from the compiled ones");
        for ((name, _), cubin) in MODULES.iter().zip(cubins) {
            assert!(cubin.len() > 1000, "module {name}: {} bytes of cubin", cubin.len());
            same_kernels(name, &cubin);
        }
        // The variants kept to be compared (HF2Q_CUDA_DEFINE) define the same kernels: a define
        // that drops a type's kernels fails every load of the module (Q4_DIRECT did, 2026-12-07).
        let (name, body) = MODULES.iter().find(|(n, _)| *n == "mmq").expect("the mmq module");
        let (src, opts) = program(body, (9, 0), "Q4_DIRECT=4 Q8_DIRECT=2");
        assert_eq!(opts.len(), 4, "both defines reach mmq: {opts:?}");
        let cubin = compile(name, &src, &opts).unwrap_or_else(|e| panic!("module {name} with {opts:?}: {e}"));
        same_kernels(name, &cubin);
    }

    /// Every kernel the backend loads from module `name` is defined in `cubin` (a macro-made name
    /// can come out wrong), and every kernel defined there is loaded.
    fn same_kernels(name: &str, cubin: &[u8]) {
        // A defined kernel's name is a whole entry of the cubin's (ELF) string table, NUL on both sides.
        let has = |k: &str| {
            let needle = [&[0u8][..], k.as_bytes(), &[0u8][..]].concat();
            cubin.windows(needle.len()).any(|w| w == needle.as_slice())
        };
        let listed = super::super::dev::kernel_names(name);
        for k in &listed {
            assert!(has(k), "module {name} defines no kernel {k}");
        }
        // A kernel left out of the list panics at its first launch: each one's code is a section
        // `.text.NAME` (NAME unmangled, extern "C").
        for entry in cubin.split(|&b| b == 0) {
            let Some(k) = entry.strip_prefix(b".text.") else {
                continue;
            };
            let k = String::from_utf8_lossy(k);
            if !k.starts_with("_Z") {
                assert!(
                    listed.contains(&k.to_string()),
                    "module {name}: kernel {k} is not in kernel_names"
                );
            }
        }
    }
}
