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
// Values lo .. hi of a K or V row (src, dim values) into its cache row at dst, by the block.
__device__ void store_seg(u8* dst, const float* src, int lo, int hi, int kt) {
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

extern "C" __global__ void store_kv(Step s, const float* k, const float* v, int kd, int vd, u64 k_off, u64 v_off, int kt) {
    int r = blockIdx.x, which = blockIdx.y & 1, lo = (blockIdx.y >> 1) * 256;
    int dim = which ? vd : kd;
    if (lo >= dim) return;
    int rb = kt == KV_F16 ? 2 * dim : dim / 32 * 34;
    store_seg(kv_row(s, s.row_seq[r], s.row_pos[r], which ? v_off : k_off, rb), (which ? v : k) + (u64)r * dim, lo,
              min(dim, lo + 256), kt);
}

// head_rms_norm (ops.cu) of row r's queries and keys when wq / wk are given, rope of them, then
// store_kv of the roped keys and of the values, in one launch: grid (rows, segments), 128 threads;
// segment y is 256 values of q (the first ceil(qd/256)), of k (the next ceil(kd/256)) or of v (the
// rest), each holding whole heads (256 % hd == 0: the host checks). Each value gets the operations
// of the separate kernels: the same per-head norm (a warp a head), the pair's rotation with the
// same fused product, then the same f16 / Q8_0 store.
extern "C" __global__ void rope_store_kv(Step s, float* q, int qd, float* k, int kd, const float* v, int vd, const float2* cs,
                                         int hd, int n_dims, int neox, u64 k_off, u64 v_off, int kt, const float* wq,
                                         const float* wk, float eps) {
    pdl_trigger();
    pdl_wait();
    int r = blockIdx.x, seg = blockIdx.y;
    int nq = (qd + 255) / 256, nk = (kd + 255) / 256;
    int which = seg < nq ? 0 : seg < nq + nk ? 1 : 2;
    int dim = which == 0 ? qd : which == 1 ? kd : vd;
    int lo = (seg - (which == 0 ? 0 : which == 1 ? nq : nq + nk)) * 256;
    if (lo >= dim) return;
    int hi = min(dim, lo + 256);
    float* row = (which == 0 ? q : which == 1 ? k : (float*)v) + (u64)r * dim;
    if (which < 2) {
        const float* nw = which == 0 ? wq : wk;
        if (nw) {
            for (int h = threadIdx.x / 32; h < (hi - lo) / hd; h += blockDim.x / 32) head_norm_warp(row + lo + h * hd, nw, hd, eps);
            __syncthreads();
        }
        int half = n_dims / 2, h0 = lo / hd;
        for (int i = threadIdx.x; i < (hi - lo) / hd * half; i += blockDim.x) {
            int p = i % half;
            rope_head_pair(row + (h0 + i / half) * hd, p, half, neox, cs[(u64)r * half + p]);
        }
        if (which == 0) return;
        // (The block's writes above are visible to all its threads after the barrier.)
        __syncthreads();
    }
    int rb = kt == KV_F16 ? 2 * dim : dim / 32 * 34;
    store_seg(kv_row(s, s.row_seq[r], s.row_pos[r], which == 2 ? v_off : k_off, rb), row, lo, hi, kt);
}

// The keys row r attends to: lo ..= hi.
__device__ __forceinline__ void key_range(const Step& s, int r, int window, int causal, int* lo, int* hi) {
    int seq = s.row_seq[r], pos = s.row_pos[r];
    *hi = causal ? pos : s.seq_pos0[seq] + s.seq_rows[seq] - 1;
    *lo = (causal && window > 0) ? max(0, pos - window + 1) : 0;
}

// Softmax attention of one query row and head over its sequence's cache (keys lo ..= hi), f32
// throughout: four warps take every fourth key, each keeps a running max, sum and output
// (online softmax), then the warps are merged. Grid (rows, heads), 128 threads. Rows with a split
// index (sidx[r] >= 0) are attn_split's.
template <int KT>
__device__ void attn_t(Step s, const float* q, float* out, const int* sidx, int cols, int hd, int n_head, int n_kv, float scale,
                       int window, int causal, u64 k_off, u64 v_off, int k_rb, int v_rb) {
    int r = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (sidx && sidx[r] >= 0) return;
    int seq = s.row_seq[r], lo, hi;
    key_range(s, r, window, causal, &lo, &hi);
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

extern "C" __global__ void attn_f16(Step s, const float* q, float* out, const int* sidx, int cols, int hd, int n_head, int n_kv, float scale,
                                    int window, int causal, u64 k_off, u64 v_off, int k_rb, int v_rb) {
    attn_t<KV_F16>(s, q, out, sidx, cols, hd, n_head, n_kv, scale, window, causal, k_off, v_off, k_rb, v_rb);
}
extern "C" __global__ void attn_q8_0(Step s, const float* q, float* out, const int* sidx, int cols, int hd, int n_head, int n_kv, float scale,
                                     int window, int causal, u64 k_off, u64 v_off, int k_rb, int v_rb) {
    attn_t<KV_Q8_0>(s, q, out, sidx, cols, hd, n_head, n_kv, scale, window, causal, k_off, v_off, k_rb, v_rb);
}

// ---- Split-K attention for decode rows (rows of sequences with few rows in the step): a row's
// keys are cut into at most SPLIT_MAX splits of whole pages, the split's length depending only on
// the row's key count (so a row's result does not depend on the batch). One block per (row, KV
// head, split) takes the G = n_head / n_kv query heads that read that KV head (each K and V value
// loaded once for all G), a page of keys at a time: scores (a warp per key, four values a lane),
// then the page's softmax terms per head (online softmax across pages), then V (a thread per
// value of the head). Each block writes its output, max and sum; attn_combine merges the splits
// in order.
#define SPLIT_MAX 32
#define SPLIT_G 8

// A split's keys: a multiple of SPLIT_KEYS, at most SPLIT_MAX splits. Short contexts (decode at
// the start of a conversation) get many short splits: a split's block walks its keys one after
// another, so fewer keys per block is less latency per step. (`HF2Q_CUDA_DEFINE=SPLIT_KEYS=N` sets
// another to compare: any N ≥ 1, the kernels walking a split's keys in chunks of their own. 32 and
// 64 measured slower on an H100, bench/runs/2026-12-06-h100-e call 3; 8 and 4 on the whole 48-layer
// MoE 0.999× and 0.986×, 2026-12-06-h100-f call 2.) (A (row, KV head)'s splits as the blocks of one
// thread block cluster, merged through distributed shared memory with no attn_combine_q8 launch,
// the same bits, were slower too: MoE tg128 0.984× on an H100, 2026-12-06-h100-f call 3.)
#ifndef SPLIT_KEYS
#define SPLIT_KEYS 16
#endif
__device__ __forceinline__ int split_len(int nk) {
    return max(SPLIT_KEYS, ((nk + SPLIT_MAX - 1) / SPLIT_MAX + SPLIT_KEYS - 1) / SPLIT_KEYS * SPLIT_KEYS);
}

// Values d .. d+3 of a cache row (d a multiple of 4).
template <int KT> __device__ __forceinline__ void kv_get4(const u8* row, int d, float v[4]) {
    if (KT == KV_F16) {
        uint2 u = *(const uint2*)(row + 2 * d);
        v[0] = h2f(u.x & 0xFFFF); v[1] = h2f(u.x >> 16); v[2] = h2f(u.y & 0xFFFF); v[3] = h2f(u.y >> 16);
        return;
    }
    const u8* b = row + (d / 32) * 34;
    float sc = h2f(ld16(b));
#pragma unroll
    for (int i = 0; i < 4; i++) v[i] = sc * (float)(i8)b[2 + d % 32 + i];
}

// The steps every split-K block takes per chunk of nt keys (nt ≤ 64, CAP score columns), for the
// G query heads of its KV head. Online softmax (a warp a head): the chunk's scores in sc become
// exp(s - new max); ms / ls are the running max and sum, cs the factor for the sums so far.
template <int CAP>
__device__ __forceinline__ void chunk_softmax(float (*sc)[CAP], int nt, int G, float* ms, float* ls, float* cs) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int g = w; g < G; g += 4) {
        float s0 = lane < nt ? sc[g][lane] : -INFINITY, s1 = lane + 32 < nt ? sc[g][lane + 32] : -INFINITY;
        float mo = ms[g], mn = fmaxf(mo, warp_max(fmaxf(s0, s1)));
        float p0 = lane < nt ? expf(s0 - mn) : 0.f, p1 = lane + 32 < nt ? expf(s1 - mn) : 0.f;
        if (lane < CAP) sc[g][lane] = p0;
        if (lane + 32 < CAP) sc[g][lane + 32] = p1;
        float sum = warp_sum(p0 + p1);
        if (lane == 0) {
            float c = expf(mo - mn);
            cs[g] = c;
            ls[g] = ls[g] * c + sum;
            ms[g] = mn;
        }
    }
}
// The outputs (a thread per value of the head, NV values a thread) rescaled by cs, plus the
// chunk's weights times V (value d of key k: vat(k, d)).
template <int NV, int CAP, class VAt>
__device__ __forceinline__ void chunk_v(float acc[SPLIT_G][NV], const float (*sc)[CAP], const float* cs, int nt, int G, int hd,
                                        VAt vat) {
#pragma unroll
    for (int i = 0; i < NV; i++) {
        int d = threadIdx.x + 128 * i;
        if (d < hd) {
#pragma unroll
            for (int g = 0; g < SPLIT_G; g++)
                if (g < G) acc[g][i] *= cs[g];
            for (int k = 0; k < nt; k++) {
                float v = vat(k, d);
#pragma unroll
                for (int g = 0; g < SPLIT_G; g++)
                    if (g < G) acc[g][i] += sc[g][k] * v;
            }
        }
    }
}
// Split j's output, max and sum for attn_combine, per query head h0 + g of row index idx.
template <int NV>
__device__ __forceinline__ void split_store(const float acc[SPLIT_G][NV], const float* ms, const float* ls, float* po, float* pml,
                                            int idx, int n_head, int h0, int j, int G, int hd) {
#pragma unroll
    for (int g = 0; g < SPLIT_G; g++) {
        if (g < G) {
            u64 P = ((u64)idx * n_head + h0 + g) * SPLIT_MAX + j;
#pragma unroll
            for (int i = 0; i < NV; i++) {
                int d = threadIdx.x + 128 * i;
                if (d < hd) po[P * hd + d] = acc[g][i];
            }
            if (threadIdx.x == 0) { pml[2 * P] = ms[g]; pml[2 * P + 1] = ls[g]; }
        }
    }
}

template <int KT>
__device__ void attn_split_t(Step s, const float* q, float* po, float* pml, const int* sidx, int cols, int hd, int n_head, int n_kv,
                             float scale, int window, int causal, u64 k_off, u64 v_off, int k_rb, int v_rb) {
    pdl_trigger();
    pdl_wait();
    int r = blockIdx.x, kh = blockIdx.y / SPLIT_MAX, j = blockIdx.y % SPLIT_MAX;
    int idx = sidx[r];
    if (idx < 0) return;
    int seq = s.row_seq[r], lo, hi;
    key_range(s, r, window, causal, &lo, &hi);
    int nk = hi - lo + 1, len = split_len(nk);
    if (j * len >= nk) return;
    int a = lo + j * len, b = min(hi, a + len - 1);
    int G = n_head / n_kv, h0 = kh * G;
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    __shared__ float qs[SPLIT_G * MAX_HD];
    __shared__ float sc[SPLIT_G][PAGE];
    __shared__ float ms[SPLIT_G], ls[SPLIT_G], cs[SPLIT_G];
    // The G heads' queries are consecutive in the row.
    for (int i = tid; i < G * hd; i += blockDim.x) qs[i] = q[(u64)r * cols + (u64)h0 * hd + i];
    if (tid < G) { ms[tid] = -INFINITY; ls[tid] = 0.f; }
    const int NV = MAX_HD / 128;
    float acc[SPLIT_G][NV];
#pragma unroll
    for (int g = 0; g < SPLIT_G; g++)
#pragma unroll
        for (int i = 0; i < NV; i++) acc[g][i] = 0.f;
    __syncthreads();
    for (int t0 = a; t0 <= b; t0 += PAGE) {
        int nt = min(PAGE, b - t0 + 1);
        for (int k = w; k < nt; k += 4) {
            const u8* kr = kv_row(s, seq, t0 + k, k_off, k_rb);
            float part[SPLIT_G];
#pragma unroll
            for (int g = 0; g < SPLIT_G; g++) part[g] = 0.f;
            for (int d = lane * 4; d < hd; d += 128) {
                float kv[4];
                kv_get4<KT>(kr, kh * hd + d, kv);
#pragma unroll
                for (int g = 0; g < SPLIT_G; g++) {
                    if (g < G) {
                        const float* qg = qs + g * hd + d;
                        part[g] += qg[0] * kv[0] + qg[1] * kv[1] + qg[2] * kv[2] + qg[3] * kv[3];
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < SPLIT_G; g++) {
                if (g < G) {
                    float v = warp_sum(part[g]);
                    if (lane == 0) sc[g][k] = v * scale;
                }
            }
        }
        __syncthreads();
        chunk_softmax<PAGE>(sc, nt, G, ms, ls, cs);
        __syncthreads();
        chunk_v<NV, PAGE>(acc, sc, cs, nt, G, hd,
                          [&](int k, int d) { return kv_get<KT>(kv_row(s, seq, t0 + k, v_off, v_rb), kh * hd + d); });
        __syncthreads();
    }
    split_store<NV>(acc, ms, ls, po, pml, idx, n_head, h0, j, G, hd);
}

extern "C" __global__ void attn_split_f16(Step s, const float* q, float* po, float* pml, const int* sidx, int cols, int hd, int n_head,
                                          int n_kv, float scale, int window, int causal, u64 k_off, u64 v_off, int k_rb, int v_rb) {
    attn_split_t<KV_F16>(s, q, po, pml, sidx, cols, hd, n_head, n_kv, scale, window, causal, k_off, v_off, k_rb, v_rb);
}
extern "C" __global__ void attn_split_q8_0(Step s, const float* q, float* po, float* pml, const int* sidx, int cols, int hd, int n_head,
                                           int n_kv, float scale, int window, int causal, u64 k_off, u64 v_off, int k_rb, int v_rb) {
    attn_split_t<KV_Q8_0>(s, q, po, pml, sidx, cols, hd, n_head, n_kv, scale, window, causal, k_off, v_off, k_rb, v_rb);
}

// attn_combine inside the split-K kernel: the last of the ns splits of (row r, KV head kh) to
// finish (counted in cnt, which it sets back to 0 for the next step) merges the splits of the G
// query heads of kh with combine_one's sums (each head's split weights and sum found once, by a
// warp), and with q0 / qk also quantizes them for the integer product that follows, as
// attn_combine_q8 (G·hd a multiple of 512: whole 256-value units, two at a time; the row's values
// a multiple of 256, so no padding past them). Every thread of the block calls it.
__device__ __forceinline__ void merge_last(const float* po, const float* pml, int* cnt, int r, int idx, int kh, int ns,
                                           int G, int hd, int n_head, int n_kv, int cols, float* out, int n_pad,
                                           signed char* q0, float* d0, signed char* qk, float* dk) {
    __shared__ float e[SPLIT_G][SPLIT_MAX], L[SPLIT_G];
    if (!last_to_finish(cnt + (u64)idx * n_kv + kh, ns)) return;
    int h0 = kh * G, n = G * hd, lane = threadIdx.x & 31;
    // (Through the L2: the other blocks of the grid wrote them.)
    for (int g = threadIdx.x >> 5; g < G; g += blockDim.x >> 5) {
        u64 P0 = ((u64)idx * n_head + h0 + g) * SPLIT_MAX;
        float m = lane < ns ? __ldcg(pml + 2 * (P0 + lane)) : -INFINITY;
        float M = warp_max(m);
        e[g][lane] = lane < ns ? expf(m - M) : 0.f;
        __syncwarp();
        if (lane == 0) {
            float l = 0.f;
            for (int j = 0; j < ns; j++) l += __ldcg(pml + 2 * (P0 + j) + 1) * e[g][j];
            L[g] = l;
        }
    }
    __syncthreads();
    auto one = [&](int c) {
        int g = c / hd, d = c % hd;
        const float* p = po + ((u64)idx * n_head + h0 + g) * SPLIT_MAX * hd + d;
        float o = 0.f;
        for (int j = 0; j < ns; j++) o += __ldcg(p + (u64)j * hd) * e[g][j];
        return o / L[g];
    };
    float* o = out + (u64)r * cols + (u64)h0 * hd;
    if (!q0 && !qk) {
        for (int c = threadIdx.x; c < n; c += blockDim.x) o[c] = one(c);
        return;
    }
    for (int c0 = 0; c0 < n; c0 += 4 * blockDim.x) {
        int c = c0 + 4 * threadIdx.x;
        float4 f = make_float4(one(c), one(c + 1), one(c + 2), one(c + 3));
        *(float4*)(o + c) = f;
        u64 qo = (u64)r * n_pad, dof = (u64)r * (n_pad / 32);
        act_q8x4(f, h0 * hd + c, q0 ? q0 + qo : q0, d0 + dof, qk ? qk + qo : qk, dk + dof);
    }
}

// attn_split over F16 caches with a split's keys staged in shared memory: the same splits, the
// same outputs for attn_combine, the same online softmax per DEC_C keys, but a block brings DEC_C
// keys' K and V rows of its KV head into shared memory with cp.async, all their loads in flight at
// once (the next DEC_C keys' while these are used), instead of one dependent load after another.
// Keys written by earlier steps (below the sequence's first position in this step) are asked for
// before waiting for the kernel ahead (the rope + store that writes this step's keys), so their
// loads overlap it. Scores: a key per eight threads (every eighth run of 8 values of the head
// each, summed across them); V: a thread per value of the head. Heads of at most DEC_HD values, a multiple of 8.
//
// With ri (attn_dec_f16_rope, a step whose sequences have one row each): rope_store_kv's work for
// the block's heads is done here instead of in a launch before (its arguments in ri): the G query
// heads normed and rotated into shared memory; the block of the row's last split (the one whose
// keys reach the row's own position) also makes the row's key of its KV head, normed, rotated and
// rounded to f16, and its value in f16, stores both in the cache for later steps and puts them
// in the stage where the cache load would have put them. The same operations as rope_store_kv's
// (head_norm_warp, rope_pair, f2h), so the same bits.
#define DEC_C 16
#define DEC_HD 256
struct RopeIn {
    const float *k, *v;      // the step's raw keys and values (rows of kd / vd)
    int kd, vd;
    const float2* cs;        // the rope table (a row's n_dims / 2 pairs)
    int n_dims, neox;
    const float *wq, *wk;    // the per-head norms' weights (null: none)
    float eps;
};
template <bool ROPE>
__device__ void attn_dec_t(Step s, const float* q, float* po, float* pml, const int* sidx, int cols, int hd, int n_head, int n_kv,
                           float scale, int window, int causal, u64 k_off, u64 v_off, int k_rb, int v_rb, int* cnt, float* out,
                           int ocols, int n_pad, signed char* q0, float* d0, signed char* qk, float* dk, const RopeIn& ri) {
    pdl_trigger();
    __shared__ __align__(16) u16 ks[2][DEC_C * DEC_HD];
    __shared__ __align__(16) u16 vs[2][DEC_C * DEC_HD];
    __shared__ __align__(16) float qs[SPLIT_G * DEC_HD];
    __shared__ float sc[SPLIT_G][DEC_C];
    __shared__ float ms[SPLIT_G], ls[SPLIT_G], cs[SPLIT_G];
    // (ROPE: the row's new key in f32, then it and its value in f16.)
    __shared__ __align__(16) float kf[ROPE ? DEC_HD : 1];
    __shared__ __align__(16) u16 kn16[ROPE ? DEC_HD : 1], vn16[ROPE ? DEC_HD : 1];
    // (ROPE: the q and k norms' weights, and the row's rope pairs.)
    __shared__ float wn[ROPE ? 2 * DEC_HD : 1];
    __shared__ float2 rc[ROPE ? DEC_HD / 2 : 1];
    // The step's tables were uploaded before its first kernel: read before the wait.
    // The grid's y: (KV head, head group, split); hg groups of the KV head's query heads (hg from
    // the grid: Cuda::attn_hg), each group's G heads a block of their own (with hg > 1 each block
    // of the row's last split makes the new key itself; the group-0 one stores it).
    int hg = gridDim.y / (n_kv * SPLIT_MAX), kq = blockIdx.y / SPLIT_MAX;
    int r = blockIdx.x, kh = kq / hg, j = blockIdx.y % SPLIT_MAX;
    int idx = sidx[r];
    if (idx < 0) return;
    int seq = s.row_seq[r], pos = s.row_pos[r], lo, hi;
    key_range(s, r, window, causal, &lo, &hi);
    int nk = hi - lo + 1, len = split_len(nk);
    if (j * len >= nk) return;
    int a = lo + j * len, b = min(hi, a + len - 1), fresh = s.seq_pos0[seq];
    int G = n_head / n_kv / hg, h0 = kh * (n_head / n_kv) + (kq % hg) * G, tid = threadIdx.x;
    bool store = kq % hg == 0;
    int pk = hd / 8;
    u64 hoff = (u64)kh * hd * 2;
    // Keys t0 .. of a chunk into stage st: those of earlier steps (part 1), of this step (2), all (0).
    auto load = [&](int t0, int st, int part) {
        int nt = min(DEC_C, b - t0 + 1);
        for (int i = tid; i < nt * pk; i += blockDim.x) {
            int k = i / pk, o = i % pk, p = t0 + k;
            if ((part == 1 && p >= fresh) || (part == 2 && p < fresh) || (ROPE && p == pos)) continue;
            cp_async16(ks[st] + k * hd + o * 8, kv_row(s, seq, p, k_off, k_rb) + hoff + o * 16);
            cp_async16(vs[st] + k * hd + o * 8, kv_row(s, seq, p, v_off, v_rb) + hoff + o * 16);
        }
    };
    load(a, 0, 1);
    cp_commit();
    // ROPE: what the rope's steps read that the kernel ahead does not write (the norms' weights,
    // the row's rope pairs, uploaded before the step's first kernel, and the new key's and value's
    // cache rows), fetched before the wait, so that after it only the queries, key and value are
    // loads the block waits on. (Read after the wait, each was a load from the L2 that the next
    // steps waited for.)
    bool mine = ROPE && b == hi && hi == pos;
    const float *wq = 0, *wk = 0;
    const float2* cr = rc;
    u16 *kc = 0, *vc = 0;
    if (ROPE) {
        int half = ri.n_dims / 2;
        for (int i = tid; i < hd; i += blockDim.x) {
            if (ri.wq) wn[i] = ri.wq[i];
            if (mine && ri.wk) wn[DEC_HD + i] = ri.wk[i];
        }
        for (int pr = tid; pr < half; pr += blockDim.x) rc[pr] = ri.cs[(u64)r * half + pr];
        wq = ri.wq ? wn : 0;
        wk = ri.wk ? wn + DEC_HD : 0;
        if (mine && store) {
            kc = (u16*)(kv_row(s, seq, pos, k_off, k_rb) + hoff);
            vc = (u16*)(kv_row(s, seq, pos, v_off, v_rb) + hoff);
        }
    }
    pdl_wait();
    load(a, 0, 2);
    cp_commit();
    // The G heads' queries are consecutive in the row.
    for (int i = tid; i < G * hd; i += blockDim.x) qs[i] = q[(u64)r * cols + (u64)h0 * hd + i];
    if (tid < G) { ms[tid] = -INFINITY; ls[tid] = 0.f; }
    if (ROPE) {
        // rope_store_kv's work for this block (see above); its per-head norm a warp a head.
        int half = ri.n_dims / 2;
        if (mine)
            for (int i = tid; i < hd; i += blockDim.x) {
                kf[i] = ri.k[(u64)r * ri.kd + (u64)kh * hd + i];
                vn16[i] = f2h(ri.v[(u64)r * ri.vd + (u64)kh * hd + i]);
            }
        __syncthreads();
        int w = tid >> 5;
        if (wq)
            for (int g = w; g < G; g += 4) head_norm_warp(qs + g * hd, wq, hd, ri.eps);
        if (mine && wk && w == G % 4) head_norm_warp(kf, wk, hd, ri.eps);
        __syncthreads();
        for (int i = tid; i < G * half; i += blockDim.x) {
            int pr = i % half;
            rope_head_pair(qs + (i / half) * hd, pr, half, ri.neox, cr[pr]);
        }
        if (mine) {
            for (int pr = tid; pr < half; pr += blockDim.x)
                rope_head_pair(kf, pr, half, ri.neox, cr[pr]);
            __syncthreads();
            // (vn16[i] was written by this thread above.)
            for (int i = tid; i < hd; i += blockDim.x) {
                u16 kh16 = f2h(kf[i]);
                if (store) {
                    kc[i] = kh16;
                    vc[i] = vn16[i];
                }
                kn16[i] = kh16;
            }
        }
    }
    const int NV = DEC_HD / 128;
    float acc[SPLIT_G][NV];
#pragma unroll
    for (int g = 0; g < SPLIT_G; g++)
#pragma unroll
        for (int i = 0; i < NV; i++) acc[g][i] = 0.f;
    int st = 0;
    for (int t0 = a; t0 <= b; t0 += DEC_C, st ^= 1) {
        int nt = min(DEC_C, b - t0 + 1);
        // The other stage was last read before the barrier that ended the previous chunk.
        if (t0 + DEC_C <= b) load(t0 + DEC_C, st ^ 1, 0);
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        if (ROPE && t0 <= pos && pos <= t0 + nt - 1) {
            // The row's own key and value, made above, where the load would have put them.
            for (int i = tid; i < hd; i += blockDim.x) {
                ks[st][(pos - t0) * hd + i] = kn16[i];
                vs[st][(pos - t0) * hd + i] = vn16[i];
            }
            __syncthreads();
        }
        {
            int k = tid >> 3, part = tid & 7;
            float pg[SPLIT_G];
#pragma unroll
            for (int g = 0; g < SPLIT_G; g++) pg[g] = 0.f;
            if (k < nt) {
                for (int d = part * 8; d < hd; d += 64) {
                    uint4 kw = *(const uint4*)(ks[st] + k * hd + d);
                    float kv[8] = {h2f(kw.x & 0xFFFF), h2f(kw.x >> 16), h2f(kw.y & 0xFFFF), h2f(kw.y >> 16),
                                   h2f(kw.z & 0xFFFF), h2f(kw.z >> 16), h2f(kw.w & 0xFFFF), h2f(kw.w >> 16)};
#pragma unroll
                    for (int g = 0; g < SPLIT_G; g++) {
                        if (g < G) {
                            const float* qg = qs + g * hd + d;
#pragma unroll
                            for (int e = 0; e < 8; e++) pg[g] += qg[e] * kv[e];
                        }
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < SPLIT_G; g++) {
                if (g < G) {
#pragma unroll
                    for (int o = 1; o < 8; o <<= 1) pg[g] += __shfl_xor_sync(0xffffffffu, pg[g], o);
                    if (part == 0 && k < nt) sc[g][k] = pg[g] * scale;
                }
            }
        }
        __syncthreads();
        chunk_softmax<DEC_C>(sc, nt, G, ms, ls, cs);
        __syncthreads();
        const u16* vst = vs[st];
        chunk_v<NV, DEC_C>(acc, sc, cs, nt, G, hd, [&](int k, int d) { return h2f(vst[k * hd + d]); });
        __syncthreads();
    }
    split_store<NV>(acc, ms, ls, po, pml, idx, n_head, h0, j, G, hd);
    // (cnt null: attn_combine merges them.)
    if (cnt) merge_last(po, pml, cnt, r, idx, kh, (nk + len - 1) / len, G, hd, n_head, n_kv, ocols, out, n_pad, q0, d0, qk, dk);
}
extern "C" __global__ void __launch_bounds__(128) attn_dec_f16(Step s, const float* q, float* po, float* pml, const int* sidx,
                                                               int cols, int hd, int n_head, int n_kv, float scale, int window,
                                                               int causal, u64 k_off, u64 v_off, int k_rb, int v_rb, int* cnt,
                                                               float* out, int ocols, int n_pad, signed char* q0, float* d0,
                                                               signed char* qk, float* dk) {
    attn_dec_t<false>(s, q, po, pml, sidx, cols, hd, n_head, n_kv, scale, window, causal, k_off, v_off, k_rb, v_rb, cnt, out,
                      ocols, n_pad, q0, d0, qk, dk, RopeIn{});
}
extern "C" __global__ void __launch_bounds__(128) attn_dec_f16_rope(Step s, const float* q, float* po, float* pml, const int* sidx,
                                                                    int cols, int hd, int n_head, int n_kv, float scale, int window,
                                                                    int causal, u64 k_off, u64 v_off, int k_rb, int v_rb, int* cnt,
                                                                    float* out, int ocols, int n_pad, signed char* q0, float* d0,
                                                                    signed char* qk, float* dk, const float* k, const float* v,
                                                                    int kd, int vd, const float2* cs, int n_dims, int neox,
                                                                    const float* wq, const float* wk, float eps) {
    attn_dec_t<true>(s, q, po, pml, sidx, cols, hd, n_head, n_kv, scale, window, causal, k_off, v_off, k_rb, v_rb, cnt, out,
                     ocols, n_pad, q0, d0, qk, dk, RopeIn{k, v, kd, vd, cs, n_dims, neox, wq, wk, eps});
}

// The number of splits of row r's keys (from the step's tables: readable before the wait for the
// kernel ahead).
__device__ __forceinline__ int combine_splits(const Step& s, int r, int window, int causal) {
    int lo, hi;
    key_range(s, r, window, causal, &lo, &hi);
    int nk = hi - lo + 1, len = split_len(nk);
    return (nk + len - 1) / len;
}
// Value d of head h of row idx's ns splits, merged in split order. Where there are at most
// COMBINE_FAST splits (decode at up to 128 keys), every split's max, sum and value are asked for
// at once (unrolled, predicated: one wait on the L2, not one a split); otherwise loops over the
// splits. The same operations in the same order either way. (958dca1 unrolled all SPLIT_MAX
// splits: 155 registers in attn_combine_q8 against the loops' 32 (ptxas -v, NVRTC 13.2, sm_90),
// one 256-thread block an SM, so steps of many rows went in waves; with 8 at most, 52: four.
// -DCOMBINE_LOOP: the loops alone, to compare.)
#ifndef COMBINE_FAST
#define COMBINE_FAST 8
#endif
__device__ __forceinline__ float combine_one(const float* po, const float* pml, int idx, int ns, int h, int d, int hd,
                                             int n_head) {
    u64 P0 = ((u64)idx * n_head + h) * SPLIT_MAX;
#ifndef COMBINE_LOOP
    if (ns <= COMBINE_FAST) {
        float m[COMBINE_FAST], l[COMBINE_FAST], v[COMBINE_FAST];
#pragma unroll
        for (int j = 0; j < COMBINE_FAST; j++) {
            if (j < ns) {
                float2 t = *(const float2*)(pml + 2 * (P0 + j));
                m[j] = t.x;
                l[j] = t.y;
                v[j] = po[(P0 + j) * hd + d];
            }
        }
        float M = -INFINITY;
#pragma unroll
        for (int j = 0; j < COMBINE_FAST; j++)
            if (j < ns) M = fmaxf(M, m[j]);
        float L = 0.f;
#pragma unroll
        for (int j = 0; j < COMBINE_FAST; j++)
            if (j < ns) L += l[j] * expf(m[j] - M);
        float o = 0.f;
#pragma unroll
        for (int j = 0; j < COMBINE_FAST; j++)
            if (j < ns) o += v[j] * expf(m[j] - M);
        return o / L;
    }
#endif
    float M = -INFINITY;
    for (int j = 0; j < ns; j++) M = fmaxf(M, pml[2 * (P0 + j)]);
    float L = 0.f;
    for (int j = 0; j < ns; j++) L += pml[2 * (P0 + j) + 1] * expf(pml[2 * (P0 + j)] - M);
    float o = 0.f;
    for (int j = 0; j < ns; j++) o += po[(P0 + j) * hd + d] * expf(pml[2 * (P0 + j)] - M);
    return o / L;
}

// The splits of a row and head merged. Grid (rows, heads), 128 threads.
extern "C" __global__ void attn_combine(Step s, const float* po, const float* pml, const int* sidx, float* out, int cols, int hd,
                                        int n_head, int window, int causal) {
    pdl_trigger();
    int r = blockIdx.x, h = blockIdx.y;
    int idx = sidx[r];
    if (idx < 0) return;
    int ns = combine_splits(s, r, window, causal);
    pdl_wait();
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        out[(u64)r * cols + (u64)h * hd + d] = combine_one(po, pml, idx, ns, h, d, hd, n_head);
}

// attn_combine for steps whose rows are all split-K rows, also quantizing the output for the
// integer product that follows (common.cuh, act_q8): grid (rows, n_pad / 256), 256 threads, a
// thread per output value.
extern "C" __global__ void attn_combine_q8(Step s, const float* po, const float* pml, const int* sidx, float* out, int cols, int hd,
                                           int n_head, int window, int causal, int n_pad, signed char* q0, float* d0,
                                           signed char* qk, float* dk) {
    pdl_trigger();
    int r = blockIdx.x, c = blockIdx.y * 256 + threadIdx.x;
    // (The step's tables: before the wait.)
    int idx = sidx[r];
    int ns = idx >= 0 ? combine_splits(s, r, window, causal) : 0;
    pdl_wait();
    float o = 0.f;
    if (idx >= 0 && c < cols) {
        o = combine_one(po, pml, idx, ns, c / hd, c % hd, hd, n_head);
        out[(u64)r * cols + c] = o;
    }
    u64 qo = (u64)r * n_pad, dof = (u64)r * (n_pad / 32);
    act_q8(o, c, q0 + qo, d0 + dof, qk + qo, dk + dof);
}

// ---- Flash attention for runs of query rows (prompt chunks), on the tensor cores (sm_80+), F16
// caches, heads of 64 or 128 values. One block per (tile of up to 64 consecutive rows of one
// sequence, query head): four warps of 16 rows, a page (64 keys) of K and V at a time in shared
// memory. S = Q·Kᵀ and O += P·V with mma.m16n8k16 (f16 inputs, f32 sums): the cache's K and V are
// f16 already, and Q and P are each split into two f16 terms (hi + lo, ~22 bits), so the products
// come within f32 rounding of the CPU's f32 path; online softmax in f32 (as FlashAttention-2).
#define FA_KEYS PAGE

// D = A·B + D for one m16n8k16 tile: A 16×16 f16 (row), B 16×8 f16 (col), f32 sums (sm_80+).
__device__ __forceinline__ void mma16816(float c[4], const u32 a[4], u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two f16 (as u32: lo in the low half) of x, y.
__device__ __forceinline__ u32 h2pack(float x, float y) { return (u32)f2h(x) | ((u32)f2h(y) << 16); }
// x's f16 value and the f16 of what it leaves (x - hi).
__device__ __forceinline__ void hilo(float x, float y, u32* hi, u32* lo) {
    u16 a = f2h(x), b = f2h(y);
    *hi = (u32)a | ((u32)b << 16);
    *lo = h2pack(x - h2f(a), y - h2f(b));
}

template <int HD>
__device__ void fa_t(Step s, const float* q, float* out, const int* tiles, int cols, int n_head, int n_kv, float scale, int window,
                     int causal, u64 k_off, u64 v_off, int k_rb, int v_rb) {
#if __CUDA_ARCH__ >= 800
    const int KS = HD + 8;  // shared row stride in f16 (16 bytes of padding: conflict-free fragments)
    const int NK = HD / 16, ND = HD / 8;
    __shared__ __align__(16) u16 ks[FA_KEYS * KS];
    __shared__ __align__(16) u16 vs[FA_KEYS * KS];
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tg = lane & 3;
    int row0 = tiles[2 * blockIdx.x], nrows = tiles[2 * blockIdx.x + 1], h = blockIdx.y;
    int kh = h / (n_head / n_kv), seq = s.row_seq[row0];
    // The tile's keys: from the first row's lowest to the last row's highest.
    int tlo, thi, lo[2], hi[2], tmp;
    key_range(s, row0, window, causal, &tlo, &tmp);
    key_range(s, row0 + nrows - 1, window, causal, &tmp, &thi);
    int rr[2] = {w * 16 + g, w * 16 + g + 8};
    u32 qh[NK][4], ql[NK][4];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (rr[i] < nrows) key_range(s, row0 + rr[i], window, causal, &lo[i], &hi[i]);
        else { lo[i] = 0; hi[i] = -1; }
    }
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float x = 0.f, y = 0.f;
                if (rr[i] < nrows) {
                    const float* qr = q + (u64)(row0 + rr[i]) * cols + (u64)h * HD + kk * 16 + half * 8 + 2 * tg;
                    x = qr[0] * scale;
                    y = qr[1] * scale;
                }
                hilo(x, y, &qh[kk][2 * half + i], &ql[kk][2 * half + i]);
            }
        }
    }
    float o[ND][4];
#pragma unroll
    for (int nd = 0; nd < ND; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    for (int t0 = tlo / FA_KEYS * FA_KEYS; t0 <= thi; t0 += FA_KEYS) {
        __syncthreads();
        // The page's K and V rows of this KV head (zeros outside the tile's keys: never-written
        // rows may hold NaNs, which a zero weight would not cancel).
        const u8* kp = kv_row(s, seq, t0, k_off, k_rb) + (u64)kh * HD * 2;
        const u8* vp = kv_row(s, seq, t0, v_off, v_rb) + (u64)kh * HD * 2;
        for (int i = tid; i < FA_KEYS * HD / 8; i += blockDim.x) {
            int r = i / (HD / 8), c = i % (HD / 8);
            bool in = t0 + r >= tlo && t0 + r <= thi;
            uint4 z = make_uint4(0, 0, 0, 0);
            *(uint4*)(ks + r * KS + c * 8) = in ? *(const uint4*)(kp + (u64)r * k_rb + c * 16) : z;
            *(uint4*)(vs + r * KS + c * 8) = in ? *(const uint4*)(vp + (u64)r * v_rb + c * 16) : z;
        }
        __syncthreads();
        float sc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
            const u16* kr = ks + (nt * 8 + g) * KS + 2 * tg;
#pragma unroll
            for (int kk = 0; kk < NK; kk++) {
                u32 b0 = *(const u32*)(kr + kk * 16), b1 = *(const u32*)(kr + kk * 16 + 8);
                mma16816(sc[nt], ql[kk], b0, b1);
                mma16816(sc[nt], qh[kk], b0, b1);
            }
        }
        // Masks, the rows' new maxima (over the four lanes of a row), the weights.
        float corr[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    int key = t0 + nt * 8 + 2 * tg + j;
                    float& v = sc[nt][2 * i + j];
                    if (key < lo[i] || key > hi[i]) v = -INFINITY;
                    mx = fmaxf(mx, v);
                }
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float mn = fmaxf(m[i], mx);
            corr[i] = mn == -INFINITY ? 1.f : expf(m[i] - mn);
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    float& v = sc[nt][2 * i + j];
                    v = v == -INFINITY ? 0.f : expf(v - mn);
                    sum += v;
                }
            }
            l[i] = l[i] * corr[i] + sum;
            m[i] = mn;
        }
#pragma unroll
        for (int nd = 0; nd < ND; nd++) {
            o[nd][0] *= corr[0]; o[nd][1] *= corr[0];
            o[nd][2] *= corr[1]; o[nd][3] *= corr[1];
        }
        // O += P·V, 16 keys at a time: P's fragments from the score tiles, V's through ldmatrix.trans.
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            u32 ph[4], pl[4];
            hilo(sc[2 * kk][0], sc[2 * kk][1], &ph[0], &pl[0]);
            hilo(sc[2 * kk][2], sc[2 * kk][3], &ph[1], &pl[1]);
            hilo(sc[2 * kk + 1][0], sc[2 * kk + 1][1], &ph[2], &pl[2]);
            hilo(sc[2 * kk + 1][2], sc[2 * kk + 1][3], &ph[3], &pl[3]);
            // Lanes 0-15 name rows kk*16 + 0..15 at dims nd*8, lanes 16-31 the same rows at nd*8 + 8.
            const u16* vr = vs + (kk * 16 + (lane & 15)) * KS + (lane >> 4) * 8;
#pragma unroll
            for (int nd = 0; nd < ND; nd += 2) {
                u32 b[4];
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                             : "r"(smem_addr(vr + nd * 8)));
                mma16816(o[nd], pl, b[0], b[1]);
                mma16816(o[nd], ph, b[0], b[1]);
                mma16816(o[nd + 1], pl, b[2], b[3]);
                mma16816(o[nd + 1], ph, b[2], b[3]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float L = l[i];
        L += __shfl_xor_sync(0xffffffffu, L, 1);
        L += __shfl_xor_sync(0xffffffffu, L, 2);
        if (rr[i] >= nrows) continue;
        float* orow = out + (u64)(row0 + rr[i]) * cols + (u64)h * HD + 2 * tg;
#pragma unroll
        for (int nd = 0; nd < ND; nd++) {
            orow[nd * 8] = o[nd][2 * i] / L;
            orow[nd * 8 + 1] = o[nd][2 * i + 1] / L;
        }
    }
#endif
}

#define FA(HD) \
    extern "C" __global__ void attn_fa_f16_##HD(Step s, const float* q, float* out, const int* tiles, int cols, int n_head, int n_kv, \
                                                float scale, int window, int causal, u64 k_off, u64 v_off, int k_rb, int v_rb) { \
        fa_t<HD>(s, q, out, tiles, cols, n_head, n_kv, scale, window, causal, k_off, v_off, k_rb, v_rb); \
    }
FA(64)
FA(128)

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
