/* Model registry, module tree / parameter layout, deterministic sharded init, safetensors weights with
 * Hugging Face names, and the activation arena. Numerical parity with PyTorch is test_model_torch.c. */
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

static void small_config(struct model_config *c)
{
    model_config_default(c);
    c->n_layer = 2;
    c->n_head = 3;
    c->n_embd = 36;
    c->vocab_size = 77;
    c->block_size = 16;
}

static char dir[64];
static void setup_dir(void)
{
    strcpy(dir, "/tmp/model_test_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}
static void teardown_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

Test(model, unknown_family_lists_known_ones)
{
    struct model_config c;
    small_config(&c);
    strcpy(c.model_family, "llama");
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &c), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "llama") && strstr(error_message(), "gpt2"), "%s", error_message());
    struct model *m;
    cr_assert_neq(model_create(&m, &c, kernels_cpu(), 1, 4), 0);
}

Test(model, rejects_bad_config)
{
    struct model_config c;
    small_config(&c);
    c.n_head = 5; /* 36 % 5 != 0 */
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &c), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "n_head"), "%s", error_message());
    small_config(&c);
    struct model *m;
    cr_assert_neq(model_create(&m, &c, kernels_cpu(), 1, 17), 0, "t > block_size accepted");
}

Test(model, layout_modules_params_units)
{
    struct model_config c;
    small_config(&c);
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &c), 0, "%s", error_message());
    size_t C = 36, L = 2, V = 77, T = 16, block = 12 * C * C + 13 * C;
    cr_assert_eq(l.vocab_padded, 128);
    cr_assert_eq(l.n_params, 4 + 12 * 2);
    cr_assert_eq(l.n_units, 3);
    cr_assert_eq(l.numel_real, V * C + T * C + 2 * C + L * block);
    cr_assert_eq(l.numel, 128 * C + T * C + 2 * C + L * block);
    cr_assert_eq(model_layout_class_numel(&l, "DecoderBlock"), L * block);
    cr_assert_eq(model_layout_class_numel(&l, "Embedding"), V * C + T * C);
    cr_assert_eq(model_layout_class_numel(&l, "GPT2Model"), l.numel_real);

    /* Units tile the flat buffer; each parameter sits inside its unit at unit_offset. */
    size_t pos = 0;
    for (int u = 0; u < l.n_units; u++) {
        cr_assert_eq(l.units[u].offset, pos);
        size_t in_unit = 0;
        for (int i = 0; i < l.units[u].n_params; i++) {
            const struct model_param *p = &l.params[l.units[u].first_param + i];
            cr_assert_eq(p->unit, u);
            cr_assert_eq(p->offset, l.units[u].offset + p->unit_offset);
            cr_assert_eq(p->unit_offset, in_unit);
            in_unit += p->numel;
        }
        cr_assert_eq(in_unit, l.units[u].numel);
        pos += in_unit;
    }
    cr_assert_eq(pos, l.numel);
    cr_assert_str_eq(l.units[0].name, "root");
    cr_assert_str_eq(l.units[2].name, "h.1");
    cr_assert_str_eq(l.modules[l.units[2].module].class_name, "DecoderBlock");

    /* HF names, shapes, and the module tree. */
    const struct model_param *p = &l.params[model_layout_find(&l, "h.1.attn.c_attn.weight")];
    cr_assert_eq(p->shape[0], 36);
    cr_assert_eq(p->shape[1], 108);
    cr_assert(p->weight_decay);
    const struct model_module *m = &l.modules[p->module];
    cr_assert_str_eq(m->name, "h.1.attn.c_attn");
    cr_assert_str_eq(m->class_name, "Conv1D");
    cr_assert_str_eq(l.modules[m->parent].name, "h.1.attn");
    cr_assert_str_eq(l.modules[m->parent].class_name, "CausalSelfAttention");
    cr_assert_str_eq(l.modules[l.modules[m->parent].parent].name, "h.1");
    p = &l.params[model_layout_find(&l, "h.0.mlp.c_proj.weight")];
    cr_assert_eq(p->shape[0], 144);
    cr_assert_eq(p->shape[1], 36);
    cr_assert(!l.params[model_layout_find(&l, "ln_f.bias")].weight_decay);
    cr_assert_eq(l.params[model_layout_find(&l, "wte.weight")].shape[0], 128);
    cr_assert_eq(model_layout_find(&l, "h.2.ln_1.weight"), -1);
    for (int i = 0; i < l.n_modules; i++)
        cr_assert(l.modules[i].parent < i, "module %s listed before its parent", l.modules[i].name);
    model_layout_free(&l);
}

Test(model, init_is_deterministic_and_shardable)
{
    struct model_config c;
    small_config(&c);
    c.n_embd = 96;
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &c), 0);
    float *a = malloc(l.numel * 4), *b = malloc(l.numel * 4);
    cr_assert_eq(model_init_params(&l, a), 0);
    /* Any slice, initialised alone, equals the same slice of the full init (ranks init their shards). */
    for (int p = 0; p < l.n_params; p++) {
        size_t n = l.params[p].numel, step = n / 3 + 1;
        for (size_t s = 0; s < n; s += step) {
            size_t cnt = s + step > n ? n - s : step;
            model_init_param_range(&l, p, s, cnt, b + l.params[p].offset + s);
        }
    }
    cr_assert_arr_eq(a, b, l.numel * 4);
    const struct model_param *wte = &l.params[model_layout_find(&l, "wte.weight")];
    for (size_t i = (size_t)77 * 96; i < wte->numel; i++)
        cr_assert_eq(a[wte->offset + i], 0.0f, "padding row not zero");
    const struct model_param *ln = &l.params[model_layout_find(&l, "h.1.ln_2.weight")];
    for (size_t i = 0; i < ln->numel; i++)
        cr_assert_eq(a[ln->offset + i], 1.0f);
    /* Standard deviations: init_std, and init_std / sqrt(2 L) for the residual projections. */
    const char *names[2] = {"h.0.mlp.c_fc.weight", "h.0.mlp.c_proj.weight"};
    double want[2] = {0.02, 0.02 / sqrt(4.0)};
    for (int k = 0; k < 2; k++) {
        const struct model_param *p = &l.params[model_layout_find(&l, names[k])];
        double s = 0, s2 = 0;
        for (size_t i = 0; i < p->numel; i++) {
            s += a[p->offset + i];
            s2 += (double)a[p->offset + i] * a[p->offset + i];
        }
        double mean = s / p->numel, sd = sqrt(s2 / p->numel - mean * mean);
        cr_assert_lt(fabs(sd / want[k] - 1), 0.03, "%s: std %g, want %g", names[k], sd, want[k]);
        cr_assert_lt(fabs(mean), 0.1 * want[k], "%s: mean %g", names[k], mean);
    }
    /* Different parameters of the same shape are not the same stream. */
    cr_assert_neq(memcmp(a + l.params[model_layout_find(&l, "h.0.attn.c_attn.weight")].offset,
                         a + l.params[model_layout_find(&l, "h.1.attn.c_attn.weight")].offset, 64),
                  0);
    l.config.seed++;
    cr_assert_eq(model_init_params(&l, b), 0);
    cr_assert_neq(memcmp(a, b, l.numel * 4), 0, "seed has no effect");
    free(a);
    free(b);
    model_layout_free(&l);
}

Test(model, weights_round_trip, .init = setup_dir, .fini = teardown_dir)
{
    struct model_config c;
    small_config(&c);
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &c), 0);
    float *a = malloc(l.numel * 4), *b = malloc(l.numel * 4);
    model_init_params(&l, a);
    char path[128];
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    cr_assert_eq(model_weights_save(&l, path, a), 0, "%s", error_message());
    memset(b, 0x7f, l.numel * 4);
    cr_assert_eq(model_weights_load(&l, path, b), 0, "%s", error_message());
    cr_assert_arr_eq(a, b, l.numel * 4);
    /* The file holds the real vocabulary rows and HF names. */
    struct safetensors_file *f;
    cr_assert_eq(safetensors_open(&f, path), 0);
    cr_assert_eq(safetensors_find(f, "wte.weight")->shape[0], 77);
    cr_assert_not_null(safetensors_find(f, "h.1.mlp.c_proj.bias"));
    cr_assert_eq(f->n_tensors, (size_t)l.n_params);
    safetensors_close(f);
    /* init_from loads the file instead of the random init. */
    strcpy(l.config.init_from, path);
    l.config.seed = 999;
    memset(b, 0, l.numel * 4);
    cr_assert_eq(model_init_params(&l, b), 0);
    cr_assert_arr_eq(a, b, l.numel * 4);
    free(a);
    free(b);
    model_layout_free(&l);
}

/* Writes the layout's parameters under HF GPT2LMHeadModel names: "transformer." prefix, mask buffers,
 * lm_head, a longer wpe, and wte as BF16; extra names (NULL-terminated) are appended as 1-element F32. */
static void write_hf_file(const struct model_layout *l, const float *a, const char *path, const char *skip,
                          const char *const *extra, const char *reshape)
{
    struct safetensors_entry e[64];
    char names[64][96];
    static float one[1] = {1}, wpe_long[24 * 36];
    uint16_t *wte16 = malloc(77 * 36 * 2);
    int n = 0;
    for (int i = 0; i < l->n_params; i++) {
        const struct model_param *p = &l->params[i];
        if (skip && strcmp(p->name, skip) == 0)
            continue;
        snprintf(names[n], sizeof names[n], "transformer.%s", p->name);
        e[n] = (struct safetensors_entry){.name = names[n], .dtype = SAFETENSORS_F32, .ndim = p->ndim,
                                          .shape = {p->init_rows, p->shape[1]}, .data = a + p->offset};
        if (reshape && strcmp(p->name, reshape) == 0) {
            e[n].shape[0] = p->shape[1];
            e[n].shape[1] = p->init_rows;
        }
        if (strcmp(p->name, "wte.weight") == 0) {
            for (int j = 0; j < 77 * 36; j++)
                wte16[j] = kernels_f32_to_bf16(a[p->offset + j]);
            e[n].dtype = SAFETENSORS_BF16;
            e[n].data = wte16;
        }
        if (strcmp(p->name, "wpe.weight") == 0) {
            memcpy(wpe_long, a + p->offset, p->numel * 4);
            e[n].shape[0] = 24;
            e[n].data = wpe_long;
        }
        n++;
    }
    static const char *const always[] = {"transformer.h.0.attn.bias", "transformer.h.1.attn.masked_bias",
                                         "lm_head.weight", NULL};
    for (int k = 0; k < 2; k++)
        for (const char *const *x = k ? extra : always; x && *x; x++)
            e[n++] = (struct safetensors_entry){.name = *x, .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {1},
                                                .data = one};
    cr_assert_eq(safetensors_write(path, e, (size_t)n, NULL, 0, NULL, NULL), 0, "%s", error_message());
    free(wte16);
}

Test(model, weights_hf_names_prefix_masks_bf16, .init = setup_dir, .fini = teardown_dir)
{
    struct model_config c;
    small_config(&c);
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &c), 0);
    float *a = malloc(l.numel * 4), *b = malloc(l.numel * 4);
    model_init_params(&l, a);
    char path[128];
    snprintf(path, sizeof path, "%s/hf.safetensors", dir);
    write_hf_file(&l, a, path, NULL, NULL, NULL);
    cr_assert_eq(model_weights_load(&l, path, b), 0, "%s", error_message());
    for (int i = 0; i < l.n_params; i++) {
        const struct model_param *p = &l.params[i];
        bool is_wte = strcmp(p->name, "wte.weight") == 0;
        for (size_t j = 0; j < p->numel; j++) {
            float want = a[p->offset + j];
            if (is_wte)
                want = kernels_bf16_to_f32(kernels_f32_to_bf16(want));
            cr_assert_eq(b[p->offset + j], want, "%s[%zu]", p->name, j);
        }
    }
    free(a);
    free(b);
    model_layout_free(&l);
}

static void expect_load_error(const char *skip, const char *const *extra, const char *reshape,
                              const char *frag)
{
    struct model_config c;
    small_config(&c);
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &c), 0);
    float *a = malloc(l.numel * 4);
    model_init_params(&l, a);
    char path[128];
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    write_hf_file(&l, a, path, skip, extra, reshape);
    cr_assert_neq(model_weights_load(&l, path, a), 0, "bad file accepted (expected: %s)", frag);
    cr_assert(strstr(error_message(), path), "no file name in: %s", error_message());
    cr_assert(strstr(error_message(), frag), "'%s' not in: %s", frag, error_message());
    free(a);
    model_layout_free(&l);
}

Test(model, weights_rejected_with_tensor_named, .init = setup_dir, .fini = teardown_dir)
{
    expect_load_error("h.1.ln_2.bias", NULL, NULL, "'h.1.ln_2.bias' is missing");
    expect_load_error(NULL, NULL, "h.0.mlp.c_fc.weight", "'transformer.h.0.mlp.c_fc.weight' has shape (144, 36)");
    static const char *const unknown[] = {"transformer.h.0.attn.bogus", NULL};
    expect_load_error(NULL, unknown, NULL, "'transformer.h.0.attn.bogus' is not a parameter");
    /* Mask buffers are matched by exact name: a layer the model lacks is an error, not ignored. */
    static const char *const beyond[] = {"h.7.attn.bias", NULL};
    expect_load_error(NULL, beyond, NULL, "'h.7.attn.bias'");
    static const char *const twice[] = {"h.0.ln_1.weight", NULL};
    expect_load_error(NULL, twice, NULL, "twice");
}

Test(model, arena_sized_up_front_and_smaller_with_checkpointing)
{
    const struct kernels *k = kernels_cpu();
    struct model_config c;
    small_config(&c);
    size_t full = model_arena_bytes(&c, 2, 16, false, k), ck = model_arena_bytes(&c, 2, 16, true, k);
    cr_assert_gt(full, ck);
    cr_log_info("activation arena for 2 x 16 tokens: %zu bytes without checkpointing, %zu with", full, ck);
    /* Without checkpointing, each block adds at least its 15 N C stored floats. */
    cr_assert_geq(full - ck, (size_t)(2 - 1) * 15 * 32 * 36 * 4);
    c.activation_checkpointing = true;
    struct model *m;
    cr_assert_eq(model_create(&m, &c, k, 2, 16), 0, "%s", error_message());
    cr_assert_eq(model_get_arena_bytes(m), ck);
    int32_t tok[32], tgt[32];
    for (int i = 0; i < 32; i++)
        tok[i] = tgt[i] = i;
    tok[5] = 77;
    cr_assert_eq(model_set_batch(m, tok, tgt), FSDP_ERANGE);
    cr_assert(strstr(error_message(), "77"), "%s", error_message());
    tok[5] = 5;
    tgt[3] = -2;
    cr_assert_eq(model_set_batch(m, tok, tgt), FSDP_ERANGE);
    tgt[3] = -1;
    cr_assert_eq(model_set_batch(m, tok, tgt), 0);
    cr_assert_eq(model_batch_targets(m), 31);
    float dummy[1] = {0};
    cr_assert_neq(model_backward_head(m, dummy, dummy), 0, "backward_head before forward_head accepted");
    model_destroy(m);
}

/* Driving the units one by one (as the FSDP engine will, each from its own buffer) gives exactly the
 * whole-model result. */
Test(model, per_unit_steps_match_whole_model)
{
    const struct kernels *k = kernels_cpu();
    struct model_config c;
    small_config(&c);
    struct model *m;
    cr_assert_eq(model_create(&m, &c, k, 2, 16), 0, "%s", error_message());
    const struct model_layout *l = model_get_layout(m);
    float *p = k->mem_alloc(l->numel * 4), *g = k->mem_alloc(l->numel * 4);
    model_init_params(l, p);
    int32_t tok[32], tgt[32];
    for (int i = 0; i < 32; i++) {
        tok[i] = (i * 7) % 77;
        tgt[i] = (i * 13 + 1) % 77;
    }
    cr_assert_eq(model_set_batch(m, tok, tgt), 0);
    memset(g, 0, l->numel * 4);
    float loss;
    cr_assert_eq(model_forward_backward(m, p, g, &loss), 0, "%s", error_message());
    cr_assert(loss > 3.0f && loss < 6.0f, "loss %g far from ln(77) = 4.34", loss);

    /* Separate unit buffers, as after an all-gather. */
    int nu = l->n_units;
    float **up = malloc(nu * sizeof *up), **ug = malloc(nu * sizeof *ug);
    for (int u = 0; u < nu; u++) {
        up[u] = k->mem_alloc(l->units[u].numel * 4);
        ug[u] = k->mem_alloc(l->units[u].numel * 4);
        memcpy(up[u], p + l->units[u].offset, l->units[u].numel * 4);
        memset(ug[u], 0, l->units[u].numel * 4);
    }
    double sum;
    cr_assert_eq(model_forward_embed(m, up[0]), 0);
    for (int i = 0; i < c.n_layer; i++)
        cr_assert_eq(model_forward_block(m, i, up[1 + i]), 0);
    cr_assert_eq(model_forward_head(m, up[0], 1.0f / 32, &sum), 0);
    cr_assert_eq((float)(sum / 32), loss);
    cr_assert_eq(model_backward_head(m, up[0], ug[0]), 0);
    for (int i = c.n_layer - 1; i >= 0; i--)
        cr_assert_eq(model_backward_block(m, i, up[1 + i], ug[1 + i]), 0);
    cr_assert_eq(model_backward_embed(m, up[0], ug[0]), 0);
    for (int u = 0; u < nu; u++) {
        cr_assert_arr_eq(ug[u], g + l->units[u].offset, l->units[u].numel * 4, "unit %d", u);
        k->mem_free(up[u]);
        k->mem_free(ug[u]);
    }
    cr_assert_neq(model_forward_block(m, c.n_layer, p), 0);
    free(up);
    free(ug);
    k->mem_free(p);
    k->mem_free(g);
    model_destroy(m);
}
