// Quantized matrix times a few activation rows (decode and small batches): out = x · Wᵀ with W in
// its GGUF type, x f32 (t rows of n, t <= R), out (t, m). One to four warps per output row: lanes
// take eight consecutive values at a time, decode them once and multiply them into every
// activation row; f32 sums, reduced across the warps.
// Eight weights times eight activations (16-byte aligned).
__device__ __forceinline__ float dot8(const float w[8], const float* x) {
    const float4* xp = (const float4*)x;
    float4 a = xp[0], b = xp[1];
    return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
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
            for (int k = 0; k < wpr; k++) s += red[wib + k][r];
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
                    if (r < t) acc[r] += w * x[(u64)r * n + j];
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
                        if (r < t) acc[r] += dot8(w[u], x + (u64)r * n + j + S * u);
                    }
                }
            }
            for (; j < n; j += S) {
                float w[8];
                deq8<TY>(row, j, w);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (r < t) acc[r] += dot8(w, x + (u64)r * n + j);
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

// Q4_K: a lane takes 16 bytes of a block's nibbles (32 values: 16 of sub-block 2jj from the low
// nibbles, 16 of 2jj + 1 from the high ones); eight lanes cover a block, a warp four blocks.
template <int R>
__device__ __forceinline__ void vdq_q4_k(const u8* row, int ib, int lane, const i8* qx, const float2* ds, int n, int t, float acc[R]) {
    const u8* b = row + (u64)ib * 144;
    int u = lane & 7, jj = u >> 1, h = u & 1;
    uint4 q = *(const uint4*)(b + 16 + 32 * jj + 16 * h);
    u32 dm = *(const u32*)b;
    float d = h2f(dm & 0xFFFF), dmin = h2f(dm >> 16);
    float sc0, m0, sc1, m1;
    scale_min_k4(2 * jj, b + 4, &sc0, &m0);
    scale_min_k4(2 * jj + 1, b + 4, &sc1, &m1);
    u32 lo[4] = {q.x & 0x0F0F0F0Fu, q.y & 0x0F0F0F0Fu, q.z & 0x0F0F0F0Fu, q.w & 0x0F0F0F0Fu};
    u32 hi[4] = {(q.x >> 4) & 0x0F0F0F0Fu, (q.y >> 4) & 0x0F0F0F0Fu, (q.z >> 4) & 0x0F0F0F0Fu, (q.w >> 4) & 0x0F0F0F0Fu};
    int v0 = ib * 256 + 64 * jj + 16 * h;
    int nq = n / 32;
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r < t) {
            const i8* xr = qx + (u64)r * n;
            int4 a = *(const int4*)(xr + v0), c = *(const int4*)(xr + v0 + 32);
            float2 e0 = ds[(u64)r * nq + v0 / 32], e1 = ds[(u64)r * nq + v0 / 32 + 1];
            float s = e0.x * (d * sc0) * (float)dot16(lo, a) + e1.x * (d * sc1) * (float)dot16(hi, c);
            // The mins: once per sub-block (the h = 0 lane), with the whole activation block's sum.
            if (h == 0) s -= dmin * (m0 * e0.y + m1 * e1.y);
            acc[r] += s;
        }
    }
}

// Q6_K: a lane takes 16 bytes of ql (two quarter-blocks: low and high nibbles) and the 16 qh
// bytes above them; eight lanes cover a block.
template <int R>
__device__ __forceinline__ void vdq_q6_k(const u8* row, int ib, int lane, const i8* qx, const float2* ds, int n, int t, float acc[R]) {
    const u8* b = row + (u64)ib * 210;
    int u = lane & 7, n2 = u >> 2, qt = (u >> 1) & 1, L = (u & 1) * 16;
    const u8* ql = b + 64 * n2 + 32 * qt + L;
    const u8* qh = b + 128 + 32 * n2 + L;
    float d = h2f(ld16(b + 208));
    float s0 = d * (float)(i8)b[192 + 8 * n2 + L / 16 + 2 * qt];
    float s1 = d * (float)(i8)b[192 + 8 * n2 + L / 16 + 2 * (qt + 2)];
    u32 lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 l = ld32h(ql + 4 * i), hb = ld32h(qh + 4 * i);
        lo[i] = (l & 0x0F0F0F0Fu) | (((hb >> (2 * qt)) & 0x03030303u) << 4);
        hi[i] = ((l >> 4) & 0x0F0F0F0Fu) | (((hb >> (2 * qt + 4)) & 0x03030303u) << 4);
    }
    int v0 = ib * 256 + 128 * n2 + 32 * qt + L;
    int nq = n / 32;
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r < t) {
            const i8* xr = qx + (u64)r * n;
            int4 a = *(const int4*)(xr + v0), c = *(const int4*)(xr + v0 + 64);
            float e0 = ds[(u64)r * nq + v0 / 32].x, e1 = ds[(u64)r * nq + v0 / 32 + 2].x;
            // Values are q - 32: the sums of the activations take the offset out.
            acc[r] += e0 * s0 * (float)(dot16(lo, a) - 32 * sum16(a)) + e1 * s1 * (float)(dot16(hi, c) - 32 * sum16(c));
        }
    }
}

// Q8_0: a lane takes half a block (16 values); sixteen blocks per warp step.
template <int R>
__device__ __forceinline__ void vdq_q8_0(const u8* row, int ib, int lane, const i8* qx, const float2* ds, int n, int t, float acc[R]) {
    const u8* b = row + (u64)ib * 34;
    int h = lane & 1;
    float d = h2f(ld16(b));
    u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = ld32h(b + 2 + 16 * h + 4 * i);
    int v0 = ib * 32 + 16 * h;
    int nq = n / 32;
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r < t) {
            int4 a = *(const int4*)(qx + (u64)r * n + v0);
            acc[r] += ds[(u64)r * nq + ib].x * d * (float)dot16(w, a);
        }
    }
}

// out (t, m) = x · Wᵀ from q8_1 activations: `wpr` warps per output row (1, 2 or 4: small
// matrices spread over more warps), each warp a share of the row's blocks; four warps per block.
// LPB: lanes per weight block (8, or 2 for Q8_0).
template <int TY, int R>
__device__ void mmvq_t(int blk, const u8* W, u64 rb, const i8* qx, const float2* ds, float* out, int n, int m, int t, int wpr) {
    __shared__ float red[4][R];
    int wib = threadIdx.x / 32, lane = threadIdx.x & 31;
    int warp = blk * 4 + wib;
    int o = warp / wpr, part = warp % wpr;
    const int LPB = TY == TY_Q8_0 ? 2 : 8, QK = TY == TY_Q8_0 ? 32 : 256;
    const int per = WARP / LPB;  // blocks per warp step
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    if (o < m) {
        const u8* row = W + (u64)o * rb;
        int nb = n / QK;
        int ib = part * per + lane / LPB;
        int step = per * wpr;
        // Two steps at a time: their loads in flight together.
        for (; ib + step < nb; ib += 2 * step) {
            if (TY == TY_Q4_K) { vdq_q4_k<R>(row, ib, lane, qx, ds, n, t, acc); vdq_q4_k<R>(row, ib + step, lane, qx, ds, n, t, acc); }
            if (TY == TY_Q6_K) { vdq_q6_k<R>(row, ib, lane, qx, ds, n, t, acc); vdq_q6_k<R>(row, ib + step, lane, qx, ds, n, t, acc); }
            if (TY == TY_Q8_0) { vdq_q8_0<R>(row, ib, lane, qx, ds, n, t, acc); vdq_q8_0<R>(row, ib + step, lane, qx, ds, n, t, acc); }
        }
        if (ib < nb) {
            if (TY == TY_Q4_K) vdq_q4_k<R>(row, ib, lane, qx, ds, n, t, acc);
            if (TY == TY_Q6_K) vdq_q6_k<R>(row, ib, lane, qx, ds, n, t, acc);
            if (TY == TY_Q8_0) vdq_q8_0<R>(row, ib, lane, qx, ds, n, t, acc);
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
