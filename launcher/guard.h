/* The guard: a small process forked by fsdp-launch at start, in its own session, that kills what is left
 * of the workers' process groups when the launcher dies, however it dies (SIGKILL included). A worker's
 * parent-death signal reaches only the worker itself; a wrapper script's children (a program run without
 * exec) would otherwise keep running. The guard learns the groups over a pipe and notices the launcher's
 * death as the pipe's end of file. */
#ifndef FSDP_LAUNCHER_GUARD_H
#define FSDP_LAUNCHER_GUARD_H

#include <sys/types.h>

/* Forks the guard. Call before any thread exists. A failure is reported (and the launcher runs without a
 * guard: only the workers' parent-death signals remain). */
int guard_start(void);
/* The process group of a new worker: killed (SIGKILL) if the launcher dies before guard_forget. */
void guard_watch(pid_t pgid);
/* The group was killed and reaped by the launcher itself. */
void guard_forget(pid_t pgid);

#endif
