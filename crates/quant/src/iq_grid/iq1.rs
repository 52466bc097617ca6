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

/// Shifted values of IQ1_S with a positive / negative delta (`x_p`, `x_m`).
const X_P_S: [f32; 3] = [-1.0 + IQ1S_DELTA, IQ1S_DELTA, 1.0 + IQ1S_DELTA];
const X_M_S: [f32; 3] = [-1.0 - IQ1S_DELTA, -IQ1S_DELTA, 1.0 - IQ1S_DELTA];
/// Shifted values of IQ1_M with a positive / negative delta (`x_p`, `x_m`).
const X_P_M: [f32; 3] = [-1.0 + IQ1M_DELTA, IQ1M_DELTA, 1.0 + IQ1M_DELTA];
const X_M_M: [f32; 3] = [-1.0 - IQ1M_DELTA, -IQ1M_DELTA, 1.0 - IQ1M_DELTA];

/// Prefix sums of one IQ1_M sub-block over its sorted values, kept per half (`px`, `pw` in ggml).
type HalfSums = [[f32; IQ1M_BLOCK_SIZE + 1]; 2];

/// The hot loops of IQ1_S / IQ1_M quantization, as scalar reference code ([`Scalar`]) or AVX2
/// code ([`x86::Avx2`]) that computes the very same floats and picks the very same results.
trait Kernels {
    /// [`sorted_positions`]: the block's positions in ascending order of value, ties in position
    /// order.
    fn sort<const N: usize>(xb: &[f32]) -> [usize; N];

    /// IQ1_S split search: the best `(i1, i2, shift, scale)` over all split points of the sorted
    /// block, or `None` when no split has a positive `sumq2`.
    ///
    /// # Safety
    /// The CPU supports the implementation's target features.
    unsafe fn search_s(
        sumx: &[f32; IQ1S_BLOCK_SIZE + 1],
        sumw: &[f32; IQ1S_BLOCK_SIZE + 1],
        max: f32,
    ) -> Option<(usize, usize, i8, f32)>;

    /// IQ1_M split search: the best `(i1, i2, k, scale)` (`k`: sign combination of the halves).
    ///
    /// # Safety
    /// The CPU supports the implementation's target features.
    unsafe fn search_m(px: &HalfSums, pw: &HalfSums, max: f32) -> Option<(usize, usize, usize, f32)>;

    /// `iq1_find_best_neighbour2`.
    ///
    /// # Safety
    /// The CPU supports the implementation's target features.
    unsafe fn best_neighbour(
        data: &Iq2Data,
        u: u16,
        xval: &[f32],
        weight: &[f32],
        scale: f32,
        xg: &[f32; 3],
        l: &mut [i8],
    ) -> usize;
}

/// The scalar reference kernels (the code as ggml writes it).
struct Scalar;

impl Kernels for Scalar {
    fn sort<const N: usize>(xb: &[f32]) -> [usize; N] {
        sorted_positions(xb)
    }
    unsafe fn search_s(
        sumx: &[f32; IQ1S_BLOCK_SIZE + 1],
        sumw: &[f32; IQ1S_BLOCK_SIZE + 1],
        max: f32,
    ) -> Option<(usize, usize, i8, f32)> {
        search_s_scalar(sumx, sumw, max)
    }
    unsafe fn search_m(px: &HalfSums, pw: &HalfSums, max: f32) -> Option<(usize, usize, usize, f32)> {
        search_m_scalar(px, pw, max)
    }
    unsafe fn best_neighbour(
        data: &Iq2Data,
        u: u16,
        xval: &[f32],
        weight: &[f32],
        scale: f32,
        xg: &[f32; 3],
        l: &mut [i8],
    ) -> usize {
        iq1_find_best_neighbour2_scalar(data, u, xval, weight, scale, xg, l)
    }
}

/// `iq1_find_best_neighbour2`: among the neighbours of an off-grid point, the grid point whose
/// shifted values `xg[level]` at `scale` are closest (weighted) to `xval`; writes its levels into
/// `l` and returns its index.
fn iq1_find_best_neighbour2_scalar(
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
    finish_neighbour(data, grid_index, l)
}

/// The end of `iq1_find_best_neighbour2`: the chosen point's levels into `l`, and its index.
fn finish_neighbour(data: &Iq2Data, grid_index: Option<usize>, l: &mut [i8]) -> usize {
    // ggml then scans the whole grid, but indexes `xval` with the grid index there (reading out of
    // bounds); that scan can only matter when every distance is NaN or infinite, where ggml aborts.
    let grid_index = grid_index.expect("iq1_find_best_neighbour2: did not find grid point (ggml aborts here)");
    for (li, &g) in l.iter_mut().zip(&data.grid[grid_index]) {
        *li = (g - 1) / 2;
    }
    grid_index
}

/// One IQ1_S split candidate `(i1, i2)` with shifted values `xx` (ggml's loop body): updates the
/// running best when its score beats `best_score`.
#[inline(always)]
fn consider_s(
    (sumqx, sumq2): (f32, f32),
    cand: (usize, usize, i8),
    best_score: &mut f32,
    scale: &mut f32,
    best: &mut Option<(usize, usize, i8)>,
) {
    if sumq2 > 0.0 && sumqx * sumqx > *best_score * sumq2 {
        *scale = sumqx / sumq2;
        *best_score = *scale * sumqx;
        *best = Some(cand);
    }
}

/// The scalar reference IQ1_S split search (see [`Kernels::search_s`]).
fn search_s_scalar(
    sumx: &[f32; IQ1S_BLOCK_SIZE + 1],
    sumw: &[f32; IQ1S_BLOCK_SIZE + 1],
    max: f32,
) -> Option<(usize, usize, i8, f32)> {
    const BS: usize = IQ1S_BLOCK_SIZE;
    let mut best_score = -f32::MAX;
    let mut scale = max;
    let mut best = None;
    for i1 in 0..=BS {
        for i2 in i1..=BS {
            for (xx, shift) in [(&X_P_S, 1i8), (&X_M_S, -1)] {
                let sumqx =
                    (sumx[i1] - sumx[0]) * xx[0] + (sumx[i2] - sumx[i1]) * xx[1] + (sumx[BS] - sumx[i2]) * xx[2];
                let sumq2 = (sumw[i1] - sumw[0]) * xx[0] * xx[0]
                    + (sumw[i2] - sumw[i1]) * xx[1] * xx[1]
                    + (sumw[BS] - sumw[i2]) * xx[2] * xx[2];
                consider_s((sumqx, sumq2), (i1, i2, shift), &mut best_score, &mut scale, &mut best);
            }
        }
    }
    best.map(|(i1, i2, shift)| (i1, i2, shift, scale))
}

/// The constants of the IQ1_M split search: `p2`, `m2`, `cp1`, `cp2`, `cm1`, `cm2`.
fn iq1m_consts() -> [f32; 6] {
    let (x_p, x_m) = (X_P_M, X_M_M);
    [
        x_p[2],
        x_m[2],
        x_p[0] * x_p[0] - x_p[1] * x_p[1],
        x_p[1] * x_p[1] - x_p[2] * x_p[2],
        x_m[0] * x_m[0] - x_m[1] * x_m[1],
        x_m[1] * x_m[1] - x_m[2] * x_m[2],
    ]
}

/// The scalar reference IQ1_M split search (see [`Kernels::search_m`]).
fn search_m_scalar(px: &HalfSums, pw: &HalfSums, max: f32) -> Option<(usize, usize, usize, f32)> {
    const BS: usize = IQ1M_BLOCK_SIZE;
    let txs = [px[0][BS], px[1][BS]];
    let tws = [pw[0][BS], pw[1][BS]];
    let [p2, m2, cp1, cp2, cm1, cm2] = iq1m_consts();
    let mut best_score = -f32::MAX;
    let mut scale = max;
    let mut best = None;
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
                consider_m(
                    (sumqx[k], sumq2[k]),
                    (i1, i2, k),
                    &mut best_score,
                    &mut scale,
                    &mut best,
                );
            }
        }
    }
    best.map(|(i1, i2, k)| (i1, i2, k, scale))
}

/// One IQ1_M split candidate (ggml's loop body over `k`).
#[inline(always)]
fn consider_m(
    (sumqx, sumq2): (f32, f32),
    cand: (usize, usize, usize),
    best_score: &mut f32,
    scale: &mut f32,
    best: &mut Option<(usize, usize, usize)>,
) {
    if sumq2 > 0.0 && sumqx * sumqx > *best_score * sumq2 {
        *scale = sumqx / sumq2;
        *best_score = *scale * sumqx;
        *best = Some(cand);
    }
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

/// [`sorted_positions`] through integer keys: without NaNs, `partial_cmp` is a total preorder (with
/// -0 equal to +0), so the stable order is the unique order of (value, position), which an unstable
/// sort of distinct keys `(order-preserving bits of the value, position)` finds. With a NaN the
/// stable sort's outcome depends on its algorithm: that block takes [`sorted_positions`] itself.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by the AVX2 search
fn sorted_positions_keyed<const N: usize>(xb: &[f32]) -> [usize; N] {
    assert!(xb.len() == N && N <= u32::MAX as usize);
    if xb.iter().any(|v| v.is_nan()) {
        return sorted_positions(xb);
    }
    let mut keys: [u64; N] = std::array::from_fn(|j| {
        let bits = if xb[j] == 0.0 { 0 } else { xb[j].to_bits() };
        let key = if bits & 0x8000_0000 != 0 {
            !bits
        } else {
            bits | 0x8000_0000
        };
        ((key as u64) << 32) | j as u64
    });
    keys.sort_unstable();
    keys.map(|k| (k & 0xffff_ffff) as usize)
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
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::quantize_iq1_s_avx2(src, dst, imatrix) };
    }
    quantize_iq1_s_scalar(src, dst, imatrix)
}

/// The scalar reference for [`quantize_iq1_s`].
fn quantize_iq1_s_scalar(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    // SAFETY: the scalar kernels need no CPU features.
    unsafe { quantize_iq1_s_with::<Scalar>(src, dst, imatrix) }
}

/// [`quantize_iq1_s`] with kernels `K`.
///
/// # Safety
/// The CPU supports `K`'s target features.
#[inline(always)]
unsafe fn quantize_iq1_s_with<K: Kernels>(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    const BS: usize = IQ1S_BLOCK_SIZE;
    let quant_weights = imatrix.expect("IQ1_S: missing quantization weights");
    let data = iq2_data(Iq2Grid::Iq1);
    let (x_p, x_m) = (X_P_S, X_M_S);
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
            let idx = K::sort::<BS>(xb);
            let mut sumx = [0f32; BS + 1];
            let mut sumw = [0f32; BS + 1];
            for (j, &i) in idx.iter().enumerate() {
                sumx[j + 1] = sumx[j] + weight[i] * xb[i];
                sumw[j + 1] = sumw[j] + weight[i];
            }
            let Some((besti1, besti2, mut best_shift, mut scale)) = K::search_s(&sumx, &sumw, max) else {
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
                        K::best_neighbour(data, u, &xb[r.clone()], &weight[r.clone()], scale, xx, &mut l[r])
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
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::quantize_iq1_m_avx2(src, dst, imatrix) };
    }
    quantize_iq1_m_scalar(src, dst, imatrix)
}

/// The scalar reference for [`quantize_iq1_m`].
fn quantize_iq1_m_scalar(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    // SAFETY: the scalar kernels need no CPU features.
    unsafe { quantize_iq1_m_with::<Scalar>(src, dst, imatrix) }
}

/// [`quantize_iq1_m`] with kernels `K`.
///
/// # Safety
/// The CPU supports `K`'s target features.
#[inline(always)]
unsafe fn quantize_iq1_m_with<K: Kernels>(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    const BS: usize = IQ1M_BLOCK_SIZE;
    let data = iq2_data(Iq2Grid::Iq1);
    let (x_p, x_m) = (X_P_M, X_M_M);
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
            let idx = K::sort::<BS>(xb);
            let mut px: HalfSums = [[0f32; BS + 1]; 2];
            let mut pw: HalfSums = [[0f32; BS + 1]; 2];
            for (j, &i) in idx.iter().enumerate() {
                let h = if i < BS / 2 { 0 } else { 1 };
                px[h][j + 1] = px[h][j] + weight[i] * xb[i];
                px[1 - h][j + 1] = px[1 - h][j];
                pw[h][j + 1] = pw[h][j] + weight[i];
                pw[1 - h][j + 1] = pw[1 - h][j];
            }
            let Some((besti1, besti2, mut best_k, mut scale)) = K::search_m(&px, &pw, max) else {
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
                        K::best_neighbour(data, u, &xb[r.clone()], &weight[r.clone()], scale, xx, &mut l[r])
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
    //! AVX2 quantization kernels and dequantization (same operations as the scalar code, 8 values at
    //! a time).
    use super::super::simd::x86::shifted_group;
    use super::*;
    use std::arch::x86_64::*;

    /// The AVX2 kernels: several candidates per instruction, one per lane, each computed with the
    /// scalar code's operations in its order; the sequential choice of the best is replayed in
    /// scalar code for every group of candidates where any lane could change it.
    pub(super) struct Avx2;

    impl Kernels for Avx2 {
        #[inline(always)]
        fn sort<const N: usize>(xb: &[f32]) -> [usize; N] {
            sorted_positions_keyed(xb)
        }
        #[inline(always)]
        unsafe fn search_s(
            sumx: &[f32; IQ1S_BLOCK_SIZE + 1],
            sumw: &[f32; IQ1S_BLOCK_SIZE + 1],
            max: f32,
        ) -> Option<(usize, usize, i8, f32)> {
            search_s_avx2(sumx, sumw, max)
        }
        #[inline(always)]
        unsafe fn search_m(px: &HalfSums, pw: &HalfSums, max: f32) -> Option<(usize, usize, usize, f32)> {
            search_m_avx2(px, pw, max)
        }
        #[inline(always)]
        unsafe fn best_neighbour(
            data: &Iq2Data,
            u: u16,
            xval: &[f32],
            weight: &[f32],
            scale: f32,
            xg: &[f32; 3],
            l: &mut [i8],
        ) -> usize {
            best_neighbour_avx2(data, u, xval, weight, scale, xg, l)
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_iq1_s_avx2(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
        quantize_iq1_s_with::<Avx2>(src, dst, imatrix)
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_iq1_m_avx2(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
        quantize_iq1_m_with::<Avx2>(src, dst, imatrix)
    }

    /// Lanes `0..n` set (n clamped to 8).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn first_lanes(n: usize) -> __m256 {
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n.min(8) as i32), lane))
    }

    /// Lanes where `sumq2 > 0 && sumqx * sumqx > best_score * sumq2` (ordered compares, as C's `>`).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn beats(sumqx: __m256, sumq2: __m256, best_score: __m256) -> __m256 {
        let pos = _mm256_cmp_ps::<_CMP_GT_OQ>(sumq2, _mm256_setzero_ps());
        let better = _mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_mul_ps(sumqx, sumqx), _mm256_mul_ps(best_score, sumq2));
        _mm256_and_ps(pos, better)
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store(v: __m256) -> [f32; 8] {
        let mut a = [0f32; 8];
        _mm256_storeu_ps(a.as_mut_ptr(), v);
        a
    }

    /// [`search_s_scalar`] with 8 consecutive `i2` per step. A step whose lanes all fail the test
    /// against the best score at its start changes nothing (the scalar loop would test each lane
    /// against that same score); otherwise its lanes are replayed in order by the scalar code.
    #[target_feature(enable = "avx2")]
    unsafe fn search_s_avx2(
        sumx: &[f32; IQ1S_BLOCK_SIZE + 1],
        sumw: &[f32; IQ1S_BLOCK_SIZE + 1],
        max: f32,
    ) -> Option<(usize, usize, i8, f32)> {
        const BS: usize = IQ1S_BLOCK_SIZE;
        let (xp, xm) = (X_P_S, X_M_S);
        let mut sx = [0f32; BS + 1 + 7];
        // NaN padding makes `sumq2` NaN in lanes past the block, so that they never pass.
        let mut sw = [f32::NAN; BS + 1 + 7];
        sx[..BS + 1].copy_from_slice(sumx);
        sw[..BS + 1].copy_from_slice(sumw);
        let (tx, tw) = (_mm256_set1_ps(sumx[BS]), _mm256_set1_ps(sumw[BS]));
        let (xp1, xp2, xm1, xm2) = (
            _mm256_set1_ps(xp[1]),
            _mm256_set1_ps(xp[2]),
            _mm256_set1_ps(xm[1]),
            _mm256_set1_ps(xm[2]),
        );
        let mut best_score = -f32::MAX;
        let mut scale = max;
        let mut best = None;
        for i1 in 0..=BS {
            let (a, aw) = (sumx[i1] - sumx[0], sumw[i1] - sumw[0]);
            let (ap, am) = (_mm256_set1_ps(a * xp[0]), _mm256_set1_ps(a * xm[0]));
            let (awp, awm) = (_mm256_set1_ps(aw * xp[0] * xp[0]), _mm256_set1_ps(aw * xm[0] * xm[0]));
            let (s1, w1) = (_mm256_set1_ps(sumx[i1]), _mm256_set1_ps(sumw[i1]));
            for i2 in (i1..=BS).step_by(8) {
                let vx = _mm256_loadu_ps(sx.as_ptr().add(i2));
                let vw = _mm256_loadu_ps(sw.as_ptr().add(i2));
                let (b, c) = (_mm256_sub_ps(vx, s1), _mm256_sub_ps(tx, vx));
                let (bw, cw) = (_mm256_sub_ps(vw, w1), _mm256_sub_ps(tw, vw));
                let qx_p = _mm256_add_ps(_mm256_add_ps(ap, _mm256_mul_ps(b, xp1)), _mm256_mul_ps(c, xp2));
                let qx_m = _mm256_add_ps(_mm256_add_ps(am, _mm256_mul_ps(b, xm1)), _mm256_mul_ps(c, xm2));
                let q2_p = _mm256_add_ps(
                    _mm256_add_ps(awp, _mm256_mul_ps(_mm256_mul_ps(bw, xp1), xp1)),
                    _mm256_mul_ps(_mm256_mul_ps(cw, xp2), xp2),
                );
                let q2_m = _mm256_add_ps(
                    _mm256_add_ps(awm, _mm256_mul_ps(_mm256_mul_ps(bw, xm1), xm1)),
                    _mm256_mul_ps(_mm256_mul_ps(cw, xm2), xm2),
                );
                let passing = |best_score: f32| {
                    let bs = _mm256_set1_ps(best_score);
                    _mm256_movemask_ps(_mm256_or_ps(beats(qx_p, q2_p, bs), beats(qx_m, q2_m, bs))) as u32
                };
                let mut mask = passing(best_score);
                if mask == 0 {
                    continue;
                }
                let (sqx_p, sq2_p, sqx_m, sq2_m) = (store(qx_p), store(q2_p), store(qx_m), store(q2_m));
                while mask != 0 {
                    // Lanes before `t` fail against the current best: the scalar loop skips them.
                    let t = mask.trailing_zeros() as usize;
                    consider_s(
                        (sqx_p[t], sq2_p[t]),
                        (i1, i2 + t, 1),
                        &mut best_score,
                        &mut scale,
                        &mut best,
                    );
                    consider_s(
                        (sqx_m[t], sq2_m[t]),
                        (i1, i2 + t, -1),
                        &mut best_score,
                        &mut scale,
                        &mut best,
                    );
                    mask = passing(best_score) & (!1u32 << t);
                }
            }
        }
        best.map(|(i1, i2, shift)| (i1, i2, shift, scale))
    }

    /// [`search_m_scalar`] with 8 consecutive `i2` per step (replayed as in [`search_s_avx2`]).
    #[target_feature(enable = "avx2")]
    unsafe fn search_m_avx2(px: &HalfSums, pw: &HalfSums, max: f32) -> Option<(usize, usize, usize, f32)> {
        const BS: usize = IQ1M_BLOCK_SIZE;
        let txs = [px[0][BS], px[1][BS]];
        let tws = [pw[0][BS], pw[1][BS]];
        let [p2, m2, cp1, cp2, cm1, cm2] = iq1m_consts();
        // Per half: px[i2], pw[i2] * cp2, pw[i2] * cm2 (each product as the scalar code forms it);
        // the padding makes `sumq2` NaN in lanes past the block, so that they never pass.
        let mut pxp = [[0f32; BS + 1 + 7]; 2];
        let mut wcp = [[f32::NAN; BS + 1 + 7]; 2];
        let mut wcm = [[f32::NAN; BS + 1 + 7]; 2];
        for h in 0..2 {
            pxp[h][..BS + 1].copy_from_slice(&px[h]);
            for i2 in 0..=BS {
                wcp[h][i2] = pw[h][i2] * cp2;
                wcm[h][i2] = pw[h][i2] * cm2;
            }
        }
        let txp = [_mm256_set1_ps(txs[0] * p2), _mm256_set1_ps(txs[1] * p2)];
        let txm = [_mm256_set1_ps(txs[0] * m2), _mm256_set1_ps(txs[1] * m2)];
        let mut best_score = -f32::MAX;
        let mut scale = max;
        let mut best = None;
        for i1 in 0..=BS {
            let mut a = [_mm256_setzero_ps(); 2];
            let mut rp = [_mm256_setzero_ps(); 2];
            let mut rm = [_mm256_setzero_ps(); 2];
            for h in 0..2 {
                a[h] = _mm256_set1_ps(px[h][i1]);
                rp[h] = _mm256_set1_ps(tws[h] * p2 * p2 + pw[h][i1] * cp1);
                rm[h] = _mm256_set1_ps(tws[h] * m2 * m2 + pw[h][i1] * cm1);
            }
            let mut i2 = i1;
            while i2 <= BS {
                let mut qx_p = [_mm256_setzero_ps(); 2];
                let mut qx_m = [_mm256_setzero_ps(); 2];
                let mut q2_p = [_mm256_setzero_ps(); 2];
                let mut q2_m = [_mm256_setzero_ps(); 2];
                for h in 0..2 {
                    let sx = _mm256_add_ps(a[h], _mm256_loadu_ps(pxp[h].as_ptr().add(i2)));
                    qx_p[h] = _mm256_sub_ps(txp[h], sx);
                    qx_m[h] = _mm256_sub_ps(txm[h], sx);
                    q2_p[h] = _mm256_add_ps(rp[h], _mm256_loadu_ps(wcp[h].as_ptr().add(i2)));
                    q2_m[h] = _mm256_add_ps(rm[h], _mm256_loadu_ps(wcm[h].as_ptr().add(i2)));
                }
                let sumqx = [
                    _mm256_add_ps(qx_p[0], qx_p[1]),
                    _mm256_add_ps(qx_p[0], qx_m[1]),
                    _mm256_add_ps(qx_m[0], qx_p[1]),
                    _mm256_add_ps(qx_m[0], qx_m[1]),
                ];
                let sumq2 = [
                    _mm256_add_ps(q2_p[0], q2_p[1]),
                    _mm256_add_ps(q2_p[0], q2_m[1]),
                    _mm256_add_ps(q2_m[0], q2_p[1]),
                    _mm256_add_ps(q2_m[0], q2_m[1]),
                ];
                let passing = |best_score: f32| {
                    let bs = _mm256_set1_ps(best_score);
                    let any = _mm256_or_ps(
                        _mm256_or_ps(beats(sumqx[0], sumq2[0], bs), beats(sumqx[1], sumq2[1], bs)),
                        _mm256_or_ps(beats(sumqx[2], sumq2[2], bs), beats(sumqx[3], sumq2[3], bs)),
                    );
                    _mm256_movemask_ps(any) as u32
                };
                let i2_base = i2;
                i2 += 8;
                let mut mask = passing(best_score);
                if mask == 0 {
                    continue;
                }
                let i2 = i2_base;
                let qx = sumqx.map(|v| store(v));
                let q2 = sumq2.map(|v| store(v));
                while mask != 0 {
                    // Lanes before `t` fail against the current best: the scalar loop skips them.
                    let t = mask.trailing_zeros() as usize;
                    for k in 0..4 {
                        consider_m(
                            (qx[k][t], q2[k][t]),
                            (i1, i2 + t, k),
                            &mut best_score,
                            &mut scale,
                            &mut best,
                        );
                    }
                    mask = passing(best_score) & (!1u32 << t);
                }
            }
        }
        best.map(|(i1, i2, k)| (i1, i2, k, scale))
    }

    /// [`iq1_find_best_neighbour2_scalar`] with 8 neighbours per step. Each distance term
    /// `w * diff * diff` depends only on the coordinate and its level, so the 3 possible terms of
    /// each coordinate are computed once (exactly as the scalar code does) and looked up per lane;
    /// each lane then sums its 8 terms in coordinate order, from 0.
    #[target_feature(enable = "avx2")]
    unsafe fn best_neighbour_avx2(
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
        let packed = data.neighbours_packed(u);
        assert!(packed.len() >= neighbours.len() + 7 && xval.len() >= 8 && weight.len() >= 8);
        let sq = _mm256_mul_ps(
            _mm256_set1_ps(scale),
            _mm256_setr_ps(xg[0], xg[1], xg[2], 0.0, 0.0, 0.0, 0.0, 0.0),
        );
        let terms: [__m256; 8] = std::array::from_fn(|i| {
            let diff = _mm256_sub_ps(sq, _mm256_set1_ps(xval[i]));
            _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(weight[i]), diff), diff)
        });
        let three = _mm256_set1_epi32(3);
        let mut best_score = f32::MAX;
        let mut grid_index = None;
        for start in (0..neighbours.len()).step_by(8) {
            let mut lv = _mm256_cvtepu16_epi32(_mm_loadu_si128(packed.as_ptr().add(start) as *const __m128i));
            let mut d2 = _mm256_setzero_ps();
            for t in &terms {
                d2 = _mm256_add_ps(d2, _mm256_permutevar8x32_ps(*t, _mm256_and_si256(lv, three)));
                lv = _mm256_srli_epi32::<2>(lv);
            }
            // Nothing changes unless some lane is below the best so far.
            let below = _mm256_cmp_ps::<_CMP_LT_OQ>(d2, _mm256_set1_ps(best_score));
            if _mm256_movemask_ps(_mm256_and_ps(below, first_lanes(neighbours.len() - start))) == 0 {
                continue;
            }
            let d2 = store(d2);
            for (t, &j) in neighbours[start..].iter().take(8).enumerate() {
                if d2[t] < best_score {
                    best_score = d2[t];
                    grid_index = Some(j as usize);
                }
            }
        }
        finish_neighbour(data, grid_index, l)
    }

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
        use crate::iq_grid::simd::test_util::{assert_dequant_agrees, DequantPair, Rng};
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut rng = Rng(0x5eed);
        type Pair = DequantPair;
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
        assert_dequant_agrees(&mut rng, &cases);
    }

    use super::*;

    /// A seeded row of one of many shapes: gaussians at scales from 1e-30 to 1e20, uniform,
    /// outliers, zero blocks, all zeros, constants, one-hot, heavy ties (with -0 and +0), subnormals,
    /// values around the zero-block threshold, one-signed rows.
    #[cfg(target_arch = "x86_64")]
    fn mixed_row(rng: &mut crate::iq_grid::simd::test_util::Rng, kind: usize, n: usize) -> Vec<f32> {
        let unit =
            |rng: &mut crate::iq_grid::simd::test_util::Rng| ((rng.next() >> 40) as f32 + 0.5) / (1u64 << 24) as f32;
        let gauss = |rng: &mut crate::iq_grid::simd::test_util::Rng| {
            let (u, v) = (unit(rng), unit(rng));
            (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        };
        let scales = [1e-30f32, 1e-8, 1e-3, 0.02, 1.0, 37.0, 1e4, 1e20];
        let scale = scales[(rng.next() % scales.len() as u64) as usize];
        let hot = (rng.next() % n as u64) as usize;
        let c = gauss(rng) * scale;
        (0..n)
            .map(|i| match kind % 12 {
                0 => gauss(rng) * scale,
                1 => (unit(rng) * 2.0 - 1.0) * scale,
                2 => {
                    let g = gauss(rng) * scale;
                    if unit(rng) < 0.02 {
                        g * 30.0
                    } else {
                        g
                    }
                }
                3 => {
                    if (i / 16) % 3 == 0 {
                        0.0
                    } else {
                        gauss(rng) * scale
                    }
                }
                4 => 0.0,
                5 => c,
                6 => {
                    if i == hot {
                        c
                    } else {
                        0.0
                    }
                }
                7 => match rng.next() % 7 {
                    0 => -0.0,
                    1 => 0.0,
                    k => (k as f32 - 3.5) * scale,
                },
                8 => f32::from_bits(rng.next() as u32 & 0x807f_ffff), // subnormals and zeros
                9 => gauss(rng) * [1e-12, 1e-7, 2e-7][i / 32 % 3],
                10 => (gauss(rng) * scale).abs() * if (i / 64) % 2 == 0 { 1.0 } else { -1.0 },
                _ => ((rng.next() % 3) as f32 - 1.0 + 0.125 * (rng.next() % 2) as f32) * scale,
            })
            .collect()
    }

    /// Importance matrices: uniform, with zeros, and of a wide dynamic range.
    #[cfg(target_arch = "x86_64")]
    fn mixed_imatrix(rng: &mut crate::iq_grid::simd::test_util::Rng, kind: usize, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let u = ((rng.next() >> 40) as f32 + 0.5) / (1u64 << 24) as f32;
                match kind % 3 {
                    0 => 0.1 + 2.0 * u,
                    1 => {
                        if rng.next().is_multiple_of(10) {
                            0.0
                        } else {
                            u
                        }
                    }
                    _ => (u * 40.0 - 20.0).exp(),
                }
            })
            .collect()
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_quantize_matches_scalar() {
        use crate::iq_grid::simd::test_util::Rng;
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut rng = Rng(0x1a1_5eed);
        let n = 2 * QK_K;
        for row in 0..3000 {
            let x = mixed_row(&mut rng, row, n);
            let w = mixed_imatrix(&mut rng, row / 12, n);
            let (mut a, mut b) = (vec![0u8; n / QK_K * 50], vec![1u8; n / QK_K * 50]);
            quantize_iq1_s_scalar(&x, &mut a, Some(&w));
            unsafe { x86::quantize_iq1_s_avx2(&x, &mut b, Some(&w)) };
            assert_eq!(a, b, "IQ1_S row {row}");
            for im in [None, Some(&w[..])] {
                let (mut a, mut b) = (vec![0u8; n / QK_K * 56], vec![1u8; n / QK_K * 56]);
                quantize_iq1_m_scalar(&x, &mut a, im);
                unsafe { x86::quantize_iq1_m_avx2(&x, &mut b, im) };
                assert_eq!(a, b, "IQ1_M row {row} imatrix {}", im.is_some());
            }
        }
    }

    #[test]
    fn keyed_sort_matches_stable_sort() {
        use crate::iq_grid::simd::test_util::Rng;
        let mut rng = Rng(7);
        let pool = [
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            0.5,
            f32::MIN_POSITIVE,
            -1e-40,
            f32::MAX,
            -f32::MAX,
            3.0,
        ];
        for _ in 0..20000 {
            let x: [f32; 32] = std::array::from_fn(|_| pool[(rng.next() % pool.len() as u64) as usize]);
            assert_eq!(sorted_positions_keyed::<32>(&x), sorted_positions::<32>(&x));
            assert_eq!(sorted_positions_keyed::<16>(&x[..16]), sorted_positions::<16>(&x[..16]));
        }
        let mut x = [1.0f32; 16];
        x[3] = f32::NAN;
        assert_eq!(sorted_positions_keyed::<16>(&x), sorted_positions::<16>(&x));
    }

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
