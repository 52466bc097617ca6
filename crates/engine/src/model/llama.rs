//! The Llama family graph: llama (Llama 2/3, Mistral, SmolLM), qwen2 (Q/K/V biases) and qwen3
//! (per-head Q/K RMS norm), with tied or separate output weights
//! (llama.cpp `src/models/llama.cpp`, `qwen2.cpp`, `qwen3.cpp`; transformers `modeling_llama.py`).

use super::{DecoderParams, Loader};
use crate::backend::{AttnArgs, Backend, KvType};
use crate::{EngineError, Result};
use gguf::GgufModel;
use std::path::Path;
use std::sync::Arc;

struct Layer<B: Backend> {
    attn_norm: B::Weight,
    wq: B::Weight,
    wk: B::Weight,
    wv: B::Weight,
    wo: B::Weight,
    bq: Option<B::Weight>,
    bk: Option<B::Weight>,
    bv: Option<B::Weight>,
    q_norm: Option<B::Weight>,
    k_norm: Option<B::Weight>,
    ffn_norm: B::Weight,
    gate: B::Weight,
    up: B::Weight,
    down: B::Weight,
}

pub struct Llama<B: Backend> {
    pub params: DecoderParams,
    backend: Arc<B>,
    tok_embd: B::Weight,
    output_norm: B::Weight,
    /// `None`: tied to the token embedding.
    output: Option<B::Weight>,
    layers: Vec<Layer<B>>,
}

/// Which rows of a sequence's step produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
}

/// One sequence's part of a batched forward step: `tokens` at positions `pos0 ..`.
pub struct SeqStep<'a, B: Backend> {
    pub kv: &'a mut B::Kv,
    pub tokens: &'a [u32],
    pub pos0: usize,
    pub logits: Logits,
}

/// Activation buffers for steps of up to `rows` tokens, allocated once.
pub struct Scratch<B: Backend> {
    rows: usize,
    x: B::Buf,
    xn: B::Buf,
    q: B::Buf,
    k: B::Buf,
    v: B::Buf,
    attn: B::Buf,
    o: B::Buf,
    gate: B::Buf,
    up: B::Buf,
    act: B::Buf,
    sel: B::Buf,
    seln: B::Buf,
    logits: B::Buf,
}

impl<B: Backend> Scratch<B> {
    /// The most tokens one step can hold.
    pub fn rows(&self) -> usize {
        self.rows
    }
}

impl<B: Backend> Llama<B> {
    pub fn load(backend: Arc<B>, gguf: &Arc<GgufModel>, path: &Path) -> Result<Llama<B>> {
        let mut params = DecoderParams::from_metadata(gguf.metadata(), path)?;
        let p = &params;
        let l = Loader {
            backend: &*backend,
            gguf,
            path,
        };
        let (e, hd) = (p.n_embd, p.head_dim);
        let (qd, kvd) = (p.n_head * hd, p.n_head_kv * hd);
        let tok_embd = l.get("token_embd.weight", &[e, p.n_vocab])?;
        let output = l.opt_mat("output.weight", &[e, p.n_vocab])?;
        if output.is_none() && quant::dot::vec_dot_type(backend.weight_type(&tok_embd)).is_none() {
            return Err(EngineError::Unsupported(
                "token_embd.weight (tied output) has no matmul kernel".into(),
            ));
        }
        if let Some((file, info)) = gguf.tensor("rope_freqs.weight") {
            let codec =
                quant::codec(info.ty).ok_or_else(|| EngineError::Model("rope_freqs.weight: bad type".into()))?;
            let n = info.n_elements() as usize;
            if n != p.rope.n_dims / 2 {
                return Err(EngineError::Model(format!(
                    "rope_freqs.weight has {n} values, expected {}",
                    p.rope.n_dims / 2
                )));
            }
            let mut f = vec![0f32; n];
            (codec.dequantize)(file.tensor_data(info), &mut f);
            params.rope.freq_factors = Some(f);
        }
        let p = &params;
        let mut layers = Vec::with_capacity(p.n_layer);
        for i in 0..p.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            layers.push(Layer {
                attn_norm: l.get(&n("attn_norm.weight"), &[e])?,
                wq: l.mat(&n("attn_q.weight"), &[e, qd])?,
                wk: l.mat(&n("attn_k.weight"), &[e, kvd])?,
                wv: l.mat(&n("attn_v.weight"), &[e, kvd])?,
                wo: l.mat(&n("attn_output.weight"), &[qd, e])?,
                bq: l.opt(&n("attn_q.bias"), &[qd])?,
                bk: l.opt(&n("attn_k.bias"), &[kvd])?,
                bv: l.opt(&n("attn_v.bias"), &[kvd])?,
                q_norm: l.opt(&n("attn_q_norm.weight"), &[hd])?,
                k_norm: l.opt(&n("attn_k_norm.weight"), &[hd])?,
                ffn_norm: l.get(&n("ffn_norm.weight"), &[e])?,
                gate: l.mat(&n("ffn_gate.weight"), &[e, p.n_ff])?,
                up: l.mat(&n("ffn_up.weight"), &[e, p.n_ff])?,
                down: l.mat(&n("ffn_down.weight"), &[p.n_ff, e])?,
            });
        }
        let output_norm = l.get("output_norm.weight", &[e])?;
        Ok(Llama {
            params,
            backend,
            tok_embd,
            output_norm,
            output,
            layers,
        })
    }

    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    pub fn new_kv(&self, n_ctx: usize, ty: KvType) -> Result<B::Kv> {
        let p = &self.params;
        self.backend.alloc_kv(p.n_layer, n_ctx, p.n_head_kv * p.head_dim, ty)
    }

    pub fn scratch(&self, rows: usize) -> Scratch<B> {
        let p = &self.params;
        let b = &*self.backend;
        let (qd, kvd) = (p.n_head * p.head_dim, p.n_head_kv * p.head_dim);
        Scratch {
            rows,
            x: b.alloc(rows, p.n_embd),
            xn: b.alloc(rows, p.n_embd),
            q: b.alloc(rows, qd),
            k: b.alloc(rows, kvd),
            v: b.alloc(rows, kvd),
            attn: b.alloc(rows, qd),
            o: b.alloc(rows, p.n_embd.max(qd)),
            gate: b.alloc(rows, p.n_ff),
            up: b.alloc(rows, p.n_ff),
            act: b.alloc(rows, p.n_ff),
            sel: b.alloc(rows, p.n_embd),
            seln: b.alloc(rows, p.n_embd),
            logits: b.alloc(rows, p.n_vocab),
        }
    }

    /// One forward step over several sequences; returns the logits rows asked for, in order
    /// (each `n_vocab` long).
    pub fn forward(&self, s: &mut Scratch<B>, seqs: &mut [SeqStep<'_, B>]) -> Result<Vec<Vec<f32>>> {
        let total: usize = seqs.iter().map(|q| q.tokens.len()).sum();
        if total == 0 {
            return Ok(Vec::new());
        }
        if total > s.rows {
            return Err(EngineError::Input(format!(
                "a step of {total} tokens exceeds the batch size {}",
                s.rows
            )));
        }
        for q in seqs.iter() {
            let cap = self.backend.kv_capacity(q.kv);
            if q.pos0 + q.tokens.len() > cap {
                return Err(EngineError::ContextFull {
                    need: q.pos0 + q.tokens.len(),
                    n_ctx: cap,
                });
            }
        }
        let b = &*self.backend;
        b.run(|| self.forward_inner(s, seqs, total))
    }

    fn forward_inner(&self, s: &mut Scratch<B>, seqs: &mut [SeqStep<'_, B>], total: usize) -> Result<Vec<Vec<f32>>> {
        let p = &self.params;
        let b = &*self.backend;
        let hd = p.head_dim;
        let ids: Vec<u32> = seqs.iter().flat_map(|q| q.tokens.iter().copied()).collect();
        let positions: Vec<usize> = seqs.iter().flat_map(|q| q.pos0..q.pos0 + q.tokens.len()).collect();
        b.get_rows(&self.tok_embd, &ids, &mut s.x)?;
        let mut dump = crate::debug::Dump::from_env();
        let scale = 1.0 / (hd as f32).sqrt();
        for (il, ly) in self.layers.iter().enumerate() {
            b.rms_norm(&s.x, &ly.attn_norm, p.eps, &mut s.xn);
            dump.put(b, &format!("attn_norm-{il}"), &s.xn);
            b.matmul_many(&[&ly.wq, &ly.wk, &ly.wv], &s.xn, &mut [&mut s.q, &mut s.k, &mut s.v]);
            if let Some(bias) = &ly.bq {
                b.add_bias(&mut s.q, bias);
            }
            if let Some(bias) = &ly.bk {
                b.add_bias(&mut s.k, bias);
            }
            if let Some(bias) = &ly.bv {
                b.add_bias(&mut s.v, bias);
            }
            if let Some(w) = &ly.q_norm {
                b.head_rms_norm(&mut s.q, w, hd, p.eps);
            }
            if let Some(w) = &ly.k_norm {
                b.head_rms_norm(&mut s.k, w, hd, p.eps);
            }
            b.rope(&mut s.q, hd, &positions, &p.rope);
            b.rope(&mut s.k, hd, &positions, &p.rope);
            dump.put(b, &format!("Qcur-{il}"), &s.q);
            dump.put(b, &format!("Kcur-{il}"), &s.k);
            dump.put(b, &format!("Vcur-{il}"), &s.v);
            let mut row0 = 0;
            for q in seqs.iter_mut() {
                let rows = q.tokens.len();
                b.store_kv(q.kv, il, q.pos0, &s.k, &s.v, row0..row0 + rows);
                let args = AttnArgs {
                    layer: il,
                    row0,
                    rows,
                    pos0: q.pos0,
                    n_head: p.n_head,
                    n_kv_head: p.n_head_kv,
                    head_dim: hd,
                    scale,
                    window: None,
                    causal: true,
                };
                b.attention(&s.q, q.kv, &args, &mut s.attn);
                row0 += rows;
            }
            dump.put(b, &format!("kqv_out-{il}"), &s.attn);
            b.matmul(&ly.wo, &s.attn, &mut s.o);
            dump.put(b, &format!("attn_out-{il}"), &s.o);
            b.add(&mut s.x, &s.o);
            dump.put(b, &format!("ffn_inp-{il}"), &s.x);
            b.rms_norm(&s.x, &ly.ffn_norm, p.eps, &mut s.xn);
            dump.put(b, &format!("ffn_norm-{il}"), &s.xn);
            b.matmul_many(&[&ly.gate, &ly.up], &s.xn, &mut [&mut s.gate, &mut s.up]);
            dump.put(b, &format!("ffn_gate-{il}"), &s.gate);
            dump.put(b, &format!("ffn_up-{il}"), &s.up);
            b.swiglu(&s.gate, &s.up, &mut s.act);
            dump.put(b, &format!("ffn_swiglu-{il}"), &s.act);
            b.matmul(&ly.down, &s.act, &mut s.o);
            dump.put(b, &format!("ffn_out-{il}"), &s.o);
            b.add(&mut s.x, &s.o);
            dump.put(b, &format!("l_out-{il}"), &s.x);
        }
        let mut rows = Vec::new();
        let mut row0 = 0;
        for q in seqs.iter() {
            let n = q.tokens.len();
            match q.logits {
                Logits::None => {}
                Logits::Last => rows.push(row0 + n - 1),
                Logits::All => rows.extend(row0..row0 + n),
            }
            row0 += n;
        }
        debug_assert!(row0 == total);
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        b.select_rows(&s.x, &rows, &mut s.sel);
        b.rms_norm(&s.sel, &self.output_norm, p.eps, &mut s.seln);
        b.matmul(self.output.as_ref().unwrap_or(&self.tok_embd), &s.seln, &mut s.logits);
        dump.put(b, "result_output", &s.logits);
        let flat = b.read(&s.logits);
        Ok(flat.chunks(p.n_vocab).map(|c| c.to_vec()).collect())
    }
}
