/* What model families and the generic model code share: the model object and the registry entry.
 * Not for users of the model (they see model.h only). */
#ifndef FSDP_WORKER_MODEL_INTERNAL_H
#define FSDP_WORKER_MODEL_INTERNAL_H

#include "worker/model/model.h"

struct model {
    struct model_layout layout;
    const struct model_ops *ops;
    const struct kernels *k;
    int b, t;
    size_t arena_bytes;
    int32_t *tokens, *targets; /* device, b*t each */
    int n_valid;               /* targets != -1 */
    bool batch_set;
    void *family; /* the family's state (activation pointers into its arena) */
};

/* Other spellings of one of a family's module classes: Hugging Face's name, and any other name users write
 * for it (nanoGPT's "Block"). */
struct model_class_names {
    const char *ours, *hf, *other;
};

/* A family's Hugging Face entry (model_hf_internal.h). */
struct model_hf_family;

struct model_family {
    const char *name;
    /* Fills params/modules/units for a config already checked by the generic code. */
    int (*layout_build)(struct model_layout *out, const struct model_config *cfg);
    const struct model_ops *ops;
    const struct model_class_names *class_names; /* {NULL}-terminated; NULL = our names only */
    const struct model_hf_family *hf; /* NULL: no Hugging Face config.json / names for this family */
};

/* Registry lookup; NULL with error_set listing the known families. */
const struct model_family *model_family_find(const char *name);

/* Layout construction helpers (model_layout.c). */
int model_layout_add_module(struct model_layout *l, int parent, const char *name, const char *class_name);
/* Adds a parameter owned by module mod (its params must be added consecutively) to unit unit. */
int model_layout_add_param(struct model_layout *l, int mod, int unit, const char *name, int ndim, int d0,
                           int d1, bool decay, float init_std, float init_value);
int model_layout_add_unit(struct model_layout *l, const char *name, int module);

/* The GPT-2 family (model_gpt2_layout.c, model_gpt2.c). */
int model_gpt2_layout_build(struct model_layout *out, const struct model_config *cfg);
extern const struct model_ops model_gpt2_ops;

#endif
