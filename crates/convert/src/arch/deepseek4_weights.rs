//! DeepSeek-V4's pre-quantized weights (llama.cpp `conversion/deepseek.py`, `DeepseekV4Model`, and
//! `ModelBase.repack_mxfp4_blocks` in `conversion/base.py`): routed experts stored as packed E2M1
//! pairs with E8M0 scales become ggml MXFP4 bytes (lossless), FP8 block-scaled weights are
//! dequantized, and the `tid2eid` hash-routing table becomes I32.

use super::{Ctx, OutTensor};
use crate::hf::{HfError, HfTensor, HfTensors};
use gguf::GgmlType;
use safetensors::Dtype;

/// Bytes of one ggml `block_mxfp4` (E8M0 scale + 16 bytes of 4-bit codes for 32 values).
const MXFP4_BLOCK_BYTES: usize = 17;

/// `repack_mxfp4_blocks`: `packed` [rows, cols/2] (element 2i in the low nibble, 2i+1 in the high
/// one) and `scale` [rows, cols/32] (one E8M0 exponent per 32 values) → ggml blocks, each one scale
/// byte then 16 bytes holding element j in the low nibble and element j+16 in the high one.
pub fn repack_mxfp4(packed: &[u8], scale: &[u8], rows: usize, packed_cols: usize, out: &mut Vec<u8>) {
    let n_blocks = packed_cols * 2 / 32;
    for r in 0..rows {
        for b in 0..n_blocks {
            let src = &packed[r * packed_cols + b * 16..r * packed_cols + b * 16 + 16];
            let mut vals = [0u8; 32];
            for (i, &byte) in src.iter().enumerate() {
                vals[2 * i] = byte & 0x0f;
                vals[2 * i + 1] = byte >> 4;
            }
            out.push(scale[r * n_blocks + b]);
            out.extend((0..16).map(|j| vals[j] | (vals[j + 16] << 4)));
        }
    }
}

/// One expert projection's (weight, scale) tensors, checked: I8 codes [rows, cols/2] and E8M0
/// scales [rows, cols/32].
fn expert_pair<'a>(ctx: &'a Ctx, weight: &str, scale: &str) -> Result<(&'a HfTensor, &'a HfTensor), HfError> {
    let (Some(w), Some(s)) = (ctx.hf.get(weight), ctx.hf.get(scale)) else {
        return Err(ctx.invalid(format!(
            "missing routed expert tensors for `{weight}` (DeepSeek-V4 experts must be FP4 codes with a `.scale`)"
        )));
    };
    if !matches!(w.dtype, Dtype::I8 | Dtype::U8) || w.shape.len() != 2 {
        return Err(ctx.invalid(format!(
            "routed expert `{weight}` is {:?} {:?}; expected I8 [rows, cols/2] (two E2M1 codes per byte)",
            w.dtype, w.shape
        )));
    }
    let (rows, packed_cols) = (w.shape[0], w.shape[1]);
    if !(packed_cols * 2).is_multiple_of(32) {
        return Err(ctx.invalid(format!(
            "routed expert `{weight}` has rows of {} values, not a multiple of 32",
            packed_cols * 2
        )));
    }
    if !matches!(s.dtype, Dtype::F8_E8M0 | Dtype::U8) || s.shape != [rows, packed_cols * 2 / 32] {
        return Err(ctx.invalid(format!(
            "expert scale `{scale}` is {:?} {:?}; expected F8_E8M0 [{rows}, {}]",
            s.dtype,
            s.shape,
            packed_cols * 2 / 32
        )));
    }
    Ok((w, s))
}

/// `_write_mxfp4_expert_tensor`: the experts of one projection stacked into an MXFP4 tensor
/// [n_expert, rows, cols], written as repacked bytes; its f32 values are the dequantized MXFP4.
pub fn mxfp4_experts(ctx: &Ctx, name: String, bid: usize, proj: &str, n_expert: usize) -> Result<OutTensor, HfError> {
    let mut pairs = Vec::with_capacity(n_expert);
    let mut dims = None;
    for eid in 0..n_expert {
        let weight = format!("layers.{bid}.ffn.experts.{eid}.{proj}.weight");
        let scale = format!("layers.{bid}.ffn.experts.{eid}.{proj}.scale");
        let (w, _) = expert_pair(ctx, &weight, &scale)?;
        let d = (w.shape[0], w.shape[1]);
        if *dims.get_or_insert(d) != d {
            return Err(ctx.invalid(format!(
                "routed expert `{weight}` has shape {:?}, unlike expert 0 of its layer",
                w.shape
            )));
        }
        pairs.push((weight, scale));
    }
    let (rows, packed_cols) = dims.ok_or_else(|| ctx.invalid("n_routed_experts is 0"))?;
    let cols = packed_cols * 2;
    let make_raw = move |hf: &HfTensors| -> Result<Vec<u8>, HfError> {
        let mut out = Vec::with_capacity(pairs.len() * rows * cols / 32 * MXFP4_BLOCK_BYTES);
        for (w, s) in &pairs {
            let (w, s) = (hf.get(w).expect("listed"), hf.get(s).expect("listed"));
            repack_mxfp4(hf.bytes(w), hf.bytes(s), rows, packed_cols, &mut out);
        }
        Ok(out)
    };
    let n = n_expert * rows * cols;
    let source = format!("layers.{bid}.ffn.experts.*.{proj}");
    let src_msg = source.clone();
    let make_raw = std::sync::Arc::new(make_raw);
    let raw_for_values = make_raw.clone();
    let dir = ctx.dir.clone();
    Ok(OutTensor {
        rows_from: None,
        name,
        shape: vec![n_expert, rows, cols],
        source,
        make: Box::new(move |hf| {
            quant::dequantize(GgmlType::MXFP4, &raw_for_values(hf)?, n).map_err(|e| HfError::Invalid {
                path: dir.clone(),
                problem: format!("`{src_msg}`: {e}"),
            })
        }),
        raw: Some((GgmlType::MXFP4, Box::new(move |hf| make_raw(hf)))),
    })
}

/// `_write_hash_routing_tensors`: `tid2eid` (token id → expert ids, I64 in the checkpoint) is
/// written as I32 (`torch.to(int32)`, which wraps), whatever the output type.
pub fn tid2eid(ctx: &Ctx, name: String, t: &HfTensor) -> Result<OutTensor, HfError> {
    if !matches!(t.dtype, Dtype::I64 | Dtype::I32) || t.shape.len() != 2 {
        return Err(ctx.invalid(format!(
            "hash routing table `{}` is {:?} {:?}; expected an integer [vocab, experts per token] table",
            t.name, t.dtype, t.shape
        )));
    }
    let ints = |hf: &HfTensors, src: &str| -> Vec<i32> {
        let t = hf.get(src).expect("listed");
        match t.dtype {
            Dtype::I64 => hf
                .bytes(t)
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as i32)
                .collect(),
            _ => hf
                .bytes(t)
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect(),
        }
    };
    let (src_a, src_b) = (t.name.clone(), t.name.clone());
    Ok(OutTensor {
        rows_from: None,
        name,
        shape: t.shape.clone(),
        source: t.name.clone(),
        make: Box::new(move |hf| Ok(ints(hf, &src_a).into_iter().map(|v| v as f32).collect())),
        raw: Some((
            GgmlType::I32,
            Box::new(move |hf| Ok(ints(hf, &src_b).into_iter().flat_map(i32::to_le_bytes).collect())),
        )),
    })
}

/// torch `float8_e4m3fn` → f32 (no infinities; S.1111.111 is NaN).
pub fn e4m3fn_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = (b >> 3) & 0x0f;
    let m = (b & 0x07) as f32;
    if e == 0x0f && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    if e == 0 {
        return sign * m * (2.0f32).powi(-9);
    }
    sign * (1.0 + m / 8.0) * (2.0f32).powi(e as i32 - 7)
}

/// torch `float8_e8m0fnu` → f32 (2^(b-127); 0xFF is NaN).
pub fn e8m0_to_f32(b: u8) -> f32 {
    match b {
        0xff => f32::NAN,
        0 => f32::from_bits(0x0040_0000),
        b => f32::from_bits((b as u32) << 23),
    }
}

fn fp8_values(hf: &HfTensors, t: &HfTensor) -> Vec<f32> {
    let b = hf.bytes(t);
    match t.dtype {
        Dtype::F8_E4M3 => b.iter().map(|&x| e4m3fn_to_f32(x)).collect(),
        _ => b.iter().map(|&x| quant::fp::f16_to_f32((x as u16) << 8)).collect(),
    }
}

/// Whether a tensor is an FP8 weight that `dequant_model` dequantizes with its `.scale`.
pub fn is_fp8(t: &HfTensor) -> bool {
    matches!(t.dtype, Dtype::F8_E4M3 | Dtype::F8_E5M2)
}

/// `dequant_model`: an FP8 weight [out, in] times its E8M0 scale, one per 128×128 block; written as
/// Q8_0 (`tensor_force_quant`), or F16 where a row is not a whole number of Q8_0 blocks (the
/// converter's fallback). The bytes are fixed, so llama-quantize requantizes from them.
pub fn fp8_dequantized(ctx: &Ctx, name: String, w: &HfTensor, scale_name: &str) -> Result<OutTensor, HfError> {
    let s = ctx.hf.get(scale_name).expect("caller checked");
    if w.shape.len() != 2 {
        return Err(ctx.invalid(format!("FP8 weight `{}` has shape {:?}; expected 2-D", w.name, w.shape)));
    }
    let (rows, cols) = (w.shape[0], w.shape[1]);
    let want = [rows.div_ceil(128), cols.div_ceil(128)];
    if !matches!(s.dtype, Dtype::F8_E8M0 | Dtype::U8) || s.shape != want {
        return Err(ctx.invalid(format!(
            "FP8 scale `{scale_name}` is {:?} {:?}; expected F8_E8M0 {want:?} (one per 128×128 block)",
            s.dtype, s.shape
        )));
    }
    let (wn, sn) = (w.name.clone(), scale_name.to_string());
    let values = std::sync::Arc::new(move |hf: &HfTensors| -> Vec<f32> {
        let (w, s) = (hf.get(&wn).expect("listed"), hf.get(&sn).expect("listed"));
        let sb = hf.bytes(s);
        let mut v = fp8_values(hf, w);
        for (r, row) in v.chunks_exact_mut(cols).enumerate() {
            for (c, x) in row.iter_mut().enumerate() {
                *x *= e8m0_to_f32(sb[(r / 128) * want[1] + c / 128]);
            }
        }
        v
    });
    let ty = if cols.is_multiple_of(32) {
        GgmlType::Q8_0
    } else {
        GgmlType::F16
    };
    let v2 = values.clone();
    let tname = name.clone();
    let dir = ctx.dir.clone();
    Ok(OutTensor {
        rows_from: None,
        name,
        shape: w.shape.clone(),
        source: w.name.clone(),
        make: Box::new(move |hf| Ok(values(hf))),
        raw: Some((
            ty,
            Box::new(move |hf| {
                quant::quantize(ty, &v2(hf), cols, None).map_err(|e| HfError::Invalid {
                    path: dir.clone(),
                    problem: format!("tensor `{tname}`: {e}"),
                })
            }),
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_decoding() {
        assert_eq!(e4m3fn_to_f32(0x00), 0.0);
        assert_eq!(e4m3fn_to_f32(0x38), 1.0);
        assert_eq!(e4m3fn_to_f32(0x7e), 448.0);
        assert_eq!(e4m3fn_to_f32(0x01), 2.0f32.powi(-9));
        assert_eq!(e4m3fn_to_f32(0xc0), -2.0);
        assert!(e4m3fn_to_f32(0x7f).is_nan());
        assert_eq!(e8m0_to_f32(127), 1.0);
        assert_eq!(e8m0_to_f32(128), 2.0);
        assert_eq!(e8m0_to_f32(0), 2.0f32.powi(-127));
    }

    #[test]
    fn mxfp4_repack_moves_nibbles() {
        // One row of 32 values: element k has code k % 16.
        let packed: Vec<u8> = (0..16u8).map(|i| ((2 * i) % 16) | (((2 * i + 1) % 16) << 4)).collect();
        let mut out = Vec::new();
        repack_mxfp4(&packed, &[130], 1, 16, &mut out);
        assert_eq!(out.len(), 17);
        assert_eq!(out[0], 130);
        for j in 0..16 {
            assert_eq!(out[1 + j], (j as u8 % 16) | (((j as u8 + 16) % 16) << 4));
        }
    }
}
