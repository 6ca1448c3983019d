/* Linear layers and GEMMs: fp32 on OpenBLAS sgemm or oneDNN (per shape, see cpu_matmul_f32_onednn), bf16 on oneDNN's
 * bf16 matmul where the CPU has bf16 instructions (products of bf16 operands accumulated in fp32); weights
 * in the HF Conv1D layout W(in, out). */
#include <cblas.h>
#include <omp.h>
#include <pthread.h>

#include "common/error.h"
#include "common/log.h"
#include "common/settings.h"
#include "kernels/cpu/cpu.h"

/* Columns per task when summing dy over rows for db: one cache line of floats times a few, so threads
 * never share a line of db and each streams its own column strip. */
#define DB_STRIP 64

/* auto picks oneDNN's fp32 matmul for problems of at least this many multiply-adds (m n k) on an AVX-512
 * CPU. Below it both libraries spend most of a call outside the product, and OpenBLAS's small-matrix path
 * is the shorter one: 24^3 and 16 x 32 x 32 ran at 0.68-0.94x of OpenBLAS on oneDNN, 32^3 at 1.14x, every
 * model shape above at 1.25-4x (bench_kernels, bench=gemm_shape lines, AMD EPYC Zen 5, one thread). */
#define F32_ONEDNN_MIN_MNK (1L << 15)

enum f32_lib { F32_AUTO, F32_OPENBLAS, F32_ONEDNN }; /* FSDP_CPU_MATMUL's values, in table order */

static struct {
    pthread_once_t once;
    enum f32_lib f32;
    enum dtype requested; /* set_matmul_dtype's */
    bool warned;
} mm = {.once = PTHREAD_ONCE_INIT, .requested = DTYPE_F32};

static void mm_init(void)
{
    mm.f32 = (enum f32_lib)settings_enum(SETTING_CPU_MATMUL);
}

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
    const struct cpu_isa *isa = cpu_isa_get();
    if (dtype != DTYPE_F32 && !(dtype == DTYPE_BF16 && isa->bf16) && !mm.warned) {
        mm.warned = true;
        if (dtype == DTYPE_BF16)
            log_info("kernels cpu: %s no bf16 matmul instructions (AVX512_BF16 or AMX; oneDNN runs %s here): "
                     "bf16 matmuls compute in fp32 on bf16-rounded parameters",
                     isa->capped ? "FSDP_TEST_CPU_NO_BF16 set: acting as a CPU with" : "this CPU has", isa->name);
        else
            log_info("kernels cpu: no fp16 matmul on CPUs (oneDNN 2.6 has no fp16 kernels): fp16 matmuls compute "
                     "in fp32 on fp16-rounded parameters");
    }
    mm.requested = dtype;
    return 0;
}

enum dtype cpu_matmul_compute_dtype(void)
{
    return mm.requested == DTYPE_BF16 && cpu_isa_get()->bf16 ? DTYPE_BF16 : DTYPE_F32;
}

bool cpu_matmul_f32_onednn(int m, int n, int k)
{
    pthread_once(&mm.once, mm_init);
    if (mm.f32 == F32_OPENBLAS || k == 0)
        return false;
    const struct cpu_isa *isa = cpu_isa_get();
    if (!isa->usable)
        return false;
    if (mm.f32 == F32_ONEDNN)
        return true;
    return isa->avx512 && (long)m * n * k >= F32_ONEDNN_MIN_MNK;
}

/* ---- held operands: rounded once, by the first product that reads them, bound until released ---- */

/* A few holds live at once (one operand of a layer's backward); their buffers are kept for the next holds,
 * so the steady state allocates nothing. A hold is rounded when a product first reads it, so that
 * matmul_backward, when it is that product, can sum db in the same pass. */
#define CPU_HOLDS 8

static struct {
    pthread_mutex_t lock;
    struct {
        const float *x; /* NULL: free slot */
        size_t n;
        bool rounded; /* buf holds x rounded and is bound to it */
        uint16_t *buf;
        size_t cap; /* elements */
    } h[CPU_HOLDS];
} holds = {.lock = PTHREAD_MUTEX_INITIALIZER};

int cpu_lowp_hold(const float *x, size_t n)
{
    if (!x || n == 0)
        return error_set(FSDP_EINVAL, "kernels cpu: lowp_hold: NULL buffer or empty range");
    if (cpu_matmul_compute_dtype() != DTYPE_BF16 || cpu_lowp_find(x, n))
        return 0;
    pthread_mutex_lock(&holds.lock);
    int slot = -1, rc = 0;
    for (int i = 0; i < CPU_HOLDS; i++)
        if (holds.h[i].x && x < holds.h[i].x + holds.h[i].n && holds.h[i].x < x + n)
            goto out; /* overlaps a hold: left as it is, like a bound range */
    for (int i = 0; i < CPU_HOLDS && slot < 0; i++)
        if (!holds.h[i].x && holds.h[i].cap >= n)
            slot = i;
    for (int i = 0; i < CPU_HOLDS && slot < 0; i++)
        if (!holds.h[i].x)
            slot = i;
    if (slot < 0) {
        rc = error_set(FSDP_ERANGE, "kernels cpu: lowp_hold: %d operands held already; release them first",
                       CPU_HOLDS);
        goto out;
    }
    if (holds.h[slot].cap < n) {
        uint16_t *b = cpu_mem_alloc(n * sizeof(uint16_t));
        if (!b) {
            rc = FSDP_ENOMEM;
            goto out;
        }
        cpu_mem_free(holds.h[slot].buf);
        holds.h[slot].buf = b;
        holds.h[slot].cap = n;
    }
    holds.h[slot].x = x;
    holds.h[slot].n = n;
    holds.h[slot].rounded = false;
out:
    pthread_mutex_unlock(&holds.lock);
    return rc;
}

int cpu_lowp_release(const float *x)
{
    pthread_mutex_lock(&holds.lock);
    int rc = 0;
    for (int i = 0; i < CPU_HOLDS; i++)
        if (holds.h[i].x == x) {
            holds.h[i].x = NULL;
            if (holds.h[i].rounded)
                rc = cpu_lowp_unbind(x);
            break;
        }
    pthread_mutex_unlock(&holds.lock);
    return rc;
}

/* The bf16 copy of [x, x + span) when a hold not yet rounded contains it: the hold is rounded now (with its
 * column sums added to acc, a cols-wide accumulator, when acc is given and x is the whole hold viewed as
 * rows of cols) and bound; NULL when no such hold exists. */
static const uint16_t *hold_materialize(const float *x, size_t span, float *acc, size_t cols)
{
    const uint16_t *lp = NULL;
    pthread_mutex_lock(&holds.lock);
    for (int i = 0; i < CPU_HOLDS; i++) {
        if (!holds.h[i].x || holds.h[i].rounded || x < holds.h[i].x || x + span > holds.h[i].x + holds.h[i].n)
            continue;
        if (acc && (x != holds.h[i].x || span != holds.h[i].n))
            break; /* column sums of part of a hold: the caller rounds its part itself */
        if (acc)
            cpu_round_bf16_colsum(holds.h[i].buf, acc, x, holds.h[i].n / cols, cols);
        else
            cpu_round_bf16(holds.h[i].buf, holds.h[i].x, 1, holds.h[i].n, holds.h[i].n);
        if (cpu_lowp_bind(holds.h[i].x, holds.h[i].buf, holds.h[i].n) == 0) {
            holds.h[i].rounded = true;
            lp = holds.h[i].buf + (x - holds.h[i].x);
        }
        break;
    }
    pthread_mutex_unlock(&holds.lock);
    return lp;
}

/* A bf16 operand stored as rows x cols with leading dimension ld: the bound bf16 copy when x lies in a
 * bound range (gathered parameters), else x rounded into the thread's scratch slot. */
struct opnd {
    const void *p;
    int ld;
};

static int bf16_operand(int slot, const float *x, int rows, int cols, int ld, struct opnd *o)
{
    size_t span = (size_t)(rows - 1) * (size_t)ld + (size_t)cols;
    const uint16_t *lp = cpu_lowp_find(x, span);
    if (!lp)
        lp = hold_materialize(x, span, NULL, 0);
    if (lp) {
        o->p = lp;
        o->ld = ld;
        return 0;
    }
    uint16_t *s = cpu_scratch(slot, (size_t)rows * (size_t)cols * sizeof(uint16_t));
    if (!s)
        return FSDP_ENOMEM;
    cpu_round_bf16(s, x, (size_t)rows, (size_t)cols, (size_t)ld);
    o->p = s;
    o->ld = cols;
    return 0;
}

/* c = alpha op(a) op(b) + beta c (+ bias) in fp32, on the library cpu_matmul_f32_onednn picks; m, n > 0. */
static int f32_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                    int ldb, float beta, float *c, int ldc, const float *bias)
{
    if (cpu_matmul_f32_onednn(m, n, k))
        return cpu_onednn_matmul(DTYPE_F32, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias);
    if (bias) {
        /* Seed c with the bias and let sgemm accumulate: one pass over c instead of two. */
#pragma omp parallel for schedule(static) if ((long)m * n > CPU_CHUNK)
        for (int i = 0; i < m; i++) {
            float *row = c + (size_t)i * ldc;
            for (int j = 0; j < n; j++)
                row[j] = beta != 0.0f ? beta * row[j] + bias[j] : bias[j];
        }
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                lda, b, ldb, beta, c, ldc);
    return 0;
}

/* The same product in the compute dtype: bf16 operands (bound or rounded into scratch slots sa and sb),
 * fp32 accumulation and output; fp32 otherwise. a16/b16, when given, are operands prepared already. */
static int gemm_any(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const struct opnd *a16,
                    int sa, const float *b, int ldb, const struct opnd *b16, int sb, float beta, float *c, int ldc,
                    const float *bias)
{
    if (m == 0 || n == 0)
        return 0;
    if (cpu_matmul_compute_dtype() != DTYPE_BF16 || k == 0)
        return f32_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias);
    struct opnd A, B;
    if (a16)
        A = *a16;
    else
        FSDP_TRY(bf16_operand(sa, a, ta ? k : m, ta ? m : k, lda, &A));
    if (b16)
        B = *b16;
    else
        FSDP_TRY(bf16_operand(sb, b, tb ? n : k, tb ? k : n, ldb, &B));
    return cpu_onednn_matmul(DTYPE_BF16, ta, tb, m, n, k, alpha, A.p, A.ld, B.p, B.ld, beta, c, ldc, bias);
}

int cpu_matmul_forward(float *y, const float *x, const float *w, const float *b, int n, int in, int out)
{
    FSDP_TRY(check_dims("matmul_forward", n, in, out));
    if (n == 0)
        return 0;
    return gemm_any(0, 0, n, out, in, 1.0f, x, in, NULL, 0, w, out, NULL, 1, 0.0f, y, out, b);
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
    /* dy is an operand of both products: in bf16 it is rounded once for the two; where db is summed on one
     * thread row after row, the rounding pass sums it too (the same order: the bits of colsum_rows) */
    struct opnd dy16, *pdy = NULL;
    bool db_rows = db && out <= DB_ROWS_MAX && ((long)n * out <= CPU_CHUNK || omp_get_max_threads() == 1);
    if ((dx || dw) && cpu_matmul_compute_dtype() == DTYPE_BF16) {
        const uint16_t *held = NULL;
        float acc[DB_ROWS_MAX];
        if (db_rows && !cpu_lowp_find(dy, (size_t)n * out)) {
            for (int j = 0; j < out; j++)
                acc[j] = 0.0f;
            /* a held dy is rounded into its hold (for the products after this one), else into scratch */
            held = hold_materialize(dy, (size_t)n * out, acc, (size_t)out);
            uint16_t *s = held ? NULL : cpu_scratch(2, (size_t)n * out * sizeof(uint16_t));
            if (!held && !s)
                return FSDP_ENOMEM;
            if (!held)
                cpu_round_bf16_colsum(s, acc, dy, (size_t)n, (size_t)out);
            for (int j = 0; j < out; j++)
                db[j] += acc[j];
            db = NULL;
            dy16 = (struct opnd){held ? (const void *)held : s, out};
        } else {
            FSDP_TRY(bf16_operand(2, dy, n, out, out, &dy16));
        }
        pdy = &dy16;
    }
    if (dx)
        FSDP_TRY(gemm_any(0, 1, n, in, out, 1.0f, dy, out, pdy, 2, w, out, NULL, 1, 1.0f, dx, in, NULL));
    if (dw)
        FSDP_TRY(gemm_any(1, 0, in, out, n, 1.0f, x, in, NULL, 0, dy, out, pdy, 2, 1.0f, dw, out, NULL));
    if (db && db_rows) {
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
    return gemm_any(trans_a, trans_b, m, n, k, alpha, a, lda, NULL, 0, b, ldb, NULL, 1, beta, c, ldc, NULL);
}
