#include "launcher/args.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "launcher/accel_config.h"
#include "launcher/devices.h"
#include "launcher/slurm.h"
#include "launcher/yaml_flat.h"
#include "worker/config/worker_config.h"

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
    O_RDZV_TIMEOUT, O_LOG_LEVEL, O_PYTHON, O_PRINT_CONFIG, O_HELP, O_COUNT
};

enum opt_kind { K_VALUE, K_BOOL, K_OPTIONAL /* --flag or --flag=value */ };

struct opt {
    const char *name;       /* canonical, `_` spelling */
    const char *aliases[3]; /* other spellings of the same setting ("-r", accelerate's names) */
    enum opt_kind kind;
    const char *help;
};

static const struct opt opts[O_COUNT] = {
    [O_NNODES] = {"nnodes", {"num_machines"}, K_VALUE, "number of nodes: N (or N:N; elastic MIN:MAX is refused)"},
    [O_NPROC] = {"nproc_per_node", {0}, K_VALUE, "workers per node: N, auto, cpu or gpu"},
    [O_RDZV_BACKEND] = {"rdzv_backend", {0}, K_VALUE, "static or c10d: both are fsdp-launch's store on node 0"},
    [O_RDZV_ENDPOINT] = {"rdzv_endpoint", {0}, K_VALUE, "HOST[:PORT] of node 0: the same as --master_addr/--master_port"},
    [O_RDZV_ID] = {"rdzv_id", {0}, K_VALUE, "job id shared by all nodes (TORCHELASTIC_RUN_ID)"},
    [O_RUN_ID] = {"run_id", {0}, K_VALUE, "same as --rdzv_id"},
    [O_RDZV_CONF] = {"rdzv_conf", {0}, K_VALUE, "K=V,...: join_timeout, timeout, keep_alive_interval, "
                                                "keep_alive_max_attempt, is_host, ... (docs/launcher.md)"},
    [O_STANDALONE] = {"standalone", {0}, K_BOOL, "one node, store on a free local port (printed)"},
    [O_MAX_RESTARTS] = {"max_restarts", {0}, K_VALUE, "restarts of the whole job after a failure (default 0)"},
    [O_MONITOR] = {"monitor_interval", {0}, K_VALUE, "seconds between store checks (default 0.1)"},
    [O_START_METHOD] = {"start_method", {0}, K_VALUE, "spawn, fork or forkserver: workers are always new processes"},
    [O_EVENT_LOG_HANDLER] = {"event_log_handler", {0}, K_VALUE, "null (the only handler; events are log lines)"},
    [O_ROLE] = {"role", {0}, K_VALUE, "ROLE_NAME for the workers (default 'default')"},
    [O_MODULE] = {"module", {"m"}, K_BOOL, "run PROGRAM as a Python module: PYTHON -u -m PROGRAM"},
    [O_NO_PYTHON] = {"no_python", {0}, K_BOOL, "run PROGRAM as is, never through Python"},
    [O_RUN_PATH] = {"run_path", {0}, K_BOOL, "run the script with runpy.run_path in PYTHON"},
    [O_LOG_DIR] = {"log_dir", {0}, K_VALUE, "write <dir>/<run_id>/attempt_<n>/<local_rank>/{stdout,stderr}.log"},
    [O_REDIRECTS] = {"redirects", {"r"}, K_VALUE, "streams sent only to log files: 0 none, 1 out, 2 err, 3 both, or L:N,..."},
    [O_TEE] = {"tee", {"t"}, K_VALUE, "streams also echoed with a prefix: same syntax as --redirects"},
    [O_PREFIX_TEMPLATE] = {"log_line_prefix_template", {0}, K_VALUE,
                           "prefix of --tee lines: ${role_name} ${local_rank} ${rank} ${hostname}"},
    [O_FILTER] = {"local_ranks_filter", {0}, K_VALUE, "comma list of local ranks whose output reaches the console"},
    [O_DUP_STDOUT] = {"duplicate_stdout_filters", {0}, K_VALUE,
                      "with --log_dir: --tee stdout lines containing any of these (comma list) also go to "
                      "filtered_stdout.log"},
    [O_DUP_STDERR] = {"duplicate_stderr_filters", {0}, K_VALUE, "the same for stderr (filtered_stderr.log)"},
    [O_NODE_RANK] = {"node_rank", {"machine_rank"}, K_VALUE, "this node's rank, 0..nnodes-1 (node 0 hosts the store)"},
    [O_MASTER_ADDR] = {"master_addr", {"main_process_ip"}, K_VALUE, "address of node 0 (default 127.0.0.1)"},
    [O_MASTER_PORT] = {"master_port", {"main_process_port"}, K_VALUE,
                       "store port on node 0 (one node: a free port, printed; several: 29500)"},
    [O_LOCAL_ADDR] = {"local_addr", {0}, K_VALUE, "this node's name in the store and in messages (default hostname)"},
    [O_LOGS_SPECS] = {"logs_specs", {0}, K_VALUE, "refused: a Python entry point fsdp-launch cannot load"},
    [O_NUMA_BINDING] = {"numa_binding", {0}, K_VALUE, "refused: bind inside the program (numactl, OMP_PLACES)"},
    [O_SIGNALS] = {"signals_to_handle", {0}, K_VALUE,
                   "signals forwarded to the workers before the job stops (default SIGTERM,SIGINT,SIGHUP,SIGQUIT)"},
    [O_SHUTDOWN] = {"shutdown_timeout", {0}, K_VALUE, "seconds between SIGTERM and SIGKILL at teardown (default 30)"},
    [O_VIRTUAL_LOCAL_RANK] = {"virtual_local_rank", {0}, K_BOOL,
                              "LOCAL_RANK=0 for every worker, each seeing only its GPU in CUDA_VISIBLE_DEVICES"},
    [O_PRINT_COMPLETION] = {"print_completion", {0}, K_VALUE, "refused: no completion scripts"},
    [O_CONFIG_FILE] = {"config_file", {0}, K_VALUE, "accelerate config (YAML or JSON): launch keys and fsdp_config"},
    [O_NUM_PROCESSES] = {"num_processes", {0}, K_VALUE, "workers of the whole job (accelerate): nproc_per_node x nnodes"},
    [O_GPU_IDS] = {"gpu_ids", {0}, K_VALUE, "CUDA_VISIBLE_DEVICES of the workers (accelerate; 'all' = unchanged)"},
    [O_OMP_THREADS] = {"num_cpu_threads_per_process", {0}, K_VALUE, "OMP_NUM_THREADS of the workers (accelerate)"},
    [O_MULTI_GPU] = {"multi_gpu", {0}, K_BOOL, "accepted (accelerate): several workers are several processes anyway"},
    [O_SAME_NETWORK] = {"same_network", {0}, K_BOOL, "accepted (accelerate): no effect"},
    [O_RDZV_TIMEOUT] = {"rdzv_timeout", {0}, K_VALUE, "seconds to wait for the store and for all nodes (default 900)"},
    [O_LOG_LEVEL] = {"log_level", {0}, K_VALUE, "debug, info, warn, error or off (default info)"},
    [O_PYTHON] = {"python", {0}, K_VALUE, "interpreter of Python scripts (default PYTHON_EXEC, else python3 in PATH)"},
    [O_PRINT_CONFIG] = {"print_config", {0}, K_OPTIONAL,
                        "print every setting and where it came from (=json: as JSON) and exit"},
    [O_HELP] = {"help", {"h"}, K_BOOL, "this text"},
};

void launch_args_usage(FILE *f)
{
    fprintf(f, "usage: fsdp-launch [FLAGS] [--] PROGRAM [ARGS...]\n"
               "       fsdp-launch config [--config_file PATH] [--ini PATH]   (questions, then an accelerate YAML)\n"
               "Starts nproc_per_node copies of PROGRAM on this node with torchrun's environment. A .py PROGRAM\n"
               "(or one that is not executable) runs as PYTHON -u PROGRAM, as under torchrun.\n"
               "Flags (also --flag-name spelling, --flag=value, and PET_<FLAG_NAME> variables):\n");
    for (int i = 0; i < O_COUNT; i++) {
        char names[96];
        int n = snprintf(names, sizeof names, "--%s", opts[i].name);
        for (int k = 0; k < 3 && opts[i].aliases[k]; k++)
            n += snprintf(names + n, sizeof names - (size_t)n, ", %s%s", strlen(opts[i].aliases[k]) == 1 ? "-" : "--",
                          opts[i].aliases[k]);
        fprintf(f, "  %-34s %s\n", names, opts[i].help);
    }
    fprintf(f, "  %-34s %s\n", "--use_fsdp, --fsdp_enable, --fsdp_*", "fsdp-worker settings (accelerate's flags)");
    fprintf(f, "  %-34s %s\n", "--mixed_precision, --cpu", "fsdp-worker settings (fsdp.mixed_precision, train.device)");
}

/* ---- values --------------------------------------------------------------------------------------- */

static int parse_int(const char *s, const char *src, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return error_set(FSDP_EINVAL, "%s: '%s' is not an integer in [%ld, %ld]", src, s, lo, hi);
    *out = (int)v;
    return 0;
}

static int parse_double(const char *s, const char *src, double lo, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < lo)
        return error_set(FSDP_EINVAL, "%s: '%s' is not a number >= %g", src, s, lo);
    *out = v;
    return 0;
}

static int copy_str(char *dst, size_t cap, const char *s, const char *src)
{
    if (strlen(s) >= cap)
        return error_set(FSDP_EINVAL, "%s: value longer than %zu characters", src, cap - 1);
    strcpy(dst, s);
    return 0;
}

static int parse_bool(const char *s, const char *src, bool *out)
{
    if (!strcasecmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on"))
        *out = true;
    else if (!strcasecmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off") ||
             !*s)
        *out = false;
    else
        return error_set(FSDP_EINVAL, "%s: '%s' is not a boolean (true/false)", src, s);
    return 0;
}

static int parse_nproc(const char *s, const char *src, int *out)
{
    if (strcmp(s, "cpu") == 0) {
        *out = devices_count_cpus();
        return 0;
    }
    if (strcmp(s, "gpu") == 0) {
        *out = devices_count_gpus();
        if (*out == 0)
            return error_set(FSDP_EINVAL, "%s: 'gpu' asked for one worker per GPU, but this node shows no GPU "
                             "(no /dev/nvidiaN, or CUDA_VISIBLE_DEVICES empty); use a number or 'cpu'", src);
        return 0;
    }
    if (strcmp(s, "auto") == 0) {
        int g = devices_count_gpus();
        *out = g > 0 ? g : devices_count_cpus();
        return 0;
    }
    if (strcmp(s, "xpu") == 0)
        return error_set(FSDP_EUNSUPPORTED, "%s: 'xpu': fsdpc has no Intel XPU backend; use a number, auto, cpu or gpu",
                         src);
    int rc = parse_int(s, src, 1, LAUNCH_MAX_LOCAL, out);
    if (rc)
        return error_set(FSDP_EINVAL, "%s: '%s' is not a positive number of workers (1..%d), 'auto', 'cpu' or 'gpu'",
                         src, s, LAUNCH_MAX_LOCAL);
    return 0;
}

/* Validates a torchrun Std spec; launch_std_mask relies on it being well formed. */
static int check_std(const char *s, const char *src)
{
    if (strlen(s) == 1 && s[0] >= '0' && s[0] <= '3')
        return 0;
    const char *p = s;
    while (*p) {
        char *end;
        long l = strtol(p, &end, 10);
        if (end == p || *end != ':' || l < 0 || end[1] < '0' || end[1] > '3' || (end[2] && end[2] != ','))
            return error_set(FSDP_EINVAL, "%s: '%s' is not 0, 1, 2, 3 or a LOCAL_RANK:N list like '0:3,1:2'", src,
                             s);
        p = end[2] ? end + 3 : end + 2;
    }
    return 0;
}

int launch_std_mask(const char *spec, int local_rank)
{
    if (!spec[0])
        return 0;
    if (!spec[1])
        return spec[0] - '0';
    for (const char *p = spec; *p;) {
        char *end;
        long l = strtol(p, &end, 10);
        if (l == local_rank)
            return end[1] - '0';
        p = end[2] ? end + 3 : end + 2;
    }
    return 0;
}

bool launch_rank_shown(const struct launch_args *a, int local_rank)
{
    if (!a->local_ranks_filter[0])
        return true;
    for (const char *p = a->local_ranks_filter; *p;) {
        char *end;
        long l = strtol(p, &end, 10);
        if (l == local_rank)
            return true;
        p = *end ? end + 1 : end;
    }
    return false;
}

static int check_filter(const char *s, const char *src)
{
    for (const char *p = s; *p;) {
        char *end;
        long l = strtol(p, &end, 10);
        if (end == p || l < 0 || (*end && *end != ','))
            return error_set(FSDP_EINVAL, "%s: '%s' is not a comma list of local ranks like '0,2'", src, s);
        p = *end ? end + 1 : end;
    }
    return 0;
}

static int parse_nnodes(const char *v, const char *src, int *out)
{
    /* torchrun's MIN:MAX is accepted when MIN == MAX: membership here is static, every node must join. */
    const char *colon = strchr(v, ':');
    if (!colon)
        return parse_int(v, src, 1, 1 << 20, out);
    char lo[32];
    if ((size_t)(colon - v) >= sizeof lo)
        return error_set(FSDP_EINVAL, "%s: '%s' is not N or MIN:MAX", src, v);
    snprintf(lo, sizeof lo, "%.*s", (int)(colon - v), v);
    int a1 = 0, a2 = 0;
    int rc = parse_int(lo, src, 1, 1 << 20, &a1);
    if (!rc)
        rc = parse_int(colon + 1, src, 1, 1 << 20, &a2);
    if (rc)
        return rc;
    if (a1 > a2)
        return error_set(FSDP_EINVAL, "%s: '%s': MIN must be at most MAX", src, v);
    if (a1 != a2)
        return error_set(FSDP_EUNSUPPORTED,
                         "%s: '%s' asks for elastic membership (between %d and %d nodes), which fsdp-launch does not "
                         "do: its rendezvous waits for a fixed number of nodes, each with its --node_rank. Give "
                         "--nnodes %d (or %d:%d)",
                         src, v, a1, a2, a2, a2, a2);
    *out = a1;
    return 0;
}

static int parse_endpoint(struct launch_args *a, const char *v, const char *src, bool *port_set)
{
    /* HOST:PORT, HOST, or [V6]:PORT; a bare IPv6 address has several colons and no port. */
    const char *colon = strrchr(v, ':');
    const char *rb = strrchr(v, ']');
    bool has_port = colon && (v[0] == '[' ? rb && colon == rb + 1 : strchr(v, ':') == colon);
    char host[256];
    size_t hlen = has_port ? (size_t)(colon - v) : strlen(v);
    const char *h = v;
    if (v[0] == '[' && rb) {
        h = v + 1;
        hlen = (size_t)(rb - v) - 1;
    }
    if (hlen == 0 || hlen >= sizeof host)
        return error_set(FSDP_EINVAL, "%s: '%s' is not HOST[:PORT]", src, v);
    snprintf(host, sizeof host, "%.*s", (int)hlen, h);
    int rc = copy_str(a->master_addr, sizeof a->master_addr, host, src);
    if (!rc && has_port) {
        rc = parse_int(colon + 1, src, 0, 65535, &a->master_port);
        *port_set = true;
    }
    return rc;
}

/* torchrun's --rdzv_conf: what a static rendezvous can honour is applied, the rest is named. */
static int parse_rdzv_conf(struct launch_args *a, const char *v, const char *src)
{
    char buf[1024];
    if (copy_str(buf, sizeof buf, v, src))
        return FSDP_EINVAL;
    double keep_interval = 5, keep_attempts = 3;
    bool keep = false;
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq || eq == kv)
            return error_set(FSDP_EINVAL, "%s: '%s' is not KEY=VALUE", src, kv);
        *eq = 0;
        const char *k = kv, *val = eq + 1;
        char what[160];
        snprintf(what, sizeof what, "%s %s", src, k);
        int rc = 0;
        if (!strcmp(k, "join_timeout") || !strcmp(k, "timeout")) {
            rc = parse_double(val, what, 0.001, &a->rdzv_timeout_s);
        } else if (!strcmp(k, "keep_alive_interval")) {
            rc = parse_double(val, what, 0.001, &keep_interval);
            keep = true;
        } else if (!strcmp(k, "keep_alive_max_attempt")) {
            rc = parse_double(val, what, 1, &keep_attempts);
            keep = true;
        } else if (!strcmp(k, "is_host")) {
            bool host;
            rc = parse_bool(val, what, &host);
            a->rdzv_is_host = host;
        } else if (!strcmp(k, "rank")) {
            rc = parse_int(val, what, 0, 1 << 20, &a->node_rank);
        } else if (!strcmp(k, "last_call_timeout") || !strcmp(k, "close_timeout") || !strcmp(k, "read_timeout") ||
                   !strcmp(k, "use_libuv")) {
            double ignored;
            bool b;
            rc = !strcmp(k, "use_libuv") ? parse_bool(val, what, &b) : parse_double(val, what, 0, &ignored);
        } else {
            rc = error_set(FSDP_EINVAL,
                           "%s: unknown key '%s'; fsdp-launch reads join_timeout, timeout, keep_alive_interval, "
                           "keep_alive_max_attempt, is_host, rank, and accepts last_call_timeout, close_timeout, "
                           "read_timeout, use_libuv (no effect with a static membership)",
                           src, k);
        }
        if (rc)
            return rc;
    }
    if (keep)
        a->heartbeat_timeout_s = keep_interval * keep_attempts;
    return 0;
}

static int parse_signals(struct launch_args *a, const char *v, const char *src)
{
    char buf[512];
    if (copy_str(buf, sizeof buf, v, src))
        return FSDP_EINVAL;
    a->n_signals = 0;
    char *save = NULL;
    for (char *s = strtok_r(buf, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*s))
            s++;
        const char *name = strncasecmp(s, "SIG", 3) == 0 ? s + 3 : s;
        int sig = 0;
        for (int i = 1; i < SIGRTMIN && !sig; i++)
            if (sigabbrev_np(i) && strcasecmp(sigabbrev_np(i), name) == 0)
                sig = i;
        if (!sig)
            return error_set(FSDP_EINVAL, "%s: '%s' is not a signal name (SIGTERM, SIGUSR1, ...)", src, s);
        if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD || sig == SIGPIPE)
            return error_set(FSDP_EINVAL, "%s: %s cannot be forwarded (it cannot be caught, or the launcher needs it)",
                             src, s);
        if (a->n_signals == LAUNCH_MAX_SIGNALS)
            return error_set(FSDP_EINVAL, "%s: more than %d signals", src, LAUNCH_MAX_SIGNALS);
        a->signals[a->n_signals++] = sig;
    }
    if (!a->n_signals)
        return error_set(FSDP_EINVAL, "%s: empty list of signals", src);
    return 0;
}

static int check_gpu_ids(const char *v, const char *src)
{
    for (const char *p = v; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != ',' && *p != '-')
            return error_set(FSDP_EINVAL, "%s: '%s' is not a comma list of GPU ids (or all)", src, v);
    return 0;
}

/* Template fields torchrun knows; anything else in ${...} is refused so a typo does not print literally. */
static int check_template(const char *v, const char *src)
{
    static const char *const fields[] = {"role_name", "local_rank", "rank", "hostname"};
    for (const char *p = strstr(v, "${"); p; p = strstr(p + 2, "${")) {
        const char *end = strchr(p, '}');
        bool ok = false;
        for (size_t i = 0; end && i < sizeof fields / sizeof fields[0]; i++)
            ok = ok || ((size_t)(end - p - 2) == strlen(fields[i]) && strncmp(p + 2, fields[i], strlen(fields[i])) == 0);
        if (!ok)
            return error_set(FSDP_EINVAL, "%s: '%s': only ${role_name}, ${local_rank}, ${rank} and ${hostname} are "
                             "replaced", src, v);
    }
    return 0;
}

static int apply(struct launch_args *a, int id, const char *v, const char *src, bool *port_set, int *num_processes)
{
    switch (id) {
    case O_NNODES: return parse_nnodes(v, src, &a->nnodes);
    case O_NODE_RANK: return parse_int(v, src, 0, 1 << 20, &a->node_rank);
    case O_NPROC: return parse_nproc(v, src, &a->nproc_per_node);
    case O_NUM_PROCESSES: return parse_int(v, src, 1, 1 << 24, num_processes);
    case O_MASTER_ADDR:
        if (!*v)
            return error_set(FSDP_EINVAL, "%s: empty address", src);
        return copy_str(a->master_addr, sizeof a->master_addr, v, src);
    case O_MASTER_PORT:
        *port_set = true;
        return parse_int(v, src, 0, 65535, &a->master_port);
    case O_STANDALONE: return parse_bool(v, src, &a->standalone);
    case O_MAX_RESTARTS: return parse_int(v, src, 0, 1000000, &a->max_restarts);
    case O_MONITOR: return parse_double(v, src, 0.001, &a->monitor_interval_s);
    case O_RDZV_ID:
    case O_RUN_ID:
        if (!*v || strchr(v, '/'))
            return error_set(FSDP_EINVAL, "%s: '%s' must be non-empty and without '/'", src, v);
        return copy_str(a->run_id, sizeof a->run_id, v, src);
    case O_RDZV_TIMEOUT: return parse_double(v, src, 0.001, &a->rdzv_timeout_s);
    case O_RDZV_CONF: return parse_rdzv_conf(a, v, src);
    case O_LOG_DIR: return copy_str(a->log_dir, sizeof a->log_dir, v, src);
    case O_REDIRECTS: return check_std(v, src) ? FSDP_EINVAL : copy_str(a->redirects, sizeof a->redirects, v, src);
    case O_TEE: return check_std(v, src) ? FSDP_EINVAL : copy_str(a->tee, sizeof a->tee, v, src);
    case O_PREFIX_TEMPLATE:
        FSDP_TRY(check_template(v, src));
        return copy_str(a->prefix_template, sizeof a->prefix_template, v, src);
    case O_DUP_STDOUT:
    case O_DUP_STDERR:
        if (!*v)
            return 0; /* torchrun's default: no filter */
        return error_set(FSDP_EUNSUPPORTED, "%s: duplicating filtered lines into filtered_std*.log is not supported; "
                         "filter the per-rank logs of --log_dir instead (grep)", src);
    case O_FILTER: return check_filter(v, src) ? FSDP_EINVAL
                                               : copy_str(a->local_ranks_filter, sizeof a->local_ranks_filter, v, src);
    case O_ROLE:
        if (!*v)
            return error_set(FSDP_EINVAL, "%s: empty role", src);
        return copy_str(a->role, sizeof a->role, v, src);
    case O_SHUTDOWN: return parse_double(v, src, 0, &a->shutdown_timeout_s);
    case O_LOG_LEVEL:
        if (log_parse_level(v, &a->log_level))
            return error_set(FSDP_EINVAL, "%s: '%s' is not debug, info, warn, error or off", src, v);
        return 0;
    case O_RDZV_ENDPOINT: return parse_endpoint(a, v, src, port_set);
    case O_RDZV_BACKEND:
        if (strcmp(v, "static") && strcmp(v, "c10d"))
            return error_set(FSDP_EUNSUPPORTED,
                             "%s: '%s' is not supported: fsdp-launch has one rendezvous, a store hosted by node 0 "
                             "(torchrun's static and c10d backends both map to it)",
                             src, v);
        return 0;
    case O_START_METHOD:
        if (strcmp(v, "spawn") && strcmp(v, "fork") && strcmp(v, "forkserver"))
            return error_set(FSDP_EINVAL, "%s: '%s' is not spawn, fork or forkserver", src, v);
        return 0;
    case O_EVENT_LOG_HANDLER:
        if (strcmp(v, "null") != 0)
            return error_set(FSDP_EUNSUPPORTED, "%s: '%s': torchrun's event handlers are Python logging handlers; "
                             "fsdp-launch's events are its log lines (--log_level debug shows them all)", src, v);
        return 0;
    case O_LOGS_SPECS:
        return error_set(FSDP_EUNSUPPORTED, "%s: '%s' names a Python entry point (torchrun.logs_specs), which "
                         "fsdp-launch cannot load; its log layout is --log_dir's (docs/launcher.md)", src, v);
    case O_NUMA_BINDING:
        return error_set(FSDP_EUNSUPPORTED, "%s: '%s': fsdp-launch does not bind workers to NUMA nodes; bind inside "
                         "the program (numactl, OMP_PLACES / OMP_PROC_BIND)", src, v);
    case O_PRINT_COMPLETION:
        return error_set(FSDP_EUNSUPPORTED, "%s: fsdp-launch ships no completion scripts; --help lists the flags",
                         src);
    case O_SIGNALS: return parse_signals(a, v, src);
    case O_VIRTUAL_LOCAL_RANK: return parse_bool(v, src, &a->virtual_local_rank);
    case O_LOCAL_ADDR:
        if (!*v)
            return error_set(FSDP_EINVAL, "%s: empty address", src);
        return copy_str(a->local_addr, sizeof a->local_addr, v, src);
    case O_MODULE:
    case O_NO_PYTHON:
    case O_RUN_PATH: {
        bool on;
        int rc = parse_bool(v, src, &on);
        if (rc || !on)
            return rc;
        enum launch_mode m = id == O_MODULE ? LAUNCH_MODULE : id == O_NO_PYTHON ? LAUNCH_NO_PYTHON : LAUNCH_RUN_PATH;
        /* torchrun: --run_path wins over --no_python; --no_python with --module is an error. */
        if ((m == LAUNCH_MODULE && a->mode == LAUNCH_NO_PYTHON) || (m == LAUNCH_NO_PYTHON && a->mode == LAUNCH_MODULE))
            return error_set(FSDP_EINVAL, "--no_python and --module cannot be used together (a module needs Python)");
        if (a->mode != LAUNCH_RUN_PATH)
            a->mode = m;
        return 0;
    }
    case O_PYTHON:
        if (!*v)
            return error_set(FSDP_EINVAL, "%s: empty interpreter", src);
        return copy_str(a->python, sizeof a->python, v, src);
    case O_CONFIG_FILE: return copy_str(a->config_file, sizeof a->config_file, v, src);
    case O_GPU_IDS:
        if (!strcasecmp(v, "all"))
            return 0;
        return check_gpu_ids(v, src) ? FSDP_EINVAL : copy_str(a->gpu_ids, sizeof a->gpu_ids, v, src);
    case O_OMP_THREADS: return parse_int(v, src, 1, 1 << 20, &a->omp_threads);
    case O_PRINT_CONFIG:
        if (!strcmp(v, "true") || !*v) {
            a->print_config = true;
        } else if (!strcasecmp(v, "json")) {
            a->print_config = a->print_config_json = true;
        } else {
            return error_set(FSDP_EINVAL, "%s: '%s': the formats are --print-config (text) and --print-config=json",
                             src, v);
        }
        return 0;
    default: return 0; /* accepted, no effect (O_MULTI_GPU, O_SAME_NETWORK) */
    }
}

static int find_opt(const char *name, size_t len)
{
    char norm[64];
    if (len >= sizeof norm)
        return -1;
    for (size_t i = 0; i < len; i++)
        norm[i] = name[i] == '-' ? '_' : name[i];
    norm[len] = 0;
    for (int i = 0; i < O_COUNT; i++) {
        if (strcmp(opts[i].name, norm) == 0)
            return i;
        for (int k = 0; k < 3 && opts[i].aliases[k]; k++)
            if (strlen(opts[i].aliases[k]) > 1 && strcmp(opts[i].aliases[k], norm) == 0)
                return i;
    }
    return -1;
}

static int find_short(char c)
{
    for (int i = 0; i < O_COUNT; i++)
        for (int k = 0; k < 3 && opts[i].aliases[k]; k++)
            if (opts[i].aliases[k][0] == c && !opts[i].aliases[k][1])
                return i;
    return -1;
}

static void random_hex(char *out, size_t nbytes)
{
    unsigned char buf[32];
    size_t n = nbytes > sizeof buf ? sizeof buf : nbytes;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, buf, n) : -1;
    if (fd >= 0)
        close(fd);
    if (got != (ssize_t)n) /* no urandom: time and pid still make a run id unlikely to repeat */
        for (size_t i = 0; i < n; i++)
            buf[i] = (unsigned char)((getpid() * 2654435761u + (unsigned)time(NULL) * 40503u) >> (i % 24));
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", buf[i]);
}

/* ---- state of one parse ---------------------------------------------------------------------------- */

struct parse_state {
    bool set[O_COUNT];
    bool port_set;
    int num_processes; /* accelerate's total; 0 = not given */
};

/* Copies what fits (texts shown to the user; the values themselves were checked by apply). */
static void set_text(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = 0;
}

static void note(struct launch_args *a, int id, const char *value, const char *origin)
{
    set_text(a->origins[id].text, sizeof a->origins[id].text, value);
    set_text(a->origins[id].origin, sizeof a->origins[id].origin, origin);
}

static int apply_noted(struct launch_args *a, struct parse_state *ps, int id, const char *v, const char *src,
                       const char *origin)
{
    FSDP_TRY(apply(a, id, v, src, &ps->port_set, &ps->num_processes));
    ps->set[id] = true;
    note(a, id, v, origin);
    return 0;
}

static int add_setting(struct launch_args *a, bool over_file, const char *key, const char *value, const char *origin)
{
    struct launch_setting *s = realloc(a->settings, (size_t)(a->n_settings + 1) * sizeof *s);
    if (!s)
        return error_set(FSDP_ENOMEM, "out of memory");
    a->settings = s;
    s = &a->settings[a->n_settings++];
    memset(s, 0, sizeof *s);
    s->over_file = over_file;
    set_text(s->key, sizeof s->key, key);
    set_text(s->value, sizeof s->value, value);
    set_text(s->origin, sizeof s->origin, origin);
    return 0;
}

/* accelerate launch's flags for the worker: --use_fsdp/--fsdp_enable, --fsdp_*, --mixed_precision, --cpu.
 * Returns 1 when arg is not one of them. */
static int worker_flag(struct launch_args *a, int argc, char **argv, int *i)
{
    const char *arg = argv[*i];
    const char *name = arg + 2;
    size_t len = strcspn(name, "=");
    char norm[128];
    if (len >= sizeof norm)
        return 1;
    for (size_t k = 0; k < len; k++)
        norm[k] = name[k] == '-' ? '_' : (char)tolower((unsigned char)name[k]);
    norm[len] = 0;
    if (strcmp(norm, "cpu") == 0) {
        if (name[len] == '=') {
            bool on;
            if (parse_bool(name + len + 1, "--cpu", &on))
                return FSDP_EINVAL;
            if (!on)
                return 0;
        }
        return add_setting(a, true, "train.device", "cpu", "fsdp-launch --cpu");
    }
    if (strncmp(norm, "fsdp_", 5) != 0 && strcmp(norm, "use_fsdp") != 0 && strcmp(norm, "mixed_precision") != 0)
        return 1;
    const struct config_schema *schema = worker_config_schema();
    int k = config_find_key(schema, norm);
    if (k < 0 || strchr(norm, '.')) {
        char near[300];
        const char *s = config_suggest_key(schema, norm, near, sizeof near);
        return error_set(FSDP_EINVAL, "unknown flag '--%s'%s%s%s (fsdp-launch --help lists the flags; fsdp-worker "
                         "--help-config the worker settings)", norm, s ? "; did you mean '--" : "", s ? s : "",
                         s ? "'?" : "");
    }
    const struct config_key *key = &schema->keys[k];
    const char *value = name[len] == '=' ? name + len + 1 : NULL;
    if (!value && *i + 1 < argc && strncmp(argv[*i + 1], "-", 1) != 0) {
        /* The next argument is this flag's value unless the flag means something alone and the argument is
         * not one of its values (then it is the program). */
        struct config_value probe;
        bool fits = config_value_parse(key, argv[*i + 1], &probe) == 0;
        if (fits)
            free(probe.text);
        if (!key->bare || fits)
            value = argv[++*i];
    }
    if (!value)
        value = key->bare;
    if (!value)
        return error_set(FSDP_EINVAL, "--%s needs a value", norm);
    struct config_value probe;
    if (config_value_parse(key, value, &probe) != 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", error_message());
        return error_set(FSDP_EINVAL, "--%s %s: %s (fsdp-worker's %s.%s)", norm, value, why, key->section, key->name);
    }
    free(probe.text);
    char full[96], origin[160];
    snprintf(full, sizeof full, "%s.%s", key->section, key->name);
    snprintf(origin, sizeof origin, "fsdp-launch --%s", norm);
    return add_setting(a, true, full, value, origin);
}

static int add_ignored(struct launch_args *a, const char *text)
{
    char **p = realloc(a->ignored, (size_t)(a->n_ignored + 1) * sizeof *p);
    if (!p)
        return error_set(FSDP_ENOMEM, "out of memory");
    a->ignored = p;
    if (!(a->ignored[a->n_ignored] = strdup(text)))
        return error_set(FSDP_ENOMEM, "out of memory");
    a->n_ignored++;
    return 0;
}

/* The accelerate config: launch keys fill what the command line and PET_* left unset; worker keys become
 * settings under the worker's INI file. */
static int apply_config_file(struct launch_args *a, struct parse_state *ps)
{
    struct yaml_flat y;
    int rc = yaml_flat_read(a->config_file, &y);
    if (rc)
        return rc;
    struct accel_setting *s = NULL;
    int n = 0;
    rc = accel_config_classify(&y, a->config_file, &s, &n);
    for (int i = 0; !rc && i < n; i++) {
        char origin[256];
        snprintf(origin, sizeof origin, "%.120s:%d (%.100s)", a->config_file, s[i].item->line, s[i].item->key);
        if (s[i].use == ACCEL_WORKER) {
            rc = add_setting(a, false, s[i].worker_key, s[i].value, origin);
        } else if (s[i].use == ACCEL_LAUNCH) {
            int id = find_opt(s[i].launch_flag, strlen(s[i].launch_flag));
            if (id < 0)
                rc = error_set(FSDP_EINVAL, "internal: no launch flag %s", s[i].launch_flag);
            else if (!ps->set[id] && !(id == O_NPROC && ps->set[O_NUM_PROCESSES]) &&
                     !(id == O_NUM_PROCESSES && ps->set[O_NPROC]) &&
                     !((id == O_MASTER_ADDR || id == O_MASTER_PORT) && ps->set[O_RDZV_ENDPOINT]))
                rc = apply_noted(a, ps, id, s[i].value, origin, origin);
        } else {
            char text[512];
            snprintf(text, sizeof text, "%s (line %d): %s", s[i].item->key, s[i].item->line, s[i].why);
            rc = add_ignored(a, text);
        }
    }
    free(s);
    yaml_flat_free(&y);
    return rc;
}

static int apply_slurm(struct launch_args *a, struct parse_state *ps)
{
    if (!getenv("SLURM_JOB_ID"))
        return 0;
    const char *nl = getenv("SLURM_JOB_NODELIST");
    if (!nl)
        nl = getenv("SLURM_NODELIST");
    if (nl) {
        char **hosts;
        size_t n;
        FSDP_TRY(slurm_expand_nodelist(nl, &hosts, &n));
        a->slurm_hosts = hosts;
        a->slurm_nhosts = (int)n;
        if (!ps->set[O_MASTER_ADDR] && !ps->set[O_RDZV_ENDPOINT] && !a->standalone)
            FSDP_TRY(apply_noted(a, ps, O_MASTER_ADDR, hosts[0], "SLURM_JOB_NODELIST", "SLURM_JOB_NODELIST (first host)"));
    }
    const char *nn = getenv("SLURM_JOB_NUM_NODES");
    if (!nn)
        nn = getenv("SLURM_NNODES");
    if (nn && !ps->set[O_NNODES] && !a->standalone) {
        FSDP_TRY(apply_noted(a, ps, O_NNODES, nn, "SLURM_JOB_NUM_NODES", "SLURM_JOB_NUM_NODES"));
    }
    const char *nid = getenv("SLURM_NODEID");
    if (nid && !ps->set[O_NODE_RANK] && !a->standalone) {
        FSDP_TRY(apply_noted(a, ps, O_NODE_RANK, nid, "SLURM_NODEID", "SLURM_NODEID"));
    }
    if (!ps->set[O_RDZV_ID] && !ps->set[O_RUN_ID]) {
        FSDP_TRY(apply_noted(a, ps, O_RDZV_ID, getenv("SLURM_JOB_ID"), "SLURM_JOB_ID", "SLURM_JOB_ID"));
    }
    return 0;
}

/* accelerate's --num_processes counts the workers of the whole job. */
static int reconcile_num_processes(struct launch_args *a, struct parse_state *ps)
{
    if (!ps->set[O_NUM_PROCESSES])
        return 0;
    int total = ps->num_processes;
    if (ps->set[O_NPROC]) {
        if (a->nproc_per_node * a->nnodes != total)
            return error_set(FSDP_EINVAL,
                             "num_processes %d (%s) disagrees with nproc_per_node %d x nnodes %d (%s): num_processes "
                             "counts the workers of all nodes; give one of the two",
                             total, a->origins[O_NUM_PROCESSES].origin, a->nproc_per_node, a->nnodes,
                             a->origins[O_NPROC].origin);
        return 0;
    }
    if (total % a->nnodes != 0)
        return error_set(FSDP_EINVAL,
                         "num_processes %d (%s) is not a multiple of nnodes %d: every node runs the same number of "
                         "workers",
                         total, a->origins[O_NUM_PROCESSES].origin, a->nnodes);
    a->nproc_per_node = total / a->nnodes;
    char text[32], origin[400];
    snprintf(text, sizeof text, "%d", a->nproc_per_node);
    snprintf(origin, sizeof origin, "%.256s: num_processes %d / nnodes %d", a->origins[O_NUM_PROCESSES].origin, total,
             a->nnodes);
    note(a, O_NPROC, text, origin);
    ps->set[O_NPROC] = true;
    return 0;
}

static void set_defaults(struct launch_args *a)
{
    memset(a, 0, sizeof *a);
    a->nnodes = 1;
    a->nproc_per_node = 1;
    strcpy(a->master_addr, "127.0.0.1");
    a->master_port = 29500;
    a->monitor_interval_s = 0.1;
    a->rdzv_timeout_s = 900;
    a->shutdown_timeout_s = 30;
    strcpy(a->role, "default");
    a->log_level = log_get_level();
    static const int def_signals[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
    for (size_t i = 0; i < sizeof def_signals / sizeof def_signals[0]; i++)
        a->signals[a->n_signals++] = def_signals[i];
    a->mode = LAUNCH_AUTO;
    a->rdzv_is_host = -1;
}

static int parse_command_line(int argc, char **argv, struct launch_args *a, struct parse_state *ps, int *first_prog)
{
    int i = 1;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        }
        if (arg[0] != '-' || !arg[1])
            break;
        int id;
        const char *eq = NULL;
        if (arg[1] != '-') {
            /* torchrun's short flags: -m, -r V, -t V (also -rV), and -h. */
            id = find_short(arg[1]);
            if (id >= 0 && arg[2])
                eq = arg + 1; /* value glued on: -r3 */
            if (id >= 0 && arg[2] && opts[id].kind == K_BOOL)
                id = -1;
        } else {
            const char *name = arg + 2;
            eq = strchr(name, '=');
            id = find_opt(name, eq ? (size_t)(eq - name) : strlen(name));
        }
        if (id < 0 && arg[1] == '-') {
            int rc = worker_flag(a, argc, argv, &i);
            if (rc <= 0) {
                if (rc)
                    return rc;
                continue;
            }
        }
        if (id < 0)
            return error_set(FSDP_EINVAL, "unknown flag '%s' (fsdp-launch --help lists the flags)", arg);
        if (id == O_HELP) {
            launch_args_usage(stdout);
            return 1;
        }
        char src[96];
        snprintf(src, sizeof src, "--%s", opts[id].name);
        const char *val;
        if (opts[id].kind != K_VALUE)
            val = eq ? eq + 1 : "true";
        else if (eq)
            val = eq + 1;
        else if (i + 1 < argc)
            val = argv[++i];
        else
            return error_set(FSDP_EINVAL, "%s needs a value (%s)", src, opts[id].help);
        FSDP_TRY(apply_noted(a, ps, id, val, src, src));
    }
    *first_prog = i;
    return 0;
}

/* PET_* come from torchrun-style wrappers (Kubeflow, TorchX); flags given on the command line win. */
static int parse_pet(struct launch_args *a, struct parse_state *ps)
{
    for (int id = 0; id < O_COUNT; id++) {
        if (ps->set[id] || id == O_HELP || id == O_PRINT_CONFIG)
            continue;
        char env[64] = "PET_";
        for (size_t k = 0; opts[id].name[k] && k + 5 < sizeof env; k++)
            env[4 + k] = (char)toupper((unsigned char)opts[id].name[k]);
        const char *v = getenv(env);
        if (!v)
            continue;
        if (opts[id].kind == K_BOOL && !*v)
            continue;
        FSDP_TRY(apply_noted(a, ps, id, v, env, env));
    }
    return 0;
}

static int finish(struct launch_args *a, struct parse_state *ps)
{
    if (!a->python[0]) {
        const char *pe = getenv("PYTHON_EXEC");
        set_text(a->python, sizeof a->python, pe && *pe ? pe : "python3");
        note(a, O_PYTHON, a->python, pe && *pe ? "PYTHON_EXEC" : "");
    }
    if (!ps->set[O_PREFIX_TEMPLATE]) {
        /* torchrun reads this when --log_line_prefix_template is not given. */
        const char *t = getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
        if (t && *t)
            FSDP_TRY(apply_noted(a, ps, O_PREFIX_TEMPLATE, t, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
                                 "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"));
    }
    if (!ps->set[O_SHUTDOWN]) {
        /* torchrun reads this when --shutdown_timeout is not given. */
        const char *st = getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
        if (st && *st) {
            FSDP_TRY(apply_noted(a, ps, O_SHUTDOWN, st, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"));
        }
    }
    if (a->standalone) {
        if (ps->set[O_NNODES] && a->nnodes != 1)
            return error_set(FSDP_EINVAL, "--standalone runs one node, but --nnodes is %d", a->nnodes);
        a->nnodes = 1;
        a->node_rank = 0;
        strcpy(a->master_addr, "127.0.0.1");
        a->master_port = 0;
        note(a, O_MASTER_PORT, "0", "--standalone (a free port)");
    }
    FSDP_TRY(reconcile_num_processes(a, ps));
    if (!ps->port_set && !ps->set[O_RDZV_ENDPOINT] && !a->standalone && a->nnodes == 1) {
        /* torchrun: one node and no port given means a store on a free port, so two jobs on one machine never
         * collide. */
        a->master_port = 0;
        note(a, O_MASTER_PORT, "0", "one node, no port given: a free port");
    }
    if (!a->run_id[0]) {
        /* All nodes must agree on the run id, so a random one only suits a single node. */
        if (a->nnodes == 1)
            random_hex(a->run_id, 8);
        else
            strcpy(a->run_id, "none");
    }
    if (a->node_rank >= a->nnodes)
        return error_set(FSDP_ERANGE, "--node_rank %d is out of range: --nnodes is %d, so node ranks are 0..%d",
                         a->node_rank, a->nnodes, a->nnodes - 1);
    if (a->rdzv_is_host >= 0 && a->rdzv_is_host != (a->node_rank == 0))
        return error_set(FSDP_EINVAL, "--rdzv_conf is_host=%s: the store is hosted by node 0, and this is node %d",
                         a->rdzv_is_host ? "true" : "false", a->node_rank);
    if (a->master_port == 0 && a->node_rank != 0)
        return error_set(FSDP_EINVAL, "--master_port 0 (pick a free port) only works on node 0; node %d must be "
                         "given the port node 0 printed", a->node_rank);
    if (a->nnodes > 1 && !ps->set[O_NODE_RANK] && ps->set[O_RDZV_BACKEND] &&
        strcmp(a->origins[O_RDZV_BACKEND].text, "c10d") == 0)
        return error_set(FSDP_EINVAL,
                         "--rdzv_backend c10d with %d nodes: torchrun would number the nodes in the order they join; "
                         "fsdp-launch's rendezvous needs each node's --node_rank (0 on the node at the endpoint, "
                         "which hosts the store)",
                         a->nnodes);
    if (a->mode == LAUNCH_MODULE && a->prog_argc == 0)
        return error_set(FSDP_EINVAL, "--module needs a module name: fsdp-launch -m MODULE [ARGS...]");
    if (a->prog_argc == 0 && !a->print_config)
        return error_set(FSDP_EINVAL, "no program to run: usage fsdp-launch [FLAGS] [--] PROGRAM [ARGS...]");
    return 0;
}

int launch_args_parse(int argc, char **argv, struct launch_args *a)
{
    set_defaults(a);
    struct parse_state ps = {0};
    int first = argc;
    int rc = parse_command_line(argc, argv, a, &ps, &first);
    if (rc)
        return rc;
    a->prog_argv = argv + first;
    a->prog_argc = argc - first;
    if ((rc = parse_pet(a, &ps)))
        return rc;
    if (a->config_file[0] && (rc = apply_config_file(a, &ps)))
        return rc;
    if ((rc = apply_slurm(a, &ps)))
        return rc;
    return finish(a, &ps);
}

void launch_args_free(struct launch_args *a)
{
    if (a->slurm_hosts)
        slurm_free_hosts(a->slurm_hosts, (size_t)a->slurm_nhosts);
    a->slurm_hosts = NULL;
    free(a->settings);
    a->settings = NULL;
    a->n_settings = 0;
    for (int i = 0; i < a->n_ignored; i++)
        free(a->ignored[i]);
    free(a->ignored);
    a->ignored = NULL;
    a->n_ignored = 0;
}

/* ---- output ---------------------------------------------------------------------------------------- */

char *launch_args_settings_json(const struct launch_args *a)
{
    if (!a->n_settings)
        return NULL;
    cJSON *root = cJSON_CreateObject();
    cJSON *under = cJSON_AddArrayToObject(root, "under_file");
    cJSON *over = cJSON_AddArrayToObject(root, "over_file");
    for (int i = 0; i < a->n_settings; i++) {
        const struct launch_setting *s = &a->settings[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "key", s->key);
        cJSON_AddStringToObject(e, "value", s->value);
        cJSON_AddStringToObject(e, "origin", s->origin);
        cJSON_AddItemToArray(s->over_file ? over : under, e);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

static const char *mode_name(enum launch_mode m)
{
    switch (m) {
    case LAUNCH_NO_PYTHON: return "no_python";
    case LAUNCH_MODULE: return "module";
    case LAUNCH_RUN_PATH: return "run_path";
    default: return "auto";
    }
}

/* The effective value of each launch setting that has one (flags that only select behaviour have none). */
static bool effective(const struct launch_args *a, int id, char *buf, size_t cap)
{
    switch (id) {
    case O_NNODES: snprintf(buf, cap, "%d", a->nnodes); return true;
    case O_NODE_RANK: snprintf(buf, cap, "%d", a->node_rank); return true;
    case O_NPROC: snprintf(buf, cap, "%d", a->nproc_per_node); return true;
    case O_MASTER_ADDR: snprintf(buf, cap, "%s", a->master_addr); return true;
    case O_MASTER_PORT: snprintf(buf, cap, "%d", a->master_port); return true;
    case O_STANDALONE: snprintf(buf, cap, "%s", a->standalone ? "true" : "false"); return true;
    case O_MAX_RESTARTS: snprintf(buf, cap, "%d", a->max_restarts); return true;
    case O_MONITOR: snprintf(buf, cap, "%g", a->monitor_interval_s); return true;
    case O_RDZV_ID: snprintf(buf, cap, "%s", a->run_id); return true;
    case O_RDZV_TIMEOUT: snprintf(buf, cap, "%g", a->rdzv_timeout_s); return true;
    case O_LOG_DIR: snprintf(buf, cap, "%s", a->log_dir); return true;
    case O_REDIRECTS: snprintf(buf, cap, "%s", a->redirects[0] ? a->redirects : "0"); return true;
    case O_TEE: snprintf(buf, cap, "%s", a->tee[0] ? a->tee : "0"); return true;
    case O_FILTER: snprintf(buf, cap, "%s", a->local_ranks_filter); return true;
    case O_PREFIX_TEMPLATE: snprintf(buf, cap, "%s", a->prefix_template); return true;
    case O_ROLE: snprintf(buf, cap, "%s", a->role); return true;
    case O_SHUTDOWN: snprintf(buf, cap, "%g", a->shutdown_timeout_s); return true;
    case O_LOG_LEVEL: {
        static const char *const names[] = {"debug", "info", "warn", "error", "off"};
        snprintf(buf, cap, "%s", a->log_level >= LOG_DEBUG && a->log_level <= LOG_OFF ? names[a->log_level] : "info");
        return true;
    }
    case O_LOCAL_ADDR: snprintf(buf, cap, "%s", a->local_addr); return true;
    case O_PYTHON: snprintf(buf, cap, "%s", a->python); return true;
    case O_GPU_IDS: snprintf(buf, cap, "%s", a->gpu_ids[0] ? a->gpu_ids : "all"); return true;
    case O_OMP_THREADS: snprintf(buf, cap, "%d", a->omp_threads); return true;
    case O_VIRTUAL_LOCAL_RANK: snprintf(buf, cap, "%s", a->virtual_local_rank ? "true" : "false"); return true;
    case O_CONFIG_FILE: snprintf(buf, cap, "%s", a->config_file); return true;
    case O_SIGNALS: {
        size_t n = 0;
        buf[0] = 0;
        for (int i = 0; i < a->n_signals && n < cap; i++)
            n += (size_t)snprintf(buf + n, cap - n, "%sSIG%s", i ? "," : "", sigabbrev_np(a->signals[i]));
        return true;
    }
    default: return false;
    }
}

int launch_args_print(const struct launch_args *a, FILE *f, bool json)
{
    char value[1100];
    if (json) {
        cJSON *root = cJSON_CreateObject();
        cJSON *launch = cJSON_AddObjectToObject(root, "launch");
        for (int id = 0; id < O_COUNT; id++) {
            if (!effective(a, id, value, sizeof value))
                continue;
            cJSON *e = cJSON_AddObjectToObject(launch, opts[id].name);
            cJSON_AddStringToObject(e, "value", value);
            cJSON_AddStringToObject(e, "origin", a->origins[id].origin[0] ? a->origins[id].origin : "default");
        }
        cJSON_AddStringToObject(launch, "mode", mode_name(a->mode));
        cJSON *w = cJSON_AddArrayToObject(root, "worker");
        for (int i = 0; i < a->n_settings; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "key", a->settings[i].key);
            cJSON_AddStringToObject(e, "value", a->settings[i].value);
            cJSON_AddStringToObject(e, "origin", a->settings[i].origin);
            cJSON_AddStringToObject(e, "layer", a->settings[i].over_file ? "over_file" : "under_file");
            cJSON_AddItemToArray(w, e);
        }
        cJSON *ig = cJSON_AddArrayToObject(root, "ignored");
        for (int i = 0; i < a->n_ignored; i++)
            cJSON_AddItemToArray(ig, cJSON_CreateString(a->ignored[i]));
        char *text = cJSON_Print(root);
        cJSON_Delete(root);
        if (!text)
            return error_set(FSDP_ENOMEM, "out of memory");
        fprintf(f, "%s\n", text);
        free(text);
    } else {
        fprintf(f, "# fsdp-launch: effective settings ('# origin'; no origin = default)\n");
        for (int id = 0; id < O_COUNT; id++) {
            if (!effective(a, id, value, sizeof value))
                continue;
            char line[1300];
            snprintf(line, sizeof line, "%s = %s", opts[id].name, value);
            if (a->origins[id].origin[0])
                fprintf(f, "%-40s # %s\n", line, a->origins[id].origin);
            else
                fprintf(f, "%s\n", line);
        }
        fprintf(f, "mode = %s\n", mode_name(a->mode));
        if (a->n_settings) {
            fprintf(f, "\n# fsdp-worker settings (FSDP_LAUNCH_CONFIG): YAML under the worker's INI file, "
                       "fsdp-launch's flags over it\n");
            for (int i = 0; i < a->n_settings; i++) {
                char line[600];
                snprintf(line, sizeof line, "%s = %s", a->settings[i].key, a->settings[i].value);
                fprintf(f, "%-40s # %s, %s the INI file\n", line, a->settings[i].origin,
                        a->settings[i].over_file ? "over" : "under");
            }
        }
        if (a->n_ignored) {
            fprintf(f, "\n# ignored (no meaning for fsdpc):\n");
            for (int i = 0; i < a->n_ignored; i++)
                fprintf(f, "#   %s\n", a->ignored[i]);
        }
    }
    if (fflush(f) != 0 || ferror(f))
        return error_set(FSDP_EIO, "cannot write the settings");
    return 0;
}
