/* The CUDA ops table against the CPU one: every op runs on both backends with the same inputs and the
 * results are compared element by element. Without a GPU (or in a build without CUDA kernels) each
 * comparison skips with "no CUDA device ..."; the registry test checks that kernels_get("cuda") then
 * fails cleanly with a message that says so.
 *
 * Tolerances (|gpu - cpu| <= atol + rtol |cpu|), and why:
 * - matmul/gemm 1e-5 * sqrt(k) + 1e-5 rel: both exact fp32 (no TF32 unless FSDP_CUDA_TF32=1, which these
 *   tests do not set), only the summation order differs.
 * - attention and attention_cp 2e-5 + 1e-4 rel: __expf vs the CPU's polynomial exp and a different tile order.
 * - layernorm, gelu, cross-entropy, AdamW 1e-5 + 1e-5 rel (tanhf vs exp-based tanh, __expf in softmax).
 * - residual, scale, axpy, embedding forward: exact (one rounding in the same order).
 * - embedding backward: 1e-6 here, and the same bits at GPT-2's shapes (both add a token's rows in row
 *   order, and there is no multiply to contract).
 * - casts: identical bits (the same integer rounding code).
 * - sqnorm and loss sums: 1e-12 relative (double accumulation, different order). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kernels/kernels.h"
#include "tests/util/tu_gpu.h"
#include "tests/util/tu_kernels.h"

static const struct kernels *gpu(void)
{
    const struct kernels *k = kernels_get("cuda");
    if (!k)
        TU_GPU_UNAVAILABLE("no CUDA device (or no CUDA kernels in this build): %s", error_message());
    return k;
}

static const struct kernels *cpu(void)
{
    const struct kernels *k = kernels_get("cpu");
    cr_assert(k, "%s", error_message());
    return k;
}

/* The same float buffer on both backends; compare downloads it from both and checks them. */
struct pair {
    float *c, *g;
    size_t n;
};

static struct pair pair_new(const struct kernels *kc, const struct kernels *kg, const float *host, size_t n)
{
    return (struct pair){tu_devf(kc, host, n), tu_devf(kg, host, n), n};
}

static void pair_free(const struct kernels *kc, const struct kernels *kg, struct pair *p)
{
    kc->mem_free(p->c);
    kg->mem_free(p->g);
}

static void compare(const char *what, const struct kernels *kc, const struct kernels *kg, const struct pair *p,
                    double atol, double rtol)
{
    float *want = tu_down(kc, p->c, p->n * sizeof(float)), *got = tu_down(kg, p->g, p->n * sizeof(float));
    for (size_t i = 0; i < p->n; i++) {
        double err = fabs((double)got[i] - want[i]);
        if (got[i] != want[i] && !(err <= atol + rtol * fabs(want[i])) && !(isnan(got[i]) && isnan(want[i])))
            cr_assert_fail("%s[%zu]: cuda %.9g, cpu %.9g (err %.3g > %.3g)", what, i, (double)got[i],
                           (double)want[i], err, atol + rtol * fabs(want[i]));
    }
    free(want);
    free(got);
}

Test(kernels_cuda, unavailable_device_fails_cleanly)
{
    error_clear();
    const struct kernels *k = kernels_get("cuda");
    if (k) {
        /* A GPU is here: the table must be complete and usable. */
        cr_assert_str_eq(k->name, "cuda");
        /* Device memory, offloaded state on the CPU table, NCCL collectives, bf16 for "auto". */
        cr_assert_not(k->host_visible);
        cr_assert_eq(k->host(), kernels_get("cpu"));
        cr_assert_str_eq(k->comm_backend, "nccl");
        cr_assert_eq(k->auto_dtype, DTYPE_BF16);
        const void *const *fn = (const void *const *)&k->mem_alloc;
        size_t nfn = (sizeof *k - offsetof(struct kernels, mem_alloc)) / sizeof(void *);
        /* every entry is there, the optional ones too (lowp_bind .. lowp_release, the fused matmuls) */
        for (size_t i = 0; i < nfn; i++)
            cr_assert(fn[i], "cuda table entry %zu is NULL", i);
        float h[3] = {1, 2, 3}, back[3] = {0};
        float *d = tu_dev_from(k, h, sizeof h);
        cr_assert_eq(k->mem_copy(back, d, sizeof h, KERNELS_COPY_D2H), 0, "%s", error_message());
        cr_assert_eq(memcmp(h, back, sizeof h), 0);
        k->mem_free(d);
        return;
    }
    const char *msg = error_message();
    cr_assert(msg[0], "kernels_get(\"cuda\") returned NULL without a message");
#ifdef FSDP_HAVE_CUDA
    cr_assert(strstr(msg, "no CUDA device"), "unclear message: %s", msg);
    /* The answer is cached but the message is set again on every call (it is per thread). */
    error_clear();
    cr_assert_null(kernels_get("cuda"));
    cr_assert(strstr(error_message(), "no CUDA device"), "second call: %s", error_message());
#else
    cr_assert(strstr(msg, "CUDA"), "unclear message: %s", msg);
#endif
    /* A failed CUDA probe leaves the CPU backend fully usable. */
    const struct kernels *c = cpu();
    double s = -1;
    float x[2] = {3, 4};
    cr_assert_eq(c->sqnorm(&s, x, 2), 0);
    cr_assert_eq(s, 25.0);
}

static void check_matmul(int n, int in, int out, int bias)
{
    const struct kernels *kg = gpu(), *kc = cpu();
    float *x = tu_host_rand((size_t)n * in, 1, -1, 1), *w = tu_host_rand((size_t)in * out, 2, -1, 1);
    float *b = tu_host_rand(out, 3, -1, 1), *dy = tu_host_rand((size_t)n * out, 4, -1, 1);
    float *g0 = tu_host_rand((size_t)(n > out ? n : out) * (in > out ? in : out), 5, -1, 1);
    struct pair X = pair_new(kc, kg, x, (size_t)n * in), W = pair_new(kc, kg, w, (size_t)in * out);
    struct pair B = pair_new(kc, kg, b, out), DY = pair_new(kc, kg, dy, (size_t)n * out);
    struct pair Y = pair_new(kc, kg, NULL, (size_t)n * out), DX = pair_new(kc, kg, g0, (size_t)n * in);
    struct pair DW = pair_new(kc, kg, g0, (size_t)in * out), DB = pair_new(kc, kg, g0, out);
    cr_assert_eq(kc->matmul_forward(Y.c, X.c, W.c, bias ? B.c : NULL, n, in, out), 0);
    cr_assert_eq(kg->matmul_forward(Y.g, X.g, W.g, bias ? B.g : NULL, n, in, out), 0, "%s", error_message());
    compare("matmul y", kc, kg, &Y, 1e-5 * sqrt(in), 1e-5);
    cr_assert_eq(kc->matmul_backward(DX.c, DW.c, bias ? DB.c : NULL, DY.c, X.c, W.c, n, in, out), 0);
    cr_assert_eq(kg->matmul_backward(DX.g, DW.g, bias ? DB.g : NULL, DY.g, X.g, W.g, n, in, out), 0, "%s",
                 error_message());
    compare("matmul dx", kc, kg, &DX, 1e-5 * sqrt(out), 1e-5);
    compare("matmul dw", kc, kg, &DW, 1e-5 * sqrt(n), 1e-5);
    compare("matmul db", kc, kg, &DB, 1e-5 * sqrt(n), 1e-5);
    struct pair *all[] = {&X, &W, &B, &DY, &Y, &DX, &DW, &DB};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(kc, kg, all[i]);
    free(x), free(w), free(b), free(dy), free(g0);
}

Test(kernels_cuda, matmul_matches_cpu)
{
    check_matmul(1, 1, 1, 1);
    check_matmul(37, 45, 29, 1);
    check_matmul(300, 96, 288, 0);
    check_matmul(513, 256, 1024, 1);
}

Test(kernels_cuda, gemm_all_transposes_match_cpu)
{
    const struct kernels *kg = gpu(), *kc = cpu();
    const int m = 33, n = 47, kk = 29, pad = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? m : kk) + pad, ldb = (tb ? kk : n) + pad, ldc = n + pad;
            size_t na = (size_t)(ta ? kk : m) * lda, nb = (size_t)(tb ? n : kk) * ldb, nc = (size_t)m * ldc;
            float *a = tu_host_rand(na, 10 + ta, -1, 1), *b = tu_host_rand(nb, 20 + tb, -1, 1), *c0 = tu_host_rand(nc, 30, -1, 1);
            struct pair A = pair_new(kc, kg, a, na), B = pair_new(kc, kg, b, nb), C = pair_new(kc, kg, c0, nc);
            cr_assert_eq(kc->gemm(ta, tb, m, n, kk, 0.75f, A.c, lda, B.c, ldb, -0.5f, C.c, ldc), 0);
            cr_assert_eq(kg->gemm(ta, tb, m, n, kk, 0.75f, A.g, lda, B.g, ldb, -0.5f, C.g, ldc), 0, "%s",
                         error_message());
            compare(ta ? (tb ? "gemm TT" : "gemm TN") : (tb ? "gemm NT" : "gemm NN"), kc, kg, &C, 1e-5 * sqrt(kk),
                    1e-5);
            pair_free(kc, kg, &A), pair_free(kc, kg, &B), pair_free(kc, kg, &C);
            free(a), free(b), free(c0);
        }
    cr_assert_lt(kg->gemm(0, 0, 2, 2, 2, 1, NULL, 1, NULL, 2, 0, NULL, 2), 0, "lda < k must be rejected");
}

Test(kernels_cuda, layernorm_matches_cpu)
{
    const struct kernels *kg = gpu(), *kc = cpu();
    const int n = 67, c = 1600;
    float *x = tu_host_rand((size_t)n * c, 40, -2, 2), *w = tu_host_rand(c, 41, 0.5f, 1.5f), *b = tu_host_rand(c, 42, -1, 1);
    for (int i = 0; i < n; i++) /* rows with a large common offset, as the residual stream carries */
        for (int j = 0; j < c; j++)
            x[(size_t)i * c + j] += (float)(i % 5) * 100.0f;
    float *dy = tu_host_rand((size_t)n * c, 43, -1, 1), *g0 = tu_host_rand((size_t)n * c, 44, -1, 1);
    struct pair X = pair_new(kc, kg, x, (size_t)n * c), W = pair_new(kc, kg, w, c), B = pair_new(kc, kg, b, c);
    struct pair Y = pair_new(kc, kg, NULL, (size_t)n * c), M = pair_new(kc, kg, NULL, n), R = pair_new(kc, kg, NULL, n);
    struct pair DY = pair_new(kc, kg, dy, (size_t)n * c), DX = pair_new(kc, kg, g0, (size_t)n * c);
    struct pair DW = pair_new(kc, kg, g0, c), DB = pair_new(kc, kg, g0 + c, c);
    cr_assert_eq(kc->layernorm_forward(Y.c, M.c, R.c, X.c, W.c, B.c, n, c, 1e-5f), 0);
    cr_assert_eq(kg->layernorm_forward(Y.g, M.g, R.g, X.g, W.g, B.g, n, c, 1e-5f), 0, "%s", error_message());
    compare("layernorm out", kc, kg, &Y, 1e-5, 1e-5);
    compare("layernorm mean", kc, kg, &M, 1e-5, 1e-6);
    compare("layernorm rstd", kc, kg, &R, 1e-6, 1e-5);
    cr_assert_eq(kc->layernorm_backward(DX.c, DW.c, DB.c, DY.c, X.c, W.c, M.c, R.c, n, c), 0);
    cr_assert_eq(kg->layernorm_backward(DX.g, DW.g, DB.g, DY.g, X.g, W.g, M.g, R.g, n, c), 0, "%s",
                 error_message());
    compare("layernorm dinp", kc, kg, &DX, 1e-5, 1e-4);
    compare("layernorm dweight", kc, kg, &DW, 1e-5 * sqrt(n), 1e-5);
    compare("layernorm dbias", kc, kg, &DB, 1e-5 * sqrt(n), 1e-5);
    /* NULL gradient outputs are skipped, not written */
    cr_assert_eq(kg->layernorm_backward(NULL, NULL, DB.g, DY.g, X.g, W.g, M.g, R.g, n, c), 0);
    struct pair *all[] = {&X, &W, &B, &Y, &M, &R, &DY, &DX, &DW, &DB};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(kc, kg, all[i]);
    free(x), free(w), free(b), free(dy), free(g0);
}

static void check_attention_window(int b, int t, int c, int nh, float qk_range, int window)
{
    const struct kernels *kg = gpu(), *kc = cpu();
    size_t nqkv = (size_t)b * t * 3 * c, nout = (size_t)b * t * c, nlse = (size_t)b * nh * t;
    float *qkv = tu_host_rand(nqkv, 50, -qk_range, qk_range), *dout = tu_host_rand(nout, 51, -1, 1);
    float *g0 = tu_host_rand(nqkv, 52, -1, 1);
    struct pair QKV = pair_new(kc, kg, qkv, nqkv), O = pair_new(kc, kg, NULL, nout), L = pair_new(kc, kg, NULL, nlse);
    struct pair DO = pair_new(kc, kg, dout, nout), DQKV = pair_new(kc, kg, g0, nqkv);
    size_t wc = kc->attention_workspace_bytes(b, t, c, nh, nh), wg = kg->attention_workspace_bytes(b, t, c, nh, nh);
    void *wsc = kc->mem_alloc(wc), *wsg = kg->mem_alloc(wg);
    cr_assert(wsc && wsg);
    cr_assert_eq(kc->attention_forward(O.c, L.c, QKV.c, b, t, c, nh, nh, window, wsc), 0);
    cr_assert_eq(kg->attention_forward(O.g, L.g, QKV.g, b, t, c, nh, nh, window, wsg), 0, "%s", error_message());
    compare("attention out", kc, kg, &O, 2e-5, 1e-4);
    compare("attention lse", kc, kg, &L, 2e-5, 1e-5);
    cr_assert_eq(kc->attention_backward(DQKV.c, DO.c, QKV.c, O.c, L.c, b, t, c, nh, nh, window, wsc), 0);
    cr_assert_eq(kg->attention_backward(DQKV.g, DO.g, QKV.g, O.g, L.g, b, t, c, nh, nh, window, wsg), 0, "%s",
                 error_message());
    compare("attention dqkv", kc, kg, &DQKV, 5e-5, 1e-4);
    /* Deterministic: a second backward from the same start gives the same bits. */
    float *first = tu_down(kg, DQKV.g, nqkv * sizeof(float));
    cr_assert_eq(kg->mem_copy(DQKV.g, g0, nqkv * sizeof(float), KERNELS_COPY_H2D), 0);
    cr_assert_eq(kg->attention_backward(DQKV.g, DO.g, QKV.g, O.g, L.g, b, t, c, nh, nh, window, wsg), 0);
    float *second = tu_down(kg, DQKV.g, nqkv * sizeof(float));
    cr_assert_eq(memcmp(first, second, nqkv * sizeof(float)), 0, "attention backward is not deterministic");
    struct pair *all[] = {&QKV, &O, &L, &DO, &DQKV};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(kc, kg, all[i]);
    kc->mem_free(wsc), kg->mem_free(wsg);
    free(qkv), free(dout), free(g0), free(first), free(second);
}

static void check_attention(int b, int t, int c, int nh, float qk_range)
{
    check_attention_window(b, t, c, nh, qk_range, 0);
}

/* Sliding-window attention (Mistral): the flash kernels' first key tile, the dK/dV kernel's last query tile and
 * the masks at the window's edge, against the CPU's, for windows of one token, below the 32-row tile, not a
 * multiple of it, one tile, several and beyond the sequence. (bf16 mode, the tensor-core path's masks and
 * the flash kernels', is kernels_attention::sliding_window_bf16 run on the CUDA table: its bounds against a
 * double-precision reference.) */
Test(kernels_cuda, attention_sliding_window_matches_cpu, .timeout = 120)
{
    static const int w[] = {1, 5, 31, 32, 33, 70, 300};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        check_attention_window(2, 150, 64, 4, 1.0f, w[i]);  /* hs 16 */
        check_attention_window(1, 100, 256, 4, 1.0f, w[i]); /* hs 64 */
    }
}

Test(kernels_cuda, attention_matches_cpu)
{
    check_attention(1, 1, 8, 2, 1.0f);     /* one token, hs 4 */
    check_attention(2, 70, 64, 4, 1.0f);   /* t not a multiple of the 32-row tiles, hs 16 */
    check_attention(2, 200, 256, 4, 1.0f); /* GPT-2's hs 64 */
    check_attention(1, 97, 384, 3, 1.0f);  /* hs 128 */
    check_attention(1, 65, 400, 2, 0.5f);  /* hs 200: not a multiple of 32, needs > 48 KiB shared memory */
    check_attention(1, 130, 64, 2, 6.0f);  /* large scores: the online softmax must rescale */
}

/* Context-parallel attention, GPU against CPU with the same inputs and positions. A sequence of T tokens is
 * cut in 2S chunks, rank r holding chunks r and 2S-1-r (model_cp_position); gpos is the position of each
 * gathered row, rank-major. allgather: rank `rank`'s T/S query rows (in a packed q|k|v buffer, ld = W)
 * against the T gathered keys and values, a separate buffer of their columns only (kblock = T/S, ldkv = 2
 * kvw < ld); alltoall: all T rows as queries and keys of one packed buffer (qblock = kblock = T/S), dq, dk
 * and dv columns of one gradient buffer. The keys sit kshift positions later than the queries, so a query
 * at a position below kshift sees no key (lse -inf, out 0, no gradient). Backward adds into gradients that
 * start random, and a second backward from the same start gives the same bits. */
static void check_attention_cp_window(int B, int T, int C, int NH, int NKV, int S, bool alltoall, int rank,
                                      int kshift, uint64_t seed, int window)
{
    const struct kernels *kg = gpu(), *kc = cpu();
    cr_assert(kg->attention_cp_forward && kg->attention_cp_backward, "the cuda table lacks attention_cp");
    const int hs = C / NH, kvw = NKV * hs, W = C + 2 * kvw, t = T / S, half = t / 2;
    const int tq = alltoall ? T : t;
    int *gpos = malloc((size_t)T * sizeof *gpos), *kpos = malloc((size_t)T * sizeof *kpos);
    cr_assert(gpos && kpos);
    for (int p = 0; p < S; p++)
        for (int j = 0; j < t; j++)
            gpos[p * t + j] = j < half ? p * half + j : (2 * S - 1 - p) * half + (j - half);
    for (int j = 0; j < T; j++)
        kpos[j] = gpos[j] + kshift;
    const int *qpos = alltoall ? gpos : gpos + rank * t;
    size_t nq = (size_t)B * tq * W, nkv = alltoall ? 0 : (size_t)B * T * 2 * kvw, nout = (size_t)B * tq * C;
    size_t nlse = (size_t)B * NH * tq;
    float *hq = tu_host_rand(nq, seed, -1, 1), *hkv = tu_host_rand(nkv, seed + 1, -1, 1);
    float *hdo = tu_host_rand(nout, seed + 2, -1, 1), *hdq = tu_host_rand(nq, seed + 3, -1, 1);
    float *hdkv = tu_host_rand(nkv, seed + 4, -1, 1);
    struct pair Q = pair_new(kc, kg, hq, nq), KV = pair_new(kc, kg, hkv, nkv), DQ = pair_new(kc, kg, hdq, nq);
    struct pair DKV = pair_new(kc, kg, hdkv, nkv), O = pair_new(kc, kg, NULL, nout), L = pair_new(kc, kg, NULL, nlse);
    struct pair DO = pair_new(kc, kg, hdo, nout);
    int *gq = tu_dev_from(kg, qpos, (size_t)tq * sizeof(int)), *gk = tu_dev_from(kg, kpos, (size_t)T * sizeof(int));
    struct kernels_attention_cp a = {.b = B, .tq = tq, .tk = T, .c = C, .nh = NH, .ld = W, .nkv = NKV,
                                     .qblock = alltoall ? t : 0, .kblock = t, .ldkv = alltoall ? 0 : 2 * kvw,
                                     .window = window};
    struct kernels_attention_cp ac = a, ag = a;
    ac.qpos = qpos, ac.kpos = kpos, ag.qpos = gq, ag.kpos = gk;
    /* k and v: columns C and C + kvw of the packed rows (alltoall), or 0 and kvw of the gathered ones */
    float *kcp = alltoall ? Q.c + C : KV.c, *kgp = alltoall ? Q.g + C : KV.g;
    float *dkcp = alltoall ? DQ.c + C : DKV.c, *dkgp = alltoall ? DQ.g + C : DKV.g;
    cr_assert_eq(kc->attention_cp_forward(O.c, L.c, Q.c, kcp, kcp + kvw, &ac), 0, "%s", error_message());
    cr_assert_eq(kg->attention_cp_forward(O.g, L.g, Q.g, kgp, kgp + kvw, &ag), 0, "%s", error_message());
    compare("attention_cp out", kc, kg, &O, 2e-5, 1e-4);
    compare("attention_cp lse", kc, kg, &L, 2e-5, 1e-5);
    if (kshift > 0) { /* the first query row (position 0 on rank 0 and in alltoall) sees no key */
        float *l = tu_down(kg, L.g, nlse * sizeof(float)), *o = tu_down(kg, O.g, nout * sizeof(float));
        cr_assert(isinf(l[0]) && l[0] < 0, "lse of a row with no visible key: %g, want -inf", (double)l[0]);
        for (int d = 0; d < hs; d++)
            cr_assert_eq(o[d], 0.0f, "out of a row with no visible key: [%d] %g", d, (double)o[d]);
        free(l), free(o);
    }
    cr_assert_eq(kc->attention_cp_backward(DQ.c, dkcp, dkcp + kvw, DO.c, Q.c, kcp, kcp + kvw, O.c, L.c, &ac), 0, "%s",
                 error_message());
    cr_assert_eq(kg->attention_cp_backward(DQ.g, dkgp, dkgp + kvw, DO.g, Q.g, kgp, kgp + kvw, O.g, L.g, &ag), 0,
                 "%s", error_message());
    compare("attention_cp dq (alltoall: dq|dk|dv)", kc, kg, &DQ, 5e-5, 1e-4);
    if (!alltoall)
        compare("attention_cp dk|dv", kc, kg, &DKV, 5e-5, 1e-4);
    /* deterministic: the same start gives the same bits */
    float *first = tu_down(kg, DQ.g, nq * sizeof(float)), *first_kv = tu_down(kg, DKV.g, nkv * sizeof(float));
    cr_assert_eq(kg->mem_copy(DQ.g, hdq, nq * sizeof(float), KERNELS_COPY_H2D), 0);
    if (nkv)
        cr_assert_eq(kg->mem_copy(DKV.g, hdkv, nkv * sizeof(float), KERNELS_COPY_H2D), 0);
    cr_assert_eq(kg->attention_cp_backward(DQ.g, dkgp, dkgp + kvw, DO.g, Q.g, kgp, kgp + kvw, O.g, L.g, &ag), 0,
                 "%s", error_message());
    float *second = tu_down(kg, DQ.g, nq * sizeof(float)), *second_kv = tu_down(kg, DKV.g, nkv * sizeof(float));
    cr_assert_eq(memcmp(first, second, nq * sizeof(float)), 0, "attention_cp backward (dq) is not deterministic");
    cr_assert_eq(memcmp(first_kv, second_kv, nkv * sizeof(float)), 0,
                 "attention_cp backward (dk, dv) is not deterministic");
    struct pair *all[] = {&Q, &KV, &DQ, &DKV, &O, &L, &DO};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(kc, kg, all[i]);
    kg->mem_free(gq), kg->mem_free(gk);
    free(gpos), free(kpos), free(hq), free(hkv), free(hdo), free(hdq), free(hdkv);
    free(first), free(first_kv), free(second), free(second_kv);
}

static void check_attention_cp(int B, int T, int C, int NH, int NKV, int S, bool alltoall, int rank, int kshift,
                               uint64_t seed)
{
    check_attention_cp_window(B, T, C, NH, NKV, S, alltoall, rank, kshift, seed, 0);
}

/* A sliding window by global position (Mistral under context parallelism), both layouts: windows inside a
 * chunk, across chunks and longer than the sequence. */
Test(kernels_cuda, attention_cp_sliding_window_matches_cpu, .timeout = 120)
{
    static const int w[] = {1, 9, 40, 500};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        check_attention_cp_window(2, 64, 64, 4, 2, 2, false, 1, 0, 80 + i, w[i]); /* allgather, rank 1 */
        check_attention_cp_window(1, 80, 128, 2, 2, 2, true, 0, 0, 90 + i, w[i]); /* alltoall, hs 64 */
    }
}

Test(kernels_cuda, attention_cp_allgather_matches_cpu, .timeout = 120)
{
    check_attention_cp(2, 64, 64, 4, 4, 2, false, 0, 0, 70);   /* hs 16, rank 0: chunks 0 and 3 */
    check_attention_cp(2, 64, 64, 4, 4, 2, false, 1, 0, 71);   /* rank 1: chunks 1 and 2 */
    check_attention_cp(2, 96, 128, 4, 2, 3, false, 2, 0, 72);  /* grouped-query, hs 32, 3 ranks */
    check_attention_cp(1, 200, 256, 4, 4, 2, false, 1, 0, 73); /* GPT-2's hs 64, blocks of 100 rows */
    check_attention_cp(1, 40, 32, 2, 1, 2, false, 0, 5, 74);   /* rows 0..4 see no key */
}

Test(kernels_cuda, attention_cp_alltoall_matches_cpu, .timeout = 120)
{
    check_attention_cp(2, 80, 128, 2, 2, 2, true, 0, 0, 75); /* hs 64, 40-row blocks cut the 32-row tiles */
    check_attention_cp(1, 72, 384, 3, 1, 3, true, 0, 0, 76); /* grouped-query (one key/value head), hs 128 */
    check_attention_cp(1, 64, 400, 2, 2, 2, true, 0, 0, 77); /* hs 200: > 48 KiB of shared memory */
    check_attention_cp(2, 48, 64, 4, 2, 2, true, 0, 3, 78);  /* grouped-query, rows at positions 0..2 see no key */
}

Test(kernels_cuda, attention_cp_rejects_bad_shapes)
{
    const struct kernels *kg = gpu();
    float *buf = tu_dev_from(kg, NULL, 64 * sizeof(float));
    int *pos = tu_dev_from(kg, NULL, 8 * sizeof(int));
    struct kernels_attention_cp a = {.b = 1, .tq = 4, .tk = 4, .c = 8, .nh = 2, .ld = 8, .qpos = pos, .kpos = pos,
                                     .nkv = 3};
    cr_assert_eq(kg->attention_cp_forward(buf, buf, buf, buf, buf, &a), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "attention_cp_forward: bad shape"), "%s", error_message());
    a.nkv = 0;
    a.qblock = 3; /* does not divide tq */
    cr_assert_eq(kg->attention_cp_backward(buf, buf, buf, buf, buf, buf, buf, buf, buf, &a), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "attention_cp_backward: bad shape"), "%s", error_message());
    a.qblock = 0;
    a.c = 2 * 300, a.ld = 600; /* head size 300 */
    cr_assert_eq(kg->attention_cp_forward(buf, buf, buf, buf, buf, &a), FSDP_EUNSUPPORTED);
    cr_assert(strstr(error_message(), "head size 300"), "%s", error_message());
    kg->mem_free(buf), kg->mem_free(pos);
}

Test(kernels_cuda, elementwise_match_cpu)
{
    const struct kernels *kg = gpu(), *kc = cpu();
    const size_t n = 300001;
    float *a = tu_host_rand(n, 60, -6, 6), *b = tu_host_rand(n, 61, -1, 1), *g0 = tu_host_rand(n, 62, -1, 1);
    struct pair A = pair_new(kc, kg, a, n), B = pair_new(kc, kg, b, n), Y = pair_new(kc, kg, NULL, n);
    struct pair D = pair_new(kc, kg, g0, n);
    cr_assert_eq(kc->gelu_forward(Y.c, A.c, n), 0);
    cr_assert_eq(kg->gelu_forward(Y.g, A.g, n), 0, "%s", error_message());
    compare("gelu", kc, kg, &Y, 1e-6, 1e-5);
    cr_assert_eq(kc->gelu_backward(D.c, A.c, B.c, n), 0);
    cr_assert_eq(kg->gelu_backward(D.g, A.g, B.g, n), 0, "%s", error_message());
    /* dinp += grad dout adds terms up to ~1.1 (x up to 6: x sech^2 terms) to g0 in [-1, 1]: a sum near zero keeps
     * the absolute error of its terms (a few ulps of 1, from tanhf's ulps on each side), not 1e-5 of itself
     * (an H200 showed 1.72e-6 at a sum of 0.029) */
    compare("gelu backward", kc, kg, &D, 4e-6, 1e-5);
    cr_assert_eq(kc->residual_forward(Y.c, A.c, B.c, n), 0);
    cr_assert_eq(kg->residual_forward(Y.g, A.g, B.g, n), 0);
    compare("residual", kc, kg, &Y, 0, 0);
    cr_assert_eq(kc->residual_forward(A.c, A.c, B.c, n), 0); /* aliasing out == a */
    cr_assert_eq(kg->residual_forward(A.g, A.g, B.g, n), 0);
    compare("residual in place", kc, kg, &A, 0, 0);
    cr_assert_eq(kc->scale(Y.c, -0.37f, n), 0);
    cr_assert_eq(kg->scale(Y.g, -0.37f, n), 0);
    compare("scale", kc, kg, &Y, 0, 0);
    cr_assert_eq(kc->axpy(Y.c, 0.25f, B.c, n), 0);
    cr_assert_eq(kg->axpy(Y.g, 0.25f, B.g, n), 0);
    compare("axpy", kc, kg, &Y, 1e-7, 1e-6); /* FMA contraction may differ */
    struct pair *all[] = {&A, &B, &Y, &D};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(kc, kg, all[i]);
    free(a), free(b), free(g0);
}

Test(kernels_cuda, sqnorm_matches_cpu_and_is_deterministic)
{
    const struct kernels *kg = gpu(), *kc = cpu();
    const size_t sizes[] = {1, 255, 257, 1000003, 5000000};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s];
        float *x = tu_host_rand(n, 70 + s, -3, 3);
        x[0] = 1e4f; /* very different magnitudes: float accumulation would lose the small terms */
        struct pair X = pair_new(kc, kg, x, n);
        double rc = -1, rg = -1, rg2 = -2;
        cr_assert_eq(kc->sqnorm(&rc, X.c, n), 0);
        cr_assert_eq(kg->sqnorm(&rg, X.g, n), 0, "%s", error_message());
        cr_assert_eq(kg->sqnorm(&rg2, X.g, n), 0);
        cr_assert(fabs(rg - rc) <= 1e-12 * fabs(rc), "sqnorm n=%zu: cuda %.17g cpu %.17g", n, rg, rc);
        cr_assert(rg == rg2, "sqnorm n=%zu not deterministic: %.17g vs %.17g", n, rg, rg2);
        pair_free(kc, kg, &X);
        free(x);
    }
    double r = -1;
    cr_assert_eq(kg->sqnorm(&r, NULL, 0), 0);
    cr_assert_eq(r, 0.0);
}

Test(kernels_cuda, casts_give_identical_bits)
{
    const struct kernels *kg = gpu(), *kc = cpu();
    const size_t n = 70000;
    float *f = tu_host_rand(n, 80, -70000, 70000);
    /* edge cases: zeros, inf, nan, f16 overflow boundary, subnormals of both formats, ties */
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffa00000u,
                                0x477fefffu, 0x477ff000u, 0x33000000u, 0x33000001u, 0x38800000u, 0x387fffffu,
                                0x00000001u, 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x3a800800u, 0x3a801800u};
    memcpy(f, special, sizeof special);
    for (size_t i = 100; i < 20000; i++) /* small magnitudes: f16 subnormal range */
        f[i] *= 1e-9f;
    const enum dtype dts[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 3; d++) {
            /* the source of a 16-bit dtype is made by the CPU backend, then both convert it */
            size_t ss = dtype_size(dts[s]), ds = dtype_size(dts[d]);
            void *src = malloc(n * ss);
            cr_assert(src);
            cr_assert_eq(kc->cast(src, dts[s], f, DTYPE_F32, n), 0);
            void *sc = tu_dev_from(kc, src, n * ss), *sg = tu_dev_from(kg, src, n * ss);
            void *dc = tu_dev_from(kc, NULL, n * ds), *dg = tu_dev_from(kg, NULL, n * ds);
            cr_assert_eq(kc->cast(dc, dts[d], sc, dts[s], n), 0);
            cr_assert_eq(kg->cast(dg, dts[d], sg, dts[s], n), 0, "%s", error_message());
            unsigned char *hc = tu_down(kc, dc, n * ds), *hg = tu_down(kg, dg, n * ds);
            for (size_t i = 0; i < n * ds; i++)
                if (hc[i] != hg[i])
                    cr_assert_fail("cast %d -> %d: byte %zu (element %zu, input %a) differs: cuda %02x cpu %02x",
                                   (int)dts[s], (int)dts[d], i, i / ds, (double)f[i / ds], hg[i], hc[i]);
            kc->mem_free(sc), kg->mem_free(sg), kc->mem_free(dc), kg->mem_free(dg);
            free(src), free(hc), free(hg);
        }
    free(f);
    cr_assert_lt(kg->cast(NULL, (enum dtype)7, NULL, DTYPE_F32, 1), 0);
}

/* Embedding backward at GPT-2's shapes (B*T = 8192 rows, vocab 50257, C = 768) with a skewed token mix (a
 * third of the rows are one token, as padding or a frequent word would be): parallel over tokens after a
 * stable sort, it adds each token's rows in row order, as the CPU backend does, so the results are the
 * same bits as the CPU's, and the same bits on a second run. */
Test(kernels_cuda, embedding_backward_gpt2_shapes_bit_identical, .timeout = 300) /* ASan + the emulator on 2 loaded cores: 230 s seen */
{
    const struct kernels *kg = gpu(), *kc = cpu();
    const int b = 8, t = 1024, c = 768, vocab = 50257;
    size_t rows = (size_t)b * t;
    int32_t *tok = malloc(rows * sizeof *tok);
    for (size_t i = 0; i < rows; i++)
        tok[i] = i % 3 == 0 ? 50256 : (int32_t)((i * 2654435761u) % (unsigned)vocab);
    float *dout = tu_host_rand(rows * c, 95, -1, 1);
    struct pair WTE = pair_new(kc, kg, NULL, (size_t)vocab * c), WPE = pair_new(kc, kg, NULL, (size_t)t * c);
    struct pair DO = pair_new(kc, kg, dout, rows * c);
    int32_t *tc = tu_dev_from(kc, tok, rows * sizeof *tok), *tg = tu_dev_from(kg, tok, rows * sizeof *tok);
    cr_assert_eq(kc->embedding_backward(WTE.c, WPE.c, DO.c, tc, b, t, c, vocab), 0);
    cr_assert_eq(kg->embedding_backward(WTE.g, WPE.g, DO.g, tg, b, t, c, vocab), 0, "%s", error_message());
    compare("dwte (gpt2 shapes)", kc, kg, &WTE, 0, 0);
    compare("dwpe (gpt2 shapes)", kc, kg, &WPE, 0, 0);
    float *first = tu_down(kg, WTE.g, (size_t)vocab * c * sizeof(float));
    cr_assert_eq(kg->mem_set(WTE.g, 0, (size_t)vocab * c * sizeof(float)), 0);
    cr_assert_eq(kg->embedding_backward(WTE.g, NULL, DO.g, tg, b, t, c, vocab), 0, "%s", error_message());
    float *second = tu_down(kg, WTE.g, (size_t)vocab * c * sizeof(float));
    cr_assert_eq(memcmp(first, second, (size_t)vocab * c * sizeof(float)), 0, "two runs gave different bits");
    free(first), free(second), free(tok), free(dout);
    kc->mem_free(tc), kg->mem_free(tg);
    pair_free(kc, kg, &WTE), pair_free(kc, kg, &WPE), pair_free(kc, kg, &DO);
}

/* Host copies through the pinned staging ring: a host-to-device copy returns before the device ran it, so
 * the host buffer is refilled at once and copied again; copies larger than the ring (40 MiB) from and to
 * pageable and pinned memory round-trip exactly, and a device-to-host copy waits for the kernels before it.
 * A pinned source may be reused as soon as the copy returns, both when it goes directly (larger than the
 * ring) and when it is staged. */
Test(kernels_cuda, host_copies_are_staged_and_ordered, .timeout = 120)
{
    const struct kernels *kg = gpu();
    size_t n = 10u << 20; /* floats: 40 MiB */
    float *h = tu_host_rand(n, 96, -4, 4), *pin = kg->host_alloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
    cr_assert(pin && back, "%s", error_message());
    float *d1 = kg->mem_alloc(n * sizeof(float)), *d2 = kg->mem_alloc(n * sizeof(float));
    cr_assert(d1 && d2, "%s", error_message());
    /* reuse the source right after each call: the device must see what the buffer held at the call */
    cr_assert_eq(kg->mem_copy(d1, h, n * sizeof(float), KERNELS_COPY_H2D), 0, "%s", error_message());
    for (size_t i = 0; i < n; i++)
        h[i] = -h[i];
    cr_assert_eq(kg->mem_copy(d2, h, n * sizeof(float), KERNELS_COPY_H2D), 0, "%s", error_message());
    /* queued behind the copies: d1 *= 2 */
    cr_assert_eq(kg->scale(d1, 2.0f, n), 0, "%s", error_message());
    cr_assert_eq(kg->mem_copy(back, d1, n * sizeof(float), KERNELS_COPY_D2H), 0, "%s", error_message());
    for (size_t i = 0; i < n; i++)
        cr_assert(back[i] == -2.0f * h[i], "pageable round trip, element %zu: %g, want %g", i, (double)back[i],
                  (double)(-2.0f * h[i]));
    cr_assert_eq(kg->mem_copy(pin, d2, n * sizeof(float), KERNELS_COPY_D2H), 0, "%s", error_message());
    cr_assert_eq(memcmp(pin, h, n * sizeof(float)), 0, "device-to-pinned copy differs");
    for (size_t i = 0; i < n; i++)
        pin[i] = (float)i;
    /* pinned sources, larger than the ring (copied directly) and smaller (staged): reused at once too, behind
     * queued work */
    cr_assert_eq(kg->scale(d2, 0.5f, n), 0, "%s", error_message());
    cr_assert_eq(kg->mem_copy(d1, pin, n * sizeof(float), KERNELS_COPY_H2D), 0, "%s", error_message());
    const size_t small = 1u << 18; /* floats: 1 MiB */
    for (size_t i = 0; i < n; i++)
        pin[i] = -1.0f;
    cr_assert_eq(kg->mem_copy(back, d1, n * sizeof(float), KERNELS_COPY_D2H), 0, "%s", error_message());
    for (size_t i = 0; i < n; i++)
        cr_assert(back[i] == (float)i, "pinned round trip, element %zu", i);
    for (size_t i = 0; i < small; i++)
        pin[i] = (float)(small - i);
    cr_assert_eq(kg->scale(d1, 0.5f, n), 0, "%s", error_message());
    cr_assert_eq(kg->mem_copy(d1, pin, small * sizeof(float), KERNELS_COPY_H2D), 0, "%s", error_message());
    for (size_t i = 0; i < small; i++)
        pin[i] = -1.0f;
    cr_assert_eq(kg->mem_copy(back, d1, n * sizeof(float), KERNELS_COPY_D2H), 0, "%s", error_message());
    for (size_t i = 0; i < n; i++)
        cr_assert(back[i] == (i < small ? (float)(small - i) : 0.5f * (float)i), "small pinned copy, element %zu", i);
    /* memory freed to the pool comes back */
    kg->mem_free(d2);
    d2 = kg->mem_alloc(n * sizeof(float));
    cr_assert(d2, "%s", error_message());
    kg->mem_free(d1), kg->mem_free(d2), kg->host_free(pin);
    free(h), free(back);
}

Test(kernels_cuda, embedding_matches_cpu)
{
    const struct kernels *kg = gpu(), *kc = cpu();
    const int b = 3, t = 50, c = 200, vocab = 97, vp = 104;
    int32_t tok[150];
    for (int i = 0; i < b * t; i++)
        tok[i] = (i * 37 + i / 7) % 13 == 0 ? 5 : (i * 31) % vocab; /* token 5 repeats many times */
    float *wte = tu_host_rand((size_t)vp * c, 90, -1, 1), *wpe = tu_host_rand((size_t)t * c, 91, -1, 1);
    float *dout = tu_host_rand((size_t)b * t * c, 92, -1, 1);
    struct pair WTE = pair_new(kc, kg, wte, (size_t)vp * c), WPE = pair_new(kc, kg, wpe, (size_t)t * c);
    struct pair O = pair_new(kc, kg, NULL, (size_t)b * t * c), DO = pair_new(kc, kg, dout, (size_t)b * t * c);
    int32_t *tc = tu_dev_from(kc, tok, sizeof tok), *tg = tu_dev_from(kg, tok, sizeof tok);
    cr_assert_eq(kc->embedding_forward(O.c, tc, WTE.c, WPE.c, b, t, c, vocab), 0);
    cr_assert_eq(kg->embedding_forward(O.g, tg, WTE.g, WPE.g, b, t, c, vocab), 0, "%s", error_message());
    compare("embedding out", kc, kg, &O, 0, 0);
    cr_assert_eq(kc->embedding_backward(WTE.c, WPE.c, DO.c, tc, b, t, c, vocab), 0);
    cr_assert_eq(kg->embedding_backward(WTE.g, WPE.g, DO.g, tg, b, t, c, vocab), 0, "%s", error_message());
    compare("embedding dwte", kc, kg, &WTE, 1e-6, 1e-6);
    compare("embedding dwpe", kc, kg, &WPE, 1e-6, 1e-6);
    /* an out-of-range token is an error naming it, on the GPU as on the CPU */
    tok[77] = vocab;
    cr_assert_eq(kg->mem_copy(tg, tok, sizeof tok, KERNELS_COPY_H2D), 0);
    /* the check is deferred to the next synchronising call: the op itself queues and returns */
    cr_assert_eq(kg->embedding_forward(O.g, tg, WTE.g, WPE.g, b, t, c, vocab), 0, "%s", error_message());
    cr_assert_eq(kg->synchronize(), FSDP_ERANGE);
    cr_assert(strstr(error_message(), "position 77") && strstr(error_message(), "embedding_forward"), "%s",
              error_message());
    cr_assert_eq(kg->embedding_backward(WTE.g, NULL, DO.g, tg, b, t, c, vocab), 0, "%s", error_message());
    float one = 0;
    cr_assert_eq(kg->mem_copy(&one, O.g, sizeof one, KERNELS_COPY_D2H), FSDP_ERANGE, "a D2H copy reports it too");
    cr_assert(strstr(error_message(), "embedding_backward"), "%s", error_message());
    cr_assert_eq(kg->embedding_backward(NULL, WPE.g, DO.g, tg, b, t, c, vocab), 0, "dwpe needs no token check");
    cr_assert_eq(kg->synchronize(), 0, "%s", error_message());
    /* more checks queued than the context has slots for (256) before a synchronising call: the oldest are
     * read on the way, and a bad one among the last is still reported */
    tok[77] = 5;
    cr_assert_eq(kg->mem_copy(tg, tok, sizeof tok, KERNELS_COPY_H2D), 0);
    for (int i = 0; i < 300; i++)
        cr_assert_eq(kg->embedding_forward(O.g, tg, WTE.g, WPE.g, b, t, c, vocab), 0, "call %d: %s", i,
                     error_message());
    tok[3] = -1;
    cr_assert_eq(kg->mem_copy(tg, tok, sizeof tok, KERNELS_COPY_H2D), 0);
    cr_assert_eq(kg->embedding_forward(O.g, tg, WTE.g, WPE.g, b, t, c, vocab), 0, "%s", error_message());
    cr_assert_eq(kg->synchronize(), FSDP_ERANGE);
    cr_assert(strstr(error_message(), "token -1 at position 3"), "%s", error_message());
    struct pair *all[] = {&WTE, &WPE, &O, &DO};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        pair_free(kc, kg, all[i]);
    kc->mem_free(tc), kg->mem_free(tg);
    free(wte), free(wpe), free(dout);
}

static void check_xent(int n, int v, int vp, int in_place, float spread)
{
    const struct kernels *kg = gpu(), *kc = cpu();
    int32_t *tgt = malloc((size_t)n * sizeof *tgt);
    cr_assert(tgt);
    for (int i = 0; i < n; i++)
        tgt[i] = i % 7 == 3 ? -1 : (int32_t)(((long)i * 7919) % v);
    float *x = tu_host_rand((size_t)n * vp, 100 + v, -spread, spread);
    for (int i = 0; i < n; i++)
        for (int j = v; j < vp; j++)
            x[(size_t)i * vp + j] = NAN; /* padding is never read */
    struct pair X = pair_new(kc, kg, x, (size_t)n * vp), L = pair_new(kc, kg, NULL, n);
    struct pair D = pair_new(kc, kg, NULL, (size_t)n * vp);
    int32_t *tc = tu_dev_from(kc, tgt, (size_t)n * sizeof *tgt), *tg = tu_dev_from(kg, tgt, (size_t)n * sizeof *tgt);
    double sc = -1, sg = -2, sg2 = -3;
    cr_assert_eq(tu_xent(kc, L.c, &sc, in_place ? X.c : D.c, X.c, tc, n, v, vp, 0.5f), 0);
    cr_assert_eq(tu_xent(kg, L.g, &sg, in_place ? X.g : D.g, X.g, tg, n, v, vp, 0.5f), 0, "%s",
                 error_message());
    compare("xent losses", kc, kg, &L, 1e-5, 1e-5);
    compare("xent dlogits", kc, kg, in_place ? &X : &D, 1e-7, 1e-5);
    cr_assert(fabs(sg - sc) <= 1e-5 * fabs(sc) + 1e-6, "loss sum: cuda %.17g cpu %.17g", sg, sc);
    if (!in_place) { /* same bits again */
        cr_assert_eq(tu_xent(kg, NULL, &sg2, NULL, X.g, tg, n, v, vp, 0.5f), 0);
        cr_assert(sg == sg2, "loss sum not deterministic: %.17g vs %.17g", sg, sg2);
    }
    pair_free(kc, kg, &X), pair_free(kc, kg, &L), pair_free(kc, kg, &D);
    kc->mem_free(tc), kg->mem_free(tg);
    free(tgt), free(x);
}

Test(kernels_cuda, crossentropy_matches_cpu)
{
    check_xent(1, 1, 1, 0, 1.0f);
    check_xent(37, 1000, 1024, 0, 4.0f);
    check_xent(16, 50257, 50304, 1, 8.0f); /* GPT-2's vocabulary, padded, dlogits in place */
}

Test(kernels_cuda, crossentropy_rejects_bad_target)
{
    const struct kernels *kg = gpu();
    int32_t tgt[4] = {0, 1, 10, -1};
    float *x = tu_host_rand(4 * 16, 110, -1, 1);
    float *X = tu_dev_from(kg, x, 4 * 16 * sizeof(float));
    int32_t *T = tu_dev_from(kg, tgt, sizeof tgt);
    double s;
    cr_assert_eq(tu_xent(kg, NULL, &s, NULL, X, T, 4, 10, 16, 1.0f), FSDP_ERANGE);
    cr_assert(strstr(error_message(), "position 2"), "%s", error_message());
    cr_assert_eq(tu_xent(kg, NULL, &s, NULL, X, T, 4, 11, 16, 1.0f), 0, "%s",
                 error_message());
    kg->mem_free(X), kg->mem_free(T);
    free(x);
}

Test(kernels_cuda, adamw_matches_cpu)
{
    const struct kernels *kg = gpu(), *kc = cpu();
    const size_t n = 100003;
    float *p = tu_host_rand(n, 120, -1, 1), *g = tu_host_rand(n, 121, -0.1f, 0.1f);
    struct pair P = pair_new(kc, kg, p, n), G = pair_new(kc, kg, g, n);
    struct pair M = pair_new(kc, kg, NULL, n), V = pair_new(kc, kg, NULL, n);
    for (int step = 1; step <= 5; step++) {
        struct kernels_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                          .weight_decay = step == 3 ? 0.0f : 0.1f, .grad_scale = 0.5f, .step = step};
        cr_assert_eq(kc->adamw(P.c, G.c, M.c, V.c, n, &hp), 0);
        cr_assert_eq(kg->adamw(P.g, G.g, M.g, V.g, n, &hp), 0, "%s", error_message());
    }
    compare("adamw param", kc, kg, &P, 1e-7, 1e-5);
    compare("adamw m", kc, kg, &M, 1e-9, 1e-5);
    compare("adamw v", kc, kg, &V, 1e-12, 1e-5);
    struct kernels_adamw_params bad = {.lr = 1e-3f, .beta1 = 1.0f, .beta2 = 0.95f, .step = 1};
    cr_assert_eq(kg->adamw(P.g, G.g, M.g, V.g, n, &bad), FSDP_EINVAL);
    pair_free(kc, kg, &P), pair_free(kc, kg, &G), pair_free(kc, kg, &M), pair_free(kc, kg, &V);
    free(p), free(g);
}

Test(kernels_cuda, memory_ops)
{
    const struct kernels *kg = gpu();
    float h[1000], back[1000];
    for (int i = 0; i < 1000; i++)
        h[i] = (float)i;
    float *a = tu_dev_from(kg, h, sizeof h), *b = tu_dev_from(kg, NULL, sizeof h);
    cr_assert_eq(kg->mem_copy(b, a, sizeof h, KERNELS_COPY_D2D), 0);
    cr_assert_eq(kg->mem_copy(b + 10, b, 500 * sizeof(float), KERNELS_COPY_D2D), 0); /* overlapping */
    cr_assert_eq(kg->mem_set(a, 0, 100 * sizeof(float)), 0);
    cr_assert_eq(kg->synchronize(), 0);
    cr_assert_eq(kg->mem_copy(back, b, sizeof h, KERNELS_COPY_D2H), 0);
    cr_assert_eq(back[9], 9.0f);
    cr_assert_eq(back[10], 0.0f);
    cr_assert_eq(back[509], 499.0f);
    cr_assert_eq(back[510], 510.0f);
    cr_assert_eq(kg->mem_copy(back, a, sizeof h, KERNELS_COPY_D2H), 0);
    cr_assert_eq(back[99], 0.0f);
    cr_assert_eq(back[100], 100.0f);
    cr_assert_eq(kg->mem_copy(back, a, 4, (enum kernels_copy_kind)9), FSDP_EINVAL);
    kg->mem_free(a), kg->mem_free(b);
    kg->mem_free(NULL);
    /* an impossible allocation fails with a message, and the backend keeps working */
    cr_assert_null(kg->mem_alloc((size_t)1 << 50));
    cr_assert(strstr(error_message(), "cannot allocate"), "%s", error_message());
    void *ok = kg->mem_alloc(16);
    cr_assert(ok, "%s", error_message());
    kg->mem_free(ok);
}

/* x rounded to bf16 toward zero (the low 16 bits dropped): the other rounding a tensor-core path may use. */
static float bf16_truncated(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u &= 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* y(n, out) = x(n, in) w(in, out) in double; with mag, the sums of |x| |w| instead. */
static double *host_matmul(const float *x, const float *w, int n, int in, int out, bool mag)
{
    double *y = calloc((size_t)n * out, sizeof *y);
    cr_assert(y);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < in; k++) {
            double a = x[(size_t)i * in + k];
            const float *wr = w + (size_t)k * out;
            double *yr = y + (size_t)i * out;
            for (int j = 0; j < out; j++)
                yr[j] += mag ? fabs(a) * fabs((double)wr[j]) : a * wr[j];
        }
    return y;
}

/* Mixed-precision matmuls: with set_matmul_dtype(BF16) the GPU rounds x and W to bf16 and accumulates in
 * fp32. cuBLAS does not document how CUBLAS_COMPUTE_32F_FAST_16BF rounds the fp32 inputs, so either way is
 * accepted: every element must be within one bf16 ulp of each input (2^-7 of each factor, so 2^-6 of the
 * sum of |x| |w| and a little) of the product of the nearest-even inputs, plus fp32 accumulation
 * (1e-5 sqrt(in) + 1e-5 relative). That bound holds for fp32 or TF32 inputs too, so the inputs must also
 * have been rounded to bf16: the result's distance from the exact product of the unrounded inputs (rms over
 * the elements) must be at least half that of the nearest-even product, which is the closest any rounding to
 * bf16 gets (TF32, 3 more bits, gets to about 1/8 of it; fp32 to about 1/5000). The rounding seen (nearest
 * even or truncation, of x and of W) is logged (cr_log_info: Criterion verbosity 1). The CPU's bf16 matmul
 * (kernels_cpu_matmul) is checked exactly against nearest-even inputs. */
Test(kernels_cuda, matmul_bf16_inputs_accumulate_in_fp32)
{
    const struct kernels *kg = gpu();
    const int n = 300, in = 256, out = 288;
    const size_t nx = (size_t)n * in, nw = (size_t)in * out, ny = (size_t)n * out;
    float *x = tu_host_rand(nx, 51, -1, 1), *w = tu_host_rand(nw, 52, -1, 1);
    /* [0]: rounded to nearest even, [1]: truncated */
    float *xr[2] = {malloc(nx * sizeof(float)), malloc(nx * sizeof(float))};
    float *wr[2] = {malloc(nw * sizeof(float)), malloc(nw * sizeof(float))};
    cr_assert(xr[0] && xr[1] && wr[0] && wr[1]);
    for (size_t i = 0; i < nx; i++) {
        xr[0][i] = dtype_bf16_to_f32(dtype_f32_to_bf16(x[i]));
        xr[1][i] = bf16_truncated(x[i]);
    }
    for (size_t i = 0; i < nw; i++) {
        wr[0][i] = dtype_bf16_to_f32(dtype_f32_to_bf16(w[i]));
        wr[1][i] = bf16_truncated(w[i]);
    }
    float *xg = tu_devf(kg, x, nx), *wg = tu_devf(kg, w, nw), *yg = tu_devf(kg, NULL, ny);
    cr_assert_eq(kg->set_matmul_dtype(DTYPE_BF16), 0, "%s", error_message());
    cr_assert_eq(kg->matmul_forward(yg, xg, wg, NULL, n, in, out), 0, "%s", error_message());
    cr_assert_eq(kg->set_matmul_dtype(DTYPE_F32), 0);
    float *y = tu_down(kg, yg, ny * sizeof(float));
    double *exact = host_matmul(x, w, n, in, out, false), *mag = host_matmul(x, w, n, in, out, true);
    double *ref[2][2]; /* [how x is rounded][how W is rounded] */
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            ref[a][b] = host_matmul(xr[a], wr[b], n, in, out, false);
    /* the bound, and how far the result and the nearest-even product are from the exact one */
    double worst[2][2] = {{0, 0}, {0, 0}}, err2 = 0, rne2 = 0;
    for (size_t i = 0; i < ny; i++) {
        const double acc = 1e-5 * sqrt(in) + 1e-5 * fabs(ref[0][0][i]);
        const double bound = (1.0 / 64 + 1.0 / 16384) * mag[i] + acc, e = fabs((double)y[i] - ref[0][0][i]);
        if (!(e <= bound))
            cr_assert_fail("bf16 matmul y[%zu]: cuda %.9g, nearest-even inputs %.9g (err %.3g > %.3g: more than one "
                           "bf16 ulp of each input)", i, (double)y[i], ref[0][0][i], e, bound);
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++)
                worst[a][b] = fmax(worst[a][b], fabs((double)y[i] - ref[a][b][i]) / acc);
        err2 += ((double)y[i] - exact[i]) * ((double)y[i] - exact[i]);
        rne2 += (ref[0][0][i] - exact[i]) * (ref[0][0][i] - exact[i]);
    }
    int ba = 0, bb = 0;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            if (worst[a][b] < worst[ba][bb])
                ba = a, bb = b;
    static const char *const how[2] = {"nearest even", "truncation"};
    const double ratio = sqrt(err2 / rne2);
    if (worst[ba][bb] <= 1)
        cr_log_info("bf16 matmul: cuBLAS rounds x to bf16 by %s and W by %s (the product of inputs so rounded is "
                    "within %.3g of the fp32-accumulation bound); distance from the exact product %.3g x nearest-even "
                    "rounding's", how[ba], how[bb], worst[ba][bb], ratio);
    else
        cr_log_info("bf16 matmul: no rounding of the inputs tried matches within fp32 accumulation; closest: x by %s "
                    "and W by %s (%.3g x the fp32-accumulation bound); distance from the exact product %.3g x "
                    "nearest-even rounding's", how[ba], how[bb], worst[ba][bb], ratio);
    cr_assert(ratio >= 0.5, "the bf16 matmul is %.3g of nearest-even bf16 rounding's distance from the exact "
              "product (at least 0.5 expected): its inputs were not rounded to bf16 (about 0.125 is TF32, which "
              "cuBLAS 13.1 on an H200 ran for CUBLAS_COMPUTE_32F_FAST_16BF on fp32 inputs)", ratio);
    free(y), free(exact), free(mag);
    for (int a = 0; a < 2; a++) {
        free(xr[a]), free(wr[a]);
        for (int b = 0; b < 2; b++)
            free(ref[a][b]);
    }
    kg->mem_free(xg), kg->mem_free(wg), kg->mem_free(yg);
    free(x), free(w);
}

/* A bound 16-bit copy is what a GEMM reads (kernels.h lowp_bind, kernels/cuda/lowp.cu): bind a unit to the
 * bf16 of twice its values and a weight inside it multiplies as 2w would (same bits: the same rounded values
 * through the same GEMM), as matmul_forward's W and as gemm's transposed B; unbound, w itself counts again.
 * Overlapping binds and unknown unbinds are refused. */
Test(kernels_cuda, bound_copy_is_read_as_is)
{
    const struct kernels *kg = gpu();
    cr_assert_eq(kg->set_matmul_dtype(DTYPE_BF16), 0);
    /* pad 128: the weight's bf16 copy starts 256 bytes into the bound one, aligned as the scratch copy it is
     * compared with, so a GPU picks the same GEMM kernel for both */
    const int n = 20, in = 64, out = 48, pad = 128;
    const size_t nw = (size_t)in * out, nu = 2 * pad + nw, ny = (size_t)n * out, nx = (size_t)n * in;
    float *x = tu_host_rand(nx, 11, -1, 1), *unit = tu_host_rand(nu, 12, -1, 1), *u2 = malloc(nu * sizeof *u2);
    uint16_t *lp = malloc(nu * sizeof *lp);
    cr_assert(u2 && lp);
    for (size_t i = 0; i < nu; i++) {
        u2[i] = 2.0f * unit[i];
        lp[i] = dtype_f32_to_bf16(u2[i]);
    }
    float *X = tu_devf(kg, x, nx), *U = tu_devf(kg, unit, nu), *U2 = tu_devf(kg, u2, nu), *Y = tu_devf(kg, NULL, ny);
    float *R = tu_devf(kg, NULL, ny), *XB = tu_devf(kg, NULL, nx), *RB = tu_devf(kg, NULL, nx);
    void *LP = tu_dev_from(kg, lp, nu * sizeof *lp);
    cr_assert_eq(kg->matmul_forward(R, X, U2 + pad, NULL, n, in, out), 0, "%s", error_message());
    cr_assert_eq(kg->gemm(0, 1, n, in, out, 1.0f, R, out, U2 + pad, out, 0.0f, RB, in), 0);
    cr_assert_eq(kg->lowp_bind(U, LP, nu), 0, "%s", error_message());
    cr_assert_eq(kg->matmul_forward(Y, X, U + pad, NULL, n, in, out), 0, "%s", error_message());
    cr_assert_eq(kg->gemm(0, 1, n, in, out, 1.0f, R, out, U + pad, out, 0.0f, XB, in), 0);
    float *y = tu_down(kg, Y, ny * 4), *r = tu_down(kg, R, ny * 4), *xb = tu_down(kg, XB, nx * 4), *rb = tu_down(kg, RB, nx * 4);
    cr_assert_eq(memcmp(y, r, ny * 4), 0, "matmul_forward did not read the bound copy (2w)");
    cr_assert_eq(memcmp(xb, rb, nx * 4), 0, "gemm's transposed B did not read the bound copy (2w)");
    cr_assert_eq(kg->lowp_bind(U + 10, LP, 5), FSDP_EEXIST, "an overlapping bind was accepted");
    cr_assert_eq(kg->lowp_unbind(X), FSDP_ENOTFOUND);
    cr_assert_eq(kg->lowp_unbind(U), 0, "%s", error_message());
    cr_assert_eq(kg->matmul_forward(Y, X, U + pad, NULL, n, in, out), 0);
    free(y);
    y = tu_down(kg, Y, ny * 4);
    cr_assert_neq(memcmp(y, r, ny * 4), 0, "unbound, w still multiplied as 2w");
    cr_assert_eq(kg->set_matmul_dtype(DTYPE_F32), 0);
    free(x), free(unit), free(u2), free(lp), free(y), free(r), free(xb), free(rb);
    kg->mem_free(X), kg->mem_free(U), kg->mem_free(U2), kg->mem_free(Y), kg->mem_free(R), kg->mem_free(XB);
    kg->mem_free(RB), kg->mem_free(LP);
}

/* lowp_hold: a held operand is rounded once and read by every product until released, with the bits of
 * rounding it per product; a held range refuses a bind until released; in fp32 a hold binds nothing. */
Test(kernels_cuda, held_operand_same_bits)
{
    const struct kernels *kg = gpu();
    const int n = 48, in = 40, out = 72;
    const size_t ndy = (size_t)n * out, ndx = (size_t)n * in, ndw = (size_t)in * out;
    float *dy = tu_host_rand(ndy, 61, -1, 1), *w = tu_host_rand(ndw, 62, -1, 1), *x = tu_host_rand(ndx, 63, -1, 1);
    float *DY = tu_devf(kg, dy, ndy), *W = tu_devf(kg, w, ndw), *X = tu_devf(kg, x, ndx);
    float *DX[2], *DW[2], *hx[2], *hw[2];
    cr_assert_eq(kg->set_matmul_dtype(DTYPE_BF16), 0);
    for (int h = 0; h < 2; h++) {
        DX[h] = tu_devf(kg, NULL, ndx), DW[h] = tu_devf(kg, NULL, ndw);
        if (h)
            cr_assert_eq(kg->lowp_hold(DY, ndy), 0, "%s", error_message());
        cr_assert_eq(kg->gemm(0, 1, n, in, out, 1.0f, DY, out, W, out, 0.0f, DX[h], in), 0, "%s", error_message());
        cr_assert_eq(kg->matmul_backward(NULL, DW[h], NULL, DY, X, W, n, in, out), 0, "%s", error_message());
        if (h) {
            cr_assert_eq(kg->lowp_bind(DY, W, 4), FSDP_EEXIST, "a held range accepted a bind");
            cr_assert_eq(kg->lowp_release(DY), 0, "%s", error_message());
        }
        hx[h] = tu_down(kg, DX[h], ndx * 4), hw[h] = tu_down(kg, DW[h], ndw * 4);
    }
    cr_assert_eq(memcmp(hx[0], hx[1], ndx * 4), 0, "held dy changed dx");
    cr_assert_eq(memcmp(hw[0], hw[1], ndw * 4), 0, "held dy changed dw");
    cr_assert_eq(kg->lowp_bind(DY, W, 4), 0, "released, binding is allowed again: %s", error_message());
    cr_assert_eq(kg->lowp_unbind(DY), 0);
    cr_assert_eq(kg->set_matmul_dtype(DTYPE_F32), 0);
    cr_assert_eq(kg->lowp_hold(DY, ndy), 0);
    cr_assert_eq(kg->lowp_bind(DY, W, 4), 0, "fp32 mode held something: %s", error_message());
    cr_assert_eq(kg->lowp_unbind(DY), 0);
    cr_assert_eq(kg->lowp_release(DY), 0);
    for (int h = 0; h < 2; h++) {
        free(hx[h]), free(hw[h]);
        kg->mem_free(DX[h]), kg->mem_free(DW[h]);
    }
    free(dy), free(w), free(x);
    kg->mem_free(DY), kg->mem_free(W), kg->mem_free(X);
}
