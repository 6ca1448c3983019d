/* Linear layers on OpenBLAS sgemm, weights in the HF Conv1D layout W(in, out). */
#include <cblas.h>
#include <omp.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"

/* Columns per task when summing dy over rows for db: one cache line of floats times a few, so threads
 * never share a line of db and each streams its own column strip. */
#define DB_STRIP 64

static int check_dims(const char *op, int n, int in, int out)
{
    if (n < 0 || in <= 0 || out <= 0)
        return error_set(FSDP_EINVAL, "kernels cpu: %s: bad shape n=%d in=%d out=%d", op, n, in, out);
    return 0;
}

int cpu_set_matmul_dtype(enum dtype dtype)
{
    if (dtype != DTYPE_F32 && dtype != DTYPE_BF16 && dtype != DTYPE_F16)
        return error_set(FSDP_EINVAL, "kernels cpu: set_matmul_dtype: unknown dtype %d", (int)dtype);
    return 0; /* always fp32 here: see kernels.h */
}

int cpu_matmul_forward(float *y, const float *x, const float *w, const float *b, int n, int in, int out)
{
    FSDP_TRY(check_dims("matmul_forward", n, in, out));
    if (n == 0)
        return 0;
    float beta = 0.0f;
    if (b) {
        /* Seed y with the bias and let sgemm accumulate: one pass over y instead of two. */
#pragma omp parallel for schedule(static) if ((long)n * out > CPU_CHUNK)
        for (int i = 0; i < n; i++) {
            float *row = y + (size_t)i * out;
            for (int j = 0; j < out; j++)
                row[j] = b[j];
        }
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, out, in, 1.0f, x, in, w, out, beta, y, out);
    return 0;
}

CPU_SIMD_CLONES
static void colsum_strip(float *db, const float *dy, int n, int out, int j0, int j1)
{
    float acc[DB_STRIP] = {0};
    int m = j1 - j0;
    for (int i = 0; i < n; i++) {
        const float *row = dy + (size_t)i * out + j0;
#pragma omp simd
        for (int j = 0; j < m; j++)
            acc[j] += row[j];
    }
    for (int j = 0; j < m; j++)
        db[j0 + j] += acc[j];
}

/* One thread: db summed row after row into an L1-resident accumulator, reading dy once front to back
 * instead of in column strips whose rows lie out*4 bytes apart. Each column still adds rows 0..n-1 in
 * order from zero, so db has the same bits as the strip path. */
#define DB_ROWS_MAX 8192

CPU_SIMD_CLONES
static void colsum_rows(float *db, const float *dy, int n, int out)
{
    float acc[DB_ROWS_MAX];
    for (int j = 0; j < out; j++)
        acc[j] = 0.0f;
    for (int i = 0; i < n; i++) {
        const float *row = dy + (size_t)i * out;
#pragma omp simd
        for (int j = 0; j < out; j++)
            acc[j] += row[j];
    }
    for (int j = 0; j < out; j++)
        db[j] += acc[j];
}

int cpu_matmul_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                        int n, int in, int out)
{
    FSDP_TRY(check_dims("matmul_backward", n, in, out));
    if (n == 0)
        return 0;
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, in, out, 1.0f, dy, out, w, out, 1.0f, dx,
                    in);
    if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, n, 1.0f, x, in, dy, out, 1.0f, dw,
                    out);
    if (db && out <= DB_ROWS_MAX && ((long)n * out <= CPU_CHUNK || omp_get_max_threads() == 1)) {
        colsum_rows(db, dy, n, out);
    } else if (db) {
        int strips = (out + DB_STRIP - 1) / DB_STRIP;
#pragma omp parallel for schedule(static) if ((long)n * out > CPU_CHUNK)
        for (int s = 0; s < strips; s++) {
            int j0 = s * DB_STRIP;
            int j1 = j0 + DB_STRIP < out ? j0 + DB_STRIP : out;
            colsum_strip(db, dy, n, out, j0, j1);
        }
    }
    return 0;
}

int cpu_gemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
             const float *b, int ldb, float beta, float *c, int ldc)
{
    int a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) ||
        ldc < (n > 1 ? n : 1))
        return error_set(FSDP_EINVAL, "kernels cpu: gemm: bad shape m=%d n=%d k=%d lda=%d ldb=%d ldc=%d", m,
                         n, k, lda, ldb, ldc);
    if (m == 0 || n == 0)
        return 0;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m,
                n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return 0;
}
