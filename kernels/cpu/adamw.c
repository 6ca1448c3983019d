/* AdamW on fp32 master weights (PyTorch's torch.optim.AdamW update, decoupled weight decay). */
#include <math.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"

struct adamw_consts {
    float lr, b1, b2, eps, wd, gs, inv_bc1, inv_bc2;
};

CPU_SIMD_CLONES
static void adamw_chunk(float *p, const float *g, float *m, float *v, size_t n, const struct adamw_consts *k)
{
    const float lr = k->lr, b1 = k->b1, b2 = k->b2, eps = k->eps, wd = k->wd, gs = k->gs;
    const float ibc1 = k->inv_bc1, ibc2 = k->inv_bc2;
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gs;
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float upd = (mi * ibc1) / (sqrtf(vi * ibc2) + eps);
        p[i] -= lr * (upd + wd * p[i]);
    }
}

int cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n,
              const struct kernels_adamw_params *hp)
{
    if (!hp || hp->step < 1 || !(hp->beta1 >= 0.0f && hp->beta1 < 1.0f) ||
        !(hp->beta2 >= 0.0f && hp->beta2 < 1.0f) || !(hp->eps >= 0.0f))
        return error_set(FSDP_EINVAL, "kernels cpu: adamw: bad hyper-parameters (step must be >= 1, betas in "
                         "[0, 1), eps >= 0)");
    if (n && (!param || !grad || !m || !v))
        return error_set(FSDP_EINVAL, "kernels cpu: adamw: NULL buffer");
    float gsd = hp->grad_scale_dev ? *hp->grad_scale_dev : 1.0f;
    if (gsd != gsd)
        return 0; /* grad_clip found the norm non-finite: the step is skipped */
    /* Bias corrections in double: 1 - beta2^step is tiny for small steps and matters to the first
     * updates. */
    struct adamw_consts k = {
        .lr = hp->lr, .b1 = hp->beta1, .b2 = hp->beta2, .eps = hp->eps, .wd = hp->weight_decay,
        .gs = hp->grad_scale * gsd,
        .inv_bc1 = (float)(1.0 / (1.0 - pow((double)hp->beta1, hp->step))),
        .inv_bc2 = (float)(1.0 / (1.0 - pow((double)hp->beta2, hp->step))),
    };
    size_t chunks = (n + CPU_CHUNK - 1) / CPU_CHUNK;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t ch = 0; ch < chunks; ch++) {
        size_t lo = ch * CPU_CHUNK, len = n - lo < CPU_CHUNK ? n - lo : CPU_CHUNK;
        adamw_chunk(param + lo, grad + lo, m + lo, v + lo, len, &k);
    }
    return 0;
}
