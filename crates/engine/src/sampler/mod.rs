//! Token sampling with llama.cpp's default chain order (`common/sampling.cpp`,
//! `src/llama-sampler.cpp`): logit bias → repetition/presence/frequency penalties → top-k →
//! top-p → min-p → temperature → a draw from a seeded RNG. Temperature ≤ 0 is greedy. The cuts and
//! the draw are in integer masses (`masses`): the same token on the host and the GPU, and no sort
//! of the whole vocabulary when nothing cuts it short.

use std::collections::{HashMap, VecDeque};

pub mod masses;

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// ≤ 0: greedy (argmax).
    pub temperature: f32,
    /// 0: off.
    pub top_k: usize,
    /// 1.0: off.
    pub top_p: f32,
    /// 0.0: off.
    pub min_p: f32,
    /// 1.0: off. Divides positive and multiplies negative logits of recent tokens.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at (llama.cpp `--repeat-last-n`).
    pub penalty_last_n: usize,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplingParams {
    /// llama.cpp's CLI defaults.
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            penalty_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() {
            return Err("temperature must be a finite number".into());
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return Err(format!(
                "repeat penalty must be a positive number, got {}",
                self.repeat_penalty
            ));
        }
        if !self.presence_penalty.is_finite() || !self.frequency_penalty.is_finite() {
            return Err("presence and frequency penalties must be finite".into());
        }
        Ok(())
    }
}

/// A small deterministic RNG (SplitMix64 seeding xoshiro256**), so a seed gives the same text on
/// every platform.
#[derive(Clone, Debug)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E3779B97F4A7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D049BB133111EB);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub struct Sampler {
    pub params: SamplingParams,
    rng: Rng,
    recent: VecDeque<u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = Rng::new(params.seed);
        Sampler {
            params,
            rng,
            recent: VecDeque::new(),
        }
    }

    /// Record a token (prompt or generated) for the penalties.
    pub fn accept(&mut self, tok: u32) {
        if self.params.penalty_last_n == 0 {
            return;
        }
        self.recent.push_back(tok);
        while self.recent.len() > self.params.penalty_last_n {
            self.recent.pop_front();
        }
    }

    /// Apply bias and penalties to `logits` in place (what every later step sees).
    pub fn apply_penalties(&self, logits: &mut [f32]) {
        self.penalise(|t, f| {
            if let Some(l) = logits.get_mut(t as usize) {
                f(l)
            }
        });
    }

    /// Bias then penalties: `on(token, change)` applies each change to that token's value.
    fn penalise(&self, mut on: impl FnMut(u32, &mut dyn FnMut(&mut f32))) {
        for c in self.changes() {
            on(c.token, &mut |l| *l = c.apply(*l));
        }
    }

    /// The changes that bias and penalties make to a row, in order (bias first).
    pub fn changes(&self) -> Vec<masses::Change> {
        use masses::Change;
        let p = &self.params;
        let mut out: Vec<Change> = p.logit_bias.iter().map(|&(token, b)| Change::add(token, b)).collect();
        if !self.penalties_on() {
            return out;
        }
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in &self.recent {
            *counts.entry(t).or_default() += 1;
        }
        // llama-sampler.cpp llama_sampler_penalties_apply
        for (&t, &c) in &counts {
            let sub = c as f32 * p.frequency_penalty + if c > 0 { p.presence_penalty } else { 0.0 };
            out.push(Change::penalty(t, p.repeat_penalty, sub));
        }
        out
    }

    /// What a backend needs to draw this sampler's next token where the logits are (the GPU's
    /// `sample_rows`; only the token comes back): the changes, the cuts and the draw's point,
    /// taken from the RNG now. `None` when greedy. [`Sampler::sample`] from the row gives the
    /// same token ([`masses::sample_row`]).
    pub fn device_ask(&mut self, row: usize) -> Option<masses::SampleAsk> {
        if self.params.temperature <= 0.0 {
            return None;
        }
        Some(masses::SampleAsk {
            row,
            changes: self.changes(),
            cuts: masses::Cuts::of(&self.params),
            u: self.rng.next_f64(),
        })
    }

    fn penalties_on(&self) -> bool {
        let p = &self.params;
        p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0
    }

    /// Choose the next token from raw logits.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.apply_penalties(logits);
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        self.pick(candidates(logits), None)
    }

    /// What [`Sampler::sample_top`] needs of a logits row instead of the whole row, when the
    /// chain cuts to its top k (and is not greedy): the row's `n` largest raw values and the raw
    /// values of `extra`, the tokens that bias and penalties change (sorted). The chain's top k
    /// after them lies among those: a token outside both ranks below the n largest's k
    /// unchanged ones.
    pub fn needs(&self) -> Option<(usize, Vec<u32>)> {
        let p = &self.params;
        if p.temperature <= 0.0 || p.top_k == 0 {
            return None;
        }
        let mut extra: Vec<u32> = p.logit_bias.iter().map(|b| b.0).collect();
        if self.penalties_on() {
            extra.extend(self.recent.iter().copied());
        }
        extra.sort_unstable();
        extra.dedup();
        Some((p.top_k.saturating_add(extra.len()), extra))
    }

    /// [`Sampler::sample`] (or, with `draft`, [`Sampler::sample_draft`]) from what
    /// [`Sampler::needs`] asked for of a row of `vocab` logits: `top`, its largest raw values
    /// with their tokens (the largest first, ties to the lower token, no NaN; fewer when the row
    /// has fewer others), and `extra_values`, the raw values of the tokens it named. The same
    /// token, the same draws as from the whole row.
    pub fn sample_top(
        &mut self,
        top: &[(u32, f32)],
        extra: &[u32],
        extra_values: &[f32],
        vocab: usize,
        draft: Option<u32>,
    ) -> u32 {
        debug_assert_eq!(
            extra.len(),
            extra_values.len(),
            "sample_top: a value for each extra token"
        );
        let mut vals: HashMap<u32, f32> = top.iter().copied().collect();
        for (&t, &v) in extra.iter().zip(extra_values) {
            if (t as usize) < vocab {
                vals.insert(t, v);
            }
        }
        self.penalise(|t, f| {
            if let Some(l) = vals.get_mut(&t) {
                f(l)
            }
        });
        let mut cand: Vec<(u32, f32)> = vals.into_iter().filter(|(_, l)| !l.is_nan()).collect();
        cand.sort_unstable_by_key(|c| c.0);
        self.pick(cand, draft)
    }

    /// Choose the next token when `draft` was proposed for it (speculative decoding): greedy
    /// takes the largest logit as `sample` does; otherwise the draft is kept with its probability
    /// under the chain (bias, penalties, top-k, top-p, min-p, temperature) and, when it is not, a
    /// token is drawn from the chain's distribution without it — the draft came from a
    /// deterministic proposer, so the token has exactly the chain's distribution (rejection
    /// sampling; the random draws differ from `sample`'s).
    pub fn sample_draft(&mut self, logits: &mut [f32], draft: u32) -> u32 {
        self.apply_penalties(logits);
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        self.pick(candidates(logits), Some(draft))
    }

    /// A token from the chain's distribution over `cand` (every token's value after the
    /// penalties, NaN left out, in any order); with `draft`, by rejection sampling against it.
    /// The cuts and the draw are in integer masses (`masses`), as the GPU's `sample_rows`.
    fn pick(&mut self, cand: Vec<(u32, f32)>, draft: Option<u32>) -> u32 {
        let cuts = masses::Cuts::of(&self.params);
        let mut r = cuts.rank(cand);
        let keep = cuts.keep(&mut r);
        let t = cuts.temperature;
        let Some(draft) = draft else {
            // (One draw a token, also from a row of NaN: as the GPU's, whose point is drawn first.)
            let u = self.rng.next_f64();
            return masses::draw(&mut r, keep, t, u, None).unwrap_or(0);
        };
        if keep == 0 {
            return 0;
        }
        if let Some(v) = r.kept(draft, keep) {
            let m = r.max();
            let (wd, total) = (masses::mass(v, m, t), r.total(keep, |v| masses::mass(v, m, t)));
            if self.rng.next_f64() * (total as f64) < wd as f64 {
                return draft;
            }
            if wd >= total {
                // Nothing else can be drawn (the draft holds all the mass).
                return draft;
            }
        }
        let u = self.rng.next_f64();
        masses::draw(&mut r, keep, t, u, Some(draft)).unwrap_or(draft)
    }

    /// The chain's candidates in order and their masses at the temperature (as `pick` draws
    /// them).
    #[cfg(test)]
    fn distribution(&self, cand: Vec<(u32, f32)>) -> (Vec<(u32, f32)>, Vec<u64>) {
        let cuts = masses::Cuts::of(&self.params);
        let mut r = cuts.rank(cand);
        let keep = cuts.keep(&mut r);
        let kept: Vec<(u32, f32)> = (0..keep).map(|i| r.nth(i)).collect();
        let m = kept.first().map_or(0.0, |c| c.1);
        let w = kept.iter().map(|c| masses::mass(c.1, m, cuts.temperature)).collect();
        (kept, w)
    }
}

/// Every token's value but NaN's, in token order.
fn candidates(logits: &[f32]) -> Vec<(u32, f32)> {
    let mut cand = Vec::with_capacity(logits.len());
    cand.extend(
        logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, &l)| (i as u32, l)),
    );
    cand
}

/// The chain's order of (token, value) candidates: the larger value first (total order: -0 below
/// +0), ties to the lower token.
pub fn by_logit(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// A row's `n` largest values with their columns, the largest first, ties to the lower column, NaN
/// left out (fewer when the row has fewer others): what [`Sampler::needs`] asks of a row.
pub fn top_of(row: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut cand = candidates(row);
    if n < cand.len() {
        if n == 0 {
            return Vec::new();
        }
        cand.select_nth_unstable_by(n - 1, by_logit);
        cand.truncate(n);
    }
    cand.sort_by(by_logit);
    cand
}

/// Index of the largest logit (the first of equals, as llama.cpp's greedy sampler).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Log-softmax of a whole row, in f64 for accuracy (perplexity, logprobs).
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    logits.iter().map(|&l| (l as f64 - lse) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, -1.0, 2.5, 0.0]
    }

    #[test]
    fn greedy_picks_the_first_maximum() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&mut logits()), 1);
        assert_eq!(argmax(&[1.0, 5.0, 5.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let draw = |seed| {
            let mut s = Sampler::new(SamplingParams {
                temperature: 1.5,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed,
                ..Default::default()
            });
            (0..64).map(|_| s.sample(&mut logits())).collect::<Vec<_>>()
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
    }

    #[test]
    fn top_k_one_is_greedy_and_top_k_limits_choices() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 2.0,
            top_k: 1,
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&mut logits()), 1);
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 5.0,
            top_k: 2,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        });
        for _ in 0..200 {
            assert!([1, 4].contains(&s.sample(&mut logits())));
        }
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // probabilities of [10, 9, 0, ...]: the first two hold ~all the mass.
        let l = vec![10.0, 9.0, 0.0, 0.0, 0.0];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            ..Default::default()
        });
        for _ in 0..100 {
            assert_eq!(s.sample(&mut l.clone()), 0);
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.2,
            ..Default::default()
        });
        for _ in 0..300 {
            assert!(s.sample(&mut l.clone()) < 2);
        }
    }

    #[test]
    fn penalties_and_bias_follow_llama_cpp() {
        let mut s = Sampler::new(SamplingParams {
            repeat_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            logit_bias: vec![(5, 10.0)],
            ..SamplingParams::greedy()
        });
        s.accept(1);
        s.accept(1);
        s.accept(3);
        let mut l = logits();
        s.apply_penalties(&mut l);
        assert_eq!(l[1], 3.0 / 2.0 - 2.0 * 0.25 - 0.5);
        assert_eq!(l[3], -2.0 - 0.25 - 0.5);
        assert_eq!(l[5], 10.0);
        assert_eq!(l[2], 2.0);
    }

    /// Rejection sampling against a deterministic draft keeps the chain's distribution: 200,000
    /// draws with a draft of each kind (likely, unlikely, cut by top-k) against the chain's
    /// probabilities. Each frequency's standard deviation is sqrt(p(1-p)/n) ≤ 1.2e-3; the bound,
    /// 6e-3, is five of them.
    #[test]
    fn draft_sampling_keeps_the_distribution() {
        let l = vec![1.0, 3.0, 2.0, -1.0, 2.5, 0.0];
        let params = SamplingParams {
            temperature: 0.8,
            top_k: 5,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..Default::default()
        };
        let want = {
            let s = Sampler::new(params.clone());
            let (cand, w) = s.distribution(candidates(&l));
            let total: u64 = w.iter().sum();
            let mut p = vec![0f64; l.len()];
            for (c, w) in cand.iter().zip(&w) {
                p[c.0 as usize] = *w as f64 / total as f64;
            }
            p
        };
        for draft in [1u32, 0, 3] {
            let mut s = Sampler::new(params.clone());
            let n = 200_000;
            let mut count = vec![0usize; l.len()];
            for _ in 0..n {
                count[s.sample_draft(&mut l.clone(), draft) as usize] += 1;
            }
            for (i, (&c, &p)) in count.iter().zip(&want).enumerate() {
                let f = c as f64 / n as f64;
                assert!(
                    (f - p).abs() < 6e-3,
                    "draft {draft}: token {i} drawn {f:.4}, chain {p:.4}"
                );
            }
        }
        // Greedy: the largest logit whatever the draft.
        let mut g = Sampler::new(SamplingParams::greedy());
        assert_eq!(g.sample_draft(&mut l.clone(), 4), 1);
    }

    /// `sample_top` from what `needs` asks of each row gives `sample`'s token from the whole row,
    /// step after step (the same draws), with and without drafts: rows with NaN, ties and -inf,
    /// bias on tokens in and past the row (one twice), penalties on recent tokens.
    #[test]
    fn top_of_a_row_samples_as_the_whole_row() {
        let vocab = 300;
        let mut rng = Rng::new(11);
        for case in 0..60u64 {
            let params = SamplingParams {
                temperature: 0.3 + (case % 5) as f32 * 0.4,
                top_k: 1 + (case as usize * 7) % 60,
                top_p: if case % 3 == 0 { 1.0 } else { 0.9 },
                min_p: if case % 4 == 0 { 0.0 } else { 0.05 },
                repeat_penalty: [1.0, 1.3, 1.0, 0.7][case as usize % 4],
                penalty_last_n: 16,
                presence_penalty: if case % 5 == 1 { 0.4 } else { 0.0 },
                frequency_penalty: if case % 6 == 2 { -0.3 } else { 0.0 },
                logit_bias: match case % 6 {
                    1 | 4 => vec![(7, 5.0), (299, -2.0), (7, 1.0), (5000, 3.0)],
                    5 => vec![(9, f32::NEG_INFINITY), (12, f32::INFINITY)],
                    _ => Vec::new(),
                },
                seed: case,
            };
            let (mut whole, mut top) = (Sampler::new(params.clone()), Sampler::new(params));
            for t in [3u32, 3, 50, 7] {
                whole.accept(t);
                top.accept(t);
            }
            for step in 0..40 {
                let mut row: Vec<f32> = (0..vocab).map(|_| (rng.next_f64() * 8.0 - 4.0) as f32).collect();
                // Ties, a NaN, -inf and a value every step repeats.
                row[10] = row[11];
                row[(step * 13) % vocab] = f32::NAN;
                row[(step * 17 + 5) % vocab] = f32::NEG_INFINITY;
                row[(step * 7 + 2) % vocab] = 2.5;
                row[(step * 7 + 3) % vocab] = 2.5;
                let (n, extra) = top.needs().expect("a top-k cut, not greedy");
                let t = top_of(&row, n);
                let ev: Vec<f32> = extra
                    .iter()
                    .map(|&e| row.get(e as usize).copied().unwrap_or(0.0))
                    .collect();
                let draft = (step % 3 == 0).then_some(t[step % t.len()].0);
                let got = top.sample_top(&t, &extra, &ev, vocab, draft);
                let want = match draft {
                    Some(d) => whole.sample_draft(&mut row.clone(), d),
                    None => whole.sample(&mut row.clone()),
                };
                assert_eq!(got, want, "case {case} step {step}");
                whole.accept(want);
                top.accept(got);
            }
        }
        // A cut past any vocabulary: every token asked for, no overflow.
        let mut s = Sampler::new(SamplingParams {
            top_k: usize::MAX,
            logit_bias: vec![(3, 1.0)],
            ..Default::default()
        });
        assert_eq!(s.needs().map(|n| n.0), Some(usize::MAX));
        let row: Vec<f32> = (0..50).map(|i| (i % 7) as f32).collect();
        let mut w = Sampler::new(SamplingParams {
            top_k: usize::MAX,
            logit_bias: vec![(3, 1.0)],
            ..Default::default()
        });
        for _ in 0..20 {
            let want = w.sample(&mut row.clone());
            assert_eq!(s.sample_top(&top_of(&row, usize::MAX), &[3], &[row[3]], 50, None), want);
        }
        // Greedy and no top-k cut take the whole row.
        assert!(Sampler::new(SamplingParams::greedy()).needs().is_none());
        let all = SamplingParams {
            top_k: 0,
            ..Default::default()
        };
        assert!(Sampler::new(all).needs().is_none());
        assert_eq!(
            top_of(&[1.0, f32::NAN, 3.0, 3.0, -0.0, 0.0], 4),
            vec![(2, 3.0), (3, 3.0), (0, 1.0), (5, 0.0)]
        );
    }

    /// What `device_ask` hands a backend draws `sample`'s token (`masses::sample_row`, the
    /// GPU kernel's reference) step after step, penalties and bias included, rows of 300 and of
    /// 20,000 (ranked in bins); a row of NaN gives 0 and takes a draw either way.
    #[test]
    fn device_asks_draw_as_sample() {
        let mut rng = Rng::new(13);
        for case in 0..40u64 {
            let vocab = if case % 4 == 0 { 20_000 } else { 300 };
            let params = SamplingParams {
                temperature: 0.3 + (case % 5) as f32 * 0.4,
                top_k: [0, 1, 40, 5000][case as usize % 4],
                top_p: [1.0, 0.9, 0.5][case as usize % 3],
                min_p: if case % 2 == 0 { 0.0 } else { 0.05 },
                repeat_penalty: [1.0, 1.3, 1.0, 0.7][case as usize % 4],
                presence_penalty: if case % 5 == 1 { 0.4 } else { 0.0 },
                frequency_penalty: if case % 6 == 2 { -0.3 } else { 0.0 },
                logit_bias: match case % 3 {
                    1 => vec![(7, 5.0), (7, 1.0), (50_000, 3.0)],
                    2 => vec![(9, f32::NEG_INFINITY), (12, f32::INFINITY)],
                    _ => Vec::new(),
                },
                seed: case,
                ..Default::default()
            };
            let (mut whole, mut dev) = (Sampler::new(params.clone()), Sampler::new(params));
            for step in 0..30 {
                let mut row: Vec<f32> = (0..vocab).map(|_| (rng.next_f64() * 12.0 - 6.0) as f32).collect();
                row[10] = row[11];
                row[(step * 13) % vocab] = f32::NAN;
                row[(step * 7 + 2) % vocab] = 2.5;
                row[(step * 7 + 3) % vocab] = 2.5;
                let want = whole.sample(&mut row.clone());
                let ask = dev.device_ask(0).expect("not greedy");
                let got = masses::sample_row(&mut row, &ask);
                assert_eq!(got, want, "case {case} step {step}");
                whole.accept(want);
                dev.accept(got);
            }
        }
        let mut a = Sampler::new(SamplingParams::default());
        let mut b = Sampler::new(SamplingParams::default());
        let ask = a.device_ask(0).unwrap();
        assert_eq!(masses::sample_row(&mut [f32::NAN; 4], &ask), 0);
        assert_eq!(b.sample(&mut [f32::NAN; 4]), 0);
        assert_eq!(a.device_ask(0).unwrap().u, b.device_ask(0).unwrap().u);
        assert!(Sampler::new(SamplingParams::greedy()).device_ask(0).is_none());
    }

    #[test]
    fn validation_names_the_bad_field() {
        let e = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.contains("top_p"), "{e}");
        let e = SamplingParams {
            min_p: 2.0,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.contains("min_p"), "{e}");
    }
}
