// ---- A sampled token per ask where the logits are (`Backend::sample_rows`): the chain of
// `sampler/masses.rs` (changes, top-k, top-p, min-p, temperature, the draw at the host's point)
// in the same integer masses and the same single-precision operations, spelled `__f*_rn` so that
// none is fused: the token equals the host's from the same row. One block of 1024 threads per
// ask; each cut is a radix selection over the row's order keys (four passes of 8 bits), by count
// (top-k) or by mass (top-p, the draw), then the tie the draw lands on in column order.

#define S_ONE (1ull << 40)

// Order key (as masses.rs `key`): larger for a later value in total order. NaN is left out by
// the callers (v == v).
__device__ __forceinline__ u32 s_key(float v) {
    u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float s_unkey(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// masses.rs exp_mass: exp(x) for x <= 0 in units of 2^-40, truncated.
__device__ __forceinline__ u64 s_exp_mass(float x) {
    if (!(x > -30.f)) return 0ull;
    float k = floorf(__fadd_rn(__fmul_rn(x, __uint_as_float(0x3FB8AA3Bu)), 0.5f));
    float r = __fsub_rn(__fsub_rn(x, __fmul_rn(k, __uint_as_float(0x3F317200u))), __fmul_rn(k, __uint_as_float(0x35BFBE8Eu)));
    float p = __fadd_rn(__uint_as_float(0x3C088889u), __fmul_rn(r, __uint_as_float(0x3AB60B61u)));
    p = __fadd_rn(__uint_as_float(0x3D2AAAABu), __fmul_rn(r, p));
    p = __fadd_rn(__uint_as_float(0x3E2AAAABu), __fmul_rn(r, p));
    p = __fadd_rn(0.5f, __fmul_rn(r, p));
    p = __fadd_rn(1.f, __fmul_rn(r, p));
    p = __fadd_rn(1.f, __fmul_rn(r, p));
    float e = __fmul_rn(p, __uint_as_float((u32)(127 + (int)k) << 23));
    return __float2ull_rz(__fmul_rn(e, 1099511627776.f));
}
// masses.rs mass: v's mass against the largest m at temperature t.
__device__ __forceinline__ u64 s_mass(float v, float m, float t) {
    return v == m ? S_ONE : s_exp_mass(__fdiv_rn(__fsub_rn(v, m), t));
}

struct SampleShared {
    u64 mass[256];
    u32 count[256];
    u64 red[32];
    u64 acc;
    u32 cacc, digit;
    u32 warp[32];
    int tok;
};

// The block's sum of v (every thread gets it).
__device__ __forceinline__ u64 s_sum(u64 v, SampleShared& s) {
    for (int o = 16; o; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s.red[threadIdx.x >> 5] = v;
    __syncthreads();
    u64 t = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += s.red[i];
    return t;
}
__device__ __forceinline__ u32 s_max(u32 v, SampleShared& s) {
    for (int o = 16; o; o >>= 1) v = max(v, __shfl_down_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s.red[threadIdx.x >> 5] = v;
    __syncthreads();
    u32 t = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) t = max(t, (u32)s.red[i]);
    return t;
}

// A cut of the candidates in order: those with key > k, and the first q (in column order) of
// those with key == k. {0, 0}: all (every value's key is above 0).
struct Cut {
    u32 k, q;
};

// One radix pass's histogram: (count, mass at temperature t) per digit of the keys above `cut.k`
// that match `prefix` under `mask` (mass only when `t` > 0); the cut's q ties added by thread 0.
__device__ void s_hist(const float* r, int n, Cut cut, u32 prefix, u32 mask, int shift, float m, float t, SampleShared& s) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        s.mass[i] = 0;
        s.count[i] = 0;
    }
    __syncthreads();
    int lane = threadIdx.x & 31;
    for (int i0 = 0; i0 < n; i0 += blockDim.x) {
        int i = i0 + threadIdx.x;
        float v = i < n ? r[i] : 0.f;
        u32 k = s_key(v);
        bool in = i < n && v == v && k > cut.k && (k & mask) == prefix;
        u32 bin = (k >> shift) & 255;
        u64 w = in && t > 0.f ? s_mass(v, m, t) : 0ull;
        // (Most of a row's keys share their top bytes: each distinct bin of the warp once.)
        u32 left = __ballot_sync(0xffffffffu, in);
        while (left) {
            u32 b = __shfl_sync(0xffffffffu, bin, __ffs(left) - 1);
            bool mine = in && bin == b;
            u32 grp = __ballot_sync(0xffffffffu, mine);
            u64 sum = mine ? w : 0ull;
            for (int o = 16; o; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);
            if (lane == 0) {
                atomicAdd(&s.count[b], __popc(grp));
                if (t > 0.f) atomicAdd((unsigned long long*)&s.mass[b], (unsigned long long)sum);
            }
            left &= ~grp;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0 && cut.q > 0 && (cut.k & mask) == prefix) {
        u32 b = (cut.k >> shift) & 255;
        s.count[b] += cut.q;
        if (t > 0.f) s.mass[b] += (u64)cut.q * s_mass(s_unkey(cut.k), m, t);
    }
    __syncthreads();
}

// The cut holding the first `want` candidates in order (want >= 1).
__device__ Cut s_first(const float* r, int n, u32 want, SampleShared& s) {
    u32 prefix = 0, mask = 0, left = want;
    for (int shift = 24; shift >= 0; shift -= 8) {
        s_hist(r, n, Cut{0, 0}, prefix, mask, shift, 0.f, 0.f, s);
        if (threadIdx.x == 0) {
            u32 acc = 0;
            int d = 255;
            for (; d > 0 && acc + s.count[d] < left; d--) acc += s.count[d];
            s.digit = (u32)d;
            s.cacc = left - acc;
        }
        __syncthreads();
        prefix |= s.digit << shift;
        mask |= 255u << shift;
        left = s.cacc;
        __syncthreads();
    }
    return Cut{prefix, left};
}

// Where the running mass (temperature t) of `cut`'s candidates in order reaches `target`: the
// key there, and the mass and count of the candidates before that key.
__device__ void s_reach(const float* r, int n, Cut cut, float m, float t, u64 target, u32* key, u64* before,
                        u32* count, SampleShared& s) {
    u32 prefix = 0, mask = 0;
    u64 acc = 0;
    u32 cacc = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        s_hist(r, n, cut, prefix, mask, shift, m, t, s);
        if (threadIdx.x == 0) {
            int d = 255;
            for (; d > 0 && acc + s.mass[d] < target; d--) {
                acc += s.mass[d];
                cacc += s.count[d];
            }
            s.digit = (u32)d;
            s.acc = acc;
            s.cacc = cacc;
        }
        __syncthreads();
        prefix |= s.digit << shift;
        mask |= 255u << shift;
        acc = s.acc;
        cacc = s.cacc;
        __syncthreads();
    }
    *key = prefix;
    *before = acc;
    *count = cacc;
}

// The sum of `cut`'s masses at temperature t.
__device__ u64 s_total(const float* r, int n, Cut cut, float m, float t, SampleShared& s) {
    u64 sum = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = r[i];
        if (v == v && s_key(v) > cut.k) sum += s_mass(v, m, t);
    }
    sum = s_sum(sum, s);
    if (cut.q > 0) sum += (u64)cut.q * s_mass(s_unkey(cut.k), m, t);
    return sum;
}

// asks: 10 words each: row, top_k (0: off), first change, changes, top_p (bits), min-p on,
// ln(min_p) (bits), temperature (bits), the draw's point (f64, low word first). changes: 4 words
// each: token, penalty (0: add), a, b (bits; masses.rs Change). out: a token per ask.
extern "C" __global__ void __launch_bounds__(1024) sample_rows(float* x, int n, const int* asks, const int* changes, int* out) {
    __shared__ SampleShared s;
    const int* a = asks + 10 * blockIdx.x;
    float* r = x + (u64)a[0] * n;
    int tid = threadIdx.x;
    if (tid == 0) {
        // In order, as the host makes them (a token may be changed more than once).
        for (int j = 0; j < a[3]; j++) {
            const int* c = changes + 4 * (a[2] + j);
            u32 tok = (u32)c[0];
            if (tok >= (u32)n) continue;
            float v = r[tok], ca = __int_as_float(c[2]), cb = __int_as_float(c[3]);
            if (!c[1]) v = __fadd_rn(v, ca);
            else v = __fsub_rn(v <= 0.f ? __fmul_rn(v, ca) : __fdiv_rn(v, ca), cb);
            r[tok] = v;
        }
    }
    __syncthreads();
    u32 kmax = 0;
    u64 valid = 0;
    for (int i = tid; i < n; i += blockDim.x) {
        float v = r[i];
        if (v == v) {
            kmax = max(kmax, s_key(v));
            valid++;
        }
    }
    kmax = s_max(kmax, s);
    valid = s_sum(valid, s);
    if (valid == 0) {
        if (tid == 0) out[blockIdx.x] = 0;
        return;
    }
    float m = s_unkey(kmax);
    u32 nv = (u32)valid;
    u32 top_k = (u32)a[1];
    float top_p = __int_as_float(a[4]), t = __int_as_float(a[7]);
    double u = __hiloint2double(a[9], a[8]);
    // top-k
    u32 keep = top_k > 0 ? min(top_k, nv) : nv;
    Cut cut = keep < nv ? s_first(r, n, keep, s) : Cut{0, 0};
    // top-p (masses at temperature 1)
    if (top_p < 1.f) {
        u64 total = s_total(r, n, cut, m, 1.f, s);
        u64 target = (u64)ceil(__dmul_rn((double)top_p, __ull2double_rn(total)));
        if (target <= total) {
            u32 key, count;
            u64 before;
            s_reach(r, n, cut, m, 1.f, target, &key, &before, &count, s);
            u64 w = s_mass(s_unkey(key), m, 1.f);
            keep = min(keep, count + (u32)((target - before + w - 1) / w));
        }
    }
    // min-p
    if (a[5]) {
        float threshold = __fadd_rn(m, __int_as_float(a[6]));
        u64 c = 0;
        for (int i = tid; i < n; i += blockDim.x) c += r[i] >= threshold;
        keep = min(keep, (u32)s_sum(c, s));
    }
    keep = max(keep, 1u);
    if (keep == nv) cut = Cut{0, 0};
    else if (keep != (top_k > 0 ? min(top_k, nv) : nv)) cut = s_first(r, n, keep, s);
    // The draw: the candidate whose running mass passes floor(u * total).
    u64 total = s_total(r, n, cut, m, t, s);
    u64 at = min((u64)floor(__dmul_rn(u, __ull2double_rn(total))), total - 1);
    u32 key, count;
    u64 before;
    s_reach(r, n, cut, m, t, at + 1, &key, &before, &count, s);
    u64 w = s_mass(s_unkey(key), m, t);
    u32 j = (u32)((at + 1 - before + w - 1) / w);  // the j-th (from 1) of the values at `key`
    // That one in column order.
    int lane = tid & 31, wi = tid >> 5;
    if (tid == 0) s.tok = 0;
    u32 taken = 0;
    for (int i0 = 0; i0 < n && taken < j; i0 += blockDim.x) {
        int i = i0 + tid;
        float v = i < n ? r[i] : 0.f;
        bool hit = i < n && v == v && s_key(v) == key;
        u32 bits = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) s.warp[wi] = __popc(bits);
        __syncthreads();
        u32 ahead = 0, all = 0;
        for (int k = 0; k < (int)(blockDim.x >> 5); k++) {
            if (k < wi) ahead += s.warp[k];
            all += s.warp[k];
        }
        if (hit && taken + ahead + __popc(bits & ((1u << lane) - 1u)) == j - 1) s.tok = i;
        taken += all;
        __syncthreads();
    }
    __syncthreads();
    if (tid == 0) out[blockIdx.x] = s.tok;
}
