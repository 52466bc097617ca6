//! NVIDIA GPU discovery through the driver library, loaded at run time.
//!
//! This is the first step of the CUDA backend too: it establishes that `libcuda` can be loaded
//! before anything else touches CUDA, so a machine without a driver gets a report, not a crash.

use libloading::Library;
use serde::Serialize;
use std::ffi::{c_char, c_int, c_uint, CStr};

#[derive(Debug, Clone, Serialize)]
pub struct GpuInfo {
    pub ordinal: i32,
    pub name: String,
    pub total_mem_bytes: u64,
    pub compute_capability: (i32, i32),
}

#[derive(Debug, Clone, Serialize)]
pub struct CudaProbe {
    /// The driver library that loaded, if any.
    pub driver_library: Option<String>,
    /// Driver API version as `major.minor` (e.g. 13.0).
    pub driver_version: Option<String>,
    pub gpus: Vec<GpuInfo>,
    /// NVRTC and cuBLAS libraries found (needed by the CUDA backend).
    pub nvrtc_library: Option<String>,
    pub cublas_library: Option<String>,
    /// Why no GPU is usable, when none is.
    pub problem: Option<String>,
}

const DRIVER_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so", "nvcuda.dll"];
const NVRTC_NAMES: &[&str] = &[
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so",
    "nvrtc64_130_0.dll",
    "nvrtc64_120_0.dll",
];
const CUBLAS_NAMES: &[&str] = &[
    "libcublas.so.13",
    "libcublas.so.12",
    "libcublas.so",
    "cublas64_13.dll",
    "cublas64_12.dll",
];

fn load_first(names: &[&str]) -> Option<(Library, String)> {
    names.iter().find_map(|n| {
        // SAFETY: loading a vendor library runs its initialisers; these are the libraries the
        // CUDA backend itself loads.
        unsafe { Library::new(n) }.ok().map(|l| (l, n.to_string()))
    })
}

// CUdevice_attribute values from cuda.h.
const ATTR_CC_MAJOR: c_int = 75;
const ATTR_CC_MINOR: c_int = 76;

/// Look for the NVIDIA driver and enumerate GPUs. Never fails: absence is reported in `problem`.
pub fn probe_cuda() -> CudaProbe {
    let mut probe = CudaProbe {
        driver_library: None,
        driver_version: None,
        gpus: Vec::new(),
        nvrtc_library: load_first(NVRTC_NAMES).map(|(_, n)| n),
        cublas_library: load_first(CUBLAS_NAMES).map(|(_, n)| n),
        problem: None,
    };
    let Some((lib, name)) = load_first(DRIVER_NAMES) else {
        probe.problem = Some("no NVIDIA driver library (libcuda.so.1) found".into());
        return probe;
    };
    probe.driver_library = Some(name);
    // SAFETY: signatures follow cuda.h; every out-pointer is a valid local.
    unsafe {
        type Init = unsafe extern "C" fn(c_uint) -> c_int;
        type IntOut = unsafe extern "C" fn(*mut c_int) -> c_int;
        type DevGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
        type DevName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
        type DevMem = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
        type DevAttr = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;
        let sym = |n: &[u8]| lib.get::<*const ()>(n).ok().map(|s| *s);
        let (Some(init), Some(ver), Some(count), Some(get), Some(name), Some(mem), Some(attr)) = (
            sym(b"cuInit\0"),
            sym(b"cuDriverGetVersion\0"),
            sym(b"cuDeviceGetCount\0"),
            sym(b"cuDeviceGet\0"),
            sym(b"cuDeviceGetName\0"),
            sym(b"cuDeviceTotalMem_v2\0"),
            sym(b"cuDeviceGetAttribute\0"),
        ) else {
            probe.problem = Some("driver library lacks the expected CUDA driver API symbols".into());
            return probe;
        };
        let init: Init = std::mem::transmute(init);
        let ver: IntOut = std::mem::transmute(ver);
        let count: IntOut = std::mem::transmute(count);
        let get: DevGet = std::mem::transmute(get);
        let name: DevName = std::mem::transmute(name);
        let mem: DevMem = std::mem::transmute(mem);
        let attr: DevAttr = std::mem::transmute(attr);

        let mut v = 0;
        if ver(&mut v) == 0 {
            probe.driver_version = Some(format!("{}.{}", v / 1000, (v % 1000) / 10));
        }
        let rc = init(0);
        if rc != 0 {
            probe.problem = Some(format!(
                "cuInit failed with CUDA error {rc} (no usable GPU, or driver/device mismatch)"
            ));
            return probe;
        }
        let mut n = 0;
        if count(&mut n) != 0 {
            probe.problem = Some("cuDeviceGetCount failed".into());
            return probe;
        }
        for i in 0..n {
            let mut dev = 0;
            if get(&mut dev, i) != 0 {
                continue;
            }
            let mut buf = [0 as c_char; 256];
            let dev_name = if name(buf.as_mut_ptr(), buf.len() as c_int, dev) == 0 {
                CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
            } else {
                "unknown".into()
            };
            let mut bytes = 0usize;
            mem(&mut bytes, dev);
            let (mut major, mut minor) = (0, 0);
            attr(&mut major, ATTR_CC_MAJOR, dev);
            attr(&mut minor, ATTR_CC_MINOR, dev);
            probe.gpus.push(GpuInfo {
                ordinal: i,
                name: dev_name,
                total_mem_bytes: bytes as u64,
                compute_capability: (major, minor),
            });
        }
        if probe.gpus.is_empty() {
            probe.problem = Some("the NVIDIA driver reports no GPUs".into());
        }
    }
    probe
}
