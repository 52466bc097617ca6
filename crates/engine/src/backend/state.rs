//! The recurrent state of hybrid models (Qwen 3.5's Gated DeltaNet layers) per sequence, and what
//! every backend shares about it: where each layer's state lies, which position the state holds,
//! which positions to keep copies at, and which copy a cut-back restores.
//!
//! Why the state lives in the sequence's `Kv`: the `Kv` already is "one sequence's state" at the
//! model seam — every forward step gets it, serve reserves, shares and persists it, and the model
//! describes its layout with one per-layer list ([`KvLayer`]). A linear-attention layer is one more
//! kind of entry in that list (`KvLayer::recurrent`), so a hybrid model needs no second object per
//! sequence, no second pool and no second budget, and callers that never name a family (generate,
//! bench, perplexity, serve) handle hybrid sequences unchanged.
//!
//! Positions: the state holds a sequence's first `pos` tokens; a step must start at `pos` (or at 0,
//! which starts afresh). Unlike K/V rows, a state cannot be cut back by length: going back needs a
//! copy taken at that position. Copies (snapshots: every recurrent layer's conv and delta state)
//! are taken where the caller asked ([`SeqState::keep`]) as the state passes them:
//! - at a page end (a multiple of [`PAGE`]) the copy stays with that page, so the prefix cache and
//!   `--kv-persist` keep it with the block: a cached prefix restores both the attention rows and the
//!   state. A page's copy is set or cleared only while one holder has the page (shared pages never
//!   change, as their rows never do); a page's rows and its copy come from the same tokens;
//! - elsewhere it is one of the sequence's last [`MAX_CHECKPOINTS`] checkpoints (rollback of
//!   drafted tokens).
//!
//! Copies count against the pool's budget: each as many pages as its bytes fill
//! ([`StateLayout::page_equivalents`]).

use crate::model::{KvLayer, RecurrentLayer, PAGE};
use std::collections::VecDeque;

/// Checkpoints (copies off page ends) a sequence keeps; older ones are dropped.
pub const MAX_CHECKPOINTS: usize = 16;

/// Where one recurrent layer's state lies in a sequence's state (f32 offsets).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    pub conv: usize,
    pub ssm: usize,
    pub shape: RecurrentLayer,
}

/// The recurrent layers of a cache and where their states lie: per layer its conv state then its
/// delta state, layer after layer (also the byte layout of a snapshot on disk, f32 little-endian).
#[derive(Clone, Debug)]
pub(crate) struct StateLayout {
    /// Per cache layer: its slot, or `None` for an attention layer.
    pub slots: Vec<Option<Slot>>,
    /// f32 values of a whole state.
    pub total: usize,
    /// How many layers are recurrent.
    pub n_recurrent: usize,
}

impl StateLayout {
    /// The layout of these layers' states; `None` when no layer is recurrent.
    pub fn new(layers: &[KvLayer]) -> Option<StateLayout> {
        let mut total = 0;
        let mut n_recurrent = 0;
        let slots = layers
            .iter()
            .map(|l| {
                l.recurrent.map(|r| {
                    let s = Slot {
                        conv: total,
                        ssm: total + r.conv_len(),
                        shape: r,
                    };
                    total += r.conv_len() + r.ssm_len();
                    n_recurrent += 1;
                    s
                })
            })
            .collect();
        (n_recurrent > 0).then_some(StateLayout {
            slots,
            total,
            n_recurrent,
        })
    }

    pub fn bytes(&self) -> usize {
        4 * self.total
    }

    /// The slot of cache layer `layer`, which must be recurrent.
    pub fn slot(&self, layer: usize) -> Slot {
        self.slots
            .get(layer)
            .copied()
            .flatten()
            .unwrap_or_else(|| panic!("cache layer {layer} has no recurrent state"))
    }

    /// Whether `layer` is the last recurrent layer (whose op ends a step's state update).
    pub fn is_last(&self, layer: usize) -> bool {
        self.slots.iter().rposition(|s| s.is_some()) == Some(layer)
    }

    /// How many KV pages of `page_bytes` one snapshot costs in the budget (at least one).
    pub fn page_equivalents(&self, page_bytes: usize) -> usize {
        self.bytes().div_ceil(page_bytes.max(1)).max(1)
    }
}

/// A sequence's position and saved copies; `S` is how a backend holds a copy.
pub(crate) struct SeqState<S> {
    /// The state holds the sequence's first `pos` tokens.
    pub pos: usize,
    /// Positions past `pos` to keep a copy at, ascending.
    pub want: Vec<usize>,
    /// Copies off page ends, oldest first.
    pub checkpoints: VecDeque<(usize, S)>,
}

impl<S> Default for SeqState<S> {
    fn default() -> Self {
        SeqState {
            pos: 0,
            want: Vec::new(),
            checkpoints: VecDeque::new(),
        }
    }
}

impl<S> SeqState<S> {
    /// Keep copies at `positions` (those past the state's position) when the state passes them.
    pub fn keep(&mut self, positions: &[usize]) {
        self.want.extend(positions.iter().copied().filter(|&p| p > self.pos));
        self.want.sort_unstable();
        self.want.dedup();
    }

    /// The wanted positions a step of `rows` rows from `pos0` passes: in `(pos0, pos0 + rows]`.
    pub fn wanted_in(&self, pos0: usize, rows: usize) -> Vec<usize> {
        self.want
            .iter()
            .copied()
            .filter(|&p| p > pos0 && p <= pos0 + rows)
            .collect()
    }

    /// After a step: the state holds `end` positions; the copies up to it are taken.
    pub fn advance(&mut self, end: usize) {
        self.pos = end;
        self.want.retain(|&p| p > end);
    }

    /// The checkpoint at `p`, made by `make` when there is none (the oldest dropped past the limit).
    pub fn checkpoint(&mut self, p: usize, make: impl FnOnce() -> S) -> &mut S {
        if let Some(i) = self.checkpoints.iter().position(|c| c.0 == p) {
            return &mut self.checkpoints[i].1;
        }
        if self.checkpoints.len() >= MAX_CHECKPOINTS {
            self.checkpoints.pop_front();
        }
        self.checkpoints.push_back((p, make()));
        &mut self.checkpoints.back_mut().expect("just pushed").1
    }
}

/// The copy a cut-back to at most some position takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The state as it is (it holds no more than the target).
    Current,
    /// The checkpoint at this index.
    Checkpoint(usize),
    /// The copy kept with this page (block).
    Page(usize),
    /// Nothing usable: start from an empty state.
    Zero,
}

/// The latest point at or before `target` the state can go back to, and its source: the current
/// state, a (complete) checkpoint or the (complete) copy of a page whose end is at or before it.
/// `pages_with_copies` lists the blocks holding a complete copy.
pub(crate) fn restore_source(
    target: usize,
    pos: usize,
    checkpoints: impl Iterator<Item = (usize, bool)>,
    pages_with_copies: impl Iterator<Item = usize>,
) -> (usize, Source) {
    let mut best = (0, Source::Zero);
    if pos <= target {
        best = (pos, Source::Current);
    }
    for (i, (p, complete)) in checkpoints.enumerate() {
        if complete && p <= target && p > best.0 {
            best = (p, Source::Checkpoint(i));
        }
    }
    for b in pages_with_copies {
        let p = (b + 1) * PAGE;
        if p <= target && p > best.0 {
            best = (p, Source::Page(b));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_takes_the_latest_copy_at_or_before_the_target() {
        // Current state at 300: a target past it keeps it.
        assert_eq!(
            restore_source(310, 300, [].into_iter(), [0, 3].into_iter()),
            (300, Source::Current)
        );
        // Behind it: the latest complete copy, page or checkpoint.
        assert_eq!(
            restore_source(250, 300, [(200, true), (240, false)].into_iter(), [0, 2].into_iter()),
            (200, Source::Checkpoint(0))
        );
        assert_eq!(
            restore_source(250, 300, [(100, true)].into_iter(), [0, 2].into_iter()),
            (192, Source::Page(2))
        );
        assert_eq!(
            restore_source(50, 300, [].into_iter(), [0].into_iter()),
            (0, Source::Zero)
        );
    }

    #[test]
    fn layout_and_wanted_positions() {
        let r = RecurrentLayer {
            conv_rows: 3,
            conv_dim: 8,
            heads: 2,
            head_k: 4,
            head_v: 4,
        };
        let layers = [KvLayer::recurrent(r), KvLayer::own(64, 64, None), KvLayer::recurrent(r)];
        let l = StateLayout::new(&layers).unwrap();
        assert_eq!((l.total, l.n_recurrent), (2 * (24 + 32), 2));
        assert_eq!((l.slot(2).conv, l.slot(2).ssm), (56, 80));
        assert!(l.is_last(2) && !l.is_last(0));
        assert!(StateLayout::new(&[KvLayer::own(8, 8, None)]).is_none());
        let mut s = SeqState::<()>::default();
        s.keep(&[128, 64, 0, 64]);
        assert_eq!(s.want, vec![64, 128]);
        assert_eq!(s.wanted_in(60, 10), vec![64]);
        assert_eq!(s.wanted_in(64, 10), Vec::<usize>::new());
        s.advance(100);
        assert_eq!((s.pos, s.want.clone()), (100, vec![128]));
        for p in 0..MAX_CHECKPOINTS + 2 {
            s.checkpoint(p, || ());
        }
        assert_eq!(s.checkpoints.front().unwrap().0, 2);
    }
}
