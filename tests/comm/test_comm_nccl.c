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

static int ndevices(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0; /* no driver: zero devices */
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
