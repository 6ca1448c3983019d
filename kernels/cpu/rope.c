/* Rotary position embeddings, in place on the head columns of packed rows (Llama's q and k), in the
 * Hugging Face convention: the two halves of a head are rotated against each other (rotate_half). */
#include "common/error.h"
#include "kernels/cpu/cpu.h"

/* One row: every head of it rotated by the angles of its position; sign -1 rotates back (backward). */
CPU_SIMD_CLONES
static void rope_row(float *x, int nheads, int hs, const float *cs, float sign)
{
    const int half = hs / 2;
    const float *cosv = cs, *sinv = cs + half;
    for (int h = 0; h < nheads; h++) {
        float *a = x + (size_t)h * hs, *b = a + half;
#pragma omp simd
        for (int j = 0; j < half; j++) {
            float x1 = a[j], x2 = b[j], c = cosv[j], s = sign * sinv[j];
            a[j] = x1 * c - x2 * s;
            b[j] = x2 * c + x1 * s;
        }
    }
}

static int rope_apply(const char *op, float *x, int n, int ld, int nheads, int hs, const int32_t *pos,
                      const float *freqs, int npos, float sign)
{
    if (n < 0 || nheads <= 0 || hs <= 0 || hs % 2 != 0 || ld < nheads * hs || npos <= 0)
        return error_set(FSDP_EINVAL, "kernels cpu: %s: bad shape n=%d ld=%d nheads=%d hs=%d npos=%d (hs must be "
                                      "even, ld >= nheads*hs)", op, n, ld, nheads, hs, npos);
    for (int i = 0; i < n; i++)
        if (pos[i] < 0 || pos[i] >= npos)
            return error_set(FSDP_ERANGE, "kernels cpu: %s: position %d of row %d is outside [0, %d)", op,
                             (int)pos[i], i, npos);
#pragma omp parallel for schedule(static) if ((long)n * nheads * hs > CPU_CHUNK)
    for (int i = 0; i < n; i++)
        rope_row(x + (size_t)i * ld, nheads, hs, freqs + (size_t)pos[i] * hs, sign);
    return 0;
}

int cpu_rope_forward(float *x, int n, int ld, int nheads, int hs, const int32_t *pos, const float *freqs, int npos)
{
    return rope_apply("rope_forward", x, n, ld, nheads, hs, pos, freqs, npos, 1.0f);
}

int cpu_rope_backward(float *dx, int n, int ld, int nheads, int hs, const int32_t *pos, const float *freqs,
                      int npos)
{
    return rope_apply("rope_backward", dx, n, ld, nheads, hs, pos, freqs, npos, -1.0f);
}
