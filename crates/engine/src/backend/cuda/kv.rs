//! The KV cache in GPU memory, in pages of [`PAGE`] positions with the CPU's page layout
//! (`cpu::kv::Layout`), so that pages persisted by one backend import into the other. Pages come
//! from a pool of device slabs; a page is reference-counted (prefix cache and sequences share it)
//! and copied before a write when shared, as on the CPU. Dropping the last holder returns the page
//! to its pool's free list.

use super::Dev;
use crate::backend::kv::{self, Layout};
use crate::backend::KvType;
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
        }))
    }
}

/// One page of K/V rows in device memory.
pub struct GpuPage {
    pub(super) ptr: u64,
    pool: Arc<Pool>,
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
        let mut kv = CudaKv {
            layout: Arc::new(layout),
            n_ctx,
            pages: Vec::new(),
            pool,
        };
        kv.reserve(n_ctx)?;
        Ok(kv)
    }

    pub fn sibling(&self, n_ctx: usize) -> CudaKv {
        CudaKv {
            layout: self.layout.clone(),
            n_ctx,
            pages: Vec::new(),
            pool: self.pool.clone(),
        }
    }

    pub fn ty(&self) -> KvType {
        self.layout.ty
    }

    pub fn capacity(&self) -> usize {
        (self.pages.len() * PAGE).min(self.n_ctx)
    }

    pub fn live_pages(&self) -> usize {
        self.pool.live.load(Ordering::Relaxed)
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

    pub fn release(&mut self, positions: usize) {
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

/// A page's bytes, read from the device.
pub fn page_data(page: &GpuPage) -> Vec<u8> {
    page.pool.dev.read_bytes(page.ptr, page.pool.page_bytes)
}
