/* GPT-2's module tree and parameter layout. Flat buffer order: the root unit (wte, wpe, ln_f) first,
 * then one unit per decoder block, so every FSDP unit is one contiguous slice and every block's slice has
 * the same internal layout (the block forward takes offsets from h.0). */
#include <math.h>
#include <stdio.h>

#include "common/error.h"
#include "worker/model/model_internal.h"

/* GPT-2's c_attn is (C, 3C): its heads are n_embd / n_head wide, and an explicit head_dim must say so. */
int model_gpt2_check(const struct model_config *c)
{
    if (c->n_embd % c->n_head != 0 || c->head_dim * c->n_head != c->n_embd)
        return error_set(FSDP_EINVAL,
                         "model: head_dim is %d, but a gpt2 model's heads are n_embd / n_head = %d / %d wide (c_attn "
                         "is (n_embd, 3 n_embd)); unset head_dim, or use a Llama-style family",
                         c->head_dim, c->n_embd, c->n_head);
    return 0;
}

int model_gpt2_layout_build(struct model_layout *l, const struct model_config *c)
{
    int C = c->n_embd, L = c->n_layer;
    float std = c->init_std;
    /* GPT-2 scales the init of the projections that write into the residual stream by 1/sqrt(2 L), so
     * the stream's variance does not grow with depth. */
    float proj_std = std / sqrtf(2.0f * (float)L);
    l->vocab_padded = (c->vocab_size + MODEL_VOCAB_ALIGN - 1) / MODEL_VOCAB_ALIGN * MODEL_VOCAB_ALIGN;

    int root, wte, wpe, h, lnf;
    FSDP_TRY(root = model_layout_add_module(l, -1, "", "GPT2Model"));
    FSDP_TRY(wte = model_layout_add_module(l, root, "wte", "Embedding"));
    FSDP_TRY(wpe = model_layout_add_module(l, root, "wpe", "Embedding"));
    FSDP_TRY(h = model_layout_add_module(l, root, "h", "ModuleList"));
    int blk_first = l->n_modules;
    char n[MODEL_NAME_MAX];
    for (int i = 0; i < L; i++) {
        int b, a, m;
        snprintf(n, sizeof n, "h.%d", i);
        FSDP_TRY(b = model_layout_add_module(l, h, n, "DecoderBlock"));
        snprintf(n, sizeof n, "h.%d.ln_1", i);
        FSDP_TRY(model_layout_add_module(l, b, n, "LayerNorm"));
        snprintf(n, sizeof n, "h.%d.attn", i);
        FSDP_TRY(a = model_layout_add_module(l, b, n, "CausalSelfAttention"));
        snprintf(n, sizeof n, "h.%d.attn.c_attn", i);
        FSDP_TRY(model_layout_add_module(l, a, n, "Conv1D"));
        snprintf(n, sizeof n, "h.%d.attn.c_proj", i);
        FSDP_TRY(model_layout_add_module(l, a, n, "Conv1D"));
        snprintf(n, sizeof n, "h.%d.ln_2", i);
        FSDP_TRY(model_layout_add_module(l, b, n, "LayerNorm"));
        snprintf(n, sizeof n, "h.%d.mlp", i);
        FSDP_TRY(m = model_layout_add_module(l, b, n, "MLP"));
        snprintf(n, sizeof n, "h.%d.mlp.c_fc", i);
        FSDP_TRY(model_layout_add_module(l, m, n, "Conv1D"));
        snprintf(n, sizeof n, "h.%d.mlp.c_proj", i);
        FSDP_TRY(model_layout_add_module(l, m, n, "Conv1D"));
    }
    FSDP_TRY(lnf = model_layout_add_module(l, root, "ln_f", "LayerNorm"));

    int u;
    FSDP_TRY(u = model_layout_add_unit(l, "root", root));
    int p;
    FSDP_TRY(p = model_layout_add_param(l, wte, u, "weight", 2, l->vocab_padded, C, true, std, 0));
    l->params[p].init_rows = c->vocab_size;
    FSDP_TRY(p = model_layout_add_param(l, wpe, u, "weight", 2, c->block_size, C, true, std, 0));
    l->params[p].position_rows = true;
    l->params[p].lookup_only = true;
    FSDP_TRY(model_layout_add_param(l, lnf, u, "weight", 1, C, 0, false, 0, 1));
    FSDP_TRY(model_layout_add_param(l, lnf, u, "bias", 1, C, 0, false, 0, 0));
    for (int i = 0; i < L; i++) {
        int b = blk_first + 9 * i; /* module indices in the order added above */
        snprintf(n, sizeof n, "h.%d", i);
        FSDP_TRY(u = model_layout_add_unit(l, n, b));
        FSDP_TRY(model_layout_add_param(l, b + 1, u, "weight", 1, C, 0, false, 0, 1));
        FSDP_TRY(model_layout_add_param(l, b + 1, u, "bias", 1, C, 0, false, 0, 0));
        FSDP_TRY(model_layout_add_param(l, b + 3, u, "weight", 2, C, 3 * C, true, std, 0));
        FSDP_TRY(model_layout_add_param(l, b + 3, u, "bias", 1, 3 * C, 0, false, 0, 0));
        FSDP_TRY(model_layout_add_param(l, b + 4, u, "weight", 2, C, C, true, proj_std, 0));
        FSDP_TRY(model_layout_add_param(l, b + 4, u, "bias", 1, C, 0, false, 0, 0));
        FSDP_TRY(model_layout_add_param(l, b + 5, u, "weight", 1, C, 0, false, 0, 1));
        FSDP_TRY(model_layout_add_param(l, b + 5, u, "bias", 1, C, 0, false, 0, 0));
        FSDP_TRY(model_layout_add_param(l, b + 7, u, "weight", 2, C, 4 * C, true, std, 0));
        FSDP_TRY(model_layout_add_param(l, b + 7, u, "bias", 1, 4 * C, 0, false, 0, 0));
        FSDP_TRY(model_layout_add_param(l, b + 8, u, "weight", 2, 4 * C, C, true, proj_std, 0));
        FSDP_TRY(model_layout_add_param(l, b + 8, u, "bias", 1, C, 0, false, 0, 0));
    }
    return 0;
}
