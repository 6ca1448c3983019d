/* The decoder core every family shares (model_internal.h, struct model_decoder): the activation arena and
 * its carving, the token embedding (and a learned position table where the family has one), the residual
 * stream x_0..x_L, activation checkpointing, the final norm, the LM head (tied or untied: one matrix of the
 * root unit either way) and the fused softmax cross-entropy. A family brings its block: its activations,
 * its scratch, its forward and backward, and a setup step after carving (Llama's rotary table).
 *
 * Arena order: tokens, targets, the loss accumulator, the family's persistent tensors, x_0..x_L, the block activations (L sets,
 * or one with checkpointing: then only the residual stream is kept and a block's activations are recomputed
 * from x_i right before its backward, with the same kernels in the same order, so gradients are
 * bit-identical), the head (normed x_L, its statistics, logits), dres / tmp / dln, the family's scratch,
 * attention's workspace. */
#include <stdalign.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "worker/model/model_internal.h"

/* Sizing passes hand the family a scratch struct to write its pointers into: large enough for any family's. */
#define MODEL_FAMILY_STRUCT_MAX 512

void *model_carve(struct model_carver *c, size_t bytes)
{
    void *p = c->base ? c->base + c->off : NULL;
    c->off += (bytes + 63) & ~(size_t)63; /* 64-byte aligned like mem_alloc */
    return p;
}

float *model_carve_act(struct model_carver *c, size_t n)
{
    void *p = c->act_base ? c->act_base + c->act_off : NULL;
    c->act_off += (n * c->act_elem + 63) & ~(size_t)63;
    return p;
}

/* Walks the arena: with base == NULL only the sizes are computed (into throwaway structs), so sizing and
 * carving cannot disagree. cfg is resolved (the family's derived values filled in). The activation region
 * starts at act_base (NULL while sizing), its elements act_elem bytes; *act_bytes gets its size. */
static size_t plan(const struct model_decoder *d, const struct model_config *cfg, int b, int t, bool ckpt,
                   const struct kernels *k, char *base, char *act_base, size_t act_elem, size_t *act_bytes,
                   struct model_core *s, int32_t **tokens, int32_t **targets)
{
    struct model_carver c = {base, 0, act_base, 0, act_elem};
    size_t N = (size_t)b * t, C = (size_t)cfg->n_embd, L = (size_t)cfg->n_layer, F = sizeof(float);
    size_t vp = (size_t)(cfg->vocab_size + MODEL_VOCAB_ALIGN - 1) / MODEL_VOCAB_ALIGN * MODEL_VOCAB_ALIGN;
    struct model_core dummy;
    alignas(max_align_t) char dummy_fam[MODEL_FAMILY_STRUCT_MAX], dummy_acts[MODEL_FAMILY_STRUCT_MAX];
    if (!base)
        s = &dummy;
    void *fam = base ? s->fam : dummy_fam;
    int32_t *tk = model_carve(&c, N * sizeof(int32_t)), *tg = model_carve(&c, N * sizeof(int32_t));
    if (tokens) {
        *tokens = tk;
        *targets = tg;
    }
    double *acc = model_carve(&c, sizeof(double));
    if (base)
        s->loss_acc = acc;
    if (d->plan_persistent)
        d->plan_persistent(cfg, b, t, &c, fam);
    s->resid = model_carve(&c, (L + 1) * N * C * F);
    size_t nacts = ckpt ? 1 : L;
    for (size_t i = 0; i < nacts; i++)
        d->plan_acts(cfg, b, t, &c, base ? s->acts + i * d->acts_size : dummy_acts);
    s->hn = model_carve_act(&c, N * C);
    s->hn_mean = d->norm == MODEL_NORM_LAYER ? model_carve(&c, N * F) : NULL;
    s->hn_rstd = model_carve(&c, N * F);
    s->logits = model_carve_act(&c, N * vp); /* bf16 with bf16 activations, as autocast's and llm.c's */
    s->dres = model_carve(&c, N * C * F);
    s->tmp = model_carve(&c, N * C * F);
    s->dln = model_carve(&c, N * C * F);
    d->plan_scratch(cfg, b, t, &c, fam);
    /* k NULL: context-parallel attention (model_cp.c), which needs no workspace of attention_forward's */
    int nkv = d->grouped_query && cfg->n_kv_head > 0 ? cfg->n_kv_head : cfg->n_head;
    int qw = cfg->n_head * model_head_dim(cfg); /* the attention's width: n_head heads of head_dim */
    s->attn_ws = model_carve(&c, k ? k->attention_workspace_bytes(b, t, qw, cfg->n_head, nkv) : 0);
    *act_bytes = c.act_off;
    return c.off;
}

size_t model_core_arena_bytes(const struct model_family *f, const struct model_config *cfg, int b, int t,
                              bool ckpt, const struct kernels *k)
{
    struct model_config r = *cfg;
    if (f->resolve)
        f->resolve(&r);
    size_t act;
    return plan(f->decoder, &r, b, t, ckpt, k, NULL, NULL, sizeof(float), &act, NULL, NULL, NULL) + act;
}

static void core_free(struct model *m, struct model_core *s)
{
    if (s->act_bound)
        m->k->act_unbind(s->act_region);
    if (s->arena)
        m->k->mem_free(s->arena);
    free(s->acts);
    free(s->fam);
    free(s);
}

int model_core_create(struct model *m)
{
    const struct model_decoder *d = m->decoder;
    const struct model_config *cfg = &m->layout.config;
    bool ckpt = cfg->activation_checkpointing;
    struct model_core *s = calloc(1, sizeof *s);
    if (s) {
        s->acts = calloc(ckpt ? 1 : (size_t)cfg->n_layer, d->acts_size);
        s->fam = calloc(1, d->fam_size);
    }
    if (!s || !s->acts || !s->fam) {
        if (s)
            core_free(m, s);
        return error_set(FSDP_ENOMEM, "out of memory");
    }
    s->ckpt = ckpt;
    const struct kernels *ws = m->cp.size > 1 ? NULL : m->k;
    size_t act_elem = dtype_size(m->act_dtype), act_bytes;
    size_t main_bytes = plan(d, cfg, m->b, m->t, ckpt, ws, NULL, NULL, act_elem, &act_bytes, NULL, NULL, NULL);
    m->arena_bytes = main_bytes + act_bytes;
    s->arena = m->k->mem_alloc(m->arena_bytes);
    if (!s->arena) {
        core_free(m, s);
        return error_set(FSDP_ENOMEM, "model: cannot allocate the %zu-byte activation arena (batch %d x %d)%s",
                         m->arena_bytes, m->b, m->t, ckpt ? "" : "; activation_checkpointing = true needs less");
    }
    s->act_region = (char *)s->arena + main_bytes;
    plan(d, cfg, m->b, m->t, ckpt, ws, s->arena, s->act_region, act_elem, &act_bytes, s, &m->tokens, &m->targets);
    m->family = s;
    int rc = 0;
    if (m->act_dtype != DTYPE_F32) { /* the ops read and write the region's tensors in that dtype */
        rc = m->k->act_bind(s->act_region, act_bytes, m->act_dtype);
        s->act_bound = rc == 0;
    }
    if (rc == 0)
        rc = m->k->mem_set(s->loss_acc, 0, sizeof *s->loss_acc);
    if (rc == 0 && d->setup)
        rc = d->setup(m);
    if (rc) {
        core_free(m, s);
        m->family = NULL;
    }
    return rc;
}

void model_core_destroy(struct model *m)
{
    struct model_core *s = m->family;
    if (!s)
        return;
    core_free(m, s);
    m->family = NULL;
}

void *model_core_acts(const struct model *m, int layer)
{
    const struct model_core *s = m->family;
    return s->acts + (s->ckpt ? 0 : (size_t)layer) * m->decoder->acts_size;
}

int model_core_forward_embed(struct model *m, const float *root)
{
    struct model_core *s = m->family;
    const struct model_decoder *d = m->decoder;
    const struct model_config *c = &m->layout.config;
    s->head_grad_ready = false;
    s->pend = false; /* a new forward: an add left by one that stopped early is stale */
    const float *wte = model_unit_param(m, 0, root, d->root_embed);
    const float *wpe = d->root_pos >= 0 ? model_unit_param(m, 0, root, d->root_pos) : NULL;
    /* A position table is read at global positions: this rank's chunks with context parallelism. */
    if (wpe && m->cp.size > 1)
        return model_cp_embedding_forward(m, s->resid, wte, wpe);
    return m->k->embedding_forward(s->resid, m->tokens, wte, wpe, m->b, m->t, c->n_embd, c->vocab_size);
}

int model_core_forward_block(struct model *m, int layer, const float *w)
{
    return m->decoder->block_forward(m, layer, w, model_core_acts(m, layer));
}

static bool has_fused_norm(const struct kernels *k, enum model_norm kind)
{
    return kind == MODEL_NORM_LAYER ? k->residual_layernorm_forward != NULL : k->residual_rmsnorm_forward != NULL;
}

/* The pending add on its own (residual_forward), for a forward step that cannot take it in its norm. */
static int pending_flush(struct model *m)
{
    struct model_core *s = m->family;
    size_t NC = (size_t)m->b * m->t * m->layout.config.n_embd;
    s->pend = false;
    return m->k->residual_forward(s->resid + (size_t)s->pend_layer * NC, s->pend_a, s->pend_b, NC);
}

/* The norm of x_layer into out, the pending add first: in the same call where the table fuses them and the
 * add is x_layer's, else as residual_forward before the norm (a forward step run out of order). */
static int input_norm(struct model *m, int layer, enum model_norm kind, float *out, float *mean, float *rstd,
                      const float *w, const float *b, float eps)
{
    struct model_core *s = m->family;
    const struct kernels *k = m->k;
    int N = m->b * m->t, C = m->layout.config.n_embd;
    float *x = s->resid + (size_t)layer * N * C;
    if (s->pend && (s->pend_layer != layer || !has_fused_norm(k, kind)))
        FSDP_TRY(pending_flush(m));
    if (s->pend) {
        s->pend = false;
        if (kind == MODEL_NORM_LAYER)
            return k->residual_layernorm_forward(x, out, mean, rstd, s->pend_a, s->pend_b, w, b, N, C, eps);
        return k->residual_rmsnorm_forward(x, out, rstd, s->pend_a, s->pend_b, w, N, C, eps);
    }
    if (kind == MODEL_NORM_LAYER)
        return k->layernorm_forward(out, mean, rstd, x, w, b, N, C, eps);
    return k->rmsnorm_forward(out, rstd, x, w, N, C, eps);
}

int model_block_input_norm(struct model *m, int layer, float *out, float *mean, float *rstd, const float *w,
                           const float *b, float eps)
{
    return input_norm(m, layer, m->decoder->block_norm, out, mean, rstd, w, b, eps);
}

int model_block_output(struct model *m, int layer, const float *xmid, const float *branch)
{
    struct model_core *s = m->family;
    const struct model_config *c = &m->layout.config;
    size_t NC = (size_t)m->b * m->t * c->n_embd;
    /* backward reads x_layer only, and x_layer+1 is what the forward wrote: no add, and none left pending
     * (backward overwrites the branch's scratch) */
    if (s->recompute)
        return 0;
    enum model_norm next = layer + 1 < c->n_layer ? m->decoder->block_norm : m->decoder->norm;
    if (!has_fused_norm(m->k, next))
        return m->k->residual_forward(s->resid + (size_t)(layer + 1) * NC, xmid, branch, NC);
    s->pend = true;
    s->pend_layer = layer + 1;
    s->pend_a = xmid;
    s->pend_b = branch;
    return 0;
}

static int norm_forward(struct model *m, const float *root)
{
    const struct model_core *s = m->family;
    const struct model_decoder *d = m->decoder;
    const struct model_config *c = &m->layout.config;
    const float *w = model_unit_param(m, 0, root, d->root_norm_w);
    const float *b = d->norm == MODEL_NORM_LAYER ? model_unit_param(m, 0, root, d->root_norm_b) : NULL;
    return input_norm(m, c->n_layer, d->norm, s->hn, s->hn_mean, s->hn_rstd, w, b, d->norm_eps(c));
}

int model_core_forward_head(struct model *m, const float *root, float dloss)
{
    struct model_core *s = m->family;
    const struct kernels *k = m->k;
    const struct model_config *c = &m->layout.config;
    int N = m->b * m->t, C = c->n_embd, vp = m->layout.vocab_padded;
    FSDP_TRY(norm_forward(m, root));
    /* logits = hn W^T, W (vocab_padded, C): the untied head or the tied embedding */
    FSDP_TRY(k->gemm(0, 1, N, vp, C, 1.0f, s->hn, C, model_unit_param(m, 0, root, m->decoder->root_head(c)), C, 0.0f,
                     s->logits, vp));
    /* With dloss the logits are overwritten in place by their gradient: the (N, Vp) matrix is the largest
     * activation and a second copy would double it. The loss is added on the device (no host round trip
     * between this forward and its backward). */
    FSDP_TRY(k->crossentropy_forward_backward(NULL, s->loss_acc, dloss != 0 ? s->logits : NULL, s->logits,
                                              m->targets, N, c->vocab_size, vp, dloss));
    s->head_grad_ready = dloss != 0;
    return 0;
}

int model_core_take_loss(struct model *m, double *sum)
{
    struct model_core *s = m->family;
    double v = 0;
    /* the read waits for the device: the one synchronisation a step's loss costs */
    FSDP_TRY(m->k->mem_copy(&v, s->loss_acc, sizeof v, KERNELS_COPY_D2H));
    FSDP_TRY(m->k->mem_set(s->loss_acc, 0, sizeof *s->loss_acc));
    *sum = v;
    return 0;
}

int model_core_move_loss(struct model *m, double *dst)
{
    struct model_core *s = m->family;
    FSDP_TRY(m->k->mem_copy(dst, s->loss_acc, sizeof *dst, KERNELS_COPY_D2D));
    return m->k->mem_set(s->loss_acc, 0, sizeof *s->loss_acc);
}

int model_operand_hold(const struct kernels *k, const float *x, size_t n)
{
    return k->lowp_hold ? k->lowp_hold(x, n) : 0;
}

void model_operand_release(const struct kernels *k, const float *x)
{
    if (k->lowp_release)
        k->lowp_release(x);
}

int model_core_backward_head(struct model *m, const float *root, float *g)
{
    struct model_core *s = m->family;
    const struct kernels *k = m->k;
    const struct model_decoder *d = m->decoder;
    const struct model_config *c = &m->layout.config;
    int N = m->b * m->t, C = c->n_embd, vp = m->layout.vocab_padded, h = d->root_head(c);
    size_t NC = (size_t)N * C;
    if (!s->head_grad_ready)
        return error_set(FSDP_EINVAL, "model: backward_head needs a forward_head with dloss != 0 first");
    s->head_grad_ready = false;
    const float *x = s->resid + (size_t)c->n_layer * NC;
    /* dhn = dlogits W; dW += dlogits^T hn. Both products read dlogits, which the table may prepare once for
     * the two (lowp_hold). */
    int rc = 0;
    FSDP_TRY(model_operand_hold(k, s->logits, (size_t)N * vp));
    FSDP_TRY_GOTO(k->gemm(0, 0, N, C, vp, 1.0f, s->logits, vp, model_unit_param(m, 0, root, h), C, 0.0f, s->dln, C),
                  rc, out);
    if (g)
        FSDP_TRY_GOTO(k->gemm(1, 0, vp, C, N, 1.0f, s->logits, vp, s->hn, C, 1.0f, model_unit_grad(m, 0, g, h), C), rc,
                      out);
out:
    model_operand_release(k, s->logits);
    if (rc)
        return rc;
    FSDP_TRY(k->mem_set(s->dres, 0, NC * sizeof(float)));
    const float *w = model_unit_param(m, 0, root, d->root_norm_w);
    if (d->norm == MODEL_NORM_LAYER)
        return k->layernorm_backward(s->dres, model_unit_grad(m, 0, g, d->root_norm_w),
                                     model_unit_grad(m, 0, g, d->root_norm_b), s->dln, x, w, s->hn_mean, s->hn_rstd, N,
                                     C);
    return k->rmsnorm_backward(s->dres, model_unit_grad(m, 0, g, d->root_norm_w), s->dln, x, w, s->hn_rstd, N, C);
}

int model_core_backward_block(struct model *m, int layer, const float *w, float *g)
{
    struct model_core *s = m->family;
    s->pend = false; /* the forward's adds were taken by its steps; backward reuses their scratch */
    if (s->ckpt) { /* recompute this block's activations from x_layer */
        s->recompute = true;
        int rc = m->decoder->block_forward(m, layer, w, model_core_acts(m, layer));
        s->recompute = false;
        FSDP_TRY(rc);
    }
    return m->decoder->block_backward(m, layer, w, g, model_core_acts(m, layer));
}

int model_core_backward_embed(struct model *m, const float *root, float *g)
{
    (void)root;
    struct model_core *s = m->family;
    const struct model_decoder *d = m->decoder;
    const struct model_config *c = &m->layout.config;
    if (!g)
        return 0;
    float *dwte = model_unit_grad(m, 0, g, d->root_embed);
    float *dwpe = d->root_pos >= 0 ? model_unit_grad(m, 0, g, d->root_pos) : NULL;
    if (dwpe && m->cp.size > 1)
        return model_cp_embedding_backward(m, dwte, dwpe, s->dres);
    return m->k->embedding_backward(dwte, dwpe, s->dres, m->tokens, m->b, m->t, c->n_embd, c->vocab_size);
}

const float *model_core_logits(const struct model *m)
{
    return ((const struct model_core *)m->family)->logits;
}
