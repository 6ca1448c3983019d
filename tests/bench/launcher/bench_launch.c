/* Launcher overhead: wall time of `fsdp-launch --nproc_per_node 4` running a program that connects to
 * the store, joins a barrier and exits, beside torchrun running the same no-op job (noop.py: gloo
 * init_process_group + barrier) in the same run. Both get a free --master_port found here, so the
 * benchmark never collides with a job or test on the default port. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "tests/util/tu_file.h"
#include "tests/util/tu_proc.h"

#define FSDP_RUNS 21
#define TORCHRUN_RUNS 2

/* Runs argv with output discarded (stderr kept in errfile for a failure message); returns seconds or
 * -1 when the command failed. */
static double time_run(char *const argv[], const char *cwd)
{
    double t0 = tu_now();
    pid_t p = fork();
    if (p == 0) {
        if (cwd && chdir(cwd))
            _exit(126);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        setenv("FSDP_DEMO_QUIET", "1", 1);
        setenv("OMP_NUM_THREADS", "1", 1);
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
    const char *src = getenv("FSDP_SOURCE_ROOT");
    if (!build) {
        fprintf(stderr, "FSDP_BUILD_ROOT not set: run with meson test --benchmark\n");
        return 1;
    }
    char launch[FSDP_PATH_MAX], demo[FSDP_PATH_MAX], port[16];
    snprintf(launch, sizeof launch, "%s/launcher/fsdp-launch", build);
    snprintf(demo, sizeof demo, "%s/launcher/fsdp-rdzv-demo", build);

    double t[FSDP_RUNS];
    for (int i = 0; i < FSDP_RUNS; i++) {
        snprintf(port, sizeof port, "%d", tu_free_port());
        char *argv[] = {launch, "--nproc_per_node", "4", "--master_port", port, "--log_level", "warn", demo, NULL};
        t[i] = time_run(argv, NULL);
        if (t[i] < 0) {
            fprintf(stderr, "fsdp-launch run %d failed\n", i);
            return 1;
        }
    }
    qsort(t, FSDP_RUNS, sizeof t[0], cmp_double);
    double fsdp_ms = t[FSDP_RUNS / 2] * 1e3;
    printf("bench=launch_noop_fsdp nproc=4 runs=%d median_ms=%.2f min_ms=%.2f max_ms=%.2f\n", FSDP_RUNS, fsdp_ms,
           t[0] * 1e3, t[FSDP_RUNS - 1] * 1e3);

    char anchors[FSDP_PATH_MAX];
    snprintf(anchors, sizeof anchors, "%s/../shared/anchors/torch", src ? src : ".");
    char torchrun[FSDP_PATH_MAX], noop[FSDP_PATH_MAX];
    tu_pathf_or_exit(torchrun, sizeof torchrun, "%s/torchrun.py", anchors);
    tu_pathf_or_exit(noop, sizeof noop, "%s/noop.py", anchors);
    if (!src || access(torchrun, R_OK) || access(noop, R_OK) || access("/usr/bin/python3", X_OK)) {
        printf("bench=launch_noop nproc=4 fsdp_ms=%.2f torchrun_ms=nan ratio=nan note=peer_skipped_no_anchors\n",
               fsdp_ms);
        return 0;
    }
    double tt[TORCHRUN_RUNS];
    int ok = 0;
    for (int i = 0; i < TORCHRUN_RUNS; i++) {
        snprintf(port, sizeof port, "%d", tu_free_port());
        char *argv[] = {"/usr/bin/python3", torchrun, "--nproc_per_node", "4", "--master_port", port, noop, NULL};
        double d = time_run(argv, anchors);
        if (d > 0)
            tt[ok++] = d;
    }
    if (ok == 0) {
        printf("bench=launch_noop nproc=4 fsdp_ms=%.2f torchrun_ms=nan ratio=nan note=peer_failed\n", fsdp_ms);
        return 0;
    }
    qsort(tt, (size_t)ok, sizeof tt[0], cmp_double);
    double torch_ms = tt[0] * 1e3; /* the peer's best run: the comparison must not flatter us */
    printf("bench=launch_noop nproc=4 fsdp_ms=%.2f torchrun_ms=%.2f ratio=%.4f speedup=%.1f\n", fsdp_ms, torch_ms,
           fsdp_ms / torch_ms, torch_ms / fsdp_ms);
    return 0;
}
