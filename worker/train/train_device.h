/* train.device -> the kernels table this rank computes on, and why that one (the run summary's
 * "device_reason"). */
#ifndef FSDP_WORKER_TRAIN_DEVICE_H
#define FSDP_WORKER_TRAIN_DEVICE_H

#include <stddef.h>

#include "kernels/kernels.h"
#include "worker/config/worker_config.h"
#include "worker/train/train_env.h"

/* cpu: the CPU table. cuda: the CUDA table, after checking that this node has a GPU for each of its ranks
 * (LOCAL_WORLD_SIZE), so every rank of a node with too few GPUs stops with the same message before any
 * communicator exists. auto: cuda where an NVIDIA driver and a usable device exist, else the CPU, saying
 * why in one line (local rank 0 prints it; a warning when a driver is present). 0 or a negative
 * fsdp_error with the message set; *why gets the reason in words either way. */
int train_device_open(const struct worker_config *wc, const struct train_env *env, const struct kernels **out,
                      char *why, size_t cap);

#endif
