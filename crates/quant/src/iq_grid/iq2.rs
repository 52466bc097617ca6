//! IQ2_XXS (2.0625 bpw), IQ2_XS (2.3125 bpw) and IQ2_S (2.5625 bpw): groups of 8 weights coded as
//! an E8-lattice grid point (magnitudes) plus signs, with 4-bit sub-block scales under an f16
//! super-block scale (`quantize_row_iq2_*_impl` and `dequantize_row_iq2_*` in
//! `ggml/src/ggml-quants.c`).

use super::grids2::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};
use super::init2::{iq2_data, iq2_find_best_neighbour, Iq2Data, Iq2Grid};
use crate::fp::{get_f16, nearest_int, put_f16, F16Bytes};
use crate::k_quants::helpers::make_qp_quants;
use crate::{Codec, GgmlType};

const QK_K: usize = 256;
const GROUP_MAX_EPS: f32 = 1e-15;
const GROUP_MAX_EPS_IQ2_S: f32 = 1e-8;
/// Largest level of a coordinate: values are `2*l + 1` with `l < K_MAX_Q`.
const K_MAX_Q: i32 = 3;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq2Xxs {
    pub d: F16Bytes,
    /// 8 little-endian u32 pairs: 4 grid indices (bytes), then 4×7 sign bits and a 4-bit scale.
    pub qs: [u8; QK_K / 4],
}
const _: () = assert!(std::mem::size_of::<BlockIq2Xxs>() == 66);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq2Xs {
    pub d: F16Bytes,
    /// 32 little-endian u16: 9-bit grid index | 7 sign bits << 9.
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(std::mem::size_of::<BlockIq2Xs>() == 74);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq2S {
    pub d: F16Bytes,
    /// 32 low bytes of the grid indices, then 32 sign bytes.
    pub qs: [u8; QK_K / 4],
    /// Bits 8..9 of the grid indices, 2 bits per group.
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(std::mem::size_of::<BlockIq2S>() == 82);

pub(crate) const CODECS: &[Codec] = &[
    Codec {
        ty: GgmlType::IQ2_XXS,
        quantize: Some(quantize_iq2_xxs),
        dequantize: dequantize_row_iq2_xxs,
        requires_imatrix: true,
    },
    Codec {
        ty: GgmlType::IQ2_XS,
        quantize: Some(quantize_iq2_xs),
        dequantize: dequantize_row_iq2_xs,
        requires_imatrix: true,
    },
    Codec {
        ty: GgmlType::IQ2_S,
        quantize: Some(quantize_iq2_s),
        dequantize: dequantize_row_iq2_s,
        requires_imatrix: false,
    },
];

/// C's `MAX(a, b)`: `a > b ? a : b`.
#[inline]
fn max_c(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// The 8 dequantized values of one group: `db * grid[j]`, negated where the sign bit is set.
#[inline]
fn put_group(y: &mut [f32], db: f32, grid: u64, signs: u8) {
    for (j, (v, g)) in y.iter_mut().zip(grid.to_le_bytes()).enumerate() {
        *v = db * g as f32 * if signs & (1 << j) != 0 { -1.0 } else { 1.0 };
    }
}

/// `dequantize_row_iq2_xxs`
fn dequantize_row_iq2_xxs(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::dequantize_row_iq2_xxs_avx2(src, dst) };
    }
    dequantize_row_iq2_xxs_scalar(src, dst)
}

/// The scalar reference for [`dequantize_row_iq2_xxs`].
fn dequantize_row_iq2_xxs_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIq2Xxs] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = get_f16(b.d);
        for (ib32, y) in y.chunks_exact_mut(32).enumerate() {
            let q = &b.qs[8 * ib32..8 * ib32 + 8];
            let aux1 = u32::from_le_bytes(q[4..8].try_into().unwrap());
            let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS_IQ2XS[((aux1 >> (7 * l)) & 127) as usize];
                put_group(y, db, IQ2XXS_GRID[q[l] as usize], signs);
            }
        }
    }
}

/// `dequantize_row_iq2_xs`
fn dequantize_row_iq2_xs(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::dequantize_row_iq2_xs_avx2(src, dst) };
    }
    dequantize_row_iq2_xs_scalar(src, dst)
}

/// The scalar reference for [`dequantize_row_iq2_xs`].
fn dequantize_row_iq2_xs_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIq2Xs] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = get_f16(b.d);
        for (ib32, y) in y.chunks_exact_mut(32).enumerate() {
            let sc = b.scales[ib32];
            let db = [
                d * (0.5 + (sc & 0xf) as f32) * 0.25,
                d * (0.5 + (sc >> 4) as f32) * 0.25,
            ];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let i = 2 * (4 * ib32 + l);
                let q = u16::from_le_bytes([b.qs[i], b.qs[i + 1]]);
                put_group(
                    y,
                    db[l / 2],
                    IQ2XS_GRID[(q & 511) as usize],
                    KSIGNS_IQ2XS[(q >> 9) as usize],
                );
            }
        }
    }
}

/// `dequantize_row_iq2_s`
fn dequantize_row_iq2_s(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::dequantize_row_iq2_s_avx2(src, dst) };
    }
    dequantize_row_iq2_s_scalar(src, dst)
}

/// The scalar reference for [`dequantize_row_iq2_s`].
fn dequantize_row_iq2_s_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIq2S] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = get_f16(b.d);
        for (ib32, y) in y.chunks_exact_mut(32).enumerate() {
            let sc = b.scales[ib32];
            let db = [
                d * (0.5 + (sc & 0xf) as f32) * 0.25,
                d * (0.5 + (sc >> 4) as f32) * 0.25,
            ];
            let qh = b.qh[ib32] as usize;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let index = b.qs[4 * ib32 + l] as usize | ((qh << (8 - 2 * l)) & 0x300);
                put_group(y, db[l / 2], IQ2S_GRID[index], b.qs[QK_K / 8 + 4 * ib32 + l]);
            }
        }
    }
}

/// Level of one value at inverse scale `id`: `clamp(round((id*x - 1) / 2), 0, K_MAX_Q - 1)`.
#[inline]
fn level(id: f32, x: f32) -> i8 {
    nearest_int(0.5 * (id * x - 1.0)).clamp(0, K_MAX_Q - 1) as i8
}

/// Pack 8 levels, 2 bits each (C: `u |= L << 2*i` on ints, stored in a `uint16_t`).
#[inline]
fn pack(l: &[i8]) -> u16 {
    l.iter()
        .enumerate()
        .fold(0i32, |u, (i, &v)| u | ((v as i32) << (2 * i))) as u16
}

/// Snap the 8 levels in `l` to the grid: their grid index, or the best neighbour's (which then
/// replaces `l`). Returns the index and whether the levels were on the grid.
#[inline]
fn snap(data: &Iq2Data, xval: &[f32], waux: &[f32], scale: f32, l: &mut [i8]) -> (usize, bool) {
    let u = pack(l);
    match data.index_of(u) {
        Some(g) => (g, true),
        None => (
            iq2_find_best_neighbour(data.neighbours(u), &data.grid, xval, waux, scale, l),
            false,
        ),
    }
}

/// Grid index of levels that must lie on the grid (ggml aborts with "Oops" otherwise).
fn grid_index_of(data: &Iq2Data, l: &[i8]) -> usize {
    let u = pack(l);
    data.index_of(u)
        .unwrap_or_else(|| panic!("found point {u} not on grid: {l:?}"))
}

/// `sum w*x*q` and `sum w*q*q` for the odd values `q = 2*l + 1`.
#[inline]
fn sums(weight: &[f32], xval: &[f32], l: &[i8]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for i in 0..l.len() {
        let w = weight[i];
        let q = (2 * l[i] as i32 + 1) as f32;
        sumqx += w * xval[i] * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// Absolute values of 8 weights and their sign bits, with an even number of signs (the one with
/// the smallest `weight*x*x` is flipped when needed) as IQ2_XXS and IQ2_XS store 7 sign bits.
fn even_signs(xb: &[f32], weight: &[f32], xval: &mut [f32]) -> u8 {
    let mut nflip = 0;
    let mut s = 0u8;
    for i in 0..8 {
        if xb[i] >= 0.0 {
            xval[i] = xb[i];
        } else {
            xval[i] = -xb[i];
            nflip += 1;
            s |= 1 << i;
        }
    }
    if nflip % 2 != 0 {
        let mut imin = 0;
        let mut min = weight[0] * xb[0] * xb[0];
        for i in 1..8 {
            let ax = weight[i] * xb[i] * xb[i];
            if ax < min {
                min = ax;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        s ^= 1 << imin;
    }
    s & 127
}

/// Sum of squares of one super-block, in order.
fn sum_squares(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |s, &v| s + v * v)
}

/// `quantize_iq2_xxs` / `quantize_row_iq2_xxs_impl` (requires an importance matrix).
fn quantize_iq2_xxs(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let quant_weights = imatrix.expect("IQ2_XXS: missing quantization weights");
    let data = iq2_data(Iq2Grid::Xxs);
    let blocks: &mut [BlockIq2Xxs] = bytemuck::cast_slice_mut(dst);
    for (ibl, (y, xbl)) in blocks.iter_mut().zip(src.chunks_exact(QK_K)).enumerate() {
        y.d = put_f16(0.0);
        let mut q2 = [0u32; QK_K / 16];
        let mut scales = [0f32; QK_K / 32];
        let mut max_scale = 0f32;
        let sigma2 = sum_squares(xbl) / QK_K as f32;

        for ib in 0..QK_K / 32 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let qw = &quant_weights[QK_K * ibl + 32 * ib..QK_K * ibl + 32 * ib + 32];
            let weight: [f32; 32] = std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt());
            let waux: [f32; 32] = std::array::from_fn(|i| weight[i].sqrt());
            let mut xval = [0f32; 32];
            let mut block_signs = [0u8; 4];
            for (k, s) in block_signs.iter_mut().enumerate() {
                let r = 8 * k..8 * k + 8;
                *s = even_signs(&xb[r.clone()], &weight[r.clone()], &mut xval[r]);
            }
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = max_c(max, v);
            }
            if max < GROUP_MAX_EPS {
                scales[ib] = 0.0;
                continue;
            }
            let mut lu = [0u8; 32];
            let mut scale = make_qp_quants(K_MAX_Q + 1, &xval, &mut lu, &weight);
            let mut l: [i8; 32] = lu.map(|v| v as i8);
            let eff_max = scale * K_MAX_Q as f32;
            if eff_max <= 0.0 {
                scales[ib] = 0.0;
                continue;
            }
            let mut best = 0f32;
            for is in -6..=6 {
                let id = ((2 * K_MAX_Q - 1) as f32 + is as f32 * 0.1) / eff_max;
                let this_scale = 1.0 / id;
                let mut laux = [0i8; 32];
                for k in 0..4 {
                    let r = 8 * k..8 * k + 8;
                    for i in r.clone() {
                        laux[i] = level(id, xval[i]);
                    }
                    snap(data, &xval[r.clone()], &waux[r.clone()], this_scale, &mut laux[r]);
                }
                let (sumqx, sumq2) = sums(&weight, &xval, &laux);
                if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                    scale = sumqx / sumq2;
                    best = scale * sumqx;
                    l = laux;
                }
            }
            if scale > 0.0 {
                let id = 1.0 / scale;
                for k in 0..4 {
                    let r = 8 * k..8 * k + 8;
                    let mut lk = [0i8; 8];
                    for (i, v) in lk.iter_mut().enumerate() {
                        *v = level(id, xval[8 * k + i]);
                    }
                    let (g, _) = snap(data, &xval[r.clone()], &waux[r.clone()], scale, &mut lk);
                    for (li, &pg) in l[r].iter_mut().zip(&data.grid[g]) {
                        *li = (pg - 1) / 2;
                    }
                }
                let (sumqx, sumq2) = sums(&weight, &xval, &l);
                if sumq2 > 0.0 {
                    scale = sumqx / sumq2;
                }
            }
            if scale < 0.0 {
                // ggml: "should never happen"; make the scale positive and flip the signs.
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s & 127;
                }
            }
            for k in 0..4 {
                let g = grid_index_of(data, &l[8 * k..8 * k + 8]);
                q2[2 * ib] |= (g as u32) << (8 * k);
                q2[2 * ib + 1] |= (block_signs[k] as u32) << (7 * k);
            }
            scales[ib] = scale;
            max_scale = max_c(max_scale, scale);
        }

        if max_scale == 0.0 {
            y.qs = [0; QK_K / 4];
            continue;
        }
        let d = max_scale / 31.0;
        y.d = put_f16(d);
        let id = 1.0 / d;
        for ib in 0..QK_K / 32 {
            let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15);
            q2[2 * ib + 1] |= (l as u32) << 28;
        }
        for (dst, v) in y.qs.chunks_exact_mut(4).zip(q2) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// The scale search shared by `quantize_row_iq2_xs_impl` and `quantize_row_iq2_s_impl` for one
/// group of 16: try 19 scales around `max / 5`, snapping each pair of 8 to the grid, keep the best,
/// then re-snap the groups that were off the grid at that scale. Returns (scale, levels).
fn search_16(data: &Iq2Data, xval: &[f32; 16], weight: &[f32; 16], waux: &[f32; 16], max: f32) -> (f32, [i8; 16]) {
    let mut l = [0i8; 16];
    let mut best = 0f32;
    let mut scale = max / (2 * K_MAX_Q - 1) as f32;
    let mut is_on_grid = [true; 2];
    for is in -9..=9 {
        let id = ((2 * K_MAX_Q - 1) as f32 + is as f32 * 0.1) / max;
        let this_scale = 1.0 / id;
        let mut laux = [0i8; 16];
        let mut is_on_grid_aux = [true; 2];
        for (k, on_grid) in is_on_grid_aux.iter_mut().enumerate() {
            let r = 8 * k..8 * k + 8;
            for i in r.clone() {
                laux[i] = level(id, xval[i]);
            }
            *on_grid = snap(data, &xval[r.clone()], &waux[r.clone()], this_scale, &mut laux[r]).1;
        }
        let (sumqx, sumq2) = sums(weight, xval, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l = laux;
            is_on_grid = is_on_grid_aux;
        }
    }
    if is_on_grid.contains(&false) && scale > 0.0 {
        let id = 1.0 / scale;
        for (k, _) in is_on_grid.iter().enumerate().filter(|&(_, &on_grid)| !on_grid) {
            let r = 8 * k..8 * k + 8;
            for i in r.clone() {
                l[i] = level(id, xval[i]);
            }
            snap(data, &xval[r.clone()], &waux[r.clone()], scale, &mut l[r]);
        }
        let (sumqx, sumq2) = sums(weight, xval, &l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    (scale, l)
}

/// 4-bit sub-block scale: `clamp(round((id*scale - 1) / 2), 0, 15)`.
#[inline]
fn scale_nibble(id: f32, scale: f32) -> u8 {
    nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 15) as u8
}

/// `quantize_iq2_xs` / `quantize_row_iq2_xs_impl` (requires an importance matrix).
fn quantize_iq2_xs(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let quant_weights = imatrix.expect("IQ2_XS: missing quantization weights");
    let data = iq2_data(Iq2Grid::Xs);
    let blocks: &mut [BlockIq2Xs] = bytemuck::cast_slice_mut(dst);
    for (ibl, (y, xbl)) in blocks.iter_mut().zip(src.chunks_exact(QK_K)).enumerate() {
        y.d = put_f16(0.0);
        y.scales = [0; QK_K / 32];
        let mut q2 = [0u16; QK_K / 8];
        let mut scales = [0f32; QK_K / 16];
        let mut max_scale = 0f32;
        let sigma2 = sum_squares(xbl) / QK_K as f32;

        for ib in 0..QK_K / 16 {
            let xb = &xbl[16 * ib..16 * ib + 16];
            let qw = &quant_weights[QK_K * ibl + 16 * ib..QK_K * ibl + 16 * ib + 16];
            let weight: [f32; 16] = std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt());
            let waux: [f32; 16] = std::array::from_fn(|i| weight[i].sqrt());
            let mut xval = [0f32; 16];
            let mut block_signs = [0u8; 2];
            for (k, s) in block_signs.iter_mut().enumerate() {
                let r = 8 * k..8 * k + 8;
                *s = even_signs(&xb[r.clone()], &weight[r.clone()], &mut xval[r]);
            }
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = max_c(max, v);
            }
            if max < GROUP_MAX_EPS {
                scales[ib] = 0.0;
                continue;
            }
            let (mut scale, l) = search_16(data, &xval, &weight, &waux, max);
            if scale < 0.0 {
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s & 127;
                }
            }
            for k in 0..2 {
                let g = grid_index_of(data, &l[8 * k..8 * k + 8]);
                q2[2 * ib + k] = g as u16 | ((block_signs[k] as u16) << 9);
            }
            scales[ib] = scale;
            max_scale = max_c(max_scale, scale);
        }

        if max_scale == 0.0 {
            y.qs = [0; QK_K / 4];
            continue;
        }
        let d = max_scale / 31.0;
        y.d = put_f16(d);
        let id = 1.0 / d;
        for (ib, &scale) in scales.iter().enumerate() {
            let l = scale_nibble(id, scale);
            if ib % 2 == 0 {
                y.scales[ib / 2] = l;
            } else {
                y.scales[ib / 2] |= l << 4;
            }
        }
        for (dst, v) in y.qs.chunks_exact_mut(2).zip(q2) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// `quantize_iq2_s` / `quantize_row_iq2_s_impl`; without an importance matrix the weights are
/// `sigma2/4 + x^2`.
fn quantize_iq2_s(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let data = iq2_data(Iq2Grid::S);
    let blocks: &mut [BlockIq2S] = bytemuck::cast_slice_mut(dst);
    for (ibl, (y, xbl)) in blocks.iter_mut().zip(src.chunks_exact(QK_K)).enumerate() {
        *y = bytemuck::Zeroable::zeroed();
        y.d = put_f16(0.0);
        let mut scales = [0f32; QK_K / 16];
        let mut max_scale = 0f32;
        let sigma2 = 2.0 * sum_squares(xbl) / QK_K as f32;

        for ib in 0..QK_K / 16 {
            let xb = &xbl[16 * ib..16 * ib + 16];
            let weight: [f32; 16] = match imatrix {
                Some(w) => {
                    let qw = &w[QK_K * ibl + 16 * ib..QK_K * ibl + 16 * ib + 16];
                    std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt())
                }
                None => std::array::from_fn(|i| 0.25 * sigma2 + xb[i] * xb[i]),
            };
            let waux: [f32; 16] = std::array::from_fn(|i| weight[i].sqrt());
            let mut xval = [0f32; 16];
            let mut block_signs = [0u8; 2];
            for k in 0..2 {
                for i in 0..8 {
                    let x = xb[8 * k + i];
                    if x >= 0.0 {
                        xval[8 * k + i] = x;
                    } else {
                        xval[8 * k + i] = -x;
                        block_signs[k] |= 1 << i;
                    }
                }
            }
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = max_c(max, v);
            }
            if max < GROUP_MAX_EPS_IQ2_S {
                scales[ib] = 0.0;
                continue;
            }
            let (mut scale, l) = search_16(data, &xval, &weight, &waux, max);
            if scale < 0.0 {
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s;
                }
            }
            for k in 0..2 {
                let g = grid_index_of(data, &l[8 * k..8 * k + 8]);
                let i8 = 2 * ib + k;
                y.qs[i8] = (g & 255) as u8;
                y.qh[i8 / 4] |= ((g >> 8) << (2 * (i8 % 4))) as u8;
                y.qs[QK_K / 8 + i8] = block_signs[k];
            }
            scales[ib] = scale;
            max_scale = max_c(max_scale, scale);
        }

        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        y.d = put_f16(d * 0.9875);
        let id = 1.0 / d;
        for (ib, &scale) in scales.iter().enumerate() {
            let l = scale_nibble(id, scale);
            if ib % 2 == 0 {
                y.scales[ib / 2] = l;
            } else {
                y.scales[ib / 2] |= l << 4;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! AVX2 dequantization (same operations as the scalar code, 8 values at a time).
    use super::super::simd::x86::signed_group;
    use super::*;

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_row_iq2_xxs_avx2(src: &[u8], dst: &mut [f32]) {
        let blocks: &[BlockIq2Xxs] = bytemuck::cast_slice(src);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
            let d = get_f16(b.d);
            for (ib32, y) in y.chunks_exact_mut(32).enumerate() {
                let q = &b.qs[8 * ib32..8 * ib32 + 8];
                let aux1 = u32::from_le_bytes(q[4..8].try_into().unwrap());
                let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
                for (l, y) in y.chunks_exact_mut(8).enumerate() {
                    let signs = KSIGNS_IQ2XS[((aux1 >> (7 * l)) & 127) as usize];
                    signed_group(y, db, IQ2XXS_GRID[q[l] as usize], signs);
                }
            }
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_row_iq2_xs_avx2(src: &[u8], dst: &mut [f32]) {
        let blocks: &[BlockIq2Xs] = bytemuck::cast_slice(src);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
            let d = get_f16(b.d);
            for (ib32, y) in y.chunks_exact_mut(32).enumerate() {
                let sc = b.scales[ib32];
                let db = [
                    d * (0.5 + (sc & 0xf) as f32) * 0.25,
                    d * (0.5 + (sc >> 4) as f32) * 0.25,
                ];
                for (l, y) in y.chunks_exact_mut(8).enumerate() {
                    let i = 2 * (4 * ib32 + l);
                    let q = u16::from_le_bytes([b.qs[i], b.qs[i + 1]]);
                    let grid = IQ2XS_GRID[(q & 511) as usize];
                    signed_group(y, db[l / 2], grid, KSIGNS_IQ2XS[(q >> 9) as usize]);
                }
            }
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_row_iq2_s_avx2(src: &[u8], dst: &mut [f32]) {
        let blocks: &[BlockIq2S] = bytemuck::cast_slice(src);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
            let d = get_f16(b.d);
            for (ib32, y) in y.chunks_exact_mut(32).enumerate() {
                let sc = b.scales[ib32];
                let db = [
                    d * (0.5 + (sc & 0xf) as f32) * 0.25,
                    d * (0.5 + (sc >> 4) as f32) * 0.25,
                ];
                let qh = b.qh[ib32] as usize;
                for (l, y) in y.chunks_exact_mut(8).enumerate() {
                    let index = b.qs[4 * ib32 + l] as usize | ((qh << (8 - 2 * l)) & 0x300);
                    signed_group(y, db[l / 2], IQ2S_GRID[index], b.qs[QK_K / 8 + 4 * ib32 + l]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_dequantize_matches_scalar() {
        use crate::iq_grid::simd::test_util::{assert_dequant_agrees, DequantPair, Rng};
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut rng = Rng(0x5eed);
        type Pair = DequantPair;
        let cases: [(&str, usize, &[usize], Pair); 3] = [
            (
                "IQ2_XXS",
                66,
                &[0],
                (dequantize_row_iq2_xxs_scalar, |s, d| unsafe {
                    x86::dequantize_row_iq2_xxs_avx2(s, d)
                }),
            ),
            (
                "IQ2_XS",
                74,
                &[0],
                (dequantize_row_iq2_xs_scalar, |s, d| unsafe {
                    x86::dequantize_row_iq2_xs_avx2(s, d)
                }),
            ),
            (
                "IQ2_S",
                82,
                &[0],
                (dequantize_row_iq2_s_scalar, |s, d| unsafe {
                    x86::dequantize_row_iq2_s_avx2(s, d)
                }),
            ),
        ];
        assert_dequant_agrees(&mut rng, &cases);
    }

    use super::*;

    #[test]
    fn grids_match_init_tables() {
        // The dequantization grids hold the init grid's levels 0, 1, 2 as 8, 25, 43.
        let value = |l: i8| [8u8, 25, 43][((l - 1) / 2) as usize];
        for (which, table) in [
            (Iq2Grid::Xxs, &IQ2XXS_GRID[..]),
            (Iq2Grid::Xs, &IQ2XS_GRID[..]),
            (Iq2Grid::S, &IQ2S_GRID[..]),
        ] {
            let data = iq2_data(which);
            assert_eq!(data.grid.len(), table.len());
            for (p, &g) in data.grid.iter().zip(table) {
                assert_eq!(p.map(value), g.to_le_bytes());
            }
        }
    }
}
