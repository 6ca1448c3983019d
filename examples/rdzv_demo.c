/* A minimal worker for fsdp-launch: reads the launcher's environment, connects to the store, meets the
 * other ranks at a barrier and prints one line per rank. The quickstart runs it; the launcher benchmark
 * times it, since it is the smallest job that still exercises the whole control plane. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/error.h"
#include "common/settings.h"
#include "rendezvous/rendezvous.h"

int main(void)
{
    struct rdzv_worker w;
    if (rdzv_worker_connect(&w, 60)) {
        fprintf(stderr, "rdzv-demo: %s\n", error_message());
        return 1;
    }
    if (rdzv_worker_barrier(&w, "demo", 60)) {
        fprintf(stderr, "rdzv-demo: rank %d: %s\n", w.rank, error_message());
        rdzv_worker_close(&w);
        return 1;
    }
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    if (!settings_bool(SETTING_DEMO_QUIET))
        printf("rank %d of %d (local rank %d) on %s: joined the store and passed the barrier\n", w.rank,
               w.world_size, w.local_rank, host);
    rdzv_worker_close(&w);
    return 0;
}
