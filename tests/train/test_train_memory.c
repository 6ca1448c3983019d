/* Sharding saves memory: with FULL_SHARD at world 4 each rank's persistent state (fp32 parameters,
 * gradients and AdamW moments) is at most 0.3 of one rank's, both by the engine's accounting and by how
 * much the process's resident memory grew while the engine allocated it (every rank records both in its
 * run summary). The model is large enough (3.2M parameters, 51 MB of state at one rank) for RSS to measure
 * it. */
#include "ttest.h"

struct persistent {
    double bytes, rss_growth;
};

/* Each rank's persistent state bytes and the RSS growth creating it, from its run summary. */
static void read_persistent(const struct tt_result *r, int world, struct persistent *p)
{
    for (int rank = 0; rank < world; rank++) {
        cJSON *s = tt_summary(r, world > 0 ? rank : -1);
        p[rank] = (struct persistent){tt_num(s, "persistent.bytes"), tt_num(s, "persistent.rss_growth_bytes")};
        cJSON_Delete(s);
    }
}

Test(memory, full_shard_world4_vs_world1, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    const char *extra[] = {"--model.n_layer=4", "--model.n_embd=256", "--model.n_head=4", "--train.max_steps=1",
                           NULL};
    struct tt_result r1, r4;
    tt_run_ok(&c, 1, "w1", extra, &r1);
    tt_run_ok(&c, 4, "w4", extra, &r4);
    struct persistent one, four[4];
    read_persistent(&r1, 1, &one);
    read_persistent(&r4, 4, four);
    /* At one rank the growth is the state itself (it is written when created), so RSS measures it. */
    cr_assert(one.bytes > 40e6 && one.rss_growth > 0.9 * one.bytes,
              "world 1: %.0f bytes of state but RSS grew by only %.0f", one.bytes, one.rss_growth);
    for (int rank = 0; rank < 4; rank++) {
        double eng = four[rank].bytes / one.bytes, rss = four[rank].rss_growth / one.rss_growth;
        fprintf(stderr, "rank %d of 4: persistent %.0f bytes (%.3f of world 1), RSS growth %.0f (%.3f)\n", rank,
                four[rank].bytes, eng, four[rank].rss_growth, rss);
        /* A quarter plus padding to a multiple of the group size: never below 1/4. */
        cr_assert(eng >= 0.25 - 1e-9 && eng <= 0.3, "rank %d: engine bytes ratio %.3f, want [0.25, 0.3]", rank, eng);
        cr_assert(rss <= 0.3, "rank %d: RSS growth ratio %.3f, want <= 0.3", rank, rss);
    }
    tt_result_free(&r1);
    tt_result_free(&r4);
    tt_teardown(&c);
}
