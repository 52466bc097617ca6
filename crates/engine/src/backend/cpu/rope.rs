//! Rotary position embedding as ggml computes it (`ggml-cpu/ops.cpp`: ggml_rope_cache_init,
//! rope_yarn, rope_yarn_ramp; `ggml.c`: ggml_rope_yarn_corr_dims).

use crate::backend::Rope;

fn yarn_ramp(low: f32, high: f32, i0: usize) -> f32 {
    let y = ((i0 / 2) as f32 - low) / (high - low).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

fn corr_dim(n_dims: usize, n_ctx_orig: usize, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln())
}

fn corr_dims(r: &Rope) -> [f32; 2] {
    let start = corr_dim(r.n_dims, r.n_ctx_orig, r.beta_fast, r.freq_base).floor();
    let end = corr_dim(r.n_dims, r.n_ctx_orig, r.beta_slow, r.freq_base).ceil();
    [start.max(0.0), end.min(r.n_dims as f32 - 1.0)]
}

/// (cos, sin) for each rotated pair at position `pos`.
pub fn cache(r: &Rope, pos: f32) -> Vec<(f32, f32)> {
    let theta_scale = r.freq_base.powf(-2.0 / r.n_dims as f32);
    let corr = if r.ext_factor != 0.0 { corr_dims(r) } else { [0.0, 0.0] };
    let mut theta = pos;
    let mut out = Vec::with_capacity(r.n_dims / 2);
    for i in 0..r.n_dims / 2 {
        let ff = r.freq_factors.as_ref().and_then(|f| f.get(i)).copied().unwrap_or(1.0);
        let extrap = theta / ff;
        let interp = r.freq_scale * extrap;
        let (mut t, mut mscale) = (interp, r.attn_factor);
        if r.ext_factor != 0.0 {
            let mix = yarn_ramp(corr[0], corr[1], 2 * i) * r.ext_factor;
            t = interp * (1.0 - mix) + extrap * mix;
            mscale *= 1.0 + 0.1 * (1.0 / r.freq_scale).ln();
        }
        out.push((t.cos() * mscale, t.sin() * mscale));
        theta *= theta_scale;
    }
    out
}

/// Rotate one head in place: `y0 = x0·c − x1·s`, `y1 = x1·c + x0·s`, each with its second product
/// rounded and the first fused (as GCC compiles ggml's rotate_pairs with FMA contraction).
pub fn rotate(h: &mut [f32], cache: &[(f32, f32)], r: &Rope) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::avx2() {
        // SAFETY: FMA present (checked with AVX2); the same code with `mul_add` as one instruction.
        return unsafe { rotate_fma(h, cache, r) };
    }
    rotate_portable(h, cache, r)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn rotate_fma(h: &mut [f32], cache: &[(f32, f32)], r: &Rope) {
    rotate_portable(h, cache, r)
}

#[inline(always)]
fn rotate_portable(h: &mut [f32], cache: &[(f32, f32)], r: &Rope) {
    if r.neox {
        let half = r.n_dims / 2;
        for (i, &(c, s)) in cache.iter().enumerate() {
            let (x0, x1) = (h[i], h[i + half]);
            h[i] = x0.mul_add(c, -(x1 * s));
            h[i + half] = x0.mul_add(s, x1 * c);
        }
    } else {
        for (i, &(c, s)) in cache.iter().enumerate() {
            let (x0, x1) = (h[2 * i], h[2 * i + 1]);
            h[2 * i] = x0.mul_add(c, -(x1 * s));
            h[2 * i + 1] = x0.mul_add(s, x1 * c);
        }
    }
}
