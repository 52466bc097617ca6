//! The Llama family graph: llama (Llama 2/3, Mistral, SmolLM), qwen2 (Q/K/V biases) and qwen3
//! (per-head Q/K RMS norm), with tied or separate output weights
//! (llama.cpp `src/models/llama.cpp`, `qwen2.cpp`, `qwen3.cpp`; transformers `modeling_llama.py`).

use super::batch::{self, KvLayer, Model, ModelInfo, Scratch, SeqStep};
use super::blocks::{self, AttnShape, Ffn, FfnBufs, Glu, HeadBufs, LayerFfn, MoeBufs};
use super::{DecoderParams, Loader};
use crate::backend::{Backend, Norm, QkNorm};
use crate::{EngineError, Result};
use gguf::GgufModel;
use gguf::Tensor as T;
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
    ffn: LayerFfn<B>,
}

pub struct Llama<B: Backend> {
    pub params: DecoderParams,
    info: ModelInfo,
    kv: Vec<KvLayer>,
    backend: Arc<B>,
    tok_embd: B::Weight,
    output_norm: B::Weight,
    /// `None`: tied to the token embedding.
    output: Option<B::Weight>,
    layers: Vec<Layer<B>>,
}

/// Activation buffers for steps of up to `rows` tokens, allocated once.
struct Bufs<B: Backend> {
    x: B::Buf,
    xn: B::Buf,
    q: B::Buf,
    k: B::Buf,
    v: B::Buf,
    attn: B::Buf,
    o: B::Buf,
    ffn: FfnBufs<B>,
    moe: Option<MoeBufs<B>>,
    head: HeadBufs<B>,
}

impl<B: Backend> batch::StepBufs<B> for Bufs<B> {
    fn head(&self) -> &HeadBufs<B> {
        &self.head
    }
}

impl<B: Backend> Llama<B> {
    pub fn load(backend: Arc<B>, gguf: &Arc<GgufModel>, path: &Path) -> Result<Llama<B>> {
        Llama::load_with(backend, gguf, path, |l, i, p| {
            Ok(LayerFfn::Dense(Ffn {
                gate: l.mat(&T::FfnGate.blk(i), &[p.n_embd, p.n_ff])?,
                up: l.mat(&T::FfnUp.blk(i), &[p.n_embd, p.n_ff])?,
                down: l.mat(&T::FfnDown.blk(i), &[p.n_ff, p.n_embd])?,
            }))
        })
    }

    /// The Llama graph with each layer's FFN made by `ffn` (dense here, experts for Qwen3-MoE).
    pub(crate) fn load_with(
        backend: Arc<B>,
        gguf: &Arc<GgufModel>,
        path: &Path,
        ffn: impl Fn(&Loader<'_, B>, usize, &DecoderParams) -> Result<LayerFfn<B>>,
    ) -> Result<Llama<B>> {
        let mut params = DecoderParams::from_metadata(gguf.metadata(), path)?;
        let p = &params;
        let l = Loader {
            backend: &*backend,
            gguf,
            path,
        };
        let (e, hd) = (p.n_embd, p.head_dim);
        let (qd, kvd) = (p.n_head * hd, p.n_head_kv * hd);
        let tok_embd = l.get(&T::TokenEmbd.weight(), &[e, p.n_vocab])?;
        let output = l.opt_mat(&T::Output.weight(), &[e, p.n_vocab])?;
        if output.is_none() && quant::dot::vec_dot_type(backend.weight_type(&tok_embd)).is_none() {
            return Err(EngineError::Unsupported(
                "token_embd.weight (tied output) has no matmul kernel".into(),
            ));
        }
        if let Some(f) = l.host(&T::RopeFreqs.weight())? {
            if f.len() != p.rope.n_dims / 2 {
                return Err(EngineError::Model(format!(
                    "rope_freqs.weight has {} values, expected {}",
                    f.len(),
                    p.rope.n_dims / 2
                )));
            }
            params.rope.freq_factors = Some(f);
        }
        let p = &params;
        let mut layers = Vec::with_capacity(p.n_layer);
        for i in 0..p.n_layer {
            layers.push(Layer {
                attn_norm: l.get(&T::AttnNorm.blk(i), &[e])?,
                wq: l.mat(&T::AttnQ.blk(i), &[e, qd])?,
                wk: l.mat(&T::AttnK.blk(i), &[e, kvd])?,
                wv: l.mat(&T::AttnV.blk(i), &[e, kvd])?,
                wo: l.mat(&T::AttnOutput.blk(i), &[qd, e])?,
                bq: l.opt(&T::AttnQ.with(i, "bias"), &[qd])?,
                bk: l.opt(&T::AttnK.with(i, "bias"), &[kvd])?,
                bv: l.opt(&T::AttnV.with(i, "bias"), &[kvd])?,
                q_norm: l.opt(&T::AttnQNorm.blk(i), &[hd])?,
                k_norm: l.opt(&T::AttnKNorm.blk(i), &[hd])?,
                ffn_norm: l.get(&T::FfnNorm.blk(i), &[e])?,
                ffn: ffn(&l, i, p)?,
            });
        }
        let output_norm = l.get(&T::OutputNorm.weight(), &[e])?;
        let info = params.info();
        let kv = vec![KvLayer::own(kvd, kvd, None); params.n_layer];
        Ok(Llama {
            params,
            info,
            kv,
            backend,
            tok_embd,
            output_norm,
            output,
            layers,
        })
    }
}

impl<B: Backend> Model<B> for Llama<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    fn kv_layers(&self) -> &[KvLayer] {
        &self.kv
    }

    fn scratch(&self, rows: usize) -> Scratch {
        let p = &self.params;
        let b = &*self.backend;
        let (qd, kvd) = (p.n_head * p.head_dim, p.n_head_kv * p.head_dim);
        let bufs: Bufs<B> = Bufs {
            x: b.alloc(rows, p.n_embd),
            xn: b.alloc(rows, p.n_embd),
            q: b.alloc(rows, qd),
            k: b.alloc(rows, kvd),
            v: b.alloc(rows, kvd),
            attn: b.alloc(rows, qd),
            o: b.alloc(rows, p.n_embd.max(qd)),
            ffn: FfnBufs::new(b, rows, p.n_ff),
            moe: self.layers.iter().find_map(|l| match &l.ffn {
                LayerFfn::Moe(m) => Some(MoeBufs::new(b, rows, p.n_embd, m.n_ff, &m.routing)),
                LayerFfn::Dense(_) => None,
            }),
            head: HeadBufs::new(b, rows, p.n_embd, p.n_vocab),
        };
        Scratch::new(rows, bufs)
    }

    fn forward(&self, s: &mut Scratch, seqs: &mut [SeqStep<'_, B>]) -> Result<Vec<Vec<f32>>> {
        let run = |t: &mut Bufs<B>, q: &mut [SeqStep<'_, B>]| self.forward_inner(t, q);
        batch::step(&*self.backend, s, seqs, run, |b, h| h.read(b))
    }

    fn forward_argmax(&self, s: &mut Scratch, seqs: &mut [SeqStep<'_, B>]) -> Result<Vec<u32>> {
        let run = |t: &mut Bufs<B>, q: &mut [SeqStep<'_, B>]| self.forward_inner(t, q);
        batch::step(&*self.backend, s, seqs, run, |b, h| h.argmax(b))
    }

    fn logits_row(&self, s: &mut Scratch, i: usize) -> Result<Vec<f32>> {
        batch::logits_row::<B, Bufs<B>>(&*self.backend, s, i)
    }

    fn logits_top(&self, s: &mut Scratch, asks: &[crate::backend::TopAsk]) -> Result<Vec<crate::backend::Top>> {
        batch::logits_top::<B, Bufs<B>>(&*self.backend, s, asks)
    }

    fn logits_sample(&self, s: &mut Scratch, asks: &[crate::backend::SampleAsk]) -> Result<Vec<u32>> {
        batch::logits_sample::<B, Bufs<B>>(&*self.backend, s, asks)
    }

    fn samples_on_device(&self) -> bool {
        self.backend.samples_on_device()
    }

    fn forward_argmax_defer(&self, s: &mut Scratch, seqs: &mut [SeqStep<'_, B>]) -> Result<crate::backend::Deferred> {
        let run = |t: &mut Bufs<B>, q: &mut [SeqStep<'_, B>]| self.forward_inner(t, q);
        let empty = || crate::backend::Deferred::ready(Vec::new());
        batch::step_as(&*self.backend, s, seqs, run, |b, h| h.argmax_defer(b), empty)
    }

    fn feeds_tokens(&self) -> bool {
        // Token ids reach this family's graph through `embed` only.
        self.backend.feeds_tokens()
    }
}

impl<B: Backend> Llama<B> {
    fn forward_inner(&self, s: &mut Bufs<B>, seqs: &mut [SeqStep<'_, B>]) -> Result<()> {
        let p = &self.params;
        let b = &*self.backend;
        let hd = p.head_dim;
        let step = batch::begin_step(b, seqs)?;
        b.embed(&self.tok_embd, &step, &mut s.x)?;
        let mut dump = crate::debug::Dump::from_env();
        let shape = AttnShape {
            n_head: p.n_head,
            n_kv_head: p.n_head_kv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        for (il, ly) in self.layers.iter().enumerate() {
            // Later layers' input norms come with the residual add that ends the layer before.
            if il == 0 {
                b.rms_norm(&s.x, &ly.attn_norm, p.eps, &mut s.xn);
            }
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
            // Qwen 3's per-head norms of q and k (both or neither) go with the rotation.
            let norm = match (&ly.q_norm, &ly.k_norm) {
                (Some(q), Some(k)) => Some(QkNorm { q, k, eps: p.eps }),
                (q, k) => {
                    if let Some(w) = q {
                        b.head_rms_norm(&mut s.q, Some(w), hd, p.eps);
                    }
                    if let Some(w) = k {
                        b.head_rms_norm(&mut s.k, Some(w), hd, p.eps);
                    }
                    None
                }
            };
            // Normed, roped (and the keys stored) with the attention; the dumps after it see the
            // roped q, k.
            blocks::rope_attend(
                b,
                &step,
                seqs,
                il,
                &self.kv[il],
                shape,
                norm,
                &p.rope,
                &mut s.q,
                &mut s.k,
                &s.v,
                &mut s.attn,
            );
            dump.put(b, &format!("Qcur-{il}"), &s.q);
            dump.put(b, &format!("Kcur-{il}"), &s.k);
            dump.put(b, &format!("Vcur-{il}"), &s.v);
            dump.put(b, &format!("kqv_out-{il}"), &s.attn);
            b.matmul(&ly.wo, &s.attn, &mut s.o);
            dump.put(b, &format!("attn_out-{il}"), &s.o);
            match &ly.ffn {
                // The FFN's norm and gated activation inside the gate / up products where the
                // backend does that (GPU decode steps), never while dumping.
                LayerFfn::Dense(f) if !dump.on() && b.fuses_products(&[&f.gate, &f.up], &s.x) => {
                    let norm = Norm {
                        w: &ly.ffn_norm,
                        eps: p.eps,
                    };
                    let t = &mut s.ffn;
                    let scratch = (&mut s.xn, &mut t.gate, &mut t.up);
                    b.add_norm_glu(&mut s.x, &s.o, norm, [&f.gate, &f.up], Glu::Swiglu, scratch, &mut t.act);
                    b.matmul(&f.down, &t.act, &mut s.o);
                }
                ffn => {
                    b.add_rms_norm(&mut s.x, &s.o, &ly.ffn_norm, p.eps, &mut s.xn);
                    dump.put(b, &format!("ffn_inp-{il}"), &s.x);
                    dump.put(b, &format!("ffn_norm-{il}"), &s.xn);
                    match ffn {
                        LayerFfn::Dense(f) => blocks::ffn(b, f, Glu::Swiglu, &s.xn, &mut s.ffn, &mut s.o),
                        LayerFfn::Moe(m) => {
                            let t = s.moe.as_mut().expect("MoE buffers for a MoE model");
                            blocks::moe_ffn(
                                b,
                                &m.router,
                                &m.experts,
                                &m.routing,
                                Glu::Swiglu,
                                &s.xn,
                                &s.xn,
                                t,
                                None,
                                &mut s.o,
                            )?
                        }
                    }
                }
            }
            dump.put(b, &format!("ffn_out-{il}"), &s.o);
            match self.layers.get(il + 1) {
                Some(next) => b.add_rms_norm(&mut s.x, &s.o, &next.attn_norm, p.eps, &mut s.xn),
                None => b.add(&mut s.x, &s.o),
            }
            dump.put(b, &format!("l_out-{il}"), &s.x);
        }
        let output = self.output.as_ref().unwrap_or(&self.tok_embd);
        blocks::logits(
            b,
            seqs,
            &s.x,
            &self.output_norm,
            p.eps,
            output,
            None,
            &mut s.head,
            &mut dump,
        );
        Ok(())
    }
}
