//! The scale/quant search routines of ggml's K-quants (`ggml/src/ggml-quants.c`), shared with
//! other families (the IQ types reuse several of them).
//!
//! Every routine performs the same f32 operations in the same order as ggml (no fused
//! multiply-add, no reassociation), and converts between integers and floats where the C does,
//! so the results are bit-identical.

use crate::fp::nearest_int;

/// Values per super-block of every K-quant type (`QK_K`).
pub(crate) const QK_K: usize = 256;

/// Groups whose largest magnitude is below this are treated as all zero (`GROUP_MAX_EPS`).
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// Largest group `make_qkx2_quants` / `make_qkx3_quants` accept (their scratch buffer size).
pub(crate) const MAX_QKX_GROUP: usize = 32;

/// C's `MIN(a, b)` on floats: `a < b ? a : b` (differs from `f32::min` for NaN).
// ggml-impl.h: MIN
#[inline]
fn c_min(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

/// Symmetric quantization of `x` to `nmax + clamp(l, -nmax, nmax - 1)` in `levels`, returning
/// the scale. `rmse_type` 0 takes the plain `amax` scale; 1..4 weight the least-squares refinement
/// with x², 1, |x| or sqrt|x| (or with `qw` when given); a negative `rmse_type` returns early
/// after one refinement, as in ggml.
// ggml-quants.c: make_qx_quants
pub(crate) fn make_qx_quants_scalar(
    nmax: i32,
    x: &[f32],
    levels: &mut [i8],
    rmse_type: i32,
    qw: Option<&[f32]>,
) -> f32 {
    let n = x.len();
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
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for (q, &v) in levels.iter_mut().zip(x) {
            *q = (nmax + clamp(nearest_int(iscale * v))) as i8;
        }
        return 1.0 / iscale;
    }
    let return_early = rmse_type < 0;
    let rmse_type = rmse_type.abs();
    let weight = |i: usize| -> f32 {
        match qw {
            Some(w) => w[i],
            None => match rmse_type {
                1 => x[i] * x[i],
                2 => 1.0,
                3 => x[i].abs(),
                _ => x[i].abs().sqrt(),
            },
        }
    };
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for i in 0..n {
        let l = clamp(nearest_int(iscale * x[i]));
        levels[i] = (l + nmax) as i8;
        let w = weight(i);
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for (i, &xi) in x.iter().enumerate() {
            let lf = clamp(nearest_int(iscale * xi)) as f32;
            let w = weight(i);
            sumlx += w * xi * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (q, &v) in levels.iter_mut().zip(x) {
                *q = (nmax + clamp(nearest_int(iscale * v))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric quantization of `x` to `nmax + clamp(l, -nmax, nmax - 1)` in `levels`, returning
/// the scale: [`make_qx_quants_scalar`], through the AVX2 path where available (same results).
// ggml-quants.c: make_qx_quants
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [i8], rmse_type: i32, qw: Option<&[f32]>) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if rmse_type == 1 && x.len() <= 32 && super::fast::has_avx2() {
        // SAFETY: AVX2 is available.
        return unsafe { super::fast::make_qx_quants_rmse1(nmax, x, levels, qw) };
    }
    make_qx_quants_scalar(nmax, x, levels, rmse_type, qw)
}

/// [`make_qkx2_quants_scalar`], through the AVX2 path where available (same results).
// ggml-quants.c: make_qkx2_quants
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if super::fast::has_avx2() {
        // SAFETY: AVX2 is available.
        return unsafe {
            if use_mad {
                super::fast::make_qkx_quants::<false, true>(nmax, x, weights, levels, rmin, rdelta, nstep)
            } else {
                super::fast::make_qkx_quants::<false, false>(nmax, x, weights, levels, rmin, rdelta, nstep)
            }
        };
    }
    make_qkx2_quants_scalar(nmax, x, weights, levels, rmin, rdelta, nstep, use_mad)
}

/// [`make_qkx3_quants_scalar`], through the AVX2 path where available (same results).
// ggml-quants.c: make_qkx3_quants
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx3_quants(
    nmax: i32,
    x: &[f32],
    weights: Option<&[f32]>,
    levels: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if !x.is_empty() && x.len() <= MAX_QKX_GROUP && super::fast::has_avx2() {
        let mut wbuf = [0f32; MAX_QKX_GROUP];
        let w = match weights {
            Some(w) => &w[..x.len()],
            None => {
                for (w, &v) in wbuf.iter_mut().zip(x) {
                    *w = v * v;
                }
                &wbuf[..x.len()]
            }
        };
        // SAFETY: AVX2 is available.
        return unsafe {
            if use_mad {
                super::fast::make_qkx_quants::<true, true>(nmax, x, w, levels, rmin, rdelta, nstep)
            } else {
                super::fast::make_qkx_quants::<true, false>(nmax, x, w, levels, rmin, rdelta, nstep)
            }
        };
    }
    make_qkx3_quants_scalar(nmax, x, weights, levels, rmin, rdelta, nstep, use_mad)
}

/// The search of [`make_qkx2_quants`] (`guard == false`) or [`make_qkx3_quants`] (`guard ==
/// true`, weights given) run on each of the consecutive groups of `group` values in `x`, with
/// each group's `(scale, the_min)` written to `scales[g]` and `mins[g]`. Same results as calling
/// them group by group; with AVX2 eight groups are searched at once, one per vector lane.
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx_groups(
    guard: bool,
    use_mad: bool,
    nmax: i32,
    group: usize,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    (rmin, rdelta, nstep): (f32, f32, i32),
    scales: &mut [f32],
    mins: &mut [f32],
) {
    let count = scales.len();
    assert!(x.len() == group * count && weights.len() == x.len() && levels.len() == x.len() && mins.len() == count);
    #[cfg(target_arch = "x86_64")]
    if count.is_multiple_of(8) && group > 0 && group <= MAX_QKX_GROUP && super::fast::has_avx2() {
        let f = match (guard, use_mad) {
            (false, false) => super::fast::make_qkx_quants_x8::<false, false>,
            (false, true) => super::fast::make_qkx_quants_x8::<false, true>,
            (true, false) => super::fast::make_qkx_quants_x8::<true, false>,
            (true, true) => super::fast::make_qkx_quants_x8::<true, true>,
        };
        let span = 8 * group;
        for (((x, w), l), (s, m)) in x
            .chunks_exact(span)
            .zip(weights.chunks_exact(span))
            .zip(levels.chunks_exact_mut(span))
            .zip(scales.chunks_exact_mut(8).zip(mins.chunks_exact_mut(8)))
        {
            // SAFETY: AVX2 is available.
            unsafe { f(nmax, group, x, w, l, rmin, rdelta, nstep, s, m) };
        }
        return;
    }
    for (g, ((x, w), l)) in x
        .chunks_exact(group)
        .zip(weights.chunks_exact(group))
        .zip(levels.chunks_exact_mut(group))
        .enumerate()
    {
        (scales[g], mins[g]) = if guard {
            make_qkx3_quants(nmax, x, Some(w), l, rmin, rdelta, nstep, use_mad)
        } else {
            make_qkx2_quants(nmax, x, w, l, rmin, rdelta, nstep, use_mad)
        };
    }
}

/// Symmetric quantization for Q3_K without an importance matrix: levels `nmax + l`, with an
/// optional x²-weighted coordinate-descent refinement (`do_rmse`). Returns the scale.
// ggml-quants.c: make_q3_quants
pub(crate) fn make_q3_quants_scalar(nmax: i32, x: &[f32], levels: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len();
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
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    let iscale = -(nmax as f32) / max;
    if !do_rmse {
        for (q, &v) in levels.iter_mut().zip(x) {
            *q = (clamp(nearest_int(iscale * v)) + nmax) as i8;
        }
        return 1.0 / iscale;
    }
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for i in 0..n {
        let l = clamp(nearest_int(iscale * x[i]));
        levels[i] = l as i8;
        let w = x[i] * x[i];
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let li = levels[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = clamp(nearest_int(x[i] * sl2 / slx));
                if new_l != levels[i] as i32 {
                    let nl = new_l as f32;
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        levels[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for q in levels.iter_mut() {
        *q = (*q as i32 + nmax) as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// [`make_q3_quants_scalar`], through the AVX2 path where available (same results).
// ggml-quants.c: make_q3_quants
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [i8], do_rmse: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if do_rmse && x.len() <= 32 && super::fast::has_avx2() {
        // SAFETY: AVX2 is available.
        return unsafe { super::fast::make_q3_quants_rmse(nmax, x, levels) };
    }
    make_q3_quants_scalar(nmax, x, levels, do_rmse)
}

/// `levels[i] = clamp(nearest_int((x[i] + dm) / d), 0, nmax)`: the requantization of the
/// asymmetric K-quants with a sub-block's stored scale and min. `x.len()` must be a multiple of 8.
// ggml-quants.c: the requantization loops of quantize_row_q2_K/q4_K/q5_K (ref and impl)
pub(crate) fn requant_asym(x: &[f32], d: f32, dm: f32, nmax: i32, levels: &mut [u8]) {
    assert!(x.len().is_multiple_of(8) && levels.len() == x.len());
    #[cfg(target_arch = "x86_64")]
    if super::fast::has_avx2() {
        // SAFETY: AVX2 is available.
        return unsafe { super::fast::requant_asym(x, d, dm, nmax, levels) };
    }
    requant_asym_scalar(x, d, dm, nmax, levels)
}

/// The scalar reference of [`requant_asym`].
pub(crate) fn requant_asym_scalar(x: &[f32], d: f32, dm: f32, nmax: i32, levels: &mut [u8]) {
    for (q, &v) in levels.iter_mut().zip(x) {
        *q = nearest_int((v + dm) / d).clamp(0, nmax) as u8;
    }
}

/// `levels[i] = clamp(nearest_int(x[i] / d), lo, hi) + off`: the requantization of the symmetric
/// K-quants with a sub-block's stored scale. `x.len()` must be a multiple of 8.
// ggml-quants.c: the requantization loops of quantize_row_q3_K/q6_K (ref and impl)
pub(crate) fn requant_sym(x: &[f32], d: f32, lo: i32, hi: i32, off: i32, levels: &mut [i8]) {
    assert!(x.len().is_multiple_of(8) && levels.len() == x.len());
    #[cfg(target_arch = "x86_64")]
    if super::fast::has_avx2() {
        // SAFETY: AVX2 is available.
        return unsafe { super::fast::requant_sym(x, d, lo, hi, off, levels) };
    }
    requant_sym_scalar(x, d, lo, hi, off, levels)
}

/// The scalar reference of [`requant_sym`].
pub(crate) fn requant_sym_scalar(x: &[f32], d: f32, lo: i32, hi: i32, off: i32, levels: &mut [i8]) {
    for (q, &v) in levels.iter_mut().zip(x) {
        *q = (nearest_int(v / d).clamp(lo, hi) + off) as i8;
    }
}

/// Asymmetric quantization `x ≈ scale * l - the_min`, `l` in `0..=nmax`, minimising the weighted
/// squared (or absolute, `use_mad`) error over `nstep + 1` candidate scales. Returns
/// `(scale, the_min)`; `x.len()` must be at most [`MAX_QKX_GROUP`].
// ggml-quants.c: make_qkx2_quants
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx2_quants_scalar(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    assert!(n > 0 && n <= MAX_QKX_GROUP);
    let levels = &mut levels[..n];
    let mut laux = [0u8; MAX_QKX_GROUP];
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
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        levels[i] = l.clamp(0, nmax) as u8;
        let diff = err(scale * levels[i] as f32 + min - x[i]);
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
        let mut sum_l = 0f32;
        let mut sum_l2 = 0f32;
        let mut sum_xl = 0f32;
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = err(this_scale * laux[i] as f32 + this_min - x[i]);
                cur_error += weights[i] * diff;
            }
            if cur_error < best_error {
                levels.copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Like [`make_qkx2_quants`] with the variations of the importance-matrix path: weights default
/// to x², an empty range is `max <= min`, and candidate levels are guarded against inf/NaN.
/// Returns `(scale, the_min)`; `x.len()` must be at most [`MAX_QKX_GROUP`].
// ggml-quants.c: make_qkx3_quants
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx3_quants_scalar(
    nmax: i32,
    x: &[f32],
    weights: Option<&[f32]>,
    levels: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    assert!(n > 0 && n <= MAX_QKX_GROUP);
    let levels = &mut levels[..n];
    let mut laux = [0u8; MAX_QKX_GROUP];
    let weight = |i: usize| match weights {
        Some(w) => w[i],
        None => x[i] * x[i],
    };
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weight(0);
    let mut sum_x = sum_w * x[0];
    for (i, &xi) in x.iter().enumerate().skip(1) {
        if xi < min {
            min = xi;
        }
        if xi > max {
            max = xi;
        }
        let w = weight(i);
        sum_w += w;
        sum_x += w * xi;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max <= min {
        levels.fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_mad = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        levels[i] = l.clamp(0, nmax) as u8;
        let diff = err(scale * levels[i] as f32 + min - x[i]);
        best_mad += weight(i) * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
        let mut sum_l = 0f32;
        let mut sum_l2 = 0f32;
        let mut sum_xl = 0f32;
        for i in 0..n {
            // The best min so far can be at or near max: v may be inf, NaN or out of range.
            let v = iscale * (x[i] - min);
            let l = if v > 0.0 { nearest_int(c_min(v, nmaxf)) } else { 0 };
            laux[i] = l as u8;
            let w = weight(i);
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut mad = 0f32;
            for i in 0..n {
                let diff = err(this_scale * laux[i] as f32 + this_min - x[i]);
                mad += weight(i) * diff;
            }
            if mad < best_mad {
                levels.copy_from_slice(&laux[..n]);
                best_mad = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Quantization of non-negative values (the sub-block scales and mins) to `0..=nmax` with
/// importance weights `quant_weights`: a scale search followed by coordinate descent.
/// Returns the scale.
// ggml-quants.c: make_qp_quants
pub(crate) fn make_qp_quants(nmax: i32, x: &[f32], levels: &mut [u8], quant_weights: &[f32]) -> f32 {
    let n = x.len();
    let levels = &mut levels[..n];
    let mut max = 0f32;
    for &v in x {
        max = if max > v { max } else { v };
    }
    if max < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for (q, &v) in levels.iter_mut().zip(x) {
        *q = nearest_int(iscale * v) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0f32;
    for i in 0..n {
        let diff = x[i] - scale * levels[i] as f32;
        let w = quant_weights[i];
        best_mse += w * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0f32;
        for i in 0..n {
            let l = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * l as f32;
            let w = quant_weights[i];
            mse += w * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).min(nmax);
        levels[i] = l as u8;
        let w = quant_weights[i];
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = quant_weights[i];
            let li = levels[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != levels[i] as i32 {
                    let nl = new_l as f32;
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        levels[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K.
// ggml-quants.c: get_scale_min_k4
#[inline]
pub(crate) fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Packs eight 6-bit scales and mins into Q4_K/Q5_K's 12 bytes (the inverse of
/// [`get_scale_min_k4`]); values above 63 are packed with their bits mixed exactly as in ggml.
// ggml-quants.c: the scale packing loop of quantize_row_q4_K_ref (also q4_K/q5_K impl)
pub(crate) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// Packs 2-bit values (`l[i] & 3` is used as is, higher bits are shifted out as ggml's u8
/// truncation does): each 128 values fill 32 bytes, four values of stride 32 per byte.
// ggml-quants.c: the qs packing loop of quantize_row_q2_K_ref / quantize_row_q3_K_ref
pub(crate) fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for j in (0..QK_K).step_by(128) {
        for k in 0..32 {
            qs[j / 4 + k] = l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6);
        }
    }
}
