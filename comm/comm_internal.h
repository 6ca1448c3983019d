/* What the communicator core (comm.c) and its backends share: the request a backend executes, the
 * backend table, and the dtype/reduction helpers. Not part of the public API. */
#ifndef FSDP_COMM_INTERNAL_H
#define FSDP_COMM_INTERNAL_H

#include "comm/comm.h"
#include "common/clock.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Operations a backend's run() executes, then the core's own steps (COMM_K_SPLIT and after), which it queues
 * like operations so that they run in issue order with them: a split for a backend with a split hook (a
 * collective over the parent), and, for a serial backend, a communicator's init and fini and comm_mem_alloc
 * / comm_mem_free (see comm_backend.serial). */
enum comm_kind { COMM_K_ALL_GATHER, COMM_K_REDUCE_SCATTER, COMM_K_ALL_REDUCE, COMM_K_BROADCAST,
                 COMM_K_BARRIER, COMM_K_SEND, COMM_K_RECV, COMM_K_ALL_TO_ALL, COMM_K_SENDRECV,
                 COMM_K_SPLIT, COMM_K_INIT, COMM_K_FINI, COMM_K_MEM_ALLOC, COMM_K_MEM_FREE };

struct comm_info;

struct comm_req {
    enum comm_kind kind;
    const void *in;
    void *out;
    size_t count;
    enum dtype dtype;
    enum comm_op op;
    int peer; /* root for broadcast */
    uint64_t seq;
    double deadline; /* clock_now_s() seconds (common/clock.h) by which every wait of this request gives up */
    /* COMM_K_SENDRECV: the point-to-point operations to run together (a copy owned by the request). */
    const struct comm_p2p *p2p;
    int np2p;
    /* COMM_K_SPLIT only: the arguments of comm_backend.split (child NULL for COMM_SPLIT_NONE). */
    int color, key;
    const struct comm_info *child;
    void **child_state;
    /* Set by comm_backend.issue on the issuing thread, consumed by run() or launch() (NCCL: the compute-stream
     * event the collective waits for; launch() sets it back to NULL once it is consumed). */
    void *ready;
    /* Set by comm_backend.launch: what poll() and order() read (NCCL: an event recorded on the communicator's
     * stream after the operation); freed by comm_backend.release when the work is freed. */
    void *done;
};

/* What a backend sees of its communicator. */
struct comm_info {
    struct store_client *store;
    int rank, size, generation, device;
    double timeout_s;
    char group[72];
    char key_prefix[128]; /* "comm/<group>/<gen>" */
};

/* A backend: a table chosen once at creation. run() executes one request to completion (blocking, on
 * the communicator's progress thread) and on failure sets an error message that names the rank(s) at
 * fault; the core adds the collective, sequence number and group. */
struct comm_backend {
    const char *name;
    int (*init)(const struct comm_info *info, void **state);
    int (*run)(void *state, const struct comm_req *req);
    void (*fini)(void *state);
    /* comm_mem_alloc / comm_mem_free; NULL = plain aligned host memory. mem_free returns 0 or
     * FSDP_EINVAL for a pointer it does not know. Called from any thread. */
    void *(*mem_alloc)(void *state, size_t bytes);
    int (*mem_free)(void *state, void *p);
    /* Optional: builds the child's state from the parent's, as a collective over every rank of the parent
     * (color COMM_SPLIT_NONE with child_info NULL for a rank that joins no group). The core has already
     * agreed the membership through the store and passes key = the child rank it computed, so the
     * backend's order cannot differ from the core's. Runs on the parent's progress thread, in issue
     * order (as a COMM_K_SPLIT request). NULL = children are made with init() like any communicator. */
    int (*split)(void *parent_state, const struct comm_info *child_info, int color, int key, void **child_state);
    /* Optional: called on the issuing thread for every operation (not splits), before it is queued, so a
     * backend can capture what that thread has ordered so far: NCCL records an event on the compute stream
     * here, and run() makes the collective wait for exactly the kernels queued before the call. Must not
     * touch what run() owns; may set req->ready. */
    int (*issue)(void *state, struct comm_req *req);
    /* Optional: frees what issue() attached to a request that will never reach run() or launch() (its
     * communicator broke first, or queuing it failed), and what launch() attached, once the work is freed.
     * Called on whichever thread drops the request. */
    void (*release)(void *state, struct comm_req *req);
    /* Optional, all three together: run() in two halves, so the progress thread never sits on a device while
     * later operations wait to be queued behind it. launch() queues the operation on the backend's stream and
     * returns (it may wait, up to req->deadline, for the enqueue itself); the progress thread launches each
     * operation as it comes and polls the oldest: poll() sets *done once it has completed, or fails as run()
     * would (a peer's error, req->deadline passed: the backend aborts). order(), on the issuing thread after
     * launch(), makes the caller's device work wait for the operation on the device (comm_work_order): the
     * host does not wait. A backend with launch() needs no run(). */
    int (*launch)(void *state, struct comm_req *req);
    int (*poll)(void *state, struct comm_req *req, bool *done);
    int (*order)(void *state, const struct comm_req *req);
    /* Every operation of every communicator of this backend in the process runs on one progress thread, in
     * issue order, and so do their init, split and fini and comm_mem_alloc/comm_mem_free: NCCL needs one
     * launch order on all ranks across communicators used together (a HYBRID_SHARD rank's shard and
     * replicate groups), and an allocation or a communicator's creation while its kernels run can deadlock
     * the device. A comm_mem_alloc then waits for the operations issued before it. */
    bool serial;
};

/* comm_registry.c: the table of the backend named name ("cpu", "nccl"): 0, or FSDP_EINVAL for a name it
 * does not know and FSDP_EUNSUPPORTED for one this build or host cannot run, with error_set saying which. */
int comm_backend_find(const char *name, const struct comm_backend **out);
/* The backends' tables, for the registry: comm_cpu.c; comm_nccl.c, built into the GPU module only (the
 * registry reaches it through common/gpu_module.h). */
const struct comm_backend *comm_backend_cpu(void);
const struct comm_backend *comm_backend_nccl(void);

/* comm_request.c, used by the core and the backends alike. */
const char *comm_kind_name(enum comm_kind kind);

/* dst[i] = srcs[0][i] (op) srcs[1][i] (op) ... in that order, accumulated in f32, then divided by
 * divisor when divisor > 1 (AVG), then rounded to dtype once. dst may alias any source. op is SUM or
 * MAX (AVG is SUM with a divisor). */
void comm_reduce_arrays(enum dtype dtype, enum comm_op op, const void *const *srcs, int nsrc, void *dst,
                        size_t n, int divisor);
/* memcpy (no overlap) with non-temporal stores for large sizes; for copies nobody reads back soon. */
void comm_copy_stream(void *dst, const void *src, size_t n);
/* The same at any size (pieces of a large destination written block by block). */
void comm_copy_nt(void *dst, const void *src, size_t n);
/* comm_reduce_arrays for a large destination nobody reads back soon: f32 results go out with
 * non-temporal stores when n is large (same values, same order). */
void comm_reduce_arrays_stream(enum dtype dtype, enum comm_op op, const void *const *srcs, int nsrc,
                               void *dst, size_t n, int divisor);

#endif
