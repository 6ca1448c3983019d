/* Where this rank stands in the job: rank and world from the torchrun environment, the run id, and the
 * store that bootstraps the communicators. */
#ifndef FSDP_WORKER_TRAIN_ENV_H
#define FSDP_WORKER_TRAIN_ENV_H

#include <stdbool.h>
#include <stddef.h>

#include "rendezvous/store.h"

struct train_env {
    int rank, world_size, local_rank, local_world_size, restart_count;
    char run_id[128];
    struct store_client *store;  /* NULL for one rank */
    struct store_server *server; /* rank 0 under a foreign launcher */
    /* Set by train_run when the config does not fit this world (fsdp_check_config: a context_parallel_size or
     * train_batch that does not divide it, ...): a configuration error, which fsdp-worker exits 1 for as for
     * any other refused config, not a failure of training (2). */
    bool config_refused;
};

int train_env_open(struct train_env *e);
void train_env_close(struct train_env *e);

/* pattern with "<run_id>" replaced by run_id (config paths such as log.dir and checkpoint.dir): 0, or
 * FSDP_ERANGE naming key when the result does not fit cap bytes. */
int train_expand_run_id(char *out, size_t cap, const char *pattern, const char *run_id, const char *key);

#endif
