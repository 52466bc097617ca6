//! Softmax attention over the KV cache, following ggml's CPU flash attention
//! (`ggml-cpu/ops.cpp`, ggml_compute_forward_flash_attn_ext_f16): an online softmax per query row
//! and head. For fewer than 64 query rows ggml takes its `one_chunk` path, which rounds Q to f16
//! and accumulates V·softmax in an f16 vector; longer batches use its tiled f32 path. Both are
//! reproduced so that hf2q's numbers follow llama.cpp's.

use super::{simd, Cpu, CpuBuf, CpuKv, SyncPtr};
use crate::backend::{AttnArgs, KvType};
use gguf::GgmlType;
use quant::dot;
use quant::fp::f16_to_f32;
use rayon::prelude::*;

/// ggml's `GGML_FA_TILE_Q`: batches of at least this many query rows take the f32 path.
const TILE_Q: usize = 64;

/// Every sequence of a step for one layer: long runs take the tiled path one by one, all the
/// others share one parallel region of (row, head) tasks.
pub(super) fn attention(cpu: &Cpu, q: &CpuBuf, runs: &[(&CpuKv, AttnArgs)], out: &mut CpuBuf) {
    let Some((_, first)) = runs.first() else { return };
    out.shape_from(q.rows, &q.runs, first.n_head * first.head_dim);
    let mut short = Vec::new();
    for (kv, a) in runs {
        if a.rows >= TILE_Q && kv.ty() == KvType::F16 {
            batched_f32(q, kv, a, out)
        } else {
            short.push((*kv, *a));
        }
    }
    if !short.is_empty() {
        per_row(cpu, q, &short, out)
    }
}

/// The visible key range of query row `i`.
fn key_range(a: &AttnArgs, i: usize) -> std::ops::Range<usize> {
    let p = a.pos0 + i;
    let end = if a.causal { p + 1 } else { a.pos0 + a.rows };
    let start = a.window.map_or(0, |w| (p + 1).saturating_sub(w));
    start..end
}

/// ggml's `GGML_FA_TILE_KV`: keys are processed in tiles of this many, from cell 0.
const TILE_KV: usize = 64;

/// Long batches: ggml's tiled f32 path (`ggml_compute_forward_flash_attn_ext_tiled`). Keys and
/// values are converted to f32 once per KV head (K transposed per 64-key tile); each (head,
/// 64-row query tile) task walks the key tiles: KQ = Q·Kᵀ as a small GEMM (every score one FMA
/// chain over the head dimension), scaled and masked, an online softmax per row and tile (the
/// running max and sum rescaled when the max grows), then VKQ += softmax·V as a second GEMM.
/// Every value is computed by the same operations in the same order as ggml's, so results do
/// not depend on how rows are grouped into tiles or tasks.
fn batched_f32(q: &CpuBuf, kv: &CpuKv, a: &AttnArgs, out: &mut CpuBuf) {
    let hd = a.head_dim;
    let n_keys = a.pos0 + a.rows;
    let n_tiles = n_keys.div_ceil(TILE_KV);
    let group = a.n_head / a.n_kv_head;
    // K of each KV head as f32, tile t at [t·hd·64 ..], element (d, key) at d·64 + key; V as
    // f32 rows. Both zero-padded to whole tiles (padded keys are masked).
    let mut kt = vec![vec![0f32; n_tiles * hd * TILE_KV]; a.n_kv_head];
    let mut vf = vec![vec![0f32; n_tiles * TILE_KV * hd]; a.n_kv_head];
    // One task per (KV head, key tile): a few KV heads alone would leave threads idle.
    let pieces: Vec<(usize, usize, &mut [f32], &mut [f32])> = kt
        .iter_mut()
        .zip(vf.iter_mut())
        .enumerate()
        .flat_map(|(kh, (kt, vf))| {
            kt.chunks_mut(hd * TILE_KV)
                .zip(vf.chunks_mut(TILE_KV * hd))
                .enumerate()
                .map(move |(t, (kt, vf))| (kh, t, kt, vf))
        })
        .collect();
    pieces.into_par_iter().with_max_len(1).for_each(|(kh, t, kt, vf)| {
        let mut row = vec![0f32; hd];
        for j in t * TILE_KV..((t + 1) * TILE_KV).min(n_keys) {
            let off = kh * hd * 2;
            simd::f16_to_f32s(&kv.k_row(a.layer, j)[off..off + 2 * hd], &mut row);
            for (d, &x) in row.iter().enumerate() {
                kt[d * TILE_KV + j % TILE_KV] = x;
            }
            let jj = j % TILE_KV;
            simd::f16_to_f32s(
                &kv.v_row(a.layer, j)[off..off + 2 * hd],
                &mut vf[jj * hd..(jj + 1) * hd],
            );
        }
    });
    let outp = SyncPtr(out.data.as_mut_ptr());
    let out_cols = out.cols;
    let n_qt = a.rows.div_ceil(TILE_Q);
    // Causal tiles further down cost more: the costliest first, one task at a time, so that no
    // thread is left waiting on a long tail (rayon would otherwise run runs of tasks unsplit).
    (0..a.n_head * n_qt).into_par_iter().with_max_len(1).for_each(|task| {
        let (h, qt) = (task % a.n_head, n_qt - 1 - task / a.n_head);
        let (kt, vf) = (&kt[h / group], &vf[h / group]);
        let i0 = qt * TILE_Q;
        let rows = TILE_Q.min(a.rows - i0);
        // Rows padded to the GEMM's row block (padding rows stay zero and are never read).
        let rows_p = rows.next_multiple_of(simd::GEMM_ROWS);
        let mut qs = vec![0f32; rows_p * hd];
        for i in 0..rows {
            qs[i * hd..(i + 1) * hd].copy_from_slice(&q.row(a.row0 + i0 + i)[h * hd..(h + 1) * hd]);
        }
        let ranges: Vec<std::ops::Range<usize>> = (0..rows).map(|i| key_range(a, i0 + i)).collect();
        let mut s_sum = vec![0f32; rows];
        let mut m = vec![f32::NEG_INFINITY; rows];
        let mut vkq = vec![0f32; rows_p * hd];
        let mut kq = vec![0f32; rows_p * TILE_KV];
        for t in 0..n_tiles {
            let tile = t * TILE_KV..(t + 1) * TILE_KV;
            if ranges.iter().all(|r| r.end <= tile.start || r.start >= tile.end) {
                continue; // every row's mask is -inf over this tile
            }
            kq.fill(0.0);
            simd::gemm(
                &mut kq,
                &qs,
                &kt[t * hd * TILE_KV..(t + 1) * hd * TILE_KV],
                rows_p,
                hd,
                TILE_KV,
            );
            for (i, r) in ranges.iter().enumerate() {
                let row = &mut kq[i * TILE_KV..(i + 1) * TILE_KV];
                let tile_max = if r.start <= tile.start && tile.end <= r.end {
                    // The whole tile is visible: KQ·scale + 0.
                    simd::scale_max(row, a.scale)
                } else {
                    for (j, x) in row.iter_mut().enumerate() {
                        // KQ·scale + mask (0 where visible, -inf elsewhere).
                        *x = if r.contains(&(tile.start + j)) {
                            *x * a.scale + 0.0
                        } else {
                            f32::NEG_INFINITY
                        };
                    }
                    row.iter().fold(f32::NEG_INFINITY, |mx, &x| if mx > x { mx } else { x })
                };
                if tile_max == f32::NEG_INFINITY {
                    row.fill(0.0);
                    continue;
                }
                let m_new = m[i].max(tile_max);
                if m_new > m[i] {
                    let ms = (m[i] - m_new).exp();
                    simd::scale(&mut vkq[i * hd..(i + 1) * hd], ms);
                    s_sum[i] *= ms;
                }
                m[i] = m_new;
                // `S += ggml_vec_soft_max_f32(..)`: a float plus a double sum, rounded to float.
                s_sum[i] = (s_sum[i] as f64 + simd::softmax_exp(row, m_new)) as f32;
            }
            simd::gemm(
                &mut vkq,
                &kq,
                &vf[t * TILE_KV * hd..(t + 1) * TILE_KV * hd],
                rows_p,
                TILE_KV,
                hd,
            );
        }
        for i in 0..rows {
            let inv = if s_sum[i] == 0.0 { 0.0 } else { 1.0 / s_sum[i] };
            // SAFETY: row (row0 + i0 + i), head h belongs to this task only.
            unsafe {
                let dst = std::slice::from_raw_parts_mut(outp.at((a.row0 + i0 + i) * out_cols + h * hd), hd);
                for (d, &v) in dst.iter_mut().zip(&vkq[i * hd..(i + 1) * hd]) {
                    *d = v * inv;
                }
            }
        }
    });
}

/// Short batches and decoding (ggml's `one_chunk` path, or in f32 with `Cpu::with_f32_attention`),
/// one task per (query row, head).
fn per_row(cpu: &Cpu, q: &CpuBuf, runs: &[(&CpuKv, AttnArgs)], out: &mut CpuBuf) {
    // Task index → (run, row within it, head).
    let mut starts = Vec::with_capacity(runs.len() + 1);
    let mut n = 0;
    for (_, a) in runs {
        starts.push(n);
        n += a.rows * a.n_head;
    }
    let outp = SyncPtr(out.data.as_mut_ptr());
    let out_cols = out.cols;
    let task = |idx: usize| {
        let ri = starts.partition_point(|&s| s <= idx) - 1;
        let (kv, a) = (runs[ri].0, &runs[ri].1);
        let (hd, group) = (a.head_dim, a.n_head / a.n_kv_head);
        let idx = idx - starts[ri];
        let (i, h) = (idx / a.n_head, idx % a.n_head);
        let range = key_range(a, i);
        let kh = h / group;
        let qrow = &q.row(a.row0 + i)[h * hd..(h + 1) * hd];
        let layer = a.layer;
        let mut res = vec![0f32; hd];
        match kv.ty() {
            KvType::F16 if cpu.attn_f32 => {
                let head_off = kh * hd * 2;
                online_f32(range, a.scale, &mut res, |ic, vf: &mut Vec<f32>| {
                    let k = &kv.k_row(layer, ic)[head_off..head_off + 2 * hd];
                    simd::f16_to_f32s(&kv.v_row(layer, ic)[head_off..head_off + 2 * hd], vf);
                    k.chunks_exact(2)
                        .zip(qrow)
                        .map(|(b, &x)| f16_to_f32(u16::from_le_bytes([b[0], b[1]])) * x)
                        .sum()
                });
            }
            KvType::F16 => {
                let head_off = kh * hd * 2;
                let krow = |ic: usize| &kv.k_row(layer, ic)[head_off..head_off + 2 * hd];
                let vrow = |ic: usize| &kv.v_row(layer, ic)[head_off..head_off + 2 * hd];
                one_chunk_f16(qrow, range, a.scale, krow, vrow, &mut res);
            }
            KvType::Q8_0 => {
                let head_off = kh * hd / 32 * 34;
                let blen = hd / 32 * 34;
                let mut q8 = vec![0u8; dot::act_row_bytes(GgmlType::Q8_0, hd)];
                dot::quantize_act(GgmlType::Q8_0, qrow, &mut q8);
                let kern = dot::kernel(GgmlType::Q8_0, cpu.path).expect("Q8_0 kernel");
                let codec = quant::codec(GgmlType::Q8_0).expect("Q8_0 codec");
                online_f32(range, a.scale, &mut res, |ic, vf: &mut Vec<f32>| {
                    let mut s = [0f32];
                    let krow = &kv.k_row(layer, ic)[head_off..head_off + blen];
                    (kern.dot)(GgmlType::Q8_0, hd, krow, &[&q8], &mut s);
                    (codec.dequantize)(&kv.v_row(layer, ic)[head_off..head_off + blen], vf);
                    s[0]
                });
            }
        }
        // SAFETY: row (row0 + i), head h is written by this task only.
        unsafe {
            let dst = outp.at((a.row0 + i) * out_cols + h * hd);
            std::ptr::copy_nonoverlapping(res.as_ptr(), dst, hd);
        }
    };
    if n > 1 {
        (0..n).into_par_iter().with_max_len(1).for_each(task);
    } else {
        (0..n).for_each(task);
    }
}

/// ggml's `one_chunk`: Q rounded to f16, KQ in f32, the V accumulator kept in f16.
fn one_chunk_f16<'a>(
    q: &[f32],
    range: std::ops::Range<usize>,
    scale: f32,
    krow: impl Fn(usize) -> &'a [u8],
    vrow: impl Fn(usize) -> &'a [u8],
    out: &mut [f32],
) {
    let hd = q.len();
    let mut q16 = vec![0u8; 2 * hd];
    dot::quantize_act(GgmlType::F16, q, &mut q16);
    let mut acc = vec![0u16; hd];
    let (mut s_sum, mut m) = (0f32, f32::NEG_INFINITY);
    for ic in range {
        let s = simd::dot_f16(krow(ic), &q16) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > m {
            let old = m;
            m = s;
            ms = (old - m).exp();
            simd::scale_f16(&mut acc, ms);
        } else {
            vs = (s - m).exp();
        }
        simd::mad_f16(&mut acc, vrow(ic), vs);
        // `S = S*ms + vs`, contracted to an FMA in ggml's build.
        s_sum = s_sum.mul_add(ms, vs);
    }
    let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
    for (o, &a) in out.iter_mut().zip(&acc) {
        *o = f16_to_f32(a) * inv;
    }
}

/// Online softmax with an f32 accumulator; `row(ic, v)` returns the unscaled KQ value and
/// fills `v` with the value row.
fn online_f32(
    range: std::ops::Range<usize>,
    scale: f32,
    out: &mut [f32],
    mut row: impl FnMut(usize, &mut Vec<f32>) -> f32,
) {
    let hd = out.len();
    let mut acc = vec![0f32; hd];
    let mut v = vec![0f32; hd];
    let (mut s_sum, mut m) = (0f32, f32::NEG_INFINITY);
    for ic in range {
        let s = row(ic, &mut v) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > m {
            let old = m;
            m = s;
            ms = (old - m).exp();
            simd::scale(&mut acc, ms);
        } else {
            vs = (s - m).exp();
        }
        simd::axpy(&mut acc, &v, vs);
        s_sum = s_sum * ms + vs;
    }
    let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
    for (o, &a) in out.iter_mut().zip(&acc) {
        *o = a * inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use quant::fp::f32_to_f16;

    fn filled(cpu: &Cpu, rows: usize, cols: usize, seed: f32) -> CpuBuf {
        let mut b = cpu.alloc(rows, cols);
        for (i, v) in b.data.iter_mut().enumerate() {
            *v = ((i as f32 * 0.618 + seed).sin() * 2.0).sin();
        }
        b
    }

    /// Softmax attention in f64 over the f16-rounded keys and values.
    fn reference(q: &CpuBuf, k: &CpuBuf, v: &CpuBuf, a: &AttnArgs, i: usize, h: usize) -> Vec<f64> {
        let hd = a.head_dim;
        let kh = h / (a.n_head / a.n_kv_head);
        let r16 = |x: f32| f16_to_f32(f32_to_f16(x)) as f64;
        let qrow = &q.row(a.row0 + i)[h * hd..(h + 1) * hd];
        let range = key_range(a, i);
        let scores: Vec<f64> = range
            .clone()
            .map(|j| {
                let krow = &k.row(j)[kh * hd..(kh + 1) * hd];
                qrow.iter().zip(krow).map(|(&x, &y)| x as f64 * r16(y)).sum::<f64>() * a.scale as f64
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let sum: f64 = w.iter().sum();
        (0..hd)
            .map(|d| {
                range
                    .clone()
                    .zip(&w)
                    .map(|(j, wj)| wj * r16(v.row(j)[kh * hd + d]))
                    .sum::<f64>()
                    / sum
            })
            .collect()
    }

    /// The tiled path (≥ 64 query rows) and the one-chunk path agree with exact softmax attention,
    /// with a batch after earlier positions, rows that are not a multiple of the tiles, a sliding
    /// window and non-causal attention; with `with_f32_attention` short batches too are held to the
    /// f32 bound.
    #[test]
    fn attention_paths_match_exact_softmax() {
        for f32_rows in [false, true] {
            let cpu = Cpu::new(2).unwrap();
            let cpu = if f32_rows { cpu.with_f32_attention() } else { cpu };
            attention_cases(&cpu, f32_rows);
        }
    }

    fn attention_cases(cpu: &Cpu, f32_rows: bool) {
        let (n_head, n_kv_head, hd) = (4, 2, 64);
        for (pos0, rows, window, causal) in [
            (0, 100, None, true),
            (37, 70, Some(50), true),
            (0, 64, None, false),
            (90, 20, None, true),
            (5, 1, Some(3), true),
        ] {
            let n = pos0 + rows;
            let k = filled(cpu, n, n_kv_head * hd, 1.0);
            let v = filled(cpu, n, n_kv_head * hd, 2.0);
            let q = filled(cpu, rows, n_head * hd, 3.0);
            let mut kv = cpu
                .alloc_kv(
                    &[crate::model::KvLayer::own(n_kv_head * hd, n_kv_head * hd, None)],
                    256,
                    KvType::F16,
                )
                .unwrap();
            let fill = cpu.begin_step(crate::backend::tests::plan(&[(0, n)]), &[&kv]).unwrap();
            cpu.store_kv(&mut [&mut kv], &fill, 0, &k, &v);
            let a = AttnArgs {
                layer: 0,
                row0: 0,
                rows,
                pos0,
                n_head,
                n_kv_head,
                head_dim: hd,
                scale: 0.125,
                window,
                causal,
            };
            let mut out = cpu.alloc(rows, n_head * hd);
            let step = cpu
                .begin_step(crate::backend::tests::plan(&[(pos0, rows)]), &[&kv])
                .unwrap();
            let layer = crate::backend::AttnLayer {
                layer: 0,
                n_head,
                n_kv_head,
                head_dim: hd,
                scale: 0.125,
                window,
                causal,
            };
            cpu.attention(&q, &step, &[&kv], &layer, &mut out);
            // The tiled path sums in f32 (rel. error ~1e-6 over ≤ 190 keys), as the one-chunk
            // path does in f32 mode; by default it rounds Q and the V accumulator to f16 (2^-11
            // relative per step).
            let tol = if rows >= TILE_Q || f32_rows { 2e-5 } else { 5e-3 };
            for i in 0..rows {
                for h in 0..n_head {
                    let want = reference(&q, &k, &v, &a, i, h);
                    let got = &out.row(i)[h * hd..(h + 1) * hd];
                    for (d, (&g, &w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g as f64 - w).abs() <= tol * w.abs().max(0.1),
                            "pos0 {pos0} rows {rows} window {window:?} causal {causal}: row {i} head {h} dim {d}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}
