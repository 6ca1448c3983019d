/* The worker program of the launcher tests: each mode checks one part of the launcher's contract from
 * the worker's side and leaves evidence (files named after the rank) for the test to read. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"
#include "rendezvous/rendezvous.h"

static const char *const vars[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "FSDP_STORE_PREFIX", "FSDP_RDZV_TOKEN", "OMP_NUM_THREADS",
    "FSDP_LOG_LEVEL", NULL};

static int env_int(const char *n) { return getenv(n) ? atoi(getenv(n)) : -1; }

static void write_file(const char *dir, const char *what, const char *text)
{
    char path[FSDP_PATH_MAX], tmp[FSDP_PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/%s.%d", dir, what, env_int("RANK"));
    int m = snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = (size_t)n < sizeof path && (size_t)m < sizeof tmp ? fopen(tmp, "w") : NULL; /* never a cut path */
    if (!f)
        exit(90);
    fputs(text, f);
    fclose(f);
    rename(tmp, path); /* readers never see a half-written file */
}

static void write_pid(const char *dir)
{
    char pid[32];
    snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    write_file(dir, "pid", pid);
}

static int count_files(const char *dir, const char *what, int n)
{
    int found = 0;
    for (int r = 0; r < n; r++) {
        char path[FSDP_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s.%d", dir, what, r);
        found += access(path, F_OK) == 0;
    }
    return found;
}

static void nap(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int barrier(void)
{
    struct rdzv_worker w;
    if (rdzv_worker_connect(&w, 30) || rdzv_worker_barrier(&w, "probe", 60)) {
        fprintf(stderr, "probe: store: %s\n", error_message());
        return 1;
    }
    rdzv_worker_close(&w);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 64;
    log_init("launch-probe"); /* FSDP_LOG_LEVEL reaches the rendezvous code's messages */
    const char *mode = argv[1];
    const char *dir = argc > 2 ? argv[2] : ".";
    int rank = env_int("RANK");
    if (strcmp(mode, "env") == 0) { /* env DIR: dump the contract, then prove the store works */
        char text[8192] = "";
        for (int i = 0; vars[i]; i++) {
            const char *v = getenv(vars[i]);
            size_t used = strlen(text);
            snprintf(text + used, sizeof text - used, "%s=%s\n", vars[i], v ? v : "<unset>");
        }
        if (barrier())
            return 1;
        write_file(dir, "env", text);
        return 0;
    }
    if (strcmp(mode, "fail") == 0) { /* fail DIR RANK CODE: RANK exits CODE once every rank runs */
        int bad = atoi(argv[3]), code = atoi(argv[4]);
        write_pid(dir);
        if (rank == bad) {
            for (int i = 0; i < 600 && count_files(dir, "pid", env_int("WORLD_SIZE")) < env_int("WORLD_SIZE"); i++)
                nap(0.05);
            fprintf(stderr, "probe: rank %d giving up with exit code %d\n", rank, code);
            return code;
        }
        nap(120);
        return 0;
    }
    if (strcmp(mode, "peerfirst") == 0) { /* peerfirst DIR RANK CODE DELAY: once every rank runs, the others
                                              * exit 3 (fsdp-worker's "another rank failed") at once, RANK
                                              * exits CODE DELAY seconds later: the real failure reaped last */
        int bad = atoi(argv[3]), code = atoi(argv[4]);
        double delay = atof(argv[5]);
        write_pid(dir);
        for (int i = 0; i < 600 && count_files(dir, "pid", env_int("WORLD_SIZE")) < env_int("WORLD_SIZE"); i++)
            nap(0.05);
        if (rank != bad) {
            fprintf(stderr, "probe: rank %d: another rank failed\n", rank);
            return 3;
        }
        nap(delay);
        fprintf(stderr, "probe: rank %d failing for real with exit code %d\n", rank, code);
        return code;
    }
    if (strcmp(mode, "failfirst") == 0) { /* failfirst DIR: rank 0 fails on attempt 0 only */
        if (env_int("TORCHELASTIC_RESTART_COUNT") == 0 && rank == 0) {
            nap(0.2);
            return 4;
        }
        if (barrier())
            return 1;
        char text[64];
        snprintf(text, sizeof text, "%d\n", env_int("TORCHELASTIC_RESTART_COUNT"));
        write_file(dir, "ok", text);
        return 0;
    }
    if (strcmp(mode, "sleep") == 0) { /* sleep DIR: stay alive until killed */
        write_pid(dir);
        nap(120);
        return 0;
    }
    if (strcmp(mode, "stubborn") == 0) { /* stubborn DIR: ignores SIGTERM, so only SIGKILL ends it */
        signal(SIGTERM, SIG_IGN);
        write_pid(dir);
        for (int i = 0; i < 1200; i++)
            nap(0.1);
        return 0;
    }
    if (strcmp(mode, "sleepfirst") == 0) { /* sleepfirst DIR: hang on attempt 0, succeed later */
        if (env_int("TORCHELASTIC_RESTART_COUNT") == 0) {
            write_pid(dir);
            nap(120);
            return 0;
        }
        if (barrier())
            return 1;
        char text[64];
        snprintf(text, sizeof text, "%d\n", env_int("TORCHELASTIC_RESTART_COUNT"));
        write_file(dir, "ok", text);
        return 0;
    }
    if (strcmp(mode, "barrier") == 0)
        return barrier();
    if (strcmp(mode, "flood") == 0) { /* flood: 400 lines of 5000 letters ('a' + rank), through stdio */
        static char line[5002];
        memset(line, 'a' + rank % 26, 5000);
        line[5000] = '\n';
        for (int i = 0; i < 400; i++)
            fwrite(line, 1, 5001, stdout); /* stdio's 4 KiB buffer splits lines across writes */
        return 0;
    }
    if (strcmp(mode, "bigout") == 0) { /* bigout DIR: rank 0 prints 10 MB and stays; the others exit 7 once it
                                          * is done (or after 15 s) */
        if (rank == 0) {
            static char line[101];
            memset(line, 'x', 99);
            line[99] = '\n';
            for (int i = 0; i < 100000; i++)
                fwrite(line, 1, 100, stdout);
            fflush(stdout);
            write_file(dir, "flooded", "1\n");
            nap(120);
            return 0;
        }
        for (int i = 0; i < 150 && !count_files(dir, "flooded", 1); i++)
            nap(0.1);
        return 7;
    }
    if (strcmp(mode, "lines") == 0) { /* lines N: N numbered 100-byte lines on stdout and on stderr */
        int n = argc > 2 ? atoi(argv[2]) : 0;
        for (int i = 0; i < n; i++) {
            printf("out %08d %086d\n", i, 0);
            fprintf(stderr, "err %08d %086d\n", i, 0);
        }
        return 0;
    }
    if (strcmp(mode, "talk") == 0) { /* talk: lines on both streams, for the log layout */
        printf("out line 1 of rank %d\nout line 2 of rank %d\n", rank, rank);
        fflush(stdout);
        fprintf(stderr, "err line of rank %d\n", rank);
        return 0;
    }
    return 64;
}
