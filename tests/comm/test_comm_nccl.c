/* The NCCL backend as the worker uses it: communicators from comm_create("nccl") and buffers from the
 * CUDA kernels table, both in the GPU module (this binary links no CUDA and no copy of comm_nccl.c), so
 * the collectives order themselves after the kernels' stream through the module's own issue-time events.
 * The unique-id relay through the store runs wherever the module loads (ncclGetUniqueId needs no GPU);
 * the rest needs a GPU per rank: on a host with an NVIDIA driver where none is usable the tests fail
 * (tests/util/tu_gpu.h), elsewhere they skip.
 *
 * Ranks: FSDP_TEST_NCCL_WORLD, else one per visible GPU (at most 4); rank r uses GPU r modulo the GPUs
 * visible, so FSDP_TEST_NCCL_WORLD=2 on one GPU asks NCCL for two ranks on one device (NCCL 2.28 refuses:
 * "Duplicate GPU detected"; tests/gpu/acceptance.sh's nccl stage expects either that or a pass). */
#include "comm_test_util.h"
#include "comm/comm_nccl.h"
#include "common/gpu_module.h"
#include "common/settings.h"
#include "kernels/kernels.h"
#include "tests/util/tu_gpu.h"

#include <math.h>

/* ---- the unique-id relay (no GPU needed) ---- */

typedef int (*exchange_id_fn)(struct store_client *, const char *, int, double, unsigned char *);

static int body_id(struct rank_ctx *c)
{
    exchange_id_fn exchange = (exchange_id_fn)gpu_module_symbol("comm_nccl_exchange_id");
    unsigned char id[COMM_NCCL_ID_BYTES];
    if (!exchange || exchange(c->store, "comm/nccltest/0", c->rank, 30, id) != 0) {
        fprintf(stderr, "rank %d: %s\n", c->rank, error_message());
        return 1;
    }
    /* Every rank republishes what it got; rank 0 checks all copies equal its own. */
    char key[64];
    snprintf(key, sizeof(key), "check/%d", c->rank);
    if (store_client_set(c->store, key, id, sizeof(id)) != 0)
        return 1;
    if (c->rank != 0)
        return 0;
    unsigned char zero[COMM_NCCL_ID_BYTES] = {0};
    if (memcmp(id, zero, sizeof(id)) == 0) {
        fprintf(stderr, "rank 0: all-zero NCCL id\n");
        return 1;
    }
    for (int r = 1; r < c->size; r++) {
        void *v = NULL;
        size_t len = 0;
        snprintf(key, sizeof(key), "check/%d", r);
        if (store_client_get(c->store, key, &v, &len, 30) != 0 || len != sizeof(id) || memcmp(v, id, len) != 0) {
            fprintf(stderr, "rank %d received a different NCCL id\n", r);
            free(v);
            return 1;
        }
        free(v);
    }
    return 0;
}

Test(comm_nccl, unique_id_relay_world3, .timeout = 100)
{
    if (!gpu_module_symbol("comm_nccl_exchange_id"))
        TU_GPU_UNAVAILABLE("the GPU module cannot be loaded: %s", error_message());
    int st[MAX_RANKS];
    struct run_opts o = {.no_comm = true};
    run_ranks(3, body_id, NULL, &o, st);
    assert_all_ok(3, st);
}

/* ---- ranks on GPUs ---- */

/* Counted in a child: CUDA does not survive fork(), and the ranks are forked from this process, so this
 * process must never initialise it itself (the ranks would fail with cudaErrorInitializationError). */
static int ndevices(char *why, size_t cap)
{
    int p[2];
    if (pipe(p) != 0)
        return 0;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        char w[512] = "";
        int n = gpu_module_device_count(w, sizeof w);
        _exit(write(p[1], &n, sizeof n) == (ssize_t)sizeof n && write(p[1], w, sizeof w) == (ssize_t)sizeof w ? 0
                                                                                                                : 1);
    }
    close(p[1]);
    int n = 0;
    char w[512] = "";
    if (pid < 0 || read(p[0], &n, sizeof n) != (ssize_t)sizeof n || read(p[0], w, sizeof w) != (ssize_t)sizeof w)
        n = 0;
    close(p[0]);
    if (pid > 0)
        waitpid(pid, NULL, 0);
    snprintf(why, cap, "%s", w);
    return n;
}

struct gpu_job {
    int ndev; /* GPUs visible */
};

/* The world size of the GPU tests, or a skip/failure where no GPU is usable. */
static int gpu_world(struct gpu_job *job)
{
    char why[512];
    job->ndev = ndevices(why, sizeof why);
    if (job->ndev == 0)
        TU_GPU_UNAVAILABLE("no usable CUDA device: %s", why);
    if (settings_get_raw(SETTING_TEST_NCCL_WORLD))
        return (int)settings_int(SETTING_TEST_NCCL_WORLD);
    return job->ndev < 4 ? job->ndev : 4;
}

/* What every GPU rank starts with: its device (LOCAL_RANK, which the kernels table reads too), the kernels
 * table, and a communicator over all ranks. */
struct gpu_rank {
    const struct kernels *k;
    struct comm *world;
    int device;
};

static int gpu_rank_open(struct rank_ctx *c, const char *group, struct gpu_rank *g)
{
    const struct gpu_job *job = c->arg;
    g->device = c->rank % job->ndev;
    char lr[16];
    snprintf(lr, sizeof lr, "%d", g->device);
    setenv("LOCAL_RANK", lr, 1);
    g->k = kernels_get("cuda");
    if (!g->k) {
        fprintf(stderr, "rank %d: %s\n", c->rank, error_message());
        return 1;
    }
    struct comm_options o = {.backend = "nccl", .generation = 0, .device = g->device};
    if (comm_create(c->store, c->rank, c->size, group, &o, &g->world) != 0) {
        fprintf(stderr, "rank %d: %s\n", c->rank, error_message());
        return 1;
    }
    return 0;
}

/* A device buffer holding host's bytes. */
static void *dev_from(const struct kernels *k, const void *host, size_t bytes)
{
    void *d = k->mem_alloc(bytes);
    if (d && host && k->mem_copy(d, host, bytes, KERNELS_COPY_H2D) != 0) {
        k->mem_free(d);
        return NULL;
    }
    return d;
}

static int down(const struct kernels *k, void *host, const void *dev, size_t bytes)
{
    return k->mem_copy(host, dev, bytes, KERNELS_COPY_D2H);
}

/* Small integers (exact in bf16 and in every sum here): rank r's element i. */
static float val(int r, size_t i)
{
    return (float)((int)(i % 13) - 6) * (float)(r + 1);
}

/* all_reduce SUM/AVG/MAX, reduce_scatter SUM/AVG, all_gather and broadcast in f32 and bf16, a barrier,
 * and an all_gather out of a comm_mem_alloc (ncclMemAlloc) buffer; checked on the host. */
static int body_collectives(struct rank_ctx *c)
{
    struct gpu_rank g;
    if (gpu_rank_open(c, "ncclc", &g))
        return 1;
    const struct kernels *k = g.k;
    int r = c->rank, W = c->size, bad = 0;
    size_t n = 1009, NW = n * (size_t)W;
    float *h = malloc(NW * 4), *back = malloc(NW * 4);
    uint16_t *hb = malloc(NW * 2), *bb = malloc(NW * 2);
    for (size_t i = 0; i < NW; i++) {
        h[i] = val(r, i);
        hb[i] = dtype_f32_to_bf16(h[i]);
    }
    void *in = dev_from(k, h, NW * 4), *out = k->mem_alloc(NW * 4), *inb = dev_from(k, hb, NW * 2),
         *outb = k->mem_alloc(NW * 2);
    if (!in || !out || !inb || !outb) {
        fprintf(stderr, "rank %d: device buffers: %s\n", r, error_message());
        return 1;
    }
    double tri = (double)W * (W + 1) / 2;
    const enum comm_op ops[] = {COMM_SUM, COMM_AVG, COMM_MAX};
    for (int oi = 0; oi < 3 && !bad; oi++) {
        enum comm_op op = ops[oi];
        for (int b16 = 0; b16 < 2 && !bad; b16++) {
            enum dtype dt = b16 ? DTYPE_BF16 : DTYPE_F32;
            bad |= comm_all_reduce(g.world, b16 ? inb : in, b16 ? outb : out, n, dt, op) != 0;
            bad |= b16 ? down(k, bb, outb, n * 2) : down(k, back, out, n * 4);
            for (size_t i = 0; i < n && !bad; i++) {
                double x = (double)val(0, i); /* rank 0's value: rank r's is x (r + 1) */
                double want = op == COMM_SUM ? x * tri : op == COMM_AVG ? x * tri / W : x > 0 ? x * W : x;
                double got = b16 ? dtype_bf16_to_f32(bb[i]) : back[i];
                if (fabs(got - want) > 1e-6 * fabs(want) + (b16 && op == COMM_AVG ? 0.02 * fabs(want) : 0)) {
                    fprintf(stderr, "rank %d: all_reduce op %d %s element %zu: %g, want %g\n", r, (int)op,
                            b16 ? "bf16" : "f32", i, got, want);
                    bad = 1;
                }
            }
        }
    }
    /* reduce_scatter: block r of every rank's input, reduced */
    for (int oi = 0; oi < 2 && !bad; oi++) {
        bad |= comm_reduce_scatter(g.world, in, out, n, DTYPE_F32, ops[oi]) != 0 || down(k, back, out, n * 4);
        for (size_t i = 0; i < n && !bad; i++) {
            double want = (double)val(0, (size_t)r * n + i) * tri / (ops[oi] == COMM_AVG ? W : 1);
            if (fabs(back[i] - want) > 1e-6 * fabs(want)) {
                fprintf(stderr, "rank %d: reduce_scatter op %d element %zu: %g, want %g\n", r, (int)ops[oi], i,
                        (double)back[i], want);
                bad = 1;
            }
        }
    }
    /* all_gather in bf16 */
    bad |= bad || comm_all_gather(g.world, inb, outb, n, DTYPE_BF16) != 0 || down(k, bb, outb, NW * 2);
    for (size_t q = 0; q < (size_t)W && !bad; q++)
        for (size_t i = 0; i < n && !bad; i++)
            if (dtype_bf16_to_f32(bb[q * n + i]) != val((int)q, i)) {
                fprintf(stderr, "rank %d: all_gather block %zu element %zu wrong\n", r, q, i);
                bad = 1;
            }
    /* broadcast from the last rank */
    bad |= bad || comm_broadcast(g.world, in, n, DTYPE_F32, W - 1) != 0 || down(k, back, in, n * 4);
    for (size_t i = 0; i < n && !bad; i++)
        if (back[i] != val(W - 1, i)) {
            fprintf(stderr, "rank %d: broadcast element %zu: %g, want %g\n", r, i, (double)back[i],
                    (double)val(W - 1, i));
            bad = 1;
        }
    bad |= bad || comm_barrier(g.world) != 0;
    /* registered memory (ncclMemAlloc), allocated and freed between operations */
    float *reg = bad ? NULL : comm_mem_alloc(g.world, NW * 4);
    bad |= !bad && (!reg || k->mem_copy(reg + (size_t)r * n, h, n * 4, KERNELS_COPY_H2D) != 0 ||
                    comm_all_gather(g.world, reg + (size_t)r * n, reg, n, DTYPE_F32) != 0 || down(k, back, reg, NW * 4));
    for (size_t q = 0; q < (size_t)W && !bad; q++)
        for (size_t i = 0; i < n && !bad; i++)
            if (back[q * n + i] != val((int)q, i)) {
                fprintf(stderr, "rank %d: all_gather in registered memory: block %zu element %zu wrong\n", r, q, i);
                bad = 1;
            }
    comm_mem_free(g.world, reg);
    if (bad)
        fprintf(stderr, "rank %d: nccl collectives: %s\n", r, error_message());
    k->mem_free(in), k->mem_free(out), k->mem_free(inb), k->mem_free(outb);
    free(h), free(back), free(hb), free(bb);
    comm_destroy(g.world);
    return bad;
}

Test(comm_nccl, collectives_on_gpus, .timeout = 100)
{
    struct gpu_job job;
    int w = gpu_world(&job);
    int st[MAX_RANKS];
    struct run_opts o = {.no_comm = true};
    run_ranks(w, body_collectives, &job, &o, st);
    assert_all_ok(w, st);
}

/* The engine's path: a kernel on the compute stream fills the send buffer and the collective is issued at
 * once, without synchronising. The module records an event on the compute stream when the collective is
 * issued and the NCCL stream waits for it; without that NCCL would read the buffer before a slow kernel
 * (a 2048^3 GEMM queued ahead of the copy into it) wrote it, and sum zeros. */
static int body_event_path(struct rank_ctx *c)
{
    struct gpu_rank g;
    if (gpu_rank_open(c, "ncclev", &g))
        return 1;
    const struct kernels *k = g.k;
    int r = c->rank, W = c->size, bad = 0, m = 2048;
    size_t mm = (size_t)m * m, n = 4096;
    float *hones = malloc(mm * 4), back[8];
    for (size_t i = 0; i < mm; i++)
        hones[i] = 1.0f;
    float *a = dev_from(k, hones, mm * 4), *prod = k->mem_alloc(mm * 4), *send = k->mem_alloc(n * 4),
          *recv = k->mem_alloc(n * 4);
    if (!a || !prod || !send || !recv) {
        fprintf(stderr, "rank %d: device buffers: %s\n", r, error_message());
        return 1;
    }
    for (int round = 0; round < 3 && !bad; round++) {
        /* zeros everywhere, and the device idle, before each round */
        bad |= k->mem_set(send, 0, n * 4) != 0 || k->mem_set(recv, 0, n * 4) != 0 || k->synchronize() != 0;
        /* prod = a a = 2048 everywhere, a few times over; then send = (r + 1) prod[0..n) */
        for (int rep = 0; rep < 4 && !bad; rep++)
            bad |= k->gemm(0, 0, m, m, m, 1.0f, a, m, a, m, 0.0f, prod, m) != 0;
        bad |= bad || k->mem_copy(send, prod, n * 4, KERNELS_COPY_D2D) != 0 ||
               k->scale(send, (float)(r + 1), n) != 0;
        /* no synchronize: the collective must wait for exactly what was queued before it */
        bad |= bad || comm_all_reduce(g.world, send, recv, n, DTYPE_F32, COMM_SUM) != 0;
        bad |= bad || down(k, back, recv + n - 8, sizeof back);
        double want = (double)m * W * (W + 1) / 2;
        for (int i = 0; i < 8 && !bad; i++)
            if (back[i] != want) {
                fprintf(stderr, "rank %d round %d: all_reduce read the send buffer before the kernels that "
                        "wrote it finished: %g, want %g\n", r, round, (double)back[i], want);
                bad = 1;
            }
    }
    if (bad)
        fprintf(stderr, "rank %d: %s\n", r, error_message());
    k->mem_free(a), k->mem_free(prod), k->mem_free(send), k->mem_free(recv);
    free(hones);
    comm_destroy(g.world);
    return bad;
}

Test(comm_nccl, collective_waits_for_the_compute_stream, .timeout = 100)
{
    struct gpu_job job;
    int w = gpu_world(&job);
    int st[MAX_RANKS];
    struct run_opts o = {.no_comm = true};
    run_ranks(w, body_event_path, &job, &o, st);
    assert_all_ok(w, st);
}

/* A batch in which every rank sends first (to both neighbours, 4 MiB each, bf16 to one of them), then
 * receives: one NCCL group, so nobody waits for a receive that comes later in a peer's batch. */
static int body_sendrecv(struct rank_ctx *c)
{
    struct gpu_rank g;
    if (gpu_rank_open(c, "ncclp2p", &g))
        return 1;
    const struct kernels *k = g.k;
    int r = c->rank, W = c->size, next = (r + 1) % W, prev = (r + W - 1) % W, bad = 0;
    size_t n = 1u << 20;
    float *h = malloc(n * 4), *back = malloc(n * 4);
    uint16_t *hb = malloc(n * 2), *bb = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        h[i] = val(r, i);
        hb[i] = dtype_f32_to_bf16(val(r, i) + 0.5f);
    }
    void *s = dev_from(k, h, n * 4), *sb = dev_from(k, hb, n * 2), *dn = k->mem_alloc(n * 4),
         *dp = k->mem_alloc(n * 4), *db = k->mem_alloc(n * 2);
    if (!s || !sb || !dn || !dp || !db) {
        fprintf(stderr, "rank %d: device buffers: %s\n", r, error_message());
        return 1;
    }
    struct comm_p2p ops[] = {
        {COMM_P2P_SEND, s, n, DTYPE_F32, next}, {COMM_P2P_SEND, s, n, DTYPE_F32, prev},
        {COMM_P2P_SEND, sb, n, DTYPE_BF16, next}, {COMM_P2P_RECV, dp, n, DTYPE_F32, prev},
        {COMM_P2P_RECV, dn, n, DTYPE_F32, next}, {COMM_P2P_RECV, db, n, DTYPE_BF16, prev},
    };
    bad |= comm_sendrecv(g.world, ops, 6) != 0;
    bad |= bad || down(k, back, dp, n * 4);
    for (size_t i = 0; i < n && !bad; i++)
        bad |= back[i] != val(prev, i);
    bad |= bad || down(k, back, dn, n * 4);
    for (size_t i = 0; i < n && !bad; i++)
        bad |= back[i] != val(next, i);
    bad |= bad || down(k, bb, db, n * 2);
    for (size_t i = 0; i < n && !bad; i++)
        bad |= dtype_bf16_to_f32(bb[i]) != dtype_bf16_to_f32(dtype_f32_to_bf16(val(prev, i) + 0.5f));
    if (bad)
        fprintf(stderr, "rank %d: grouped send/recv: %s\n", r, error_message());
    k->mem_free(s), k->mem_free(sb), k->mem_free(dn), k->mem_free(dp), k->mem_free(db);
    free(h), free(back), free(hb), free(bb);
    comm_destroy(g.world);
    return bad;
}

Test(comm_nccl, sendrecv_batch_everyone_sends_first, .timeout = 100)
{
    struct gpu_job job;
    int w = gpu_world(&job);
    if (w < 2)
        cr_skip_test("needs 2 or more ranks (one GPU here; FSDP_TEST_NCCL_WORLD=2 puts two on it where NCCL "
                     "allows)");
    int st[MAX_RANKS];
    struct run_opts o = {.no_comm = true};
    run_ranks(w, body_sendrecv, &job, &o, st);
    assert_all_ok(w, st);
}

/* HYBRID_SHARD's pattern on two communicators split from the world (pairs for the shard group, across the
 * pairs for the replicate group): reduce-scatters and all-reduces issued interleaved and asynchronously
 * and waited for in another order. One progress thread launches them in issue order on every rank. */
static int body_two_groups(struct rank_ctx *c)
{
    struct gpu_rank g;
    if (gpu_rank_open(c, "nccl2g", &g))
        return 1;
    const struct kernels *k = g.k;
    int r = c->rank, W = c->size, bad = 0;
    int sg = W % 2 == 0 ? 2 : 1;
    struct comm *shard = NULL, *rep = NULL;
    if (comm_split(g.world, r / sg, r, &shard) != 0 || comm_split(g.world, r % sg, r, &rep) != 0) {
        fprintf(stderr, "rank %d: split: %s\n", r, error_message());
        return 1;
    }
    size_t n = 4099;
    float *h = malloc(n * 4 * (size_t)sg), *back = malloc(n * 4);
    for (size_t i = 0; i < n * (size_t)sg; i++)
        h[i] = val(r, i);
    enum { ROUNDS = 16 };
    float *in[ROUNDS], *mid[ROUNDS];
    struct comm_work *rs[ROUNDS], *ar[ROUNDS];
    for (int i = 0; i < ROUNDS; i++) {
        in[i] = dev_from(k, h, n * 4 * (size_t)sg);
        mid[i] = k->mem_alloc(n * 4);
        bad |= !in[i] || !mid[i];
    }
    for (int i = 0; i < ROUNDS && !bad; i++) {
        bad |= comm_reduce_scatter_async(shard, in[i], mid[i], n, DTYPE_F32, COMM_SUM, &rs[i]) != 0;
        /* the previous round's replicate all-reduce, once its reduce-scatter is done, as the engine does */
        if (i > 0) {
            bad |= comm_work_wait(rs[i - 1]) != 0;
            bad |= comm_all_reduce_async(rep, mid[i - 1], mid[i - 1], n, DTYPE_F32, COMM_SUM, &ar[i - 1]) != 0;
        }
    }
    bad |= bad || comm_work_wait(rs[ROUNDS - 1]) != 0;
    bad |= bad || comm_all_reduce_async(rep, mid[ROUNDS - 1], mid[ROUNDS - 1], n, DTYPE_F32, COMM_SUM,
                                        &ar[ROUNDS - 1]) != 0;
    for (int i = ROUNDS - 1; i >= 0 && !bad; i--)
        bad |= comm_work_wait(ar[i]) != 0;
    /* every rank's block (r % sg) summed over the whole world */
    for (int i = 0; i < ROUNDS && !bad; i++) {
        bad |= down(k, back, mid[i], n * 4);
        for (size_t j = 0; j < n && !bad; j++) {
            double want = (double)val(0, (size_t)(r % sg) * n + j) * W * (W + 1) / 2;
            if (fabs(back[j] - want) > 1e-6 * fabs(want)) {
                fprintf(stderr, "rank %d round %d element %zu: %g, want %g\n", r, i, j, (double)back[j], want);
                bad = 1;
            }
        }
    }
    if (bad)
        fprintf(stderr, "rank %d: two groups: %s\n", r, error_message());
    for (int i = 0; i < ROUNDS; i++)
        k->mem_free(in[i]), k->mem_free(mid[i]);
    free(h), free(back);
    comm_destroy(rep);
    comm_destroy(shard);
    comm_destroy(g.world);
    return bad;
}

Test(comm_nccl, two_groups_interleaved, .timeout = 100)
{
    struct gpu_job job;
    int w = gpu_world(&job);
    int st[MAX_RANKS];
    struct run_opts o = {.no_comm = true};
    run_ranks(w, body_two_groups, &job, &o, st);
    assert_all_ok(w, st);
}

/* all_reduce SUM of `v` over comm on a one-float device buffer. */
static int nccl_sum1(const struct kernels *k, struct comm *comm, float v, float *sum)
{
    float *d = dev_from(k, &v, 4);
    if (!d)
        return -1;
    int rc = comm_all_reduce(comm, d, d, 1, DTYPE_F32, COMM_SUM);
    rc = rc ? rc : down(k, sum, d, 4);
    k->mem_free(d);
    return rc;
}

/* comm_split on NCCL goes through ncclCommSplit. Split 1: colors by parity of the rank, checked by a sum
 * over each group. Split 2: every rank but the last joins color 0 with reversed keys (the last takes
 * COMM_SPLIT_NONE yet must still take part in ncclCommSplit); an all_gather of the parent ranks shows
 * that NCCL's rank order is the one comm_split computed. Then the parent still works. */
static int body_split(struct rank_ctx *c)
{
    struct gpu_rank g;
    if (gpu_rank_open(c, "nccls", &g))
        return 1;
    const struct kernels *k = g.k;
    struct comm *w = g.world, *par = NULL, *rev = NULL;
    int r = c->rank, W = c->size, bad = 0;
    if (comm_split(w, r % 2, r, &par) != 0 || !par) {
        fprintf(stderr, "rank %d: split by parity: %s\n", r, error_message());
        comm_destroy(w);
        return 1;
    }
    int want_size = (W - r % 2 + 1) / 2;
    if (comm_rank(par) != r / 2 || comm_size(par) != want_size || strcmp(comm_backend_name(par), "nccl") != 0) {
        fprintf(stderr, "rank %d: parity child is rank %d of %d (%s), expected %d of %d\n", r, comm_rank(par),
                comm_size(par), comm_backend_name(par), r / 2, want_size);
        bad = 1;
    }
    float sum = 0, want = 0;
    for (int q = r % 2; q < W; q += 2)
        want += (float)(q + 1);
    if (!bad && (nccl_sum1(k, par, (float)(r + 1), &sum) != 0 || sum != want)) {
        fprintf(stderr, "rank %d: parity group sum %g, expected %g: %s\n", r, sum, want, error_message());
        bad = 1;
    }

    bool last = r == W - 1;
    if (!bad && comm_split(w, last ? COMM_SPLIT_NONE : 0, -r, &rev) != 0) {
        fprintf(stderr, "rank %d: split with a no-color rank: %s\n", r, error_message());
        bad = 1;
    }
    if (!bad && last && rev) {
        fprintf(stderr, "rank %d: COMM_SPLIT_NONE returned a communicator\n", r);
        bad = 1;
    }
    if (!bad && !last) {
        int n = W - 1;
        float h[MAX_RANKS], mine = (float)r;
        float *d = k->mem_alloc((size_t)n * 4);
        if (d && rev && comm_rank(rev) < n)
            bad |= k->mem_copy(d + comm_rank(rev), &mine, 4, KERNELS_COPY_H2D) != 0;
        if (bad || !d || !rev || comm_size(rev) != n || comm_rank(rev) != n - 1 - r ||
            comm_all_gather(rev, d + comm_rank(rev), d, 1, DTYPE_F32) != 0) {
            fprintf(stderr, "rank %d: reversed group (rank %d of %d): %s\n", r, rev ? comm_rank(rev) : -1,
                    rev ? comm_size(rev) : -1, error_message());
            bad = 1;
        } else {
            bad |= down(k, h, d, (size_t)n * 4);
            for (int q = 0; q < n && !bad; q++)
                if (h[q] != (float)(n - 1 - q)) {
                    fprintf(stderr, "rank %d: reversed group slot %d holds parent rank %g, expected %d\n", r, q,
                            h[q], n - 1 - q);
                    bad = 1;
                }
        }
        k->mem_free(d);
    }
    if (!bad && (nccl_sum1(k, w, 1.0f, &sum) != 0 || sum != (float)W)) {
        fprintf(stderr, "rank %d: parent after the splits summed %g, expected %d: %s\n", r, sum, W, error_message());
        bad = 1;
    }
    comm_destroy(rev);
    comm_destroy(par);
    comm_destroy(w);
    return bad;
}

Test(comm_nccl, split_on_gpus, .timeout = 100)
{
    struct gpu_job job;
    int w = gpu_world(&job);
    int st[MAX_RANKS];
    struct run_opts o = {.no_comm = true};
    run_ranks(w, body_split, &job, &o, st);
    assert_all_ok(w, st);
}
