/* GPT-2's decoder block over the kernels table, on the shared core (model_core.c: embeddings wte + wpe, the
 * residual stream, ln_f, the LM head tied to wte, the loss).
 *
 * Block (pre-LayerNorm): x_mid = x + c_proj(attn(c_attn(ln_1(x)))); y = x_mid + mlp.c_proj(gelu(c_fc(ln_2(x_mid)))).
 * Conv1D weights are (in, out): y = x W + b (matmul_forward). */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "worker/model/model_internal.h"

#define LN_EPS 1e-5f

/* ln1, qkv, atty, ln2 and fcg: [act] tensors of the activation region (model_carve_act): the matmuls'
 * operands, qkv (written by its matmul) read by attention, atty also by attention's backward. */
struct gpt2_acts {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *xmid, *ln2, *ln2_mean, *ln2_rstd, *fc, *fcg;
};

struct gpt2_scratch {
    float *dbig1, *dbig2; /* (N, 4C) */
};

/* Index of each block tensor among a block unit's 12 parameters (model_gpt2_layout.c order). */
enum { LN1_W, LN1_B, ATTN_W, ATTN_B, APROJ_W, APROJ_B, LN2_W, LN2_B, FC_W, FC_B, MPROJ_W, MPROJ_B, N_BLOCK };
enum { WTE, WPE, LNF_W, LNF_B };

static void gpt2_plan_acts(const struct model_config *cfg, int b, int t, struct model_carver *c, void *acts)
{
    struct gpt2_acts *a = acts;
    size_t N = (size_t)b * t, C = (size_t)cfg->n_embd, F = sizeof(float);
    a->ln1 = model_carve_act(c, N * C);
    a->ln1_mean = model_carve(c, N * F);
    a->ln1_rstd = model_carve(c, N * F);
    a->qkv = model_carve_act(c, 3 * N * C);
    a->atty = model_carve_act(c, N * C);
    a->lse = model_carve(c, N * (size_t)cfg->n_head * F);
    a->xmid = model_carve(c, N * C * F);
    a->ln2 = model_carve_act(c, N * C);
    a->ln2_mean = model_carve(c, N * F);
    a->ln2_rstd = model_carve(c, N * F);
    a->fc = model_carve(c, 4 * N * C * F);
    a->fcg = model_carve_act(c, 4 * N * C);
}

static void gpt2_plan_scratch(const struct model_config *cfg, int b, int t, struct model_carver *c, void *fam)
{
    struct gpt2_scratch *x = fam;
    size_t N = (size_t)b * t, C = (size_t)cfg->n_embd, F = sizeof(float);
    x->dbig1 = model_carve(c, 4 * N * C * F);
    x->dbig2 = model_carve(c, 4 * N * C * F);
}

#define up(m, u, buf, idx) model_unit_param(m, u, buf, idx)
#define upg(m, u, buf, idx) model_unit_grad(m, u, buf, idx)

static int gpt2_forward_block(struct model *m, int layer, const float *w, void *acts)
{
    struct model_core *s = model_core_of(m);
    const struct kernels *k = m->k;
    const struct model_config *c = &m->layout.config;
    int N = m->b * m->t, C = c->n_embd, u = 1 + layer;
    size_t NC = (size_t)N * C;
    struct gpt2_acts *a = acts;
    const float *x = s->resid + (size_t)layer * NC;
    FSDP_TRY(model_block_input_norm(m, layer, a->ln1, a->ln1_mean, a->ln1_rstd, up(m, u, w, LN1_W),
                                    up(m, u, w, LN1_B), LN_EPS));
    FSDP_TRY(k->matmul_forward(a->qkv, a->ln1, up(m, u, w, ATTN_W), up(m, u, w, ATTN_B), N, C, 3 * C));
    if (m->cp.size > 1)
        FSDP_TRY(model_cp_attention_forward(m, a->atty, a->lse, a->qkv, 0));
    else
        FSDP_TRY(k->attention_forward(a->atty, a->lse, a->qkv, m->b, m->t, C, c->n_head, c->n_head, 0, s->attn_ws));
    FSDP_TRY(k->matmul_forward(s->tmp, a->atty, up(m, u, w, APROJ_W), up(m, u, w, APROJ_B), N, C, C));
    if (k->residual_layernorm_forward) { /* one pass: the residual add and ln_2, the same bits */
        FSDP_TRY(k->residual_layernorm_forward(a->xmid, a->ln2, a->ln2_mean, a->ln2_rstd, x, s->tmp,
                                               up(m, u, w, LN2_W), up(m, u, w, LN2_B), N, C, LN_EPS));
    } else {
        FSDP_TRY(k->residual_forward(a->xmid, x, s->tmp, NC));
        FSDP_TRY(k->layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->xmid, up(m, u, w, LN2_W),
                                      up(m, u, w, LN2_B), N, C, LN_EPS));
    }
    if (k->matmul_forward_gelu) { /* one pass: the GELU applied as the product is written */
        FSDP_TRY(k->matmul_forward_gelu(a->fc, a->fcg, a->ln2, up(m, u, w, FC_W), up(m, u, w, FC_B), N, C, 4 * C));
    } else {
        FSDP_TRY(k->matmul_forward(a->fc, a->ln2, up(m, u, w, FC_W), up(m, u, w, FC_B), N, C, 4 * C));
        FSDP_TRY(k->gelu_forward(a->fcg, a->fc, 4 * NC));
    }
    FSDP_TRY(k->matmul_forward(s->tmp, a->fcg, up(m, u, w, MPROJ_W), up(m, u, w, MPROJ_B), N, 4 * C, C));
    return model_block_output(m, layer, a->xmid, s->tmp);
}

/* A linear layer's backward with a fresh input gradient: the parameter gradients accumulated (+=) by
 * matmul_backward as usual, then dx = dy W^T written by gemm with beta 0 (no zeroing pass over a scratch
 * buffer that is about to be overwritten anyway); dy held for the two (matmul_backward first: it sums db in
 * the pass that rounds dy). */
static int linear_backward(const struct kernels *k, float *dx, float *dw, float *db, const float *dy,
                           const float *x, const float *w, int n, int in, int out)
{
    int rc = 0;
    FSDP_TRY(model_operand_hold(k, dy, (size_t)n * out));
    FSDP_TRY_GOTO(k->matmul_backward(NULL, dw, db, dy, x, w, n, in, out), rc, out);
    FSDP_TRY_GOTO(k->gemm(0, 1, n, in, out, 1.0f, dy, out, w, out, 0.0f, dx, in), rc, out);
out:
    model_operand_release(k, dy);
    return rc;
}

/* linear_backward of the MLP's down-projection fused with the GELU's backward (the table's matmul_dx_dgelu):
 * dpre = (dy W^T) * gelu'(pre) written at once, dW and db as linear_backward. */
static int mlp_down_backward_fused(const struct kernels *k, float *dpre, float *dw, float *db, const float *dy,
                                   const float *x, const float *pre, const float *w, int n, int in, int out)
{
    int rc = 0;
    FSDP_TRY(model_operand_hold(k, dy, (size_t)n * out));
    FSDP_TRY_GOTO(k->matmul_backward(NULL, dw, db, dy, x, w, n, in, out), rc, out);
    FSDP_TRY_GOTO(k->matmul_dx_dgelu(dpre, dy, w, pre, n, in, out), rc, out);
out:
    model_operand_release(k, dy);
    return rc;
}

static int gpt2_backward_block(struct model *m, int layer, const float *w, float *g, void *acts)
{
    struct model_core *s = model_core_of(m);
    struct gpt2_scratch *sc = s->fam;
    const struct kernels *k = m->k;
    const struct model_config *c = &m->layout.config;
    int N = m->b * m->t, C = c->n_embd, u = 1 + layer;
    size_t NC = (size_t)N * C, F = sizeof(float);
    struct gpt2_acts *a = acts;
    const float *x = s->resid + (size_t)layer * NC;
    /* s->dres holds dL/dy on entry and dL/dx on return: the residual adds make it flow straight through,
     * and each layernorm backward adds its branch into it. */
    if (k->matmul_dx_dgelu) { /* the MLP's down-projection and its GELU backward in one pass */
        FSDP_TRY(mlp_down_backward_fused(k, sc->dbig2, upg(m, u, g, MPROJ_W), upg(m, u, g, MPROJ_B), s->dres, a->fcg,
                                         a->fc, up(m, u, w, MPROJ_W), N, 4 * C, C));
    } else {
        FSDP_TRY(linear_backward(k, sc->dbig1, upg(m, u, g, MPROJ_W), upg(m, u, g, MPROJ_B), s->dres, a->fcg,
                                 up(m, u, w, MPROJ_W), N, 4 * C, C));
        FSDP_TRY(k->mem_set(sc->dbig2, 0, 4 * NC * F));
        FSDP_TRY(k->gelu_backward(sc->dbig2, a->fc, sc->dbig1, 4 * NC));
    }
    FSDP_TRY(linear_backward(k, s->dln, upg(m, u, g, FC_W), upg(m, u, g, FC_B), sc->dbig2, a->ln2, up(m, u, w, FC_W), N,
                        C, 4 * C));
    FSDP_TRY(k->layernorm_backward(s->dres, upg(m, u, g, LN2_W), upg(m, u, g, LN2_B), s->dln, a->xmid,
                              up(m, u, w, LN2_W), a->ln2_mean, a->ln2_rstd, N, C));
    FSDP_TRY(linear_backward(k, s->tmp, upg(m, u, g, APROJ_W), upg(m, u, g, APROJ_B), s->dres, a->atty,
                        up(m, u, w, APROJ_W), N, C, C));
    if (m->cp.size > 1) {
        FSDP_TRY(model_cp_attention_backward(m, sc->dbig1, s->tmp, a->qkv, a->atty, a->lse, 0));
    } else {
        FSDP_TRY(k->mem_set(sc->dbig1, 0, 3 * NC * F));
        FSDP_TRY(k->attention_backward(sc->dbig1, s->tmp, a->qkv, a->atty, a->lse, m->b, m->t, C, c->n_head,
                                       c->n_head, 0, s->attn_ws));
    }
    FSDP_TRY(linear_backward(k, s->dln, upg(m, u, g, ATTN_W), upg(m, u, g, ATTN_B), sc->dbig1, a->ln1,
                        up(m, u, w, ATTN_W), N, C, 3 * C));
    return k->layernorm_backward(s->dres, upg(m, u, g, LN1_W), upg(m, u, g, LN1_B), s->dln, x,
                                 up(m, u, w, LN1_W), a->ln1_mean, a->ln1_rstd, N, C);
}

static float gpt2_norm_eps(const struct model_config *c)
{
    (void)c;
    return LN_EPS;
}

static int gpt2_root_head(const struct model_config *c)
{
    (void)c;
    return WTE; /* tied */
}

const struct model_decoder model_gpt2_decoder = {
    .norm = MODEL_NORM_LAYER,
    .block_norm = MODEL_NORM_LAYER,
    .norm_eps = gpt2_norm_eps,
    .root_embed = WTE,
    .root_pos = WPE,
    .root_norm_w = LNF_W,
    .root_norm_b = LNF_B,
    .root_head = gpt2_root_head,
    .grouped_query = false,
    .acts_size = sizeof(struct gpt2_acts),
    .fam_size = sizeof(struct gpt2_scratch),
    .plan_acts = gpt2_plan_acts,
    .plan_scratch = gpt2_plan_scratch,
    .block_forward = gpt2_forward_block,
    .block_backward = gpt2_backward_block,
};
