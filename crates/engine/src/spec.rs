//! Speculative decoding: tokens proposed cheaply (here by n-gram lookup in the sequence's own
//! tokens, llama.cpp's and vLLM's "prompt lookup") are checked by one forward step of the target
//! model over `[last, d1 .. dk]` whose rows are each computed as a one-row decode step would
//! compute them (`Logits::Each`): row i's token is chosen exactly as decoding would choose it, and
//! while it equals the draft `d(i+1)` the next row counts too. Greedy output is therefore the same
//! bytes as decoding without drafts; with sampling, a draft is kept with its probability under the
//! sampler's chain and otherwise a token is drawn from the chain without it
//! (`Sampler::sample_draft`), which keeps the chain's distribution.
//!
//! Drafts come from n-gram lookup ([`NgramDrafter`]) or from the model's own
//! multi-token-prediction head ([`MtpDrafter`], Qwen 3.5 / 3.6): the MTP layer pairs each checked
//! position's last hidden state with the token chosen after it, and its guess for the token after
//! that is the next draft; further drafts chain its own hidden state (vLLM's MTP proposer,
//! llama.cpp `common/speculative.cpp` `draft-mtp`).

use crate::backend::Backend;
use crate::generate::{Decoding, Step};
use crate::model::{HiddenRows, Logits, Model, Scratch, SeqStep};
use crate::tokenizer::Tokenizer;
use crate::Result;

/// How a generation proposes tokens ahead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpecMode {
    /// One token per step.
    #[default]
    Off,
    /// n-gram lookup in the prompt and the tokens generated so far.
    Ngram,
    /// The model's multi-token-prediction layer (models that carry one).
    Mtp,
    /// What the backend does best by measurement (`Backend::spec_by_default`): n-gram lookup on
    /// the CPU and on CUDA (measured on both; `spec_by_default`).
    Auto,
}

impl SpecMode {
    pub fn parse(s: &str) -> Option<SpecMode> {
        match s.to_ascii_lowercase().as_str() {
            "off" | "none" => Some(SpecMode::Off),
            "ngram" => Some(SpecMode::Ngram),
            "mtp" => Some(SpecMode::Mtp),
            "auto" => Some(SpecMode::Auto),
            _ => None,
        }
    }

    /// `Auto` made definite for a backend.
    pub fn on<B: crate::backend::Backend>(self, b: &B) -> SpecMode {
        match self {
            SpecMode::Auto if b.spec_by_default() => SpecMode::Ngram,
            SpecMode::Auto => SpecMode::Off,
            m => m,
        }
    }
}

/// The most tokens one check proposes (the check is a step of `1 + k` rows).
pub const MAX_DRAFT: usize = 16;
/// Lengths of the n-grams looked up, longest first.
const NGRAM_MAX: usize = 4;
const NGRAM_MIN: usize = 2;
/// Steps without proposals after a check that kept none of its drafts, doubling while checks keep
/// failing (a failed check costs a step of `1 + k` rows for one token).
const COOL_MAX: usize = 32;

/// n-gram lookup with a draft length that follows how many drafts were kept.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    k_max: usize,
    /// Tokens to propose next time.
    k: usize,
    /// Steps left before proposing again, and the pause after the next failed check.
    wait: usize,
    cool: usize,
    pub stats: SpecStats,
}

/// What speculation did over a generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Checking steps and the drafts they checked.
    pub checks: usize,
    pub drafted: usize,
    /// Drafts that were the model's own next tokens.
    pub accepted: usize,
}

impl SpecStats {
    /// Accepted over drafted (0 with no drafts).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
    /// Tokens gained per checking step (accepted drafts plus the check's own token).
    pub fn tokens_per_check(&self) -> f64 {
        if self.checks == 0 {
            0.0
        } else {
            (self.accepted + self.checks) as f64 / self.checks as f64
        }
    }
    pub fn add(&mut self, o: &SpecStats) {
        self.checks += o.checks;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
    }
}

impl NgramDrafter {
    /// At most `k_max` drafts per check (capped at [`MAX_DRAFT`]).
    pub fn new(k_max: usize) -> NgramDrafter {
        let k_max = k_max.clamp(1, MAX_DRAFT);
        NgramDrafter {
            k_max,
            k: k_max,
            wait: 0,
            cool: 1,
            stats: SpecStats::default(),
        }
    }

    /// Up to `limit` tokens that followed the latest earlier occurrence of `history`'s last n
    /// tokens (n from 4 down to 2), or none (also while pausing after failed checks).
    pub fn propose(&mut self, history: &[u32], limit: usize) -> Vec<u32> {
        if self.wait > 0 {
            self.wait -= 1;
            return Vec::new();
        }
        let k = self.k.min(limit);
        if k == 0 {
            return Vec::new();
        }
        lookup(history, k)
    }

    /// A check of `drafted` tokens kept `accepted` of them: the next draft length follows (all
    /// kept: twice as many, up to the maximum; else one more than were kept, or half as many as
    /// before if that is more), and a check that kept none pauses the proposals.
    pub fn feedback(&mut self, drafted: usize, accepted: usize) {
        self.stats.checks += 1;
        self.stats.drafted += drafted;
        self.stats.accepted += accepted;
        if accepted == drafted {
            self.k = (self.k * 2).min(self.k_max);
            self.cool = 1;
        } else {
            self.k = (accepted + 1).max(self.k / 2).clamp(1, self.k_max);
        }
        if accepted == 0 {
            self.wait = self.cool;
            self.cool = (self.cool * 2).min(COOL_MAX);
        }
    }
}

/// Where a sequence's drafts come from.
#[derive(Clone, Debug)]
pub enum Drafter {
    Ngram(NgramDrafter),
    Mtp(MtpDrafter),
}

impl Drafter {
    /// The drafter of `mode` (made definite with [`SpecMode::on`]), none for `Off`.
    pub fn of(mode: SpecMode, draft_max: usize) -> Option<Drafter> {
        match mode {
            SpecMode::Ngram => Some(Drafter::Ngram(NgramDrafter::new(draft_max))),
            SpecMode::Mtp => Some(Drafter::Mtp(MtpDrafter::new(draft_max))),
            SpecMode::Off | SpecMode::Auto => None,
        }
    }

    pub fn stats(&self) -> SpecStats {
        match self {
            Drafter::Ngram(d) => d.stats,
            Drafter::Mtp(d) => d.stats,
        }
    }

    pub fn feedback(&mut self, drafted: usize, accepted: usize) {
        match self {
            Drafter::Ngram(d) => d.feedback(drafted, accepted),
            Drafter::Mtp(d) => d.feedback(drafted, accepted),
        }
    }
}

/// Drafts from the model's MTP head. The MTP layer keeps K/V for every position of the sequence:
/// after each step of the target model the rows whose following token is known are paired with it
/// ([`MtpDrafter::target_step`]) and run through the MTP layer at the next proposal, whose last row
/// gives the first draft; each further draft is one MTP step on the previous one's hidden state.
#[derive(Clone, Debug)]
pub struct MtpDrafter {
    k_max: usize,
    k: usize,
    /// Proposals left to skip after checks that kept nothing, and the next pause's length (as
    /// [`NgramDrafter`]'s); a skipped proposal still runs the pending rows through the MTP layer.
    wait: usize,
    cool: usize,
    pending: Option<Pending>,
    pub stats: SpecStats,
}

/// Rows of the last target step the MTP layer has not seen: `row0 ..` at positions `pos0 ..`,
/// with the tokens that followed each of them but the last (whose follower is the next token).
#[derive(Clone, Debug)]
struct Pending {
    row0: usize,
    pos0: usize,
    next: Vec<u32>,
}

impl MtpDrafter {
    /// At most `k_max` drafts per check (capped at [`MAX_DRAFT`]).
    pub fn new(k_max: usize) -> MtpDrafter {
        let k_max = k_max.clamp(1, MAX_DRAFT);
        MtpDrafter {
            k_max,
            k: k_max,
            wait: 0,
            cool: 1,
            pending: None,
            stats: SpecStats::default(),
        }
    }

    /// The target model's step just made rows `row0 ..` (positions `pos0 ..`) of its scratch;
    /// `next` are the tokens after all of them but the last.
    pub fn target_step(&mut self, row0: usize, pos0: usize, next: Vec<u32>) {
        self.pending = Some(Pending { row0, pos0, next });
    }

    /// How many drafts the next proposal makes (at most `limit`): none while pausing after checks
    /// that kept nothing.
    fn next_k(&mut self, limit: usize) -> usize {
        if self.wait > 0 {
            self.wait -= 1;
            return 0;
        }
        self.k.min(limit)
    }

    /// Pair the pending rows with their tokens (`tok` after the last) in the MTP layer, then
    /// up to `limit` drafts (fewer as checks keep fewer, none while pausing after checks that kept
    /// nothing). Nothing pending, nothing proposed: the MTP layer's cache would miss a position.
    pub fn propose<B: Backend>(
        &mut self,
        m: &dyn Model<B>,
        scratch: &mut Scratch,
        kv: &mut B::Kv,
        tok: u32,
        limit: usize,
    ) -> Result<Vec<u32>> {
        let Some(p) = self.pending.take() else {
            return Ok(Vec::new());
        };
        let mut toks = p.next;
        toks.push(tok);
        let rows: Vec<usize> = (p.row0..p.row0 + toks.len()).collect();
        let k = self.next_k(limit);
        let logits = if k == 0 { Logits::None } else { Logits::Last };
        let mut step = |tokens: &[u32], pos0: usize, hidden: HiddenRows<'_>, logits: Logits| {
            m.forward_mtp_argmax(
                scratch,
                &mut [SeqStep {
                    kv: &mut *kv,
                    tokens,
                    pos0,
                    logits,
                }],
                hidden,
            )
        };
        let first = step(&toks, p.pos0, HiddenRows::Target(&rows), logits)?;
        let mut drafts: Vec<u32> = first.into_iter().take(k).collect();
        let mut last = toks.len() - 1;
        let mut pos = p.pos0 + toks.len();
        while drafts.len() < k {
            let d = drafts[drafts.len() - 1];
            let out = step(&[d], pos, HiddenRows::Mtp(&[last]), Logits::Last)?;
            drafts.push(out.first().copied().unwrap_or(0));
            last = 0;
            pos += 1;
        }
        Ok(drafts)
    }

    /// A check of `drafted` tokens kept `accepted` of them: the next draft length follows as for
    /// n-gram drafts, and a check that kept none pauses the drafts as theirs do (the rows still
    /// reach the MTP layer: a paused proposal runs them without drafting). An MTP head that does not
    /// match its model (0 % kept) then costs one MTP row a step, not a check of drafts.
    pub fn feedback(&mut self, drafted: usize, accepted: usize) {
        self.stats.checks += 1;
        self.stats.drafted += drafted;
        self.stats.accepted += accepted;
        if accepted == drafted {
            self.k = (self.k * 2).min(self.k_max);
            self.cool = 1;
        } else {
            self.k = (accepted + 1).max(self.k / 2).clamp(1, self.k_max);
        }
        if accepted == 0 {
            self.wait = self.cool;
            self.cool = (self.cool * 2).min(COOL_MAX);
        }
    }
}

/// The `k` tokens after the latest earlier occurrence of the last n tokens of `h`.
fn lookup(h: &[u32], k: usize) -> Vec<u32> {
    let len = h.len();
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if len <= n {
            continue;
        }
        let pat = &h[len - n..];
        // Latest start i < len - n with h[i .. i + n] == pat and something after it.
        for i in (0..len - n).rev() {
            if &h[i..i + n] == pat {
                let from = i + n;
                let to = (from + k).min(len);
                if from < to {
                    return h[from..to].to_vec();
                }
            }
        }
    }
    Vec::new()
}

/// The rows of a check (a step that fed `[last] + drafts` with `Logits::Each`) gone through in
/// order as decoding would: row i's token is chosen with `drafts[i]` as its draft; while it
/// equals that draft the next row is taken. `argmax` are the backend's argmax of the rows (used
/// when `d.greedy_only()`), `row(i)` reads row i's logits otherwise.
pub struct Checked {
    /// Each taken row's step, in order; the last one's token is the next to feed (none when
    /// the sequence ended).
    pub steps: Vec<Step>,
}

impl Checked {
    /// Rows taken: the fed tokens whose K/V (and recurrent state) stay.
    pub fn rows(&self) -> usize {
        self.steps.len()
    }
}

pub fn check(
    d: &mut Decoding,
    tok: &Tokenizer,
    drafts: &[u32],
    argmax: &[u32],
    mut row: impl FnMut(usize) -> Result<Vec<f32>>,
) -> Result<Checked> {
    let mut steps = Vec::with_capacity(drafts.len() + 1);
    for i in 0..=drafts.len() {
        let draft = drafts.get(i).copied();
        let st = if d.greedy_only() {
            d.step_token(tok, argmax.get(i).copied().unwrap_or(0))
        } else {
            let mut l = row(i)?;
            d.step_draft(tok, &mut l, draft)
        };
        let go_on = st.finish.is_none() && draft.is_some() && st.token == draft;
        steps.push(st);
        if !go_on {
            break;
        }
    }
    Ok(Checked { steps })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_latest_longest_match() {
        // ... 5 6 7 8 | 9 ... 5 6 7 8 | 1 2 ... 6 7 8 -> after the latest "6 7 8": 1 2
        let h = [5, 6, 7, 8, 9, 3, 5, 6, 7, 8, 1, 2, 4, 6, 7, 8];
        assert_eq!(lookup(&h, 2), vec![1, 2]);
        // Only a 2-gram matches: "4 6" appears once, "6 7" ... the latest "7 8" is followed by 1.
        assert_eq!(lookup(&[1, 7, 8, 3, 9, 7, 8], 3), vec![3, 9, 7]);
        assert!(lookup(&[1, 2, 3], 4).is_empty());
        // Proposals stop at the history's end.
        assert_eq!(lookup(&[1, 2, 1, 2], 5), vec![1, 2]);
    }

    #[test]
    fn drafts_grow_when_kept_and_pause_when_refused() {
        let mut d = NgramDrafter::new(8);
        let h = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2];
        assert_eq!(d.propose(&h, 100).len(), 8.min(h.len() - 2));
        d.feedback(8, 1);
        assert_eq!(d.k, 4);
        d.feedback(4, 4);
        assert_eq!(d.k, 8);
        d.feedback(8, 0);
        assert_eq!(d.k, 4);
        // Paused one step, then proposes again; a second failure pauses two.
        assert!(d.propose(&h, 100).is_empty());
        assert_eq!(d.propose(&h, 100).len(), 4);
        d.feedback(4, 0);
        assert!(d.propose(&h, 100).is_empty());
        assert!(d.propose(&h, 100).is_empty());
        assert!(!d.propose(&h, 100).is_empty());
        assert_eq!(d.stats.checks, 4);
        assert_eq!(d.stats.accepted, 5);
    }

    #[test]
    fn mtp_drafts_pause_when_refused() {
        let mut d = MtpDrafter::new(4);
        assert_eq!(d.next_k(100), 4);
        assert_eq!(d.next_k(2), 2);
        d.feedback(4, 0);
        // Paused one proposal, then a second failure pauses two; a full success ends the doubling.
        assert_eq!(d.next_k(100), 0);
        assert_eq!(d.next_k(100), 2);
        d.feedback(2, 0);
        assert_eq!(d.next_k(100), 0);
        assert_eq!(d.next_k(100), 0);
        assert_eq!(d.next_k(100), 1);
        d.feedback(1, 1);
        assert_eq!(d.next_k(100), 2);
        d.feedback(2, 0);
        assert_eq!(d.next_k(100), 0);
        assert_eq!(d.next_k(100), 1);
        assert_eq!(d.stats.checks, 4);
        assert_eq!(d.stats.accepted, 1);
    }
}
