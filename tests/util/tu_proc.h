/* Processes, time and ports for the tests and benchmarks. No Criterion here: the benchmarks link it too,
 * and a failure is a return value the caller asserts on. */
#ifndef FSDP_TESTS_UTIL_TU_PROC_H
#define FSDP_TESTS_UTIL_TU_PROC_H

#include <sys/types.h>

/* Seconds on the monotonic clock. */
double tu_now(void);
void tu_nap(double seconds);

/* Starts argv (argv[0] is a path) with stdout to the file out and stderr to the file err (the same path:
 * one file with both), after applying env_set: "NAME=value" sets, "NAME=" unsets (NULL: none). Returns the
 * child's pid or -1. */
pid_t tu_spawn(const char *const *argv, const char *out, const char *err, const char *const *env_set);
/* tu_spawn, then waits: the exit code, 128 + the signal that ended it, or -1 when it did not start. */
int tu_run(const char *const *argv, const char *out, const char *err, const char *const *env_set);

/* Runs `/bin/sh -c cmd` with its output discarded; its exit code, or -1 when it did not exit. */
int tu_sh(const char *cmd);

/* A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released), or -1. For a
 * program that takes a port number and cannot bind 0 itself. */
int tu_free_port(void);

#endif
