/* The shared runner of the model benchmarks (bench_runner.h): the family rows' models, the timed step in a
 * child, the per-op profile, and the driver's helpers for children and PyTorch peers. */
#include "tests/bench/model/bench_runner.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "tests/util/tu_proc.h"

static void die(const char *what)
{
    fprintf(stderr, "bench: %s: %s\n", what, error_message());
    exit(1);
}

const struct bench_row *bench_row_find(const struct bench_row *rows, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(rows[i].name, name) == 0)
            return &rows[i];
    return NULL;
}

void bench_row_model(const struct bench_row *row, struct model_config *mc)
{
    model_config_default(mc);
    snprintf(mc->model_family, sizeof mc->model_family, "%s", row->family);
    mc->n_layer = row->n_layer;
    mc->n_embd = row->n_embd;
    mc->n_head = row->n_head;
    mc->n_kv_head = row->n_kv_head;
    mc->head_dim = row->head_dim;
    mc->intermediate_size = row->inter;
    mc->vocab_size = row->vocab;
    mc->block_size = row->t;
    mc->tie_word_embeddings = row->tie;
    mc->sliding_window = row->window;
    if (row->rope_llama3) {
        mc->rope_scaling = MODEL_ROPE_LLAMA3;
        mc->rope_original_max_position = 64; /* llama_torch_step.py --rope_llama3's */
    }
}

double bench_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const struct kernels *bench_device_table(const char *device)
{
    const struct kernels *k = kernels_get(device);
    if (!k) {
        fprintf(stderr, "bench: --device %s: %s\n", device, error_message());
        exit(1);
    }
    return k;
}

double bench_op_now(const struct kernels *k)
{
    if (k->host_visible)
        return bench_cpu_now();
    /* a failed wait shows again in the next op's own status, which the step checks */
    (void)k->synchronize();
    return tu_now();
}

/* ---- the per-op profile: a copy of the table whose entries time the real ones (bench_op_now: on the CPU,
 * CPU time, with one thread the op's own time undisturbed by other processes on the machine; on a device,
 * the wall time between two waits for the device, the op's device time) ---- */
/* The products come first (up to P_MATMUL_DGELU: the profile's gemm_ms); the fused ops only where the table
 * has them (the CUDA table's GELU epilogues, the residual adds fused into the norms). */
enum prof_op { P_MATMUL_F, P_MATMUL_B, P_GEMM_HEAD, P_GEMM_NT, P_GEMM_NN, P_GEMM_TN, P_MATMUL_GELU_F, P_MATMUL_DGELU,
               P_LN_F, P_LN_B, P_RESID_LN_F, P_RMS_F, P_RMS_B, P_RESID_RMS_F, P_ROPE, P_ATT_F, P_ATT_B, P_GELU_F,
               P_GELU_B, P_SWIGLU_F, P_SWIGLU_B, P_RESID, P_EMB_F, P_EMB_B, P_XENT, P_ADAMW, P_SQNORM, P_MEMSET,
               P_MEMCOPY, P_CAST, P_HOLD, P_N };
static const char *const prof_names[P_N] = {
    "matmul_fwd", "matmul_bwd", "gemm_lm_head", "gemm_nt", "gemm_nn", "gemm_tn", "matmul_gelu_fwd", "matmul_dx_dgelu",
    "layernorm_fwd", "layernorm_bwd", "residual_layernorm_fwd", "rmsnorm_fwd", "rmsnorm_bwd", "residual_rmsnorm_fwd",
    "rope", "attention_fwd", "attention_bwd", "gelu_fwd", "gelu_bwd", "swiglu_fwd", "swiglu_bwd", "residual",
    "embedding_fwd", "embedding_bwd", "crossentropy", "adamw", "sqnorm", "mem_set", "mem_copy", "cast",
    "operand_hold"};
static double prof_time[P_N], prof_flops[P_N];
static const struct kernels *real;
static struct kernels profiled;
static int prof_vocab; /* the padded vocabulary: tells the LM head's GEMMs from the others */

#define PROF(op, fl, call)                                                                                   \
    do {                                                                                                     \
        double t0_ = bench_op_now(real);                                                                     \
        int rc_ = (call);                                                                                    \
        prof_time[op] += bench_op_now(real) - t0_;                                                           \
        prof_flops[op] += (fl);                                                                              \
        return rc_;                                                                                          \
    } while (0)

static int p_matmul_f(float *y, const float *x, const float *w, const float *b, int n, int in, int out)
{
    PROF(P_MATMUL_F, 2.0 * n * in * out, real->matmul_forward(y, x, w, b, n, in, out));
}
static int p_matmul_b(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w, int n, int in,
                      int out)
{
    PROF(P_MATMUL_B, 2.0 * n * in * out * ((dx != NULL) + (dw != NULL)),
         real->matmul_backward(dx, dw, db, dy, x, w, n, in, out));
}
/* The LM head's GEMMs have the padded vocabulary as a dimension; the others are named by their transposes,
 * which mean different steps in different weight layouts: with nn.Linear's (out, in) weights (the
 * Llama-style blocks) y = x W^T is nt, dx = dy W nn and dW += dy^T x tn; with GPT-2's Conv1D (in, out)
 * weights, whose forward and weight gradients are matmul_fwd / matmul_bwd, the input gradient dy W^T is nt. */
static int p_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                  float beta, float *c, int ldc)
{
    enum prof_op op = m == prof_vocab || n == prof_vocab || k == prof_vocab ? P_GEMM_HEAD
                      : ta                                                 ? P_GEMM_TN
                      : tb                                                 ? P_GEMM_NT
                                                                           : P_GEMM_NN;
    PROF(op, 2.0 * m * n * k, real->gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
}
static int p_ln_f(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int n, int c,
                  float eps)
{
    PROF(P_LN_F, 0, real->layernorm_forward(out, mean, rstd, inp, w, b, n, c, eps));
}
static int p_ln_b(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                  const float *mean, const float *rstd, int n, int c)
{
    PROF(P_LN_B, 0, real->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, n, c));
}
static int p_resid_ln_f(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                        const float *w, const float *bias, int n, int c, float eps)
{
    PROF(P_RESID_LN_F, 0, real->residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, n, c, eps));
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
static int p_resid_rms_f(float *res, float *out, float *rstd, const float *a, const float *b, const float *w, int n,
                         int c, float eps)
{
    PROF(P_RESID_RMS_F, 0, real->residual_rmsnorm_forward(res, out, rstd, a, b, w, n, c, eps));
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
    PROF(P_ATT_B, 4.0 * b * (double)t * t * c,
         real->attention_backward(dqkv, dout, qkv, out, lse, b, t, c, nh, nkv, w, ws));
}
static int p_gelu_f(float *out, const float *inp, size_t n)
{
    PROF(P_GELU_F, 0, real->gelu_forward(out, inp, n));
}
static int p_gelu_b(float *dinp, const float *inp, const float *dout, size_t n)
{
    PROF(P_GELU_B, 0, real->gelu_backward(dinp, inp, dout, n));
}
static int p_swiglu_f(float *out, const float *gu, int n, int m)
{
    PROF(P_SWIGLU_F, 0, real->swiglu_forward(out, gu, n, m));
}
static int p_swiglu_b(float *dgu, const float *gu, const float *dout, int n, int m)
{
    PROF(P_SWIGLU_B, 0, real->swiglu_backward(dgu, gu, dout, n, m));
}
static int p_matmul_gelu_f(float *pre, float *y, const float *x, const float *w, const float *b, int n, int in,
                           int out)
{
    PROF(P_MATMUL_GELU_F, 2.0 * n * in * out, real->matmul_forward_gelu(pre, y, x, w, b, n, in, out));
}
static int p_matmul_dgelu(float *dpre, const float *dy, const float *w, const float *pre, int n, int in, int out)
{
    PROF(P_MATMUL_DGELU, 2.0 * n * in * out, real->matmul_dx_dgelu(dpre, dy, w, pre, n, in, out));
}
static int p_resid(float *out, const float *a, const float *b, size_t n)
{
    PROF(P_RESID, 0, real->residual_forward(out, a, b, n));
}
static int p_emb_f(float *out, const int32_t *tok, const float *wte, const float *wpe, int b, int t, int c, int v)
{
    PROF(P_EMB_F, 0, real->embedding_forward(out, tok, wte, wpe, b, t, c, v));
}
static int p_emb_b(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int b, int t, int c, int v)
{
    PROF(P_EMB_B, 0, real->embedding_backward(dwte, dwpe, dout, tok, b, t, c, v));
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
static int p_mem_copy(void *dst, const void *src, size_t bytes, enum kernels_copy_kind kind)
{
    PROF(P_MEMCOPY, 0, real->mem_copy(dst, src, bytes, kind));
}
static int p_mem_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                        enum kernels_copy_kind kind)
{
    PROF(P_MEMCOPY, 0, real->mem_copy2d(dst, dpitch, src, spitch, width, rows, kind));
}
static int p_cast(void *dst, enum dtype dd, const void *src, enum dtype sd, size_t n)
{
    PROF(P_CAST, 0, real->cast(dst, dd, src, sd, n));
}
static int p_hold(const float *x, size_t n)
{
    PROF(P_HOLD, 0, real->lowp_hold(x, n));
}

const struct kernels *bench_profile_table(const struct kernels *k)
{
    real = k;
    profiled = *k;
    profiled.matmul_forward = p_matmul_f;
    profiled.matmul_backward = p_matmul_b;
    profiled.gemm = p_gemm;
    profiled.layernorm_forward = p_ln_f;
    profiled.layernorm_backward = p_ln_b;
    profiled.rmsnorm_forward = p_rms_f;
    profiled.rmsnorm_backward = p_rms_b;
    profiled.rope_forward = p_rope_f;
    profiled.rope_backward = p_rope_b;
    profiled.attention_forward = p_att_f;
    profiled.attention_backward = p_att_b;
    profiled.gelu_forward = p_gelu_f;
    profiled.gelu_backward = p_gelu_b;
    profiled.swiglu_forward = p_swiglu_f;
    profiled.swiglu_backward = p_swiglu_b;
    profiled.residual_forward = p_resid;
    profiled.embedding_forward = p_emb_f;
    profiled.embedding_backward = p_emb_b;
    profiled.crossentropy_forward_backward = p_xent;
    profiled.adamw = p_adamw;
    profiled.sqnorm = p_sqnorm;
    profiled.mem_set = p_mem_set;
    profiled.mem_copy = p_mem_copy;
    profiled.mem_copy2d = p_mem_copy2d;
    profiled.cast = p_cast;
    if (k->lowp_hold)
        profiled.lowp_hold = p_hold;
    /* the optional fused ops stay NULL where the table has none, so the model takes the same path */
    if (k->matmul_forward_gelu)
        profiled.matmul_forward_gelu = p_matmul_gelu_f;
    if (k->matmul_dx_dgelu)
        profiled.matmul_dx_dgelu = p_matmul_dgelu;
    if (k->residual_layernorm_forward)
        profiled.residual_layernorm_forward = p_resid_ln_f;
    if (k->residual_rmsnorm_forward)
        profiled.residual_rmsnorm_forward = p_resid_rms_f;
    return &profiled;
}

void bench_profile_print(int timed, double step_ms, double step_cpu_ms, double step_flops, double peak)
{
    /* a device's ops are timed between waits for it: their own device time, and the step's time per wall
     * second (the process's CPU time is the host's, not the device's) */
    bool device = !real->host_visible;
    const char *timing = device ? " timing=device_sync" : "";
    double tot = 0, gemm = 0;
    for (int i = 0; i < P_N; i++)
        tot += prof_time[i];
    for (int i = 0; i < P_N; i++) {
        if (prof_time[i] <= 0)
            continue;
        double gf = prof_flops[i] > 0 ? prof_flops[i] / prof_time[i] / 1e9 : 0.0;
        if (i <= P_MATMUL_DGELU)
            gemm += prof_time[i];
        printf("profile op=%s ms_per_step=%.2f share=%.3f gflops=%.1f frac_of_peak=%.3f%s\n", prof_names[i],
               1e3 * prof_time[i] / timed, prof_time[i] / tot, gf, gf / peak, timing);
    }
    double step_gf = step_flops / ((device ? step_ms : step_cpu_ms) * 1e-3) / 1e9;
    printf("profile op=total ms_per_step=%.2f step_ms=%.2f step_cpu_ms=%.2f gemm_ms=%.2f step_gflops=%.2f "
           "peak_gflops=%.2f frac_of_peak=%.3f%s\n",
           1e3 * tot / timed, step_ms, step_cpu_ms, 1e3 * gemm / timed, step_gf, peak, step_gf / peak, timing);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_step_run(const struct bench_row *row, const struct kernels *k, bool bf16, bool profile,
                    struct bench_step_result *out)
{
    struct model_config mc;
    bench_row_model(row, &mc);
    struct model *m;
    if (model_create(&m, &mc, k, row->b, row->t) != 0)
        die("model_create");
    /* as the engine does: where the table stores activations in the matmul dtype (CUDA), the model keeps them
     * so (on the CPU nothing changes) */
    if (model_set_compute_dtype(m, bf16 && (k->matmul_dtypes & DTYPE_BIT(DTYPE_BF16)) ? DTYPE_BF16 : DTYPE_F32))
        die("model_set_compute_dtype");
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
    /* a device's parameters are made on the host and copied there (the host never touches its memory) */
    float *init = k->host_visible ? params : malloc(n * sizeof(float));
    if (!init)
        die("out of memory");
    if (model_init_params(l, init) != 0)
        die("model_init_params");
    if (init != params) {
        if (k->mem_copy(params, init, n * sizeof(float), KERNELS_COPY_H2D))
            die("copying the parameters to the device");
        free(init);
    }
    k->mem_set(mom1, 0, n * sizeof(float));
    k->mem_set(mom2, 0, n * sizeof(float));
    if (bf16 && k->cast(lp, DTYPE_BF16, params, DTYPE_F32, n))
        die("cast");
    size_t ntok = (size_t)row->b * row->t;
    int32_t *tokens = malloc(ntok * sizeof *tokens), *targets = malloc(ntok * sizeof *targets);
    if (!tokens || !targets)
        die("out of memory");
    uint32_t rng = 1234;
    double times[64], cpu_times[64];
    int timed = 0;
    for (int step = 0; step < row->warmup + row->steps; step++) {
        for (size_t i = 0; i < ntok; i++) {
            rng = rng * 1664525u + 1013904223u;
            tokens[i] = (int32_t)((rng >> 8) % (uint32_t)row->vocab);
        }
        /* targets = tokens shifted left by one within each row, like the peers' torch.roll */
        for (int bi = 0; bi < row->b; bi++)
            for (int ti = 0; ti < row->t; ti++)
                targets[bi * row->t + ti] = tokens[bi * row->t + (ti + 1) % row->t];
        if (step == row->warmup && profile)
            memset(prof_time, 0, sizeof prof_time), memset(prof_flops, 0, sizeof prof_flops);
        double t0 = tu_now(), c0 = bench_cpu_now();
        float loss;
        /* bf16: the gather of a one-rank group (the bf16 copy cast to the fp32 view, the two bound) */
        if (bf16 && (k->cast(full, DTYPE_F32, lp, DTYPE_BF16, n) || k->lowp_bind(full, lp, n)))
            die("gathering");
        if (k->mem_set(grads, 0, n * sizeof(float)) != 0 || model_set_batch(m, tokens, targets) != 0 ||
            model_forward_backward(m, full, grads, &loss) != 0)
            die("training step");
        if (bf16 && k->lowp_unbind(full))
            die("release");
        /* gradient clipping at 1.0 like the peers: one norm over all gradients, folded into AdamW */
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
        /* a device's step ends when its queued work does */
        if (!k->host_visible && k->synchronize())
            die("synchronize");
        double dt = tu_now() - t0, dc = bench_cpu_now() - c0;
        if (!isfinite(loss))
            die("non-finite loss");
        if (step >= row->warmup && timed < 64)
            cpu_times[timed] = dc, times[timed++] = dt;
    }
    if (timed == 0)
        die("no timed steps");
    double best = times[0];
    for (int i = 1; i < timed; i++)
        best = times[i] < best ? times[i] : best;
    /* medians, as the peers report */
    qsort(times, (size_t)timed, sizeof times[0], cmp_double);
    qsort(cpu_times, (size_t)timed, sizeof cpu_times[0], cmp_double);
    double med = times[timed / 2], cpu_med = cpu_times[timed / 2];
    memset(out, 0, sizeof *out);
    out->tokens_per_s = (double)ntok / med;
    out->best_tokens_per_s = (double)ntok / best;
    out->cpu_tokens_per_s = (double)ntok / cpu_med;
    out->step_ms = 1e3 * med;
    out->step_cpu_ms = 1e3 * cpu_med;
    out->model_flops_per_token = model_flops_per_token(l);
    out->params = l->numel_real;
    for (int p = 0; p < l->n_params; p++)
        *(l->params[p].lookup_only ? &out->lookup_params : &out->matmul_params) +=
            (double)l->params[p].init_rows * l->params[p].shape[1];
    out->timed = timed;
    free(tokens), free(targets);
    k->mem_free(params), k->mem_free(grads), k->mem_free(mom1), k->mem_free(mom2);
    if (bf16)
        k->mem_free(lp), k->mem_free(full);
    model_destroy(m);
}

double bench_run_and_grab(const char *cmd, const char *key, char *line_out, size_t line_cap, char *prof,
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

double bench_grab(const char *line, const char *key)
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

void bench_torch_point(const char *base_cmd, int warmup, int steps, double tokens_per_step, double *wall_tps,
                       double *cpu_tps)
{
    char cmd[8 * PATH_MAX], out[] = "/tmp/bench-model-torch-XXXXXX";
    *wall_tps = *cpu_tps = NAN;
    int fd = mkstemp(out);
    if (fd < 0)
        return;
    close(fd);
    snprintf(cmd, sizeof cmd, "%s --steps %d", base_cmd, warmup + steps);
    double full = cpu_of(cmd, out);
    char line[4096] = "";
    FILE *f = fopen(out, "r");
    while (f && fgets(line, sizeof line, f)) {
        fputs(line, stderr);
        double v = bench_grab(line, "tokens_per_s");
        if (!isnan(v))
            *wall_tps = v;
    }
    if (f)
        fclose(f);
    if (isnan(full))
        *wall_tps = NAN;
    snprintf(cmd, sizeof cmd, "%s --steps %d", base_cmd, warmup);
    double warm = cpu_of(cmd, "/dev/null");
    unlink(out);
    if (full > warm)
        *cpu_tps = (double)steps * tokens_per_step / (full - warm);
}

bool bench_self(char *out, size_t cap)
{
    ssize_t len = readlink("/proc/self/exe", out, cap - 1);
    if (len <= 0) {
        perror("bench: /proc/self/exe");
        return false;
    }
    out[len] = '\0';
    return true;
}

int bench_driver_args(int argc, char **argv, const char *prog, const struct bench_row *rows, int n, int *rounds,
                      int threads[4], int *nthreads, const struct bench_row **sel, int sel_cap, int *nsel,
                      const char **bad_arg)
{
    *nsel = 0;
    *bad_arg = NULL;
    for (int i = 1; i < argc; i++) {
        const struct bench_row *row;
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
            char *end = NULL;
            long r = strtol(argv[++i], &end, 10);
            if (!end || *end || r < 1 || r > 20) {
                fprintf(stderr, "%s: --rounds %s: want a whole number from 1 to 20\n", prog, argv[i]);
                return 2;
            }
            *rounds = (int)r;
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            *nthreads = 0;
            for (char *tok = strtok(argv[++i], ","); tok && *nthreads < 4; tok = strtok(NULL, ",")) {
                threads[*nthreads] = atoi(tok);
                if (threads[*nthreads] < 1 || threads[*nthreads] > 256) {
                    fprintf(stderr, "%s: --threads: want a list like 1,2\n", prog);
                    return 2;
                }
                (*nthreads)++;
            }
        } else if ((row = bench_row_find(rows, n, argv[i])) && *nsel < sel_cap) {
            sel[(*nsel)++] = row;
        } else {
            *bad_arg = argv[i];
            return 2;
        }
    }
    return 0;
}
