/* Helpers of the integration tests (launcher, train, resume): run the project's programs with files for
 * their output, wait with deadlines, find the port node 0 printed, and check which worker pids are still
 * alive. Criterion asserts inside; header-only, each test binary is one file. */
#ifndef FSDP_TESTS_UTIL_LAUNCH_UTIL_H
#define FSDP_TESTS_UTIL_LAUNCH_UTIL_H

#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/fs.h"
#include "tests/util/tu_check.h"
#include "tests/util/tu_file.h"
#include "tests/util/tu_proc.h"

/* tu_build_path in one of four rotating static buffers, so a few can sit in one argv. */
static inline const char *lu_build_path(const char *rel)
{
    static char buf[4][4096];
    static int k;
    return tu_build_path(buf[k++ % 4], sizeof buf[0], rel);
}

#define LU_LAUNCH lu_build_path("launcher/fsdp-launch")
#define LU_PROBE lu_build_path("tests/launcher/launch-probe")

static inline char *lu_tmpdir(void)
{
    char d[64];
    char *s = strdup(tu_mkdtemp(d, sizeof d, "fsdp-launch-test"));
    cr_assert_not_null(s);
    return s;
}

/* Starts argv[0] with stdout/stderr to files under dir (named tag.out / tag.err); env_set entries are
 * "NAME=value" (value empty with a trailing '=' means unset). */
static inline pid_t lu_spawn(const char *const *argv, const char *dir, const char *tag, const char *const *env_set)
{
    char out[FSDP_PATH_MAX], err[FSDP_PATH_MAX];
    tu_pathf(out, sizeof out, "%s/%s.out", dir, tag);
    tu_pathf(err, sizeof err, "%s/%s.err", dir, tag);
    /* the test runner's own thread count is not the program's: unset unless env_set gives one */
    const char *env[64] = {"OMP_NUM_THREADS="};
    int n = 1;
    for (int i = 0; env_set && env_set[i]; i++) {
        cr_assert(n < 63, "too many environment settings");
        env[n++] = env_set[i];
    }
    env[n] = NULL;
    pid_t pid = tu_spawn(argv, out, err, env);
    cr_assert(pid >= 0, "fork failed");
    return pid;
}

/* Waits up to timeout_s; returns the wait status, or -1 after killing a process that overran. */
static inline int lu_wait(pid_t pid, double timeout_s)
{
    double end = tu_now() + timeout_s;
    int st;
    while (tu_now() < end) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return st;
        tu_nap(0.01);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

static inline int lu_exit_code(int st)
{
    if (st == -1)
        return -1000; /* timed out */
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Writes text to path, asserting it could. */
static inline void lu_write_text(const char *path, const char *text)
{
    cr_assert_eq(tu_write_text(path, text), 0, "cannot write %s: %s", path, strerror(errno));
}

static inline char *lu_slurp_tag(const char *dir, const char *tag, const char *ext)
{
    char p[FSDP_PATH_MAX];
    return tu_slurp(tu_pathf(p, sizeof p, "%s/%s.%s", dir, tag, ext));
}

/* The port node 0 printed ("store listening on ADDR:PORT"), or -1 after timeout_s. */
static inline int lu_read_port(const char *dir, const char *tag, double timeout_s)
{
    double end = tu_now() + timeout_s;
    while (tu_now() < end) {
        char *s = lu_slurp_tag(dir, tag, "err");
        char *p = strstr(s, "fsdp-launch: store listening on ");
        char *nl = p ? strchr(p, '\n') : NULL;
        if (p && nl) {
            *nl = 0;
            int port = atoi(strrchr(p, ':') + 1);
            free(s);
            return port;
        }
        free(s);
        tu_nap(0.02);
    }
    return -1;
}

static inline bool lu_pid_alive(int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char buf[512] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

/* Waits until dir/pid.<r> exists for r in [0, n) and reads them. Returns how many were found. */
static inline int lu_read_pids(const char *dir, int n, int *pids, double timeout_s)
{
    double end = tu_now() + timeout_s;
    int found = 0;
    while (tu_now() < end) {
        found = 0;
        for (int r = 0; r < n; r++) {
            char p[FSDP_PATH_MAX];
            snprintf(p, sizeof p, "%s/pid.%d", dir, r);
            FILE *f = fopen(p, "r");
            if (f) {
                found += fscanf(f, "%d", &pids[r]) == 1;
                fclose(f);
            }
        }
        if (found == n)
            break;
        tu_nap(0.02);
    }
    return found;
}

/* Seconds until none of the pids lives, or -1 if some still live after timeout_s. */
static inline double lu_wait_pids_dead(const int *pids, int n, double timeout_s)
{
    double t0 = tu_now();
    while (tu_now() - t0 < timeout_s) {
        bool any = false;
        for (int i = 0; i < n; i++)
            any = any || lu_pid_alive(pids[i]);
        if (!any)
            return tu_now() - t0;
        tu_nap(0.02);
    }
    return -1;
}

/* One run of the real fsdp-worker for the training and resume tests: alone (world 0, no launcher) or as
 * world ranks under `fsdp-launch --standalone --nproc_per_node world launch_args...`, with argv
 * `fsdp-worker ini --log.dir=log_dir [--checkpoint.dir=ckpt_dir] args...`. */
struct lu_worker_run {
    const char *dir, *tag;          /* the streams go to dir/tag.{out,err} */
    int world;                      /* 0: fsdp-worker alone */
    const char *const *launch_args; /* more fsdp-launch options (NULL-terminated; may be NULL) */
    const char *ini, *log_dir;
    const char *ckpt_dir;           /* NULL: no --checkpoint.dir */
    const char *const *args;        /* more fsdp-worker arguments (NULL-terminated; may be NULL) */
    const char *const *env;         /* more KEY=VALUE settings (NULL-terminated; may be NULL) */
    double timeout_s;
};

/* Runs it with one OpenMP thread per rank, and without the torchrun-style variables the test runner may
 * have inherited (they must not make a lone worker a rank); returns the exit code (-1000: timed out). */
static inline int lu_worker_run(const struct lu_worker_run *w)
{
    char nproc[16], logarg[FSDP_PATH_MAX + 32], ckarg[FSDP_PATH_MAX + 32]; /* + 32: "--key=" and a path */
    snprintf(nproc, sizeof nproc, "%d", w->world);
    tu_pathf(logarg, sizeof logarg, "--log.dir=%s", w->log_dir);
    const char *argv[64];
    int n = 0;
    if (w->world > 0) {
        argv[n++] = LU_LAUNCH;
        argv[n++] = "--standalone";
        argv[n++] = "--nproc_per_node";
        argv[n++] = nproc;
        for (int i = 0; w->launch_args && w->launch_args[i]; i++)
            argv[n++] = w->launch_args[i];
    }
    argv[n++] = lu_build_path("worker/fsdp-worker");
    argv[n++] = w->ini;
    argv[n++] = logarg;
    if (w->ckpt_dir)
        argv[n++] = tu_pathf(ckarg, sizeof ckarg, "--checkpoint.dir=%s", w->ckpt_dir);
    for (int i = 0; w->args && w->args[i]; i++) {
        cr_assert(n < 62, "too many arguments");
        argv[n++] = w->args[i];
    }
    argv[n] = NULL;
    static const char *const base_env[] = {"OMP_NUM_THREADS=1", "RANK=", "WORLD_SIZE=", "LOCAL_RANK=",
                                           "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=", "FSDP_STORE_PREFIX=",
                                           "FSDP_STORE_PORT=", "TORCHELASTIC_RUN_ID=", "FSDP_LOG_LEVEL=", NULL};
    const char *env[32];
    int ne = 0;
    for (int i = 0; base_env[i]; i++)
        env[ne++] = base_env[i];
    for (int i = 0; w->env && w->env[i]; i++) {
        cr_assert(ne < 31, "too many environment settings");
        env[ne++] = w->env[i];
    }
    env[ne] = NULL;
    return lu_exit_code(lu_wait(lu_spawn(argv, w->dir, w->tag, env), w->timeout_s));
}

/* The values of key in each row of log_dir/metrics.jsonl, NAN where a row lacks it or it is not a number,
 * and (text, may be NULL) as the file writes them (exact digits, "" where absent); returns the row count,
 * asserting at most max. */
static inline int lu_metrics_read(const char *log_dir, const char *key, char (*text)[32], double *v, int max)
{
    char path[FSDP_PATH_MAX], pat[64];
    tu_pathf(path, sizeof path, "%s/metrics.jsonl", log_dir);
    snprintf(pat, sizeof pat, "\"%s\":", key);
    char *s = tu_read_ok(path, NULL), *line = s;
    size_t bytes = strlen(s);
    int n = 0;
    for (char *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        cr_assert(line[0] == '{' && line[strlen(line) - 1] == '}', "%s row %d is not a JSON object: %s", path, n,
                  line);
        cr_assert(n < max, "more than %d rows in %s", max, path);
        char *at = strstr(line, pat);
        size_t len = at ? strcspn(at += strlen(pat), ",}") : 0;
        char digits[32];
        snprintf(digits, sizeof digits, "%.*s", (int)len, at ? at : "");
        if (text)
            snprintf(text[n], 32, "%s", digits);
        char *end;
        double x = strtod(digits, &end);
        v[n++] = end > digits ? x : NAN; /* absent, or not a number (null) */
    }
    cr_assert(!line || line == s + bytes, "%s has an empty row after row %d", path, n);
    free(s);
    return n;
}

/* tu_rm_tree under the name the integration tests of every folder call. */
static inline void lu_rm_rf(const char *dir) { tu_rm_tree(dir); }

/* The tiny models of the training and resume tests: 20 steps of 12 sequences on the CPU whatever the host
 * has (the suite runs as on a GPU host: FSDP_TEST_GPU_HOST, tests/meson.build). GPT-2: 34k parameters;
 * Llama: grouped-query attention (2 query heads per key/value head) and an untied head. A test appends its
 * own sections ([data], [log], ...). */
#define LU_TINY_TRAIN                                                                                          \
    "[train]\ndevice = cpu\ntrain_batch = 12\nmicro_batch = 1\nmax_steps = 20\neval_interval = 0\n"          \
    "[optim]\nlr = 0.003\nwarmup_steps = 2\n"
#define LU_TINY_GPT                                                                                            \
    "[model]\nn_layer = 2\nn_head = 2\nn_embd = 32\nvocab_size = 256\nblock_size = 16\n" LU_TINY_TRAIN
#define LU_TINY_LLAMA                                                                                          \
    "[model]\nmodel_family = llama\nn_layer = 2\nn_head = 4\nn_kv_head = 2\nn_embd = 32\n"                    \
    "intermediate_size = 64\nvocab_size = 256\nblock_size = 16\n" LU_TINY_TRAIN

/* Byte-level token files (train.bin, val.bin) of the frozen text corpus (tests/data/corpus/) in data, made
 * by the real fsdp-prepare-data; its streams go to dir/prepare.{out,err}. */
static inline void lu_prepare_corpus(const char *dir, const char *data)
{
    char docs[FSDP_PATH_MAX];
    tu_source_path(docs, sizeof docs, "tests/data/corpus");
    const char *argv[] = {lu_build_path("worker/fsdp-prepare-data"), "-o", data, docs, NULL};
    int code = lu_exit_code(lu_wait(lu_spawn(argv, dir, "prepare", NULL), 120));
    char *err = lu_slurp_tag(dir, "prepare", "err");
    cr_assert_eq(code, 0, "fsdp-prepare-data failed (%d): %s", code, err);
    free(err);
}

#endif
