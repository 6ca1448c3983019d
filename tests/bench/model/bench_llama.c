/* Llama benchmark: the single-process training step of a Llama (what a world-1 step does: zero grads,
 * model_forward_backward, the global gradient norm, AdamW over every parameter through the kernels table)
 * with OMP_NUM_THREADS=1 and 2, in fp32 and in bf16, beside PyTorch 2.x running transformers'
 * LlamaForCausalLM on the same shapes and step (llama_torch_step.py in the venv FSDP_TORCH_VENV names: fp32,
 * and bf16 autocast for our bf16), in the same run, so the ratio holds on a noisy shared machine.
 *
 * bf16 is mixed_precision = bf16 as a world-1 rank runs it: fp32 master weights, gradients and AdamW; a
 * persistent bf16 copy of the parameters, cast to the fp32 view the model reads and bound to it (the
 * engine's gather: the matmuls read the bf16 copy as is), refreshed after each optimizer step; bf16
 * matmuls (set_matmul_dtype) with fp32 accumulation. PyTorch's autocast likewise keeps fp32 parameters and
 * runs the matmuls in bf16; both compute the loss in fp32.
 *
 * OpenMP and OpenBLAS read OMP_NUM_THREADS once at start, so each (config, threads) point runs in a child:
 * this binary re-executed as `bench_llama --child CONFIG` with the variable set.
 *
 * Usage: bench_llama [--rounds N] [S|M|L ...]   (default: 1 round, S)
 *        bench_llama --child S|M|L [--bf16] [--profile]   one point in this process (--profile: time per op)
 * With N rounds each point runs ours and PyTorch alternately N times and keeps each side's best round.
 * Output: `bench=llama_step config=S threads=1 precision=fp32|bf16 tokens_per_s=... gflops=...
 *          torch_precision=fp32|bf16_autocast torch_tokens_per_s=... ratio=... rounds=N` per point,
 *          `bench=llama_goals config=S threads=T fp32_vs_torch=... goal_fp32=met|missed bf16_vs_torch_bf16=...
 *          goal_bf16=met|missed bf16_vs_fp32=... torch_bf16_vs_fp32=...` per thread count (goal: 1.3x PyTorch at
 *          equal precision) and `bench=llama_arena ...` per config. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "kernels/kernels.h"
#include "tests/util/tu_proc.h"
#include "tests/util/tu_venv.h"
#include "worker/model/model.h"

struct bench_config {
    const char *name;
    int n_layer, n_embd, n_head, n_kv_head, inter, vocab, t, b;
    int warmup, steps;
};

/* S: bench_model's S shape as a Llama (head size 64, 2 query heads per key/value head, SwiGLU width
 * 8 C / 3 rounded to 256, untied head). M: a ~110M-parameter Llama (12 layers of 768, 32000 tokens). L:
 * bench_train's 58M-parameter Llama with one rank's batch (8 layers of 512, 8/4 heads, width 1536). */
static const struct bench_config configs[] = {
    {"S", 4, 256, 4, 2, 768, 4096, 256, 8, 2, 10},
    {"M", 12, 768, 12, 4, 2048, 32000, 256, 4, 1, 3},
    {"L", 8, 512, 8, 4, 1536, 32000, 256, 4, 1, 4},
};

static void die(const char *what)
{
    fprintf(stderr, "bench_llama: %s: %s\n", what, error_message());
    exit(1);
}

static const struct bench_config *config_find(const char *name)
{
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
        if (strcmp(configs[i].name, name) == 0)
            return &configs[i];
    return NULL;
}

static void config_to_model(const struct bench_config *bc, struct model_config *mc)
{
    model_config_default(mc);
    snprintf(mc->model_family, sizeof mc->model_family, "llama");
    mc->n_layer = bc->n_layer;
    mc->n_embd = bc->n_embd;
    mc->n_head = bc->n_head;
    mc->n_kv_head = bc->n_kv_head;
    mc->intermediate_size = bc->inter;
    mc->vocab_size = bc->vocab;
    mc->block_size = bc->t;
}

/* ---- per-op profile: a copy of the CPU table whose entries time the real ones ---- */
enum prof_op { P_GEMM_FWD, P_GEMM_DX, P_GEMM_DW, P_GEMM_HEAD, P_RMS_F, P_RMS_B, P_ROPE, P_ATT_F, P_ATT_B, P_SWIGLU_F,
               P_SWIGLU_B, P_RESID, P_EMB, P_XENT, P_ADAMW, P_SQNORM, P_MEMSET, P_N };
static const char *prof_names[P_N] = {"gemm_fwd", "gemm_dx", "gemm_dw", "gemm_lm_head", "rmsnorm_fwd", "rmsnorm_bwd",
                                      "rope", "attention_fwd", "attention_bwd", "swiglu_fwd", "swiglu_bwd",
                                      "residual", "embedding", "crossentropy", "adamw", "sqnorm", "mem_set"};
static double prof_time[P_N], prof_flops[P_N];
static const struct kernels *real;
static int prof_vocab; /* the padded vocabulary: tells the LM head's GEMMs from the others */

#define PROF(op, fl, call)                                                                                   \
    do {                                                                                                     \
        double t0_ = tu_now();                                                                               \
        int rc_ = (call);                                                                                    \
        prof_time[op] += tu_now() - t0_;                                                                     \
        prof_flops[op] += (fl);                                                                              \
        return rc_;                                                                                          \
    } while (0)

/* The model's GEMMs: y = x W^T (0, 1), dx = dy W (0, 0), dW += dy^T x (1, 0); the LM head's have the
 * padded vocabulary as a dimension. */
static int p_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                  float beta, float *c, int ldc)
{
    enum prof_op op = m == prof_vocab || n == prof_vocab || k == prof_vocab ? P_GEMM_HEAD
                      : ta                                                 ? P_GEMM_DW
                      : tb                                                 ? P_GEMM_FWD
                                                                           : P_GEMM_DX;
    PROF(op, 2.0 * m * n * k, real->gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
}
static int p_rms_f(float *out, float *rstd, const float *inp, const float *w, int n, int c, float eps)
{
    PROF(P_RMS_F, 0, real->rmsnorm_forward(out, rstd, inp, w, n, c, eps));
}
static int p_rms_b(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                   int n, int c)
{
    PROF(P_RMS_B, 0, real->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, n, c));
}
static int p_rope_f(float *x, int n, int ld, int nh, int hs, const int32_t *pos, const float *f, int np)
{
    PROF(P_ROPE, 0, real->rope_forward(x, n, ld, nh, hs, pos, f, np));
}
static int p_rope_b(float *x, int n, int ld, int nh, int hs, const int32_t *pos, const float *f, int np)
{
    PROF(P_ROPE, 0, real->rope_backward(x, n, ld, nh, hs, pos, f, np));
}
static int p_att_f(float *out, float *lse, const float *qkv, int b, int t, int c, int nh, int nkv, int w, void *ws)
{
    PROF(P_ATT_F, 2.0 * b * (double)t * t * c, real->attention_forward(out, lse, qkv, b, t, c, nh, nkv, w, ws));
}
static int p_att_b(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse, int b, int t,
                   int c, int nh, int nkv, int w, void *ws)
{
    PROF(P_ATT_B, 4.0 * b * (double)t * t * c, real->attention_backward(dqkv, dout, qkv, out, lse, b, t, c, nh, nkv, w, ws));
}
static int p_swiglu_f(float *out, const float *gu, int n, int m)
{
    PROF(P_SWIGLU_F, 0, real->swiglu_forward(out, gu, n, m));
}
static int p_swiglu_b(float *dgu, const float *gu, const float *dout, int n, int m)
{
    PROF(P_SWIGLU_B, 0, real->swiglu_backward(dgu, gu, dout, n, m));
}
static int p_resid(float *out, const float *a, const float *b, size_t n)
{
    PROF(P_RESID, 0, real->residual_forward(out, a, b, n));
}
static int p_emb_f(float *out, const int32_t *tok, const float *wte, const float *wpe, int b, int t, int c, int v)
{
    PROF(P_EMB, 0, real->embedding_forward(out, tok, wte, wpe, b, t, c, v));
}
static int p_emb_b(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int b, int t, int c, int v)
{
    PROF(P_EMB, 0, real->embedding_backward(dwte, dwpe, dout, tok, b, t, c, v));
}
static int p_xent(float *losses, double *sum, float *dlogits, const float *logits, const int32_t *tg, int n, int v,
                  int vp, float dloss)
{
    PROF(P_XENT, 0, real->crossentropy_forward_backward(losses, sum, dlogits, logits, tg, n, v, vp, dloss));
}
static int p_adamw(float *p, const float *g, float *m, float *v, size_t n, const struct kernels_adamw_params *hp)
{
    PROF(P_ADAMW, 0, real->adamw(p, g, m, v, n, hp));
}
static int p_sqnorm(double *r, const float *x, size_t n)
{
    PROF(P_SQNORM, 0, real->sqnorm(r, x, n));
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
    profiled.gemm = p_gemm;
    profiled.rmsnorm_forward = p_rms_f;
    profiled.rmsnorm_backward = p_rms_b;
    profiled.rope_forward = p_rope_f;
    profiled.rope_backward = p_rope_b;
    profiled.attention_forward = p_att_f;
    profiled.attention_backward = p_att_b;
    profiled.swiglu_forward = p_swiglu_f;
    profiled.swiglu_backward = p_swiglu_b;
    profiled.residual_forward = p_resid;
    profiled.embedding_forward = p_emb_f;
    profiled.embedding_backward = p_emb_b;
    profiled.crossentropy_forward_backward = p_xent;
    profiled.adamw = p_adamw;
    profiled.sqnorm = p_sqnorm;
    profiled.mem_set = p_mem_set;
    return &profiled;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int run_child(const struct bench_config *bc, bool bf16, bool profile)
{
    const struct kernels *base = kernels_cpu();
    if (bf16 && !(base->matmul_dtypes & KERNELS_DTYPE_BIT(DTYPE_BF16)))
        fprintf(stderr, "bench_llama: this CPU has no bf16 matmul instructions: bf16 computes in fp32\n");
    if (base->set_matmul_dtype(bf16 ? DTYPE_BF16 : DTYPE_F32))
        die("set_matmul_dtype");
    const struct kernels *k = profile ? profile_table(base) : base;
    struct model_config mc;
    config_to_model(bc, &mc);
    struct model *m;
    if (model_create(&m, &mc, k, bc->b, bc->t) != 0)
        die("model_create");
    const struct model_layout *l = model_get_layout(m);
    prof_vocab = l->vocab_padded;
    size_t n = l->numel;
    float *params = k->mem_alloc(n * sizeof(float)), *grads = k->mem_alloc(n * sizeof(float));
    float *mom1 = k->mem_alloc(n * sizeof(float)), *mom2 = k->mem_alloc(n * sizeof(float));
    /* bf16: the persistent bf16 copy (the engine's low-precision shard) and the fp32 view gathered from it */
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
    double times[64];
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
        /* bf16: the gather of a one-rank group (the bf16 copy cast to the fp32 view, the two bound) */
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
        double dt = tu_now() - t0;
        if (!isfinite(loss))
            die("non-finite loss");
        if (step >= bc->warmup && timed < 64)
            times[timed++] = dt;
    }
    qsort(times, (size_t)timed, sizeof times[0], cmp_double);
    double med = times[timed / 2];
    /* model FLOPs of the step (model_flops_per_token: the PaLM count); the same count divides PyTorch's */
    double fl = model_flops_per_token(l) * (double)ntok;
    printf("child tokens_per_s=%.1f best_tokens_per_s=%.1f gflops=%.2f params=%zu\n", (double)ntok / med,
           (double)ntok / times[0], fl / med / 1e9, l->numel_real);
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
    if (bf16)
        k->mem_free(lp), k->mem_free(full);
    model_destroy(m);
    return 0;
}

/* Runs cmd through the shell and returns the value of `key=` in its output (the last occurrence), or NAN;
 * the output is echoed to stderr for the log. */
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

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--child") == 0) {
        const struct bench_config *bc = config_find(argv[2]);
        if (!bc) {
            fprintf(stderr, "bench_llama: unknown config '%s' (S, M or L)\n", argv[2]);
            return 2;
        }
        bool bf16 = false, profile = false;
        for (int i = 3; i < argc; i++) {
            if (strcmp(argv[i], "--bf16") == 0)
                bf16 = true;
            else if (strcmp(argv[i], "--profile") == 0)
                profile = true;
            else {
                fprintf(stderr, "bench_llama: unknown child flag '%s' (--bf16, --profile)\n", argv[i]);
                return 2;
            }
        }
        return run_child(bc, bf16, profile);
    }
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        perror("bench_llama: /proc/self/exe");
        return 1;
    }
    self[len] = '\0';
    char py[1200], script[PATH_MAX];
    const char *src = getenv("FSDP_SOURCE_ROOT");
    snprintf(script, sizeof script, "%s/tests/bench/model/llama_torch_step.py", src ? src : ".");
    bool have_torch = tu_torch_python(py, sizeof py) == 0;
    if (!have_torch)
        printf("bench_llama: no PyTorch peer (%s); torch_* fields are nan\n", py);
    int first = 1, rounds = 1;
    if (argc > 2 && strcmp(argv[1], "--rounds") == 0) {
        char *end = NULL;
        long r = strtol(argv[2], &end, 10);
        if (!end || *end || r < 1 || r > 20) {
            fprintf(stderr, "bench_llama: --rounds %s: want a whole number from 1 to 20\n", argv[2]);
            return 2;
        }
        rounds = (int)r;
        first = 3;
    }
    int nsel = argc > first ? argc - first : 1;
    for (int si = 0; si < nsel; si++) {
        const struct bench_config *bc = argc > first ? config_find(argv[first + si]) : &configs[si];
        if (!bc) {
            fprintf(stderr, "bench_llama: unknown config '%s' (S, M or L)\n", argv[first + si]);
            return 2;
        }
        struct model_config mc;
        config_to_model(bc, &mc);
        size_t full = model_arena_bytes(&mc, bc->b, bc->t, false, kernels_cpu());
        mc.activation_checkpointing = true;
        size_t ck = model_arena_bytes(&mc, bc->b, bc->t, true, kernels_cpu());
        printf("bench=llama_arena config=%s batch=%dx%d arena_mib=%.1f arena_ckpt_mib=%.1f ratio=%.3f\n", bc->name,
               bc->b, bc->t, full / 1048576.0, ck / 1048576.0, (double)ck / (double)full);
        fflush(stdout);
        for (int threads = 1; threads <= 2; threads++) {
            double tps[2], ttps[2];
            for (int bf16 = 0; bf16 <= 1; bf16++) {
                char cmd[3 * PATH_MAX], line[4096] = "", best_line[4096] = "";
                tps[bf16] = NAN, ttps[bf16] = NAN;
                for (int r = 0; r < rounds; r++) {
                    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=%d '%s' --child %s%s", threads, self, bc->name,
                             bf16 ? " --bf16" : "");
                    double t = run_and_grab(cmd, "tokens_per_s", line, sizeof line);
                    if (isnan(t))
                        return 1;
                    if (isnan(tps[bf16]) || t > tps[bf16]) {
                        tps[bf16] = t;
                        snprintf(best_line, sizeof best_line, "%s", line);
                    }
                    if (have_torch) {
                        snprintf(cmd, sizeof cmd,
                                 "OMP_NUM_THREADS=%d '%s' '%s' --n_layer %d --n_head %d --n_kv_head %d --n_embd %d "
                                 "--intermediate_size %d --vocab %d --seq %d --batch %d --warmup %d --steps %d%s",
                                 threads, py, script, bc->n_layer, bc->n_head, bc->n_kv_head, bc->n_embd, bc->inter,
                                 bc->vocab, bc->t, bc->b, bc->warmup, bc->steps, bf16 ? " --bf16" : "");
                        double tt = run_and_grab(cmd, "tokens_per_s", NULL, 0);
                        if (!isnan(tt) && (isnan(ttps[bf16]) || tt > ttps[bf16]))
                            ttps[bf16] = tt;
                    }
                }
                printf("bench=llama_step config=%s threads=%d precision=%s tokens_per_s=%.1f gflops=%.2f "
                       "torch_precision=%s torch_tokens_per_s=%.1f ratio=%.3f rounds=%d\n",
                       bc->name, threads, bf16 ? "bf16" : "fp32", tps[bf16], grab(best_line, "gflops"),
                       bf16 ? "bf16_autocast" : "fp32", ttps[bf16], tps[bf16] / ttps[bf16], rounds);
                fflush(stdout);
            }
            double g32 = tps[0] / ttps[0], g16 = tps[1] / ttps[1];
            printf("bench=llama_goals config=%s threads=%d fp32_vs_torch=%.3f goal_fp32=%s bf16_vs_torch_bf16=%.3f "
                   "goal_bf16=%s bf16_vs_fp32=%.3f torch_bf16_vs_fp32=%.3f\n",
                   bc->name, threads, g32, g32 >= 1.3 ? "met" : isnan(g32) ? "unmeasured" : "missed", g16,
                   g16 >= 1.3 ? "met" : isnan(g16) ? "unmeasured" : "missed", tps[1] / tps[0], ttps[1] / ttps[0]);
            fflush(stdout);
        }
    }
    return 0;
}
