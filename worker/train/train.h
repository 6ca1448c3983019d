/* The training loop of fsdp-worker: environment, model, engine, data, evaluation, logging and
 * checkpoints, in that order. */
#ifndef FSDP_WORKER_TRAIN_H
#define FSDP_WORKER_TRAIN_H

#include "worker/config/worker_config.h"
#include "worker/model/model.h"
#include "worker/train/train_env.h"

/* The model part of the config as the model library takes it. */
void train_model_config(const struct worker_config *wc, struct model_config *mc);

/* Trains as the config says; config_text is the effective INI (recorded in checkpoints). Returns 0 or a
 * negative fsdp_error with the message set. */
int train_run(const struct worker_config *wc, const char *config_text, struct train_env *env);

#endif
