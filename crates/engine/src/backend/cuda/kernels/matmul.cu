// Quantized matrix times a few activation rows (decode and small batches): out = x · Wᵀ with W in
// its GGUF type, x f32 (t rows of n, t <= R), out (t, m). One warp per output row: lanes take
// eight consecutive values at a time, decode them once and multiply them into every activation
// row; f32 sums, reduced across the warp.
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
        for (int j = lane * 8; j < n; j += 256) {
            float w[8];
            deq8<TY>(row, j, w);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < t) {
                    const float4* xp = (const float4*)(x + (u64)r * n + j);
                    float4 a = xp[0], b = xp[1];
                    acc[r] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
                }
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
