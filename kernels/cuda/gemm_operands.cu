/* A GEMM's operands as it reads them (cuda_common.h, struct cuda_gemm_operands), shared by the cuBLAS calls of
 * matmul.cu and the cuBLASLt ones of matmul_lt.cu: fp32 as they are, or in a 16-bit matmul mode their
 * rounded copies (or the copies bound or held already, lowp.cu). */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

/* One operand's span rounded to 16 bits (common/dtype.h's conversion: the CPU's bits). The span is the
 * rows times the leading dimension, gaps included, so the copy keeps the caller's ld. */
template <int DST> __global__ void gemm_round_kernel(void *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dtype_store_f32((enum dtype)DST, dst, i, src[i]);
}

static size_t gemm_span(int rows, int cols, int ld)
{
    return rows == 0 || cols == 0 ? 0 : (size_t)(rows - 1) * ld + cols;
}

/* The operands of a row-major op(A) op(B) as the GEMM reads them. In bf16 (fp16) mode they are rounded to
 * bf16 (fp16) in scratch and cuBLAS multiplies those: CUBLAS_COMPUTE_32F_FAST_16BF on fp32 operands was seen
 * to give TF32's bits on an H200 (cuBLAS 13.1), not the bf16 rounding of the CPU table and of bf16 autocast.
 * An operand with a 16-bit copy already (a bound gathered unit, a held dy: lowp.cu) is read from that copy, and
 * one in activation storage (act.cu) as it is. */
int cuda_gemm_operands(const char *op, int ta, int tb, int m, int n, int k, const float *a, int lda,
                       const float *b, int ldb, struct cuda_gemm_operands *g)
{
    enum dtype lowp = cuda_ctx.matmul_dtype;
    bool a_act, b_act; /* activation storage holds the matmul dtype already (act.cu) */
    FSDP_TRY(cuda_act_lowp(op, a, &a_act));
    FSDP_TRY(cuda_act_lowp(op, b, &b_act));
    if (lowp == DTYPE_F32 || k == 0) {
        *g = (struct cuda_gemm_operands){a, b, CUDA_R_32F, cuda_ctx.gemm_f32};
        return 0;
    }
    size_t na = ta ? gemm_span(k, m, lda) : gemm_span(m, k, lda);
    size_t nb = tb ? gemm_span(n, k, ldb) : gemm_span(k, n, ldb);
    const void *a_lp = a_act ? a : cuda_lowp_find(a, na, lowp), *b_lp = b_act ? b : cuda_lowp_find(b, nb, lowp);
    size_t na_padded = a_lp ? 0 : (na + 7) & ~(size_t)7; /* b's copy 16-byte aligned, as cuBLAS prefers */
    size_t nb_need = b_lp ? 0 : nb;
    uint16_t *a16 = NULL, *b16 = NULL;
    if (na_padded + nb_need) {
        void *ws;
        FSDP_TRY(cuda_scratch(op, &ws, (na_padded + nb_need) * 2));
        a16 = (uint16_t *)ws, b16 = a16 + na_padded;
    }
    cudaStream_t s = cuda_ctx.stream;
    cudaDataType_t t16 = lowp == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    if (lowp == DTYPE_BF16) {
        if (!a_lp)
            gemm_round_kernel<DTYPE_BF16><<<cuda_grid(na), CUDA_THREADS, 0, s>>>(a16, a, na);
        if (!b_lp)
            gemm_round_kernel<DTYPE_BF16><<<cuda_grid(nb), CUDA_THREADS, 0, s>>>(b16, b, nb);
    } else {
        if (!a_lp)
            gemm_round_kernel<DTYPE_F16><<<cuda_grid(na), CUDA_THREADS, 0, s>>>(a16, a, na);
        if (!b_lp)
            gemm_round_kernel<DTYPE_F16><<<cuda_grid(nb), CUDA_THREADS, 0, s>>>(b16, b, nb);
    }
    FSDP_TRY(cuda_check_launch(op));
    *g = (struct cuda_gemm_operands){a_lp ? a_lp : a16, b_lp ? b_lp : b16, t16, CUBLAS_COMPUTE_32F};
    return 0;
}

