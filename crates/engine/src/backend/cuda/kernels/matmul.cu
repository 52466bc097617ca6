// Quantized matrix times a few activation rows (decode and small batches): out = x · Wᵀ with W in
// its GGUF type, x f32 (t rows of n, t <= R), out (t, m). One warp per output row: lanes take
// eight consecutive values at a time, decode them once and multiply them into every activation
// row; f32 sums, reduced across the warp.
// Eight weights times eight activations (16-byte aligned).
__device__ __forceinline__ float dot8(const float w[8], const float* x) {
    const float4* xp = (const float4*)x;
    float4 a = xp[0], b = xp[1];
    return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
}

template <int TY, int R>
__device__ void mmv_t(const u8* W, u64 row_bytes, const float* x, float* out, int n, int m, int t) {
    int o = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (o >= m) return;
    const u8* row = W + (u64)o * row_bytes;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    if (Blk<TY>::QK == 1 && (n % 8) != 0) {
        for (int j = lane; j < n; j += 32) {
            float w = deq1<TY>(row, j);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < t) acc[r] += w * x[(u64)r * n + j];
        }
    } else {
        int j = lane * 8;
        // Four chunks per step, all decoded (their loads in flight) before the products: one
        // chunk at a time leaves each warp waiting on one load, and a matrix of few rows has too
        // few warps to hide that.
        for (; j + 768 < n; j += 1024) {
            float w[4][8];
#pragma unroll
            for (int u = 0; u < 4; u++) deq8<TY>(row, j + 256 * u, w[u]);
#pragma unroll
            for (int u = 0; u < 4; u++) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (r < t) acc[r] += dot8(w[u], x + (u64)r * n + j + 256 * u);
                }
            }
        }
        for (; j < n; j += 256) {
            float w[8];
            deq8<TY>(row, j, w);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < t) acc[r] += dot8(w, x + (u64)r * n + j);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float s = warp_sum(acc[r]);
        if (lane == 0 && r < t) out[(u64)r * m + o] = s;
    }
}

// The name is pasted here, where the type's macro is not expanded (mmv_TY_Q4_K_8 ...).
#define MMV(NAME, TY, R) \
    extern "C" __global__ void NAME##_##R(const u8* W, u64 rb, const float* x, float* out, int n, int m, int t) { \
        mmv_t<TY, R>(W, rb, x, out, n, m, t); \
    }
#define MMV_ALL(TY) MMV(mmv_##TY, TY, 1) MMV(mmv_##TY, TY, 2) MMV(mmv_##TY, TY, 4) MMV(mmv_##TY, TY, 8)
FOR_EACH_TYPE(MMV_ALL)
