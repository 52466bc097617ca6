//! The served models: loading them on the backend `--device` picks (decoders share it; each
//! encoder gets one with exact activations), and the `--models-dir` registry that loads models on
//! first use and unloads idle ones under `--models-memory`.

use super::*;

pub(crate) type Loader = Box<dyn Fn(&AppState, &std::path::Path, &str) -> Result<u64, String> + Send + Sync>;

/// A model of `--models-dir`: loaded when a request names it, unloaded (least recently used
/// first, only while idle) when another needs its memory under `--models-memory`.
pub(crate) struct LazyModel {
    pub(crate) id: String,
    path: PathBuf,
    file_bytes: u64,
    /// Held while the model loads: requests for it wait here.
    loading: tokio::sync::Mutex<()>,
    last_used: AtomicU64,
}

/// The GGUF files of a directory as lazily loaded models (the first shard of split models).
pub(crate) fn models_in(dir: &std::path::Path) -> Result<Vec<LazyModel>, String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("--models-dir {}: {e}", dir.display()))?;
    let mut out: Vec<LazyModel> = Vec::new();
    for entry in rd.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".gguf") else {
            continue;
        };
        // A split model is served once, by its first shard, under its base name.
        let id = match stem.rsplit_once("-of-") {
            Some((head, _)) if head.ends_with("-00001") => head.trim_end_matches("-00001").to_string(),
            Some((head, _))
                if head
                    .rsplit('-')
                    .next()
                    .is_some_and(|n| n.len() == 5 && n.bytes().all(|b| b.is_ascii_digit())) =>
            {
                continue
            }
            _ => stem.to_string(),
        };
        let file_bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        out.push(LazyModel {
            id,
            path,
            file_bytes,
            loading: tokio::sync::Mutex::new(()),
            last_used: AtomicU64::new(0),
        });
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

fn is_loaded(st: &AppState, id: &str) -> bool {
    st.workers
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|w| w.id == id)
        || st
            .embedders
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|e| e.id == id)
}

/// Make sure the model a request names is loaded, if it is one of `--models-dir`: wait while it
/// loads (one load per model at a time), unloading idle models first when `--models-memory`
/// needs their room.
pub(crate) async fn ensure_loaded(st: &Shared, model: Option<&str>) -> Result<(), ApiError> {
    let Some(id) = model else { return Ok(()) };
    let Some(lz) = st.lazy.iter().find(|l| l.id == id) else {
        return Ok(());
    };
    lz.last_used.store(now_millis(), Ordering::Relaxed);
    if is_loaded(st, id) {
        return Ok(());
    }
    let _guard = lz.loading.lock().await;
    if is_loaded(st, id) {
        return Ok(());
    }
    if !st.ready.load(Ordering::Acquire) {
        return Err(ApiError::unavailable("the server is still loading its models"));
    }
    if let Some(budget) = st.cfg.models_memory {
        if lz.file_bytes > budget {
            return Err(ApiError::unavailable(format!(
                "model {id} needs at least {} (its file) but --models-memory is {}: it can never be loaded here",
                human(lz.file_bytes),
                human(budget)
            ))
            .with_code("model_too_large"));
        }
        // Models that just answered may still be finishing their step: give them a moment.
        let mut tries = 0;
        while let Err(e) = make_room(st, id, lz.file_bytes, budget) {
            tries += 1;
            if tries > 100 {
                return Err(e);
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    let (st2, path, id2) = (st.clone(), lz.path.clone(), id.to_string());
    let loaded = tokio::task::spawn_blocking(move || match st2.loader.get() {
        Some(load) => load(&st2, &path, &id2),
        None => Err("the server is still loading its models".to_string()),
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?;
    let bytes = loaded.map_err(|e| ApiError::unavailable(format!("model {id} failed to load: {e}")))?;
    st.footprints
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id.to_string(), bytes);
    st.metrics.model_loads.fetch_add(1, Ordering::Relaxed);
    tracing::info!("loaded model {id} on demand ({})", human(bytes));
    Ok(())
}

fn now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn human(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// Unload idle `--models-dir` models, least recently used first, until `need` more bytes fit in
/// `budget`; a 503 with Retry-After when the models holding the memory are busy.
fn make_room(st: &AppState, for_id: &str, need: u64, budget: u64) -> Result<(), ApiError> {
    loop {
        let used: u64 = st.footprints.lock().unwrap_or_else(|e| e.into_inner()).values().sum();
        if used + need <= budget {
            return Ok(());
        }
        let mut candidates: Vec<&LazyModel> = st
            .lazy
            .iter()
            .filter(|l| l.id != for_id && is_loaded(st, &l.id))
            .collect();
        candidates.sort_by_key(|l| l.last_used.load(Ordering::Relaxed));
        let mut freed = false;
        for c in candidates {
            if unload_if_idle(st, &c.id) {
                freed = true;
                break;
            }
        }
        if !freed {
            return Err(ApiError::unavailable(format!(
                "model {for_id} needs {} but {} of --models-memory {} is held by models serving requests; retry shortly",
                human(need),
                human(used),
                human(budget)
            ))
            .with_code("models_memory_busy"));
        }
    }
}

/// Unload a model that no request holds; false when it is in use.
fn unload_if_idle(st: &AppState, id: &str) -> bool {
    {
        let mut ws = st.workers.write().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = ws.iter().position(|w| w.id == id) {
            if Arc::strong_count(&ws[i]) > 1 || !ws[i].idle() {
                return false;
            }
            ws.remove(i);
        } else {
            drop(ws);
            let mut es = st.embedders.write().unwrap_or_else(|e| e.into_inner());
            match es.iter().position(|e| e.id == id) {
                Some(i) if Arc::strong_count(&es[i]) == 1 => {
                    es.remove(i);
                }
                _ => return false,
            }
        }
    }
    st.footprints.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    st.metrics.model_unloads.fetch_add(1, Ordering::Relaxed);
    tracing::info!("unloaded idle model {id} to make room");
    true
}

pub(crate) fn load_models(state: &AppState) -> Result<(), String> {
    let opts = BackendOptions {
        device: state.cfg.device,
        threads: state.cfg.threads,
        exact_activations: false,
    };
    with_backend(&opts, LoadModels(state)).map_err(|e| e.to_string())??;
    state.ready.store(true, Ordering::Release);
    Ok(())
}

/// Loads every model of the configuration on one backend (decoders share it; each encoder gets
/// one of its own with exact activations).
struct LoadModels<'a>(&'a AppState);

impl WithBackend for LoadModels<'_> {
    type Output = Result<(), String>;
    fn run<B: Backend>(self, backend: Arc<B>) -> Result<(), String> {
        load_models_on(self.0, backend)
    }
}

struct StartEmbedder<'a> {
    state: &'a AppState,
    id: String,
    gguf: &'a Arc<gguf::GgufModel>,
    path: &'a std::path::Path,
}

impl WithBackend for StartEmbedder<'_> {
    type Output = engine::Result<embed::Embedder>;
    fn run<B: Backend>(self, backend: Arc<B>) -> engine::Result<embed::Embedder> {
        let cfg = &self.state.cfg;
        embed::Embedder::start(
            self.id,
            backend,
            self.gguf,
            self.path,
            cfg.queue_capacity,
            cfg.embed_limits,
            cfg.pooling,
        )
    }
}

fn load_models_on<B: Backend>(state: &AppState, backend: Arc<B>) -> Result<(), String> {
    for (i, path) in state.cfg.models.iter().enumerate() {
        let id = state.cfg.aliases.get(i).cloned().unwrap_or_else(|| {
            path.file_stem()
                .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
        });
        let bytes = load_one(state, &backend, path, &id)?;
        state
            .footprints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, bytes);
    }
    // Models of --models-dir load on first use, on the same backend.
    let _ = state
        .loader
        .set(Box::new(move |st: &AppState, path: &std::path::Path, id: &str| {
            load_one(st, &backend, path, id)
        }));
    Ok(())
}

/// Load one model file and add it to the served models; its memory (file bytes, plus the KV
/// pool for a decoder) for `--models-memory`.
fn load_one<B: Backend>(state: &AppState, backend: &Arc<B>, path: &std::path::Path, id: &str) -> Result<u64, String> {
    let id = id.to_string();
    let file_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let gguf = engine::model::open_gguf(path).map_err(|e| e.to_string())?;
    if engine::model::is_encoder(gguf.metadata().architecture().unwrap_or_default()) {
        // Encoders multiply by unquantized activations (their vectors are compared directly).
        let opts = BackendOptions {
            device: state.cfg.device,
            threads: state.cfg.threads,
            exact_activations: true,
        };
        let job = StartEmbedder {
            state,
            id: id.clone(),
            gguf: &gguf,
            path,
        };
        let e = with_backend(&opts, job).and_then(|e| e).map_err(|e| e.to_string())?;
        state
            .embedders
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::new(e));
        eprintln!("hf2q serve: embedding model {id} ready");
        return Ok(file_bytes);
    }
    let mut m = LoadedModel::load(backend.clone(), path).map_err(|e| e.to_string())?;
    if let Some(src) = &state.cfg.chat_template {
        // --chat-template-file: in place of the model's own, with the model's BOS / EOS text.
        let text = |id: Option<u32>| id.and_then(|i| m.tokenizer.token_text(i)).unwrap_or("").to_string();
        let t = engine::chat::ChatTemplate::new(src, &text(m.tokenizer.bos()), &text(m.tokenizer.eos()))
            .map_err(|e| format!("--chat-template-file: {e}"))?;
        m.template = Some(t);
    }
    let n_ctx = if state.cfg.ctx == 0 {
        m.model.info().n_ctx_train
    } else {
        state.cfg.ctx
    };
    let fingerprint = prefix::model_fingerprint(path, "f16").map_err(|e| format!("{}: {e}", path.display()))?;
    let mut store = prefix::PrefixStore::new(fingerprint);
    if let Some(dir) = &state.cfg.kv_persist {
        store = store
            .with_persistence(dir, state.cfg.kv_persist_max_bytes)
            .map_err(|e| format!("--kv-persist {}: {e}", dir.display()))?;
    }
    let probe = m
        .model
        .new_kv(1, engine::backend::KvType::F16)
        .map_err(|e| e.to_string())?;
    let position_bytes =
        engine::backend::Backend::kv_page_bytes(m.model.backend().as_ref(), &probe) / engine::model::PAGE;
    drop(probe);
    let kv_budget = match state.cfg.kv_budget {
        Some(b) => b.positions(position_bytes),
        None => state.cfg.parallel.max(1) * n_ctx,
    };
    // The pool hands out whole pages: the budget is the pages it holds.
    let kv_budget = kv_budget / engine::model::PAGE * engine::model::PAGE;
    if kv_budget == 0 {
        return Err(format!(
            "--kv-budget is smaller than one KV page ({} positions) of model {id}",
            engine::model::PAGE
        ));
    }
    let limits = worker::Limits {
        parallel: state.cfg.parallel,
        n_ctx,
        queue_capacity: state.cfg.queue_capacity,
        prefill_chunk: state
            .cfg
            .prefill_chunk
            .unwrap_or_else(|| engine::backend::Backend::prefill_chunk(m.model.backend().as_ref())),
        kv_budget,
        seed: state.cfg.seed,
        spec: state.cfg.spec,
        draft_max: state.cfg.draft_max,
    };
    let w = Worker::start(id.clone(), m, limits, store).map_err(|e| e.to_string())?;
    state
        .workers
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .push(Arc::new(w));
    eprintln!("hf2q serve: model {id} ready ({n_ctx} tokens of context, KV budget {kv_budget} positions)");
    Ok(file_bytes + (kv_budget * position_bytes) as u64)
}
