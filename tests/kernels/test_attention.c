/* Causal attention against a naive double-precision softmax(QK^T/sqrt(hs)) V with a full score row, on
 * shapes that are not multiples of the backend's tiles, multi-head and grouped-query (several query heads
 * per key/value head), plus finite differences of the backend's own forward for backward; and bf16 mode
 * (set_matmul_dtype(bf16) on a table that runs bf16 natively) against the same reference of the
 * bf16-rounded inputs, with bounds from the rounding it adds (check_attention_bf16). */
#include "tests/util/tu_kernels.h"

struct att_ref {
    double *out, *lse, *dqkv;
};

static struct att_ref ref_attention_window(const float *qkv, const float *dout, const float *dqkv0, int B, int T,
                                           int C, int NH, int NKV, int mag, int window);

/* qkv (B*T, C + 2*NKV*hs) packed [q (NH heads) | k (NKV heads) | v (NKV heads)], query head h reading
 * key/value head h / (NH/NKV); dout (B*T, C). Fills out, lse (B, NH, T) and dqkv (added to dqkv0).
 * With mag, out and dqkv are the magnitudes of the same sums (every term's absolute value, and for dS the
 * magnitude of D's terms too): the scale of the error that rounding one factor of each term to bf16 can
 * cause. */
static struct att_ref ref_attention_ex(const float *qkv, const float *dout, const float *dqkv0, int B, int T,
                                       int C, int NH, int NKV, int mag)
{
    return ref_attention_window(qkv, dout, dqkv0, B, T, C, NH, NKV, mag, 0);
}

/* The same with a sliding window: query i sees keys i - window < j <= i (0 = every earlier key). */
static struct att_ref ref_attention_window(const float *qkv, const float *dout, const float *dqkv0, int B, int T,
                                           int C, int NH, int NKV, int mag, int window)
{
    int hs = C / NH, W = C + 2 * NKV * hs, G = NH / NKV;
    double scale = 1.0 / sqrt((double)hs);
    struct att_ref r = {tu_dzeros((size_t)B * T * C), tu_dzeros((size_t)B * NH * T), tu_dzeros((size_t)B * T * W)};
    for (size_t i = 0; i < (size_t)B * T * W; i++)
        r.dqkv[i] = dqkv0 ? dqkv0[i] : 0.0;
    double *s = tu_dzeros(T), *p = tu_dzeros(T), *dp = tu_dzeros(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const int kc = C + h / G * hs, vc = C + NKV * hs + h / G * hs;
            for (int i = 0; i < T; i++) {
                const float *q = qkv + ((size_t)(b * T + i) * W) + h * hs;
                const int j0 = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
                double mx = -INFINITY;
                for (int j = j0; j <= i; j++) {
                    const float *kk = qkv + ((size_t)(b * T + j) * W) + kc;
                    double d = 0;
                    for (int e = 0; e < hs; e++)
                        d += (double)q[e] * kk[e];
                    s[j] = d * scale;
                    mx = s[j] > mx ? s[j] : mx;
                }
                double sum = 0;
                for (int j = j0; j <= i; j++)
                    sum += exp(s[j] - mx);
                for (int j = j0; j <= i; j++)
                    p[j] = exp(s[j] - mx) / sum;
                r.lse[(size_t)(b * NH + h) * T + i] = mx + log(sum);
                double *o = r.out + (size_t)(b * T + i) * C + h * hs;
                for (int j = j0; j <= i; j++) {
                    const float *v = qkv + ((size_t)(b * T + j) * W) + vc;
                    for (int e = 0; e < hs; e++)
                        o[e] += mag ? p[j] * fabs(v[e]) : p[j] * v[e];
                }
                if (!dout)
                    continue;
                const float *g = dout + (size_t)(b * T + i) * C + h * hs;
                double pdp = 0;
                for (int j = j0; j <= i; j++) {
                    const float *v = qkv + ((size_t)(b * T + j) * W) + vc;
                    double *dv = r.dqkv + ((size_t)(b * T + j) * W) + vc;
                    dp[j] = 0;
                    for (int e = 0; e < hs; e++) {
                        dp[j] += (double)g[e] * v[e];
                        dv[e] += mag ? p[j] * fabs(g[e]) : p[j] * g[e];
                    }
                    pdp += p[j] * dp[j];
                }
                double *dq = r.dqkv + ((size_t)(b * T + i) * W) + h * hs;
                /* mag: D = rowsum(dO O) is taken with the kernel's O, whose terms were rounded: its error,
                 * up to 2^-8 x dO . (the magnitude of O), reaches every dS of the row */
                double dmag = 0;
                for (int e = 0; mag && e < hs; e++)
                    dmag += fabs((double)g[e]) * o[e];
                for (int j = j0; j <= i; j++) {
                    double ds = mag ? p[j] * (fabs(dp[j] - pdp) + dmag) * scale : p[j] * (dp[j] - pdp) * scale;
                    const float *kk = qkv + ((size_t)(b * T + j) * W) + kc;
                    double *dk = r.dqkv + ((size_t)(b * T + j) * W) + kc;
                    for (int e = 0; e < hs; e++) {
                        dq[e] += mag ? fabs(ds * kk[e]) : ds * kk[e];
                        dk[e] += mag ? fabs(ds * q[e]) : ds * q[e];
                    }
                }
            }
        }
    free(s), free(p), free(dp);
    return r;
}

static struct att_ref ref_attention(const float *qkv, const float *dout, const float *dqkv0, int B, int T,
                                    int C, int NH, int NKV)
{
    return ref_attention_ex(qkv, dout, dqkv0, B, T, C, NH, NKV, 0);
}

static void check_gqa_window(int B, int T, int C, int NH, int NKV, int window, float spread, uint64_t seed)
{
    const struct kernels *k = tu_backend();
    const int W = C + 2 * NKV * (C / NH);
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = tu_host_rand(nq, seed, -spread, spread), *dout = tu_host_rand(no, seed + 1, -1, 1);
    float *g0 = tu_host_rand(nq, seed + 2, -1, 1);
    float *dqkv_ = tu_devf(k, qkv, nq), *ddout = tu_devf(k, dout, no), *dg = tu_devf(k, g0, nq);
    float *dout_ = tu_devf(k, NULL, no), *dlse = tu_devf(k, NULL, nl);
    size_t wsb = k->attention_workspace_bytes(B, T, C, NH, NKV);
    void *ws = k->mem_alloc(wsb);
    cr_assert(ws);
    /* workspace memory must not grow like T^2 (tiled, O(T) per head at most: the bf16 kernels keep a few
     * bf16 copies of the pair's rows) */
    cr_assert(wsb <= (size_t)B * NH * (128u * 1024u + 1024u * (size_t)T) + 4096,
              "workspace %zu bytes for B=%d T=%d NH=%d", wsb, B, T, NH);
    cr_assert_eq(k->attention_forward(dout_, dlse, dqkv_, B, T, C, NH, NKV, window, ws), 0, "%s", error_message());
    cr_assert_eq(k->attention_backward(dg, ddout, dqkv_, dout_, dlse, B, T, C, NH, NKV, window, ws), 0, "%s",
                 error_message());
    struct att_ref r = ref_attention_window(qkv, dout, g0, B, T, C, NH, NKV, 0, window);
    float *o = tu_downf(k, dout_, no), *l = tu_downf(k, dlse, nl), *g = tu_downf(k, dg, nq);
    tu_check_near("att out", o, r.out, no, 2e-5, 1e-4);
    tu_check_near("att lse", l, r.lse, nl, 2e-5, 2e-5);
    tu_check_near("att dqkv", g, r.dqkv, nq, 1e-4, 2e-4);
    free(qkv), free(dout), free(g0), free(o), free(l), free(g), free(r.out), free(r.lse), free(r.dqkv);
    k->mem_free(dqkv_), k->mem_free(ddout), k->mem_free(dg), k->mem_free(dout_), k->mem_free(dlse), k->mem_free(ws);
}

static void check_gqa(int B, int T, int C, int NH, int NKV, float spread, uint64_t seed)
{
    check_gqa_window(B, T, C, NH, NKV, 0, spread, seed);
}

/* Multi-head attention: as many key/value heads as query heads. */
static void check_attention(int B, int T, int C, int NH, float spread, uint64_t seed)
{
    check_gqa(B, T, C, NH, NH, spread, seed);
}

Test(kernels_attention, single_token_and_tiny)
{
    check_attention(1, 1, 4, 1, 1.0f, 1);
    check_attention(2, 3, 6, 3, 1.0f, 2);
}

Test(kernels_attention, t_not_multiple_of_tiles)
{
    check_attention(1, 65, 8, 2, 1.0f, 3);
    check_attention(2, 131, 12, 3, 1.0f, 4);
}

Test(kernels_attention, long_sequence_crosses_key_blocks)
{
    check_attention(1, 300, 32, 2, 1.0f, 5);
}

/* Large scores: the online softmax must rescale without overflow when later keys raise the running max. */
Test(kernels_attention, large_scores_stable)
{
    check_attention(1, 200, 16, 1, 6.0f, 6);
}

Test(kernels_attention, gpt2_head_size)
{
    check_attention(2, 70, 128, 2, 0.5f, 7);
}

/* Head size 64 takes the CPU's AVX-512 tiles where the CPU has them (64 queries x 64 keys, 16-wide vectors,
 * a partly skipped diagonal tile): every length around those boundaries, and long rows. */
Test(kernels_attention, head_size_64_at_tile_boundaries, .timeout = 120)
{
    static const int ts[] = {1, 2, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 191, 257};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        check_attention(1, ts[i], 128, 2, 0.5f, 20 + i);
}

Test(kernels_attention, head_size_64_long_and_large_scores, .timeout = 120)
{
    check_attention(2, 320, 64, 1, 1.0f, 40);
    check_attention(1, 200, 64, 1, 6.0f, 41); /* the online softmax rescales as later keys raise the max */
}

/* Finite differences of the backend's own forward against its backward, for every q, k and v element. */
static void check_finite_differences(int B, int T, int C, int NH, int NKV, uint64_t seed)
{
    const struct kernels *k = tu_backend();
    const int W = C + 2 * NKV * (C / NH);
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * C;
    float *qkv = tu_host_rand(nq, seed, -1, 1), *r = tu_host_rand(no, seed + 1, -1, 1);
    float *dq = tu_devf(k, qkv, nq), *dr = tu_devf(k, r, no), *dg = tu_devf(k, NULL, nq);
    float *dout = tu_devf(k, NULL, no), *dlse = tu_devf(k, NULL, (size_t)B * NH * T);
    void *ws = k->mem_alloc(k->attention_workspace_bytes(B, T, C, NH, NKV));
    cr_assert(ws);
    cr_assert_eq(k->attention_forward(dout, dlse, dq, B, T, C, NH, NKV, 0, ws), 0);
    cr_assert_eq(k->attention_backward(dg, dr, dq, dout, dlse, B, T, C, NH, NKV, 0, ws), 0);
    float *g = tu_downf(k, dg, nq);
    const float h = 1e-2f;
    for (size_t e = 0; e < nq; e++) {
        double lv[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            float saved = qkv[e];
            qkv[e] = saved + (sgn ? -h : h);
            k->mem_copy(dq, qkv, nq * sizeof(float), KERNELS_COPY_H2D);
            cr_assert_eq(k->attention_forward(dout, dlse, dq, B, T, C, NH, NKV, 0, ws), 0);
            float *y = tu_downf(k, dout, no);
            lv[sgn] = 0;
            for (size_t i = 0; i < no; i++)
                lv[sgn] += (double)y[i] * r[i];
            free(y);
            qkv[e] = saved;
        }
        double fd = (lv[0] - lv[1]) / (2 * h);
        cr_assert(fabs(fd - g[e]) <= 2e-3 + 1e-2 * fabs(fd), "dqkv[%zu]: backward %g, fd %g", e, (double)g[e], fd);
    }
    free(qkv), free(r), free(g);
    k->mem_free(dq), k->mem_free(dr), k->mem_free(dg), k->mem_free(dout), k->mem_free(dlse), k->mem_free(ws);
}

Test(kernels_attention, finite_differences)
{
    check_finite_differences(1, 6, 4, 2, 2, 8);
}

/* Grouped-query attention: query heads share key/value heads (groups of 2, 3 and 4, and one key/value head
 * for all), on both the sgemm path and head size 64's AVX-512 tiles, with key/value gradients summed over
 * the group. */
Test(kernels_attention, grouped_query_heads, .timeout = 120)
{
    check_gqa(2, 37, 24, 4, 2, 1.0f, 60);   /* hs 6, groups of 2 */
    check_gqa(1, 130, 48, 6, 2, 1.0f, 61);  /* hs 8, groups of 3, t past the sgemm tiles */
    check_gqa(2, 70, 256, 4, 1, 0.5f, 62);  /* hs 64, one key/value head (multi-query) */
    check_gqa(1, 129, 512, 8, 2, 0.5f, 63); /* hs 64, groups of 4 across the AVX-512 tile boundary */
    check_gqa(1, 65, 512, 8, 4, 3.0f, 64);  /* hs 64, large scores */
}

/* Finite differences through the grouped layout: every q, k and v element's gradient. */
Test(kernels_attention, grouped_query_finite_differences)
{
    check_finite_differences(1, 5, 8, 4, 2, 70);
}

Test(kernels_attention, rejects_heads_not_dividing)
{
    const struct kernels *k = tu_backend();
    float dummy[64] = {0};
    cr_assert_eq(k->attention_forward(dummy, dummy, dummy, 1, 1, 6, 3, 2, 0, dummy), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "nkv=2"), "%s", error_message());
    cr_assert_eq(k->attention_backward(dummy, dummy, dummy, dummy, dummy, 1, 1, 6, 3, 0, 0, dummy), FSDP_EINVAL);
}

/* bf16 mode. The kernel rounds q, k, v and dO to bf16 (so the reference takes the rounded values: the scores
 * of rounded q and k are exact products accumulated in fp32), keeps the softmax statistics in fp32, and
 * rounds P and dS once more as operands of P V, P^T dO, dS K and dS^T Q. So:
 * - lse: fp32 accumulation and the exponential only, the fp32 bounds (2e-5);
 * - out, dqkv: each term of the sums has one factor rounded (relative 2^-8), on top of the fp32 error:
 *   |err| <= 2^-8 x (the sum of the terms' magnitudes) + what fp32 allows; checked with 2^-7 of it, as P and
 *   dS also carry the fp32 error of the scores they come from.
 * And the result must differ from fp32 attention on the unrounded inputs, or bf16 was not applied. */
static void check_attention_bf16_window(int B, int T, int C, int NH, int NKV, int window, float spread,
                                        uint64_t seed)
{
    const struct kernels *k = tu_backend();
    if (!(k->matmul_dtypes & DTYPE_BIT(DTYPE_BF16)))
        cr_skip_test("%s: no native bf16 matmuls on this machine (the fallback computes in fp32, tested above)",
                     k->name);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_BF16), 0, "%s", error_message());
    size_t nq = (size_t)B * T * (C + 2 * NKV * (C / NH)), no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = tu_host_rand(nq, seed, -spread, spread), *dout = tu_host_rand(no, seed + 1, -1, 1);
    float *g0 = tu_host_rand(nq, seed + 2, -1, 1);
    float *rq = malloc(nq * sizeof *rq), *rd = malloc(no * sizeof *rd);
    cr_assert(rq && rd);
    for (size_t i = 0; i < nq; i++)
        rq[i] = dtype_bf16_to_f32(dtype_f32_to_bf16(qkv[i]));
    for (size_t i = 0; i < no; i++)
        rd[i] = dtype_bf16_to_f32(dtype_f32_to_bf16(dout[i]));
    float *dqkv_ = tu_devf(k, qkv, nq), *ddout = tu_devf(k, dout, no), *dg = tu_devf(k, g0, nq);
    float *dout_ = tu_devf(k, NULL, no), *dlse = tu_devf(k, NULL, nl);
    void *ws = k->mem_alloc(k->attention_workspace_bytes(B, T, C, NH, NKV));
    cr_assert(ws);
    cr_assert_eq(k->attention_forward(dout_, dlse, dqkv_, B, T, C, NH, NKV, window, ws), 0, "%s", error_message());
    cr_assert_eq(k->attention_backward(dg, ddout, dqkv_, dout_, dlse, B, T, C, NH, NKV, window, ws), 0, "%s",
                 error_message());
    struct att_ref r = ref_attention_window(rq, rd, g0, B, T, C, NH, NKV, 0, window);
    struct att_ref m = ref_attention_window(rq, rd, NULL, B, T, C, NH, NKV, 1, window);
    struct att_ref x = ref_attention_window(qkv, dout, g0, B, T, C, NH, NKV, 0, window);
    float *o = tu_downf(k, dout_, no), *l = tu_downf(k, dlse, nl), *g = tu_downf(k, dg, nq);
    tu_check_near("bf16 att lse", l, r.lse, nl, 2e-5, 2e-5);
    double worst = 0, off = 0;
    const struct {
        const char *name;
        const float *got;
        const double *want, *mag, *exact;
        size_t n;
    } t[2] = {{"bf16 att out", o, r.out, m.out, x.out, no}, {"bf16 att dqkv", g, r.dqkv, m.dqkv, x.dqkv, nq}};
    for (int a = 0; a < 2; a++)
        for (size_t i = 0; i < t[a].n; i++) {
            double err = fabs((double)t[a].got[i] - t[a].want[i]), bound = 1.0 / 128 * t[a].mag[i] + 1e-4;
            if (!(err <= bound))
                cr_assert_fail("%s[%zu]: got %.9g, want %.9g (err %.3g > %.3g = 2^-7 x %.3g + 1e-4)", t[a].name, i,
                               (double)t[a].got[i], t[a].want[i], err, bound, t[a].mag[i]);
            worst = fmax(worst, err / bound);
            off = fmax(off, fabs((double)t[a].got[i] - t[a].exact[i]));
        }
    cr_log_info("bf16 attention B=%d T=%d C=%d NH=%d NKV=%d: largest error %.3g of its bound; %.3g from fp32 attention",
                B, T, C, NH, NKV, worst, off);
    cr_assert_gt(off, 1e-6, "bf16 attention equals fp32 attention on unrounded inputs: bf16 was not applied");
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
    free(qkv), free(dout), free(g0), free(rq), free(rd), free(o), free(l), free(g);
    free(r.out), free(r.lse), free(r.dqkv), free(m.out), free(m.lse), free(m.dqkv);
    free(x.out), free(x.lse), free(x.dqkv);
    k->mem_free(dqkv_), k->mem_free(ddout), k->mem_free(dg), k->mem_free(dout_), k->mem_free(dlse), k->mem_free(ws);
}

static void check_attention_bf16_gqa(int B, int T, int C, int NH, int NKV, float spread, uint64_t seed)
{
    check_attention_bf16_window(B, T, C, NH, NKV, 0, spread, seed);
}

/* Head size 64 (AVX512_BF16 tiles on this CPU): lengths around the 64-query/64-key tiles, the 16-wide vectors
 * and odd lengths (the pair layouts pad a zero row), and large scores. */
static void check_attention_bf16(int B, int T, int C, int NH, float spread, uint64_t seed)
{
    check_attention_bf16_gqa(B, T, C, NH, NH, spread, seed);
}

Test(kernels_attention, bf16_head_size_64, .timeout = 120)
{
    static const int ts[] = {1, 2, 3, 15, 17, 33, 63, 64, 65, 127, 129, 200};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        check_attention_bf16(1, ts[i], 128, 2, 0.5f, 60 + i);
    check_attention_bf16(2, 150, 64, 1, 4.0f, 80);
}

/* Other head sizes: the sgemm tiles on bf16-rounded operands, the same rounding. */
Test(kernels_attention, bf16_other_head_sizes, .timeout = 120)
{
    check_attention_bf16(1, 1, 4, 1, 1.0f, 90);
    check_attention_bf16(2, 131, 12, 3, 1.0f, 91);
    check_attention_bf16(1, 200, 32, 2, 3.0f, 92);
}

/* Grouped-query heads in bf16 mode: head size 64 on the AVX512_BF16 tiles (a key/value head's query heads one
 * after another into its dk, dv), other head sizes on the rounded sgemm path, key/value gradients summed over
 * the group. */
Test(kernels_attention, bf16_grouped_query_heads, .timeout = 120)
{
    check_attention_bf16_gqa(1, 70, 256, 4, 2, 0.5f, 95); /* head size 64 */
    check_attention_bf16_gqa(2, 33, 48, 6, 2, 1.0f, 96);
    check_attention_bf16_gqa(1, 129, 128, 4, 1, 1.0f, 97);
}

/* Sliding-window attention (Mistral): windows of 1 (each query sees itself only), below a tile, not a multiple
 * of any tile, exactly a tile, across several tiles and at or beyond the sequence (full causal), on the AVX-512
 * tiles (head size 64: 64 x 64 tiles, whole tiles before the window skipped, the window's edge masked) and the
 * sgemm tiles (other head sizes: 64 queries x 128 keys), multi-head and grouped-query, forward and backward. */
static const int windows[] = {1, 2, 17, 63, 64, 65, 100, 129, 200, 1000};

Test(kernels_attention, sliding_window_head_size_64, .timeout = 120)
{
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++)
        check_gqa_window(1, 200, 128, 2, 2, windows[i], 1.0f, 300 + i);
    check_gqa_window(2, 150, 256, 4, 2, 40, 2.0f, 320); /* grouped: a key/value head's dk, dv over its group */
    check_gqa_window(1, 64, 64, 1, 1, 63, 1.0f, 321);
}

Test(kernels_attention, sliding_window_other_head_sizes, .timeout = 120)
{
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++)
        check_gqa_window(1, 300, 48, 3, 1, windows[i], 1.0f, 340 + i);
    check_gqa_window(2, 131, 12, 3, 3, 5, 1.0f, 360);
}

Test(kernels_attention, sliding_window_bf16, .timeout = 120)
{
    static const int w[] = {1, 17, 64, 65, 130};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        check_attention_bf16_window(1, 200, 128, 2, 2, w[i], 0.5f, 380 + i); /* AVX512_BF16 tiles */
        check_attention_bf16_window(1, 150, 48, 3, 1, w[i], 1.0f, 390 + i); /* rounded sgemm tiles */
        check_attention_bf16_window(1, 90, 36, 3, 3, w[i], 1.0f, 400 + i);  /* hs 12 (CUDA: flash, not GEMMs) */
    }
}

/* A window changes the result (the test above would pass on a kernel that ignores it only if the window never
 * cut a row): with window 1 each output row is its own value row. */
Test(kernels_attention, sliding_window_one_is_identity)
{
    const struct kernels *k = tu_backend();
    const int B = 1, T = 100, C = 64, NH = 1, W = 3 * C;
    float *qkv = tu_host_rand((size_t)T * W, 400, -1, 1);
    float *d = tu_devf(k, qkv, (size_t)T * W), *o = tu_devf(k, NULL, (size_t)T * C), *l = tu_devf(k, NULL, T);
    void *ws = k->mem_alloc(k->attention_workspace_bytes(B, T, C, NH, NH));
    cr_assert(ws);
    cr_assert_eq(k->attention_forward(o, l, d, B, T, C, NH, NH, 1, ws), 0, "%s", error_message());
    float *h = tu_downf(k, o, (size_t)T * C);
    for (int i = 0; i < T; i++)
        for (int e = 0; e < C; e++)
            cr_assert_float_eq(h[(size_t)i * C + e], qkv[(size_t)i * W + 2 * C + e], 1e-6, "row %d col %d", i, e);
    cr_assert_eq(k->attention_forward(o, l, d, B, T, C, NH, NH, -1, ws), FSDP_EINVAL);
    free(qkv), free(h);
    k->mem_free(d), k->mem_free(o), k->mem_free(l), k->mem_free(ws);
}

/* Context-parallel attention as the allgather strategy uses it: a sequence of T tokens cut into 2*CP chunks,
 * rank r of the context group holding chunks r and 2*CP-1-r (its query rows at their global positions)
 * and attending to the keys and values of the whole sequence. Every rank's output rows and log-sum-exp
 * must be those of full causal attention, its query gradients those rows' gradients, and the key/value
 * gradients summed over the ranks (what the reduce-scatter adds up) the full key/value gradients. */
static void check_mag(const char *what, const float *got, const double *want, const double *mag, size_t n);

/* The context-parallel checks build their operands and check their results on the host: every operand of
 * the kernel (the int32 positions too) lives in the table's memory, copied up before and down after. */
static void att_up(const struct kernels *k, void *dev, const void *host, size_t bytes)
{
    cr_assert_eq(k->mem_copy(dev, host, bytes, KERNELS_COPY_H2D), 0, "%s", error_message());
}

static void att_down(const struct kernels *k, void *host, const void *dev, size_t bytes)
{
    cr_assert_eq(k->synchronize(), 0, "%s", error_message());
    cr_assert_eq(k->mem_copy(host, dev, bytes, KERNELS_COPY_D2H), 0, "%s", error_message());
}

/* bf16: in bf16 mode, against the reference of the bf16-rounded inputs within check_attention_bf16's bounds
 * (2^-7 of each sum's magnitude; lse as fp32). */
static void check_attention_cp_window(int B, int T, int C, int NH, int CP, uint64_t seed, bool bf16, int window)
{
    const struct kernels *k = tu_backend();
    if (!k->attention_cp_forward || !k->attention_cp_backward)
        cr_skip_test("the %s kernels have no context-parallel attention", k->name);
    if (bf16 && !(k->matmul_dtypes & DTYPE_BIT(DTYPE_BF16)))
        cr_skip_test("%s: no native bf16 matmuls on this machine", k->name);
    cr_assert_eq(k->set_matmul_dtype(bf16 ? DTYPE_BF16 : DTYPE_F32), 0);
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    float *qkv = tu_host_rand(nq, seed, -1, 1), *dout = tu_host_rand(no, seed + 1, -1, 1);
    float *rq = malloc(nq * sizeof *rq), *rdo = malloc(no * sizeof *rdo);
    cr_assert(rq && rdo);
    for (size_t i = 0; i < nq; i++)
        rq[i] = bf16 ? dtype_bf16_to_f32(dtype_f32_to_bf16(qkv[i])) : qkv[i];
    for (size_t i = 0; i < no; i++)
        rdo[i] = bf16 ? dtype_bf16_to_f32(dtype_f32_to_bf16(dout[i])) : dout[i];
    struct att_ref r = ref_attention_window(rq, rdo, NULL, B, T, C, NH, NH, 0, window);
    struct att_ref mg = ref_attention_window(rq, rdo, NULL, B, T, C, NH, NH, 1, window);
    size_t nloc = (size_t)B * (T / (2 * CP)) * 2 * C; /* a rank's query rows x C */
    double *mag_o = tu_dzeros(nloc), *mag_dq = tu_dzeros(nloc);
    double *mag_dkv = tu_dzeros(nq);
    int chunk = T / (2 * CP), tq = 2 * chunk;
    int *kpos = malloc((size_t)T * sizeof *kpos), *qpos = malloc((size_t)tq * sizeof *qpos);
    float *lq = calloc((size_t)B * tq * 3 * C, sizeof(float)), *ldo = calloc((size_t)B * tq * C, sizeof(float));
    float *lo = calloc((size_t)B * tq * C, sizeof(float)), *ll = calloc((size_t)B * NH * tq, sizeof(float));
    float *ldq = calloc((size_t)B * tq * 3 * C, sizeof(float)), *dkv = calloc(nq, sizeof(float));
    double *want_o = tu_dzeros((size_t)B * tq * C), *want_l = tu_dzeros((size_t)B * NH * tq);
    double *want_dq = tu_dzeros((size_t)B * tq * C), *want_dkv = tu_dzeros(nq);
    float *got_dq = calloc((size_t)B * tq * C, sizeof(float));
    cr_assert(kpos && qpos && lq && ldo && lo && ll && ldq && dkv && got_dq);
    for (int j = 0; j < T; j++)
        kpos[j] = j;
    size_t nlq = (size_t)B * tq * 3 * C, nlo = (size_t)B * tq * C, nll = (size_t)B * NH * tq;
    float *d_qkv = tu_devf(k, qkv, nq), *d_dkv = tu_devf(k, NULL, nq), *d_lq = tu_devf(k, NULL, nlq);
    float *d_ldo = tu_devf(k, NULL, nlo), *d_lo = tu_devf(k, NULL, nlo), *d_ll = tu_devf(k, NULL, nll);
    float *d_ldq = tu_devf(k, NULL, nlq);
    int *d_kpos = tu_dev_from(k, kpos, (size_t)T * sizeof(int)), *d_qpos = tu_dev_from(k, NULL, (size_t)tq * sizeof(int));
    for (int rank = 0; rank < CP; rank++) {
        for (int i = 0; i < tq; i++)
            qpos[i] = i < chunk ? rank * chunk + i : (2 * CP - 1 - rank) * chunk + (i - chunk);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < tq; i++) {
                size_t g = (size_t)b * T + qpos[i], l = (size_t)b * tq + i;
                memcpy(lq + l * 3 * C, qkv + g * 3 * C, 3 * (size_t)C * sizeof(float));
                memcpy(ldo + l * C, dout + g * C, (size_t)C * sizeof(float));
                for (int e = 0; e < C; e++) {
                    want_o[l * C + e] = r.out[g * C + e];
                    want_dq[l * C + e] = r.dqkv[g * 3 * C + e];
                    mag_o[l * C + e] = mg.out[g * C + e];
                    mag_dq[l * C + e] = mg.dqkv[g * 3 * C + e];
                }
                for (int h = 0; h < NH; h++)
                    want_l[((size_t)b * NH + h) * tq + i] = r.lse[((size_t)b * NH + h) * T + qpos[i]];
            }
        att_up(k, d_lq, lq, nlq * sizeof(float));
        att_up(k, d_ldo, ldo, nlo * sizeof(float));
        att_up(k, d_qpos, qpos, (size_t)tq * sizeof(int));
        struct kernels_attention_cp a = {.b = B, .tq = tq, .tk = T, .c = C, .nh = NH, .ld = 3 * C,
                                         .qpos = d_qpos, .kpos = d_kpos, .window = window};
        cr_assert_eq(k->attention_cp_forward(d_lo, d_ll, d_lq, d_qkv + C, d_qkv + 2 * C, &a), 0, "%s",
                     error_message());
        cr_assert_eq(k->mem_set(d_ldq, 0, nlq * sizeof(float)), 0, "%s", error_message());
        cr_assert_eq(k->attention_cp_backward(d_ldq, d_dkv + C, d_dkv + 2 * C, d_ldo, d_lq, d_qkv + C, d_qkv + 2 * C,
                                              d_lo, d_ll, &a),
                     0, "%s", error_message());
        att_down(k, lo, d_lo, nlo * sizeof(float));
        att_down(k, ll, d_ll, nll * sizeof(float));
        att_down(k, ldq, d_ldq, nlq * sizeof(float));
        for (size_t l = 0; l < (size_t)B * tq; l++)
            memcpy(got_dq + l * C, ldq + l * 3 * C, (size_t)C * sizeof(float));
        tu_check_near("cp lse", ll, want_l, (size_t)B * NH * tq, 2e-5, 2e-5);
        if (bf16) {
            check_mag("bf16 cp out", lo, want_o, mag_o, (size_t)B * tq * C);
            check_mag("bf16 cp dq", got_dq, want_dq, mag_dq, (size_t)B * tq * C);
        } else {
            tu_check_near("cp out", lo, want_o, (size_t)B * tq * C, 2e-5, 1e-4);
            tu_check_near("cp dq", got_dq, want_dq, (size_t)B * tq * C, 1e-4, 2e-4);
        }
    }
    att_down(k, dkv, d_dkv, nq * sizeof(float));
    /* the key/value columns of the reference; its query columns are zero here as in dkv */
    for (size_t row = 0; row < (size_t)B * T; row++)
        for (int e = C; e < 3 * C; e++) {
            want_dkv[row * 3 * C + e] = r.dqkv[row * 3 * C + e];
            mag_dkv[row * 3 * C + e] = mg.dqkv[row * 3 * C + e];
        }
    if (bf16)
        check_mag("bf16 cp dk dv summed over the group", dkv, want_dkv, mag_dkv, nq);
    else
        tu_check_near("cp dk dv summed over the group", dkv, want_dkv, nq, 1e-4, 2e-4);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
    free(rq), free(rdo), free(mg.out), free(mg.lse), free(mg.dqkv), free(mag_o), free(mag_dq), free(mag_dkv);
    free(qkv), free(dout), free(r.out), free(r.lse), free(r.dqkv), free(kpos), free(qpos), free(lq), free(ldo);
    free(lo), free(ll), free(ldq), free(dkv), free(want_o), free(want_l), free(want_dq), free(want_dkv), free(got_dq);
    k->mem_free(d_qkv), k->mem_free(d_dkv), k->mem_free(d_lq), k->mem_free(d_ldo), k->mem_free(d_lo);
    k->mem_free(d_ll), k->mem_free(d_ldq), k->mem_free(d_kpos), k->mem_free(d_qpos);
}

static void check_attention_cp_ex(int B, int T, int C, int NH, int CP, uint64_t seed, bool bf16)
{
    check_attention_cp_window(B, T, C, NH, CP, seed, bf16, 0);
}

/* Context parallelism with a sliding window (Mistral): each rank's chunks against the whole sequence's keys,
 * the window by global position, equal to full windowed attention; head size 64 (sgemm tiles: the AVX-512
 * context-parallel tiles leave windows to them) and 16, windows within a chunk, across chunks and beyond
 * the sequence; in bf16 the row-by-row path. */
Test(kernels_attention, context_parallel_sliding_window, .timeout = 120)
{
    static const int w[] = {1, 7, 25, 64, 300};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        check_attention_cp_window(2, 96, 128, 2, 2, 500 + i, false, w[i]);
        check_attention_cp_window(1, 120, 64, 4, 3, 510 + i, false, w[i]);
    }
    check_attention_cp_window(1, 96, 128, 2, 2, 520, true, 25);
}

/* |got - want| <= 2^-7 mag + 1e-4 element by element (check_attention_bf16's bound). */
static void check_mag(const char *what, const float *got, const double *want, const double *mag, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]), bound = 1.0 / 128 * mag[i] + 1e-4;
        if (!(err <= bound))
            cr_assert_fail("%s[%zu]: got %.9g, want %.9g (err %.3g > %.3g)", what, i, (double)got[i], want[i], err,
                           bound);
    }
}

static void check_attention_cp(int B, int T, int C, int NH, int CP, uint64_t seed)
{
    check_attention_cp_ex(B, T, C, NH, CP, seed, false);
}

Test(kernels_attention, context_parallel_bf16)
{
    check_attention_cp_ex(2, 20, 16, 2, 2, 54, true);
    check_attention_cp_ex(2, 64, 128, 2, 4, 55, true);
    /* head size 64 on the AVX-512 tiles with rounded operands: chunks of 128 and of 40 rows */
    check_attention_cp_ex(1, 512, 128, 2, 2, 56, true);
    check_attention_cp_ex(2, 160, 192, 3, 2, 57, true);
}

Test(kernels_attention, context_parallel_chunks_match_full_attention)
{
    check_attention_cp(1, 8, 8, 2, 1, 50);
    check_attention_cp(2, 20, 16, 2, 2, 51);
    check_attention_cp(1, 30, 12, 3, 3, 52);
    check_attention_cp(2, 64, 128, 2, 4, 53);
}

/* Grouped-query heads and block-major rows, as the engine calls the kernel: every rank's query rows (b, tq)
 * against the rank-major all-gather of the group's (C, b, tq) key/value columns (kblock = tq, ldkv), and, as the
 * all-to-all strategy does, every query of the whole sequence in that same layout (qblock = kblock = tq). The
 * outputs, log-sum-exp and gradients are full causal attention's, the key/value gradients summed over the
 * ranks. */
static void check_attention_cp_blocks(int B, int T, int C, int NH, int NKV, int CP, uint64_t seed)
{
    const struct kernels *k = tu_backend();
    if (!k->attention_cp_forward || !k->attention_cp_backward)
        cr_skip_test("the %s kernels have no context-parallel attention", k->name);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
    int W = C + 2 * NKV * (C / NH), tq = T / CP, s = T / (2 * CP);
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * C;
    float *qkv = tu_host_rand(nq, seed, -1, 1), *dout = tu_host_rand(no, seed + 1, -1, 1);
    struct att_ref r = ref_attention(qkv, dout, NULL, B, T, C, NH, NKV);
    /* g: the gathered rows, rank-major; gpos: the global position of each gathered row of a sequence */
    float *g = malloc(nq * sizeof *g), *gdo = malloc(no * sizeof *gdo), *dg = calloc(nq, sizeof *dg);
    float *o = calloc(no, sizeof *o), *l = calloc((size_t)B * NH * T, sizeof *l);
    int *gpos = malloc((size_t)T * sizeof *gpos);
    cr_assert(g && gdo && dg && o && l && gpos);
    for (int rank = 0; rank < CP; rank++)
        for (int i = 0; i < tq; i++)
            gpos[rank * tq + i] = i < s ? rank * s + i : (2 * CP - 1 - rank) * s + (i - s);
    for (int rank = 0; rank < CP; rank++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < tq; i++) {
                size_t row = ((size_t)rank * B + b) * tq + i, src = (size_t)b * T + gpos[rank * tq + i];
                memcpy(g + row * W, qkv + src * W, (size_t)W * sizeof(float));
                memcpy(gdo + row * C, dout + src * C, (size_t)C * sizeof(float));
            }
    /* allgather: each rank's queries are its block of g; the keys and values a gather of their columns only
     * (gkv, row stride ldkv = 2 x the key/value width); the query gradients land in that block of dg, the
     * key/value gradients in dgkv */
    int KV = 2 * NKV * (C / NH);
    float *gkv = malloc((size_t)B * T * KV * sizeof *gkv), *dgkv = calloc((size_t)B * T * KV, sizeof *dgkv);
    cr_assert(gkv && dgkv);
    for (size_t row = 0; row < (size_t)B * T; row++)
        memcpy(gkv + row * KV, g + row * W + C, (size_t)KV * sizeof(float));
    size_t nl = (size_t)B * NH * T, nkv = (size_t)B * T * KV;
    float *d_g = tu_devf(k, g, nq), *d_gdo = tu_devf(k, gdo, no), *d_dg = tu_devf(k, NULL, nq);
    float *d_o = tu_devf(k, NULL, no), *d_l = tu_devf(k, NULL, nl);
    float *d_gkv = tu_devf(k, gkv, nkv), *d_dgkv = tu_devf(k, NULL, nkv);
    int *d_gpos = tu_dev_from(k, gpos, (size_t)T * sizeof(int));
    for (int rank = 0; rank < CP; rank++) {
        size_t base = (size_t)rank * B * tq;
        struct kernels_attention_cp a = {.b = B, .tq = tq, .tk = T, .c = C, .nh = NH, .ld = W,
                                         .qpos = d_gpos + rank * tq, .kpos = d_gpos, .nkv = NKV, .kblock = tq,
                                         .ldkv = KV};
        cr_assert_eq(k->attention_cp_forward(d_o + base * C, d_l + (size_t)rank * B * NH * tq, d_g + base * W,
                                             d_gkv, d_gkv + KV / 2, &a), 0, "%s", error_message());
        cr_assert_eq(k->attention_cp_backward(d_dg + base * W, d_dgkv, d_dgkv + KV / 2, d_gdo + base * C,
                                              d_g + base * W, d_gkv, d_gkv + KV / 2, d_o + base * C,
                                              d_l + (size_t)rank * B * NH * tq, &a), 0, "%s", error_message());
    }
    att_down(k, o, d_o, no * sizeof(float));
    att_down(k, l, d_l, nl * sizeof(float));
    att_down(k, dg, d_dg, nq * sizeof(float));
    att_down(k, dgkv, d_dgkv, nkv * sizeof(float));
    for (size_t row = 0; row < (size_t)B * T; row++)
        memcpy(dg + row * W + C, dgkv + row * KV, (size_t)KV * sizeof(float));
    free(gkv), free(dgkv);
    k->mem_free(d_gkv), k->mem_free(d_dgkv);
    double *wo = tu_dzeros(no), *wl = tu_dzeros((size_t)B * NH * T), *wd = tu_dzeros(nq);
    for (int rank = 0; rank < CP; rank++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < tq; i++) {
                size_t row = ((size_t)rank * B + b) * tq + i, src = (size_t)b * T + gpos[rank * tq + i];
                for (int e = 0; e < C; e++)
                    wo[row * C + e] = r.out[src * C + e];
                for (int e = 0; e < W; e++)
                    wd[row * W + e] = r.dqkv[src * W + e];
                for (int h = 0; h < NH; h++)
                    wl[(((size_t)rank * B + b) * NH + h) * tq + i] = r.lse[((size_t)b * NH + h) * T + gpos[rank * tq + i]];
            }
    tu_check_near("cp blocks out", o, wo, no, 2e-5, 1e-4);
    tu_check_near("cp blocks lse", l, wl, (size_t)B * NH * T, 2e-5, 2e-5);
    tu_check_near("cp blocks dqkv", dg, wd, nq, 1e-4, 2e-4);
    /* all-to-all: the whole sequence's queries in one call, lse as (b, nh, T) in gathered order */
    float *o2 = calloc(no, sizeof *o2), *l2 = calloc((size_t)B * NH * T, sizeof *l2);
    cr_assert(o2 && l2);
    float *d_o2 = tu_devf(k, NULL, no), *d_l2 = tu_devf(k, NULL, nl);
    struct kernels_attention_cp a = {.b = B, .tq = T, .tk = T, .c = C, .nh = NH, .ld = W, .qpos = d_gpos,
                                     .kpos = d_gpos, .nkv = NKV, .qblock = tq, .kblock = tq};
    cr_assert_eq(k->attention_cp_forward(d_o2, d_l2, d_g, d_g + C, d_g + C + NKV * (C / NH), &a), 0, "%s",
                 error_message());
    att_down(k, o2, d_o2, no * sizeof(float));
    att_down(k, l2, d_l2, nl * sizeof(float));
    tu_check_near("cp all-sequence out", o2, wo, no, 2e-5, 1e-4);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int j = 0; j < T; j++)
                wl[((size_t)b * NH + h) * T + j] = r.lse[((size_t)b * NH + h) * T + gpos[j]];
    tu_check_near("cp all-sequence lse", l2, wl, (size_t)B * NH * T, 2e-5, 2e-5);
    free(qkv), free(dout), free(r.out), free(r.lse), free(r.dqkv), free(g), free(gdo), free(dg), free(o), free(l);
    free(gpos), free(wo), free(wl), free(wd), free(o2), free(l2);
    k->mem_free(d_g), k->mem_free(d_gdo), k->mem_free(d_dg), k->mem_free(d_o), k->mem_free(d_l);
    k->mem_free(d_gpos), k->mem_free(d_o2), k->mem_free(d_l2);
}

Test(kernels_attention, context_parallel_grouped_heads_block_rows)
{
    check_attention_cp_blocks(1, 8, 8, 2, 2, 1, 56);
    check_attention_cp_blocks(2, 24, 24, 4, 2, 2, 57);
    check_attention_cp_blocks(2, 36, 24, 6, 3, 3, 58);
    check_attention_cp_blocks(3, 32, 16, 4, 1, 4, 59);
    /* several 128-query and 256-key tiles per block, tiles cut at the block ends */
    check_attention_cp_blocks(2, 328, 16, 2, 1, 2, 60);
    check_attention_cp_blocks(1, 600, 32, 4, 2, 3, 61);
    check_attention_cp_blocks(1, 1200, 16, 2, 2, 2, 62);
    /* head size 64 (the AVX-512 tiles where the CPU has them): chunks of 128 rows (whole 64-row tiles), of
     * 60 (runs end at the chunk) and of 100 (a 64-row tile and a 36-row one) */
    check_attention_cp_blocks(2, 512, 128, 2, 1, 2, 63);
    check_attention_cp_blocks(1, 360, 192, 3, 3, 3, 64);
    check_attention_cp_blocks(1, 400, 256, 4, 2, 2, 65);
}

/* The kernel's contract on its own terms: any query and key positions, masked by kpos[j] <= qpos[i]. Query
 * rows offset from the keys' by less than a tile cut tiles across the causal line away from the diagonal,
 * rows before every key see nothing (lse -inf, output 0, no gradient), keys after every query get none.
 * Against a double-precision reference of the same masked softmax. */
static void check_attention_cp_positions(int B, int TQ, int TK, int NH, int NKV, int HS, int qoff, int koff,
                                         uint64_t seed)
{
    const struct kernels *k = tu_backend();
    if (!k->attention_cp_forward || !k->attention_cp_backward)
        cr_skip_test("the %s kernels have no context-parallel attention", k->name);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
    int C = NH * HS, KV = NKV * HS, LD = C + 2 * KV, G = NH / NKV;
    size_t nq = (size_t)B * TQ * LD, nk = (size_t)B * TK * 2 * KV, no = (size_t)B * TQ * C;
    float *q = tu_host_rand(nq, seed, -1.5f, 1.5f), *kv = tu_host_rand(nk, seed + 1, -1.5f, 1.5f);
    float *dout = tu_host_rand(no, seed + 2, -1, 1);
    float *out = calloc(no, sizeof *out), *lse = calloc((size_t)B * NH * TQ, sizeof *lse);
    float *dq = calloc(nq, sizeof *dq), *dkv = calloc(nk, sizeof *dkv);
    int *qpos = malloc((size_t)TQ * sizeof *qpos), *kpos = malloc((size_t)TK * sizeof *kpos);
    cr_assert(out && lse && dq && dkv && qpos && kpos);
    for (int i = 0; i < TQ; i++)
        qpos[i] = qoff + i;
    for (int j = 0; j < TK; j++)
        kpos[j] = koff + j;
    size_t nl = (size_t)B * NH * TQ;
    float *d_q = tu_devf(k, q, nq), *d_kv = tu_devf(k, kv, nk), *d_dout = tu_devf(k, dout, no);
    float *d_out = tu_devf(k, NULL, no), *d_lse = tu_devf(k, NULL, nl);
    float *d_dq = tu_devf(k, NULL, nq), *d_dkv = tu_devf(k, NULL, nk);
    int *d_qpos = tu_dev_from(k, qpos, (size_t)TQ * sizeof(int)), *d_kpos = tu_dev_from(k, kpos, (size_t)TK * sizeof(int));
    struct kernels_attention_cp a = {.b = B, .tq = TQ, .tk = TK, .c = C, .nh = NH, .ld = LD, .qpos = d_qpos,
                                     .kpos = d_kpos, .nkv = NKV, .ldkv = 2 * KV};
    cr_assert_eq(k->attention_cp_forward(d_out, d_lse, d_q, d_kv, d_kv + KV, &a), 0, "%s", error_message());
    cr_assert_eq(k->attention_cp_backward(d_dq, d_dkv, d_dkv + KV, d_dout, d_q, d_kv, d_kv + KV, d_out, d_lse, &a), 0,
                 "%s", error_message());
    att_down(k, out, d_out, no * sizeof(float));
    att_down(k, lse, d_lse, nl * sizeof(float));
    att_down(k, dq, d_dq, nq * sizeof(float));
    att_down(k, dkv, d_dkv, nk * sizeof(float));
    k->mem_free(d_q), k->mem_free(d_kv), k->mem_free(d_dout), k->mem_free(d_out), k->mem_free(d_lse);
    k->mem_free(d_dq), k->mem_free(d_dkv), k->mem_free(d_qpos), k->mem_free(d_kpos);
    double *wo = tu_dzeros(no), *wl = tu_dzeros((size_t)B * NH * TQ), *wdq = tu_dzeros(nq), *wdkv = tu_dzeros(nk);
    double *s = tu_dzeros(TK), *dp = tu_dzeros(TK), scale = 1.0 / sqrt((double)HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < TQ; i++) {
                const float *qi = q + ((size_t)b * TQ + i) * LD + h * HS, *g = dout + ((size_t)b * TQ + i) * C + h * HS;
                double mx = -INFINITY, sum = 0, D = 0;
                for (int j = 0; j < TK && kpos[j] <= qpos[i]; j++) {
                    const float *kj = kv + ((size_t)b * TK + j) * 2 * KV + h / G * HS;
                    s[j] = 0;
                    for (int e = 0; e < HS; e++)
                        s[j] += (double)qi[e] * kj[e] * scale;
                    mx = s[j] > mx ? s[j] : mx;
                }
                double *wl_i = wl + ((size_t)b * NH + h) * TQ + i, *o = wo + ((size_t)b * TQ + i) * C + h * HS;
                if (mx == -INFINITY) {
                    *wl_i = -INFINITY;
                    continue;
                }
                for (int j = 0; j < TK && kpos[j] <= qpos[i]; j++)
                    sum += exp(s[j] - mx);
                *wl_i = mx + log(sum);
                for (int j = 0; j < TK && kpos[j] <= qpos[i]; j++) {
                    s[j] = exp(s[j] - mx) / sum;
                    const float *vj = kv + ((size_t)b * TK + j) * 2 * KV + KV + h / G * HS;
                    dp[j] = 0;
                    for (int e = 0; e < HS; e++) {
                        o[e] += s[j] * vj[e];
                        dp[j] += (double)g[e] * vj[e];
                    }
                }
                for (int e = 0; e < HS; e++)
                    D += g[e] * o[e];
                for (int j = 0; j < TK && kpos[j] <= qpos[i]; j++) {
                    double ds = s[j] * (dp[j] - D) * scale;
                    const float *kj = kv + ((size_t)b * TK + j) * 2 * KV + h / G * HS;
                    double *dkj = wdkv + ((size_t)b * TK + j) * 2 * KV + h / G * HS, *dvj = dkj + KV;
                    double *dqi = wdq + ((size_t)b * TQ + i) * LD + h * HS;
                    for (int e = 0; e < HS; e++) {
                        dvj[e] += s[j] * g[e];
                        dqi[e] += ds * kj[e];
                        dkj[e] += ds * qi[e];
                    }
                }
            }
    tu_check_near("cp positions out", out, wo, no, 2e-5, 1e-4);
    for (size_t i = 0; i < (size_t)B * NH * TQ; i++)
        if (wl[i] == -INFINITY) {
            cr_assert(lse[i] == -INFINITY, "cp positions lse[%zu]: got %g for a row that sees no key", i,
                      (double)lse[i]);
            wl[i] = lse[i] = 0;
        }
    tu_check_near("cp positions lse", lse, wl, (size_t)B * NH * TQ, 2e-5, 2e-5);
    tu_check_near("cp positions dq", dq, wdq, nq, 1e-4, 2e-4);
    tu_check_near("cp positions dk dv", dkv, wdkv, nk, 1e-4, 2e-4);
    free(q), free(kv), free(dout), free(out), free(lse), free(dq), free(dkv), free(qpos), free(kpos);
    free(wo), free(wl), free(wdq), free(wdkv), free(s), free(dp);
}

Test(kernels_attention, context_parallel_any_positions)
{
    /* head size 64 (the AVX-512 tiles where the CPU has them): queries 30 positions after the keys, so query
     * and key tiles are cut off the diagonal; queries from 10 before the first key (rows that see nothing) */
    check_attention_cp_positions(2, 150, 200, 2, 1, 64, 30, 0, 70);
    check_attention_cp_positions(1, 130, 140, 4, 2, 64, 0, 10, 71);
    check_attention_cp_positions(1, 64, 64, 2, 2, 64, 0, 0, 72);
    /* head size 16 (the sgemm tiles) */
    check_attention_cp_positions(2, 150, 200, 2, 1, 16, 30, 0, 73);
    check_attention_cp_positions(1, 130, 140, 4, 2, 16, 0, 10, 74);
}

/* bf16 mode rounds what the bf16 attention rounds: context-parallel attention over a whole sequence (every
 * query and key at its own position) against attention_forward / attention_backward in bf16 mode, both on
 * bf16-rounded q, k, v and dO with P and dS rounded as product operands. lse differs only in summation order
 * (2e-5). out and dqkv may differ by the bf16 bound's order (2^-7 relative to 1 + |x|): P is rounded once in
 * each, but not necessarily at the same place. The CPU's AVX-512 tiles and CUDA's flash kernels round the
 * running tile's exponentials in both entries (they then agree to 0 here), CUDA's tensor-core attention
 * (head sizes that are multiples of 8, attention_gemm.cu) rounds the normalised P (they differ by up to
 * 0.005). */
static void check_attention_cp_bf16_as_attention(int B, int T, int NH, int NKV, uint64_t seed)
{
    const struct kernels *k = tu_backend();
    if (!k->attention_cp_forward || !k->attention_cp_backward)
        cr_skip_test("the %s kernels have no context-parallel attention", k->name);
    if (!(k->matmul_dtypes & DTYPE_BIT(DTYPE_BF16)))
        cr_skip_test("%s: no native bf16 matmuls on this machine", k->name);
    cr_assert_eq(k->set_matmul_dtype(DTYPE_BF16), 0);
    int HS = 64, C = NH * HS, W = C + 2 * NKV * HS;
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = tu_host_rand(nq, seed, -2, 2), *dout = tu_host_rand(no, seed + 1, -1, 1);
    float *o1 = calloc(no, sizeof(float)), *l1 = calloc(nl, sizeof(float)), *d1 = calloc(nq, sizeof(float));
    float *o2 = calloc(no, sizeof(float)), *l2 = calloc(nl, sizeof(float)), *d2 = calloc(nq, sizeof(float));
    int *pos = malloc((size_t)T * sizeof *pos);
    size_t wsb = k->attention_workspace_bytes(B, T, C, NH, NKV);
    void *ws = k->mem_alloc(wsb);
    cr_assert(o1 && l1 && d1 && o2 && l2 && d2 && pos && ws);
    for (int j = 0; j < T; j++)
        pos[j] = j;
    float *d_qkv = tu_devf(k, qkv, nq), *d_dout = tu_devf(k, dout, no);
    float *d_o1 = tu_devf(k, NULL, no), *d_l1 = tu_devf(k, NULL, nl), *d_d1 = tu_devf(k, NULL, nq);
    float *d_o2 = tu_devf(k, NULL, no), *d_l2 = tu_devf(k, NULL, nl), *d_d2 = tu_devf(k, NULL, nq);
    int *d_pos = tu_dev_from(k, pos, (size_t)T * sizeof(int));
    cr_assert_eq(k->attention_forward(d_o1, d_l1, d_qkv, B, T, C, NH, NKV, 0, ws), 0, "%s", error_message());
    cr_assert_eq(k->attention_backward(d_d1, d_dout, d_qkv, d_o1, d_l1, B, T, C, NH, NKV, 0, ws), 0, "%s",
                 error_message());
    struct kernels_attention_cp a = {.b = B, .tq = T, .tk = T, .c = C, .nh = NH, .ld = W, .qpos = d_pos,
                                     .kpos = d_pos, .nkv = NKV};
    const float *kk = d_qkv + C, *vv = d_qkv + C + NKV * HS;
    cr_assert_eq(k->attention_cp_forward(d_o2, d_l2, d_qkv, kk, vv, &a), 0, "%s", error_message());
    cr_assert_eq(k->attention_cp_backward(d_d2, d_d2 + C, d_d2 + C + NKV * HS, d_dout, d_qkv, kk, vv, d_o2, d_l2, &a),
                 0, "%s", error_message());
    att_down(k, o1, d_o1, no * sizeof(float));
    att_down(k, l1, d_l1, nl * sizeof(float));
    att_down(k, d1, d_d1, nq * sizeof(float));
    att_down(k, o2, d_o2, no * sizeof(float));
    att_down(k, l2, d_l2, nl * sizeof(float));
    att_down(k, d2, d_d2, nq * sizeof(float));
    k->mem_free(d_qkv), k->mem_free(d_dout), k->mem_free(d_o1), k->mem_free(d_l1), k->mem_free(d_d1);
    k->mem_free(d_o2), k->mem_free(d_l2), k->mem_free(d_d2), k->mem_free(d_pos);
    const struct {
        const char *what;
        const float *x, *y;
        size_t n;
        double tol;
    } cmp[] = {{"out", o1, o2, no, 1.0 / 128}, {"lse", l1, l2, nl, 2e-5}, {"dqkv", d1, d2, nq, 1.0 / 128}};
    for (size_t c = 0; c < 3; c++) {
        double worst = 0;
        for (size_t i = 0; i < cmp[c].n; i++) {
            double e = fabs((double)cmp[c].x[i] - cmp[c].y[i]) / (1.0 + fabs((double)cmp[c].x[i]));
            worst = e > worst ? e : worst;
        }
        fprintf(stderr, "bf16 attention_cp against attention, %s: largest difference %.3g (bound %.3g)\n",
                cmp[c].what, worst, cmp[c].tol);
        cr_assert(worst <= cmp[c].tol, "bf16 %s: context-parallel attention differs from attention by %.3g (bound %.3g)",
                  cmp[c].what, worst, cmp[c].tol);
    }
    cr_assert_eq(k->set_matmul_dtype(DTYPE_F32), 0);
    k->mem_free(ws);
    free(qkv), free(dout), free(o1), free(l1), free(d1), free(o2), free(l2), free(d2), free(pos);
}

Test(kernels_attention, context_parallel_bf16_rounds_as_attention)
{
    check_attention_cp_bf16_as_attention(2, 200, 2, 2, 80);
    check_attention_cp_bf16_as_attention(1, 256, 4, 2, 81);
}
