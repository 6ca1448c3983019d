/* Llama's Hugging Face entry: transformers' LlamaForCausalLM. Layout names are already Hugging Face's
 * (model.embed_tokens.weight, model.layers.{i}.self_attn.q_proj.weight, ..., lm_head.weight when untied)
 * and nn.Linear weights are stored (out, in) in both, so there is no prefix and no transpose. The rotary
 * base and scaling are "rope_parameters": {"rope_theta", "rope_type", ...} in transformers 5 and a top-level
 * "rope_theta" with "rope_scaling" in 4.x: both are read and written; rope types "default" and "llama3"
 * (Llama 3.1+). head_dim is read (default hidden_size / num_attention_heads). Keys the model computes one
 * way only (SiLU, no biases) must say so. */
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "worker/model/model_hf_internal.h"

/* The rotary parameters of one dict: transformers 5's "rope_parameters" (rope_theta inside) or 4.x's
 * "rope_scaling" (its type under "rope_type", or "type" in older files). "default" and "llama3" are read;
 * any other type is refused with that list. */
static int rope_dict_read(struct model_hf_json *j, const cJSON *dict, const char *key, bool has_theta,
                          struct model_config *c)
{
    char path[FSDP_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s (%s)", j->path, key);
    struct model_hf_json sub = {.root = dict, .path = path, .out = j->out};
    if (has_theta)
        FSDP_TRY(model_hf_json_float(&sub, "rope_theta", "rope_theta", 10000.0, 0, &c->rope_theta));
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(dict, "rope_type");
    if (!type || cJSON_IsNull(type))
        type = cJSON_GetObjectItemCaseSensitive(dict, "type");
    const char *name = cJSON_IsString(type) ? type->valuestring : "default";
    if (type && !cJSON_IsNull(type) && !cJSON_IsString(type))
        return error_set(FSDP_EINVAL, "%s: \"rope_type\" must be a string", path);
    if (strcmp(name, "default") == 0) {
        c->rope_scaling = MODEL_ROPE_DEFAULT;
        return 0;
    }
    if (strcmp(name, "llama3") != 0)
        return error_set(FSDP_EUNSUPPORTED,
                         "%s: rope_type \"%s\" is not one fsdpc's Llama computes; it reads \"default\" and \"llama3\" "
                         "(Llama 3.1+: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)",
                         path, name);
    c->rope_scaling = MODEL_ROPE_LLAMA3;
    FSDP_TRY(model_hf_json_setting(j, "rope_scaling", "llama3", "rope_type"));
    FSDP_TRY(model_hf_json_float(&sub, "factor", "rope_scaling_factor", 0, MODEL_HF_REQUIRED, &c->rope_factor));
    FSDP_TRY(model_hf_json_float(&sub, "low_freq_factor", "rope_low_freq_factor", 0, MODEL_HF_REQUIRED,
                                 &c->rope_low_freq_factor));
    FSDP_TRY(model_hf_json_float(&sub, "high_freq_factor", "rope_high_freq_factor", 0, MODEL_HF_REQUIRED,
                                 &c->rope_high_freq_factor));
    return model_hf_json_int(&sub, "original_max_position_embeddings", "rope_original_max_position_embeddings", 0,
                             MODEL_HF_REQUIRED, &c->rope_original_max_position);
}

/* What differs between the Llama-style families' config.json: the family, transformers' defaults for absent
 * keys, and whether the attention_bias/mlp_bias keys exist (Llama) or the q/k/v biases are built in and a
 * sliding window may be configured (Qwen2), or the window is Mistral's. */
enum llama_window { WINDOW_NONE, WINDOW_QWEN2, WINDOW_MISTRAL };
struct llama_style {
    const char *family;
    int layers, heads, hidden, intermediate, vocab, positions;
    int head_dim;    /* transformers' default; 0 = hidden_size / num_attention_heads */
    enum llama_window window; /* QWEN2: use_sliding_window, sliding_window, max_window_layers, layer_types;
                                 MISTRAL: sliding_window in every layer; NONE: mlp_bias (which must be false) */
    bool bias_key;   /* attention_bias, which must be false */
};
static const struct llama_style llama_style = {"llama", 32, 32, 4096, 11008, 32000, 2048, 0, WINDOW_NONE, true};
static const struct llama_style qwen2_style = {"qwen2", 32, 32, 4096, 22016, 151936, 32768, 0, WINDOW_QWEN2, false};
static const struct llama_style qwen3_style = {"qwen3", 32, 32, 4096, 22016, 151936, 32768, 128, WINDOW_QWEN2, true};
static const struct llama_style mistral_style = {"mistral", 32, 32, 4096, 14336, 32000, 131072, 0, WINDOW_MISTRAL,
                                                 false};

/* The window's size, as transformers reads "sliding_window": absent = its config class's default (4096), null
 * = none (0), else an integer >= 1. */
static int window_size_read(struct model_hf_json *j, int *dst)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j->root, "sliding_window");
    if (cJSON_IsNull(v)) {
        *dst = 0;
        return 0;
    }
    FSDP_TRY(model_hf_json_int(j, "sliding_window", NULL, 4096, 0, dst));
    if (*dst < 1)
        return error_set(FSDP_EINVAL, "%s: \"sliding_window\" is %d; it must be null (no window) or >= 1 (tokens a "
                         "query sees, itself included)", j->path, *dst);
    return 0;
}

/* Records the window as [model] settings (only where there is one: 0 is every key's default). */
static int window_record(struct model_hf_json *j, const struct model_config *c, bool layers)
{
    char text[32];
    if (c->sliding_window == 0)
        return 0;
    snprintf(text, sizeof text, "%d", c->sliding_window);
    FSDP_TRY(model_hf_json_setting(j, "sliding_window", text, "sliding_window"));
    if (!layers)
        return 0;
    snprintf(text, sizeof text, "%d", c->max_window_layers);
    return model_hf_json_setting(j, "max_window_layers", text, "max_window_layers");
}

/* Qwen2's (and Qwen3's) window, as their config classes apply it: with use_sliding_window the layers from
 * max_window_layers on see the last sliding_window tokens; "layer_types", where present, says per layer
 * ("full_attention" or "sliding_attention") and wins. fsdpc's window starts at one layer and holds for every
 * later one, so layer_types must be full layers then sliding ones. */
static int qwen2_window_read(struct model_hf_json *j, struct model_config *c)
{
    bool use = false;
    FSDP_TRY(model_hf_json_bool(j, "use_sliding_window", NULL, false, 0, &use));
    int window = 0, first = 28; /* Qwen2Config's max_window_layers */
    if (use)
        FSDP_TRY(window_size_read(j, &window));
    FSDP_TRY(model_hf_json_int(j, "max_window_layers", NULL, 28, 0, &first));
    if (first < 0)
        return error_set(FSDP_EINVAL, "%s: \"max_window_layers\" is %d; it must be >= 0", j->path, first);
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(j->root, "layer_types");
    if (cJSON_IsArray(types)) {
        int i = 0, first_sliding = -1;
        const cJSON *t;
        cJSON_ArrayForEach(t, types) {
            bool full = cJSON_IsString(t) && strcmp(t->valuestring, "full_attention") == 0;
            bool sliding = cJSON_IsString(t) && strcmp(t->valuestring, "sliding_attention") == 0;
            if (!full && !sliding)
                return error_set(FSDP_EUNSUPPORTED, "%s: \"layer_types\"[%d] is neither \"full_attention\" nor "
                                 "\"sliding_attention\"", j->path, i);
            if (sliding && !window)
                return error_set(FSDP_EUNSUPPORTED, "%s: \"layer_types\"[%d] is \"sliding_attention\" but there is "
                                 "no window (\"use_sliding_window\" false or \"sliding_window\" null); set "
                                 "use_sliding_window and sliding_window, or make every layer \"full_attention\"",
                                 j->path, i);
            if (sliding && first_sliding < 0)
                first_sliding = i;
            if (full && first_sliding >= 0)
                return error_set(FSDP_EUNSUPPORTED, "%s: \"layer_types\" has a \"full_attention\" layer (%d) after "
                                 "a \"sliding_attention\" one (%d); fsdpc's window holds from one layer "
                                 "(max_window_layers) to the last", j->path, i, first_sliding);
            i++;
        }
        first = first_sliding >= 0 ? first_sliding : i;
    }
    if (window && first >= c->n_layer && c->n_layer > 0)
        window = 0; /* no layer reaches the window */
    c->sliding_window = window;
    c->max_window_layers = window ? first : 0;
    return window_record(j, c, true);
}

/* Mistral's window, in every layer. */
static int mistral_window_read(struct model_hf_json *j, struct model_config *c)
{
    FSDP_TRY(window_size_read(j, &c->sliding_window));
    c->max_window_layers = 0;
    if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j->root, "layer_types")))
        return error_set(FSDP_EUNSUPPORTED, "%s: \"layer_types\" (a window in some layers only) is Ministral's, "
                         "not MistralForCausalLM's; fsdpc's Mistral applies \"sliding_window\" in every layer",
                         j->path);
    return window_record(j, c, false);
}

static int style_config_read(struct model_hf_json *j, struct model_config *c, const struct llama_style *st)
{
    static const char *const silu[] = {"silu", "swish", NULL};
    /* Defaults are transformers' config class defaults, which from_pretrained would use for absent keys. */
    FSDP_TRY(model_hf_json_setting(j, "model_family", st->family, "architectures"));
    FSDP_TRY(model_hf_json_int(j, "num_hidden_layers", "n_layer", st->layers, 0, &c->n_layer));
    FSDP_TRY(model_hf_json_int(j, "num_attention_heads", "n_head", st->heads, 0, &c->n_head));
    FSDP_TRY(model_hf_json_int(j, "num_key_value_heads", "n_kv_head", c->n_head, 0, &c->n_kv_head));
    FSDP_TRY(model_hf_json_int(j, "hidden_size", "n_embd", st->hidden, 0, &c->n_embd));
    FSDP_TRY(model_hf_json_int(j, "intermediate_size", "intermediate_size", st->intermediate, 0, &c->intermediate_size));
    FSDP_TRY(model_hf_json_int(j, "vocab_size", "vocab_size", st->vocab, 0, &c->vocab_size));
    FSDP_TRY(model_hf_json_int(j, "max_position_embeddings", "block_size", st->positions, MODEL_HF_AT_MOST,
                               &c->block_size));
    FSDP_TRY(model_hf_json_float(j, "rms_norm_eps", "rms_norm_eps", 1e-6, 0, &c->rms_norm_eps));
    FSDP_TRY(model_hf_json_bool(j, "tie_word_embeddings", "tie_word_embeddings", false, 0, &c->tie_word_embeddings));
    FSDP_TRY(model_hf_json_float(j, "initializer_range", NULL, 0.02, 0, &c->init_std));
    /* the rotary base and scaling: transformers 5's rope_parameters, else 4.x's top-level rope_theta and
     * rope_scaling */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j->root, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j->root, "rope_scaling");
    if (cJSON_IsObject(rp)) {
        FSDP_TRY(rope_dict_read(j, rp, "rope_parameters", true, c));
    } else {
        FSDP_TRY(model_hf_json_float(j, "rope_theta", "rope_theta", 10000.0, 0, &c->rope_theta));
        if (cJSON_IsObject(rs))
            FSDP_TRY(rope_dict_read(j, rs, "rope_scaling", false, c));
        else if (rs && !cJSON_IsNull(rs))
            return error_set(FSDP_EINVAL, "%s: \"rope_scaling\" must be an object or null", j->path);
    }
    FSDP_TRY(model_hf_json_expect_str(j, "hidden_act", silu, "fsdpc's Llama MLP is SwiGLU (\"silu\")"));
    if (st->window == WINDOW_QWEN2)
        FSDP_TRY(qwen2_window_read(j, c));
    else if (st->window == WINDOW_MISTRAL)
        FSDP_TRY(mistral_window_read(j, c));
    else
        FSDP_TRY(model_hf_json_expect_bool(j, "mlp_bias", false, "fsdpc's Llama has no biases"));
    if (st->bias_key)
        FSDP_TRY(model_hf_json_expect_bool(j, "attention_bias", false,
                                           st->window == WINDOW_QWEN2 ? "fsdpc's Qwen3 has no q/k/v biases"
                                                                      : "fsdpc's Llama has no biases"));
    /* transformers' default is hidden_size / num_attention_heads; any even width is computed (Qwen3's 128 with
     * a 1024-wide Qwen3-0.6B, for one) */
    if (c->n_head > 0)
        FSDP_TRY(model_hf_json_int(j, "head_dim", "head_dim", st->head_dim ? st->head_dim : c->n_embd / c->n_head, 0,
                                   &c->head_dim));
    return 0;
}

static int llama_config_read(struct model_hf_json *j, struct model_config *c)
{
    return style_config_read(j, c, &llama_style);
}

static int qwen2_config_read(struct model_hf_json *j, struct model_config *c)
{
    return style_config_read(j, c, &qwen2_style);
}

static int qwen3_config_read(struct model_hf_json *j, struct model_config *c)
{
    return style_config_read(j, c, &qwen3_style);
}

static int mistral_config_read(struct model_hf_json *j, struct model_config *c)
{
    return style_config_read(j, c, &mistral_style);
}

static int style_config_write(const struct model_config *c, const struct model_hf_tokens *t, cJSON *o,
                              const struct llama_style *st);

static int qwen3_config_write(const struct model_config *c, const struct model_hf_tokens *t, cJSON *o)
{
    return style_config_write(c, t, o, &qwen3_style);
}

static int llama_config_write(const struct model_config *c, const struct model_hf_tokens *t, cJSON *o)
{
    return style_config_write(c, t, o, &llama_style);
}

static int qwen2_config_write(const struct model_config *c, const struct model_hf_tokens *t, cJSON *o)
{
    return style_config_write(c, t, o, &qwen2_style);
}

static int mistral_config_write(const struct model_config *c, const struct model_hf_tokens *t, cJSON *o)
{
    return style_config_write(c, t, o, &mistral_style);
}

/* "sliding_window": the window, or null for none. */
static bool add_window(cJSON *o, const struct model_config *c)
{
    return c->sliding_window > 0 ? cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window) != NULL
                                 : cJSON_AddNullToObject(o, "sliding_window") != NULL;
}

static int style_config_write(const struct model_config *c, const struct model_hf_tokens *t, cJSON *o,
                              const struct llama_style *st)
{
    /* LlamaConfig's 1 and 2 when the tokenizer says nothing; always inside the vocabulary */
    int bos = t->bos >= 0 ? t->bos : (c->vocab_size > 1 ? 1 : 0);
    int eos = t->eos >= 0 ? t->eos : (c->vocab_size > 2 ? 2 : c->vocab_size - 1);
    /* rope_parameters (transformers 5) with the base inside, and for 4.x the top-level rope_theta and a
     * rope_scaling with the same scaling (null without) */
    bool llama3 = c->rope_scaling == MODEL_ROPE_LLAMA3;
    cJSON *rp = cJSON_CreateObject(), *rs = llama3 ? cJSON_CreateObject() : cJSON_CreateNull();
    bool ok = rp && rs && model_hf_json_add_float(rp, "rope_theta", c->rope_theta) == 0;
    for (int i = 0; ok && i < (llama3 ? 2 : 1); i++) {
        cJSON *d = i == 0 ? rp : rs;
        ok = cJSON_AddStringToObject(d, "rope_type", llama3 ? "llama3" : "default") &&
             (!llama3 || (model_hf_json_add_float(d, "factor", c->rope_factor) == 0 &&
                          model_hf_json_add_float(d, "low_freq_factor", c->rope_low_freq_factor) == 0 &&
                          model_hf_json_add_float(d, "high_freq_factor", c->rope_high_freq_factor) == 0 &&
                          cJSON_AddNumberToObject(d, "original_max_position_embeddings", c->rope_original_max_position)));
    }
    if (ok && cJSON_AddItemToObject(o, "rope_parameters", rp))
        rp = NULL;
    else
        ok = false;
    if (ok && cJSON_AddItemToObject(o, "rope_scaling", rs))
        rs = NULL;
    else
        ok = false;
    cJSON_Delete(rp);
    cJSON_Delete(rs);
    if (st->window == WINDOW_QWEN2) /* the config class derives layer_types from these */
        ok = ok && cJSON_AddBoolToObject(o, "use_sliding_window", c->sliding_window > 0) && add_window(o, c) &&
             cJSON_AddNumberToObject(o, "max_window_layers", c->sliding_window > 0 ? c->max_window_layers : c->n_layer);
    else if (st->window == WINDOW_MISTRAL)
        ok = ok && add_window(o, c);
    else
        ok = ok && cJSON_AddBoolToObject(o, "mlp_bias", false);
    if (st->bias_key)
        ok = ok && cJSON_AddBoolToObject(o, "attention_bias", false);
    ok = ok && cJSON_AddNumberToObject(o, "attention_dropout", 0.0) &&
         cJSON_AddNumberToObject(o, "bos_token_id", bos) && cJSON_AddNumberToObject(o, "eos_token_id", eos) &&
         cJSON_AddNumberToObject(o, "head_dim", model_head_dim(c)) && cJSON_AddStringToObject(o, "hidden_act", "silu") &&
         cJSON_AddNumberToObject(o, "hidden_size", c->n_embd) &&
         model_hf_json_add_float(o, "initializer_range", c->init_std) == 0 &&
         cJSON_AddNumberToObject(o, "intermediate_size", c->intermediate_size) &&
         cJSON_AddNumberToObject(o, "max_position_embeddings", c->block_size) &&
         cJSON_AddNumberToObject(o, "num_attention_heads", c->n_head) &&
         cJSON_AddNumberToObject(o, "num_hidden_layers", c->n_layer) &&
         cJSON_AddNumberToObject(o, "num_key_value_heads", c->n_kv_head) &&
         model_hf_json_add_float(o, "rms_norm_eps", c->rms_norm_eps) == 0 &&
         model_hf_json_add_float(o, "rope_theta", c->rope_theta) == 0 &&
         cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings) &&
         cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    return ok ? 0 : error_set(FSDP_ENOMEM, "out of memory");
}

/* The tied head when tied, and the rotary inv_freq buffer older transformers versions saved per layer. */
static bool llama_ignored(const struct model_config *c, const char *name)
{
    if (c->tie_word_embeddings && strcmp(name, "lm_head.weight") == 0)
        return true;
    int i, n = 0;
    if (sscanf(name, "model.layers.%d.self_attn.rotary_emb.inv_freq%n", &i, &n) != 1 || name[n] != '\0' || i < 0 ||
        i >= c->n_layer)
        return false;
    char want[MODEL_NAME_MAX];
    snprintf(want, sizeof want, "model.layers.%d.self_attn.rotary_emb.inv_freq", i);
    return strcmp(name, want) == 0;
}

const struct model_hf_family model_qwen2_hf = {
    .architecture = "Qwen2ForCausalLM",
    .model_type = "qwen2",
    .prefix = "",
    .config_read = qwen2_config_read,
    .config_write = qwen2_config_write,
    .ignored = llama_ignored,
};

const struct model_hf_family model_qwen3_hf = {
    .architecture = "Qwen3ForCausalLM",
    .model_type = "qwen3",
    .prefix = "",
    .config_read = qwen3_config_read,
    .config_write = qwen3_config_write,
    .ignored = llama_ignored,
};

const struct model_hf_family model_mistral_hf = {
    .architecture = "MistralForCausalLM",
    .model_type = "mistral",
    .prefix = "",
    .config_read = mistral_config_read,
    .config_write = mistral_config_write,
    .ignored = llama_ignored,
};

const struct model_hf_family model_llama_hf = {
    .architecture = "LlamaForCausalLM",
    .model_type = "llama",
    .prefix = "",
    .config_read = llama_config_read,
    .config_write = llama_config_write,
    .ignored = llama_ignored,
};
