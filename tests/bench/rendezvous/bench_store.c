/* Store benchmark: SET+GET pairs per second with 64 concurrent clients, and the time 1024 clients take to
 * pass one barrier; each figure is followed by torch.distributed.TCPStore doing the same work in the same
 * run (tcpstore_peer.py) and the ratio ours/peer (above 1: we are faster for pairs_per_s, slower for
 * time_ms). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/store.h"
#include "tests/util/tu_proc.h"

enum { SETGET_CLIENTS = 64, BARRIER_CLIENTS = 1024, BARRIER_ROUNDS = 3 };
static const double SETGET_SECONDS = 3.0;

static struct store_client *connect_or_die(int port)
{
    struct store_client_options o = {.host = "127.0.0.1", .port = port, .run_id = "bench",
                                     .connect_timeout_s = 60, .default_timeout_s = 120};
    struct store_client *c = NULL;
    if (store_client_connect(&o, &c) != 0) {
        fprintf(stderr, "bench_store: %s\n", error_message());
        exit(1);
    }
    return c;
}

struct setget_arg {
    int port, id;
    pthread_barrier_t *start;
    atomic_bool *stop;
    long pairs;
    int rc;
};

static void *setget_thread(void *p)
{
    struct setget_arg *a = p;
    struct store_client *c = connect_or_die(a->port);
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

static double bench_setget(int port)
{
    static struct setget_arg args[SETGET_CLIENTS];
    pthread_t t[SETGET_CLIENTS];
    pthread_barrier_t start;
    atomic_bool stop = false;
    pthread_barrier_init(&start, NULL, SETGET_CLIENTS + 1);
    for (int i = 0; i < SETGET_CLIENTS; i++) {
        args[i] = (struct setget_arg){.port = port, .id = i, .start = &start, .stop = &stop};
        pthread_create(&t[i], NULL, setget_thread, &args[i]);
    }
    pthread_barrier_wait(&start);
    double t0 = tu_now();
    struct timespec d = {.tv_sec = (time_t)SETGET_SECONDS,
                         .tv_nsec = (long)((SETGET_SECONDS - (double)(time_t)SETGET_SECONDS) * 1e9)};
    nanosleep(&d, NULL);
    atomic_store(&stop, true);
    long pairs = 0;
    int failed = 0;
    for (int i = 0; i < SETGET_CLIENTS; i++) {
        pthread_join(t[i], NULL);
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
    int port;
    pthread_barrier_t *start; /* all connected and ready before each timed round */
    double end[BARRIER_ROUNDS];
    int rc;
};

static void *barrier_thread(void *p)
{
    struct barrier_arg *a = p;
    struct store_client *c = connect_or_die(a->port);
    for (int r = 0; r < BARRIER_ROUNDS; r++) {
        pthread_barrier_wait(a->start);
        if (a->rc == 0)
            a->rc = store_client_barrier(c, "bench", BARRIER_CLIENTS, 120);
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

/* Median over rounds of (last participant out - common start). */
static double bench_barrier(int port)
{
    static struct barrier_arg args[BARRIER_CLIENTS];
    static pthread_t t[BARRIER_CLIENTS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, BARRIER_CLIENTS + 1);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (int i = 0; i < BARRIER_CLIENTS; i++) {
        args[i] = (struct barrier_arg){.port = port, .start = &start};
        if (pthread_create(&t[i], &attr, barrier_thread, &args[i]) != 0) {
            fprintf(stderr, "bench_store: cannot start thread %d\n", i);
            exit(1);
        }
    }
    double t0[BARRIER_ROUNDS];
    for (int r = 0; r < BARRIER_ROUNDS; r++) {
        pthread_barrier_wait(&start);
        t0[r] = tu_now();
        /* wait for the round to end before releasing the next: the next pthread barrier does that */
    }
    int failed = 0;
    for (int i = 0; i < BARRIER_CLIENTS; i++) {
        pthread_join(t[i], NULL);
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

/* Runs the peer script and returns its figure for `field`, or a negative number if it could not run. */
static double run_peer(const char *mode, int clients, const char *field)
{
    const char *src = getenv("FSDP_SOURCE_ROOT");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/bench/rendezvous/tcpstore_peer.py %s --clients %d "
             "--seconds %.1f", src ? src : ".", mode, clients, SETGET_SECONDS);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    char line[512];
    double v = -1;
    char pat[64];
    snprintf(pat, sizeof pat, "%s=", field);
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, pat);
        if (strncmp(line, "bench=", 6) == 0 && p)
            v = atof(p + strlen(pat));
    }
    if (pclose(f) != 0)
        return -1;
    return v;
}

int main(void)
{
    log_init("bench_store");
    log_set_level(LOG_WARN);
    struct store_server_options so = {.bind_addr = "127.0.0.1", .port = 0, .run_id = "bench"};
    struct store_server *s = NULL;
    if (store_server_start(&so, &s) != 0) {
        fprintf(stderr, "bench_store: %s\n", error_message());
        return 1;
    }
    int port = store_server_port(s);

    double pps = bench_setget(port);
    printf("bench=store_setget clients=%d pairs_per_s=%.0f seconds=%.1f\n", SETGET_CLIENTS, pps, SETGET_SECONDS);
    fflush(stdout);
    double ms = bench_barrier(port);
    printf("bench=store_barrier clients=%d time_ms=%.1f rounds=%d stat=median\n", BARRIER_CLIENTS, ms,
           BARRIER_ROUNDS);
    fflush(stdout);
    store_server_stop(s);

    double peer = run_peer("setget", SETGET_CLIENTS, "pairs_per_s");
    if (peer > 0)
        printf("bench=store_setget peer=torch_tcpstore clients=%d pairs_per_s=%.0f ratio=%.2f\n", SETGET_CLIENTS,
               peer, pps / peer);
    else
        printf("bench=store_setget peer=torch_tcpstore clients=%d skipped=peer_failed\n", SETGET_CLIENTS);
    fflush(stdout);
    double peer_ms = run_peer("barrier", BARRIER_CLIENTS, "time_ms");
    if (peer_ms > 0)
        printf("bench=store_barrier peer=torch_tcpstore clients=%d time_ms=%.1f ratio=%.2f\n", BARRIER_CLIENTS,
               peer_ms, ms / peer_ms);
    else
        printf("bench=store_barrier peer=torch_tcpstore clients=%d skipped=peer_failed\n", BARRIER_CLIENTS);
    return 0;
}
