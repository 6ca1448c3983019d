/* Causal attention on tensor cores in bf16 mode: the products as strided-batched bf16 GEMMs (cuBLAS, fp32
 * accumulation), the causal softmax and its gradient as row kernels between them. The flash kernels of
 * attention.cu run on CUDA cores in fp32 arithmetic, bound by shared memory; here the 4 t x t x hs products of
 * backward and the 2 of forward run at tensor-core rates. The price is a t x t score matrix per head in
 * scratch (per sequence: the batch is walked one sequence at a time) and the full products, the masked half
 * included (llm.c's non-cuDNN path makes the same trade).
 *
 * The numbers are the bf16 mode's of attention.cu and the CPU (kernels.h): q, k, v and dO rounded to bf16
 * (one cast into scratch), scores accumulated in fp32, softmax statistics in fp32, P and dS rounded once
 * more only as GEMM operands (P V, P^T dO, dS K, dS^T Q). Here P is normalised before it is rounded (the
 * flash kernels round the unnormalised exponentials and divide at the end): the same bound, 2^-8 of each
 * term. Backward recomputes the scores from q, k and the saved lse instead of storing P.
 *
 * Layout: qkv rows are [q (nh heads) | k (nkv heads) | v (nkv heads)], width W = c + 2 nkv hs; query head h
 * reads key/value head h / g, g = nh / nkv. The GEMMs of one sequence are batched over the key/value heads
 * for each j < g (query head kvh g + j): every operand's head stride is then constant.
 *
 * A sliding window (kernels.h: key j visible to query i when i - window < j <= i) is a mask of the row
 * kernels: the GEMMs still compute every score (this path trades the masked work for tensor-core rates; the
 * flash kernels of attention.cu skip the tiles outside the window). */
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

#define ATTG_ALIGN 256

bool cuda_attention_gemm_applies(int c, int nh)
{
    /* tensor cores want 16-byte rows of bf16: a head size that is a multiple of 8 keeps every operand so */
    return cuda_ctx.matmul_dtype == DTYPE_BF16 && nh > 0 && (c / nh) % 8 == 0;
}

/* Row-major C(m, n) = alpha op(A) op(B) + beta C for `batch` matrices at fixed strides: A and B bf16, C fp32,
 * fp32 accumulation (the operand swap of matmul.cu's gemm_rm). */
static int attg_gemm(const char *op, int ta, int tb, int m, int n, int k, float alpha, const uint16_t *a, int lda,
                     long long sa, const uint16_t *b, int ldb, long long sb, float beta, void *c, int ldc,
                     long long sc, int batch, cudaDataType_t ctype = CUDA_R_32F)
{
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    return cuda_check_blas(op, cublasGemmStridedBatchedEx(cuda_ctx.blas, opb, opa, n, m, k, &alpha, b, CUDA_R_16BF,
                                                          ldb, sb, a, CUDA_R_16BF, lda, sa, &beta, c, ctype, ldc,
                                                          sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* The first key query i sees: 0, or the start of its window. */
__device__ __forceinline__ int attg_first_key(int i, int window)
{
    return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
}

/* One warp per score row (row r = head h * t + query i of one sequence): P = exp(s - lse) for keys
 * lo <= j <= i (lo: the window's first), rounded to bf16, 0 elsewhere. With write_lse the row's lse (max + log
 * of the sum of the unrounded exponentials) is computed and stored first; without it the forward's is read. */
__global__ void attg_probs_kernel(uint16_t *p16, float *lse, const float *s, int t, int ld, int rows, int write_lse,
                                  int window)
{
    const int row = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    const int i = row % t, lo = attg_first_key(i, window);
    const float *sr = s + (size_t)row * ld;
    float L;
    if (write_lse) {
        float m = -INFINITY;
        for (int j = lo + lane; j <= i; j += 32)
            m = fmaxf(m, sr[j]);
        m = cuda_warp_max(m);
        float l = 0.0f;
        for (int j = lo + lane; j <= i; j += 32)
            l += __expf(sr[j] - m);
        l = cuda_warp_sum(l);
        L = m + logf(l);
        if (lane == 0)
            lse[row] = L;
    } else {
        L = lse[row];
    }
    uint16_t *pr = p16 + (size_t)row * ld;
    for (int j = lane; j < t; j += 32)
        pr[j] = j <= i && j >= lo ? dtype_f32_to_bf16(__expf(sr[j] - L)) : (uint16_t)0;
}

/* dS = scale P (dP - D) for keys lo <= j <= i (P recomputed from the scores and lse, unrounded), rounded to
 * bf16 as the operand of dS K and dS^T Q; 0 elsewhere. D = rowsum(dO O) (attention.cu's rowdot). */
__global__ void attg_dscores_kernel(uint16_t *ds16, const float *s, const float *dp, const float *lse,
                                    const float *dsum, int t, int ld, int rows, float scale, int window)
{
    const int row = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    const int i = row % t, lo = attg_first_key(i, window);
    const float L = lse[row], D = dsum[row];
    const size_t off = (size_t)row * ld;
    for (int j = lane; j < t; j += 32)
        ds16[off + j] = j <= i && j >= lo ? dtype_f32_to_bf16(scale * __expf(s[off + j] - L) * (dp[off + j] - D)) : (uint16_t)0;
}

static size_t attg_round_up(size_t n)
{
    return (n + ATTG_ALIGN - 1) / ATTG_ALIGN * ATTG_ALIGN;
}

/* A score row's leading dimension: t rounded up to 8 elements, so every bf16 row starts 16-byte aligned. */
static int attg_ld(int t)
{
    return (t + 7) & ~7;
}

/* The scratch of one call: the bf16 copies, then one sequence's scores (fp32), P or dS (bf16) and, for
 * backward, dP (fp32). */
struct attg_scratch {
    uint16_t *qkv16, *dout16, *p16;
    float *s, *dp;
};

/* qkv: the caller's; read as it is where it is a bf16 activation (act.cu), else rounded into the scratch. */
static int attg_scratch_get(const char *op, const float *qkv, int b, int t, int c, int nh, int nkv, bool backward,
                            struct attg_scratch *w)
{
    bool qkv_lp;
    FSDP_TRY(cuda_act_lowp(op, qkv, &qkv_lp));
    const size_t W = (size_t)c + 2 * (size_t)nkv * (c / nh), tt = (size_t)nh * t * attg_ld(t), rows = (size_t)b * t;
    size_t sizes[5] = {qkv_lp ? 0 : attg_round_up(rows * W * 2), backward ? attg_round_up(rows * c * 2) : 0,
                       attg_round_up(tt * 2), attg_round_up(tt * 4), backward ? attg_round_up(tt * 4) : 0};
    void *base;
    FSDP_TRY(cuda_scratch(op, &base, sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4]));
    char *at = (char *)base;
    w->qkv16 = qkv_lp ? (uint16_t *)qkv : (uint16_t *)at, at += sizes[0];
    if (!qkv_lp)
        FSDP_TRY(cuda_cast(w->qkv16, DTYPE_BF16, qkv, DTYPE_F32, rows * W));
    w->dout16 = backward ? (uint16_t *)at : NULL, at += sizes[1];
    w->p16 = (uint16_t *)at, at += sizes[2];
    w->s = (float *)at, at += sizes[3];
    w->dp = backward ? (float *)at : NULL;
    return 0;
}

/* The scores of sequence bi, every head: S_h = scale Q_h K_kvh^T (t x t, fp32). */
static int attg_scores(const char *op, const struct attg_scratch *w, int bi, int t, int c, int nh, int nkv,
                       float scale)
{
    const int hs = c / nh, g = nh / nkv, W = c + 2 * nkv * hs;
    const uint16_t *base = w->qkv16 + (size_t)bi * t * W;
    const int ld = attg_ld(t);
    const long long tt = (long long)t * ld;
    for (int j = 0; j < g; j++)
        FSDP_TRY(attg_gemm(op, 0, 1, t, t, hs, scale, base + (size_t)j * hs, W, (long long)g * hs, base + c, W, hs,
                           0.0f, w->s + j * tt, ld, g * tt, nkv));
    return 0;
}

static unsigned attg_warp_blocks(size_t rows)
{
    return (unsigned)((rows * 32 + CUDA_THREADS - 1) / CUDA_THREADS);
}

int cuda_attention_gemm_forward(float *out, float *lse, const float *qkv, int b, int t, int c, int nh, int nkv,
                                int window)
{
    const char *op = "attention_forward";
    const int hs = c / nh, g = nh / nkv, W = c + 2 * nkv * hs, ld = attg_ld(t);
    const long long tt = (long long)t * ld;
    struct attg_scratch w;
    bool out_lp; /* out in bf16 activation storage: the P V products write bf16 */
    FSDP_TRY(cuda_act_lowp(op, out, &out_lp));
    FSDP_TRY(attg_scratch_get(op, qkv, b, t, c, nh, nkv, false, &w));
    const float scale = 1.0f / sqrtf((float)hs);
    const int rows = nh * t;
    for (int bi = 0; bi < b; bi++) {
        FSDP_TRY(attg_scores(op, &w, bi, t, c, nh, nkv, scale));
        attg_probs_kernel<<<attg_warp_blocks(rows), CUDA_THREADS, 0, cuda_ctx.stream>>>(
            w.p16, lse + (size_t)bi * rows, w.s, t, ld, rows, 1, window);
        FSDP_TRY(cuda_check_launch(op));
        const uint16_t *v = w.qkv16 + (size_t)bi * t * W + c + (size_t)nkv * hs;
        for (int j = 0; j < g; j++) { /* O_h = P_h V_kvh into out's columns of head h */
            size_t o = (size_t)bi * t * c + (size_t)j * hs;
            void *oh = out_lp ? (void *)((uint16_t *)out + o) : (void *)(out + o);
            FSDP_TRY(attg_gemm(op, 0, 0, t, hs, t, 1.0f, w.p16 + j * tt, ld, g * tt, v, W, hs, 0.0f, oh, c,
                               (long long)g * hs, nkv, out_lp ? CUDA_R_16BF : CUDA_R_32F));
        }
    }
    return 0;
}

int cuda_attention_gemm_backward(float *dqkv, const float *dout, const float *qkv, const float *lse,
                                 const float *dsum, int b, int t, int c, int nh, int nkv, int window)
{
    const char *op = "attention_backward";
    const int hs = c / nh, g = nh / nkv, W = c + 2 * nkv * hs, ld = attg_ld(t);
    const long long tt = (long long)t * ld, gq = (long long)g * hs;
    struct attg_scratch w;
    FSDP_TRY(attg_scratch_get(op, qkv, b, t, c, nh, nkv, true, &w));
    FSDP_TRY(cuda_cast(w.dout16, DTYPE_BF16, dout, DTYPE_F32, (size_t)b * t * c));
    const float scale = 1.0f / sqrtf((float)hs);
    const int rows = nh * t;
    for (int bi = 0; bi < b; bi++) {
        const uint16_t *q = w.qkv16 + (size_t)bi * t * W, *k = q + c, *v = k + (size_t)nkv * hs;
        const uint16_t *d_o = w.dout16 + (size_t)bi * t * c;
        float *dq = dqkv + (size_t)bi * t * W, *dk = dq + c, *dv = dk + (size_t)nkv * hs;
        const float *lse_b = lse + (size_t)bi * rows, *dsum_b = dsum + (size_t)bi * rows;
        FSDP_TRY(attg_scores(op, &w, bi, t, c, nh, nkv, scale));
        attg_probs_kernel<<<attg_warp_blocks(rows), CUDA_THREADS, 0, cuda_ctx.stream>>>(w.p16, (float *)lse_b, w.s,
                                                                                       t, ld, rows, 0, window);
        FSDP_TRY(cuda_check_launch(op));
        for (int j = 0; j < g; j++) {
            /* dV_kvh += P_h^T dO_h (summed over the group's heads, one j per call) */
            FSDP_TRY(attg_gemm(op, 1, 0, t, hs, t, 1.0f, w.p16 + j * tt, ld, g * tt, d_o + (size_t)j * hs, c, gq, 1.0f,
                               dv, W, hs, nkv));
            /* dP_h = dO_h V_kvh^T */
            FSDP_TRY(attg_gemm(op, 0, 1, t, t, hs, 1.0f, d_o + (size_t)j * hs, c, gq, v, W, hs, 0.0f, w.dp + j * tt,
                               ld, g * tt, nkv));
        }
        attg_dscores_kernel<<<attg_warp_blocks(rows), CUDA_THREADS, 0, cuda_ctx.stream>>>(w.p16, w.s, w.dp, lse_b,
                                                                                         dsum_b, t, ld, rows, scale,
                                                                                         window);
        FSDP_TRY(cuda_check_launch(op));
        for (int j = 0; j < g; j++) {
            /* dQ_h += dS_h K_kvh; dK_kvh += dS_h^T Q_h */
            FSDP_TRY(attg_gemm(op, 0, 0, t, hs, t, 1.0f, w.p16 + j * tt, ld, g * tt, k, W, hs, 1.0f,
                               dq + (size_t)j * hs, W, gq, nkv));
            FSDP_TRY(attg_gemm(op, 1, 0, t, hs, t, 1.0f, w.p16 + j * tt, ld, g * tt, q + (size_t)j * hs, W, gq, 1.0f,
                               dk, W, hs, nkv));
        }
    }
    return 0;
}
