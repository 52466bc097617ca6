//! IQ1_S (1.5625 bpw) and IQ1_M (1.75 bpw): groups of 8 ternary weights {-1, 0, 1} coded as a
//! point of a 2048-entry grid, shifted by ±`IQ1S_DELTA`, with 3-bit sub-block scales
//! (`quantize_row_iq1_*_impl` and `dequantize_row_iq1_*` in `ggml/src/ggml-quants.c`).

use super::grids2::IQ1S_GRID;
use super::init2::{iq2_data, Iq2Data, Iq2Grid};
use crate::fp::{f16_to_f32, f32_to_f16, get_f16, nearest_int, put_f16, F16Bytes};
use crate::{Codec, GgmlType};

const QK_K: usize = 256;
const IQ1S_DELTA: f32 = 0.125;
const IQ1M_DELTA: f32 = 0.125;
const GROUP_MAX_EPS_IQ1_S: f32 = 1e-12;
const GROUP_MAX_EPS_IQ1_M: f32 = 1e-7;
const IQ1S_BLOCK_SIZE: usize = 32;
const IQ1M_BLOCK_SIZE: usize = 16;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq1S {
    pub d: F16Bytes,
    /// Low 8 bits of the 32 grid indices.
    pub qs: [u8; QK_K / 8],
    /// 8 little-endian u16: 4×3 high index bits, 3-bit scale << 12, delta sign << 15.
    pub qh: [u8; QK_K / 16],
}
const _: () = assert!(std::mem::size_of::<BlockIq1S>() == 50);

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq1M {
    /// Low 8 bits of the 32 grid indices.
    pub qs: [u8; QK_K / 8],
    /// Per group of 8: 3 high index bits and a delta-sign bit.
    pub qh: [u8; QK_K / 16],
    /// 4 little-endian u16: 4×3-bit sub-block scales, plus 4 bits of the f16 block scale.
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(std::mem::size_of::<BlockIq1M>() == 56);

pub(crate) const CODECS: &[Codec] = &[
    Codec {
        ty: GgmlType::IQ1_S,
        quantize: Some(quantize_iq1_s),
        dequantize: dequantize_row_iq1_s,
        requires_imatrix: true,
    },
    Codec {
        ty: GgmlType::IQ1_M,
        quantize: Some(quantize_iq1_m),
        dequantize: dequantize_row_iq1_m,
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

/// The 8 values of one group: `dl * (grid[j] + delta)`.
#[inline]
fn put_group(y: &mut [f32], dl: f32, index: usize, delta: f32) {
    for (v, g) in y.iter_mut().zip(IQ1S_GRID[index].to_le_bytes()) {
        *v = dl * (g as i8 as f32 + delta);
    }
}

/// `dequantize_row_iq1_s`
fn dequantize_row_iq1_s(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::dequantize_row_iq1_s_avx2(src, dst) };
    }
    dequantize_row_iq1_s_scalar(src, dst)
}

/// The scalar reference for [`dequantize_row_iq1_s`].
fn dequantize_row_iq1_s_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIq1S] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = get_f16(b.d);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let qh = u16::from_le_bytes([b.qh[2 * ib], b.qh[2 * ib + 1]]) as usize;
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 != 0 { -IQ1S_DELTA } else { IQ1S_DELTA };
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let index = b.qs[4 * ib + l] as usize | (((qh >> (3 * l)) & 7) << 8);
                put_group(y, dl, index, delta);
            }
        }
    }
}

/// The four u16 scale words of an IQ1_M block.
#[inline]
fn iq1m_scales(b: &BlockIq1M) -> [u16; 4] {
    std::array::from_fn(|i| u16::from_le_bytes([b.scales[2 * i], b.scales[2 * i + 1]]))
}

/// `dequantize_row_iq1_m`
fn dequantize_row_iq1_m(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::dequantize_row_iq1_m_avx2(src, dst) };
    }
    dequantize_row_iq1_m_scalar(src, dst)
}

/// The scalar reference for [`dequantize_row_iq1_m`].
fn dequantize_row_iq1_m_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIq1M] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let sc = iq1m_scales(b);
        let scale = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        let d = f16_to_f32(scale);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let s = sc[ib / 2] as usize;
            let dl1 = d * (2 * ((s >> (6 * (ib % 2))) & 7) + 1) as f32;
            let dl2 = d * (2 * ((s >> (6 * (ib % 2) + 3)) & 7) + 1) as f32;
            let qs = &b.qs[4 * ib..4 * ib + 4];
            let qh = [b.qh[2 * ib] as usize, b.qh[2 * ib + 1] as usize];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let h = qh[l / 2];
                let index = qs[l] as usize | ((h << if l % 2 == 0 { 8 } else { 4 }) & 0x700);
                let sign_bit = if l % 2 == 0 { 0x08 } else { 0x80 };
                let delta = if h & sign_bit != 0 { -IQ1S_DELTA } else { IQ1S_DELTA };
                put_group(y, if l < 2 { dl1 } else { dl2 }, index, delta);
            }
        }
    }
}

/// `iq1_find_best_neighbour2`: among the neighbours of an off-grid point, the grid point whose
/// shifted values `xg[level]` at `scale` are closest (weighted) to `xval`; writes its levels into
/// `l` and returns its index.
fn iq1_find_best_neighbour2(
    data: &Iq2Data,
    u: u16,
    xval: &[f32],
    weight: &[f32],
    scale: f32,
    xg: &[f32; 3],
    l: &mut [i8],
) -> usize {
    let neighbours = data.neighbours(u);
    assert!(!neighbours.is_empty(), "iq1_find_best_neighbour2: no neighbours");
    let d2_of = |pg: &[i8; 8]| {
        let mut d2 = 0f32;
        for i in 0..8 {
            let q = xg[((pg[i] - 1) / 2) as usize];
            let w = weight[i];
            let diff = scale * q - xval[i];
            d2 += w * diff * diff;
        }
        d2
    };
    let mut best_score = f32::MAX;
    let mut grid_index = None;
    for &j in neighbours {
        let d2 = d2_of(&data.grid[j as usize]);
        if d2 < best_score {
            best_score = d2;
            grid_index = Some(j as usize);
        }
    }
    // ggml then scans the whole grid, but indexes `xval` with the grid index there (reading out of
    // bounds); that scan can only matter when every distance is NaN or infinite, where ggml aborts.
    let grid_index = grid_index.expect("iq1_find_best_neighbour2: did not find grid point (ggml aborts here)");
    for (li, &g) in l.iter_mut().zip(&data.grid[grid_index]) {
        *li = (g - 1) / 2;
    }
    grid_index
}

/// Pack 8 levels, 2 bits each (`u |= L << 2*j` in a `uint16_t`).
#[inline]
fn pack(l: &[i8]) -> u16 {
    l.iter()
        .enumerate()
        .fold(0i32, |u, (j, &v)| u | ((v as i32) << (2 * j))) as u16
}

/// The block's values in ascending order with their positions: glibc's `qsort` with
/// `iq1_sort_helper` (a merge sort, hence stable; equal values keep their order).
fn sorted_positions<const N: usize>(xb: &[f32]) -> [usize; N] {
    let mut idx: [usize; N] = std::array::from_fn(|j| j);
    idx.sort_by(|&a, &b| xb[a].partial_cmp(&xb[b]).unwrap_or(std::cmp::Ordering::Equal));
    idx
}

/// Levels 0/1/2 from the split points of the sorted order.
fn split_levels(idx: &[usize], besti1: usize, besti2: usize, l: &mut [i8]) {
    for (j, &i) in idx.iter().enumerate() {
        l[i] = if j < besti1 {
            0
        } else if j < besti2 {
            1
        } else {
            2
        };
    }
}

/// `quantize_iq1_s` / `quantize_row_iq1_s_impl` (requires an importance matrix).
fn quantize_iq1_s(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    const BS: usize = IQ1S_BLOCK_SIZE;
    let quant_weights = imatrix.expect("IQ1_S: missing quantization weights");
    let data = iq2_data(Iq2Grid::Iq1);
    let x_p = [-1.0 + IQ1S_DELTA, IQ1S_DELTA, 1.0 + IQ1S_DELTA];
    let x_m = [-1.0 - IQ1S_DELTA, -IQ1S_DELTA, 1.0 - IQ1S_DELTA];
    let blocks: &mut [BlockIq1S] = bytemuck::cast_slice_mut(dst);
    for (ibl, (y, xbl)) in blocks.iter_mut().zip(src.chunks_exact(QK_K)).enumerate() {
        *y = bytemuck::Zeroable::zeroed();
        y.d = put_f16(0.0);
        let mut qh = [0u16; QK_K / BS];
        let mut scales = [0f32; QK_K / BS];
        let mut shifts = [0i8; QK_K / BS];
        let mut max_scale = 0f32;
        let sumx2 = xbl.iter().fold(0f32, |s, &v| s + v * v);
        let sigma2 = 2.0 * sumx2 / QK_K as f32;

        for ib in 0..QK_K / BS {
            let xb = &xbl[BS * ib..BS * ib + BS];
            let qw = &quant_weights[QK_K * ibl + BS * ib..QK_K * ibl + BS * ib + BS];
            let weight: [f32; BS] = std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt());
            let mut max = xb[0].abs();
            for &v in &xb[1..] {
                max = max_c(max, v.abs());
            }
            if max < GROUP_MAX_EPS_IQ1_S {
                scales[ib] = 0.0;
                shifts[ib] = 1;
                continue;
            }
            // Exhaustive search over the two split points of the sorted values (see ggml).
            let idx = sorted_positions::<BS>(xb);
            let mut sumx = [0f32; BS + 1];
            let mut sumw = [0f32; BS + 1];
            for (j, &i) in idx.iter().enumerate() {
                sumx[j + 1] = sumx[j] + weight[i] * xb[i];
                sumw[j + 1] = sumw[j] + weight[i];
            }
            let mut best_score = -f32::MAX;
            let mut scale = max;
            let mut best: Option<(usize, usize)> = None;
            let mut best_shift = 0i8;
            for i1 in 0..=BS {
                for i2 in i1..=BS {
                    for (xx, shift) in [(&x_p, 1i8), (&x_m, -1)] {
                        let sumqx = (sumx[i1] - sumx[0]) * xx[0]
                            + (sumx[i2] - sumx[i1]) * xx[1]
                            + (sumx[BS] - sumx[i2]) * xx[2];
                        let sumq2 = (sumw[i1] - sumw[0]) * xx[0] * xx[0]
                            + (sumw[i2] - sumw[i1]) * xx[1] * xx[1]
                            + (sumw[BS] - sumw[i2]) * xx[2] * xx[2];
                        if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                            scale = sumqx / sumq2;
                            best_score = scale * sumqx;
                            best = Some((i1, i2));
                            best_shift = shift;
                        }
                    }
                }
            }
            let Some((besti1, besti2)) = best else {
                scales[ib] = 0.0;
                shifts[ib] = 1;
                continue;
            };
            let mut l = [0i8; BS];
            split_levels(&idx, besti1, besti2, &mut l);
            if scale < 0.0 {
                for v in &mut l {
                    *v = 2 - *v;
                }
                scale = -scale;
                best_shift = -best_shift;
            }
            let xx = if best_shift == 1 { &x_p } else { &x_m };
            let mut all_on_grid = true;
            let mut index = [0usize; BS / 8];
            for (k, gi) in index.iter_mut().enumerate() {
                let r = 8 * k..8 * k + 8;
                let u = pack(&l[r.clone()]);
                *gi = match data.index_of(u) {
                    Some(g) => g,
                    None => {
                        all_on_grid = false;
                        iq1_find_best_neighbour2(data, u, &xb[r.clone()], &weight[r.clone()], scale, xx, &mut l[r])
                    }
                };
            }
            if !all_on_grid {
                let (mut sumqx, mut sumq2) = (0f32, 0f32);
                for (k, &gi) in index.iter().enumerate() {
                    let pg = &data.grid[gi];
                    for j in 0..8 {
                        let w = weight[8 * k + j];
                        let q = xx[((pg[j] - 1) / 2) as usize];
                        sumqx += w * q * xb[8 * k + j];
                        sumq2 += w * q * q;
                    }
                }
                if sumqx > 0.0 && sumq2 > 0.0 {
                    scale = sumqx / sumq2;
                }
            }
            let mut h = 0u16;
            for (k, &gi) in index.iter().enumerate() {
                y.qs[(BS / 8) * ib + k] = (gi & 255) as u8;
                h |= ((gi >> 8) << (3 * k)) as u16;
            }
            qh[ib] = h;
            scales[ib] = scale;
            shifts[ib] = best_shift;
            max_scale = max_c(max_scale, scale);
        }

        if max_scale != 0.0 {
            let d = max_scale / 15.0;
            y.d = put_f16(d * 1.125); // ggml's fudge factor
            let id = 1.0 / d;
            for ib in 0..QK_K / BS {
                let mut l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7) as u16;
                if shifts[ib] == -1 {
                    l |= 8;
                }
                qh[ib] |= l << 12;
            }
        }
        for (dst, v) in y.qh.chunks_exact_mut(2).zip(qh) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Weights of one IQ1_M sub-block: from the importance matrix, or `x^2` without one.
fn iq1m_weights(xb: &[f32], qw: Option<&[f32]>, sigma2: f32) -> [f32; IQ1M_BLOCK_SIZE] {
    match qw {
        Some(qw) => std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt()),
        None => std::array::from_fn(|i| xb[i] * xb[i]),
    }
}

/// Shifted values for group `k` (0 or 1) of an IQ1_M sub-block with sign combination `shift`
/// (0: +,+  1: +,-  2: -,+  3: -,-).
#[inline]
fn iq1m_xx<'a>(shift: usize, k: usize, x_p: &'a [f32; 3], x_m: &'a [f32; 3]) -> &'a [f32; 3] {
    let plus = if k == 0 { shift < 2 } else { shift.is_multiple_of(2) };
    if plus {
        x_p
    } else {
        x_m
    }
}

/// `quantize_iq1_m` / `quantize_row_iq1_m_impl`; without an importance matrix the weights are `x^2`.
fn quantize_iq1_m(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    const BS: usize = IQ1M_BLOCK_SIZE;
    let data = iq2_data(Iq2Grid::Iq1);
    let x_p = [-1.0 + IQ1M_DELTA, IQ1M_DELTA, 1.0 + IQ1M_DELTA];
    let x_m = [-1.0 - IQ1M_DELTA, -IQ1M_DELTA, 1.0 - IQ1M_DELTA];
    const MASKS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];
    let blocks: &mut [BlockIq1M] = bytemuck::cast_slice_mut(dst);
    for (ibl, (y, xbl)) in blocks.iter_mut().zip(src.chunks_exact(QK_K)).enumerate() {
        *y = bytemuck::Zeroable::zeroed();
        let mut scales = [0f32; QK_K / BS];
        let mut shifts = [0usize; QK_K / BS];
        let mut max_scale = 0f32;
        let sumx2 = xbl.iter().fold(0f32, |s, &v| s + v * v);
        let sigma2 = 2.0 * sumx2 / QK_K as f32;
        let qw_of = |ib: usize| imatrix.map(|w| &w[QK_K * ibl + BS * ib..QK_K * ibl + BS * ib + BS]);

        for ib in 0..QK_K / BS {
            let xb = &xbl[BS * ib..BS * ib + BS];
            let weight = iq1m_weights(xb, qw_of(ib), sigma2);
            let mut max = xb[0].abs();
            for &v in &xb[1..] {
                max = max_c(max, v.abs());
            }
            if max < GROUP_MAX_EPS_IQ1_M {
                scales[ib] = 0.0;
                shifts[ib] = 0;
                continue;
            }
            // Exhaustive search over the two split points of the sorted values, with prefix sums
            // kept per half since each half of 8 may use its own delta sign (see ggml).
            let idx = sorted_positions::<BS>(xb);
            let mut px = [[0f32; BS + 1]; 2];
            let mut pw = [[0f32; BS + 1]; 2];
            for (j, &i) in idx.iter().enumerate() {
                let h = if i < BS / 2 { 0 } else { 1 };
                px[h][j + 1] = px[h][j] + weight[i] * xb[i];
                px[1 - h][j + 1] = px[1 - h][j];
                pw[h][j + 1] = pw[h][j] + weight[i];
                pw[1 - h][j + 1] = pw[1 - h][j];
            }
            let txs = [px[0][BS], px[1][BS]];
            let tws = [pw[0][BS], pw[1][BS]];
            let (p2, m2) = (x_p[2], x_m[2]);
            let cp1 = x_p[0] * x_p[0] - x_p[1] * x_p[1];
            let cp2 = x_p[1] * x_p[1] - x_p[2] * x_p[2];
            let cm1 = x_m[0] * x_m[0] - x_m[1] * x_m[1];
            let cm2 = x_m[1] * x_m[1] - x_m[2] * x_m[2];
            let mut best_score = -f32::MAX;
            let mut scale = max;
            let mut best: Option<(usize, usize, usize)> = None;
            for i1 in 0..=BS {
                for i2 in i1..=BS {
                    let (mut qx_p, mut qx_m, mut q2_p, mut q2_m) = ([0f32; 2], [0f32; 2], [0f32; 2], [0f32; 2]);
                    for h in 0..2 {
                        let sx = px[h][i1] + px[h][i2];
                        qx_p[h] = txs[h] * p2 - sx;
                        qx_m[h] = txs[h] * m2 - sx;
                        q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                        q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                    }
                    let sumqx = [
                        qx_p[0] + qx_p[1],
                        qx_p[0] + qx_m[1],
                        qx_m[0] + qx_p[1],
                        qx_m[0] + qx_m[1],
                    ];
                    let sumq2 = [
                        q2_p[0] + q2_p[1],
                        q2_p[0] + q2_m[1],
                        q2_m[0] + q2_p[1],
                        q2_m[0] + q2_m[1],
                    ];
                    for k in 0..4 {
                        if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best_score * sumq2[k] {
                            scale = sumqx[k] / sumq2[k];
                            best_score = scale * sumqx[k];
                            best = Some((i1, i2, k));
                        }
                    }
                }
            }
            let Some((besti1, besti2, mut best_k)) = best else {
                scales[ib] = 0.0;
                shifts[ib] = 0;
                continue;
            };
            let mut l = [0i8; BS];
            split_levels(&idx, besti1, besti2, &mut l);
            if scale < 0.0 {
                for v in &mut l {
                    *v = 2 - *v;
                }
                scale = -scale;
                best_k = 3 - best_k;
            }
            let mut all_on_grid = true;
            let mut index = [0usize; BS / 8];
            for (k, gi) in index.iter_mut().enumerate() {
                let xx = iq1m_xx(best_k, k, &x_p, &x_m);
                let r = 8 * k..8 * k + 8;
                let u = pack(&l[r.clone()]);
                *gi = match data.index_of(u) {
                    Some(g) => g,
                    None => {
                        all_on_grid = false;
                        iq1_find_best_neighbour2(data, u, &xb[r.clone()], &weight[r.clone()], scale, xx, &mut l[r])
                    }
                };
            }
            if !all_on_grid {
                let (mut sumqx_f, mut sumq2_f) = (0f32, 0f32);
                for (k, &gi) in index.iter().enumerate() {
                    let xx = iq1m_xx(best_k, k, &x_p, &x_m);
                    let pg = &data.grid[gi];
                    for j in 0..8 {
                        let w = weight[8 * k + j];
                        let q = xx[((pg[j] - 1) / 2) as usize];
                        sumqx_f += w * q * xb[8 * k + j];
                        sumq2_f += w * q * q;
                    }
                }
                if sumqx_f > 0.0 && sumq2_f > 0.0 {
                    scale = sumqx_f / sumq2_f;
                }
            }
            y.qs[2 * ib] = (index[0] & 255) as u8;
            y.qs[2 * ib + 1] = (index[1] & 255) as u8;
            y.qh[ib] = ((index[0] >> 8) | ((index[1] >> 8) << 4)) as u8;
            scales[ib] = scale;
            shifts[ib] = best_k;
            max_scale = max_c(max_scale, scale);
        }

        if max_scale == 0.0 {
            continue;
        }
        let mut sc = [0u16; 4];
        let mut d = max_scale / 15.0;
        let id = 1.0 / d;
        let (mut sumqx_f, mut sumq2_f) = (0f32, 0f32);
        for ib in 0..QK_K / BS {
            let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
            sc[ib / 4] |= (l << (3 * (ib % 4))) as u16;
            y.qh[ib] |= MASKS[shifts[ib]];
            let xb = &xbl[BS * ib..BS * ib + BS];
            let weight = iq1m_weights(xb, qw_of(ib), sigma2);
            for k in 0..BS / 8 {
                let xx = iq1m_xx(shifts[ib], k, &x_p, &x_m);
                let g = y.qs[2 * ib + k] as usize + (((y.qh[ib] as usize) << (8 - 4 * k)) & 0x700);
                let pg = &data.grid[g];
                for j in 0..8 {
                    let w = weight[8 * k + j];
                    let q = xx[((pg[j] - 1) / 2) as usize] * (2 * l + 1) as f32;
                    sumqx_f += w * q * xb[8 * k + j];
                    sumq2_f += w * q * q;
                }
            }
        }
        if sumq2_f > 0.0 {
            d = sumqx_f / sumq2_f;
        }
        let s = f32_to_f16(d * 1.1125); // ggml's fudge factor
        sc[0] |= (s & 0x000f) << 12;
        sc[1] |= (s & 0x00f0) << 8;
        sc[2] |= (s & 0x0f00) << 4;
        sc[3] |= s & 0xf000;
        for (dst, v) in y.scales.chunks_exact_mut(2).zip(sc) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! AVX2 dequantization (same operations as the scalar code, 8 values at a time).
    use super::super::simd::x86::shifted_group;
    use super::*;

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_row_iq1_s_avx2(src: &[u8], dst: &mut [f32]) {
        let blocks: &[BlockIq1S] = bytemuck::cast_slice(src);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
            let d = get_f16(b.d);
            for (ib, y) in y.chunks_exact_mut(32).enumerate() {
                let qh = u16::from_le_bytes([b.qh[2 * ib], b.qh[2 * ib + 1]]) as usize;
                let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
                let delta = if qh & 0x8000 != 0 { -IQ1S_DELTA } else { IQ1S_DELTA };
                for (l, y) in y.chunks_exact_mut(8).enumerate() {
                    let index = b.qs[4 * ib + l] as usize | (((qh >> (3 * l)) & 7) << 8);
                    shifted_group(y, dl, IQ1S_GRID[index], delta);
                }
            }
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_row_iq1_m_avx2(src: &[u8], dst: &mut [f32]) {
        let blocks: &[BlockIq1M] = bytemuck::cast_slice(src);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
            let sc = iq1m_scales(b);
            let scale = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
            let d = f16_to_f32(scale);
            for (ib, y) in y.chunks_exact_mut(32).enumerate() {
                let s = sc[ib / 2] as usize;
                let dl1 = d * (2 * ((s >> (6 * (ib % 2))) & 7) + 1) as f32;
                let dl2 = d * (2 * ((s >> (6 * (ib % 2) + 3)) & 7) + 1) as f32;
                let qs = &b.qs[4 * ib..4 * ib + 4];
                let qh = [b.qh[2 * ib] as usize, b.qh[2 * ib + 1] as usize];
                for (l, y) in y.chunks_exact_mut(8).enumerate() {
                    let h = qh[l / 2];
                    let index = qs[l] as usize | ((h << if l % 2 == 0 { 8 } else { 4 }) & 0x700);
                    let sign_bit = if l % 2 == 0 { 0x08 } else { 0x80 };
                    let delta = if h & sign_bit != 0 { -IQ1S_DELTA } else { IQ1S_DELTA };
                    shifted_group(y, if l < 2 { dl1 } else { dl2 }, IQ1S_GRID[index], delta);
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
        use crate::iq_grid::simd::test_util::{bits, Rng};
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut rng = Rng(0x5eed);
        type Pair = (crate::DequantizeRow, crate::DequantizeRow);
        let cases: [(&str, usize, &[usize], Pair); 2] = [
            (
                "IQ1_S",
                50,
                &[0],
                (dequantize_row_iq1_s_scalar, |s, d| unsafe {
                    x86::dequantize_row_iq1_s_avx2(s, d)
                }),
            ),
            (
                "IQ1_M",
                56,
                &[54],
                (dequantize_row_iq1_m_scalar, |s, d| unsafe {
                    x86::dequantize_row_iq1_m_avx2(s, d)
                }),
            ),
        ];
        for (name, bytes, d_at, (scalar, fast)) in cases {
            let src = rng.blocks(4096, bytes, d_at);
            let (mut a, mut b) = (vec![0f32; 4096 * QK_K], vec![1f32; 4096 * QK_K]);
            scalar(&src, &mut a);
            fast(&src, &mut b);
            assert!(bits(&a) == bits(&b), "{name}");
        }
    }

    use super::*;

    #[test]
    fn grid_matches_init_table() {
        // The dequantization grid holds the init grid's levels 0, 1, 2 as -1, 0, 1.
        let data = iq2_data(Iq2Grid::Iq1);
        assert_eq!(data.grid.len(), IQ1S_GRID.len());
        for (p, &g) in data.grid.iter().zip(&IQ1S_GRID) {
            assert_eq!(p.map(|v| ((v - 1) / 2 - 1) as u8), g.to_le_bytes());
        }
    }
}
