//! Encoder graphs for embeddings: `bert` (absolute position and token-type embeddings, post-
//! LayerNorm, GELU FFN with biases) and `nomic-bert` (fused QKV, NeoX rotary, SwiGLU, no biases),
//! bidirectional attention within each input (llama.cpp `src/models/bert.cpp`; transformers
//! `modeling_bert.py`, nomic's `modeling_hf_nomic_bert.py`). Many inputs of different lengths run
//! in one batched forward, each attending only to its own tokens.

use super::Loader;
use crate::backend::{Backend, Rope, StepPlan, StepSeq};
use crate::{EngineError, Result};
use gguf::arch::key;
use gguf::GgufModel;
use gguf::Tensor as T;
use std::path::Path;
use std::sync::Arc;

/// How token states become one vector (`{arch}.pooling_type`, llama.cpp's enum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    None,
    Mean,
    Cls,
    Last,
}

struct Layer<B: Backend> {
    /// Separate Q/K/V (bert) or one fused matrix (nomic-bert).
    q: Option<B::Weight>,
    k: Option<B::Weight>,
    v: Option<B::Weight>,
    qkv: Option<B::Weight>,
    bq: Option<B::Weight>,
    bk: Option<B::Weight>,
    bv: Option<B::Weight>,
    o: B::Weight,
    bo: Option<B::Weight>,
    attn_norm: (B::Weight, B::Weight),
    up: B::Weight,
    bup: Option<B::Weight>,
    gate: Option<B::Weight>,
    down: B::Weight,
    bdown: Option<B::Weight>,
    out_norm: (B::Weight, B::Weight),
}

pub struct Bert<B: Backend> {
    pub arch: String,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_ctx_train: usize,
    pub n_vocab: usize,
    pub pooling: Pooling,
    eps: f32,
    rope: Option<Rope>,
    backend: Arc<B>,
    tok_embd: B::Weight,
    type_embd: Option<B::Weight>,
    pos_embd: Option<B::Weight>,
    embd_norm: (B::Weight, B::Weight),
    layers: Vec<Layer<B>>,
}

impl<B: Backend> Bert<B> {
    pub fn load(backend: Arc<B>, gguf: &Arc<GgufModel>, path: &Path) -> Result<Bert<B>> {
        let meta = gguf.metadata();
        let arch = meta.architecture().unwrap_or_default().to_string();
        if arch != "bert" && arch != "nomic-bert" {
            return Err(EngineError::Unsupported(format!(
                "{}: {arch:?} is not an encoder architecture",
                path.display()
            )));
        }
        let full = |k: &str| format!("{arch}.{k}");
        let get = |k: &str| {
            meta.get_u64(&full(k))
                .map(|v| v as usize)
                .ok_or_else(|| EngineError::Model(format!("{}: metadata key {} is missing", path.display(), full(k))))
        };
        let n_embd = get(key::EMBEDDING_LENGTH)?;
        let n_head = get(key::ATTN_HEAD_COUNT)?;
        let n_ff = get(key::FEED_FORWARD_LENGTH)?;
        let n_layer = get(key::BLOCK_COUNT)?;
        let n_ctx_train = get(key::CONTEXT_LENGTH)?;
        if n_head == 0 || n_embd % n_head != 0 {
            return Err(EngineError::Model(format!(
                "{}: {n_embd} dims cannot split into {n_head} heads",
                path.display()
            )));
        }
        let eps = meta.get_f64(&full(key::ATTN_LAYERNORM_EPS)).unwrap_or(1e-12) as f32;
        let pooling = match meta.get_u64(&full(key::POOLING_TYPE)).unwrap_or(1) {
            0 => Pooling::None,
            1 => Pooling::Mean,
            2 => Pooling::Cls,
            3 => Pooling::Last,
            p => {
                return Err(EngineError::Unsupported(format!(
                    "{}: pooling type {p} is not supported",
                    path.display()
                )))
            }
        };
        let n_vocab = meta.get_array("tokenizer.ggml.tokens").map(|a| a.len()).unwrap_or(0);
        let hd = n_embd / n_head;
        let nomic = arch == "nomic-bert";
        let rope = nomic.then(|| Rope {
            n_dims: hd,
            neox: true,
            freq_base: meta.get_f64(&full(key::ROPE_FREQ_BASE)).unwrap_or(10000.0) as f32,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: n_ctx_train,
            freq_factors: None,
        });
        let l = Loader {
            backend: &*backend,
            gguf,
            path,
        };
        let e = n_embd;
        let norm = |name: &str| -> Result<(B::Weight, B::Weight)> {
            Ok((
                l.get(&format!("{name}.weight"), &[e])?,
                l.get(&format!("{name}.bias"), &[e])?,
            ))
        };
        let tok_embd = l.get(&T::TokenEmbd.weight(), &[e, n_vocab])?;
        let type_embd = match gguf.tensor(&T::TokenTypes.weight()) {
            Some((_, t)) => Some(l.get(
                &T::TokenTypes.weight(),
                &[e, t.shape.get(1).copied().unwrap_or(1) as usize],
            )?),
            None => None,
        };
        let pos_embd = if nomic {
            None
        } else {
            Some(l.get(&T::PositionEmbd.weight(), &[e, n_ctx_train])?)
        };
        let embd_norm = norm(T::TokenEmbdNorm.template())?;
        let mut layers = Vec::with_capacity(n_layer);
        for i in 0..n_layer {
            let (q, k, v, qkv) = if nomic {
                (None, None, None, Some(l.mat(&T::AttnQkv.blk(i), &[e, 3 * e])?))
            } else {
                (
                    Some(l.mat(&T::AttnQ.blk(i), &[e, e])?),
                    Some(l.mat(&T::AttnK.blk(i), &[e, e])?),
                    Some(l.mat(&T::AttnV.blk(i), &[e, e])?),
                    None,
                )
            };
            layers.push(Layer {
                q,
                k,
                v,
                qkv,
                bq: l.opt(&T::AttnQ.with(i, "bias"), &[e])?,
                bk: l.opt(&T::AttnK.with(i, "bias"), &[e])?,
                bv: l.opt(&T::AttnV.with(i, "bias"), &[e])?,
                o: l.mat(&T::AttnOutput.blk(i), &[e, e])?,
                bo: l.opt(&T::AttnOutput.with(i, "bias"), &[e])?,
                attn_norm: norm(&T::AttnOutputNorm.base(i))?,
                up: l.mat(&T::FfnUp.blk(i), &[e, n_ff])?,
                bup: l.opt(&T::FfnUp.with(i, "bias"), &[n_ff])?,
                gate: if nomic {
                    Some(l.mat(&T::FfnGate.blk(i), &[e, n_ff])?)
                } else {
                    None
                },
                down: l.mat(&T::FfnDown.blk(i), &[n_ff, e])?,
                bdown: l.opt(&T::FfnDown.with(i, "bias"), &[e])?,
                out_norm: norm(&T::LayerOutputNorm.base(i))?,
            });
        }
        Ok(Bert {
            arch,
            n_embd,
            n_head,
            n_ctx_train,
            n_vocab,
            pooling,
            eps,
            rope,
            backend,
            tok_embd,
            type_embd,
            pos_embd,
            embd_norm,
            layers,
        })
    }

    /// Last hidden states of each input (row-major, `len × n_embd`), all inputs in one forward.
    pub fn hidden_states(&self, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let total: usize = inputs.iter().map(Vec::len).sum();
        if total == 0 || inputs.iter().any(Vec::is_empty) {
            return Err(EngineError::Input("an input has no tokens".into()));
        }
        for (i, t) in inputs.iter().enumerate() {
            if t.len() > self.n_ctx_train {
                return Err(EngineError::Input(format!(
                    "input {i} has {} tokens; the model takes at most {}",
                    t.len(),
                    self.n_ctx_train
                )));
            }
        }
        let b = &*self.backend;
        b.run(|| self.forward(inputs, total))
    }

    fn forward(&self, inputs: &[Vec<u32>], total: usize) -> Result<Vec<Vec<f32>>> {
        let b = &*self.backend;
        let e = self.n_embd;
        let hd = e / self.n_head;
        let buf = |cols: usize| b.alloc(total, cols);
        let (mut x, mut t, mut xn) = (buf(e), buf(e), buf(e));
        let (mut q, mut k, mut v, mut attn, mut o) = (buf(e), buf(e), buf(e), buf(e), buf(e));
        let n_ff = self.layers.first().map_or(e, |l| b.weight_shape(&l.up)[1] as usize);
        let (mut up, mut gate, mut act, mut qkv) = (buf(n_ff), buf(n_ff), buf(n_ff), buf(3 * e));
        let ids: Vec<u32> = inputs.iter().flatten().copied().collect();
        let positions: Vec<usize> = inputs.iter().flat_map(|t| 0..t.len()).collect();
        let mut layout = Vec::with_capacity(inputs.len());
        let mut row0 = 0;
        for t in inputs {
            layout.push(StepSeq {
                row0,
                rows: t.len(),
                pos0: 0,
                alone: false,
            });
            row0 += t.len();
        }
        let step = b.begin_step(
            StepPlan {
                ids,
                positions,
                seqs: layout,
            },
            &[],
        )?;
        b.embed(&self.tok_embd, &step, &mut x)?;
        if let Some(te) = &self.type_embd {
            b.get_rows(te, &vec![0; total], &mut t)?;
            b.add(&mut x, &t);
        }
        if let Some(pe) = &self.pos_embd {
            let pos: Vec<u32> = inputs.iter().flat_map(|t| 0..t.len() as u32).collect();
            b.get_rows(pe, &pos, &mut t)?;
            b.add(&mut x, &t);
        }
        b.layer_norm(&x, &self.embd_norm.0, &self.embd_norm.1, self.eps, &mut xn);
        std::mem::swap(&mut x, &mut xn);
        let mut seqs = Vec::with_capacity(inputs.len());
        let mut row0 = 0;
        for t in inputs {
            seqs.push(row0..row0 + t.len());
            row0 += t.len();
        }
        let scale = 1.0 / (hd as f32).sqrt();
        for ly in &self.layers {
            if let Some(w) = &ly.qkv {
                b.matmul(w, &x, &mut qkv);
                split3(b, &qkv, e, &mut q, &mut k, &mut v);
            } else if let (Some(wq), Some(wk), Some(wv)) = (&ly.q, &ly.k, &ly.v) {
                b.matmul_many(&[wq, wk, wv], &x, &mut [&mut q, &mut k, &mut v]);
            }
            for (bias, dst) in [(&ly.bq, &mut q), (&ly.bk, &mut k), (&ly.bv, &mut v)] {
                if let Some(bias) = bias {
                    b.add_bias(dst, bias);
                }
            }
            if let Some(r) = &self.rope {
                b.rope(&mut q, hd, &step, r);
                b.rope(&mut k, hd, &step, r);
            }
            // Every sequence attends to all of its own tokens, the whole batch in one call.
            b.encoder_attention(&q, &k, &v, &seqs, self.n_head, scale, &mut attn);
            b.matmul(&ly.o, &attn, &mut o);
            if let Some(bias) = &ly.bo {
                b.add_bias(&mut o, bias);
            }
            b.add(&mut o, &x);
            b.layer_norm(&o, &ly.attn_norm.0, &ly.attn_norm.1, self.eps, &mut x);
            if let Some(g) = &ly.gate {
                b.matmul_many(&[&ly.up, g], &x, &mut [&mut up, &mut gate]);
                b.swiglu(&gate, &up, &mut act);
            } else {
                b.matmul(&ly.up, &x, &mut act);
                if let Some(bias) = &ly.bup {
                    b.add_bias(&mut act, bias);
                }
                b.gelu(&mut act);
            }
            b.matmul(&ly.down, &act, &mut o);
            if let Some(bias) = &ly.bdown {
                b.add_bias(&mut o, bias);
            }
            b.add(&mut o, &x);
            b.layer_norm(&o, &ly.out_norm.0, &ly.out_norm.1, self.eps, &mut x);
        }
        let flat = b.read(&x);
        let mut out = Vec::with_capacity(inputs.len());
        let mut row0 = 0;
        for toks in inputs {
            out.push(flat[row0 * e..(row0 + toks.len()) * e].to_vec());
            row0 += toks.len();
        }
        Ok(out)
    }

    /// One vector per input: pooled as `pooling` says (the GGUF's when `None`), L2-normalised
    /// when `normalize`; with [`Pooling::None`] the input's token states, one row of `n_embd` per
    /// token, as they are (llama-server's `--pooling none`).
    pub fn embed(&self, inputs: &[Vec<u32>], pooling: Option<Pooling>, normalize: bool) -> Result<Vec<Vec<f32>>> {
        let hidden = self.hidden_states(inputs)?;
        let e = self.n_embd;
        // A GGUF that says "none" is mean-pooled unless per-token states are asked for.
        let pooling = pooling.unwrap_or(match self.pooling {
            Pooling::None => Pooling::Mean,
            p => p,
        });
        if pooling == Pooling::None {
            return Ok(hidden);
        }
        Ok(hidden
            .into_iter()
            .map(|h| {
                let n = h.len() / e;
                let mut v = match pooling {
                    Pooling::Cls => h[..e].to_vec(),
                    Pooling::Last => h[(n - 1) * e..].to_vec(),
                    Pooling::Mean | Pooling::None => {
                        let mut m = vec![0f64; e];
                        for row in h.chunks(e) {
                            for (a, &x) in m.iter_mut().zip(row) {
                                *a += x as f64;
                            }
                        }
                        m.into_iter().map(|a| (a / n as f64) as f32).collect()
                    }
                };
                if normalize {
                    l2_normalize(&mut v);
                }
                v
            })
            .collect())
    }
}

/// Scale to unit length (a zero vector stays zero).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt();
    if norm > 0.0 {
        for x in v {
            *x = (*x as f64 / norm) as f32;
        }
    }
}

/// Split fused QKV rows (q | k | v) into three buffers.
fn split3<B: Backend>(b: &B, qkv: &B::Buf, e: usize, q: &mut B::Buf, k: &mut B::Buf, v: &mut B::Buf) {
    b.split_cols(qkv, &mut [(0, q), (e, k), (2 * e, v)], e);
}
