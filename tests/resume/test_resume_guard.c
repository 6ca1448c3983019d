/* What protects checkpoints through the real training job: a damaged `latest` pointer resumes from the
 * newest checkpoint instead of starting over (alone and under --max_restarts), a run that would overwrite
 * committed checkpoints is refused before it starts, and a second job on a checkpoint directory in use is
 * refused naming the first one. Each case fails on a build that lacks the protection. */
#include "tests/resume/rtest.h"
#include "common/fs.h"
#include "tests/util/tu_summary.h"

/* Inode and modification time of a checkpoint's metadata.json: a checkpoint rewritten or replaced changes
 * both. */
struct stamp {
    ino_t ino;
    struct timespec mtime;
};

static struct stamp stamp_of(const char *ckdir, const char *name)
{
    char p[FSDP_PATH_MAX];
    snprintf(p, sizeof p, "%s/%s/metadata.json", ckdir, name);
    struct stat st;
    cr_assert_eq(stat(p, &st), 0, "%s: %s", p, strerror(errno));
    return (struct stamp){st.st_ino, st.st_mtim};
}

static void assert_same(struct stamp a, struct stamp b, const char *what)
{
    cr_assert(a.ino == b.ino && a.mtime.tv_sec == b.mtime.tv_sec && a.mtime.tv_nsec == b.mtime.tv_nsec,
              "%s was rewritten", what);
}

/* 20 steps alone with a checkpoint every 10 (kept) into dir/ck: fsdp_sharded_cpt10 and _cpt20. */
static void two_checkpoints(struct job *j, char *ck, size_t cap)
{
    snprintf(ck, cap, "%s/ck", j->dir);
    char *dir = opt("--checkpoint.dir=%s%s", ck, "");
    const char *args[] = {dir, "--checkpoint.interval=10", "--checkpoint.keep_last=0", NULL};
    int rc = job_run_alone(j, "first", args, NULL);
    cr_assert_eq(rc, 0, "first run: %s", lu_slurp_tag(j->dir, "first", "err"));
    free(dir);
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

Test(resume_guard, damaged_latest_resumes_from_the_newest_checkpoint, .timeout = 240)
{
    struct job j;
    job_setup(&j);
    char ck[FSDP_PATH_MAX];
    two_checkpoints(&j, ck, sizeof ck);
    struct stamp s10 = stamp_of(ck, "fsdp_sharded_cpt10"), s20 = stamp_of(ck, "fsdp_sharded_cpt20");
    char latest[FSDP_PATH_MAX];
    tu_pathf(latest, sizeof latest, "%s/latest", ck);
    size_t big_n = 100 * 1024;
    char *big = malloc(big_n);
    memset(big, 'z', big_n);
    static const struct {
        const char *tag, *text, *note;
    } cases[] = {
        {"missing", NULL, "is missing"},
        {"dangling", "fsdp_sharded_cpt30\n", "names fsdp_sharded_cpt30, which does not exist"},
        {"garbage", "\x7f\x01 not a name\n", "does not hold a checkpoint name"},
        {"long", "", "does not hold a checkpoint name"},
    };
    char *dir = opt("--checkpoint.dir=%s%s", ck, "");
    const char *args[] = {dir, "--checkpoint.interval=10", "--checkpoint.resume_from=latest", NULL};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unlink(latest);
        if (cases[i].text && *cases[i].text)
            write_file(latest, cases[i].text, strlen(cases[i].text));
        else if (cases[i].text)
            write_file(latest, big, big_n);
        int rc = job_run_alone(&j, cases[i].tag, args, NULL);
        char *err = lu_slurp_tag(j.dir, cases[i].tag, "err");
        cr_assert_eq(rc, 0, "%s: %s", cases[i].tag, err);
        char logdir[FSDP_PATH_MAX];
        snprintf(logdir, sizeof logdir, "%s/%s", j.dir, cases[i].tag);
        cJSON *sum = tu_summary_load(logdir, 0);
        const char *from = tu_json_str(sum, "checkpoint.resumed.path");
        cr_assert(from && strstr(from, "/fsdp_sharded_cpt20"), "%s `latest`: resumed from %s, not the newest "
                  "checkpoint: %s", cases[i].tag, from ? from : "nothing (a start from step 0)", err);
        cr_assert_eq(tu_json_num(sum, "checkpoint.resumed.step"), 20);
        cJSON_Delete(sum);
        cr_assert(strstr(err, cases[i].note) && strstr(err, "the newest checkpoint in the directory is "
                  "fsdp_sharded_cpt20"), "%s: no warning naming the damage and the checkpoint used: %s",
                  cases[i].tag, err);
        assert_same(s10, stamp_of(ck, "fsdp_sharded_cpt10"), "fsdp_sharded_cpt10");
        assert_same(s20, stamp_of(ck, "fsdp_sharded_cpt20"), "fsdp_sharded_cpt20");
        free(err);
    }
    free(dir);
    free(big);
    lu_rm_rf(j.dir);
}

/* A fresh run, or one resumed from an older checkpoint, in a directory holding newer checkpoints would
 * save over them: refused before any step, naming them; resuming from the newest goes on. */
Test(resume_guard, a_run_that_would_overwrite_checkpoints_is_refused, .timeout = 240)
{
    struct job j;
    job_setup(&j);
    char ck[FSDP_PATH_MAX];
    two_checkpoints(&j, ck, sizeof ck);
    struct stamp s10 = stamp_of(ck, "fsdp_sharded_cpt10"), s20 = stamp_of(ck, "fsdp_sharded_cpt20");
    char *dir = opt("--checkpoint.dir=%s%s", ck, "");
    char *older = opt("--checkpoint.resume_from=%s/fsdp_sharded_cpt10%s", ck, "");
    const char *fresh[] = {dir, "--checkpoint.interval=10", NULL};
    const char *rewind[] = {dir, "--checkpoint.interval=10", older, NULL};
    const char *onward[] = {dir, "--checkpoint.interval=10", "--checkpoint.resume_from=latest",
                            "--train.max_steps=30", NULL};
    int rc = job_run_alone(&j, "fresh", fresh, NULL);
    char *err = lu_slurp_tag(j.dir, "fresh", "err");
    cr_assert_neq(rc, 0, "a fresh run in a directory with checkpoints was allowed: %s", err);
    cr_assert(strstr(err, "already holds 2 checkpoint(s) after step 0 (fsdp_sharded_cpt10, fsdp_sharded_cpt20)"),
              "%s", err);
    free(err);
    rc = job_run_alone(&j, "rewind", rewind, NULL);
    err = lu_slurp_tag(j.dir, "rewind", "err");
    cr_assert_neq(rc, 0, "a run resumed at step 10 below a step-20 checkpoint was allowed: %s", err);
    cr_assert(strstr(err, "already holds 1 checkpoint(s) after step 10 (fsdp_sharded_cpt20)"), "%s", err);
    free(err);
    assert_same(s10, stamp_of(ck, "fsdp_sharded_cpt10"), "fsdp_sharded_cpt10");
    assert_same(s20, stamp_of(ck, "fsdp_sharded_cpt20"), "fsdp_sharded_cpt20");
    rc = job_run_alone(&j, "onward", onward, NULL);
    cr_assert_eq(rc, 0, "resuming from the newest checkpoint: %s", lu_slurp_tag(j.dir, "onward", "err"));
    stamp_of(ck, "fsdp_sharded_cpt30");
    free(dir);
    free(older);
    lu_rm_rf(j.dir);
}

/* The first "step" of a metrics.jsonl (0-based: a run resumed from checkpoint N logs N first). */
static long first_step(struct job *j, const char *tag)
{
    char p[FSDP_PATH_MAX];
    snprintf(p, sizeof p, "%s/%s/metrics.jsonl", j->dir, tag);
    char *s = tu_slurp(p);
    const char *at = strstr(s, "\"step\":");
    long v = at ? atol(at + strlen("\"step\":")) : -1;
    free(s);
    return v;
}

/* Under --max_restarts with a garbage `latest` beside a step-10 checkpoint: the first attempt resumes from
 * step 10 (not step 0, which would rewrite it), is SIGKILLed after saving step 15, the restart resumes
 * from 15, and the run ends at the uninterrupted run's final loss. */
Test(resume_guard, restarts_with_a_damaged_latest_resume_from_the_newest, .timeout = 240)
{
    struct job j;
    job_setup(&j);
    char *refck = opt("--checkpoint.dir=%s/ck-ref%s", j.dir, "");
    const char *ref_args[] = {refck, "--checkpoint.interval=10", "--checkpoint.keep_last=0", NULL};
    cr_assert_eq(job_run(&j, "ref", 2, ref_args, NULL), 0, "reference: %s", lu_slurp_tag(j.dir, "ref", "err"));
    char ck[FSDP_PATH_MAX], cmd[20000];
    snprintf(ck, sizeof ck, "%s/ck", j.dir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp -r '%s/ck-ref/fsdp_sharded_cpt10' '%s/' && printf 'x\\001y\\n' > "
             "'%s/latest'", ck, j.dir, ck, ck);
    cr_assert_eq(tu_sh(cmd), 0, "%s", cmd);
    struct stamp s10 = stamp_of(ck, "fsdp_sharded_cpt10");
    char *dir = opt("--checkpoint.dir=%s%s", ck, "");
    const char *args[] = {dir, "--checkpoint.interval=5", "--checkpoint.resume_from=latest", NULL};
    const char *env[] = {"FSDP_FAULT_KILL=17:1", NULL};
    int rc = job_run(&j, "crash", 2, args, env);
    char *err = lu_slurp_tag(j.dir, "crash", "err");
    cr_assert_eq(rc, 0, "the job did not recover: %s", err);
    cr_assert(strstr(err, "restarting"), "no restart seen: %s", err);
    long first = first_step(&j, "crash");
    cr_assert_eq(first, 10, "the first attempt did not start at step 10 (first step logged: %ld): %s", first, err);
    assert_same(s10, stamp_of(ck, "fsdp_sharded_cpt10"), "fsdp_sharded_cpt10");
    char logdir[FSDP_PATH_MAX];
    snprintf(logdir, sizeof logdir, "%s/crash", j.dir);
    cJSON *sum = tu_summary_load(logdir, 0);
    const char *from = tu_json_str(sum, "checkpoint.resumed.path");
    cr_assert(from && strstr(from, "/fsdp_sharded_cpt15"), "the restart resumed from %s", from ? from : "nothing");
    cJSON_Delete(sum);
    char t_ref[32][32], t_c[64][32];
    double v_ref[32], v_c[64];
    int nr = losses(&j, "ref", t_ref, v_ref, 32), nc = losses(&j, "crash", t_c, v_c, 64);
    cr_assert(nr == 20 && nc >= 10, "ref %d steps, crash %d", nr, nc);
    cr_assert_str_eq(t_c[nc - 1], t_ref[nr - 1], "final loss %s, uninterrupted %s", t_c[nc - 1], t_ref[nr - 1]);
    free(err);
    free(dir);
    free(refck);
    lu_rm_rf(j.dir);
}

/* Two jobs on one checkpoint directory (the same run id in the same working directory): the second is
 * refused at once with the holder's host, pid and run id. */
Test(resume_guard, a_second_job_on_the_same_checkpoint_dir_is_refused, .timeout = 240)
{
    struct job j;
    job_setup(&j);
    char ck[FSDP_PATH_MAX];
    snprintf(ck, sizeof ck, "%s/ck", j.dir);
    char *dir = opt("--checkpoint.dir=%s%s", ck, "");
    const char *long_args[] = {dir, "--checkpoint.interval=1000", "--train.max_steps=1000000", NULL};
    char logdir[FSDP_PATH_MAX + 32]; /* + 32: "--key=" and a path */
    snprintf(logdir, sizeof logdir, "--log.dir=%s/a", j.dir);
    const char *argv[] = {lu_build_path("worker/fsdp-worker"), j.ini, logdir, long_args[0], long_args[1],
                          long_args[2], NULL};
    const char *envs[] = {"OMP_NUM_THREADS=1", NULL};
    pid_t a = lu_spawn(argv, j.dir, "a", envs);
    char lock[FSDP_PATH_MAX], want[64];
    tu_pathf(lock, sizeof lock, "%s/.lock", ck);
    snprintf(want, sizeof want, "pid %d, run id local", (int)a);
    bool held = false;
    for (double end = tu_now() + 60; !held && tu_now() < end; tu_nap(0.05)) {
        FILE *f = fopen(lock, "r");
        char line[512] = "";
        if (f) {
            held = fgets(line, sizeof line, f) && strstr(line, want);
            fclose(f);
        }
        cr_assert_eq(waitpid(a, NULL, WNOHANG), 0, "the first job ended: %s", lu_slurp_tag(j.dir, "a", "err"));
    }
    cr_assert(held, "the first job never held %s", lock);
    const char *short_args[] = {dir, "--checkpoint.interval=1", "--train.max_steps=3", NULL};
    int rc = job_run_alone(&j, "b", short_args, NULL);
    char *err = lu_slurp_tag(j.dir, "b", "err");
    kill(a, SIGKILL);
    waitpid(a, NULL, 0);
    cr_assert_neq(rc, 0, "the second job ran: %s", err);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char holder[400];
    snprintf(holder, sizeof holder, "host %s, %s", host, want);
    cr_assert(strstr(err, "is in use by another job") && strstr(err, holder), "no refusal naming '%s': %s", holder,
              err);
    char p[FSDP_PATH_MAX];
    tu_pathf(p, sizeof p, "%s/fsdp_sharded_cpt1", ck);
    cr_assert(access(p, F_OK) != 0, "the refused job saved %s", p);
    free(err);
    free(dir);
    lu_rm_rf(j.dir);
}
