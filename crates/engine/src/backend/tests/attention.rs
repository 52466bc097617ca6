//! The op test bodies of positions: rope, the KV store and attention (see `tests`).

use super::*;

/// Rope: NeoX and adjacent-pair rotation, a partial rotation, per-pair frequency factors (Llama 3
/// scaling, Gemma 4's proportional rope) and linear scaling, at positions up to 3000. ggml builds
/// θ by repeated f32 multiplication, so θ carries a relative error of up to ~n_dims/2 ulps:
/// at position p the angle is off by ≲ p·32·2^-24, which bounds the value error.
pub fn rope<B: Backend>(b: &B) {
    let (hd, heads) = (64, 3);
    let positions = [0usize, 1, 7, 511, 3000];
    for (neox, n_dims, ff, scale) in [
        (true, 64, None, 1.0f32),
        (false, 64, None, 1.0),
        (true, 32, None, 0.25),
        (
            true,
            64,
            Some((0..32).map(|i| if i < 8 { 1.0 } else { 1e30 }).collect::<Vec<f32>>()),
            1.0,
        ),
    ] {
        let r = Rope {
            n_dims,
            neox,
            freq_base: 10000.0,
            freq_scale: scale,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 4096,
            freq_factors: ff.clone(),
        };
        let xv = values(positions.len() * heads * hd, 9);
        let mut x = buf(b, positions.len(), heads * hd, &xv);
        let mut p = plan(&[(0, positions.len())]);
        p.positions = positions.to_vec();
        let step = b.begin_step(p, &[]).unwrap();
        b.run(|| b.rope(&mut x, hd, &step, &r));
        let mut want = Vec::new();
        let mut bound = Vec::new();
        for (pi, &p) in positions.iter().enumerate() {
            for h in 0..heads {
                let v = &xv[(pi * heads + h) * hd..(pi * heads + h + 1) * hd];
                let mut o: Vec<f64> = v.iter().map(|&a| a as f64).collect();
                for i in 0..n_dims / 2 {
                    let f = ff.as_ref().map_or(1.0, |f| f[i] as f64);
                    let theta = p as f64 * (10000f64).powf(-2.0 * i as f64 / n_dims as f64) / f * scale as f64;
                    let (c, s) = (theta.cos(), theta.sin());
                    let (a, bb) = if neox { (i, i + n_dims / 2) } else { (2 * i, 2 * i + 1) };
                    let (x0, x1) = (v[a] as f64, v[bb] as f64);
                    o[a] = x0 * c - x1 * s;
                    o[bb] = x0 * s + x1 * c;
                }
                want.extend(o);
                bound.extend(std::iter::repeat_n(1e-6 + p as f64 * 32.0 * 2f64.powi(-24) * 2.0, hd));
            }
        }
        assert_close(&format!("rope neox={neox} n_dims={n_dims}"), &b.read(&x), &want, |i| {
            bound[i]
        });
        // Queries and keys (fewer heads) in one call: as two ropes, bit for bit.
        let kv = values(positions.len() * hd, 10);
        let mut q2 = buf(b, positions.len(), heads * hd, &xv);
        let (mut k1, mut k2) = (buf(b, positions.len(), hd, &kv), buf(b, positions.len(), hd, &kv));
        b.run(|| {
            b.rope_qk(&mut q2, &mut k2, hd, &step, &r);
            b.rope(&mut k1, hd, &step, &r);
        });
        assert!(
            b.read(&q2) == b.read(&x),
            "rope_qk's queries, neox={neox} n_dims={n_dims}"
        );
        assert!(
            b.read(&k2) == b.read(&k1),
            "rope_qk's keys, neox={neox} n_dims={n_dims}"
        );
    }
}

/// `rope_store_kv` equals `head_rms_norm` (with the q/k norms, or none), `rope_qk` then
/// `store_kv`, bit for bit: the roped queries and keys and the caches they leave (read back
/// through attention), for F16 and Q8_0 caches, neox and
/// interleaved pairs, partial rotation, heads of 64 and 128 values, decode rows and a short batch
/// after earlier positions, two sequences in one step. Then a step of three sequences of one row
/// each (positions 30, 0 and 7), `rope_store_kv` and attention recorded together (a backend may do
/// the first in the second's launch: CUDA's `Fused::RopeAttn`): the attention's output the same
/// bits, and the keys and values it stored the same (attention with the roped queries of the
/// separate launches reads them back).
pub fn rope_store_kv<B: Backend>(b: &B) {
    rope_store_kv_heads(b, 4, 2);
}

/// `rope_store_kv` with `n_head` query heads over `n_kv` KV heads.
pub fn rope_store_kv_heads<B: Backend>(b: &B, n_head: usize, n_kv: usize) {
    for (ty, normed) in [
        (KvType::F16, false),
        (KvType::Q8_0, false),
        (KvType::F16, true),
        (KvType::Q8_0, true),
    ] {
        for (hd, neox, n_dims) in [(64, true, 64), (128, false, 128), (128, true, 32)] {
            // (Per-head norm weights of q and k, as Qwen 3's.)
            let (qn, kn) = (values(hd, 94), values(hd, 95));
            let ws = Weights::new(&[("qn", GgmlType::F32, [hd, 1], &qn), ("kn", GgmlType::F32, [hd, 1], &kn)]);
            let (qw, kw) = (ws.load(b, "qn", false), ws.load(b, "kn", false));
            let norm = normed.then_some(QkNorm {
                q: &qw,
                k: &kw,
                eps: 1e-6,
            });
            let layers = [KvLayer::own(n_kv * hd, n_kv * hd, None)];
            let r = Rope {
                n_dims,
                neox,
                freq_base: 10000.0,
                freq_scale: 1.0,
                ext_factor: 0.0,
                attn_factor: 1.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                n_ctx_orig: 4096,
                freq_factors: None,
            };
            // Two sequences: 30 earlier positions then 1 row; 7 earlier then 5 rows. Then three of
            // one row each.
            for seqs in [&[(30usize, 1usize), (7, 5)][..], &[(30, 1), (0, 1), (7, 1)]] {
                let rows: usize = seqs.iter().map(|s| s.1).sum();
                // fused: rope_store_kv (else the separate launches); with_attention: recorded with
                // the attention after it (the queries and keys are not read before).
                let qr0: std::cell::OnceCell<Vec<f32>> = std::cell::OnceCell::new();
                let run = |fused: bool, with_attention: bool| {
                    let mut kvs: Vec<B::Kv> = seqs.iter().map(|_| b.alloc_kv(&layers, 64, ty).unwrap()).collect();
                    for (i, (&(pos0, _), kv)) in seqs.iter().zip(kvs.iter_mut()).enumerate() {
                        if pos0 == 0 {
                            continue;
                        }
                        let k = buf(b, pos0, n_kv * hd, &values(pos0 * n_kv * hd, 70 + i as u64));
                        let v = buf(b, pos0, n_kv * hd, &values(pos0 * n_kv * hd, 80 + i as u64));
                        let step = b.begin_step(plan(&[(0, pos0)]), &[&*kv]).unwrap();
                        b.store_kv(&mut [kv], &step, 0, &k, &v);
                    }
                    let mut q = buf(b, rows, n_head * hd, &values(rows * n_head * hd, 91));
                    let mut k = buf(b, rows, n_kv * hd, &values(rows * n_kv * hd, 92));
                    let v = buf(b, rows, n_kv * hd, &values(rows * n_kv * hd, 93));
                    let refs: Vec<&B::Kv> = kvs.iter().collect();
                    let step = b.begin_step(plan(seqs), &refs).unwrap();
                    let mut muts: Vec<&mut B::Kv> = kvs.iter_mut().collect();
                    b.run(|| {
                        if fused {
                            b.rope_store_kv(&mut q, &mut k, &v, hd, norm, &r, &mut muts, &step, 0);
                        } else {
                            if let Some(n) = norm {
                                b.head_rms_norm(&mut q, Some(n.q), hd, n.eps);
                                b.head_rms_norm(&mut k, Some(n.k), hd, n.eps);
                            }
                            b.rope_qk(&mut q, &mut k, hd, &step, &r);
                            b.store_kv(&mut muts, &step, 0, &k, &v);
                        }
                    });
                    let (qr, kr) = if with_attention {
                        (Vec::new(), Vec::new())
                    } else {
                        (b.read(&q), b.read(&k))
                    };
                    let refs: Vec<&B::Kv> = kvs.iter().collect();
                    let a = AttnLayer {
                        layer: 0,
                        n_head,
                        n_kv_head: n_kv,
                        head_dim: hd,
                        scale: 0.1,
                        window: None,
                        causal: true,
                    };
                    let mut out = b.alloc(rows, n_head * hd);
                    b.run(|| b.attention(&q, &step, &refs, &a, &mut out));
                    let out = b.read(&out);
                    // The cache read back by attention with the separate launches' roped queries.
                    let again = with_attention.then(|| {
                        let q = buf(b, rows, n_head * hd, qr0.get().expect("the separate launches first"));
                        let mut out = b.alloc(rows, n_head * hd);
                        b.run(|| b.attention(&q, &step, &refs, &a, &mut out));
                        b.read(&out)
                    });
                    (qr, kr, out, again)
                };
                let parts = run(false, false);
                let _ = qr0.set(parts.0.clone());
                let (fused, together) = (run(true, false), run(true, true));
                let what = format!(
                "{ty:?} cache, heads of {hd}, neox {neox}, {n_dims} dims roped, q/k normed {normed}, sequences {seqs:?}"
            );
                assert!(parts.0 == fused.0, "{what}: the roped queries differ");
                assert!(parts.1 == fused.1, "{what}: the roped keys differ");
                assert!(parts.2 == fused.2, "{what}: attention over the stored keys differs");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&parts.2),
                    bits(&together.2),
                    "{what}: attention recorded with the rope differs"
                );
                let again = together.3.expect("read back");
                assert_eq!(
                    bits(&parts.2),
                    bits(&again),
                    "{what}: the keys and values stored with attention differ"
                );
            }
        }
    }
}

/// Softmax attention of a whole step in one call: several sequences of different lengths after
/// earlier positions, GQA, a sliding window, a layer with its own head size, long runs (the tiled
/// path) and decode rows, F16 and Q8_0 caches. Reference: exact softmax over the cache's rounded
/// K/V. Bounds: the tiled f32 path 2e-5 relative; the per-row path rounds Q to f16 and accumulates
/// V in f16 (2^-11 per step): 5e-3; Q8_0 caches quantize Q to Q8_0 as well: 2e-2.
pub fn attention<B: Backend>(b: &B) {
    for ty in [KvType::F16, KvType::Q8_0] {
        let (n_head, n_kv, hd) = (4, 2, 64);
        // (Heads of 64 and 128 values: the sizes CUDA's flash attention takes; 128 with a window.)
        let layers = [
            KvLayer::own(n_kv * hd, n_kv * hd, None),
            KvLayer::own(n_kv * 32, n_kv * 32, Some(20)),
            KvLayer::own(n_kv * 128, n_kv * 128, Some(40)),
        ];
        // (pos0, rows) per sequence: a long prefill, decode rows (one past 2,048 keys, whose
        // split-K splits span several pages), short chunks (of at most and of more than the eight
        // rows the CUDA backend splits).
        let seqs = [(0usize, 70usize), (2500, 1), (40, 1), (10, 9), (100, 5)];
        for (layer, l_hd) in [(0usize, hd), (1, 32), (2, 128)] {
            let window = layers[layer].window;
            let kvd = n_kv * l_hd;
            let mut kvs: Vec<B::Kv> = seqs.iter().map(|_| b.alloc_kv(&layers, 2560, ty).unwrap()).collect();
            let mut refs = Vec::new();
            for (s, (&(pos0, rows), kv)) in seqs.iter().zip(kvs.iter_mut()).enumerate() {
                let total = pos0 + rows;
                let kv_vals = values(total * kvd, 40 + s as u64);
                let vv_vals = values(total * kvd, 50 + s as u64);
                let k = buf(b, total, kvd, &kv_vals);
                let v = buf(b, total, kvd, &vv_vals);
                let step = b.begin_step(plan(&[(0, total)]), &[&*kv]).unwrap();
                b.store_kv(&mut [kv], &step, layer, &k, &v);
                refs.push((kv_vals, vv_vals));
            }
            let total_rows: usize = seqs.iter().map(|s| s.1).sum();
            let qv = values(total_rows * n_head * l_hd, 60);
            let q = buf(b, total_rows, n_head * l_hd, &qv);
            let a = AttnLayer {
                layer,
                n_head,
                n_kv_head: n_kv,
                head_dim: l_hd,
                scale: 0.125,
                window,
                causal: true,
            };
            let kv_refs: Vec<&B::Kv> = kvs.iter().collect();
            let p = plan(&seqs);
            let starts: Vec<usize> = p.seqs.iter().map(|s| s.row0).collect();
            let step = b.begin_step(p, &kv_refs).unwrap();
            let mut out = b.alloc(total_rows, n_head * l_hd);
            b.run(|| b.attention(&q, &step, &kv_refs, &a, &mut out));
            let got = b.read(&out);
            let round = |x: f32| -> f64 {
                match ty {
                    KvType::F16 => quant::fp::f16_to_f32(quant::fp::f32_to_f16(x)) as f64,
                    KvType::Q8_0 => x as f64,
                }
            };
            for (si, (&(pos0, rows), (kr, vr))) in seqs.iter().zip(&refs).enumerate() {
                let row0 = starts[si];
                // The cache's values as stored.
                let (kq, vq): (Vec<f64>, Vec<f64>) = match ty {
                    KvType::F16 => (
                        kr.iter().map(|&x| round(x)).collect(),
                        vr.iter().map(|&x| round(x)).collect(),
                    ),
                    KvType::Q8_0 => {
                        let d = |v: &[f32]| -> Vec<f64> {
                            let bytes = quant::quantize(GgmlType::Q8_0, v, kvd, None).unwrap();
                            quant::dequantize(GgmlType::Q8_0, &bytes, v.len())
                                .unwrap()
                                .iter()
                                .map(|&x| x as f64)
                                .collect()
                        };
                        (d(kr), d(vr))
                    }
                };
                for i in 0..rows {
                    let p = pos0 + i;
                    let lo = window.map_or(0, |w| (p + 1).saturating_sub(w));
                    for h in 0..n_head {
                        let kh = h / (n_head / n_kv);
                        let qr = &qv[(row0 + i) * n_head * l_hd + h * l_hd..][..l_hd];
                        let scores: Vec<f64> = (lo..=p)
                            .map(|j| {
                                (0..l_hd)
                                    .map(|d| qr[d] as f64 * kq[j * kvd + kh * l_hd + d])
                                    .sum::<f64>()
                                    * 0.125
                            })
                            .collect();
                        let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                        let z: f64 = e.iter().sum();
                        // Short batches on the CPU round Q to f16 and sum V in f16 (llama.cpp's
                        // CPU flash attention), an error that grows with the keys summed.
                        // (Q's rounding enters every score through head-size terms: the bound
                        // grows with the root of the head size past 64 as well.)
                        let keys = (p + 1 - lo) as f64;
                        let wide = (l_hd as f64 / 64.0).sqrt().max(1.0);
                        let tol = match (ty, rows >= 64) {
                            (KvType::F16, true) => 2e-5,
                            (KvType::F16, false) => 5e-3 * (keys / 64.0).sqrt().max(1.0) * wide,
                            (KvType::Q8_0, _) => 2e-2,
                        };
                        for d in 0..l_hd {
                            let want: f64 = (lo..=p)
                                .zip(&e)
                                .map(|(j, w)| w * vq[j * kvd + kh * l_hd + d])
                                .sum::<f64>()
                                / z;
                            let g = got[(row0 + i) * n_head * l_hd + h * l_hd + d] as f64;
                            assert!(
                                (g - want).abs() <= tol * want.abs().max(0.1),
                                "attention {ty:?} layer {layer} seq {si} row {i} head {h} dim {d}: {g} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// A step of decode rows alone (one row of each of five sequences, from the first position to past
/// 2,048 keys) over F16 caches, its output multiplied by a Q8_0 and a Q4_K matrix in the same run
/// and launch (on CUDA the integer products take both flavours of the activations the attention
/// quantized), twice (the second run's outputs must equal the first's: on CUDA the merge's
/// counters are back at 0). Layers whose query heads per KV head hold 512 values (8 heads of 128,
/// 2 KV heads) and 128 (8 of 64, 4 KV heads). Returns (what, values) per output, for comparing
/// one backend's variants.
pub fn attention_decode_step<B: Backend>(b: &B) -> Vec<(String, Vec<f32>)> {
    let seqs = [(0usize, 1usize), (15, 1), (16, 1), (300, 1), (2100, 1)];
    attention_decode_step_of(b, &[(8, 2, 128), (8, 4, 64)], &seqs)
}

/// `attention_decode_step` for layers of the given (query heads, KV heads, head size) and a step
/// of `seqs` (earlier positions, 1): one decode row each.
pub fn attention_decode_step_of<B: Backend>(
    b: &B,
    shapes: &[(usize, usize, usize)],
    seqs: &[(usize, usize)],
) -> Vec<(String, Vec<f32>)> {
    let mut outs = Vec::new();
    for &(n_head, n_kv, hd) in shapes {
        let (kvd, cols) = (n_kv * hd, n_head * hd);
        let layers = [KvLayer::own(kvd, kvd, None)];
        let mut kvs: Vec<B::Kv> = seqs
            .iter()
            .map(|_| b.alloc_kv(&layers, 2560, KvType::F16).unwrap())
            .collect();
        for (s, (&(pos0, rows), kv)) in seqs.iter().zip(kvs.iter_mut()).enumerate() {
            let total = pos0 + rows;
            let k = buf(b, total, kvd, &values(total * kvd, 140 + s as u64));
            let v = buf(b, total, kvd, &values(total * kvd, 150 + s as u64));
            let step = b.begin_step(plan(&[(0, total)]), &[&*kv]).unwrap();
            b.store_kv(&mut [kv], &step, 0, &k, &v);
        }
        let ws = Weights::new(&[
            ("a", GgmlType::Q8_0, [cols, 48], &values(cols * 48, 161)),
            ("c", GgmlType::Q4_K, [cols, 40], &values(cols * 40, 162)),
        ]);
        let (wa, wc) = (ws.load(b, "a", true), ws.load(b, "c", true));
        let rows = seqs.len();
        let q = buf(b, rows, cols, &values(rows * cols, 163));
        let a = AttnLayer {
            layer: 0,
            n_head,
            n_kv_head: n_kv,
            head_dim: hd,
            scale: 0.09,
            window: None,
            causal: true,
        };
        let refs: Vec<&B::Kv> = kvs.iter().collect();
        let step = b.begin_step(plan(seqs), &refs).unwrap();
        let what = format!("{n_head} heads of {hd}, {n_kv} KV heads");
        let mut runs = Vec::new();
        for _ in 0..2 {
            let (mut out, mut ya, mut yc) = (b.alloc(rows, cols), b.alloc(rows, 48), b.alloc(rows, 40));
            b.run(|| {
                b.attention(&q, &step, &refs, &a, &mut out);
                b.matmul_many(&[&wa, &wc], &out, &mut [&mut ya, &mut yc]);
            });
            runs.push([
                (format!("{what}: attention"), b.read(&out)),
                (format!("{what}: Q8_0 product"), b.read(&ya)),
                (format!("{what}: Q4_K product"), b.read(&yc)),
            ]);
        }
        let second = runs.pop().expect("two runs");
        let first = runs.pop().expect("two runs");
        for ((w, a), (_, c)) in first.iter().zip(&second) {
            let same = a.iter().zip(c).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{w}: the second run differs from the first");
        }
        outs.extend(first);
    }
    outs
}
