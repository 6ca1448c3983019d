/* The context group's collectives over its communicator, in fp32 (the activations' dtype). */
#include "common/error.h"
#include "worker/train/train_cp.h"

static int cp_all_gather(void *ctx, const float *in, float *out, size_t count)
{
    return comm_all_gather(ctx, in, out, count, COMM_F32);
}

static int cp_reduce_scatter(void *ctx, const float *in, float *out, size_t count)
{
    return comm_reduce_scatter(ctx, in, out, count, COMM_F32, COMM_SUM);
}

static int cp_all_to_all(void *ctx, const float *in, float *out, size_t count)
{
    return comm_all_to_all(ctx, in, out, count, COMM_F32);
}

int train_cp_open(const struct worker_config *wc, int rank, struct comm *world, struct comm **group,
                  struct model_cp *out)
{
    int cp = wc->fsdp.context_parallel_size > 0 ? wc->fsdp.context_parallel_size : 1;
    *group = NULL;
    *out = (struct model_cp){.rank = 0, .size = 1};
    if (cp <= 1 || !world)
        return 0;
    FSDP_TRY(comm_split(world, rank / cp, rank % cp, group));
    *out = (struct model_cp){.rank = comm_rank(*group), .size = comm_size(*group),
                             .strategy = wc->fsdp.context_parallel_comm_strategy == WORKER_CP_ALLTOALL
                                             ? MODEL_CP_ALLTOALL
                                             : MODEL_CP_ALLGATHER,
                             .ctx = *group, .all_gather = cp_all_gather, .reduce_scatter = cp_reduce_scatter,
                             .all_to_all = cp_all_to_all};
    return 0;
}
