//! Mixture-of-experts steps with the routing on the device (`kernels/mmq.cu`: `moe_route`,
//! `mmq_moe_*`): the router's product, the top-k choice and weights, every (row, slot) pair's
//! gate / up product by its expert, the GLU, the down products and the weighted sum, all launched
//! without the host reading anything, so a decode step of a MoE model is one graph like a dense
//! one. A step of a few pairs multiplies each pair on its own; a step of many (prompts, wide
//! batches) sorts the pairs by expert on the device and multiplies each expert's run of rows
//! together (`moe_group`, `mmq_moe_g_*`), as llama.cpp's MMQ with expert ids does.

use super::dev::{blocks, A};
use super::mmq::{mmq_fits, mmq_on, ActScratch};
use super::products::Fuse;
use super::{ty_name, Cuda, CudaBuf, CudaWeight};
use crate::model::blocks::{Ffn, Glu, MoeBufs, Routing};
use cudarc::driver::CudaSlice;
use gguf::GgmlType;
use std::sync::atomic::Ordering;

/// The most values of a pair's GLU that `mmq_moe_gd_*` makes in shared memory (`GLU_MAX`, mmq.cu).
const GLU_MAX: usize = 2048;

/// The most (row, slot) pairs a step multiplies each on its own: each pair reads its expert's
/// weights alone, which for one to a few decode rows is what the step reads anyway (their experts
/// mostly differ); wider steps group the pairs by expert, so each expert's weights are read once
/// per tile of its rows. `HF2Q_CUDA_MOE_PAIRS=0` turns the device path off, to compare.
fn max_pairs() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("HF2Q_CUDA_MOE_PAIRS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64)
    })
}

/// `HF2Q_CUDA_MOE_GROUPED=0` sends steps of more than `max_pairs()` pairs back to the generic
/// path (routing on the host), to compare.
fn grouped_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("HF2Q_CUDA_MOE_GROUPED").map_or(true, |v| v != "0"))
}

/// The most pairs of one grouped step: the row tiles (at most pairs / 8 + experts) are a grid
/// dimension (at most 65,535).
const MAX_GROUPED_PAIRS: usize = 8 * 60_000;

/// Pairs per row tile of the grouped products (8 · NT of `mmq_moe_g_*_NT`): about the mean run
/// of pairs per used expert, so most experts fill one or two tiles with little padding.
fn grouped_nt(pairs: usize, n_expert: usize) -> usize {
    match pairs / pairs.min(n_expert).max(1) {
        0..=10 => 1,
        11..=20 => 2,
        _ => 4,
    }
}

/// `mmq_moe_v{ST}_*` (kernels/mmq.cu: MMQ_MOE_L) for a one-row expert product of `ty` weights
/// `np` values wide whose warps' units (at most ⌈np / 1024⌉ each) need fewer stages than the
/// type's own, where there is one; `gd`: of the down products making their GLU
/// (`mmq_moe_gd_v{ST}_*`, MMQ_MOE_GD_L).
fn moe_lean_name(ty: GgmlType, np: usize, gd: bool) -> Option<&'static str> {
    use GgmlType::{Q4_K, Q6_K};
    Some(match (ty, (np / 256).div_ceil(4) + 1, gd) {
        (Q4_K, 2, false) => "mmq_moe_v2_TY_Q4_K",
        (Q4_K, 3, false) => "mmq_moe_v3_TY_Q4_K",
        (Q6_K, 2, false) => "mmq_moe_v2_TY_Q6_K",
        (Q4_K, 2, true) => "mmq_moe_gd_v2_TY_Q4_K",
        (Q6_K, 2, true) => "mmq_moe_gd_v2_TY_Q6_K",
        _ => return None,
    })
}

/// A routing launch's first arguments: the router's logits and the routing's numbers (`moe_route`,
/// `moe_route_w`, `mmq_moe_*` routing their pairs).
fn route_head(logits: u64, r: &Routing) -> [A; 5] {
    [
        A::P(logits),
        A::I(r.n_expert as i32),
        A::I(r.k as i32),
        A::I(r.softmax_first as i32),
        A::I(r.normalize as i32),
    ]
}

/// Device tables of a MoE layer's experts: the tiled weights' addresses of gate, up and down.
pub(super) struct ExpertTables {
    gate: CudaSlice<u8>,
    up: CudaSlice<u8>,
    down: CudaSlice<u8>,
    /// The addresses the tables hold (gate's, up's, down's), to tell a stale table.
    addrs: Vec<u64>,
}

impl Cuda {
    /// Routes `t` rows of router logits (`moe_route`, one block a row: ids and weights, `r.k` a
    /// row, as the CPU's `route`), launched early or in order. `HF2Q_CUDA_ROUTE_WARP=1`: by one
    /// warp a row (`moe_route_w`), to compare.
    pub(super) fn route_rows(&self, logits: u64, t: usize, r: &Routing, ids: u64, ws: u64, early: bool) {
        static WARP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let warp = *WARP.get_or_init(|| std::env::var("HF2Q_CUDA_ROUTE_WARP").is_ok_and(|v| v == "1"));
        self.route_rows_by(logits, t, r, ids, ws, early, warp);
    }

    /// `route_rows` by a block (`moe_route`) or a warp (`moe_route_w`) a row.
    #[allow(clippy::too_many_arguments)]
    fn route_rows_by(&self, logits: u64, t: usize, r: &Routing, ids: u64, ws: u64, early: bool, warp: bool) {
        let (name, block) = if warp {
            ("moe_route_w", 32)
        } else {
            ("moe_route", (r.n_expert.next_multiple_of(32)).clamp(32, 1024) as u32)
        };
        let mut args = route_head(logits, r).to_vec();
        args.extend([A::P(ids), A::P(ws)]);
        if early {
            self.dev.launch_early(name, (t as u32, 1), block, &args)
        } else {
            self.dev.launch(name, (t as u32, 1), block, &args)
        }
    }

    /// `moe_lean_name`'s kernel where the lean kernels are on (`with_moe_lean`), counted.
    fn lean_kernel(&self, ty: GgmlType, np: usize, gd: bool) -> Option<&'static str> {
        let name = self.moe_lean.then(|| moe_lean_name(ty, np, gd)).flatten();
        if name.is_some() {
            self.moe_lean_n.fetch_add(1, Ordering::Relaxed);
        }
        name
    }

    /// `Backend::moe_ffn_on_device`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_device(
        &self,
        router: &CudaWeight,
        experts: &[Ffn<Cuda>],
        r: &Routing,
        glu: Glu,
        x_route: &CudaBuf,
        x: &CudaBuf,
        bufs: &mut MoeBufs<Cuda>,
        out: &mut CudaBuf,
    ) -> bool {
        let (t, n) = (x.rows, x.cols);
        let pairs = t * r.k;
        // Up to max_pairs() pairs each on its own; more (prompts, wide batches) grouped by expert.
        let grouped = pairs > max_pairs();
        if !mmq_on() || t == 0 || max_pairs() == 0 || r.n_expert > 1024 || r.k > 63 || r.k > r.n_expert {
            return false;
        }
        if grouped && (!grouped_on() || pairs > MAX_GROUPED_PAIRS) {
            return false;
        }
        if experts.len() != r.n_expert || experts.is_empty() {
            return false;
        }
        let n_ff = experts[0].gate.n_rows();
        let (g_ty, u_ty, d_ty) = (experts[0].gate.dev_ty, experts[0].up.dev_ty, experts[0].down.dev_ty);
        // Every expert's matrices tiled, of one type per matrix (one GGUF tensor each).
        let same = experts.iter().all(|e| {
            e.gate.tiled
                && e.up.tiled
                && e.down.tiled
                && e.gate.dev_ty == g_ty
                && e.up.dev_ty == u_ty
                && e.down.dev_ty == d_ty
                && e.gate.n_rows() == n_ff
                && e.up.n_rows() == n_ff
                && e.down.row_len() == n_ff
                && e.down.n_rows() == n
        });
        if !same || !mmq_fits(g_ty, n) || !mmq_fits(u_ty, n) || !mmq_fits(d_ty, n_ff) || !n_ff.is_multiple_of(4) {
            return false;
        }
        // Was `x` quantized by the norm that made it (before the router's product may take it)?
        let seq = self.dev.seq.load(Ordering::Relaxed);
        let fused = *self.q8_of.lock().unwrap_or_else(|e| e.into_inner()) == Some((x.ptr, t, n, seq));
        let router_int = mmq_fits(router.dev_ty, x_route.cols);
        let (gate_t, up_t, down_t) = self.expert_tables(router, experts);

        // Scratch (4-byte words): gate, up, GLU output (pairs × n_ff each), weights, ids (pairs
        // each); grouped, also the sorted order, the sorted positions (pairs each), the row tiles'
        // table, and x's rows in sorted order (both flavours, from a 256-byte boundary).
        let area = pairs * n_ff;
        let n_pad = n.next_multiple_of(256);
        let nt = grouped_nt(pairs, r.n_expert);
        let max_tiles = pairs.div_ceil(8 * nt) + pairs.min(r.n_expert);
        let plain = 3 * area + 2 * pairs;
        let sorted_at = (plain + 2 * pairs + 1 + 3 * max_tiles).next_multiple_of(64);
        // Not grouped, with the GLU in the gate / up launch: its quantized output (both flavours,
        // from a 256-byte boundary), apart from x's (which other blocks of that launch still read).
        let ff_pad = n_ff.next_multiple_of(256);
        let glu_fused = !grouped && g_ty == u_ty && self.fuse_on(super::Fused::Glu);
        let glu_at = plain.next_multiple_of(64);
        let words = if grouped {
            sorted_at + 2 * (pairs * n_pad / 4 + pairs * n_pad / 32)
        } else if glu_fused {
            glu_at + 2 * (pairs * ff_pad / 4 + pairs * ff_pad / 32)
        } else {
            plain
        };
        let base = self.grown(&self.moe_scratch, words, words.max(1 << 20), "MoE scratch");
        let (gate, up, act_f) = (base, base + 4 * area as u64, base + 8 * area as u64);
        let ws = base + 12 * area as u64;
        let ids = ws + 4 * pairs as u64;
        let (order, pos) = (ids + 4 * pairs as u64, ids + 8 * pairs as u64);
        let tiles = ids + 12 * pairs as u64;
        // Launched early unless `HF2Q_CUDA_MOE_EARLY=0` (routing, down products, weighted sum).
        let launch = |name: &str, grid: (u32, u32), block: u32, args: &[A]| {
            if moe_early() {
                self.dev.launch_early(name, grid, block, args)
            } else {
                self.dev.launch(name, grid, block, args)
            }
        };
        // The router's product, then the routing: in one launch where that is on (`Fused::Route`)
        // and the router's weights are of the matrix-vector kernels' fused types.
        // Each block of the gate / up and down products routing its pair itself
        // (`Fused::RouteIn`; one gate / up launch, the down products making the GLU): no
        // moe_route.
        let route_in = !grouped
            && self.fuse_on(super::Fused::RouteIn)
            && !self.fuse_on(super::Fused::Route)
            && !self.fuse_on(super::Fused::Glu)
            && r.n_expert <= 256
            && g_ty == u_ty
            && ff_pad <= GLU_MAX
            && super::mmq::mmq_v_on();
        let routed = !route_in && self.fuse_on(super::Fused::Route) && {
            let cnt = self.grown_zeroed(&self.dev.route_cnt, 1, "MoE routing counter");
            let route = Fuse::Route {
                cnt,
                k: r.k as i32,
                softmax_first: r.softmax_first as i32,
                normalize: r.normalize as i32,
                ids,
                ws,
            };
            self.router_routed(router, x_route, &mut bufs.router, route)
        };
        if !routed {
            self.products(&[router], x_route, &mut [&mut bufs.router]);
        }
        if !routed && !route_in {
            self.route_rows(bufs.router.ptr, t, r, ids, ws, moe_early());
        }
        // x in the integer kernels' layout (both flavours), unless its norm left it there and the
        // router's product (an integer one on x itself) did not need the scratch for another input.
        let act = self.act_scratch(t, n_pad);
        if !(fused && (!router_int || x_route.ptr == x.ptr)) {
            self.quantize_into(x, act, true, true);
        }
        let flavour = |ty: GgmlType, a: ActScratch| {
            if ty == GgmlType::Q8_0 {
                (a.q0, a.d0)
            } else {
                (a.qk, a.dk)
            }
        };
        // `early`: launched before the kernel ahead ends (the down products: the expert ids they
        // read first were written by moe_route, finished before the gate / up products started).
        // `glu`: gate and up, then their GLU quantized by each pair's last block (`mmq_moe_glu_*`;
        // not grouped): the arguments after the products'.
        let expert_mm = |ty: GgmlType,
                         a: ActScratch,
                         np: usize,
                         div: usize,
                         m: usize,
                         mats: &[(u64, u64)],
                         early: bool,
                         glu: &[A]| {
            let (qa, ad) = flavour(ty, a);
            let (t1, o1) = mats.get(1).copied().unwrap_or((0, 0));
            let mut args = vec![A::P(qa), A::P(ad), A::I(np as i32), A::I((np / 256) as i32)];
            let (name, grid) = if grouped {
                // Grid (mats · weight tiles, row tiles at most); the pairs through the tile table.
                args.push(A::P(tiles));
                (
                    format!("mmq_moe_g_{}_{nt}", ty_name(ty)),
                    ((mats.len() * m.div_ceil(16)) as u32, max_tiles as u32),
                )
            } else {
                args.extend([A::P(ids), A::I(div as i32)]);
                let v = if super::mmq::mmq_v_on() { "v_" } else { "" };
                let g = if glu.is_empty() { "" } else { "glu_" };
                // The lean kernels where they take the product.
                let lean = (glu.is_empty() && !v.is_empty())
                    .then(|| self.lean_kernel(ty, np, false))
                    .flatten();
                (
                    lean.map_or_else(|| format!("mmq_moe_{g}{v}{}", ty_name(ty)), str::to_string),
                    ((pairs * m.div_ceil(16)) as u32, mats.len() as u32),
                )
            };
            args.extend([A::I(m as i32), A::P(mats[0].0), A::P(mats[0].1), A::P(t1), A::P(o1)]);
            args.extend(glu);
            if early && !grouped && (ty != GgmlType::Q8_0 || super::mmq::pdl_q8()) {
                launch(&name, grid, 128, &args);
            } else {
                self.dev.launch(&name, grid, 128, &args);
            }
        };
        let act = if grouped {
            // The pairs sorted by expert, and x's rows in that order.
            self.dev.launch(
                "moe_group",
                (1, 1),
                1024,
                &[
                    A::P(ids),
                    A::I(pairs as i32),
                    A::I(r.n_expert as i32),
                    A::I(8 * nt as i32),
                    A::P(order),
                    A::P(pos),
                    A::P(tiles),
                ],
            );
            let k_flavour = g_ty != GgmlType::Q8_0 || u_ty != GgmlType::Q8_0;
            let q0_flavour = g_ty == GgmlType::Q8_0 || u_ty == GgmlType::Q8_0;
            let pick = |on: bool, p: u64| if on { p } else { 0 };
            let sorted = ActScratch::packed(base + 4 * sorted_at as u64, pairs * n_pad);
            self.dev.launch(
                "gather_act",
                (pairs as u32, 1),
                128,
                &[
                    A::P(pick(q0_flavour, act.q0)),
                    A::P(act.d0),
                    A::P(pick(k_flavour, act.qk)),
                    A::P(act.dk),
                    A::I(n_pad as i32),
                    A::P(order),
                    A::I(r.k as i32),
                    A::P(sorted.q0),
                    A::P(sorted.d0),
                    A::P(sorted.qk),
                    A::P(sorted.dk),
                ],
            );
            sorted
        } else {
            act
        };
        let op = match glu {
            Glu::Swiglu => 2,
            Glu::Geglu => 3,
        };
        // The down products making each pair's GLU themselves (`Fused::GluDown`): no glu_q8.
        let glu_down = route_in
            || (!grouped
                && !glu_fused
                && ff_pad <= GLU_MAX
                && super::mmq::mmq_v_on()
                && self.fuse_on(super::Fused::GluDown));
        let act2 = if glu_fused {
            // The GLU of every pair, quantized for the down products, by the gate / up launch.
            let act2 = ActScratch::packed(base + 4 * glu_at as u64, pairs * ff_pad);
            let cnt = self.grown_zeroed(&self.dev.glu_cnt, pairs, "MoE GLU counters");
            let mut tail = vec![A::P(cnt), A::P(act_f)];
            tail.extend(act2.args());
            tail.extend([A::I(ff_pad as i32), A::I(op)]);
            expert_mm(g_ty, act, n_pad, r.k, n_ff, &[(gate_t, gate), (up_t, up)], false, &tail);
            self.count_fused(super::Fused::Glu);
            act2
        } else {
            if route_in {
                let (qa, ad) = flavour(g_ty, act);
                let mut args = vec![A::P(qa), A::P(ad), A::I(n_pad as i32), A::I((n_pad / 256) as i32)];
                args.extend(route_head(bufs.router.ptr, r));
                args.extend([A::P(ids), A::P(ws), A::I(r.k as i32), A::I(n_ff as i32)]);
                args.extend([A::P(gate_t), A::P(gate), A::P(up_t), A::P(up)]);
                let grid = ((pairs * n_ff.div_ceil(16)) as u32, 2);
                self.dev
                    .launch(&format!("mmq_moe_r_v_{}", ty_name(g_ty)), grid, 128, &args);
                self.count_fused(super::Fused::RouteIn);
            } else if g_ty == u_ty {
                expert_mm(g_ty, act, n_pad, r.k, n_ff, &[(gate_t, gate), (up_t, up)], false, &[]);
            } else {
                expert_mm(g_ty, act, n_pad, r.k, n_ff, &[(gate_t, gate)], false, &[]);
                expert_mm(u_ty, act, n_pad, r.k, n_ff, &[(up_t, up)], false, &[]);
            }
            if glu_down {
                bufs.slots.set_shape(pairs, n);
                let args = [
                    A::P(gate),
                    A::P(up),
                    A::I(n_ff as i32),
                    A::I(op),
                    A::I(ff_pad as i32),
                    A::I((ff_pad / 256) as i32),
                    A::P(ids),
                    A::I(n as i32),
                    A::P(down_t),
                    A::P(bufs.slots.ptr),
                ];
                let args: Vec<A> = args
                    .into_iter()
                    .chain(route_head(if route_in { bufs.router.ptr } else { 0 }, r))
                    .collect();
                let lean = self.lean_kernel(d_ty, ff_pad, true);
                let name = lean.map_or_else(|| format!("mmq_moe_gd_v_{}", ty_name(d_ty)), str::to_string);
                if d_ty != GgmlType::Q8_0 || super::mmq::pdl_q8() {
                    launch(&name, ((pairs * n.div_ceil(16)) as u32, 1), 128, &args);
                } else {
                    self.dev.launch(&name, ((pairs * n.div_ceil(16)) as u32, 1), 128, &args);
                }
                self.count_fused(super::Fused::GluDown);
                return self.moe_sum(t, r.k, n, bufs, 0, ws, out);
            }
            // The GLU of every pair, quantized for the down products (the scratch's first pairs
            // rows).
            let act2 = self.act_scratch(pairs, ff_pad);
            let mut args = vec![A::P(gate), A::P(up), A::P(act_f)];
            args.extend(act2.args());
            args.extend([A::I(n_ff as i32), A::I(ff_pad as i32), A::I(op)]);
            self.dev
                .launch_early("glu_q8", (pairs as u32, (ff_pad / 256) as u32), 64, &args);
            act2
        };
        bufs.slots.set_shape(pairs, n);
        expert_mm(d_ty, act2, ff_pad, 1, n, &[(down_t, bufs.slots.ptr)], true, &[]);
        // Grouped, the slots are in sorted order: each pair's row found through its position.
        self.moe_sum(t, r.k, n, bufs, if grouped { pos } else { 0 }, ws, out)
    }

    /// The weighted sum of each row's k slots (rows `pos[p]` of the slots where `pos` is not 0)
    /// into `out` (t rows of n); true.
    #[allow(clippy::too_many_arguments)]
    fn moe_sum(
        &self,
        t: usize,
        k: usize,
        n: usize,
        bufs: &MoeBufs<Cuda>,
        pos: u64,
        ws: u64,
        out: &mut CudaBuf,
    ) -> bool {
        out.set_shape(t, n);
        let args = [
            A::P(bufs.slots.ptr),
            A::P(pos),
            A::P(ws),
            A::P(out.ptr),
            A::I(t as i32),
            A::I(k as i32),
            A::I(n as i32),
        ];
        let grid = (t as u32, blocks(n as u64, 256));
        if moe_early() {
            self.dev.launch_early("weighted_sum_rows", grid, 256, &args);
        } else {
            self.dev.launch("weighted_sum_rows", grid, 256, &args);
        }
        true
    }

    /// The device addresses of a MoE layer's expert tables, gate, up and down (made at its first
    /// step, kept as long as the backend). Found by the router's address and checked against every
    /// expert's current addresses: a model loaded after another was dropped can reuse its
    /// addresses, and a table of freed weights must not be taken for it (a stale one is remade).
    fn expert_tables(&self, router: &CudaWeight, experts: &[Ffn<Cuda>]) -> (u64, u64, u64) {
        let key = self.dev.ptr(&router.data);
        let ptrs = |f: fn(&Ffn<Cuda>) -> &CudaWeight| experts.iter().map(move |e| self.dev.ptr(&f(e).data));
        let addrs: Vec<u64> = ptrs(|e| &e.gate)
            .chain(ptrs(|e| &e.up))
            .chain(ptrs(|e| &e.down))
            .collect();
        let mut all = self.moe_tables.lock().unwrap_or_else(|e| e.into_inner());
        if all.iter().any(|(k, t)| *k == key && t.addrs != addrs) {
            // Launches recorded so far may read the stale table: issue them before it is freed.
            self.dev.flush();
            all.retain(|(k, t)| *k != key || t.addrs == addrs);
        }
        if !all.iter().any(|(k, _)| *k == key) {
            let table = |part: &[u64]| -> CudaSlice<u8> {
                let bytes: Vec<u8> = part.iter().flat_map(|a| a.to_le_bytes()).collect();
                let mut s = self
                    .dev
                    .alloc_bytes(bytes.len())
                    .unwrap_or_else(|e| self.dev.fail("allocating a MoE layer's expert table", e));
                self.dev
                    .stream
                    .memcpy_htod(&bytes, &mut s)
                    .unwrap_or_else(|e| self.dev.fail("uploading a MoE layer's expert table", e));
                s
            };
            let ne = experts.len();
            let t = ExpertTables {
                gate: table(&addrs[..ne]),
                up: table(&addrs[ne..2 * ne]),
                down: table(&addrs[2 * ne..]),
                addrs,
            };
            all.push((key, t));
        }
        let (_, t) = all.iter().find(|(k, _)| *k == key).expect("made above");
        (self.dev.ptr(&t.gate), self.dev.ptr(&t.up), self.dev.ptr(&t.down))
    }
}

/// Whether the routing, the down products (non-grouped) and the weighted sum of a MoE step are
/// launched before the kernel ahead of each ends (`HF2Q_CUDA_MOE_EARLY=0`: in order, to compare).
fn moe_early() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("HF2Q_CUDA_MOE_EARLY").map_or(true, |v| v != "0"))
}

#[cfg(test)]
mod tests {
    use crate::backend::tests::cuda::cuda;
    use crate::backend::Backend;
    use crate::model::blocks::{route, Routing};

    /// `moe_route` (a block a row) against `moe_route_w` (a warp a row, the routing the `moe` op
    /// test checks against the host's) bit for bit, and both against the CPU's `route`: the same
    /// experts in the same order, weights within 1e-6 (the device's `expf` against Rust's `exp`:
    /// a few ulps). Rows whose softmax sum is exact as a tree (logits within ±6), rows that take
    /// the in-order sum (±40: terms under 2^-20), rows of tied logits (ties go to the lower id).
    #[test]
    fn routing() {
        let Some(b) = cuda("routing") else {
            return;
        };
        for (ne, k) in [(8, 2), (16, 4), (60, 5), (128, 8), (160, 6), (256, 8), (1000, 63)] {
            for (softmax_first, normalize) in [(true, true), (true, false), (false, true), (false, false)] {
                let r = Routing {
                    n_expert: ne,
                    k,
                    softmax_first,
                    normalize,
                };
                let raw = crate::backend::tests::values(4 * ne, 7 + ne as u64);
                let logits: Vec<f32> = raw
                    .chunks(ne)
                    .zip([1.0f32, 6.0, 40.0, 2.0])
                    .enumerate()
                    .flat_map(|(row, (c, s))| {
                        c.iter()
                            .map(move |&v| if row == 3 { (v * 4.0).round() / 4.0 } else { v * s })
                            .collect::<Vec<_>>()
                    })
                    .collect();
                let (want_ids, want_ws) = route(&logits, &r);
                let got: Vec<(Vec<f32>, Vec<f32>)> = [false, true]
                    .iter()
                    .map(|&warp| {
                        b.run(|| {
                            let mut x = b.alloc(4, ne);
                            b.write(&mut x, 4, ne, &logits);
                            let (ids, ws) = (b.alloc(4, k), b.alloc(4, k));
                            b.route_rows_by(x.ptr, 4, &r, ids.ptr, ws.ptr, false, warp);
                            (b.read(&ids), b.read(&ws))
                        })
                    })
                    .collect();
                let what = format!("{ne} experts, k {k}, softmax first {softmax_first}, normalize {normalize}");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got[0].0), bits(&got[1].0), "{what}: block and warp ids differ");
                assert_eq!(
                    bits(&got[0].1),
                    bits(&got[1].1),
                    "{what}: block and warp weights differ"
                );
                let ids: Vec<usize> = got[0].0.iter().map(|v| v.to_bits() as usize).collect();
                assert_eq!(ids, want_ids, "{what}: ids differ from the CPU's");
                for (i, (g, w)) in got[0].1.iter().zip(&want_ws).enumerate() {
                    assert!((g - w).abs() <= 1e-6, "{what}: weight {i}: {g} against the CPU's {w}");
                }
            }
        }
        // Logits that are not all finite numbers (a broken model's), by the block's routing (the
        // default) and the warp's: k distinct ids below n_expert in every row; taken as they are (no softmax
        // first), the CPU's ids (f32::total_cmp's order) and weights (NaN where the CPU's are).
        // After a softmax the NaNs' bits are the platform's (x86 and the GPU make different ones),
        // so there only the ids' validity is checked. Rows: a NaN among them; +inf; -inf and NaN;
        // ±0 ties at the top.
        let ne = 16;
        let mut logits = crate::backend::tests::values(4 * ne, 31);
        logits[5] = f32::NAN;
        logits[ne + 9] = f32::INFINITY;
        logits[2 * ne + 1] = f32::NEG_INFINITY;
        logits[2 * ne + 12] = f32::NAN;
        for (i, v) in logits[3 * ne..].iter_mut().enumerate() {
            *v = if i % 2 == 0 { -0.0 } else { 0.0 };
        }
        for (softmax_first, normalize, warp) in [(true, true), (false, true), (false, false)]
            .into_iter()
            .flat_map(|(s, n)| [(s, n, false), (s, n, true)])
        {
            let r = Routing {
                n_expert: ne,
                k: 4,
                softmax_first,
                normalize,
            };
            let (want_ids, want_ws) = route(&logits, &r);
            let (ids, ws) = b.run(|| {
                let mut x = b.alloc(4, ne);
                b.write(&mut x, 4, ne, &logits);
                let (ids, ws) = (b.alloc(4, 4), b.alloc(4, 4));
                b.route_rows_by(x.ptr, 4, &r, ids.ptr, ws.ptr, false, warp);
                (b.read(&ids), b.read(&ws))
            });
            let what = format!("non-finite logits, softmax first {softmax_first}, normalize {normalize}, warp {warp}");
            let ids: Vec<usize> = ids.iter().map(|v| v.to_bits() as usize).collect();
            for row in ids.chunks(4) {
                let mut seen = row.to_vec();
                seen.sort_unstable();
                seen.dedup();
                assert!(seen.len() == 4 && seen[3] < ne, "{what}: ids {row:?}");
            }
            if softmax_first {
                continue;
            }
            assert_eq!(ids, want_ids, "{what}: ids differ from the CPU's");
            for (i, (g, w)) in ws.iter().zip(&want_ws).enumerate() {
                let same = (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-6;
                assert!(same, "{what}: weight {i}: {g} against the CPU's {w}");
            }
        }
    }
}
