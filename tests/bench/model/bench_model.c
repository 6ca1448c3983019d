/* Model benchmark: the single-process training step (what a world-1 step does: zero grads,
 * model_forward_backward, global grad norm, AdamW over every parameter through the kernels table) in three
 * precisions, beside PyTorch 2.x from the PyPI venv running the same model and step
 * (../shared/anchors/torch2/fsdp2_gpt.py --mode single, fp32 and --bf16 autocast), all in the same run, so
 * the ratios hold even on a noisy shared machine:
 *   fp32           fp32 matmuls on the library FSDP_CPU_MATMUL=auto picks per shape (oneDNN or OpenBLAS);
 *   fp32_openblas  fp32 matmuls on OpenBLAS alone (FSDP_CPU_MATMUL=openblas): what fp32 ran on before;
 *   bf16           mixed_precision = bf16 as a world-1 rank runs it: fp32 master weights and AdamW, the
 *                  bf16 copy refreshed after each step and bound to the parameters the model reads (the
 *                  engine's gather), so the matmuls read it as is; bf16 matmuls and attention products.
 * Each child also measures the GEMM peaks of this machine (the best of a few GPT shapes: fp32 on the
 * table's library, bf16 on operands already in bf16, OpenBLAS sgemm; per CPU-second, so other processes on
 * the machine do not lower them), and a profiled child per precision gives the CPU time per op and the
 * fraction of the peak each reaches (step_frac_*: the step's FLOPs per CPU-second against the peak);
 * `bench=model_goals` sets the step against the goals and against the ceiling the GEMM peaks allow.
 *
 * OpenMP, OpenBLAS and FSDP_CPU_MATMUL are read once at start, so each (config, threads, precision) point
 * runs in a child: this binary re-executed as `bench_model --child CONFIG --precision P [--profile]`.
 *
 * The step, the profile and the helpers that run children and the peer are bench_runner.h's, shared with
 * bench_llama; this file adds the GPT-2 rows, the GEMM peaks and the three precisions.
 *
 * Usage: bench_model [--rounds N] [--threads LIST] [S|L|M|M1024|XS ...]   (default: 1 round, threads 1, S L)
 *        bench_model --child CONFIG --precision fp32|bf16 [--profile] [--device cpu|cuda]
 * --device cuda runs the child's peaks and step on the CUDA table (the GPU module; the emulator's where
 * FSDP_GPU_MODULE names it): with --profile each op's time is its device time (the profile waits for the
 * device before and after each op; `timing=device_sync` in its lines). M1024 (GPT-2 small at T 1024, batch 8)
 * is for a GPU, XS (the GPU kit's dry-run shapes) for its plumbing.
 * With N rounds each point runs ours and PyTorch alternately N times and keeps each side's best round, so a
 * slow spell of the shared machine hits both sides alike rather than whichever ran during it.
 * Output: `bench=model_step config=S threads=1 precision=bf16 tokens_per_s=... cpu_tokens_per_s=... gflops=...
 *          torch_tokens_per_s=... ratio=...` (cpu_tokens_per_s: per CPU-second of the process, what the step
 *          computed whatever else ran on the machine; the peer prints wall time only, so ratio is of wall
 *          time), `bench=model_peak ...`, `bench=model_profile ...`, `bench=model_goals ...`,
 *          `bench=model_arena ...` per config. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fs.h"
#include "kernels/kernels.h"
#include "tests/bench/model/bench_runner.h"
#include "tests/util/tu_venv.h"
#include "worker/model/model.h"

static const struct bench_row configs[] = {
    {.name = "S", .family = "gpt2", 4, 256, 4, 0, 0, 0, 4096, 256, 8, .warmup = 2, .steps = 10},
    /* 51.2M parameters (the issue's >= 50M config; bench_train's L with 4 rows) */
    {.name = "L", .family = "gpt2", 8, 512, 8, 0, 0, 0, 50304, 256, 4, .warmup = 1, .steps = 4},
    /* GPT-2 small, 124M */
    {.name = "M", .family = "gpt2", 12, 768, 12, 0, 0, 0, 50304, 256, 4, .warmup = 1, .steps = 3},
    /* GPT-2 small at llm.c's shapes (T 1024, batch 8, GPT-2's own vocabulary): the GPU kit's bench stage
     * profiles it on the GPU (--device cuda); on a CPU a step takes minutes */
    {.name = "M1024", .family = "gpt2", 12, 768, 12, 0, 0, 0, 50257, 1024, 8, .warmup = 2, .steps = 5},
    /* the GPU kit's dry-run shapes (tests/gpu/acceptance.sh: 2 x 64, T 64, batch 2), for its plumbing */
    {.name = "XS", .family = "gpt2", 2, 64, 2, 0, 0, 0, 4096, 64, 2, .warmup = 1, .steps = 2},
};
enum { NCONFIGS = sizeof configs / sizeof configs[0] };

static void die(const char *what)
{
    fprintf(stderr, "bench_model: %s: %s\n", what, error_message());
    exit(1);
}

static const struct bench_row *config_find(const char *name)
{
    return bench_row_find(configs, NCONFIGS, name);
}

/* Model FLOPs of one step, the PaLM/nanoGPT "MFU" count: 6 x (parameters that take part in matmuls) x
 * tokens, i.e. every weight once in forward and twice in backward, with wte counted through the tied LM
 * head and wpe (a lookup, no matmul) left out; plus causal attention, 6 x L x T x C per token (QK^T and
 * PV each 2 x (T/2) x C multiply-adds per token forward under the causal mask, twice that backward).
 * Elementwise work (layernorm, GELU, softmax, AdamW) is not counted: it is the overhead to minimise.
 * The same count divides PyTorch's step time, so gflops ratios equal tokens/s ratios. */
static double step_flops(const struct bench_row *bc, const struct bench_step_result *r)
{
    double tokens = (double)bc->b * bc->t;
    return 6.0 * r->matmul_params * tokens + 6.0 * bc->n_layer * (double)bc->t * bc->n_embd * tokens;
}

/* ---- the GEMM peaks of this machine, measured in the child ---- */

/* Best GFLOP per CPU-second (GFLOP/s of one thread) over a few reps of C(m, n) = A(m, k) B(k, n) through the
 * table (fp32 on its library, or bf16 on operands bound to bf16 copies, as gathered weights are) or OpenBLAS
 * sgemm. CPU time, so that other processes on the machine do not lower the peak the step is set against. */
enum peak_kind { PEAK_F32, PEAK_BF16, PEAK_SGEMM };

static double gemm_rate(const struct kernels *k, enum peak_kind kind, int m, int n, int kk)
{
    float *a = k->mem_alloc((size_t)m * kk * sizeof(float)), *b = k->mem_alloc((size_t)kk * n * sizeof(float));
    float *c = k->mem_alloc((size_t)m * n * sizeof(float));
    uint16_t *ah = k->mem_alloc((size_t)m * kk * 2), *bh = k->mem_alloc((size_t)kk * n * 2);
    /* the operands are made on the host and copied into the table's memory (a device's is not the host's) */
    float *ha = malloc((size_t)m * kk * sizeof(float)), *hb = malloc((size_t)kk * n * sizeof(float));
    if (!a || !b || !c || !ah || !bh || !ha || !hb)
        die("allocating the peak's matrices");
    for (size_t i = 0; i < (size_t)m * kk; i++)
        ha[i] = (float)(i % 17) * 0.01f;
    for (size_t i = 0; i < (size_t)kk * n; i++)
        hb[i] = (float)(i % 13) * 0.01f;
    if (k->mem_copy(a, ha, (size_t)m * kk * sizeof(float), KERNELS_COPY_H2D) ||
        k->mem_copy(b, hb, (size_t)kk * n * sizeof(float), KERNELS_COPY_H2D))
        die("copying the peak's matrices");
    free(ha), free(hb);
    if (kind == PEAK_BF16) {
        if (k->cast(ah, DTYPE_BF16, a, DTYPE_F32, (size_t)m * kk) ||
            k->cast(bh, DTYPE_BF16, b, DTYPE_F32, (size_t)kk * n) || k->lowp_bind(a, ah, (size_t)m * kk) ||
            k->lowp_bind(b, bh, (size_t)kk * n))
            die("binding the peak's bf16 operands");
    }
    if (k->set_matmul_dtype(kind == PEAK_BF16 ? DTYPE_BF16 : DTYPE_F32))
        die("set_matmul_dtype");
    double best = 1e30;
    for (int r = 0; r < 6; r++) {
        double t0 = bench_op_now(k);
        if (kind == PEAK_SGEMM)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, kk, 1.0f, a, kk, b, n, 0.0f, c, n);
        else if (k->gemm(0, 0, m, n, kk, 1.0f, a, kk, b, n, 0.0f, c, n))
            die("gemm");
        double dt = bench_op_now(k) - t0;
        if (r > 0 && dt < best)
            best = dt;
    }
    if (kind == PEAK_BF16 && (k->lowp_unbind(a) || k->lowp_unbind(b)))
        die("unbinding");
    k->mem_free(a), k->mem_free(b), k->mem_free(c);
    k->mem_free(ah), k->mem_free(bh);
    return 2.0 * m * n * kk / best / 1e9;
}

/* The best over GPT shapes: this config's MLP up-projection and GPT-2 small's (1024 tokens x 768 -> 3072). */
static double gemm_peak(const struct kernels *k, enum peak_kind kind, const struct bench_row *bc)
{
    int n_tok = bc->b * bc->t;
    double a = gemm_rate(k, kind, n_tok, 4 * bc->n_embd, bc->n_embd), b = gemm_rate(k, kind, 1024, 3072, 768);
    return a > b ? a : b;
}

/* ---- one (config, threads, precision) point, in this process ---- */

static int run_child(const struct bench_row *bc, bool bf16, bool profile, const char *device)
{
    const struct kernels *base = bench_device_table(device);
    /* the peaks first, in this process's library setting; then the mode the step runs in (OpenBLAS's sgemm
     * only on the CPU: a device's are the table's own) */
    double f32_peak = gemm_peak(base, PEAK_F32, bc), bf16_peak = NAN, sgemm_peak = NAN;
    if (base->matmul_dtypes & DTYPE_BIT(DTYPE_BF16))
        bf16_peak = gemm_peak(base, PEAK_BF16, bc);
    if (base->host_visible)
        sgemm_peak = gemm_peak(base, PEAK_SGEMM, bc);
    if (bf16 && !(base->matmul_dtypes & DTYPE_BIT(DTYPE_BF16)))
        fprintf(stderr, "bench_model: this CPU has no bf16 matmul instructions: bf16 computes in fp32\n");
    if (base->set_matmul_dtype(bf16 ? DTYPE_BF16 : DTYPE_F32))
        die("set_matmul_dtype");
    const struct kernels *k = profile ? bench_profile_table(base) : base;
    struct bench_step_result r;
    bench_step_run(bc, k, bf16, profile, &r);
    double fl = step_flops(bc, &r);
    printf("child tokens_per_s=%.1f best_tokens_per_s=%.1f cpu_tokens_per_s=%.1f gflops=%.2f f32_gemm_gflops=%.2f "
           "bf16_gemm_gflops=%.2f sgemm_gflops=%.2f params=%zu\n",
           r.tokens_per_s, r.best_tokens_per_s, r.cpu_tokens_per_s, fl / (r.step_ms * 1e-3) / 1e9, f32_peak, bf16_peak,
           sgemm_peak, r.params);
    if (profile)
        bench_profile_print(r.timed, r.step_ms, r.step_cpu_ms, fl, bf16 ? bf16_peak : f32_peak);
    return 0;
}

/* ---- the driver: children per point, torch beside them ---- */

/* One PyTorch run of a point (bench_torch_point: wall and CPU-time tokens/s). */
static void torch_point(const char *python, const char *script, const struct bench_row *bc, int threads, bool bf16,
                        double *wall_tps, double *cpu_tps)
{
    char base[5 * PATH_MAX];
    snprintf(base, sizeof base,
             "OMP_NUM_THREADS=%d '%s' '%s' --mode single --n_layer %d --n_embd %d --n_head %d --vocab %d "
             "--block_size %d --global_batch %d --warmup %d%s",
             threads, python, script, bc->n_layer, bc->n_embd, bc->n_head, bc->vocab, bc->t, bc->b, bc->warmup,
             bf16 ? " --bf16" : "");
    bench_torch_point(base, bc->warmup, bc->steps, (double)bc->b * bc->t, wall_tps, cpu_tps);
}

/* The PyTorch 2.x peer: the venv's python and the anchor next to the project checkout
 * (FSDP_SOURCE_ROOT/../shared/anchors/torch2/fsdp2_gpt.py). */
static bool torch_peer(char *python, size_t pcap, char *script, size_t scap)
{
    const char *src = getenv("FSDP_SOURCE_ROOT");
    snprintf(script, scap, "%s/../shared/anchors/torch2/fsdp2_gpt.py", src ? src : ".");
    return tu_venv_bin("python", python, pcap) && access(script, R_OK) == 0;
}

static void print_arena(const struct bench_row *bc)
{
    struct model_config mc;
    bench_row_model(bc, &mc);
    const struct kernels *k = kernels_cpu();
    size_t full = model_arena_bytes(&mc, bc->b, bc->t, false, k);
    size_t ck = model_arena_bytes(&mc, bc->b, bc->t, true, k);
    printf("bench=model_arena config=%s batch=%dx%d arena_mib=%.1f arena_ckpt_mib=%.1f ratio=%.3f\n", bc->name,
           bc->b, bc->t, full / 1048576.0, ck / 1048576.0, (double)ck / (double)full);
}

enum { PREC_FP32, PREC_FP32_OPENBLAS, PREC_BF16, NPREC };
static const char *prec_names[NPREC] = {"fp32", "fp32_openblas", "bf16"};

/* The profile lines of a child, re-printed as bench=model_profile lines of this point. */
static void print_profile(const struct bench_row *bc, int threads, const char *prec, const char *prof)
{
    char *copy = strdup(prof);
    for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n"))
        printf("bench=model_profile config=%s threads=%d precision=%s %s\n", bc->name, threads, prec, line + 8);
    free(copy);
}

static int run_point(const char *self, const struct bench_row *bc, int threads, int rounds, bool have_torch,
                     const char *python, const char *script)
{
    double tps[NPREC], gf[NPREC], ctps[NPREC], ttps[2] = {NAN, NAN}, tctps[2] = {NAN, NAN};
    char best_line[NPREC][4096];
    for (int p = 0; p < NPREC; p++)
        tps[p] = gf[p] = ctps[p] = NAN, best_line[p][0] = '\0';
    for (int r = 0; r < rounds; r++) {
        for (int p = 0; p < NPREC; p++) {
            char cmd[3 * PATH_MAX], line[4096];
            snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=%d FSDP_CPU_MATMUL=%s '%s' --child %s --precision %s", threads,
                     p == PREC_FP32_OPENBLAS ? "openblas" : "auto", self, bc->name, p == PREC_BF16 ? "bf16" : "fp32");
            double t = bench_run_and_grab(cmd, "tokens_per_s", line, sizeof line, NULL, 0);
            if (isnan(t))
                return 1;
            if (isnan(tps[p]) || t > tps[p]) {
                tps[p] = t;
                snprintf(best_line[p], sizeof best_line[p], "%s", line);
            }
            double c = bench_grab(line, "cpu_tokens_per_s");
            if (isnan(ctps[p]) || c > ctps[p])
                ctps[p] = c;
        }
        for (int b = 0; have_torch && b < 2; b++) {
            double w, c;
            torch_point(python, script, bc, threads, b == 1, &w, &c);
            if (!isnan(w) && (isnan(ttps[b]) || w > ttps[b]))
                ttps[b] = w;
            if (!isnan(c) && (isnan(tctps[b]) || c > tctps[b]))
                tctps[b] = c;
        }
    }
    for (int p = 0; p < NPREC; p++) {
        gf[p] = bench_grab(best_line[p], "gflops");
        double peer = p == PREC_BF16 ? ttps[1] : ttps[0], cpeer = p == PREC_BF16 ? tctps[1] : tctps[0];
        printf("bench=model_step config=%s threads=%d precision=%s tokens_per_s=%.1f cpu_tokens_per_s=%.1f "
               "gflops=%.2f torch_precision=%s torch_tokens_per_s=%.1f torch_cpu_tokens_per_s=%.1f ratio=%.3f "
               "cpu_ratio=%.3f rounds=%d%s\n",
               bc->name, threads, prec_names[p], tps[p], ctps[p], gf[p], p == PREC_BF16 ? "bf16_autocast" : "fp32",
               peer, cpeer, tps[p] / peer, ctps[p] / cpeer, rounds, have_torch ? "" : " note=peer_skipped");
    }
    /* the peaks of the child that ran fp32 on the auto library (its bf16 peak is measured alike) */
    double f32p = bench_grab(best_line[PREC_FP32], "f32_gemm_gflops"), bfp = bench_grab(best_line[PREC_FP32], "bf16_gemm_gflops");
    double sgp = bench_grab(best_line[PREC_FP32], "sgemm_gflops");
    /* the step's GFLOP per CPU-second against the peaks (also per CPU-second): the fraction of the peak */
    double cgf32 = gf[PREC_FP32] * ctps[PREC_FP32] / tps[PREC_FP32];
    double cgf16 = gf[PREC_BF16] * ctps[PREC_BF16] / tps[PREC_BF16];
    printf("bench=model_peak config=%s threads=%d f32_gemm_gflops=%.1f bf16_gemm_gflops=%.1f sgemm_gflops=%.1f "
           "bf16_over_f32=%.3f f32_over_sgemm=%.3f step_frac_f32=%.3f step_frac_bf16=%.3f\n",
           bc->name, threads, f32p, bfp, sgp, bfp / f32p, f32p / sgp, cgf32 / f32p, cgf16 / bfp);
    fflush(stdout);

    /* one profiled child per precision: time per op, and the step against the peak of its dtype */
    double step_ms[NPREC], gemm_ms[NPREC];
    for (int p = 0; p < NPREC; p++) {
        char cmd[3 * PATH_MAX], prof[16384];
        snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=%d FSDP_CPU_MATMUL=%s '%s' --child %s --precision %s --profile",
                 threads, p == PREC_FP32_OPENBLAS ? "openblas" : "auto", self, bc->name,
                 p == PREC_BF16 ? "bf16" : "fp32");
        if (isnan(bench_run_and_grab(cmd, "tokens_per_s", NULL, 0, prof, sizeof prof)))
            return 1;
        print_profile(bc, threads, prec_names[p], prof);
        const char *tot = strstr(prof, "op=total");
        step_ms[p] = tot ? bench_grab(tot, "ms_per_step") : NAN;
        gemm_ms[p] = tot ? bench_grab(tot, "gemm_ms") : NAN;
    }
    /* The ceiling of bf16 over fp32 on this machine: the GEMMs of the fp32 step sped up by the bf16/fp32
     * GEMM peak ratio, everything else as it is (the profiled fp32 step's other ops). */
    double ratio_peak = bfp / f32p;
    double ceiling = step_ms[PREC_FP32] / (step_ms[PREC_FP32] - gemm_ms[PREC_FP32] + gemm_ms[PREC_FP32] / ratio_peak);
    /* verdicts on tokens per CPU-second (what each side computes, whatever else runs on the machine; with
     * one thread on a quiet machine the same as tokens/s), wall-clock ratios beside them */
    double bf16_vs_fp32 = ctps[PREC_BF16] / ctps[PREC_FP32], bf16_vs_torch = ctps[PREC_BF16] / tctps[1];
    double fp32_vs_torch = ctps[PREC_FP32] / tctps[0];
    printf("bench=model_goals config=%s threads=%d bf16_vs_fp32=%.3f goal_bf16_vs_fp32=%s ceiling_bf16_vs_fp32=%.3f "
           "bf16_vs_fp32_openblas=%.3f bf16_vs_torch_bf16=%.3f goal_bf16_vs_torch=%s fp32_vs_torch_fp32=%.3f "
           "goal_fp32_vs_torch=%s fp32_vs_fp32_openblas=%.3f wall_bf16_vs_fp32=%.3f wall_bf16_vs_torch_bf16=%.3f "
           "wall_fp32_vs_torch_fp32=%.3f\n",
           bc->name, threads, bf16_vs_fp32,
           bf16_vs_fp32 >= 1.7 ? "met" : ceiling < 1.7 ? "missed_beyond_ceiling" : "missed", ceiling,
           ctps[PREC_BF16] / ctps[PREC_FP32_OPENBLAS], bf16_vs_torch,
           isnan(bf16_vs_torch) ? "no_peer" : bf16_vs_torch >= 1.5 ? "met" : "missed", fp32_vs_torch,
           isnan(fp32_vs_torch) ? "no_peer" : fp32_vs_torch >= 1.3 ? "met" : "missed",
           ctps[PREC_FP32] / ctps[PREC_FP32_OPENBLAS], tps[PREC_BF16] / tps[PREC_FP32], tps[PREC_BF16] / ttps[1],
           tps[PREC_FP32] / ttps[0]);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--child") == 0) {
        const struct bench_row *bc = config_find(argv[2]);
        if (!bc) {
            fprintf(stderr, "bench_model: unknown config '%s' (S, L, M, M1024 or XS)\n", argv[2]);
            return 2;
        }
        bool bf16 = false, profile = false;
        const char *device = "cpu";
        for (int i = 3; i < argc; i++) {
            if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
                device = argv[++i];
            } else if (strcmp(argv[i], "--precision") == 0 && i + 1 < argc) {
                i++;
                if (strcmp(argv[i], "bf16") != 0 && strcmp(argv[i], "fp32") != 0) {
                    fprintf(stderr, "bench_model: --precision %s: want fp32 or bf16\n", argv[i]);
                    return 2;
                }
                bf16 = strcmp(argv[i], "bf16") == 0;
            } else if (strcmp(argv[i], "--profile") == 0) {
                profile = true;
            } else {
                fprintf(stderr, "bench_model: unknown child argument '%s'\n", argv[i]);
                return 2;
            }
        }
        return run_child(bc, bf16, profile, device);
    }
    char self[FSDP_PATH_MAX];
    if (!bench_self(self, sizeof self))
        return 1;
    int rounds = 1, threads[4] = {1}, nthreads = 1, nsel = 0;
    const struct bench_row *sel[NCONFIGS * 2];
    const char *bad = NULL;
    if (bench_driver_args(argc, argv, "bench_model", configs, NCONFIGS, &rounds, threads, &nthreads, sel,
                          NCONFIGS * 2, &nsel, &bad)) {
        if (bad)
            fprintf(stderr, "usage: bench_model [--rounds N] [--threads 1,2] [S|L|M|M1024|XS ...]\n");
        return 2;
    }
    if (!nsel)
        sel[nsel++] = config_find("S"), sel[nsel++] = config_find("L");
    char python[FSDP_PATH_MAX], script[FSDP_PATH_MAX];
    bool have_torch = torch_peer(python, sizeof python, script, sizeof script);
    if (!have_torch)
        printf("bench_model: PyTorch 2.x peer not found (%s or %s missing); torch_* fields are nan\n", python, script);
    for (int si = 0; si < nsel; si++) {
        print_arena(sel[si]);
        fflush(stdout);
        for (int ti = 0; ti < nthreads; ti++)
            if (run_point(self, sel[si], threads[ti], rounds, have_torch, python, script))
                return 1;
    }
    return 0;
}
