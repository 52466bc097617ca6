//! What every backend's KV cache shares: the page layout (so pages persisted by one backend import
//! into another) and the bookkeeping of a sequence's page list (pages reserved up to `n_ctx`,
//! released from the end, shared pages mapped in).

use crate::backend::KvType;
use crate::model::{KvLayer, PAGE};
use crate::{EngineError, Result};
use std::sync::Arc;

/// Where each layer's rows live in a page.
pub(crate) struct Layout {
    pub ty: KvType,
    /// Per layer: (K values, V values) per position.
    pub dims: Vec<(usize, usize)>,
    /// Per layer: (K bytes, V bytes) per position.
    pub row_bytes: Vec<(usize, usize)>,
    /// Per layer: offsets of the K and V blocks in a page.
    pub offsets: Vec<(usize, usize)>,
    pub page_bytes: usize,
}

impl Layout {
    /// The page layout of a cache of these layers (shared by every backend, so pages written by
    /// one can be imported by another).
    pub(crate) fn new(layers: &[KvLayer], ty: KvType) -> Result<Layout> {
        let bytes_of = |dim: usize| -> Result<usize> {
            match ty {
                KvType::F16 => Ok(2 * dim),
                KvType::Q8_0 => {
                    if !dim.is_multiple_of(32) {
                        return Err(EngineError::Config(format!(
                            "a Q8_0 KV cache needs rows of 32k values, not {dim}"
                        )));
                    }
                    Ok(dim / 32 * 34)
                }
            }
        };
        let mut dims = Vec::with_capacity(layers.len());
        let mut row_bytes = Vec::with_capacity(layers.len());
        let mut offsets = Vec::with_capacity(layers.len());
        let mut off = 0usize;
        for l in layers {
            let (kd, vd) = if l.shares.is_some() { (0, 0) } else { (l.k_dim, l.v_dim) };
            let (kb, vb) = (bytes_of(kd)?, bytes_of(vd)?);
            dims.push((kd, vd));
            row_bytes.push((kb, vb));
            offsets.push((off, off + PAGE * kb));
            off += PAGE * (kb + vb);
        }
        Ok(Layout {
            ty,
            dims,
            row_bytes,
            offsets,
            page_bytes: off,
        })
    }
}

impl Layout {
    /// Whether `len` bytes imported at position `pos0` are whole pages at a page boundary, within
    /// `pages` allocated pages (`capacity` positions).
    pub(crate) fn check_import(&self, pos0: usize, len: usize, pages: usize, capacity: usize) -> Result<()> {
        let pb = self.page_bytes;
        if pb == 0 || !len.is_multiple_of(pb) || !pos0.is_multiple_of(PAGE) {
            return Err(EngineError::Input(format!(
                "KV data of {len} bytes at position {pos0} is not whole pages of {pb} bytes"
            )));
        }
        if pos0 / PAGE + len / pb > pages {
            return Err(EngineError::ContextFull {
                need: pos0 + len / pb * PAGE,
                n_ctx: capacity,
            });
        }
        Ok(())
    }
}

/// Fresh pages (from `fresh`) until `positions` fit; at most `n_ctx`.
pub(crate) fn reserve_pages<P>(
    pages: &mut Vec<Arc<P>>,
    n_ctx: usize,
    positions: usize,
    mut fresh: impl FnMut() -> Result<Arc<P>>,
) -> Result<()> {
    if positions > n_ctx {
        return Err(EngineError::ContextFull { need: positions, n_ctx });
    }
    while pages.len() * PAGE < positions {
        pages.push(fresh()?);
    }
    Ok(())
}

/// Drop the pages past `positions` (shared pages stay alive for their other holders).
pub(crate) fn release_pages<P>(pages: &mut Vec<Arc<P>>, positions: usize) {
    pages.truncate(positions.div_ceil(PAGE));
    pages.shrink_to_fit();
}

/// Whether the page at `block` has another holder too (a write into it would copy it first).
pub(crate) fn page_shared<P>(pages: &[Arc<P>], block: usize) -> bool {
    pages.get(block).is_some_and(|p| Arc::strong_count(p) > 1)
}

/// Hold `page` at `block` (the pages before it must exist; the caller checks the pool).
pub(crate) fn map_page<P>(pages: &mut Vec<Arc<P>>, n_ctx: usize, block: usize, page: &Arc<P>) -> Result<()> {
    if block > pages.len() || (block + 1) * PAGE > n_ctx.next_multiple_of(PAGE) {
        return Err(EngineError::ContextFull {
            need: (block + 1) * PAGE,
            n_ctx,
        });
    }
    if block == pages.len() {
        pages.push(page.clone());
    } else {
        pages[block] = page.clone();
    }
    Ok(())
}
