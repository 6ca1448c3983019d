/* The CPU ops table. What it can do (matmul_dtypes) depends on the CPU, so the table is completed once, at
 * the first kernels_cpu(), from what oneDNN finds. */
#include <cblas.h>
#include <pthread.h>

#include "common/log.h"
#include "kernels/cpu/cpu.h"

static struct kernels cpu_table = {
    .name = "cpu",
    .host_visible = true,
    .host = kernels_cpu,
    .comm_backend = "cpu",
    .auto_dtype = DTYPE_F32,
    .peak_flops = cpu_peak_flops,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .host_alloc = cpu_mem_alloc, /* host memory is the device's */
    .host_free = cpu_mem_free,
    .mem_copy = cpu_mem_copy,
    .mem_copy2d = cpu_mem_copy2d,
    .mem_set = cpu_mem_set,
    .synchronize = cpu_synchronize,
    .set_matmul_dtype = cpu_set_matmul_dtype,
    .lowp_bind = cpu_lowp_bind,
    .lowp_unbind = cpu_lowp_unbind,
    .lowp_hold = cpu_lowp_hold,
    .lowp_release = cpu_lowp_release,
    .act_dtypes = DTYPE_BIT(DTYPE_F32), /* no activation storage: bf16 operands are rounded per matmul */
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .gemm = cpu_gemm,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .attention_workspace_bytes = cpu_attention_workspace_bytes,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_cp_forward = cpu_attention_cp_forward,
    .attention_cp_backward = cpu_attention_cp_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .residual_forward = cpu_residual_forward,
    .residual_layernorm_forward = cpu_residual_layernorm_forward,
    .scale = cpu_scale,
    .sqnorm = cpu_sqnorm,
    .sqnorm_sum = cpu_sqnorm_sum,
    .grad_clip = cpu_grad_clip,
    .cast = cpu_cast,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .crossentropy_forward_backward = cpu_crossentropy_forward_backward,
    .adamw = cpu_adamw,
    .axpy = cpu_axpy,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .residual_rmsnorm_forward = cpu_residual_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
};

static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
    cpu_table.matmul_dtypes =
        DTYPE_BIT(DTYPE_F32) | (cpu_isa_get()->bf16 ? DTYPE_BIT(DTYPE_BF16) : 0);
    /* The pthread build of OpenBLAS keeps its own thread pool beside OpenMP's: with several ranks per
     * machine that oversubscribes the cores and ignores OMP_NUM_THREADS. The build links the OpenMP one
     * (rpath); say so loudly if something else was loaded anyway. */
    int par = openblas_get_parallel();
    if (par != 2)
        log_warn("kernels cpu: OpenBLAS is the %s build, not the OpenMP one: threads may oversubscribe; "
                 "install libopenblas0-openmp (config: %s)",
                 par == 1 ? "pthreads" : "sequential", openblas_get_config());
}

const struct kernels *kernels_cpu(void)
{
    pthread_once(&table_once, table_init);
    return &cpu_table;
}
