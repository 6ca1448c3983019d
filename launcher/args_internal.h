/* What fsdp-launch's options are (launcher/args_opts.c): their ids, spellings and kinds, how a value is
 * applied, and the option table the parser (args.c) and the printer (args_print.c) share. Not for other
 * modules: they see args.h. */
#ifndef FSDP_LAUNCHER_ARGS_INTERNAL_H
#define FSDP_LAUNCHER_ARGS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "launcher/args.h"

enum opt_id {
    /* torchrun */
    O_NNODES, O_NPROC, O_RDZV_BACKEND, O_RDZV_ENDPOINT, O_RDZV_ID, O_RUN_ID, O_RDZV_CONF, O_STANDALONE,
    O_MAX_RESTARTS, O_MONITOR, O_START_METHOD, O_EVENT_LOG_HANDLER, O_ROLE, O_MODULE, O_NO_PYTHON, O_RUN_PATH,
    O_LOG_DIR, O_REDIRECTS, O_TEE, O_PREFIX_TEMPLATE, O_FILTER, O_DUP_STDOUT, O_DUP_STDERR, O_NODE_RANK,
    O_MASTER_ADDR, O_MASTER_PORT, O_LOCAL_ADDR, O_LOGS_SPECS, O_NUMA_BINDING, O_SIGNALS, O_SHUTDOWN,
    O_VIRTUAL_LOCAL_RANK, O_PRINT_COMPLETION,
    /* accelerate launch */
    O_CONFIG_FILE, O_NUM_PROCESSES, O_GPU_IDS, O_OMP_THREADS, O_MULTI_GPU, O_SAME_NETWORK,
    /* fsdp-launch's own */
    O_RDZV_TIMEOUT, O_STATUS_PORT, O_STATUS_ADDR, O_STATUS_STALE, O_LOG_LEVEL, O_LOG_MAX_BYTES, O_PYTHON,
    O_NO_TORCH_STORE, O_PRINT_CONFIG, O_HELP, O_COUNT
};

enum opt_kind { K_VALUE, K_BOOL, K_OPTIONAL /* --flag or --flag=value */ };

struct launch_opt {
    const char *name;       /* canonical, `_` spelling */
    const char *aliases[3]; /* other spellings of the same setting ("-r", accelerate's names) */
    enum opt_kind kind;
    const char *help;
};

extern const struct launch_opt launch_opts[O_COUNT];

/* Parses v for option id into a (src names the flag or variable in errors). *port_set notes that a port was
 * given; *num_processes receives accelerate's --num_processes. */
int launch_opt_apply(struct launch_args *a, int id, const char *v, const char *src, bool *port_set,
                     int *num_processes);
/* The option a long name (either spelling, or an alias) or a short letter means; -1 when none. */
int launch_opt_find(const char *name, size_t len);
int launch_opt_find_short(char c);
/* true/false, 1/0, yes/no, on/off (any case); "" is false. */
int launch_parse_bool(const char *s, const char *src, bool *out);
/* Copies what fits (texts shown to the user). */
void launch_set_text(char *dst, size_t cap, const char *src);

#endif
