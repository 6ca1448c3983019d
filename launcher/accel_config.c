/* accelerate's config keys and what each one means to fsdp-launch and fsdp-worker. */
#include "launcher/accel_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"
#include "worker/config/worker_config.h"

/* Top-level keys that set a launch flag of the same meaning. */
static const struct {
    const char *key, *flag;
} launch_keys[] = {
    {"num_processes", "num_processes"}, {"num_machines", "nnodes"},       {"machine_rank", "node_rank"},
    {"main_process_ip", "master_addr"}, {"main_process_port", "master_port"}, {"rdzv_backend", "rdzv_backend"},
    {"max_restarts", "max_restarts"},   {"monitor_interval", "monitor_interval"}, {"gpu_ids", "gpu_ids"},
    {"role", "role"},                   {"log_dir", "log_dir"},
};

/* Keys that mean nothing to fsdpc, with the reason printed once. Prefixes end with '.'. */
static const struct {
    const char *key, *why;
} ignored_keys[] = {
    {"compute_environment", "LOCAL_MACHINE is the only environment"},
    {"debug", "collective checks are always on (fsdp-worker names the rank that did not arrive)"},
    {"downcast_bf16", "TPU only"},
    {"enable_cpu_affinity", "not applied: workers inherit the launcher's CPU set"},
    {"main_training_function", "notebook launcher only"},
    {"same_network", "the store address is the same on every network"},
    {"use_cpu", "false: the device is chosen by train.device (auto)"},
    {"dynamo_config.", "no torch.compile in fsdpc"},
    {"deepspeed_config.", "DeepSpeed only"},
    {"megatron_lm_config.", "Megatron-LM only"},
    {"mpirun_config.", "fsdp-launch starts the workers itself"},
    {"fp8_config.", "fp8 is not supported (mixed_precision bf16, fp16 or no)"},
    {"ipex_config.", "Intel extension only"},
    {"parallelism_config.", "tensor/context parallel sizes are not read from accelerate configs"},
    {"tpu_", "TPU only"},
    {"command_file", "TPU only"},
    {"commands", "TPU only"},
    {"gpu_ids", "all: every visible GPU"},
};

/* fsdp_config keys with no counterpart in fsdp-worker. */
static const struct {
    const char *key, *why;
} ignored_fsdp[] = {
    {"fsdp_activation_checkpointing_offload", "activations are recomputed, never offloaded"},
    {"fsdp_ignored_modules", "every parameter is sharded"},
};

static const char *prefix_match(const char *key, const char *pattern)
{
    size_t n = strlen(pattern);
    if (pattern[n - 1] == '.' || pattern[n - 1] == '_')
        return strncmp(key, pattern, n) == 0 ? pattern : NULL;
    return strcmp(key, pattern) == 0 ? pattern : NULL;
}

static const char *ignored_why(const char *key)
{
    for (size_t i = 0; i < sizeof ignored_keys / sizeof ignored_keys[0]; i++)
        if (prefix_match(key, ignored_keys[i].key))
            return ignored_keys[i].why;
    return NULL;
}

/* Checks text against worker key `name` ("section.key" or a flat flag) and fills s. */
static int set_worker(struct accel_setting *s, const char *path, const char *name, const char *text)
{
    const struct config_schema *schema = worker_config_schema();
    int k = config_find_key(schema, name);
    if (k < 0)
        return error_set(FSDP_EINVAL, "%s:%d: %s: internal: fsdp-worker has no key '%s'", path, s->item->line,
                         s->item->key, name);
    const struct config_key *key = &schema->keys[k];
    struct config_value v;
    if (config_value_parse(key, text, &v) != 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", error_message());
        return error_set(FSDP_EINVAL, "%s:%d: %s = %s: %s (fsdp-worker's %s.%s)", path, s->item->line, s->item->key,
                         text, why, key->section, key->name);
    }
    free(v.text);
    size_t len = strlen(text);
    if (len >= sizeof s->value)
        return error_set(FSDP_EINVAL, "%s:%d: %s: value longer than %zu characters", path, s->item->line,
                         s->item->key, sizeof s->value - 1);
    s->use = ACCEL_WORKER;
    snprintf(s->worker_key, sizeof s->worker_key, "%s.%s", key->section, key->name);
    memcpy(s->value, text, len + 1);
    return 0;
}

static int refuse(const char *path, const struct yaml_item *it, const char *what)
{
    return error_set(FSDP_EUNSUPPORTED, "%s:%d: %s: %s is not supported: %s", path, it->line, it->key, it->value,
                     what);
}

static bool yaml_true(const char *v)
{
    return !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on") || !strcmp(v, "1");
}

static int classify_fsdp(struct accel_setting *s, const char *path, bool fsdp)
{
    const struct yaml_item *it = s->item;
    /* accelerate adds the fsdp_ prefix to fsdp_config keys that lack it. */
    char name[YAML_FLAT_KEY_MAX];
    const char *sub = it->key + strlen("fsdp_config.");
    snprintf(name, sizeof name, "%s%s", strncmp(sub, "fsdp", 4) == 0 ? "" : "fsdp_", sub);
    if (!fsdp) {
        s->use = ACCEL_IGNORED;
        s->why = "fsdp_config applies only with distributed_type: FSDP";
        return 0;
    }
    for (size_t i = 0; i < sizeof ignored_fsdp / sizeof ignored_fsdp[0]; i++)
        if (strcmp(name, ignored_fsdp[i].key) == 0) {
            s->use = ACCEL_IGNORED;
            s->why = ignored_fsdp[i].why;
            return 0;
        }
    if (strcmp(name, "fsdp_reshard_after_forward") == 0) {
        /* FSDP2 writes a boolean; accelerate's FSDP1 questions store the sharding strategy under this key. */
        const struct config_key *b = &worker_config_schema()->keys[config_find_key(worker_config_schema(),
                                                                                     "fsdp.reshard_after_forward")];
        struct config_value v;
        if (config_value_parse(b, it->value, &v) == 0) {
            free(v.text);
            return set_worker(s, path, "fsdp.reshard_after_forward", it->value);
        }
        return set_worker(s, path, "fsdp.sharding_strategy", it->value);
    }
    if (config_find_key(worker_config_schema(), name) < 0 || strchr(name, '.')) {
        s->use = ACCEL_IGNORED;
        s->why = "no such setting in fsdp-worker";
        return 0;
    }
    return set_worker(s, path, name, it->value);
}

static int classify_one(struct accel_setting *s, const char *path, bool fsdp)
{
    const struct yaml_item *it = s->item;
    const char *key = it->key;
    if (strncmp(key, "fsdp_config.", 12) == 0)
        return classify_fsdp(s, path, fsdp);
    if (strcmp(key, "compute_environment") == 0 && strcmp(it->value, "LOCAL_MACHINE") != 0)
        return refuse(path, it, "fsdp-launch runs on the machines it is started on (LOCAL_MACHINE)");
    if (strcmp(key, "distributed_type") == 0) {
        const char *v = it->value;
        if (!strcasecmp(v, "FSDP"))
            return set_worker(s, path, "fsdp.enable", "true");
        if (!strcasecmp(v, "NO") || !strcasecmp(v, "MULTI_GPU") || !strcasecmp(v, "MULTI_CPU"))
            return set_worker(s, path, "fsdp.enable", "false");
        return refuse(path, it, "fsdpc trains with FSDP (distributed_type: FSDP) or replicated data parallel "
                                "(MULTI_GPU, MULTI_CPU, NO)");
    }
    if (strcmp(key, "mixed_precision") == 0)
        return set_worker(s, path, "fsdp.mixed_precision", it->value);
    if (strcmp(key, "use_cpu") == 0 && yaml_true(it->value))
        return set_worker(s, path, "train.device", "cpu");
    if (strcmp(key, "gpu_ids") == 0 && strcasecmp(it->value, "all") == 0) {
        s->use = ACCEL_IGNORED;
        s->why = ignored_why(key);
        return 0;
    }
    if (strcmp(key, "num_processes") == 0 && strcmp(it->value, "-1") == 0) {
        s->use = ACCEL_IGNORED;
        s->why = "-1: unset";
        return 0;
    }
    for (size_t i = 0; i < sizeof launch_keys / sizeof launch_keys[0]; i++)
        if (strcmp(key, launch_keys[i].key) == 0) {
            size_t len = strlen(it->value);
            if (len >= sizeof s->value)
                return error_set(FSDP_EINVAL, "%s:%d: %s: value longer than %zu characters", path, it->line, key,
                                 sizeof s->value - 1);
            s->use = ACCEL_LAUNCH;
            s->launch_flag = launch_keys[i].flag;
            memcpy(s->value, it->value, len + 1);
            return 0;
        }
    s->use = ACCEL_IGNORED;
    s->why = ignored_why(key);
    if (!s->why)
        s->why = "not an accelerate setting fsdp-launch knows";
    return 0;
}

int accel_config_classify(const struct yaml_flat *y, const char *path, struct accel_setting **out, int *n)
{
    *out = NULL;
    *n = 0;
    bool fsdp = false;
    for (int i = 0; i < y->n; i++)
        if (strcmp(y->items[i].key, "distributed_type") == 0 && !strcasecmp(y->items[i].value, "FSDP"))
            fsdp = true;
    struct accel_setting *s = calloc(y->n > 0 ? (size_t)y->n : 1, sizeof *s);
    if (!s)
        return error_set(FSDP_ENOMEM, "out of memory reading %s", path);
    int k = 0;
    for (int i = 0; i < y->n; i++) {
        if (y->items[i].is_null || y->items[i].is_mapping) /* key: null, or an empty mapping: nothing set */
            continue;
        s[k].item = &y->items[i];
        int rc = classify_one(&s[k], path, fsdp);
        if (rc) {
            free(s);
            return rc;
        }
        k++;
    }
    *out = s;
    *n = k;
    return 0;
}
