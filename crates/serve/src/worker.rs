//! One engine thread per model running `--parallel` slots with continuous batching: every step
//! decodes one token for each active sequence and prefills a bounded chunk of waiting prompts, all
//! in one batched forward, so active streams keep flowing while new prompts are read. Each slot owns
//! a KV cache of the full context; a new request goes to the idle slot whose cached tokens share the
//! longest prefix with its prompt (reported as `cached_tokens`). A request whose client went away
//! is dropped at the next step (its channel is closed) and frees its slot.

use crate::error::ApiError;
use engine::backend::cpu::Cpu;
use engine::backend::KvType;
use engine::generate::{Decoding, Finish, GenerateParams, LoadedModel};
use engine::model::llama::{Logits, SeqStep};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

pub enum Event {
    /// Text that became final with a token, and that token's log-probability when asked for.
    Token(String, Option<engine::generate::TokenLogprob>),
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
    /// Structured output: the grammar the reply must follow.
    pub constraint: Option<engine::grammar::Constraint>,
    pub events: UnboundedSender<Event>,
}

/// Scheduler limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub parallel: usize,
    pub n_ctx: usize,
    pub queue_capacity: usize,
    /// Most prompt tokens prefilled per step (across slots); decode tokens come on top.
    pub prefill_chunk: usize,
}

pub struct Worker {
    pub id: String,
    pub model: Arc<LoadedModel<Cpu>>,
    /// Built on first use (structured output).
    pub grammar: std::sync::OnceLock<Result<Arc<engine::grammar::GrammarFactory>, String>>,
    pub n_ctx: usize,
    pub created: u64,
    tx: SyncSender<Job>,
    queued: Arc<AtomicUsize>,
    active: Arc<AtomicUsize>,
    /// KV positions held by all slots (cached prefixes included) and their total capacity.
    kv_used: Arc<AtomicUsize>,
    pub kv_capacity: usize,
}

struct Active {
    job: Job,
    decoding: Decoding,
    /// Prompt tokens still to feed (from `fed` on), then the last sampled token.
    fed: usize,
    next: Option<u32>,
    cached: usize,
}

struct Slot {
    kv: engine::backend::cpu::CpuKv,
    n_ctx: usize,
    /// Tokens whose K/V the cache holds, in order.
    tokens: Vec<u32>,
    active: Option<Active>,
}

impl Worker {
    pub fn start(id: String, model: Arc<LoadedModel<Cpu>>, limits: Limits) -> engine::Result<Worker> {
        let (tx, rx) = sync_channel::<Job>(limits.queue_capacity.max(1));
        let queued = Arc::new(AtomicUsize::new(0));
        let active = Arc::new(AtomicUsize::new(0));
        let mut slots = Vec::new();
        for _ in 0..limits.parallel.max(1) {
            let kv = model.model.new_kv(limits.n_ctx, KvType::F16)?;
            slots.push(Slot {
                kv,
                n_ctx: limits.n_ctx,
                tokens: Vec::new(),
                active: None,
            });
        }
        let kv_used = Arc::new(AtomicUsize::new(0));
        let kv_capacity = slots.len() * limits.n_ctx;
        let gauges = Gauges {
            queued: queued.clone(),
            active: active.clone(),
            kv_used: kv_used.clone(),
        };
        let m = model.clone();
        std::thread::Builder::new()
            .name(format!("hf2q-engine-{id}"))
            .spawn(move || schedule(&m, slots, rx, &gauges, limits))
            .map_err(|e| engine::EngineError::Backend(format!("cannot start the engine thread: {e}")))?;
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(Worker {
            id,
            model,
            grammar: std::sync::OnceLock::new(),
            n_ctx: limits.n_ctx,
            created,
            tx,
            queued,
            active,
            kv_used,
            kv_capacity,
        })
    }

    /// The model's structured-output factory (built on first use, ~once per model).
    pub fn grammar(&self) -> Result<Arc<engine::grammar::GrammarFactory>, ApiError> {
        self.grammar
            .get_or_init(|| {
                engine::grammar::GrammarFactory::new(self.model.tokenizer.clone())
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(ApiError::internal)
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

    pub fn active_slots(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    pub fn kv_used(&self) -> usize {
        self.kv_used.load(Ordering::Relaxed)
    }
}

/// What the engine thread reports to `/metrics`.
struct Gauges {
    queued: Arc<AtomicUsize>,
    active: Arc<AtomicUsize>,
    kv_used: Arc<AtomicUsize>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn schedule(m: &LoadedModel<Cpu>, mut slots: Vec<Slot>, rx: Receiver<Job>, gauges: &Gauges, limits: Limits) {
    let mut scratch = m.model.scratch(limits.prefill_chunk + slots.len());
    loop {
        // Admit queued jobs into idle slots (block only when nothing is running).
        while slots.iter().any(|s| s.active.is_none()) {
            let busy = slots.iter().any(|s| s.active.is_some());
            let job = if busy {
                match rx.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            } else {
                match rx.recv() {
                    Ok(j) => j,
                    Err(_) => return,
                }
            };
            gauges.queued.fetch_sub(1, Ordering::Relaxed);
            admit(&mut slots, job);
        }
        gauges
            .active
            .store(slots.iter().filter(|s| s.active.is_some()).count(), Ordering::Relaxed);
        step(m, &mut slots, &mut scratch, limits.prefill_chunk);
        gauges
            .kv_used
            .store(slots.iter().map(|s| s.tokens.len()).sum(), Ordering::Relaxed);
    }
}

/// Put a job in the idle slot sharing the longest prefix with its prompt.
fn admit(slots: &mut [Slot], mut job: Job) {
    let decoding = match Decoding::new(&job.params, &job.prompt) {
        Ok(d) => match job.constraint.take() {
            Some(c) => d.with_constraint(c),
            None => d,
        },
        Err(e) => {
            let _ = job.events.send(Event::Error(e.into()));
            return;
        }
    };
    let (best, cached) = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.active.is_none())
        .map(|(i, s)| (i, common_prefix(&s.tokens, &job.prompt).min(job.prompt.len() - 1)))
        .max_by_key(|&(_, c)| c)
        .expect("admit is called with an idle slot");
    let slot = &mut slots[best];
    slot.tokens.truncate(cached);
    slot.active = Some(Active {
        job,
        decoding,
        fed: cached,
        next: None,
        cached,
    });
}

/// One batched forward: a decode token for every generating slot, then prompt chunks.
fn step(
    m: &LoadedModel<Cpu>,
    slots: &mut [Slot],
    scratch: &mut engine::model::llama::Scratch<Cpu>,
    prefill_chunk: usize,
) {
    // Plan what each slot feeds this step.
    let mut budget = prefill_chunk;
    let mut feeds: Vec<(usize, Vec<u32>, bool)> = Vec::new(); // (slot, tokens, wants logits)
    for (i, s) in slots.iter().enumerate() {
        let Some(a) = &s.active else { continue };
        if let Some(t) = a.next {
            feeds.push((i, vec![t], true));
        }
    }
    for (i, s) in slots.iter().enumerate() {
        let Some(a) = &s.active else { continue };
        if a.next.is_none() && a.fed < a.job.prompt.len() && budget > 0 {
            let n = (a.job.prompt.len() - a.fed).min(budget);
            budget -= n;
            let last = a.fed + n == a.job.prompt.len();
            feeds.push((i, a.job.prompt[a.fed..a.fed + n].to_vec(), last));
        }
    }
    if feeds.is_empty() {
        return;
    }
    // Borrow each fed slot's cache once, in slot order.
    feeds.sort_by_key(|f| f.0);
    let mut steps = Vec::with_capacity(feeds.len());
    let mut rest: &mut [Slot] = slots;
    let mut base = 0;
    for (i, toks, logits) in &feeds {
        let (_, tail) = rest.split_at_mut(i - base);
        let (one, tail) = tail.split_at_mut(1);
        let s = &mut one[0];
        steps.push(SeqStep {
            pos0: s.tokens.len(),
            kv: &mut s.kv,
            tokens: toks,
            logits: if *logits { Logits::Last } else { Logits::None },
        });
        rest = tail;
        base = i + 1;
    }
    let out = m.model.forward(scratch, &mut steps);
    drop(steps);
    let mut out = match out {
        Ok(o) => o.into_iter(),
        Err(e) => {
            // Fail the sequences of this step; their caches are reset.
            let err: ApiError = e.into();
            for (i, _, _) in &feeds {
                if let Some(a) = slots[*i].active.take() {
                    let _ = a.job.events.send(Event::Error(err.clone()));
                }
                slots[*i].tokens.clear();
            }
            return;
        }
    };
    for (i, toks, wants) in feeds {
        let s = &mut slots[i];
        s.tokens.extend_from_slice(&toks);
        let Some(a) = &mut s.active else { continue };
        if a.next.is_none() {
            a.fed += toks.len();
        }
        if !wants {
            continue;
        }
        let mut logits = out.next().unwrap_or_default();
        let st = a.decoding.step(m, &mut logits);
        let mut gone = (!st.text.is_empty() || st.logprob.is_some())
            && a.job.events.send(Event::Token(st.text, st.logprob)).is_err();
        // No room for the sampled token: the context is full, the answer ends here.
        let full = st.finish.is_none() && s.tokens.len() >= s.n_ctx;
        if full && !gone {
            let rest = a.decoding.flush();
            gone = !rest.is_empty() && a.job.events.send(Event::Token(rest, None)).is_err();
        }
        let finish = if gone {
            Some(Finish::Cancelled)
        } else if full {
            Some(Finish::Length)
        } else {
            st.finish
        };
        match finish {
            None => a.next = st.token,
            Some(f) => {
                let a = s.active.take().expect("active");
                if f != Finish::Cancelled {
                    let _ = a.job.events.send(Event::Done {
                        finish: f,
                        prompt_tokens: a.job.prompt.len(),
                        completion_tokens: a.decoding.tokens.len(),
                        cached_tokens: a.cached,
                    });
                }
            }
        }
    }
}
