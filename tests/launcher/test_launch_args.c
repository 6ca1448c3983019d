/* Unit tests of the launcher's configuration: SLURM hostlists, flag spellings, PET_* and SLURM_*. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "launcher/args.h"
#include "launcher/slurm.h"

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
    cr_expect_eq(a.master_port, 29500);
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
