// Machine ceilings for the engine's roofline: (1) memory read bandwidth with N threads streaming
// a buffer much larger than the caches, (2) int8 dot-product issue rate per core
// (vpdpbusd, 256-bit, 8 independent accumulators), (3) f32 FMA rate per core (256-bit).
// Build: cc -O2 -mavx2 -mfma -mavxvnni -pthread bench/engine/roofline.c -o /tmp/roofline
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct { const __m256i *p; size_t n; int reps; long long sink; } Job;

static void *stream(void *a) {
    Job *j = a;
    __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int r = 0; r < j->reps; r++)
        for (size_t i = 0; i < j->n; i += 4) {
            acc0 = _mm256_add_epi64(acc0, _mm256_load_si256(j->p + i));
            acc1 = _mm256_add_epi64(acc1, _mm256_load_si256(j->p + i + 1));
            acc2 = _mm256_add_epi64(acc2, _mm256_load_si256(j->p + i + 2));
            acc3 = _mm256_add_epi64(acc3, _mm256_load_si256(j->p + i + 3));
        }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(acc0, acc1), _mm256_add_epi64(acc2, acc3));
    long long out[4];
    _mm256_storeu_si256((__m256i *)out, s);
    j->sink = out[0] + out[1] + out[2] + out[3];
    return NULL;
}

static double dp_rate(long iters) {
    __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(5);
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    double t0 = now();
    for (long i = 0; i < iters; i++) {
        c0 = _mm256_dpbusd_avx_epi32(c0, a, b); c1 = _mm256_dpbusd_avx_epi32(c1, a, b);
        c2 = _mm256_dpbusd_avx_epi32(c2, a, b); c3 = _mm256_dpbusd_avx_epi32(c3, a, b);
        c4 = _mm256_dpbusd_avx_epi32(c4, a, b); c5 = _mm256_dpbusd_avx_epi32(c5, a, b);
        c6 = _mm256_dpbusd_avx_epi32(c6, a, b); c7 = _mm256_dpbusd_avx_epi32(c7, a, b);
        __asm__ volatile("" : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5), "+x"(c6), "+x"(c7));
    }
    double dt = now() - t0;
    return iters * 8.0 * 32 / dt;  // int8 MACs per second
}

static double fma_rate(long iters) {
    __m256 a = _mm256_set1_ps(1.0001f), b = _mm256_set1_ps(0.9999f);
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    double t0 = now();
    for (long i = 0; i < iters; i++) {
        c0 = _mm256_fmadd_ps(a, b, c0); c1 = _mm256_fmadd_ps(a, b, c1); c2 = _mm256_fmadd_ps(a, b, c2);
        c3 = _mm256_fmadd_ps(a, b, c3); c4 = _mm256_fmadd_ps(a, b, c4); c5 = _mm256_fmadd_ps(a, b, c5);
        c6 = _mm256_fmadd_ps(a, b, c6); c7 = _mm256_fmadd_ps(a, b, c7);
        __asm__ volatile("" : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5), "+x"(c6), "+x"(c7));
    }
    double dt = now() - t0;
    return iters * 8.0 * 8 / dt;  // f32 MACs per second
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    size_t bytes = (size_t)1 << 30;  // 1 GiB per thread pass, split among the threads
    __m256i *buf = aligned_alloc(64, bytes);
    memset(buf, 1, bytes);
    size_t n = bytes / 32 / threads;
    pthread_t th[64];
    Job jobs[64];
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        for (int t = 0; t < threads; t++) {
            jobs[t] = (Job){buf + t * n, n, 2, 0};
            pthread_create(&th[t], NULL, stream, &jobs[t]);
        }
        for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
        double gbs = 2.0 * bytes / (now() - t0) / (1 << 30);
        if (gbs > best) best = gbs;
    }
    printf("memory read, %d threads: %.1f GiB/s (best of 5, 2 GiB per pass)\n", threads, best);
    dp_rate(1000000);
    printf("vpdpbusd ymm, one core: %.1f G int8 MAC/s\n", dp_rate(200000000) / 1e9);
    printf("vfmadd ymm, one core: %.1f G f32 MAC/s\n", fma_rate(200000000) / 1e9);
    return 0;
}
