/* The run summary: every rank's machine-readable record of a finished run, `run_summary.rank<R>.json` in
 * log.dir (docs/data.md lists its fields). It holds the figures the end-of-run log lines say in words (the
 * plan, persistent state, peak memory by category, peak RSS, all-gathers and waits, micro-batches per step,
 * final losses, checkpoint timings) and the loss-scale changes of an fp16 run, so that scripts and tests
 * read values instead of log sentences. */
#ifndef FSDP_WORKER_TRAIN_RUN_SUMMARY_H
#define FSDP_WORKER_TRAIN_RUN_SUMMARY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/config/worker_config.h"
#include "worker/fsdp/fsdp.h"
#include "worker/model/model.h"
#include "worker/train/train_ckpt.h"
#include "worker/train/train_env.h"

/* A skipped step (non-finite gradients, the scale backed off) or a grown scale: the step (1-based, as the
 * log names it) and the scale before and after it. */
struct run_summary_scale_change {
    int64_t step;
    double from, to;
    bool skipped;
};

/* What the loop records while it runs. Zero-initialised; run_summary_free releases it. */
struct run_summary {
    struct run_summary_scale_change *changes;
    size_t n_changes, cap_changes;
    bool out_of_memory; /* a change could not be recorded: the write fails rather than leave one out */
};

/* Everything else the record holds, known when the run ends. */
struct run_summary_facts {
    const char *logdir; /* log.dir with <run_id> expanded */
    const struct worker_config *wc;
    const struct train_env *env;
    const char *device;
    const char *device_reason; /* why that device: train.device and, for auto, what was found */
    const struct model *model;
    const struct fsdp *fsdp;
    const struct train_ckpt_stats *ckpt;
    int micro_batches;       /* per step on each rank */
    int64_t first_step;      /* 0, or the step resumed from */
    double final_loss, final_val_loss; /* NAN when not measured */
    size_t rss_at_start;               /* resident bytes before the model, data and engine existed */
    size_t persistent_rss_growth;      /* resident bytes added while the engine allocated its state */
    double peak_flops, flops_per_token; /* the MFU's terms (peak_flops <= 0: unknown) */
    double cp_seconds;                  /* in the context group's collectives (0 without context parallelism) */
    int64_t cp_calls;
};

/* Notes the outcome of loop step `step` (1-based) whose loss scale was scale_before. */
void run_summary_note_step(struct run_summary *s, int64_t step, double scale_before,
                           const struct fsdp_step_result *res);

/* Writes logdir/run_summary.rank<R>.json (temporary file, fsync, rename: a reader sees a whole record or
 * none), creating logdir if needed. Returns 0 or a negative fsdp_error with the message set. */
int run_summary_write(const struct run_summary *s, const struct run_summary_facts *f);

void run_summary_free(struct run_summary *s);

#endif
