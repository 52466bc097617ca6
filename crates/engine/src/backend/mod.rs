//! The seam between model graphs and the hardware. A graph (see `crate::model`) is written once
//! against [`Backend`]: it never names a quant type or a device. Weights, activations and KV caches
//! are backend-owned values (`Weight`, `Buf`, `Kv`); a whole forward step runs on them without
//! host round trips, and only [`Backend::read`] copies results (logits, embeddings) to the host.

pub mod cpu;
pub mod cuda;
pub(crate) mod kv;
pub mod select;
pub(crate) mod state;
#[cfg(test)]
pub mod tests;

use crate::model::blocks::Glu;
use gguf::GgmlType;
use rayon::prelude::*;

/// Where a weight tensor's bytes come from (a GGUF tensor, usually memory-mapped).
pub struct WeightSource<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    /// ggml order: row length first.
    pub shape: &'a [u64],
    pub data: &'a [u8],
    /// The tensor is only ever the weight operand of `matmul` (never looked up by row), so the
    /// backend may keep it in a layout of its own.
    pub matmul_only: bool,
    /// Keeps `data` alive for as long as the backend references it.
    pub owner: std::sync::Arc<gguf::GgufModel>,
}

/// Rotary position embedding parameters (ggml_rope_ext's arguments).
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    /// Rotated dimensions per head (the rest pass through).
    pub n_dims: usize,
    /// NeoX style rotates (i, i + n_dims/2); normal style rotates adjacent pairs.
    pub neox: bool,
    pub freq_base: f32,
    pub freq_scale: f32,
    /// YaRN extrapolation mix (0 = off).
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub n_ctx_orig: usize,
    /// Per-pair frequency divisors (`rope_freqs.weight`, Llama-3 scaling).
    pub freq_factors: Option<Vec<f32>>,
}

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F16,
    Q8_0,
}

impl AttnArgs {
    pub fn new(s: &StepSeq, l: &AttnLayer) -> AttnArgs {
        AttnArgs {
            layer: l.layer,
            row0: s.row0,
            rows: s.rows,
            pos0: s.pos0,
            n_head: l.n_head,
            n_kv_head: l.n_kv_head,
            head_dim: l.head_dim,
            scale: l.scale,
            window: l.window,
            causal: l.causal,
        }
    }
}

impl KvType {
    pub fn parse(s: &str) -> Option<KvType> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Some(KvType::F16),
            "q8_0" => Some(KvType::Q8_0),
            _ => None,
        }
    }
}

/// A token id a step takes from the device instead of the host: `FED | k` is row `k` of the last
/// [`Backend::argmax_rows_defer`] (greedy decoding's next token, fed to the step after without a
/// trip through the host; only where [`Backend::feeds_tokens`]).
pub const FED: u32 = 0x8000_0000;

/// What a sampler with a top-k cut asks of one logits row instead of the whole row
/// (`Backend::top_of_rows`, `sampler::Sampler::needs`): its `n` largest values and its values at
/// the columns `at`.
#[derive(Clone, Debug, PartialEq)]
pub struct TopAsk {
    pub row: usize,
    pub n: usize,
    pub at: Vec<u32>,
}

/// The answer to a [`TopAsk`]: (column, value) of the row's `n` largest values, the largest first,
/// ties to the lower column, NaN left out (`sampler::top_of`), its values at `at` (0 past the
/// row) and its length.
#[derive(Clone, Debug, PartialEq)]
pub struct Top {
    pub top: Vec<(u32, f32)>,
    pub at: Vec<f32>,
    pub cols: usize,
}

/// The asked rows read to the host: the span from the first to the last at once where it holds
/// few others (row r at chunk r − lo), else row by row (ask i's row at chunk i).
struct HostRows {
    data: Vec<f32>,
    cols: usize,
    lo: Option<usize>,
}

impl HostRows {
    fn read<B: Backend + ?Sized>(b: &B, x: &B::Buf, rows: &[usize]) -> HostRows {
        let cols = b.shape(x).1;
        let (lo, hi) = rows.iter().fold((usize::MAX, 0), |(l, h), &r| (l.min(r), h.max(r + 1)));
        if rows.len() > 1 && hi - lo <= 2 * rows.len() {
            HostRows {
                data: b.read_rows(x, lo, hi - lo),
                cols,
                lo: Some(lo),
            }
        } else {
            HostRows {
                data: rows.iter().flat_map(|&r| b.read_rows(x, r, 1)).collect(),
                cols,
                lo: None,
            }
        }
    }

    /// The chunk that holds ask `i`'s row `row`.
    fn chunk(&self, i: usize, row: usize) -> usize {
        self.lo.map_or(i, |lo| row - lo)
    }
}

/// `Backend::top_of_rows` on the host: the asked rows read ([`HostRows`]), each one's top found
/// there, the rows in parallel.
pub fn top_of_rows_on_host<B: Backend + ?Sized>(b: &B, x: &B::Buf, asks: &[TopAsk]) -> Vec<Top> {
    let rows: Vec<usize> = asks.iter().map(|a| a.row).collect();
    let h = HostRows::read(b, x, &rows);
    asks.par_iter()
        .enumerate()
        .map(|(i, a)| {
            let c = h.chunk(i, a.row);
            let row = &h.data[c * h.cols..(c + 1) * h.cols];
            Top {
                top: crate::sampler::top_of(row, a.n),
                at: a
                    .at
                    .iter()
                    .map(|&c| row.get(c as usize).copied().unwrap_or(0.0))
                    .collect(),
                cols: row.len(),
            }
        })
        .collect()
}

pub use crate::sampler::masses::SampleAsk;

/// `Backend::sample_rows` on the host: the asked rows (distinct) read ([`HostRows`]) and drawn
/// from where they were read, the rows in parallel (each draw depends on its row and ask alone).
pub fn sample_rows_on_host<B: Backend + ?Sized>(b: &B, x: &B::Buf, asks: &[SampleAsk]) -> Vec<u32> {
    let rows: Vec<usize> = asks.iter().map(|a| a.row).collect();
    let mut h = HostRows::read(b, x, &rows);
    let cols = h.cols.max(1);
    let mut owner = vec![None; h.data.len() / cols];
    for (i, a) in asks.iter().enumerate() {
        debug_assert!(
            owner[h.chunk(i, a.row)].is_none(),
            "sample_rows: row {} asked twice",
            a.row
        );
        owner[h.chunk(i, a.row)] = Some(i);
    }
    let drawn: Vec<(usize, u32)> = h
        .data
        .par_chunks_mut(cols)
        .zip(owner)
        .filter_map(|(row, o)| o.map(|i| (i, crate::sampler::masses::sample_row(row, &asks[i]))))
        .collect();
    let mut out = vec![0; asks.len()];
    for (i, t) in drawn {
        out[i] = t;
    }
    out
}

/// Greedy tokens computed on the device and not yet read ([`Backend::argmax_rows_defer`]): the
/// host reads them with [`Backend::deferred_ids`], after it has enqueued the step that takes them.
#[derive(Debug)]
pub struct Deferred {
    /// The ids, where the backend had them at once.
    pub ids: Option<Vec<u32>>,
    /// The backend's own handle otherwise (which host buffer and event).
    pub slot: usize,
    pub rows: usize,
}

impl Deferred {
    pub fn ready(ids: Vec<u32>) -> Deferred {
        Deferred {
            rows: ids.len(),
            ids: Some(ids),
            slot: 0,
        }
    }
}

/// One sequence's rows of a forward step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepSeq {
    /// First row of the sequence in the step and how many rows it has.
    pub row0: usize,
    pub rows: usize,
    /// Position of the first row; rows are consecutive positions.
    pub pos0: usize,
    /// Each row is computed as a one-row step at its position would compute it (the rows that
    /// check drafted tokens: speculative decoding's output must equal decoding's), not as a
    /// prompt chunk.
    pub alone: bool,
}

/// What every layer of a forward step reads besides activations: the token ids, their positions
/// and where each sequence's rows are. Made once per step and handed to the backend once
/// ([`Backend::begin_step`]), which keeps it where its kernels read it (host memory on the CPU,
/// device buffers on a GPU) for the ops that take the step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepPlan {
    pub ids: Vec<u32>,
    pub positions: Vec<usize>,
    pub seqs: Vec<StepSeq>,
}

impl StepPlan {
    /// Rows per sequence, in order (`set_runs`); a sequence whose rows stand alone is a run of
    /// one row per row.
    pub fn row_runs(&self) -> Vec<usize> {
        let mut runs = Vec::with_capacity(self.seqs.len());
        for s in &self.seqs {
            if s.alone {
                runs.extend(std::iter::repeat_n(1, s.rows));
            } else {
                runs.push(s.rows);
            }
        }
        runs
    }
}

/// A layer's per-head RMS norms of its queries and keys (Qwen 3, Qwen 3.5's attention layers),
/// applied before their rotation (`Backend::rope_store_kv`).
pub struct QkNorm<'a, W> {
    pub q: &'a W,
    pub k: &'a W,
    pub eps: f32,
}
// (By hand: derived, they would ask W to be Copy.)
impl<W> Clone for QkNorm<'_, W> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<W> Copy for QkNorm<'_, W> {}

impl<W> QkNorm<'_, W> {
    /// The two norms as separate `head_rms_norm` calls (what a fused backend equals).
    pub fn apply<B: Backend<Weight = W> + ?Sized>(&self, b: &B, q: &mut B::Buf, k: &mut B::Buf, head_dim: usize) {
        b.head_rms_norm(q, Some(self.q), head_dim, self.eps);
        b.head_rms_norm(k, Some(self.k), head_dim, self.eps);
    }
}

/// One layer's attention: which cache layer it reads and its shape.
#[derive(Clone, Copy, Debug)]
pub struct AttnLayer {
    pub layer: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Sliding window: a query at position p sees keys in (p - window, p].
    pub window: Option<usize>,
    /// Non-causal (encoder) attention over each sequence's own rows.
    pub causal: bool,
}

/// Attention over one sequence's cache for a run of query rows (a step's sequence and a layer).
#[derive(Clone, Copy, Debug)]
pub struct AttnArgs {
    pub layer: usize,
    /// First query row of this sequence in the batch and how many rows it has.
    pub row0: usize,
    pub rows: usize,
    /// Position of the first query row; rows are consecutive positions.
    pub pos0: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Sliding window: a query at position p sees keys in (p - window, p].
    pub window: Option<usize>,
    /// Non-causal (encoder) attention over `pos0 + rows` keys.
    pub causal: bool,
}

/// One linear-attention (Gated DeltaNet) layer of a hybrid model, as [`Backend::ssm_conv`] and
/// [`Backend::gated_delta_net`] take it (llama.cpp `src/models/qwen35.cpp`, transformers
/// `modeling_qwen3_5.py`).
#[derive(Clone, Copy, Debug)]
pub struct DeltaNetLayer {
    /// The cache layer whose recurrent state the ops read and update.
    pub layer: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub head_k: usize,
    pub head_v: usize,
    /// Width of the causal convolution (its state keeps the last `kernel - 1` inputs).
    pub kernel: usize,
    /// Added to ‖q‖² and ‖k‖² by their L2 norms (transformers' `l2norm`: 1e-6).
    pub eps: f32,
}

impl DeltaNetLayer {
    /// Channels of the convolution: q and k (`n_k_heads` heads each), then v.
    pub fn conv_dim(&self) -> usize {
        2 * self.n_k_heads * self.head_k + self.n_v_heads * self.head_v
    }
}

/// An RMS norm's weight and epsilon, for the products that may compute the norm themselves
/// (`Backend::norm_glu`).
pub struct Norm<'a, W> {
    pub w: &'a W,
    pub eps: f32,
}

// (Not derived: that would ask W itself to be Copy.)
impl<W> Clone for Norm<'_, W> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<W> Copy for Norm<'_, W> {}

/// The op set every backend provides. Buffers are row-major matrices of f32 with a logical shape
/// (rows, cols) that ops set on their outputs; capacity is fixed at allocation.
pub trait Backend: Send + Sync + 'static {
    type Weight: Send + Sync;
    type Buf: Send + Sync;
    type Kv: Send + Sync;
    /// A page of a KV pool, shared by reference counting.
    type Page: Send + Sync + Clone;
    /// A step's [`StepPlan`] as the backend keeps it.
    type Step: Send + Sync;

    fn name(&self) -> String;
    /// Host worker threads (what `llama-bench` reports as `n_threads`).
    fn threads(&self) -> usize;
    /// The prompt tokens a server prefills per step by default: on the CPU a step's time grows
    /// with its tokens, so short chunks keep the other streams' decoding going; a GPU takes long
    /// chunks at little more per token (its matrix products fill up), and fewer steps shorten
    /// the time to first token of many concurrent prompts.
    fn prefill_chunk(&self) -> usize {
        256
    }
    /// Whether `--spec auto` drafts tokens on this backend (speculative decoding measured to pay
    /// here: on the CPU a check of 9 rows costs ~3.4 steps and copying tasks run 2.3× faster,
    /// ordinary chat 1.4-1.6×; bench/runs/2026-12-03-xeon-2c/spec).
    fn spec_by_default(&self) -> bool {
        true
    }
    /// Run `f` (a forward step) on this backend's workers.
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R;

    /// Before a model's weights load: whether `bytes` of them fit (a GPU checks its free memory,
    /// so a model that does not fit is refused before anything is allocated). `what` names the
    /// model in the error.
    fn reserve_weights(&self, bytes: u64, what: &str) -> crate::Result<()> {
        let _ = (bytes, what);
        Ok(())
    }
    fn load_weight(&self, src: WeightSource<'_>) -> crate::Result<Self::Weight>;
    fn weight_type(&self, w: &Self::Weight) -> GgmlType;
    /// ggml order: row length first.
    fn weight_shape<'a>(&self, w: &'a Self::Weight) -> &'a [u64];

    fn alloc(&self, rows: usize, cols: usize) -> Self::Buf;
    fn shape(&self, b: &Self::Buf) -> (usize, usize);
    /// A cache of up to `n_ctx` positions laid out per layer (a layer that shares another's cache
    /// stores nothing), in a pool of its own, with all its positions allocated.
    fn alloc_kv(&self, layers: &[crate::model::KvLayer], n_ctx: usize, ty: KvType) -> crate::Result<Self::Kv>;
    /// An empty cache of up to `n_ctx` positions in the pool of `kv` (pages can be shared between
    /// the sequences of a pool, and their live pages are counted together).
    fn kv_sibling(&self, kv: &Self::Kv, n_ctx: usize) -> Self::Kv;
    /// Positions the cache can hold now (allocated); at most its `n_ctx`.
    fn kv_capacity(&self, kv: &Self::Kv) -> usize;
    /// Grow the allocation to hold at least `positions` (up to `n_ctx`); existing rows are kept.
    fn kv_reserve(&self, kv: &mut Self::Kv, positions: usize) -> crate::Result<()>;
    /// Shrink the allocation to the pages holding `positions` (pages shared with other holders stay
    /// alive for them).
    fn kv_release(&self, kv: &mut Self::Kv, positions: usize);
    /// Whether the sequence's page at `block` is held by another sequence or the prefix cache too,
    /// so a write into it would first copy it into a new page (false past the allocation).
    fn kv_page_shared(&self, kv: &Self::Kv, block: usize) -> bool;
    /// Bytes of one page ([`crate::model::PAGE`] positions, all layers, K and V).
    fn kv_page_bytes(&self, kv: &Self::Kv) -> usize;
    /// Pages alive in the pool of `kv` (each counted once however many hold it), plus its live
    /// recurrent-state copies, each counted as the pages its bytes fill.
    fn kv_live_pages(&self, kv: &Self::Kv) -> usize;
    /// The page holding block `block` of the cache (shared, not copied).
    fn kv_page(&self, kv: &Self::Kv, block: usize) -> Self::Page;
    /// Hold `page` (from the same pool) as block `block`; blocks before it must be allocated.
    /// A later write into a shared page copies it first.
    fn kv_map(&self, kv: &mut Self::Kv, block: usize, page: &Self::Page) -> crate::Result<()>;
    /// A page's bytes (for `--kv-persist`), followed by its recurrent-state copy when it holds one
    /// (`kv_state_bytes` more).
    fn page_data(&self, page: &Self::Page) -> Vec<u8>;
    /// Write whole pages' bytes (as [`Backend::page_data`] gives them, from a cache of the same
    /// model and type) at positions `pos0 ..` (a page boundary); the capacity must hold them. One
    /// page followed by a recurrent-state copy keeps the copy with the page.
    fn kv_import(&self, kv: &mut Self::Kv, pos0: usize, data: &[u8]) -> crate::Result<()>;
    /// The positions the sequence's recurrent state holds (`None`: its model has no recurrent
    /// layers). A step must start there, or at 0 (which starts from an empty state).
    fn kv_state_pos(&self, kv: &Self::Kv) -> Option<usize>;
    /// Cut the sequence back to at most `positions` and return where it now ends: the recurrent
    /// state goes back to the latest point at or before `positions` that it can (itself, a
    /// checkpoint, the copy kept with one of its pages, or empty at 0), and copies past that point
    /// that only this sequence holds are dropped. K/V rows need no cut (they are overwritten). A
    /// cache without recurrent layers returns `positions`.
    fn kv_restore(&self, kv: &mut Self::Kv, positions: usize) -> usize;
    /// Keep copies of the recurrent state at these positions when the sequence's next steps pass
    /// them: at a page end (a multiple of [`crate::model::PAGE`]) with that page (so the prefix
    /// cache and `--kv-persist` keep it), elsewhere as a checkpoint for [`Backend::kv_restore`]
    /// (the last [`state::MAX_CHECKPOINTS`]). Copies count in `kv_live_pages`. No-op without
    /// recurrent layers.
    fn kv_keep_states(&self, kv: &mut Self::Kv, positions: &[usize]);
    /// Bytes of one recurrent-state copy (0 without recurrent layers).
    fn kv_state_bytes(&self, kv: &Self::Kv) -> usize;
    /// Drop the recurrent-state copies only this sequence holds (its checkpoints, its unshared
    /// pages' copies) to give their memory back; the state itself stays.
    fn kv_drop_copies(&self, kv: &mut Self::Kv);

    /// Take the step's ids, positions and sequence layout, once per step; `kvs` are the caches of
    /// its sequences, in order (a backend may upload their page tables here), or none for a
    /// step without caches (encoders).
    fn begin_step(&self, plan: StepPlan, kvs: &[&Self::Kv]) -> crate::Result<Self::Step>;
    /// Rows of an embedding table for the step's ids; the output's runs are the step's sequences.
    fn embed(&self, table: &Self::Weight, step: &Self::Step, out: &mut Self::Buf) -> crate::Result<()>;
    /// Rows of an embedding table (any weight type), one per id.
    fn get_rows(&self, table: &Self::Weight, ids: &[u32], out: &mut Self::Buf) -> crate::Result<()>;
    /// Column slices: `outs[i].1 = x[:, outs[i].0 .. outs[i].0 + width]` (fused QKV split).
    fn split_cols(&self, x: &Self::Buf, outs: &mut [(usize, &mut Self::Buf)], width: usize);
    /// Copy rows `rows` of `x` into `out`.
    fn select_rows(&self, x: &Self::Buf, rows: &[usize], out: &mut Self::Buf);
    /// `out = x / rms(x) * w` per row (ggml_rms_norm then ggml_mul).
    fn rms_norm(&self, x: &Self::Buf, w: &Self::Weight, eps: f32, out: &mut Self::Buf);
    /// `x += y`, then `out = rms_norm(x) · w` (the residual add before a layer's next norm);
    /// backends may do both in one pass. Equal to `add` then `rms_norm`, bit for bit.
    fn add_rms_norm(&self, x: &mut Self::Buf, y: &Self::Buf, w: &Self::Weight, eps: f32, out: &mut Self::Buf) {
        self.add(x, y);
        self.rms_norm(x, w, eps, out);
    }
    /// `out = (x - mean) / sqrt(var + eps) * w + b` per row (ggml_norm, then mul and add).
    fn layer_norm(&self, x: &Self::Buf, w: &Self::Weight, b: &Self::Weight, eps: f32, out: &mut Self::Buf);
    /// GELU in place, the exact form `x/2 · (1 + erf(x/√2))` (transformers' "gelu").
    fn gelu(&self, x: &mut Self::Buf);
    /// The same per head: each row of `x` holds heads of `head_dim` values, normalised in place
    /// (times `w` when given).
    fn head_rms_norm(&self, x: &mut Self::Buf, w: Option<&Self::Weight>, head_dim: usize, eps: f32);
    /// GELU in place, the tanh approximation (ggml_gelu).
    fn gelu_tanh(&self, x: &mut Self::Buf);
    /// `out = x · Wᵀ`: x is (rows, n_in), W holds n_out rows of n_in values, out is (rows, n_out).
    fn matmul(&self, w: &Self::Weight, x: &Self::Buf, out: &mut Self::Buf);
    /// Several products of the same activations (`outs[i] = x · ws[i]ᵀ`); backends may share the
    /// activation conversion and run them as one parallel region.
    fn matmul_many(&self, ws: &[&Self::Weight], x: &Self::Buf, outs: &mut [&mut Self::Buf]) {
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            self.matmul(w, x, out);
        }
    }
    /// Whether `norm_glu` does its norm and gated activation inside the products of `ws` by rows
    /// like `x`'s (the GPU's decode steps); a model takes that sequence only then. Otherwise
    /// `norm_glu` is the plain sequence of ops it names (the default), so the answer changes the
    /// speed, not what is computed.
    fn fuses_products(&self, _ws: &[&Self::Weight], _x: &Self::Buf) -> bool {
        false
    }
    /// `out = glu(xn · gateᵀ, xn · upᵀ)` with `xn = rms_norm(x) · norm.w`; `t` receives the norm
    /// and the two products where they are computed apart.
    fn norm_glu(
        &self,
        x: &Self::Buf,
        norm: Norm<'_, Self::Weight>,
        [gate, up]: [&Self::Weight; 2],
        glu: Glu,
        t: (&mut Self::Buf, &mut Self::Buf, &mut Self::Buf),
        out: &mut Self::Buf,
    ) {
        let (xn, g, u) = t;
        self.rms_norm(x, norm.w, norm.eps, xn);
        self.matmul_many(&[gate, up], xn, &mut [&mut *g, &mut *u]);
        match glu {
            Glu::Swiglu => self.swiglu(g, u, out),
            Glu::Geglu => self.geglu(g, u, out),
        }
    }
    /// `x += y`, then `norm_glu` of `x` (the residual add before the FFN); backends may do the
    /// add inside `norm_glu`'s launch. Equal to `add` then `norm_glu`, bit for bit in `x`.
    #[allow(clippy::too_many_arguments)]
    fn add_norm_glu(
        &self,
        x: &mut Self::Buf,
        y: &Self::Buf,
        norm: Norm<'_, Self::Weight>,
        gate_up: [&Self::Weight; 2],
        glu: Glu,
        t: (&mut Self::Buf, &mut Self::Buf, &mut Self::Buf),
        out: &mut Self::Buf,
    ) {
        self.add(x, y);
        self.norm_glu(x, norm, gate_up, glu, t, out);
    }
    /// Add a bias row to every row.
    fn add_bias(&self, x: &mut Self::Buf, b: &Self::Weight);
    /// Rotate every head of every row; row i is at the step's position i.
    fn rope(&self, x: &mut Self::Buf, head_dim: usize, step: &Self::Step, rope: &Rope);
    /// `rope` of a layer's queries and keys (same heads' width and rotation); backends may do
    /// both in one pass. Equal to two `rope` calls, bit for bit.
    fn rope_qk(&self, q: &mut Self::Buf, k: &mut Self::Buf, head_dim: usize, step: &Self::Step, rope: &Rope) {
        self.rope(q, head_dim, step, rope);
        self.rope(k, head_dim, step, rope);
    }
    /// Write every sequence's K and V rows of the step at its positions of `layer` (`kvs` in the
    /// step's sequence order).
    fn store_kv(&self, kvs: &mut [&mut Self::Kv], step: &Self::Step, layer: usize, k: &Self::Buf, v: &Self::Buf);
    /// `head_rms_norm` of the layer's queries and keys when `norm` is given, `rope_qk` of them,
    /// then `store_kv` of the roped keys and `v`; backends may do it in one pass. Equal to the
    /// calls, bit for bit.
    #[allow(clippy::too_many_arguments)]
    fn rope_store_kv(
        &self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        v: &Self::Buf,
        head_dim: usize,
        norm: Option<QkNorm<'_, Self::Weight>>,
        rope: &Rope,
        kvs: &mut [&mut Self::Kv],
        step: &Self::Step,
        layer: usize,
    ) {
        if let Some(n) = norm {
            n.apply(self, q, k, head_dim);
        }
        self.rope_qk(q, k, head_dim, step, rope);
        self.store_kv(kvs, step, layer, k, v);
    }
    /// Softmax attention of one layer for every sequence of a step, one call: each sequence's
    /// query rows attend over its own cache (`kvs` in the step's sequence order).
    fn attention(&self, q: &Self::Buf, step: &Self::Step, kvs: &[&Self::Kv], layer: &AttnLayer, out: &mut Self::Buf);
    /// Bidirectional attention for encoders over the f32 Q/K/V rows of a whole batch, one call per
    /// layer: each sequence (a range of rows) attends to all of its rows, per head (`n_head` heads
    /// across the columns). `out` takes Q's shape.
    #[allow(clippy::too_many_arguments)]
    fn encoder_attention(
        &self,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        seqs: &[std::ops::Range<usize>],
        n_head: usize,
        scale: f32,
        out: &mut Self::Buf,
    );
    /// Causal depthwise convolution then SiLU over each sequence's rows of the step,
    /// `out[t] = silu(Σ_i w[i] ⊙ x[t - kernel + 1 + i])`, continuing from the sequence's convolution
    /// state of `l.layer` (the inputs before its first row), which it updates, keeping copies where
    /// asked (`kv_keep_states`). `x`, `out`: (rows, conv_dim); `w`: [kernel, conv_dim] (ggml order:
    /// a channel's taps together), F32.
    #[allow(clippy::too_many_arguments)]
    fn ssm_conv(
        &self,
        x: &Self::Buf,
        w: &Self::Weight,
        step: &Self::Step,
        kvs: &mut [&mut Self::Kv],
        l: &DeltaNetLayer,
        out: &mut Self::Buf,
    );
    /// The gated delta rule over each sequence's rows, continuing from its delta state of
    /// `l.layer`, which it updates (keeping copies where asked); the last recurrent layer's call
    /// ends the step for the state (it then holds the step's positions). `qkv`: (rows, conv_dim),
    /// the convolution's output: q (`n_k_heads` heads), k (`n_k_heads`), v (`n_v_heads`); q and k
    /// are L2-normalised per head and q scaled by 1/√head_k; value head h reads q/k head
    /// h mod n_k_heads (GGUF's tiled head order). `alpha`, `beta`: (rows, n_v_heads) projections:
    /// per token and head the state decays by exp(a · softplus(alpha + dt_bias)) and learns at
    /// rate sigmoid(beta). `out`: (rows, n_v_heads · head_v). Any split of a sequence's rows into
    /// steps gives the same result within f32 rounding (recurrent and chunked forms).
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_net(
        &self,
        qkv: &Self::Buf,
        alpha: &Self::Buf,
        beta: &Self::Buf,
        dt_bias: &Self::Weight,
        a: &Self::Weight,
        step: &Self::Step,
        kvs: &mut [&mut Self::Kv],
        l: &DeltaNetLayer,
        out: &mut Self::Buf,
    );
    /// `x *= sigmoid(g)`, with `g` as wide as `x` or one column (one gate per row).
    fn sigmoid_mul(&self, x: &mut Self::Buf, g: &Self::Buf);
    /// Split rows made of pairs of `width`-wide parts (`[a₀ b₀ a₁ b₁ …]`, a projection of
    /// interleaved heads) into `a = [a₀ a₁ …]` and `b = [b₀ b₁ …]`.
    fn unzip_heads(&self, x: &Self::Buf, width: usize, a: &mut Self::Buf, b: &mut Self::Buf);
    /// `out = silu(gate) * up`.
    fn swiglu(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf);
    /// `out = gelu_tanh(gate) * up` (ggml_geglu: the tanh approximation).
    fn geglu(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf);
    /// `x *= f`.
    fn scale(&self, x: &mut Self::Buf, f: f32);
    /// `x = tanh(x / cap) * cap` (logit soft-capping).
    fn softcap(&self, x: &mut Self::Buf, cap: f32);
    /// `x *= y` element by element (same shapes).
    fn mul(&self, x: &mut Self::Buf, y: &Self::Buf);
    /// `x *= w` for every row (a weight vector as long as a row).
    fn mul_row(&self, x: &mut Self::Buf, w: &Self::Weight);
    /// Products with their own activations each (`jobs[i].2 = jobs[i].1 · jobs[i].0ᵀ`), in one
    /// parallel region where the backend can (the experts of a MoE layer).
    fn matmul_each(&self, jobs: &mut [(&Self::Weight, &Self::Buf, &mut Self::Buf)]) {
        for (w, x, out) in jobs.iter_mut() {
            self.matmul(w, x, out);
        }
    }
    /// The MoE FFN of a step (`model::blocks::moe_ffn`: `out` from `x`, the router reading
    /// `x_route`) with the routing kept on the device, so the host reads nothing mid-step and a
    /// decode step stays one graph; `bufs` is the caller's scratch. Returns false, having done
    /// nothing, where this backend does not (the generic path then runs).
    #[allow(clippy::too_many_arguments)]
    fn moe_ffn_on_device(
        &self,
        _router: &Self::Weight,
        _experts: &[crate::model::blocks::Ffn<Self>],
        _r: &crate::model::blocks::Routing,
        _glu: crate::model::blocks::Glu,
        _x_route: &Self::Buf,
        _x: &Self::Buf,
        _bufs: &mut crate::model::blocks::MoeBufs<Self>,
        _out: &mut Self::Buf,
    ) -> bool
    where
        Self: Sized,
    {
        false
    }
    /// `dst[rows[i]] = src[i]`; `dst` keeps its shape.
    fn scatter_rows(&self, src: &Self::Buf, rows: &[usize], dst: &mut Self::Buf);
    /// `out[t] = Σ_k w[t·k_per + k] · src[t·k_per + k]`, summed in k order (the MoE combine).
    fn weighted_sum_rows(&self, src: &Self::Buf, weights: &[f32], k_per: usize, out: &mut Self::Buf);
    /// Set the logical shape (rows, cols) of a buffer within its capacity.
    fn reshape(&self, x: &mut Self::Buf, rows: usize, cols: usize);
    /// The rows of `x` belong to sequences of these lengths, in order (a step's tokens, its logits
    /// rows, or the rows a MoE expert takes): where a kernel's summation order depends on how many
    /// rows it multiplies together, a product with `x` as its activations gives each sequence the
    /// order it would get alone, so batching never changes a reply. Outputs whose rows are `x`'s
    /// rows (norms, products, GLUs, attention, column splits) carry the same runs on; outputs
    /// built from other rows (`get_rows`, `select_rows`, `reshape`, `write`) are one run.
    fn set_runs(&self, x: &mut Self::Buf, runs: &[usize]);
    /// The runs of `x` (empty: one run).
    fn runs(&self, x: &Self::Buf) -> Vec<usize>;
    /// `x += y`.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf);
    /// Copy a buffer to the host.
    fn read(&self, x: &Self::Buf) -> Vec<f32>;
    /// Rows `r0 .. r0 + rows` of a buffer on the host.
    fn read_rows(&self, x: &Self::Buf, r0: usize, rows: usize) -> Vec<f32> {
        let cols = self.shape(x).1;
        self.read(x)[r0 * cols..(r0 + rows) * cols].to_vec()
    }
    /// What each [`TopAsk`] asks of a row of `x`, found where the buffer is (a GPU hands back the
    /// values asked for instead of the rows); the default reads each row.
    fn top_of_rows(&self, x: &Self::Buf, asks: &[TopAsk]) -> Vec<Top> {
        top_of_rows_on_host(self, x, asks)
    }
    /// A token for each [`SampleAsk`] drawn from its row of `x` (`sampler::masses`: bias and
    /// penalties made to the row, the chain's cuts, the draw at the ask's point), where the buffer
    /// is: a GPU hands back a token id per ask instead of the row. The same token as
    /// `Sampler::sample` from the row. The asks name distinct rows, which may be left changed
    /// (a GPU makes the changes in place); read them before, not after. The default reads each
    /// row.
    fn sample_rows(&self, x: &Self::Buf, asks: &[SampleAsk]) -> Vec<u32> {
        sample_rows_on_host(self, x, asks)
    }
    /// Whether [`Backend::sample_rows`] draws where the logits are (then a sampled step's rows
    /// need not cross to the host; the CPU's are there).
    fn samples_on_device(&self) -> bool {
        false
    }
    /// The index of each row's first largest value (`sampler::argmax`), found where the buffer is
    /// (a GPU hands back a token id per row instead of the row).
    fn argmax_rows(&self, x: &Self::Buf) -> Vec<u32> {
        let cols = self.shape(x).1.max(1);
        self.read(x).chunks(cols).map(crate::sampler::argmax).collect()
    }
    /// Whether a step's token ids may be [`FED`]: taken on the device from the last
    /// `argmax_rows_defer`, so the host enqueues the next step of greedy decoding before it has
    /// read this one's token (a GPU never idles waiting for the host between steps).
    fn feeds_tokens(&self) -> bool {
        false
    }
    /// `argmax_rows` begun without waiting for it: the next step may take its ids as [`FED`]
    /// tokens; `deferred_ids` gives them to the host.
    fn argmax_rows_defer(&self, x: &Self::Buf) -> Deferred {
        Deferred::ready(self.argmax_rows(x))
    }
    /// The ids of an `argmax_rows_defer`, once computed (in the order they were begun).
    fn deferred_ids(&self, d: Deferred) -> Vec<u32> {
        d.ids.unwrap_or_default()
    }
    /// Fill a buffer from the host: `rows × cols` values, row-major.
    fn write(&self, x: &mut Self::Buf, rows: usize, cols: usize, data: &[f32]);
}

/// The row ranges `(start, len)` of a buffer's sequences (`set_runs`); one range of all `t` rows
/// when the runs do not cover them. Backends multiply each on its own, so a sequence's products do
/// not depend on what is batched with it.
pub(crate) fn run_segments(runs: &[usize], t: usize) -> Vec<(usize, usize)> {
    if runs.iter().sum::<usize>() == t && runs.len() > 1 {
        let mut at = 0;
        runs.iter()
            .filter(|&&r| r > 0)
            .map(|&r| {
                at += r;
                (at - r, r)
            })
            .collect()
    } else {
        vec![(0, t)]
    }
}
