use super::*;

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

const TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

/// f64 dot of the dequantized weight row with the dequantized activation row.
fn reference(w_ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f64 {
    let act = vec_dot_type(w_ty).unwrap();
    let xw = crate::dequantize(w_ty, w, n).unwrap();
    let mut xa = vec![0f32; n];
    dequantize_act(act, a, &mut xa);
    let mut r: f64 = xw.iter().zip(&xa).map(|(p, q)| *p as f64 * *q as f64).sum();
    if act == GgmlType::Q8_1 {
        // Q8_1 carries s = d * sum(q) rounded to f16, and ggml uses it for the min term.
        let f16 = |b: &[u8], at: usize| crate::fp::f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]])) as f64;
        let f32at = |b: &[u8], at: usize| f32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as f64;
        let wb = w_ty.type_size() as usize;
        for (x, y) in w.chunks_exact(wb).zip(a.chunks_exact(ACT_Q8_1)) {
            let sum: i32 = y[8..40].iter().map(|&v| v as i8 as i32).sum();
            r += f16(x, 2) * (f32at(y, 4) - f32at(y, 0) * sum as f64);
        }
    }
    r
}

#[test]
fn every_kernel_matches_the_dequantized_product() {
    let n = 512;
    let mut seed = 7u64;
    for &ty in TYPES {
        let wf: Vec<f32> = (0..n).map(|_| lcg(&mut seed) * 2.0).collect();
        let w = crate::quantize(ty, &wf, n, None).unwrap();
        let act = vec_dot_type(ty).unwrap();
        let acts: Vec<Vec<u8>> = (0..4)
            .map(|_| {
                let af: Vec<f32> = (0..n).map(|_| lcg(&mut seed) * 3.0).collect();
                let mut q = vec![0u8; act_row_bytes(act, n)];
                quantize_act(act, &af, &mut q);
                q
            })
            .collect();
        let refs: Vec<&[u8]> = acts.iter().map(|v| v.as_slice()).collect();
        let expect: Vec<f64> = refs.iter().map(|a| reference(ty, n, &w, a)).collect();
        let scale: f64 = expect.iter().map(|v| v.abs()).fold(1.0, f64::max);
        for path in [KernelPath::Scalar, KernelPath::detect()] {
            let k = kernel(ty, path).unwrap();
            for cols in 1..=4 {
                let mut out = vec![0f32; cols];
                (k.dot)(ty, n, &w, &refs[..cols], &mut out);
                if let Some(rows) = k.rows {
                    // The several-row kernel gives each row exactly the one-row kernel's result.
                    let others: Vec<Vec<u8>> = [-0.7f32, 0.3, 1.9]
                        .iter()
                        .map(|s| {
                            let wf2: Vec<f32> = wf.iter().map(|v| v * s + 0.1).collect();
                            crate::quantize(ty, &wf2, n, None).unwrap()
                        })
                        .collect();
                    let all: Vec<&[u8]> = std::iter::once(&w[..])
                        .chain(others.iter().map(|v| v.as_slice()))
                        .collect();
                    for r in [2, 4].into_iter().filter(|&r| r <= k.max_rows) {
                        let mut o = vec![[0f32; MAX_COLS]; r];
                        rows(ty, n, &all[..r], &refs[..cols], &mut o);
                        for (i, wr) in all[..r].iter().enumerate() {
                            let mut single = vec![0f32; cols];
                            (k.dot)(ty, n, wr, &refs[..cols], &mut single);
                            assert_eq!(&o[i][..cols], &single[..], "{ty:?} {r}-row kernel, row {i}");
                        }
                    }
                }
                if let Some(u) = k.unpacked {
                    // Unpacked rows give bit for bit the packed kernel's sums, one row at a time
                    // and in row groups (rows of several scales, so a swapped scale shows).
                    let rows: Vec<Vec<u8>> = [1f32, -0.7, 0.3, 1.9]
                        .iter()
                        .map(|s| {
                            let wf2: Vec<f32> = wf.iter().map(|v| v * s + 0.1).collect();
                            crate::quantize(ty, &wf2, n, None).unwrap()
                        })
                        .collect();
                    let unp: Vec<Vec<u8>> = rows
                        .iter()
                        .map(|r| {
                            let mut d = vec![0u8; n / 32 * u.block_bytes];
                            (u.unpack)(n, r, &mut d);
                            d
                        })
                        .collect();
                    let refs_u: Vec<&[u8]> = unp.iter().map(|v| v.as_slice()).collect();
                    let mut o = vec![[0f32; MAX_COLS]; 4];
                    (u.rows)(ty, n, &refs_u, &refs[..cols], &mut o);
                    let mut o2 = vec![[0f32; MAX_COLS]; 2];
                    (u.rows)(ty, n, &refs_u[2..], &refs[..cols], &mut o2);
                    for (i, r) in rows.iter().enumerate() {
                        let (mut want, mut got) = (vec![0f32; cols], vec![0f32; cols]);
                        (k.dot)(ty, n, r, &refs[..cols], &mut want);
                        (u.dot)(ty, n, &unp[i], &refs[..cols], &mut got);
                        assert_eq!(got, want, "{ty:?} unpacked row {i}, {cols} columns");
                        assert_eq!(&o[i][..cols], &want[..], "{ty:?} unpacked 4-row kernel, row {i}");
                        if i >= 2 {
                            assert_eq!(&o2[i - 2][..cols], &want[..], "{ty:?} unpacked 2-row kernel");
                        }
                    }
                }
                for c in 0..cols {
                    // f32 accumulation of ~n products of magnitude ≤ scale: relative error a few
                    // ulps times sqrt(blocks); 1e-5 of the largest result is well above that.
                    let err = (out[c] as f64 - expect[c]).abs();
                    assert!(
                        err <= 1e-5 * scale,
                        "{ty:?} {path:?} cols={cols} c={c}: {} vs {}",
                        out[c],
                        expect[c]
                    );
                }
            }
        }
    }
}

#[test]
fn q8_activation_rounds_half_to_even_with_scale_127_over_amax() {
    let mut x = [0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -3.5;
    let mut q = [0u8; ACT_Q8_1];
    quantize_act(GgmlType::Q8_1, &x, &mut q);
    assert_eq!(q[8] as i8, 127);
    assert_eq!(q[9] as i8, 2);
    assert_eq!(q[10] as i8, -4);
    assert_eq!(f32::from_le_bytes(q[4..8].try_into().unwrap()), 125.0);
}

#[test]
fn vector_and_scalar_activation_quantization_agree() {
    let mut seed = 3u64;
    // NEON quantizes with ARM's `1/d` scale (checked against ggml's in tests/neon_oracle.rs).
    let q8 = if KernelPath::detect() == KernelPath::Neon {
        &[][..]
    } else {
        &[GgmlType::Q8_0, GgmlType::Q8_1][..]
    };
    for &act in q8 {
        let x: Vec<f32> = (0..256)
            .map(|i| lcg(&mut seed) * if i % 7 == 0 { 100.0 } else { 1.0 })
            .collect();
        let mut fast = vec![0u8; act_row_bytes(act, 256)];
        quantize_act(act, &x, &mut fast);
        // The scalar path, by hand.
        let bs = if act == GgmlType::Q8_0 { ACT_Q8_0 } else { ACT_Q8_1 };
        for (b, xs) in fast.chunks_exact(bs).zip(x.chunks_exact(32)) {
            let (d, s, q) = q8_block(xs);
            assert_eq!(
                f32::from_le_bytes(b[0..4].try_into().unwrap()),
                crate::fp::f16_to_f32(crate::fp::f32_to_f16(d))
            );
            let off = bs - 32;
            assert_eq!(b[off..].iter().map(|&v| v as i8).collect::<Vec<_>>(), q.to_vec());
            if act == GgmlType::Q8_1 {
                let sv = crate::fp::f16_to_f32(crate::fp::f32_to_f16(d * s as f32));
                assert_eq!(f32::from_le_bytes(b[4..8].try_into().unwrap()), sv);
            }
        }
    }
    // Q8_K: the vector path's bytes equal quantize_row_q8_K_ref's (the codec), including a block
    // of zeros, a block whose extremes tie in magnitude with opposite signs (the first sets the
    // scale's sign), and values landing on .5 after scaling.
    let mut x: Vec<f32> = (0..1024).map(|_| lcg(&mut seed) * 3.0).collect();
    x[256..512].fill(0.0);
    x[520] = -4.0;
    x[700] = 4.0;
    for (i, v) in x[768..].iter_mut().enumerate() {
        *v = (i as f32 - 128.0) * 0.5;
    }
    let mut fast = vec![0u8; act_row_bytes(GgmlType::Q8_K, 1024)];
    quantize_act(GgmlType::Q8_K, &x, &mut fast);
    let want = crate::quantize(GgmlType::Q8_K, &x, 1024, None).unwrap();
    assert_eq!(fast, want);
}
