/* Shared by the fsdp-ckpt subcommands (ckpt_tool*.c). */
#ifndef FSDP_WORKER_CKPT_TOOL_H
#define FSDP_WORKER_CKPT_TOOL_H

#include "worker/ckpt/ckpt.h"

/* TARGET: a checkpoint directory, a root holding `latest`, or ROOT:latest; checked against the
 * checkpoint's own model config. */
int ckpt_tool_open(const char *target, struct ckpt_reader **out);
/* fsdp-ckpt sample ARGS...; returns the exit status. */
int ckpt_tool_sample(int argc, char **argv);

#endif
