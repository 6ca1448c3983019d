/* PyTorch 2.x's own TCPStore client against fsdp-launch's store: every op a worker uses
 * (torch/store_ops.py), a 2-rank gloo job through init_process_group("gloo", init_method="env://"), a
 * restart of that job (no key of the first attempt is left), and --no_torch_store refusing it. Needs the
 * PyPI venv (FSDP_TORCH_VENV, default ~/.cache/fsdpc-venv); skips, saying so, without it. */
#include <cjson/cJSON.h>

#include "tests/util/launch_util.h"
#include "tests/util/tu_venv.h"

static void need_torch(char *python, size_t cap)
{
    if (!tu_venv_bin("python", python, cap))
        cr_skip_test("no PyTorch venv: %s is missing (python3 -m venv ~/.cache/fsdpc-venv && "
                     "~/.cache/fsdpc-venv/bin/pip install torch, or set FSDP_TORCH_VENV)", python);
}

static const char *script(const char *name)
{
    static char buf[2][FSDP_PATH_MAX];
    static int k;
    const char *src = getenv("FSDP_SOURCE_ROOT");
    cr_assert(src, "FSDP_SOURCE_ROOT not set: run through meson test");
    char *b = buf[k++ % 2];
    snprintf(b, 4096, "%s/tests/rendezvous/torch/%s", src, name);
    return b;
}

static cJSON *read_json(const char *path)
{
    char *text = tu_slurp(path);
    cJSON *j = cJSON_Parse(text);
    cr_assert_not_null(j, "%s is not JSON: '%.200s'", path, text);
    free(text);
    return j;
}

/* Runs fsdp-launch FLAGS -- python SCRIPT ARGS; returns its exit code (asserting it ended in time). */
static int launch(const char *dir, const char *const *argv)
{
    pid_t pid = lu_spawn(argv, dir, "launch", NULL);
    int code = lu_exit_code(lu_wait(pid, 280));
    cr_assert_neq(code, -1000, "fsdp-launch ran past 280 s; stderr:\n%s", lu_slurp_tag(dir, "launch", "err"));
    return code;
}

Test(store_torch, every_op_of_a_pytorch_client, .timeout = 300)
{
    char python[FSDP_PATH_MAX];
    need_torch(python, sizeof python);
    char *dir = lu_tmpdir(), out[FSDP_PATH_MAX];
    snprintf(out, sizeof out, "%s/ops.json", dir);
    const char *argv[] = {LU_LAUNCH, "--nproc_per_node", "1", "--master_port", "0", "--", python,
                          script("store_ops.py"), out, NULL};
    int code = launch(dir, argv);
    cJSON *j = read_json(out);
    char failed[2048] = "";
    int nchecks = 0;
    const cJSON *checks = cJSON_GetObjectItem(j, "checks"), *c;
    cJSON_ArrayForEach(c, checks) {
        nchecks++;
        if (!cJSON_IsTrue(c))
            snprintf(failed + strlen(failed), sizeof failed - strlen(failed), " %s", c->string);
    }
    cr_assert_eq(failed[0], 0, "checks failed:%s", failed);
    cr_assert_null(cJSON_GetObjectItem(j, "exception"), "%s",
                   cJSON_GetStringValue(cJSON_GetObjectItem(j, "exception")));
    cr_assert_geq(nchecks, 28, "only %d checks ran", nchecks);
    cr_assert_eq(code, 0, "stderr:\n%s", lu_slurp_tag(dir, "launch", "err"));
    cJSON_Delete(j);
}

static void check_gloo_ranks(const char *dir, int attempt)
{
    for (int r = 0; r < 2; r++) {
        char path[FSDP_PATH_MAX];
        snprintf(path, sizeof path, "%s/rank%d.json", dir, r);
        cJSON *j = read_json(path);
        cr_assert_eq(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "rank")), r);
        cr_assert_eq(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "world")), 2);
        cr_assert_eq(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "sum")), 3.0, "all_reduce of 1 and 2");
        cr_assert_eq(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "attempt")), attempt);
        cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(j, "use_agent_store")), "True");
        cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(j, "stale_key")),
                  "rank %d of attempt %d found a key of an earlier attempt", r, attempt);
        cJSON_Delete(j);
    }
}

Test(store_torch, gloo_job_under_fsdp_launch, .timeout = 300)
{
    char python[FSDP_PATH_MAX];
    need_torch(python, sizeof python);
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--nproc_per_node", "2", "--master_port", "0", "--", python,
                          script("gloo_allreduce.py"), dir, NULL};
    int code = launch(dir, argv);
    cr_assert_eq(code, 0, "stderr:\n%s", lu_slurp_tag(dir, "launch", "err"));
    check_gloo_ranks(dir, 0);
}

/* The restarted attempt's workers find an empty key space: c10d's keys carry no attempt, so a key of the
 * first attempt would be read as this one's. */
Test(store_torch, gloo_job_restarts_with_fresh_keys, .timeout = 300)
{
    char python[FSDP_PATH_MAX];
    need_torch(python, sizeof python);
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--nproc_per_node", "2", "--max_restarts", "1", "--master_port", "0", "--",
                          python, script("gloo_allreduce.py"), dir, "--fail-first-attempt", NULL};
    int code = launch(dir, argv);
    cr_assert_eq(code, 0, "stderr:\n%s", lu_slurp_tag(dir, "launch", "err"));
    check_gloo_ranks(dir, 1);
}

Test(store_torch, no_torch_store_refuses_pytorch_clients, .timeout = 300)
{
    char python[FSDP_PATH_MAX];
    need_torch(python, sizeof python);
    char *dir = lu_tmpdir(), out[FSDP_PATH_MAX];
    snprintf(out, sizeof out, "%s/ops.json", dir);
    const char *argv[] = {LU_LAUNCH, "--nproc_per_node", "1", "--master_port", "0", "--no_torch_store", "--",
                          python, script("store_ops.py"), out, "--refused", NULL};
    int code = launch(dir, argv);
    cJSON *j = read_json(out);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "checks"), "refused")),
              "a PyTorch client was served with --no_torch_store");
    cr_assert_eq(code, 0, "stderr:\n%s", lu_slurp_tag(dir, "launch", "err"));
    cJSON_Delete(j);
}
