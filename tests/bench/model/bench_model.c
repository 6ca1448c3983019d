/* Model benchmark: the single-process training step (what a world-1 step does: zero grads,
 * model_forward_backward, global grad norm, AdamW over every parameter through the kernels table) in three
 * precisions, beside PyTorch 2.x from the PyPI venv running the same model and step
 * (../shared/anchors/torch2/fsdp2_gpt.py --mode single, fp32 and --bf16 autocast), all in the same run, so
 * the ratios hold even on a noisy shared machine:
 *   fp32           fp32 matmuls on the library FSDP_CPU_MATMUL=auto picks per shape (oneDNN or OpenBLAS);
 *   fp32_openblas  fp32 matmuls on OpenBLAS alone (FSDP_CPU_MATMUL=openblas): what fp32 ran on before;
 *   bf16           mixed_precision = bf16 as a world-1 rank runs it: fp32 master weights and AdamW, the
 *                  bf16 copy refreshed after each step and bound to the parameters the model reads (the
 *                  engine's gather), so the matmuls read it as is; bf16 matmuls and attention products.
 * Each child also measures the GEMM peaks of this machine (the best of a few GPT shapes: fp32 on the
 * table's library, bf16 on operands already in bf16, OpenBLAS sgemm; per CPU-second, so other processes on
 * the machine do not lower them), and a profiled child per precision gives the CPU time per op and the
 * fraction of the peak each reaches (step_frac_*: the step's FLOPs per CPU-second against the peak);
 * `bench=model_goals` sets the step against the goals and against the ceiling the GEMM peaks allow.
 *
 * OpenMP, OpenBLAS and FSDP_CPU_MATMUL are read once at start, so each (config, threads, precision) point
 * runs in a child: this binary re-executed as `bench_model --child CONFIG --precision P [--profile]`.
 *
 * Usage: bench_model [--rounds N] [--threads LIST] [S|L|M ...]   (default: 1 round, threads 1, S L)
 *        bench_model --child S|L|M --precision fp32|bf16 [--profile]
 * With N rounds each point runs ours and PyTorch alternately N times and keeps each side's best round, so a
 * slow spell of the shared machine hits both sides alike rather than whichever ran during it.
 * Output: `bench=model_step config=S threads=1 precision=bf16 tokens_per_s=... cpu_tokens_per_s=... gflops=...
 *          torch_tokens_per_s=... ratio=...` (cpu_tokens_per_s: per CPU-second of the process, what the step
 *          computed whatever else ran on the machine; the peer prints wall time only, so ratio is of wall
 *          time), `bench=model_peak ...`, `bench=model_profile ...`, `bench=model_goals ...`,
 *          `bench=model_arena ...` per config. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "kernels/kernels.h"
#include "tests/util/tu_proc.h"
#include "tests/util/tu_venv.h"
#include "worker/model/model.h"

struct bench_config {
    const char *name;
    int n_layer, n_embd, n_head, vocab, t, b;
    int warmup, steps; /* ours and torch's: L and M take seconds per step on one core */
};

static const struct bench_config configs[] = {
    {"S", 4, 256, 4, 4096, 256, 8, 2, 10},
    /* 51.2M parameters (the issue's >= 50M config; bench_train's L with 4 rows) */
    {"L", 8, 512, 8, 50304, 256, 4, 1, 4},
    /* GPT-2 small, 124M */
    {"M", 12, 768, 12, 50304, 256, 4, 1, 3},
};
enum { NCONFIGS = sizeof configs / sizeof configs[0] };

static void die(const char *what)
{
    fprintf(stderr, "bench_model: %s: %s\n", what, error_message());
    exit(1);
}

static const struct bench_config *config_find(const char *name)
{
    for (int i = 0; i < NCONFIGS; i++)
        if (strcmp(configs[i].name, name) == 0)
            return &configs[i];
    return NULL;
}

static void config_to_model(const struct bench_config *bc, struct model_config *mc, bool ckpt)
{
    model_config_default(mc);
    mc->n_layer = bc->n_layer;
    mc->n_embd = bc->n_embd;
    mc->n_head = bc->n_head;
    mc->vocab_size = bc->vocab;
    mc->block_size = bc->t;
    mc->activation_checkpointing = ckpt;
}

/* Model FLOPs of one step, the PaLM/nanoGPT "MFU" count: 6 x (parameters that take part in matmuls) x
 * tokens, i.e. every weight once in forward and twice in backward, with wte counted through the tied LM
 * head and wpe (a lookup, no matmul) left out; plus causal attention, 6 x L x T x C per token (QK^T and
 * PV each 2 x (T/2) x C multiply-adds per token forward under the causal mask, twice that backward).
 * Elementwise work (layernorm, GELU, softmax, AdamW) is not counted: it is the overhead to minimise.
 * The same count divides PyTorch's step time, so gflops ratios equal tokens/s ratios. */
static double step_flops(const struct bench_config *bc, const struct model_layout *l)
{
    double tokens = (double)bc->b * bc->t;
    double matmul_params = (double)l->numel_real - (double)bc->t * bc->n_embd;
    return 6.0 * matmul_params * tokens + 6.0 * bc->n_layer * (double)bc->t * bc->n_embd * tokens;
}

/* CPU seconds this process has run: on a shared machine the time a step actually computed, whatever the
 * scheduler gave the other processes (with one thread, what the wall clock shows on a quiet machine). */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- per-op profile: a copy of the CPU table whose entries time the real ones (CPU time: with one thread
 * the op's own time, undisturbed by other processes on the machine) ---- */
enum prof_op { P_MATMUL_F, P_MATMUL_B, P_GEMM, P_GEMM_DX, P_LN_F, P_LN_B, P_ATT_F, P_ATT_B, P_GELU_F, P_GELU_B, P_RESID,
               P_EMB_F, P_EMB_B, P_XENT, P_ADAMW, P_SQNORM, P_MEMSET, P_CAST, P_HOLD, P_N };
static const char *prof_names[P_N] = {"matmul_fwd", "matmul_bwd", "gemm_lm_head", "gemm_linear_dx", "layernorm_fwd",
                                      "layernorm_bwd", "attention_fwd", "attention_bwd", "gelu_fwd",
                                      "gelu_bwd", "residual", "embedding_fwd", "embedding_bwd",
                                      "crossentropy", "adamw", "sqnorm", "mem_set", "cast", "operand_hold"};
static double prof_time[P_N];
static double prof_flops[P_N];
static const struct kernels *real;
static int prof_vocab; /* the model's padded vocabulary: tells the LM head's GEMMs from the others */

#define PROF(op, fl, call)                                                                                   \
    do {                                                                                                     \
        double t0_ = cpu_now();                                                                               \
        int rc_ = (call);                                                                                    \
        prof_time[op] += cpu_now() - t0_;                                                                     \
        prof_flops[op] += (fl);                                                                              \
        return rc_;                                                                                          \
    } while (0)

static int p_matmul_forward(float *y, const float *x, const float *w, const float *b, int n, int in, int out)
{
    PROF(P_MATMUL_F, 2.0 * n * in * out, real->matmul_forward(y, x, w, b, n, in, out));
}
static int p_matmul_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                             int n, int in, int out)
{
    PROF(P_MATMUL_B, 2.0 * n * in * out * ((dx != NULL) + (dw != NULL)),
         real->matmul_backward(dx, dw, db, dy, x, w, n, in, out));
}
static int p_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                  int ldb, float beta, float *c, int ldc)
{
    /* The model calls gemm for the tied LM head (one of its dimensions is the padded vocabulary) and for
     * every linear layer's input gradient (linear_backward): two lines, not one. */
    bool head = m == prof_vocab || n == prof_vocab || k == prof_vocab;
    PROF(head ? P_GEMM : P_GEMM_DX, 2.0 * m * n * k,
         real->gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
}
static int p_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                               const float *bias, int n, int c, float eps)
{
    PROF(P_LN_F, 0, real->layernorm_forward(out, mean, rstd, inp, weight, bias, n, c, eps));
}
static int p_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                const float *weight, const float *mean, const float *rstd, int n, int c)
{
    PROF(P_LN_B, 0, real->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, n, c));
}
static int p_attention_forward(float *out, float *lse, const float *qkv, int b, int t, int c, int nh, int nkv,
                               int w, void *ws)
{
    PROF(P_ATT_F, 2.0 * b * (double)t * t * c, real->attention_forward(out, lse, qkv, b, t, c, nh, nkv, w, ws));
}
static int p_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                                const float *lse, int b, int t, int c, int nh, int nkv, int w, void *ws)
{
    PROF(P_ATT_B, 4.0 * b * (double)t * t * c,
         real->attention_backward(dqkv, dout, qkv, out, lse, b, t, c, nh, nkv, w, ws));
}
static int p_gelu_forward(float *out, const float *inp, size_t n)
{
    PROF(P_GELU_F, 0, real->gelu_forward(out, inp, n));
}
static int p_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    PROF(P_GELU_B, 0, real->gelu_backward(dinp, inp, dout, n));
}
static int p_residual_forward(float *out, const float *a, const float *b, size_t n)
{
    PROF(P_RESID, 0, real->residual_forward(out, a, b, n));
}
static int p_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int b,
                               int t, int c, int vocab)
{
    PROF(P_EMB_F, 0, real->embedding_forward(out, tokens, wte, wpe, b, t, c, vocab));
}
static int p_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int b,
                                int t, int c, int vocab)
{
    PROF(P_EMB_B, 0, real->embedding_backward(dwte, dwpe, dout, tokens, b, t, c, vocab));
}
static int p_crossentropy(float *losses, double *loss_acc, float *dlogits, const float *logits,
                          const int32_t *targets, int n, int v, int vp, float dloss)
{
    PROF(P_XENT, 0, real->crossentropy_forward_backward(losses, loss_acc, dlogits, logits, targets, n, v, vp, dloss));
}
static int p_adamw(float *param, const float *grad, float *m, float *v, size_t n,
                   const struct kernels_adamw_params *hp)
{
    PROF(P_ADAMW, 0, real->adamw(param, grad, m, v, n, hp));
}
static int p_sqnorm(double *result, const float *x, size_t n)
{
    PROF(P_SQNORM, 0, real->sqnorm(result, x, n));
}
static int p_mem_set(void *dst, int value, size_t bytes)
{
    PROF(P_MEMSET, 0, real->mem_set(dst, value, bytes));
}
static int p_cast(void *dst, enum dtype dd, const void *src, enum dtype sd, size_t n)
{
    PROF(P_CAST, 0, real->cast(dst, dd, src, sd, n));
}

static int p_lowp_hold(const float *x, size_t n)
{
    PROF(P_HOLD, 0, real->lowp_hold(x, n));
}

static struct kernels profiled;

static const struct kernels *profile_table(const struct kernels *k)
{
    real = k;
    profiled = *k;
    profiled.matmul_forward = p_matmul_forward;
    profiled.matmul_backward = p_matmul_backward;
    profiled.gemm = p_gemm;
    profiled.layernorm_forward = p_layernorm_forward;
    profiled.layernorm_backward = p_layernorm_backward;
    profiled.attention_forward = p_attention_forward;
    profiled.attention_backward = p_attention_backward;
    profiled.gelu_forward = p_gelu_forward;
    profiled.gelu_backward = p_gelu_backward;
    profiled.residual_forward = p_residual_forward;
    profiled.embedding_forward = p_embedding_forward;
    profiled.embedding_backward = p_embedding_backward;
    profiled.crossentropy_forward_backward = p_crossentropy;
    profiled.adamw = p_adamw;
    profiled.sqnorm = p_sqnorm;
    profiled.mem_set = p_mem_set;
    profiled.cast = p_cast;
    if (k->lowp_hold)
        profiled.lowp_hold = p_lowp_hold;
    return &profiled;
}

/* ---- the GEMM peaks of this machine, measured in the child ---- */

/* Best GFLOP per CPU-second (GFLOP/s of one thread) over a few reps of C(m, n) = A(m, k) B(k, n) through the
 * table (fp32 on its library, or bf16 on operands bound to bf16 copies, as gathered weights are) or OpenBLAS
 * sgemm. CPU time, so that other processes on the machine do not lower the peak the step is set against. */
enum peak_kind { PEAK_F32, PEAK_BF16, PEAK_SGEMM };

static double gemm_rate(const struct kernels *k, enum peak_kind kind, int m, int n, int kk)
{
    float *a = k->mem_alloc((size_t)m * kk * sizeof(float)), *b = k->mem_alloc((size_t)kk * n * sizeof(float));
    float *c = k->mem_alloc((size_t)m * n * sizeof(float));
    uint16_t *ah = malloc((size_t)m * kk * 2), *bh = malloc((size_t)kk * n * 2);
    if (!a || !b || !c || !ah || !bh)
        die("allocating the peak's matrices");
    for (size_t i = 0; i < (size_t)m * kk; i++)
        a[i] = (float)(i % 17) * 0.01f;
    for (size_t i = 0; i < (size_t)kk * n; i++)
        b[i] = (float)(i % 13) * 0.01f;
    if (kind == PEAK_BF16) {
        if (k->cast(ah, DTYPE_BF16, a, DTYPE_F32, (size_t)m * kk) ||
            k->cast(bh, DTYPE_BF16, b, DTYPE_F32, (size_t)kk * n) || k->lowp_bind(a, ah, (size_t)m * kk) ||
            k->lowp_bind(b, bh, (size_t)kk * n))
            die("binding the peak's bf16 operands");
    }
    if (k->set_matmul_dtype(kind == PEAK_BF16 ? DTYPE_BF16 : DTYPE_F32))
        die("set_matmul_dtype");
    double best = 1e30;
    for (int r = 0; r < 6; r++) {
        double t0 = cpu_now();
        if (kind == PEAK_SGEMM)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, kk, 1.0f, a, kk, b, n, 0.0f, c, n);
        else if (k->gemm(0, 0, m, n, kk, 1.0f, a, kk, b, n, 0.0f, c, n))
            die("gemm");
        double dt = cpu_now() - t0;
        if (r > 0 && dt < best)
            best = dt;
    }
    if (kind == PEAK_BF16 && (k->lowp_unbind(a) || k->lowp_unbind(b)))
        die("unbinding");
    k->mem_free(a), k->mem_free(b), k->mem_free(c);
    free(ah), free(bh);
    return 2.0 * m * n * kk / best / 1e9;
}

/* The best over GPT shapes: this config's MLP up-projection and GPT-2 small's (1024 tokens x 768 -> 3072). */
static double gemm_peak(const struct kernels *k, enum peak_kind kind, const struct bench_config *bc)
{
    int n_tok = bc->b * bc->t;
    double a = gemm_rate(k, kind, n_tok, 4 * bc->n_embd, bc->n_embd), b = gemm_rate(k, kind, 1024, 3072, 768);
    return a > b ? a : b;
}

/* ---- one (config, threads, precision) point, in this process ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int run_child(const struct bench_config *bc, bool bf16, bool profile)
{
    const struct kernels *base = kernels_cpu();
    /* the peaks first, in this process's library setting; then the mode the step runs in */
    double f32_peak = gemm_peak(base, PEAK_F32, bc), bf16_peak = NAN;
    if (base->matmul_dtypes & KERNELS_DTYPE_BIT(DTYPE_BF16))
        bf16_peak = gemm_peak(base, PEAK_BF16, bc);
    double sgemm_peak = gemm_peak(base, PEAK_SGEMM, bc);
    if (bf16 && !(base->matmul_dtypes & KERNELS_DTYPE_BIT(DTYPE_BF16)))
        fprintf(stderr, "bench_model: this CPU has no bf16 matmul instructions: bf16 computes in fp32\n");
    if (base->set_matmul_dtype(bf16 ? DTYPE_BF16 : DTYPE_F32))
        die("set_matmul_dtype");
    const struct kernels *k = profile ? profile_table(base) : base;
    struct model_config mc;
    config_to_model(bc, &mc, false);
    struct model *m;
    if (model_create(&m, &mc, k, bc->b, bc->t) != 0)
        die("model_create");
    const struct model_layout *l = model_get_layout(m);
    prof_vocab = (int)l->vocab_padded;
    size_t n = l->numel;
    float *params = k->mem_alloc(n * sizeof(float)), *grads = k->mem_alloc(n * sizeof(float));
    float *mom1 = k->mem_alloc(n * sizeof(float)), *mom2 = k->mem_alloc(n * sizeof(float));
    /* bf16: the persistent bf16 copy (the engine's lp shard) and the gathered fp32 view of it */
    uint16_t *lp = bf16 ? k->mem_alloc(n * sizeof(uint16_t)) : NULL;
    float *full = bf16 ? k->mem_alloc(n * sizeof(float)) : params;
    if (!params || !grads || !mom1 || !mom2 || !full || (bf16 && !lp))
        die("allocating parameters and optimizer state");
    if (model_init_params(l, params) != 0)
        die("model_init_params");
    k->mem_set(mom1, 0, n * sizeof(float));
    k->mem_set(mom2, 0, n * sizeof(float));
    if (bf16 && k->cast(lp, DTYPE_BF16, params, DTYPE_F32, n))
        die("cast");
    size_t ntok = (size_t)bc->b * bc->t;
    int32_t *tokens = malloc(ntok * sizeof *tokens), *targets = malloc(ntok * sizeof *targets);
    if (!tokens || !targets)
        die("out of memory");
    uint32_t rng = 1234;
    double best = 1e30, times[64], cpu_times[64];
    int timed = 0;
    for (int step = 0; step < bc->warmup + bc->steps; step++) {
        for (size_t i = 0; i < ntok; i++) {
            rng = rng * 1664525u + 1013904223u;
            tokens[i] = (int32_t)((rng >> 8) % (uint32_t)bc->vocab);
        }
        /* targets = tokens shifted left by one within each row, like the peer's */
        for (int bi = 0; bi < bc->b; bi++)
            for (int ti = 0; ti < bc->t; ti++)
                targets[bi * bc->t + ti] = tokens[bi * bc->t + (ti + 1) % bc->t];
        if (step == bc->warmup && profile)
            memset(prof_time, 0, sizeof prof_time), memset(prof_flops, 0, sizeof prof_flops);
        double t0 = tu_now(), c0 = cpu_now();
        float loss;
        /* bf16: the gather of a one-rank group (cast the bf16 copy to the fp32 view, bind the two) */
        if (bf16 && (k->cast(full, DTYPE_F32, lp, DTYPE_BF16, n) || k->lowp_bind(full, lp, n)))
            die("gathering");
        if (k->mem_set(grads, 0, n * sizeof(float)) != 0 || model_set_batch(m, tokens, targets) != 0 ||
            model_forward_backward(m, full, grads, &loss) != 0)
            die("training step");
        if (bf16 && k->lowp_unbind(full))
            die("release");
        /* gradient clipping at 1.0 like the peer: one norm over all gradients, folded into AdamW */
        double sq = 0;
        if (k->sqnorm(&sq, grads, n) != 0)
            die("sqnorm");
        double norm = sqrt(sq);
        struct kernels_adamw_params hp = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                          .grad_scale = norm > 1.0 ? (float)(1.0 / (norm + 1e-6)) : 1.0f,
                                          .step = step + 1};
        for (int p = 0; p < l->n_params; p++) {
            const struct model_param *mp = &l->params[p];
            hp.weight_decay = mp->weight_decay ? 0.1f : 0.0f;
            if (k->adamw(params + mp->offset, grads + mp->offset, mom1 + mp->offset, mom2 + mp->offset, mp->numel,
                         &hp) != 0)
                die("adamw");
        }
        /* bf16: the engine's refresh of the low-precision copy after the optimizer */
        if (bf16 && k->cast(lp, DTYPE_BF16, params, DTYPE_F32, n))
            die("refresh");
        double dt = tu_now() - t0, dc = cpu_now() - c0;
        if (!isfinite(loss))
            die("non-finite loss");
        if (step >= bc->warmup) {
            best = dt < best ? dt : best;
            if (timed < 64)
                cpu_times[timed] = dc, times[timed++] = dt;
        }
    }
    /* median of the timed steps, as the peer reports; best is printed too */
    qsort(times, (size_t)timed, sizeof times[0], cmp_double);
    qsort(cpu_times, (size_t)timed, sizeof cpu_times[0], cmp_double);
    double med = times[timed / 2], cpu_med = cpu_times[timed / 2];
    double fl = step_flops(bc, l);
    double peak = bf16 ? bf16_peak : f32_peak;
    printf("child tokens_per_s=%.1f best_tokens_per_s=%.1f cpu_tokens_per_s=%.1f gflops=%.2f f32_gemm_gflops=%.2f "
           "bf16_gemm_gflops=%.2f sgemm_gflops=%.2f params=%zu\n",
           (double)ntok / med, (double)ntok / best, (double)ntok / cpu_med, fl / med / 1e9, f32_peak, bf16_peak,
           sgemm_peak, l->numel_real);
    if (profile) {
        double tot = 0, gemm = 0;
        for (int i = 0; i < P_N; i++)
            tot += prof_time[i];
        for (int i = 0; i < P_N; i++) {
            if (prof_time[i] <= 0)
                continue;
            double gf = prof_flops[i] > 0 ? prof_flops[i] / prof_time[i] / 1e9 : 0.0;
            if (i == P_MATMUL_F || i == P_MATMUL_B || i == P_GEMM || i == P_GEMM_DX)
                gemm += prof_time[i];
            printf("profile op=%s ms_per_step=%.2f share=%.3f gflops=%.1f frac_of_peak=%.3f\n", prof_names[i],
                   1e3 * prof_time[i] / timed, prof_time[i] / tot, gf, gf / peak);
        }
        printf("profile op=total ms_per_step=%.2f step_ms=%.2f step_cpu_ms=%.2f gemm_ms=%.2f step_gflops=%.2f "
               "peak_gflops=%.2f frac_of_peak=%.3f\n",
               1e3 * tot / timed, 1e3 * med, 1e3 * cpu_med, 1e3 * gemm / timed, fl / cpu_med / 1e9, peak,
               fl / cpu_med / 1e9 / peak);
    }
    free(tokens), free(targets);
    k->mem_free(params), k->mem_free(grads), k->mem_free(mom1), k->mem_free(mom2);
    if (bf16)
        k->mem_free(lp), k->mem_free(full);
    model_destroy(m);
    return 0;
}

/* ---- the driver: children per point, torch beside them ---- */

/* Runs cmd through the shell and returns the value of `key=` in its output (the last occurrence), or
 * NAN; the output is echoed to stderr for the log, and the `profile` lines kept in prof (when given). */
static double run_and_grab(const char *cmd, const char *key, char *line_out, size_t line_cap, char *prof,
                           size_t prof_cap)
{
    FILE *f = popen(cmd, "r");
    if (!f)
        return NAN;
    char line[4096];
    double val = NAN;
    size_t klen = strlen(key);
    if (prof)
        prof[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        fputs(line, stderr);
        if (prof && strncmp(line, "profile ", 8) == 0 && strlen(prof) + strlen(line) < prof_cap)
            strcat(prof, line);
        for (char *p = strstr(line, key); p; p = strstr(p + 1, key))
            if ((p == line || p[-1] == ' ') && p[klen] == '=') {
                val = strtod(p + klen + 1, NULL);
                if (line_out)
                    snprintf(line_out, line_cap, "%s", line);
            }
    }
    int st = pclose(f);
    return st == 0 ? val : NAN;
}

static double grab(const char *line, const char *key)
{
    size_t klen = strlen(key);
    for (const char *p = strstr(line, key); p; p = strstr(p + 1, key))
        if ((p == line || p[-1] == ' ') && p[klen] == '=')
            return strtod(p + klen + 1, NULL);
    return NAN;
}

/* Runs `sh -c cmd` with its standard output to out_path (stderr to ours) and returns the CPU seconds it and
 * everything it waited for used (user + system), or NAN when it failed. */
static double cpu_of(const char *cmd, const char *out_path)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return NAN;
    if (pid == 0) {
        if (!freopen(out_path, "w", stdout))
            _exit(127);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int st;
    struct rusage ru;
    if (wait4(pid, &st, 0, &ru) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return NAN;
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

/* One PyTorch run of a point: its tokens/s (wall, the median step it prints) and its tokens per CPU-second:
 * the CPU time of the run minus that of a run of its warm-up steps alone, over the timed steps' tokens
 * (start-up, warm-up and exit cancel out). */
static void torch_point(const char *python, const char *script, const struct bench_config *bc, int threads, bool bf16,
                        double *wall_tps, double *cpu_tps)
{
    char cmd[6 * PATH_MAX], base[5 * PATH_MAX], out[] = "/tmp/bench-model-torch-XXXXXX";
    *wall_tps = *cpu_tps = NAN;
    int fd = mkstemp(out);
    if (fd < 0)
        return;
    close(fd);
    snprintf(base, sizeof base,
             "OMP_NUM_THREADS=%d '%s' '%s' --mode single --n_layer %d --n_embd %d --n_head %d --vocab %d "
             "--block_size %d --global_batch %d --warmup %d%s",
             threads, python, script, bc->n_layer, bc->n_embd, bc->n_head, bc->vocab, bc->t, bc->b, bc->warmup,
             bf16 ? " --bf16" : "");
    snprintf(cmd, sizeof cmd, "%s --steps %d", base, bc->warmup + bc->steps);
    double full = cpu_of(cmd, out);
    char line[4096] = "";
    FILE *f = fopen(out, "r");
    while (f && fgets(line, sizeof line, f)) {
        fputs(line, stderr);
        const char *p = strstr(line, "tokens_per_s=");
        if (p)
            *wall_tps = strtod(p + strlen("tokens_per_s="), NULL);
    }
    if (f)
        fclose(f);
    snprintf(cmd, sizeof cmd, "%s --steps %d", base, bc->warmup);
    double warm = cpu_of(cmd, "/dev/null");
    unlink(out);
    if (full > warm)
        *cpu_tps = (double)bc->steps * bc->b * bc->t / (full - warm);
}

/* The PyTorch 2.x peer: the venv's python and the anchor next to the project checkout
 * (FSDP_SOURCE_ROOT/../shared/anchors/torch2/fsdp2_gpt.py). */
static bool torch_peer(char *python, size_t pcap, char *script, size_t scap)
{
    const char *src = getenv("FSDP_SOURCE_ROOT");
    snprintf(script, scap, "%s/../shared/anchors/torch2/fsdp2_gpt.py", src ? src : ".");
    return tu_venv_bin("python", python, pcap) && access(script, R_OK) == 0;
}

static void print_arena(const struct bench_config *bc)
{
    struct model_config mc;
    config_to_model(bc, &mc, false);
    const struct kernels *k = kernels_cpu();
    size_t full = model_arena_bytes(&mc, bc->b, bc->t, false, k);
    size_t ck = model_arena_bytes(&mc, bc->b, bc->t, true, k);
    printf("bench=model_arena config=%s batch=%dx%d arena_mib=%.1f arena_ckpt_mib=%.1f ratio=%.3f\n", bc->name,
           bc->b, bc->t, full / 1048576.0, ck / 1048576.0, (double)ck / (double)full);
}

enum { PREC_FP32, PREC_FP32_OPENBLAS, PREC_BF16, NPREC };
static const char *prec_names[NPREC] = {"fp32", "fp32_openblas", "bf16"};

/* The profile lines of a child, re-printed as bench=model_profile lines of this point. */
static void print_profile(const struct bench_config *bc, int threads, const char *prec, const char *prof)
{
    char *copy = strdup(prof);
    for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n"))
        printf("bench=model_profile config=%s threads=%d precision=%s %s\n", bc->name, threads, prec, line + 8);
    free(copy);
}

static int run_point(const char *self, const struct bench_config *bc, int threads, int rounds, bool have_torch,
                     const char *python, const char *script)
{
    double tps[NPREC], gf[NPREC], ctps[NPREC], ttps[2] = {NAN, NAN}, tctps[2] = {NAN, NAN};
    char best_line[NPREC][4096];
    for (int p = 0; p < NPREC; p++)
        tps[p] = gf[p] = ctps[p] = NAN, best_line[p][0] = '\0';
    for (int r = 0; r < rounds; r++) {
        for (int p = 0; p < NPREC; p++) {
            char cmd[3 * PATH_MAX], line[4096];
            snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=%d FSDP_CPU_MATMUL=%s '%s' --child %s --precision %s", threads,
                     p == PREC_FP32_OPENBLAS ? "openblas" : "auto", self, bc->name, p == PREC_BF16 ? "bf16" : "fp32");
            double t = run_and_grab(cmd, "tokens_per_s", line, sizeof line, NULL, 0);
            if (isnan(t))
                return 1;
            if (isnan(tps[p]) || t > tps[p]) {
                tps[p] = t;
                snprintf(best_line[p], sizeof best_line[p], "%s", line);
            }
            double c = grab(line, "cpu_tokens_per_s");
            if (isnan(ctps[p]) || c > ctps[p])
                ctps[p] = c;
        }
        for (int b = 0; have_torch && b < 2; b++) {
            double w, c;
            torch_point(python, script, bc, threads, b == 1, &w, &c);
            if (!isnan(w) && (isnan(ttps[b]) || w > ttps[b]))
                ttps[b] = w;
            if (!isnan(c) && (isnan(tctps[b]) || c > tctps[b]))
                tctps[b] = c;
        }
    }
    for (int p = 0; p < NPREC; p++) {
        gf[p] = grab(best_line[p], "gflops");
        double peer = p == PREC_BF16 ? ttps[1] : ttps[0], cpeer = p == PREC_BF16 ? tctps[1] : tctps[0];
        printf("bench=model_step config=%s threads=%d precision=%s tokens_per_s=%.1f cpu_tokens_per_s=%.1f "
               "gflops=%.2f torch_precision=%s torch_tokens_per_s=%.1f torch_cpu_tokens_per_s=%.1f ratio=%.3f "
               "cpu_ratio=%.3f rounds=%d%s\n",
               bc->name, threads, prec_names[p], tps[p], ctps[p], gf[p], p == PREC_BF16 ? "bf16_autocast" : "fp32",
               peer, cpeer, tps[p] / peer, ctps[p] / cpeer, rounds, have_torch ? "" : " note=peer_skipped");
    }
    /* the peaks of the child that ran fp32 on the auto library (its bf16 peak is measured alike) */
    double f32p = grab(best_line[PREC_FP32], "f32_gemm_gflops"), bfp = grab(best_line[PREC_FP32], "bf16_gemm_gflops");
    double sgp = grab(best_line[PREC_FP32], "sgemm_gflops");
    /* the step's GFLOP per CPU-second against the peaks (also per CPU-second): the fraction of the peak */
    double cgf32 = gf[PREC_FP32] * ctps[PREC_FP32] / tps[PREC_FP32];
    double cgf16 = gf[PREC_BF16] * ctps[PREC_BF16] / tps[PREC_BF16];
    printf("bench=model_peak config=%s threads=%d f32_gemm_gflops=%.1f bf16_gemm_gflops=%.1f sgemm_gflops=%.1f "
           "bf16_over_f32=%.3f f32_over_sgemm=%.3f step_frac_f32=%.3f step_frac_bf16=%.3f\n",
           bc->name, threads, f32p, bfp, sgp, bfp / f32p, f32p / sgp, cgf32 / f32p, cgf16 / bfp);
    fflush(stdout);

    /* one profiled child per precision: time per op, and the step against the peak of its dtype */
    double step_ms[NPREC], gemm_ms[NPREC];
    for (int p = 0; p < NPREC; p++) {
        char cmd[3 * PATH_MAX], prof[16384];
        snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=%d FSDP_CPU_MATMUL=%s '%s' --child %s --precision %s --profile",
                 threads, p == PREC_FP32_OPENBLAS ? "openblas" : "auto", self, bc->name,
                 p == PREC_BF16 ? "bf16" : "fp32");
        if (isnan(run_and_grab(cmd, "tokens_per_s", NULL, 0, prof, sizeof prof)))
            return 1;
        print_profile(bc, threads, prec_names[p], prof);
        const char *tot = strstr(prof, "op=total");
        step_ms[p] = tot ? grab(tot, "ms_per_step") : NAN;
        gemm_ms[p] = tot ? grab(tot, "gemm_ms") : NAN;
    }
    /* The ceiling of bf16 over fp32 on this machine: the GEMMs of the fp32 step sped up by the bf16/fp32
     * GEMM peak ratio, everything else as it is (the profiled fp32 step's other ops). */
    double ratio_peak = bfp / f32p;
    double ceiling = step_ms[PREC_FP32] / (step_ms[PREC_FP32] - gemm_ms[PREC_FP32] + gemm_ms[PREC_FP32] / ratio_peak);
    /* verdicts on tokens per CPU-second (what each side computes, whatever else runs on the machine; with
     * one thread on a quiet machine the same as tokens/s), wall-clock ratios beside them */
    double bf16_vs_fp32 = ctps[PREC_BF16] / ctps[PREC_FP32], bf16_vs_torch = ctps[PREC_BF16] / tctps[1];
    double fp32_vs_torch = ctps[PREC_FP32] / tctps[0];
    printf("bench=model_goals config=%s threads=%d bf16_vs_fp32=%.3f goal_bf16_vs_fp32=%s ceiling_bf16_vs_fp32=%.3f "
           "bf16_vs_fp32_openblas=%.3f bf16_vs_torch_bf16=%.3f goal_bf16_vs_torch=%s fp32_vs_torch_fp32=%.3f "
           "goal_fp32_vs_torch=%s fp32_vs_fp32_openblas=%.3f wall_bf16_vs_fp32=%.3f wall_bf16_vs_torch_bf16=%.3f "
           "wall_fp32_vs_torch_fp32=%.3f\n",
           bc->name, threads, bf16_vs_fp32,
           bf16_vs_fp32 >= 1.7 ? "met" : ceiling < 1.7 ? "missed_beyond_ceiling" : "missed", ceiling,
           ctps[PREC_BF16] / ctps[PREC_FP32_OPENBLAS], bf16_vs_torch,
           isnan(bf16_vs_torch) ? "no_peer" : bf16_vs_torch >= 1.5 ? "met" : "missed", fp32_vs_torch,
           isnan(fp32_vs_torch) ? "no_peer" : fp32_vs_torch >= 1.3 ? "met" : "missed",
           ctps[PREC_FP32] / ctps[PREC_FP32_OPENBLAS], tps[PREC_BF16] / tps[PREC_FP32], tps[PREC_BF16] / ttps[1],
           tps[PREC_FP32] / ttps[0]);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--child") == 0) {
        const struct bench_config *bc = config_find(argv[2]);
        if (!bc) {
            fprintf(stderr, "bench_model: unknown config '%s' (S, L or M)\n", argv[2]);
            return 2;
        }
        bool bf16 = false, profile = false;
        for (int i = 3; i < argc; i++) {
            if (strcmp(argv[i], "--precision") == 0 && i + 1 < argc) {
                i++;
                if (strcmp(argv[i], "bf16") != 0 && strcmp(argv[i], "fp32") != 0) {
                    fprintf(stderr, "bench_model: --precision %s: want fp32 or bf16\n", argv[i]);
                    return 2;
                }
                bf16 = strcmp(argv[i], "bf16") == 0;
            } else if (strcmp(argv[i], "--profile") == 0) {
                profile = true;
            } else {
                fprintf(stderr, "bench_model: unknown child argument '%s'\n", argv[i]);
                return 2;
            }
        }
        return run_child(bc, bf16, profile);
    }
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        perror("bench_model: /proc/self/exe");
        return 1;
    }
    self[len] = '\0';
    int rounds = 1, threads[4] = {1}, nthreads = 1, nsel = 0;
    const struct bench_config *sel[NCONFIGS * 2];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
            char *end = NULL;
            long r = strtol(argv[++i], &end, 10);
            if (!end || *end || r < 1 || r > 20) {
                fprintf(stderr, "bench_model: --rounds %s: want a whole number from 1 to 20\n", argv[i]);
                return 2;
            }
            rounds = (int)r;
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            nthreads = 0;
            for (char *tok = strtok(argv[++i], ","); tok && nthreads < 4; tok = strtok(NULL, ",")) {
                threads[nthreads] = atoi(tok);
                if (threads[nthreads] < 1 || threads[nthreads] > 256) {
                    fprintf(stderr, "bench_model: --threads: want a list like 1,2\n");
                    return 2;
                }
                nthreads++;
            }
        } else if (config_find(argv[i]) && nsel < NCONFIGS * 2) {
            sel[nsel++] = config_find(argv[i]);
        } else {
            fprintf(stderr, "usage: bench_model [--rounds N] [--threads 1,2] [S|L|M ...]\n");
            return 2;
        }
    }
    if (!nsel)
        sel[nsel++] = config_find("S"), sel[nsel++] = config_find("L");
    char python[PATH_MAX], script[PATH_MAX + 64];
    bool have_torch = torch_peer(python, sizeof python, script, sizeof script);
    if (!have_torch)
        printf("bench_model: PyTorch 2.x peer not found (%s or %s missing); torch_* fields are nan\n", python, script);
    for (int si = 0; si < nsel; si++) {
        print_arena(sel[si]);
        fflush(stdout);
        for (int ti = 0; ti < nthreads; ti++)
            if (run_point(self, sel[si], threads[ti], rounds, have_torch, python, script))
                return 1;
    }
    return 0;
}
