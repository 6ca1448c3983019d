/* Training throughput at world 2 on CPU (OMP_NUM_THREADS=1 per rank): fsdp-worker under fsdp-launch with
 * FULL_SHARD (fp32 and mixed_precision = bf16) and with NO_SHARD, beside PyTorch 2.x from the PyPI venv under
 * its torchrun training the same GPT with the same per-rank batch (../shared/anchors/torch2/fsdp2_gpt.py):
 * FSDP2 (fully_shard per block and root) in fp32 and with MixedPrecisionPolicy(param_dtype=bf16), and DDP
 * (gloo), all in the same run. Goals: FULL_SHARD >= 1.5x FSDP2 in fp32, FULL_SHARD bf16 >= 1.5x FSDP2 bf16,
 * FULL_SHARD >= 1.5x DDP, and >= 0.9x fsdp's own NO_SHARD (sharding nearly free).
 *
 * Configs: S (4 layers, n_embd 256, vocab 4096, T 256, 8 sequences per rank: 4.27M parameters) and L
 * (8 layers, n_embd 512, vocab 50304, T 256, 2 sequences per rank: 51.2M parameters).
 *
 * Each round runs the peers and fsdp's runs one after the other; a system's figure is the median step of a
 * run after its warm-up steps (torch prints the same), and the best round counts, since on a shared
 * machine the least disturbed round is the closest to the truth. The worker's tokens/s come from
 * metrics.jsonl, its MFU from them and rank 0's run summary (its own peak: a matmul measured at start in
 * the dtype the run computes in), and the time the ranks waited for all-gathers and reductions from their
 * run summaries (wait_frac: that time over the run's step time). One rank with the same per-rank batch
 * (NO_SHARD, world 1) gives `scaling`, world-2 tokens/s over twice one rank's, and torch's single process
 * (--mode single, same per-rank batch) gives the same for DDP: with the waits, they say whether a gap to the
 * peer is in the distribution or in the per-rank compute (bench=train_one_rank).
 *
 * Prefetch: FULL_SHARD also runs with backward_prefetch = NO_PREFETCH and with forward_prefetch on; the
 * lines bench=train_prefetch give tokens/s and the time blocked waiting for all-gathers of each, so the
 * overlap prefetching buys is measured, not assumed.
 *
 * Llama (config llama: model_family = llama, 8 layers, n_embd 512, 8 query / 4 key-value heads, SwiGLU width
 * 1536, vocab 32000, untied head, T 256, 4 sequences per rank: 58.2M parameters): FULL_SHARD in fp32 and with
 * mixed_precision = bf16 beside PyTorch 2.x FSDP2 on transformers' own LlamaForCausalLM
 * (tests/bench/train/fsdp2_llama.py under the venv's torchrun: fully_shard per LlamaDecoderLayer and root,
 * gloo, fp32 and MixedPrecisionPolicy(param_dtype=bf16)), the same per-rank batch. Goal (issue 14): at least
 * 1.3x FSDP2 at equal precision.
 *
 * The families' rows (llama-S, qwen2-S, qwen3-S, llama3-S: bench_llama's S shape with 8 sequences per rank,
 * as a Llama, with Qwen2's q/k/v biases, with Qwen3's q/k norms and heads of 128, with Llama 3.1's rope
 * scaling) run the same way against FSDP2 on transformers' own model of the family (fsdp2_llama.py --family).
 *
 * Usage: bench_train [--rounds N] [S] [L] [llama] [llama-S] [qwen2-S] [qwen3-S] [llama3-S]   (default: --rounds 2 S L)
 * Output: bench=train config=S strategy=FULL_SHARD precision=fp32 world=2 ... tokens_per_s=... mfu=...
 *         torch_fsdp2_tokens_per_s=... ratio=... torch_ddp_tokens_per_s=... no_shard_ratio=... scaling=...
 *         wait_frac=...; the same for FULL_SHARD bf16 and NO_SHARD, and
 *         bench=train_goals config=S full_shard_vs_fsdp2=... goal_fsdp2=met|missed bf16_vs_fsdp2_bf16=...
 *         goal_fsdp2_bf16=... full_shard_vs_ddp=... goal_ddp=... full_shard_vs_no_shard=... goal_no_shard=...;
 *         for llama: bench=train_llama config=llama strategy=FULL_SHARD precision=fp32|bf16 world=2 ...
 *         tokens_per_s=... torch_fsdp2_tokens_per_s=... ratio=... and bench=train_llama_goals config=llama
 *         fp32_vs_fsdp2=... goal_fp32=met|missed bf16_vs_fsdp2_bf16=... goal_bf16=... */
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "tests/util/tu_file.h"
#include "tests/util/tu_proc.h"
#include "tests/util/tu_summary.h"
#include "tests/util/tu_venv.h"

struct bench_config {
    const char *name;
    int n_layer, n_embd, n_head, vocab, t, batch_per_rank;
    int warmup, steps;    /* untimed, timed */
    const char *family;   /* a Llama-style model_family (llama, qwen2, qwen3: its peer is fsdp2_llama.py); NULL = gpt2 */
    int n_kv_head, inter; /* Llama-style: key/value heads, SwiGLU width */
    int head_dim;         /* 0 = n_embd / n_head */
    bool rope_llama3;     /* Llama 3.1's rope scaling (factors 8, 1, 4; original context 64, as bench_llama's) */
};

static const struct bench_config configs[] = {
    /* S times 16 steps: with 8, one disturbed step moved the median by a few percent on a shared machine */
    {"S", 4, 256, 4, 4096, 256, 8, 2, 16, NULL, 0, 0, 0, false},
    {"L", 8, 512, 8, 50304, 256, 2, 1, 4, NULL, 0, 0, 0, false},
    {"llama", 8, 512, 8, 32000, 256, 4, 1, 4, "llama", 4, 1536, 0, false},
    /* bench_llama's family rows at world 2 (S as a Llama, then with each family's feature on) */
    {"llama-S", 4, 256, 4, 4096, 256, 8, 2, 8, "llama", 2, 768, 0, false},
    {"qwen2-S", 4, 256, 4, 4096, 256, 8, 2, 8, "qwen2", 2, 768, 0, false},
    {"qwen3-S", 4, 256, 4, 4096, 256, 8, 2, 8, "qwen3", 2, 768, 128, false},
    {"llama3-S", 4, 256, 4, 4096, 256, 8, 2, 8, "llama", 2, 768, 0, true},
};
enum { N_CONFIGS = sizeof configs / sizeof configs[0] };

enum { WORLD = 2 };

struct figure {
    double tokens_per_s, mfu, gather_wait_s, reduce_wait_s, run_s;
    long long params;
};

/* Runs argv with stdout and stderr to out/err, one OpenMP thread and no torchrun variables of the caller;
 * returns its exit code (or 128 + signal). */
static int run(char *const argv[], const char *out, const char *err)
{
    static const char *const env[] = {"OMP_NUM_THREADS=1", "RANK=", "WORLD_SIZE=", NULL};
    return tu_run((const char *const *)argv, out, err, env);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    if (n <= 0)
        return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void show_tail(const char *what, const char *path)
{
    char *s = tu_slurp(path);
    size_t n = strlen(s);
    fprintf(stderr, "bench_train: %s failed; end of %s:\n%s\n", what, path, s + (n > 2000 ? n - 2000 : 0));
    free(s);
}

/* One fsdp-worker run of config c with `strategy` at world 2; fills f, returns 0 or -1. */
/* extra: one more worker flag (NULL for none), e.g. a prefetch setting; it names the run's files too. */
static int run_fsdp_with(const char *build, const char *dir, const char *data, const struct bench_config *c,
                         const char *strategy, const char *extra, int world, int round, struct figure *f)
{
    char ini[FSDP_PATH_MAX], tag[FSDP_PATH_MAX], logdir[FSDP_PATH_MAX], out[FSDP_PATH_MAX], err[FSDP_PATH_MAX];
    snprintf(ini, sizeof ini, "%s/%s.ini", dir, c->name);
    snprintf(tag, sizeof tag, "%s/%s-%s-w%d-%d%s", dir, c->name, strategy, world, round,
             extra ? strchr(extra, '=') + 1 : "");
    tu_pathf_or_exit(logdir, sizeof logdir, "%s/log", tag);
    tu_pathf_or_exit(out, sizeof out, "%s.out", tag);
    tu_pathf_or_exit(err, sizeof err, "%s.err", tag);
    FILE *fi = fopen(ini, "w");
    if (!fi)
        return -1;
    int total = c->warmup + c->steps;
    fprintf(fi, "[model]\n");
    if (c->family)
        fprintf(fi, "model_family = %s\nn_kv_head = %d\nintermediate_size = %d\n", c->family, c->n_kv_head, c->inter);
    if (c->head_dim)
        fprintf(fi, "head_dim = %d\n", c->head_dim);
    if (c->rope_llama3)
        fprintf(fi, "rope_scaling = llama3\nrope_original_max_position_embeddings = 64\n");
    fprintf(fi,
            "n_layer = %d\nn_head = %d\nn_embd = %d\nvocab_size = %d\nblock_size = %d\n"
            "[train]\ndevice = cpu\ntrain_batch = %d\nmicro_batch = %d\nmax_steps = %d\neval_interval = 0\n"
            "[optim]\nlr = 0.0003\nwarmup_steps = 1\n[data]\ntrain_file = %s/train.bin\n"
            "[log]\ninterval = 1\n",
            c->n_layer, c->n_head, c->n_embd, c->vocab, c->t, c->batch_per_rank * world, c->batch_per_rank, total,
            data);
    fclose(fi);
    char launch[FSDP_PATH_MAX], worker[FSDP_PATH_MAX], nproc[16], port[16], strat[128];
    char logarg[FSDP_PATH_MAX + 32], ckarg[FSDP_PATH_MAX + 32]; /* + 32: "--key=" and a path */
    snprintf(launch, sizeof launch, "%s/launcher/fsdp-launch", build);
    snprintf(worker, sizeof worker, "%s/worker/fsdp-worker", build);
    snprintf(nproc, sizeof nproc, "%d", world);
    snprintf(port, sizeof port, "%d", tu_free_port());
    snprintf(logarg, sizeof logarg, "--log.dir=%s", logdir);
    snprintf(ckarg, sizeof ckarg, "--checkpoint.dir=%s/ckpt", tag);
    snprintf(strat, sizeof strat, "--fsdp.sharding_strategy=%s", strategy);
    char *argv[] = {launch, "--nproc_per_node", nproc, "--master_port", port, worker, ini, logarg, ckarg, strat,
                    (char *)extra, NULL};
    double t0 = tu_now();
    if (run(argv, out, err) != 0) {
        show_tail(strategy, err);
        return -1;
    }
    memset(f, 0, sizeof *f);
    f->run_s = tu_now() - t0;

    /* tokens/s of the timed steps, from metrics.jsonl */
    char path[FSDP_PATH_MAX];
    tu_pathf_or_exit(path, sizeof path, "%s/metrics.jsonl", logdir);
    char *m = tu_slurp(path);
    double tps[256];
    int n = 0, step = 0;
    for (char *line = strtok(m, "\n"); line && n < 256; line = strtok(NULL, "\n"), step++) {
        const char *p = strstr(line, "\"tokens_per_s\":");
        if (p && step >= c->warmup)
            tps[n++] = atof(p + strlen("\"tokens_per_s\":"));
    }
    free(m);
    f->tokens_per_s = median(tps, n);

    /* From the ranks' run summaries: the MFU of the same steps with rank 0's terms, as its progress line
     * computes it (the median of tokens/s x FLOPs per token / (peak x world) is that of tokens/s scaled),
     * the parameters, and the slowest rank's waits. */
    for (int rank = 0; rank < world; rank++) {
        cJSON *s = tu_summary_load(logdir, rank);
        if (!s) {
            fprintf(stderr, "bench_train: %s: no run summary of rank %d\n", tag, rank);
            return -1;
        }
        if (rank == 0) {
            f->mfu = f->tokens_per_s * tu_json_num(s, "mfu_terms.flops_per_token") /
                     (tu_json_num(s, "mfu_terms.peak_flops") * world);
            f->params = (long long)tu_json_num(s, "model.parameters");
        }
        f->gather_wait_s = fmax(f->gather_wait_s, tu_json_num(s, "collectives.gather_wait_s"));
        f->reduce_wait_s = fmax(f->reduce_wait_s, tu_json_num(s, "collectives.reduce_wait_s"));
        cJSON_Delete(s);
    }
    return isfinite(f->tokens_per_s) ? 0 : -1;
}

static int run_fsdp(const char *build, const char *dir, const char *data, const struct bench_config *c,
                    const char *strategy, int world, int round, struct figure *f)
{
    return run_fsdp_with(build, dir, data, c, strategy, NULL, world, round, f);
}

/* The PyTorch 2.x peer on the same config: FSDP2 (bf16: MixedPrecisionPolicy(param_dtype=bf16)) or DDP at
 * world 2 under the venv's torchrun, or (single) one process with the same per-rank batch; returns tokens/s
 * (NAN when the peer fails). */
enum torch_mode { TORCH_FSDP2, TORCH_FSDP2_BF16, TORCH_DDP, TORCH_SINGLE };

static double run_torch(const char *venv_python, const char *venv_torchrun, const char *script, const char *dir,
                        const struct bench_config *c, int round, enum torch_mode mode)
{
    static const char *tag[] = {"fsdp2", "fsdp2-bf16", "ddp", "single"};
    char out[FSDP_PATH_MAX], err[FSDP_PATH_MAX];
    snprintf(out, sizeof out, "%s/torch-%s-%s-%d.out", dir, tag[mode], c->name, round);
    snprintf(err, sizeof err, "%s/torch-%s-%s-%d.err", dir, tag[mode], c->name, round);
    char nproc[16], layers[16], dim[16], heads[16], vocab[16], seq[16], batch[16], steps[16], warm[16];
    snprintf(nproc, sizeof nproc, "%d", WORLD);
    snprintf(layers, sizeof layers, "%d", c->n_layer);
    snprintf(dim, sizeof dim, "%d", c->n_embd);
    snprintf(heads, sizeof heads, "%d", c->n_head);
    snprintf(vocab, sizeof vocab, "%d", c->vocab);
    snprintf(seq, sizeof seq, "%d", c->t);
    snprintf(batch, sizeof batch, "%d", c->batch_per_rank * (mode == TORCH_SINGLE ? 1 : WORLD));
    snprintf(steps, sizeof steps, "%d", c->warmup + c->steps); /* the anchor's --steps counts its warm-up */
    snprintf(warm, sizeof warm, "%d", c->warmup);
    const char *modearg = mode == TORCH_DDP ? "ddp" : mode == TORCH_SINGLE ? "single" : "fsdp2";
    const char *args[40];
    int n = 0;
    if (mode == TORCH_SINGLE) {
        args[n++] = venv_python;
    } else {
        args[n++] = venv_torchrun;
        args[n++] = "--standalone";
        args[n++] = "--nproc_per_node";
        args[n++] = nproc;
    }
    const char *rest[] = {script, "--mode", modearg, "--n_layer", layers, "--n_embd", dim, "--n_head", heads, "--vocab",
                          vocab, "--block_size", seq, "--global_batch", batch, "--steps", steps, "--warmup", warm};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
        args[n++] = rest[i];
    if (mode == TORCH_FSDP2_BF16) {
        args[n++] = "--param_dtype";
        args[n++] = "bf16";
    }
    args[n] = NULL;
    if (run((char *const *)args, out, err) != 0) {
        show_tail(tag[mode], err);
        return NAN;
    }
    char *o = tu_slurp(out);
    const char *p = strstr(o, "tokens_per_s=");
    double v = p ? atof(p + strlen("tokens_per_s=")) : NAN;
    free(o);
    return v;
}

/* The FSDP2 peer of a Llama config (fsdp2_llama.py under torchrun, fp32 or param_dtype bf16); tokens/s or
 * NAN when the peer fails. */
static double run_torch_llama(const char *venv_torchrun, const char *script, const char *dir,
                              const struct bench_config *c, int round, bool bf16)
{
    char out[FSDP_PATH_MAX], err[FSDP_PATH_MAX];
    snprintf(out, sizeof out, "%s/torch-%s-%s-%d.out", dir, c->name, bf16 ? "bf16" : "fp32", round);
    snprintf(err, sizeof err, "%s/torch-%s-%s-%d.err", dir, c->name, bf16 ? "bf16" : "fp32", round);
    char nproc[16], layers[16], dim[16], heads[16], kv[16], inter[16], vocab[16], seq[16], batch[16], steps[16],
        warm[16], hd[16];
    snprintf(hd, sizeof hd, "%d", c->head_dim ? c->head_dim : c->n_embd / c->n_head);
    snprintf(nproc, sizeof nproc, "%d", WORLD);
    snprintf(layers, sizeof layers, "%d", c->n_layer);
    snprintf(dim, sizeof dim, "%d", c->n_embd);
    snprintf(heads, sizeof heads, "%d", c->n_head);
    snprintf(kv, sizeof kv, "%d", c->n_kv_head);
    snprintf(inter, sizeof inter, "%d", c->inter);
    snprintf(vocab, sizeof vocab, "%d", c->vocab);
    snprintf(seq, sizeof seq, "%d", c->t);
    snprintf(batch, sizeof batch, "%d", c->batch_per_rank);
    snprintf(steps, sizeof steps, "%d", c->steps);
    snprintf(warm, sizeof warm, "%d", c->warmup);
    const char *args[] = {venv_torchrun, "--standalone", "--nproc_per_node", nproc, script, "--n_layer", layers,
                          "--n_embd", dim, "--n_head", heads, "--n_kv_head", kv, "--intermediate_size", inter,
                          "--vocab", vocab, "--seq", seq, "--batch_per_rank", batch, "--steps", steps, "--warmup",
                          warm, "--param_dtype", bf16 ? "bf16" : "fp32", "--family", c->family, "--head_dim", hd,
                          c->rope_llama3 ? "--rope_llama3" : NULL, NULL};
    /* gloo on the loopback interface: no lookup of the host's name */
    static const char *const env[] = {"OMP_NUM_THREADS=1", "RANK=", "WORLD_SIZE=", "GLOO_SOCKET_IFNAME=lo", NULL};
    if (tu_run(args, out, err, env) != 0) {
        show_tail(bf16 ? "torch FSDP2 Llama bf16" : "torch FSDP2 Llama", err);
        return NAN;
    }
    char *o = tu_slurp(out);
    const char *p = strstr(o, "tokens_per_s=");
    double v = p ? atof(p + strlen("tokens_per_s=")) : NAN;
    free(o);
    return v;
}

/* A Llama config: FULL_SHARD fp32 and bf16 beside FSDP2 fp32 and bf16, best of the rounds; returns 0 or 1. */
static int bench_llama_config(const char *build, const char *dir, const char *data, const char *torchrun,
                              const char *script, bool peer, const struct bench_config *c, int rounds)
{
    struct figure best[2], f;
    memset(best, 0, sizeof best);
    double best_torch[2] = {NAN, NAN};
    static const char *const prec[2] = {"fp32", "bf16"};
    for (int r = 0; r < rounds; r++) {
        for (int b = 0; b < 2; b++) {
            double t = peer ? run_torch_llama(torchrun, script, dir, c, r, b) : NAN;
            if (isfinite(t) && !(t <= best_torch[b]))
                best_torch[b] = t;
            if (run_fsdp_with(build, dir, data, c, "FULL_SHARD", b ? "--fsdp.mixed_precision=bf16" : NULL, WORLD, r,
                              &f) == 0 &&
                f.tokens_per_s > best[b].tokens_per_s)
                best[b] = f;
        }
        fprintf(stderr,
                "bench_train: config %s round %d: best so far torch FSDP2 %.0f, FSDP2 bf16 %.0f; FULL_SHARD %.0f, "
                "FULL_SHARD bf16 %.0f tokens/s\n",
                c->name, r, best_torch[0], best_torch[1], best[0].tokens_per_s, best[1].tokens_per_s);
    }
    if (best[0].tokens_per_s <= 0 || best[1].tokens_per_s <= 0) {
        fprintf(stderr, "bench_train: config %s: fsdp-worker failed\n", c->name);
        return 1;
    }
    for (int b = 0; b < 2; b++) {
        const struct figure *x = &best[b];
        double steps_s = (c->warmup + c->steps) * (double)c->batch_per_rank * WORLD * c->t / x->tokens_per_s;
        printf("bench=train_llama config=%s strategy=FULL_SHARD precision=%s world=%d params=%lld batch_per_rank=%d "
               "seq=%d tokens_per_s=%.0f mfu=%.4f torch_fsdp2_precision=%s torch_fsdp2_tokens_per_s=%.0f ratio=%.3f "
               "gather_wait_s=%.3f reduce_wait_s=%.3f wait_frac=%.3f run_s=%.1f rounds=%d%s\n",
               c->name, prec[b], WORLD, x->params, c->batch_per_rank, c->t, x->tokens_per_s, x->mfu,
               b ? "param_bf16" : "fp32", best_torch[b], x->tokens_per_s / best_torch[b], x->gather_wait_s,
               x->reduce_wait_s, (x->gather_wait_s + x->reduce_wait_s) / steps_s, x->run_s, rounds,
               peer ? "" : " note=peer_skipped");
    }
    if (peer) {
        double g32 = best[0].tokens_per_s / best_torch[0], g16 = best[1].tokens_per_s / best_torch[1];
        printf("bench=train_llama_goals config=%s fp32_vs_fsdp2=%.3f goal_fp32=%s bf16_vs_fsdp2_bf16=%.3f goal_bf16=%s "
               "bf16_vs_fp32=%.3f torch_bf16_vs_fp32=%.3f\n",
               c->name, g32, g32 >= 1.3 ? "met" : "missed", g16, g16 >= 1.3 ? "met" : "missed",
               best[1].tokens_per_s / best[0].tokens_per_s, best_torch[1] / best_torch[0]);
    }
    fflush(stdout);
    return 0;
}

static void rm_rf(const char *dir)
{
    char *argv[] = {"/bin/rm", "-rf", (char *)dir, NULL};
    run(argv, "/dev/null", "/dev/null");
}

int main(int argc, char **argv)
{
    const char *build = getenv("FSDP_BUILD_ROOT"), *src = getenv("FSDP_SOURCE_ROOT");
    if (!build || !src) {
        fprintf(stderr, "FSDP_BUILD_ROOT / FSDP_SOURCE_ROOT not set: run with meson test --benchmark\n");
        return 1;
    }
    int rounds = 2;
    const struct bench_config *want[N_CONFIGS];
    int n_want = 0;
    for (int i = 1; i < argc; i++) {
        int ci = 0;
        while (ci < N_CONFIGS && strcmp(argv[i], configs[ci].name) != 0)
            ci++;
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (ci < N_CONFIGS && n_want < N_CONFIGS)
            want[n_want++] = &configs[ci];
        else {
            fprintf(stderr, "usage: bench_train [--rounds N] [S] [L] [llama] [llama-S] [qwen2-S] [qwen3-S] [llama3-S]\n");
            return 2;
        }
    }
    if (!n_want) {
        want[0] = &configs[0];
        want[1] = &configs[1];
        n_want = 2;
    }
    if (rounds < 1)
        rounds = 1;

    char dir[] = "/tmp/fsdp-bench-train-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char data[1024], docs[1024], prep[1024], out[1100], err[1100];
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(docs, sizeof docs, "%s/tests/data/corpus", src);
    snprintf(prep, sizeof prep, "%s/worker/fsdp-prepare-data", build);
    snprintf(out, sizeof out, "%s/prepare.out", dir);
    snprintf(err, sizeof err, "%s/prepare.err", dir);
    char *pargv[] = {prep, "-o", data, docs, NULL};
    if (run(pargv, out, err) != 0) {
        show_tail("fsdp-prepare-data", err);
        rm_rf(dir);
        return 1;
    }
    char script[1100], llama_script[1100], python[1100], torchrun[1100];
    snprintf(script, sizeof script, "%s/../shared/anchors/torch2/fsdp2_gpt.py", src);
    snprintf(llama_script, sizeof llama_script, "%s/tests/bench/train/fsdp2_llama.py", src);
    bool have_python = tu_venv_bin("python", python, sizeof python);
    bool have_torchrun = tu_venv_bin("torchrun", torchrun, sizeof torchrun); /* both paths filled for the message */
    bool peer = have_python && have_torchrun && access(script, R_OK) == 0;
    bool llama_peer = have_python && have_torchrun && access(llama_script, R_OK) == 0;
    if (!peer)
        fprintf(stderr, "bench_train: %s, %s or %s missing: the PyTorch 2.x GPT peers are skipped\n", script, python,
                torchrun);
    if (!llama_peer)
        fprintf(stderr, "bench_train: %s, %s or %s missing: the PyTorch 2.x Llama peers are skipped\n", llama_script,
                python, torchrun);

    int status = 0;
    for (int w = 0; w < n_want; w++) {
        const struct bench_config *c = want[w];
        if (c->family) {
            status |= bench_llama_config(build, dir, data, torchrun, llama_script, llama_peer, c, rounds);
            continue;
        }
        struct figure best_fs = {0}, best_bf = {0}, best_ns = {0}, best_one = {0}, best_nopf = {0}, best_fwpf = {0}, f;
        double best_torch[4] = {NAN, NAN, NAN, NAN};
        for (int r = 0; r < rounds; r++) {
            for (int m = 0; peer && m < 4; m++) {
                double t = run_torch(python, torchrun, script, dir, c, r, (enum torch_mode)m);
                if (isfinite(t) && !(t <= best_torch[m]))
                    best_torch[m] = t;
            }
            if (run_fsdp(build, dir, data, c, "FULL_SHARD", WORLD, r, &f) == 0 && f.tokens_per_s > best_fs.tokens_per_s)
                best_fs = f;
            if (run_fsdp_with(build, dir, data, c, "FULL_SHARD", "--fsdp.mixed_precision=bf16", WORLD, r, &f) == 0 &&
                f.tokens_per_s > best_bf.tokens_per_s)
                best_bf = f;
            if (run_fsdp(build, dir, data, c, "NO_SHARD", WORLD, r, &f) == 0 && f.tokens_per_s > best_ns.tokens_per_s)
                best_ns = f;
            /* Prefetch off, and forward prefetch on top of the default BACKWARD_PRE: does prefetching overlap? */
            if (run_fsdp_with(build, dir, data, c, "FULL_SHARD", "--fsdp.backward_prefetch=NO_PREFETCH", WORLD, r, &f) == 0 &&
                f.tokens_per_s > best_nopf.tokens_per_s)
                best_nopf = f;
            if (run_fsdp_with(build, dir, data, c, "FULL_SHARD", "--fsdp.forward_prefetch=true", WORLD, r, &f) == 0 &&
                f.tokens_per_s > best_fwpf.tokens_per_s)
                best_fwpf = f;
            /* One rank with the same per-rank batch: what perfect scaling would double. */
            if (run_fsdp(build, dir, data, c, "NO_SHARD", 1, r, &f) == 0 && f.tokens_per_s > best_one.tokens_per_s)
                best_one = f;
            fprintf(stderr,
                    "bench_train: config %s round %d: best so far torch FSDP2 %.0f, FSDP2 bf16 %.0f, DDP %.0f, "
                    "one process %.0f; FULL_SHARD %.0f, FULL_SHARD bf16 %.0f, NO_SHARD %.0f, one rank %.0f tokens/s\n",
                    c->name, r, best_torch[TORCH_FSDP2], best_torch[TORCH_FSDP2_BF16], best_torch[TORCH_DDP],
                    best_torch[TORCH_SINGLE], best_fs.tokens_per_s, best_bf.tokens_per_s, best_ns.tokens_per_s,
                    best_one.tokens_per_s);
        }
        if (best_fs.tokens_per_s <= 0 || best_ns.tokens_per_s <= 0 || best_bf.tokens_per_s <= 0) {
            fprintf(stderr, "bench_train: config %s: fsdp-worker failed\n", c->name);
            status = 1;
            continue;
        }
        const struct figure *fig[3] = {&best_fs, &best_bf, &best_ns};
        const char *name[3] = {"FULL_SHARD", "FULL_SHARD", "NO_SHARD"}, *prec[3] = {"fp32", "bf16", "fp32"};
        for (int s = 0; s < 3; s++) {
            const struct figure *x = fig[s];
            /* the same precision's FSDP2 is the peer of each line */
            double fsdp2 = best_torch[s == 1 ? TORCH_FSDP2_BF16 : TORCH_FSDP2];
            /* Same FLOPs per token; the MFU of each run is against its own dtype's peak. */
            double torch_mfu = x->mfu * fsdp2 / x->tokens_per_s;
            /* Share of the run's step time the slowest rank spent waiting for collectives (approximate: the
             * median step stands for every step, warm-up included). */
            double steps_s = (c->warmup + c->steps) * (double)c->batch_per_rank * WORLD * c->t / x->tokens_per_s;
            double wait_frac = (x->gather_wait_s + x->reduce_wait_s) / steps_s;
            printf("bench=train config=%s strategy=%s precision=%s world=%d params=%lld batch_per_rank=%d seq=%d "
                   "tokens_per_s=%.0f mfu=%.4f torch_fsdp2_tokens_per_s=%.0f torch_fsdp2_mfu=%.4f ratio=%.3f "
                   "torch_ddp_tokens_per_s=%.0f ddp_ratio=%.3f no_shard_ratio=%.3f one_rank_tokens_per_s=%.0f "
                   "scaling=%.3f gather_wait_s=%.3f reduce_wait_s=%.3f wait_frac=%.3f run_s=%.1f rounds=%d%s\n",
                   c->name, name[s], prec[s], WORLD, x->params, c->batch_per_rank, c->t, x->tokens_per_s, x->mfu, fsdp2,
                   torch_mfu, x->tokens_per_s / fsdp2, best_torch[TORCH_DDP], x->tokens_per_s / best_torch[TORCH_DDP],
                   x->tokens_per_s / best_ns.tokens_per_s, best_one.tokens_per_s,
                   x->tokens_per_s / (WORLD * best_one.tokens_per_s), x->gather_wait_s, x->reduce_wait_s, wait_frac,
                   x->run_s, rounds, peer ? "" : " note=peer_skipped");
        }
        /* the slowest rank's time blocked waiting for all-gathers: what prefetch hides */
        const struct figure *pf[3] = {&best_nopf, &best_fs, &best_fwpf};
        const char *pfname[3] = {"none", "backward_pre", "backward_pre+forward"};
        for (int k = 0; k < 3; k++)
            if (pf[k]->tokens_per_s > 0)
                printf("bench=train_prefetch config=%s strategy=FULL_SHARD world=%d prefetch=%s tokens_per_s=%.0f "
                       "gather_wait_s=%.3f vs_no_prefetch=%.3f\n",
                       c->name, WORLD, pfname[k], pf[k]->tokens_per_s, pf[k]->gather_wait_s,
                       best_nopf.tokens_per_s > 0 ? pf[k]->tokens_per_s / best_nopf.tokens_per_s : NAN);
        if (peer)
            printf("bench=train_one_rank config=%s tokens_per_s=%.0f torch_tokens_per_s=%.0f ratio=%.3f "
                   "torch_fsdp2_scaling=%.3f torch_ddp_scaling=%.3f fsdp_full_shard_scaling=%.3f\n",
                   c->name, best_one.tokens_per_s, best_torch[TORCH_SINGLE],
                   best_one.tokens_per_s / best_torch[TORCH_SINGLE],
                   best_torch[TORCH_FSDP2] / (WORLD * best_torch[TORCH_SINGLE]),
                   best_torch[TORCH_DDP] / (WORLD * best_torch[TORCH_SINGLE]),
                   best_fs.tokens_per_s / (WORLD * best_one.tokens_per_s));
        if (peer) {
            double g1 = best_fs.tokens_per_s / best_torch[TORCH_FSDP2];
            double g2 = best_bf.tokens_per_s / best_torch[TORCH_FSDP2_BF16];
            double g3 = best_fs.tokens_per_s / best_torch[TORCH_DDP], g4 = best_fs.tokens_per_s / best_ns.tokens_per_s;
            printf("bench=train_goals config=%s full_shard_vs_fsdp2=%.3f goal_fsdp2=%s bf16_vs_fsdp2_bf16=%.3f "
                   "goal_fsdp2_bf16=%s bf16_vs_fp32=%.3f full_shard_vs_ddp=%.3f goal_ddp=%s "
                   "full_shard_vs_no_shard=%.3f goal_no_shard=%s\n",
                   c->name, g1, g1 >= 1.5 ? "met" : "missed", g2, g2 >= 1.5 ? "met" : "missed",
                   best_bf.tokens_per_s / best_fs.tokens_per_s, g3, g3 >= 1.5 ? "met" : "missed", g4,
                   g4 >= 0.9 ? "met" : "missed");
        }
        fflush(stdout);
    }
    rm_rf(dir);
    return status;
}
