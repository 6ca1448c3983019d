/* Under a foreign torchrun-compatible launcher (PyTorch's torchrun, --no_python) fsdp-worker reads the
 * torchrun environment, rank 0 hosts fsdp's store beside torchrun's own (FSDP_STORE_PORT), and the run
 * gives the losses of one rank under fsdp-launch. The torchrun is FSDP_TORCHRUN when set, else `torchrun`
 * on PATH, else the one of the venv docs/fsdp.md describes (FSDP_TORCH_VENV, default ~/.cache/fsdpc-venv,
 * PyTorch from PyPI); without any the test says it skipped. */
#include "tests/util/tu_venv.h"
#include "ttest.h"

/* A torchrun found: the path, and how to start it (argv prefix). */
struct torchrun {
    char path[2048], interp[2048], interp_arg[256], compat[2048];
    const char *argv[4];
};

/* The first executable `name` in the directories of PATH, into out; false when there is none. */
static bool find_on_path(const char *name, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    for (const char *p = path; p && *p;) {
        size_t n = strcspn(p, ":");
        snprintf(out, cap, "%.*s/%s", (int)n, p, name);
        if (n > 0 && access(out, X_OK) == 0)
            return true;
        p += n + (p[n] == ':');
    }
    return false;
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* torchrun is a Python console script (`#!PYTHON`): it runs as PYTHON tests/train/torchrun_compat.py, the
 * same program with the repair Debian's torch 1.13 needs on Python 3.11. Anything else runs as it is. */
static void torchrun_argv(struct torchrun *t)
{
    int n = 0;
    char line[2300] = "";
    FILE *f = fopen(t->path, "r");
    if (f) {
        if (!fgets(line, sizeof line, f))
            line[0] = 0;
        fclose(f);
    }
    line[strcspn(line, "\r\n")] = 0;
    char interp[2048] = "", arg[256] = "";
    if (strncmp(line, "#!", 2) == 0 && sscanf(line + 2, " %2047s %255s", interp, arg) >= 1) {
        const char *prog = strcmp(base_name(interp), "env") == 0 ? arg : interp;
        if (strstr(base_name(prog), "python")) {
            snprintf(t->interp, sizeof t->interp, "%s", interp);
            snprintf(t->interp_arg, sizeof t->interp_arg, "%s", arg);
            snprintf(t->compat, sizeof t->compat, "%s/tests/train/torchrun_compat.py", getenv("FSDP_SOURCE_ROOT"));
            t->argv[n++] = t->interp;
            if (arg[0])
                t->argv[n++] = t->interp_arg;
            t->argv[n++] = t->compat;
            t->argv[n] = NULL;
            return;
        }
    }
    t->argv[n++] = t->path;
    t->argv[n] = NULL;
}

/* FSDP_TORCHRUN (an error when it names no executable: the user asked for that one), `torchrun` on PATH,
 * the venv's; false when none is there. */
static bool find_torchrun(struct torchrun *t)
{
    memset(t, 0, sizeof *t);
    const char *env = getenv("FSDP_TORCHRUN");
    if (env && *env) {
        cr_assert(access(env, X_OK) == 0, "FSDP_TORCHRUN=%s is not an executable", env);
        snprintf(t->path, sizeof t->path, "%s", env);
    } else if (!find_on_path("torchrun", t->path, sizeof t->path) && !tu_venv_bin("torchrun", t->path, sizeof t->path)) {
        return false;
    }
    torchrun_argv(t);
    return true;
}

Test(torchrun, two_ranks_match_one, .timeout = 300)
{
    struct torchrun tr;
    if (!find_torchrun(&tr))
        cr_skip_test("no torchrun: none in FSDP_TORCHRUN, on PATH or in the PyPI venv (FSDP_TORCH_VENV, default "
                     "~/.cache/fsdpc-venv: python3 -m venv ~/.cache/fsdpc-venv && ~/.cache/fsdpc-venv/bin/pip "
                     "install torch)");
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
    const char *argv[16];
    int n = 0;
    for (int i = 0; tr.argv[i]; i++)
        argv[n++] = tr.argv[i];
    const char *rest[] = {"--nproc_per_node", "2", "--master_port", mport, "--no_python",
                          lu_build_path("worker/fsdp-worker"), c.ini, logarg, ckarg, NULL};
    for (int i = 0; rest[i]; i++)
        argv[n++] = rest[i];
    argv[n] = NULL;
    fprintf(stderr, "torchrun: %s (run as %s%s%s)\n", tr.path, tr.argv[0], tr.argv[1] ? " " : "",
            tr.argv[1] ? tr.argv[1] : "");
    const char *env[] = {"OMP_NUM_THREADS=1", sport, "RANK=", "WORLD_SIZE=", "FSDP_STORE_PREFIX=", NULL};
    int code = lu_exit_code(lu_wait(lu_spawn(argv, rundir, "run", env), TT_RUN_TIMEOUT_S));
    struct tt_result r = {.code = code, .out = lu_slurp_tag(rundir, "run", "out"),
                          .err = lu_slurp_tag(rundir, "run", "err")};
    snprintf(r.logdir, sizeof r.logdir, "%s/log", rundir);
    cr_assert_eq(code, 0, "torchrun (%s) + fsdp-worker exited with %d:\n%s", tr.path, code, r.err);
    cr_assert(tt_summary_matches(&r, 0, "{\"plan\":{\"world_size\":2,\"shard_groups\":1,\"shard_group_size\":2}}"),
              "not two ranks:\n%s", r.err);
    cJSON *s1 = tu_summary_load(r.logdir, 1);
    cr_assert_not_null(s1, "rank 1 did not finish:\n%s", r.err);
    cJSON_Delete(s1);
    tt_assert_losses(&r, ref, 1e-5, "two ranks under torchrun vs one under fsdp-launch");
    tt_result_free(&r);
    tt_teardown(&c);
}
