//! Scalar reference dot products (`ggml-cpu/quants.c`, the `*_generic` vec_dot functions): exact
//! integer sums per block, scaled and accumulated in f32 block by block.

use super::DotFn;
use crate::fp::{bf16_to_f32, f16_to_f32};
use crate::GgmlType;
use std::cell::RefCell;

#[inline]
fn f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// An f32 scale of an activation block.
#[inline]
fn f32at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

#[inline]
fn i8s(b: &[u8]) -> impl Iterator<Item = i32> + '_ {
    b.iter().map(|&v| v as i8 as i32)
}

pub fn dot_fn(w: GgmlType) -> Option<DotFn> {
    use GgmlType as T;
    Some(match w {
        T::F32 => cols::<F32>,
        T::F16 => cols::<F16>,
        T::BF16 => cols::<Bf16>,
        T::Q4_0 => cols::<Q4_0>,
        T::Q4_1 => cols::<Q4_1>,
        T::Q5_0 => cols::<Q5_0>,
        T::Q5_1 => cols::<Q5_1>,
        T::Q8_0 => cols::<Q8_0>,
        T::IQ4_NL => cols::<Iq4Nl>,
        T::Q4_K => cols::<Q4K>,
        T::Q5_K => cols::<Q5K>,
        T::Q6_K => cols::<Q6K>,
        _ => {
            super::vec_dot_type(w)?;
            crate::codec(w)?;
            generic
        }
    })
}

/// One weight type's single-column dot product.
trait Dot {
    fn dot(n: usize, w: &[u8], a: &[u8]) -> f32;
}

fn cols<D: Dot>(_ty: GgmlType, n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    for (o, a) in out.iter_mut().zip(acts) {
        *o = D::dot(n, w, a);
    }
}

struct F32;
impl Dot for F32 {
    // vec.cpp ggml_vec_dot_f32 (scalar: sum in ggml_float = f64)
    fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut s = 0f64;
        for (x, y) in w[..4 * n].chunks_exact(4).zip(a.chunks_exact(4)) {
            s += (f32::from_le_bytes(x.try_into().unwrap()) * f32::from_le_bytes(y.try_into().unwrap())) as f64;
        }
        s as f32
    }
}

struct F16;
impl Dot for F16 {
    fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut s = 0f64;
        for i in 0..n {
            s += (f16(w, 2 * i) * f16(a, 2 * i)) as f64;
        }
        s as f32
    }
}

struct Bf16;
impl Dot for Bf16 {
    fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut s = 0f64;
        for i in 0..n {
            let x = bf16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]]));
            let y = bf16_to_f32(u16::from_le_bytes([a[2 * i], a[2 * i + 1]]));
            s += (x * y) as f64;
        }
        s as f32
    }
}

/// The 32 quants of a legacy block as signed or unsigned integers.
fn nibbles(qs: &[u8]) -> [i32; 32] {
    let mut q = [0i32; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0xF) as i32;
        q[j + 16] = (qs[j] >> 4) as i32;
    }
    q
}

fn with_high_bits(mut q: [i32; 32], qh: u32) -> [i32; 32] {
    for (j, v) in q.iter_mut().enumerate() {
        *v |= (((qh >> j) & 1) << 4) as i32;
    }
    q
}

fn isum(q: &[i32; 32], a: &[u8]) -> i32 {
    q.iter().zip(i8s(a)).map(|(x, y)| x * y).sum()
}

struct Q4_0;
impl Dot for Q4_0 {
    // quants.c ggml_vec_dot_q4_0_q8_0_generic
    fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut s = 0f32;
        for (x, y) in w.chunks_exact(18).zip(a.chunks_exact(36)).take(n / 32) {
            let q = nibbles(&x[2..18]).map(|v| v - 8);
            s += isum(&q, &y[4..36]) as f32 * f16(x, 0) * f32at(y, 0);
        }
        s
    }
}

struct Q4_1;
impl Dot for Q4_1 {
    // quants.c ggml_vec_dot_q4_1_q8_1_generic
    fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut s = 0f32;
        for (x, y) in w.chunks_exact(20).zip(a.chunks_exact(40)).take(n / 32) {
            let q = nibbles(&x[4..20]);
            s = f16(x, 2).mul_add(f32at(y, 4), s + (f16(x, 0) * f32at(y, 0)) * isum(&q, &y[8..40]) as f32);
        }
        s
    }
}

struct Q5_0;
impl Dot for Q5_0 {
    fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut s = 0f32;
        for (x, y) in w.chunks_exact(22).zip(a.chunks_exact(36)).take(n / 32) {
            let qh = u32::from_le_bytes(x[2..6].try_into().unwrap());
            let q = with_high_bits(nibbles(&x[6..22]), qh).map(|v| v - 16);
            s += isum(&q, &y[4..36]) as f32 * f16(x, 0) * f32at(y, 0);
        }
        s
    }
}

struct Q5_1;
impl Dot for Q5_1 {
    fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut s = 0f32;
        for (x, y) in w.chunks_exact(24).zip(a.chunks_exact(40)).take(n / 32) {
            let qh = u32::from_le_bytes(x[4..8].try_into().unwrap());
            let q = with_high_bits(nibbles(&x[8..24]), qh);
            s = f16(x, 2).mul_add(f32at(y, 4), s + (f16(x, 0) * f32at(y, 0)) * isum(&q, &y[8..40]) as f32);
        }
        s
    }
}

struct Q8_0;
impl Dot for Q8_0 {
    fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut s = 0f32;
        for (x, y) in w.chunks_exact(34).zip(a.chunks_exact(36)).take(n / 32) {
            let sumi: i32 = i8s(&x[2..34]).zip(i8s(&y[4..36])).map(|(p, q)| p * q).sum();
            s += sumi as f32 * (f16(x, 0) * f32at(y, 0));
        }
        s
    }
}

/// `kvalues_iq4nl` (ggml-common.h).
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

struct Iq4Nl;
impl Dot for Iq4Nl {
    fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut s = 0f32;
        for (x, y) in w.chunks_exact(18).zip(a.chunks_exact(36)).take(n / 32) {
            let q = nibbles(&x[2..18]).map(|v| KVALUES_IQ4NL[v as usize] as i32);
            s += (f16(x, 0) * f32at(y, 0)) * isum(&q, &y[4..36]) as f32;
        }
        s
    }
}

/// Q8_K block: d (f32), 256 quants, 16 sums of 16.
fn q8k(y: &[u8]) -> (f32, &[u8], [i32; 16]) {
    let d = f32::from_le_bytes(y[0..4].try_into().unwrap());
    let mut bs = [0i32; 16];
    for (i, b) in bs.iter_mut().enumerate() {
        *b = i16::from_le_bytes([y[260 + 2 * i], y[261 + 2 * i]]) as i32;
    }
    (d, &y[4..260], bs)
}

fn scales_mins_k4(s: &[u8]) -> ([i32; 8], [i32; 8]) {
    let s: &[u8; 12] = s.try_into().unwrap();
    let mut sc = [0; 8];
    let mut m = [0; 8];
    for j in 0..8 {
        let (a, b) = crate::k_quants::helpers::get_scale_min_k4(j, s);
        sc[j] = a as i32;
        m[j] = b as i32;
    }
    (sc, m)
}

struct Q4K;
impl Dot for Q4K {
    // quants.c ggml_vec_dot_q4_K_q8_K_generic
    fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut s = 0f32;
        for (x, y) in w.chunks_exact(144).zip(a.chunks_exact(292)).take(n / 256) {
            let (dy, q8, bs) = q8k(y);
            let (sc, m) = scales_mins_k4(&x[4..16]);
            let qs = &x[16..144];
            let mut sumi = 0i32;
            for j in 0..4 {
                let (mut lo, mut hi) = (0i32, 0i32);
                for l in 0..32 {
                    lo += (qs[32 * j + l] & 0xF) as i32 * q8[64 * j + l] as i8 as i32;
                    hi += (qs[32 * j + l] >> 4) as i32 * q8[64 * j + 32 + l] as i8 as i32;
                }
                sumi += sc[2 * j] * lo + sc[2 * j + 1] * hi;
            }
            let summ: i32 = (0..8).map(|k| m[k] * (bs[2 * k] + bs[2 * k + 1])).sum();
            s += dy * f16(x, 0) * sumi as f32 - dy * f16(x, 2) * summ as f32;
        }
        s
    }
}

struct Q5K;
impl Dot for Q5K {
    fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut s = 0f32;
        for (x, y) in w.chunks_exact(176).zip(a.chunks_exact(292)).take(n / 256) {
            let (dy, q8, bs) = q8k(y);
            let (sc, m) = scales_mins_k4(&x[4..16]);
            let qh = &x[16..48];
            let qs = &x[48..176];
            let mut sumi = 0i32;
            for j in 0..4 {
                let (mut lo, mut hi) = (0i32, 0i32);
                for l in 0..32 {
                    let h = qh[l] >> (2 * j);
                    let ql = (qs[32 * j + l] & 0xF) | ((h & 1) << 4);
                    let qhv = (qs[32 * j + l] >> 4) | (((h >> 1) & 1) << 4);
                    lo += ql as i32 * q8[64 * j + l] as i8 as i32;
                    hi += qhv as i32 * q8[64 * j + 32 + l] as i8 as i32;
                }
                sumi += sc[2 * j] * lo + sc[2 * j + 1] * hi;
            }
            let summ: i32 = (0..8).map(|k| m[k] * (bs[2 * k] + bs[2 * k + 1])).sum();
            s += dy * f16(x, 0) * sumi as f32 - dy * f16(x, 2) * summ as f32;
        }
        s
    }
}

struct Q6K;
impl Dot for Q6K {
    // quants.c ggml_vec_dot_q6_K_q8_K_generic
    fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
        let mut s = 0f32;
        for (x, y) in w.chunks_exact(210).zip(a.chunks_exact(292)).take(n / 256) {
            let (dy, q8, _) = q8k(y);
            let (ql, qh, sc) = (&x[0..128], &x[128..192], &x[192..208]);
            let mut sumi = 0i32;
            for half in 0..2 {
                let (ql, qh, sc, q8) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..], &q8[128 * half..]);
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    sumi += sc[is] as i8 as i32 * q1 * q8[l] as i8 as i32
                        + sc[is + 2] as i8 as i32 * q2 * q8[l + 32] as i8 as i32
                        + sc[is + 4] as i8 as i32 * q3 * q8[l + 64] as i8 as i32
                        + sc[is + 6] as i8 as i32 * q4 * q8[l + 96] as i8 as i32;
                }
            }
            s += dy * f16(x, 208) * sumi as f32;
        }
        s
    }
}

thread_local! {
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Any other type: dequantize both rows and multiply in f32 (the same sum as ggml's integer kernels,
/// with f32 instead of integer partial sums). `dot_fn` checked that both codecs exist.
fn generic(wt: GgmlType, n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    let act_ty = super::vec_dot_type(wt).expect("checked by dot_fn");
    let wc = crate::codec(wt).expect("checked by dot_fn");
    let wbytes = wt.row_bytes(n as u64).expect("row of whole blocks") as usize;
    SCRATCH.with(|s| {
        let (xw, xa) = &mut *s.borrow_mut();
        xw.resize(n, 0.0);
        xa.resize(n, 0.0);
        (wc.dequantize)(&w[..wbytes], xw);
        for (o, a) in out.iter_mut().zip(acts) {
            super::dequantize_act(act_ty, &a[..super::act_row_bytes(act_ty, n)], xa);
            *o = xw.iter().zip(xa.iter()).map(|(p, q)| (p * q) as f64).sum::<f64>() as f32;
        }
    })
}

/// Any weight type by f32 activations: the weight row is dequantized and multiplied in f32 with
/// an f64 sum (no activation quantization; the accurate path for encoders).
pub(super) fn dequant_f32(wt: GgmlType, n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    let wc = crate::codec(wt).expect("checked by kernel_f32");
    let wbytes = wt.row_bytes(n as u64).expect("row of whole blocks") as usize;
    SCRATCH.with(|s| {
        let (xw, _) = &mut *s.borrow_mut();
        xw.resize(n, 0.0);
        (wc.dequantize)(&w[..wbytes], xw);
        for (o, a) in out.iter_mut().zip(acts) {
            let mut sum = 0f64;
            for (x, y) in xw.iter().zip(a.chunks_exact(4)) {
                sum += (*x * f32::from_le_bytes([y[0], y[1], y[2], y[3]])) as f64;
            }
            *o = sum as f32;
        }
    })
}
