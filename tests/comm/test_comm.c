/* Collectives of the cpu backend on one host (shared memory), forced TCP, 2 fake hosts x 2 or 3 ranks
 * (shared memory + TCP) and 2 real hosts (two network namespaces over a veth pair): every op, dtype and
 * reduction for counts 0, 1, a prime and a chunked size, and 64 MiB, compared bitwise with a reference
 * computed in the documented order. */
#include "comm_test_util.h"
#include "comm/comm_shm.h"

#include <math.h>

static const enum dtype dtypes[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
static const size_t counts[] = {0, 1, 1009, 40009};

struct coll_arg {
    int hosts;
};

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); goto fail; } while (0)

static int body_collectives(struct rank_ctx *c)
{
    const struct coll_arg *a = c->arg;
    int W = c->size, r = c->rank, hosts = a ? a->hosts : 1, salt = 0;
    void *in = NULL, *out = NULL;
    for (size_t di = 0; di < 3; di++) {
        enum dtype dt = dtypes[di];
        size_t es = dtype_size(dt);
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
            size_t n = counts[ci], total = n * (size_t)W;
            in = calloc(total + 1, es);
            out = calloc(total + 1, es);
            if (!in || !out)
                FAIL("rank %d: out of memory", r);

            /* all_gather, out of place then in place */
            salt++;
            for (size_t i = 0; i < n; i++)
                tu_put(dt, in, i, tu_gen(r, i, salt));
            if (comm_all_gather(c->comm, in, out, n, dt) != 0)
                FAIL("rank %d: all_gather: %s", r, error_message());
            for (int q = 0; q < W; q++)
                for (size_t i = 0; i < n; i++)
                    if (!tu_same(dt, out, (size_t)q * n + i, tu_round(dt, tu_gen(q, i, salt))))
                        FAIL("rank %d: all_gather %s n=%zu: block %d elem %zu wrong", r, dtype_name(dt), n,
                             q, i);
            salt++;
            memset(out, 0, total * es);
            for (size_t i = 0; i < n; i++)
                tu_put(dt, out, (size_t)r * n + i, tu_gen(r, i, salt));
            if (comm_all_gather(c->comm, (char *)out + (size_t)r * n * es, out, n, dt) != 0)
                FAIL("rank %d: in-place all_gather: %s", r, error_message());
            for (int q = 0; q < W; q++)
                for (size_t i = 0; i < n; i++)
                    if (!tu_same(dt, out, (size_t)q * n + i, tu_round(dt, tu_gen(q, i, salt))))
                        FAIL("rank %d: in-place all_gather %s n=%zu: block %d elem %zu wrong", r,
                             dtype_name(dt), n, q, i);

            for (enum comm_op op = COMM_SUM; op <= COMM_MAX; op++) {
                /* all_reduce out of place, then in place */
                salt++;
                for (size_t i = 0; i < n; i++)
                    tu_put(dt, in, i, tu_gen(r, i, salt));
                if (comm_all_reduce(c->comm, in, out, n, dt, op) != 0)
                    FAIL("rank %d: all_reduce: %s", r, error_message());
                for (size_t i = 0; i < n; i++)
                    if (!tu_same(dt, out, i, tu_ref_reduce(dt, op, W, hosts, NULL, i, salt)))
                        FAIL("rank %d: all_reduce %s op %d n=%zu elem %zu: got %.9g want %.9g", r,
                             dtype_name(dt), op, n, i, (double)tu_get(dt, out, i),
                             (double)tu_ref_reduce(dt, op, W, hosts, NULL, i, salt));
                if (comm_all_reduce(c->comm, in, in, n, dt, op) != 0)
                    FAIL("rank %d: in-place all_reduce: %s", r, error_message());
                if (memcmp(in, out, n * es) != 0)
                    FAIL("rank %d: in-place all_reduce %s op %d differs from out of place", r, dtype_name(dt),
                         op);

                /* reduce_scatter: rank r's input element j is gen(r, j); output i = reduce of j = r*n+i */
                salt++;
                for (size_t j = 0; j < total; j++)
                    tu_put(dt, in, j, tu_gen(r, j, salt));
                if (comm_reduce_scatter(c->comm, in, out, n, dt, op) != 0)
                    FAIL("rank %d: reduce_scatter: %s", r, error_message());
                for (size_t i = 0; i < n; i++)
                    if (!tu_same(dt, out, i, tu_ref_reduce(dt, op, W, hosts, NULL, (size_t)r * n + i, salt)))
                        FAIL("rank %d: reduce_scatter %s op %d n=%zu elem %zu: got %.9g want %.9g", r,
                             dtype_name(dt), op, n, i, (double)tu_get(dt, out, i),
                             (double)tu_ref_reduce(dt, op, W, hosts, NULL, (size_t)r * n + i, salt));
            }

            /* broadcast from a root that moves with the count */
            salt++;
            int root = (int)(ci % (size_t)W);
            for (size_t i = 0; i < n; i++)
                tu_put(dt, out, i, tu_gen(r, i, salt));
            if (comm_broadcast(c->comm, out, n, dt, root) != 0)
                FAIL("rank %d: broadcast: %s", r, error_message());
            for (size_t i = 0; i < n; i++)
                if (!tu_same(dt, out, i, tu_round(dt, tu_gen(root, i, salt))))
                    FAIL("rank %d: broadcast %s n=%zu root %d elem %zu wrong", r, dtype_name(dt), n, root, i);
            if (comm_barrier(c->comm) != 0)
                FAIL("rank %d: barrier: %s", r, error_message());
            free(in);
            free(out);
            in = out = NULL;
        }
    }
    return 0;
fail:
    free(in);
    free(out);
    return 1;
}

static void run_collectives(int world, int hosts, bool force_tcp)
{
    int st[MAX_RANKS];
    struct coll_arg a = {.hosts = force_tcp ? world : hosts};
    struct run_opts o = {.hosts = hosts, .force_tcp = force_tcp, .limit_s = 150};
    run_ranks(world, body_collectives, &a, &o, st);
    assert_all_ok(world, st);
}

Test(comm_shm, world1, .timeout = 180) { run_collectives(1, 1, false); }
Test(comm_shm, world2, .timeout = 180) { run_collectives(2, 1, false); }
Test(comm_shm, world3, .timeout = 180) { run_collectives(3, 1, false); }
Test(comm_shm, world4, .timeout = 180) { run_collectives(4, 1, false); }
Test(comm_shm, world5, .timeout = 180) { run_collectives(5, 1, false); }
Test(comm_shm, world6, .timeout = 180) { run_collectives(6, 1, false); }
Test(comm_shm, world7, .timeout = 180) { run_collectives(7, 1, false); }
Test(comm_shm, world8, .timeout = 180) { run_collectives(8, 1, false); }
Test(comm_tcp, forced_world2, .timeout = 180) { run_collectives(2, 1, true); }
Test(comm_tcp, forced_world3, .timeout = 180) { run_collectives(3, 1, true); }
Test(comm_hier, hosts2_x_ranks2, .timeout = 180) { run_collectives(4, 2, false); }
Test(comm_hier, hosts2_x_ranks3, .timeout = 180) { run_collectives(6, 2, false); }
/* Hosts whose ranks are not contiguous (rank r on host r % 2 or r % 3): a host's blocks of a
 * reduce_scatter are then scattered over the buffer. */
Test(comm_hier, hosts2_interleaved_x_ranks2, .timeout = 180) { run_collectives(4, -2, false); }
Test(comm_hier, hosts3_interleaved_x_ranks2, .timeout = 180) { run_collectives(6, -3, false); }

/* 64 MiB through the default (1 MiB) slots: all_reduce f32 sum, an all_gather filling 64 MiB, a
 * reduce_scatter of a 64 MiB input (f32 avg) and a bf16 all_reduce (max) of 64 MiB. */
static int body_large(struct rank_ctx *c)
{
    const struct coll_arg *a = c->arg;
    int hosts = a ? a->hosts : 1;
    size_t n = (64u << 20) / 4, W = (size_t)c->size, per = n / W;
    float *buf = malloc(n * 4), *out = malloc(n * 4);
    int rc = 1;
    if (!buf || !out)
        goto done;
    for (size_t i = 0; i < n; i++)
        buf[i] = tu_gen(c->rank, i, 8);
    if (comm_reduce_scatter(c->comm, buf, out, per, DTYPE_F32, COMM_AVG) != 0) {
        fprintf(stderr, "rank %d: reduce_scatter 64 MiB: %s\n", c->rank, error_message());
        goto done;
    }
    for (size_t i = 0; i < per; i++) {
        float ref = tu_ref_reduce(DTYPE_F32, COMM_AVG, c->size, hosts, NULL, (size_t)c->rank * per + i, 8);
        if (memcmp(&out[i], &ref, 4) != 0) {
            fprintf(stderr, "rank %d: 64 MiB reduce_scatter elem %zu: %.9g != %.9g\n", c->rank, i, (double)out[i],
                    (double)ref);
            goto done;
        }
    }
    uint16_t *h = (uint16_t *)out; /* 64 MiB of bf16 */
    for (size_t i = 0; i < 2 * n; i++)
        tu_put(DTYPE_BF16, h, i, tu_gen(c->rank, i, 9));
    if (comm_all_reduce(c->comm, h, h, 2 * n, DTYPE_BF16, COMM_MAX) != 0) {
        fprintf(stderr, "rank %d: bf16 all_reduce 64 MiB: %s\n", c->rank, error_message());
        goto done;
    }
    for (size_t i = 0; i < 2 * n; i++)
        if (!tu_same(DTYPE_BF16, h, i, tu_ref_reduce(DTYPE_BF16, COMM_MAX, c->size, hosts, NULL, i, 9))) {
            fprintf(stderr, "rank %d: 64 MiB bf16 all_reduce max elem %zu wrong\n", c->rank, i);
            goto done;
        }
    for (size_t i = 0; i < n; i++)
        buf[i] = tu_gen(c->rank, i, 7);
    if (comm_all_reduce(c->comm, buf, buf, n, DTYPE_F32, COMM_SUM) != 0) {
        fprintf(stderr, "rank %d: all_reduce 64 MiB: %s\n", c->rank, error_message());
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        float ref = tu_ref_reduce(DTYPE_F32, COMM_SUM, c->size, hosts, NULL, i, 7);
        if (memcmp(&buf[i], &ref, 4) != 0) {
            fprintf(stderr, "rank %d: 64 MiB all_reduce elem %zu: %.9g != %.9g\n", c->rank, i, (double)buf[i],
                    (double)ref);
            goto done;
        }
    }
    for (size_t i = 0; i < per; i++)
        buf[i] = (float)(c->rank * 1000003 + (int)(i % 1000003));
    if (comm_all_gather(c->comm, buf, out, per, DTYPE_F32) != 0) {
        fprintf(stderr, "rank %d: all_gather 64 MiB: %s\n", c->rank, error_message());
        goto done;
    }
    for (size_t q = 0; q < W; q++)
        for (size_t i = 0; i < per; i++)
            if (out[q * per + i] != (float)((int)q * 1000003 + (int)(i % 1000003))) {
                fprintf(stderr, "rank %d: 64 MiB all_gather block %zu elem %zu wrong\n", c->rank, q, i);
                goto done;
            }
    rc = 0;
done:
    free(buf);
    free(out);
    return rc;
}

Test(comm_shm, large_64mib_world2, .timeout = 180)
{
    int st[MAX_RANKS];
    struct run_opts o = {.slot_kib = "1024", .limit_s = 150};
    run_ranks(2, body_large, NULL, &o, st);
    assert_all_ok(2, st);
}

Test(comm_tcp, large_64mib_forced_world2, .timeout = 180)
{
    int st[MAX_RANKS];
    struct coll_arg a = {.hosts = 2};
    struct run_opts o = {.force_tcp = true, .limit_s = 150};
    run_ranks(2, body_large, &a, &o, st);
    assert_all_ok(2, st);
}

/* ---- two real hosts: two network namespaces joined by a veth pair ---- */

/* Without FSDP_COMM_HOST_ID the backend tells hosts apart by hostname, boot id and network namespace:
 * 2 ranks in each namespace are 2 hosts of 2 ranks (shared memory inside, TCP over the veth between). */
static void run_in_two_netns(rank_body body, int world, int hosts_in_ref)
{
    struct tu_netns_pair np;
    if (tu_netns_pair_make(&np, 'c', 214) != 0)
        cr_skip_test("cannot create network namespaces and a veth pair here (needs root and iproute2)");
    struct coll_arg a = {.hosts = hosts_in_ref};
    struct run_opts o = {.netns = {np.ns[0], np.ns[1]}, .store_addr = np.addr[0], .limit_s = 150, .slot_kib = "1024"};
    int st[MAX_RANKS];
    run_ranks(world, body, &a, &o, st);
    tu_netns_pair_remove(&np);
    assert_all_ok(world, st);
}

Test(comm_netns, hosts2_x_ranks2, .timeout = 180) { run_in_two_netns(body_collectives, 4, 2); }
Test(comm_netns, large_64mib_hosts2_x_ranks1, .timeout = 180) { run_in_two_netns(body_large, 2, 2); }

/* 1000 asynchronous operations issued back to back finish in issue order with the right results. */
static int body_async(struct rank_ctx *c)
{
    enum { N = 1000, CNT = 37 };
    float *bufs = malloc(sizeof(float) * N * CNT);
    struct comm_work **w = calloc(N, sizeof(*w));
    int rc = 1;
    if (!bufs || !w)
        goto done;
    for (int k = 0; k < N; k++) {
        for (int i = 0; i < CNT; i++)
            bufs[k * CNT + i] = tu_gen(c->rank, (size_t)i, k);
        if (comm_all_reduce_async(c->comm, &bufs[k * CNT], &bufs[k * CNT], CNT, DTYPE_F32, COMM_SUM, &w[k]) != 0) {
            fprintf(stderr, "rank %d: issue %d: %s\n", c->rank, k, error_message());
            goto done;
        }
        if (comm_work_seq(w[k]) != (uint64_t)k + 1) {
            fprintf(stderr, "rank %d: op %d has seq %llu\n", c->rank, k, (unsigned long long)comm_work_seq(w[k]));
            goto done;
        }
    }
    /* Whenever an op is done, every op issued before it is done too. */
    for (int probe = 0; probe < 50; probe++) {
        int k = (probe * 397) % N;
        bool done_k = false, done_j = false;
        comm_work_test(w[k], &done_k);
        if (done_k)
            for (int j = 0; j < k; j++) {
                comm_work_test(w[j], &done_j);
                if (!done_j) {
                    fprintf(stderr, "rank %d: op %d done before op %d\n", c->rank, k, j);
                    goto done;
                }
            }
    }
    for (int k = N - 1; k >= 0; k--) {
        /* Waiting in reverse: the last one done implies all are. */
        if (comm_work_wait(w[k]) != 0) {
            fprintf(stderr, "rank %d: op %d: %s\n", c->rank, k, error_message());
            w[k] = NULL;
            goto done;
        }
        w[k] = NULL;
    }
    for (int k = 0; k < N; k++)
        for (int i = 0; i < CNT; i++) {
            float ref = tu_ref_reduce(DTYPE_F32, COMM_SUM, c->size, 1, NULL, (size_t)i, k);
            if (memcmp(&bufs[k * CNT + i], &ref, 4) != 0) {
                fprintf(stderr, "rank %d: op %d elem %d wrong\n", c->rank, k, i);
                goto done;
            }
        }
    rc = 0;
done:
    if (w)
        for (int k = 0; k < N; k++)
            if (w[k])
                comm_work_wait(w[k]);
    free(w);
    free(bufs);
    return rc;
}

Test(comm_async, thousand_in_order_world4, .timeout = 180)
{
    int st[MAX_RANKS];
    struct run_opts o = {.limit_s = 150};
    run_ranks(4, body_async, NULL, &o, st);
    assert_all_ok(4, st);
}

/* Sub-groups as HYBRID_SHARD builds them: shard groups of consecutive ranks, replicate groups across. */
static int body_split(struct rank_ctx *c)
{
    int W = c->size, r = c->rank, shard = 2;
    struct comm *sg = NULL, *rg = NULL, *none = (struct comm *)1;
    int rc = 1;
    if (comm_split(c->comm, r / shard, r, &sg) != 0 || comm_split(c->comm, r % shard, -r, &rg) != 0 ||
        comm_split(c->comm, r == 0 ? 0 : COMM_SPLIT_NONE, 0, &none) != 0) {
        fprintf(stderr, "rank %d: split: %s\n", r, error_message());
        goto done;
    }
    if (comm_size(sg) != shard || comm_rank(sg) != r % shard) {
        fprintf(stderr, "rank %d: shard group rank %d size %d\n", r, comm_rank(sg), comm_size(sg));
        goto done;
    }
    /* key = -rank orders the replicate group by descending old rank */
    int members[MAX_RANKS], m = 0;
    for (int q = W - 1; q >= 0; q--)
        if (q % shard == r % shard)
            members[m++] = q;
    if (comm_size(rg) != m || members[comm_rank(rg)] != r) {
        fprintf(stderr, "rank %d: replicate group rank %d size %d\n", r, comm_rank(rg), comm_size(rg));
        goto done;
    }
    if ((r == 0) != (none != NULL)) {
        fprintf(stderr, "rank %d: COMM_SPLIT_NONE gave %p\n", r, (void *)none);
        goto done;
    }
    if (none && comm_size(none) != 1)
        goto done;
    float v[101], ref;
    for (int i = 0; i < 101; i++)
        v[i] = tu_gen(r, (size_t)i, 3);
    if (comm_all_reduce(rg, v, v, 101, DTYPE_F32, COMM_SUM) != 0) {
        fprintf(stderr, "rank %d: replicate all_reduce: %s\n", r, error_message());
        goto done;
    }
    for (int i = 0; i < 101; i++) {
        ref = tu_ref_reduce(DTYPE_F32, COMM_SUM, m, 1, members, (size_t)i, 3);
        if (memcmp(&ref, &v[i], 4) != 0) {
            fprintf(stderr, "rank %d: replicate sum elem %d: %.9g != %.9g\n", r, i, (double)v[i], (double)ref);
            goto done;
        }
    }
    float g[2] = {0, 0}, mine = (float)r;
    if (comm_all_gather(sg, &mine, g, 1, DTYPE_F32) != 0 || g[0] != (float)(r / shard * shard) ||
        g[1] != (float)(r / shard * shard + 1)) {
        fprintf(stderr, "rank %d: shard all_gather %g %g: %s\n", r, (double)g[0], (double)g[1], error_message());
        goto done;
    }
    rc = 0;
done:
    comm_destroy(sg);
    comm_destroy(rg);
    if (none != (struct comm *)1)
        comm_destroy(none);
    return rc;
}

Test(comm_split, hybrid_groups_world6, .timeout = 180)
{
    int st[MAX_RANKS];
    struct run_opts o = {.limit_s = 150};
    run_ranks(6, body_split, NULL, &o, st);
    assert_all_ok(6, st);
}

/* Point to point around a ring, 1 MiB, even ranks send first so the pairs never both block in send. */
static int body_sendrecv(struct rank_ctx *c)
{
    size_t n = 1u << 18;
    int r = c->rank, W = c->size, next = (r + 1) % W, prev = (r + W - 1) % W, rc;
    float *s = malloc(n * 4), *d = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        s[i] = tu_gen(r, i, 9);
    if (r % 2 == 0) {
        rc = comm_send(c->comm, s, n, DTYPE_F32, next);
        rc = rc ? rc : comm_recv(c->comm, d, n, DTYPE_F32, prev);
    } else {
        rc = comm_recv(c->comm, d, n, DTYPE_F32, prev);
        rc = rc ? rc : comm_send(c->comm, s, n, DTYPE_F32, next);
    }
    if (rc)
        fprintf(stderr, "rank %d: send/recv: %s\n", r, error_message());
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (d[i] != tu_gen(prev, i, 9)) {
            fprintf(stderr, "rank %d: recv elem %zu wrong\n", r, i);
            rc = 1;
        }
    int bad = comm_send(c->comm, s, 1, DTYPE_F32, r) == 0; /* to self: refused */
    free(s);
    free(d);
    return rc || bad;
}

Test(comm_p2p, ring_world4, .timeout = 120)
{
    int st[MAX_RANKS];
    run_ranks(4, body_sendrecv, NULL, NULL, st);
    assert_all_ok(4, st);
}

/* A batch (comm_sendrecv) in which every rank lists its sends first, 4 MiB each, more than a socket buffers:
 * as single sends both sides of every pair would wait for the other's receive; as one batch they exchange.
 * Each rank sends two messages to each neighbour (matched in order) and bf16 to the next one. */
static int body_sendrecv_batch(struct rank_ctx *c)
{
    size_t n = 1u << 20;
    int r = c->rank, W = c->size, next = (r + 1) % W, prev = (r + W - 1) % W, rc = 0;
    float *s1 = malloc(n * 4), *s2 = malloc(n * 4), *d1 = malloc(n * 4), *d2 = malloc(n * 4);
    float *t1 = malloc(n * 4), *t2 = malloc(n * 4), *e1 = malloc(n * 4), *e2 = malloc(n * 4);
    uint16_t *hb = malloc(n * 2), *hr = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        s1[i] = tu_gen(r, i, 1), s2[i] = tu_gen(r, i, 2), t1[i] = tu_gen(r, i, 3), t2[i] = tu_gen(r, i, 4);
        tu_put(DTYPE_BF16, hb, i, tu_gen(r, i, 5));
    }
    /* sends first, receives last; to next: s1, s2, hb; to prev: t1, t2 */
    struct comm_p2p ops[] = {
        {COMM_P2P_SEND, s1, n, DTYPE_F32, next}, {COMM_P2P_SEND, t1, n, DTYPE_F32, prev},
        {COMM_P2P_SEND, s2, n, DTYPE_F32, next}, {COMM_P2P_SEND, t2, n, DTYPE_F32, prev},
        {COMM_P2P_SEND, hb, n, DTYPE_BF16, next},
        {COMM_P2P_RECV, d1, n, DTYPE_F32, prev}, {COMM_P2P_RECV, e1, n, DTYPE_F32, next},
        {COMM_P2P_RECV, d2, n, DTYPE_F32, prev}, {COMM_P2P_RECV, e2, n, DTYPE_F32, next},
        {COMM_P2P_RECV, hr, n, DTYPE_BF16, prev},
    };
    if (comm_sendrecv(c->comm, ops, (int)(sizeof ops / sizeof ops[0])) != 0) {
        fprintf(stderr, "rank %d: sendrecv: %s\n", r, error_message());
        rc = 1;
    }
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (d1[i] != tu_gen(prev, i, 1) || d2[i] != tu_gen(prev, i, 2) || e1[i] != tu_gen(next, i, 3) ||
            e2[i] != tu_gen(next, i, 4) || tu_get(DTYPE_BF16, hr, i) != tu_round(DTYPE_BF16, tu_gen(prev, i, 5))) {
            fprintf(stderr, "rank %d: element %zu of a batch arrived wrong or out of order\n", r, i);
            rc = 1;
        }
    /* refused before anything moves: a peer that is this rank, too many operations */
    struct comm_p2p self = {COMM_P2P_SEND, s1, 1, DTYPE_F32, r};
    rc |= comm_sendrecv(c->comm, &self, 1) != FSDP_EINVAL;
    rc |= comm_sendrecv(c->comm, ops, COMM_P2P_MAX + 1) != FSDP_EINVAL;
    rc |= comm_sendrecv(c->comm, ops, 0) != 0; /* empty: nothing to do */
    free(s1), free(s2), free(d1), free(d2), free(t1), free(t2), free(e1), free(e2), free(hb), free(hr);
    return rc;
}

Test(comm_p2p, batch_everyone_sends_first_world2, .timeout = 120)
{
    int st[MAX_RANKS];
    run_ranks(2, body_sendrecv_batch, NULL, NULL, st);
    assert_all_ok(2, st);
}

Test(comm_p2p, batch_everyone_sends_first_world3_serial, .timeout = 120)
{
    cr_assert_eq(setenv("FSDP_TEST_COMM_SERIAL", "1", 1), 0);
    int st[MAX_RANKS];
    run_ranks(3, body_sendrecv_batch, NULL, NULL, st);
    assert_all_ok(3, st);
}

/* A serial backend (NCCL; the cpu backend with FSDP_TEST_COMM_SERIAL=1) runs the operations of all of a
 * process's communicators on one thread in issue order. Rank 0 issues an all_reduce on the two-rank
 * group (rank 1 joins it 300 ms late), then one on a group of one, which on its own would finish at once:
 * serial, it finishes after the first; not serial, before. comm_mem_alloc, serial, also waits for the
 * operations issued before it (NCCL must not allocate while its kernels run). */
static int body_serial_order(struct rank_ctx *c)
{
    bool serial = *(const bool *)c->arg;
    int r = c->rank, rc = 0;
    struct comm *pair = NULL, *solo = NULL;
    char name[32];
    snprintf(name, sizeof name, "solo%d", r);
    if (comm_create(c->store, r, 2, "pair", NULL, &pair) != 0 || comm_create(c->store, 0, 1, name, NULL, &solo)) {
        fprintf(stderr, "rank %d: comm_create: %s\n", r, error_message());
        return 1;
    }
    float a = 1, b = 2;
    if (r == 1) {
        tu_nap(0.3);
        rc = comm_all_reduce(pair, &a, &a, 1, DTYPE_F32, COMM_SUM) != 0;
        tu_nap(0.3);
        rc |= comm_all_reduce(pair, &a, &a, 1, DTYPE_F32, COMM_SUM) != 0;
    } else {
        struct comm_work *wa = NULL, *wb = NULL;
        bool done_a = false;
        rc = comm_all_reduce_async(pair, &a, &a, 1, DTYPE_F32, COMM_SUM, &wa) != 0 ||
             comm_all_reduce_async(solo, &b, &b, 1, DTYPE_F32, COMM_SUM, &wb) != 0 || comm_work_wait(wb) != 0 ||
             comm_work_test(wa, &done_a) != 0;
        if (!rc && done_a != serial) {
            fprintf(stderr, "rank 0: the group-of-one all_reduce finished %s the earlier one on the pair (serial "
                    "%d)\n", done_a ? "after" : "before", serial);
            rc = 1;
        }
        rc |= comm_work_wait(wa) != 0 || a != 2;
        /* the pair's next all_reduce waits for rank 1, which naps 300 ms between its two */
        rc |= comm_all_reduce_async(pair, &a, &a, 1, DTYPE_F32, COMM_SUM, &wa) != 0;
        void *p = comm_mem_alloc(pair, 4096);
        bool done = false;
        rc |= !p || comm_work_test(wa, &done) != 0;
        if (!rc && serial && !done) {
            fprintf(stderr, "rank 0: comm_mem_alloc returned before the all_reduce issued before it ended\n");
            rc = 1;
        }
        if (!rc && !serial && done) {
            fprintf(stderr, "rank 0: without serial progress comm_mem_alloc waited for the all_reduce\n");
            rc = 1;
        }
        comm_mem_free(pair, p);
        rc |= comm_work_wait(wa) != 0 || a != 4;
    }
    if (rc)
        fprintf(stderr, "rank %d: %s\n", r, error_message());
    comm_destroy(solo);
    comm_destroy(pair);
    return rc;
}

Test(comm_serial, one_thread_runs_every_group_in_issue_order, .timeout = 60)
{
    cr_assert_eq(setenv("FSDP_TEST_COMM_SERIAL", "1", 1), 0);
    static const bool serial = true;
    struct run_opts o = {.no_comm = true};
    int st[MAX_RANKS];
    run_ranks(2, body_serial_order, &serial, &o, st);
    assert_all_ok(2, st);
}

/* HYBRID_SHARD's pattern on the serial path: shard groups of pairs and replicate groups across them, split
 * from the world; reduce-scatters and the previous round's all-reduces issued interleaved and
 * asynchronously, waited for in another order. With one progress thread every rank runs them in its issue
 * order, which is the same on all ranks, so nothing waits for a peer that is busy with the other group. */
static int body_two_groups(struct rank_ctx *c)
{
    int r = c->rank, W = c->size, rc = 0;
    struct comm *shard = NULL, *rep = NULL;
    if (comm_split(c->comm, r / 2, r, &shard) != 0 || comm_split(c->comm, r % 2, r, &rep) != 0) {
        fprintf(stderr, "rank %d: split: %s\n", r, error_message());
        return 1;
    }
    enum { ROUNDS = 12 };
    size_t n = 3001;
    float *in = malloc(2 * n * sizeof(float)), *mid[ROUNDS] = {NULL};
    for (size_t i = 0; i < 2 * n; i++)
        in[i] = (float)((int)(i % 7) - 3) * (float)(r + 1);
    struct comm_work *rs[ROUNDS], *ar[ROUNDS];
    for (int i = 0; i < ROUNDS && !rc; i++) {
        mid[i] = malloc(n * sizeof(float));
        rc |= comm_reduce_scatter_async(shard, in, mid[i], n, DTYPE_F32, COMM_SUM, &rs[i]) != 0;
        if (i > 0)
            rc |= comm_work_wait(rs[i - 1]) != 0 ||
                  comm_all_reduce_async(rep, mid[i - 1], mid[i - 1], n, DTYPE_F32, COMM_SUM, &ar[i - 1]) != 0;
    }
    rc |= rc || comm_work_wait(rs[ROUNDS - 1]) != 0 ||
          comm_all_reduce_async(rep, mid[ROUNDS - 1], mid[ROUNDS - 1], n, DTYPE_F32, COMM_SUM, &ar[ROUNDS - 1]) != 0;
    for (int i = ROUNDS - 1; i >= 0 && !rc; i--)
        rc |= comm_work_wait(ar[i]) != 0;
    double tri = (double)W * (W + 1) / 2;
    for (int i = 0; i < ROUNDS && !rc; i++)
        for (size_t j = 0; j < n && !rc; j++)
            if (mid[i][j] != (float)(((int)(((size_t)(r % 2) * n + j) % 7) - 3) * tri)) {
                fprintf(stderr, "rank %d round %d element %zu: %g\n", r, i, j, (double)mid[i][j]);
                rc = 1;
            }
    if (rc)
        fprintf(stderr, "rank %d: two groups: %s\n", r, error_message());
    for (int i = 0; i < ROUNDS; i++)
        free(mid[i]);
    free(in);
    comm_destroy(rep);
    comm_destroy(shard);
    return rc;
}

Test(comm_serial, two_groups_interleaved_world4, .timeout = 120)
{
    cr_assert_eq(setenv("FSDP_TEST_COMM_SERIAL", "1", 1), 0);
    int st[MAX_RANKS];
    run_ranks(4, body_two_groups, NULL, NULL, st);
    assert_all_ok(4, st);
}

/* The same program without serial progress: the group of one finishes first (so the test above can fail). */
Test(comm_serial, without_it_groups_progress_independently, .timeout = 60)
{
    cr_assert_eq(unsetenv("FSDP_TEST_COMM_SERIAL"), 0);
    static const bool serial = false;
    struct run_opts o = {.no_comm = true};
    int st[MAX_RANKS];
    run_ranks(2, body_serial_order, &serial, &o, st);
    assert_all_ok(2, st);
}

/* All-to-all: rank r's block p reaches rank p as its block r; blocking and async, f32 and bf16, a rank
 * sending to itself is a copy, an empty exchange works, and overlapping buffers are refused. */
static int body_all_to_all(struct rank_ctx *c)
{
    int r = c->rank, W = c->size, rc = 0;
    size_t n = 40000 + 7 * (size_t)W;
    float *s = calloc((size_t)W * n, 4), *d = calloc((size_t)W * n, 4);
    uint16_t *sb = calloc((size_t)W * n, 2), *db = calloc((size_t)W * n, 2);
    if (!s || !d || !sb || !db)
        return 1;
    for (int p = 0; p < W; p++)
        for (size_t i = 0; i < n; i++) {
            s[(size_t)p * n + i] = tu_gen(r, (size_t)p * n + i, 11);
            sb[(size_t)p * n + i] = (uint16_t)(r * 1000 + p * 10 + (int)(i % 7));
        }
    memset(d, 0, (size_t)W * n * 4);
    if ((rc = comm_all_to_all(c->comm, s, d, n, DTYPE_F32)) != 0)
        fprintf(stderr, "rank %d: all_to_all: %s\n", r, error_message());
    for (int p = 0; rc == 0 && p < W; p++)
        for (size_t i = 0; i < n; i++)
            if (d[(size_t)p * n + i] != tu_gen(p, (size_t)r * n + i, 11)) {
                fprintf(stderr, "rank %d: block %d elem %zu wrong\n", r, p, i);
                rc = 1;
                break;
            }
    struct comm_work *w = NULL;
    if (rc == 0 && (comm_all_to_all_async(c->comm, sb, db, n, DTYPE_BF16, &w) != 0 || comm_work_wait(w) != 0)) {
        fprintf(stderr, "rank %d: all_to_all_async: %s\n", r, error_message());
        rc = 1;
    }
    for (int p = 0; rc == 0 && p < W; p++)
        for (size_t i = 0; i < n; i++)
            if (db[(size_t)p * n + i] != (uint16_t)(p * 1000 + r * 10 + (int)(i % 7))) {
                fprintf(stderr, "rank %d: bf16 block %d elem %zu wrong\n", r, p, i);
                rc = 1;
                break;
            }
    if (rc == 0 && comm_all_to_all(c->comm, s, d, 0, DTYPE_F32) != 0) {
        fprintf(stderr, "rank %d: empty all_to_all: %s\n", r, error_message());
        rc = 1;
    }
    /* Refused before anything is queued, so the peers stay in step. */
    int bad = comm_all_to_all(c->comm, s, s + n / 2, n, DTYPE_F32) == 0 ||
              !strstr(error_message(), "comm_all_to_all: out overlaps in");
    if (rc == 0 && comm_barrier(c->comm) != 0)
        rc = 1;
    free(s);
    free(d);
    free(sb);
    free(db);
    return rc || bad;
}

Test(comm_a2a, world1, .timeout = 120)
{
    int st[MAX_RANKS];
    run_ranks(1, body_all_to_all, NULL, NULL, st);
    assert_all_ok(1, st);
}

Test(comm_a2a, world3, .timeout = 120)
{
    int st[MAX_RANKS];
    run_ranks(3, body_all_to_all, NULL, NULL, st);
    assert_all_ok(3, st);
}

Test(comm_a2a, hosts2_x_ranks2, .timeout = 120)
{
    int st[MAX_RANKS];
    struct run_opts o = {.hosts = 2, .limit_s = 100};
    run_ranks(4, body_all_to_all, NULL, &o, st);
    assert_all_ok(4, st);
}

/* Waiting blocks in the kernel (futex, poll), never spins: the machines here have 2 cores for up to 8
 * ranks. The last rank arrives 1.5 s late; the others must burn far less CPU than that while they wait. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int body_late_rank(struct rank_ctx *c)
{
    float v[1024] = {0};
    if (comm_barrier(c->comm) != 0)
        return 1;
    if (c->rank == c->size - 1) {
        struct timespec ts = {1, 500 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    double c0 = cpu_s(), t0 = tu_now();
    if (comm_all_reduce(c->comm, v, v, 1024, DTYPE_F32, COMM_SUM) != 0) {
        fprintf(stderr, "rank %d: all_reduce: %s\n", c->rank, error_message());
        return 1;
    }
    double cpu = cpu_s() - c0, wall = tu_now() - t0;
    if (c->rank != c->size - 1 && (wall < 1.0 || cpu > 0.3)) {
        fprintf(stderr, "rank %d: waited %.2f s and used %.2f s of CPU (spinning?)\n", c->rank, wall, cpu);
        return 1;
    }
    return 0;
}

Test(comm_shm, waiting_ranks_sleep_in_the_kernel, .timeout = 120)
{
    int st[MAX_RANKS];
    run_ranks(4, body_late_rank, NULL, NULL, st);
    assert_all_ok(4, st);
}

Test(comm_hier, waiting_ranks_sleep_in_the_kernel, .timeout = 120)
{
    int st[MAX_RANKS];
    struct run_opts o = {.hosts = 2};
    run_ranks(4, body_late_rank, NULL, &o, st);
    assert_all_ok(4, st);
}

/* ---- a random stream of operations: every path and every mix of buffers, ranks out of step ---- */

static uint32_t rnd_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

#define RND_MAXN 70000 /* elements per rank: several 64 KiB slots */

/* Operations drawn from a seed every rank shares (kind, count, root), each rank choosing its own
 * buffers (registered or plain) and its own small delays: one-copy, staged and mixed paths, counts of 0,
 * of one piece and of several, in any order. Every result is checked, and at the end every rank must
 * have taken as many shared-memory barriers as the other ranks of its host: ranks that disagree about an operation's path
 * would otherwise drift apart and break much later, somewhere else. */
struct random_arg {
    int hosts; /* for the reference's summation order */
    int ops;
};

static int body_random_ops(struct rank_ctx *c)
{
    const struct random_arg *a = c->arg;
    int W = c->size, r = c->rank, bad = 1, H = a->hosts;
    uint64_t shared = 0x5eed, mine = 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1);
    size_t cap = (size_t)RND_MAXN * (size_t)W;
    float *reg[2] = {comm_mem_alloc(c->comm, cap * 4), comm_mem_alloc(c->comm, cap * 4)};
    float *pl[2] = {malloc(cap * 4), malloc(cap * 4)};
    float *counts = malloc((size_t)W * sizeof(float));
    if (!reg[0] || !reg[1] || !pl[0] || !pl[1] || !counts)
        FAIL("rank %d: out of memory: %s", r, error_message());
    static const size_t ns[] = {0, 1, 7, 1000, 16384, 17000, RND_MAXN};
    static const char *kinds[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier"};
    uint64_t b0 = shm_barrier_count();
    for (int it = 0; it < a->ops; it++) {
        int kind = (int)(rnd_next(&shared) % 5), root = (int)(rnd_next(&shared) % (uint32_t)W), salt = 5000 + it;
        size_t n = ns[rnd_next(&shared) % (sizeof ns / sizeof ns[0])];
        bool use_reg = rnd_next(&mine) % 2;
        float *in = use_reg ? reg[0] : pl[0], *out = use_reg ? reg[1] : pl[1];
        if (rnd_next(&mine) % 3 == 0) {
            struct timespec ts = {0, (long)(rnd_next(&mine) % 2000) * 1000};
            nanosleep(&ts, NULL);
        }
        int rc = 0;
        if (kind == 0) {
            for (size_t i = 0; i < n; i++)
                in[i] = tu_gen(r, i, salt);
            rc = comm_all_gather(c->comm, in, out, n, DTYPE_F32);
            for (int q = 0; q < W && !rc; q++)
                for (size_t i = 0; i < n; i++)
                    if (out[(size_t)q * n + i] != tu_gen(q, i, salt))
                        FAIL("rank %d: op %d all_gather n=%zu: block %d elem %zu wrong", r, it, n, q, i);
        } else if (kind == 1) {
            for (size_t i = 0; i < n * (size_t)W; i++)
                in[i] = tu_gen(r, i, salt);
            rc = comm_reduce_scatter(c->comm, in, out, n, DTYPE_F32, COMM_SUM);
            for (size_t i = 0; i < n && !rc; i++)
                if (out[i] != tu_ref_reduce(DTYPE_F32, COMM_SUM, W, H, NULL, (size_t)r * n + i, salt))
                    FAIL("rank %d: op %d reduce_scatter n=%zu: elem %zu wrong", r, it, n, i);
        } else if (kind == 2) {
            for (size_t i = 0; i < n; i++)
                in[i] = tu_gen(r, i, salt);
            rc = comm_all_reduce(c->comm, in, in, n, DTYPE_F32, COMM_SUM);
            for (size_t i = 0; i < n && !rc; i++)
                if (in[i] != tu_ref_reduce(DTYPE_F32, COMM_SUM, W, H, NULL, i, salt))
                    FAIL("rank %d: op %d all_reduce n=%zu: elem %zu wrong", r, it, n, i);
        } else if (kind == 3) {
            for (size_t i = 0; i < n; i++)
                in[i] = r == root ? tu_gen(root, i, salt) : -1.0f;
            rc = comm_broadcast(c->comm, in, n, DTYPE_F32, root);
            for (size_t i = 0; i < n && !rc; i++)
                if (in[i] != tu_gen(root, i, salt))
                    FAIL("rank %d: op %d broadcast n=%zu from %d: elem %zu wrong", r, it, n, root, i);
        } else {
            rc = comm_barrier(c->comm);
        }
        if (rc)
            FAIL("rank %d: op %d (%s, n=%zu, %s buffers): %s", r, it, kinds[kind], n, use_reg ? "registered" : "plain",
                 error_message());
    }
    float mine_count = (float)(shm_barrier_count() - b0);
    if (comm_all_gather(c->comm, &mine_count, counts, 1, DTYPE_F32) != 0)
        FAIL("rank %d: final all_gather: %s", r, error_message());
    /* Ranks of one host share a segment and must agree; hosts may differ (a broadcast's root host does
     * other shared-memory steps than the hosts that receive it). Ranks are split over hosts contiguously. */
    for (int q = 0; q < W; q++) {
        int first = q / (W / H) * (W / H);
        if (counts[q] != counts[first])
            FAIL("rank %d: rank %d took %.0f shared-memory barriers for the same operations, rank %d of the same "
                 "host %.0f",
                 r, q, (double)counts[q], first, (double)counts[first]);
    }
    bad = 0;
fail:
    comm_mem_free(c->comm, reg[0]);
    comm_mem_free(c->comm, reg[1]);
    free(pl[0]);
    free(pl[1]);
    free(counts);
    return bad;
}

static void run_random(int world, int hosts, const char *keep)
{
    int st[MAX_RANKS];
    struct random_arg a = {.hosts = hosts, .ops = 1500};
    if (keep)
        setenv("FSDP_COMM_SHM_KEEP_PEER_PAGES", keep, 1); /* this test's own process: the ranks inherit it */
    struct run_opts o = {.hosts = hosts, .timeout_s = 20, .limit_s = 100};
    run_ranks(world, body_random_ops, &a, &o, st);
    assert_all_ok(world, st);
}

Test(comm_shm, random_operations_world3, .timeout = 120) { run_random(3, 1, NULL); }
Test(comm_shm, random_operations_world4, .timeout = 120) { run_random(4, 1, NULL); }
Test(comm_shm, random_operations_world3_pages_dropped, .timeout = 120) { run_random(3, 1, "0"); }
Test(comm_hier, random_operations_hosts2_x_ranks2, .timeout = 120) { run_random(4, 2, NULL); }
