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
    let blocks: &mut [BlockIq4Nl] = bytemuck::cast_slice_mut(dst);
    for (ibl, (y, x)) in blocks.iter_mut().zip(src.chunks_exact(QK4_NL)).enumerate() {
        let qw = imatrix.map(|w| &w[ibl * QK4_NL..(ibl + 1) * QK4_NL]);
        quantize_iq4_super_block(x, qw, 7, &mut y.d, &mut y.qs, None);
    }
}

/// One row of IQ4_XS (`quantize_iq4_xs`; ntry = 7).
fn quantize_iq4_xs(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
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
