//! Loading a chat/completion model and generating text from it: prompt prefill in batches,
//! token-by-token decoding through the KV cache, sampling, EOS and stop strings, streaming
//! UTF-8-safe text pieces to a callback.

use crate::backend::{Backend, KvType, FED};
use crate::chat::ChatTemplate;
use crate::model::{HiddenRows, Logits, Model, Scratch, SeqStep};
use crate::sampler::{Sampler, SamplingParams};
use crate::spec::{Drafter, SpecMode, SpecStats};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::{EngineError, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A model with its tokenizer and chat template.
pub struct LoadedModel<B: Backend> {
    pub path: PathBuf,
    pub model: Box<dyn Model<B>>,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
}

impl<B: Backend> LoadedModel<B> {
    pub fn load(backend: Arc<B>, path: &Path) -> Result<LoadedModel<B>> {
        let gguf = crate::model::open_gguf(path)?;
        let model = crate::model::load(backend, &gguf, path)?;
        let meta = gguf.metadata();
        let tokenizer = Tokenizer::from_gguf(meta)
            .map_err(|e| EngineError::Model(format!("{}: tokenizer: {e}", path.display())))?;
        if tokenizer.n_vocab() != model.info().n_vocab {
            return Err(EngineError::Model(format!(
                "{}: the tokenizer has {} tokens but the model {}",
                path.display(),
                tokenizer.n_vocab(),
                model.info().n_vocab
            )));
        }
        let template = ChatTemplate::from_gguf(meta, &tokenizer)
            .map_err(|e| EngineError::Model(format!("{}: chat template: {e}", path.display())))?;
        Ok(LoadedModel {
            path: path.to_path_buf(),
            model,
            tokenizer: Arc::new(tokenizer),
            template,
        })
    }

    /// Tokenize a prompt given verbatim: BOS per the model's flag, special tokens recognised.
    pub fn tokenize_prompt(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer
            .encode(text, true, true)
            .map_err(|e| EngineError::Input(format!("tokenizing the prompt: {e}")))
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token or a stop string.
    Stop,
    /// The token limit.
    Length,
    /// The callback asked to stop (a client went away).
    Cancelled,
}

#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Tokens per prefill step.
    pub n_batch: usize,
    /// Report each sampled token's log-probability and this many alternatives (`None`: off).
    pub logprobs: Option<usize>,
    /// Tokens proposed ahead and checked in one step (`spec`), at most `draft_max` at a time.
    pub spec: SpecMode,
    pub draft_max: usize,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 256,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
            n_batch: 512,
            logprobs: None,
            spec: SpecMode::Off,
            draft_max: 8,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Generated {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish: Finish,
    pub prompt_tokens: usize,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    /// What speculative decoding did (zeros when off).
    pub spec: SpecStats,
}

/// One conversation's state: its KV cache and the tokens already in it.
pub struct Session<B: Backend> {
    pub kv: B::Kv,
    pub tokens: Vec<u32>,
    scratch: Scratch,
}

impl<B: Backend> Session<B> {
    pub fn new(m: &LoadedModel<B>, n_ctx: usize, kv_type: KvType, n_batch: usize) -> Result<Session<B>> {
        if n_ctx == 0 {
            return Err(EngineError::Config("the context size must be at least 1".into()));
        }
        Ok(Session {
            kv: m.model.new_kv(n_ctx, kv_type)?,
            tokens: Vec::new(),
            scratch: m.model.scratch(n_batch.max(1)),
        })
    }

    pub fn n_ctx(&self, m: &LoadedModel<B>) -> usize {
        m.model.backend().kv_capacity(&self.kv)
    }

    /// Feed tokens (reusing the common prefix already cached) and return the last logits.
    pub fn feed(&mut self, m: &LoadedModel<B>, tokens: &[u32], n_batch: usize) -> Result<Vec<f32>> {
        Ok(self.feed_with(m, tokens, n_batch, false)?.0)
    }

    /// `feed`, also pairing each fed position but the last with the token after it in the
    /// model's MTP layer when `mtp` (its cache then holds the prompt for drafting; positions
    /// of a reused prefix keep what an earlier turn stored). With the last logits, the rows of
    /// the last step: the last one's hidden state waits for the token chosen after it.
    fn feed_with(
        &mut self,
        m: &LoadedModel<B>,
        tokens: &[u32],
        n_batch: usize,
        mtp: bool,
    ) -> Result<(Vec<f32>, usize)> {
        let n_ctx = self.n_ctx(m);
        if tokens.len() > n_ctx {
            return Err(EngineError::ContextFull {
                need: tokens.len(),
                n_ctx,
            });
        }
        for &t in tokens {
            if t as usize >= m.model.info().n_vocab {
                return Err(EngineError::Input(format!(
                    "token id {t} is outside the vocabulary of {} tokens",
                    m.model.info().n_vocab
                )));
            }
        }
        // Keep the cached prefix; recompute at least the last token to get its logits.
        let common = self
            .tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len().saturating_sub(1));
        // A hybrid model's recurrent state goes back only to a point it kept (itself, a
        // checkpoint, a page's copy); the cache's K/V rows are overwritten from there.
        let b = m.model.backend();
        let common = b.kv_restore(&mut self.kv, common);
        self.tokens.truncate(common);
        // The next turn of a conversation usually re-sends this prompt: keep the state at its end.
        b.kv_keep_states(&mut self.kv, &[tokens.len()]);
        let mut last = Vec::new();
        let mut rows = 0;
        let n_batch = n_batch.max(1).min(self.scratch.rows());
        for chunk in tokens[common..].chunks(n_batch) {
            let pos0 = self.tokens.len();
            let out = m.model.forward(
                &mut self.scratch,
                &mut [SeqStep {
                    kv: &mut self.kv,
                    tokens: chunk,
                    pos0,
                    logits: Logits::Last,
                }],
            )?;
            self.tokens.extend_from_slice(chunk);
            last = out.into_iter().next().unwrap_or_default();
            rows = chunk.len();
            let known = chunk.len().min(tokens.len() - pos0 - 1);
            if mtp && known > 0 {
                let hidden: Vec<usize> = (0..known).collect();
                m.model.forward_mtp_argmax(
                    &mut self.scratch,
                    &mut [SeqStep {
                        kv: &mut self.kv,
                        tokens: &tokens[pos0 + 1..pos0 + 1 + known],
                        pos0,
                        logits: Logits::None,
                    }],
                    HiddenRows::Target(&hidden),
                )?;
            }
        }
        Ok((last, rows))
    }

    /// Forget the cached tokens (the cache is overwritten from position 0 on the next feed).
    pub fn clear(&mut self) {
        self.tokens.clear();
    }
}

/// One sequence's decoding state: sampler, UTF-8-safe detokenizer, stop strings, token limit.
/// Feed it each step's logits; it picks the token and says what text became final and whether the
/// sequence ended. Used by [`generate`] and by the server's scheduler.
pub struct Decoding {
    logprobs: Option<usize>,
    constraint: Option<crate::grammar::Constraint>,
    sampler: Sampler,
    dec: StreamDecoder,
    stop: Vec<String>,
    max_hold: usize,
    max_tokens: usize,
    ignore_eos: bool,
    pub tokens: Vec<u32>,
    text: String,
    emitted: usize,
    /// The stop string that ended the sequence, if one did.
    matched: Option<String>,
}

/// A token's log-probability under the model's distribution (raw logits, before sampling
/// adjustments), with the most likely alternatives.
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// The outcome of one [`Decoding::step`].
pub struct Step {
    /// The sampled token's log-probability, when asked for (also for a final EOS token).
    pub logprob: Option<TokenLogprob>,
    /// The token to feed next (`None` when the sequence ended without one, e.g. at EOS).
    pub token: Option<u32>,
    /// Text that became final with this token (may be empty).
    pub text: String,
    pub finish: Option<Finish>,
}

impl Decoding {
    pub fn new(params: &GenerateParams, prompt: &[u32]) -> Result<Decoding> {
        params.sampling.validate().map_err(EngineError::Input)?;
        let mut sampler = Sampler::new(params.sampling.clone());
        for &t in prompt {
            sampler.accept(t);
        }
        Ok(Decoding {
            logprobs: params.logprobs,
            constraint: None,
            sampler,
            dec: StreamDecoder::new(false),
            stop: params.stop.clone(),
            max_hold: params.stop.iter().map(|s| s.len()).max().unwrap_or(0),
            max_tokens: params.max_tokens,
            ignore_eos: params.ignore_eos,
            tokens: Vec::new(),
            text: String::new(),
            emitted: 0,
            matched: None,
        })
    }

    /// Constrain the output with a grammar (structured output).
    pub fn with_constraint(mut self, c: crate::grammar::Constraint) -> Decoding {
        self.constraint = Some(c);
        self
    }

    /// Tokens the sequence may still generate (its `max_tokens` less those generated).
    pub fn remaining(&self) -> usize {
        self.max_tokens.saturating_sub(self.tokens.len())
    }

    /// The stop string that ended the sequence (`None` if it ended otherwise or goes on).
    pub fn matched_stop(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// The whole text so far (including text held back for a possible stop string).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the next token is simply the logits' first largest (greedy, no grammar, bias,
    /// penalties or logprobs): then [`Decoding::step_token`] with the backend's argmax
    /// (`Model::forward_argmax`) gives what [`Decoding::step`] gives with the whole row.
    pub fn greedy_only(&self) -> bool {
        let p = &self.sampler.params;
        self.logprobs.is_none()
            && self.constraint.is_none()
            && p.temperature <= 0.0
            && p.logit_bias.is_empty()
            && p.repeat_penalty == 1.0
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0
    }

    /// What the next token needs of its logits row (`row` of the step's, `vocab` long) instead
    /// of the whole row (`Sampler::needs`: a top-k cut, not greedy), when nothing else reads the
    /// row (no logprobs, no grammar) and the cut leaves out some of it: then
    /// [`Decoding::step_top`] with the backend's answer (`Model::logits_top`) gives what
    /// [`Decoding::step`] gives with the whole row.
    pub fn top_needs(&self, row: usize, vocab: usize) -> Option<crate::backend::TopAsk> {
        if self.logprobs.is_some() || self.constraint.is_some() {
            return None;
        }
        let (n, at) = self.sampler.needs().filter(|(n, _)| *n < vocab)?;
        Some(crate::backend::TopAsk { row, n, at })
    }

    /// What the next token asks of a backend that draws where the logits are
    /// (`Model::logits_sample`; `row` of the step's), when nothing else reads the row (no
    /// logprobs, no grammar) and it is not greedy. The draw's point is taken from the sampler's
    /// RNG now: [`Decoding::step_sampled`] with the backend's token gives what
    /// [`Decoding::step`] gives with the whole row.
    pub fn sample_needs(&mut self, row: usize) -> Option<crate::backend::SampleAsk> {
        if self.logprobs.is_some() || self.constraint.is_some() || self.tokens.len() >= self.max_tokens {
            return None;
        }
        self.sampler.device_ask(row)
    }

    /// `step` from the token drawn for [`Decoding::sample_needs`]'s ask.
    pub fn step_sampled(&mut self, tokenizer: &Tokenizer, tok: u32) -> Step {
        if self.tokens.len() >= self.max_tokens {
            return self.finish(Finish::Length, None);
        }
        self.advance(tokenizer, tok, None)
    }

    /// `step_draft` from the answer to [`Decoding::top_needs`]'s ask.
    pub fn step_top(
        &mut self,
        tokenizer: &Tokenizer,
        ask: &crate::backend::TopAsk,
        top: &crate::backend::Top,
        draft: Option<u32>,
    ) -> Step {
        if self.tokens.len() >= self.max_tokens {
            return self.finish(Finish::Length, None);
        }
        let tok = self.sampler.sample_top(&top.top, &ask.at, &top.at, top.cols, draft);
        self.advance(tokenizer, tok, None)
    }

    pub fn step(&mut self, tokenizer: &Tokenizer, logits: &mut [f32]) -> Step {
        self.step_draft(tokenizer, logits, None)
    }

    /// `step` when `draft` was proposed for this token (speculative decoding,
    /// `Sampler::sample_draft`): greedy picks the same token as `step`; sampling keeps the draft
    /// with its probability under the chain.
    pub fn step_draft(&mut self, tokenizer: &Tokenizer, logits: &mut [f32], draft: Option<u32>) -> Step {
        if self.tokens.len() >= self.max_tokens {
            return self.finish(Finish::Length, None);
        }
        let lp = self.logprobs.map(|k| (crate::sampler::log_softmax(logits), k));
        if let Some(c) = &mut self.constraint {
            if c.mask(logits).is_err() {
                return self.finish(Finish::Stop, None);
            }
        }
        let tok = match draft {
            Some(d) => self.sampler.sample_draft(logits, d),
            None => self.sampler.sample(logits),
        };
        let logprob = lp.map(|(lp, k)| TokenLogprob {
            token: tok,
            logprob: lp[tok as usize],
            top: top_k(&lp, k),
        });
        self.advance(tokenizer, tok, logprob)
    }

    /// `step` for the token the backend found as the logits' first largest, when
    /// [`Decoding::greedy_only`].
    pub fn step_token(&mut self, tokenizer: &Tokenizer, tok: u32) -> Step {
        debug_assert!(self.greedy_only());
        if self.tokens.len() >= self.max_tokens {
            return self.finish(Finish::Length, None);
        }
        self.advance(tokenizer, tok, None)
    }

    /// The sequence goes on with `tok`: text, stop strings, grammar and limits.
    fn advance(&mut self, tokenizer: &Tokenizer, tok: u32, logprob: Option<TokenLogprob>) -> Step {
        if !self.ignore_eos && tokenizer.is_eog(tok) {
            return Step {
                logprob,
                ..self.finish(Finish::Stop, None)
            };
        }
        self.tokens.push(tok);
        self.sampler.accept(tok);
        self.text.push_str(&self.dec.push(tokenizer, tok));
        if let Some(c) = &mut self.constraint {
            // The grammar is complete: nothing may follow, the sequence ends here.
            if c.accept(tok).is_err() || c.is_stopped() {
                return Step {
                    logprob,
                    ..self.finish(Finish::Stop, None)
                };
            }
        }
        let from = self.emitted.min(self.text.len());
        if let Some((at, k)) = self
            .stop
            .iter()
            .enumerate()
            .filter_map(|(k, s)| self.text[from..].find(s.as_str()).map(|i| (i + from, k)))
            .min()
        {
            self.matched = Some(self.stop[k].clone());
            self.text.truncate(at);
            let piece = self.text[self.emitted..].to_string();
            self.emitted = self.text.len();
            return Step {
                logprob,
                token: None,
                text: piece,
                finish: Some(Finish::Stop),
            };
        }
        if self.tokens.len() >= self.max_tokens {
            return Step {
                logprob,
                ..self.finish(Finish::Length, Some(tok))
            };
        }
        let safe = safe_prefix(&self.text, self.emitted, self.max_hold, &self.stop);
        let piece = self.text[self.emitted..safe].to_string();
        self.emitted = safe;
        Step {
            logprob,
            token: Some(tok),
            text: piece,
            finish: None,
        }
    }

    /// End the sequence early (e.g. the context is full): the text still held back.
    pub fn flush(&mut self) -> String {
        self.finish(Finish::Length, None).text
    }

    /// End the sequence: flush held-back text and incomplete UTF-8.
    fn finish(&mut self, why: Finish, token: Option<u32>) -> Step {
        self.text.push_str(&self.dec.finish());
        let piece = self.text[self.emitted..].to_string();
        self.emitted = self.text.len();
        Step {
            logprob: None,
            token,
            text: piece,
            finish: Some(why),
        }
    }
}

/// The `k` largest entries of `lp` (ties: lower id first).
fn top_k(lp: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return Vec::new();
    }
    let cmp = |a: &u32, b: &u32| lp[*b as usize].total_cmp(&lp[*a as usize]).then(a.cmp(b));
    idx.select_nth_unstable_by(k - 1, cmp);
    idx.truncate(k);
    idx.sort_by(cmp);
    idx.into_iter().map(|i| (i, lp[i as usize])).collect()
}

/// Generate after `prompt`. `on_text` receives each piece of text as soon as it is complete
/// UTF-8 and cannot be the start of a stop string; returning `false` cancels.
pub fn generate<B: Backend>(
    m: &LoadedModel<B>,
    session: &mut Session<B>,
    prompt: &[u32],
    params: &GenerateParams,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<Generated> {
    if prompt.is_empty() {
        return Err(EngineError::Input("the prompt is empty".into()));
    }
    let n_ctx = session.n_ctx(m);
    if prompt.len() >= n_ctx {
        return Err(EngineError::ContextFull {
            need: prompt.len() + 1,
            n_ctx,
        });
    }
    let mut d = Decoding::new(params, prompt)?;
    let margins = std::env::var_os("HF2Q_DEBUG_MARGIN").is_some();
    let spec = params.spec.on(m.model.backend().as_ref());
    if spec == SpecMode::Mtp && m.model.mtp_layers() == 0 {
        return Err(no_mtp(&m.path, &m.model.info().arch));
    }
    let mut drafter = if margins {
        None
    } else {
        Drafter::of(spec, params.draft_max)
    };
    let mtp = matches!(drafter, Some(Drafter::Mtp(_)));
    let t0 = Instant::now();
    let (mut logits, rows) = session.feed_with(m, prompt, params.n_batch, mtp)?;
    if let Some(Drafter::Mtp(dr)) = &mut drafter {
        // The prompt's last row pairs with the first token chosen.
        dr.target_step(rows.saturating_sub(1), prompt.len() - 1, Vec::new());
    }
    let prefill_time = t0.elapsed();
    let t1 = Instant::now();
    // Greedy decoding takes each step's token as the backend finds it (a GPU hands back the id,
    // not the row); the prompt's last row comes whole.
    let by_argmax = d.greedy_only() && !margins;
    let stats = |dr: &Option<Drafter>| dr.as_ref().map(|d| d.stats()).unwrap_or_default();
    if margins {
        debug_margin(0, &logits);
    }
    // The steps whose tokens are final, in order; the last one's token is fed next.
    let mut pending = vec![d.step(&m.tokenizer, &mut logits)];
    // Greedy decoding's next step, already begun with the token it was fed on the device.
    let mut ahead: Option<(u32, crate::backend::Deferred)> = None;
    loop {
        let mut next = None;
        for st in pending.drain(..) {
            if !st.text.is_empty() && !on_text(&st.text) {
                let g = done(
                    d.tokens,
                    d.text,
                    Finish::Cancelled,
                    prompt.len(),
                    prefill_time,
                    t1.elapsed(),
                );
                return Ok(Generated {
                    spec: stats(&drafter),
                    ..g
                });
            }
            if let Some(f) = st.finish {
                let g = done(d.tokens, d.text, f, prompt.len(), prefill_time, t1.elapsed());
                return Ok(Generated {
                    spec: stats(&drafter),
                    ..g
                });
            }
            next = st.token;
        }
        let Some(tok) = next else {
            unreachable!("a step without a token finishes")
        };
        if session.tokens.len() + 1 >= n_ctx {
            // The context is full: what was generated so far is the answer.
            let rest = d.finish(Finish::Length, None);
            if !rest.text.is_empty() {
                on_text(&rest.text);
            }
            let g = done(
                d.tokens,
                d.text,
                Finish::Length,
                prompt.len(),
                prefill_time,
                t1.elapsed(),
            );
            return Ok(Generated {
                spec: stats(&drafter),
                ..g
            });
        }
        let pos0 = session.tokens.len();
        // Drafts within the context and the token limit, checked in one step.
        let room = (n_ctx - pos0 - 1).min(params.max_tokens.saturating_sub(d.tokens.len() + 1));
        let drafts = match &mut drafter {
            Some(Drafter::Ngram(dr)) => {
                let mut h = session.tokens.clone();
                h.push(tok);
                dr.propose(&h, room)
            }
            Some(Drafter::Mtp(dr)) => dr.propose(m.model.as_ref(), &mut session.scratch, &mut session.kv, tok, room)?,
            None => Vec::new(),
        };
        if !drafts.is_empty() {
            let fed: Vec<u32> = std::iter::once(tok).chain(drafts.iter().copied()).collect();
            let b = m.model.backend();
            // A hybrid model's recurrent state can go back to any of the drafted positions.
            let marks: Vec<usize> = (pos0 + 1..pos0 + fed.len()).collect();
            b.kv_keep_states(&mut session.kv, &marks);
            let argmax = m.model.forward_argmax(
                &mut session.scratch,
                &mut [SeqStep {
                    kv: &mut session.kv,
                    tokens: &fed,
                    pos0,
                    logits: Logits::Each,
                }],
            )?;
            let scratch = &mut session.scratch;
            let checked = crate::spec::check(&mut d, &m.tokenizer, &drafts, &argmax, |i| {
                m.model.logits_row(scratch, i)
            })?;
            let rows = checked.rows();
            session.tokens.extend_from_slice(&fed[..rows]);
            let at = b.kv_restore(&mut session.kv, session.tokens.len());
            if at != session.tokens.len() {
                return Err(EngineError::Backend(format!(
                    "speculative decoding: the cache went back to position {at}, not {}",
                    session.tokens.len()
                )));
            }
            if let Some(dr) = &mut drafter {
                dr.feedback(drafts.len(), rows - 1);
                if let Drafter::Mtp(dr) = dr {
                    dr.target_step(0, pos0, fed[1..rows].to_vec());
                }
            }
            pending = checked.steps;
            continue;
        }
        let st = if by_argmax {
            let b = m.model.backend();
            // This step, begun last time with its token fed on the device when that token was
            // `tok` (or now), and the step after it begun before this one's token is read: on a
            // GPU the device does not wait for the host between steps (`model::decode_greedy`).
            let this = match ahead.take() {
                Some((t, dfr)) if t == tok => dfr,
                other => {
                    if let Some((_, dfr)) = other {
                        b.deferred_ids(dfr);
                    }
                    m.model.forward_argmax_defer(
                        &mut session.scratch,
                        &mut [SeqStep {
                            kv: &mut session.kv,
                            tokens: &[tok],
                            pos0,
                            logits: Logits::Last,
                        }],
                    )?
                }
            };
            let feed = m.model.feeds_tokens() && drafter.is_none() && pos0 + 2 < n_ctx;
            let next = if feed {
                Some(m.model.forward_argmax_defer(
                    &mut session.scratch,
                    &mut [SeqStep {
                        kv: &mut session.kv,
                        tokens: &[FED],
                        pos0: pos0 + 1,
                        logits: Logits::Last,
                    }],
                )?)
            } else {
                None
            };
            let best = b.deferred_ids(this).first().copied().unwrap_or(0);
            ahead = next.map(|dfr| (best, dfr));
            d.step_token(&m.tokenizer, best)
        } else {
            let mut seq = [SeqStep {
                kv: &mut session.kv,
                tokens: &[tok],
                pos0,
                logits: Logits::Last,
            }];
            let draws = m.model.samples_on_device() && !margins;
            // (Asked only where it is used: the ask takes the draw from the sampler.)
            if let Some(ask) = if draws { d.sample_needs(0) } else { None } {
                // Drawn where the logits are: only the token crosses (the argmax, not waited
                // for, read after).
                let dfr = m.model.forward_argmax_defer(&mut session.scratch, &mut seq)?;
                let got = m.model.logits_sample(&mut session.scratch, std::slice::from_ref(&ask));
                m.model.backend().deferred_ids(dfr);
                let got = got?
                    .first()
                    .copied()
                    .ok_or_else(|| EngineError::Backend("no logits row".into()))?;
                d.step_sampled(&m.tokenizer, got)
            } else {
                match d.top_needs(0, m.tokenizer.n_vocab()).filter(|_| !margins) {
                    // A top-k cut: what it needs of the row, found where the logits are (the argmax,
                    // not waited for, read after).
                    Some(ask) => {
                        let dfr = m.model.forward_argmax_defer(&mut session.scratch, &mut seq)?;
                        let top = m.model.logits_top(&mut session.scratch, std::slice::from_ref(&ask));
                        m.model.backend().deferred_ids(dfr);
                        let top = top?
                            .into_iter()
                            .next()
                            .ok_or_else(|| EngineError::Backend("no logits row".into()))?;
                        d.step_top(&m.tokenizer, &ask, &top, None)
                    }
                    None => {
                        let l = m.model.forward(&mut session.scratch, &mut seq)?;
                        logits = l.into_iter().next().unwrap_or_default();
                        if margins {
                            debug_margin(d.tokens.len(), &logits);
                        }
                        d.step(&m.tokenizer, &mut logits)
                    }
                }
            }
        };
        session.tokens.push(tok);
        if let Some(Drafter::Mtp(dr)) = &mut drafter {
            dr.target_step(0, pos0, Vec::new());
        }
        pending.push(st);
    }
}

/// `--spec mtp` for a model without MTP layers.
pub fn no_mtp(path: &Path, arch: &str) -> EngineError {
    EngineError::Input(format!(
        "{}: --spec mtp needs multi-token-prediction (MTP) layers, and this {arch} model has none \
         (only Qwen 3.5 / 3.6 checkpoints carry them, and a conversion with --no-mtp drops them); \
         use --spec ngram or off",
        path.display()
    ))
}

/// Developer aid (`HF2Q_DEBUG_MARGIN`): the two best tokens and their log-probabilities.
fn debug_margin(step: usize, logits: &[f32]) {
    let mut v: Vec<(usize, f32)> = logits.iter().copied().enumerate().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    let lp = crate::sampler::log_softmax(logits);
    eprintln!(
        "step {step}: top {} {:.6} second {} {:.6} margin {:.5}",
        v[0].0,
        lp[v[0].0],
        v[1].0,
        lp[v[1].0],
        v[0].1 - v[1].1
    );
}

fn done(tokens: Vec<u32>, text: String, finish: Finish, prompt_tokens: usize, p: Duration, d: Duration) -> Generated {
    Generated {
        spec: SpecStats::default(),
        tokens,
        text,
        finish,
        prompt_tokens,
        prefill_time: p,
        decode_time: d,
    }
}

/// The end of the text that can be emitted: everything except a tail that is a proper prefix of
/// some stop string (at a char boundary).
fn safe_prefix(text: &str, emitted: usize, max_hold: usize, stops: &[String]) -> usize {
    if stops.is_empty() {
        return text.len();
    }
    let lo = text.len().saturating_sub(max_hold).max(emitted);
    for start in lo..text.len() {
        if !text.is_char_boundary(start) {
            continue;
        }
        let tail = &text[start..];
        if stops.iter().any(|s| s.starts_with(tail)) {
            return start;
        }
    }
    text.len()
}

#[cfg(test)]
mod tests {
    use super::safe_prefix;

    #[test]
    fn holds_back_a_possible_stop_string_start() {
        let stops = vec!["</end>".to_string()];
        assert_eq!(safe_prefix("hello </e", 0, 6, &stops), 6);
        assert_eq!(safe_prefix("hello", 0, 6, &stops), 5);
        assert_eq!(safe_prefix("a<", 0, 6, &stops), 1);
        assert_eq!(safe_prefix("abc", 0, 0, &[]), 3);
    }
}
