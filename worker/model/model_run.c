/* The family-independent model object: creation through the registry, the batch, and the whole-model
 * forward/backward as the sequence of per-unit steps the FSDP engine will interleave with its
 * all-gathers and reduce-scatters. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "worker/model/model_internal.h"

size_t model_arena_bytes(const struct model_config *cfg, int b, int t, bool checkpointing,
                         const struct kernels *k)
{
    const struct model_family *f = model_family_find(cfg->model_family);
    return f ? model_core_arena_bytes(f, cfg, b, t, checkpointing, k) : 0;
}

static int cp_check(const struct model_config *cfg, const struct kernels *k, int t, const struct model_cp *cp)
{
    int S = cp->size, nkv = cfg->n_kv_head > 0 ? cfg->n_kv_head : cfg->n_head;
    if (cp->rank < 0 || cp->rank >= S)
        return error_set(FSDP_EINVAL, "model: context-parallel rank %d outside [0, %d)", cp->rank, S);
    if (t % (2 * S) != 0)
        return error_set(FSDP_EINVAL,
                         "model: sequences of %d tokens cannot be cut into 2 x %d equal chunks (context parallelism)",
                         t, S);
    if (!k->attention_cp_forward || !k->attention_cp_backward)
        return error_set(FSDP_EUNSUPPORTED,
                         "context parallelism needs context-parallel attention, which the %s kernels do not have", k->name);
    if (cp->strategy == MODEL_CP_ALLGATHER && (!cp->all_gather || !cp->reduce_scatter))
        return error_set(FSDP_EINVAL, "model: the allgather strategy needs all_gather and reduce_scatter");
    if (cp->strategy == MODEL_CP_ALLTOALL) {
        if (!cp->all_to_all)
            return error_set(FSDP_EINVAL, "model: the alltoall strategy needs all_to_all");
        if (cfg->n_head % S != 0 || nkv % S != 0)
            return error_set(FSDP_EINVAL,
                             "context_parallel_comm_strategy = alltoall splits the %d attention heads and %d key/value "
                             "heads across the %d ranks of a context group, but they do not divide; use allgather",
                             cfg->n_head, nkv, S);
    }
    return 0;
}

int model_create_cp(struct model **out, const struct model_config *cfg, const struct kernels *k, int b, int t,
                    const struct model_cp *cp)
{
    *out = NULL;
    if (b < 1 || t < 1 || t > cfg->block_size)
        return error_set(FSDP_EINVAL, "model: batch %d x %d tokens: need b >= 1 and 1 <= t <= block_size (%d)", b,
                         t, cfg->block_size);
    struct model_cp none = {.rank = 0, .size = 1};
    if (!cp || cp->size <= 1)
        cp = &none;
    struct model *m = calloc(1, sizeof *m);
    if (!m)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    FSDP_TRY_GOTO(model_layout_build(&m->layout, cfg), rc, fail);
    if (cp->size > 1)
        FSDP_TRY_GOTO(cp_check(&m->layout.config, k, t, cp), rc, fail);
    m->decoder = model_family_find(cfg->model_family)->decoder;
    m->k = k;
    m->b = b;
    m->cp = *cp;
    m->t_seq = t;
    m->t = t / cp->size;
    FSDP_TRY_GOTO(model_core_create(m), rc, fail);
    if (cp->size > 1 && (rc = model_cp_setup(m)) != 0) {
        model_cp_release(m);
        model_core_destroy(m);
        goto fail;
    }
    log_debug("model %s: %zu parameters, activation arena %zu bytes (batch %d x %d, checkpointing %s)",
              cfg->model_family, m->layout.numel_real, m->arena_bytes, b, m->t,
              cfg->activation_checkpointing ? "on" : "off");
    *out = m;
    return 0;
fail:
    model_layout_free(&m->layout);
    free(m);
    return rc;
}

int model_create(struct model **out, const struct model_config *cfg, const struct kernels *k, int b, int t)
{
    return model_create_cp(out, cfg, k, b, t, NULL);
}

void model_destroy(struct model *m)
{
    if (!m)
        return;
    model_cp_release(m);
    model_core_destroy(m);
    model_layout_free(&m->layout);
    free(m);
}

int model_set_compute_dtype(struct model *m, enum dtype dtype)
{
    const struct kernels *k = m->k;
    /* Context-parallel attention moves and reads its output in fp32 (model_cp.c): such a model keeps fp32. */
    bool store = dtype != DTYPE_F32 && (k->act_dtypes & DTYPE_BIT(dtype)) && k->act_bind && m->cp.size == 1;
    enum dtype act = store ? dtype : DTYPE_F32;
    if (act == m->act_dtype)
        return 0;
    /* a new arena: the activation region's size changes with its dtype (nothing in the old one is kept) */
    enum dtype old = m->act_dtype;
    model_core_destroy(m);
    m->act_dtype = act;
    int rc = model_core_create(m);
    if (rc) {
        m->act_dtype = old;
        return rc;
    }
    m->batch_set = false;
    log_debug("model %s: activations that only matmuls read are stored in %s; activation arena %zu bytes",
              m->layout.config.model_family, dtype_name(act), m->arena_bytes);
    return 0;
}

const struct model_layout *model_get_layout(const struct model *m)
{
    return &m->layout;
}

size_t model_get_arena_bytes(const struct model *m)
{
    return m->arena_bytes;
}

/* This rank's chunks of b whole sequences into cp_host (tokens, then targets). */
static void cp_slice(struct model *m, const int32_t **tokens, const int32_t **targets)
{
    size_t n = (size_t)m->b * m->t;
    for (int bb = 0; bb < m->b; bb++)
        for (int j = 0; j < m->t; j++) {
            size_t src = (size_t)bb * m->t_seq + (size_t)model_position(m, j), dst = (size_t)bb * m->t + j;
            m->cp_host[dst] = (*tokens)[src];
            m->cp_host[n + dst] = (*targets)[src];
        }
    *tokens = m->cp_host;
    *targets = m->cp_host + n;
}

int model_set_batch(struct model *m, const int32_t *tokens, const int32_t *targets)
{
    size_t n = (size_t)m->b * m->t;
    if (m->cp.size > 1)
        cp_slice(m, &tokens, &targets);
    int valid = 0, V = m->layout.config.vocab_size;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return error_set(FSDP_ERANGE, "model: token %d at position %zu is outside the vocabulary [0, %d)",
                             tokens[i], i, V);
        if (targets[i] < -1 || targets[i] >= V)
            return error_set(FSDP_ERANGE,
                             "model: target %d at position %zu is outside the vocabulary [0, %d) and not -1",
                             targets[i], i, V);
        valid += targets[i] != -1;
    }
    int rc = 0;
    FSDP_TRY_GOTO(m->k->mem_copy(m->tokens, tokens, n * sizeof *tokens, KERNELS_COPY_H2D), rc, out);
    FSDP_TRY_GOTO(m->k->mem_copy(m->targets, targets, n * sizeof *targets, KERNELS_COPY_H2D), rc, out);
out:
    m->n_valid = valid;
    m->batch_set = rc == 0;
    return rc;
}

int model_batch_targets(const struct model *m)
{
    return m->n_valid;
}

static int check_batch(const struct model *m)
{
    return m->batch_set ? 0 : error_set(FSDP_EINVAL, "model: model_set_batch must come before the forward");
}

static int check_layer(const struct model *m, int layer)
{
    return layer >= 0 && layer < m->layout.config.n_layer
               ? 0
               : error_set(FSDP_EINVAL, "model: layer %d out of range [0, %d)", layer, m->layout.config.n_layer);
}

int model_forward_embed(struct model *m, const float *root)
{
    FSDP_TRY(check_batch(m));
    return model_core_forward_embed(m, root);
}

int model_forward_block(struct model *m, int layer, const float *block)
{
    FSDP_TRY(check_layer(m, layer));
    return model_core_forward_block(m, layer, block);
}

int model_forward_head(struct model *m, const float *root, float dloss)
{
    return model_core_forward_head(m, root, dloss);
}

int model_take_loss(struct model *m, double *sum)
{
    return model_core_take_loss(m, sum);
}

int model_move_loss(struct model *m, double *dst)
{
    return model_core_move_loss(m, dst);
}

int model_backward_head(struct model *m, const float *root, float *root_grads)
{
    return model_core_backward_head(m, root, root_grads);
}

int model_backward_block(struct model *m, int layer, const float *block, float *block_grads)
{
    FSDP_TRY(check_layer(m, layer));
    return model_core_backward_block(m, layer, block, block_grads);
}

int model_backward_embed(struct model *m, const float *root, float *root_grads)
{
    return model_core_backward_embed(m, root, root_grads);
}

const float *model_logits(const struct model *m)
{
    if (m->act_dtype != DTYPE_F32) { /* bf16 elements: a reader of floats would misread them */
        error_set(FSDP_EINVAL, "model: the logits are stored in %s (model_set_compute_dtype), not fp32",
                  dtype_name(m->act_dtype));
        return NULL;
    }
    return model_core_logits(m);
}

static int forward_all(struct model *m, const float *params, float dloss, float *loss)
{
    const struct model_layout *l = &m->layout;
    FSDP_TRY(model_forward_embed(m, params + l->units[0].offset));
    for (int i = 0; i < l->config.n_layer; i++)
        FSDP_TRY(model_forward_block(m, i, params + l->units[1 + i].offset));
    double sum = 0;
    FSDP_TRY(model_forward_head(m, params + l->units[0].offset, dloss));
    FSDP_TRY(model_take_loss(m, &sum));
    if (loss)
        *loss = m->n_valid ? (float)(sum / m->n_valid) : 0.0f;
    return 0;
}

int model_forward(struct model *m, const float *params, float *loss)
{
    return forward_all(m, params, 0.0f, loss);
}

int model_forward_backward(struct model *m, const float *params, float *grads, float *loss)
{
    const struct model_layout *l = &m->layout;
    /* No valid target: the loss is 0 and so is every gradient; skip the work. */
    if (m->batch_set && m->n_valid == 0) {
        if (loss)
            *loss = 0;
        return 0;
    }
    FSDP_TRY(forward_all(m, params, 1.0f / (float)(m->n_valid ? m->n_valid : 1), loss));
    const float *root = params + l->units[0].offset;
    float *groot = grads + l->units[0].offset;
    FSDP_TRY(model_backward_head(m, root, groot));
    for (int i = l->config.n_layer - 1; i >= 0; i--)
        FSDP_TRY(model_backward_block(m, i, params + l->units[1 + i].offset, grads + l->units[1 + i].offset));
    return model_backward_embed(m, root, groot);
}
