//! Criterion benches per ggml type: quantize (without and with an importance matrix) and
//! dequantize 16 rows × 4096 values, single-threaded. The side-by-side comparison with ggml's own
//! `ggml_quantize_chunk` is `bench/quant/run.sh` (results under `bench/runs/`).
//!
//!     cargo bench -p quant --bench codecs -- q4_K

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const ROWS: usize = 16;
const N: usize = 4096;

fn data() -> (Vec<f32>, Vec<f32>) {
    // Seeded xorshift, N(0, 0.02)-like via a sum of uniforms: the shape of LLM weight rows.
    let mut s = 0x2545F4914F6CDD1Du64;
    let mut u = || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        (s.wrapping_mul(0x2545F4914F6CDD1D) >> 40) as f32 / (1u64 << 24) as f32
    };
    let x = (0..ROWS * N).map(|_| (u() + u() + u() + u() - 2.0) * 0.035).collect();
    let w = (0..N).map(|_| 0.1 + 2.0 * u()).collect();
    (x, w)
}

fn codecs(c: &mut Criterion) {
    let (x, w) = data();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    for ty in quant::quantizable_types() {
        let codec = quant::codec(ty).unwrap();
        let mut g = c.benchmark_group(ty.name());
        g.throughput(Throughput::Elements((ROWS * N) as u64));
        let mut out = quant::quantize(ty, &x, N, Some(&w)).unwrap();
        if !codec.requires_imatrix {
            g.bench_function(BenchmarkId::new("quantize", "plain"), |b| {
                b.iter(|| pool.install(|| quant::quantize_into(ty, &x, &mut out, N, None).unwrap()))
            });
        }
        g.bench_function(BenchmarkId::new("quantize", "imatrix"), |b| {
            b.iter(|| pool.install(|| quant::quantize_into(ty, &x, &mut out, N, Some(&w)).unwrap()))
        });
        let mut back = vec![0f32; ROWS * N];
        g.bench_function("dequantize", |b| {
            b.iter(|| pool.install(|| quant::dequantize_into(ty, &out, &mut back).unwrap()))
        });
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).warm_up_time(std::time::Duration::from_millis(200)).measurement_time(std::time::Duration::from_millis(600));
    targets = codecs
}
criterion_main!(benches);
