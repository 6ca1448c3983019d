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
    /* context parallelism (model.h): cp.size 1 = none; t is then this rank's rows of each sequence */
    struct model_cp cp;
    int t_seq;                 /* tokens of a whole sequence: t x cp.size */
    int *cp_qpos, *cp_kpos;    /* device: positions of this rank's rows (t), of the group's rows (t_seq) */
    float *cp_a, *cp_b, *cp_c; /* device scratch of the strategy (model_cp.c) */
    int32_t *cp_host;          /* host: 2 x b x t, this rank's tokens and targets */
};

/* Global position of row j (0 <= j < m->t) of a sequence. */
int model_position(const struct model *m, int j);
/* Context-parallel pieces the families call (model_cp.c): the scratch and positions (after the family's
 * create; counted into m->arena_bytes), their release, and causal attention over the whole sequence for
 * this rank's rows of qkv ((b*t, ld) rows [q (nh heads) | k (nkv) | v (nkv)], as attention_forward's).
 * Forward may rewrite qkv into the layout its strategy computes in (alltoall: this rank's heads of the
 * whole sequence), so that backward, which takes the same buffer, need not move it again: after forward
 * qkv is for backward only. Backward writes dqkv (it does not add), in rows. */
int model_cp_setup(struct model *m);
void model_cp_release(struct model *m);
int model_cp_attention_forward(struct model *m, float *out, float *lse, float *qkv);
int model_cp_attention_backward(struct model *m, float *dqkv, const float *dout, const float *qkv, const float *out,
                                const float *lse);
/* Embedding rows of this rank's chunks at their global positions (wpe may be NULL: no position table). */
int model_cp_embedding_forward(struct model *m, float *out, const float *wte, const float *wpe);
int model_cp_embedding_backward(struct model *m, float *dwte, float *dwpe, const float *dout);

/* Other spellings of one of a family's module classes: Hugging Face's name, and any other name users write
 * for it (nanoGPT's "Block"). */
struct model_class_names {
    const char *ours, *hf, *other;
};

/* A family's Hugging Face entry (model_hf_internal.h). */
struct model_hf_family;

struct model_family {
    const char *name;
    /* Fills the family's derived defaults into cfg (NULL: none). */
    void (*resolve)(struct model_config *cfg);
    /* The family's own checks on a resolved config, after the generic ones (NULL: none). */
    int (*check)(const struct model_config *cfg);
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

/* The Llama family (model_llama_layout.c, model_llama.c). */
void model_llama_resolve(struct model_config *cfg);
int model_llama_check(const struct model_config *cfg);
int model_llama_layout_build(struct model_layout *out, const struct model_config *cfg);
extern const struct model_ops model_llama_ops;

#endif
