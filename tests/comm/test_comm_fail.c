/* Failures: a rank SIGKILLed mid-run, or stuck, makes every other rank fail within the timeout with an
 * error that names it, the collective and its sequence number; nothing is left in /dev/shm. */
#include "comm_test_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <pthread.h>
#include <signal.h>

struct fail_arg {
    int victim;
    bool stuck; /* sleep instead of dying */
    double max_s;
    bool reg; /* buffers from comm_mem_alloc: the one-copy shared-memory path */
};

/* The message must blame the victim itself, not a rank that only gave up because of it (whose closed
 * connections are what the others see first). */
static bool names_cause(const char *msg, int victim)
{
    /* Every way comm_shm.c and comm_tcp.c name a dead peer ("broke": POLLHUP before any byte could be read,
     * rare, seen once in CI on killed_mid_collective_tcp_world3). */
    const char *forms[] = {"rank %d (pid", "rank %d closed its connection", "connection to rank %d failed",
                           "connection to rank %d broke", "rank %d did not arrive"};
    for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
        char want[64];
        snprintf(want, sizeof(want), forms[i], victim);
        if (strstr(msg, want))
            return true;
    }
    return false;
}

/* Two good all_reduces, then the victim dies (or hangs) and the others' third must fail naming it. */
static int body_victim(struct rank_ctx *c)
{
    const struct fail_arg *a = c->arg;
    float stackv[4099] = {0}, *v = a->reg ? comm_mem_alloc(c->comm, sizeof(stackv)) : stackv;
    if (!v)
        return 1;
    for (int k = 0; k < 2; k++)
        if (comm_all_reduce(c->comm, v, v, 4099, DTYPE_F32, COMM_SUM) != 0) {
            fprintf(stderr, "rank %d: warm-up all_reduce: %s\n", c->rank, error_message());
            return 1;
        }
    if (c->rank == a->victim) {
        if (a->stuck) {
            sleep((unsigned)a->max_s / 2); /* past the others' timeout, then die like a killed rank */
            raise(SIGKILL);
        }
        raise(SIGKILL);
    }
    double t0 = tu_now();
    int rc = comm_all_reduce(c->comm, v, v, 4099, DTYPE_F32, COMM_SUM);
    double dt = tu_now() - t0;
    char want[32];
    snprintf(want, sizeof(want), "rank %d", a->victim);
    const char *msg = error_message();
    if (rc == 0 || !strstr(msg, "all_reduce #3") || !strstr(msg, "group 'world'") || !strstr(msg, want) ||
        !names_cause(msg, a->victim) || dt > a->max_s) {
        fprintf(stderr, "rank %d: rc %d after %.1f s, message: %s\n", c->rank, rc, dt, msg);
        return 1;
    }
    /* Broken from now on: the next call fails at once with the first error. */
    if (comm_barrier(c->comm) == 0 || !strstr(error_message(), "earlier")) {
        fprintf(stderr, "rank %d: barrier after failure: %s\n", c->rank, error_message());
        return 1;
    }
    fprintf(stderr, "rank %d (expected failure, %.1f s): %s\n", c->rank, dt, msg);
    return 0;
}

static void *kill_self_later(void *arg)
{
    const struct timespec ts = {0, 300 * 1000 * 1000};
    (void)arg;
    nanosleep(&ts, NULL);
    raise(SIGKILL);
    return NULL;
}

/* The victim is killed by a timer while every rank loops over 4 MiB all_reduces, so it dies inside a
 * collective (in the middle of its copies or reductions), not between two. */
static int body_midkill(struct rank_ctx *c)
{
    const struct fail_arg *a = c->arg;
    size_t n = (4u << 20) / 4;
    float *v = a->reg ? comm_mem_alloc(c->comm, n * sizeof(float)) : calloc(n, sizeof(float));
    if (!v)
        return 1;
    if (c->rank == a->victim) {
        pthread_t t;
        if (pthread_create(&t, NULL, kill_self_later, NULL) != 0)
            return 1;
    }
    double t0 = tu_now();
    int rc = 0;
    uint64_t it = 0;
    while (rc == 0 && tu_now() - t0 < a->max_s)
        rc = comm_all_reduce(c->comm, v, v, n, DTYPE_F32, COMM_SUM), it++;
    if (a->reg)
        comm_mem_free(c->comm, v);
    else
        free(v);
    double dt = tu_now() - t0;
    char want[32], seq[48];
    snprintf(want, sizeof(want), "rank %d", a->victim);
    snprintf(seq, sizeof(seq), "all_reduce #%llu in group 'world'", (unsigned long long)it);
    const char *msg = error_message();
    if (rc == 0 || !strstr(msg, seq) || !strstr(msg, want) || !names_cause(msg, a->victim)) {
        fprintf(stderr, "rank %d: rc %d after %.1f s and %llu all_reduces, message: %s\n", c->rank, rc, dt,
                (unsigned long long)it, msg);
        return 1;
    }
    fprintf(stderr, "rank %d (expected failure after %.2f s, %llu ops): %s\n", c->rank, dt, (unsigned long long)it,
            msg);
    return 0;
}

/* Like body_midkill on the one-copy path, but every all_gather uses a freshly allocated registered buffer
 * (freed after it), so peers map the victim's buffers right when it may be dying: a mapping that fails
 * because the owner is gone must still name the dead rank. */
static int body_freshkill(struct rank_ctx *c)
{
    const struct fail_arg *a = c->arg;
    size_t n = (1u << 20) / 4;
    float *out = malloc(n * sizeof(float) * (size_t)c->size);
    if (!out)
        return 1;
    if (c->rank == a->victim) {
        pthread_t t;
        if (pthread_create(&t, NULL, kill_self_later, NULL) != 0)
            return 1;
    }
    double t0 = tu_now();
    int rc = 0;
    uint64_t it = 0;
    while (rc == 0 && tu_now() - t0 < a->max_s) {
        float *in = comm_mem_alloc(c->comm, n * sizeof(float));
        if (!in)
            return 1;
        rc = comm_all_gather(c->comm, in, out, n, DTYPE_F32), it++;
        comm_mem_free(c->comm, in);
    }
    free(out);
    char seq[48];
    snprintf(seq, sizeof(seq), "all_gather #%llu in group 'world'", (unsigned long long)it);
    const char *msg = error_message();
    if (rc == 0 || !strstr(msg, seq) || !names_cause(msg, a->victim)) {
        fprintf(stderr, "rank %d: rc %d after %llu all_gathers, message: %s\n", c->rank, rc, (unsigned long long)it,
                msg);
        return 1;
    }
    fprintf(stderr, "rank %d (expected failure, %llu ops): %s\n", c->rank, (unsigned long long)it, msg);
    return 0;
}

static int shm_leftovers(const char *run_id)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, run_id))
            n++;
    closedir(d);
    return n;
}

static void run_body_reg(rank_body body, int world, int victim, bool stuck, bool force_tcp, int hosts,
                         double timeout_s, double max_s, bool reg)
{
    char run_id[64];
    snprintf(run_id, sizeof(run_id), "fail%d-%d", (int)getpid(), victim);
    struct fail_arg a = {.victim = victim, .stuck = stuck, .max_s = max_s, .reg = reg};
    struct run_opts o = {.run_id = run_id, .timeout_s = timeout_s, .force_tcp = force_tcp, .hosts = hosts,
                         .limit_s = max_s + 30};
    int st[MAX_RANKS];
    run_ranks(world, body, &a, &o, st);
    for (int r = 0; r < world; r++) {
        if (r == victim)
            cr_assert(WIFSIGNALED(st[r]) && WTERMSIG(st[r]) == SIGKILL, "victim status 0x%x", st[r]);
        else
            cr_assert(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "rank %d did not report the failure (0x%x)",
                      r, st[r]);
    }
    cr_assert_eq(shm_leftovers(run_id), 0, "/dev/shm still holds a segment of run %s", run_id);
}

static void run_body(rank_body body, int world, int victim, bool stuck, bool force_tcp, int hosts,
                     double timeout_s, double max_s)
{
    run_body_reg(body, world, victim, stuck, force_tcp, hosts, timeout_s, max_s, false);
}

static void run_victim(int world, int victim, bool stuck, bool force_tcp, int hosts, double timeout_s,
                       double max_s)
{
    run_body(body_victim, world, victim, stuck, force_tcp, hosts, timeout_s, max_s);
}

/* Dead peers are noticed from their pid (shm) or the closed socket (TCP), long before the timeout. */
Test(comm_fail, killed_rank_shm_world4, .timeout = 100) { run_victim(4, 3, false, false, 1, 30, 20); }
Test(comm_fail, killed_leader_shm_world3, .timeout = 100) { run_victim(3, 0, false, false, 1, 30, 20); }
Test(comm_fail, killed_rank_tcp_world3, .timeout = 100) { run_victim(3, 1, false, true, 1, 30, 20); }
Test(comm_fail, killed_rank_hier_2x2, .timeout = 100) { run_victim(4, 2, false, false, 2, 30, 20); }
/* A live but stuck rank: the others give up at the timeout (3 s) and name it. */
Test(comm_fail, stuck_rank_times_out_world3, .timeout = 100) { run_victim(3, 1, true, false, 1, 3, 20); }

/* Killed inside a collective: the others fail naming it, the collective and its sequence number, long
 * before the 30 s timeout (max_s 20 bounds the whole run). */
Test(comm_fail, killed_mid_collective_shm_world4, .timeout = 100)
{
    run_body(body_midkill, 4, 2, false, false, 1, 30, 20);
}
Test(comm_fail, killed_mid_collective_hier_2x2, .timeout = 100)
{
    run_body(body_midkill, 4, 1, false, false, 2, 30, 20);
}
Test(comm_fail, killed_mid_collective_tcp_world3, .timeout = 100)
{
    run_body(body_midkill, 3, 0, false, true, 1, 30, 20);
}

/* The same with registered buffers: the one-copy path reads peers' buffers directly, and a rank dying
 * while a peer reads its memory must neither crash the reader nor hide who died; registered memory
 * (memfd) leaves nothing in /dev/shm either. */
Test(comm_fail, killed_rank_registered_world4, .timeout = 100)
{
    run_body_reg(body_victim, 4, 2, false, false, 1, 30, 20, true);
}
Test(comm_fail, killed_mid_collective_registered_world4, .timeout = 100)
{
    run_body_reg(body_midkill, 4, 3, false, false, 1, 30, 20, true);
}
Test(comm_fail, killed_mid_collective_registered_world2, .timeout = 100)
{
    run_body_reg(body_midkill, 2, 0, false, false, 1, 30, 20, true);
}
Test(comm_fail, killed_while_peers_map_fresh_buffers_world3, .timeout = 100)
{
    run_body_reg(body_freshkill, 3, 1, false, false, 1, 30, 20, true);
}
Test(comm_fail, stuck_rank_registered_times_out_world3, .timeout = 100)
{
    run_body_reg(body_victim, 3, 0, true, false, 1, 3, 20, true);
}

static int body_bad_args(struct rank_ctx *c)
{
    float x = 0;
    int bad = 0;
    bad |= comm_broadcast(c->comm, &x, 1, DTYPE_F32, c->size) != FSDP_EINVAL;
    bad |= comm_send(c->comm, &x, 1, DTYPE_F32, c->rank) != FSDP_EINVAL;
    bad |= comm_all_reduce(c->comm, NULL, NULL, 5, DTYPE_F32, COMM_SUM) != FSDP_EINVAL;
    bad |= comm_all_reduce(c->comm, NULL, NULL, 0, DTYPE_F32, COMM_SUM) != 0; /* count 0: nothing to touch */
    struct comm *dup = NULL;
    bad |= comm_create(c->store, 0, 1, "bad/name", NULL, &dup) != FSDP_EINVAL;
    struct comm_options o = {.backend = "carrier-pigeon", .generation = -1, .device = -1};
    bad |= comm_create(c->store, 0, 1, "x", &o, &dup) != FSDP_EINVAL;
    bad |= strcmp(comm_backend_name(c->comm), "cpu") != 0 || strcmp(comm_group(c->comm), "world") != 0;
    if (bad)
        fprintf(stderr, "rank %d: argument checks failed: %s\n", c->rank, error_message());
    return bad;
}

Test(comm_fail, bad_arguments, .timeout = 60)
{
    int st[MAX_RANKS];
    run_ranks(2, body_bad_args, NULL, NULL, st);
    assert_all_ok(2, st);
}

static int body_nothing(struct rank_ctx *c)
{
    (void)c;
    return 0;
}

static void make_segment(const char *name)
{
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0, "shm_open(%s): %s", name, strerror(errno));
    cr_assert_eq(ftruncate(fd, 4096), 0);
    close(fd);
}

static bool segment_exists(const char *name)
{
    char path[300];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

/* A leader SIGKILLed between its shm_open and the shm_unlink after every rank attached leaves its
 * segment, named after its pid. The next cpu communicator's leader on this host removes such segments of
 * dead pids (and only those: a live pid's segment stays). */
Test(comm_fail, segments_of_dead_leaders_are_swept, .timeout = 60)
{
    pid_t dead = fork();
    cr_assert_geq(dead, 0);
    if (dead == 0)
        _exit(0);
    waitpid(dead, NULL, 0);
    char stale[200], live[200];
    snprintf(stale, sizeof(stale), "/fsdp-sweep%d-world-0-h0-%d", (int)getpid(), (int)dead);
    snprintf(live, sizeof(live), "/fsdp-sweep%d-world-0-h0-%d", (int)getpid(), (int)getpid());
    make_segment(stale);
    make_segment(live);
    int st[MAX_RANKS];
    run_ranks(2, body_nothing, NULL, NULL, st);
    assert_all_ok(2, st);
    bool stale_left = segment_exists(stale), live_left = segment_exists(live);
    shm_unlink(stale);
    shm_unlink(live);
    cr_assert(!stale_left, "%s (pid %d is dead) is still in /dev/shm", stale, (int)dead);
    cr_assert(live_left, "%s (a live pid's segment) was removed", live);
}
