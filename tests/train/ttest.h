/* Helpers of the training tests: a tiny GPT config over byte tokens of a frozen text corpus, runs of
 * the real fsdp-worker (alone, or under the real fsdp-launch) in a mkdtemp directory, and readers of what
 * a run leaves behind: metrics.jsonl rows, every rank's run summary (the values of the run) and the log
 * lines of every rank (for what a user reads). Header-only so each test binary stays one file. */
#ifndef FSDP_TESTS_TRAIN_TTEST_H
#define FSDP_TESTS_TRAIN_TTEST_H

#include <cjson/cJSON.h>
#include <math.h>

#include "tests/util/launch_util.h"
#include "tests/util/tu_summary.h"

/* Generous: a loaded 2-core machine runs several of these at once, under ASan in CI. */
#define TT_RUN_TIMEOUT_S 240.0

/* The configuration the lead checked by hand (LU_TINY_GPT), a log line every 10 steps. */
static const char tt_tiny_ini[] = LU_TINY_GPT "[log]\ninterval = 10\n";

/* The tiny Llama: grouped-query attention (2 query heads per key/value head), untied head, and the tiny
 * GPT's batch and schedule. */
static const char tt_llama_ini[] = LU_TINY_LLAMA "[log]\ninterval = 10\n";

struct tt_ctx {
    char *dir;       /* mkdtemp; everything a test writes lives here */
    char ini[1024];   /* dir/tiny.ini, data paths filled in */
    char data[1024]; /* dir/data: train.bin, val.bin */
};

/* What one run left: exit code (-1000 = timed out), the launcher's (or worker's) streams, its log dir. */
struct tt_result {
    int code;
    char *out, *err;
    char logdir[2200];
};

/* Makes the tmpdir, the byte-level token files (fsdp-prepare-data over tests/data/corpus/) and tiny.ini
 * from base (tt_tiny_ini, tt_llama_ini) with the data paths. */
static inline void tt_setup_ini(struct tt_ctx *c, const char *base)
{
    memset(c, 0, sizeof *c);
    char dir[64];
    c->dir = strdup(tu_mkdtemp(dir, sizeof dir, "fsdp-train-test"));
    cr_assert_not_null(c->dir);
    snprintf(c->data, sizeof c->data, "%s/data", c->dir);
    lu_prepare_corpus(c->dir, c->data);
    char text[8192];
    snprintf(text, sizeof text, "%s[data]\ntrain_file = %s/train.bin\nval_file = %s/val.bin\n", base, c->data,
             c->data);
    snprintf(c->ini, sizeof c->ini, "%s/tiny.ini", c->dir);
    lu_write_text(c->ini, text);
}

/* The tiny GPT-2. */
static inline void tt_setup(struct tt_ctx *c)
{
    tt_setup_ini(c, tt_tiny_ini);
}

/* The tiny Llama. */
static inline void tt_setup_llama(struct tt_ctx *c)
{
    tt_setup_ini(c, tt_llama_ini);
}

static inline void tt_teardown(struct tt_ctx *c)
{
    if (c->dir)
        lu_rm_rf(c->dir);
    free(c->dir);
    c->dir = NULL;
}

static inline void tt_result_free(struct tt_result *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* Runs `fsdp-launch --standalone --nproc_per_node world fsdp-worker ini --log.dir=... --checkpoint.dir=...
 * extra...` (world 0: fsdp-worker alone, no launcher and no torchrun environment) with one OpenMP thread
 * per rank. tag names the run's directory under c->dir; extra ends with NULL; env_extra (NULL-terminated,
 * may be NULL) adds KEY=VALUE settings to the runs' environment. */
static inline void tt_run_ini_env(const struct tt_ctx *c, const char *ini, int world, const char *tag,
                                  const char *const *extra, const char *const *env_extra, struct tt_result *r)
{
    memset(r, 0, sizeof *r);
    char rundir[FSDP_PATH_MAX], ckdir[FSDP_PATH_MAX];
    tu_pathf(rundir, sizeof rundir, "%s/%s", c->dir, tag);
    cr_assert(mkdir(rundir, 0755) == 0, "run tag %s used twice", tag);
    tu_pathf(r->logdir, sizeof r->logdir, "%s/log", rundir);
    tu_pathf(ckdir, sizeof ckdir, "%s/ckpt", rundir);
    struct lu_worker_run w = {.dir = rundir, .tag = "run", .world = world, .ini = ini, .log_dir = r->logdir,
                              .ckpt_dir = ckdir, .args = extra, .env = env_extra, .timeout_s = TT_RUN_TIMEOUT_S};
    r->code = lu_worker_run(&w);
    r->out = lu_slurp_tag(rundir, "run", "out");
    r->err = lu_slurp_tag(rundir, "run", "err");
}

static inline void tt_run_ini(const struct tt_ctx *c, const char *ini, int world, const char *tag,
                              const char *const *extra, struct tt_result *r)
{
    tt_run_ini_env(c, ini, world, tag, extra, NULL, r);
}

static inline void tt_run(const struct tt_ctx *c, int world, const char *tag, const char *const *extra,
                          struct tt_result *r)
{
    tt_run_ini(c, c->ini, world, tag, extra, r);
}

/* Runs and asserts success, showing the tail of stderr when it fails. */
static inline void tt_run_ok(const struct tt_ctx *c, int world, const char *tag, const char *const *extra,
                             struct tt_result *r)
{
    tt_run(c, world, tag, extra, r);
    size_t len = strlen(r->err);
    cr_assert_eq(r->code, 0, "run %s (world %d) exited with %d:\n%s", tag, world, r->code,
                 r->err + (len > 3000 ? len - 3000 : 0));
}

/* Values of `key` in each row of metrics.jsonl, NAN where a row lacks it; returns the row count. */
static inline int tt_metric(const struct tt_result *r, const char *key, double *v, int max)
{
    return lu_metrics_read(r->logdir, key, NULL, v, max);
}

/* Largest relative difference |a - b| / |b| over n values (infinite when either is not finite). */
static inline double tt_max_rel(const double *a, const double *b, int n)
{
    double worst = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return INFINITY;
        double d = fabs(a[i] - b[i]) / fabs(b[i]);
        worst = d > worst ? d : worst;
    }
    return worst;
}

enum { TT_STEPS = 20 };

/* The per-step losses of a finished run; asserts one row per step. */
static inline void tt_losses(const struct tt_result *r, double *loss)
{
    int n = tt_metric(r, "loss", loss, TT_STEPS + 1);
    cr_assert_eq(n, TT_STEPS, "%s: %d metric rows, expected %d", r->logdir, n, TT_STEPS);
}

/* Asserts the losses of r are within rel of ref step by step; returns the largest difference seen. */
static inline double tt_assert_losses(const struct tt_result *r, const double *ref, double rel, const char *what)
{
    double loss[TT_STEPS];
    tt_losses(r, loss);
    double d = tt_max_rel(loss, ref, TT_STEPS);
    cr_assert(d <= rel, "%s: losses differ from the reference by %.3g relative (bound %.3g); step 19: %.9g vs %.9g",
              what, d, rel, loss[TT_STEPS - 1], ref[TT_STEPS - 1]);
    return d;
}

/* Rank `rank`'s run summary (log.dir/run_summary.rank<R>.json; rank -1, a lone worker, is rank 0),
 * asserted present; the caller cJSON_Delete()s it. */
static inline cJSON *tt_summary(const struct tt_result *r, int rank)
{
    cJSON *s = tu_summary_load(r->logdir, rank < 0 ? 0 : rank);
    size_t len = r->err ? strlen(r->err) : 0;
    cr_assert_not_null(s, "rank %d left no run summary in %s:\n%s", rank, r->logdir,
                       r->err ? r->err + (len > 3000 ? len - 3000 : 0) : "");
    return s;
}

/* The number at a dotted path of a run summary ("memory.peak_rss_bytes"), asserted present. */
static inline double tt_num(const cJSON *summary, const char *path)
{
    double v = tu_json_num(summary, path);
    cr_assert(!isnan(v), "the run summary has no number at %s", path);
    return v;
}

/* Whether rank `rank`'s run summary matches pattern (tu_json_matches). */
static inline bool tt_summary_matches(const struct tt_result *r, int rank, const char *pattern)
{
    cJSON *s = tt_summary(r, rank);
    bool ok = tu_json_matches(s, pattern);
    cJSON_Delete(s);
    return ok;
}

/* How many lines of s contain both a and b (b may be NULL). */
static inline int tt_count_lines(const char *s, const char *a, const char *b)
{
    int n = 0;
    for (const char *p = s; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char *line = strndup(p, len);
        n += strstr(line, a) && (!b || strstr(line, b));
        free(line);
        p = nl ? nl + 1 : NULL;
    }
    return n;
}

/* The line of rank `rank` (the "[rank N] " prefix; -1 = a lone worker without one) containing key, or
 * NULL; the caller frees it. */
static inline char *tt_rank_line(const char *s, int rank, const char *key)
{
    char tag[32];
    snprintf(tag, sizeof tag, "[rank %d] ", rank);
    for (const char *p = s; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char *line = strndup(p, len);
        if (strstr(line, key) && (rank < 0 ? !strstr(line, "[rank ") : strstr(line, tag) != NULL))
            return line;
        free(line);
        p = nl ? nl + 1 : NULL;
    }
    return NULL;
}

/* One point of the parity matrix: strategy x version x prefetch (true: BACKWARD_PRE + forward_prefetch;
 * false: NO_PREFETCH) at a world size, its losses checked against ref. HYBRID_* shard over pairs of ranks at
 * even worlds and over single ranks at odd ones (the shard size must divide the world). */
static inline double tt_parity_point(const struct tt_ctx *c, const char *strategy, int version, bool prefetch,
                                     int world, const double *ref, double rel)
{
    char tag[128], strat[96], ver[32], hyb[48];
    snprintf(tag, sizeof tag, "%s-v%d-%s-w%d", strategy, version, prefetch ? "pre" : "none", world);
    snprintf(strat, sizeof strat, "--fsdp.sharding_strategy=%s", strategy);
    snprintf(ver, sizeof ver, "--fsdp.version=%d", version);
    snprintf(hyb, sizeof hyb, "--fsdp.hybrid_shard_size=%d", world % 2 == 0 ? 2 : 1);
    const char *extra[] = {strat,
                           ver,
                           prefetch ? "--fsdp.backward_prefetch=BACKWARD_PRE" : "--fsdp.backward_prefetch=NO_PREFETCH",
                           prefetch ? "--fsdp.forward_prefetch=true" : "--fsdp.forward_prefetch=false",
                           strncmp(strategy, "HYBRID", 6) == 0 ? hyb : NULL,
                           NULL};
    struct tt_result r;
    tt_run_ok(c, world, tag, extra, &r);
    double d = tt_assert_losses(&r, ref, rel, tag);
    tt_result_free(&r);
    return d;
}

/* The reference: FULL_SHARD (the default), version 2, one rank under the launcher. */
static inline void tt_reference(const struct tt_ctx *c, double *ref)
{
    struct tt_result r;
    tt_run_ok(c, 1, "reference", NULL, &r);
    tt_losses(&r, ref);
    tt_result_free(&r);
}

#endif
