//! Options shared by the commands that run a model (`generate`, `bench`, `perplexity`, `embed`),
//! and the step that loads the model on the backend `--device` picks.

use crate::error::{CliError, CliResult};
use clap::Args;
use engine::backend::select::{with_backend, BackendOptions, Device, WithBackend};
use engine::backend::{Backend, KvType};
use engine::generate::LoadedModel;
use std::path::{Path, PathBuf};
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
    /// Compute device: auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
}

fn parse_kv_type(s: &str) -> Result<KvType, String> {
    KvType::parse(s).ok_or_else(|| format!("unknown KV cache type {s:?} (use f16 or q8_0)"))
}

/// The part of a command that runs on a loaded model, on whichever backend `--device` picked.
pub trait ModelJob {
    fn run<B: Backend>(self, backend: Arc<B>, m: LoadedModel<B>) -> CliResult;
}

struct Load<'a, J> {
    path: &'a Path,
    job: J,
}

impl<J: ModelJob> WithBackend for Load<'_, J> {
    type Output = CliResult;
    fn run<B: Backend>(self, backend: Arc<B>) -> CliResult {
        let m = LoadedModel::load(backend.clone(), self.path)?;
        tracing::info!(
            "loaded {} ({} layers, {} vocab) on {}",
            self.path.display(),
            m.model.info().n_layer,
            m.model.info().n_vocab,
            backend.name()
        );
        self.job.run(backend, m)
    }
}

impl ModelArgs {
    /// The backend options `--device` and `-t` ask for.
    pub fn options(&self) -> CliResult<BackendOptions> {
        let device = Device::parse(&self.device).map_err(|e| CliError::input(format!("--device: {e}")))?;
        Ok(BackendOptions {
            device,
            threads: self.threads,
            exact_activations: false,
        })
    }

    /// Load the model on the chosen backend and run `job` on it.
    pub fn run<J: ModelJob>(&self, job: J) -> CliResult {
        if !self.model.is_file() {
            return Err(CliError::input(format!("{}: no such model file", self.model.display())));
        }
        with_backend(&self.options()?, Load { path: &self.model, job })?
    }
}
