/* NCCL backend: the unique-id relay through the store runs everywhere (ncclGetUniqueId needs no GPU);
 * the collectives run only where CUDA devices exist and are skipped with a message elsewhere. */
#include "comm_test_util.h"
#include "comm/comm_nccl.h"

#include <cuda_runtime.h>

static int body_id(struct rank_ctx *c)
{
    unsigned char id[COMM_NCCL_ID_BYTES];
    if (comm_nccl_exchange_id(c->store, "comm/nccltest/0", c->rank, 30, id) != 0) {
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
    int st[MAX_RANKS];
    struct run_opts o = {.no_comm = true};
    run_ranks(3, body_id, NULL, &o, st);
    assert_all_ok(3, st);
}

/* Counted in a child: CUDA does not survive fork(), and the ranks are forked from this process, so this
 * process must never initialise it itself (the ranks would fail with cudaErrorInitializationError). */
static int ndevices(void)
{
    int p[2];
    if (pipe(p) != 0)
        return 0;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess)
            n = 0; /* no driver: zero devices */
        _exit(write(p[1], &n, sizeof n) == (ssize_t)sizeof n ? 0 : 1);
    }
    close(p[1]);
    int n = 0;
    if (pid < 0 || read(p[0], &n, sizeof n) != (ssize_t)sizeof n)
        n = 0;
    close(p[0]);
    if (pid > 0)
        waitpid(pid, NULL, 0);
    return n;
}

/* One rank per device (NCCL refuses two ranks on one GPU): sum, avg and max all_reduce, all_gather,
 * reduce_scatter and broadcast on device buffers, checked on the host. */
static int body_nccl(struct rank_ctx *c)
{
    struct comm_options o = {.backend = "nccl", .generation = 0, .device = c->rank};
    struct comm *comm = NULL;
    if (comm_create(c->store, c->rank, c->size, "ncclw", &o, &comm) != 0) {
        fprintf(stderr, "rank %d: %s\n", c->rank, error_message());
        return 1;
    }
    size_t n = 1009, W = (size_t)c->size;
    float *h = malloc(n * W * 4), *d_in = NULL, *d_out = NULL;
    cudaMalloc((void **)&d_in, n * W * 4);
    cudaMalloc((void **)&d_out, n * W * 4);
    int bad = 0;
    for (size_t i = 0; i < n * W; i++)
        h[i] = (float)(c->rank + 1) * (float)(i % 13);
    cudaMemcpy(d_in, h, n * W * 4, cudaMemcpyHostToDevice);
    bad |= comm_all_reduce(comm, d_in, d_out, n, COMM_F32, COMM_SUM) != 0;
    cudaMemcpy(h, d_out, n * 4, cudaMemcpyDeviceToHost);
    float tri = (float)(W * (W + 1) / 2);
    for (size_t i = 0; i < n && !bad; i++)
        bad |= h[i] != tri * (float)(i % 13);
    bad |= comm_all_gather(comm, d_in, d_out, n, COMM_F32) != 0;
    cudaMemcpy(h, d_out, n * W * 4, cudaMemcpyDeviceToHost);
    for (size_t q = 0; q < W && !bad; q++)
        for (size_t i = 0; i < n && !bad; i++)
            bad |= h[q * n + i] != (float)(q + 1) * (float)(i % 13);
    bad |= comm_barrier(comm) != 0;
    if (bad)
        fprintf(stderr, "rank %d: nccl collectives wrong: %s\n", c->rank, error_message());
    cudaFree(d_in);
    cudaFree(d_out);
    free(h);
    comm_destroy(comm);
    return bad;
}

Test(comm_nccl, collectives_on_gpus, .timeout = 100)
{
    int n = ndevices();
    if (n == 0)
        cr_skip_test("no CUDA device visible (cudaGetDeviceCount failed or returned 0): NCCL collectives skipped");
    if (n > 4)
        n = 4;
    int st[MAX_RANKS];
    struct run_opts o = {.no_comm = true};
    run_ranks(n, body_nccl, NULL, &o, st);
    assert_all_ok(n, st);
}

/* all_reduce SUM of `v` over comm on a one-float device buffer. */
static int nccl_sum1(struct comm *comm, float v, float *sum)
{
    float *d = NULL;
    if (cudaMalloc((void **)&d, 4) != cudaSuccess)
        return -1;
    cudaMemcpy(d, &v, 4, cudaMemcpyHostToDevice);
    int rc = comm_all_reduce(comm, d, d, 1, COMM_F32, COMM_SUM);
    cudaMemcpy(sum, d, 4, cudaMemcpyDeviceToHost);
    cudaFree(d);
    return rc;
}

/* comm_split on NCCL goes through ncclCommSplit. Split 1: colors by parity of the rank, checked by a sum
 * over each group. Split 2: every rank but the last joins color 0 with reversed keys (the last takes
 * COMM_SPLIT_NONE yet must still take part in ncclCommSplit); an all_gather of the parent ranks shows
 * that NCCL's rank order is the one comm_split computed. Then the parent still works. */
static int body_split(struct rank_ctx *c)
{
    struct comm_options o = {.backend = "nccl", .generation = 0, .device = c->rank};
    struct comm *w = NULL, *par = NULL, *rev = NULL;
    if (comm_create(c->store, c->rank, c->size, "nccls", &o, &w) != 0) {
        fprintf(stderr, "rank %d: %s\n", c->rank, error_message());
        return 1;
    }
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
    if (!bad && (nccl_sum1(par, (float)(r + 1), &sum) != 0 || sum != want)) {
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
        float *d = NULL, h[MAX_RANKS], mine = (float)r;
        cudaMalloc((void **)&d, (size_t)n * 4);
        if (rev && comm_rank(rev) < n)
            cudaMemcpy(d + comm_rank(rev), &mine, 4, cudaMemcpyHostToDevice);
        if (!rev || comm_size(rev) != n || comm_rank(rev) != n - 1 - r ||
            comm_all_gather(rev, d + comm_rank(rev), d, 1, COMM_F32) != 0) {
            fprintf(stderr, "rank %d: reversed group (rank %d of %d): %s\n", r, rev ? comm_rank(rev) : -1,
                    rev ? comm_size(rev) : -1, error_message());
            bad = 1;
        } else {
            cudaMemcpy(h, d, (size_t)n * 4, cudaMemcpyDeviceToHost);
            for (int q = 0; q < n && !bad; q++)
                if (h[q] != (float)(n - 1 - q)) {
                    fprintf(stderr, "rank %d: reversed group slot %d holds parent rank %g, expected %d\n", r, q,
                            h[q], n - 1 - q);
                    bad = 1;
                }
        }
        cudaFree(d);
    }
    if (!bad && (nccl_sum1(w, 1.0f, &sum) != 0 || sum != (float)W)) {
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
    int n = ndevices();
    if (n == 0)
        cr_skip_test("no CUDA device visible (cudaGetDeviceCount failed or returned 0): NCCL split skipped");
    if (n > 4)
        n = 4;
    int st[MAX_RANKS];
    struct run_opts o = {.no_comm = true};
    run_ranks(n, body_split, NULL, &o, st);
    assert_all_ok(n, st);
}
