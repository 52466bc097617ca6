// ggml's block formats (ggml-common.h), decoded eight values at a time: deq8<TY>(row, j, w) gives
// the values j .. j+8 of a row (j a multiple of 8) as f32, exactly as ggml's dequantize_row_*.
// Type ids are ggml's (GgmlType in the gguf crate).
#define TY_F32 0
#define TY_F16 1
#define TY_Q4_0 2
#define TY_Q4_1 3
#define TY_Q5_0 6
#define TY_Q5_1 7
#define TY_Q8_0 8
#define TY_Q2_K 10
#define TY_Q3_K 11
#define TY_Q4_K 12
#define TY_Q5_K 13
#define TY_Q6_K 14
#define TY_IQ4_NL 20
#define TY_IQ4_XS 23
#define TY_BF16 30
#define TY_MXFP4 39

__constant__ float KV_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
__constant__ float KV_MXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Values per block and bytes per block.
template <int TY> struct Blk;
template <> struct Blk<TY_F32> { static const int QK = 1, B = 4; };
template <> struct Blk<TY_F16> { static const int QK = 1, B = 2; };
template <> struct Blk<TY_BF16> { static const int QK = 1, B = 2; };
template <> struct Blk<TY_Q4_0> { static const int QK = 32, B = 18; };
template <> struct Blk<TY_Q4_1> { static const int QK = 32, B = 20; };
template <> struct Blk<TY_Q5_0> { static const int QK = 32, B = 22; };
template <> struct Blk<TY_Q5_1> { static const int QK = 32, B = 24; };
template <> struct Blk<TY_Q8_0> { static const int QK = 32, B = 34; };
template <> struct Blk<TY_IQ4_NL> { static const int QK = 32, B = 18; };
template <> struct Blk<TY_MXFP4> { static const int QK = 32, B = 17; };
template <> struct Blk<TY_Q2_K> { static const int QK = 256, B = 84; };
template <> struct Blk<TY_Q3_K> { static const int QK = 256, B = 110; };
template <> struct Blk<TY_Q4_K> { static const int QK = 256, B = 144; };
template <> struct Blk<TY_Q5_K> { static const int QK = 256, B = 176; };
template <> struct Blk<TY_Q6_K> { static const int QK = 256, B = 210; };
template <> struct Blk<TY_IQ4_XS> { static const int QK = 256, B = 136; };

// Eight 4-bit values: the low (hi = 0) or high nibbles of bytes q[0..8].
__device__ __forceinline__ void nib8(const u8* q, int hi, int v[8]) {
    u32 a = ld32h(q), b = ld32h(q + 4);
    int s = hi ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[i] = (a >> (8 * i + s)) & 0xF;
        v[i + 4] = (b >> (8 * i + s)) & 0xF;
    }
}

// 6-bit scale and min of sub-block j of a Q4_K / Q5_K block (get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, float* d, float* m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

template <int TY> __device__ __forceinline__ void deq8(const u8* row, int j, float w[8]);

template <> __device__ __forceinline__ void deq8<TY_F32>(const u8* row, int j, float w[8]) {
    const float4* p = (const float4*)(row + 4 * j);
    float4 a = p[0], b = p[1];
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
}
template <> __device__ __forceinline__ void deq8<TY_F16>(const u8* row, int j, float w[8]) {
    uint4 a = *(const uint4*)(row + 2 * j);
    u32 v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; i++) { w[2 * i] = h2f(v[i] & 0xFFFF); w[2 * i + 1] = h2f(v[i] >> 16); }
}
template <> __device__ __forceinline__ void deq8<TY_BF16>(const u8* row, int j, float w[8]) {
    uint4 a = *(const uint4*)(row + 2 * j);
    u32 v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; i++) { w[2 * i] = bf2f(v[i] & 0xFFFF); w[2 * i + 1] = bf2f(v[i] >> 16); }
}
template <> __device__ __forceinline__ void deq8<TY_Q4_0>(const u8* row, int j, float w[8]) {
    const u8* b = row + (j / 32) * 18; int e = j % 32;
    float d = h2f(ld16(b)); int v[8]; nib8(b + 2 + (e % 16), e >= 16, v);
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = (v[i] - 8) * d;
}
template <> __device__ __forceinline__ void deq8<TY_IQ4_NL>(const u8* row, int j, float w[8]) {
    const u8* b = row + (j / 32) * 18; int e = j % 32;
    float d = h2f(ld16(b)); int v[8]; nib8(b + 2 + (e % 16), e >= 16, v);
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = d * KV_IQ4NL[v[i]];
}
template <> __device__ __forceinline__ void deq8<TY_Q4_1>(const u8* row, int j, float w[8]) {
    const u8* b = row + (j / 32) * 20; int e = j % 32;
    float d = h2f(ld16(b)), m = h2f(ld16(b + 2)); int v[8]; nib8(b + 4 + (e % 16), e >= 16, v);
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = v[i] * d + m;
}
template <> __device__ __forceinline__ void deq8<TY_Q5_0>(const u8* row, int j, float w[8]) {
    const u8* b = row + (j / 32) * 22; int e = j % 32;
    float d = h2f(ld16(b)); u32 qh = ld32h(b + 2); int v[8]; nib8(b + 6 + (e % 16), e >= 16, v);
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = ((v[i] | (int)(((qh >> (e + i)) & 1) << 4)) - 16) * d;
}
template <> __device__ __forceinline__ void deq8<TY_Q5_1>(const u8* row, int j, float w[8]) {
    const u8* b = row + (j / 32) * 24; int e = j % 32;
    float d = h2f(ld16(b)), m = h2f(ld16(b + 2)); u32 qh = ld32h(b + 4); int v[8]; nib8(b + 8 + (e % 16), e >= 16, v);
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = (v[i] | (int)(((qh >> (e + i)) & 1) << 4)) * d + m;
}
template <> __device__ __forceinline__ void deq8<TY_Q8_0>(const u8* row, int j, float w[8]) {
    const u8* b = row + (j / 32) * 34; int e = j % 32;
    float d = h2f(ld16(b)); u32 a = ld32h(b + 2 + e), c = ld32h(b + 6 + e);
#pragma unroll
    for (int i = 0; i < 4; i++) { w[i] = (i8)(a >> (8 * i)) * d; w[i + 4] = (i8)(c >> (8 * i)) * d; }
}
template <> __device__ __forceinline__ void deq8<TY_MXFP4>(const u8* row, int j, float w[8]) {
    const u8* b = row + (j / 32) * 17; int e = j % 32;
    u32 x = b[0];
    // GGML_E8M0_TO_FP32_HALF
    float d = __uint_as_float(x < 2 ? (0x00200000u << x) : ((x - 1) << 23));
    const u8* q = b + 1 + (e % 16); int s = e >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = KV_MXFP4[(q[i] >> s) & 0xF] * d;
}
template <> __device__ __forceinline__ void deq8<TY_Q2_K>(const u8* row, int j, float w[8]) {
    const u8* b = row + (j / 256) * 84; int e = j % 256;
    int n = e / 128, r = e % 128, jj = r / 32, l = r % 32;
    u8 sc = b[n * 8 + jj * 2 + l / 16];
    float d = h2f(ld16(b + 80)) * (sc & 0xF), m = h2f(ld16(b + 82)) * (sc >> 4);
    const u8* q = b + 16 + 32 * n + l;
    u32 a = ld32h(q), c = ld32h(q + 4); int sh = 2 * jj;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        w[i] = d * (float)((a >> (8 * i + sh)) & 3) - m;
        w[i + 4] = d * (float)((c >> (8 * i + sh)) & 3) - m;
    }
}
template <> __device__ __forceinline__ void deq8<TY_Q3_K>(const u8* row, int j, float w[8]) {
    const u8* b = row + (j / 256) * 110; int e = j % 256;
    int n = e / 128, r = e % 128, jj = r / 32, l = r % 32;
    int is = n * 8 + jj * 2 + l / 16;
    const u8* s = b + 96;
    int low = is < 8 ? (s[is] & 0xF) : (s[is - 8] >> 4);
    int high = (s[8 + is % 4] >> (2 * (is / 4))) & 3;
    float d = h2f(ld16(b + 108)) * (float)((low | (high << 4)) - 32);
    u32 m = 1u << (n * 4 + jj);
    const u8* q = b + 32 + 32 * n + l; const u8* hm = b + l; int sh = 2 * jj;
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = d * (float)((int)((q[i] >> sh) & 3) - ((hm[i] & m) ? 0 : 4));
}
template <> __device__ __forceinline__ void deq8<TY_Q4_K>(const u8* row, int j, float w[8]) {
    const u8* b = row + (j / 256) * 144; int e = j % 256;
    int jj = e / 64, hi = (e % 64) / 32, l = e % 32;
    float sc, mn; scale_min_k4(2 * jj + hi, b + 4, &sc, &mn);
    float d = h2f(ld16(b)) * sc, m = h2f(ld16(b + 2)) * mn;
    int v[8]; nib8(b + 16 + 32 * jj + l, hi, v);
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = d * v[i] - m;
}
template <> __device__ __forceinline__ void deq8<TY_Q5_K>(const u8* row, int j, float w[8]) {
    const u8* b = row + (j / 256) * 176; int e = j % 256;
    int jj = e / 64, hi = (e % 64) / 32, l = e % 32;
    float sc, mn; scale_min_k4(2 * jj + hi, b + 4, &sc, &mn);
    float d = h2f(ld16(b)) * sc, m = h2f(ld16(b + 2)) * mn;
    int v[8]; nib8(b + 48 + 32 * jj + l, hi, v);
    const u8* qh = b + 16 + l; u8 bit = 1 << (2 * jj + hi);
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = d * (v[i] + ((qh[i] & bit) ? 16 : 0)) - m;
}
template <> __device__ __forceinline__ void deq8<TY_Q6_K>(const u8* row, int j, float w[8]) {
    const u8* b = row + (j / 256) * 210; int e = j % 256;
    int n = e / 128, r = e % 128, qt = r / 32, l = r % 32;
    const u8* ql = b + 64 * n + l + (qt & 1) * 32; int s = (qt >> 1) * 4;
    const u8* qh = b + 128 + 32 * n + l; int hs = 2 * qt;
    float d = h2f(ld16(b + 208)) * (float)(i8)b[192 + 8 * n + l / 16 + 2 * qt];
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = d * (float)((int)(((ql[i] >> s) & 0xF) | (((qh[i] >> hs) & 3) << 4)) - 32);
}
template <> __device__ __forceinline__ void deq8<TY_IQ4_XS>(const u8* row, int j, float w[8]) {
    const u8* b = row + (j / 256) * 136; int e = j % 256;
    int ib = e / 32, l = e % 32;
    int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((ld16(b + 2) >> (2 * ib)) & 3) << 4);
    float d = h2f(ld16(b)) * (float)(ls - 32);
    int v[8]; nib8(b + 8 + 16 * ib + (l % 16), l >= 16, v);
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = d * KV_IQ4NL[v[i]];
}

// One value (for row tails of the float types, whose rows need not be a multiple of 8).
template <int TY> __device__ __forceinline__ float deq1(const u8* row, int j) {
    if (TY == TY_F32) return ((const float*)row)[j];
    if (TY == TY_F16) return h2f(((const u16*)row)[j]);
    if (TY == TY_BF16) return bf2f(((const u16*)row)[j]);
    return 0.f;
}

// Every type with a deq8: X(TY) for each.
#define FOR_EACH_TYPE(X) X(TY_F32) X(TY_F16) X(TY_BF16) X(TY_Q4_0) X(TY_Q4_1) X(TY_Q5_0) X(TY_Q5_1) X(TY_Q8_0) \
    X(TY_Q2_K) X(TY_Q3_K) X(TY_Q4_K) X(TY_Q5_K) X(TY_Q6_K) X(TY_IQ4_NL) X(TY_IQ4_XS) X(TY_MXFP4)
