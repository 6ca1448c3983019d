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

/* Range checks of ids waiting to be read at the next synchronising call (cuda_check_ids). */
#define CUDA_CHECK_SLOTS 256
/* The pinned staging ring of host copies: chunks used in turn, each free again once its event fired. Small
 * copies share a chunk (stage_used bytes of chunk stage_next - 1 are taken), so a step's few small copies (a
 * micro-batch's tokens and targets, a loss read back) never wait for the device. */
#define CUDA_STAGE_CHUNKS 4
#define CUDA_STAGE_BYTES ((size_t)4 << 20)

struct cuda_check_info {
    const char *op, *what;
    int lo, hi;
};

/* One context per process: the device chosen at first use, one non-blocking stream every op is queued
 * on (so the order of ops is the order of calls, and NCCL streams can overlap with it), and the cuBLAS
 * handle bound to that stream. The table is not thread-safe, like the CPU one is not across a shared
 * buffer: one thread drives a rank's GPU. Everything here is allocated when the context is made, before
 * any collective; what grows later (the scratch) comes from the device's stream-ordered pool, which never
 * synchronises the device (an implicit device synchronisation while NCCL kernels run can deadlock). */
struct cuda_ctx {
    int device;
    int sm_count;
    int smem_optin;                   /* max dynamic shared memory per block after opt-in, bytes */
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasComputeType_t gemm_compute; /* now: fp32, TF32, or bf16/fp16 inputs (set_matmul_dtype) */
    cublasComputeType_t gemm_f32;     /* what DTYPE_F32 means: exact, or TF32 with FSDP_CUDA_TF32=1 */
    enum dtype matmul_dtype;          /* set_matmul_dtype's: attention rounds its operands in bf16 mode */
    cudaMemPool_t pool;               /* the device's default pool: mem_alloc and the scratch */
    void *scratch;                    /* grow-only device scratch for reductions (see cuda_scratch) */
    size_t scratch_bytes;
    /* deferred range checks: per slot the first bad (position << 32 | id), all ones when none */
    unsigned long long *checks, *checks_host; /* device; pinned host copy */
    struct cuda_check_info check_info[CUDA_CHECK_SLOTS];
    int n_checks;
    char *stage; /* pinned, CUDA_STAGE_CHUNKS x CUDA_STAGE_BYTES */
    cudaEvent_t stage_done[CUDA_STAGE_CHUNKS];
    int stage_next;    /* the chunk taken next when the current one is full */
    size_t stage_used; /* bytes taken of the current chunk (stage_next - 1); CUDA_STAGE_BYTES: none current */
    double *scalar_host; /* pinned, CUDA_SCALARS: scalars the host reads back (sqnorms) */
};

extern struct cuda_ctx cuda_ctx;

/* Doubles of cuda_ctx.scalar_host; sqnorm_sum also adds up this many buffers' norms per batch of its scratch. */
#define CUDA_SCALARS 256

/* Threads per block of the elementwise and reduction kernels. */
#define CUDA_THREADS 256

/* 0, or error_set naming the op and the CUDA error (FSDP_ENOMEM for allocation failures). */
int cuda_check(const char *op, cudaError_t e);
/* Checks the launch that was just queued (bad configuration, missing sm_XX code). */
int cuda_check_launch(const char *op);
int cuda_check_blas(const char *op, cublasStatus_t s);
/* A GEMM's operands as it reads them (matmul.cu): the fp32 ones, or their bf16/fp16 copies in the scratch in
 * a 16-bit matmul mode, with the cuBLAS types and compute type for them. */
struct cuda_gemm_operands {
    const void *a, *b;
    cudaDataType_t type;
    cublasComputeType_t compute;
};
int cuda_gemm_operands(const char *op, int ta, int tb, int m, int n, int k, const float *a, int lda,
                       const float *b, int ldb, struct cuda_gemm_operands *g);
/* The 16-bit copy (dtype) that covers [p, p + span) at the same offset, bound or held (lowp.cu); NULL when
 * none does. */
const void *cuda_lowp_find(const float *p, size_t span, enum dtype dtype);
/* The dtype of activation storage at p (act.cu): the act_bind range's that holds p, else DTYPE_F32. */
enum dtype cuda_act_dtype(const void *p);
/* Whether [act] argument p holds 16-bit (bf16) elements: 0 with *lowp set, or FSDP_EINVAL naming op when its
 * dtype is not the matmuls' (the elements would be read as another type). */
int cuda_act_lowp(const char *op, const void *p, bool *lowp);
/* [act] tensors in kernels: element i as fp32, an fp32 result stored (bf16 rounded to nearest even when lp),
 * and the address of element o, in the tensor's own elements. A kernel passes lp as a template parameter where
 * it has one (the branch folds away), or as an argument. */
__device__ __forceinline__ float cuda_act_load(const float *p, size_t i, bool lp)
{
    return lp ? dtype_bf16_to_f32(((const uint16_t *)p)[i]) : p[i];
}
__device__ __forceinline__ void cuda_act_store(float *p, size_t i, float v, bool lp)
{
    if (lp)
        ((uint16_t *)p)[i] = dtype_f32_to_bf16(v);
    else
        p[i] = v;
}
__device__ __forceinline__ float *cuda_act_row(float *p, size_t o, bool lp)
{
    return lp ? (float *)((uint16_t *)p + o) : p + o;
}
__device__ __forceinline__ const float *cuda_act_row(const float *p, size_t o, bool lp)
{
    return lp ? (const float *)((const uint16_t *)p + o) : p + o;
}
/* Causal attention in bf16 mode on tensor cores (attention_gemm.cu), for head sizes that are multiples of 8:
 * applies says whether the mode and shape are its; the entries take attention.cu's checked arguments. */
bool cuda_attention_gemm_applies(int c, int nh);
int cuda_attention_gemm_forward(float *out, float *lse, const float *qkv, int b, int t, int c, int nh, int nkv,
                                int window);
int cuda_attention_gemm_backward(float *dqkv, const float *dout, const float *qkv, const float *lse,
                                 const float *dsum, int b, int t, int c, int nh, int nkv, int window);
/* Row-major C(m, n) = op(A) op(B) + beta C (+ bias[j] on every row when bias is not NULL: n floats) through
 * cuBLASLt with the bias as its epilogue (matmul_lt.cu). With gelu_pre, that sum goes to gelu_pre (laid out
 * as C) and C gets its GELU (the tanh form); with dgelu_pre (laid out as C), C = the product times the GELU's
 * derivative at dgelu_pre. */
int cuda_lt_matmul(const char *op, int ta, int tb, int m, int n, int k, const float *a, int lda, const float *b,
                   int ldb, float beta, float *c, int ldc, const float *bias, float *gelu_pre, const float *dgelu_pre);
/* Device scratch of at least bytes, valid for the work queued until the next call. It grows (when a
 * bigger size is first needed; the sizes depend on shapes, so it stops after the first step) by a
 * stream-ordered free and allocation: work queued before still reads the old buffer, and nothing waits. */
int cuda_scratch(const char *op, void **ptr, size_t bytes);
/* Grid size for a grid-stride loop over n elements. */
unsigned cuda_grid(size_t n);
/* Queues a check of ids[0..n) against [lo, hi) (ids on the device) that costs no host round trip: the
 * kernels that use the ids skip a bad one, and the next synchronising call (cuda_sync) reports the first
 * bad position of each check as FSDP_ERANGE naming op and what. */
int cuda_check_ids(const char *op, const char *what, const int32_t *ids, int n, int lo, int hi);
/* Waits for the stream, then reports a failed deferred range check (clearing them all): the synchronising
 * calls of the table (synchronize, device-to-host copies, sqnorm, a loss sum) end with it. */
int cuda_sync(const char *op);
/* Rows per partial of a deterministic column reduction of rows x cols (cuda_colsum_add, the norms' parameter
 * gradients): enough chunks to give a large GPU a few blocks per SM, from the shape alone. */
int cuda_chunk_rows(int rows, int cols);
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
