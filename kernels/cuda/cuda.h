/* Private to the CUDA backend: the process-wide device context, error helpers and the functions that
 * kernels_cuda() puts in its table. Included only by the .cu files (C++ compiled by nvcc). */
#ifndef FSDP_KERNELS_CUDA_CUDA_H
#define FSDP_KERNELS_CUDA_CUDA_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "common/error.h"
#include "kernels/kernels.h"
}

/* One context per process: the device chosen at first use, one non-blocking stream every op is queued
 * on (so the order of ops is the order of calls, and NCCL streams can overlap with it), and the cuBLAS
 * handle bound to that stream. The table is not thread-safe, like the CPU one is not across a shared
 * buffer: one thread drives a rank's GPU. */
struct cuda_ctx {
    int device;
    int sm_count;
    int smem_optin;                   /* max dynamic shared memory per block after opt-in, bytes */
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasComputeType_t gemm_compute; /* now: fp32, TF32, or bf16/fp16 inputs (set_matmul_dtype) */
    cublasComputeType_t gemm_f32;     /* what DTYPE_F32 means: exact, or TF32 with FSDP_CUDA_TF32=1 */
    int *flag;                        /* device int: first bad index found by a range check */
    void *scratch;                    /* grow-only device scratch for reductions (see cuda_scratch) */
    size_t scratch_bytes;
};

extern struct cuda_ctx cuda_ctx;

/* Threads per block of the elementwise and reduction kernels. */
#define CUDA_THREADS 256

/* 0, or error_set naming the op and the CUDA error (FSDP_ENOMEM for allocation failures). */
int cuda_check(const char *op, cudaError_t e);
/* Checks the launch that was just queued (bad configuration, missing sm_XX code). */
int cuda_check_launch(const char *op);
int cuda_check_blas(const char *op, cublasStatus_t s);
/* Device scratch of at least bytes, valid until the next call; grows with a synchronising cudaMalloc
 * only when a bigger size is first needed (the sizes here depend on shapes, so it stops growing after
 * the first step). */
int cuda_scratch(const char *op, void **ptr, size_t bytes);
/* Grid size for a grid-stride loop over n elements. */
unsigned cuda_grid(size_t n);
/* FSDP_ERANGE naming the first i with ids[i] outside [lo, hi) (ids on the device; synchronises). */
int cuda_check_ids(const char *op, const char *what, const int32_t *ids, int n, int lo, int hi);
/* Adds the column sums of a (rows, cols) matrix, computed by cuda_colsum_*, in a fixed order into dst:
 * partial sums over fixed row chunks, then the chunks in order, so results are run-to-run identical. */
int cuda_colsum_add(const char *op, float *dst, const float *src, int rows, int cols);

void *cuda_mem_alloc(size_t bytes);
void cuda_mem_free(void *ptr);
void *cuda_host_alloc(size_t bytes);
void cuda_host_free(void *ptr);
int cuda_mem_copy(void *dst, const void *src, size_t bytes, enum kernels_copy_kind kind);
int cuda_mem_set(void *dst, int value, size_t bytes);
int cuda_synchronize(void);
int cuda_set_matmul_dtype(enum dtype dtype);

int cuda_matmul_forward(float *y, const float *x, const float *w, const float *b, int n, int in, int out);
int cuda_matmul_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                         int n, int in, int out);
int cuda_gemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc);

int cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                           const float *bias, int n, int c, float eps);
int cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, const float *mean, const float *rstd, int n, int c);

size_t cuda_attention_workspace_bytes(int b, int t, int c, int nh);
int cuda_attention_forward(float *out, float *lse, const float *qkv, int b, int t, int c, int nh,
                           void *workspace);
int cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, int b, int t, int c, int nh, void *workspace);

int cuda_gelu_forward(float *out, const float *inp, size_t n);
int cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
int cuda_residual_forward(float *out, const float *a, const float *b, size_t n);
int cuda_scale(float *x, float s, size_t n);
int cuda_axpy(float *y, float a, const float *x, size_t n);
int cuda_sqnorm(double *result, const float *x, size_t n);
int cuda_cast(void *dst, enum dtype dst_dtype, const void *src, enum dtype src_dtype,
              size_t n);

int cuda_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int b,
                           int t, int c, int vocab);
int cuda_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int b,
                            int t, int c, int vocab);

int cuda_crossentropy_forward_backward(float *losses, double *loss_sum, float *dlogits,
                                       const float *logits, const int32_t *targets, int n, int v, int vp,
                                       float dloss);

int cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n,
               const struct kernels_adamw_params *hp);

/* Warp and block reductions shared by the kernels (full warps only). */
template <typename T> __device__ __forceinline__ T cuda_warp_sum(T x)
{
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float cuda_warp_max(float x)
{
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* Sum over a block of blockDim.x (a multiple of 32, at most 1024) threads; every thread gets the
 * result. sh must hold 32 values; the call may be repeated (it syncs before reusing sh). */
template <typename T> __device__ __forceinline__ T cuda_block_sum(T x, T *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = cuda_warp_sum(x);
    __syncthreads();
    if (lane == 0)
        sh[warp] = x;
    __syncthreads();
    x = lane < nw ? sh[lane] : T(0);
    return cuda_warp_sum(x);
}

#endif
