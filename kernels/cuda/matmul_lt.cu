/* Row-major matmuls through cuBLASLt, for what plain cuBLAS cannot fuse: an epilogue (the bias added as the
 * product is written, instead of a fill kernel and a GEMM that reads the filled matrix back with beta = 1;
 * the GELU applied as it is written, keeping its input for backward; in backward the GELU's derivative applied
 * to dy W^T as it is written).
 * The same operand swap as matmul.cu's gemm_rm: a row-major C = op(A) op(B) is the column-major
 * C^T = op(B)^T op(A)^T, so D has n rows (the bias runs along them) and m columns.
 *
 * cuBLASLt's heuristic costs host time on every call (tens of microseconds), so its answer is kept per shape,
 * operand types, compute type and epilogue (llm.c and PyTorch keep one too); a step's shapes repeat. The
 * workspace is one device buffer of LT_WORKSPACE bytes made at first use, from the stream-ordered pool. */
#include <cublasLt.h>
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

/* 32 MiB: what cuBLASLt's Hopper kernels can use (llm.c gives it the same). */
#define LT_WORKSPACE ((size_t)32 << 20)
/* Shapes remembered; past that the oldest are replaced (a model has a few dozen). */
#define LT_CACHE 128

struct lt_key {
    int ta, tb, m, n, k, lda, ldb, ldc;
    int ab_type, compute, epilogue, d_type;
};

struct lt_entry {
    struct lt_key key;
    cublasLtMatmulAlgo_t algo;
};

static struct {
    cublasLtHandle_t handle;
    void *workspace;
    struct lt_entry cache[LT_CACHE];
    int n, next;
} lt;

static int lt_status(const char *op, const char *what, cublasStatus_t s)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    return error_set(FSDP_EIO, "kernels cuda: %s: cuBLASLt %s failed: %s", op, what, cublasLtGetStatusString(s));
}

static int lt_init(const char *op)
{
    if (lt.handle)
        return 0;
    FSDP_TRY(lt_status(op, "cublasLtCreate", cublasLtCreate(&lt.handle)));
    lt.workspace = cuda_mem_alloc(LT_WORKSPACE);
    if (!lt.workspace) {
        cublasLtDestroy(lt.handle);
        lt.handle = NULL;
        return error_set(FSDP_ENOMEM, "kernels cuda: %s: no device memory for cuBLASLt's %zu-byte workspace", op,
                         LT_WORKSPACE);
    }
    return 0;
}

/* The layout of a row-major matrix as stored (rows x cols, leading dimension ld): column-major cols x rows. */
static cublasStatus_t lt_layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int rows, int cols, int ld)
{
    return cublasLtMatrixLayoutCreate(l, t, (uint64_t)cols, (uint64_t)rows, ld);
}

static const cublasLtMatmulAlgo_t *lt_cached(const struct lt_key *k)
{
    for (int i = 0; i < lt.n; i++)
        if (memcmp(&lt.cache[i].key, k, sizeof *k) == 0)
            return &lt.cache[i].algo;
    return NULL;
}

static void lt_remember(const struct lt_key *k, const cublasLtMatmulAlgo_t *algo)
{
    int i = lt.n < LT_CACHE ? lt.n++ : lt.next;
    lt.next = (i + 1) % LT_CACHE;
    lt.cache[i].key = *k;
    lt.cache[i].algo = *algo;
}

int cuda_lt_matmul(const char *op, int ta, int tb, int m, int n, int k, const float *a, int lda, const float *b,
                   int ldb, float beta, float *c, int ldc, const float *bias, float *gelu_pre, const float *dgelu_pre)
{
    if (m == 0 || n == 0)
        return 0;
    bool c_lp; /* D a bf16 activation: the bias epilogue writes it rounded (the GELU ones keep fp32 here) */
    FSDP_TRY(cuda_act_lowp(op, c, &c_lp));
    if (c_lp && (gelu_pre || dgelu_pre || beta != 0.0f))
        return error_set(FSDP_EINVAL, "kernels cuda: %s: only a product plus bias is written to a bf16 activation", op);
    cudaDataType_t d_type = c_lp ? CUDA_R_16BF : CUDA_R_32F;
    FSDP_TRY(lt_init(op));
    struct cuda_gemm_operands g;
    FSDP_TRY(cuda_gemm_operands(op, ta, tb, m, n, k, a, lda, b, ldb, &g));
    cublasLtEpilogue_t epi = dgelu_pre ? CUBLASLT_EPILOGUE_DGELU
                             : gelu_pre ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                             : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    /* the aux matrix: the GELU's input, written by the forward epilogue or read by DGELU */
    const void *aux = dgelu_pre ? (const void *)dgelu_pre : (const void *)gelu_pre;
    /* ints only, no padding: compared as bytes */
    struct lt_key key = {ta, tb, m, n, k, lda, ldb, ldc, (int)g.type, (int)g.compute, (int)epi, (int)d_type};
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    int rc = lt_status(op, "cublasLtMatmulDescCreate", cublasLtMatmulDescCreate(&desc, g.compute, CUDA_R_32F));
    if (rc == 0)
        rc = lt_status(op, "the transposes",
                       cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    if (rc == 0)
        rc = lt_status(op, "the transposes",
                       cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (rc == 0)
        rc = lt_status(op, "the epilogue",
                       cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (rc == 0 && bias)
        rc = lt_status(op, "the bias pointer",
                       cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    /* an fp32 bias under a bf16 D (cuBLASLt's default is D's type) */
    cudaDataType_t bias_type = CUDA_R_32F;
    if (rc == 0 && bias && c_lp)
        rc = lt_status(op, "the bias type",
                       cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                      sizeof bias_type));
    /* the GELU's input (after the bias), laid out as D (n rows of ldc in cuBLASLt's terms) */
    int64_t aux_ld = ldc;
    if (rc == 0 && aux)
        rc = lt_status(op, "the GELU input pointer",
                       cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                      sizeof aux));
    if (rc == 0 && aux)
        rc = lt_status(op, "the GELU input's leading dimension",
                       cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                      sizeof aux_ld));
    /* the swap: cuBLASLt's A is our b (row-major k x n, or n x k transposed), its B our a, D is n x m */
    if (rc == 0)
        rc = lt_status(op, "a layout", lt_layout(&la, g.type, tb ? n : k, tb ? k : n, ldb));
    if (rc == 0)
        rc = lt_status(op, "a layout", lt_layout(&lb, g.type, ta ? k : m, ta ? m : k, lda));
    if (rc == 0)
        rc = lt_status(op, "a layout", lt_layout(&lc, d_type, m, n, ldc));
    const cublasLtMatmulAlgo_t *algo = rc == 0 ? lt_cached(&key) : NULL;
    cublasLtMatmulHeuristicResult_t heur;
    if (rc == 0 && !algo) {
        size_t ws = LT_WORKSPACE;
        int found = 0;
        rc = lt_status(op, "cublasLtMatmulPreferenceCreate", cublasLtMatmulPreferenceCreate(&pref));
        if (rc == 0)
            rc = lt_status(op, "the workspace preference",
                           cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                                sizeof ws));
        if (rc == 0)
            rc = lt_status(op, "cublasLtMatmulAlgoGetHeuristic",
                           cublasLtMatmulAlgoGetHeuristic(lt.handle, desc, la, lb, lc, lc, pref, 1, &heur, &found));
        if (rc == 0 && found < 1)
            rc = error_set(FSDP_EIO, "kernels cuda: %s: cuBLASLt has no algorithm for %d x %d x %d (transposes %d %d)",
                           op, m, n, k, ta, tb);
        if (rc == 0) {
            lt_remember(&key, &heur.algo);
            algo = &heur.algo;
        }
    }
    float alpha = 1.0f;
    if (rc == 0)
        rc = lt_status(op, "cublasLtMatmul",
                       cublasLtMatmul(lt.handle, desc, &alpha, g.b, la, g.a, lb, &beta, c, lc, c, lc, algo,
                                      lt.workspace, LT_WORKSPACE, cuda_ctx.stream));
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (lc)
        cublasLtMatrixLayoutDestroy(lc);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (desc)
        cublasLtMatmulDescDestroy(desc);
    return rc;
}
