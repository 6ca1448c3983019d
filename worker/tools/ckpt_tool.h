/* Shared by the fsdp-ckpt subcommands (ckpt_tool*.c). */
#ifndef FSDP_WORKER_CKPT_TOOL_H
#define FSDP_WORKER_CKPT_TOOL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/fs.h"
#include "worker/ckpt/ckpt.h"
#include "worker/model/model_hf.h"

/* TARGET: a checkpoint directory, a root holding `latest`, or ROOT:latest; checked against the
 * checkpoint's own model config. */
int ckpt_tool_open(const char *target, struct ckpt_reader **out);

/* A model's weights from either kind of source: an fsdpc checkpoint (as ckpt_tool_open takes it) or a
 * Hugging Face directory (config.json + model.safetensors or an index with shards). */
struct ckpt_tool_model {
    struct ckpt_reader *ckpt;     /* set for a checkpoint */
    struct model_weights *hf;     /* set for a Hugging Face directory */
    struct model_layout own;      /* the layout built from config.json (hf) */
    const struct model_layout *l; /* the model's layout either way */
    char path[FSDP_PATH_MAX];     /* the directory read */
    int64_t step;                 /* the checkpoint's step; -1 for a Hugging Face directory */
    char tokenizer[FSDP_PATH_MAX]; /* its tokenizer.json, "" when none was found */
};
/* A checkpoint directory that is also a Hugging Face directory (FULL_STATE_DICT) is read as a checkpoint,
 * so its CRCs are checked. The tokenizer is the run's (run_tokenizer.h): the one in the directory, else the
 * one beside the training data its config names. */
int ckpt_tool_model_open(const char *target, struct ckpt_tool_model *out);
/* Elements [begin, begin + count) of parameter p (layout shape; padding rows are 0). */
int ckpt_tool_model_read(struct ckpt_tool_model *m, int p, size_t begin, size_t count, float *dst);
/* ckpt_tool_model_read of a whole parameter for a tool that computes with it (eval, sample): FSDP_ERANGE
 * naming the tensor when it holds a NaN or an infinity, where the model would print `loss nan` or sample
 * noise and exit 0. export copies such weights as they are. */
int ckpt_tool_model_read_finite(struct ckpt_tool_model *m, int p, float *dst);
void ckpt_tool_model_close(struct ckpt_tool_model *m);

/* The commands other than inspect, as tables (ckpt_tool_args.h) that fsdp-ckpt's main parses and runs. */
struct ckpt_tool_cmd;
extern const struct ckpt_tool_cmd ckpt_tool_export_cmd, ckpt_tool_merge_cmd, ckpt_tool_eval_cmd,
    ckpt_tool_sample_cmd;

#endif
