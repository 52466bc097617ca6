//! The KV cache in GPU memory, in pages of [`PAGE`] positions with the CPU's page layout
//! (`cpu::kv::Layout`), so that pages persisted by one backend import into the other. Pages come
//! from a pool of device slabs; a page is reference-counted (prefix cache and sequences share it)
//! and copied before a write when shared, as on the CPU. Dropping the last holder returns the page
//! to its pool's free list.
//!
//! A hybrid model's sequence also holds its recurrent state in device memory, with copies kept
//! with pages or as checkpoints, as on the CPU (`backend::state`).

use super::{CudaBuf, CudaStep, Dev};
use crate::backend::kv::{self, Layout};
use crate::backend::state::{restore_source, SeqState, Source, StateLayout};
use crate::backend::KvType;
use crate::backend::Rope;
use crate::model::{KvLayer, PAGE};
use crate::{EngineError, Result};
use cudarc::driver::CudaSlice;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Pages allocated per slab.
const SLAB_PAGES: usize = 16;

pub struct Pool {
    dev: Arc<Dev>,
    page_bytes: usize,
    slabs: Mutex<Vec<CudaSlice<u8>>>,
    free: Mutex<Vec<u64>>,
    live: AtomicUsize,
}

impl Pool {
    fn take(self: &Arc<Self>) -> Result<Arc<GpuPage>> {
        let ptr = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            if free.is_empty() {
                let n = SLAB_PAGES;
                let slab = self.dev.alloc_bytes(n * self.page_bytes).map_err(|e| {
                    EngineError::Backend(format!("GPU memory for {n} KV pages of {} bytes: {e}", self.page_bytes))
                })?;
                let base = self.dev.ptr(&slab);
                free.extend((0..n).rev().map(|i| base + (i * self.page_bytes) as u64));
                self.slabs.lock().unwrap_or_else(|e| e.into_inner()).push(slab);
            }
            free.pop().expect("a free page")
        };
        self.live.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(GpuPage {
            ptr,
            pool: self.clone(),
            state: None,
        }))
    }
}

/// One page of K/V rows in device memory.
pub struct GpuPage {
    pub(super) ptr: u64,
    pool: Arc<Pool>,
    /// The recurrent state at the page's end, when kept (hybrid models); set and cleared only
    /// while one holder has the page.
    state: Option<Arc<GpuSnap>>,
}

/// A copy of a sequence's recurrent state in device memory (`StateLayout`'s order, f32).
pub struct GpuSnap {
    mem: Option<CudaSlice<u8>>,
    pub(super) ptr: u64,
    dev: Arc<Dev>,
    /// Recurrent layers written so far, of `layers`: a copy is used only once complete.
    done: usize,
    layers: usize,
    live: Arc<AtomicUsize>,
}

impl GpuSnap {
    fn new(dev: &Arc<Dev>, layout: &StateLayout, live: &Arc<AtomicUsize>) -> Result<GpuSnap> {
        let mem = dev.alloc_bytes(layout.bytes()).map_err(|e| {
            EngineError::Backend(format!(
                "GPU memory for a recurrent-state copy of {} bytes: {e}",
                layout.bytes()
            ))
        })?;
        live.fetch_add(1, Ordering::Relaxed);
        Ok(GpuSnap {
            ptr: dev.ptr(&mem),
            mem: Some(mem),
            dev: dev.clone(),
            done: 0,
            layers: layout.n_recurrent,
            live: live.clone(),
        })
    }

    pub fn complete(&self) -> bool {
        self.done == self.layers
    }
}

impl Drop for GpuSnap {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
        if let Some(m) = self.mem.take() {
            // Recorded launches may still write it.
            self.dev.bury(Box::new(m));
        }
    }
}

/// A sequence's recurrent state in device memory.
pub(super) struct GpuState {
    pub(super) layout: Arc<StateLayout>,
    _mem: CudaSlice<u8>,
    /// Address of the current state.
    pub(super) ptr: u64,
    pub(super) seq: SeqState<Arc<GpuSnap>>,
    snaps: Arc<AtomicUsize>,
}

impl GpuState {
    fn new(dev: &Arc<Dev>, layout: Arc<StateLayout>, snaps: Arc<AtomicUsize>) -> Result<GpuState> {
        let mem = dev.alloc_bytes(layout.bytes()).map_err(|e| {
            EngineError::Backend(format!(
                "GPU memory for a recurrent state of {} bytes: {e}",
                layout.bytes()
            ))
        })?;
        let ptr = dev.ptr(&mem);
        dev.memset(ptr, layout.bytes());
        Ok(GpuState {
            layout,
            _mem: mem,
            ptr,
            seq: SeqState::default(),
            snaps,
        })
    }
}

impl Drop for GpuPage {
    fn drop(&mut self) {
        self.pool.live.fetch_sub(1, Ordering::Relaxed);
        self.pool.free.lock().unwrap_or_else(|e| e.into_inner()).push(self.ptr);
    }
}

pub struct CudaKv {
    pub(super) layout: Arc<Layout>,
    n_ctx: usize,
    pub(super) pages: Vec<Arc<GpuPage>>,
    pool: Arc<Pool>,
    /// The recurrent state (hybrid models).
    pub(super) rec: Option<GpuState>,
}

impl CudaKv {
    pub(super) fn new(dev: &Arc<Dev>, layers: &[KvLayer], n_ctx: usize, ty: KvType) -> Result<CudaKv> {
        let layout = Layout::new(layers, ty)?;
        if n_ctx.div_ceil(PAGE).checked_mul(layout.page_bytes).is_none() {
            return Err(EngineError::Config(format!("KV cache of {n_ctx} positions overflows")));
        }
        let pool = Arc::new(Pool {
            dev: dev.clone(),
            page_bytes: layout.page_bytes.max(1),
            slabs: Mutex::new(Vec::new()),
            free: Mutex::new(Vec::new()),
            live: AtomicUsize::new(0),
        });
        let rec = match StateLayout::new(layers) {
            Some(l) => Some(GpuState::new(dev, Arc::new(l), Arc::new(AtomicUsize::new(0)))?),
            None => None,
        };
        let mut kv = CudaKv {
            layout: Arc::new(layout),
            n_ctx,
            pages: Vec::new(),
            pool,
            rec,
        };
        kv.reserve(n_ctx)?;
        Ok(kv)
    }

    /// An empty sequence in the same pool. Its recurrent state (hybrid models) is allocated here;
    /// without the memory for it this fails as an allocation does.
    pub fn sibling(&self, n_ctx: usize) -> CudaKv {
        CudaKv {
            layout: self.layout.clone(),
            n_ctx,
            pages: Vec::new(),
            pool: self.pool.clone(),
            rec: self.rec.as_ref().map(|r| {
                GpuState::new(&self.pool.dev, r.layout.clone(), r.snaps.clone())
                    .unwrap_or_else(|e| self.pool.dev.fail("allocating a recurrent state", e))
            }),
        }
    }

    pub fn ty(&self) -> KvType {
        self.layout.ty
    }

    /// Whether another holder has the page at `block` too.
    pub fn page_shared(&self, block: usize) -> bool {
        kv::page_shared(&self.pages, block)
    }

    pub fn capacity(&self) -> usize {
        (self.pages.len() * PAGE).min(self.n_ctx)
    }

    /// Live pages of the pool, plus its live state copies as the pages their bytes fill.
    pub fn live_pages(&self) -> usize {
        let snaps = self.rec.as_ref().map_or(0, |r| {
            r.snaps.load(Ordering::Relaxed) * r.layout.page_equivalents(self.layout.page_bytes)
        });
        self.pool.live.load(Ordering::Relaxed) + snaps
    }

    pub fn page_bytes(&self) -> usize {
        self.layout.page_bytes
    }

    pub fn reserve(&mut self, positions: usize) -> Result<()> {
        let (pool, bytes) = (&self.pool, self.layout.page_bytes);
        kv::reserve_pages(&mut self.pages, self.n_ctx, positions, || {
            let p = pool.take()?;
            // Zeroed as the CPU's pages are, so a persisted page never holds stale bytes.
            pool.dev.memset(p.ptr, bytes);
            Ok(p)
        })
    }

    /// Drop the pages past `positions`; a recurrent state past them is cut back first.
    pub fn release(&mut self, positions: usize) {
        if self.rec.as_ref().is_some_and(|r| r.seq.pos > positions) {
            self.restore(positions);
        }
        kv::release_pages(&mut self.pages, positions);
    }

    pub fn page(&self, block: usize) -> Arc<GpuPage> {
        self.pages[block].clone()
    }

    pub fn map(&mut self, block: usize, page: &Arc<GpuPage>) -> Result<()> {
        if !Arc::ptr_eq(&page.pool, &self.pool) {
            return Err(EngineError::Backend("a KV page from another model's pool".into()));
        }
        kv::map_page(&mut self.pages, self.n_ctx, block, page)
    }

    /// Make the page at `block` this cache's own before a write (a copy when shared); whether it
    /// was replaced.
    pub(super) fn own_page(&mut self, block: usize) -> Result<bool> {
        if Arc::strong_count(&self.pages[block]) == 1 {
            return Ok(false);
        }
        let fresh = self.pool.take()?;
        self.pool
            .dev
            .copy_dtod(self.pages[block].ptr, fresh.ptr, self.layout.page_bytes);
        self.pages[block] = fresh;
        Ok(true)
    }

    pub fn import(&mut self, pos0: usize, data: &[u8]) -> Result<()> {
        let pb = self.layout.page_bytes;
        if let Some(sb) = self.rec.as_ref().map(|r| r.layout.bytes()) {
            if data.len() == pb + sb {
                self.import(pos0, &data[..pb])?;
                let r = self.rec.as_ref().expect("checked");
                let mut snap = GpuSnap::new(&self.pool.dev, &r.layout, &r.snaps)?;
                self.pool.dev.write_bytes(snap.ptr, &data[pb..]);
                snap.done = snap.layers;
                let b = pos0 / PAGE;
                self.own_page(b)?;
                Arc::get_mut(&mut self.pages[b]).expect("owned").state = Some(Arc::new(snap));
                return Ok(());
            }
        }
        self.layout
            .check_import(pos0, data.len(), self.pages.len(), self.capacity())?;
        for (i, chunk) in data.chunks(pb).enumerate() {
            let b = pos0 / PAGE + i;
            self.own_page(b)?;
            self.pool.dev.write_bytes(self.pages[b].ptr, chunk);
        }
        Ok(())
    }
}

impl CudaKv {
    pub fn state_pos(&self) -> Option<usize> {
        self.rec.as_ref().map(|r| r.seq.pos)
    }

    pub fn state_bytes(&self) -> usize {
        self.rec.as_ref().map_or(0, |r| r.layout.bytes())
    }

    pub fn keep_states(&mut self, positions: &[usize]) {
        if let Some(r) = &mut self.rec {
            r.seq.keep(positions);
        }
    }

    /// Drop the state copies only this sequence holds (see `Backend::kv_drop_copies`).
    pub fn drop_copies(&mut self) {
        let Some(r) = &mut self.rec else { return };
        r.seq.checkpoints.clear();
        for page in &mut self.pages {
            if let Some(pg) = Arc::get_mut(page) {
                pg.state = None;
            }
        }
    }

    /// Cut back to at most `target` (see `Backend::kv_restore`).
    pub fn restore(&mut self, target: usize) -> usize {
        let Some(r) = &mut self.rec else { return target };
        let with_copies = self
            .pages
            .iter()
            .enumerate()
            .filter(|(_, p)| p.state.as_ref().is_some_and(|s| s.complete()))
            .map(|(b, _)| b);
        let checkpoints = r.seq.checkpoints.iter().map(|(p, s)| (*p, s.complete()));
        let (p, src) = restore_source(target, r.seq.pos, checkpoints, with_copies);
        let (dev, bytes) = (&self.pool.dev, r.layout.bytes());
        match src {
            Source::Current => {}
            Source::Checkpoint(i) => dev.copy_dtod(r.seq.checkpoints[i].1.ptr, r.ptr, bytes),
            Source::Page(b) => dev.copy_dtod(self.pages[b].state.as_ref().expect("a copy").ptr, r.ptr, bytes),
            Source::Zero => dev.memset(r.ptr, bytes),
        }
        r.seq.pos = p;
        r.seq.checkpoints.retain(|c| c.0 <= p);
        r.seq.want.retain(|&w| w > p);
        for (b, page) in self.pages.iter_mut().enumerate() {
            if (b + 1) * PAGE > p {
                if let Some(pg) = Arc::get_mut(page) {
                    pg.state = None;
                }
            }
        }
        p
    }

    /// The device address of the state copy kept at position `p`, made when missing (with its
    /// page at a page end, as a checkpoint elsewhere), and whether a shared page was copied to
    /// hold it (the step's page table must then follow).
    pub(super) fn copy_target(&mut self, p: usize) -> Result<(u64, bool)> {
        let (layout, snaps) = {
            let r = self.rec.as_ref().expect("a cache with recurrent layers");
            (r.layout.clone(), r.snaps.clone())
        };
        let dev = self.pool.dev.clone();
        if !p.is_multiple_of(PAGE) {
            let r = self.rec.as_mut().expect("checked above");
            if !r.seq.checkpoints.iter().any(|c| c.0 == p) {
                let s = Arc::new(GpuSnap::new(&dev, &layout, &snaps)?);
                r.seq.checkpoint(p, || s);
            }
            let c = r.seq.checkpoints.iter().find(|c| c.0 == p).expect("just made");
            return Ok((c.1.ptr, false));
        }
        let b = p / PAGE - 1;
        let replaced = self.own_page(b)?;
        let slot = &mut Arc::get_mut(&mut self.pages[b]).expect("owned").state;
        if slot.as_mut().is_none_or(|s| Arc::get_mut(s).is_none()) {
            *slot = Some(Arc::new(GpuSnap::new(&dev, &layout, &snaps)?));
        }
        Ok((slot.as_ref().expect("made").ptr, replaced))
    }

    /// The copy at `p` has one more layer written.
    pub(super) fn copy_layer_done(&mut self, p: usize) {
        let snap = if p.is_multiple_of(PAGE) {
            Arc::get_mut(&mut self.pages[p / PAGE - 1])
                .and_then(|pg| pg.state.as_mut())
                .and_then(Arc::get_mut)
        } else {
            self.rec
                .as_mut()
                .and_then(|r| r.seq.checkpoints.iter_mut().find(|c| c.0 == p))
                .and_then(|c| Arc::get_mut(&mut c.1))
        };
        if let Some(s) = snap {
            s.done += 1;
        }
    }
}

/// A page's bytes, read from the device, followed by its recurrent-state copy when it holds a
/// complete one.
pub fn page_data(page: &GpuPage) -> Vec<u8> {
    let mut out = page.pool.dev.read_bytes(page.ptr, page.pool.page_bytes);
    if let Some(s) = page.state.as_ref().filter(|s| s.complete()) {
        let bytes = s.mem.as_ref().map_or(0, |m| m.len());
        out.extend(page.pool.dev.read_bytes(s.ptr, bytes));
    }
    out
}

/// The host's side of the step's KV writes and rotations (`store_kv`, `rope_store_kv`, `rope`).
impl super::Cuda {
    /// The host's part of storing the step's K/V rows of `layer` (`store_kv`, `rope_store_kv`):
    /// the shapes checked, pages shared with other holders copied before the write (the page table
    /// follows); the layer's widths, offsets and whether the cache is Q8_0. None without caches.
    pub(super) fn kv_pages(
        &self,
        kvs: &mut [&mut CudaKv],
        step: &CudaStep,
        layer: usize,
        k: &CudaBuf,
        v: &CudaBuf,
    ) -> Option<(usize, usize, usize, usize, bool)> {
        let first = kvs.first()?;
        let layout = first.layout.clone();
        let (kd, vd) = layout.dims[layer];
        assert_eq!((k.cols, v.cols), (kd, vd), "KV rows of layer {layer}");
        let mut changed = false;
        let mut entry = 0usize;
        let mut ptab = step.ptab_host.lock().unwrap_or_else(|e| e.into_inner());
        for (kv, s) in kvs.iter_mut().zip(&step.plan.seqs) {
            assert!(
                s.pos0 + s.rows <= kv.capacity(),
                "KV cache of {} positions cannot hold {}",
                kv.capacity(),
                s.pos0 + s.rows
            );
            if s.rows > 0 {
                for b in s.pos0 / crate::model::PAGE..=(s.pos0 + s.rows - 1) / crate::model::PAGE {
                    if kv
                        .own_page(b)
                        .unwrap_or_else(|e| self.dev.fail("copying a shared KV page", e))
                    {
                        ptab[entry + b] = kv.pages[b].ptr;
                        changed = true;
                    }
                }
            }
            entry += kv.pages.len();
        }
        if changed {
            // SAFETY: the same table, same length, on the stream before the kernels that read it.
            let bytes: Vec<u8> = ptab.iter().flat_map(|p| p.to_le_bytes()).collect();
            self.dev.write_bytes(step.ptab, &bytes);
        }
        drop(ptab);
        let (ko, vo) = layout.offsets[layer];
        Some((kd, vd, ko, vo, layout.ty == KvType::Q8_0))
    }

    /// The step's rope table for `rope` (cos, sin per row and pair: the CPU's,
    /// ggml_rope_cache_init), computed on the host and uploaded once per step.
    pub(super) fn rope_table(&self, step: &CudaStep, rope: &Rope) -> u64 {
        let mut memo = step.rope.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, t)) = memo.iter().find(|(r, _)| r == rope) {
            return *t;
        }
        let mut cs = Vec::with_capacity(step.plan.positions.len() * rope.n_dims);
        for &p in &step.plan.positions {
            for (c, s) in crate::backend::cpu::rope::cache(rope, p as f32) {
                cs.push(c);
                cs.push(s);
            }
        }
        let t = self.dev.upload(&cs);
        memo.push((rope.clone(), t));
        t
    }
}
