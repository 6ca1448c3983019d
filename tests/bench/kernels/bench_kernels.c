/* Kernel benchmark: GFLOP/s of the CPU table's matmuls at GPT-2 layer shapes and of causal attention
 * forward+backward, each printed beside the peak OpenBLAS sgemm rate measured in the same run (the peer),
 * plus bandwidth of the memory-bound ops beside memcpy's.
 * Usage: bench_kernels [B T C NH]   (default 4 256 768 12, GPT-2 small with 256-token context)
 * Output: one line per result, `bench=kernel_<op> shape=... gflops=... sgemm_gflops=... ratio=...`; and per
 * GEMM shape of the model (the default shapes, config S's and small ones) the two fp32 libraries, the one
 * FSDP_CPU_MATMUL=auto picks, and bf16 (`bench=gemm_shape ...`, summed up by `bench=gemm_auto_choice`). */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"
#include "tests/util/tu_proc.h"

static float *buf(size_t n, float v)
{
    float *p = kernels_cpu()->mem_alloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "bench_kernels: %s\n", error_message());
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = v * (float)((i * 2654435761u) % 1000) / 1000.0f - v / 2;
    return p;
}

/* Best time of reps runs, after one warm-up; the minimum is the least disturbed by other processes on
 * a shared machine. */
#define BEST_OF(reps, best, stmt)                                                                            \
    do {                                                                                                     \
        stmt;                                                                                                \
        best = 1e30;                                                                                         \
        for (int r_ = 0; r_ < (reps); r_++) {                                                                \
            double t0_ = tu_now();                                                                            \
            stmt;                                                                                            \
            double dt_ = tu_now() - t0_;                                                                      \
            best = dt_ < best ? dt_ : best;                                                                  \
        }                                                                                                    \
    } while (0)

static void check(int rc)
{
    if (rc) {
        fprintf(stderr, "bench_kernels: op failed: %s\n", error_message());
        exit(1);
    }
}

/* One product c(m, n) = op(a) op(b) of every kind the step runs: OpenBLAS sgemm, oneDNN fp32, oneDNN bf16 on
 * operands already in bf16 (bound gathered weights), and the table's bf16 gemm rounding both fp32 operands
 * first (activations). Returns whether auto's library was the faster fp32 one. */
static bool gemm_shape(int ta, int tb, int m, int n, int kk, const char *what)
{
    const struct kernels *k = kernels_cpu();
    size_t na = (size_t)m * kk, nb = (size_t)kk * n;
    float *a = buf(na, 1), *b = buf(nb, 1), *c = buf((size_t)m * n, 0);
    uint16_t *ah = malloc(na * 2), *bh = malloc(nb * 2);
    if (!ah || !bh) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        exit(1);
    }
    cpu_round_bf16(ah, a, 1, na, na);
    cpu_round_bf16(bh, b, 1, nb, nb);
    int lda = ta ? m : kk, ldb = tb ? kk : n, reps = (double)m * n * kk < 1e8 ? 20 : 5;
    double t_blas, t_dnn, t_bf, t_bfr, fl = 2.0 * m * n * kk;
    BEST_OF(reps, t_blas, cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                                      n, kk, 1.0f, a, lda, b, ldb, 0.0f, c, n));
    BEST_OF(reps, t_dnn, check(cpu_onednn_matmul(DTYPE_F32, ta, tb, m, n, kk, 1.0f, a, lda, b, ldb, 0.0f, c, n, NULL)));
    bool bf16 = k->matmul_dtypes & DTYPE_BIT(DTYPE_BF16);
    t_bf = t_bfr = NAN;
    if (bf16) {
        BEST_OF(reps, t_bf,
                check(cpu_onednn_matmul(DTYPE_BF16, ta, tb, m, n, kk, 1.0f, ah, lda, bh, ldb, 0.0f, c, n, NULL)));
        check(k->set_matmul_dtype(DTYPE_BF16));
        BEST_OF(reps, t_bfr, check(k->gemm(ta, tb, m, n, kk, 1.0f, a, lda, b, ldb, 0.0f, c, n)));
        check(k->set_matmul_dtype(DTYPE_F32));
    }
    bool onednn = cpu_matmul_f32_onednn(m, n, kk), right = onednn == (t_dnn < t_blas);
    printf("bench=gemm_shape what=%s shape=%dx%dx%d ta=%d tb=%d openblas_gflops=%.1f onednn_f32_gflops=%.1f "
           "onednn_over_openblas=%.3f auto=%s auto_faster=%s bf16_gflops=%.1f bf16_rounding_gflops=%.1f "
           "bf16_over_best_f32=%.3f\n",
           what, m, n, kk, ta, tb, fl / t_blas / 1e9, fl / t_dnn / 1e9, t_blas / t_dnn, onednn ? "onednn" : "openblas",
           right ? "yes" : "no", fl / t_bf / 1e9, fl / t_bfr / 1e9, fmin(t_blas, t_dnn) / t_bf);
    k->mem_free(a), k->mem_free(b), k->mem_free(c);
    free(ah), free(bh);
    return right;
}

/* The products of one step of the default shapes (N tokens, width C, vocabulary V), of config S (2048 tokens,
 * C 256, V 4096) and of small models, forward (op(a) = x), input gradient (b transposed) and weight
 * gradient (a transposed); and squares around auto's threshold. */
static void gemm_shapes(int N, int C, int V)
{
    const int sets[3][3] = {{N, C, V}, {2048, 256, 4096}, {16, 32, 256}};
    const char *set_name[3] = {"default", "S", "tiny"};
    int right = 0, total = 0;
    for (int s = 0; s < 3; s++) {
        int n = sets[s][0], c = sets[s][1], v = sets[s][2];
        const int lin[4][2] = {{c, 3 * c}, {c, c}, {c, 4 * c}, {4 * c, c}};
        char what[64];
        for (int l = 0; l < 4; l++) {
            int in = lin[l][0], out = lin[l][1];
            snprintf(what, sizeof what, "%s_linear%d_fwd", set_name[s], l);
            right += gemm_shape(0, 0, n, out, in, what), total++;
            snprintf(what, sizeof what, "%s_linear%d_dx", set_name[s], l);
            right += gemm_shape(0, 1, n, in, out, what), total++;
            snprintf(what, sizeof what, "%s_linear%d_dw", set_name[s], l);
            right += gemm_shape(1, 0, in, out, n, what), total++;
        }
        snprintf(what, sizeof what, "%s_lm_head_fwd", set_name[s]);
        right += gemm_shape(0, 1, n, v, c, what), total++;
        snprintf(what, sizeof what, "%s_lm_head_dx", set_name[s]);
        right += gemm_shape(0, 0, n, c, v, what), total++;
        snprintf(what, sizeof what, "%s_lm_head_dw", set_name[s]);
        right += gemm_shape(1, 0, v, c, n, what), total++;
    }
    for (int e = 24; e <= 160; e += e < 64 ? 8 : 32)
        right += gemm_shape(0, 0, e, e, e, "square"), total++;
    printf("bench=gemm_auto_choice shapes=%d auto_picked_the_faster=%d threads=%d\n", total, right,
           omp_get_max_threads());
}

int main(int argc, char **argv)
{
    int B = 4, T = 256, C = 768, NH = 12;
    if (argc == 5)
        B = atoi(argv[1]), T = atoi(argv[2]), C = atoi(argv[3]), NH = atoi(argv[4]);
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || C % NH) {
        fprintf(stderr, "usage: bench_kernels [B T C NH] (C a multiple of NH)\n");
        return 2;
    }
    const struct kernels *k = kernels_cpu();
    const int N = B * T, V = 50304;
    const int reps = 3;
    double t;

    /* peer: OpenBLAS sgemm on a large square problem */
    const int P = 2048;
    float *pa = buf((size_t)P * P, 1), *pb = buf((size_t)P * P, 1), *pc = buf((size_t)P * P, 0);
    BEST_OF(reps, t, cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, P, P, P, 1.0f, pa, P, pb, P, 0.0f, pc, P));
    const double peak = 2.0 * P * P * P / t / 1e9;
    printf("bench=kernel_sgemm_peak shape=%dx%dx%d gflops=%.1f threads=%d\n", P, P, P, peak, omp_get_max_threads());
    k->mem_free(pa), k->mem_free(pb), k->mem_free(pc);

    gemm_shapes(N, C, V);

    /* the four linear layers of a GPT-2 block: (in, out) */
    const int lin[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};
    const char *lin_name[4] = {"attn_qkv", "attn_proj", "mlp_fc", "mlp_proj"};
    double tot_flops = 0, tot_time = 0;
    for (int l = 0; l < 4; l++) {
        int in = lin[l][0], out = lin[l][1];
        float *x = buf((size_t)N * in, 1), *w = buf((size_t)in * out, 0.1f), *b = buf(out, 0.1f);
        float *y = buf((size_t)N * out, 0), *dy = buf((size_t)N * out, 1), *dx = buf((size_t)N * in, 0);
        float *dw = buf((size_t)in * out, 0), *db = buf(out, 0);
        double fl = 2.0 * N * in * out;
        BEST_OF(reps, t, check(k->matmul_forward(y, x, w, b, N, in, out)));
        printf("bench=kernel_matmul_fwd layer=%s shape=%dx%dx%d gflops=%.1f sgemm_gflops=%.1f ratio=%.3f\n",
               lin_name[l], N, in, out, fl / t / 1e9, peak, fl / t / 1e9 / peak);
        tot_flops += fl, tot_time += t;
        BEST_OF(reps, t, check(k->matmul_backward(dx, dw, db, dy, x, w, N, in, out)));
        printf("bench=kernel_matmul_bwd layer=%s shape=%dx%dx%d gflops=%.1f sgemm_gflops=%.1f ratio=%.3f\n",
               lin_name[l], N, in, out, 2 * fl / t / 1e9, peak, 2 * fl / t / 1e9 / peak);
        tot_flops += 2 * fl, tot_time += t;
        k->mem_free(x), k->mem_free(w), k->mem_free(b), k->mem_free(y), k->mem_free(dy);
        k->mem_free(dx), k->mem_free(dw), k->mem_free(db);
    }
    printf("bench=kernel_matmul_block shape=N%d_C%d gflops=%.1f sgemm_gflops=%.1f ratio=%.3f\n", N, C,
           tot_flops / tot_time / 1e9, peak, tot_flops / tot_time / 1e9 / peak);

    /* tied LM head: logits = x wte^T, wte (V, C) */
    {
        float *x = buf((size_t)N * C, 1), *wte = buf((size_t)V * C, 0.1f), *lg = buf((size_t)N * V, 0);
        double fl = 2.0 * N * C * V;
        BEST_OF(1, t, check(k->gemm(0, 1, N, V, C, 1.0f, x, C, wte, C, 0.0f, lg, V)));
        printf("bench=kernel_lm_head shape=%dx%dx%d gflops=%.1f sgemm_gflops=%.1f ratio=%.3f\n", N, C, V,
               fl / t / 1e9, peak, fl / t / 1e9 / peak);
        int32_t *tg = malloc((size_t)N * sizeof *tg);
        for (int i = 0; i < N; i++)
            tg[i] = (int32_t)((i * 7919) % 50257);
        double loss = 0; /* the table adds each call's sum to it */
        /* memory-bound: reads logits twice, writes dlogits once */
        BEST_OF(reps, t, check(k->crossentropy_forward_backward(NULL, &loss, lg, lg, tg, N, 50257, V, 1.0f / N)));
        double bytes = 3.0 * N * (double)V * 4;
        double tm;
        BEST_OF(reps, tm, memcpy(wte, lg, (size_t)V * C * 4));
        double mc = 2.0 * V * C * 4 / tm / 1e9;
        printf("bench=kernel_crossentropy shape=%dx%d gbps=%.1f memcpy_gbps=%.1f ratio=%.3f\n", N, V,
               bytes / t / 1e9, mc, bytes / t / 1e9 / mc);
        free(tg);
        k->mem_free(x), k->mem_free(wte), k->mem_free(lg);
    }

    /* causal attention forward + backward; causal FLOPs only (fwd 2 matmuls, bwd 5, each half a T x T) */
    {
        int hs = C / NH;
        float *qkv = buf((size_t)N * 3 * C, 1), *out = buf((size_t)N * C, 0), *lse = buf((size_t)B * NH * T, 0);
        float *dout = buf((size_t)N * C, 1), *dqkv = buf((size_t)N * 3 * C, 0);
        void *ws = k->mem_alloc(k->attention_workspace_bytes(B, T, C, NH, NH));
        double ffl = 2.0 * B * NH * (double)T * T * hs, bfl = 2.5 * ffl;
        double tf, tb;
        BEST_OF(reps, tf, check(k->attention_forward(out, lse, qkv, B, T, C, NH, NH, 0, ws)));
        BEST_OF(reps, tb, check(k->attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NH, 0, ws)));
        printf("bench=kernel_attention_fwd shape=B%d_T%d_C%d_NH%d gflops=%.1f sgemm_gflops=%.1f ratio=%.3f\n", B,
               T, C, NH, ffl / tf / 1e9, peak, ffl / tf / 1e9 / peak);
        printf("bench=kernel_attention_bwd shape=B%d_T%d_C%d_NH%d gflops=%.1f sgemm_gflops=%.1f ratio=%.3f\n", B,
               T, C, NH, bfl / tb / 1e9, peak, bfl / tb / 1e9 / peak);
        printf("bench=kernel_attention shape=B%d_T%d_C%d_NH%d gflops=%.1f sgemm_gflops=%.1f ratio=%.3f\n", B, T,
               C, NH, (ffl + bfl) / (tf + tb) / 1e9, peak, (ffl + bfl) / (tf + tb) / 1e9 / peak);
        /* sliding window (Mistral) of T / 8 keys against the full causal attention above: skipping the key tiles
         * outside the window should cut the time by about the share of the causal triangle they hold */
        int w = T / 8 > 0 ? T / 8 : 1;
        double twf, twb;
        BEST_OF(reps, twf, check(k->attention_forward(out, lse, qkv, B, T, C, NH, NH, w, ws)));
        BEST_OF(reps, twb, check(k->attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NH, w, ws)));
        printf("bench=kernel_attention_window shape=B%d_T%d_C%d_NH%d window=%d ms=%.3f full_causal_ms=%.3f "
               "speedup=%.2f\n",
               B, T, C, NH, w, (twf + twb) * 1e3, (tf + tb) * 1e3, (tf + tb) / (twf + twb));
        k->mem_free(qkv), k->mem_free(out), k->mem_free(lse), k->mem_free(dout), k->mem_free(dqkv), k->mem_free(ws);
    }

    /* memory-bound ops on the MLP activation (N, 4C), against memcpy of the same buffer */
    {
        size_t n = (size_t)N * 4 * C;
        float *a = buf(n, 4), *b = buf(n, 1), *c = buf(n, 0);
        double tm, tg, tgb, tl;
        BEST_OF(reps, tm, memcpy(c, a, n * 4));
        double mc = 2.0 * n * 4 / tm / 1e9;
        BEST_OF(reps, tg, check(k->gelu_forward(c, a, n)));
        BEST_OF(reps, tgb, check(k->gelu_backward(c, a, b, n)));
        printf("bench=kernel_gelu_fwd shape=%zu gbps=%.1f memcpy_gbps=%.1f ratio=%.3f\n", n, 8.0 * n / tg / 1e9, mc,
               8.0 * n / tg / 1e9 / mc);
        printf("bench=kernel_gelu_bwd shape=%zu gbps=%.1f memcpy_gbps=%.1f ratio=%.3f\n", n, 16.0 * n / tgb / 1e9,
               mc, 16.0 * n / tgb / 1e9 / mc);
        float *w = buf(C, 1), *bb = buf(C, 1), *mean = buf(N, 0), *rstd = buf(N, 0);
        BEST_OF(reps, tl, check(k->layernorm_forward(c, mean, rstd, a, w, bb, N, C, 1e-5f)));
        double lnb = 8.0 * N * C;
        printf("bench=kernel_layernorm_fwd shape=%dx%d gbps=%.1f memcpy_gbps=%.1f ratio=%.3f\n", N, C, lnb / tl / 1e9,
               mc, lnb / tl / 1e9 / mc);
        BEST_OF(reps, tl, check(k->layernorm_backward(b, w, bb, c, a, w, mean, rstd, N, C)));
        printf("bench=kernel_layernorm_bwd shape=%dx%d gbps=%.1f memcpy_gbps=%.1f ratio=%.3f\n", N, C,
               2.0 * lnb / tl / 1e9, mc, 2.0 * lnb / tl / 1e9 / mc);
        float *m = buf(n, 0), *v = buf(n, 0);
        struct kernels_adamw_params hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                          .weight_decay = 0.1f, .grad_scale = 1.0f, .step = 1};
        BEST_OF(reps, tl, check(k->adamw(c, b, m, v, n, &hp)));
        printf("bench=kernel_adamw shape=%zu gbps=%.1f memcpy_gbps=%.1f ratio=%.3f\n", n, 28.0 * n / tl / 1e9, mc,
               28.0 * n / tl / 1e9 / mc);
        k->mem_free(a), k->mem_free(b), k->mem_free(c), k->mem_free(w), k->mem_free(bb), k->mem_free(mean);
        k->mem_free(rstd), k->mem_free(m), k->mem_free(v);
    }
    return 0;
}
