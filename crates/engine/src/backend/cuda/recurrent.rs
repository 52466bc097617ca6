//! The CUDA backend's ops of hybrid models (`kernels/recurrent.cu`): the causal convolution and
//! the gated delta rule over each sequence's recurrent state in device memory (copies kept where
//! the sequence asks, as on the CPU), and the gated attention layers' helpers. The delta rule runs
//! token by token for every run (the CPU chunks long runs; both are the same rule within f32
//! rounding).

use super::dev::{blocks, A};
use super::{Cuda, CudaBuf, CudaKv, CudaStep, CudaWeight};
use crate::backend::DeltaNetLayer;

/// Which part of a layer's state an op takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Conv,
    Ssm,
}

/// A call's tables on the device (see `recurrent.cu`) and, per sequence, the copies it takes.
struct Tables {
    tab: u64,
    ptr: u64,
    copies: usize,
    wanted: Vec<Vec<usize>>,
}

impl Cuda {
    fn state_tables(&self, step: &CudaStep, kvs: &mut [&mut CudaKv], l: &DeltaNetLayer, part: Part) -> Tables {
        let n = step.plan.seqs.len();
        assert_eq!(kvs.len(), n, "recurrent ops: {} caches for {n} sequences", kvs.len());
        let mut tab: Vec<i32> = Vec::with_capacity(4 * n);
        let mut ptr: Vec<u64> = Vec::with_capacity(n);
        let (mut cp_t, mut cp_ptr) = (Vec::new(), Vec::new());
        let mut wanted = Vec::with_capacity(n);
        let mut replaced = false;
        for (kv, s) in kvs.iter_mut().zip(&step.plan.seqs) {
            let r = kv
                .rec
                .as_mut()
                .expect("a recurrent op on a cache without recurrent layers");
            let slot = r.layout.slot(l.layer);
            assert!(
                slot.shape.conv_dim == l.conv_dim()
                    && slot.shape.conv_rows + 1 == l.kernel
                    && (slot.shape.heads, slot.shape.head_k, slot.shape.head_v) == (l.n_v_heads, l.head_k, l.head_v),
                "recurrent ops: the cache's state of layer {} does not fit the layer",
                l.layer
            );
            if part == Part::Conv && r.layout.slots.iter().position(|s| s.is_some()) == Some(l.layer) {
                // As on the CPU: until the step's last recurrent layer ends it, no whole position.
                r.seq.pos = usize::MAX;
            }
            let off = 4 * match part {
                Part::Conv => slot.conv,
                Part::Ssm => slot.ssm,
            } as u64;
            let w = if s.rows > 0 {
                r.seq.wanted_in(s.pos0, s.rows)
            } else {
                Vec::new()
            };
            tab.extend([s.row0 as i32, s.rows as i32, cp_t.len() as i32, w.len() as i32]);
            ptr.push(r.ptr + off);
            for &p in &w {
                let (at, copied) = kv
                    .copy_target(p)
                    .unwrap_or_else(|e| self.dev.fail("allocating a recurrent-state copy", e));
                replaced |= copied;
                cp_t.push((p - s.pos0) as i32);
                cp_ptr.push(at + off);
            }
            wanted.push(w);
        }
        if replaced {
            // A shared page was copied to hold a state copy: the step's page table follows.
            let mut host = step.ptab_host.lock().unwrap_or_else(|e| e.into_inner());
            let fresh: Vec<u64> = kvs.iter().flat_map(|kv| kv.pages.iter().map(|p| p.ptr)).collect();
            if fresh.len() == host.len() && *host != fresh {
                *host = fresh;
                let bytes: Vec<u8> = host.iter().flat_map(|p| p.to_le_bytes()).collect();
                self.dev.write_bytes(step.ptab, &bytes);
            }
        }
        let copies = cp_t.len();
        tab.extend(cp_t);
        ptr.extend(cp_ptr);
        Tables {
            tab: self.dev.upload(&tab),
            ptr: self.dev.upload(&ptr),
            copies,
            wanted,
        }
    }

    pub(super) fn ssm_conv_op(
        &self,
        x: &CudaBuf,
        w: &CudaWeight,
        step: &CudaStep,
        kvs: &mut [&mut CudaKv],
        l: &DeltaNetLayer,
        out: &mut CudaBuf,
    ) {
        let (c, k) = (l.conv_dim(), l.kernel);
        assert_eq!(x.cols, c, "ssm_conv: rows of {} values for {c} channels", x.cols);
        assert!(
            w.row_len() == k && w.n_rows() == c && w.dev_ty == gguf::GgmlType::F32,
            "ssm_conv: an F32 weight [{k}, {c}] (found {:?} of {})",
            w.shape,
            w.dev_ty.name()
        );
        out.shape_from(x.rows, &x.runs, c);
        let t = self.state_tables(step, kvs, l, Part::Conv);
        let n = step.plan.seqs.len();
        let cb = c.div_ceil(128) as u32;
        let common = [A::P(t.tab), A::P(t.ptr), A::I(n as i32), A::I(c as i32), A::I(k as i32)];
        if x.rows > 0 {
            let mut args = vec![A::P(x.ptr), A::P(self.dev.ptr(&w.data)), A::P(out.ptr)];
            args.extend(common);
            self.dev.launch("ssm_conv", (x.rows as u32, cb), 128, &args);
        }
        for (mode, grid) in [(0, t.copies), (1, n)] {
            if grid == 0 {
                continue;
            }
            let mut args = vec![A::P(x.ptr)];
            args.extend(common);
            args.push(A::I(mode));
            self.dev.launch("ssm_conv_state", (grid as u32, cb), 128, &args);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn gated_delta_net_op(
        &self,
        qkv: &CudaBuf,
        alpha: &CudaBuf,
        beta: &CudaBuf,
        dt_bias: &CudaWeight,
        a: &CudaWeight,
        step: &CudaStep,
        kvs: &mut [&mut CudaKv],
        l: &DeltaNetLayer,
        out: &mut CudaBuf,
    ) {
        let (nk, nv, hk, hv) = (l.n_k_heads, l.n_v_heads, l.head_k, l.head_v);
        assert_eq!(qkv.cols, l.conv_dim(), "gated_delta_net: rows of {} values", qkv.cols);
        assert!(
            alpha.cols == nv && beta.cols == nv && nk > 0 && nv.is_multiple_of(nk),
            "gated_delta_net: {} / {} gate columns for {nv} value heads over {nk} key heads",
            alpha.cols,
            beta.cols
        );
        assert!(
            matches!(hk, 64 | 128) && hv.is_multiple_of(32) && hv <= 1024,
            "CUDA gated_delta_net takes key heads of 64 or 128 values and value heads of a multiple of 32 \
             (up to 1024), not {hk} and {hv}"
        );
        out.shape_from(qkv.rows, &qkv.runs, nv * hv);
        let t = self.state_tables(step, kvs, l, Part::Ssm);
        let n = step.plan.seqs.len();
        self.dev.launch(
            &format!("gated_delta_net_{hk}"),
            (n as u32, nv as u32),
            hv as u32,
            &[
                A::P(qkv.ptr),
                A::P(alpha.ptr),
                A::P(beta.ptr),
                A::P(self.dev.ptr(&dt_bias.data)),
                A::P(self.dev.ptr(&a.data)),
                A::P(out.ptr),
                A::P(t.tab),
                A::P(t.ptr),
                A::I(n as i32),
                A::I(nk as i32),
                A::I(nv as i32),
                A::I(hv as i32),
                A::F(l.eps),
                A::F(1.0 / (hk as f32).sqrt()),
            ],
        );
        for ((kv, s), wanted) in kvs.iter_mut().zip(&step.plan.seqs).zip(&t.wanted) {
            for &p in wanted {
                kv.copy_layer_done(p);
            }
            let r = kv.rec.as_mut().expect("checked by state_tables");
            if s.rows > 0 && r.layout.is_last(l.layer) {
                r.seq.advance(s.pos0 + s.rows);
            }
        }
    }

    pub(super) fn sigmoid_mul_op(&self, x: &mut CudaBuf, g: &CudaBuf) {
        assert!(
            g.rows == x.rows && (g.cols == x.cols || g.cols == 1),
            "sigmoid_mul: gates {}x{} for {}x{}",
            g.rows,
            g.cols,
            x.rows,
            x.cols
        );
        let n = x.len();
        if n == 0 {
            return;
        }
        self.dev.launch(
            "sigmoid_mul",
            (blocks(n, 256), 1),
            256,
            &[
                A::P(x.ptr),
                A::P(g.ptr),
                A::P(n),
                A::I(x.cols as i32),
                A::I(g.cols as i32),
            ],
        );
    }

    pub(super) fn unzip_heads_op(&self, x: &CudaBuf, width: usize, a: &mut CudaBuf, b: &mut CudaBuf) {
        assert!(
            width > 0 && x.cols.is_multiple_of(2 * width),
            "unzip_heads: rows of {} values in pairs of {width}",
            x.cols
        );
        a.shape_from(x.rows, &x.runs, x.cols / 2);
        b.shape_from(x.rows, &x.runs, x.cols / 2);
        let n = x.len();
        if n == 0 {
            return;
        }
        self.dev.launch(
            "unzip_heads",
            (blocks(n, 256), 1),
            256,
            &[
                A::P(x.ptr),
                A::P(a.ptr),
                A::P(b.ptr),
                A::I(x.rows as i32),
                A::I(x.cols as i32),
                A::I(width as i32),
            ],
        );
    }
}
