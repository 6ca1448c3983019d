/* `fsdp-launch status LOG_DIR` on a long run: wall time of the real program rendering the page of a
 * metrics.jsonl of N lines (default 1,000,000, as the worker writes them: step, loss, lr, grad_norm,
 * tokens/s, a val_loss every 100 steps), beside `wc -l` on the same file in the same run (the cost of just
 * reading it). Prints `bench=status_render lines=N lines_per_s=X ...`; issue 28 asks for at least a million
 * lines a second (the reader was quadratic: a 200,000-step run did not render in 300 s). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "tests/util/tu_proc.h"

#define RUNS 5

/* Runs argv with stdout and stderr discarded; seconds, or -1 when it failed. */
static double time_run(char *const argv[])
{
    double t0 = tu_now();
    pid_t p = fork();
    if (p == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    waitpid(p, &st, 0);
    double dt = tu_now() - t0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? dt : -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void)
{
    const char *build = getenv("FSDP_BUILD_ROOT");
    if (!build) {
        fprintf(stderr, "FSDP_BUILD_ROOT not set: run with meson test --benchmark\n");
        return 1;
    }
    long lines = getenv("BENCH_STATUS_LINES") ? atol(getenv("BENCH_STATUS_LINES")) : 1000000;
    if (lines < 1 || lines > 100000000) {
        fprintf(stderr, "BENCH_STATUS_LINES=%s: give 1 to 100000000\n", getenv("BENCH_STATUS_LINES"));
        return 1;
    }
    char dir[] = "/tmp/fsdp-bench-status-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char launch[FSDP_PATH_MAX], metrics[FSDP_PATH_MAX], summary[FSDP_PATH_MAX], out[FSDP_PATH_MAX];
    snprintf(launch, sizeof launch, "%s/launcher/fsdp-launch", build);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    snprintf(summary, sizeof summary, "%s/run_summary.rank0.json", dir);
    snprintf(out, sizeof out, "%s/page.html", dir);
    FILE *f = fopen(metrics, "w");
    if (!f) {
        perror(metrics);
        return 1;
    }
    for (long i = 0; i < lines; i++) {
        fprintf(f, "{\"step\":%ld,\"loss\":%.6g,\"lr\":0.0003,\"grad_norm\":%.5g,\"tokens_per_s\":%ld", i,
                6.0 - (double)i * 1e-6, 1.0 + (double)(i % 13) * 0.01, 120000 + i % 977);
        fputs(i % 100 == 99 ? ",\"val_loss\":4.25}\n" : "}\n", f);
    }
    fclose(f);
    FILE *s = fopen(summary, "w");
    if (!s) {
        perror(summary);
        return 1;
    }
    fprintf(s, "{\"world_size\":1,\"run_id\":\"bench\",\"steps\":{\"first\":0,\"run\":%ld,\"max_steps\":%ld}}\n",
            lines, lines);
    fclose(s);

    double t[RUNS], w[RUNS];
    for (int i = 0; i < RUNS; i++) {
        char *argv[] = {launch, "status", dir, "-o", out, NULL};
        char *wc[] = {"/usr/bin/wc", "-l", metrics, NULL};
        t[i] = time_run(argv);
        w[i] = time_run(wc);
        if (t[i] < 0 || w[i] < 0) {
            fprintf(stderr, "run %d failed: fsdp-launch status %s (%.3f s), wc -l (%.3f s)\n", i, dir, t[i], w[i]);
            return 1;
        }
    }
    qsort(t, RUNS, sizeof t[0], cmp_double);
    qsort(w, RUNS, sizeof w[0], cmp_double);
    double tm = t[RUNS / 2], wm = w[RUNS / 2];
    printf("bench=status_render lines=%ld lines_per_s=%.0f median_s=%.3f min_s=%.3f max_s=%.3f "
           "wc_lines_per_s=%.0f ratio_vs_wc=%.2f\n",
           lines, (double)lines / tm, tm, t[0], t[RUNS - 1], (double)lines / wm, wm / tm);
    char rm[FSDP_PATH_MAX];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    tu_sh(rm);
    return 0;
}
