/* The CUDA emulator's NCCL stand-in (gpu/emu/emu_nccl.c) alone, over tests/gpu/emu/emu_stub.c (ops run at once on
 * the calling thread, device memory is registered host memory). Every test forks real rank processes that meet
 * through the emulator's shared memory, as fsdpc's ranks do; the ranks report through a shared page and their
 * exit codes (they never call cr_*), each under an alarm(). Expected values are computed here independently
 * (rounding by searching the nearest representable value, not by bit tricks), and compared bit for bit. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>

#include "gpu/emu/emu.h"

#include "common/clock.h"

#include <dirent.h>
#include <errno.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

cudaError_t emu_stub_host_alloc(void **p, size_t bytes);
const char *emu_stub_last_failure(void);
void emu_stub_reset(void);

#define MAXR 8
#define RING_BYTES (128 << 10) /* the emulator's ring per ordered pair */
#define HALF_BYTES (512 << 10) /* half of a rank's staging slot: one phase of a collective */
#define STREAM ((cudaStream_t)0)

/* ------------------------------------------------------------------------------------------------------------
 * Worlds of forked ranks */

struct shared {
    char msg[MAXR][768]; /* a rank's first failure */
    int pid[MAXR];
    double t[MAXR][4];
    uint64_t hash[MAXR][64];
    ncclUniqueId id[4];
    _Atomic int flag;
};

static struct shared *sh;

typedef int (*rank_fn)(int rank, int n, void *arg);

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

__attribute__((format(printf, 3, 4))) static int rank_fail(int rank, int line, const char *fmt, ...)
{
    if (!sh->msg[rank][0]) {
        int k = snprintf(sh->msg[rank], sizeof sh->msg[rank], "line %d: ", line);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sh->msg[rank] + k, sizeof sh->msg[rank] - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return 1;
}

/* In a rank: on failure, note why and end the rank's function with 1. */
#define CHECK(rank, cond, ...)                                                                                  \
    do {                                                                                                      \
        if (!(cond))                                                                                          \
            return rank_fail(rank, __LINE__, __VA_ARGS__);                                                    \
    } while (0)

#define NCHECK(rank, call)                                                                                    \
    do {                                                                                                      \
        ncclResult_t r_ = (call);                                                                             \
        if (r_ != ncclSuccess)                                                                                \
            return rank_fail(rank, __LINE__, "%s: %s: %s", #call, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
    } while (0)

/* The shared page and n fresh ids, made in the test process (the ids' names carry its pid). */
static void world_setup(void)
{
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(sh != MAP_FAILED);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ncclGetUniqueId(&sh->id[i]), ncclSuccess);
}

/* Runs fn in n forked ranks, each under alarm(alarm_s); expects every rank's exit code 0. */
static void run_world(int n, rank_fn fn, void *arg, unsigned alarm_s)
{
    pid_t pids[MAXR];
    memset(sh->msg, 0, sizeof sh->msg);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        cr_assert(pids[r] >= 0, "fork: %s", strerror(errno));
        if (pids[r] == 0) {
            alarm(alarm_s);
            sh->pid[r] = (int)getpid();
            int rc = fn(r, n, arg);
#ifdef __SANITIZE_ADDRESS__
            /* _exit skips LeakSanitizer's check at exit: a rank that passed checks for leaks here */
            if (rc == 0 && __lsan_do_recoverable_leak_check()) {
                snprintf(sh->msg[r], sizeof sh->msg[r], "LeakSanitizer found leaks (see the log)");
                rc = 1;
            }
#endif
            _exit(rc);
        }
    }
    double deadline = clock_now_s() + alarm_s + 5;
    int status[MAXR];
    for (int r = 0; r < n; r++) {
        for (;;) {
            pid_t w = waitpid(pids[r], &status[r], WNOHANG);
            if (w == pids[r])
                break;
            if (clock_now_s() > deadline) {
                kill(pids[r], SIGKILL);
                waitpid(pids[r], &status[r], 0);
                break;
            }
            sleep_s(0.002);
        }
    }
    for (int r = 0; r < n; r++) {
        cr_expect(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0, "world %d: rank %d %s %d: %s", n, r,
                  WIFEXITED(status[r]) ? "exited with" : "was killed by signal",
                  WIFEXITED(status[r]) ? WEXITSTATUS(status[r]) : WTERMSIG(status[r]), sh->msg[r]);
    }
}

/* Nothing of this test process's communicators is left in /dev/shm (their names carry its pid). */
static void assert_no_leftovers(void)
{
    char prefix[64], found[512] = "";
    snprintf(prefix, sizeof prefix, "fsdpc-emu-nccl-%d-", (int)getpid());
    DIR *d = opendir("/dev/shm");
    cr_assert(d, "opendir /dev/shm: %s", strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix)) && strlen(found) + strlen(e->d_name) + 2 < sizeof found) {
            strcat(found, e->d_name);
            strcat(found, " ");
        }
    closedir(d);
    cr_assert(!found[0], "left in /dev/shm: %s", found);
}

/* ------------------------------------------------------------------------------------------------------------
 * Independent reference arithmetic */

static float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_of_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bf16_value(uint16_t h)
{
    return f32_of_bits((uint32_t)h << 16);
}

/* f16 by its definition: (1024 + m) x 2^(e - 25), subnormals m x 2^-24; tabled once per process. */
static double f16_value(uint16_t h)
{
    static double table[65536];
    static bool made;
    if (!made) {
        for (int b = 0; b < 65536; b++) {
            int e = (b >> 10) & 31, m = b & 1023;
            double v = e ? 1024 + m : m, p = 1;
            for (int k = 0; k < (e ? e - 1 : 0); k++)
                p *= 2;
            v = v * p / 16777216.0; /* 2^24 */
            table[b] = b & 0x8000 ? -v : v;
        }
        made = true;
    }
    return table[h];
}

/* The nearest value among lo (|lo| <= |x|) and the next one up in magnitude, ties to the even bits. */
static uint16_t nearest(double x, uint16_t lo, double vlo, double vhi)
{
    double dlo = x - vlo, dhi = vhi - x;
    if (dlo < dhi)
        return lo;
    if (dhi < dlo)
        return (uint16_t)(lo + 1);
    return lo & 1 ? (uint16_t)(lo + 1) : lo;
}

static uint16_t ref_bf16(float f)
{
    uint16_t sign = (uint16_t)(bits_of_f32(f) >> 16 & 0x8000);
    double a = f < 0 ? -(double)f : (double)f;
    uint16_t lo = (uint16_t)(bits_of_f32((float)a) >> 16); /* truncation: the largest bf16 <= |f| */
    return sign | nearest(a, lo, bf16_value(lo), bf16_value((uint16_t)(lo + 1)));
}

static uint16_t ref_f16(float f)
{
    uint16_t sign = f < 0 ? 0x8000 : 0;
    double a = f < 0 ? -(double)f : (double)f;
    if (a >= 65520.0)
        return sign | 0x7c00;
    int lo = 0, hi = 0x7bff; /* positive finite f16 bits ascend with their values: binary search */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (f16_value((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (lo == 0x7bff)
        return sign | 0x7bff;
    return sign | nearest(a, (uint16_t)lo, f16_value((uint16_t)lo), f16_value((uint16_t)(lo + 1)));
}

static size_t tsize(ncclDataType_t t)
{
    return t == ncclFloat32 ? 4 : 2;
}

static float load(ncclDataType_t t, const void *p, size_t i)
{
    if (t == ncclFloat32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == ncclBfloat16 ? bf16_value(h) : (float)f16_value(h);
}

static void store(ncclDataType_t t, void *p, size_t i, float f)
{
    if (t == ncclFloat32)
        ((float *)p)[i] = f;
    else
        ((uint16_t *)p)[i] = t == ncclBfloat16 ? ref_bf16(f) : ref_f16(f);
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Rank r's input element i (salt tells the buffers apart), as the bits of type t: any mantissa, exponents
 * for magnitudes in [1/32, 64), so that f16 sums of up to 8 ranks stay finite. */
static uint32_t gen_bits(ncclDataType_t t, int r, size_t i, int salt)
{
    uint64_t h = mix(((uint64_t)r << 48) ^ ((uint64_t)salt << 40) ^ i);
    uint32_t sign = (uint32_t)(h >> 63), e = (uint32_t)(h >> 32) % 11;
    if (t == ncclFloat32)
        return sign << 31 | (122 + e) << 23 | (uint32_t)(h & 0x7fffff);
    if (t == ncclBfloat16)
        return sign << 15 | (122 + e) << 7 | (uint32_t)(h & 0x7f);
    return sign << 15 | (10 + e) << 10 | (uint32_t)(h & 0x3ff);
}

static float load(ncclDataType_t t, const void *p, size_t i);

static float gen(ncclDataType_t t, int r, size_t i, int salt)
{
    uint32_t b = gen_bits(t, r, i, salt);
    uint16_t h = (uint16_t)b;
    return t == ncclFloat32 ? f32_of_bits(b) : load(t, &h, 0);
}

static void fill(ncclDataType_t t, void *p, size_t count, int r, size_t base, int salt)
{
    for (size_t i = 0; i < count; i++) {
        uint32_t b = gen_bits(t, r, base + i, salt);
        if (t == ncclFloat32)
            ((uint32_t *)p)[i] = b;
        else
            ((uint16_t *)p)[i] = (uint16_t)b;
    }
}

/* Element i of buf holds rank from's input element base + i, bit for bit. */
static bool same_input(ncclDataType_t t, const void *buf, size_t i, int from, size_t base, int salt)
{
    uint32_t b = gen_bits(t, from, base + i, salt);
    return t == ncclFloat32 ? ((const uint32_t *)buf)[i] == b : ((const uint16_t *)buf)[i] == (uint16_t)b;
}

/* The rank-order fp32 reduction of element i of every rank's input, rounded once. */
static float ref_reduce(ncclDataType_t t, ncclRedOp_t op, int n, size_t i, int salt)
{
    float v[MAXR] = {0};
    for (int q = 0; q < n; q++)
        v[q] = gen(t, q, i, salt);
    float acc = v[0];
    for (int q = 1; q < n; q++)
        acc = op == ncclMax ? (v[q] > acc ? v[q] : acc) : op == ncclMin ? (v[q] < acc ? v[q] : acc)
              : op == ncclProd ? acc * v[q] : acc + v[q];
    if (op == ncclAvg)
        acc /= (float)n;
    return acc;
}

static bool same_elem(ncclDataType_t t, const void *p, size_t i, float want)
{
    uint32_t tmp[1];
    store(t, tmp, 0, want);
    return !memcmp((const char *)p + i * tsize(t), tmp, tsize(t));
}

static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static const char *tname(ncclDataType_t t)
{
    return t == ncclFloat32 ? "f32" : t == ncclBfloat16 ? "bf16" : "f16";
}

static const char *oname(ncclRedOp_t o)
{
    return o == ncclSum ? "sum" : o == ncclAvg ? "avg" : o == ncclMax ? "max" : o == ncclMin ? "min" : "prod";
}

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    return ncclMemAlloc(&p, bytes ? bytes : 1) == ncclSuccess ? p : NULL;
}

/* ------------------------------------------------------------------------------------------------------------
 * Settling nonblocking calls, as comm/comm_nccl.c does (yield, then naps up to 1 ms, to a deadline) */

static ncclResult_t settle(ncclComm_t comm, double secs)
{
    double deadline = clock_now_s() + secs;
    for (;;) {
        ncclResult_t state = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess)
            return r;
        if (state != ncclInProgress)
            return state;
        if (clock_now_s() > deadline)
            return ncclInProgress;
        sleep_s(0.0005);
    }
}

static ncclResult_t wait_handle(ncclComm_t volatile *handle, double secs)
{
    double deadline = clock_now_s() + secs;
    while (!*handle) {
        if (clock_now_s() > deadline)
            return ncclInProgress;
        sleep_s(0.0005);
    }
    return ncclSuccess;
}

static ncclConfig_t nonblocking_config(const char *name)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = name;
    return cfg;
}

/* A nonblocking communicator made and settled as nccl_init does. */
static ncclResult_t init_nonblocking(ncclComm_t *comm, int n, int id, int rank)
{
    ncclConfig_t cfg = nonblocking_config("test");
    ncclResult_t r = ncclCommInitRankConfig(comm, n, sh->id[id], rank, &cfg);
    if ((r == ncclInProgress || r == ncclSuccess) && *comm)
        r = settle(*comm, 20);
    return r;
}

/* Finalize (settled), then destroy, as nccl_fini does. */
static ncclResult_t fini(ncclComm_t comm)
{
    ncclResult_t r = ncclCommFinalize(comm);
    if (r == ncclInProgress)
        r = settle(comm, 20);
    if (r == ncclSuccess)
        return ncclCommDestroy(comm);
    ncclCommAbort(comm);
    return r;
}

/* ------------------------------------------------------------------------------------------------------------
 * Every collective x f32/bf16/f16 x sum/avg/max, in and out of place, small and chunked */

static const ncclDataType_t types[] = {ncclFloat32, ncclBfloat16, ncclFloat16};
static const ncclRedOp_t ops[] = {ncclSum, ncclAvg, ncclMax};

/* One all_reduce / reduce / reduce_scatter, checked element by element, by the rank that is rank `me` of comm
 * (failures are noted under `rank`, the world's rank). */
static int check_reduction_as(int rank, int me, int n, ncclComm_t comm, int kind, ncclDataType_t t, ncclRedOp_t op,
                              size_t count, bool inplace, int salt)
{
    size_t es = tsize(t), in_count = kind == 2 ? count * (size_t)n : count;
    int root = n - 1;
    const char *name = kind == 0 ? "all_reduce" : kind == 1 ? "reduce" : "reduce_scatter";
    char *in = dev_alloc(in_count * es), *out = inplace ? NULL : dev_alloc(count * es);
    CHECK(rank, in && (inplace || out), "ncclMemAlloc failed");
    fill(t, in, in_count, me, 0, salt);
    char *res = inplace ? (kind == 2 ? in + (size_t)me * count * es : in) : out;
    if (kind == 0)
        NCHECK(rank, ncclAllReduce(in, res, count, t, op, comm, STREAM));
    else if (kind == 1)
        NCHECK(rank, ncclReduce(in, res, count, t, op, root, comm, STREAM));
    else
        NCHECK(rank, ncclReduceScatter(in, res, count, t, op, comm, STREAM));
    ncclResult_t st;
    NCHECK(rank, ncclCommGetAsyncError(comm, &st));
    CHECK(rank, st == ncclSuccess, "%s: async error %s: %s", name, ncclGetErrorString(st), ncclGetLastError(comm));
    if (kind != 1 || me == root) {
        for (size_t i = 0; i < count; i++) {
            size_t gi = kind == 2 ? (size_t)me * count + i : i;
            float want = ref_reduce(t, op, n, gi, salt);
            CHECK(rank, same_elem(t, res, i, want), "%s %s %s count %zu%s: element %zu is %g, expected %g", name,
                  tname(t), oname(op), count, inplace ? " in place" : "", i, (double)load(t, res, i), (double)want);
        }
    }
    if (kind == 0 && me == rank) {
        /* every rank's bits: the parent compares them */
        int slot = (int)(sh->hash[rank][63]++ % 63);
        sh->hash[rank][slot] = hash_bytes(res, count * es);
    }
    ncclMemFree(in);
    ncclMemFree(out);
    return 0;
}

static int check_reduction(int rank, int n, ncclComm_t comm, int kind, ncclDataType_t t, ncclRedOp_t op,
                           size_t count, bool inplace, int salt)
{
    return check_reduction_as(rank, rank, n, comm, kind, t, op, count, inplace, salt);
}

static int check_all_gather(int rank, int n, ncclComm_t comm, ncclDataType_t t, size_t count, bool inplace, int salt)
{
    size_t es = tsize(t);
    char *out = dev_alloc(count * (size_t)n * es);
    CHECK(rank, out, "ncclMemAlloc failed");
    char *in = inplace ? out + (size_t)rank * count * es : dev_alloc(count * es);
    CHECK(rank, in, "ncclMemAlloc failed");
    fill(t, in, count, rank, 0, salt);
    NCHECK(rank, ncclAllGather(in, out, count, t, comm, STREAM));
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++)
            CHECK(rank, same_input(t, out + (size_t)q * count * es, i, q, 0, salt),
                  "all_gather %s count %zu%s: rank %d's element %zu differs", tname(t), count,
                  inplace ? " in place" : "", q, i);
    if (!inplace)
        ncclMemFree(in);
    ncclMemFree(out);
    return 0;
}

static int check_broadcast(int rank, int n, ncclComm_t comm, ncclDataType_t t, size_t count, bool inplace, int root,
                           int salt)
{
    (void)n;
    size_t es = tsize(t);
    char *out = dev_alloc(count * es);
    CHECK(rank, out, "ncclMemAlloc failed");
    char *in = inplace ? out : dev_alloc(count * es);
    CHECK(rank, in, "ncclMemAlloc failed");
    fill(t, in, count, rank, 0, salt); /* only the root's matters */
    NCHECK(rank, ncclBroadcast(in, out, count, t, root, comm, STREAM));
    for (size_t i = 0; i < count; i++)
        CHECK(rank, same_input(t, out, i, root, 0, salt), "broadcast %s count %zu root %d%s: element %zu differs",
              tname(t), count, root, inplace ? " in place" : "", i);
    if (!inplace)
        ncclMemFree(in);
    ncclMemFree(out);
    return 0;
}

static int rank_collectives(int rank, int n, void *arg)
{
    (void)arg;
    ncclComm_t comm = NULL;
    NCHECK(rank, init_nonblocking(&comm, n, 0, rank));
    int salt = 1;
    for (size_t ti = 0; ti < 3; ti++) {
        ncclDataType_t t = types[ti];
        size_t es = tsize(t);
        /* counts: tiny, odd, and more than one phase (reduce_scatter's phase is 1/n of a half per destination) */
        size_t big = HALF_BYTES / es * 2 + 7, big_rs = HALF_BYTES / es / (size_t)n * 3 + 5;
        size_t counts[] = {1, 7, 1237, big};
        for (size_t ci = 0; ci < 4; ci++)
            for (int inplace = 0; inplace < 2; inplace++) {
                for (size_t oi = 0; oi < 3; oi++) {
                    /* the big counts only with sum and max: the same code paths, fewer seconds */
                    if (ci == 3 && ops[oi] == ncclAvg)
                        continue;
                    for (int kind = 0; kind < 3; kind++) {
                        size_t count = ci == 3 && kind == 2 ? big_rs : counts[ci];
                        if (check_reduction(rank, n, comm, kind, t, ops[oi], count, inplace, salt++))
                            return 1;
                    }
                }
                if (check_all_gather(rank, n, comm, t, counts[ci], inplace, salt++) ||
                    check_broadcast(rank, n, comm, t, counts[ci], inplace, (int)(ci % (size_t)n), salt++))
                    return 1;
            }
    }
    /* prod and min too, once each */
    for (size_t ti = 0; ti < 3; ti++)
        if (check_reduction(rank, n, comm, 0, types[ti], ncclMin, 333, false, salt++) ||
            check_reduction(rank, n, comm, 0, types[ti], ncclProd, 333, false, salt++))
            return 1;
    /* count 0 is nothing, on every collective */
    NCHECK(rank, ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, comm, STREAM));
    NCHECK(rank, ncclAllGather(NULL, NULL, 0, ncclFloat32, comm, STREAM));
    NCHECK(rank, fini(comm));
    return 0;
}

static void collectives_world(int n)
{
    world_setup();
    run_world(n, rank_collectives, NULL, 100);
    /* identical bits on every rank */
    for (int r = 1; r < n; r++)
        for (int k = 0; k < 63; k++)
            cr_expect_eq(sh->hash[r][k], sh->hash[0][k], "all_reduce %d: rank %d's result differs from rank 0's", k, r);
    cr_expect_gt(sh->hash[0][63], 0);
    assert_no_leftovers();
}

Test(emu_nccl, collectives_world1, .timeout = 200) { collectives_world(1); }
Test(emu_nccl, collectives_world2, .timeout = 200) { collectives_world(2); }
Test(emu_nccl, collectives_world3, .timeout = 200) { collectives_world(3); }
Test(emu_nccl, collectives_world4, .timeout = 200) { collectives_world(4); }

/* ------------------------------------------------------------------------------------------------------------
 * Split: by color and key, NOCOLOR, nested, blocking; the nonblocking flow of comm_nccl.c's nccl_split */

/* The parent settles, then the handle arrives, then the child settles. */
static ncclResult_t split_like_fsdpc(ncclComm_t parent, int color, int key, ncclComm_t *out)
{
    ncclConfig_t cfg = nonblocking_config("child");
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommSplit(parent, color, key, &nc, &cfg);
    if (r == ncclSuccess || r == ncclInProgress) {
        r = settle(parent, 20);
        if (r == ncclSuccess && color >= 0)
            r = wait_handle((ncclComm_t volatile *)&nc, 20);
        if (r == ncclSuccess && nc)
            r = settle(nc, 20);
    }
    *out = nc;
    return r;
}

/* Every member's parent rank, gathered on comm, in comm's rank order. */
static int gather_ranks(int rank, ncclComm_t comm, int n, int *out)
{
    int32_t *in = dev_alloc(sizeof(int32_t)), *all = dev_alloc((size_t)n * sizeof(int32_t));
    CHECK(rank, in && all, "ncclMemAlloc failed");
    *in = rank;
    NCHECK(rank, ncclAllGather(in, all, 1, ncclInt32, comm, STREAM));
    ncclResult_t st;
    NCHECK(rank, ncclCommGetAsyncError(comm, &st));
    CHECK(rank, st == ncclSuccess, "all_gather on a child: %s: %s", ncclGetErrorString(st), ncclGetLastError(comm));
    memcpy(out, all, (size_t)n * sizeof(int));
    ncclMemFree(in);
    ncclMemFree(all);
    return 0;
}

static int rank_split(int rank, int n, void *arg)
{
    (void)arg;
    if (rank == 1)
        sleep_s(0.2); /* the others' init is still in progress when they look */
    ncclComm_t parent = NULL;
    ncclConfig_t cfg = nonblocking_config("parent");
    ncclResult_t r = ncclCommInitRankConfig(&parent, n, sh->id[0], rank, &cfg);
    CHECK(rank, (r == ncclInProgress || r == ncclSuccess) && parent, "init: %s", ncclGetErrorString(r));
    if (rank != 1) {
        ncclResult_t st = ncclSuccess;
        NCHECK(rank, ncclCommGetAsyncError(parent, &st));
        CHECK(rank, st == ncclInProgress, "a nonblocking init with a missing rank says %s", ncclGetErrorString(st));
    }
    NCHECK(rank, settle(parent, 20));

    /* by color and key: colors rank % 2, keys descending, so each child's ranks run backwards */
    ncclComm_t child = NULL;
    NCHECK(rank, split_like_fsdpc(parent, rank % 2, n - rank, &child));
    CHECK(rank, child, "no child");
    int want_n = 0, want_rank = 0, cn = -1, cr = -1;
    for (int q = rank % 2; q < n; q += 2) {
        want_n++;
        want_rank += q > rank;
    }
    NCHECK(rank, ncclCommCount(child, &cn));
    NCHECK(rank, ncclCommUserRank(child, &cr));
    CHECK(rank, cn == want_n && cr == want_rank, "child is rank %d of %d, expected %d of %d", cr, cn, want_rank,
          want_n);
    int members[MAXR];
    if (gather_ranks(rank, child, cn, members))
        return 1;
    for (int k = 0; k < cn; k++) {
        int want = (n - 1 - (n - 1 - rank % 2) % 2) - 2 * k; /* the largest parent rank of the color first */
        CHECK(rank, members[k] == want, "child rank %d is parent rank %d, expected %d", k, members[k], want);
    }

    /* NOCOLOR: the last rank asks for no child and gets NULL; the others order by parent rank (equal keys) */
    ncclComm_t c2 = NULL;
    NCHECK(rank, split_like_fsdpc(parent, rank == n - 1 ? NCCL_SPLIT_NOCOLOR : 7, 0, &c2));
    if (rank == n - 1) {
        CHECK(rank, c2 == NULL, "NOCOLOR got a communicator");
    } else {
        NCHECK(rank, ncclCommCount(c2, &cn));
        NCHECK(rank, ncclCommUserRank(c2, &cr));
        CHECK(rank, cn == n - 1 && cr == rank, "NOCOLOR split: rank %d of %d", cr, cn);
        if (gather_ranks(rank, c2, cn, members))
            return 1;
        for (int k = 0; k < cn; k++)
            CHECK(rank, members[k] == k, "child rank %d is parent rank %d", k, members[k]);
    }

    /* a child split again (one group, same keys) */
    ncclComm_t grand = NULL;
    NCHECK(rank, split_like_fsdpc(child, 0, 0, &grand));
    NCHECK(rank, ncclCommCount(grand, &cn));
    NCHECK(rank, ncclCommUserRank(grand, &cr));
    CHECK(rank, cn == want_n && cr == want_rank, "grandchild is rank %d of %d", cr, cn);

    /* blocking: a blocking parent, config NULL: the child comes back from the call */
    ncclComm_t bp = NULL, bc = NULL;
    NCHECK(rank, ncclCommInitRank(&bp, n, sh->id[1], rank));
    NCHECK(rank, ncclCommSplit(bp, rank / 2, rank, &bc, NULL));
    CHECK(rank, bc, "blocking split gave no child");
    NCHECK(rank, ncclCommCount(bc, &cn));
    NCHECK(rank, ncclCommUserRank(bc, &cr));
    int bn = rank / 2 * 2 + 2 <= n ? 2 : 1;
    CHECK(rank, cn == bn && cr == rank % 2, "blocking child is rank %d of %d", cr, cn);
    if (gather_ranks(rank, bc, cn, members))
        return 1;
    for (int k = 0; k < cn; k++)
        CHECK(rank, members[k] == rank / 2 * 2 + k, "blocking child rank %d is parent rank %d", k, members[k]);
    int dev = -1;
    NCHECK(rank, ncclCommCuDevice(bc, &dev));
    CHECK(rank, dev == 0, "device %d", dev);

    NCHECK(rank, ncclCommFinalize(bc));
    NCHECK(rank, ncclCommDestroy(bc));
    NCHECK(rank, ncclCommFinalize(bp));
    NCHECK(rank, ncclCommDestroy(bp));
    NCHECK(rank, fini(grand));
    if (c2)
        NCHECK(rank, fini(c2));
    NCHECK(rank, fini(child));
    NCHECK(rank, fini(parent));
    return 0;
}

Test(emu_nccl, split, .timeout = 60)
{
    world_setup();
    run_world(4, rank_split, NULL, 30);
    world_setup();
    run_world(3, rank_split, NULL, 30);
    assert_no_leftovers();
}

/* ------------------------------------------------------------------------------------------------------------
 * Groups: both ranks send first, messages 3x a ring; order of several messages; all-to-all */

static int check_f(int rank, ncclDataType_t t, const void *buf, size_t count, int from, size_t base, int salt,
                   const char *what)
{
    for (size_t i = 0; i < count; i++)
        CHECK(rank, same_input(t, buf, i, from, base, salt), "%s: element %zu from rank %d differs", what, i, from);
    return 0;
}

static int rank_sendrecv(int rank, int n, void *arg)
{
    (void)arg;
    ncclComm_t comm = NULL;
    NCHECK(rank, init_nonblocking(&comm, n, 0, rank));
    int to = (rank + 1) % n, from = (rank + n - 1) % n;
    size_t count = 3 * RING_BYTES / 4 + 13;
    float *sb = dev_alloc(count * 4), *rb = dev_alloc(count * 4);
    CHECK(rank, sb && rb, "ncclMemAlloc failed");
    fill(ncclFloat32, sb, count, rank, 0, 5);
    /* as comm_nccl.c's nccl_sendrecv: every rank's send comes first in its group */
    NCHECK(rank, ncclGroupStart());
    NCHECK(rank, ncclSend(sb, count, ncclFloat32, to, comm, STREAM));
    NCHECK(rank, ncclRecv(rb, count, ncclFloat32, from, comm, STREAM));
    NCHECK(rank, ncclGroupEnd());
    ncclResult_t st;
    NCHECK(rank, ncclCommGetAsyncError(comm, &st));
    CHECK(rank, st == ncclSuccess, "send/recv: %s: %s", ncclGetErrorString(st), ncclGetLastError(comm));
    if (check_f(rank, ncclFloat32, rb, count, from, 0, 5, "both-send-first"))
        return 1;

    /* several messages to one peer keep their order; a nested group is part of the outer one */
    size_t c1 = 5, c2 = 200003;
    uint16_t *a = dev_alloc(c1 * 2), *b = dev_alloc(c2 * 2), *ra = dev_alloc(c1 * 2), *rb2 = dev_alloc(c2 * 2);
    CHECK(rank, a && b && ra && rb2, "ncclMemAlloc failed");
    fill(ncclBfloat16, a, c1, rank, 0, 6);
    fill(ncclFloat16, b, c2, rank, 0, 7);
    NCHECK(rank, ncclGroupStart());
    NCHECK(rank, ncclSend(a, c1, ncclBfloat16, to, comm, STREAM));
    NCHECK(rank, ncclGroupStart());
    NCHECK(rank, ncclSend(b, c2, ncclFloat16, to, comm, STREAM));
    NCHECK(rank, ncclRecv(ra, c1, ncclBfloat16, from, comm, STREAM));
    NCHECK(rank, ncclGroupEnd());
    NCHECK(rank, ncclRecv(rb2, c2, ncclFloat16, from, comm, STREAM));
    NCHECK(rank, ncclGroupEnd());
    NCHECK(rank, ncclCommGetAsyncError(comm, &st));
    CHECK(rank, st == ncclSuccess, "ordered messages: %s: %s", ncclGetErrorString(st), ncclGetLastError(comm));
    if (check_f(rank, ncclBfloat16, ra, c1, from, 0, 6, "first message") ||
        check_f(rank, ncclFloat16, rb2, c2, from, 0, 7, "second message"))
        return 1;

    /* collectives inside a group, in order, with messages around them placed differently on each rank */
    size_t cc = 70001;
    float *x = dev_alloc(cc * 4), *g = dev_alloc(cc * 4 * (size_t)n);
    CHECK(rank, x && g, "ncclMemAlloc failed");
    fill(ncclFloat32, x, cc, rank, 0, 8);
    NCHECK(rank, ncclGroupStart());
    if (rank % 2)
        NCHECK(rank, ncclSend(sb, count, ncclFloat32, to, comm, STREAM));
    NCHECK(rank, ncclAllReduce(x, x, cc, ncclFloat32, ncclSum, comm, STREAM));
    if (rank % 2 == 0)
        NCHECK(rank, ncclSend(sb, count, ncclFloat32, to, comm, STREAM));
    NCHECK(rank, ncclAllGather(x, g, cc, ncclFloat32, comm, STREAM));
    NCHECK(rank, ncclRecv(rb, count, ncclFloat32, from, comm, STREAM));
    NCHECK(rank, ncclGroupEnd());
    NCHECK(rank, ncclCommGetAsyncError(comm, &st));
    CHECK(rank, st == ncclSuccess, "mixed group: %s: %s", ncclGetErrorString(st), ncclGetLastError(comm));
    for (size_t i = 0; i < cc; i++) {
        float want = ref_reduce(ncclFloat32, ncclSum, n, i, 8);
        CHECK(rank, same_elem(ncclFloat32, x, i, want), "mixed group all_reduce element %zu", i);
        for (int q = 0; q < n; q++)
            CHECK(rank, same_elem(ncclFloat32, g, (size_t)q * cc + i, want), "mixed group all_gather element %zu", i);
    }
    if (check_f(rank, ncclFloat32, rb, count, from, 0, 5, "mixed group message"))
        return 1;
    ncclMemFree(sb);
    ncclMemFree(rb);
    ncclMemFree(a);
    ncclMemFree(b);
    ncclMemFree(ra);
    ncclMemFree(rb2);
    ncclMemFree(x);
    ncclMemFree(g);
    NCHECK(rank, fini(comm));
    return 0;
}

Test(emu_nccl, group_send_recv, .timeout = 60)
{
    world_setup();
    run_world(2, rank_sendrecv, NULL, 30);
    world_setup();
    run_world(3, rank_sendrecv, NULL, 30);
    assert_no_leftovers();
}

static int rank_all_to_all(int rank, int n, void *arg)
{
    (void)arg;
    ncclComm_t comm = NULL;
    NCHECK(rank, init_nonblocking(&comm, n, 0, rank));
    size_t count = 150001, blk = count * 2; /* each block 2.3 rings */
    char *in = dev_alloc((size_t)n * blk), *out = dev_alloc((size_t)n * blk);
    CHECK(rank, in && out, "ncclMemAlloc failed");
    fill(ncclBfloat16, in, count * (size_t)n, rank, 0, 9);
    for (int round = 0; round < 2; round++) {
        memset(out, 0, (size_t)n * blk);
        if (round == 0) {
            /* as COMM_K_ALL_TO_ALL in comm_nccl.c: one group of paired sends and receives, self included */
            NCHECK(rank, ncclGroupStart());
            for (int p = 0; p < n; p++) {
                NCHECK(rank, ncclSend(in + (size_t)p * blk, count, ncclBfloat16, p, comm, STREAM));
                NCHECK(rank, ncclRecv(out + (size_t)p * blk, count, ncclBfloat16, p, comm, STREAM));
            }
            NCHECK(rank, ncclGroupEnd());
        } else {
            NCHECK(rank, ncclAlltoAll(in, out, count, ncclBfloat16, comm, STREAM));
        }
        ncclResult_t st;
        NCHECK(rank, ncclCommGetAsyncError(comm, &st));
        CHECK(rank, st == ncclSuccess, "all-to-all: %s: %s", ncclGetErrorString(st), ncclGetLastError(comm));
        for (int p = 0; p < n; p++)
            if (check_f(rank, ncclBfloat16, out + (size_t)p * blk, count, p, (size_t)rank * count, 9, "all-to-all"))
                return 1;
    }
    ncclMemFree(in);
    ncclMemFree(out);
    NCHECK(rank, fini(comm));
    return 0;
}

Test(emu_nccl, all_to_all, .timeout = 60)
{
    world_setup();
    run_world(4, rank_all_to_all, NULL, 40);
    assert_no_leftovers();
}

/* ------------------------------------------------------------------------------------------------------------
 * Failures: a peer that exits mid-collective, an abort from another thread, mismatched collectives */

struct loop_arg {
    ncclComm_t comm;
    float *buf;
    size_t count;
};

static void *loop_all_reduce(void *p)
{
    struct loop_arg *a = p;
    for (int i = 0; i < 1000000; i++) /* the process exits under it */
        ncclAllReduce(a->buf, a->buf, a->count, ncclFloat32, ncclSum, a->comm, STREAM);
    return NULL;
}

static int rank_peer_exit(int rank, int n, void *arg)
{
    (void)arg;
    ncclComm_t comm = NULL;
    NCHECK(rank, init_nonblocking(&comm, n, 0, rank));
    size_t count = 3 * HALF_BYTES / 4 + 1; /* four phases per all_reduce */
    float *buf = dev_alloc(count * 4);
    CHECK(rank, buf, "ncclMemAlloc failed");
    memset(buf, 0, count * 4);
    if (rank == 1) {
        struct loop_arg la = {comm, buf, count};
        pthread_t th;
        CHECK(rank, pthread_create(&th, NULL, loop_all_reduce, &la) == 0, "pthread_create");
        sleep_s(0.3);
        sh->t[1][0] = clock_now_s();
        _exit(0); /* in the middle of an all_reduce */
    }
    double t0 = clock_now_s(), t_err = 0;
    ncclResult_t st = ncclSuccess, r = ncclSuccess;
    for (int i = 0; i < 1000000 && clock_now_s() < t0 + 15; i++) {
        r = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, STREAM);
        ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess || st != ncclSuccess) {
            t_err = clock_now_s();
            break;
        }
    }
    CHECK(rank, st == ncclRemoteError, "async error %s (call %s), expected ncclRemoteError",
          ncclGetErrorString(st), ncclGetErrorString(r));
    CHECK(rank, t_err - sh->t[1][0] < 2.0, "the error came %.3f s after the peer exited", t_err - sh->t[1][0]);
    sh->t[rank][1] = t_err - sh->t[1][0];
    char want[128];
    snprintf(want, sizeof want, "peer rank 1 (pid %d) exited during all_reduce", sh->pid[1]);
    const char *msg = ncclGetLastError(comm);
    CHECK(rank, strstr(msg, want), "last error '%s' does not say '%s'", msg, want);
    /* later calls fail at once */
    double t1 = clock_now_s();
    r = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, STREAM);
    CHECK(rank, r == ncclRemoteError && clock_now_s() - t1 < 0.5, "a later all_reduce: %s", ncclGetErrorString(r));
    r = ncclCommFinalize(comm);
    CHECK(rank, r == ncclRemoteError, "finalize after the error: %s", ncclGetErrorString(r));
    NCHECK(rank, ncclCommAbort(comm));
    return 0;
}

Test(emu_nccl, peer_exit_mid_collective, .timeout = 60)
{
    world_setup();
    run_world(3, rank_peer_exit, NULL, 30);
    cr_log_info("peer exit seen after %.3f s (rank 0) and %.3f s (rank 2)", sh->t[0][1], sh->t[2][1]);
    assert_no_leftovers();
}

struct abort_arg {
    ncclComm_t comm;
    double t;
};

static void *abort_later(void *p)
{
    struct abort_arg *a = p;
    sleep_s(0.2);
    a->t = clock_now_s();
    ncclCommAbort(a->comm);
    return NULL;
}

static int rank_abort(int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    ncclComm_t comm = NULL;
    NCHECK(rank, init_nonblocking(&comm, n, 0, rank));
    size_t count = 3 * HALF_BYTES / 4 + 1;
    float *buf = dev_alloc(count * 4);
    CHECK(rank, buf, "ncclMemAlloc failed");
    memset(buf, 0, count * 4);
    if (rank == 0) {
        /* the peer is alive but never joins: the op waits until another thread aborts the communicator */
        struct abort_arg a = {comm, 0};
        pthread_t th;
        CHECK(rank, pthread_create(&th, NULL, abort_later, &a) == 0, "pthread_create");
        ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, STREAM);
        double t_ret = clock_now_s();
        pthread_join(th, NULL);
        CHECK(rank, r == ncclSuccess, "the all_reduce was queued: %s", ncclGetErrorString(r));
        /* the abort rings the doorbell the op sleeps on: it returns at once (the slack is for a loaded machine;
         * the time is logged) */
        CHECK(rank, a.t > 0 && t_ret - a.t < 0.5, "the op returned %.3f s after the abort", t_ret - a.t);
        sh->t[0][0] = t_ret - a.t;
        atomic_store(&sh->flag, 1);
        /* alive until the peer has looked: an exited rank is reported as exited, not aborted */
        double t0 = clock_now_s();
        while (atomic_load(&sh->flag) != 2 && clock_now_s() < t0 + 10)
            sleep_s(0.01);
        return 0;
    }
    double t0 = clock_now_s();
    while (!atomic_load(&sh->flag) && clock_now_s() < t0 + 10)
        sleep_s(0.01);
    /* rank 0 published the first phase before its abort; the second finds it aborted */
    ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, STREAM), st = ncclSuccess;
    NCHECK(rank, ncclCommGetAsyncError(comm, &st));
    CHECK(rank, r == ncclSuccess && st == ncclRemoteError, "after the peer's abort: call %s, async %s",
          ncclGetErrorString(r), ncclGetErrorString(st));
    char want[128];
    snprintf(want, sizeof want, "peer rank 0 (pid %d) aborted its communicator during all_reduce", sh->pid[0]);
    CHECK(rank, strstr(ncclGetLastError(comm), want), "last error '%s'", ncclGetLastError(comm));
    atomic_store(&sh->flag, 2);
    NCHECK(rank, ncclCommAbort(comm));
    return 0;
}

Test(emu_nccl, abort_unblocks_waiting_op, .timeout = 60)
{
    world_setup();
    run_world(2, rank_abort, NULL, 30);
    cr_log_info("the waiting op returned %.4f s after ncclCommAbort", sh->t[0][0]);
    assert_no_leftovers();
}

static int rank_mismatch(int rank, int n, void *arg)
{
    (void)arg;
    ncclComm_t comm = NULL;
    NCHECK(rank, init_nonblocking(&comm, n, 0, rank));
    float *a = dev_alloc(10 * 4), *b = dev_alloc(10 * 4 * (size_t)n);
    CHECK(rank, a && b, "ncclMemAlloc failed");
    if (rank == 0)
        NCHECK(rank, ncclAllReduce(a, a, 10, ncclFloat32, ncclSum, comm, STREAM));
    else
        NCHECK(rank, ncclAllGather(a, b, 10, ncclFloat32, comm, STREAM));
    ncclResult_t st;
    NCHECK(rank, ncclCommGetAsyncError(comm, &st));
    CHECK(rank, st == ncclInvalidUsage, "mismatched collectives: %s", ncclGetErrorString(st));
    CHECK(rank, strstr(ncclGetLastError(comm), "same collectives in the same order"), "%s", ncclGetLastError(comm));
    NCHECK(rank, ncclCommAbort(comm));
    return 0;
}

Test(emu_nccl, mismatched_collectives, .timeout = 60)
{
    world_setup();
    run_world(2, rank_mismatch, NULL, 30);
    assert_no_leftovers();
}

/* ------------------------------------------------------------------------------------------------------------
 * Two communicators used at once from two threads of every rank */

struct conc_arg {
    int rank, n, which;
    ncclComm_t comm;
    int rc;
};

static int conc_body(struct conc_arg *c)
{
    int rank = c->rank, n = c->n;
    for (int it = 0; it < 12; it++) {
        size_t count = it == 5 ? HALF_BYTES / 2 + 3 : 1000 + (size_t)it * 977;
        int salt = 100 * c->which + it;
        float *x = dev_alloc(count * 4);
        CHECK(rank, x, "ncclMemAlloc failed");
        fill(ncclFloat32, x, count, rank, 0, salt);
        NCHECK(rank, ncclAllReduce(x, x, count, ncclFloat32, ncclSum, c->comm, STREAM));
        ncclResult_t st;
        NCHECK(rank, ncclCommGetAsyncError(c->comm, &st));
        CHECK(rank, st == ncclSuccess, "comm %d: %s: %s", c->which, ncclGetErrorString(st), ncclGetLastError(c->comm));
        for (size_t i = 0; i < count; i++)
            CHECK(rank, same_elem(ncclFloat32, x, i, ref_reduce(ncclFloat32, ncclSum, n, i, salt)),
                  "comm %d iteration %d element %zu", c->which, it, i);
        /* and a ring of messages */
        float *r = dev_alloc(count * 4);
        CHECK(rank, r, "ncclMemAlloc failed");
        fill(ncclFloat32, x, count, rank, 0, salt);
        NCHECK(rank, ncclGroupStart());
        NCHECK(rank, ncclSend(x, count, ncclFloat32, (rank + 1) % n, c->comm, STREAM));
        NCHECK(rank, ncclRecv(r, count, ncclFloat32, (rank + n - 1) % n, c->comm, STREAM));
        NCHECK(rank, ncclGroupEnd());
        if (check_f(rank, ncclFloat32, r, count, (rank + n - 1) % n, 0, salt, "concurrent ring"))
            return 1;
        ncclMemFree(x);
        ncclMemFree(r);
    }
    return 0;
}

static void *conc_thread(void *p)
{
    struct conc_arg *c = p;
    c->rc = conc_body(c);
    return NULL;
}

static int rank_two_comms(int rank, int n, void *arg)
{
    (void)arg;
    ncclComm_t a = NULL, b = NULL;
    ncclConfig_t cfg = nonblocking_config("two");
    ncclResult_t r1 = ncclCommInitRankConfig(&a, n, sh->id[0], rank, &cfg);
    ncclResult_t r2 = ncclCommInitRankConfig(&b, n, sh->id[1], rank, &cfg);
    CHECK(rank, (r1 == ncclInProgress || r1 == ncclSuccess) && (r2 == ncclInProgress || r2 == ncclSuccess), "init");
    NCHECK(rank, settle(a, 20));
    NCHECK(rank, settle(b, 20));
    struct conc_arg ca = {rank, n, 0, a, -1}, cb = {rank, n, 1, b, -1};
    pthread_t ta, tb;
    CHECK(rank, !pthread_create(&ta, NULL, conc_thread, &ca) && !pthread_create(&tb, NULL, conc_thread, &cb),
          "pthread_create");
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK(rank, ca.rc == 0 && cb.rc == 0, "a thread failed");
    NCHECK(rank, fini(a));
    NCHECK(rank, fini(b));
    return 0;
}

Test(emu_nccl, two_communicators_concurrently, .timeout = 60)
{
    world_setup();
    run_world(3, rank_two_comms, NULL, 40);
    assert_no_leftovers();
}

/* ------------------------------------------------------------------------------------------------------------
 * Refusals: host buffers, unsupported types and ops, bad ranks and ids; init failures are bounded */

static int rank_refusals(int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    int v = 0;
    NCHECK(rank, ncclGetVersion(&v));
    CHECK(rank, v == NCCL_VERSION_CODE, "version %d", v);
    ncclComm_t comm = NULL;
    NCHECK(rank, ncclCommInitRank(&comm, 1, sh->id[0], 0));
    float host[16];
    ncclResult_t r = ncclAllReduce(host, host, 16, ncclFloat32, ncclSum, comm, STREAM);
    CHECK(rank, r == ncclInvalidArgument, "a host buffer: %s", ncclGetErrorString(r));
    CHECK(rank, strstr(ncclGetLastError(NULL), "not inside one live device allocation"), "%s", ncclGetLastError(NULL));
    CHECK(rank, emu_sticky_error() != cudaSuccess, "the device error was not recorded");
    emu_stub_reset();
    void *pinned = NULL;
    CHECK(rank, emu_stub_host_alloc(&pinned, 64) == cudaSuccess, "host alloc");
    r = ncclSend(pinned, 16, ncclFloat32, 0, comm, STREAM);
    CHECK(rank, r == ncclInvalidArgument, "a pinned host buffer: %s", ncclGetErrorString(r));
    emu_stub_reset();
    float *d = dev_alloc(16 * 4), *e = dev_alloc(16 * 4);
    CHECK(rank, d && e, "ncclMemAlloc failed");
    r = ncclAllReduce(d, d, 17, ncclFloat32, ncclSum, comm, STREAM); /* one past the allocation */
    CHECK(rank, r == ncclInvalidArgument, "a range past the allocation: %s", ncclGetErrorString(r));
    emu_stub_reset();
    r = ncclAllReduce(d, d, 16, ncclInt32, ncclSum, comm, STREAM);
    CHECK(rank, r == ncclInvalidArgument && strstr(ncclGetLastError(comm), "reductions of datatype"),
          "an int32 reduction: %s: %s", ncclGetErrorString(r), ncclGetLastError(comm));
    r = ncclAllReduce(d, d, 16, ncclFloat32, (ncclRedOp_t)7, comm, STREAM);
    CHECK(rank, r == ncclInvalidArgument, "op 7: %s", ncclGetErrorString(r));
    r = ncclAllReduce(d, d, 16, (ncclDataType_t)42, ncclSum, comm, STREAM);
    CHECK(rank, r == ncclInvalidArgument, "type 42: %s", ncclGetErrorString(r));
    r = ncclBroadcast(d, d, 16, ncclFloat32, 1, comm, STREAM);
    CHECK(rank, r == ncclInvalidArgument, "root 1 of 1: %s", ncclGetErrorString(r));
    r = ncclSend(d, 16, ncclFloat32, -1, comm, STREAM);
    CHECK(rank, r == ncclInvalidArgument, "peer -1: %s", ncclGetErrorString(r));
    /* copies of integer types work */
    for (int i = 0; i < 16; i++)
        ((int32_t *)d)[i] = i * 1000003;
    NCHECK(rank, ncclAllGather(d, e, 16, ncclInt32, comm, STREAM));
    CHECK(rank, !memcmp(d, e, 64), "int32 all_gather");
    NCHECK(rank, ncclBroadcast(d, e, 64, ncclUint8, 0, comm, STREAM));
    NCHECK(rank, ncclBroadcast(d, e, 64, ncclInt8, 0, comm, STREAM));
    CHECK(rank, !memcmp(d, e, 64), "int8 broadcast");
    /* groups */
    r = ncclGroupEnd();
    CHECK(rank, r == ncclInvalidUsage, "ncclGroupEnd without a group: %s", ncclGetErrorString(r));
    NCHECK(rank, ncclGroupStart());
    NCHECK(rank, ncclSend(d, 16, ncclFloat32, 0, comm, STREAM));
    r = ncclRecv(host, 16, ncclFloat32, 0, comm, STREAM);
    CHECK(rank, r == ncclInvalidArgument, "a host recv in a group: %s", ncclGetErrorString(r));
    r = ncclGroupEnd();
    CHECK(rank, r == ncclInvalidArgument, "a group with a failed call: %s", ncclGetErrorString(r));
    emu_stub_reset();
    /* nothing of that group was queued: a self send/recv pair goes through clean */
    memset(e, 0, 64);
    NCHECK(rank, ncclGroupStart());
    NCHECK(rank, ncclSend(d, 16, ncclFloat32, 0, comm, STREAM));
    NCHECK(rank, ncclRecv(e, 16, ncclFloat32, 0, comm, STREAM));
    NCHECK(rank, ncclGroupEnd());
    ncclResult_t st;
    NCHECK(rank, ncclCommGetAsyncError(comm, &st));
    CHECK(rank, st == ncclSuccess && !memcmp(d, e, 64), "self send/recv: %s: %s", ncclGetErrorString(st),
          ncclGetLastError(comm));
    /* ids and arguments */
    ncclUniqueId junk;
    memset(&junk, 0x5a, sizeof junk);
    ncclComm_t c2 = (ncclComm_t)0x1;
    r = ncclCommInitRank(&c2, 1, junk, 0);
    CHECK(rank, r == ncclInvalidArgument && !c2, "a foreign id: %s", ncclGetErrorString(r));
    r = ncclCommInitRank(&c2, 0, sh->id[1], 0);
    CHECK(rank, r == ncclInvalidArgument, "0 ranks: %s", ncclGetErrorString(r));
    r = ncclCommInitRank(&c2, 17, sh->id[1], 0);
    CHECK(rank, r == ncclInvalidArgument, "17 ranks: %s", ncclGetErrorString(r));
    r = ncclCommInitRank(&c2, 2, sh->id[1], 2);
    CHECK(rank, r == ncclInvalidArgument, "rank 2 of 2: %s", ncclGetErrorString(r));
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.magic = 0;
    r = ncclCommInitRankConfig(&c2, 1, sh->id[1], 0, &bad);
    CHECK(rank, r == ncclInvalidArgument, "a config without its initializer: %s", ncclGetErrorString(r));
    r = ncclCommSplit(comm, -5, 0, &c2, NULL);
    CHECK(rank, r == ncclInvalidArgument, "color -5: %s", ncclGetErrorString(r));
    CHECK(rank, ncclCommDestroy(NULL) == ncclSuccess && ncclCommAbort(NULL) == ncclSuccess, "NULL communicators");
    CHECK(rank, !strcmp(ncclGetErrorString(ncclRemoteError), "remote process exited or there was a network error"),
          "error string");
    NCHECK(rank, ncclCommFinalize(comm));
    r = ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, comm, STREAM);
    CHECK(rank, r == ncclInvalidUsage, "after finalize: %s", ncclGetErrorString(r));
    NCHECK(rank, ncclCommDestroy(comm));
    ncclMemFree(d);
    ncclMemFree(e);
    CHECK(rank, emu_sticky_error() == cudaSuccess, "a device error: %s", emu_stub_last_failure());
    return 0;
}

Test(emu_nccl, refusals, .timeout = 60)
{
    world_setup();
    run_world(1, rank_refusals, NULL, 30);
    assert_no_leftovers();
}

static int rank_init_failures(int rank, int n, void *arg)
{
    (void)arg;
    setenv("FSDP_COMM_TIMEOUT_S", "1", 1); /* waits are bounded by 0.9 s */
    ncclComm_t c = NULL;
    if (rank == 0) {
        /* blocking: a peer that never joins */
        double t0 = clock_now_s();
        ncclResult_t r = ncclCommInitRank(&c, n, sh->id[0], 0);
        double dt = clock_now_s() - t0;
        CHECK(rank, r == ncclRemoteError && !c, "blocking init without its peer: %s", ncclGetErrorString(r));
        CHECK(rank, dt > 0.8 && dt < 3, "it took %.3f s", dt);
        CHECK(rank, strstr(ncclGetLastError(NULL), "rank 1 did not arrive"), "%s", ncclGetLastError(NULL));
        /* nonblocking: in progress, then the error */
        ncclConfig_t cfg = nonblocking_config("nb");
        r = ncclCommInitRankConfig(&c, n, sh->id[1], 0, &cfg);
        CHECK(rank, r == ncclInProgress && c, "nonblocking init: %s", ncclGetErrorString(r));
        ncclResult_t st = ncclSuccess;
        NCHECK(rank, ncclCommGetAsyncError(c, &st));
        CHECK(rank, st == ncclInProgress, "state %s", ncclGetErrorString(st));
        r = settle(c, 5);
        CHECK(rank, r == ncclRemoteError, "settled to %s", ncclGetErrorString(r));
        CHECK(rank, strstr(ncclGetLastError(c), "rank 1 did not arrive"), "%s", ncclGetLastError(c));
        NCHECK(rank, ncclCommAbort(c));
        /* an abort during a nonblocking init returns at once */
        r = ncclCommInitRankConfig(&c, n, sh->id[2], 0, &cfg);
        CHECK(rank, r == ncclInProgress, "nonblocking init: %s", ncclGetErrorString(r));
        sleep_s(0.05);
        t0 = clock_now_s();
        NCHECK(rank, ncclCommAbort(c));
        /* the init's thread sees the flag within a 10 ms slice; the slack is for a loaded 2-core machine */
        CHECK(rank, clock_now_s() - t0 < 0.5, "the abort took %.3f s", clock_now_s() - t0);
        atomic_store(&sh->flag, 1);
    } else {
        double t0 = clock_now_s();
        while (!atomic_load(&sh->flag) && clock_now_s() < t0 + 10)
            sleep_s(0.01);
        /* rank 0 creates the segment (its name is in the id): this rank is the one that finds the mismatch */
        char path[200];
        snprintf(path, sizeof path, "/dev/shm%s", sh->id[3].internal + 8);
        while (access(path, F_OK) != 0 && clock_now_s() < t0 + 15)
            sleep_s(0.001);
    }
    /* the ranks disagree on the number of ranks: both fail, bounded */
    ncclResult_t r = ncclCommInitRank(&c, rank == 0 ? 2 : 3, sh->id[3], rank);
    CHECK(rank, r != ncclSuccess && !c, "a rank-count mismatch initialised");
    if (rank == 1)
        CHECK(rank, r == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "disagree on the number of ranks"),
              "%s: %s", ncclGetErrorString(r), ncclGetLastError(NULL));
    return 0;
}

Test(emu_nccl, init_failures_are_bounded, .timeout = 60)
{
    world_setup();
    run_world(2, rank_init_failures, NULL, 30);
    assert_no_leftovers();
}

/* ------------------------------------------------------------------------------------------------------------
 * Departed peers: a destroy without finalize counts as the peer's finalize; a collective it never joins fails */

static int rank_departed(int rank, int n, void *arg)
{
    (void)arg;
    ncclComm_t a = NULL, b = NULL;
    NCHECK(rank, init_nonblocking(&a, n, 0, rank));
    NCHECK(rank, init_nonblocking(&b, n, 1, rank));
    if (rank == 0) {
        NCHECK(rank, ncclCommDestroy(a));
        NCHECK(rank, ncclCommDestroy(b));
        atomic_store(&sh->flag, 1);
        double t0 = clock_now_s(); /* alive until the peer has looked: the message says destroyed, not exited */
        while (atomic_load(&sh->flag) != 2 && clock_now_s() < t0 + 10)
            sleep_s(0.01);
        return 0;
    }
    NCHECK(rank, fini(a));
    double t0 = clock_now_s();
    while (!atomic_load(&sh->flag) && clock_now_s() < t0 + 10)
        sleep_s(0.01);
    float *x = dev_alloc(64 * 4);
    CHECK(rank, x, "ncclMemAlloc failed");
    NCHECK(rank, ncclAllReduce(x, x, 64, ncclFloat32, ncclSum, b, STREAM));
    ncclResult_t st;
    NCHECK(rank, ncclCommGetAsyncError(b, &st));
    char want[128];
    snprintf(want, sizeof want, "peer rank 0 (pid %d) finalized or destroyed its communicator", sh->pid[0]);
    CHECK(rank, st == ncclRemoteError && strstr(ncclGetLastError(b), want), "%s: %s", ncclGetErrorString(st),
          ncclGetLastError(b));
    atomic_store(&sh->flag, 2);
    NCHECK(rank, ncclCommAbort(b));
    ncclMemFree(x);
    return 0;
}

Test(emu_nccl, departed_peers, .timeout = 60)
{
    world_setup();
    run_world(2, rank_departed, NULL, 30);
    assert_no_leftovers();
}

/* ------------------------------------------------------------------------------------------------------------
 * World 8: a little of everything */

static int rank_world8(int rank, int n, void *arg)
{
    (void)arg;
    ncclComm_t comm = NULL;
    NCHECK(rank, init_nonblocking(&comm, n, 0, rank));
    if (check_reduction(rank, n, comm, 0, ncclFloat32, ncclSum, HALF_BYTES / 4 + 9, false, 1) ||
        check_reduction(rank, n, comm, 0, ncclBfloat16, ncclAvg, 1001, true, 2) ||
        check_reduction(rank, n, comm, 2, ncclFloat16, ncclMax, 20011, false, 3) ||
        check_reduction(rank, n, comm, 1, ncclFloat32, ncclSum, 777, false, 4) ||
        check_all_gather(rank, n, comm, ncclBfloat16, 3001, true, 5) ||
        check_broadcast(rank, n, comm, ncclFloat16, 4099, false, 5, 6))
        return 1;
    ncclComm_t half = NULL;
    NCHECK(rank, split_like_fsdpc(comm, rank / 4, rank, &half));
    int cn = -1, cr = -1;
    NCHECK(rank, ncclCommCount(half, &cn));
    NCHECK(rank, ncclCommUserRank(half, &cr));
    CHECK(rank, cn == 4 && cr == rank % 4, "half is rank %d of %d", cr, cn);
    if (check_reduction_as(rank, cr, cn, half, 0, ncclFloat32, ncclSum, 5000, false, 7))
        return 1;
    NCHECK(rank, fini(half));
    size_t count = 20001, blk = count * 4;
    char *in = dev_alloc((size_t)n * blk), *out = dev_alloc((size_t)n * blk);
    CHECK(rank, in && out, "ncclMemAlloc failed");
    fill(ncclFloat32, in, count * (size_t)n, rank, 0, 8);
    NCHECK(rank, ncclAlltoAll(in, out, count, ncclFloat32, comm, STREAM));
    for (int p = 0; p < n; p++)
        if (check_f(rank, ncclFloat32, out + (size_t)p * blk, count, p, (size_t)rank * count, 8, "all-to-all"))
            return 1;
    ncclMemFree(in);
    ncclMemFree(out);
    NCHECK(rank, fini(comm));
    return 0;
}

Test(emu_nccl, world8, .timeout = 60)
{
    world_setup();
    run_world(8, rank_world8, NULL, 40);
    assert_no_leftovers();
}
