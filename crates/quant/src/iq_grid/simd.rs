//! AVX2 building blocks of the grid dequantizers: one group of 8 values per call, computed with
//! the scalar code's operations in its order (element-wise multiplies and adds, no FMA).

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    /// The eight grid bytes of `grid` (little-endian), as unsigned i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn bytes_u(grid: u64) -> __m256i {
        _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(grid as i64))
    }

    /// `y[j] = db * grid[j] * (signs bit j ? -1 : 1)` with unsigned grid bytes (IQ2, IQ3).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn signed_group(y: &mut [f32], db: f32, grid: u64, signs: u8) {
        assert!(y.len() == 8);
        let bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        let s = _mm256_and_si256(_mm256_set1_epi32(signs as i32), bits);
        let neg = _mm256_castsi256_ps(_mm256_cmpeq_epi32(s, bits));
        let sign = _mm256_blendv_ps(_mm256_set1_ps(1.0), _mm256_set1_ps(-1.0), neg);
        let g = _mm256_cvtepi32_ps(bytes_u(grid));
        _mm256_storeu_ps(
            y.as_mut_ptr(),
            _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(db), g), sign),
        );
    }

    /// `y[j] = dl * (grid[j] + delta)` with signed grid bytes (IQ1).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn shifted_group(y: &mut [f32], dl: f32, grid: u64, delta: f32) {
        assert!(y.len() == 8);
        let g = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(grid as i64)));
        let v = _mm256_add_ps(g, _mm256_set1_ps(delta));
        _mm256_storeu_ps(y.as_mut_ptr(), _mm256_mul_ps(_mm256_set1_ps(dl), v));
    }
}

#[cfg(test)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) mod test_util {
    /// A scalar dequantizer and its fast counterpart.
    pub(crate) type DequantPair = (crate::DequantizeRow, crate::DequantizeRow);

    /// For each (type name, block bytes, f16 scale offsets, pair): both dequantizers give the same
    /// float bits on 4096 random valid blocks of 256 values.
    pub(crate) fn assert_dequant_agrees(rng: &mut Rng, cases: &[(&str, usize, &[usize], DequantPair)]) {
        for &(name, bytes, d_at, (scalar, fast)) in cases {
            let src = rng.blocks(4096, bytes, d_at);
            let (mut a, mut b) = (vec![0f32; 4096 * 256], vec![1f32; 4096 * 256]);
            scalar(&src, &mut a);
            fast(&src, &mut b);
            assert!(bits(&a) == bits(&b), "{name}");
        }
    }

    /// xorshift64*.
    pub(crate) struct Rng(pub u64);
    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545F4914F6CDD1D)
        }
        /// Random bytes with a finite f16 (exponent < 31) at each `d_offsets` position of every
        /// `block_bytes`-byte block: valid blocks for every grid type (all index bits are used).
        pub(crate) fn blocks(&mut self, n_blocks: usize, block_bytes: usize, d_offsets: &[usize]) -> Vec<u8> {
            let mut v: Vec<u8> = (0..n_blocks * block_bytes).map(|_| self.next() as u8).collect();
            for b in v.chunks_exact_mut(block_bytes) {
                for &o in d_offsets {
                    b[o + 1] &= 0xbb; // clears f16 exponent bit 14 and bit 10: never 31
                }
            }
            v
        }
    }

    pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }
}
