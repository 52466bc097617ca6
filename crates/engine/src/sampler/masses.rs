//! The chain's cuts and draw in integer masses: one definition that the host and the GPU
//! (`kernels/sample.cu`, `sample_rows`) compute to the same bits, so a seed gives the same token
//! from the same logits on either.
//!
//! A candidate's mass at temperature `t` is `exp((v - m) / t)` in units of 2^-40 (`ONE` for the
//! largest value `m`), from a polynomial in IEEE single-precision operations that neither side
//! fuses (the kernel spells them `__fmul_rn` / `__fadd_rn`), truncated to an integer. Sums of
//! masses are then exact in any order: the top-p cut, the softmax's total and the draw depend on
//! the candidates' order (largest value first, ties to the lower token: `by_logit`) and not on the
//! order in which anything was added, so neither side sorts the whole row. A mass below 2^-40 of the
//! largest counts as 0 (at most 2.4e-7 of the total over 262,144 tokens).
//!
//! The host ranks candidates into 65,536 bins by the top half of their order key (`Ranked`) and
//! sorts only the bins a cut or the draw falls in.

use super::by_logit;

/// The largest candidate's mass.
pub const ONE: u64 = 1 << 40;
/// Below this (`(v - m) / t`) a mass is 0: exp(-30) < 2^-43.
const FLOOR: f32 = -30.0;
// Single-precision constants by their bits (the kernel spells the same bits).
const INV_LN2: u32 = 0x3FB8_AA3B; // 1 / ln 2
const LN2_HI: u32 = 0x3F31_7200; // ln 2's high part (exact products with small integers)
const LN2_LO: u32 = 0x35BF_BE8E; // ln 2 - LN2_HI
const C3: u32 = 0x3E2A_AAAB; // 1/6
const C4: u32 = 0x3D2A_AAAB; // 1/24
const C5: u32 = 0x3C08_8889; // 1/120
const C6: u32 = 0x3AB6_0B61; // 1/720

/// `exp(x)` for `x ≤ 0` in units of 2^-40, truncated (0 below `FLOOR`, for NaN and -inf).
pub fn exp_mass(x: f32) -> u64 {
    if x.is_nan() || x <= FLOOR {
        return 0;
    }
    let f = f32::from_bits;
    let k = (x * f(INV_LN2) + 0.5).floor();
    let r = (x - k * f(LN2_HI)) - k * f(LN2_LO);
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (f(C3) + r * (f(C4) + r * (f(C5) + r * f(C6))))));
    // 2^k, k in [-43, 0]: a normal number.
    let e = p * f(((127 + k as i32) as u32) << 23);
    (e * 1_099_511_627_776.0) as u64
}

/// A value's mass against the largest `m` at temperature `t` (`ONE` for `m` itself, also when it
/// is infinite).
pub fn mass(v: f32, m: f32, t: f32) -> u64 {
    if v == m {
        ONE
    } else {
        exp_mass((v - m) / t)
    }
}

/// The chain after bias and penalties: top-k (0: off), top-p (1: off), min-p (as `ln(min_p)`,
/// `None`: off), then the temperature (> 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cuts {
    pub top_k: usize,
    pub top_p: f32,
    pub min_p_ln: Option<f32>,
    pub temperature: f32,
}

impl Cuts {
    pub fn of(p: &super::SamplingParams) -> Cuts {
        Cuts {
            top_k: p.top_k,
            top_p: p.top_p,
            min_p_ln: (p.min_p > 0.0).then(|| p.min_p.ln()),
            temperature: p.temperature,
        }
    }

    /// The candidates ranked, the top-k cut first (a selection, before any order is needed).
    pub fn rank(&self, mut cand: Vec<(u32, f32)>) -> Ranked {
        if self.top_k > 0 && self.top_k < cand.len() {
            cand.select_nth_unstable_by(self.top_k - 1, by_logit);
            cand.truncate(self.top_k);
        }
        Ranked::new(cand)
    }

    /// How many of `r`'s candidates, in order, the cuts keep (at least 1 of a non-empty set).
    pub fn keep(&self, r: &mut Ranked) -> usize {
        let n = r.len();
        if n == 0 {
            return 0;
        }
        let m = r.max();
        let mut keep = if self.top_k > 0 { self.top_k.min(n) } else { n };
        if self.top_p < 1.0 {
            let total = r.total(keep, |v| mass(v, m, 1.0));
            let target = (self.top_p as f64 * total as f64).ceil() as u64;
            keep = r.reach(keep, |v| mass(v, m, 1.0), target, None).map_or(keep, |i| i + 1);
        }
        if let Some(ln) = self.min_p_ln {
            let threshold = m + ln;
            keep = keep.min(r.count_at_least(threshold));
        }
        keep.max(1)
    }
}

/// A change that bias or a penalty makes to a token's value: `Add` adds; `Penalty` divides a
/// positive value by (multiplies one ≤ 0 by) the repeat penalty, then subtracts the frequency and
/// presence penalties' sum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Change {
    pub token: u32,
    pub penalty: bool,
    pub a: f32,
    pub b: f32,
}

impl Change {
    pub fn add(token: u32, bias: f32) -> Change {
        Change {
            token,
            penalty: false,
            a: bias,
            b: 0.0,
        }
    }

    pub fn penalty(token: u32, repeat: f32, sub: f32) -> Change {
        Change {
            token,
            penalty: true,
            a: repeat,
            b: sub,
        }
    }

    pub fn apply(&self, v: f32) -> f32 {
        if !self.penalty {
            v + self.a
        } else if v <= 0.0 {
            v * self.a - self.b
        } else {
            v / self.a - self.b
        }
    }
}

/// A token to draw where a logits row is (`Sampler::device_ask`): the row's changes in order,
/// the cuts, and the draw's point in [0, 1).
#[derive(Clone, Debug, PartialEq)]
pub struct SampleAsk {
    pub row: usize,
    pub changes: Vec<Change>,
    pub cuts: Cuts,
    pub u: f64,
}

/// The token `ask` draws from `row` (its values: the changes are made to it): what the GPU's
/// `sample_rows` gives, and `Sampler::sample` with the same draw. 0 for a row of NaN.
pub fn sample_row(row: &mut [f32], ask: &SampleAsk) -> u32 {
    for c in &ask.changes {
        if let Some(v) = row.get_mut(c.token as usize) {
            *v = c.apply(*v);
        }
    }
    let cand = super::candidates(row);
    let mut r = ask.cuts.rank(cand);
    let keep = ask.cuts.keep(&mut r);
    draw(&mut r, keep, ask.cuts.temperature, ask.u, None).unwrap_or(0)
}

/// The draw's point in `total`: `floor(u · total)`, below `total`.
pub fn point(u: f64, total: u64) -> u64 {
    ((u * total as f64).floor() as u64).min(total.saturating_sub(1))
}

/// Candidates (token, value; no NaN) in the chain's order, ranked lazily: bins by the top 16
/// bits of the order key, largest first, each sorted when a cut or a draw needs its order.
pub struct Ranked {
    items: Vec<(u32, f32)>,
    /// Each bin's end in `items`, largest bin first, and whether it is sorted.
    bins: Vec<(usize, bool)>,
}

/// The order key: larger for a later value in `f32::total_cmp`.
pub fn key(v: f32) -> u32 {
    let b = v.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

impl Ranked {
    /// Up to this many candidates are sorted at once.
    const SORT_ALL: usize = 4096;

    pub fn new(mut items: Vec<(u32, f32)>) -> Ranked {
        let n = items.len();
        if n <= Self::SORT_ALL {
            items.sort_unstable_by(by_logit);
            return Ranked {
                bins: if n > 0 { vec![(n, true)] } else { Vec::new() },
                items,
            };
        }
        let mut count = vec![0u32; 1 << 16];
        for c in &items {
            count[(key(c.1) >> 16) as usize] += 1;
        }
        // Bin b's start, the largest bin first.
        let mut start = vec![0u32; 1 << 16];
        let mut bins = Vec::new();
        let mut at = 0usize;
        for b in (0..1 << 16).rev() {
            start[b] = at as u32;
            if count[b] > 0 {
                at += count[b] as usize;
                bins.push((at, false));
            }
        }
        let mut out = vec![(0u32, 0f32); n];
        for c in items {
            let b = (key(c.1) >> 16) as usize;
            out[start[b] as usize] = c;
            start[b] += 1;
        }
        Ranked { items: out, bins }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Bin `i`'s candidates, sorted.
    fn sorted(&mut self, i: usize) -> &[(u32, f32)] {
        let lo = if i == 0 { 0 } else { self.bins[i - 1].0 };
        let (hi, done) = self.bins[i];
        if !done {
            self.items[lo..hi].sort_unstable_by(by_logit);
            self.bins[i].1 = true;
        }
        &self.items[lo..hi]
    }

    /// The largest value (the first candidate).
    pub fn max(&mut self) -> f32 {
        self.sorted(0)[0].1
    }

    /// The `i`-th candidate in order.
    pub fn nth(&mut self, i: usize) -> (u32, f32) {
        let b = self.bins.partition_point(|&(end, _)| end <= i);
        let lo = if b == 0 { 0 } else { self.bins[b - 1].0 };
        self.sorted(b)[i - lo]
    }

    /// The sum of `w` over the first `len` candidates.
    pub fn total(&mut self, len: usize, w: impl Fn(f32) -> u64) -> u64 {
        let mut sum = 0u64;
        let mut lo = 0;
        for i in 0..self.bins.len() {
            let hi = self.bins[i].0;
            if hi <= len {
                sum += self.items[lo..hi].iter().map(|c| w(c.1)).sum::<u64>();
            } else {
                if lo < len {
                    sum += self.sorted(i)[..len - lo].iter().map(|c| w(c.1)).sum::<u64>();
                }
                break;
            }
            lo = hi;
        }
        sum
    }

    /// The first position below `len` where the sum of `w` over the candidates up to it reaches
    /// `target` (`None` when the first `len` do not), `skip`'s mass counted as 0.
    pub fn reach(&mut self, len: usize, w: impl Fn(f32) -> u64, target: u64, skip: Option<u32>) -> Option<usize> {
        let w = |c: &(u32, f32)| if Some(c.0) == skip { 0 } else { w(c.1) };
        let mut sum = 0u64;
        let mut lo = 0;
        for i in 0..self.bins.len() {
            if lo >= len {
                break;
            }
            let hi = self.bins[i].0;
            if hi <= len {
                let bin: u64 = self.items[lo..hi].iter().map(w).sum();
                if sum + bin < target {
                    sum += bin;
                    lo = hi;
                    continue;
                }
            }
            for (j, c) in self.sorted(i)[..hi.min(len) - lo].iter().enumerate() {
                sum += w(c);
                if sum >= target {
                    return Some(lo + j);
                }
            }
            lo = hi;
        }
        None
    }

    /// `tok`'s value when it is one of the first `keep` candidates.
    pub fn kept(&mut self, tok: u32, keep: usize) -> Option<f32> {
        let c = *self.items.iter().find(|c| c.0 == tok)?;
        let last = self.nth(keep.checked_sub(1)?);
        (by_logit(&c, &last) != std::cmp::Ordering::Greater).then_some(c.1)
    }

    /// How many candidates are `>= threshold` (a prefix of the order).
    pub fn count_at_least(&self, threshold: f32) -> usize {
        self.items.iter().filter(|c| c.1 >= threshold).count()
    }
}

/// The token drawn at `u` ∈ [0, 1) from the first `keep` candidates at temperature `t`: the first
/// whose running mass passes `point(u, total)`, `skip`'s mass counted as 0 (`None` when nothing
/// else has mass).
pub fn draw(r: &mut Ranked, keep: usize, t: f32, u: f64, skip: Option<u32>) -> Option<u32> {
    if keep == 0 {
        return None;
    }
    let m = r.max();
    let w = |v| mass(v, m, t);
    let skipped = skip.and_then(|s| r.kept(s, keep)).map_or(0, w);
    let total = r.total(keep, w) - skipped;
    if total == 0 {
        return None;
    }
    let at = r.reach(keep, w, point(u, total) + 1, skip)?;
    Some(r.nth(at).0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masses_follow_exp() {
        assert_eq!(exp_mass(0.0), ONE);
        assert_eq!(exp_mass(f32::NAN), 0);
        assert_eq!(exp_mass(f32::NEG_INFINITY), 0);
        assert_eq!(exp_mass(-30.5), 0);
        // Within 5e-7 of exp: a degree-6 polynomial on |r| ≤ ln 2 / 2 (1.2e-7) evaluated in
        // single precision (each of its dozen roundings ≤ 6e-8 of its value).
        for i in 0..3000 {
            let x = -(i as f32) * 0.01;
            let want = (x as f64).exp() * ONE as f64;
            let got = exp_mass(x) as f64;
            assert!((got - want).abs() <= 5e-7 * want + 1.0, "x {x}: {got} vs {want}");
        }
        assert_eq!(mass(f32::INFINITY, f32::INFINITY, 0.5), ONE);
        assert_eq!(mass(3.0, f32::INFINITY, 1.0), 0);
        assert_eq!(mass(-0.0, 0.0, 1.0), ONE);
    }

    /// Ranked in bins gives every position, total and reach of a plain sort.
    #[test]
    fn ranked_bins_agree_with_a_sort() {
        let mut rng = super::super::Rng::new(3);
        for n in [1usize, 7, 4096, 4097, 20_000] {
            let items: Vec<(u32, f32)> = (0..n as u32)
                .map(|t| {
                    let v = (rng.next_f64() * 40.0 - 20.0) as f32;
                    // Ties, zeros of both signs, infinities.
                    let v = match t % 97 {
                        0 => 1.5,
                        1 => -0.0,
                        2 => 0.0,
                        3 if t % 2 == 0 => f32::NEG_INFINITY,
                        _ => v,
                    };
                    (t, v)
                })
                .collect();
            let mut all = items.clone();
            all.sort_by(by_logit);
            let mut r = Ranked::new(items);
            for i in (0..n).step_by(1 + n / 50) {
                assert_eq!(r.nth(i), all[i], "n {n} position {i}");
            }
            let m = all[0].1;
            let w = |v| mass(v, m, 0.7);
            for len in [1, n / 3, n] {
                let want: u64 = all[..len].iter().map(|c| w(c.1)).sum();
                assert_eq!(r.total(len, w), want);
                for target in [1, want / 2, want] {
                    let mut sum = 0;
                    let at = all[..len].iter().position(|c| {
                        sum += w(c.1);
                        sum >= target
                    });
                    assert_eq!(r.reach(len, w, target, None), at, "n {n} len {len} target {target}");
                }
            }
        }
    }

    /// The chain in masses keeps what the chain in f64 probabilities keeps (but where the top-p
    /// sum lands within 1e-6 of p) with probabilities within 1e-6 of f64's: the masses' error is
    /// 5e-7 of each value plus their 2^-40 steps.
    #[test]
    fn masses_match_the_chain_in_f64() {
        let mut rng = super::super::Rng::new(5);
        let mut near = 0;
        for case in 0..200usize {
            let n = if case % 4 == 0 { 20_000 } else { 300 };
            let spread = [2.0, 8.0, 30.0][case % 3];
            let row: Vec<(u32, f32)> = (0..n as u32).map(|t| (t, (rng.next_f64() * spread) as f32)).collect();
            let cuts = Cuts {
                top_k: [0, 1, 40, 5000][case % 4],
                top_p: [1.0, 0.9, 0.5][case % 3],
                min_p_ln: [None, Some(0.05f32.ln())][case % 2],
                temperature: [0.3, 1.0, 1.7][case % 3],
            };
            let mut all = row.clone();
            all.sort_by(by_logit);
            let m = all[0].1 as f64;
            let mut keep = if cuts.top_k > 0 { cuts.top_k.min(n) } else { n };
            let e: Vec<f64> = all.iter().map(|c| (c.1 as f64 - m).exp()).collect();
            let z: f64 = e[..keep].iter().sum();
            let mut cum = 0.0;
            let mut close = false;
            if cuts.top_p < 1.0 {
                for (i, x) in e[..keep].iter().enumerate() {
                    cum += x / z;
                    close |= (cum - cuts.top_p as f64).abs() < 1e-6;
                    if cum >= cuts.top_p as f64 {
                        keep = i + 1;
                        break;
                    }
                }
            }
            if let Some(ln) = cuts.min_p_ln {
                keep = keep.min(all.iter().take_while(|c| c.1 >= all[0].1 + ln).count());
            }
            let mut r = Ranked::new(row);
            let got = cuts.keep(&mut r);
            if close {
                near += 1;
                continue;
            }
            assert_eq!(got, keep.max(1), "case {case}");
            let t = cuts.temperature as f64;
            let p: Vec<f64> = all[..got].iter().map(|c| ((c.1 as f64 - m) / t).exp()).collect();
            let zp: f64 = p.iter().sum();
            let w: Vec<u64> = all[..got]
                .iter()
                .map(|c| mass(c.1, all[0].1, cuts.temperature))
                .collect();
            let zw: u64 = w.iter().sum();
            for (a, b) in p.iter().zip(&w) {
                assert!((a / zp - *b as f64 / zw as f64).abs() < 1e-6, "case {case}");
            }
        }
        assert!(near < 5, "{near} cases at a top-p boundary");
    }
}
