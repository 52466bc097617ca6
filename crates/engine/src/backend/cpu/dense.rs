//! f32 matrix products for encoders (the backend's exact-activation mode): each 2-D weight is
//! decoded once at load to f32 rows, and a batch of activations is multiplied by it with a blocked,
//! vectorised GEMM over all tokens at once (the `gemm` crate: cache-blocked packing and AVX-512 /
//! AVX2 / NEON micro-kernels chosen at run time, on the backend's rayon pool). The per-row
//! dequantize-and-dot kernels (`quant::dot::kernel_f32`, f64 sums) stay as the reference that the
//! tests compare against.
//!
//! Shapes: weight `[n_out][k]` row-major, activations `x: [t][k]`, output `[t][n_out]`.

use super::pages::WeightBuf;
use gguf::GgmlType;
use rayon::prelude::*;
use std::ops::Range;

/// A weight matrix decoded to f32.
pub struct Dense {
    /// `n_out × k` f32 values (2 MiB-aligned, transparent huge pages where the OS has them).
    data: WeightBuf,
    pub n_out: usize,
    pub k: usize,
}

impl Dense {
    /// Decode `bytes` (rows of `k` values of type `ty`) on the current rayon pool. `None` when
    /// the type has no decoder.
    pub fn decode(ty: GgmlType, bytes: &[u8], k: usize, n_out: usize) -> Option<Dense> {
        let codec = quant::codec(ty)?;
        let row_bytes = ty.row_bytes(k as u64)? as usize;
        if bytes.len() != row_bytes * n_out {
            return None;
        }
        let mut data = WeightBuf::zeroed(n_out * k * 4);
        data.as_mut_slice()
            .par_chunks_mut(k * 4)
            .zip(bytes.par_chunks(row_bytes))
            .for_each(|(dst, src)| {
                let mut row = vec![0f32; k];
                (codec.dequantize)(src, &mut row);
                for (d, v) in dst.chunks_exact_mut(4).zip(&row) {
                    d.copy_from_slice(&v.to_ne_bytes());
                }
            });
        Some(Dense { data, n_out, k })
    }

    pub fn values(&self) -> &[f32] {
        let b = self.data.as_slice();
        // SAFETY: the buffer is 2 MiB-aligned, holds n_out × k f32 values written above, and any
        // bit pattern is a valid f32.
        unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<f32>(), self.n_out * self.k) }
    }

    /// `out[t][n_out] = x[t][k] · Wᵀ`, on the current rayon pool (`threads` workers).
    pub fn matmul(&self, x: &[f32], t: usize, out: &mut [f32], threads: usize) {
        matmul(self.values(), self.n_out, self.k, x, t, out, threads);
    }
}

/// `out[t][n] = x[t][k] · w[n][k]ᵀ` for f32 row-major matrices.
pub fn matmul(w: &[f32], n: usize, k: usize, x: &[f32], t: usize, out: &mut [f32], threads: usize) {
    assert!(
        w.len() >= n * k && x.len() >= t * k && out.len() >= t * n,
        "dense matmul shapes"
    );
    if t == 0 || n == 0 {
        return;
    }
    let parallelism = if threads > 1 && t * n * k >= 1 << 16 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the strides address exactly the checked extents: out t×n (row stride n), x t×k
    // (row stride k), rhs k×n read from w's rows (element (kk, o) at o·k + kk).
    unsafe {
        product(
            t,
            n,
            k,
            out.as_mut_ptr(),
            n,
            x.as_ptr(),
            k,
            w.as_ptr(),
            1,
            k,
            parallelism,
        )
    }
}

/// `dst = lhs · rhs` in f32 (dst overwritten): `dst` m×n and `lhs` m×k with contiguous rows of
/// the given row strides; `rhs` k×n with element (r, c) at `r·rhs_rs + c·rhs_cs`.
///
/// # Safety
/// Every element so addressed must lie inside live allocations, `dst`'s apart from the others'.
#[allow(clippy::too_many_arguments)]
unsafe fn product(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    lhs: *const f32,
    lhs_rs: usize,
    rhs: *const f32,
    rhs_rs: usize,
    rhs_cs: usize,
    parallelism: gemm::Parallelism,
) {
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        dst_rs as isize,
        false,
        lhs,
        1,
        lhs_rs as isize,
        rhs,
        rhs_cs as isize,
        rhs_rs as isize,
        0.0,
        1.0,
        false,
        false,
        false,
        parallelism,
    );
}

/// One `(sequence, head)` task of [`attention`]: scores, softmax and the weighted sum of values,
/// all f32. `q`, `k`, `v` and `out` are `[rows][width]`; the head's columns start at `col`;
/// the last argument keeps the scores and the rows' softmax sums between tasks of one thread.
#[allow(clippy::too_many_arguments)]
unsafe fn attend_head(
    q: *const f32,
    k: *const f32,
    v: *const f32,
    out: *mut f32,
    width: usize,
    rows: Range<usize>,
    col: usize,
    hd: usize,
    scale: f32,
    (scores, inv): &mut (Vec<f32>, Vec<f32>),
) {
    let n = rows.len();
    let base = rows.start * width + col;
    scores.resize(n * n, 0.0);
    // scores[i][j] = q_i · k_j (rhs element (d, j) is k[j][d]).
    product(
        n,
        n,
        hd,
        scores.as_mut_ptr(),
        n,
        q.add(base),
        width,
        k.add(base),
        1,
        width,
        gemm::Parallelism::None,
    );
    // Softmax of scale·scores per row, left unnormalised: the 1/Σ goes onto the head's output
    // row instead (hd values rather than n).
    inv.clear();
    for row in scores.chunks_exact_mut(n) {
        let max = super::simd::scale_max(row, scale);
        inv.push((1.0 / super::simd::softmax_exp(row, max)) as f32);
    }
    // out_i = Σ_j p_ij v_j, then / Σ_j p_ij.
    product(
        n,
        hd,
        n,
        out.add(base),
        width,
        scores.as_ptr(),
        n,
        v.add(base),
        width,
        1,
        gemm::Parallelism::None,
    );
    for (i, &s) in inv.iter().enumerate() {
        let row = std::slice::from_raw_parts_mut(out.add(base + i * width), hd);
        for x in row {
            *x *= s;
        }
    }
}

/// Bidirectional (encoder) attention over f32 Q/K/V rows of a whole batch at once: every
/// sequence (a range of rows) attends to all of its own rows, head by head (`n_head` heads of
/// `hd` columns; `width = n_head·hd`). The `(sequence, head)` pairs run in parallel on the current
/// rayon pool, longest sequences first. Softmax as ggml's (max subtracted, vector exp).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    seqs: &[Range<usize>],
    n_head: usize,
    hd: usize,
    scale: f32,
    out: &mut [f32],
) {
    let width = n_head * hd;
    let rows = seqs.iter().map(|r| r.end).max().unwrap_or(0);
    assert!(q.len() >= rows * width && k.len() >= rows * width && v.len() >= rows * width && out.len() >= rows * width);
    let mut tasks: Vec<(usize, usize)> = (0..seqs.len()).flat_map(|s| (0..n_head).map(move |h| (s, h))).collect();
    tasks.sort_by_key(|&(s, _)| std::cmp::Reverse(seqs[s].len()));
    struct Ptrs(*const f32, *const f32, *const f32, *mut f32);
    // SAFETY: the tasks write disjoint (rows, head columns) blocks of `out` and only read q/k/v.
    unsafe impl Sync for Ptrs {}
    let p = Ptrs(q.as_ptr(), k.as_ptr(), v.as_ptr(), out.as_mut_ptr());
    tasks
        .par_iter()
        .with_max_len(1)
        .for_each_init(<(Vec<f32>, Vec<f32>)>::default, |scratch, &(s, h)| {
            let p = &p;
            // SAFETY: every block addressed lies inside the checked extents (rows × width).
            unsafe { attend_head(p.0, p.1, p.2, p.3, width, seqs[s].clone(), h * hd, hd, scale, scratch) }
        });
}

/// GELU, the exact form `x/2 · (1 + erf(x/√2))` (transformers' "gelu"), in place, on the current
/// rayon pool, with the erf of [`erf_block`].
pub fn gelu(x: &mut [f32]) {
    x.par_chunks_mut(1024).for_each_init(
        || (vec![0f32; 1024], vec![0f32; 1024]),
        |(orig, tmp), c| {
            let orig = &mut orig[..c.len()];
            orig.copy_from_slice(c);
            for v in c.iter_mut() {
                *v *= std::f32::consts::FRAC_1_SQRT_2;
            }
            erf_block(c, tmp);
            for (v, &x) in c.iter_mut().zip(orig.iter()) {
                *v = 0.5 * x * (1.0 + *v);
            }
        },
    );
}

/// erf(a)/a = 2/√π Σ (−1)ⁿ a²ⁿ / (n!(2n+1)): the Taylor coefficients, used for |a| < 1.
const ERF_SMALL: [f32; 12] = [
    std::f32::consts::FRAC_2_SQRT_PI,
    -0.376_126_38,
    0.112_837_92,
    -0.026_866_172,
    0.005_223_978,
    -0.000_854_832_7,
    0.000_120_553_33,
    -1.492_565e-5,
    1.646_211_4e-6,
    -1.636_584_4e-7,
    1.480_719_3e-8,
    -1.229_055_5e-9,
];
/// erfc(a)·exp(a²) on 1 ≤ a ≤ 4 as a polynomial in u = (a − 2.5)/1.5: a degree-13 Chebyshev
/// least-squares fit (numpy, 20,001 points) in the power basis. Past 4, erf is 1 in f32.
const ERFC_SCALED: [f32; 14] = [
    0.210_806_37,
    -0.111_521_02,
    0.056_110_48,
    -0.027_005_281,
    0.012_489_633,
    -0.005_570_885,
    0.002_402_032,
    -0.001_004_953,
    0.000_413_815_96,
    -0.000_164_202,
    5.560_991e-5,
    -2.074_252e-5,
    1.358_284e-5,
    -4.975_418_5e-6,
];

/// `x[i] = erf(x[i])` for a block (at most `tmp.len()` values), keeping a copy of the inputs in
/// `tmp`. No branches or calls per value (the exp is ggml's vector exp, `simd::softmax_exp`), so
/// the loops vectorise. Largest error against the exact erf below 1.6e-7 (tests).
pub fn erf_block(x: &mut [f32], tmp: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present (checked at run time); it implies FMA's instructions.
        return unsafe { erf_block_avx512(x, tmp) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA are present (checked at run time).
        return unsafe { erf_block_fma(x, tmp) };
    }
    erf_block_any(x, tmp)
}

/// [`erf_block`] compiled for AVX2 + FMA, so that `mul_add` is one instruction and the loop
/// vectorises (in the baseline build it is a call per value).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn erf_block_fma(x: &mut [f32], tmp: &mut [f32]) {
    erf_block_any(x, tmp)
}

/// [`erf_block`] in 16 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn erf_block_avx512(x: &mut [f32], tmp: &mut [f32]) {
    erf_block_any(x, tmp)
}

#[inline(always)]
fn erf_block_any(x: &mut [f32], tmp: &mut [f32]) {
    let copy = &mut tmp[..x.len()];
    copy.copy_from_slice(x);
    // exp(−a²) for the large branch, in x's place for now.
    for v in x.iter_mut() {
        let a = v.abs().min(4.0);
        *v = -(a * a);
    }
    super::simd::softmax_exp(x, 0.0);
    for (e, &z) in x.iter_mut().zip(copy.iter()) {
        let a = z.abs().min(4.0);
        let t = a * a;
        let mut p = ERF_SMALL[11];
        for &c in ERF_SMALL[..11].iter().rev() {
            p = p.mul_add(t, c);
        }
        let u = (a - 2.5) / 1.5;
        let mut q = ERFC_SCALED[13];
        for &c in ERFC_SCALED[..13].iter().rev() {
            q = q.mul_add(u, c);
        }
        let y = if a < 1.0 { a * p } else { 1.0 - *e * q };
        *e = y.copysign(z);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GEMM against the f64-summed reference product, on MiniLM's shapes and odd ones. f32
    /// accumulation over k terms differs from the f64 sum by about √k·ε relative to Σ|x·w|; 1e-5
    /// of that sum is ~40× the expected error at k = 1536 and far below any real bug.
    #[test]
    fn gemm_matches_the_f64_reference() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut seed = 0x1234_5678u64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 11) as f64 / (1u64 << 53) as f64) as f32 * 2.0 - 1.0
        };
        for &(t, n, k) in &[
            (1, 384, 384),
            (37, 1536, 384),
            (130, 384, 1536),
            (3, 7, 5),
            (64, 1152, 384),
        ] {
            let w: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
            let x: Vec<f32> = (0..t * k).map(|_| rnd()).collect();
            let mut out = vec![0f32; t * n];
            pool.install(|| matmul(&w, n, k, &x, t, &mut out, 2));
            for i in 0..t {
                for o in 0..n {
                    let (mut s, mut mag) = (0f64, 0f64);
                    for kk in 0..k {
                        let p = x[i * k + kk] as f64 * w[o * k + kk] as f64;
                        s += p;
                        mag += p.abs();
                    }
                    let got = out[i * n + o] as f64;
                    assert!((got - s).abs() <= 1e-5 * mag, "({t},{n},{k}) [{i}][{o}]: {got} vs {s}");
                }
            }
        }
    }

    /// erf against libm's over a dense grid: the approximation's error (1.5e-7 in the fit) plus
    /// f32 rounding stays below 2.5e-7.
    #[test]
    fn erf_matches_libm() {
        let xs: Vec<f32> = (-60_000..=60_000)
            .map(|i| i as f32 * 1e-4)
            .chain([1e-30, -0.0, 9.0, -20.0])
            .collect();
        let mut worst = 0f64;
        for c in xs.chunks(1000) {
            let mut y = c.to_vec();
            let mut tmp = vec![0f32; 1000];
            erf_block(&mut y, &mut tmp);
            for (&x, &e) in c.iter().zip(&y) {
                let want = libm::erf(x as f64);
                worst = worst.max((e as f64 - want).abs());
            }
        }
        assert!(worst < 2.5e-7, "largest error {worst}");
    }

    /// Attention of the whole batch against a scalar f64 softmax attention, per sequence and
    /// head. Tolerance 1e-5: f32 products and the vector exp (~2 ulp) against f64.
    #[test]
    fn batch_attention_matches_the_scalar_reference() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let (n_head, hd) = (3, 8);
        let w = n_head * hd;
        let seqs = [0..5, 5..6, 6..76, 76..83];
        let rows = 83;
        let f = |i: usize, s: f32| (i as f32 * s).sin() * 2.0;
        let q: Vec<f32> = (0..rows * w).map(|i| f(i, 0.37)).collect();
        let k: Vec<f32> = (0..rows * w).map(|i| f(i, 0.71)).collect();
        let v: Vec<f32> = (0..rows * w).map(|i| f(i, 1.13)).collect();
        let mut out = vec![0f32; rows * w];
        let scale = 1.0 / (hd as f32).sqrt();
        pool.install(|| attention(&q, &k, &v, &seqs, n_head, hd, scale, &mut out));
        for s in &seqs {
            for h in 0..n_head {
                for i in s.clone() {
                    let sc: Vec<f64> = s
                        .clone()
                        .map(|j| {
                            (0..hd)
                                .map(|d| q[i * w + h * hd + d] as f64 * k[j * w + h * hd + d] as f64)
                                .sum::<f64>()
                                * scale as f64
                        })
                        .collect();
                    let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for d in 0..hd {
                        let want: f64 = s
                            .clone()
                            .zip(&e)
                            .map(|(j, p)| p / z * v[j * w + h * hd + d] as f64)
                            .sum();
                        let got = out[i * w + h * hd + d] as f64;
                        assert!(
                            (got - want).abs() < 1e-5,
                            "seq {s:?} head {h} row {i} col {d}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn decode_gives_the_codec_rows() {
        let (k, n) = (64, 3);
        let vals: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.37).sin()).collect();
        let bytes: Vec<u8> = vals
            .iter()
            .flat_map(|&v| quant::fp::f32_to_f16(v).to_le_bytes())
            .collect();
        let d = Dense::decode(GgmlType::F16, &bytes, k, n).unwrap();
        for (a, b) in d.values().iter().zip(&vals) {
            assert_eq!(*a, quant::fp::f16_to_f32(quant::fp::f32_to_f16(*b)));
        }
    }
}
