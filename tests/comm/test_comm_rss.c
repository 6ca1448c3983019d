/* What the one-copy path leaves in a rank's resident set: a rank reading peers' registered buffers must
 * not keep all their pages mapped (top, sacct MaxRSS and VmHWM would otherwise show every rank holding
 * all the others' memory, which defeats sharding as users measure it). Each rank allocates and touches
 * large registered buffers, runs direct all_gathers, reduce_scatters, all_reduces and broadcasts on them,
 * and reads /proc/self/status.
 * - Default (FSDP_COMM_SHM_KEEP_PEER_PAGES unset, or last): what the latest operation read stays mapped
 *   until an operation reads other ranges. Afterwards RssShmem holds at most the last operation's reads,
 *   the peak at most two consecutive operations' reads; over a stream of operations on distinct buffers
 *   (FSDP's units) it does not accumulate.
 * - 0: RssShmem comes back to what the own buffers hold; the peak is at most one operation's reads.
 * - 1: the pages read stay mapped, but pages never read are still not. */
#include "comm_test_util.h"
#include "comm/comm_shm.h"
#include "common/rss.h"

#define MIB ((size_t)1 << 20)
#define SLACK_MIB 16 /* allocator, stacks, the store client: what a rank's RSS moves by on its own */

enum keep_mode { KEEP_LAST, KEEP_NONE, KEEP_ALL }; /* FSDP_COMM_SHM_KEEP_PEER_PAGES unset, 0, 1 */

struct rss_arg {
    size_t bytes; /* of each rank's buffer */
    int rounds;   /* the mappings are cached: later rounds must not accumulate either */
    enum keep_mode keep;
    int nbufs; /* body_stream: how many distinct buffers the stream cycles through */
};

struct status_kib {
    long rss, hwm, shmem;
};

static int status_read(struct status_kib *s)
{
    *s = (struct status_kib){rss_status_kib(0, "VmRSS"), rss_status_kib(0, "VmHWM"), rss_status_kib(0, "RssShmem")};
    return s->rss >= 0 && s->hwm >= 0 && s->shmem >= 0 ? 0 : -1;
}

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); goto out; } while (0)

static float val(int rank, size_t i)
{
    return (float)(rank + 1) + (float)(i % 7);
}

static int body_rss(struct rank_ctx *c)
{
    const struct rss_arg *a = c->arg;
    int W = c->size, r = c->rank, bad = 1;
    size_t n = a->bytes / sizeof(float), per = n / (size_t)W;
    float *buf = comm_mem_alloc(c->comm, a->bytes), *out = comm_mem_alloc(c->comm, a->bytes);
    if (!buf || !out)
        FAIL("rank %d: comm_mem_alloc: %s", r, error_message());
    /* Own pages resident before the baseline, so that only what peers' buffers add shows. */
    memset(out, 0, a->bytes);
    for (size_t i = 0; i < n; i++)
        buf[i] = val(r, i);
    if (comm_barrier(c->comm) != 0)
        FAIL("rank %d: barrier: %s", r, error_message());
    struct status_kib s0, s1;
    if (status_read(&s0) != 0)
        FAIL("rank %d: cannot read VmRSS/VmHWM/RssShmem from /proc/self/status", r);
    uint64_t direct0 = shm_direct_count();
    for (int round = 0; round < a->rounds; round++) {
        /* reduce_scatter of buf into out's first share: reads every peer's block r of buf at once */
        if (comm_reduce_scatter(c->comm, buf, out, per, DTYPE_F32, COMM_SUM) != 0)
            FAIL("rank %d: reduce_scatter: %s", r, error_message());
        for (size_t i = 0; i < per; i += 4099) {
            float want = 0;
            for (int q = 0; q < W; q++)
                want += val(q, (size_t)r * per + i);
            if (out[i] != want)
                FAIL("rank %d: reduce_scatter elem %zu: got %g want %g", r, i, (double)out[i], (double)want);
        }
        /* in-place all_gather (the FSDP engine's form): each peer's share of out */
        for (size_t i = 0; i < per; i++)
            out[(size_t)r * per + i] = val(r, i);
        if (comm_all_gather(c->comm, out + (size_t)r * per, out, per, DTYPE_F32) != 0)
            FAIL("rank %d: all_gather: %s", r, error_message());
        for (int q = 0; q < W; q++)
            for (size_t i = 0; i < per; i += 4099)
                if (out[(size_t)q * per + i] != val(q, i))
                    FAIL("rank %d: all_gather block %d elem %zu wrong", r, q, i);
        /* out of place all_reduce: peers' ins, then peers' outs */
        if (comm_all_reduce(c->comm, buf, out, n, DTYPE_F32, COMM_MAX) != 0)
            FAIL("rank %d: all_reduce: %s", r, error_message());
        for (size_t i = 0; i < n; i += 4099)
            if (out[i] != val(W - 1, i))
                FAIL("rank %d: all_reduce elem %zu: got %g want %g", r, i, (double)out[i], (double)val(W - 1, i));
        /* broadcast of one share from a rank that changes with the round */
        int root = round % W;
        for (size_t i = 0; i < per; i++)
            out[i] = val(r, i);
        if (comm_broadcast(c->comm, out, per, DTYPE_F32, root) != 0)
            FAIL("rank %d: broadcast: %s", r, error_message());
        for (size_t i = 0; i < per; i += 4099)
            if (out[i] != val(root, i))
                FAIL("rank %d: broadcast from %d elem %zu wrong", r, root, i);
    }
    if (shm_direct_count() - direct0 != (uint64_t)a->rounds * 4)
        FAIL("rank %d: %llu of %d operations took the one-copy path; this test is about that path", r,
             (unsigned long long)(shm_direct_count() - direct0), a->rounds * 4);
    if (status_read(&s1) != 0)
        FAIL("rank %d: cannot read /proc/self/status", r);
    /* The largest single read: the reduce_scatter's and the all_reduce's W-1 peer blocks of one share. */
    long op_kib = (long)((size_t)(W - 1) * per * sizeof(float) / 1024), slack = SLACK_MIB * 1024;
    fprintf(stderr,
            "rank %d: RssShmem %ld -> %ld kB, VmRSS %ld -> %ld kB, VmHWM %ld -> %ld kB (own buffers %zu kB, "
            "one operation reads at most %ld kB)\n",
            r, s0.shmem, s1.shmem, s0.rss, s1.rss, s0.hwm, s1.hwm, 2 * a->bytes / 1024, op_kib);
    if (a->keep == KEEP_ALL) {
        /* Kept: at least the reduce_scatter's peer blocks. Never mapped: the W-1 blocks of every peer's buf
         * that this rank does not reduce (a whole-allocation MAP_POPULATE would map them). */
        long kept_min = op_kib, never = (long)((size_t)(W - 1) * (size_t)(W - 1) * per * sizeof(float) / 1024);
        long peers_all = (long)((size_t)(W - 1) * 2 * a->bytes / 1024);
        if (s1.shmem - s0.shmem < kept_min - slack)
            FAIL("rank %d: FSDP_COMM_SHM_KEEP_PEER_PAGES=1, but RssShmem grew by only %ld kB (< %ld kB read)", r,
                 s1.shmem - s0.shmem, kept_min);
        if (s1.shmem - s0.shmem > peers_all - never + slack)
            FAIL("rank %d: RssShmem grew by %ld kB: peer pages no operation read are mapped here", r,
                 s1.shmem - s0.shmem);
        bad = 0;
        goto out;
    }
    if (a->keep == KEEP_LAST) {
        /* The last operation, a broadcast, read one share (nothing on its root); the largest two in a row
         * are the all_gather (W-1 shares) and the all_reduce (W-1 shares of ins and of outs). */
        long last_kib = (long)(per * sizeof(float) / 1024);
        if (s1.shmem - s0.shmem > last_kib + slack)
            FAIL("rank %d: RssShmem grew by %ld kB over the operations, more than the last one read (%ld kB)", r,
                 s1.shmem - s0.shmem, last_kib);
        if (s1.hwm - s0.rss > 3 * op_kib + slack)
            FAIL("rank %d: peak RSS rose %ld kB above the start, more than two operations' %ld kB (+%ld slack)",
                 r, s1.hwm - s0.rss, 3 * op_kib, slack);
        bad = 0;
        goto out;
    }
    if (s1.shmem - s0.shmem > slack)
        FAIL("rank %d: RssShmem grew by %ld kB over the operations: peers' buffer pages stay mapped here", r,
             s1.shmem - s0.shmem);
    if (s1.hwm - s0.rss > op_kib + slack)
        FAIL("rank %d: peak RSS rose %ld kB above the start, more than one operation's %ld kB (+%ld slack)", r,
             s1.hwm - s0.rss, op_kib, slack);
    bad = 0;
out:
    comm_mem_free(c->comm, buf);
    comm_mem_free(c->comm, out);
    return bad;
}

/* FSDP's pattern: all_gathers over a stream of distinct registered buffers (one per unit), twice. By
 * default each operation's pages go when the next reads another buffer, so RssShmem ends with at most
 * two operations' reads, far below the peers' shares of all the buffers that keeping everything maps. */
static int body_stream(struct rank_ctx *c)
{
    const struct rss_arg *a = c->arg;
    int W = c->size, r = c->rank, bad = 1, nb = a->nbufs;
    size_t n = a->bytes / sizeof(float), per = n / (size_t)W;
    float *bufs[16] = {0};
    for (int i = 0; i < nb; i++) {
        if (!(bufs[i] = comm_mem_alloc(c->comm, a->bytes)))
            FAIL("rank %d: comm_mem_alloc: %s", r, error_message());
        for (size_t e = 0; e < n; e++)
            bufs[i][e] = (e / per == (size_t)r) ? val(r, e + (size_t)i) : 0.0f;
    }
    if (comm_barrier(c->comm) != 0)
        FAIL("rank %d: barrier: %s", r, error_message());
    struct status_kib s0, s1;
    if (status_read(&s0) != 0)
        FAIL("rank %d: cannot read /proc/self/status", r);
    for (int round = 0; round < a->rounds; round++)
        for (int i = 0; i < nb; i++) {
            if (comm_all_gather(c->comm, bufs[i] + (size_t)r * per, bufs[i], per, DTYPE_F32) != 0)
                FAIL("rank %d: all_gather of buffer %d: %s", r, i, error_message());
            for (int q = 0; q < W; q++)
                for (size_t e = q * per; e < (size_t)(q + 1) * per; e += 4099)
                    if (bufs[i][e] != val(q, e + (size_t)i))
                        FAIL("rank %d: buffer %d block %d elem %zu wrong", r, i, q, e);
        }
    if (status_read(&s1) != 0)
        FAIL("rank %d: cannot read /proc/self/status", r);
    long op_kib = (long)((size_t)(W - 1) * per * sizeof(float) / 1024), slack = SLACK_MIB * 1024;
    long all_kib = op_kib * nb;
    fprintf(stderr, "rank %d: %d buffers, RssShmem %ld -> %ld kB (one operation reads %ld kB, all %ld kB)\n", r,
            nb, s0.shmem, s1.shmem, op_kib, all_kib);
    if (a->keep == KEEP_ALL) {
        if (s1.shmem - s0.shmem < all_kib - slack)
            FAIL("rank %d: FSDP_COMM_SHM_KEEP_PEER_PAGES=1 but RssShmem grew by only %ld kB of %ld kB read", r,
                 s1.shmem - s0.shmem, all_kib);
    } else if (s1.shmem - s0.shmem > (a->keep == KEEP_LAST ? 2 * op_kib : 0) + slack) {
        FAIL("rank %d: RssShmem grew by %ld kB over %d operations on distinct buffers (each reads %ld kB): peers' "
             "pages accumulate",
             r, s1.shmem - s0.shmem, a->rounds * nb, op_kib);
    }
    bad = 0;
out:
    for (int i = 0; i < nb; i++)
        comm_mem_free(c->comm, bufs[i]);
    return bad;
}

static void run_mode(int world, rank_body body, struct rss_arg *a)
{
    int st[MAX_RANKS];
    /* this test's own process: the ranks inherit it (each Criterion test runs in its own process) */
    if (a->keep == KEEP_ALL)
        setenv("FSDP_COMM_SHM_KEEP_PEER_PAGES", "1", 1);
    else if (a->keep == KEEP_NONE)
        setenv("FSDP_COMM_SHM_KEEP_PEER_PAGES", "0", 1);
    else
        unsetenv("FSDP_COMM_SHM_KEEP_PEER_PAGES");
    struct run_opts o = {.limit_s = 100};
    run_ranks(world, body, a, &o, st);
    assert_all_ok(world, st);
}

static void run_rss(int world, size_t bytes, enum keep_mode keep)
{
    struct rss_arg a = {.bytes = bytes, .rounds = 3, .keep = keep};
    run_mode(world, body_rss, &a);
}

static void run_stream(int world, enum keep_mode keep)
{
    struct rss_arg a = {.bytes = 16 * MIB, .rounds = 2, .keep = keep, .nbufs = 8};
    run_mode(world, body_stream, &a);
}

Test(comm_rss, last_operation_kept_world2, .timeout = 120) { run_rss(2, 64 * MIB, KEEP_LAST); }
Test(comm_rss, last_operation_kept_world4, .timeout = 120) { run_rss(4, 32 * MIB, KEEP_LAST); }
Test(comm_rss, peer_pages_released_world2, .timeout = 120) { run_rss(2, 64 * MIB, KEEP_NONE); }
Test(comm_rss, peer_pages_released_world4, .timeout = 120) { run_rss(4, 32 * MIB, KEEP_NONE); }
/* The opt-out keeps what was read mapped, and still maps nothing that was not read. */
Test(comm_rss, keep_peer_pages_world2, .timeout = 120) { run_rss(2, 64 * MIB, KEEP_ALL); }
Test(comm_rss, stream_does_not_accumulate_world2, .timeout = 120) { run_stream(2, KEEP_LAST); }
Test(comm_rss, stream_does_not_accumulate_world4, .timeout = 120) { run_stream(4, KEEP_LAST); }
/* The same stream with everything kept does accumulate: the test above can tell the two apart. */
Test(comm_rss, stream_keep_all_accumulates_world2, .timeout = 120) { run_stream(2, KEEP_ALL); }

/* A value the variable does not allow stops every rank at once with a message naming it: not only the
 * leader that creates the segment while the others wait for it until the deadline. */
static int body_bad_env(struct rank_ctx *c)
{
    struct comm_options o = {.generation = 0};
    struct comm *comm = NULL;
    double t0 = tu_now();
    if (comm_create(c->store, c->rank, c->size, "badenv", &o, &comm) == 0) {
        fprintf(stderr, "rank %d: comm_create accepted FSDP_COMM_SHM_KEEP_PEER_PAGES=sometimes\n", c->rank);
        comm_destroy(comm);
        return 1;
    }
    const char *msg = error_message();
    if (!strstr(msg, "FSDP_COMM_SHM_KEEP_PEER_PAGES=sometimes") || !strstr(msg, "last")) {
        fprintf(stderr, "rank %d: the error does not name the variable and what it allows: %s\n", c->rank, msg);
        return 1;
    }
    if (tu_now() - t0 > 5) {
        fprintf(stderr, "rank %d: refused after %.1f s, not at once\n", c->rank, tu_now() - t0);
        return 1;
    }
    return 0;
}

Test(comm_rss, bad_keep_value_refused_on_every_rank, .timeout = 60)
{
    int st[MAX_RANKS];
    setenv("FSDP_COMM_SHM_KEEP_PEER_PAGES", "sometimes", 1);
    struct run_opts o = {.no_comm = true, .timeout_s = 30, .limit_s = 50};
    run_ranks(3, body_bad_env, NULL, &o, st);
    assert_all_ok(3, st);
}
