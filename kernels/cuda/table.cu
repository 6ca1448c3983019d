/* The CUDA ops table: names the functions of the kernel files and makes the device context on first use
 * (cuda_common.cu). */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

static const struct kernels cuda_table = {
    .name = "cuda",
    .host_visible = false,
    .host = kernels_cpu, /* offloaded state lives in pinned host memory, driven by the CPU table */
    .comm_backend = "nccl",
    .auto_dtype = DTYPE_BF16,
    /* 16-bit modes: matmul.cu rounds fp32 operands into scratch, or reads a bound or held copy (lowp.cu) */
    .matmul_dtypes = DTYPE_BIT(DTYPE_F32) | DTYPE_BIT(DTYPE_BF16) | DTYPE_BIT(DTYPE_F16),
    .peak_flops = NULL,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .mem_copy = cuda_mem_copy,
    .mem_copy2d = cuda_mem_copy2d,
    .mem_set = cuda_mem_set,
    .synchronize = cuda_synchronize,
    .set_matmul_dtype = cuda_set_matmul_dtype,
    .lowp_bind = cuda_lowp_bind,
    .lowp_unbind = cuda_lowp_unbind,
    .lowp_hold = cuda_lowp_hold,
    .lowp_release = cuda_lowp_release,
    /* GEMM inputs kept in bf16 by their producers (act.cu) */
    .act_dtypes = DTYPE_BIT(DTYPE_F32) | DTYPE_BIT(DTYPE_BF16),
    .act_bind = cuda_act_bind,
    .act_unbind = cuda_act_unbind,
    .matmul_forward = cuda_matmul_forward,
    .matmul_backward = cuda_matmul_backward,
    .gemm = cuda_gemm,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .attention_workspace_bytes = cuda_attention_workspace_bytes,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .attention_cp_forward = cuda_attention_cp_forward,
    .attention_cp_backward = cuda_attention_cp_backward,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .matmul_forward_gelu = cuda_matmul_forward_gelu,
    .matmul_dx_dgelu = cuda_matmul_dx_dgelu,
    .residual_forward = cuda_residual_forward,
    .residual_layernorm_forward = cuda_residual_layernorm_forward,
    .scale = cuda_scale,
    .sqnorm = cuda_sqnorm,
    .sqnorm_sum = cuda_sqnorm_sum,
    .grad_clip = cuda_grad_clip,
    .cast = cuda_cast,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .crossentropy_forward_backward = cuda_crossentropy_forward_backward,
    .adamw = cuda_adamw,
    .axpy = cuda_axpy,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .residual_rmsnorm_forward = cuda_residual_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
};

extern "C" const struct kernels *kernels_cuda(void)
{
    return cuda_context_init() ? NULL : &cuda_table;
}
