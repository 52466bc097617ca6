// Quantized matrix times a few activation rows (decode and small batches): out = x · Wᵀ with W in
// its GGUF type, x f32 (t rows of n, t <= R), out (t, m). One to four warps per output row: lanes
// take eight consecutive values at a time, decode them once and multiply them into every
// activation row; f32 sums, reduced across the warps. Every output (row, column) is computed by
// the same operations in the same order whatever R and t are — each lane sums its chunks in
// order, then the warp's lanes, then the row's warps; the float operations are spelled out
// (`__fmaf_rn`, `__fadd_rn`: no contraction left to the compiler) — so a decode row's product does
// not depend on how many rows share the launch. (Tiles of 16 / 32 rows giving a warp 4 / 2 output
// rows measured slower than 8-row launches on an H200: bench/runs/2026-12-02-h200/cuda-batched.)

// Eight weights times eight activations (16-byte aligned), in one fixed order.
__device__ __forceinline__ float dot8(const float w[8], const float* x) {
    const float4* xp = (const float4*)x;
    float4 a = xp[0], b = xp[1];
    float s = __fmul_rn(w[0], a.x);
    s = __fmaf_rn(w[1], a.y, s);
    s = __fmaf_rn(w[2], a.z, s);
    s = __fmaf_rn(w[3], a.w, s);
    s = __fmaf_rn(w[4], b.x, s);
    s = __fmaf_rn(w[5], b.y, s);
    s = __fmaf_rn(w[6], b.z, s);
    return __fmaf_rn(w[7], b.w, s);
}

// The warp sums of one output row's `wpr` warps (consecutive in the block) added and written.
template <int R>
__device__ __forceinline__ void row_out(float acc[R], float red[4][R], int wib, int lane, int o, int part, int wpr, float* out, int m, int t) {
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
    if (wpr == 1) {
        if (lane == 0 && o < m) {
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < t) out[(u64)r * m + o] = acc[r];
        }
        return;
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) red[wib][r] = acc[r];
    }
    __syncthreads();
    if (lane == 0 && part == 0 && o < m) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            float s = 0.f;
            for (int k = 0; k < wpr; k++) s = __fadd_rn(s, red[wib + k][r]);
            if (r < t) out[(u64)r * m + o] = s;
        }
    }
}

// `wpr` warps per output row (1, 2 or 4: a matrix of few rows spread over more warps), each a
// share of the row's 256-value chunks, summed through shared memory; four warps per block.
template <int TY, int R>
__device__ void mmv_t(int blk, const u8* W, u64 row_bytes, const float* x, float* out, int n, int m, int t, int wpr) {
    __shared__ float red[4][R];
    int wib = threadIdx.x / 32, lane = threadIdx.x & 31;
    int warp = blk * 4 + wib;
    int o = warp / wpr, part = warp % wpr;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    if (o < m) {
        const u8* row = W + (u64)o * row_bytes;
        if (Blk<TY>::QK == 1 && (n % 8) != 0) {
            for (int j = part * 32 + lane; j < n; j += 32 * wpr) {
                float w = deq1<TY>(row, j);
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (r < t) acc[r] = __fmaf_rn(w, x[(u64)r * n + j], acc[r]);
            }
        } else {
            int S = 256 * wpr;
            int j = part * 256 + lane * 8;
            // Four chunks per step, all decoded (their loads in flight) before the products: one
            // chunk at a time leaves each warp waiting on one load.
            for (; j + 3 * S < n; j += 4 * S) {
                float w[4][8];
#pragma unroll
                for (int u = 0; u < 4; u++) deq8<TY>(row, j + S * u, w[u]);
#pragma unroll
                for (int u = 0; u < 4; u++) {
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        if (r < t) acc[r] = __fadd_rn(acc[r], dot8(w[u], x + (u64)r * n + j + S * u));
                    }
                }
            }
            for (; j < n; j += S) {
                float w[8];
                deq8<TY>(row, j, w);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (r < t) acc[r] = __fadd_rn(acc[r], dot8(w, x + (u64)r * n + j));
                }
            }
        }
    }
    row_out<R>(acc, red, wib, lane, o, part, wpr, out, m, t);
}

// The name is pasted here, where the type's macro is not expanded (mmv_TY_Q4_K_8 ...). The `3`
// kernels multiply up to three weights of one type by the same rows in one launch (a layer's Q, K
// and V, or gate and up): blocks [0, nb0) the first's, the next nb1 the second's, the rest the
// third's; each output row computed exactly as its weight's own launch computes it.
#define MMV(NAME, TY, R) \
    extern "C" __global__ void NAME##_##R(const u8* W, u64 rb, const float* x, float* out, int n, int m, int t, int wpr) { \
        mmv_t<TY, R>(blockIdx.x, W, rb, x, out, n, m, t, wpr); \
    } \
    extern "C" __global__ void NAME##3_##R(const float* x, int n, int t, \
        const u8* W0, u64 rb0, float* o0, int m0, int wpr0, int nb0, \
        const u8* W1, u64 rb1, float* o1, int m1, int wpr1, int nb1, \
        const u8* W2, u64 rb2, float* o2, int m2, int wpr2) { \
        int b = blockIdx.x; \
        if (b < nb0) mmv_t<TY, R>(b, W0, rb0, x, o0, n, m0, t, wpr0); \
        else if ((b -= nb0) < nb1) mmv_t<TY, R>(b, W1, rb1, x, o1, n, m1, t, wpr1); \
        else mmv_t<TY, R>(b - nb1, W2, rb2, x, o2, n, m2, t, wpr2); \
    }
#define MMV_ALL(TY) MMV(mmv_##TY, TY, 1) MMV(mmv_##TY, TY, 2) MMV(mmv_##TY, TY, 4) MMV(mmv_##TY, TY, 8)
FOR_EACH_TYPE(MMV_ALL)

// ---- Integer products on quantized activations (decode and small batches), as llama.cpp's mmvq
// (ggml-cuda/mmvq.cu, vecdotq.cuh) works: the activation rows are quantized to q8_1 (blocks of 32
// int8 with their scale d and d·Σq), the weight's integers are multiplied into them four at a time
// with dp4a, and the block scales applied to the integer sums.

__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// q8_1 activations (llama.cpp's quantize_q8_1): one thread per value, one warp per block of 32;
// `count` values in all, a multiple of 32.
extern "C" __global__ void quantize_q8_1(const float* x, i8* q, float2* ds, u64 count) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    // Whole warps leave together (count and blockDim are multiples of 32).
    if (i >= count) return;
    store_q8_1(x[i], i, q, ds);
}

// Sum of four int8 lanes of a against b.
__device__ __forceinline__ int dot16(const u32 w[4], int4 a) {
    return dp4a((int)w[0], a.x, dp4a((int)w[1], a.y, dp4a((int)w[2], a.z, dp4a((int)w[3], a.w, 0))));
}
__device__ __forceinline__ int sum16(int4 a) {
    const int one = 0x01010101;
    return dp4a(one, a.x, dp4a(one, a.y, dp4a(one, a.z, dp4a(one, a.w, 0))));
}
// An integer of magnitude below 2^22 as f32, exactly (the value I2F gives) through the f32 adder:
// I2F runs at an eighth of the FMA rate.
__device__ __forceinline__ float i2f(int i) { return __fsub_rn(__int_as_float(0x4B400000 + i), 12582912.f); }

// Per weight type: the lane's share of block `ib` of a weight row (`load`), the activation values
// it meets in row r (`act`), and their product (`dot`), with every float operation spelled out.
template <int TY> struct VQ;

// Q4_K: a lane takes 16 bytes of a block's nibbles (32 values: 16 of sub-block 2jj from the low
// nibbles, 16 of 2jj + 1 from the high ones); eight lanes cover a block, a warp four blocks.
template <> struct VQ<TY_Q4_K> {
    static const int LPB = 8, QK = 256;
    struct Act { int4 a, c; float2 e0, e1; };
    u32 lo[4], hi[4];
    float a0, a1, dmin, m0, m1;
    int v0, h;
    __device__ __forceinline__ void load(const u8* row, int ib, int lane) {
        const u8* b = row + (u64)ib * 144;
        int u = lane & 7, jj = u >> 1;
        h = u & 1;
        uint4 q = *(const uint4*)(b + 16 + 32 * jj + 16 * h);
        u32 dm = *(const u32*)b;
        float d = h2f(dm & 0xFFFF), sc0, sc1;
        dmin = h2f(dm >> 16);
        scale_min_k4(2 * jj, b + 4, &sc0, &m0);
        scale_min_k4(2 * jj + 1, b + 4, &sc1, &m1);
        a0 = __fmul_rn(d, sc0);
        a1 = __fmul_rn(d, sc1);
        u32 qv[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) { lo[i] = qv[i] & 0x0F0F0F0Fu; hi[i] = (qv[i] >> 4) & 0x0F0F0F0Fu; }
        v0 = ib * 256 + 64 * jj + 16 * h;
    }
    __device__ __forceinline__ Act act(const i8* qx, const float2* ds, int r, int n) const {
        const i8* xr = qx + (u64)r * n;
        const float2* e = ds + (u64)r * (n / 32) + v0 / 32;
        return Act{*(const int4*)(xr + v0), *(const int4*)(xr + v0 + 32), e[0], e[1]};
    }
    __device__ __forceinline__ float dot(const Act& x) const {
        float s = __fmaf_rn(__fmul_rn(x.e0.x, a0), i2f(dot16(lo, x.a)), __fmul_rn(__fmul_rn(x.e1.x, a1), i2f(dot16(hi, x.c))));
        // The mins: once per sub-block (the h = 0 lane), with the whole activation block's sum.
        if (h == 0) s = __fmaf_rn(-dmin, __fmaf_rn(m0, x.e0.y, __fmul_rn(m1, x.e1.y)), s);
        return s;
    }
};

// Q6_K: a lane takes 16 bytes of ql (two quarter-blocks: low and high nibbles) and the 16 qh
// bytes above them; eight lanes cover a block.
template <> struct VQ<TY_Q6_K> {
    static const int LPB = 8, QK = 256;
    struct Act { int4 a, c; float e0, e1; };
    u32 lo[4], hi[4];
    float s0, s1;
    int v0;
    __device__ __forceinline__ void load(const u8* row, int ib, int lane) {
        const u8* b = row + (u64)ib * 210;
        int u = lane & 7, n2 = u >> 2, qt = (u >> 1) & 1, L = (u & 1) * 16;
        const u8* ql = b + 64 * n2 + 32 * qt + L;
        const u8* qh = b + 128 + 32 * n2 + L;
        float d = h2f(ld16(b + 208));
        s0 = __fmul_rn(d, (float)(i8)b[192 + 8 * n2 + L / 16 + 2 * qt]);
        s1 = __fmul_rn(d, (float)(i8)b[192 + 8 * n2 + L / 16 + 2 * (qt + 2)]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            u32 l = ld32h(ql + 4 * i), hb = ld32h(qh + 4 * i);
            lo[i] = (l & 0x0F0F0F0Fu) | (((hb >> (2 * qt)) & 0x03030303u) << 4);
            hi[i] = ((l >> 4) & 0x0F0F0F0Fu) | (((hb >> (2 * qt + 4)) & 0x03030303u) << 4);
        }
        v0 = ib * 256 + 128 * n2 + 32 * qt + L;
    }
    __device__ __forceinline__ Act act(const i8* qx, const float2* ds, int r, int n) const {
        const i8* xr = qx + (u64)r * n;
        const float2* e = ds + (u64)r * (n / 32) + v0 / 32;
        return Act{*(const int4*)(xr + v0), *(const int4*)(xr + v0 + 64), e[0].x, e[2].x};
    }
    __device__ __forceinline__ float dot(const Act& x) const {
        // Values are q - 32: the sums of the activations take the offset out.
        return __fmaf_rn(__fmul_rn(x.e0, s0), i2f(dot16(lo, x.a) - 32 * sum16(x.a)),
                         __fmul_rn(__fmul_rn(x.e1, s1), i2f(dot16(hi, x.c) - 32 * sum16(x.c))));
    }
};

// Q8_0: a lane takes half a block (16 values); sixteen blocks per warp step.
template <> struct VQ<TY_Q8_0> {
    static const int LPB = 2, QK = 32;
    struct Act { int4 a; float e; };
    u32 w[4];
    float d;
    int v0, ib;
    __device__ __forceinline__ void load(const u8* row, int ib_, int lane) {
        ib = ib_;
        const u8* b = row + (u64)ib * 34;
        int h = lane & 1;
        d = h2f(ld16(b));
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = ld32h(b + 2 + 16 * h + 4 * i);
        v0 = ib * 32 + 16 * h;
    }
    __device__ __forceinline__ Act act(const i8* qx, const float2* ds, int r, int n) const {
        return Act{*(const int4*)(qx + (u64)r * n + v0), ds[(u64)r * (n / 32) + ib].x};
    }
    __device__ __forceinline__ float dot(const Act& x) const { return __fmul_rn(__fmul_rn(x.e, d), i2f(dot16(w, x.a))); }
};

// out (t, m) = x · Wᵀ from q8_1 activations: `wpr` warps per output row (1, 2 or 4: small
// matrices spread over more warps), each warp a share of the row's blocks; four warps per block.
template <int TY, int R>
__device__ void mmvq_t(int blk, const u8* W, u64 rb, const i8* qx, const float2* ds, float* out, int n, int m, int t, int wpr) {
    typedef VQ<TY> Q;
    __shared__ float red[4][R];
    int wib = threadIdx.x / 32, lane = threadIdx.x & 31;
    int warp = blk * 4 + wib;
    int o = warp / wpr, part = warp % wpr;
    const int per = WARP / Q::LPB;  // blocks per warp step
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    if (o < m) {
        const u8* row = W + (u64)o * rb;
        int nb = n / Q::QK;
        int ib = part * per + lane / Q::LPB;
        int step = per * wpr;
        // Two steps at a time: their loads in flight together.
        for (; ib + step < nb; ib += 2 * step) {
            Q w0, w1;
            w0.load(row, ib, lane);
            w1.load(row, ib + step, lane);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < t) acc[r] = __fadd_rn(acc[r], w0.dot(w0.act(qx, ds, r, n)));
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < t) acc[r] = __fadd_rn(acc[r], w1.dot(w1.act(qx, ds, r, n)));
        }
        if (ib < nb) {
            Q w;
            w.load(row, ib, lane);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < t) acc[r] = __fadd_rn(acc[r], w.dot(w.act(qx, ds, r, n)));
        }
    }
    row_out<R>(acc, red, wib, lane, o, part, wpr, out, m, t);
}

// Named as mmv's are (the type's name pasted before its macro is expanded); `3` as mmv's.
#define MMVQ(NAME, TY, R) \
    extern "C" __global__ void NAME##_##R(const u8* W, u64 rb, const i8* qx, const float2* ds, float* out, int n, int m, int t, int wpr) { \
        mmvq_t<TY, R>(blockIdx.x, W, rb, qx, ds, out, n, m, t, wpr); \
    } \
    extern "C" __global__ void NAME##3_##R(const i8* qx, const float2* ds, int n, int t, \
        const u8* W0, u64 rb0, float* o0, int m0, int wpr0, int nb0, \
        const u8* W1, u64 rb1, float* o1, int m1, int wpr1, int nb1, \
        const u8* W2, u64 rb2, float* o2, int m2, int wpr2) { \
        int b = blockIdx.x; \
        if (b < nb0) mmvq_t<TY, R>(b, W0, rb0, qx, ds, o0, n, m0, t, wpr0); \
        else if ((b -= nb0) < nb1) mmvq_t<TY, R>(b, W1, rb1, qx, ds, o1, n, m1, t, wpr1); \
        else mmvq_t<TY, R>(b - nb1, W2, rb2, qx, ds, o2, n, m2, t, wpr2); \
    }
#define MMVQ_ALL(TY) MMVQ(mmvq_##TY, TY, 1) MMVQ(mmvq_##TY, TY, 2) MMVQ(mmvq_##TY, TY, 4) MMVQ(mmvq_##TY, TY, 8)
MMVQ_ALL(TY_Q4_K)
MMVQ_ALL(TY_Q6_K)
MMVQ_ALL(TY_Q8_0)
