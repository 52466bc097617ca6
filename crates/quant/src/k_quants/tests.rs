//! Unit tests of the K-quants that the ggml fixture vectors do not cover (Q8_K has no fixtures;
//! the bit-exactness of Q2_K…Q6_K is checked by `tests/ggml_vectors.rs`).

use super::helpers::{get_scale_min_k4, pack_scale_min_k4, QK_K};
use super::{q3_k, q8_k, BlockQ8K};
use crate::GgmlType;

/// Deterministic pseudo-random values in [-1, 1) (xorshift).
fn noise(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

#[test]
fn q8_k_hand_computed_block() {
    // Block 0: max |x| is 254 (positive), so iscale = -127/254 = -0.5 and d = -2.
    // Block 1: all zeros.
    let mut x = vec![0f32; 2 * QK_K];
    x[0] = 254.0; // -127
    x[1] = 5.0; // -2.5 -> -2 (ties to even)
    x[2] = -3.0; // 1.5 -> 2 (ties to even)
    x[3] = 1.0; // -0.5 -> 0
    x[16] = -253.0; // 126.5 -> 126
    let mut bytes = vec![0xAAu8; 2 * std::mem::size_of::<BlockQ8K>()];
    q8_k::quantize_row(&x, &mut bytes, None);
    let blocks: &[BlockQ8K] = bytemuck::cast_slice(&bytes);

    let b = &blocks[0];
    assert_eq!(f32::from_le_bytes(b.d), -2.0);
    let mut qs = [0i8; QK_K];
    qs[..4].copy_from_slice(&[-127, -2, 2, 0]);
    qs[16] = 126;
    assert_eq!(b.qs, qs.map(|q| q as u8));
    let bsums: Vec<i16> = b.bsums.iter().map(|s| i16::from_le_bytes(*s)).collect();
    let mut expected = vec![0i16; 16];
    expected[0] = -127;
    expected[1] = 126;
    assert_eq!(bsums, expected);
    assert_eq!(
        bytes[std::mem::size_of::<BlockQ8K>()..],
        vec![0u8; std::mem::size_of::<BlockQ8K>()]
    );

    let y = crate::dequantize(GgmlType::Q8_K, &bytes, 2 * QK_K).unwrap();
    assert_eq!(&y[..4], &[254.0, 4.0, -4.0, -0.0]);
    assert_eq!(y[16], -252.0);
    assert!(y[QK_K..].iter().all(|&v| v == 0.0));
}

#[test]
fn q8_k_round_trip_within_one_step() {
    let scales = [1e-3f32, 1.0, 37.5, 1e4];
    let mut x = Vec::new();
    for (r, &s) in scales.iter().enumerate() {
        x.extend(noise(QK_K * 2, 7 + r as u32).iter().map(|v| v * s));
    }
    let q = crate::quantize(GgmlType::Q8_K, &x, QK_K * 2, None).unwrap();
    let y = crate::dequantize(GgmlType::Q8_K, &q, x.len()).unwrap();
    let blocks: &[BlockQ8K] = bytemuck::cast_slice(&q);
    for (b, (xs, ys)) in blocks.iter().zip(x.chunks(QK_K).zip(y.chunks(QK_K))) {
        let d = f32::from_le_bytes(b.d).abs();
        assert!(d > 0.0);
        for (&a, &v) in xs.iter().zip(ys) {
            assert!((a - v).abs() <= d, "{a} -> {v} with step {d}");
        }
        // bsums are the sums of the quants.
        for (s, qs) in b.bsums.iter().zip(b.qs.chunks(16)) {
            let sum: i32 = qs.iter().map(|&q| q as i8 as i32).sum();
            assert_eq!(i16::from_le_bytes(*s) as i32, sum);
        }
    }
}

#[test]
fn k4_scale_packing_round_trips() {
    let ls: [u8; 8] = [0, 1, 17, 63, 32, 48, 5, 62];
    let lm: [u8; 8] = [63, 2, 0, 31, 16, 7, 60, 33];
    let packed = pack_scale_min_k4(&ls, &lm);
    for j in 0..8 {
        assert_eq!(get_scale_min_k4(j, &packed), (ls[j], lm[j]), "sub-block {j}");
    }
}

#[test]
fn q3_scale_packing_round_trips() {
    let ls: [u8; 16] = std::array::from_fn(|j| ((j * 29 + 3) % 64) as u8);
    let packed = q3_k::pack_scales(&ls);
    for (j, &l) in ls.iter().enumerate() {
        assert_eq!(q3_k::scale(&packed, j), l as i32 - 32, "sub-block {j}");
    }
}

#[test]
fn k_quants_round_trip_with_bounded_error() {
    // A coarse sanity check of every type, with and without an importance matrix: the relative
    // RMS error shrinks as bits grow.
    let x = noise(4 * QK_K, 12345);
    let imatrix: Vec<f32> = noise(QK_K, 99).iter().map(|v| v.abs() + 0.1).collect();
    let bounds = [
        (GgmlType::Q2_K, 0.40),
        (GgmlType::Q3_K, 0.20),
        (GgmlType::Q4_K, 0.10),
        (GgmlType::Q5_K, 0.05),
        (GgmlType::Q6_K, 0.025),
        (GgmlType::Q8_K, 0.01),
    ];
    let norm = x.iter().map(|v| v * v).sum::<f32>().sqrt();
    for (ty, bound) in bounds {
        for im in [None, Some(&imatrix[..])] {
            let q = crate::quantize(ty, &x, QK_K, im).unwrap();
            let y = crate::dequantize(ty, &q, x.len()).unwrap();
            let err = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt() / norm;
            assert!(err < bound, "{ty:?} (imatrix {}): relative error {err}", im.is_some());
        }
    }
}
