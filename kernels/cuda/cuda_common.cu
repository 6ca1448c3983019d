/* The CUDA backend's process context (device, stream, cuBLAS handle) and the helpers every kernel file
 * shares: error translation, scratch memory, range checks of ids, column sums. Below both the ops and the
 * table (table.cu): it calls neither. */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.h"

extern "C" {
#include "common/log.h"
#include "common/settings.h"
}

struct cuda_ctx cuda_ctx;

int cuda_check(const char *op, cudaError_t e)
{
    if (e == cudaSuccess)
        return 0;
    return error_set(e == cudaErrorMemoryAllocation ? FSDP_ENOMEM : FSDP_EIO, "kernels cuda: %s: %s (%s)", op,
                     cudaGetErrorString(e), cudaGetErrorName(e));
}

int cuda_check_launch(const char *op)
{
    return cuda_check(op, cudaGetLastError());
}

int cuda_check_blas(const char *op, cublasStatus_t s)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    return error_set(s == CUBLAS_STATUS_ALLOC_FAILED ? FSDP_ENOMEM : FSDP_EIO, "kernels cuda: %s: cuBLAS %s (%s)",
                     op, cublasGetStatusString(s), cublasGetStatusName(s));
}

unsigned cuda_grid(size_t n)
{
    size_t blocks = (n + CUDA_THREADS - 1) / CUDA_THREADS;
    /* Enough blocks to fill every SM several times; grid-stride loops cover the rest. */
    size_t cap = (size_t)(cuda_ctx.sm_count > 0 ? cuda_ctx.sm_count : 1) * 32;
    if (blocks > cap)
        blocks = cap;
    return blocks ? (unsigned)blocks : 1u;
}

int cuda_scratch(const char *op, void **ptr, size_t bytes)
{
    if (bytes > cuda_ctx.scratch_bytes) {
        /* Stream-ordered: the work queued before still reads the old buffer, and no call here waits for
         * the device (cudaFree would, and so could a cudaMalloc, while NCCL kernels run on another stream). */
        if (cuda_ctx.scratch)
            FSDP_TRY(cuda_check(op, cudaFreeAsync(cuda_ctx.scratch, cuda_ctx.stream)));
        cuda_ctx.scratch = NULL;
        cuda_ctx.scratch_bytes = 0;
        size_t want = bytes < (1u << 20) ? (1u << 20) : bytes;
        FSDP_TRY(cuda_check(op, cudaMallocFromPoolAsync(&cuda_ctx.scratch, want, cuda_ctx.pool, cuda_ctx.stream)));
        cuda_ctx.scratch_bytes = want;
    }
    *ptr = cuda_ctx.scratch;
    return 0;
}

/* atomicMin of (position << 32 | id) keeps the first bad position (and its id) of the slot. */
__global__ void check_ids_kernel(unsigned long long *slot, const int32_t *ids, int n, int lo, int hi)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        if (ids[i] < lo || ids[i] >= hi)
            atomicMin(slot, ((unsigned long long)(unsigned)i << 32) | (unsigned)ids[i]);
}

int cuda_check_ids(const char *op, const char *what, const int32_t *ids, int n, int lo, int hi)
{
    if (n <= 0)
        return 0;
    if (cuda_ctx.n_checks == CUDA_CHECK_SLOTS)
        FSDP_TRY(cuda_sync(op)); /* that many calls without one synchronising call: read them now */
    int k = cuda_ctx.n_checks++;
    cuda_ctx.check_info[k] = (struct cuda_check_info){op, what, lo, hi};
    check_ids_kernel<<<cuda_grid((size_t)n), CUDA_THREADS, 0, cuda_ctx.stream>>>(cuda_ctx.checks + k, ids, n, lo,
                                                                                    hi);
    return cuda_check_launch(op);
}

int cuda_sync(const char *op)
{
    int n = cuda_ctx.n_checks;
    if (n > 0)
        FSDP_TRY(cuda_check(op, cudaMemcpyAsync(cuda_ctx.checks_host, cuda_ctx.checks, (size_t)n * sizeof(uint64_t),
                                                cudaMemcpyDeviceToHost, cuda_ctx.stream)));
    cudaError_t e = cudaStreamSynchronize(cuda_ctx.stream);
    if (e != cudaSuccess)
        return error_set(FSDP_EIO, "kernels cuda: %s: an earlier kernel failed asynchronously: %s (%s)", op,
                         cudaGetErrorString(e), cudaGetErrorName(e));
    if (n == 0)
        return 0;
    cuda_ctx.n_checks = 0;
    FSDP_TRY(cuda_check(op, cudaMemsetAsync(cuda_ctx.checks, 0xff, (size_t)n * sizeof(uint64_t), cuda_ctx.stream)));
    for (int k = 0; k < n; k++) {
        unsigned long long v = cuda_ctx.checks_host[k];
        if (v == ~0ull)
            continue;
        const struct cuda_check_info *ci = &cuda_ctx.check_info[k];
        return error_set(FSDP_ERANGE, "kernels cuda: %s: %s %d at position %u is outside [%d, %d) (found by the "
                         "asynchronous check, reported by %s; the op skipped it)", ci->op, ci->what,
                         (int)(unsigned)(v & 0xffffffffu), (unsigned)(v >> 32), ci->lo, ci->hi, op);
    }
    return 0;
}

/* ---- deterministic column sums ---- */

/* Blocks a column reduction aims at: a few per SM of a large GPU (132 on an H100 SXM), where fixed chunks of
 * 256 rows gave 96 blocks for GPT-2's 768 columns of 8192 rows. A function of the shape only, so the sums
 * have the same bits on every GPU. */
#define COLSUM_BLOCKS 512
#define COLSUM_MIN_ROWS 32

int cuda_chunk_rows(int rows, int cols)
{
    long colblocks = (cols + CUDA_THREADS - 1) / CUDA_THREADS;
    long chunks = (COLSUM_BLOCKS + colblocks - 1) / colblocks;
    long per = (rows + chunks - 1) / chunks;
    return per < COLSUM_MIN_ROWS ? COLSUM_MIN_ROWS : (int)per;
}

__global__ void colsum_partial_kernel(float *part, const float *src, int rows, int cols, int chunk_rows)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int r0 = blockIdx.y * chunk_rows, r1 = min(r0 + chunk_rows, rows);
    if (j >= cols)
        return;
    float s = 0.0f;
    for (int i = r0; i < r1; i++)
        s += src[(size_t)i * cols + j];
    part[(size_t)blockIdx.y * cols + j] = s;
}

__global__ void colsum_finish_kernel(float *dst, const float *part, int chunks, int cols)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols)
        return;
    float s = 0.0f;
    for (int k = 0; k < chunks; k++)
        s += part[(size_t)k * cols + j];
    dst[j] += s;
}

int cuda_colsum_add(const char *op, float *dst, const float *src, int rows, int cols)
{
    if (rows <= 0 || cols <= 0)
        return 0;
    int chunk_rows = cuda_chunk_rows(rows, cols), chunks = (rows + chunk_rows - 1) / chunk_rows;
    void *part;
    FSDP_TRY(cuda_scratch(op, &part, (size_t)chunks * cols * sizeof(float)));
    dim3 grid((cols + CUDA_THREADS - 1) / CUDA_THREADS, chunks);
    colsum_partial_kernel<<<grid, CUDA_THREADS, 0, cuda_ctx.stream>>>((float *)part, src, rows, cols, chunk_rows);
    colsum_finish_kernel<<<(cols + CUDA_THREADS - 1) / CUDA_THREADS, CUDA_THREADS, 0, cuda_ctx.stream>>>(
        dst, (const float *)part, chunks, cols);
    return cuda_check_launch(op);
}

/* ---- device selection and context ---- */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_rc;
static char init_msg[512];
static int ctx_ready; /* set once the context is complete (see fsdp_cuda_compute_stream) */

/* Several ranks share a node: LOCAL_RANK (torchrun's variable, set by fsdp-launch) picks the GPU, so
 * each rank gets its own card without the caller having to call cudaSetDevice first. A LOCAL_RANK past the
 * last GPU is a launch with more ranks than GPUs: -1 (no modulo, which would put two ranks on one GPU). */
static int pick_device(int count, long *asked)
{
    const char *lr = getenv("LOCAL_RANK");
    *asked = -1;
    if (lr && *lr) {
        char *end;
        long v = strtol(lr, &end, 10);
        if (*end == '\0' && v >= 0) {
            *asked = v;
            return v < count ? (int)v : -1;
        }
    }
    int cur = 0;
    return cudaGetDevice(&cur) == cudaSuccess ? cur : 0;
}

static void init_context(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    /* Without a driver this fails (error 35) and may leave count untouched: any error means no GPU. */
    if (e != cudaSuccess || count <= 0) {
        init_rc = FSDP_EUNSUPPORTED;
        snprintf(init_msg, sizeof init_msg,
                 "kernels cuda: no CUDA device: cudaGetDeviceCount %s (%s, error %d); use device=cpu, or "
                 "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES",
                 e != cudaSuccess ? "failed" : "found 0 devices",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no error", (int)e);
        (void)cudaGetLastError(); /* not sticky: clear it so later CUDA users (NCCL) start clean */
        return;
    }
    struct cuda_ctx *c = &cuda_ctx;
    long asked = -1;
    c->device = pick_device(count, &asked);
    if (c->device < 0) {
        init_rc = FSDP_EINVAL;
        snprintf(init_msg, sizeof init_msg,
                 "kernels cuda: LOCAL_RANK=%ld but %d CUDA device%s visible: one rank per GPU (start at most %d "
                 "ranks per node, or check CUDA_VISIBLE_DEVICES)", asked, count, count == 1 ? " is" : "s are",
                 count);
        return;
    }
    const char *step = "cudaSetDevice";
    e = cudaSetDevice(c->device);
    if (e == cudaSuccess) {
        step = "cudaDeviceGetAttribute";
        e = cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, c->device);
    }
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&c->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device);
    if (e == cudaSuccess) {
        step = "cudaStreamCreate";
        e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    }
    if (e == cudaSuccess) {
        /* The pool keeps what it got (no release at synchronisations): mem_alloc and the scratch reuse it
         * without asking the driver again. */
        step = "cudaDeviceGetDefaultMemPool";
        e = cudaDeviceGetDefaultMemPool(&c->pool, c->device);
        uint64_t keep = UINT64_MAX;
        if (e == cudaSuccess)
            e = cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    if (e == cudaSuccess) {
        step = "cudaMalloc";
        e = cudaMalloc((void **)&c->checks, CUDA_CHECK_SLOTS * sizeof(uint64_t));
        /* On the ops' stream, as every later write of the slots: cudaMemset would go to the legacy default
         * stream, which a non-blocking stream does not wait for, so the first range check could race it. */
        if (e == cudaSuccess)
            e = cudaMemsetAsync(c->checks, 0xff, CUDA_CHECK_SLOTS * sizeof(uint64_t), c->stream);
    }
    if (e == cudaSuccess) {
        step = "cudaMallocHost";
        e = cudaMallocHost((void **)&c->checks_host, CUDA_CHECK_SLOTS * sizeof(uint64_t));
        if (e == cudaSuccess)
            e = cudaMallocHost((void **)&c->stage, CUDA_STAGE_CHUNKS * CUDA_STAGE_BYTES);
        if (e == cudaSuccess)
            e = cudaMallocHost((void **)&c->scalar_host, CUDA_SCALARS * sizeof(double));
    }
    for (int i = 0; e == cudaSuccess && i < CUDA_STAGE_CHUNKS; i++) {
        step = "cudaEventCreate";
        e = cudaEventCreateWithFlags(&c->stage_done[i], cudaEventDisableTiming);
    }
    if (e != cudaSuccess) {
        init_rc = FSDP_EIO;
        snprintf(init_msg, sizeof init_msg, "kernels cuda: no CUDA device usable: %s on device %d: %s (%s)", step,
                 c->device, cudaGetErrorString(e), cudaGetErrorName(e));
        return;
    }
    cublasStatus_t s = cublasCreate(&c->blas);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasSetStream(c->blas, c->stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        init_rc = FSDP_EIO;
        snprintf(init_msg, sizeof init_msg, "kernels cuda: cuBLAS initialisation failed on device %d: %s",
                 c->device, cublasGetStatusString(s));
        return;
    }
    /* Exact fp32 by default so results match the CPU backend; TF32 tensor cores (10-bit mantissa
     * products, fp32 accumulation) roughly 8x the matmul rate on H100 and are opt-in. */
    c->gemm_compute = settings_bool(SETTING_CUDA_TF32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    c->gemm_f32 = c->gemm_compute;
    c->matmul_dtype = DTYPE_F32;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, c->device) == cudaSuccess)
        log_info("kernels cuda: device %d of %d: %s (sm_%d%d, %d SMs, %.1f GiB), matmul %s", c->device, count,
                 prop.name, prop.major, prop.minor, c->sm_count, (double)prop.totalGlobalMem / (1 << 30),
                 c->gemm_compute == CUBLAS_COMPUTE_32F ? "fp32" : "tf32");
    init_rc = 0;
    __atomic_store_n(&ctx_ready, 1, __ATOMIC_RELEASE);
}

/* The NCCL backend (comm/comm_nccl.c, in the same module) orders each collective after the work already
 * queued here: the engine fills a send buffer with a kernel (cast, copies) and issues the collective right
 * away, without synchronising, so NCCL's own stream must wait for this one. Read from the communicator's
 * progress thread, hence the atomic flag rather than the pthread_once the table's users go through. */
extern "C" int fsdp_cuda_compute_stream(cudaStream_t *stream, int *device)
{
    if (!__atomic_load_n(&ctx_ready, __ATOMIC_ACQUIRE))
        return -1;
    *stream = cuda_ctx.stream;
    *device = cuda_ctx.device;
    return 0;
}

int cuda_context_init(void)
{
    pthread_once(&init_once, init_context);
    if (init_rc)
        return error_set(init_rc, "%s", init_msg);
    /* The context is per process but the current device is per thread: a new thread must not queue
     * work on device 0 by accident. */
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != cuda_ctx.device)
        cudaSetDevice(cuda_ctx.device);
    return 0;
}
