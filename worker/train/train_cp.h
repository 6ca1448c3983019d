/* Context parallelism for the training loop: the context group's communicator (the cp consecutive ranks that
 * share rows, comm_split of the world) and the collectives the model calls through struct model_cp, timed. */
#ifndef FSDP_WORKER_TRAIN_CP_H
#define FSDP_WORKER_TRAIN_CP_H

#include <stdint.h>

#include "comm/comm.h"
#include "worker/config/worker_config.h"
#include "worker/model/model.h"

struct train_cp;

/* Splits world (NULL at world size 1) into context groups of fsdp.context_parallel_size ranks and fills
 * out for model_create_cp; *group is NULL and out->size 1 without context parallelism. A collective over the
 * world: every rank calls it. */
int train_cp_open(const struct worker_config *wc, int rank, struct comm *world, struct train_cp **group,
                  struct model_cp *out);
/* Seconds spent in the group's collectives (issue to completion; blocking) and their number; 0 for NULL. */
double train_cp_seconds(const struct train_cp *g);
int64_t train_cp_calls(const struct train_cp *g);
/* NULL accepted; before the world's communicator is destroyed. */
void train_cp_close(struct train_cp *g);

#endif
