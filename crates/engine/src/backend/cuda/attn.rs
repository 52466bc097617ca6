//! Attention over the paged KV cache (`kernels/attention.cu`): split-K attention for decode rows
//! (a row's keys cut into splits whose outputs `attn_combine` merges), flash attention on the tensor
//! cores for runs of rows of F16 caches, and the one-block-per-head kernel for the rest.

use super::dev::A;
use super::mmq::mmq_on;
use super::{Cuda, CudaBuf, CudaKv, CudaStep, MAX_HEAD_DIM};
use crate::backend::{AttnLayer, KvType};
use std::sync::atomic::Ordering;

/// Split-K attention (`kernels/attention.cu`): at most this many splits of a row's keys, query
/// heads per KV head, and rows of a sequence in the step (decode rows; longer runs go through the
/// one-block-per-head kernel).
const ATTN_SPLIT_MAX: usize = 32;

/// The blocks a split that `attn_dec_f16` spreads `g` query heads (of one KV head) over, in a
/// step of `rows` rows that split their keys (decode rows; a prompt's rows go through flash
/// attention), for the setting `hg` (`Cuda::attn_hg`: `HF2Q_CUDA_ATTN_HG`): that many
/// where it divides `g`, else one. 0 (the default): the most of 8, 4, 2 that divides `g` in steps
/// of at most `HG_MAX_ROWS` rows, where decode attention reads few keys and its time is latency;
/// one in larger steps, whose attention is bound by reading the keys and values, which every
/// block of a split reads again from the L2 (so `hg` times; not measured there).
fn head_groups(hg: usize, g: usize, rows: usize) -> usize {
    const HG_MAX_ROWS: usize = 4;
    match hg {
        0 if rows <= HG_MAX_ROWS => [8, 4, 2].into_iter().find(|&h| g.is_multiple_of(h)).unwrap_or(1),
        0 => 1,
        h if g.is_multiple_of(h) => h,
        _ => 1,
    }
}
const ATTN_SPLIT_G: usize = 8;
const ATTN_SPLIT_ROWS: usize = 8;
/// Widest head `attn_dec_f16` takes (its shared-memory stages are sized for it).
const ATTN_DEC_HD: usize = 256;

impl Cuda {
    pub(super) fn attend(&self, q: &CudaBuf, step: &CudaStep, kvs: &[&CudaKv], l: &AttnLayer, out: &mut CudaBuf) {
        let Some(first) = kvs.first() else { return };
        assert!(
            l.head_dim <= MAX_HEAD_DIM,
            "CUDA attention takes heads of at most {MAX_HEAD_DIM} values, not {}",
            l.head_dim
        );
        let layout = &first.layout;
        out.shape_from(q.rows, &q.runs, l.n_head * l.head_dim);
        let (ko, vo) = layout.offsets[l.layer];
        let (kb, vb) = layout.row_bytes[l.layer];
        let ty = match layout.ty {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        };
        // Rows of sequences with few rows in the step (decode) through split-K attention, when
        // the kernel takes the layer's shape.
        let g = l.n_head / l.n_kv_head.max(1);
        let fits = l.n_head.is_multiple_of(l.n_kv_head.max(1))
            && g <= ATTN_SPLIT_G
            && l.head_dim.is_multiple_of(4)
            && (ko | vo).is_multiple_of(8);
        let (sidx, n_split) = if fits { self.split_rows(step) } else { (0, 0) };
        let common = [
            A::I(q.cols as i32),
            A::I(l.head_dim as i32),
            A::I(l.n_head as i32),
            A::I(l.n_kv_head as i32),
            A::F(l.scale),
            A::I(l.window.unwrap_or(0) as i32),
            A::I(l.causal as i32),
            A::P(ko as u64),
            A::P(vo as u64),
            A::I(kb as i32),
            A::I(vb as i32),
        ];
        if n_split > 0 {
            let parts = n_split * l.n_head * ATTN_SPLIT_MAX;
            let need = parts * (l.head_dim + 2);
            let po = self.grown(&self.dev.attn_part, need, need.next_power_of_two(), "attention scratch");
            let pml = po + 4 * (parts * l.head_dim) as u64;
            let mut args: Vec<A> = [A::S(step.args), A::P(q.ptr), A::P(po), A::P(pml), A::P(sidx)]
                .into_iter()
                .chain(common)
                .collect();
            // F16 caches through attn_dec_f16 (the split's keys staged in shared memory) where
            // it takes the head and the rows' alignment.
            let dec = self.attn_dec
                && layout.ty == KvType::F16
                && l.head_dim.is_multiple_of(8)
                && l.head_dim <= ATTN_DEC_HD
                && (ko | vo | kb | vb).is_multiple_of(16);
            // A step of decode rows alone: attn_dec_f16's last block of each (row, KV head)
            // merges its splits, quantized as attn_combine_q8 would (when the KV head's query
            // heads are whole pairs of 256-value units and the row has no padding), or not.
            let q8 = mmq_on();
            let merge = dec
                && self.fuse_on(super::Fused::AttnMerge)
                && n_split == q.rows
                && (!q8 || (out.cols.is_multiple_of(256) && (g * l.head_dim).is_multiple_of(512)));
            // A step of one row a sequence: the rope_store_kv recorded just before, of these
            // queries and this F16 cache, done by the attention's blocks (`Fused::RopeAttn`), whether
            // or not the last block merges the splits (the rope's arguments follow the merge's).
            let rope = (dec && self.fuse_on(super::Fused::RopeAttn) && step.plan.seqs.iter().all(|s| s.rows == 1))
                .then(|| {
                    self.dev.take_last("rope_store_kv", |a| {
                        a.len() == 17
                            && a[1] == A::P(q.ptr)
                            && a[4] == A::I((kb / 2) as i32)
                            && a[6] == A::I((vb / 2) as i32)
                            && a[8] == A::I(l.head_dim as i32)
                            && a[11] == A::P(ko as u64)
                            && a[12] == A::P(vo as u64)
                            && a[13] == A::I(0)
                    })
                })
                .flatten();
            if dec {
                let mut tail = [A::P(0), A::P(0), A::I(0), A::I(0), A::P(0), A::P(0), A::P(0), A::P(0)];
                if merge {
                    let cnt = self.grown_zeroed(&self.dev.attn_cnt, q.rows * l.n_kv_head, "attention counters");
                    tail[..4].copy_from_slice(&[
                        A::P(cnt),
                        A::P(out.ptr),
                        A::I(out.cols as i32),
                        A::I(out.cols as i32),
                    ]);
                    if q8 {
                        let act = self.act_scratch(q.rows, out.cols);
                        tail[4..].copy_from_slice(&act.args());
                    }
                }
                args.extend(tail);
            }
            if let Some(a) = &rope {
                // (k, v, kd, vd, table, n_dims, neox, q / k norm weights, eps)
                args.extend([a[3], a[5], a[4], a[6], a[7], a[9], a[10], a[14], a[15], a[16]]);
                self.count_fused(super::Fused::RopeAttn);
            }
            // The query heads of a KV head over `hg` blocks a split (attn_dec_f16: the kernel
            // finds hg from its grid), not where the last block merges the splits.
            let hg = if dec && !merge {
                head_groups(self.attn_hg, g, n_split)
            } else {
                1
            };
            self.dev.launch_early(
                &if rope.is_some() {
                    "attn_dec_f16_rope".into()
                } else if dec {
                    "attn_dec_f16".into()
                } else {
                    format!("attn_split_{ty}")
                },
                (q.rows as u32, (l.n_kv_head * ATTN_SPLIT_MAX * hg) as u32),
                128,
                &args,
            );
            if merge {
                self.count_fused(super::Fused::AttnMerge);
                if q8 {
                    *self.q8_of.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some((out.ptr, out.rows, out.cols, self.dev.seq.load(Ordering::Relaxed)));
                }
                return;
            }
            let args = [
                A::S(step.args),
                A::P(po),
                A::P(pml),
                A::P(sidx),
                A::P(out.ptr),
                A::I(out.cols as i32),
                A::I(l.head_dim as i32),
                A::I(l.n_head as i32),
                A::I(l.window.unwrap_or(0) as i32),
                A::I(l.causal as i32),
            ];
            if n_split == q.rows && mmq_on() {
                // Every row here: the output also quantized for the integer product that follows
                // (the output projection), as a fused norm does.
                let n_pad = out.cols.next_multiple_of(256);
                let act = self.act_scratch(q.rows, n_pad);
                let mut a = args.to_vec();
                a.extend([
                    A::I(n_pad as i32),
                    A::P(act.q0),
                    A::P(act.d0),
                    A::P(act.qk),
                    A::P(act.dk),
                ]);
                self.dev
                    .launch_early("attn_combine_q8", (q.rows as u32, (n_pad / 256) as u32), 256, &a);
                *self.q8_of.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((out.ptr, out.rows, out.cols, self.dev.seq.load(Ordering::Relaxed)));
                return;
            }
            self.dev
                .launch_early("attn_combine", (q.rows as u32, l.n_head as u32), 128, &args);
            if n_split == q.rows {
                return;
            }
        }
        // The other rows through flash attention (tensor cores) where it takes the layer, else the
        // one-block-per-head kernel.
        let fa = self.dev.cc.0 >= 8
            && layout.ty == KvType::F16
            && matches!(l.head_dim, 64 | 128)
            && l.n_head.is_multiple_of(l.n_kv_head.max(1))
            && (ko | vo | kb | vb).is_multiple_of(16);
        if fa {
            let (tiles, n) = self.fa_tiles(step, n_split > 0);
            let mut args = vec![A::S(step.args), A::P(q.ptr), A::P(out.ptr), A::P(tiles)];
            args.extend([common[0], common[2], common[3], common[4], common[5], common[6]]);
            args.extend(&common[7..]);
            let name = format!("attn_fa_f16_{}", l.head_dim);
            self.dev.launch(&name, (n as u32, l.n_head as u32), 128, &args);
            return;
        }
        let args: Vec<A> = [A::S(step.args), A::P(q.ptr), A::P(out.ptr), A::P(sidx)]
            .into_iter()
            .chain(common)
            .collect();
        self.dev
            .launch(&format!("attn_{ty}"), (q.rows as u32, l.n_head as u32), 128, &args);
    }

    /// The step's split-K attention rows (`attention`): rows of sequences of at most
    /// `ATTN_SPLIT_ROWS` rows, or whose rows stand alone (drafted tokens being checked: each as
    /// a decode row), numbered in order (-1 for the others) on the device, and their count; made
    /// once per step.
    fn split_rows(&self, step: &CudaStep) -> (u64, usize) {
        let mut memo = step.split.lock().unwrap_or_else(|e| e.into_inner());
        *memo.get_or_insert_with(|| {
            let mut idx = Vec::with_capacity(step.plan.positions.len());
            let mut n = 0i32;
            for s in &step.plan.seqs {
                for _ in 0..s.rows {
                    if s.rows <= ATTN_SPLIT_ROWS || s.alone {
                        idx.push(n);
                        n += 1;
                    } else {
                        idx.push(-1);
                    }
                }
            }
            if n == 0 {
                (0, 0)
            } else {
                (self.dev.upload(&idx), n as usize)
            }
        })
    }

    /// Flash attention's tiles for the step: up to 64 consecutive rows of one sequence each, over
    /// the sequences split-K attention leaves (`split`: whether it runs in this layer).
    fn fa_tiles(&self, step: &CudaStep, split: bool) -> (u64, usize) {
        let mut memo = step.fa_tiles.lock().unwrap_or_else(|e| e.into_inner());
        *memo[split as usize].get_or_insert_with(|| {
            let mut t: Vec<i32> = Vec::new();
            for s in &step.plan.seqs {
                if split && (s.rows <= ATTN_SPLIT_ROWS || s.alone) {
                    continue;
                }
                for r0 in (0..s.rows).step_by(64) {
                    t.extend([(s.row0 + r0) as i32, (s.rows - r0).min(64) as i32]);
                }
            }
            (self.dev.upload(&t), t.len() / 2)
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn head_groups() {
        use super::head_groups;
        // Default: the most of 8 / 4 / 2 dividing the query heads a KV head, in steps of few rows.
        assert_eq!(head_groups(0, 8, 1), 8); // Qwen3-30B-A3B: 32 heads, 4 KV heads
        assert_eq!(head_groups(0, 4, 4), 4); // Llama-3.1-8B: 32, 8
        assert_eq!(head_groups(0, 16, 1), 8);
        assert_eq!(head_groups(0, 6, 1), 2);
        assert_eq!(head_groups(0, 3, 1), 1); // SmolLM2-135M: 9, 3
        assert_eq!(head_groups(0, 8, 5), 1);
        // Set: where it divides them, whatever the rows.
        assert_eq!(head_groups(2, 8, 64), 2);
        assert_eq!(head_groups(4, 2, 1), 1);
        assert_eq!(head_groups(1, 8, 1), 1);
    }
}
