/* Llama benchmark: the single-process training step of a Llama (what a world-1 step does: zero grads,
 * model_forward_backward, the global gradient norm, AdamW over every parameter through the kernels table)
 * with OMP_NUM_THREADS=1 and 2, beside PyTorch 2.x running transformers' LlamaForCausalLM on the same shapes
 * and step in fp32 (llama_torch_step.py in the venv FSDP_TORCH_VENV names), in the same run, so the ratio
 * holds on a noisy shared machine.
 *
 * OpenMP and OpenBLAS read OMP_NUM_THREADS once at start, so each (config, threads) point runs in a child:
 * this binary re-executed as `bench_llama --child CONFIG` with the variable set.
 *
 * Usage: bench_llama [--rounds N] [S|M ...]   (default: 1 round, S)
 *        bench_llama --child S|M               one point in this process
 * With N rounds each point runs ours and PyTorch alternately N times and keeps each side's best round.
 * Output: `bench=llama_step config=S threads=1 tokens_per_s=... gflops=... torch_tokens_per_s=... ratio=...
 *          rounds=N` per point and `bench=llama_arena ...` per config. */
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
 * 8 C / 3 rounded to 256, untied head). M: a ~110M-parameter Llama (12 layers of 768, 32000 tokens). */
static const struct bench_config configs[] = {
    {"S", 4, 256, 4, 2, 768, 4096, 256, 8, 2, 10},
    {"M", 12, 768, 12, 4, 2048, 32000, 256, 4, 1, 3},
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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int run_child(const struct bench_config *bc)
{
    const struct kernels *k = kernels_cpu();
    struct model_config mc;
    config_to_model(bc, &mc);
    struct model *m;
    if (model_create(&m, &mc, k, bc->b, bc->t) != 0)
        die("model_create");
    const struct model_layout *l = model_get_layout(m);
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
    free(tokens), free(targets);
    k->mem_free(params), k->mem_free(grads), k->mem_free(mom1), k->mem_free(mom2);
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
            fprintf(stderr, "bench_llama: unknown config '%s' (S or M)\n", argv[2]);
            return 2;
        }
        return run_child(bc);
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
            fprintf(stderr, "bench_llama: unknown config '%s' (S or M)\n", argv[first + si]);
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
                             "OMP_NUM_THREADS=%d '%s' '%s' --n_layer %d --n_head %d --n_kv_head %d --n_embd %d "
                             "--intermediate_size %d --vocab %d --seq %d --batch %d --warmup %d --steps %d",
                             threads, py, script, bc->n_layer, bc->n_head, bc->n_kv_head, bc->n_embd, bc->inter,
                             bc->vocab, bc->t, bc->b, bc->warmup, bc->steps);
                    double tt = run_and_grab(cmd, "tokens_per_s", NULL, 0);
                    if (!isnan(tt) && (isnan(ttps) || tt > ttps))
                        ttps = tt;
                }
            }
            printf("bench=llama_step config=%s threads=%d tokens_per_s=%.1f gflops=%.2f torch_tokens_per_s=%.1f "
                   "ratio=%.3f rounds=%d\n",
                   bc->name, threads, tps, grab(best_line, "gflops"), ttps, tps / ttps, rounds);
            fflush(stdout);
        }
    }
    return 0;
}
