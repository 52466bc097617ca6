//! Single-threaded dequantization speed: `dequant_bench DIR N_PER_ROW TYPE...` quantizes the
//! benchmark input (`DIR/input.f32`, `DIR/imatrix.f32`, see `quant_bench`) once, then times the
//! type's block dequantizer over it and prints Gvalues/s and an FNV-1a hash of the output floats.

use quant::GgmlType;
use std::time::Instant;

fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = std::path::Path::new(&args[0]);
    let n_per_row: usize = args[1].parse().unwrap();
    let src = read_f32(&dir.join("input.f32"));
    let imatrix = read_f32(&dir.join("imatrix.f32"));
    for name in &args[2..] {
        let ty = GgmlType::from_name(name).unwrap_or_else(|| panic!("unknown type {name}"));
        let codec = quant::codec(ty).unwrap();
        let q = quant::quantize(ty, &src, n_per_row, Some(&imatrix)).unwrap();
        let mut y = vec![0f32; src.len()];
        let mut times = Vec::new();
        let t_all = Instant::now();
        while t_all.elapsed().as_secs_f64() < 0.5 || times.len() < 5 {
            let t = Instant::now();
            (codec.dequantize)(&q, &mut y);
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        let hash = y.iter().fold(0xcbf29ce484222325u64, |h, v| {
            v.to_bits()
                .to_le_bytes()
                .iter()
                .fold(h, |h, &x| (h ^ x as u64).wrapping_mul(0x100000001b3))
        });
        println!(
            "{{\"type\":\"{name}\",\"n\":{},\"median_s\":{med:.3e},\"gvalues_per_s\":{:.3},\"hash\":\"{hash:016x}\"}}",
            y.len(),
            y.len() as f64 / med / 1e9
        );
    }
}
