/* The training loop of fsdp-worker: environment, model, engine, data, evaluation, logging and
 * checkpoints, in that order. */
#ifndef FSDP_WORKER_TRAIN_H
#define FSDP_WORKER_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "rendezvous/store.h"
#include "worker/worker_config.h"

struct train_env {
    int rank, world_size, local_rank, local_world_size, restart_count;
    char run_id[128];
    struct store_client *store;  /* NULL for one rank */
    struct store_server *server; /* rank 0 under a foreign launcher */
};

int train_env_open(struct train_env *e);
void train_env_close(struct train_env *e);

/* Trains as the config says; config_text is the effective INI (recorded in checkpoints). Returns 0 or a
 * negative fsdp_error with the message set. */
/* pattern with "<run_id>" replaced by run_id (config paths such as log.dir and checkpoint.dir). */
void train_expand_run_id(char *out, size_t cap, const char *pattern, const char *run_id);

int train_run(const struct worker_config *wc, const char *config_text, struct train_env *env);

#endif
