//! CPU dot products of one weight row with up to [`MAX_COLS`] activation rows, the way ggml's CPU
//! backend computes `mul_mat`: activations are first converted to the weight type's `vec_dot_type`
//! (Q8_0, Q8_1, Q8_K, F16, BF16 or F32; `ggml-cpu/ggml-cpu.c` type_traits_cpu), then each weight
//! block is multiplied with the matching activation block in integers and scaled in f32.
//!
//! Every type has a scalar reference ([`scalar`]); the common ones have AVX2 kernels ([`avx2`],
//! with AVX-512 VNNI variants) on x86-64 and NEON kernels ([`neon`]) on aarch64, chosen at run
//! time. Types without an integer kernel use a generic path that dequantizes the
//! weight block and the activation block and multiplies in f32 (the same sum, different rounding).

use crate::GgmlType;

pub mod packed;
pub mod scalar;

#[cfg(target_arch = "x86_64")]
pub mod avx2;

#[cfg(target_arch = "aarch64")]
pub mod neon;

/// How many activation rows one kernel call handles (weight blocks are unpacked once for all).
pub const MAX_COLS: usize = 4;

/// `out[c] = dot(weight_row, acts[c])` (weight of type `w_type`) for `c < acts.len() <= MAX_COLS`; `n` values per row.
pub type DotFn = fn(w_type: GgmlType, n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]);

/// Several weight rows at once (2 or [`MAX_ROWS`]): `out[r][c] = dot(ws[r], acts[c])`. Each
/// result is summed in the same order as [`DotFn`]'s; the rows only give the CPU more independent
/// accumulator chains and reuse of each loaded activation block.
pub type DotRowsFn = fn(w_type: GgmlType, n: usize, ws: &[&[u8]], acts: &[&[u8]], out: &mut [[f32; MAX_COLS]]);

/// The most weight rows a [`DotRowsFn`] takes.
pub const MAX_ROWS: usize = 4;

/// The kernel family to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelPath {
    Scalar,
    Avx2,
    Neon,
}

impl KernelPath {
    /// The widest path this CPU supports, unless `HF2Q_KERNEL=scalar` forces the reference.
    /// Decided once per process (activation conversion asks for every row).
    pub fn detect() -> KernelPath {
        static PATH: std::sync::OnceLock<KernelPath> = std::sync::OnceLock::new();
        *PATH.get_or_init(|| {
            if std::env::var("HF2Q_KERNEL").is_ok_and(|v| v == "scalar") {
                return KernelPath::Scalar;
            }
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
                return KernelPath::Avx2;
            }
            // NEON is part of the aarch64 baseline.
            #[cfg(target_arch = "aarch64")]
            return KernelPath::Neon;
            #[allow(unreachable_code)]
            KernelPath::Scalar
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Scalar => "scalar",
            KernelPath::Avx2 => "avx2",
            KernelPath::Neon => "neon",
        }
    }
}

/// The type activations are converted to before a dot product with a weight of type `w`
/// (ggml-cpu.c `type_traits_cpu[w].vec_dot_type`). `None` when hf2q cannot multiply by `w`.
pub fn vec_dot_type(w: GgmlType) -> Option<GgmlType> {
    use GgmlType as T;
    Some(match w {
        T::F32 => T::F32,
        T::F16 => T::F16,
        T::BF16 => T::BF16,
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::MXFP4 => T::Q8_0,
        T::Q4_1 | T::Q5_1 => T::Q8_1,
        T::Q2_K
        | T::Q3_K
        | T::Q4_K
        | T::Q5_K
        | T::Q6_K
        | T::IQ4_XS
        | T::IQ2_XXS
        | T::IQ2_XS
        | T::IQ2_S
        | T::IQ3_XXS
        | T::IQ3_S
        | T::IQ1_S
        | T::IQ1_M
        | T::TQ1_0
        | T::TQ2_0 => T::Q8_K,
        _ => return None,
    })
}

/// A matrix-vector kernel for one weight type: the activation type and the dot function.
/// Weight rows unpacked once into whole-byte blocks for a batch: every block's quants decoded
/// from nibbles and high bits once per row instead of once per group of activation rows. The
/// integers and scales are the same, so the sums are bit for bit those of the packed kernels.
#[derive(Clone, Copy)]
pub struct Unpacked {
    /// Bytes of one unpacked block of 32 values.
    pub block_bytes: usize,
    /// Unpack one row of `n` values (`src` in the weight type, `dst` `n / 32 * block_bytes`).
    pub unpack: fn(n: usize, src: &[u8], dst: &mut [u8]),
    pub dot: DotFn,
    pub rows: DotRowsFn,
}

#[derive(Clone, Copy)]
pub struct Kernel {
    pub weight: GgmlType,
    pub act: GgmlType,
    pub dot: DotFn,
    /// Several rows per call (2 up to `max_rows`, even), where the path has such a kernel.
    pub rows: Option<DotRowsFn>,
    pub max_rows: usize,
    /// For batches of at least `batch_min` activation rows, a kernel summing in the order
    /// llama.cpp uses for such batches where that differs from its vec_dot (then used for every
    /// row instead of `dot` and `rows`).
    pub batch: Option<DotFn>,
    pub batch_min: usize,
    /// For batches of at least [`UNPACK_MIN`] activation rows: weight rows unpacked to whole
    /// bytes once per tile (same sums, fewer instructions per product), where the path has it.
    pub unpacked: Option<Unpacked>,
    pub path: KernelPath,
}

/// The smallest batch for which [`Kernel::unpacked`] pays for unpacking a tile of rows.
pub const UNPACK_MIN: usize = 16;

impl Kernel {
    /// A kernel with only the one-row dot product (no several-row or batch variants).
    fn single(weight: GgmlType, act: GgmlType, dot: DotFn, path: KernelPath) -> Kernel {
        Kernel {
            weight,
            act,
            dot,
            rows: None,
            max_rows: 1,
            batch: None,
            batch_min: usize::MAX,
            unpacked: None,
            path,
        }
    }
}

/// The kernel for weights of type `w` on `path` (falling back to the scalar kernel where the path
/// has none for `w`). `None` when `w` cannot be multiplied at all.
pub fn kernel(w: GgmlType, path: KernelPath) -> Option<Kernel> {
    let act = vec_dot_type(w)?;
    #[cfg(target_arch = "x86_64")]
    if path == KernelPath::Avx2 {
        if let Some(dot) = avx2::dot_fn(w) {
            return Some(Kernel {
                rows: avx2::rows_fn(w),
                max_rows: avx2::max_rows(w),
                batch: avx2::batch_fn(w),
                batch_min: avx2::BATCH_MIN,
                unpacked: avx2::unpacked(w),
                ..Kernel::single(w, act, dot, path)
            });
        }
    }
    #[cfg(target_arch = "aarch64")]
    if path == KernelPath::Neon {
        if let Some(dot) = neon::dot_fn(w) {
            return Some(Kernel::single(w, act, dot, path));
        }
    }
    Some(Kernel::single(w, act, scalar::dot_fn(w)?, KernelPath::Scalar))
}

/// A kernel that multiplies weights of type `w` by unquantized f32 activations (the weight row is
/// dequantized; slower, and more accurate than ggml's quantized activations). `None` when `w`
/// has no decoder.
pub fn kernel_f32(w: GgmlType) -> Option<Kernel> {
    crate::codec(w)?;
    if w == GgmlType::F32 {
        return kernel(w, KernelPath::detect());
    }
    Some(Kernel::single(
        w,
        GgmlType::F32,
        scalar::dequant_f32,
        KernelPath::Scalar,
    ))
}

/// Bytes of one activation row of `n` values converted to `act`. Q8_0 and Q8_1 activations use
/// hf2q's own block layout with f32 scales (see [`quantize_act`]); the others are ggml's.
pub fn act_row_bytes(act: GgmlType, n: usize) -> usize {
    match act {
        GgmlType::Q8_0 => n / 32 * ACT_Q8_0,
        GgmlType::Q8_1 => n / 32 * ACT_Q8_1,
        _ => n / act.block_size() as usize * act.type_size() as usize,
    }
}

/// Activation block of Q8_0 semantics: `d` (f32 holding ggml's f16 value), 32 quants.
pub const ACT_Q8_0: usize = 36;
/// Activation block of Q8_1 semantics: `d`, `s = d * sum(q)` (both f32 holding ggml's f16
/// values), 32 quants.
pub const ACT_Q8_1: usize = 40;

/// Convert one activation row to `act` with the numbers ggml's CPU `from_float` for that type
/// produces on x86 (`quantize_row_q8_0`/`q8_1`: scale `127/amax`, round half to even, scales
/// rounded to f16; on the NEON path ARM's `1/d` scale, `neon::quantize_q8_block`; Q8_K is
/// `quantize_row_q8_K_ref`; F16/BF16 round to nearest even). Q8_0 and Q8_1 scales are stored as
/// f32 (already rounded through f16) so kernels do not convert them for every weight row. `dst` holds [`act_row_bytes`].
pub fn quantize_act(act: GgmlType, src: &[f32], dst: &mut [u8]) {
    use GgmlType as T;
    match act {
        T::F32 => {
            for (d, v) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        T::F16 => {
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("f16c") {
                // SAFETY: F16C is available.
                return unsafe { avx2::f32_to_f16_row(src, dst) };
            }
            for (d, &v) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&crate::fp::f32_to_f16(v).to_le_bytes());
            }
        }
        T::BF16 => {
            for (d, &v) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&crate::fp::f32_to_bf16(v).to_le_bytes());
            }
        }
        T::Q8_0 | T::Q8_1 => {
            let sum = act == T::Q8_1;
            let bs = if sum { ACT_Q8_1 } else { ACT_Q8_0 };
            #[cfg(target_arch = "x86_64")]
            if KernelPath::detect() == KernelPath::Avx2 {
                for (x, y) in src.chunks_exact(32).zip(dst.chunks_exact_mut(bs)) {
                    // SAFETY: AVX2 present; x has 32 values, y has bs bytes.
                    unsafe { avx2::quantize_q8_block(x, y, sum) };
                }
                return;
            }
            #[cfg(target_arch = "aarch64")]
            if KernelPath::detect() == KernelPath::Neon {
                for (x, y) in src.chunks_exact(32).zip(dst.chunks_exact_mut(bs)) {
                    neon::quantize_q8_block(x, y, sum);
                }
                return;
            }
            for (x, y) in src.chunks_exact(32).zip(dst.chunks_exact_mut(bs)) {
                let (d, s, q) = q8_block(x);
                y[0..4].copy_from_slice(&crate::fp::f16_to_f32(crate::fp::f32_to_f16(d)).to_le_bytes());
                let off = if sum { 8 } else { 4 };
                if sum {
                    let sv = crate::fp::f16_to_f32(crate::fp::f32_to_f16(d * s as f32));
                    y[4..8].copy_from_slice(&sv.to_le_bytes());
                }
                for (o, v) in y[off..off + 32].iter_mut().zip(q) {
                    *o = v as u8;
                }
            }
        }
        T::Q8_K => {
            #[cfg(target_arch = "x86_64")]
            if KernelPath::detect() == KernelPath::Avx2 {
                for (x, y) in src.chunks_exact(256).zip(dst.chunks_exact_mut(292)) {
                    // SAFETY: AVX2 present; x has 256 values, y has 292 bytes.
                    unsafe { avx2::quantize_q8k_block(x, y) };
                }
                return;
            }
            let codec = crate::codec(T::Q8_K).expect("Q8_K codec");
            (codec.quantize.expect("Q8_K quantizer"))(src, dst, None);
        }
        other => unreachable!("{other:?} is not an activation type"),
    }
}

/// The values of an activation row produced by [`quantize_act`].
pub fn dequantize_act(act: GgmlType, src: &[u8], dst: &mut [f32]) {
    match act {
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            let (bs, off) = if act == GgmlType::Q8_0 {
                (ACT_Q8_0, 4)
            } else {
                (ACT_Q8_1, 8)
            };
            for (b, y) in src.chunks_exact(bs).zip(dst.chunks_exact_mut(32)) {
                let d = f32::from_le_bytes(b[0..4].try_into().unwrap());
                for (o, &q) in y.iter_mut().zip(&b[off..off + 32]) {
                    *o = d * q as i8 as f32;
                }
            }
        }
        other => {
            let codec = crate::codec(other).expect("activation codec");
            (codec.dequantize)(src, dst);
        }
    }
}

/// One block of 32 values as ggml's x86 `quantize_row_q8_0` computes it: (d, sum of quants, quants).
// ggml-cpu/arch/x86/quants.c: quantize_row_q8_0 / quantize_row_q8_1 (AVX2 path: id = 127/amax,
// _mm256_round_ps nearest-even, s = d * sum(q)).
fn q8_block(x: &[f32]) -> (f32, i32, [i8; 32]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut q = [0i8; 32];
    let mut sum = 0i32;
    for (o, &v) in q.iter_mut().zip(x) {
        let r = (v * id).round_ties_even() as i32;
        sum += r;
        *o = r as i8;
    }
    (d, sum, q)
}

/// Q8_0 in ggml's own block layout (f16 scale), as the CPU backend writes a Q8_0 KV cache.
pub fn quantize_q8_0_ggml(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
        let (d, _, q) = q8_block(x);
        y[0..2].copy_from_slice(&crate::fp::f32_to_f16(d).to_le_bytes());
        for (o, v) in y[2..34].iter_mut().zip(q) {
            *o = v as u8;
        }
    }
}

#[cfg(test)]
mod tests;
