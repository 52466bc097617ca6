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
// The kernel after it may start as soon as every block of it has (programmatic dependent launch,
// common.cuh). A warp's first four chunks of weights, which no kernel before writes, are asked for
// before waiting for the activations: launched early (HF2Q_CUDA_MMV_EARLY=1) the weights would
// stream while the kernel ahead ends — measured slower on an H200, so it is launched in order.
template <int TY, int R>
__device__ void mmv_t(int blk, const u8* W, u64 row_bytes, const float* x, float* out, int n, int m, int t, int wpr) {
    __shared__ float red[4][R];
    pdl_trigger();
    int wib = threadIdx.x / 32, lane = threadIdx.x & 31;
    int warp = blk * 4 + wib;
    int o = warp / wpr, part = warp % wpr;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    const bool odd = Blk<TY>::QK == 1 && (n % 8) != 0;
    const u8* row = W + (u64)(o < m ? o : 0) * row_bytes;
    const int S = 256 * wpr;
    int j = part * 256 + lane * 8;
    // Four chunks per step, all decoded (their loads in flight) before the products: one chunk
    // at a time leaves each warp waiting on one load.
    float w[4][8];
    bool four = o < m && !odd && j + 3 * S < n;
    if (four) {
#pragma unroll
        for (int u = 0; u < 4; u++) deq8<TY>(row, j + S * u, w[u]);
    }
    pdl_wait();
    if (o < m) {
        if (odd) {
            for (j = part * 32 + lane; j < n; j += 32 * wpr) {
                float v = deq1<TY>(row, j);
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (r < t) acc[r] = __fmaf_rn(v, x[(u64)r * n + j], acc[r]);
            }
        } else {
            while (four) {
#pragma unroll
                for (int u = 0; u < 4; u++) {
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        if (r < t) acc[r] = __fadd_rn(acc[r], dot8(w[u], x + (u64)r * n + j + S * u));
                    }
                }
                j += 4 * S;
                four = j + 3 * S < n;
                if (four) {
#pragma unroll
                    for (int u = 0; u < 4; u++) deq8<TY>(row, j + S * u, w[u]);
                }
            }
            for (; j < n; j += S) {
                float v[8];
                deq8<TY>(row, j, v);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (r < t) acc[r] = __fadd_rn(acc[r], dot8(v, x + (u64)r * n + j));
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
