/* fsdp-worker's configuration: the schema of its INI file (every section the worker will ever read) and
 * a typed view of a loaded config, checked across keys. World-size dependent checks belong to the engine. */
#ifndef FSDP_WORKER_CONFIG_H
#define FSDP_WORKER_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "common/config.h"

/* Enum orders match the value lists of the schema (a config_get_enum index converts directly). */
enum worker_device { WORKER_DEVICE_AUTO = 0, WORKER_DEVICE_CPU, WORKER_DEVICE_CUDA };
enum worker_lr_schedule { WORKER_LR_COSINE = 0, WORKER_LR_LINEAR, WORKER_LR_CONSTANT };
enum worker_data_order { WORKER_ORDER_SHUFFLED = 0, WORKER_ORDER_SEQUENTIAL };
enum worker_sharding {
    WORKER_FULL_SHARD = 0,
    WORKER_SHARD_GRAD_OP,
    WORKER_NO_SHARD,
    WORKER_HYBRID_SHARD,
    WORKER_HYBRID_SHARD_ZERO2,
};
enum worker_wrap_policy { WORKER_WRAP_TRANSFORMER = 0, WORKER_WRAP_SIZE, WORKER_WRAP_NONE };
enum worker_prefetch { WORKER_BACKWARD_PRE = 0, WORKER_BACKWARD_POST, WORKER_NO_PREFETCH };
enum worker_precision { WORKER_FP32 = 0, WORKER_BF16, WORKER_FP16, WORKER_PRECISION_AUTO };
enum worker_cp_strategy { WORKER_CP_ALLGATHER = 0, WORKER_CP_ALLTOALL };
enum worker_state_dict { WORKER_SHARDED_STATE_DICT = 0, WORKER_FULL_STATE_DICT };

#define WORKER_TEXT_MAX (CONFIG_MAX_VALUE + 1)

struct worker_config {
    struct {
        /* index of model_family's value in the schema; worker_model_family_name gives the registry's name (no
         * code outside worker/model branches on a family: the registry says what each reads and does) */
        int family;
        int n_layer, n_head, n_embd, vocab_size, block_size;
        int head_dim; /* every family; unset: 0 = n_embd / n_head */
        /* Keys of some families only (the model registry says which; an error when set for another family);
         * unset: n_kv_head and intermediate_size 0 (the model derives them: n_head, 8 n_embd / 3 rounded up
         * to 256), rope_theta 10000, rms_norm_eps 1e-6, tie_word_embeddings false. */
        int n_kv_head, intermediate_size;
        double rope_theta, rms_norm_eps;
        /* rope_scaling: 0 none, 1 llama3 (model.h's MODEL_ROPE_*), with Llama 3.1's parameters by default */
        int rope_scaling, rope_original_max_position;
        double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
        bool tie_word_embeddings;
        int sliding_window, max_window_layers; /* unset: 0 (no window; every layer) */
        double init_std;
        uint64_t seed;
        char init_from[WORKER_TEXT_MAX]; /* "" = random init */
        bool activation_checkpointing;
    } model;
    struct {
        int train_batch; /* global batch, sequences per optimizer step over all ranks */
        int micro_batch; /* sequences per rank per forward/backward */
        long long max_steps, eval_interval, eval_steps;
        uint64_t seed;
        enum worker_device device;
    } train;
    struct {
        double lr, beta1, beta2, eps, weight_decay, grad_clip, min_lr;
        long long warmup_steps;
        enum worker_lr_schedule lr_schedule;
    } optim;
    struct {
        char train_file[WORKER_TEXT_MAX], val_file[WORKER_TEXT_MAX];
        enum worker_data_order order;
    } data;
    struct {
        bool enable;
        int version; /* 1 or 2 */
        enum worker_sharding sharding_strategy;
        int hybrid_shard_size; /* 0 = the ranks of a node */
        int context_parallel_size; /* C: ranks sharing each sequence; 1 = none */
        enum worker_cp_strategy context_parallel_comm_strategy;
        bool reshard_after_forward;
        enum worker_wrap_policy auto_wrap_policy;
        char transformer_layer_cls_to_wrap[WORKER_TEXT_MAX];
        long long min_num_params;
        enum worker_prefetch backward_prefetch;
        bool forward_prefetch, limit_all_gathers, sync_module_states, offload_params;
        enum worker_precision mixed_precision, reduce_dtype; /* reduce_dtype is never AUTO */
    } fsdp;
    struct {
        long long interval;
        char dir[WORKER_TEXT_MAX]; /* may contain "<run_id>", replaced when the run starts */
    } log;
    struct {
        char dir[WORKER_TEXT_MAX];
        long long interval; /* 0 = no periodic checkpoints */
        enum worker_state_dict state_dict_type;
        long long keep_last; /* 0 = keep all */
        bool cpu_ram_efficient_loading;
        char resume_from[WORKER_TEXT_MAX]; /* "" = fresh start, "latest", or a checkpoint path */
    } checkpoint;
};

const struct config_schema *worker_config_schema(void);
/* The schema's name of a model family ("gpt2", "llama"): the model registry's name of it. */
const char *worker_model_family_name(int family);
struct model_config;
/* The model's config from the worker's: the [model] keys as set (0 = unset, for the family to derive). */
void worker_config_model(const struct worker_config *wc, struct model_config *mc);
/* Fills out from cfg (which must use worker_config_schema) and runs worker_config_validate. */
int worker_config_view(const struct config *cfg, struct worker_config *out);
/* Checks that need only the config (n_embd % n_head, n_kv_head | n_head, micro_batch <= train_batch,
 * min_lr <= lr, ...); the error names the keys involved. */
int worker_config_validate(const struct worker_config *wc);
/* The context-parallel part of worker_config_validate (FSDP2, sharding, block_size, head counts). */
int worker_config_validate_cp(const struct worker_config *wc);

#endif
