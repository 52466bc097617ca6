//! Scalar number formats and rounding helpers exactly as ggml computes them
//! (`ggml/src/ggml-impl.h`, `ggml/src/ggml-quants.c`).

/// f32 → f16 bits, round to nearest even; NaN becomes 0x7E00 (`ggml_compute_fp32_to_fp16`,
/// the bit-manipulation algorithm ggml's portable build uses).
#[inline]
pub fn f32_to_f16(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let mut bias = shl1_w & 0xFF00_0000;
    if bias < 0x7100_0000 {
        bias = 0x7100_0000;
    }
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7C00;
    let mantissa_bits = bits & 0x0000_0FFF;
    let nonsign = exp_bits + mantissa_bits;
    ((sign >> 16) | if shl1_w > 0xFF00_0000 { 0x7E00 } else { nonsign }) as u16
}

/// f16 bits → f32 (exact).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = match exp {
        0 if mant == 0 => sign,
        0 => {
            // subnormal: value = mant * 2^-24
            let v = mant as f32 * f32::from_bits(0x3380_0000); // 2^-24
            return if sign != 0 { -v } else { v };
        }
        0x1f => sign | 0x7f80_0000 | (mant << 13),
        _ => sign | ((exp + 112) << 23) | (mant << 13),
    };
    f32::from_bits(bits)
}

/// f32 → bf16 bits, round to nearest even; NaN is made quiet (`ggml_compute_fp32_to_bf16`).
#[inline]
pub fn f32_to_bf16(f: f32) -> u16 {
    let u = f.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Round to nearest, ties to even, through the float-addition trick ggml uses (`nearest_int`);
/// exact for |fval| <= 4194303. Larger inputs give the same (meaningless) value as ggml's release
/// build, whose `assert` is compiled out, so no check here either.
#[inline]
pub fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    let i = val.to_bits() as i32;
    (i & 0x007f_ffff) - 0x0040_0000
}

/// Little-endian f16 stored as two bytes (block fields are byte arrays so blocks have alignment 1).
pub type F16Bytes = [u8; 2];

#[inline]
pub fn put_f16(f: f32) -> F16Bytes {
    f32_to_f16(f).to_le_bytes()
}

#[inline]
pub fn get_f16(b: F16Bytes) -> f32 {
    f16_to_f32(u16::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trip_every_value() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert_eq!(f32_to_f16(f), 0x7E00 | (h & 0x8000));
            } else {
                assert_eq!(f32_to_f16(f), h, "{h:#06x}");
            }
        }
    }

    #[test]
    fn f16_rounding() {
        assert_eq!(f32_to_f16(1.0 + f32::EPSILON), 0x3c00);
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // rounds to inf
        assert_eq!(f32_to_f16(1e-8), 0x0000);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
        // ties to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
    }

    #[test]
    fn bf16_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // tie → even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::NAN) & 0x7fc0, 0x7fc0);
    }

    #[test]
    fn nearest_int_ties_to_even() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-7.49), -7);
    }
}
