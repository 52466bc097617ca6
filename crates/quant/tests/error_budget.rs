//! Quantize → dequantize error per type, measured as ggml's `tests/test-quantize-fns.cpp` does
//! (`sqrt(sum((x - x')^2)) / n` on `0.1 + 2 cos(i)`, 4,096 values) and held to the same named
//! budgets ggml holds its own quantizers to. Types ggml cannot quantize without an importance
//! matrix (and that test therefore skips) get a uniform importance matrix and the budget of their
//! bit-width class.

use quant::GgmlType;

// Budgets from test-quantize-fns.cpp, by bit-width class.
/// 4 bits and more per weight (Q4_0 … Q8_0, Q4_K … Q6_K, IQ4_*, MXFP4).
const MAX_TOTAL_ERROR: f32 = 0.002;
/// 1 bit per weight (Q1_0) and the 1.5-1.75-bit codebooks (IQ1_S, IQ1_M).
const MAX_TOTAL_ERROR_BINARY: f32 = 0.025;
/// Ternary and 2-bit linear codes (TQ1_0, TQ2_0, Q2_0).
const MAX_TOTAL_ERROR_TERNARY: f32 = 0.01;
/// 2-bit K-quant and 2-bit codebooks (Q2_K, IQ2_*).
const MAX_TOTAL_ERROR_2BITS: f32 = 0.0075;
/// 3-bit types (Q3_K, IQ3_S).
const MAX_TOTAL_ERROR_3BITS: f32 = 0.0040;
/// IQ3_XXS (3.06 bits per weight, coarser grid).
const MAX_TOTAL_ERROR_3BITS_XXS: f32 = 0.0050;
/// NVFP4 (4-bit floats with an 8-bit scale per 16).
const MAX_TOTAL_ERROR_FP4: f32 = 0.0030;

fn budget(ty: GgmlType) -> f32 {
    use GgmlType::*;
    match ty {
        Q1_0 | IQ1_S | IQ1_M => MAX_TOTAL_ERROR_BINARY,
        TQ1_0 | TQ2_0 | Q2_0 => MAX_TOTAL_ERROR_TERNARY,
        Q2_K | IQ2_S | IQ2_XS | IQ2_XXS => MAX_TOTAL_ERROR_2BITS,
        Q3_K | IQ3_S => MAX_TOTAL_ERROR_3BITS,
        IQ3_XXS => MAX_TOTAL_ERROR_3BITS_XXS,
        NVFP4 => MAX_TOTAL_ERROR_FP4,
        _ => MAX_TOTAL_ERROR,
    }
}

/// test-quantize-fns.cpp: generate_data
fn generate_data(offset: f32, n: usize, amplitude: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (0.1f64 + f64::from(amplitude * (i as f32 + offset).cos())) as f32)
        .collect()
}

/// test-quantize-fns.cpp: array_rmse (sic: sqrt of the sum, divided by n)
fn array_rmse(a: &[f32], b: &[f32]) -> f32 {
    let sum: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x - y) * f64::from(x - y))
        .sum();
    (sum.sqrt() / a.len() as f64) as f32
}

#[test]
fn every_quantizable_type_is_within_its_error_budget() {
    let n = 32 * 128;
    let data = generate_data(0.0, n, 2.0);
    let ones = vec![1.0f32; n];
    let mut report = Vec::new();
    let mut failures = Vec::new();
    let types = quant::quantizable_types();
    assert!(types.len() >= 3, "codec table is empty");
    for ty in types {
        let codec = quant::codec(ty).unwrap();
        let imatrix = codec.requires_imatrix.then_some(&ones[..]);
        let q = quant::quantize(ty, &data, n, imatrix).unwrap();
        let back = quant::dequantize(ty, &q, n).unwrap();
        let err = array_rmse(&data, &back);
        report.push(format!("{ty:>8}: {err:.6} (budget {})", budget(ty)));
        if err.is_nan() || err >= budget(ty) {
            failures.push(format!("{ty}: error {err} exceeds budget {}", budget(ty)));
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn lossless_types_round_trip_exactly() {
    let data = generate_data(1.0, 1024, 1.5);
    let q = quant::quantize(GgmlType::F32, &data, 1024, None).unwrap();
    assert_eq!(quant::dequantize(GgmlType::F32, &q, 1024).unwrap(), data);
    // Values representable in f16/bf16 survive exactly.
    let h: Vec<f32> = (0..1024).map(|i| ((i % 256) as f32 - 128.0) / 4.0).collect();
    for ty in [GgmlType::F16, GgmlType::BF16] {
        let q = quant::quantize(ty, &h, 1024, None).unwrap();
        assert_eq!(quant::dequantize(ty, &q, 1024).unwrap(), h, "{ty}");
    }
}

#[test]
fn api_errors_are_explicit() {
    use quant::QuantError;
    let x = vec![0.5f32; 512];
    assert_eq!(
        quant::quantize(GgmlType::Q4_0, &x, 100, None),
        Err(QuantError::RowLength {
            ty: GgmlType::Q4_0,
            n: 100,
            block: 32
        })
    );
    assert!(matches!(
        quant::quantize(GgmlType::Q4_0, &x, 96, None),
        Err(QuantError::Length { .. })
    ));
    assert!(matches!(
        quant::quantize(GgmlType::Q4_0, &x, 256, Some(&[1.0; 10])),
        Err(QuantError::Length { .. })
    ));
    assert!(matches!(
        quant::dequantize(GgmlType::Q4_0, &[0u8; 17], 32),
        Err(QuantError::Length { .. })
    ));
    assert_eq!(
        quant::quantize(GgmlType::I32, &x, 512, None),
        Err(QuantError::Unsupported(GgmlType::I32))
    );
}
