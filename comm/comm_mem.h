/* Registered host memory for the cpu backend: each allocation is its own memfd mapping, so a peer process
 * on the same host can map it (through /proc/<pid>/fd/<fd>) and read it directly. The registry is
 * process-wide (not per communicator), so a buffer allocated through one communicator is registered for
 * its comm_split children too. Thread-safe. */
#ifndef FSDP_COMM_MEM_H
#define FSDP_COMM_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where a byte range of registered memory lives, as a peer needs it to map the range. */
struct comm_mem_ref {
    int32_t fd;         /* in the owner process */
    uint64_t id;        /* unique per allocation in the owner process (fd numbers are reused) */
    uint64_t map_bytes; /* length of the whole mapping */
    uint64_t off;       /* of the range inside the mapping */
};

/* Page-aligned, zero-filled; NULL with error_set on failure. bytes 0 gives one page. */
void *comm_mem_shared_alloc(size_t bytes);
/* Returns 0, or FSDP_EINVAL when p was not allocated here (then nothing is freed). NULL accepted. */
int comm_mem_shared_free(void *p);
/* true when [p, p + bytes) lies inside one registered allocation; fills *ref. */
bool comm_mem_lookup(const void *p, size_t bytes, struct comm_mem_ref *ref);
/* How many registered allocations this process has freed so far: peers drop their cached mappings of
 * this process when it changes (a freed buffer must not stay mapped, and pinned, in every peer). */
uint64_t comm_mem_free_count(void);

#endif
