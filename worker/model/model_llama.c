/* Llama's decoder block over the kernels table, on the shared core (model_core.c: embed_tokens, the residual
 * stream, model.norm, the LM head (lm_head, or embed_tokens when tied), the loss).
 *
 * Block (pre-norm): h = rms(x) [input_layernorm]; qkv = h [q|k|v]_proj^T; rope on q and k;
 * x_mid = x + o_proj(attn(qkv)) (grouped-query causal attention; sliding-window where the config sets a window,
 * Mistral's in every layer, Qwen2's from max_window_layers on);
 * y = x_mid + down_proj(silu(gate_proj(h2)) * up_proj(h2)), h2 = rms(x_mid) [post_attention_layernorm].
 * Linear weights are (out, in) as nn.Linear stores them, so every product is a gemm with a transposed
 * operand: y = x W^T, dx = dy W, dW += dy^T x.
 *
 * Rotary positions are a device tensor (b*t int32, the global position of each row: i mod t,
 * or this rank's chunks' positions with context parallelism, model.h) read by the rope kernels
 * through a (block_size, hs) cos/sin table made once on the host with transformers' float32 arithmetic. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "worker/model/model_internal.h"

/* h1, att, h2, gu and act: [act] tensors of the activation region (model_carve_act): the matmuls' operands,
 * att also read by attention's backward, gu (written by its matmul) by the SwiGLU's forward and backward. */
struct llama_acts {
    float *h1, *rstd1, *qkv, *att, *lse, *xmid, *h2, *rstd2, *gu, *act;
    float *qraw, *kraw, *qrstd, *krstd; /* q/k norm (qwen3): q and k before their norms, (N, Q) and (N, KV) */
};

/* Persistent: the rotary positions and table; scratch: the wide gradients. */
struct llama_state {
    float *ones;         /* (N) 1.0: adds the q/k/v biases and sums their gradients as GEMMs (qkv_bias) */
    int32_t *pos;        /* (N) rotary position of each row */
    float *freqs;        /* (block_size, hs) cos | sin */
    float *dact, *dwide; /* (N, I) and (N, max(2I, qkv width)) */
    float *datt;         /* (N, Q): the attention output's gradient where Q > C (else the core's tmp) */
    float *nbuf, *nbuf2; /* (N, Q) each: q or k heads made contiguous for their norm, and its gradient */
};

/* The root unit's tensors (model_llama_layout.c). */
enum { EMB_W, NORM_W, HEAD_W };

/* Index of each tensor among a block unit's parameters, in model_llama_layout.c's order: q_proj, k_proj,
 * v_proj (each followed by its bias with qkv_bias, qwen2), o_proj, q_norm and k_norm (qk_norm, qwen3),
 * gate_proj, up_proj, down_proj, input_layernorm, post_attention_layernorm. -1: the family has none. */
struct block_ix {
    int q_w, k_w, v_w, q_b, k_b, v_b, o_w, q_n, k_n, gate, up, down, in_n, post_n;
};

static struct block_ix ix_of(const struct model_config *c)
{
    struct block_ix x;
    int i = 0;
    x.q_w = i++;
    x.q_b = c->qkv_bias ? i++ : -1;
    x.k_w = i++;
    x.k_b = c->qkv_bias ? i++ : -1;
    x.v_w = i++;
    x.v_b = c->qkv_bias ? i++ : -1;
    x.o_w = i++;
    x.q_n = c->qk_norm ? i++ : -1;
    x.k_n = c->qk_norm ? i++ : -1;
    x.gate = i++;
    x.up = i++;
    x.down = i++;
    x.in_n = i++;
    x.post_n = i;
    return x;
}

struct dims {
    int N, C, nh, nkv, hs, Q, qkv, I, vp; /* Q: q's width and the attention output's, nh x hs */
};

static struct dims dims_of(const struct model_config *c, int b, int t)
{
    struct dims d = {.N = b * t, .C = c->n_embd, .nh = c->n_head, .nkv = c->n_kv_head, .hs = model_head_dim(c),
                     .I = c->intermediate_size};
    d.Q = d.nh * d.hs;
    d.qkv = (d.nh + 2 * d.nkv) * d.hs;
    d.vp = (c->vocab_size + MODEL_VOCAB_ALIGN - 1) / MODEL_VOCAB_ALIGN * MODEL_VOCAB_ALIGN;
    return d;
}

/* cfg is resolved (n_kv_head and intermediate_size filled in, as layout.config is). */
static void llama_plan_persistent(const struct model_config *cfg, int b, int t, struct model_carver *c, void *fam)
{
    struct llama_state *s = fam;
    struct dims d = dims_of(cfg, b, t);
    s->ones = cfg->qkv_bias ? model_carve(c, (size_t)d.N * sizeof(float)) : NULL;
    s->pos = model_carve(c, (size_t)d.N * sizeof(int32_t));
    s->freqs = model_carve(c, (size_t)cfg->block_size * d.hs * sizeof(float));
}

static void llama_plan_acts(const struct model_config *cfg, int b, int t, struct model_carver *c, void *acts)
{
    struct llama_acts *a = acts;
    struct dims d = dims_of(cfg, b, t);
    size_t N = (size_t)d.N, C = (size_t)d.C, F = sizeof(float), I = (size_t)d.I;
    a->h1 = model_carve_act(c, N * C);
    a->rstd1 = model_carve(c, N * F);
    a->qkv = model_carve(c, N * (size_t)d.qkv * F);
    a->att = model_carve_act(c, N * (size_t)d.Q);
    a->lse = model_carve(c, N * (size_t)d.nh * F);
    a->xmid = model_carve(c, N * C * F);
    a->h2 = model_carve_act(c, N * C);
    a->rstd2 = model_carve(c, N * F);
    a->gu = model_carve_act(c, 2 * N * I);
    a->act = model_carve_act(c, N * I);
    if (cfg->qk_norm) {
        a->qraw = model_carve(c, N * (size_t)d.Q * F);
        a->kraw = model_carve(c, N * (size_t)d.nkv * d.hs * F);
        a->qrstd = model_carve(c, N * (size_t)d.nh * F);
        a->krstd = model_carve(c, N * (size_t)d.nkv * F);
    }
}

static void llama_plan_scratch(const struct model_config *cfg, int b, int t, struct model_carver *c, void *fam)
{
    struct llama_state *s = fam;
    struct dims d = dims_of(cfg, b, t);
    size_t N = (size_t)d.N, F = sizeof(float), I = (size_t)d.I;
    s->dact = model_carve(c, N * I * F);
    s->dwide = model_carve(c, N * (2 * I > (size_t)d.qkv ? 2 * I : (size_t)d.qkv) * F);
    s->datt = d.Q > d.C ? model_carve(c, N * (size_t)d.Q * F) : NULL;
    s->nbuf = cfg->qk_norm ? model_carve(c, N * (size_t)d.Q * F) : NULL;
    s->nbuf2 = cfg->qk_norm ? model_carve(c, N * (size_t)d.Q * F) : NULL;
}

/* Llama 3.1's frequency scaling of one inverse frequency, in transformers' float32 arithmetic
 * (_compute_llama3_parameters): wavelengths beyond original / low_freq_factor are divided by factor, those
 * under original / high_freq_factor kept, the band between blended by a smooth factor. Python scalars meet
 * float32 tensors there, so every operation rounds to float, and `scalar / tensor` is PyTorch's
 * reciprocal(tensor) * scalar. */
static float rope_llama3(float inv, const struct model_config *c)
{
    float factor = c->rope_factor, low = c->rope_low_freq_factor, high = c->rope_high_freq_factor;
    double old_ctx = (double)c->rope_original_max_position;
    float low_wavelen = (float)(old_ctx / (double)low), high_wavelen = (float)(old_ctx / (double)high);
    float wavelen = (1.0f / inv) * (float)6.283185307179586;
    float scaled = wavelen > low_wavelen ? inv / factor : inv;
    if (wavelen < high_wavelen || wavelen > low_wavelen)
        return scaled;
    float smooth = ((1.0f / wavelen) * (float)old_ctx - low) / (float)((double)high - (double)low);
    return (1.0f - smooth) * scaled / factor + smooth * scaled;
}

/* transformers' rotary table in its float32 arithmetic: inv_freq_j = 1 / theta^(2j / hs) (a float power),
 * scaled as the config says, angle = float(p) * inv_freq_j rounded to float, then cos and sin of that float. */
static void rope_table(float *host, int npos, int hs, const struct model_config *c)
{
    int half = hs / 2;
    for (int j = 0; j < half; j++) {
        float e = (float)(2 * j) / (float)hs;
        float inv = 1.0f / (float)pow((double)c->rope_theta, (double)e);
        if (c->rope_scaling == MODEL_ROPE_LLAMA3)
            inv = rope_llama3(inv, c);
        for (int p = 0; p < npos; p++) {
            float a = (float)p * inv;
            host[(size_t)p * hs + j] = (float)cos((double)a);
            host[(size_t)p * hs + half + j] = (float)sin((double)a);
        }
    }
}

/* The rotary table and every row's position (setup: after the arena is carved). */
static int llama_setup(struct model *m)
{
    struct llama_state *s = model_core_of(m)->fam;
    const struct model_config *cfg = &m->layout.config;
    int hs = model_head_dim(cfg), N = m->b * m->t;
    size_t tab = (size_t)cfg->block_size * hs;
    float *host = malloc(tab * sizeof *host);
    int32_t *pos = malloc((size_t)N * sizeof *pos);
    int rc = 0;
    if (!host || !pos) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    rope_table(host, cfg->block_size, hs, cfg);
    for (int i = 0; i < N; i++)
        pos[i] = model_position(m, i % m->t);
    FSDP_TRY_GOTO(m->k->mem_copy(s->freqs, host, tab * sizeof *host, KERNELS_COPY_H2D), rc, out);
    FSDP_TRY_GOTO(m->k->mem_copy(s->pos, pos, (size_t)N * sizeof *pos, KERNELS_COPY_H2D), rc, out);
    if (s->ones) {
        for (size_t i = 0; i < tab; i++)
            host[i] = 1.0f;
        for (size_t off = 0; off < (size_t)N; off += tab) /* the table's buffer, reused: N may exceed it */
            FSDP_TRY_GOTO(m->k->mem_copy(s->ones + off, host, ((size_t)N - off < tab ? (size_t)N - off : tab) * sizeof *host,
                                         KERNELS_COPY_H2D),
                          rc, out);
    }
out:
    free(host);
    free(pos);
    return rc;
}

#define up(m, u, buf, idx) model_unit_param(m, u, buf, idx)
#define upg(m, u, buf, idx) model_unit_grad(m, u, buf, idx)

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

/* The q, k and v projections into the packed (N, qkv) rows [q | k | v]: one GEMM where the three weights
 * are one matrix (Llama), else one per projection into its columns plus its bias, added as ones (N, 1) x
 * bias (1, rows) so that every backend does it with its GEMM. */
static int qkv_forward(struct model *m, int u, const float *w, float *qkv, const float *h, const struct dims *d,
                       const struct block_ix *x, const float *ones)
{
    const struct kernels *k = m->k;
    if (x->q_b < 0) /* q_proj, k_proj and v_proj adjacent: one (qkv, C) matrix */
        return linear_forward(k, qkv, h, up(m, u, w, x->q_w), d->N, d->C, d->qkv);
    const int wi[3] = {x->q_w, x->k_w, x->v_w}, bi[3] = {x->q_b, x->k_b, x->v_b};
    const int rows[3] = {d->nh * d->hs, d->nkv * d->hs, d->nkv * d->hs}, off[3] = {0, rows[0], rows[0] + rows[1]};
    for (int i = 0; i < 3; i++) {
        FSDP_TRY(k->gemm(0, 1, d->N, rows[i], d->C, 1.0f, h, d->C, up(m, u, w, wi[i]), d->C, 0.0f, qkv + off[i], d->qkv));
        FSDP_TRY(k->gemm(0, 0, d->N, rows[i], 1, 1.0f, ones, 1, up(m, u, w, bi[i]), rows[i], 1.0f, qkv + off[i], d->qkv));
    }
    return 0;
}

/* Their backward from dqkv (N, qkv): dh = sum of dq Wq, dk Wk, dv Wv (written, not added), and the weight and
 * bias gradients added (dW += d^T h, db += ones^T d). */
static int qkv_backward(struct model *m, int u, const float *w, float *g, const float *dqkv, const float *h,
                        const struct dims *d, const struct block_ix *x, const float *ones)
{
    const struct kernels *k = m->k;
    struct model_core *s = model_core_of(m);
    if (x->q_b < 0)
        return linear_backward(k, s->dln, upg(m, u, g, x->q_w), dqkv, h, up(m, u, w, x->q_w), d->N, d->C, d->qkv);
    const int wi[3] = {x->q_w, x->k_w, x->v_w}, bi[3] = {x->q_b, x->k_b, x->v_b};
    const int rows[3] = {d->nh * d->hs, d->nkv * d->hs, d->nkv * d->hs}, off[3] = {0, rows[0], rows[0] + rows[1]};
    for (int i = 0; i < 3; i++) {
        FSDP_TRY(k->gemm(0, 0, d->N, d->C, rows[i], 1.0f, dqkv + off[i], d->qkv, up(m, u, w, wi[i]), d->C,
                         i ? 1.0f : 0.0f, s->dln, d->C));
        if (!g)
            continue;
        FSDP_TRY(k->gemm(1, 0, rows[i], d->C, d->N, 1.0f, dqkv + off[i], d->qkv, h, d->C, 1.0f, upg(m, u, g, wi[i]), d->C));
        FSDP_TRY(k->gemm(1, 0, 1, rows[i], d->N, 1.0f, ones, 1, dqkv + off[i], d->qkv, 1.0f, upg(m, u, g, bi[i]), rows[i]));
    }
    return 0;
}

/* Qwen3's q/k norm: every head of q (then of k) is RMS-normalised over its head_dim values and scaled by one
 * (head_dim) gain the heads share. The heads sit in the packed rows with stride qkv, so each part is copied
 * out contiguous, (N x heads, head_dim) rows for rmsnorm, and the result copied back; the copy before the
 * norm is kept for backward. */
static int qk_norm_forward(struct model *m, int u, const float *w, struct llama_acts *a, const struct dims *d,
                           const struct block_ix *x)
{
    const struct kernels *k = m->k;
    struct llama_state *ls = model_core_of(m)->fam;
    const struct model_config *c = &m->layout.config;
    size_t F = sizeof(float), ld = (size_t)d->qkv * F;
    const int heads[2] = {d->nh, d->nkv}, col[2] = {0, d->Q}, wi[2] = {x->q_n, x->k_n};
    float *raw[2] = {a->qraw, a->kraw}, *rstd[2] = {a->qrstd, a->krstd};
    for (int i = 0; i < 2; i++) {
        size_t width = (size_t)heads[i] * d->hs * F;
        FSDP_TRY(k->mem_copy2d(raw[i], width, a->qkv + col[i], ld, width, (size_t)d->N, KERNELS_COPY_D2D));
        FSDP_TRY(k->rmsnorm_forward(ls->nbuf, rstd[i], raw[i], up(m, u, w, wi[i]), d->N * heads[i], d->hs,
                                    c->rms_norm_eps));
        FSDP_TRY(k->mem_copy2d(a->qkv + col[i], ld, ls->nbuf, width, width, (size_t)d->N, KERNELS_COPY_D2D));
    }
    return 0;
}

/* Its backward in place on dqkv's q and k columns (the gradient after the norms in, before them out); the
 * gains' gradients are added. */
static int qk_norm_backward(struct model *m, int u, const float *w, float *g, float *dqkv, struct llama_acts *a,
                            const struct dims *d, const struct block_ix *x)
{
    const struct kernels *k = m->k;
    struct llama_state *ls = model_core_of(m)->fam;
    size_t F = sizeof(float), ld = (size_t)d->qkv * F;
    const int heads[2] = {d->nh, d->nkv}, col[2] = {0, d->Q}, wi[2] = {x->q_n, x->k_n};
    const float *raw[2] = {a->qraw, a->kraw}, *rstd[2] = {a->qrstd, a->krstd};
    for (int i = 0; i < 2; i++) {
        size_t width = (size_t)heads[i] * d->hs * F;
        FSDP_TRY(k->mem_copy2d(ls->nbuf, width, dqkv + col[i], ld, width, (size_t)d->N, KERNELS_COPY_D2D));
        FSDP_TRY(k->mem_set(ls->nbuf2, 0, (size_t)d->N * width));
        FSDP_TRY(k->rmsnorm_backward(ls->nbuf2, upg(m, u, g, wi[i]), ls->nbuf, raw[i], up(m, u, w, wi[i]), rstd[i],
                                     d->N * heads[i], d->hs));
        FSDP_TRY(k->mem_copy2d(dqkv + col[i], ld, ls->nbuf2, width, width, (size_t)d->N, KERNELS_COPY_D2D));
    }
    return 0;
}

static int llama_forward_block(struct model *m, int layer, const float *w, void *acts)
{
    struct model_core *s = model_core_of(m);
    struct llama_state *ls = s->fam;
    const struct kernels *k = m->k;
    const struct model_config *c = &m->layout.config;
    struct dims d = dims_of(c, m->b, m->t);
    int N = d.N, C = d.C, u = 1 + layer;
    size_t NC = (size_t)N * C;
    struct llama_acts *a = acts;
    const float *xin = s->resid + (size_t)layer * NC;
    struct block_ix x = ix_of(c);
    FSDP_TRY(model_block_input_norm(m, layer, a->h1, NULL, a->rstd1, up(m, u, w, x.in_n), NULL, c->rms_norm_eps));
    FSDP_TRY(qkv_forward(m, u, w, a->qkv, a->h1, &d, &x, ls->ones));
    if (c->qk_norm)
        FSDP_TRY(qk_norm_forward(m, u, w, a, &d, &x));
    FSDP_TRY(k->rope_forward(a->qkv, N, d.qkv, d.nh + d.nkv, d.hs, ls->pos, ls->freqs, c->block_size));
    if (m->cp.size > 1)
        FSDP_TRY(model_cp_attention_forward(m, a->att, a->lse, a->qkv, model_layer_window(c, layer)));
    else
        FSDP_TRY(k->attention_forward(a->att, a->lse, a->qkv, m->b, m->t, d.Q, d.nh, d.nkv, model_layer_window(c, layer),
                                      s->attn_ws));
    FSDP_TRY(linear_forward(k, s->tmp, a->att, up(m, u, w, x.o_w), N, d.Q, C));
    if (k->residual_rmsnorm_forward) { /* one pass: the residual add and post_attention_layernorm, the same bits */
        FSDP_TRY(k->residual_rmsnorm_forward(a->xmid, a->h2, a->rstd2, xin, s->tmp, up(m, u, w, x.post_n), N, C,
                                             c->rms_norm_eps));
    } else {
        FSDP_TRY(k->residual_forward(a->xmid, xin, s->tmp, NC));
        FSDP_TRY(k->rmsnorm_forward(a->h2, a->rstd2, a->xmid, up(m, u, w, x.post_n), N, C, c->rms_norm_eps));
    }
    /* gate_proj and up_proj are adjacent: one (2I, C) matrix giving [gate | up] rows */
    FSDP_TRY(linear_forward(k, a->gu, a->h2, up(m, u, w, x.gate), N, C, 2 * d.I));
    FSDP_TRY(k->swiglu_forward(a->act, a->gu, N, d.I));
    FSDP_TRY(linear_forward(k, s->tmp, a->act, up(m, u, w, x.down), N, d.I, C));
    return model_block_output(m, layer, a->xmid, s->tmp);
}

static int llama_backward_block(struct model *m, int layer, const float *w, float *g, void *acts)
{
    struct model_core *s = model_core_of(m);
    struct llama_state *ls = s->fam;
    const struct kernels *k = m->k;
    const struct model_config *c = &m->layout.config;
    struct dims d = dims_of(c, m->b, m->t);
    int N = d.N, C = d.C, u = 1 + layer;
    size_t NC = (size_t)N * C, F = sizeof(float);
    struct llama_acts *a = acts;
    const float *xin = s->resid + (size_t)layer * NC;
    struct block_ix x = ix_of(c);
    /* s->dres holds dL/dy on entry and dL/dx on return: the residual adds make it flow straight through,
     * and each norm's backward adds its branch into it. */
    FSDP_TRY(linear_backward(k, ls->dact, upg(m, u, g, x.down), s->dres, a->act, up(m, u, w, x.down), N, d.I, C));
    FSDP_TRY(k->mem_set(ls->dwide, 0, (size_t)N * 2 * d.I * F));
    FSDP_TRY(k->swiglu_backward(ls->dwide, a->gu, ls->dact, N, d.I));
    FSDP_TRY(linear_backward(k, s->dln, upg(m, u, g, x.gate), ls->dwide, a->h2, up(m, u, w, x.gate), N, C, 2 * d.I));
    FSDP_TRY(k->rmsnorm_backward(s->dres, upg(m, u, g, x.post_n), s->dln, a->xmid, up(m, u, w, x.post_n), a->rstd2,
                            N, C));
    float *datt = ls->datt ? ls->datt : s->tmp;
    FSDP_TRY(linear_backward(k, datt, upg(m, u, g, x.o_w), s->dres, a->att, up(m, u, w, x.o_w), N, d.Q, C));
    if (m->cp.size > 1) {
        FSDP_TRY(model_cp_attention_backward(m, ls->dwide, datt, a->qkv, a->att, a->lse, model_layer_window(c, layer)));
    } else {
        FSDP_TRY(k->mem_set(ls->dwide, 0, (size_t)N * d.qkv * F));
        FSDP_TRY(k->attention_backward(ls->dwide, datt, a->qkv, a->att, a->lse, m->b, m->t, d.Q, d.nh, d.nkv,
                                       model_layer_window(c, layer), s->attn_ws));
    }
    /* the gradient of q and k before rope: the transposed rotation */
    FSDP_TRY(k->rope_backward(ls->dwide, N, d.qkv, d.nh + d.nkv, d.hs, ls->pos, ls->freqs, c->block_size));
    if (c->qk_norm)
        FSDP_TRY(qk_norm_backward(m, u, w, g, ls->dwide, a, &d, &x));
    FSDP_TRY(qkv_backward(m, u, w, g, ls->dwide, a->h1, &d, &x, ls->ones));
    return k->rmsnorm_backward(s->dres, upg(m, u, g, x.in_n), s->dln, xin, up(m, u, w, x.in_n),
                               a->rstd1, N, C);
}

static float llama_norm_eps(const struct model_config *c)
{
    return c->rms_norm_eps;
}

/* The LM head's weight: lm_head, or embed_tokens when tied. */
static int llama_root_head(const struct model_config *c)
{
    return c->tie_word_embeddings ? EMB_W : HEAD_W;
}

const struct model_decoder model_llama_decoder = {
    .norm = MODEL_NORM_RMS,
    .block_norm = MODEL_NORM_RMS,
    .norm_eps = llama_norm_eps,
    .root_embed = EMB_W,
    .root_pos = -1,
    .root_norm_w = NORM_W,
    .root_norm_b = -1,
    .root_head = llama_root_head,
    .grouped_query = true,
    .acts_size = sizeof(struct llama_acts),
    .fam_size = sizeof(struct llama_state),
    .plan_persistent = llama_plan_persistent,
    .plan_acts = llama_plan_acts,
    .plan_scratch = llama_plan_scratch,
    .setup = llama_setup,
    .block_forward = llama_forward_block,
    .block_backward = llama_backward_block,
};
