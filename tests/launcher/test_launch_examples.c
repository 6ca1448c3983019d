/* The shipped examples train: examples/multinode.sh as two nodes over loopback, and examples/slurm.sbatch
 * under a stand-in `srun` that starts its command once per node with SLURM_NODEID set, as srun
 * --ntasks-per-node=1 does on two nodes. Both run fsdp-worker on a tiny config; the tests read the run
 * summaries and metrics.jsonl. */
#include "tests/util/launch_util.h"
#include "tests/util/tu_summary.h"

#include <math.h>

#define TINY                                                                                                   \
    "[model]\nn_layer = 2\nn_head = 2\nn_embd = 32\nvocab_size = 256\nblock_size = 16\n"                       \
    "[train]\ndevice = cpu\ntrain_batch = 8\nmicro_batch = 2\nmax_steps = 6\neval_interval = 0\n"              \
    "[optim]\nlr = 0.003\nwarmup_steps = 2\n"

struct ex {
    char *dir;
    char ini[FSDP_PATH_MAX], data[FSDP_PATH_MAX], build[FSDP_PATH_MAX], src[FSDP_PATH_MAX];
};

static void ex_setup(struct ex *e)
{
    e->dir = lu_tmpdir();
    snprintf(e->build, sizeof e->build, "%s", getenv("FSDP_BUILD_ROOT"));
    snprintf(e->src, sizeof e->src, "%s", getenv("FSDP_SOURCE_ROOT"));
    snprintf(e->data, sizeof e->data, "%s/data", e->dir);
    char corpus[FSDP_PATH_MAX];
    tu_pathf(corpus, sizeof corpus, "%s/tests/data/corpus", e->src);
    const char *argv[] = {lu_build_path("worker/fsdp-prepare-data"), "-o", e->data, corpus, NULL};
    cr_assert_eq(lu_exit_code(lu_wait(lu_spawn(argv, e->dir, "prep", NULL), 60)), 0, "fsdp-prepare-data: %s",
                 lu_slurp_tag(e->dir, "prep", "err"));
    snprintf(e->ini, sizeof e->ini, "%s/tiny.ini", e->dir);
    lu_write_text(e->ini, TINY);
}

static void expect_trained(const char *run_dir, int world)
{
    cJSON *s = tu_summary_load(run_dir, 0);
    cr_assert_not_null(s, "no run summary of rank 0 in %s", run_dir);
    cr_expect_eq(tu_json_num(s, "world_size"), world);
    cr_expect_eq(tu_json_num(s, "steps.run"), 6, "steps trained");
    cr_expect(isfinite(tu_json_num(s, "final_loss")), "final loss");
    cJSON_Delete(s);
    char path[FSDP_PATH_MAX];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    char *text = tu_slurp(path);
    int rows = 0;
    for (char *p = text; p && (p = strchr(p, '\n')); p++)
        rows++;
    cr_expect_eq(rows, 6, "metrics.jsonl rows: %s", text);
    free(text);
}

Test(examples, multinode_sh_trains_on_two_nodes, .timeout = 120)
{
    struct ex e;
    ex_setup(&e);
    char script[FSDP_PATH_MAX], port[16], env_port[32], run0[FSDP_PATH_MAX], run1[FSDP_PATH_MAX];
    /* + 32: "KEY=" and a path */
    char env_build[FSDP_PATH_MAX + 32], env_cfg[FSDP_PATH_MAX + 32], env_data[FSDP_PATH_MAX + 32],
        env_ck[FSDP_PATH_MAX + 32], env_run0[FSDP_PATH_MAX + 32], env_run1[FSDP_PATH_MAX + 32];
    tu_pathf(script, sizeof script, "%s/examples/multinode.sh", e.src);
    snprintf(port, sizeof port, "%d", tu_free_port());
    snprintf(env_port, sizeof env_port, "MASTER_PORT=%s", port);
    snprintf(env_build, sizeof env_build, "BUILD=%s", e.build);
    snprintf(env_cfg, sizeof env_cfg, "CONFIG=%s", e.ini);
    snprintf(env_data, sizeof env_data, "DATA_DIR=%s", e.data);
    snprintf(env_ck, sizeof env_ck, "CKPT_DIR=%s/ckpt", e.dir); /* shared by both "nodes" */
    snprintf(run0, sizeof run0, "%s/node0", e.dir);
    snprintf(run1, sizeof run1, "%s/node1", e.dir);
    snprintf(env_run0, sizeof env_run0, "RUN_DIR=%s", run0);
    snprintf(env_run1, sizeof env_run1, "RUN_DIR=%s", run1);
    const char *argv[] = {"/bin/bash", script, NULL};
    const char *env0[] = {"NODE_RANK=0", "MASTER_ADDR=127.0.0.1", "NPROC=1", "RDZV_TIMEOUT=60", "OMP_NUM_THREADS=1",
                          env_port, env_build, env_cfg, env_data, env_ck, env_run0, NULL};
    const char *env1[] = {"NODE_RANK=1", "MASTER_ADDR=127.0.0.1", "NPROC=1", "RDZV_TIMEOUT=60", "OMP_NUM_THREADS=1",
                          env_port, env_build, env_cfg, env_data, env_ck, env_run1, NULL};
    pid_t p0 = lu_spawn(argv, e.dir, "n0", env0);
    pid_t p1 = lu_spawn(argv, e.dir, "n1", env1);
    int c0 = lu_exit_code(lu_wait(p0, 100)), c1 = lu_exit_code(lu_wait(p1, 30));
    cr_assert_eq(c0, 0, "node 0 exited %d:\n%s", c0, lu_slurp_tag(e.dir, "n0", "err"));
    cr_assert_eq(c1, 0, "node 1 exited %d:\n%s", c1, lu_slurp_tag(e.dir, "n1", "err"));
    expect_trained(run0, 2);
    cJSON *s1 = tu_summary_load(run1, 1);
    cr_assert_not_null(s1, "rank 1 (node 1) wrote no run summary in its RUN_DIR");
    cr_expect_eq(tu_json_num(s1, "rank"), 1);
    cJSON_Delete(s1);
    char latest[FSDP_PATH_MAX];
    snprintf(latest, sizeof latest, "%s/ckpt/latest", e.dir);
    cr_expect_eq(access(latest, F_OK), 0, "no checkpoint at the end in CKPT_DIR");
    lu_rm_rf(e.dir);
}

/* srun --ntasks-per-node=1 on two nodes, on one machine: the command once per node, SLURM_NODEID set. */
static const char FAKE_SRUN[] = "#!/bin/bash\n"
                                "while [[ $1 == -* ]]; do shift; done\n"
                                "SLURM_NODEID=0 \"$@\" & a=$!\n"
                                "SLURM_NODEID=1 \"$@\" & b=$!\n"
                                "wait $a; ra=$?; wait $b; rb=$?\n"
                                "[ $ra = 0 ] && [ $rb = 0 ]\n";

Test(examples, slurm_sbatch_trains_on_two_nodes, .timeout = 120)
{
    struct ex e;
    ex_setup(&e);
    char bin[FSDP_PATH_MAX], srun[FSDP_PATH_MAX], script[FSDP_PATH_MAX], path[8192], port[32], run[FSDP_PATH_MAX];
    /* + 32: "KEY=" and a path */
    char env_build[FSDP_PATH_MAX + 32], env_cfg[FSDP_PATH_MAX + 32], env_data[FSDP_PATH_MAX + 32],
        env_run[FSDP_PATH_MAX + 32], submit[FSDP_PATH_MAX + 32];
    snprintf(bin, sizeof bin, "%s/bin", e.dir);
    cr_assert_eq(mkdir(bin, 0755), 0);
    tu_pathf(srun, sizeof srun, "%s/srun", bin);
    lu_write_text(srun, FAKE_SRUN);
    cr_assert_eq(chmod(srun, 0755), 0);
    tu_pathf(script, sizeof script, "%s/examples/slurm.sbatch", e.src);
    snprintf(path, sizeof path, "PATH=%s:%s", bin, getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    snprintf(port, sizeof port, "MASTER_PORT=%d", tu_free_port());
    snprintf(env_build, sizeof env_build, "BUILD=%s", e.build);
    snprintf(env_cfg, sizeof env_cfg, "CONFIG=%s", e.ini);
    snprintf(env_data, sizeof env_data, "DATA_DIR=%s", e.data);
    snprintf(run, sizeof run, "%s/run", e.dir);
    snprintf(env_run, sizeof env_run, "RUN_DIR=%s", run);
    snprintf(submit, sizeof submit, "SLURM_SUBMIT_DIR=%s", e.src);
    const char *argv[] = {"/bin/bash", script, NULL};
    const char *env[] = {"SLURM_JOB_ID=4242", "SLURM_JOB_NODELIST=localhost,localhost", "SLURM_JOB_NUM_NODES=2",
                         "NPROC=1", "OMP_NUM_THREADS=1", "SLURM_NODEID=", "FSDP_RDZV_TOKEN=", path, port,
                         env_build, env_cfg, env_data, env_run, submit, NULL};
    int code = lu_exit_code(lu_wait(lu_spawn(argv, e.dir, "sbatch", env), 100));
    cr_assert_eq(code, 0, "slurm.sbatch exited %d:\n%s", code, lu_slurp_tag(e.dir, "sbatch", "err"));
    expect_trained(run, 2);
    cJSON *s1 = tu_summary_load(run, 1);
    cr_assert_not_null(s1, "no run summary of rank 1 in %s", run);
    cr_expect_str_eq(tu_json_str(s1, "run_id"), "4242", "the run id comes from SLURM_JOB_ID");
    cJSON_Delete(s1);
    lu_rm_rf(e.dir);
}
