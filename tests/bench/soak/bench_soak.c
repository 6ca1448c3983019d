/* Fault-injection soak of the whole job: two fsdp-launch processes as two nodes on loopback (2 ranks each,
 * shared memory inside a node, TCP between them; node 1 runs fsdp-worker through a wrapper script that does
 * not exec it) train with --max_restarts, and each trial injects one random fault at a random step:
 *   kill_rank        SIGKILL of a random rank
 *   stop_rank        SIGSTOP of a random rank for 0.2-12 s, then SIGCONT (past FSDP_COMM_TIMEOUT_S = 6 s the
 *                    other ranks give up on it and the job restarts)
 *   kill_launcher    SIGKILL of node 1's launcher, which a scheduler would start again after 0.5-3 s (so
 *                    does the soak)
 *   stop_launcher    SIGSTOP of node 1's launcher for 0.5-8 s, then SIGCONT (past FSDP_HEARTBEAT_TIMEOUT =
 *                    3 s node 0 declares it lost and the job restarts)
 * Node 0's launcher hosts the store; its death ends the job by design, so it is not a target. A trial
 * survives when both launchers exit 0, the run ends at the uninterrupted run's final loss (bit for bit),
 * /dev/shm holds nothing of the trial's run id, and no process of the trial is left (workers, wrapper
 * scripts, launchers, guards).
 * Usage: bench_soak [SECONDS [SEED]] (default 150 s). Lines: bench=soak_trial ... per trial, then
 * bench=soak trials=N survived=N failed=N seconds=S; the exit status is 1 when a trial failed. */
#include <dirent.h>
#include <errno.h>
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
#include "tests/util/tu_file.h"
#include "tests/util/tu_proc.h"

#define STEPS 60
#define INTERVAL 5
#define TRIAL_LIMIT_S 240.0

static char g_root[FSDP_PATH_MAX], g_dir[FSDP_PATH_MAX], g_ini[FSDP_PATH_MAX], g_wrapper[FSDP_PATH_MAX];
static unsigned g_seed;

static double uniform(double lo, double hi)
{
    return lo + (hi - lo) * ((double)rand_r(&g_seed) / RAND_MAX);
}

struct node {
    pid_t pid;     /* the current launcher of this node, 0 once reaped */
    int status;    /* its wait status once reaped */
    char tag[64];  /* files DIR/tag.out, DIR/tag.err */
};

/* Starts node `rank`'s launcher of trial `tag` (port 0 for node 0). */
static pid_t start_node(const char *tag, int rank, int port, const char *run_id, const char *trial_dir,
                        struct node *n, int instance)
{
    char launch[FSDP_PATH_MAX], nr[8], pt[16], out[FSDP_PATH_MAX], err[FSDP_PATH_MAX], host[32];
    char ck[FSDP_PATH_MAX + 32], logd[FSDP_PATH_MAX + 32]; /* + 32: "--key=" and a path */
    tu_pathf_or_exit(launch, sizeof launch, "%s/launcher/fsdp-launch", g_root);
    snprintf(nr, sizeof nr, "%d", rank);
    snprintf(pt, sizeof pt, "%d", port);
    snprintf(ck, sizeof ck, "--checkpoint.dir=%s/ck", trial_dir);
    snprintf(logd, sizeof logd, "--log.dir=%s/log", trial_dir);
    snprintf(n->tag, sizeof n->tag, "%s-node%d-%d", tag, rank, instance);
    snprintf(out, sizeof out, "%s/%s.out", trial_dir, n->tag);
    snprintf(err, sizeof err, "%s/%s.err", trial_dir, n->tag);
    snprintf(host, sizeof host, "FSDP_COMM_HOST_ID=node%d", rank);
    char worker[FSDP_PATH_MAX];
    tu_pathf_or_exit(worker, sizeof worker, "%s/worker/fsdp-worker", g_root);
    const char *argv[] = {launch, "--nnodes", "2", "--node_rank", nr, "--nproc_per_node", "2", "--master_addr",
                          "127.0.0.1", "--master_port", pt, "--rdzv_id", run_id, "--max_restarts", "8",
                          "--monitor_interval", "0.1", "--shutdown_timeout", "2", "--rdzv_timeout", "60",
                          rank == 1 ? g_wrapper : worker, g_ini, ck, logd, "--log.interval=1", NULL};
    const char *env[] = {"OMP_NUM_THREADS=1", "FSDP_RDZV_TOKEN=soak", "FSDP_HEARTBEAT_TIMEOUT=3",
                         "FSDP_COMM_TIMEOUT_S=6", host, "FSDP_LOG_LEVEL=info", NULL};
    n->pid = tu_spawn(argv, out, err, env);
    n->status = 0;
    return n->pid;
}

static int read_port(const char *trial_dir, const char *tag, double timeout_s)
{
    char p[4600];
    snprintf(p, sizeof p, "%s/%s.err", trial_dir, tag);
    for (double end = tu_now() + timeout_s; tu_now() < end; tu_nap(0.02)) {
        char *s = tu_slurp(p);
        char *at = s ? strstr(s, "fsdp-launch: store listening on ") : NULL;
        char *nl = at ? strchr(at, '\n') : NULL;
        if (nl) {
            *nl = 0;
            int port = atoi(strrchr(at, ':') + 1);
            free(s);
            return port;
        }
        free(s);
    }
    return -1;
}

/* Rank 0's metrics.jsonl: number of lines and the text of the last loss. */
static int metrics(const char *trial_dir, char *last_loss, size_t cap)
{
    char p[FSDP_PATH_MAX];
    snprintf(p, sizeof p, "%s/log/metrics.jsonl", trial_dir);
    char *s = tu_slurp(p);
    if (!s)
        return 0;
    int lines = 0;
    const char *last = NULL;
    for (const char *l = s; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        if (strstr(l, "\"loss\":") && (!strchr(l, '\n') || strstr(l, "\"loss\":") < strchr(l, '\n'))) {
            lines++;
            last = strstr(l, "\"loss\":") + strlen("\"loss\":");
        }
    }
    if (last_loss && cap) {
        last_loss[0] = 0;
        if (last)
            snprintf(last_loss, cap, "%.*s", (int)strcspn(last, ",}"), last);
    }
    free(s);
    return lines;
}

/* pid -> parent pid and short name, from /proc/PID/stat. */
static bool proc_stat(int pid, int *ppid, char *comm, size_t cap, char *state)
{
    char p[64], buf[1024];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    FILE *f = fopen(p, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *l = strchr(buf, '('), *r = strrchr(buf, ')');
    if (!l || !r || r[1] != ' ')
        return false;
    snprintf(comm, cap, "%.*s", (int)(r - l - 1), l + 1);
    *state = r[2];
    *ppid = atoi(r + 4);
    return true;
}

/* The fsdp-worker processes descending from launcher `root` (through wrapper scripts too). */
static int workers_of(pid_t root, int *out, int cap)
{
    int n = 0, fam[4096], nf = 1;
    fam[0] = (int)root;
    for (int round = 0; round < 4; round++) {
        DIR *d = opendir("/proc");
        struct dirent *e;
        while (d && (e = readdir(d))) {
            int pid = atoi(e->d_name), ppid;
            char comm[64], st;
            if (pid <= 0 || !proc_stat(pid, &ppid, comm, sizeof comm, &st) || st == 'Z')
                continue;
            bool known = false, child = false;
            for (int i = 0; i < nf; i++) {
                known = known || fam[i] == pid;
                child = child || fam[i] == ppid;
            }
            if (child && !known && nf < 4096)
                fam[nf++] = pid;
        }
        if (d)
            closedir(d);
    }
    for (int i = 1; i < nf; i++) {
        int ppid;
        char comm[64], st;
        if (proc_stat(fam[i], &ppid, comm, sizeof comm, &st) && strcmp(comm, "fsdp-worker") == 0 && n < cap)
            out[n++] = fam[i];
    }
    return n;
}

/* Processes whose command line mentions the trial directory (workers, wrappers, launchers, guards). */
static int leftovers(const char *trial_dir, char *names, size_t cap)
{
    int n = 0;
    size_t used = 0;
    names[0] = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid = atoi(e->d_name);
        if (pid <= 0 || pid == (int)getpid())
            continue;
        char p[64], buf[8192];
        snprintf(p, sizeof p, "/proc/%d/cmdline", pid);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t i = 0; i < len; i++)
            if (!buf[i])
                buf[i] = ' ';
        buf[len] = 0;
        int ppid;
        char comm[64], st;
        if (strstr(buf, trial_dir) && proc_stat(pid, &ppid, comm, sizeof comm, &st) && st != 'Z') {
            n++;
            int w = snprintf(names + used, cap - used, "%s%d (%s)", used ? ", " : "", pid, comm);
            if (w > 0 && used + (size_t)w < cap)
                used += (size_t)w;
        }
    }
    if (d)
        closedir(d);
    return n;
}

static int shm_leftovers(const char *run_id)
{
    int n = 0;
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strstr(e->d_name, run_id) != NULL;
    if (d)
        closedir(d);
    return n;
}

static void reap(struct node *n)
{
    if (n->pid > 0 && waitpid(n->pid, &n->status, WNOHANG) == n->pid)
        n->pid = 0;
}

static int exit_code(int st)
{
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int count_lines(const char *path, const char *needle)
{
    char *s = tu_slurp(path);
    int n = 0;
    for (const char *p = s ? strstr(s, needle) : NULL; p; p = strstr(p + 1, needle))
        n++;
    free(s);
    return n;
}

enum fault { F_NONE, F_KILL_RANK, F_STOP_RANK, F_KILL_LAUNCHER, F_STOP_LAUNCHER, F_COUNT };
static const char *const fault_names[] = {"none", "kill_rank", "stop_rank", "kill_launcher", "stop_launcher"};

/* One trial: returns true when it survived; *final receives rank 0's last loss text. */
static bool trial(int k, enum fault fault, const char *want_loss, char *final, size_t cap, double *secs)
{
    char tag[32], run_id[64], tdir[FSDP_PATH_MAX];
    snprintf(tag, sizeof tag, "t%d", k);
    snprintf(run_id, sizeof run_id, "soak%dt%d", (int)getpid(), k);
    tu_pathf_or_exit(tdir, sizeof tdir, "%s/%s", g_dir, tag);
    mkdir(tdir, 0755);
    double t0 = tu_now();
    struct node n0, n1;
    int inst = 0;
    bool ok = true;
    char why[6000] = "";
    start_node(tag, 0, 0, run_id, tdir, &n0, 0);
    int port = read_port(tdir, n0.tag, 30);
    if (port <= 0) {
        snprintf(why, sizeof why, "node 0 printed no port");
        ok = false;
    } else {
        start_node(tag, 1, port, run_id, tdir, &n1, inst++);
    }
    int at_step = (int)uniform(3, STEPS - 8);
    double delay = 0;
    char target[64] = "-";
    bool fired = fault == F_NONE;
    pid_t stopped = 0;
    double cont_at = 0, relaunch_at = 0;
    while (ok && (n0.pid > 0 || n1.pid > 0 || relaunch_at > 0)) {
        if (tu_now() - t0 > TRIAL_LIMIT_S) {
            snprintf(why, sizeof why, "still running after %.0f s", TRIAL_LIMIT_S);
            ok = false;
            break;
        }
        reap(&n0);
        reap(&n1);
        if (!fired && metrics(tdir, NULL, 0) >= at_step) {
            fired = true;
            int pids[8], np = 0;
            switch (fault) {
            case F_KILL_RANK:
            case F_STOP_RANK: {
                int a[4], b[4], na = workers_of(n0.pid, a, 4), nb = n1.pid > 0 ? workers_of(n1.pid, b, 4) : 0;
                for (int i = 0; i < na; i++)
                    pids[np++] = a[i];
                for (int i = 0; i < nb; i++)
                    pids[np++] = b[i];
                if (np == 0)
                    break;
                int v = pids[rand_r(&g_seed) % np];
                snprintf(target, sizeof target, "worker_pid_%d", v);
                if (fault == F_KILL_RANK) {
                    kill(v, SIGKILL);
                } else {
                    delay = uniform(0.2, 12);
                    kill(v, SIGSTOP);
                    stopped = v;
                    cont_at = tu_now() + delay;
                }
                break;
            }
            case F_KILL_LAUNCHER:
                if (n1.pid > 0) {
                    snprintf(target, sizeof target, "node1_launcher");
                    kill(n1.pid, SIGKILL);
                    waitpid(n1.pid, &n1.status, 0);
                    n1.pid = 0;
                    delay = uniform(0.5, 3);
                    relaunch_at = tu_now() + delay;
                }
                break;
            case F_STOP_LAUNCHER:
                if (n1.pid > 0) {
                    snprintf(target, sizeof target, "node1_launcher");
                    delay = uniform(0.5, 8);
                    kill(n1.pid, SIGSTOP);
                    stopped = n1.pid;
                    cont_at = tu_now() + delay;
                }
                break;
            default:
                break;
            }
        }
        if (stopped && tu_now() >= cont_at) {
            kill(stopped, SIGCONT);
            stopped = 0;
        }
        if (relaunch_at > 0 && tu_now() >= relaunch_at) {
            relaunch_at = 0;
            start_node(tag, 1, port, run_id, tdir, &n1, inst++);
        }
        tu_nap(0.02);
    }
    if (stopped)
        kill(stopped, SIGCONT);
    if (!ok) {
        if (n0.pid > 0)
            kill(n0.pid, SIGKILL), waitpid(n0.pid, &n0.status, 0);
        if (n1.pid > 0)
            kill(n1.pid, SIGKILL), waitpid(n1.pid, &n1.status, 0);
    }
    *secs = tu_now() - t0;
    int lines = metrics(tdir, final, cap);
    char e0[FSDP_PATH_MAX];
    tu_pathf_or_exit(e0, sizeof e0, "%s/%s.err", tdir, n0.tag);
    int restarts = count_lines(e0, "restarting the job");
    if (ok && (exit_code(n0.status) != 0 || exit_code(n1.status) != 0))
        snprintf(why, sizeof why, "exit codes: node 0 %d, node 1 %d (see %s/*.err)", exit_code(n0.status),
                 exit_code(n1.status), tdir), ok = false;
    if (ok && (lines < 1 || (want_loss && strcmp(final, want_loss) != 0)))
        snprintf(why, sizeof why, "final loss %s, uninterrupted %s", final, want_loss), ok = false;
    /* The guards and any stray process get a moment to go. */
    char names[1024];
    int left = 0;
    for (double end = tu_now() + 5; (left = leftovers(tdir, names, sizeof names)) > 0 && tu_now() < end;)
        tu_nap(0.05);
    if (left > 0) {
        if (ok)
            snprintf(why, sizeof why, "%d process(es) left: %s", left, names), ok = false;
        for (char *p = names; *p;) { /* do not leave them to the next trial */
            int pid = atoi(p);
            if (pid > 0)
                kill(pid, SIGKILL);
            p = strchr(p, ',') ? strchr(p, ',') + 2 : p + strlen(p);
        }
    }
    int shm = shm_leftovers(run_id);
    if (ok && shm > 0)
        snprintf(why, sizeof why, "%d segment(s) of run %s left in /dev/shm", shm, run_id), ok = false;
    printf("bench=soak_trial n=%d fault=%s target=%s at_step=%d delay_s=%.1f restarts=%d seconds=%.1f survived=%d "
           "final_loss=%s%s%s\n",
           k, fault_names[fault], target, fault == F_NONE ? -1 : at_step, delay, restarts, *secs, ok,
           final[0] ? final : "none", ok ? "" : " why=", ok ? "" : why);
    fflush(stdout);
    if (ok) {
        char cmd[4600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tdir);
        tu_sh(cmd);
    }
    return ok;
}

int main(int argc, char **argv)
{
    double budget = argc > 1 ? atof(argv[1]) : 150;
    g_seed = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
    const char *root = getenv("FSDP_BUILD_ROOT"), *src = getenv("FSDP_SOURCE_ROOT");
    if (!root || !src) {
        fprintf(stderr, "bench_soak: run through meson test --benchmark (FSDP_BUILD_ROOT, FSDP_SOURCE_ROOT)\n");
        return 2;
    }
    snprintf(g_root, sizeof g_root, "%s", root);
    snprintf(g_dir, sizeof g_dir, "/tmp/fsdp-soak-XXXXXX");
    if (!mkdtemp(g_dir))
        return 2;
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "'%s/worker/fsdp-prepare-data' -o '%s/data' '%s/tests/data/corpus' >/dev/null 2>&1",
             root, g_dir, src);
    if (tu_sh(cmd) != 0) {
        fprintf(stderr, "bench_soak: fsdp-prepare-data failed\n");
        return 2;
    }
    tu_pathf_or_exit(g_ini, sizeof g_ini, "%s/soak.ini", g_dir);
    char text[9000];
    snprintf(text, sizeof text,
             "[model]\nn_layer = 2\nn_head = 2\nn_embd = 32\nvocab_size = 256\nblock_size = 16\n"
             "[train]\ndevice = cpu\ntrain_batch = 12\nmicro_batch = 1\nmax_steps = %d\neval_interval = 0\n"
             "[optim]\nlr = 0.003\nwarmup_steps = 2\n[checkpoint]\ninterval = %d\nkeep_last = 3\n"
             "[data]\ntrain_file = %s/data/train.bin\n",
             STEPS, INTERVAL, g_dir);
    tu_write_text(g_ini, text);
    /* Node 1's program: a shell that runs fsdp-worker as its child (no exec), as user job scripts do. */
    tu_pathf_or_exit(g_wrapper, sizeof g_wrapper, "%s/worker.sh", g_dir);
    snprintf(text, sizeof text, "#!/bin/sh\n'%s/worker/fsdp-worker' \"$@\"\nexit $?\n", root);
    tu_write_text(g_wrapper, text);
    chmod(g_wrapper, 0755);
    printf("bench=soak_setup seconds=%.0f seed=%u steps=%d checkpoint_interval=%d dir=%s\n", budget, g_seed, STEPS,
           INTERVAL, g_dir);
    fflush(stdout);

    char want[64] = "", final[64];
    double secs;
    if (!trial(0, F_NONE, NULL, want, sizeof want, &secs) || !want[0]) {
        fprintf(stderr, "bench_soak: the uninterrupted run failed; see %s/t0\n", g_dir);
        return 1;
    }
    double start = tu_now();
    int trials = 0, survived = 0;
    while (tu_now() - start < budget) {
        enum fault f = (enum fault)(1 + rand_r(&g_seed) % (F_COUNT - 1));
        trials++;
        survived += trial(trials, f, want, final, sizeof final, &secs);
    }
    printf("bench=soak trials=%d survived=%d failed=%d seconds=%.0f reference_loss=%s\n", trials, survived,
           trials - survived, tu_now() - start, want);
    if (survived == trials) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        tu_sh(cmd);
    } else {
        printf("bench=soak kept=%s\n", g_dir);
    }
    return survived == trials && trials > 0 ? 0 : 1;
}
