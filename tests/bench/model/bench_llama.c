/* The Llama-style families' benchmark: the single-process training step (bench_runner.h) of each family
 * row (Llama; Qwen2 with q/k/v biases; Qwen3 with q/k norms and head_dim its own; Llama with Llama 3.1's
 * rope scaling) in fp32 and in bf16, beside PyTorch 2.x running transformers' own model of the family on the
 * same shapes and step (llama_torch_step.py in the venv FSDP_TORCH_VENV names: fp32, and bf16 autocast for
 * our bf16), in the same run, so the ratio holds on a noisy shared machine.
 *
 * bf16 is mixed_precision = bf16 as a world-1 rank runs it: fp32 master weights, gradients and AdamW; a
 * persistent bf16 copy of the parameters, cast to the fp32 view the model reads and bound to it (the
 * engine's gather: the matmuls read the bf16 copy as is), refreshed after each optimizer step; bf16
 * matmuls (set_matmul_dtype) with fp32 accumulation. PyTorch's autocast likewise keeps fp32 parameters and
 * runs the matmuls in bf16; both compute the loss in fp32.
 *
 * OpenMP and OpenBLAS read OMP_NUM_THREADS once at start, so each (row, threads, precision) point runs in a
 * child: this binary re-executed as `bench_llama --child ROW [--bf16] [--profile]` with the variable set.
 *
 * Usage: bench_llama [--rounds N] [--threads LIST] [ROW ...]   (default: 1 round, threads 1,2, the S rows)
 *        bench_llama --child ROW [--bf16] [--profile] [--device cpu|cuda]   one point in this process
 *        (--profile: the time per op, CPU time on the CPU; --device cuda: the step on the CUDA table, each
 *        profiled op's device time, as bench_model's)
 * Rows: S, M, L (Llama), qwen2-S, qwen3-S, llama3-S.
 * With N rounds each point runs ours and PyTorch alternately N times and keeps each side's best round.
 * Output: `bench=llama_step config=ROW family=F threads=1 precision=fp32|bf16 tokens_per_s=...
 *          cpu_tokens_per_s=... gflops=... torch_precision=fp32|bf16_autocast torch_tokens_per_s=...
 *          torch_cpu_tokens_per_s=... ratio=... cpu_ratio=... rounds=N` per point,
 *          `bench=llama_goals config=ROW family=F threads=T fp32_vs_torch=... goal_fp32=met|missed
 *          bf16_vs_torch_bf16=... goal_bf16=met|missed bf16_vs_fp32=... torch_bf16_vs_fp32=...` per thread count
 *          (goal: 1.3x PyTorch at equal precision, on tokens per CPU-second where measured) and
 *          `bench=llama_arena ...` per row. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fs.h"
#include "tests/bench/model/bench_runner.h"
#include "tests/util/tu_venv.h"

/* S: bench_model's S shape as a Llama (head size 64, 2 query heads per key/value head, SwiGLU width
 * 8 C / 3 rounded to 256, untied head). M: a ~110M-parameter Llama (12 layers of 768, 32000 tokens). L:
 * bench_train's 58M-parameter Llama with one rank's batch (8 layers of 512, 8/4 heads, width 1536). The
 * families' rows are S with the family's feature: qwen2-S its q/k/v biases; qwen3-S its q/k norms and
 * heads of 128 (q twice the stream's width, as Qwen3-0.6B's 16 x 128 on 1024); llama3-S Llama 3.1's rope
 * scaling; mistral-S a sliding window of 64 over its 256 tokens. */
static const struct bench_row rows[] = {
    {.name = "S", .family = "llama", 4, 256, 4, 2, 0, 768, 4096, 256, 8, .warmup = 2, .steps = 10},
    {.name = "M", .family = "llama", 12, 768, 12, 4, 0, 2048, 32000, 256, 4, .warmup = 1, .steps = 3},
    {.name = "L", .family = "llama", 8, 512, 8, 4, 0, 1536, 32000, 256, 4, .warmup = 1, .steps = 4},
    {.name = "qwen2-S", .family = "qwen2", 4, 256, 4, 2, 0, 768, 4096, 256, 8, .warmup = 2, .steps = 10},
    {.name = "qwen3-S", .family = "qwen3", 4, 256, 4, 2, 128, 768, 4096, 256, 8, .warmup = 2, .steps = 10},
    {.name = "llama3-S", .family = "llama", 4, 256, 4, 2, 0, 768, 4096, 256, 8, .rope_llama3 = true, .warmup = 2,
     .steps = 10},
    {.name = "mistral-S", .family = "mistral", 4, 256, 4, 2, 0, 768, 4096, 256, 8, .window = 64, .warmup = 2,
     .steps = 10},
};
enum { NROWS = sizeof rows / sizeof rows[0] };
static const char *const default_rows[] = {"S", "qwen2-S", "qwen3-S", "llama3-S", "mistral-S"};

static int run_child(const struct bench_row *row, bool bf16, bool profile, const char *device)
{
    const struct kernels *base = bench_device_table(device);
    if (bf16 && !(base->matmul_dtypes & DTYPE_BIT(DTYPE_BF16)))
        fprintf(stderr, "bench_llama: this CPU has no bf16 matmul instructions: bf16 computes in fp32\n");
    if (base->set_matmul_dtype(bf16 ? DTYPE_BF16 : DTYPE_F32)) {
        fprintf(stderr, "bench_llama: set_matmul_dtype: %s\n", error_message());
        return 1;
    }
    const struct kernels *k = profile ? bench_profile_table(base) : base;
    struct bench_step_result r;
    bench_step_run(row, k, bf16, profile, &r);
    /* model FLOPs of the step (model_flops_per_token: the PaLM count); the same count divides PyTorch's */
    double fl = r.model_flops_per_token * row->b * row->t;
    printf("child tokens_per_s=%.1f best_tokens_per_s=%.1f cpu_tokens_per_s=%.1f gflops=%.2f params=%zu\n",
           r.tokens_per_s, r.best_tokens_per_s, r.cpu_tokens_per_s, fl / (r.step_ms * 1e-3) / 1e9, r.params);
    if (profile)
        bench_profile_print(r.timed, r.step_ms, r.step_cpu_ms, fl, NAN);
    return 0;
}

/* The peer's command for a row, without --steps (the runner adds it). */
static void torch_cmd(char *out, size_t cap, const char *py, const char *script, const struct bench_row *row,
                      int threads, bool bf16)
{
    struct model_config mc;
    bench_row_model(row, &mc);
    int hd = model_head_dim(&mc); /* explicit: Qwen3Config's default is 128, not n_embd / n_head */
    snprintf(out, cap,
             "OMP_NUM_THREADS=%d '%s' '%s' --family %s --n_layer %d --n_head %d --n_kv_head %d --n_embd %d "
             "--head_dim %d --intermediate_size %d --vocab %d --seq %d --batch %d --warmup %d "
             "--sliding_window %d%s%s%s",
             threads, py, script, row->family, row->n_layer, row->n_head, row->n_kv_head, row->n_embd, hd, row->inter,
             row->vocab, row->t, row->b, row->warmup, row->window, row->tie ? " --tie" : "",
             row->rope_llama3 ? " --rope_llama3" : "", bf16 ? " --bf16" : "");
}

static const char *goal(double ratio)
{
    return isnan(ratio) ? "unmeasured" : ratio >= 1.3 ? "met" : "missed";
}

static int run_row(const char *self, const struct bench_row *row, int threads, int rounds, bool have_torch,
                   const char *py, const char *script)
{
    double tps[2], ctps[2], ttps[2], tctps[2];
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        char cmd[4 * PATH_MAX], line[4096] = "", best_line[4096] = "";
        tps[bf16] = ctps[bf16] = ttps[bf16] = tctps[bf16] = NAN;
        for (int r = 0; r < rounds; r++) {
            snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=%d '%s' --child %s%s", threads, self, row->name,
                     bf16 ? " --bf16" : "");
            double t = bench_run_and_grab(cmd, "tokens_per_s", line, sizeof line, NULL, 0);
            if (isnan(t))
                return 1;
            if (isnan(tps[bf16]) || t > tps[bf16]) {
                tps[bf16] = t;
                snprintf(best_line, sizeof best_line, "%s", line);
            }
            double c = bench_grab(line, "cpu_tokens_per_s");
            if (isnan(ctps[bf16]) || c > ctps[bf16])
                ctps[bf16] = c;
            if (have_torch) {
                double w, tc;
                torch_cmd(cmd, sizeof cmd, py, script, row, threads, bf16);
                bench_torch_point(cmd, row->warmup, row->steps, (double)row->b * row->t, &w, &tc);
                if (!isnan(w) && (isnan(ttps[bf16]) || w > ttps[bf16]))
                    ttps[bf16] = w;
                if (!isnan(tc) && (isnan(tctps[bf16]) || tc > tctps[bf16]))
                    tctps[bf16] = tc;
            }
        }
        printf("bench=llama_step config=%s family=%s threads=%d precision=%s tokens_per_s=%.1f cpu_tokens_per_s=%.1f "
               "gflops=%.2f torch_precision=%s torch_tokens_per_s=%.1f torch_cpu_tokens_per_s=%.1f ratio=%.3f "
               "cpu_ratio=%.3f rounds=%d%s\n",
               row->name, row->family, threads, bf16 ? "bf16" : "fp32", tps[bf16], ctps[bf16],
               bench_grab(best_line, "gflops"), bf16 ? "bf16_autocast" : "fp32", ttps[bf16], tctps[bf16],
               tps[bf16] / ttps[bf16], ctps[bf16] / tctps[bf16], rounds, have_torch ? "" : " note=peer_skipped");
        fflush(stdout);
    }
    /* the verdicts on tokens per CPU-second (what each side computed, whatever else ran on the shared
     * machine), else on wall time */
    double g32 = ctps[0] / tctps[0], g16 = ctps[1] / tctps[1];
    if (isnan(g32))
        g32 = tps[0] / ttps[0];
    if (isnan(g16))
        g16 = tps[1] / ttps[1];
    printf("bench=llama_goals config=%s family=%s threads=%d fp32_vs_torch=%.3f goal_fp32=%s bf16_vs_torch_bf16=%.3f "
           "goal_bf16=%s bf16_vs_fp32=%.3f torch_bf16_vs_fp32=%.3f wall_fp32_vs_torch=%.3f wall_bf16_vs_torch_bf16=%.3f\n",
           row->name, row->family, threads, g32, goal(g32), g16, goal(g16), ctps[1] / ctps[0], tctps[1] / tctps[0],
           tps[0] / ttps[0], tps[1] / ttps[1]);
    fflush(stdout);
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_llama [--rounds N] [--threads 1,2] [ROW ...]; rows:");
    for (int i = 0; i < NROWS; i++)
        fprintf(stderr, " %s", rows[i].name);
    fprintf(stderr, "\n       bench_llama --child ROW [--bf16] [--profile] [--device cpu|cuda]\n");
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--child") == 0) {
        const struct bench_row *row = bench_row_find(rows, NROWS, argv[2]);
        if (!row) {
            usage();
            return 2;
        }
        bool bf16 = false, profile = false;
        const char *device = "cpu";
        for (int i = 3; i < argc; i++) {
            if (strcmp(argv[i], "--bf16") == 0)
                bf16 = true;
            else if (strcmp(argv[i], "--profile") == 0)
                profile = true;
            else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
                device = argv[++i];
            else {
                fprintf(stderr, "bench_llama: unknown child flag '%s' (--bf16, --profile, --device NAME)\n", argv[i]);
                return 2;
            }
        }
        return run_child(row, bf16, profile, device);
    }
    char self[FSDP_PATH_MAX];
    if (!bench_self(self, sizeof self))
        return 1;
    int rounds = 1, threads[4] = {1, 2}, nthreads = 2, nsel = 0;
    const struct bench_row *sel[NROWS * 2];
    const char *bad = NULL;
    if (bench_driver_args(argc, argv, "bench_llama", rows, NROWS, &rounds, threads, &nthreads, sel, NROWS * 2, &nsel,
                          &bad)) {
        if (bad)
            usage();
        return 2;
    }
    if (!nsel)
        for (size_t i = 0; i < sizeof default_rows / sizeof default_rows[0]; i++)
            sel[nsel++] = bench_row_find(rows, NROWS, default_rows[i]);
    char py[FSDP_PATH_MAX], script[FSDP_PATH_MAX];
    const char *src = getenv("FSDP_SOURCE_ROOT");
    snprintf(script, sizeof script, "%s/tests/bench/model/llama_torch_step.py", src ? src : ".");
    bool have_torch = tu_torch_python(py, sizeof py) == 0;
    if (!have_torch)
        printf("bench_llama: no PyTorch peer (%s); torch_* fields are nan\n", py);
    for (int si = 0; si < nsel; si++) {
        const struct bench_row *row = sel[si];
        struct model_config mc;
        bench_row_model(row, &mc);
        size_t full = model_arena_bytes(&mc, row->b, row->t, false, kernels_cpu());
        mc.activation_checkpointing = true;
        size_t ck = model_arena_bytes(&mc, row->b, row->t, true, kernels_cpu());
        printf("bench=llama_arena config=%s family=%s batch=%dx%d arena_mib=%.1f arena_ckpt_mib=%.1f ratio=%.3f\n",
               row->name, row->family, row->b, row->t, full / 1048576.0, ck / 1048576.0, (double)ck / (double)full);
        fflush(stdout);
        for (int ti = 0; ti < nthreads; ti++)
            if (run_row(self, row, threads[ti], rounds, have_torch, py, script))
                return 1;
    }
    return 0;
}
