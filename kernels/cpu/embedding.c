/* Token + position embeddings. */
#include "common/error.h"
#include "kernels/cpu/cpu.h"

/* Channels per task in backward: tasks own disjoint column strips of dwte/dwpe, so repeated tokens
 * accumulate without races and in a fixed order. */
#define EMB_STRIP 64

static int check_tokens(const char *op, const int32_t *tokens, long rows, int vocab)
{
    for (long i = 0; i < rows; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return error_set(FSDP_ERANGE, "kernels cpu: %s: token %d at position %ld is outside [0, %d)", op,
                             (int)tokens[i], i, vocab);
    return 0;
}

int cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int b,
                          int t, int c, int vocab)
{
    if (b < 0 || t < 0 || c <= 0 || vocab <= 0)
        return error_set(FSDP_EINVAL, "kernels cpu: embedding_forward: bad shape b=%d t=%d c=%d vocab=%d", b,
                         t, c, vocab);
    long rows = (long)b * t;
    FSDP_TRY(check_tokens("embedding_forward", tokens, rows, vocab));
#pragma omp parallel for schedule(static) if (rows * c > CPU_CHUNK)
    for (long i = 0; i < rows; i++) {
        const float *te = wte + (size_t)tokens[i] * c, *pe = wpe + (size_t)(i % t) * c;
        float *o = out + (size_t)i * c;
#pragma omp simd
        for (int j = 0; j < c; j++)
            o[j] = te[j] + pe[j];
    }
    return 0;
}

int cpu_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int b,
                           int t, int c, int vocab)
{
    if (b < 0 || t < 0 || c <= 0 || vocab <= 0)
        return error_set(FSDP_EINVAL, "kernels cpu: embedding_backward: bad shape b=%d t=%d c=%d vocab=%d",
                         b, t, c, vocab);
    long rows = (long)b * t;
    if (dwte) {
        FSDP_TRY(check_tokens("embedding_backward", tokens, rows, vocab));
    }
    int strips = (c + EMB_STRIP - 1) / EMB_STRIP;
#pragma omp parallel for schedule(static) if (rows * c > CPU_CHUNK)
    for (int s = 0; s < strips; s++) {
        int j0 = s * EMB_STRIP, j1 = j0 + EMB_STRIP < c ? j0 + EMB_STRIP : c;
        for (long i = 0; i < rows; i++) {
            const float *g = dout + (size_t)i * c;
            if (dwte) {
                float *d = dwte + (size_t)tokens[i] * c;
#pragma omp simd
                for (int j = j0; j < j1; j++)
                    d[j] += g[j];
            }
            if (dwpe) {
                float *d = dwpe + (size_t)(i % t) * c;
#pragma omp simd
                for (int j = j0; j < j1; j++)
                    d[j] += g[j];
            }
        }
    }
    return 0;
}
