#include "launcher/args.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "launcher/slurm.h"

enum opt_id {
    O_NNODES, O_NODE_RANK, O_NPROC, O_MASTER_ADDR, O_MASTER_PORT, O_STANDALONE, O_MAX_RESTARTS,
    O_MONITOR, O_RDZV_ID, O_RUN_ID, O_RDZV_TIMEOUT, O_LOG_DIR, O_REDIRECTS, O_TEE, O_FILTER, O_ROLE,
    O_SHUTDOWN, O_LOG_LEVEL, O_RDZV_ENDPOINT, O_RDZV_BACKEND, O_HELP, O_COUNT
};

struct opt {
    const char *name; /* canonical, `_` spelling */
    bool has_value;
    const char *help;
};

static const struct opt opts[O_COUNT] = {
    [O_NNODES] = {"nnodes", true, "number of nodes (N or N:N)"},
    [O_NODE_RANK] = {"node_rank", true, "this node's rank, 0..nnodes-1 (node 0 hosts the store)"},
    [O_NPROC] = {"nproc_per_node", true, "workers per node: N, auto, cpu or gpu"},
    [O_MASTER_ADDR] = {"master_addr", true, "address of node 0 (default 127.0.0.1)"},
    [O_MASTER_PORT] = {"master_port", true, "store port on node 0 (default 29500; 0 = free port, printed)"},
    [O_STANDALONE] = {"standalone", false, "one node, store on a free local port (printed)"},
    [O_MAX_RESTARTS] = {"max_restarts", true, "restarts of the whole job after a failure (default 0)"},
    [O_MONITOR] = {"monitor_interval", true, "seconds between store checks (default 0.1)"},
    [O_RDZV_ID] = {"rdzv_id", true, "job id shared by all nodes (TORCHELASTIC_RUN_ID)"},
    [O_RUN_ID] = {"run_id", true, "same as --rdzv_id"},
    [O_RDZV_TIMEOUT] = {"rdzv_timeout", true, "seconds to wait for the store and for all nodes (default 900)"},
    [O_LOG_DIR] = {"log_dir", true, "write <dir>/<run_id>/attempt_<n>/<local_rank>/{stdout,stderr}.log"},
    [O_REDIRECTS] = {"redirects", true, "streams sent only to log files: 0 none, 1 out, 2 err, 3 both, or L:N,..."},
    [O_TEE] = {"tee", true, "streams also echoed as '[rank N]:' lines: same syntax as --redirects"},
    [O_FILTER] = {"local_ranks_filter", true, "comma list of local ranks whose output reaches the console"},
    [O_ROLE] = {"role", true, "ROLE_NAME for the workers (default 'default')"},
    [O_SHUTDOWN] = {"shutdown_timeout", true, "seconds between SIGTERM and SIGKILL at teardown (default 30)"},
    [O_LOG_LEVEL] = {"log_level", true, "debug, info, warn or error (default info)"},
    [O_RDZV_ENDPOINT] = {"rdzv_endpoint", true, "HOST[:PORT] of node 0: the same as --master_addr/--master_port"},
    [O_RDZV_BACKEND] = {"rdzv_backend", true, "accepted for torchrun command lines (static, c10d); the store is always ours"},
    [O_HELP] = {"help", false, "this text"},
};

void launch_args_usage(FILE *f)
{
    fprintf(f, "usage: fsdp-launch [FLAGS] [--] PROGRAM [ARGS...]\n"
               "Starts nproc_per_node copies of PROGRAM on this node with torchrun's environment.\n"
               "Flags (also --flag-name spelling, --flag=value, and PET_<FLAG_NAME> variables):\n");
    for (int i = 0; i < O_COUNT; i++)
        fprintf(f, "  --%-20s %s\n", opts[i].name, opts[i].help);
}

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

static int count_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The launcher does not link CUDA (it must start on machines without a driver), so GPUs are counted the
 * way the driver exposes them: CUDA_VISIBLE_DEVICES when set, else /dev/nvidiaN nodes. */
static int count_gpus(void)
{
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis) {
        int n = 0;
        for (const char *p = vis; *p;) {
            const char *c = strchr(p, ',');
            size_t len = c ? (size_t)(c - p) : strlen(p);
            if (len > 0 && !(len == 2 && strncmp(p, "-1", 2) == 0))
                n++;
            else if (len == 2)
                break; /* "-1" hides this and every later device */
            p = c ? c + 1 : p + len;
        }
        return n;
    }
    int n = 0;
    DIR *d = opendir("/dev");
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *s = e->d_name;
        if (strncmp(s, "nvidia", 6) == 0 && isdigit((unsigned char)s[6])) {
            const char *q = s + 6;
            while (isdigit((unsigned char)*q))
                q++;
            if (!*q)
                n++;
        }
    }
    closedir(d);
    return n;
}

static int parse_nproc(const char *s, const char *src, int *out)
{
    if (strcmp(s, "cpu") == 0) {
        *out = count_cpus();
        return 0;
    }
    if (strcmp(s, "gpu") == 0) {
        *out = count_gpus();
        if (*out == 0)
            return error_set(FSDP_EINVAL, "%s: 'gpu' asked for one worker per GPU, but this node shows no GPU "
                             "(no /dev/nvidiaN, or CUDA_VISIBLE_DEVICES empty); use a number or 'cpu'", src);
        return 0;
    }
    if (strcmp(s, "auto") == 0) {
        int g = count_gpus();
        *out = g > 0 ? g : count_cpus();
        return 0;
    }
    int rc = parse_int(s, src, 1, LAUNCH_MAX_LOCAL, out);
    if (rc)
        return error_set(FSDP_EINVAL, "%s: '%s' is not a positive number of workers (1..%d), 'auto', 'cpu' or 'gpu'",
                         src, s, LAUNCH_MAX_LOCAL);
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

static int apply(struct launch_args *a, int id, const char *v, const char *src)
{
    switch (id) {
    case O_NNODES: {
        /* torchrun's elastic MIN:MAX form is accepted only when MIN == MAX: membership here is static. */
        const char *colon = strchr(v, ':');
        if (colon) {
            char lo[32];
            if ((size_t)(colon - v) >= sizeof lo || strcmp(colon + 1, "") == 0)
                return error_set(FSDP_EINVAL, "%s: '%s' is not N or N:N", src, v);
            snprintf(lo, sizeof lo, "%.*s", (int)(colon - v), v);
            int a1 = 0, a2 = 0;
            FSDP_TRY(parse_int(lo, src, 1, 1 << 20, &a1));
            FSDP_TRY(parse_int(colon + 1, src, 1, 1 << 20, &a2));
            if (a1 != a2)
                return error_set(FSDP_EUNSUPPORTED, "%s: elastic '%s' (MIN != MAX) is not supported; give one node count",
                                 src, v);
            a->nnodes = a1;
            return 0;
        }
        return parse_int(v, src, 1, 1 << 20, &a->nnodes);
    }
    case O_NODE_RANK: return parse_int(v, src, 0, 1 << 20, &a->node_rank);
    case O_NPROC: return parse_nproc(v, src, &a->nproc_per_node);
    case O_MASTER_ADDR:
        if (!*v)
            return error_set(FSDP_EINVAL, "%s: empty address", src);
        return copy_str(a->master_addr, sizeof a->master_addr, v, src);
    case O_MASTER_PORT: return parse_int(v, src, 0, 65535, &a->master_port);
    case O_STANDALONE: return parse_bool(v, src, &a->standalone);
    case O_MAX_RESTARTS: return parse_int(v, src, 0, 1000000, &a->max_restarts);
    case O_MONITOR: {
        int rc = parse_double(v, src, 0.001, &a->monitor_interval_s);
        return rc;
    }
    case O_RDZV_ID:
    case O_RUN_ID:
        if (!*v || strchr(v, '/'))
            return error_set(FSDP_EINVAL, "%s: '%s' must be non-empty and without '/'", src, v);
        return copy_str(a->run_id, sizeof a->run_id, v, src);
    case O_RDZV_TIMEOUT: return parse_double(v, src, 0.001, &a->rdzv_timeout_s);
    case O_LOG_DIR: return copy_str(a->log_dir, sizeof a->log_dir, v, src);
    case O_REDIRECTS:
        FSDP_TRY(check_std(v, src));
        return copy_str(a->redirects, sizeof a->redirects, v, src);
    case O_TEE:
        FSDP_TRY(check_std(v, src));
        return copy_str(a->tee, sizeof a->tee, v, src);
    case O_FILTER:
        FSDP_TRY(check_filter(v, src));
        return copy_str(a->local_ranks_filter, sizeof a->local_ranks_filter, v, src);
    case O_ROLE:
        if (!*v)
            return error_set(FSDP_EINVAL, "%s: empty role", src);
        return copy_str(a->role, sizeof a->role, v, src);
    case O_SHUTDOWN: return parse_double(v, src, 0, &a->shutdown_timeout_s);
    case O_LOG_LEVEL:
        if (log_parse_level(v, &a->log_level))
            return error_set(FSDP_EINVAL, "%s: '%s' is not debug, info, warn or error", src, v);
        return 0;
    case O_RDZV_ENDPOINT: {
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
        FSDP_TRY(copy_str(a->master_addr, sizeof a->master_addr, host, src));
        return has_port ? parse_int(colon + 1, src, 0, 65535, &a->master_port) : 0;
    }
    case O_RDZV_BACKEND:
        if (strcmp(v, "static") && strcmp(v, "c10d"))
            return error_set(FSDP_EUNSUPPORTED, "%s: '%s' is not supported; fsdp-launch has one rendezvous (c10d-like, "
                             "hosted by node 0): use static or c10d", src, v);
        return 0;
    default: return 0;
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
    for (int i = 0; i < O_COUNT; i++)
        if (strcmp(opts[i].name, norm) == 0)
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

static int apply_slurm(struct launch_args *a, bool set[O_COUNT])
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
        if (!set[O_MASTER_ADDR] && !set[O_RDZV_ENDPOINT] && !a->standalone) {
            FSDP_TRY(copy_str(a->master_addr, sizeof a->master_addr, hosts[0], "SLURM_JOB_NODELIST"));
            set[O_MASTER_ADDR] = true;
        }
    }
    const char *nn = getenv("SLURM_JOB_NUM_NODES");
    if (!nn)
        nn = getenv("SLURM_NNODES");
    if (nn && !set[O_NNODES] && !a->standalone) {
        FSDP_TRY(parse_int(nn, "SLURM_JOB_NUM_NODES", 1, 1 << 20, &a->nnodes));
        set[O_NNODES] = true;
    }
    const char *nid = getenv("SLURM_NODEID");
    if (nid && !set[O_NODE_RANK] && !a->standalone) {
        FSDP_TRY(parse_int(nid, "SLURM_NODEID", 0, 1 << 20, &a->node_rank));
        set[O_NODE_RANK] = true;
    }
    if (!set[O_RDZV_ID] && !set[O_RUN_ID]) {
        FSDP_TRY(copy_str(a->run_id, sizeof a->run_id, getenv("SLURM_JOB_ID"), "SLURM_JOB_ID"));
        set[O_RDZV_ID] = true;
    }
    return 0;
}

int launch_args_parse(int argc, char **argv, struct launch_args *a)
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
    bool set[O_COUNT] = {0};

    int i = 1;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        }
        if (arg[0] != '-' || !arg[1])
            break;
        const char *name = arg + (arg[1] == '-' ? 2 : 1);
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int id = find_opt(name, len);
        if (strcmp(arg, "-h") == 0)
            id = O_HELP;
        if (id < 0)
            return error_set(FSDP_EINVAL, "unknown flag '%s' (fsdp-launch --help lists the flags)", arg);
        if (id == O_HELP) {
            launch_args_usage(stdout);
            return 1;
        }
        char src[96];
        snprintf(src, sizeof src, "--%s", opts[id].name);
        const char *val;
        if (!opts[id].has_value)
            val = eq ? eq + 1 : "true";
        else if (eq)
            val = eq + 1;
        else if (i + 1 < argc)
            val = argv[++i];
        else
            return error_set(FSDP_EINVAL, "%s needs a value (%s)", src, opts[id].help);
        FSDP_TRY(apply(a, id, val, src));
        set[id] = true;
    }
    a->prog_argv = argv + i;
    a->prog_argc = argc - i;

    /* PET_* come from torchrun-style wrappers (Kubeflow, TorchX); flags given on the command line win. */
    for (int id = 0; id < O_COUNT; id++) {
        if (set[id] || id == O_HELP)
            continue;
        char env[64] = "PET_";
        for (size_t k = 0; opts[id].name[k] && k + 5 < sizeof env; k++)
            env[4 + k] = (char)toupper((unsigned char)opts[id].name[k]);
        const char *v = getenv(env);
        if (!v)
            continue;
        FSDP_TRY(apply(a, id, v, env));
        set[id] = true;
    }

    FSDP_TRY(apply_slurm(a, set));

    if (a->standalone) {
        if (set[O_NNODES] && a->nnodes != 1)
            return error_set(FSDP_EINVAL, "--standalone runs one node, but --nnodes is %d", a->nnodes);
        a->nnodes = 1;
        a->node_rank = 0;
        strcpy(a->master_addr, "127.0.0.1");
        a->master_port = 0;
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
    if (a->master_port == 0 && a->node_rank != 0)
        return error_set(FSDP_EINVAL, "--master_port 0 (pick a free port) only works on node 0; node %d must be "
                         "given the port node 0 printed", a->node_rank);
    if (a->prog_argc == 0)
        return error_set(FSDP_EINVAL, "no program to run: usage fsdp-launch [FLAGS] [--] PROGRAM [ARGS...]");
    return 0;
}

void launch_args_free(struct launch_args *a)
{
    if (a->slurm_hosts)
        slurm_free_hosts(a->slurm_hosts, (size_t)a->slurm_nhosts);
    a->slurm_hosts = NULL;
}
