/* Checkpoints from the training loop's side: when to save (checkpoint.interval, the end of the run) and
 * what to resume from (checkpoint.resume_from, or `latest` after a restart by the launcher). */
#ifndef FSDP_WORKER_TRAIN_CKPT_H
#define FSDP_WORKER_TRAIN_CKPT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/fs.h"
#include "worker/fsdp/fsdp.h"
#include "worker/train/train_env.h"

/* What this run's saves and load measured (the run summary reports it; rank 0's figures where only rank 0
 * measures). Sizes are params + two AdamW moments in fp32, the bytes every save writes and a load reads. */
struct train_ckpt_stats {
    int saves;                       /* checkpoints written by this run */
    int64_t save_step;               /* the newest of them: step, size, seconds */
    double save_mb, save_s;
    double full_peak_rss, full_rss_before, full_largest_unit; /* bytes, of the newest full save (rank 0) */
    char resumed_from[FSDP_PATH_MAX]; /* the checkpoint loaded, "" for a fresh start */
    int64_t resumed_step;
    double load_mb, load_s;
};

/* What the loop's checkpointing keeps across the steps of one run. Zero-initialised before the load. */
struct train_ckpt {
    char *config_text;       /* the effective INI, recorded in the metadata of every save */
    int64_t last_saved_step; /* the step of the newest checkpoint of this run or the one resumed, else -1 */
    char tokenizer[FSDP_PATH_MAX]; /* the run's tokenizer.json, copied into every checkpoint ("" = none) */
    struct train_ckpt_stats stats;
    bool locked;             /* rank 0 of a saving run holds checkpoint.dir's lock through lock_fd */
    int lock_fd;
};

/* Loads the checkpoint the config or the restart asks for into the engine; *first_step = its step (0 for
 * a fresh start). config_text is kept for the metadata of later saves. */
int train_ckpt_maybe_load(struct train_ckpt *c, struct fsdp *f, const struct worker_config *wc,
                          struct train_env *env, const char *config_text, int64_t *first_step);
/* Saves when `step` is on the interval, or when final. A collective over all ranks. */
int train_ckpt_maybe_save(struct train_ckpt *c, struct fsdp *f, const struct worker_config *wc,
                          struct train_env *env, int64_t step, bool final);
void train_ckpt_close(struct train_ckpt *c);

#endif
