// The paged KV cache and attention over it. A page holds PAGE positions of every layer: per layer
// PAGE K rows, then PAGE V rows, each row F16 (2 bytes a value) or Q8_0 (34 bytes per 32 values).
// A step's sequences find their pages through one table of device pointers: sequence s's pages are
// ptab[poff[s] ..].
#define PAGE 64
#define KV_F16 0
#define KV_Q8_0 1
#define MAX_HD 512

struct Step {
    const int* row_seq;  // sequence of each row
    const int* row_pos;  // position of each row
    const int* seq_pos0; // first position of each sequence's rows
    const int* seq_rows; // rows of each sequence
    const int* poff;     // first page-table entry of each sequence
    const u64* ptab;     // page base pointers
};

__device__ __forceinline__ u8* kv_row(const Step& s, int seq, int pos, u64 off, int row_bytes) {
    return (u8*)s.ptab[s.poff[seq] + pos / PAGE] + off + (u64)(pos % PAGE) * row_bytes;
}

// Value d of a cache row.
template <int KT> __device__ __forceinline__ float kv_get(const u8* row, int d) {
    if (KT == KV_F16) return h2f(((const u16*)row)[d]);
    const u8* b = row + (d / 32) * 34;
    return h2f(ld16(b)) * (float)(i8)b[2 + d % 32];
}

// Write row r's K (blockIdx.y even) or V (odd) values at its position: f16, or Q8_0 as the CPU
// backend writes it (d = amax / 127, q = round-half-even(x · 127 / amax)). Blocks of 128 threads, each 256 values of a
// row (blockIdx.y / 2-th): a decode step's few rows spread over several multiprocessors.
extern "C" __global__ void store_kv(Step s, const float* k, const float* v, int kd, int vd, u64 k_off, u64 v_off, int kt) {
    int r = blockIdx.x, which = blockIdx.y & 1, lo = (blockIdx.y >> 1) * 256;
    int dim = which ? vd : kd;
    if (lo >= dim) return;
    int hi = min(dim, lo + 256);
    const float* src = (which ? v : k) + (u64)r * dim;
    int rb = kt == KV_F16 ? 2 * dim : dim / 32 * 34;
    u8* dst = kv_row(s, s.row_seq[r], s.row_pos[r], which ? v_off : k_off, rb);
    if (kt == KV_F16) {
        for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) ((u16*)dst)[i] = f2h(src[i]);
        return;
    }
    int lane = threadIdx.x & 31;
    for (int b = lo / 32 + threadIdx.x / 32; b < hi / 32; b += blockDim.x / 32) {
        float x = src[b * 32 + lane];
        float amax = warp_max(fabsf(x));
        // The CPU's Q8_0 cache rows (quant::dot::quantize_q8_0_ggml): 127/amax, half to even.
        float d = amax / 127.f, id = amax != 0.f ? 127.f / amax : 0.f;
        u8* blk = dst + b * 34;
        blk[2 + lane] = (u8)(i8)__float2int_rn(x * id);
        if (lane == 0) *(u16*)blk = f2h(d);
    }
}

// Softmax attention of one query row and head over its sequence's cache (keys lo ..= hi), f32
// throughout: four warps take every fourth key, each keeps a running max, sum and output
// (online softmax), then the warps are merged. Grid (rows, heads), 128 threads.
template <int KT>
__device__ void attn_t(Step s, const float* q, float* out, int cols, int hd, int n_head, int n_kv, float scale,
                       int window, int causal, u64 k_off, u64 v_off, int k_rb, int v_rb) {
    int r = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int seq = s.row_seq[r], pos = s.row_pos[r];
    int hi = causal ? pos : s.seq_pos0[seq] + s.seq_rows[seq] - 1;
    int lo = (causal && window > 0) ? max(0, pos - window + 1) : 0;
    int kh = h / (n_head / n_kv);
    const int NPL = MAX_HD / 32;
    float qv[NPL], acc[NPL];
    const float* qr = q + (u64)r * cols + h * hd;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        int d = lane + 32 * i;
        qv[i] = d < hd ? qr[d] : 0.f;
        acc[i] = 0.f;
    }
    float mx = -INFINITY, l = 0.f;
    for (int p = lo + w; p <= hi; p += 4) {
        const u8* kr = kv_row(s, seq, p, k_off, k_rb);
        float sc = 0.f;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            int d = lane + 32 * i;
            if (d < hd) sc += qv[i] * kv_get<KT>(kr, kh * hd + d);
        }
        sc = warp_sum(sc) * scale;
        float nm = fmaxf(mx, sc);
        float corr = expf(mx - nm), e = expf(sc - nm);
        l = l * corr + e;
        const u8* vr = kv_row(s, seq, p, v_off, v_rb);
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            int d = lane + 32 * i;
            if (d < hd) acc[i] = acc[i] * corr + e * kv_get<KT>(vr, kh * hd + d);
        }
        mx = nm;
    }
    __shared__ float sm[4], sl[4];
    __shared__ float so[4][MAX_HD];
    if (lane == 0) { sm[w] = mx; sl[w] = l; }
    __syncthreads();
    float M = fmaxf(fmaxf(sm[0], sm[1]), fmaxf(sm[2], sm[3]));
    float f = (mx == -INFINITY) ? 0.f : expf(mx - M);
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        int d = lane + 32 * i;
        if (d < hd) so[w][d] = acc[i] * f;
    }
    __syncthreads();
    float L = 0.f;
    for (int i = 0; i < 4; i++) L += sm[i] == -INFINITY ? 0.f : sl[i] * expf(sm[i] - M);
    float* o = out + (u64)r * cols + h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = (so[0][d] + so[1][d] + so[2][d] + so[3][d]) / L;
}

extern "C" __global__ void attn_f16(Step s, const float* q, float* out, int cols, int hd, int n_head, int n_kv, float scale,
                                    int window, int causal, u64 k_off, u64 v_off, int k_rb, int v_rb) {
    attn_t<KV_F16>(s, q, out, cols, hd, n_head, n_kv, scale, window, causal, k_off, v_off, k_rb, v_rb);
}
extern "C" __global__ void attn_q8_0(Step s, const float* q, float* out, int cols, int hd, int n_head, int n_kv, float scale,
                                     int window, int causal, u64 k_off, u64 v_off, int k_rb, int v_rb) {
    attn_t<KV_Q8_0>(s, q, out, cols, hd, n_head, n_kv, scale, window, causal, k_off, v_off, k_rb, v_rb);
}

// Bidirectional attention over f32 Q/K/V rows (encoders): row r attends to rows
// seq_lo[r] .. seq_hi[r] (exclusive). Grid (rows, heads), 128 threads.
extern "C" __global__ void encoder_attn(const float* q, const float* k, const float* v, float* out, const int* seq_lo,
                                        const int* seq_hi, int cols, int hd, float scale) {
    int r = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int NPL = MAX_HD / 32;
    float qv[NPL], acc[NPL];
    const float* qr = q + (u64)r * cols + h * hd;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        int d = lane + 32 * i;
        qv[i] = d < hd ? qr[d] : 0.f;
        acc[i] = 0.f;
    }
    float mx = -INFINITY, l = 0.f;
    for (int p = seq_lo[r] + w; p < seq_hi[r]; p += 4) {
        const float* kr = k + (u64)p * cols + h * hd;
        const float* vr = v + (u64)p * cols + h * hd;
        float sc = 0.f;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            int d = lane + 32 * i;
            if (d < hd) sc += qv[i] * kr[d];
        }
        sc = warp_sum(sc) * scale;
        float nm = fmaxf(mx, sc);
        float corr = expf(mx - nm), e = expf(sc - nm);
        l = l * corr + e;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            int d = lane + 32 * i;
            if (d < hd) acc[i] = acc[i] * corr + e * vr[d];
        }
        mx = nm;
    }
    __shared__ float sm[4], sl[4];
    __shared__ float so[4][MAX_HD];
    if (lane == 0) { sm[w] = mx; sl[w] = l; }
    __syncthreads();
    float M = fmaxf(fmaxf(sm[0], sm[1]), fmaxf(sm[2], sm[3]));
    float f = (mx == -INFINITY) ? 0.f : expf(mx - M);
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        int d = lane + 32 * i;
        if (d < hd) so[w][d] = acc[i] * f;
    }
    __syncthreads();
    float L = 0.f;
    for (int i = 0; i < 4; i++) L += sm[i] == -INFINITY ? 0.f : sl[i] * expf(sm[i] - M);
    float* o = out + (u64)r * cols + h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = (so[0][d] + so[1][d] + so[2][d] + so[3][d]) / L;
}
