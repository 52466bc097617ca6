//! One engine thread per model: it owns the model's KV cache (a session whose cached prefix is
//! reused by the next request that shares it) and runs queued generation jobs one at a time,
//! streaming text pieces back to the request's channel. A request whose client went away stops at
//! the next token (its channel is closed).

use crate::error::ApiError;
use engine::backend::cpu::Cpu;
use engine::generate::{generate, Finish, GenerateParams, LoadedModel, Session};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

pub enum Event {
    Text(String),
    Done {
        finish: Finish,
        prompt_tokens: usize,
        completion_tokens: usize,
        cached_tokens: usize,
    },
    Error(ApiError),
}

pub struct Job {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    pub events: UnboundedSender<Event>,
}

pub struct Worker {
    pub id: String,
    pub model: Arc<LoadedModel<Cpu>>,
    pub n_ctx: usize,
    pub created: u64,
    tx: SyncSender<Job>,
    queued: Arc<AtomicUsize>,
}

impl Worker {
    pub fn start(
        id: String,
        model: Arc<LoadedModel<Cpu>>,
        n_ctx: usize,
        queue_capacity: usize,
    ) -> engine::Result<Worker> {
        let (tx, rx) = sync_channel::<Job>(queue_capacity.max(1));
        let queued = Arc::new(AtomicUsize::new(0));
        let mut session = Session::new(&model, n_ctx, engine::backend::KvType::F16, 512)?;
        let (m, q) = (model.clone(), queued.clone());
        std::thread::Builder::new()
            .name(format!("hf2q-engine-{id}"))
            .spawn(move || {
                for job in rx {
                    q.fetch_sub(1, Ordering::Relaxed);
                    run_job(&m, &mut session, job);
                }
            })
            .map_err(|e| engine::EngineError::Backend(format!("cannot start the engine thread: {e}")))?;
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(Worker {
            id,
            model,
            n_ctx,
            created,
            tx,
            queued,
        })
    }

    /// Queue a job; a full queue is a 429.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.queued.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.queued.fetch_sub(1, Ordering::Relaxed);
                Err(ApiError::busy())
            }
            Err(TrySendError::Disconnected(_)) => {
                self.queued.fetch_sub(1, Ordering::Relaxed);
                Err(ApiError::unavailable(format!(
                    "the engine of model {} stopped",
                    self.id
                )))
            }
        }
    }

    pub fn queue_depth(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
}

fn run_job(m: &LoadedModel<Cpu>, session: &mut Session<Cpu>, job: Job) {
    let cached = session
        .tokens
        .iter()
        .zip(&job.prompt)
        .take_while(|(a, b)| a == b)
        .count()
        .min(job.prompt.len().saturating_sub(1));
    let events = job.events;
    let r = generate(m, session, &job.prompt, &job.params, |piece| {
        events.send(Event::Text(piece.to_string())).is_ok()
    });
    let _ = match r {
        Ok(g) => events.send(Event::Done {
            finish: g.finish,
            prompt_tokens: g.prompt_tokens,
            completion_tokens: g.tokens.len(),
            cached_tokens: cached,
        }),
        Err(e) => {
            // The cache may hold a half-written step; start the next request from scratch.
            session.clear();
            events.send(Event::Error(e.into()))
        }
    };
}
