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

/* Runs fsdp-launch --standalone --nproc_per_node world fsdp-worker tiny.ini args...; returns the exit code. */
static inline int job_run(struct job *j, const char *tag, int world, const char *const *args, const char *const *env)
{
    const char *argv[40];
    int n = 0;
    char nproc[16], logdir[4300];
    snprintf(nproc, sizeof nproc, "%d", world);
    snprintf(logdir, sizeof logdir, "--log.dir=%s/%s", j->dir, tag);
    argv[n++] = LU_LAUNCH;
    argv[n++] = "--standalone";
    argv[n++] = "--nproc_per_node";
    argv[n++] = nproc;
    argv[n++] = "--max_restarts";
    argv[n++] = "3";
    argv[n++] = lu_build_path("worker/fsdp-worker");
    argv[n++] = j->ini;
    argv[n++] = logdir;
    for (int i = 0; args && args[i]; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    const char *envs[16] = {"OMP_NUM_THREADS=1"};
    int m = 1;
    for (int i = 0; env && env[i]; i++)
        envs[m++] = env[i];
    envs[m] = NULL;
    pid_t p = lu_spawn(argv, j->dir, tag, envs);
    return lu_exit_code(lu_wait(p, 240));
}

/* Losses of metrics.jsonl of run `tag` as text (exact digits) and numbers; steps in file order. */
static inline int losses(struct job *j, const char *tag, char text[][32], double *val, int cap)
{
    char p[FSDP_PATH_MAX];
    snprintf(p, sizeof p, "%s/%s/metrics.jsonl", j->dir, tag);
    char *s = tu_slurp(p);
    int n = 0;
    for (char *at = strstr(s, "\"loss\":"); at && n < cap; at = strstr(at + 1, "\"loss\":")) {
        at += strlen("\"loss\":");
        size_t len = strcspn(at, ",}");
        snprintf(text[n], 32, "%.*s", (int)len, at);
        val[n] = atof(text[n]);
        n++;
    }
    free(s);
    return n;
}

static inline char *opt(const char *fmt, const char *a, const char *b)
{
    char *s = malloc(4400);
    snprintf(s, 4400, fmt, a, b);
    return s;
}

/* fsdp-worker tiny.ini args... as one rank without a launcher (run id "local"); returns the exit code. */
static inline int job_run_alone(struct job *j, const char *tag, const char *const *args, const char *const *env)
{
    const char *argv[40];
    int n = 0;
    char logdir[FSDP_PATH_MAX + 32]; /* + 32: "--key=" and a path */
    snprintf(logdir, sizeof logdir, "--log.dir=%s/%s", j->dir, tag);
    argv[n++] = lu_build_path("worker/fsdp-worker");
    argv[n++] = j->ini;
    argv[n++] = logdir;
    for (int i = 0; args && args[i]; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    const char *envs[16] = {"OMP_NUM_THREADS=1"};
    int m = 1;
    for (int i = 0; env && env[i]; i++)
        envs[m++] = env[i];
    envs[m] = NULL;
    pid_t p = lu_spawn(argv, j->dir, tag, envs);
    return lu_exit_code(lu_wait(p, 240));
}

#endif
