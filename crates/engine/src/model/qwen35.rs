//! Qwen 3.5 / 3.6 (`qwen35`, `qwen35moe`): hybrid decoders that interleave Gated DeltaNet
//! (linear attention) layers with gated full-attention layers (llama.cpp `src/models/qwen35.cpp`,
//! `qwen35moe.cpp`, `delta-net-base.cpp`; transformers `modeling_qwen3_5.py`,
//! `modeling_qwen3_5_moe.py`).
//!
//! - Linear layers: one projection gives q, k and v (`attn_qkv`), which go through a causal
//!   depthwise convolution with SiLU (its last inputs are the sequence's conv state); q and k are
//!   L2-normalised per head and the gated delta rule updates the sequence's delta state
//!   (`Backend::gated_delta_net`); the output is RMS-normed per head, gated by silu(z) (`attn_gate`
//!   projection) and projected back (`ssm_out`).
//! - Full-attention layers: the Q projection carries a per-head output gate (`[q, gate]` per head),
//!   per-head Q/K RMS norm, NeoX rope over the first `rope.dimension_count` values of each head
//!   (the multimodal sections reduce to it for text: every section gets the same position), and
//!   the attention output is multiplied by sigmoid(gate).
//! - Every layer: pre-norm, residual, post-attention norm, then a SwiGLU FFN (`qwen35`) or a MoE
//!   FFN (softmax top-k, renormalised) plus a shared expert scaled by sigmoid of its own gate
//!   (`qwen35moe`).
//!
//! - The multi-token-prediction (MTP) block (`nextn_predict_layers`, the block after the
//!   decoder's; llama.cpp `src/models/qwen35.cpp` `graph_mtp`, vLLM `qwen3_next_mtp.py`): for the
//!   pair (normed last hidden state h_p of position p, token t_{p+1}),
//!   `x = eh_proj · [enorm(embed(t_{p+1})), hnorm(h_p)]` (embedding first), one full-attention
//!   layer with its own K/V (cache layer `n_layer`, at position p as vLLM places it; RoPE makes
//!   this the same as llama.cpp's p+1), then `shared_head_norm` and the shared output head: logits
//!   for t_{p+2}. Its normed output is the hidden state of the next draft. Only the first MTP
//!   block is loaded (llama.cpp supports one for this family too); the decoder never runs it.

use super::batch::{self, HiddenRows, KvLayer, Model, ModelInfo, RecurrentLayer, Scratch, SeqStep};
use super::blocks::{self, AttnShape, Ffn, FfnBufs, Glu, HeadBufs, Moe, MoeBufs, Routing};
use super::{Keys, Loader};
use crate::backend::{Backend, DeltaNetLayer, QkNorm, Rope};
use crate::{EngineError, Result};
use gguf::arch::key;
use gguf::GgufModel;
use gguf::Tensor as T;
use std::path::Path;
use std::sync::Arc;

/// A Gated DeltaNet layer's weights.
struct Linear<B: Backend> {
    shape: DeltaNetLayer,
    /// q, k, v projection (conv_dim rows), output gate z (n_v·head_v rows), β and α (n_v rows).
    wqkv: B::Weight,
    wz: B::Weight,
    wbeta: B::Weight,
    walpha: B::Weight,
    /// [kernel, conv_dim] F32.
    conv: B::Weight,
    dt_bias: B::Weight,
    /// −exp(A_log) per value head.
    a: B::Weight,
    norm: B::Weight,
    out: B::Weight,
}

/// A gated full-attention layer's weights.
struct Full<B: Backend> {
    /// Queries and their gates, `[q, gate]` per head (2·head_dim rows each).
    wq: B::Weight,
    wk: B::Weight,
    wv: B::Weight,
    q_norm: B::Weight,
    k_norm: B::Weight,
    wo: B::Weight,
}

enum Mixer<B: Backend> {
    Linear(Linear<B>),
    Full(Full<B>),
}

/// The MoE FFN and its shared expert with a sigmoid gate (one value per row).
struct SharedMoe<B: Backend> {
    moe: Moe<B>,
    shared: Option<(Ffn<B>, B::Weight)>,
}

enum LayerFfn<B: Backend> {
    Dense(Ffn<B>),
    Moe(SharedMoe<B>),
}

/// The MTP block: the projection of `[normed embedding, normed hidden]` and a decoder layer,
/// with the shared head's norm (the output norm when absent) and optional own embedding / head.
struct Mtp<B: Backend> {
    /// [2·n_embd] → [n_embd]; its first n_embd inputs take the embedding.
    eh_proj: B::Weight,
    enorm: B::Weight,
    hnorm: B::Weight,
    head_norm: Option<B::Weight>,
    embed: Option<B::Weight>,
    head: Option<B::Weight>,
    layer: Layer<B>,
}

struct Layer<B: Backend> {
    attn_norm: B::Weight,
    post_norm: B::Weight,
    mixer: Mixer<B>,
    ffn: LayerFfn<B>,
}

pub struct Qwen35<B: Backend> {
    info: ModelInfo,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    eps: f32,
    rope: Rope,
    kv: Vec<KvLayer>,
    backend: Arc<B>,
    tok_embd: B::Weight,
    output_norm: B::Weight,
    output: Option<B::Weight>,
    layers: Vec<Layer<B>>,
    mtp: Option<Mtp<B>>,
}

/// Activations of a step.
struct Bufs<B: Backend> {
    x: B::Buf,
    xn: B::Buf,
    /// Mixer output, projected back to n_embd.
    att: B::Buf,
    f: B::Buf,
    // Linear layers.
    qkv: B::Buf,
    conv: B::Buf,
    z: B::Buf,
    alpha: B::Buf,
    beta: B::Buf,
    o: B::Buf,
    gated: B::Buf,
    // Full-attention layers.
    qg: B::Buf,
    q: B::Buf,
    gate: B::Buf,
    k: B::Buf,
    v: B::Buf,
    attn: B::Buf,
    ffn: FfnBufs<B>,
    moe: Option<MoeBuffers<B>>,
    head: HeadBufs<B>,
    // The MTP block (one column each without one): the normed last hidden state of every row of
    // the last target step (`hid`) and of the last MTP step (`mhid`), the hidden rows an MTP step
    // reads (`h`, normed: `hn`) and its projection's input `[enorm(embedding), hnorm(h)]` (`cat`).
    hid: B::Buf,
    mhid: B::Buf,
    h: B::Buf,
    hn: B::Buf,
    cat: B::Buf,
}

impl<B: Backend> batch::StepBufs<B> for Bufs<B> {
    fn head(&self) -> &HeadBufs<B> {
        &self.head
    }
}

struct MoeBuffers<B: Backend> {
    moe: MoeBufs<B>,
    shared: FfnBufs<B>,
    shared_out: B::Buf,
    shared_gate: B::Buf,
}

impl<B: Backend> Qwen35<B> {
    pub fn load(backend: Arc<B>, gguf: &Arc<GgufModel>, path: &Path) -> Result<Qwen35<B>> {
        let meta = gguf.metadata();
        let arch = meta.architecture().unwrap_or_default().to_string();
        let moe = arch == "qwen35moe";
        let k = Keys {
            meta,
            arch: &arch,
            path,
        };
        let bad = |why: String| EngineError::Model(format!("{}: {why}", path.display()));
        let n_embd = k.u(key::EMBEDDING_LENGTH)?;
        let n_all = k.u(key::BLOCK_COUNT)?;
        let n_mtp = k.u_or(key::NEXTN_PREDICT_LAYERS, 0);
        if n_mtp >= n_all {
            return Err(bad(format!(
                "{n_mtp} MTP layers of {n_all} blocks leave no decoder layer"
            )));
        }
        let n_layer = n_all - n_mtp;
        let n_head = k.u(key::ATTN_HEAD_COUNT)?;
        let n_kv_head = k.u_or(key::ATTN_HEAD_COUNT_KV, n_head);
        let head_dim = k.u_or(key::ATTN_KEY_LENGTH, n_embd / n_head.max(1));
        if n_head == 0 || n_kv_head == 0 || !n_head.is_multiple_of(n_kv_head) {
            return Err(bad(format!(
                "{n_head} attention heads cannot share {n_kv_head} KV heads"
            )));
        }
        let n_rot = k.u_or(key::ROPE_DIMENSION_COUNT, head_dim);
        if n_rot > head_dim || !n_rot.is_multiple_of(2) {
            return Err(bad(format!("rope dimension {n_rot} does not fit heads of {head_dim}")));
        }
        let eps = k.f_or(key::ATTN_LAYERNORM_RMS_EPS, 1e-6);
        let n_ctx_train = k.u_or(key::CONTEXT_LENGTH, 4096);
        let n_vocab = meta
            .get_array("tokenizer.ggml.tokens")
            .map(|a| a.len())
            .ok_or_else(|| bad("no tokenizer.ggml.tokens".into()))?;
        // Linear attention: llama.cpp llama_model_qwen35::load_arch_hparams.
        let kernel = k.u(key::SSM_CONV_KERNEL)?;
        let d_inner = k.u(key::SSM_INNER_SIZE)?;
        let head_k = k.u(key::SSM_STATE_SIZE)?;
        let n_k_heads = k.u(key::SSM_GROUP_COUNT)?;
        let n_v_heads = k.u(key::SSM_TIME_STEP_RANK)?;
        if kernel < 2
            || n_k_heads == 0
            || n_v_heads == 0
            || !n_v_heads.is_multiple_of(n_k_heads)
            || !d_inner.is_multiple_of(n_v_heads)
        {
            return Err(bad(format!(
                "linear attention of {n_v_heads} value heads over {n_k_heads} key heads, inner size {d_inner}, \
                 convolution width {kernel}"
            )));
        }
        let head_v = d_inner / n_v_heads;
        let recurrent: Vec<bool> = match meta.get_array(&k.key(key::ATTN_RECURRENT_LAYERS)) {
            Some(a) => (0..n_layer)
                .map(|i| a.get(i).and_then(|v| v.as_bool().or(v.as_u64().map(|u| u != 0))))
                .collect::<Option<Vec<bool>>>()
                .ok_or_else(|| {
                    bad(format!(
                        "{} must hold a boolean for each of the {n_layer} layers",
                        k.key(key::ATTN_RECURRENT_LAYERS)
                    ))
                })?,
            None => {
                // llama.cpp: every `full_attention_interval`-th layer is full attention.
                let every = k.u_or(key::FULL_ATTENTION_INTERVAL, 4).max(1);
                (0..n_layer).map(|i| (i + 1) % every != 0).collect()
            }
        };
        let rope = Rope {
            n_dims: n_rot,
            neox: true,
            freq_base: k.f_or(key::ROPE_FREQ_BASE, 10000.0),
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: n_ctx_train,
            freq_factors: None,
        };
        let l = Loader {
            backend: &*backend,
            gguf,
            path,
        };
        let e = n_embd;
        let tok_embd = l.get(&T::TokenEmbd.weight(), &[e, n_vocab])?;
        let output = l.opt_mat(&T::Output.weight(), &[e, n_vocab])?;
        let output_norm = l.get(&T::OutputNorm.weight(), &[e])?;
        let moe_shape = if moe {
            let n_expert = k.u(key::EXPERT_COUNT)?;
            let used = k.u(key::EXPERT_USED_COUNT)?;
            if used == 0 || used > n_expert {
                return Err(bad(format!("{used} experts used per token out of {n_expert}")));
            }
            let n_ff_exp = k.u(key::EXPERT_FEED_FORWARD_LENGTH)?;
            let n_ff_shexp = k.u_or(key::EXPERT_SHARED_FEED_FORWARD_LENGTH, n_ff_exp);
            Some((n_expert, used, n_ff_exp, n_ff_shexp))
        } else {
            None
        };
        let n_ff = if moe { 0 } else { k.u(key::FEED_FORWARD_LENGTH)? };
        let mut layers = Vec::with_capacity(n_layer);
        let mut kv = Vec::with_capacity(n_layer + 1);
        let load_layer = |i: usize, rec: bool, kv: &mut Vec<KvLayer>| -> Result<Layer<B>> {
            let mixer = if rec {
                let shape = DeltaNetLayer {
                    layer: i,
                    n_k_heads,
                    n_v_heads,
                    head_k,
                    head_v,
                    kernel,
                    eps: 1e-6,
                };
                let cd = shape.conv_dim();
                kv.push(KvLayer::recurrent(RecurrentLayer {
                    conv_rows: kernel - 1,
                    conv_dim: cd,
                    heads: n_v_heads,
                    head_k,
                    head_v,
                }));
                Mixer::Linear(Linear {
                    shape,
                    wqkv: l.mat(&T::AttnQkv.blk(i), &[e, cd])?,
                    wz: l.mat(&T::AttnGate.blk(i), &[e, d_inner])?,
                    wbeta: l.mat(&T::SsmBeta.blk(i), &[e, n_v_heads])?,
                    walpha: l.mat(&T::SsmAlpha.blk(i), &[e, n_v_heads])?,
                    conv: l.get(&T::SsmConv1d.blk(i), &[kernel, cd])?,
                    dt_bias: l.get(&T::SsmDt.with(i, "bias"), &[n_v_heads])?,
                    a: l.get(&T::SsmA.base(i), &[n_v_heads])?,
                    norm: l.get(&T::SsmNorm.blk(i), &[head_v])?,
                    out: l.mat(&T::SsmOut.blk(i), &[d_inner, e])?,
                })
            } else {
                let kvd = n_kv_head * head_dim;
                kv.push(KvLayer::own(kvd, kvd, None));
                Mixer::Full(Full {
                    wq: l.mat(&T::AttnQ.blk(i), &[e, 2 * n_head * head_dim])?,
                    wk: l.mat(&T::AttnK.blk(i), &[e, kvd])?,
                    wv: l.mat(&T::AttnV.blk(i), &[e, kvd])?,
                    q_norm: l.get(&T::AttnQNorm.blk(i), &[head_dim])?,
                    k_norm: l.get(&T::AttnKNorm.blk(i), &[head_dim])?,
                    wo: l.mat(&T::AttnOutput.blk(i), &[n_head * head_dim, e])?,
                })
            };
            let ffn = match moe_shape {
                Some((n_expert, used, ff, ff_sh)) => {
                    let gate = l.mats(&T::FfnGateExps.blk(i), e, ff, n_expert)?;
                    let up = l.mats(&T::FfnUpExps.blk(i), e, ff, n_expert)?;
                    let down = l.mats(&T::FfnDownExps.blk(i), ff, e, n_expert)?;
                    let shared = match l.opt_mat(&T::FfnUpShexp.blk(i), &[e, ff_sh])? {
                        Some(up) => Some((
                            Ffn {
                                gate: l.mat(&T::FfnGateShexp.blk(i), &[e, ff_sh])?,
                                up,
                                down: l.mat(&T::FfnDownShexp.blk(i), &[ff_sh, e])?,
                            },
                            l.mat(&T::FfnGateInpShexp.blk(i), &[e])?,
                        )),
                        None => None,
                    };
                    LayerFfn::Moe(SharedMoe {
                        moe: Moe {
                            router: l.mat(&T::FfnGateInp.blk(i), &[e, n_expert])?,
                            experts: Ffn::stack(gate, up, down),
                            // transformers Qwen3_5MoeTopKRouter: softmax, top-k, divided by their sum.
                            routing: Routing {
                                n_expert,
                                k: used,
                                softmax_first: true,
                                normalize: true,
                            },
                            n_ff: ff,
                        },
                        shared,
                    })
                }
                None => LayerFfn::Dense(Ffn {
                    gate: l.mat(&T::FfnGate.blk(i), &[e, n_ff])?,
                    up: l.mat(&T::FfnUp.blk(i), &[e, n_ff])?,
                    down: l.mat(&T::FfnDown.blk(i), &[n_ff, e])?,
                }),
            };
            Ok(Layer {
                attn_norm: l.get(&T::AttnNorm.blk(i), &[e])?,
                post_norm: l.get(&T::AttnPostNorm.blk(i), &[e])?,
                mixer,
                ffn,
            })
        };
        for (i, &rec) in recurrent.iter().enumerate() {
            layers.push(load_layer(i, rec, &mut kv)?);
        }
        // The first MTP block, when the file carries its tensors (a conversion with --no-mtp
        // keeps `nextn_predict_layers` 0; one whose MTP tensors are missing runs without MTP).
        let mtp = if n_mtp > 0 && gguf.tensor(&T::NextnEhProj.blk(n_layer)).is_some() {
            let i = n_layer;
            Some(Mtp {
                eh_proj: l.mat(&T::NextnEhProj.blk(i), &[2 * e, e])?,
                enorm: l.get(&T::NextnEnorm.blk(i), &[e])?,
                hnorm: l.get(&T::NextnHnorm.blk(i), &[e])?,
                head_norm: l.opt(&T::NextnSharedHeadNorm.blk(i), &[e])?,
                embed: l.opt(&T::NextnEmbedTokens.blk(i), &[e, n_vocab])?,
                head: l.opt_mat(&T::NextnSharedHeadHead.blk(i), &[e, n_vocab])?,
                layer: load_layer(i, false, &mut kv)?,
            })
        } else {
            None
        };
        Ok(Qwen35 {
            info: ModelInfo {
                arch,
                n_vocab,
                n_embd,
                n_layer,
                n_ctx_train,
            },
            n_head,
            n_kv_head,
            head_dim,
            eps,
            rope,
            kv,
            backend,
            tok_embd,
            output_norm,
            output,
            layers,
            mtp,
        })
    }

    /// Every sequence's recurrent state must hold the positions before its step (or the step
    /// starts at 0, which starts from an empty state).
    fn check_states(&self, seqs: &mut [SeqStep<'_, B>]) -> Result<()> {
        let b = &*self.backend;
        for q in seqs.iter_mut() {
            match b.kv_state_pos(q.kv) {
                Some(p) if p == q.pos0 => {}
                Some(_) if q.pos0 == 0 => {
                    b.kv_restore(q.kv, 0);
                }
                Some(p) => {
                    let held = if p == usize::MAX {
                        "none (a step failed midway)".to_string()
                    } else {
                        p.to_string()
                    };
                    return Err(EngineError::Input(format!(
                        "a step at position {} of a sequence whose recurrent state holds {held} positions \
                         (cut the sequence back with kv_restore first)",
                        q.pos0
                    )));
                }
                None => {
                    return Err(EngineError::Input(
                        "a cache without the recurrent state of this hybrid model".into(),
                    ))
                }
            }
        }
        Ok(())
    }

    /// One decoder layer over the step's rows in `s.x` (the MTP block's layer too, `il` being
    /// its cache layer).
    fn layer(
        &self,
        s: &mut Bufs<B>,
        ly: &Layer<B>,
        il: usize,
        step: &B::Step,
        seqs: &mut [SeqStep<'_, B>],
        dump: &mut crate::debug::Dump,
    ) -> Result<()> {
        let b = &*self.backend;
        let eps = self.eps;
        let hd = self.head_dim;
        b.rms_norm(&s.x, &ly.attn_norm, eps, &mut s.xn);
        dump.put(b, &format!("attn_norm-{il}"), &s.xn);
        match &ly.mixer {
            Mixer::Linear(m) => {
                b.matmul_many(
                    &[&m.wqkv, &m.wz, &m.wbeta, &m.walpha],
                    &s.xn,
                    &mut [&mut s.qkv, &mut s.z, &mut s.beta, &mut s.alpha],
                );
                let mut kvs: Vec<&mut B::Kv> = seqs.iter_mut().map(|q| &mut *q.kv).collect();
                b.ssm_conv(&s.qkv, &m.conv, step, &mut kvs, &m.shape, &mut s.conv);
                dump.put(b, &format!("conv_output_silu-{il}"), &s.conv);
                b.gated_delta_net(
                    &s.conv, &s.alpha, &s.beta, &m.dt_bias, &m.a, step, &mut kvs, &m.shape, &mut s.o,
                );
                dump.put(b, &format!("attn_output-{il}"), &s.o);
                // transformers Qwen3_5RMSNormGated: rms_norm(o) · w · silu(z), per value head.
                b.head_rms_norm(&mut s.o, Some(&m.norm), m.shape.head_v, eps);
                b.swiglu(&s.z, &s.o, &mut s.gated);
                b.matmul(&m.out, &s.gated, &mut s.att);
            }
            Mixer::Full(f) => {
                b.matmul_many(&[&f.wq, &f.wk, &f.wv], &s.xn, &mut [&mut s.qg, &mut s.k, &mut s.v]);
                b.unzip_heads(&s.qg, hd, &mut s.q, &mut s.gate);
                let shape = AttnShape {
                    n_head: self.n_head,
                    n_kv_head: self.n_kv_head,
                    head_dim: hd,
                    scale: 1.0 / (hd as f32).sqrt(),
                };
                // Normed per head, roped (and the keys stored) with the attention; the dumps see
                // the roped q, k.
                let norm = QkNorm {
                    q: &f.q_norm,
                    k: &f.k_norm,
                    eps,
                };
                blocks::rope_attend(
                    b,
                    step,
                    seqs,
                    il,
                    &self.kv[il],
                    shape,
                    Some(norm),
                    &self.rope,
                    &mut s.q,
                    &mut s.k,
                    &s.v,
                    &mut s.attn,
                );
                dump.put(b, &format!("Qcur-{il}"), &s.q);
                dump.put(b, &format!("Kcur-{il}"), &s.k);
                b.sigmoid_mul(&mut s.attn, &s.gate);
                dump.put(b, &format!("attn_gated-{il}"), &s.attn);
                b.matmul(&f.wo, &s.attn, &mut s.att);
            }
        }
        // x += mixer output; the FFN reads the post-attention norm of the sum.
        b.add_rms_norm(&mut s.x, &s.att, &ly.post_norm, eps, &mut s.xn);
        dump.put(b, &format!("attn_post_norm-{il}"), &s.xn);
        match &ly.ffn {
            LayerFfn::Dense(f) => blocks::ffn(b, f, Glu::Swiglu, &s.xn, &mut s.ffn, &mut s.f),
            LayerFfn::Moe(m) => {
                let t = s.moe.as_mut().expect("MoE buffers for a MoE model");
                blocks::moe_ffn(
                    b,
                    &m.moe.router,
                    &m.moe.experts,
                    &m.moe.routing,
                    Glu::Swiglu,
                    &s.xn,
                    &s.xn,
                    &mut t.moe,
                    None,
                    &mut s.f,
                )?;
                if let Some((shared, gate)) = &m.shared {
                    blocks::ffn(b, shared, Glu::Swiglu, &s.xn, &mut t.shared, &mut t.shared_out);
                    b.matmul(gate, &s.xn, &mut t.shared_gate);
                    b.sigmoid_mul(&mut t.shared_out, &t.shared_gate);
                    b.add(&mut s.f, &t.shared_out);
                }
            }
        }
        dump.put(b, &format!("ffn_out-{il}"), &s.f);
        b.add(&mut s.x, &s.f);
        dump.put(b, &format!("l_out-{il}"), &s.x);
        Ok(())
    }

    fn forward_inner(&self, s: &mut Bufs<B>, seqs: &mut [SeqStep<'_, B>]) -> Result<()> {
        let b = &*self.backend;
        let eps = self.eps;
        let step = batch::begin_step(b, seqs)?;
        b.embed(&self.tok_embd, &step, &mut s.x)?;
        let mut dump = crate::debug::Dump::from_env();
        for (il, ly) in self.layers.iter().enumerate() {
            self.layer(s, ly, il, &step, seqs, &mut dump)?;
        }
        if self.mtp.is_some() {
            // The MTP block's input: llama.cpp qwen35.cpp `h_nextn` (after the output norm).
            b.rms_norm(&s.x, &self.output_norm, eps, &mut s.hid);
        }
        let output = self.output.as_ref().unwrap_or(&self.tok_embd);
        blocks::logits(
            b,
            seqs,
            &s.x,
            &self.output_norm,
            eps,
            output,
            None,
            &mut s.head,
            &mut dump,
        );
        Ok(())
    }
}

impl<B: Backend> Qwen35<B> {
    /// One MTP step (`Model::forward_mtp_argmax`); llama.cpp qwen35.cpp `graph_mtp`.
    fn mtp_inner(&self, s: &mut Bufs<B>, seqs: &mut [SeqStep<'_, B>], hidden: HiddenRows<'_>) -> Result<()> {
        let b = &*self.backend;
        let eps = self.eps;
        let m = self
            .mtp
            .as_ref()
            .ok_or_else(|| EngineError::Unsupported(format!("a {} model without MTP layers", self.info.arch)))?;
        let (src, rows) = match hidden {
            HiddenRows::Target(r) => (&s.hid, r),
            HiddenRows::Mtp(r) => (&s.mhid, r),
        };
        let n: usize = seqs.iter().map(|q| q.tokens.len()).sum();
        let have = b.shape(src).0;
        if rows.len() != n || rows.iter().any(|&r| r >= have) {
            return Err(EngineError::Input(format!(
                "an MTP step of {n} tokens given hidden rows {rows:?} of a step of {have} rows"
            )));
        }
        let step = batch::begin_step(b, seqs)?;
        b.select_rows(src, rows, &mut s.h);
        b.embed(m.embed.as_ref().unwrap_or(&self.tok_embd), &step, &mut s.x)?;
        let runs = b.runs(&s.x);
        b.rms_norm(&s.x, &m.enorm, eps, &mut s.xn);
        b.rms_norm(&s.h, &m.hnorm, eps, &mut s.hn);
        // [enorm(e), hnorm(h)] per row: the row-major [n, 2·n_embd] buffer seen as [2n, n_embd].
        let e = self.info.n_embd;
        b.reshape(&mut s.cat, 2 * n, e);
        b.scatter_rows(&s.xn, &(0..n).map(|r| 2 * r).collect::<Vec<_>>(), &mut s.cat);
        b.scatter_rows(&s.hn, &(0..n).map(|r| 2 * r + 1).collect::<Vec<_>>(), &mut s.cat);
        b.reshape(&mut s.cat, n, 2 * e);
        b.set_runs(&mut s.cat, &runs);
        b.matmul(&m.eh_proj, &s.cat, &mut s.x);
        let mut dump = crate::debug::Dump::from_env();
        dump.put(b, "mtp_eh_proj", &s.x);
        self.layer(s, &m.layer, self.info.n_layer, &step, seqs, &mut dump)?;
        b.rms_norm(
            &s.x,
            m.head_norm.as_ref().unwrap_or(&self.output_norm),
            eps,
            &mut s.mhid,
        );
        dump.put(b, "mtp_h_nextn", &s.mhid);
        let out_rows = batch::output_rows(seqs);
        let t = &mut s.head;
        if out_rows.is_empty() {
            let n_vocab = b.shape(&t.logits).1;
            b.reshape(&mut t.logits, 0, n_vocab);
            return Ok(());
        }
        b.select_rows(&s.mhid, &out_rows, &mut t.seln);
        b.set_runs(&mut t.seln, &batch::logit_runs(seqs));
        let head = m.head.as_ref().or(self.output.as_ref()).unwrap_or(&self.tok_embd);
        b.matmul(head, &t.seln, &mut t.logits);
        dump.put(b, "mtp_result_output", &t.logits);
        Ok(())
    }
}

impl<B: Backend> Model<B> for Qwen35<B> {
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
        let b = &*self.backend;
        let e = self.info.n_embd;
        let (qd, kvd) = (self.n_head * self.head_dim, self.n_kv_head * self.head_dim);
        let lin = self.layers.iter().find_map(|l| match &l.mixer {
            Mixer::Linear(m) => Some(m.shape),
            Mixer::Full(_) => None,
        });
        let (cd, vd, nv) = lin.map_or((0, 0, 0), |s| (s.conv_dim(), s.n_v_heads * s.head_v, s.n_v_heads));
        // Every layer's FFN, the MTP block's included.
        let all = || self.layers.iter().chain(self.mtp.as_ref().map(|m| &m.layer));
        let n_ff = all()
            .map(|l| match &l.ffn {
                LayerFfn::Dense(f) => b.weight_shape(&f.gate)[1] as usize,
                LayerFfn::Moe(_) => 0,
            })
            .max()
            .unwrap_or(0);
        let moe = all().find_map(|l| match &l.ffn {
            LayerFfn::Moe(m) => Some(m),
            LayerFfn::Dense(_) => None,
        });
        let moe = moe.map(|m| {
            let sh = m
                .shared
                .as_ref()
                .map_or(0, |(f, _)| b.weight_shape(&f.gate)[1] as usize);
            MoeBuffers {
                moe: MoeBufs::new(b, rows, e, m.moe.n_ff, &m.moe.routing),
                shared: FfnBufs::new(b, rows, sh.max(1)),
                shared_out: b.alloc(rows, e),
                shared_gate: b.alloc(rows, 1),
            }
        });
        let me = if self.mtp.is_some() { e } else { 1 };
        let bufs: Bufs<B> = Bufs {
            x: b.alloc(rows, e),
            xn: b.alloc(rows, e),
            att: b.alloc(rows, e),
            f: b.alloc(rows, e),
            qkv: b.alloc(rows, cd.max(1)),
            conv: b.alloc(rows, cd.max(1)),
            z: b.alloc(rows, vd.max(1)),
            alpha: b.alloc(rows, nv.max(1)),
            beta: b.alloc(rows, nv.max(1)),
            o: b.alloc(rows, vd.max(1)),
            gated: b.alloc(rows, vd.max(1)),
            qg: b.alloc(rows, 2 * qd),
            q: b.alloc(rows, qd),
            gate: b.alloc(rows, qd),
            k: b.alloc(rows, kvd),
            v: b.alloc(rows, kvd),
            attn: b.alloc(rows, qd),
            ffn: FfnBufs::new(b, rows, n_ff.max(1)),
            moe,
            head: HeadBufs::new(b, rows, e, self.info.n_vocab),
            hid: b.alloc(rows, me),
            mhid: b.alloc(rows, me),
            h: b.alloc(rows, me),
            hn: b.alloc(rows, me),
            cat: b.alloc(rows, 2 * me),
        };
        Scratch::new(rows, bufs)
    }

    fn forward(&self, s: &mut Scratch, seqs: &mut [SeqStep<'_, B>]) -> Result<Vec<Vec<f32>>> {
        let run = |t: &mut Bufs<B>, q: &mut [SeqStep<'_, B>]| {
            self.check_states(q)?;
            self.forward_inner(t, q)
        };
        batch::step(&*self.backend, s, seqs, run, |b, h| h.read(b))
    }

    fn forward_argmax(&self, s: &mut Scratch, seqs: &mut [SeqStep<'_, B>]) -> Result<Vec<u32>> {
        let run = |t: &mut Bufs<B>, q: &mut [SeqStep<'_, B>]| {
            self.check_states(q)?;
            self.forward_inner(t, q)
        };
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

    fn mtp_layers(&self) -> usize {
        usize::from(self.mtp.is_some())
    }

    fn forward_mtp_argmax(
        &self,
        s: &mut Scratch,
        seqs: &mut [SeqStep<'_, B>],
        hidden: HiddenRows<'_>,
    ) -> Result<Vec<u32>> {
        let run = |t: &mut Bufs<B>, q: &mut [SeqStep<'_, B>]| self.mtp_inner(t, q, hidden);
        batch::step(&*self.backend, s, seqs, run, |b, h| h.argmax(b))
    }
}
