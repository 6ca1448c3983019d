/* AdamW on fp32 master weights (torch.optim.AdamW's update, decoupled weight decay), one fused pass:
 * each element's param, grad, m, v are read once and written once. */
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

struct adamw_consts {
    float lr, b1, b2, eps, wd, gs, inv_bc1, inv_bc2;
};

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, struct adamw_consts k,
                             const float *gsd)
{
    if (gsd) {
        float s = *gsd;
        if (s != s)
            return; /* grad_clip found the norm non-finite: the step is skipped */
        k.gs *= s;
    }
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i] * k.gs;
        float mi = k.b1 * m[i] + (1.0f - k.b1) * gi;
        float vi = k.b2 * v[i] + (1.0f - k.b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float upd = (mi * k.inv_bc1) / (sqrtf(vi * k.inv_bc2) + k.eps);
        p[i] -= k.lr * (upd + k.wd * p[i]);
    }
}

int cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n,
               const struct kernels_adamw_params *hp)
{
    if (!hp || hp->step < 1 || !(hp->beta1 >= 0.0f && hp->beta1 < 1.0f) ||
        !(hp->beta2 >= 0.0f && hp->beta2 < 1.0f) || !(hp->eps >= 0.0f))
        return error_set(FSDP_EINVAL, "kernels cuda: adamw: bad hyper-parameters (step must be >= 1, betas in "
                                      "[0, 1), eps >= 0)");
    if (n == 0)
        return 0;
    if (!param || !grad || !m || !v)
        return error_set(FSDP_EINVAL, "kernels cuda: adamw: NULL buffer");
    /* Bias corrections on the host in double, as the CPU backend does, so both see the same floats. */
    struct adamw_consts k = {
        hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay, hp->grad_scale,
        (float)(1.0 / (1.0 - pow((double)hp->beta1, hp->step))),
        (float)(1.0 / (1.0 - pow((double)hp->beta2, hp->step))),
    };
    adamw_kernel<<<cuda_grid(n), CUDA_THREADS, 0, cuda_ctx.stream>>>(param, grad, m, v, n, k, hp->grad_scale_dev);
    return cuda_check_launch("adamw");
}
