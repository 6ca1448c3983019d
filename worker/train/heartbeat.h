/* The rank's heartbeat to its fsdp-launch: a thread writes one byte ('b') every HEARTBEAT_INTERVAL_S to the
 * pipe the launcher passed in FSDP_HEARTBEAT_FD, and exit() writes 'e' (the rank ended: no more beats). It
 * beats while the process is scheduled, whatever its main thread waits on, so a rank whose beats stop while
 * its process lives is stopped (SIGSTOP), frozen or starved, not merely waiting on a peer: the launcher
 * names it (docs/launcher.md, "Ranks' heartbeats"). */
#ifndef FSDP_WORKER_TRAIN_HEARTBEAT_H
#define FSDP_WORKER_TRAIN_HEARTBEAT_H

#define HEARTBEAT_INTERVAL_S 0.5

/* Starts the thread when FSDP_HEARTBEAT_FD names an open descriptor; otherwise (not under fsdp-launch, or a
 * value not allowed: one warning) does nothing. The descriptor is kept from the programs this one starts. */
void heartbeat_start(void);

#endif
