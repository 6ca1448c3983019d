/* A stock PyTorch 2.x FSDP2 job (tests/launcher/torch/fsdp2_train.py, gloo on CPU, init_process_group
 * env://) under fsdp-launch, its store acting as torchrun's agent store: the losses equal those under the
 * PyPI venv's torchrun at world 2; two nodes over loopback give the same losses; a rank that raises tears
 * the job down and is named as the root cause; --max_restarts restarts the job, which then finishes.
 * Needs the PyPI venv (torch); skipped with a message without it. */
#include "tests/util/launch_util.h"
#include "tests/util/tu_venv.h"

#include <cjson/cJSON.h>

#define STEPS 6

struct tj {
    char *dir;
    char py[FSDP_PATH_MAX], torchrun[FSDP_PATH_MAX], script[FSDP_PATH_MAX];
    char py_env[FSDP_PATH_MAX + 32]; /* + 32: "KEY=" and a path */
};

static void tj_setup(struct tj *t)
{
    char why[4400];
    if (tu_venv_python("torch", t->py, sizeof t->py, why, sizeof why) != 0)
        cr_skip_test("%s", why);
    tu_venv_bin("torchrun", t->torchrun, sizeof t->torchrun);
    snprintf(t->script, sizeof t->script, "%s/tests/launcher/torch/fsdp2_train.py", getenv("FSDP_SOURCE_ROOT"));
    snprintf(t->py_env, sizeof t->py_env, "PYTHON_EXEC=%s", t->py);
    t->dir = lu_tmpdir();
}

static char *subdir(struct tj *t, const char *name)
{
    char *p = malloc(FSDP_PATH_MAX);
    cr_assert_not_null(p);
    tu_pathf(p, FSDP_PATH_MAX, "%s/%s", t->dir, name);
    cr_assert_eq(mkdir(p, 0755), 0);
    return p;
}

/* Rank 0's losses of a run whose output directory is out. */
static int read_losses(const char *out, double *l)
{
    char p[FSDP_PATH_MAX];
    snprintf(p, sizeof p, "%s/losses.json", out);
    char *text = tu_slurp(p);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    cr_assert_not_null(j, "no losses.json in %s", out);
    int n = cJSON_GetArraySize(j);
    for (int i = 0; i < n && i < STEPS; i++)
        l[i] = cJSON_GetArrayItem(j, i)->valuedouble;
    cJSON_Delete(j);
    free(text);
    return n;
}

static int run(struct tj *t, const char *tag, const char *const *argv, double timeout_s)
{
    const char *env[] = {"OMP_NUM_THREADS=1", t->py_env, NULL};
    return lu_exit_code(lu_wait(lu_spawn(argv, t->dir, tag, env), timeout_s));
}

/* fsdp-launch --nproc_per_node 2 fsdp2_train.py OUT (Python found through PYTHON_EXEC, as torchrun's). */
static void launch_world2(struct tj *t, const char *tag, const char *out, const char *const *extra, int want)
{
    const char *argv[24] = {LU_LAUNCH, "--nproc_per_node", "2"};
    int n = 3;
    for (int i = 0; extra && extra[i]; i++)
        argv[n++] = extra[i];
    argv[n++] = t->script;
    argv[n++] = out;
    argv[n] = NULL;
    int code = run(t, tag, argv, 180);
    cr_assert_eq(code, want, "fsdp-launch %s exited %d (want %d):\n%s", tag, code, want, lu_slurp_tag(t->dir, tag, "err"));
}

Test(torch, fsdp2_same_losses_as_torchrun, .timeout = 400)
{
    struct tj t;
    tj_setup(&t);
    char *a = subdir(&t, "torchrun"), *b = subdir(&t, "fsdp");
    const char *tr[] = {t.torchrun, "--standalone", "--nproc_per_node", "2", t.script, a, NULL};
    int code = run(&t, "torchrun", tr, 180);
    cr_assert_eq(code, 0, "torchrun exited %d:\n%s", code, lu_slurp_tag(t.dir, "torchrun", "err"));
    launch_world2(&t, "fsdp", b, NULL, 0);
    double la[STEPS], lb[STEPS];
    cr_assert_eq(read_losses(a, la), STEPS);
    cr_assert_eq(read_losses(b, lb), STEPS);
    for (int s = 0; s < STEPS; s++)
        cr_expect_eq(la[s], lb[s], "step %d: torchrun %.9g, fsdp-launch %.9g", s, la[s], lb[s]);
    char p[FSDP_PATH_MAX];
    snprintf(p, sizeof p, "%s/rank1.json", b);
    char *text = tu_slurp(p);
    cr_expect(strstr(text, "\"world\": 2") && strstr(text, "\"agent_store\": \"True\""),
              "a worker uses fsdp-launch's store as torchrun's agent store: %s", text);
    free(text);
    free(a);
    free(b);
    lu_rm_rf(t.dir);
}

Test(torch, fsdp2_two_nodes_over_loopback, .timeout = 400)
{
    struct tj t;
    tj_setup(&t);
    char *one = subdir(&t, "one"), *two = subdir(&t, "two");
    launch_world2(&t, "one", one, NULL, 0);
    const char *n0[] = {LU_LAUNCH, "--nnodes", "2", "--node_rank", "0", "--nproc_per_node", "1", "--master_port", "0",
                        "--rdzv_id", "torch2", t.script, two, NULL};
    const char *env[] = {"OMP_NUM_THREADS=1", t.py_env, "FSDP_RDZV_TOKEN=loopback-test", NULL};
    pid_t p0 = lu_spawn(n0, t.dir, "n0", env);
    int port = lu_read_port(t.dir, "n0", 30);
    cr_assert_gt(port, 0, "node 0 printed no port: %s", lu_slurp_tag(t.dir, "n0", "err"));
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    const char *n1[] = {LU_LAUNCH, "--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "1", "--master_port", ps,
                        "--rdzv_id", "torch2", t.script, two, NULL};
    pid_t p1 = lu_spawn(n1, t.dir, "n1", env);
    int c0 = lu_exit_code(lu_wait(p0, 180)), c1 = lu_exit_code(lu_wait(p1, 30));
    cr_assert_eq(c0, 0, "node 0 exited %d:\n%s", c0, lu_slurp_tag(t.dir, "n0", "err"));
    cr_assert_eq(c1, 0, "node 1 exited %d:\n%s", c1, lu_slurp_tag(t.dir, "n1", "err"));
    double l1[STEPS], l2[STEPS];
    cr_assert_eq(read_losses(one, l1), STEPS);
    cr_assert_eq(read_losses(two, l2), STEPS);
    for (int s = 0; s < STEPS; s++)
        cr_expect_eq(l1[s], l2[s], "step %d: one node %.9g, two nodes %.9g", s, l1[s], l2[s]);
    free(one);
    free(two);
    lu_rm_rf(t.dir);
}

Test(torch, a_failing_rank_is_named_and_the_job_torn_down, .timeout = 400)
{
    struct tj t;
    tj_setup(&t);
    char *out = subdir(&t, "fail");
    const char *argv[] = {LU_LAUNCH, "--nproc_per_node", "2", "--shutdown_timeout", "5", t.script, out, "--fail_at",
                          "2:1", NULL};
    int code = run(&t, "fail", argv, 180);
    char *err = lu_slurp_tag(t.dir, "fail", "err");
    cr_assert_eq(code, 1, "the job exits with the failing rank's code (Python: 1), got %d:\n%s", code, err);
    cr_expect(strstr(err, "Root cause (first failure): rank 1 (local rank 1)"), "the root cause names rank 1:\n%s",
              err);
    cr_expect(strstr(err, "injected failure at step 2 on rank 1"), "its traceback is in the summary:\n%s", err);
    free(err);
    free(out);
    lu_rm_rf(t.dir);
}

Test(torch, max_restarts_restarts_the_job, .timeout = 400)
{
    struct tj t;
    tj_setup(&t);
    char *ref = subdir(&t, "ref"), *out = subdir(&t, "restart");
    launch_world2(&t, "ref", ref, NULL, 0);
    const char *extra[] = {"--max_restarts", "1", NULL};
    const char *argv[] = {LU_LAUNCH, "--nproc_per_node", "2", extra[0], extra[1], t.script, out, "--fail_at", "3:0",
                          NULL};
    int code = run(&t, "restart", argv, 240);
    char *err = lu_slurp_tag(t.dir, "restart", "err");
    cr_assert_eq(code, 0, "the restarted job did not finish:\n%s", err);
    cr_expect(strstr(err, "restarting"), "no restart announced:\n%s", err);
    free(err);
    char p[FSDP_PATH_MAX];
    snprintf(p, sizeof p, "%s/rank0.json", out);
    char *text = tu_slurp(p);
    cr_expect(strstr(text, "\"restart\": 1"), "the finishing attempt is restart 1: %s", text);
    free(text);
    double a[STEPS], b[STEPS];
    cr_assert_eq(read_losses(ref, a), STEPS);
    cr_assert_eq(read_losses(out, b), STEPS);
    for (int s = 0; s < STEPS; s++)
        cr_expect_eq(a[s], b[s], "step %d: %.9g vs uninterrupted %.9g", s, b[s], a[s]);
    free(ref);
    free(out);
    lu_rm_rf(t.dir);
}
