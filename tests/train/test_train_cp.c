/* Context parallelism through the real fsdp-worker under the real fsdp-launch: the ranks of a context group
 * share rows and split every sequence, and the per-step losses are those of one rank (fp32, relative 1e-5)
 * for 20 steps: both strategies, GPT-2 and Llama (grouped-query heads), world 2 (C = 2), world 4 (C = 2 x 2
 * data-parallel, and C = 4) and world 3 (C = 3), under FULL_SHARD and HYBRID_SHARD, with micro-batches and
 * activation checkpointing. Checkpoints saved at C = 2 resume at C = 1 and C = 4 with the same losses. */
#include "ttest.h"

#define FP32_REL 1e-5

/* One context-parallel run of the matrix against ref; asserts every rank's summary shows the mesh. */
static double cp_point(const struct tt_ctx *c, int world, int cp, const char *strategy, const char *tag,
                       const char *const *more, const double *ref)
{
    char size[64], strat[96];
    snprintf(size, sizeof size, "--fsdp.context_parallel_size=%d", cp);
    snprintf(strat, sizeof strat, "--fsdp.context_parallel_comm_strategy=%s", strategy);
    const char *extra[16] = {"--train.device=cpu", size, strat};
    int n = 3;
    for (int i = 0; more && more[i]; i++)
        extra[n++] = more[i];
    extra[n] = NULL;
    struct tt_result r;
    tt_run_ok(c, world, tag, extra, &r);
    char want[128];
    snprintf(want, sizeof want, "{\"plan\":{\"data_parallel_size\":%d,\"context_parallel_size\":%d}}", world / cp, cp);
    for (int rank = 0; rank < world; rank++) {
        cr_assert(tt_summary_matches(&r, rank, want), "%s: rank %d's summary lacks the mesh %s", tag, rank, want);
        /* the attention of every layer went through the context group: 2 layers x (forward + backward, and
         * the forward again with checkpointing) per micro-batch */
        cJSON *s = tt_summary(&r, rank);
        cr_assert_geq(tt_num(s, "collectives.context_parallel_calls"), 20 * 2 * 2, "%s: rank %d", tag, rank);
        cJSON_Delete(s);
    }
    double d = tt_assert_losses(&r, ref, FP32_REL, tag);
    tt_result_free(&r);
    return d;
}

/* Every run names the CPU: the suite runs as on a GPU host, where device auto would mean cuda. */
static void run_cpu(const struct tt_ctx *c, int world, const char *tag, const char *const *more,
                    struct tt_result *r)
{
    const char *extra[16] = {"--train.device=cpu"};
    int n = 1;
    for (int i = 0; more && more[i]; i++)
        extra[n++] = more[i];
    extra[n] = NULL;
    tt_run_ok(c, world, tag, extra, r);
}

static void reference_with(const struct tt_ctx *c, const char *tag, const char *const *extra, double *ref)
{
    struct tt_result r;
    run_cpu(c, 1, tag, extra, &r);
    tt_losses(&r, ref);
    tt_result_free(&r);
}

/* The matrix of one family and strategy at block_size 16 (C = 2 and 4) and 24 (C = 3); `heads` are the
 * settings that let the strategy split the heads over 4 ranks (alltoall), applied to reference and runs. */
static void cp_matrix(void (*setup)(struct tt_ctx *), const char *strategy, const char *heads4, const char *what)
{
    struct tt_ctx c;
    setup(&c);
    double ref[TT_STEPS], ref4[TT_STEPS], ref24[TT_STEPS], worst = 0, d;
    reference_with(&c, "ref", NULL, ref);
    const char *h4[] = {heads4, NULL};
    if (heads4)
        reference_with(&c, "ref-heads4", h4, ref4);
    const char *b24[] = {"--model.block_size=24", NULL};
    reference_with(&c, "ref-block24", b24, ref24);

    const char *full[] = {"--fsdp.sharding_strategy=FULL_SHARD", NULL};
    d = cp_point(&c, 2, 2, strategy, "c2-w2", full, ref);
    worst = fmax(worst, d);
    /* C = 2 x 2 data-parallel: HYBRID shards over a context group, replicates across the two; 6 rows per group
     * in micro-batches of 3 */
    const char *hybrid[] = {"--fsdp.sharding_strategy=HYBRID_SHARD", "--fsdp.hybrid_shard_size=2",
                            "--train.micro_batch=3", NULL};
    d = cp_point(&c, 4, 2, strategy, "c2-dp2-hybrid", hybrid, ref);
    worst = fmax(worst, d);
    const char *full_dp[] = {"--fsdp.sharding_strategy=FULL_SHARD", "--model.activation_checkpointing=true", NULL};
    d = cp_point(&c, 4, 2, strategy, "c2-dp2-full-ckpt", full_dp, ref);
    worst = fmax(worst, d);
    /* C = 4: activation checkpointing and micro-batches of 2 */
    const char *c4[] = {"--model.activation_checkpointing=true", "--train.micro_batch=2", heads4, NULL};
    d = cp_point(&c, 4, 4, strategy, "c4-w4-ckpt", c4, heads4 ? ref4 : ref);
    worst = fmax(worst, d);
    /* C = 3 at world 3: block_size 24 = 6 chunks of 4 */
    const char *c3[] = {"--model.block_size=24", "--train.micro_batch=2", NULL};
    d = cp_point(&c, 3, 3, strategy, "c3-w3", c3, ref24);
    worst = fmax(worst, d);
    fprintf(stderr, "%s, %s: 5 context-parallel runs, largest relative loss difference from one rank %.3g\n", what,
            strategy, worst);
    tt_teardown(&c);
}

Test(cp, gpt2_allgather, .timeout = 300)
{
    cp_matrix(tt_setup, "allgather", NULL, "gpt2");
}

/* alltoall splits the heads: the tiny GPT's 2 heads serve C = 2, 4 heads C = 4 (its own reference); C = 3
 * is gpt2_alltoall_three_ranks. */
Test(cp, gpt2_alltoall, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    double ref[TT_STEPS], ref4[TT_STEPS], worst = 0;
    reference_with(&c, "ref", NULL, ref);
    const char *h4[] = {"--model.n_head=4", NULL};
    reference_with(&c, "ref-heads4", h4, ref4);
    const char *full[] = {"--fsdp.sharding_strategy=FULL_SHARD", "--model.activation_checkpointing=true", NULL};
    worst = fmax(worst, cp_point(&c, 2, 2, "alltoall", "c2-w2", full, ref));
    const char *hybrid[] = {"--fsdp.sharding_strategy=HYBRID_SHARD", "--fsdp.hybrid_shard_size=2",
                            "--train.micro_batch=3", NULL};
    worst = fmax(worst, cp_point(&c, 4, 2, "alltoall", "c2-dp2-hybrid", hybrid, ref));
    const char *c4[] = {"--model.n_head=4", "--model.activation_checkpointing=true", "--train.micro_batch=2", NULL};
    worst = fmax(worst, cp_point(&c, 4, 4, "alltoall", "c4-w4-ckpt", c4, ref4));
    fprintf(stderr, "gpt2, alltoall: 3 context-parallel runs, largest relative loss difference from one rank %.3g\n",
            worst);
    tt_teardown(&c);
}

Test(cp, gpt2_alltoall_three_ranks, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    double ref[TT_STEPS];
    const char *shape[] = {"--model.n_head=3", "--model.n_embd=48", "--model.block_size=24", NULL};
    reference_with(&c, "ref", shape, ref);
    const char *more[] = {"--model.n_head=3", "--model.n_embd=48", "--model.block_size=24", "--train.micro_batch=2",
                          "--model.activation_checkpointing=true", NULL};
    double d = cp_point(&c, 3, 3, "alltoall", "c3-w3", more, ref);
    fprintf(stderr, "gpt2, alltoall, C = 3: relative loss difference from one rank %.3g\n", d);
    tt_teardown(&c);
}

Test(cp, llama_allgather, .timeout = 300)
{
    cp_matrix(tt_setup_llama, "allgather", NULL, "llama");
}

/* The tiny Llama's 4 query and 2 key/value heads serve C = 2; C = 4 with 4 key/value heads. */
Test(cp, llama_alltoall, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup_llama(&c);
    double ref[TT_STEPS], ref4[TT_STEPS], worst = 0;
    reference_with(&c, "ref", NULL, ref);
    const char *kv4[] = {"--model.n_kv_head=4", NULL};
    reference_with(&c, "ref-kv4", kv4, ref4);
    const char *full[] = {"--fsdp.sharding_strategy=FULL_SHARD", "--model.activation_checkpointing=true", NULL};
    worst = fmax(worst, cp_point(&c, 2, 2, "alltoall", "c2-w2", full, ref));
    const char *hybrid[] = {"--fsdp.sharding_strategy=HYBRID_SHARD", "--fsdp.hybrid_shard_size=2",
                            "--train.micro_batch=3", NULL};
    worst = fmax(worst, cp_point(&c, 4, 2, "alltoall", "c2-dp2-hybrid", hybrid, ref));
    const char *c4[] = {"--model.n_kv_head=4", "--train.micro_batch=2", NULL};
    worst = fmax(worst, cp_point(&c, 4, 4, "alltoall", "c4-w4", c4, ref4));
    fprintf(stderr, "llama, alltoall: 3 context-parallel runs, largest relative loss difference from one rank %.3g\n",
            worst);
    tt_teardown(&c);
}

/* Mistral's sliding window split across the context group: a window of 5 tokens over sequences of 16 cut in
 * chunks of 4 (C = 2) or 2 (C = 4), so a query's window reaches into other ranks' chunks and some chunks are
 * wholly outside it; both strategies against one rank with the same window, and that reference differs
 * from full attention's (the window is applied at all). */
Test(cp, mistral_sliding_window, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup_llama(&c);
    double ref[TT_STEPS], full[TT_STEPS], worst = 0;
    const char *win[] = {"--model.model_family=mistral", "--model.sliding_window=5", NULL};
    reference_with(&c, "ref", win, ref);
    const char *nowin[] = {"--model.model_family=mistral", NULL};
    reference_with(&c, "ref-full", nowin, full);
    cr_assert_gt(tt_max_rel(ref, full, TT_STEPS), 1e-4, "the window does not change the losses");
    const char *ag[] = {"--model.model_family=mistral", "--model.sliding_window=5",
                        "--fsdp.sharding_strategy=FULL_SHARD", NULL};
    worst = fmax(worst, cp_point(&c, 2, 2, "allgather", "c2-allgather", ag, ref));
    const char *ag4[] = {"--model.model_family=mistral", "--model.sliding_window=5", "--train.micro_batch=2",
                         "--model.activation_checkpointing=true", NULL};
    worst = fmax(worst, cp_point(&c, 4, 4, "allgather", "c4-allgather-ckpt", ag4, ref));
    worst = fmax(worst, cp_point(&c, 2, 2, "alltoall", "c2-alltoall", ag, ref));
    fprintf(stderr, "mistral, sliding window 5: 3 context-parallel runs, largest relative loss difference from one "
                    "rank %.3g\n", worst);
    tt_teardown(&c);
}

/* Evaluation splits sequences too: the validation losses (every 5 steps, 2 batches) at C = 2 are one rank's,
 * here under SHARD_GRAD_OP. */
Test(cp, validation_loss_and_shard_grad_op, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    const char *val[] = {"--train.eval_interval=5", "--train.eval_steps=2", NULL};
    const char *val_cp[] = {"--train.eval_interval=5", "--train.eval_steps=2", "--fsdp.context_parallel_size=2",
                            "--fsdp.sharding_strategy=SHARD_GRAD_OP", NULL};
    struct tt_result a, b;
    run_cpu(&c, 1, "val-ref", val, &a);
    run_cpu(&c, 2, "val-c2", val_cp, &b);
    double ref[TT_STEPS], va[TT_STEPS + 1], vb[TT_STEPS + 1];
    tt_losses(&a, ref);
    tt_assert_losses(&b, ref, FP32_REL, "C = 2, SHARD_GRAD_OP, with evaluation");
    int n = tt_metric(&a, "val_loss", va, TT_STEPS + 1), m = tt_metric(&b, "val_loss", vb, TT_STEPS + 1), seen = 0;
    cr_assert_eq(n, m);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(isnan(va[i]), isnan(vb[i]), "row %d: val_loss in one run only", i);
        if (isnan(va[i]))
            continue;
        seen++;
        cr_assert(fabs(va[i] - vb[i]) <= FP32_REL * fabs(va[i]), "row %d: val_loss %.9g at C = 2, %.9g on one rank", i,
                  vb[i], va[i]);
    }
    cr_assert_geq(seen, 3, "only %d validation rows", seen);
    tt_result_free(&a), tt_result_free(&b);
    tt_teardown(&c);
}

/* Less activation memory per rank: the model's arena (the run summary's model.activation_bytes) at C = 2 is
 * below one rank's, at one sequence per micro-batch. */
Test(cp, activation_bytes_per_rank_shrink, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    const char *big[] = {"--model.block_size=64", "--train.max_steps=1", NULL};
    const char *big2[] = {"--model.block_size=64", "--train.max_steps=1", "--fsdp.context_parallel_size=2", NULL};
    const char *big4[] = {"--model.block_size=64", "--train.max_steps=1", "--fsdp.context_parallel_size=4", NULL};
    struct tt_result a, b, d;
    run_cpu(&c, 1, "c1", big, &a);
    run_cpu(&c, 2, "c2", big2, &b);
    run_cpu(&c, 4, "c4", big4, &d);
    cJSON *sa = tt_summary(&a, 0), *sb = tt_summary(&b, 1), *sd = tt_summary(&d, 3);
    double x1 = tt_num(sa, "model.activation_bytes"), x2 = tt_num(sb, "model.activation_bytes"),
           x4 = tt_num(sd, "model.activation_bytes");
    fprintf(stderr, "activation bytes per rank at T = 64: C=1 %.0f, C=2 %.0f (%.2fx), C=4 %.0f (%.2fx)\n", x1, x2,
            x2 / x1, x4, x4 / x1);
    cr_assert(x2 < x1 && x4 < x2, "activation bytes per rank do not shrink with C: %g, %g, %g", x1, x2, x4);
    cJSON_Delete(sa), cJSON_Delete(sb), cJSON_Delete(sd);
    tt_result_free(&a), tt_result_free(&b), tt_result_free(&d);
    tt_teardown(&c);
}

/* The steps and losses of a resumed run's metrics rows, checked against ref[step]. */
static void assert_resumed(const struct tt_result *r, const double *ref, int first, const char *what)
{
    double step[TT_STEPS + 1], loss[TT_STEPS + 1];
    int n = tt_metric(r, "step", step, TT_STEPS + 1);
    tt_metric(r, "loss", loss, TT_STEPS + 1);
    cr_assert_eq(n, TT_STEPS - first, "%s: %d metric rows, expected steps %d..%d", what, n, first, TT_STEPS - 1);
    for (int i = 0; i < n; i++) {
        cr_assert_eq((int)step[i], first + i, "%s: row %d is step %g", what, i, step[i]);
        double d = fabs(loss[i] - ref[first + i]) / fabs(ref[first + i]);
        cr_assert(d <= FP32_REL, "%s: step %d loss %.9g, one rank's %.9g (relative %.3g)", what, first + i, loss[i],
                  ref[first + i], d);
    }
}

/* Checkpoints are the same files at any C: saved at step 10 of a C = 2 run, resumed at C = 1 (world 1 and
 * world 2 data-parallel) and C = 4, the losses of steps 10..19 are one rank's uninterrupted run's. */
Test(cp, checkpoint_saved_at_c2_resumes_at_c1_and_c4, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    double ref[TT_STEPS];
    reference_with(&c, "ref", NULL, ref);
    const char *save[] = {"--fsdp.context_parallel_size=2", "--checkpoint.interval=10", "--checkpoint.keep_last=0",
                          NULL};
    struct tt_result s;
    run_cpu(&c, 2, "save-c2", save, &s);
    tt_assert_losses(&s, ref, FP32_REL, "C = 2 run that saves");
    tt_result_free(&s);
    char from[2200];
    snprintf(from, sizeof from, "--checkpoint.resume_from=%s/save-c2/ckpt/fsdp_sharded_cpt10", c.dir);
    const struct {
        int world;
        const char *cp, *tag;
    } to[] = {{1, NULL, "resume-c1-w1"}, {2, NULL, "resume-c1-w2"}, {4, "--fsdp.context_parallel_size=4", "resume-c4"}};
    for (size_t i = 0; i < sizeof to / sizeof to[0]; i++) {
        const char *extra[] = {from, to[i].cp, NULL};
        struct tt_result r;
        run_cpu(&c, to[i].world, to[i].tag, extra, &r);
        assert_resumed(&r, ref, 10, to[i].tag);
        tt_result_free(&r);
    }
    tt_teardown(&c);
}

/* Head size 64, the AVX-512 tiles of both attention kernels where the CPU has them: a GPT of 2 heads of 64 at
 * block_size 256, so C = 2 cuts every sequence into chunks of whole 64-row tiles. fp32: one rank's losses
 * (1e-5) for both strategies. bf16 (where the CPU multiplies bf16 natively): C = 2 against one rank in bf16.
 * The two attention kernels round the probabilities of different tiles (C = 1 the AVX512_BF16 tiles, C > 1
 * the row-by-row products), so the bound is above fp32's: measured 2e-5, where bf16 against fp32 is 5e-4.
 * lr 0.001: at the tiny model's 0.003 this wider model's loss spikes at step 10, and the spike multiplies
 * every rounding difference (1.5e-3 between two bf16 runs at worlds 1 and 2 that differ only in summation
 * order). */
#define CP_BF16_REL 1e-4

Test(cp, head_size_64_fp32_and_bf16, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    const char *shape[] = {"--model.n_embd=128", "--model.block_size=256", "--optim.lr=0.001", NULL};
    double ref[TT_STEPS], worst = 0;
    reference_with(&c, "ref", shape, ref);
    static const char *const strategies[] = {"allgather", "alltoall"};
    for (int s = 0; s < 2; s++) {
        char tag[64];
        snprintf(tag, sizeof tag, "hs64-%s", strategies[s]);
        worst = fmax(worst, cp_point(&c, 2, 2, strategies[s], tag, shape, ref));
    }
    fprintf(stderr, "head size 64, fp32: largest relative loss difference from one rank %.3g\n", worst);

    const char *bf16[] = {"--model.n_embd=128", "--model.block_size=256", "--optim.lr=0.001",
                          "--fsdp.mixed_precision=bf16", NULL};
    struct tt_result r;
    run_cpu(&c, 1, "ref-bf16", bf16, &r);
    bool native = tt_summary_matches(&r, 0, "{\"plan\":{\"compute_dtype\":\"bf16\"}}");
    double refb[TT_STEPS];
    tt_losses(&r, refb);
    tt_result_free(&r);
    if (!native) {
        tt_teardown(&c);
        cr_skip_test("fp32 checked; this CPU has no bf16 matmul instructions, so bf16 at C = 2 is not checked");
    }
    worst = 0;
    for (int s = 0; s < 2; s++) {
        char size[64], strat[96], tag[64];
        snprintf(size, sizeof size, "--fsdp.context_parallel_size=%d", 2);
        snprintf(strat, sizeof strat, "--fsdp.context_parallel_comm_strategy=%s", strategies[s]);
        snprintf(tag, sizeof tag, "bf16-%s", strategies[s]);
        const char *extra[] = {"--model.n_embd=128", "--model.block_size=256", "--optim.lr=0.001",
                               "--fsdp.mixed_precision=bf16", size, strat, NULL};
        run_cpu(&c, 2, tag, extra, &r);
        cr_assert(tt_summary_matches(&r, 0, "{\"plan\":{\"compute_dtype\":\"bf16\",\"context_parallel_size\":2}}"),
                  "%s: rank 0 did not compute in bf16 at C = 2", tag);
        worst = fmax(worst, tt_assert_losses(&r, refb, CP_BF16_REL, tag));
        tt_result_free(&r);
    }
    fprintf(stderr, "head size 64, bf16: largest relative loss difference from one rank in bf16 %.3g (bound %.3g)\n",
            worst, CP_BF16_REL);
    tt_teardown(&c);
}
