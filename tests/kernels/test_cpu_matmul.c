/* The CPU backend's matmuls (kernels/cpu/matmul.c, onednn.c, lowp.c): bf16 products against a double
 * reference, bound bf16 copies read as they are, the primitive cache, the fp32 libraries, the forced
 * fallback of a CPU without bf16 instructions, and the threads oneDNN runs on.
 *
 * Tolerances. In bf16 mode each operand is rounded to bf16 (8 significant bits: relative error <= 2^-8 per
 * element, round to nearest) and the
 * products of bf16 values are exact in fp32, accumulated in fp32. So against the double product of the
 * ROUNDED operands the error is fp32 accumulation only: <= k 2^-24 sum|a b| in the worst order; 1e-5
 * sum|a b| bounds it for k <= 160 and is far above the ~sqrt(k) 2^-24 typical (measured below 1e-6). Against
 * the double product of the fp32 operands the rounding adds at most (2^-8 + 2^-8 + 2^-16) sum|a b|: the
 * bound there is 2^-7 sum|a b| + the accumulation term. Each test checks both, so a product that ignored the
 * rounding (fp32 compute: about 1e-3 from the rounded product) or rounded more (bf16 accumulation, ~2^-8 per
 * partial sum) fails the first. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"
#include "tests/util/tu_kernels.h"

static const struct kernels *cpu_or_skip_bf16(void)
{
    const struct kernels *k = kernels_cpu();
    if (!(k->matmul_dtypes & DTYPE_BIT(DTYPE_BF16)))
        cr_skip_test("this CPU has no bf16 matmul instructions (oneDNN runs %s): the fallback is tested instead",
                     cpu_isa_get()->name);
    return k;
}

static float bf(float x)
{
    return dtype_bf16_to_f32(dtype_f32_to_bf16(x));
}

/* Element (i, j) of op(x) for a row-major x with leading dimension ld. */
static double at(const float *x, int ld, int trans, int i, int j, int round)
{
    float v = trans ? x[(size_t)j * ld + i] : x[(size_t)i * ld + j];
    return round ? bf(v) : v;
}

/* c (m x n, ldc) against alpha op(a) op(b) + beta c0 in double, with (round = 1) and without the bf16
 * rounding of a and b; tol_rounded / tol_exact are multiples of sum |alpha a b| (+ |beta c0|). */
static void check_gemm(const char *what, const float *c, int ldc, const float *c0, int ta, int tb, int m, int n,
                       int k, float alpha, const float *a, int lda, const float *b, int ldb, float beta,
                       double tol_rounded, double tol_exact)
{
    double worst = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double r = 0, e = 0, mag = 0;
            for (int q = 0; q < k; q++) {
                r += at(a, lda, ta, i, q, 1) * at(b, ldb, tb, q, j, 1);
                e += at(a, lda, ta, i, q, 0) * at(b, ldb, tb, q, j, 0);
                mag += fabs(at(a, lda, ta, i, q, 0) * at(b, ldb, tb, q, j, 0));
            }
            double old = c0 ? c0[(size_t)i * ldc + j] : 0;
            r = alpha * r + beta * old, e = alpha * e + beta * old;
            mag = fabs(alpha) * mag + fabs(beta * old) + 1e-30;
            double got = c[(size_t)i * ldc + j];
            double er = fabs(got - r) / mag, ee = fabs(got - e) / mag;
            worst = er > worst ? er : worst;
            if (!(er <= tol_rounded) || !(ee <= tol_exact))
                cr_assert_fail("%s: c[%d][%d] = %.9g; rounded-operand product %.9g (err %.3g of sum|ab|, bound "
                               "%.3g), fp32-operand product %.9g (err %.3g, bound %.3g)",
                               what, i, j, got, r, er, tol_rounded, e, ee, tol_exact);
        }
    cr_log_info("%s: largest error against the rounded-operand product %.3g of sum|ab|", what, worst);
}

#define TOL_ACC 1e-5
#define TOL_BF16 (1.0 / 128 + 1.0 / 65536 + TOL_ACC)

/* Every transpose pair, leading dimensions past the columns, alpha and beta, odd and GPT-2 shapes. */
Test(cpu_matmul, bf16_gemm_against_double_reference)
{
    const struct kernels *k = cpu_or_skip_bf16();
    cr_assert_eq(k->set_matmul_dtype(DTYPE_BF16), 0, "%s", error_message());
    const int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 47, 29}, {64, 192, 64}, {130, 96, 160}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int m = shapes[s][0], n = shapes[s][1], kk = shapes[s][2];
                int lda = (ta ? m : kk) + 3, ldb = (tb ? kk : n) + 1, ldc = n + 2;
                size_t na = (size_t)(ta ? kk : m) * lda, nb = (size_t)(tb ? n : kk) * ldb, nc = (size_t)m * ldc;
                float *a = tu_host_rand(na, 100 + s, -1, 1), *b = tu_host_rand(nb, 200 + s, -1, 1);
                float *c0 = tu_host_rand(nc, 300 + s, -1, 1);
                const float alphas[2] = {1.0f, 0.5f}, betas[2] = {0.0f, 1.0f};
                for (int v = 0; v < 2; v++) {
                    float *c = malloc(nc * sizeof *c);
                    cr_assert(c);
                    memcpy(c, c0, nc * sizeof *c);
                    cr_assert_eq(k->gemm(ta, tb, m, n, kk, alphas[v], a, lda, b, ldb, betas[v], c, ldc), 0, "%s",
                                 error_message());
                    char what[96];
                    snprintf(what, sizeof what, "gemm %dx%dx%d ta=%d tb=%d alpha %g beta %g", m, n, kk, ta, tb,
                             alphas[v], betas[v]);
                    check_gemm(what, c, ldc, c0, ta, tb, m, n, kk, alphas[v], a, lda, b, ldb, betas[v], TOL_ACC,
                               TOL_BF16);
                    free(c);
                }
                free(a), free(b), free(c0);
            }
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
}

/* matmul_forward (bias) and matmul_backward (dx, dw, db accumulate) in bf16; db is a sum of fp32 dy. */
Test(cpu_matmul, bf16_linear_forward_backward)
{
    const struct kernels *k = cpu_or_skip_bf16();
    cr_assert_eq(k->set_matmul_dtype(DTYPE_BF16), 0);
    const int n = 70, in = 96, out = 40;
    float *x = tu_host_rand((size_t)n * in, 1, -1, 1), *w = tu_host_rand((size_t)in * out, 2, -1, 1);
    float *bias = tu_host_rand(out, 3, -1, 1), *dy = tu_host_rand((size_t)n * out, 4, -1, 1);
    float *dx0 = tu_host_rand((size_t)n * in, 5, -1, 1), *dw0 = tu_host_rand((size_t)in * out, 6, -1, 1);
    float *db0 = tu_host_rand(out, 7, -1, 1);
    float *y = malloc((size_t)n * out * sizeof *y), *dx = malloc((size_t)n * in * sizeof *dx);
    float *dw = malloc((size_t)in * out * sizeof *dw), *db = malloc(out * sizeof *db);
    cr_assert(y && dx && dw && db);
    cr_assert_eq(k->matmul_forward(y, x, w, bias, n, in, out), 0, "%s", error_message());
    /* y - bias is the product */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < out; j++)
            y[(size_t)i * out + j] -= bias[j];
    check_gemm("matmul_forward", y, out, NULL, 0, 0, n, out, in, 1.0f, x, in, w, out, 0.0f, TOL_ACC * 2, TOL_BF16);
    memcpy(dx, dx0, (size_t)n * in * sizeof *dx);
    memcpy(dw, dw0, (size_t)in * out * sizeof *dw);
    memcpy(db, db0, out * sizeof *db);
    cr_assert_eq(k->matmul_backward(dx, dw, db, dy, x, w, n, in, out), 0, "%s", error_message());
    check_gemm("matmul_backward dx", dx, in, dx0, 0, 1, n, in, out, 1.0f, dy, out, w, out, 1.0f, TOL_ACC, TOL_BF16);
    check_gemm("matmul_backward dw", dw, out, dw0, 1, 0, in, out, n, 1.0f, x, in, dy, out, 1.0f, TOL_ACC, TOL_BF16);
    for (int j = 0; j < out; j++) {
        double s = db0[j];
        for (int i = 0; i < n; i++)
            s += dy[(size_t)i * out + j];
        cr_assert(fabs(db[j] - s) <= 1e-5 * (fabs(s) + n), "db[%d] %.9g vs %.9g (fp32 sum of fp32 dy)", j, db[j], s);
    }
    free(x), free(w), free(bias), free(dy), free(dx0), free(dw0), free(db0), free(y), free(dx), free(dw), free(db);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
}

/* A bound bf16 copy is what the matmul reads: bind w to the bf16 of 2w and the product doubles (the fp32 w
 * is not rounded again); a sub-range (a weight inside a bound unit) reads the copy at the same offset;
 * after unbinding, w itself counts again. */
Test(cpu_matmul, bound_copy_is_read_as_is)
{
    const struct kernels *k = cpu_or_skip_bf16();
    cr_assert_eq(k->set_matmul_dtype(DTYPE_BF16), 0);
    const int n = 20, in = 64, out = 48, pad = 100;
    float *x = tu_host_rand((size_t)n * in, 11, -1, 1);
    float *unit = tu_host_rand(pad + (size_t)in * out + pad, 12, -1, 1), *w = unit + pad;
    size_t nu = 2 * pad + (size_t)in * out;
    uint16_t *lp = malloc(nu * sizeof *lp);
    float *w2 = malloc((size_t)in * out * sizeof *w2), *y = malloc((size_t)n * out * sizeof *y);
    cr_assert(lp && w2 && y);
    for (size_t i = 0; i < nu; i++)
        lp[i] = dtype_f32_to_bf16(2.0f * unit[i]);
    for (size_t i = 0; i < (size_t)in * out; i++)
        w2[i] = 2.0f * w[i];
    cr_assert_eq(k->lowp_bind(unit, lp, nu), 0, "%s", error_message());
    cr_assert_eq(k->matmul_forward(y, x, w, NULL, n, in, out), 0, "%s", error_message());
    check_gemm("bound 2w", y, out, NULL, 0, 0, n, out, in, 1.0f, x, in, w2, out, 0.0f, TOL_ACC, TOL_BF16);
    /* as the B operand of gemm, transposed (the tied LM head's layout) */
    cr_assert_eq(k->gemm(0, 1, n, in, out, 1.0f, y, out, w, out, 0.0f, x, in), 0, "%s", error_message());
    float *y2 = malloc((size_t)n * out * sizeof *y2);
    cr_assert(y2);
    memcpy(y2, y, (size_t)n * out * sizeof *y2);
    check_gemm("bound 2w^T", x, in, NULL, 0, 1, n, in, out, 1.0f, y2, out, w2, out, 0.0f, TOL_ACC, TOL_BF16);
    /* overlapping ranges and unknown unbinds are refused; a range past the bound one is not read from it */
    cr_assert_eq(k->lowp_bind(unit + 10, lp, 5), FSDP_EEXIST, "an overlapping bind was accepted");
    cr_assert(strstr(error_message(), "overlaps"), "%s", error_message());
    cr_assert_eq(k->lowp_unbind(x), FSDP_ENOTFOUND);
    cr_assert_eq(k->lowp_unbind(unit), 0, "%s", error_message());
    float *xr = tu_host_rand((size_t)n * in, 11, -1, 1);
    cr_assert_eq(k->matmul_forward(y, xr, w, NULL, n, in, out), 0, "%s", error_message());
    check_gemm("unbound w", y, out, NULL, 0, 0, n, out, in, 1.0f, xr, in, w, out, 0.0f, TOL_ACC, TOL_BF16);
    free(x), free(xr), free(unit), free(lp), free(w2), free(y), free(y2);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
}

/* A shape's primitive is made once: the second call of a shape is a cache hit, a new shape makes one more,
 * and the bf16 operand scratch does not grow on repeated calls. */
Test(cpu_matmul, primitives_cached_per_shape)
{
    const struct kernels *k = cpu_or_skip_bf16();
    cr_assert_eq(k->set_matmul_dtype(DTYPE_BF16), 0);
    const int n = 64, in = 96, out = 80;
    float *x = tu_host_rand((size_t)n * in, 21, -1, 1), *w = tu_host_rand((size_t)in * out, 22, -1, 1);
    float *y = malloc((size_t)n * out * sizeof *y);
    cr_assert(y);
    cr_assert_eq(k->matmul_forward(y, x, w, NULL, n, in, out), 0);
    struct cpu_onednn_stats s0 = cpu_onednn_stats_get();
    size_t scratch = cpu_scratch_bytes();
    cr_assert_gt(scratch, 0, "bf16 operands were not rounded into scratch");
    for (int r = 0; r < 5; r++)
        cr_assert_eq(k->matmul_forward(y, x, w, NULL, n, in, out), 0);
    struct cpu_onednn_stats s1 = cpu_onednn_stats_get();
    cr_assert_eq(s1.created, s0.created, "a cached shape made %llu more primitives", s1.created - s0.created);
    cr_assert_eq(s1.hits, s0.hits + 5);
    cr_assert_eq(cpu_scratch_bytes(), scratch, "the scratch grew for a shape it held already");
    cr_assert_eq(k->matmul_forward(y, x, w, NULL, n - 1, in, out), 0);
    cr_assert_eq(cpu_onednn_stats_get().created, s0.created + 1, "a new shape must make one primitive");
    /* fp32 (oneDNN forced) keys apart from bf16 ones: another primitive for the same shape */
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
    free(x), free(w), free(y);
}

/* Both fp32 libraries give the fp32 product (no rounding to bf16: bound 1e-5 of sum|ab| against the fp32
 * operands). FSDP_CPU_MATMUL is read once per process: each Criterion test runs in its own process. */
static void f32_library_case(const char *lib)
{
    setenv("FSDP_CPU_MATMUL", lib, 1);
    const struct kernels *k = kernels_cpu();
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
    struct cpu_onednn_stats s0 = cpu_onednn_stats_get();
    const int m = 130, n = 96, kk = 160;
    float *a = tu_host_rand((size_t)m * kk, 31, -1, 1), *b = tu_host_rand((size_t)kk * n, 32, -1, 1);
    float *c = calloc((size_t)m * n, sizeof *c);
    cr_assert(c);
    for (int ta = 0; ta < 2; ta++) {
        cr_assert_eq(k->gemm(ta, 1, m, n, kk, 1.0f, a, ta ? m : kk, b, kk, 0.0f, c, n), 0, "%s", error_message());
        char what[64];
        snprintf(what, sizeof what, "fp32 %s gemm ta=%d", lib, ta);
        check_gemm(what, c, n, NULL, ta, 1, m, n, kk, 1.0f, a, ta ? m : kk, b, kk, 0.0f, 1.0, TOL_ACC);
    }
    bool onednn = cpu_onednn_stats_get().executed > s0.executed;
    cr_assert_eq(onednn, strcmp(lib, "onednn") == 0 || (strcmp(lib, "auto") == 0 && cpu_isa_get()->avx512),
                 "FSDP_CPU_MATMUL=%s: oneDNN %s", lib, onednn ? "ran" : "did not run");
    free(a), free(b), free(c);
}

Test(cpu_matmul, f32_openblas) { f32_library_case("openblas"); }
Test(cpu_matmul, f32_onednn) { f32_library_case("onednn"); }
Test(cpu_matmul, f32_auto) { f32_library_case("auto"); }

/* The forced fallback: FSDP_TEST_CPU_NO_BF16 caps oneDNN below bf16 before anything asks it, so the table
 * has no bf16 matmuls, and bf16 mode computes in fp32 (fp32's bits), bound copies or not. */
Test(cpu_matmul, forced_fallback_computes_in_fp32)
{
    setenv("FSDP_TEST_CPU_NO_BF16", "1", 1);
    const struct kernels *k = kernels_cpu();
    cr_assert(!(k->matmul_dtypes & DTYPE_BIT(DTYPE_BF16)), "bf16 still native with the CPU capped");
    cr_assert(!cpu_isa_get()->bf16 && cpu_isa_get()->capped, "oneDNN runs %s", cpu_isa_get()->name);
    const int n = 40, in = 72, out = 56;
    float *x = tu_host_rand((size_t)n * in, 41, -1, 1), *w = tu_host_rand((size_t)in * out, 42, -1, 1);
    float *y32 = malloc((size_t)n * out * sizeof *y32), *y16 = malloc((size_t)n * out * sizeof *y16);
    uint16_t *lp = malloc((size_t)in * out * sizeof *lp);
    cr_assert(y32 && y16 && lp);
    for (size_t i = 0; i < (size_t)in * out; i++)
        lp[i] = dtype_f32_to_bf16(w[i]);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
    cr_assert_eq(k->matmul_forward(y32, x, w, NULL, n, in, out), 0);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_BF16), 0, "%s", error_message());
    cr_assert_eq(k->lowp_bind(w, lp, (size_t)in * out), 0);
    cr_assert_eq(k->matmul_forward(y16, x, w, NULL, n, in, out), 0);
    cr_assert_eq(k->lowp_unbind(w), 0);
    cr_assert_eq(memcmp(y32, y16, (size_t)n * out * sizeof *y32), 0, "the fallback did not compute in fp32");
    free(x), free(w), free(y32), free(y16), free(lp);
}

/* oneDNN runs on OpenMP's threads: with one OpenMP thread a large bf16 matmul starts no thread, with two it
 * starts at most OpenMP's one more (ranks sharing a host are bounded by their OMP_NUM_THREADS). */
static int threads_now(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    cr_assert(f);
    char line[256];
    int n = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    fclose(f);
    return n;
}

Test(cpu_matmul, threads_follow_openmp)
{
    const struct kernels *k = kernels_cpu();
    const int n = 512, in = 512, out = 512;
    float *x = tu_host_rand((size_t)n * in, 51, -1, 1), *w = tu_host_rand((size_t)in * out, 52, -1, 1);
    float *y = malloc((size_t)n * out * sizeof *y);
    cr_assert(y);
    omp_set_num_threads(1);
    int before = threads_now();
    for (int dt = 0; dt < 2; dt++) {
        cr_assert_eq(k->set_matmul_dtype(dt ? DTYPE_BF16 : DTYPE_F32), 0);
        cr_assert_eq(k->matmul_forward(y, x, w, NULL, n, in, out), 0, "%s", error_message());
    }
    cr_assert_eq(threads_now(), before, "one OpenMP thread, yet %d threads after the matmuls (%d before)",
                 threads_now(), before);
    omp_set_num_threads(2);
    cr_assert_eq(k->matmul_forward(y, x, w, NULL, n, in, out), 0);
    cr_assert_leq(threads_now(), before + 1, "two OpenMP threads, yet %d threads (%d before)", threads_now(), before);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
    free(x), free(w), free(y);
}

/* The operand rounding gives dtype.h's bits for every special class (NaN payloads, inf, subnormals, ties,
 * overflow) and random values, contiguous and strided. */
Test(cpu_matmul, operand_rounding_matches_dtype_h)
{
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                0xffbfffffu, 0x00000001u, 0x807fffffu, 0x3f808000u, 0x3f818000u, 0x7f7fffffu,
                                0x7f7f8000u, 0x3f80ffffu, 0x00008000u, 0x00018000u};
    enum { N = 70001 };
    float *src = malloc(N * sizeof *src);
    uint16_t *dst = malloc(N * sizeof *dst);
    cr_assert(src && dst);
    uint64_t s = 99;
    for (int i = 0; i < N; i++) {
        uint32_t u = i < 16 ? special[i] : (uint32_t)(tu_rand(&s) * 4294967296.0);
        memcpy(&src[i], &u, sizeof u);
    }
    cpu_round_bf16(dst, src, 1, N, N);
    for (int i = 0; i < N; i++)
        cr_assert_eq(dst[i], dtype_f32_to_bf16(src[i]), "element %d (bits %08x): %04x vs %04x", i,
                     ((uint32_t *)src)[i], dst[i], dtype_f32_to_bf16(src[i]));
    /* 7 rows of 1000 read with leading dimension 10000 */
    cpu_round_bf16(dst, src, 7, 1000, 10000);
    for (int r = 0; r < 7; r++)
        for (int j = 0; j < 1000; j++)
            cr_assert_eq(dst[r * 1000 + j], dtype_f32_to_bf16(src[r * 10000 + j]));
    free(src), free(dst);
}

/* lowp_hold: an operand held in bf16 mode is rounded once and read by every product until released, with the
 * bits of rounding it per product; in fp32 mode (and for a range bound already) nothing is held. */
Test(cpu_matmul, held_operand_same_bits)
{
    const struct kernels *k = cpu_or_skip_bf16();
    const int n = 48, in = 40, out = 72;
    float *dy = tu_host_rand((size_t)n * out, 61, -1, 1), *w = tu_host_rand((size_t)in * out, 62, -1, 1);
    float *x = tu_host_rand((size_t)n * in, 63, -1, 1);
    float *dx[2], *dw[2];
    for (int h = 0; h < 2; h++) {
        dx[h] = calloc((size_t)n * in, sizeof(float)), dw[h] = calloc((size_t)in * out, sizeof(float));
        cr_assert(dx[h] && dw[h]);
    }
    cr_assert_eq(k->set_matmul_dtype(DTYPE_BF16), 0);
    for (int h = 0; h < 2; h++) {
        if (h)
            cr_assert_eq(k->lowp_hold(dy, (size_t)n * out), 0, "%s", error_message());
        cr_assert_eq(k->gemm(0, 1, n, in, out, 1.0f, dy, out, w, out, 0.0f, dx[h], in), 0, "%s", error_message());
        cr_assert_eq(k->matmul_backward(NULL, dw[h], NULL, dy, x, w, n, in, out), 0, "%s", error_message());
        if (h) {
            /* held: the range is bound, so binding it again is refused until the release */
            cr_assert_eq(k->lowp_bind(dy, dx[0], 4), FSDP_EEXIST);
            cr_assert_eq(k->lowp_release(dy), 0, "%s", error_message());
        }
    }
    cr_assert_eq(memcmp(dx[0], dx[1], (size_t)n * in * sizeof(float)), 0, "held dy changed dx");
    cr_assert_eq(memcmp(dw[0], dw[1], (size_t)in * out * sizeof(float)), 0, "held dy changed dw");
    /* released: binding works again; in fp32 a hold binds nothing */
    uint16_t lp[4];
    cr_assert_eq(k->lowp_bind(dy, lp, 4), 0, "%s", error_message());
    cr_assert_eq(k->lowp_unbind(dy), 0);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
    cr_assert_eq(k->lowp_hold(dy, (size_t)n * out), 0);
    cr_assert_eq(k->lowp_bind(dy, lp, 4), 0, "fp32 mode held something: %s", error_message());
    cr_assert_eq(k->lowp_unbind(dy), 0);
    cr_assert_eq(k->lowp_release(dy), 0);
    for (int h = 0; h < 2; h++)
        free(dx[h]), free(dw[h]);
    free(dy), free(w), free(x);
}
