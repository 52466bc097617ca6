//! Vector helpers of the CPU backend: an AVX2/FMA/F16C version chosen at run time (the binary
//! itself targets baseline x86-64) and a scalar reference beside each, with identical rounding
//! where ggml's result depends on it (f16 accumulators).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use quant::dot::avx2::hsum_f32_8 as hsum;
use quant::fp::{f16_to_f32, f32_to_f16};

/// Whether the AVX2 helpers may run (checked once).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            std::env::var_os("HF2Q_NOSIMD").is_none()
                && quant::dot::KernelPath::detect() == quant::dot::KernelPath::Avx2
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Dot product of two f16 rows (bytes), in ggml's summation order (`quant::dot`).
pub fn dot_f16(a: &[u8], b: &[u8]) -> f32 {
    let n = a.len().min(b.len()) / 2;
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2/FMA/F16C present; both hold n f16 values.
        return unsafe { quant::dot::avx2::f16_dot_one(n, a.as_ptr(), b.as_ptr()) };
    }
    let mut s = 0f64;
    for (x, y) in a.chunks_exact(2).zip(b.chunks_exact(2)).take(n) {
        s += (f16_to_f32(u16::from_le_bytes([x[0], x[1]])) * f16_to_f32(u16::from_le_bytes([y[0], y[1]]))) as f64;
    }
    s as f32
}

/// `acc += x * s`.
pub fn axpy(acc: &mut [f32], x: &[f32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2+FMA present.
        return unsafe { axpy_avx2(acc, x, s) };
    }
    for (a, &v) in acc.iter_mut().zip(x) {
        *a = v.mul_add(s, *a);
    }
}

/// `x *= s`.
pub fn scale(x: &mut [f32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 present.
        return unsafe { scale_avx2(x, s) };
    }
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// Dot product of two f32 rows (the shorter's length): four 8-lane partial sums, then their
/// horizontal sum (ggml_vec_dot_f32's shape, not its exact order), the tail in order.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2+FMA present.
        return unsafe { dot_avx2(a, b) };
    }
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// f16 bytes → f32.
pub fn f16_to_f32s(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: F16C present; src holds 2 * dst.len() bytes (checked inside).
        return unsafe { quant::dot::avx2::f16_to_f32_row(src, dst) };
    }
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// f16 accumulator update `acc = f16(fma(v, s, acc))` per element (ggml_vec_mad_f16).
pub fn mad_f16(acc: &mut [u16], v: &[u8], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2/FMA/F16C present.
        return unsafe { mad_f16_avx2(acc, v, s) };
    }
    for (a, b) in acc.iter_mut().zip(v.chunks_exact(2)) {
        let vv = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        *a = f32_to_f16(vv.mul_add(s, f16_to_f32(*a)));
    }
}

/// `acc = f16(acc * s)` per element (ggml_vec_scale_f16).
pub fn scale_f16(acc: &mut [u16], s: f32) {
    for a in acc.iter_mut() {
        *a = f32_to_f16(f16_to_f32(*a) * s);
    }
}

/// `x[i] = exp(x[i] - max)` for every element, returning the sum (f64), with the vector exp of
/// ggml's softmax (`ggml_vec_soft_max_f32`: 16 lanes at a time, the tail with `expf`).
pub fn softmax_exp(x: &mut [f32], max: f32) -> f64 {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut i = 0;
    let mut sum = 0f64;
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        while i + 16 <= x.len() {
            // SAFETY: AVX2+FMA present; 16 values from i.
            let s = unsafe { exp_block16(&mut x[i..i + 16], max) };
            sum += s as f64;
            i += 16;
        }
    }
    for v in &mut x[i..] {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    sum
}

/// `x[i] = x[i]·scale + 0.0` (a multiply and an add, as ggml's mask step), returning the
/// largest value (−∞ for an empty row).
pub fn scale_max(x: &mut [f32], scale: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 present.
        return unsafe { scale_max_avx2(x, scale) };
    }
    scale_max_tail(x, scale, f32::NEG_INFINITY)
}

fn scale_max_tail(x: &mut [f32], scale: f32, mut mx: f32) -> f32 {
    for v in x {
        *v = *v * scale + 0.0;
        mx = mx.max(*v);
    }
    mx
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scale_max_avx2(x: &mut [f32], scale: f32) -> f32 {
    let (sv, zero) = (_mm256_set1_ps(scale), _mm256_setzero_ps());
    let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i + 8 <= x.len() {
        let p = x.as_mut_ptr().add(i);
        let v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(p), sv), zero);
        _mm256_storeu_ps(p, v);
        m = _mm256_max_ps(m, v);
        i += 8;
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), m);
    let mx = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    scale_max_tail(&mut x[i..], scale, mx)
}

/// While alive, this thread's float operations treat subnormal inputs and results as zero
/// (x86 MXCSR flush-to-zero and denormals-are-zero; no change elsewhere); the previous mode comes
/// back on drop. For recurrences whose products decay towards zero (Gated DeltaNet's decays
/// `exp(c_i - c_j)` and states): an operand below 2^-126 (1.2e-38) costs the core a microcode
/// assist of ~100 cycles per operation, which made the delta rule's matrix products 4x slower
/// (1.38 s -> 0.32 s of thread time per 512-token prompt of the benchmark's random Qwen 3.5 0.8B
/// shape, 2-vCPU Xeon), while no value above 1.2e-38 changes.
pub struct FlushSubnormals {
    #[cfg(target_arch = "x86_64")]
    saved: u32,
}

impl FlushSubnormals {
    #[cfg(target_arch = "x86_64")]
    pub fn new() -> FlushSubnormals {
        /// MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6).
        const FTZ_DAZ: u32 = 0x8040;
        let mut saved = 0u32;
        // SAFETY: stmxcsr / ldmxcsr read and write the 32-bit value behind the pointer only; every
        // x86_64 CPU has them (SSE).
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut saved, options(nostack, preserves_flags));
            let set = saved | FTZ_DAZ;
            std::arch::asm!("ldmxcsr [{}]", in(reg) &set, options(nostack, readonly, preserves_flags));
        }
        FlushSubnormals { saved }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn new() -> FlushSubnormals {
        FlushSubnormals {}
    }
}

impl Drop for FlushSubnormals {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `new`; restores the mode read there.
        unsafe {
            std::arch::asm!("ldmxcsr [{}]", in(reg) &self.saved, options(nostack, readonly, preserves_flags));
        }
    }
}

/// Rows per block of [`gemm`] (callers pad `m` to a multiple).
pub const GEMM_ROWS: usize = 4;

/// `c[m×n] += a[m×k] · b[k×n]`, row-major, every element one FMA chain over `k` in order, as
/// ggml's `simd_gemm` (`ggml-cpu/simd-gemm.h`) computes it; `m` a multiple of [`GEMM_ROWS`].
pub fn gemm(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize) {
    assert!(m.is_multiple_of(GEMM_ROWS) && c.len() >= m * n && a.len() >= m * k && b.len() >= k * n);
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        if quant::dot::avx2::vnni() {
            // SAFETY: AVX-512F/VL present (with VNNI); the slices hold the shapes checked above.
            return unsafe { gemm_avx512(c, a, b, m, k, n) };
        }
        // SAFETY: AVX2+FMA present; the slices hold the shapes checked above.
        return unsafe { gemm_avx2(c, a, b, m, k, n) };
    }
    for i in 0..m {
        for j in 0..n {
            let mut acc = c[i * n + j];
            for kk in 0..k {
                acc = a[i * k + kk].mul_add(b[kk * n + j], acc);
            }
            c[i * n + j] = acc;
        }
    }
}

/// [`gemm_avx2`] with AVX-512: blocks of 4 rows × 64 columns in 16-lane registers (16
/// accumulators), then 4 × 32 in 8-lane ones (AVX-512VL's 32 registers), each loaded B vector
/// used four times; the same FMA chains (the vector width does not change any element's sum).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
unsafe fn gemm_avx512(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize) {
    let (cp, ap, bp) = (c.as_mut_ptr(), a.as_ptr(), b.as_ptr());
    for i0 in (0..m).step_by(GEMM_ROWS) {
        let mut j0 = 0;
        while j0 + 64 <= n {
            gemm_block_512(cp, ap, bp, i0, j0, k, n);
            j0 += 64;
        }
        while j0 + 32 <= n {
            gemm_block::<4>(cp, ap, bp, i0, j0, k, n);
            j0 += 32;
        }
        gemm_tail(cp, ap, bp, i0, j0, k, n);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gemm_avx2(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize) {
    let (cp, ap, bp) = (c.as_mut_ptr(), a.as_ptr(), b.as_ptr());
    for i0 in (0..m).step_by(GEMM_ROWS) {
        gemm_tail(cp, ap, bp, i0, 0, k, n);
    }
}

/// Rows i0..i0+4 of [`gemm`] from column j0 on: blocks of 16 and 8 columns, then scalar FMAs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn gemm_tail(c: *mut f32, a: *const f32, b: *const f32, i0: usize, j0: usize, k: usize, n: usize) {
    let mut j0 = j0;
    while j0 + 16 <= n {
        gemm_block::<2>(c, a, b, i0, j0, k, n);
        j0 += 16;
    }
    while j0 + 8 <= n {
        gemm_block::<1>(c, a, b, i0, j0, k, n);
        j0 += 8;
    }
    for i in i0..i0 + GEMM_ROWS {
        for j in j0..n {
            let mut acc = *c.add(i * n + j);
            for kk in 0..k {
                acc = (*a.add(i * k + kk)).mul_add(*b.add(kk * n + j), acc);
            }
            *c.add(i * n + j) = acc;
        }
    }
}

/// Rows i0..i0+4, columns j0..j0+64 of [`gemm`], in 16-lane registers over the whole k loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn gemm_block_512(c: *mut f32, a: *const f32, b: *const f32, i0: usize, j0: usize, k: usize, n: usize) {
    let mut acc = [[_mm512_setzero_ps(); 4]; GEMM_ROWS];
    for (i, row) in acc.iter_mut().enumerate() {
        for (r, v) in row.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(c.add((i0 + i) * n + j0 + 16 * r));
        }
    }
    for kk in 0..k {
        let bv: [__m512; 4] = std::array::from_fn(|r| _mm512_loadu_ps(b.add(kk * n + j0 + 16 * r)));
        for (i, row) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*a.add((i0 + i) * k + kk));
            for (r, v) in row.iter_mut().enumerate() {
                *v = _mm512_fmadd_ps(bv[r], av, *v);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (r, v) in row.iter().enumerate() {
            _mm512_storeu_ps(c.add((i0 + i) * n + j0 + 16 * r), *v);
        }
    }
}

/// Rows i0..i0+4, columns j0..j0+8·RN of [`gemm`], in registers over the whole k loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn gemm_block<const RN: usize>(
    c: *mut f32,
    a: *const f32,
    b: *const f32,
    i0: usize,
    j0: usize,
    k: usize,
    n: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); RN]; GEMM_ROWS];
    for (i, row) in acc.iter_mut().enumerate() {
        for (r, v) in row.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(c.add((i0 + i) * n + j0 + 8 * r));
        }
    }
    for kk in 0..k {
        let bv: [__m256; RN] = std::array::from_fn(|r| _mm256_loadu_ps(b.add(kk * n + j0 + 8 * r)));
        for (i, row) in acc.iter_mut().enumerate() {
            let av = _mm256_set1_ps(*a.add((i0 + i) * k + kk));
            for (r, v) in row.iter_mut().enumerate() {
                *v = _mm256_fmadd_ps(bv[r], av, *v);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (r, v) in row.iter().enumerate() {
            _mm256_storeu_ps(c.add((i0 + i) * n + j0 + 8 * r), *v);
        }
    }
}

/// `x = silu(x)`, with [`silu_mul`]'s numbers (its product by one).
pub fn silu(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2+FMA present.
        return unsafe { silu_avx2(x) };
    }
    for v in x.iter_mut() {
        *v /= 1.0 + (-*v).exp();
    }
}

/// Exponential for activations: within a few ulp of `f32::exp` (a vector polynomial on AVX2).
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2+FMA present.
        return unsafe { silu_mul_avx2(gate, up, out) };
    }
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, s) in acc.iter_mut().enumerate() {
            let j = i + 8 * k;
            *s = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(j)), _mm256_loadu_ps(pb.add(j)), *s);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc[0]);
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        s += a[i] * b[i];
        i += 1;
    }
    s
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scale_avx2(x: &mut [f32], s: f32) {
    let sv = _mm256_set1_ps(s);
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        _mm256_storeu_ps(c.as_mut_ptr(), _mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), sv));
    }
    for v in chunks.into_remainder() {
        *v *= s;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(acc: &mut [f32], x: &[f32], s: f32) {
    let n = acc.len().min(x.len());
    let sv = _mm256_set1_ps(s);
    let mut i = 0;
    while i + 8 <= n {
        let p = acc.as_mut_ptr().add(i);
        _mm256_storeu_ps(
            p,
            _mm256_fmadd_ps(_mm256_loadu_ps(x.as_ptr().add(i)), sv, _mm256_loadu_ps(p)),
        );
        i += 8;
    }
    while i < n {
        acc[i] = x[i].mul_add(s, acc[i]);
        i += 1;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mad_f16_avx2(acc: &mut [u16], v: &[u8], s: f32) {
    let n = acc.len().min(v.len() / 2);
    let sv = _mm256_set1_ps(s);
    let mut i = 0;
    while i + 8 <= n {
        let pa = acc.as_mut_ptr().add(i) as *mut __m128i;
        let a = _mm256_cvtph_ps(_mm_loadu_si128(pa));
        let x = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(2 * i) as *const __m128i));
        _mm_storeu_si128(
            pa,
            _mm256_cvtps_ph(_mm256_fmadd_ps(x, sv, a), _MM_FROUND_TO_NEAREST_INT),
        );
        i += 8;
    }
    while i < n {
        let vv = f16_to_f32(u16::from_le_bytes([v[2 * i], v[2 * i + 1]]));
        acc[i] = f32_to_f16(vv.mul_add(s, f16_to_f32(acc[i])));
        i += 1;
    }
}

/// e^x for 8 lanes, the algorithm ggml's vector SiLU uses (`ggml-cpu/vec.h` ggml_v_expf, after
/// Arm's optimized-routines expf): n = round(x/ln2) by the 1.5·2^23 trick, a two-part ln2
/// reduction, a degree-5 minimax polynomial evaluated with the same FMA tree, and exact scaling
/// by 2^n (two steps so subnormal results round once, like AVX-512's `scalef`). Max error ~1.5 ulp.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_avx2(x: __m256) -> __m256 {
    let r = _mm256_set1_ps(f32::from_bits(0x4b40_0000)); // 0x1.8p23
    let z = _mm256_fmadd_ps(x, _mm256_set1_ps(f32::from_bits(0x3fb8_aa3b)), r); // 0x1.715476p+0
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(
        n,
        _mm256_set1_ps(f32::from_bits(0x35bf_be8e)), // 0x1.7f7d1cp-20
        _mm256_fnmadd_ps(n, _mm256_set1_ps(f32::from_bits(0x3f31_7200)), x), // 0x1.62e4p-1
    );
    let u = _mm256_mul_ps(b, b);
    let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)), // 0x1.0e4020p-7, 0x1.573e2ep-5
            u,
            _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)), // 0x1.555e66p-3, 0x1.fffdb6p-2
        ),
        u,
        _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)), // 0x1.ffffecp-1
    );
    // j * 2^n = (j * 2^h) * 2^(n-h) with h = n/2 rounded toward zero; both factors are normal
    // powers of two for |n| <= 252, so only the last product rounds.
    let ni = _mm256_cvtps_epi32(n);
    let ni = _mm256_max_epi32(_mm256_min_epi32(ni, _mm256_set1_epi32(252)), _mm256_set1_epi32(-252));
    let h = _mm256_srai_epi32(ni, 1);
    let pow2 = |e: __m256i| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
    _mm256_mul_ps(_mm256_mul_ps(j, pow2(h)), pow2(_mm256_sub_epi32(ni, h)))
}

/// 16 values: exp(x - max) in place, and their sum in `_mm512_reduce_add_ps` order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_block16(x: &mut [f32], max: f32) -> f32 {
    let m = _mm256_set1_ps(max);
    let p = x.as_mut_ptr();
    // Masked entries (-inf) give 0, as ggml's vector exp does.
    let exp_or_zero = |x: __m256| {
        let e = exp_avx2(_mm256_sub_ps(x, m));
        _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(f32::NEG_INFINITY), _CMP_EQ_OQ), e)
    };
    let lo = exp_or_zero(_mm256_loadu_ps(p));
    let hi = exp_or_zero(_mm256_loadu_ps(p.add(8)));
    _mm256_storeu_ps(p, lo);
    _mm256_storeu_ps(p.add(8), hi);
    hsum(_mm256_add_ps(hi, lo))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_avx2(x: &mut [f32]) {
    let one = _mm256_set1_ps(1.0);
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        let g = _mm256_loadu_ps(c.as_ptr());
        let e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(c.as_mut_ptr(), _mm256_div_ps(g, _mm256_add_ps(one, e)));
    }
    for v in chunks.into_remainder() {
        *v /= 1.0 + (-*v).exp();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = out.len().min(gate.len()).min(up.len());
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        let g = _mm256_loadu_ps(gate.as_ptr().add(i));
        let e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
        let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(
            out.as_mut_ptr().add(i),
            _mm256_mul_ps(s, _mm256_loadu_ps(up.as_ptr().add(i))),
        );
        i += 8;
    }
    while i < n {
        out[i] = gate[i] / (1.0 + (-gate[i]).exp()) * up[i];
        i += 1;
    }
}

/// For each of four rows, `Σ (x·x as f64)` summed in row order, as ggml's rms_norm sums a row
/// (`ggml_float` accumulation): the four rows' sums advance side by side in the lanes of one
/// f64 vector, each lane the same sequence of operations as the scalar loop.
pub fn sum_squares_x4(rows: [&[f32]; 4]) -> [f64; 4] {
    let n = rows.iter().map(|r| r.len()).min().unwrap_or(0);
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 present; every row holds at least n values.
        return unsafe { sum_squares_x4_avx2(rows, n) };
    }
    rows.map(|r| r[..n].iter().map(|&v| (v * v) as f64).sum())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_squares_x4_avx2(rows: [&[f32]; 4], n: usize) -> [f64; 4] {
    let mut acc = _mm256_setzero_pd();
    let n4 = n / 4 * 4;
    for i in (0..n4).step_by(4) {
        let [a, b, c, d] = rows.map(|r| _mm_loadu_ps(r.as_ptr().add(i)));
        // Transpose: t[j] holds value i + j of the four rows.
        let (ab0, ab1) = (_mm_unpacklo_ps(a, b), _mm_unpackhi_ps(a, b));
        let (cd0, cd1) = (_mm_unpacklo_ps(c, d), _mm_unpackhi_ps(c, d));
        let t = [
            _mm_movelh_ps(ab0, cd0),
            _mm_movehl_ps(cd0, ab0),
            _mm_movelh_ps(ab1, cd1),
            _mm_movehl_ps(cd1, ab1),
        ];
        for v in t {
            acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm_mul_ps(v, v)));
        }
    }
    let mut s = [0f64; 4];
    _mm256_storeu_pd(s.as_mut_ptr(), acc);
    for (sum, r) in s.iter_mut().zip(rows) {
        for &v in &r[n4..n] {
            *sum += (v * v) as f64;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inside the guard a product below 2^-126 is zero, and a subnormal operand counts as zero;
    /// after it, the thread computes subnormals again; normal values are untouched throughout.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn subnormals_flush_only_while_guarded() {
        use std::hint::black_box;
        let tiny = black_box(f32::MIN_POSITIVE);
        let half = || black_box(tiny) * black_box(0.5f32);
        assert!(half() > 0.0 && half().is_subnormal());
        {
            let _g = FlushSubnormals::new();
            assert_eq!(half(), 0.0);
            assert_eq!(black_box(f32::from_bits(1)) + black_box(0.0f32), 0.0);
            assert_eq!(black_box(tiny) * black_box(2.0f32), f32::MIN_POSITIVE * 2.0);
            assert_eq!(black_box(1.5f32) * black_box(3.0f32), 4.5);
        }
        assert!(half().is_subnormal());
    }

    /// Four rows' sums of squares side by side equal each row's scalar sum bit for bit, including
    /// the tail past the last group of four and rows whose sums need many f64 bits.
    #[test]
    fn sum_squares_x4_equals_row_by_row() {
        let mut s = 9u32;
        let mut val = || {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * [1e-3, 1.0, 3e3][(s & 3).min(2) as usize]
        };
        for n in [1, 3, 4, 5, 576, 1023] {
            let rows: Vec<Vec<f32>> = (0..4).map(|_| (0..n).map(|_| val()).collect()).collect();
            let got = sum_squares_x4(std::array::from_fn(|r| rows[r].as_slice()));
            for (g, r) in got.iter().zip(&rows) {
                let want: f64 = r.iter().map(|&v| (v * v) as f64).sum();
                assert_eq!(g.to_bits(), want.to_bits(), "n={n}");
            }
        }
    }

    #[test]
    fn vector_helpers_match_scalar() {
        let b: Vec<f32> = (0..77).map(|i| (i as f32 * 0.11).cos()).collect();
        // gemm: every element the FMA chain over k in order, whatever the blocking (8 rows,
        // 77 values of k, 64 + 32 + 16 + 8 + 3 columns exercise every block shape and the scalar
        // tail).
        let (m, k, n) = (8, 77, 123);
        let am: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let bm: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut c: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.01).collect();
        let mut want = c.clone();
        for i in 0..m {
            for j in 0..n {
                for kk in 0..k {
                    want[i * n + j] = am[i * k + kk].mul_add(bm[kk * n + j], want[i * n + j]);
                }
            }
        }
        gemm(&mut c, &am, &bm, m, k, n);
        assert_eq!(c, want);
        // dot: partial sums in another order than the scalar one; f32 rounding of 77 terms.
        for len in [0, 5, 8, 31, 32, 77] {
            let (x, y) = (&am[..len], &bm[..len]);
            let want: f64 = x.iter().zip(y).map(|(&p, &q)| p as f64 * q as f64).sum();
            let mag: f64 = x.iter().zip(y).map(|(&p, &q)| (p as f64 * q as f64).abs()).sum();
            assert!((dot(x, y) as f64 - want).abs() <= 1e-6 * mag + 1e-30, "dot of {len}");
        }
        let mut sc = b.clone();
        scale(&mut sc, 0.3);
        assert!(sc.iter().zip(&b).all(|(&p, &q)| p == q * 0.3), "scale");
        let g: Vec<f32> = (0..77).map(|i| (i as f32 - 38.0) * 0.5).collect();
        let mut out = vec![0f32; 77];
        silu_mul(&g, &b, &mut out);
        for i in 0..77 {
            let w = g[i] / (1.0 + (-g[i]).exp()) * b[i];
            // relative 1e-6: the polynomial's error (2e-7) plus a division's rounding.
            assert!((out[i] - w).abs() <= 1e-6 * w.abs().max(1e-3), "{i}: {} vs {w}", out[i]);
        }
        // silu: silu_mul's numbers by a factor of one.
        let mut by_one = vec![0f32; 77];
        silu_mul(&g, &[1f32; 77], &mut by_one);
        let mut sg = g.clone();
        silu(&mut sg);
        assert_eq!(sg, by_one);
        let v: Vec<u8> = (0..77u16)
            .flat_map(|i| f32_to_f16(i as f32 * 0.01).to_le_bytes())
            .collect();
        let mut acc1: Vec<u16> = (0..77).map(|i| f32_to_f16(i as f32 * -0.3)).collect();
        let mut acc2 = acc1.clone();
        mad_f16(&mut acc1, &v, 0.7);
        for (a, bb) in acc2.iter_mut().zip(v.chunks_exact(2)) {
            let vv = f16_to_f32(u16::from_le_bytes([bb[0], bb[1]]));
            *a = f32_to_f16(vv.mul_add(0.7, f16_to_f32(*a)));
        }
        assert_eq!(acc1, acc2);
    }
}
