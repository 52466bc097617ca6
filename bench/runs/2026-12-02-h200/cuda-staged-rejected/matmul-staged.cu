// Matrix-vector products for decode and small batches (mmv_<type>_<rows>).

// Eight weights times eight activations (16-byte aligned).
__device__ __forceinline__ float dot8(const float w[8], const float* x) {
    const float4* xp = (const float4*)x;
    float4 a = xp[0], b = xp[1];
    return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
}

// A row is read in groups of whole blocks whose bytes are a multiple of 16 and which hold at
// least 256 values (so each lane decodes a multiple of eight): Q4_K one block (144 bytes), Q8_0
// eight (272), Q6_K eight (1680), F16 256 values (512).
__host__ __device__ constexpr int group_blocks(int qk, int b) {
    int n = (256 + qk - 1) / qk;
    while ((n * b) % 16 != 0) n *= 2;
    return n;
}

template <int TY> struct Grp {
    static const int NB = group_blocks(Blk<TY>::QK, Blk<TY>::B);
    static const int BYTES = NB * Blk<TY>::B;
    static const int VALS = NB * Blk<TY>::QK;
    // Values per lane, and groups staged at once (about 2 KiB per warp in flight).
    static const int VPL = VALS / 32;
    static const int U = BYTES >= 2048 ? 1 : (2048 / BYTES > 8 ? 8 : 2048 / BYTES);
};

#define MMV_WARPS 4

// Quantized matrix times a few activation rows (decode and small batches): out = x · Wᵀ with W in
// its GGUF type, x f32 (t rows of n, t <= R), out (t, m). One warp per output row. Where rows are
// 16-byte aligned, the warp copies U groups of the row's bytes into shared memory with 16-byte
// loads (all in flight at once, coalesced whatever the block size), then each lane decodes its
// share and multiplies it into every activation row; f32 sums, reduced across the warp. The
// tail of a row (and unaligned rows) is decoded straight from global memory, eight values per lane.
template <int TY, int R>
__device__ void mmv_t(const u8* W, u64 row_bytes, const float* x, float* out, int n, int m, int t) {
    typedef Grp<TY> G;
    __shared__ __align__(16) u8 stage[MMV_WARPS][G::U * G::BYTES];
    int w = threadIdx.x / 32, lane = threadIdx.x & 31;
    int o = blockIdx.x * MMV_WARPS + w;
    if (o >= m) return;
    const u8* row = W + (u64)o * row_bytes;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    if (Blk<TY>::QK == 1 && (n % 8) != 0) {
        for (int j = lane; j < n; j += 32) {
            float wv = deq1<TY>(row, j);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < t) acc[r] += wv * x[(u64)r * n + j];
        }
    } else {
        int j0 = 0;
        if ((row_bytes & 15) == 0 && (((u64)W) & 15) == 0) {
            int groups = n / G::VALS;
            u8* sm = stage[w];
            for (int g0 = 0; g0 < groups; g0 += G::U) {
                int cnt = min(G::U, groups - g0);
                const uint4* src = (const uint4*)(row + (u64)g0 * G::BYTES);
                uint4* dst = (uint4*)sm;
                int loads = cnt * (G::BYTES / 16);
#pragma unroll 4
                for (int i = lane; i < loads; i += 32) dst[i] = src[i];
                __syncwarp();
                for (int u = 0; u < cnt; u++) {
                    const u8* gb = sm + u * G::BYTES;
                    int v0 = lane * G::VPL;
                    const float* xg = x + (u64)(g0 + u) * G::VALS + v0;
#pragma unroll
                    for (int k = 0; k < G::VPL; k += 8) {
                        float wv[8];
                        deq8<TY>(gb, v0 + k, wv);
#pragma unroll
                        for (int r = 0; r < R; r++)
                            if (r < t) acc[r] += dot8(wv, xg + (u64)r * n + k);
                    }
                }
                __syncwarp();
            }
            j0 = groups * G::VALS;
        }
        for (int j = j0 + lane * 8; j < n; j += 256) {
            float wv[8];
            deq8<TY>(row, j, wv);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < t) acc[r] += dot8(wv, x + (u64)r * n + j);
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
