#include "common/error.h"
#include "worker/train/lr_schedule.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#define CLOSE(a, b) cr_assert(fabs((a) - (b)) <= 1e-12 * (1 + fabs(b)), "%.17g != %.17g", (double)(a), (double)(b))

/* nanoGPT's get_lr written out independently, as the reference. */
static double nanogpt_get_lr(int64_t it, double lr, double min_lr, int64_t warmup, int64_t decay)
{
    if (it < warmup)
        return lr * (double)(it + 1) / (double)(warmup + 1);
    if (it > decay)
        return min_lr;
    double ratio = (double)(it - warmup) / (double)(decay - warmup);
    double coeff = 0.5 * (1.0 + cos(3.141592653589793 * ratio));
    return min_lr + coeff * (lr - min_lr);
}

Test(lr_schedule, cosine_key_steps)
{
    struct lr_schedule s = {LR_SCHEDULE_COSINE, 6e-4, 6e-5, 100, 1000};
    cr_assert_eq(lr_schedule_check(&s), 0);
    CLOSE(lr_schedule_at(&s, 0), 6e-4 / 101);
    CLOSE(lr_schedule_at(&s, 49), 6e-4 * 50 / 101);
    CLOSE(lr_schedule_at(&s, 99), 6e-4 * 100 / 101);
    CLOSE(lr_schedule_at(&s, 100), 6e-4);
    CLOSE(lr_schedule_at(&s, 550), 6e-5 + 0.5 * (6e-4 - 6e-5)); /* halfway: cos(pi/2) = 0 */
    CLOSE(lr_schedule_at(&s, 1000), 6e-5);
    CLOSE(lr_schedule_at(&s, 5000), 6e-5);
    for (int64_t it = 0; it < 1200; it++)
        CLOSE(lr_schedule_at(&s, it), nanogpt_get_lr(it, 6e-4, 6e-5, 100, 1000));
}

Test(lr_schedule, linear_and_constant)
{
    struct lr_schedule s = {LR_SCHEDULE_LINEAR, 1e-3, 1e-4, 10, 110};
    CLOSE(lr_schedule_at(&s, 9), 1e-3 * 10 / 11);
    CLOSE(lr_schedule_at(&s, 10), 1e-3);
    CLOSE(lr_schedule_at(&s, 35), 1e-4 + 0.75 * 9e-4);
    CLOSE(lr_schedule_at(&s, 60), 1e-4 + 0.5 * 9e-4);
    CLOSE(lr_schedule_at(&s, 110), 1e-4);
    CLOSE(lr_schedule_at(&s, 200), 1e-4);
    s.kind = LR_SCHEDULE_CONSTANT;
    CLOSE(lr_schedule_at(&s, 4), 1e-3 * 5 / 11);
    CLOSE(lr_schedule_at(&s, 10), 1e-3);
    CLOSE(lr_schedule_at(&s, 1000), 1e-3);
    s.warmup_steps = 0;
    CLOSE(lr_schedule_at(&s, 0), 1e-3);
}

Test(lr_schedule, no_decay_phase_and_no_warmup)
{
    struct lr_schedule s = {LR_SCHEDULE_COSINE, 1e-3, 1e-5, 10, 10};
    CLOSE(lr_schedule_at(&s, 9), 1e-3 * 10 / 11);
    CLOSE(lr_schedule_at(&s, 10), 1e-5); /* nanoGPT would divide by zero here */
    s.warmup_steps = 0;
    s.decay_steps = 4;
    CLOSE(lr_schedule_at(&s, 0), 1e-3);
    CLOSE(lr_schedule_at(&s, 2), 1e-5 + 0.5 * (1e-3 - 1e-5));
    CLOSE(lr_schedule_at(&s, 4), 1e-5);
}

Test(lr_schedule, parse_and_check)
{
    enum lr_schedule_kind k;
    cr_assert_eq(lr_schedule_parse_kind("linear", &k), 0);
    cr_assert_eq(k, LR_SCHEDULE_LINEAR);
    cr_assert_str_eq(lr_schedule_kind_name(LR_SCHEDULE_CONSTANT), "constant");
    cr_assert_eq(lr_schedule_parse_kind("cos", &k), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "cos") != NULL);
    struct lr_schedule s = {LR_SCHEDULE_COSINE, 1e-4, 1e-3, 0, 10};
    cr_assert_eq(lr_schedule_check(&s), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "min_lr") != NULL);
    s.min_lr = 0;
    s.warmup_steps = -1;
    cr_assert_eq(lr_schedule_check(&s), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "warmup_steps") != NULL);
}
