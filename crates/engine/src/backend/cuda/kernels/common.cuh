// Shared by every hf2q CUDA module (prepended by the backend before NVRTC compiles a module).
// No system headers: NVRTC compiles this alone, so f16 conversions are PTX instructions.
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define WARP 32
#define INFINITY __int_as_float(0x7f800000)

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Round to nearest even, as ggml_compute_fp32_to_fp16.
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Round to nearest even (finite values), as ggml_compute_fp32_to_bf16.
__device__ __forceinline__ u16 f2bf(float f) {
    u32 b = __float_as_uint(f);
    return (u16)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }

// A 2-byte aligned little-endian u16 / a u32 from two of them.
__device__ __forceinline__ u16 ld16(const u8* p) { return *(const u16*)p; }
__device__ __forceinline__ u32 ld32h(const u8* p) { return (u32)ld16(p) | ((u32)ld16(p + 2) << 16); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One head of `hd` values normalised in place by a warp, times w when given (head_rms_norm,
// rope_store_kv).
__device__ __forceinline__ void head_norm_warp(float* h, const float* w, int hd, float eps) {
    int lane = threadIdx.x & 31;
    float s = 0.f;
    for (int i = lane; i < hd; i += 32) s += h[i] * h[i];
    s = warp_sum(s);
    float scale = 1.f / sqrtf(s / hd + eps);
    for (int i = lane; i < hd; i += 32) h[i] = w ? (h[i] * scale) * w[i] : h[i] * scale;
}

#define SQRT_2_OVER_PI 0.7978845608f
// The tanh-form GELU in f32. (Computed as the CPU does it, through ggml's f16 table, it was tried
// and measured: the Gemma 4 MoE fixture's Q8_0 logits stayed 0.341 from the CPU's (0.340 in f32)
// and the Gemma 4 PLE F16 logits went from 1.81e-2 to 2.10e-2 off transformers', past the 2e-2
// bound: bench/runs/2026-12-03-h200/cuda-session4 call 1.)
__device__ __forceinline__ float gelu_tanh_f(float x) {
    return 0.5f * x * (1.f + tanhf(SQRT_2_OVER_PI * x * (1.f + 0.044715f * x * x)));
}

// A gated activation of gate a and up b (op 2 SwiGLU, 3 GeGLU): glu_q8, the fused products.
__device__ __forceinline__ float glu1(float a, float b, int op) {
    return op == 2 ? a / (1.f + expf(-a)) * b : gelu_tanh_f(a) * b;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < nw; i++) s += part[i];
    return s;
}

// ---- Programmatic dependent launch (sm_90): a kernel launched with the attribute (the integer
// products) may start while the kernel before it still runs; `pdl_wait` waits for that kernel to
// finish and its writes to be visible, `pdl_trigger` lets the next such kernel start now. Both do
// nothing for kernels launched without it, and on older GPUs.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---- One block of a launch doing the work that waits for all of them (a launch saved): whether
// this block is the last of `blocks` to get here, counted in *cnt, which the last sets back to 0
// for the next launch (or graph replay). What every block wrote before the call is visible to the
// last one, which reads it through the L2 (__ldcg: not from a stale L1 line). Every thread of the
// block calls it, once per launch.
__device__ __forceinline__ bool last_to_finish(int* cnt, int blocks) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(cnt, 1) == blocks - 1;
        if (last) *cnt = 0;
    }
    __syncthreads();
    if (!last) return false;
    __threadfence();
    return true;
}

// ---- Asynchronous copies global -> shared (sm_80+): 16 bytes each (both addresses 16-byte
// aligned), in groups committed and waited for in order.
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
// Wait until at most N of the committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// ---- Activations of the integer products (kernels/mmq.cu). A row of n values is held as int8 in
// units of 256 values (n_pad = n rounded up to 256, zeros past n), each unit's bytes ordered for
// the tensor cores' B fragments: lane tig (= lane % 4) of a warp finds its values of the unit's
// eight 32-value blocks in one 64-byte run — block j's values tig·4 .. +3 then 16 + tig·4 .. +3 at
// byte tig·64 + j·8 — and one f32 scale per 32 values. Two flavours, with the numbers of the CPU
// backend's activation types (quant/src/dot): q8_0 (per 32: d = amax/127 through f16,
// q = rint(v·127/amax)) for Q8_0 weights; q8_K (per 256: iscale = -127 / the first value of largest
// magnitude, q = min(rint(iscale·v), 127), d = 1/iscale, ggml's quantize_row_q8_K_ref; the unit's
// d repeated in its eight scale slots) for the K-quants.

// Where element k of a row goes (bytes from the row's start).
__device__ __forceinline__ int act_pos(int k) {
    int kk = k & 255, j = kk >> 5, w = kk & 31;
    return (k & ~255) + ((w & 15) >> 2) * 64 + j * 8 + (w & 3) + ((w >> 4) << 2);
}

// Value v of element k of a row (0 past n), held by thread k % 256 of 256 consecutive threads of
// the block (eight whole warps: one unit); every thread of the block calls it together (it holds
// block-wide barriers for the q8_K flavour). q0/d0 (the q8_0 flavour) and qk/dk (q8_K) are the
// row's values and scales; either pair may be null (not written).
__device__ void act_q8(float v, int k, signed char* q0, float* d0, signed char* qk, float* dk) {
    __shared__ float s_max[32];
    __shared__ int s_idx[32];
    __shared__ float s_val[4];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, u = w >> 3, loc = threadIdx.x & 255;
    int pos = act_pos(k);
    float a = fabsf(v);
    if (q0) {
        float amax = warp_max(a);
        float d = amax / 127.f, id = amax != 0.f ? 127.f / amax : 0.f;
        q0[pos] = (signed char)__float2int_rn(v * id);
        if (lane == 0) d0[k >> 5] = h2f(f2h(d));
    }
    if (qk) {
        float m = warp_max(a);
        if (lane == 0) s_max[w] = m;
        __syncthreads();
        float amax = s_max[u * 8];
        for (int i = 1; i < 8; i++) amax = fmaxf(amax, s_max[u * 8 + i]);
        unsigned hit = __ballot_sync(0xffffffffu, a == amax);
        if (lane == 0) s_idx[w] = hit ? (w & 7) * 32 + __ffs(hit) - 1 : 1 << 30;
        __syncthreads();
        int first = s_idx[u * 8];
        for (int i = 1; i < 8; i++) first = min(first, s_idx[u * 8 + i]);
        if (loc == first) s_val[u] = v;
        __syncthreads();
        int q = 0;
        float d = 0.f;
        if (amax != 0.f) {
            float iscale = -127.f / s_val[u];
            q = min(__float2int_rn(iscale * v), 127);
            d = 1.f / iscale;
        }
        qk[pos] = (signed char)q;
        if (loc < 8) dk[((k & ~255) >> 5) + loc] = d;
    }
}

// act_q8 for four consecutive values per thread: v holds elements k .. k + 3 of a row (k a multiple
// of 4; 0 past n), held by thread (k % 256) / 4 of 64 consecutive threads of the block (two whole
// warps: one unit); every thread of the block calls it together. The same numbers as act_q8. A
// unit whose threads pass `on` false takes part in the barriers and writes nothing.
__device__ void act_q8x4(float4 v, int k, signed char* q0, float* d0, signed char* qk, float* dk, bool on = true) {
    __shared__ float s_max[32];
    __shared__ int s_idx[32];
    __shared__ float s_val[16];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, u = w >> 1;
    int pos = act_pos(k);
    float vv[4] = {v.x, v.y, v.z, v.w};
    float a[4] = {fabsf(v.x), fabsf(v.y), fabsf(v.z), fabsf(v.w)};
    if (q0) {
        // A block of 32 is eight lanes.
        float amax = fmaxf(fmaxf(a[0], a[1]), fmaxf(a[2], a[3]));
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        float d = amax / 127.f, id = amax != 0.f ? 127.f / amax : 0.f;
        u32 packed = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) packed |= ((u32)(u8)(signed char)__float2int_rn(vv[i] * id)) << (8 * i);
        if (on) *(u32*)(q0 + pos) = packed;
        if (on && (lane & 7) == 0) d0[k >> 5] = h2f(f2h(d));
    }
    if (qk) {
        // The unit's first value of largest magnitude: (magnitude, index in the unit), ties to the
        // lower index.
        float best = a[0];
        int bi = 0;
#pragma unroll
        for (int i = 1; i < 4; i++)
            if (a[i] > best) { best = a[i]; bi = i; }
        bi += k & 255;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ob = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ob > best || (ob == best && oi < bi)) { best = ob; bi = oi; }
        }
        if (lane == 0) { s_max[w] = best; s_idx[w] = bi; }
        __syncthreads();
        float amax = s_max[2 * u];
        int first = s_idx[2 * u];
        if (s_max[2 * u + 1] > amax || (s_max[2 * u + 1] == amax && s_idx[2 * u + 1] < first)) {
            amax = s_max[2 * u + 1];
            first = s_idx[2 * u + 1];
        }
        if (((k & 255) >> 2) == (first >> 2)) s_val[u] = vv[first & 3];
        __syncthreads();
        u32 packed = 0;
        float d = 0.f;
        if (amax != 0.f) {
            float iscale = -127.f / s_val[u];
#pragma unroll
            for (int i = 0; i < 4; i++) packed |= ((u32)(u8)(signed char)min(__float2int_rn(iscale * vv[i]), 127)) << (8 * i);
            d = 1.f / iscale;
        }
        if (on) *(u32*)(qk + pos) = packed;
        if (on && (threadIdx.x & 63) < 8) dk[((k & ~255) >> 5) + (threadIdx.x & 63)] = d;
    }
}

// One rotary pair of a head in place, as the CPU rotates: the second product rounded, the first
// fused (rope in ops.cu, rope_store_kv in attention.cu).
__device__ __forceinline__ void rope_pair(float* x, int a, int b, float2 c) {
    float x0v = x[a], x1v = x[b];
    x[a] = fmaf(x0v, c.x, -(x1v * c.y));
    x[b] = fmaf(x0v, c.y, x1v * c.x);
}
// Pair p of a head of n_dims / 2 = half pairs rotated: values p and p + half (NeoX) or 2p and 2p + 1.
__device__ __forceinline__ void rope_head_pair(float* h, int p, int half, int neox, float2 c) {
    rope_pair(h, neox ? p : 2 * p, neox ? p + half : 2 * p + 1, c);
}

// ---- Mixture-of-experts routing on the device (kernels/mmq.cu moe_route; the router's product
// and routing in one launch, matmul.cu): one warp per row of router logits (n_expert ≤ 1024) -> the
// k experts' ids and weights, as the CPU's (model/blocks.rs route; llama-graph.cpp build_moe_ffn).
// R values a lane (n_expert ≤ 32·R), in registers: lane l holds experts l, l + 32, ... The logits
// are read through the L2 (another block of the launch may have written them). One warp of the
// block calls it at a time (its shared memory is the block's).
// The k chosen values (in rank order) made the experts' weights in place, by one thread: their
// softmax (when the softmax was not taken first), then (normalize) each divided by their sum.
__device__ __forceinline__ void route_weights(float* sel, int k, int softmax_first, int normalize) {
    if (!softmax_first) {
        float m = sel[0];
        for (int j = 1; j < k; j++) m = fmaxf(m, sel[j]);
        double s = 0.0;
        for (int j = 0; j < k; j++) { sel[j] = expf(sel[j] - m); s += (double)sel[j]; }
        float inv = (float)(1.0 / s);
        for (int j = 0; j < k; j++) sel[j] *= inv;
    }
    if (normalize) {
        // The sum clamped to the smallest normal f16 (llama-graph.cpp), added in order.
        float s = 0.f;
        for (int j = 0; j < k; j++) s += sel[j];
        s = fmaxf(s, 6.103515625e-5f);
        for (int j = 0; j < k; j++) sel[j] /= s;
    }
}

// f32::total_cmp's order as a signed integer's: negative values' bits but the sign flipped.
__device__ __forceinline__ int total_key(float v) {
    int b = __float_as_int(v);
    return b ^ (int)((unsigned)(b >> 31) >> 1);
}
template <int R>
__device__ void moe_route_t(const float* x, int ne, int k, int softmax_first, int normalize, int* ids, float* ws) {
    __shared__ __align__(16) float p[32 * R];
    __shared__ float sel[64];
    __shared__ int sid[64];
    int lane = threadIdx.x & 31;
    float v[R];
    float mx = -INFINITY;
#pragma unroll
    for (int r = 0; r < R; r++) {
        int i = lane + 32 * r;
        v[r] = i < ne ? __ldcg(x + i) : -INFINITY;
        mx = fmaxf(mx, v[r]);
    }
    mx = warp_max(mx);
    if (softmax_first) {
        // ggml's soft_max: exp(x - max), summed in double in order, times 1/sum.
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = lane + 32 * r;
            if (i < ne) p[i] = v[r] = expf(v[r] - mx);
        }
        __syncwarp();
        if (lane == 0) {
            double s = 0.0;
            int i = 0;
#pragma unroll 8
            for (; i + 4 <= ne; i += 4) {
                float4 q = *(const float4*)(p + i);
                s += (double)q.x;
                s += (double)q.y;
                s += (double)q.z;
                s += (double)q.w;
            }
            for (; i < ne; i++) s += (double)p[i];
            sel[63] = (float)(1.0 / s);
        }
        __syncwarp();
        float inv = sel[63];
#pragma unroll
        for (int r = 0; r < R; r++) v[r] *= inv;
        __syncwarp();
    }
    // The k largest in f32::total_cmp's order (total_key; as the CPU's route), one a round: each
    // lane's best not yet taken (its experts in id order, so a tie keeps the lower id), then the
    // warp's (ties to the lower id); its lane marks it taken.
    u32 taken = 0;
    for (int j = 0; j < k; j++) {
        float best = 0.f;
        int at = -1;
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = lane + 32 * r;
            if (i < ne && !((taken >> r) & 1) && (at < 0 || total_key(v[r]) > total_key(best))) { best = v[r]; at = i; }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float bv = __shfl_xor_sync(0xffffffffu, best, o);
            int bi = __shfl_xor_sync(0xffffffffu, at, o);
            int kb = total_key(bv), ka = total_key(best);
            if (bi >= 0 && (at < 0 || kb > ka || (kb == ka && bi < at))) { best = bv; at = bi; }
        }
        if (at >= 0 && (at & 31) == lane) taken |= 1u << (at >> 5);
        if (lane == 0) { sel[j] = best; sid[j] = at; }
    }
    __syncwarp();
    if (lane == 0) route_weights(sel, k, softmax_first, normalize);
    __syncwarp();
    if (lane < k) { ids[lane] = sid[lane]; ws[lane] = sel[lane]; }
    if (lane + 32 < k) { ids[lane + 32] = sid[lane + 32]; ws[lane + 32] = sel[lane + 32]; }
}

// The same routing by every thread of the block (blockDim.x a multiple of 32, n_expert ne ≤ NMAX),
// with no serial chain as long as moe_route_t's: the max over the block; the softmax's double sum
// as a tree where that is exact (every term 0 or ≥ 2^-20, so a multiple of 2^-43, and the sums
// ≤ 1024 < 2^10: every partial sum is a double, in any order), else by thread 0 in order as
// moe_route_t; the k largest by rank (how many values are larger, or equal at a lower id: the order
// of moe_route_t's rounds; both in f32::total_cmp's order, total_key). The same ids and weights as
// moe_route_t, bit for bit.
template <int NMAX = 1024>
__device__ void moe_route_blk(const float* x, int ne, int k, int softmax_first, int normalize, int* ids, float* ws) {
    __shared__ __align__(16) float p[NMAX];
    __shared__ __align__(16) int kp[NMAX];
    __shared__ double dpart[32];
    __shared__ float fpart[32];
    __shared__ float sel[64];
    __shared__ int sid[64];
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, w = tid >> 5, nw = nt >> 5;
    const int ne4 = (ne + 3) & ~3;
    float mx = -INFINITY;
    for (int i = tid; i < ne4; i += nt) {
        float v = i < ne ? __ldcg(x + i) : -INFINITY;
        p[i] = v;
        mx = fmaxf(mx, v);
    }
    mx = warp_max(mx);
    if (lane == 0) fpart[w] = mx;
    __syncthreads();
    mx = fpart[0];
    for (int i = 1; i < nw; i++) mx = fmaxf(mx, fpart[i]);
    if (softmax_first) {
        // ggml's soft_max: exp(x - max), summed in double in order, times 1/sum.
        double d = 0.0;
        int inexact = 0;
        for (int i = tid; i < ne; i += nt) {
            float e = expf(p[i] - mx);
            p[i] = e;
            d += (double)e;
            inexact |= !(e == 0.f || e >= 0x1p-20f);
        }
        if (__syncthreads_or(inexact)) {
            if (tid == 0) {
                double s = 0.0;
                for (int i = 0; i < ne; i++) s += (double)p[i];
                dpart[0] = s;
            }
        } else {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
            if (lane == 0) dpart[w] = d;
            __syncthreads();
            if (tid == 0) {
                for (int i = 1; i < nw; i++) d += dpart[i];
                dpart[0] = d;
            }
        }
        __syncthreads();
        float inv = (float)(1.0 / dpart[0]);
        for (int i = tid; i < ne; i += nt) p[i] *= inv;
        __syncthreads();
    }
    // Rank of each value in the CPU's order (f32::total_cmp, ties to the lower id), through
    // integer keys: a total order, NaN and ±0 included, so the ranks are a permutation and every
    // chosen slot is written. (With the floats compared, a NaN logit left slots unwritten: expert
    // ids from stale shared memory, then an illegal address.) The padding sorts below every value.
    for (int i = tid; i < ne4; i += nt) kp[i] = i < ne ? total_key(p[i]) : -2147483647 - 1;
    __syncthreads();
    for (int i = tid; i < ne; i += nt) {
        int v = kp[i];
        int r = 0;
        for (int j = 0; j < ne4; j += 4) {
            int4 q = *(const int4*)(kp + j);
            r += (q.x > v || (q.x == v && j < i)) + (q.y > v || (q.y == v && j + 1 < i)) +
                 (q.z > v || (q.z == v && j + 2 < i)) + (q.w > v || (q.w == v && j + 3 < i));
        }
        if (r < k) { sel[r] = p[i]; sid[r] = i; }
    }
    __syncthreads();
    if (tid == 0) route_weights(sel, k, softmax_first, normalize);
    __syncthreads();
    for (int j = tid; j < k; j += nt) {
        ids[j] = sid[j];
        ws[j] = sel[j];
    }
    __syncthreads();
}

// The routing of rows 0 .. t (n_expert ne ≤ 1024) by every thread of the block (moe_route_blk).
__device__ __forceinline__ void moe_route_rows(const float* logits, int t, int ne, int k, int softmax_first, int normalize,
                                               int* ids, float* ws) {
    for (int row = 0; row < t; row++)
        moe_route_blk<>(logits + (u64)row * ne, ne, k, softmax_first, normalize, ids + row * k, ws + row * k);
}
