//! One test body per op, generic over the backend, checked against a scalar reference computed
//! in f64 on the host (llama.cpp's `test-backend-ops`): every compiled-in backend runs the same
//! bodies (today the CPU; the CUDA backend calls them with its own `B`). Tolerances are bounds
//! derived from the roundings the op is allowed (activation quantization, f16 storage), so a
//! wrong index or a wrong formula fails.

use super::{AttnLayer, Backend, DeltaNetLayer, KvType, QkNorm, Rope, StepPlan, StepSeq, WeightSource};
use crate::model::{KvLayer, RecurrentLayer};
use gguf::GgmlType;
use std::sync::Arc;

mod attention;
mod moe;
mod sample;
pub use attention::{
    attention, attention_decode_step, attention_decode_step_of, rope, rope_store_kv, rope_store_kv_heads,
};
pub use moe::moe;
pub use sample::{sample_rows, top_rows};

/// Deterministic values in (-1, 1), different per seed.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect()
}

/// Weights written to a temporary GGUF and loaded through the backend, as a model loads them.
pub struct Weights {
    pub model: Arc<gguf::GgufModel>,
    _dir: tempfile::TempDir,
}

impl Weights {
    /// `(name, type, [cols, rows], f32 values)` each quantized to its type.
    pub fn new(specs: &[(&str, GgmlType, [usize; 2], &[f32])]) -> Weights {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.gguf");
        let ts: Vec<gguf::writer::TensorSpec> = specs
            .iter()
            .map(|(n, ty, s, _)| gguf::writer::TensorSpec {
                name: n.to_string(),
                ty: *ty,
                shape: if s[1] == 1 {
                    vec![s[0] as u64]
                } else {
                    vec![s[0] as u64, s[1] as u64]
                },
            })
            .collect();
        let mut w = gguf::writer::GgufWriter::create(&path, &gguf::Metadata::new(), &ts).unwrap();
        for (_, ty, s, v) in specs {
            w.write_tensor(&quant::quantize(*ty, v, s[0], None).unwrap()).unwrap();
        }
        w.finish().unwrap();
        Weights {
            model: Arc::new(gguf::GgufModel::open(&path).unwrap()),
            _dir: dir,
        }
    }

    pub fn load<B: Backend>(&self, b: &B, name: &str, matmul_only: bool) -> B::Weight {
        let (file, info) = self.model.tensor(name).unwrap();
        b.load_weight(WeightSource {
            name,
            ty: info.ty,
            shape: &info.shape,
            data: file.tensor_data(info),
            matmul_only,
            owner: self.model.clone(),
        })
        .unwrap()
    }

    /// The stored values (after quantization), as f32.
    pub fn stored(&self, name: &str) -> Vec<f32> {
        let (file, info) = self.model.tensor(name).unwrap();
        quant::dequantize(info.ty, file.tensor_data(info), info.n_elements() as usize).unwrap()
    }
}

fn buf<B: Backend>(b: &B, rows: usize, cols: usize, data: &[f32]) -> B::Buf {
    let mut x = b.alloc(rows, cols);
    b.write(&mut x, rows, cols, data);
    x
}

fn assert_close(what: &str, got: &[f32], want: &[f64], bound: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = bound(i);
        assert!(
            (g as f64 - w).abs() <= tol,
            "{what}: element {i}: {g} vs {w} (bound {tol:.3e})"
        );
    }
}

/// The types a backend multiplies, and the relative rounding its activations get for each.
const MATMUL_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

/// `out = x · Wᵀ` for every weight type and batch sizes around the backends' tile edges, against
/// the exact product of the stored weights with the f32 activations. The bound is what rounding
/// the activations to the dot type can change, summed with the weights' magnitudes: for block
/// types, half a quantization step (block max / 254, /2·127 levels) per element; for F16 / BF16,
/// 2^-11 / 2^-8 relative; plus f32 accumulation (1e-5 of Σ|w·x|).
/// Shapes: 512-wide rows, 4096-wide ones (long enough for every kernel's row grouping: the CUDA
/// matrix-vector kernels read Q3_K / Q6_K rows in groups of 2,048 values), and matrices of more
/// rows (the CUDA kernels spread a matrix of up to 2,048 rows over four warps per row, up to 4,096
/// over two, larger ones one).
pub fn matmul<B: Backend>(b: &B) {
    for (n, m, batches) in [
        (512, 24, &[1, 3, 8, 17, 40][..]),
        (4096, 8, &[1, 5, 12][..]),
        (1024, 2100, &[1, 2][..]),
        (512, 4100, &[1][..]),
    ] {
        matmul_shape(b, n, m, batches);
    }
}

fn matmul_shape<B: Backend>(b: &B, n: usize, m: usize, batches: &[usize]) {
    for &ty in MATMUL_TYPES {
        if quant::dot::vec_dot_type(ty).is_none() {
            continue;
        }
        let wv = values(n * m, ty as u64 + 1);
        let ws = Weights::new(&[("w", ty, [n, m], &wv)]);
        let w = ws.load(b, "w", true);
        let stored = ws.stored("w");
        let act = quant::dot::vec_dot_type(ty).unwrap();
        for &t in batches {
            let xv = values(t * n, 100 + t as u64);
            let x = buf(b, t, n, &xv);
            let mut out = b.alloc(t, m);
            b.run(|| b.matmul(&w, &x, &mut out));
            assert_eq!(b.shape(&out), (t, m));
            let got = b.read(&out);
            let mut want = Vec::with_capacity(t * m);
            let mut bounds = Vec::with_capacity(t * m);
            for r in 0..t {
                let xr = &xv[r * n..(r + 1) * n];
                for o in 0..m {
                    let wr = &stored[o * n..(o + 1) * n];
                    want.push(wr.iter().zip(xr).map(|(&a, &c)| a as f64 * c as f64).sum::<f64>());
                    let mag: f64 = wr.iter().zip(xr).map(|(&a, &c)| (a as f64 * c as f64).abs()).sum();
                    let act_err = match act {
                        GgmlType::F32 => 0.0,
                        GgmlType::F16 => mag * 2f64.powi(-11),
                        GgmlType::BF16 => mag * 2f64.powi(-8),
                        _ => {
                            let blk = if act == GgmlType::Q8_K { 256 } else { 32 };
                            (0..n / blk)
                                .map(|k| {
                                    let r = k * blk..(k + 1) * blk;
                                    let amax = xr[r.clone()].iter().fold(0f32, |a, &v| a.max(v.abs())) as f64;
                                    let wsum: f64 = wr[r].iter().map(|&v| (v as f64).abs()).sum();
                                    wsum * amax / 254.0 * 1.01
                                })
                                .sum()
                        }
                    };
                    bounds.push(act_err + 1e-5 * mag + 1e-6);
                }
            }
            assert_close(&format!("matmul {} n={n} t={t}", ty.name()), &got, &want, |i| bounds[i]);
        }
    }
}

/// The fused FFN input (`norm_glu`) against the plain ops it stands for, on the same backend, for
/// every weight type with fused kernels and one without (Q8_0: the plain sequence), decode rows
/// alone, several sequences' rows together (runs of 1) and a prompt's run (the plain path). It
/// applies the norm's 1/rms to the sums instead of to the activations, so it is within 1e-5 of
/// Σ|w·xn| (f32 roundings of the reordered products; the sums themselves are of up to 4,096
/// terms) plus 1e-6, through the GLU by its slope (|silu'|, |gelu'| < 1.2), plus the gated
/// value's own rounding. Returns how many of the cases the backend fused.
pub fn fused_products<B: Backend>(b: &B) -> usize {
    use crate::model::blocks::Glu;
    let (eps, mut fused) = (1e-5f32, 0);
    for (n, m) in [(512, 32), (4096, 96)] {
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0] {
            let (gv, uv) = (values(n * m, 2), values(n * m, 3));
            let nv: Vec<f32> = values(n, 5).iter().map(|v| 1.0 + v / 2.0).collect();
            let ws = Weights::new(&[
                ("g", ty, [n, m], &gv),
                ("u", ty, [n, m], &uv),
                ("norm", GgmlType::F32, [n, 1], &nv),
            ]);
            let [g, u] = ["g", "u"].map(|k| ws.load(b, k, true));
            let norm_w = ws.load(b, "norm", false);
            let norm = super::Norm { w: &norm_w, eps };
            for (rows, runs) in [
                (1, vec![1]),
                (3, vec![3]),
                (5, vec![1; 5]),
                (8, vec![8]),
                (12, vec![12]),
            ] {
                let what = format!("{} n={n} m={m} rows={rows} runs={runs:?}", ty.name());
                let xv: Vec<f32> = values(rows * n, 6 + rows as u64).iter().map(|v| v * 3.0).collect();
                let mut x = buf(b, rows, n, &xv);
                b.set_runs(&mut x, &runs);
                fused += b.fuses_products(&[&g, &u], &x) as usize;
                let mut xn = b.alloc(rows, n);
                b.run(|| b.rms_norm(&x, &norm_w, eps, &mut xn));
                let xn_host = b.read(&xn);
                // What the products multiply (in f64, from the plain norm) and each output's Σ|w·xn|.
                let mag = |wt: &[f32]| -> Vec<f64> {
                    (0..rows)
                        .flat_map(|r| {
                            let xr = &xn_host[r * n..(r + 1) * n];
                            (0..m).map(move |o| {
                                wt[o * n..(o + 1) * n]
                                    .iter()
                                    .zip(xr)
                                    .map(|(&a, &c)| (a as f64 * c as f64).abs())
                                    .sum()
                            })
                        })
                        .collect()
                };
                let (sg, su) = (mag(&ws.stored("g")), mag(&ws.stored("u")));
                // norm_glu against rms_norm, matmul_many and swiglu / geglu.
                for glu in [Glu::Swiglu, Glu::Geglu] {
                    let (mut pg, mut pu, mut pa) = (b.alloc(rows, m), b.alloc(rows, m), b.alloc(rows, m));
                    let (mut tn, mut tg, mut tu, mut fa) =
                        (b.alloc(rows, n), b.alloc(rows, m), b.alloc(rows, m), b.alloc(rows, m));
                    b.run(|| {
                        b.matmul_many(&[&g, &u], &xn, &mut [&mut pg, &mut pu]);
                        match glu {
                            Glu::Swiglu => b.swiglu(&pg, &pu, &mut pa),
                            Glu::Geglu => b.geglu(&pg, &pu, &mut pa),
                        }
                        b.norm_glu(&x, norm, [&g, &u], glu, (&mut tn, &mut tg, &mut tu), &mut fa);
                    });
                    let (gh, uh) = (b.read(&pg), b.read(&pu));
                    let want: Vec<f64> = b.read(&pa).iter().map(|&v| v as f64).collect();
                    assert_eq!(b.shape(&fa), (rows, m), "norm_glu {what}: shape");
                    assert_close(&format!("norm_glu {glu:?} {what}"), &b.read(&fa), &want, |i| {
                        let (a, c) = (gh[i] as f64, uh[i] as f64);
                        let silu = (a / (1.0 + (-a).exp())).abs();
                        // Each product's error through the GLU (gate's by the slope, up's by the
                        // gate's value, at most |a|), and the gated value's own f32 roundings.
                        1e-5 * (sg[i] * 1.2 * c.abs() + su[i] * (silu + a.abs())) + 1e-5 * want[i].abs() + 1e-6
                    });
                }
                // add_norm_glu against add then norm_glu: the same bits of x and of the output
                // (the sums rounded alike, then the same products).
                let yv = values(rows * n, 7 + rows as u64);
                let y = buf(b, rows, n, &yv);
                let (mut xa, mut xb) = (buf(b, rows, n, &xv), buf(b, rows, n, &xv));
                b.set_runs(&mut xa, &runs);
                b.set_runs(&mut xb, &runs);
                let (mut fa, mut fb) = (b.alloc(rows, m), b.alloc(rows, m));
                let (mut tn, mut tg, mut tu) = (b.alloc(rows, n), b.alloc(rows, m), b.alloc(rows, m));
                b.run(|| {
                    b.add(&mut xb, &y);
                    b.norm_glu(&xb, norm, [&g, &u], Glu::Swiglu, (&mut tn, &mut tg, &mut tu), &mut fb);
                    b.add_norm_glu(
                        &mut xa,
                        &y,
                        norm,
                        [&g, &u],
                        Glu::Swiglu,
                        (&mut tn, &mut tg, &mut tu),
                        &mut fa,
                    );
                });
                let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
                assert!(bits(b.read(&xa)) == bits(b.read(&xb)), "add_norm_glu {what}: x differs");
                assert!(
                    bits(b.read(&fa)) == bits(b.read(&fb)),
                    "add_norm_glu {what}: the output differs"
                );
            }
        }
    }
    fused
}

/// `matmul_many` and `matmul_each` give exactly what separate `matmul` calls give.
pub fn matmul_groups<B: Backend>(b: &B) {
    let n = 256;
    let (a, c) = (values(n * 16, 1), values(n * 8, 2));
    let ws = Weights::new(&[
        ("a", GgmlType::Q4_K, [n, 16], &a),
        ("c", GgmlType::Q8_0, [n, 8], &c),
        ("d", GgmlType::Q4_K, [n, 24], &values(n * 24, 3)),
        ("e", GgmlType::Q4_K, [n, 40], &values(n * 40, 4)),
        ("f", GgmlType::Q8_0, [n, 12], &values(n * 12, 5)),
        ("g", GgmlType::BF16, [n, 8], &values(n * 8, 6)),
        ("h", GgmlType::BF16, [n, 20], &values(n * 20, 9)),
        ("i", GgmlType::Q6_K, [n, 40], &values(n * 40, 10)),
        ("j", GgmlType::Q6_K, [n, 8], &values(n * 8, 11)),
    ]);
    let (wa, wc) = (ws.load(b, "a", true), ws.load(b, "c", true));
    // (Q6_K weights among the Q4_K ones: on CUDA one-row launches take both types, Q4_K's first:
    // a, d, i, then e, j.)
    let more: Vec<B::Weight> = ["i", "d", "j", "e", "f", "g", "h"]
        .iter()
        .map(|w| ws.load(b, w, true))
        .collect();
    for t in [1, 5, 33] {
        let x = buf(b, t, n, &values(t * n, 7));
        let y = buf(b, t + 1, n, &values((t + 1) * n, 8));
        let (mut ra, mut rc, mut ry) = (b.alloc(t, 16), b.alloc(t, 8), b.alloc(t + 1, 16));
        b.run(|| {
            b.matmul(&wa, &x, &mut ra);
            b.matmul(&wc, &x, &mut rc);
            b.matmul(&wa, &y, &mut ry);
        });
        let (mut ga, mut gc, mut gy) = (b.alloc(t, 16), b.alloc(t, 8), b.alloc(t + 1, 16));
        b.run(|| b.matmul_many(&[&wa, &wc], &x, &mut [&mut ga, &mut gc]));
        assert_eq!(b.read(&ga), b.read(&ra), "matmul_many a, t={t}");
        assert_eq!(b.read(&gc), b.read(&rc), "matmul_many c, t={t}");
        b.run(|| b.matmul_each(&mut [(&wa, &x, &mut ga), (&wa, &y, &mut gy), (&wc, &x, &mut gc)]));
        assert_eq!(b.read(&ga), b.read(&ra), "matmul_each a·x, t={t}");
        assert_eq!(b.read(&gy), b.read(&ry), "matmul_each a·y, t={t}");
        assert_eq!(b.read(&gc), b.read(&rc), "matmul_each c·x, t={t}");
        // Several weights of one type (which the CUDA backend multiplies in one launch) mixed
        // with others: each product as it comes alone.
        let all: Vec<&B::Weight> = [&wa, &wc].into_iter().chain(more.iter()).collect();
        let alone: Vec<Vec<f32>> = all
            .iter()
            .map(|w| {
                let mut o = b.alloc(t, b.weight_shape(w)[1] as usize);
                b.run(|| b.matmul(w, &x, &mut o));
                b.read(&o)
            })
            .collect();
        let mut outs: Vec<B::Buf> = all.iter().map(|w| b.alloc(t, b.weight_shape(w)[1] as usize)).collect();
        b.run(|| b.matmul_many(&all, &x, &mut outs.iter_mut().collect::<Vec<_>>()));
        for (i, (o, want)) in outs.iter().zip(&alone).enumerate() {
            assert!(b.read(o) == *want, "matmul_many of nine, product {i}, t={t}");
        }
        // A weight that is also looked up by row (a tied embedding: kept as stored, and laid out
        // for products on the side) multiplies as one that is only multiplied (which a backend may
        // keep in a layout of its own: the CPU's sums run in another order, hence 1e-4 of the
        // largest output; a layout fault would be off by whole values).
        for name in ["a", "c"] {
            let (tied, only) = (ws.load(b, name, false), ws.load(b, name, true));
            let m = b.weight_shape(&only)[1] as usize;
            let (mut p, mut q) = (b.alloc(t, m), b.alloc(t, m));
            b.run(|| {
                b.matmul(&tied, &x, &mut p);
                b.matmul(&only, &x, &mut q);
            });
            let (p, q) = (b.read(&p), b.read(&q));
            let bound = 1e-4 * q.iter().fold(0f32, |a, v| a.max(v.abs())) + 1e-6;
            let worst = p.iter().zip(&q).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            assert!(worst <= bound, "weight {name} kept for lookups, t={t}: off by {worst}");
        }
    }
}

/// A sequence's rows come out the same whatever shares the step: decode rows (one per sequence,
/// `set_runs`) multiplied together equal each row multiplied alone, bit for bit, with and without
/// an rms_norm or a SwiGLU before the product (which the CUDA backend fuses with quantizing the
/// activations); and the product after either equals the product of its output read back and
/// written into a fresh buffer.
pub fn matmul_rows_alone<B: Backend>(b: &B) {
    // Rows of 4 and of 16 units of 256 values (on CUDA each of a tile's four warps takes one, or
    // four).
    for n in [1024, 4096] {
        rows_alone(b, n);
    }
}

fn rows_alone<B: Backend>(b: &B, n: usize) {
    let (m, t) = (98, 40);
    let gv = values(n, 11);
    for &ty in MATMUL_TYPES {
        if quant::dot::vec_dot_type(ty).is_none() {
            continue;
        }
        let wv = values(n * m, ty as u64 + 50);
        let ws = Weights::new(&[("w", ty, [n, m], &wv), ("g", GgmlType::F32, [n, 1], &gv)]);
        let (w, g) = (ws.load(b, "w", true), ws.load(b, "g", false));
        let xv = values(t * n, 77);
        // op 0: the product alone; 1: after rms_norm; 2: after SwiGLU; 3: after a residual add
        // and rms_norm. `copy`: the op's output read back and written into a fresh buffer first.
        let product = |rows: &[f32], k: usize, op: u8, copy: bool| {
            let mut x = buf(b, k, n, rows);
            b.set_runs(&mut x, &vec![1; k]);
            let y = buf(b, k, n, rows);
            let (mut xn, mut out) = (b.alloc(k, n), b.alloc(k, m));
            b.run(|| match op {
                0 => b.matmul(&w, &x, &mut out),
                1 => b.rms_norm(&x, &g, 1e-6, &mut xn),
                2 => b.swiglu(&x, &x, &mut xn),
                _ => b.add_rms_norm(&mut x, &y, &g, 1e-6, &mut xn),
            });
            if op > 0 {
                if copy {
                    let v = b.read(&xn);
                    xn = buf(b, k, n, &v);
                    b.set_runs(&mut xn, &vec![1; k]);
                }
                b.run(|| b.matmul(&w, &xn, &mut out));
            }
            b.read(&out)
        };
        for op in 0..4 {
            let all = product(&xv, t, op, false);
            if op > 0 {
                let copied = product(&xv, t, op, true);
                assert!(copied == all, "{} n={n} op={op}: the fused product differs", ty.name());
            }
            for r in 0..t {
                let one = product(&xv[r * n..(r + 1) * n], 1, op, false);
                assert!(
                    one == all[r * m..(r + 1) * m],
                    "{} n={n} op={op}: row {r} of {t} differs from the row alone",
                    ty.name()
                );
            }
        }
    }
}

fn rms_ref(x: &[f32], w: Option<&[f32]>, eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps as f64).sqrt();
    x.iter()
        .enumerate()
        .map(|(i, &v)| v as f64 * s * w.map_or(1.0, |w| w[i] as f64))
        .collect()
}

/// RMS norm with a weight, per row and per head (with and without a weight), and layer norm.
pub fn norms<B: Backend>(b: &B) {
    let (rows, n, hd, eps) = (5, 256, 64, 1e-6f32);
    let wv = values(n, 3);
    let hv = values(hd, 4);
    let bv = values(n, 5);
    let ws = Weights::new(&[
        ("w", GgmlType::F32, [n, 1], &wv),
        ("h", GgmlType::F32, [hd, 1], &hv),
        ("b", GgmlType::F32, [n, 1], &bv),
    ]);
    let (w, h, bias) = (ws.load(b, "w", false), ws.load(b, "h", false), ws.load(b, "b", false));
    let xv: Vec<f32> = values(rows * n, 6).iter().map(|v| v * 4.0).collect();
    let x = buf(b, rows, n, &xv);
    let rel = |want: &[f64]| {
        let w = want.to_vec();
        move |i: usize| 1e-5 * w[i].abs() + 1e-6
    };
    let mut out = b.alloc(rows, n);
    b.run(|| b.rms_norm(&x, &w, eps, &mut out));
    let want: Vec<f64> = xv.chunks(n).flat_map(|r| rms_ref(r, Some(&wv), eps)).collect();
    assert_close("rms_norm", &b.read(&out), &want, rel(&want));
    // The residual add and norm in one call: the same as the two, bit for bit (decode rows and a
    // prefill's).
    for r in [rows, 70] {
        let (av, yv) = (values(r * n, 12), values(r * n, 13));
        let (mut x1, mut x2, y) = (buf(b, r, n, &av), buf(b, r, n, &av), buf(b, r, n, &yv));
        let (mut o1, mut o2) = (b.alloc(r, n), b.alloc(r, n));
        b.run(|| {
            b.add(&mut x1, &y);
            b.rms_norm(&x1, &w, eps, &mut o1);
            b.add_rms_norm(&mut x2, &y, &w, eps, &mut o2);
        });
        assert!(b.read(&x2) == b.read(&x1), "add_rms_norm's sum, {r} rows");
        assert!(b.read(&o2) == b.read(&o1), "add_rms_norm's norm, {r} rows");
    }
    for weighted in [true, false] {
        let mut y = buf(b, rows, n, &xv);
        b.run(|| b.head_rms_norm(&mut y, weighted.then_some(&h), hd, eps));
        let want: Vec<f64> = xv
            .chunks(hd)
            .flat_map(|r| rms_ref(r, weighted.then_some(&hv[..]), eps))
            .collect();
        assert_close(
            &format!("head_rms_norm weighted={weighted}"),
            &b.read(&y),
            &want,
            rel(&want),
        );
    }
    b.run(|| b.layer_norm(&x, &w, &bias, eps, &mut out));
    let want: Vec<f64> = xv
        .chunks(n)
        .flat_map(|r| {
            let mean = r.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let var = r.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
            let s = 1.0 / (var + eps as f64).sqrt();
            r.iter().map(move |&v| (v as f64 - mean) * s).collect::<Vec<_>>()
        })
        .enumerate()
        .map(|(i, v)| v * wv[i % n] as f64 + bv[i % n] as f64)
        .collect();
    assert_close("layer_norm", &b.read(&out), &want, rel(&want));
}

/// Element-wise ops: GLUs (the tanh GELU through ggml's f16 table: input and output rounded to
/// f16, 2^-10 relative plus the table's slope), GELU, soft-cap, scale, mul, bias, add.
pub fn elementwise<B: Backend>(b: &B) {
    let (rows, n) = (3, 96);
    let g: Vec<f32> = values(rows * n, 11).iter().map(|v| v * 12.0).collect();
    let u = values(rows * n, 12);
    let (gb, ub) = (buf(b, rows, n, &g), buf(b, rows, n, &u));
    let mut out = b.alloc(rows, n);
    let gelu = |x: f64| 0.5 * x * (1.0 + (0.797_884_560_802_865_4 * x * (1.0 + 0.044715 * x * x)).tanh());
    let silu = |x: f64| x / (1.0 + (-x).exp());
    b.run(|| b.swiglu(&gb, &ub, &mut out));
    let want: Vec<f64> = g.iter().zip(&u).map(|(&a, &c)| silu(a as f64) * c as f64).collect();
    assert_close("swiglu", &b.read(&out), &want, |i| 1e-5 * want[i].abs() + 1e-6);
    b.run(|| b.geglu(&gb, &ub, &mut out));
    let want: Vec<f64> = g.iter().zip(&u).map(|(&a, &c)| gelu(a as f64) * c as f64).collect();
    // f16 input rounding moves x by ≤ 2^-11|x| (slope ≤ 1.13), the f16 output by 2^-11.
    let tol =
        |i: usize| (g[i].abs() as f64 * 1.13 + gelu(g[i] as f64).abs()) * 2f64.powi(-11) * u[i].abs() as f64 + 1e-6;
    assert_close("geglu", &b.read(&out), &want, tol);
    let mut x = buf(b, rows, n, &g);
    b.run(|| b.gelu_tanh(&mut x));
    let want: Vec<f64> = g.iter().map(|&a| gelu(a as f64)).collect();
    assert_close("gelu_tanh", &b.read(&x), &want, |i| {
        (g[i].abs() as f64 * 1.13 + want[i].abs()) * 2f64.powi(-11) + 1e-6
    });
    let mut x = buf(b, rows, n, &g);
    b.run(|| b.softcap(&mut x, 5.0));
    let want: Vec<f64> = g.iter().map(|&a| (a as f64 / 5.0).tanh() * 5.0).collect();
    assert_close("softcap", &b.read(&x), &want, |_| 1e-5);
    let mut x = buf(b, rows, n, &g);
    b.run(|| {
        b.scale(&mut x, 0.5);
        b.mul(&mut x, &ub);
        b.add(&mut x, &ub);
    });
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&a, &c)| (a as f64 * 0.5) * c as f64 + c as f64)
        .collect();
    assert_close("scale, mul, add", &b.read(&x), &want, |i| 1e-6 * want[i].abs() + 1e-6);
    let wv = values(n, 13);
    let ws = Weights::new(&[("w", GgmlType::F32, [n, 1], &wv)]);
    let w = ws.load(b, "w", false);
    let mut x = buf(b, rows, n, &g);
    b.run(|| {
        b.mul_row(&mut x, &w);
        b.add_bias(&mut x, &w);
    });
    let want: Vec<f64> = g
        .iter()
        .enumerate()
        .map(|(i, &a)| a as f64 * wv[i % n] as f64 + wv[i % n] as f64)
        .collect();
    assert_close("mul_row, add_bias", &b.read(&x), &want, |i| 1e-6 * want[i].abs() + 1e-6);
}

/// Row moves: embedding lookup for several table types, selecting, scattering and the MoE's
/// weighted sum in slot order.
pub fn rows<B: Backend>(b: &B) {
    let (n, v) = (64, 10);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K] {
        let n = if ty == GgmlType::Q4_K { 256 } else { n };
        let tv = values(n * v, 20 + ty as u64);
        let ws = Weights::new(&[("t", ty, [n, v], &tv)]);
        let t = ws.load(b, "t", false);
        let stored = ws.stored("t");
        let ids = [3u32, 0, 9, 3];
        let mut out = b.alloc(ids.len(), n);
        b.get_rows(&t, &ids, &mut out).unwrap();
        let want: Vec<f64> = ids
            .iter()
            .flat_map(|&i| stored[i as usize * n..(i as usize + 1) * n].iter().map(|&x| x as f64))
            .collect();
        assert_close(&format!("get_rows {}", ty.name()), &b.read(&out), &want, |_| 0.0);
        let mut bad = b.alloc(1, n);
        assert!(
            b.get_rows(&t, &[v as u32], &mut bad).is_err(),
            "get_rows past the table"
        );
    }
    let xv = values(6 * n, 30);
    let x = buf(b, 6, n, &xv);
    let mut sel = b.alloc(3, n);
    b.select_rows(&x, &[5, 0, 2], &mut sel);
    let want: Vec<f64> = [5, 0, 2]
        .iter()
        .flat_map(|&r| xv[r * n..(r + 1) * n].iter().map(|&v| v as f64))
        .collect();
    assert_close("select_rows", &b.read(&sel), &want, |_| 0.0);
    let mut dst = buf(b, 6, n, &vec![0.0; 6 * n]);
    b.scatter_rows(&sel, &[1, 4, 3], &mut dst);
    let got = b.read(&dst);
    for (i, &r) in [1usize, 4, 3].iter().enumerate() {
        let src = [5usize, 0, 2][i];
        assert_eq!(
            &got[r * n..(r + 1) * n],
            &xv[src * n..(src + 1) * n],
            "scatter_rows row {r}"
        );
    }
    assert!(got[..n].iter().all(|&v| v == 0.0), "scatter_rows left row 0 alone");
    let weights = [0.25f32, 0.75, 0.5, -1.0, 2.0, 0.125];
    let mut sum = b.alloc(3, n);
    b.weighted_sum_rows(&x, &weights, 2, &mut sum);
    let xv = &xv;
    let want: Vec<f64> = (0..3)
        .flat_map(|t| {
            (0..n).map(move |j| {
                let a = (xv[2 * t * n + j] * weights[2 * t]) as f64;
                let c = (xv[(2 * t + 1) * n + j] * weights[2 * t + 1]) as f64;
                a + c
            })
        })
        .collect();
    assert_close("weighted_sum_rows", &b.read(&sum), &want, |i| {
        1e-7 * want[i].abs() + 1e-7
    });
}

/// A step over sequences of (first position, rows), with token id 0 everywhere.
pub fn plan(seqs: &[(usize, usize)]) -> StepPlan {
    let mut row0 = 0;
    let mut p = StepPlan::default();
    for &(pos0, rows) in seqs {
        p.seqs.push(StepSeq {
            row0,
            rows,
            pos0,
            alone: false,
        });
        p.positions.extend(pos0..pos0 + rows);
        p.ids.extend(std::iter::repeat_n(0, rows));
        row0 += rows;
    }
    p
}

/// The encoders' ops: exact (erf) GELU, and bidirectional attention over f32 Q/K/V rows of a
/// batch of sequences (each row over its own sequence's rows, per head). f32 arithmetic: bounds
/// 1e-5 relative (GELU: libm's erf against f64's) and 2e-5 relative for attention.
pub fn encoder_ops<B: Backend>(b: &B) {
    let (rows, n) = (5, 40);
    let g: Vec<f32> = values(rows * n, 21).iter().map(|v| v * 6.0).collect();
    let mut x = buf(b, rows, n, &g);
    b.run(|| b.gelu(&mut x));
    let erf = |x: f64| libm::erf(x);
    let want: Vec<f64> = g
        .iter()
        .map(|&a| 0.5 * a as f64 * (1.0 + erf(a as f64 / 2f64.sqrt())))
        .collect();
    assert_close("gelu", &b.read(&x), &want, |i| 1e-5 * want[i].abs() + 1e-6);

    let (n_head, hd) = (3, 32);
    let cols = n_head * hd;
    let seqs = [0..7usize, 7..8, 8..20];
    let total = 20;
    let (qv, kv, vv) = (
        values(total * cols, 22),
        values(total * cols, 23),
        values(total * cols, 24),
    );
    let (q, k, v) = (
        buf(b, total, cols, &qv),
        buf(b, total, cols, &kv),
        buf(b, total, cols, &vv),
    );
    let mut out = b.alloc(total, cols);
    b.run(|| b.encoder_attention(&q, &k, &v, &seqs, n_head, 0.25, &mut out));
    let got = b.read(&out);
    for s in &seqs {
        for r in s.clone() {
            for h in 0..n_head {
                let dot = |j: usize| -> f64 {
                    (0..hd)
                        .map(|d| qv[r * cols + h * hd + d] as f64 * kv[j * cols + h * hd + d] as f64)
                        .sum::<f64>()
                        * 0.25
                };
                let sc: Vec<f64> = s.clone().map(dot).collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    let want: f64 = s
                        .clone()
                        .zip(&e)
                        .map(|(j, w)| w * vv[j * cols + h * hd + d] as f64)
                        .sum::<f64>()
                        / z;
                    let g = got[r * cols + h * hd + d] as f64;
                    assert!(
                        (g - want).abs() <= 2e-5 * want.abs().max(0.1),
                        "encoder_attention row {r} head {h} dim {d}: {g} vs {want}"
                    );
                }
            }
        }
    }
}

/// The f64 reference of a Gated DeltaNet layer for one sequence: conv state (kernel - 1 rows of
/// `c` values) and delta state (`nv` heads of `hv` rows of `hk`), as transformers' recurrent form.
struct DeltaRef {
    conv: Vec<f64>,
    m: Vec<f64>,
}

impl DeltaRef {
    fn new(l: &DeltaNetLayer) -> DeltaRef {
        DeltaRef {
            conv: vec![0.0; (l.kernel - 1) * l.conv_dim()],
            m: vec![0.0; l.n_v_heads * l.head_v * l.head_k],
        }
    }

    /// Rows `x` (t × c), gates `al`, `be` (t × nv): the layer's delta outputs (t × nv·hv).
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        l: &DeltaNetLayer,
        w: &[f32],
        dt: &[f32],
        a: &[f32],
        x: &[f32],
        al: &[f32],
        be: &[f32],
    ) -> Vec<f64> {
        let (c, k, nk, nv, hk, hv) = (l.conv_dim(), l.kernel, l.n_k_heads, l.n_v_heads, l.head_k, l.head_v);
        let t = x.len() / c;
        let mut ext: Vec<f64> = self.conv.clone();
        ext.extend(x.iter().map(|&v| v as f64));
        let mut out = Vec::with_capacity(t * nv * hv);
        for r in 0..t {
            let y: Vec<f64> = (0..c)
                .map(|ch| {
                    let s: f64 = (0..k).map(|j| ext[(r + j) * c + ch] * w[ch * k + j] as f64).sum();
                    s / (1.0 + (-s).exp())
                })
                .collect();
            let unit = |v: &[f64], f: f64| -> Vec<f64> {
                let n = (v.iter().map(|x| x * x).sum::<f64>() + l.eps as f64).sqrt();
                v.iter().map(|x| x / n * f).collect()
            };
            for h in 0..nv {
                let kh = h % nk;
                let q = unit(&y[kh * hk..(kh + 1) * hk], 1.0 / (hk as f64).sqrt());
                let kk = unit(&y[(nk + kh) * hk..(nk + kh + 1) * hk], 1.0);
                let v = &y[2 * nk * hk + h * hv..2 * nk * hk + (h + 1) * hv];
                let z = al[r * nv + h] as f64 + dt[h] as f64;
                let sp = if z > 20.0 { z } else { z.exp().ln_1p() };
                let decay = (a[h] as f64 * sp).exp();
                let rate = 1.0 / (1.0 + (-(be[r * nv + h] as f64)).exp());
                for (j, &vj) in v.iter().enumerate() {
                    let row = &mut self.m[(h * hv + j) * hk..(h * hv + j + 1) * hk];
                    row.iter_mut().for_each(|x| *x *= decay);
                    let d = (vj - row.iter().zip(&kk).map(|(x, y)| x * y).sum::<f64>()) * rate;
                    row.iter_mut().zip(&kk).for_each(|(x, y)| *x += d * y);
                    out.push(row.iter().zip(&q).map(|(x, y)| x * y).sum());
                }
            }
        }
        self.conv = ext[t * c..].to_vec();
        out
    }
}

/// The Gated DeltaNet ops (`ssm_conv`, `gated_delta_net`) over two sequences' recurrent states
/// for two steps (a 70-row prompt cut at the chunk end 64 and at kept copies, decode rows, a short
/// run), against the f64 recurrent reference; then copies: a cut-back to a checkpoint and to a
/// page's copy continues exactly as the first pass did, and a page exported with its copy imports
/// into another sequence. Bound: 1e-4 of the largest output of the run (the outputs are ~1e-3 to
/// 7e-2): f32 sums over heads of 64 values (≤ 64·2⁻²⁴ relative each) through at most 72 tokens of
/// a contracting recurrence (decay ≤ 1, rate < 1); the CPU (chunked form for runs) measured 3e-8
/// absolute, 4e-7 of the largest output. A wrong index or formula is off by the outputs' scale.
pub fn recurrent<B: Backend>(b: &B) {
    let l = DeltaNetLayer {
        layer: 0,
        n_k_heads: 2,
        n_v_heads: 4,
        head_k: 64,
        head_v: 64,
        kernel: 4,
        eps: 1e-6,
    };
    let (c, nv, vd) = (l.conv_dim(), l.n_v_heads, l.n_v_heads * l.head_v);
    let r = RecurrentLayer {
        conv_rows: 3,
        conv_dim: c,
        heads: nv,
        head_k: 64,
        head_v: 64,
    };
    let layers = [KvLayer::recurrent(r), KvLayer::own(64, 64, None)];
    let wv = values(4 * c, 900);
    let dtv = values(nv, 901);
    let av: Vec<f32> = values(nv, 902).iter().map(|v| -0.1 - v.abs()).collect();
    let ws = Weights::new(&[
        ("conv", GgmlType::F32, [4, c], &wv),
        ("dt", GgmlType::F32, [nv, 1], &dtv),
        ("a", GgmlType::F32, [nv, 1], &av),
    ]);
    let (w, dt, a) = (
        ws.load(b, "conv", false),
        ws.load(b, "dt", false),
        ws.load(b, "a", false),
    );
    let mut kva = b.alloc_kv(&layers, 256, KvType::F16).unwrap();
    let mut kvb = b.kv_sibling(&kva, 256);
    b.kv_reserve(&mut kvb, 256).unwrap();
    // Inputs of the whole run per sequence, one row per position.
    let n = 80;
    let input = |seed: u64| (values(n * c, seed), values(n * nv, seed + 1), values(n * nv, seed + 2));
    let (ins_a, ins_b) = (input(910), input(920));
    let (mut ref_a, mut ref_b) = (DeltaRef::new(&l), DeltaRef::new(&l));
    fn bound(want: &[f64]) -> impl Fn(usize) -> f64 {
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        move |_| 1e-4 * scale + 1e-9
    }
    // Runs a step of (sequence, first position, rows); returns each sequence's outputs.
    let run = |kvs: &mut [&mut B::Kv], seqs: &[(usize, usize, usize)]| -> Vec<Vec<f32>> {
        let rows: usize = seqs.iter().map(|s| s.2).sum();
        let (mut x, mut al, mut be) = (Vec::new(), Vec::new(), Vec::new());
        for &(s, p, t) in seqs {
            let i = if s == 0 { &ins_a } else { &ins_b };
            x.extend_from_slice(&i.0[p * c..(p + t) * c]);
            al.extend_from_slice(&i.1[p * nv..(p + t) * nv]);
            be.extend_from_slice(&i.2[p * nv..(p + t) * nv]);
        }
        let (xb, alb, beb) = (buf(b, rows, c, &x), buf(b, rows, nv, &al), buf(b, rows, nv, &be));
        let (mut conv, mut out) = (b.alloc(rows, c), b.alloc(rows, vd));
        let pl = plan(&seqs.iter().map(|s| (s.1, s.2)).collect::<Vec<_>>());
        let step = b.begin_step(pl, &kvs.iter().map(|k| &**k).collect::<Vec<_>>()).unwrap();
        b.run(|| {
            b.ssm_conv(&xb, &w, &step, kvs, &l, &mut conv);
            b.gated_delta_net(&conv, &alb, &beb, &dt, &a, &step, kvs, &l, &mut out);
        });
        let all = b.read(&out);
        let mut at = 0;
        seqs.iter()
            .map(|s| {
                at += s.2 * vd;
                all[at - s.2 * vd..at].to_vec()
            })
            .collect()
    };
    let reference = |r: &mut DeltaRef, ins: &(Vec<f32>, Vec<f32>, Vec<f32>), p: usize, t: usize| {
        r.step(
            &l,
            &wv,
            &dtv,
            &av,
            &ins.0[p * c..(p + t) * c],
            &ins.1[p * nv..(p + t) * nv],
            &ins.2[p * nv..(p + t) * nv],
        )
    };
    b.kv_keep_states(&mut kva, &[64, 66, 71]);
    let got = run(&mut [&mut kva, &mut kvb], &[(0, 0, 70), (1, 0, 1)]);
    let (wa, wb) = (
        reference(&mut ref_a, &ins_a, 0, 70),
        reference(&mut ref_b, &ins_b, 0, 1),
    );
    assert_close("gated_delta_net step 1, 70 rows", &got[0], &wa, bound(&wa));
    assert_close("gated_delta_net step 1, 1 row", &got[1], &wb, bound(&wb));
    let got = run(&mut [&mut kva, &mut kvb], &[(0, 70, 1), (1, 1, 5)]);
    let (wa1, wb) = (
        reference(&mut ref_a, &ins_a, 70, 1),
        reference(&mut ref_b, &ins_b, 1, 5),
    );
    assert_close("gated_delta_net step 2, decode row", &got[0], &wa1, bound(&wa1));
    assert_close("gated_delta_net step 2, 5 rows", &got[1], &wb, bound(&wb));
    assert_eq!((b.kv_state_pos(&kva), b.kv_state_pos(&kvb)), (Some(71), Some(6)));
    // Back to the checkpoint at 66, then to the page's copy at 64: the same rows come out again.
    assert_eq!(b.kv_restore(&mut kva, 69), 66);
    let again = run(&mut [&mut kva], &[(0, 66, 4)]);
    let want = &wa[66 * vd..70 * vd];
    assert_close("gated_delta_net after a checkpoint", &again[0], want, bound(want));
    assert_eq!(b.kv_restore(&mut kva, 65), 64);
    let page = b.kv_page(&kva, 0);
    let data = b.page_data(&page);
    assert_eq!(
        data.len(),
        b.kv_page_bytes(&kva) + b.kv_state_bytes(&kva),
        "a page exported with its copy"
    );
    let again = run(&mut [&mut kva], &[(0, 64, 2)]);
    let want = &wa[64 * vd..66 * vd];
    assert_close("gated_delta_net after a page's copy", &again[0], want, bound(want));
    // The exported page and copy, imported into another sequence, continue the same way.
    let mut kvc = b.kv_sibling(&kva, 256);
    b.kv_reserve(&mut kvc, 128).unwrap();
    b.kv_import(&mut kvc, 0, &data).unwrap();
    assert_eq!(b.kv_restore(&mut kvc, 64), 64);
    let again = run(&mut [&mut kvc], &[(0, 64, 6)]);
    let want = &wa[64 * vd..70 * vd];
    assert_close("gated_delta_net after an imported page", &again[0], want, bound(want));
    // Nothing kept before 64 on this sequence: a cut to 10 starts over from an empty state.
    assert_eq!(b.kv_restore(&mut kvc, 10), 0);
}

/// `sigmoid_mul` (a gate per value and one per row) and `unzip_heads`: exact up to exp's rounding.
pub fn gates<B: Backend>(b: &B) {
    let (rows, cols) = (3, 8);
    let (xv, gv, g1) = (values(rows * cols, 60), values(rows * cols, 61), values(rows, 62));
    let sig = |g: f32| 1.0 / (1.0 + (-(g as f64)).exp());
    for (g, gc) in [(&gv, cols), (&g1, 1)] {
        let mut x = buf(b, rows, cols, &xv);
        let gb = buf(b, rows, gc, g);
        b.run(|| b.sigmoid_mul(&mut x, &gb));
        let want: Vec<f64> = (0..rows * cols)
            .map(|i| xv[i] as f64 * sig(g[if gc == 1 { i / cols } else { i }]))
            .collect();
        assert_close("sigmoid_mul", &b.read(&x), &want, |i| 1e-6 * want[i].abs() + 1e-7);
    }
    let x = buf(b, rows, cols, &xv);
    let (mut qa, mut qb) = (b.alloc(rows, cols / 2), b.alloc(rows, cols / 2));
    b.run(|| b.unzip_heads(&x, 2, &mut qa, &mut qb));
    let (ga, gb) = (b.read(&qa), b.read(&qb));
    for r in 0..rows {
        for h in 0..2 {
            for k in 0..2 {
                assert_eq!(ga[r * 4 + h * 2 + k], xv[r * 8 + h * 4 + k]);
                assert_eq!(gb[r * 4 + h * 2 + k], xv[r * 8 + h * 4 + 2 + k]);
            }
        }
    }
}

/// Every op body on one backend.
pub fn all<B: Backend>(b: &B) {
    encoder_ops(b);
    matmul(b);
    matmul_groups(b);
    norms(b);
    rope(b);
    elementwise(b);
    rows(b);
    attention(b);
    recurrent(b);
    gates(b);
}

#[cfg(test)]
mod cpu {
    use crate::backend::cpu::Cpu;

    fn cpu() -> Cpu {
        Cpu::new(2).unwrap()
    }

    #[test]
    fn matmul() {
        super::matmul(&cpu());
    }
    #[test]
    fn matmul_groups() {
        super::matmul_groups(&cpu());
    }

    #[test]
    fn matmul_rows_alone() {
        super::matmul_rows_alone(&cpu());
    }
    #[test]
    fn norms() {
        super::norms(&cpu());
    }
    #[test]
    fn fused_products() {
        // The defaults: the plain sequences.
        assert_eq!(super::fused_products(&cpu()), 0);
    }
    #[test]
    fn rope() {
        super::rope(&cpu());
    }
    #[test]
    fn elementwise() {
        super::elementwise(&cpu());
    }
    #[test]
    fn rows() {
        super::rows(&cpu());
    }
    #[test]
    fn top_rows() {
        super::top_rows(&cpu());
    }
    #[test]
    fn sample_rows() {
        super::sample_rows(&cpu());
    }
    #[test]
    fn attention() {
        super::attention(&cpu());
    }
    #[test]
    fn rope_store_kv() {
        super::rope_store_kv(&cpu());
    }
    #[test]
    fn encoder_ops() {
        super::encoder_ops(&cpu());
    }
    #[test]
    fn recurrent() {
        super::recurrent(&cpu());
    }
    #[test]
    fn gates() {
        super::gates(&cpu());
    }
    #[test]
    fn moe() {
        // The CPU routes every step on the host. (Both seeds the CUDA test takes: neither has a
        // row near a routing tie.)
        for seed in [0, 1] {
            assert_eq!(super::moe(&cpu(), seed).0, 0);
        }
    }
    /// The exact-activation mode (encoders) multiplies through its own GEMM path.
    #[test]
    fn matmul_exact_activations() {
        let b = Cpu::new(2).unwrap().with_exact_activations();
        super::matmul(&b);
    }
}

/// Products on `b` follow the CPU backend's numbers. Products the backend makes as integers
/// (`integer(type, rows)`: on CUDA Q8_0, Q4_K and Q6_K through the tensor cores, up to 128 rows of
/// a sequence) see the activations rounded as the CPU's integer products round them and sum the
/// same integers, so each output equals the CPU's up to f32 summation order (bound 1e-5 of
/// Σ|w·x|), for one row, a few and a short prompt's worth. The others' prompt rows (`t` ≥ 9, f16
/// tensor cores; on CUDA also Q4_K and Q8_0 rows of longer prompts, whose weights come back from
/// the integer kernels' layout first) see the CPU's
/// rounded activations, then f16, times the weights decoded to f16: each output equals
/// Σ f16(w)·f16(x') (x' the CPU's rounded activations) up to f32 summation (bound 1e-4 of
/// Σ|terms|); without the activation rounding it would be ~1e-3 off. (A statistical bound against
/// the CPU's own outputs does not hold there: f16 rounding of a block's values that share one scale
/// is correlated.) Matrices of 64 and of 70 rows (a partial tile of 16 on CUDA), rows of 512 and
/// 576 values (Q8_0: a partial unit of 256), and of 4096-4352 (16-17 units).
pub fn matmul_follows_cpu<B: Backend>(b: &B, integer: impl Fn(GgmlType, usize) -> bool) {
    let cpu = super::cpu::Cpu::new(2).unwrap();
    let h = |v: f32| quant::fp::f16_to_f32(quant::fp::f32_to_f16(v)) as f64;
    for (ty, rows, n, m) in [
        (GgmlType::Q8_0, 16, 512, 64),
        (GgmlType::Q4_K, 16, 512, 64),
        (GgmlType::Q6_K, 16, 512, 64),
        (GgmlType::Q4_0, 16, 512, 64),
        (GgmlType::Q8_0, 1, 512, 64),
        (GgmlType::Q8_0, 3, 576, 70),
        (GgmlType::Q4_K, 1, 512, 70),
        (GgmlType::Q4_K, 40, 1024, 70),
        (GgmlType::Q6_K, 5, 512, 70),
        (GgmlType::Q6_K, 70, 512, 64),
        (GgmlType::Q8_0, 33, 576, 64),
        (GgmlType::Q4_K, 200, 512, 70),
        (GgmlType::Q8_0, 150, 576, 64),
        (GgmlType::Q6_K, 140, 512, 70),
        // Long rows (16-17 units of 256 values: four a warp on CUDA).
        (GgmlType::Q4_K, 1, 4096, 70),
        (GgmlType::Q6_K, 3, 4096, 64),
        (GgmlType::Q8_0, 40, 4352, 48),
    ] {
        let wv = values(n * m, ty as u64 + 7);
        let ws = Weights::new(&[("w", ty, [n, m], &wv)]);
        let wd = ws.stored("w");
        let xv: Vec<f32> = values(rows * n, 21).iter().map(|v| v * 3.0).collect();
        // The CPU's rounded activations.
        let act = quant::dot::vec_dot_type(ty).expect("an integer-product type");
        let mut xq = vec![0f32; rows * n];
        for (x, q) in xv.chunks_exact(n).zip(xq.chunks_exact_mut(n)) {
            let mut bytes = vec![0u8; quant::dot::act_row_bytes(act, n)];
            quant::dot::quantize_act(act, x, &mut bytes);
            quant::dot::dequantize_act(act, &bytes, q);
        }
        fn on<C: Backend>(c: &C, ws: &Weights, xv: &[f32], rows: usize, n: usize, m: usize) -> Vec<f32> {
            let w = ws.load(c, "w", true);
            let x = buf(c, rows, n, xv);
            let mut out = c.alloc(rows, m);
            c.run(|| c.matmul(&w, &x, &mut out));
            c.read(&out)
        }
        let cpu_out = on(&cpu, &ws, &xv, rows, n, m);
        let got = on(b, &ws, &xv, rows, n, m);
        let exact = integer(ty, rows);
        for (i, &g) in got.iter().enumerate() {
            let (r, o) = (i / m, i % m);
            let (w, x, xr) = (
                &wd[o * n..(o + 1) * n],
                &xq[r * n..(r + 1) * n],
                &xv[r * n..(r + 1) * n],
            );
            let (want, bound) = if rows >= 9 && !exact {
                let terms = w.iter().zip(x).map(|(&a, &c)| h(a) * h(c));
                let (sum, mag) = terms.fold((0.0, 0.0), |(s, m), t| (s + t, m + t.abs()));
                (sum, 1e-4 * mag + 1e-6)
            } else {
                let mag: f64 = w.iter().zip(xr).map(|(&a, &c)| (a as f64 * c as f64).abs()).sum();
                (cpu_out[i] as f64, 1e-5 * mag + 1e-6)
            };
            assert!(
                (g as f64 - want).abs() <= bound,
                "{} {rows} rows of {n}, {m} outputs, {}: out[{r}, {o}] = {g}, expected {want} (the CPU's {}; bound {bound:.3e})",
                ty.name(),
                b.name(),
                cpu_out[i]
            );
        }
    }
}

/// The same bodies on the CUDA backend (GPU 0). Without a GPU they do not run, and say so.
#[cfg(test)]
pub(crate) mod cuda {
    use crate::backend::cuda::{Cuda, Fused};
    use crate::backend::select::cuda_present;

    /// The backend on GPU 0, or `None` after a visible NOT RUN line for the CUDA op test `what`.
    pub(crate) fn cuda(what: &str) -> Option<Cuda> {
        if !cuda_present() {
            use std::io::Write;
            // Past the harness's output capture, so a green run without a GPU says what it skipped.
            let _ = writeln!(
                std::io::stderr(),
                "NOT RUN: CUDA op test {what} (no NVIDIA GPU or driver on this machine)"
            );
            return None;
        }
        Some(Cuda::new(0).expect("the CUDA backend on a machine with a GPU"))
    }

    #[test]
    fn matmul() {
        if let Some(b) = cuda("matmul") {
            super::matmul(&b);
            // Matrices of few rows spread over two and four warps a row too.
            super::matmul(&b.with_wpr_cap(4));
        }
    }
    #[test]
    fn matmul_pairs() {
        // A warp per pair of rows against a warp per row, bit for bit: the float types, odd and
        // even row counts, rows of n % 8 != 0 (the one-value path), 1 to 8 activation rows, alone
        // and three weights to a launch.
        if let Some(b) = cuda("matmul_pairs") {
            // (One warp a row whatever HF2Q_CUDA_WPR says: the pairs' condition.)
            let b = b.with_pairs(true).with_wpr_cap(1);
            let one = Cuda::new(0)
                .expect("a second CUDA backend")
                .with_pairs(false)
                .with_wpr_cap(1);
            use super::{buf, values, Backend, Weights};
            use gguf::GgmlType as T;
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            for ty in [T::F32, T::F16, T::BF16] {
                for (n, ms) in [
                    (512, [301, 300, 257]),
                    (1001, [1001, 640, 999]),
                    (4096, [4097, 1024, 1024]),
                ] {
                    let ws: Vec<(String, Vec<f32>, usize)> = ms
                        .iter()
                        .enumerate()
                        .map(|(i, &m)| (format!("w{i}"), values(n * m, ty as u64 + 7 * i as u64), m))
                        .collect();
                    let specs: Vec<(&str, T, [usize; 2], &[f32])> = ws
                        .iter()
                        .map(|(name, v, m)| (name.as_str(), ty, [n, *m], v.as_slice()))
                        .collect();
                    let weights = Weights::new(&specs);
                    for t in [1, 3, 8] {
                        let x = values(t * n, 40 + t as u64);
                        let run = |b: &Cuda| {
                            let w: Vec<_> = ws.iter().map(|(name, _, _)| weights.load(b, name, true)).collect();
                            let x = buf(b, t, n, &x);
                            let mut outs: Vec<_> = ms.iter().map(|&m| b.alloc(t, m)).collect();
                            let mut alone = b.alloc(t, ms[0]);
                            b.run(|| {
                                b.matmul(&w[0], &x, &mut alone);
                                let mut refs: Vec<_> = outs.iter_mut().collect();
                                b.matmul_many(&[&w[0], &w[1], &w[2]], &x, &mut refs);
                            });
                            let mut got = vec![bits(b.read(&alone))];
                            got.extend(outs.iter().map(|o| bits(b.read(o))));
                            got
                        };
                        assert!(run(&b) == run(&one), "{ty:?} n={n} m={ms:?} t={t}: pairs differ");
                    }
                }
            }
        }
    }
    #[test]
    fn matmul_follows_cpu() {
        if let Some(b) = cuda("matmul_follows_cpu") {
            use gguf::GgmlType as T;
            super::matmul_follows_cpu(&b, |ty, rows| matches!(ty, T::Q8_0 | T::Q4_K | T::Q6_K) && rows <= 128);
        }
    }
    #[test]
    fn matmul_groups() {
        if let Some(b) = cuda("matmul_groups") {
            super::matmul_groups(&b);
            // Q4_K's one-row products with four stages, not five (`mmq_vx_*` too).
            super::matmul_groups(&b.with_mmq_v5(0));
        }
    }
    #[test]
    fn matmul_rows_alone() {
        if let Some(b) = cuda("matmul_rows_alone") {
            super::matmul_rows_alone(&b);
            // Q4_K's one-row kernel with four units in flight a warp, for every launch.
            super::matmul_rows_alone(&b.with_mmq_v5(u32::MAX));
        }
    }
    #[test]
    fn norms() {
        if let Some(b) = cuda("norms") {
            super::norms(&b);
        }
    }
    #[test]
    fn fused_products() {
        if let Some(b) = cuda("fused_products") {
            // Fused: F32, F16 and BF16 at 1, 3, 5 (runs of one) and 8 rows, both shapes; not
            // Q8_0, nor the 12-row prompt run (cuBLAS). One warp a row, and up to four.
            let b = b.with_fused(Fused::Add, true);
            assert_eq!(super::fused_products(&b), 2 * 3 * 4);
            // The residual add inside the same launches (rows in one launch: all of them).
            assert_eq!(b.fused(Fused::Add), 2 * 3 * 4);
            let b = b.with_wpr_cap(4);
            assert_eq!(super::fused_products(&b), 2 * 3 * 4);
            assert_eq!(b.fused(Fused::Add), 2 * 2 * 3 * 4);
        }
    }
    #[test]
    fn rope() {
        if let Some(b) = cuda("rope") {
            super::rope(&b);
        }
    }
    #[test]
    fn elementwise() {
        if let Some(b) = cuda("elementwise") {
            super::elementwise(&b);
        }
    }
    #[test]
    fn rows() {
        if let Some(b) = cuda("rows") {
            super::rows(&b);
        }
    }
    #[test]
    fn top_rows() {
        // The kernel (`top_rows`) against the rows read whole.
        if let Some(b) = cuda("top_rows") {
            super::top_rows(&b.with_tops(true));
        }
    }
    #[test]
    fn sample_rows() {
        // The kernel (`sample_rows`) against the rows read whole.
        if let Some(b) = cuda("sample_rows") {
            super::sample_rows(&b.with_draws(true));
        }
    }
    #[test]
    fn attention() {
        if let Some(b) = cuda("attention") {
            // Decode rows of F16 caches through attn_dec_f16 (the default) and attn_split_f16.
            let b = b.with_attn_dec(true);
            super::attention(&b);
            super::attention(&b.with_attn_dec(false));
        }
    }
    /// Each output of `got` bit for bit equal to `want`'s (`what`: the comparison, for the message).
    fn same_bits(got: &[(String, Vec<f32>)], want: &[(String, Vec<f32>)], what: &str) {
        for ((name, g), (_, w)) in got.iter().zip(want) {
            let bad = g.iter().zip(w).position(|(x, y)| x.to_bits() != y.to_bits());
            assert!(
                bad.is_none(),
                "{name}: {what}: {:?} vs {:?}",
                bad.map(|i| g[i]),
                bad.map(|i| w[i])
            );
        }
    }
    #[test]
    fn attention_merge() {
        // A decode step's splits merged by attn_dec_f16's last block against attn_combine(_q8):
        // the same bits, the attention's and the integer products' that take its quantized rows.
        if let Some(b) = cuda("attention_merge") {
            let on = b.with_attn_dec(true).with_fused(Fused::AttnMerge, true);
            let off = Cuda::new(0)
                .unwrap()
                .with_attn_dec(true)
                .with_fused(Fused::AttnMerge, false);
            let (got, want) = (super::attention_decode_step(&on), super::attention_decode_step(&off));
            same_bits(&got, &want, "merged vs separate");
            // Merged in the first layer's shape (512 values of query heads per KV head; two
            // runs), not in the second's (128: attn_combine_q8 quantizes it).
            assert_eq!((on.fused(Fused::AttnMerge), off.fused(Fused::AttnMerge)), (2, 0));
        }
    }
    #[test]
    fn attention_head_groups() {
        // A KV head's query heads over several blocks a split (`with_attn_hg`) against one block
        // taking them all: the same bits (each head's sums in the same order either way).
        if cuda("attention_head_groups").is_some() {
            // (Merging the splits in the last block takes one block a split: off, whatever the
            // environment says.)
            let groups = |hg: usize| {
                Cuda::new(0)
                    .unwrap()
                    .with_attn_dec(true)
                    .with_attn_hg(hg)
                    .with_fused(Fused::AttnMerge, false)
            };
            let want = super::attention_decode_step(&groups(1));
            // (4 and 2 query heads a KV head: 4 groups falls back to one block in the second.)
            for hg in [2, 4] {
                let got = super::attention_decode_step(&groups(hg));
                same_bits(&got, &want, &format!("{hg} groups vs one"));
            }
            // Eight query heads a KV head (the MoE's) in a step of three decode rows: 8 and 4
            // blocks, and the default (0: 8 in a step this short), against one.
            let (shapes, seqs) = ([(16, 2, 128)], [(0, 1), (40, 1), (300, 1)]);
            let want = super::attention_decode_step_of(&groups(1), &shapes, &seqs);
            for hg in [0, 8, 4] {
                let got = super::attention_decode_step_of(&groups(hg), &shapes, &seqs);
                same_bits(&got, &want, &format!("setting {hg} vs one"));
            }
            // With the rope in the attention (`Fused::RopeAttn`), one head a block: its output and
            // the keys it stored against the separate launches' (also one head a block, whose
            // attention the comparisons above hold to one block taking all the heads).
            let b = Cuda::new(0)
                .unwrap()
                .with_rope_store(true)
                .with_attn_dec(true)
                .with_attn_hg(8)
                .with_fused(Fused::RopeAttn, true);
            super::rope_store_kv_heads(&b, 16, 2);
            assert_eq!(b.fused(Fused::RopeAttn), 6);
        }
    }
    #[test]
    fn rope_store_kv() {
        // The fused launch against the two launches it replaces (on whatever the default is).
        if let Some(b) = cuda("rope_store_kv") {
            super::rope_store_kv(&b.with_rope_store(true));
            // With the rope in decode attention where the step allows (2 F16 cases × 3 heads).
            let b = Cuda::new(0)
                .unwrap()
                .with_rope_store(true)
                .with_fused(Fused::RopeAttn, true);
            super::rope_store_kv(&b);
            assert_eq!(b.fused(Fused::RopeAttn), 6);
            // With the splits merged by the last block too (`Fused::AttnMerge`, off by default):
            // 8 query heads a KV head, so that the merge takes the shape (512 or 1024 values).
            let b = Cuda::new(0)
                .unwrap()
                .with_rope_store(true)
                .with_attn_dec(true)
                .with_fused(Fused::RopeAttn, true)
                .with_fused(Fused::AttnMerge, true);
            super::rope_store_kv_heads(&b, 16, 2);
            // The F16 cases (2 × 3 heads): the rope in the 6 steps of one row a sequence recorded
            // together with the attention; the merge in every attention call of both steps (all
            // their rows split: sequences of at most 8 rows), 4 a step (the separate launches, the
            // fused rope, together, and the cache read back), so 48.
            assert_eq!((b.fused(Fused::RopeAttn), b.fused(Fused::AttnMerge)), (6, 48));
        }
    }
    #[test]
    fn encoder_ops() {
        if let Some(b) = cuda("encoder_ops") {
            super::encoder_ops(&b);
        }
    }
    #[test]
    fn recurrent() {
        if let Some(b) = cuda("recurrent") {
            super::recurrent(&b);
        }
    }
    #[test]
    fn moe() {
        if let Some(b) = cuda("moe") {
            // Steps of 1, 2 and 5 rows (up to 20 (row, slot) pairs) route on the device. The
            // second run's weights are new, perhaps at the first's addresses. Without the
            // launch-saving variants, then with them.
            let b = b
                .with_fused(Fused::Route, false)
                .with_fused(Fused::Glu, false)
                .with_fused(Fused::SumNorm, false)
                .with_moe_lean(false);
            let plain: Vec<_> = [0, 1].map(|seed| super::moe(&b, seed)).into();
            assert_eq!((b.fused(Fused::Route), b.fused(Fused::Glu)), (0, 0));
            // Every step's outputs the same bits as without the variants.
            let same_as_plain = |b: &Cuda, what: &str| {
                for (seed, (steps, want)) in plain.iter().enumerate() {
                    assert_eq!(
                        *steps, 6,
                        "the MoE steps of 1 to 130 rows did not all take the device path"
                    );
                    let (steps, got) = super::moe(b, seed as u64);
                    assert_eq!(steps, 6);
                    for (i, (g, w)) in got.iter().zip(want).enumerate() {
                        let same = g.iter().zip(w).all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(same, "seed {seed}, device output {i}: {what} differs");
                    }
                }
            };
            let b = b.with_fused(Fused::Route, true).with_fused(Fused::Glu, true);
            same_as_plain(&b, "routing in the router's launch, the GLU in gate / up's");
            // The steps of 1, 2 and 5 rows routed by their router's product (F32) and their GLU
            // made by the gate / up launch; the others (grouped) through moe_route and glu_q8.
            assert_eq!((b.fused(Fused::Route), b.fused(Fused::Glu)), (6, 6));
            // The GLU made by the down products' blocks instead (`mmq_moe_gd_*`), and the combine
            // by the norm after it (`add_ws_rms_norm_q8`).
            let b = b
                .with_fused(Fused::Route, false)
                .with_fused(Fused::Glu, false)
                .with_fused(Fused::GluDown, true)
                .with_fused(Fused::SumNorm, true);
            same_as_plain(&b, "the down products' GLU or the norm's combine");
            // The steps of 1, 2 and 5 rows; the norm after every step (grouped ones too).
            assert_eq!((b.fused(Fused::GluDown), b.fused(Fused::SumNorm)), (6, 12));
            // Routed by the gate / up and down products' blocks themselves (no moe_route).
            let b = b.with_fused(Fused::GluDown, false).with_fused(Fused::RouteIn, true);
            same_as_plain(&b, "the products' own routing");
            // (Their down products make the GLU too: counted again.)
            assert_eq!((b.fused(Fused::RouteIn), b.fused(Fused::GluDown)), (6, 12));
            // The experts' products through the lean kernels (two stages, more blocks a
            // multiprocessor: `mmq_moe_v2_*`), the GLU by glu_q8, then by the down blocks. (The
            // test's rows are 512 and 256 values: `mmq_moe_v3_*` is checked by the greedy tokens
            // of the 2,048-wide MoE in bench/cuda/device.sh.)
            let b = b.with_fused(Fused::RouteIn, false).with_moe_lean(true);
            same_as_plain(&b, "the lean kernels' products");
            let b = b.with_fused(Fused::GluDown, true);
            same_as_plain(&b, "the lean kernels' gate / up products (GLU by the down blocks)");
            // The steps of 1, 2 and 5 rows: gate / up and down, then gate / up and down making
            // the GLU (`mmq_moe_gd_v2_*`).
            assert_eq!((b.moe_lean_launches(), b.fused(Fused::GluDown)), (24, 18));
        }
    }
    #[test]
    fn gates() {
        if let Some(b) = cuda("gates") {
            super::gates(&b);
        }
    }
}
