/* fsdp-launch's configuration in the order of precedence: the command line (torchrun's and accelerate's
 * flags; accelerate's fsdp-worker flags become worker settings), PET_*, the accelerate config file, SLURM,
 * defaults, then the checks across options. What each option means is args_opts.c. */
#include "launcher/args.h"
#include "launcher/args_internal.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "launcher/accel_config.h"
#include "launcher/slurm.h"
#include "launcher/yaml_flat.h"
#include "worker/config/worker_config.h"

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

static void note(struct launch_args *a, int id, const char *value, const char *origin)
{
    launch_set_text(a->origins[id].text, sizeof a->origins[id].text, value);
    launch_set_text(a->origins[id].origin, sizeof a->origins[id].origin, origin);
}

static int apply_noted(struct launch_args *a, struct parse_state *ps, int id, const char *v, const char *src,
                       const char *origin)
{
    FSDP_TRY(launch_opt_apply(a, id, v, src, &ps->port_set, &ps->num_processes));
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
    launch_set_text(s->key, sizeof s->key, key);
    launch_set_text(s->value, sizeof s->value, value);
    launch_set_text(s->origin, sizeof s->origin, origin);
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
            if (launch_parse_bool(name + len + 1, "--cpu", &on))
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
            int id = launch_opt_find(s[i].launch_flag, strlen(s[i].launch_flag));
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
    a->status_port = -1;
    strcpy(a->status_addr, "127.0.0.1");
    a->status_stale_s = 30;
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
            id = launch_opt_find_short(arg[1]);
            if (id >= 0 && arg[2])
                eq = arg + 1; /* value glued on: -r3 */
            if (id >= 0 && arg[2] && launch_opts[id].kind == K_BOOL)
                id = -1;
        } else {
            const char *name = arg + 2;
            eq = strchr(name, '=');
            id = launch_opt_find(name, eq ? (size_t)(eq - name) : strlen(name));
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
        snprintf(src, sizeof src, "--%s", launch_opts[id].name);
        const char *val;
        if (launch_opts[id].kind != K_VALUE)
            val = eq ? eq + 1 : "true";
        else if (eq)
            val = eq + 1;
        else if (i + 1 < argc)
            val = argv[++i];
        else
            return error_set(FSDP_EINVAL, "%s needs a value (%s)", src, launch_opts[id].help);
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
        for (size_t k = 0; launch_opts[id].name[k] && k + 5 < sizeof env; k++)
            env[4 + k] = (char)toupper((unsigned char)launch_opts[id].name[k]);
        const char *v = getenv(env);
        if (!v)
            continue;
        if (launch_opts[id].kind == K_BOOL && !*v)
            continue;
        FSDP_TRY(apply_noted(a, ps, id, v, env, env));
    }
    return 0;
}

static int finish(struct launch_args *a, struct parse_state *ps)
{
    if (!a->python[0]) {
        const char *pe = getenv("PYTHON_EXEC");
        launch_set_text(a->python, sizeof a->python, pe && *pe ? pe : "python3");
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
    for (int k = 0; k < 2; k++)
        if (a->dup_filters[k][0] && !a->log_dir[0])
            return error_set(FSDP_EINVAL, "--duplicate_%s_filters needs --log_dir: the matching lines go to "
                             "<log_dir>/<run_id>/attempt_<n>/filtered_%s.log", k ? "stderr" : "stdout",
                             k ? "stderr" : "stdout");
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

