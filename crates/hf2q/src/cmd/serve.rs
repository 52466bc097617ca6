//! `hf2q serve`: the OpenAI-compatible HTTP server (crates/serve).

use crate::error::{CliError, CliResult};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct ServeArgs {
    /// GGUF model to serve (repeatable; a request's `model` picks one by file stem or alias), or a
    /// HuggingFace repository ORG/NAME[:QUANT]: downloaded with the Hub code, converted once into
    /// the cache ($HF2Q_CACHE/models) to QUANT (default Q8_0 for models under 2B parameters,
    /// Q4_K_M above), and served as ORG/NAME[:QUANT].
    #[arg(short = 'm', long = "model", required_unless_present = "models_dir")]
    pub models: Vec<PathBuf>,
    /// Serve every GGUF file of DIR under its file stem, each loaded when a request first names it
    /// (split models by their first shard). Listed by /v1/models with `"loaded"`.
    #[arg(long = "models-dir", value_name = "DIR")]
    pub models_dir: Option<PathBuf>,
    /// Memory the loaded models may take together (file bytes plus KV pool; e.g. 8GiB): models of
    /// --models-dir that are idle are unloaded, least recently used first, to make room. A model
    /// that cannot fit at all is a 503 naming the sizes.
    #[arg(long = "models-memory", value_parser = serve::parse_bytes)]
    pub models_memory: Option<u64>,
    /// The id a model is served under instead of its file stem (repeatable: the first --alias
    /// names the first -m, the second the second, …).
    #[arg(long = "alias")]
    pub aliases: Vec<String>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// TCP port [default: 8080, or the next free port when 8080 is taken]. 0 = any free port; the
    /// address is printed to stderr. A port given here that is taken is an error.
    #[arg(long)]
    pub port: Option<u16>,
    /// Require `Authorization: Bearer KEY` on every route except /health and /readyz.
    #[arg(long, env = "HF2Q_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// CPU threads (0 = one per core).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Compute device: auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Context size per model in tokens (0 = the model's training context).
    #[arg(short = 'c', long = "ctx", default_value_t = 4096)]
    pub ctx: usize,
    /// Requests that may wait for a model's engine; more are answered 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub queue_capacity: usize,
    /// Sequences decoded together per model (continuous batching); each gets the full context.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Most prompt tokens prefilled per step, interleaved with the decode steps of active streams
    /// (`-b` / `--batch-size`, llama-server's name, is the same) [default: 256 on the CPU, 512 on
    /// a GPU]
    #[arg(long, short = 'b', visible_alias = "batch-size")]
    pub prefill_chunk: Option<usize>,
    /// The sampling seed of requests that give none (default: a random one per request).
    #[arg(long)]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub spec: super::generate::SpecArgs,
    /// How embedding models pool their token states (default: as the GGUF says): mean, cls, last,
    /// or none — one vector per token, returned by llama-server's /embeddings route (/v1/embeddings
    /// then answers 400).
    #[arg(long, value_parser = pooling)]
    pub pooling: Option<engine::model::Pooling>,
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
    /// Open connections at once; a client past the limit gets a 503 and the connection is closed.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Seconds a client has to send a request's head (request line and headers); idle keep-alive
    /// connections are closed after it too.
    #[arg(long, default_value_t = 10.0, value_parser = seconds)]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's whole body (408 after it).
    #[arg(long, default_value_t = 30.0, value_parser = seconds)]
    pub body_timeout: f64,
    /// Seconds between SSE keep-alive comments while a stream has nothing else to send (a request
    /// waiting for a slot, a long prompt being read).
    #[arg(long, default_value_t = 15.0, value_parser = seconds)]
    pub sse_keepalive: f64,
    /// Most inputs in one /v1/embeddings request (400 past it; OpenAI's limit).
    #[arg(long, default_value_t = 2048)]
    pub embed_max_inputs: usize,
    /// Most tokens of all inputs of one /v1/embeddings request together (400 past it; OpenAI's limit).
    #[arg(long, default_value_t = 300_000)]
    pub embed_max_tokens: usize,
    /// A Jinja chat template used instead of the models' own (llama-server's and vLLM's option, for
    /// a GGUF whose template is missing or wrong); checked when the server starts.
    #[arg(long = "chat-template-file", value_name = "FILE", conflicts_with = "chat_template")]
    pub chat_template_file: Option<PathBuf>,
    /// A chat template used instead of the models' own: a built-in format by name (llama-server's
    /// names: chatml, llama2, llama3, mistral-v7, phi3, gemma, command-r, deepseek3, …; an unknown
    /// name lists them all) or Jinja template text.
    #[arg(long = "chat-template", value_name = "NAME|JINJA")]
    pub chat_template: Option<String>,
    /// Non-streamed chat and completions replies carry llama-server's `__verbose` debug object (the
    /// rendered prompt and its token count), as a request's `"verbose": true` asks for one reply.
    #[arg(long = "debug-responses")]
    pub debug_responses: bool,
}

fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds between 0 and 86400")),
    }
}

/// A `-m` value that names a Hub repository (`ORG/NAME[:QUANT]`, and no such file exists).
fn hub_spec(m: &std::path::Path) -> Option<(String, Option<String>)> {
    if m.exists() {
        return None;
    }
    let s = m.to_str()?;
    if s.ends_with(".gguf") {
        return None;
    }
    let (repo, quant) = match s.rsplit_once(':') {
        Some((r, q)) => (r, Some(q.to_string())),
        None => (s, None),
    };
    convert::hub::validate_repo_id(repo).ok()?;
    (repo.split('/').count() == 2).then(|| (repo.to_string(), quant))
}

/// Download `repo`, convert it to `quant` (or the default for its size) into the cache once, and
/// return the GGUF path.
fn from_hub(repo: &str, quant: Option<&str>) -> CliResult<PathBuf> {
    let snap = super::convert::download(repo, "main")?;
    let quant = match quant {
        Some(q) => q.to_string(),
        None => {
            let n = convert::hf::inspect(&snap.dir)
                .map_err(|e| CliError::input(format!("{repo}: {e}")))?
                .parameters;
            if n < 2_000_000_000 { "Q8_0" } else { "Q4_K_M" }.to_string()
        }
    };
    let target = convert::plan::Target::parse(&quant)
        .ok_or_else(|| CliError::input(format!("{repo}:{quant}: unknown quantization type {quant:?}")))?;
    let dir = super::doctor::cache_dir()
        .join("models")
        .join(repo.replace('/', "--"))
        .join(&snap.commit);
    let name = repo.rsplit('/').next().unwrap_or(repo);
    let out = dir.join(format!("{name}.{}.gguf", target.name()));
    if out.is_file() {
        tracing::info!("{repo}: serving the cached conversion {}", out.display());
        return Ok(out);
    }
    std::fs::create_dir_all(&dir).map_err(|e| CliError::runtime(format!("{}: {e}", dir.display())))?;
    eprintln!(
        "hf2q serve: converting {repo} ({}) to {} once, into {}",
        snap.commit,
        target.name(),
        out.display()
    );
    let opts = convert::requant::QuantizeOptions::default();
    convert::pipeline::convert(&snap.dir, &out, target, &opts).map_err(|e| {
        if e.is_invalid_input() {
            CliError::input(format!("{repo}: {e}"))
        } else {
            CliError::runtime(format!("{repo}: {e}"))
        }
    })?;
    Ok(out)
}

pub fn run(mut args: ServeArgs) -> CliResult {
    // Hub repositories become cached GGUF files served under the name they were asked by.
    let mut names: Vec<Option<String>> = vec![None; args.models.len()];
    for (i, m) in args.models.iter_mut().enumerate() {
        if let Some((repo, quant)) = hub_spec(m) {
            names[i] = Some(m.to_string_lossy().into_owned());
            *m = from_hub(&repo, quant.as_deref())?;
        }
    }
    if args.parallel == 0 || args.prefill_chunk == Some(0) {
        return Err(CliError::input("--parallel and --prefill-chunk must be at least 1"));
    }
    if args.max_connections == 0 || args.embed_max_inputs == 0 || args.embed_max_tokens == 0 {
        return Err(CliError::input(
            "--max-connections, --embed-max-inputs and --embed-max-tokens must be at least 1",
        ));
    }
    for m in &args.models {
        if !m.is_file() {
            return Err(CliError::input(format!("{}: no such model file", m.display())));
        }
    }
    if args.aliases.len() > args.models.len() {
        return Err(CliError::input(format!(
            "{} --alias for {} models: each --alias names one -m, in order",
            args.aliases.len(),
            args.models.len()
        )));
    }
    let mut ids: Vec<String> = args
        .models
        .iter()
        .enumerate()
        .map(|(i, m)| {
            args.aliases
                .get(i)
                .cloned()
                .or_else(|| names[i].clone())
                .unwrap_or_else(|| {
                    m.file_stem()
                        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
                })
        })
        .collect();
    let served_as = ids.clone();
    if let Some(a) = args.aliases.iter().find(|a| a.trim().is_empty()) {
        return Err(CliError::input(format!("--alias {a:?}: an alias must not be empty")));
    }
    ids.sort();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(CliError::input(format!(
            "two models would be served as {:?}: give one of them another --alias",
            w[0]
        )));
    }
    let chat_template = match (&args.chat_template_file, &args.chat_template) {
        (None, Some(t)) => match engine::chat::builtin::get(t) {
            Some(src) => Some(src),
            None if t.contains("{{") || t.contains("{%") => {
                engine::chat::ChatTemplate::new(t, "", "")
                    .map_err(|e| CliError::input(format!("--chat-template: {e}")))?;
                Some(t.clone())
            }
            None => {
                return Err(CliError::input(format!(
                    "--chat-template {t:?} is neither a built-in template ({}) nor a Jinja template",
                    engine::chat::builtin::names().join(", ")
                )))
            }
        },
        (None, None) => None,
        (Some(f), _) => {
            let src = std::fs::read_to_string(f)
                .map_err(|e| CliError::input(format!("--chat-template-file {}: {e}", f.display())))?;
            engine::chat::ChatTemplate::new(&src, "", "")
                .map_err(|e| CliError::input(format!("--chat-template-file {}: {e}", f.display())))?;
            Some(src)
        }
    };
    let cfg = serve::ServeConfig {
        chat_template,
        debug_responses: args.debug_responses,
        seed: args.seed,
        pooling: args.pooling,
        host: args.host,
        port: args.port.unwrap_or(8080),
        port_fallback: args.port.is_none(),
        models: args.models,
        aliases: served_as,
        models_dir: args.models_dir,
        models_memory: args.models_memory,
        api_key: args.api_key,
        threads: args.threads,
        device: engine::backend::select::Device::parse(&args.device)
            .map_err(|e| CliError::input(format!("--device: {e}")))?,
        ctx: args.ctx,
        queue_capacity: args.queue_capacity,
        max_body_bytes: args.max_body_bytes,
        parallel: args.parallel,
        prefill_chunk: args.prefill_chunk,
        cors_origins: args.cors_origins,
        kv_budget: args.kv_budget,
        kv_persist: args.kv_persist,
        kv_persist_max_bytes: args.kv_persist_max_bytes,
        conn: serve::conn::ConnLimits {
            max_connections: args.max_connections,
            header_timeout: Duration::from_secs_f64(args.header_timeout),
        },
        body_timeout: Duration::from_secs_f64(args.body_timeout),
        sse_keepalive: Duration::from_secs_f64(args.sse_keepalive),
        embed_limits: serve::embed::Limits {
            max_inputs: args.embed_max_inputs,
            max_tokens: args.embed_max_tokens,
        },
        spec: args.spec.mode.unwrap_or(engine::spec::SpecMode::Off),
        draft_max: args.spec.draft_max,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(serve::run(cfg)).map_err(CliError::input)
}

fn pooling(s: &str) -> Result<engine::model::Pooling, String> {
    use engine::model::Pooling;
    match s {
        "none" => Ok(Pooling::None),
        "mean" => Ok(Pooling::Mean),
        "cls" => Ok(Pooling::Cls),
        "last" => Ok(Pooling::Last),
        _ => Err(format!("{s:?} is not one of none, mean, cls, last")),
    }
}
