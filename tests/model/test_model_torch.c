/* GPT-2 against PyTorch: the same weights and batch through tests/model/torch_ref.py (double precision)
 * and through our fp32 model; loss, logits and every parameter gradient must agree to a relative error
 * max|a - b| / max|b| <= 1e-5 per tensor. Activation checkpointing must give bit-identical gradients. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/safetensors.h"
#include "kernels/kernels.h"
#include "worker/model/model.h"

#define TOL 1e-5

struct shape {
    int n_layer, n_head, n_embd, vocab, block, t, b;
    bool ignore_some; /* some targets -1 */
};

static bool have_torch(void)
{
    return system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

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

static void make_config(struct model_config *c, const struct shape *s, bool ckpt)
{
    model_config_default(c);
    c->n_layer = s->n_layer;
    c->n_head = s->n_head;
    c->n_embd = s->n_embd;
    c->vocab_size = s->vocab;
    c->block_size = s->block;
    c->init_std = 0.1f; /* larger than GPT-2's 0.02 so every term of the gradients matters */
    c->seed = 42;
    c->activation_checkpointing = ckpt;
}

/* Forward + backward of our model; returns host grads (flat) and fills loss / logits (b*t, vocab). */
static float *run_model(const struct shape *s, bool ckpt, const float *params_h, const int32_t *tok,
                        const int32_t *tgt, float *loss, float *logits_out, float *loss_fwd)
{
    const struct kernels *k = kernels_cpu();
    struct model_config c;
    make_config(&c, s, ckpt);
    struct model *m;
    cr_assert_eq(model_create(&m, &c, k, s->b, s->t), 0, "%s", error_message());
    const struct model_layout *l = model_get_layout(m);
    size_t bytes = l->numel * sizeof(float);
    float *p = k->mem_alloc(bytes), *g = k->mem_alloc(bytes);
    k->mem_copy(p, params_h, bytes, KERNELS_COPY_H2D);
    k->mem_set(g, 0, bytes);
    cr_assert_eq(model_set_batch(m, tok, tgt), 0, "%s", error_message());
    if (logits_out) {
        cr_assert_eq(model_forward(m, p, loss_fwd), 0, "%s", error_message());
        size_t N = (size_t)s->b * s->t, vp = (size_t)l->vocab_padded;
        float *lg = malloc(N * vp * sizeof(float));
        k->mem_copy(lg, model_logits(m), N * vp * sizeof(float), KERNELS_COPY_D2H);
        for (size_t i = 0; i < N; i++)
            memcpy(logits_out + i * s->vocab, lg + i * vp, (size_t)s->vocab * sizeof(float));
        free(lg);
    }
    cr_assert_eq(model_forward_backward(m, p, g, loss), 0, "%s", error_message());
    float *gh = malloc(bytes);
    k->mem_copy(gh, g, bytes, KERNELS_COPY_D2H);
    /* Padding rows of wte must get no gradient: padded logits never affect the loss. */
    const struct model_param *wte = &l->params[model_layout_find(l, "wte.weight")];
    for (size_t i = (size_t)s->vocab * s->n_embd; i < wte->numel; i++)
        cr_assert_eq(gh[wte->offset + i], 0.0f, "gradient in wte padding row");
    k->mem_free(p);
    k->mem_free(g);
    model_destroy(m);
    return gh;
}

static void check_shape(const struct shape *s)
{
    if (!have_torch())
        cr_skip_test("/usr/bin/python3 cannot import torch (apt-get install python3-torch)");
    char dir[] = "/tmp/model_torch_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    struct model_config c;
    make_config(&c, s, false);
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &c), 0, "%s", error_message());
    float *params = malloc(l.numel * sizeof(float));
    cr_assert_eq(model_init_params(&l, params), 0);
    /* Norm gains and biases start at 1 and 0; perturb them so their gradients and roles are tested. */
    rng_state = 7;
    for (int i = 0; i < l.n_params; i++)
        if (l.params[i].init_std == 0)
            for (size_t j = 0; j < l.params[i].numel; j++)
                params[l.params[i].offset + j] += 0.2f * (urand() - 0.5f);
    char wpath[256], bpath[256], opath[256], cmd[1024];
    snprintf(wpath, sizeof wpath, "%s/w.safetensors", dir);
    snprintf(bpath, sizeof bpath, "%s/b.safetensors", dir);
    snprintf(opath, sizeof opath, "%s/o.safetensors", dir);
    cr_assert_eq(model_weights_save(&l, wpath, params), 0, "%s", error_message());

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
             "OMP_NUM_THREADS=1 /usr/bin/python3 %s/tests/model/torch_ref.py --weights %s --batch %s "
             "--n_head %d --out %s --fp64 >/dev/null",
             src ? src : ".", wpath, bpath, s->n_head, opath);
    cr_assert_eq(system(cmd), 0, "torch_ref.py failed: %s", cmd);

    float loss, loss_fwd, *logits = malloc(N * s->vocab * sizeof(float));
    float *grads = run_model(s, false, params, tok, tgt, &loss, logits, &loss_fwd);
    cr_assert_eq(loss, loss_fwd, "forward-only and forward+backward losses differ");

    struct safetensors_file *f;
    cr_assert_eq(safetensors_open(&f, opath), 0, "%s", error_message());
    float ref_loss;
    cr_assert_eq(safetensors_read(f, safetensors_find(f, "loss"), 0, &ref_loss, 4), 0);
    cr_assert_leq(fabs(loss - ref_loss) / fabs(ref_loss), TOL, "loss %.9g vs torch %.9g", loss, ref_loss);
    const struct safetensors_tensor *lt = safetensors_find(f, "logits");
    cr_assert_eq(lt->numel, N * s->vocab);
    float *ref = malloc(lt->end - lt->begin);
    cr_assert_eq(safetensors_read(f, lt, 0, ref, lt->end - lt->begin), 0);
    double e = rel_err(logits, ref, N * s->vocab);
    cr_assert_leq(e, TOL, "logits: relative error %.3g", e);
    free(ref);
    double worst = 0;
    for (int i = 0; i < l.n_params; i++) {
        char name[128];
        snprintf(name, sizeof name, "grad.%s", l.params[i].name);
        const struct safetensors_tensor *t = safetensors_find(f, name);
        cr_assert_not_null(t, "torch output lacks %s", name);
        size_t n = (size_t)l.params[i].init_rows * l.params[i].shape[1];
        cr_assert_eq(t->numel, n, "%s: %llu elements, model has %zu", name, (unsigned long long)t->numel, n);
        ref = malloc(n * sizeof(float));
        cr_assert_eq(safetensors_read(f, t, 0, ref, n * sizeof(float)), 0);
        e = rel_err(grads + l.params[i].offset, ref, n);
        cr_assert_leq(e, TOL, "%s: relative error %.3g", name, e);
        worst = e > worst ? e : worst;
        free(ref);
    }
    cr_log_info("shape L%d C%d H%d V%d T%d B%d: loss %.6f, worst gradient relative error %.2g", s->n_layer,
                s->n_embd, s->n_head, s->vocab, s->t, s->b, loss, worst);
    safetensors_close(f);

    /* Activation checkpointing: same kernels in the same order, so the same bits. */
    float loss_ck;
    float *grads_ck = run_model(s, true, params, tok, tgt, &loss_ck, NULL, NULL);
    cr_assert_eq(loss_ck, loss);
    cr_assert_arr_eq(grads_ck, grads, l.numel * sizeof(float), "checkpointing changed the gradients");

    free(grads_ck);
    free(grads);
    free(logits);
    free(tok);
    free(tgt);
    free(params);
    model_layout_free(&l);
    unlink(wpath);
    unlink(bpath);
    unlink(opath);
    rmdir(dir);
}

/* Sizes that are multiples of nothing convenient, with vocabulary padding (77 -> 128). */
Test(model_torch, odd_sizes, .timeout = 120)
{
    struct shape s = {.n_layer = 2, .n_head = 3, .n_embd = 36, .vocab = 77, .block = 16, .t = 13, .b = 3};
    check_shape(&s);
}

/* Vocabulary already a multiple of 64 (no padding), one layer, t == block_size. */
Test(model_torch, aligned_vocab_single_layer, .timeout = 120)
{
    struct shape s = {.n_layer = 1, .n_head = 4, .n_embd = 64, .vocab = 128, .block = 16, .t = 16, .b = 2};
    check_shape(&s);
}

/* Deeper, longer sequences than the attention kernel's tiles, ignored targets (-1). */
Test(model_torch, deeper_with_ignored_targets, .timeout = 120)
{
    struct shape s = {.n_layer = 3, .n_head = 2, .n_embd = 48, .vocab = 100, .block = 80, .t = 70, .b = 2,
                      .ignore_some = true};
    check_shape(&s);
}
