//! NEON kernels (aarch64) that sum in the order of ggml's ARM code (`ggml-cpu/arch/arm/quants.c`)
//! as GCC compiles it: each block's integer products land in the same lanes (`sdot`, or ggml's
//! `vmull_s8`/`vpaddlq_s16` emulation of it on CPUs without the dot-product extension, which
//! groups them differently), `vmlaq_n_f32` is a multiply then an add, and scalar `a += b * c`
//! statements are fused. `tests/neon_oracle.rs` checks every kernel bit for bit against ggml's own
//! kernels built for aarch64 (`bench/neon/make_oracle.sh`).

use super::{DotFn, ACT_Q8_0, ACT_Q8_1, MAX_COLS};
use crate::fp::f16_to_f32;
use crate::GgmlType;
use std::arch::aarch64::*;
use std::arch::asm;

/// Whether this CPU has the dot-product instructions (`sdot`), decided once.
pub fn dotprod() -> bool {
    static DP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DP.get_or_init(|| std::arch::is_aarch64_feature_detected!("dotprod"))
}

/// The kernel for weights of type `w` on this CPU.
pub fn dot_fn(w: GgmlType) -> Option<DotFn> {
    dot_fn_with(w, dotprod())
}

/// The kernel for weights of type `w` as ggml built with (`dotprod`) or without the dot-product
/// extension computes it. The `dotprod` kernels need a CPU that has it.
pub fn dot_fn_with(w: GgmlType, dotprod: bool) -> Option<DotFn> {
    use GgmlType as T;
    // One weight type's kernel of a family, in the dot-product or the emulated order.
    macro_rules! pick {
        ($dp:ident, $nodp:ident, $t:ty) => {
            if dotprod {
                |_, n, w, a, o| unsafe { $dp::<$t>(n, w, a, o) }
            } else {
                |_, n, w, a, o| unsafe { $nodp::<$t>(n, w, a, o) }
            }
        };
    }
    Some(match w {
        T::Q4_0 => pick!(legacy_dp, legacy_nodp, Q4_0),
        T::Q4_1 => pick!(legacy_dp, legacy_nodp, Q4_1),
        T::Q5_0 => pick!(legacy_dp, legacy_nodp, Q5_0),
        T::Q5_1 => pick!(legacy_dp, legacy_nodp, Q5_1),
        T::Q8_0 => pick!(legacy_dp, legacy_nodp, Q8_0),
        T::IQ4_NL => pick!(legacy_dp, legacy_nodp, Iq4Nl),
        T::Q4_K => pick!(kquant_dp, kquant_nodp, Q4K),
        T::Q5_K => pick!(kquant_dp, kquant_nodp, Q5K),
        T::Q6_K => pick!(kquant_dp, kquant_nodp, Q6K),
        T::F32 => |_, n, w, a, o| unsafe { float_dot::<false>(n, w, a, o) },
        T::F16 => |_, n, w, a, o| unsafe { float_dot::<true>(n, w, a, o) },
        _ => return None,
    })
}

/// ggml's `ggml_vdotq_s32`: `acc` plus the products of `a` and `b` summed in fours. With the
/// dot-product extension lane i gets bytes 4i..4i+3; ggml's emulation without it gets bytes
/// 2i, 2i+1, 8+2i and 9+2i.
#[inline(always)]
unsafe fn vdot<const DP: bool>(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    if DP {
        let mut acc = acc;
        // SAFETY (of the instruction): only called from functions compiled with `dotprod`.
        asm!("sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b,
             options(pure, nomem, nostack, preserves_flags));
        acc
    } else {
        let p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let p1 = vmull_s8(vget_high_s8(a), vget_high_s8(b));
        vaddq_s32(acc, vaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)))
    }
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    f16_to_f32(std::ptr::read_unaligned(p as *const u16))
}

#[inline(always)]
unsafe fn f32_at(p: *const u8) -> f32 {
    std::ptr::read_unaligned(p as *const f32)
}

/// The fifth bits of a Q5 block (`qh`, bit j for quant j) as `bit << 4` bytes: quants 0..15, 16..31.
#[inline(always)]
unsafe fn high_bits(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    let qh = vreinterpretq_u8_u32(vdupq_n_u32(std::ptr::read_unaligned(p as *const u32)));
    const LO: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const HI: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let bit = vld1q_u8(BIT.as_ptr());
    let spread = |idx: &[u8; 16]| vandq_u8(vtstq_u8(vqtbl1q_u8(qh, vld1q_u8(idx.as_ptr())), bit), vdupq_n_u8(0x10));
    (spread(&LO), spread(&HI))
}

#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    let v = vld1q_u8(p);
    (vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(v))
}

/// A 32-value weight block type: its quants as ggml's NEON code forms them.
trait Legacy {
    const BYTES: usize;
    /// Q4_1/Q5_1: a min times the activation block's sum (Q8_1 activations).
    const MIN: bool;
    /// IQ4_NL sums each pair of blocks in scalar f32 instead of two vector accumulators.
    const SCALAR_PAIRS: bool = false;
    /// Q5_1 keeps the even and odd blocks' min terms in two sums (Q4_1 in one).
    const TWO_MIN_SUMS: bool = false;
    /// Quants 0..15 and 16..31.
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t);
    /// The last block of an odd count, as ggml's scalar loop adds it (`sumi` exact).
    fn tail(sumf: f32, sumi: i32, dx: f32, dy: f32, m: f32, s: f32) -> f32;
}

struct Q4_0;
impl Legacy for Q4_0 {
    const BYTES: usize = 18;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        let (l, h) = nibbles(p.add(2));
        let s8 = vdupq_n_s8(8);
        (
            vsubq_s8(vreinterpretq_s8_u8(l), s8),
            vsubq_s8(vreinterpretq_s8_u8(h), s8),
        )
    }
    // `sumf += sumi*dx*dy`
    fn tail(sumf: f32, sumi: i32, dx: f32, dy: f32, _: f32, _: f32) -> f32 {
        (sumi as f32 * dx).mul_add(dy, sumf)
    }
}

struct Q4_1;
impl Legacy for Q4_1 {
    const BYTES: usize = 20;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        let (l, h) = nibbles(p.add(4));
        (vreinterpretq_s8_u8(l), vreinterpretq_s8_u8(h))
    }
    // `sumf += (dx*dy)*sumi + m*s`
    fn tail(sumf: f32, sumi: i32, dx: f32, dy: f32, m: f32, s: f32) -> f32 {
        sumf + (dx * dy).mul_add(sumi as f32, m * s)
    }
}

struct Q5_0;
impl Legacy for Q5_0 {
    const BYTES: usize = 22;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        let (hl, hh) = high_bits(p.add(2));
        let (l, h) = nibbles(p.add(6));
        let s16 = vdupq_n_s8(16);
        (
            vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(l, hl)), s16),
            vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(h, hh)), s16),
        )
    }
    // `sumf += (dx*dy) * sumi`
    fn tail(sumf: f32, sumi: i32, dx: f32, dy: f32, _: f32, _: f32) -> f32 {
        (dx * dy).mul_add(sumi as f32, sumf)
    }
}

struct Q5_1;
impl Legacy for Q5_1 {
    const BYTES: usize = 24;
    const MIN: bool = true;
    const TWO_MIN_SUMS: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        let (hl, hh) = high_bits(p.add(4));
        let (l, h) = nibbles(p.add(8));
        (
            vreinterpretq_s8_u8(vorrq_u8(l, hl)),
            vreinterpretq_s8_u8(vorrq_u8(h, hh)),
        )
    }
    fn tail(sumf: f32, sumi: i32, dx: f32, dy: f32, m: f32, s: f32) -> f32 {
        sumf + (dx * dy).mul_add(sumi as f32, m * s)
    }
}

struct Q8_0;
impl Legacy for Q8_0 {
    const BYTES: usize = 34;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        (vld1q_s8(p.add(2) as *const i8), vld1q_s8(p.add(18) as *const i8))
    }
    // `sumf += sumi*(dx*dy)`
    fn tail(sumf: f32, sumi: i32, dx: f32, dy: f32, _: f32, _: f32) -> f32 {
        (sumi as f32).mul_add(dx * dy, sumf)
    }
}

struct Iq4Nl;
impl Legacy for Iq4Nl {
    const BYTES: usize = 18;
    const MIN: bool = false;
    const SCALAR_PAIRS: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        let values = vld1q_s8(super::scalar::KVALUES_IQ4NL.as_ptr());
        let (l, h) = nibbles(p.add(2));
        (vqtbl1q_s8(values, l), vqtbl1q_s8(values, h))
    }
    // `d = dy*dx; sumf += d * (sumi1 + sumi2)`
    fn tail(sumf: f32, sumi: i32, dx: f32, dy: f32, _: f32, _: f32) -> f32 {
        (dy * dx).mul_add(sumi as f32, sumf)
    }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn legacy_dp<L: Legacy>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    legacy_cols::<L, true>(n, w, acts, out)
}

#[target_feature(enable = "neon")]
unsafe fn legacy_nodp<L: Legacy>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    legacy_cols::<L, false>(n, w, acts, out)
}

#[inline(always)]
unsafe fn legacy_cols<L: Legacy, const DP: bool>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    match acts.len() {
        1 => legacy::<L, DP, 1>(n, w, acts, out),
        2 => legacy::<L, DP, 2>(n, w, acts, out),
        3 => legacy::<L, DP, 3>(n, w, acts, out),
        4 => legacy::<L, DP, 4>(n, w, acts, out),
        c => panic!("NEON kernel: {c} activation rows (1 to {MAX_COLS})"),
    }
}

/// ggml_vec_dot_{q4_0,q5_0,q8_0,iq4_nl}_q8_0 / {q4_1,q5_1}_q8_1 (NEON): blocks in pairs, the
/// even one into `sumv0` and the odd one into `sumv1`, then a last odd block in scalar f32. Each
/// weight block is formed once for the `C` activation rows.
#[inline(always)]
unsafe fn legacy<L: Legacy, const DP: bool, const C: usize>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    let nb = n / 32;
    let (ab, aoff) = if L::MIN { (ACT_Q8_1, 8) } else { (ACT_Q8_0, 4) };
    assert!(w.len() >= nb * L::BYTES && out.len() >= C);
    let mut ap = [std::ptr::null::<u8>(); C];
    for c in 0..C {
        assert!(acts[c].len() >= nb * ab);
        ap[c] = acts[c].as_ptr();
    }
    let wp = w.as_ptr();
    let zero = vdupq_n_s32(0);
    let mut sumv = [[vdupq_n_f32(0.0); 2]; C];
    let mut sumf = [0f32; C];
    let mut summs = [[0f32; 2]; C];
    let mut ib = 0;
    while ib + 1 < nb {
        let (x0, x1) = (wp.add(ib * L::BYTES), wp.add((ib + 1) * L::BYTES));
        let (x0l, x0h) = L::quants(x0);
        let (x1l, x1h) = L::quants(x1);
        let (dx0, dx1) = (f16_at(x0), f16_at(x1));
        for c in 0..C {
            let (y0, y1) = (ap[c].add(ib * ab), ap[c].add((ib + 1) * ab));
            let ld = |y: *const u8, o: usize| vld1q_s8(y.add(aoff + o) as *const i8);
            let p0 = vdot::<DP>(vdot::<DP>(zero, x0l, ld(y0, 0)), x0h, ld(y0, 16));
            let p1 = vdot::<DP>(vdot::<DP>(zero, x1l, ld(y1, 0)), x1h, ld(y1, 16));
            let (dd0, dd1) = (dx0 * f32_at(y0), dx1 * f32_at(y1));
            if L::SCALAR_PAIRS {
                // `sumf += dx0*dy0*sum(p0) + dx1*dy1*sum(p1)`
                sumf[c] += dd0.mul_add(vaddvq_s32(p0) as f32, dd1 * vaddvq_s32(p1) as f32);
                continue;
            }
            sumv[c][0] = vaddq_f32(sumv[c][0], vmulq_n_f32(vcvtq_f32_s32(p0), dd0));
            sumv[c][1] = vaddq_f32(sumv[c][1], vmulq_n_f32(vcvtq_f32_s32(p1), dd1));
            if L::MIN {
                let (m0, m1) = (f16_at(x0.add(2)), f16_at(x1.add(2)));
                let (s0, s1) = (f32_at(y0.add(4)), f32_at(y1.add(4)));
                if L::TWO_MIN_SUMS {
                    // Q5_1: `summs0 += m0*s0; summs1 += m1*s1`
                    summs[c][0] = m0.mul_add(s0, summs[c][0]);
                    summs[c][1] = m1.mul_add(s1, summs[c][1]);
                } else {
                    // Q4_1: `summs += m0*s0 + m1*s1`
                    summs[c][0] += m0.mul_add(s0, m1 * s1);
                }
            }
        }
        ib += 2;
    }
    for c in 0..C {
        if !L::SCALAR_PAIRS {
            sumf[c] = vaddvq_f32(sumv[c][0]) + vaddvq_f32(sumv[c][1]);
            if L::MIN {
                sumf[c] += summs[c][0];
                if L::TWO_MIN_SUMS {
                    sumf[c] += summs[c][1];
                }
            }
        }
    }
    if ib < nb {
        let x = wp.add(ib * L::BYTES);
        let (xl, xh) = L::quants(x);
        let dx = f16_at(x);
        let m = if L::MIN { f16_at(x.add(2)) } else { 0.0 };
        for c in 0..C {
            let y = ap[c].add(ib * ab);
            let p = vdot::<DP>(
                vdot::<DP>(zero, xl, vld1q_s8(y.add(aoff) as *const i8)),
                xh,
                vld1q_s8(y.add(aoff + 16) as *const i8),
            );
            let s = if L::MIN { f32_at(y.add(4)) } else { 0.0 };
            sumf[c] = L::tail(sumf[c], vaddvq_s32(p), dx, f32_at(y), m, s);
        }
    }
    out[..C].copy_from_slice(&sumf);
}

/// A 256-value K-quant block type against Q8_K activations (d: f32, 256 quants, 16 sums).
trait KQuant {
    const BYTES: usize;
    /// This superblock's contribution added to `sumf`, as ggml's NEON kernel adds it.
    unsafe fn block<const DP: bool>(sumf: f32, x: *const u8, y: *const u8) -> f32;
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn kquant_dp<K: KQuant>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    kquant::<K, true>(n, w, acts, out)
}

#[target_feature(enable = "neon")]
unsafe fn kquant_nodp<K: KQuant>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    kquant::<K, false>(n, w, acts, out)
}

#[inline(always)]
unsafe fn kquant<K: KQuant, const DP: bool>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    let nb = n / 256;
    assert!(w.len() >= nb * K::BYTES);
    for (o, a) in out.iter_mut().zip(acts) {
        assert!(a.len() >= nb * 292);
        let mut sumf = 0f32;
        for i in 0..nb {
            sumf = K::block::<DP>(sumf, w.as_ptr().add(i * K::BYTES), a.as_ptr().add(i * 292));
        }
        *o = sumf;
    }
}

/// Σ mins[k]·(bsums[2k] + bsums[2k+1]) of a Q8_K block, in integers.
#[inline(always)]
unsafe fn mins_dot(y: *const u8, mins: &[u8; 8]) -> i32 {
    let bs = y.add(260) as *const i16;
    let q8sums = vpaddq_s16(vld1q_s16(bs), vld1q_s16(bs.add(8)));
    let m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mins.as_ptr())));
    let prod = vaddq_s32(
        vmull_s16(vget_low_s16(q8sums), vget_low_s16(m)),
        vmull_s16(vget_high_s16(q8sums), vget_high_s16(m)),
    );
    vaddvq_s32(prod)
}

/// The 8 six-bit scales and mins of a Q4_K/Q5_K block (`get_scale_min_k4`).
#[inline(always)]
unsafe fn scales_mins(p: *const u8) -> ([u8; 8], [u8; 8]) {
    let s: &[u8; 12] = &*(p as *const [u8; 12]);
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        (sc[j], m[j]) = crate::k_quants::helpers::get_scale_min_k4(j, s);
    }
    (sc, m)
}

#[inline(always)]
unsafe fn ld2(p: *const u8) -> (int8x16_t, int8x16_t) {
    (vld1q_s8(p as *const i8), vld1q_s8(p.add(16) as *const i8))
}

struct Q4K;
impl KQuant for Q4K {
    const BYTES: usize = 144;
    // ggml_vec_dot_q4_K_q8_K (NEON)
    #[inline(always)]
    unsafe fn block<const DP: bool>(mut sumf: f32, x: *const u8, y: *const u8) -> f32 {
        let dy = f32_at(y);
        let (d, dmin) = (dy * f16_at(x), dy * f16_at(x.add(2)));
        let (sc, m) = scales_mins(x.add(4));
        // `sumf -= dmin * sum(prod)`
        sumf = (-dmin).mul_add(mins_dot(y, &m) as f32, sumf);
        let (q4, q8) = (x.add(16), y.add(4));
        let zero = vdupq_n_s32(0);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for j in 0..4 {
            let (b0, b1) = (vld1q_u8(q4.add(32 * j)), vld1q_u8(q4.add(32 * j + 16)));
            let (y0, y1) = ld2(q8.add(64 * j));
            let lo0 = vreinterpretq_s8_u8(vandq_u8(b0, vdupq_n_u8(0xF)));
            let lo1 = vreinterpretq_s8_u8(vandq_u8(b1, vdupq_n_u8(0xF)));
            sumi1 += vaddvq_s32(vdot::<DP>(vdot::<DP>(zero, lo0, y0), lo1, y1)) * sc[2 * j] as i32;
            let (y2, y3) = ld2(q8.add(64 * j + 32));
            let hi0 = vreinterpretq_s8_u8(vshrq_n_u8::<4>(b0));
            let hi1 = vreinterpretq_s8_u8(vshrq_n_u8::<4>(b1));
            sumi2 += vaddvq_s32(vdot::<DP>(vdot::<DP>(zero, hi0, y2), hi1, y3)) * sc[2 * j + 1] as i32;
        }
        // `sumf += d * (sumi1 + sumi2)`
        d.mul_add((sumi1 + sumi2) as f32, sumf)
    }
}

struct Q5K;
impl KQuant for Q5K {
    const BYTES: usize = 176;
    // ggml_vec_dot_q5_K_q8_K (NEON)
    #[inline(always)]
    unsafe fn block<const DP: bool>(sumf: f32, x: *const u8, y: *const u8) -> f32 {
        let dy = f32_at(y);
        let (d, dmin) = (dy * f16_at(x), dy * f16_at(x.add(2)));
        let (sc, m) = scales_mins(x.add(4));
        let sumi_mins = mins_dot(y, &m);
        let (qh, q5, q8) = (x.add(16), x.add(48), y.add(4));
        let zero = vdupq_n_s32(0);
        let (mut h0, mut h1) = (vld1q_u8(qh), vld1q_u8(qh.add(16)));
        let (one, two, m4) = (vdupq_n_u8(1), vdupq_n_u8(2), vdupq_n_u8(0xF));
        let mut sumi = 0i32;
        for j in 0..4 {
            let (b0, b1) = (vld1q_u8(q5.add(32 * j)), vld1q_u8(q5.add(32 * j + 16)));
            let q5h0 = vshlq_n_u8::<4>(vandq_u8(one, h0));
            let q5h1 = vshlq_n_u8::<4>(vandq_u8(one, h1));
            let q5h2 = vshlq_n_u8::<3>(vandq_u8(two, h0));
            let q5h3 = vshlq_n_u8::<3>(vandq_u8(two, h1));
            h0 = vshrq_n_u8::<2>(h0);
            h1 = vshrq_n_u8::<2>(h1);
            let v0 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b0, m4), q5h0));
            let v1 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b1, m4), q5h1));
            let v2 = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8::<4>(b0), q5h2));
            let v3 = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8::<4>(b1), q5h3));
            let (y0, y1) = ld2(q8.add(64 * j));
            let (y2, y3) = ld2(q8.add(64 * j + 32));
            sumi += vaddvq_s32(vdot::<DP>(vdot::<DP>(zero, v0, y0), v1, y1)) * sc[2 * j] as i32;
            sumi += vaddvq_s32(vdot::<DP>(vdot::<DP>(zero, v2, y2), v3, y3)) * sc[2 * j + 1] as i32;
        }
        // `sumf += d * sumi - dmin * sumi_mins`
        sumf + d.mul_add(sumi as f32, -(dmin * sumi_mins as f32))
    }
}

struct Q6K;
impl KQuant for Q6K {
    const BYTES: usize = 210;
    // ggml_vec_dot_q6_K_q8_K (NEON): unsigned 6-bit quants, the -32 applied through the sums.
    #[inline(always)]
    unsafe fn block<const DP: bool>(sum: f32, x: *const u8, y: *const u8) -> f32 {
        let d_all = f16_at(x.add(208));
        let (mut q6, mut qh, scale) = (x, x.add(128), x.add(192) as *const i8);
        let mut q8 = y.add(4);
        let bs = y.add(260) as *const i16;
        let sc = vld1q_s8(scale);
        let (s0, s1) = (vmovl_s8(vget_low_s8(sc)), vmovl_s8(vget_high_s8(sc)));
        let (b0, b1) = (vld1q_s16(bs), vld1q_s16(bs.add(8)));
        let prod = vaddq_s32(
            vaddq_s32(
                vmull_s16(vget_low_s16(b0), vget_low_s16(s0)),
                vmull_s16(vget_high_s16(b0), vget_high_s16(s0)),
            ),
            vaddq_s32(
                vmull_s16(vget_low_s16(b1), vget_low_s16(s1)),
                vmull_s16(vget_high_s16(b1), vget_high_s16(s1)),
            ),
        );
        let isum_mins = vaddvq_s32(prod);
        let zero = vdupq_n_s32(0);
        let (three, m4) = (vdupq_n_u8(3), vdupq_n_u8(0xF));
        let mut isum = 0i32;
        let mut s = 0;
        for _ in 0..2 {
            let (h0, h1) = (vld1q_u8(qh), vld1q_u8(qh.add(16)));
            let bits = [
                vld1q_u8(q6),
                vld1q_u8(q6.add(16)),
                vld1q_u8(q6.add(32)),
                vld1q_u8(q6.add(48)),
            ];
            qh = qh.add(32);
            q6 = q6.add(64);
            for pass in 0..2 {
                let shifts: [uint8x16_t; 4] = if pass == 0 {
                    [h0, h1, vshrq_n_u8::<2>(h0), vshrq_n_u8::<2>(h1)]
                } else {
                    [
                        vshrq_n_u8::<4>(h0),
                        vshrq_n_u8::<4>(h1),
                        vshrq_n_u8::<6>(h0),
                        vshrq_n_u8::<6>(h1),
                    ]
                };
                for k in 0..4 {
                    let hb = vshlq_n_u8::<4>(vandq_u8(three, shifts[k]));
                    let lo = if pass == 0 {
                        vandq_u8(bits[k], m4)
                    } else {
                        vshrq_n_u8::<4>(bits[k])
                    };
                    let q = vreinterpretq_s8_u8(vorrq_u8(lo, hb));
                    let yv = vld1q_s8(q8.add(16 * k) as *const i8);
                    isum += vaddvq_s32(vdot::<DP>(zero, q, yv)) * *scale.add(s + k) as i32;
                }
                s += 4;
                q8 = q8.add(64);
            }
        }
        // `sum += d_all * y.d * (isum - 32 * isum_mins)`
        (d_all * f32_at(y)).mul_add((isum - 32 * isum_mins) as f32, sum)
    }
}

/// ggml_vec_dot_f32 / ggml_vec_dot_f16 (`vec.cpp`, NEON without FP16 vector arithmetic: f16
/// converted to f32): 16 values per step into four FMA accumulators, reduced (0+2, 1+3, then
/// 0+1) and summed across lanes, then the leftovers one by one (an f32 sum for F32, f64 for F16).
#[target_feature(enable = "neon")]
unsafe fn float_dot<const F16: bool>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    let es = if F16 { 2 } else { 4 };
    assert!(w.len() >= n * es);
    let load = |p: *const u8, i: usize| -> float32x4_t {
        if F16 {
            let h = std::ptr::read_unaligned(p.add(2 * i) as *const [u16; 4]);
            vld1q_f32(h.map(f16_to_f32).as_ptr())
        } else {
            vld1q_f32(p.add(4 * i) as *const f32)
        }
    };
    let scalar = |p: *const u8, i: usize| -> f32 {
        if F16 {
            f16_at(p.add(2 * i))
        } else {
            f32_at(p.add(4 * i))
        }
    };
    let np = n & !15;
    for (o, a) in out.iter_mut().zip(acts) {
        assert!(a.len() >= n * es);
        let (x, y) = (w.as_ptr(), a.as_ptr());
        let mut sum = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i < np {
            for (j, s) in sum.iter_mut().enumerate() {
                *s = vfmaq_f32(*s, load(x, i + 4 * j), load(y, i + 4 * j));
            }
            i += 16;
        }
        let s01 = vaddq_f32(vaddq_f32(sum[0], sum[2]), vaddq_f32(sum[1], sum[3]));
        *o = if F16 {
            // ggml_vec_dot_f16: `ggml_float sumf`, leftovers `sumf += (ggml_float)(x*y)`.
            let mut sumf = vaddvq_f32(s01) as f64;
            for i in np..n {
                sumf += (scalar(x, i) * scalar(y, i)) as f64;
            }
            sumf as f32
        } else {
            // ggml_vec_dot_f32: `float sumf`, leftovers `sumf += x*y`. GCC 12 vectorizes that loop
            // as an in-order reduction when there are 4 or more: whole fours as products then adds
            // in order (not fused), the last 1-3 fused.
            let mut sumf = vaddvq_f32(s01);
            let fours = if n - np >= 4 { (n - np) / 4 * 4 } else { 0 };
            for i in np..np + fours {
                sumf += scalar(x, i) * scalar(y, i);
            }
            for i in np + fours..n {
                sumf = scalar(x, i).mul_add(scalar(y, i), sumf);
            }
            sumf
        };
    }
}

/// One block of 32 activations as ggml's ARM `quantize_row_q8_0`/`q8_1` computes it
/// (`id = 1/d`, `vcvtnq_s32_f32` rounding to nearest even), in hf2q's activation layout.
pub fn quantize_q8_block(x: &[f32], y: &mut [u8], sum: bool) {
    let amax = x[..32].iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let off = if sum { 8 } else { 4 };
    let mut total = 0i32;
    for (o, &v) in y[off..off + 32].iter_mut().zip(x) {
        let q = (v * id).round_ties_even() as i32;
        total += q;
        *o = q as i8 as u8;
    }
    let r = |v: f32| f16_to_f32(crate::fp::f32_to_f16(v));
    y[0..4].copy_from_slice(&r(d).to_le_bytes());
    if sum {
        y[4..8].copy_from_slice(&r(d * total as f32).to_le_bytes());
    }
}
