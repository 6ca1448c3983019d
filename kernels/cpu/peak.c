/* The CPU's peak FLOP/s for the MFU: the best rate of a short matmul measured now, in the dtype the matmuls
 * compute in (set_matmul_dtype and this CPU: bf16 runs are measured against the bf16 peak, as a GPU's MFU is
 * against its tensor cores'). Every rank measures at once, so each sees its share of the cores (and of the
 * OpenMP threads it was given). */
#include <time.h>

#include "common/clock.h"
#include "kernels/cpu/cpu.h"

double cpu_peak_flops(void)
{
    enum { N = 512 };
    const enum dtype dt = cpu_matmul_compute_dtype();
    float *a = cpu_mem_alloc(3 * N * N * sizeof(float));
    uint16_t *h = dt == DTYPE_BF16 ? cpu_mem_alloc(2 * N * N * sizeof(uint16_t)) : NULL;
    if (!a || (dt == DTYPE_BF16 && !h)) {
        cpu_mem_free(a);
        return -1;
    }
    for (size_t i = 0; i < 3 * N * N; i++)
        a[i] = (float)(i % 7) * 0.01f;
    if (h)
        cpu_round_bf16(h, a, 2, N * N, N * N);
    double best = 0, t_end = clock_now_s() + 0.15;
    while (clock_now_s() < t_end) {
        double t0 = clock_now_s();
        /* bf16: the product of operands already in bf16, as the gathered weights are */
        if (h)
            cpu_onednn_matmul(DTYPE_BF16, 0, 0, N, N, N, 1.0f, h, N, h + N * N, N, 0.0f, a + 2 * N * N, N, NULL);
        else
            cpu_gemm(0, 0, N, N, N, 1.0f, a, N, a + N * N, N, 0.0f, a + 2 * N * N, N);
        double dt_s = clock_now_s() - t0;
        double fl = 2.0 * N * N * N / dt_s;
        best = fl > best ? fl : best;
    }
    cpu_mem_free(a);
    cpu_mem_free(h);
    return best;
}
