/* fsdp-worker's schema (the single source of its INI keys, command-line flags and docs/config.md) and the
 * typed, cross-checked view the rest of the worker reads. */
#include "worker/config/worker_config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "worker/model/model.h"

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})
#define ALIASES(...) ((const struct config_alias[]){__VA_ARGS__, {NULL, NULL}})

/* accelerate writes mixed_precision "no" for fp32, and torch names the dtypes in full. */
#define PRECISION_ALIASES                                                                                  \
    {"no", "fp32"}, {"float32", "fp32"}, {"float", "fp32"}, {"bfloat16", "bf16"}, {"float16", "fp16"},     \
        {"half", "fp16"}

static const struct config_section sections[] = {
    {"model", "Model family, shape and initialisation. The defaults are a small byte-level GPT-2 that trains on a CPU; "
              "a key whose description starts with families applies to those families only."},
    {"train", "Batch sizes, step counts and the device."},
    {"optim", "AdamW and the learning-rate schedule."},
    {"data", "Token files (nanoGPT uint16 or llm.c .bin)."},
    {"fsdp", "Sharding: FSDP version, strategy, wrap policy, prefetch, precision."},
    {"log", "Metrics and logs."},
    {"checkpoint", "Saving and resuming."},
};

/* Not const: worker_config_schema fills in, once, what the model registry says (model_family's values,
 * aliases and help; which families read a key). */
static struct config_key keys[] = {
    /* [model] */
    /* values, value_aliases and help come from the model registry (worker_config_schema) */
    {.section = "model", .name = "model_family", .type = CONFIG_ENUM, .def = "gpt2"},
    {.section = "model", .name = "n_layer", .type = CONFIG_INT, .def = "4", .min = 1, .max = 1024,
     .help = "Number of decoder blocks"},
    {.section = "model", .name = "n_head", .type = CONFIG_INT, .def = "4", .min = 1, .max = 1024,
     .help = "Attention (query) heads per block (must divide n_embd)"},
    {.section = "model", .name = "head_dim", .type = CONFIG_INT, .def = "", .min = 1, .max = 65536,
     .help = "Width of one attention head; unset = n_embd / n_head. Llama-style families take any even width "
             "(q is n_head x head_dim wide; Qwen3 checkpoints differ from n_embd / n_head); gpt2 only n_embd / n_head"},
    {.section = "model", .name = "n_kv_head", .type = CONFIG_INT, .def = "", .min = 1, .max = 1024,
     .help = "key/value heads (grouped-query attention; must divide n_head); unset = n_head"},
    {.section = "model", .name = "n_embd", .type = CONFIG_INT, .def = "128", .min = 1, .max = 65536,
     .help = "Embedding width"},
    {.section = "model", .name = "intermediate_size", .type = CONFIG_INT, .def = "", .min = 1, .max = 536870912,
     .help = "SwiGLU width of the MLP; unset = 8 n_embd / 3 rounded up to a multiple of 256"},
    {.section = "model", .name = "rope_theta", .type = CONFIG_FLOAT, .def = "", .min = 1e-3, .max = 1e12,
     .help = "base of the rotary position frequencies; unset = 10000 (Llama 3: 500000)"},
    {.section = "model", .name = "rope_scaling", .type = CONFIG_ENUM, .def = "", .values = LIST("none", "llama3"),
     .help = "rotary frequency scaling; llama3 = Llama 3.1+'s (the four rope_* keys below); unset = none"},
    {.section = "model", .name = "rope_scaling_factor", .type = CONFIG_FLOAT, .def = "", .min = 1, .max = 1e6,
     .help = "with rope_scaling = llama3, divisor of the low frequencies; unset = 8"},
    {.section = "model", .name = "rope_low_freq_factor", .type = CONFIG_FLOAT, .def = "", .min = 1e-6, .max = 1e6,
     .help = "with rope_scaling = llama3, wavelengths above original / this are scaled; unset = 1"},
    {.section = "model", .name = "rope_high_freq_factor", .type = CONFIG_FLOAT, .def = "", .min = 1e-6, .max = 1e6,
     .help = "with rope_scaling = llama3, wavelengths below original / this are kept; unset = 4"},
    {.section = "model", .name = "rope_original_max_position_embeddings", .type = CONFIG_INT, .def = "", .min = 1,
     .max = 1048576, .help = "with rope_scaling = llama3, the context the model was pretrained with; unset = 8192"},
    {.section = "model", .name = "rms_norm_eps", .type = CONFIG_FLOAT, .def = "", .min = 0, .max = 1,
     .help = "epsilon of RMSNorm; unset = 1e-6"},
    {.section = "model", .name = "tie_word_embeddings", .type = CONFIG_BOOL, .def = "", .bare = "true",
     .help = "the LM head reuses embed_tokens (no lm_head.weight); unset = false (gpt2 is always tied)"},
    {.section = "model", .name = "sliding_window", .type = CONFIG_INT, .def = "", .min = 0, .max = 1048576,
     .help = "sliding-window attention, each token sees the last sliding_window tokens "
             "(itself included); unset or 0 = full causal attention"},
    {.section = "model", .name = "max_window_layers", .type = CONFIG_INT, .def = "", .min = 0, .max = 1024,
     .help = "layers below this one attend fully, the rest through sliding_window (Qwen2's rule); "
             "unset = 0, every layer"},
    {.section = "model", .name = "vocab_size", .type = CONFIG_INT, .def = "256", .min = 2, .max = 1048576,
     .help = "Vocabulary size (256 = bytes; 50257 = GPT-2 BPE)"},
    {.section = "model", .name = "block_size", .type = CONFIG_INT, .def = "128", .min = 1, .max = 1048576,
     .help = "Context length in tokens"},
    {.section = "model", .name = "init_std", .type = CONFIG_FLOAT, .def = "0.02", .min = 0, .max = 1,
     .help = "Standard deviation of the normal weight initialisation"},
    {.section = "model", .name = "seed", .type = CONFIG_INT, .def = "1337", .min = 0, .max = 4294967295.0,
     .help = "Seed of the weight initialisation (the same at any world size)"},
    {.section = "model", .name = "init_from", .type = CONFIG_PATH, .def = "",
     .help = "Hugging Face model directory (its config.json sets [model]) or safetensors file; unset = seed"},
    {.section = "model", .name = "activation_checkpointing", .type = CONFIG_BOOL, .def = "false",
     .flags = LIST("fsdp_activation_checkpointing", "gradient_checkpointing"), .bare = "true",
     .help = "Recompute each block's activations in backward instead of keeping them"},

    /* [train] */
    {.section = "train", .name = "train_batch", .type = CONFIG_INT, .def = "16", .min = 1, .max = 1e7,
     .help = "Global batch in sequences per optimizer step, over all ranks"},
    {.section = "train", .name = "micro_batch", .type = CONFIG_INT, .def = "4", .min = 1, .max = 1e7,
     .flags = LIST("per_device_train_batch_size", "train_batch_size"),
     .help = "Sequences per rank per forward/backward (gradient accumulation makes up the rest)"},
    {.section = "train", .name = "max_steps", .type = CONFIG_INT, .def = "100", .min = 0, .max = 1e12,
     .flags = LIST("max_train_steps"), .help = "Optimizer steps to run"},
    {.section = "train", .name = "eval_interval", .type = CONFIG_INT, .def = "50", .min = 0, .max = 1e12,
     .help = "Steps between evaluations on data.val_file; 0 = never"},
    {.section = "train", .name = "eval_steps", .type = CONFIG_INT, .def = "10", .min = 1, .max = 1e12,
     .help = "Batches per evaluation"},
    {.section = "train", .name = "seed", .type = CONFIG_INT, .def = "1337", .min = 0, .max = 4294967295.0,
     .flags = LIST("seed"), .help = "Seed of the data order"},
    {.section = "train", .name = "device", .type = CONFIG_ENUM, .def = "auto", .values = LIST("auto", "cpu", "cuda"),
     .value_aliases = ALIASES({"gpu", "cuda"}), .help = "auto = cuda when a GPU is usable, else cpu (saying why); cuda and auto need a GPU per rank of a node"},

    /* [optim] */
    {.section = "optim", .name = "lr", .type = CONFIG_FLOAT, .def = "0.0006", .min = 0, .max = 10,
     .flags = LIST("learning_rate"), .help = "Peak learning rate"},
    {.section = "optim", .name = "beta1", .type = CONFIG_FLOAT, .def = "0.9", .min = 0, .max = 1,
     .flags = LIST("adam_beta1"), .help = "AdamW first-moment decay, below 1"},
    {.section = "optim", .name = "beta2", .type = CONFIG_FLOAT, .def = "0.95", .min = 0, .max = 1,
     .flags = LIST("adam_beta2"), .help = "AdamW second-moment decay, below 1"},
    {.section = "optim", .name = "eps", .type = CONFIG_FLOAT, .def = "1e-08", .min = 0, .max = 1,
     .flags = LIST("adam_epsilon"), .help = "AdamW epsilon, above 0"},
    {.section = "optim", .name = "weight_decay", .type = CONFIG_FLOAT, .def = "0.1", .min = 0, .max = 10,
     .flags = LIST("adam_weight_decay"), .help = "Decoupled weight decay (matrices only; not biases, norms)"},
    {.section = "optim", .name = "grad_clip", .type = CONFIG_FLOAT, .def = "1.0", .min = 0, .max = 1e6,
     .flags = LIST("max_grad_norm"), .help = "Clip the global gradient norm to this; 0 = no clipping"},
    {.section = "optim", .name = "warmup_steps", .type = CONFIG_INT, .def = "10", .min = 0, .max = 1e12,
     .flags = LIST("lr_warmup_steps"), .help = "Linear warmup from 0 to lr (may exceed max_steps in short runs)"},
    {.section = "optim", .name = "lr_schedule", .type = CONFIG_ENUM, .def = "cosine",
     .values = LIST("cosine", "linear", "constant"),
     .value_aliases = ALIASES({"constant_with_warmup", "constant"}, {"cosine_with_warmup", "cosine"}),
     .flags = LIST("lr_scheduler"), .help = "Decay from lr to min_lr after warmup, over the remaining steps"},
    {.section = "optim", .name = "min_lr", .type = CONFIG_FLOAT, .def = "6e-05", .min = 0, .max = 10,
     .help = "Learning rate at the end of the decay (at most lr)"},

    /* [data] */
    {.section = "data", .name = "train_file", .type = CONFIG_PATH, .def = "",
     .help = "Training tokens; needed to train"},
    {.section = "data", .name = "val_file", .type = CONFIG_PATH, .def = "",
     .help = "Validation tokens; unset = no evaluation"},
    {.section = "data", .name = "order", .type = CONFIG_ENUM, .def = "shuffled",
     .values = LIST("shuffled", "sequential"), .value_aliases = ALIASES({"shuffle", "shuffled"}, {"random", "shuffled"}),
     .help = "Order of the training windows (seeded by train.seed)"},

    /* [fsdp] */
    {.section = "fsdp", .name = "enable", .type = CONFIG_BOOL, .def = "true", .flags = LIST("use_fsdp", "fsdp_enable"),
     .bare = "true", .help = "Shard parameters, gradients and optimizer state; false = replicate (DDP)"},
    {.section = "fsdp", .name = "version", .type = CONFIG_INT, .def = "2", .min = 1, .max = 2,
     .flags = LIST("fsdp_version"), .help = "1 = one flat buffer per unit; 2 = every parameter sharded on dim 0"},
    {.section = "fsdp", .name = "sharding_strategy", .type = CONFIG_ENUM, .def = "FULL_SHARD",
     .values = LIST("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"),
     .value_aliases = ALIASES({"1", "FULL_SHARD"}, {"2", "SHARD_GRAD_OP"}, {"3", "NO_SHARD"}, {"4", "HYBRID_SHARD"},
                              {"5", "HYBRID_SHARD_ZERO2"}),
     .flags = LIST("fsdp_sharding_strategy"), .help = "What is sharded and across which ranks (numbers as accelerate)"},
    {.section = "fsdp", .name = "hybrid_shard_size", .type = CONFIG_INT, .def = "0", .min = 0, .max = 1048576,
     .help = "HYBRID_*: ranks per shard group; 0 = the ranks of a node"},
    {.section = "fsdp", .name = "context_parallel_size", .type = CONFIG_INT, .def = "1", .min = 1, .max = 65536,
     .flags = LIST("context_parallel_size", "fsdp_context_parallel_size"),
     .help = "Ranks that split each sequence (C, context parallelism); the world is data-parallel degree x C; "
             "needs FSDP2 and model.block_size divisible by 2C"},
    {.section = "fsdp", .name = "context_parallel_comm_strategy", .type = CONFIG_ENUM, .def = "allgather",
     .values = LIST("allgather", "alltoall"),
     .value_aliases = ALIASES({"all_gather", "allgather"}, {"all-gather", "allgather"}, {"all_to_all", "alltoall"},
                              {"all-to-all", "alltoall"}, {"ulysses", "alltoall"}),
     .flags = LIST("context_parallel_comm_strategy", "fsdp_context_parallel_comm_strategy"),
     .help = "allgather = the group's keys/values gathered per layer; alltoall (Ulysses) = heads split across "
             "the group (n_head and n_kv_head divisible by C)"},
    {.section = "fsdp", .name = "reshard_after_forward", .type = CONFIG_BOOL, .def = "true",
     .flags = LIST("fsdp_reshard_after_forward"), .bare = "true",
     .help = "Free gathered parameters after forward and gather again in backward"},
    {.section = "fsdp", .name = "auto_wrap_policy", .type = CONFIG_ENUM, .def = "TRANSFORMER_BASED_WRAP",
     .values = LIST("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"),
     .value_aliases = ALIASES({"transformer", "TRANSFORMER_BASED_WRAP"}, {"size", "SIZE_BASED_WRAP"},
                              {"size_based", "SIZE_BASED_WRAP"}, {"none", "NO_WRAP"}, {"1", "TRANSFORMER_BASED_WRAP"},
                              {"2", "SIZE_BASED_WRAP"}, {"3", "NO_WRAP"}),
     .flags = LIST("fsdp_auto_wrap_policy"), .help = "How the model is cut into FSDP units"},
    {.section = "fsdp", .name = "transformer_layer_cls_to_wrap", .type = CONFIG_STRING, .def = "DecoderBlock",
     .flags = LIST("fsdp_transformer_layer_cls_to_wrap"),
     .help = "TRANSFORMER_BASED_WRAP: module classes (comma list; ours or Hugging Face's names, e.g. GPT2Block) "
             "that become units; `fsdp-worker --detect-blocks` shows them"},
    {.section = "fsdp", .name = "min_num_params", .type = CONFIG_INT, .def = "100000", .min = 0, .max = 1e15,
     .flags = LIST("fsdp_min_num_params"), .help = "SIZE_BASED_WRAP: smallest unit, in parameters"},
    {.section = "fsdp", .name = "backward_prefetch", .type = CONFIG_ENUM, .def = "BACKWARD_PRE",
     .values = LIST("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"),
     .value_aliases = ALIASES({"pre", "BACKWARD_PRE"}, {"post", "BACKWARD_POST"}, {"none", "NO_PREFETCH"},
                              {"1", "BACKWARD_PRE"}, {"2", "BACKWARD_POST"}, {"3", "NO_PREFETCH"}),
     .flags = LIST("fsdp_backward_prefetch", "fsdp_backward_prefetch_policy"), .bare = "BACKWARD_PRE",
     .help = "When the next unit's all-gather is issued in backward"},
    {.section = "fsdp", .name = "forward_prefetch", .type = CONFIG_BOOL, .def = "false",
     .flags = LIST("fsdp_forward_prefetch"), .bare = "true",
     .help = "Issue the next unit's all-gather before running the current one in forward"},
    {.section = "fsdp", .name = "limit_all_gathers", .type = CONFIG_BOOL, .def = "true",
     .flags = LIST("fsdp_limit_all_gathers"), .bare = "true",
     .help = "At most two units gathered at a time (bounds memory)"},
    {.section = "fsdp", .name = "sync_module_states", .type = CONFIG_BOOL, .def = "true",
     .flags = LIST("fsdp_sync_module_states"), .bare = "true",
     .help = "Broadcast rank 0's seeded initial weights so every rank starts equal"},
    {.section = "fsdp", .name = "offload_params", .type = CONFIG_BOOL, .def = "false",
     .flags = LIST("fsdp_offload_params"), .bare = "true",
     .help = "Keep parameter shards and optimizer state in host memory (GPU runs)"},
    {.section = "fsdp", .name = "use_orig_params", .type = CONFIG_BOOL, .def = "true",
     .flags = LIST("fsdp_use_orig_params"), .bare = "true",
     .help = "Accepted for accelerate configs: parameters always keep their names, shapes and optimizer state "
             "(FSDP2's behaviour), so false changes nothing"},
    {.section = "fsdp", .name = "mixed_precision", .type = CONFIG_ENUM, .def = "auto",
     .values = LIST("fp32", "bf16", "fp16", "auto"), .value_aliases = ALIASES(PRECISION_ALIASES),
     .flags = LIST("mixed_precision"), .help = "Dtype of gathered parameters and compute; auto = bf16 on GPU, fp32 on CPU"},
    {.section = "fsdp", .name = "reduce_dtype", .type = CONFIG_ENUM, .def = "fp32",
     .values = LIST("fp32", "bf16", "fp16"), .value_aliases = ALIASES(PRECISION_ALIASES),
     .help = "Dtype of the gradient reduce-scatter"},

    /* [log] */
    {.section = "log", .name = "interval", .type = CONFIG_INT, .def = "10", .min = 1, .max = 1e12,
     .flags = LIST("logging_steps"),
     .help = "Steps between progress lines when output is not a terminal (a log, fsdp-launch's pipe; on a terminal "
             "the line is redrawn every step); metrics.jsonl and TensorBoard get every step"},
    {.section = "log", .name = "dir", .type = CONFIG_PATH, .def = "./runs/<run_id>", .flags = LIST("logging_dir"),
     .help = "Metrics, TensorBoard events and each rank's run summary; <run_id> is replaced when the run starts"},

    /* [checkpoint] */
    {.section = "checkpoint", .name = "dir", .type = CONFIG_PATH, .def = "./runs/<run_id>/checkpoints",
     .flags = LIST("output_dir"), .help = "Where checkpoints are written"},
    {.section = "checkpoint", .name = "interval", .type = CONFIG_INT, .def = "0", .min = -1, .max = 1e12,
     .flags = LIST("checkpointing_steps"),
     .help = "Steps between checkpoints; 0 = only at the end; -1 = never (no checkpoint at all)"},
    {.section = "checkpoint", .name = "state_dict_type", .type = CONFIG_ENUM, .def = "SHARDED_STATE_DICT",
     .values = LIST("SHARDED_STATE_DICT", "FULL_STATE_DICT"),
     .value_aliases = ALIASES({"sharded", "SHARDED_STATE_DICT"}, {"full", "FULL_STATE_DICT"}, {"1", "FULL_STATE_DICT"},
                              {"3", "SHARDED_STATE_DICT"}),
     .flags = LIST("fsdp_state_dict_type"), .help = "Shard files per rank, or one safetensors file (HF GPT-2 names)"},
    {.section = "checkpoint", .name = "keep_last", .type = CONFIG_INT, .def = "3", .min = 0, .max = 1e9,
     .flags = LIST("checkpoints_total_limit"), .help = "Checkpoints kept; older ones are deleted; 0 = keep all"},
    {.section = "checkpoint", .name = "cpu_ram_efficient_loading", .type = CONFIG_BOOL, .def = "false",
     .flags = LIST("fsdp_cpu_ram_efficient_loading"), .bare = "true",
     .help = "model.init_from is read by rank 0 alone and broadcast (else each rank reads its shards' bytes)"},
    {.section = "checkpoint", .name = "resume_from", .type = CONFIG_PATH, .def = "",
     .flags = LIST("resume_from", "resume_from_checkpoint"),
     .help = "Checkpoint to resume from, or latest (newest in dir); unset = fresh start"},
};

static const struct config_schema schema = {
    .program = "fsdp-worker",
    .sections = sections,
    .n_sections = sizeof sections / sizeof sections[0],
    .keys = keys,
    .n_keys = sizeof keys / sizeof keys[0],
};

/* What the schema takes from the model registry, so that a new family changes nothing here: model_family's
 * values (the registry's names, in its order: config_get_enum's index is the family's place in the
 * registry), each Hugging Face architecture class as an alias of its family, the key's help listing the
 * families, and the families that read a family-specific key before its help. */
#define FAMILIES_MAX 32
static const char *family_values[FAMILIES_MAX + 1];
static struct config_alias family_aliases[FAMILIES_MAX + 1];
static char help_text[4096];

static const char *help_append(size_t *used, const char *fmt, const char *a, const char *b)
{
    char *start = help_text + *used;
    int n = snprintf(start, sizeof help_text - *used, fmt, a, b);
    if (n < 0 || (size_t)n >= sizeof help_text - *used) {
        fprintf(stderr, "fsdp-worker: the schema's generated help outgrew its buffer (worker_config.c)\n");
        abort();
    }
    *used += (size_t)n + 1;
    return start;
}

static void schema_from_registry(void)
{
    int n = model_family_count();
    if (n > FAMILIES_MAX) {
        fprintf(stderr, "fsdp-worker: the model registry has %d families, worker_config.c holds %d\n", n,
                FAMILIES_MAX);
        abort();
    }
    size_t used = 0;
    char about[1024] = "Model architecture: ";
    for (int i = 0, a = 0; i < n; i++) {
        family_values[i] = model_family_name(i);
        if (model_family_hf_architecture(i))
            family_aliases[a++] = (struct config_alias){model_family_hf_architecture(i), model_family_name(i)};
        size_t len = strlen(about);
        snprintf(about + len, sizeof about - len, "%s%s (%s)", i == 0 ? "" : i == n - 1 ? " or " : ", ",
                 model_family_name(i), model_family_about(i));
    }
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        struct config_key *key = &keys[i];
        if (strcmp(key->section, "model") != 0)
            continue;
        char readers[256];
        if (strcmp(key->name, "model_family") == 0) {
            key->values = family_values;
            key->value_aliases = family_aliases;
            key->help = help_append(&used, "%s%s", about, "");
        } else if (model_families_reading(key->name, readers, sizeof readers) > 0) {
            key->help = help_append(&used, "%s: %s", readers, key->help);
        }
    }
}

const struct config_schema *worker_config_schema(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, schema_from_registry);
    return &schema;
}

const char *worker_model_family_name(int family)
{
    const char *name = model_family_name(family);
    return name ? name : "?";
}

void worker_config_model(const struct worker_config *wc, struct model_config *mc)
{
    model_config_default(mc);
    snprintf(mc->model_family, sizeof mc->model_family, "%s", worker_model_family_name(wc->model.family));
    mc->n_kv_head = wc->model.n_kv_head;
    mc->head_dim = wc->model.head_dim;
    mc->intermediate_size = wc->model.intermediate_size;
    mc->rope_theta = (float)wc->model.rope_theta;
    mc->rms_norm_eps = (float)wc->model.rms_norm_eps;
    mc->rope_scaling = wc->model.rope_scaling;
    mc->rope_factor = (float)wc->model.rope_factor;
    mc->rope_low_freq_factor = (float)wc->model.rope_low_freq_factor;
    mc->rope_high_freq_factor = (float)wc->model.rope_high_freq_factor;
    mc->rope_original_max_position = wc->model.rope_original_max_position;
    mc->tie_word_embeddings = wc->model.tie_word_embeddings;
    mc->sliding_window = wc->model.sliding_window;
    mc->max_window_layers = wc->model.max_window_layers;
    mc->n_layer = wc->model.n_layer;
    mc->n_head = wc->model.n_head;
    mc->n_embd = wc->model.n_embd;
    mc->vocab_size = wc->model.vocab_size;
    mc->block_size = wc->model.block_size;
    mc->init_std = (float)wc->model.init_std;
    mc->seed = wc->model.seed;
    mc->activation_checkpointing = wc->model.activation_checkpointing;
    snprintf(mc->init_from, sizeof mc->init_from, "%s", wc->model.init_from);
}

/* A [model] key that some families read but this one does not (a GPT-2 has no grouped heads, rotary
 * positions or untied head) is a mistake worth stopping for; the model registry says which family reads
 * what, so a new family's keys need nothing here. */
static int check_family_keys(const struct config *cfg, const char *family)
{
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const struct config_key *key = &keys[i];
        if (strcmp(key->section, "model") != 0 || model_family_reads_key(family, key->name))
            continue;
        char name[64], where[CONFIG_MAX_VALUE + 64] = "", readers[256];
        snprintf(name, sizeof name, "model.%s", key->name);
        const struct config_value *v = &cfg->values[config_find_key(cfg->schema, name)];
        if (!v->text)
            continue;
        if (v->source == CONFIG_SRC_FILE && cfg->file)
            snprintf(where, sizeof where, " (%s line %d)", cfg->file, v->line);
        else if (v->source == CONFIG_SRC_CLI)
            snprintf(where, sizeof where, " (command line)");
        model_families_reading(key->name, readers, sizeof readers);
        return error_set(FSDP_EINVAL,
                         "%s%s applies only to model_family = %s, but model_family is %s; remove it or set "
                         "model.model_family = %.*s",
                         name, where, readers, family, (int)strcspn(readers, ", "), readers);
    }
    return 0;
}

static void copy_text(char *dst, const struct config *cfg, const char *section, const char *name)
{
    snprintf(dst, WORKER_TEXT_MAX, "%s", config_get_string(cfg, section, name));
}

int worker_config_view(const struct config *cfg, struct worker_config *out)
{
    if (cfg->schema != &schema)
        return error_set(FSDP_EINVAL, "worker_config_view needs a config made from worker_config_schema()");
    memset(out, 0, sizeof *out);
#define I(s, k) config_get_int(cfg, #s, #k)
#define F(s, k) config_get_float(cfg, #s, #k)
#define B(s, k) config_get_bool(cfg, #s, #k)
#define E(s, k) config_get_enum(cfg, #s, #k)
    out->model.family = (int)E(model, model_family);
    out->model.n_layer = (int)I(model, n_layer);
    out->model.n_head = (int)I(model, n_head);
    out->model.n_embd = (int)I(model, n_embd);
    out->model.vocab_size = (int)I(model, vocab_size);
    out->model.block_size = (int)I(model, block_size);
    /* unset: 0 (the model derives them) and Llama's defaults */
    out->model.n_kv_head = (int)I(model, n_kv_head);
    out->model.head_dim = (int)I(model, head_dim); /* unset: 0 = n_embd / n_head */
    out->model.intermediate_size = (int)I(model, intermediate_size);
    out->model.rope_theta = config_is_set(cfg, "model", "rope_theta") ? F(model, rope_theta) : 10000.0;
    out->model.rms_norm_eps = config_is_set(cfg, "model", "rms_norm_eps") ? F(model, rms_norm_eps) : 1e-6;
    /* unset: no scaling, and Llama 3.1's parameters for llama3 */
    out->model.rope_scaling = config_is_set(cfg, "model", "rope_scaling") ? (int)E(model, rope_scaling) : 0;
    out->model.rope_factor = config_is_set(cfg, "model", "rope_scaling_factor") ? F(model, rope_scaling_factor) : 8;
    out->model.rope_low_freq_factor =
        config_is_set(cfg, "model", "rope_low_freq_factor") ? F(model, rope_low_freq_factor) : 1;
    out->model.rope_high_freq_factor =
        config_is_set(cfg, "model", "rope_high_freq_factor") ? F(model, rope_high_freq_factor) : 4;
    out->model.rope_original_max_position = config_is_set(cfg, "model", "rope_original_max_position_embeddings")
                                                ? (int)I(model, rope_original_max_position_embeddings)
                                                : 8192;
    out->model.tie_word_embeddings = B(model, tie_word_embeddings);
    out->model.sliding_window = (int)I(model, sliding_window);       /* unset: 0, no window */
    out->model.max_window_layers = (int)I(model, max_window_layers); /* unset: 0, every layer */
    out->model.init_std = F(model, init_std);
    out->model.seed = (uint64_t)I(model, seed);
    copy_text(out->model.init_from, cfg, "model", "init_from");
    out->model.activation_checkpointing = B(model, activation_checkpointing);

    out->train.train_batch = (int)I(train, train_batch);
    out->train.micro_batch = (int)I(train, micro_batch);
    out->train.max_steps = I(train, max_steps);
    out->train.eval_interval = I(train, eval_interval);
    out->train.eval_steps = I(train, eval_steps);
    out->train.seed = (uint64_t)I(train, seed);
    out->train.device = (enum worker_device)E(train, device);

    out->optim.lr = F(optim, lr);
    out->optim.beta1 = F(optim, beta1);
    out->optim.beta2 = F(optim, beta2);
    out->optim.eps = F(optim, eps);
    out->optim.weight_decay = F(optim, weight_decay);
    out->optim.grad_clip = F(optim, grad_clip);
    out->optim.warmup_steps = I(optim, warmup_steps);
    out->optim.lr_schedule = (enum worker_lr_schedule)E(optim, lr_schedule);
    out->optim.min_lr = F(optim, min_lr);

    copy_text(out->data.train_file, cfg, "data", "train_file");
    copy_text(out->data.val_file, cfg, "data", "val_file");
    out->data.order = (enum worker_data_order)E(data, order);

    out->fsdp.enable = B(fsdp, enable);
    out->fsdp.version = (int)I(fsdp, version);
    out->fsdp.sharding_strategy = (enum worker_sharding)E(fsdp, sharding_strategy);
    out->fsdp.hybrid_shard_size = (int)I(fsdp, hybrid_shard_size);
    out->fsdp.context_parallel_size = (int)I(fsdp, context_parallel_size);
    out->fsdp.context_parallel_comm_strategy = (enum worker_cp_strategy)E(fsdp, context_parallel_comm_strategy);
    out->fsdp.reshard_after_forward = B(fsdp, reshard_after_forward);
    out->fsdp.auto_wrap_policy = (enum worker_wrap_policy)E(fsdp, auto_wrap_policy);
    copy_text(out->fsdp.transformer_layer_cls_to_wrap, cfg, "fsdp", "transformer_layer_cls_to_wrap");
    out->fsdp.min_num_params = I(fsdp, min_num_params);
    out->fsdp.backward_prefetch = (enum worker_prefetch)E(fsdp, backward_prefetch);
    out->fsdp.forward_prefetch = B(fsdp, forward_prefetch);
    out->fsdp.limit_all_gathers = B(fsdp, limit_all_gathers);
    out->fsdp.sync_module_states = B(fsdp, sync_module_states);
    out->fsdp.offload_params = B(fsdp, offload_params);
    out->fsdp.mixed_precision = (enum worker_precision)E(fsdp, mixed_precision);
    out->fsdp.reduce_dtype = (enum worker_precision)E(fsdp, reduce_dtype);

    out->log.interval = I(log, interval);
    copy_text(out->log.dir, cfg, "log", "dir");

    copy_text(out->checkpoint.dir, cfg, "checkpoint", "dir");
    out->checkpoint.interval = I(checkpoint, interval);
    out->checkpoint.state_dict_type = (enum worker_state_dict)E(checkpoint, state_dict_type);
    out->checkpoint.keep_last = I(checkpoint, keep_last);
    out->checkpoint.cpu_ram_efficient_loading = B(checkpoint, cpu_ram_efficient_loading);
    copy_text(out->checkpoint.resume_from, cfg, "checkpoint", "resume_from");
#undef I
#undef F
#undef B
#undef E
    FSDP_TRY(check_family_keys(cfg, worker_model_family_name(out->model.family)));
    return worker_config_validate(out);
}

int worker_config_validate(const struct worker_config *wc)
{
    if (!wc->model.head_dim && wc->model.n_embd % wc->model.n_head != 0)
        return error_set(FSDP_EINVAL,
                         "model.n_embd (%d) must be a multiple of model.n_head (%d), or model.head_dim set (the width "
                         "of one head)",
                         wc->model.n_embd, wc->model.n_head);
    struct model_config mc;
    worker_config_model(wc, &mc);
    FSDP_TRY(model_config_check_keys(&mc));
    if (wc->train.micro_batch > wc->train.train_batch)
        return error_set(FSDP_EINVAL, "train.micro_batch (%d) must be at most train.train_batch (%d), the global batch",
                         wc->train.micro_batch, wc->train.train_batch);
    if (!(wc->optim.lr > 0))
        return error_set(FSDP_EINVAL, "optim.lr must be above 0");
    if (wc->optim.min_lr > wc->optim.lr)
        return error_set(FSDP_EINVAL, "optim.min_lr (%g) must be at most optim.lr (%g)", wc->optim.min_lr,
                         wc->optim.lr);
    if (wc->optim.beta1 >= 1 || wc->optim.beta2 >= 1)
        return error_set(FSDP_EINVAL, "optim.beta1 (%g) and optim.beta2 (%g) must be below 1", wc->optim.beta1,
                         wc->optim.beta2);
    if (!(wc->optim.eps > 0))
        return error_set(FSDP_EINVAL, "optim.eps must be above 0");
    if (wc->fsdp.auto_wrap_policy == WORKER_WRAP_TRANSFORMER && !wc->fsdp.transformer_layer_cls_to_wrap[0])
        return error_set(FSDP_EINVAL,
                         "fsdp.auto_wrap_policy = TRANSFORMER_BASED_WRAP needs fsdp.transformer_layer_cls_to_wrap");
    if (wc->fsdp.hybrid_shard_size > 0 && wc->fsdp.sharding_strategy != WORKER_HYBRID_SHARD &&
        wc->fsdp.sharding_strategy != WORKER_HYBRID_SHARD_ZERO2)
        return error_set(FSDP_EINVAL,
                         "fsdp.hybrid_shard_size (%d) applies only to fsdp.sharding_strategy HYBRID_SHARD or "
                         "HYBRID_SHARD_ZERO2; set it to 0 or change the strategy",
                         wc->fsdp.hybrid_shard_size);
    return worker_config_validate_cp(wc);
}

/* Context parallelism's world-independent rules: every rank reads the same config, so every rank stops alike. */
int worker_config_validate_cp(const struct worker_config *wc)
{
    int c = wc->fsdp.context_parallel_size;
    if (c <= 1)
        return 0;
    if (!wc->fsdp.enable)
        return error_set(FSDP_EINVAL,
                         "Context parallelism requires FSDP2. fsdp.context_parallel_size = %d with fsdp.enable = false: "
                         "set fsdp.enable = true and fsdp.version = 2, or context_parallel_size = 1",
                         c);
    if (wc->fsdp.version != 2)
        return error_set(FSDP_EINVAL,
                         "Context parallelism requires FSDP2. fsdp.context_parallel_size = %d with fsdp.version = %d: "
                         "set fsdp.version = 2, or context_parallel_size = 1",
                         c, wc->fsdp.version);
    if (wc->fsdp.sharding_strategy == WORKER_NO_SHARD)
        return error_set(FSDP_EINVAL,
                         "fsdp.context_parallel_size = %d shards parameters over the whole mesh (data-parallel x "
                         "context ranks), which fsdp.sharding_strategy = NO_SHARD forbids; use FULL_SHARD, "
                         "SHARD_GRAD_OP, HYBRID_SHARD or HYBRID_SHARD_ZERO2, or context_parallel_size = 1",
                         c);
    if (wc->model.block_size % (2 * c) != 0) {
        char ok[256] = "";
        size_t len = 0;
        for (int d = 1; 2 * d <= wc->model.block_size && len + 16 < sizeof ok; d++)
            if (wc->model.block_size % (2 * d) == 0)
                len += (size_t)snprintf(ok + len, sizeof ok - len, "%s%d", len ? ", " : "", d);
        return error_set(FSDP_EINVAL,
                         "model.block_size = %d is not divisible by 2 x fsdp.context_parallel_size = %d (each "
                         "sequence is cut into 2C load-balanced chunks); use a block_size that is a multiple of %d%s%s",
                         wc->model.block_size, 2 * c, 2 * c, len ? ", or context_parallel_size one of " : "", ok);
    }
    if (wc->fsdp.context_parallel_comm_strategy == WORKER_CP_ALLTOALL && wc->model.n_head % c != 0)
        return error_set(FSDP_EINVAL,
                         "fsdp.context_parallel_comm_strategy = alltoall splits the attention heads across the %d "
                         "context ranks, but model.n_head = %d is not divisible by %d; use "
                         "context_parallel_comm_strategy = allgather, or a context_parallel_size dividing %d",
                         c, wc->model.n_head, c, wc->model.n_head);
    int nkv = model_family_reads_key(worker_model_family_name(wc->model.family), "n_kv_head") && wc->model.n_kv_head > 0
                  ? wc->model.n_kv_head
                  : 0;
    if (wc->fsdp.context_parallel_comm_strategy == WORKER_CP_ALLTOALL && nkv && nkv % c != 0)
        return error_set(FSDP_EINVAL,
                         "fsdp.context_parallel_comm_strategy = alltoall splits the key/value heads across the %d "
                         "context ranks, but model.n_kv_head = %d is not divisible by %d; use "
                         "context_parallel_comm_strategy = allgather, or a context_parallel_size dividing %d",
                         c, nkv, c, nkv);
    return 0;
}
