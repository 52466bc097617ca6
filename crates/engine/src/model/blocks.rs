//! Pieces every decoder family is built from: attention over the step's sequences, the gated
//! FFNs (SwiGLU, GeGLU), the MoE FFN, and the output head. Each takes the backend and named
//! buffers; families put them together in their own order with their own norms.

use super::batch::{KvLayer, SeqStep};
use crate::backend::{AttnLayer, Backend, QkNorm, Rope};
use crate::Result;

/// The shape of one layer's attention.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub scale: f32,
}

/// Store the step's K/V rows in each sequence's cache (unless the layer reads another layer's
/// cache) and attend every sequence's query rows in one call.
#[allow(clippy::too_many_arguments)]
pub fn attend<B: Backend>(
    b: &B,
    step: &B::Step,
    seqs: &mut [SeqStep<'_, B>],
    layer: usize,
    kv: &KvLayer,
    shape: AttnShape,
    q: &B::Buf,
    k: &B::Buf,
    v: &B::Buf,
    out: &mut B::Buf,
) {
    if kv.shares.is_none() {
        let mut kvs: Vec<&mut B::Kv> = seqs.iter_mut().map(|s| &mut *s.kv).collect();
        b.store_kv(&mut kvs, step, layer, k, v);
    }
    attend_stored(b, step, seqs, layer, kv, shape, q, out);
}

/// `attend` after the per-head norms of `q` and `k` (`norm`, when given) and `rope_qk` of them:
/// the norms, the rotation and the store as one backend call (`rope_store_kv`) where the layer
/// keeps its own cache.
#[allow(clippy::too_many_arguments)]
pub fn rope_attend<B: Backend>(
    b: &B,
    step: &B::Step,
    seqs: &mut [SeqStep<'_, B>],
    layer: usize,
    kv: &KvLayer,
    shape: AttnShape,
    norm: Option<QkNorm<'_, B::Weight>>,
    rope: &Rope,
    q: &mut B::Buf,
    k: &mut B::Buf,
    v: &B::Buf,
    out: &mut B::Buf,
) {
    if kv.shares.is_none() {
        let mut kvs: Vec<&mut B::Kv> = seqs.iter_mut().map(|s| &mut *s.kv).collect();
        b.rope_store_kv(q, k, v, shape.head_dim, norm, rope, &mut kvs, step, layer);
    } else {
        if let Some(n) = norm {
            n.apply(b, q, k, shape.head_dim);
        }
        b.rope_qk(q, k, shape.head_dim, step, rope);
    }
    attend_stored(b, step, seqs, layer, kv, shape, q, out);
}

/// The attention of `attend` once the step's K/V rows are in the caches.
#[allow(clippy::too_many_arguments)]
fn attend_stored<B: Backend>(
    b: &B,
    step: &B::Step,
    seqs: &mut [SeqStep<'_, B>],
    layer: usize,
    kv: &KvLayer,
    shape: AttnShape,
    q: &B::Buf,
    out: &mut B::Buf,
) {
    let a = AttnLayer {
        layer: kv.shares.unwrap_or(layer),
        n_head: shape.n_head,
        n_kv_head: shape.n_kv_head,
        head_dim: shape.head_dim,
        scale: shape.scale,
        window: kv.window,
        causal: true,
    };
    let kvs: Vec<&B::Kv> = seqs.iter().map(|s| &*s.kv).collect();
    b.attention(q, step, &kvs, &a, out);
}

/// Buffers of the output head over up to `rows` logits rows. After a step `logits` holds that
/// step's rows (none when it asked for none) until the next step: read whole, reduced to their
/// argmax where they are, or one at a time.
pub struct HeadBufs<B: Backend> {
    pub sel: B::Buf,
    pub seln: B::Buf,
    pub logits: B::Buf,
}

impl<B: Backend> HeadBufs<B> {
    pub fn new(b: &B, rows: usize, n_embd: usize, n_vocab: usize) -> HeadBufs<B> {
        HeadBufs {
            sel: b.alloc(rows, n_embd),
            seln: b.alloc(rows, n_embd),
            logits: b.alloc(rows, n_vocab),
        }
    }

    /// Every row, in order (each `n_vocab` long).
    pub fn read(&self, b: &B) -> Vec<Vec<f32>> {
        let (rows, n_vocab) = b.shape(&self.logits);
        if rows == 0 {
            return Vec::new();
        }
        b.read(&self.logits)
            .chunks(n_vocab.max(1))
            .map(|c| c.to_vec())
            .collect()
    }

    /// Each row's first largest index (greedy decoding's token).
    pub fn argmax(&self, b: &B) -> Vec<u32> {
        if b.shape(&self.logits).0 == 0 {
            return Vec::new();
        }
        b.argmax_rows(&self.logits)
    }

    /// `argmax` begun where the logits are, read later (`Backend::argmax_rows_defer`).
    pub fn argmax_defer(&self, b: &B) -> crate::backend::Deferred {
        if b.shape(&self.logits).0 == 0 {
            return crate::backend::Deferred::ready(Vec::new());
        }
        b.argmax_rows_defer(&self.logits)
    }

    /// Row `i`.
    pub fn row(&self, b: &B, i: usize) -> crate::Result<Vec<f32>> {
        let rows = b.shape(&self.logits).0;
        if i >= rows {
            return Err(crate::EngineError::Input(format!(
                "logits row {i} of a step that made {rows}"
            )));
        }
        Ok(b.read_rows(&self.logits, i, 1))
    }
}

/// The output head: the rows of `x` the step asks logits for, normed, times `output` (the token
/// embedding when tied), optionally soft-capped, into `t.logits` (`HeadBufs` reads them).
#[allow(clippy::too_many_arguments)]
pub fn logits<B: Backend>(
    b: &B,
    seqs: &[SeqStep<'_, B>],
    x: &B::Buf,
    norm: &B::Weight,
    eps: f32,
    output: &B::Weight,
    softcap: Option<f32>,
    t: &mut HeadBufs<B>,
    dump: &mut crate::debug::Dump,
) {
    let rows = super::batch::output_rows(seqs);
    if rows.is_empty() {
        let n_vocab = b.shape(&t.logits).1;
        b.reshape(&mut t.logits, 0, n_vocab);
        return;
    }
    b.select_rows(x, &rows, &mut t.sel);
    b.set_runs(&mut t.sel, &super::batch::logit_runs(seqs));
    b.rms_norm(&t.sel, norm, eps, &mut t.seln);
    dump.put(b, "result_norm", &t.seln);
    b.matmul(output, &t.seln, &mut t.logits);
    if let Some(cap) = softcap {
        b.softcap(&mut t.logits, cap);
    }
    dump.put(b, "result_output", &t.logits);
}

/// Gated FFN activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// `silu(gate) * up`
    Swiglu,
    /// `gelu_tanh(gate) * up`
    Geglu,
}

/// One expert (or a dense FFN): gate, up and down matrices.
pub struct Ffn<B: Backend> {
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
}

impl<B: Backend> Ffn<B> {
    /// Experts from their gate, up and down matrices, in expert order.
    pub fn stack(gate: Vec<B::Weight>, up: Vec<B::Weight>, down: Vec<B::Weight>) -> Vec<Ffn<B>> {
        gate.into_iter()
            .zip(up)
            .zip(down)
            .map(|((gate, up), down)| Ffn { gate, up, down })
            .collect()
    }
}

/// Buffers of a gated FFN over up to `rows` rows.
pub struct FfnBufs<B: Backend> {
    pub gate: B::Buf,
    pub up: B::Buf,
    pub act: B::Buf,
}

impl<B: Backend> FfnBufs<B> {
    pub fn new(b: &B, rows: usize, n_ff: usize) -> FfnBufs<B> {
        FfnBufs {
            gate: b.alloc(rows, n_ff),
            up: b.alloc(rows, n_ff),
            act: b.alloc(rows, n_ff),
        }
    }
}

/// `out = down(glu(gate(x), up(x)))`.
pub fn ffn<B: Backend>(b: &B, f: &Ffn<B>, glu: Glu, x: &B::Buf, t: &mut FfnBufs<B>, out: &mut B::Buf) {
    b.matmul_many(&[&f.gate, &f.up], x, &mut [&mut t.gate, &mut t.up]);
    match glu {
        Glu::Swiglu => b.swiglu(&t.gate, &t.up, &mut t.act),
        Glu::Geglu => b.geglu(&t.gate, &t.up, &mut t.act),
    }
    b.matmul(&f.down, &t.act, out);
}

/// How a router's logits become expert weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Routing {
    pub n_expert: usize,
    pub k: usize,
    /// Softmax over all experts first (else the selected logits' softmax, Gemma 4 style).
    pub softmax_first: bool,
    /// Divide the k weights by their sum (`norm_topk_prob`).
    pub normalize: bool,
}

/// The top-k experts and their weights for every row of router logits (`n_expert` per row):
/// ids and weights, `k` per row. Ties go to the lower expert id.
// llama-graph.cpp build_moe_ffn: soft_max, argsort_top_k, get_rows of the probabilities, sum_rows + div
pub fn route(logits: &[f32], r: &Routing) -> (Vec<usize>, Vec<f32>) {
    let rows = logits.len() / r.n_expert.max(1);
    let mut ids = Vec::with_capacity(rows * r.k);
    let mut ws = Vec::with_capacity(rows * r.k);
    let mut probs = vec![0f32; r.n_expert];
    for row in logits.chunks(r.n_expert) {
        if r.softmax_first {
            softmax_ggml(row, &mut probs);
        } else {
            probs.copy_from_slice(row);
        }
        let mut order: Vec<usize> = (0..r.n_expert).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let top = &order[..r.k];
        let mut w: Vec<f32> = top.iter().map(|&e| probs[e]).collect();
        if !r.softmax_first {
            let sel = w.clone();
            softmax_ggml(&sel, &mut w);
        }
        if r.normalize {
            // llama-graph.cpp: the sum is clamped to the smallest normal f16 before dividing.
            let sum = w.iter().sum::<f32>().max(6.103_515_6e-5);
            for v in &mut w {
                *v /= sum;
            }
        }
        ids.extend_from_slice(top);
        ws.extend_from_slice(&w);
    }
    (ids, ws)
}

// ggml-cpu/ops.cpp ggml_compute_forward_soft_max_f32: max, exp(x - max) summed in double, times 1/sum
fn softmax_ggml(x: &[f32], out: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0f64;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - max).exp();
        sum += *o as f64;
    }
    let inv = (1.0 / sum) as f32;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

/// A MoE FFN: the router and the experts.
pub struct Moe<B: Backend> {
    pub router: B::Weight,
    pub experts: Vec<Ffn<B>>,
    pub routing: Routing,
    /// Rows of each expert's gate/up matrices.
    pub n_ff: usize,
}

/// A layer's FFN: dense or mixture of experts.
pub enum LayerFfn<B: Backend> {
    Dense(Ffn<B>),
    Moe(Moe<B>),
}

/// Buffers of a MoE FFN: the router's logits and the per-(row, slot) expert outputs.
pub struct MoeBufs<B: Backend> {
    pub router: B::Buf,
    /// (rows · k, n_embd): expert outputs in (row, slot) order.
    pub slots: B::Buf,
    /// Per selected expert: its rows of the input, its FFN buffers and its output.
    pub xs: Vec<B::Buf>,
    pub ffn: Vec<FfnBufs<B>>,
    pub ys: Vec<B::Buf>,
}

impl<B: Backend> MoeBufs<B> {
    pub fn new(b: &B, rows: usize, n_embd: usize, n_ff: usize, r: &Routing) -> MoeBufs<B> {
        // A step touches at most min(rows · k, n_expert) experts, each with at most `rows` rows.
        let n = (rows * r.k).min(r.n_expert);
        MoeBufs {
            router: b.alloc(rows, r.n_expert),
            slots: b.alloc(rows * r.k, n_embd),
            xs: (0..n).map(|_| b.alloc(rows, n_embd)).collect(),
            ffn: (0..n).map(|_| FfnBufs::new(b, rows, n_ff)).collect(),
            ys: (0..n).map(|_| b.alloc(rows, n_embd)).collect(),
        }
    }
}

/// Group a step's (row, slot) choices by expert: for each used expert, in id order, the rows it
/// takes and where its outputs go in the slot buffer.
pub fn group_by_expert(ids: &[usize], k: usize, n_expert: usize) -> Vec<(usize, Vec<usize>, Vec<usize>)> {
    let mut by: Vec<(Vec<usize>, Vec<usize>)> = vec![(Vec::new(), Vec::new()); n_expert];
    for (i, &e) in ids.iter().enumerate() {
        by[e].0.push(i / k);
        by[e].1.push(i);
    }
    by.into_iter()
        .enumerate()
        .filter(|(_, (rows, _))| !rows.is_empty())
        .map(|(e, (rows, slots))| (e, rows, slots))
        .collect()
}

/// The MoE FFN: route every row to its top-k experts, run each used expert once on the rows that
/// chose it (all experts' products in one call per matrix), and sum the weighted outputs per row
/// in slot order. `expert_scale` multiplies each expert's output (Gemma 4's per-expert scales).
#[allow(clippy::too_many_arguments)]
pub fn moe_ffn<B: Backend>(
    b: &B,
    router: &B::Weight,
    experts: &[Ffn<B>],
    r: &Routing,
    glu: Glu,
    x_route: &B::Buf,
    x: &B::Buf,
    t: &mut MoeBufs<B>,
    expert_scale: Option<&[f32]>,
    out: &mut B::Buf,
) -> Result<()> {
    if expert_scale.is_none() && b.moe_ffn_on_device(router, experts, r, glu, x_route, x, t, out) {
        return Ok(());
    }
    moe_ffn_routed_on_host(b, router, experts, r, glu, x_route, x, t, expert_scale, out)
}

/// `moe_ffn` with the routing read on the host (every backend's generic path; the op tests
/// compare a backend's device routing with it).
#[allow(clippy::too_many_arguments)]
pub fn moe_ffn_routed_on_host<B: Backend>(
    b: &B,
    router: &B::Weight,
    experts: &[Ffn<B>],
    r: &Routing,
    glu: Glu,
    x_route: &B::Buf,
    x: &B::Buf,
    t: &mut MoeBufs<B>,
    expert_scale: Option<&[f32]>,
    out: &mut B::Buf,
) -> Result<()> {
    b.matmul(router, x_route, &mut t.router);
    let logits = b.read(&t.router);
    let (ids, ws) = route(&logits, r);
    let groups = group_by_expert(&ids, r.k, r.n_expert);
    let n = groups.len();
    // Which sequence each row belongs to: an expert's rows keep their sequences' runs, so its
    // products sum each sequence's rows as they would sum alone.
    let x_runs = b.runs(x);
    let seq_of: Vec<usize> = x_runs
        .iter()
        .enumerate()
        .flat_map(|(i, &r)| std::iter::repeat_n(i, r))
        .collect();
    for (g, (_, rows, _)) in groups.iter().enumerate() {
        b.select_rows(x, rows, &mut t.xs[g]);
        if x_runs.len() > 1 && seq_of.len() == b.shape(x).0 {
            let mut runs = vec![0usize; x_runs.len()];
            for &r in rows {
                runs[seq_of[r]] += 1;
            }
            b.set_runs(&mut t.xs[g], &runs);
        }
    }
    {
        let (xs, ffn) = (&t.xs, &mut t.ffn);
        let mut jobs: Vec<(&B::Weight, &B::Buf, &mut B::Buf)> = Vec::with_capacity(2 * n);
        for ((e, _, _), (xg, fb)) in groups.iter().zip(xs.iter().zip(ffn.iter_mut())) {
            let FfnBufs { gate, up, .. } = fb;
            jobs.push((&experts[*e].gate, xg, gate));
            jobs.push((&experts[*e].up, xg, up));
        }
        b.matmul_each(&mut jobs);
    }
    for fb in t.ffn.iter_mut().take(n) {
        match glu {
            Glu::Swiglu => b.swiglu(&fb.gate, &fb.up, &mut fb.act),
            Glu::Geglu => b.geglu(&fb.gate, &fb.up, &mut fb.act),
        }
    }
    {
        let (ffn, ys) = (&t.ffn, &mut t.ys);
        let mut jobs: Vec<(&B::Weight, &B::Buf, &mut B::Buf)> = groups
            .iter()
            .zip(ffn.iter().zip(ys.iter_mut()))
            .map(|((e, _, _), (fb, y))| (&experts[*e].down, &fb.act, y))
            .collect();
        b.matmul_each(&mut jobs);
    }
    if let Some(s) = expert_scale {
        // Gemma 4's per-expert scale multiplies the expert's output (before its routing weight).
        for ((e, _, _), y) in groups.iter().zip(t.ys.iter_mut()) {
            b.scale(y, s[*e]);
        }
    }
    let (_, cols) = b.shape(x);
    b.reshape(&mut t.slots, ids.len(), cols);
    for (g, (_, _, slots)) in groups.iter().enumerate() {
        b.scatter_rows(&t.ys[g], slots, &mut t.slots);
    }
    b.weighted_sum_rows(&t.slots, &ws, r.k, out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_picks_top_k_with_softmax_weights() {
        let r = Routing {
            n_expert: 4,
            k: 2,
            softmax_first: true,
            normalize: true,
        };
        let (ids, ws) = route(&[0.0, 2.0, 1.0, 2.0, 5.0, 1.0, 1.0, 0.0], &r);
        // Row 0: a tie between experts 1 and 3 goes to the lower id first.
        assert_eq!(ids, vec![1, 3, 0, 1]);
        assert!((ws[0] - 0.5).abs() < 1e-6 && (ws[1] - 0.5).abs() < 1e-6);
        let e = (4f32).exp();
        assert!((ws[2] - e / (e + 1.0)).abs() < 1e-6, "{ws:?}");
        let g = group_by_expert(&ids, 2, 4);
        assert_eq!(
            g,
            vec![
                (0, vec![1], vec![2]),
                (1, vec![0, 1], vec![0, 3]),
                (3, vec![0], vec![1])
            ]
        );
    }
}
