/* What model families and the generic model code share: the model object and the registry entry.
 * Not for users of the model (they see model.h only). */
#ifndef FSDP_WORKER_MODEL_INTERNAL_H
#define FSDP_WORKER_MODEL_INTERNAL_H

#include "worker/model/model.h"

struct model_decoder;

struct model {
    struct model_layout layout;
    const struct model_decoder *decoder; /* the family's block over the shared core (model_core.c) */
    const struct kernels *k;
    int b, t;
    size_t arena_bytes;
    int32_t *tokens, *targets; /* device, b*t each */
    int n_valid;               /* targets != -1 */
    bool batch_set;
    void *family; /* the core's state, struct model_core (activation pointers into its arena) */
    /* context parallelism (model.h): cp.size 1 = none; t is then this rank's rows of each sequence */
    struct model_cp cp;
    /* The dtype of the activation region (model_carver): fp32 until model_set_compute_dtype picks the matmul
     * dtype on a table that stores activations (kernels.h act_dtypes) */
    enum dtype act_dtype;
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
 * qkv is for backward only. Backward writes dqkv (it does not add), in rows. window: attention_forward's
 * (the layer's sliding window by global position; 0 = full causal). */
int model_cp_setup(struct model *m);
void model_cp_release(struct model *m);
int model_cp_attention_forward(struct model *m, float *out, float *lse, float *qkv, int window);
int model_cp_attention_backward(struct model *m, float *dqkv, const float *dout, const float *qkv, const float *out,
                                const float *lse, int window);
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

/* ---- the decoder core (model_core.c) ----
 * Every family is a decoder: token embedding (plus a learned position table where it has one), L blocks on
 * a residual stream, a final norm, an LM head (tied or untied: a (vocab_padded, C) matrix of the root unit)
 * and softmax cross-entropy. The core owns all of that and the activation arena; a family describes its
 * root tensors and brings its block. */

/* Walks an arena: with base == NULL only the size is computed, so sizing and carving cannot disagree. The
 * activations that only matmuls read (the GEMM inputs a block keeps for backward: its norms' outputs,
 * attention's output, the MLP's activation; the final norm's output) come from a second region after the
 * first, in the model's activation dtype (m->act_dtype): bf16 where the table stores activations in the
 * matmul dtype (kernels.h, act_bind), else fp32. */
struct model_carver {
    char *base;
    size_t off;
    char *act_base;  /* the activation region (NULL while sizing) */
    size_t act_off;
    size_t act_elem; /* bytes of one activation element */
};
/* The next 64-byte aligned piece of bytes (NULL while sizing). */
void *model_carve(struct model_carver *c, size_t bytes);
/* The next piece of n activation elements of the activation region: an [act] tensor of kernels.h, typed
 * float * as the ops take it, that only [act] arguments may be given. */
float *model_carve_act(struct model_carver *c, size_t n);

enum model_norm { MODEL_NORM_LAYER, MODEL_NORM_RMS };

struct model_decoder {
    enum model_norm norm;       /* the final norm's kind */
    enum model_norm block_norm; /* the kind of norm a block opens with (model_block_input_norm) */
    float (*norm_eps)(const struct model_config *c);
    /* Indices among the root unit's parameters: the token embedding, the position table (-1: none; read at
     * global positions under context parallelism), the final norm's weight and bias (-1: none). */
    int root_embed, root_pos, root_norm_w, root_norm_b;
    int (*root_head)(const struct model_config *c); /* the LM head's weight: the untied head or the embedding */
    bool grouped_query; /* attention has n_kv_head key/value heads (else n_head) */
    /* The family's per-layer activations (a struct of pointers into the arena, acts_size bytes; one per layer,
     * or one with activation checkpointing) and its own state (fam_size bytes: persistent tensors carved
     * before the residual stream, scratch carved after the head's). At most 512 bytes each. */
    size_t acts_size, fam_size;
    void (*plan_persistent)(const struct model_config *c, int b, int t, struct model_carver *cv, void *fam); /* NULL: none */
    void (*plan_acts)(const struct model_config *c, int b, int t, struct model_carver *cv, void *acts);
    void (*plan_scratch)(const struct model_config *c, int b, int t, struct model_carver *cv, void *fam);
    int (*setup)(struct model *m); /* after carving (tables the persistent tensors hold); NULL: none */
    /* One block on the residual stream (model_core: x_layer in, opened by model_block_input_norm; x_layer+1
     * out, through model_block_output; backward: dres holds dL/dy on entry and dL/dx on return); w, g: the
     * block unit's slices; gradients are added. */
    int (*block_forward)(struct model *m, int layer, const float *w, void *acts);
    int (*block_backward)(struct model *m, int layer, const float *w, float *g, void *acts);
};

/* The core's state (m->family). */
struct model_core {
    void *arena;
    void *act_region;             /* the arena's activation region (model_carver), bound with act_bind when */
    bool act_bound;               /* m->act_dtype is not fp32 */
    float *resid;                 /* (L + 1) x (N, C): block inputs, then the last block's output */
    char *acts;                   /* the family's activation structs */
    void *fam;                    /* the family's own state */
    float *hn, *hn_mean, *hn_rstd; /* the final norm's output and statistics (mean: layer norm only) */
    float *logits;                /* (N, vocab_padded), then their gradient */
    float *dres;                  /* (N, C) gradient of the residual stream, from the head to the embeddings */
    float *tmp, *dln;             /* (N, C) scratch */
    void *attn_ws;
    double *loss_acc;             /* device: the sum of the heads' losses since the last model_take_loss */
    bool ckpt, head_grad_ready;
    /* A block's output add left to the next forward step (model_block_output): x_pend_layer = pend_a +
     * pend_b, not yet written; pend_b is scratch (tmp) that nothing may write before that step. */
    bool pend;
    int pend_layer;
    const float *pend_a, *pend_b;
    bool recompute; /* a block's forward run again by its backward (activation checkpointing) */
};

/* Tensor idx of a unit's buffer, with that unit's offsets (every block unit has one layout); grads NULL
 * gives NULL. */
static inline const float *model_unit_param(const struct model *m, int unit, const float *buf, int idx)
{
    return buf + m->layout.params[m->layout.units[unit].first_param + idx].unit_offset;
}
static inline float *model_unit_grad(const struct model *m, int unit, float *buf, int idx)
{
    return buf ? buf + m->layout.params[m->layout.units[unit].first_param + idx].unit_offset : NULL;
}
/* An operand that two products read in a row and nothing writes in between: a table that computes in a
 * 16-bit dtype may round it once for both (kernels.h, lowp_hold); tables without the entry round per product. */
int model_operand_hold(const struct kernels *k, const float *x, size_t n);
void model_operand_release(const struct kernels *k, const float *x);
/* A block's first norm, on x_layer (the decoder's block_norm kind; mean and b unused by RMSNorm): where the
 * block before left its output add pending (model_block_output), the add that writes x_layer and this norm
 * are one fused call (the table's residual_*norm_forward, the same bits as the two ops). */
int model_block_input_norm(struct model *m, int layer, float *out, float *mean, float *rstd, const float *w,
                           const float *b, float eps);
/* A block's last step, x_layer+1 = xmid + branch. Where the table has the fused residual + norm op of the
 * norm that reads x_layer+1 next (the next block's first norm, or the final norm), the add is left pending
 * to that norm, so xmid and branch must stay unwritten until the next forward step. In a block's forward
 * run again by backward (activation checkpointing), nothing is done: x_layer+1 already holds these bits. */
int model_block_output(struct model *m, int layer, const float *xmid, const float *branch);
/* The family's activation struct of a layer (the one set with activation checkpointing). */
void *model_core_acts(const struct model *m, int layer);
static inline struct model_core *model_core_of(const struct model *m)
{
    return m->family;
}

struct model_family {
    const char *name;
    /* What sets it apart, for the help of model_family in fsdp-worker's schema ("RMSNorm, SwiGLU, ...") */
    const char *about;
    /* Fills the family's derived defaults into cfg (NULL: none). */
    void (*resolve)(struct model_config *cfg);
    /* The family's own checks on a resolved config, after the generic ones (NULL: none). */
    int (*check)(const struct model_config *cfg);
    /* Fills params/modules/units for a config already checked by the generic code. */
    int (*layout_build)(struct model_layout *out, const struct model_config *cfg);
    const struct model_decoder *decoder;
    const struct model_class_names *class_names; /* {NULL}-terminated; NULL = our names only */
    const struct model_hf_family *hf; /* NULL: no Hugging Face config.json / names for this family */
    /* The [model] keys only some families read that this one does ({NULL}-terminated; NULL: none), and the
     * checks of their values on a config as set, naming the keys (NULL: none); model.h's
     * model_family_reads_key and model_config_check_keys. */
    const char *const *keys;
    int (*check_keys)(const struct model_config *as_set);
    /* model_describe / model_summary_fields for the family's own keys (NULL: none) */
    void (*describe)(const struct model_config *cfg, char *out, size_t cap);
    int (*summary_fields)(const struct model_config *cfg, struct model_field *out, int cap);
};

/* Registry lookup; NULL with error_set listing the known families. */
const struct model_family *model_family_find(const char *name);

/* Layout construction helpers (model_layout.c). */
int model_layout_add_module(struct model_layout *l, int parent, const char *name, const char *class_name);
/* Adds a parameter owned by module mod (its params must be added consecutively) to unit unit. */
int model_layout_add_param(struct model_layout *l, int mod, int unit, const char *name, int ndim, int d0,
                           int d1, bool decay, float init_std, float init_value);
int model_layout_add_unit(struct model_layout *l, const char *name, int module);

/* The core's steps (model_core.c), which model_run.c runs for every family. */
size_t model_core_arena_bytes(const struct model_family *f, const struct model_config *cfg, int b, int t,
                              bool checkpointing, const struct kernels *k);
int model_core_create(struct model *m);
void model_core_destroy(struct model *m);
int model_core_forward_embed(struct model *m, const float *root);
int model_core_forward_block(struct model *m, int layer, const float *block);
int model_core_forward_head(struct model *m, const float *root, float dloss);
int model_core_take_loss(struct model *m, double *sum);
int model_core_move_loss(struct model *m, double *dst);
int model_core_backward_head(struct model *m, const float *root, float *root_grads);
int model_core_backward_block(struct model *m, int layer, const float *block, float *block_grads);
int model_core_backward_embed(struct model *m, const float *root, float *root_grads);
const float *model_core_logits(const struct model *m);

/* The GPT-2 family (model_gpt2_layout.c, model_gpt2.c). */
int model_gpt2_check(const struct model_config *cfg);
int model_gpt2_layout_build(struct model_layout *out, const struct model_config *cfg);
extern const struct model_decoder model_gpt2_decoder;

/* The Llama family (model_llama_layout.c, model_llama.c). */
void model_llama_resolve(struct model_config *cfg);
void model_llama_describe(const struct model_config *cfg, char *out, size_t cap);
int model_llama_summary_fields(const struct model_config *cfg, struct model_field *out, int cap);
int model_llama_check(const struct model_config *cfg);
/* The [model] keys the Llama-style families read, and their checks on a config as set. */
extern const char *const model_llama_keys[];
/* Mistral's: Llama's and sliding_window; Qwen2's and Qwen3's: those and max_window_layers. */
extern const char *const model_mistral_keys[];
extern const char *const model_qwen2_keys[];
int model_llama_check_keys(const struct model_config *as_set);
int model_llama_layout_build(struct model_layout *out, const struct model_config *cfg);
extern const struct model_decoder model_llama_decoder;

/* The Qwen2 family: Llama's block and layout with q/k/v biases and Qwen2's class names. */
void model_qwen2_resolve(struct model_config *cfg);
int model_qwen2_layout_build(struct model_layout *out, const struct model_config *cfg);

/* The Mistral family: Llama's block and layout (sliding-window attention where sliding_window is set) with
 * Mistral's class names. */
int model_mistral_layout_build(struct model_layout *out, const struct model_config *cfg);

/* The Qwen3 family: Llama's block and layout with a per-head RMSNorm of q and k (q_norm, k_norm) before rope,
 * no biases, and Qwen3's class names. */
void model_qwen3_resolve(struct model_config *cfg);
int model_qwen3_layout_build(struct model_layout *out, const struct model_config *cfg);

#endif
