//! What this machine offers the backends: CPU features chosen for the kernels, and NVIDIA GPUs
//! found by loading the driver library at run time (nothing CUDA is linked at build time).

pub mod cpu;
pub mod cuda;

pub use cpu::{cpu_info, CpuInfo};
pub use cuda::{probe_cuda, CudaProbe, GpuInfo};
