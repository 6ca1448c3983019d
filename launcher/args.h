/* fsdp-launch's configuration: torchrun's flags (both `_` and `-` spellings, `--flag value` and
 * `--flag=value`), accelerate launch's spellings of the same settings, each also read from PET_<NAME>, then
 * an accelerate config file (--config_file), then SLURM_* for what is still unset, then defaults.
 * Settings meant for fsdp-worker (accelerate's fsdp_* flags and fsdp_config keys, mixed_precision, ...)
 * are collected as `launch_setting`s, which the workers receive in FSDP_LAUNCH_CONFIG. */
#ifndef FSDP_LAUNCHER_ARGS_H
#define FSDP_LAUNCHER_ARGS_H

#include <stdbool.h>
#include <stdio.h>

#include "common/config.h"
#include "common/log.h"

#define LAUNCH_MAX_LOCAL 1024
/* --log_max_bytes below this is refused (a rotation every few lines helps nobody). */
#define LAUNCH_LOG_MIN_BYTES 4096
#define LAUNCH_OPT_MAX 64
#define LAUNCH_MAX_SIGNALS 16

/* How PROGRAM is started (torchrun's -m, --no_python, --run_path; otherwise by what PROGRAM is). */
enum launch_mode {
    LAUNCH_AUTO,      /* a .py file or a file that is not executable: PYTHON -u PROGRAM; else as is */
    LAUNCH_NO_PYTHON, /* --no_python: PROGRAM as is */
    LAUNCH_MODULE,    /* -m/--module: PYTHON -u -m PROGRAM */
    LAUNCH_RUN_PATH,  /* --run_path: runpy.run_path(PROGRAM) in PYTHON */
};

/* A setting of the worker handed down in FSDP_LAUNCH_CONFIG. */
struct launch_setting {
    bool over_file;                   /* false: under the INI file (YAML); true: over it (command line) */
    char key[96];                     /* "fsdp.version" */
    char value[CONFIG_MAX_VALUE + 1];
    char origin[256];                 /* "acc.yaml:4 (fsdp_config.fsdp_version)", "fsdp-launch --fsdp_version" */
};

/* Where each launch option's value came from, for --print-config. */
struct launch_origin {
    char text[256];   /* the value as given ("" = default) */
    char origin[256]; /* "command line", "PET_NNODES", "acc.yaml:7 (num_machines)", "SLURM_NODEID"; "" = default */
};

struct launch_args {
    int nnodes;
    int node_rank;
    int nproc_per_node;
    char master_addr[256];
    bool no_torch_store;  /* the store refuses PyTorch TCPStore clients */
    int master_port; /* 0 on node 0: pick a free port and print it */
    bool standalone;
    int max_restarts;
    double monitor_interval_s;
    char run_id[128];
    double rdzv_timeout_s;
    char log_dir[1024]; /* "" = no log files, output stays on the terminal */
    long long log_max_bytes; /* rotate each log file at this size (FILE.1 = the previous part); 0 = unbounded */
    int status_port;       /* --status_port: -1 = no status page, 0 = a free port */
    char status_addr[256]; /* --status_addr (default 127.0.0.1) */
    double status_stale_s; /* --status_stale_timeout */
    char redirects[256]; /* torchrun Std spec: "0".."3" or "LOCAL:MASK,..." */
    char tee[256];
    char local_ranks_filter[256]; /* "" = every local rank on the console */
    char prefix_template[256];    /* --log_line_prefix_template ("" = "[rank N]:") */
    char dup_filters[2][512];     /* --duplicate_{stdout,stderr}_filters: comma lists (",," is a comma) */
    char role[64];
    double shutdown_timeout_s;
    enum log_level log_level;
    double heartbeat_timeout_s; /* --rdzv_conf keep_alive_interval x keep_alive_max_attempt; 0 = the default */
    int rdzv_is_host;           /* --rdzv_conf is_host: 1/0, -1 = not given (checked against node_rank) */
    char local_addr[256];       /* --local_addr: this node's name in the store ("" = hostname); on node 0 the
                                 * store listens on it ("" = --master_addr) */
    int signals[LAUNCH_MAX_SIGNALS]; /* --signals_to_handle: forwarded to the workers, then the job stops */
    int n_signals;
    bool virtual_local_rank;    /* LOCAL_RANK=0 and one CUDA_VISIBLE_DEVICES entry per worker */
    char gpu_ids[256];          /* --gpu_ids: CUDA_VISIBLE_DEVICES of the workers ("" = inherited) */
    int omp_threads;            /* --num_cpu_threads_per_process; 0 = OMP_NUM_THREADS or cores / workers */

    enum launch_mode mode;
    char python[1024];   /* the interpreter: --python, else PYTHON_EXEC, else "python3" (looked up in PATH) */
    char **prog_argv;    /* points into argv; prog_argv[0] as the user gave it (NULL with --print-config alone) */
    int prog_argc;

    char config_file[1024]; /* --config_file ("" = none) */
    struct launch_setting *settings; /* for the workers (FSDP_LAUNCH_CONFIG), in order */
    int n_settings;
    char **ignored; /* "key (line N): why" for each accelerate key that means nothing here */
    int n_ignored;
    bool print_config;      /* --print-config[=json]: print the effective settings and exit */
    bool print_config_json;

    struct launch_origin origins[LAUNCH_OPT_MAX];
    char **slurm_hosts; /* node hosts from SLURM_JOB_NODELIST (messages only), NULL outside SLURM */
    int slurm_nhosts;
};

/* Fills *a from argv, the environment, the accelerate config and SLURM. Returns 0, 1 when --help was
 * printed, or a negative error with a message that names the flag (or file:line and key) and what it
 * accepts. */
int launch_args_parse(int argc, char **argv, struct launch_args *a);
void launch_args_free(struct launch_args *a);

/* --print-config: every launch setting with its value and where it came from, the worker settings and the
 * ignored accelerate keys; as `name = value  # origin` lines, or one JSON object. */
int launch_args_print(const struct launch_args *a, FILE *f, bool json);
/* FSDP_LAUNCH_CONFIG's text for a->settings (malloc'd), or NULL when there are none. */
char *launch_args_settings_json(const struct launch_args *a);

/* Std masks of torchrun: 1 = stdout, 2 = stderr, 3 = both; a spec is "N" or "LOCAL:N,LOCAL:N". */
int launch_std_mask(const char *spec, int local_rank);
/* Does --local_ranks_filter let this local rank's output onto the console? */
bool launch_rank_shown(const struct launch_args *a, int local_rank);
void launch_args_usage(FILE *f);

#endif
