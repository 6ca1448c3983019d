/* The model-family registry: model_config.model_family names one entry; adding a family is adding a
 * line here plus its layout builder, its decoder block (model_core.c runs the rest), the [model] keys it
 * reads with their checks (worker/config asks here which family reads which key) and (for Hugging Face
 * config.json and names) its HF entry. */
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "worker/model/model_hf_internal.h"

/* transformers' GPT2Model module classes (modeling_gpt2.py) for ours. */
static const struct model_class_names gpt2_names[] = {
    {"GPT2Model", "GPT2Model", NULL}, {"DecoderBlock", "GPT2Block", "Block"},
    {"CausalSelfAttention", "GPT2Attention", NULL}, {"MLP", "GPT2MLP", NULL},
    {"Embedding", "Embedding", NULL}, {"LayerNorm", "LayerNorm", NULL}, {"Conv1D", "Conv1D", NULL},
    {"ModuleList", "ModuleList", NULL}, {NULL, NULL, NULL},
};

/* transformers' LlamaForCausalLM module classes (modeling_llama.py), which ours are; "DecoderBlock", the
 * GPT-2 name of the block, also names Llama's. */
static const struct model_class_names llama_names[] = {
    {"LlamaForCausalLM", "LlamaForCausalLM", NULL}, {"LlamaModel", "LlamaModel", NULL},
    {"LlamaDecoderLayer", "LlamaDecoderLayer", "DecoderBlock"}, {"LlamaAttention", "LlamaAttention", NULL},
    {"LlamaMLP", "LlamaMLP", NULL}, {"LlamaRMSNorm", "LlamaRMSNorm", NULL}, {"Linear", "Linear", NULL},
    {"Embedding", "Embedding", NULL}, {"ModuleList", "ModuleList", NULL}, {NULL, NULL, NULL},
};

/* transformers' Qwen2ForCausalLM module classes (modeling_qwen2.py). */
static const struct model_class_names qwen2_names[] = {
    {"Qwen2ForCausalLM", "Qwen2ForCausalLM", NULL}, {"Qwen2Model", "Qwen2Model", NULL},
    {"Qwen2DecoderLayer", "Qwen2DecoderLayer", "DecoderBlock"}, {"Qwen2Attention", "Qwen2Attention", NULL},
    {"Qwen2MLP", "Qwen2MLP", NULL}, {"Qwen2RMSNorm", "Qwen2RMSNorm", NULL}, {"Linear", "Linear", NULL},
    {"Embedding", "Embedding", NULL}, {"ModuleList", "ModuleList", NULL}, {NULL, NULL, NULL},
};

/* transformers' Qwen3ForCausalLM module classes (modeling_qwen3.py). */
static const struct model_class_names qwen3_names[] = {
    {"Qwen3ForCausalLM", "Qwen3ForCausalLM", NULL}, {"Qwen3Model", "Qwen3Model", NULL},
    {"Qwen3DecoderLayer", "Qwen3DecoderLayer", "DecoderBlock"}, {"Qwen3Attention", "Qwen3Attention", NULL},
    {"Qwen3MLP", "Qwen3MLP", NULL}, {"Qwen3RMSNorm", "Qwen3RMSNorm", NULL}, {"Linear", "Linear", NULL},
    {"Embedding", "Embedding", NULL}, {"ModuleList", "ModuleList", NULL}, {NULL, NULL, NULL},
};

/* transformers' MistralForCausalLM module classes (modeling_mistral.py). */
static const struct model_class_names mistral_names[] = {
    {"MistralForCausalLM", "MistralForCausalLM", NULL}, {"MistralModel", "MistralModel", NULL},
    {"MistralDecoderLayer", "MistralDecoderLayer", "DecoderBlock"}, {"MistralAttention", "MistralAttention", NULL},
    {"MistralMLP", "MistralMLP", NULL}, {"MistralRMSNorm", "MistralRMSNorm", NULL}, {"Linear", "Linear", NULL},
    {"Embedding", "Embedding", NULL}, {"ModuleList", "ModuleList", NULL}, {NULL, NULL, NULL},
};

static const struct model_family families[] = {
    {.name = "gpt2", .about = "LayerNorm, GELU, learned positions, tied head", .check = model_gpt2_check, .layout_build = model_gpt2_layout_build, .decoder = &model_gpt2_decoder, .class_names = gpt2_names,
     .hf = &model_gpt2_hf},
    {.name = "llama", .about = "RMSNorm, SwiGLU, rotary positions, grouped-query attention", .resolve = model_llama_resolve, .check = model_llama_check,
     .keys = model_llama_keys, .check_keys = model_llama_check_keys, .layout_build = model_llama_layout_build, .decoder = &model_llama_decoder, .class_names = llama_names,
     .hf = &model_llama_hf, .describe = model_llama_describe, .summary_fields = model_llama_summary_fields},
    /* Qwen2 and Qwen2.5: Llama's block with q/k/v biases */
    {.name = "qwen2", .about = "llama with q/k/v biases", .resolve = model_qwen2_resolve, .check = model_llama_check,
     .keys = model_qwen2_keys, .check_keys = model_llama_check_keys, .layout_build = model_qwen2_layout_build, .decoder = &model_llama_decoder, .class_names = qwen2_names,
     .hf = &model_qwen2_hf, .describe = model_llama_describe, .summary_fields = model_llama_summary_fields},
    /* Qwen3: Llama's block with a per-head RMSNorm of q and k, head_dim its own */
    {.name = "qwen3", .about = "llama with a per-head RMSNorm of q and k", .resolve = model_qwen3_resolve, .check = model_llama_check,
     .keys = model_qwen2_keys, .check_keys = model_llama_check_keys, .layout_build = model_qwen3_layout_build, .decoder = &model_llama_decoder, .class_names = qwen3_names,
     .hf = &model_qwen3_hf, .describe = model_llama_describe, .summary_fields = model_llama_summary_fields},
    /* Mistral: Llama's block with sliding-window attention in every layer */
    {.name = "mistral", .about = "llama with sliding-window attention", .resolve = model_llama_resolve, .check = model_llama_check,
     .keys = model_mistral_keys, .check_keys = model_llama_check_keys, .layout_build = model_mistral_layout_build, .decoder = &model_llama_decoder, .class_names = mistral_names,
     .hf = &model_mistral_hf, .describe = model_llama_describe, .summary_fields = model_llama_summary_fields},
};
#define N_FAMILIES (sizeof families / sizeof families[0])

int model_family_count(void)
{
    return (int)N_FAMILIES;
}

const char *model_family_name(int i)
{
    return i >= 0 && i < (int)N_FAMILIES ? families[i].name : NULL;
}

const char *model_family_hf_architecture(int i)
{
    return i >= 0 && i < (int)N_FAMILIES && families[i].hf ? families[i].hf->architecture : NULL;
}

const char *model_family_about(int i)
{
    return i >= 0 && i < (int)N_FAMILIES ? families[i].about : NULL;
}

const char *model_family_names(void)
{
    static char buf[256];
    if (!buf[0])
        for (size_t i = 0; i < N_FAMILIES; i++)
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? ", " : "", families[i].name);
    return buf;
}

static bool declares(const struct model_family *f, const char *key)
{
    for (const char *const *k = f->keys; k && *k; k++)
        if (strcmp(*k, key) == 0)
            return true;
    return false;
}

bool model_family_reads_key(const char *family, const char *key)
{
    int declared = 0;
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (declares(&families[i], key)) {
            declared++;
            if (strcmp(families[i].name, family) == 0)
                return true;
        }
    return declared == 0;
}

int model_families_reading(const char *key, char *out, size_t cap)
{
    int n = 0, total = 0;
    for (size_t i = 0; i < N_FAMILIES; i++)
        total += declares(&families[i], key);
    if (cap)
        out[0] = '\0';
    for (size_t i = 0; i < N_FAMILIES && cap; i++)
        if (declares(&families[i], key)) {
            size_t len = strlen(out);
            n++;
            snprintf(out + len, cap - len, "%s%s", n == 1 ? "" : n == total ? " or " : ", ", families[i].name);
        }
    return total;
}

int model_config_check_keys(const struct model_config *cfg)
{
    const struct model_family *f = model_family_find(cfg->model_family);
    if (!f)
        return FSDP_EINVAL;
    return f->check_keys ? f->check_keys(cfg) : 0;
}

const struct model_family *model_family_find(const char *name)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (strcmp(families[i].name, name) == 0)
            return &families[i];
    error_set(FSDP_EINVAL, "unknown model_family \"%s\"; known families: %s", name, model_family_names());
    return NULL;
}

const struct model_family *model_family_find_hf(const char *architecture, const char *model_type, const char *path)
{
    for (size_t i = 0; architecture && i < N_FAMILIES; i++)
        if (families[i].hf && strcmp(families[i].hf->architecture, architecture) == 0)
            return &families[i];
    for (size_t i = 0; model_type && i < N_FAMILIES; i++)
        if (families[i].hf && strcmp(families[i].hf->model_type, model_type) == 0)
            return &families[i];
    char known[256] = "";
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (families[i].hf)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s (model_type \"%s\")",
                     known[0] ? ", " : "", families[i].hf->architecture, families[i].hf->model_type);
    error_set(FSDP_EUNSUPPORTED, "%s: architecture %s%s%s, model_type %s%s%s is not a model fsdpc has; it reads %s",
                     path, architecture ? "\"" : "", architecture ? architecture : "(none)", architecture ? "\"" : "",
                     model_type ? "\"" : "", model_type ? model_type : "(none)", model_type ? "\"" : "", known);
    return NULL;
}

void model_describe(const struct model_layout *l, char *out, size_t cap)
{
    const struct model_family *f = model_family_find(l->config.model_family);
    if (cap)
        out[0] = '\0';
    if (f && f->describe)
        f->describe(&l->config, out, cap);
}

int model_summary_fields(const struct model_layout *l, struct model_field *out, int cap)
{
    const struct model_family *f = model_family_find(l->config.model_family);
    return f && f->summary_fields ? f->summary_fields(&l->config, out, cap) : 0;
}

double model_flops_per_token(const struct model_layout *l)
{
    double matmul = 0;
    for (int i = 0; i < l->n_params; i++)
        if (!l->params[i].lookup_only)
            matmul += (double)l->params[i].init_rows * l->params[i].shape[1];
    const struct model_config *c = &l->config;
    /* a query attends block_size keys in the PaLM count, or its window's where a layer has a shorter one */
    double keys = 0;
    for (int i = 0; i < c->n_layer; i++) {
        int w = model_layer_window(c, i);
        keys += w > 0 && w < c->block_size ? w : c->block_size;
    }
    return 6.0 * matmul + 12.0 * keys * (double)c->n_head * model_head_dim(c);
}

void model_config_default(struct model_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->model_family, sizeof cfg->model_family, "gpt2");
    cfg->init_std = 0.02f;
    cfg->seed = 1337;
    cfg->rope_theta = 10000.0f;
    cfg->rope_scaling = MODEL_ROPE_DEFAULT;
    cfg->rope_factor = 8.0f;
    cfg->rope_low_freq_factor = 1.0f;
    cfg->rope_high_freq_factor = 4.0f;
    cfg->rope_original_max_position = 8192;
    cfg->rms_norm_eps = 1e-6f;
}

static int check_config(const struct model_config *c)
{
    if (c->n_layer < 1 || c->n_head < 1 || c->n_embd < 1 || c->vocab_size < 1 || c->block_size < 1)
        return error_set(FSDP_EINVAL,
                         "model: n_layer, n_head, n_embd, vocab_size and block_size must all be >= 1 "
                         "(got %d, %d, %d, %d, %d)",
                         c->n_layer, c->n_head, c->n_embd, c->vocab_size, c->block_size);
    if (c->head_dim < 0 || (long long)c->head_dim * c->n_head * 4 > 1 << 30)
        return error_set(FSDP_EINVAL, "model: head_dim must be in [1, %d] for %d heads (got %d)",
                         (1 << 28) / c->n_head, c->n_head, c->head_dim);
    if (c->head_dim == 0 && c->n_embd % c->n_head != 0)
        return error_set(FSDP_EINVAL,
                         "model: n_embd (%d) must be a multiple of n_head (%d), or head_dim set (the width of one "
                         "head)",
                         c->n_embd, c->n_head);
    if (!(c->init_std >= 0))
        return error_set(FSDP_EINVAL, "model: init_std must be >= 0 (got %g)", (double)c->init_std);
    /* Sizes are int in the kernels: keep every tensor's element count and the padded vocab in range. */
    if ((long long)c->vocab_size + MODEL_VOCAB_ALIGN > 1LL << 30 || (long long)c->n_embd * 4 > 1 << 30 ||
        (long long)c->block_size > 1 << 24)
        return error_set(FSDP_EINVAL, "model: vocab_size, n_embd or block_size too large");
    return 0;
}

int model_layout_build(struct model_layout *out, const struct model_config *cfg)
{
    memset(out, 0, sizeof *out);
    const struct model_family *f = model_family_find(cfg->model_family);
    if (!f)
        return FSDP_EINVAL;
    out->config = *cfg;
    if (f->resolve)
        f->resolve(&out->config);
    int rc = 0;
    FSDP_TRY_GOTO(check_config(&out->config), rc, fail);
    out->config.head_dim = model_head_dim(&out->config); /* the value in effect, for checkpoints and summaries */
    if (f->check)
        FSDP_TRY_GOTO(f->check(&out->config), rc, fail);
    FSDP_TRY_GOTO(f->layout_build(out, &out->config), rc, fail);
    out->numel_real = 0;
    for (int i = 0; i < out->n_params; i++)
        out->numel_real += (size_t)out->params[i].init_rows * out->params[i].shape[1];
    return 0;
fail:
    model_layout_free(out);
    return rc;
}
