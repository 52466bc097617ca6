//! Criterion bench of the matmul kernels as the CPU backend drives them in prompt processing: a
//! tile of 16 weight rows × 576 values against 64 quantized activation rows, several rows and four
//! columns per call, single-threaded; Q4_K also repacked eight rows at a time (`packed`). Reports
//! weight·activation products per second; compare with the roofline in bench/engine/README.md.
//!
//!     cargo bench -p quant --bench dot -- q8_0

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use quant::dot::packed::PACK_ROWS;
use quant::dot::{self, KernelPath, MAX_COLS, MAX_ROWS};
use quant::GgmlType;

const ROWS: usize = 16;
const COLS: usize = 64;

fn data(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545F4914F6CDD1D) >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
        })
        .collect()
}

fn kernels(c: &mut Criterion) {
    use GgmlType as T;
    for (ty, n) in [
        (T::Q8_0, 576),
        (T::Q4_0, 576),
        (T::Q4_1, 576),
        (T::Q5_0, 576),
        (T::Q4_K, 1536),
        (T::Q6_K, 1536),
    ] {
        let k = dot::kernel(ty, KernelPath::detect()).unwrap();
        let w = quant::quantize(ty, &data(ROWS * n, 7), n, None).unwrap();
        let rb = w.len() / ROWS;
        let ab = dot::act_row_bytes(k.act, n);
        let x = data(COLS * n, 11);
        let mut acts = vec![0u8; COLS * ab];
        for (d, s) in acts.chunks_mut(ab).zip(x.chunks(n)) {
            dot::quantize_act(k.act, s, d);
        }
        let mut g = c.benchmark_group(ty.name());
        g.throughput(Throughput::Elements((ROWS * COLS * n) as u64));
        // The tile through the several-row kernels `rows` (and `dot` for leftover rows), weight
        // rows of `rb` bytes in `w`.
        let tile = |w: &[u8], rb: usize, dot: dot::DotFn, rows: Option<dot::DotRowsFn>| {
            let mut sink = 0f32;
            for c0 in (0..COLS).step_by(MAX_COLS) {
                let cols: Vec<&[u8]> = (c0..c0 + MAX_COLS).map(|j| &acts[j * ab..(j + 1) * ab]).collect();
                let mut r = 0;
                if let Some(rows) = rows {
                    let g = k.max_rows.min(MAX_ROWS);
                    let mut out = [[0f32; MAX_COLS]; MAX_ROWS];
                    while r + g <= ROWS {
                        let ws: Vec<&[u8]> = (r..r + g).map(|i| &w[i * rb..(i + 1) * rb]).collect();
                        rows(ty, n, &ws, &cols, &mut out[..g]);
                        sink += out[0][0];
                        r += g;
                    }
                }
                let mut out = [0f32; MAX_COLS];
                for r in r..ROWS {
                    dot(ty, n, &w[r * rb..(r + 1) * rb], &cols, &mut out);
                    sink += out[0];
                }
            }
            sink
        };
        g.bench_function(BenchmarkId::new("tile", format!("{ROWS}x{COLS}x{n}")), |b| {
            b.iter(|| tile(&w, rb, k.dot, k.rows))
        });
        if let Some(u) = k.unpacked {
            // The tile unpacked to whole bytes first, as the CPU backend does for batches (the
            // unpacking included in the time).
            let urb = n / 32 * u.block_bytes;
            let mut unp = vec![0u8; ROWS * urb];
            g.bench_function(BenchmarkId::new("unpacked", format!("{ROWS}x{COLS}x{n}")), |b| {
                b.iter(|| {
                    for (d, s) in unp.chunks_exact_mut(urb).zip(w.chunks_exact(rb)) {
                        (u.unpack)(n, s, d);
                    }
                    tile(&unp, urb, u.dot, Some(u.rows))
                })
            });
        }
        if let Some(p) = dot::packed::packing(ty, KernelPath::detect()) {
            // The same tile repacked eight rows at a time, as the CPU backend keeps such matrices.
            let gb = (p.group_bytes)(n);
            let mut packed = vec![0u8; ROWS / PACK_ROWS * gb];
            for (dst, rows) in packed.chunks_mut(gb).zip(w.chunks(PACK_ROWS * rb)) {
                (p.pack)(n, rows, dst);
            }
            g.bench_function(BenchmarkId::new("packed", format!("{ROWS}x{COLS}x{n}")), |b| {
                b.iter(|| {
                    let mut sink = 0f32;
                    let mut out = [[0f32; PACK_ROWS]; MAX_COLS];
                    for c0 in (0..COLS).step_by(MAX_COLS) {
                        let cols: Vec<&[u8]> = (c0..c0 + MAX_COLS).map(|j| &acts[j * ab..(j + 1) * ab]).collect();
                        for group in packed.chunks(gb) {
                            (p.dot)(n, group, &cols, &mut out);
                            sink += out[0][0];
                        }
                    }
                    sink
                })
            });
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2)).warm_up_time(std::time::Duration::from_millis(500));
    targets = kernels, gemv
}
criterion_main!(benches);

/// One activation row by a matrix larger than the caches (token generation): the one-row
/// kernel against the several-row kernel, single-threaded. Bytes per second is the figure.
fn gemv(c: &mut Criterion) {
    use GgmlType as T;
    const BIG: usize = 32768;
    for (ty, n) in [(T::Q8_0, 576), (T::Q4_1, 576), (T::Q6_K, 1024), (T::Q4_K, 1024)] {
        let k = dot::kernel(ty, KernelPath::detect()).unwrap();
        let w = quant::quantize(ty, &data(BIG * n, 7), n, None).unwrap();
        let rb = w.len() / BIG;
        let ab = dot::act_row_bytes(k.act, n);
        let mut a = vec![0u8; ab];
        dot::quantize_act(k.act, &data(n, 11), &mut a);
        let mut g = c.benchmark_group(format!("{}-gemv", ty.name()));
        g.throughput(Throughput::Bytes(w.len() as u64));
        g.bench_function("one-row", |b| {
            b.iter(|| {
                let mut out = [0f32; 1];
                let mut sink = 0f32;
                for r in 0..BIG {
                    (k.dot)(ty, n, &w[r * rb..(r + 1) * rb], &[&a], &mut out);
                    sink += out[0];
                }
                sink
            })
        });
        if let Some(p) = dot::packed::packing(ty, KernelPath::detect()) {
            let gb = (p.group_bytes)(n);
            let mut packed = vec![0u8; BIG / PACK_ROWS * gb];
            for (dst, rows) in packed.chunks_mut(gb).zip(w.chunks(PACK_ROWS * rb)) {
                (p.pack)(n, rows, dst);
            }
            g.bench_function("packed", |b| {
                b.iter(|| {
                    let mut out = [[0f32; PACK_ROWS]; 1];
                    let mut sink = 0f32;
                    for group in packed.chunks(gb) {
                        (p.dot)(n, group, &[&a], &mut out);
                        sink += out[0][0];
                    }
                    sink
                })
            });
        }
        if let Some(rows) = k.rows {
            for g4 in [2, 4] {
                g.bench_function(format!("{g4}-rows"), |b| {
                    b.iter(|| {
                        let mut out = [[0f32; MAX_COLS]; MAX_ROWS];
                        let mut sink = 0f32;
                        for r in (0..BIG).step_by(g4) {
                            let ws: Vec<&[u8]> = (r..r + g4).map(|i| &w[i * rb..(i + 1) * rb]).collect();
                            rows(ty, n, &ws, &[&a], &mut out[..g4]);
                            sink += out[0][0];
                        }
                        sink
                    })
                });
            }
        }
        g.finish();
    }
}
