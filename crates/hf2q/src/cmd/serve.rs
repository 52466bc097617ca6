//! `hf2q serve`: the OpenAI-compatible HTTP server (crates/serve).

use crate::error::{CliError, CliResult};
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct ServeArgs {
    /// GGUF model to serve (repeatable; a request's `model` picks one by file stem).
    #[arg(short = 'm', long = "model", required = true)]
    pub models: Vec<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// TCP port (0 = any free port; the address is printed to stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every route except /health and /readyz.
    #[arg(long, env = "HF2Q_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// CPU threads (0 = one per core).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Context size per model in tokens (0 = the model's training context).
    #[arg(short = 'c', long = "ctx", default_value_t = 4096)]
    pub ctx: usize,
    /// Requests that may wait for a model's engine; more are answered 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub queue_capacity: usize,
    /// Sequences decoded together per model (continuous batching); each gets the full context.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Most prompt tokens prefilled per step, interleaved with the decode steps of active streams.
    #[arg(long, default_value_t = 256)]
    pub prefill_chunk: usize,
    /// Allow browser requests from this origin (repeatable; `*` for any): CORS headers and preflight.
    #[arg(long = "cors-origin")]
    pub cors_origins: Vec<String>,
    /// KV cache memory shared by a model's slots and its prefix cache: positions (`65536`) or
    /// bytes (`2GiB`, `512MiB`). Default: --parallel × --ctx positions.
    #[arg(long, value_parser = serve::KvBudget::parse)]
    pub kv_budget: Option<serve::KvBudget>,
    /// Keep prefix-cache blocks in this directory across restarts (checksummed, written atomically).
    #[arg(long)]
    pub kv_persist: Option<PathBuf>,
    /// Most bytes of blocks kept under --kv-persist (least recently used ones are deleted).
    #[arg(long, default_value = "4GiB", value_parser = serve::parse_bytes)]
    pub kv_persist_max_bytes: u64,
    /// Largest accepted request body.
    #[arg(long, default_value_t = 16 * 1024 * 1024)]
    pub max_body_bytes: usize,
}

pub fn run(args: ServeArgs) -> CliResult {
    if args.parallel == 0 || args.prefill_chunk == 0 {
        return Err(CliError::input("--parallel and --prefill-chunk must be at least 1"));
    }
    for m in &args.models {
        if !m.is_file() {
            return Err(CliError::input(format!("{}: no such model file", m.display())));
        }
    }
    let cfg = serve::ServeConfig {
        host: args.host,
        port: args.port,
        models: args.models,
        api_key: args.api_key,
        threads: args.threads,
        ctx: args.ctx,
        queue_capacity: args.queue_capacity,
        max_body_bytes: args.max_body_bytes,
        parallel: args.parallel,
        prefill_chunk: args.prefill_chunk,
        cors_origins: args.cors_origins,
        kv_budget: args.kv_budget,
        kv_persist: args.kv_persist,
        kv_persist_max_bytes: args.kv_persist_max_bytes,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(serve::run(cfg)).map_err(CliError::input)
}
