//! Agreement of the fast (AVX2) paths with the scalar reference paths: every quantizer, search
//! routine and dequantizer must give exactly the same bytes / float bits on seeded inputs.
//! (Bit-exactness against ggml itself is checked by `tests/ggml_vectors.rs`.)

use super::helpers::{self, QK_K};
use super::{q2_k, q3_k, q4_k, q5_k, q6_k, q8_k};

/// Runs `f` with the fast paths disabled on this thread (a no-op where there are none).
fn scalar<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        super::fast::FORCE_SCALAR.with(|c| c.set(true));
        let r = f();
        super::fast::FORCE_SCALAR.with(|c| c.set(false));
        r
    }
    #[cfg(not(target_arch = "x86_64"))]
    f()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn uniform(&mut self) -> f32 {
        ((self.next() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }
    fn gauss(&mut self) -> f32 {
        let (u, v) = (self.uniform() as f64, self.uniform() as f64);
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
    /// 10^e for e uniform in lo..hi.
    fn scale(&mut self, lo: f32, hi: f32) -> f32 {
        10f32.powf(lo + (hi - lo) * self.uniform())
    }
}

/// One row of `n` values of a kind chosen by `kind` (see the match arms).
fn row(rng: &mut Rng, n: usize, kind: usize) -> Vec<f32> {
    let s = rng.scale(-6.0, 6.0);
    match kind {
        0 => (0..n).map(|_| rng.gauss() * s).collect(),
        1 => vec![0.0; n],
        2 => vec![if rng.below(2) == 0 { s } else { -s }; n],
        3 => {
            let mut v = vec![0.0; n];
            v[rng.below(n)] = rng.gauss() * s;
            v
        }
        4 => (0..n).map(|_| rng.gauss() * 1e30).collect(),
        5 => (0..n).map(|_| rng.gauss() * 1e-30).collect(),
        6 => {
            // Scale changing per 16 values, with some all-zero and tiny groups.
            let mut v = Vec::with_capacity(n);
            for _ in 0..n / 16 {
                let g = match rng.below(8) {
                    0 => 0.0,
                    1 => 1e-20,
                    _ => rng.scale(-8.0, 8.0),
                };
                v.extend((0..16).map(|_| rng.gauss() * g));
            }
            v
        }
        7 => (0..n).map(|_| rng.uniform() * s).collect(),
        8 => (0..n).map(|_| -rng.uniform() * s).collect(),
        9 => (0..n).map(|_| (rng.gauss() * 4.0).round() * 0.25 * s).collect(),
        10 => (0..n)
            .map(|_| {
                let g = rng.gauss() * 0.02;
                if rng.below(1000) == 0 {
                    g * 10.0
                } else {
                    g
                }
            })
            .collect(),
        11 => (0..n).map(|i| if i % 2 == 0 { s } else { -0.5 * s }).collect(),
        _ => (0..n).map(|_| rng.gauss() * rng.scale(-3.0, 3.0)).collect(),
    }
}

const KINDS: usize = 13;

/// An importance-matrix row: positive weights of various spreads, some zero.
fn imatrix_row(rng: &mut Rng, n: usize) -> Vec<f32> {
    let kind = rng.below(4);
    (0..n)
        .map(|_| match kind {
            0 => 0.1 + 2.0 * rng.uniform(),
            1 => rng.scale(-4.0, 4.0),
            2 => {
                if rng.below(4) == 0 {
                    0.0
                } else {
                    rng.uniform()
                }
            }
            _ => 1.0,
        })
        .collect()
}

type Quantize = fn(&[f32], &mut [u8], Option<&[f32]>);

#[test]
fn quantizers_fast_equals_scalar() {
    const ROW: usize = 2 * QK_K;
    let types: [(&str, Quantize, usize); 6] = [
        ("Q2_K", q2_k::quantize_row, 84),
        ("Q3_K", q3_k::quantize_row, 110),
        ("Q4_K", q4_k::quantize_row, 144),
        ("Q5_K", q5_k::quantize_row, 176),
        ("Q6_K", q6_k::quantize_row, 210),
        ("Q8_K", q8_k::quantize_row, 292),
    ];
    let mut rng = Rng(0x5eed_1234_abcd);
    for r in 0..2600 {
        let x = row(&mut rng, ROW, r % KINDS);
        let w = imatrix_row(&mut rng, ROW);
        for &(name, quantize, block) in &types {
            for im in [None, Some(&w[..])] {
                let mut fast = vec![0u8; 2 * block];
                let mut slow = vec![0u8; 2 * block];
                quantize(&x, &mut fast, im);
                scalar(|| quantize(&x, &mut slow, im));
                assert_eq!(fast, slow, "{name} row {r} kind {} imatrix {}", r % KINDS, im.is_some());
            }
        }
    }
}

#[test]
fn search_routines_fast_equals_scalar() {
    let mut rng = Rng(0xfeed_beef);
    for r in 0..20000 {
        let n = if rng.below(2) == 0 { 16 } else { 32 };
        let x = row(&mut rng, 32, r % KINDS)[..n].to_vec();
        let w = imatrix_row(&mut rng, n);
        let ctx = format!("case {r} kind {} n {n}", r % KINDS);

        for nmax in [4, 8, 16, 32] {
            for qw in [None, Some(&w[..])] {
                let (mut a, mut b) = ([0i8; 32], [0i8; 32]);
                let fa = helpers::make_qx_quants(nmax, &x, &mut a, 1, qw);
                let fb = scalar(|| helpers::make_qx_quants(nmax, &x, &mut b, 1, qw));
                assert_eq!((fa.to_bits(), a), (fb.to_bits(), b), "make_qx_quants nmax {nmax} {ctx}");
            }
        }

        let (mut a, mut b) = ([0i8; 32], [0i8; 32]);
        let fa = helpers::make_q3_quants(4, &x, &mut a, true);
        let fb = scalar(|| helpers::make_q3_quants(4, &x, &mut b, true));
        assert_eq!((fa.to_bits(), a), (fb.to_bits(), b), "make_q3_quants {ctx}");

        let params = [
            (3, -0.5, 0.1, 15, true),
            (15, -1.0, 0.1, 20, false),
            (31, -0.5, 0.1, 15, false),
            (3, -0.9, 0.05, 36, false),
            (15, -0.9, 0.05, 36, true),
            (7, -0.5, 0.1, 0, false),
        ];
        for (nmax, rmin, rdelta, nstep, mad) in params {
            let bits = |(s, m): (f32, f32)| (s.to_bits(), m.to_bits());
            let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
            let fa = helpers::make_qkx2_quants(nmax, &x, &w, &mut a, rmin, rdelta, nstep, mad);
            let fb = scalar(|| helpers::make_qkx2_quants(nmax, &x, &w, &mut b, rmin, rdelta, nstep, mad));
            assert_eq!((bits(fa), a), (bits(fb), b), "make_qkx2_quants nmax {nmax} {ctx}");
            for qw in [None, Some(&w[..])] {
                let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
                let fa = helpers::make_qkx3_quants(nmax, &x, qw, &mut a, rmin, rdelta, nstep, mad);
                let fb = scalar(|| helpers::make_qkx3_quants(nmax, &x, qw, &mut b, rmin, rdelta, nstep, mad));
                assert_eq!((bits(fa), a), (bits(fb), b), "make_qkx3_quants nmax {nmax} {ctx}");
            }
        }

        let d = rng.gauss() * rng.scale(-6.0, 3.0);
        let dm = rng.gauss() * rng.scale(-6.0, 3.0);
        let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
        helpers::requant_asym(&x, d, dm, 31, &mut a[..n]);
        helpers::requant_asym_scalar(&x, d, dm, 31, &mut b[..n]);
        assert_eq!(a, b, "requant_asym {ctx}");
        let (mut a, mut b) = ([0i8; 32], [0i8; 32]);
        helpers::requant_sym(&x, d, -32, 31, 32, &mut a[..n]);
        helpers::requant_sym_scalar(&x, d, -32, 31, 32, &mut b[..n]);
        assert_eq!(a, b, "requant_sym {ctx}");
    }
}

/// The eight-groups-per-vector search against the scalar one group at a time, with every group
/// of a different kind (so empty, constant and huge groups share a vector with ordinary ones).
#[test]
fn grouped_qkx_search_equals_scalar() {
    let mut rng = Rng(0x0dd_c0ffee);
    let params = [
        (false, true, 3, -0.5, 0.1, 15),
        (false, false, 15, -1.0, 0.1, 20),
        (false, false, 31, -0.5, 0.1, 15),
        (true, false, 3, -0.9, 0.05, 36),
        (true, false, 15, -0.9, 0.05, 36),
        (true, true, 31, -0.9, 0.05, 36),
        (false, false, 7, -0.5, 0.1, 0),
    ];
    for r in 0..3000 {
        let group = if r % 2 == 0 { 16 } else { 32 };
        let count = if rng.below(2) == 0 { 8 } else { 16 };
        let mut x = Vec::new();
        for _ in 0..count {
            let kind = rng.below(KINDS);
            x.extend(row(&mut rng, 32, kind).into_iter().take(group));
        }
        let w = imatrix_row(&mut rng, x.len());
        for &(guard, mad, nmax, rmin, rdelta, nstep) in &params {
            let run = || {
                let mut levels = vec![0u8; x.len()];
                let (mut s, mut m) = (vec![0f32; count], vec![0f32; count]);
                helpers::make_qkx_groups(
                    guard,
                    mad,
                    nmax,
                    group,
                    &x,
                    &w,
                    &mut levels,
                    (rmin, rdelta, nstep),
                    &mut s,
                    &mut m,
                );
                let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
                (levels, bits(s), bits(m))
            };
            let fast = run();
            let slow = scalar(run);
            assert_eq!(fast, slow, "case {r} group {group} guard {guard} mad {mad} nmax {nmax}");
        }
    }
}

type Dequantize = fn(&[u8], &mut [f32]);

#[test]
fn dequantizers_fast_equals_scalar() {
    let types: [(&str, Dequantize, Dequantize, usize); 6] = [
        ("Q2_K", q2_k::dequantize_row, q2_k::dequantize_row_scalar, 84),
        ("Q3_K", q3_k::dequantize_row, q3_k::dequantize_row_scalar, 110),
        ("Q4_K", q4_k::dequantize_row, q4_k::dequantize_row_scalar, 144),
        ("Q5_K", q5_k::dequantize_row, q5_k::dequantize_row_scalar, 176),
        ("Q6_K", q6_k::dequantize_row, q6_k::dequantize_row_scalar, 210),
        ("Q8_K", q8_k::dequantize_row, q8_k::dequantize_row_scalar, 292),
    ];
    let mut rng = Rng(0x00de_c0de);
    const BLOCKS: usize = 4096;
    for (name, fast, slow, block) in types {
        let bytes: Vec<u8> = (0..BLOCKS * block).map(|_| rng.next() as u8).collect();
        let mut a = vec![0f32; BLOCKS * QK_K];
        let mut b = vec![1f32; BLOCKS * QK_K];
        fast(&bytes, &mut a);
        slow(&bytes, &mut b);
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x.to_bits(), y.to_bits(), "{name} value {i}: {x} vs {y}");
        }
    }
}
