// Hybrid models' linear-attention (Gated DeltaNet) layers: the causal convolution with its state,
// the gated delta rule (token by token: one block per sequence and value head, each thread one row
// of the head's state in registers), and two small helpers of the gated attention layers.
// llama.cpp ggml-cpu/ops.cpp ssm_conv / gated_delta_net; transformers modeling_qwen3_5.py.
//
// Per-call tables (the backend's `cuda/recurrent.rs`):
//   tab: per sequence (row0, rows, first copy, copies), then per copy the rows after which it is taken;
//   ptr: per sequence the address of its state (this layer's part), then per copy its address.

// out[r, c] = silu(sum_j w[c, j] * x_ext[t + j, c]) with x_ext the sequence's conv state (K - 1
// rows) followed by its rows; one thread per (row, channel).
extern "C" __global__ void ssm_conv(const float* x, const float* w, float* out, const int* tab, const u64* ptr,
                                    int n_seq, int C, int K) {
    int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int s = 0;
    while (s < n_seq && !(r >= tab[4 * s] && r < tab[4 * s] + tab[4 * s + 1])) s++;
    if (s == n_seq) return;
    int row0 = tab[4 * s], t = r - row0;
    const float* st = (const float*)ptr[s];
    float sum = 0.f;
    for (int j = 0; j < K; j++) {
        int i = t + j;
        float v = i < K - 1 ? st[(u64)i * C + c] : x[(u64)(row0 + i - (K - 1)) * C + c];
        sum += v * w[(u64)c * K + j];
    }
    out[(u64)r * C + c] = sum / (1.f + expf(-sum));
}

// The conv state after `end` rows of a sequence (its window's last K - 1 inputs). mode 0: every copy
// (blockIdx.x a copy; the states are only read); mode 1: each sequence's own state (blockIdx.x a
// sequence), after the copies. In place: a thread writes row j after reading row end + j > j.
extern "C" __global__ void ssm_conv_state(const float* x, const int* tab, const u64* ptr, int n_seq, int C, int K,
                                          int mode) {
    int e = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int s = -1, end;
    float* dst;
    if (mode == 1) {
        s = e;
        end = tab[4 * s + 1];
        dst = (float*)ptr[s];
    } else {
        for (int q = 0; q < n_seq; q++)
            if (e >= tab[4 * q + 2] && e < tab[4 * q + 2] + tab[4 * q + 3]) { s = q; break; }
        if (s < 0) return;
        end = tab[4 * n_seq + e];
        dst = (float*)ptr[n_seq + e];
    }
    int row0 = tab[4 * s];
    const float* st = (const float*)ptr[s];
    for (int j = 0; j < K - 1; j++) {
        int i = end + j;
        float v = i < K - 1 ? st[(u64)i * C + c] : x[(u64)(row0 + i - (K - 1)) * C + c];
        dst[(u64)j * C + c] = v;
    }
}

__device__ __forceinline__ float softplus_f(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// The gated delta rule, token by token. Block (sequence, value head h), thread j: row j of the
// head's state (column j of the key x value state, DK values) in registers. Per token: q and k of
// key head h % nk L2-normalised (q also by `scale`), decay exp(a_h softplus(alpha + dt_h)), rate
// sigmoid(beta); m *= decay; d = (v_j - m.k) rate; m += d k; out_j = m.q.
template <int DK>
__device__ void gdn_t(const float* qkv, const float* alpha, const float* beta, const float* dt, const float* a,
                      float* out, const int* tab, const u64* ptr, int n_seq, int nk, int nv, int hv, float eps,
                      float scale) {
    __shared__ float qs[DK], ks[DK];
    int s = blockIdx.x, h = blockIdx.y, j = threadIdx.x;
    int row0 = tab[4 * s], rows = tab[4 * s + 1], c0 = tab[4 * s + 2], nc = tab[4 * s + 3];
    int C = 2 * nk * DK + nv * hv, kh = h % nk;
    float* st = (float*)ptr[s] + ((u64)h * hv + j) * DK;
    float m[DK];
#pragma unroll
    for (int i = 0; i < DK; i++) m[i] = st[i];
    int next = 0;
    for (int t = 0; t < rows; t++) {
        const float* row = qkv + (u64)(row0 + t) * C;
        float sq = 0.f, sk = 0.f;
        for (int i = j; i < DK; i += blockDim.x) {
            float qv = row[kh * DK + i], kv = row[(nk + kh) * DK + i];
            qs[i] = qv;
            ks[i] = kv;
            sq += qv * qv;
            sk += kv * kv;
        }
        // (block_sum's barriers also make qs and ks visible to the block.)
        sq = block_sum(sq);
        sk = block_sum(sk);
        float iq = rsqrtf(sq + eps) * scale, ik = rsqrtf(sk + eps);
        u64 g_at = (u64)(row0 + t) * nv + h;
        float decay = expf(a[h] * softplus_f(alpha[g_at] + dt[h]));
        float rate = 1.f / (1.f + expf(-beta[g_at]));
        float kvm = 0.f;
#pragma unroll
        for (int i = 0; i < DK; i++) {
            m[i] *= decay;
            kvm += m[i] * (ks[i] * ik);
        }
        float d = (row[2 * nk * DK + h * hv + j] - kvm) * rate;
        float o = 0.f;
#pragma unroll
        for (int i = 0; i < DK; i++) {
            m[i] += d * (ks[i] * ik);
            o += m[i] * (qs[i] * iq);
        }
        out[(u64)(row0 + t) * nv * hv + h * hv + j] = o;
        while (next < nc && tab[4 * n_seq + c0 + next] == t + 1) {
            float* dst = (float*)ptr[n_seq + c0 + next] + ((u64)h * hv + j) * DK;
#pragma unroll
            for (int i = 0; i < DK; i++) dst[i] = m[i];
            next++;
        }
        // The next token overwrites qs and ks.
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < DK; i++) st[i] = m[i];
}

extern "C" __global__ void gated_delta_net_64(const float* qkv, const float* alpha, const float* beta, const float* dt,
                                              const float* a, float* out, const int* tab, const u64* ptr, int n_seq,
                                              int nk, int nv, int hv, float eps, float scale) {
    gdn_t<64>(qkv, alpha, beta, dt, a, out, tab, ptr, n_seq, nk, nv, hv, eps, scale);
}
extern "C" __global__ void gated_delta_net_128(const float* qkv, const float* alpha, const float* beta, const float* dt,
                                               const float* a, float* out, const int* tab, const u64* ptr, int n_seq,
                                               int nk, int nv, int hv, float eps, float scale) {
    gdn_t<128>(qkv, alpha, beta, dt, a, out, tab, ptr, n_seq, nk, nv, hv, eps, scale);
}

// x[r, c] *= sigmoid(g[r, c]) (gcols == cols) or sigmoid(g[r, 0]) (gcols == 1).
extern "C" __global__ void sigmoid_mul(float* x, const float* g, u64 len, int cols, int gcols) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    u64 r = i / cols;
    float gv = g[r * gcols + (gcols == 1 ? 0 : i % cols)];
    x[i] = x[i] * (1.f / (1.f + expf(-gv)));
}

// Rows of pairs [a0 b0 a1 b1 ...] of `width` values each into a = [a0 a1 ...], b = [b0 b1 ...].
extern "C" __global__ void unzip_heads(const float* x, float* a, float* b, int rows, int cols, int width) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)rows * cols) return;
    int r = i / cols, c = i % cols, pair = c / (2 * width), k = c % (2 * width), half = cols / 2;
    if (k < width)
        a[(u64)r * half + pair * width + k] = x[i];
    else
        b[(u64)r * half + pair * width + k - width] = x[i];
}
