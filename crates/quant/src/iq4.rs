//! IQ4_NL and IQ4_XS: 4-bit indices into a fixed non-linear codebook (`kvalues_iq4nl`), with one
//! f16 scale per 32 values (IQ4_NL) or an f16 super-block scale plus 6-bit sub-block scales
//! (IQ4_XS). Both quantizers follow `quantize_row_iq4_nl_impl` in `ggml/src/ggml-quants.c`.

use crate::fp::{get_f16, nearest_int, put_f16, F16Bytes};
use crate::{Codec, GgmlType};

/// The IQ4 codebook (`kvalues_iq4nl` in `ggml/src/ggml-common.h`).
const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// `GROUP_MAX_EPS` in ggml-quants.c.
const GROUP_MAX_EPS: f32 = 1e-15;

const QK4_NL: usize = 32;
const QK_K: usize = 256;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq4Nl {
    pub d: F16Bytes,
    pub qs: [u8; QK4_NL / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Nl>() == 18);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq4Xs {
    pub d: F16Bytes,
    /// High 2 bits of the eight 6-bit sub-block scales (little-endian u16).
    pub scales_h: [u8; 2],
    /// Low 4 bits of the sub-block scales, two per byte.
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Xs>() == 136);

pub(crate) const CODECS: &[Codec] = &[
    Codec {
        ty: GgmlType::IQ4_NL,
        quantize: Some(quantize_iq4_nl),
        dequantize: dequantize_iq4_nl,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::IQ4_XS,
        quantize: Some(quantize_iq4_xs),
        dequantize: dequantize_iq4_xs,
        requires_imatrix: false,
    },
];

/// Index of the codebook entry nearest to `x` in a sorted table (`best_index_int8`).
fn best_index_int8(values: &[i8; 16], x: f32) -> usize {
    let val = |i: usize| values[i] as f32;
    let n = values.len();
    if x <= val(0) {
        return 0;
    }
    if x >= val(n - 1) {
        return n - 1;
    }
    let (mut ml, mut mu) = (0, n - 1);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - val(mu - 1) < val(mu) - x {
        mu - 1
    } else {
        mu
    }
}

/// Sub-block scales of an IQ4_XS super-block, written by [`quantize_iq4_super_block`].
struct XsScales<'a> {
    h: &'a mut [u8; 2],
    l: &'a mut [u8; QK_K / 64],
}

/// Quantize one super-block of `x.len()` values in sub-blocks of 32 (`quantize_row_iq4_nl_impl`).
/// `xs_scales` is given exactly when there is more than one sub-block (IQ4_XS).
fn quantize_iq4_super_block(
    x: &[f32],
    quant_weights: Option<&[f32]>,
    ntry: i32,
    dh: &mut F16Bytes,
    q4: &mut [u8],
    xs_scales: Option<XsScales<'_>>,
) {
    const BLOCK: usize = 32;
    let values = &KVALUES_IQ4NL;
    let super_block_size = x.len();
    let nb = super_block_size / BLOCK;

    let mut sigma2 = 0f32;
    for &v in x {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / super_block_size as f32;

    q4.fill(0);
    *dh = put_f16(0.0);

    let mut l_all = [0u8; QK_K];
    let l_all = &mut l_all[..super_block_size];
    let mut scales = [0f32; QK_K / BLOCK];
    let mut weight = [0f32; BLOCK];

    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for ib in 0..nb {
        let xb = &x[ib * BLOCK..(ib + 1) * BLOCK];
        let lb = &mut l_all[ib * BLOCK..(ib + 1) * BLOCK];
        match quant_weights {
            Some(qw) => {
                let qw = &qw[ib * BLOCK..(ib + 1) * BLOCK];
                for j in 0..BLOCK {
                    weight[j] = qw[j] * (sigma2 + xb[j] * xb[j]).sqrt();
                }
            }
            None => {
                for j in 0..BLOCK {
                    weight[j] = xb[j] * xb[j];
                }
            }
        }
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        let v0 = values[0] as f32;
        let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
        let mut id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for j in 0..BLOCK {
            let l = best_index_int8(values, id * xb[j]);
            lb[j] = l as u8;
            let q = values[l] as f32;
            let w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -ntry..=ntry {
            id = (itry + values[0] as i32) as f32 / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..BLOCK {
                let l = best_index_int8(values, id * xb[j]);
                let q = values[l] as f32;
                let w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        let abs_d = d.abs();
        if abs_d > amax_scale {
            amax_scale = abs_d;
            max_scale = d;
        }
    }

    if let Some(XsScales { h, l }) = xs_scales {
        debug_assert!(nb > 1);
        let mut scales_h = 0u16;
        let d = -max_scale / 32.0;
        *dh = put_f16(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..nb {
            let ls = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * ls as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            let xb = &x[ib * BLOCK..(ib + 1) * BLOCK];
            let lb = &mut l_all[ib * BLOCK..(ib + 1) * BLOCK];
            for j in 0..BLOCK {
                lb[j] = best_index_int8(values, idl * xb[j]) as u8;
            }
            let ls = (ls + 32) as u8;
            let (l_l, l_h) = (ls & 0xf, ls >> 4);
            if ib % 2 == 0 {
                l[ib / 2] = l_l;
            } else {
                l[ib / 2] |= l_l << 4;
            }
            scales_h |= (l_h as u16) << (2 * (ib % 8));
        }
        *h = scales_h.to_le_bytes();
    } else {
        *dh = put_f16(scales[0]);
        if ntry > 0 {
            let id = if scales[0] != 0.0 { 1.0 / scales[0] } else { 0.0 };
            for (lj, &xj) in l_all.iter_mut().zip(x) {
                *lj = best_index_int8(values, id * xj) as u8;
            }
        }
    }

    for (q, lc) in q4.chunks_exact_mut(16).zip(l_all.chunks_exact(32)) {
        for j in 0..16 {
            q[j] = lc[j] | (lc[16 + j] << 4);
        }
    }
}

/// One row of IQ4_NL (`quantize_iq4_nl`, the function `ggml_quantize_chunk` calls; ntry = 7).
fn quantize_iq4_nl(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::quantize_iq4_nl_avx2(src, dst, imatrix) };
    }
    quantize_iq4_nl_scalar(src, dst, imatrix)
}

/// The scalar reference for [`quantize_iq4_nl`].
fn quantize_iq4_nl_scalar(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockIq4Nl] = bytemuck::cast_slice_mut(dst);
    for (ibl, (y, x)) in blocks.iter_mut().zip(src.chunks_exact(QK4_NL)).enumerate() {
        let qw = imatrix.map(|w| &w[ibl * QK4_NL..(ibl + 1) * QK4_NL]);
        quantize_iq4_super_block(x, qw, 7, &mut y.d, &mut y.qs, None);
    }
}

/// One row of IQ4_XS (`quantize_iq4_xs`; ntry = 7).
fn quantize_iq4_xs(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::quantize_iq4_xs_avx2(src, dst, imatrix) };
    }
    quantize_iq4_xs_scalar(src, dst, imatrix)
}

/// The scalar reference for [`quantize_iq4_xs`].
fn quantize_iq4_xs_scalar(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let blocks: &mut [BlockIq4Xs] = bytemuck::cast_slice_mut(dst);
    for (ibl, (y, x)) in blocks.iter_mut().zip(src.chunks_exact(QK_K)).enumerate() {
        let qw = imatrix.map(|w| &w[ibl * QK_K..(ibl + 1) * QK_K]);
        y.scales_h = [0; 2];
        let scales = XsScales {
            h: &mut y.scales_h,
            l: &mut y.scales_l,
        };
        quantize_iq4_super_block(x, qw, 7, &mut y.d, &mut y.qs, Some(scales));
    }
}

/// `dequantize_row_iq4_nl`.
fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::dequantize_iq4_nl_avx2(src, dst) };
    }
    dequantize_iq4_nl_scalar(src, dst)
}

/// The scalar reference for [`dequantize_iq4_nl`].
fn dequantize_iq4_nl_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIq4Nl] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK4_NL)) {
        let d = get_f16(b.d);
        for (j, &q) in b.qs.iter().enumerate() {
            y[j] = d * KVALUES_IQ4NL[(q & 0xf) as usize] as f32;
            y[j + QK4_NL / 2] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
}

/// `dequantize_row_iq4_xs`.
fn dequantize_iq4_xs(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::dequantize_iq4_xs_avx2(src, dst) };
    }
    dequantize_iq4_xs_scalar(src, dst)
}

/// The scalar reference for [`dequantize_iq4_xs`].
fn dequantize_iq4_xs_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIq4Xs] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = get_f16(b.d);
        let scales_h = u16::from_le_bytes(b.scales_h);
        for (ib, (yb, qs)) in y.chunks_exact_mut(32).zip(b.qs.chunks_exact(16)).enumerate() {
            let lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
            let hi = ((scales_h >> (2 * ib)) & 3) as u8;
            let ls = (lo | (hi << 4)) as i32;
            let dl = d * (ls - 32) as f32;
            for (j, &q) in qs.iter().enumerate() {
                yb[j] = dl * KVALUES_IQ4NL[(q & 0xf) as usize] as f32;
                yb[j + 16] = dl * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
            }
        }
    }
}

/// Decision thresholds of [`best_index_int8`] on `KVALUES_IQ4NL`: `best_index_int8(x)` equals the
/// number of `i` with `!(x < t[i])` (NaN counts everywhere, giving 15 as the search does).
///
/// Between neighbours `a < b` the search picks `a` iff `fl(x - a) < fl(b - x)`; both sides are
/// monotone in `x`, so the choice flips exactly once, at `t` = the smallest float where it picks
/// `b` (found by stepping from the midpoint), and `a < t <= b`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn iq4_thresholds() -> [f32; 15] {
    fn step(x: f32, up: bool) -> f32 {
        // neighbouring float (x is finite and nonzero here, as all midpoints are)
        let b = x.to_bits();
        f32::from_bits(if (x > 0.0) == up { b + 1 } else { b - 1 })
    }
    std::array::from_fn(|i| {
        let (a, b) = (KVALUES_IQ4NL[i] as f32, KVALUES_IQ4NL[i + 1] as f32);
        let picks_lower = |x: f32| x - a < b - x;
        let mut t = (a + b) / 2.0;
        while picks_lower(t) {
            t = step(t, true);
        }
        while !picks_lower(step(t, false)) {
            t = step(t, false);
        }
        t
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! AVX2 paths. Quantization: the 16 scale candidates of a block (the first guess and the 15
    //! `itry` values) run in the lanes of two vectors, so each lane keeps its sums in the scalar
    //! order; indices come from comparisons with [`iq4_thresholds`]. No FMA anywhere.
    use super::*;
    use std::arch::x86_64::*;

    struct Tables {
        t: [__m256; 15],
        lo: __m256,
        hi: __m256,
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn tables() -> Tables {
        let th = iq4_thresholds();
        let v: [f32; 16] = std::array::from_fn(|i| KVALUES_IQ4NL[i] as f32);
        Tables {
            t: std::array::from_fn(|i| _mm256_set1_ps(th[i])),
            lo: _mm256_loadu_ps(v.as_ptr()),
            hi: _mm256_loadu_ps(v.as_ptr().add(8)),
        }
    }

    /// `best_index_int8` of 8 lanes, as i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn best_index8(tb: &Tables, al: __m256) -> __m256i {
        let mut l = _mm256_setzero_si256();
        for t in &tb.t {
            let m = _mm256_cmp_ps::<_CMP_NLT_UQ>(al, *t);
            l = _mm256_sub_epi32(l, _mm256_castps_si256(m));
        }
        l
    }

    /// `values[l]` as floats.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn value8(tb: &Tables, l: __m256i) -> __m256 {
        let lo = _mm256_permutevar8x32_ps(tb.lo, l);
        let hi = _mm256_permutevar8x32_ps(tb.hi, l);
        _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(l)))
    }

    /// `L[j] = best_index_int8(id * x[j])` for 32 values.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn indices32(tb: &Tables, id: f32, x: &[f32], l: &mut [u8]) {
        assert!(x.len() == 32 && l.len() == 32);
        let idv = _mm256_set1_ps(id);
        let mut buf = [0i32; 32];
        for k in 0..4 {
            let al = _mm256_mul_ps(idv, _mm256_loadu_ps(x.as_ptr().add(8 * k)));
            _mm256_storeu_si256(buf.as_mut_ptr().add(8 * k) as *mut __m256i, best_index8(tb, al));
        }
        for (d, s) in l.iter_mut().zip(buf) {
            *d = s as u8;
        }
    }

    /// The scale search of one block of 32 (`xb` with `amax >= GROUP_MAX_EPS`, ntry = 7): the
    /// returned `d` is the scalar loop's.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn block_scale(tb: &Tables, xb: &[f32], weight: &[f32; 32], max: f32) -> f32 {
        assert!(xb.len() == 32);
        let v0 = KVALUES_IQ4NL[0] as f32;
        let d0 = -max / v0;
        let mut ids = [0f32; 16];
        ids[0] = 1.0 / d0;
        for (k, id) in ids[1..].iter_mut().enumerate() {
            *id = (k as i32 - 7 + KVALUES_IQ4NL[0] as i32) as f32 / max;
        }
        let id_a = _mm256_loadu_ps(ids.as_ptr());
        let id_b = _mm256_loadu_ps(ids.as_ptr().add(8));
        let (mut sqx_a, mut sq2_a) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let (mut sqx_b, mut sq2_b) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for j in 0..32 {
            let x = _mm256_set1_ps(*xb.get_unchecked(j));
            let w = _mm256_set1_ps(*weight.get_unchecked(j));
            let qa = value8(tb, best_index8(tb, _mm256_mul_ps(id_a, x)));
            let qb = value8(tb, best_index8(tb, _mm256_mul_ps(id_b, x)));
            let wqa = _mm256_mul_ps(w, qa);
            let wqb = _mm256_mul_ps(w, qb);
            sqx_a = _mm256_add_ps(sqx_a, _mm256_mul_ps(wqa, x));
            sq2_a = _mm256_add_ps(sq2_a, _mm256_mul_ps(wqa, qa));
            sqx_b = _mm256_add_ps(sqx_b, _mm256_mul_ps(wqb, x));
            sq2_b = _mm256_add_ps(sq2_b, _mm256_mul_ps(wqb, qb));
        }
        let (mut sqx, mut sq2) = ([0f32; 16], [0f32; 16]);
        _mm256_storeu_ps(sqx.as_mut_ptr(), sqx_a);
        _mm256_storeu_ps(sqx.as_mut_ptr().add(8), sqx_b);
        _mm256_storeu_ps(sq2.as_mut_ptr(), sq2_a);
        _mm256_storeu_ps(sq2.as_mut_ptr().add(8), sq2_b);
        let mut d = if sq2[0] > 0.0 { sqx[0] / sq2[0] } else { 0.0 };
        let mut best = d * sqx[0];
        for t in 1..16 {
            if sq2[t] > 0.0 && sqx[t] * sqx[t] > best * sq2[t] {
                d = sqx[t] / sq2[t];
                best = d * sqx[t];
            }
        }
        d
    }

    /// [`quantize_iq4_super_block`] with ntry = 7.
    #[target_feature(enable = "avx2")]
    unsafe fn super_block(
        tb: &Tables,
        x: &[f32],
        quant_weights: Option<&[f32]>,
        dh: &mut F16Bytes,
        q4: &mut [u8],
        xs_scales: Option<XsScales<'_>>,
    ) {
        const BLOCK: usize = 32;
        let super_block_size = x.len();
        let nb = super_block_size / BLOCK;

        let mut sigma2 = 0f32;
        for &v in x {
            sigma2 += v * v;
        }
        sigma2 *= 2.0 / super_block_size as f32;

        let mut l_all = [0u8; QK_K];
        let l_all = &mut l_all[..super_block_size];
        let mut scales = [0f32; QK_K / BLOCK];
        let mut weight = [0f32; BLOCK];

        let (mut max_scale, mut amax_scale) = (0f32, 0f32);
        for ib in 0..nb {
            let xb = &x[ib * BLOCK..(ib + 1) * BLOCK];
            match quant_weights {
                Some(qw) => {
                    let qw = &qw[ib * BLOCK..(ib + 1) * BLOCK];
                    let s2 = _mm256_set1_ps(sigma2);
                    for k in 0..4 {
                        let xv = _mm256_loadu_ps(xb.as_ptr().add(8 * k));
                        let qv = _mm256_loadu_ps(qw.as_ptr().add(8 * k));
                        let r = _mm256_sqrt_ps(_mm256_add_ps(s2, _mm256_mul_ps(xv, xv)));
                        _mm256_storeu_ps(weight.as_mut_ptr().add(8 * k), _mm256_mul_ps(qv, r));
                    }
                }
                None => {
                    for j in 0..BLOCK {
                        weight[j] = xb[j] * xb[j];
                    }
                }
            }
            let (mut amax, mut max) = (0f32, 0f32);
            for &v in xb {
                let ax = v.abs();
                if ax > amax {
                    amax = ax;
                    max = v;
                }
            }
            if amax < GROUP_MAX_EPS {
                scales[ib] = 0.0;
                continue;
            }
            let d = block_scale(tb, xb, &weight, max);
            scales[ib] = d;
            let abs_d = d.abs();
            if abs_d > amax_scale {
                amax_scale = abs_d;
                max_scale = d;
            }
        }

        if let Some(XsScales { h, l }) = xs_scales {
            let mut scales_h = 0u16;
            let d = -max_scale / 32.0;
            *dh = put_f16(d);
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            for ib in 0..nb {
                let ls = nearest_int(id * scales[ib]).clamp(-32, 31);
                let dl = d * ls as f32;
                let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
                indices32(
                    tb,
                    idl,
                    &x[ib * BLOCK..(ib + 1) * BLOCK],
                    &mut l_all[ib * BLOCK..(ib + 1) * BLOCK],
                );
                let ls = (ls + 32) as u8;
                let (l_l, l_h) = (ls & 0xf, ls >> 4);
                if ib % 2 == 0 {
                    l[ib / 2] = l_l;
                } else {
                    l[ib / 2] |= l_l << 4;
                }
                scales_h |= (l_h as u16) << (2 * (ib % 8));
            }
            *h = scales_h.to_le_bytes();
        } else {
            *dh = put_f16(scales[0]);
            let id = if scales[0] != 0.0 { 1.0 / scales[0] } else { 0.0 };
            for (lc, xc) in l_all.chunks_exact_mut(32).zip(x.chunks_exact(32)) {
                indices32(tb, id, xc, lc);
            }
        }

        for (q, lc) in q4.chunks_exact_mut(16).zip(l_all.chunks_exact(32)) {
            for j in 0..16 {
                q[j] = lc[j] | (lc[16 + j] << 4);
            }
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_iq4_nl_avx2(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
        let tb = tables();
        let blocks: &mut [BlockIq4Nl] = bytemuck::cast_slice_mut(dst);
        for (ibl, (y, x)) in blocks.iter_mut().zip(src.chunks_exact(QK4_NL)).enumerate() {
            let qw = imatrix.map(|w| &w[ibl * QK4_NL..(ibl + 1) * QK4_NL]);
            super_block(&tb, x, qw, &mut y.d, &mut y.qs, None);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_iq4_xs_avx2(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
        let tb = tables();
        let blocks: &mut [BlockIq4Xs] = bytemuck::cast_slice_mut(dst);
        for (ibl, (y, x)) in blocks.iter_mut().zip(src.chunks_exact(QK_K)).enumerate() {
            let qw = imatrix.map(|w| &w[ibl * QK_K..(ibl + 1) * QK_K]);
            y.scales_h = [0; 2];
            let scales = XsScales {
                h: &mut y.scales_h,
                l: &mut y.scales_l,
            };
            super_block(&tb, x, qw, &mut y.d, &mut y.qs, Some(scales));
        }
    }

    /// 32 values `dl * kvalues[q]` from 16 packed bytes (low nibbles first, then high nibbles).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn dequant32(qs: &[u8; 16], dl: f32, y: &mut [f32]) {
        assert!(y.len() == 32);
        let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
        let q = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
        let m4 = _mm_set1_epi8(0x0f);
        let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, m4));
        let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(q), m4));
        let d = _mm256_set1_ps(dl);
        let p = y.as_mut_ptr();
        for (k, v) in [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)]
            .into_iter()
            .enumerate()
        {
            let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
            _mm256_storeu_ps(p.add(8 * k), _mm256_mul_ps(d, f));
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_iq4_nl_avx2(src: &[u8], dst: &mut [f32]) {
        let blocks: &[BlockIq4Nl] = bytemuck::cast_slice(src);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK4_NL)) {
            dequant32(&b.qs, get_f16(b.d), y);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_iq4_xs_avx2(src: &[u8], dst: &mut [f32]) {
        let blocks: &[BlockIq4Xs] = bytemuck::cast_slice(src);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
            let d = get_f16(b.d);
            let scales_h = u16::from_le_bytes(b.scales_h);
            for (ib, (yb, qs)) in y.chunks_exact_mut(32).zip(b.qs.chunks_exact(16)).enumerate() {
                let lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
                let hi = ((scales_h >> (2 * ib)) & 3) as u8;
                let ls = (lo | (hi << 4)) as i32;
                let dl = d * (ls - 32) as f32;
                dequant32(qs.try_into().unwrap(), dl, yb);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_index_picks_nearest_with_ties_up() {
        let v = &KVALUES_IQ4NL;
        assert_eq!(best_index_int8(v, -200.0), 0);
        assert_eq!(best_index_int8(v, 200.0), 15);
        assert_eq!(best_index_int8(v, 1.0), 8);
        // halfway between 1 and 13 goes to the upper entry
        assert_eq!(best_index_int8(v, 7.0), 9);
        assert_eq!(best_index_int8(v, 6.9), 8);
    }

    /// xorshift64* and a few value distributions for the agreement tests.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545F4914F6CDD1D)
        }
        fn unit(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32
        }
        #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
        fn gauss(&mut self) -> f32 {
            let (u, v) = (self.unit().max(1e-7), self.unit());
            (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        }
    }

    /// One row of `n` values from a distribution picked by `kind`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn random_row(rng: &mut Rng, kind: u64, n: usize) -> Vec<f32> {
        let scale = [1e-3f32, 0.02, 1.0, 37.0, 1e-20, 1e25][(rng.next() % 6) as usize];
        (0..n)
            .map(|i| match kind % 9 {
                0 => rng.gauss() * scale,
                1 => (rng.unit() * 2.0 - 1.0) * scale,
                2 => {
                    let g = rng.gauss() * scale;
                    if rng.unit() < 0.01 {
                        g * 30.0
                    } else {
                        g
                    }
                }
                3 => {
                    if (i / 32) % 3 == 0 {
                        0.0
                    } else {
                        rng.gauss() * scale
                    }
                }
                4 => {
                    if (i / 32) % 2 == 0 {
                        1e-16 * rng.gauss()
                    } else {
                        rng.gauss()
                    }
                }
                5 => ((rng.next() % 9) as f32 - 4.0) * scale,
                6 => f32::from_bits(rng.next() as u32 & 0x807f_ffff), // subnormals and zeros
                7 => {
                    if rng.unit() < 0.5 {
                        scale
                    } else {
                        -scale
                    }
                }
                _ => match rng.next() % 50 {
                    0 => f32::NAN,
                    1 => f32::INFINITY,
                    2 => -f32::INFINITY,
                    _ => rng.gauss(),
                },
            })
            .collect()
    }

    #[test]
    fn thresholds_match_best_index() {
        let th = iq4_thresholds();
        let by_threshold = |x: f32| {
            th.iter()
                .filter(|&&t| x.partial_cmp(&t) != Some(std::cmp::Ordering::Less))
                .count()
        };
        let mut rng = Rng(7);
        let mut xs = vec![f32::NAN, f32::INFINITY, -f32::INFINITY, 0.0, -0.0, f32::MAX, f32::MIN];
        for &t in &th {
            for k in -2000i32..=2000 {
                xs.push(f32::from_bits((t.to_bits() as i32 + k) as u32));
            }
        }
        for &v in &KVALUES_IQ4NL {
            for k in -50i32..=50 {
                xs.push(f32::from_bits(((v as f32).to_bits() as i32 + k) as u32));
            }
        }
        for _ in 0..1_000_000 {
            xs.push((rng.unit() - 0.5) * 300.0);
            xs.push(f32::from_bits(rng.next() as u32));
        }
        for x in xs {
            assert_eq!(
                by_threshold(x),
                best_index_int8(&KVALUES_IQ4NL, x),
                "x = {x:e} ({:#x})",
                x.to_bits()
            );
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_quantize_matches_scalar() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut rng = Rng(20261129);
        let n = 512;
        for row in 0..3000u64 {
            let x = random_row(&mut rng, row, n);
            let w: Vec<f32> = (0..n).map(|_| rng.unit() * 3.0).collect();
            for im in [None, Some(&w[..])] {
                let (mut a, mut b) = (vec![0u8; n / 32 * 18], vec![0u8; n / 32 * 18]);
                quantize_iq4_nl_scalar(&x, &mut a, im);
                unsafe { x86::quantize_iq4_nl_avx2(&x, &mut b, im) };
                assert_eq!(a, b, "IQ4_NL row {row} imatrix {}", im.is_some());
                let (mut a, mut b) = (vec![0u8; n / 256 * 136], vec![0u8; n / 256 * 136]);
                quantize_iq4_xs_scalar(&x, &mut a, im);
                unsafe { x86::quantize_iq4_xs_avx2(&x, &mut b, im) };
                assert_eq!(a, b, "IQ4_XS row {row} imatrix {}", im.is_some());
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_dequantize_matches_scalar() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut rng = Rng(99);
        let bytes: Vec<u8> = (0..18 * 136 * 64).map(|_| rng.next() as u8).collect();
        let n = bytes.len() / 18 * 32;
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let (mut a, mut b) = (vec![0f32; n], vec![1f32; n]);
        dequantize_iq4_nl_scalar(&bytes, &mut a);
        unsafe { x86::dequantize_iq4_nl_avx2(&bytes, &mut b) };
        assert_eq!(bits(&a), bits(&b));
        let n = bytes.len() / 136 * 256;
        let (mut a, mut b) = (vec![0f32; n], vec![1f32; n]);
        dequantize_iq4_xs_scalar(&bytes, &mut a);
        unsafe { x86::dequantize_iq4_xs_avx2(&bytes, &mut b) };
        assert_eq!(bits(&a), bits(&b));
    }

    #[test]
    fn zero_block_round_trips_to_zero() {
        let src = [0f32; QK_K];
        let mut q = [0u8; 136];
        quantize_iq4_xs(&src, &mut q, None);
        let mut y = [1f32; QK_K];
        dequantize_iq4_xs(&q, &mut y);
        assert!(y.iter().all(|&v| v == 0.0));
    }
}
