//! AVX2 fast paths of the K-quant search routines and codecs, bit-identical to the scalar
//! reference code in `helpers.rs` and the type modules.
//!
//! The searches try many candidate scales, each summing weighted products over the group in a
//! fixed order. The scalar code (like ggml) runs the candidates one after another; here each
//! vector lane runs one candidate, so every lane's sums are still accumulated sequentially, in
//! the same order and with the same f32 operations (no FMA: each `mul` and `add` is a separate
//! IEEE operation, exactly as in the scalar code). Only independent candidates share a vector:
//! where the scalar code lets an accepted candidate change the next ones (the `min` of
//! `make_qkx2_quants`/`make_qkx3_quants`), the lanes after an acceptance are recomputed.
//! Element-wise work (requantization, dequantization) is vectorised directly.
//!
//! Everything here requires AVX2; callers check [`has_avx2`] first.

#![cfg(target_arch = "x86_64")]

use super::helpers::{GROUP_MAX_EPS, MAX_QKX_GROUP};
use std::arch::x86_64::*;

#[cfg(test)]
thread_local! {
    /// Set by the agreement tests to run the scalar reference paths on this thread.
    pub(crate) static FORCE_SCALAR: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the AVX2 paths may be used (cached by std after the first call).
#[inline]
pub(crate) fn has_avx2() -> bool {
    #[cfg(test)]
    if FORCE_SCALAR.with(|f| f.get()) {
        return false;
    }
    is_x86_feature_detected!("avx2")
}

/// `nearest_int` on eight lanes: the same float addition and bit extraction as
/// [`crate::fp::nearest_int`].
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nearest_int_v(v: __m256) -> __m256i {
    let val = _mm256_add_ps(v, _mm256_set1_ps(12_582_912.0));
    _mm256_sub_epi32(
        _mm256_and_si256(_mm256_castps_si256(val), _mm256_set1_epi32(0x007f_ffff)),
        _mm256_set1_epi32(0x0040_0000),
    )
}

/// `max(lo, min(hi, l))` on eight lanes (i32; the same as `l.clamp(lo, hi)` for `lo <= hi`).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn clamp_v(l: __m256i, lo: __m256i, hi: __m256i) -> __m256i {
    _mm256_max_epi32(lo, _mm256_min_epi32(hi, l))
}

/// `make_qx_quants` with `rmse_type == 1` (weights `qw` or x²) and `x.len() <= 32`.
///
/// The reference first quantizes with `-nmax / max`, then tries `is = -9..=9` (skipping 0), all
/// with scales that depend only on `max`: the 19 candidates are independent, so all of them are
/// summed in three vectors and the acceptance tests then run in the reference's order.
// ggml-quants.c: make_qx_quants (rmse_type 1)
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn make_qx_quants_rmse1(nmax: i32, x: &[f32], levels: &mut [i8], qw: Option<&[f32]>) -> f32 {
    let n = x.len();
    assert!(n <= 32);
    let levels = &mut levels[..n];
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let mut w = [0f32; 32];
    let mut wx = [0f32; 32];
    match qw {
        Some(q) => {
            let q = &q[..n];
            for i in 0..n {
                w[i] = q[i];
                wx[i] = q[i] * x[i];
            }
        }
        None => {
            for i in 0..n {
                w[i] = x[i] * x[i];
                wx[i] = w[i] * x[i];
            }
        }
    }
    // Candidate 0 is the initial scale, 1..=9 are is = -9..=-1 and 10..=18 are is = 1..=9; the
    // padding lanes repeat candidate 0 and are ignored.
    let mut isc = [0f32; 24];
    isc[0] = -(nmax as f32) / max;
    let mut k = 1;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        isc[k] = -(nmax as f32 + 0.1 * is as f32) / max;
        k += 1;
    }
    for k in 19..24 {
        isc[k] = isc[0];
    }
    let lo = _mm256_set1_epi32(-nmax);
    let hi = _mm256_set1_epi32(nmax - 1);
    let s0 = _mm256_loadu_ps(isc.as_ptr());
    let s1 = _mm256_loadu_ps(isc.as_ptr().add(8));
    let s2 = _mm256_loadu_ps(isc.as_ptr().add(16));
    let (mut lx0, mut lx1, mut lx2) = (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
    let (mut l20, mut l21, mut l22) = (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
    for i in 0..n {
        let xv = _mm256_set1_ps(x[i]);
        let wv = _mm256_set1_ps(w[i]);
        let wxv = _mm256_set1_ps(wx[i]);
        let f0 = _mm256_cvtepi32_ps(clamp_v(nearest_int_v(_mm256_mul_ps(s0, xv)), lo, hi));
        let f1 = _mm256_cvtepi32_ps(clamp_v(nearest_int_v(_mm256_mul_ps(s1, xv)), lo, hi));
        let f2 = _mm256_cvtepi32_ps(clamp_v(nearest_int_v(_mm256_mul_ps(s2, xv)), lo, hi));
        // sumlx += w * x[i] * l; suml2 += w * l * l (left to right, as in C).
        lx0 = _mm256_add_ps(lx0, _mm256_mul_ps(wxv, f0));
        lx1 = _mm256_add_ps(lx1, _mm256_mul_ps(wxv, f1));
        lx2 = _mm256_add_ps(lx2, _mm256_mul_ps(wxv, f2));
        l20 = _mm256_add_ps(l20, _mm256_mul_ps(_mm256_mul_ps(wv, f0), f0));
        l21 = _mm256_add_ps(l21, _mm256_mul_ps(_mm256_mul_ps(wv, f1), f1));
        l22 = _mm256_add_ps(l22, _mm256_mul_ps(_mm256_mul_ps(wv, f2), f2));
    }
    let mut slx = [0f32; 24];
    let mut sl2 = [0f32; 24];
    _mm256_storeu_ps(slx.as_mut_ptr(), lx0);
    _mm256_storeu_ps(slx.as_mut_ptr().add(8), lx1);
    _mm256_storeu_ps(slx.as_mut_ptr().add(16), lx2);
    _mm256_storeu_ps(sl2.as_mut_ptr(), l20);
    _mm256_storeu_ps(sl2.as_mut_ptr().add(8), l21);
    _mm256_storeu_ps(sl2.as_mut_ptr().add(16), l22);

    let (sumlx, suml2) = (slx[0], sl2[0]);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    let mut chosen = 0;
    for k in 1..19 {
        let (sumlx, suml2) = (slx[k], sl2[k]);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            scale = sumlx / suml2;
            best = scale * sumlx;
            chosen = k;
        }
    }
    // The levels of the last accepted candidate (or of the initial scale).
    let sv = _mm256_set1_ps(isc[chosen]);
    let nm = _mm256_set1_epi32(nmax);
    let mut li = [0i32; 32];
    let mut xs = [0f32; 32];
    xs[..n].copy_from_slice(x);
    for c in 0..n.div_ceil(8) {
        let v = _mm256_mul_ps(sv, _mm256_loadu_ps(xs.as_ptr().add(8 * c)));
        let l = _mm256_add_epi32(nm, clamp_v(nearest_int_v(v), lo, hi));
        _mm256_storeu_si256(li.as_mut_ptr().add(8 * c) as *mut __m256i, l);
    }
    for (q, &l) in levels.iter_mut().zip(&li) {
        *q = l as i8;
    }
    scale
}

/// A candidate's level of each lane's `v = iscale * (x - min)`: `clamp(nearest_int(v), 0, nmax)`,
/// or with `GUARD` (make_qkx3_quants) `v > 0 ? nearest_int(MIN(v, nmax)) : 0` (minps returns its
/// second operand unless the first is smaller, as C's MIN does, inf and NaN included).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn candidate_level<const GUARD: bool>(v: __m256, nmaxv: __m256, hi: __m256i) -> __m256i {
    if GUARD {
        let l = nearest_int_v(_mm256_min_ps(v, nmaxv));
        _mm256_and_si256(
            l,
            _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(v, _mm256_setzero_ps())),
        )
    } else {
        clamp_v(nearest_int_v(v), _mm256_setzero_si256(), hi)
    }
}

/// The weighted least-squares fit of make_qkx2/3_quants for candidate levels with sums
/// `sum_l`, `sum_l2`, `sum_xl`: `(det, this_scale, this_min)`, a positive min replaced by 0 and
/// the scale refitted (`sum_xl / sum_l2`), in the C code's operation order.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn fit_scale_min(
    sum_w: __m256,
    sum_x: __m256,
    sum_l: __m256,
    sum_l2: __m256,
    sum_xl: __m256,
) -> (__m256, __m256, __m256) {
    let det = _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_l2), _mm256_mul_ps(sum_l, sum_l));
    let ts = _mm256_div_ps(
        _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_xl), _mm256_mul_ps(sum_x, sum_l)),
        det,
    );
    let tm = _mm256_div_ps(
        _mm256_sub_ps(_mm256_mul_ps(sum_l2, sum_x), _mm256_mul_ps(sum_l, sum_xl)),
        det,
    );
    let pos = _mm256_cmp_ps::<_CMP_GT_OQ>(tm, _mm256_setzero_ps());
    let tm = _mm256_andnot_ps(pos, tm);
    let ts = _mm256_blendv_ps(ts, _mm256_div_ps(sum_xl, sum_l2), pos);
    (det, ts, tm)
}

/// `make_qkx2_quants` (`GUARD == false`) or `make_qkx3_quants` (`GUARD == true`, with weights
/// already materialised) for `x.len() <= 32`; `MAD` selects the absolute error.
///
/// Candidate `is` quantizes with `(rmin + rdelta * is + nmax) / (max - min)` where `min` is the
/// best min so far: eight consecutive candidates are evaluated at once with the current `min`,
/// then accepted in order; after an acceptance (which changes `min`) the following candidates are
/// evaluated again from scratch.
// ggml-quants.c: make_qkx2_quants / make_qkx3_quants
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn make_qkx_quants<const GUARD: bool, const MAD: bool>(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    assert!(n > 0 && n <= MAX_QKX_GROUP);
    let levels = &mut levels[..n];
    let weights = &weights[..n];
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if (GUARD && max <= min) || (!GUARD && max == min) {
        levels.fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if MAD { diff.abs() } else { diff * diff };
    let nmaxf = nmax as f32;
    let iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = crate::fp::nearest_int(iscale * (x[i] - min));
        levels[i] = l.clamp(0, nmax) as u8;
        let diff = err(scale * levels[i] as f32 + min - x[i]);
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }

    let zero = _mm256_setzero_ps();
    let hi = _mm256_set1_epi32(nmax);
    let nmaxv = _mm256_set1_ps(nmaxf);
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let sum_wv = _mm256_set1_ps(sum_w);
    let sum_xv = _mm256_set1_ps(sum_x);
    let mut laux = [[0i32; 8]; MAX_QKX_GROUP];
    let mut lf = [_mm256_setzero_ps(); MAX_QKX_GROUP];
    let mut xm = [0f32; MAX_QKX_GROUP];
    let mut start = 0i32;
    while start <= nstep {
        let mut num = [0f32; 8];
        for (k, v) in num.iter_mut().enumerate() {
            *v = rmin + rdelta * (start + k as i32) as f32 + nmaxf;
        }
        let isv = _mm256_div_ps(_mm256_loadu_ps(num.as_ptr()), _mm256_set1_ps(max - min));
        for i in 0..n {
            xm[i] = x[i] - min;
        }
        let mut sum_l = zero;
        let mut sum_l2 = zero;
        let mut sum_xl = zero;
        for i in 0..n {
            let v = _mm256_mul_ps(isv, _mm256_set1_ps(xm[i]));
            let l = candidate_level::<GUARD>(v, nmaxv, hi);
            _mm256_storeu_si256(laux[i].as_mut_ptr() as *mut __m256i, l);
            let f = _mm256_cvtepi32_ps(l);
            lf[i] = f;
            let wl = _mm256_mul_ps(_mm256_set1_ps(weights[i]), f);
            sum_l = _mm256_add_ps(sum_l, wl);
            sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(wl, f));
            sum_xl = _mm256_add_ps(sum_xl, _mm256_mul_ps(wl, _mm256_set1_ps(x[i])));
        }
        let (det, ts, tm) = fit_scale_min(sum_wv, sum_xv, sum_l, sum_l2, sum_xl);
        let mut cur = zero;
        for i in 0..n {
            let d = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(ts, lf[i]), tm), _mm256_set1_ps(x[i]));
            let e = if MAD {
                _mm256_and_ps(d, abs_mask)
            } else {
                _mm256_mul_ps(d, d)
            };
            cur = _mm256_add_ps(cur, _mm256_mul_ps(_mm256_set1_ps(weights[i]), e));
        }
        let mut det_a = [0f32; 8];
        let mut cur_a = [0f32; 8];
        let mut ts_a = [0f32; 8];
        let mut tm_a = [0f32; 8];
        _mm256_storeu_ps(det_a.as_mut_ptr(), det);
        _mm256_storeu_ps(cur_a.as_mut_ptr(), cur);
        _mm256_storeu_ps(ts_a.as_mut_ptr(), ts);
        _mm256_storeu_ps(tm_a.as_mut_ptr(), tm);
        let lanes = ((nstep - start + 1) as usize).min(8);
        let mut next = start + 8;
        for k in 0..lanes {
            if det_a[k] > 0.0 && cur_a[k] < best_error {
                for (q, l) in levels.iter_mut().zip(&laux) {
                    *q = l[k] as u8;
                }
                best_error = cur_a[k];
                scale = ts_a[k];
                min = tm_a[k];
                next = start + k as i32 + 1;
                break;
            }
        }
        start = next;
    }
    (scale, -min)
}

/// [`make_qkx_quants`] on eight groups of `n <= 32` values at once (`x`, `weights` and `levels`
/// hold the groups one after another), one group per vector lane.
///
/// Each lane runs its group's whole search, candidate after candidate, with the same f32
/// operations in the same order as the scalar code: the groups are independent, so unlike
/// [`make_qkx_quants`] no lane's work is ever discarded when a candidate is accepted. The
/// per-group `(scale, the_min)` results go to `scales` and `mins`.
// ggml-quants.c: make_qkx2_quants / make_qkx3_quants
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn make_qkx_quants_x8<const GUARD: bool, const MAD: bool>(
    nmax: i32,
    n: usize,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    scales: &mut [f32],
    mins: &mut [f32],
) {
    assert!(n > 0 && n <= MAX_QKX_GROUP);
    assert!(x.len() == 8 * n && weights.len() == 8 * n && levels.len() == 8 * n);
    assert!(scales.len() == 8 && mins.len() == 8);
    // Transposed: element i of every group in one vector.
    let mut xt = [_mm256_setzero_ps(); MAX_QKX_GROUP];
    let mut wt = [_mm256_setzero_ps(); MAX_QKX_GROUP];
    let mut buf = [[0f32; 8]; MAX_QKX_GROUP];
    let mut wbuf = [[0f32; 8]; MAX_QKX_GROUP];
    for g in 0..8 {
        for i in 0..n {
            buf[i][g] = x[g * n + i];
            wbuf[i][g] = weights[g * n + i];
        }
    }
    for i in 0..n {
        xt[i] = _mm256_loadu_ps(buf[i].as_ptr());
        wt[i] = _mm256_loadu_ps(wbuf[i].as_ptr());
    }
    let xt = &xt[..n];
    let wt = &wt[..n];

    let zero = _mm256_setzero_ps();
    let mut min = xt[0];
    let mut max = xt[0];
    let sum_w = {
        let mut s = wt[0];
        for &w in &wt[1..] {
            s = _mm256_add_ps(s, w);
        }
        s
    };
    let sum_x = {
        let mut s = _mm256_mul_ps(wt[0], xt[0]);
        for i in 1..n {
            s = _mm256_add_ps(s, _mm256_mul_ps(wt[i], xt[i]));
        }
        s
    };
    for &v in &xt[1..] {
        // `if x < min { min = x }`: minps returns its second operand unless the first is smaller.
        min = _mm256_min_ps(v, min);
        max = _mm256_max_ps(v, max);
    }
    min = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(min, zero), min);
    let empty = if GUARD {
        _mm256_cmp_ps::<_CMP_LE_OQ>(max, min)
    } else {
        _mm256_cmp_ps::<_CMP_EQ_OQ>(max, min)
    };
    let empty_min = min;

    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let err = |d: __m256| {
        if MAD {
            _mm256_and_ps(d, abs_mask)
        } else {
            _mm256_mul_ps(d, d)
        }
    };
    let lo = _mm256_setzero_si256();
    let hi = _mm256_set1_epi32(nmax);
    let nmaxf = nmax as f32;
    let nmaxv = _mm256_set1_ps(nmaxf);

    let mut best_l = [_mm256_setzero_si256(); MAX_QKX_GROUP];
    let best_l = &mut best_l[..n];
    let iscale = _mm256_div_ps(nmaxv, _mm256_sub_ps(max, min));
    let mut scale = _mm256_div_ps(_mm256_set1_ps(1.0), iscale);
    let mut best_error = zero;
    for i in 0..n {
        let l = clamp_v(nearest_int_v(_mm256_mul_ps(iscale, _mm256_sub_ps(xt[i], min))), lo, hi);
        best_l[i] = l;
        let d = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(l)), min), xt[i]);
        best_error = _mm256_add_ps(best_error, _mm256_mul_ps(wt[i], err(d)));
    }

    if nstep >= 1 {
        let mut cand = [_mm256_setzero_si256(); MAX_QKX_GROUP];
        let mut lf = [_mm256_setzero_ps(); MAX_QKX_GROUP];
        let cand = &mut cand[..n];
        let lf = &mut lf[..n];
        for is in 0..=nstep {
            let num = _mm256_set1_ps(rmin + rdelta * is as f32 + nmaxf);
            let iscale = _mm256_div_ps(num, _mm256_sub_ps(max, min));
            let mut sum_l = zero;
            let mut sum_l2 = zero;
            let mut sum_xl = zero;
            for i in 0..n {
                let v = _mm256_mul_ps(iscale, _mm256_sub_ps(xt[i], min));
                let l = candidate_level::<GUARD>(v, nmaxv, hi);
                cand[i] = l;
                let f = _mm256_cvtepi32_ps(l);
                lf[i] = f;
                let wl = _mm256_mul_ps(wt[i], f);
                sum_l = _mm256_add_ps(sum_l, wl);
                sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(wl, f));
                sum_xl = _mm256_add_ps(sum_xl, _mm256_mul_ps(wl, xt[i]));
            }
            let (det, ts, tm) = fit_scale_min(sum_w, sum_x, sum_l, sum_l2, sum_xl);
            let mut cur = zero;
            for i in 0..n {
                let d = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(ts, lf[i]), tm), xt[i]);
                cur = _mm256_add_ps(cur, _mm256_mul_ps(wt[i], err(d)));
            }
            let take = _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_GT_OQ>(det, zero),
                _mm256_cmp_ps::<_CMP_LT_OQ>(cur, best_error),
            );
            if _mm256_movemask_ps(take) != 0 {
                let takei = _mm256_castps_si256(take);
                for (b, &c) in best_l.iter_mut().zip(cand.iter()) {
                    *b = _mm256_blendv_epi8(*b, c, takei);
                }
                best_error = _mm256_blendv_ps(best_error, cur, take);
                scale = _mm256_blendv_ps(scale, ts, take);
                min = _mm256_blendv_ps(min, tm, take);
            }
        }
    }

    // Empty groups: all-zero levels, scale 0 and the clamped min.
    let keep = _mm256_castps_si256(empty);
    let mut lt = [[0i32; 8]; MAX_QKX_GROUP];
    for i in 0..n {
        _mm256_storeu_si256(lt[i].as_mut_ptr() as *mut __m256i, _mm256_andnot_si256(keep, best_l[i]));
    }
    for g in 0..8 {
        for i in 0..n {
            levels[g * n + i] = lt[i][g] as u8;
        }
    }
    let scale = _mm256_andnot_ps(empty, scale);
    let min = _mm256_blendv_ps(min, empty_min, empty);
    let neg = _mm256_xor_ps(min, _mm256_set1_ps(-0.0));
    _mm256_storeu_ps(scales.as_mut_ptr(), scale);
    _mm256_storeu_ps(mins.as_mut_ptr(), neg);
}

/// `levels[i] = clamp(nearest_int((x[i] + dm) / d), 0, nmax)` for `x.len()` a multiple of 8.
// ggml-quants.c: the requantization loops of quantize_row_q2_K/q4_K/q5_K (ref and impl)
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn requant_asym(x: &[f32], d: f32, dm: f32, nmax: i32, levels: &mut [u8]) {
    let (dv, dmv) = (_mm256_set1_ps(d), _mm256_set1_ps(dm));
    let (lo, hi) = (_mm256_setzero_si256(), _mm256_set1_epi32(nmax));
    for (xs, ls) in x.chunks_exact(8).zip(levels.chunks_exact_mut(8)) {
        let v = _mm256_div_ps(_mm256_add_ps(_mm256_loadu_ps(xs.as_ptr()), dmv), dv);
        let mut l = [0i32; 8];
        _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, clamp_v(nearest_int_v(v), lo, hi));
        for (q, &l) in ls.iter_mut().zip(&l) {
            *q = l as u8;
        }
    }
}

/// `levels[i] = clamp(nearest_int(x[i] / d), lo, hi) + off` for `x.len()` a multiple of 8.
// ggml-quants.c: the requantization loops of quantize_row_q3_K/q6_K (ref and impl)
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn requant_sym(x: &[f32], d: f32, lo: i32, hi: i32, off: i32, levels: &mut [i8]) {
    let dv = _mm256_set1_ps(d);
    let (lov, hiv, offv) = (_mm256_set1_epi32(lo), _mm256_set1_epi32(hi), _mm256_set1_epi32(off));
    for (xs, ls) in x.chunks_exact(8).zip(levels.chunks_exact_mut(8)) {
        let v = _mm256_div_ps(_mm256_loadu_ps(xs.as_ptr()), dv);
        let mut l = [0i32; 8];
        let q = _mm256_add_epi32(clamp_v(nearest_int_v(v), lov, hiv), offv);
        _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, q);
        for (q, &l) in ls.iter_mut().zip(&l) {
            *q = l as i8;
        }
    }
}

/// `make_q3_quants` with `do_rmse` for `x.len() <= 32`.
///
/// The coordinate descent visits the values in order and only an accepted change alters the
/// running sums; the proposal `nearest_int(x * sl2 / slx)` of every value is computed at once
/// from the current sums, and only the values whose proposal differs from their level are then
/// visited in order (the others change nothing in the reference either). After an accepted change
/// the proposals are recomputed from the new sums.
// ggml-quants.c: make_q3_quants (do_rmse)
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn make_q3_quants_rmse(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let n = x.len();
    assert!(n <= 32);
    let levels = &mut levels[..n];
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut xs = [0f32; 32];
    let mut w = [0f32; 32];
    let mut wx = [0f32; 32];
    let mut l = [0i32; 32];
    xs[..n].copy_from_slice(x);
    let (lo, hi) = (_mm256_set1_epi32(-nmax), _mm256_set1_epi32(nmax - 1));
    let chunks = n.div_ceil(8);
    for c in 0..chunks {
        let xv = _mm256_loadu_ps(xs.as_ptr().add(8 * c));
        let wv = _mm256_mul_ps(xv, xv);
        _mm256_storeu_ps(w.as_mut_ptr().add(8 * c), wv);
        _mm256_storeu_ps(wx.as_mut_ptr().add(8 * c), _mm256_mul_ps(wv, xv));
        let lv = clamp_v(nearest_int_v(_mm256_mul_ps(_mm256_set1_ps(iscale), xv)), lo, hi);
        _mm256_storeu_si256(l.as_mut_ptr().add(8 * c) as *mut __m256i, lv);
    }
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for i in 0..n {
        let lf = l[i] as f32;
        sumlx += wx[i] * lf;
        suml2 += w[i] * lf * lf;
    }
    // Bit i of `valid` marks the values 0..n.
    let valid: u64 = (1u64 << n) - 1;
    let zero = _mm256_setzero_ps();
    for _ in 0..5 {
        let mut n_changed = 0;
        // Values before `from` have been visited in this pass.
        let mut from = 0usize;
        'proposals: while from < n {
            let (slxv, sl2v) = (_mm256_set1_ps(sumlx), _mm256_set1_ps(suml2));
            let mut cand = 0u64;
            for c in 0..chunks {
                let lv = _mm256_loadu_si256(l.as_ptr().add(8 * c) as *const __m256i);
                let li = _mm256_cvtepi32_ps(lv);
                let wv = _mm256_loadu_ps(w.as_ptr().add(8 * c));
                let slx = _mm256_sub_ps(slxv, _mm256_mul_ps(_mm256_loadu_ps(wx.as_ptr().add(8 * c)), li));
                let sl2 = _mm256_sub_ps(sl2v, _mm256_mul_ps(_mm256_mul_ps(wv, li), li));
                let xv = _mm256_loadu_ps(xs.as_ptr().add(8 * c));
                let nl = clamp_v(nearest_int_v(_mm256_div_ps(_mm256_mul_ps(xv, sl2), slx)), lo, hi);
                let differs = _mm256_xor_si256(_mm256_cmpeq_epi32(nl, lv), _mm256_set1_epi32(-1));
                let pos = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(slx, zero));
                let m = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_and_si256(differs, pos))) as u32 as u64;
                cand |= m << (8 * c);
            }
            cand &= valid & !((1u64 << from) - 1);
            while cand != 0 {
                let i = cand.trailing_zeros() as usize;
                cand &= cand - 1;
                // The reference's step for value i, which the proposal says may change it.
                let li = l[i] as f32;
                let mut slx = sumlx - wx[i] * li;
                let mut sl2 = suml2 - w[i] * li * li;
                let new_l = crate::fp::nearest_int(xs[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                let nl = new_l as f32;
                slx += wx[i] * nl;
                sl2 += w[i] * nl * nl;
                if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                    l[i] = new_l;
                    sumlx = slx;
                    suml2 = sl2;
                    n_changed += 1;
                    from = i + 1;
                    continue 'proposals;
                }
            }
            break;
        }
        if n_changed == 0 {
            break;
        }
    }
    for (q, &l) in levels.iter_mut().zip(&l) {
        *q = (l + nmax) as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Eight bytes at `p`, zero-extended to i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load8_u8(p: &[u8]) -> __m256i {
    let b: &[u8; 8] = p[..8].try_into().unwrap();
    _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.as_ptr() as *const __m128i))
}

/// Stores `d * q - m` (a multiply then a subtraction, as ggml computes it) to `out[..8]`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store_dq(out: &mut [f32], d: __m256, q: __m256i, m: __m256) {
    let out: &mut [f32; 8] = (&mut out[..8]).try_into().unwrap();
    _mm256_storeu_ps(
        out.as_mut_ptr(),
        _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(q)), m),
    );
}

/// Stores `d * q` to `out[..8]`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store_mul(out: &mut [f32], d: __m256, q: __m256i) {
    let out: &mut [f32; 8] = (&mut out[..8]).try_into().unwrap();
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
}

// ggml-quants.c: dequantize_row_q2_K (one block)
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn dequant_q2_k(b: &super::BlockQ2K, y: &mut [f32; 256]) {
    let d = crate::fp::get_f16(b.d);
    let min = crate::fp::get_f16(b.dmin);
    let three = _mm256_set1_epi32(3);
    let mut is = 0;
    let mut o = 0;
    for q in b.qs.chunks_exact(32) {
        for shift in (0..8).step_by(2) {
            let sh = _mm_cvtsi32_si128(shift);
            for half in q.chunks_exact(16) {
                let sc = b.scales[is];
                is += 1;
                let dl = _mm256_set1_ps(d * (sc & 0xF) as f32);
                let ml = _mm256_set1_ps(min * (sc >> 4) as f32);
                for k in 0..2 {
                    let v = _mm256_and_si256(_mm256_srl_epi32(load8_u8(&half[8 * k..]), sh), three);
                    store_dq(&mut y[o + 8 * k..], dl, v, ml);
                }
                o += 16;
            }
        }
    }
}

// ggml-quants.c: dequantize_row_q3_K (one block)
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn dequant_q3_k(b: &super::BlockQ3K, y: &mut [f32; 256]) {
    let d_all = crate::fp::get_f16(b.d);
    let three = _mm256_set1_epi32(3);
    let four = _mm256_set1_epi32(4);
    let mut is = 0;
    let mut o = 0;
    let mut m = 1i32;
    for q in b.qs.chunks_exact(32) {
        for shift in (0..8).step_by(2) {
            let sh = _mm_cvtsi32_si128(shift);
            let mv = _mm256_set1_epi32(m);
            for half in 0..2 {
                let dl = _mm256_set1_ps(d_all * super::q3_k::scale(&b.scales, is) as f32);
                is += 1;
                for k in 0..2 {
                    let at = 16 * half + 8 * k;
                    let v = _mm256_and_si256(_mm256_srl_epi32(load8_u8(&q[at..]), sh), three);
                    // (hm & m) ? 0 : 4
                    let set = _mm256_cmpeq_epi32(_mm256_and_si256(load8_u8(&b.hmask[at..]), mv), mv);
                    let v = _mm256_sub_epi32(v, _mm256_andnot_si256(set, four));
                    store_mul(&mut y[o + 8 * k..], dl, v);
                }
                o += 16;
            }
            m <<= 1;
        }
    }
}

/// Shared by Q4_K (`qh == None`) and Q5_K.
// ggml-quants.c: dequantize_row_q4_K / dequantize_row_q5_K (one block)
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn dequant_q45_k(
    d: f32,
    min: f32,
    scales: &[u8; 12],
    qs: &[u8; 128],
    qh: Option<&[u8; 32]>,
    y: &mut [f32; 256],
) {
    let low = _mm256_set1_epi32(0xF);
    let sixteen = _mm256_set1_epi32(16);
    for (j, (q, out)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = super::helpers::get_scale_min_k4(2 * j, scales);
        let (sc2, m2) = super::helpers::get_scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (_mm256_set1_ps(d * sc1 as f32), _mm256_set1_ps(min * m1 as f32));
        let (d2, m2) = (_mm256_set1_ps(d * sc2 as f32), _mm256_set1_ps(min * m2 as f32));
        let (u1, u2) = (_mm256_set1_epi32(1 << (2 * j)), _mm256_set1_epi32(2 << (2 * j)));
        for l in (0..32).step_by(8) {
            let b = load8_u8(&q[l..]);
            let mut lo = _mm256_and_si256(b, low);
            let mut hi = _mm256_srli_epi32::<4>(b);
            if let Some(qh) = qh {
                let h = load8_u8(&qh[l..]);
                lo = _mm256_add_epi32(
                    lo,
                    _mm256_and_si256(_mm256_cmpeq_epi32(_mm256_and_si256(h, u1), u1), sixteen),
                );
                hi = _mm256_add_epi32(
                    hi,
                    _mm256_and_si256(_mm256_cmpeq_epi32(_mm256_and_si256(h, u2), u2), sixteen),
                );
            }
            store_dq(&mut out[l..], d1, lo, m1);
            store_dq(&mut out[l + 32..], d2, hi, m2);
        }
    }
}

// ggml-quants.c: dequantize_row_q6_K (one block)
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn dequant_q6_k(b: &super::BlockQ6K, y: &mut [f32; 256]) {
    let d = crate::fp::get_f16(b.d);
    let low = _mm256_set1_epi32(0xF);
    let three = _mm256_set1_epi32(3);
    let off = _mm256_set1_epi32(32);
    let chunks = b.ql.chunks_exact(64).zip(b.qh.chunks_exact(32));
    for (n, ((ql, qh), out)) in chunks.zip(y.chunks_exact_mut(128)).enumerate() {
        let sc = &b.scales[8 * n..8 * (n + 1)];
        let scale = |i: usize| _mm256_set1_ps(d * (sc[i] as i8) as f32);
        for l in (0..32).step_by(8) {
            let is = l / 16;
            let a = load8_u8(&ql[l..]);
            let c = load8_u8(&ql[l + 32..]);
            let h = load8_u8(&qh[l..]);
            let hb =
                |s: i32| _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srlv_epi32(h, _mm256_set1_epi32(s)), three));
            let q1 = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(a, low), hb(0)), off);
            let q2 = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(c, low), hb(2)), off);
            let q3 = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32::<4>(a), hb(4)), off);
            let q4 = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32::<4>(c), hb(6)), off);
            store_mul(&mut out[l..], scale(is), q1);
            store_mul(&mut out[l + 32..], scale(is + 2), q2);
            store_mul(&mut out[l + 64..], scale(is + 4), q3);
            store_mul(&mut out[l + 96..], scale(is + 6), q4);
        }
    }
}

// ggml-quants.c: dequantize_row_q8_K (one block)
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn dequant_q8_k(b: &super::BlockQ8K, y: &mut [f32; 256]) {
    let d = _mm256_set1_ps(f32::from_le_bytes(b.d));
    for (q, out) in b.qs.chunks_exact(8).zip(y.chunks_exact_mut(8)) {
        let q: &[u8; 8] = q.try_into().unwrap();
        let v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr() as *const __m128i));
        store_mul(out, d, v);
    }
}
