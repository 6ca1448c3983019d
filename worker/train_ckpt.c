/* Checkpoint hooks of the training loop. The storage layer (sharded and full state dicts) lands with the
 * checkpoint issue; until then a resume request is refused rather than silently ignored, and no save is
 * attempted. */
#include "common/error.h"
#include "common/log.h"
#include "worker/train_ckpt.h"

int train_ckpt_maybe_load(struct fsdp *f, const struct worker_config *wc, struct train_env *env,
                          const char *config_text, int64_t *first_step)
{
    (void)f;
    (void)env;
    (void)config_text;
    *first_step = 0;
    if (wc->checkpoint.resume_from[0])
        return error_set(FSDP_EUNSUPPORTED, "checkpoint.resume_from = %s: checkpoints are not part of this build yet",
                         wc->checkpoint.resume_from);
    return 0;
}

int train_ckpt_maybe_save(struct fsdp *f, const struct worker_config *wc, struct train_env *env, int64_t step,
                          bool final)
{
    (void)f;
    (void)wc;
    (void)env;
    (void)step;
    (void)final;
    return 0;
}
