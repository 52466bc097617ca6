//! The Gemma graphs: `gemma3` and `gemma4` (llama.cpp `src/models/gemma3.cpp`, `gemma4.cpp`;
//! transformers `modeling_gemma3.py`, `modeling_gemma4.py`). Both scale the token embeddings by
//! √n_embd, norm before and after attention and FFN, use GeGLU (tanh GELU), per-head Q/K RMS norm,
//! and interleave sliding-window layers (their own rope base) with global ones. Gemma 4 adds
//! per-layer head sizes and KV heads, a weightless V norm and K-as-V layers, attention scale 1,
//! proportional rope on global layers, KV-shared layers, per-layer embeddings (PLE), a MoE block
//! beside the dense FFN, a per-layer output scale, and final logit soft-capping.

use super::batch::{self, KvLayer, Model, ModelInfo, Scratch, SeqStep};
use super::blocks::{self, AttnShape, Ffn, FfnBufs, Glu, HeadBufs, Moe, MoeBufs, Routing};
use super::{Keys, Loader};
use crate::backend::{Backend, Rope};
use crate::{EngineError, Result};
use gguf::arch::key;
use gguf::GgufModel;
use gguf::Tensor as T;
use std::path::Path;
use std::sync::Arc;

/// Gemma 4's MoE block (beside the dense FFN, which acts as the shared expert).
struct MoeBlock<B: Backend> {
    moe: Moe<B>,
    /// Multiplies the router's normalised input.
    router_scale: B::Weight,
    /// Multiplies each expert's output.
    expert_scale: Vec<f32>,
    pre_norm_2: B::Weight,
    post_norm_1: B::Weight,
    post_norm_2: B::Weight,
}

/// Per-layer embedding tail (Gemma 4 E-series).
struct PleLayer<B: Backend> {
    inp_gate: B::Weight,
    proj: B::Weight,
    post_norm: B::Weight,
}

struct Layer<B: Backend> {
    n_kv_head: usize,
    head_dim: usize,
    rope: Rope,
    attn_norm: B::Weight,
    wq: B::Weight,
    /// `None` on KV-shared layers.
    wk: Option<B::Weight>,
    /// `None` when V is the K projection (Gemma 4 `attention_k_eq_v`) or the layer shares KV.
    wv: Option<B::Weight>,
    q_norm: B::Weight,
    k_norm: Option<B::Weight>,
    wo: B::Weight,
    post_attn_norm: B::Weight,
    ffn_norm: B::Weight,
    ffn: Ffn<B>,
    post_ffw_norm: B::Weight,
    moe: Option<MoeBlock<B>>,
    ple: Option<PleLayer<B>>,
    out_scale: Option<f32>,
}

/// The model-wide part of per-layer embeddings.
struct Ple<B: Backend> {
    width: usize,
    tok: B::Weight,
    model_proj: B::Weight,
    proj_norm: B::Weight,
}

pub struct Gemma<B: Backend> {
    info: ModelInfo,
    v4: bool,
    n_head: usize,
    eps: f32,
    /// Q is multiplied by this before attention (Gemma 3); Gemma 4 attends with scale 1.
    q_scale: f32,
    softcap: Option<f32>,
    kv: Vec<KvLayer>,
    backend: Arc<B>,
    tok_embd: B::Weight,
    output_norm: B::Weight,
    output: Option<B::Weight>,
    ple: Option<Ple<B>>,
    layers: Vec<Layer<B>>,
}

struct Bufs<B: Backend> {
    x: B::Buf,
    xn: B::Buf,
    q: B::Buf,
    k: B::Buf,
    v: B::Buf,
    attn: B::Buf,
    o: B::Buf,
    f: B::Buf,
    ffn: FfnBufs<B>,
    moe: Option<(MoeBufs<B>, B::Buf, B::Buf)>,
    ple: Option<PleBufs<B>>,
    head: HeadBufs<B>,
}

impl<B: Backend> batch::StepBufs<B> for Bufs<B> {
    fn head(&self) -> &HeadBufs<B> {
        &self.head
    }
}

/// PLE buffers: the step's per-layer inputs (rows × width·n_layer), scratch of that size, one
/// layer's slice, and the gate.
struct PleBufs<B: Backend> {
    all: B::Buf,
    tmp: B::Buf,
    slice: B::Buf,
    gate: B::Buf,
}

/// A per-layer value that GGUF stores either once or as an array of one per layer.
fn per_layer(k: &Keys<'_>, key: &str, n_layer: usize, default: Option<usize>) -> Result<Vec<usize>> {
    let full = k.key(key);
    if let Some(a) = k.meta.get_array(&full) {
        let v: Option<Vec<usize>> = (0..a.len())
            .map(|i| a.get(i).and_then(|v| v.as_u64()).map(|v| v as usize))
            .collect();
        return match v {
            Some(v) if v.len() == n_layer => Ok(v),
            _ => Err(EngineError::Model(format!(
                "{}: {full} must hold {n_layer} integers, one per layer",
                k.path.display()
            ))),
        };
    }
    match (k.meta.get_u64(&full), default) {
        (Some(v), _) => Ok(vec![v as usize; n_layer]),
        (None, Some(d)) => Ok(vec![d; n_layer]),
        (None, None) => Err(EngineError::Model(format!(
            "{}: metadata key {full} is missing",
            k.path.display()
        ))),
    }
}

impl<B: Backend> Gemma<B> {
    pub fn load(backend: Arc<B>, gguf: &Arc<GgufModel>, path: &Path) -> Result<Gemma<B>> {
        let meta = gguf.metadata();
        let arch = meta.architecture().unwrap_or_default().to_string();
        let v4 = arch == "gemma4";
        let k = Keys {
            meta,
            arch: &arch,
            path,
        };
        let n_embd = k.u(key::EMBEDDING_LENGTH)?;
        let n_layer = k.u(key::BLOCK_COUNT)?;
        let n_head = k.u(key::ATTN_HEAD_COUNT)?;
        let n_ctx_train = k.u_or(key::CONTEXT_LENGTH, 8192);
        let eps = k.f_or(key::ATTN_LAYERNORM_RMS_EPS, 1e-6);
        let n_vocab = meta
            .get_array("tokenizer.ggml.tokens")
            .map(|a| a.len())
            .ok_or_else(|| EngineError::Model(format!("{}: no tokenizer.ggml.tokens", path.display())))?;
        let n_kv_head = per_layer(&k, key::ATTN_HEAD_COUNT_KV, n_layer, Some(n_head))?;
        let n_ff = per_layer(&k, key::FEED_FORWARD_LENGTH, n_layer, None)?;
        let hd_full = k.u_or(key::ATTN_KEY_LENGTH, n_embd / n_head.max(1));
        let hd_swa = k.u_or(key::ATTN_KEY_LENGTH_SWA, hd_full);
        let rot_full = k.u_or(key::ROPE_DIMENSION_COUNT, hd_full);
        let rot_swa = k.u_or(key::ROPE_DIMENSION_COUNT_SWA, if v4 { hd_swa } else { rot_full });
        let base_full = k.f_or(key::ROPE_FREQ_BASE, 10000.0);
        let base_swa = k.f_or(key::ROPE_FREQ_BASE_SWA, 10000.0);
        let n_swa = k.u_or(key::ATTN_SLIDING_WINDOW, 0);
        // The layers with a sliding window: the GGUF's pattern, else Gemma 3's five of every six.
        let swa: Vec<bool> = match meta.get_array(&k.key(key::ATTN_SLIDING_WINDOW_PATTERN)) {
            Some(a) => (0..n_layer)
                .map(|i| a.get(i).and_then(|v| v.as_bool().or(v.as_u64().map(|u| u != 0))))
                .collect::<Option<Vec<bool>>>()
                .ok_or_else(|| {
                    EngineError::Model(format!(
                        "{}: {} must hold {n_layer} booleans",
                        path.display(),
                        k.key(key::ATTN_SLIDING_WINDOW_PATTERN)
                    ))
                })?,
            None if v4 => {
                return Err(EngineError::Model(format!(
                    "{}: metadata key {} is missing",
                    path.display(),
                    k.key(key::ATTN_SLIDING_WINDOW_PATTERN)
                )))
            }
            // llama.cpp llama-hparams.cpp set_swa_pattern(6): layer il slides when il % 6 < 5.
            None => (0..n_layer).map(|i| n_swa > 0 && i % 6 < 5).collect(),
        };
        let scaling = meta.get_str(&k.key(key::ROPE_SCALING_TYPE)).unwrap_or("none");
        let factor = k.f_or(key::ROPE_SCALING_FACTOR, 0.0);
        let freq_scale_full = if scaling == "linear" && factor > 0.0 {
            1.0 / factor
        } else {
            1.0
        };
        let l = Loader {
            backend: &*backend,
            gguf,
            path,
        };
        let freq_factors = l.host(&T::RopeFreqs.weight())?;
        let shared = k.u_or(key::ATTN_SHARED_KV_LAYERS, 0);
        if shared >= n_layer && shared > 0 {
            return Err(EngineError::Model(format!(
                "{}: {shared} KV-shared layers leave no layer with its own cache",
                path.display()
            )));
        }
        let n_kv_from = n_layer - shared;
        let softcap = k.f_or(key::FINAL_LOGIT_SOFTCAPPING, if v4 { 30.0 } else { 0.0 });
        let e = n_embd;
        let tok_embd = l.get(&T::TokenEmbd.weight(), &[e, n_vocab])?;
        let output = l.opt_mat(&T::Output.weight(), &[e, n_vocab])?;
        let ple_width = k.u_or(key::EMBEDDING_LENGTH_PER_LAYER_INPUT, 0);
        let ple = if v4 && ple_width > 0 {
            let pl = ple_width * n_layer;
            Some(Ple {
                width: ple_width,
                tok: l.get(&T::PerLayerTokenEmbd.weight(), &[pl, n_vocab])?,
                model_proj: l.mat(&T::PerLayerModelProj.weight(), &[e, pl])?,
                proj_norm: l.get(&T::PerLayerProjNorm.weight(), &[ple_width])?,
            })
        } else {
            None
        };
        let moe_keys = (k.u_or(key::EXPERT_COUNT, 0), k.u_or(key::EXPERT_USED_COUNT, 0));
        let mut layers = Vec::with_capacity(n_layer);
        let mut kv = Vec::with_capacity(n_layer);
        for i in 0..n_layer {
            let (hd, n_rot, base) = if swa[i] {
                (hd_swa, rot_swa, base_swa)
            } else {
                (hd_full, rot_full, base_full)
            };
            if n_rot > hd || !n_rot.is_multiple_of(2) || n_kv_head[i] == 0 || !n_head.is_multiple_of(n_kv_head[i]) {
                return Err(EngineError::Model(format!(
                    "{}: layer {i}: heads of {hd} with rope over {n_rot}, {n_head} heads over {} KV heads",
                    path.display(),
                    n_kv_head[i]
                )));
            }
            let rope = Rope {
                n_dims: n_rot,
                neox: true,
                freq_base: base,
                freq_scale: if swa[i] { 1.0 } else { freq_scale_full },
                ext_factor: 0.0,
                attn_factor: 1.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                n_ctx_orig: n_ctx_train,
                // Gemma 4's proportional rope on global layers (rope_freqs.weight).
                freq_factors: if swa[i] || !v4 { None } else { freq_factors.clone() },
            };
            let (qd, kvd) = (n_head * hd, n_kv_head[i] * hd);
            let own = i < n_kv_from;
            let window = swa[i].then_some(n_swa).filter(|&w| w > 0);
            // transformers modeling_gemma4.py: a shared layer reads the last layer of its own type
            // that keeps a cache (llama.cpp's fixed n-2 / n-1 rule gives the same for released models).
            let shares = if own {
                None
            } else {
                Some((0..n_kv_from).rev().find(|&j| swa[j] == swa[i]).ok_or_else(|| {
                    EngineError::Model(format!(
                        "{}: KV-shared layer {i} has no earlier layer of its kind to read",
                        path.display()
                    ))
                })?)
            };
            kv.push(KvLayer {
                k_dim: kvd,
                v_dim: kvd,
                window,
                shares,
                recurrent: None,
            });
            let moe = match l.opt_mat(&T::FfnGateInp.blk(i), &[e, moe_keys.0.max(1)])? {
                Some(router) => {
                    let (n_expert, used) = moe_keys;
                    let ff_exp = k.u(key::EXPERT_FEED_FORWARD_LENGTH)?;
                    let (gate, up) = if gguf.tensor(&T::FfnGateUpExps.blk(i)).is_some() {
                        l.mats_split(&T::FfnGateUpExps.blk(i), e, ff_exp, n_expert)?
                    } else {
                        (
                            l.mats(&T::FfnGateExps.blk(i), e, ff_exp, n_expert)?,
                            l.mats(&T::FfnUpExps.blk(i), e, ff_exp, n_expert)?,
                        )
                    };
                    let down = l.mats(&T::FfnDownExps.blk(i), ff_exp, e, n_expert)?;
                    let experts = Ffn::stack(gate, up, down);
                    let expert_scale = l
                        .host(&T::FfnDownExps.with(i, "scale"))?
                        .unwrap_or_else(|| vec![1.0; n_expert]);
                    if expert_scale.len() != n_expert || used == 0 || used > n_expert {
                        return Err(EngineError::Model(format!(
                            "{}: layer {i}: {used} of {n_expert} experts with {} expert scales",
                            path.display(),
                            expert_scale.len()
                        )));
                    }
                    Some(MoeBlock {
                        moe: Moe {
                            router,
                            experts,
                            routing: Routing {
                                n_expert,
                                k: used,
                                softmax_first: true,
                                normalize: true,
                            },
                            n_ff: ff_exp,
                        },
                        router_scale: l.get(&T::FfnGateInp.with(i, "scale"), &[e])?,
                        expert_scale,
                        pre_norm_2: l.get(&T::FfnPreNorm2.blk(i), &[e])?,
                        post_norm_1: l.get(&T::FfnPostNorm1.blk(i), &[e])?,
                        post_norm_2: l.get(&T::FfnPostNorm2.blk(i), &[e])?,
                    })
                }
                None => None,
            };
            let ple_layer = match &ple {
                Some(p) => Some(PleLayer {
                    inp_gate: l.mat(&T::PerLayerInpGate.blk(i), &[e, p.width])?,
                    proj: l.mat(&T::PerLayerProj.blk(i), &[p.width, e])?,
                    post_norm: l.get(&T::PerLayerPostNorm.blk(i), &[e])?,
                }),
                None => None,
            };
            let out_scale = match l.host(&T::LayerOutputScale.blk(i))? {
                Some(v) if v.len() == 1 => Some(v[0]),
                Some(v) => {
                    return Err(EngineError::Model(format!(
                        "{}: {} holds {} values, expected 1",
                        path.display(),
                        T::LayerOutputScale.blk(i),
                        v.len()
                    )))
                }
                None => None,
            };
            layers.push(Layer {
                n_kv_head: n_kv_head[i],
                head_dim: hd,
                rope,
                attn_norm: l.get(&T::AttnNorm.blk(i), &[e])?,
                wq: l.mat(&T::AttnQ.blk(i), &[e, qd])?,
                wk: if own {
                    Some(l.mat(&T::AttnK.blk(i), &[e, kvd])?)
                } else {
                    None
                },
                wv: if own {
                    l.opt_mat(&T::AttnV.blk(i), &[e, kvd])?
                } else {
                    None
                },
                q_norm: l.get(&T::AttnQNorm.blk(i), &[hd])?,
                k_norm: if own {
                    Some(l.get(&T::AttnKNorm.blk(i), &[hd])?)
                } else {
                    None
                },
                wo: l.mat(&T::AttnOutput.blk(i), &[qd, e])?,
                post_attn_norm: l.get(&T::AttnPostNorm.blk(i), &[e])?,
                ffn_norm: l.get(&T::FfnNorm.blk(i), &[e])?,
                ffn: Ffn {
                    gate: l.mat(&T::FfnGate.blk(i), &[e, n_ff[i]])?,
                    up: l.mat(&T::FfnUp.blk(i), &[e, n_ff[i]])?,
                    down: l.mat(&T::FfnDown.blk(i), &[n_ff[i], e])?,
                },
                post_ffw_norm: l.get(&T::FfnPostNorm.blk(i), &[e])?,
                moe,
                ple: ple_layer,
                out_scale,
            });
            if !v4 && layers[i].wv.is_none() {
                return Err(EngineError::Model(format!(
                    "{}: tensor {} is missing",
                    path.display(),
                    T::AttnV.blk(i)
                )));
            }
        }
        let output_norm = l.get(&T::OutputNorm.weight(), &[e])?;
        // llama.cpp gemma3.cpp: Q is scaled by 1/√head_dim before attention (1/√(n_embd/n_head)
        // for the 62-layer 27B); Gemma 4 relies on its Q/K norms and attends with scale 1.
        let q_scale = if v4 {
            1.0
        } else if n_layer == 62 {
            1.0 / ((n_embd / n_head) as f32).sqrt()
        } else {
            1.0 / (hd_full as f32).sqrt()
        };
        Ok(Gemma {
            info: ModelInfo {
                arch,
                n_vocab,
                n_embd,
                n_layer,
                n_ctx_train,
            },
            v4,
            n_head,
            eps,
            q_scale,
            softcap: (softcap != 0.0).then_some(softcap),
            kv,
            backend,
            tok_embd,
            output_norm,
            output,
            ple,
            layers,
        })
    }

    fn forward_inner(&self, s: &mut Bufs<B>, seqs: &mut [SeqStep<'_, B>]) -> Result<()> {
        let b = &*self.backend;
        let eps = self.eps;
        let e = self.info.n_embd;
        let step = batch::begin_step(b, seqs)?;
        let all: Vec<usize> = (0..seqs.iter().map(|q| q.tokens.len()).sum()).collect();
        let all = &all[..];
        b.embed(&self.tok_embd, &step, &mut s.x)?;
        b.scale(&mut s.x, (e as f32).sqrt());
        let mut dump = crate::debug::Dump::from_env();
        dump.put(b, "inp_scaled", &s.x);
        if let (Some(p), Some(PleBufs { all: ple, tmp, .. })) = (&self.ple, s.ple.as_mut()) {
            // llama.cpp gemma4.cpp: (proj(x)/√n_embd, RMS-normed per layer) + tok·√width, over √2.
            b.embed(&p.tok, &step, tmp)?;
            b.scale(tmp, (p.width as f32).sqrt());
            b.matmul(&p.model_proj, &s.x, ple);
            b.scale(ple, 1.0 / (e as f32).sqrt());
            b.head_rms_norm(ple, Some(&p.proj_norm), p.width, eps);
            b.add(ple, tmp);
            b.scale(ple, 1.0 / 2f32.sqrt());
        }
        for (il, ly) in self.layers.iter().enumerate() {
            let hd = ly.head_dim;
            b.rms_norm(&s.x, &ly.attn_norm, eps, &mut s.xn);
            dump.put(b, &format!("attn_norm-{il}"), &s.xn);
            b.matmul(&ly.wq, &s.xn, &mut s.q);
            b.head_rms_norm(&mut s.q, Some(&ly.q_norm), hd, eps);
            b.rope(&mut s.q, hd, &step, &ly.rope);
            if self.q_scale != 1.0 {
                b.scale(&mut s.q, self.q_scale);
            }
            if let Some(wk) = &ly.wk {
                match &ly.wv {
                    Some(wv) => b.matmul_many(&[wk, wv], &s.xn, &mut [&mut s.k, &mut s.v]),
                    None => {
                        b.matmul(wk, &s.xn, &mut s.k);
                        b.select_rows(&s.k, all, &mut s.v);
                    }
                }
                b.head_rms_norm(&mut s.k, ly.k_norm.as_ref(), hd, eps);
                b.rope(&mut s.k, hd, &step, &ly.rope);
                if self.v4 {
                    b.head_rms_norm(&mut s.v, None, hd, eps);
                }
                dump.put(b, &format!("Kcur-{il}"), &s.k);
                dump.put(b, &format!("Vcur-{il}"), &s.v);
            }
            dump.put(b, &format!("Qcur-{il}"), &s.q);
            let shape = AttnShape {
                n_head: self.n_head,
                n_kv_head: ly.n_kv_head,
                head_dim: hd,
                scale: 1.0,
            };
            blocks::attend(b, &step, seqs, il, &self.kv[il], shape, &s.q, &s.k, &s.v, &mut s.attn);
            dump.put(b, &format!("kqv_out-{il}"), &s.attn);
            b.matmul(&ly.wo, &s.attn, &mut s.o);
            b.rms_norm(&s.o, &ly.post_attn_norm, eps, &mut s.xn);
            dump.put(b, &format!("attn_post_norm-{il}"), &s.xn);
            b.add(&mut s.x, &s.xn);
            dump.put(b, &format!("sa_out-{il}"), &s.x);
            // FFN on the residual stream x (= x1).
            b.rms_norm(&s.x, &ly.ffn_norm, eps, &mut s.xn);
            dump.put(b, &format!("ffn_norm-{il}"), &s.xn);
            blocks::ffn(b, &ly.ffn, Glu::Geglu, &s.xn, &mut s.ffn, &mut s.f);
            dump.put(b, &format!("ffn_out-{il}"), &s.f);
            if let Some(m) = &ly.moe {
                let (mb, route_in, moe_out) = s.moe.as_mut().expect("MoE buffers for a MoE model");
                b.rms_norm(&s.f, &m.post_norm_1, eps, &mut s.o);
                // The router reads rms(x1)/√n_embd ⊙ scale; the experts read norm(x1, pre_ffw_norm_2).
                b.select_rows(&s.x, all, route_in);
                b.set_runs(route_in, &b.runs(&s.x));
                b.head_rms_norm(route_in, None, e, eps);
                b.scale(route_in, 1.0 / (e as f32).sqrt());
                b.mul_row(route_in, &m.router_scale);
                b.rms_norm(&s.x, &m.pre_norm_2, eps, &mut s.xn);
                blocks::moe_ffn(
                    b,
                    &m.moe.router,
                    &m.moe.experts,
                    &m.moe.routing,
                    Glu::Geglu,
                    route_in,
                    &s.xn,
                    mb,
                    Some(&m.expert_scale),
                    moe_out,
                )?;
                b.rms_norm(moe_out, &m.post_norm_2, eps, &mut s.f);
                b.add(&mut s.f, &s.o);
            }
            b.rms_norm(&s.f, &ly.post_ffw_norm, eps, &mut s.o);
            dump.put(b, &format!("ffn_post_norm-{il}"), &s.o);
            b.add(&mut s.x, &s.o);
            if let (
                Some(pl),
                Some(p),
                Some(PleBufs {
                    all: ple, slice, gate, ..
                }),
            ) = (&ly.ple, &self.ple, s.ple.as_mut())
            {
                b.matmul(&pl.inp_gate, &s.x, gate);
                b.gelu_tanh(gate);
                b.split_cols(ple, &mut [(il * p.width, &mut *slice)], p.width);
                b.mul(gate, slice);
                b.matmul(&pl.proj, gate, &mut s.o);
                b.rms_norm(&s.o, &pl.post_norm, eps, &mut s.xn);
                b.add(&mut s.x, &s.xn);
            }
            if let Some(f) = ly.out_scale {
                b.scale(&mut s.x, f);
            }
            dump.put(b, &format!("l_out-{il}"), &s.x);
        }
        let output = self.output.as_ref().unwrap_or(&self.tok_embd);
        blocks::logits(
            b,
            seqs,
            &s.x,
            &self.output_norm,
            eps,
            output,
            self.softcap,
            &mut s.head,
            &mut dump,
        );
        Ok(())
    }
}

impl<B: Backend> Model<B> for Gemma<B> {
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
        let qd = self.layers.iter().map(|l| self.n_head * l.head_dim).max().unwrap_or(0);
        let kvd = self.layers.iter().map(|l| l.n_kv_head * l.head_dim).max().unwrap_or(0);
        let n_ff = self
            .layers
            .iter()
            .map(|l| b.weight_shape(&l.ffn.gate)[1] as usize)
            .max()
            .unwrap_or(0);
        let moe = self.layers.iter().find_map(|l| l.moe.as_ref()).map(|m| {
            (
                MoeBufs::new(b, rows, e, m.moe.n_ff, &m.moe.routing),
                b.alloc(rows, e),
                b.alloc(rows, e),
            )
        });
        let ple = self.ple.as_ref().map(|p| {
            let pl = p.width * self.info.n_layer;
            PleBufs {
                all: b.alloc(rows, pl),
                tmp: b.alloc(rows, pl),
                slice: b.alloc(rows, p.width),
                gate: b.alloc(rows, p.width),
            }
        });
        let bufs: Bufs<B> = Bufs {
            x: b.alloc(rows, e),
            xn: b.alloc(rows, e),
            q: b.alloc(rows, qd),
            k: b.alloc(rows, kvd),
            v: b.alloc(rows, kvd),
            attn: b.alloc(rows, qd),
            o: b.alloc(rows, e.max(qd)),
            f: b.alloc(rows, e),
            ffn: FfnBufs::new(b, rows, n_ff),
            moe,
            ple,
            head: HeadBufs::new(b, rows, e, self.info.n_vocab),
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
}
