/* common/clock.h: the monotonic clock advances across a sleep by about the sleep, and the wall clock is the
 * epoch time time(2) gives. */
#include <criterion/criterion.h>
#include <time.h>

#include "common/clock.h"

Test(clock, monotonic_seconds_follow_a_sleep)
{
    double t0 = clock_now_s();
    struct timespec nap = {.tv_nsec = 50 * 1000 * 1000};
    nanosleep(&nap, NULL);
    double dt = clock_now_s() - t0;
    cr_expect(dt >= 0.049 && dt < 5.0, "50 ms of sleep measured as %.6f s", dt);
}

Test(clock, wall_seconds_are_epoch_seconds)
{
    double w = clock_wall_s();
    double t = (double)time(NULL);
    cr_expect(w > t - 2 && w < t + 2, "clock_wall_s %.3f, time() %.0f", w, t);
}
