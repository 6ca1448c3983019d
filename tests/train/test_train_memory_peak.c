/* Sharding saves memory as users measure it: with FULL_SHARD at world 4 each rank's peak RSS (VmHWM, what
 * top, sacct's MaxRSS and /usr/bin/time report) is at most 0.3 of the single rank's. The model is one where
 * the persistent state is most of the memory, the regime sharding is for: many narrow blocks (small units,
 * so the gathered and reduce-scatter buffers are a small part of it), short sequences and activation
 * checkpointing (small activations): 192 blocks of width 192, 85M parameters, 1.37 GB of state at one rank
 * (the checkpoint commit at the end adds ~25 MiB of metadata on rank 0, which a smaller model would feel). Two things the test
 * guards: no program maps CUDA on a CPU run (common/gpu_module.h), and a rank's RSS does not keep the
 * pages of peers' registered buffers it read (comm_shm.c). Suite 'slow': the sanitizer build's allocator
 * quarantine and shadow memory would measure ASan, not the engine. */
#include "ttest.h"

/* Each rank's peak RSS and its engine's peak total, in MiB, from its run summary. */
static void read_peak(const struct tt_result *r, int world, double *rss, double *total)
{
    for (int rank = 0; rank < world; rank++) {
        cJSON *s = tt_summary(r, rank);
        rss[rank] = tt_num(s, "memory.peak_rss_bytes") / 1048576.0;
        total[rank] = tt_num(s, "memory.peak_total_bytes") / 1048576.0;
        cJSON_Delete(s);
    }
}

Test(memory_peak, full_shard_world4_peak_rss_vs_world1, .timeout = 600)
{
    struct tt_ctx c;
    tt_setup(&c);
    const char *extra[] = {"--model.n_layer=192",
                           "--model.n_embd=192",
                           "--model.n_head=4",
                           "--model.block_size=16",
                           "--model.activation_checkpointing=true",
                           "--train.train_batch=4",
                           "--train.micro_batch=1",
                           "--train.max_steps=2",
                           "--fsdp.sharding_strategy=FULL_SHARD",
                           NULL};
    struct tt_result r1, r4;
    tt_run_ok(&c, 1, "w1", extra, &r1);
    tt_run_ok(&c, 4, "w4", extra, &r4);
    double rss1, tot1, rss4[4], tot4[4];
    read_peak(&r1, 1, &rss1, &tot1);
    read_peak(&r4, 4, rss4, tot4);
    cr_assert(tot1 > 1200, "world 1: the engine accounted only %.1f MiB; the model is not the one meant", tot1);
    for (int rank = 0; rank < 4; rank++) {
        double ratio = rss4[rank] / rss1;
        fprintf(stderr, "rank %d of 4: peak RSS %.1f MiB (%.3f of world 1's %.1f MiB); engine peak %.1f MiB (%.3f)\n",
                rank, rss4[rank], ratio, rss1, tot4[rank], tot4[rank] / tot1);
        cr_assert(ratio <= 0.3, "rank %d: peak RSS %.1f MiB is %.3f of world 1's %.1f MiB, want <= 0.3", rank,
                  rss4[rank], ratio, rss1);
        cr_assert(tot4[rank] / tot1 <= 0.3, "rank %d: engine peak %.1f MiB is %.3f of world 1's, want <= 0.3",
                  rank, tot4[rank], tot4[rank] / tot1);
    }
    tt_result_free(&r1);
    tt_result_free(&r4);
    tt_teardown(&c);
}
