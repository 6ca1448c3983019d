/* Model benchmark: the single-process training step (what a world-1 step does: zero grads,
 * model_forward_backward, global grad norm, AdamW over every parameter through the kernels table) for
 * GPT configs S and M with OMP_NUM_THREADS=1 and 2, beside PyTorch running the same model and step
 * (../shared/anchors/torch/gpt_fsdp.py --mode single) and OpenBLAS sgemm at a GPT-2 layer shape, all in
 * the same run, so the ratios hold even on a noisy shared machine.
 *
 * OpenMP and OpenBLAS read OMP_NUM_THREADS once at start, so each (config, threads) point runs in a
 * child: this binary re-executed as `bench_model --child CONFIG [--profile]` with the variable set.
 *
 * Usage: bench_model [--rounds N] [S|M ...]   (default: 1 round, S M)
 *        bench_model --child S|M [--profile]   one point in this process (--profile: time per op)
 * With N rounds each point runs ours and PyTorch alternately N times and keeps each side's best round, so
 * a slow spell of the shared machine hits both sides alike rather than whichever ran during it.
 * Output: `bench=model_step config=S threads=1 tokens_per_s=... gflops=... torch_tokens_per_s=...
 *          ratio=... sgemm_gflops=... frac_of_sgemm=...` and `bench=model_arena ...` per config. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "kernels/kernels.h"
#include "tests/util/tu_proc.h"
#include "worker/model/model.h"

struct bench_config {
    const char *name;
    int n_layer, n_embd, n_head, vocab, t, b;
    int warmup, steps; /* ours and torch's: M takes seconds per step on one core */
};

static const struct bench_config configs[] = {
    {"S", 4, 256, 4, 4096, 256, 8, 2, 10},
    {"M", 12, 768, 12, 50304, 256, 4, 1, 3},
};

static void die(const char *what)
{
    fprintf(stderr, "bench_model: %s: %s\n", what, error_message());
    exit(1);
}

static const struct bench_config *config_find(const char *name)
{
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
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

/* ---- per-op profile: a copy of the CPU table whose entries time the real ones ---- */
enum prof_op { P_MATMUL_F, P_MATMUL_B, P_GEMM, P_GEMM_DX, P_LN_F, P_LN_B, P_ATT_F, P_ATT_B, P_GELU_F, P_GELU_B, P_RESID,
               P_EMB_F, P_EMB_B, P_XENT, P_ADAMW, P_SQNORM, P_MEMSET, P_N };
static const char *prof_names[P_N] = {"matmul_fwd", "matmul_bwd", "gemm_lm_head", "gemm_linear_dx", "layernorm_fwd",
                                      "layernorm_bwd", "attention_fwd", "attention_bwd", "gelu_fwd",
                                      "gelu_bwd", "residual", "embedding_fwd", "embedding_bwd",
                                      "crossentropy", "adamw", "sqnorm", "mem_set"};
static double prof_time[P_N];
static double prof_flops[P_N];
static const struct kernels *real;
static int prof_vocab; /* the model's padded vocabulary: tells the LM head's GEMMs from the others */

#define PROF(op, fl, call)                                                                                   \
    do {                                                                                                     \
        double t0_ = tu_now();                                                                                \
        int rc_ = (call);                                                                                    \
        prof_time[op] += tu_now() - t0_;                                                                      \
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
                               void *ws)
{
    PROF(P_ATT_F, 2.0 * b * (double)t * t * c, real->attention_forward(out, lse, qkv, b, t, c, nh, nkv, ws));
}
static int p_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                                const float *lse, int b, int t, int c, int nh, int nkv, void *ws)
{
    PROF(P_ATT_B, 4.0 * b * (double)t * t * c,
         real->attention_backward(dqkv, dout, qkv, out, lse, b, t, c, nh, nkv, ws));
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
static int p_crossentropy(float *losses, double *loss_sum, float *dlogits, const float *logits,
                          const int32_t *targets, int n, int v, int vp, float dloss)
{
    PROF(P_XENT, 0, real->crossentropy_forward_backward(losses, loss_sum, dlogits, logits, targets, n, v, vp, dloss));
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
    return &profiled;
}

/* ---- one (config, threads) point, in this process ---- */

/* OpenBLAS sgemm at GPT-2 small's MLP up-projection (1024 tokens x 768 -> 3072), the largest matmul
 * shape of a block and a fair "what BLAS can do here" figure for both configs. */
static double sgemm_gflops(void)
{
    const int m = 1024, k = 768, n = 3072;
    float *a = malloc((size_t)m * k * sizeof *a), *b = malloc((size_t)k * n * sizeof *b);
    float *c = malloc((size_t)m * n * sizeof *c);
    if (!a || !b || !c) {
        fprintf(stderr, "bench_model: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < (size_t)m * k; i++)
        a[i] = (float)(i % 17) * 0.01f;
    for (size_t i = 0; i < (size_t)k * n; i++)
        b[i] = (float)(i % 13) * 0.01f;
    double best = 1e30;
    for (int r = 0; r < 6; r++) {
        double t0 = tu_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
        double dt = tu_now() - t0;
        if (r > 0 && dt < best)
            best = dt;
    }
    free(a), free(b), free(c);
    return 2.0 * m * n * k / best / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int run_child(const struct bench_config *bc, bool profile)
{
    const struct kernels *k = kernels_cpu();
    if (profile)
        k = profile_table(k);
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
    if (!params || !grads || !mom1 || !mom2)
        die("allocating parameters and optimizer state");
    if (model_init_params(l, params) != 0)
        die("model_init_params");
    k->mem_set(mom1, 0, n * sizeof(float));
    k->mem_set(mom2, 0, n * sizeof(float));
    size_t ntok = (size_t)bc->b * bc->t;
    int32_t *tokens = malloc(ntok * sizeof *tokens), *targets = malloc(ntok * sizeof *targets);
    if (!tokens || !targets)
        die("out of memory");
    uint32_t rng = 1234;
    double best = 1e30, times[64];
    int timed = 0;
    for (int step = 0; step < bc->warmup + bc->steps; step++) {
        for (size_t i = 0; i < ntok; i++) {
            rng = rng * 1664525u + 1013904223u;
            tokens[i] = (int32_t)((rng >> 8) % (uint32_t)bc->vocab);
        }
        /* targets = tokens shifted left by one within each row, like the peer's torch.roll */
        for (int bi = 0; bi < bc->b; bi++)
            for (int ti = 0; ti < bc->t; ti++)
                targets[bi * bc->t + ti] = tokens[bi * bc->t + (ti + 1) % bc->t];
        if (step == bc->warmup && profile)
            memset(prof_time, 0, sizeof prof_time), memset(prof_flops, 0, sizeof prof_flops);
        double t0 = tu_now();
        float loss;
        if (k->mem_set(grads, 0, n * sizeof(float)) != 0 || model_set_batch(m, tokens, targets) != 0 ||
            model_forward_backward(m, params, grads, &loss) != 0)
            die("training step");
        /* gradient clipping at 1.0 like the peer: one norm over all gradients, folded into AdamW */
        double sq = 0;
        if (k->sqnorm(&sq, grads, n) != 0)
            die("sqnorm");
        double norm = sqrt(sq);
        struct kernels_adamw_params hp = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                          .grad_scale = norm > 1.0 ? (float)(1.0 / (norm + 1e-6)) : 1.0f,
                                          .step = step + 1};
        for (int p = 0; p < l->n_params; p++) {
            const struct model_param *mp = &l->params[p];
            hp.weight_decay = mp->weight_decay ? 0.1f : 0.0f;
            if (k->adamw(params + mp->offset, grads + mp->offset, mom1 + mp->offset, mom2 + mp->offset, mp->numel,
                         &hp) != 0)
                die("adamw");
        }
        double dt = tu_now() - t0;
        if (!isfinite(loss))
            die("non-finite loss");
        if (step >= bc->warmup) {
            best = dt < best ? dt : best;
            if (timed < 64)
                times[timed++] = dt;
        }
    }
    /* median of the timed steps, as the peer reports; best is printed too */
    qsort(times, (size_t)timed, sizeof times[0], cmp_double);
    double med = times[timed / 2];
    double fl = step_flops(bc, l);
    printf("child tokens_per_s=%.1f best_tokens_per_s=%.1f gflops=%.2f sgemm_gflops=%.2f params=%zu\n",
           (double)ntok / med, (double)ntok / best, fl / med / 1e9, sgemm_gflops(), l->numel_real);
    if (profile) {
        double tot = 0;
        for (int i = 0; i < P_N; i++)
            tot += prof_time[i];
        for (int i = 0; i < P_N; i++)
            if (prof_time[i] > 0)
                printf("profile op=%s ms_per_step=%.2f share=%.3f gflops=%.1f\n", prof_names[i],
                       1e3 * prof_time[i] / timed, prof_time[i] / tot,
                       prof_flops[i] > 0 ? prof_flops[i] / prof_time[i] / 1e9 : 0.0);
        printf("profile op=total ms_per_step=%.2f step_ms=%.2f\n", 1e3 * tot / timed, 1e3 * med);
    }
    free(tokens), free(targets);
    k->mem_free(params), k->mem_free(grads), k->mem_free(mom1), k->mem_free(mom2);
    model_destroy(m);
    return 0;
}

/* ---- the driver: children per point, torch beside them ---- */

/* Runs cmd through the shell and returns the value of `key=` in its output (the last occurrence), or
 * NAN; the output is echoed to stderr for the log. */
static double run_and_grab(const char *cmd, const char *key, char *line_out, size_t line_cap)
{
    FILE *f = popen(cmd, "r");
    if (!f)
        return NAN;
    char line[4096];
    double val = NAN;
    size_t klen = strlen(key);
    while (fgets(line, sizeof line, f)) {
        fputs(line, stderr);
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

/* The peer script, found next to the project checkout (FSDP_SOURCE_ROOT/../shared/anchors/...). */
static bool torch_script(char *out, size_t cap)
{
    const char *src = getenv("FSDP_SOURCE_ROOT");
    const char *cands[2] = {src, "."};
    for (int i = 0; i < 2; i++) {
        if (!cands[i])
            continue;
        snprintf(out, cap, "%s/../shared/anchors/torch/gpt_fsdp.py", cands[i]);
        if (access(out, R_OK) == 0 && access("/usr/bin/python3", X_OK) == 0)
            return true;
    }
    return false;
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

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--child") == 0) {
        const struct bench_config *bc = config_find(argv[2]);
        if (!bc) {
            fprintf(stderr, "bench_model: unknown config '%s' (S or M)\n", argv[2]);
            return 2;
        }
        return run_child(bc, argc >= 4 && strcmp(argv[3], "--profile") == 0);
    }
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        perror("bench_model: /proc/self/exe");
        return 1;
    }
    self[len] = '\0';
    char script[PATH_MAX + 64];
    bool have_torch = torch_script(script, sizeof script);
    if (!have_torch)
        printf("bench_model: PyTorch peer not found (FSDP_SOURCE_ROOT/../shared/anchors/torch/gpt_fsdp.py "
               "or /usr/bin/python3 missing); torch_* fields are nan\n");
    int first = 1, rounds = 1;
    if (argc > 2 && strcmp(argv[1], "--rounds") == 0) {
        char *end = NULL;
        long r = strtol(argv[2], &end, 10);
        if (!end || *end || r < 1 || r > 20) {
            fprintf(stderr, "bench_model: --rounds %s: want a whole number from 1 to 20\n", argv[2]);
            return 2;
        }
        rounds = (int)r;
        first = 3;
    }
    int nsel = argc > first ? argc - first : 2;
    for (int si = 0; si < nsel; si++) {
        const struct bench_config *bc = argc > first ? config_find(argv[first + si]) : &configs[si];
        if (!bc) {
            fprintf(stderr, "bench_model: unknown config '%s' (S or M)\n", argv[first + si]);
            return 2;
        }
        print_arena(bc);
        fflush(stdout);
        for (int threads = 1; threads <= 2; threads++) {
            char cmd[3 * PATH_MAX], line[4096] = "", best_line[4096] = "";
            double tps = NAN, ttps = NAN;
            for (int r = 0; r < rounds; r++) {
                snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=%d '%s' --child %s", threads, self, bc->name);
                double t = run_and_grab(cmd, "tokens_per_s", line, sizeof line);
                if (isnan(t))
                    return 1;
                if (isnan(tps) || t > tps) {
                    tps = t;
                    snprintf(best_line, sizeof best_line, "%s", line);
                }
                if (have_torch) {
                    snprintf(cmd, sizeof cmd,
                             "OMP_NUM_THREADS=%d /usr/bin/python3 '%s' --mode single --layers %d --dim %d --heads "
                             "%d --vocab %d --seq %d --batch %d --warmup %d --steps %d",
                             threads, script, bc->n_layer, bc->n_embd, bc->n_head, bc->vocab, bc->t, bc->b,
                             bc->warmup, bc->steps);
                    double tt = run_and_grab(cmd, "tokens_per_s", NULL, 0);
                    if (!isnan(tt) && (isnan(ttps) || tt > ttps))
                        ttps = tt;
                }
            }
            /* GFLOP/s and the sgemm reference of the round that counted: frac_of_sgemm stays one run's */
            double gf = grab(best_line, "gflops"), sg = grab(best_line, "sgemm_gflops");
            printf("bench=model_step config=%s threads=%d tokens_per_s=%.1f gflops=%.2f torch_tokens_per_s=%.1f "
                   "ratio=%.3f sgemm_gflops=%.2f frac_of_sgemm=%.3f rounds=%d\n",
                   bc->name, threads, tps, gf, ttps, tps / ttps, sg, gf / sg, rounds);
            fflush(stdout);
        }
    }
    return 0;
}
