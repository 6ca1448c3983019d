/* The training math, quick: world-size parity for the default strategy and HYBRID (the whole matrix is
 * test_train_parity, slow), mixed precision within its measured bound, gradient accumulation, and the
 * settings that must not change the math (wrap policy, init broadcast, activation checkpointing, backward
 * prefetch) giving the losses of one rank. Every run is the real fsdp-worker under the real fsdp-launch.
 *
 * Bounds (20 steps of the tiny model, relative to the fp32 losses of one rank), from measurements with a
 * margin: fp32 1e-5 (measured 1.2e-8: summation order only); bf16 parameters + bf16 reduction 1e-3
 * (measured 2.9e-4 with fp32 compute, 2.0e-4 with bf16 compute on a CPU with bf16 instructions;
 * test_train_bf16 has the bf16-compute bounds); fp16 2e-4 (measured 3.8e-5). */
#include "ttest.h"

#define FP32_REL 1e-5
#define BF16_REL 1e-3
#define FP16_REL 2e-4

Test(math, quick_parity, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    double ref[TT_STEPS];
    tt_reference(&c, ref);
    for (int version = 1; version <= 2; version++)
        for (int world = 1; world <= 3; world++)
            tt_parity_point(&c, "FULL_SHARD", version, true, world, ref, FP32_REL);
    tt_parity_point(&c, "HYBRID_SHARD", 2, true, 4, ref, FP32_REL);
    tt_teardown(&c);
}

/* Low precision must change the numbers (or it was not applied) but stay within its bound, at one rank
 * and sharded over two and three. */
static void precision_case(const char *dtype, double bound)
{
    struct tt_ctx c;
    tt_setup(&c);
    double ref[TT_STEPS];
    tt_reference(&c, ref);
    char mp[64], rd[64], plan[128];
    snprintf(mp, sizeof mp, "--fsdp.mixed_precision=%s", dtype);
    snprintf(rd, sizeof rd, "--fsdp.reduce_dtype=%s", dtype);
    snprintf(plan, sizeof plan, "{\"plan\":{\"param_dtype\":\"%s\",\"reduce_dtype\":\"%s\"}}", dtype, dtype);
    const char *extra[] = {mp, rd, NULL};
    for (int world = 1; world <= 3; world++) {
        char tag[32];
        snprintf(tag, sizeof tag, "%s-w%d", dtype, world);
        struct tt_result r;
        tt_run_ok(&c, world, tag, extra, &r);
        cr_assert(tt_summary_matches(&r, 0, plan), "the plan does not name %s:\n%s", dtype, r.err);
        double d = tt_assert_losses(&r, ref, bound, tag);
        cr_assert(d > 1e-7, "%s: losses equal fp32's (%.3g): low precision was not applied", tag, d);
        fprintf(stderr, "%s: largest relative difference from fp32 %.3g (bound %.3g)\n", tag, d, bound);
        tt_result_free(&r);
    }
    tt_teardown(&c);
}

Test(math, bf16_bound, .timeout = 300) { precision_case("bf16", BF16_REL); }
Test(math, fp16_bound, .timeout = 300) { precision_case("fp16", FP16_REL); }

/* 4 micro-batches of 2 and 1 micro-batch of 8 (one rank, train_batch 8); and with the tiny config's 12
 * rows, micro-batches of 2 and 6 against 1. */
Test(math, micro_batch_accumulation, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    const char *one8[] = {"--train.train_batch=8", "--train.micro_batch=8", NULL};
    const char *four2[] = {"--train.train_batch=8", "--train.micro_batch=2", NULL};
    struct tt_result a, b;
    tt_run_ok(&c, 1, "b8-m8", one8, &a);
    tt_run_ok(&c, 1, "b8-m2", four2, &b);
    cr_assert(tt_summary_matches(&a, 0, "{\"batch\":{\"micro_batches_per_step\":1}}") &&
                  tt_summary_matches(&b, 0, "{\"batch\":{\"micro_batches_per_step\":4}}"),
              "the runs did not accumulate as configured:\n%s\n%s", a.err, b.err);
    double ref8[TT_STEPS];
    tt_losses(&a, ref8);
    tt_assert_losses(&b, ref8, FP32_REL, "4 micro-batches of 2 vs 1 of 8");
    tt_result_free(&a);
    tt_result_free(&b);

    double ref[TT_STEPS];
    tt_reference(&c, ref);
    const char *m2[] = {"--train.micro_batch=2", NULL}, *m6[] = {"--train.micro_batch=6", NULL};
    tt_run_ok(&c, 1, "m2", m2, &a);
    tt_assert_losses(&a, ref, FP32_REL, "micro_batch 2 vs 1");
    tt_run_ok(&c, 2, "m6-w2", m6, &b); /* 6 rows per rank: one micro-batch each */
    tt_assert_losses(&b, ref, FP32_REL, "micro_batch 6 at world 2 vs micro_batch 1 at world 1");
    tt_result_free(&a);
    tt_result_free(&b);
    tt_teardown(&c);
}

/* A setting that changes how the work is cut or scheduled, not what is computed: the losses of one rank
 * with the defaults. must is a pattern (tu_json_matches) rank 0's run summary matches when the setting
 * took effect (and must_not, when set, one it would match if it did not). */
static void same_math_ex(const char *tag, int world, const char *const *extra, const char *must,
                         const char *must_not)
{
    struct tt_ctx c;
    tt_setup(&c);
    double ref[TT_STEPS];
    tt_reference(&c, ref);
    struct tt_result r;
    tt_run_ok(&c, world, tag, extra, &r);
    cr_assert(tt_summary_matches(&r, 0, must), "%s: the run summary lacks %s:\n%s", tag, must, r.err);
    cr_assert(!must_not || !tt_summary_matches(&r, 0, must_not), "%s: the run summary has %s:\n%s", tag, must_not,
              r.err);
    tt_assert_losses(&r, ref, FP32_REL, tag);
    tt_result_free(&r);
    tt_teardown(&c);
}

static void same_math(const char *tag, int world, const char *const *extra, const char *must)
{
    same_math_ex(tag, world, extra, must, NULL);
}

Test(math, size_based_wrap, .timeout = 300)
{
    /* 20000 parameters: the two 12704-parameter blocks merge into one unit, the root stays alone. */
    const char *extra[] = {"--fsdp.auto_wrap_policy=SIZE_BASED_WRAP", "--fsdp.min_num_params=20000", NULL};
    same_math("size_wrap", 3, extra, "{\"plan\":{\"units\":[{\"name\":\"h.0..h.1\"}]}}");
}

Test(math, no_wrap, .timeout = 300)
{
    const char *extra[] = {"--fsdp.auto_wrap_policy=NO_WRAP", NULL};
    same_math("no_wrap", 2, extra, "{\"plan\":{\"units\":[{\"name\":\"root..h.1\"}]}}");
}

Test(math, no_sync_module_states, .timeout = 300)
{
    /* Each rank initialises only its own shards from the seed instead of receiving rank 0's. */
    const char *extra[] = {"--fsdp.sync_module_states=false", NULL};
    same_math("no_sync", 3, extra, "{\"plan\":{\"strategy\":\"FULL_SHARD\"}}");
}

Test(math, activation_checkpointing, .timeout = 300)
{
    const char *extra[] = {"--model.activation_checkpointing=true", NULL};
    same_math("act_ckpt", 2, extra, "{\"model\":{\"activation_checkpointing\":true}}");
}

Test(math, backward_post, .timeout = 300)
{
    const char *extra[] = {"--fsdp.backward_prefetch=BACKWARD_POST", NULL};
    same_math("backward_post", 3, extra, "{\"plan\":{\"backward_prefetch\":\"BACKWARD_POST\"}}");
}

Test(math, shard_grad_op_no_reshard, .timeout = 300)
{
    const char *extra[] = {"--fsdp.sharding_strategy=SHARD_GRAD_OP", "--fsdp.forward_prefetch=true", NULL};
    same_math("zero2", 2, extra, "{\"plan\":{\"strategy\":\"SHARD_GRAD_OP\"}}");
}

Test(math, no_reshard_after_forward, .timeout = 300)
{
    const char *extra[] = {"--fsdp.reshard_after_forward=false", NULL};
    same_math_ex("keep_gathered", 2, extra, "{\"plan\":{\"units\":[{\"name\":\"h.1\"}]}}",
                 "{\"plan\":{\"units\":[{\"resharded\":true}]}}");
}

Test(math, fsdp_disabled_and_unlimited_gathers, .timeout = 300)
{
    /* enable = false replicates like DDP; limit_all_gathers = false leaves reductions unbounded in flight */
    const char *extra[] = {"--fsdp.enable=false", "--fsdp.limit_all_gathers=false", NULL};
    same_math("disabled", 3, extra,
              "{\"plan\":{\"strategy\":\"NO_SHARD\",\"enabled\":false,\"version\":2,\"world_size\":3,"
              "\"shard_groups\":3,\"shard_group_size\":1,\"data_parallel_size\":3,\"context_parallel_size\":1}}");
}

Test(math, offload_params_on_cpu, .timeout = 300)
{
    /* Accepted on CPU, where the shards already live in host memory: nothing changes. */
    const char *extra[] = {"--fsdp.offload_params=true", "--fsdp.version=1", NULL};
    same_math("offload", 2, extra, "{\"plan\":{\"strategy\":\"FULL_SHARD\",\"version\":1,\"world_size\":2}}");
}

/* Started with no launcher and no torchrun variables, fsdp-worker trains as one rank: the same losses as
 * one rank under fsdp-launch, bit for bit (the same computation in the same order). */
Test(math, single_rank_without_launcher, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    double ref[TT_STEPS];
    tt_reference(&c, ref);
    struct tt_result r;
    tt_run_ok(&c, 0, "alone", NULL, &r);
    cr_assert(tt_summary_matches(&r, -1, "{\"plan\":{\"world_size\":1,\"shard_groups\":1,\"shard_group_size\":1}}"),
              "not one rank:\n%s", r.err);
    cr_assert_null(strstr(r.err, "[rank "), "a lone worker has no rank prefix:\n%s", r.err);
    tt_assert_losses(&r, ref, 0.0, "fsdp-worker alone vs one rank under fsdp-launch");
    tt_result_free(&r);
    tt_teardown(&c);
}

/* fp16 loss scaling, as ShardedGradScaler: on a corpus of one repeated byte every token pulls the same
 * LM-head row the same way, so at the initial scale (65536) the fp16 reduce-scatter overflows. Every rank
 * must skip the same steps, halving the scale each time, leave the parameters untouched (the data repeats,
 * so the next step's loss is bit-identical), then train on at the smaller scale. */
Test(math, fp16_loss_scale_backoff, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    char txt[2048], data[2048], file[2100];
    snprintf(txt, sizeof txt, "%s/aaaa", c.dir);
    snprintf(data, sizeof data, "%s/aaaa-data", c.dir);
    cr_assert_eq(mkdir(txt, 0755), 0);
    snprintf(file, sizeof file, "%s/a.txt", txt);
    char *text = malloc(20001);
    memset(text, 'a', 20000);
    text[20000] = 0;
    lu_write_text(file, text);
    free(text);
    const char *pargv[] = {lu_build_path("worker/fsdp-prepare-data"), "-o", data, txt, NULL};
    cr_assert_eq(lu_exit_code(lu_wait(lu_spawn(pargv, c.dir, "prep-a", NULL), 120)), 0);
    char trainarg[2200];
    snprintf(trainarg, sizeof trainarg, "--data.train_file=%s/train.bin", data);
    const char *extra[] = {trainarg, "--data.val_file=", "--fsdp.mixed_precision=fp16", "--fsdp.reduce_dtype=fp16",
                           "--train.micro_batch=6", NULL};
    struct tt_result r;
    tt_run_ok(&c, 2, "fp16-aaaa", extra, &r);
    double loss[TT_STEPS], gn[TT_STEPS];
    tt_losses(&r, loss);
    tt_metric(&r, "grad_norm", gn, TT_STEPS);
    double scale = 65536;
    int skipped = 0, last_skip = 0;
    cJSON *sum[2] = {tt_summary(&r, 0), tt_summary(&r, 1)};
    for (int s = 1; s <= TT_STEPS; s++) {
        char want[160];
        snprintf(want, sizeof want, "{\"loss_scale\":{\"skipped\":[{\"step\":%d,\"from\":%.17g,\"to\":%.17g}]}}", s,
                 scale, scale / 2);
        bool r0 = tu_json_matches(sum[0], want), r1 = tu_json_matches(sum[1], want);
        cr_assert_eq(r0, r1, "ranks disagree on skipping step %d:\n%s", s, r.err);
        if (r0) {
            skipped++;
            last_skip = s;
            scale /= 2;
            /* metrics row s-1 is the skipped step; row s ran on the same parameters and the same batch */
            cr_assert(!isfinite(gn[s - 1]), "skipped step %d reports a finite grad_norm %g", s, gn[s - 1]);
            if (s < TT_STEPS)
                cr_assert_eq(loss[s], loss[s - 1], "step %d was skipped but the parameters moved: %.9g then %.9g", s,
                             loss[s - 1], loss[s]);
        }
    }
    cr_assert(skipped >= 1, "no step was skipped at loss scale 65536 with fp16 reductions:\n%s", r.err);
    int recorded = cJSON_GetArraySize(tu_json_at(sum[0], "loss_scale.skipped")) +
                   cJSON_GetArraySize(tu_json_at(sum[1], "loss_scale.skipped"));
    cr_assert_eq(recorded, 2 * skipped, "skips other than the halving sequence:\n%s", r.err);
    cJSON_Delete(sum[0]);
    cJSON_Delete(sum[1]);
    cr_assert(last_skip < TT_STEPS - 5 && loss[TT_STEPS - 1] < loss[last_skip] - 0.5,
              "training did not go on after the last skip (step %d): loss %.4f -> %.4f", last_skip, loss[last_skip],
              loss[TT_STEPS - 1]);
    fprintf(stderr, "fp16: %d step(s) skipped, scale now %g; loss %.4f -> %.4f\n", skipped, scale, loss[0],
            loss[TT_STEPS - 1]);
    tt_result_free(&r);
    tt_teardown(&c);
}

/* fp16 loss scaling grows as well as backs off: after 2000 steps in a row without overflow the scale
 * doubles (ShardedGradScaler's growth_interval and growth_factor), and a skip restarts the count. The
 * reductions are fp32 so that overflows, whose steps depend on rounding (they moved between the plain and
 * the sanitizer build), are unlikely; any that happen are read from the ranks' run summaries (loss_scale),
 * and every growth must come exactly 2000 good steps after the last skip or growth, with the scale doubled,
 * on both ranks. */
Test(math, fp16_loss_scale_growth, .timeout = 600)
{
    struct tt_ctx c;
    tt_setup(&c);
    enum { STEPS = 2100 };
    const char *extra[] = {"--fsdp.mixed_precision=fp16", "--fsdp.reduce_dtype=fp32", "--train.max_steps=2100",
                           "--train.micro_batch=6", "--log.interval=500", "--optim.lr=0.0003", NULL};
    struct tt_result r;
    tt_run_ok(&c, 2, "fp16-growth", extra, &r);
    double scale = 65536;
    int good = 0, grown = 0;
    cJSON *sum[2] = {tt_summary(&r, 0), tt_summary(&r, 1)};
    for (int s = 1; s <= STEPS; s++) {
        char skip[160], grow[160];
        snprintf(skip, sizeof skip, "{\"loss_scale\":{\"skipped\":[{\"step\":%d,\"from\":%.17g,\"to\":%.17g}]}}", s,
                 scale, scale / 2);
        snprintf(grow, sizeof grow, "{\"loss_scale\":{\"grown\":[{\"step\":%d,\"from\":%.17g,\"to\":%.17g}]}}", s,
                 scale, scale * 2);
        bool skipped = false;
        for (int rank = 0; rank < 2; rank++) {
            bool k = tu_json_matches(sum[rank], skip), g = tu_json_matches(sum[rank], grow);
            if (rank == 0 && k) {
                skipped = true;
                scale /= 2;
                good = -1;
            }
            cr_assert_eq(skipped, k, "ranks disagree on skipping step %d:\n%s", s, r.err);
            cr_assert(!g || good + 1 == 2000, "rank %d: growth at step %d after %d good steps:\n%s", rank, s,
                      good + 1, r.err);
            if (good + 1 == 2000)
                cr_assert(g, "rank %d: no growth at step %d (2000 good steps, scale %g)", rank, s, scale);
        }
        if (++good == 2000) {
            scale *= 2;
            good = 0;
            grown++;
        }
    }
    cr_assert(grown >= 1, "the scale never grew in %d steps", STEPS);
    int recorded = cJSON_GetArraySize(tu_json_at(sum[0], "loss_scale.grown")) +
                   cJSON_GetArraySize(tu_json_at(sum[1], "loss_scale.grown"));
    cr_assert_eq(recorded, 2 * grown, "growths other than the expected ones:\n%s", r.err);
    cJSON_Delete(sum[0]);
    cJSON_Delete(sum[1]);
    fprintf(stderr, "fp16: %d growth(s), scale now %g\n", grown, scale);
    tt_result_free(&r);
    tt_teardown(&c);
}
