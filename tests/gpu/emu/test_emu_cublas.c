/* The emulator's cuBLAS and cuBLASLt stand-ins (gpu/emu/emu_cublas.c) against an independent reference: a
 * naive double-precision GEMM whose inputs are rounded explicitly (its own rounding, written with frexp and
 * nearbyint rather than bit operations, so it shares no code with the emulator's). Most operands are small
 * integers or dyadic values whose products and sums are exact in fp32, so the emulator's bits can be asserted
 * equal to the reference's; random data is checked within fp32's accumulation bound and, separately, bit for
 * bit against a naive fp32 loop in k order, the order the emulator documents. Linked with emu_stub.c: ops run
 * inline, device memory is registered host memory. */
#include "gpu/emu/emu.h"

#include "common/clock.h"

#include <criterion/criterion.h>
#include <cublasLt.h>
#include <cublas_v2.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *emu_stub_last_failure(void);
void emu_stub_reset(void);

/* ---------------------------------------------------------------------------------------------------------
 * The reference's numbers
 * --------------------------------------------------------------------------------------------------------- */

enum fmt { F_F32, F_TF32, F_BF16, F_F16 };

/* x rounded to nearest even in a binary format of `sig` significant bits whose smallest normal is 2^emin and
 * largest finite value maxv (beyond it: inf). Works on the value, not the bits. */
static double round_fmt(double x, int sig, int emin, double maxv)
{
    if (isnan(x) || isinf(x) || x == 0)
        return x;
    int e;
    frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
    if (e - 1 < emin)
        e = emin + 1; /* subnormal: the quantum of the smallest normals */
    double q = ldexp(1.0, e - sig);
    double r = nearbyint(x / q) * q; /* x / q is exact: a power-of-two scaling */
    return fabs(r) > maxv ? copysign(INFINITY, x) : r;
}

static double rnd(enum fmt f, double x)
{
    switch (f) {
    case F_F32: return round_fmt(x, 24, -126, 0x1.fffffep127);
    case F_TF32: return round_fmt(x, 11, -126, 0x1.ffcp127);
    case F_BF16: return round_fmt(x, 8, -126, 0x1.fep127);
    case F_F16: return round_fmt(x, 11, -14, 65504.0);
    }
    return x;
}

static enum fmt fmt_of(cudaDataType_t t)
{
    return t == CUDA_R_16BF ? F_BF16 : t == CUDA_R_16F ? F_F16 : F_F32;
}

static size_t tsize(cudaDataType_t t)
{
    return t == CUDA_R_32F ? 4 : 2;
}

/* fp16 bits of v, which must be an fp16 value (the test's own encoder). */
static uint16_t f16_bits(double v)
{
    uint16_t s = signbit(v) ? 0x8000 : 0;
    v = fabs(v);
    if (isnan(v))
        return 0x7e00;
    if (isinf(v))
        return s | 0x7c00;
    if (v < 0x1p-14)
        return s | (uint16_t)(v / 0x1p-24);
    int e;
    double f = frexp(v, &e); /* v = f 2^e, f in [0.5, 1) */
    return s | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((f * 2 - 1) * 1024);
}

static double f16_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? m * 0x1p-24 : ldexp(1 + m / 1024.0, e - 15);
    return h & 0x8000 ? -v : v;
}

/* Stores v, which must be representable in t, into element i. */
static void put(void *p, cudaDataType_t t, int64_t i, double v)
{
    cr_assert(isnan(v) || rnd(fmt_of(t), v) == v, "put: %a is not a %d value", v, (int)t);
    if (t == CUDA_R_32F) {
        ((float *)p)[i] = (float)v;
    } else if (t == CUDA_R_16BF) {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    } else {
        ((uint16_t *)p)[i] = f16_bits(v);
    }
}

static double get(const void *p, cudaDataType_t t, int64_t i)
{
    if (t == CUDA_R_32F)
        return ((const float *)p)[i];
    if (t == CUDA_R_16BF) {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return f16_value(((const uint16_t *)p)[i]);
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* A deterministic generator (xorshift), so failures reproduce. */
static uint64_t rng_state = 88172645463325252ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static int rint_in(int lo, int hi) /* uniform in [lo, hi] */
{
    return lo + (int)(rng() % (uint64_t)(hi - lo + 1));
}
static double runif(void) /* uniform in [-1, 1), 24 bits */
{
    return (double)(int64_t)(rng() >> 40) / 0x1p23 - 1.0;
}

static void *dev(size_t bytes)
{
    void *p = NULL;
    cr_assert_eq(emu_device_alloc(&p, bytes > 0 ? bytes : 1), cudaSuccess);
    return p;
}

/* ---------------------------------------------------------------------------------------------------------
 * Matrices: a column-major matrix in device memory with its values, rounding and type.
 * --------------------------------------------------------------------------------------------------------- */

#define SENTINEL -77.0 /* every element outside the matrix proper (ld padding, past the end) */

struct mat {
    int rows, cols, ld, batch;
    long long stride;
    cudaDataType_t t;
    void *p;   /* device */
    double *v; /* the values, as stored (batch entries `stride` apart, padding SENTINEL) */
};

static size_t mat_elems(const struct mat *x)
{
    size_t one = (size_t)x->ld * (size_t)(x->cols > 0 ? x->cols : 1);
    return (size_t)(x->batch - 1) * (size_t)x->stride + one + 8; /* 8 spare elements past the end */
}

typedef double (*gen_fn)(int b, int i, int j);

/* A rows x cols matrix (ld, batch entries stride apart) of type t, element (b, i, j) = gen rounded to t. */
static struct mat mat_new(int rows, int cols, int ld, int batch, long long stride, cudaDataType_t t, gen_fn gen)
{
    struct mat x = {rows, cols, ld, batch, stride, t, NULL, NULL};
    size_t n = mat_elems(&x);
    x.p = dev(n * tsize(t));
    x.v = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        x.v[i] = SENTINEL;
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < cols; j++)
            for (int i = 0; i < rows; i++)
                x.v[(size_t)b * (size_t)stride + (size_t)j * (size_t)ld + (size_t)i] = rnd(fmt_of(t), gen(b, i, j));
    for (size_t i = 0; i < n; i++)
        put(x.p, t, (int64_t)i, x.v[i]);
    return x;
}

static double mat_at(const struct mat *x, int b, int i, int j)
{
    return x->v[(size_t)b * (size_t)x->stride + (size_t)j * (size_t)x->ld + (size_t)i];
}

static double dev_at(const struct mat *x, int b, int i, int j)
{
    return get(x->p, x->t, (int64_t)b * x->stride + (int64_t)j * x->ld + i);
}

static void mat_free(struct mat *x)
{
    emu_device_free(x->p);
    free(x->v);
}

/* Elements of the device copy outside the matrix proper still hold SENTINEL. */
static void expect_padding_intact(const struct mat *x, const char *what)
{
    size_t n = mat_elems(x);
    for (size_t e = 0; e < n; e++) {
        size_t b = x->stride ? e / (size_t)x->stride : 0;
        size_t in = e - b * (size_t)x->stride;
        bool inside = b < (size_t)x->batch && in % (size_t)x->ld < (size_t)x->rows &&
                      in / (size_t)x->ld < (size_t)x->cols;
        if (x->stride == 0)
            inside = e % (size_t)x->ld < (size_t)x->rows && e / (size_t)x->ld < (size_t)x->cols;
        if (!inside)
            cr_assert_eq(get(x->p, x->t, (int64_t)e), SENTINEL, "%s: element %zu outside the matrix changed", what, e);
    }
}

/* The reference D(b, i, j) = alpha sum_p op(A)(i, p) op(B)(p, j) + beta C(b, i, j) in double, the inputs
 * rounded to `in` first, C not read when beta == 0. *mag gets sum |alpha a b| + |beta c| for tolerances. */
static double ref_elem(const struct mat *a, bool ta, const struct mat *b, bool tb, int k, enum fmt in, double alpha,
                       double beta, const struct mat *c, int e, int i, int j, double *mag)
{
    double s = 0, sa = 0;
    for (int p = 0; p < k; p++) {
        double x = rnd(in, ta ? mat_at(a, e, p, i) : mat_at(a, e, i, p));
        double y = rnd(in, tb ? mat_at(b, e, j, p) : mat_at(b, e, p, j));
        s += x * y;
        sa += fabs(x * y);
    }
    double r = alpha * s, m = fabs(alpha) * sa;
    if (beta != 0) {
        r += beta * mat_at(c, e, i, j);
        m += fabs(beta * mat_at(c, e, i, j));
    }
    if (mag)
        *mag = m;
    return r;
}

/* The same in fp32, the emulator's documented order: acc = 0, acc += a_p * b_p for p in order (each a
 * rounding), then alpha * acc, then + beta * C. */
static float ref_f32(const struct mat *a, bool ta, const struct mat *b, bool tb, int k, enum fmt in, float alpha,
                     float beta, const struct mat *c, int e, int i, int j)
{
    float acc = 0.0f;
    for (int p = 0; p < k; p++) {
        float x = (float)rnd(in, ta ? mat_at(a, e, p, i) : mat_at(a, e, i, p));
        float y = (float)rnd(in, tb ? mat_at(b, e, j, p) : mat_at(b, e, p, j));
        float prod = x * y;
        acc = acc + prod;
    }
    float r = alpha * acc;
    if (beta != 0.0f) {
        float cb = beta * (float)mat_at(c, e, i, j);
        r = r + cb;
    }
    return r;
}

static cublasHandle_t handle_new(void)
{
    cublasHandle_t h = NULL;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    return h;
}

static double g_int8(int b, int i, int j) /* small integers: every product and sum exact */
{
    (void)b, (void)i, (void)j;
    return rint_in(-8, 8);
}
static double g_int16(int b, int i, int j)
{
    (void)b, (void)i, (void)j;
    return rint_in(-16, 16);
}
static double g_unif(int b, int i, int j)
{
    (void)b, (void)i, (void)j;
    return runif();
}
static double g_nan(int b, int i, int j)
{
    (void)b, (void)i, (void)j;
    return NAN;
}

/* ---------------------------------------------------------------------------------------------------------
 * cublasGemmEx and friends
 * --------------------------------------------------------------------------------------------------------- */

static const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C};

Test(emu_cublas, every_transpose_with_padded_leading_dimensions)
{
    cublasHandle_t h = handle_new();
    const int m = 13, n = 11, k = 7;
    for (int x = 0; x < 3; x++)
        for (int y = 0; y < 3; y++) {
            bool ta = ops[x] != CUBLAS_OP_N, tb = ops[y] != CUBLAS_OP_N;
            int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
            struct mat a = mat_new(ar, ac, ar + 3, 1, 0, CUDA_R_32F, g_int8);
            struct mat b = mat_new(br, bc, br + 2, 1, 0, CUDA_R_32F, g_int8);
            struct mat c = mat_new(m, n, m + 5, 1, 0, CUDA_R_32F, g_int8);
            float alpha = 1.5f, beta = -0.5f;
            cr_assert_eq(cublasGemmEx(h, ops[x], ops[y], m, n, k, &alpha, a.p, CUDA_R_32F, a.ld, b.p, CUDA_R_32F,
                                      b.ld, &beta, c.p, CUDA_R_32F, c.ld, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         CUBLAS_STATUS_SUCCESS);
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    double want = ref_elem(&a, ta, &b, tb, k, F_F32, alpha, beta, &c, 0, i, j, NULL);
                    cr_assert_eq(dev_at(&c, 0, i, j), want, "op %d %d (%d, %d): %g, want %g", x, y, i, j,
                                 dev_at(&c, 0, i, j), want);
                }
            expect_padding_intact(&c, "C");
            mat_free(&a);
            mat_free(&b);
            mat_free(&c);
        }
    cublasDestroy(h);
}

/* Random fp32 data, shapes around the 8 x 4 tile's edges and beyond the row block: within fp32's accumulation
 * bound of the double reference, and bit for bit the naive fp32 loop in k order. */
Test(emu_cublas, sgemm_random_shapes_k_order_bits)
{
    cublasHandle_t h = handle_new();
    static const int shapes[][3] = {{1, 1, 1},   {1, 7, 3},   {8, 4, 5},    {9, 5, 1},    {7, 3, 33},
                                    {16, 8, 64}, {33, 17, 9}, {67, 45, 130}, {5, 130, 600}, {300, 6, 120},
                                    {200, 70, 1000}}; /* the last two span several row blocks */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int x = 0; x < 2; x++)
            for (int y = 0; y < 2; y++) {
                int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                bool ta = x, tb = y;
                int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
                struct mat a = mat_new(ar, ac, ar + 1, 1, 0, CUDA_R_32F, g_unif);
                struct mat b = mat_new(br, bc, br, 1, 0, CUDA_R_32F, g_unif);
                struct mat c = mat_new(m, n, m, 1, 0, CUDA_R_32F, g_unif);
                struct mat c0 = c;
                c0.v = malloc(mat_elems(&c) * sizeof(double));
                memcpy(c0.v, c.v, mat_elems(&c) * sizeof(double));
                float alpha = 0.75f, beta = 1.25f;
                cr_assert_eq(cublasSgemm(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                         &alpha, a.p, a.ld, b.p, b.ld, &beta, c.p, c.ld),
                             CUBLAS_STATUS_SUCCESS);
                for (int j = 0; j < n; j++)
                    for (int i = 0; i < m; i++) {
                        double mag;
                        double want = ref_elem(&a, ta, &b, tb, k, F_F32, alpha, beta, &c0, 0, i, j, &mag);
                        float got = (float)dev_at(&c, 0, i, j);
                        cr_assert(fabs(got - want) <= (k + 3) * 0x1p-23 * mag,
                                  "%dx%dx%d op %d %d (%d, %d): %.9g, want %.9g", m, n, k, x, y, i, j, got, want);
                        float naive = ref_f32(&a, ta, &b, tb, k, F_F32, alpha, beta, &c0, 0, i, j);
                        cr_assert_eq(fbits(got), fbits(naive), "%dx%dx%d (%d, %d): %a, the k-order loop %a", m, n,
                                     k, i, j, got, naive);
                    }
                free(c0.v);
                mat_free(&a);
                mat_free(&b);
                mat_free(&c);
            }
    cublasDestroy(h);
}

Test(emu_cublas, beta_zero_never_reads_c)
{
    cublasHandle_t h = handle_new();
    const int m = 10, n = 6, k = 5;
    struct mat a = mat_new(m, k, m, 1, 0, CUDA_R_32F, g_int8);
    struct mat b = mat_new(k, n, k, 1, 0, CUDA_R_32F, g_int8);
    struct mat c = mat_new(m, n, m + 2, 1, 0, CUDA_R_32F, g_nan);
    float alpha = 2.0f, beta = 0.0f;
    cr_assert_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a.p, m, b.p, k, &beta, c.p, c.ld),
                 CUBLAS_STATUS_SUCCESS);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++)
            cr_assert_eq(dev_at(&c, 0, i, j), ref_elem(&a, false, &b, false, k, F_F32, 2, 0, NULL, 0, i, j, NULL));
    /* the same with beta != 0 reads C: a NaN there is NaN in D */
    for (int j = 0; j < n; j++)
        put(c.p, CUDA_R_32F, (int64_t)j * c.ld, NAN);
    beta = 1.0f;
    cr_assert_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a.p, m, b.p, k, &beta, c.p, c.ld),
                 CUBLAS_STATUS_SUCCESS);
    for (int j = 0; j < n; j++) {
        cr_assert(isnan(dev_at(&c, 0, 0, j)));
        cr_assert(!isnan(dev_at(&c, 0, 1, j)));
    }
    mat_free(&a);
    mat_free(&b);
    mat_free(&c);
    cublasDestroy(h);
}

Test(emu_cublas, k_zero_scales_c)
{
    cublasHandle_t h = handle_new();
    const int m = 9, n = 5;
    struct mat c = mat_new(m, n, m, 1, 0, CUDA_R_32F, g_int8);
    float alpha = NAN, beta = -3.0f; /* alpha multiplies nothing */
    /* A and B are never read: NULL is fine (cuBLAS reads no element of them) */
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, 0, &alpha, NULL, CUDA_R_32F, m, NULL, CUDA_R_32F, 1,
                              &beta, c.p, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_SUCCESS);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++)
            cr_assert_eq(dev_at(&c, 0, i, j), -3.0 * mat_at(&c, 0, i, j));
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++)
            put(c.p, CUDA_R_32F, (int64_t)j * m + i, NAN);
    beta = 0.0f;
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, 0, &alpha, NULL, CUDA_R_32F, 1, NULL, CUDA_R_32F, 1,
                              &beta, c.p, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_SUCCESS);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++)
            cr_assert_eq(fbits((float)dev_at(&c, 0, i, j)), 0u, "D = 0 * C with C never read: +0");
    /* m == 0 or n == 0: nothing at all, not even a range check */
    cr_assert_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 0, n, 4, &alpha, NULL, 1, NULL, 4, &beta, NULL, 1),
                 CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(emu_sticky_error(), cudaSuccess);
    mat_free(&c);
    cublasDestroy(h);
}

Test(emu_cublas, strided_batched)
{
    cublasHandle_t h = handle_new();
    const int m = 6, n = 7, k = 5, batch = 3;
    for (int variant = 0; variant < 3; variant++) {
        /* 0: Sgemm strided, 1: GemmStridedBatchedEx bf16 in, fp32 out, 2: B shared by every entry (stride 0) */
        cudaDataType_t at = variant == 1 ? CUDA_R_16BF : CUDA_R_32F;
        long long sa = m * k + 3, sb = variant == 2 ? 0 : k * n + 1, sc = (m + 1) * n + 2;
        struct mat a = mat_new(m, k, m, batch, sa, at, g_int8);
        struct mat b = mat_new(n, k, n, variant == 2 ? 1 : batch, sb, at, g_int8); /* stored n x k: op T */
        b.batch = batch;
        struct mat c = mat_new(m, n, m + 1, batch, sc, CUDA_R_32F, g_int8);
        struct mat c0 = c;
        c0.v = malloc(mat_elems(&c) * sizeof(double));
        memcpy(c0.v, c.v, mat_elems(&c) * sizeof(double));
        float alpha = -1.0f, beta = 0.5f;
        cublasStatus_t s;
        if (variant == 0)
            s = cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, m, n, k, &alpha, a.p, m, sa, b.p, n, sb,
                                          &beta, c.p, c.ld, sc, batch);
        else
            s = cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_T, m, n, k, &alpha, a.p, at, m, sa, b.p, at, n,
                                           sb, &beta, c.p, CUDA_R_32F, c.ld, sc, batch, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT);
        cr_assert_eq(s, CUBLAS_STATUS_SUCCESS);
        for (int e = 0; e < batch; e++)
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++)
                    cr_assert_eq(dev_at(&c, e, i, j),
                                 ref_elem(&a, false, &b, true, k, F_F32, alpha, beta, &c0, e, i, j, NULL),
                                 "variant %d entry %d (%d, %d)", variant, e, i, j);
        expect_padding_intact(&c, "batched C");
        /* batchCount 0 is nothing */
        cr_assert_eq(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, NULL, m, 0, NULL, k, 0,
                                               &beta, NULL, m, 0, 0),
                     CUBLAS_STATUS_SUCCESS);
        free(c0.v);
        mat_free(&a);
        mat_free(&b);
        mat_free(&c);
    }
    cublasDestroy(h);
}

/* One value through a 1 x 1 x 1 GEMM with B = 1: D is the value after the compute type's input rounding. */
static float through(cublasHandle_t h, cublasComputeType_t compute, float v)
{
    float *a = dev(4), *b = dev(4), *d = dev(4);
    a[0] = v;
    b[0] = 1.0f;
    float one = 1.0f, zero = 0.0f;
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, a, CUDA_R_32F, 1, b, CUDA_R_32F, 1, &zero,
                              d, CUDA_R_32F, 1, compute, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_SUCCESS);
    float r = d[0];
    emu_device_free(a);
    emu_device_free(b);
    emu_device_free(d);
    return r;
}

Test(emu_cublas, compute_type_input_rounding_bits)
{
    cublasHandle_t h = handle_new();
    static const double vals[] = {
        1.0,
        1 + 0x1p-11,               /* TF32 tie: to even, 1 */
        1 + 3 * 0x1p-11,           /* TF32 tie: to even, 1 + 2^-9 */
        1 + 0x1p-11 + 0x1p-20,     /* just above the tie: up */
        1 + 0x1p-8,                /* bf16 tie: to 1 */
        1 + 3 * 0x1p-8,            /* bf16 tie: up to 1 + 2^-6 */
        -(1 + 0x1p-8 + 0x1p-20),   /* just past it, negative */
        3.14159265358979,
        -2.718281828,
        65504.0,
        65519.0,                   /* fp16: down to 65504 */
        65520.0,                   /* fp16: to inf */
        1e-5,                      /* fp16 subnormal */
        0x1p-25,                   /* fp16: a tie between 0 and 2^-24, to 0 */
        0x1.8p-25,                 /* fp16: up to 2^-24 */
        0x1p-130,                  /* fp32 subnormal: exact in TF32 and bf16 */
        0x1.ffffffp127 * 0.99999,  /* near fp32's largest: TF32 and bf16 round up to inf */
        1e30,
        -0.0,                      /* the sum starts at +0: +0 + -0 is +0 */
        INFINITY,
    };
    static const struct {
        cublasComputeType_t c;
        enum fmt f;
    } modes[] = {{CUBLAS_COMPUTE_32F, F_F32},
                 {CUBLAS_COMPUTE_32F_PEDANTIC, F_F32},
                 {CUBLAS_COMPUTE_32F_FAST_TF32, F_TF32},
                 {CUBLAS_COMPUTE_32F_FAST_16BF, F_BF16},
                 {CUBLAS_COMPUTE_32F_FAST_16F, F_F16}};
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++)
        for (size_t vi = 0; vi < sizeof vals / sizeof vals[0]; vi++) {
            float v = (float)vals[vi];
            float want = v == 0 ? 0.0f : (float)rnd(modes[mi].f, v);
            float got = through(h, modes[mi].c, v);
            cr_assert_eq(fbits(got), fbits(want), "compute %d: %a gives %a, want %a", (int)modes[mi].c, (double)v,
                         (double)got, (double)want);
        }
    /* NaN stays NaN in every mode */
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++)
        cr_assert(isnan(through(h, modes[mi].c, NAN)));
    cublasDestroy(h);
}

/* Values in [1, 4) with 16 fractional bits: their roundings to bf16 (TF32, fp16) are not themselves, and the
 * products of the rounded values sum exactly in fp32 for the k chosen, so D is the rounded inputs' exact
 * product, bit for bit; and differs from the unrounded inputs' product. */
static double g_dyadic(int b, int i, int j)
{
    (void)b, (void)i, (void)j;
    double v = (1 + (double)(rng() % 65536) / 65536.0) * (rng() % 2 ? 2 : 1);
    return rng() % 2 ? -v : v;
}
static double g_dyadic1(int b, int i, int j) /* [1, 2) */
{
    (void)b, (void)i, (void)j;
    double v = 1 + (double)(rng() % 65536) / 65536.0;
    return rng() % 2 ? -v : v;
}

static void check_rounded_product(cublasHandle_t h, bool via_math_mode, cublasComputeType_t compute, enum fmt f,
                                  int k, gen_fn gen)
{
    const int m = 12, n = 9;
    struct mat a = mat_new(m, k, m, 1, 0, CUDA_R_32F, gen);
    struct mat b = mat_new(k, n, k, 1, 0, CUDA_R_32F, gen);
    struct mat c = mat_new(m, n, m, 1, 0, CUDA_R_32F, g_int8);
    float alpha = 1.0f, beta = 0.0f;
    if (via_math_mode)
        cr_assert_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a.p, m, b.p, k, &beta, c.p, m),
                     CUBLAS_STATUS_SUCCESS);
    else
        cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a.p, CUDA_R_32F, m, b.p, CUDA_R_32F,
                                  k, &beta, c.p, CUDA_R_32F, m, compute, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    int differs = 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            /* exact for the rounding modes (see the generators); for fp32, k = 1: one product's rounding */
            double want = (float)ref_elem(&a, false, &b, false, k, f, 1, 0, NULL, 0, i, j, NULL);
            cr_assert_eq(dev_at(&c, 0, i, j), want, "fmt %d k %d (%d, %d): %a, want %a", (int)f, k, i, j,
                         dev_at(&c, 0, i, j), want);
            differs += (float)ref_elem(&a, false, &b, false, k, F_F32, 1, 0, NULL, 0, i, j, NULL) != want;
        }
    if (f != F_F32)
        cr_assert_gt(differs, m * n / 2, "the rounding changed too few outputs (%d) to be tested", differs);
    mat_free(&a);
    mat_free(&b);
    mat_free(&c);
}

Test(emu_cublas, compute_type_products_bits)
{
    cublasHandle_t h = handle_new();
    /* bf16: 8-bit values in [1, 4), products of 2^-14 quanta below 16, 64 of them below 2^10: 24 bits */
    check_rounded_product(h, false, CUBLAS_COMPUTE_32F_FAST_16BF, F_BF16, 64, g_dyadic);
    /* TF32 and fp16: 11-bit values in [1, 2), products of 2^-20 quanta below 4, three of them below 16 */
    check_rounded_product(h, false, CUBLAS_COMPUTE_32F_FAST_TF32, F_TF32, 3, g_dyadic1);
    check_rounded_product(h, false, CUBLAS_COMPUTE_32F_FAST_16F, F_F16, 3, g_dyadic1);
    /* cublasSgemm: the default math mode is fp32; CUBLAS_TF32_TENSOR_OP_MATH rounds to TF32 */
    cublasMath_t mode;
    cr_assert_eq(cublasGetMathMode(h, &mode), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(mode, CUBLAS_DEFAULT_MATH);
    check_rounded_product(h, true, CUBLAS_COMPUTE_32F, F_F32, 1, g_dyadic1);
    cr_assert_eq(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cublasGetMathMode(h, &mode), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(mode, CUBLAS_TF32_TENSOR_OP_MATH);
    check_rounded_product(h, true, CUBLAS_COMPUTE_32F, F_TF32, 3, g_dyadic1);
    /* cublasGemmEx takes its compute type as given, whatever the handle's math mode */
    check_rounded_product(h, false, CUBLAS_COMPUTE_32F, F_F32, 1, g_dyadic1);
    cr_assert_eq(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
    check_rounded_product(h, true, CUBLAS_COMPUTE_32F, F_F32, 1, g_dyadic1);
    cublasDestroy(h);
}

/* bf16 and fp16 inputs and outputs: integer inputs (exact in both), sums up to 16 * 16 * 9 = 2304 that bf16
 * (8 bits) and fp16 (11 bits) must round, alpha and beta with C in D's type. */
Test(emu_cublas, sixteen_bit_inputs_and_outputs)
{
    cublasHandle_t h = handle_new();
    static const cudaDataType_t ins[] = {CUDA_R_16BF, CUDA_R_16F};
    for (int x = 0; x < 2; x++)
        for (int out = 0; out < 2; out++) {
            cudaDataType_t at = ins[x], ct = out ? at : CUDA_R_32F;
            const int m = 11, n = 7, k = 9;
            struct mat a = mat_new(k, m, k, 1, 0, at, g_int16); /* op T */
            struct mat b = mat_new(k, n, k + 4, 1, 0, at, g_int16);
            struct mat c = mat_new(m, n, m + 1, 1, 0, ct, g_int16);
            struct mat c0 = c;
            c0.v = malloc(mat_elems(&c) * sizeof(double));
            memcpy(c0.v, c.v, mat_elems(&c) * sizeof(double));
            float alpha = 1.0f, beta = 2.0f;
            cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, a.p, at, a.ld, b.p, at, b.ld, &beta,
                                      c.p, ct, c.ld, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         CUBLAS_STATUS_SUCCESS);
            int rounded = 0;
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    double exact = ref_elem(&a, true, &b, false, k, F_F32, alpha, beta, &c0, 0, i, j, NULL);
                    double want = rnd(fmt_of(ct), exact);
                    rounded += want != exact;
                    cr_assert_eq(dev_at(&c, 0, i, j), want, "in %d out %d (%d, %d): %g, want %g (exact %g)", (int)at,
                                 (int)ct, i, j, dev_at(&c, 0, i, j), want, exact);
                }
            if (ct == CUDA_R_16BF)
                cr_assert_gt(rounded, 0, "no output needed rounding");
            expect_padding_intact(&c, "16-bit C");
            free(c0.v);
            mat_free(&a);
            mat_free(&b);
            mat_free(&c);
        }
    cublasDestroy(h);
}

/* The project's call (kernels/cuda/matmul.cu, gemm_rm): a row-major C(m, n) = op(A) op(B) is the column-major
 * C^T = op(B)^T op(A)^T, so cublasGemmEx gets (opb, opa, n, m, k, B, ldb, A, lda, C, ldc); in bf16 mode the
 * operands are rounded to bf16 copies and multiplied with CUBLAS_COMPUTE_32F; the forward pass seeds C with
 * the bias and accumulates (beta = 1). */
Test(emu_cublas, row_major_operand_swap)
{
    cublasHandle_t h = handle_new();
    cudaStream_t stream = (cudaStream_t)0x1234, got_stream = NULL;
    cr_assert_eq(cublasSetStream(h, stream), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cublasGetStream(h, &got_stream), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(got_stream, stream);
    cr_assert_eq(cublasSetStream(h, NULL), CUBLAS_STATUS_SUCCESS);
    const int m = 10, n = 13, k = 17;
    for (int mode = 0; mode < 3; mode++) /* fp32, TF32, bf16 copies */
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                /* row-major operands are column-major transposes: A (m x k row-major) is a k x m column-major
                 * matrix with ld k */
                int lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
                cudaDataType_t t = mode == 2 ? CUDA_R_16BF : CUDA_R_32F;
                struct mat a = mat_new(lda, ta ? k : m, lda, 1, 0, t, g_unif);
                struct mat b = mat_new(ldb, tb ? n : k, ldb, 1, 0, t, g_unif);
                struct mat c = mat_new(ldc, m, ldc, 1, 0, CUDA_R_32F, g_unif); /* C row-major: n x m col-major */
                struct mat c0 = c;
                c0.v = malloc(mat_elems(&c) * sizeof(double));
                memcpy(c0.v, c.v, mat_elems(&c) * sizeof(double));
                float alpha = 1.0f, beta = 1.0f;
                cublasComputeType_t compute = mode == 1 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
                cr_assert_eq(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                                          &alpha, b.p, t, ldb, a.p, t, lda, &beta, c.p, CUDA_R_32F, ldc, compute,
                                          CUBLAS_GEMM_DEFAULT),
                             CUBLAS_STATUS_SUCCESS);
                enum fmt f = mode == 1 ? F_TF32 : F_F32;
                for (int r = 0; r < m; r++)
                    for (int col = 0; col < n; col++) {
                        /* row-major element (r, col) */
                        double s = 0, mag = 0;
                        for (int p = 0; p < k; p++) {
                            double x = rnd(f, ta ? a.v[p * lda + r] : a.v[r * lda + p]);
                            double y = rnd(f, tb ? b.v[col * ldb + p] : b.v[p * ldb + col]);
                            s += x * y;
                            mag += fabs(x * y);
                        }
                        double want = s + c0.v[r * ldc + col];
                        mag += fabs(c0.v[r * ldc + col]);
                        double got = get(c.p, CUDA_R_32F, (int64_t)r * ldc + col);
                        cr_assert(fabs(got - want) <= (k + 3) * 0x1p-23 * mag, "mode %d op %d %d (%d, %d): %.9g, %.9g",
                                  mode, ta, tb, r, col, got, want);
                    }
                free(c0.v);
                mat_free(&a);
                mat_free(&b);
                mat_free(&c);
            }
    cublasDestroy(h);
}

Test(emu_cublas, validation)
{
    cublasHandle_t h = handle_new();
    struct mat a = mat_new(8, 8, 8, 1, 0, CUDA_R_32F, g_int8);
    struct mat b = mat_new(8, 8, 8, 1, 0, CUDA_R_32F, g_int8);
    struct mat c = mat_new(8, 8, 8, 1, 0, CUDA_R_32F, g_int8);
    float one = 1.0f;
    const cublasOperation_t N = CUBLAS_OP_N, T = CUBLAS_OP_T;
#define EX(hh, ta, tb, m, n, k, lda, ldb, ldc, at, bt, ct, comp)                                                      \
    cublasGemmEx(hh, ta, tb, m, n, k, &one, a.p, at, lda, b.p, bt, ldb, &one, c.p, ct, ldc, comp, CUBLAS_GEMM_DEFAULT)
#define F32 CUDA_R_32F
    static const struct {
        int ta, tb, m, n, k, lda, ldb, ldc;
        cublasStatus_t want;
    } cases[] = {
        {0, 0, -1, 4, 4, 8, 8, 8, CUBLAS_STATUS_INVALID_VALUE},
        {0, 0, 4, -1, 4, 8, 8, 8, CUBLAS_STATUS_INVALID_VALUE},
        {0, 0, 4, 4, -1, 8, 8, 8, CUBLAS_STATUS_INVALID_VALUE},
        {0, 0, 5, 4, 4, 4, 8, 8, CUBLAS_STATUS_INVALID_VALUE}, /* lda < m (A not transposed) */
        {1, 0, 4, 4, 5, 4, 8, 8, CUBLAS_STATUS_INVALID_VALUE}, /* lda < k (A transposed) */
        {1, 0, 8, 4, 4, 4, 8, 8, CUBLAS_STATUS_SUCCESS},       /* lda >= k suffices when transposed */
        {0, 0, 4, 4, 5, 8, 4, 8, CUBLAS_STATUS_INVALID_VALUE}, /* ldb < k */
        {0, 1, 4, 5, 4, 8, 4, 8, CUBLAS_STATUS_INVALID_VALUE}, /* ldb < n (B transposed) */
        {0, 0, 5, 4, 4, 8, 8, 4, CUBLAS_STATUS_INVALID_VALUE}, /* ldc < m */
        {0, 0, 0, 4, 4, 0, 8, 8, CUBLAS_STATUS_INVALID_VALUE}, /* lda < max(1, 0) */
        {0, 0, 0, 4, 4, 1, 8, 1, CUBLAS_STATUS_SUCCESS},       /* m == 0: nothing */
        {0, 0, 4, 4, 0, 8, 1, 8, CUBLAS_STATUS_SUCCESS},       /* k == 0 */
        {0, 0, 4, 4, 0, 8, 0, 8, CUBLAS_STATUS_INVALID_VALUE}, /* ldb < max(1, k = 0) */
        {7, 0, 4, 4, 4, 8, 8, 8, CUBLAS_STATUS_INVALID_VALUE}, /* not an operation */
        {0, 3, 4, 4, 4, 8, 8, 8, CUBLAS_STATUS_INVALID_VALUE}, /* CUBLAS_OP_CONJG: not supported by GEMM */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cublasOperation_t ta = (cublasOperation_t)cases[i].ta, tb = (cublasOperation_t)cases[i].tb;
        cublasStatus_t s = EX(h, ta, tb, cases[i].m, cases[i].n, cases[i].k, cases[i].lda, cases[i].ldb,
                              cases[i].ldc, F32, F32, F32, CUBLAS_COMPUTE_32F);
        cr_assert_eq(s, cases[i].want, "case %zu: %s, want %s", i, cublasGetStatusName(s),
                     cublasGetStatusName(cases[i].want));
        s = cublasSgemm(h, ta, tb, cases[i].m, cases[i].n, cases[i].k, &one, a.p, cases[i].lda, b.p, cases[i].ldb,
                        &one, c.p, cases[i].ldc);
        cr_assert_eq(s, cases[i].want, "Sgemm case %zu: %s", i, cublasGetStatusName(s));
    }
    /* batchCount < 0 */
    cr_assert_eq(cublasSgemmStridedBatched(h, N, N, 4, 4, 4, &one, a.p, 8, 0, b.p, 8, 0, &one, c.p, 8, 0, -1),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(cublasGemmStridedBatchedEx(h, N, N, 4, 4, 4, &one, a.p, F32, 8, 0, b.p, F32, 8, 0, &one, c.p, F32,
                                            8, 0, -1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_INVALID_VALUE);
    /* type combinations outside cuBLAS's table */
    static const struct {
        cudaDataType_t at, bt, ct;
        int compute;
    } bad[] = {
        {CUDA_R_32F, CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F},   /* A and B differ */
        {CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16F, CUBLAS_COMPUTE_32F},  /* bf16 in, fp16 out */
        {CUDA_R_32F, CUDA_R_32F, CUDA_R_16BF, CUBLAS_COMPUTE_32F},   /* fp32 in, bf16 out */
        {CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32}, /* _FAST_ takes fp32 only */
        {CUDA_R_16F, CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F_FAST_16F},
        {CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_64F},
        {CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_16F},
        {CUDA_R_64F, CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_32F},
        {CUDA_R_8I, CUDA_R_8I, CUDA_R_32F, CUBLAS_COMPUTE_32F},
        {CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 12345},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(EX(h, T, N, 4, 4, 4, 8, 8, 8, bad[i].at, bad[i].bt, bad[i].ct,
                        (cublasComputeType_t)bad[i].compute),
                     CUBLAS_STATUS_NOT_SUPPORTED, "type case %zu", i);
    /* a bad value wins over a bad type combination */
    cr_assert_eq(EX(h, N, N, -1, 4, 4, 8, 8, 8, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_32F),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(cublasGemmEx(h, N, N, 4, 4, 4, &one, a.p, F32, 8, b.p, F32, 8, &one, c.p, F32, 8,
                              CUBLAS_COMPUTE_32F, (cublasGemmAlgo_t)12345),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(cublasGemmEx(h, N, N, 4, 4, 4, NULL, a.p, F32, 8, b.p, F32, 8, &one, c.p, F32, 8,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(emu_sticky_error(), cudaSuccess); /* no call got as far as a device fault */
    /* a NULL handle */
    cublasHandle_t nul = NULL;
    cr_assert_eq(EX(nul, N, N, 4, 4, 4, 8, 8, 8, F32, F32, F32, CUBLAS_COMPUTE_32F), CUBLAS_STATUS_NOT_INITIALIZED);
    cr_assert_eq(cublasSgemm(nul, N, N, 4, 4, 4, &one, a.p, 8, b.p, 8, &one, c.p, 8), CUBLAS_STATUS_NOT_INITIALIZED);
    cr_assert_eq(cublasSgemmStridedBatched(nul, N, N, 4, 4, 4, &one, a.p, 8, 0, b.p, 8, 0, &one, c.p, 8, 0, 1),
                 CUBLAS_STATUS_NOT_INITIALIZED);
    cr_assert_eq(cublasGemmStridedBatchedEx(nul, N, N, 4, 4, 4, &one, a.p, F32, 8, 0, b.p, F32, 8, 0, &one, c.p, F32,
                                            8, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_NOT_INITIALIZED);
    cr_assert_eq(cublasSetStream(nul, NULL), CUBLAS_STATUS_NOT_INITIALIZED);
    cr_assert_eq(cublasSetMathMode(nul, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_NOT_INITIALIZED);
    cr_assert_eq(cublasSetPointerMode(nul, CUBLAS_POINTER_MODE_HOST), CUBLAS_STATUS_NOT_INITIALIZED);
    cr_assert_eq(cublasSetWorkspace(nul, NULL, 0), CUBLAS_STATUS_NOT_INITIALIZED);
    cr_assert_eq(cublasDestroy(nul), CUBLAS_STATUS_NOT_INITIALIZED);
    cr_assert_eq(cublasCreate(NULL), CUBLAS_STATUS_INVALID_VALUE);
    /* handle settings */
    cr_assert_eq(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE), CUBLAS_STATUS_NOT_SUPPORTED);
    cr_assert_eq(cublasSetPointerMode(h, (cublasPointerMode_t)9), CUBLAS_STATUS_INVALID_VALUE);
    cublasPointerMode_t pm;
    cr_assert_eq(cublasGetPointerMode(h, &pm), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(pm, CUBLAS_POINTER_MODE_HOST);
    cr_assert_eq(cublasSetMathMode(h, (cublasMath_t)5), CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(cublasSetMathMode(h, (cublasMath_t)(CUBLAS_TF32_TENSOR_OP_MATH |
                                                     CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
                 CUBLAS_STATUS_SUCCESS);
    void *ws = dev(4096);
    cr_assert_eq(cublasSetWorkspace(h, ws, 4096), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cublasSetWorkspace(h, (char *)ws + 8, 1024), CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(cublasSetWorkspace(h, NULL, 0), CUBLAS_STATUS_SUCCESS);
    emu_device_free(ws);
    /* status names and strings */
    cr_assert_str_eq(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
    cr_assert_str_eq(cublasGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
    cr_assert_str_eq(cublasLtGetStatusName(CUBLAS_STATUS_EXECUTION_FAILED), "CUBLAS_STATUS_EXECUTION_FAILED");
    cr_assert(strlen(cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE)) > 0);
    cr_assert(strlen(cublasLtGetStatusString((cublasStatus_t)999)) > 0);
#undef EX
#undef F32
    mat_free(&a);
    mat_free(&b);
    mat_free(&c);
    cublasDestroy(h);
}

/* A failing call leaves C exactly as it was. */
Test(emu_cublas, failed_calls_write_nothing)
{
    cublasHandle_t h = handle_new();
    struct mat a = mat_new(8, 8, 8, 1, 0, CUDA_R_32F, g_int8);
    struct mat c = mat_new(8, 8, 8, 1, 0, CUDA_R_32F, g_int8);
    float one = 1.0f;
    cr_assert_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a.p, 7, a.p, 8, &one, c.p, 8),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a.p, CUDA_R_32F, 8, a.p, CUDA_R_16BF, 8,
                              &one, c.p, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_NOT_SUPPORTED);
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 8; i++)
            cr_assert_eq(dev_at(&c, 0, i, j), mat_at(&c, 0, i, j));
    mat_free(&a);
    mat_free(&c);
    cublasDestroy(h);
}

/* An operand span past its allocation is what a GPU would fault on: reported (the sticky error, a message
 * naming the call and the operand) and the call fails with CUBLAS_STATUS_EXECUTION_FAILED, nothing written. */
Test(emu_cublas, range_check)
{
    cublasHandle_t h = handle_new();
    emu_stub_reset();
    const int m = 16, n = 8, k = 8;
    float *a = dev((size_t)m * k * 4 - 4); /* one float short */
    float *b = dev((size_t)k * n * 4), *c = dev((size_t)m * n * 4);
    memset(c, 0, (size_t)m * n * 4);
    float one = 1.0f, zero = 0.0f;
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a, CUDA_R_32F, m, b, CUDA_R_32F, k, &zero, c,
                              CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_EXECUTION_FAILED);
    cr_assert_neq(emu_sticky_error(), cudaSuccess);
    cr_assert(strstr(emu_stub_last_failure(), "cublasGemmEx") && strstr(emu_stub_last_failure(), ": A "),
              "message: %s", emu_stub_last_failure());
    for (int i = 0; i < m * n; i++)
        cr_assert_eq(c[i], 0.0f);
    /* the leading dimension counts: ldc past the allocation for the last column */
    emu_stub_reset();
    float *a2 = dev((size_t)m * k * 4);
    cr_assert_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m - 1, n, k, &one, a2, m, b, k, &zero, c, m + 1),
                 CUBLAS_STATUS_EXECUTION_FAILED);
    cr_assert(strstr(emu_stub_last_failure(), "cublasSgemm") && strstr(emu_stub_last_failure(), ": C "), "message: %s",
              emu_stub_last_failure());
    /* a strided batch past the end of B */
    emu_stub_reset();
    cr_assert_eq(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a2, m, 0, b, k, 8, &zero, c, m,
                                           0, 2),
                 CUBLAS_STATUS_EXECUTION_FAILED);
    cr_assert(strstr(emu_stub_last_failure(), ": B "), "message: %s", emu_stub_last_failure());
    /* host memory is not device memory */
    emu_stub_reset();
    float host[64] = {0};
    cr_assert_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a2, m, b, k, &zero, host, 8),
                 CUBLAS_STATUS_EXECUTION_FAILED);
    /* and with beta == 0 and k == 0 only C is checked: a NULL A or B is fine (k == 0), a NULL C is not */
    emu_stub_reset();
    cr_assert_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 0, &one, NULL, 8, NULL, 1, &zero, NULL, 8),
                 CUBLAS_STATUS_EXECUTION_FAILED);
    emu_stub_reset();
    emu_device_free(a);
    emu_device_free(a2);
    emu_device_free(b);
    emu_device_free(c);
    cublasDestroy(h);
}

/* ---------------------------------------------------------------------------------------------------------
 * cuBLASLt
 * --------------------------------------------------------------------------------------------------------- */

struct lt_call {
    cublasLtEpilogue_t epi;
    cublasOperation_t ta, tb;
    cublasComputeType_t compute;
    cudaDataType_t scale;
    const void *bias;
    int32_t bias_type; /* -1: unset */
    int64_t bias_stride;
    void *aux;
    int64_t aux_ld, aux_stride;
    int32_t aux_type; /* -1: unset */
    float alpha, beta;
};

static struct lt_call lt_default(void)
{
    return (struct lt_call){.epi = CUBLASLT_EPILOGUE_DEFAULT, .ta = CUBLAS_OP_N, .tb = CUBLAS_OP_N,
                            .compute = CUBLAS_COMPUTE_32F, .scale = CUDA_R_32F, .bias_type = -1, .aux_type = -1,
                            .alpha = 1.0f};
}

static cublasLtMatrixLayout_t layout_of(const struct mat *x)
{
    cublasLtMatrixLayout_t l;
    cr_assert_eq(cublasLtMatrixLayoutCreate(&l, x->t, (uint64_t)x->rows, (uint64_t)x->cols, x->ld),
                 CUBLAS_STATUS_SUCCESS);
    if (x->batch > 1) {
        int32_t bc = x->batch;
        int64_t st = x->stride;
        cr_assert_eq(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc),
                     CUBLAS_STATUS_SUCCESS);
        cr_assert_eq(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st, sizeof st),
                     CUBLAS_STATUS_SUCCESS);
    }
    return l;
}

static cublasLtMatmulDesc_t desc_of(const struct lt_call *c)
{
    cublasLtMatmulDesc_t d;
    cr_assert_eq(cublasLtMatmulDescCreate(&d, c->compute, c->scale), CUBLAS_STATUS_SUCCESS);
    int32_t ta = c->ta, tb = c->tb;
    uint32_t epi = c->epi;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), 0);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), 0);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), 0);
    if (c->bias)
        cr_assert_eq(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c->bias, sizeof c->bias),
                     0);
    if (c->bias_type != -1)
        cr_assert_eq(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &c->bias_type,
                                                    sizeof c->bias_type),
                     0);
    if (c->bias_stride)
        cr_assert_eq(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &c->bias_stride,
                                                    sizeof c->bias_stride),
                     0);
    if (c->aux)
        cr_assert_eq(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &c->aux,
                                                    sizeof c->aux),
                     0);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &c->aux_ld, sizeof c->aux_ld),
                 0);
    if (c->aux_stride)
        cr_assert_eq(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &c->aux_stride,
                                                    sizeof c->aux_stride),
                     0);
    if (c->aux_type != -1)
        cr_assert_eq(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &c->aux_type,
                                                    sizeof c->aux_type),
                     0);
    return d;
}

/* D = epilogue(alpha op(A) op(B) + beta C) through the heuristic and cublasLtMatmul; *heur gets the
 * heuristic's status. */
static cublasStatus_t lt_run(const struct lt_call *c, const struct mat *a, const struct mat *b, const struct mat *cm,
                             const struct mat *d, cublasStatus_t *heur)
{
    static cublasLtHandle_t lt;
    if (!lt)
        cr_assert_eq(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDesc_t desc = desc_of(c);
    cublasLtMatrixLayout_t la = layout_of(a), lb = layout_of(b), lc = layout_of(cm), ld = layout_of(d);
    cublasLtMatmulPreference_t pref;
    cr_assert_eq(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    uint64_t ws = 1 << 20;
    cr_assert_eq(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                 0);
    cublasLtMatmulHeuristicResult_t res[2];
    int got = -1;
    *heur = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 2, res, &got);
    if (*heur == CUBLAS_STATUS_SUCCESS) {
        cr_assert_eq(got, 1);
        cr_assert_eq(res[0].state, CUBLAS_STATUS_SUCCESS);
        cr_assert_eq(res[0].workspaceSize, 0u);
    }
    cublasStatus_t s = cublasLtMatmul(lt, desc, &c->alpha, a->p, la, b->p, lb, &c->beta, cm->p, lc, d->p, ld,
                                      got == 1 ? &res[0].algo : NULL, NULL, 0, NULL);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    return s;
}

static double gelu_ref(double x)
{
    return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

static double gelu_grad_ref(double x)
{
    const double s = 0.7978845608028654, c = 0.044715, t = tanh(s * (x + c * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * c * x * x);
}

/* Plain matmuls: every transpose, C and D separate with their own leading dimensions, batches, in place. */
Test(emu_cublaslt, default_epilogue_layouts_and_batches)
{
    const int m = 9, n = 6, k = 5, batch = 2;
    for (int x = 0; x < 2; x++)
        for (int y = 0; y < 2; y++)
            for (int inplace = 0; inplace < 2; inplace++) {
                struct lt_call c = lt_default();
                c.ta = x ? CUBLAS_OP_T : CUBLAS_OP_N;
                c.tb = y ? CUBLAS_OP_T : CUBLAS_OP_N;
                c.alpha = 2.0f;
                c.beta = -1.0f;
                int ar = x ? k : m, ac = x ? m : k, br = y ? n : k, bc = y ? k : n;
                struct mat a = mat_new(ar, ac, ar + 1, batch, (long long)(ar + 1) * ac + 5, CUDA_R_32F, g_int8);
                struct mat b = mat_new(br, bc, br, batch, (long long)br * bc, CUDA_R_32F, g_int8);
                struct mat cm = mat_new(m, n, m + 3, batch, (long long)(m + 3) * n + 1, CUDA_R_32F, g_int8);
                struct mat d = inplace ? cm : mat_new(m, n, m + 1, batch, (long long)(m + 1) * n, CUDA_R_32F, g_int8);
                struct mat c0 = cm;
                c0.v = malloc(mat_elems(&cm) * sizeof(double));
                memcpy(c0.v, cm.v, mat_elems(&cm) * sizeof(double));
                cublasStatus_t heur;
                cr_assert_eq(lt_run(&c, &a, &b, &cm, &d, &heur), CUBLAS_STATUS_SUCCESS);
                cr_assert_eq(heur, CUBLAS_STATUS_SUCCESS);
                for (int e = 0; e < batch; e++)
                    for (int j = 0; j < n; j++)
                        for (int i = 0; i < m; i++)
                            cr_assert_eq(dev_at(&d, e, i, j),
                                         ref_elem(&a, x, &b, y, k, F_F32, 2, -1, &c0, e, i, j, NULL));
                expect_padding_intact(&d, "Lt D");
                if (!inplace) /* C read only */
                    for (int e = 0; e < batch; e++)
                        for (int j = 0; j < n; j++)
                            for (int i = 0; i < m; i++)
                                cr_assert_eq(dev_at(&cm, e, i, j), mat_at(&cm, e, i, j));
                free(c0.v);
                mat_free(&a);
                mat_free(&b);
                mat_free(&cm);
                if (!inplace)
                    mat_free(&d);
            }
}

/* The aux and bias buffers of the epilogue tests: a vector of `len` with two SENTINEL elements after it. */
static void *vec_new(int len, cudaDataType_t t, double *vals)
{
    void *p = dev((size_t)(len + 2) * tsize(t));
    for (int i = 0; i < len + 2; i++)
        put(p, t, i, i < len ? rnd(fmt_of(t), vals[i]) : SENTINEL);
    return p;
}

/* BIAS, RELU, RELU_BIAS: exact. The bias runs along D's rows (one value per row i, broadcast over the
 * columns), is added before the activation, in D's type or, when set, BIAS_DATA_TYPE fp32. */
Test(emu_cublaslt, bias_and_relu)
{
    const int m = 10, n = 7, k = 6;
    static const cublasLtEpilogue_t epis[] = {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_RELU,
                                              CUBLASLT_EPILOGUE_RELU_BIAS};
    for (size_t ei = 0; ei < 3; ei++)
        for (int ty = 0; ty < 3; ty++) {
            /* 0: fp32; 1: bf16 with a bf16 bias; 2: bf16 with an fp32 bias */
            cudaDataType_t t = ty ? CUDA_R_16BF : CUDA_R_32F, bt = ty == 1 ? CUDA_R_16BF : CUDA_R_32F;
            double bv[10];
            for (int i = 0; i < m; i++)
                bv[i] = ty == 2 ? 0.5 * i - 2.25 + 0x1p-12 : 0.5 * i - 2.5; /* fp32 bias: not a bf16 value */
            struct lt_call c = lt_default();
            c.epi = epis[ei];
            c.bias = vec_new(m, bt, bv);
            c.bias_type = ty == 2 ? CUDA_R_32F : -1;
            c.beta = 1.0f;
            struct mat a = mat_new(m, k, m, 1, 0, t, g_int8);
            struct mat b = mat_new(k, n, k, 1, 0, t, g_int8);
            struct mat d = mat_new(m, n, m, 1, 0, t, g_int8);
            struct mat c0 = d;
            c0.v = malloc(mat_elems(&d) * sizeof(double));
            memcpy(c0.v, d.v, mat_elems(&d) * sizeof(double));
            cublasStatus_t heur;
            cr_assert_eq(lt_run(&c, &a, &b, &d, &d, &heur), CUBLAS_STATUS_SUCCESS);
            cr_assert_eq(heur, CUBLAS_STATUS_SUCCESS);
            bool has_bias = c.epi != CUBLASLT_EPILOGUE_RELU, relu = c.epi != CUBLASLT_EPILOGUE_BIAS;
            int zeroed = 0;
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    double v = ref_elem(&a, false, &b, false, k, F_F32, 1, 1, &c0, 0, i, j, NULL);
                    if (has_bias)
                        v = (float)(v + get(c.bias, bt, i)); /* fp32 sum, then D's rounding */
                    if (relu && v < 0) {
                        v = 0;
                        zeroed++;
                    }
                    cr_assert_eq(dev_at(&d, 0, i, j), rnd(fmt_of(t), v), "epi %d type %d (%d, %d)", (int)c.epi, ty, i,
                                 j);
                }
            if (relu)
                cr_assert_gt(zeroed, 0);
            emu_device_free((void *)c.bias);
            free(c0.v);
            mat_free(&a);
            mat_free(&b);
            mat_free(&d);
        }
}

/* GELU, GELU_BIAS, GELU_AUX, GELU_AUX_BIAS: D is the tanh GELU of alpha AB + beta C (+ bias) within fp32's
 * rounding; the aux matrix (ld past m, its padding untouched) holds that GELU input exactly, in D's type. */
Test(emu_cublaslt, gelu_forward_and_aux)
{
    const int m = 11, n = 5, k = 4;
    static const cublasLtEpilogue_t epis[] = {CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_BIAS,
                                              CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS};
    for (size_t ei = 0; ei < 4; ei++)
        for (int ty = 0; ty < 2; ty++) {
            cudaDataType_t t = ty ? CUDA_R_16BF : CUDA_R_32F;
            bool bias = epis[ei] & CUBLASLT_EPILOGUE_BIAS, aux = epis[ei] & 128;
            double bv[11];
            for (int i = 0; i < m; i++)
                bv[i] = 0.25 * i - 1;
            struct lt_call c = lt_default();
            c.epi = epis[ei];
            c.alpha = 0.25f;
            c.beta = 0.5f;
            c.bias = bias ? vec_new(m, t, bv) : NULL;
            struct mat auxm = mat_new(m, n, m + 5, 1, 0, t, g_nan); /* the matrix proper NaN: all written */
            if (aux) {
                c.aux = auxm.p;
                c.aux_ld = auxm.ld;
            }
            struct mat a = mat_new(m, k, m, 1, 0, t, g_int8);
            struct mat b = mat_new(n, k, n, 1, 0, t, g_int8);
            c.tb = CUBLAS_OP_T;
            struct mat cm = mat_new(m, n, m, 1, 0, t, g_int8);
            struct mat d = mat_new(m, n, m + 2, 1, 0, t, g_nan);
            cublasStatus_t heur;
            cr_assert_eq(lt_run(&c, &a, &b, &cm, &d, &heur), CUBLAS_STATUS_SUCCESS);
            cr_assert_eq(heur, CUBLAS_STATUS_SUCCESS);
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    double x = ref_elem(&a, false, &b, true, k, F_F32, 0.25, 0.5, &cm, 0, i, j, NULL);
                    if (bias)
                        x += bv[i];
                    double want = gelu_ref(x), got = dev_at(&d, 0, i, j);
                    double tol = ty ? 0x1p-8 * fabs(want) + 1e-30 : 0x1p-22 * fabs(want) + 1e-30;
                    cr_assert(fabs(got - want) <= tol, "epi %d type %d (%d, %d): gelu(%g) = %.9g, got %.9g",
                              (int)c.epi, ty, i, j, x, want, got);
                    if (aux)
                        cr_assert_eq(dev_at(&auxm, 0, i, j), rnd(fmt_of(t), x), "aux (%d, %d)", i, j);
                    else
                        cr_assert(isnan(dev_at(&auxm, 0, i, j)));
                }
            expect_padding_intact(&auxm, "aux");
            expect_padding_intact(&d, "D");
            if (c.bias)
                emu_device_free((void *)c.bias);
            mat_free(&auxm);
            mat_free(&a);
            mat_free(&b);
            mat_free(&cm);
            mat_free(&d);
        }
}

/* DGELU and DGELU_BGRAD: D = (alpha AB + beta C) * gelu'(aux); the bias gradient, D's rows long, is each
 * row's sum over D's columns. */
Test(emu_cublaslt, dgelu_and_bias_gradient)
{
    const int m = 9, n = 12, k = 3;
    for (int bgrad = 0; bgrad < 2; bgrad++) {
        struct lt_call c = lt_default();
        c.epi = bgrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
        c.beta = 1.0f;
        struct mat auxm = mat_new(m, n, m + 7, 1, 0, CUDA_R_32F, g_unif);
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) /* pre-activations spread over [-4, 4] */
                put(auxm.p, CUDA_R_32F, (int64_t)j * auxm.ld + i,
                    auxm.v[(size_t)j * (size_t)auxm.ld + (size_t)i] *= 4);
        c.aux = auxm.p;
        c.aux_ld = auxm.ld;
        double zeros[9] = {0};
        void *bg = bgrad ? vec_new(m, CUDA_R_32F, zeros) : NULL;
        c.bias = bg;
        struct mat a = mat_new(m, k, m, 1, 0, CUDA_R_32F, g_int8);
        struct mat b = mat_new(k, n, k, 1, 0, CUDA_R_32F, g_int8);
        struct mat d = mat_new(m, n, m, 1, 0, CUDA_R_32F, g_int8);
        struct mat c0 = d;
        c0.v = malloc(mat_elems(&d) * sizeof(double));
        memcpy(c0.v, d.v, mat_elems(&d) * sizeof(double));
        cublasStatus_t heur;
        cr_assert_eq(lt_run(&c, &a, &b, &d, &d, &heur), CUBLAS_STATUS_SUCCESS);
        cr_assert_eq(heur, CUBLAS_STATUS_SUCCESS);
        for (int i = 0; i < m; i++) {
            double sum = 0, mag = 0;
            for (int j = 0; j < n; j++) {
                double g = ref_elem(&a, false, &b, false, k, F_F32, 1, 1, &c0, 0, i, j, NULL);
                double want = g * gelu_grad_ref(mat_at(&auxm, 0, i, j));
                cr_assert(fabs(dev_at(&d, 0, i, j) - want) <= 0x1p-22 * fabs(want) + 1e-30, "(%d, %d): %.9g, %.9g", i,
                          j, dev_at(&d, 0, i, j), want);
                sum += want;
                mag += fabs(want);
            }
            if (bgrad)
                cr_assert(fabs(get(bg, CUDA_R_32F, i) - sum) <= (n + 2) * 0x1p-23 * mag, "bgrad %d: %.9g, %.9g", i,
                          get(bg, CUDA_R_32F, i), sum);
        }
        if (bgrad) {
            cr_assert_eq(get(bg, CUDA_R_32F, m), SENTINEL);
            emu_device_free(bg);
        }
        mat_free(&auxm);
        mat_free(&a);
        mat_free(&b);
        mat_free(&d);
        free(c0.v);
    }
}

/* BGRADA: bias[i] = sum over k of op(A)[i, :] (D's rows long, op(A) = N); BGRADB: bias[j] = sum over k of
 * op(B)[:, j] (D's columns long, op(B) = T). Not scaled by alpha; D the plain product. Exact, in fp32 and bf16. */
Test(emu_cublaslt, bias_gradients_of_a_and_b)
{
    const int m = 10, n = 6, k = 7;
    for (int which = 0; which < 2; which++)
        for (int other = 0; other < 2; other++)
            for (int ty = 0; ty < 2; ty++) {
                cudaDataType_t t = ty ? CUDA_R_16BF : CUDA_R_32F;
                struct lt_call c = lt_default();
                c.epi = which ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA;
                c.ta = which ? (other ? CUBLAS_OP_T : CUBLAS_OP_N) : CUBLAS_OP_N;
                c.tb = which ? CUBLAS_OP_T : (other ? CUBLAS_OP_T : CUBLAS_OP_N);
                c.alpha = 2.0f;
                bool ta = c.ta == CUBLAS_OP_T, tb = c.tb == CUBLAS_OP_T;
                int len = which ? n : m;
                double zeros[10] = {0};
                void *bg = vec_new(len, t, zeros);
                c.bias = bg;
                struct mat a = mat_new(ta ? k : m, ta ? m : k, ta ? k : m, 1, 0, t, g_int8);
                struct mat b = mat_new(tb ? n : k, tb ? k : n, tb ? n : k, 1, 0, t, g_int8);
                struct mat d = mat_new(m, n, m, 1, 0, t, g_nan);
                cublasStatus_t heur;
                cr_assert_eq(lt_run(&c, &a, &b, &d, &d, &heur), CUBLAS_STATUS_SUCCESS);
                cr_assert_eq(heur, CUBLAS_STATUS_SUCCESS);
                for (int i = 0; i < len; i++) {
                    double s = 0;
                    for (int p = 0; p < k; p++)
                        s += which ? mat_at(&b, 0, i, p) : mat_at(&a, 0, i, p);
                    cr_assert_eq(get(bg, t, i), rnd(fmt_of(t), s), "%s %d: %g, want %g", which ? "BGRADB" : "BGRADA",
                                 i, get(bg, t, i), s);
                }
                cr_assert_eq(get(bg, t, len), SENTINEL);
                for (int j = 0; j < n; j++)
                    for (int i = 0; i < m; i++)
                        cr_assert_eq(dev_at(&d, 0, i, j),
                                     rnd(fmt_of(t), ref_elem(&a, ta, &b, tb, k, F_F32, 2, 0, NULL, 0, i, j, NULL)));
                emu_device_free(bg);
                mat_free(&a);
                mat_free(&b);
                mat_free(&d);
            }
}

/* RELU_AUX_BIAS writes a bit mask (bit j * ld + i, ld in bits, set where the ReLU input is >= 0, bits past m
 * untouched) that DRELU_BGRAD reads back. */
Test(emu_cublaslt, relu_mask_round_trip)
{
    const int m = 13, n = 5, k = 3;
    const int64_t ld = 128;
    uint8_t *mask = dev((size_t)(ld / 8) * n);
    memset(mask, 0xAA, (size_t)(ld / 8) * n);
    struct mat a = mat_new(m, k, m, 1, 0, CUDA_R_32F, g_int8);
    struct mat b = mat_new(k, n, k, 1, 0, CUDA_R_32F, g_int8);
    /* the even rows' bias cancels column 0's product: ReLU inputs of exactly 0, whose bit is set */
    double bv[13];
    for (int i = 0; i < m; i++)
        bv[i] = i % 2 ? 0.5 * i - 3 : -ref_elem(&a, false, &b, false, k, F_F32, 1, 0, NULL, 0, i, 0, NULL);
    struct lt_call c = lt_default();
    c.epi = CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
    c.bias = vec_new(m, CUDA_R_32F, bv);
    c.aux = mask;
    c.aux_ld = ld;
    struct mat d = mat_new(m, n, m, 1, 0, CUDA_R_32F, g_int8);
    cublasStatus_t heur;
    cr_assert_eq(lt_run(&c, &a, &b, &d, &d, &heur), CUBLAS_STATUS_SUCCESS);
    int set = 0;
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < 16; i++) {
            bool bit = (mask[j * ld / 8 + i / 8] >> (i % 8)) & 1;
            if (i >= m) {
                cr_assert_eq(bit, (bool)((0xAA >> (i % 8)) & 1), "bit %d of column %d past m changed", i, j);
                continue;
            }
            double v = ref_elem(&a, false, &b, false, k, F_F32, 1, 0, NULL, 0, i, j, NULL) + bv[i];
            cr_assert_eq(bit, v >= 0, "(%d, %d): %g", i, j, v);
            set += bit;
            cr_assert_eq(dev_at(&d, 0, i, j), v > 0 ? v : 0);
        }
        for (int byte = 2; byte < ld / 8; byte++)
            cr_assert_eq(mask[j * ld / 8 + byte], 0xAA);
    }
    cr_assert(set > 0 && set < m * n);
    emu_device_free((void *)c.bias);
    /* backward */
    double zeros[13] = {0};
    void *bg = vec_new(m, CUDA_R_32F, zeros);
    struct lt_call g = lt_default();
    g.epi = CUBLASLT_EPILOGUE_DRELU_BGRAD;
    g.aux = mask;
    g.aux_ld = ld;
    g.bias = bg;
    struct mat d2 = mat_new(m, n, m, 1, 0, CUDA_R_32F, g_int8);
    cr_assert_eq(lt_run(&g, &a, &b, &d2, &d2, &heur), CUBLAS_STATUS_SUCCESS);
    for (int i = 0; i < m; i++) {
        double sum = 0;
        for (int j = 0; j < n; j++) {
            bool bit = (mask[j * ld / 8 + i / 8] >> (i % 8)) & 1;
            double v = bit ? ref_elem(&a, false, &b, false, k, F_F32, 1, 0, NULL, 0, i, j, NULL) : 0;
            cr_assert_eq(dev_at(&d2, 0, i, j), v);
            sum += v;
        }
        cr_assert_eq(get(bg, CUDA_R_32F, i), sum);
    }
    emu_device_free(bg);
    emu_device_free(mask);
    mat_free(&a);
    mat_free(&b);
    mat_free(&d);
    mat_free(&d2);
}

/* Batched epilogues: the bias and aux advance by their batch strides. */
Test(emu_cublaslt, batched_bias_and_aux)
{
    const int m = 8, n = 4, k = 3, batch = 3;
    double bv[3 * 8];
    for (int i = 0; i < batch * m; i++)
        bv[i] = i - 10;
    struct lt_call c = lt_default();
    c.epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    c.bias = vec_new(batch * m, CUDA_R_32F, bv);
    c.bias_stride = m;
    struct mat auxm = mat_new(m, n, m, batch, (long long)m * n, CUDA_R_32F, g_nan);
    c.aux = auxm.p;
    c.aux_ld = m;
    c.aux_stride = (int64_t)m * n;
    struct mat a = mat_new(m, k, m, batch, (long long)m * k, CUDA_R_32F, g_int8);
    struct mat b = mat_new(k, n, k, batch, (long long)k * n, CUDA_R_32F, g_int8);
    struct mat d = mat_new(m, n, m, batch, (long long)m * n, CUDA_R_32F, g_nan);
    cublasStatus_t heur;
    cr_assert_eq(lt_run(&c, &a, &b, &d, &d, &heur), CUBLAS_STATUS_SUCCESS);
    for (int e = 0; e < batch; e++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double x = ref_elem(&a, false, &b, false, k, F_F32, 1, 0, NULL, e, i, j, NULL) + bv[e * m + i];
                cr_assert_eq(dev_at(&auxm, e, i, j), x);
                cr_assert(fabs(dev_at(&d, e, i, j) - gelu_ref(x)) <= 0x1p-22 * fabs(gelu_ref(x)) + 1e-30);
            }
    emu_device_free((void *)c.bias);
    mat_free(&auxm);
    mat_free(&a);
    mat_free(&b);
    mat_free(&d);
}

/* What cublasLtMatmul (and its heuristic) refuse, and with which status. */
Test(emu_cublaslt, validation)
{
    const int m = 8, n = 4, k = 4;
    struct mat a = mat_new(m, k, m, 1, 0, CUDA_R_32F, g_int8);
    struct mat b = mat_new(k, n, k, 1, 0, CUDA_R_32F, g_int8);
    struct mat d = mat_new(m, n, m, 1, 0, CUDA_R_32F, g_int8);
    struct mat a16 = mat_new(m, k, m, 1, 0, CUDA_R_16BF, g_int8);
    struct mat b16 = mat_new(k, n, k, 1, 0, CUDA_R_16BF, g_int8);
    struct mat d16 = mat_new(m, n, m, 1, 0, CUDA_R_16BF, g_int8);
    struct mat wrong = mat_new(m + 1, k, m + 1, 1, 0, CUDA_R_32F, g_int8); /* A with a row too many */
    struct mat aux = mat_new(m, n, m, 1, 0, CUDA_R_32F, g_int8);
    struct mat two = mat_new(m, n, m, 2, (long long)m * n, CUDA_R_32F, g_int8);
    void *bias = dev(64 * 4);
    cublasStatus_t heur, s;
    struct lt_call c;
#define EXPECT(call_heur, call_mm, A, B, C, D)                                                                        \
    do {                                                                                                          \
        s = lt_run(&c, A, B, C, D, &heur);                                                                        \
        cr_assert_eq(heur, call_heur, "line %d: heuristic %s", __LINE__, cublasGetStatusName(heur));              \
        cr_assert_eq(s, call_mm, "line %d: matmul %s", __LINE__, cublasGetStatusName(s));                         \
    } while (0)
    c = lt_default();
    EXPECT(0, 0, &a, &b, &d, &d);
    EXPECT(7, 7, &wrong, &b, &d, &d); /* A's shape does not match D's */
    c.ta = CUBLAS_OP_T;
    EXPECT(7, 7, &a, &b, &d, &d); /* op(A) = A^T is 4 x 8 */
    c = lt_default();
    EXPECT(7, 7, &a, &b, &d, &two); /* batch counts differ */
    EXPECT(15, 15, &a16, &b, &d, &d); /* A bf16, B fp32 */
    EXPECT(15, 15, &a16, &b16, &d16, &d); /* C and D types differ */
    EXPECT(0, 0, &a16, &b16, &d16, &d16);
    EXPECT(0, 0, &a16, &b16, &d, &d); /* bf16 in, fp32 out */
    c.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    EXPECT(15, 15, &a16, &b16, &d, &d); /* the _FAST_ types take fp32 only */
    EXPECT(0, 0, &a, &b, &d, &d);
    c.compute = CUBLAS_COMPUTE_64F;
    EXPECT(15, 15, &a, &b, &d, &d);
    c = lt_default();
    c.scale = CUDA_R_16F;
    EXPECT(15, 15, &a, &b, &d, &d);
    c = lt_default();
    c.epi = (cublasLtEpilogue_t)1024;
    EXPECT(15, 15, &a, &b, &d, &d);
    /* the epilogues' buffers */
    c = lt_default();
    c.epi = CUBLASLT_EPILOGUE_GELU_AUX;
    c.aux = aux.p;
    c.aux_ld = m - 1;
    EXPECT(7, 7, &a, &b, &d, &d); /* aux ld below D's rows */
    c.aux_ld = m;
    EXPECT(0, 0, &a, &b, &d, &d);
    c.aux = NULL;
    EXPECT(0, 15, &a, &b, &d, &d); /* no aux output */
    c = lt_default();
    c.epi = CUBLASLT_EPILOGUE_GELU_AUX;
    c.aux = aux.p;
    c.aux_ld = m;
    c.aux_type = CUDA_R_32F;
    EXPECT(0, 0, &a, &b, &d, &d); /* D's type, said explicitly */
    c.aux_type = CUDA_R_16BF;
    EXPECT(7, 7, &a, &b, &d, &d); /* another type */
    c = lt_default();
    c.epi = CUBLASLT_EPILOGUE_DGELU;
    c.aux_ld = m;
    EXPECT(0, 7, &a, &b, &d, &d); /* no aux input */
    c = lt_default();
    c.epi = CUBLASLT_EPILOGUE_RELU_AUX;
    c.aux = aux.p;
    c.aux_ld = 64;
    EXPECT(7, 7, &a, &b, &d, &d); /* a mask ld not a multiple of 128 */
    c.aux_ld = 0;
    EXPECT(7, 7, &a, &b, &d, &d);
    c = lt_default();
    c.epi = CUBLASLT_EPILOGUE_BIAS;
    EXPECT(0, 7, &a, &b, &d, &d); /* no bias */
    c.bias = bias;
    c.bias_type = CUDA_R_16F;
    EXPECT(7, 7, &a, &b, &d, &d); /* a bias type neither D's nor fp32 */
    c.bias_type = CUDA_R_32F;
    EXPECT(0, 0, &a16, &b16, &d16, &d16); /* fp32 bias for bf16 D */
    c = lt_default();
    c.epi = CUBLASLT_EPILOGUE_DGELU_BGRAD;
    c.aux = aux.p;
    c.aux_ld = m;
    EXPECT(0, 7, &a, &b, &d, &d); /* no bias-gradient output */
    c = lt_default();
    c.epi = CUBLASLT_EPILOGUE_BGRADA;
    c.bias = bias;
    c.ta = CUBLAS_OP_T;
    struct mat at = mat_new(k, m, k, 1, 0, CUDA_R_32F, g_int8);
    EXPECT(15, 15, &at, &b, &d, &d); /* BGRADA with op(A) = T */
    c = lt_default();
    c.epi = CUBLASLT_EPILOGUE_BGRADB;
    c.bias = bias;
    EXPECT(15, 15, &a, &b, &d, &d); /* BGRADB with op(B) = N */
#undef EXPECT
    mat_free(&at);

    /* descriptor-level checks, one attribute at a time */
    cublasLtHandle_t lt;
    cr_assert_eq(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDesc_t desc;
    cr_assert_eq(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), 0);
    cublasLtMatrixLayout_t la = layout_of(&a), lb = layout_of(&b), ld = layout_of(&d);
    float one = 1.0f;
#define MM(h, dd) cublasLtMatmul(h, dd, &one, a.p, la, b.p, lb, &one, d.p, ld, d.p, ld, NULL, NULL, 0, NULL)
    cr_assert_eq(MM(lt, desc), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(MM((cublasLtHandle_t)NULL, desc), CUBLAS_STATUS_NOT_INITIALIZED);
    cr_assert_eq(MM(lt, (cublasLtMatmulDesc_t)NULL), CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(cublasLtMatmul(lt, desc, NULL, a.p, la, b.p, lb, &one, d.p, ld, d.p, ld, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_INVALID_VALUE);
    /* a cublasHandle_t serves as a cublasLtHandle_t */
    cublasHandle_t h = handle_new();
    cr_assert_eq(MM((cublasLtHandle_t)h, desc), CUBLAS_STATUS_SUCCESS);
    cublasDestroy(h);
    int32_t i32 = CUBLASLT_POINTER_MODE_DEVICE;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &i32, sizeof i32), 0);
    cr_assert_eq(MM(lt, desc), CUBLAS_STATUS_NOT_SUPPORTED);
    i32 = CUBLASLT_POINTER_MODE_HOST;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &i32, sizeof i32), 0);
    i32 = CUBLAS_OP_T;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSC, &i32, sizeof i32), 0);
    cr_assert_eq(MM(lt, desc), CUBLAS_STATUS_NOT_SUPPORTED);
    i32 = CUBLAS_OP_N;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSC, &i32, sizeof i32), 0);
    i32 = 9;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &i32, sizeof i32), 0);
    cr_assert_eq(MM(lt, desc), CUBLAS_STATUS_INVALID_VALUE);
    i32 = CUBLAS_OP_N;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &i32, sizeof i32), 0);
    const void *scale = bias;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale, sizeof scale), 0);
    cr_assert_eq(MM(lt, desc), CUBLAS_STATUS_INVALID_VALUE); /* fp8 scaling with fp32 data */
    scale = NULL;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale, sizeof scale), 0);
    cr_assert_eq(MM(lt, desc), CUBLAS_STATUS_SUCCESS);
    /* attribute sizes */
    int64_t i64 = 5;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &i32, sizeof i32),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, NULL, 8),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, (cublasLtMatmulDescAttributes_t)9999, &i64, sizeof i64),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &i64, sizeof i64), 0);
    size_t w = 0;
    i64 = 0;
    cr_assert_eq(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &i64, sizeof i64, &w), 0);
    cr_assert_eq(i64, 5);
    cr_assert_eq(w, 8u);
    cr_assert_eq(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &i32, sizeof i32, &w),
                 CUBLAS_STATUS_INVALID_VALUE);
    w = 0;
    cr_assert_eq(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, NULL, 0, &w), 0);
    cr_assert_eq(w, sizeof(void *));
    cr_assert_eq(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, NULL, 0, NULL),
                 CUBLAS_STATUS_INVALID_VALUE);
    uint32_t epi = 0;
    cr_assert_eq(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi, NULL), 0);
    cr_assert_eq(epi, CUBLASLT_EPILOGUE_DEFAULT);
    cr_assert_eq(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &i32, sizeof i32,
                                                NULL),
                 0);
    cr_assert_eq(i32, -1);
    cr_assert_eq(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &i32, sizeof i32, NULL), 0);
    cr_assert_eq(i32, CUBLAS_COMPUTE_32F);
    /* layouts */
    int32_t order = CUBLASLT_ORDER_ROW;
    cr_assert_eq(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof order), 0);
    cr_assert_eq(MM(lt, desc), CUBLAS_STATUS_NOT_SUPPORTED);
    order = CUBLASLT_ORDER_COL;
    cr_assert_eq(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof order), 0);
    i64 = m - 1;
    cr_assert_eq(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_LD, &i64, sizeof i64), 0);
    cr_assert_eq(MM(lt, desc), CUBLAS_STATUS_INVALID_VALUE); /* ld below the rows */
    i64 = m;
    cr_assert_eq(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_LD, &i64, sizeof i64), 0);
    uint64_t rows = 0;
    cr_assert_eq(cublasLtMatrixLayoutGetAttribute(la, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows, &w), 0);
    cr_assert_eq(rows, (uint64_t)m);
    cr_assert_eq(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_ROWS, &i32, sizeof i32),
                 CUBLAS_STATUS_INVALID_VALUE);
    /* the heuristic */
    cublasLtMatmulPreference_t pref;
    cr_assert_eq(cublasLtMatmulPreferenceCreate(&pref), 0);
    cublasLtMatmulHeuristicResult_t r;
    int got = 7;
    cr_assert_eq(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 0, &r, &got),
                 CUBLAS_STATUS_INVALID_VALUE);
    cr_assert_eq(cublasLtMatmulAlgoGetHeuristic(NULL, desc, la, lb, ld, ld, pref, 1, &r, &got),
                 CUBLAS_STATUS_NOT_INITIALIZED);
    cr_assert_eq(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &r, &got), 0);
    cr_assert_eq(got, 1);
    uint64_t wsmax = 0;
    cr_assert_eq(cublasLtMatmulPreferenceGetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsmax,
                                                      sizeof wsmax, NULL),
                 0);
    cr_assert_eq(wsmax, 0u);
    cublasLtMatmulPreferenceDestroy(pref);
    /* descriptors initialised in the caller's storage, as cublasLt*Init does */
    cublasLtMatmulDescOpaque_t dop;
    cublasLtMatrixLayoutOpaque_t lop;
    memset(&dop, 0, sizeof dop);
    cr_assert_eq(MM(lt, &dop), CUBLAS_STATUS_INVALID_VALUE); /* never initialised */
    cr_assert_eq(cublasLtMatmulDescInit(&dop, CUBLAS_COMPUTE_32F, CUDA_R_32F), 0);
    cr_assert_eq(cublasLtMatrixLayoutInit(&lop, CUDA_R_32F, m, n, m), 0);
    cr_assert_eq(cublasLtMatmul(lt, &dop, &one, a.p, la, b.p, lb, &one, d.p, &lop, d.p, &lop, NULL, NULL, 0, NULL),
                 CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cublasLtMatmulDescInit_internal(&dop, 8, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_ALLOC_FAILED);
#undef MM
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cr_assert_eq(cublasLtDestroy(lt), 0);
    cr_assert_eq(emu_sticky_error(), cudaSuccess);
    emu_device_free(bias);
    mat_free(&a);
    mat_free(&b);
    mat_free(&d);
    mat_free(&a16);
    mat_free(&b16);
    mat_free(&d16);
    mat_free(&wrong);
    mat_free(&aux);
    mat_free(&two);
}

/* Lt range checks: a bias vector or aux matrix too small is a device fault; C is not checked when beta == 0
 * (it may be NULL then). */
Test(emu_cublaslt, range_check)
{
    emu_stub_reset();
    const int m = 8, n = 4, k = 4;
    struct mat a = mat_new(m, k, m, 1, 0, CUDA_R_32F, g_int8);
    struct mat b = mat_new(k, n, k, 1, 0, CUDA_R_32F, g_int8);
    struct mat d = mat_new(m, n, m, 1, 0, CUDA_R_32F, g_int8);
    struct mat cnull = d;
    cnull.p = NULL;
    cublasStatus_t heur;
    struct lt_call c = lt_default();
    cr_assert_eq(lt_run(&c, &a, &b, &cnull, &d, &heur), CUBLAS_STATUS_SUCCESS); /* beta == 0, C NULL */
    c.beta = 1.0f;
    cr_assert_eq(lt_run(&c, &a, &b, &cnull, &d, &heur), CUBLAS_STATUS_EXECUTION_FAILED);
    cr_assert(strstr(emu_stub_last_failure(), "cublasLtMatmul: C "), "%s", emu_stub_last_failure());
    emu_stub_reset();
    c = lt_default();
    c.epi = CUBLASLT_EPILOGUE_BIAS;
    c.bias = dev((size_t)(m - 1) * 4);
    cr_assert_eq(lt_run(&c, &a, &b, &d, &d, &heur), CUBLAS_STATUS_EXECUTION_FAILED);
    cr_assert(strstr(emu_stub_last_failure(), "bias"), "%s", emu_stub_last_failure());
    emu_device_free((void *)c.bias);
    emu_stub_reset();
    c = lt_default();
    c.epi = CUBLASLT_EPILOGUE_GELU_AUX;
    c.aux = dev((size_t)m * n * 4 - 4);
    c.aux_ld = m;
    cr_assert_eq(lt_run(&c, &a, &b, &d, &d, &heur), CUBLAS_STATUS_EXECUTION_FAILED);
    cr_assert(strstr(emu_stub_last_failure(), "aux"), "%s", emu_stub_last_failure());
    emu_device_free(c.aux);
    emu_stub_reset();
    mat_free(&a);
    mat_free(&b);
    mat_free(&d);
}

/* ---------------------------------------------------------------------------------------------------------
 * Speed (printed, not asserted)
 * --------------------------------------------------------------------------------------------------------- */

static void speed(cublasHandle_t h, int m, int n, int k, cudaDataType_t t, cublasComputeType_t compute, int reps)
{
    void *a = dev((size_t)m * k * tsize(t)), *b = dev((size_t)k * n * tsize(t)), *c = dev((size_t)m * n * 4);
    memset(a, 0x3c, (size_t)m * k * tsize(t)); /* small finite values in every type */
    memset(b, 0x3c, (size_t)k * n * tsize(t));
    float one = 1.0f, zero = 0.0f;
    double t0 = clock_now_s();
    for (int r = 0; r < reps; r++)
        cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, m, n, k, &one, a, t, m, b, t, n, &zero, c, CUDA_R_32F, m,
                                  compute, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    double s = (clock_now_s() - t0) / reps;
    printf("emu cuBLAS speed: %4d x %4d x %4d, %s inputs, compute %d: %8.3f ms, %.2f GFLOP/s\n", m, n, k,
           t == CUDA_R_32F ? "fp32" : "bf16", (int)compute, s * 1e3, 2.0 * m * n * k / s * 1e-9);
    fflush(stdout);
    emu_device_free(a);
    emu_device_free(b);
    emu_device_free(c);
}

Test(emu_cublas, speed, .timeout = 300)
{
    cublasHandle_t h = handle_new();
    speed(h, 256, 256, 64, CUDA_R_32F, CUBLAS_COMPUTE_32F, 20);
    speed(h, 256, 256, 64, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 20);
    speed(h, 256, 256, 64, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 20);
    speed(h, 512, 512, 512, CUDA_R_32F, CUBLAS_COMPUTE_32F, 2);
    speed(h, 1024, 1024, 1024, CUDA_R_32F, CUBLAS_COMPUTE_32F, 1);
    cublasDestroy(h);
}
