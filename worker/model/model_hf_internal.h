/* What Hugging Face interchange needs of a model family (its registry entry's `hf`), and the config.json
 * helpers families read their keys with. Not for users of the model (they see model_hf.h). */
#ifndef FSDP_WORKER_MODEL_HF_INTERNAL_H
#define FSDP_WORKER_MODEL_HF_INTERNAL_H

#include <cjson/cJSON.h>

#include "worker/model/model_hf.h"
#include "worker/model/model_internal.h"

/* config.json being read for a family (model_hf_config.c); the family reads its keys with the
 * model_hf_json_* helpers, which also record each key's [model] setting in out. */
struct model_hf_json {
    const cJSON *root;
    const char *path; /* the config.json, for messages */
    struct model_hf_config *out;
};

/* What Hugging Face interchange needs of a family. Layout parameter names are Hugging Face's names
 * without `prefix`, and every tensor is stored in the layout's shape (GPT-2's Conv1D weights are (in, out)
 * in both; a Llama layout keeps nn.Linear's (out, in)), so no family needs a transpose. */
struct model_hf_family {
    const char *architecture; /* written to config.json "architectures" and accepted there */
    const char *model_type;   /* config.json "model_type", accepted when "architectures" is absent */
    const char *prefix;       /* before every layout name when writing ("transformer."); optional on reading */
    /* config.json -> cfg (cfg holds model_config_default's values; family defaults for absent keys are the
     * family's to set). Keys the model cannot honour are errors naming the key and what is supported. */
    int (*config_read)(struct model_hf_json *j, struct model_config *cfg);
    /* cfg -> the family's config.json keys (the generic code adds architectures, model_type, dtype). */
    int (*config_write)(const struct model_config *cfg, const struct model_hf_tokens *tokens, cJSON *obj);
    /* A tensor name (prefix removed) that is not a parameter of cfg's layout but that Hugging Face files
     * may hold: buffers (GPT-2's attention masks) and a head tied to the embedding. Exact names only. */
    bool (*ignored)(const struct model_config *cfg, const char *name);
};

/* The family whose Hugging Face architecture (else model_type, when architecture is NULL) this is; NULL
 * with error_set naming path and listing the architectures fsdpc reads. */
const struct model_family *model_family_find_hf(const char *architecture, const char *model_type, const char *path);

/* config.json helpers for the families' config_read (model_hf_json.c). Absent or null keys take def;
 * with MODEL_HF_REQUIRED they are an error instead. ini_key: the [model] key recorded as a setting (NULL:
 * none). MODEL_HF_AT_MOST: the setting is an upper bound (a context length). */
enum { MODEL_HF_REQUIRED = 1, MODEL_HF_AT_MOST = 2 };
int model_hf_json_int(struct model_hf_json *j, const char *hf_key, const char *ini_key, int def, int flags, int *dst);
int model_hf_json_float(struct model_hf_json *j, const char *hf_key, const char *ini_key, double def, int flags,
                        float *dst);
int model_hf_json_bool(struct model_hf_json *j, const char *hf_key, const char *ini_key, bool def, int flags,
                       bool *dst);
/* Records a [model] setting that is not a config.json key of its own (e.g. model_family). */
int model_hf_json_setting(struct model_hf_json *j, const char *ini_key, const char *value, const char *hf_key);
/* A key fsdpc's model computes one way only: absent, null, or equal to one of allowed (strings) is fine;
 * anything else is an error naming the key, its value and `what` the family computes. */
int model_hf_json_expect_str(struct model_hf_json *j, const char *hf_key, const char *const *allowed,
                             const char *what);
/* Same for a number: absent/null or within a relative 1e-6 of want. */
int model_hf_json_expect_num(struct model_hf_json *j, const char *hf_key, double want, const char *what);
/* Same for a boolean: absent/null or equal to want. */
int model_hf_json_expect_bool(struct model_hf_json *j, const char *hf_key, bool want, const char *what);
/* Adds a float to obj printed with the shortest decimal that gives v back as a float (1e-05, not
 * 9.99999974737875e-06). */
int model_hf_json_add_float(cJSON *obj, const char *key, float v);

/* The families' entries (model_gpt2_hf.c, model_llama_hf.c). */
extern const struct model_hf_family model_gpt2_hf;
extern const struct model_hf_family model_llama_hf;
extern const struct model_hf_family model_qwen2_hf;
extern const struct model_hf_family model_qwen3_hf;
extern const struct model_hf_family model_mistral_hf;

#endif
