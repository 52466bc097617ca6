//! What every decoder family shares at the seam: the model interface ([`Model`]), the batch of
//! sequences one forward step runs ([`SeqStep`]), what a model tells its callers ([`ModelInfo`])
//! and how its per-sequence state is laid out ([`KvLayer`]).

use crate::backend::{Backend, Deferred, KvType, StepPlan, StepSeq, FED};
use crate::{EngineError, Result};
use std::any::Any;
use std::sync::Arc;

/// Positions per page of a KV pool, and per block of the prefix cache (the same unit, so a cached
/// block is one shared page).
pub const PAGE: usize = 64;

/// Which rows of a sequence's step produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
    /// The rows from this index of the sequence's step on (perplexity scores the second half).
    From(usize),
    /// Every row, each computed as a one-row step at its position would compute it: the rows
    /// that check drafted tokens (speculative decoding), whose logits must be decoding's.
    Each,
}

/// One sequence's part of a batched forward step: `tokens` at positions `pos0 ..`.
pub struct SeqStep<'a, B: Backend> {
    pub kv: &'a mut B::Kv,
    pub tokens: &'a [u32],
    pub pos0: usize,
    pub logits: Logits,
}

/// Where the rows of an MTP step take their hidden states from: rows of the scratch's last
/// target step, or of its last MTP step (drafting further ahead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HiddenRows<'a> {
    Target(&'a [usize]),
    Mtp(&'a [usize]),
}

/// The family-independent facts about a loaded decoder.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The GGUF `general.architecture`.
    pub arch: String,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    /// The context length the model was trained with.
    pub n_ctx_train: usize,
}

/// The cache one layer keeps per position: K and V rows of `k_dim` / `v_dim` values, or none when
/// the layer reads another layer's cache (`shares`) or is a linear-attention layer, which keeps a
/// fixed-size recurrent state per sequence instead (`recurrent`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayer {
    pub k_dim: usize,
    pub v_dim: usize,
    /// Sliding window of the layer's attention (positions kept visible), `None` for global.
    pub window: Option<usize>,
    /// The layer whose cache this one attends to (Gemma 4's KV-shared layers); it stores nothing.
    pub shares: Option<usize>,
    /// A linear-attention (Gated DeltaNet) layer's per-sequence state; it keeps no K/V rows.
    pub recurrent: Option<RecurrentLayer>,
}

/// The recurrent state of one linear-attention layer for one sequence, in f32 values: the causal
/// convolution's last `conv_rows` inputs (`conv_dim` channels each) and the delta rule's `heads`
/// matrices of `head_v` rows by `head_k` values (row j holds column j of the key × value state,
/// llama.cpp's transposed layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecurrentLayer {
    pub conv_rows: usize,
    pub conv_dim: usize,
    pub heads: usize,
    pub head_k: usize,
    pub head_v: usize,
}

impl RecurrentLayer {
    /// f32 values of the convolution state.
    pub fn conv_len(&self) -> usize {
        self.conv_rows * self.conv_dim
    }
    /// f32 values of the delta-rule state.
    pub fn ssm_len(&self) -> usize {
        self.heads * self.head_v * self.head_k
    }
}

impl KvLayer {
    pub fn own(k_dim: usize, v_dim: usize, window: Option<usize>) -> KvLayer {
        KvLayer {
            k_dim,
            v_dim,
            window,
            shares: None,
            recurrent: None,
        }
    }

    /// A linear-attention layer: no K/V rows, a recurrent state per sequence.
    pub fn recurrent(r: RecurrentLayer) -> KvLayer {
        KvLayer {
            k_dim: 0,
            v_dim: 0,
            window: None,
            shares: None,
            recurrent: Some(r),
        }
    }
}

/// A model's activation buffers for steps of up to `rows` tokens; what is inside belongs to the
/// family that made it.
pub struct Scratch {
    rows: usize,
    inner: Box<dyn Any + Send>,
}

impl Scratch {
    pub fn new<T: Any + Send>(rows: usize, inner: T) -> Scratch {
        Scratch {
            rows,
            inner: Box::new(inner),
        }
    }

    /// The most tokens one step can hold.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The family's buffers (made by its own `scratch`).
    pub fn get<T: Any>(&mut self) -> Result<&mut T> {
        self.inner
            .downcast_mut::<T>()
            .ok_or_else(|| EngineError::Backend("a scratch made by another model".into()))
    }
}

/// A decoder of any family, held by generate, bench, perplexity and serve without naming the
/// family. `forward` runs one step over several sequences and returns the logits rows asked for,
/// in order (each `n_vocab` long).
pub trait Model<B: Backend>: Send + Sync {
    fn info(&self) -> &ModelInfo;
    fn backend(&self) -> &Arc<B>;
    /// The per-layer cache layout of one sequence.
    fn kv_layers(&self) -> &[KvLayer];
    fn scratch(&self, rows: usize) -> Scratch;
    fn forward(&self, s: &mut Scratch, seqs: &mut [SeqStep<'_, B>]) -> Result<Vec<Vec<f32>>>;
    /// `forward` with each logits row reduced where it was computed to the index of its first
    /// largest value (greedy decoding's token): from a GPU a token id per row crosses to the host
    /// instead of the row. The rows stay in the scratch until its next step (`logits_row`).
    fn forward_argmax(&self, s: &mut Scratch, seqs: &mut [SeqStep<'_, B>]) -> Result<Vec<u32>>;
    /// Row `i` of the logits of the scratch's last step.
    fn logits_row(&self, s: &mut Scratch, i: usize) -> Result<Vec<f32>>;
    /// What each ask wants of a logits row of the scratch's last step (`Backend::top_of_rows`:
    /// a sampler's top-k cut, found where the logits are).
    fn logits_top(&self, s: &mut Scratch, asks: &[crate::backend::TopAsk]) -> Result<Vec<crate::backend::Top>>;
    /// A token drawn for each ask from a logits row of the scratch's last step
    /// (`Backend::sample_rows`: only the tokens cross from a GPU that draws).
    fn logits_sample(&self, s: &mut Scratch, asks: &[crate::backend::SampleAsk]) -> Result<Vec<u32>>;
    /// Whether `logits_sample` draws where the logits are (`Backend::samples_on_device`).
    fn samples_on_device(&self) -> bool;
    /// `forward_argmax` whose ids the host reads later (`Backend::deferred_ids`), after it has
    /// enqueued the step that takes them as [`FED`] tokens ([`decode_greedy`]).
    fn forward_argmax_defer(&self, s: &mut Scratch, seqs: &mut [SeqStep<'_, B>]) -> Result<Deferred> {
        Ok(Deferred::ready(self.forward_argmax(s, seqs)?))
    }
    /// Whether a step's tokens may be [`FED`] (the family reads token ids through
    /// `Backend::embed` only, and the backend feeds them).
    fn feeds_tokens(&self) -> bool {
        false
    }

    /// Multi-token-prediction (MTP) layers the model runs ([`Model::forward_mtp_argmax`]); 0 for
    /// a model without them.
    fn mtp_layers(&self) -> usize {
        0
    }
    /// One step of the MTP head (speculative drafting, `spec::MtpDrafter`): row r of the step
    /// pairs its token with the hidden state `hidden` names for it (the normed last hidden state
    /// of a row of the scratch's last target step, or of its last MTP step) and gives, as
    /// `forward_argmax` does, the argmax of the logits rows asked for: the MTP's guess of the
    /// token after. The step stores the MTP layer's K/V at its positions in `kv`.
    fn forward_mtp_argmax(
        &self,
        _s: &mut Scratch,
        _seqs: &mut [SeqStep<'_, B>],
        _hidden: HiddenRows<'_>,
    ) -> Result<Vec<u32>> {
        Err(EngineError::Unsupported(format!(
            "a {} model has no multi-token-prediction layers",
            self.info().arch
        )))
    }

    /// A cache for one sequence of up to `n_ctx` positions.
    fn new_kv(&self, n_ctx: usize, ty: KvType) -> Result<B::Kv> {
        self.backend().alloc_kv(self.kv_layers(), n_ctx, ty)
    }
}

/// A family's step buffers, as the steps every family shares need them.
pub(crate) trait StepBufs<B: Backend>: Any + Send + Sync {
    fn head(&self) -> &super::blocks::HeadBufs<B>;
}

/// What every family's `forward` and `forward_argmax` do: check the step, run the family's graph
/// (`run`) on its buffers in the scratch, then `out` of the step's logits.
pub(crate) fn step<B: Backend, T: StepBufs<B>, R: Send>(
    b: &B,
    s: &mut Scratch,
    seqs: &mut [SeqStep<'_, B>],
    run: impl FnOnce(&mut T, &mut [SeqStep<'_, B>]) -> Result<()> + Send,
    out: impl FnOnce(&B, &super::blocks::HeadBufs<B>) -> Vec<R> + Send,
) -> Result<Vec<R>> {
    step_as(b, s, seqs, run, out, Vec::new)
}

/// `step` with any kind of output (`empty` for a step of no tokens).
pub(crate) fn step_as<B: Backend, T: StepBufs<B>, O: Send>(
    b: &B,
    s: &mut Scratch,
    seqs: &mut [SeqStep<'_, B>],
    run: impl FnOnce(&mut T, &mut [SeqStep<'_, B>]) -> Result<()> + Send,
    out: impl FnOnce(&B, &super::blocks::HeadBufs<B>) -> O + Send,
    empty: impl FnOnce() -> O,
) -> Result<O> {
    if check_step(b, s, seqs)? == 0 {
        return Ok(empty());
    }
    let bufs = s.get::<T>()?;
    b.run(|| {
        run(bufs, seqs)?;
        Ok(out(b, bufs.head()))
    })
}

/// Row `i` of the logits of the scratch's last step (`Model::logits_row`).
pub(crate) fn logits_row<B: Backend, T: StepBufs<B>>(b: &B, s: &mut Scratch, i: usize) -> Result<Vec<f32>> {
    let bufs = s.get::<T>()?;
    b.run(|| bufs.head().row(b, i))
}

/// The logits of the scratch's last step, when it made each of `rows`.
fn logits_with<'a, B: Backend, T: StepBufs<B>>(
    b: &B,
    s: &'a mut Scratch,
    mut rows: impl Iterator<Item = usize>,
) -> Result<&'a B::Buf> {
    let logits = &s.get::<T>()?.head().logits;
    let made = b.shape(logits).0;
    match rows.find(|&r| r >= made) {
        Some(r) => Err(EngineError::Input(format!("logits row {r} of a step that made {made}"))),
        None => Ok(logits),
    }
}

/// What each ask wants of a logits row of the scratch's last step (`Model::logits_top`).
pub(crate) fn logits_top<B: Backend, T: StepBufs<B>>(
    b: &B,
    s: &mut Scratch,
    asks: &[crate::backend::TopAsk],
) -> Result<Vec<crate::backend::Top>> {
    let logits = logits_with::<B, T>(b, s, asks.iter().map(|a| a.row))?;
    Ok(b.run(|| b.top_of_rows(logits, asks)))
}

/// A token drawn for each ask from a logits row of the scratch's last step
/// (`Model::logits_sample`).
pub(crate) fn logits_sample<B: Backend, T: StepBufs<B>>(
    b: &B,
    s: &mut Scratch,
    asks: &[crate::backend::SampleAsk],
) -> Result<Vec<u32>> {
    let logits = logits_with::<B, T>(b, s, asks.iter().map(|a| a.row))?;
    Ok(b.run(|| b.sample_rows(logits, asks)))
}

/// Checks every family makes before a step: the batch fits the scratch, each sequence its cache.
pub(crate) fn check_step<B: Backend>(b: &B, s: &Scratch, seqs: &[SeqStep<'_, B>]) -> Result<usize> {
    let total: usize = seqs.iter().map(|q| q.tokens.len()).sum();
    if total > s.rows() {
        return Err(EngineError::Input(format!(
            "a step of {total} tokens exceeds the batch size {}",
            s.rows()
        )));
    }
    for q in seqs {
        let cap = b.kv_capacity(q.kv);
        if q.pos0 + q.tokens.len() > cap {
            return Err(EngineError::ContextFull {
                need: q.pos0 + q.tokens.len(),
                n_ctx: cap,
            });
        }
    }
    Ok(total)
}

/// The step's token ids, positions and sequence layout, handed to the backend once
/// (`Backend::begin_step`).
pub(crate) fn begin_step<B: Backend>(b: &B, seqs: &[SeqStep<'_, B>]) -> Result<B::Step> {
    let ids = seqs.iter().flat_map(|q| q.tokens.iter().copied()).collect();
    let positions = seqs.iter().flat_map(|q| q.pos0..q.pos0 + q.tokens.len()).collect();
    let mut row0 = 0;
    let layout = seqs
        .iter()
        .map(|q| {
            let s = StepSeq {
                row0,
                rows: q.tokens.len(),
                pos0: q.pos0,
                alone: q.logits == Logits::Each,
            };
            row0 += s.rows;
            s
        })
        .collect();
    let kvs: Vec<&B::Kv> = seqs.iter().map(|q| &*q.kv).collect();
    let plan = StepPlan {
        ids,
        positions,
        seqs: layout,
    };
    b.begin_step(plan, &kvs)
}

/// The rows of the step that produce logits.
pub(crate) fn output_rows<B: Backend>(seqs: &[SeqStep<'_, B>]) -> Vec<usize> {
    let mut rows = Vec::new();
    let mut row0 = 0;
    for q in seqs {
        let n = q.tokens.len();
        match q.logits {
            Logits::None => {}
            Logits::Last => rows.push(row0 + n - 1),
            Logits::All | Logits::Each => rows.extend(row0..row0 + n),
            Logits::From(i) => rows.extend(row0 + i.min(n)..row0 + n),
        }
        row0 += n;
    }
    rows
}

/// Logits rows per sequence (for `Backend::set_runs`).
pub(crate) fn logit_runs<B: Backend>(seqs: &[SeqStep<'_, B>]) -> Vec<usize> {
    let mut runs = Vec::with_capacity(seqs.len());
    for q in seqs {
        let n = q.tokens.len();
        match q.logits {
            Logits::None => runs.push(0),
            Logits::Last => runs.push(usize::from(n > 0)),
            Logits::All => runs.push(n),
            Logits::From(i) => runs.push(n.saturating_sub(i)),
            Logits::Each => runs.extend(std::iter::repeat_n(1, n)),
        }
    }
    runs
}

/// Greedy decoding of one sequence: `tok` at `pos0`, then each step's argmax fed to the next,
/// `n` tokens in all handed to `on` in order until it returns false; returns how many it was
/// handed. Where the model and backend feed tokens on the device ([`Model::feeds_tokens`]), step
/// i + 1 is enqueued before the host reads step i's token, so the device does not wait for the
/// host between steps; a step begun after the one `on` stopped at is discarded (it wrote the
/// cache one position past what the caller keeps). The same tokens either way.
pub fn decode_greedy<B: Backend>(
    m: &dyn Model<B>,
    s: &mut Scratch,
    kv: &mut B::Kv,
    tok: u32,
    pos0: usize,
    n: usize,
    mut on: impl FnMut(u32) -> bool,
) -> Result<usize> {
    let b = m.backend().clone();
    let step = |s: &mut Scratch, kv: &mut B::Kv, t: u32, pos: usize| {
        m.forward_argmax_defer(
            s,
            &mut [SeqStep {
                kv,
                tokens: &[t],
                pos0: pos,
                logits: Logits::Last,
            }],
        )
    };
    if n == 0 {
        return Ok(0);
    }
    let feed = m.feeds_tokens();
    let cap = b.kv_capacity(kv);
    let mut pending = step(s, kv, tok, pos0)?;
    for i in 0..n {
        let pos = pos0 + i + 1;
        // The next step on the device's token, begun before this one's is read.
        let next = if feed && i + 1 < n && pos < cap {
            Some(step(s, kv, FED, pos)?)
        } else {
            None
        };
        let t = b.deferred_ids(pending).first().copied().unwrap_or(0);
        if !on(t) || i + 1 == n {
            if let Some(d) = next {
                b.deferred_ids(d);
            }
            return Ok(i + 1);
        }
        pending = match next {
            Some(d) => d,
            None => step(s, kv, t, pos)?,
        };
    }
    Ok(n)
}
