//! Greedy decoding without the device waiting for the host between steps: a step's argmax is
//! copied to page-locked host memory behind an event and not waited for
//! (`Backend::argmax_rows_defer`); the next step, enqueued before the host reads it, takes its
//! token ids on the device (`FED` ids: the gather reads the argmax output). Step uploads are staged
//! through page-locked memory too, so enqueuing a step never waits on the stream for the step
//! still running (an upload from pageable memory may: CUDA's API synchronization notes).

use super::dev::{PageLocked, A};
use super::{Cuda, CudaBuf};
use crate::backend::{Backend, Deferred};
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use std::sync::Arc;

/// Deferred argmaxes outstanding at most (decoding keeps two: the one read, the one running).
const SLOTS: usize = 4;
/// Rows of one deferred argmax at most (a step's logits rows).
pub(super) const MAX_ROWS: usize = 1024;
/// Page-locked staging for one step's uploads (two, alternating); larger uploads go pageable.
const STAGE_BYTES: usize = 256 << 10;

pub(super) struct Feed {
    ids: PageLocked,
    /// Per slot: the deferral it holds (its number) and the event after its copy.
    gen: [u64; SLOTS],
    events: Vec<Option<CudaEvent>>,
    next: u64,
    /// The last deferred argmax: its output on the device, its rows and the row length.
    pub(super) last: Option<(u64, usize, usize)>,
    stage: PageLocked,
    /// The half of `stage` this step uploads from, how much of it is used, and per half the
    /// event after the last step that uploaded from it.
    half: usize,
    used: usize,
    stage_done: [Option<CudaEvent>; 2],
}

impl Feed {
    pub(super) fn new() -> Feed {
        Feed {
            ids: PageLocked::null(),
            gen: [u64::MAX; SLOTS],
            events: (0..SLOTS).map(|_| None).collect(),
            next: 0,
            last: None,
            stage: PageLocked::null(),
            half: 0,
            used: 0,
            stage_done: [None, None],
        }
    }

    fn event(ctx: &Arc<CudaContext>) -> Option<CudaEvent> {
        ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)).ok()
    }

    /// Copy `rows` ids at device address `src` (the argmax of rows `cols` long) to the host behind
    /// an event; the deferral's number, or None where page-locked memory or events cannot be had
    /// (the caller reads at once then).
    pub(super) fn defer(
        &mut self,
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        src: u64,
        rows: usize,
        cols: usize,
    ) -> Option<u64> {
        if rows > MAX_ROWS {
            return None;
        }
        if self.ids.0.is_null() {
            self.ids = PageLocked::new(SLOTS * MAX_ROWS * 4);
            if self.ids.0.is_null() {
                return None;
            }
        }
        let g = self.next;
        let s = (g % SLOTS as u64) as usize;
        if self.events[s].is_none() {
            self.events[s] = Self::event(ctx);
        }
        let ev = self.events[s].as_ref()?;
        // A slot is reused four deferrals later; the one it held was read (decoding reads each in
        // order) or is dropped unread.
        let _ = ev.synchronize();
        // SAFETY: slot `s` of the page-locked buffer (`rows` ≤ MAX_ROWS ids); `src` holds `rows`
        // ids on this context's device.
        let rc = unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                self.ids.0.add(s * MAX_ROWS * 4) as *mut _,
                src,
                rows * 4,
                stream.cu_stream(),
            )
        };
        if rc != sys::CUresult::CUDA_SUCCESS || ev.record(stream).is_err() {
            return None;
        }
        self.gen[s] = g;
        self.next += 1;
        self.last = Some((src, rows, cols));
        Some(g)
    }

    /// The ids of deferral `g` (waits for its copy).
    pub(super) fn take(&mut self, g: u64, rows: usize) -> Vec<u32> {
        let s = (g % SLOTS as u64) as usize;
        assert_eq!(self.gen[s], g, "deferred argmax {g} read after {SLOTS} more were begun");
        if let Some(ev) = &self.events[s] {
            let _ = ev.synchronize();
        }
        // SAFETY: the copy into slot `s` (`rows` ids) is complete (its event above).
        let b = unsafe { std::slice::from_raw_parts(self.ids.0.add(s * MAX_ROWS * 4), rows * 4) };
        ids_of(b)
    }

    /// A new step: its uploads go to the other half of the staging buffer, once the step that last
    /// used that half has run (in decoding, two steps back: long done).
    pub(super) fn new_step(&mut self, ctx: &Arc<CudaContext>, stream: &CudaStream) {
        if self.stage.0.is_null() {
            return;
        }
        if self.stage_done[self.half].is_none() {
            self.stage_done[self.half] = Self::event(ctx);
        }
        if let Some(ev) = &self.stage_done[self.half] {
            let _ = ev.record(stream);
        }
        self.half ^= 1;
        self.used = 0;
        if let Some(ev) = &self.stage_done[self.half] {
            let _ = ev.synchronize();
        }
    }

    /// `data` copied into this step's staging half: its host address, or None when it does not fit
    /// (or there is no page-locked memory).
    pub(super) fn stage(&mut self, data: &[u8]) -> Option<*const u8> {
        if self.stage.0.is_null() {
            self.stage = PageLocked::new(2 * STAGE_BYTES);
            if self.stage.0.is_null() {
                return None;
            }
        }
        let at = self.used.next_multiple_of(16);
        if at + data.len() > STAGE_BYTES {
            return None;
        }
        self.used = at + data.len();
        // SAFETY: `at .. at + len` of this step's half, which no pending copy reads (`new_step`).
        unsafe {
            let dst = self.stage.0.add(self.half * STAGE_BYTES + at);
            std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len());
            Some(dst as *const u8)
        }
    }
}

/// Little-endian u32 ids.
pub(super) fn ids_of(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl Cuda {
    /// `argmax_rows`' kernels: each row's first largest index into the argmax scratch (its address).
    pub(super) fn argmax_launch(&self, x: &CudaBuf) -> u64 {
        // Chunks of a row's values to blocks, then each row's chunks to one warp.
        let chunks = x.cols.div_ceil(2048).clamp(1, 64);
        let chunk = x.cols.div_ceil(chunks);
        let parts = x.rows * chunks;
        let need = parts * 2 + x.rows;
        let base = self.grown(
            &self.dev.argmax,
            need,
            need.next_power_of_two().max(1024),
            "argmax scratch",
        );
        let (pv, pi, out) = (base, base + 4 * parts as u64, base + 8 * parts as u64);
        self.dev.launch(
            "argmax_part",
            (x.rows as u32, chunks as u32),
            256,
            &[A::P(x.ptr), A::I(x.cols as i32), A::I(chunk as i32), A::P(pv), A::P(pi)],
        );
        self.dev.launch(
            "argmax_rows",
            (x.rows as u32, 1),
            32,
            &[A::P(pv), A::P(pi), A::I(chunks as i32), A::P(out)],
        );
        out
    }

    /// `Backend::argmax_rows_defer`.
    pub(super) fn defer_argmax(&self, x: &CudaBuf) -> Deferred {
        if x.rows == 0 || x.rows > MAX_ROWS {
            return Deferred::ready(self.argmax_rows(x));
        }
        let out = self.argmax_launch(x);
        self.dev.flush();
        let g = self
            .dev
            .feed()
            .defer(&self.dev.ctx, &self.dev.stream, out, x.rows, x.cols);
        match g {
            Some(g) => Deferred {
                ids: None,
                slot: g as usize,
                rows: x.rows,
            },
            // No page-locked memory or events: read now.
            None => Deferred::ready(self.dev.read_with(out, 4 * x.rows, ids_of)),
        }
    }
}
