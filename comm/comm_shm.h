/* The shared-memory engine: the ranks of one host share a segment with a futex barrier and double-
 * buffered slots; data moves with memcpy and in-place reductions, chunked so large buffers pipeline
 * through a fixed-size segment. When every rank's buffers of an operation are registered (comm_mem.h),
 * ranks read each other's buffers directly instead: one copy per block, a peer's pages mapped into the
 * reader from the read until an operation reads other ranges (FSDP_COMM_SHM_KEEP_PEER_PAGES: last, the
 * default; 0 drops them right after the read; 1 keeps them all, and RSS then counts them). Ranks here
 * are local indices 0..n-1 (the communicator maps them). */
#ifndef FSDP_COMM_SHM_H
#define FSDP_COMM_SHM_H

#include "comm/comm.h"

#include <stdbool.h>
#include <stddef.h>

#define SHM_MAX_LOCAL 64

struct shm_group;

/* Checks FSDP_COMM_SHM_KEEP_PEER_PAGES (unset, last, 0 or 1); 0, or an error naming the variable. The cpu
 * backend calls it before any rank talks to the store, so a bad value stops every rank at once instead
 * of leaving the others waiting for a leader that refused it. */
int shm_check_env(void);
/* Named segments live in /dev/shm only until every rank has attached, but a leader killed in that window
 * leaves its segment behind, and its name ends in that leader's pid. Removes the segments named
 * "<prefix>...-<pid>" that belong to this user and whose pid no longer exists; returns how many. The cpu
 * backend's leader calls it before creating its own. */
int shm_sweep_stale(const char *prefix);
/* Bytes of segment a group of n ranks with slots of slot_bytes needs. */
size_t shm_segment_bytes(int n, size_t slot_bytes);
/* create: O_CREAT|O_EXCL the named segment (the first rank); otherwise open the existing one. The caller
 * unlinks (shm_unlink) as soon as every rank has attached. global_ranks[i] names local rank i in
 * messages. */
int shm_group_attach(const char *name, bool create, int local_rank, int n, const int *global_ranks,
                     size_t slot_bytes, struct shm_group **out);
/* After every rank has attached (the caller's store barrier): decides once, identically on every rank,
 * whether registered buffers (comm_mem.h) may take the one-copy path, from what each rank's attach
 * found (it can open a peer's /proc/<pid>/fd; FSDP_COMM_SHM_DIRECT=0 says no). */
void shm_group_ready(struct shm_group *g);
void shm_group_detach(struct shm_group *g);

/* All wait until deadline (clock_now_s); a dead peer (its pid gone or a zombie) or a rank that aborted
 * makes every rank fail with a message naming it. */
int shm_barrier(struct shm_group *g, double deadline);
int shm_all_gather(struct shm_group *g, const void *in, void *out, size_t bytes_per_rank, double deadline);
int shm_all_reduce(struct shm_group *g, const void *in, void *out, size_t count, enum dtype dtype,
                   enum comm_op op, int divisor, double deadline);
int shm_reduce_scatter(struct shm_group *g, const void *in, void *out, size_t count, enum dtype dtype,
                       enum comm_op op, int divisor, double deadline);
int shm_broadcast(struct shm_group *g, void *buf, size_t bytes, int root, double deadline);
/* Operations of this process that took the one-copy path (for tests and benchmarks). */
uint64_t shm_direct_count(void);
/* Shared-memory barriers this process has passed or entered, all groups together (tests check that every
 * rank of a group takes the same number for the same operations). */
uint64_t shm_barrier_count(void);
/* Makes every rank of the group fail its current or next wait with this rank's message (used when a
 * step outside the segment, e.g. TCP between hosts, failed on this rank). */
void shm_abort(struct shm_group *g, const char *why);

#endif
