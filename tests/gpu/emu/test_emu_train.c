/* Training on train.device = cuda under the CUDA host emulator (gpu/libfsdp_gpu_emu.so, FSDP_GPU_MODULE set by
 * tests/meson.build): the real fsdp-launch and fsdp-worker at worlds 1-4, the CUDA kernels, the cuBLAS and NCCL
 * stand-ins between the ranks' processes, against PyTorch (tests/train/torch_gpt_ref.py, the same oracle the CPU
 * backend is held to: test_emu_torch.c) and against the CPU backend.
 *
 * Bounds, relative per step:
 * - fp32 against PyTorch: 1e-5, as the CPU backend (tests/train/test_train_bf16.c);
 * - fp32 against the CPU backend: 1e-5, the parity bound (only summation order differs: the emulator's cuBLAS
 *   sums in k order, the kernels reduce in their own orders);
 * - bf16 against the CPU backend's bf16: 2e-3, twice the distance bf16 may have from fp32 on the CPU (1e-3): both
 *   round the same operands the same way (common/dtype.h), but accumulate in different orders, and fp32 masters
 *   that differ in their last bit may round to neighbouring bf16 values. */
#include <dirent.h>
#include <sys/stat.h>

#include "tests/gpu/emu/emu_train.h"

/* Every strategy the issue names at worlds 1-4 on the emulated device, against the CPU backend at world 1. */
static void parity(bool llama, const char *mp, double rel)
{
    struct tt_ctx c;
    tt_setup_ini(&c, llama ? tt_llama_ini : tt_tiny_ini);
    char mparg[64];
    snprintf(mparg, sizeof mparg, "--fsdp.mixed_precision=%s", mp);
    double ref[TT_STEPS], got[TT_STEPS];
    const char *cpu[] = {"--train.device=cpu", mparg, NULL};
    emu_losses(&c, 1, "cpu", cpu, ref);
    static const char *const strategies[] = {"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD"};
    for (int s = 0; s < 3; s++)
        for (int world = 1; world <= 4; world++) {
            if (s == 2 && world % 2)
                continue; /* HYBRID over pairs of ranks */
            char strat[80], tag[96], what[160];
            snprintf(strat, sizeof strat, "--fsdp.sharding_strategy=%s", strategies[s]);
            snprintf(tag, sizeof tag, "%s-w%d", strategies[s], world);
            const char *x[] = {cuda_dev, mparg, strat, "--fsdp.hybrid_shard_size=2", NULL};
            if (s != 2)
                x[3] = NULL;
            emu_losses(&c, world, tag, x, got);
            snprintf(what, sizeof what, "%s %s %s world %d, emulated cuda vs cpu", llama ? "llama" : "gpt2", mp,
                     strategies[s], world);
            assert_close(got, ref, rel, what);
        }
    tt_teardown(&c);
}

Test(emu_train, gpt2_fp32_every_strategy_worlds_1_to_4, .timeout = 1200) { parity(false, "fp32", EMU_REL); }
Test(emu_train, llama_fp32_every_strategy_worlds_1_to_4, .timeout = 1200) { parity(true, "fp32", EMU_REL); }

/* bf16 at world 2 against the CPU's bf16 at world 2, GPT-2 and Llama. */
Test(emu_train, bf16_against_cpu_bf16, .timeout = 600)
{
    for (int llama = 0; llama <= 1; llama++) {
        struct tt_ctx c;
        tt_setup_ini(&c, llama ? tt_llama_ini : tt_tiny_ini);
        double ref[TT_STEPS], got[TT_STEPS];
        const char *cpu[] = {"--train.device=cpu", "--fsdp.mixed_precision=bf16", NULL};
        const char *gpu[] = {cuda_dev, "--fsdp.mixed_precision=bf16", NULL};
        emu_losses(&c, 2, "cpu", cpu, ref);
        emu_losses(&c, 2, "cuda", gpu, got);
        assert_close(got, ref, EMU_BF16_REL, llama ? "llama bf16 world 2" : "gpt2 bf16 world 2");
        tt_teardown(&c);
    }
}

/* Context parallelism over 2 ranks, and parameters offloaded to pinned host memory, on the emulated device. */
Test(emu_train, context_parallel_and_offload, .timeout = 600)
{
    struct tt_ctx c;
    tt_setup(&c);
    double ref[TT_STEPS], got[TT_STEPS];
    const char *cpu[] = {"--train.device=cpu", fp32, NULL};
    emu_losses(&c, 1, "cpu", cpu, ref);
    const char *cp[] = {cuda_dev, fp32, "--fsdp.context_parallel_size=2", NULL};
    emu_losses(&c, 2, "cp2", cp, got);
    assert_close(got, ref, EMU_REL, "context parallel C = 2, emulated cuda vs cpu");
    const char *off[] = {cuda_dev, fp32, "--fsdp.offload_params=true", NULL};
    emu_losses(&c, 2, "offload", off, got);
    assert_close(got, ref, EMU_REL, "offload_params, emulated cuda vs cpu");
    tt_teardown(&c);
}

/* Every op of every stream starts after a random delay of up to 300 us (FSDP_GPU_EMU_DELAY_US): a collective not
 * ordered after the kernel that fills its buffer, or a host read of pinned memory before its copy finished, then
 * reads stale bytes most of the time. With prefetching on (the most overlap), world 2 still trains as the CPU. */
Test(emu_train, stream_order_holds_under_random_delays, .timeout = 600)
{
    struct tt_ctx c;
    tt_setup(&c);
    double ref[TT_STEPS], got[TT_STEPS];
    const char *cpu[] = {"--train.device=cpu", fp32, NULL};
    emu_losses(&c, 1, "cpu", cpu, ref);
    const char *x[] = {cuda_dev, fp32, "--fsdp.forward_prefetch=true", "--fsdp.backward_prefetch=BACKWARD_PRE", NULL};
    const char *env[] = {"FSDP_GPU_EMU_DELAY_US=300", "FSDP_GPU_EMU_SEED=7", NULL};
    struct tt_result r;
    tt_run_ini_env(&c, c.ini, 2, "delayed", x, env, &r);
    cr_assert_eq(r.code, 0, "delayed run exited with %d:\n%s", r.code, r.err);
    tt_losses(&r, got);
    tt_result_free(&r);
    assert_close(got, ref, EMU_REL, "world 2 with random stream delays, emulated cuda vs cpu");
    tt_teardown(&c);
}

/* A checkpoint written on the emulated device resumes on the CPU, and one written on the CPU resumes there. */
Test(emu_train, checkpoints_cross_devices, .timeout = 600)
{
    struct tt_ctx c;
    tt_setup(&c);
    double ref[TT_STEPS];
    const char *cpu[] = {"--train.device=cpu", fp32, "--checkpoint.interval=10", "--checkpoint.keep_last=0", NULL};
    const char *gpu[] = {cuda_dev, fp32, "--checkpoint.interval=10", "--checkpoint.keep_last=0", NULL};
    emu_losses(&c, 2, "cpu", cpu, ref);
    struct tt_result r;
    tt_run_ok(&c, 2, "cuda", gpu, &r);
    tt_result_free(&r);
    for (int dir = 0; dir < 2; dir++) {
        char from[FSDP_PATH_MAX], tag[32];
        snprintf(from, sizeof from, "--checkpoint.resume_from=%s/%s/ckpt/fsdp_sharded_cpt10", c.dir,
                 dir ? "cpu" : "cuda");
        snprintf(tag, sizeof tag, "resume-%d", dir);
        const char *x[] = {dir ? cuda_dev : "--train.device=cpu", fp32, from, NULL};
        tt_run_ok(&c, 2, tag, x, &r);
        double got[TT_STEPS];
        int n = tt_metric(&r, "loss", got, TT_STEPS);
        cr_assert_eq(n, 10, "resumed run %s logged %d steps, want 10", tag, n);
        for (int i = 0; i < 10; i++) {
            double rel = fabs(got[i] - ref[10 + i]) / fabs(ref[10 + i]);
            cr_assert_leq(rel, EMU_REL, "%s step %d: %.9g vs uninterrupted cpu %.9g",
                          dir ? "cpu -> cuda" : "cuda -> cpu", 10 + i, got[i], ref[10 + i]);
        }
        tt_result_free(&r);
    }
    tt_teardown(&c);
}

/* Hugging Face out and in, and evaluation, on the emulated device: a FULL_STATE_DICT checkpoint (a save_pretrained
 * directory, gathered from device memory) written at world 2 on each device, with validation every 3 steps;
 * the validation losses agree, and each device starts a run from the other's directory (model.init_from, read
 * into device memory) with the same losses. */
Test(emu_train, hf_directory_out_and_in_with_eval, .timeout = 600)
{
    struct tt_ctx c;
    tt_setup(&c);
    static const char *const dev[2] = {"--train.device=cpu", "--train.device=cuda"};
    double val[2][8];
    int nval[2];
    for (int d = 0; d < 2; d++) {
        const char *x[] = {dev[d], fp32, "--checkpoint.state_dict_type=FULL_STATE_DICT", "--checkpoint.interval=0",
                           "--train.max_steps=6", "--train.eval_interval=3", "--train.eval_steps=2", NULL};
        struct tt_result r;
        tt_run_ok(&c, 2, d ? "out-cuda" : "out-cpu", x, &r);
        nval[d] = 0;
        double v[8];
        int n = tt_metric(&r, "val_loss", v, 8);
        for (int i = 0; i < n; i++)
            if (!isnan(v[i]))
                val[d][nval[d]++] = v[i];
        tt_result_free(&r);
    }
    cr_assert(nval[0] >= 2 && nval[0] == nval[1], "validation rows: %d on cpu, %d on cuda", nval[0], nval[1]);
    for (int i = 0; i < nval[0]; i++)
        cr_assert_leq(fabs(val[1][i] - val[0][i]), EMU_REL * fabs(val[0][i]), "val_loss %d: %.9g on cuda, %.9g on cpu",
                      i, val[1][i], val[0][i]);
    double loss[2][TT_STEPS];
    for (int d = 0; d < 2; d++) {
        char init[FSDP_PATH_MAX];
        snprintf(init, sizeof init, "--model.init_from=%s/%s/ckpt/fsdp_cpt6", c.dir, d ? "out-cpu" : "out-cuda");
        const char *x[] = {dev[d], fp32, init, NULL};
        emu_losses(&c, 2, d ? "in-cuda" : "in-cpu", x, loss[d]);
    }
    assert_close(loss[1], loss[0], EMU_REL, "init_from the other device's Hugging Face directory, cuda vs cpu");
    tt_teardown(&c);
}

/* FSDP_GPU_EMU_TRACE_DIR: each rank writes its stream trace at exit, Chrome trace events with the kernels on one
 * stream and the collectives on the communicator's, which overlap in time (what prefetching is for). */
Test(emu_train, stream_trace_shows_collectives_beside_kernels, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    char dir[FSDP_PATH_MAX], envv[FSDP_PATH_MAX + 32]; /* + 32: "KEY=" and a path */
    snprintf(dir, sizeof dir, "%s/trace", c.dir);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(envv, sizeof envv, "FSDP_GPU_EMU_TRACE_DIR=%s", dir);
    const char *x[] = {cuda_dev, fp32, "--train.max_steps=4", "--fsdp.forward_prefetch=true", NULL};
    const char *env[] = {envv, NULL};
    struct tt_result r;
    tt_run_ini_env(&c, c.ini, 2, "traced", x, env, &r);
    cr_assert_eq(r.code, 0, "traced run exited with %d:\n%s", r.code, r.err);
    tt_result_free(&r);
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, "trace-", 6) != 0)
            continue;
        files++;
        char path[FSDP_PATH_MAX + 256]; /* a directory and an entry's name */
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *text = tu_slurp(path);
        cJSON *o = cJSON_Parse(text);
        cr_assert_not_null(o, "%s is not JSON", path);
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "traceEvents");
        double kern_end = 0, coll_overlap = 0;
        int kernels = 0, collectives = 0, kstream = -1, cstream = -1;
        const cJSON *it;
        /* kernels first (ops are written in completion order per stream, not globally sorted) */
        cJSON_ArrayForEach(it, ev) {
            const char *name = cJSON_GetObjectItemCaseSensitive(it, "name")->valuestring;
            int tid = cJSON_GetObjectItemCaseSensitive(it, "tid")->valueint;
            if (strstr(name, "_kernel")) {
                kernels++;
                kstream = tid;
                double end = cJSON_GetObjectItemCaseSensitive(it, "ts")->valuedouble +
                             cJSON_GetObjectItemCaseSensitive(it, "dur")->valuedouble;
                kern_end = end > kern_end ? end : kern_end;
            } else if (!strcmp(name, "all_gather") || !strcmp(name, "reduce_scatter")) {
                collectives++;
                cstream = tid;
            }
        }
        cJSON_ArrayForEach(it, ev) {
            const char *name = cJSON_GetObjectItemCaseSensitive(it, "name")->valuestring;
            if (strcmp(name, "all_gather") != 0)
                continue;
            double a = cJSON_GetObjectItemCaseSensitive(it, "ts")->valuedouble;
            double b = a + cJSON_GetObjectItemCaseSensitive(it, "dur")->valuedouble;
            const cJSON *k;
            cJSON_ArrayForEach(k, ev) {
                if (!strstr(cJSON_GetObjectItemCaseSensitive(k, "name")->valuestring, "_kernel"))
                    continue;
                double x0 = cJSON_GetObjectItemCaseSensitive(k, "ts")->valuedouble;
                double x1 = x0 + cJSON_GetObjectItemCaseSensitive(k, "dur")->valuedouble;
                double lo = a > x0 ? a : x0, hi = b < x1 ? b : x1;
                coll_overlap += hi > lo ? hi - lo : 0;
            }
        }
        cr_assert(kernels > 100 && collectives >= 8, "%s: %d kernels, %d all-gathers/reduce-scatters", path, kernels,
                  collectives);
        cr_assert_neq(kstream, cstream, "%s: kernels and collectives on one stream", path);
        /* The kernels that read a collective's result wait for it on the device (comm_work_order), not behind a
         * host wait: the kernels' stream has an event wait per gather and reduce-scatter a step reads (before,
         * it had none). The rest are the final checkpoint's all-gathers, which the host reads. */
        int kwaits = 0;
        cJSON_ArrayForEach(it, ev) {
            if (cJSON_GetObjectItemCaseSensitive(it, "tid")->valueint == kstream &&
                !strcmp(cJSON_GetObjectItemCaseSensitive(it, "name")->valuestring, "cudaStreamWaitEvent"))
                kwaits++;
        }
        cr_assert_geq(4 * kwaits, 3 * collectives, "%s: the kernels' stream waited for %d events, for %d "
                      "collectives: the host, not the device, waits for collectives", path, kwaits, collectives);
        cr_assert_gt(coll_overlap, 0, "%s: no all-gather ran while a kernel did", path);
        fprintf(stderr, "%s: %d kernel ops, %d collectives, %d device waits for them, %.0f us of all-gather beside "
                "kernels\n", e->d_name, kernels, collectives, kwaits, coll_overlap);
        cJSON_Delete(o);
        free(text);
    }
    closedir(d);
    cr_assert_eq(files, 2, "%d trace files in %s, want one per rank", files, dir);
    tt_teardown(&c);
}

/* The main thread's waits for the device (the trace's "host_wait" events) in a run of `steps` steps. */
static int main_thread_waits(const struct tt_ctx *c, const char *tag, const char *micro, int steps)
{
    char dir[FSDP_PATH_MAX], envv[FSDP_PATH_MAX + 32], ms[64]; /* + 32: "KEY=" and a path */
    snprintf(dir, sizeof dir, "%s/trace-%s", c->dir, tag);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(envv, sizeof envv, "FSDP_GPU_EMU_TRACE_DIR=%s", dir);
    snprintf(ms, sizeof ms, "--train.max_steps=%d", steps);
    const char *x[] = {cuda_dev, fp32, ms, micro, NULL};
    const char *env[] = {envv, NULL};
    struct tt_result r;
    tt_run_ini_env(c, c->ini, 1, tag, x, env, &r);
    cr_assert_eq(r.code, 0, "run %s exited with %d:\n%s", tag, r.code, r.err);
    tt_result_free(&r);
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int waits = -1;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, "trace-", 6) != 0)
            continue;
        cr_assert_eq(waits, -1, "more than one trace file in %s", dir);
        char path[FSDP_PATH_MAX + 256]; /* a directory and an entry's name */
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *text = tu_slurp(path);
        cJSON *o = cJSON_Parse(text);
        cr_assert_not_null(o, "%s is not JSON", path);
        waits = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(o, "traceEvents")) {
            const cJSON *cat = cJSON_GetObjectItemCaseSensitive(it, "cat");
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(it, "args");
            if (cJSON_IsString(cat) && !strcmp(cat->valuestring, "host_wait") &&
                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(args, "main_thread")))
                waits++;
        }
        cJSON_Delete(o);
        free(text);
    }
    closedir(d);
    cr_assert_geq(waits, 0, "no trace file in %s", dir);
    return waits;
}

/* The loss stays on the device through a step's micro-batches (kernels.h, crossentropy's loss_acc) and a
 * micro-batch's tokens and targets share a staging chunk (kernels/cuda/memory.cu): the host waits for the device
 * as often in a step of 4 micro-batches as in a step of 1, and at world 1 once a step: the gradient norm, the
 * clip and the non-finite check stay on the device too (kernels.h, sqnorm_sum, grad_clip, adamw's
 * grad_scale_dev), and the loss and the step's outcome come back in one read after the whole step is queued
 * (fsdp_finish_step). Counting the difference between runs of 2 and 4 steps
 * leaves out the start and the end (initialisation, the final checkpoint). */
Test(emu_train, host_waits_per_step_do_not_grow_with_micro_batches, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    const char *one = "--train.micro_batch=12", *four = "--train.micro_batch=3"; /* train_batch 12, world 1 */
    int w1 = main_thread_waits(&c, "accum1-s2", one, 2), w1b = main_thread_waits(&c, "accum1-s4", one, 4);
    int w4 = main_thread_waits(&c, "accum4-s2", four, 2), w4b = main_thread_waits(&c, "accum4-s4", four, 4);
    double per1 = (w1b - w1) / 2.0, per4 = (w4b - w4) / 2.0;
    fprintf(stderr, "host waits per step: %.1f with 1 micro-batch, %.1f with 4 (runs of 2 and 4 steps: %d %d, %d %d)\n",
            per1, per4, w1, w1b, w4, w4b);
    cr_assert(per4 <= per1, "a step of 4 micro-batches waits for the device %.1f times, a step of 1 %.1f times: "
              "something in the micro-batch loop reads the device", per4, per1);
    cr_assert(per1 <= 1, "%.1f host waits per step at world 1, want 1 (the step's outcome and loss)", per1);
    tt_teardown(&c);
}

/* The Llama-style features past Llama's block on the emulated device against the CPU backend, world 1 and
 * world 2 (FULL_SHARD): Qwen3's per-head q/k RMSNorm with head_dim 12 on a 32-wide stream of 4 heads. */
Test(emu_train, qwen3_qk_norm_head_dim, .timeout = 600)
{
    struct tt_ctx c;
    tt_setup_ini(&c, tt_llama_ini);
    double ref[TT_STEPS], got[TT_STEPS];
    const char *cpu[] = {"--train.device=cpu", fp32, "--model.model_family=qwen3", "--model.head_dim=12", NULL};
    emu_losses(&c, 1, "qwen3-cpu", cpu, ref);
    for (int world = 1; world <= 2; world++) {
        char tag[32], what[96];
        snprintf(tag, sizeof tag, "qwen3-w%d", world);
        snprintf(what, sizeof what, "qwen3 head_dim 12 world %d, emulated cuda vs cpu", world);
        const char *x[] = {cuda_dev, fp32, "--model.model_family=qwen3", "--model.head_dim=12", NULL};
        emu_losses(&c, world, tag, x, got);
        assert_close(got, ref, EMU_REL, what);
    }
    tt_teardown(&c);
}

/* Mistral's sliding window on the emulated device against the CPU backend, world 1 and world 2 (FULL_SHARD):
 * a window of 5 tokens over the tiny Llama's sequences, the flash kernels' window tiles and masks in training. */
Test(emu_train, mistral_sliding_window, .timeout = 600)
{
    struct tt_ctx c;
    tt_setup_ini(&c, tt_llama_ini);
    double ref[TT_STEPS], got[TT_STEPS];
    const char *cpu[] = {"--train.device=cpu", fp32, "--model.model_family=mistral", "--model.sliding_window=5", NULL};
    emu_losses(&c, 1, "mistral-cpu", cpu, ref);
    for (int world = 1; world <= 2; world++) {
        char tag[32], what[96];
        snprintf(tag, sizeof tag, "mistral-w%d", world);
        snprintf(what, sizeof what, "mistral sliding_window 5 world %d, emulated cuda vs cpu", world);
        const char *x[] = {cuda_dev, fp32, "--model.model_family=mistral", "--model.sliding_window=5", NULL};
        emu_losses(&c, world, tag, x, got);
        assert_close(got, ref, EMU_REL, what);
    }
    tt_teardown(&c);
}
