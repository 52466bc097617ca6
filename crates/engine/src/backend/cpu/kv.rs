//! The CPU KV cache as pages of [`PAGE`] positions. A sequence is a list of pages; pages are
//! reference-counted, so the prefix cache and any number of sequences can hold the same page (a
//! cache hit maps pages, nothing is copied). A page is written only while one holder has it; a
//! write to a shared page first copies it (copy on write), so sharing never changes another
//! holder's data. All sequences made from one another ([`CpuKv::sibling`]) form a pool whose live
//! page count is what the KV budget is spent on.
//!
//! Page layout: for each layer, `PAGE` K rows then `PAGE` V rows (a layer without its own cache
//! takes no bytes), which is also the layout of a block written to disk by the prefix cache.

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
}

impl CpuPage {
    fn new(bytes: usize, live: &Arc<AtomicUsize>) -> CpuPage {
        live.fetch_add(1, Ordering::Relaxed);
        CpuPage {
            // Zeroed by the allocator (pages mapped lazily by the OS), never read before written.
            data: vec![0u8; bytes].into_boxed_slice(),
            live: live.clone(),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for CpuPage {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

pub struct CpuKv {
    pub(crate) layout: Arc<Layout>,
    /// Most positions.
    n_ctx: usize,
    pages: Vec<Arc<CpuPage>>,
    /// Pages alive in this sequence's pool.
    live: Arc<AtomicUsize>,
}

impl CpuKv {
    pub(crate) fn new(layers: &[KvLayer], n_ctx: usize, ty: KvType) -> Result<CpuKv> {
        let layout = Layout::new(layers, ty)?;
        if n_ctx.div_ceil(PAGE).checked_mul(layout.page_bytes).is_none() {
            return Err(EngineError::Config(format!("KV cache of {n_ctx} positions overflows")));
        }
        let mut kv = CpuKv {
            layout: Arc::new(layout),
            n_ctx,
            pages: Vec::new(),
            live: Arc::new(AtomicUsize::new(0)),
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

    pub fn live_pages(&self) -> usize {
        self.live.load(Ordering::Relaxed)
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

    /// Drop the pages past `positions` (shared pages stay alive for their other holders).
    pub fn release(&mut self, positions: usize) {
        kv::release_pages(&mut self.pages, positions);
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

    /// The page at `block` for writing: copied first when someone else holds it too.
    fn page_mut(&mut self, block: usize) -> &mut [u8] {
        let p = &mut self.pages[block];
        if Arc::get_mut(p).is_none() {
            let mut fresh = CpuPage::new(p.data.len(), &self.live);
            fresh.data.copy_from_slice(&p.data);
            *p = Arc::new(fresh);
        }
        &mut Arc::get_mut(p).expect("just made unique").data
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
    /// multiple of [`PAGE`].
    pub fn import(&mut self, pos0: usize, data: &[u8]) -> Result<()> {
        let pb = self.layout.page_bytes;
        self.layout
            .check_import(pos0, data.len(), self.pages.len(), self.capacity())?;
        for (i, chunk) in data.chunks(pb).enumerate() {
            self.page_mut(pos0 / PAGE + i).copy_from_slice(chunk);
        }
        Ok(())
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
