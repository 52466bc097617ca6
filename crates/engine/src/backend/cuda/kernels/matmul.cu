// Quantized matrix times a few activation rows (decode and small batches): out = x · Wᵀ with W in
// its GGUF type, x f32 (t rows of n, t <= R), out (t, m). One to four warps per output row (or, for
// the float weights' plain products at one warp a row, a warp per pair of rows: PAIR): lanes
// take eight consecutive values at a time, decode them once and multiply them into every
// activation row; f32 sums, reduced across the warps. Every output (row, column) is computed by
// the same operations in the same order whatever R and t are — each lane sums its chunks in
// order, then the warp's lanes, then the row's warps; the float operations are spelled out
// (`__fmaf_rn`, `__fadd_rn`: no contraction left to the compiler) — so a decode row's product does
// not depend on how many rows share the launch. (Tiles of 16 / 32 rows giving a warp 4 / 2 output
// rows measured slower than 8-row launches on an H200: bench/runs/2026-12-02-h200/cuda-batched.)
// The float weights' loads without an L1 line or with the L2 told to evict them first, or the
// activations' through the read-only path or kept in the L1 longest, all measured slower on an
// H100 (8B BF16 tg128 0.995× to 0.87×: bench/runs/2026-12-05-h100-e); the products' limit there
// is the activations' loads: a warp per pair of rows (PAIR) loads them once for two.

// Eight weights times eight activations, in one fixed order.
__device__ __forceinline__ float dot8(const float w[8], const float a[8]) {
    float s = __fmul_rn(w[0], a[0]);
#pragma unroll
    for (int i = 1; i < 8; i++) s = __fmaf_rn(w[i], a[i], s);
    return s;
}

// Eight floats at p (16-byte aligned).
__device__ __forceinline__ void ld8(const float* p, float a[8]) {
    const float4* v = (const float4*)p;
    float4 b = v[0], c = v[1];
    a[0] = b.x, a[1] = b.y, a[2] = b.z, a[3] = b.w, a[4] = c.x, a[5] = c.y, a[6] = c.z, a[7] = c.w;
}

// Eight activations at x: as they are, or (NORM) times the norm's weights g, their squares added
// to ss (in order); (ADD) x + y's first, the sum's squares and products.
template <bool NORM, bool ADD = false>
__device__ __forceinline__ void act8(const float* x, const float g[8], float a[8], float& ss, const float* y = nullptr) {
    ld8(x, a);
    if (ADD) {
        float b[8];
        ld8(y, b);
#pragma unroll
        for (int i = 0; i < 8; i++) a[i] = __fadd_rn(a[i], b[i]);
    }
    if (NORM) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            ss = __fmaf_rn(a[i], a[i], ss);
            a[i] = __fmul_rn(a[i], g[i]);
        }
    }
}

// A row's results written (lane 0 of its first warp). C values a lane: the NW weights' sums for
// R activation rows, then (NORM) the R rows' sums of squares; each summed over the warp, then
// over the row's `wpr` warps (consecutive in the block) through shared memory. NORM: the sums
// times 1 / rms of the row's activations; NW = 2: glu(first, second) (op 2 SwiGLU, 3 GeGLU).
// PAIR: the first NW / 2 weights' sums give row o, the others row o + (m + 1) / 2.
template <int R, bool NORM, int NW, bool PAIR = false>
__device__ __forceinline__ void row_out(float* v, float* red, int wib, int lane, int o, int part, int wpr,
                                        float* out, int m, int t, int n, float eps, int op) {
    constexpr int C = (NW + (NORM ? 1 : 0)) * R;
#pragma unroll
    for (int c = 0; c < C; c++) v[c] = warp_sum(v[c]);
    if (wpr > 1) {
        if (lane == 0) {
#pragma unroll
            for (int c = 0; c < C; c++) red[wib * C + c] = v[c];
        }
        __syncthreads();
        if (part != 0) return;
#pragma unroll
        for (int c = 0; c < C; c++) {
            float s = 0.f;
            for (int k = 0; k < wpr; k++) s = __fadd_rn(s, red[(wib + k) * C + c]);
            v[c] = s;
        }
    }
    // PAIR: rows o and o + (m + 1) / 2, each from its half of the NW sums, as alone.
    constexpr int HW = PAIR ? NW / 2 : NW;
    const int h = PAIR ? (m + 1) / 2 : m;
    if (lane != 0 || o >= h) return;
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r >= t) break;
        float scale = NORM ? 1.f / sqrtf(v[NW * R + r] / n + eps) : 1.f;
        auto res = [&](int k) {
            float y = NORM ? __fmul_rn(v[k * R + r], scale) : v[k * R + r];
            if (HW == 2) y = glu1(y, NORM ? __fmul_rn(v[(k + 1) * R + r], scale) : v[(k + 1) * R + r], op);
            return y;
        };
        out[(u64)r * m + o] = res(0);
        if constexpr (PAIR) {
            if (o + h < m) out[(u64)r * m + o + h] = res(HW);
        }
    }
}

// `wpr` warps per output row (1, 2 or 4: a matrix of few rows spread over more warps), each a
// share of the row's 256-value chunks, summed through shared memory; four warps per block.
// The kernel after it may start as soon as every block of it has (programmatic dependent launch,
// common.cuh). A warp's first four chunks of weights, which no kernel before writes, are asked for
// before waiting for the activations: launched early (HF2Q_CUDA_MMV_EARLY=1) the weights would
// stream while the kernel ahead ends — measured slower on an H200, so it is launched in order.
// The fused variant (row_out): NORM, x is the residual stream and the product is that of its RMS
// norm times g (the norm's weights; its 1 / rms applied to the sums at the end, from the squares
// the row's warps add up on the way, so no kernel writes the norm); NW = 2, a warp multiplies row
// o of W0 (gate) and of W1 (up) and writes their gated activation.
// PAIR: a warp multiplies rows o and o + (m + 1) / 2 (NW = 2: of W0, W1 unused; NW = 4, of W0 and
// W1, the fused FFN input's gate and up, measured no faster on an H100 and was not kept), each
// summed as its own launch sums it (no activation loaded twice for them; `Cuda::pairs`).
template <int TY, int R, bool NORM, int NW, bool ADD = false, bool PAIR = false>
__device__ void mmv_t(int blk, const u8* W0, const u8* W1, u64 row_bytes, const float* x, float* out, int n, int m,
                      int t, int wpr, const float* g, float eps, int op, const float* y = nullptr) {
    constexpr int C = (NW + (NORM ? 1 : 0)) * R;
    __shared__ float red[4 * C];
    pdl_trigger();
    int wib = threadIdx.x / 32, lane = threadIdx.x & 31;
    int warp = blk * 4 + wib;
    int o = warp / wpr, part = warp % wpr;
    float v[C];
#pragma unroll
    for (int c = 0; c < C; c++) v[c] = 0.f;
    float* ss = v + NW * R;
    const bool odd = Blk<TY>::QK == 1 && (n % 8) != 0;
    const u8* row[NW];
    // The rows the warps cover (for PAIR, the first of each pair); weight k is W0's or W1's row,
    // of the pair's first or (PAIR, k >= NW / 2) second row.
    const int mw = PAIR ? (m + 1) / 2 : m;
    constexpr int HW = PAIR ? NW / 2 : NW;
#pragma unroll
    for (int k = 0; k < NW; k++) {
        int ro = PAIR && k >= HW ? o + mw : o;
        row[k] = (k % HW == 0 ? W0 : W1) + (u64)(o < mw && ro < m ? ro : 0) * row_bytes;
    }
    const int S = 256 * wpr;
    int j = part * 256 + lane * 8;
    // Four chunks per step, all decoded (their loads in flight) before the products: one chunk
    // at a time leaves each warp waiting on one load.
    float w[NW][4][8];
    bool four = o < mw && !odd && j + 3 * S < n;
    if (four) {
#pragma unroll
        for (int k = 0; k < NW; k++)
#pragma unroll
            for (int u = 0; u < 4; u++) deq8<TY>(row[k], j + S * u, w[k][u]);
    }
    pdl_wait();
    float gv[8];
    if (o < mw) {
        if (odd) {
            for (j = part * 32 + lane; j < n; j += 32 * wpr) {
                float wj[NW];
#pragma unroll
                for (int k = 0; k < NW; k++) wj[k] = deq1<TY>(row[k], j);
                float gj = NORM ? g[j] : 1.f;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (r >= t) break;
                    float a = x[(u64)r * n + j];
                    if (ADD) a = __fadd_rn(a, y[(u64)r * n + j]);
                    if (NORM) {
                        ss[r] = __fmaf_rn(a, a, ss[r]);
                        a = __fmul_rn(a, gj);
                    }
#pragma unroll
                    for (int k = 0; k < NW; k++) v[k * R + r] = __fmaf_rn(wj[k], a, v[k * R + r]);
                }
            }
        } else {
            while (four) {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    if (NORM) ld8(g + j + S * u, gv);
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        if (r >= t) break;
                        float a[8];
                        act8<NORM, ADD>(x + (u64)r * n + j + S * u, gv, a, ss[r], y + (u64)r * n + j + S * u);
#pragma unroll
                        for (int k = 0; k < NW; k++) v[k * R + r] = __fadd_rn(v[k * R + r], dot8(w[k][u], a));
                    }
                }
                j += 4 * S;
                four = j + 3 * S < n;
                if (four) {
#pragma unroll
                    for (int k = 0; k < NW; k++)
#pragma unroll
                        for (int u = 0; u < 4; u++) deq8<TY>(row[k], j + S * u, w[k][u]);
                }
            }
            for (; j < n; j += S) {
                float wv[NW][8];
#pragma unroll
                for (int k = 0; k < NW; k++) deq8<TY>(row[k], j, wv[k]);
                if (NORM) ld8(g + j, gv);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (r >= t) break;
                    float a[8];
                    act8<NORM, ADD>(x + (u64)r * n + j, gv, a, ss[r], y + (u64)r * n + j);
#pragma unroll
                    for (int k = 0; k < NW; k++) v[k * R + r] = __fadd_rn(v[k * R + r], dot8(wv[k], a));
                }
            }
        }
    }
    row_out<R, NORM, NW, PAIR>(v, red, wib, lane, o, part, wpr, out, m, t, n, eps, op);
}

// The name is pasted here, where the type's macro is not expanded (mmv_TY_Q4_K_8 ...). The `3`
// kernels multiply up to three weights of one type by the same rows in one launch (a layer's Q, K
// and V, or gate and up): blocks [0, nb0) the first's, the next nb1 the second's, the rest the
// third's; each output row computed exactly as its weight's own launch computes it. SUF, NW,
// PAIR: the plain kernels (none, 1, false) or, for the float weights, those with a warp per pair
// of rows (p, 2, true; launched with wpr 1).
#define MMV_K(NAME, SUF, TY, R, NW, PAIR) \
    extern "C" __global__ void NAME##SUF##_##R(const u8* W, u64 rb, const float* x, float* out, int n, int m, int t, int wpr) { \
        mmv_t<TY, R, false, NW, false, PAIR>(blockIdx.x, W, W, rb, x, out, n, m, t, wpr, 0, 0.f, 0); \
    } \
    extern "C" __global__ void NAME##SUF##3_##R(const float* x, int n, int t, \
        const u8* W0, u64 rb0, float* o0, int m0, int wpr0, int nb0, \
        const u8* W1, u64 rb1, float* o1, int m1, int wpr1, int nb1, \
        const u8* W2, u64 rb2, float* o2, int m2, int wpr2) { \
        int b = blockIdx.x; \
        if (b < nb0) mmv_t<TY, R, false, NW, false, PAIR>(b, W0, W0, rb0, x, o0, n, m0, t, wpr0, 0, 0.f, 0); \
        else if ((b -= nb0) < nb1) mmv_t<TY, R, false, NW, false, PAIR>(b, W1, W1, rb1, x, o1, n, m1, t, wpr1, 0, 0.f, 0); \
        else mmv_t<TY, R, false, NW, false, PAIR>(b - nb1, W2, W2, rb2, x, o2, n, m2, t, wpr2, 0, 0.f, 0); \
    }
// This file is compiled once per row count of the kernels (compile.rs: modules matmul1, matmul2,
// matmul4 and matmul8, compiled in parallel), MMV_R defined in front: each part makes the kernels
// of its R (MMV_AT expands MMV_R before the name is pasted).
#ifndef MMV_R
#define MMV_R 1
#endif
#define MMV_AT(M, NAME, TY, R) M(NAME, TY, R)
#define MMV(NAME, TY, R) MMV_K(NAME, , TY, R, 1, false)
#define MMV_ALL(TY) MMV_AT(MMV, mmv_##TY, TY, MMV_R)
FOR_EACH_TYPE(MMV_ALL)
#define MMVP(NAME, TY, R) MMV_K(NAME, p, TY, R, 2, true)
#define MMVP_ALL(TY) MMV_AT(MMVP, mmv_##TY, TY, MMV_R)
MMVP_ALL(TY_F32) MMVP_ALL(TY_F16) MMVP_ALL(TY_BF16)

// The fused FFN input for the float weights (F32, F16, BF16): gate (W) and up (W1) by the RMS
// norm of x (g and eps the norm's), out their gated activation (op). (The norm alone fused into
// Q / K / V, and the residual adds into the output and down projections, measured slower on an
// H200: 8B BF16 tg128 206.0 and 214.0 against 217.1 tokens/s with this one alone, 210.3 with
// none; bench/runs/2026-12-04-h200/cuda-session8.)
#define MMVF(NAME, TY, R) \
    extern "C" __global__ void NAME##g_##R(const u8* W, u64 rb, const float* x, float* out, int n, int m, int t, int wpr, \
        const float* g, float eps, const u8* W1, int op) { \
        mmv_t<TY, R, true, 2>(blockIdx.x, W, W1, rb, x, out, n, m, t, wpr, g, eps, op); \
    }
#define MMVF_ALL(TY) MMV_AT(MMVF, mmv_##TY, TY, MMV_R)
MMVF_ALL(TY_F32) MMVF_ALL(TY_F16) MMVF_ALL(TY_BF16)

// The fused FFN input with the residual add before it: the norm of x + y (each sum rounded as
// binary's add rounds it), then, by the last block to finish (counted in cnt, set back to 0 by
// it; every block has read x by then), x += y for the t rows, four values a thread at a time where
// n allows. (At most 128 registers a thread, which the plain fused kernel's ptxas counts come to
// without a bound: four blocks a multiprocessor.)
#define MMVFA(NAME, TY, R) \
    extern "C" __global__ void __launch_bounds__(128, 4) NAME##ga_##R(const u8* W, u64 rb, float* x, float* out, int n, int m, \
        int t, int wpr, const float* g, float eps, const u8* W1, int op, const float* y, int* cnt) { \
        mmv_t<TY, R, true, 2, true>(blockIdx.x, W, W1, rb, x, out, n, m, t, wpr, g, eps, op, y); \
        if (!last_to_finish(cnt, gridDim.x)) return; \
        if ((n & 3) == 0) { \
            float4* x4 = (float4*)x; \
            const float4* y4 = (const float4*)y; \
            _Pragma("unroll 4") \
            for (int i = threadIdx.x; i < t * n / 4; i += blockDim.x) { \
                float4 a = x4[i], b = y4[i]; \
                x4[i] = make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w)); \
            } \
        } else { \
            for (int i = threadIdx.x; i < t * n; i += blockDim.x) x[i] = __fadd_rn(x[i], y[i]); \
        } \
    }
#define MMVFA_ALL(TY) MMV_AT(MMVFA, mmv_##TY, TY, MMV_R)
MMVFA_ALL(TY_F32) MMVFA_ALL(TY_F16) MMVFA_ALL(TY_BF16)

// A MoE router's product (the float weights) and its routing in one launch: the products as
// mmv_TY_R's, then the last block to finish (counted in cnt, which it sets back to 0) routes the t
// rows of logits (moe_route's choice and weights: common.cuh moe_route_rows).
#define MMVR(NAME, TY, R) \
    extern "C" __global__ void NAME##r_##R(const u8* W, u64 rb, const float* x, float* out, int n, int m, int t, int wpr, \
        int* cnt, int k, int softmax_first, int normalize, int* ids, float* ws) { \
        mmv_t<TY, R, false, 1>(blockIdx.x, W, W, rb, x, out, n, m, t, wpr, 0, 0.f, 0); \
        if (!last_to_finish(cnt, gridDim.x)) return; \
        moe_route_rows(out, t, m, k, softmax_first, normalize, ids, ws); \
    }
#define MMVR_ALL(TY) MMV_AT(MMVR, mmv_##TY, TY, MMV_R)
MMVR_ALL(TY_F32) MMVR_ALL(TY_F16) MMVR_ALL(TY_BF16)
