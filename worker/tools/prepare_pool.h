/* The threads of fsdp-prepare-data (-j N): jobs pushed by one thread are run by N worker threads and popped
 * by that thread in the order they were pushed, whichever thread finished first, so what is written does
 * not depend on N. Memory is bounded: at most max_jobs jobs, holding at most max_bytes of input between
 * them (a single larger job is taken alone), are in flight between push and pop; when the pool has no room
 * the pusher pops (and writes) the oldest job first. With one thread no thread is started: push runs the
 * job on the caller's thread, so -j 1 is the plain loop it always was. */
#ifndef FSDP_TOOLS_PREPARE_POOL_H
#define FSDP_TOOLS_PREPARE_POOL_H

#include <stdbool.h>
#include <stddef.h>

struct prepare_pool;

/* Makes a thread's state (its own tokenizer: a tokenizer is used by one thread at a time). Runs on that
 * thread; an error (message set) fails prepare_pool_start. */
typedef int (*prepare_pool_init_fn)(void *ctx, int thread, void **state);
typedef void (*prepare_pool_fini_fn)(void *ctx, int thread, void *state);
/* Runs one job; its outcome, errors included, is kept in the job for the popper. */
typedef void (*prepare_pool_work_fn)(void *state, void *job);

struct prepare_pool_config {
    int threads;      /* >= 1 */
    size_t max_jobs;  /* >= 1 */
    size_t max_bytes; /* the input bytes of the jobs in flight */
    prepare_pool_init_fn init;
    prepare_pool_fini_fn fini;
    prepare_pool_work_fn work;
    void *ctx;
};

/* Starts the threads and returns once each has made its state (the first error otherwise, with its
 * message, after stopping them). */
int prepare_pool_start(const struct prepare_pool_config *cfg, struct prepare_pool **out);
/* Whether a job of `bytes` input bytes may be pushed now. */
bool prepare_pool_has_room(struct prepare_pool *p, size_t bytes);
/* Queues a job (the caller checked the room). */
void prepare_pool_push(struct prepare_pool *p, void *job, size_t bytes);
/* The oldest job in flight once it is done; NULL when none is in flight, or (wait false) when the oldest
 * is not done yet. */
void *prepare_pool_pop(struct prepare_pool *p, bool wait);
/* Jobs queued but not started are not run (they pop as they were pushed): for a run that already failed. */
void prepare_pool_cancel(struct prepare_pool *p);
/* Stops the threads (after their current job) and frees the pool; pop every job first. NULL is a no-op. */
void prepare_pool_stop(struct prepare_pool *p);

#endif
