/* fsdp-launch's configuration: torchrun's flags (both `_` and `-` spellings, `--flag value` and
 * `--flag=value`), each also read from PET_<NAME>, then SLURM_* for what is still unset, then defaults. */
#ifndef FSDP_LAUNCHER_ARGS_H
#define FSDP_LAUNCHER_ARGS_H

#include <stdbool.h>
#include <stdio.h>

#include "common/log.h"

#define LAUNCH_MAX_LOCAL 1024

struct launch_args {
    int nnodes;
    int node_rank;
    int nproc_per_node;
    char master_addr[256];
    char local_addr[256]; /* "" = --master_addr: where node 0's store listens */
    bool no_torch_store;  /* the store refuses PyTorch TCPStore clients */
    int master_port; /* 0 on node 0: pick a free port and print it */
    bool standalone;
    int max_restarts;
    double monitor_interval_s;
    char run_id[128];
    double rdzv_timeout_s;
    char log_dir[1024]; /* "" = no log files, output stays on the terminal */
    char redirects[256]; /* torchrun Std spec: "0".."3" or "LOCAL:MASK,..." */
    char tee[256];
    char local_ranks_filter[256]; /* "" = every local rank on the console */
    char role[64];
    double shutdown_timeout_s;
    enum log_level log_level;
    char **prog_argv; /* points into argv; prog_argv[0] as the user gave it */
    int prog_argc;
    char **slurm_hosts; /* node hosts from SLURM_JOB_NODELIST (messages only), NULL outside SLURM */
    int slurm_nhosts;
};

/* Fills *a from argv, the environment and SLURM. Returns 0, 1 when --help was printed, or a negative
 * error with a message that names the flag and what it accepts. */
int launch_args_parse(int argc, char **argv, struct launch_args *a);
void launch_args_free(struct launch_args *a);

/* Std masks of torchrun: 1 = stdout, 2 = stderr, 3 = both; a spec is "N" or "LOCAL:N,LOCAL:N". */
int launch_std_mask(const char *spec, int local_rank);
/* Does --local_ranks_filter let this local rank's output onto the console? */
bool launch_rank_shown(const struct launch_args *a, int local_rank);

void launch_args_usage(FILE *f);

#endif
