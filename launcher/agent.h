/* The launcher's supervision loop for one node: join a generation, run the workers, watch them, the
 * signals and the store, tear down on any failure anywhere, restart while restarts are left. */
#ifndef FSDP_LAUNCHER_AGENT_H
#define FSDP_LAUNCHER_AGENT_H

#include "launcher/args.h"
#include "launcher/status_server.h"
#include "rendezvous/rendezvous.h"

struct agent {
    const struct launch_args *a;
    struct rdzv *r;
    int sigfd;            /* signalfd for SIGCHLD and the forwarded signals */
    const char *host;
    const char *program;  /* resolved path */
    char *const *argv;    /* the program's argv (launcher/command.h) */
    const char *launch_config; /* FSDP_LAUNCH_CONFIG for the workers, NULL = none */
    const char *secret;   /* FSDP_RDZV_TOKEN given to workers, NULL = none */
    const char *omp_threads;
    int pending_signal;   /* a terminating signal received, 0 if none */
    struct status_server *status; /* --status_port on node 0, else NULL */
    double heartbeat_timeout_s;   /* a rank (as a node) silent this long is declared stopped */
};

/* Runs the job to the end; returns the launcher's exit code. */
int agent_run(struct agent *ag);

#endif
