/* What the core and every backend share about a request: the name of its kind for messages (deadlines are
 * common/clock.h's clock_now_s). Below comm.c and the backends, so that neither calls into the other. */
#include "comm/comm_internal.h"

const char *comm_kind_name(enum comm_kind kind)
{
    static const char *names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier",
                                  "send",       "recv",           "all_to_all", "sendrecv",  "split",
                                  "init",       "destroy",        "mem_alloc",  "mem_free"};
    return (unsigned)kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "?";
}
