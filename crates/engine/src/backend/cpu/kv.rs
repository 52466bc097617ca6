//! The CPU KV cache as pages of [`PAGE`] positions. A sequence is a list of pages; pages are
//! reference-counted, so the prefix cache and any number of sequences can hold the same page (a
//! cache hit maps pages, nothing is copied). A page is written only while one holder has it; a
//! write to a shared page first copies it (copy on write), so sharing never changes another
//! holder's data. All sequences made from one another ([`CpuKv::sibling`]) form a pool whose live
//! page count is what the KV budget is spent on.
//!
//! Page layout: for each layer, `PAGE` K rows then `PAGE` V rows (a layer without its own cache
//! takes no bytes), which is also the layout of a block written to disk by the prefix cache.
//!
//! A hybrid model's sequence also holds its recurrent state (`backend::state` says why here):
//! the current state in f32, copies of it kept with pages (the state at the page's end) or as
//! checkpoints, all counted in the pool.

use crate::backend::state::{restore_source, SeqState, Source, StateLayout};
use crate::backend::KvType;
use crate::model::KvLayer;
use crate::{EngineError, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::backend::kv;
pub(crate) use crate::backend::kv::Layout;
pub use crate::model::PAGE;

/// One page of K/V rows. Dropping the last holder returns its memory.
pub struct CpuPage {
    data: Box<[u8]>,
    live: Arc<AtomicUsize>,
    /// The recurrent state at the page's end, when kept (hybrid models); set and cleared only
    /// while one holder has the page.
    state: Option<Arc<CpuSnap>>,
}

impl CpuPage {
    fn new(bytes: usize, live: &Arc<AtomicUsize>) -> CpuPage {
        live.fetch_add(1, Ordering::Relaxed);
        CpuPage {
            // Zeroed by the allocator (pages mapped lazily by the OS), never read before written.
            data: vec![0u8; bytes].into_boxed_slice(),
            live: live.clone(),
            state: None,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// The page's bytes followed by its recurrent-state copy when it holds a complete one (the
    /// block a `--kv-persist` file keeps).
    pub fn export(&self) -> Vec<u8> {
        let mut out = self.data.to_vec();
        if let Some(s) = self.state.as_ref().filter(|s| s.complete()) {
            out.extend(s.data.iter().flat_map(|v| v.to_le_bytes()));
        }
        out
    }
}

impl Drop for CpuPage {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A copy of a sequence's recurrent state (every recurrent layer, `StateLayout`'s order), counted
/// in its pool while alive.
pub struct CpuSnap {
    pub(crate) data: Vec<f32>,
    /// Recurrent layers written so far, of `layers`: a copy is used only once complete.
    done: usize,
    layers: usize,
    live: Arc<AtomicUsize>,
}

impl CpuSnap {
    fn new(layout: &StateLayout, live: &Arc<AtomicUsize>) -> CpuSnap {
        live.fetch_add(1, Ordering::Relaxed);
        CpuSnap {
            data: vec![0.0; layout.total],
            done: 0,
            layers: layout.n_recurrent,
            live: live.clone(),
        }
    }

    pub fn complete(&self) -> bool {
        self.done == self.layers
    }
}

impl Drop for CpuSnap {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A sequence's recurrent state.
pub(crate) struct CpuState {
    pub(crate) layout: Arc<StateLayout>,
    /// The current state (`layout.total` values).
    pub(crate) data: Vec<f32>,
    pub(crate) seq: SeqState<Arc<CpuSnap>>,
    /// Copies alive in the pool.
    snaps: Arc<AtomicUsize>,
}

impl CpuState {
    fn new(layout: Arc<StateLayout>, snaps: Arc<AtomicUsize>) -> CpuState {
        CpuState {
            data: vec![0.0; layout.total],
            layout,
            seq: SeqState::default(),
            snaps,
        }
    }
}

pub struct CpuKv {
    pub(crate) layout: Arc<Layout>,
    /// Most positions.
    n_ctx: usize,
    pages: Vec<Arc<CpuPage>>,
    /// Pages alive in this sequence's pool.
    live: Arc<AtomicUsize>,
    /// The recurrent state (hybrid models).
    pub(crate) rec: Option<CpuState>,
}

impl CpuKv {
    pub(crate) fn new(layers: &[KvLayer], n_ctx: usize, ty: KvType) -> Result<CpuKv> {
        let layout = Layout::new(layers, ty)?;
        if n_ctx.div_ceil(PAGE).checked_mul(layout.page_bytes).is_none() {
            return Err(EngineError::Config(format!("KV cache of {n_ctx} positions overflows")));
        }
        let rec = StateLayout::new(layers).map(|l| CpuState::new(Arc::new(l), Arc::new(AtomicUsize::new(0))));
        let mut kv = CpuKv {
            layout: Arc::new(layout),
            n_ctx,
            pages: Vec::new(),
            live: Arc::new(AtomicUsize::new(0)),
            rec,
        };
        kv.reserve(n_ctx)?;
        Ok(kv)
    }

    /// An empty sequence of up to `n_ctx` positions in the same pool (same layout, pages
    /// shareable between them, one live-page count).
    pub fn sibling(&self, n_ctx: usize) -> CpuKv {
        CpuKv {
            layout: self.layout.clone(),
            n_ctx,
            pages: Vec::new(),
            live: self.live.clone(),
            rec: self
                .rec
                .as_ref()
                .map(|r| CpuState::new(r.layout.clone(), r.snaps.clone())),
        }
    }

    pub fn ty(&self) -> KvType {
        self.layout.ty
    }

    pub fn capacity(&self) -> usize {
        (self.pages.len() * PAGE).min(self.n_ctx)
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Live pages of the pool, plus its live state copies as the pages their bytes fill.
    pub fn live_pages(&self) -> usize {
        let snaps = self.rec.as_ref().map_or(0, |r| {
            r.snaps.load(Ordering::Relaxed) * r.layout.page_equivalents(self.layout.page_bytes)
        });
        self.live.load(Ordering::Relaxed) + snaps
    }

    pub fn page_bytes(&self) -> usize {
        self.layout.page_bytes
    }

    /// Private zeroed pages until `positions` fit (at most `n_ctx`); existing pages are kept.
    pub fn reserve(&mut self, positions: usize) -> Result<()> {
        let (bytes, live) = (self.layout.page_bytes, &self.live);
        kv::reserve_pages(&mut self.pages, self.n_ctx, positions, || {
            Ok(Arc::new(CpuPage::new(bytes, live)))
        })
    }

    /// Drop the pages past `positions` (shared pages stay alive for their other holders); a
    /// recurrent state past them is cut back first.
    pub fn release(&mut self, positions: usize) {
        if self.rec.as_ref().is_some_and(|r| r.seq.pos > positions) {
            self.restore(positions);
        }
        kv::release_pages(&mut self.pages, positions);
    }

    /// Whether another holder has the page at `block` too.
    pub fn page_shared(&self, block: usize) -> bool {
        kv::page_shared(&self.pages, block)
    }

    /// The page holding positions `block·PAGE ..`.
    pub fn page(&self, block: usize) -> Arc<CpuPage> {
        self.pages[block].clone()
    }

    /// Hold `page` (from a sequence of the same pool) at `block`; the pages before it must exist.
    pub fn map(&mut self, block: usize, page: &Arc<CpuPage>) -> Result<()> {
        if !Arc::ptr_eq(&page.live, &self.live) || page.data.len() != self.layout.page_bytes {
            return Err(EngineError::Backend("a KV page from another model's pool".into()));
        }
        kv::map_page(&mut self.pages, self.n_ctx, block, page)
    }

    /// The page at `block` held by this sequence alone: copied first (without its state copy)
    /// when someone else holds it too.
    fn own_page(&mut self, block: usize) -> &mut CpuPage {
        let p = &mut self.pages[block];
        if Arc::get_mut(p).is_none() {
            let mut fresh = CpuPage::new(p.data.len(), &self.live);
            fresh.data.copy_from_slice(&p.data);
            *p = Arc::new(fresh);
        }
        Arc::get_mut(p).expect("just made unique")
    }

    /// The page at `block` for writing: copied first when someone else holds it too.
    fn page_mut(&mut self, block: usize) -> &mut [u8] {
        &mut self.own_page(block).data
    }

    /// Write one position's K (`v = false`) or V row of `layer`.
    pub(crate) fn row_mut(&mut self, layer: usize, v: bool, pos: usize) -> &mut [u8] {
        let (kb, vb) = self.layout.row_bytes[layer];
        let (ko, vo) = self.layout.offsets[layer];
        let (rb, off) = if v { (vb, vo) } else { (kb, ko) };
        let at = off + (pos % PAGE) * rb;
        &mut self.page_mut(pos / PAGE)[at..at + rb]
    }

    /// One position's K row of `layer`.
    #[inline]
    pub(crate) fn k_row(&self, layer: usize, pos: usize) -> &[u8] {
        let kb = self.layout.row_bytes[layer].0;
        let at = self.layout.offsets[layer].0 + (pos % PAGE) * kb;
        &self.pages[pos / PAGE].data[at..at + kb]
    }

    /// One position's V row of `layer`.
    #[inline]
    pub(crate) fn v_row(&self, layer: usize, pos: usize) -> &[u8] {
        let vb = self.layout.row_bytes[layer].1;
        let at = self.layout.offsets[layer].1 + (pos % PAGE) * vb;
        &self.pages[pos / PAGE].data[at..at + vb]
    }

    /// Write whole pages' bytes (as [`CpuPage::bytes`] gives them) at positions `pos0 ..`, a
    /// multiple of [`PAGE`]; or one page followed by its recurrent-state copy ([`CpuPage::export`]).
    pub fn import(&mut self, pos0: usize, data: &[u8]) -> Result<()> {
        let pb = self.layout.page_bytes;
        if let Some(sb) = self.rec.as_ref().map(|r| r.layout.bytes()) {
            if data.len() == pb + sb {
                self.import(pos0, &data[..pb])?;
                let r = self.rec.as_ref().expect("checked");
                let mut snap = CpuSnap::new(&r.layout, &r.snaps);
                for (v, b) in snap.data.iter_mut().zip(data[pb..].chunks_exact(4)) {
                    *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
                snap.done = snap.layers;
                self.own_page(pos0 / PAGE).state = Some(Arc::new(snap));
                return Ok(());
            }
        }
        self.layout
            .check_import(pos0, data.len(), self.pages.len(), self.capacity())?;
        for (i, chunk) in data.chunks(pb).enumerate() {
            self.page_mut(pos0 / PAGE + i).copy_from_slice(chunk);
        }
        Ok(())
    }
}

impl CpuKv {
    /// The positions the recurrent state holds (`None` without recurrent layers).
    pub fn state_pos(&self) -> Option<usize> {
        self.rec.as_ref().map(|r| r.seq.pos)
    }

    /// Bytes of one recurrent-state copy.
    pub fn state_bytes(&self) -> usize {
        self.rec.as_ref().map_or(0, |r| r.layout.bytes())
    }

    /// Keep state copies at `positions` (see `Backend::kv_keep_states`).
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
        match src {
            Source::Current => {}
            Source::Checkpoint(i) => r.data.copy_from_slice(&r.seq.checkpoints[i].1.data),
            Source::Page(b) => r
                .data
                .copy_from_slice(&self.pages[b].state.as_ref().expect("a page with a copy").data),
            Source::Zero => r.data.fill(0.0),
        }
        r.seq.pos = p;
        r.seq.checkpoints.retain(|c| c.0 <= p);
        r.seq.want.retain(|&w| w > p);
        // Copies past the cut that only this sequence holds describe tokens it no longer has.
        for (b, page) in self.pages.iter_mut().enumerate() {
            if (b + 1) * PAGE > p {
                if let Some(pg) = Arc::get_mut(page) {
                    pg.state = None;
                }
            }
        }
        p
    }

    /// Write `vals` at `off` of the state copy kept at position `p` (made when missing: with its
    /// page at a page end, as a checkpoint elsewhere); `ends_layer`: the copy has one more layer.
    pub(crate) fn put_copy(&mut self, p: usize, off: usize, vals: &[f32], ends_layer: bool) {
        let (layout, snaps) = {
            let r = self.rec.as_ref().expect("a cache with recurrent layers");
            (r.layout.clone(), r.snaps.clone())
        };
        let make = || Arc::new(CpuSnap::new(&layout, &snaps));
        let slot: &mut Arc<CpuSnap> = if p.is_multiple_of(PAGE) {
            self.own_page(p / PAGE - 1).state.get_or_insert_with(make)
        } else {
            let r = self.rec.as_mut().expect("checked above");
            r.seq.checkpoint(p, make)
        };
        if Arc::get_mut(slot).is_none() {
            *slot = Arc::new(CpuSnap::new(&layout, &snaps));
        }
        let s = Arc::get_mut(slot).expect("just made unique");
        s.data[off..off + vals.len()].copy_from_slice(vals);
        if ends_layer {
            s.done += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers() -> Vec<KvLayer> {
        vec![
            KvLayer::own(64, 64, None),
            KvLayer {
                k_dim: 64,
                v_dim: 64,
                window: None,
                shares: Some(0),
                recurrent: None,
            },
            KvLayer::own(32, 32, Some(8)),
        ]
    }

    /// Pages are shared by reference: mapping one counts it once, a write to a shared page copies
    /// it (the other holder keeps its bytes), dropping the last holder frees it.
    #[test]
    fn pages_are_shared_copied_on_write_and_freed() {
        let mut a = CpuKv::new(&layers(), 200, KvType::F16).unwrap();
        assert_eq!((a.capacity(), a.live_pages()), (200, 4));
        // A layer that shares another's cache takes no bytes: (64 + 64 + 32 + 32) · 2 · 64.
        assert_eq!(a.page_bytes(), (64 + 64 + 32 + 32) * 2 * PAGE);
        a.row_mut(0, false, 70).fill(7);
        let mut b = a.sibling(200);
        b.reserve(PAGE).unwrap();
        assert_eq!(a.live_pages(), 5);
        // b maps a's block 1 in place of a fresh page: that page is freed, block 1 is shared.
        b.reserve(2 * PAGE).unwrap();
        assert_eq!(a.live_pages(), 6);
        b.map(1, &a.page(1)).unwrap();
        assert_eq!(a.live_pages(), 5);
        assert_eq!(b.k_row(0, 70), a.k_row(0, 70));
        assert!(b.k_row(0, 70).iter().all(|&x| x == 7));
        // Writing into the shared page copies it first; a's data stays.
        b.row_mut(0, false, 70).fill(9);
        assert_eq!(a.live_pages(), 6);
        assert!(a.k_row(0, 70).iter().all(|&x| x == 7));
        assert!(b.k_row(0, 70).iter().all(|&x| x == 9));
        // Whole pages' bytes round trip through import.
        let bytes = a.page(1).bytes().to_vec();
        b.import(PAGE, &bytes).unwrap();
        assert!(b.k_row(0, 70).iter().all(|&x| x == 7));
        assert!(b.import(3, &bytes).is_err(), "import off a page boundary");
        assert!(b.import(0, &bytes[1..]).is_err(), "import of a partial page");
        // A page from another pool is refused.
        let c = CpuKv::new(&layers(), 64, KvType::F16).unwrap();
        assert!(b.map(0, &c.page(0)).is_err());
        drop(c);
        b.release(0);
        assert_eq!(a.live_pages(), 4);
        a.release(PAGE + 1);
        assert_eq!((a.capacity(), a.live_pages()), (2 * PAGE, 2));
        assert!(a.reserve(201).is_err(), "past n_ctx");
    }
}
