//! `HF2Q_CUDA_PROFILE=N`: per-kernel GPU times, for finding where a step's time goes on a machine
//! whose profilers may not read the hardware counters. From the N-th step on (`Dev::new_step`),
//! every launch and cuBLAS call is bracketed by CUDA events and timed (graphs off, the stream
//! synchronized at each flush, so host gaps do not count); when the device is dropped the totals
//! per kernel go to stderr, longest first. Off (no events, no syncs) unless the variable is set.

use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub(super) struct Prof {
    /// First step timed.
    from: u64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    steps: u64,
    /// Events of the launches issued since the last sync, with their names.
    open: Vec<(String, CudaEvent, CudaEvent)>,
    /// Per name: launches and milliseconds.
    total: HashMap<String, (u64, f64)>,
}

impl Prof {
    /// The profiler asked for by the environment, if any.
    pub(super) fn from_env() -> Option<Prof> {
        let from = std::env::var("HF2Q_CUDA_PROFILE").ok()?.parse().ok()?;
        Some(Prof {
            from,
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn new_step(&self) {
        self.lock().steps += 1;
    }

    /// Whether this step's work is timed.
    pub(super) fn on(&self) -> bool {
        self.lock().steps >= self.from
    }

    /// Run `f` (which enqueues work on `stream`) between two events named `name`.
    pub(super) fn time(&self, ctx: &Arc<CudaContext>, stream: &CudaStream, name: &str, f: impl FnOnce()) {
        if !self.on() {
            return f();
        }
        let ev = || ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT));
        let (Ok(a), Ok(b)) = (ev(), ev()) else { return f() };
        let _ = a.record(stream);
        f();
        let _ = b.record(stream);
        self.lock().open.push((name.to_string(), a, b));
    }

    /// Add up the timed work (after the stream was synchronized).
    pub(super) fn collect(&self) {
        let mut st = self.lock();
        let open = std::mem::take(&mut st.open);
        for (name, a, b) in open {
            let ms = a.elapsed_ms(&b).unwrap_or(0.0) as f64;
            let e = st.total.entry(name).or_default();
            e.0 += 1;
            e.1 += ms;
        }
    }

    pub(super) fn report(&self) {
        self.collect();
        let st = self.lock();
        let mut rows: Vec<_> = st.total.iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let all: f64 = rows.iter().map(|r| r.1 .1).sum();
        let timed = st.steps.saturating_sub(self.from.saturating_sub(1));
        eprintln!(
            "HF2Q_CUDA_PROFILE: {all:.3} ms of GPU work in {timed} steps (from step {}); per kernel:",
            self.from
        );
        eprintln!(
            "{:>10} {:>8} {:>10} {:>6}  kernel",
            "ms", "launches", "us/launch", "share"
        );
        for (name, (n, ms)) in rows {
            eprintln!(
                "{ms:>10.3} {n:>8} {:>10.2} {:>5.1}%  {name}",
                1e3 * ms / *n as f64,
                100.0 * ms / all.max(1e-9)
            );
        }
    }
}

/// `HF2Q_CUDA_STEP_TIMES=1`: how long the replayed graphs of each step (a decode step's parts)
/// keep the GPU busy, against the time from one step's start to the next's, to tell the GPU's
/// share of a step from what the host adds (recording launches, uploads, reading the tokens).
/// Two events per replay, read when the next step starts (the step's tokens were read by then);
/// the report goes to stderr when the device is dropped.
pub(super) struct StepTimes {
    state: Mutex<StepState>,
}

#[derive(Default)]
struct StepState {
    /// This step's replays' events, and the step before's (timed a step later).
    open: Vec<(CudaEvent, CudaEvent)>,
    lagged: Vec<(CudaEvent, CudaEvent)>,
    /// Steps whose GPU time is in `gpu_ms`.
    gpu_steps: u64,
    /// When this step started, and when its first graph was launched.
    started: Option<std::time::Instant>,
    first: Option<std::time::Instant>,
    /// Host time waiting at reads in this step, issuing recorded launches (`Dev::flush`, graph
    /// launches included) and uploading, and the launches recorded.
    wait: std::time::Duration,
    flush: std::time::Duration,
    upload: std::time::Duration,
    launches: u64,
    /// Steps with replays, their GPU time in graphs, and the time from their start to the next's.
    steps: u64,
    gpu_ms: f64,
    period_ms: f64,
    /// Over those steps: from the start to the first graph launch, waiting at reads, issuing,
    /// uploading, and the launches recorded.
    lead_ms: f64,
    wait_ms: f64,
    flush_ms: f64,
    upload_ms: f64,
    launch_count: u64,
}

impl StepTimes {
    pub(super) fn from_env() -> Option<StepTimes> {
        std::env::var("HF2Q_CUDA_STEP_TIMES")
            .is_ok_and(|v| v == "1")
            .then(|| StepTimes {
                state: Mutex::new(StepState::default()),
            })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StepState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run `f` (a graph launch on `stream`) between two events.
    pub(super) fn replay(&self, ctx: &Arc<CudaContext>, stream: &CudaStream, f: impl FnOnce()) {
        let ev = || ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT));
        let (Ok(a), Ok(b)) = (ev(), ev()) else { return f() };
        let now = std::time::Instant::now();
        let _ = a.record(stream);
        f();
        let _ = b.record(stream);
        let mut st = self.lock();
        st.first.get_or_insert(now);
        st.open.push((a, b));
    }

    /// The host waited `d` for a read.
    pub(super) fn waited(&self, d: std::time::Duration) {
        self.lock().wait += d;
    }

    /// The host spent `d` issuing recorded launches.
    pub(super) fn flushed(&self, d: std::time::Duration) {
        self.lock().flush += d;
    }

    /// The host spent `d` uploading step data.
    pub(super) fn uploaded(&self, d: std::time::Duration) {
        self.lock().upload += d;
    }

    /// A launch was recorded.
    pub(super) fn recorded(&self) {
        self.lock().launches += 1;
    }

    /// A step starts: the last one's host times are added up if it had replays, and the GPU time
    /// of the one before it (waiting for its replays: a step behind, so that a step enqueued
    /// before the last one's token is read, `feed.rs`, is not made to wait here).
    pub(super) fn new_step(&self) {
        let mut st = self.lock();
        let now = std::time::Instant::now();
        let open = std::mem::take(&mut st.open);
        let lagged = std::mem::replace(&mut st.lagged, open);
        if let Some((_, last)) = lagged.last() {
            let _ = last.synchronize();
            st.gpu_ms += lagged
                .iter()
                .map(|(a, b)| a.elapsed_ms(b).unwrap_or(0.0) as f64)
                .sum::<f64>();
            st.gpu_steps += 1;
        }
        if let (Some(at), false) = (st.started, st.lagged.is_empty()) {
            st.steps += 1;
            st.period_ms += now.duration_since(at).as_secs_f64() * 1e3;
            let lead = st.first.map_or(0.0, |f| f.duration_since(at).as_secs_f64() * 1e3);
            st.lead_ms += lead;
            st.wait_ms += st.wait.as_secs_f64() * 1e3;
            st.flush_ms += st.flush.as_secs_f64() * 1e3;
            st.upload_ms += st.upload.as_secs_f64() * 1e3;
            st.launch_count += st.launches;
        }
        st.started = Some(now);
        st.first = None;
        st.wait = std::time::Duration::ZERO;
        st.flush = std::time::Duration::ZERO;
        st.upload = std::time::Duration::ZERO;
        st.launches = 0;
    }

    pub(super) fn report(&self) {
        let st = self.lock();
        let per = |ms: f64| 1e3 * ms / st.steps.max(1) as f64;
        eprintln!(
            "HF2Q_CUDA_STEP_TIMES: {} steps with graphs: {:.1} us of GPU time in graphs each, {:.1} us from one step's start to the next's; {:.1} us from the start to the first graph launch, {:.1} us waiting at reads; host {:.1} us issuing and {:.1} us uploading, {:.1} launches recorded",
            st.steps,
            1e3 * st.gpu_ms / st.gpu_steps.max(1) as f64,
            per(st.period_ms),
            per(st.lead_ms),
            per(st.wait_ms),
            per(st.flush_ms),
            per(st.upload_ms),
            st.launch_count as f64 / st.steps.max(1) as f64,
        );
    }
}
