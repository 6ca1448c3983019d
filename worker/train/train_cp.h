/* Context parallelism for the training loop: the context group's communicator (the cp consecutive ranks that
 * share rows, comm_split of the world) and the collectives the model calls through struct model_cp. */
#ifndef FSDP_WORKER_TRAIN_CP_H
#define FSDP_WORKER_TRAIN_CP_H

#include "comm/comm.h"
#include "worker/config/worker_config.h"
#include "worker/model/model.h"

/* Splits world (NULL at world size 1) into context groups of fsdp.context_parallel_size ranks; *group is NULL
 * and out->size 1 without context parallelism. A collective over the world: every rank calls it. */
int train_cp_open(const struct worker_config *wc, int rank, struct comm *world, struct comm **group,
                  struct model_cp *out);

#endif
