// Reference dot products from ggml's own CPU code, built for aarch64 (GCC, armv8.2-a+dotprod) and
// run under qemu: writes the records crates/quant/tests/data/ggml_aarch64_dotprod.bin holds.
// Build and run: bench/neon/make_oracle.sh.
#include "ggml.h"
#include "ggml-cpu.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {  // xorshift64*, uniform in [-1, 1)
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (float)((rng * 2685821657736338717ull) >> 40) / (float)(1 << 23) - 1.0f;
}

static void put_u32(FILE *f, uint32_t v) { fwrite(&v, 4, 1, f); }

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s OUT\n", argv[0]); return 2; }
    ggml_cpu_init();
    FILE *f = fopen(argv[1], "wb");
    if (!f) { perror(argv[1]); return 1; }
    const enum ggml_type types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                                    GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                                    GGML_TYPE_Q6_K, GGML_TYPE_F32, GGML_TYPE_F16};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        const enum ggml_type ty = types[t];
        const struct ggml_type_traits_cpu *cpu = ggml_get_type_traits_cpu(ty);
        const enum ggml_type act = cpu->vec_dot_type;
        // 32-value blocks: 1 to 16 blocks (odd counts end with one block alone); K-quants: 1 to 4
        // superblocks, twice; F32/F16: 37 to 296 values (16 at a time, then one by one).
        const int blck = (int)ggml_blck_size(ty), rows = blck == 32 ? 16 : 8;
        for (int s = 0; s < rows; s++) {
            const int n = blck == 32 ? 32 * (s + 1) : blck == 256 ? 256 * (s % 4 + 1) : 37 * (s + 1);
            float *w = malloc(4 * n), *a = malloc(4 * n);
            // Scales that vary from block to block, some blocks of larger values.
            for (int i = 0; i < n; i++) w[i] = frand() * (1.0f + (float)((i / 32) % 5));
            for (int i = 0; i < n; i++) a[i] = frand() * (0.5f + (float)((i / 64) % 3));
            const size_t wbytes = ggml_row_size(ty, n), abytes = ggml_row_size(act, n);
            uint8_t *wq = malloc(wbytes), *aq = malloc(abytes);
            ggml_quantize_chunk(ty, w, wq, 0, 1, n, NULL);
            if (act == GGML_TYPE_F32) memcpy(aq, a, abytes);
            else ggml_get_type_traits_cpu(act)->from_float(a, aq, n);
            float r = 0;
            cpu->vec_dot(n, &r, 0, wq, 0, aq, 0, 1);
            put_u32(f, (uint32_t)ty); put_u32(f, (uint32_t)n);
            put_u32(f, (uint32_t)wbytes); fwrite(wq, 1, wbytes, f);
            fwrite(a, 4, n, f);
            put_u32(f, (uint32_t)act); put_u32(f, (uint32_t)abytes); fwrite(aq, 1, abytes, f);
            fwrite(&r, 4, 1, f);
            free(w); free(a); free(wq); free(aq);
        }
    }
    fclose(f);
    return 0;
}
