//! The encoder GEMM (`backend/cpu/dense.rs`, the `gemm` crate) against `matrixmultiply`'s sgemm
//! on all-MiniLM-L6-v2's shapes (a 1,024-token batch: Q/K/V/O 384×384, FFN up 384→1536, down
//! 1536→384), both on 2 threads. `cargo bench -p engine --bench dense`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn shapes(c: &mut Criterion) {
    let threads = 2;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    std::env::set_var("MATMUL_NUM_THREADS", threads.to_string());
    let mut g = c.benchmark_group("encoder_gemm");
    g.sample_size(20);
    for &(t, n, k) in &[
        (1024usize, 384usize, 384usize),
        (1024, 1536, 384),
        (1024, 384, 1536),
        (64, 1536, 384),
    ] {
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.01).collect();
        let x: Vec<f32> = (0..t * k).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.01).collect();
        let mut out = vec![0f32; t * n];
        g.throughput(Throughput::Elements((2 * t * n * k) as u64));
        let id = format!("{t}x{n}x{k}");
        g.bench_with_input(BenchmarkId::new("gemm", &id), &(), |b, _| {
            b.iter(|| pool.install(|| engine::backend::cpu::dense_matmul(&w, n, k, &x, t, &mut out, threads)))
        });
        g.bench_with_input(BenchmarkId::new("matrixmultiply", &id), &(), |b, _| {
            b.iter(|| unsafe {
                // out[t][n] = x[t][k] · w[n][k]ᵀ: rhs (k×n) read from w's rows (row stride 1, column stride k).
                matrixmultiply::sgemm(
                    t,
                    k,
                    n,
                    1.0,
                    x.as_ptr(),
                    k as isize,
                    1,
                    w.as_ptr(),
                    1,
                    k as isize,
                    0.0,
                    out.as_mut_ptr(),
                    n as isize,
                    1,
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, shapes);
criterion_main!(benches);
