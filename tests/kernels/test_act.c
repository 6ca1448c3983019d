/* Activation storage (kernels.h act_bind): on a table that has it (CUDA), an [act] output in a bf16 range holds
 * the bits of the fp32 output rounded to nearest even, and a matmul or attention backward that reads an [act]
 * operand there computes what it computes from those values in fp32 memory: the same bits, since a bf16 matmul
 * rounds its fp32 operands the same way. Shapes are not multiples of the kernels' tiles (rows 37, width 129)
 * and cover both attention paths (head size 16: tensor cores; 9: the flash kernels). The CPU table declares no
 * activation storage. Skips without a GPU (fails where a driver is present: tests/util/tu_gpu.h). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/error.h"
#include "kernels/kernels.h"
#include "tests/util/tu_gpu.h"
#include "tests/util/tu_kernels.h"

static const struct kernels *gpu(void)
{
    const struct kernels *k = kernels_get("cuda");
    if (!k)
        TU_GPU_UNAVAILABLE("no CUDA device (or no CUDA kernels in this build): %s", error_message());
    cr_assert_eq(k->set_matmul_dtype(DTYPE_BF16), 0, "%s", error_message());
    return k;
}

/* The device buffers of a test, freed together at its end (free_all). */
static void *owned[64];
static int n_owned;

static void *own(void *p)
{
    cr_assert(p, "%s", error_message());
    cr_assert_lt(n_owned, 64);
    return owned[n_owned++] = p;
}

static void free_all(const struct kernels *k)
{
    while (n_owned > 0)
        k->mem_free(owned[--n_owned]);
}

static float *dev_from(const struct kernels *k, const float *host, size_t n)
{
    float *d = own(k->mem_alloc(n * sizeof *d));
    if (host)
        cr_assert_eq(k->mem_copy(d, host, n * sizeof *d, KERNELS_COPY_H2D), 0, "%s", error_message());
    else
        cr_assert_eq(k->mem_set(d, 0, n * sizeof *d), 0);
    return d;
}

static float *dev_rand(const struct kernels *k, size_t n, uint64_t seed, float lo, float hi)
{
    float *h = tu_host_rand(n, seed, lo, hi);
    float *d = dev_from(k, h, n);
    free(h);
    return d;
}

/* A bound bf16 region of n elements (zeroed); unbind_free releases it. */
static float *act_alloc(const struct kernels *k, size_t n)
{
    float *p = k->mem_alloc(n * 2);
    cr_assert(p, "%s", error_message());
    cr_assert_eq(k->mem_set(p, 0, n * 2), 0);
    cr_assert_eq(k->act_bind(p, n * 2, DTYPE_BF16), 0, "%s", error_message());
    return p;
}

static void act_free(const struct kernels *k, float *p)
{
    cr_assert_eq(k->act_unbind(p), 0, "%s", error_message());
    k->mem_free(p);
}

/* A bound region holding the bf16 values of an fp32 device tensor (as a producer would have written them). */
static float *act_from(const struct kernels *k, const float *f32, size_t n)
{
    float *p = act_alloc(k, n);
    cr_assert_eq(k->cast(p, DTYPE_BF16, f32, DTYPE_F32, n), 0, "%s", error_message());
    return p;
}

/* The fp32 tensor of a bound bf16 region's values (exact: bf16 widens without rounding). */
static float *act_widen(const struct kernels *k, const float *act, size_t n)
{
    float *d = dev_from(k, NULL, n);
    cr_assert_eq(k->cast(d, DTYPE_F32, act, DTYPE_BF16, n), 0, "%s", error_message());
    return d;
}

/* Every element of the bound region act equals f32's rounded to bf16, within ulps bf16 units in the last place
 * (0: bit for bit, our kernels; 1: a cuBLAS product written in bf16, which may round a sum of its own order). */
static void expect_rounded(const struct kernels *k, const float *act, const float *f32, size_t n, int ulps,
                           const char *what)
{
    uint16_t *a = malloc(n * 2);
    float *f = malloc(n * sizeof *f);
    cr_assert(a && f);
    cr_assert_eq(k->mem_copy(a, act, n * 2, KERNELS_COPY_D2H), 0, "%s", error_message());
    cr_assert_eq(k->mem_copy(f, f32, n * sizeof *f, KERNELS_COPY_D2H), 0, "%s", error_message());
    for (size_t i = 0; i < n; i++) {
        int d = (int)a[i] - (int)dtype_f32_to_bf16(f[i]); /* same sign: neighbouring values are neighbouring bits */
        cr_assert_leq(abs(d), ulps, "%s: element %zu is 0x%04x, the fp32 output %.9g rounds to 0x%04x", what, i, a[i],
                      (double)f[i], dtype_f32_to_bf16(f[i]));
    }
    free(a);
    free(f);
}

/* Two fp32 device tensors hold the same bits. */
static void expect_same(const struct kernels *k, const float *x, const float *y, size_t n, const char *what)
{
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    cr_assert(a && b);
    cr_assert_eq(k->mem_copy(a, x, n * sizeof *a, KERNELS_COPY_D2H), 0, "%s", error_message());
    cr_assert_eq(k->mem_copy(b, y, n * sizeof *b, KERNELS_COPY_D2H), 0, "%s", error_message());
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(memcmp(&a[i], &b[i], sizeof *a), 0, "%s: element %zu: %.9g against %.9g", what, i, (double)a[i],
                     (double)b[i]);
    free(a);
    free(b);
}

enum { N = 37, C = 129 };

Test(act, the_cpu_table_stores_no_activations)
{
    const struct kernels *k = kernels_cpu();
    cr_assert_eq(k->act_dtypes, DTYPE_BIT(DTYPE_F32));
    cr_assert_null(k->act_bind);
    cr_assert_null(k->act_unbind);
}

Test(act, norm_outputs_are_the_fp32_outputs_rounded)
{
    const struct kernels *k = gpu();
    cr_assert(k->act_dtypes & DTYPE_BIT(DTYPE_BF16));
    size_t nc = (size_t)N * C;
    float *x = dev_rand(k, nc, 1, -3, 5), *r = dev_rand(k, nc, 2, -1, 1), *w = dev_rand(k, C, 3, 0.5f, 1.5f);
    float *b = dev_rand(k, C, 4, -0.2f, 0.2f), *mean = dev_from(k, NULL, N), *rstd = dev_from(k, NULL, N);
    float *mean2 = dev_from(k, NULL, N), *rstd2 = dev_from(k, NULL, N), *out = dev_from(k, NULL, nc);
    float *res = dev_from(k, NULL, nc), *res2 = dev_from(k, NULL, nc), *act = act_alloc(k, nc);

    cr_assert_eq(k->layernorm_forward(out, mean, rstd, x, w, b, N, C, 1e-5f), 0, "%s", error_message());
    cr_assert_eq(k->layernorm_forward(act, mean2, rstd2, x, w, b, N, C, 1e-5f), 0, "%s", error_message());
    expect_rounded(k, act, out, nc, 0, "layernorm_forward");
    expect_same(k, mean, mean2, N, "layernorm_forward mean");
    expect_same(k, rstd, rstd2, N, "layernorm_forward rstd");

    cr_assert_eq(k->residual_layernorm_forward(res, out, mean, rstd, x, r, w, b, N, C, 1e-5f), 0, "%s", error_message());
    cr_assert_eq(k->residual_layernorm_forward(res2, act, mean2, rstd2, x, r, w, b, N, C, 1e-5f), 0, "%s",
                 error_message());
    expect_rounded(k, act, out, nc, 0, "residual_layernorm_forward");
    expect_same(k, res, res2, nc, "residual_layernorm_forward res");

    cr_assert_eq(k->rmsnorm_forward(out, rstd, x, w, N, C, 1e-6f), 0, "%s", error_message());
    cr_assert_eq(k->rmsnorm_forward(act, rstd2, x, w, N, C, 1e-6f), 0, "%s", error_message());
    expect_rounded(k, act, out, nc, 0, "rmsnorm_forward");
    expect_same(k, rstd, rstd2, N, "rmsnorm_forward rstd");

    cr_assert_eq(k->residual_rmsnorm_forward(res, out, rstd, x, r, w, N, C, 1e-6f), 0, "%s", error_message());
    cr_assert_eq(k->residual_rmsnorm_forward(res2, act, rstd2, x, r, w, N, C, 1e-6f), 0, "%s", error_message());
    expect_rounded(k, act, out, nc, 0, "residual_rmsnorm_forward");
    expect_same(k, res, res2, nc, "residual_rmsnorm_forward res");
    act_free(k, act);
    free_all(k);
}

Test(act, mlp_activations_are_the_fp32_outputs_rounded)
{
    const struct kernels *k = gpu();
    size_t nc = (size_t)N * C;
    float *pre = dev_rand(k, nc, 5, -4, 4), *out = dev_from(k, NULL, nc), *act = act_alloc(k, nc);
    cr_assert_eq(k->gelu_forward(out, pre, nc), 0, "%s", error_message());
    cr_assert_eq(k->gelu_forward(act, pre, nc), 0, "%s", error_message());
    expect_rounded(k, act, out, nc, 0, "gelu_forward");
    cr_assert_eq(k->gelu_forward(act, act, nc), FSDP_EINVAL, "a bf16 output over its fp32 input accepted");

    float *gu = dev_rand(k, 2 * nc, 6, -3, 3);
    cr_assert_eq(k->swiglu_forward(out, gu, N, C), 0, "%s", error_message());
    cr_assert_eq(k->swiglu_forward(act, gu, N, C), 0, "%s", error_message());
    expect_rounded(k, act, out, nc, 0, "swiglu_forward");
    /* gate and up read from activation storage: as from their fp32 values, forward and backward */
    float *gua = act_from(k, gu, 2 * nc), *guw = act_widen(k, gua, 2 * nc), *dout = dev_rand(k, nc, 15, -1, 1);
    float *dg1 = dev_from(k, NULL, 2 * nc), *dg2 = dev_from(k, NULL, 2 * nc);
    cr_assert_eq(k->swiglu_forward(out, guw, N, C), 0, "%s", error_message());
    cr_assert_eq(k->swiglu_forward(act, gua, N, C), 0, "%s", error_message());
    expect_rounded(k, act, out, nc, 0, "swiglu_forward of stored gate and up");
    cr_assert_eq(k->swiglu_backward(dg1, guw, dout, N, C), 0, "%s", error_message());
    cr_assert_eq(k->swiglu_backward(dg2, gua, dout, N, C), 0, "%s", error_message());
    expect_same(k, dg1, dg2, 2 * nc, "swiglu_backward of stored gate and up");
    act_free(k, gua);

    /* the up-projection with its GELU: pre as in fp32, y the GELU of it rounded */
    const int in = 40;
    float *x = dev_rand(k, (size_t)N * in, 7, -1, 1), *w = dev_rand(k, (size_t)in * C, 8, -0.3f, 0.3f);
    float *bias = dev_rand(k, C, 9, -0.1f, 0.1f), *pre1 = dev_from(k, NULL, nc), *pre2 = dev_from(k, NULL, nc);
    if (k->matmul_forward_gelu) {
        cr_assert_eq(k->matmul_forward_gelu(pre1, out, x, w, bias, N, in, C), 0, "%s", error_message());
        cr_assert_eq(k->matmul_forward_gelu(pre2, act, x, w, bias, N, in, C), 0, "%s", error_message());
        expect_same(k, pre1, pre2, nc, "matmul_forward_gelu pre");
        cr_assert_eq(k->gelu_forward(out, pre2, nc), 0, "%s", error_message());
        expect_rounded(k, act, out, nc, 0, "matmul_forward_gelu y");
    }
    act_free(k, act);
    free_all(k);
}

Test(act, matmuls_read_the_stored_values)
{
    const struct kernels *k = gpu();
    const int in = C, out = 48;
    size_t nx = (size_t)N * in, ny = (size_t)N * out;
    float *x32 = dev_rand(k, nx, 10, -2, 2), *w = dev_rand(k, (size_t)in * out, 11, -0.5f, 0.5f);
    float *b = dev_rand(k, out, 12, -0.1f, 0.1f), *dy = dev_rand(k, ny, 13, -1, 1);
    float *xa = act_from(k, x32, nx), *xw = act_widen(k, xa, nx); /* the stored values, and them in fp32 */
    float *y1 = dev_from(k, NULL, ny), *y2 = dev_from(k, NULL, ny);
    cr_assert_eq(k->matmul_forward(y1, xw, w, b, N, in, out), 0, "%s", error_message());
    cr_assert_eq(k->matmul_forward(y2, xa, w, b, N, in, out), 0, "%s", error_message());
    expect_same(k, y1, y2, ny, "matmul_forward");
    /* held (a linear layer's dy may be one): it is 16-bit already, nothing is rounded from it as fp32 */
    cr_assert_eq(k->lowp_hold(xa, nx), 0, "%s", error_message());
    cr_assert_eq(k->matmul_forward(y2, xa, w, b, N, in, out), 0, "%s", error_message());
    cr_assert_eq(k->lowp_release(xa), 0);
    expect_same(k, y1, y2, ny, "matmul_forward of a held activation");

    float *dw1 = dev_from(k, NULL, (size_t)in * out), *dw2 = dev_from(k, NULL, (size_t)in * out);
    cr_assert_eq(k->matmul_backward(NULL, dw1, NULL, dy, xw, w, N, in, out), 0, "%s", error_message());
    cr_assert_eq(k->matmul_backward(NULL, dw2, NULL, dy, xa, w, N, in, out), 0, "%s", error_message());
    expect_same(k, dw1, dw2, (size_t)in * out, "matmul_backward dw");

    /* gemm with the activation as A (x W^T, W stored (out, in)) and as B transposed-free (dW += dy^T x) */
    float *wt = dev_rand(k, (size_t)out * in, 14, -0.5f, 0.5f);
    cr_assert_eq(k->gemm(0, 1, N, out, in, 1.0f, xw, in, wt, in, 0.0f, y1, out), 0, "%s", error_message());
    cr_assert_eq(k->gemm(0, 1, N, out, in, 1.0f, xa, in, wt, in, 0.0f, y2, out), 0, "%s", error_message());
    expect_same(k, y1, y2, ny, "gemm, activation as A");
    cr_assert_eq(k->gemm(1, 0, out, in, N, 1.0f, dy, out, xw, in, 0.0f, dw1, in), 0, "%s", error_message());
    cr_assert_eq(k->gemm(1, 0, out, in, N, 1.0f, dy, out, xa, in, 0.0f, dw2, in), 0, "%s", error_message());
    expect_same(k, dw1, dw2, (size_t)in * out, "gemm, activation as B");

    /* gemm writing an activation (Llama's gate/up product): the fp32 product rounded; refused with beta 1 */
    float *ya = act_alloc(k, ny);
    cr_assert_eq(k->gemm(0, 1, N, out, in, 1.0f, xa, in, wt, in, 0.0f, ya, out), 0, "%s", error_message());
    expect_rounded(k, ya, y2, ny, 1, "gemm into an activation");
    cr_assert_eq(k->gemm(0, 1, N, out, in, 1.0f, xa, in, wt, in, 1.0f, ya, out), FSDP_EINVAL,
                 "a product added into a bf16 activation accepted");
    /* a linear layer's output with its bias (GPT-2's qkv): the bias epilogue writes it rounded */
    cr_assert_eq(k->matmul_forward(ya, xa, w, b, N, in, out), 0, "%s", error_message());
    cr_assert_eq(k->matmul_forward(y1, xa, w, b, N, in, out), 0, "%s", error_message());
    expect_rounded(k, ya, y1, ny, 1, "matmul_forward into an activation");
    if (k->matmul_forward_gelu) /* the GELU's input stays fp32 (its epilogue's aux would have to be D's type) */
        cr_assert_eq(k->matmul_forward_gelu(ya, y2, xa, w, b, N, in, out), FSDP_EINVAL,
                     "a GELU epilogue's input in bf16 accepted");
    act_free(k, ya);
    act_free(k, xa);
    free_all(k);
}

/* One attention shape, its workspace and its dO. */
struct att {
    int b, t, nh, nkv, hs, c, window;
    size_t nq, no, nl;
    const float *dout;
    void *ws;
};

static void att_forward(const struct kernels *k, const struct att *a, float *out, float *lse, const float *qkv)
{
    cr_assert_eq(k->attention_forward(out, lse, qkv, a->b, a->t, a->c, a->nh, a->nkv, a->window, a->ws), 0, "%s",
                 error_message());
}

/* dqkv written afresh (backward adds into it) */
static void att_backward(const struct kernels *k, const struct att *a, float *dqkv, const float *qkv,
                         const float *out, const float *lse)
{
    cr_assert_eq(k->mem_set(dqkv, 0, a->nq * sizeof *dqkv), 0);
    cr_assert_eq(k->attention_backward(dqkv, a->dout, qkv, out, lse, a->b, a->t, a->c, a->nh, a->nkv, a->window,
                                       a->ws),
                 0, "%s", error_message());
}

/* attention's output rounded as it is written and backward reading it so, then q, k and v read from activation
 * storage as from their values in fp32 (attention rounds them so): both paths (head sizes 16 and 9),
 * grouped-query, a sliding window on one of them. */
static void attention_case(const struct kernels *k, int b, int t, int nh, int nkv, int hs, int window)
{
    struct att a = {.b = b, .t = t, .nh = nh, .nkv = nkv, .hs = hs, .c = nh * hs, .window = window};
    a.nq = (size_t)b * t * (a.c + 2 * nkv * hs), a.no = (size_t)b * t * a.c, a.nl = (size_t)b * nh * t;
    a.dout = dev_rand(k, a.no, 30 + hs, -1, 1);
    a.ws = own(k->mem_alloc(k->attention_workspace_bytes(b, t, a.c, nh, nkv)));
    float *qkv = dev_rand(k, a.nq, 20 + hs, -1, 1), *o32 = dev_from(k, NULL, a.no), *o2 = dev_from(k, NULL, a.no);
    float *lse1 = dev_from(k, NULL, a.nl), *lse2 = dev_from(k, NULL, a.nl), *oa = act_alloc(k, a.no);
    float *dq1 = dev_from(k, NULL, a.nq), *dq2 = dev_from(k, NULL, a.nq);
    char what[96];

    att_forward(k, &a, o32, lse1, qkv);
    att_forward(k, &a, oa, lse2, qkv);
    snprintf(what, sizeof what, "attention_forward hs %d window %d", hs, window);
    expect_rounded(k, oa, o32, a.no, hs % 8 == 0 ? 1 : 0, what); /* head sizes of 8s: cuBLAS writes it */
    expect_same(k, lse1, lse2, a.nl, what);
    att_backward(k, &a, dq1, qkv, act_widen(k, oa, a.no), lse1);
    att_backward(k, &a, dq2, qkv, oa, lse1);
    snprintf(what, sizeof what, "attention_backward hs %d window %d", hs, window);
    expect_same(k, dq1, dq2, a.nq, what);

    float *qa = act_from(k, qkv, a.nq), *qw = act_widen(k, qa, a.nq);
    att_forward(k, &a, o32, lse1, qw);
    att_forward(k, &a, o2, lse2, qa);
    snprintf(what, sizeof what, "attention_forward of stored q, k, v, hs %d window %d", hs, window);
    expect_same(k, o32, o2, a.no, what);
    expect_same(k, lse1, lse2, a.nl, what);
    att_backward(k, &a, dq1, qw, o32, lse1);
    att_backward(k, &a, dq2, qa, o32, lse1);
    snprintf(what, sizeof what, "attention_backward of stored q, k, v, hs %d window %d", hs, window);
    expect_same(k, dq1, dq2, a.nq, what);
    act_free(k, qa);
    act_free(k, oa);
}

Test(act, attention_writes_and_reads_its_output_rounded)
{
    const struct kernels *k = gpu();
    attention_case(k, 2, 37, 4, 2, 16, 0);
    attention_case(k, 2, 37, 4, 2, 16, 9);
    attention_case(k, 1, 37, 3, 3, 9, 0);
    free_all(k);
}

/* bf16 logits (the LM head's output) and their gradient written in place: the losses of their values in fp32,
 * the fp32 gradient rounded; an ignored row and the padded columns still zero. */
Test(act, crossentropy_reads_and_writes_bf16_logits)
{
    const struct kernels *k = gpu();
    const int n = 9, v = 77, vp = 128;
    size_t nl = (size_t)n * vp;
    int32_t tgt[9] = {0, 5, 76, -1, 33, 2, 40, 41, 7};
    int32_t *targets = own(k->mem_alloc(sizeof tgt));
    cr_assert_eq(k->mem_copy(targets, tgt, sizeof tgt, KERNELS_COPY_H2D), 0);
    float *l32 = dev_rand(k, nl, 50, -6, 6), *la = act_from(k, l32, nl), *lw = act_widen(k, la, nl);
    float *loss1 = dev_from(k, NULL, n), *loss2 = dev_from(k, NULL, n);
    double *acc = own(k->mem_alloc(2 * sizeof(double)));
    cr_assert_eq(k->mem_set(acc, 0, 2 * sizeof(double)), 0);
    cr_assert_eq(k->crossentropy_forward_backward(loss1, acc, lw, lw, targets, n, v, vp, 0.125f), 0, "%s",
                 error_message());
    cr_assert_eq(k->crossentropy_forward_backward(loss2, acc + 1, la, la, targets, n, v, vp, 0.125f), 0, "%s",
                 error_message());
    expect_same(k, loss1, loss2, n, "crossentropy losses of bf16 logits");
    double sums[2];
    cr_assert_eq(k->mem_copy(sums, acc, sizeof sums, KERNELS_COPY_D2H), 0);
    cr_assert_eq(memcmp(&sums[0], &sums[1], sizeof sums[0]), 0, "loss sums %.17g and %.17g", sums[0], sums[1]);
    expect_rounded(k, la, lw, nl, 0, "crossentropy dlogits in bf16");
    act_free(k, la);
    free_all(k);
}

Test(act, refusals_name_the_op)
{
    const struct kernels *k = gpu();
    size_t nc = (size_t)N * C;
    float *a = k->mem_alloc(nc * 2);
    cr_assert(a);
    cr_assert_eq(k->act_bind(a, nc * 2, DTYPE_F16), FSDP_EINVAL, "fp16 activation storage accepted");
    cr_assert_eq(k->act_bind(a, nc * 2, DTYPE_BF16), 0, "%s", error_message());
    cr_assert_eq(k->act_bind(a + 8, 64, DTYPE_BF16), FSDP_EEXIST, "an overlapping range accepted");
    float *x = dev_rand(k, nc, 40, -1, 1), *w = dev_rand(k, C, 41, 1, 2), *rstd = dev_from(k, NULL, N);
    /* bf16 elements while the matmuls compute in fp32: they would be read as another type */
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
    cr_assert_eq(k->rmsnorm_forward(a, rstd, x, w, N, C, 1e-6f), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "rmsnorm_forward") && strstr(error_message(), "bf16"), "%s", error_message());
    cr_assert_eq(k->set_matmul_dtype(DTYPE_BF16), 0);
    cr_assert_eq(k->act_unbind(a), 0);
    cr_assert_eq(k->act_unbind(a), FSDP_ENOTFOUND, "a range unbound twice");
    k->mem_free(a);
    free_all(k);
}
