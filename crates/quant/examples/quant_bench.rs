//! Side-by-side quantization benchmark input and hf2q timings (see `bench/quant/run.sh`).
//!
//! `quant_bench --write-input DIR ROWS N_PER_ROW` writes a seeded LLM-weight-like matrix
//! (`input.f32`) and importance matrix (`imatrix.f32`); `quant_bench DIR N_PER_ROW MIN_SECONDS
//! THREADS TYPE...` times `quant::quantize` per type and prints the same JSON lines as
//! `bench/quant/ggml_quantize_bench.c`, including an FNV-1a hash of the output bytes.

use quant::GgmlType;
use std::time::Instant;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn gauss(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
    }
}

fn write_f32(path: &std::path::Path, v: &[f32]) {
    std::fs::write(path, bytemuck::cast_slice::<f32, u8>(v)).unwrap();
}

fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100000001b3)
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--write-input") {
        let dir = std::path::Path::new(&args[1]);
        let (rows, n): (usize, usize) = (args[2].parse().unwrap(), args[3].parse().unwrap());
        std::fs::create_dir_all(dir).unwrap();
        let mut rng = Rng(20261129);
        // N(0, 0.02) weights with 0.1% outliers at 10x, the shape of real LLM weight rows.
        let x: Vec<f32> = (0..rows * n)
            .map(|_| {
                let g = rng.gauss() * 0.02;
                (if rng.uniform() < 0.001 { g * 10.0 } else { g }) as f32
            })
            .collect();
        let w: Vec<f32> = (0..n).map(|_| (0.1 + rng.uniform() * 2.0) as f32).collect();
        write_f32(&dir.join("input.f32"), &x);
        write_f32(&dir.join("imatrix.f32"), &w);
        return;
    }
    let dir = std::path::Path::new(&args[0]);
    let n_per_row: usize = args[1].parse().unwrap();
    let min_seconds: f64 = args[2].parse().unwrap();
    let threads: usize = args[3].parse().unwrap();
    let src = read_f32(&dir.join("input.f32"));
    let imatrix = read_f32(&dir.join("imatrix.f32"));
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    for name in &args[4..] {
        let ty = GgmlType::from_name(name).unwrap_or_else(|| panic!("unknown type {name}"));
        let Some(codec) = quant::codec(ty) else {
            eprintln!("no codec for {ty}");
            continue;
        };
        for (variant, im) in [("plain", None), ("imatrix", Some(&imatrix[..]))] {
            if im.is_none() && codec.requires_imatrix {
                continue;
            }
            // Output buffer allocated once and reused, as the ggml harness does.
            let mut out = quant::quantize(ty, &src, n_per_row, im).unwrap(); // warm-up (and grid initialisation)
            let mut times = Vec::new();
            let start = Instant::now();
            while times.len() < 1000 && (times.len() < 3 || start.elapsed().as_secs_f64() < min_seconds) {
                let t0 = Instant::now();
                if threads == 1 {
                    // On this thread, as ggml's harness calls ggml_quantize_chunk: no pool hand-off.
                    quant::quantize_into_with(ty, &src, &mut out, n_per_row, im, false).unwrap();
                } else {
                    pool.install(|| quant::quantize_into(ty, &src, &mut out, n_per_row, im).unwrap());
                }
                std::hint::black_box(&out);
                times.push(t0.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            println!(
                "{{\"impl\":\"hf2q\",\"threads\":{threads},\"type\":\"{}\",\"variant\":\"{variant}\",\"values\":{},\"reps\":{},\"median_s\":{:.9},\"hash\":\"{:016x}\"}}",
                ty.name(),
                src.len(),
                times.len(),
                times[times.len() / 2],
                fnv1a(&out)
            );
        }
    }
}
