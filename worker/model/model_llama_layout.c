/* Llama's config rules, module tree and parameter layout, with Hugging Face LlamaForCausalLM names
 * (nn.Linear weights stored (out, in)). Flat buffer order: the root unit (model.embed_tokens, model.norm,
 * lm_head when untied) first, then one unit per decoder layer, so every FSDP unit is one contiguous slice
 * and every layer's slice has the same internal layout. Inside a layer q_proj, k_proj and v_proj are
 * adjacent, and so are gate_proj and up_proj: each group is one (rows, C) matrix that one GEMM applies,
 * giving the packed [q | k | v] rows attention reads and the [gate | up] rows SwiGLU reads. */
#include <stdio.h>

#include "common/error.h"
#include "worker/model/model_internal.h"

void model_llama_resolve(struct model_config *c)
{
    if (c->n_kv_head == 0)
        c->n_kv_head = c->n_head;
    /* 2/3 of GPT's 4 n_embd (SwiGLU has three matrices instead of two), rounded up to a multiple of 256:
     * Meta's rule, which gives LlamaConfig's 11008 for 4096. */
    if (c->intermediate_size == 0 && c->n_embd > 0)
        c->intermediate_size = (int)(((long long)8 * c->n_embd / 3 + 255) / 256 * 256);
}

/* Beyond the keys every family reads: grouped heads, SwiGLU width, rotary positions and their scaling,
 * RMSNorm and an untied head, none of which a GPT-2 has. */
const char *const model_llama_keys[] = {"n_kv_head", "intermediate_size", "rope_theta", "rope_scaling",
                                        "rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                                        "rope_original_max_position_embeddings", "rms_norm_eps",
                                        "tie_word_embeddings", NULL};
/* The same plus the attention window: Mistral's in every layer, Qwen2's (and Qwen3's) from a first layer on. */
#define LLAMA_KEYS                                                                                               \
    "n_kv_head", "intermediate_size", "rope_theta", "rope_scaling", "rope_scaling_factor", "rope_low_freq_factor", \
        "rope_high_freq_factor", "rope_original_max_position_embeddings", "rms_norm_eps", "tie_word_embeddings"
const char *const model_mistral_keys[] = {LLAMA_KEYS, "sliding_window", NULL};
const char *const model_qwen2_keys[] = {LLAMA_KEYS, "sliding_window", "max_window_layers", NULL};

/* The rules between the keys as the user wrote them (an unset n_kv_head or head_dim is 0), so a message can
 * say which key to change; model_llama_check repeats the ones a Hugging Face config.json can break too. */
int model_llama_check_keys(const struct model_config *c)
{
    int hs = model_head_dim(c);
    if (c->n_kv_head > 0 && c->n_head % c->n_kv_head != 0)
        return error_set(FSDP_EINVAL,
                         "model.n_kv_head (%d) must divide model.n_head (%d): each key/value head serves the same "
                         "number of query heads",
                         c->n_kv_head, c->n_head);
    if (hs % 2 != 0 && c->head_dim)
        return error_set(FSDP_EINVAL,
                         "model_family = %s: the head size model.head_dim = %d must be even for rotary position "
                         "embeddings",
                         c->model_family, hs);
    if (hs % 2 != 0)
        return error_set(FSDP_EINVAL,
                         "model_family = %s: the head size model.n_embd / model.n_head = %d / %d = %d must be "
                         "even for rotary position embeddings",
                         c->model_family, c->n_embd, c->n_head, hs);
    if (!(c->rope_theta > 0))
        return error_set(FSDP_EINVAL, "model.rope_theta must be above 0 (got %g)", (double)c->rope_theta);
    if (c->rope_scaling != MODEL_ROPE_DEFAULT && !(c->rope_high_freq_factor > c->rope_low_freq_factor))
        return error_set(FSDP_EINVAL,
                         "model.rope_high_freq_factor (%g) must be above model.rope_low_freq_factor (%g) for "
                         "rope_scaling = llama3",
                         (double)c->rope_high_freq_factor, (double)c->rope_low_freq_factor);
    if (c->max_window_layers > 0 && c->sliding_window == 0)
        return error_set(FSDP_EINVAL,
                         "model.max_window_layers (%d) needs model.sliding_window: it is the first layer that attends "
                         "through the window; set model.sliding_window or remove model.max_window_layers",
                         c->max_window_layers);
    return 0;
}

int model_llama_check(const struct model_config *c)
{
    if (c->n_kv_head < 1 || c->n_head % c->n_kv_head != 0)
        return error_set(FSDP_EINVAL, "model: n_kv_head (%d) must divide n_head (%d)", c->n_kv_head, c->n_head);
    if (c->head_dim % 2 != 0)
        return error_set(FSDP_EINVAL, "model: the head size head_dim = %d must be even for rotary position embeddings",
                         c->head_dim);
    if (c->intermediate_size < 1 || (long long)c->intermediate_size * 2 > 1 << 30)
        return error_set(FSDP_EINVAL, "model: intermediate_size must be in [1, %d] (got %d)", 1 << 29,
                         c->intermediate_size);
    if (!(c->rope_theta > 0))
        return error_set(FSDP_EINVAL, "model: rope_theta must be above 0 (got %g)", (double)c->rope_theta);
    if (c->rope_scaling != MODEL_ROPE_DEFAULT && c->rope_scaling != MODEL_ROPE_LLAMA3)
        return error_set(FSDP_EINVAL, "model: unknown rope scaling %d (none or llama3)", c->rope_scaling);
    if (c->rope_scaling == MODEL_ROPE_LLAMA3 &&
        (!(c->rope_factor >= 1) || !(c->rope_low_freq_factor > 0) ||
         !(c->rope_high_freq_factor > c->rope_low_freq_factor) || c->rope_original_max_position < 1))
        return error_set(FSDP_EINVAL,
                         "model: llama3 rope scaling needs factor >= 1, low_freq_factor > 0, high_freq_factor > "
                         "low_freq_factor and original_max_position_embeddings >= 1 (got %g, %g, %g, %d)",
                         (double)c->rope_factor, (double)c->rope_low_freq_factor, (double)c->rope_high_freq_factor,
                         c->rope_original_max_position);
    if (!(c->rms_norm_eps >= 0))
        return error_set(FSDP_EINVAL, "model: rms_norm_eps must be >= 0 (got %g)", (double)c->rms_norm_eps);
    if (c->sliding_window < 0 || c->max_window_layers < 0)
        return error_set(FSDP_EINVAL, "model: sliding_window (%d) and max_window_layers (%d) must be >= 0",
                         c->sliding_window, c->max_window_layers);
    return 0;
}

/* The module classes of a Llama-style family, as transformers names them. */
struct llama_classes {
    const char *causal_lm, *model, *layer, *attention, *mlp, *norm;
};
static int layout_build(struct model_layout *l, const struct model_config *c, const struct llama_classes *cls);
static const struct llama_classes llama_classes = {"LlamaForCausalLM", "LlamaModel", "LlamaDecoderLayer",
                                                   "LlamaAttention", "LlamaMLP", "LlamaRMSNorm"};
static const struct llama_classes qwen2_classes = {"Qwen2ForCausalLM", "Qwen2Model", "Qwen2DecoderLayer",
                                                   "Qwen2Attention", "Qwen2MLP", "Qwen2RMSNorm"};
static const struct llama_classes mistral_classes = {"MistralForCausalLM", "MistralModel", "MistralDecoderLayer",
                                                     "MistralAttention", "MistralMLP", "MistralRMSNorm"};
static const struct llama_classes qwen3_classes = {"Qwen3ForCausalLM", "Qwen3Model", "Qwen3DecoderLayer",
                                                   "Qwen3Attention", "Qwen3MLP", "Qwen3RMSNorm"};

void model_qwen3_resolve(struct model_config *c)
{
    model_llama_resolve(c);
    c->qk_norm = true; /* Qwen3: per-head RMSNorm of q and k before rope; no biases */
}

int model_qwen3_layout_build(struct model_layout *l, const struct model_config *c)
{
    return layout_build(l, c, &qwen3_classes);
}

void model_qwen2_resolve(struct model_config *c)
{
    model_llama_resolve(c);
    c->qkv_bias = true; /* Qwen2's q_proj, k_proj and v_proj have biases; o_proj and the MLP none */
}

int model_mistral_layout_build(struct model_layout *l, const struct model_config *c)
{
    return layout_build(l, c, &mistral_classes);
}

int model_llama_layout_build(struct model_layout *l, const struct model_config *c)
{
    return layout_build(l, c, &llama_classes);
}

int model_qwen2_layout_build(struct model_layout *l, const struct model_config *c)
{
    return layout_build(l, c, &qwen2_classes);
}

static int layout_build(struct model_layout *l, const struct model_config *c, const struct llama_classes *cls)
{
    int C = c->n_embd, L = c->n_layer, hs = c->head_dim, I = c->intermediate_size;
    int q_rows = c->n_head * hs, kv_rows = c->n_kv_head * hs;
    float std = c->init_std;
    l->vocab_padded = (c->vocab_size + MODEL_VOCAB_ALIGN - 1) / MODEL_VOCAB_ALIGN * MODEL_VOCAB_ALIGN;

    /* Modules in the order LlamaForCausalLM registers them, which is the order of its state dict. */
    int root, model, emb, layers, norm, head = -1;
    FSDP_TRY(root = model_layout_add_module(l, -1, "", cls->causal_lm));
    FSDP_TRY(model = model_layout_add_module(l, root, "model", cls->model));
    FSDP_TRY(emb = model_layout_add_module(l, model, "model.embed_tokens", "Embedding"));
    FSDP_TRY(layers = model_layout_add_module(l, model, "model.layers", "ModuleList"));
    int first = l->n_modules;
    char n[MODEL_NAME_MAX];
    static const char *const proj[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                       "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                       "mlp.down_proj"};
    for (int i = 0; i < L; i++) {
        int b, a, m;
        snprintf(n, sizeof n, "model.layers.%d", i);
        FSDP_TRY(b = model_layout_add_module(l, layers, n, cls->layer));
        snprintf(n, sizeof n, "model.layers.%d.self_attn", i);
        FSDP_TRY(a = model_layout_add_module(l, b, n, cls->attention));
        for (int j = 0; j < 4; j++) {
            snprintf(n, sizeof n, "model.layers.%d.%s", i, proj[j]);
            FSDP_TRY(model_layout_add_module(l, a, n, "Linear"));
        }
        for (int j = 0; c->qk_norm && j < 2; j++) { /* Qwen3Attention registers them after o_proj */
            snprintf(n, sizeof n, "model.layers.%d.self_attn.%s", i, j ? "k_norm" : "q_norm");
            FSDP_TRY(model_layout_add_module(l, a, n, cls->norm));
        }
        snprintf(n, sizeof n, "model.layers.%d.mlp", i);
        FSDP_TRY(m = model_layout_add_module(l, b, n, cls->mlp));
        for (int j = 4; j < 7; j++) {
            snprintf(n, sizeof n, "model.layers.%d.%s", i, proj[j]);
            FSDP_TRY(model_layout_add_module(l, m, n, "Linear"));
        }
        snprintf(n, sizeof n, "model.layers.%d.input_layernorm", i);
        FSDP_TRY(model_layout_add_module(l, b, n, cls->norm));
        snprintf(n, sizeof n, "model.layers.%d.post_attention_layernorm", i);
        FSDP_TRY(model_layout_add_module(l, b, n, cls->norm));
    }
    int per_layer = (l->n_modules - first) / L;
    FSDP_TRY(norm = model_layout_add_module(l, model, "model.norm", cls->norm));
    if (!c->tie_word_embeddings)
        FSDP_TRY(head = model_layout_add_module(l, root, "lm_head", "Linear"));

    int u, p;
    FSDP_TRY(u = model_layout_add_unit(l, "root", root));
    FSDP_TRY(p = model_layout_add_param(l, emb, u, "weight", 2, l->vocab_padded, C, true, std, 0));
    l->params[p].init_rows = c->vocab_size;
    /* An untied input embedding is only looked up; tied, it is also the LM head's matmul. */
    l->params[p].lookup_only = !c->tie_word_embeddings;
    FSDP_TRY(model_layout_add_param(l, norm, u, "weight", 1, C, 0, false, 0, 1));
    if (head >= 0) {
        FSDP_TRY(p = model_layout_add_param(l, head, u, "weight", 2, l->vocab_padded, C, true, std, 0));
        l->params[p].init_rows = c->vocab_size;
    }
    /* Module offsets inside a layer: +0 layer, +1 self_attn, +2..+5 q/k/v/o, (+6, +7 q_norm, k_norm: nq = 2),
     * +6+nq mlp, +7+nq..+9+nq gate/up/down, +10+nq input_layernorm, +11+nq post_attention_layernorm.
     * transformers initialises every Linear and Embedding with normal(0, initializer_range) (no depth
     * scaling) and the norms with 1. */
    int nq = c->qk_norm ? 2 : 0;
    for (int i = 0; i < L; i++) {
        int b = first + per_layer * i;
        FSDP_TRY(u = model_layout_add_unit(l, l->modules[b].name, b));
        /* with q/k/v biases each projection owns its weight then its bias (zero at init, as transformers
         * initialises Linear biases), so the three weights are not one matrix: the block multiplies each */
        FSDP_TRY(model_layout_add_param(l, b + 2, u, "weight", 2, q_rows, C, true, std, 0));
        if (c->qkv_bias)
            FSDP_TRY(model_layout_add_param(l, b + 2, u, "bias", 1, q_rows, 0, false, 0, 0));
        FSDP_TRY(model_layout_add_param(l, b + 3, u, "weight", 2, kv_rows, C, true, std, 0));
        if (c->qkv_bias)
            FSDP_TRY(model_layout_add_param(l, b + 3, u, "bias", 1, kv_rows, 0, false, 0, 0));
        FSDP_TRY(model_layout_add_param(l, b + 4, u, "weight", 2, kv_rows, C, true, std, 0));
        if (c->qkv_bias)
            FSDP_TRY(model_layout_add_param(l, b + 4, u, "bias", 1, kv_rows, 0, false, 0, 0));
        FSDP_TRY(model_layout_add_param(l, b + 5, u, "weight", 2, C, q_rows, true, std, 0));
        for (int j = 0; j < nq; j++) /* q_norm, k_norm: one head_dim gain each, shared by the heads */
            FSDP_TRY(model_layout_add_param(l, b + 6 + j, u, "weight", 1, hs, 0, false, 0, 1));
        FSDP_TRY(model_layout_add_param(l, b + nq + 7, u, "weight", 2, I, C, true, std, 0));
        FSDP_TRY(model_layout_add_param(l, b + nq + 8, u, "weight", 2, I, C, true, std, 0));
        FSDP_TRY(model_layout_add_param(l, b + nq + 9, u, "weight", 2, C, I, true, std, 0));
        FSDP_TRY(model_layout_add_param(l, b + nq + 10, u, "weight", 1, C, 0, false, 0, 1));
        FSDP_TRY(model_layout_add_param(l, b + nq + 11, u, "weight", 1, C, 0, false, 0, 1));
    }
    return 0;
}

void model_llama_describe(const struct model_config *c, char *out, size_t cap)
{
    int n = snprintf(out, cap, ", %d key/value heads, intermediate %d, rope_theta %g%s, rms_norm_eps %g, %s head",
                     c->n_kv_head, c->intermediate_size, (double)c->rope_theta,
                     c->rope_scaling == MODEL_ROPE_LLAMA3 ? " (llama3 scaling)" : "", (double)c->rms_norm_eps,
                     c->tie_word_embeddings ? "tied" : "untied");
    if (c->sliding_window > 0 && n >= 0 && (size_t)n < cap) {
        if (c->max_window_layers > 0)
            snprintf(out + n, cap - (size_t)n, ", sliding window %d from layer %d", c->sliding_window,
                     c->max_window_layers);
        else
            snprintf(out + n, cap - (size_t)n, ", sliding window %d", c->sliding_window);
    }
}

/* The run summary's Llama fields: the values in effect, defaults resolved. */
int model_llama_summary_fields(const struct model_config *c, struct model_field *out, int cap)
{
    bool scaled = c->rope_scaling == MODEL_ROPE_LLAMA3;
    const struct model_field f[] = {
        {.name = "n_kv_head", .num = c->n_kv_head},
        {.name = "intermediate_size", .num = c->intermediate_size},
        {.name = "rope_theta", .num = c->rope_theta},
        {.name = "rms_norm_eps", .num = c->rms_norm_eps},
        {.name = "tie_word_embeddings", .num = c->tie_word_embeddings, .is_bool = true},
        {.name = "rope_scaling", .str = scaled ? "llama3" : "none"},
        {.name = "rope_scaling_factor", .num = c->rope_factor},
        {.name = "rope_low_freq_factor", .num = c->rope_low_freq_factor},
        {.name = "rope_high_freq_factor", .num = c->rope_high_freq_factor},
        {.name = "rope_original_max_position_embeddings", .num = c->rope_original_max_position},
    };
    int n = scaled ? 10 : 6; /* the scaling's numbers only where they apply */
    for (int i = 0; i < n && i < cap; i++)
        out[i] = f[i];
    if (c->sliding_window > 0) { /* the window only where there is one */
        const struct model_field w[] = {{.name = "sliding_window", .num = c->sliding_window},
                                        {.name = "max_window_layers", .num = c->max_window_layers}};
        for (int i = 0; i < 2; i++, n++)
            if (n < cap)
                out[n] = w[i];
    }
    return n;
}
