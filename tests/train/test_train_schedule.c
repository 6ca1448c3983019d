/* The gather schedule, counted: every rank's run summary says how many all-gathers it issued and how many
 * were already in flight when a unit needed them (prefetched). For the tiny model (root + 2 block units) at
 * world 2 with 6 micro-batches per step over 20 steps the counts follow from the strategy and prefetch
 * settings exactly:
 *   FULL_SHARD   gathers    20 x (1 root + 6 x (2 blocks in forward + h.0 again in backward)) = 380: the
 *                           last unit, h.1, stays gathered from its forward into its backward
 *                prefetched BACKWARD_PRE or POST: 20 x 6 x 1 (h.0 while h.1 runs backward) = 120;
 *                           + forward_prefetch: 20 x 6 x 2 more (each block while the unit before runs) = 360
 *   SHARD_GRAD_OP gathers   20 x 3 (each unit once, kept until the optimizer step) = 60; with
 *                           forward_prefetch 20 x 2 of them prefetched
 *   NO_SHARD     no gathers at all. */
#include "ttest.h"

static void expect_counts(const char *tag, const char *const *extra, long gathers, long prefetched)
{
    struct tt_ctx c;
    tt_setup(&c);
    struct tt_result r;
    tt_run_ok(&c, 2, tag, extra, &r);
    for (int rank = 0; rank < 2; rank++) {
        cJSON *s = tt_summary(&r, rank);
        long g = (long)tt_num(s, "collectives.all_gathers"), p = (long)tt_num(s, "collectives.prefetched");
        cr_assert(g == gathers && p == prefetched,
                  "%s: rank %d issued %ld all-gathers (%ld prefetched), expected %ld (%ld)", tag, rank, g, p, gathers,
                  prefetched);
        cJSON_Delete(s);
    }
    tt_result_free(&r);
    tt_teardown(&c);
}

Test(schedule, full_shard_no_prefetch, .timeout = 240)
{
    const char *extra[] = {"--fsdp.backward_prefetch=NO_PREFETCH", NULL};
    expect_counts("none", extra, 380, 0);
}

Test(schedule, full_shard_backward_pre, .timeout = 240)
{
    const char *extra[] = {"--fsdp.backward_prefetch=BACKWARD_PRE", NULL};
    expect_counts("pre", extra, 380, 120);
}

Test(schedule, full_shard_backward_post, .timeout = 240)
{
    const char *extra[] = {"--fsdp.backward_prefetch=BACKWARD_POST", NULL};
    expect_counts("post", extra, 380, 120);
}

Test(schedule, full_shard_forward_and_backward_prefetch, .timeout = 240)
{
    const char *extra[] = {"--fsdp.backward_prefetch=BACKWARD_PRE", "--fsdp.forward_prefetch=true", NULL};
    expect_counts("fwd-pre", extra, 380, 360);
}

Test(schedule, shard_grad_op_keeps_units, .timeout = 240)
{
    const char *extra[] = {"--fsdp.sharding_strategy=SHARD_GRAD_OP", "--fsdp.forward_prefetch=true", NULL};
    expect_counts("zero2", extra, 60, 40);
}

Test(schedule, no_shard_gathers_nothing, .timeout = 240)
{
    const char *extra[] = {"--fsdp.sharding_strategy=NO_SHARD", NULL};
    expect_counts("ddp", extra, 0, 0);
}
