/* Training parity with Hugging Face transformers: 20 steps of the real fsdp-worker (under the real
 * fsdp-launch at world 1, 2, 3 and 4, FULL_SHARD and HYBRID_SHARD) against transformers' own
 * LlamaForCausalLM trained by torch.optim.AdamW (tests/model/llama_hf_ref.py train: betas 0.9/0.95, eps 1e-8,
 * weight decay 0.1 on 2-D tensors only, clip_grad_norm_ 1.0, constant lr, fp32) from the same init
 * (transformers' own, written by the reference and read by fsdpc through model.init_from) on the same rows
 * (data.order = sequential). Per-step losses within 1e-4 relative, with grouped-query attention (n_kv_head
 * < n_head) and a tied and an untied head. Skipped with a message without the venv of PyPI's torch and
 * transformers (FSDP_TORCH_VENV). */
#include "ttest.h"

#include "tests/util/tu_proc.h"
#include "tests/util/tu_venv.h"

#define HF_REL 1e-4

/* The tiny Llama with grouped-query attention (6 query heads, 2 key/value heads) and the optimizer and
 * schedule of the reference. */
static const char hf_ini[] = "[model]\n"
                             "model_family = llama\n"
                             "n_layer = 2\n"
                             "n_head = 6\n"
                             "n_kv_head = 2\n"
                             "n_embd = 48\n"
                             "intermediate_size = 96\n"
                             "vocab_size = 256\n"
                             "block_size = 16\n"
                             "rope_theta = 10000\n"
                             "rms_norm_eps = 1e-6\n"
                             "[train]\n"
                             "device = cpu\n"
                             "train_batch = 12\n"
                             "micro_batch = 1\n"
                             "max_steps = 20\n"
                             "eval_interval = 0\n"
                             "[optim]\n"
                             "lr = 0.003\n"
                             "beta1 = 0.9\n"
                             "beta2 = 0.95\n"
                             "eps = 1e-8\n"
                             "weight_decay = 0.1\n"
                             "grad_clip = 1.0\n"
                             "warmup_steps = 0\n"
                             "lr_schedule = constant\n"
                             "[data]\n"
                             "order = sequential\n"
                             "[checkpoint]\n"
                             "interval = -1\n"
                             "[log]\n"
                             "interval = 10\n";

/* transformers' losses of the 20 steps, and its init written where flags say (--init_out FILE, or
 * --save_dir DIR as save_pretrained writes it), for the tied or untied model; flags may choose another family
 * (--family qwen2: Qwen2ForCausalLM, whose q/k/v biases the reference gives random values; qwen3, mistral) and
 * shape (--head_dim, --sliding_window). tag names the output. */
static void reference(const struct tt_ctx *c, const char *py, bool tie, const char *flags, const char *tag,
                      double *loss)
{
    char cmd[16384], out[2300];
    snprintf(out, sizeof out, "%s/hf-%s%s.jsonl", c->dir, tag, tie ? "tied" : "untied");
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 '%s' %s/tests/model/llama_hf_ref.py train --n_layer 2 --n_head 6 --n_kv_head 2 "
             "--n_embd 48 --intermediate_size 96 --vocab 256 --block_size 16 --rope_theta 10000 --rms_norm_eps 1e-6 "
             "%s %s --data %s/train.bin --steps %d --global_batch 12 --lr 0.003 --beta1 0.9 --beta2 0.95 "
             "--eps 1e-8 --weight_decay 0.1 --grad_clip 1.0 --seed %d > %s 2> %s.err",
             py, getenv("FSDP_SOURCE_ROOT"), tie ? "--tie" : "", flags, c->data, TT_STEPS,
             tie ? 11 : 12, out, out);
    int rc = tu_sh(cmd);
    if (rc != 0) {
        char err[2400];
        snprintf(err, sizeof err, "%s.err", out);
        char *text = tu_slurp(err);
        cr_assert_fail("llama_hf_ref.py train failed (%d): %s\n%s", rc, cmd, text ? text : "");
    }
    FILE *f = fopen(out, "r");
    cr_assert_not_null(f);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        cr_assert_not_null(o, "not JSON: %s", line);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step"), *l = cJSON_GetObjectItemCaseSensitive(o, "loss");
        cr_assert(cJSON_IsNumber(s) && cJSON_IsNumber(l) && s->valueint == n + 1 && n < TT_STEPS, "%s", line);
        loss[n++] = l->valuedouble;
        cJSON_Delete(o);
    }
    fclose(f);
    cr_assert_eq(n, TT_STEPS, "the reference printed %d steps", n);
}

static void hf_parity(bool tie)
{
    char py[1200];
    if (tu_torch_python(py, sizeof py) != 0)
        cr_skip_test("%s", py);
    struct tt_ctx c;
    tt_setup_ini(&c, hf_ini);
    char init[2300], initarg[2400], flags[2400];
    snprintf(init, sizeof init, "%s/init-%s.safetensors", c.dir, tie ? "tied" : "untied");
    snprintf(flags, sizeof flags, "--init_out %s", init);
    double ref[TT_STEPS];
    reference(&c, py, tie, flags, "", ref);
    snprintf(initarg, sizeof initarg, "--model.init_from=%s", init);
    const char *strategies[] = {"FULL_SHARD", "HYBRID_SHARD"};
    double worst = 0;
    for (int s = 0; s < 2; s++)
        for (int world = 1; world <= 4; world++) {
            char tag[64], strat[64], hyb[64];
            snprintf(tag, sizeof tag, "%s-w%d", strategies[s], world);
            snprintf(strat, sizeof strat, "--fsdp.sharding_strategy=%s", strategies[s]);
            snprintf(hyb, sizeof hyb, "--fsdp.hybrid_shard_size=%d", world % 2 == 0 ? 2 : 1);
            const char *extra[6] = {initarg, strat};
            int n = 2;
            if (tie)
                extra[n++] = "--model.tie_word_embeddings=true";
            if (s == 1)
                extra[n++] = hyb;
            extra[n] = NULL;
            struct tt_result r;
            tt_run_ok(&c, world, tag, extra, &r);
            cr_assert(tt_summary_matches(&r, 0, tie ? "{\"model\":{\"family\":\"llama\",\"tie_word_embeddings\":true}}"
                                                    : "{\"model\":{\"family\":\"llama\",\"tie_word_embeddings\":false}}"),
                      "%s", r.err);
            double d = tt_assert_losses(&r, ref, HF_REL, tag);
            worst = d > worst ? d : worst;
            tt_result_free(&r);
        }
    fprintf(stderr, "llama %s head vs transformers' LlamaForCausalLM: 8 runs x 20 steps, losses %.4f -> %.4f, largest "
                    "relative difference %.3g (bound %.0e)\n",
            tie ? "tied" : "untied", ref[0], ref[TT_STEPS - 1], worst, HF_REL);
    cr_assert(ref[TT_STEPS - 1] < ref[0] - 0.5, "the reference did not learn: %g -> %g", ref[0], ref[TT_STEPS - 1]);
    tt_teardown(&c);
}

/* Qwen2 (Llama's block with q/k/v biases): the same parity at worlds 1 to 4 under FULL_SHARD, from
 * transformers' Qwen2ForCausalLM with random biases, fsdpc reading its init with model_family = qwen2. */
Test(llama_hf, qwen2_qkv_biases, .timeout = 600)
{
    char py[1200];
    if (tu_torch_python(py, sizeof py) != 0)
        cr_skip_test("%s", py);
    struct tt_ctx c;
    tt_setup_ini(&c, hf_ini);
    char init[2300], initarg[2400], flags[2400];
    snprintf(init, sizeof init, "%s/init-qwen2.safetensors", c.dir);
    snprintf(flags, sizeof flags, "--family qwen2 --init_out %s", init);
    double ref[TT_STEPS];
    reference(&c, py, false, flags, "qwen2-", ref);
    snprintf(initarg, sizeof initarg, "--model.init_from=%s", init);
    double worst = 0;
    for (int world = 1; world <= 4; world++) {
        char tag[64];
        snprintf(tag, sizeof tag, "qwen2-w%d", world);
        const char *extra[] = {initarg, "--model.model_family=qwen2", NULL};
        struct tt_result r;
        tt_run_ok(&c, world, tag, extra, &r);
        cr_assert(tt_summary_matches(&r, 0, "{\"model\":{\"family\":\"qwen2\"}}"), "%s", r.err);
        double d = tt_assert_losses(&r, ref, HF_REL, tag);
        worst = d > worst ? d : worst;
        tt_result_free(&r);
    }
    fprintf(stderr, "qwen2 vs transformers' Qwen2ForCausalLM: 4 runs x 20 steps, losses %.4f -> %.4f, largest relative "
                    "difference %.3g (bound %.0e)\n",
            ref[0], ref[TT_STEPS - 1], worst, HF_REL);
    cr_assert(ref[TT_STEPS - 1] < ref[0] - 0.5, "the reference did not learn: %g -> %g", ref[0], ref[TT_STEPS - 1]);
    tt_teardown(&c);
}

Test(llama_hf, untied_head_gqa, .timeout = 600) { hf_parity(false); }
Test(llama_hf, tied_head_gqa, .timeout = 600) { hf_parity(true); }

/* A family from a save_pretrained directory (transformers' own init, random weights): fsdpc reads its
 * config.json and weights with model.init_from = the directory (model_family on the command line, the rest from
 * config.json) and trains 20 steps at worlds 1 to 4 under FULL_SHARD against transformers' AdamW. */
static void dir_parity(const char *family, const char *ref_flags, const char *cls, const char *summary)
{
    char py[1200];
    if (tu_torch_python(py, sizeof py) != 0)
        cr_skip_test("%s", py);
    struct tt_ctx c;
    tt_setup_ini(&c, hf_ini);
    char dir[2300], initarg[2400], flags[4800], famarg[96], tag[64];
    snprintf(dir, sizeof dir, "%s/hf-%s", c.dir, family);
    snprintf(flags, sizeof flags, "--family %s %s --save_dir %s", family, ref_flags, dir);
    snprintf(tag, sizeof tag, "%s-", family);
    double ref[TT_STEPS];
    reference(&c, py, false, flags, tag, ref);
    snprintf(initarg, sizeof initarg, "--model.init_from=%s", dir);
    snprintf(famarg, sizeof famarg, "--model.model_family=%s", family);
    double worst = 0;
    for (int world = 1; world <= 4; world++) {
        snprintf(tag, sizeof tag, "%s-w%d", family, world);
        const char *extra[] = {initarg, famarg, NULL};
        struct tt_result r;
        tt_run_ok(&c, world, tag, extra, &r);
        cr_assert(tt_summary_matches(&r, 0, summary), "%s", r.err);
        double d = tt_assert_losses(&r, ref, HF_REL, tag);
        worst = d > worst ? d : worst;
        tt_result_free(&r);
    }
    fprintf(stderr, "%s vs transformers' %s: 4 runs x 20 steps, losses %.4f -> %.4f, largest relative difference %.3g "
                    "(bound %.0e)\n",
            family, cls, ref[0], ref[TT_STEPS - 1], worst, HF_REL);
    cr_assert(ref[TT_STEPS - 1] < ref[0] - 0.5, "the reference did not learn: %g -> %g", ref[0], ref[TT_STEPS - 1]);
    tt_teardown(&c);
}

/* Mistral: Llama's block with a sliding window of 5 tokens (itself included) over sequences of 16, so every
 * query past the fifth loses keys; fsdpc reads the window from config.json's sliding_window. */
Test(llama_hf, mistral_sliding_window_from_save_pretrained, .timeout = 600)
{
    dir_parity("mistral", "--sliding_window 5", "MistralForCausalLM",
               "{\"model\":{\"family\":\"mistral\",\"sliding_window\":5,\"max_window_layers\":0}}");
}

/* Qwen2 with use_sliding_window: the window (6 tokens) in the layers from max_window_layers (1) on, full
 * attention in layer 0, as transformers' layer_types say. */
Test(llama_hf, qwen2_window_from_layer_1_from_save_pretrained, .timeout = 600)
{
    dir_parity("qwen2", "--sliding_window 6 --max_window_layers 1", "Qwen2ForCausalLM",
               "{\"model\":{\"family\":\"qwen2\",\"sliding_window\":6,\"max_window_layers\":1}}");
}

/* Qwen3: q/k norms, no biases, head_dim 12 where hidden_size / num_attention_heads is 8. */
Test(llama_hf, qwen3_qk_norm_head_dim_from_save_pretrained, .timeout = 600)
{
    dir_parity("qwen3", "--head_dim 12", "Qwen3ForCausalLM", "{\"model\":{\"family\":\"qwen3\",\"head_dim\":12}}");
}
