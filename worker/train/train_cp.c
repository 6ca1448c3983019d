/* The context group's collectives over its communicator, in fp32 (the activations' dtype), each timed. */
#include <stdlib.h>
#include <time.h>

#include "common/clock.h"
#include "common/error.h"
#include "worker/train/train_cp.h"

struct train_cp {
    struct comm *comm;
    double seconds;
    int64_t calls;
};

static int timed(struct train_cp *g, double t0, int rc)
{
    g->seconds += clock_now_s() - t0;
    g->calls++;
    return rc;
}

static int cp_all_gather(void *ctx, const float *in, float *out, size_t count)
{
    struct train_cp *g = ctx;
    double t0 = clock_now_s();
    return timed(g, t0, comm_all_gather(g->comm, in, out, count, DTYPE_F32));
}

static int cp_reduce_scatter(void *ctx, const float *in, float *out, size_t count)
{
    struct train_cp *g = ctx;
    double t0 = clock_now_s();
    return timed(g, t0, comm_reduce_scatter(g->comm, in, out, count, DTYPE_F32, COMM_SUM));
}

static int cp_all_to_all(void *ctx, const float *in, float *out, size_t count)
{
    struct train_cp *g = ctx;
    double t0 = clock_now_s();
    return timed(g, t0, comm_all_to_all(g->comm, in, out, count, DTYPE_F32));
}

int train_cp_open(const struct worker_config *wc, int rank, struct comm *world, struct train_cp **group,
                  struct model_cp *out)
{
    int cp = wc->fsdp.context_parallel_size > 0 ? wc->fsdp.context_parallel_size : 1;
    *group = NULL;
    *out = (struct model_cp){.rank = 0, .size = 1};
    if (cp <= 1 || !world)
        return 0;
    struct train_cp *g = calloc(1, sizeof *g);
    if (!g)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = comm_split(world, rank / cp, rank % cp, &g->comm);
    if (rc) {
        free(g);
        return rc;
    }
    *group = g;
    *out = (struct model_cp){.rank = comm_rank(g->comm), .size = comm_size(g->comm),
                             .strategy = wc->fsdp.context_parallel_comm_strategy == WORKER_CP_ALLTOALL
                                             ? MODEL_CP_ALLTOALL
                                             : MODEL_CP_ALLGATHER,
                             .ctx = g, .all_gather = cp_all_gather, .reduce_scatter = cp_reduce_scatter,
                             .all_to_all = cp_all_to_all};
    return 0;
}

double train_cp_seconds(const struct train_cp *g)
{
    return g ? g->seconds : 0;
}

int64_t train_cp_calls(const struct train_cp *g)
{
    return g ? g->calls : 0;
}

void train_cp_close(struct train_cp *g)
{
    if (!g)
        return;
    comm_destroy(g->comm);
    free(g);
}
