// Integer matrix products on the tensor cores for Q4_K, Q6_K and Q8_0 weights, for any number of
// activation rows (decode steps of one or many sequences, prompt chunks): out (t, m) = x · Wᵀ with
// x quantized to int8 (common.cuh: act_q8, the CPU backend's activation numbers) and W in its
// GGUF type. The integer products run on mma.sync (m16n8k32 / m16n8k16, s8 × s8 → s32: exact), so
// each block's integer sum is the CPU's; the scales are applied in f32.
//
// Weights are kept in a tiled layout made once at load (`tile_*` below): tiles of 16 rows, and per
// tile one "unit" of 256 values of each row after another (a K-quant superblock, or eight Q8_0
// blocks; rows padded with zero units). A tile's unit is one contiguous blob of the same bytes as
// the 16 rows' blocks, reordered so that lane (g = lane / 4, tig = lane % 4) of a warp finds its
// mma A fragments (rows g and g + 8) in consecutive 16-byte words. A warp copies a blob into its
// shared memory with 16-byte cp.async (three or four in flight), then multiplies it by its
// activation columns (8 per n-tile, NT n-tiles, read from L1/L2).
//
// A block is four warps on one tile (16 weight rows) and NT·8 activation rows; warp w takes the
// units [w·U/4, (w+1)·U/4) of the row (U units), summing them in order, and the four parts are
// added as ((p0 + p1) + p2) + p3. Every output is made by the same operations whatever t, NT and
// the output's place in the launch are, so a row's product never depends on the other rows.

__device__ __forceinline__ void mma_k32(int c[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_k16(int c[4], u32 a0, u32 a1, u32 b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

// Byte i (0..3) of w.
__device__ __forceinline__ int byte_of(u32 w, int i) { return (w >> (8 * i)) & 0xFF; }
__device__ __forceinline__ u32 comp(uint4 v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// A block's activation columns: int8 rows of n_pad values (common.cuh: act_q8's layout) and
// their per-32 scales; columns past t read the last row (their outputs are not written).
struct Act {
    const i8* q;
    const float* dp;
    int n_pad, c0, t, g, tig;
    // B fragment of block j of unit u for n-tile nt (column c0 + nt·8 + g): values tig·4 .. +3
    // and 16 + tig·4 .. +3 of the block.
    __device__ __forceinline__ uint2 b(int nt, int u, int j) const {
        int col = min(c0 + nt * 8 + g, t - 1);
        return *(const uint2*)(q + (u64)col * n_pad + u * 256 + tig * 64 + j * 8);
    }
    // Scale of block j of unit u for the output column 2·tig + which of n-tile nt.
    __device__ __forceinline__ float d(int nt, int which, int u, int j) const {
        int col = min(c0 + nt * 8 + 2 * tig + which, t - 1);
        return d_at(col, u * 8 + j);
    }
    __device__ __forceinline__ float d_at(int col, int blk) const { return dp[(u64)col * (n_pad >> 5) + blk]; }
};

// An integer of magnitude below 2^22 as f32, exactly, through the f32 adder (I2F runs at a
// fraction of the FMA rate).
__device__ __forceinline__ float i2f(int i) { return __fsub_rn(__int_as_float(0x4B400000 + i), 12582912.f); }

// A 16-byte word of a tile's unit: from shared memory (GL false), or from global memory without
// keeping it in the L1 (a one-row product reads each weight byte once).
template <bool GL>
__device__ __forceinline__ uint4 ld_w(const u8* p) {
    if constexpr (GL) {
        uint4 v;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
        return v;
    } else {
        return *(const uint4*)p;
    }
}
template <bool GL>
__device__ __forceinline__ u32 ld_w32(const u8* p) {
    if constexpr (GL) {
        u32 v;
        asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
        return v;
    } else {
        return *(const u32*)p;
    }
}

// Per weight type: bytes of a tile's unit (UB), cp.async stages, and the unit's product.
template <int TY> struct MQ;

// Q4_K blob (2304 bytes): d|dmin of each row (u32, 16 × 4), the rows' 12 packed scale bytes
// (16 × 12), then the quants as [pair i (4)][lane (32)][4 words]: lane (g, tig) holds words tig
// and 4 + tig of the 32 quant bytes of pair i (sub-blocks 2i in the low nibbles, 2i + 1 in the
// high ones) of row g, then of row g + 8, in A-fragment order (row g, row g + 8, row g + 16 values
// on, row g + 8 + 16 values on).
template <> struct MQ<TY_Q4_K> {
    static const int UB = 2304, STAGES = 4;
    // Sub-block j's 6-bit scale and min of a row from its packed bytes (get_scale_min_k4) as four
    // bytes per word: sc[0] j 0..3, sc[1] j 4..7, mn likewise.
    struct Scales { u32 sc[2], mn[2]; };
    static __device__ __forceinline__ Scales scales(const u8* p) {
        const u32* s = (const u32*)p;
        return scales_w(s[0], s[1], s[2]);
    }
    static __device__ __forceinline__ Scales scales_w(u32 s0, u32 s1, u32 s2) {
        Scales r;
        r.sc[0] = s0 & 0x3F3F3F3Fu;
        r.mn[0] = s1 & 0x3F3F3F3Fu;
        r.sc[1] = (s2 & 0x0F0F0F0Fu) | (((s0 >> 6) & 0x03030303u) << 4);
        r.mn[1] = ((s2 >> 4) & 0x0F0F0F0Fu) | (((s1 >> 6) & 0x03030303u) << 4);
        return r;
    }
    // Per unit and output: s1 = Σ_j sc_j·(Σ q·x over sub-block j), cm = Σ_j m_j·(Σ x over j), both
    // exact; then the unit adds dx·d·s1 - dx·dmin·cm (f32, in that order) to the output's part.
    template <int NT>
    static __device__ __forceinline__ void unit(const u8* s, const Act& x, int u, int lane, float acc[NT][4]) {
        int g = lane >> 2;
        u32 dm[2] = {*(const u32*)(s + 4 * g), *(const u32*)(s + 4 * (g + 8))};
        Scales sr[2] = {scales(s + 64 + 12 * g), scales(s + 64 + 12 * (g + 8))};
        int s1[NT][4], cm[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s1[nt][e] = cm[nt][e] = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint4 w = *(const uint4*)(s + 256 + (j >> 1) * 512 + lane * 16);
            int sh = 4 * (j & 1);
            u32 a0 = (w.x >> sh) & 0x0F0F0F0Fu, a1 = (w.y >> sh) & 0x0F0F0F0Fu;
            u32 a2 = (w.z >> sh) & 0x0F0F0F0Fu, a3 = (w.w >> sh) & 0x0F0F0F0Fu;
            int sg = byte_of(sr[0].sc[j >> 2], j & 3), sg8 = byte_of(sr[1].sc[j >> 2], j & 3);
            // The mins: Σ_j m_j·Σ(x of sub-block j) by the tensor cores, the min in every byte.
            u32 mg = (u32)byte_of(sr[0].mn[j >> 2], j & 3) * 0x01010101u;
            u32 mg8 = (u32)byte_of(sr[1].mn[j >> 2], j & 3) * 0x01010101u;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint2 b = x.b(nt, u, j);
                int c[4] = {0, 0, 0, 0};
                mma_k32(c, a0, a1, a2, a3, b.x, b.y);
                s1[nt][0] += sg * c[0];
                s1[nt][1] += sg * c[1];
                s1[nt][2] += sg8 * c[2];
                s1[nt][3] += sg8 * c[3];
                mma_k32(cm[nt], mg, mg8, mg, mg8, b.x, b.y);
            }
        }
        float d[2] = {h2f(dm[0] & 0xFFFF), h2f(dm[1] & 0xFFFF)};
        float dmin[2] = {h2f(dm[0] >> 16), h2f(dm[1] >> 16)};
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            float dx[2] = {x.d(nt, 0, u, 0), x.d(nt, 1, u, 0)};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = e >> 1;
                float v = __fmaf_rn(__fmul_rn(dx[e & 1], d[r]), __int2float_rn(s1[nt][e]),
                                    -__fmul_rn(__fmul_rn(dx[e & 1], dmin[r]), __int2float_rn(cm[nt][e])));
                acc[nt][e] = __fadd_rn(acc[nt][e], v);
            }
        }
    }
    // `unit` for one activation row (t = 1, the row's values at xs: this lane's 64 bytes of the
    // unit, act_pos) through dp4a: the lane's partial s1 and cm over its 8 values of each
    // sub-block, summed over the four lanes of its rows (exact integers: the same s1 and cm as the
    // tensor-core products), then the same f32 steps as `unit` for output column 0 (acc[0][0]
    // row g, acc[0][2] row g + 8; the other slots are columns past t, never written).
    // The lane's words of a unit (as MQ<TY_Q8_0>::Words): its rows' d|dmin and packed scales, its
    // 16 bytes of each pair of sub-blocks.
    struct Words { u32 dm[2], sc[2][3]; uint4 w[4]; };
    template <bool GL>
    static __device__ __forceinline__ Words words(const u8* s, int lane) {
        int g = lane >> 2;
        Words f;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            f.dm[r] = ld_w32<GL>(s + 4 * (g + 8 * r));
#pragma unroll
            for (int k = 0; k < 3; k++) f.sc[r][k] = ld_w32<GL>(s + 64 + 12 * (g + 8 * r) + 4 * k);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) f.w[i] = ld_w<GL>(s + 256 + i * 512 + lane * 16);
        return f;
    }
    static __device__ __forceinline__ void unit_v(const u8* s, const Act& x, int u, int lane, float acc[1][4]) {
        unit_vw(words<false>(s, lane), x, u, lane, acc);
    }
    static __device__ __forceinline__ void unit_vw(const Words& f, const Act& x, int u, int lane, float acc[1][4]) {
        const u32* dm = f.dm;
        Scales sr[2] = {scales_w(f.sc[0][0], f.sc[0][1], f.sc[0][2]), scales_w(f.sc[1][0], f.sc[1][1], f.sc[1][2])};
        const uint4* xq = (const uint4*)(x.q + u * 256 + (lane & 3) * 64);
        int s1[2] = {0, 0}, cm[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint4 w = f.w[i];
            uint4 xv = xq[i];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int j = 2 * i + h, sh = 4 * h;
                int bx = (int)(h ? xv.z : xv.x), by = (int)(h ? xv.w : xv.y);
                int pg = __dp4a((int)((w.x >> sh) & 0x0F0F0F0Fu), bx, __dp4a((int)((w.z >> sh) & 0x0F0F0F0Fu), by, 0));
                int pg8 = __dp4a((int)((w.y >> sh) & 0x0F0F0F0Fu), bx, __dp4a((int)((w.w >> sh) & 0x0F0F0F0Fu), by, 0));
                int xsum = __dp4a(bx, 0x01010101, __dp4a(by, 0x01010101, 0));
                s1[0] += byte_of(sr[0].sc[j >> 2], j & 3) * pg;
                s1[1] += byte_of(sr[1].sc[j >> 2], j & 3) * pg8;
                cm[0] += byte_of(sr[0].mn[j >> 2], j & 3) * xsum;
                cm[1] += byte_of(sr[1].mn[j >> 2], j & 3) * xsum;
            }
        }
#pragma unroll
        for (int o = 1; o < 4; o <<= 1)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                s1[r] += __shfl_xor_sync(0xffffffffu, s1[r], o);
                cm[r] += __shfl_xor_sync(0xffffffffu, cm[r], o);
            }
        float dx = x.d_at(0, u * 8);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float d = h2f(dm[r] & 0xFFFF), dmin = h2f(dm[r] >> 16);
            float v = __fmaf_rn(__fmul_rn(dx, d), __int2float_rn(s1[r]), -__fmul_rn(__fmul_rn(dx, dmin), __int2float_rn(cm[r])));
            acc[0][2 * r] = __fadd_rn(acc[0][2 * r], v);
            acc[0][2 * r + 1] = acc[0][2 * r];
        }
    }
};

// Q6_K blob (3360 bytes): d of each row (f16, 16 × 2), the rows' 16 int8 scales (16 × 16), the
// low bits ql as [lane][16 words] (word ((n2·2 + q1)·2 + hh)·2 + rs: row g + 8·rs, bytes
// 64·n2 + 32·q1 + 16·hh + 4·tig), the high bits qh as [lane][8 words] ((n2·2 + hh)·2 + rs: bytes
// 32·n2 + 16·hh + 4·tig). Sub-blocks of 16 values (one scale each) through m16n8k16 products,
// the values q - 32 as int8; per unit and output s = Σ sc·(Σ (q - 32)·x) exact, then dx·d·s.
template <> struct MQ<TY_Q6_K> {
    static const int UB = 3360, STAGES = 3;
    // This lane's four values (q - 32, int8) of sub-block j16 of row g + 8·rs.
    static __device__ __forceinline__ u32 vals(const u8* s, int lane, int j16, int rs) {
        int n2 = j16 >> 3, qq = (j16 & 7) >> 1, hh = j16 & 1, q1 = qq & 1, nib = qq >> 1;
        int iw = ((n2 * 2 + q1) * 2 + hh) * 2 + rs, ih = (n2 * 2 + hh) * 2 + rs;
        u32 lw = *(const u32*)(s + 288 + lane * 64 + 4 * iw);
        u32 hw = *(const u32*)(s + 2336 + lane * 32 + 4 * ih);
        return __vsub4(((lw >> (4 * nib)) & 0x0F0F0F0Fu) | (((hw >> (2 * qq)) & 0x03030303u) << 4), 0x20202020u);
    }
    // Scale of sub-block j16 from a row's 16 (byte 8·n2 + hh + 2·qq).
    static __device__ __forceinline__ int scale(uint4 sc, int j16) {
        int k = 8 * (j16 >> 3) + (j16 & 1) + 2 * ((j16 & 7) >> 1);
        return (int)(signed char)byte_of(comp(sc, k >> 2), k & 3);
    }
    template <int NT>
    static __device__ __forceinline__ void unit(const u8* s, const Act& x, int u, int lane, float acc[NT][4]) {
        int g = lane >> 2;
        // Each row's 16 scales in one word.
        uint4 sc[2] = {*(const uint4*)(s + 32 + 16 * g), *(const uint4*)(s + 32 + 16 * (g + 8))};
        int si[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) si[nt][e] = 0;
#pragma unroll
        for (int jb = 0; jb < 8; jb++) {
            uint2 b[NT];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) b[nt] = x.b(nt, u, jb);
#pragma unroll
            for (int half = 0; half < 2; half++) {
                int j16 = 2 * jb + half;
                u32 a[2] = {vals(s, lane, j16, 0), vals(s, lane, j16, 1)};
                int s0 = scale(sc[0], j16), s8 = scale(sc[1], j16);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    int c[4] = {0, 0, 0, 0};
                    mma_k16(c, a[0], a[1], half ? b[nt].y : b[nt].x);
                    si[nt][0] += s0 * c[0];
                    si[nt][1] += s0 * c[1];
                    si[nt][2] += s8 * c[2];
                    si[nt][3] += s8 * c[3];
                }
            }
        }
        float d[2] = {h2f(*(const u16*)(s + 2 * g)), h2f(*(const u16*)(s + 2 * (g + 8)))};
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            float dx[2] = {x.d(nt, 0, u, 0), x.d(nt, 1, u, 0)};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = __fmul_rn(__fmul_rn(dx[e & 1], d[e >> 1]), __int2float_rn(si[nt][e]));
                acc[nt][e] = __fadd_rn(acc[nt][e], v);
            }
        }
    }
    // `unit` for one activation row through dp4a (as MQ<TY_Q4_K>::unit_v): the lane's partial
    // Σ sc·(Σ (q - 32)·x) over its four values of each sub-block, summed over its rows' four lanes.
    static __device__ __forceinline__ void unit_v(const u8* s, const Act& x, int u, int lane, float acc[1][4]) {
        int g = lane >> 2;
        uint4 sc[2] = {*(const uint4*)(s + 32 + 16 * g), *(const uint4*)(s + 32 + 16 * (g + 8))};
        const uint2* xq = (const uint2*)(x.q + u * 256 + (lane & 3) * 64);
        int si[2] = {0, 0};
#pragma unroll
        for (int jb = 0; jb < 8; jb++) {
            uint2 b = xq[jb];
#pragma unroll
            for (int half = 0; half < 2; half++) {
                int j16 = 2 * jb + half;
#pragma unroll
                for (int rs = 0; rs < 2; rs++)
                    si[rs] += scale(sc[rs], j16) * __dp4a((int)vals(s, lane, j16, rs), (int)(half ? b.y : b.x), 0);
            }
        }
#pragma unroll
        for (int o = 1; o < 4; o <<= 1)
#pragma unroll
            for (int r = 0; r < 2; r++) si[r] += __shfl_xor_sync(0xffffffffu, si[r], o);
        float dx = x.d_at(0, u * 8);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float v = __fmul_rn(__fmul_rn(dx, h2f(*(const u16*)(s + 2 * (g + 8 * r)))), __int2float_rn(si[r]));
            acc[0][2 * r] = __fadd_rn(acc[0][2 * r], v);
            acc[0][2 * r + 1] = acc[0][2 * r];
        }
    }
};

// Q8_0 blob (4352 bytes; a unit is eight blocks of 32): the rows' eight block scales (f16, 16 ×
// 16 bytes), then the quants as [block j (8)][lane (32)][4 words] in A-fragment order (row g word
// tig, row g + 8 word tig, row g word 4 + tig, row g + 8 word 4 + tig). Blocks past the row's end
// are zeros (as the activations' padding), so they add nothing. Per block and output:
// part = fma(dx·dw, Σ q·x, part).
template <> struct MQ<TY_Q8_0> {
    static const int UB = 4352, STAGES = 2;
    template <int NT>
    static __device__ __forceinline__ void unit(const u8* s, const Act& x, int u, int lane, float acc[NT][4]) {
        int g = lane >> 2;
        uint4 dw4[2] = {*(const uint4*)(s + 16 * g), *(const uint4*)(s + 16 * (g + 8))};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint4 w = *(const uint4*)(s + 256 + j * 512 + lane * 16);
            float dwr[2] = {h2f((comp(dw4[0], j >> 1) >> (16 * (j & 1))) & 0xFFFF),
                            h2f((comp(dw4[1], j >> 1) >> (16 * (j & 1))) & 0xFFFF)};
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint2 b = x.b(nt, u, j);
                int c[4] = {0, 0, 0, 0};
                mma_k32(c, w.x, w.y, w.z, w.w, b.x, b.y);
                float dx[2] = {x.d(nt, 0, u, j), x.d(nt, 1, u, j)};
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[nt][e] = __fmaf_rn(__fmul_rn(dx[e & 1], dwr[e >> 1]), i2f(c[e]), acc[nt][e]);
            }
        }
    }
    // `unit` for one activation row through dp4a (as MQ<TY_Q4_K>::unit_v): each block's integer
    // product summed over the four lanes of its rows, then the same fma as `unit`, block by block.
    // The lane's words of a unit: its rows' eight scales, its 16 bytes of each block.
    struct Words { uint4 dw[2], w[8]; };
    // From shared memory (GL false) or straight from the weight in global memory, past the L1.
    template <bool GL>
    static __device__ __forceinline__ Words words(const u8* s, int lane) {
        int g = lane >> 2;
        Words f;
        f.dw[0] = ld_w<GL>(s + 16 * g);
        f.dw[1] = ld_w<GL>(s + 16 * (g + 8));
#pragma unroll
        for (int j = 0; j < 8; j++) f.w[j] = ld_w<GL>(s + 256 + j * 512 + lane * 16);
        return f;
    }
    static __device__ __forceinline__ void unit_v(const u8* s, const Act& x, int u, int lane, float acc[1][4]) {
        unit_vw(words<false>(s, lane), x, u, lane, acc);
    }
    static __device__ __forceinline__ void unit_vw(const Words& f, const Act& x, int u, int lane, float acc[1][4]) {
        const uint2* xq = (const uint2*)(x.q + u * 256 + (lane & 3) * 64);
        int c[8][2];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint4 w = f.w[j];
            uint2 b = xq[j];
            c[j][0] = __dp4a((int)w.x, (int)b.x, __dp4a((int)w.z, (int)b.y, 0));
            c[j][1] = __dp4a((int)w.y, (int)b.x, __dp4a((int)w.w, (int)b.y, 0));
        }
#pragma unroll
        for (int o = 1; o < 4; o <<= 1)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                c[j][0] += __shfl_xor_sync(0xffffffffu, c[j][0], o);
                c[j][1] += __shfl_xor_sync(0xffffffffu, c[j][1], o);
            }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float dx = x.d_at(0, u * 8 + j);
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float dw = h2f((comp(f.dw[r], j >> 1) >> (16 * (j & 1))) & 0xFFFF);
                acc[0][2 * r] = __fmaf_rn(__fmul_rn(dx, dw), i2f(c[j][r]), acc[0][2 * r]);
            }
        }
        acc[0][1] = acc[0][0];
        acc[0][3] = acc[0][2];
    }
};

// A block's output: its four warps' parts through shared memory (part[w][col][row], 4·NT·128
// floats) added as ((p0 + p1) + p2) + p3 for rows tile·16.. and columns c0.. below m and t.
template <int NT>
__device__ __forceinline__ void write_parts(float* part, const float acc[NT][4], int tile, int c0, int m, int t, float* out) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) part[(warp * NT * 8 + nt * 8 + 2 * tig + (e & 1)) * 16 + g + 8 * (e >> 1)] = acc[nt][e];
    __syncthreads();
    const int P = NT * 8 * 16;
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        float s = __fadd_rn(__fadd_rn(__fadd_rn(part[i], part[P + i]), part[2 * P + i]), part[3 * P + i]);
        int o = tile * 16 + (i & 15), r = c0 + (i >> 4);
        if (o < m && r < t) out[(u64)r * m + o] = s;
    }
}

// One block: tile `tile` (16 weight rows) of W times activation rows c0 .. c0 + NT·8 (clamped to
// t; outputs past t or m are not written). W: the weight's tiled bytes, U units per row. ST: the
// units each warp has in flight, plus one (the type's STAGES; more for one-row products of few
// blocks, mmq_v5_*: the same sums, more of the weights in flight).
// A one-row product's activations made by its own block from two rows of floats: their GLU (op
// 2 SwiGLU, 3 GeGLU; m values, zeros up to n_pad ≤ GLU_MAX) quantized as glu_q8 quantizes it,
// into shared memory, once the kernel ahead (which wrote them) has finished.
struct GluIn {
    const float* gate;
    const float* up;
    int m, op;
};
#define GLU_MAX 2048

// XS: the stages in xs, shared memory of the kernel's (of at least 4 · ST · UB bytes), not a buffer
// of the function's own (a kernel multiplying weights of two types gives both one buffer).
template <int TY, int NT, bool V = false, int ST = MQ<TY>::STAGES, bool G = false, bool XS = false>
__device__ void mmq_t(int tile, int c0, const u8* W, int U, int m, const i8* qa, const float* ad, int n_pad, float* out, int t,
                      GluIn gi = GluIn{}, u8* xs = nullptr) {
    typedef MQ<TY> Q;
    Act x{qa, ad, n_pad, c0, t, (int)(threadIdx.x & 31) >> 2, (int)threadIdx.x & 3};
    u8* smem = xs;
    if constexpr (!XS) {
        __shared__ __align__(16) u8 own[4 * ST * Q::UB];
        smem = own;
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    u8* sw = smem + warp * ST * Q::UB;
    const u8* wt = W + (u64)tile * U * Q::UB;
    int u0 = U * warp / 4, u1 = U * (warp + 1) / 4;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] = 0.f;
    const int CH = Q::UB / 16;
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (u0 + s < u1) {
            const u8* src = wt + (u64)(u0 + s) * Q::UB;
            for (int c = lane; c < CH; c += 32) cp_async16(sw + s * Q::UB + 16 * c, src + 16 * c);
        }
        cp_commit();
    }
    // The weights above do not depend on the kernels before this one; what they wrote (the
    // activations) is read from here on (programmatic dependent launch, common.cuh).
    pdl_wait();
    pdl_trigger();
    if constexpr (G) {
        // (The flavour of the weight's type: Q8_0's blocks of 32 with f16 scales, else the
        // K-quants' units of 256.)
        __shared__ __align__(16) i8 gq[GLU_MAX];
        __shared__ float gd[GLU_MAX / 32];
        const bool q0 = TY == TY_Q8_0;
        for (int c = 0; c < n_pad; c += 4 * blockDim.x) {
            int k = c + 4 * threadIdx.x;
            float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
            if (k < gi.m) {
                // (Through the L2: the kernel ahead wrote them.)
                float4 a = __ldcg((const float4*)(gi.gate + k)), b = __ldcg((const float4*)(gi.up + k));
                r = make_float4(glu1(a.x, b.x, gi.op), glu1(a.y, b.y, gi.op), glu1(a.z, b.z, gi.op), glu1(a.w, b.w, gi.op));
            }
            act_q8x4(r, k, q0 ? gq : 0, q0 ? gd : 0, q0 ? 0 : gq, q0 ? 0 : gd, k < n_pad);
        }
        __syncthreads();
        x.q = gq;
        x.dp = gd;
    }
    // Unit u sits in stage (u - u0) % ST.
    for (int u = u0; u < u1; u++) {
        int un = u + ST - 1;
        if (un < u1) {
            const u8* src = wt + (u64)un * Q::UB;
            u8* dst = sw + ((un - u0) % ST) * Q::UB;
            for (int c = lane; c < CH; c += 32) cp_async16(dst + 16 * c, src + 16 * c);
        }
        cp_commit();
        cp_wait<ST - 1>();
        __syncwarp();
        if constexpr (V)
            Q::unit_v(sw + ((u - u0) % ST) * Q::UB, x, u, lane, acc);
        else
            Q::template unit<NT>(sw + ((u - u0) % ST) * Q::UB, x, u, lane, acc);
        // The stage is refilled by the next iteration's copy.
        __syncwarp();
    }
    cp_wait<0>();
    __syncthreads();
    write_parts<NT>((float*)smem, acc, tile, c0, m, t, out);
}

// One-row products with each lane's words loaded straight into registers, PF units in flight a
// warp, no shared-memory stages (a one-row product uses each weight byte once; Q8_0's two stages
// of 4352 bytes kept one unit in flight): the same words through the same unit_vw as mmq_v_'s, the
// same parts, so the same bits. (HF2Q_CUDA_DEFINE=Q8_DIRECT=PF / Q4_DIRECT=PF makes the one-row
// kernels of Q8_0 / Q4_K these, to compare.)
template <int TY, int PF>
__device__ void mmq_vd(int tile, const u8* W, int U, int m, const i8* qa, const float* ad, int n_pad, float* out, float* part) {
    typedef MQ<TY> Q;
    Act x{qa, ad, n_pad, 0, 1, (int)(threadIdx.x & 31) >> 2, (int)threadIdx.x & 3};
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u8* wt = W + (u64)tile * U * Q::UB;
    int u0 = U * warp / 4, u1 = U * (warp + 1) / 4;
    float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
    typename Q::Words f[PF];
#pragma unroll
    for (int k = 0; k < PF; k++)
        if (u0 + k < u1) f[k] = Q::template words<true>(wt + (u64)(u0 + k) * Q::UB, lane);
    pdl_wait();
    pdl_trigger();
    for (int u = u0; u < u1; u += PF) {
#pragma unroll
        for (int k = 0; k < PF; k++) {
            if (u + k < u1) {
                typename Q::Words cur = f[k];
                if (u + k + PF < u1) f[k] = Q::template words<true>(wt + (u64)(u + k + PF) * Q::UB, lane);
                Q::unit_vw(cur, x, u + k, lane, acc);
            }
        }
    }
    write_parts<1>(part, acc, tile, 0, m, 1, out);
}

// Up to three weights of one type by the same activations in one launch (a layer's Q, K and V, or
// gate and up): blocks [0, nb0) the first weight's, the next nb1 the second's, the rest the
// third's; within a weight, block b is tile b / ct and columns (b % ct)·NT·8 (ct column tiles).
#define MMQ_KS(NAME, TY, NT, V, ST) \
    extern "C" __global__ void __launch_bounds__(128) NAME(const i8* qa, const float* ad, int n_pad, int U, int t, int ct, \
        const u8* W0, float* o0, int m0, int nb0, const u8* W1, float* o1, int m1, int nb1, const u8* W2, float* o2, int m2) { \
        int b = blockIdx.x; \
        const u8* W = W0; float* o = o0; int m = m0; \
        if (b >= nb0) { b -= nb0; W = W1; o = o1; m = m1; if (b >= nb1) { b -= nb1; W = W2; o = o2; m = m2; } } \
        mmq_t<TY, NT, V, ST>(b / ct, (b % ct) * NT * 8, W, U, m, qa, ad, n_pad, o, t); \
    }
#define MMQ_K(NAME, TY, NT, V) MMQ_KS(NAME, TY, NT, V, MQ<TY>::STAGES)
#define MMQ(NAME, TY, NT) MMQ_K(NAME##_##NT, TY, NT, false)
// (The name is pasted here, before the type's macro is expanded: mmq_TY_Q4_K_8 ...; mmq_v_TY_Q4_K
// is the one-row kernel of the same products through dp4a: t = 1, ct = 1.)
#define MMQ_TILES(NAME, TY) MMQ(NAME, TY, 1) MMQ(NAME, TY, 2) MMQ(NAME, TY, 4) MMQ(NAME, TY, 8)
#define MMQ_ALL(TY) MMQ_TILES(mmq_##TY, TY) MMQ_K(mmq_v_##TY, TY, 1, true)
// The one-row kernels of mmq_vd (Q8_DIRECT, Q4_DIRECT), slots as MMQ_KS's.
#define MMQ_VD(NAME, TY, PF) \
    extern "C" __global__ void __launch_bounds__(128) NAME(const i8* qa, const float* ad, int n_pad, int U, int t, int ct, \
        const u8* W0, float* o0, int m0, int nb0, const u8* W1, float* o1, int m1, int nb1, const u8* W2, float* o2, int m2) { \
        __shared__ __align__(16) float part[4 * 8 * 16]; \
        int b = blockIdx.x; \
        const u8* W = W0; float* o = o0; int m = m0; \
        if (b >= nb0) { b -= nb0; W = W1; o = o1; m = m1; if (b >= nb1) { b -= nb1; W = W2; o = o2; m = m2; } } \
        mmq_vd<TY, PF>(b, W, U, m, qa, ad, n_pad, o, part); \
    }
// (Each define replaces its type's one-row kernels only: every module keeps the same kernel names,
// which kernels_compile_for_sm90 checks.)
#ifdef Q4_DIRECT
MMQ_TILES(mmq_TY_Q4_K, TY_Q4_K)
MMQ_VD(mmq_v_TY_Q4_K, TY_Q4_K, Q4_DIRECT)
#else
MMQ_ALL(TY_Q4_K)
#endif
MMQ_ALL(TY_Q6_K)
#ifdef Q8_DIRECT
MMQ_TILES(mmq_TY_Q8_0, TY_Q8_0)
MMQ_VD(mmq_v_TY_Q8_0, TY_Q8_0, Q8_DIRECT)
#else
MMQ_ALL(TY_Q8_0)
#endif
#ifdef Q4_DIRECT
MMQ_VD(mmq_v5_TY_Q4_K, TY_Q4_K, Q4_DIRECT)
#else
// Q4_K's one-row kernel with four units in flight a warp (46 KB of shared memory a block, under the
// 48 KB of static shared memory), for grids of few blocks (HF2Q_CUDA_MMQ_V5).
MMQ_KS(mmq_v5_TY_Q4_K, TY_Q4_K, 1, true, 5)
#endif

// One-row products of Q4_K and Q6_K weights in one launch (Q4_K_M files give some layers' V, or
// down, Q6_K): slots [0, na) Q4_K (STA stages, STA - 1 units in flight a warp: mmq_v_'s or
// mmq_v5_'s; the launch's blocks, Q6_K's too, against HF2Q_CUDA_MMQ_V5's threshold), the others
// Q6_K; every block computes as its type's own launch does, in one shared buffer for both.
#ifdef Q4_DIRECT
#define VX_Q4(STA) mmq_vd<TY_Q4_K, Q4_DIRECT>(b, W, U, m, qa, ad, n_pad, o, (float*)sm)
#else
#define VX_Q4(STA) mmq_t<TY_Q4_K, 1, true, STA, false, true>(b / ct, (b % ct) * 8, W, U, m, qa, ad, n_pad, o, t, GluIn{}, sm)
#endif
#define MMQ_VX(NAME, STA) \
    extern "C" __global__ void __launch_bounds__(128) NAME(const i8* qa, const float* ad, int n_pad, int U, int t, int ct, \
        const u8* W0, float* o0, int m0, int nb0, const u8* W1, float* o1, int m1, int nb1, const u8* W2, float* o2, int m2, \
        int na) { \
        constexpr int SA = 4 * STA * MQ<TY_Q4_K>::UB, SB = 4 * MQ<TY_Q6_K>::STAGES * MQ<TY_Q6_K>::UB; \
        __shared__ __align__(16) u8 sm[SA > SB ? SA : SB]; \
        int b = blockIdx.x, k = 0; \
        const u8* W = W0; float* o = o0; int m = m0; \
        if (b >= nb0) { b -= nb0; k = 1; W = W1; o = o1; m = m1; if (b >= nb1) { b -= nb1; k = 2; W = W2; o = o2; m = m2; } } \
        if (k < na) VX_Q4(STA); \
        else mmq_t<TY_Q6_K, 1, true, MQ<TY_Q6_K>::STAGES, false, true>(b / ct, (b % ct) * 8, W, U, m, qa, ad, n_pad, o, t, GluIn{}, sm); \
    }
MMQ_VX(mmq_vx_TY_Q4_K_TY_Q6_K, MQ<TY_Q4_K>::STAGES)
MMQ_VX(mmq_vx5_TY_Q4_K_TY_Q6_K, 5)

// ---- Mixture-of-experts decode steps on the device (the host never reads the routing, so a
// step stays one graph). Routing as the CPU's (model/blocks.rs route; llama-graph.cpp
// build_moe_ffn): one warp per row of router logits (n_expert ≤ 1024) -> the k experts' ids and
// weights, in rank order (ties to the lower id).
// A block a row, every thread routing (moe_route_blk, common.cuh; blockDim.x a multiple of 32).
extern "C" __global__ void moe_route(const float* logits, int ne, int k, int softmax_first, int normalize, int* ids, float* ws) {
    // (Launched early: it waits for the router's product before reading the logits.)
    pdl_trigger();
    pdl_wait();
    int row = blockIdx.x;
    moe_route_blk<>(logits + (u64)row * ne, ne, k, softmax_first, normalize, ids + row * k, ws + row * k);
}

// (The router's product and this routing in one launch of one thread block cluster of 8 blocks,
// each warp holding an expert's f32 row in registers from before the wait for the norm, the logits
// read through distributed shared memory, the same bits, was slower: MoE tg128 0.973× on an H100,
// bench/runs/2026-12-06-h100-f call 4.)
// The same by one warp a row (moe_route_t, common.cuh: the serial sum and k rounds of argmax),
// to compare (HF2Q_CUDA_ROUTE_WARP=1).
extern "C" __global__ void moe_route_w(const float* logits, int ne, int k, int softmax_first, int normalize, int* ids, float* ws) {
    pdl_trigger();
    pdl_wait();
    if (threadIdx.x >= 32) return;
    const float* x = logits + (u64)blockIdx.x * ne;
    int* id = ids + blockIdx.x * k;
    float* w = ws + blockIdx.x * k;
    if (ne <= 32) moe_route_t<1>(x, ne, k, softmax_first, normalize, id, w);
    else if (ne <= 64) moe_route_t<2>(x, ne, k, softmax_first, normalize, id, w);
    else if (ne <= 128) moe_route_t<4>(x, ne, k, softmax_first, normalize, id, w);
    else if (ne <= 256) moe_route_t<8>(x, ne, k, softmax_first, normalize, id, w);
    else if (ne <= 512) moe_route_t<16>(x, ne, k, softmax_first, normalize, id, w);
    else moe_route_t<32>(x, ne, k, softmax_first, normalize, id, w);
}

// Routing inside the experts' launches (no moe_route launch between the router's product and the
// gate / up products): each block routes its pair's row itself from the router's logits with all
// its threads, the choice and weights of moe_route (moe_route_blk<256>: n_expert ≤ 256). logits
// null: the pairs' experts are read from ids (routed before).
struct RouteIn {
    const float* logits;
    int ne, k, softmax_first, normalize;
};
// The expert of pair p (row p / k, slot p % k); with out_ids, the row's k ids and weights also
// written to out_ids / out_ws (by one block per row). Every thread of the block calls it.
__device__ __forceinline__ int route_in(const RouteIn& ri, int p, const int* ids, int* out_ids, float* out_ws) {
    if (!ri.logits) return ids[p];
    __shared__ int rid[64];
    __shared__ float rw[64];
    int r = p / ri.k;
    moe_route_blk<256>(ri.logits + (u64)r * ri.ne, ri.ne, ri.k, ri.softmax_first, ri.normalize, rid, rw);
    if (out_ids && (int)threadIdx.x < ri.k) {
        out_ids[r * ri.k + threadIdx.x] = rid[threadIdx.x];
        out_ws[r * ri.k + threadIdx.x] = rw[threadIdx.x];
    }
    return rid[p % ri.k];
}

// The experts' products of a MoE step, every (row, slot) pair p on its own (as the dense
// products compute a row alone, so a pair's output is the bits of its expert's product on that
// row): grid (pairs · tiles, mats); pair p = blockIdx.x / tiles multiplies activation row p / div
// by expert ids[p]'s (or, ri.logits given, its own routing's) weight of matrix blockIdx.y (T0 or T1: the experts' tiled weights'
// addresses), into row p of o0 / o1 (m outputs each).
template <int TY, bool V, int ST = MQ<TY>::STAGES>
__device__ __forceinline__ void mmq_pair(const i8* qa, const float* ad, int n_pad, int U, const int* ids, int div, int m,
                                         const u64* T0, float* o0, const u64* T1, float* o1, RouteIn ri = RouteIn{},
                                         int* out_ids = 0, float* out_ws = 0) {
    int tiles = (m + 15) >> 4, p = blockIdx.x / tiles, tile = blockIdx.x % tiles, r = p / div;
    // Routing here (ri.logits): the blocks of each row's first pair, first tile and first matrix
    // write the row's ids and weights for the launches after.
    bool writer = out_ids && blockIdx.y == 0 && tile == 0 && p % ri.k == 0;
    int e = route_in(ri, p, ids, writer ? out_ids : 0, out_ws);
    const u64* T = blockIdx.y ? T1 : T0;
    float* o = blockIdx.y ? o1 : o0;
    mmq_t<TY, 1, V, ST>(tile, 0, (const u8*)T[e], U, m, qa + (u64)r * n_pad, ad + (u64)r * (n_pad >> 5), n_pad, o + (u64)p * m, 1);
}
#define MMQ_MOE(NAME, TY, V) \
    extern "C" __global__ void __launch_bounds__(128) NAME(const i8* qa, const float* ad, int n_pad, int U, const int* ids, int div, \
        int m, const u64* T0, float* o0, const u64* T1, float* o1) { \
        mmq_pair<TY, V>(qa, ad, n_pad, U, ids, div, m, T0, o0, T1, o1); \
    }
MMQ_MOE(mmq_moe_TY_Q4_K, TY_Q4_K, false)
MMQ_MOE(mmq_moe_TY_Q6_K, TY_Q6_K, false)
MMQ_MOE(mmq_moe_TY_Q8_0, TY_Q8_0, false)
MMQ_MOE(mmq_moe_v_TY_Q4_K, TY_Q4_K, true)
MMQ_MOE(mmq_moe_v_TY_Q6_K, TY_Q6_K, true)
MMQ_MOE(mmq_moe_v_TY_Q8_0, TY_Q8_0, true)
// The same one-row products with ST stages, for products whose warps have at most ST - 1 units
// each (U ≤ 4 · (ST - 1): every weight asked for before the wait for the kernel ahead), and at
// least MB blocks a multiprocessor (registers capped to fit; no spills in ptxas -v): a decode
// step's 1,024 down blocks (or 768 gate / up ones) resident at once on 132 multiprocessors, not in
// two waves (on by default: MoE tg128 1.020x on an H100; HF2Q_CUDA_MOE_LEAN=0 for mmq_moe_v_*).
// The same sums in the same order as mmq_moe_v_*. (Q8_0 has two stages already, and 34 KB of
// them: no lean form.)
// (Gate / up launched early with the expert ids read after the wait for the routing was slower:
// MoE tg128 1.013x against these kernels' 1.020x on an H100, bench/runs/2026-12-06-h100 call 4.)
// (Their blocks asking the L2 for their pair's down weights, prefetch.global.L2, were slower:
// 0.978x / 0.980x, and the routing by 128 blocks asking for the chosen experts' weights 0.81x,
// on an H100, bench/runs/2026-12-06-h100-c call 2.)
#define MMQ_MOE_L(NAME, TY, ST, MB) \
    extern "C" __global__ void __launch_bounds__(128, MB) NAME(const i8* qa, const float* ad, int n_pad, int U, const int* ids, \
        int div, int m, const u64* T0, float* o0, const u64* T1, float* o1) { \
        mmq_pair<TY, true, ST>(qa, ad, n_pad, U, ids, div, m, T0, o0, T1, o1); \
    }
MMQ_MOE_L(mmq_moe_v2_TY_Q4_K, TY_Q4_K, 2, 8)
MMQ_MOE_L(mmq_moe_v3_TY_Q4_K, TY_Q4_K, 3, 7)
MMQ_MOE_L(mmq_moe_v2_TY_Q6_K, TY_Q6_K, 2, 8)

// mmq_moe_* (gate and up) routing their pairs themselves (mmq_pair with route_in).
#define MMQ_MOE_R(NAME, TY, V) \
    extern "C" __global__ void __launch_bounds__(128) NAME(const i8* qa, const float* ad, int n_pad, int U, const float* logits, \
        int ne, int k, int softmax_first, int normalize, int* ids, float* ws, int div, int m, const u64* T0, float* o0, \
        const u64* T1, float* o1) { \
        mmq_pair<TY, V>(qa, ad, n_pad, U, ids, div, m, T0, o0, T1, o1, RouteIn{logits, ne, k, softmax_first, normalize}, ids, ws); \
    }
MMQ_MOE_R(mmq_moe_r_v_TY_Q4_K, TY_Q4_K, true)
MMQ_MOE_R(mmq_moe_r_v_TY_Q6_K, TY_Q6_K, true)
MMQ_MOE_R(mmq_moe_r_v_TY_Q8_0, TY_Q8_0, true)

// The down products (mmq_moe_*, one matrix: T0 into o0) whose pair p's activations its blocks
// make themselves from p's gate and up rows (GluIn: rows p of gate / up, m_ff values each;
// n_pad ≤ GLU_MAX), instead of reading those of a glu_q8 launch: the same bits, a launch fewer.
// Their experts from ids, or (logits not null) routed by each block (route_in) — before waiting
// for the kernel ahead: the router's product finished before the gate / up products began.
template <int TY, bool V, int ST = MQ<TY>::STAGES>
__device__ __forceinline__ void mmq_pair_glu(const float* gate, const float* up, int m_ff, int op, int n_pad, int U, const int* ids,
                                             int m, const u64* T0, float* o0, RouteIn ri) {
    int tiles = (m + 15) >> 4, p = blockIdx.x / tiles, tile = blockIdx.x % tiles;
    GluIn gi{gate + (u64)p * m_ff, up + (u64)p * m_ff, m_ff, op};
    int e = route_in(ri, p, ids, 0, 0);
    mmq_t<TY, 1, V, ST, true>(tile, 0, (const u8*)T0[e], U, m, 0, 0, n_pad, o0 + (u64)p * m, 1, gi);
}
#define MMQ_MOE_GD(NAME, TY, V) \
    extern "C" __global__ void __launch_bounds__(128) NAME(const float* gate, const float* up, int m_ff, int op, int n_pad, int U, \
        const int* ids, int m, const u64* T0, float* o0, const float* logits, int ne, int k, int softmax_first, int normalize) { \
        mmq_pair_glu<TY, V>(gate, up, m_ff, op, n_pad, U, ids, m, T0, o0, RouteIn{logits, ne, k, softmax_first, normalize}); \
    }
MMQ_MOE_GD(mmq_moe_gd_v_TY_Q4_K, TY_Q4_K, true)
MMQ_MOE_GD(mmq_moe_gd_v_TY_Q6_K, TY_Q6_K, true)
MMQ_MOE_GD(mmq_moe_gd_v_TY_Q8_0, TY_Q8_0, true)
// Their lean forms (as MMQ_MOE_L: two stages for warps of one unit; Q6_K's seven blocks a
// multiprocessor, as its stages and the GLU's 2.3 KB leave room for).
#define MMQ_MOE_GD_L(NAME, TY, ST, MB) \
    extern "C" __global__ void __launch_bounds__(128, MB) NAME(const float* gate, const float* up, int m_ff, int op, int n_pad, \
        int U, const int* ids, int m, const u64* T0, float* o0, const float* logits, int ne, int k, int softmax_first, int normalize) { \
        mmq_pair_glu<TY, true, ST>(gate, up, m_ff, op, n_pad, U, ids, m, T0, o0, RouteIn{logits, ne, k, softmax_first, normalize}); \
    }
MMQ_MOE_GD_L(mmq_moe_gd_v2_TY_Q4_K, TY_Q4_K, 2, 8)
MMQ_MOE_GD_L(mmq_moe_gd_v2_TY_Q6_K, TY_Q6_K, 2, 7)

// glu_q8 (ops.cu) of pair p's gate and up rows (m values each, a multiple of 4) by the last of the
// pair's gridDim.y · tiles blocks (its gate's and up's) to finish (counted in cnt[p], set back to
// 0 by it): act their gated
// activation (op 2 SwiGLU, 3 GeGLU), also quantized for the down products (rows of n_pad values,
// zeros past m; q0 / qk may be null). Every thread of the block calls it.
__device__ __forceinline__ void moe_glu_last(int p, int tiles, int* cnt, const float* gate, const float* up, int m, float* act,
                                             signed char* q0, float* d0, signed char* qk, float* dk, int n_pad, int op) {
    if (!last_to_finish(cnt + p, gridDim.y * tiles)) return;
    u64 i0 = (u64)p * m, qo = (u64)p * n_pad, dof = (u64)p * (n_pad / 32);
    for (int c0 = 0; c0 < n_pad; c0 += 4 * blockDim.x) {
        int k = c0 + 4 * threadIdx.x;
        float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
        if (k < m) {
            // (Through the L2: the other blocks of the launch wrote them.)
            float4 a = __ldcg((const float4*)(gate + i0 + k)), b = __ldcg((const float4*)(up + i0 + k));
            r = make_float4(glu1(a.x, b.x, op), glu1(a.y, b.y, op), glu1(a.z, b.z, op), glu1(a.w, b.w, op));
            *(float4*)(act + i0 + k) = r;
        }
        act_q8x4(r, k, q0 ? q0 + qo : 0, q0 ? d0 + dof : 0, qk ? qk + qo : 0, qk ? dk + dof : 0, k < n_pad);
    }
}

// mmq_moe_* of gate (T0, into o0) and up (T1, o1) then, by each pair's last block, their GLU and
// its quantization for the down products (moe_glu_last): one launch instead of two.
#define MMQ_MOE_GLU(NAME, TY, V) \
    extern "C" __global__ void __launch_bounds__(128) NAME(const i8* qa, const float* ad, int n_pad, int U, const int* ids, int div, \
        int m, const u64* T0, float* o0, const u64* T1, float* o1, int* cnt, float* act, signed char* q0, float* d0, \
        signed char* qk, float* dk, int ff_pad, int op) { \
        mmq_pair<TY, V>(qa, ad, n_pad, U, ids, div, m, T0, o0, T1, o1); \
        int tiles = (m + 15) >> 4; \
        moe_glu_last(blockIdx.x / tiles, tiles, cnt, o0, o1, m, act, q0, d0, qk, dk, ff_pad, op); \
    }
MMQ_MOE_GLU(mmq_moe_glu_TY_Q4_K, TY_Q4_K, false)
MMQ_MOE_GLU(mmq_moe_glu_TY_Q6_K, TY_Q6_K, false)
MMQ_MOE_GLU(mmq_moe_glu_TY_Q8_0, TY_Q8_0, false)
MMQ_MOE_GLU(mmq_moe_glu_v_TY_Q4_K, TY_Q4_K, true)
MMQ_MOE_GLU(mmq_moe_glu_v_TY_Q6_K, TY_Q6_K, true)
MMQ_MOE_GLU(mmq_moe_glu_v_TY_Q8_0, TY_Q8_0, true)

// ---- Grouped MoE steps (prompts, wide batches: many pairs per expert), as llama.cpp's MMQ with
// expert ids (ggml-cuda/mmq.cu) groups them: the pairs sorted by expert, each expert's run cut
// into row tiles of R = NT·8 pairs, and one block per (weight tile, row tile) that multiplies its
// expert's 16 rows by the run's activation rows, read once per row tile instead of once per pair.
// A pair's outputs are the same bits as on the per-pair path (mmq_t: no output depends on NT or
// on the other rows of the launch); only where they are stored differs (sorted position).
//
// moe_group: one block of 1024 threads. ids (pairs) -> order[i] = the pair at sorted position i
// (grouped by expert in id order; within an expert in no fixed order, which changes no value),
// pos[p] = the sorted position of pair p, tiles[0] = the number of row tiles and tiles[1 + 3i ..]
// = (expert, first sorted position, count) of row tile i.
extern "C" __global__ void moe_group(const int* ids, int pairs, int ne, int R, int* order, int* pos, int* tiles) {
    __shared__ int cnt[1024], off[1024], toff[1024], fill[1024];
    for (int e = threadIdx.x; e < ne; e += blockDim.x) { cnt[e] = 0; fill[e] = 0; }
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&cnt[ids[p]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int o = 0, tt = 0;
        for (int e = 0; e < ne; e++) {
            off[e] = o;
            toff[e] = tt;
            o += cnt[e];
            tt += (cnt[e] + R - 1) / R;
        }
        tiles[0] = tt;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        int e = ids[p], i = off[e] + atomicAdd(&fill[e], 1);
        order[i] = p;
        pos[p] = i;
    }
    for (int e = threadIdx.x; e < ne; e += blockDim.x)
        for (int j = 0; j * R < cnt[e]; j++) {
            int* tl = tiles + 1 + 3 * (toff[e] + j);
            tl[0] = e;
            tl[1] = off[e] + j * R;
            tl[2] = min(R, cnt[e] - j * R);
        }
}

// Activation rows in sorted order: row i of the output is row order[i] / div of the input, in the
// integer kernels' layout (int8 rows of n_pad values, a multiple of 256, and their per-32 scales);
// q0 / qk null: that flavour not copied. Grid (pairs), 128 threads.
extern "C" __global__ void gather_act(const i8* q0, const float* d0, const i8* qk, const float* dk, int n_pad,
                                      const int* order, int div, i8* g0, float* gd0, i8* gk, float* gdk) {
    int i = blockIdx.x, src = order[i] / div, nb = n_pad >> 5;
    u64 so = (u64)src * n_pad, io = (u64)i * n_pad;
    for (int c = threadIdx.x; c < n_pad / 16; c += blockDim.x) {
        if (q0) ((int4*)(g0 + io))[c] = ((const int4*)(q0 + so))[c];
        if (qk) ((int4*)(gk + io))[c] = ((const int4*)(qk + so))[c];
    }
    for (int c = threadIdx.x; c < nb; c += blockDim.x) {
        if (q0) gd0[(u64)i * nb + c] = d0[(u64)src * nb + c];
        if (qk) gdk[(u64)i * nb + c] = dk[(u64)src * nb + c];
    }
}

// The grouped products: grid (mats · weight tiles, row tiles at most); row tile y of moe_group's
// table multiplies sorted activation rows [first, first + count) by its expert's weight tile
// x % tiles of matrix x / tiles (T0 / T1: the experts' tiled weights' addresses), into the same
// rows of o0 / o1.
#define MMQ_MOE_G(NAME, TY, NT) \
    extern "C" __global__ void __launch_bounds__(128) NAME##_##NT(const i8* qa, const float* ad, int n_pad, int U, const int* tiles, \
        int m, const u64* T0, float* o0, const u64* T1, float* o1) { \
        if ((int)blockIdx.y >= tiles[0]) return; \
        const int* tl = tiles + 1 + 3 * blockIdx.y; \
        int wt = (m + 15) >> 4, z = blockIdx.x / wt; \
        const u64* T = z ? T1 : T0; \
        float* o = z ? o1 : o0; \
        mmq_t<TY, NT>(blockIdx.x % wt, tl[1], (const u8*)T[tl[0]], U, m, qa, ad, n_pad, o, tl[1] + tl[2]); \
    }
#define MMQ_MOE_G_ALL(TY) MMQ_MOE_G(mmq_moe_g_##TY, TY, 1) MMQ_MOE_G(mmq_moe_g_##TY, TY, 2) MMQ_MOE_G(mmq_moe_g_##TY, TY, 4)
MMQ_MOE_G_ALL(TY_Q4_K)
MMQ_MOE_G_ALL(TY_Q6_K)
MMQ_MOE_G_ALL(TY_Q8_0)

// Activation rows to the integer products' layout (common.cuh: act_q8): grid (rows, n_pad / 256),
// 256 threads; q0/d0 the q8_0 flavour, qk/dk the q8_K one (either null: not made).
extern "C" __global__ void quantize_act(const float* x, int n, int n_pad, signed char* q0, float* d0, signed char* qk, float* dk) {
    pdl_trigger();
    int row = blockIdx.x, k = blockIdx.y * 256 + threadIdx.x;
    float v = k < n ? x[(u64)row * n + k] : 0.f;
    u64 qo = (u64)row * n_pad, dof = (u64)row * (n_pad / 32);
    act_q8(v, k, q0 ? q0 + qo : 0, q0 ? d0 + dof : 0, qk ? qk + qo : 0, qk ? dk + dof : 0);
}

// The index of each row's first largest value (greedy decoding's token, as the CPU's argmax: a
// value replaces the best only when larger). Stage 1: grid (rows, chunks), 256 threads, each block
// the best (value, index) of its chunk of the row; stage 2: one warp per row over the chunks.
__device__ __forceinline__ void best_of(float& best, int& at, float v, int i) {
    if (at < 0 || v > best || (v == best && i < at)) { best = v; at = i; }
}
extern "C" __global__ void argmax_part(const float* x, int n, int chunk, float* pv, int* pi) {
    const float* r = x + (u64)blockIdx.x * n;
    int lo = blockIdx.y * chunk, hi = min(n, lo + chunk);
    float best = 0.f;
    int at = -1;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) best_of(best, at, r[i], i);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, best, o);
        int i = __shfl_xor_sync(0xffffffffu, at, o);
        if (i >= 0) best_of(best, at, v, i);
    }
    __shared__ float s_v[8];
    __shared__ int s_i[8];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) { s_v[w] = best; s_i[w] = at; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < (int)(blockDim.x >> 5); k++)
            if (s_i[k] >= 0) best_of(best, at, s_v[k], s_i[k]);
        u64 o = (u64)blockIdx.x * gridDim.y + blockIdx.y;
        pv[o] = best;
        pi[o] = at;
    }
}
extern "C" __global__ void argmax_rows(const float* pv, const int* pi, int chunks, u32* out) {
    float best = 0.f;
    int at = -1;
    for (int c = threadIdx.x; c < chunks; c += 32) {
        u64 o = (u64)blockIdx.x * chunks + c;
        if (pi[o] >= 0) best_of(best, at, pv[o], pi[o]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, best, o);
        int i = __shfl_xor_sync(0xffffffffu, at, o);
        if (i >= 0) best_of(best, at, v, i);
    }
    if (threadIdx.x == 0) out[blockIdx.x] = at < 0 ? 0 : (u32)at;
}

// ---- What a sampler with a top-k cut needs of a logits row (Backend::top_of_rows,
// sampler::top_of): the row's n largest values with their columns (ties to the lower column, NaN
// left out) and its values at some columns. One block of 1024 threads per ask: asks[b] = (row, n,
// first of its columns in `at`, their count); out_v / out_i hold kmax slots per ask (the n
// found, in no order — the host sorts them — then column -1), at_v the values at `at` (0 past the
// row). The n-th largest is found by radix selection on an order-keeping integer key (four passes
// of 8 bits, a histogram each), then the values above it are written, and of those equal to it
// the first in column order (a block-wide count over the row in order).
// Key of v: larger for larger v, -0 below +0 (as total order), 0 for NaN (left out).
__device__ __forceinline__ u32 top_key(float v) {
    u32 b = __float_as_uint(v);
    if (v != v) return 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
extern "C" __global__ void __launch_bounds__(1024) top_rows(const float* x, int n, const int4* asks, const int* at, int kmax,
                                                            float* out_v, int* out_i, float* at_v) {
    __shared__ u32 hist[256];
    __shared__ u32 s_digit, s_left, s_count;
    __shared__ u32 s_warp[32];
    int4 a = asks[blockIdx.x];
    const float* r = x + (u64)a.x * n;
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    float* ov = out_v + (u64)blockIdx.x * kmax;
    int* oi = out_i + (u64)blockIdx.x * kmax;
    for (int j = tid; j < a.w; j += blockDim.x) {
        int c = at[a.z + j];
        at_v[a.z + j] = c >= 0 && c < n ? r[c] : 0.f;
    }
    for (int j = tid; j < kmax; j += blockDim.x) oi[j] = -1;
    // The key prefix of the wanted value so far (its top bits), and how many of those keys with
    // this prefix are still wanted.
    u32 prefix = 0, mask = 0, left = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        // (Most of a row's values share their top bytes: a warp adds its equal bins at once.)
        for (int i0 = 0; i0 < n; i0 += blockDim.x) {
            int i = i0 + tid;
            u32 k = i < n ? top_key(r[i]) : 0u;
            bool in = k != 0 && (k & mask) == prefix;
            u32 bin = (k >> shift) & 255, act = __ballot_sync(0xffffffffu, in);
            if (in) {
                u32 same = __match_any_sync(act, bin);
                if (lane == __ffs(same) - 1) atomicAdd(&hist[bin], __popc(same));
            }
        }
        __syncthreads();
        if (tid == 0) {
            if (shift == 24) {
                // Every non-NaN value counted once: how many can be had.
                u32 valid = 0;
                for (int d = 0; d < 256; d++) valid += hist[d];
                left = min((u32)max(a.y, 0), valid);
            }
            u32 acc = 0;
            int d = 255;
            if (left > 0) {
                for (; d > 0 && acc + hist[d] < left; d--) acc += hist[d];
            }
            s_digit = (u32)d;
            s_left = left - acc;
            s_count = left;
        }
        __syncthreads();
        if (s_count == 0) return;
        prefix |= s_digit << shift;
        mask |= 255u << shift;
        left = s_left;
        __syncthreads();
    }
    // prefix: the key of the wanted n-th largest; left: how many of the values equal to it are in.
    if (tid == 0) s_count = 0;
    __syncthreads();
    for (int i = tid; i < n; i += blockDim.x) {
        float v = r[i];
        if (top_key(v) > prefix) {
            u32 slot = atomicAdd(&s_count, 1u);
            ov[slot] = v;
            oi[slot] = i;
        }
    }
    __syncthreads();
    u32 base = s_count, taken = 0;
    for (int i0 = 0; i0 < n && taken < left; i0 += blockDim.x) {
        int i = i0 + tid;
        float v = i < n ? r[i] : 0.f;
        bool hit = i < n && top_key(v) == prefix;
        u32 bits = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) s_warp[w] = __popc(bits);
        __syncthreads();
        u32 before = 0, total = 0;
        for (int k = 0; k < (int)(blockDim.x >> 5); k++) {
            if (k < w) before += s_warp[k];
            total += s_warp[k];
        }
        u32 pos = taken + before + __popc(bits & ((1u << lane) - 1u));
        if (hit && pos < left) {
            ov[base + pos] = v;
            oi[base + pos] = i;
        }
        taken += total;
        __syncthreads();
    }
}

// ---- The tiled layout, made on the device from the GGUF rows (`src`, m rows of `rb` bytes):
// one thread per byte of the tiled tensor (tiles × U units × UB bytes); byte p of a unit's blob
// comes from row (tile·16 + r) at offset `off` of the row's unit (zeros past the rows or blocks).

// (r, offset in the row's unit) of blob byte p.
__device__ __forceinline__ void tile_src_q4_k(int p, int* r, int* off) {
    if (p < 64) { *r = p >> 2; *off = p & 3; return; }
    if (p < 256) { p -= 64; *r = p / 12; *off = 4 + p % 12; return; }
    p -= 256;
    int i = p >> 9, lane = (p & 511) >> 4, slot = (p & 15) >> 2, byte = p & 3;
    *r = (lane >> 2) + 8 * (slot & 1);
    *off = 16 + 32 * i + 4 * ((lane & 3) + 4 * (slot >> 1)) + byte;
}
__device__ __forceinline__ void tile_src_q6_k(int p, int* r, int* off) {
    if (p < 32) { *r = p >> 1; *off = 208 + (p & 1); return; }
    if (p < 288) { p -= 32; *r = p >> 4; *off = 192 + (p & 15); return; }
    if (p < 2336) {
        p -= 288;
        int lane = p >> 6, idx = (p & 63) >> 2, byte = p & 3;
        int rs = idx & 1, hh = (idx >> 1) & 1, q1 = (idx >> 2) & 1, n2 = idx >> 3;
        *r = (lane >> 2) + 8 * rs;
        *off = 64 * n2 + 32 * q1 + 16 * hh + 4 * (lane & 3) + byte;
        return;
    }
    p -= 2336;
    int lane = p >> 5, idx = (p & 31) >> 2, byte = p & 3;
    int rs = idx & 1, hh = (idx >> 1) & 1, n2 = idx >> 2;
    *r = (lane >> 2) + 8 * rs;
    *off = 128 + 32 * n2 + 16 * hh + 4 * (lane & 3) + byte;
}
// Q8_0: `off` counts from the unit's first block (34 bytes each); *blk the block in the unit.
__device__ __forceinline__ void tile_src_q8_0(int p, int* r, int* off, int* blk) {
    if (p < 256) { *r = p >> 4; *blk = (p & 15) >> 1; *off = 34 * *blk + (p & 1); return; }
    p -= 256;
    int j = p >> 9, lane = (p & 511) >> 4, slot = (p & 15) >> 2, byte = p & 3;
    *r = (lane >> 2) + 8 * (slot & 1);
    *blk = j;
    *off = 34 * j + 2 + 4 * ((lane & 3) + 4 * (slot >> 1)) + byte;
}

// nb: the row's blocks (units for the K-quants, 32-value blocks for Q8_0).
#define TILE(TY, UB, SRC_UB, BODY) \
    extern "C" __global__ void tile_##TY(const u8* src, u8* dst, int m, u64 rb, int U, int nb, u64 total) { \
        u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; \
        if (i >= total) return; \
        int p = (int)(i % UB); u64 tu = i / UB; int u = (int)(tu % U), tile = (int)(tu / U); \
        int r, off, blk = 0; \
        BODY; \
        int row = tile * 16 + r; \
        bool in = row < m && (TY == TY_Q8_0 ? u * 8 + blk < nb : u < nb); \
        dst[i] = in ? src[(u64)row * rb + (u64)u * SRC_UB + off] : 0; \
    }
TILE(TY_Q4_K, 2304, 144, tile_src_q4_k(p, &r, &off))
TILE(TY_Q6_K, 3360, 210, tile_src_q6_k(p, &r, &off))
TILE(TY_Q8_0, 4352, 272, tile_src_q8_0(p, &r, &off, &blk))

// ---- Tiled weights decoded to f16 rows for the prompt products that cuBLAS takes: values kk ..
// kk + 7 (kk a multiple of 8) of row r of a unit's blob `b`, exactly as quant.cuh's deq8 gives them
// from GGUF rows.
__device__ __forceinline__ u32 blob32(const u8* b, int p) { return *(const u32*)(b + p); }

template <int TY> __device__ __forceinline__ void deq8_tiled(const u8* b, int r, int kk, float w[8]);

template <> __device__ __forceinline__ void deq8_tiled<TY_Q4_K>(const u8* b, int r, int kk, float w[8]) {
    int sb = kk >> 5, l = kk & 31, wd = l >> 2;
    float sc, mn;
    scale_min_k4(sb, b + 64 + 12 * r, &sc, &mn);
    u32 dm = blob32(b, 4 * r);
    float d = h2f(dm & 0xFFFF) * sc, m = h2f(dm >> 16) * mn;
    int lane = 4 * (r & 7) + (wd & 3), slot = (wd >> 2) * 2 + (r >> 3);
    int p = 256 + (sb >> 1) * 512 + lane * 16 + slot * 4;
    u32 q[2] = {blob32(b, p), blob32(b, p + 16)};
    int sh = 4 * (sb & 1);
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = d * (float)((q[i >> 2] >> (8 * (i & 3) + sh)) & 0xF) - m;
}
template <> __device__ __forceinline__ void deq8_tiled<TY_Q6_K>(const u8* b, int r, int kk, float w[8]) {
    int n2 = kk >> 7, rr = kk & 127, qt = rr >> 5, l = rr & 31, hh = l >> 4, t0 = (l & 15) >> 2;
    int rs = r >> 3, lane = 4 * (r & 7) + t0;
    int iw = ((n2 * 2 + (qt & 1)) * 2 + hh) * 2 + rs, ih = (n2 * 2 + hh) * 2 + rs;
    int pl = 288 + lane * 64 + 4 * iw, ph = 2336 + lane * 32 + 4 * ih;
    u32 ql[2] = {blob32(b, pl), blob32(b, pl + 64)}, qh[2] = {blob32(b, ph), blob32(b, ph + 32)};
    float d = h2f(*(const u16*)(b + 2 * r)) * (float)(signed char)b[32 + 16 * r + 8 * n2 + hh + 2 * qt];
    int s = (qt >> 1) * 4, hs = 2 * qt;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int lo = (ql[i >> 2] >> (8 * (i & 3) + s)) & 0xF, hi = (qh[i >> 2] >> (8 * (i & 3) + hs)) & 3;
        w[i] = d * (float)((lo | (hi << 4)) - 32);
    }
}
template <> __device__ __forceinline__ void deq8_tiled<TY_Q8_0>(const u8* b, int r, int kk, float w[8]) {
    int j = kk >> 5, wd = (kk & 31) >> 2;
    int lane = 4 * (r & 7) + (wd & 3), slot = (wd >> 2) * 2 + (r >> 3);
    int p = 256 + j * 512 + lane * 16 + slot * 4;
    u32 q[2] = {blob32(b, p), blob32(b, p + 16)};
    float d = h2f(*(const u16*)(b + 16 * r + 2 * j));
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = (float)(signed char)(q[i >> 2] >> (8 * (i & 3))) * d;
}

// Rows row0 .. row0 + gridDim.x (row0 a multiple of 16) of a tiled weight of U units a row, rows
// of n values (a multiple of 32), to f16 (one block per row), eight values a thread in one
// 16-byte store (-DDECODE_SCALAR_STORES: eight 2-byte stores, as before, to compare).
template <int TY, int UB> __device__ void decode_tiled_t(const u8* W, int U, int row0, u16* out, int n) {
    int row = row0 + blockIdx.x, tile = row >> 4, r = row & 15;
    u64 o = (u64)blockIdx.x * n;
    for (int j = threadIdx.x * 8; j < n; j += blockDim.x * 8) {
        float v[8];
        deq8_tiled<TY>(W + ((u64)tile * U + (j >> 8)) * UB, r, j & 255, v);
#ifdef DECODE_SCALAR_STORES
#pragma unroll
        for (int i = 0; i < 8; i++) out[o + j + i] = f2h(v[i]);
#else
        uint4 h;
        h.x = (u32)f2h(v[0]) | ((u32)f2h(v[1]) << 16);
        h.y = (u32)f2h(v[2]) | ((u32)f2h(v[3]) << 16);
        h.z = (u32)f2h(v[4]) | ((u32)f2h(v[5]) << 16);
        h.w = (u32)f2h(v[6]) | ((u32)f2h(v[7]) << 16);
        *(uint4*)(out + o + j) = h;
#endif
    }
}
#define DECODE_TILED(TY, UB) \
    extern "C" __global__ void decode_tiled_##TY(const u8* W, int U, int row0, u16* out, int n) { decode_tiled_t<TY, UB>(W, U, row0, out, n); }
DECODE_TILED(TY_Q4_K, 2304)
DECODE_TILED(TY_Q6_K, 3360)
DECODE_TILED(TY_Q8_0, 4352)
