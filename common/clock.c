/* The clocks in seconds: one definition for the timeouts of the store client, the rendezvous, the engine's
 * timings and the launcher, which each used to carry their own copy. */
#include "common/clock.h"

#include <time.h>

double clock_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double clock_wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
