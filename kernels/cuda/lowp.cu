/* The 16-bit operands of the CUDA table's mixed-precision GEMMs, when they exist already (kernels.h, lowp_bind
 * .. lowp_release).
 *
 * In bf16 (fp16) mode every GEMM reads both operands in 16 bits, and matmul.cu rounds an fp32 operand into
 * scratch first: a pass over it per GEMM. Two operands need no such pass: gathered parameters, which the FSDP
 * engine all-gathers in bf16 and binds to their fp32 view (lowp_bind), and an operand that two products read
 * in a row (a linear layer's dy: its dx and its dW), which the model holds (lowp_hold) and this table then
 * rounds once. A GEMM operand that lies inside a range here is read from its 16-bit copy at the same offset.
 *
 * The ranges are device addresses in a short host list: the table has one driving thread (cuda_common.h), a
 * handful of ranges are bound at a time, and a GEMM costs far more than scanning them. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

/* As the CPU table's: the engine binds the units gathered around the one computing (ZeRO-2: every unit). */
#define CUDA_LOWP_RANGES 1024

static struct {
    const float *f32;
    const void *lp;
    size_t n;
    enum dtype dtype;
    void *held; /* lowp_hold's own copy (freed by lowp_release); NULL for a caller's bound copy */
} ranges[CUDA_LOWP_RANGES];
static int n_ranges;

static int lowp_add(const char *op, const float *f32, const void *lp, size_t n, enum dtype dtype, void *held)
{
    for (int i = 0; i < n_ranges; i++)
        if (f32 < ranges[i].f32 + ranges[i].n && ranges[i].f32 < f32 + n)
            return error_set(FSDP_EEXIST, "kernels cuda: %s: [%p, +%zu) overlaps the bound range [%p, +%zu)", op,
                             (const void *)f32, n, (const void *)ranges[i].f32, ranges[i].n);
    if (n_ranges == CUDA_LOWP_RANGES)
        return error_set(FSDP_ERANGE, "kernels cuda: %s: %d ranges bound already; unbind released ones", op,
                         CUDA_LOWP_RANGES);
    ranges[n_ranges++] = {f32, lp, n, dtype, held};
    return 0;
}

/* The range that starts at f32, -1 when none does. */
static int lowp_index(const float *f32)
{
    for (int i = 0; i < n_ranges; i++)
        if (ranges[i].f32 == f32)
            return i;
    return -1;
}

int cuda_lowp_bind(const float *f32, const void *lp, size_t n)
{
    if (!f32 || !lp || n == 0)
        return error_set(FSDP_EINVAL, "kernels cuda: lowp_bind: NULL buffer or empty range");
    /* the copy is in the dtype the matmuls compute in now (the engine binds param_dtype copies in that mode) */
    enum dtype d = cuda_ctx.matmul_dtype == DTYPE_F16 ? DTYPE_F16 : DTYPE_BF16;
    return lowp_add("lowp_bind", f32, lp, n, d, NULL);
}

int cuda_lowp_unbind(const float *f32)
{
    int i = lowp_index(f32);
    if (i < 0 || ranges[i].held)
        return error_set(FSDP_ENOTFOUND, "kernels cuda: lowp_unbind: %p is not a bound range", (const void *)f32);
    ranges[i] = ranges[--n_ranges];
    return 0;
}

int cuda_lowp_hold(const float *x, size_t n)
{
    enum dtype d = cuda_ctx.matmul_dtype;
    if (d == DTYPE_F32 || n == 0)
        return 0; /* nothing is rounded in fp32 */
    if (!x)
        return error_set(FSDP_EINVAL, "kernels cuda: lowp_hold: NULL buffer");
    if (cuda_act_dtype(x) != DTYPE_F32)
        return 0; /* an activation stored in 16 bits already (act.cu): the GEMMs read it as it is */
    for (int i = 0; i < n_ranges; i++)
        if (x >= ranges[i].f32 && x + n <= ranges[i].f32 + ranges[i].n)
            return 0; /* bound already: left as it is */
    void *lp = cuda_mem_alloc(n * 2);
    if (!lp)
        return FSDP_ENOMEM;
    int rc = cuda_cast(lp, d, x, DTYPE_F32, n);
    if (rc == 0)
        rc = lowp_add("lowp_hold", x, lp, n, d, lp);
    if (rc)
        cuda_mem_free(lp);
    return rc;
}

int cuda_lowp_release(const float *x)
{
    int i = lowp_index(x);
    if (i < 0 || !ranges[i].held)
        return 0; /* held in fp32 mode, or bound by its owner: nothing of the hold's to release */
    cuda_mem_free(ranges[i].held); /* stream-ordered: the GEMMs queued before still read it */
    ranges[i] = ranges[--n_ranges];
    return 0;
}

const void *cuda_lowp_find(const float *p, size_t span, enum dtype dtype)
{
    for (int i = 0; i < n_ranges; i++)
        if (ranges[i].dtype == dtype && p >= ranges[i].f32 && p + span <= ranges[i].f32 + ranges[i].n)
            return (const uint16_t *)ranges[i].lp + (p - ranges[i].f32);
    return NULL;
}
