/* GPT-2's Hugging Face entry: transformers' GPT2LMHeadModel. Its config.json keys map onto the [model]
 * keys (n_positions is the longest context, so block_size may be smaller); keys the model computes one way
 * only (tanh GELU, LayerNorm eps 1e-5, 4 x n_embd MLP, tied head) must say so. Files saved from
 * GPT2LMHeadModel prefix "transformer." and may hold the causal-mask buffers and the tied lm_head. */
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "worker/model/model_hf_internal.h"

/* The model's LayerNorm epsilon (model_gpt2.c). */
#define GPT2_LN_EPS 1e-5
/* GPT-2's <|endoftext|>, used for bos and eos when the vocabulary holds it and no tokenizer says more. */
#define GPT2_EOT 50256

static int gpt2_config_read(struct model_hf_json *j, struct model_config *c)
{
    int n_inner = 0;
    bool tied = true;
    static const char *const gelu[] = {"gelu_new", "gelu_pytorch_tanh", NULL};
    /* Defaults are transformers' GPT2Config defaults, which from_pretrained would use for absent keys. */
    FSDP_TRY(model_hf_json_setting(j, "model_family", "gpt2", "architectures"));
    FSDP_TRY(model_hf_json_int(j, "n_layer", "n_layer", 12, 0, &c->n_layer));
    FSDP_TRY(model_hf_json_int(j, "n_head", "n_head", 12, 0, &c->n_head));
    FSDP_TRY(model_hf_json_int(j, "n_embd", "n_embd", 768, 0, &c->n_embd));
    FSDP_TRY(model_hf_json_int(j, "vocab_size", "vocab_size", 50257, 0, &c->vocab_size));
    FSDP_TRY(model_hf_json_int(j, "n_positions", "block_size", 1024, MODEL_HF_AT_MOST, &c->block_size));
    FSDP_TRY(model_hf_json_float(j, "initializer_range", NULL, 0.02, 0, &c->init_std));
    /* 4 n_embd in 64 bits: n_embd is not bounded yet (the generic checks come after the family's keys) */
    long long wide = 4LL * c->n_embd;
    if (wide > 1LL << 30)
        return error_set(FSDP_EINVAL, "%s: \"n_embd\" is %d, too large: 4 x n_embd must be at most %d", j->path,
                         c->n_embd, 1 << 30);
    FSDP_TRY(model_hf_json_int(j, "n_inner", NULL, (int)wide, 0, &n_inner));
    if (n_inner != wide)
        return error_set(FSDP_EUNSUPPORTED, "%s: \"n_inner\" is %d, but fsdpc's GPT-2 MLP is 4 x n_embd = %lld wide",
                         j->path, n_inner, wide);
    FSDP_TRY(model_hf_json_expect_str(j, "activation_function", gelu,
                                      "fsdpc's GPT-2 computes the tanh GELU only (\"gelu_new\")"));
    FSDP_TRY(model_hf_json_expect_num(j, "layer_norm_epsilon", GPT2_LN_EPS, "fsdpc's GPT-2 LayerNorm uses 1e-05"));
    FSDP_TRY(model_hf_json_expect_bool(j, "scale_attn_weights", true,
                                       "fsdpc's GPT-2 scales attention scores by 1/sqrt(head size)"));
    FSDP_TRY(model_hf_json_expect_bool(j, "scale_attn_by_inverse_layer_idx", false,
                                       "fsdpc's GPT-2 does not scale attention by layer"));
    FSDP_TRY(model_hf_json_expect_bool(j, "add_cross_attention", false, "fsdpc's GPT-2 is a decoder only"));
    FSDP_TRY(model_hf_json_bool(j, "tie_word_embeddings", NULL, true, 0, &tied));
    if (!tied)
        return error_set(FSDP_EUNSUPPORTED,
                         "%s: \"tie_word_embeddings\" is false, but fsdpc's GPT-2 ties its output head to wte", j->path);
    return 0;
}

static int gpt2_config_write(const struct model_config *c, const struct model_hf_tokens *t, cJSON *o)
{
    int eos = t->eos >= 0 ? t->eos : (c->vocab_size > GPT2_EOT ? GPT2_EOT : c->vocab_size - 1);
    int bos = t->bos >= 0 ? t->bos : eos;
    bool ok = cJSON_AddStringToObject(o, "activation_function", "gelu_new") &&
              cJSON_AddNumberToObject(o, "attn_pdrop", 0.0) && cJSON_AddNumberToObject(o, "bos_token_id", bos) &&
              cJSON_AddNumberToObject(o, "embd_pdrop", 0.0) && cJSON_AddNumberToObject(o, "eos_token_id", eos) &&
              model_hf_json_add_float(o, "initializer_range", c->init_std) == 0 &&
              cJSON_AddNumberToObject(o, "layer_norm_epsilon", GPT2_LN_EPS) &&
              cJSON_AddNumberToObject(o, "n_embd", c->n_embd) && cJSON_AddNumberToObject(o, "n_head", c->n_head) &&
              cJSON_AddNullToObject(o, "n_inner") && cJSON_AddNumberToObject(o, "n_layer", c->n_layer) &&
              cJSON_AddNumberToObject(o, "n_positions", c->block_size) &&
              cJSON_AddNumberToObject(o, "resid_pdrop", 0.0) &&
              cJSON_AddBoolToObject(o, "scale_attn_by_inverse_layer_idx", false) &&
              cJSON_AddBoolToObject(o, "scale_attn_weights", true) &&
              cJSON_AddBoolToObject(o, "tie_word_embeddings", true) &&
              cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    return ok ? 0 : error_set(FSDP_ENOMEM, "out of memory");
}

/* The tied head and, per block, the causal-mask buffers older transformers versions saved. A suffix test
 * for "attn.bias" would also match "c_attn.bias", hence the exact names. */
static bool gpt2_ignored(const struct model_config *c, const char *name)
{
    if (strcmp(name, "lm_head.weight") == 0)
        return true;
    int i, n = 0;
    if (sscanf(name, "h.%d.attn.%n", &i, &n) != 1 || n == 0 || i < 0 || i >= c->n_layer)
        return false;
    char want[MODEL_NAME_MAX];
    snprintf(want, sizeof want, "h.%d.attn.", i);
    if (strncmp(name, want, strlen(want)) != 0) /* "h.01.attn." is not block 1's name */
        return false;
    return strcmp(name + n, "bias") == 0 || strcmp(name + n, "masked_bias") == 0;
}

const struct model_hf_family model_gpt2_hf = {
    .architecture = "GPT2LMHeadModel",
    .model_type = "gpt2",
    .prefix = "transformer.",
    .config_read = gpt2_config_read,
    .config_write = gpt2_config_write,
    .ignored = gpt2_ignored,
};
