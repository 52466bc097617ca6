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

// Value v (element e of a row-major activation buffer) as q8_1, with the numbers of the CPU's q8_0 /
// q8_1 activations (quant/src/dot: ggml's x86 quantize_row_q8_0/q8_1): the 32 lanes of a warp hold
// one block (elements e & ~31 ..); q = round-half-even(v · 127/amax), and lane 0 writes d = amax/127
// and d·Σq, each rounded through f16 as ggml stores them. Every lane of the warp must call it.
__device__ __forceinline__ void store_q8_1(float v, u64 e, signed char* q, float2* ds) {
    float amax = warp_max(fabsf(v));
    float d = amax / 127.f, id = amax != 0.f ? 127.f / amax : 0.f;
    int qi = __float2int_rn(v * id);
    q[e] = (signed char)qi;
    float s = warp_sum((float)qi);
    if ((threadIdx.x & 31) == 0) ds[e / 32] = make_float2(h2f(f2h(d)), h2f(f2h(d * s)));
}
