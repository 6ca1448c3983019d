/* The Llama family through the real fsdp-worker under the real fsdp-launch: everything the engine does for
 * GPT-2 it does for the tiny Llama (tt_llama_ini: grouped-query attention, untied head), with the same
 * bounds as test_train_math. World-size parity over every strategy and both FSDP versions with and without
 * prefetch; a tied head; mixed precision within its bound; the settings that must not change the math
 * (activation checkpointing, wrap policies and the wrap class spellings, backward prefetch, micro-batches,
 * per-rank init). The whole matrix is test_train_parity's llama tests (slow). */
#include "ttest.h"

#define FP32_REL 1e-5
#define BF16_REL 1e-3
#define FP16_REL 2e-4

static const char LLAMA_PLAN[] = "{\"model\":{\"family\":\"llama\",\"n_kv_head\":2,\"intermediate_size\":64,"
                                 "\"tie_word_embeddings\":false},\"plan\":{\"units\":[{\"name\":\"root\"},"
                                 "{\"name\":\"model.layers.0\"},{\"name\":\"model.layers.1\"}]}}";

Test(llama, quick_parity_every_strategy, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup_llama(&c);
    struct tt_result r;
    tt_run_ok(&c, 1, "reference", NULL, &r);
    cr_assert(tt_summary_matches(&r, 0, LLAMA_PLAN), "not the tiny Llama in three units:\n%s", r.err);
    double ref[TT_STEPS];
    tt_losses(&r, ref);
    cr_assert(ref[TT_STEPS - 1] < ref[0] - 0.5, "the Llama did not learn: %g -> %g", ref[0], ref[TT_STEPS - 1]);
    tt_result_free(&r);
    double worst = 0, d;
    for (int version = 1; version <= 2; version++)
        for (int world = 2; world <= 3; world++) {
            d = tt_parity_point(&c, "FULL_SHARD", version, version == 2, world, ref, FP32_REL);
            worst = d > worst ? d : worst;
        }
    const struct {
        const char *strategy;
        int version, world;
        bool prefetch;
    } more[] = {{"SHARD_GRAD_OP", 2, 2, false}, {"NO_SHARD", 1, 3, true}, {"HYBRID_SHARD", 2, 4, true},
                {"HYBRID_SHARD_ZERO2", 1, 4, false}};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
        d = tt_parity_point(&c, more[i].strategy, more[i].version, more[i].prefetch, more[i].world, ref, FP32_REL);
        worst = d > worst ? d : worst;
    }
    fprintf(stderr, "llama parity: 8 runs, largest relative loss difference %.3g\n", worst);
    tt_teardown(&c);
}

/* tie_word_embeddings: the LM head is embed_tokens, sharded with the root unit; parity over worlds. */
Test(llama, tied_head_parity, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup_llama(&c);
    const char *tied[] = {"--model.tie_word_embeddings=true", NULL};
    struct tt_result a, b;
    tt_run_ok(&c, 1, "tied-w1", tied, &a);
    cr_assert(tt_summary_matches(&a, 0, "{\"model\":{\"family\":\"llama\",\"tie_word_embeddings\":true}}"), "%s",
              a.err);
    double ref[TT_STEPS], untied[TT_STEPS];
    tt_losses(&a, ref);
    const char *tied_v1[] = {"--model.tie_word_embeddings=true", "--fsdp.version=1", NULL};
    tt_run_ok(&c, 3, "tied-w3", tied_v1, &b);
    tt_assert_losses(&b, ref, FP32_REL, "tied head at world 3 (v1) vs world 1");
    /* a different model than the untied one */
    struct tt_result u;
    tt_run_ok(&c, 1, "untied-w1", NULL, &u);
    tt_losses(&u, untied);
    cr_assert(tt_max_rel(untied, ref, TT_STEPS) > 1e-3, "tying the head changed nothing");
    tt_result_free(&a);
    tt_result_free(&b);
    tt_result_free(&u);
    tt_teardown(&c);
}

static void precision_case(const char *dtype, double bound)
{
    struct tt_ctx c;
    tt_setup_llama(&c);
    double ref[TT_STEPS];
    tt_reference(&c, ref);
    char mp[64], rd[64], plan[128];
    snprintf(mp, sizeof mp, "--fsdp.mixed_precision=%s", dtype);
    snprintf(rd, sizeof rd, "--fsdp.reduce_dtype=%s", dtype);
    snprintf(plan, sizeof plan, "{\"plan\":{\"param_dtype\":\"%s\",\"reduce_dtype\":\"%s\"}}", dtype, dtype);
    const char *extra[] = {mp, rd, NULL};
    for (int world = 1; world <= 2; world++) {
        char tag[32];
        snprintf(tag, sizeof tag, "%s-w%d", dtype, world);
        struct tt_result r;
        tt_run_ok(&c, world, tag, extra, &r);
        cr_assert(tt_summary_matches(&r, 0, plan), "the plan does not name %s:\n%s", dtype, r.err);
        double d = tt_assert_losses(&r, ref, bound, tag);
        cr_assert(d > 1e-7, "%s: losses equal fp32's (%.3g): low precision was not applied", tag, d);
        fprintf(stderr, "llama %s: largest relative difference from fp32 %.3g (bound %.3g)\n", tag, d, bound);
        tt_result_free(&r);
    }
    tt_teardown(&c);
}

Test(llama, bf16_bound, .timeout = 300) { precision_case("bf16", BF16_REL); }
Test(llama, fp16_bound, .timeout = 300) { precision_case("fp16", FP16_REL); }

/* Settings that change how the work is cut or scheduled, not what is computed: each must give the
 * reference's losses, and rank 0's run summary must show the setting took effect. */
Test(llama, settings_that_keep_the_math, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup_llama(&c);
    double ref[TT_STEPS];
    tt_reference(&c, ref);
    static const struct {
        const char *tag;
        int world;
        const char *args[4];
        const char *must;
    } cases[] = {
        {"act_ckpt", 2, {"--model.activation_checkpointing=true"}, "{\"model\":{\"activation_checkpointing\":true}}"},
        {"backward_post", 3, {"--fsdp.backward_prefetch=BACKWARD_POST", "--fsdp.forward_prefetch=true"},
         "{\"plan\":{\"backward_prefetch\":\"BACKWARD_POST\"}}"},
        /* 12000 parameters: the two 9280-parameter layers merge into one unit, the root stays alone */
        {"size_wrap", 3, {"--fsdp.auto_wrap_policy=SIZE_BASED_WRAP", "--fsdp.min_num_params=12000"},
         "{\"plan\":{\"units\":[{\"name\":\"root\"},{\"name\":\"model.layers.0..model.layers.1\"}]}}"},
        {"no_wrap", 2, {"--fsdp.auto_wrap_policy=NO_WRAP"}, "{\"plan\":{\"units\":[{\"name\":\"root..model.layers.1\"}]}}"},
        {"cls_llama", 2, {"--fsdp.transformer_layer_cls_to_wrap=LlamaDecoderLayer", "--fsdp.version=1"},
         "{\"plan\":{\"units\":[{\"name\":\"root\"},{\"name\":\"model.layers.0\"}]}}"},
        {"no_sync", 3, {"--fsdp.sync_module_states=false"}, "{\"plan\":{\"strategy\":\"FULL_SHARD\"}}"},
        {"micro2", 2, {"--train.micro_batch=2"}, "{\"batch\":{\"micro_batches_per_step\":3}}"},
        {"keep_gathered", 2, {"--fsdp.reshard_after_forward=false"}, "{\"plan\":{\"units\":[{\"name\":\"model.layers.1\"}]}}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct tt_result r;
        tt_run_ok(&c, cases[i].world, cases[i].tag, cases[i].args, &r);
        cr_assert(tt_summary_matches(&r, 0, cases[i].must), "%s: the run summary lacks %s:\n%s", cases[i].tag,
                  cases[i].must, r.err);
        tt_assert_losses(&r, ref, FP32_REL, cases[i].tag);
        tt_result_free(&r);
    }
    tt_teardown(&c);
}

/* The wrap class is the family's: GPT-2's name for it is refused with the Llama's classes. */
Test(llama, wrap_class_of_another_family_is_refused, .timeout = 120)
{
    struct tt_ctx c;
    tt_setup_llama(&c);
    const char *extra[] = {"--fsdp.transformer_layer_cls_to_wrap=GPT2Block", NULL};
    struct tt_result r;
    tt_run(&c, 1, "gpt2block", extra, &r);
    cr_assert_neq(r.code, 0, "GPT2Block accepted for a Llama");
    cr_assert(strstr(r.err, "fsdp.transformer_layer_cls_to_wrap = GPT2Block: this llama model has no class "
                            "'GPT2Block'") &&
                  strstr(r.err, "the one that becomes a unit is LlamaDecoderLayer"),
              "%s", r.err);
    tt_result_free(&r);
    /* and a Llama key given to GPT-2 */
    struct tt_ctx g;
    tt_setup(&g);
    const char *kv[] = {"--model.n_kv_head=1", NULL};
    tt_run(&g, 1, "gpt2-kv", kv, &r);
    cr_assert_neq(r.code, 0);
    cr_assert(strstr(r.err, "model.n_kv_head (command line) applies only to model_family = llama, qwen2, qwen3 or mistral"), "%s", r.err);
    tt_result_free(&r);
    tt_teardown(&g);
    tt_teardown(&c);
}
