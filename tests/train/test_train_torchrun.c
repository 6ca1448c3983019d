/* Under a foreign torchrun-compatible launcher (PyTorch's torchrun, --no_python) fsdp-worker reads the
 * torchrun environment, rank 0 hosts fsdp's store beside torchrun's own (FSDP_STORE_PORT), and the run
 * gives the losses of one rank under fsdp-launch. Skipped where ../shared/anchors/torch or Debian's
 * python3-torch is missing. */

#include "ttest.h"

Test(torchrun, two_ranks_match_one, .timeout = 300)
{
    char torchrun[2048];
    snprintf(torchrun, sizeof torchrun, "%s/../shared/anchors/torch/torchrun.py", getenv("FSDP_SOURCE_ROOT"));
    if (access(torchrun, R_OK) != 0 || access("/usr/bin/python3", X_OK) != 0 ||
        access("/usr/lib/python3/dist-packages/torch", F_OK) != 0)
        cr_skip_test("no torchrun here (../shared/anchors/torch and Debian's python3-torch)");
    struct tt_ctx c;
    tt_setup(&c);
    double ref[TT_STEPS];
    tt_reference(&c, ref);

    char rundir[2048], logarg[2300], ckarg[2300], mport[16], sport[32];
    snprintf(rundir, sizeof rundir, "%s/torchrun", c.dir);
    cr_assert_eq(mkdir(rundir, 0755), 0);
    snprintf(logarg, sizeof logarg, "--log.dir=%s/log", rundir);
    snprintf(ckarg, sizeof ckarg, "--checkpoint.dir=%s/ckpt", rundir);
    /* Both ports free now; torchrun would otherwise default to 29500 and fsdp's store to 29501. */
    snprintf(mport, sizeof mport, "%d", tu_free_port());
    snprintf(sport, sizeof sport, "FSDP_STORE_PORT=%d", tu_free_port());
    const char *argv[] = {"/usr/bin/python3", torchrun, "--nproc_per_node", "2", "--master_port", mport, "--no_python",
                          lu_build_path("worker/fsdp-worker"), c.ini, logarg, ckarg, NULL};
    const char *env[] = {"OMP_NUM_THREADS=1", sport, "RANK=", "WORLD_SIZE=", "FSDP_STORE_PREFIX=", NULL};
    int code = lu_exit_code(lu_wait(lu_spawn(argv, rundir, "run", env), TT_RUN_TIMEOUT_S));
    struct tt_result r = {.code = code, .out = lu_slurp_tag(rundir, "run", "out"),
                          .err = lu_slurp_tag(rundir, "run", "err")};
    snprintf(r.logdir, sizeof r.logdir, "%s/log", rundir);
    cr_assert_eq(code, 0, "torchrun + fsdp-worker exited with %d:\n%s", code, r.err);
    cr_assert(strstr(r.err, "world 2 = 1 shard group(s) of 2"), "not two ranks:\n%s", r.err);
    char *line = tt_rank_line(r.err, 1, "peak memory: ");
    cr_assert_not_null(line, "rank 1 did not finish:\n%s", r.err);
    free(line);
    tt_assert_losses(&r, ref, 1e-5, "two ranks under torchrun vs one under fsdp-launch");
    tt_result_free(&r);
    tt_teardown(&c);
}
