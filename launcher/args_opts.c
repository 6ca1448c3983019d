/* fsdp-launch's options: the table (names, aliases, kinds, help), how each value is checked and applied,
 * and torchrun's Std masks and local-rank filter. */
#include "launcher/args_internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"
#include "launcher/devices.h"

const struct launch_opt launch_opts[O_COUNT] = {
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
                      "with --log_dir: --tee stdout lines containing any of these (comma list; ',,' is a comma) "
                      "also go to <log_dir>/<run_id>/attempt_<n>/filtered_stdout.log"},
    [O_DUP_STDERR] = {"duplicate_stderr_filters", {0}, K_VALUE, "the same for stderr (filtered_stderr.log)"},
    [O_NODE_RANK] = {"node_rank", {"machine_rank"}, K_VALUE, "this node's rank, 0..nnodes-1 (node 0 hosts the store)"},
    [O_MASTER_ADDR] = {"master_addr", {"main_process_ip"}, K_VALUE, "address of node 0 (default 127.0.0.1)"},
    [O_MASTER_PORT] = {"master_port", {"main_process_port"}, K_VALUE,
                       "store port on node 0 (one node: a free port, printed; several: 29500)"},
    [O_LOCAL_ADDR] = {"local_addr", {0}, K_VALUE, "this node's address: its name in the store and in messages (default "
                                                  "hostname); node 0's store listens on it (default --master_addr; "
                                                  "0.0.0.0 = every interface)"},
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
    [O_STATUS_PORT] = {"status_port", {0}, K_VALUE,
                       "node 0 serves the live status page, /api/status and /metrics on this port (0 = a free "
                       "one, printed; default off)"},
    [O_STATUS_ADDR] = {"status_addr", {0}, K_VALUE,
                       "address the status page binds (default 127.0.0.1; others need FSDP_RDZV_TOKEN, and "
                       "their clients the printed read-only status token)"},
    [O_STATUS_STALE] = {"status_stale_timeout", {0}, K_VALUE,
                        "seconds without a new record before the page shows a rank stale (default 30)"},
    [O_LOG_LEVEL] = {"log_level", {0}, K_VALUE, "debug, info, warn, error or off (default info)"},
    [O_LOG_MAX_BYTES] = {"log_max_bytes", {0}, K_VALUE, "with --log_dir: rotate a log file at this size (N, Nk, NM, "
                         "NG; FILE.1 keeps the previous part; default 0 = unbounded)"},
    [O_PYTHON] = {"python", {0}, K_VALUE, "interpreter of Python scripts (default PYTHON_EXEC, else python3 in PATH)"},
    [O_NO_TORCH_STORE] = {"no_torch_store", {0}, K_BOOL,
                          "the store refuses PyTorch TCPStore clients (jobs that run only fsdp-worker)"},
    [O_PRINT_CONFIG] = {"print_config", {0}, K_OPTIONAL,
                        "print every setting and where it came from (=json: as JSON) and exit"},
    [O_HELP] = {"help", {"h"}, K_BOOL, "this text"},
};

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

int launch_parse_bool(const char *s, const char *src, bool *out)
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
    /* HOST:PORT, HOST, or [V6]:PORT; a bare IPv6 address has several colons and no port. A bracket must
     * close, and nothing but :PORT may follow it. */
    const char *colon = strrchr(v, ':');
    const char *rb = strrchr(v, ']');
    if ((v[0] == '[') != (rb != NULL) || (rb && rb[1] && rb[1] != ':') || (rb && rb == v + 1))
        return error_set(FSDP_EINVAL, "%s: '%s' is not HOST[:PORT] or [IPV6][:PORT] (a '[' must be closed by "
                         "']', followed by nothing or :PORT)", src, v);
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

/* --log_max_bytes: N, Nk, NM or NG bytes, at least LAUNCH_LOG_MIN_BYTES; 0 = unbounded. */
static int parse_size(const char *v, const char *src, long long *out)
{
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    unsigned long long mult = !*end                                  ? 1
                              : !strcmp(end, "k") || !strcmp(end, "K") ? 1ull << 10
                              : !strcmp(end, "M")                      ? 1ull << 20
                              : !strcmp(end, "G")                      ? 1ull << 30
                                                                       : 0;
    if (!isdigit((unsigned char)v[0]) || errno || mult == 0 || n > (1ull << 50) / mult ||
        (n && n * mult < LAUNCH_LOG_MIN_BYTES))
        return error_set(FSDP_EINVAL, "%s: '%s' is not a size of at least %d bytes (N, Nk, NM or NG), or 0 for "
                         "unbounded log files", src, v, LAUNCH_LOG_MIN_BYTES);
    *out = (long long)(n * mult);
    return 0;
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
            rc = launch_parse_bool(val, what, &host);
            a->rdzv_is_host = host;
        } else if (!strcmp(k, "rank")) {
            rc = parse_int(val, what, 0, 1 << 20, &a->node_rank);
        } else if (!strcmp(k, "last_call_timeout") || !strcmp(k, "close_timeout") || !strcmp(k, "read_timeout") ||
                   !strcmp(k, "use_libuv")) {
            double ignored;
            bool b;
            rc = !strcmp(k, "use_libuv") ? launch_parse_bool(val, what, &b) : parse_double(val, what, 0, &ignored);
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

/* ---- how each option is applied ------------------------------------------------------------------- */

/* The options whose value is more than a checked field: each is a function of the table below. */
typedef int apply_fn(struct launch_args *a, int id, const char *v, const char *src, bool *port_set,
                     int *num_processes);

static int apply_nnodes(struct launch_args *a, int id, const char *v, const char *src, bool *port_set, int *np)
{
    (void)id, (void)port_set, (void)np;
    return parse_nnodes(v, src, &a->nnodes);
}

static int apply_nproc(struct launch_args *a, int id, const char *v, const char *src, bool *port_set, int *np)
{
    (void)id, (void)port_set, (void)np;
    return parse_nproc(v, src, &a->nproc_per_node);
}

static int apply_num_processes(struct launch_args *a, int id, const char *v, const char *src, bool *port_set,
                               int *num_processes)
{
    (void)a, (void)id, (void)port_set;
    return parse_int(v, src, 1, 1 << 24, num_processes);
}

static int apply_master_port(struct launch_args *a, int id, const char *v, const char *src, bool *port_set, int *np)
{
    (void)id, (void)np;
    *port_set = true;
    return parse_int(v, src, 0, 65535, &a->master_port);
}

static int apply_log_max_bytes(struct launch_args *a, int id, const char *v, const char *src, bool *port_set,
                               int *np)
{
    (void)id, (void)port_set, (void)np;
    return parse_size(v, src, &a->log_max_bytes);
}

static int apply_rdzv_conf(struct launch_args *a, int id, const char *v, const char *src, bool *port_set, int *np)
{
    (void)id, (void)port_set, (void)np;
    return parse_rdzv_conf(a, v, src);
}

static int apply_dup_filter(struct launch_args *a, int id, const char *v, const char *src, bool *port_set, int *np)
{
    (void)port_set, (void)np;
    return copy_str(a->dup_filters[id == O_DUP_STDERR], sizeof a->dup_filters[0], v, src);
}

static int apply_log_level(struct launch_args *a, int id, const char *v, const char *src, bool *port_set, int *np)
{
    (void)id, (void)port_set, (void)np;
    if (log_parse_level(v, &a->log_level))
        return error_set(FSDP_EINVAL, "%s: '%s' is not debug, info, warn, error or off", src, v);
    return 0;
}

static int apply_endpoint(struct launch_args *a, int id, const char *v, const char *src, bool *port_set, int *np)
{
    (void)id, (void)np;
    return parse_endpoint(a, v, src, port_set);
}

static int apply_signals(struct launch_args *a, int id, const char *v, const char *src, bool *port_set, int *np)
{
    (void)id, (void)port_set, (void)np;
    return parse_signals(a, v, src);
}

static int apply_mode(struct launch_args *a, int id, const char *v, const char *src, bool *port_set, int *np)
{
    (void)port_set, (void)np;
    bool on;
    int rc = launch_parse_bool(v, src, &on);
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

static int apply_gpu_ids(struct launch_args *a, int id, const char *v, const char *src, bool *port_set, int *np)
{
    (void)id, (void)port_set, (void)np;
    if (!strcasecmp(v, "all"))
        return 0;
    return check_gpu_ids(v, src) ? FSDP_EINVAL : copy_str(a->gpu_ids, sizeof a->gpu_ids, v, src);
}

static int apply_print_config(struct launch_args *a, int id, const char *v, const char *src, bool *port_set,
                              int *np)
{
    (void)id, (void)port_set, (void)np;
    if (!strcmp(v, "true") || !*v) {
        a->print_config = true;
    } else if (!strcasecmp(v, "json")) {
        a->print_config = a->print_config_json = true;
    } else {
        return error_set(FSDP_EINVAL, "%s: '%s': the formats are --print-config (text) and --print-config=json",
                         src, v);
    }
    return 0;
}

/* Checks of values that are kept as they are, or only checked. */
static int check_run_id(const char *v, const char *src)
{
    if (!*v || strchr(v, '/'))
        return error_set(FSDP_EINVAL, "%s: '%s' must be non-empty and without '/'", src, v);
    return 0;
}

static int check_rdzv_backend(const char *v, const char *src)
{
    if (strcmp(v, "static") && strcmp(v, "c10d"))
        return error_set(FSDP_EUNSUPPORTED,
                         "%s: '%s' is not supported: fsdp-launch has one rendezvous, a store hosted by node 0 "
                         "(torchrun's static and c10d backends both map to it)",
                         src, v);
    return 0;
}

static int check_start_method(const char *v, const char *src)
{
    if (strcmp(v, "spawn") && strcmp(v, "fork") && strcmp(v, "forkserver"))
        return error_set(FSDP_EINVAL, "%s: '%s' is not spawn, fork or forkserver", src, v);
    return 0;
}

static int check_event_log_handler(const char *v, const char *src)
{
    if (strcmp(v, "null") != 0)
        return error_set(FSDP_EUNSUPPORTED, "%s: '%s': torchrun's event handlers are Python logging handlers; "
                         "fsdp-launch's events are its log lines (--log_level debug shows them all)", src, v);
    return 0;
}

static int refuse_logs_specs(const char *v, const char *src)
{
    return error_set(FSDP_EUNSUPPORTED, "%s: '%s' names a Python entry point (torchrun.logs_specs), which "
                     "fsdp-launch cannot load; its log layout is --log_dir's (docs/launcher.md)", src, v);
}

static int refuse_numa_binding(const char *v, const char *src)
{
    return error_set(FSDP_EUNSUPPORTED, "%s: '%s': fsdp-launch does not bind workers to NUMA nodes; bind inside "
                     "the program (numactl, OMP_PLACES / OMP_PROC_BIND)", src, v);
}

static int refuse_print_completion(const char *v, const char *src)
{
    (void)v;
    return error_set(FSDP_EUNSUPPORTED, "%s: fsdp-launch ships no completion scripts; --help lists the flags", src);
}

enum apply_how {
    AP_NONE,   /* accepted, no effect (O_MULTI_GPU, O_SAME_NETWORK, O_HELP: the parser acts on it) */
    AP_INT,    /* an int field in [lo, hi] */
    AP_DOUBLE, /* a double field, at least min */
    AP_BOOL,   /* a bool field */
    AP_TEXT,   /* a char[] field, after `check` */
    AP_CHECK,  /* `check` only: nothing is kept */
    AP_FN,     /* `fn` */
};

struct opt_apply {
    enum apply_how how;
    size_t off, size;     /* the field in struct launch_args */
    long lo, hi;          /* AP_INT */
    double min;           /* AP_DOUBLE */
    const char *if_empty; /* AP_TEXT: the error when the value is empty ("%s" is src); NULL: "" is a value */
    int (*check)(const char *v, const char *src);
    apply_fn *fn;
};

/* A field of the wrong type for its kind does not compile (the array size would be negative). */
#define FIELD(f, type)                                                                                          \
    .off = offsetof(struct launch_args, f) +                                                                   \
           0 * sizeof(char[_Generic(((struct launch_args *)0)->f, type: 1, default: -1)]),                       \
    .size = sizeof(((struct launch_args *)0)->f)
#define INT(f, l, h) {AP_INT, FIELD(f, int), .lo = l, .hi = h}
#define DOUBLE(f, m) {AP_DOUBLE, FIELD(f, double), .min = m}
#define BOOL(f) {AP_BOOL, FIELD(f, bool)}
#define TEXT(f, empty, chk) {AP_TEXT, FIELD(f, char *), .if_empty = empty, .check = chk}
#define CHECK(chk) {AP_CHECK, .check = chk}
#define FN(f) {AP_FN, .fn = f}

static const struct opt_apply applies[O_COUNT] = {
    [O_NNODES] = FN(apply_nnodes),
    [O_NODE_RANK] = INT(node_rank, 0, 1 << 20),
    [O_NPROC] = FN(apply_nproc),
    [O_NUM_PROCESSES] = FN(apply_num_processes),
    [O_MASTER_ADDR] = TEXT(master_addr, "%s: empty address", NULL),
    [O_MASTER_PORT] = FN(apply_master_port),
    [O_STANDALONE] = BOOL(standalone),
    [O_MAX_RESTARTS] = INT(max_restarts, 0, 1000000),
    [O_MONITOR] = DOUBLE(monitor_interval_s, 0.001),
    [O_RDZV_ID] = TEXT(run_id, NULL, check_run_id),
    [O_RUN_ID] = TEXT(run_id, NULL, check_run_id),
    [O_RDZV_TIMEOUT] = DOUBLE(rdzv_timeout_s, 0.001),
    [O_LOG_MAX_BYTES] = FN(apply_log_max_bytes),
    [O_RDZV_CONF] = FN(apply_rdzv_conf),
    [O_LOG_DIR] = TEXT(log_dir, NULL, NULL),
    [O_STATUS_PORT] = INT(status_port, 0, 65535),
    [O_STATUS_ADDR] = TEXT(status_addr, "%s: an address is required (such as 127.0.0.1 or 0.0.0.0)", NULL),
    [O_STATUS_STALE] = DOUBLE(status_stale_s, 0.001),
    [O_REDIRECTS] = TEXT(redirects, NULL, check_std),
    [O_TEE] = TEXT(tee, NULL, check_std),
    [O_PREFIX_TEMPLATE] = TEXT(prefix_template, NULL, check_template),
    [O_DUP_STDOUT] = FN(apply_dup_filter),
    [O_DUP_STDERR] = FN(apply_dup_filter),
    [O_FILTER] = TEXT(local_ranks_filter, NULL, check_filter),
    [O_ROLE] = TEXT(role, "%s: empty role", NULL),
    [O_SHUTDOWN] = DOUBLE(shutdown_timeout_s, 0),
    [O_LOG_LEVEL] = FN(apply_log_level),
    [O_RDZV_ENDPOINT] = FN(apply_endpoint),
    [O_RDZV_BACKEND] = CHECK(check_rdzv_backend),
    [O_START_METHOD] = CHECK(check_start_method),
    [O_EVENT_LOG_HANDLER] = CHECK(check_event_log_handler),
    [O_LOGS_SPECS] = CHECK(refuse_logs_specs),
    [O_NUMA_BINDING] = CHECK(refuse_numa_binding),
    [O_PRINT_COMPLETION] = CHECK(refuse_print_completion),
    [O_SIGNALS] = FN(apply_signals),
    [O_VIRTUAL_LOCAL_RANK] = BOOL(virtual_local_rank),
    [O_NO_TORCH_STORE] = BOOL(no_torch_store),
    [O_LOCAL_ADDR] = TEXT(local_addr, "%s: empty address", NULL),
    [O_MODULE] = FN(apply_mode),
    [O_NO_PYTHON] = FN(apply_mode),
    [O_RUN_PATH] = FN(apply_mode),
    [O_PYTHON] = TEXT(python, "%s: empty interpreter", NULL),
    [O_CONFIG_FILE] = TEXT(config_file, NULL, NULL),
    [O_GPU_IDS] = FN(apply_gpu_ids),
    [O_OMP_THREADS] = INT(omp_threads, 1, 1 << 20),
    [O_PRINT_CONFIG] = FN(apply_print_config),
};

int launch_opt_apply(struct launch_args *a, int id, const char *v, const char *src, bool *port_set, int *num_processes)
{
    if (id < 0 || id >= O_COUNT)
        return 0;
    const struct opt_apply *ap = &applies[id];
    void *field = (char *)a + ap->off;
    switch (ap->how) {
    case AP_NONE: return 0;
    case AP_INT: return parse_int(v, src, ap->lo, ap->hi, field);
    case AP_DOUBLE: return parse_double(v, src, ap->min, field);
    case AP_BOOL: return launch_parse_bool(v, src, field);
    case AP_TEXT:
        if (ap->if_empty && !*v)
            return error_set(FSDP_EINVAL, ap->if_empty, src);
        if (ap->check)
            FSDP_TRY(ap->check(v, src));
        return copy_str(field, ap->size, v, src);
    case AP_CHECK: return ap->check(v, src);
    case AP_FN: return ap->fn(a, id, v, src, port_set, num_processes);
    }
    return 0;
}

int launch_opt_find(const char *name, size_t len)
{
    char norm[64];
    if (len >= sizeof norm)
        return -1;
    for (size_t i = 0; i < len; i++)
        norm[i] = name[i] == '-' ? '_' : name[i];
    norm[len] = 0;
    for (int i = 0; i < O_COUNT; i++) {
        if (strcmp(launch_opts[i].name, norm) == 0)
            return i;
        for (int k = 0; k < 3 && launch_opts[i].aliases[k]; k++)
            if (strlen(launch_opts[i].aliases[k]) > 1 && strcmp(launch_opts[i].aliases[k], norm) == 0)
                return i;
    }
    return -1;
}

int launch_opt_find_short(char c)
{
    for (int i = 0; i < O_COUNT; i++)
        for (int k = 0; k < 3 && launch_opts[i].aliases[k]; k++)
            if (launch_opts[i].aliases[k][0] == c && !launch_opts[i].aliases[k][1])
                return i;
    return -1;
}


void launch_set_text(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = 0;
}
