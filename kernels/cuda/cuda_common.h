/* Private to the CUDA backend: the process-wide device context and the helpers every kernel file shares
 * (error checks, scratch memory, grid sizes, range checks, column sums, warp and block reductions).
 * cuda_common.cu defines them and calls no kernel file and not the table. Included only by the .cu files
 * (C++ compiled by nvcc). */
#ifndef FSDP_KERNELS_CUDA_CUDA_COMMON_H
#define FSDP_KERNELS_CUDA_CUDA_COMMON_H

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

/* Makes the context on first call (thread-safe) and binds the calling thread to its device: 0, or the
 * error (error_set) saying why no GPU is usable; the answer is cached, the message set on every call. */
int cuda_context_init(void);

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
