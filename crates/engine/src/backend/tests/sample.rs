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
