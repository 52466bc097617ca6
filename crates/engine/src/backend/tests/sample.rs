//! The op test body of what a sampler reads of the logits (see `tests`).

use super::*;

/// `top_of_rows` gives what `sampler::top_of` finds in each row read whole, and the values at the
/// asked columns: rows of 50,000 values (a vocabulary's width) with NaN, ±inf, -0 and +0, runs of
/// equal values around the cut, a row of few non-NaN values, and asks of 1 to 300 values, one
/// of none, with columns in and past the row. Exact (the same values, the same order). (A backend
/// that keeps the default, the CPU, answers with the rows read whole: only the counts at the end
/// say anything there.)
pub fn top_rows<B: Backend>(b: &B) {
    use crate::backend::{top_of_rows_on_host, Top, TopAsk};
    let (rows, n) = (4, 50_000);
    let mut v = values(rows * n, 31);
    for (i, x) in v.iter_mut().enumerate() {
        // Coarse values: many ties, some exactly at each ask's cut.
        *x = (*x * 64.0).round() / 8.0;
        match i % 997 {
            0 => *x = f32::NAN,
            1 => *x = f32::INFINITY,
            2 => *x = f32::NEG_INFINITY,
            3 => *x = -0.0,
            4 => *x = 0.0,
            _ => {}
        }
    }
    // Row 3: NaN but for 20 values.
    for (c, x) in v[3 * n..].iter_mut().enumerate() {
        if c % 2500 != 7 {
            *x = f32::NAN;
        }
    }
    let x = buf(b, rows, n, &v);
    let asks: Vec<TopAsk> = [(0usize, 1usize), (0, 40), (1, 300), (2, 57), (3, 64), (1, 0), (2, 1000)]
        .iter()
        .enumerate()
        .map(|(i, &(row, k))| TopAsk {
            row,
            n: k,
            at: [5u32, 7, 49_999, 50_000, u32::MAX, 3 + 997 * i as u32].to_vec(),
        })
        .collect();
    let got = b.top_of_rows(&x, &asks);
    let want = top_of_rows_on_host(b, &x, &asks);
    assert_eq!(got.len(), asks.len());
    for ((g, w), a) in got.iter().zip(&want).zip(&asks) {
        let bits = |t: &Top| -> (Vec<(u32, u32)>, Vec<u32>, usize) {
            (
                t.top.iter().map(|&(c, v)| (c, v.to_bits())).collect(),
                t.at.iter().map(|v| v.to_bits()).collect(),
                t.cols,
            )
        };
        assert_eq!(bits(g), bits(w), "top_of_rows {a:?}");
    }
    // The ask of 64 from row 3 finds its 20 values; of 0, none.
    assert_eq!((want[4].top.len(), want[5].top.len()), (20, 0));
}

/// `sample_rows` draws what `Sampler::sample` draws from each row read whole, with the same
/// point (`Sampler::device_ask`): rows of 128,256 values (Llama 3's vocabulary) with NaN, ±inf,
/// -0 and +0 and runs of equal values, under the OpenAI defaults (no cut), top-p, min-p, top-k,
/// llama.cpp's defaults, bias (a token changed twice, -inf, +inf, one past the row) and
/// penalties, a low and a high temperature, a row of NaN but for 20 values and a row of NaN.
/// Exact: the same integer masses and single-precision operations on both sides. Several steps
/// of each set, with the tokens fed back to the penalties. (A backend that keeps the default,
/// the CPU, answers from the rows read whole.)
pub fn sample_rows<B: Backend>(b: &B) {
    use crate::sampler::{Sampler, SamplingParams};
    let (rows, n) = (6, 128_256);
    let mut v = values(rows * n, 41);
    for (i, x) in v.iter_mut().enumerate() {
        // Logit-like: coarse (ties) and spread over ~24 units.
        *x = (*x * 96.0).round() / 8.0;
        match i % 1009 {
            0 => *x = f32::NAN,
            1 => *x = f32::NEG_INFINITY,
            2 => *x = -0.0,
            3 => *x = 0.0,
            4 => *x = 12.0,
            _ => {}
        }
    }
    for (c, x) in v[4 * n..5 * n].iter_mut().enumerate() {
        if c % 6000 != 11 {
            *x = f32::NAN;
        }
    }
    v[5 * n..].fill(f32::NAN);
    let sets = [
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.7,
            top_k: 0,
            top_p: 0.9,
            min_p: 0.0,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.3,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.02,
            ..Default::default()
        },
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.2,
            top_k: 2000,
            top_p: 0.99,
            min_p: 0.0,
            repeat_penalty: 1.3,
            presence_penalty: 0.5,
            frequency_penalty: 0.1,
            logit_bias: vec![(7, 5.0), (7, 1.5), (9, f32::NEG_INFINITY), (200_000, 3.0)],
            ..Default::default()
        },
        SamplingParams {
            temperature: 2.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            logit_bias: vec![(12, f32::INFINITY)],
            ..Default::default()
        },
    ];
    for (i, p) in sets.iter().enumerate() {
        let mut host = Sampler::new(SamplingParams {
            seed: i as u64,
            ..p.clone()
        });
        let mut dev = Sampler::new(SamplingParams {
            seed: i as u64,
            ..p.clone()
        });
        for t in [3u32, 3, 17, 12] {
            host.accept(t);
            dev.accept(t);
        }
        for step in 0..3 {
            // (A fresh buffer each step: the asks change the rows where they are.)
            let x = buf(b, rows, n, &v);
            let asks: Vec<_> = (0..rows).map(|r| dev.device_ask(r).expect("not greedy")).collect();
            let got = b.sample_rows(&x, &asks);
            assert_eq!(got.len(), rows);
            for (r, &g) in got.iter().enumerate() {
                let mut row = v[r * n..(r + 1) * n].to_vec();
                let want = host.sample(&mut row);
                assert_eq!(g, want, "set {i} step {step} row {r}");
            }
            host.accept(got[0]);
            dev.accept(got[0]);
        }
    }
}
