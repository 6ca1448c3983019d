/* Bad configurations are refused before any work (no plan printed, no metrics written), with a message
 * naming the keys, by every rank on its own: the ranks are started here by hand around a store of this
 * test, so none is stopped by a launcher before it speaks. Then once under fsdp-launch, whose job must
 * fail with the same message as its root cause. */
#include "tests/util/tu_store.h"
#include "ttest.h"

/* Starts `world` fsdp-worker ranks with the torchrun environment fsdp-launch would give them and checks
 * that each exits `code` (1: the config does not fit the world; 2: refused once training set out, such as
 * a missing file or device) having said every fragment of want[] itself, and that none started working. */
static void every_rank_refuses(const struct tt_ctx *c, int world, const char *tag, const char *const *extra,
                               const char *const *want, int code_want)
{
    pid_t srv;
    int port = tu_store_spawn("127.0.0.1", "cfgtest", NULL, &srv);
    cr_assert(port > 0, "the store server process did not start");
    char rundir[2048], logarg[2300], ckarg[2300];
    snprintf(rundir, sizeof rundir, "%s/%s", c->dir, tag);
    cr_assert_eq(mkdir(rundir, 0755), 0);
    snprintf(logarg, sizeof logarg, "--log.dir=%s/log", rundir);
    snprintf(ckarg, sizeof ckarg, "--checkpoint.dir=%s/ckpt", rundir);
    const char *argv[32];
    int n = 0;
    argv[n++] = lu_build_path("worker/fsdp-worker");
    argv[n++] = c->ini;
    argv[n++] = logarg;
    argv[n++] = ckarg;
    for (int i = 0; extra[i]; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pids[8];
    char env[8][64];
    for (int r = 0; r < world; r++) {
        snprintf(env[0], 64, "RANK=%d", r);
        snprintf(env[1], 64, "LOCAL_RANK=%d", r);
        snprintf(env[2], 64, "WORLD_SIZE=%d", world);
        snprintf(env[3], 64, "LOCAL_WORLD_SIZE=%d", world);
        snprintf(env[4], 64, "MASTER_PORT=%d", port);
        const char *envp[] = {env[0], env[1], env[2], env[3], env[4], "MASTER_ADDR=127.0.0.1",
                              "TORCHELASTIC_RUN_ID=cfgtest", "FSDP_STORE_PREFIX=worker/g0/", "OMP_NUM_THREADS=1",
                              "FSDP_RDZV_TOKEN=", "FSDP_LOG_LEVEL=", NULL};
        char rtag[32];
        snprintf(rtag, sizeof rtag, "rank%d", r);
        pids[r] = lu_spawn(argv, rundir, rtag, envp);
    }
    for (int r = 0; r < world; r++) {
        int code = lu_exit_code(lu_wait(pids[r], TT_RUN_TIMEOUT_S));
        char rtag[32];
        snprintf(rtag, sizeof rtag, "rank%d", r);
        char *err = lu_slurp_tag(rundir, rtag, "err");
        cr_assert_eq(code, code_want, "%s: rank %d exited with %d, expected %d (refused config):\n%s", tag, r, code,
                     code_want, err);
        char *line = tt_rank_line(err, r, " E: ");
        cr_assert_not_null(line, "%s: rank %d printed no error of its own:\n%s", tag, r, err);
        for (int i = 0; want[i]; i++)
            cr_assert(strstr(line, want[i]), "%s: rank %d's error lacks \"%s\": %s", tag, r, want[i], line);
        cr_assert_null(strstr(err, "fsdp plan"), "%s: rank %d planned before refusing:\n%s", tag, r, err);
        free(line);
        free(err);
    }
    tu_store_reap(srv);
    char metrics[2400];
    snprintf(metrics, sizeof metrics, "%s/log/metrics.jsonl", rundir);
    cr_assert_neq(access(metrics, F_OK), 0, "%s: metrics were written by a refused run", tag);
}

/* The same config under fsdp-launch: the job fails and the launcher's root cause carries the message. */
static void launcher_refuses(const struct tt_ctx *c, int world, const char *tag, const char *const *extra,
                             const char *const *want, int code_want)
{
    char ltag[96];
    snprintf(ltag, sizeof ltag, "%s-launch", tag);
    struct tt_result r;
    tt_run(c, world, ltag, extra, &r);
    cr_assert_neq(r.code, 0, "%s: fsdp-launch succeeded with a bad config", tag);
    cr_assert_neq(r.code, -1000, "%s: fsdp-launch timed out", tag);
    char *cause = strstr(r.err, "Root cause");
    cr_assert_not_null(cause, "%s: no root cause from the launcher:\n%s", tag, r.err);
    for (int i = 0; want[i]; i++)
        cr_assert(strstr(cause, want[i]), "%s: the root cause lacks \"%s\":\n%s", tag, want[i], r.err);
    char exit_text[32];
    snprintf(exit_text, sizeof exit_text, "exit code %d", code_want);
    cr_assert(strstr(cause, exit_text), "%s: the root cause is not \"%s\":\n%s", tag, exit_text, r.err);
    tt_result_free(&r);
}

static void refused_with(int world, const char *tag, const char *const *extra, const char *const *want, int code)
{
    struct tt_ctx c;
    tt_setup(&c);
    every_rank_refuses(&c, world, tag, extra, want, code);
    launcher_refuses(&c, world, tag, extra, want, code);
    tt_teardown(&c);
}

/* A config that does not fit the world (fsdp_check_config): a config error, exit 1. */
static void refused(int world, const char *tag, const char *const *extra, const char *const *want)
{
    refused_with(world, tag, extra, want, 1);
}

/* Refused once training set out (data files, devices, the model's classes): exit 2. */
static void refused_in_training(int world, const char *tag, const char *const *extra, const char *const *want)
{
    refused_with(world, tag, extra, want, 2);
}

Test(config, train_batch_not_divisible_by_world, .timeout = 240)
{
    const char *extra[] = {"--train.train_batch=10", NULL};
    const char *want[] = {"train.train_batch = 10", "3 data-parallel ranks", "9 or 12", NULL};
    refused(3, "batch", extra, want);
}

Test(config, micro_batch_not_dividing_rows_per_rank, .timeout = 240)
{
    const char *extra[] = {"--train.micro_batch=4", NULL};
    const char *want[] = {"train.micro_batch = 4", "6 sequences per rank", "train.train_batch", "1, 2, 3, 6", NULL};
    refused(2, "micro", extra, want);
}

Test(config, hybrid_shard_size_not_dividing_world, .timeout = 240)
{
    const char *extra[] = {"--fsdp.sharding_strategy=HYBRID_SHARD", "--fsdp.hybrid_shard_size=2", NULL};
    const char *want[] = {"fsdp.sharding_strategy = HYBRID_SHARD", "fsdp.hybrid_shard_size", "world size 3",
                          "use one of 1, 3", NULL};
    refused(3, "hybrid", extra, want);
}

Test(config, offload_params_with_no_shard, .timeout = 240)
{
    const char *extra[] = {"--fsdp.offload_params=true", "--fsdp.sharding_strategy=NO_SHARD", NULL};
    const char *want[] = {"fsdp.offload_params", "fsdp.sharding_strategy = NO_SHARD", NULL};
    refused(2, "offload", extra, want);
}

/* Context parallelism's world-dependent rules, refused by every rank before any work. */
Test(config, context_parallel_size_not_dividing_world, .timeout = 240)
{
    const char *extra[] = {"--context_parallel_size=2", NULL};
    const char *want[] = {"fsdp.context_parallel_size = 2 does not divide the world size 3", "use one of 1",
                          NULL};
    refused(3, "cpworld", extra, want);
}

Test(config, context_parallel_train_batch_by_data_parallel_degree, .timeout = 240)
{
    const char *extra[] = {"--context_parallel_size=2", "--train.train_batch=3", "--train.micro_batch=1", NULL};
    const char *want[] = {"train.train_batch = 3", "2 data-parallel ranks", "context_parallel_size", NULL};
    refused(4, "cpbatch", extra, want);
}

Test(config, context_parallel_hybrid_group_holds_whole_context_groups, .timeout = 240)
{
    const char *extra[] = {"--context_parallel_size=2", "--fsdp.sharding_strategy=HYBRID_SHARD",
                           "--fsdp.hybrid_shard_size=1", NULL};
    const char *want[] = {"fsdp.sharding_strategy = HYBRID_SHARD", "whole context groups",
                          "multiple of 2", NULL};
    refused(2, "cphybrid", extra, want);
}

/* A valid context-parallel config trains on the mesh the plan describes (the losses: test_train_cp). */
Test(config, context_parallel_valid_config_names_the_mesh, .timeout = 240)
{
    struct tt_ctx c;
    tt_setup(&c);
    struct tt_result r;
    const char *extra[] = {"--context_parallel_size=2", "--train.train_batch=4", "--train.micro_batch=1",
                           "--train.max_steps=2", NULL};
    tt_run_ok(&c, 4, "cpmesh", extra, &r);
    for (int rank = 0; rank < 4; rank++)
        cr_assert(tt_summary_matches(&r, rank, "{\"plan\":{\"data_parallel_size\":2,\"context_parallel_size\":2},"
                                                "\"batch\":{\"rows_per_rank\":2}}"),
                  "rank %d: not the 2 x 2 mesh", rank);
    char *line = tt_rank_line(r.err, 0, "mesh:");
    cr_assert(line && strstr(line, "world 4 = 2 data-parallel x 2 context") && strstr(line, "rows shared by [0 1] [2 3]") &&
                  strstr(line, "different rows: [0 2] [1 3]"),
              "no mesh line: %s", line ? line : r.err);
    free(line);
    tt_result_free(&r);
    tt_teardown(&c);
}

Test(config, wrap_class_mlp, .timeout = 240)
{
    const char *extra[] = {"--fsdp.transformer_layer_cls_to_wrap=MLP", NULL};
    const char *want[] = {"fsdp.transformer_layer_cls_to_wrap = MLP", "DecoderBlock", NULL};
    refused_in_training(2, "wrap", extra, want);
}

Test(config, wrap_class_list_with_a_class_the_model_lacks, .timeout = 240)
{
    const char *extra[] = {"--fsdp.transformer_layer_cls_to_wrap=GPT2Block,LlamaDecoderLayer", NULL};
    const char *want[] = {"fsdp.transformer_layer_cls_to_wrap = GPT2Block,LlamaDecoderLayer",
                          "has no class 'LlamaDecoderLayer'", "DecoderBlock (Hugging Face: GPT2Block)", NULL};
    refused_in_training(2, "wrapl", extra, want);
}

/* Hugging Face's name and a comma list (accelerate's spelling) name the same units. */
Test(config, wrap_class_hf_name_and_list_train, .timeout = 240)
{
    struct tt_ctx c;
    tt_setup(&c);
    struct tt_result r;
    const char *extra[] = {"--fsdp.transformer_layer_cls_to_wrap=GPT2Block, DecoderBlock", NULL};
    tt_run_ok(&c, 2, "hfwrap", extra, &r);
    cr_assert(tt_summary_matches(&r, 0, "{\"plan\":{\"units\":[{\"name\":\"h.1\"}]}}"), "no unit per block");
}

Test(config, missing_train_file, .timeout = 240)
{
    const char *extra[] = {"--data.train_file=", NULL};
    const char *want[] = {"data.train_file", "fsdp-prepare-data", NULL};
    refused_in_training(2, "nodata", extra, want);
}

/* A FIFO as data.train_file: every rank refuses it by its type, naming the file, instead of blocking in
 * open() forever (the wait in every_rank_refuses is bounded, so a hang fails the test). */
Test(config, fifo_as_train_file, .timeout = 240)
{
    struct tt_ctx c;
    tt_setup(&c);
    char fifo[1100], arg[1200];
    snprintf(fifo, sizeof fifo, "%s/train.fifo", c.dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0, "mkfifo %s: %s", fifo, strerror(errno));
    snprintf(arg, sizeof arg, "--data.train_file=%s", fifo);
    const char *extra[] = {arg, NULL};
    const char *want[] = {fifo, "is not a regular file (it is a FIFO)", NULL};
    every_rank_refuses(&c, 2, "fifo", extra, want, 2);
    launcher_refuses(&c, 2, "fifo", extra, want, 2);
    tt_teardown(&c);
}

Test(config, cuda_without_gpu, .timeout = 240)
{
    if (access("/dev/nvidiactl", F_OK) == 0)
        cr_skip_test("an NVIDIA device is present: device = cuda is valid here");
    /* The host as it is: no faked device count (the suite's FSDP_TEST_GPU_COUNT=1 would make it a GPU host). */
    cr_assert_eq(unsetenv("FSDP_TEST_GPU_COUNT"), 0);
    const char *extra[] = {"--train.device=cuda", NULL};
    const char *want[] = {"train.device = cuda", "device=cpu", NULL};
    refused_in_training(2, "cuda", extra, want);
}

/* Two ranks on a node with one GPU (FSDP_TEST_GPU_COUNT=1, as the suite sets it): every rank refuses at
 * config time, naming both numbers and the flag to change, instead of failing inside ncclCommInitRank.
 * train.device = auto means cuda on a GPU host, so it is refused the same way. */
Test(config, more_local_ranks_than_gpus, .timeout = 240)
{
    cr_assert_eq(setenv("FSDP_TEST_GPU_COUNT", "1", 1), 0);
    const char *cuda[] = {"--train.device=cuda", NULL};
    const char *want_cuda[] = {"train.device = cuda", "2 ranks on this node", "1 CUDA device is visible",
                               "--nproc_per_node 1", NULL};
    refused_in_training(2, "ranks", cuda, want_cuda);
    const char *autod[] = {"--train.device=auto", NULL};
    const char *want_auto[] = {"train.device = auto", "2 ranks on this node", "1 CUDA device is visible", NULL};
    refused_in_training(2, "ranks-auto", autod, want_auto);
}

/* A host whose NVIDIA driver cannot run this build (error 35 from an old driver; here: a faked driver on a
 * machine without one, or a build without CUDA): train.device = auto trains on the CPU and says why, once
 * per node (local rank 0), and the run summary of every rank carries the reason. */
Test(config, auto_fallback_to_cpu_says_why, .timeout = 240)
{
    if (access("/dev/nvidiactl", F_OK) == 0)
        cr_skip_test("an NVIDIA device is present: auto may really pick it");
    cr_assert_eq(unsetenv("FSDP_TEST_GPU_COUNT"), 0); /* the driver's own answer: no usable device */
    struct tt_ctx c;
    tt_setup(&c);
    const char *extra[] = {"--train.device=auto", "--train.max_steps=2", NULL};
    struct tt_result r;
    tt_run_ok(&c, 2, "fallback", extra, &r);
    static const char want[] = "train.device = auto: training on the CPU: ";
    for (int rank = 0; rank < 2; rank++) {
        cJSON *sum = tt_summary(&r, rank);
        const char *dev = tu_json_str(sum, "device"), *why = tu_json_str(sum, "device_reason");
        cr_assert(dev && strcmp(dev, "cpu") == 0, "rank %d trained on %s", rank, dev ? dev : "(none)");
        cr_assert(why && strncmp(why, want, strlen(want)) == 0 && strlen(why) > strlen(want),
                  "rank %d's run summary does not say why it trained on the CPU: %s", rank, why ? why : "(none)");
        cJSON_Delete(sum);
    }
    cr_assert_eq(tt_count_lines(r.err, "training on the CPU", NULL), 1,
                 "expected one line saying why the run is on the CPU:\n%s", r.err);
    tt_result_free(&r);
    tt_teardown(&c);
}

/* The suite's test configs mean the CPU: run as on a host with one GPU (FSDP_TEST_GPU_HOST=1 and
 * FSDP_TEST_GPU_COUNT=1, as tests/meson.build sets them), the shared config trains on the CPU at two ranks
 * and at one, and in fp32 (a config left to auto would get cuda and bf16 there). */
Test(config, test_configs_mean_the_cpu, .timeout = 240)
{
    cr_assert_eq(setenv("FSDP_TEST_GPU_HOST", "1", 1), 0);
    cr_assert_eq(setenv("FSDP_TEST_GPU_COUNT", "1", 1), 0);
    struct tt_ctx c;
    tt_setup(&c);
    const char *extra[] = {"--train.max_steps=2", NULL};
    for (int world = 1; world <= 2; world++) {
        char tag[16];
        snprintf(tag, sizeof tag, "w%d", world);
        struct tt_result r;
        tt_run_ok(&c, world, tag, extra, &r);
        for (int rank = 0; rank < world; rank++)
            cr_assert(tt_summary_matches(&r, rank, "{\"device\":\"cpu\",\"device_reason\":\"train.device = cpu\"}"),
                      "world %d rank %d did not train on the CPU", world, rank);
        tt_result_free(&r);
    }
    /* The same config with the device left to auto is refused on such a host: what the line above avoids. */
    const char *autod[] = {"--train.device=auto", "--train.max_steps=2", NULL};
    struct tt_result r;
    tt_run(&c, 2, "auto", autod, &r);
    cr_assert_neq(r.code, 0, "device = auto trained on a (faked) one-GPU host with two ranks");
    tt_result_free(&r);
    tt_teardown(&c);
}
