//! AVX2 + FMA + F16C dot products (`ggml-cpu/arch/x86/quants.c`, the `__AVX2__` paths): the same
//! integer block sums as the scalar reference, accumulated per block into eight f32 lanes with FMA
//! and reduced at the end, as ggml does. Each kernel takes up to four activation rows and unpacks
//! every weight block once for all of them.

use super::{DotFn, MAX_COLS};
use crate::GgmlType;
use std::arch::x86_64::*;

pub fn dot_fn(w: GgmlType) -> Option<DotFn> {
    use GgmlType as T;
    Some(match w {
        T::F32 => |_, n, w, a, o| unsafe { f32_dot(n, w, a, o) },
        T::F16 => |_, n, w, a, o| unsafe { f16_dot(n, w, a, o) },
        T::Q4_0 if vnni() => |_, n, w, a, o| unsafe { legacy_vnni::<Q4_0>(n, w, a, o) },
        T::Q4_1 if vnni() => |_, n, w, a, o| unsafe { legacy_vnni::<Q4_1>(n, w, a, o) },
        T::Q5_0 if vnni() => |_, n, w, a, o| unsafe { legacy_vnni::<Q5_0>(n, w, a, o) },
        T::Q5_1 if vnni() => |_, n, w, a, o| unsafe { legacy_vnni::<Q5_1>(n, w, a, o) },
        T::Q8_0 if vnni() => |_, n, w, a, o| unsafe { legacy_vnni::<Q8_0>(n, w, a, o) },
        T::IQ4_NL if vnni() => |_, n, w, a, o| unsafe { legacy_vnni::<Iq4Nl>(n, w, a, o) },
        T::Q4_0 => |_, n, w, a, o| unsafe { legacy::<Q4_0>(n, w, a, o) },
        T::Q4_1 => |_, n, w, a, o| unsafe { legacy::<Q4_1>(n, w, a, o) },
        T::Q5_0 => |_, n, w, a, o| unsafe { legacy::<Q5_0>(n, w, a, o) },
        T::Q5_1 => |_, n, w, a, o| unsafe { legacy::<Q5_1>(n, w, a, o) },
        T::Q8_0 => |_, n, w, a, o| unsafe { legacy::<Q8_0>(n, w, a, o) },
        T::IQ4_NL => |_, n, w, a, o| unsafe { legacy::<Iq4Nl>(n, w, a, o) },
        T::Q4_K if vnni() => |_, n, w, a, o| unsafe { q4k_vnni(n, w, a, o) },
        T::Q6_K if vnni() => |_, n, w, a, o| unsafe { q6k_vnni(n, w, a, o) },
        T::Q4_K => |_, n, w, a, o| unsafe { q4k(n, w, a, o) },
        T::Q5_K => |_, n, w, a, o| unsafe { q5k(n, w, a, o) },
        T::Q6_K => |_, n, w, a, o| unsafe { q6k(n, w, a, o) },
        _ => return None,
    })
}

/// Several-row kernels (see [`super::DotRowsFn`]) for the 32-value block types.
pub fn rows_fn(w: GgmlType) -> Option<super::DotRowsFn> {
    use GgmlType as T;
    if !vnni() {
        return Some(match w {
            T::Q4_0 => |_, n, ws, a, o| unsafe { legacy_rows::<Q4_0>(n, ws, a, o) },
            T::Q4_1 => |_, n, ws, a, o| unsafe { legacy_rows::<Q4_1>(n, ws, a, o) },
            T::Q5_0 => |_, n, ws, a, o| unsafe { legacy_rows::<Q5_0>(n, ws, a, o) },
            T::Q5_1 => |_, n, ws, a, o| unsafe { legacy_rows::<Q5_1>(n, ws, a, o) },
            T::Q8_0 => |_, n, ws, a, o| unsafe { legacy_rows::<Q8_0>(n, ws, a, o) },
            T::IQ4_NL => |_, n, ws, a, o| unsafe { legacy_rows::<Iq4Nl>(n, ws, a, o) },
            _ => return None,
        });
    }
    Some(match w {
        T::Q4_0 => |_, n, ws, a, o| unsafe { legacy_rows_vnni::<Q4_0>(n, ws, a, o) },
        T::Q4_1 => |_, n, ws, a, o| unsafe { legacy_rows_vnni::<Q4_1>(n, ws, a, o) },
        T::Q5_0 => |_, n, ws, a, o| unsafe { legacy_rows_vnni::<Q5_0>(n, ws, a, o) },
        T::Q5_1 => |_, n, ws, a, o| unsafe { legacy_rows_vnni::<Q5_1>(n, ws, a, o) },
        T::Q8_0 => |_, n, ws, a, o| unsafe { legacy_rows_vnni::<Q8_0>(n, ws, a, o) },
        T::IQ4_NL => |_, n, ws, a, o| unsafe { legacy_rows_vnni::<Iq4Nl>(n, ws, a, o) },
        _ => return None,
    })
}

/// The most rows [`rows_fn`]'s kernel for `w` takes (all of them take up to [`super::MAX_ROWS`]).
pub fn max_rows(_w: GgmlType) -> usize {
    super::MAX_ROWS
}

/// AVX-512 VNNI with 256-bit vectors (`vpdpbusd` on ymm): one instruction for the byte products
/// and their sums of four, which ggml also uses when built for such CPUs. `HF2Q_KERNEL=avx2`
/// turns it off.
pub fn vnni() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::env::var("HF2Q_KERNEL").map_or(true, |v| v != "avx2")
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vl")
    })
}

// Callers (`dot_fn` users) guarantee: `super::KernelPath::detect()` returned Avx2 (AVX2, FMA and
// F16C present); `w` holds the row's `n / block` weight blocks and each activation row holds the
// matching activation blocks; `acts.len() == out.len() <= 4`. The kernels check the lengths with
// `assert!` before reading through raw pointers.

/// The f16 at `p` as f32 (F16C). The half goes through `vmovd` from a general register: written
/// with intrinsics, LLVM inserts it with `vpinsrw` into whatever vector register is at hand, and
/// when that register is a loop's accumulator every block's scale waits for the previous block
/// (a false dependency that made the one-row Q4_1 kernel ~1.5x slower).
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = std::ptr::read_unaligned(p as *const u16) as u32;
    let x: __m128i;
    std::arch::asm!(
        "vmovd {x}, {bits:e}",
        x = out(xmm_reg) x,
        bits = in(reg) bits,
        options(pure, nomem, nostack, preserves_flags)
    );
    _mm_cvtss_f32(_mm_cvtph_ps(x))
}

/// Sum of the eight lanes in ggml's order.
///
/// # Safety
/// AVX must be available (call it from AVX2 code).
// ggml-cpu/arch/x86/quants.c: hsum_float_8
#[inline(always)]
pub unsafe fn hsum_f32_8(x: __m256) -> f32 {
    let mut res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    _mm_cvtss_f32(res)
}

/// Signed × signed bytes, pairwise summed to eight i32 lanes, as f32.
#[inline(always)]
unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    let dot = _mm256_maddubs_epi16(ax, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)))
}

/// Unsigned × signed bytes.
#[inline(always)]
unsafe fn mul_sum_us8_pairs_float(ux: __m256i, sy: __m256i) -> __m256 {
    let dot = _mm256_maddubs_epi16(ux, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)))
}

/// 16 bytes of packed nibbles → 32 bytes: low nibbles first, then high nibbles.
#[inline(always)]
unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let bytes = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
    _mm256_and_si256(bytes, _mm256_set1_epi8(0xF))
}

/// 32 bits → 32 bytes, 0xFF where the bit is set.
#[inline(always)]
unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
    let x32 = std::ptr::read_unaligned(p as *const u32) as i32;
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32), shuf);
    let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1))
}

/// How far ahead of the block being multiplied the one-row kernels prefetch weights (bytes).
/// The hardware prefetcher alone leaves a single weight stream short of what one core can
/// pull from memory (`gemv` bench: +5-8 %).
pub(crate) const PF: usize = 2048;

/// Prefetch the cache lines of `len` bytes at `p` (a hint: no fault for addresses past the end).
#[inline(always)]
pub(crate) unsafe fn prefetch_lines(p: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8);
        off += 64;
    }
}

/// A 32-value weight block type multiplied with Q8_0 (or Q8_1 when `UNSIGNED`).
trait Legacy {
    const BYTES: usize;
    const UNSIGNED: bool;
    /// The block's scale is an f32 at its start (the [`super::Unpacked`] layouts) rather than an f16.
    const F32_SCALE: bool = false;
    /// |q| is stored after the quants (the signed unpacked layout), so no kernel computes it.
    const STORED_ABS: bool = false;
    /// The 32 quants (signed, or unsigned with a min), the scale and the min.
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32);
    /// What signed quants are offset by to make them unsigned bytes (0 for the unsigned types).
    const BIAS: u8;
    /// The 32 quants plus [`Self::BIAS`], as unsigned bytes.
    unsafe fn load_biased(p: *const u8) -> __m256i;
}

struct Q4_0;
impl Legacy for Q4_0 {
    const BYTES: usize = 18;
    const UNSIGNED: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        let q = _mm256_sub_epi8(bytes_from_nibbles_32(p.add(2)), _mm256_set1_epi8(8));
        (q, f16_at(p), 0.0)
    }
    const BIAS: u8 = 8;
    #[inline(always)]
    unsafe fn load_biased(p: *const u8) -> __m256i {
        bytes_from_nibbles_32(p.add(2))
    }
}

struct Q4_1;
impl Legacy for Q4_1 {
    const BYTES: usize = 20;
    const UNSIGNED: bool = true;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        (bytes_from_nibbles_32(p.add(4)), f16_at(p), f16_at(p.add(2)))
    }
    const BIAS: u8 = 0;
    #[inline(always)]
    unsafe fn load_biased(p: *const u8) -> __m256i {
        bytes_from_nibbles_32(p.add(4))
    }
}

struct Q5_0;
impl Legacy for Q5_0 {
    const BYTES: usize = 22;
    const UNSIGNED: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        let qx = bytes_from_nibbles_32(p.add(6));
        let hi = _mm256_andnot_si256(bytes_from_bits_32(p.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
        (_mm256_or_si256(qx, hi), f16_at(p), 0.0)
    }
    const BIAS: u8 = 16;
    #[inline(always)]
    unsafe fn load_biased(p: *const u8) -> __m256i {
        _mm256_or_si256(
            bytes_from_nibbles_32(p.add(6)),
            _mm256_and_si256(bytes_from_bits_32(p.add(2)), _mm256_set1_epi8(0x10)),
        )
    }
}

struct Q5_1;
impl Legacy for Q5_1 {
    const BYTES: usize = 24;
    const UNSIGNED: bool = true;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        let qx = bytes_from_nibbles_32(p.add(8));
        let hi = _mm256_and_si256(bytes_from_bits_32(p.add(4)), _mm256_set1_epi8(0x10));
        (_mm256_or_si256(qx, hi), f16_at(p), f16_at(p.add(2)))
    }
    const BIAS: u8 = 0;
    #[inline(always)]
    unsafe fn load_biased(p: *const u8) -> __m256i {
        _mm256_or_si256(
            bytes_from_nibbles_32(p.add(8)),
            _mm256_and_si256(bytes_from_bits_32(p.add(4)), _mm256_set1_epi8(0x10)),
        )
    }
}

struct Q8_0;
impl Legacy for Q8_0 {
    const BYTES: usize = 34;
    const UNSIGNED: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        (_mm256_loadu_si256(p.add(2) as *const __m256i), f16_at(p), 0.0)
    }
    const BIAS: u8 = 128;
    #[inline(always)]
    unsafe fn load_biased(p: *const u8) -> __m256i {
        _mm256_xor_si256(
            _mm256_loadu_si256(p.add(2) as *const __m256i),
            _mm256_set1_epi8(0x80u8 as i8),
        )
    }
}

struct Iq4Nl;
/// IQ4_NL's values plus 128, as unsigned bytes.
const KVALUES_IQ4NL_BIASED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (super::scalar::KVALUES_IQ4NL[i] as i16 + 128) as u8;
        i += 1;
    }
    t
};
impl Legacy for Iq4Nl {
    const BYTES: usize = 18;
    const UNSIGNED: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        let table = _mm_loadu_si128(super::scalar::KVALUES_IQ4NL.as_ptr() as *const __m128i);
        let table = _mm256_broadcastsi128_si256(table);
        (
            _mm256_shuffle_epi8(table, bytes_from_nibbles_32(p.add(2))),
            f16_at(p),
            0.0,
        )
    }
    const BIAS: u8 = 128;
    #[inline(always)]
    unsafe fn load_biased(p: *const u8) -> __m256i {
        {
            let table = _mm_loadu_si128(KVALUES_IQ4NL_BIASED.as_ptr() as *const __m128i);
            _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), bytes_from_nibbles_32(p.add(2)))
        }
    }
}

/// A signed legacy block unpacked to bytes: f32 scale, 32 signed quants, their 32 magnitudes
/// (68 bytes).
struct I8Block;
impl Legacy for I8Block {
    const BYTES: usize = 68;
    const UNSIGNED: bool = false;
    const F32_SCALE: bool = true;
    const STORED_ABS: bool = true;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        let d = std::ptr::read_unaligned(p as *const f32);
        (_mm256_loadu_si256(p.add(4) as *const __m256i), d, 0.0)
    }
    const BIAS: u8 = 128;
    #[inline(always)]
    unsafe fn load_biased(p: *const u8) -> __m256i {
        // The quants sit where a Q8_0 block's would if its f16 scale were an f32.
        Q8_0::load_biased(p.add(2))
    }
}

/// An unsigned legacy block (Q4_1, Q5_1) unpacked to bytes: f32 scale, f32 min, 32 quants
/// (40 bytes).
struct U8Block;
impl Legacy for U8Block {
    const BYTES: usize = 40;
    const UNSIGNED: bool = true;
    const F32_SCALE: bool = true;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        let d = std::ptr::read_unaligned(p as *const f32);
        let m = std::ptr::read_unaligned(p.add(4) as *const f32);
        (_mm256_loadu_si256(p.add(8) as *const __m256i), d, m)
    }
    const BIAS: u8 = 0;
    #[inline(always)]
    unsafe fn load_biased(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p.add(8) as *const __m256i)
    }
}

/// The unpacked form of `w` for batches, on the plain AVX2 path (with VNNI the packed blocks
/// unpack in a few instructions and gain nothing).
pub fn unpacked(w: GgmlType) -> Option<super::Unpacked> {
    use GgmlType as T;
    if vnni() {
        // With VNNI only Q5_0 / Q5_1 gain (their high bits cost more to decode per column group
        // than the unpacked block costs to read); the same integers reach the same f32 operations.
        let signed = |unpack| super::Unpacked {
            block_bytes: I8Block::BYTES,
            unpack,
            dot: |_, n, w, a, o| unsafe { legacy_vnni::<I8Block>(n, w, a, o) },
            rows: |_, n, ws, a, o| unsafe { legacy_rows_vnni::<I8Block>(n, ws, a, o) },
        };
        let unsigned = |unpack| super::Unpacked {
            block_bytes: U8Block::BYTES,
            unpack,
            dot: |_, n, w, a, o| unsafe { legacy_vnni::<U8Block>(n, w, a, o) },
            rows: |_, n, ws, a, o| unsafe { legacy_rows_vnni::<U8Block>(n, ws, a, o) },
        };
        return Some(match w {
            T::Q5_0 => signed(|n, s, d| unsafe { unpack_row::<Q5_0>(n, s, d) }),
            T::Q5_1 => unsigned(|n, s, d| unsafe { unpack_row::<Q5_1>(n, s, d) }),
            _ => return None,
        });
    }
    let signed = |unpack| super::Unpacked {
        block_bytes: I8Block::BYTES,
        unpack,
        dot: |_, n, w, a, o| unsafe { legacy::<I8Block>(n, w, a, o) },
        rows: |_, n, ws, a, o| unsafe { legacy_rows::<I8Block>(n, ws, a, o) },
    };
    let unsigned = |unpack| super::Unpacked {
        block_bytes: U8Block::BYTES,
        unpack,
        dot: |_, n, w, a, o| unsafe { legacy::<U8Block>(n, w, a, o) },
        rows: |_, n, ws, a, o| unsafe { legacy_rows::<U8Block>(n, ws, a, o) },
    };
    Some(match w {
        T::Q4_0 => signed(|n, s, d| unsafe { unpack_row::<Q4_0>(n, s, d) }),
        T::Q8_0 => signed(|n, s, d| unsafe { unpack_row::<Q8_0>(n, s, d) }),
        T::Q5_0 => signed(|n, s, d| unsafe { unpack_row::<Q5_0>(n, s, d) }),
        T::IQ4_NL => signed(|n, s, d| unsafe { unpack_row::<Iq4Nl>(n, s, d) }),
        T::Q4_1 => unsigned(|n, s, d| unsafe { unpack_row::<Q4_1>(n, s, d) }),
        T::Q5_1 => unsigned(|n, s, d| unsafe { unpack_row::<Q5_1>(n, s, d) }),
        _ => return None,
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_row<L: Legacy>(n: usize, src: &[u8], dst: &mut [u8]) {
    let nb = n / 32;
    let out = if L::UNSIGNED { U8Block::BYTES } else { I8Block::BYTES };
    assert!(src.len() >= nb * L::BYTES && dst.len() >= nb * out);
    for b in 0..nb {
        let (q, d, m) = L::load(src.as_ptr().add(b * L::BYTES));
        let o = dst.as_mut_ptr().add(b * out);
        std::ptr::write_unaligned(o as *mut f32, d);
        if L::UNSIGNED {
            std::ptr::write_unaligned(o.add(4) as *mut f32, m);
            _mm256_storeu_si256(o.add(8) as *mut __m256i, q);
        } else {
            _mm256_storeu_si256(o.add(4) as *mut __m256i, q);
            _mm256_storeu_si256(o.add(36) as *mut __m256i, _mm256_sign_epi8(q, q));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy<L: Legacy>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    match acts.len() {
        1 => legacy_cols::<L, 1>(n, w, acts, out),
        2 => legacy_cols::<L, 2>(n, w, acts, out),
        3 => legacy_cols::<L, 3>(n, w, acts, out),
        4 => legacy_cols::<L, 4>(n, w, acts, out),
        _ => panic!("legacy kernel: {} activation rows (1 to 4 supported)", acts.len()),
    }
}

// quants.c: ggml_vec_dot_q4_0_q8_0 / q4_1_q8_1 / q5_0_q8_0 / q5_1_q8_1 / q8_0_q8_0 / iq4_nl_q8_0
#[inline(always)]
unsafe fn legacy_cols<L: Legacy, const C: usize>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    let nb = n / 32;
    let abytes = if L::UNSIGNED { super::ACT_Q8_1 } else { super::ACT_Q8_0 };
    let aoff = if L::UNSIGNED { 8 } else { 4 };
    assert!(w.len() >= nb * L::BYTES && out.len() >= C);
    let mut ap = [std::ptr::null::<u8>(); C];
    for c in 0..C {
        assert!(acts[c].len() >= nb * abytes);
        ap[c] = acts[c].as_ptr();
    }
    let mut acc = [_mm256_setzero_ps(); C];
    let mut summs = [0f32; C];
    let wp = w.as_ptr();
    for b in 0..nb {
        _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(b * L::BYTES + PF) as *const i8);
        let (qx, dx, mx) = L::load(wp.add(b * L::BYTES));
        for c in 0..C {
            let y = ap[c].add(b * abytes);
            let qy = _mm256_loadu_si256(y.add(aoff) as *const __m256i);
            let p = if L::UNSIGNED {
                mul_sum_us8_pairs_float(qx, qy)
            } else {
                mul_sum_i8_pairs_float(qx, qy)
            };
            let dy = std::ptr::read_unaligned(y as *const f32);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dy), p, acc[c]);
            if L::UNSIGNED {
                // ggml's C compiles `summs += m * s` to an FMA (GCC contracts it).
                summs[c] = mx.mul_add(std::ptr::read_unaligned(y.add(4) as *const f32), summs[c]);
            }
        }
    }
    for c in 0..C {
        out[c] = hsum_f32_8(acc[c]) + summs[c];
    }
}

/// A several-row legacy kernel `$f::<L, R, C>` for `R` = 2 or 4 rows and 1 to 4 columns.
macro_rules! legacy_rows_dispatch {
    ($f:ident, $r:literal, $n:expr, $ws:expr, $acts:expr, $out:expr) => {
        match $acts.len() {
            1 => $f::<L, $r, 1>($n, $ws, $acts, $out),
            2 => $f::<L, $r, 2>($n, $ws, $acts, $out),
            3 => $f::<L, $r, 3>($n, $ws, $acts, $out),
            4 => $f::<L, $r, 4>($n, $ws, $acts, $out),
            k => panic!("legacy kernel: {k} activation rows (1 to 4 supported)"),
        }
    };
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy_rows<L: Legacy>(n: usize, ws: &[&[u8]], acts: &[&[u8]], out: &mut [[f32; MAX_COLS]]) {
    match ws.len() {
        // AVX2 has 16 vector registers: four rows by more than two columns would spill the
        // accumulators, so they run as two pairs of rows.
        4 if acts.len() > 2 => {
            let (lo, hi) = out.split_at_mut(2);
            legacy_rows::<L>(n, &ws[..2], acts, lo);
            legacy_rows::<L>(n, &ws[2..], acts, hi);
        }
        4 => legacy_rows_dispatch!(legacy_rows_cols, 4, n, ws, acts, out),
        2 => legacy_rows_dispatch!(legacy_rows_cols, 2, n, ws, acts, out),
        r => panic!("legacy kernel: {r} weight rows (2 or 4 supported)"),
    }
}

/// [`legacy_cols`] for `R` weight rows: every (row, column) result is accumulated block by block
/// exactly as there (the same integers in the same lanes, the same f32 operations in the same
/// order), with R·C independent FMA chains instead of C, each activation block loaded once for
/// the R rows and each weight block unpacked once for the C columns.
#[inline(always)]
unsafe fn legacy_rows_cols<L: Legacy, const R: usize, const C: usize>(
    n: usize,
    ws: &[&[u8]],
    acts: &[&[u8]],
    out: &mut [[f32; MAX_COLS]],
) {
    let nb = n / 32;
    let abytes = if L::UNSIGNED { super::ACT_Q8_1 } else { super::ACT_Q8_0 };
    let aoff = if L::UNSIGNED { 8 } else { 4 };
    assert!(ws.len() == R && out.len() >= R && acts.len() >= C);
    let mut wp = [std::ptr::null::<u8>(); R];
    for r in 0..R {
        assert!(ws[r].len() >= nb * L::BYTES);
        wp[r] = ws[r].as_ptr();
    }
    let mut ap = [std::ptr::null::<u8>(); C];
    for c in 0..C {
        assert!(acts[c].len() >= nb * abytes);
        ap[c] = acts[c].as_ptr();
    }
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut summs = [[0f32; C]; R];
    // The block's scale products dx·dy (the same f32 multiplies, four rows at a time), read back
    // by the FMAs as broadcast loads: no scalar multiply and shuffle per product.
    let mut prod = [[0f32; 4]; C];
    for b in 0..nb {
        let mut qx = [_mm256_setzero_si256(); R];
        let mut ux = [_mm256_setzero_si256(); R];
        let mut mx = [0f32; R];
        for r in 0..R {
            let dx;
            (qx[r], dx, mx[r]) = L::load(wp[r].add(b * L::BYTES));
            let _ = dx;
            // Signed × signed multiplies |x| by sign(x)·y (ggml's mul_sum_i8_pairs_float).
            ux[r] = if L::UNSIGNED {
                qx[r]
            } else if L::STORED_ABS {
                _mm256_loadu_si256(wp[r].add(b * L::BYTES + 36) as *const __m256i)
            } else {
                _mm256_sign_epi8(qx[r], qx[r])
            };
        }
        // Every legacy block starts with its f16 scale (f32 in the unpacked layouts).
        let dxv = if L::F32_SCALE {
            let d = |r: usize| std::ptr::read_unaligned(wp[r.min(R - 1)].add(b * L::BYTES) as *const f32);
            _mm_set_ps(d(3), d(2), d(1), d(0))
        } else {
            let h = |r: usize| std::ptr::read_unaligned(wp[r.min(R - 1)].add(b * L::BYTES) as *const u16) as i16;
            _mm_cvtph_ps(_mm_set_epi16(0, 0, 0, 0, h(3), h(2), h(1), h(0)))
        };
        for c in 0..C {
            let dy = std::ptr::read_unaligned(ap[c].add(b * abytes) as *const f32);
            _mm_storeu_ps(prod[c].as_mut_ptr(), _mm_mul_ps(dxv, _mm_set1_ps(dy)));
        }
        for c in 0..C {
            let y = ap[c].add(b * abytes);
            let qy = _mm256_loadu_si256(y.add(aoff) as *const __m256i);
            for r in 0..R {
                let sy = if L::UNSIGNED { qy } else { _mm256_sign_epi8(qy, qx[r]) };
                let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(ux[r], sy), _mm256_set1_epi16(1)));
                acc[r][c] = _mm256_fmadd_ps(broadcast_load(&prod[c][r]), p, acc[r][c]);
                if L::UNSIGNED {
                    summs[r][c] = mx[r].mul_add(std::ptr::read_unaligned(y.add(4) as *const f32), summs[r][c]);
                }
            }
        }
    }
    for r in 0..R {
        for c in 0..C {
            out[r][c] = hsum_f32_8(acc[r][c]) + summs[r][c];
        }
    }
}

/// `*p` in every lane, as a load (`vbroadcastss ymm, m32`): written with intrinsics, LLVM
/// forwards a value just stored and broadcasts it with shuffles instead.
#[target_feature(enable = "avx")]
#[inline]
unsafe fn broadcast_load(p: *const f32) -> __m256 {
    let v: __m256;
    std::arch::asm!(
        "vbroadcastss {v}, dword ptr [{p}]",
        v = out(ymm_reg) v,
        p = in(reg) p,
        options(pure, readonly, nostack, preserves_flags)
    );
    v
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn legacy_vnni<L: Legacy>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    match acts.len() {
        1 => legacy_vnni_cols::<L, 1>(n, w, acts, out),
        2 => legacy_vnni_cols::<L, 2>(n, w, acts, out),
        3 => legacy_vnni_cols::<L, 3>(n, w, acts, out),
        4 => legacy_vnni_cols::<L, 4>(n, w, acts, out),
        _ => panic!("legacy kernel: {} activation rows (1 to 4 supported)", acts.len()),
    }
}

/// [`legacy_cols`] with `vpdpbusd` for the integer products (the same integers).
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
#[inline]
unsafe fn legacy_vnni_cols<L: Legacy, const C: usize>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    let nb = n / 32;
    let abytes = if L::UNSIGNED { super::ACT_Q8_1 } else { super::ACT_Q8_0 };
    let aoff = if L::UNSIGNED { 8 } else { 4 };
    assert!(w.len() >= nb * L::BYTES && out.len() >= C);
    let mut ap = [std::ptr::null::<u8>(); C];
    for c in 0..C {
        assert!(acts[c].len() >= nb * abytes);
        ap[c] = acts[c].as_ptr();
    }
    let mut acc = [_mm256_setzero_ps(); C];
    let mut summs = [0f32; C];
    let wp = w.as_ptr();
    for b in 0..nb {
        // (As legacy_cols: the one-row kernels prefetch PF bytes ahead.)
        _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(b * L::BYTES + PF) as *const i8);
        let (qx, dx, mx) = L::load(wp.add(b * L::BYTES));
        // Unsigned × signed needs no sign trick; signed × signed multiplies |x| by sign(x)·y.
        let ux = if L::UNSIGNED { qx } else { _mm256_sign_epi8(qx, qx) };
        for c in 0..C {
            let y = ap[c].add(b * abytes);
            let qy = _mm256_loadu_si256(y.add(aoff) as *const __m256i);
            let sy = if L::UNSIGNED { qy } else { _mm256_sign_epi8(qy, qx) };
            let p = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ux, sy));
            let dy = std::ptr::read_unaligned(y as *const f32);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dy), p, acc[c]);
            if L::UNSIGNED {
                summs[c] = mx.mul_add(std::ptr::read_unaligned(y.add(4) as *const f32), summs[c]);
            }
        }
    }
    for c in 0..C {
        out[c] = hsum_f32_8(acc[c]) + summs[c];
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl")]
unsafe fn legacy_rows_vnni<L: Legacy>(n: usize, ws: &[&[u8]], acts: &[&[u8]], out: &mut [[f32; MAX_COLS]]) {
    match ws.len() {
        2 => legacy_rows_dispatch!(legacy_rows_vnni_cols, 2, n, ws, acts, out),
        4 => legacy_rows_dispatch!(legacy_rows_vnni_cols, 4, n, ws, acts, out),
        r => panic!("legacy kernel: {r} weight rows (2 or 4 supported)"),
    }
}

/// [`legacy_vnni_cols`] for `R` weight rows: every (row, column) result is accumulated block by
/// block exactly as there (the same integers in the same lanes, the same f32 operations in the
/// same order), with R·C independent chains; each weight block is unpacked once for the C columns
/// and each activation block loaded once for the R rows.
///
/// Three vector operations per (row, column, block) instead of five: signed quants are offset to
/// unsigned bytes (q + BIAS) so `vpdpbusd` needs no sign trick, starting from −BIAS·Σ(4 y) per
/// lane (computed once per activation block) to give exactly ggml's lane sums; the scale products
/// dx·dy (the same f32 multiplies) are computed four at a time for a chunk of blocks ahead of the
/// integer work and reach the FMA as a broadcast memory operand, so no FMA waits on them.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl")]
#[inline]
unsafe fn legacy_rows_vnni_cols<L: Legacy, const R: usize, const C: usize>(
    n: usize,
    ws: &[&[u8]],
    acts: &[&[u8]],
    out: &mut [[f32; MAX_COLS]],
) {
    let nb = n / 32;
    let abytes = if L::UNSIGNED { super::ACT_Q8_1 } else { super::ACT_Q8_0 };
    let aoff = if L::UNSIGNED { 8 } else { 4 };
    assert!(ws.len() == R && out.len() >= R && acts.len() >= C && C <= 4);
    let mut wp = [std::ptr::null::<u8>(); R];
    for r in 0..R {
        assert!(ws[r].len() >= nb * L::BYTES);
        wp[r] = ws[r].as_ptr();
    }
    let mut ap = [std::ptr::null::<u8>(); 4];
    for c in 0..4 {
        // Missing columns repeat the last one (their results are dropped).
        let a = acts[c.min(C - 1)];
        assert!(a.len() >= nb * abytes);
        ap[c] = a.as_ptr();
    }
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut summs = [_mm_setzero_ps(); R];
    let bias = _mm256_set1_epi8(L::BIAS as i8);
    // Scale products dx·dy of a chunk of blocks, computed ahead of the integer work so that the
    // FMAs never wait on them: chunk block i, column c, row r at [i][4c + r].
    const CHUNK: usize = 32;
    // Every entry read is written first in its chunk's first pass.
    // (One 64-byte line per block: 16 f32.)
    let mut prod = std::mem::MaybeUninit::<[__m512; CHUNK]>::uninit();
    let prod = prod.as_mut_ptr() as *mut f32;
    for b0 in (0..nb).step_by(CHUNK) {
        let b1 = (b0 + CHUNK).min(nb);
        for b in b0..b1 {
            let y = ap.map(|p| p.add(b * abytes));
            let x: [*const u8; 4] = std::array::from_fn(|r| wp[r.min(R - 1)].add(b * L::BYTES));
            let h = |p: *const u8| std::ptr::read_unaligned(p as *const u16) as i16;
            let f = |p: *const u8| std::ptr::read_unaligned(p as *const f32);
            // The f16 scale of a block, or the f32 it was widened to in the unpacked layouts.
            let dx = if L::F32_SCALE {
                _mm_set_ps(f(x[3]), f(x[2]), f(x[1]), f(x[0]))
            } else {
                _mm_cvtph_ps(_mm_set_epi16(0, 0, 0, 0, h(x[3]), h(x[2]), h(x[1]), h(x[0])))
            };
            let pb = prod.add(16 * (b - b0));
            for (c, &yc) in y.iter().enumerate().take(C) {
                let dy = _mm_set1_ps(std::ptr::read_unaligned(yc as *const f32));
                _mm_store_ps(pb.add(4 * c), _mm_mul_ps(dx, dy));
            }
            if L::UNSIGNED {
                // ggml's `summs += m * s`, an FMA in its build; one lane per column.
                let s = _mm_set_ps(
                    std::ptr::read_unaligned(y[3].add(4) as *const f32),
                    std::ptr::read_unaligned(y[2].add(4) as *const f32),
                    std::ptr::read_unaligned(y[1].add(4) as *const f32),
                    std::ptr::read_unaligned(y[0].add(4) as *const f32),
                );
                for r in 0..R {
                    let m = if L::F32_SCALE {
                        f(x[r].add(4))
                    } else {
                        f16_at(x[r].add(2))
                    };
                    summs[r] = _mm_fmadd_ps(_mm_set1_ps(m), s, summs[r]);
                }
            }
        }
        for b in b0..b1 {
            let y = ap.map(|p| p.add(b * abytes));
            let mut u = [_mm256_setzero_si256(); R];
            for r in 0..R {
                u[r] = L::load_biased(wp[r].add(b * L::BYTES));
            }
            let pb = prod.add(16 * (b - b0)) as *const f32;
            for c in 0..C {
                let qy = _mm256_loadu_si256(y[c].add(aoff) as *const __m256i);
                let start = if L::BIAS == 0 {
                    _mm256_setzero_si256()
                } else {
                    _mm256_sub_epi32(
                        _mm256_setzero_si256(),
                        _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, qy),
                    )
                };
                for r in 0..R {
                    let p = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(start, u[r], qy));
                    acc[r][c] = fmadd_broadcast(acc[r][c], p, pb.add(4 * c + r));
                }
            }
        }
    }
    for r in 0..R {
        let mut s = [0f32; 4];
        _mm_storeu_ps(s.as_mut_ptr(), summs[r]);
        for c in 0..C {
            out[r][c] = hsum_f32_8(acc[r][c]) + s[c];
        }
    }
}

/// `acc + p · *s` (every lane), with the broadcast folded into the FMA's memory operand
/// (`vfmadd231ps ymm, ymm, m32{1to8}`): no shuffle per product.
///
/// # Safety
/// AVX-512VL present; `s` readable.
#[target_feature(enable = "avx512f,avx512vl")]
#[inline]
unsafe fn fmadd_broadcast(acc: __m256, p: __m256, s: *const f32) -> __m256 {
    let mut a = acc;
    std::arch::asm!(
        "vfmadd231ps {a:y}, {p:y}, dword ptr [{s}]{{1to8}}",
        a = inout(zmm_reg) a,
        p = in(zmm_reg) p,
        s = in(reg) s,
        options(pure, readonly, nostack, preserves_flags)
    );
    a
}

/// Q8_K block layout: d (f32) at 0, 256 quants at 4, 16 i16 sums at 260.
const Q8K: usize = 292;

macro_rules! dispatch_q6k {
    ($f:ident, $whole:expr, $n:expr, $w:expr, $acts:expr, $out:expr) => {
        match $acts.len() {
            1 => $f::<1, $whole>($n, $w, $acts, $out),
            2 => $f::<2, $whole>($n, $w, $acts, $out),
            3 => $f::<3, $whole>($n, $w, $acts, $out),
            4 => $f::<4, $whole>($n, $w, $acts, $out),
            k => panic!("k-quant kernel: {k} activation rows (1 to 4 supported)"),
        }
    };
}

/// The eight 6-bit scales and eight 6-bit mins of Q4_K/Q5_K as bytes: (scales, mins), unpacked
/// with 32-bit masks (the layout `get_scale_min_k4` reads one value at a time).
#[inline(always)]
unsafe fn unpack_scales_k4(p: *const u8) -> ([u8; 8], [u8; 8]) {
    const M1: u32 = 0x3f3f3f3f;
    const M2: u32 = 0x0f0f0f0f;
    const M3: u32 = 0x03030303;
    let u0 = std::ptr::read_unaligned(p as *const u32);
    let u1 = std::ptr::read_unaligned(p.add(4) as *const u32);
    let u2 = std::ptr::read_unaligned(p.add(8) as *const u32);
    let sc_lo = u0 & M1;
    let sc_hi = (u2 & M2) | (((u0 >> 6) & M3) << 4);
    let mn_lo = u1 & M1;
    let mn_hi = ((u2 >> 4) & M2) | (((u1 >> 6) & M3) << 4);
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    sc[..4].copy_from_slice(&sc_lo.to_le_bytes());
    sc[4..].copy_from_slice(&sc_hi.to_le_bytes());
    mn[..4].copy_from_slice(&mn_lo.to_le_bytes());
    mn[4..].copy_from_slice(&mn_hi.to_le_bytes());
    (sc, mn)
}

/// The eight sums of pairs of a Q8_K block's 16-value sums (`y` at the block): with the eight
/// mins as i16, `madd` gives Σ_k mins[k] · (bsums[2k] + bsums[2k+1]) in four i32 lanes.
#[inline(always)]
unsafe fn bsum_pairs(y: *const u8) -> __m128i {
    let bs = _mm256_loadu_si256(y.add(260) as *const __m256i);
    _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1))
}

#[inline(always)]
unsafe fn hsum_f32_4(x: __m128) -> f32 {
    let r = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

/// A Q4_K/Q5_K kernel for one weight row and `acts.len()` columns.
macro_rules! dispatch_k4 {
    ($f:ident, $n:expr, $w:expr, $acts:expr, $out:expr) => {
        match $acts.len() {
            1 => $f::<1>($n, $w, $acts, $out),
            2 => $f::<2>($n, $w, $acts, $out),
            3 => $f::<3>($n, $w, $acts, $out),
            4 => $f::<4>($n, $w, $acts, $out),
            k => panic!("k-quant kernel: {k} activation rows (1 to 4 supported)"),
        }
    };
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    dispatch_k4!(q4k_cols, n, w, acts, out)
}

/// Q4_K (d, dmin, 12 bytes of scales/mins, 128 bytes of nibbles) and Q5_K (the same plus 32 bytes
/// of fifth bits before the nibbles): one body; instantiations differ in how a block's 32-value
/// chunks unpack and how scaled products accumulate (the same integers either way). ggml's
/// vec_dot order: eight f32 lanes of block sums, four of min terms, reduced at the end. (Q4_K
/// matrices llama.cpp repacks take `super::packed` instead.)
// quants.c: ggml_vec_dot_q4_K_q8_K, ggml_vec_dot_q5_K_q8_K
macro_rules! k4_kernel {
    ($(#[$m:meta])* $name:ident, $bytes:expr, $unpack:expr, $acc:expr) => {
        $(#[$m])*
        unsafe fn $name<const C: usize>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
            let nb = n / 256;
            assert!(w.len() >= nb * $bytes && out.len() >= C);
            for a in &acts[..C] {
                assert!(a.len() >= nb * Q8K);
            }
            let mut acc = [_mm256_setzero_ps(); C];
            let mut accm = [_mm_setzero_ps(); C];
            for b in 0..nb {
                let x = w.as_ptr().add(b * $bytes);
                prefetch_lines(x.wrapping_add(PF), $bytes);
                let (dx, dmx) = (f16_at(x), f16_at(x.add(2)));
                let (sc, mins) = unpack_scales_k4(x.add(4));
                let mut sumi = [_mm256_setzero_si256(); C];
                for j in 0..4 {
                    let (lo, hi) = $unpack(x, j);
                    let sl = _mm256_set1_epi16(sc[2 * j] as i16);
                    let sh = _mm256_set1_epi16(sc[2 * j + 1] as i16);
                    for c in 0..C {
                        let y = acts[c].as_ptr().add(b * Q8K + 4 + 64 * j);
                        let yl = _mm256_loadu_si256(y as *const __m256i);
                        let yh = _mm256_loadu_si256(y.add(32) as *const __m256i);
                        let pl = _mm256_maddubs_epi16(lo, yl);
                        let ph = _mm256_maddubs_epi16(hi, yh);
                        sumi[c] = $acc(sumi[c], pl, sl, ph, sh);
                    }
                }
                let mn = _mm_cvtepu8_epi16(_mm_loadl_epi64(mins.as_ptr() as *const __m128i));
                for c in 0..C {
                    let y = acts[c].as_ptr().add(b * Q8K);
                    let dy = std::ptr::read_unaligned(y as *const f32);
                    acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dy * dx), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
                    let mp = _mm_madd_epi16(mn, bsum_pairs(y));
                    accm[c] = _mm_fmadd_ps(_mm_set1_ps(dy * dmx), _mm_cvtepi32_ps(mp), accm[c]);
                }
            }
            for c in 0..C {
                out[c] = hsum_f32_8(acc[c]) - hsum_f32_4(accm[c]);
            }
        }
    };
}

/// Chunk `j` of a Q4_K block: low and high nibbles.
#[inline(always)]
unsafe fn q4k_chunk(x: *const u8, j: usize) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi8(0xF);
    let bits = _mm256_loadu_si256(x.add(16 + 32 * j) as *const __m256i);
    (
        _mm256_and_si256(bits, m4),
        _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
    )
}

/// Chunk `j` of a Q5_K block: nibbles with their fifth bits (bits 2j and 2j+1 of each byte).
#[inline(always)]
unsafe fn q5k_chunk(x: *const u8, j: usize) -> (__m256i, __m256i) {
    let (m4, one) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(1));
    let hbits = _mm256_loadu_si256(x.add(16) as *const __m256i);
    let bits = _mm256_loadu_si256(x.add(48 + 32 * j) as *const __m256i);
    let hl = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j as i32)), one);
    let hh = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j as i32 + 1)), one);
    let lo = _mm256_or_si256(_mm256_and_si256(bits, m4), _mm256_slli_epi16(hl, 4));
    let hi = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
        _mm256_slli_epi16(hh, 4),
    );
    (lo, hi)
}

/// `s + pl·sl + ph·sh` in i32 lanes (madd).
#[inline(always)]
unsafe fn scaled_add(s: __m256i, pl: __m256i, sl: __m256i, ph: __m256i, sh: __m256i) -> __m256i {
    _mm256_add_epi32(
        s,
        _mm256_add_epi32(_mm256_madd_epi16(pl, sl), _mm256_madd_epi16(ph, sh)),
    )
}

k4_kernel!(
    #[inline(always)]
    q4k_cols,
    144,
    q4k_chunk,
    scaled_add
);
k4_kernel!(
    #[inline(always)]
    q5k_cols,
    176,
    q5k_chunk,
    scaled_add
);
k4_kernel!(
    /// [`q4k_cols`] with `vpdpwssd` folding the scale multiply and the accumulation.
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    #[inline]
    q4k_vnni_cols,
    144,
    q4k_chunk,
    |s, pl, sl, ph, sh| _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(s, pl, sl), ph, sh)
);

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn q4k_vnni(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    dispatch_k4!(q4k_vnni_cols, n, w, acts, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5k(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    dispatch_k4!(q5k_cols, n, w, acts, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    dispatch_q6k!(q6k_cols, false, n, w, acts, out)
}

/// Q6_K: 128 bytes low nibbles, 64 bytes of 2-bit highs, 16 i8 scales, d (f16).
// quants.c: ggml_vec_dot_q6_K_q8_K — unsigned 6-bit quants times activations, scaled per 16, and
// the offset 32 removed at the end as 32 × Σ scale × bsum, lane by lane as ggml does (the lane
// split decides the f32 rounding).
macro_rules! q6k_kernel {
    ($(#[$m:meta])* $name:ident, $acc:expr) => {
        $(#[$m])*
        /// `WHOLE`: the order of llama.cpp's tiled K-quant matmul (`ggml-cpu/tiled/tiled-kernel.cpp`,
        /// which it uses for batches of 8 or more rows): per block the exact integer sum of all
        /// lanes times d, then an FMA with dy into one f32 per column. Otherwise ggml's vec_dot lanes.
        unsafe fn $name<const C: usize, const WHOLE: bool>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
            let nb = n / 256;
            assert!(w.len() >= nb * 210 && out.len() >= C);
            for a in &acts[..C] {
                assert!(a.len() >= nb * Q8K);
            }
            let mut acc = [_mm256_setzero_ps(); C];
            let mut whole = [0f32; C];
            let m4 = _mm256_set1_epi8(0xF);
            let m2 = _mm256_set1_epi8(3);
            for b in 0..nb {
                let x = w.as_ptr().add(b * 210);
                prefetch_lines(x.wrapping_add(PF), 210);
                let dx = f16_at(x.add(208));
                let sc = x.add(192) as *const i8;
                let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc as *const __m128i));
                let mut sumi = [_mm256_setzero_si256(); C];
                for half in 0..2 {
                    let b1 = _mm256_loadu_si256(x.add(64 * half) as *const __m256i);
                    let b2 = _mm256_loadu_si256(x.add(64 * half + 32) as *const __m256i);
                    let bh = _mm256_loadu_si256(x.add(128 + 32 * half) as *const __m256i);
                    let q = [
                        _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_slli_epi16(_mm256_and_si256(bh, m2), 4)),
                        _mm256_or_si256(
                            _mm256_and_si256(b2, m4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 2), m2), 4),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 4), m2), 4),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 6), m2), 4),
                        ),
                    ];
                    let mut scv = [_mm256_setzero_si256(); 4];
                    for (k, s) in scv.iter_mut().enumerate() {
                        let lo = *sc.add(8 * half + 2 * k) as i16;
                        let hi = *sc.add(8 * half + 2 * k + 1) as i16;
                        *s = _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo));
                    }
                    for c in 0..C {
                        let y = acts[c].as_ptr().add(b * Q8K + 4 + 128 * half);
                        for k in 0..4 {
                            let q8 = _mm256_loadu_si256(y.add(32 * k) as *const __m256i);
                            sumi[c] = $acc(sumi[c], _mm256_maddubs_epi16(q[k], q8), scv[k]);
                        }
                    }
                }
                for c in 0..C {
                    let y = acts[c].as_ptr().add(b * Q8K);
                    let bsums = _mm256_loadu_si256(y.add(260) as *const __m256i);
                    let corr = _mm256_slli_epi32(_mm256_madd_epi16(bsums, scales16), 5);
                    let dy = std::ptr::read_unaligned(y as *const f32);
                    let si = _mm256_sub_epi32(sumi[c], corr);
                    if WHOLE {
                        let h = _mm_add_epi32(_mm256_castsi256_si128(si), _mm256_extracti128_si256(si, 1));
                        let h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
                        let h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 1));
                        let r = _mm_cvtsi128_si32(h) as f32 * dx;
                        whole[c] = r.mul_add(dy, whole[c]);
                    } else {
                        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dy * dx), _mm256_cvtepi32_ps(si), acc[c]);
                    }
                }
            }
            for c in 0..C {
                out[c] = if WHOLE { whole[c] } else { hsum_f32_8(acc[c]) };
            }
        }
    };
}

q6k_kernel!(
    #[inline(always)]
    q6k_cols,
    |s, p, sc| _mm256_add_epi32(s, _mm256_madd_epi16(sc, p))
);
q6k_kernel!(
    /// [`q6k_cols`] with `vpdpwssd` (the same integers in the same lanes).
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    #[inline]
    q6k_vnni_cols,
    |s, p, sc| _mm256_dpwssd_epi32(s, p, sc)
);

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn q6k_vnni(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    dispatch_q6k!(q6k_vnni_cols, false, n, w, acts, out)
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn q6k_vnni_whole(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    dispatch_q6k!(q6k_vnni_cols, true, n, w, acts, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_whole(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    dispatch_q6k!(q6k_cols, true, n, w, acts, out)
}

/// Kernels for batches of at least [`BATCH_MIN`] activation rows where llama.cpp sums in
/// another order than its vec_dot (its tiled K-quant matmul, `ggml-cpu/tiled`): Q6_K.
pub fn batch_fn(w: GgmlType) -> Option<DotFn> {
    Some(match w {
        GgmlType::Q6_K if vnni() => |_, n, w, a, o| unsafe { q6k_vnni_whole(n, w, a, o) },
        GgmlType::Q6_K => |_, n, w, a, o| unsafe { q6k_whole(n, w, a, o) },
        _ => return None,
    })
}

/// llama.cpp's tiled matmul takes batches of this many rows or more (`ggml_tiled_min_batch`).
pub const BATCH_MIN: usize = 8;

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_dot(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    assert!(w.len() >= 4 * n);
    let wp = w.as_ptr() as *const f32;
    for (o, a) in out.iter_mut().zip(acts) {
        assert!(a.len() >= 4 * n);
        let ap = a.as_ptr() as *const f32;
        let mut acc = [_mm256_setzero_ps(); 4];
        let n32 = n / 32 * 32;
        let mut i = 0;
        while i < n32 {
            for (k, s) in acc.iter_mut().enumerate() {
                let x = _mm256_loadu_ps(wp.add(i + 8 * k));
                *s = _mm256_fmadd_ps(x, _mm256_loadu_ps(ap.add(i + 8 * k)), *s);
            }
            i += 32;
        }
        let mut s = hsum_f32_8(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        for j in n32..n {
            s += std::ptr::read_unaligned(wp.add(j)) * std::ptr::read_unaligned(ap.add(j));
        }
        *o = s;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_dot(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    assert!(w.len() >= 2 * n);
    for (o, a) in out.iter_mut().zip(acts) {
        assert!(a.len() >= 2 * n);
        *o = f16_dot_one(n, w.as_ptr(), a.as_ptr());
    }
}

/// Dot product of two f16 rows in the order of ggml's AVX-512 `ggml_vec_dot_f16` (vec.cpp with
/// simd-mappings.h GGML_F32x16_REDUCE): four 16-lane FMA accumulators over 64-value steps, reduced
/// pairwise ((0+2)+(1+3)), then the 16 lanes as `_mm512_reduce_add_ps` adds them; the tail is
/// summed in f64. Emulated with pairs of 8-lane registers.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `x` and `y` point to `n` f16 values each.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_dot_one(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (xv, yv) = (x as *const __m128i, y as *const __m128i);
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    let n64 = n / 64 * 64;
    let mut i = 0;
    while i < n64 {
        for (j, a) in acc.iter_mut().enumerate() {
            for (h, lane) in a.iter_mut().enumerate() {
                let k = (i + 16 * j + 8 * h) / 8;
                let p = _mm256_cvtph_ps(_mm_loadu_si128(xv.add(k)));
                let q = _mm256_cvtph_ps(_mm_loadu_si128(yv.add(k)));
                *lane = _mm256_fmadd_ps(p, q, *lane);
            }
        }
        i += 64;
    }
    let mut sum = 0f64;
    if n64 > 0 {
        let v = |h: usize| _mm256_add_ps(_mm256_add_ps(acc[0][h], acc[2][h]), _mm256_add_ps(acc[1][h], acc[3][h]));
        sum = hsum_f32_8(_mm256_add_ps(v(1), v(0))) as f64;
    }
    let (xb, yb) = (x as *const u16, y as *const u16);
    for j in n64..n {
        let p = crate::fp::f16_to_f32(std::ptr::read_unaligned(xb.add(j)))
            * crate::fp::f16_to_f32(std::ptr::read_unaligned(yb.add(j)));
        sum += p as f64;
    }
    sum as f32
}

/// f32 → f16 with F16C (round to nearest even).
///
/// # Safety
/// F16C must be available; `dst` holds `2 * src.len()` bytes.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn f32_to_f16_row(src: &[f32], dst: &mut [u8]) {
    assert!(dst.len() >= 2 * src.len());
    let n8 = src.len() / 8 * 8;
    let d = dst.as_mut_ptr() as *mut __m128i;
    for i in (0..n8).step_by(8) {
        let h = _mm256_cvtps_ph(_mm256_loadu_ps(src.as_ptr().add(i)), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(d.add(i / 8), h);
    }
    for i in n8..src.len() {
        let h = _mm_cvtps_ph(_mm_set_ss(src[i]), _MM_FROUND_TO_NEAREST_INT);
        let v = _mm_extract_epi16(h, 0) as u16;
        dst[2 * i..2 * i + 2].copy_from_slice(&v.to_le_bytes());
    }
}

/// f16 → f32 with F16C.
///
/// # Safety
/// F16C must be available; `src` holds `2 * dst.len()` bytes.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn f16_to_f32_row(src: &[u8], dst: &mut [f32]) {
    assert!(src.len() >= 2 * dst.len());
    let n8 = dst.len() / 8 * 8;
    let s = src.as_ptr() as *const __m128i;
    for i in (0..n8).step_by(8) {
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(_mm_loadu_si128(s.add(i / 8))));
    }
    for i in n8..dst.len() {
        dst[i] = crate::fp::f16_to_f32(u16::from_le_bytes([src[2 * i], src[2 * i + 1]]));
    }
}

/// One Q8_0/Q8_1 activation block in hf2q's layout (see `super::quantize_act`), vectorised:
/// the same amax, `127/amax` scale, nearest-even rounding and f16-rounded scales.
///
/// # Safety
/// AVX2 must be available; `x` holds 32 values and `y` at least 36 (40 with `sum`) bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8_block(x: &[f32], y: &mut [u8], sum: bool) {
    assert!(x.len() >= 32 && y.len() >= if sum { 40 } else { 36 });
    let p = x.as_ptr();
    let v = [
        _mm256_loadu_ps(p),
        _mm256_loadu_ps(p.add(8)),
        _mm256_loadu_ps(p.add(16)),
        _mm256_loadu_ps(p.add(24)),
    ];
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_andnot_ps(sign, v[0]);
    for vv in &v[1..] {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vv));
    }
    let mut m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    let amax = _mm_cvtss_f32(m4);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mul = _mm256_set1_ps(id);
    let mut i = [_mm256_setzero_si256(); 4];
    for k in 0..4 {
        i[k] = _mm256_cvtps_epi32(_mm256_round_ps(
            _mm256_mul_ps(v[k], mul),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        ));
    }
    let dh = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(d), _MM_FROUND_TO_NEAREST_INT)));
    std::ptr::write_unaligned(y.as_mut_ptr() as *mut f32, dh);
    let off = if sum { 8 } else { 4 };
    if sum {
        let s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        let s4 = _mm_add_epi32(_mm256_extracti128_si256(s, 1), _mm256_castsi256_si128(s));
        let s4 = _mm_hadd_epi32(s4, s4);
        let s4 = _mm_hadd_epi32(s4, s4);
        let total = _mm_cvtsi128_si32(s4) as f32;
        let sv = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(
            _mm_set_ss(d * total),
            _MM_FROUND_TO_NEAREST_INT,
        )));
        std::ptr::write_unaligned(y.as_mut_ptr().add(4) as *mut f32, sv);
    }
    // Pack 32 i32 → 32 i8 in order (packs interleave 128-bit lanes; permute restores order).
    let a = _mm256_packs_epi32(i[0], i[1]);
    let b = _mm256_packs_epi32(i[2], i[3]);
    let q = _mm256_packs_epi16(a, b);
    let q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(y.as_mut_ptr().add(off) as *mut __m256i, q);
}

/// One Q8_K activation block (d f32, 256 i8 quants, 16 i16 sums) with the numbers of
/// `quantize_row_q8_K_ref` (`ggml-quants.c`): the value of largest magnitude (the first of
/// equals) sets `iscale = -127/max`, quants are `nearest_int(iscale·x)` capped at 127 (the
/// magic-number rounding, half to even, which `vcvtps2dq` also does for these magnitudes).
///
/// # Safety
/// AVX2 present.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8k_block(x: &[f32], y: &mut [u8]) {
    assert!(x.len() >= 256 && y.len() >= Q8K);
    let p = x.as_ptr();
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for i in (0..256).step_by(8) {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(i))));
    }
    let amax = hsum_max_8(m);
    if amax == 0.0 {
        y[..Q8K].fill(0);
        return;
    }
    // The first value whose magnitude is amax (the scalar loop keeps the first strict maximum).
    let max = x[..256].iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
    let iscale = -127.0 / max;
    let iv = _mm256_set1_ps(iscale);
    let cap = _mm256_set1_epi32(127);
    let qs = y.as_mut_ptr().add(4);
    for i in (0..256).step_by(32) {
        let q: [__m256i; 4] = std::array::from_fn(|k| {
            _mm256_min_epi32(
                _mm256_cvtps_epi32(_mm256_mul_ps(iv, _mm256_loadu_ps(p.add(i + 8 * k)))),
                cap,
            )
        });
        // i32 → i16 → i8 (saturation cannot trigger: |q| ≤ 127), then undo the lane interleave.
        let w = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qs.add(i) as *mut __m256i, w);
    }
    for k in 0..16 {
        let q = &*(qs.add(16 * k) as *const [i8; 16]);
        let sum: i32 = q.iter().map(|&v| v as i32).sum();
        y[260 + 2 * k..262 + 2 * k].copy_from_slice(&(sum as i16).to_le_bytes());
    }
    y[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

#[inline(always)]
unsafe fn hsum_max_8(x: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}
