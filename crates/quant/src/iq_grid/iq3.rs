//! IQ3_XXS (3.0625 bpw) and IQ3_S (3.4375 bpw): super-blocks of 256 weights in sub-blocks of 32, each
//! group of 4 magnitudes coded as an index into a 256- or 512-point grid, signs stored separately, one
//! 4-bit scale per sub-block and an f16 super-block scale (`quantize_iq3_xxs`, `quantize_iq3_s`,
//! `dequantize_row_iq3_xxs`, `dequantize_row_iq3_s` in ggml-quants.c).

use super::grids2::KSIGNS_IQ2XS;
use super::grids3::{IQ3S_GRID, IQ3XXS_GRID};
use super::init3::{iq3_find_best_neighbour, iq3_tables, Iq3Tables, MapEntry};
use crate::fp::{get_f16, nearest_int, put_f16, F16Bytes};
use crate::{Codec, GgmlType};

const QK_K: usize = 256;
/// Largest level + 1 (`kMaxQ`): levels 0..7 stand for the odd values 1..15.
const K_MAX_Q: i32 = 8;
/// Sub-blocks whose largest magnitude is below this are zero in IQ3_XXS (`GROUP_MAX_EPS_IQ3_XXS`).
const GROUP_MAX_EPS_IQ3_XXS: f32 = 1e-8;

/// `block_iq3_xxs`: `qs` holds 64 grid indices, then per sub-block a little-endian u32 with four
/// 7-bit sign fields (bits 0..28) and the 4-bit scale (bits 28..32).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq3Xxs {
    pub d: F16Bytes,
    pub qs: [u8; 96],
}
const _: () = assert!(std::mem::size_of::<BlockIq3Xxs>() == 98);

/// `block_iq3_s`: low 8 bits of 64 grid indices, their 9th bits, 8 sign bits per 8 weights, and two
/// 4-bit scales per byte.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq3S {
    pub d: F16Bytes,
    pub qs: [u8; 64],
    pub qh: [u8; 8],
    pub signs: [u8; 32],
    pub scales: [u8; 4],
}
const _: () = assert!(std::mem::size_of::<BlockIq3S>() == 110);

pub(crate) const CODECS: &[Codec] = &[
    Codec {
        ty: GgmlType::IQ3_XXS,
        quantize: Some(quantize_row_iq3_xxs),
        dequantize: dequantize_row_iq3_xxs,
        requires_imatrix: false,
    },
    Codec {
        ty: GgmlType::IQ3_S,
        quantize: Some(quantize_row_iq3_s),
        dequantize: dequantize_row_iq3_s,
        requires_imatrix: false,
    },
];

/// What differs between the two types in the per-sub-block search of `quantize_row_iq3_xxs_impl`
/// and `quantize_row_iq3_s_impl`.
struct Variant {
    tables: &'static Iq3Tables,
    /// Scale candidates are `(15 + is * 0.2) / max` for `is` in `-steps..=steps`.
    steps: i32,
    /// IQ3_XXS zeroes sub-blocks with max < 1e-8; IQ3_S only all-zero ones.
    zero_below_eps: bool,
    /// IQ3_XXS starts the "is on grid" flags true and re-fits only the groups off the grid;
    /// IQ3_S starts them false and re-fits all groups.
    xxs: bool,
}

/// Weights, their square roots and the magnitudes of one 32-weight sub-block.
struct SubBlock {
    weight: [f32; 32],
    waux: [f32; 32],
    xval: [f32; 32],
}

/// `sigma2 = 2·Σx²/256` of a super-block (the first loop of both `quantize_row_iq3_*_impl`).
fn sigma2_of(xbl: &[f32]) -> f32 {
    let mut sumx2 = 0f32;
    for &x in xbl {
        sumx2 += x * x;
    }
    2.0 * sumx2 / QK_K as f32
}

impl SubBlock {
    /// Weights from the importance matrix or the squares of the values (both `quantize_row_iq3_*_impl`).
    fn new(xb: &[f32], qw: Option<&[f32]>, sigma2: f32) -> Self {
        let mut weight = [0f32; 32];
        match qw {
            Some(qw) => {
                for i in 0..32 {
                    weight[i] = qw[i] * (sigma2 + xb[i] * xb[i]).sqrt();
                }
            }
            None => {
                for i in 0..32 {
                    weight[i] = xb[i] * xb[i];
                }
            }
        }
        let waux = weight.map(f32::sqrt);
        SubBlock {
            weight,
            waux,
            xval: [0f32; 32],
        }
    }

    /// Weighted least-squares fit terms (Σ w·x·q, Σ w·q²) of levels `l` (value 2l+1).
    fn sums(&self, l: &[i8; 32]) -> (f32, f32) {
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for ((&w, &x), &li) in self.weight.iter().zip(&self.xval).zip(l) {
            let q = (2 * li as i32 + 1) as f32;
            sumqx += w * x * q;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    }
}

/// Packs four 3-bit levels into a map index.
#[inline]
fn pack(l: &[i8]) -> usize {
    (0..4).fold(0usize, |u, i| u | ((l[i] as usize) << (3 * i)))
}

/// Level of one magnitude at inverse scale `id`, clamped to 0..7.
#[inline]
fn level(id: f32, x: f32) -> i8 {
    nearest_int(0.5 * (id * x - 1.0)).clamp(0, K_MAX_Q - 1) as i8
}

/// Scale and grid indices of one sub-block of magnitudes `sb.xval` (the per-`ib` search shared by
/// `quantize_row_iq3_xxs_impl` and `quantize_row_iq3_s_impl`); `None` when the sub-block is zero.
fn search_sub_block(v: &Variant, sb: &SubBlock) -> Option<(f32, [u16; 8])> {
    let t = v.tables;
    let xval = &sb.xval;
    let mut max = xval[0];
    for &x in &xval[1..] {
        max = if max > x { max } else { x };
    }
    let mut l = [0i8; 32];
    if (v.zero_below_eps && max < GROUP_MAX_EPS_IQ3_XXS) || (!v.zero_below_eps && max == 0.0) {
        return None;
    }
    let mut best = 0f32;
    let mut scale = max / (2 * K_MAX_Q - 1) as f32;
    let mut is_on_grid = [v.xxs; 8];
    let mut laux = [0i8; 32];
    let mut is_on_grid_aux = [true; 8];
    for is in -v.steps..=v.steps {
        let id = ((2 * K_MAX_Q - 1) as f32 + is as f32 * 0.2) / max;
        let this_scale = 1.0 / id;
        for (k, on_grid) in is_on_grid_aux.iter_mut().enumerate() {
            let g = 4 * k..4 * k + 4;
            for (li, &x) in laux[g.clone()].iter_mut().zip(&xval[g.clone()]) {
                *li = level(id, x);
            }
            *on_grid = true;
            if let MapEntry::Off { start, len } = t.lookup(pack(&laux[g.clone()])) {
                *on_grid = false;
                iq3_find_best_neighbour(
                    t.neighbours(start, len),
                    &t.grid,
                    &xval[g.clone()],
                    &sb.waux[g.clone()],
                    this_scale,
                    &mut laux[g],
                );
            }
        }
        let (sumqx, sumq2) = sb.sums(&laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l = laux;
            is_on_grid = is_on_grid_aux;
        }
    }
    if is_on_grid.iter().any(|&on| !on) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..8 {
            if v.xxs && is_on_grid[k] {
                continue;
            }
            let g = 4 * k..4 * k + 4;
            let mut lk = [0i8; 4];
            for (i, lv) in lk.iter_mut().enumerate() {
                *lv = level(id, xval[4 * k + i]);
            }
            let index = match t.lookup(pack(&lk)) {
                MapEntry::OnGrid(i) => i as usize,
                MapEntry::Off { start, len } => iq3_find_best_neighbour(
                    t.neighbours(start, len),
                    &t.grid,
                    &xval[g.clone()],
                    &sb.waux[g.clone()],
                    scale,
                    &mut l[g.clone()],
                ),
            };
            for (li, &p) in l[g].iter_mut().zip(&t.grid[index]) {
                *li = (p - 1) / 2;
            }
        }
        let (sumqx, sumq2) = sb.sums(&l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    let indices = std::array::from_fn(|k| match t.lookup(pack(&l[4 * k..4 * k + 4])) {
        MapEntry::OnGrid(i) => i,
        MapEntry::Off { .. } => panic!("iq3: found point {:?} not on grid", &l[4 * k..4 * k + 4]),
    });
    Some((scale, indices))
}

/// Quantize one row to IQ3_XXS (`quantize_iq3_xxs` → `quantize_row_iq3_xxs_impl(256, …)`).
fn quantize_row_iq3_xxs(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let v = Variant {
        tables: iq3_tables(256),
        steps: 15,
        zero_below_eps: true,
        xxs: true,
    };
    let blocks: &mut [BlockIq3Xxs] = bytemuck::cast_slice_mut(dst);
    for (ibl, (y, xbl)) in blocks.iter_mut().zip(src.chunks_exact(QK_K)).enumerate() {
        let mut scales = [0f32; QK_K / 32];
        let mut q3 = [0u8; 96];
        let mut max_scale = 0f32;
        let sigma2 = sigma2_of(xbl);
        for (ib, xb) in xbl.chunks_exact(32).enumerate() {
            let qw = imatrix.map(|w| &w[QK_K * ibl + 32 * ib..][..32]);
            let mut sb = SubBlock::new(xb, qw, sigma2);
            let mut block_signs = [0u8; 4];
            for k in 0..4 {
                let mut nflip = 0;
                let mut s = 0u8;
                for i in 0..8 {
                    let x = xb[8 * k + i];
                    if x >= 0.0 {
                        sb.xval[8 * k + i] = x;
                    } else {
                        sb.xval[8 * k + i] = -x;
                        nflip += 1;
                        s |= 1 << i;
                    }
                }
                if nflip % 2 == 1 {
                    // Keep the sign count even: flip the least important value.
                    let ax = |i: usize| sb.weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                    let mut imin = 0;
                    let mut min = ax(0);
                    for i in 1..8 {
                        if ax(i) < min {
                            min = ax(i);
                            imin = i;
                        }
                    }
                    sb.xval[8 * k + imin] = -sb.xval[8 * k + imin];
                    s ^= 1 << imin;
                }
                block_signs[k] = s & 127;
            }
            let Some((mut scale, indices)) = search_sub_block(&v, &sb) else {
                scales[ib] = 0.0;
                continue;
            };
            if scale < 0.0 {
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s & 127;
                }
            }
            for (q, &i) in q3[8 * ib..8 * ib + 8].iter_mut().zip(&indices) {
                *q = i as u8;
            }
            let signs = block_signs[0] as u32
                | (block_signs[1] as u32) << 7
                | (block_signs[2] as u32) << 14
                | (block_signs[3] as u32) << 21;
            q3[64 + 4 * ib..68 + 4 * ib].copy_from_slice(&signs.to_le_bytes());
            assert!(scale >= 0.0);
            scales[ib] = scale;
            max_scale = if max_scale > scale { max_scale } else { scale };
        }
        if max_scale == 0.0 {
            *y = BlockIq3Xxs {
                d: put_f16(0.0),
                qs: [0; 96],
            };
            continue;
        }
        let d = max_scale / 31.0;
        y.d = put_f16(d * 1.0125); // ggml's fudge factor
        let id = 1.0 / d;
        for (ib, &s) in scales.iter().enumerate() {
            let l = nearest_int(0.5 * (id * s - 1.0)).clamp(0, 15) as u32;
            q3[64 + 4 * ib + 3] |= (l << 4) as u8;
        }
        y.qs = q3;
    }
}

/// Quantize one row to IQ3_S (`quantize_iq3_s` → `quantize_row_iq3_s_impl` with 32-weight sub-blocks).
fn quantize_row_iq3_s(src: &[f32], dst: &mut [u8], imatrix: Option<&[f32]>) {
    let v = Variant {
        tables: iq3_tables(512),
        steps: 9,
        zero_below_eps: false,
        xxs: false,
    };
    let blocks: &mut [BlockIq3S] = bytemuck::cast_slice_mut(dst);
    for (ibl, (y, xbl)) in blocks.iter_mut().zip(src.chunks_exact(QK_K)).enumerate() {
        *y = bytemuck::Zeroable::zeroed();
        y.d = put_f16(0.0);
        let mut scales = [0f32; QK_K / 32];
        let mut max_scale = 0f32;
        // ggml advances its qs / signs pointers only past sub-blocks that are not zero, so later
        // sub-blocks are stored in the slots that zero ones leave free; the scales and qh bits are
        // indexed by sub-block.
        let mut slot = 0;
        let sigma2 = sigma2_of(xbl);
        for (ib, xb) in xbl.chunks_exact(32).enumerate() {
            let qw = imatrix.map(|w| &w[QK_K * ibl + 32 * ib..][..32]);
            let mut sb = SubBlock::new(xb, qw, sigma2);
            let mut block_signs = [0u8; 4];
            for k in 0..4 {
                let mut s = 0u8;
                for i in 0..8 {
                    let x = xb[8 * k + i];
                    if x >= 0.0 {
                        sb.xval[8 * k + i] = x;
                    } else {
                        sb.xval[8 * k + i] = -x;
                        s |= 1 << i;
                    }
                }
                block_signs[k] = s;
            }
            let Some((mut scale, indices)) = search_sub_block(&v, &sb) else {
                scales[ib] = 0.0;
                continue;
            };
            if scale < 0.0 {
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s;
                }
            }
            for (k, &i) in indices.iter().enumerate() {
                y.qs[8 * slot + k] = (i & 255) as u8;
                y.qh[ib] |= ((i >> 8) as u8) << k;
            }
            y.signs[4 * slot..4 * slot + 4].copy_from_slice(&block_signs);
            slot += 1;
            assert!(scale >= 0.0);
            scales[ib] = scale;
            max_scale = if max_scale > scale { max_scale } else { scale };
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        y.d = put_f16(d * 1.033); // ggml's fudge factor
        let id = 1.0 / d;
        for (j, pair) in scales.chunks_exact(2).enumerate() {
            let l1 = nearest_int(0.5 * (id * pair[0] - 1.0)).clamp(0, 15) as u8;
            let l2 = nearest_int(0.5 * (id * pair[1] - 1.0)).clamp(0, 15) as u8;
            y.scales[j] = l1 | (l2 << 4);
        }
    }
}

/// Byte `j` of a packed grid point.
#[inline]
fn grid_byte(g: u32, j: usize) -> f32 {
    ((g >> (8 * j)) & 0xff) as f32
}

#[inline]
fn sign(signs: u8, j: usize) -> f32 {
    if signs & (1 << j) != 0 {
        -1.0
    } else {
        1.0
    }
}

/// `dequantize_row_iq3_xxs`.
fn dequantize_row_iq3_xxs(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::dequantize_row_iq3_xxs_avx2(src, dst) };
    }
    dequantize_row_iq3_xxs_scalar(src, dst)
}

/// The scalar reference for [`dequantize_row_iq3_xxs`].
fn dequantize_row_iq3_xxs_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIq3Xxs] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = get_f16(b.d);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let qs = &b.qs[8 * ib..8 * ib + 8];
            let aux32 = u32::from_le_bytes(b.qs[64 + 4 * ib..68 + 4 * ib].try_into().unwrap());
            let db = d * (0.5 + (aux32 >> 28) as f32) * 0.5;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS_IQ2XS[((aux32 >> (7 * l)) & 127) as usize];
                let grid1 = IQ3XXS_GRID[qs[2 * l] as usize];
                let grid2 = IQ3XXS_GRID[qs[2 * l + 1] as usize];
                for j in 0..4 {
                    y[j] = db * grid_byte(grid1, j) * sign(signs, j);
                    y[j + 4] = db * grid_byte(grid2, j) * sign(signs, j + 4);
                }
            }
        }
    }
}

/// `dequantize_row_iq3_s`.
fn dequantize_row_iq3_s(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available.
        return unsafe { x86::dequantize_row_iq3_s_avx2(src, dst) };
    }
    dequantize_row_iq3_s_scalar(src, dst)
}

/// The scalar reference for [`dequantize_row_iq3_s`].
fn dequantize_row_iq3_s_scalar(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIq3S] = bytemuck::cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = get_f16(b.d);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let sc = b.scales[ib / 2] >> (4 * (ib % 2)) & 0xf;
            let db = d * (1 + 2 * sc as i32) as f32;
            let qh = b.qh[ib] as usize;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let index = |k: usize| b.qs[8 * ib + k] as usize | ((qh >> k) & 1) << 8;
                let grid1 = IQ3S_GRID[index(2 * l)];
                let grid2 = IQ3S_GRID[index(2 * l + 1)];
                let signs = b.signs[4 * ib + l];
                for j in 0..4 {
                    y[j] = db * grid_byte(grid1, j) * sign(signs, j);
                    y[j + 4] = db * grid_byte(grid2, j) * sign(signs, j + 4);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! AVX2 dequantization (same operations as the scalar code, 8 values at a time: the two
    //! 4-value grid points side by side).
    use super::super::simd::x86::signed_group;
    use super::*;

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_row_iq3_xxs_avx2(src: &[u8], dst: &mut [f32]) {
        let blocks: &[BlockIq3Xxs] = bytemuck::cast_slice(src);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
            let d = get_f16(b.d);
            for (ib, y) in y.chunks_exact_mut(32).enumerate() {
                let qs = &b.qs[8 * ib..8 * ib + 8];
                let aux32 = u32::from_le_bytes(b.qs[64 + 4 * ib..68 + 4 * ib].try_into().unwrap());
                let db = d * (0.5 + (aux32 >> 28) as f32) * 0.5;
                for (l, y) in y.chunks_exact_mut(8).enumerate() {
                    let signs = KSIGNS_IQ2XS[((aux32 >> (7 * l)) & 127) as usize];
                    let grid1 = IQ3XXS_GRID[qs[2 * l] as usize] as u64;
                    let grid2 = IQ3XXS_GRID[qs[2 * l + 1] as usize] as u64;
                    signed_group(y, db, grid1 | grid2 << 32, signs);
                }
            }
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequantize_row_iq3_s_avx2(src: &[u8], dst: &mut [f32]) {
        let blocks: &[BlockIq3S] = bytemuck::cast_slice(src);
        for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
            let d = get_f16(b.d);
            for (ib, y) in y.chunks_exact_mut(32).enumerate() {
                let sc = b.scales[ib / 2] >> (4 * (ib % 2)) & 0xf;
                let db = d * (1 + 2 * sc as i32) as f32;
                let qh = b.qh[ib] as usize;
                for (l, y) in y.chunks_exact_mut(8).enumerate() {
                    let index = |k: usize| b.qs[8 * ib + k] as usize | ((qh >> k) & 1) << 8;
                    let grid1 = IQ3S_GRID[index(2 * l)] as u64;
                    let grid2 = IQ3S_GRID[index(2 * l + 1)] as u64;
                    signed_group(y, db, grid1 | grid2 << 32, b.signs[4 * ib + l]);
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
                "IQ3_XXS",
                98,
                &[0],
                (dequantize_row_iq3_xxs_scalar, |s, d| unsafe {
                    x86::dequantize_row_iq3_xxs_avx2(s, d)
                }),
            ),
            (
                "IQ3_S",
                110,
                &[0],
                (dequantize_row_iq3_s_scalar, |s, d| unsafe {
                    x86::dequantize_row_iq3_s_avx2(s, d)
                }),
            ),
        ];
        assert_dequant_agrees(&mut rng, &cases);
    }

    use super::super::grids3::{KGRID_256, KGRID_512};
    use super::*;

    /// The dequantization grids list the quantization grid's points in the same order.
    #[test]
    fn grids_agree() {
        let xxs_levels = [4u32, 12, 20, 28, 36, 44, 52, 62];
        for (k, g) in KGRID_256.iter().zip(IQ3XXS_GRID) {
            let want = (0..4).fold(0u32, |a, i| a | xxs_levels[(*k as usize >> (3 * i)) & 7] << (8 * i));
            assert_eq!(g, want);
        }
        for (k, g) in KGRID_512.iter().zip(IQ3S_GRID) {
            let want = (0..4).fold(0u32, |a, i| a | (2 * ((*k as u32 >> (3 * i)) & 7) + 1) << (8 * i));
            assert_eq!(g, want);
        }
        assert_eq!(iq3_tables(512).grid[5], [1, 3, 1, 1]); // kgrid_512[5] = 8: levels 0, 1, 0, 0
    }

    #[test]
    fn zero_rows_round_trip() {
        for c in CODECS {
            let bytes = crate::quantize(c.ty, &[0.0; 512], 512, None).unwrap();
            assert!(bytes.iter().all(|&b| b == 0));
            assert_eq!(crate::dequantize(c.ty, &bytes, 512).unwrap(), vec![0.0; 512]);
        }
    }
}
