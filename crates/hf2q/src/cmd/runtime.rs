//! Options shared by the commands that run a model (`generate`, `bench`, `perplexity`).

use crate::error::{CliError, CliResult};
use clap::Args;
use engine::backend::cpu::Cpu;
use engine::backend::KvType;
use engine::generate::LoadedModel;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args, Clone)]
pub struct ModelArgs {
    /// GGUF model file (any shard of a split model).
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// CPU threads (0 = one per core).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// KV cache element type: f16 or q8_0.
    #[arg(long, default_value = "f16", value_parser = parse_kv_type)]
    pub kv_type: KvType,
    /// Compute device: auto, cpu or cuda.
    #[arg(long, default_value = "auto")]
    pub device: String,
}

fn parse_kv_type(s: &str) -> Result<KvType, String> {
    KvType::parse(s).ok_or_else(|| format!("unknown KV cache type {s:?} (use f16 or q8_0)"))
}

impl ModelArgs {
    pub fn backend(&self) -> CliResult<Arc<Cpu>> {
        match self.device.as_str() {
            "auto" | "cpu" => {}
            "cuda" => {
                return Err(CliError::input(
                    "--device cuda: this build runs models on the CPU only (the CUDA backend is not implemented yet)",
                ))
            }
            other => {
                return Err(CliError::input(format!(
                    "unknown --device {other:?} (use auto, cpu or cuda)"
                )))
            }
        }
        Ok(Arc::new(Cpu::new(self.threads)?))
    }

    pub fn load(&self) -> CliResult<(Arc<Cpu>, LoadedModel<Cpu>)> {
        if !self.model.is_file() {
            return Err(CliError::input(format!("{}: no such model file", self.model.display())));
        }
        let cpu = self.backend()?;
        let m = LoadedModel::load(cpu.clone(), &self.model)?;
        tracing::info!(
            "loaded {} ({} layers, {} vocab) on {}",
            self.model.display(),
            m.model.info().n_layer,
            m.model.info().n_vocab,
            engine::backend::Backend::name(&*cpu)
        );
        Ok((cpu, m))
    }
}
