/* Learning-rate schedule, the same function of the step as nanoGPT's get_lr, so a run here and a
 * nanoGPT run with the same settings use the same learning rate at every step. For step s (0-based),
 * W = warmup_steps, D = decay_steps (= max_steps in the worker), lr and min_lr:
 *   s < W:            lr * (s + 1) / (W + 1)                      (linear warmup, never exactly 0)
 *   s >= D:           min_lr                                       (cosine, linear)
 *   W <= s < D:       r = (s - W) / (D - W)
 *     cosine:         min_lr + 0.5 * (1 + cos(pi * r)) * (lr - min_lr)
 *     linear:         min_lr + (1 - r) * (lr - min_lr)
 *   constant:         lr for every s >= W (the warmup still applies; warmup_steps = 0 turns it off)
 * nanoGPT switches to min_lr only after D (s > D); at s = D its cosine is already exactly min_lr, so the two
 * agree everywhere. */
#ifndef FSDP_WORKER_LR_SCHEDULE_H
#define FSDP_WORKER_LR_SCHEDULE_H

#include <stdint.h>

/* Same order as the worker config's lr_schedule values, so a config value converts by a cast (asserted in
 * train.c). */
enum lr_schedule_kind { LR_SCHEDULE_COSINE = 0, LR_SCHEDULE_LINEAR, LR_SCHEDULE_CONSTANT };

struct lr_schedule {
    enum lr_schedule_kind kind;
    double lr, min_lr;
    int64_t warmup_steps, decay_steps;
};

/* Rejects settings the formula cannot honour (negative values, min_lr > lr); the message names the field. */
int lr_schedule_check(const struct lr_schedule *s);
double lr_schedule_at(const struct lr_schedule *s, int64_t step);
/* "cosine" | "linear" | "constant" -> kind; FSDP_EINVAL otherwise. */
int lr_schedule_parse_kind(const char *name, enum lr_schedule_kind *out);
const char *lr_schedule_kind_name(enum lr_schedule_kind kind);

#endif
