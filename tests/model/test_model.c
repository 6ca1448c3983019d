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
    strcpy(c.model_family, "mamba");
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &c), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "\"mamba\"; known families: gpt2, llama"), "%s", error_message());
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
                wte16[j] = dtype_f32_to_bf16(a[p->offset + j]);
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
                want = dtype_bf16_to_f32(dtype_f32_to_bf16(want));
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
    cr_assert_eq(model_forward_head(m, up[0], 1.0f / 32), 0);
    cr_assert_eq(model_take_loss(m, &sum), 0);
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

/* ---------------- the Llama family ---------------- */

static void llama_config(struct model_config *c, int n_kv_head, bool tie)
{
    model_config_default(c);
    strcpy(c->model_family, "llama");
    c->n_layer = 2;
    c->n_head = 4;
    c->n_kv_head = n_kv_head;
    c->n_embd = 32;
    c->intermediate_size = 56;
    c->vocab_size = 77;
    c->block_size = 16;
    c->tie_word_embeddings = tie;
}

Test(model, llama_layout_names_shapes_units)
{
    for (int tie = 0; tie < 2; tie++) {
        struct model_config c;
        llama_config(&c, 2, tie);
        struct model_layout l;
        cr_assert_eq(model_layout_build(&l, &c), 0, "%s", error_message());
        size_t C = 32, L = 2, V = 77, I = 56, hs = 8, q = 4 * hs, kv = 2 * hs;
        size_t block = q * C + 2 * kv * C + C * q + 3 * I * C + 2 * C;
        cr_assert_eq(l.vocab_padded, 128);
        cr_assert_eq(l.n_params, (tie ? 2 : 3) + 9 * 2);
        cr_assert_eq(l.n_units, 3);
        cr_assert_eq(l.numel_real, (tie ? 1 : 2) * V * C + C + L * block);
        cr_assert_eq(l.numel, (tie ? 1 : 2) * 128 * C + C + L * block);
        cr_assert_eq(model_layout_class_numel(&l, "LlamaDecoderLayer"), L * block);
        cr_assert_eq(model_layout_class_numel(&l, "LlamaForCausalLM"), l.numel_real);
        cr_assert_str_eq(l.units[0].name, "root");
        cr_assert_str_eq(l.units[2].name, "model.layers.1");
        cr_assert_str_eq(l.modules[l.units[2].module].class_name, "LlamaDecoderLayer");
        /* LlamaForCausalLM's names and nn.Linear's (out, in) shapes */
        static const struct {
            const char *name;
            int d0, d1, ndim;
            bool decay;
            const char *cls;
        } want[] = {
            {"model.embed_tokens.weight", 128, 32, 2, true, "Embedding"},
            {"model.norm.weight", 32, 1, 1, false, "LlamaRMSNorm"},
            {"model.layers.1.self_attn.q_proj.weight", 32, 32, 2, true, "Linear"},
            {"model.layers.1.self_attn.k_proj.weight", 16, 32, 2, true, "Linear"},
            {"model.layers.1.self_attn.v_proj.weight", 16, 32, 2, true, "Linear"},
            {"model.layers.1.self_attn.o_proj.weight", 32, 32, 2, true, "Linear"},
            {"model.layers.0.mlp.gate_proj.weight", 56, 32, 2, true, "Linear"},
            {"model.layers.0.mlp.up_proj.weight", 56, 32, 2, true, "Linear"},
            {"model.layers.0.mlp.down_proj.weight", 32, 56, 2, true, "Linear"},
            {"model.layers.0.input_layernorm.weight", 32, 1, 1, false, "LlamaRMSNorm"},
            {"model.layers.0.post_attention_layernorm.weight", 32, 1, 1, false, "LlamaRMSNorm"},
        };
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            int pi = model_layout_find(&l, want[i].name);
            cr_assert_geq(pi, 0, "no %s", want[i].name);
            const struct model_param *p = &l.params[pi];
            cr_assert(p->shape[0] == want[i].d0 && p->shape[1] == want[i].d1 && p->ndim == want[i].ndim,
                      "%s: (%d, %d)", want[i].name, p->shape[0], p->shape[1]);
            cr_assert_eq(p->weight_decay, want[i].decay, "%s", want[i].name);
            cr_assert_str_eq(l.modules[p->module].class_name, want[i].cls, "%s", want[i].name);
        }
        const struct model_param *emb = &l.params[model_layout_find(&l, "model.embed_tokens.weight")];
        cr_assert_eq(emb->init_rows, 77);
        cr_assert_eq(emb->lookup_only, !tie, "an untied embedding is only looked up");
        int head = model_layout_find(&l, "lm_head.weight");
        if (tie) {
            cr_assert_eq(head, -1, "a tied model has no lm_head.weight");
        } else {
            cr_assert_geq(head, 0);
            cr_assert_eq(l.params[head].unit, 0);
            cr_assert_eq(l.params[head].shape[0], 128);
            cr_assert_eq(l.params[head].init_rows, 77);
            cr_assert(!l.params[head].lookup_only);
        }
        /* q, k, v adjacent (one GEMM gives [q | k | v]); gate and up adjacent ([gate | up]) */
        const char *adj[][2] = {{"model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"},
                                {"model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight"},
                                {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"}};
        for (int i = 0; i < 3; i++) {
            const struct model_param *a = &l.params[model_layout_find(&l, adj[i][0])];
            cr_assert_eq(a->offset + a->numel, l.params[model_layout_find(&l, adj[i][1])].offset, "%s", adj[i][0]);
        }
        /* the module tree in LlamaForCausalLM's order, its state dict order */
        for (int i = 0; i < l.n_modules; i++)
            cr_assert(l.modules[i].parent < i, "module %s listed before its parent", l.modules[i].name);
        cr_assert_str_eq(l.modules[0].class_name, "LlamaForCausalLM");
        cr_assert_str_eq(l.modules[1].name, "model");
        cr_assert_str_eq(l.modules[2].name, "model.embed_tokens");
        /* model FLOPs: 6 x the parameters but lookup-only tables (an untied embedding) + causal attention */
        double mm = (double)L * block + C + V * C;
        cr_assert_float_eq(model_flops_per_token(&l), 6 * mm + 12.0 * L * C * 16, 1e-6);
        model_layout_free(&l);
        /* a sliding window shorter than the context counts its keys in the layers that have it (Qwen2's rule:
         * from max_window_layers on), a longer one the context's */
        struct model_config w = c;
        w.sliding_window = 5, w.max_window_layers = L - 1;
        cr_assert_eq(model_layout_build(&l, &w), 0, "%s", error_message());
        cr_assert_float_eq(model_flops_per_token(&l), 6 * mm + 12.0 * C * (16.0 * (L - 1) + 5), 1e-6);
        model_layout_free(&l);
        w.sliding_window = 100;
        cr_assert_eq(model_layout_build(&l, &w), 0, "%s", error_message());
        cr_assert_float_eq(model_flops_per_token(&l), 6 * mm + 12.0 * L * C * 16, 1e-6);
        model_layout_free(&l);
    }
}

Test(model, llama_family_defaults_resolved)
{
    struct model_config c;
    llama_config(&c, 0, false);
    c.intermediate_size = 0;
    c.n_embd = 96;
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &c), 0, "%s", error_message());
    cr_assert_eq(l.config.n_kv_head, 4, "n_kv_head 0 means n_head");
    cr_assert_eq(l.config.intermediate_size, 256, "8 * 96 / 3 = 256");
    cr_assert_float_eq(l.config.rope_theta, 10000.0f, 0);
    cr_assert_float_eq(l.config.rms_norm_eps, 1e-6f, 0);
    model_layout_free(&l);
    c.n_embd = 4096;
    c.n_head = 32;
    cr_assert_eq(model_layout_build(&l, &c), 0, "%s", error_message());
    cr_assert_eq(l.config.intermediate_size, 11008, "LlamaConfig's default for 4096");
    model_layout_free(&l);
}

static void expect_llama_reject(void (*change)(struct model_config *), const char *frag)
{
    struct model_config c;
    llama_config(&c, 2, false);
    change(&c);
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &c), FSDP_EINVAL, "accepted (expected: %s)", frag);
    cr_assert(strstr(error_message(), frag), "'%s' not in: %s", frag, error_message());
}
static void kv_3(struct model_config *c) { c->n_kv_head = 3; }
static void head_odd(struct model_config *c) { c->n_embd = 36, c->n_head = 4; } /* hs 9 */
static void theta_0(struct model_config *c) { c->rope_theta = 0; }
static void eps_neg(struct model_config *c) { c->rms_norm_eps = -1; }
static void inter_neg(struct model_config *c) { c->intermediate_size = -3; }

Test(model, llama_rejects_bad_config)
{
    expect_llama_reject(kv_3, "n_kv_head (3) must divide n_head (4)");
    expect_llama_reject(head_odd, "head size head_dim = 9 must be even");
    expect_llama_reject(theta_0, "rope_theta must be above 0");
    expect_llama_reject(eps_neg, "rms_norm_eps must be >= 0");
    expect_llama_reject(inter_neg, "intermediate_size must be in");
}

/* The registry says which family reads which [model] key (worker/config asks it): the Llama-style families
 * read the Llama keys, gpt2 none of them, and keys no family declares are everybody's. */
Test(model, families_declare_their_keys)
{
    cr_assert(!model_family_reads_key("gpt2", "n_kv_head"));
    cr_assert(!model_family_reads_key("gpt2", "rope_theta"));
    cr_assert(model_family_reads_key("llama", "rope_scaling"));
    cr_assert(model_family_reads_key("qwen3", "tie_word_embeddings"));
    cr_assert(model_family_reads_key("gpt2", "n_layer"));
    char readers[128];
    cr_assert_eq(model_families_reading("rms_norm_eps", readers, sizeof readers), 4);
    cr_assert_str_eq(readers, "llama, qwen2, qwen3 or mistral");
    /* the window: Mistral's in every layer, Qwen2's and Qwen3's from max_window_layers on; Llama has none */
    cr_assert(!model_family_reads_key("llama", "sliding_window"));
    cr_assert(model_family_reads_key("mistral", "sliding_window"));
    cr_assert(!model_family_reads_key("mistral", "max_window_layers"));
    cr_assert_eq(model_families_reading("max_window_layers", readers, sizeof readers), 2);
    cr_assert_str_eq(readers, "qwen2 or qwen3");
    cr_assert_eq(model_families_reading("n_layer", readers, sizeof readers), 0);
    cr_assert_str_eq(readers, "");
    /* a family's key checks see the keys as set: an unset n_kv_head (0) is n_head, an odd derived head size
     * names n_embd / n_head */
    struct model_config c;
    llama_config(&c, 2, false);
    snprintf(c.model_family, sizeof c.model_family, "qwen3");
    c.n_kv_head = 0;
    cr_assert_eq(model_config_check_keys(&c), 0, "%s", error_message());
    c.n_kv_head = 3;
    cr_assert_eq(model_config_check_keys(&c), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "model.n_kv_head (3) must divide model.n_head (4)"), "%s", error_message());
    c.n_kv_head = 0, c.head_dim = 0, c.n_embd = 36;
    cr_assert_eq(model_config_check_keys(&c), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "model_family = qwen3: the head size model.n_embd / model.n_head = 36 / 4 = 9"),
              "%s", error_message());
    snprintf(c.model_family, sizeof c.model_family, "gpt2");
    cr_assert_eq(model_config_check_keys(&c), 0, "gpt2 declares no key checks: %s", error_message());
}

/* The wrap class is the family's decoder block, in its names (ours are transformers' for the Llama) or the
 * GPT-2 spelling DecoderBlock; the other family's class is refused naming this model's classes. */
Test(model, llama_wrap_classes_and_class_table)
{
    struct model_config c;
    llama_config(&c, 2, false);
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &c), 0, "%s", error_message());
    cr_assert_eq(model_wrap_classes_check(&l, "LlamaDecoderLayer"), 0, "%s", error_message());
    cr_assert_eq(model_wrap_classes_check(&l, "decoderblock"), 0, "%s", error_message());
    cr_assert_eq(model_wrap_classes_check(&l, "LlamaDecoderLayer, DecoderBlock"), 0, "%s", error_message());
    cr_assert_str_eq(model_class_resolve(&l, "DecoderBlock"), "LlamaDecoderLayer");
    cr_assert_str_eq(model_class_hf_name(&l, "LlamaRMSNorm"), "LlamaRMSNorm");
    cr_assert(model_class_can_be_unit(&l, "LlamaDecoderLayer"));
    cr_assert(!model_class_can_be_unit(&l, "LlamaMLP"));
    cr_assert_eq(model_wrap_classes_check(&l, "GPT2Block"), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "this llama model has no class 'GPT2Block'") &&
                  strstr(error_message(), "LlamaRMSNorm") &&
                  strstr(error_message(), "the one that becomes a unit is LlamaDecoderLayer"),
              "%s", error_message());
    cr_assert_eq(model_wrap_classes_check(&l, "LlamaRMSNorm"), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "LlamaRMSNorm cannot be an FSDP unit here"), "%s", error_message());
    struct model_class_row *rows;
    int n;
    cr_assert_eq(model_class_table(&l, &rows, &n), 0, "%s", error_message());
    bool layer = false;
    for (int i = 0; i < n; i++)
        if (strcmp(rows[i].class_name, "LlamaDecoderLayer") == 0) {
            layer = true;
            cr_assert_eq(rows[i].count, 2);
            cr_assert(rows[i].can_be_unit);
            cr_assert_str_eq(rows[i].example, "model.layers.0");
        }
    cr_assert(layer, "no LlamaDecoderLayer row");
    free(rows);
    model_layout_free(&l);
}

/* fsdpc's file round trip, and a file as transformers writes it: a tied model without lm_head.weight
 * (or with it: it is the embedding), the rotary inv_freq buffers older files carry, BF16 tensors; an
 * untied model needs its lm_head.weight. */
Test(model, llama_weights_round_trip_and_hf_files, .init = setup_dir, .fini = teardown_dir)
{
    for (int tie = 0; tie < 2; tie++) {
        struct model_config c;
        llama_config(&c, 2, tie);
        struct model_layout l;
        cr_assert_eq(model_layout_build(&l, &c), 0);
        float *a = malloc(l.numel * 4), *b = malloc(l.numel * 4);
        cr_assert_eq(model_init_params(&l, a), 0);
        char path[128];
        snprintf(path, sizeof path, "%s/llama%d.safetensors", dir, tie);
        cr_assert_eq(model_weights_save(&l, path, a), 0, "%s", error_message());
        memset(b, 0x7f, l.numel * 4);
        cr_assert_eq(model_weights_load(&l, path, b), 0, "%s", error_message());
        cr_assert_arr_eq(a, b, l.numel * 4);
        struct safetensors_file *f;
        cr_assert_eq(safetensors_open(&f, path), 0);
        cr_assert_eq(f->n_tensors, (size_t)l.n_params);
        cr_assert_eq(safetensors_find(f, "model.embed_tokens.weight")->shape[0], 77);
        cr_assert_eq(safetensors_find(f, "lm_head.weight") != NULL, !tie);
        /* the state dict's order: embeddings, layers, final norm, head */
        cr_assert_str_eq(f->tensors[0].name, "model.embed_tokens.weight");
        cr_assert_str_eq(f->tensors[1].name, "model.layers.0.self_attn.q_proj.weight");
        cr_assert_str_eq(f->tensors[f->n_tensors - (tie ? 1 : 2)].name, "model.norm.weight");
        safetensors_close(f);

        /* as transformers writes it */
        struct safetensors_entry e[40];
        static float one[1] = {1};
        static float inv_freq[4] = {1, 0.1f, 0.01f, 0.001f};
        uint16_t *q16 = NULL;
        int n = 0;
        for (int i = 0; i < l.n_params; i++) {
            const struct model_param *p = &l.params[i];
            e[n] = (struct safetensors_entry){.name = p->name, .dtype = SAFETENSORS_F32, .ndim = p->ndim,
                                              .shape = {p->init_rows, p->shape[1]}, .data = a + p->offset};
            if (strcmp(p->name, "model.layers.0.self_attn.q_proj.weight") == 0) {
                q16 = malloc(p->numel * 2);
                for (size_t j = 0; j < p->numel; j++)
                    q16[j] = dtype_f32_to_bf16(a[p->offset + j]);
                e[n].dtype = SAFETENSORS_BF16;
                e[n].data = q16;
            }
            n++;
        }
        e[n++] = (struct safetensors_entry){.name = "model.layers.1.self_attn.rotary_emb.inv_freq",
                                            .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {4}, .data = inv_freq};
        if (tie)
            e[n++] = (struct safetensors_entry){.name = "lm_head.weight", .dtype = SAFETENSORS_F32, .ndim = 1,
                                                .shape = {1}, .data = one};
        snprintf(path, sizeof path, "%s/hf%d.safetensors", dir, tie);
        cr_assert_eq(safetensors_write(path, e, (size_t)n, NULL, 0, NULL, NULL), 0, "%s", error_message());
        cr_assert_eq(model_weights_load(&l, path, b), 0, "%s", error_message());
        const struct model_param *qp = &l.params[model_layout_find(&l, "model.layers.0.self_attn.q_proj.weight")];
        for (size_t j = 0; j < qp->numel; j++)
            cr_assert_eq(b[qp->offset + j], dtype_bf16_to_f32(q16[j]));
        cr_assert_eq(memcmp(a, b, qp->offset * 4), 0);
        if (!tie) {
            /* untied without its head: missing */
            int kept = 0;
            for (int i = 0; i < n; i++)
                if (strcmp(e[i].name, "lm_head.weight") != 0)
                    e[kept++] = e[i];
            cr_assert_eq(kept, n - 1);
            cr_assert_eq(safetensors_write(path, e, (size_t)kept, NULL, 0, NULL, NULL), 0, "%s", error_message());
            cr_assert_eq(model_weights_load(&l, path, b), FSDP_EINVAL);
            cr_assert(strstr(error_message(), "'lm_head.weight' is missing"), "%s", error_message());
        }
        free(q16);
        free(a);
        free(b);
        model_layout_free(&l);
    }
}

/* Per-unit steps from separate buffers equal the whole-model call; activation checkpointing gives the
 * same gradients bit for bit from a smaller arena; padded vocabulary rows get no gradient. */
Test(model, llama_units_checkpointing_and_padding)
{
    const struct kernels *k = kernels_cpu();
    for (int tie = 0; tie < 2; tie++) {
        struct model_config c;
        llama_config(&c, 2, tie);
        cr_assert_gt(model_arena_bytes(&c, 2, 16, false, k), model_arena_bytes(&c, 2, 16, true, k));
        float *grads[2], loss[2];
        size_t numel = 0;
        int32_t tok[32], tgt[32];
        for (int i = 0; i < 32; i++) {
            tok[i] = (i * 7) % 77;
            tgt[i] = i % 9 == 4 ? -1 : (i * 13 + 1) % 77;
        }
        for (int ck = 0; ck < 2; ck++) {
            c.activation_checkpointing = ck;
            struct model *m;
            cr_assert_eq(model_create(&m, &c, k, 2, 16), 0, "%s", error_message());
            const struct model_layout *l = model_get_layout(m);
            cr_assert_eq(model_get_arena_bytes(m), model_arena_bytes(&c, 2, 16, ck, k));
            numel = l->numel;
            float *p = k->mem_alloc(numel * 4), *g = k->mem_alloc(numel * 4);
            cr_assert_eq(model_init_params(l, p), 0);
            memset(g, 0, numel * 4);
            cr_assert_eq(model_set_batch(m, tok, tgt), 0);
            cr_assert_eq(model_forward_backward(m, p, g, &loss[ck]), 0, "%s", error_message());
            cr_assert(loss[ck] > 3.5f && loss[ck] < 5.2f, "loss %g far from ln(77) = 4.34", loss[ck]);
            grads[ck] = malloc(numel * 4);
            memcpy(grads[ck], g, numel * 4);
            for (int h = 0; h < 2; h++) {
                int pi = model_layout_find(l, h ? "lm_head.weight" : "model.embed_tokens.weight");
                if (pi < 0)
                    continue;
                const struct model_param *pp = &l->params[pi];
                for (size_t i = (size_t)77 * 32; i < pp->numel; i++)
                    cr_assert_eq(g[pp->offset + i], 0.0f, "gradient in a padding row of %s", pp->name);
            }
            if (!ck) {
                /* separate unit buffers, as after an all-gather */
                int nu = l->n_units;
                float *up[3], *ug[3];
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
                int valid = model_batch_targets(m);
                cr_assert_eq(valid, 28);
                cr_assert_eq(model_forward_head(m, up[0], 1.0f / valid), 0);
                cr_assert_eq(model_take_loss(m, &sum), 0);
                cr_assert_eq((float)(sum / valid), loss[0]);
                cr_assert_eq(model_backward_head(m, up[0], ug[0]), 0);
                for (int i = c.n_layer - 1; i >= 0; i--)
                    cr_assert_eq(model_backward_block(m, i, up[1 + i], ug[1 + i]), 0);
                cr_assert_eq(model_backward_embed(m, up[0], ug[0]), 0);
                for (int u = 0; u < nu; u++) {
                    cr_assert_arr_eq(ug[u], g + l->units[u].offset, l->units[u].numel * 4, "unit %d", u);
                    k->mem_free(up[u]);
                    k->mem_free(ug[u]);
                }
            }
            k->mem_free(p);
            k->mem_free(g);
            model_destroy(m);
        }
        cr_assert_eq(loss[0], loss[1]);
        cr_assert_arr_eq(grads[0], grads[1], numel * 4, "activation checkpointing changed the gradients");
        free(grads[0]);
        free(grads[1]);
    }
}

/* ---------------- a block's output add, taken by the next norm ---------------- */

/* The CPU table's ops, counted: which of the residual adds ran on their own and which fused with a norm. */
static int n_residual, n_fused;
static int count_residual(float *out, const float *a, const float *b, size_t n)
{
    n_residual++;
    return kernels_cpu()->residual_forward(out, a, b, n);
}
static int count_residual_layernorm(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                                    const float *w, const float *bias, int n, int c, float eps)
{
    n_fused++;
    return kernels_cpu()->residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, n, c, eps);
}
static int count_residual_rmsnorm(float *res, float *out, float *rstd, const float *a, const float *b, const float *w,
                                  int n, int c, float eps)
{
    n_fused++;
    return kernels_cpu()->residual_rmsnorm_forward(res, out, rstd, a, b, w, n, c, eps);
}

/* Loss and gradients of one forward_backward on table k; *again: the loss of a per-unit forward that runs
 * block 0 twice (an add left pending by a step that is not followed by its consumer). */
static float fused_run(const struct model_config *c, const struct kernels *k, float *grads, float *again)
{
    struct model *m;
    cr_assert_eq(model_create(&m, c, k, 2, 16), 0, "%s", error_message());
    const struct model_layout *l = model_get_layout(m);
    float *p = k->mem_alloc(l->numel * 4);
    cr_assert_eq(model_init_params(l, p), 0);
    memset(grads, 0, l->numel * 4);
    int32_t tok[32], tgt[32];
    for (int i = 0; i < 32; i++) {
        tok[i] = (i * 7) % 77;
        tgt[i] = i % 9 == 4 ? -1 : (i * 13 + 1) % 77;
    }
    cr_assert_eq(model_set_batch(m, tok, tgt), 0);
    float loss;
    cr_assert_eq(model_forward_backward(m, p, grads, &loss), 0, "%s", error_message());
    double sum;
    cr_assert_eq(model_forward_embed(m, p + l->units[0].offset), 0);
    cr_assert_eq(model_forward_block(m, 0, p + l->units[1].offset), 0);
    for (int i = 0; i < c->n_layer; i++)
        cr_assert_eq(model_forward_block(m, i, p + l->units[1 + i].offset), 0);
    cr_assert_eq(model_forward_head(m, p + l->units[0].offset, 0.0f), 0);
    cr_assert_eq(model_take_loss(m, &sum), 0);
    *again = (float)(sum / model_batch_targets(m));
    k->mem_free(p);
    model_destroy(m);
    return loss;
}

/* With the fused residual + norm ops, each block's last add is taken by the norm after it (the next block's
 * first, or the final one): never run on its own, never lost, never done twice, and the loss and every
 * gradient bit-identical to the table without the fused ops, with and without activation checkpointing. */
Test(model, block_output_add_fused_into_next_norm)
{
    struct kernels fused = *kernels_cpu(), plain = *kernels_cpu();
    fused.residual_forward = plain.residual_forward = count_residual;
    fused.residual_layernorm_forward = count_residual_layernorm;
    fused.residual_rmsnorm_forward = count_residual_rmsnorm;
    plain.residual_layernorm_forward = NULL;
    plain.residual_rmsnorm_forward = NULL;
    for (int fam = 0; fam < 2; fam++) {
        struct model_config c;
        if (fam)
            llama_config(&c, 2, false);
        else
            small_config(&c);
        c.n_layer = 3;
        int L = c.n_layer;
        struct model_layout lay;
        cr_assert_eq(model_layout_build(&lay, &c), 0, "%s", error_message());
        size_t numel = lay.numel;
        model_layout_free(&lay);
        float *gf = malloc(numel * 4), *gp = malloc(numel * 4);
        for (int ck = 0; ck < 2; ck++) {
            c.activation_checkpointing = ck;
            float again_f, again_p;
            n_residual = n_fused = 0;
            float lf = fused_run(&c, &fused, gf, &again_f);
            /* forward_backward: L mid-block adds, L - 1 block inputs and the final norm, plus the L mid-block
             * adds of the recompute; then the per-unit forward: block 0 twice (its first add flushed alone) */
            cr_assert_eq(n_fused, 2 * L + (ck ? L : 0) + 2 * L + 1, "%s ck %d: %d fused", c.model_family, ck, n_fused);
            cr_assert_eq(n_residual, 1, "%s ck %d: %d residual adds alone", c.model_family, ck, n_residual);
            n_residual = n_fused = 0;
            float lp = fused_run(&c, &plain, gp, &again_p);
            cr_assert_eq(n_fused, 0);
            cr_assert_eq(n_residual, 2 * L + (ck ? L : 0) + 2 * (L + 1), "%s ck %d: %d", c.model_family, ck,
                         n_residual);
            cr_assert_eq(lf, lp, "%s ck %d: loss %.9g fused, %.9g plain", c.model_family, ck, lf, lp);
            cr_assert_eq(again_f, lf, "%s ck %d", c.model_family, ck);
            cr_assert_eq(again_p, lp, "%s ck %d", c.model_family, ck);
            cr_assert_arr_eq(gf, gp, numel * 4, "%s ck %d: the fused ops changed the gradients", c.model_family, ck);
        }
        free(gf);
        free(gp);
    }
}
