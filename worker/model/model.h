/* The model: a tree of named modules whose parameters live in one flat fp32 buffer, grouped into FSDP
 * units (unit 0 = the root: embeddings, final norm, LM head; unit 1 + i = decoder block i), and
 * forward/backward entry points per unit so the FSDP engine can all-gather unit i, compute it, and free it
 * again.
 *
 * Families come from a registry (model_config.model_family: "gpt2", "llama"); each family provides its
 * layout (modules, parameters with Hugging Face names, units) and its decoder block over the kernels table;
 * the embedding, residual stream, final norm, LM head and loss are one core (model_internal.h).
 *
 * Buffers: parameters and gradients are device buffers laid out as model_layout says (a unit's slice is
 * params + unit->offset). Activations live in one arena allocated by model_create, sized from the config
 * and the batch shape up front (model_arena_bytes). docs/model.md has names, layouts and the init. */
#ifndef FSDP_WORKER_MODEL_H
#define FSDP_WORKER_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/fs.h"
#include "kernels/kernels.h"

#define MODEL_NAME_MAX 64
/* The vocabulary is padded to a multiple of this for matmul speed; padded logits never reach the loss. */
#define MODEL_VOCAB_ALIGN 64

enum model_rope_scaling { MODEL_ROPE_DEFAULT = 0, MODEL_ROPE_LLAMA3 = 1 };

struct model_config {
    char model_family[32]; /* registry name: "gpt2", "llama", "qwen2", ... */
    int n_layer, n_head, n_embd;
    /* Width of one attention head; 0 = n_embd / n_head. Independent of n_embd / n_head where the family
     * allows it (the Llama-style families: q is n_head x head_dim wide, o_proj maps it back to n_embd);
     * model_layout_build puts the value in effect in layout.config. */
    int head_dim;
    /* Llama only (GPT-2 ignores them); model_layout_build puts the family's effective values in
     * layout.config. */
    int n_kv_head;            /* key/value heads, dividing n_head; 0 = n_head */
    int intermediate_size;    /* SwiGLU width; 0 = 8 n_embd / 3 rounded up to a multiple of 256 */
    float rope_theta;         /* base of the rotary frequencies */
    /* Rotary frequency scaling (MODEL_ROPE_*): Llama 3.1+'s "llama3" divides the low frequencies by
     * rope_factor and blends the middle band, by wavelength against rope_original_max_position /
     * rope_low_freq_factor and / rope_high_freq_factor (transformers' _compute_llama3_parameters). */
    int rope_scaling;
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position;
    float rms_norm_eps;
    bool tie_word_embeddings; /* the LM head is embed_tokens (no lm_head.weight) */
    /* Sliding-window attention (Mistral; Qwen2/Qwen3 with use_sliding_window): key j is visible to query i
     * when i - sliding_window < j <= i; 0 = full causal. Layers below max_window_layers attend fully (Qwen2's
     * rule; 0 = every layer has the window). model_layer_window gives a layer's. */
    int sliding_window, max_window_layers;
    bool qkv_bias;            /* q, k and v projections have biases: set by the family (qwen2), not a key */
    bool qk_norm;             /* per-head RMSNorm of q and k before rope (head_dim gains each, shared by the
                                 heads): set by the family (qwen3), not a key */
    int vocab_size; /* real vocabulary; the model pads it to MODEL_VOCAB_ALIGN internally */
    int block_size; /* maximum sequence length (rows of wpe; rotary positions) */
    float init_std;
    uint64_t seed;
    /* "" = random init from seed, else Hugging Face weights: a directory (config.json + model.safetensors or
     * an index and shards), a safetensors file or an index file (model_hf.h) */
    char init_from[FSDP_PATH_MAX];
    bool activation_checkpointing;
};

/* One parameter tensor. Shapes are the model's (wte has vocab_padded rows); HF files hold real rows. */
struct model_param {
    char name[MODEL_NAME_MAX]; /* Hugging Face name: "h.3.attn.c_attn.weight", "model.layers.3.mlp.up_proj.weight" */
    int ndim;
    int shape[2];
    size_t numel;
    size_t offset;      /* elements from the start of the flat parameter buffer */
    size_t unit_offset; /* elements from the start of its unit's slice */
    int unit, module;
    bool weight_decay; /* matrices and embeddings decay; biases and norm gains do not */
    bool lookup_only;  /* only rows are read (wpe, an untied input embedding): no matmul, no model FLOPs */
    float init_std;    /* > 0: normal(0, init_std); 0: constant init_value */
    float init_value;
    int init_rows; /* rows given random values; rows beyond (vocab padding) are zero */
    bool position_rows; /* one row per position: a weights file may hold more (a longer context); the first are used */
};

struct model_module {
    char name[MODEL_NAME_MAX]; /* "" (root), "wte", "h", "h.0", "h.0.attn", "h.0.attn.c_attn", ... */
    const char *class_name;    /* GPT-2: "GPT2Model", "Embedding", "ModuleList", "DecoderBlock", "LayerNorm",
                                  "CausalSelfAttention", "MLP", "Conv1D"; Llama: "LlamaForCausalLM",
                                  "LlamaModel", "LlamaDecoderLayer", "LlamaRMSNorm", "Linear", ... */
    int parent;                /* -1 for the root */
    int first_param, n_params; /* parameters this module owns directly (consecutive) */
};

struct model_unit {
    char name[MODEL_NAME_MAX]; /* "root", "h.0" or "model.layers.0", ... */
    int module;                /* the module the unit wraps */
    size_t offset, numel;      /* slice of the flat buffer */
    int first_param, n_params;
};

struct model_layout {
    struct model_config config;
    int vocab_padded;
    size_t numel;      /* flat buffer length, vocab padding included */
    size_t numel_real; /* parameters that count (padding rows excluded) */
    struct model_param *params;
    int n_params;
    struct model_module *modules;
    int n_modules;
    struct model_unit *units;
    int n_units;
};

/* ---- registry and layout ---- */
/* Checks cfg and builds the layout of its family; unknown family: FSDP_EINVAL listing the known ones. */
int model_layout_build(struct model_layout *out, const struct model_config *cfg);
void model_layout_free(struct model_layout *layout);
/* The head width in effect: head_dim, or n_embd / n_head when it is 0 (an unresolved config). */
static inline int model_head_dim(const struct model_config *c)
{
    return c->head_dim > 0 ? c->head_dim : (c->n_head > 0 ? c->n_embd / c->n_head : 0);
}
/* The attention window of layer `layer` (attention_forward's window: 0 = full causal). */
static inline int model_layer_window(const struct model_config *c, int layer)
{
    return c->sliding_window > 0 && layer >= c->max_window_layers ? c->sliding_window : 0;
}
/* The registry in its order, for worker/config's schema (model_family's values, their Hugging Face
 * architecture aliases and help): how many families, and family i's name, its architecture class
 * ("LlamaForCausalLM"; NULL for a family without Hugging Face names) and what sets it apart ("RMSNorm,
 * SwiGLU, ..."). i out of range: NULL. */
int model_family_count(void);
const char *model_family_name(int i);
const char *model_family_hf_architecture(int i);
const char *model_family_about(int i);
/* Comma-separated registry names ("gpt2, llama"). */
const char *model_family_names(void);
/* The [model] keys of fsdp-worker's config that a family declares as its own (n_kv_head, rope_theta, ...;
 * names without "model."): keys no family declares (n_layer, head_dim, ...) are every family's. Setting a
 * family's key for a family that does not read it is refused by worker/config, which asks these. */
bool model_family_reads_key(const char *family, const char *key);
/* The families that declare key, in registry order, as prose ("llama, qwen2 or qwen3") into out ("" when
 * none does); returns how many. */
int model_families_reading(const char *key, char *out, size_t cap);
/* The family's checks of its own keys on a config as the user set it (before the family's defaults are
 * filled in: 0 = unset), each message naming the keys as fsdp-worker's config spells them
 * ("model.n_kv_head (3) must divide model.n_head (4): ..."). Unknown family: an error listing the known. */
int model_config_check_keys(const struct model_config *cfg);
/* What a family adds to the generic description of a model (its own config values in effect), for the log
 * line ("; 2 key/value heads, intermediate 384, ...", "" for a family with none) and for the run summary
 * (name, value pairs; text values where str is set). */
struct model_field {
    const char *name;
    double num;
    const char *str;
    bool is_bool;
};
void model_describe(const struct model_layout *layout, char *out, size_t cap);
/* Fills up to cap fields; returns how many the family has. */
int model_summary_fields(const struct model_layout *layout, struct model_field *out, int cap);
/* Model FLOPs per token of a training step (the PaLM count): 6 x the parameters that enter matmuls (not the
 * lookup-only tables) + 12 x n_layer x n_head x head_dim x block_size (causal attention, forward and
 * backward), a layer with a shorter sliding window counting its window instead of block_size. */
double model_flops_per_token(const struct model_layout *layout);
/* Index of the parameter with this name, or -1. */
int model_layout_find(const struct model_layout *layout, const char *name);
/* Parameters of modules of class class_name (e.g. "DecoderBlock", subtrees included); for reports. */
size_t model_layout_class_numel(const struct model_layout *layout, const char *class_name);
/* ---- module classes: names, which can be FSDP units, the table of --detect-blocks ---- */
/* Hugging Face's name of one of the family's classes ("GPT2Block" for "DecoderBlock"); the class itself
 * when the family gives none. */
const char *model_class_hf_name(const struct model_layout *layout, const char *class_name);
/* The layout's class a user's name means (ours, Hugging Face's or another spelling such as "Block", any
 * case); NULL when the model has no such class. */
const char *model_class_resolve(const struct model_layout *layout, const char *name);
/* Every module of the class is the module of an FSDP unit other than the root (the family's blocks). */
bool model_class_can_be_unit(const struct model_layout *layout, const char *class_name);
/* Checks a transformer_layer_cls_to_wrap value: a comma list whose every name is a class of this model that
 * can be a unit. The error names the value, the classes the model has and the one(s) that can be units. */
int model_wrap_classes_check(const struct model_layout *layout, const char *list);

struct model_class_row {
    const char *class_name, *hf_name;
    int count;                     /* modules of the class */
    size_t params_min, params_max; /* parameters of one module (its subtree; vocabulary padding excluded) */
    size_t params_total;           /* over the modules not nested in another of the same class */
    bool is_root;                  /* the root unit's class (the whole model) */
    bool can_be_unit;
    char example[MODEL_NAME_MAX];  /* the first module of the class, "h.0" */
};
/* One row per class with parameters, largest total first (ties by name); *rows is malloc'd. */
int model_class_table(const struct model_layout *layout, struct model_class_row **rows, int *n);

/* The config with GPT-2 defaults (gpt2 family, init_std 0.02, seed 1337) and Llama's (rope_theta 10000,
 * no rope scaling (Llama 3.1's parameters ready: factor 8, low 1, high 4, original context 8192),
 * rms_norm_eps 1e-6, untied head, n_kv_head and intermediate_size 0 = derived); sizes left 0. */
void model_config_default(struct model_config *cfg);

/* ---- initialisation (host memory) ---- */
/* Elements [begin, begin + count) of parameter p's row-major tensor, as the full init would produce
 * them: each element is a pure function of (seed, parameter name, index), so a rank can initialise only
 * its shard and still match the single-rank init bit for bit. */
void model_init_param_range(const struct model_layout *layout, int p, size_t begin, size_t count,
                            float *dst);
/* Whole flat buffer (host): from config.init_from when set, else random from config.seed. */
int model_init_params(const struct model_layout *layout, float *host_params);

/* ---- whole-model weights with Hugging Face names (host buffers) ---- */
/* Reads every parameter from anything model_weights_open takes (model_hf.h: a Hugging Face directory, a
 * safetensors file or an index; F32/F16/BF16; the family's name prefix optional; buffers and tied heads
 * the family names skipped). The files hold the real vocabulary rows; padding rows are set to 0. */
int model_weights_load(const struct model_layout *layout, const char *path, float *host_params);
/* Writes every parameter as F32 with the layout's names (wte without padding rows) to one file; atomic. */
int model_weights_save(const struct model_layout *layout, const char *path, const float *host_params);

/* ---- activation arena ---- */
/* Bytes of the activation arena for a batch of b sequences of t tokens, with or without activation
 * checkpointing (then only block inputs are kept and a block's activations are recomputed in backward). */
size_t model_arena_bytes(const struct model_config *cfg, int b, int t, bool checkpointing,
                         const struct kernels *k);

/* ---- compute ---- */
struct model;

/* Builds the layout and allocates the arena for batches of b x t tokens (t <= block_size). */
int model_create(struct model **out, const struct model_config *cfg, const struct kernels *k, int b, int t);

/* ---- context parallelism ----
 * The `size` ranks of a context group share every sequence of their rows: each sequence of t tokens is cut
 * into 2 x size chunks and rank r holds chunks r and 2 x size - 1 - r (causal load balance: every rank
 * does the same attention work). Positions (GPT-2's wpe, Llama's rotary angles) are global positions.
 * Attention is the only place where tokens meet: per layer either the group all-gathers the keys and values
 * and each rank attends its queries to the whole sequence (allgather; backward all-gathers again and
 * reduce-scatters their gradients), or an all-to-all turns sequence-sharded q, k, v into head-sharded whole
 * sequences and back (alltoall: heads and key/value heads divisible by size). The model does not know
 * communicators: the caller gives the group's collectives over float buffers of device memory. */
enum model_cp_strategy { MODEL_CP_ALLGATHER = 0, MODEL_CP_ALLTOALL = 1 };
struct model_cp {
    int rank, size; /* this rank's place in its context group, and the group's size (1 = none) */
    enum model_cp_strategy strategy;
    void *ctx; /* the collectives' first argument */
    /* out: size x count elements, block p from rank p; in may be out + rank x count (in place) */
    int (*all_gather)(void *ctx, const float *in, float *out, size_t count);
    /* in: size x count; out: count, the sum over the ranks of their block `rank` */
    int (*reduce_scatter)(void *ctx, const float *in, float *out, size_t count);
    /* in: size x count, block p for rank p; out: size x count, block p from rank p */
    int (*all_to_all)(void *ctx, const float *in, float *out, size_t count);
};
/* model_create for a rank of a context group: t is the whole sequence's length (divisible by 2 x size);
 * the model holds t / size tokens of each of b sequences, and model_set_batch takes whole sequences (b x t)
 * and keeps this rank's chunks. cp NULL or size 1: model_create. The error names what does not fit. */
int model_create_cp(struct model **out, const struct model_config *cfg, const struct kernels *k, int b, int t,
                    const struct model_cp *cp);
/* Global position of row j of the t_local = t / size rows rank `rank` holds of a sequence. */
int model_cp_position(int rank, int size, int t_local, int j);
void model_destroy(struct model *m);
/* The dtype the matmuls compute in (kernels.h set_matmul_dtype), before the first batch: where the table
 * stores activations in it (act_dtypes), the activations that only matmuls read (the norms' outputs,
 * attention's output, the MLP's activation) are kept in it, as bf16 autocast and llm.c keep them, in a new
 * arena of fewer bytes; elsewhere (the CPU, fp32, context parallelism) nothing changes. */
int model_set_compute_dtype(struct model *m, enum dtype dtype);
const struct model_layout *model_get_layout(const struct model *m);
size_t model_get_arena_bytes(const struct model *m);

/* Host token ids and targets (b*t each; target -1 = ignored) of the next forward; with context parallelism
 * whole sequences (b x the t of model_create_cp), of which the model keeps its rank's chunks. */
int model_set_batch(struct model *m, const int32_t *tokens, const int32_t *targets);
/* Valid (non-ignored) targets of the current batch (this rank's chunks with context parallelism). */
int model_batch_targets(const struct model *m);

/* Per-unit steps, in this order: embed, block 0..L-1, head; then backward head, block L-1..0, embed.
 * root = the root unit's slice (params + units[0].offset), block = unit 1 + i's slice; grads likewise;
 * gradients are ADDED (+=) so micro-batches accumulate; the caller zeroes them.
 * forward_head: dloss != 0 also prepares backward (dloss = d total loss / d loss of one target row,
 * e.g. 1 / valid targets for a mean); dloss == 0 keeps the logits (model_logits) and allows no backward.
 * The sum of per-row losses over valid targets is added to the model's accumulator on the device, where it
 * stays until model_take_loss: a step's micro-batches cost no host round trip. */
int model_forward_embed(struct model *m, const float *root);
int model_forward_block(struct model *m, int layer, const float *block);
int model_forward_head(struct model *m, const float *root, float dloss);
/* *sum (host) = the loss sum accumulated by forward_head since the last call, which resets it; it waits for
 * the device. */
int model_take_loss(struct model *m, double *sum);
/* *dst (device memory of the model's table) = that sum, which is reset: no wait for the device. */
int model_move_loss(struct model *m, double *dst);
int model_backward_head(struct model *m, const float *root, float *root_grads);
int model_backward_block(struct model *m, int layer, const float *block, float *block_grads);
int model_backward_embed(struct model *m, const float *root, float *root_grads);

/* Whole model over the flat buffers. forward: mean loss over valid targets, logits kept.
 * forward_backward: mean loss, grads += d mean loss / d params. */
int model_forward(struct model *m, const float *params, float *loss);
int model_forward_backward(struct model *m, const float *params, float *grads, float *loss);
/* (b*t, vocab_padded) fp32 logits after model_forward or forward_head with dloss 0 (device memory); NULL
 * (error_set) where model_set_compute_dtype stores them in bf16. */
const float *model_logits(const struct model *m);

#endif
