//! One engine thread per model running `--parallel` slots with continuous batching: every step
//! decodes one token for each active sequence and prefills a bounded chunk of waiting prompts, all
//! in one batched forward, so active streams keep flowing while new prompts are read. A request whose
//! client went away is dropped at the next step (its channel is closed) and frees its slot.
//!
//! KV memory: all slots of a model draw pages of 64 positions from one pool, and the pool's live
//! pages are what the budget (`--kv-budget`) counts; a page held by several slots and the prefix
//! cache counts once. A request reserves `prompt + max_tokens` positions when it is admitted (so it
//! never runs out mid-reply); when the budget is short, least recently used prefix-cache blocks and
//! idle slots' kept tokens are given up, and if that is not enough the request waits at the head of
//! the queue until running ones finish; a request that could never fit fails with an error naming
//! the budget. A new request goes to the idle slot whose kept tokens share the longest prefix with
//! its prompt, then maps further whole blocks of its prompt from the prefix cache: pages that
//! finished requests handed over (see `prefix.rs`), shared, not copied; both count in
//! `cached_tokens`.
//!
//! Hybrid models (a recurrent state per sequence, `engine::backend::state`): a sequence goes back
//! only to a point where its state was kept, so a request asks for copies of the state at up to
//! [`STATE_COPIES`] page ends of its prompt (all of them for a short prompt, evenly spaced back
//! from the last one for a long one); they stay with their pages, in the slot and in the prefix
//! cache (and on disk with `--kv-persist`). A reused prefix is cut back to the latest such copy
//! at or before it (or the slot's own state where it ends), and only that counts as cached. The
//! copies count against the KV budget as the pages their bytes fill; a request that cannot fit
//! them too takes fewer (none at worst: a lack of room for copies never refuses a request).

use crate::error::ApiError;
use engine::backend::KvType;
use engine::chat::ChatTemplate;
use engine::generate::{Decoding, Finish, GenerateParams, LoadedModel};
use engine::model::{HiddenRows, Logits, SeqStep};
use engine::model::{Model, ModelInfo};
use engine::spec::{Drafter, SpecMode, SpecStats};
use engine::tokenizer::Tokenizer;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use tokio::sync::mpsc::UnboundedSender;

use crate::prefix::{chain_keys, Hit, PrefixStore, BLOCK};
use engine::backend::Backend;

pub enum Event {
    /// The prompt's prefill so far: sent when the job gets its slot (nothing processed beyond the
    /// cached tokens) and after each prompt chunk (llama-server's `prompt_progress`).
    Progress(Progress),
    /// Text that became final with a token, and that token's log-probability when asked for.
    Token(String, Option<engine::generate::TokenLogprob>),
    Done {
        finish: Finish,
        prompt_tokens: usize,
        completion_tokens: usize,
        cached_tokens: usize,
        /// The stop string that ended the reply, if one did.
        stop: Option<String>,
        /// Milliseconds spent on the prompt (from getting a slot to the first sampled token) and
        /// on generating the rest.
        prompt_ms: f64,
        predicted_ms: f64,
    },
    Error(ApiError),
}

/// Where a prompt's prefill stands, in tokens: `total` in the prompt, `cache` taken from the cache,
/// `processed` so far including the cached ones; `ms` since the job got its slot.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub total: usize,
    pub cache: usize,
    pub processed: usize,
    pub ms: f64,
}

impl Progress {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"total": self.total, "cache": self.cache, "processed": self.processed,
                           "time_ms": self.ms})
    }
}

pub struct Job {
    /// Which choice of its request this job is (`n` > 1 runs one job per choice).
    pub choice: usize,
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    /// Structured output: the grammar the reply must follow.
    pub constraint: Option<engine::grammar::Constraint>,
    /// Events tagged with `choice`. All choices of a request share the channel; when the client
    /// goes away its receiver is dropped and the jobs leave the queue or their slots.
    pub events: UnboundedSender<(usize, Event)>,
}

impl Job {
    /// Send an event; false when the client is gone.
    fn send(&self, ev: Event) -> bool {
        self.events.send((self.choice, ev)).is_ok()
    }

    fn gone(&self) -> bool {
        self.events.is_closed()
    }
}

/// The requests waiting for a slot, in arrival order, bounded by `--queue-capacity`. Requests whose
/// client went away are dropped from it as soon as anyone looks (a new request, the engine
/// thread, `/metrics`), so they neither hold a place nor add to the 429s.
struct JobQueue {
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
    capacity: usize,
    /// Set when the model is unloaded: the engine thread ends once nothing is left to serve.
    closed: AtomicBool,
}

impl JobQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Job>> {
        let mut q = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        q.retain(|j| !j.gone());
        q
    }

    /// Queue `job`; false when the queue is full.
    fn push(&self, job: Job) -> bool {
        let mut q = self.lock();
        if q.len() >= self.capacity {
            return false;
        }
        q.push_back(job);
        drop(q);
        self.ready.notify_one();
        true
    }

    /// The oldest waiting job; with `wait`, block until there is one (waking now and then to drop
    /// jobs whose client left).
    fn pop(&self, wait: bool) -> Option<Job> {
        let mut q = self.lock();
        loop {
            if let Some(j) = q.pop_front() {
                return Some(j);
            }
            if !wait || self.closed.load(Ordering::Acquire) {
                return None;
            }
            q = self
                .ready
                .wait_timeout(q, std::time::Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
            q.retain(|j| !j.gone());
        }
    }

    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Scheduler limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub parallel: usize,
    pub n_ctx: usize,
    pub queue_capacity: usize,
    /// Most prompt tokens prefilled per step (across slots); decode tokens come on top.
    pub prefill_chunk: usize,
    /// KV positions all slots and the prefix cache may hold together.
    pub kv_budget: usize,
    /// The sampling seed of requests that give none (`--seed`).
    pub seed: Option<u64>,
    /// Speculative decoding of the model's requests (`--spec`, `--draft-max`).
    pub spec: SpecMode,
    pub draft_max: usize,
}

/// What the request handlers need of a served model; the decoder itself lives on the engine
/// thread, on whichever backend it was loaded.
pub struct Served {
    pub path: std::path::PathBuf,
    pub info: ModelInfo,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
}

/// The engine thread's model: the decoder and the tokenizer its replies are decoded with.
struct Engine<B: Backend> {
    model: Box<dyn Model<B>>,
    tokenizer: Arc<Tokenizer>,
}

pub struct Worker {
    pub id: String,
    pub model: Arc<Served>,
    /// Built on first use (structured output).
    pub grammar: std::sync::OnceLock<Result<Arc<engine::grammar::GrammarFactory>, String>>,
    pub n_ctx: usize,
    pub created: u64,
    queue: Arc<JobQueue>,
    held: Arc<AtomicUsize>,
    /// False once the engine thread has ended.
    alive: Arc<AtomicBool>,
    active: Arc<AtomicUsize>,
    /// KV positions reserved by running requests and those kept for reuse (idle slots' tokens and
    /// the prefix cache), as one value so that a reader never pairs figures of two steps; and the
    /// budget they share.
    kv_use: Arc<Mutex<KvUse>>,
    pub kv_capacity: usize,
    prefix_blocks: Arc<AtomicUsize>,
    /// The sampling seed of requests that give none (`--seed`).
    pub seed: Option<u64>,
    /// Speculative decoding of its requests.
    pub spec: SpecMode,
    pub draft_max: usize,
    spec_stats: Arc<Mutex<SpecStats>>,
}

impl Drop for Worker {
    /// The last handle gone (the model was unloaded and its requests finished): the engine thread
    /// ends and frees the model and its KV pool.
    fn drop(&mut self) {
        self.queue.closed.store(true, Ordering::Release);
        self.queue.ready.notify_all();
    }
}

struct Active {
    job: Job,
    decoding: Decoding,
    /// Prompt tokens still to feed (from `fed` on), then the last sampled token.
    fed: usize,
    next: Option<u32>,
    cached: usize,
    /// When the job got its slot, and when its first token was sampled.
    started: std::time::Instant,
    first: Option<std::time::Instant>,
    /// Proposes tokens ahead of the next (speculative decoding).
    drafter: Option<Drafter>,
}

struct Slot<B: Backend> {
    kv: B::Kv,
    n_ctx: usize,
    /// Tokens whose K/V the cache holds, in order.
    tokens: Vec<u32>,
    active: Option<Active>,
    /// When the slot was last given a request (LRU for giving up idle slots' tokens).
    used: u64,
}

impl Worker {
    pub fn start<B: Backend>(
        id: String,
        model: LoadedModel<B>,
        limits: Limits,
        store: PrefixStore<B::Page>,
    ) -> engine::Result<Worker> {
        let LoadedModel {
            path,
            model,
            tokenizer,
            template,
        } = model;
        if limits.spec == SpecMode::Mtp && model.mtp_layers() == 0 {
            return Err(engine::generate::no_mtp(&path, &model.info().arch));
        }
        let served = Arc::new(Served {
            path,
            info: model.info().clone(),
            tokenizer: tokenizer.clone(),
            template,
        });
        let queue = Arc::new(JobQueue {
            jobs: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            capacity: limits.queue_capacity.max(1),
            closed: AtomicBool::new(false),
        });
        let alive = Arc::new(AtomicBool::new(true));
        let active = Arc::new(AtomicUsize::new(0));
        let backend = model.backend().clone();
        let mut slots: Vec<Slot<B>> = Vec::new();
        // One pool for all slots: positions are allocated as requests reserve them.
        let mut first = model.new_kv(limits.n_ctx, KvType::F16)?;
        backend.kv_release(&mut first, 0);
        let mut first = Some(first);
        for _ in 0..limits.parallel.max(1) {
            let kv = match first.take() {
                Some(kv) => kv,
                None => backend.kv_sibling(&slots[0].kv, limits.n_ctx),
            };
            slots.push(Slot {
                kv,
                n_ctx: limits.n_ctx,
                tokens: Vec::new(),
                active: None,
                used: 0,
            });
        }
        let kv_use = Arc::new(Mutex::new(KvUse::default()));
        let prefix_blocks = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(AtomicUsize::new(0));
        let spec_stats = Arc::new(Mutex::new(SpecStats::default()));
        let gauges = Gauges {
            active: active.clone(),
            held: held.clone(),
            kv_use: kv_use.clone(),
            prefix_blocks: prefix_blocks.clone(),
            spec: spec_stats.clone(),
        };
        let m = Engine { model, tokenizer };
        let sched = Sched {
            slots,
            store,
            budget: limits.kv_budget,
            tick: 0,
            waiting: None,
        };
        let (q, life) = (queue.clone(), alive.clone());
        crate::spawn_thread(format!("hf2q-engine-{id}"), move || {
            // Marks the engine stopped however the thread ends (a panic included).
            struct Alive(Arc<AtomicBool>);
            impl Drop for Alive {
                fn drop(&mut self) {
                    self.0.store(false, Ordering::Release);
                }
            }
            let _alive = Alive(life);
            schedule(&m, sched, &q, &gauges, limits)
        })
        .map_err(|e| engine::EngineError::Backend(format!("cannot start the engine thread: {e}")))?;
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(Worker {
            id,
            model: served,
            grammar: std::sync::OnceLock::new(),
            n_ctx: limits.n_ctx,
            created,
            queue,
            held,
            alive,
            active,
            kv_use,
            kv_capacity: limits.kv_budget,
            prefix_blocks,
            seed: limits.seed,
            spec: limits.spec,
            draft_max: limits.draft_max,
            spec_stats,
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
        if !self.alive.load(Ordering::Acquire) {
            return Err(ApiError::unavailable(format!(
                "the engine of model {} stopped",
                self.id
            )));
        }
        if self.queue.push(job) {
            Ok(())
        } else {
            Err(ApiError::busy())
        }
    }

    /// No request running or waiting.
    pub fn idle(&self) -> bool {
        self.queue_depth() == 0 && self.active_slots() == 0
    }

    /// Requests waiting for a slot (those whose client left are not counted).
    pub fn queue_depth(&self) -> usize {
        self.queue.len() + self.held.load(Ordering::Relaxed)
    }

    pub fn active_slots(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// KV positions reserved by running requests, and those kept for reuse.
    pub fn kv(&self) -> KvUse {
        *self.kv_use.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks of [`BLOCK`] tokens held in memory by the prefix cache.
    pub fn prefix_blocks(&self) -> usize {
        self.prefix_blocks.load(Ordering::Relaxed)
    }

    /// What speculative decoding did so far.
    pub fn spec_stats(&self) -> SpecStats {
        *self.spec_stats.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct KvUse {
    pub active: usize,
    pub cached: usize,
}

/// What the engine thread reports to `/metrics`.
struct Gauges {
    active: Arc<AtomicUsize>,
    /// 1 while the queue's head waits for KV budget outside the queue.
    held: Arc<AtomicUsize>,
    /// One value, so a reader never pairs one step's reserved figure with another's cached one.
    kv_use: Arc<Mutex<KvUse>>,
    prefix_blocks: Arc<AtomicUsize>,
    spec: Arc<Mutex<SpecStats>>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Whole pages for `positions`, in positions.
fn paged(positions: usize) -> usize {
    positions.next_multiple_of(BLOCK)
}

/// Most recurrent-state copies one request takes (hybrid models).
const STATE_COPIES: usize = 8;

/// The page ends after `from` and before `end` (the last prompt token is always fed again) at
/// which to keep the state, at most `n`: all of them, or the last and others evenly spaced back
/// from it.
fn copy_points(from: usize, end: usize, n: usize) -> Vec<usize> {
    let ends: Vec<usize> = (from / BLOCK + 1..)
        .map(|j| j * BLOCK)
        .take_while(|&p| p < end)
        .collect();
    if n == 0 || ends.is_empty() {
        return Vec::new();
    }
    let stride = ends.len().div_ceil(n);
    ends.iter().rev().step_by(stride).take(n).copied().collect()
}

/// The engine thread's state: slots, the prefix cache and the KV budget they share.
struct Sched<B: Backend> {
    slots: Vec<Slot<B>>,
    store: PrefixStore<B::Page>,
    /// Positions the slots' allocations and the cache's blocks may take together.
    budget: usize,
    tick: u64,
    /// The queue's head when it waits for KV budget (the channel behind it stays bounded).
    waiting: Option<Job>,
}

impl<B: Backend> Sched<B> {
    /// Positions held now: the pool's live pages (slots' and the prefix cache's, each once).
    fn used(&self, b: &B) -> usize {
        b.kv_live_pages(&self.slots[0].kv) * BLOCK
    }

    /// Positions reserved by running requests.
    fn active(&self, b: &B) -> usize {
        self.slots
            .iter()
            .filter(|s| s.active.is_some())
            .map(|s| b.kv_capacity(&s.kv))
            .sum()
    }

    /// Give up memory until slot `keep` can hold `need` positions (whole pages) and `copies` more
    /// (recurrent-state copies, as positions) within the budget: least recently used cache blocks
    /// first, then the kept tokens of idle slots (least recently used first), then `keep`'s own
    /// state copies, its positions past `from` (which its next request cuts anyway) and at last
    /// all of them. False when even that is not enough.
    fn make_room(&mut self, b: &B, need: usize, copies: usize, keep: usize, from: usize) -> bool {
        let mut last_resort = 0;
        loop {
            let have = paged(b.kv_capacity(&self.slots[keep].kv));
            if self.used(b) + need.saturating_sub(have) + copies <= self.budget {
                return true;
            }
            if self.store.evict_one() {
                continue;
            }
            let idle = self
                .slots
                .iter()
                .enumerate()
                .filter(|(i, s)| *i != keep && s.active.is_none() && b.kv_capacity(&s.kv) > 0)
                .min_by_key(|(_, s)| s.used)
                .map(|(i, _)| i);
            if let Some(i) = idle {
                let s = &mut self.slots[i];
                s.tokens.clear();
                b.kv_release(&mut s.kv, 0);
                continue;
            }
            let s = &mut self.slots[keep];
            match last_resort {
                0 => b.kv_drop_copies(&mut s.kv),
                1 => {
                    s.tokens.truncate(from);
                    b.kv_release(&mut s.kv, from);
                }
                2 => {
                    s.tokens.clear();
                    b.kv_release(&mut s.kv, 0);
                }
                _ => return false,
            }
            last_resort += 1;
        }
    }

    /// Hand the pages of a slot's whole blocks to the prefix cache (those not there yet; shared,
    /// not copied), then shrink its allocation to the tokens it keeps.
    fn retire(&mut self, b: &B, i: usize) {
        let s = &mut self.slots[i];
        let keys = chain_keys(self.store.fingerprint(), &s.tokens);
        for (j, key) in keys.iter().enumerate() {
            if !self.store.contains(key) {
                let page = b.kv_page(&s.kv, j);
                let data = || b.page_data(&page);
                self.store
                    .insert(*key, &s.tokens[j * BLOCK..(j + 1) * BLOCK], page.clone(), data);
            }
        }
        b.kv_release(&mut s.kv, s.tokens.len());
        // The cache lives within the budget: drop its oldest blocks if the new ones overflow it,
        // then the slot's own recurrent-state copies.
        while self.used(b) > self.budget && self.store.evict_one() {}
        if self.used(b) > self.budget {
            b.kv_drop_copies(&mut self.slots[i].kv);
        }
    }
}

fn schedule<B: Backend>(m: &Engine<B>, mut sc: Sched<B>, queue: &JobQueue, gauges: &Gauges, limits: Limits) {
    let mut scratch = m.model.scratch(limits.prefill_chunk + sc.slots.len());
    let b: &B = m.model.backend();
    loop {
        // Admit queued jobs into idle slots (block only when nothing is running).
        while sc.slots.iter().any(|s| s.active.is_none()) {
            let job = match sc.waiting.take() {
                Some(j) => j,
                None => {
                    let busy = sc.slots.iter().any(|s| s.active.is_some());
                    match queue.pop(!busy) {
                        Some(j) => j,
                        None => break,
                    }
                }
            };
            match admit(b, &mut sc, job) {
                Admit::Started | Admit::Refused => {}
                Admit::Wait(job) => {
                    sc.waiting = Some(*job);
                    break;
                }
            }
        }
        let running = sc.slots.iter().filter(|s| s.active.is_some()).count();
        gauges.active.store(running, Ordering::Relaxed);
        // Unloaded (the last handle dropped): end once the last request is done.
        if running == 0 && sc.waiting.is_none() && queue.closed.load(Ordering::Acquire) && queue.len() == 0 {
            return;
        }
        gauges.held.store(usize::from(sc.waiting.is_some()), Ordering::Relaxed);
        // A client that left during its prompt's prefill (no token sent yet to notice it by).
        for i in 0..sc.slots.len() {
            if sc.slots[i].active.as_ref().is_some_and(|a| a.job.gone()) {
                sc.slots[i].active = None;
                sc.retire(b, i);
            }
        }
        let finished = step(m, &mut sc.slots, &mut scratch, limits.prefill_chunk, &gauges.spec);
        for i in finished {
            sc.retire(b, i);
        }
        // KV figures first: a reader who sees the slot idle also sees its memory given back.
        let active = sc.active(b);
        let cached = sc.used(b).saturating_sub(active);
        *gauges.kv_use.lock().unwrap_or_else(|e| e.into_inner()) = KvUse { active, cached };
        gauges.prefix_blocks.store(sc.store.len(), Ordering::Release);
        gauges.active.store(
            sc.slots.iter().filter(|s| s.active.is_some()).count(),
            Ordering::Release,
        );
    }
}

enum Admit {
    Started,
    /// Answered with an error (or the client is gone).
    Refused,
    /// Not enough KV budget free yet.
    Wait(Box<Job>),
}

/// Cut a sequence back to at most `pos` (where a hybrid model's state can resume) and give up its
/// pages past that point; returns where it now ends.
fn cut_back<B: Backend>(b: &B, kv: &mut B::Kv, pos: usize) -> usize {
    let p = b.kv_restore(kv, pos);
    b.kv_release(kv, p);
    p
}

/// [`cut_back`], further back where needed so that the sequence's next write lands in a page it
/// holds alone.
fn writable_from<B: Backend>(b: &B, kv: &mut B::Kv, pos: usize) -> usize {
    let mut p = cut_back(b, kv, pos);
    while b.kv_page_shared(kv, p / BLOCK) {
        p = cut_back(b, kv, p / BLOCK * BLOCK);
    }
    p
}

/// Start a job in the idle slot sharing the longest prefix with its prompt, extended by the
/// prefix cache's blocks, once its KV reservation fits in the budget.
fn admit<B: Backend>(b: &B, sc: &mut Sched<B>, mut job: Job) -> Admit {
    if job.gone() {
        return Admit::Refused;
    }
    let n_ctx = sc.slots[0].n_ctx;
    let need = (job.prompt.len() + job.params.max_tokens)
        .min(n_ctx)
        .max(job.prompt.len());
    if paged(need) > sc.budget {
        let e = ApiError::bad_request(format!(
            "this request needs {need} KV cache positions ({} prompt tokens + max_tokens), more than the \
             server's KV budget of {} (--kv-budget)",
            job.prompt.len(),
            sc.budget
        ))
        .with_code("kv_budget_exceeded");
        job.send(Event::Error(e));
        return Admit::Refused;
    }
    let (best, from_slot) = sc
        .slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.active.is_none())
        .map(|(i, s)| (i, common_prefix(&s.tokens, &job.prompt).min(job.prompt.len() - 1)))
        .max_by_key(|&(_, c)| c)
        .expect("admit is called with an idle slot");
    // Hybrid models: room for the state copies too, as many as fit in the budget.
    let kv = &sc.slots[best].kv;
    let copy_cost = match b.kv_state_bytes(kv) {
        0 => 0,
        sb => sb.div_ceil(b.kv_page_bytes(kv).max(1)).max(1) * BLOCK,
    };
    // The slot keeps its tokens up to where the prompt departs from them (a hybrid model's state
    // goes back only to a point it kept); its pages past that point are given up now, so that the
    // budget counts each page the request writes. The first write into a page that the prefix
    // cache or another slot holds too copies it: one page more, or, when the budget cannot hold
    // it, that page's positions are fed again.
    let slot = &mut sc.slots[best];
    let mut from_slot = cut_back(b, &mut slot.kv, from_slot);
    let mut shared = b.kv_page_shared(&slot.kv, from_slot / BLOCK);
    if shared && paged(need) + BLOCK > sc.budget {
        from_slot = writable_from(b, &mut slot.kv, from_slot);
        shared = false;
    }
    slot.tokens.truncate(from_slot);
    let own = paged(need) + if shared { BLOCK } else { 0 };
    let mut copies = if copy_cost > 0 { STATE_COPIES } else { 0 };
    copies = copies.min(copy_points(from_slot, job.prompt.len(), copies).len());
    while copies > 0 && own + copies * copy_cost > sc.budget {
        copies -= 1;
    }
    if !sc.make_room(b, own, copies * copy_cost, best, from_slot) {
        return Admit::Wait(Box::new(job));
    }
    // (Making room may have given up some of the slot's kept tokens.)
    let from_slot = from_slot.min(sc.slots[best].tokens.len());
    let decoding = match Decoding::new(&job.params, &job.prompt) {
        Ok(d) => match job.constraint.take() {
            Some(c) => d.with_constraint(c),
            None => d,
        },
        Err(e) => {
            job.send(Event::Error(e.into()));
            return Admit::Refused;
        }
    };
    sc.tick += 1;
    let slot = &mut sc.slots[best];
    slot.used = sc.tick;
    if let Err(e) = b.kv_reserve(&mut slot.kv, need) {
        slot.tokens.clear();
        job.send(Event::Error(e.into()));
        return Admit::Refused;
    }
    // Whole blocks beyond what the slot kept, from the prefix cache, as long as they continue it:
    // pages in memory are mapped (the private page reserved there is dropped), blocks on disk are
    // read into the slot's page, which the cache then keeps.
    let keys = chain_keys(sc.store.fingerprint(), &job.prompt);
    let mut cached = from_slot;
    for (j, key) in keys.iter().enumerate().skip(from_slot / BLOCK) {
        let end = (j + 1) * BLOCK;
        if end > need {
            break;
        }
        let ok = match sc.store.get(key, &job.prompt[j * BLOCK..end]) {
            None => false,
            Some(Hit::Page(page)) => b.kv_map(&mut slot.kv, j, &page).is_ok(),
            Some(Hit::Disk(data)) => {
                let ok = b.kv_import(&mut slot.kv, j * BLOCK, &data).is_ok();
                if ok {
                    sc.store.adopt(*key, b.kv_page(&slot.kv, j));
                }
                ok
            }
        };
        if !ok {
            break;
        }
        cached = cached.max(end);
    }
    // The last prompt token is always fed again: its logits start the reply. A hybrid model's
    // state resumes from the latest copy at or before that (a mapped page's, or the slot's own).
    // When that falls in a mapped page (a prompt of whole blocks, all cached), that block is fed
    // again into a page of the slot's own, as budgeted.
    let resume = cached.min(job.prompt.len() - 1);
    let cached = if cached > from_slot {
        writable_from(b, &mut slot.kv, resume)
    } else {
        b.kv_restore(&mut slot.kv, resume)
    };
    if let Err(e) = b.kv_reserve(&mut slot.kv, need) {
        slot.tokens.clear();
        job.send(Event::Error(e.into()));
        return Admit::Refused;
    }
    b.kv_keep_states(&mut slot.kv, &copy_points(cached, job.prompt.len(), copies));
    slot.tokens.clear();
    slot.tokens.extend_from_slice(&job.prompt[..cached]);
    let started = std::time::Instant::now();
    job.send(Event::Progress(Progress {
        total: job.prompt.len(),
        cache: cached,
        processed: cached,
        ms: 0.0,
    }));
    let drafter = Drafter::of(job.params.spec.on(b), job.params.draft_max);
    slot.active = Some(Active {
        drafter,
        job,
        decoding,
        fed: cached,
        next: None,
        cached,
        started,
        first: None,
    });
    // Blocks loaded from disk count against the budget too.
    while sc.used(b) > sc.budget && sc.store.evict_one() {}
    Admit::Started
}

/// What one slot feeds a step: tokens (with `drafts` drafted ones after the first: a check,
/// speculative decoding) and whether it wants logits.
struct Feed {
    slot: usize,
    tokens: Vec<u32>,
    wants: bool,
    drafts: usize,
}

/// One batched forward: a decode token for every generating slot (with the tokens its drafter
/// proposes after it, checked in the same step), then prompt chunks. Returns the slots whose
/// request ended (their tokens are still cached).
fn step<B: Backend>(
    m: &Engine<B>,
    slots: &mut [Slot<B>],
    scratch: &mut engine::model::Scratch,
    prefill_chunk: usize,
    spec: &Mutex<SpecStats>,
) -> Vec<usize> {
    let backend = m.model.backend().clone();
    // Plan what each slot feeds this step.
    let mut budget = prefill_chunk;
    let mut feeds: Vec<Feed> = Vec::new();
    for (i, s) in slots.iter_mut().enumerate() {
        let Some(a) = &mut s.active else { continue };
        let Some(t) = a.next else { continue };
        let mut tokens = vec![t];
        if let Some(dr) = &mut a.drafter {
            // Drafts within the context, the reservation and the reply's token limit.
            let room = backend
                .kv_capacity(&s.kv)
                .min(s.n_ctx)
                .saturating_sub(s.tokens.len() + 1)
                .min(a.decoding.remaining().saturating_sub(1));
            match dr {
                Drafter::Ngram(dr) => {
                    let mut h = s.tokens.clone();
                    h.push(t);
                    tokens.extend(dr.propose(&h, room));
                }
                // A failed MTP step only costs this step's drafts (the sequence goes on).
                Drafter::Mtp(dr) => tokens.extend(
                    dr.propose(m.model.as_ref(), scratch, &mut s.kv, t, room)
                        .unwrap_or_default(),
                ),
            }
        }
        feeds.push(Feed {
            slot: i,
            drafts: tokens.len() - 1,
            tokens,
            wants: true,
        });
    }
    // Prompts are fed in chunks that end at multiples of the chunk size, whatever else runs: a
    // chunk that does not fit in this step's room waits for the next step (unless no prompt was
    // fed yet), so a prompt is cut the same way alone and in company and replies do not depend on
    // the batch.
    let mut prefilled = false;
    for (i, s) in slots.iter().enumerate() {
        let Some(a) = &s.active else { continue };
        if a.next.is_none() && a.fed < a.job.prompt.len() {
            let chunk_end = (a.fed / prefill_chunk.max(1) + 1) * prefill_chunk.max(1);
            let n = a.job.prompt.len().min(chunk_end) - a.fed;
            if n > budget && prefilled {
                continue;
            }
            budget = budget.saturating_sub(n);
            prefilled = true;
            let last = a.fed + n == a.job.prompt.len();
            feeds.push(Feed {
                slot: i,
                tokens: a.job.prompt[a.fed..a.fed + n].to_vec(),
                wants: last,
                drafts: 0,
            });
        }
    }
    if feeds.is_empty() {
        return Vec::new();
    }
    // Borrow each fed slot's cache once, in slot order.
    feeds.sort_by_key(|f| f.slot);
    let mut steps = Vec::with_capacity(feeds.len());
    let mut rest: &mut [Slot<B>] = slots;
    let mut base = 0;
    for f in &feeds {
        let (_, tail) = rest.split_at_mut(f.slot - base);
        let (one, tail) = tail.split_at_mut(1);
        let s = &mut one[0];
        let pos0 = s.tokens.len();
        let logits = if f.drafts > 0 {
            // Each row as a decode step would compute it; a hybrid model's state can go back to
            // any drafted position.
            let marks: Vec<usize> = (pos0 + 1..pos0 + f.tokens.len()).collect();
            backend.kv_keep_states(&mut s.kv, &marks);
            Logits::Each
        } else if f.wants {
            Logits::Last
        } else {
            Logits::None
        };
        steps.push(SeqStep {
            pos0,
            kv: &mut s.kv,
            tokens: &f.tokens,
            logits,
        });
        rest = tail;
        base = f.slot + 1;
    }
    // Each logits row reduced to its argmax where it was computed; a sequence that samples
    // otherwise reads its whole row below.
    let out = m.model.forward_argmax(scratch, &mut steps);
    drop(steps);
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            // Fail the sequences of this step; their caches are reset.
            let err: ApiError = e.into();
            for f in &feeds {
                if let Some(a) = slots[f.slot].active.take() {
                    a.job.send(Event::Error(err.clone()));
                }
                slots[f.slot].tokens.clear();
                // A recurrent state the failed step left midway is no longer any position's.
                backend.kv_restore(&mut slots[f.slot].kv, 0);
            }
            return Vec::new();
        }
    };
    // Sampled sequences, asked of the backend at once: where it draws on the device, the token
    // drawn there (only the token crosses; the draw is taken from the sampler now). Else, with a
    // top-k cut, what the cut needs of the row (a GPU hands back those values, not the rows);
    // without one, the draw too, made on the host from the rows read (`sample_rows_on_host`,
    // the rows in parallel). The rows are counted as below.
    let on_device = m.model.samples_on_device();
    let mut asks: Vec<(usize, engine::backend::TopAsk)> = Vec::new();
    let mut draws: Vec<(usize, engine::backend::SampleAsk)> = Vec::new();
    let mut row = 0;
    for (fi, f) in feeds.iter().enumerate() {
        let r0 = row;
        row += if f.drafts > 0 {
            f.tokens.len()
        } else {
            usize::from(f.wants)
        };
        let Some(a) = slots[f.slot].active.as_mut().filter(|_| f.wants && f.drafts == 0) else {
            continue;
        };
        let d = &mut a.decoding;
        if d.greedy_only() {
            continue;
        }
        let vocab = m.tokenizer.n_vocab();
        if let Some(ask) = (!on_device).then(|| d.top_needs(r0, vocab)).flatten() {
            asks.push((fi, ask));
        } else if let Some(ask) = d.sample_needs(r0) {
            draws.push((fi, ask));
        } else if let Some(ask) = on_device.then(|| d.top_needs(r0, vocab)).flatten() {
            asks.push((fi, ask));
        }
    }
    let sampled = if draws.is_empty() {
        Vec::new()
    } else {
        let only: Vec<engine::backend::SampleAsk> = draws.iter().map(|(_, a)| a.clone()).collect();
        // (On an error each of these sequences reads its whole row below, which reports it.)
        m.model.logits_sample(scratch, &only).unwrap_or_default()
    };
    let only: Vec<engine::backend::TopAsk> = asks.iter().map(|(_, a)| a.clone()).collect();
    // (On an error each of these sequences reads its whole row below, which reports it.)
    let tops = if only.is_empty() {
        Vec::new()
    } else {
        m.model.logits_top(scratch, &only).unwrap_or_default()
    };
    let mut finished = Vec::new();
    // The step's logits rows, in feed order; its token rows (whose hidden states an MTP drafter
    // pairs with the tokens after them), and the prompt rows to pair once every row is read.
    let mut row = 0;
    let mut trow = 0;
    let mut mtp_prompt: Vec<(usize, usize, usize, Vec<u32>)> = Vec::new();
    for (fi, f) in feeds.into_iter().enumerate() {
        let s = &mut slots[f.slot];
        let r0 = row;
        let t0 = trow;
        trow += f.tokens.len();
        let pos0 = s.tokens.len();
        row += if f.drafts > 0 {
            f.tokens.len()
        } else {
            usize::from(f.wants)
        };
        if f.drafts == 0 {
            s.tokens.extend_from_slice(&f.tokens);
        }
        let Some(a) = &mut s.active else { continue };
        let decode = a.next.is_some();
        if a.next.is_none() {
            if let Some(Drafter::Mtp(dr)) = &mut a.drafter {
                // Prompt rows whose next token is known go through the MTP layer after this
                // step; the prompt's last row waits for the first sampled token.
                let (p, n) = (&a.job.prompt, f.tokens.len());
                let known = n.min(p.len().saturating_sub(a.fed + 1));
                if known > 0 {
                    mtp_prompt.push((f.slot, t0, pos0, p[a.fed + 1..a.fed + 1 + known].to_vec()));
                }
                if known < n {
                    dr.target_step(t0 + n - 1, pos0 + n - 1, Vec::new());
                }
            }
            a.fed += f.tokens.len();
            a.job.send(Event::Progress(Progress {
                total: a.job.prompt.len(),
                cache: a.cached,
                processed: a.fed,
                ms: a.started.elapsed().as_secs_f64() * 1e3,
            }));
        }
        if !f.wants {
            continue;
        }
        a.first.get_or_insert_with(std::time::Instant::now);
        if let (Some(Drafter::Mtp(dr)), true, 0) = (&mut a.drafter, decode, f.drafts) {
            // A decode step without drafts: its row pairs with the token it gives.
            dr.target_step(t0, pos0, Vec::new());
        }
        let taken = if f.drafts > 0 {
            let argmax = out.get(r0..r0 + f.tokens.len()).unwrap_or(&[]);
            let checked = engine::spec::check(&mut a.decoding, &m.tokenizer, &f.tokens[1..], argmax, |i| {
                m.model.logits_row(scratch, r0 + i)
            });
            checked.and_then(|c| {
                let n = c.rows();
                s.tokens.extend_from_slice(&f.tokens[..n]);
                let at = backend.kv_restore(&mut s.kv, s.tokens.len());
                if at != s.tokens.len() {
                    return Err(engine::EngineError::Backend(format!(
                        "speculative decoding: the cache went back to position {at}, not {}",
                        s.tokens.len()
                    )));
                }
                if let Some(dr) = &mut a.drafter {
                    dr.feedback(f.drafts, n - 1);
                    if let Drafter::Mtp(dr) = dr {
                        dr.target_step(t0, pos0, f.tokens[1..n].to_vec());
                    }
                }
                let mut st = spec.lock().unwrap_or_else(|e| e.into_inner());
                st.add(&SpecStats {
                    checks: 1,
                    drafted: f.drafts,
                    accepted: n - 1,
                });
                Ok(c.steps)
            })
        } else if a.decoding.greedy_only() {
            Ok(vec![a
                .decoding
                .step_token(&m.tokenizer, out.get(r0).copied().unwrap_or(0))])
        } else if let Some(&tok) = draws.iter().position(|(i, _)| *i == fi).and_then(|k| sampled.get(k)) {
            Ok(vec![a.decoding.step_sampled(&m.tokenizer, tok)])
        } else if let Some((ask, top)) = asks
            .iter()
            .position(|(i, _)| *i == fi)
            .and_then(|k| Some((&asks[k].1, tops.get(k)?)))
        {
            Ok(vec![a.decoding.step_top(&m.tokenizer, ask, top, None)])
        } else {
            m.model
                .logits_row(scratch, r0)
                .map(|mut logits| vec![a.decoding.step(&m.tokenizer, &mut logits)])
        };
        let taken = match taken {
            Ok(t) => t,
            Err(e) => {
                // As a failed step: the sequence ends with the error, its cache is reset.
                a.job.send(Event::Error(e.into()));
                s.active = None;
                s.tokens.clear();
                backend.kv_restore(&mut s.kv, 0);
                continue;
            }
        };
        let n = taken.len();
        let mut finish = None;
        let mut next = None;
        for (k, st) in taken.into_iter().enumerate() {
            let mut gone =
                (!st.text.is_empty() || st.logprob.is_some()) && !a.job.send(Event::Token(st.text, st.logprob));
            // No room for the sampled token: the context is full, the answer ends here.
            let full = k + 1 == n && st.finish.is_none() && s.tokens.len() >= s.n_ctx;
            if full && !gone {
                let rest = a.decoding.flush();
                gone = !rest.is_empty() && !a.job.send(Event::Token(rest, None));
            }
            finish = if gone {
                Some(Finish::Cancelled)
            } else if full {
                Some(Finish::Length)
            } else {
                st.finish
            };
            next = st.token;
            if finish.is_some() {
                break;
            }
        }
        match finish {
            None => a.next = next,
            Some(why) => {
                finished.push(f.slot);
                let a = s.active.take().expect("active");
                if why != Finish::Cancelled {
                    let first = a.first.unwrap_or(a.started);
                    a.job.send(Event::Done {
                        prompt_ms: (first - a.started).as_secs_f64() * 1e3,
                        predicted_ms: first.elapsed().as_secs_f64() * 1e3,
                        finish: why,
                        prompt_tokens: a.job.prompt.len(),
                        completion_tokens: a.decoding.tokens.len(),
                        cached_tokens: a.cached,
                        stop: a.decoding.matched_stop().map(str::to_string),
                    });
                }
            }
        }
    }
    for (slot, row0, pos0, tokens) in mtp_prompt {
        let rows: Vec<usize> = (row0..row0 + tokens.len()).collect();
        // A failed MTP step only costs drafts (the sequence goes on).
        let _ = m.model.forward_mtp_argmax(
            scratch,
            &mut [SeqStep {
                kv: &mut slots[slot].kv,
                tokens: &tokens,
                pos0,
                logits: Logits::None,
            }],
            HiddenRows::Target(&rows),
        );
    }
    finished
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_copies_go_at_page_ends_back_from_the_last() {
        assert_eq!(copy_points(0, 230, 8), vec![192, 128, 64]);
        // The end itself is fed again: a page end at it is not a copy point.
        assert_eq!(copy_points(0, 192, 8), vec![128, 64]);
        assert_eq!(copy_points(130, 400, 8), vec![384, 320, 256, 192]);
        // Past the limit: the last, then evenly spaced back.
        assert_eq!(copy_points(0, 64 * 20 + 1, 4), vec![1280, 960, 640, 320]);
        assert!(copy_points(0, 50, 8).is_empty() && copy_points(0, 500, 0).is_empty());
    }
}
