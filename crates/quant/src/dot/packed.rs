//! Q4_K weights repacked eight rows at a time, the way llama.cpp's CPU backend multiplies them on
//! AVX2 machines (`ggml-cpu/repack.cpp`, `block_q4_Kx8`): with eight rows side by side in every
//! vector, each row's integer sums come out of one vector lane and no horizontal reduction is
//! needed. The layout here is hf2q's own (rows interleaved every four bytes, for `vpdpbusd` with a
//! broadcast activation word); the f32 operations follow llama.cpp's x86 kernels exactly
//! (`arch/x86/repack.cpp`), so the results are its results:
//!
//! * a full group of four activation rows (its GEMM, `ggml_gemm_q4_K_8x8_q8_K`): for every 64
//!   values, the exact integer sum `S` (scales applied) and min term `M`, then
//!   `acc = fma(S, d·dy, acc)` and `accm = fma(M, dmin·dy, accm)`;
//! * fewer activation rows (its GEMV, `ggml_gemv_q4_K_8x8_q8_K`): the same per 256-value block;
//! * the result `acc - accm`.
//!
//! llama.cpp repacks a Q4_K matrix when its row count is a multiple of 8 and it is only used by
//! matrix products; [`Packing`] is what a backend needs to do the same.

use crate::fp::f16_to_f32;
use crate::GgmlType;

/// Weight rows per packed group.
pub const PACK_ROWS: usize = 8;

/// One 256-value block of eight Q4_K rows.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct BlockQ4Kx8 {
    /// Each row's `d` and `dmin` (f16 bits).
    d: [u16; 8],
    dmin: [u16; 8],
    /// `scales[s][r]`: the 6-bit scale of sub-block `s` (32 values) of row `r`.
    scales: [[u8; 8]; 8],
    /// `mins[j][r]`: the 6-bit mins of sub-blocks `2j` and `2j + 1` of row `r` (a pair for `madd`).
    mins: [[[u8; 2]; 8]; 4],
    /// `qs[j][g][r]`: bytes `32j + 4g .. 32j + 4g + 4` of row `r`'s quants: low nibbles are values
    /// `4g..4g+4` of sub-block `2j`, high nibbles the same values of sub-block `2j + 1`.
    qs: [[[[u8; 4]; 8]; 8]; 4],
}
const _: () = assert!(std::mem::size_of::<BlockQ4Kx8>() == 1184);

/// Bytes of a Q4_K block of one row.
const Q4K: usize = 144;
/// Q8_K activation block: d (f32) at 0, 256 quants at 4, 16 i16 sums at 260.
const Q8K: usize = 292;

/// Packing of one weight type: how many bytes a group of [`PACK_ROWS`] rows takes, how to fill
/// it, and the kernel that multiplies it.
#[derive(Clone, Copy)]
pub struct Packing {
    pub weight: GgmlType,
    /// Bytes of one packed group of rows of `n` values.
    pub group_bytes: fn(n: usize) -> usize,
    /// `pack(n, rows, dst)`: `rows` holds [`PACK_ROWS`] consecutive rows in ggml's layout.
    pub pack: fn(n: usize, rows: &[u8], dst: &mut [u8]),
    pub dot: PackedFn,
}

/// `out[c][r] = dot(row r of the group, acts[c])` for `c < acts.len() <= 4`; four activation rows
/// sum in llama.cpp's GEMM order, fewer in its GEMV order (see the module notes).
pub type PackedFn = fn(n: usize, group: &[u8], acts: &[&[u8]], out: &mut [[f32; PACK_ROWS]]);

/// The packing for weights of type `w` on `path`, where llama.cpp repacks that type there.
pub fn packing(w: GgmlType, path: super::KernelPath) -> Option<Packing> {
    if w != GgmlType::Q4_K || path != super::KernelPath::Avx2 {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let dot: PackedFn = if super::avx2::vnni() {
            |n, g, a, o| unsafe { x86::q4k_x8_vnni(n, g, a, o) }
        } else {
            |n, g, a, o| unsafe { x86::q4k_x8_avx2(n, g, a, o) }
        };
        Some(Packing {
            weight: w,
            group_bytes: q4k_group_bytes,
            pack: pack_q4k,
            dot,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

fn q4k_group_bytes(n: usize) -> usize {
    n / 256 * std::mem::size_of::<BlockQ4Kx8>()
}

/// Eight Q4_K rows of `n` values into `n / 256` [`BlockQ4Kx8`] blocks.
pub fn pack_q4k(n: usize, rows: &[u8], dst: &mut [u8]) {
    let nb = n / 256;
    assert!(rows.len() >= PACK_ROWS * nb * Q4K && dst.len() >= q4k_group_bytes(n));
    let blocks: &mut [BlockQ4Kx8] = bytemuck::cast_slice_mut(&mut dst[..q4k_group_bytes(n)]);
    for (b, out) in blocks.iter_mut().enumerate() {
        for r in 0..PACK_ROWS {
            let x = &rows[(r * nb + b) * Q4K..(r * nb + b + 1) * Q4K];
            out.d[r] = u16::from_le_bytes([x[0], x[1]]);
            out.dmin[r] = u16::from_le_bytes([x[2], x[3]]);
            let sm: &[u8; 12] = x[4..16].try_into().unwrap();
            for s in 0..8 {
                let (sc, m) = crate::k_quants::helpers::get_scale_min_k4(s, sm);
                out.scales[s][r] = sc;
                out.mins[s / 2][r][s % 2] = m;
            }
            for j in 0..4 {
                for g in 0..8 {
                    out.qs[j][g][r].copy_from_slice(&x[16 + 32 * j + 4 * g..16 + 32 * j + 4 * g + 4]);
                }
            }
        }
    }
}

/// The scalar reference of the packed kernels: the same integers and the same f32 operations in
/// the same order, one (row, column) at a time.
#[allow(clippy::needless_range_loop)] // rows index several per-row arrays of a block
pub fn q4k_x8_reference(n: usize, group: &[u8], acts: &[&[u8]], out: &mut [[f32; PACK_ROWS]]) {
    let blocks: &[BlockQ4Kx8] = bytemuck::cast_slice(&group[..q4k_group_bytes(n)]);
    let gemm = acts.len() == 4;
    for (c, a) in acts.iter().enumerate() {
        for r in 0..PACK_ROWS {
            let (mut acc, mut accm) = (0f32, 0f32);
            for (blk, y) in blocks.iter().zip(a.chunks_exact(Q8K)) {
                let dy = f32::from_le_bytes(y[0..4].try_into().unwrap());
                let (dd, ddm) = (f16_to_f32(blk.d[r]) * dy, f16_to_f32(blk.dmin[r]) * dy);
                let q8 = |i: usize| y[4 + i] as i8 as i32;
                let pair = |s: usize| {
                    let bs = |k: usize| i16::from_le_bytes([y[260 + 2 * k], y[261 + 2 * k]]) as i32;
                    bs(2 * s) + bs(2 * s + 1)
                };
                let (mut sb, mut mb) = (0i32, 0i32);
                for j in 0..4 {
                    let (mut lo, mut hi) = (0i32, 0i32);
                    for g in 0..8 {
                        for (i, &q) in blk.qs[j][g][r].iter().enumerate() {
                            lo += (q & 0xF) as i32 * q8(64 * j + 4 * g + i);
                            hi += (q >> 4) as i32 * q8(64 * j + 32 + 4 * g + i);
                        }
                    }
                    let s = blk.scales[2 * j][r] as i32 * lo + blk.scales[2 * j + 1][r] as i32 * hi;
                    let [m0, m1] = blk.mins[j][r];
                    let m = m0 as i32 * pair(2 * j) + m1 as i32 * pair(2 * j + 1);
                    if gemm {
                        acc = (s as f32).mul_add(dd, acc);
                        accm = (m as f32).mul_add(ddm, accm);
                    } else {
                        (sb, mb) = (sb + s, mb + m);
                    }
                }
                if !gemm {
                    acc = (sb as f32).mul_add(dd, acc);
                    accm = (mb as f32).mul_add(ddm, accm);
                }
            }
            out[c][r] = acc - accm;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // columns index several per-column arrays
pub(crate) mod x86 {
    use super::{q4k_group_bytes, PACK_ROWS, Q8K};
    use std::arch::x86_64::*;

    /// How a kernel multiplies 32 unsigned weight bytes by 32 signed activation bytes and sums
    /// them in eight i32 lanes (four products each), accumulating over a 64-value chunk.
    trait Dp {
        /// The high nibbles of `bits` as the kernel multiplies them.
        unsafe fn high(bits: __m256i) -> __m256i;
        unsafe fn step(acc: __m256i, w: __m256i, y: __m256i) -> __m256i;
        /// The accumulated sum of low-nibble products as i32 lanes.
        unsafe fn low_sum(acc: __m256i) -> __m256i;
        /// The same for the high nibbles.
        unsafe fn high_sum(acc: __m256i) -> __m256i;
    }

    /// `vpdpbusd` (AVX-512 VNNI on ymm). High nibbles are used in place (16 × q): no shift per
    /// weight vector, one exact arithmetic shift of each sum instead.
    struct Vnni;
    impl Dp for Vnni {
        #[inline(always)]
        unsafe fn high(bits: __m256i) -> __m256i {
            _mm256_and_si256(bits, _mm256_set1_epi8(0xF0u8 as i8))
        }
        #[inline(always)]
        unsafe fn step(acc: __m256i, w: __m256i, y: __m256i) -> __m256i {
            _mm256_dpbusd_epi32(acc, w, y)
        }
        #[inline(always)]
        unsafe fn low_sum(acc: __m256i) -> __m256i {
            acc
        }
        #[inline(always)]
        unsafe fn high_sum(acc: __m256i) -> __m256i {
            _mm256_srai_epi32(acc, 4)
        }
    }

    /// AVX2: `vpmaddubsw` pairs added in i16 (at most 8 × 2 × 15 × 128 = 30720 per lane over a
    /// chunk, no saturation), widened with one `vpmaddwd` per chunk.
    struct Avx2;
    impl Dp for Avx2 {
        #[inline(always)]
        unsafe fn high(bits: __m256i) -> __m256i {
            _mm256_and_si256(_mm256_srli_epi16(bits, 4), _mm256_set1_epi8(0xF))
        }
        #[inline(always)]
        unsafe fn step(acc: __m256i, w: __m256i, y: __m256i) -> __m256i {
            _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, y))
        }
        #[inline(always)]
        unsafe fn low_sum(acc: __m256i) -> __m256i {
            _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
        }
        #[inline(always)]
        unsafe fn high_sum(acc: __m256i) -> __m256i {
            _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
        }
    }

    // Offsets in BlockQ4Kx8.
    const D: usize = 0;
    const DMIN: usize = 16;
    const SCALES: usize = 32;
    const MINS: usize = 96;
    const QS: usize = 160;
    const BLOCK: usize = 1184;

    #[inline(always)]
    unsafe fn body<P: Dp, const C: usize>(n: usize, group: &[u8], acts: &[&[u8]], out: &mut [[f32; PACK_ROWS]]) {
        let nb = n / 256;
        assert!(group.len() >= q4k_group_bytes(n) && acts.len() == C && out.len() >= C);
        for a in acts {
            assert!(a.len() >= nb * Q8K);
        }
        let gemm = C == 4;
        let m4 = _mm256_set1_epi8(0xF);
        let mut acc = [_mm256_setzero_ps(); C];
        let mut accm = [_mm256_setzero_ps(); C];
        for b in 0..nb {
            let x = group.as_ptr().add(b * BLOCK);
            if C == 1 {
                // One token streams the weights from memory (see avx2::PF).
                crate::dot::avx2::prefetch_lines(x.wrapping_add(crate::dot::avx2::PF), BLOCK);
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(x.add(D) as *const __m128i));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(x.add(DMIN) as *const __m128i));
            let mut y = [std::ptr::null::<u8>(); C];
            let mut dd = [_mm256_setzero_ps(); C];
            let mut ddm = [_mm256_setzero_ps(); C];
            // Per column, dword j: the activation sums of sub-blocks 2j and 2j+1 (i16 each).
            let mut pairs = [[0i32; 4]; C];
            for c in 0..C {
                y[c] = acts[c].as_ptr().add(b * Q8K);
                let dy = _mm256_set1_ps(std::ptr::read_unaligned(y[c] as *const f32));
                dd[c] = _mm256_mul_ps(d, dy);
                ddm[c] = _mm256_mul_ps(dmin, dy);
                let bs = _mm256_loadu_si256(y[c].add(260) as *const __m256i);
                let p = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
                _mm_storeu_si128(pairs[c].as_mut_ptr() as *mut __m128i, p);
            }
            let mut sblk = [_mm256_setzero_si256(); C];
            let mut mblk = [_mm256_setzero_si256(); C];
            for j in 0..4 {
                let mut lo = [_mm256_setzero_si256(); C];
                let mut hi = [_mm256_setzero_si256(); C];
                for g in 0..8 {
                    let bits = _mm256_loadu_si256(x.add(QS + 256 * j + 32 * g) as *const __m256i);
                    let wl = _mm256_and_si256(bits, m4);
                    let wh = P::high(bits);
                    for c in 0..C {
                        let yq = y[c].add(4 + 64 * j + 4 * g);
                        let yl = _mm256_set1_epi32(std::ptr::read_unaligned(yq as *const i32));
                        let yh = _mm256_set1_epi32(std::ptr::read_unaligned(yq.add(32) as *const i32));
                        lo[c] = P::step(lo[c], wl, yl);
                        hi[c] = P::step(hi[c], wh, yh);
                    }
                }
                let sl = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.add(SCALES + 16 * j) as *const __m128i));
                let sh = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.add(SCALES + 16 * j + 8) as *const __m128i));
                let mins = _mm256_cvtepu8_epi16(_mm_loadu_si128(x.add(MINS + 16 * j) as *const __m128i));
                for c in 0..C {
                    let s = _mm256_add_epi32(
                        _mm256_mullo_epi32(P::low_sum(lo[c]), sl),
                        _mm256_mullo_epi32(P::high_sum(hi[c]), sh),
                    );
                    let m = _mm256_madd_epi16(mins, _mm256_set1_epi32(pairs[c][j]));
                    if gemm {
                        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd[c], acc[c]);
                        accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), ddm[c], accm[c]);
                    } else {
                        sblk[c] = _mm256_add_epi32(sblk[c], s);
                        mblk[c] = _mm256_add_epi32(mblk[c], m);
                    }
                }
            }
            if !gemm {
                for c in 0..C {
                    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sblk[c]), dd[c], acc[c]);
                    accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mblk[c]), ddm[c], accm[c]);
                }
            }
        }
        for c in 0..C {
            _mm256_storeu_ps(out[c].as_mut_ptr(), _mm256_sub_ps(acc[c], accm[c]));
        }
    }

    macro_rules! dispatch {
        ($p:ty, $n:expr, $g:expr, $acts:expr, $out:expr) => {
            match $acts.len() {
                1 => body::<$p, 1>($n, $g, $acts, $out),
                2 => body::<$p, 2>($n, $g, $acts, $out),
                3 => body::<$p, 3>($n, $g, $acts, $out),
                4 => body::<$p, 4>($n, $g, $acts, $out),
                k => panic!("packed Q4_K kernel: {k} activation rows (1 to 4 supported)"),
            }
        };
    }

    /// SAFETY: AVX2, FMA and F16C present (lengths are checked).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn q4k_x8_avx2(n: usize, g: &[u8], acts: &[&[u8]], out: &mut [[f32; PACK_ROWS]]) {
        dispatch!(Avx2, n, g, acts, out)
    }

    /// SAFETY: as [`q4k_x8_avx2`], plus AVX-512 VNNI and VL.
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    pub(crate) unsafe fn q4k_x8_vnni(n: usize, g: &[u8], acts: &[&[u8]], out: &mut [[f32; PACK_ROWS]]) {
        dispatch!(Vnni, n, g, acts, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "x86_64")]
    use crate::dot::KernelPath;
    use crate::dot::{act_row_bytes, quantize_act};

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *seed >> 33
    }

    /// What llama.cpp's x86 q4_K_8x8 kernels compute for one weight row (ggml layout) and one
    /// activation row, written from the ggml block layout: (d·dy, dmin·dy) per block and the exact
    /// integer sums S_j, M_j per 64-value chunk j, then the FMA chains of its GEMM (`gemm`) or GEMV.
    fn llama_cpp_order(w: &[u8], a: &[u8], gemm: bool) -> f32 {
        let f16 = |b: &[u8], at: usize| f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]));
        let (mut acc, mut accm) = (0f32, 0f32);
        for (x, y) in w.chunks_exact(Q4K).zip(a.chunks_exact(Q8K)) {
            let sm: &[u8; 12] = x[4..16].try_into().unwrap();
            let dy = f32::from_le_bytes(y[0..4].try_into().unwrap());
            let yq = |i: usize| y[4 + i] as i8 as i32;
            let bs = |k: usize| i16::from_le_bytes([y[260 + 2 * k], y[261 + 2 * k]]) as i32;
            let (dd, ddm) = (f16(x, 0) * dy, f16(x, 2) * dy);
            let (mut sb, mut mb) = (0i32, 0i32);
            for j in 0..4 {
                let (sl, ml) = crate::k_quants::helpers::get_scale_min_k4(2 * j, sm);
                let (sh, mh) = crate::k_quants::helpers::get_scale_min_k4(2 * j + 1, sm);
                let (mut lo, mut hi) = (0, 0);
                for i in 0..32 {
                    let b = x[16 + 32 * j + i];
                    lo += (b & 0xF) as i32 * yq(64 * j + i);
                    hi += (b >> 4) as i32 * yq(64 * j + 32 + i);
                }
                let s = sl as i32 * lo + sh as i32 * hi;
                let m = ml as i32 * (bs(4 * j) + bs(4 * j + 1)) + mh as i32 * (bs(4 * j + 2) + bs(4 * j + 3));
                if gemm {
                    acc = dd.mul_add(s as f32, acc);
                    accm = ddm.mul_add(m as f32, accm);
                } else {
                    (sb, mb) = (sb + s, mb + m);
                }
            }
            if !gemm {
                acc = dd.mul_add(sb as f32, acc);
                accm = ddm.mul_add(mb as f32, accm);
            }
        }
        acc - accm
    }

    /// Eight rows of raw Q4_K blocks: every nibble, scale and min pattern is a valid block (the
    /// scales are random bytes, so 6-bit values up to 63), with small finite f16 d and dmin; rows
    /// 6 and 7 are all-15 nibbles with scales and mins of 63 (the largest integer sums).
    fn weights(n: usize, seed: &mut u64) -> Vec<u8> {
        let nb = n / 256;
        let mut w = vec![0u8; PACK_ROWS * nb * Q4K];
        for (i, blk) in w.chunks_exact_mut(Q4K).enumerate() {
            let extreme = i / nb >= 6;
            let d = crate::fp::f32_to_f16((lcg(seed) % 1000) as f32 * 1e-5 + 1e-6);
            let dmin = crate::fp::f32_to_f16((lcg(seed) % 1000) as f32 * 1e-5);
            blk[0..2].copy_from_slice(&d.to_le_bytes());
            blk[2..4].copy_from_slice(&dmin.to_le_bytes());
            for b in &mut blk[4..] {
                *b = if extreme { 0xFF } else { lcg(seed) as u8 };
            }
        }
        w
    }

    /// Activation rows: three from `quantize_act` of random values, one raw Q8_K row of -128s
    /// (the most negative products) with consistent sums.
    fn activations(n: usize, seed: &mut u64) -> Vec<Vec<u8>> {
        let mut rows: Vec<Vec<u8>> = (0..3)
            .map(|_| {
                let x: Vec<f32> = (0..n).map(|_| (lcg(seed) % 2001) as f32 / 1000.0 - 1.0).collect();
                let mut a = vec![0u8; act_row_bytes(GgmlType::Q8_K, n)];
                quantize_act(GgmlType::Q8_K, &x, &mut a);
                a
            })
            .collect();
        let mut raw = vec![0u8; act_row_bytes(GgmlType::Q8_K, n)];
        for y in raw.chunks_exact_mut(Q8K) {
            y[0..4].copy_from_slice(&0.01f32.to_le_bytes());
            y[4..260].fill(0x80);
            for k in 0..16 {
                y[260 + 2 * k..262 + 2 * k].copy_from_slice(&(-128i16 * 16).to_le_bytes());
            }
        }
        rows.insert(1, raw);
        rows
    }

    #[allow(clippy::type_complexity)]
    fn kernels() -> Vec<(&'static str, PackedFn)> {
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut k: Vec<(&'static str, PackedFn)> = vec![("reference", q4k_x8_reference)];
        #[cfg(target_arch = "x86_64")]
        if KernelPath::detect() == KernelPath::Avx2 {
            k.push(("avx2", |n, g, a, o| unsafe { x86::q4k_x8_avx2(n, g, a, o) }));
            if crate::dot::avx2::vnni() {
                k.push(("vnni", |n, g, a, o| unsafe { x86::q4k_x8_vnni(n, g, a, o) }));
            }
        }
        k
    }

    /// Every packed kernel gives, for every row and 1-4 activation rows, exactly the numbers of
    /// llama.cpp's repacked Q4_K GEMM (four rows) and GEMV (fewer).
    #[test]
    fn packed_q4_k_follows_llama_cpp_repacked_order() {
        let n = 1024;
        let nb = n / 256;
        let mut seed = 5u64;
        let w = weights(n, &mut seed);
        let acts = activations(n, &mut seed);
        let mut packed = vec![0u8; q4k_group_bytes(n)];
        pack_q4k(n, &w, &mut packed);
        for (name, dot) in kernels() {
            for cols in 1..=4 {
                let a: Vec<&[u8]> = acts[..cols].iter().map(|v| v.as_slice()).collect();
                let mut out = vec![[0f32; PACK_ROWS]; cols];
                dot(n, &packed, &a, &mut out);
                for c in 0..cols {
                    for r in 0..PACK_ROWS {
                        let want = llama_cpp_order(&w[r * nb * Q4K..(r + 1) * nb * Q4K], a[c], cols == 4);
                        assert_eq!(
                            out[c][r].to_bits(),
                            want.to_bits(),
                            "{name}: {cols} columns, column {c}, row {r}"
                        );
                    }
                }
            }
        }
    }

    /// The two orders differ for these inputs, so the test above can tell them apart.
    #[test]
    fn gemm_and_gemv_orders_differ() {
        let n = 1024;
        let mut seed = 5u64;
        let w = weights(n, &mut seed);
        let acts = activations(n, &mut seed);
        let differ = (0..6).any(|r| {
            let row = &w[r * 4 * Q4K..(r + 1) * 4 * Q4K];
            llama_cpp_order(row, &acts[0], true) != llama_cpp_order(row, &acts[0], false)
        });
        assert!(differ);
    }
}
