/* The CPU's peak FLOP/s for the MFU: the best rate of a short SGEMM measured now. Every rank measures at
 * once, so each sees its share of the cores (and of the OpenMP threads it was given). */
#include <time.h>

#include "kernels/cpu/cpu.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double cpu_peak_flops(void)
{
    enum { N = 384 };
    float *a = cpu_mem_alloc(3 * N * N * sizeof(float));
    if (!a)
        return -1;
    for (size_t i = 0; i < 3 * N * N; i++)
        a[i] = (float)(i % 7) * 0.01f;
    double best = 0, t_end = now_s() + 0.15;
    while (now_s() < t_end) {
        double t0 = now_s();
        cpu_gemm(0, 0, N, N, N, 1.0f, a, N, a + N * N, N, 0.0f, a + 2 * N * N, N);
        double dt = now_s() - t0;
        double fl = 2.0 * N * N * N / dt;
        best = fl > best ? fl : best;
    }
    cpu_mem_free(a);
    return best;
}
