/* Training-infrastructure throughput beside memcpy measured in the same run: CRC32C (hardware and table
 * paths; checkpoints are checksummed with it), the token scan data_open does, and data_get_rows for a
 * GPT-2-sized batch. Output: one line per result, `bench=<name> ... gbps=... memcpy_gbps=... ratio=...`. */
#include "common/crc32c.h"
#include "common/error.h"
#include "worker/train/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/util/tu_proc.h"

/* Best of `reps` runs: on a shared machine the minimum is the least disturbed measurement. */
#define BEST_OF(reps, secs, body)                                                                          \
    do {                                                                                                   \
        secs = 1e30;                                                                                       \
        for (int rep_ = 0; rep_ < (reps); rep_++) {                                                        \
            double t0_ = tu_now();                                                                          \
            body;                                                                                          \
            double dt_ = tu_now() - t0_;                                                                    \
            secs = dt_ < secs ? dt_ : secs;                                                                \
        }                                                                                                  \
    } while (0)

static volatile uint32_t sink;

int main(void)
{
    const size_t bytes = 64u << 20;
    unsigned char *src = malloc(bytes), *dst = malloc(bytes);
    if (!src || !dst)
        return 1;
    for (size_t i = 0; i < bytes; i++)
        src[i] = (unsigned char)(i * 131 + (i >> 9));
    memcpy(dst, src, bytes); /* fault the pages in before timing */
    double t_copy, t_hw = 0, t_table;
    BEST_OF(5, t_copy, memcpy(dst, src, bytes); sink = dst[bytes / 2]);
    double copy_gbps = (double)bytes / t_copy / 1e9;
    printf("bench=memcpy bytes=%zu gbps=%.2f\n", bytes, copy_gbps);
    if (crc32c_have_hw()) {
        BEST_OF(5, t_hw, sink = crc32c_update_hw(0, src, bytes));
        printf("bench=crc32c_hw bytes=%zu gbps=%.2f memcpy_gbps=%.2f ratio=%.3f\n", bytes,
               (double)bytes / t_hw / 1e9, copy_gbps, t_copy / t_hw);
    }
    BEST_OF(3, t_table, sink = crc32c_update_table(0, src, bytes));
    printf("bench=crc32c_table bytes=%zu gbps=%.2f memcpy_gbps=%.2f ratio=%.3f", bytes,
           (double)bytes / t_table / 1e9, copy_gbps, t_copy / t_table);
    if (t_hw > 0)
        printf(" hw_speedup=%.2f", t_table / t_hw);
    printf("\n");

    /* Token file: 32 M tokens (64 MiB) in a temp dir; data_open's scan dominates its cost. */
    char dir[] = "/tmp/fsdp-bench-worker-XXXXXX", path[64];
    if (!mkdtemp(dir))
        return 1;
    snprintf(path, sizeof path, "%s/train.bin", dir);
    uint16_t *tok = (uint16_t *)src;
    for (size_t i = 0; i < bytes / 2; i++)
        tok[i] = (uint16_t)((i * 2654435761u >> 7) % 50257);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(src, 1, bytes, f) != bytes || fclose(f) != 0)
        return 1;
    struct data_options o = {.block_size = 1024, .vocab_size = 50257, .batch_rows = 64,
                             .order = DATA_ORDER_SHUFFLED, .seed = 1, .stream = DATA_STREAM_TRAIN};
    struct data_file *d = NULL;
    double t_open;
    BEST_OF(5, t_open, {
        data_close(d);
        if (data_open(path, &o, &d) < 0) {
            fprintf(stderr, "%s\n", error_message());
            return 1;
        }
    });
    printf("bench=data_open_scan tokens=%zu gbps=%.2f memcpy_gbps=%.2f ratio=%.3f\n", bytes / 2,
           (double)bytes / t_open / 1e9, copy_gbps, t_copy / t_open);
    /* One GPT-2 global batch (64 x 1024) read as int32 inputs and targets. */
    int32_t *in = malloc(64 * 1024 * sizeof *in), *tg = malloc(64 * 1024 * sizeof *tg);
    double t_rows;
    int64_t step = 0;
    BEST_OF(20, t_rows, data_get_rows(d, step++, 0, 64, in, tg));
    double row_bytes = 64.0 * 1024 * 2 * sizeof(int32_t);
    double t_rows_copy;
    BEST_OF(20, t_rows_copy, memcpy(dst, src + (size_t)step * 4096, (size_t)row_bytes); sink = dst[5]);
    printf("bench=data_get_rows rows=64 block=1024 us=%.1f gbps=%.2f memcpy_gbps=%.2f ratio=%.3f\n", t_rows * 1e6,
           row_bytes / t_rows / 1e9, row_bytes / t_rows_copy / 1e9, t_rows_copy / t_rows);
    data_close(d);
    unlink(path);
    rmdir(dir);
    free(in);
    free(tg);
    free(src);
    free(dst);
    return 0;
}
