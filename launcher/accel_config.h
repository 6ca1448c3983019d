/* An accelerate config file (what `accelerate config` writes) read the way fsdp-launch uses it: every key
 * is a launch setting (num_machines -> --nnodes, ...), a setting of fsdp-worker (fsdp_config.* -> [fsdp],
 * mixed_precision, distributed_type, use_cpu), ignored (no meaning here; listed once), or refused with a
 * message (a distributed_type or compute_environment fsdpc cannot run). docs/launcher.md has the table. */
#ifndef FSDP_LAUNCHER_ACCEL_CONFIG_H
#define FSDP_LAUNCHER_ACCEL_CONFIG_H

#include "common/config.h"
#include "launcher/yaml_flat.h"

enum accel_use { ACCEL_LAUNCH, ACCEL_WORKER, ACCEL_IGNORED };

struct accel_setting {
    const struct yaml_item *item; /* the YAML key, value and line */
    enum accel_use use;
    const char *launch_flag;     /* ACCEL_LAUNCH: the fsdp-launch flag it sets ("nnodes", "num_processes") */
    char worker_key[96];         /* ACCEL_WORKER: "fsdp.version" */
    char value[CONFIG_MAX_VALUE + 1]; /* ACCEL_LAUNCH/WORKER: the value as the target spells it */
    const char *why;             /* ACCEL_IGNORED: why it changes nothing */
};

/* Sorts the items of y (read from path) by use. Worker values are checked against fsdp-worker's schema
 * here, so a bad value stops the launch before anything starts, with path:line and the key. Null values
 * (key: null) and empty mappings (dynamo_config: {}) are left out. *out is malloc'd (n entries); free it, then y. */
int accel_config_classify(const struct yaml_flat *y, const char *path, struct accel_setting **out, int *n);

#endif
