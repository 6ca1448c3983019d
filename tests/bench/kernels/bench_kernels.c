/* Kernel benchmark: GFLOP/s of the CPU table's matmuls at GPT-2 layer shapes and of causal attention
 * forward+backward, each printed beside the peak OpenBLAS sgemm rate measured in the same run (the peer),
 * plus bandwidth of the memory-bound ops beside memcpy's.
 * Usage: bench_kernels [B T C NH]   (default 4 256 768 12, GPT-2 small with 256-token context)
 * Output: one line per result, `bench=kernel_<op> shape=... gflops=... sgemm_gflops=... ratio=...`. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
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
        double loss;
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
        BEST_OF(reps, tf, check(k->attention_forward(out, lse, qkv, B, T, C, NH, NH, ws)));
        BEST_OF(reps, tb, check(k->attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NH, ws)));
        printf("bench=kernel_attention_fwd shape=B%d_T%d_C%d_NH%d gflops=%.1f sgemm_gflops=%.1f ratio=%.3f\n", B,
               T, C, NH, ffl / tf / 1e9, peak, ffl / tf / 1e9 / peak);
        printf("bench=kernel_attention_bwd shape=B%d_T%d_C%d_NH%d gflops=%.1f sgemm_gflops=%.1f ratio=%.3f\n", B,
               T, C, NH, bfl / tb / 1e9, peak, bfl / tb / 1e9 / peak);
        printf("bench=kernel_attention shape=B%d_T%d_C%d_NH%d gflops=%.1f sgemm_gflops=%.1f ratio=%.3f\n", B, T,
               C, NH, (ffl + bfl) / (tf + tb) / 1e9, peak, (ffl + bfl) / (tf + tb) / 1e9 / peak);
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
