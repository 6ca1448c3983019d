/* Collectives for the data plane: all_gather, reduce_scatter, all_reduce, broadcast, barrier, send/recv
 * over a group of ranks, with blocking and asynchronous forms. A communicator is bootstrapped through the
 * rendezvous store and runs on one backend chosen at creation: "cpu" (shared memory between ranks of a
 * host, TCP between hosts) or "nccl" (CUDA device buffers). See docs/collectives.md.
 *
 * Every call returns 0 or a negative enum fsdp_error; error_message() then names the collective, its
 * sequence number, the group, and the rank(s) that did not arrive. After a failed collective the
 * communicator is broken: later calls fail at once with the first error (peers are out of step).
 *
 * Counts are in elements. A count may be 0. all_gather takes `count` elements per rank and fills
 * `size * count`; reduce_scatter takes `size * count` and yields `count`: callers pad their buffers to a
 * multiple of the group size. Buffers are host memory for "cpu" and device memory for "nccl".
 *
 * Threading: one thread issues operations on a communicator (the FSDP engine's); a progress thread per
 * communicator runs them in issue order (NCCL: one progress thread for all of a process's communicators,
 * so every rank launches them in the order its one issuing thread issued them; docs/collectives.md).
 * Buffers passed to an asynchronous call must stay untouched until its handle is waited for. */
#ifndef FSDP_COMM_COMM_H
#define FSDP_COMM_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

struct store_client;
struct comm;
struct comm_work;

/* Element types are common/dtype.h's enum dtype, spelled DTYPE_* everywhere. */

/* SUM of f32 adds in rank order (bitwise reproducible; see docs/collectives.md for the hierarchical
 * order); bf16/f16 accumulate in f32 and round once. AVG = SUM then one division by the group size. */
enum comm_op { COMM_SUM = 0, COMM_AVG = 1, COMM_MAX = 2 };

#define COMM_SPLIT_NONE (-1) /* comm_split color for ranks that join no sub-group */

struct comm_options {
    const char *backend;  /* "cpu", "nccl"; NULL = $FSDP_COMM_BACKEND, else "cpu" */
    int generation;       /* rendezvous generation, part of every store key; < 0 = $FSDP_RDZV_GENERATION or 0 */
    double timeout_s;     /* per-wait limit; <= 0 = $FSDP_COMM_TIMEOUT_S, else 600 */
    int device;           /* nccl: CUDA device; < 0 = $LOCAL_RANK or 0 */
};

/* Collective over all `size` ranks, which call it with the same group name (unique among the job's live
 * communicators, [A-Za-z0-9_.-], at most 64 chars). The store client is used only during comm_create and
 * comm_split, from the calling thread. opts NULL = all defaults. */
int comm_create(struct store_client *store, int rank, int size, const char *group,
                const struct comm_options *opts, struct comm **out);
/* Collective over comm: ranks with the same color form a sub-communicator ordered by (key, old rank);
 * color COMM_SPLIT_NONE yields *out = NULL. Children are named "<group>.<n>c<color>" (n counts the
 * splits of the parent) and use the parent's store, backend and options. */
int comm_split(struct comm *comm, int color, int key, struct comm **out);
/* Waits for pending operations (bounded by their timeouts), then frees. NULL accepted. */
void comm_destroy(struct comm *comm);

int comm_rank(const struct comm *comm);
int comm_size(const struct comm *comm);
const char *comm_group(const struct comm *comm);
const char *comm_backend_name(const struct comm *comm);

/* ---- registered memory ----
 * A buffer from comm_mem_alloc may be used by any collective of any communicator of the same backend
 * (comm_split children included) exactly like other memory; what it adds is speed. On "cpu" it is a
 * per-process shared mapping that the other ranks of the host map on first use and cache: when every
 * rank's input of an operation lies in such memory (all_reduce: input and output; broadcast: the root's
 * buffer), the data moves with one copy straight from the peers' buffers (docs/collectives.md). On
 * "nccl" it is ncclMemAlloc device memory. Page-aligned (cpu) and zero-filled (cpu); bytes 0 is allowed.
 * Returns NULL with error_message() set on failure. Thread-safe, callable while operations are in flight;
 * on "nccl" it runs on the progress thread between operations, so it waits for those issued before it
 * (ncclMemAlloc while NCCL kernels run can deadlock the device: allocate before the first collective).
 * Allocate once and reuse: freeing makes every peer drop its cached mappings of this rank's buffers.
 * A buffer must not be freed while an operation using it is queued; free it before comm_destroy(comm).
 * comm_mem_free(comm, NULL) does nothing; a pointer not from comm_mem_alloc is reported and not freed. */
void *comm_mem_alloc(struct comm *comm, size_t bytes);
void comm_mem_free(struct comm *comm, void *p);

/* ---- blocking forms ---- */
/* in: count elements; out: size * count. In-place form: in == out + rank * count. */
int comm_all_gather(struct comm *comm, const void *in, void *out, size_t count, enum dtype dtype);
/* in: size * count elements; out: count (the reduction of every rank's block `rank`). op SUM or AVG
 * (MAX also works). out must not overlap in. */
int comm_reduce_scatter(struct comm *comm, const void *in, void *out, size_t count, enum dtype dtype,
                        enum comm_op op);
/* in == out allowed. */
int comm_all_reduce(struct comm *comm, const void *in, void *out, size_t count, enum dtype dtype,
                    enum comm_op op);
int comm_broadcast(struct comm *comm, void *buf, size_t count, enum dtype dtype, int root);
int comm_barrier(struct comm *comm);
/* in: size * count elements, block p (elements p*count ..) for rank p; out: size * count, block p from
 * rank p (Ulysses' sequence <-> head re-sharding). out must not overlap in. */
int comm_all_to_all(struct comm *comm, const void *in, void *out, size_t count, enum dtype dtype);
/* Point to point; matched in issue order per pair of ranks. Each runs alone: two ranks that both send
 * to each other first wait for each other (NCCL) unless the sends and receives go in one comm_sendrecv. */
int comm_send(struct comm *comm, const void *buf, size_t count, enum dtype dtype, int peer);
int comm_recv(struct comm *comm, void *buf, size_t count, enum dtype dtype, int peer);

/* A batch of sends and receives run together (NCCL: one ncclGroupStart/End; PyTorch's batch_isend_irecv),
 * so their order inside the batch cannot deadlock: two ranks that both list a send to the other first
 * exchange. Matched with the peers' operations in issue order per pair of ranks, as single sends and
 * receives are. At most 256 operations; a peer must be another rank of the group. */
enum comm_p2p_kind { COMM_P2P_SEND = 0, COMM_P2P_RECV = 1 };
struct comm_p2p {
    enum comm_p2p_kind kind;
    void *buf; /* read for a send, written for a receive */
    size_t count;
    enum dtype dtype;
    int peer;
};
#define COMM_P2P_MAX 256
int comm_sendrecv(struct comm *comm, const struct comm_p2p *ops, int n);

/* ---- asynchronous forms: queue the operation and return a handle at once ---- */
int comm_all_gather_async(struct comm *comm, const void *in, void *out, size_t count, enum dtype dtype,
                          struct comm_work **work);
int comm_reduce_scatter_async(struct comm *comm, const void *in, void *out, size_t count,
                              enum dtype dtype, enum comm_op op, struct comm_work **work);
int comm_all_reduce_async(struct comm *comm, const void *in, void *out, size_t count, enum dtype dtype,
                          enum comm_op op, struct comm_work **work);
int comm_broadcast_async(struct comm *comm, void *buf, size_t count, enum dtype dtype, int root,
                         struct comm_work **work);
int comm_all_to_all_async(struct comm *comm, const void *in, void *out, size_t count, enum dtype dtype,
                          struct comm_work **work);
int comm_send_async(struct comm *comm, const void *buf, size_t count, enum dtype dtype, int peer,
                    struct comm_work **work);
int comm_recv_async(struct comm *comm, void *buf, size_t count, enum dtype dtype, int peer,
                    struct comm_work **work);
int comm_sendrecv_async(struct comm *comm, const struct comm_p2p *ops, int n, struct comm_work **work);

/* Blocks until the operation finished (each operation is bounded by the communicator's timeout), returns
 * its status and frees the handle. */
int comm_work_wait(struct comm_work *work);
/* Orders the caller's device work after the operation without waiting for it on the host, where the
 * backend can (NCCL: the CUDA table's compute stream waits for the collective's event); elsewhere waits
 * until it finished. The handle is kept: comm_work_wait still has to be called, later (it gives the status
 * and frees it); the operation's buffers are the operation's until then, except to device work queued after
 * this call. An error here (a failure already known) is also what that wait returns. */
int comm_work_order(struct comm_work *work);
/* *done = finished; never blocks. The handle still has to be waited for (which then returns at once). */
int comm_work_test(struct comm_work *work, bool *done);
/* Sequence number of the operation (1-based per communicator), as named in error messages. */
uint64_t comm_work_seq(const struct comm_work *work);

#endif
