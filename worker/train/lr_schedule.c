#include "worker/train/lr_schedule.h"

#include "common/error.h"

#include <math.h>
#include <string.h>

static const char *const kind_names[] = {"cosine", "linear", "constant"};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == LR_SCHEDULE_CONSTANT + 1,
               "kind_names is indexed by enum lr_schedule_kind");

int lr_schedule_parse_kind(const char *name, enum lr_schedule_kind *out)
{
    for (int i = 0; i < 3; i++) {
        if (name && strcmp(name, kind_names[i]) == 0) {
            *out = (enum lr_schedule_kind)i;
            return 0;
        }
    }
    return error_set(FSDP_EINVAL, "lr_schedule '%s' is unknown: use cosine, linear or constant",
                     name ? name : "(null)");
}

const char *lr_schedule_kind_name(enum lr_schedule_kind kind)
{
    return (unsigned)kind < 3 ? kind_names[kind] : "unknown";
}

int lr_schedule_check(const struct lr_schedule *s)
{
    if ((unsigned)s->kind > LR_SCHEDULE_CONSTANT)
        return error_set(FSDP_EINVAL, "lr_schedule: unknown kind %d", (int)s->kind);
    if (!(s->lr >= 0) || !isfinite(s->lr))
        return error_set(FSDP_EINVAL, "lr = %g must be a finite number >= 0", s->lr);
    if (!(s->min_lr >= 0) || s->min_lr > s->lr)
        return error_set(FSDP_EINVAL, "min_lr = %g must be between 0 and lr = %g", s->min_lr, s->lr);
    if (s->warmup_steps < 0)
        return error_set(FSDP_EINVAL, "warmup_steps = %lld must be >= 0", (long long)s->warmup_steps);
    if (s->decay_steps < 0)
        return error_set(FSDP_EINVAL, "decay steps (max_steps) = %lld must be >= 0", (long long)s->decay_steps);
    return 0;
}

double lr_schedule_at(const struct lr_schedule *s, int64_t step)
{
    if (step < s->warmup_steps)
        return s->lr * (double)(step + 1) / (double)(s->warmup_steps + 1);
    if (s->kind == LR_SCHEDULE_CONSTANT)
        return s->lr;
    /* decay_steps <= warmup_steps leaves no decay phase: nanoGPT would divide by zero there. */
    if (step >= s->decay_steps)
        return s->min_lr;
    double r = (double)(step - s->warmup_steps) / (double)(s->decay_steps - s->warmup_steps);
    double coeff = s->kind == LR_SCHEDULE_COSINE ? 0.5 * (1.0 + cos(M_PI * r)) : 1.0 - r;
    return s->min_lr + coeff * (s->lr - s->min_lr);
}
