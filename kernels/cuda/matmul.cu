/* Linear layers and general GEMM on cuBLAS (cublasGemmEx; fp32 in and out; fp32, TF32 or bf16/fp16 inputs,
 * see set_matmul_dtype). cuBLAS is column-major:
 * a row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so every call swaps the operands
 * and the m/n sizes instead of transposing anything. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

extern "C" {
#include "common/log.h"
}

/* Row-major C(m, n) = alpha op(A) op(B) + beta C. */
static int gemm_rm(const char *op, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                   const float *b, int ldb, float beta, float *c, int ldc)
{
    if (m == 0 || n == 0)
        return 0;
    bool c_lp; /* C in bf16 activation storage: written rounded (beta 0 only: nothing is added to bf16) */
    FSDP_TRY(cuda_act_lowp(op, c, &c_lp));
    if (c_lp && beta != 0.0f)
        return error_set(FSDP_EINVAL, "kernels cuda: %s: a bf16 activation is written (beta 0), not added to", op);
    if (c_lp && k == 0) { /* an empty sum: C's rows are zero (cuBLAS has no fp32-operand, bf16-C form for it) */
        for (int r = 0; r < m; r++)
            FSDP_TRY(cuda_check(op, cudaMemsetAsync((uint16_t *)c + (size_t)r * ldc, 0, (size_t)n * 2, cuda_ctx.stream)));
        return 0;
    }
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    struct cuda_gemm_operands g;
    FSDP_TRY(cuda_gemm_operands(op, ta, tb, m, n, k, a, lda, b, ldb, &g));
    return cuda_check_blas(op, cublasGemmEx(cuda_ctx.blas, opb, opa, n, m, k, &alpha, g.b, g.type, ldb, g.a, g.type,
                                            lda, &beta, c, c_lp ? CUDA_R_16BF : CUDA_R_32F, ldc, g.compute,
                                            CUBLAS_GEMM_DEFAULT));
}

/* A 16-bit matmul mode (dtype, computed as compute), said once as the run enters it. */
static int set_lowp_mode(enum dtype dtype, cublasComputeType_t compute, const char *name)
{
    if (cuda_ctx.gemm_compute != compute)
        log_info("kernels cuda: matmuls take %s inputs and accumulate in fp32", name);
    cuda_ctx.gemm_compute = compute;
    cuda_ctx.matmul_dtype = dtype;
    return 0;
}

int cuda_set_matmul_dtype(enum dtype dtype)
{
    /* fp32 tensors stay fp32 in memory; each GEMM rounds its operands to bf16/fp16 in scratch (gemm_rm) and
     * accumulates in fp32: the numerics of bf16 autocast, without lasting 16-bit copies of the weights. */
    switch (dtype) {
    case DTYPE_F32:
        cuda_ctx.gemm_compute = cuda_ctx.gemm_f32;
        cuda_ctx.matmul_dtype = dtype;
        return 0;
    case DTYPE_BF16:
        return set_lowp_mode(dtype, CUBLAS_COMPUTE_32F_FAST_16BF, "bf16");
    case DTYPE_F16:
        /* attention computes in fp32 in this mode, as the CPU's does (attention.cu) */
        return set_lowp_mode(dtype, CUBLAS_COMPUTE_32F_FAST_16F, "fp16");
    }
    return error_set(FSDP_EINVAL, "kernels cuda: set_matmul_dtype: unknown dtype %d", (int)dtype);
}

static int check_dims(const char *op, int n, int in, int out)
{
    if (n < 0 || in <= 0 || out <= 0)
        return error_set(FSDP_EINVAL, "kernels cuda: %s: bad shape n=%d in=%d out=%d", op, n, in, out);
    return 0;
}

int cuda_matmul_forward(float *y, const float *x, const float *w, const float *b, int n, int in, int out)
{
    FSDP_TRY(check_dims("matmul_forward", n, in, out));
    if (n == 0)
        return 0;
    /* The bias is cuBLASLt's epilogue, added as the product is written (matmul_lt.cu): it was a fill kernel
     * writing y and a GEMM reading it back with beta = 1. */
    if (b)
        return cuda_lt_matmul("matmul_forward", 0, 0, n, out, in, x, in, w, out, 0.0f, y, out, b, NULL, NULL);
    return gemm_rm("matmul_forward", 0, 0, n, out, in, 1.0f, x, in, w, out, 0.0f, y, out);
}

int cuda_matmul_forward_gelu(float *pre, float *y, const float *x, const float *w, const float *b, int n, int in,
                             int out)
{
    FSDP_TRY(check_dims("matmul_forward_gelu", n, in, out));
    if (n == 0)
        return 0;
    if (!pre || pre == y || y == x)
        return error_set(FSDP_EINVAL, "kernels cuda: matmul_forward_gelu: y must alias neither pre nor x");
    if (cuda_act_dtype(pre) != DTYPE_F32) /* not [act]: the GELU epilogue's aux would have to be D's type */
        return error_set(FSDP_EINVAL, "kernels cuda: matmul_forward_gelu: the GELU's input is fp32, not an activation "
                                      "in bf16");
    bool lp;
    FSDP_TRY(cuda_act_lowp("matmul_forward_gelu", y, &lp));
    if (lp) { /* y in bf16 activation storage: the product and bias into pre, then the GELU rounds as it writes */
        FSDP_TRY(cuda_lt_matmul("matmul_forward_gelu", 0, 0, n, out, in, x, in, w, out, 0.0f, pre, out, b, NULL, NULL));
        return cuda_gelu_forward(y, pre, (size_t)n * out);
    }
    /* cuBLASLt's GELU_AUX(_BIAS) epilogue: pre written as the GELU's input, y as its output */
    return cuda_lt_matmul("matmul_forward_gelu", 0, 0, n, out, in, x, in, w, out, 0.0f, y, out, b, pre, NULL);
}

int cuda_matmul_dx_dgelu(float *dpre, const float *dy, const float *w, const float *pre, int n, int in, int out)
{
    FSDP_TRY(check_dims("matmul_dx_dgelu", n, in, out));
    if (n == 0)
        return 0;
    if (!pre || dpre == dy || dpre == pre)
        return error_set(FSDP_EINVAL, "kernels cuda: matmul_dx_dgelu: dpre must alias neither dy nor pre");
    /* dy(n, out) W(in, out)^T with cuBLASLt's DGELU epilogue reading the forward's GELU input */
    return cuda_lt_matmul("matmul_dx_dgelu", 0, 1, n, in, out, dy, out, w, out, 0.0f, dpre, in, NULL, NULL, pre);
}

int cuda_matmul_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                         int n, int in, int out)
{
    FSDP_TRY(check_dims("matmul_backward", n, in, out));
    if (n == 0)
        return 0;
    if (dx)
        FSDP_TRY(gemm_rm("matmul_backward dx", 0, 1, n, in, out, 1.0f, dy, out, w, out, 1.0f, dx, in));
    if (dw)
        FSDP_TRY(gemm_rm("matmul_backward dw", 1, 0, in, out, n, 1.0f, x, in, dy, out, 1.0f, dw, out));
    if (db)
        return cuda_colsum_add("matmul_backward db", db, dy, n, out);
    return 0;
}

int cuda_gemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc)
{
    int a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) ||
        ldc < (n > 1 ? n : 1))
        return error_set(FSDP_EINVAL, "kernels cuda: gemm: bad shape m=%d n=%d k=%d lda=%d ldb=%d ldc=%d", m, n,
                         k, lda, ldb, ldc);
    return gemm_rm("gemm", trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
