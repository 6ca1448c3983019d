/* Activation storage (kernels.h, act_bind .. act_unbind): device ranges whose [act] tensors hold 16-bit
 * elements, so a model keeps its GEMM inputs in bf16, as autocast and llm.c do, instead of fp32 tensors that
 * every GEMM rounds into scratch again.
 *
 * The ranges are device addresses in a short host list, as lowp.cu's: a model binds one range (its arena's
 * activation region), and an op looks its [act] pointers up once per call. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

#define CUDA_ACT_RANGES 64

static struct {
    const char *p;
    size_t bytes;
    enum dtype dtype;
} acts[CUDA_ACT_RANGES];
static int n_acts;

int cuda_act_bind(void *p, size_t bytes, enum dtype dtype)
{
    if (!p || bytes == 0)
        return error_set(FSDP_EINVAL, "kernels cuda: act_bind: NULL buffer or empty range");
    if (dtype != DTYPE_BF16)
        return error_set(FSDP_EINVAL, "kernels cuda: act_bind: activations are stored in bf16 only, not %s",
                         dtype_name(dtype));
    const char *c = (const char *)p;
    for (int i = 0; i < n_acts; i++)
        if (c < acts[i].p + acts[i].bytes && acts[i].p < c + bytes)
            return error_set(FSDP_EEXIST, "kernels cuda: act_bind: [%p, +%zu) overlaps the bound range [%p, +%zu)",
                             p, bytes, (const void *)acts[i].p, acts[i].bytes);
    if (n_acts == CUDA_ACT_RANGES)
        return error_set(FSDP_ERANGE, "kernels cuda: act_bind: %d ranges bound already", CUDA_ACT_RANGES);
    acts[n_acts++] = {c, bytes, dtype};
    return 0;
}

int cuda_act_unbind(void *p)
{
    for (int i = 0; i < n_acts; i++)
        if (acts[i].p == (const char *)p) {
            acts[i] = acts[--n_acts];
            return 0;
        }
    return error_set(FSDP_ENOTFOUND, "kernels cuda: act_unbind: %p is not a bound range", p);
}

enum dtype cuda_act_dtype(const void *p)
{
    const char *c = (const char *)p;
    for (int i = 0; i < n_acts; i++)
        if (c >= acts[i].p && c < acts[i].p + acts[i].bytes)
            return acts[i].dtype;
    return DTYPE_F32;
}

int cuda_act_lowp(const char *op, const void *p, bool *lowp)
{
    enum dtype d = cuda_act_dtype(p);
    *lowp = d != DTYPE_F32;
    if (*lowp && d != cuda_ctx.matmul_dtype)
        return error_set(FSDP_EINVAL, "kernels cuda: %s: an activation stored in %s while the matmuls compute in %s",
                         op, dtype_name(d), dtype_name(cuda_ctx.matmul_dtype));
    return 0;
}
