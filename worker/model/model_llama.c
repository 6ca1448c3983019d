/* Llama forward and backward per FSDP unit over the kernels table, and its activation arena.
 *
 * Block (pre-norm): h = rms(x) [input_layernorm]; qkv = h [q|k|v]_proj^T; rope on q and k;
 * x_mid = x + o_proj(attn(qkv)) (grouped-query causal attention);
 * y = x_mid + down_proj(silu(gate_proj(h2)) * up_proj(h2)), h2 = rms(x_mid) [post_attention_layernorm].
 * Head: logits = rms(x_L) [model.norm] W^T, W = lm_head or (tied) embed_tokens, fused softmax cross-entropy.
 * Linear weights are (out, in) as nn.Linear stores them, so every product is a gemm with a transposed
 * operand: y = x W^T, dx = dy W, dW += dy^T x.
 *
 * The arena keeps the residual stream x_0..x_L and, per block, what backward reads; with activation
 * checkpointing only the residual stream is kept and one block's activations are recomputed from x_i right
 * before its backward, with the same kernels in the same order, so gradients are bit-identical.
 *
 * Rotary positions are a device tensor (b*t int32, the global position of each row: i mod t,
 * or this rank's chunks' positions with context parallelism, model.h) read by the rope kernels
 * through a (block_size, hs) cos/sin table made once on the host with transformers' float32 arithmetic. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "worker/model/model_internal.h"

struct llama_acts {
    float *h1, *rstd1, *qkv, *att, *lse, *xmid, *h2, *rstd2, *gu, *act;
};

struct llama_state {
    void *arena;
    float *resid;            /* (L + 1) x (N, C): block inputs, then the last block's output */
    struct llama_acts *acts; /* L sets, or 1 with checkpointing */
    float *hf, *rstdf, *logits;
    float *dres;           /* (N, C) gradient of the residual stream, flows from head to embeddings */
    float *tmp, *dln;      /* (N, C) scratch */
    float *dact, *dwide;   /* (N, I) and (N, max(2I, qkv width)) scratch */
    int32_t *pos;          /* (N) rotary position of each row */
    float *freqs;          /* (block_size, hs) cos | sin */
    void *attn_ws;
    bool ckpt, head_grad_ready;
};

/* Index of each tensor among a block unit's 9 parameters and the root unit's (model_llama_layout.c). */
enum { Q_W, K_W, V_W, O_W, GATE_W, UP_W, DOWN_W, IN_NORM_W, POST_NORM_W, N_BLOCK };
enum { EMB_W, NORM_W, HEAD_W };

struct dims {
    int N, C, nh, nkv, hs, qkv, I, vp;
};

static struct dims dims_of(const struct model_config *c, int b, int t)
{
    struct dims d = {.N = b * t, .C = c->n_embd, .nh = c->n_head, .nkv = c->n_kv_head, .hs = c->n_embd / c->n_head,
                     .I = c->intermediate_size};
    d.qkv = (d.nh + 2 * d.nkv) * d.hs;
    d.vp = (c->vocab_size + MODEL_VOCAB_ALIGN - 1) / MODEL_VOCAB_ALIGN * MODEL_VOCAB_ALIGN;
    return d;
}

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

/* cfg must be resolved (n_kv_head and intermediate_size filled in, as layout.config is). */
static size_t plan(const struct model_config *cfg, int b, int t, bool ckpt, const struct kernels *k, char *base,
                   struct llama_state *s, int32_t **tokens, int32_t **targets)
{
    struct carver c = {base, 0};
    struct dims d = dims_of(cfg, b, t);
    size_t N = (size_t)d.N, C = (size_t)d.C, L = (size_t)cfg->n_layer, F = sizeof(float), I = (size_t)d.I;
    struct llama_state dummy;
    struct llama_acts dummy_acts;
    if (!s)
        s = &dummy;
    int32_t *tk = carve(&c, N * sizeof(int32_t)), *tg = carve(&c, N * sizeof(int32_t));
    if (tokens) {
        *tokens = tk;
        *targets = tg;
    }
    s->pos = carve(&c, N * sizeof(int32_t));
    s->freqs = carve(&c, (size_t)cfg->block_size * d.hs * F);
    s->resid = carve(&c, (L + 1) * N * C * F);
    size_t nacts = ckpt ? 1 : L;
    for (size_t i = 0; i < nacts; i++) {
        struct llama_acts *a = base ? &s->acts[i] : &dummy_acts;
        a->h1 = carve(&c, N * C * F);
        a->rstd1 = carve(&c, N * F);
        a->qkv = carve(&c, N * (size_t)d.qkv * F);
        a->att = carve(&c, N * C * F);
        a->lse = carve(&c, N * (size_t)d.nh * F);
        a->xmid = carve(&c, N * C * F);
        a->h2 = carve(&c, N * C * F);
        a->rstd2 = carve(&c, N * F);
        a->gu = carve(&c, 2 * N * I * F);
        a->act = carve(&c, N * I * F);
    }
    s->hf = carve(&c, N * C * F);
    s->rstdf = carve(&c, N * F);
    s->logits = carve(&c, N * (size_t)d.vp * F);
    s->dres = carve(&c, N * C * F);
    s->tmp = carve(&c, N * C * F);
    s->dln = carve(&c, N * C * F);
    s->dact = carve(&c, N * I * F);
    s->dwide = carve(&c, N * (2 * I > (size_t)d.qkv ? 2 * I : (size_t)d.qkv) * F);
    /* k NULL: context-parallel attention (model_cp.c), which needs no workspace of attention_forward's */
    s->attn_ws = carve(&c, k ? k->attention_workspace_bytes(b, t, d.C, d.nh, d.nkv) : 0);
    return c.off;
}

static size_t llama_arena_bytes(const struct model_config *cfg, int b, int t, bool ckpt, const struct kernels *k)
{
    struct model_config r = *cfg;
    model_llama_resolve(&r);
    return plan(&r, b, t, ckpt, k, NULL, NULL, NULL, NULL);
}

/* transformers' default rotary table in its float32 arithmetic: inv_freq_j = 1 / theta^(2j / hs) (a float
 * power), angle = float(p) * inv_freq_j rounded to float, then cos and sin of that float. */
static void rope_table(float *host, int npos, int hs, float theta)
{
    int half = hs / 2;
    for (int j = 0; j < half; j++) {
        float e = (float)(2 * j) / (float)hs;
        float inv = 1.0f / (float)pow((double)theta, (double)e);
        for (int p = 0; p < npos; p++) {
            float a = (float)p * inv;
            host[(size_t)p * hs + j] = (float)cos((double)a);
            host[(size_t)p * hs + half + j] = (float)sin((double)a);
        }
    }
}

static int fill_positions(struct model *m, struct llama_state *s)
{
    const struct model_config *cfg = &m->layout.config;
    int hs = cfg->n_embd / cfg->n_head, N = m->b * m->t;
    size_t tab = (size_t)cfg->block_size * hs;
    float *host = malloc(tab * sizeof *host);
    int32_t *pos = malloc((size_t)N * sizeof *pos);
    int rc = 0;
    if (!host || !pos) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    rope_table(host, cfg->block_size, hs, cfg->rope_theta);
    for (int i = 0; i < N; i++)
        pos[i] = model_position(m, i % m->t);
    FSDP_TRY_GOTO(m->k->mem_copy(s->freqs, host, tab * sizeof *host, KERNELS_COPY_H2D), rc, out);
    FSDP_TRY_GOTO(m->k->mem_copy(s->pos, pos, (size_t)N * sizeof *pos, KERNELS_COPY_H2D), rc, out);
out:
    free(host);
    free(pos);
    return rc;
}

static int llama_create(struct model *m)
{
    const struct model_config *cfg = &m->layout.config;
    struct llama_state *s = calloc(1, sizeof *s);
    bool ckpt = cfg->activation_checkpointing;
    if (s)
        s->acts = calloc(ckpt ? 1 : (size_t)cfg->n_layer, sizeof *s->acts);
    if (!s || !s->acts) {
        if (s)
            free(s->acts);
        free(s);
        return error_set(FSDP_ENOMEM, "out of memory");
    }
    s->ckpt = ckpt;
    const struct kernels *ws = m->cp.size > 1 ? NULL : m->k;
    m->arena_bytes = plan(cfg, m->b, m->t, ckpt, ws, NULL, NULL, NULL, NULL);
    s->arena = m->k->mem_alloc(m->arena_bytes);
    if (!s->arena) {
        free(s->acts);
        free(s);
        return error_set(FSDP_ENOMEM, "model: cannot allocate the %zu-byte activation arena (batch %d x %d)%s",
                         m->arena_bytes, m->b, m->t, ckpt ? "" : "; activation_checkpointing = true needs less");
    }
    plan(cfg, m->b, m->t, ckpt, ws, s->arena, s, &m->tokens, &m->targets);
    m->family = s;
    int rc = fill_positions(m, s);
    if (rc) {
        m->k->mem_free(s->arena);
        free(s->acts);
        free(s);
        m->family = NULL;
    }
    return rc;
}

static void llama_destroy(struct model *m)
{
    struct llama_state *s = m->family;
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

/* The LM head's weight: lm_head, or embed_tokens when tied. */
static int head_index(const struct model *m)
{
    return m->layout.config.tie_word_embeddings ? EMB_W : HEAD_W;
}

/* y(n, out) = x(n, in) W(out, in)^T */
static int linear_forward(const struct kernels *k, float *y, const float *x, const float *w, int n, int in, int out)
{
    return k->gemm(0, 1, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

/* dx(n, in) = dy W (fresh, beta 0: no zeroing pass first); dW(out, in) += dy^T x when dw is not NULL. */
static int linear_backward(const struct kernels *k, float *dx, float *dw, const float *dy, const float *x,
                           const float *w, int n, int in, int out)
{
    FSDP_TRY(k->gemm(0, 0, n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in));
    return dw ? k->gemm(1, 0, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in) : 0;
}

static int llama_forward_embed(struct model *m, const float *root)
{
    struct llama_state *s = m->family;
    const struct model_config *c = &m->layout.config;
    s->head_grad_ready = false;
    return m->k->embedding_forward(s->resid, m->tokens, up(m, 0, root, EMB_W), NULL, m->b, m->t, c->n_embd,
                                   c->vocab_size);
}

static int llama_forward_block(struct model *m, int layer, const float *w)
{
    struct llama_state *s = m->family;
    const struct kernels *k = m->k;
    const struct model_config *c = &m->layout.config;
    struct dims d = dims_of(c, m->b, m->t);
    int N = d.N, C = d.C, u = 1 + layer;
    size_t NC = (size_t)N * C;
    struct llama_acts *a = &s->acts[s->ckpt ? 0 : layer];
    const float *x = s->resid + (size_t)layer * NC;
    float *y = s->resid + (size_t)(layer + 1) * NC;
    FSDP_TRY(k->rmsnorm_forward(a->h1, a->rstd1, x, up(m, u, w, IN_NORM_W), N, C, c->rms_norm_eps));
    /* q_proj, k_proj and v_proj are adjacent: one (qkv, C) matrix */
    FSDP_TRY(linear_forward(k, a->qkv, a->h1, up(m, u, w, Q_W), N, C, d.qkv));
    FSDP_TRY(k->rope_forward(a->qkv, N, d.qkv, d.nh + d.nkv, d.hs, s->pos, s->freqs, c->block_size));
    if (m->cp.size > 1)
        FSDP_TRY(model_cp_attention_forward(m, a->att, a->lse, a->qkv));
    else
        FSDP_TRY(k->attention_forward(a->att, a->lse, a->qkv, m->b, m->t, C, d.nh, d.nkv, s->attn_ws));
    FSDP_TRY(linear_forward(k, s->tmp, a->att, up(m, u, w, O_W), N, C, C));
    FSDP_TRY(k->residual_forward(a->xmid, x, s->tmp, NC));
    FSDP_TRY(k->rmsnorm_forward(a->h2, a->rstd2, a->xmid, up(m, u, w, POST_NORM_W), N, C, c->rms_norm_eps));
    /* gate_proj and up_proj are adjacent: one (2I, C) matrix giving [gate | up] rows */
    FSDP_TRY(linear_forward(k, a->gu, a->h2, up(m, u, w, GATE_W), N, C, 2 * d.I));
    FSDP_TRY(k->swiglu_forward(a->act, a->gu, N, d.I));
    FSDP_TRY(linear_forward(k, s->tmp, a->act, up(m, u, w, DOWN_W), N, d.I, C));
    return k->residual_forward(y, a->xmid, s->tmp, NC);
}

static int llama_forward_head(struct model *m, const float *root, float dloss, double *loss_sum)
{
    struct llama_state *s = m->family;
    const struct kernels *k = m->k;
    const struct model_config *c = &m->layout.config;
    int N = m->b * m->t, C = c->n_embd, vp = m->layout.vocab_padded;
    const float *x = s->resid + (size_t)c->n_layer * N * C;
    FSDP_TRY(k->rmsnorm_forward(s->hf, s->rstdf, x, up(m, 0, root, NORM_W), N, C, c->rms_norm_eps));
    FSDP_TRY(linear_forward(k, s->logits, s->hf, up(m, 0, root, head_index(m)), N, C, vp));
    double sum = 0;
    /* With dloss the logits are overwritten in place by their gradient: the (N, Vp) matrix is the largest
     * activation and a second copy would double it. */
    FSDP_TRY(k->crossentropy_forward_backward(NULL, &sum, dloss != 0 ? s->logits : NULL, s->logits, m->targets, N,
                                         c->vocab_size, vp, dloss));
    s->head_grad_ready = dloss != 0;
    if (loss_sum)
        *loss_sum = sum;
    return 0;
}

static int llama_backward_head(struct model *m, const float *root, float *g)
{
    struct llama_state *s = m->family;
    const struct kernels *k = m->k;
    const struct model_config *c = &m->layout.config;
    int N = m->b * m->t, C = c->n_embd, vp = m->layout.vocab_padded;
    size_t NC = (size_t)N * C;
    if (!s->head_grad_ready)
        return error_set(FSDP_EINVAL, "model: backward_head needs a forward_head with dloss != 0 first");
    s->head_grad_ready = false;
    const float *x = s->resid + (size_t)c->n_layer * NC;
    int h = head_index(m);
    FSDP_TRY(linear_backward(k, s->dln, upg(m, 0, g, h), s->logits, s->hf, up(m, 0, root, h), N, C, vp));
    FSDP_TRY(k->mem_set(s->dres, 0, NC * sizeof(float)));
    return k->rmsnorm_backward(s->dres, upg(m, 0, g, NORM_W), s->dln, x, up(m, 0, root, NORM_W), s->rstdf, N, C);
}

static int llama_backward_block(struct model *m, int layer, const float *w, float *g)
{
    struct llama_state *s = m->family;
    const struct kernels *k = m->k;
    const struct model_config *c = &m->layout.config;
    struct dims d = dims_of(c, m->b, m->t);
    int N = d.N, C = d.C, u = 1 + layer;
    size_t NC = (size_t)N * C, F = sizeof(float);
    if (s->ckpt)
        FSDP_TRY(llama_forward_block(m, layer, w));
    struct llama_acts *a = &s->acts[s->ckpt ? 0 : layer];
    const float *x = s->resid + (size_t)layer * NC;
    /* s->dres holds dL/dy on entry and dL/dx on return: the residual adds make it flow straight through,
     * and each norm's backward adds its branch into it. */
    FSDP_TRY(linear_backward(k, s->dact, upg(m, u, g, DOWN_W), s->dres, a->act, up(m, u, w, DOWN_W), N, d.I, C));
    FSDP_TRY(k->mem_set(s->dwide, 0, (size_t)N * 2 * d.I * F));
    FSDP_TRY(k->swiglu_backward(s->dwide, a->gu, s->dact, N, d.I));
    FSDP_TRY(linear_backward(k, s->dln, upg(m, u, g, GATE_W), s->dwide, a->h2, up(m, u, w, GATE_W), N, C, 2 * d.I));
    FSDP_TRY(k->rmsnorm_backward(s->dres, upg(m, u, g, POST_NORM_W), s->dln, a->xmid, up(m, u, w, POST_NORM_W), a->rstd2,
                            N, C));
    FSDP_TRY(linear_backward(k, s->tmp, upg(m, u, g, O_W), s->dres, a->att, up(m, u, w, O_W), N, C, C));
    if (m->cp.size > 1) {
        FSDP_TRY(model_cp_attention_backward(m, s->dwide, s->tmp, a->qkv, a->att, a->lse));
    } else {
        FSDP_TRY(k->mem_set(s->dwide, 0, (size_t)N * d.qkv * F));
        FSDP_TRY(k->attention_backward(s->dwide, s->tmp, a->qkv, a->att, a->lse, m->b, m->t, C, d.nh, d.nkv,
                                       s->attn_ws));
    }
    /* the gradient of q and k before rope: the transposed rotation */
    FSDP_TRY(k->rope_backward(s->dwide, N, d.qkv, d.nh + d.nkv, d.hs, s->pos, s->freqs, c->block_size));
    FSDP_TRY(linear_backward(k, s->dln, upg(m, u, g, Q_W), s->dwide, a->h1, up(m, u, w, Q_W), N, C, d.qkv));
    return k->rmsnorm_backward(s->dres, upg(m, u, g, IN_NORM_W), s->dln, x, up(m, u, w, IN_NORM_W), a->rstd1, N, C);
}

static int llama_backward_embed(struct model *m, const float *root, float *g)
{
    (void)root;
    struct llama_state *s = m->family;
    const struct model_config *c = &m->layout.config;
    if (!g)
        return 0;
    return m->k->embedding_backward(upg(m, 0, g, EMB_W), NULL, s->dres, m->tokens, m->b, m->t, c->n_embd,
                                    c->vocab_size);
}

static const float *llama_logits(const struct model *m)
{
    return ((const struct llama_state *)m->family)->logits;
}

const struct model_ops model_llama_ops = {
    .create = llama_create,
    .destroy = llama_destroy,
    .arena_bytes = llama_arena_bytes,
    .forward_embed = llama_forward_embed,
    .forward_block = llama_forward_block,
    .forward_head = llama_forward_head,
    .backward_head = llama_backward_head,
    .backward_block = llama_backward_block,
    .backward_embed = llama_backward_embed,
    .logits = llama_logits,
};
