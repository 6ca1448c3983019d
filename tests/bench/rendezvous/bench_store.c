/* Store benchmark: SET+GET pairs per second with 64 concurrent clients, and the time 1024 clients take to
 * pass one barrier, against fsdpc's server and, in the same run with the same C clients, PyTorch's own
 * TCPStore server (tcpstore_peer.py from the PyPI venv), with ratio = fsdpc / PyTorch (above 1: faster
 * for pairs_per_s, slower for time_ms). The clients speak c10d's protocol: fsdpc's handshake and status
 * bytes against fsdpc's server (client=fsdpc), plain c10d as PyTorch's client does against both
 * (client=plain). Both servers run in processes of their own, as in a job (the launcher hosts fsdpc's), and
 * fsdpc's is measured before and after PyTorch's (the mean is printed), so load that comes and goes on a
 * shared machine falls on both. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"
#include "rendezvous/store.h"
#include "tests/util/tu_proc.h"
#include "tests/util/tu_store.h"
#include "tests/util/tu_venv.h"

enum { SETGET_CLIENTS = 64, BARRIER_CLIENTS = 1024, BARRIER_ROUNDS = 9 };
static const double SETGET_SECONDS = 3.0;

struct target {
    int port;
    bool plain;
};

static struct store_client *connect_or_die(const struct target *t)
{
    /* PyTorch's server answers some connections only after seconds when many come at once (measured:
     * about 5 s for one in 50, either backend), so connecting 1024 clients to it takes minutes */
    struct store_client_options o = {.host = "127.0.0.1", .port = t->port, .run_id = "bench", .plain = t->plain,
                                     .connect_timeout_s = 600, .default_timeout_s = 120};
    struct store_client *c = NULL;
    if (store_client_connect(&o, &c) != 0) {
        fprintf(stderr, "bench_store: %s\n", error_message());
        exit(1);
    }
    return c;
}

struct setget_arg {
    struct target t;
    int id;
    pthread_barrier_t *start;
    atomic_bool *stop;
    long pairs;
    int rc;
};

static void *setget_thread(void *p)
{
    struct setget_arg *a = p;
    struct store_client *c = connect_or_die(&a->t);
    char key[32], value[16];
    memset(value, 'x', sizeof value);
    snprintf(key, sizeof key, "k/%d", a->id);
    void *v;
    size_t n;
    a->rc = store_client_set(c, key, value, sizeof value); /* warm-up outside the timed window */
    if (a->rc == 0 && (a->rc = store_client_get(c, key, &v, &n, 0)) == 0)
        free(v);
    pthread_barrier_wait(a->start);
    while (a->rc == 0 && !atomic_load_explicit(a->stop, memory_order_relaxed)) {
        a->rc = store_client_set(c, key, value, sizeof value);
        if (a->rc == 0 && (a->rc = store_client_get(c, key, &v, &n, 0)) == 0) {
            free(v);
            a->pairs++;
        }
    }
    if (a->rc != 0)
        fprintf(stderr, "bench_store: client %d: %s\n", a->id, error_message());
    store_client_close(c);
    return NULL;
}

static double bench_setget(struct target t)
{
    static struct setget_arg args[SETGET_CLIENTS];
    pthread_t th[SETGET_CLIENTS];
    pthread_barrier_t start;
    atomic_bool stop = false;
    pthread_barrier_init(&start, NULL, SETGET_CLIENTS + 1);
    for (int i = 0; i < SETGET_CLIENTS; i++) {
        args[i] = (struct setget_arg){.t = t, .id = i, .start = &start, .stop = &stop};
        pthread_create(&th[i], NULL, setget_thread, &args[i]);
    }
    pthread_barrier_wait(&start);
    double t0 = tu_now();
    tu_nap(SETGET_SECONDS);
    atomic_store(&stop, true);
    long pairs = 0;
    int failed = 0;
    for (int i = 0; i < SETGET_CLIENTS; i++) {
        pthread_join(th[i], NULL);
        pairs += args[i].pairs;
        failed |= args[i].rc != 0;
    }
    double dt = tu_now() - t0;
    pthread_barrier_destroy(&start);
    if (failed)
        exit(1);
    return (double)pairs / dt;
}

struct barrier_arg {
    struct target t;
    const char *name;
    pthread_barrier_t *start; /* all connected and ready before each timed round */
    double end[BARRIER_ROUNDS];
    int rc;
};

static void *barrier_thread(void *p)
{
    struct barrier_arg *a = p;
    struct store_client *c = connect_or_die(&a->t);
    for (int r = 0; r < BARRIER_ROUNDS; r++) {
        pthread_barrier_wait(a->start);
        if (a->rc == 0)
            a->rc = store_client_barrier(c, a->name, BARRIER_CLIENTS, 120);
        a->end[r] = tu_now();
        if (a->rc != 0)
            fprintf(stderr, "bench_store: barrier: %s\n", error_message());
    }
    store_client_close(c);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median over rounds of (last participant out - common start); *connect_s: how long the clients took to
 * connect (all at once, each from its thread). */
static double bench_barrier(struct target t, const char *name, double *connect_s)
{
    static struct barrier_arg args[BARRIER_CLIENTS];
    static pthread_t th[BARRIER_CLIENTS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, BARRIER_CLIENTS + 1);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    double c0 = tu_now();
    for (int i = 0; i < BARRIER_CLIENTS; i++) {
        args[i] = (struct barrier_arg){.t = t, .name = name, .start = &start};
        if (pthread_create(&th[i], &attr, barrier_thread, &args[i]) != 0) {
            fprintf(stderr, "bench_store: cannot start thread %d\n", i);
            exit(1);
        }
    }
    double t0[BARRIER_ROUNDS];
    for (int r = 0; r < BARRIER_ROUNDS; r++) {
        pthread_barrier_wait(&start);
        t0[r] = tu_now();
        if (r == 0)
            *connect_s = t0[0] - c0;
        /* the next pthread barrier waits for every participant of this round */
    }
    int failed = 0;
    for (int i = 0; i < BARRIER_CLIENTS; i++) {
        pthread_join(th[i], NULL);
        failed |= args[i].rc != 0;
    }
    if (failed)
        exit(1);
    double ms[BARRIER_ROUNDS];
    for (int r = 0; r < BARRIER_ROUNDS; r++) {
        double last = 0;
        for (int i = 0; i < BARRIER_CLIENTS; i++)
            if (args[i].end[r] > last)
                last = args[i].end[r];
        ms[r] = (last - t0[r]) * 1e3;
    }
    qsort(ms, BARRIER_ROUNDS, sizeof ms[0], cmp_double);
    pthread_barrier_destroy(&start);
    return ms[BARRIER_ROUNDS / 2];
}

/* PyTorch's TCPStore server in a child (its stdin a pipe we hold: closing it ends the server). */
struct peer {
    pid_t pid;
    int stdin_fd;
    int port;
};

static bool peer_start(struct peer *p)
{
    char python[FSDP_PATH_MAX], script[FSDP_PATH_MAX];
    if (!tu_venv_bin("python", python, sizeof python)) {
        fprintf(stderr, "bench_store: no PyTorch venv (%s): the peer is skipped\n", python);
        return false;
    }
    const char *src = getenv("FSDP_SOURCE_ROOT");
    snprintf(script, sizeof script, "%s/tests/bench/rendezvous/tcpstore_peer.py", src ? src : ".");
    int in[2], out[2];
    if (pipe(in) || pipe(out))
        return false;
    p->pid = fork();
    if (p->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        execl(python, python, script, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    p->stdin_fd = in[1];
    FILE *f = fdopen(out[0], "r");
    char line[128];
    p->port = -1;
    if (f && fgets(line, sizeof line, f) && strncmp(line, "port=", 5) == 0)
        p->port = atoi(line + 5);
    if (f)
        fclose(f);
    if (p->port <= 0) {
        close(p->stdin_fd);
        waitpid(p->pid, NULL, 0);
        fprintf(stderr, "bench_store: the PyTorch peer did not start\n");
        return false;
    }
    return true;
}

static void peer_stop(struct peer *p)
{
    close(p->stdin_fd);
    for (int i = 0; i < 200 && waitpid(p->pid, NULL, WNOHANG) == 0; i++)
        tu_nap(0.05);
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
}

int main(void)
{
    log_init("bench_store");
    log_set_level(LOG_WARN);
    /* before any thread: the server process is a fork of this one */
    pid_t server_pid;
    int port = tu_store_spawn("127.0.0.1", "bench", NULL, &server_pid);
    if (port <= 0) {
        fprintf(stderr, "bench_store: the store server did not start\n");
        return 1;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) { /* 1024 clients */
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    struct target ours = {port, false}, ours_plain = {port, true};
    struct peer peer;
    bool have_peer = peer_start(&peer);
    struct target theirs = {have_peer ? peer.port : 0, true};

    double pps = bench_setget(ours), pps_plain = bench_setget(ours_plain);
    double pps_peer = have_peer ? bench_setget(theirs) : -1;
    pps = (pps + bench_setget(ours)) / 2;
    pps_plain = (pps_plain + bench_setget(ours_plain)) / 2;
    printf("bench=store_setget server=fsdpc client=fsdpc clients=%d pairs_per_s=%.0f seconds=%.1f\n", SETGET_CLIENTS,
           pps, SETGET_SECONDS);
    printf("bench=store_setget server=fsdpc client=plain clients=%d pairs_per_s=%.0f seconds=%.1f\n", SETGET_CLIENTS,
           pps_plain, SETGET_SECONDS);
    if (have_peer)
        printf("bench=store_setget server=torch_tcpstore client=plain clients=%d pairs_per_s=%.0f ratio=%.2f "
               "ratio_plain=%.2f\n", SETGET_CLIENTS, pps_peer, pps / pps_peer, pps_plain / pps_peer);
    else
        printf("bench=store_setget server=torch_tcpstore clients=%d skipped=no_venv\n", SETGET_CLIENTS);
    fflush(stdout);

    double conn = 0, conn2 = 0, conn_peer = 0;
    double ms = bench_barrier(ours, "fsdpc", &conn);
    double ms_peer = have_peer ? bench_barrier(theirs, "torch", &conn_peer) : -1;
    ms = (ms + bench_barrier(ours, "fsdpc2", &conn2)) / 2;
    printf("bench=store_barrier server=fsdpc client=fsdpc clients=%d time_ms=%.1f rounds=%d stat=median "
           "connect_s=%.2f\n", BARRIER_CLIENTS, ms, BARRIER_ROUNDS, (conn + conn2) / 2);
    if (have_peer)
        printf("bench=store_barrier server=torch_tcpstore client=plain clients=%d time_ms=%.1f rounds=%d stat=median "
               "connect_s=%.2f ratio=%.2f\n", BARRIER_CLIENTS, ms_peer, BARRIER_ROUNDS, conn_peer, ms / ms_peer);
    else
        printf("bench=store_barrier server=torch_tcpstore clients=%d skipped=no_venv\n", BARRIER_CLIENTS);
    if (have_peer)
        peer_stop(&peer);
    tu_store_reap(server_pid);
    return 0;
}
