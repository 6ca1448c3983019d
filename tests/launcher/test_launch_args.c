/* Unit tests of the launcher's configuration: SLURM hostlists, flag spellings, PET_* and SLURM_*. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fs.h"
#include "launcher/args.h"
#include "launcher/slurm.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static void expect_hosts(const char *list, const char *const *want, size_t n)
{
    char **h;
    size_t got;
    cr_assert_eq(slurm_expand_nodelist(list, &h, &got), 0, "%s: %s", list, error_message());
    cr_assert_eq(got, n, "%s: %zu hosts, want %zu", list, got, n);
    for (size_t i = 0; i < n; i++)
        cr_expect_str_eq(h[i], want[i], "%s: host %zu", list, i);
    slurm_free_hosts(h, got);
}

Test(slurm, nodelist_expansion)
{
    const char *a[] = {"gpu01", "gpu02", "gpu03", "gpu07", "login1"};
    expect_hosts("gpu[01-03,07],login1", a, 5);
    const char *b[] = {"node1"};
    expect_hosts("node1", b, 1);
    const char *c[] = {"r1-n8", "r1-n9", "r1-n10", "r2-n8", "r2-n9", "r2-n10"};
    expect_hosts("r[1-2]-n[8-10]", c, 6);
    const char *d[] = {"a0098", "a0099", "a0100", "b", "c5x"};
    expect_hosts("a[0098-0100],b,c[5]x", d, 5);
}

Test(slurm, nodelist_errors)
{
    char **h;
    size_t n;
    cr_expect_eq(slurm_expand_nodelist("gpu[01-03", &h, &n), FSDP_EINVAL);
    cr_expect_eq(slurm_expand_nodelist("gpu[3-1]", &h, &n), FSDP_EINVAL);
    cr_expect_eq(slurm_expand_nodelist("gpu[a-b]", &h, &n), FSDP_EINVAL);
    cr_expect_eq(slurm_expand_nodelist("", &h, &n), FSDP_EINVAL);
    cr_expect_eq(slurm_expand_nodelist("gpu[]", &h, &n), FSDP_EINVAL);
}

static int parse(struct launch_args *a, const char *const *argv)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    return launch_args_parse(argc, (char **)argv, a);
}

static void clear_env(void)
{
    const char *vars[] = {"SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_NNODES",
                          "SLURM_NODEID", "PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_NPROC_PER_NODE",
                          "PET_MASTER_PORT", "PET_STANDALONE", "CUDA_VISIBLE_DEVICES", NULL};
    for (int i = 0; vars[i]; i++)
        unsetenv(vars[i]);
}

Test(args, both_spellings_and_equals)
{
    clear_env();
    struct launch_args a;
    const char *argv[] = {"fsdp-launch", "--nnodes=2", "--node-rank", "1", "--nproc_per_node=3", "--master-addr",
                          "10.0.0.1", "--master_port=1234", "--max-restarts=2", "--monitor_interval", "0.5",
                          "--run_id", "abc", "--rdzv-timeout", "7", "--shutdown_timeout=3", "--role", "r",
                          "--log_level", "warn", "--", "prog", "--nnodes", "9", NULL};
    cr_assert_eq(parse(&a, argv), 0, "%s", error_message());
    cr_expect_eq(a.nnodes, 2);
    cr_expect_eq(a.node_rank, 1);
    cr_expect_eq(a.nproc_per_node, 3);
    cr_expect_str_eq(a.master_addr, "10.0.0.1");
    cr_expect_eq(a.master_port, 1234);
    cr_expect_eq(a.max_restarts, 2);
    cr_expect_float_eq(a.monitor_interval_s, 0.5, 1e-9);
    cr_expect_str_eq(a.run_id, "abc");
    cr_expect_float_eq(a.rdzv_timeout_s, 7, 1e-9);
    cr_expect_float_eq(a.shutdown_timeout_s, 3, 1e-9);
    cr_expect_str_eq(a.role, "r");
    cr_expect_eq(a.log_level, LOG_WARN);
    cr_assert_eq(a.prog_argc, 3, "the program's own flags must be left alone");
    cr_expect_str_eq(a.prog_argv[0], "prog");
    cr_expect_str_eq(a.prog_argv[1], "--nnodes");
    launch_args_free(&a);
}

Test(args, defaults_and_program_without_dashes)
{
    clear_env();
    struct launch_args a;
    const char *argv[] = {"fsdp-launch", "prog", "-x", NULL};
    cr_assert_eq(parse(&a, argv), 0, "%s", error_message());
    cr_expect_eq(a.nnodes, 1);
    cr_expect_eq(a.nproc_per_node, 1);
    cr_expect_eq(a.master_port, 0, "one node without a port: a free port, as torchrun");
    cr_expect_str_eq(a.master_addr, "127.0.0.1");
    cr_expect_float_eq(a.shutdown_timeout_s, 30, 1e-9);
    cr_expect_eq(a.prog_argc, 2);
    cr_expect_eq(strlen(a.run_id), 16, "one node gets a random run id");
    launch_args_free(&a);
}

Test(args, pet_environment_below_flags)
{
    clear_env();
    setenv("PET_NNODES", "4", 1);
    setenv("PET_NODE_RANK", "2", 1);
    setenv("PET_MASTER_ADDR", "head", 1);
    setenv("PET_NPROC_PER_NODE", "cpu", 1);
    struct launch_args a;
    const char *argv[] = {"fsdp-launch", "--node_rank", "3", "prog", NULL};
    cr_assert_eq(parse(&a, argv), 0, "%s", error_message());
    cr_expect_eq(a.nnodes, 4);
    cr_expect_eq(a.node_rank, 3, "a flag beats PET_NODE_RANK");
    cr_expect_str_eq(a.master_addr, "head");
    cr_expect_geq(a.nproc_per_node, 1);
    cr_expect_str_eq(a.run_id, "none", "several nodes share the default run id");
    launch_args_free(&a);
}

Test(args, slurm_fills_what_flags_leave_unset)
{
    clear_env();
    setenv("SLURM_JOB_ID", "777", 1);
    setenv("SLURM_JOB_NODELIST", "gpu[01-03,07],login1", 1);
    setenv("SLURM_JOB_NUM_NODES", "5", 1);
    setenv("SLURM_NODEID", "3", 1);
    struct launch_args a;
    const char *argv[] = {"fsdp-launch", "prog", NULL};
    cr_assert_eq(parse(&a, argv), 0, "%s", error_message());
    cr_expect_eq(a.nnodes, 5);
    cr_expect_eq(a.node_rank, 3);
    cr_expect_str_eq(a.master_addr, "gpu01");
    cr_expect_str_eq(a.run_id, "777");
    cr_expect_eq(a.slurm_nhosts, 5);
    launch_args_free(&a);
    const char *argv2[] = {"fsdp-launch", "--master_addr", "other", "--nnodes", "5", "--node_rank", "0", "prog", NULL};
    cr_assert_eq(parse(&a, argv2), 0, "%s", error_message());
    cr_expect_str_eq(a.master_addr, "other", "flags win over SLURM");
    cr_expect_eq(a.node_rank, 0);
    launch_args_free(&a);
}

Test(args, standalone_and_nproc_forms)
{
    clear_env();
    struct launch_args a;
    const char *argv[] = {"fsdp-launch", "--standalone", "--nproc_per_node", "auto", "prog", NULL};
    cr_assert_eq(parse(&a, argv), 0, "%s", error_message());
    cr_expect(a.standalone);
    cr_expect_eq(a.master_port, 0);
    cr_expect_eq(a.nnodes, 1);
    cr_expect_geq(a.nproc_per_node, 1);
    launch_args_free(&a);
    setenv("CUDA_VISIBLE_DEVICES", "0,1,2", 1);
    const char *argv2[] = {"fsdp-launch", "--nproc_per_node", "gpu", "prog", NULL};
    cr_assert_eq(parse(&a, argv2), 0, "%s", error_message());
    cr_expect_eq(a.nproc_per_node, 3);
    launch_args_free(&a);
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    cr_expect_eq(parse(&a, argv2), FSDP_EINVAL, "no visible GPU");
    cr_expect(strstr(error_message(), "shows no GPU"), "%s", error_message());
    launch_args_free(&a);
}

Test(args, std_masks)
{
    cr_expect_eq(launch_std_mask("3", 5), 3);
    cr_expect_eq(launch_std_mask("", 0), 0);
    cr_expect_eq(launch_std_mask("0:1,2:3", 0), 1);
    cr_expect_eq(launch_std_mask("0:1,2:3", 2), 3);
    cr_expect_eq(launch_std_mask("0:1,2:3", 1), 0);
}

Test(args, rdzv_endpoint_and_backend)
{
    clear_env();
    struct launch_args a;
    const char *argv[] = {"fsdp-launch", "--rdzv-backend=c10d", "--rdzv_endpoint", "head01:29411", "prog", NULL};
    cr_assert_eq(parse(&a, argv), 0, "%s", error_message());
    cr_expect_str_eq(a.master_addr, "head01");
    cr_expect_eq(a.master_port, 29411);
    launch_args_free(&a);
    const char *argv2[] = {"fsdp-launch", "--rdzv_endpoint=[fe80::1]:1234", "prog", NULL};
    cr_assert_eq(parse(&a, argv2), 0, "%s", error_message());
    cr_expect_str_eq(a.master_addr, "fe80::1");
    cr_expect_eq(a.master_port, 1234);
    launch_args_free(&a);
    const char *argv3[] = {"fsdp-launch", "--rdzv_endpoint", "head02", "prog", NULL};
    cr_assert_eq(parse(&a, argv3), 0, "%s", error_message());
    cr_expect_str_eq(a.master_addr, "head02");
    cr_expect_eq(a.master_port, 29500);
    launch_args_free(&a);
    const char *argv4[] = {"fsdp-launch", "--rdzv_backend", "etcd", "prog", NULL};
    cr_expect_eq(parse(&a, argv4), FSDP_EUNSUPPORTED);
    cr_expect(strstr(error_message(), "'etcd' is not supported"), "%s", error_message());
    launch_args_free(&a);
}

/* An IPv6 endpoint whose bracket does not close (or holds nothing, or is followed by more than :PORT) is
 * refused naming the flag, instead of becoming an address nothing answers on. */
Test(args, rdzv_endpoint_brackets_must_close)
{
    clear_env();
    struct launch_args a;
    static const char *const bad[] = {"[::1", "::1]", "[::1:29500", "[]:29500", "[::1]x", "[::1]29500", "[", "]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *argv[] = {"fsdp-launch", "--rdzv_endpoint", bad[i], "prog", NULL};
        cr_expect_eq(parse(&a, argv), FSDP_EINVAL, "'%s' accepted", bad[i]);
        cr_expect(strstr(error_message(), "--rdzv_endpoint") && strstr(error_message(), bad[i]), "%s: %s", bad[i],
                  error_message());
        launch_args_free(&a);
    }
    const char *ok[] = {"fsdp-launch", "--rdzv_endpoint", "[::1]", "prog", NULL};
    cr_assert_eq(parse(&a, ok), 0, "%s", error_message());
    cr_expect_str_eq(a.master_addr, "::1");
    cr_expect_eq(a.master_port, 29500);
    launch_args_free(&a);
    const char *bare[] = {"fsdp-launch", "--rdzv_endpoint", "::1", "prog", NULL};
    cr_assert_eq(parse(&a, bare), 0, "%s", error_message());
    cr_expect_str_eq(a.master_addr, "::1");
    launch_args_free(&a);
}

/* Every flag of the issue, each in three spellings: --name_with_underscores, --name-with-dashes (both
 * --flag value and --flag=value) and PET_NAME. `check` says where the value must land. */
struct flag_case {
    const char *name, *value;
    bool (*check)(const struct launch_args *a);
};

static bool ck_nnodes(const struct launch_args *a) { return a->nnodes == 3; }
static bool ck_node_rank(const struct launch_args *a) { return a->node_rank == 2; }
static bool ck_nproc(const struct launch_args *a) { return a->nproc_per_node == 5; }
static bool ck_addr(const struct launch_args *a) { return strcmp(a->master_addr, "10.1.2.3") == 0; }
static bool ck_port(const struct launch_args *a) { return a->master_port == 4321; }
static bool ck_standalone(const struct launch_args *a) { return a->standalone && a->master_port == 0; }
static bool ck_restarts(const struct launch_args *a) { return a->max_restarts == 6; }
static bool ck_monitor(const struct launch_args *a) { return a->monitor_interval_s == 0.25; }
static bool ck_run_id(const struct launch_args *a) { return strcmp(a->run_id, "job42") == 0; }
static bool ck_rdzv_timeout(const struct launch_args *a) { return a->rdzv_timeout_s == 12.5; }
static bool ck_log_dir(const struct launch_args *a) { return strcmp(a->log_dir, "/tmp/logs") == 0; }
static bool ck_redirects(const struct launch_args *a) { return strcmp(a->redirects, "0:3,1:2") == 0; }
static bool ck_tee(const struct launch_args *a) { return strcmp(a->tee, "2") == 0; }
static bool ck_filter(const struct launch_args *a) { return strcmp(a->local_ranks_filter, "0,2") == 0; }
static bool ck_role(const struct launch_args *a) { return strcmp(a->role, "trainer") == 0; }
static bool ck_shutdown(const struct launch_args *a) { return a->shutdown_timeout_s == 4; }
static bool ck_log_level(const struct launch_args *a) { return a->log_level == LOG_ERROR; }
static bool ck_endpoint(const struct launch_args *a)
{
    return strcmp(a->master_addr, "head9") == 0 && a->master_port == 2345;
}
static bool ck_backend(const struct launch_args *a) { (void)a; return true; }

static const struct flag_case flag_cases[] = {
    {"nnodes", "3", ck_nnodes},
    {"node_rank", "2", ck_node_rank},
    {"nproc_per_node", "5", ck_nproc},
    {"master_addr", "10.1.2.3", ck_addr},
    {"master_port", "4321", ck_port},
    {"standalone", "true", ck_standalone},
    {"max_restarts", "6", ck_restarts},
    {"monitor_interval", "0.25", ck_monitor},
    {"rdzv_id", "job42", ck_run_id},
    {"run_id", "job42", ck_run_id},
    {"rdzv_timeout", "12.5", ck_rdzv_timeout},
    {"log_dir", "/tmp/logs", ck_log_dir},
    {"redirects", "0:3,1:2", ck_redirects},
    {"tee", "2", ck_tee},
    {"local_ranks_filter", "0,2", ck_filter},
    {"role", "trainer", ck_role},
    {"shutdown_timeout", "4", ck_shutdown},
    {"log_level", "error", ck_log_level},
    {"rdzv_endpoint", "head9:2345", ck_endpoint},
    {"rdzv_backend", "c10d", ck_backend},
};

Test(args, every_flag_in_every_spelling)
{
    clear_env();
    for (size_t i = 0; i < sizeof flag_cases / sizeof flag_cases[0]; i++) {
        const struct flag_case *fc = &flag_cases[i];
        char under[64], dash[64], eq[128], pet[64];
        snprintf(under, sizeof under, "--%s", fc->name);
        snprintf(dash, sizeof dash, "--%s", fc->name);
        for (char *p = dash; *p; p++)
            if (*p == '_')
                *p = '-';
        snprintf(eq, sizeof eq, "%s=%s", dash, fc->value);
        snprintf(pet, sizeof pet, "PET_");
        for (size_t k = 0; fc->name[k]; k++)
            pet[4 + k] = (char)toupper((unsigned char)fc->name[k]);
        pet[4 + strlen(fc->name)] = 0;
        /* A neutral flag in front (so the flag under test is not first); node_rank needs room in --nnodes. */
        const char *nn = strcmp(fc->name, "node_rank") == 0      ? "--nnodes=4"
                         : strcmp(fc->name, "rdzv_backend") == 0 ? "--role=x"
                                                                 : "--rdzv_backend=static";
        bool is_bool = strcmp(fc->name, "standalone") == 0;
        const char *forms[3][6] = {
            {"fsdp-launch", nn, under, is_bool ? "prog" : fc->value, is_bool ? NULL : "prog", NULL},
            {"fsdp-launch", nn, dash, is_bool ? "prog" : fc->value, is_bool ? NULL : "prog", NULL},
            {"fsdp-launch", nn, eq, "prog", NULL, NULL},
        };
        for (int f = 0; f < 3; f++) {
            struct launch_args a;
            int rc = parse(&a, forms[f]);
            cr_expect_eq(rc, 0, "%s %s: %s", forms[f][2], forms[f][3], error_message());
            cr_expect(rc != 0 || fc->check(&a), "%s %s: value not applied", forms[f][2], forms[f][3]);
            launch_args_free(&a);
        }
        setenv(pet, fc->value, 1);
        const char *from_env[] = {"fsdp-launch", nn, "prog", NULL};
        struct launch_args a;
        int rc = parse(&a, from_env);
        cr_expect_eq(rc, 0, "%s=%s: %s", pet, fc->value, error_message());
        cr_expect(rc != 0 || fc->check(&a), "%s=%s: value not applied", pet, fc->value);
        launch_args_free(&a);
        unsetenv(pet);
    }
}

/* --log_max_bytes: a size with an optional k/M/G suffix, 0 = unbounded, too small or malformed refused. */
Test(args, log_max_bytes_sizes)
{
    clear_env();
    static const struct {
        const char *v;
        long long want;
    } ok[] = {{"0", 0}, {"4096", 4096}, {"64k", 65536}, {"64K", 65536}, {"10M", 10ll << 20}, {"2G", 2ll << 30}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        struct launch_args a;
        const char *argv[] = {"fsdp-launch", "--log-max-bytes", ok[i].v, "prog", NULL};
        cr_assert_eq(parse(&a, argv), 0, "%s: %s", ok[i].v, error_message());
        cr_expect_eq(a.log_max_bytes, ok[i].want, "%s", ok[i].v);
        launch_args_free(&a);
    }
    setenv("PET_LOG_MAX_BYTES", "1M", 1);
    struct launch_args a;
    const char *env_argv[] = {"fsdp-launch", "prog", NULL};
    cr_assert_eq(parse(&a, env_argv), 0, "%s", error_message());
    cr_expect_eq(a.log_max_bytes, 1 << 20);
    launch_args_free(&a);
    unsetenv("PET_LOG_MAX_BYTES");
    static const char *const bad[] = {"-1", "100", "1x", "k", "", "12.5M", "99999999999G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *argv[] = {"fsdp-launch", "--log_max_bytes", bad[i], "prog", NULL};
        cr_expect_eq(parse(&a, argv), FSDP_EINVAL, "'%s' accepted", bad[i]);
        cr_expect(strstr(error_message(), "--log_max_bytes"), "%s: %s", bad[i], error_message());
        launch_args_free(&a);
    }
}

/* ---- torchrun's other flags, accelerate's spellings and configs ---------------------------------------- */

static const struct launch_setting *setting(const struct launch_args *a, const char *key)
{
    const struct launch_setting *found = NULL;
    for (int i = 0; i < a->n_settings; i++)
        if (strcmp(a->settings[i].key, key) == 0)
            found = &a->settings[i];
    return found;
}

static const char *fixture(const char *name)
{
    static char buf[4][FSDP_PATH_MAX];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, 4096, "%s/tests/launcher/accelerate/%s", getenv("FSDP_SOURCE_ROOT"), name);
    return b;
}

Test(args, python_modes_and_short_flags)
{
    clear_env();
    struct launch_args a;
    const char *m[] = {"fsdp-launch", "-m", "pkg.train", "--lr", "1", NULL};
    cr_assert_eq(parse(&a, m), 0, "%s", error_message());
    cr_expect_eq(a.mode, LAUNCH_MODULE);
    cr_expect_str_eq(a.prog_argv[0], "pkg.train");
    cr_expect_eq(a.prog_argc, 3);
    launch_args_free(&a);
    const char *np[] = {"fsdp-launch", "--no-python", "-r", "3", "-t3", "--log_dir", "/tmp/x", "prog", NULL};
    cr_assert_eq(parse(&a, np), 0, "%s", error_message());
    cr_expect_eq(a.mode, LAUNCH_NO_PYTHON);
    cr_expect_str_eq(a.redirects, "3");
    cr_expect_str_eq(a.tee, "3");
    launch_args_free(&a);
    const char *rp[] = {"fsdp-launch", "--run_path", "--no_python", "/abs/train.py", NULL};
    cr_assert_eq(parse(&a, rp), 0, "%s", error_message());
    cr_expect_eq(a.mode, LAUNCH_RUN_PATH, "torchrun: --run_path takes precedence over --no_python");
    launch_args_free(&a);
    const char *both[] = {"fsdp-launch", "--no_python", "-m", "x", NULL};
    cr_expect_eq(parse(&a, both), FSDP_EINVAL);
    cr_expect(strstr(error_message(), "--no_python and --module cannot be used together"), "%s", error_message());
    launch_args_free(&a);
    setenv("PYTHON_EXEC", "/opt/py/bin/python3.12", 1);
    const char *py[] = {"fsdp-launch", "train.py", NULL};
    cr_assert_eq(parse(&a, py), 0, "%s", error_message());
    cr_expect_str_eq(a.python, "/opt/py/bin/python3.12", "torchrun's PYTHON_EXEC");
    launch_args_free(&a);
    const char *py2[] = {"fsdp-launch", "--python", "python3.11", "train.py", NULL};
    cr_assert_eq(parse(&a, py2), 0, "%s", error_message());
    cr_expect_str_eq(a.python, "python3.11", "--python wins over PYTHON_EXEC");
    launch_args_free(&a);
    unsetenv("PYTHON_EXEC");
}

Test(args, rdzv_conf_signals_and_accepted_flags)
{
    clear_env();
    struct launch_args a;
    const char *ok[] = {"fsdp-launch", "--rdzv_conf", "join_timeout=33,keep_alive_interval=2,keep_alive_max_attempt=4,"
                        "last_call_timeout=5,use_libuv=1,is_host=true", "--start_method", "fork",
                        "--event_log_handler", "null", "--signals_to_handle", "SIGTERM,SIGUSR1,INT",
                        "--virtual_local_rank", "--local_addr", "node7", "--duplicate_stdout_filters=", "prog", NULL};
    cr_assert_eq(parse(&a, ok), 0, "%s", error_message());
    cr_expect_float_eq(a.rdzv_timeout_s, 33, 1e-9);
    cr_expect_float_eq(a.heartbeat_timeout_s, 8, 1e-9, "keep_alive_interval x keep_alive_max_attempt");
    cr_expect_eq(a.n_signals, 3);
    cr_expect_eq(a.signals[1], SIGUSR1);
    cr_expect_eq(a.signals[2], SIGINT);
    cr_expect(a.virtual_local_rank);
    cr_expect_str_eq(a.local_addr, "node7");
    launch_args_free(&a);

    struct {
        const char *flag, *value, *needle;
    } refused[] = {
        {"--rdzv_conf", "frobnicate=1", "unknown key 'frobnicate'"},
        {"--start_method", "thread", "'thread' is not spawn, fork or forkserver"},
        {"--event_log_handler", "console", "fsdp-launch's events are its log lines"},
        {"--logs_specs", "mine", "names a Python entry point (torchrun.logs_specs)"},
        {"--numa_binding", "node", "does not bind workers to NUMA nodes"},
        {"--signals_to_handle", "SIGKILL", "cannot be forwarded"},
        {"--signals_to_handle", "SIGNOPE", "not a signal name"},
        {"--duplicate_stdout_filters", "loss", "--duplicate_stdout_filters needs --log_dir"},
        {"--print_completion", "bash", "no completion scripts"},
        {"--nproc_per_node", "xpu", "no Intel XPU backend"},
        {"--rdzv_backend", "etcd-v2", "'etcd-v2' is not supported"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        const char *argv[] = {"fsdp-launch", refused[i].flag, refused[i].value, "prog", NULL};
        int rc = parse(&a, argv);
        cr_expect_neq(rc, 0, "%s %s was accepted", refused[i].flag, refused[i].value);
        cr_expect(strstr(error_message(), refused[i].needle), "%s %s: %s", refused[i].flag, refused[i].value,
                  error_message());
        launch_args_free(&a);
    }
    const char *host[] = {"fsdp-launch", "--nnodes", "2", "--node_rank", "1", "--rdzv_conf", "is_host=1", "prog", NULL};
    cr_expect_eq(parse(&a, host), FSDP_EINVAL);
    cr_expect(strstr(error_message(), "the store is hosted by node 0, and this is node 1"), "%s", error_message());
    launch_args_free(&a);
    const char *c10d[] = {"fsdp-launch", "--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "h:1", "prog",
                          NULL};
    cr_expect_eq(parse(&a, c10d), FSDP_EINVAL);
    cr_expect(strstr(error_message(), "needs each node's --node_rank"), "%s", error_message());
    launch_args_free(&a);
    const char *shut[] = {"fsdp-launch", "prog", NULL};
    setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7", 1);
    cr_assert_eq(parse(&a, shut), 0, "%s", error_message());
    cr_expect_float_eq(a.shutdown_timeout_s, 7, 1e-9, "torchrun's TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
    launch_args_free(&a);
    unsetenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
}

Test(args, accelerate_spellings)
{
    clear_env();
    struct launch_args a;
    const char *argv[] = {"fsdp-launch", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.1.1.1",
                          "--main-process-port", "2222", "--num_processes", "8", "--use_fsdp", "--fsdp_version", "1",
                          "--fsdp_sharding_strategy", "HYBRID_SHARD", "--fsdp_transformer_layer_cls_to_wrap",
                          "GPT2Block,DecoderBlock", "--fsdp_use_orig_params", "false", "--mixed_precision", "bf16",
                          "--fsdp-offload-params", "--cpu", "--num_cpu_threads_per_process", "3", "--gpu_ids",
                          "0,2", "--multi_gpu", "--same_network", "prog", NULL};
    cr_assert_eq(parse(&a, argv), 0, "%s", error_message());
    cr_expect_eq(a.nnodes, 2);
    cr_expect_eq(a.node_rank, 1);
    cr_expect_str_eq(a.master_addr, "10.1.1.1");
    cr_expect_eq(a.master_port, 2222);
    cr_expect_eq(a.nproc_per_node, 4, "num_processes counts all nodes' workers");
    cr_expect_eq(a.omp_threads, 3);
    cr_expect_str_eq(a.gpu_ids, "0,2");
    struct {
        const char *key, *value;
    } want[] = {{"fsdp.enable", "true"},
                {"fsdp.version", "1"},
                {"fsdp.sharding_strategy", "HYBRID_SHARD"},
                {"fsdp.transformer_layer_cls_to_wrap", "GPT2Block,DecoderBlock"},
                {"fsdp.use_orig_params", "false"},
                {"fsdp.mixed_precision", "bf16"},
                {"fsdp.offload_params", "true"},
                {"train.device", "cpu"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct launch_setting *s = setting(&a, want[i].key);
        cr_assert_not_null(s, "no worker setting %s", want[i].key);
        cr_expect_str_eq(s->value, want[i].value, "%s", want[i].key);
        cr_expect(s->over_file, "%s: the launcher's command line goes over the INI file", want[i].key);
    }
    cr_expect(strstr(setting(&a, "fsdp.version")->origin, "--fsdp_version"), "%s", setting(&a, "fsdp.version")->origin);
    launch_args_free(&a);
    const char *enable[] = {"fsdp-launch", "--fsdp_enable", "prog", NULL};
    cr_assert_eq(parse(&a, enable), 0, "%s", error_message());
    cr_expect_str_eq(setting(&a, "fsdp.enable")->value, "true", "SimpleTuner's --fsdp_enable");
    launch_args_free(&a);
    const char *bad[] = {"fsdp-launch", "--num_processes", "5", "--nnodes", "2", "prog", NULL};
    cr_expect_eq(parse(&a, bad), FSDP_EINVAL);
    cr_expect(strstr(error_message(), "num_processes 5 (--num_processes) is not a multiple of nnodes 2"), "%s",
              error_message());
    launch_args_free(&a);
    const char *typo[] = {"fsdp-launch", "--fsdp_verison", "2", "prog", NULL};
    cr_expect_eq(parse(&a, typo), FSDP_EINVAL);
    cr_expect(strstr(error_message(), "did you mean '--fsdp_version'"), "%s", error_message());
    launch_args_free(&a);
    const char *badv[] = {"fsdp-launch", "--fsdp_state_dict_type", "LOCAL_STATE_DICT", "prog", NULL};
    cr_expect_eq(parse(&a, badv), FSDP_EINVAL);
    cr_expect(strstr(error_message(), "--fsdp_state_dict_type LOCAL_STATE_DICT"), "%s", error_message());
    launch_args_free(&a);
}

Test(args, accelerate_fsdp2_yaml)
{
    clear_env();
    struct launch_args a;
    const char *path = fixture("fsdp2.yaml");
    const char *argv[] = {"fsdp-launch", "--config_file", path, "prog", NULL};
    cr_assert_eq(parse(&a, argv), 0, "%s", error_message());
    cr_expect_eq(a.nnodes, 2);
    cr_expect_eq(a.node_rank, 1);
    cr_expect_eq(a.nproc_per_node, 2, "num_processes 4 over num_machines 2");
    cr_expect_str_eq(a.master_addr, "10.0.0.7");
    cr_expect_eq(a.master_port, 29511);
    struct {
        const char *key, *value, *yaml_key;
    } want[] = {{"fsdp.enable", "true", "distributed_type"},
                {"fsdp.version", "2", "fsdp_config.fsdp_version"},
                {"fsdp.reshard_after_forward", "false", "fsdp_config.fsdp_reshard_after_forward"},
                {"fsdp.transformer_layer_cls_to_wrap", "GPT2Block", "fsdp_config.fsdp_transformer_layer_cls_to_wrap"},
                {"checkpoint.state_dict_type", "FULL_STATE_DICT", "fsdp_config.fsdp_state_dict_type"},
                {"checkpoint.cpu_ram_efficient_loading", "true", "fsdp_config.fsdp_cpu_ram_efficient_loading"},
                {"model.activation_checkpointing", "true", "fsdp_config.fsdp_activation_checkpointing"},
                {"fsdp.mixed_precision", "bf16", "mixed_precision"},
                {"train.device", "cpu", "use_cpu"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct launch_setting *s = setting(&a, want[i].key);
        cr_assert_not_null(s, "no worker setting %s", want[i].key);
        cr_expect_str_eq(s->value, want[i].value, "%s", want[i].key);
        cr_expect(!s->over_file, "%s: a YAML value goes under the INI file", want[i].key);
        cr_expect(strstr(s->origin, path) && strstr(s->origin, want[i].yaml_key), "%s: origin %s", want[i].key,
                  s->origin);
    }
    int debug_listed = 0;
    for (int i = 0; i < a.n_ignored; i++)
        debug_listed += strncmp(a.ignored[i], "debug (line ", 12) == 0;
    cr_expect_eq(debug_listed, 1, "keys without meaning are listed once as ignored");
    launch_args_free(&a);

    /* the command line wins over the YAML, PET_* too */
    setenv("PET_MASTER_PORT", "3333", 1);
    const char *over[] = {"fsdp-launch", "--config_file", path, "--nnodes", "4", "--nproc_per_node", "1", "prog", NULL};
    cr_assert_eq(parse(&a, over), 0, "%s", error_message());
    cr_expect_eq(a.nnodes, 4);
    cr_expect_eq(a.nproc_per_node, 1, "--nproc_per_node beats the YAML's num_processes");
    cr_expect_eq(a.master_port, 3333, "PET_MASTER_PORT beats the YAML");
    launch_args_free(&a);
    unsetenv("PET_MASTER_PORT");
}

Test(args, accelerate_fsdp1_json_and_refusals)
{
    clear_env();
    struct launch_args a;
    const char *v1[] = {"fsdp-launch", "--config_file", fixture("fsdp1.yaml"), "prog", NULL};
    cr_assert_eq(parse(&a, v1), 0, "%s", error_message());
    cr_expect_eq(a.nproc_per_node, 2);
    cr_expect_str_eq(setting(&a, "fsdp.sharding_strategy")->value, "SHARD_GRAD_OP",
                     "FSDP1's strategy is stored under fsdp_reshard_after_forward");
    cr_expect_str_eq(setting(&a, "fsdp.auto_wrap_policy")->value, "SIZE_BASED_WRAP");
    cr_expect_str_eq(setting(&a, "fsdp.min_num_params")->value, "100000");
    cr_expect_str_eq(setting(&a, "fsdp.backward_prefetch")->value, "BACKWARD_POST");
    cr_expect_str_eq(setting(&a, "fsdp.use_orig_params")->value, "true");
    cr_expect_str_eq(setting(&a, "fsdp.mixed_precision")->value, "no");
    launch_args_free(&a);
    const char *json[] = {"fsdp-launch", "--config_file", fixture("default.json"), "prog", NULL};
    cr_assert_eq(parse(&a, json), 0, "%s", error_message());
    cr_expect_str_eq(setting(&a, "fsdp.enable")->value, "false", "distributed_type NO: no sharding");
    cr_expect_str_eq(setting(&a, "train.device")->value, "cpu");
    launch_args_free(&a);
    const char *cpu[] = {"fsdp-launch", "--config_file", fixture("multi_cpu.yaml"), "prog", NULL};
    cr_assert_eq(parse(&a, cpu), 0, "%s", error_message());
    cr_expect_str_eq(setting(&a, "fsdp.enable")->value, "false", "MULTI_CPU: replicated data parallel");
    launch_args_free(&a);
    const char *ds[] = {"fsdp-launch", "--config_file", fixture("deepspeed.yaml"), "prog", NULL};
    cr_expect_eq(parse(&a, ds), FSDP_EUNSUPPORTED);
    cr_expect(strstr(error_message(), "distributed_type: DEEPSPEED is not supported"), "%s", error_message());
    launch_args_free(&a);
}

Test(args, yaml_errors_name_file_and_line)
{
    clear_env();
    char dir[] = "/tmp/fsdp-yaml-XXXXXX";
    cr_assert(mkdtemp(dir));
    struct {
        const char *text, *needle;
    } cases[] = {
        {"num_machines: 2\nnum_machines: 3\n", ":2: key 'num_machines' is given twice (also on line 1)"},
        {"fsdp_config:\n  fsdp_version: 7\ndistributed_type: FSDP\n",
         ":2: fsdp_config.fsdp_version = 7: "},
        {"distributed_type: FSDP\nfsdp_config:\n  fsdp_state_dict_type: LOCAL_STATE_DICT\n",
         ":3: fsdp_config.fsdp_state_dict_type = LOCAL_STATE_DICT"},
        {"compute_environment: AMAZON_SAGEMAKER\n", ":1: compute_environment: AMAZON_SAGEMAKER is not supported"},
        {"num_machines: [1, 2\n", "not valid YAML"},
        {"- a\n- b\n", "must be a mapping"},
        {"", "is empty"},
        {"num_machines: many\n", ":1 (num_machines): 'many' is not an integer"},
        {"a: &x 1\nb: *x\n", "uses an alias"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/c%zu.yaml", dir, i);
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f);
        fputs(cases[i].text, f);
        fclose(f);
        struct launch_args a;
        const char *argv[] = {"fsdp-launch", "--config_file", path, "prog", NULL};
        cr_expect_neq(parse(&a, argv), 0, "case %zu accepted", i);
        cr_expect(strstr(error_message(), cases[i].needle), "case %zu: %s", i, error_message());
        cr_expect(strstr(error_message(), path), "case %zu does not name the file: %s", i, error_message());
        launch_args_free(&a);
    }
    /* hostile sizes: a file over the bound is refused before parsing; many keys stop at the key bound (each
     * one is checked against the others, so an unbounded count would be quadratic) */
    struct {
        const char *name, *needle;
        long keys, pad;
    } big[] = {{"big.yaml", "an accelerate config file is at most 1048576 bytes", 0, 2 << 20},
               {"keys.yaml", "more than 4096 keys", 5000, 0}};
    for (size_t i = 0; i < 2; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", dir, big[i].name);
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f);
        for (long k = 0; k < big[i].keys; k++)
            fprintf(f, "k%ld: 1\n", k);
        for (long k = 0; k < big[i].pad; k += 64)
            fputs("# ..............................................................\n", f);
        fclose(f);
        struct launch_args a;
        const char *argv[] = {"fsdp-launch", "--config_file", path, "prog", NULL};
        cr_expect_neq(parse(&a, argv), 0, "%s accepted", big[i].name);
        cr_expect(strstr(error_message(), big[i].needle) && strstr(error_message(), path), "%s: %s", big[i].name,
                  error_message());
        launch_args_free(&a);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    struct launch_args a;
    const char *missing[] = {"fsdp-launch", "--config_file", "/nonexistent/acc.yaml", "prog", NULL};
    cr_expect_eq(parse(&a, missing), FSDP_ENOTFOUND);
    cr_expect(strstr(error_message(), "/nonexistent/acc.yaml: cannot open"), "%s", error_message());
    launch_args_free(&a);
}

/* A FIFO as --config_file is refused by its type before any read: a blocking open of a FIFO with no writer
 * would hang the launcher (the test's timeout turns a hang into a failure). */
Test(args, fifo_config_file_refused, .timeout = 20)
{
    clear_env();
    char dir[] = "/tmp/fsdp-yaml-XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/acc.yaml", dir);
    cr_assert_eq(mkfifo(path, 0600), 0, "mkfifo %s: %s", path, strerror(errno));
    struct launch_args a;
    const char *argv[] = {"fsdp-launch", "--config_file", path, "prog", NULL};
    int rc = parse(&a, argv);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", error_message());
    launch_args_free(&a);
    unlink(path);
    rmdir(dir);
    cr_expect_eq(rc, FSDP_EINVAL, "%s", msg);
    cr_expect(strstr(msg, path) && strstr(msg, "is not a regular file (it is a FIFO)"), "%s", msg);
}

Test(args, print_config_json_names_origins)
{
    clear_env();
    struct launch_args a;
    const char *argv[] = {"fsdp-launch", "--config_file", fixture("fsdp2.yaml"), "--node_rank", "0",
                          "--fsdp_version", "1", "--print-config=json", NULL};
    cr_assert_eq(parse(&a, argv), 0, "%s", error_message());
    cr_expect(a.print_config && a.print_config_json);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(launch_args_print(&a, f, true), 0);
    fclose(f);
    cJSON *j = cJSON_Parse(buf);
    cr_assert_not_null(j, "%s", buf);
    const cJSON *launch = cJSON_GetObjectItem(j, "launch");
    cr_expect_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(launch, "node_rank"), "origin")->valuestring,
                     "--node_rank");
    cr_expect(strstr(cJSON_GetObjectItem(cJSON_GetObjectItem(launch, "nnodes"), "origin")->valuestring,
                     "(num_machines)"));
    cr_expect(strstr(cJSON_GetObjectItem(cJSON_GetObjectItem(launch, "nproc_per_node"), "origin")->valuestring,
                     "num_processes 4 / nnodes 2"));
    cr_expect_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(launch, "max_restarts"), "origin")->valuestring,
                     "default");
    int layers[2] = {0, 0};
    const cJSON *w;
    cJSON_ArrayForEach(w, cJSON_GetObjectItem(j, "worker"))
    {
        if (strcmp(cJSON_GetObjectItem(w, "key")->valuestring, "fsdp.version") == 0)
            layers[strcmp(cJSON_GetObjectItem(w, "layer")->valuestring, "over_file") == 0]++;
    }
    cr_expect(layers[0] == 1 && layers[1] == 1, "fsdp.version from the YAML (under) and the flag (over)");
    cr_expect_gt(cJSON_GetArraySize(cJSON_GetObjectItem(j, "ignored")), 0);
    char *settings = launch_args_settings_json(&a);
    cJSON *s = cJSON_Parse(settings);
    cr_expect(cJSON_IsArray(cJSON_GetObjectItem(s, "under_file")) && cJSON_IsArray(cJSON_GetObjectItem(s, "over_file")));
    cJSON_Delete(s);
    free(settings);
    cJSON_Delete(j);
    free(buf);
    launch_args_free(&a);
}
