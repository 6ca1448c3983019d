/* Shared by the resume tests: a temp dir with the tiny config and byte-level tokens of the frozen corpus,
 * jobs run through fsdp-launch (or fsdp-worker alone), and the losses of a run's metrics.jsonl.
 * Header-only, so each test binary stays one file. */
#ifndef FSDP_TESTS_RESUME_RTEST_H
#define FSDP_TESTS_RESUME_RTEST_H

#include "common/fs.h"
#include "tests/util/launch_util.h"

#define TINY LU_TINY_GPT
#define TINY_LLAMA LU_TINY_LLAMA

struct job {
    char *dir;
    char ini[FSDP_PATH_MAX], data[FSDP_PATH_MAX];
};

/* A temp dir with byte-level tokens of the frozen text corpus (tests/data/corpus) and the config model
 * (TINY or TINY_LLAMA). */
static inline void job_setup_model(struct job *j, const char *model)
{
    j->dir = lu_tmpdir();
    snprintf(j->data, sizeof j->data, "%s/data", j->dir);
    lu_prepare_corpus(j->dir, j->data);
    char text[8192];
    snprintf(text, sizeof text, "%s[data]\ntrain_file = %s/train.bin\n", model, j->data);
    snprintf(j->ini, sizeof j->ini, "%s/tiny.ini", j->dir);
    lu_write_text(j->ini, text);
}

/* The tiny GPT-2. */
static inline void job_setup(struct job *j)
{
    job_setup_model(j, TINY);
}

/* Runs fsdp-launch --standalone --nproc_per_node world --max_restarts 3 fsdp-worker tiny.ini
 * --log.dir=dir/tag args...; returns the exit code. */
static inline int job_run(struct job *j, const char *tag, int world, const char *const *args, const char *const *env)
{
    char logdir[FSDP_PATH_MAX];
    tu_pathf(logdir, sizeof logdir, "%s/%s", j->dir, tag);
    static const char *const restarts[] = {"--max_restarts", "3", NULL};
    struct lu_worker_run w = {.dir = j->dir, .tag = tag, .world = world, .launch_args = restarts, .ini = j->ini,
                              .log_dir = logdir, .args = args, .env = env, .timeout_s = 240};
    return lu_worker_run(&w);
}

/* Losses of metrics.jsonl of run `tag` as text (exact digits) and numbers; steps in file order. */
static inline int losses(struct job *j, const char *tag, char text[][32], double *val, int cap)
{
    char logdir[FSDP_PATH_MAX];
    return lu_metrics_read(tu_pathf(logdir, sizeof logdir, "%s/%s", j->dir, tag), "loss", text, val, cap);
}

/* A fresh "--key=..." argument that holds a path (fmt with two strings); the caller frees it. */
static inline char *opt(const char *fmt, const char *a, const char *b)
{
    size_t cap = FSDP_PATH_MAX + 32; /* + 32: "--key=" and a path */
    char *s = malloc(cap);
    cr_assert_not_null(s);
    return tu_pathf(s, cap, fmt, a, b);
}

/* fsdp-worker tiny.ini --log.dir=dir/tag args... as one rank without a launcher (run id "local"); returns the
 * exit code. */
static inline int job_run_alone(struct job *j, const char *tag, const char *const *args, const char *const *env)
{
    return job_run(j, tag, 0, args, env);
}

#endif
