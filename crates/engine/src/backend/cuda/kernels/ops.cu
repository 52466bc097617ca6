// Row-wise and element-wise ops. Buffers are row-major f32 matrices; `n` is the row length.

// out = x / rms(x) * w (ggml_rms_norm then ggml_mul). One block per row. ADD: x += y first (the
// residual add before a norm; x is written back). Q8: the output also quantized for the integer
// products that multiply it next (common.cuh: act_q8x4, both flavours; q0/d0/qk/dk are row 0's,
// rows n_pad values / n_pad / 32 scales apart); then n is a multiple of 4 and blockDim of 64, four
// values a thread. The products run in the same order in every variant, so they agree bit for bit.
// The MoE combine (weighted_sum_rows) of values 4i .. 4i + 3 of output row r: its k_per slots
// (rows p = r·k_per + k of src, or pos[p]) times their weights w[p], summed in k order, each
// product rounded before its sum (as the CPU's `+= y · w`).
struct WSum {
    const float* src;
    const int* pos;
    const float* w;
    float* sum;  // where the combine is also written (the launch it replaces wrote it)
    int k_per;
};
__device__ __forceinline__ float4 wsum4(const WSum& ws, int r, int n, int i) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
    for (int k = 0; k < ws.k_per; k++) {
        int p = r * ws.k_per + k;
        float4 v = *(const float4*)(ws.src + (u64)(ws.pos ? ws.pos[p] : p) * n + 4 * i);
        float wk = ws.w[p];
        float4 y = make_float4(__fmul_rn(v.x, wk), __fmul_rn(v.y, wk), __fmul_rn(v.z, wk), __fmul_rn(v.w, wk));
        acc = k == 0 ? y : make_float4(__fadd_rn(acc.x, y.x), __fadd_rn(acc.y, y.y), __fadd_rn(acc.z, y.z), __fadd_rn(acc.w, y.w));
    }
    return acc;
}

// WS: y is the MoE combine of the slots of ws (wsum4), made here (n a multiple of 4).
template <bool ADD, bool Q8, bool WS = false>
__device__ void rms_norm_t(float* x, const float* y, const float* w, float* out, signed char* q0, float* d0,
                           signed char* qk, float* dk, int n, int n_pad, float eps, WSum ws = WSum{}) {
    pdl_trigger();
    // The weights of this thread's first four outputs (quantizing) loaded before waiting for the
    // kernel ahead (programmatic dependent launch), which writes x and y.
    float4 w0 = make_float4(0.f, 0.f, 0.f, 0.f);
    if (Q8 && 4 * (int)threadIdx.x < n) w0 = *(const float4*)(w + 4 * threadIdx.x);
    pdl_wait();
    float* xr = x + (u64)blockIdx.x * n;
    float* o = out + (u64)blockIdx.x * n;
    float s = 0.f;
    if ((n & 3) == 0) {
        // 16-byte loads (rows of 4k values are 16-byte aligned).
        float4* x4 = (float4*)xr;
        const float4* y4 = (const float4*)(y + (u64)blockIdx.x * n);
        for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
            float4 v = x4[i];
            if (ADD) {
                float4 b;
                if constexpr (WS) {
                    b = wsum4(ws, blockIdx.x, n, i);
                    *(float4*)(ws.sum + (u64)blockIdx.x * n + 4 * i) = b;
                } else {
                    b = y4[i];
                }
                v = make_float4(v.x + b.x, v.y + b.y, v.z + b.z, v.w + b.w);
                x4[i] = v;
            }
            s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
        const float* yr = y + (u64)blockIdx.x * n;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            float v = xr[i];
            if (ADD) xr[i] = v = v + yr[i];
            s += v * v;
        }
    }
    // (block_sum's barriers also make the block's writes of x visible to all its threads.)
    s = block_sum(s);
    float scale = 1.f / sqrtf(s / n + eps);
    if (!Q8) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = (xr[i] * scale) * w[i];
        return;
    }
    u64 qo = (u64)blockIdx.x * n_pad, dof = (u64)blockIdx.x * (n_pad / 32);
    for (int base = 0; base < n_pad; base += 4 * blockDim.x) {
        int k = base + 4 * threadIdx.x;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (k < n) {
            float4 a = *(const float4*)(xr + k), c = base == 0 ? w0 : *(const float4*)(w + k);
            v = make_float4((a.x * scale) * c.x, (a.y * scale) * c.y, (a.z * scale) * c.z, (a.w * scale) * c.w);
            *(float4*)(o + k) = v;
        }
        act_q8x4(v, k, q0 ? q0 + qo : 0, q0 ? d0 + dof : 0, qk ? qk + qo : 0, qk ? dk + dof : 0);
    }
}

#define Q8_ARGS signed char *q0, float *d0, signed char *qk, float *dk, int n, int n_pad, float eps
extern "C" __global__ void rms_norm(float* x, const float* w, float* out, int n, float eps) {
    rms_norm_t<false, false>(x, x, w, out, 0, 0, 0, 0, n, n, eps);
}
extern "C" __global__ void rms_norm_q8(float* x, const float* w, float* out, Q8_ARGS) {
    rms_norm_t<false, true>(x, x, w, out, q0, d0, qk, dk, n, n_pad, eps);
}
extern "C" __global__ void add_rms_norm(float* x, const float* y, const float* w, float* out, int n, float eps) {
    rms_norm_t<true, false>(x, y, w, out, 0, 0, 0, 0, n, n, eps);
}
extern "C" __global__ void add_rms_norm_q8(float* x, const float* y, const float* w, float* out, Q8_ARGS) {
    rms_norm_t<true, true>(x, y, w, out, q0, d0, qk, dk, n, n_pad, eps);
}
// add_rms_norm_q8 of y = the MoE combine of a step's slots (weighted_sum_rows' arguments first;
// sum: its output, also written): one launch instead of two, the same bits.
extern "C" __global__ void add_ws_rms_norm_q8(const float* src, const int* pos, const float* wk, float* sum, int k_per, float* x,
                                              const float* w, float* out, Q8_ARGS) {
    rms_norm_t<true, true, true>(x, x, w, out, q0, d0, qk, dk, n, n_pad, eps, WSum{src, pos, wk, sum, k_per});
}

// Each head of `hd` values normalised in place, times w when given. One warp per head.
extern "C" __global__ void head_rms_norm(float* x, const float* w, int hd, int heads, float eps) {
    int hw = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (hw >= heads) return;
    head_norm_warp(x + (u64)hw * hd, w, hd, eps);
}

// (x - mean) / sqrt(var + eps) * w + b per row (ggml_norm, mul, add). One block per row.
extern "C" __global__ void layer_norm(const float* x, const float* w, const float* b, float* out, int n, float eps) {
    const float* xr = x + (u64)blockIdx.x * n;
    float* o = out + (u64)blockIdx.x * n;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    float mean = block_sum(s) / n;
    float v = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) { float c = xr[i] - mean; v += c * c; }
    float scale = 1.f / sqrtf(block_sum(v) / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = ((xr[i] - mean) * scale) * w[i] + b[i];
}

// op: 0 gelu (erf), 1 gelu_tanh, 2 scale by a, 3 softcap by a, 4 add a scalar? (unused)
extern "C" __global__ void unary(float* x, u64 len, int op, float a) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    float v = x[i];
    switch (op) {
    case 0: v = 0.5f * v * (1.f + erff(v * 0.70710678118654752f)); break;
    case 1: v = gelu_tanh_f(v); break;
    case 2: v = v * a; break;
    case 3: v = tanhf(v * (1.f / a)) * a; break;
    }
    x[i] = v;
}

// op: 0 x += y, 1 x *= y, 2 out = silu(x) * y, 3 out = gelu_tanh(x) * y.
extern "C" __global__ void binary(const float* x, const float* y, float* out, u64 len, int op) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    float a = x[i], b = y[i], r;
    switch (op) {
    case 0: r = a + b; break;
    case 1: r = a * b; break;
    case 2: r = a / (1.f + expf(-a)) * b; break;
    default: r = gelu_tanh_f(a) * b; break;
    }
    out[i] = r;
}

// binary's gated ops (2 silu, 3 gelu_tanh) on rows of n values (a multiple of 4) that also
// quantize their output for the integer products (as rms_norm_q8): grid (rows, n_pad / 256), 64
// threads, four values each.
extern "C" __global__ void glu_q8(const float* x, const float* y, float* out, signed char* q0, float* d0,
                                  signed char* qk, float* dk, int n, int n_pad, int op) {
    pdl_trigger();
    pdl_wait();
    int row = blockIdx.x, k = blockIdx.y * 256 + 4 * threadIdx.x;
    float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
    if (k < n) {
        u64 i = (u64)row * n + k;
        float4 a = *(const float4*)(x + i), b = *(const float4*)(y + i);
        r = make_float4(glu1(a.x, b.x, op), glu1(a.y, b.y, op), glu1(a.z, b.z, op), glu1(a.w, b.w, op));
        *(float4*)(out + i) = r;
    }
    u64 qo = (u64)row * n_pad, dof = (u64)row * (n_pad / 32);
    act_q8x4(r, k, q0 ? q0 + qo : 0, q0 ? d0 + dof : 0, qk ? qk + qo : 0, qk ? dk + dof : 0);
}

// x[r, c] (op 0: +=, 1: *=) v[c] for a vector v as long as a row.
extern "C" __global__ void row_op(float* x, const float* v, u64 len, int n, int op) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    float b = v[i % n];
    x[i] = op == 0 ? x[i] + b : x[i] * b;
}

// out[r, c] = x[r, off + c] for c < width.
extern "C" __global__ void split_cols(const float* x, float* out, int rows, int cols, int off, int width) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)rows * width) return;
    int r = i / width, c = i % width;
    out[i] = x[(u64)r * cols + off + c];
}

// out[i] = x[idx[i]] (gather, mode 0) or out[idx[i]] = x[i] (scatter, mode 1), rows of n.
extern "C" __global__ void move_rows(const float* x, float* out, const int* idx, int count, int n, int mode) {
    int r = blockIdx.x;
    if (r >= count) return;
    const float* s = x + (u64)(mode == 0 ? idx[r] : r) * n;
    float* d = out + (u64)(mode == 0 ? r : idx[r]) * n;
    for (int c = threadIdx.x; c < n; c += blockDim.x) d[c] = s[c];
}

// out[t] = sum_k w[t*k_per + k] * src[row(t*k_per + k)], in k order (the MoE combine); row(p) is
// p, or pos[p] where the rows are kept in another order (the grouped MoE products' sorted rows).
// Grid (rows, column blocks): a thread per output value, its k_per loads issued together.
extern "C" __global__ void weighted_sum_rows(const float* src, const int* pos, const float* w, float* out, int t, int k_per, int n) {
    pdl_trigger();
    pdl_wait();
    int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (r >= t || c >= n) return;
    float acc = 0.f;
    // (Each product rounded before its sum, as the CPU's and wsum4's.)
#pragma unroll 8
    for (int k = 0; k < k_per; k++) {
        int p = r * k_per + k;
        float y = __fmul_rn(src[(u64)(pos ? pos[p] : p) * n + c], w[p]);
        acc = k == 0 ? y : __fadd_rn(acc, y);
    }
    out[(u64)r * n + c] = acc;
}

// Rotary embedding in place: row r, head h, pair i with (cos, sin) = cs[r * half + i] (the
// host's tables, ggml_rope_cache_init). neox pairs (i, i + n_dims/2), else (2i, 2i+1). One thread
// per (row, head, pair).
extern "C" __global__ void rope(float* x0, int cols0, float* x1, int cols1, const float2* cs, int rows, int hd, int n_dims, int neox) {
    // blockIdx.y picks the buffer: the queries and the keys of a layer in one launch.
    float* x = blockIdx.y ? x1 : x0;
    int cols = blockIdx.y ? cols1 : cols0;
    int half = n_dims / 2, heads = cols / hd;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)rows * heads * half) return;
    int p = i % half, h = (i / half) % heads, r = i / ((u64)half * heads);
    float* v = x + (u64)r * cols + h * hd;
    float2 c = cs[(u64)r * half + p];
    rope_head_pair(v, p, half, neox, c);
}

// Rows of a weight table (any type with a decoder) for ids; out is (count, n). An id with the top
// bit (FED, backend/mod.rs) is row k of `fed` (the last step's argmax, greedy decoding's token).
template <int TY> __device__ void get_rows_t(const u8* table, u64 row_bytes, const u32* ids, const u32* fed, float* out, int n) {
    u32 id = ids[blockIdx.x];
    if (id & 0x80000000u) id = fed[id & 0x7FFFFFFFu];
    const u8* row = table + (u64)id * row_bytes;
    float* o = out + (u64)blockIdx.x * n;
    if (Blk<TY>::QK == 1 && (n % 8) != 0) {
        for (int c = threadIdx.x; c < n; c += blockDim.x) o[c] = deq1<TY>(row, c);
        return;
    }
    for (int j = threadIdx.x * 8; j < n; j += blockDim.x * 8) {
        float w[8];
        deq8<TY>(row, j, w);
#pragma unroll
        for (int i = 0; i < 8; i++) o[j + i] = w[i];
    }
}
#define GET_ROWS(TY) \
    extern "C" __global__ void get_rows_##TY(const u8* t, u64 rb, const u32* ids, const u32* fed, float* out, int n) { \
        get_rows_t<TY>(t, rb, ids, fed, out, n); \
    }
FOR_EACH_TYPE(GET_ROWS)

// A matrix of any type decoded to f16 (mode 0), bf16 (1) or f32 (2), rows r0 .. r0 + count.
template <int TY> __device__ void decode_t(const u8* w, u64 row_bytes, void* out, int n, int mode) {
    const u8* row = w + (u64)blockIdx.x * row_bytes;
    u64 o = (u64)blockIdx.x * n;
    for (int j = threadIdx.x * 8; j < n; j += blockDim.x * 8) {
        float v[8];
        deq8<TY>(row, j, v);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if (mode == 0) ((u16*)out)[o + j + i] = f2h(v[i]);
            else if (mode == 1) ((u16*)out)[o + j + i] = f2bf(v[i]);
            else ((float*)out)[o + j + i] = v[i];
        }
    }
}
#define DECODE(TY) \
    extern "C" __global__ void decode_##TY(const u8* w, u64 rb, void* out, int n, int mode) { decode_t<TY>(w, rb, out, n, mode); }
FOR_EACH_TYPE(DECODE)

// f32 activations to f16 (mode 0) or bf16 (mode 1, round to nearest even), or to f16 after
// rounding them as the CPU backend's integer products do (its vec_dot type, quant/src/dot):
// mode 2 q8_0/q8_1 (act_q8's q8_0 numbers: d·q with d through f16), mode 3 q8_K (256 values:
// iscale = -127 / the first value of largest magnitude, q = min(rint(iscale·v), 127), d = 1/iscale;
// ggml's quantize_row_q8_K_ref). The products that follow then see the CPU's activation values.
// Modes 2 and 3: len a multiple of 32 (256), 256 threads per block.
extern "C" __global__ void to_half(const float* x, u16* out, u64 len, int mode) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (mode == 3) {
        // One block of 256 threads per q8_K block.
        __shared__ float s_max[8];
        __shared__ int s_idx[8];
        int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
        float v = i < len ? x[i] : 0.f, a = fabsf(v);
        float m = warp_max(a);
        if (lane == 0) s_max[w] = m;
        __syncthreads();
        float amax = s_max[0];
        for (int k = 1; k < 8; k++) amax = fmaxf(amax, s_max[k]);
        unsigned hit = __ballot_sync(0xffffffffu, a == amax);
        if (lane == 0) s_idx[w] = hit ? w * 32 + __ffs(hit) - 1 : 1 << 30;
        __syncthreads();
        int first = s_idx[0];
        for (int k = 1; k < 8; k++) first = min(first, s_idx[k]);
        if (i >= len) return;
        if (amax == 0.f) { out[i] = 0; return; }
        float mx = x[(u64)blockIdx.x * 256 + first];
        float iscale = -127.f / mx;
        int q = min(__float2int_rn(iscale * v), 127);
        out[i] = f2h((1.f / iscale) * (float)q);
        return;
    }
    if (i >= len) return;
    float v = x[i];
    if (mode == 2) {
        // Whole warps (len a multiple of 32): one q8 block per warp.
        float amax = warp_max(fabsf(v));
        float d = h2f(f2h(amax / 127.f)), id = amax != 0.f ? 127.f / amax : 0.f;
        out[i] = f2h(d * (float)__float2int_rn(v * id));
        return;
    }
    out[i] = mode == 0 ? f2h(v) : f2bf(v);
}
