/* A store server in a child process. Not a thread of the test: tests fork ranks, and a fork taken while a
 * server thread holds an allocator lock (ASan's allocator has no fork handlers) leaves that lock held
 * forever in the child. */
#ifndef FSDP_TESTS_UTIL_TU_STORE_H
#define FSDP_TESTS_UTIL_TU_STORE_H

#include <sys/types.h>

/* Forks a process serving a store for run_id on bind_addr (NULL: all interfaces), first entering network
 * namespace netns when not NULL, and returns the port it bound; -1 when it did not start (its reason on
 * stderr). *pid is the process, which ends with the caller's process or at tu_store_reap; -1 when it did
 * not start. */
int tu_store_spawn(const char *bind_addr, const char *run_id, const char *netns, pid_t *pid);
void tu_store_reap(pid_t pid);

#endif
