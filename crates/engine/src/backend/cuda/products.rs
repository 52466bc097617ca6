//! The products of the other weight types than the integer kernels' (`mmq.rs`) and of their
//! runs of rows past them: the matrix-vector kernels (`kernels/matmul.cu`) for decode rows, up to
//! eight rows a launch, with the float weights' fused FFN input (`Backend::norm_glu`), and cuBLAS
//! (`gemm.rs`) for longer runs.

use super::dev::{blocks, A};
use super::mmq::{mmq_fits, mmq_max_rows};
use super::{ty_name, Cuda, CudaBuf, CudaWeight, MMV_ROWS};
use crate::backend::{run_segments, Norm};
use crate::model::blocks::Glu;
use gguf::GgmlType;

/// Warps per output row of the matrix-vector kernels for a matrix of `m` rows, at most `cap`
/// (`Cuda::wpr_cap`): more warps for a matrix of few rows. A matrix of at most 256 rows (a MoE
/// router's) always gets four (`HF2Q_CUDA_WPR_SMALL`, 4 by default): 32 blocks of one warp a row
/// leave most of the GPU idle (MoE tg128 1.010× against one on an H100,
/// bench/runs/2026-12-05-h100-d).
fn warps_per_row(m: usize, cap: usize) -> usize {
    static SMALL: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let small = *SMALL.get_or_init(|| {
        std::env::var("HF2Q_CUDA_WPR_SMALL")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|v| [1, 2, 4].contains(v))
            .unwrap_or(4)
    });
    match m {
        0..=256 => small,
        257..=2048 => 4.min(cap),
        2049..=4096 => 2.min(cap),
        _ => 1,
    }
}

/// Rows of one sequence above which a product of the other types goes through cuBLAS (tensor
/// cores) instead of the matrix-vector kernels.
const GEMM_MIN_ROWS: usize = 9;

/// Runs of rows: (first row, rows).
type Runs = Vec<(usize, usize)>;

/// What a matrix-vector launch does around its products (`kernels/matmul.cu`): nothing; or
/// (the float weights' fused variants) gate and up (`up` the second weight) by the RMS norm of
/// the activations (`g` the norm's weights), giving their gated activation (`op` 2 SwiGLU, 3
/// GeGLU); or a MoE router's product then its routing by the launch's last block (`moe_route`'s
/// arguments; `cnt` the launch's counter of finished blocks).
#[derive(Clone, Copy)]
pub(super) enum Fuse {
    None,
    Glu {
        g: u64,
        eps: f32,
        up: u64,
        op: i32,
        /// `x += y` first (y's address, the launch's counter of finished blocks).
        add: Option<(u64, u64)>,
    },
    Route {
        cnt: u64,
        k: i32,
        softmax_first: i32,
        normalize: i32,
        ids: u64,
        ws: u64,
    },
}

impl Fuse {
    /// The kernel name's suffix and the arguments after the plain launch's.
    fn args(self) -> (&'static str, Vec<A>) {
        match self {
            Fuse::None => ("", vec![]),
            Fuse::Glu { g, eps, up, op, add } => {
                let mut args = vec![A::P(g), A::F(eps), A::P(up), A::I(op)];
                match add {
                    None => ("g", args),
                    Some((y, cnt)) => {
                        args.extend([A::P(y), A::P(cnt)]);
                        ("ga", args)
                    }
                }
            }
            Fuse::Route {
                cnt,
                k,
                softmax_first,
                normalize,
                ids,
                ws,
            } => (
                "r",
                vec![
                    A::P(cnt),
                    A::I(k),
                    A::I(softmax_first),
                    A::I(normalize),
                    A::P(ids),
                    A::P(ws),
                ],
            ),
        }
    }
}

/// Weight types whose matrix-vector kernels have the fused variant.
pub(super) const FUSED_TYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];

/// Whether the fused FFN input is on (`HF2Q_CUDA_FUSE=0` turns it off, to compare).
fn ffn_fuse_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("HF2Q_CUDA_FUSE").is_none_or(|v| v != "0"))
}

impl Cuda {
    /// `Backend::fuses_products`.
    pub(super) fn fuses(&self, ws: &[&CudaWeight], x: &CudaBuf) -> bool {
        ffn_fuse_on() && ws.iter().all(|w| FUSED_TYPES.contains(&w.dev_ty)) && self.short_runs(x).is_some()
    }

    /// `x`'s runs for the fused FFN input's launches, or `None` where it does not fuse.
    fn glu_runs(&self, x: &CudaBuf, norm: Norm<'_, CudaWeight>, [gate, up]: [&CudaWeight; 2]) -> Option<Runs> {
        let pair = gate.dev_ty == up.dev_ty && gate.n_rows() == up.n_rows() && gate.row_bytes == up.row_bytes;
        let types = ffn_fuse_on() && [gate, up].iter().all(|w| FUSED_TYPES.contains(&w.dev_ty));
        self.short_runs(x)
            .filter(|_| pair && types && norm.w.dev_ty == GgmlType::F32)
    }

    /// Whether `norm_glu_op` takes a residual add inside its launch: fused, its rows in one
    /// launch (the finished blocks are counted per launch).
    pub(super) fn adds_inside(&self, x: &CudaBuf, norm: Norm<'_, CudaWeight>, gate_up: [&CudaWeight; 2]) -> bool {
        self.fuse_on(super::Fused::Add) && x.rows <= 8 && self.glu_runs(x, norm, gate_up).is_some_and(|r| r.len() == 1)
    }

    /// `Backend::norm_glu`, and with `add` `Backend::add_norm_glu` (`x += add` first).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn norm_glu_op(
        &self,
        x: &CudaBuf,
        add: Option<&CudaBuf>,
        norm: Norm<'_, CudaWeight>,
        [gate, up]: [&CudaWeight; 2],
        glu: Glu,
        t: (&mut CudaBuf, &mut CudaBuf, &mut CudaBuf),
        out: &mut CudaBuf,
    ) {
        let runs = self.glu_runs(x, norm, [gate, up]);
        let op = match glu {
            Glu::Swiglu => 2,
            Glu::Geglu => 3,
        };
        assert!(
            add.is_none() || self.adds_inside(x, norm, [gate, up]),
            "norm_glu: an add inside a launch that does not take it"
        );
        let Some(runs) = runs else {
            let (xn, g, u) = t;
            self.norm(x, None, norm.w, norm.eps, xn);
            self.products(&[gate, up], xn, &mut [&mut *g, &mut *u]);
            out.shape_from(g.rows, &g.runs, g.cols);
            return self.glu(g, u, out, op);
        };
        assert_eq!(
            x.cols,
            gate.row_len(),
            "norm_glu: activations of {} columns by weight rows of {}",
            x.cols,
            gate.row_len()
        );
        out.shape_from(x.rows, &x.runs, gate.n_rows());
        let add = add.map(|y| (y.ptr, self.grown_zeroed(&self.dev.add_cnt, 1, "FFN add counter")));
        if add.is_some() {
            self.count_fused(super::Fused::Add);
        }
        let fuse = Fuse::Glu {
            g: self.dev.ptr(&norm.w.data),
            eps: norm.eps,
            up: self.dev.ptr(&up.data),
            op,
            add,
        };
        self.small_products(&[(gate, &*out)], x, &runs, fuse);
    }

    /// A MoE router's product `out = x · wᵀ` and its routing (`route`: `Fuse::Route`) in one
    /// matrix-vector launch, when the weight is of a fused type and x's rows (at most eight) go
    /// to one launch; false (nothing launched) otherwise.
    pub(super) fn router_routed(&self, w: &CudaWeight, x: &CudaBuf, out: &mut CudaBuf, route: Fuse) -> bool {
        let one = self
            .short_runs(x)
            .filter(|r| r.len() == 1 && r[0] == (0, x.rows) && x.rows <= 8);
        let on = self.fuse_on(super::Fused::Route);
        if !on || !FUSED_TYPES.contains(&w.dev_ty) || one.is_none() || x.cols != w.row_len() {
            return false;
        }
        out.shape_from(x.rows, &x.runs, w.n_rows());
        let input = [A::P(x.ptr)];
        self.mv(
            &format!("mmv_{}", ty_name(w.dev_ty)),
            &input,
            &[(w, &*out)],
            x.cols,
            0,
            x.rows,
            route,
        );
        self.count_fused(super::Fused::Route);
        true
    }

    /// `outs[i] = x · ws[i]ᵀ`. Weights of the integer kernels' types take all rows at once
    /// (`mmq`: every row computed alike whatever shares the launch). The others: each sequence's
    /// rows on their own (`set_runs`): which kernel multiplies them, and cuBLAS's choice of
    /// algorithm, depend on the row count only, so a reply does not depend on what else is batched
    /// with it; sequences of many rows through cuBLAS, the rows of the others (decode steps)
    /// together, up to eight per matrix-vector launch (these kernels compute every row the same
    /// way whatever else shares the launch).
    pub(super) fn products(&self, ws: &[&CudaWeight], x: &CudaBuf, outs: &mut [&mut CudaBuf]) {
        let (t, n) = (x.rows, x.cols);
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            assert_eq!(
                n,
                w.row_len(),
                "matmul: activations of {n} columns by weight rows of {}",
                w.row_len()
            );
            out.shape_from(t, &x.runs, w.n_rows());
        }
        if t == 0 {
            return;
        }
        let (int, other): (Vec<_>, Vec<_>) = ws
            .iter()
            .zip(outs.iter())
            .map(|(w, o)| (*w, &**o))
            .partition(|(w, _)| mmq_fits(w.dev_ty, n));
        let segments = run_segments(&x.runs, t);
        if !int.is_empty() {
            // Every run of rows through the integer kernels but prompt chunks longer than
            // `mmq_max_rows`, which cuBLAS multiplies faster (the weights decoded to f16).
            let long = |len: usize| len > mmq_max_rows() && self.dev.blas.is_some();
            let mut runs: Vec<(usize, usize)> = Vec::new();
            for &(s0, len) in &segments {
                if long(len) {
                    for (w, out) in &int {
                        self.gemm(w, x, s0, len, out);
                    }
                } else if let Some(last) = runs.last_mut().filter(|l| l.0 + l.1 == s0) {
                    last.1 += len;
                } else {
                    runs.push((s0, len));
                }
            }
            if !runs.is_empty() {
                self.mmq(&int, x, &runs);
            }
        }
        if other.is_empty() {
            return;
        }
        let (long, small) = self.split_runs(x);
        for (s0, len) in long {
            for (w, out) in &other {
                self.gemm(w, x, s0, len, out);
            }
        }
        self.small_products(&other, x, &small, Fuse::None);
    }

    /// `x`'s sequences' runs of rows: those cuBLAS multiplies (long), and the rest as runs for
    /// the matrix-vector kernels (adjacent ones merged).
    fn split_runs(&self, x: &CudaBuf) -> (Runs, Runs) {
        let (mut long, mut small): (Runs, Runs) = (Vec::new(), Vec::new());
        for (s0, len) in run_segments(&x.runs, x.rows) {
            if len >= GEMM_MIN_ROWS && self.dev.blas.is_some() {
                long.push((s0, len));
            } else if let Some(last) = small.last_mut().filter(|l| l.0 + l.1 == s0) {
                last.1 += len;
            } else {
                small.push((s0, len));
            }
        }
        (long, small)
    }

    /// `x`'s rows as runs for the matrix-vector kernels (`split_runs`), or `None` where some
    /// sequence's run goes through cuBLAS.
    fn short_runs(&self, x: &CudaBuf) -> Option<Runs> {
        let (long, small) = self.split_runs(x);
        (x.rows > 0 && long.is_empty()).then_some(small)
    }

    /// The matrix-vector launches of `out = x · Wᵀ` for each `(W, out)` of `jobs`, over the row
    /// runs `small` (up to eight rows a launch; weights of one type up to three a launch), with
    /// what `fuse` adds around the products.
    fn small_products(&self, jobs: &[(&CudaWeight, &CudaBuf)], x: &CudaBuf, small: &[(usize, usize)], fuse: Fuse) {
        let n = x.cols;
        for &(s0, len) in small {
            let mut r0 = s0;
            while r0 < s0 + len {
                let rows = (s0 + len - r0).min(8);
                // Weights of one type go up to three to a launch.
                let mut done = vec![false; jobs.len()];
                for i in 0..jobs.len() {
                    if done[i] {
                        continue;
                    }
                    let group: Vec<usize> = (i..jobs.len())
                        .filter(|&j| !done[j] && jobs[j].0.dev_ty == jobs[i].0.dev_ty)
                        .take(3)
                        .collect();
                    for &j in &group {
                        done[j] = true;
                    }
                    let group: Vec<(&CudaWeight, &CudaBuf)> = group.iter().map(|&j| jobs[j]).collect();
                    let input = [A::P(x.ptr + 4 * (r0 * n) as u64)];
                    let base = format!("mmv_{}", ty_name(jobs[i].0.dev_ty));
                    self.mv(&base, &input, &group, n, r0, rows, fuse);
                }
                r0 += rows;
            }
        }
    }

    /// Rows `r0 .. r0 + rows` (at most 8) of `out = x · Wᵀ` for one to three weights of one type
    /// (`group`: each with its output) through the matrix-vector kernels `base` (mmv_TY: f32
    /// activations, `input` x's rows); each launch reads a weight once for every row. Three
    /// weights in one launch compute each row as their own launches do.
    #[allow(clippy::too_many_arguments)]
    fn mv(
        &self,
        base: &str,
        input: &[A],
        group: &[(&CudaWeight, &CudaBuf)],
        n: usize,
        r0: usize,
        rows: usize,
        fuse: Fuse,
    ) {
        let r = MMV_ROWS.iter().copied().find(|&r| r >= rows).expect("at most 8");
        // A warp per pair of rows (`mmv_TYp`, `Cuda::pairs`): the float weights' plain products
        // whose rows each get one warp.
        let pair = self.pairs
            && matches!(fuse, Fuse::None)
            && group
                .iter()
                .all(|(w, _)| FUSED_TYPES.contains(&w.dev_ty) && warps_per_row(w.n_rows(), self.wpr_cap) == 1);
        let part = |w: &CudaWeight, out: &CudaBuf| {
            let m = w.n_rows();
            let wpr = warps_per_row(m, self.wpr_cap);
            let args = [
                A::P(self.dev.ptr(&w.data)),
                A::P(w.row_bytes as u64),
                A::P(out.ptr + 4 * (r0 * m) as u64),
                A::I(m as i32),
                A::I(wpr as i32),
            ];
            let warps = if pair { m.div_ceil(2) } else { m * wpr };
            (args, blocks(warps as u64, 4))
        };
        let (suffix, extra) = fuse.args();
        let suffix = if pair { "p" } else { suffix };
        if let [(w, out)] = group {
            let ([wp, rb, o, m, wpr], nb) = part(w, out);
            let args: Vec<A> = [wp, rb]
                .into_iter()
                .chain(input.iter().copied())
                .chain([o, A::I(n as i32), m, A::I(rows as i32), wpr])
                .chain(extra)
                .collect();
            self.mv_launch(&format!("{base}{suffix}_{r}"), nb, &args);
            return;
        }
        assert!(
            matches!(fuse, Fuse::None),
            "the fused products go one weight to a launch"
        );
        assert!((2..=3).contains(&group.len()), "one to three weights per launch");
        let mut args: Vec<A> = input
            .iter()
            .copied()
            .chain([A::I(n as i32), A::I(rows as i32)])
            .collect();
        let mut total = 0;
        for (k, (w, out)) in group.iter().enumerate() {
            let (wargs, nb) = part(w, out);
            args.extend(wargs);
            total += nb;
            if k < 2 {
                args.push(A::I(nb as i32));
            }
        }
        if group.len() == 2 {
            // No third weight: its blocks are never launched.
            args.extend([A::P(0), A::P(0), A::P(0), A::I(0), A::I(1)]);
        }
        args.extend(extra);
        self.mv_launch(&format!("{base}{suffix}3_{r}"), total, &args);
    }

    /// A matrix-vector launch, in order; early (its first weights asked for while the kernel
    /// ahead ends, `kernels/matmul.cu`) with `HF2Q_CUDA_MMV_EARLY=1`, which measured slower on an
    /// H200 (8B BF16 step 4,910 vs 4,695 us of GPU time: bench/runs/2026-12-04-h200/cuda-session7).
    fn mv_launch(&self, name: &str, nb: u32, args: &[A]) {
        static EARLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *EARLY.get_or_init(|| std::env::var("HF2Q_CUDA_MMV_EARLY").is_ok_and(|v| v == "1")) {
            self.dev.launch_early(name, (nb, 1), 128, args);
        } else {
            self.dev.launch(name, (nb, 1), 128, args);
        }
    }
}
