/* The llama family against Hugging Face transformers' own LlamaForCausalLM (tests/model/llama_hf_ref.py,
 * double precision, run by the venv of PyPI's torch and transformers; skipped with a message without it):
 * the same weights (written by fsdpc under LlamaForCausalLM's names, loaded by transformers) and batch give
 * the same loss, logits and gradient of every parameter, relative error max|a - b| / max|b| <= 1e-5 per
 * tensor, for grouped-query, multi-query and multi-head attention, tied and untied heads, head size 64 (the
 * CPU's AVX-512 attention tiles), a head_dim other than n_embd / n_head, and ignored targets. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/safetensors.h"
#include "kernels/kernels.h"
#include "tests/util/tu_proc.h"
#include "tests/util/tu_venv.h"
#include "worker/model/model.h"

#define TOL 1e-5

struct shape {
    int n_layer, n_head, n_kv_head, n_embd, inter, vocab, block, t, b;
    float rope_theta, eps;
    bool tie, ignore_some;
    const char *family; /* NULL: llama */
    int head_dim;       /* 0: n_embd / n_head */
};

static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= num)) /* NaN-safe: a NaN anywhere makes the error NaN -> fails */
            num = d;
        if (fabs((double)b[i]) > den)
            den = fabs((double)b[i]);
    }
    return num / (den > 1e-30 ? den : 1e-30);
}

static uint64_t rng_state;
static float urand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / 16777216.0);
}

static void make_config(struct model_config *c, const struct shape *s)
{
    model_config_default(c);
    snprintf(c->model_family, sizeof c->model_family, "%s", s->family ? s->family : "llama");
    c->head_dim = s->head_dim;
    c->n_layer = s->n_layer;
    c->n_head = s->n_head;
    c->n_kv_head = s->n_kv_head;
    c->n_embd = s->n_embd;
    c->intermediate_size = s->inter;
    c->vocab_size = s->vocab;
    c->block_size = s->block;
    c->rope_theta = s->rope_theta;
    c->rms_norm_eps = s->eps;
    c->tie_word_embeddings = s->tie;
    c->init_std = 0.1f; /* larger than 0.02 so every term of the gradients matters */
    c->seed = 43;
}

static float *read_tensor(struct safetensors_file *f, const char *name, size_t n)
{
    const struct safetensors_tensor *t = safetensors_find(f, name);
    cr_assert_not_null(t, "the reference's output lacks %s", name);
    cr_assert_eq(t->numel, n, "%s: %llu elements, want %zu", name, (unsigned long long)t->numel, n);
    float *x = malloc(n * sizeof *x);
    cr_assert_eq(safetensors_read(f, t, 0, x, n * sizeof *x), 0, "%s", error_message());
    return x;
}

static void check_shape(const struct shape *s)
{
    char py[1200];
    if (tu_torch_python(py, sizeof py) != 0)
        cr_skip_test("%s", py);
    char dir[] = "/tmp/model_llama_hf_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    const struct kernels *k = kernels_cpu();
    struct model_config c;
    make_config(&c, s);
    struct model *m;
    cr_assert_eq(model_create(&m, &c, k, s->b, s->t), 0, "%s", error_message());
    const struct model_layout *l = model_get_layout(m);
    float *params = malloc(l->numel * sizeof(float));
    cr_assert_eq(model_init_params(l, params), 0);
    /* Norm gains start at 1; perturb them so their gradients and roles are tested. */
    rng_state = 7;
    for (int i = 0; i < l->n_params; i++)
        if (l->params[i].init_std == 0)
            for (size_t j = 0; j < l->params[i].numel; j++)
                params[l->params[i].offset + j] += 0.4f * (urand() - 0.5f);
    char wpath[256], bpath[256], opath[256], cmd[4096];
    snprintf(wpath, sizeof wpath, "%s/w.safetensors", dir);
    snprintf(bpath, sizeof bpath, "%s/b.safetensors", dir);
    snprintf(opath, sizeof opath, "%s/o.safetensors", dir);
    cr_assert_eq(model_weights_save(l, wpath, params), 0, "%s", error_message());
    size_t N = (size_t)s->b * s->t;
    int32_t *tok = malloc(N * sizeof *tok), *tgt = malloc(N * sizeof *tgt);
    for (size_t i = 0; i < N; i++) {
        tok[i] = (int32_t)(urand() * s->vocab) % s->vocab;
        tgt[i] = (int32_t)(urand() * s->vocab) % s->vocab;
        if (s->ignore_some && i % 5 == 2)
            tgt[i] = -1;
    }
    struct safetensors_entry be[2] = {
        {.name = "tokens", .dtype = SAFETENSORS_I32, .ndim = 2, .shape = {s->b, s->t}, .data = tok},
        {.name = "targets", .dtype = SAFETENSORS_I32, .ndim = 2, .shape = {s->b, s->t}, .data = tgt},
    };
    cr_assert_eq(safetensors_write(bpath, be, 2, NULL, 0, NULL, NULL), 0, "%s", error_message());
    const char *src = getenv("FSDP_SOURCE_ROOT");
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 '%s' %s/tests/model/llama_hf_ref.py grads --n_layer %d --n_head %d --n_kv_head %d "
             "--n_embd %d --intermediate_size %d --vocab %d --block_size %d --rope_theta %.9g --rms_norm_eps %.9g "
             "--family %s --head_dim %d %s --weights %s --batch %s --out %s --fp64 > %s/ref.log 2>&1",
             py, src ? src : ".", s->n_layer, s->n_head, l->config.n_kv_head, s->n_embd, l->config.intermediate_size,
             s->vocab, s->block, (double)s->rope_theta, (double)s->eps, l->config.model_family, l->config.head_dim, s->tie ? "--tie" : "", wpath, bpath, opath,
             dir);
    int rc = system(cmd);
    if (rc != 0) {
        char log[512];
        snprintf(log, sizeof log, "cat %s/ref.log >&2", dir);
        if (system(log) != 0)
            fprintf(stderr, "(no log)\n");
        cr_assert_fail("llama_hf_ref.py failed (%d): %s", rc, cmd);
    }

    /* ours: forward only (the logits), then forward + backward */
    float *p = k->mem_alloc(l->numel * sizeof(float)), *g = k->mem_alloc(l->numel * sizeof(float));
    memcpy(p, params, l->numel * sizeof(float));
    memset(g, 0, l->numel * sizeof(float));
    cr_assert_eq(model_set_batch(m, tok, tgt), 0, "%s", error_message());
    float loss_fwd, loss;
    cr_assert_eq(model_forward(m, p, &loss_fwd), 0, "%s", error_message());
    size_t vp = (size_t)l->vocab_padded;
    float *logits = malloc(N * s->vocab * sizeof(float));
    for (size_t i = 0; i < N; i++)
        memcpy(logits + i * s->vocab, model_logits(m) + i * vp, (size_t)s->vocab * sizeof(float));
    cr_assert_eq(model_forward_backward(m, p, g, &loss), 0, "%s", error_message());
    cr_assert_eq(loss, loss_fwd, "forward-only and forward+backward losses differ");

    struct safetensors_file *f;
    cr_assert_eq(safetensors_open(&f, opath), 0, "%s", error_message());
    float *ref = read_tensor(f, "loss", 1);
    cr_assert_leq(fabs(loss - ref[0]) / fabs(ref[0]), TOL, "loss %.9g vs transformers %.9g", loss, ref[0]);
    free(ref);
    ref = read_tensor(f, "logits", N * s->vocab);
    double e = rel_err(logits, ref, N * s->vocab), e_logits = e;
    cr_assert_leq(e, TOL, "logits: relative error %.3g", e);
    free(ref);
    double worst = 0;
    for (int i = 0; i < l->n_params; i++) {
        char name[128];
        snprintf(name, sizeof name, "grad.%s", l->params[i].name);
        size_t n = (size_t)l->params[i].init_rows * l->params[i].shape[1];
        ref = read_tensor(f, name, n);
        e = rel_err(g + l->params[i].offset, ref, n);
        cr_assert_leq(e, TOL, "%s: relative error %.3g", name, e);
        worst = e > worst ? e : worst;
        free(ref);
    }
    /* tied, transformers' lm_head.weight is embed_tokens (one parameter, one gradient), as here */
    cr_assert_eq(safetensors_find(f, "grad.lm_head.weight") != NULL, !s->tie);
    cr_log_info("%s L%d C%d H%d/%d I%d V%d T%d B%d %s: loss %.6f, logits %.2g, worst gradient relative error "
                "%.2g",
                l->config.model_family, s->n_layer, s->n_embd, s->n_head, l->config.n_kv_head, l->config.intermediate_size, s->vocab, s->t,
                s->b, s->tie ? "tied" : "untied", loss, e_logits, worst);
    safetensors_close(f);
    k->mem_free(p);
    k->mem_free(g);
    free(logits);
    free(tok);
    free(tgt);
    free(params);
    model_destroy(m);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

/* Grouped-query attention (2 query heads per key/value head), untied head, vocabulary padding (77 -> 128). */
Test(model_llama_hf, gqa_untied, .timeout = 120)
{
    struct shape s = {.n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 32, .inter = 56, .vocab = 77,
                      .block = 16, .t = 16, .b = 2, .rope_theta = 10000, .eps = 1e-6f};
    check_shape(&s);
}

/* Tied head, Llama 3's theta and eps, ignored targets, t below block_size. */
Test(model_llama_hf, gqa_tied_ignored_targets, .timeout = 120)
{
    struct shape s = {.n_layer = 2, .n_head = 6, .n_kv_head = 2, .n_embd = 48, .inter = 100, .vocab = 90,
                      .block = 24, .t = 19, .b = 3, .rope_theta = 500000, .eps = 1e-5f, .tie = true,
                      .ignore_some = true};
    check_shape(&s);
}

/* Multi-head (n_kv_head = n_head, given as 0) and the derived intermediate size. */
Test(model_llama_hf, multi_head_derived_sizes, .timeout = 120)
{
    struct shape s = {.n_layer = 1, .n_head = 3, .n_kv_head = 0, .n_embd = 36, .inter = 0, .vocab = 64,
                      .block = 13, .t = 13, .b = 2, .rope_theta = 10000, .eps = 1e-6f};
    check_shape(&s);
}

/* One key/value head for all (multi-query), head size 64 past one 64-row attention tile. */
Test(model_llama_hf, multi_query_head_size_64, .timeout = 180)
{
    struct shape s = {.n_layer = 2, .n_head = 2, .n_kv_head = 1, .n_embd = 128, .inter = 200, .vocab = 70,
                      .block = 80, .t = 70, .b = 2, .rope_theta = 10000, .eps = 1e-6f, .tie = true};
    check_shape(&s);
}

/* head_dim independent of n_embd / n_head: q is n_head x head_dim = 48 wide on a 32-wide stream (o_proj
 * (32, 48)), grouped-query, untied; then narrower heads (4 x 6 = 24 < 32) with the AVX-512 tile width 64
 * not reached. */
Test(model_llama_hf, head_dim_wider_than_n_embd_over_n_head, .timeout = 120)
{
    struct shape s = {.n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 32, .inter = 56, .vocab = 77,
                      .block = 16, .t = 16, .b = 2, .rope_theta = 10000, .eps = 1e-6f, .head_dim = 12};
    check_shape(&s);
}

Test(model_llama_hf, head_dim_narrower_tied, .timeout = 120)
{
    struct shape s = {.n_layer = 1, .n_head = 4, .n_kv_head = 4, .n_embd = 32, .inter = 40, .vocab = 64,
                      .block = 12, .t = 12, .b = 2, .rope_theta = 10000, .eps = 1e-6f, .tie = true, .head_dim = 6};
    check_shape(&s);
}

/* Qwen3ForCausalLM: q_norm and k_norm (one head_dim gain each, perturbed from 1 here) before rope, no biases,
 * head_dim 12 on a 32-wide stream of 4 query and 2 key/value heads. */
Test(model_llama_hf, qwen3_qk_norm_head_dim, .timeout = 120)
{
    struct shape s = {.n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 32, .inter = 56, .vocab = 77,
                      .block = 16, .t = 16, .b = 2, .rope_theta = 10000, .eps = 1e-6f, .family = "qwen3",
                      .head_dim = 12};
    check_shape(&s);
}

/* Qwen3 with head size 64 (the CPU's AVX-512 attention tiles) over 2 heads of a 96-wide stream, tied. */
Test(model_llama_hf, qwen3_head_size_64_tied, .timeout = 180)
{
    struct shape s = {.n_layer = 1, .n_head = 2, .n_kv_head = 1, .n_embd = 96, .inter = 128, .vocab = 70,
                      .block = 70, .t = 70, .b = 2, .rope_theta = 10000, .eps = 1e-6f, .tie = true,
                      .family = "qwen3", .head_dim = 64};
    check_shape(&s);
}
