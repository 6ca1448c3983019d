/* Registered buffers (comm_mem_alloc) on the cpu backend: with every rank's buffers registered the
 * shared-memory path reads peers' buffers directly (one copy); the results must be bitwise those of the
 * staged path, for every op, dtype and reduction, counts 0, 1, a prime, a multi-slot size and 64 MiB,
 * worlds 1 to 8, in-place forms, mixed registered/unregistered groups, comm_split children, buffers
 * freed and reallocated (peers' cached mappings dropped), and FSDP_COMM_SHM_DIRECT=0. Each test also
 * checks through shm_direct_count() which path the operations took. */
#include "comm_test_util.h"
#include "comm/comm_shm.h"

static const enum dtype dtypes[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
static const size_t counts[] = {0, 1, 1009, 40009};

/* Per-op direct-path accounting of one rank's run. */
struct mem_arg {
    unsigned plain_mask; /* ranks whose buffers are plain malloc (bit r) */
    bool expect_direct;  /* every nonzero op must take the one-copy path (else none may) */
    int hosts;           /* > 1: fake hosts; then only the values are checked (which steps go direct
                          * depends on the hierarchical algorithm's own buffers) */
};

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); goto fail; } while (0)

static void *buf_alloc(struct comm *c, bool plain, size_t bytes)
{
    if (plain)
        return calloc(1, bytes ? bytes : 1);
    return comm_mem_alloc(c, bytes);
}

static void buf_free(struct comm *c, bool plain, void *p)
{
    if (plain)
        free(p);
    else
        comm_mem_free(c, p);
}

/* Every op/dtype/count on comm, buffers registered unless plain; checks values bitwise and counts the
 * operations that had data to move (*nops). */
static int check_all(struct comm *comm, bool plain, int salt0, const int *ranks, int hosts, uint64_t *nops)
{
    int W = comm_size(comm), r = comm_rank(comm), salt = salt0;
    int gr = ranks ? ranks[r] : r; /* the rank whose values this rank contributes */
    void *in = NULL, *out = NULL;
    for (size_t di = 0; di < 3; di++) {
        enum dtype dt = dtypes[di];
        size_t es = dtype_size(dt);
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
            size_t n = counts[ci], total = n * (size_t)W;
            in = buf_alloc(comm, plain, (total + 1) * es);
            out = buf_alloc(comm, plain, (total + 1) * es);
            if (!in || !out)
                FAIL("rank %d: alloc: %s", r, error_message());
            uint64_t moved = n ? 1 : 0;

            salt++;
            for (size_t i = 0; i < n; i++)
                tu_put(dt, in, i, tu_gen(gr, i, salt));
            if (comm_all_gather(comm, in, out, n, dt) != 0)
                FAIL("rank %d: all_gather: %s", r, error_message());
            for (int q = 0; q < W; q++)
                for (size_t i = 0; i < n; i++)
                    if (!tu_same(dt, out, (size_t)q * n + i, tu_round(dt, tu_gen(ranks ? ranks[q] : q, i, salt))))
                        FAIL("rank %d: all_gather %s n=%zu: block %d elem %zu wrong", r, dtype_name(dt), n,
                             q, i);
            salt++;
            memset(out, 0, total * es);
            for (size_t i = 0; i < n; i++)
                tu_put(dt, out, (size_t)r * n + i, tu_gen(gr, i, salt));
            if (comm_all_gather(comm, (char *)out + (size_t)r * n * es, out, n, dt) != 0)
                FAIL("rank %d: in-place all_gather: %s", r, error_message());
            for (int q = 0; q < W; q++)
                for (size_t i = 0; i < n; i++)
                    if (!tu_same(dt, out, (size_t)q * n + i, tu_round(dt, tu_gen(ranks ? ranks[q] : q, i, salt))))
                        FAIL("rank %d: in-place all_gather %s n=%zu: block %d elem %zu wrong", r,
                             dtype_name(dt), n, q, i);
            *nops += 2 * moved;

            for (enum comm_op op = COMM_SUM; op <= COMM_MAX; op++) {
                salt++;
                for (size_t i = 0; i < n; i++)
                    tu_put(dt, in, i, tu_gen(gr, i, salt));
                if (comm_all_reduce(comm, in, out, n, dt, op) != 0)
                    FAIL("rank %d: all_reduce: %s", r, error_message());
                for (size_t i = 0; i < n; i++)
                    if (!tu_same(dt, out, i, tu_ref_reduce(dt, op, W, hosts, ranks, i, salt)))
                        FAIL("rank %d: all_reduce %s op %d n=%zu elem %zu: got %.9g want %.9g", r,
                             dtype_name(dt), op, n, i, (double)tu_get(dt, out, i),
                             (double)tu_ref_reduce(dt, op, W, hosts, ranks, i, salt));
                if (comm_all_reduce(comm, in, in, n, dt, op) != 0)
                    FAIL("rank %d: in-place all_reduce: %s", r, error_message());
                if (memcmp(in, out, n * es) != 0)
                    FAIL("rank %d: in-place all_reduce %s op %d differs from out of place", r, dtype_name(dt),
                         op);
                salt++;
                for (size_t j = 0; j < total; j++)
                    tu_put(dt, in, j, tu_gen(gr, j, salt));
                if (comm_reduce_scatter(comm, in, out, n, dt, op) != 0)
                    FAIL("rank %d: reduce_scatter: %s", r, error_message());
                for (size_t i = 0; i < n; i++)
                    if (!tu_same(dt, out, i, tu_ref_reduce(dt, op, W, hosts, ranks, (size_t)r * n + i, salt)))
                        FAIL("rank %d: reduce_scatter %s op %d n=%zu elem %zu: got %.9g want %.9g", r,
                             dtype_name(dt), op, n, i, (double)tu_get(dt, out, i),
                             (double)tu_ref_reduce(dt, op, W, hosts, ranks, (size_t)r * n + i, salt));
                *nops += 3 * moved;
            }

            salt++;
            int root = (int)(ci % (size_t)W);
            for (size_t i = 0; i < n; i++)
                tu_put(dt, out, i, tu_gen(gr, i, salt));
            if (comm_broadcast(comm, out, n, dt, root) != 0)
                FAIL("rank %d: broadcast: %s", r, error_message());
            for (size_t i = 0; i < n; i++)
                if (!tu_same(dt, out, i, tu_round(dt, tu_gen(ranks ? ranks[root] : root, i, salt))))
                    FAIL("rank %d: broadcast %s n=%zu root %d elem %zu wrong", r, dtype_name(dt), n, root, i);
            *nops += moved;
            buf_free(comm, plain, in);
            buf_free(comm, plain, out);
            in = out = NULL;
        }
    }
    return 0;
fail:
    buf_free(comm, plain, in);
    buf_free(comm, plain, out);
    return 1;
}

/* The direct path exists only between ranks sharing a segment (world > 1). */
static int check_count(int r, int W, uint64_t before, uint64_t nops, bool expect_direct)
{
    uint64_t got = shm_direct_count() - before, want = expect_direct && W > 1 ? nops : 0;
    if (got != want) {
        fprintf(stderr, "rank %d: %llu of %llu operations took the one-copy path, expected %llu\n", r,
                (unsigned long long)got, (unsigned long long)nops, (unsigned long long)want);
        return 1;
    }
    return 0;
}

static int body_mem(struct rank_ctx *c)
{
    const struct mem_arg *a = c->arg;
    uint64_t before = shm_direct_count(), nops = 0;
    if (check_all(c->comm, (a->plain_mask >> c->rank) & 1, 0, NULL, a->hosts, &nops) != 0)
        return 1;
    if (a->hosts > 1 && shm_direct_count() == before) {
        fprintf(stderr, "rank %d: no operation took the one-copy path inside its host\n", c->rank);
        return 1;
    }
    return a->hosts > 1 ? 0 : check_count(c->rank, c->size, before, nops, a->expect_direct);
}

static void run_mem(int world, unsigned plain_mask, bool expect_direct)
{
    int st[MAX_RANKS];
    struct mem_arg a = {.plain_mask = plain_mask, .expect_direct = expect_direct};
    struct run_opts o = {.limit_s = 100};
    run_ranks(world, body_mem, &a, &o, st);
    assert_all_ok(world, st);
}

/* Two fake hosts x 2 ranks: shared memory inside each host (direct where the buffers are the caller's
 * registered ones), TCP between the leaders; results in the documented hierarchical order. */
Test(comm_mem, registered_hosts2_x_ranks2, .timeout = 120)
{
    int st[MAX_RANKS];
    struct mem_arg a = {.hosts = 2};
    struct run_opts o = {.limit_s = 100, .hosts = 2};
    run_ranks(4, body_mem, &a, &o, st);
    assert_all_ok(4, st);
}

Test(comm_mem, registered_world1, .timeout = 120) { run_mem(1, 0, true); }
Test(comm_mem, registered_world2, .timeout = 120) { run_mem(2, 0, true); }
Test(comm_mem, registered_world3, .timeout = 120) { run_mem(3, 0, true); }
Test(comm_mem, registered_world4, .timeout = 120) { run_mem(4, 0, true); }
Test(comm_mem, registered_world5, .timeout = 120) { run_mem(5, 0, true); }
Test(comm_mem, registered_world6, .timeout = 120) { run_mem(6, 0, true); }
Test(comm_mem, registered_world7, .timeout = 120) { run_mem(7, 0, true); }
Test(comm_mem, registered_world8, .timeout = 120) { run_mem(8, 0, true); }
/* One plain rank makes the whole group stage (every rank sees the same decision); a broadcast only needs
 * its root's buffer registered. */
static int body_mixed(struct rank_ctx *c)
{
    const struct mem_arg *a = c->arg;
    uint64_t before = shm_direct_count(), nops = 0;
    if (check_all(c->comm, (a->plain_mask >> c->rank) & 1, 0, NULL, a->hosts, &nops) != 0)
        return 1;
    /* Broadcasts with a registered root are the only direct operations: counts 1, 1009 and 40009 (root
     * ci % W), for three dtypes, when that root is registered. */
    uint64_t want = 0;
    for (size_t ci = 1; ci <= 3; ci++) {
        int root = (int)(ci % (size_t)c->size);
        if (!((a->plain_mask >> root) & 1))
            want += 3;
    }
    uint64_t got = shm_direct_count() - before;
    if (got != want) {
        fprintf(stderr, "rank %d: mixed group: %llu direct operations, expected %llu (the broadcasts)\n",
                c->rank, (unsigned long long)got, (unsigned long long)want);
        return 1;
    }
    return 0;
}

static void run_mixed(int world, unsigned plain_mask)
{
    int st[MAX_RANKS];
    struct mem_arg a = {.plain_mask = plain_mask};
    struct run_opts o = {.limit_s = 100};
    run_ranks(world, body_mixed, &a, &o, st);
    assert_all_ok(world, st);
}

Test(comm_mem, mixed_first_plain_world2, .timeout = 120) { run_mixed(2, 1u); }
Test(comm_mem, mixed_last_plain_world3, .timeout = 120) { run_mixed(3, 4u); }
Test(comm_mem, mixed_odd_plain_world5, .timeout = 120) { run_mixed(5, 0xau); }
Test(comm_mem, all_plain_world3, .timeout = 120) { run_mixed(3, 7u); }

/* FSDP_COMM_SHM_DIRECT=0 on one rank only: the ranks still agree (staged path everywhere). The variable
 * is read at comm_create, so the body makes the communicator itself. */
static int body_env_off(struct rank_ctx *c)
{
    if (c->rank == 1)
        setenv("FSDP_COMM_SHM_DIRECT", "0", 1);
    if (comm_create(c->store, c->rank, c->size, "world", NULL, &c->comm) != 0) {
        fprintf(stderr, "rank %d: comm_create: %s\n", c->rank, error_message());
        return 1;
    }
    uint64_t before = shm_direct_count(), nops = 0;
    if (check_all(c->comm, false, 0, NULL, 1, &nops) != 0)
        return 1;
    return check_count(c->rank, c->size, before, nops, false);
}

Test(comm_mem, direct_off_on_one_rank_world3, .timeout = 120)
{
    int st[MAX_RANKS];
    struct run_opts o = {.limit_s = 100, .no_comm = true};
    run_ranks(3, body_env_off, NULL, &o, st);
    assert_all_ok(3, st);
}

/* Split world 6 into {0,2,4} and {1,3,5} (keys reversed) and run everything on the children with
 * buffers allocated through the parent: the registry is per process, so they are registered there too. */
static int body_split(struct rank_ctx *c)
{
    struct comm *sub = NULL;
    int color = c->rank % 2;
    if (comm_split(c->comm, color, -c->rank, &sub) != 0 || !sub) {
        fprintf(stderr, "rank %d: comm_split: %s\n", c->rank, error_message());
        return 1;
    }
    int members[3];
    for (int i = 0; i < 3; i++)
        members[i] = color + 2 * (2 - i); /* ordered by key = -rank */
    uint64_t before = shm_direct_count(), nops = 0;
    int rc = check_all(sub, false, 100, members, 1, &nops);
    rc = rc ? rc : check_count(c->rank, 3, before, nops, true);
    /* The parent still works, with a buffer the parent allocated. */
    float *v = comm_mem_alloc(c->comm, 6 * sizeof(float));
    if (!rc && v) {
        v[c->rank] = (float)c->rank + 1;
        rc = comm_all_gather(c->comm, v + c->rank, v, 1, DTYPE_F32) != 0;
        for (int q = 0; q < 6 && !rc; q++)
            rc = v[q] != (float)q + 1;
        if (rc)
            fprintf(stderr, "rank %d: parent all_gather after split wrong: %s\n", c->rank, error_message());
    }
    comm_mem_free(c->comm, v);
    comm_destroy(sub);
    return rc;
}

Test(comm_mem, split_children_world6, .timeout = 120)
{
    int st[MAX_RANKS];
    struct run_opts o = {.limit_s = 100};
    run_ranks(6, body_split, NULL, &o, st);
    assert_all_ok(6, st);
}

/* 64 MiB (the gathered / reduced size), f32 and bf16, every op, in-place forms; values checked
 * bitwise against the reference. */
static int body_large(struct rank_ctx *c)
{
    int W = c->size, r = c->rank, salt = 7;
    size_t total = (64u << 20) / 4, n = total / (size_t)W;
    float *in = comm_mem_alloc(c->comm, total * 4), *out = comm_mem_alloc(c->comm, total * 4);
    uint64_t before = shm_direct_count();
    int rc = 1;
    if (!in || !out)
        FAIL("rank %d: alloc: %s", r, error_message());
    for (size_t i = 0; i < n; i++)
        in[i] = tu_gen(r, i, salt);
    if (comm_all_gather(c->comm, in, out, n, DTYPE_F32) != 0)
        FAIL("rank %d: all_gather: %s", r, error_message());
    for (int q = 0; q < W; q++)
        for (size_t i = 0; i < n; i += 1 + i % 7)
            if (!tu_same(DTYPE_F32, out, (size_t)q * n + i, tu_gen(q, i, salt)))
                FAIL("rank %d: 64 MiB all_gather block %d elem %zu wrong", r, q, i);
    salt++;
    for (size_t j = 0; j < total; j++)
        in[j] = tu_gen(r, j, salt);
    if (comm_reduce_scatter(c->comm, in, out, n, DTYPE_F32, COMM_SUM) != 0)
        FAIL("rank %d: reduce_scatter: %s", r, error_message());
    for (size_t i = 0; i < n; i++)
        if (!tu_same(DTYPE_F32, out, i, tu_ref_reduce(DTYPE_F32, COMM_SUM, W, 1, NULL, (size_t)r * n + i, salt)))
            FAIL("rank %d: 64 MiB reduce_scatter elem %zu wrong", r, i);
    if (comm_all_reduce(c->comm, in, in, total, DTYPE_F32, COMM_AVG) != 0)
        FAIL("rank %d: in-place all_reduce: %s", r, error_message());
    for (size_t j = 0; j < total; j++)
        if (!tu_same(DTYPE_F32, in, j, tu_ref_reduce(DTYPE_F32, COMM_AVG, W, 1, NULL, j, salt)))
            FAIL("rank %d: 64 MiB all_reduce elem %zu wrong", r, j);
    /* bf16 all_gather in place over the same buffer */
    uint16_t *h = (uint16_t *)out;
    for (size_t i = 0; i < n; i++)
        h[(size_t)r * n + i] = dtype_f32_to_bf16(tu_gen(r, i, salt + 1));
    if (comm_all_gather(c->comm, h + (size_t)r * n, h, n, DTYPE_BF16) != 0)
        FAIL("rank %d: bf16 in-place all_gather: %s", r, error_message());
    for (int q = 0; q < W; q++)
        for (size_t i = 0; i < n; i += 1 + i % 5)
            if (!tu_same(DTYPE_BF16, h, (size_t)q * n + i, tu_round(DTYPE_BF16, tu_gen(q, i, salt + 1))))
                FAIL("rank %d: 64 MiB bf16 all_gather block %d elem %zu wrong", r, q, i);
    rc = check_count(r, W, before, 4, true);
fail:
    comm_mem_free(c->comm, in);
    comm_mem_free(c->comm, out);
    return rc;
}

Test(comm_mem, large_64mib_world2, .timeout = 120)
{
    int st[MAX_RANKS];
    struct run_opts o = {.limit_s = 100};
    run_ranks(2, body_large, NULL, &o, st);
    assert_all_ok(2, st);
}

/* Buffers freed and reallocated more often than a peer caches mappings: every all_gather must see the
 * new buffer's contents (a stale mapping of a freed buffer would show old values), always direct. */
static int body_realloc(struct rank_ctx *c)
{
    int W = c->size, r = c->rank;
    uint64_t before = shm_direct_count();
    float *keep = comm_mem_alloc(c->comm, 4096 * sizeof(float));
    for (int it = 0; it < 40; it++) {
        size_t n = 1000 + (size_t)it * 37;
        float *in = comm_mem_alloc(c->comm, n * sizeof(float)), *out = malloc(n * (size_t)W * sizeof(float));
        if (!in || !out || !keep) {
            fprintf(stderr, "rank %d: alloc: %s\n", r, error_message());
            return 1;
        }
        for (size_t i = 0; i < n; i++)
            in[i] = tu_gen(r, i, it);
        int rc = comm_all_gather(c->comm, in, out, n, DTYPE_F32);
        for (int q = 0; q < W && rc == 0; q++)
            for (size_t i = 0; i < n && rc == 0; i++)
                rc = !tu_same(DTYPE_F32, out, (size_t)q * n + i, tu_gen(q, i, it));
        /* A long-lived buffer stays usable beside the churn (its mapping may be dropped and remade). */
        keep[r] = (float)(it * W + r);
        rc = rc ? rc : comm_all_gather(c->comm, keep + r, keep, 1, DTYPE_F32);
        for (int q = 0; q < W && rc == 0; q++)
            rc = keep[q] != (float)(it * W + q);
        free(out);
        /* Odd iterations free only on some ranks first: peers' caches see frees at different times. */
        comm_mem_free(c->comm, in);
        if (rc) {
            fprintf(stderr, "rank %d: iteration %d wrong after reallocation: %s\n", r, it, error_message());
            return 1;
        }
    }
    comm_mem_free(c->comm, keep);
    return check_count(r, W, before, 80, true);
}

Test(comm_mem, free_and_realloc_world3, .timeout = 120)
{
    int st[MAX_RANKS];
    struct run_opts o = {.limit_s = 100};
    run_ranks(3, body_realloc, NULL, &o, st);
    assert_all_ok(3, st);
}

/* The allocator itself: alignment, zero fill, size 0, foreign pointers, NULL. */
Test(comm_mem, allocator_contract, .timeout = 60)
{
    pid_t srv;
    int port = tu_store_spawn(NULL, "commtest", NULL, &srv);
    cr_assert(port > 0, "the store server process did not start");
    struct store_client *sc = NULL;
    struct comm *c = NULL;
    cr_assert_eq(tu_connect(NULL, port, &sc), 0, "%s", error_message());
    cr_assert_eq(comm_create(sc, 0, 1, "alloc", NULL, &c), 0, "%s", error_message());
    unsigned char *p = comm_mem_alloc(c, 12345), *z = comm_mem_alloc(c, 0);
    cr_assert(p && z, "%s", error_message());
    cr_assert_eq((uintptr_t)p % 4096, 0);
    for (size_t i = 0; i < 12345; i++)
        cr_assert_eq(p[i], 0);
    memset(p, 0xab, 12345);
    float x = 3, y = 0;
    cr_assert_eq(comm_all_reduce(c, &x, &y, 1, DTYPE_F32, COMM_SUM), 0);
    cr_assert_eq(y, 3.0f);
    comm_mem_free(c, NULL);
    int local = 0;
    comm_mem_free(c, &local); /* reported, not freed: must not crash */
    comm_mem_free(c, p);
    comm_mem_free(c, z);
    comm_destroy(c);
    store_client_close(sc);
    tu_store_reap(srv);
}

/* The streaming copy the one-copy path uses: every alignment of source and destination, sizes around
 * its thresholds; bytes outside the destination range stay untouched. */
Test(comm_mem, stream_copy_alignments, .timeout = 60)
{
    static const size_t sizes[] = {0, 1, 15, 63, 64, 127, 128, 129, 4095, (1u << 20) - 1, (1u << 20) + 77};
    size_t cap = (1u << 20) + 256;
    unsigned char *src = malloc(cap), *dst = malloc(cap), *ref = malloc(cap);
    cr_assert(src && dst && ref);
    for (size_t i = 0; i < cap; i++)
        src[i] = (unsigned char)(i * 131 + 7);
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
        for (size_t so = 0; so < 17; so += 3)
            for (size_t d_o = 0; d_o < 17; d_o++) {
                size_t n = sizes[si];
                memset(dst, 0xee, cap);
                memset(ref, 0xee, cap);
                memcpy(ref + d_o, src + so, n);
                if (d_o % 2)
                    comm_copy_nt(dst + d_o, src + so, n);
                else
                    comm_copy_stream(dst + d_o, src + so, n);
                cr_assert(memcmp(dst, ref, cap) == 0, "size %zu src offset %zu dst offset %zu", n, so, d_o);
            }
    free(src);
    free(dst);
    free(ref);
}
