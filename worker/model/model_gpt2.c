/* GPT-2 forward and backward per FSDP unit over the kernels table, and its activation arena.
 *
 * Block (pre-LayerNorm): x_mid = x + c_proj(attn(c_attn(ln_1(x)))); y = x_mid + mlp.c_proj(gelu(c_fc(ln_2(x_mid)))).
 * Head: logits = ln_f(x_L) wte^T (LM head tied to wte), fused softmax cross-entropy.
 * The arena keeps the residual stream x_0..x_L and, per block, what backward reads; with activation
 * checkpointing only the residual stream is kept and one block's activations are recomputed from x_i
 * right before its backward, with the same kernels in the same order, so gradients are bit-identical. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "worker/model/model_internal.h"

#define LN_EPS 1e-5f

struct gpt2_acts {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *xmid, *ln2, *ln2_mean, *ln2_rstd, *fc, *fcg;
};

struct gpt2_state {
    void *arena;
    float *resid; /* (L + 1) x (N, C): block inputs, then the last block's output */
    struct gpt2_acts *acts; /* L sets, or 1 with checkpointing */
    float *lnf, *lnf_mean, *lnf_rstd, *logits;
    float *dres;             /* (N, C) gradient of the residual stream, flows from head to embeddings */
    float *tmp, *dln;        /* (N, C) scratch */
    float *dbig1, *dbig2;    /* (N, 4C) scratch */
    void *attn_ws;
    bool ckpt, head_grad_ready;
};

/* Index of each block tensor among a block unit's 12 parameters (model_gpt2_layout.c order). */
enum { LN1_W, LN1_B, ATTN_W, ATTN_B, APROJ_W, APROJ_B, LN2_W, LN2_B, FC_W, FC_B, MPROJ_W, MPROJ_B, N_BLOCK };
enum { WTE, WPE, LNF_W, LNF_B };

/* Walks the arena: with base == NULL only the size is computed, so sizing and carving cannot disagree. */
struct carver {
    char *base;
    size_t off;
};

static void *carve(struct carver *c, size_t bytes)
{
    void *p = c->base ? c->base + c->off : NULL;
    c->off += (bytes + 63) & ~(size_t)63; /* 64-byte aligned like mem_alloc */
    return p;
}

static size_t plan(const struct model_config *cfg, int b, int t, bool ckpt, const struct kernels *k,
                   char *base, struct gpt2_state *s, int32_t **tokens, int32_t **targets)
{
    struct carver c = {base, 0};
    size_t N = (size_t)b * t, C = (size_t)cfg->n_embd, L = (size_t)cfg->n_layer, F = sizeof(float);
    size_t vp = (size_t)(cfg->vocab_size + MODEL_VOCAB_ALIGN - 1) / MODEL_VOCAB_ALIGN * MODEL_VOCAB_ALIGN;
    struct gpt2_state dummy;
    struct gpt2_acts dummy_acts;
    if (!s)
        s = &dummy;
    int32_t *tk = carve(&c, N * sizeof(int32_t)), *tg = carve(&c, N * sizeof(int32_t));
    if (tokens) {
        *tokens = tk;
        *targets = tg;
    }
    s->resid = carve(&c, (L + 1) * N * C * F);
    size_t nacts = ckpt ? 1 : L;
    for (size_t i = 0; i < nacts; i++) {
        struct gpt2_acts *a = base ? &s->acts[i] : &dummy_acts;
        a->ln1 = carve(&c, N * C * F);
        a->ln1_mean = carve(&c, N * F);
        a->ln1_rstd = carve(&c, N * F);
        a->qkv = carve(&c, 3 * N * C * F);
        a->atty = carve(&c, N * C * F);
        a->lse = carve(&c, N * (size_t)cfg->n_head * F);
        a->xmid = carve(&c, N * C * F);
        a->ln2 = carve(&c, N * C * F);
        a->ln2_mean = carve(&c, N * F);
        a->ln2_rstd = carve(&c, N * F);
        a->fc = carve(&c, 4 * N * C * F);
        a->fcg = carve(&c, 4 * N * C * F);
    }
    s->lnf = carve(&c, N * C * F);
    s->lnf_mean = carve(&c, N * F);
    s->lnf_rstd = carve(&c, N * F);
    s->logits = carve(&c, N * vp * F);
    s->dres = carve(&c, N * C * F);
    s->tmp = carve(&c, N * C * F);
    s->dln = carve(&c, N * C * F);
    s->dbig1 = carve(&c, 4 * N * C * F);
    s->dbig2 = carve(&c, 4 * N * C * F);
    /* k NULL: context-parallel attention (model_cp.c), which needs no workspace of attention_forward's */
    s->attn_ws = carve(&c, k ? k->attention_workspace_bytes(b, t, cfg->n_embd, cfg->n_head, cfg->n_head) : 0);
    return c.off;
}

static size_t gpt2_arena_bytes(const struct model_config *cfg, int b, int t, bool ckpt, const struct kernels *k)
{
    return plan(cfg, b, t, ckpt, k, NULL, NULL, NULL, NULL);
}

static int gpt2_create(struct model *m)
{
    const struct model_config *cfg = &m->layout.config;
    struct gpt2_state *s = calloc(1, sizeof *s);
    bool ckpt = cfg->activation_checkpointing;
    if (!s)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    if (!(s->acts = calloc(ckpt ? 1 : (size_t)cfg->n_layer, sizeof *s->acts))) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto fail;
    }
    s->ckpt = ckpt;
    const struct kernels *ws = m->cp.size > 1 ? NULL : m->k;
    m->arena_bytes = plan(cfg, m->b, m->t, ckpt, ws, NULL, NULL, NULL, NULL);
    s->arena = m->k->mem_alloc(m->arena_bytes);
    if (!s->arena) {
        rc = error_set(FSDP_ENOMEM, "model: cannot allocate the %zu-byte activation arena (batch %d x %d)%s",
                       m->arena_bytes, m->b, m->t, ckpt ? "" : "; activation_checkpointing = true needs less");
        goto fail;
    }
    plan(cfg, m->b, m->t, ckpt, ws, s->arena, s, &m->tokens, &m->targets);
    m->family = s;
    return 0;
fail:
    free(s->acts);
    free(s);
    return rc;
}

static void gpt2_destroy(struct model *m)
{
    struct gpt2_state *s = m->family;
    if (!s)
        return;
    m->k->mem_free(s->arena);
    free(s->acts);
    free(s);
    m->family = NULL;
}

/* Pointer to tensor idx of a unit's buffer, using that unit's offsets (all blocks share one layout). */
static const float *up(const struct model *m, int unit, const float *buf, int idx)
{
    const struct model_unit *u = &m->layout.units[unit];
    return buf + m->layout.params[u->first_param + idx].unit_offset;
}

static float *upg(const struct model *m, int unit, float *buf, int idx)
{
    return buf ? buf + m->layout.params[m->layout.units[unit].first_param + idx].unit_offset : NULL;
}

static int gpt2_forward_embed(struct model *m, const float *root)
{
    struct gpt2_state *s = m->family;
    const struct model_config *c = &m->layout.config;
    s->head_grad_ready = false;
    if (m->cp.size > 1)
        return model_cp_embedding_forward(m, s->resid, up(m, 0, root, WTE), up(m, 0, root, WPE));
    return m->k->embedding_forward(s->resid, m->tokens, up(m, 0, root, WTE), up(m, 0, root, WPE), m->b, m->t,
                                   c->n_embd, c->vocab_size);
}

static int gpt2_forward_block(struct model *m, int layer, const float *w)
{
    struct gpt2_state *s = m->family;
    const struct kernels *k = m->k;
    const struct model_config *c = &m->layout.config;
    int N = m->b * m->t, C = c->n_embd, u = 1 + layer;
    size_t NC = (size_t)N * C;
    struct gpt2_acts *a = &s->acts[s->ckpt ? 0 : layer];
    const float *x = s->resid + (size_t)layer * NC;
    float *y = s->resid + (size_t)(layer + 1) * NC;
    FSDP_TRY(k->layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, up(m, u, w, LN1_W), up(m, u, w, LN1_B), N, C,
                             LN_EPS));
    FSDP_TRY(k->matmul_forward(a->qkv, a->ln1, up(m, u, w, ATTN_W), up(m, u, w, ATTN_B), N, C, 3 * C));
    if (m->cp.size > 1)
        FSDP_TRY(model_cp_attention_forward(m, a->atty, a->lse, a->qkv));
    else
        FSDP_TRY(k->attention_forward(a->atty, a->lse, a->qkv, m->b, m->t, C, c->n_head, c->n_head, s->attn_ws));
    FSDP_TRY(k->matmul_forward(s->tmp, a->atty, up(m, u, w, APROJ_W), up(m, u, w, APROJ_B), N, C, C));
    FSDP_TRY(k->residual_forward(a->xmid, x, s->tmp, NC));
    FSDP_TRY(k->layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->xmid, up(m, u, w, LN2_W), up(m, u, w, LN2_B),
                             N, C, LN_EPS));
    FSDP_TRY(k->matmul_forward(a->fc, a->ln2, up(m, u, w, FC_W), up(m, u, w, FC_B), N, C, 4 * C));
    FSDP_TRY(k->gelu_forward(a->fcg, a->fc, 4 * NC));
    FSDP_TRY(k->matmul_forward(s->tmp, a->fcg, up(m, u, w, MPROJ_W), up(m, u, w, MPROJ_B), N, 4 * C, C));
    return k->residual_forward(y, a->xmid, s->tmp, NC);
}

static int gpt2_forward_head(struct model *m, const float *root, float dloss, double *loss_sum)
{
    struct gpt2_state *s = m->family;
    const struct kernels *k = m->k;
    const struct model_config *c = &m->layout.config;
    int N = m->b * m->t, C = c->n_embd, vp = m->layout.vocab_padded;
    const float *x = s->resid + (size_t)c->n_layer * N * C;
    FSDP_TRY(k->layernorm_forward(s->lnf, s->lnf_mean, s->lnf_rstd, x, up(m, 0, root, LNF_W), up(m, 0, root, LNF_B),
                             N, C, LN_EPS));
    FSDP_TRY(k->gemm(0, 1, N, vp, C, 1.0f, s->lnf, C, up(m, 0, root, WTE), C, 0.0f, s->logits, vp));
    double sum = 0;
    /* With dloss the logits are overwritten in place by their gradient: the (N, Vp) matrix is the
     * largest activation and a second copy would double it. */
    FSDP_TRY(k->crossentropy_forward_backward(NULL, &sum, dloss != 0 ? s->logits : NULL, s->logits, m->targets, N,
                                         c->vocab_size, vp, dloss));
    s->head_grad_ready = dloss != 0;
    if (loss_sum)
        *loss_sum = sum;
    return 0;
}

/* An operand that two products read in a row and nothing writes in between: a table that computes in a
 * 16-bit dtype may round it once for both (kernels.h, lowp_hold); tables without the entry round per product. */
static int operand_hold(const struct kernels *k, const float *x, size_t n)
{
    return k->lowp_hold ? k->lowp_hold(x, n) : 0;
}

static void operand_release(const struct kernels *k, const float *x)
{
    if (k->lowp_release)
        k->lowp_release(x);
}

static int gpt2_backward_head(struct model *m, const float *root, float *g)
{
    struct gpt2_state *s = m->family;
    const struct kernels *k = m->k;
    const struct model_config *c = &m->layout.config;
    int N = m->b * m->t, C = c->n_embd, vp = m->layout.vocab_padded;
    size_t NC = (size_t)N * C;
    if (!s->head_grad_ready)
        return error_set(FSDP_EINVAL, "model: backward_head needs a forward_head with dloss != 0 first");
    s->head_grad_ready = false;
    const float *x = s->resid + (size_t)c->n_layer * NC;
    /* dlnf = dlogits wte; dwte += dlogits^T lnf (the tied LM head's share of wte's gradient). Both products
     * read dlogits, which the table may prepare once for the two (lowp_hold). */
    int rc = 0;
    FSDP_TRY(operand_hold(k, s->logits, (size_t)N * vp));
    FSDP_TRY_GOTO(k->gemm(0, 0, N, C, vp, 1.0f, s->logits, vp, up(m, 0, root, WTE), C, 0.0f, s->dln, C), rc, out);
    if (g)
        FSDP_TRY_GOTO(k->gemm(1, 0, vp, C, N, 1.0f, s->logits, vp, s->lnf, C, 1.0f, upg(m, 0, g, WTE), C), rc, out);
out:
    operand_release(k, s->logits);
    if (rc)
        return rc;
    FSDP_TRY(k->mem_set(s->dres, 0, NC * sizeof(float)));
    return k->layernorm_backward(s->dres, upg(m, 0, g, LNF_W), upg(m, 0, g, LNF_B), s->dln, x,
                                 up(m, 0, root, LNF_W), s->lnf_mean, s->lnf_rstd, N, C);
}

/* A linear layer's backward with a fresh input gradient: the parameter gradients accumulated (+=) by
 * matmul_backward as usual, then dx = dy W^T written by gemm with beta 0 (no zeroing pass over a scratch
 * buffer that is about to be overwritten anyway); dy held for the two (matmul_backward first: it sums db in
 * the pass that rounds dy). */
static int linear_backward(const struct kernels *k, float *dx, float *dw, float *db, const float *dy,
                           const float *x, const float *w, int n, int in, int out)
{
    int rc = 0;
    FSDP_TRY(operand_hold(k, dy, (size_t)n * out));
    FSDP_TRY_GOTO(k->matmul_backward(NULL, dw, db, dy, x, w, n, in, out), rc, out);
    FSDP_TRY_GOTO(k->gemm(0, 1, n, in, out, 1.0f, dy, out, w, out, 0.0f, dx, in), rc, out);
out:
    operand_release(k, dy);
    return rc;
}

static int gpt2_backward_block(struct model *m, int layer, const float *w, float *g)
{
    struct gpt2_state *s = m->family;
    const struct kernels *k = m->k;
    const struct model_config *c = &m->layout.config;
    int N = m->b * m->t, C = c->n_embd, u = 1 + layer;
    size_t NC = (size_t)N * C, F = sizeof(float);
    if (s->ckpt)
        FSDP_TRY(gpt2_forward_block(m, layer, w));
    struct gpt2_acts *a = &s->acts[s->ckpt ? 0 : layer];
    const float *x = s->resid + (size_t)layer * NC;
    /* s->dres holds dL/dy on entry and dL/dx on return: the residual adds make it flow straight through,
     * and each layernorm backward adds its branch into it. */
    FSDP_TRY(linear_backward(k, s->dbig1, upg(m, u, g, MPROJ_W), upg(m, u, g, MPROJ_B), s->dres, a->fcg,
                        up(m, u, w, MPROJ_W), N, 4 * C, C));
    FSDP_TRY(k->mem_set(s->dbig2, 0, 4 * NC * F));
    FSDP_TRY(k->gelu_backward(s->dbig2, a->fc, s->dbig1, 4 * NC));
    FSDP_TRY(linear_backward(k, s->dln, upg(m, u, g, FC_W), upg(m, u, g, FC_B), s->dbig2, a->ln2, up(m, u, w, FC_W), N,
                        C, 4 * C));
    FSDP_TRY(k->layernorm_backward(s->dres, upg(m, u, g, LN2_W), upg(m, u, g, LN2_B), s->dln, a->xmid,
                              up(m, u, w, LN2_W), a->ln2_mean, a->ln2_rstd, N, C));
    FSDP_TRY(linear_backward(k, s->tmp, upg(m, u, g, APROJ_W), upg(m, u, g, APROJ_B), s->dres, a->atty,
                        up(m, u, w, APROJ_W), N, C, C));
    if (m->cp.size > 1) {
        FSDP_TRY(model_cp_attention_backward(m, s->dbig1, s->tmp, a->qkv, a->atty, a->lse));
    } else {
        FSDP_TRY(k->mem_set(s->dbig1, 0, 3 * NC * F));
        FSDP_TRY(k->attention_backward(s->dbig1, s->tmp, a->qkv, a->atty, a->lse, m->b, m->t, C, c->n_head,
                                       c->n_head, s->attn_ws));
    }
    FSDP_TRY(linear_backward(k, s->dln, upg(m, u, g, ATTN_W), upg(m, u, g, ATTN_B), s->dbig1, a->ln1,
                        up(m, u, w, ATTN_W), N, C, 3 * C));
    return k->layernorm_backward(s->dres, upg(m, u, g, LN1_W), upg(m, u, g, LN1_B), s->dln, x,
                                 up(m, u, w, LN1_W), a->ln1_mean, a->ln1_rstd, N, C);
}

static int gpt2_backward_embed(struct model *m, const float *root, float *g)
{
    (void)root;
    struct gpt2_state *s = m->family;
    const struct model_config *c = &m->layout.config;
    if (!g)
        return 0;
    if (m->cp.size > 1)
        return model_cp_embedding_backward(m, upg(m, 0, g, WTE), upg(m, 0, g, WPE), s->dres);
    return m->k->embedding_backward(upg(m, 0, g, WTE), upg(m, 0, g, WPE), s->dres, m->tokens, m->b, m->t,
                                    c->n_embd, c->vocab_size);
}

static const float *gpt2_logits(const struct model *m)
{
    return ((const struct gpt2_state *)m->family)->logits;
}

const struct model_ops model_gpt2_ops = {
    .create = gpt2_create,
    .destroy = gpt2_destroy,
    .arena_bytes = gpt2_arena_bytes,
    .forward_embed = gpt2_forward_embed,
    .forward_block = gpt2_forward_block,
    .forward_head = gpt2_forward_head,
    .backward_head = gpt2_backward_head,
    .backward_block = gpt2_backward_block,
    .backward_embed = gpt2_backward_embed,
    .logits = gpt2_logits,
};
