/* matmul, gemm, layernorm, gelu, residual, scale, sqnorm, embeddings, memory and registry: each op
 * against a naive double-precision reference, and each backward also against central finite differences
 * of the backend's own forward. */
#include <omp.h>

#include "tests/util/tu_kernels.h"

/* ---------- matmul ---------- */

static void ref_matmul(double *y, const float *x, const float *w, const float *b, int n, int in, int out)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < out; j++) {
            double s = b ? b[j] : 0.0;
            for (int p = 0; p < in; p++)
                s += (double)x[i * in + p] * w[p * out + j];
            y[i * out + j] = s;
        }
}

static void check_matmul(int n, int in, int out, int with_bias)
{
    const struct kernels *k = tu_backend();
    float *x = tu_host_rand((size_t)n * in, 1, -1, 1), *w = tu_host_rand((size_t)in * out, 2, -1, 1);
    float *b = tu_host_rand(out, 3, -1, 1), *dy = tu_host_rand((size_t)n * out, 4, -1, 1);
    float *dx0 = tu_host_rand((size_t)n * in, 5, -1, 1), *dw0 = tu_host_rand((size_t)in * out, 6, -1, 1);
    float *db0 = tu_host_rand(out, 7, -1, 1);
    float *dx_ = tu_devf(k, x, (size_t)n * in), *dw_ = tu_devf(k, w, (size_t)in * out);
    float *db_ = tu_devf(k, b, out), *ddy = tu_devf(k, dy, (size_t)n * out);
    float *dy_out = tu_devf(k, NULL, (size_t)n * out);
    float *gx = tu_devf(k, dx0, (size_t)n * in), *gw = tu_devf(k, dw0, (size_t)in * out);
    float *gb = tu_devf(k, db0, out);

    cr_assert_eq(k->matmul_forward(dy_out, dx_, dw_, with_bias ? db_ : NULL, n, in, out), 0, "%s",
                 error_message());
    double *ref = tu_dzeros((size_t)n * out);
    ref_matmul(ref, x, w, with_bias ? b : NULL, n, in, out);
    float *y = tu_downf(k, dy_out, (size_t)n * out);
    tu_check_near("matmul y", y, ref, (size_t)n * out, 1e-4 * sqrt(in), 1e-4);

    /* backward accumulates into the pre-filled gradients */
    cr_assert_eq(k->matmul_backward(gx, gw, with_bias ? gb : NULL, ddy, dx_, dw_, n, in, out), 0);
    double *rdx = tu_dzeros((size_t)n * in), *rdw = tu_dzeros((size_t)in * out), *rdb = tu_dzeros(out);
    for (int i = 0; i < n; i++)
        for (int p = 0; p < in; p++) {
            double s = dx0[i * in + p];
            for (int j = 0; j < out; j++)
                s += (double)dy[i * out + j] * w[p * out + j];
            rdx[i * in + p] = s;
        }
    for (int p = 0; p < in; p++)
        for (int j = 0; j < out; j++) {
            double s = dw0[p * out + j];
            for (int i = 0; i < n; i++)
                s += (double)x[i * in + p] * dy[i * out + j];
            rdw[p * out + j] = s;
        }
    for (int j = 0; j < out; j++) {
        double s = db0[j];
        for (int i = 0; i < n; i++)
            s += dy[i * out + j];
        rdb[j] = with_bias ? s : db0[j];
    }
    float *hx = tu_downf(k, gx, (size_t)n * in), *hw = tu_downf(k, gw, (size_t)in * out), *hb = tu_downf(k, gb, out);
    tu_check_near("matmul dx", hx, rdx, (size_t)n * in, 1e-4 * sqrt(out), 1e-4);
    tu_check_near("matmul dw", hw, rdw, (size_t)in * out, 1e-4 * sqrt(n), 1e-4);
    tu_check_near("matmul db", hb, rdb, out, 1e-4 * sqrt(n), 1e-4);
    free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(db0), free(ref), free(y);
    free(rdx), free(rdw), free(rdb), free(hx), free(hw), free(hb);
    k->mem_free(dx_), k->mem_free(dw_), k->mem_free(db_), k->mem_free(ddy), k->mem_free(dy_out);
    k->mem_free(gx), k->mem_free(gw), k->mem_free(gb);
}

Test(kernels_ops, matmul_odd_shapes)
{
    check_matmul(1, 1, 1, 1);
    check_matmul(7, 13, 5, 1);
    check_matmul(33, 17, 65, 0);
    check_matmul(130, 96, 288, 1);
}

/* Central differences of L = sum(y * r) through the backend's own forward: checks backward against the
 * forward actually shipped, not just against the test's reference. */
/* matmul_forward_gelu (where the table has it: CUDA's cuBLASLt epilogue) writes what matmul_forward then
 * gelu_forward write: pre as the product plus the bias, y its GELU; with and without a bias, odd shapes, and
 * in bf16 mode (the same rounded operands either way). */
static void check_matmul_gelu(const struct kernels *k, int n, int in, int out, bool bias, uint64_t seed)
{
    float *x = tu_host_rand((size_t)n * in, seed, -1, 1), *w = tu_host_rand((size_t)in * out, seed + 1, -0.5f, 0.5f);
    float *b = tu_host_rand((size_t)out, seed + 2, -1, 1);
    float *dx = tu_devf(k, x, (size_t)n * in), *dw = tu_devf(k, w, (size_t)in * out), *db = tu_devf(k, b, out);
    size_t no = (size_t)n * out;
    float *pre = tu_devf(k, NULL, no), *y = tu_devf(k, NULL, no), *rpre = tu_devf(k, NULL, no), *ry = tu_devf(k, NULL, no);
    cr_assert_eq(k->matmul_forward_gelu(pre, y, dx, dw, bias ? db : NULL, n, in, out), 0, "%s", error_message());
    cr_assert_eq(k->matmul_forward(rpre, dx, dw, bias ? db : NULL, n, in, out), 0);
    cr_assert_eq(k->gelu_forward(ry, rpre, no), 0);
    float *g[2] = {tu_downf(k, pre, no), tu_downf(k, y, no)}, *r[2] = {tu_downf(k, rpre, no), tu_downf(k, ry, no)};
    double *want = tu_dzeros(no);
    for (int t = 0; t < 2; t++) {
        for (size_t i = 0; i < no; i++)
            want[i] = r[t][i];
        tu_check_near(t ? "matmul_forward_gelu y" : "matmul_forward_gelu pre", g[t], want, no, 1e-5, 1e-5);
        free(g[t]), free(r[t]);
    }
    free(want), free(x), free(w), free(b);
    k->mem_free(dx), k->mem_free(dw), k->mem_free(db), k->mem_free(pre), k->mem_free(y), k->mem_free(rpre);
    k->mem_free(ry);
}

Test(kernels_ops, matmul_forward_gelu_is_matmul_then_gelu)
{
    const struct kernels *k = tu_backend();
    if (!k->matmul_forward_gelu)
        cr_skip_test("the %s table has no fused matmul_forward_gelu (the model runs matmul_forward, gelu_forward)",
                     k->name);
    check_matmul_gelu(k, 37, 48, 200, true, 300);
    check_matmul_gelu(k, 5, 7, 13, false, 301);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_BF16), 0);
    check_matmul_gelu(k, 64, 96, 384, true, 302);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
    float *p = tu_devf(k, NULL, 4);
    cr_assert_neq(k->matmul_forward_gelu(p, p, p, p, NULL, 1, 2, 2), 0, "y aliasing pre is refused");
    k->mem_free(p);
}

/* matmul_dx_dgelu (where the table has it) writes what gemm (dy W^T) then gelu_backward into zeros give. */
static void check_dx_dgelu(const struct kernels *k, int n, int in, int out, uint64_t seed)
{
    size_t ni = (size_t)n * in;
    float *dy = tu_host_rand((size_t)n * out, seed, -1, 1), *w = tu_host_rand((size_t)in * out, seed + 1, -0.5f, 0.5f);
    float *pre = tu_host_rand(ni, seed + 2, -3, 3);
    float *ddy = tu_devf(k, dy, (size_t)n * out), *dw = tu_devf(k, w, (size_t)in * out), *dpre_in = tu_devf(k, pre, ni);
    float *got = tu_devf(k, NULL, ni), *mid = tu_devf(k, NULL, ni), *ref = tu_devf(k, NULL, ni);
    cr_assert_eq(k->matmul_dx_dgelu(got, ddy, dw, dpre_in, n, in, out), 0, "%s", error_message());
    cr_assert_eq(k->gemm(0, 1, n, in, out, 1.0f, ddy, out, dw, out, 0.0f, mid, in), 0);
    cr_assert_eq(k->gelu_backward(ref, dpre_in, mid, ni), 0);
    float *g = tu_downf(k, got, ni), *r = tu_downf(k, ref, ni);
    double *want = tu_dzeros(ni);
    for (size_t i = 0; i < ni; i++)
        want[i] = r[i];
    tu_check_near("matmul_dx_dgelu", g, want, ni, 1e-5, 1e-5);
    free(g), free(r), free(want), free(dy), free(w), free(pre);
    k->mem_free(ddy), k->mem_free(dw), k->mem_free(dpre_in), k->mem_free(got), k->mem_free(mid), k->mem_free(ref);
}

Test(kernels_ops, matmul_dx_dgelu_is_gemm_then_gelu_backward)
{
    const struct kernels *k = tu_backend();
    if (!k->matmul_dx_dgelu)
        cr_skip_test("the %s table has no fused matmul_dx_dgelu (the model runs gemm, then gelu_backward)", k->name);
    check_dx_dgelu(k, 37, 200, 48, 310);
    check_dx_dgelu(k, 5, 13, 7, 311);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_BF16), 0);
    check_dx_dgelu(k, 64, 384, 96, 312);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
    float *p = tu_devf(k, NULL, 4);
    cr_assert_neq(k->matmul_dx_dgelu(p, p, p, p, 1, 2, 2), 0, "dpre aliasing dy is refused");
    k->mem_free(p);
}

Test(kernels_ops, matmul_finite_differences)
{
    const struct kernels *k = tu_backend();
    const int n = 5, in = 6, out = 7;
    float *x = tu_host_rand(n * in, 11, -1, 1), *w = tu_host_rand(in * out, 12, -1, 1);
    float *b = tu_host_rand(out, 13, -1, 1), *r = tu_host_rand(n * out, 14, -1, 1);
    float *dx = tu_devf(k, x, n * in), *dw = tu_devf(k, w, in * out), *db = tu_devf(k, b, out);
    float *dr = tu_devf(k, r, n * out), *dy = tu_devf(k, NULL, n * out);
    float *gx = tu_devf(k, NULL, n * in), *gw = tu_devf(k, NULL, in * out), *gb = tu_devf(k, NULL, out);
    cr_assert_eq(k->matmul_backward(gx, gw, gb, dr, dx, dw, n, in, out), 0);
    float *hgx = tu_downf(k, gx, n * in), *hgw = tu_downf(k, gw, in * out), *hgb = tu_downf(k, gb, out);
    struct { float *host, *dev, *grad; int len; const char *name; } ps[] = {
        {x, dx, hgx, n * in, "x"}, {w, dw, hgw, in * out, "w"}, {b, db, hgb, out, "b"}};
    const float h = 1e-2f;
    for (int pi = 0; pi < 3; pi++)
        for (int e = 0; e < ps[pi].len; e++) {
            double lv[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                float saved = ps[pi].host[e];
                ps[pi].host[e] = saved + (sgn ? -h : h);
                k->mem_copy(ps[pi].dev, ps[pi].host, ps[pi].len * sizeof(float), KERNELS_COPY_H2D);
                cr_assert_eq(k->matmul_forward(dy, dx, dw, db, n, in, out), 0);
                float *y = tu_downf(k, dy, n * out);
                lv[sgn] = 0;
                for (int i = 0; i < n * out; i++)
                    lv[sgn] += (double)y[i] * r[i];
                free(y);
                ps[pi].host[e] = saved;
                k->mem_copy(ps[pi].dev, ps[pi].host, ps[pi].len * sizeof(float), KERNELS_COPY_H2D);
            }
            double fd = (lv[0] - lv[1]) / (2 * h);
            cr_assert(fabs(fd - ps[pi].grad[e]) <= 2e-3 + 2e-3 * fabs(fd), "d%s[%d]: backward %g, fd %g",
                      ps[pi].name, e, (double)ps[pi].grad[e], fd);
        }
    free(x), free(w), free(b), free(r), free(hgx), free(hgw), free(hgb);
    k->mem_free(dx), k->mem_free(dw), k->mem_free(db), k->mem_free(dr), k->mem_free(dy);
    k->mem_free(gx), k->mem_free(gw), k->mem_free(gb);
}

Test(kernels_ops, gemm_all_transposes)
{
    const struct kernels *k = tu_backend();
    const int m = 9, n = 11, kk = 7;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? m : kk) + 3, ldb = (tb ? kk : n) + 2, ldc = n + 1;
            int arows = ta ? kk : m, brows = tb ? n : kk;
            float *a = tu_host_rand((size_t)arows * lda, 21 + ta, -1, 1);
            float *b = tu_host_rand((size_t)brows * ldb, 23 + tb, -1, 1);
            float *c = tu_host_rand((size_t)m * ldc, 25, -1, 1);
            float *da = tu_devf(k, a, (size_t)arows * lda), *dbb = tu_devf(k, b, (size_t)brows * ldb);
            float *dc = tu_devf(k, c, (size_t)m * ldc);
            cr_assert_eq(k->gemm(ta, tb, m, n, kk, 0.5f, da, lda, dbb, ldb, 2.0f, dc, ldc), 0, "%s",
                         error_message());
            double *ref = tu_dzeros((size_t)m * ldc);
            for (int i = 0; i < m; i++)
                for (int j = 0; j < ldc; j++) {
                    if (j >= n) { /* padding columns of C must be left alone */
                        ref[i * ldc + j] = c[i * ldc + j];
                        continue;
                    }
                    double s = 0;
                    for (int p = 0; p < kk; p++)
                        s += (double)(ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
                    ref[i * ldc + j] = 0.5 * s + 2.0 * c[i * ldc + j];
                }
            float *got = tu_downf(k, dc, (size_t)m * ldc);
            tu_check_near(ta ? (tb ? "gemm TT" : "gemm TN") : (tb ? "gemm NT" : "gemm NN"), got, ref, (size_t)m * ldc,
                     1e-5, 1e-5);
            free(a), free(b), free(c), free(ref), free(got);
            k->mem_free(da), k->mem_free(dbb), k->mem_free(dc);
        }
    cr_assert_eq(k->gemm(0, 0, 2, 2, 2, 1, NULL, 1, NULL, 2, 0, NULL, 2), FSDP_EINVAL);
}

/* ---------- layernorm ---------- */

static void ref_layernorm(double *out, double *mean, double *rstd, const float *x, const float *w,
                          const float *b, int n, int c, double eps)
{
    for (int i = 0; i < n; i++) {
        double mu = 0, var = 0;
        for (int j = 0; j < c; j++)
            mu += x[i * c + j];
        mu /= c;
        for (int j = 0; j < c; j++)
            var += (x[i * c + j] - mu) * (x[i * c + j] - mu);
        var /= c;
        double rs = 1.0 / sqrt(var + eps);
        for (int j = 0; j < c; j++)
            out[i * c + j] = (x[i * c + j] - mu) * rs * w[j] + b[j];
        mean[i] = mu;
        rstd[i] = rs;
    }
}

Test(kernels_ops, layernorm_forward_backward)
{
    const struct kernels *k = tu_backend();
    const int shapes[][2] = {{1, 1}, {3, 7}, {17, 129}, {64, 768}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int n = shapes[si][0], c = shapes[si][1];
        size_t nc = (size_t)n * c;
        /* a large common offset exercises the two-pass variance */
        float *x = tu_host_rand(nc, 31 + si, 99, 101), *w = tu_host_rand(c, 32, 0.5, 1.5);
        float *b = tu_host_rand(c, 33, -0.5, 0.5), *dy = tu_host_rand(nc, 34, -1, 1);
        float *dx_ = tu_devf(k, x, nc), *dw_ = tu_devf(k, w, c), *db_ = tu_devf(k, b, c), *ddy = tu_devf(k, dy, nc);
        float *dout = tu_devf(k, NULL, nc), *dmean = tu_devf(k, NULL, n), *drstd = tu_devf(k, NULL, n);
        cr_assert_eq(k->layernorm_forward(dout, dmean, drstd, dx_, dw_, db_, n, c, 1e-5f), 0);
        double *ro = tu_dzeros(nc), *rm = tu_dzeros(n), *rr = tu_dzeros(n);
        ref_layernorm(ro, rm, rr, x, w, b, n, c, 1e-5);
        float *o = tu_downf(k, dout, nc), *mm = tu_downf(k, dmean, n), *rs = tu_downf(k, drstd, n);
        tu_check_near("ln out", o, ro, nc, 2e-4, 2e-4);
        tu_check_near("ln mean", mm, rm, n, 1e-5, 1e-6);
        tu_check_near("ln rstd", rs, rr, n, 1e-5, 5e-4);

        /* backward, starting from non-zero gradients (they must be accumulated into) */
        float *g0 = tu_host_rand(nc, 35, -1, 1), *gw0 = tu_host_rand(c, 36, -1, 1), *gb0 = tu_host_rand(c, 37, -1, 1);
        float *gx = tu_devf(k, g0, nc), *gw = tu_devf(k, gw0, c), *gb = tu_devf(k, gb0, c);
        cr_assert_eq(k->layernorm_backward(gx, gw, gb, ddy, dx_, dw_, dmean, drstd, n, c), 0);
        double *rgx = tu_dzeros(nc), *rgw = tu_dzeros(c), *rgb = tu_dzeros(c);
        for (int j = 0; j < c; j++)
            rgw[j] = gw0[j], rgb[j] = gb0[j];
        for (int i = 0; i < n; i++) {
            double sdn = 0, sdnn = 0;
            for (int j = 0; j < c; j++) {
                double nrm = (x[i * c + j] - rm[i]) * rr[i], dn = (double)dy[i * c + j] * w[j];
                sdn += dn, sdnn += dn * nrm;
                rgw[j] += dy[i * c + j] * nrm;
                rgb[j] += dy[i * c + j];
            }
            for (int j = 0; j < c; j++) {
                double nrm = (x[i * c + j] - rm[i]) * rr[i], dn = (double)dy[i * c + j] * w[j];
                rgx[i * c + j] = g0[i * c + j] + (dn - sdn / c - nrm * sdnn / c) * rr[i];
            }
        }
        float *hgx = tu_downf(k, gx, nc), *hgw = tu_downf(k, gw, c), *hgb = tu_downf(k, gb, c);
        /* rstd of a row with offset 100 and spread 1 is ~3.5: scale tolerances with it */
        tu_check_near("ln dx", hgx, rgx, nc, 5e-3, 1e-3);
        tu_check_near("ln dw", hgw, rgw, c, 1e-4 * n, 1e-4);
        tu_check_near("ln db", hgb, rgb, c, 1e-5 * n, 1e-5);
        free(x), free(w), free(b), free(dy), free(ro), free(rm), free(rr), free(o), free(mm), free(rs);
        free(g0), free(gw0), free(gb0), free(rgx), free(rgw), free(rgb), free(hgx), free(hgw), free(hgb);
        k->mem_free(dx_), k->mem_free(dw_), k->mem_free(db_), k->mem_free(ddy), k->mem_free(dout);
        k->mem_free(dmean), k->mem_free(drstd), k->mem_free(gx), k->mem_free(gw), k->mem_free(gb);
    }
}

Test(kernels_ops, layernorm_finite_differences)
{
    const struct kernels *k = tu_backend();
    const int n = 3, c = 10;
    float *x = tu_host_rand(n * c, 41, -2, 2), *w = tu_host_rand(c, 42, 0.5, 1.5), *b = tu_host_rand(c, 43, -1, 1);
    float *r = tu_host_rand(n * c, 44, -1, 1);
    float *dx = tu_devf(k, x, n * c), *dw = tu_devf(k, w, c), *db = tu_devf(k, b, c), *dr = tu_devf(k, r, n * c);
    float *dout = tu_devf(k, NULL, n * c), *dm = tu_devf(k, NULL, n), *ds = tu_devf(k, NULL, n);
    float *gx = tu_devf(k, NULL, n * c), *gw = tu_devf(k, NULL, c), *gb = tu_devf(k, NULL, c);
    cr_assert_eq(k->layernorm_forward(dout, dm, ds, dx, dw, db, n, c, 1e-5f), 0);
    cr_assert_eq(k->layernorm_backward(gx, gw, gb, dr, dx, dw, dm, ds, n, c), 0);
    float *hg[3] = {tu_downf(k, gx, n * c), tu_downf(k, gw, c), tu_downf(k, gb, c)};
    float *host[3] = {x, w, b}, *dev[3] = {dx, dw, db};
    int len[3] = {n * c, c, c};
    const float h = 1e-2f;
    for (int pi = 0; pi < 3; pi++)
        for (int e = 0; e < len[pi]; e++) {
            double lv[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                float saved = host[pi][e];
                host[pi][e] = saved + (sgn ? -h : h);
                k->mem_copy(dev[pi], host[pi], len[pi] * sizeof(float), KERNELS_COPY_H2D);
                cr_assert_eq(k->layernorm_forward(dout, dm, ds, dx, dw, db, n, c, 1e-5f), 0);
                float *y = tu_downf(k, dout, n * c);
                lv[sgn] = 0;
                for (int i = 0; i < n * c; i++)
                    lv[sgn] += (double)y[i] * r[i];
                free(y);
                host[pi][e] = saved;
                k->mem_copy(dev[pi], host[pi], len[pi] * sizeof(float), KERNELS_COPY_H2D);
            }
            double fd = (lv[0] - lv[1]) / (2 * h);
            cr_assert(fabs(fd - hg[pi][e]) <= 5e-3 + 1e-2 * fabs(fd), "ln grad %d[%d]: backward %g, fd %g", pi, e,
                      (double)hg[pi][e], fd);
        }
    free(x), free(w), free(b), free(r), free(hg[0]), free(hg[1]), free(hg[2]);
    k->mem_free(dx), k->mem_free(dw), k->mem_free(db), k->mem_free(dr), k->mem_free(dout), k->mem_free(dm);
    k->mem_free(ds), k->mem_free(gx), k->mem_free(gw), k->mem_free(gb);
}

/* ---------- gelu ---------- */

static double ref_gelu(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

Test(kernels_ops, gelu_forward_backward)
{
    const struct kernels *k = tu_backend();
    const size_t n = 40000 + 3; /* several chunks and a ragged tail */
    float *x = tu_host_rand(n, 51, -8, 8), *dy = tu_host_rand(n, 52, -1, 1), *g0 = tu_host_rand(n, 53, -1, 1);
    x[0] = 0.0f, x[1] = -30.0f, x[2] = 30.0f, x[3] = 1e-6f, x[4] = -1e-6f;
    float *dx = tu_devf(k, x, n), *ddy = tu_devf(k, dy, n), *dout = tu_devf(k, NULL, n), *gx = tu_devf(k, g0, n);
    cr_assert_eq(k->gelu_forward(dout, dx, n), 0);
    cr_assert_eq(k->gelu_backward(gx, dx, ddy, n), 0);
    double *ry = tu_dzeros(n), *rg = tu_dzeros(n);
    for (size_t i = 0; i < n; i++) {
        ry[i] = ref_gelu(x[i]);
        double hh = 1e-4 * (fabs(x[i]) > 1 ? fabs(x[i]) : 1); /* central difference of the double reference */
        rg[i] = g0[i] + dy[i] * (ref_gelu(x[i] + hh) - ref_gelu(x[i] - hh)) / (2 * hh);
    }
    float *y = tu_downf(k, dout, n), *g = tu_downf(k, gx, n);
    tu_check_near("gelu y", y, ry, n, 2e-6, 2e-6);
    tu_check_near("gelu dx", g, rg, n, 1e-5, 1e-5);
    /* in place */
    cr_assert_eq(k->gelu_forward(dx, dx, n), 0);
    float *y2 = tu_downf(k, dx, n);
    cr_assert_arr_eq(y2, y, n * sizeof(float));
    free(x), free(dy), free(g0), free(ry), free(rg), free(y), free(g), free(y2);
    k->mem_free(dx), k->mem_free(ddy), k->mem_free(dout), k->mem_free(gx);
}

/* ---------- vector ops ---------- */

/* sqnorm_sum adds, in order from 0, the bits sqnorm gives each buffer: empty, tiny and large buffers, and 300
 * of them (more than one batch of the CUDA table's 256), into device memory. */
Test(kernels_ops, sqnorm_sum_adds_each_buffers_sqnorm_in_order)
{
    const struct kernels *k = tu_backend();
    enum { COUNT = 300 };
    static const size_t sizes_big[] = {0, 1, 7, 50001, 300000};
    const float *xs[COUNT];
    size_t ns[COUNT];
    float *dev[COUNT];
    for (int i = 0; i < COUNT; i++) {
        ns[i] = i < 5 ? sizes_big[i] : (size_t)(1 + i % 97);
        float *h = tu_host_rand(ns[i] ? ns[i] : 1, 900 + (uint64_t)i, -2, 2);
        dev[i] = ns[i] ? tu_devf(k, h, ns[i]) : NULL;
        xs[i] = dev[i];
        free(h);
    }
    double *dt = tu_dev_from(k, NULL, sizeof(double));
    double got = -1, want = 0;
    cr_assert_eq(k->sqnorm_sum(dt, xs, ns, COUNT), 0, "%s", error_message());
    cr_assert_eq(k->mem_copy(&got, dt, sizeof got, KERNELS_COPY_D2H), 0, "%s", error_message());
    for (int i = 0; i < COUNT; i++) {
        double one = -1;
        cr_assert_eq(k->sqnorm(&one, xs[i], ns[i]), 0);
        want += one;
    }
    cr_assert(got == want, "sqnorm_sum %.17g, the sqnorms added in order %.17g", got, want);
    cr_assert_eq(k->sqnorm_sum(dt, xs, ns, 0), 0);
    cr_assert_eq(k->mem_copy(&got, dt, sizeof got, KERNELS_COPY_D2H), 0);
    cr_assert(got == 0, "no buffers: %g", got);
    cr_assert_neq(k->sqnorm_sum(dt, xs, ns, -1), 0);
    for (int i = 0; i < COUNT; i++)
        if (dev[i])
            k->mem_free(dev[i]);
    k->mem_free(dt);
}

/* grad_clip on the device: the squared norms added in order, the norm unscaled, the clip coefficient divided by
 * the loss scale, and NaN (AdamW then skips) for a non-finite norm; adamw with grad_scale_dev multiplies by it
 * (the same bits as passing it in grad_scale) or changes nothing on NaN. */
Test(kernels_ops, grad_clip_and_adamw_on_device_scale)
{
    const struct kernels *k = tu_backend();
    struct kernels_grad_clip *dc = tu_dev_from(k, NULL, sizeof *dc), c;
    double parts[3] = {9.0, 16.0, 0.0}; /* norm 5 before unscaling */
    double *dp = tu_dev_from(k, parts, sizeof parts);
    cr_assert_eq(k->grad_clip(dc, dp, 3, 2.0, 1.0), 0, "%s", error_message());
    cr_assert_eq(k->mem_copy(&c, dc, sizeof c, KERNELS_COPY_D2H), 0);
    double coef = 1.0 / (2.5 + 1e-6);
    cr_assert(c.norm == 2.5 && c.grad_scale == (float)(coef / 2.0), "norm %.17g scale %.9g", c.norm,
              (double)c.grad_scale);
    cr_assert_eq(k->grad_clip(dc, dp, 3, 1.0, 0.0), 0);
    cr_assert_eq(k->mem_copy(&c, dc, sizeof c, KERNELS_COPY_D2H), 0);
    cr_assert(c.norm == 5.0 && c.grad_scale == 1.0f, "no clip: norm %g scale %g", c.norm, (double)c.grad_scale);
    /* adamw reads the scale on the device */
    enum { N = 1000 };
    float *p0 = tu_host_rand(N, 71, -1, 1), *g0 = tu_host_rand(N, 72, -1, 1);
    float *p[2], *g[2], *m[2], *v[2];
    for (int i = 0; i < 2; i++) {
        p[i] = tu_devf(k, p0, N), g[i] = tu_devf(k, g0, N), m[i] = tu_devf(k, NULL, N), v[i] = tu_devf(k, NULL, N);
    }
    cr_assert_eq(k->grad_clip(dc, dp, 3, 2.0, 1.0), 0);
    struct kernels_adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                                      .grad_scale = (float)(coef / 2.0), .step = 1};
    cr_assert_eq(k->adamw(p[0], g[0], m[0], v[0], N, &hp), 0);
    hp.grad_scale = 1.0f;
    hp.grad_scale_dev = &dc->grad_scale;
    cr_assert_eq(k->adamw(p[1], g[1], m[1], v[1], N, &hp), 0, "%s", error_message());
    float *a = tu_downf(k, p[0], N), *b = tu_downf(k, p[1], N);
    cr_assert_arr_eq(a, b, N * sizeof(float), "adamw with grad_scale_dev differs from grad_scale");
    free(a), free(b);
    /* a non-finite norm: NaN scale, and adamw leaves param and moments as they were */
    parts[1] = INFINITY;
    cr_assert_eq(k->mem_copy(dp, parts, sizeof parts, KERNELS_COPY_H2D), 0);
    cr_assert_eq(k->grad_clip(dc, dp, 3, 1.0, 1.0), 0);
    cr_assert_eq(k->mem_copy(&c, dc, sizeof c, KERNELS_COPY_D2H), 0);
    cr_assert(isinf(c.norm) && isnan(c.grad_scale), "norm %g scale %g", c.norm, (double)c.grad_scale);
    float *before = tu_downf(k, p[1], N), *mb = tu_downf(k, m[1], N);
    hp.step = 2;
    cr_assert_eq(k->adamw(p[1], g[1], m[1], v[1], N, &hp), 0);
    float *after = tu_downf(k, p[1], N), *ma = tu_downf(k, m[1], N);
    cr_assert_arr_eq(before, after, N * sizeof(float), "a skipped step changed the parameters");
    cr_assert_arr_eq(mb, ma, N * sizeof(float), "a skipped step changed the moments");
    free(before), free(after), free(mb), free(ma), free(p0), free(g0);
    for (int i = 0; i < 2; i++)
        k->mem_free(p[i]), k->mem_free(g[i]), k->mem_free(m[i]), k->mem_free(v[i]);
    k->mem_free(dc), k->mem_free(dp);
}

Test(kernels_ops, residual_scale_axpy_sqnorm)
{
    const struct kernels *k = tu_backend();
    const size_t n = 50001;
    float *a = tu_host_rand(n, 61, -3, 3), *b = tu_host_rand(n, 62, -3, 3);
    float *da = tu_devf(k, a, n), *db = tu_devf(k, b, n), *dout = tu_devf(k, NULL, n);
    cr_assert_eq(k->residual_forward(dout, da, db, n), 0);
    float *o = tu_downf(k, dout, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(o[i], a[i] + b[i], "residual[%zu]", i);
    cr_assert_eq(k->residual_forward(da, da, db, n), 0); /* out aliases a */
    float *o2 = tu_downf(k, da, n);
    cr_assert_arr_eq(o2, o, n * sizeof(float));
    cr_assert_eq(k->scale(db, -0.25f, n), 0);
    float *sb = tu_downf(k, db, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(sb[i], b[i] * -0.25f, "scale[%zu]", i);
    float *y0 = tu_host_rand(n, 63, -1, 1);
    float *dy0 = tu_devf(k, y0, n), *dbb = tu_devf(k, b, n);
    cr_assert_eq(k->axpy(dy0, 1.5f, dbb, n), 0);
    float *ay = tu_downf(k, dy0, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_float_eq(ay[i], y0[i] + 1.5f * b[i], 1e-6f, "axpy[%zu]", i);
    free(y0), free(ay);
    k->mem_free(dy0), k->mem_free(dbb);
    double got = -1, want = 0;
    for (size_t i = 0; i < n; i++)
        want += (double)a[i] * a[i];
    float *d2 = tu_devf(k, a, n);
    cr_assert_eq(k->sqnorm(&got, d2, n), 0);
    cr_assert(fabs(got - want) <= 1e-12 * want, "sqnorm %.17g want %.17g", got, want);
    /* double accumulation: 1 + many tiny values that a float sum would drop entirely */
    const size_t m = 1 << 20;
    float *tiny = malloc(m * sizeof *tiny);
    cr_assert(tiny);
    tiny[0] = 1.0f;
    for (size_t i = 1; i < m; i++)
        tiny[i] = 1e-4f; /* square 1e-8 < float eps/2 relative to 1 */
    float *dt = tu_devf(k, tiny, m);
    cr_assert_eq(k->sqnorm(&got, dt, m), 0);
    double want2 = 1.0 + (double)(m - 1) * (double)1e-4f * (double)1e-4f;
    cr_assert(fabs(got - want2) <= 1e-10, "sqnorm of tiny values %.17g want %.17g", got, want2);
    cr_assert_eq(k->sqnorm(&got, dt, 0), 0);
    cr_assert_eq(got, 0.0);
    free(a), free(b), free(o), free(o2), free(sb), free(tiny);
    k->mem_free(da), k->mem_free(db), k->mem_free(dout), k->mem_free(d2), k->mem_free(dt);
}

/* The fused residual + norm ops (where the table has them) write the bits residual_forward and then
 * layernorm_forward / rmsnorm_forward write: rows of a residual stream with a common offset, a row width that
 * is no multiple of the lanes, res aliasing a (in place) or not; an out that aliases an input is refused. */
static void check_residual_norms(const struct kernels *k, int n, int c, bool in_place, uint64_t seed)
{
    size_t nc = (size_t)n * c;
    float *a = tu_host_rand(nc, seed, 40, 44), *b = tu_host_rand(nc, seed + 1, -1, 1);
    float *w = tu_host_rand((size_t)c, seed + 2, 0.5f, 1.5f), *bias = tu_host_rand((size_t)c, seed + 3, -1, 1);
    float *da = tu_devf(k, a, nc), *db = tu_devf(k, b, nc), *dw = tu_devf(k, w, c), *dbias = tu_devf(k, bias, c);
    float *res = in_place ? da : tu_devf(k, NULL, nc), *out = tu_devf(k, NULL, nc);
    float *mean = tu_devf(k, NULL, n), *rstd = tu_devf(k, NULL, n);
    float *rres = tu_devf(k, NULL, nc), *rout = tu_devf(k, NULL, nc), *rmean = tu_devf(k, NULL, n);
    float *rrstd = tu_devf(k, NULL, n);
    cr_assert_eq(k->residual_forward(rres, da, db, nc), 0);
    for (int norm = 0; norm < 2; norm++) {
        if (norm == 0) {
            cr_assert_eq(k->layernorm_forward(rout, rmean, rrstd, rres, dw, dbias, n, c, 1e-5f), 0);
            cr_assert_eq(k->residual_layernorm_forward(res, out, mean, rstd, da, db, dw, dbias, n, c, 1e-5f), 0, "%s",
                         error_message());
        } else {
            cr_assert_eq(k->rmsnorm_forward(rout, rrstd, rres, dw, n, c, 1e-6f), 0);
            cr_assert_eq(k->residual_rmsnorm_forward(res, out, rstd, da, db, dw, n, c, 1e-6f), 0, "%s",
                         error_message());
        }
        float *g[4] = {tu_downf(k, res, nc), tu_downf(k, out, nc), tu_downf(k, rstd, n), tu_downf(k, mean, n)};
        float *r[4] = {tu_downf(k, rres, nc), tu_downf(k, rout, nc), tu_downf(k, rrstd, n), tu_downf(k, rmean, n)};
        size_t len[4] = {nc, nc, (size_t)n, (size_t)n};
        const char *what[4] = {"res", "out", "rstd", "mean"};
        for (int t = 0; t < (norm == 0 ? 4 : 3); t++)
            for (size_t i = 0; i < len[t]; i++)
                cr_assert_eq(g[t][i], r[t][i], "%s norm %d: %s[%zu] %.9g, the two ops give %.9g", k->name, norm,
                             what[t], i, (double)g[t][i], (double)r[t][i]);
        for (int t = 0; t < 4; t++)
            free(g[t]), free(r[t]);
        if (in_place) /* the next norm starts again from a */
            k->mem_copy(da, a, nc * sizeof(float), KERNELS_COPY_H2D);
    }
    cr_assert_neq(k->residual_layernorm_forward(res, da, mean, rstd, da, db, dw, dbias, n, c, 1e-5f), 0,
                  "out aliasing a is refused");
    cr_assert_neq(k->residual_rmsnorm_forward(res, res, rstd, da, db, dw, n, c, 1e-6f), 0,
                  "out aliasing res is refused");
    free(a), free(b), free(w), free(bias);
    if (!in_place)
        k->mem_free(res);
    float *bufs[] = {da, db, dw, dbias, out, mean, rstd, rres, rout, rmean, rrstd};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        k->mem_free(bufs[i]);
}

Test(kernels_ops, residual_norms_fused_equal_the_two_ops)
{
    const struct kernels *k = tu_backend();
    if (!k->residual_layernorm_forward || !k->residual_rmsnorm_forward)
        cr_skip_test("the %s table has no fused residual + norm (the model runs residual_forward, then the norm)",
                     k->name);
    check_residual_norms(k, 37, 768, false, 700);
    check_residual_norms(k, 64, 129, true, 710);
    check_residual_norms(k, 3, 5, false, 720);
}

/* ---------- embeddings ---------- */

Test(kernels_ops, embedding_forward_backward)
{
    const struct kernels *k = tu_backend();
    const int B = 3, T = 5, C = 70, V = 11; /* C straddles the backward strip width */
    int32_t tok[15] = {0, 3, 3, 10, 7, 3, 3, 3, 0, 1, 10, 9, 2, 3, 4};
    float *wte = tu_host_rand(V * C, 71, -1, 1), *wpe = tu_host_rand(T * C, 72, -1, 1);
    float *dy = tu_host_rand(B * T * C, 73, -1, 1);
    float *gte0 = tu_host_rand(V * C, 74, -1, 1), *gpe0 = tu_host_rand(T * C, 75, -1, 1);
    int32_t *dtok = tu_dev_from(k, tok, sizeof tok);
    float *dte = tu_devf(k, wte, V * C), *dpe = tu_devf(k, wpe, T * C), *dout = tu_devf(k, NULL, B * T * C);
    float *ddy = tu_devf(k, dy, B * T * C), *gte = tu_devf(k, gte0, V * C), *gpe = tu_devf(k, gpe0, T * C);
    cr_assert_eq(k->embedding_forward(dout, dtok, dte, dpe, B, T, C, V), 0);
    cr_assert_eq(k->embedding_backward(gte, gpe, ddy, dtok, B, T, C, V), 0);
    double *ro = tu_dzeros(B * T * C), *rte = tu_dzeros(V * C), *rpe = tu_dzeros(T * C);
    for (int i = 0; i < V * C; i++)
        rte[i] = gte0[i];
    for (int i = 0; i < T * C; i++)
        rpe[i] = gpe0[i];
    for (int i = 0; i < B * T; i++)
        for (int j = 0; j < C; j++) {
            ro[i * C + j] = (double)wte[tok[i] * C + j] + wpe[(i % T) * C + j];
            rte[tok[i] * C + j] += dy[i * C + j];
            rpe[(i % T) * C + j] += dy[i * C + j];
        }
    float *o = tu_downf(k, dout, B * T * C), *ht = tu_downf(k, gte, V * C), *hp = tu_downf(k, gpe, T * C);
    tu_check_near("emb out", o, ro, B * T * C, 0, 1e-7);
    tu_check_near("emb dwte", ht, rte, V * C, 1e-6, 1e-6);
    tu_check_near("emb dwpe", hp, rpe, T * C, 1e-6, 1e-6);
    /* token out of range is an error, not a wild read: from the call (CPU) or from the next synchronising
     * call (CUDA checks ids without a host round trip) */
    int32_t bad[15];
    memcpy(bad, tok, sizeof bad);
    bad[7] = V;
    k->mem_copy(dtok, bad, sizeof bad, KERNELS_COPY_H2D);
    int rc = k->embedding_forward(dout, dtok, dte, dpe, B, T, C, V);
    cr_assert_eq(rc ? rc : k->synchronize(), FSDP_ERANGE);
    cr_assert(strstr(error_message(), "11") != NULL, "message: %s", error_message());
    cr_assert_eq(k->synchronize(), 0, "a reported range error is cleared: %s", error_message());
    free(wte), free(wpe), free(dy), free(gte0), free(gpe0), free(ro), free(rte), free(rpe), free(o), free(ht), free(hp);
    k->mem_free(dtok), k->mem_free(dte), k->mem_free(dpe), k->mem_free(dout), k->mem_free(ddy);
    k->mem_free(gte), k->mem_free(gpe);
}

/* ---------- memory, registry, argument checks ---------- */

Test(kernels_ops, memory_and_registry)
{
    const struct kernels *k = tu_backend();
    cr_assert_eq(kernels_get("tpu"), NULL);
    cr_assert(strstr(error_message(), "unknown device") != NULL, "message: %s", error_message());
    cr_assert_eq(kernels_get(NULL), NULL);
    cr_assert_eq(kernels_get("cpu"), kernels_cpu());
    cr_assert_str_eq(kernels_cpu()->name, "cpu");
    unsigned char host[300], back[300];
    for (int i = 0; i < 300; i++)
        host[i] = (unsigned char)(i * 7);
    unsigned char *d = k->mem_alloc(300), *d2 = k->mem_alloc(300);
    cr_assert(d && d2);
    cr_assert_eq((uintptr_t)d % 64, 0);
    cr_assert_eq(k->mem_copy(d, host, 300, KERNELS_COPY_H2D), 0);
    cr_assert_eq(k->mem_copy(d2, d, 300, KERNELS_COPY_D2D), 0);
    cr_assert_eq(k->mem_set(d2 + 100, 0xab, 50), 0);
    cr_assert_eq(k->mem_copy(back, d2, 300, KERNELS_COPY_D2H), 0);
    for (int i = 0; i < 300; i++)
        cr_assert_eq(back[i], i >= 100 && i < 150 ? 0xab : host[i], "byte %d", i);
    k->mem_free(d), k->mem_free(d2);
    k->mem_free(NULL);
    /* bad shapes are reported, not executed */
    float dummy[4] = {0};
    cr_assert_eq(k->matmul_forward(dummy, dummy, dummy, NULL, 1, 0, 1), FSDP_EINVAL);
    cr_assert_eq(k->layernorm_forward(dummy, dummy, dummy, dummy, dummy, dummy, 1, 0, 1e-5f), FSDP_EINVAL);
    cr_assert_eq(k->attention_forward(dummy, dummy, dummy, 1, 1, 3, 2, 2, 0, dummy), FSDP_EINVAL);
}

/* mem_copy2d moves exactly width bytes of each row between pitched layouts, in every direction, leaves the
 * bytes between rows alone, and refuses pitches below the width and overlapping regions. */
Test(kernels_ops, mem_copy2d_moves_strided_rows)
{
    const struct kernels *k = tu_backend();
    enum { ROWS = 37, SP = 29, W = 11, DP = 16 };
    unsigned char host[ROWS * SP], back[ROWS * DP], full[ROWS * SP];
    for (int i = 0; i < ROWS * SP; i++)
        host[i] = (unsigned char)(i * 13 + 5);
    unsigned char *a = k->mem_alloc(ROWS * SP), *b = k->mem_alloc(ROWS * DP);
    cr_assert(a && b, "%s", error_message());
    cr_assert_eq(k->mem_set(a, 0x5a, ROWS * SP), 0, "%s", error_message());
    cr_assert_eq(k->mem_set(b, 0xc3, ROWS * DP), 0, "%s", error_message());
    /* host rows 3.. of pitch SP -> device rows of pitch SP at column 7 (H2D), then columns 7..7+W of those
     * -> rows of pitch DP (D2D), then those rows of DP -> host rows of pitch DP (D2H) */
    cr_assert_eq(k->mem_copy2d(a + 7, SP, host + 3, SP, W, ROWS, KERNELS_COPY_H2D), 0, "%s", error_message());
    cr_assert_eq(k->mem_copy2d(b + 2, DP, a + 7, SP, W, ROWS, KERNELS_COPY_D2D), 0, "%s", error_message());
    cr_assert_eq(k->synchronize(), 0, "%s", error_message());
    memset(back, 0, sizeof back);
    cr_assert_eq(k->mem_copy2d(back, DP, b, DP, DP, ROWS, KERNELS_COPY_D2H), 0, "%s", error_message());
    cr_assert_eq(k->mem_copy(full, a, sizeof full, KERNELS_COPY_D2H), 0, "%s", error_message());
    for (int r = 0; r < ROWS; r++) {
        for (int c = 0; c < SP; c++)
            cr_assert_eq(full[r * SP + c], c >= 7 && c < 7 + W ? host[r * SP + 3 + c - 7] : 0x5a, "H2D row %d col %d",
                         r, c);
        for (int c = 0; c < DP; c++)
            cr_assert_eq(back[r * DP + c], c >= 2 && c < 2 + W ? host[r * SP + 3 + c - 2] : 0xc3, "D2D row %d col %d",
                         r, c);
    }
    /* nothing to copy is fine; a pitch under the width and overlapping regions are refused */
    cr_assert_eq(k->mem_copy2d(b, DP, a, SP, W, 0, KERNELS_COPY_D2D), 0, "%s", error_message());
    cr_assert_eq(k->mem_copy2d(b, W - 1, a, SP, W, 2, KERNELS_COPY_D2D), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "mem_copy2d") && strstr(error_message(), "pitch"), "%s", error_message());
    cr_assert_eq(k->mem_copy2d(a + 1, SP, a, SP, W, 3, KERNELS_COPY_D2D), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "overlap"), "%s", error_message());
    cr_assert_eq(k->mem_copy2d(b, DP, a, SP, W, 2, (enum kernels_copy_kind)9), FSDP_EINVAL);
    k->mem_free(a), k->mem_free(b);
}

/* What a table says it can do (kernels.h: host_visible, host, comm_backend, auto_dtype, peak_flops) is what
 * its memory and its host table do, so the engine can ask the fields instead of the name. */
Test(kernels_ops, capabilities_match_the_table)
{
    const struct kernels *k = tu_backend();
    cr_assert(k->host && k->comm_backend && k->comm_backend[0], "%s: host and comm_backend must be set", k->name);
    cr_assert(k->auto_dtype == DTYPE_F32 || k->auto_dtype == DTYPE_BF16 || k->auto_dtype == DTYPE_F16,
              "%s: auto_dtype %d", k->name, (int)k->auto_dtype);
    const struct kernels *h = k->host();
    cr_assert(h && h->host_visible, "%s: its host table must be host-visible", k->name);
    cr_assert_eq(h->host(), h, "a host table is its own host table");
    if (k->host_visible) {
        cr_assert_eq(h, k, "%s: a host-visible table is its own host table", k->name);
        /* Host stores into its memory are what mem_copy reads back, and the other way round. */
        float *d = k->mem_alloc(4 * sizeof(float)), back[4] = {0}, src[4] = {5, 6, 7, 8};
        cr_assert(d);
        for (int i = 0; i < 4; i++)
            d[i] = (float)i + 0.5f;
        cr_assert_eq(k->mem_copy(back, d, sizeof back, KERNELS_COPY_D2H), 0, "%s", error_message());
        for (int i = 0; i < 4; i++)
            cr_assert_eq(back[i], (float)i + 0.5f);
        cr_assert_eq(k->mem_copy(d, src, sizeof src, KERNELS_COPY_H2D), 0, "%s", error_message());
        cr_assert_eq(memcmp(d, src, sizeof src), 0);
        k->mem_free(d);
    }
    /* The CPU table as kernels.h documents it. */
    const struct kernels *c = kernels_cpu();
    cr_assert(c->host_visible);
    cr_assert_eq(c->host(), c);
    cr_assert_str_eq(c->comm_backend, "cpu");
    cr_assert_eq(c->auto_dtype, DTYPE_F32);
    cr_assert(c->matmul_dtypes & DTYPE_BIT(DTYPE_F32));
    cr_assert(!(c->matmul_dtypes & DTYPE_BIT(DTYPE_F16)), "no fp16 matmuls on CPUs (oneDNN 2.6)");
    cr_assert(c->lowp_bind && c->lowp_unbind, "the CPU table takes bound bf16 copies");
    cr_assert(c->peak_flops, "the CPU table measures its peak FLOP/s");
    double peak = c->peak_flops();
    cr_assert(peak > 1e8 && isfinite(peak), "CPU peak %.3g FLOP/s", peak);
}

/* The build must load the OpenMP flavour of OpenBLAS, which shares OpenMP's threads (see
 * kernels/meson.build); the pthread flavour would oversubscribe ranks sharing a machine. */
extern int openblas_get_parallel(void);
Test(kernels_ops, openblas_is_openmp_build)
{
    cr_assert_eq(openblas_get_parallel(), 2, "OpenBLAS threading model %d (2 = OpenMP)", openblas_get_parallel());
}

/* The backend's own reductions (layernorm parameter gradients, bias gradients, embedding scatter,
 * attention) are split by columns or by (batch, head), never by rows, so the bits must not depend on
 * the number of OpenMP threads: ranks with different OMP_NUM_THREADS still agree. */
Test(kernels_ops, same_bits_for_any_thread_count)
{
    const struct kernels *k = tu_backend();
    const int B = 2, T = 37, C = 96, NH = 3, N = B * T, V = 29;
    float *x = tu_host_rand((size_t)N * 3 * C, 81, -1, 1), *dy = tu_host_rand((size_t)N * 3 * C, 82, -1, 1);
    float *w = tu_host_rand(3 * C, 83, 0.5, 1.5);
    int32_t tok[74];
    for (int i = 0; i < N; i++)
        tok[i] = (i * 7) % V;
    float *res[2][6];
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run ? 3 : 1);
        float *dx = tu_devf(k, x, (size_t)N * 3 * C), *ddy = tu_devf(k, dy, (size_t)N * 3 * C), *dw = tu_devf(k, w, 3 * C);
        float *out = tu_devf(k, NULL, (size_t)N * 3 * C), *mean = tu_devf(k, NULL, N), *rstd = tu_devf(k, NULL, N);
        float *gx = tu_devf(k, NULL, (size_t)N * 3 * C), *gw = tu_devf(k, NULL, 3 * C), *gb = tu_devf(k, NULL, 3 * C);
        float *ao = tu_devf(k, NULL, (size_t)N * C), *lse = tu_devf(k, NULL, (size_t)B * NH * T);
        float *gq = tu_devf(k, NULL, (size_t)N * 3 * C), *gte = tu_devf(k, NULL, (size_t)V * C);
        int32_t *dt = tu_dev_from(k, tok, sizeof tok);
        void *ws = k->mem_alloc(k->attention_workspace_bytes(B, T, C, NH, NH));
        cr_assert(ws);
        cr_assert_eq(k->layernorm_forward(out, mean, rstd, dx, dw, dw, N, 3 * C, 1e-5f), 0);
        cr_assert_eq(k->layernorm_backward(gx, gw, gb, ddy, dx, dw, mean, rstd, N, 3 * C), 0);
        cr_assert_eq(k->matmul_backward(NULL, NULL, gb, ddy, dx, dw, N, 3 * C, 3 * C), 0);
        cr_assert_eq(k->attention_forward(ao, lse, dx, B, T, C, NH, NH, 0, ws), 0);
        cr_assert_eq(k->attention_backward(gq, ddy, dx, ao, lse, B, T, C, NH, NH, 0, ws), 0);
        cr_assert_eq(k->embedding_backward(gte, NULL, ddy, dt, 1, N, C, V), 0);
        res[run][0] = tu_downf(k, out, (size_t)N * 3 * C);
        res[run][1] = tu_downf(k, gx, (size_t)N * 3 * C);
        res[run][2] = tu_downf(k, gw, 3 * C);
        res[run][3] = tu_downf(k, gb, 3 * C);
        res[run][4] = tu_downf(k, gq, (size_t)N * 3 * C);
        res[run][5] = tu_downf(k, gte, (size_t)V * C);
        k->mem_free(dx), k->mem_free(ddy), k->mem_free(dw), k->mem_free(out), k->mem_free(mean), k->mem_free(rstd);
        k->mem_free(gx), k->mem_free(gw), k->mem_free(gb), k->mem_free(ao), k->mem_free(lse), k->mem_free(gq);
        k->mem_free(gte), k->mem_free(dt), k->mem_free(ws);
    }
    /* the double reductions too: sqnorm and the cross-entropy loss sum */
    float *big = tu_host_rand(300001, 84, -1, 1), *lg = tu_host_rand((size_t)N * V, 85, -5, 5);
    float *dbig = tu_devf(k, big, 300001), *dlg = tu_devf(k, lg, (size_t)N * V);
    int32_t *dt = tu_dev_from(k, tok, sizeof tok);
    double sq[2], ls[2];
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run ? 3 : 1);
        cr_assert_eq(k->sqnorm(&sq[run], dbig, 300001), 0);
        cr_assert_eq(tu_xent(k, NULL, &ls[run], NULL, dlg, dt, N, V, V, 1.0f), 0);
    }
    cr_assert(memcmp(&sq[0], &sq[1], sizeof(double)) == 0, "sqnorm %.17g vs %.17g", sq[0], sq[1]);
    cr_assert(memcmp(&ls[0], &ls[1], sizeof(double)) == 0, "loss sum %.17g vs %.17g", ls[0], ls[1]);
    free(big), free(lg);
    k->mem_free(dbig), k->mem_free(dlg), k->mem_free(dt);
    const size_t len[6] = {(size_t)N * 3 * C, (size_t)N * 3 * C, 3 * C, 3 * C, (size_t)N * 3 * C, (size_t)V * C};
    const char *name[6] = {"ln out", "ln dx", "ln dw", "db", "attention dqkv", "dwte"};
    for (int r = 0; r < 6; r++) {
        cr_assert_arr_eq(res[0][r], res[1][r], len[r] * sizeof(float), "%s differs between 1 and 3 threads", name[r]);
        free(res[0][r]), free(res[1][r]);
    }
    free(x), free(dy), free(w);
}

/* set_matmul_dtype: every backend takes the three dtypes and refuses others; a dtype outside the table's
 * matmul_dtypes computes in fp32, so its results keep fp32's bits (CPU fp16 everywhere, CPU bf16 without bf16
 * instructions), and fp32 after a 16-bit mode gives fp32's bits again. Native 16-bit results are checked in
 * test_cpu_matmul and test_kernels_cuda. */
Test(kernels_ops, matmul_dtype_setting)
{
    const struct kernels *k = tu_backend();
    cr_assert_lt(k->set_matmul_dtype((enum dtype)7), 0, "dtype 7 accepted");
    cr_assert(strstr(error_message(), "set_matmul_dtype"), "unclear message: %s", error_message());
    cr_assert(k->matmul_dtypes & DTYPE_BIT(DTYPE_F32), "%s: fp32 matmuls must be native", k->name);
    const int n = 33, in = 47, out = 29;
    float *x = tu_host_rand((size_t)n * in, 41, -1, 1), *w = tu_host_rand((size_t)in * out, 42, -1, 1);
    float *dx = tu_devf(k, x, (size_t)n * in), *dw = tu_devf(k, w, (size_t)in * out);
    float *y = tu_devf(k, NULL, (size_t)n * out);
    float *ref = NULL;
    const enum dtype modes[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        cr_assert_eq(k->set_matmul_dtype(modes[m]), 0, "%s", error_message());
        cr_assert_eq(k->matmul_forward(y, dx, dw, NULL, n, in, out), 0, "%s", error_message());
        float *h = tu_downf(k, y, (size_t)n * out);
        if (!ref)
            ref = h;
        else {
            if (!(k->matmul_dtypes & DTYPE_BIT(modes[m])) || modes[m] == DTYPE_F32)
                cr_assert_eq(memcmp(h, ref, (size_t)n * out * sizeof *h), 0, "mode %d changed fp32 results",
                             (int)modes[m]);
            free(h);
        }
    }
    free(ref);
    k->mem_free(dx), k->mem_free(dw), k->mem_free(y);
    free(x), free(w);
}
