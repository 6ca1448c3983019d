/* What the core and every backend share about a request: the clock its deadline is measured on and the
 * name of its kind for messages. Below comm.c and the backends, so that neither calls into the other. */
#include "comm/comm_internal.h"

#include <time.h>

double comm_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *comm_kind_name(enum comm_kind kind)
{
    static const char *names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier",
                                  "send",       "recv",           "all_to_all", "sendrecv",  "split",
                                  "init",       "destroy",        "mem_alloc",  "mem_free"};
    return (unsigned)kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "?";
}
