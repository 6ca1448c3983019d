/* The launcher's console (its stdout and stderr): lines are queued and written by one thread per stream,
 * so supervision (reaping, signals, heartbeats) never waits on a terminal or pipe that stopped reading.
 * Each queue is bounded; a line that does not fit is dropped and counted, and a notice says how many were
 * dropped once the console reads again. The per-rank log files (--log_dir) are written directly and keep
 * every line. */
#ifndef FSDP_LAUNCHER_CONSOLE_H
#define FSDP_LAUNCHER_CONSOLE_H

#include <stddef.h>

#define CONSOLE_QUEUE_BYTES (1u << 20)

/* Starts the two writer threads and routes the launcher's own log lines through the stderr queue. Until
 * then (and when it fails) console_write writes directly. */
int console_start(void);
/* Queues n bytes (whole lines) for fd 1 or 2; never blocks on the console. */
void console_write(int fd, const char *p, size_t n);
/* Lets the writers finish what is queued while they make progress (at most timeout_s without any), then
 * stops them; what is still queued is dropped. */
void console_stop(double timeout_s);

#endif
