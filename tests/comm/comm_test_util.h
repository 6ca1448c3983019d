/* Multi-rank harness for the comm tests: a store server in a child process (tests/util/tu_store.h), one
 * forked child per rank that connects its own store client, builds a communicator and runs a body; the
 * child _exit()s with 0 (pass) or 1 (its stderr says why). Children never call cr_*. Also the data
 * generator and the straightforward reference reduction the results are compared with. */
#ifndef FSDP_TESTS_COMM_UTIL_H
#define FSDP_TESTS_COMM_UTIL_H

#include "comm/comm.h"
#include "comm/comm_internal.h"
#include "common/error.h"
#include "rendezvous/store.h"
#include "tests/util/tu_netns.h"
#include "tests/util/tu_proc.h"
#include "tests/util/tu_store.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 16

struct rank_ctx {
    int rank, size;
    struct store_client *store;
    struct comm *comm;
    const void *arg;
};

/* Returns 0 on success; a failing body prints why to stderr. */
typedef int (*rank_body)(struct rank_ctx *ctx);

struct run_opts {
    const char *run_id;       /* FSDP_RUN_ID for the children (shm names); NULL = "t<pid>" */
    double timeout_s;         /* FSDP_COMM_TIMEOUT_S; 0 = 60 */
    int hosts;                /* > 1: fake this many hosts (FSDP_COMM_HOST_ID), ranks split contiguously;
                               * < -1: -hosts hosts, rank r on host r % -hosts (interleaved) */
    bool force_tcp;
    bool no_comm;             /* body creates what it needs */
    double limit_s;           /* parent kills children after this; 0 = 100 */
    const char *slot_kib;     /* FSDP_COMM_SHM_SLOT_KIB; NULL = "64" (exercise chunking) */
    /* Two real hosts: network namespaces (ip netns names). The store server and the first half of the
     * ranks live in netns[0], the rest in netns[1]; everyone reaches the store at store_addr. */
    const char *netns[2];
    const char *store_addr;
};

static inline int tu_connect(const char *host, int port, struct store_client **out)
{
    struct store_client_options co = {.host = host ? host : "127.0.0.1", .port = port, .run_id = "commtest",
                                      .connect_timeout_s = 30, .default_timeout_s = 60};
    return store_client_connect(&co, out);
}

/* Runs body on `size` ranks; fills status[] with each child's wait status. */
static inline void run_ranks(int size, rank_body body, const void *arg, const struct run_opts *o_in,
                             int status[MAX_RANKS])
{
    struct run_opts o = o_in ? *o_in : (struct run_opts){0};
    pid_t srv_pid;
    int port = tu_store_spawn(NULL, "commtest", o.netns[0], &srv_pid);
    cr_assert(port > 0, "the store server process did not start");
    char run_id[64], tmo[32];
    snprintf(run_id, sizeof(run_id), "%s", o.run_id ? o.run_id : "");
    if (!o.run_id)
        snprintf(run_id, sizeof(run_id), "t%d", (int)getpid());
    snprintf(tmo, sizeof(tmo), "%g", o.timeout_s > 0 ? o.timeout_s : 60.0);
    pid_t pids[MAX_RANKS];
    fflush(NULL);
    for (int r = 0; r < size; r++) {
        pids[r] = fork();
        cr_assert(pids[r] >= 0);
        if (pids[r] != 0)
            continue;
        setenv("FSDP_RUN_ID", run_id, 1);
        setenv("FSDP_COMM_TIMEOUT_S", tmo, 1);
        setenv("FSDP_COMM_SHM_SLOT_KIB", o.slot_kib ? o.slot_kib : "64", 1);
        if (o.force_tcp)
            setenv("FSDP_COMM_FORCE_TCP", "1", 1);
        if (o.hosts > 1 || o.hosts < -1) {
            char h[16];
            snprintf(h, sizeof(h), "host%d", o.hosts > 0 ? r / (size / o.hosts) : r % -o.hosts);
            setenv("FSDP_COMM_HOST_ID", h, 1);
        }
        if (o.netns[0] && tu_netns_enter(o.netns[r < size / 2 ? 0 : 1]) != 0) {
            fprintf(stderr, "rank %d: cannot enter its network namespace\n", r);
            _exit(1);
        }
        struct rank_ctx ctx = {.rank = r, .size = size, .arg = arg};
        int rc = tu_connect(o.store_addr, port, &ctx.store);
        if (rc) {
            fprintf(stderr, "rank %d: store connect: %s\n", r, error_message());
            _exit(1);
        }
        if (!o.no_comm && comm_create(ctx.store, r, size, "world", NULL, &ctx.comm) != 0) {
            fprintf(stderr, "rank %d: comm_create: %s\n", r, error_message());
            _exit(1);
        }
        rc = body(&ctx);
        comm_destroy(ctx.comm);
        store_client_close(ctx.store);
        fflush(NULL);
        _exit(rc ? 1 : 0);
    }
    double limit = o.limit_s > 0 ? o.limit_s : 100, t0 = tu_now();
    int left = size;
    for (int r = 0; r < size; r++)
        status[r] = -1;
    while (left > 0) {
        for (int r = 0; r < size; r++) {
            if (status[r] != -1)
                continue;
            int st;
            if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
                status[r] = st;
                left--;
            }
        }
        if (left > 0 && tu_now() - t0 > limit) {
            for (int r = 0; r < size; r++)
                if (status[r] == -1)
                    kill(pids[r], SIGKILL);
        }
        if (left > 0)
            usleep(20000);
    }
    tu_store_reap(srv_pid);
}

static inline void assert_all_ok(int size, const int status[MAX_RANKS])
{
    for (int r = 0; r < size; r++)
        cr_assert(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
                  "rank %d of %d failed (wait status 0x%x; its stderr says why)", r, size, status[r]);
}

/* Deterministic non-integer values so that summation order shows in the low bits. */
static inline float tu_gen(int rank, size_t i, int salt)
{
    uint32_t h = (uint32_t)rank * 2654435761u ^ (uint32_t)i * 2246822519u ^ (uint32_t)salt * 3266489917u;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    h *= 0x297a2d39u;
    h ^= h >> 15;
    return (float)((int)(h % 2001u) - 1000) / 37.0f;
}

static inline float tu_round(enum dtype dt, float f)
{
    if (dt == DTYPE_BF16)
        return dtype_bf16_to_f32(dtype_f32_to_bf16(f));
    if (dt == DTYPE_F16)
        return dtype_f16_to_f32(dtype_f32_to_f16(f));
    return f;
}

static inline void tu_put(enum dtype dt, void *buf, size_t i, float f)
{
    if (dt == DTYPE_F32)
        ((float *)buf)[i] = f;
    else if (dt == DTYPE_BF16)
        ((uint16_t *)buf)[i] = dtype_f32_to_bf16(f);
    else
        ((uint16_t *)buf)[i] = dtype_f32_to_f16(f);
}

static inline float tu_get(enum dtype dt, const void *buf, size_t i)
{
    if (dt == DTYPE_F32)
        return ((const float *)buf)[i];
    if (dt == DTYPE_BF16)
        return dtype_bf16_to_f32(((const uint16_t *)buf)[i]);
    return dtype_f16_to_f32(((const uint16_t *)buf)[i]);
}

/* The documented order: per host (ranks split contiguously over `hosts`, or with hosts < -1 rank r on
 * host r % -hosts), f32 sum in rank order, rounded to dtype when the host sum is an intermediate; then
 * hosts in order (of their lowest rank); AVG divides once; round once. `ranks` lists the members in
 * group order (NULL = 0..size-1). */
static inline float tu_ref_reduce(enum dtype dt, enum comm_op op, int size, int hosts, const int *ranks,
                                  size_t idx, int salt)
{
    bool interleaved = hosts < -1;
    int nh = hosts < -1 ? -hosts : hosts < 1 ? 1 : hosts;
    int per = size / nh;
    float total = 0;
    for (int h = 0; h < nh; h++) {
        float p = 0;
        for (int k = 0; k < per; k++) {
            int q = interleaved ? h + k * nh : h * per + k;
            float v = tu_round(dt, tu_gen(ranks ? ranks[q] : q, idx, salt));
            p = k == 0 ? v : op == COMM_MAX ? (v > p ? v : p) : p + v;
        }
        if (nh > 1)
            p = tu_round(dt, p);
        total = h == 0 ? p : op == COMM_MAX ? (p > total ? p : total) : total + p;
    }
    if (op == COMM_AVG)
        total /= (float)size;
    return tu_round(dt, total);
}

/* Bitwise comparison of element i against a reference value already rounded to dt. */
static inline bool tu_same(enum dtype dt, const void *buf, size_t i, float ref)
{
    float got = tu_get(dt, buf, i);
    return memcmp(&got, &ref, sizeof(float)) == 0;
}

#endif
