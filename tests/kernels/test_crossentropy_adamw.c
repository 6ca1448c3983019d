/* Fused softmax cross-entropy (padded vocabulary, ignored targets, in-place gradient) against a double
 * reference and finite differences; AdamW against a hand computation and a reference loop. */
#include "tests/util/tu_kernels.h"

static double ref_row_lse(const float *x, int v)
{
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < v; j++)
        mx = x[j] > mx ? x[j] : mx;
    for (int j = 0; j < v; j++)
        s += exp(x[j] - mx);
    return mx + log(s);
}

static void check_xent(int n, int v, int vp, int inplace, float spread, uint64_t seed)
{
    const struct kernels *k = tu_backend();
    size_t nl = (size_t)n * vp;
    float *logits = tu_host_rand(nl, seed, -spread, spread);
    /* padded columns hold values that would dominate (or poison) the softmax if they were read */
    for (int i = 0; i < n; i++)
        for (int j = v; j < vp; j++)
            logits[(size_t)i * vp + j] = (j % 2) ? NAN : 1e30f;
    int32_t *tg = malloc(n * sizeof *tg);
    uint64_t s = seed;
    for (int i = 0; i < n; i++)
        tg[i] = (i % 5 == 3) ? -1 : (int32_t)(tu_rand(&s) * v);
    float *dl = tu_devf(k, logits, nl), *dloss_rows = tu_devf(k, NULL, n);
    float *dgrad = inplace ? dl : tu_devf(k, NULL, nl);
    int32_t *dt = tu_dev_from(k, tg, n * sizeof *tg);
    double sum = -1;
    const float dloss = 1.0f / 7.0f;
    cr_assert_eq(tu_xent(k, dloss_rows, &sum, dgrad, dl, dt, n, v, vp, dloss), 0, "%s",
                 error_message());
    float *rows = tu_downf(k, dloss_rows, n), *grad = tu_downf(k, dgrad, nl);
    double *rrows = tu_dzeros(n), *rgrad = tu_dzeros(nl), rsum = 0;
    for (int i = 0; i < n; i++) {
        if (tg[i] < 0)
            continue;
        const float *x = logits + (size_t)i * vp;
        double lse = ref_row_lse(x, v);
        rrows[i] = lse - x[tg[i]];
        rsum += rrows[i];
        for (int j = 0; j < v; j++)
            rgrad[(size_t)i * vp + j] = dloss * (exp(x[j] - lse) - (j == tg[i]));
    }
    tu_check_near("xent row loss", rows, rrows, n, 1e-5, 1e-5);
    cr_assert(fabs(sum - rsum) <= 1e-5 * n + 1e-5 * fabs(rsum), "loss sum %.9g want %.9g", sum, rsum);
    tu_check_near("xent dlogits", grad, rgrad, nl, 1e-7, 1e-4);
    free(logits), free(tg), free(rows), free(grad), free(rrows), free(rgrad);
    k->mem_free(dl), k->mem_free(dloss_rows), k->mem_free(dt);
    if (!inplace)
        k->mem_free(dgrad);
}

Test(kernels_xent, small_and_odd_vocab)
{
    check_xent(1, 1, 1, 0, 1.0f, 1);
    check_xent(7, 13, 16, 0, 3.0f, 2);
}

Test(kernels_xent, gpt2_vocab_padded_in_place)
{
    /* 50257 real entries padded to 50304, several online-softmax chunks per row */
    check_xent(6, 50257, 50304, 1, 10.0f, 3);
}

Test(kernels_xent, rising_logits_rescale)
{
    /* spread 80: chunk maxima differ by far more than float exp range, forcing rescales */
    check_xent(9, 5000, 5003, 0, 80.0f, 4);
}

Test(kernels_xent, forward_only_and_errors)
{
    const struct kernels *k = tu_backend();
    float lg[6] = {1, 2, 3, 4, 5, 6};
    int32_t tg[2] = {2, -1}, bad[2] = {3, 0};
    float *dl = tu_devf(k, lg, 6);
    int32_t *dt = tu_dev_from(k, tg, sizeof tg), *db = tu_dev_from(k, bad, sizeof bad);
    double sum = 0;
    cr_assert_eq(tu_xent(k, NULL, &sum, NULL, dl, dt, 2, 3, 3, 1.0f), 0);
    double want = log(exp(1) + exp(2) + exp(3)) - 3;
    cr_assert(fabs(sum - want) < 1e-6, "sum %.9g want %.9g", sum, want);
    cr_assert_eq(tu_xent(k, NULL, &sum, NULL, dl, db, 2, 3, 3, 1.0f), FSDP_ERANGE);
    cr_assert_eq(tu_xent(k, NULL, &sum, NULL, dl, dt, 2, 3, 2, 1.0f), FSDP_EINVAL);
    k->mem_free(dl), k->mem_free(dt), k->mem_free(db);
}

Test(kernels_xent, loss_sum_accumulates_in_device_memory)
{
    /* The sum is added to a device double that the caller owns: two calls leave twice one call's sum, and no
     * host value is written (the micro-batches of a step add up without a host round trip). */
    const struct kernels *k = tu_backend();
    float lg[6] = {1, 2, 3, 4, 5, 6};
    int32_t tg[2] = {2, 0};
    float *dl = tu_devf(k, lg, 6);
    int32_t *dt = tu_dev_from(k, tg, sizeof tg);
    double one = 0, two = 0;
    cr_assert_eq(tu_xent(k, NULL, &one, NULL, dl, dt, 2, 3, 3, 1.0f), 0, "%s", error_message());
    double *acc = tu_dev_from(k, NULL, sizeof(double));
    for (int i = 0; i < 2; i++)
        cr_assert_eq(k->crossentropy_forward_backward(NULL, acc, NULL, dl, dt, 2, 3, 3, 1.0f), 0, "%s",
                     error_message());
    cr_assert_eq(k->mem_copy(&two, acc, sizeof two, KERNELS_COPY_D2H), 0, "%s", error_message());
    double want = 2 * (log(exp(1) + exp(2) + exp(3)) - 3 + log(exp(4) + exp(5) + exp(6)) - 4);
    cr_assert(fabs(one * 2 - want) < 1e-5 && two == one + one, "one call %.17g, two calls %.17g, want %.17g", one,
              two, want);
    k->mem_free(dl), k->mem_free(dt), k->mem_free(acc);
}

Test(kernels_xent, finite_differences)
{
    const struct kernels *k = tu_backend();
    const int n = 3, v = 9, vp = 12;
    float *lg = tu_host_rand(n * vp, 5, -2, 2);
    int32_t tg[3] = {4, 0, 8};
    float *dl = tu_devf(k, lg, n * vp), *dg = tu_devf(k, NULL, n * vp);
    int32_t *dt = tu_dev_from(k, tg, sizeof tg);
    double sum;
    cr_assert_eq(tu_xent(k, NULL, &sum, dg, dl, dt, n, v, vp, 1.0f), 0);
    float *g = tu_downf(k, dg, n * vp);
    const float h = 1e-2f;
    for (int e = 0; e < n * vp; e++) {
        double lv[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            float saved = lg[e];
            lg[e] = saved + (sgn ? -h : h);
            k->mem_copy(dl, lg, n * vp * sizeof(float), KERNELS_COPY_H2D);
            cr_assert_eq(tu_xent(k, NULL, &lv[sgn], NULL, dl, dt, n, v, vp, 1.0f), 0);
            lg[e] = saved;
        }
        double fd = (lv[0] - lv[1]) / (2 * h);
        cr_assert(fabs(fd - g[e]) <= 1e-3 + 1e-2 * fabs(fd), "dlogits[%d]: backward %g, fd %g", e, (double)g[e], fd);
        if (e % vp >= v)
            cr_assert_eq(g[e], 0.0f, "padded column %d has a gradient", e);
    }
    free(lg), free(g);
    k->mem_free(dl), k->mem_free(dg), k->mem_free(dt);
}

/* ---------- AdamW ---------- */

/* Two steps worked by hand (lr 0.1, betas 0.9/0.999, eps 1e-8, wd 0.01) for p = 1, g = 0.5 then g = -1:
 * step 1: m = 0.05, v = 0.00025, mhat = 0.5, vhat = 0.25, update = 0.5/0.5 = 1 (eps negligible),
 *         p = 1 - 0.1 * (1 + 0.01 * 1) = 0.899
 * step 2: m = 0.045 - 0.1 = -0.055, v = 0.00024975 + 0.001 = 0.00124975,
 *         mhat = -0.055 / 0.19 = -0.289473684, vhat = 0.00124975 / 0.001999 = 0.625187594,
 *         update = -0.289473684 / 0.790688051 = -0.366103, p = 0.899 - 0.1 * (-0.366103 + 0.00899)
 *         = 0.9347113 */
Test(kernels_adamw, hand_computed_two_steps)
{
    const struct kernels *k = tu_backend();
    float p = 1.0f, g1 = 0.5f, g2 = -1.0f, zero[2] = {0, 0};
    float *dp = tu_devf(k, &p, 1), *dg = tu_devf(k, &g1, 1), *dm = tu_devf(k, zero, 1), *dv = tu_devf(k, zero, 1);
    struct kernels_adamw_params hp = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                      .weight_decay = 0.01f, .grad_scale = 1.0f, .step = 1};
    cr_assert_eq(k->adamw(dp, dg, dm, dv, 1, &hp), 0);
    float *r = tu_downf(k, dp, 1);
    cr_assert_float_eq(*r, 0.899f, 1e-6f, "step 1: %.9g", (double)*r);
    free(r);
    k->mem_copy(dg, &g2, sizeof g2, KERNELS_COPY_H2D);
    hp.step = 2;
    cr_assert_eq(k->adamw(dp, dg, dm, dv, 1, &hp), 0);
    r = tu_downf(k, dp, 1);
    cr_assert_float_eq(*r, 0.9347113f, 2e-6f, "step 2: %.9g", (double)*r);
    float *m = tu_downf(k, dm, 1), *v = tu_downf(k, dv, 1);
    cr_assert_float_eq(*m, -0.055f, 1e-7f);
    cr_assert_float_eq(*v, 0.00124975f, 2e-8f); /* 1 - 0.999f is 1e-5 off 0.001 */
    free(r), free(m), free(v);
    k->mem_free(dp), k->mem_free(dg), k->mem_free(dm), k->mem_free(dv);
}

Test(kernels_adamw, matches_reference_loop_with_scale_and_no_decay)
{
    const struct kernels *k = tu_backend();
    const size_t n = 70001;
    float *p = tu_host_rand(n, 11, -1, 1), *m = tu_host_rand(n, 12, -0.1f, 0.1f), *v = tu_host_rand(n, 13, 0, 0.01f);
    float *g = tu_host_rand(n, 14, -2, 2);
    float *dp = tu_devf(k, p, n), *dm = tu_devf(k, m, n), *dv = tu_devf(k, v, n), *dg = tu_devf(k, g, n);
    for (int wd = 0; wd < 2; wd++) {
        struct kernels_adamw_params hp = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                          .weight_decay = wd ? 0.1f : 0.0f, .grad_scale = 0.25f, .step = 7 + wd};
        cr_assert_eq(k->adamw(dp, dg, dm, dv, n, &hp), 0);
        double *rp = tu_dzeros(n), *rm = tu_dzeros(n), *rv = tu_dzeros(n);
        double bc1 = 1 - pow(0.9, hp.step), bc2 = 1 - pow(0.95, hp.step);
        for (size_t i = 0; i < n; i++) {
            double gi = (double)g[i] * 0.25;
            rm[i] = 0.9 * m[i] + 0.1 * gi;
            rv[i] = 0.95 * v[i] + 0.05 * gi * gi;
            rp[i] = p[i] - 3e-4 * (rm[i] / bc1 / (sqrt(rv[i] / bc2) + 1e-8) + hp.weight_decay * (double)p[i]);
        }
        float *hp_ = tu_downf(k, dp, n), *hm = tu_downf(k, dm, n), *hv = tu_downf(k, dv, n);
        /* the betas are floats (0.9f != 0.9): allow their rounding, ~1e-7 relative in 1 - beta */
        tu_check_near("adamw m", hm, rm, n, 1e-7, 1e-5);
        tu_check_near("adamw v", hv, rv, n, 1e-9, 1e-5);
        tu_check_near("adamw p", hp_, rp, n, 2e-7, 1e-6);
        /* carry the backend's state into the next round */
        memcpy(p, hp_, n * sizeof *p), memcpy(m, hm, n * sizeof *m), memcpy(v, hv, n * sizeof *v);
        free(rp), free(rm), free(rv), free(hp_), free(hm), free(hv);
    }
    struct kernels_adamw_params bad = {.lr = 1, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = 0};
    cr_assert_eq(k->adamw(dp, dg, dm, dv, n, &bad), FSDP_EINVAL);
    free(p), free(m), free(v), free(g);
    k->mem_free(dp), k->mem_free(dm), k->mem_free(dv), k->mem_free(dg);
}
