/* The "nccl" backend: device buffers, one NCCL communicator per group on a dedicated stream. Bootstrap:
 * rank 0 of the group calls ncclGetUniqueId (which also starts NCCL's bootstrap listener in that process)
 * and publishes it under "<key_prefix>/nccl_id"; the others wait for it, then all call ncclCommInitRank.
 * A comm_split child is made by ncclCommSplit of the parent instead (no new id, no new bootstrap ring).
 * The backend is serial (comm_internal.h): every communicator of the process runs its init, split,
 * operations, ncclMemAlloc/Free and finalize on one progress thread in issue order, so all ranks launch
 * NCCL work in the same order across communicators and never allocate while NCCL kernels of their own run.
 * Every communicator is nonblocking (ncclConfig_t.blocking = 0): a blocking ncclCommInitRank or
 * ncclCommSplit waits with no deadline for a rank that never joins, so each NCCL call that answers
 * ncclInProgress is settled by nccl_settle against the communicator's timeout, then aborted.
 * Each collective waits on its own stream for an event recorded on the compute stream when it was issued
 * (nccl_issue), and records an event of its own after it (nccl_launch). The progress thread launches
 * collectives as they are issued, without waiting for the ones before, and watches the oldest's event and
 * ncclCommGetAsyncError (yielding, then naps of at most 1 ms) until its deadline, then aborts the NCCL
 * communicator so nothing hangs on a dead peer. comm_work_order makes the compute stream wait for a
 * collective's event (nccl_order): the engine queues the kernels that read its result without the host
 * waiting. A batch of sends and receives (comm_sendrecv) is one
 * NCCL group. */
#include "comm/comm_internal.h"
#include "common/clock.h"
#include "comm/comm_nccl.h"
#include "common/error.h"
#include "common/log.h"
#include "rendezvous/store.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct nccl_state {
    ncclComm_t comm;
    cudaStream_t stream;
    float *word; /* the barrier's one-element all-reduce, allocated with the communicator */
    int device, rank, size;
    double timeout_s; /* FSDP_COMM_TIMEOUT_S: bounds init, split and finalize, which have no request */
    char group[72];
};

/* A nonblocking communicator's calls may return ncclInProgress: the work (init, split, a collective's
 * enqueue, finalize) goes on inside NCCL and is finished when ncclCommGetAsyncError stops saying
 * ncclInProgress. Waits for that until the deadline (yield for 100 us, then naps of 20 us doubling to
 * 1 ms); returns the final state, or ncclInProgress if the deadline came first (the caller aborts). */
/* One wait of the polls below: false once the deadline has come; else yields for the first 100 us after t0,
 * then naps of *nap_ns, doubling to 1 ms. */
static bool nccl_pause(double t0, double deadline, long *nap_ns)
{
    double now = clock_now_s();
    if (now >= deadline)
        return false;
    if (now - t0 < 1e-4) {
        sched_yield();
        return true;
    }
    struct timespec ts = {0, *nap_ns};
    nanosleep(&ts, NULL);
    *nap_ns = *nap_ns < 500000 ? 2 * *nap_ns : 1000000;
    return true;
}

static ncclResult_t nccl_settle(ncclComm_t comm, double deadline)
{
    double t0 = clock_now_s();
    long nap_ns = 20000;
    for (;;) {
        ncclResult_t state = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess)
            return r;
        if (state != ncclInProgress)
            return state;
        if (!nccl_pause(t0, deadline, &nap_ns))
            return ncclInProgress;
    }
}

/* Waits, as nccl_settle does, until NCCL's thread has written a split's child handle: ncclSuccess once it is
 * there, ncclInProgress at the deadline. */
static ncclResult_t nccl_wait_handle(ncclComm_t volatile *handle, double deadline)
{
    double t0 = clock_now_s();
    long nap_ns = 20000;
    while (!*handle)
        if (!nccl_pause(t0, deadline, &nap_ns))
            return ncclInProgress;
    return ncclSuccess;
}

/* The config every communicator of this backend is made with; commName names it in NCCL_DEBUG output. */
static ncclConfig_t nccl_config(const char *group)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = group;
    return cfg;
}

/* The CUDA ops table's stream (kernels/cuda/cuda_common.cu, linked into the same GPU module); -1 while no
 * CUDA table exists in the process, which then has no compute work to wait for. */
extern int fsdp_cuda_compute_stream(cudaStream_t *stream, int *device);

int comm_nccl_exchange_id(struct store_client *store, const char *key_prefix, int rank, double timeout_s,
                          unsigned char id[COMM_NCCL_ID_BYTES])
{
    char key[256];
    snprintf(key, sizeof(key), "%s/nccl_id", key_prefix);
    if (rank == 0) {
        ncclUniqueId uid;
        ncclResult_t r = ncclGetUniqueId(&uid);
        if (r != ncclSuccess)
            return error_set(FSDP_EIO, "ncclGetUniqueId failed: %s (check NCCL_SOCKET_IFNAME / network)",
                             ncclGetErrorString(r));
        memcpy(id, uid.internal, COMM_NCCL_ID_BYTES);
        return store_client_set(store, key, id, COMM_NCCL_ID_BYTES);
    }
    void *v = NULL;
    size_t len = 0;
    int rc = store_client_get(store, key, &v, &len, timeout_s);
    if (rc)
        return error_set(rc, "rank 0 never published the NCCL unique id (%s): %s", key, error_message());
    if (len != COMM_NCCL_ID_BYTES) {
        free(v);
        return error_set(FSDP_EPROTO, "NCCL unique id under %s has %zu bytes, expected %d", key, len,
                         COMM_NCCL_ID_BYTES);
    }
    memcpy(id, v, COMM_NCCL_ID_BYTES);
    free(v);
    return 0;
}

static void nccl_fini(void *state)
{
    struct nccl_state *st = state;
    if (!st)
        return;
    if (st->comm) {
        /* Finalize flushes the communicator's outstanding work with its peers; on a nonblocking one it
         * answers ncclInProgress and is settled like any call. A peer that never finalizes must not keep
         * this rank from exiting: past the timeout the communicator is aborted instead. */
        ncclResult_t r = ncclCommFinalize(st->comm);
        if (r == ncclInProgress)
            r = nccl_settle(st->comm, clock_now_s() + st->timeout_s);
        if (r == ncclSuccess)
            r = ncclCommDestroy(st->comm);
        else
            ncclCommAbort(st->comm);
        if (r != ncclSuccess)
            log_warn("nccl: group '%s' rank %d: finalizing the communicator failed (%s); aborted it", st->group,
                     st->rank, ncclGetErrorString(r));
    }
    if (st->word)
        cudaFree(st->word);
    if (st->stream)
        cudaStreamDestroy(st->stream);
    free(st);
}

/* What every communicator of this backend owns besides its ncclComm: the device and its own stream, on which
 * each collective records the event nccl_poll watches. Shared by nccl_init and nccl_split so a child is set up
 * exactly like a group. */
static int nccl_state_new(const struct comm_info *info, struct nccl_state **out)
{
    *out = NULL;
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0) {
        (void)cudaGetLastError();
        return error_set(FSDP_EUNSUPPORTED, "nccl backend: no CUDA device is visible (%s); use the cpu backend",
                         ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    }
    /* No modulo: a device number past the last GPU is a launch mistake (more ranks on a node than GPUs),
     * which the worker refuses at config time; here it is refused before NCCL sees it. */
    if (info->device < 0 || info->device >= ndev)
        return error_set(FSDP_EINVAL, "nccl backend: group '%s' rank %d asks for CUDA device %d but %d %s visible "
                         "(one rank per GPU: start at most %d ranks per node)", info->group, info->rank,
                         info->device, ndev, ndev == 1 ? "is" : "are", ndev);
    struct nccl_state *st = calloc(1, sizeof(*st));
    if (!st)
        return error_set(FSDP_ENOMEM, "nccl backend: out of memory");
    st->device = info->device;
    st->rank = info->rank;
    st->size = info->size;
    st->timeout_s = info->timeout_s;
    snprintf(st->group, sizeof(st->group), "%s", info->group);
    /* The stream and the barrier's word are made now, before the communicator's first collective: an
     * allocation while NCCL kernels run can deadlock the device. */
    ce = cudaSetDevice(st->device);
    if (ce == cudaSuccess)
        ce = cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking);
    if (ce == cudaSuccess)
        ce = cudaMalloc((void **)&st->word, sizeof(float));
    if (ce != cudaSuccess) {
        int dev = st->device;
        nccl_fini(st);
        return error_set(FSDP_EIO, "nccl backend: device %d: %s", dev, cudaGetErrorString(ce));
    }
    *out = st;
    return 0;
}

static int nccl_init(const struct comm_info *info, void **state)
{
    *state = NULL;
    struct nccl_state *st = NULL;
    FSDP_TRY(nccl_state_new(info, &st));
    unsigned char id[COMM_NCCL_ID_BYTES];
    int rc = 0;
    FSDP_TRY_GOTO(comm_nccl_exchange_id(info->store, info->key_prefix, info->rank, info->timeout_s, id), rc, fail);
    ncclUniqueId uid;
    memcpy(uid.internal, id, COMM_NCCL_ID_BYTES);
    ncclConfig_t cfg = nccl_config(st->group);
    double deadline = clock_now_s() + info->timeout_s;
    ncclResult_t r = ncclCommInitRankConfig(&st->comm, info->size, uid, info->rank, &cfg);
    /* nonblocking: ncclSuccess can still leave the communicator initialising (as with the split) */
    if ((r == ncclInProgress || r == ncclSuccess) && st->comm)
        r = nccl_settle(st->comm, deadline);
    if (r != ncclSuccess) {
        const char *last = st->comm ? ncclGetLastError(st->comm) : NULL;
        char detail[256];
        snprintf(detail, sizeof(detail), "%s", last && *last ? last : "NCCL gave no detail");
        if (st->comm)
            ncclCommAbort(st->comm);
        st->comm = NULL;
        if (r == ncclInProgress)
            rc = error_set(FSDP_ETIMEDOUT, "ncclCommInitRank for group '%s' (rank %d of %d) did not finish within "
                           "%.0f s (FSDP_COMM_TIMEOUT_S): a rank of the group never joined or cannot be reached "
                           "(check NCCL_SOCKET_IFNAME; NCCL_DEBUG=INFO shows which peer it waits for); aborted",
                           info->group, info->rank, info->size, info->timeout_s);
        else
            rc = error_set(FSDP_EIO, "ncclCommInitRank for group '%s' (rank %d of %d) failed: %s: %s (set "
                           "NCCL_DEBUG=INFO for details)", info->group, info->rank, info->size, ncclGetErrorString(r),
                           detail);
        goto fail;
    }
    *state = st;
    return 0;
fail:
    nccl_fini(st);
    return rc;
}

/* The split hook, run on the parent's progress thread. ncclCommSplit is a collective over every rank of
 * the parent, so this rank calls it even when it cannot build its child (NOCOLOR then): its peers' split
 * returns, one member short, and the rank check below turns that into an error on their side too.
 * The child is nonblocking like every communicator here, and the split is settled against the parent's
 * timeout: the store exchange in comm_split already saw every rank arrive, so a peer missing here is one
 * that stopped in between, and past the timeout the half-made child is aborted with an error naming it. */
static int nccl_split(void *parent_state, const struct comm_info *child_info, int color, int key,
                      void **child_state)
{
    struct nccl_state *p = parent_state;
    const char *group = child_info ? child_info->group : "(none)";
    if (child_state)
        *child_state = NULL;
    if (!p->comm)
        return error_set(FSDP_EABORTED, "ncclCommSplit into group '%s' not run on rank %d: the parent NCCL "
                         "communicator was aborted by an earlier failure", group, p->rank);
    struct nccl_state *st = NULL;
    int made = child_info ? nccl_state_new(child_info, &st) : 0;
    char why[512] = "";
    if (made)
        snprintf(why, sizeof(why), "%s", error_message());
    cudaSetDevice(p->device);
    ncclConfig_t cfg = nccl_config(child_info ? child_info->group : p->group);
    ncclComm_t nc = NULL;
    double deadline = clock_now_s() + p->timeout_s;
    ncclResult_t r = ncclCommSplit(p->comm, st && color >= 0 ? color : NCCL_SPLIT_NOCOLOR, key, &nc, &cfg);
    /* Nonblocking, the split is an operation of the parent: NCCL writes the child's handle into nc only when
     * the parent's state leaves ncclInProgress (NCCL issue 1472), and the child may then still be
     * initialising (an H200 run, NCCL 2.28.3, world 1: settling only the parent, or only a child handle
     * present at return, both left no usable child: ncclCommCount failed or nc was NULL). So: the
     * parent settles, then the handle arrives (written by NCCL's thread: read it through a volatile), then
     * the child settles. A rank that asked for no child (NOCOLOR) gets none. */
    if (r == ncclSuccess || r == ncclInProgress) {
        r = nccl_settle(p->comm, deadline);
        if (r == ncclSuccess && st && color >= 0)
            r = nccl_wait_handle((ncclComm_t volatile *)&nc, deadline);
        if (r == ncclSuccess && nc)
            r = nccl_settle(nc, deadline);
    }
    int rc = 0;
    if (r == ncclInProgress) {
        rc = error_set(FSDP_ETIMEDOUT, "ncclCommSplit into group '%s' on rank %d of the parent did not finish "
                       "within %.0f s (FSDP_COMM_TIMEOUT_S): a rank of the parent group '%s' stopped before "
                       "joining it; aborted", group, p->rank, p->timeout_s, p->group);
        goto fail;
    }
    if (r != ncclSuccess) {
        /* the parent's last error is read after the child is gone */
        if (nc)
            ncclCommAbort(nc);
        nc = NULL;
        const char *last = ncclGetLastError(p->comm);
        rc = error_set(FSDP_EIO, "ncclCommSplit into group '%s' failed on rank %d of the parent (color %d, "
                       "child rank %d): %s: %s (set NCCL_DEBUG=INFO for details)", group, p->rank, color, key,
                       ncclGetErrorString(r), last && *last ? last : "NCCL gave no detail");
        goto fail;
    }
    if (!st) {
        if (nc)
            ncclCommDestroy(nc); /* NCCL made a group this rank did not ask for: not ours to keep */
        return made ? error_set(made, "group '%s' on rank %d: %s", group, p->rank, why) : 0;
    }
    int n = -1, rk = -1;
    if (!nc || ncclCommCount(nc, &n) != ncclSuccess || ncclCommUserRank(nc, &rk) != ncclSuccess ||
        n != child_info->size || rk != child_info->rank) {
        rc = error_set(FSDP_EPROTO, "ncclCommSplit into group '%s' on rank %d of the parent made rank %d of %d, "
                       "but the ranks agreed rank %d of %d through the store (a peer's split failed: see its "
                       "log)", group, p->rank, rk, n, child_info->rank, child_info->size);
        goto fail;
    }
    st->comm = nc;
    *child_state = st;
    return 0;
fail:
    if (nc)
        ncclCommAbort(nc);
    nccl_fini(st);
    return rc;
}

static ncclDataType_t nccl_type(enum dtype d)
{
    return d == DTYPE_F32 ? ncclFloat32 : d == DTYPE_BF16 ? ncclBfloat16 : ncclFloat16;
}

static ncclRedOp_t nccl_op(enum comm_op op)
{
    return op == COMM_AVG ? ncclAvg : op == COMM_MAX ? ncclMax : ncclSum;
}

/* comm_backend.poll: the collective's event (recorded after it on the communicator's stream) says whether it
 * has ended; while it has not, NCCL's async error and the deadline are checked, and either aborts the
 * communicator so the kernels of this rank stop (a device wait cannot take a timeout). */
static int nccl_poll(void *state, struct comm_req *q, bool *done)
{
    struct nccl_state *st = state;
    *done = false;
    if (!st->comm)
        return error_set(FSDP_EABORTED, "the NCCL communicator was aborted by an earlier failure");
    cudaError_t ce = cudaEventQuery((cudaEvent_t)q->done);
    if (ce == cudaSuccess) {
        *done = true;
        return 0;
    }
    if (ce != cudaErrorNotReady)
        return error_set(FSDP_EIO, "CUDA error: %s", cudaGetErrorString(ce));
    ncclResult_t ar = ncclSuccess;
    ncclCommGetAsyncError(st->comm, &ar);
    if (ar != ncclSuccess && ar != ncclInProgress) {
        ncclCommAbort(st->comm);
        st->comm = NULL;
        return error_set(FSDP_ECLOSED, "NCCL reported %s (a peer probably died); communicator aborted",
                         ncclGetErrorString(ar));
    }
    if (clock_now_s() >= q->deadline) {
        ncclCommAbort(st->comm);
        st->comm = NULL;
        return error_set(FSDP_ETIMEDOUT, "NCCL did not complete in time (some rank did not arrive; NCCL cannot "
                         "say which: look for the rank whose log stops first); communicator aborted");
    }
    return 0;
}

/* On the issuing thread (comm_backend.issue): an event on the compute stream now, so the collective waits
 * for the kernels queued before it was issued and for nothing queued after. Recording it later, on the
 * progress thread, would also cover the next unit's forward that the engine queues right after issuing
 * its prefetch, and the prefetch would no longer overlap anything. */
static int nccl_issue(void *state, struct comm_req *q)
{
    (void)state;
    q->ready = NULL;
    cudaStream_t cs;
    int cdev, cur = -1;
    if (fsdp_cuda_compute_stream(&cs, &cdev) != 0)
        return 0;
    cudaEvent_t ev = NULL;
    /* an event must live on the device of the stream it is recorded on; the caller's device is kept */
    cudaError_t ce = cudaGetDevice(&cur);
    if (ce == cudaSuccess && cur != cdev)
        ce = cudaSetDevice(cdev);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (ce == cudaSuccess)
        ce = cudaEventRecord(ev, cs);
    if (cur >= 0 && cur != cdev)
        cudaSetDevice(cur);
    if (ce != cudaSuccess) {
        if (ev)
            cudaEventDestroy(ev);
        return error_set(FSDP_EIO, "NCCL %s: cannot record the compute stream's progress: %s (an earlier kernel "
                         "may have failed)", comm_kind_name(q->kind), cudaGetErrorString(ce));
    }
    q->ready = ev;
    return 0;
}

/* One group: NCCL posts every send and receive of the batch before any must finish, so two ranks that
 * both send to each other first exchange instead of waiting for each other's receive. */
static ncclResult_t nccl_sendrecv(struct nccl_state *st, const struct comm_req *q)
{
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; r == ncclSuccess && i < q->np2p; i++) {
        const struct comm_p2p *o = &q->p2p[i];
        r = o->kind == COMM_P2P_SEND
                ? ncclSend(o->buf, o->count, nccl_type(o->dtype), o->peer, st->comm, st->stream)
                : ncclRecv(o->buf, o->count, nccl_type(o->dtype), o->peer, st->comm, st->stream);
    }
    /* A group that was started is always ended, also after a failed call inside it. */
    ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

/* The issue-time event of a request that will not run (comm_backend.release). */
static void nccl_release(void *state, struct comm_req *q)
{
    (void)state;
    if (q->ready)
        cudaEventDestroy((cudaEvent_t)q->ready);
    if (q->done)
        cudaEventDestroy((cudaEvent_t)q->done);
    q->ready = NULL;
    q->done = NULL;
}

/* comm_backend.order: the CUDA table's compute stream waits, on the device, for the collective's event; the
 * host goes on queuing. */
static int nccl_order(void *state, const struct comm_req *q)
{
    (void)state;
    cudaStream_t cs;
    int cdev, cur = -1;
    if (fsdp_cuda_compute_stream(&cs, &cdev) != 0 || !q->done)
        return 0;
    cudaError_t ce = cudaGetDevice(&cur);
    if (ce == cudaSuccess && cur != cdev)
        ce = cudaSetDevice(cdev);
    if (ce == cudaSuccess)
        ce = cudaStreamWaitEvent(cs, (cudaEvent_t)q->done, 0);
    if (cur >= 0 && cur != cdev)
        cudaSetDevice(cur);
    if (ce != cudaSuccess)
        return error_set(FSDP_EIO, "NCCL %s: cannot order the compute stream after it: %s", comm_kind_name(q->kind),
                         cudaGetErrorString(ce));
    return 0;
}

/* comm_backend.launch: the collective on the communicator's stream, after the compute stream's event of its
 * issue, and an event after it for poll() and order(). */
static int nccl_launch(void *state, struct comm_req *q)
{
    struct nccl_state *st = state;
    if (!st->comm) {
        if (q->ready)
            cudaEventDestroy((cudaEvent_t)q->ready);
        q->ready = NULL;
        return error_set(FSDP_EABORTED, "the NCCL communicator was aborted by an earlier failure");
    }
    /* No event means no compute stream existed when the collective was issued: nothing to wait for. */
    if (q->ready) {
        cudaSetDevice(st->device);
        cudaError_t ce = cudaStreamWaitEvent(st->stream, (cudaEvent_t)q->ready, 0);
        cudaEventDestroy((cudaEvent_t)q->ready); /* released once it has completed */
        q->ready = NULL;
        if (ce != cudaSuccess)
            return error_set(FSDP_EIO, "cannot order the NCCL stream after the compute stream: %s",
                             cudaGetErrorString(ce));
    }
    cudaSetDevice(st->device);
    ncclDataType_t t = nccl_type(q->dtype);
    ncclResult_t r = ncclSuccess;
    switch (q->kind) {
    case COMM_K_ALL_GATHER:
        r = ncclAllGather(q->in, q->out, q->count, t, st->comm, st->stream);
        break;
    case COMM_K_REDUCE_SCATTER:
        r = ncclReduceScatter(q->in, q->out, q->count, t, nccl_op(q->op), st->comm, st->stream);
        break;
    case COMM_K_ALL_REDUCE:
        r = ncclAllReduce(q->in, q->out, q->count, t, nccl_op(q->op), st->comm, st->stream);
        break;
    case COMM_K_BROADCAST:
        r = ncclBroadcast(q->out, q->out, q->count, t, q->peer, st->comm, st->stream);
        break;
    case COMM_K_BARRIER: {
        /* NCCL has no barrier: a one-element all-reduce of the communicator's own word does the job. */
        cudaError_t ce = cudaMemsetAsync(st->word, 0, sizeof(float), st->stream);
        if (ce != cudaSuccess)
            return error_set(FSDP_EIO, "NCCL barrier: cudaMemsetAsync: %s", cudaGetErrorString(ce));
        r = ncclAllReduce(st->word, st->word, 1, ncclFloat32, ncclSum, st->comm, st->stream);
        break;
    }
    case COMM_K_SEND:
        r = ncclSend(q->in, q->count, t, q->peer, st->comm, st->stream);
        break;
    case COMM_K_RECV:
        r = ncclRecv(q->out, q->count, t, q->peer, st->comm, st->stream);
        break;
    case COMM_K_ALL_TO_ALL: {
        /* NCCL has no all-to-all: one group of paired sends and receives, one per peer. */
        size_t blk = q->count * dtype_size(q->dtype);
        r = ncclGroupStart();
        for (int p = 0; p < st->size && r == ncclSuccess; p++) {
            r = ncclSend((const char *)q->in + (size_t)p * blk, q->count, t, p, st->comm, st->stream);
            if (r == ncclSuccess)
                r = ncclRecv((char *)q->out + (size_t)p * blk, q->count, t, p, st->comm, st->stream);
        }
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess)
            r = e;
        break;
    }
    case COMM_K_SENDRECV:
        r = nccl_sendrecv(st, q);
        break;
    case COMM_K_SPLIT: /* the core's own steps never reach run() */
    case COMM_K_INIT:
    case COMM_K_FINI:
    case COMM_K_MEM_ALLOC:
    case COMM_K_MEM_FREE:
        return error_set(FSDP_EINVAL, "nccl backend: a %s request reached launch()", comm_kind_name(q->kind));
    }
    /* On a nonblocking communicator the enqueue itself may still be going on: the stream is empty until it
     * is done, so an event recorded now would complete before the collective. */
    if (r == ncclInProgress)
        r = nccl_settle(st->comm, q->deadline);
    if (r == ncclInProgress) {
        ncclCommAbort(st->comm);
        st->comm = NULL;
        return error_set(FSDP_ETIMEDOUT, "NCCL %s could not even be queued in time (some rank did not arrive; "
                         "NCCL cannot say which: look for the rank whose log stops first); communicator aborted",
                         comm_kind_name(q->kind));
    }
    if (r != ncclSuccess)
        return error_set(FSDP_EIO, "NCCL %s: %s", comm_kind_name(q->kind), ncclGetErrorString(r));
    cudaEvent_t done = NULL;
    cudaError_t ce = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (ce == cudaSuccess)
        ce = cudaEventRecord(done, st->stream);
    if (ce != cudaSuccess) {
        if (done)
            cudaEventDestroy(done);
        return error_set(FSDP_EIO, "NCCL %s: cannot record its end on the stream: %s", comm_kind_name(q->kind),
                         cudaGetErrorString(ce));
    }
    q->done = done;
    return 0;
}

/* ncclMemAlloc rather than cudaMalloc: its memory can be registered with NCCL (NVLS, zero-copy
 * collectives) where the platform supports it, and is plain device memory otherwise. */
static void *nccl_mem_alloc(void *state, size_t bytes)
{
    struct nccl_state *st = state;
    void *p = NULL;
    cudaError_t ce = cudaSetDevice(st->device);
    ncclResult_t r = ce == cudaSuccess ? ncclMemAlloc(&p, bytes ? bytes : 1) : ncclSuccess;
    if (ce != cudaSuccess || r != ncclSuccess) {
        error_set(FSDP_ENOMEM, "comm_mem_alloc: %zu bytes on device %d failed: %s", bytes, st->device,
                  ce != cudaSuccess ? cudaGetErrorString(ce) : ncclGetErrorString(r));
        return NULL;
    }
    return p;
}

static int nccl_mem_free(void *state, void *p)
{
    (void)state;
    ncclResult_t r = ncclMemFree(p);
    return r == ncclSuccess ? 0 : error_set(FSDP_EINVAL, "comm_mem_free: %s", ncclGetErrorString(r));
}

static const struct comm_backend nccl_backend = {
    .name = "nccl", .init = nccl_init, .fini = nccl_fini, .mem_alloc = nccl_mem_alloc, .mem_free = nccl_mem_free,
    .split = nccl_split, .issue = nccl_issue, .release = nccl_release, .launch = nccl_launch, .poll = nccl_poll,
    .order = nccl_order, .serial = true};

const struct comm_backend *comm_backend_nccl(void)
{
    return &nccl_backend;
}
