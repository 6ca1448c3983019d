/* The workers of one node for one generation: spawn with torchrun's environment, reap, signal, and
 * kill on teardown. Every worker leads its own process group (so a signal reaches what it spawned) and
 * has a parent-death signal, so none outlives the launcher even when the launcher is SIGKILLed. */
#ifndef FSDP_LAUNCHER_WORKERS_H
#define FSDP_LAUNCHER_WORKERS_H

#include <stdbool.h>
#include <sys/types.h>

#include "launcher/args.h"
#include "launcher/output.h"
#include "rendezvous/rendezvous.h"

struct worker {
    int local_rank, rank;
    pid_t pid;
    bool running;
    int status;         /* waitpid status once exited */
    double exit_wall_s; /* time of the exit (epoch seconds), for the summary */
    struct out_stream out, err;
    /* The rank's heartbeat pipe (FSDP_HEARTBEAT_FD; fsdp-worker beats, other programs do not): -1 once
     * closed. Watched only once the first beat came, so a program that never beats is never suspected. */
    int hb_fd;
    bool beating;
    double last_beat_s;  /* clock_now_s() of the last beat */
    double hb_silent_s;  /* > 0 once the launcher declared its heartbeat stopped: silent this long */
};

struct worker_group {
    struct worker *w;
    int n;
    int running;
    int filtered_fd[2];  /* --duplicate_{stdout,stderr}_filters' files of this attempt, -1 = none */
    char **filters[2];   /* their needles, NULL-terminated */
};

struct spawn_env {
    const char *program;    /* resolved path */
    char *const *argv;      /* what the program gets (launcher/command.h) */
    const char *launch_config; /* FSDP_LAUNCH_CONFIG for the workers, NULL = none */
    const char *host;       /* this node's name */
    int master_port;        /* the store's actual port */
    const char *secret;     /* FSDP_RDZV_TOKEN for the workers, NULL = none */
    const char *omp_threads; /* NULL: leave OMP_NUM_THREADS as it is */
    int restart_count;
};

/* Creates log directories/files when --log_dir is set, forks and execs nproc workers. On error the
 * workers already started are killed. */
int workers_spawn(struct worker_group *g, const struct launch_args *a, const struct rdzv_assignment *as,
                  const struct spawn_env *env);
/* Reaps every exited worker (waitpid loop, WNOHANG). Returns the number reaped; *first_failed is
 * set to the index of the first worker seen failing (-1 if none). */
int workers_reap(struct worker_group *g, int *first_failed);
/* Sends sig to every running worker's process group. */
void workers_signal(struct worker_group *g, int sig);
/* Kills what is left in every worker's process group and frees the group (pipes drained first). */
void workers_release(struct worker_group *g);

/* Reads what the rank's heartbeat pipe holds: a beat (now) or its end (the fd closed). */
void workers_pump_heartbeat(struct worker *w, double now);
/* The running rank that beat before and has been silent longest, when that is over limit_s; -1 if none. */
int workers_silent(const struct worker_group *g, double now, double limit_s);
/* What the kernel says the process is doing, for a rank that stopped beating: "stopped by a signal
 * (SIGSTOP or SIGTSTP)", "in uninterruptible sleep (D)", ... */
void workers_describe_proc_state(pid_t pid, char *buf, size_t cap);

/* "exit code 3" or "signal 9 (SIGKILL)" */
void workers_describe_status(int status, char *buf, size_t cap);
/* 0 for success, else the exit code or 128 + signal. */
int workers_exit_code(int status);

#endif
