/* The Llama ops of the kernels table (RMSNorm, rotary position embeddings, SwiGLU, embeddings without a
 * position table) against double-precision references on odd shapes, finite differences of the backend's
 * own forward for every backward, accumulation (+=) into non-zero gradients, and bits that do not depend
 * on the thread count. Runs on the backend FSDP_KERNELS_BACKEND names (tests/util/tu_kernels.h). */
#include <omp.h>

#include "tests/util/tu_kernels.h"

/* ---------- RMSNorm ---------- */

static void ref_rmsnorm(double *out, double *rstd, const float *x, const float *w, int n, int c, double eps)
{
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int j = 0; j < c; j++)
            ss += (double)x[(size_t)i * c + j] * x[(size_t)i * c + j];
        double rs = 1.0 / sqrt(ss / c + eps);
        for (int j = 0; j < c; j++)
            out[(size_t)i * c + j] = x[(size_t)i * c + j] * rs * w[j];
        rstd[i] = rs;
    }
}

Test(kernels_llama, rmsnorm_forward_backward)
{
    const struct kernels *k = tu_backend();
    /* {1,1}; odd shapes; the one-pass single-thread path and the parallel row/strip paths (n*c > 16384);
     * a width above the fused path's limit */
    const int shapes[][2] = {{1, 1}, {3, 7}, {17, 129}, {64, 768}, {5, 9000}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int n = shapes[si][0], c = shapes[si][1];
        size_t nc = (size_t)n * c;
        const double eps = si == 2 ? 1e-6 : 1e-5;
        float *x = tu_host_rand(nc, 31 + si, -2, 2), *w = tu_host_rand(c, 32, 0.5, 1.5);
        float *dy = tu_host_rand(nc, 34, -1, 1);
        float *dx_ = tu_devf(k, x, nc), *dw_ = tu_devf(k, w, c), *ddy = tu_devf(k, dy, nc);
        float *dout = tu_devf(k, NULL, nc), *drstd = tu_devf(k, NULL, n);
        cr_assert_eq(k->rmsnorm_forward(dout, drstd, dx_, dw_, n, c, (float)eps), 0, "%s", error_message());
        double *ro = tu_dzeros(nc), *rr = tu_dzeros(n);
        ref_rmsnorm(ro, rr, x, w, n, c, eps);
        float *o = tu_downf(k, dout, nc), *rs = tu_downf(k, drstd, n);
        tu_check_near("rms out", o, ro, nc, 1e-6, 2e-6);
        tu_check_near("rms rstd", rs, rr, n, 0, 2e-6);

        float *g0 = tu_host_rand(nc, 35, -1, 1), *gw0 = tu_host_rand(c, 36, -1, 1);
        float *gx = tu_devf(k, g0, nc), *gw = tu_devf(k, gw0, c);
        cr_assert_eq(k->rmsnorm_backward(gx, gw, ddy, dx_, dw_, drstd, n, c), 0, "%s", error_message());
        double *rgx = tu_dzeros(nc), *rgw = tu_dzeros(c);
        for (int j = 0; j < c; j++)
            rgw[j] = gw0[j];
        for (int i = 0; i < n; i++) {
            double s = 0;
            for (int j = 0; j < c; j++) {
                double nrm = x[(size_t)i * c + j] * rr[i], dn = (double)dy[(size_t)i * c + j] * w[j];
                s += dn * nrm;
                rgw[j] += dy[(size_t)i * c + j] * nrm;
            }
            for (int j = 0; j < c; j++) {
                double nrm = x[(size_t)i * c + j] * rr[i], dn = (double)dy[(size_t)i * c + j] * w[j];
                rgx[(size_t)i * c + j] = g0[(size_t)i * c + j] + (dn - nrm * s / c) * rr[i];
            }
        }
        float *hgx = tu_downf(k, gx, nc), *hgw = tu_downf(k, gw, c);
        tu_check_near("rms dx", hgx, rgx, nc, 1e-5 * (1 + rr[0]), 1e-5);
        tu_check_near("rms dw", hgw, rgw, c, 2e-6 * n, 1e-5);
        /* dinp alone and dweight alone give the same as together */
        float *gx2 = tu_devf(k, g0, nc), *gw2 = tu_devf(k, gw0, c);
        cr_assert_eq(k->rmsnorm_backward(gx2, NULL, ddy, dx_, dw_, drstd, n, c), 0);
        cr_assert_eq(k->rmsnorm_backward(NULL, gw2, ddy, dx_, dw_, drstd, n, c), 0);
        float *hgx2 = tu_downf(k, gx2, nc), *hgw2 = tu_downf(k, gw2, c);
        tu_check_near("rms dx (alone)", hgx2, rgx, nc, 1e-5 * (1 + rr[0]), 1e-5);
        tu_check_near("rms dw (alone)", hgw2, rgw, c, 2e-6 * n, 1e-5);
        free(x), free(w), free(dy), free(ro), free(rr), free(o), free(rs), free(g0), free(gw0), free(rgx), free(rgw);
        free(hgx), free(hgw), free(hgx2), free(hgw2);
        k->mem_free(dx_), k->mem_free(dw_), k->mem_free(ddy), k->mem_free(dout), k->mem_free(drstd);
        k->mem_free(gx), k->mem_free(gw), k->mem_free(gx2), k->mem_free(gw2);
    }
    float dummy[4] = {0};
    cr_assert_eq(k->rmsnorm_forward(dummy, dummy, dummy, dummy, 1, 0, 1e-5f), FSDP_EINVAL);
    cr_assert_eq(k->rmsnorm_forward(dummy, dummy, dummy, dummy, 1, 2, -1.0f), FSDP_EINVAL);
    cr_assert_eq(k->rmsnorm_backward(dummy, dummy, dummy, dummy, dummy, dummy, -1, 2), FSDP_EINVAL);
}

/* Loss L = sum(out * r): d L / d x and d L / d w by central differences against backward. */
Test(kernels_llama, rmsnorm_finite_differences)
{
    const struct kernels *k = tu_backend();
    const int n = 3, c = 10;
    float *x = tu_host_rand(n * c, 41, -2, 2), *w = tu_host_rand(c, 42, 0.5, 1.5), *r = tu_host_rand(n * c, 44, -1, 1);
    float *dx = tu_devf(k, x, n * c), *dw = tu_devf(k, w, c), *dr = tu_devf(k, r, n * c);
    float *dout = tu_devf(k, NULL, n * c), *ds = tu_devf(k, NULL, n);
    float *gx = tu_devf(k, NULL, n * c), *gw = tu_devf(k, NULL, c);
    cr_assert_eq(k->rmsnorm_forward(dout, ds, dx, dw, n, c, 1e-5f), 0);
    cr_assert_eq(k->rmsnorm_backward(gx, gw, dr, dx, dw, ds, n, c), 0);
    float *hx = tu_downf(k, gx, n * c), *hw = tu_downf(k, gw, c);
    const float h = 1e-2f;
    for (int which = 0; which < 2; which++) {
        float *v = which ? w : x, *dv = which ? dw : dx;
        int len = which ? c : n * c;
        for (int e = 0; e < len; e++) {
            double lv[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                float saved = v[e];
                v[e] = saved + (sgn ? -h : h);
                k->mem_copy(dv, v, (size_t)len * sizeof(float), KERNELS_COPY_H2D);
                cr_assert_eq(k->rmsnorm_forward(dout, ds, dx, dw, n, c, 1e-5f), 0);
                float *y = tu_downf(k, dout, n * c);
                lv[sgn] = 0;
                for (int i = 0; i < n * c; i++)
                    lv[sgn] += (double)y[i] * r[i];
                free(y);
                v[e] = saved;
            }
            k->mem_copy(dv, v, (size_t)len * sizeof(float), KERNELS_COPY_H2D);
            double fd = (lv[0] - lv[1]) / (2 * h), got = which ? hw[e] : hx[e];
            cr_assert(fabs(fd - got) <= 2e-3 + 1e-2 * fabs(fd), "%s[%d]: backward %g, fd %g", which ? "dw" : "dx", e,
                      got, fd);
        }
    }
    free(x), free(w), free(r), free(hx), free(hw);
    k->mem_free(dx), k->mem_free(dw), k->mem_free(dr), k->mem_free(dout), k->mem_free(ds), k->mem_free(gx);
    k->mem_free(gw);
}

/* ---------- rotary position embeddings ---------- */

/* The table transformers builds for rope_theta: inv_freq_j = 1 / theta^(2j/hs), angle = pos * inv_freq. */
static float *rope_table(int npos, int hs, double theta)
{
    float *t = malloc((size_t)npos * hs * sizeof *t);
    cr_assert(t);
    for (int p = 0; p < npos; p++)
        for (int j = 0; j < hs / 2; j++) {
            double a = p / pow(theta, 2.0 * j / hs);
            t[(size_t)p * hs + j] = (float)cos(a);
            t[(size_t)p * hs + hs / 2 + j] = (float)sin(a);
        }
    return t;
}

/* rotate_half: [x1 | x2] -> [x1 c - x2 s | x2 c + x1 s], in double; sign -1 rotates back. */
static void ref_rope(double *out, const float *x, int n, int ld, int nheads, int hs, const int32_t *pos,
                     const float *tab, int sign)
{
    for (int i = 0; i < n; i++)
        for (int col = 0; col < ld; col++)
            out[(size_t)i * ld + col] = x[(size_t)i * ld + col];
    for (int i = 0; i < n; i++)
        for (int h = 0; h < nheads; h++)
            for (int j = 0; j < hs / 2; j++) {
                const float *cs = tab + (size_t)pos[i] * hs;
                double c = cs[j], s = sign * (double)cs[hs / 2 + j];
                double x1 = x[(size_t)i * ld + h * hs + j], x2 = x[(size_t)i * ld + h * hs + hs / 2 + j];
                out[(size_t)i * ld + h * hs + j] = x1 * c - x2 * s;
                out[(size_t)i * ld + h * hs + hs / 2 + j] = x2 * c + x1 * s;
            }
}

static void check_rope(int n, int ld, int nheads, int hs, int npos, double theta, uint64_t seed)
{
    const struct kernels *k = tu_backend();
    size_t len = (size_t)n * ld;
    float *x = tu_host_rand(len, seed, -2, 2), *tab = rope_table(npos, hs, theta);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    cr_assert(pos);
    /* any positions, not 0..n-1: a later sequence chunk, repeats, the last table row */
    for (int i = 0; i < n; i++)
        pos[i] = (int32_t)((i * 7 + 3) % npos);
    pos[n - 1] = npos - 1;
    float *dx = tu_devf(k, x, len), *dtab = tu_devf(k, tab, (size_t)npos * hs);
    int32_t *dpos = tu_dev_from(k, pos, (size_t)n * sizeof *pos);
    double *want = tu_dzeros(len);
    for (int sign = 1; sign >= -1; sign -= 2) {
        k->mem_copy(dx, x, len * sizeof(float), KERNELS_COPY_H2D);
        int rc = sign > 0 ? k->rope_forward(dx, n, ld, nheads, hs, dpos, dtab, npos)
                          : k->rope_backward(dx, n, ld, nheads, hs, dpos, dtab, npos);
        cr_assert_eq(rc, 0, "%s", error_message());
        ref_rope(want, x, n, ld, nheads, hs, pos, tab, sign);
        float *got = tu_downf(k, dx, len);
        /* columns past nheads*hs are untouched, bit for bit */
        for (int i = 0; i < n; i++)
            for (int col = nheads * hs; col < ld; col++)
                cr_assert(memcmp(&got[(size_t)i * ld + col], &x[(size_t)i * ld + col], sizeof(float)) == 0,
                          "column %d of row %d changed", col, i);
        tu_check_near(sign > 0 ? "rope forward" : "rope backward", got, want, len, 1e-6, 1e-6);
        free(got);
    }
    /* backward is the transpose of forward (and here its inverse): rope_backward(rope_forward(x)) = x */
    k->mem_copy(dx, x, len * sizeof(float), KERNELS_COPY_H2D);
    cr_assert_eq(k->rope_forward(dx, n, ld, nheads, hs, dpos, dtab, npos), 0);
    cr_assert_eq(k->rope_backward(dx, n, ld, nheads, hs, dpos, dtab, npos), 0);
    float *back = tu_downf(k, dx, len);
    for (size_t i = 0; i < len; i++)
        want[i] = x[i];
    tu_check_near("rope round trip", back, want, len, 1e-6, 1e-6);
    free(x), free(tab), free(pos), free(want), free(back);
    k->mem_free(dx), k->mem_free(dtab), k->mem_free(dpos);
}

Test(kernels_llama, rope_forward_backward)
{
    check_rope(1, 2, 1, 2, 1, 10000.0, 1);          /* the smallest head, position 0 only */
    check_rope(13, 48, 6, 8, 13, 10000.0, 2);       /* q and k heads of a packed qkv row: 6 of 8 heads roped */
    check_rope(70, 256 + 2 * 64, 6, 64, 300, 500000.0, 3); /* Llama 3's theta, positions past n */
    check_rope(300, 96, 3, 32, 300, 10000.0, 4);    /* the parallel path */
}

/* The backward is the adjoint: <rope(x), y> = <x, rope_backward(y)>, whatever the positions. */
Test(kernels_llama, rope_backward_is_the_transpose)
{
    const struct kernels *k = tu_backend();
    const int n = 9, ld = 40, nh = 3, hs = 10, npos = 20;
    float *x = tu_host_rand((size_t)n * ld, 5, -1, 1), *y = tu_host_rand((size_t)n * ld, 6, -1, 1);
    float *tab = rope_table(npos, hs, 10000.0);
    int32_t pos[9] = {19, 0, 5, 5, 7, 1, 18, 3, 11};
    float *dx = tu_devf(k, x, (size_t)n * ld), *dy = tu_devf(k, y, (size_t)n * ld), *dt = tu_devf(k, tab, (size_t)npos * hs);
    int32_t *dp = tu_dev_from(k, pos, sizeof pos);
    cr_assert_eq(k->rope_forward(dx, n, ld, nh, hs, dp, dt, npos), 0);
    cr_assert_eq(k->rope_backward(dy, n, ld, nh, hs, dp, dt, npos), 0);
    float *rx = tu_downf(k, dx, (size_t)n * ld), *ry = tu_downf(k, dy, (size_t)n * ld);
    double a = 0, b = 0;
    for (int i = 0; i < n * ld; i++) {
        a += (double)rx[i] * y[i];
        b += (double)x[i] * ry[i];
    }
    cr_assert(fabs(a - b) <= 1e-5 * (fabs(a) + 1), "<rope x, y> = %.9g but <x, rope^T y> = %.9g", a, b);
    free(x), free(y), free(tab), free(rx), free(ry);
    k->mem_free(dx), k->mem_free(dy), k->mem_free(dt), k->mem_free(dp);
}

Test(kernels_llama, rope_rejects_bad_shapes)
{
    const struct kernels *k = tu_backend();
    float dummy[16] = {0};
    int32_t *dp = tu_dev_from(k, (int32_t[2]){0, 0}, 2 * sizeof(int32_t));
    cr_assert_eq(k->rope_forward(dummy, 2, 8, 1, 3, dp, dummy, 4), FSDP_EINVAL); /* odd head size */
    cr_assert(strstr(error_message(), "even"), "%s", error_message());
    cr_assert_eq(k->rope_forward(dummy, 2, 4, 2, 4, dp, dummy, 4), FSDP_EINVAL); /* ld < nheads*hs */
    cr_assert_eq(k->rope_backward(dummy, 2, 4, 1, 4, dp, dummy, 0), FSDP_EINVAL);
    k->mem_free(dp);
    /* the CPU backend checks every position against the table */
    const struct kernels *c = kernels_cpu();
    int32_t bad[2] = {0, 4};
    cr_assert_eq(c->rope_forward(dummy, 2, 4, 1, 4, bad, dummy, 4), FSDP_ERANGE);
    cr_assert(strstr(error_message(), "position 4 of row 1"), "%s", error_message());
}

/* ---------- SwiGLU ---------- */

static double ref_silu(double g)
{
    return g / (1.0 + exp(-g));
}

Test(kernels_llama, swiglu_forward_backward)
{
    const struct kernels *k = tu_backend();
    const int shapes[][2] = {{1, 1}, {3, 7}, {33, 172}, {64, 688}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int n = shapes[si][0], m = shapes[si][1];
        size_t nm = (size_t)n * m;
        /* gates far into both tails: silu saturates to 0 and to g without inf or NaN */
        float *gu = tu_host_rand(2 * nm, 51 + si, -6, 6), *dy = tu_host_rand(nm, 52, -1, 1);
        gu[0] = -120.0f, gu[2 * nm - 1] = 95.0f;
        if (m > 1)
            gu[1] = 110.0f;
        float *g0 = tu_host_rand(2 * nm, 53, -1, 1);
        float *dgu_ = tu_devf(k, gu, 2 * nm), *ddy = tu_devf(k, dy, nm), *dout = tu_devf(k, NULL, nm);
        float *dg = tu_devf(k, g0, 2 * nm);
        cr_assert_eq(k->swiglu_forward(dout, dgu_, n, m), 0, "%s", error_message());
        cr_assert_eq(k->swiglu_backward(dg, dgu_, ddy, n, m), 0, "%s", error_message());
        double *ro = tu_dzeros(nm), *rg = tu_dzeros(2 * nm);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) {
                size_t r = (size_t)i * 2 * m;
                double g = gu[r + j], u = gu[r + m + j], d = dy[(size_t)i * m + j], s = 1.0 / (1.0 + exp(-g));
                ro[(size_t)i * m + j] = ref_silu(g) * u;
                rg[r + j] = g0[r + j] + d * u * s * (1.0 + g * (1.0 - s));
                rg[r + m + j] = g0[r + m + j] + d * ref_silu(g);
            }
        float *o = tu_downf(k, dout, nm), *g = tu_downf(k, dg, 2 * nm);
        tu_check_near("swiglu out", o, ro, nm, 1e-6, 4e-6);
        tu_check_near("swiglu dgu", g, rg, 2 * nm, 1e-6, 4e-6);
        free(gu), free(dy), free(g0), free(ro), free(rg), free(o), free(g);
        k->mem_free(dgu_), k->mem_free(ddy), k->mem_free(dout), k->mem_free(dg);
    }
    float dummy[4] = {0};
    cr_assert_eq(k->swiglu_forward(dummy, dummy, 1, 0), FSDP_EINVAL);
    cr_assert_eq(k->swiglu_backward(dummy, dummy, dummy, -1, 1), FSDP_EINVAL);
}

Test(kernels_llama, swiglu_finite_differences)
{
    const struct kernels *k = tu_backend();
    const int n = 3, m = 5;
    float *gu = tu_host_rand(2 * n * m, 61, -3, 3), *r = tu_host_rand(n * m, 62, -1, 1);
    float *dgu = tu_devf(k, gu, 2 * n * m), *dr = tu_devf(k, r, n * m), *dout = tu_devf(k, NULL, n * m);
    float *dg = tu_devf(k, NULL, 2 * n * m);
    cr_assert_eq(k->swiglu_backward(dg, dgu, dr, n, m), 0);
    float *g = tu_downf(k, dg, 2 * n * m);
    const float h = 1e-2f;
    for (int e = 0; e < 2 * n * m; e++) {
        double lv[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            float saved = gu[e];
            gu[e] = saved + (sgn ? -h : h);
            k->mem_copy(dgu, gu, 2 * (size_t)n * m * sizeof(float), KERNELS_COPY_H2D);
            cr_assert_eq(k->swiglu_forward(dout, dgu, n, m), 0);
            float *y = tu_downf(k, dout, n * m);
            lv[sgn] = 0;
            for (int i = 0; i < n * m; i++)
                lv[sgn] += (double)y[i] * r[i];
            free(y);
            gu[e] = saved;
        }
        double fd = (lv[0] - lv[1]) / (2 * h);
        cr_assert(fabs(fd - g[e]) <= 2e-3 + 1e-2 * fabs(fd), "dgu[%d]: backward %g, fd %g", e, (double)g[e], fd);
    }
    free(gu), free(r), free(g);
    k->mem_free(dgu), k->mem_free(dr), k->mem_free(dout), k->mem_free(dg);
}

/* ---------- embeddings without a position table ---------- */

Test(kernels_llama, embedding_without_positions)
{
    const struct kernels *k = tu_backend();
    const int B = 2, T = 4, C = 70, V = 9;
    int32_t tok[8] = {0, 8, 3, 3, 8, 1, 0, 3};
    float *wte = tu_host_rand(V * C, 81, -1, 1), *dy = tu_host_rand(B * T * C, 82, -1, 1);
    float *gte0 = tu_host_rand(V * C, 83, -1, 1);
    int32_t *dtok = tu_dev_from(k, tok, sizeof tok);
    float *dte = tu_devf(k, wte, V * C), *dout = tu_devf(k, NULL, B * T * C), *ddy = tu_devf(k, dy, B * T * C);
    float *gte = tu_devf(k, gte0, V * C);
    cr_assert_eq(k->embedding_forward(dout, dtok, dte, NULL, B, T, C, V), 0, "%s", error_message());
    cr_assert_eq(k->embedding_backward(gte, NULL, ddy, dtok, B, T, C, V), 0, "%s", error_message());
    double *ro = tu_dzeros(B * T * C), *rte = tu_dzeros(V * C);
    for (int i = 0; i < V * C; i++)
        rte[i] = gte0[i];
    for (int i = 0; i < B * T; i++)
        for (int j = 0; j < C; j++) {
            ro[i * C + j] = wte[tok[i] * C + j];
            rte[tok[i] * C + j] += dy[i * C + j];
        }
    float *o = tu_downf(k, dout, B * T * C), *ht = tu_downf(k, gte, V * C);
    tu_check_near("emb out", o, ro, B * T * C, 0, 0);
    tu_check_near("emb dwte", ht, rte, V * C, 1e-6, 1e-6);
    free(wte), free(dy), free(gte0), free(ro), free(rte), free(o), free(ht);
    k->mem_free(dtok), k->mem_free(dte), k->mem_free(dout), k->mem_free(ddy), k->mem_free(gte);
}

/* ---------- determinism ---------- */

/* The RMSNorm weight gradient is reduced by column strips (CPU) or fixed row chunks (CUDA), never split
 * by thread: the same bits at 1 and 3 threads, for both backward paths (one-pass and parallel), and the
 * grouped-query attention backward likewise (one key/value head's query heads on one thread). */
Test(kernels_llama, same_bits_for_any_thread_count)
{
    const struct kernels *k = tu_backend();
    const int shapes[][2] = {{37, 96}, {40, 1024}};
    for (size_t si = 0; si < 2; si++) {
        int n = shapes[si][0], c = shapes[si][1];
        size_t nc = (size_t)n * c;
        float *x = tu_host_rand(nc, 91, -1, 1), *dy = tu_host_rand(nc, 92, -1, 1), *w = tu_host_rand(c, 93, 0.5, 1.5);
        float *res[2][3];
        for (int run = 0; run < 2; run++) {
            omp_set_num_threads(run ? 3 : 1);
            float *dx = tu_devf(k, x, nc), *ddy = tu_devf(k, dy, nc), *dw = tu_devf(k, w, c);
            float *out = tu_devf(k, NULL, nc), *rstd = tu_devf(k, NULL, n), *gx = tu_devf(k, NULL, nc);
            float *gw = tu_devf(k, NULL, c);
            cr_assert_eq(k->rmsnorm_forward(out, rstd, dx, dw, n, c, 1e-5f), 0);
            cr_assert_eq(k->rmsnorm_backward(gx, gw, ddy, dx, dw, rstd, n, c), 0);
            res[run][0] = tu_downf(k, out, nc);
            res[run][1] = tu_downf(k, gx, nc);
            res[run][2] = tu_downf(k, gw, c);
            k->mem_free(dx), k->mem_free(ddy), k->mem_free(dw), k->mem_free(out), k->mem_free(rstd);
            k->mem_free(gx), k->mem_free(gw);
        }
        const size_t len[3] = {nc, nc, (size_t)c};
        const char *name[3] = {"rms out", "rms dx", "rms dw"};
        for (int r = 0; r < 3; r++) {
            cr_assert_arr_eq(res[0][r], res[1][r], len[r] * sizeof(float), "%s (n %d, c %d) differs between 1 and 3 "
                             "threads", name[r], n, c);
            free(res[0][r]), free(res[1][r]);
        }
        free(x), free(dy), free(w);
    }
    const int B = 2, T = 70, C = 256, NH = 4, NKV = 2, W = C + 2 * NKV * (C / NH);
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * C;
    float *qkv = tu_host_rand(nq, 94, -1, 1), *dout = tu_host_rand(no, 95, -1, 1), *g[2];
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run ? 3 : 1);
        float *dq = tu_devf(k, qkv, nq), *dd = tu_devf(k, dout, no), *o = tu_devf(k, NULL, no);
        float *lse = tu_devf(k, NULL, (size_t)B * NH * T), *gq = tu_devf(k, NULL, nq);
        void *ws = k->mem_alloc(k->attention_workspace_bytes(B, T, C, NH, NKV));
        cr_assert(ws);
        cr_assert_eq(k->attention_forward(o, lse, dq, B, T, C, NH, NKV, 0, ws), 0);
        cr_assert_eq(k->attention_backward(gq, dd, dq, o, lse, B, T, C, NH, NKV, 0, ws), 0);
        g[run] = tu_downf(k, gq, nq);
        k->mem_free(dq), k->mem_free(dd), k->mem_free(o), k->mem_free(lse), k->mem_free(gq), k->mem_free(ws);
    }
    cr_assert_arr_eq(g[0], g[1], nq * sizeof(float), "grouped-query attention dqkv differs between 1 and 3 threads");
    free(g[0]), free(g[1]), free(qkv), free(dout);
}
