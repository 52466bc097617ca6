//! What a sampler reads of the logits, found on the GPU: each ask's top values and its values at
//! some columns (`Backend::top_of_rows`, `kernels/mmq.cu` top_rows), or the sampled token itself
//! (`Backend::sample_rows`, `kernels/sample.cu` sample_rows), cross to the host instead of the
//! rows.

use super::dev::A;
use super::{Cuda, CudaBuf};
use crate::backend::{SampleAsk, Top, TopAsk};

impl Cuda {
    /// `top_of_rows` on the GPU (`kernels/mmq.cu` top_rows): one block per ask, the asks' values
    /// read back in one copy and each ask's top sorted as `sampler::top_of` orders it.
    pub(super) fn top_rows(&self, x: &CudaBuf, asks: &[TopAsk]) -> Vec<Top> {
        // (At most the row's length each: `top_of_rows` takes this path for asks of at most an
        // eighth of it.)
        let kmax = asks.iter().map(|a| a.n.min(x.cols)).max().unwrap_or(0).max(1);
        let (mut table, mut at): (Vec<i32>, Vec<i32>) = (Vec::new(), Vec::new());
        for a in asks {
            assert!(a.row < x.rows, "top_of_rows: row {} of {}", a.row, x.rows);
            table.extend([a.row as i32, a.n.min(kmax) as i32, at.len() as i32, a.at.len() as i32]);
            // (Columns past i32 are past any row: the kernel gives 0 for them.)
            at.extend(a.at.iter().map(|&c| c.min(i32::MAX as u32) as i32));
        }
        let n_at = at.len();
        if at.is_empty() {
            at.push(0);
        }
        let (table, at_ptr) = (self.dev.upload(&table), self.dev.upload(&at));
        let slots = asks.len() * kmax;
        let words = 2 * slots + n_at;
        let out = self.grown(
            &self.dev.top_out,
            words,
            words.next_power_of_two(),
            "the logits' top values",
        );
        self.dev.launch(
            "top_rows",
            (asks.len() as u32, 1),
            1024,
            &[
                A::P(x.ptr),
                A::I(x.cols as i32),
                A::P(table),
                A::P(at_ptr),
                A::I(kmax as i32),
                A::P(out),
                A::P(out + 4 * slots as u64),
                A::P(out + 8 * slots as u64),
            ],
        );
        let words32: Vec<u32> = self.dev.read_with(out, 4 * words, |bytes| {
            bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        });
        let (vals, rest) = words32.split_at(slots);
        let (ids, at_vals) = rest.split_at(slots);
        let mut at0 = 0;
        asks.iter()
            .enumerate()
            .map(|(i, a)| {
                let mut top: Vec<(u32, f32)> = (0..kmax)
                    .map(|j| (ids[i * kmax + j] as i32, f32::from_bits(vals[i * kmax + j])))
                    .filter(|&(c, _)| c >= 0)
                    .map(|(c, v)| (c as u32, v))
                    .collect();
                top.sort_by(crate::sampler::by_logit);
                let at = at_vals[at0..at0 + a.at.len()]
                    .iter()
                    .map(|&b| f32::from_bits(b))
                    .collect();
                at0 += a.at.len();
                Top { top, at, cols: x.cols }
            })
            .collect()
    }

    /// `sample_rows` on the GPU (`kernels/sample.cu`): one block per ask, the tokens read back
    /// in one copy. The asks' rows are left changed (bias, penalties: each block changes its row
    /// before it reads it, so no two asks may name one row).
    pub(super) fn sample_rows_dev(&self, x: &CudaBuf, asks: &[SampleAsk]) -> Vec<u32> {
        debug_assert!(
            {
                let mut rows: Vec<usize> = asks.iter().map(|a| a.row).collect();
                rows.sort_unstable();
                rows.windows(2).all(|w| w[0] != w[1])
            },
            "sample_rows: two asks of one row"
        );
        let (mut table, mut changes): (Vec<i32>, Vec<i32>) = (Vec::new(), Vec::new());
        for a in asks {
            assert!(a.row < x.rows, "sample_rows: row {} of {}", a.row, x.rows);
            let c = &a.cuts;
            let u = a.u.to_bits();
            table.extend([
                a.row as i32,
                // (A cut past i32 keeps every token of any row.)
                c.top_k.min(i32::MAX as usize) as i32,
                (changes.len() / 4) as i32,
                a.changes.len() as i32,
                c.top_p.to_bits() as i32,
                c.min_p_ln.is_some() as i32,
                c.min_p_ln.unwrap_or(0.0).to_bits() as i32,
                c.temperature.to_bits() as i32,
                u as u32 as i32,
                (u >> 32) as u32 as i32,
            ]);
            for ch in &a.changes {
                changes.extend([
                    ch.token as i32,
                    ch.penalty as i32,
                    ch.a.to_bits() as i32,
                    ch.b.to_bits() as i32,
                ]);
            }
        }
        if changes.is_empty() {
            changes.extend([0; 4]);
        }
        let (table, changes) = (self.dev.upload(&table), self.dev.upload(&changes));
        let out = self.grown(
            &self.dev.top_out,
            asks.len(),
            asks.len().next_power_of_two(),
            "the sampled tokens",
        );
        self.dev.launch(
            "sample_rows",
            (asks.len() as u32, 1),
            1024,
            &[A::P(x.ptr), A::I(x.cols as i32), A::P(table), A::P(changes), A::P(out)],
        );
        self.dev.read_with(out, 4 * asks.len(), |bytes| {
            bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }
}
