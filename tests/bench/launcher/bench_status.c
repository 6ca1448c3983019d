/* The status page's cost to training: tokens/s of a 2-rank CPU job (fsdp-launch + fsdp-worker, tiny GPT-2,
 * short steps: the worst case for per-step reporting) without --status_port, and with it while a client
 * fetches /, /api/status and /metrics ten times a second. Runs alternate, REPS of each; tokens/s is the median
 * of the run's metrics.jsonl steps (the first 20 skipped). Ranks write their store record in both arms (at most
 * every 0.25 s); the page's side (its thread, store reads, HTTP) is what differs. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "tests/util/tu_proc.h"

#define REPS 9
#define STEPS 600

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median tokens_per_s of metrics.jsonl after the first 20 steps; -1 when unreadable. */
static double median_tps(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    static double v[STEPS + 8];
    int n = 0, line = 0;
    char buf[512];
    while (fgets(buf, sizeof buf, f) && n < STEPS) {
        char *at = strstr(buf, "\"tokens_per_s\":");
        if (at && line++ >= 20)
            v[n++] = atof(at + strlen("\"tokens_per_s\":"));
    }
    fclose(f);
    if (n == 0)
        return -1;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static void fetch(int port, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0)
        return;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        char req[256];
        int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
        if (send(fd, req, (size_t)n, MSG_NOSIGNAL) == n) {
            char buf[65536];
            while (recv(fd, buf, sizeof buf, 0) > 0) {
            }
        }
    }
    close(fd);
}

/* One run; with_page: --status_port and a polling client. Returns the median tokens/s or -1. */
static double run(const char *build, const char *dir, int rep, bool with_page)
{
    char launch[FSDP_PATH_MAX], worker[FSDP_PATH_MAX], ini[FSDP_PATH_MAX], port[16], metrics[FSDP_PATH_MAX];
    char logdir[FSDP_PATH_MAX + 32]; /* + 32: "--key=" and a path */
    snprintf(launch, sizeof launch, "%s/launcher/fsdp-launch", build);
    snprintf(worker, sizeof worker, "%s/worker/fsdp-worker", build);
    snprintf(ini, sizeof ini, "%s/tiny.ini", dir);
    snprintf(logdir, sizeof logdir, "--log.dir=%s/run%d%s", dir, rep, with_page ? "p" : "n");
    snprintf(metrics, sizeof metrics, "%s/run%d%s/metrics.jsonl", dir, rep, with_page ? "p" : "n");
    int p = tu_free_port();
    snprintf(port, sizeof port, "%d", p);
    const char *with[] = {launch, "--standalone", "--nproc_per_node", "2", "--status_port", port, worker, ini, logdir,
                          NULL};
    const char *without[] = {launch, "--standalone", "--nproc_per_node", "2", worker, ini, logdir, NULL};
    const char *env[] = {"OMP_NUM_THREADS=1", NULL};
    pid_t job = tu_spawn(with_page ? with : without, "/dev/null", "/dev/null", env);
    if (job < 0)
        return -1;
    pid_t poller = -1;
    if (with_page) {
        poller = fork();
        if (poller == 0) {
            for (;;) {
                fetch(p, "/api/status");
                fetch(p, "/metrics");
                fetch(p, "/");
                tu_nap(0.1);
            }
        }
    }
    int st;
    waitpid(job, &st, 0);
    if (poller > 0) {
        kill(poller, SIGKILL);
        waitpid(poller, NULL, 0);
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return -1;
    return median_tps(metrics);
}

int main(void)
{
    const char *build = getenv("FSDP_BUILD_ROOT"), *src = getenv("FSDP_SOURCE_ROOT");
    if (!build || !src) {
        fprintf(stderr, "FSDP_BUILD_ROOT/FSDP_SOURCE_ROOT not set: run with meson test --benchmark\n");
        return 1;
    }
    char dir[] = "/tmp/fsdp-bench-status-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "'%s/worker/fsdp-prepare-data' -o '%s/data' '%s/tests/data/corpus'", build, dir, src);
    if (tu_sh(cmd) != 0) {
        fprintf(stderr, "fsdp-prepare-data failed\n");
        return 1;
    }
    snprintf(cmd, sizeof cmd,
             "printf '[model]\\nn_layer = 2\\nn_head = 2\\nn_embd = 64\\nvocab_size = 256\\nblock_size = 32\\n"
             "[train]\\ndevice = cpu\\ntrain_batch = 8\\nmicro_batch = 4\\nmax_steps = %d\\neval_interval = 0\\n"
             "[data]\\ntrain_file = %s/data/train.bin\\n' > '%s/tiny.ini'",
             STEPS, dir, dir);
    if (tu_sh(cmd) != 0)
        return 1;
    double off[REPS], on[REPS];
    for (int r = 0; r < REPS; r++) {
        off[r] = run(build, dir, r, false);
        on[r] = run(build, dir, r, true);
        if (off[r] < 0 || on[r] < 0) {
            fprintf(stderr, "a run failed (rep %d)\n", r);
            return 1;
        }
        printf("bench=status_page rep=%d tokens_per_s_without=%.0f tokens_per_s_with=%.0f\n", r, off[r], on[r]);
    }
    qsort(off, REPS, sizeof *off, cmp_double);
    qsort(on, REPS, sizeof *on, cmp_double);
    printf("bench=status_page world=2 steps=%d reps=%d tokens_per_s_without=%.0f tokens_per_s_with=%.0f "
           "ratio_with_over_without=%.3f spread_without=%.3f\n",
           STEPS, REPS, off[REPS / 2], on[REPS / 2], on[REPS / 2] / off[REPS / 2], off[REPS - 1] / off[0]);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    tu_sh(cmd);
    return 0;
}
