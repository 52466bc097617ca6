//! Choosing a backend at run time. Commands and the server say which device they want
//! ([`Device`]) and hand a [`WithBackend`] job to [`with_backend`]; this is the one place that names
//! the concrete backends, so everything above it is generic over [`Backend`].

use super::cpu::Cpu;
use super::cuda::Cuda;
use super::Backend;
use crate::Result;
use std::sync::Arc;

/// The compute device asked for by `--device`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Device {
    /// The best device present: the first NVIDIA GPU when its driver and NVRTC load, else the CPU
    /// (embedding models: the CPU for now).
    #[default]
    Auto,
    Cpu,
    /// An NVIDIA GPU by index.
    Cuda(usize),
}

impl Device {
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    pub fn parse(s: &str) -> std::result::Result<Device, String> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Device::Cuda(n)),
                _ => Err(format!("unknown device {s:?} (use auto, cpu, cuda or cuda:N)")),
            },
        }
    }
}

/// How to build the backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct BackendOptions {
    pub device: Device,
    /// CPU worker threads (0 = one per core).
    pub threads: usize,
    /// Multiply by unquantized activations (encoders, whose vectors are compared directly; see
    /// `Cpu::with_exact_activations`).
    pub exact_activations: bool,
}

/// Work to run on whichever backend [`with_backend`] builds.
pub trait WithBackend {
    type Output;
    fn run<B: Backend>(self, backend: Arc<B>) -> Self::Output;
}

/// Build the backend `opts` asks for and run `job` on it.
pub fn with_backend<W: WithBackend>(opts: &BackendOptions, job: W) -> Result<W::Output> {
    let cpu = || -> Result<Arc<Cpu>> {
        let mut cpu = Cpu::new(opts.threads)?;
        if opts.exact_activations {
            cpu = cpu.with_exact_activations();
        }
        Ok(Arc::new(cpu))
    };
    match opts.device {
        Device::Cpu => Ok(job.run(cpu()?)),
        Device::Cuda(n) => Ok(job.run(Arc::new(Cuda::new(n)?))),
        Device::Auto => {
            // Encoders stay on the CPU under `auto` until their CUDA path has been measured against
            // the CPU's vectors on a GPU (`--device cuda` runs them there).
            if !cuda_present() || opts.exact_activations {
                return Ok(job.run(cpu()?));
            }
            match Cuda::new(0) {
                Ok(c) => Ok(job.run(Arc::new(c))),
                Err(e) => {
                    tracing::warn!("--device auto: the GPU is not usable ({e}); running on the CPU");
                    Ok(job.run(cpu()?))
                }
            }
        }
    }
}

/// Whether an NVIDIA driver is installed and reports a GPU (cheap: no context is made).
pub fn cuda_present() -> bool {
    let p = crate::device::probe_cuda();
    p.problem.is_none() && !p.gpus.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!(Device::parse("auto"), Ok(Device::Auto));
        assert_eq!(Device::parse("CPU"), Ok(Device::Cpu));
        assert_eq!(Device::parse("cuda"), Ok(Device::Cuda(0)));
        assert_eq!(Device::parse("cuda:3"), Ok(Device::Cuda(3)));
        assert!(Device::parse("cuda:x").unwrap_err().contains("cuda:N"));
        assert!(Device::parse("tpu").is_err());
    }

    struct Name;
    impl WithBackend for Name {
        type Output = String;
        fn run<B: Backend>(self, backend: Arc<B>) -> String {
            backend.name()
        }
    }

    #[test]
    fn builds_the_cpu_and_refuses_a_missing_gpu() {
        let opts = BackendOptions {
            threads: 1,
            ..Default::default()
        };
        assert!(with_backend(&opts, Name).unwrap().starts_with("cpu"));
        let cuda = BackendOptions {
            device: Device::Cuda(0),
            ..opts
        };
        if cuda_present() {
            eprintln!("NOT RUN: the refusal of --device cuda without a GPU (this machine has one)");
            return;
        }
        let e = with_backend(&cuda, Name).unwrap_err().to_string();
        assert!(e.contains("NVIDIA") || e.contains("cuda:0"), "{e}");
    }
}
