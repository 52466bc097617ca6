//! The integer tensor-core products (`kernels/mmq.cu`) as the backend drives them: which weights
//! take them, the tiled layout made at load, the activations' scratch, and the launches.

use super::dev::{blocks, A};
use super::{ty_name, Cuda, CudaBuf, CudaWeight};
use cudarc::driver::CudaSlice;
use gguf::GgmlType;
use std::sync::atomic::Ordering;

/// Weight types multiplied by the integer tensor-core kernels (`kernels/mmq.cu`) for every row
/// count — decode steps, batches of streams and prompts alike — from activations rounded as the
/// CPU backend's integer products round them (q8_0 for Q8_0, q8_K for the K-quants). Their rows
/// must be whole blocks; the weights are kept in the kernels' tiled layout.
pub(super) const MMQ_TYPES: &[GgmlType] = &[GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0];
/// Activation columns per n-tile of the integer kernels, and the most n-tiles per launch.
pub(super) const MMQ_NT: [usize; 4] = [1, 2, 4, 8];
/// The n-tiles of the grouped MoE products (`kernels/mmq.cu`: `mmq_moe_g_*`; `moe::grouped_nt`).
pub(super) const MMQ_MOE_NT: [usize; 3] = [1, 2, 4];

/// Whether the integer tensor-core kernels are on (`HF2Q_CUDA_MMQ=0` sends their types through
/// the f32 matrix-vector kernels and cuBLAS instead, to compare).
pub(super) fn mmq_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("HF2Q_CUDA_MMQ").is_none_or(|v| v != "0"))
}

/// Whether Q8_0's products are launched early too (programmatic dependent launch, `dev.pdl`):
/// `HF2Q_CUDA_PDL_Q8=1`.
pub(super) fn pdl_q8() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("HF2Q_CUDA_PDL_Q8").is_ok_and(|v| v == "1"))
}

/// Whether products of one activation row (batch-1 decode steps, MoE pairs) take the dp4a
/// kernels (`mmq_v_*`, `mmq_moe_v_*`: the same sums as the tensor-core ones, bit for bit, in
/// fewer instructions); `HF2Q_CUDA_MMQ_V=0` sends them through the tensor-core kernels, to compare.
pub(super) fn mmq_v_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("HF2Q_CUDA_MMQ_V").is_none_or(|v| v != "0"))
}

/// The most n-tiles of 8 activation rows one integer-kernel block takes (`HF2Q_CUDA_MMQ_NT=1|2|4`
/// caps it below 8, to compare): more rows than this are more column tiles.
fn mmq_nt_max() -> usize {
    static NT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *NT.get_or_init(|| {
        std::env::var("HF2Q_CUDA_MMQ_NT")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|v| MMQ_NT.contains(v))
            .unwrap_or(8)
    })
}

/// The longest run of one sequence's rows (a prompt chunk) the integer kernels multiply; longer
/// ones go through cuBLAS (`HF2Q_CUDA_MMQ_ROWS=N` moves the line, to compare). Measured on an H200
/// (bench/runs/2026-12-03-h200): 512-row prompt chunks of an 8B model run at 13.8K tokens/s through
/// cuBLAS and 5.8K through the integer kernels.
pub(super) fn mmq_max_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        std::env::var("HF2Q_CUDA_MMQ_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(128)
    })
}

/// The types whose one-row products share a launch (`mmq_vx_*`: the first's slots first).
const MIX: [GgmlType; 2] = [GgmlType::Q4_K, GgmlType::Q6_K];

/// Whether one-row products of Q4_K and Q6_K weights share launches (`HF2Q_CUDA_MMQ_MIX=0`: a
/// launch per type, to compare): a Q4_K_M file's Q / K / V in one launch where its V is Q6_K. MoE
/// tg128 on an H100: 733.98 against 725.51 tokens/s (1.012×, bench/runs/2026-12-05-h100-e call 3).
fn mmq_mix_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("HF2Q_CUDA_MMQ_MIX").is_none_or(|v| v != "0"))
}

/// Whether weights of type `ty` with rows of `n` values go through the integer kernels.
pub(super) fn mmq_fits(ty: GgmlType, n: usize) -> bool {
    let qk = if ty == GgmlType::Q8_0 { 32 } else { 256 };
    mmq_on() && MMQ_TYPES.contains(&ty) && n.is_multiple_of(qk)
}

/// Bytes of one tile's unit (16 rows × 256 values) in the integer kernels' layout.
pub(super) fn mmq_unit_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K => 2304,
        GgmlType::Q6_K => 3360,
        GgmlType::Q8_0 => 4352,
        _ => unreachable!("only MMQ_TYPES are tiled"),
    }
}

/// Device addresses of the integer products' activations (`Cuda::act_scratch`).
#[derive(Clone, Copy)]
pub(super) struct ActScratch {
    /// q8_0 flavour: values and per-32 scales.
    pub(super) q0: u64,
    pub(super) d0: u64,
    /// q8_K flavour.
    pub(super) qk: u64,
    pub(super) dk: u64,
}

impl ActScratch {
    /// Both flavours of `count` values from `base` (256-byte aligned): the q8_0 values, the q8_K
    /// values, then their scales.
    pub(super) fn packed(base: u64, count: usize) -> ActScratch {
        let d0 = base + 2 * count as u64;
        ActScratch {
            q0: base,
            qk: base + count as u64,
            d0,
            dk: d0 + 4 * (count / 32) as u64,
        }
    }

    /// The kernels' arguments `q0, d0, qk, dk`.
    pub(super) fn args(self) -> [A; 4] {
        [A::P(self.q0), A::P(self.d0), A::P(self.qk), A::P(self.dk)]
    }
}

impl Cuda {
    /// `out = x · Wᵀ` for every row of `x` through the integer tensor-core kernels
    /// (`kernels/mmq.cu`), weights of one type up to three to a launch (one-row products of Q4_K
    /// and Q6_K weights together: `mmq_mix_on`). The activations are
    /// quantized once (or were, by the rms_norm or GLU that made them).
    pub(super) fn mmq(&self, pairs: &[(&CudaWeight, &CudaBuf)], x: &CudaBuf, runs: &[(usize, usize)]) {
        let (t, n) = (x.rows, x.cols);
        let n_pad = n.next_multiple_of(256);
        let act = self.act_scratch(t, n_pad);
        let fused = self.q8_of.lock().unwrap_or_else(|e| e.into_inner()).take();
        if fused != Some((x.ptr, t, n, self.dev.seq.load(Ordering::Relaxed))) {
            let q0 = pairs.iter().any(|(w, _)| w.dev_ty == GgmlType::Q8_0);
            let qk = pairs.iter().any(|(w, _)| w.dev_ty != GgmlType::Q8_0);
            self.quantize_into(x, act, q0, qk);
        }
        for &(r0, rows) in runs {
            self.mmq_rows(pairs, act, n, r0, rows);
        }
    }

    /// Rows `r0 .. r0 + t` of `out = x · Wᵀ` through the integer kernels, from the activations
    /// quantized in `act`.
    fn mmq_rows(&self, pairs: &[(&CudaWeight, &CudaBuf)], act: ActScratch, n: usize, r0: usize, t: usize) {
        let n_pad = n.next_multiple_of(256);
        let cap = mmq_nt_max();
        let nt = MMQ_NT.iter().copied().find(|&k| 8 * k >= t || k == cap).unwrap_or(cap);
        let ct = t.div_ceil(8 * nt);
        let units = n_pad / 256;
        let mut done = vec![false; pairs.len()];
        for i in 0..pairs.len() {
            if done[i] {
                continue;
            }
            let ty = pairs[i].0.dev_ty;
            // One-row products of Q4_K and Q6_K weights go up to three to a launch together
            // (`mmq_vx_*`), the Q4_K ones first.
            let mix = t == 1 && mmq_v_on() && mmq_mix_on() && MIX.contains(&ty);
            let mut group: Vec<usize> = (i..pairs.len())
                .filter(|&j| !done[j] && (pairs[j].0.dev_ty == ty || mix && MIX.contains(&pairs[j].0.dev_ty)))
                .take(3)
                .collect();
            group.sort_by_key(|&j| pairs[j].0.dev_ty != MIX[0]);
            let na = group.iter().filter(|&&j| pairs[j].0.dev_ty == MIX[0]).count();
            let mixed = na > 0 && na < group.len();
            let ty = pairs[group[0]].0.dev_ty;
            let (qa, ad) = if ty == GgmlType::Q8_0 {
                (act.q0, act.d0)
            } else {
                (act.qk, act.dk)
            };
            let (qa, ad) = (qa + (r0 * n_pad) as u64, ad + 4 * (r0 * n_pad / 32) as u64);
            let mut args = vec![
                A::P(qa),
                A::P(ad),
                A::I(n_pad as i32),
                A::I(units as i32),
                A::I(t as i32),
                A::I(ct as i32),
            ];
            let mut total = 0u32;
            for (k, &j) in group.iter().enumerate() {
                done[j] = true;
                let (w, out) = pairs[j];
                let m = w.n_rows();
                let nb = (m.div_ceil(16) * ct) as u32;
                total += nb;
                args.extend([A::P(self.tiled(w)), A::P(out.ptr + 4 * (r0 * m) as u64), A::I(m as i32)]);
                if k < 2 {
                    args.push(A::I(nb as i32));
                }
            }
            // Slots of absent weights: their blocks are never launched.
            for k in group.len()..3 {
                args.extend([A::P(0), A::P(0), A::I(0)]);
                if k < 2 {
                    args.push(A::I(0));
                }
            }
            if mixed {
                args.push(A::I(na as i32));
            }
            // May start while the kernel before it runs: it reads its weights, then waits.
            let name = if mixed {
                let v5 = total <= self.mmq_v5_blocks;
                format!(
                    "mmq_vx{}_{}_{}",
                    if v5 { "5" } else { "" },
                    ty_name(MIX[0]),
                    ty_name(MIX[1])
                )
            } else if t == 1 && mmq_v_on() {
                let v5 = ty == GgmlType::Q4_K && total <= self.mmq_v5_blocks;
                format!("mmq_v{}_{}", if v5 { "5" } else { "" }, ty_name(ty))
            } else {
                format!("mmq_{}_{nt}", ty_name(ty))
            };
            // (Q8_0's products launched in order: early, they made the 8B Q8_0's decode step
            // 143 µs longer on an H200, 3,447 against 3,304 µs, where Q4_K's gained 17 µs and the
            // MoE's 56; bench/runs/2026-12-04-h200/cuda-session5 calls 21, 23.
            // HF2Q_CUDA_PDL_Q8=1 launches them early too.)
            if ty == GgmlType::Q8_0 && !pdl_q8() {
                self.dev.launch(&name, (total, 1), 128, &args);
            } else {
                self.dev.launch_early(&name, (total, 1), 128, &args);
            }
        }
    }

    /// The device address of `w` in the integer kernels' tiled layout (made now for a weight kept
    /// in GGUF rows, once).
    fn tiled(&self, w: &CudaWeight) -> u64 {
        if w.tiled {
            return self.dev.ptr(&w.data);
        }
        let t = w.tiled_copy.get_or_init(|| {
            self.tile(w)
                .unwrap_or_else(|e| self.dev.fail("allocating a tiled copy of a weight", e))
        });
        self.dev.ptr(t)
    }

    /// `w` (in GGUF rows) in the integer kernels' tiled layout: tiles of 16 rows, units of 256
    /// values, zero-padded (`kernels/mmq.cu`).
    pub(super) fn tile(&self, w: &CudaWeight) -> std::result::Result<CudaSlice<u8>, cudarc::driver::DriverError> {
        let (n, m) = (w.row_len(), w.n_rows());
        let units = n.div_ceil(256);
        let total = m.div_ceil(16) * units * mmq_unit_bytes(w.dev_ty);
        let nb = if w.dev_ty == GgmlType::Q8_0 { n / 32 } else { n / 256 };
        let out = self.dev.alloc_bytes(total)?;
        self.dev.launch(
            &format!("tile_{}", ty_name(w.dev_ty)),
            (blocks(total as u64, 256), 1),
            256,
            &[
                A::P(self.dev.ptr(&w.data)),
                A::P(self.dev.ptr(&out)),
                A::I(m as i32),
                A::P(w.row_bytes as u64),
                A::I(units as i32),
                A::I(nb as i32),
                A::P(total as u64),
            ],
        );
        Ok(out)
    }

    /// The integer products' activation scratch for `rows` rows of `n_pad` values (a multiple of
    /// 256; `common.cuh`, act_q8): both flavours' int8 values and per-32 scales.
    /// `x`'s rows into the activation scratch `act`: the q8_0 flavour if `q0`, the q8_K one if `qk`.
    pub(super) fn quantize_into(&self, x: &CudaBuf, act: ActScratch, q0: bool, qk: bool) {
        let (t, n) = (x.rows, x.cols);
        let n_pad = n.next_multiple_of(256);
        self.dev.launch(
            "quantize_act",
            (t as u32, (n_pad / 256) as u32),
            256,
            &[
                A::P(x.ptr),
                A::I(n as i32),
                A::I(n_pad as i32),
                A::P(if q0 { act.q0 } else { 0 }),
                A::P(if q0 { act.d0 } else { 0 }),
                A::P(if qk { act.qk } else { 0 }),
                A::P(if qk { act.dk } else { 0 }),
            ],
        );
    }

    pub(super) fn act_scratch(&self, rows: usize, n_pad: usize) -> ActScratch {
        let count = rows * n_pad;
        let need = 2 * count + 2 * 4 * (count / 32);
        let base = self.grown(&self.dev.q8, need, need.max(64 * 16384 * 9 / 4), "activation scratch");
        ActScratch::packed(base, count)
    }
}
