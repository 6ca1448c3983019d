/* Checkpoints through the real training job (fsdp-launch + fsdp-worker): exact resume at the same world
 * size, resharded resume at other world sizes/strategies/versions and from either format, automatic
 * recovery from a SIGKILLed rank with --max_restarts, a disk that fills up during a save, and the exported
 * model evaluated by PyTorch against fsdp's evaluation of the same checkpoint. */
#include "tests/resume/rtest.h"
#include "common/fs.h"
#include "tests/util/tu_summary.h"
#include "tests/util/tu_venv.h"

#include <cjson/cJSON.h>
#include <dirent.h>

#include <math.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>

#include "common/error.h"
#include "common/safetensors.h"
#include "worker/ckpt/ckpt.h"
#include "worker/model/model.h"

/* The uninterrupted reference: 20 steps at world 2 with a sharded checkpoint every 10 (kept). */
static void straight(struct job *j, const char *tag, const char *type)
{
    char *ck = opt("--checkpoint.dir=%s/ck-%s", j->dir, tag);
    char *ty = opt("--checkpoint.state_dict_type=%s%s", type, "");
    const char *args[] = {ck, "--checkpoint.interval=10", "--checkpoint.keep_last=0", ty, NULL};
    int rc = job_run(j, tag, 2, args, NULL);
    cr_assert_eq(rc, 0, "reference run failed: %s", lu_slurp_tag(j->dir, tag, "err"));
    free(ck);
    free(ty);
}

static void resume_and_compare(struct job *j, const char *ref, const char *from, const char *tag, int world,
                               const char *const *extra, bool bitwise)
{
    char *res = opt("--checkpoint.resume_from=%s/%s", j->dir, from);
    char *ck = opt("--checkpoint.dir=%s/ck-%s", j->dir, tag);
    const char *args[12] = {res, ck};
    int n = 2;
    for (int i = 0; extra && extra[i]; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    int rc = job_run(j, tag, world, args, NULL);
    cr_assert_eq(rc, 0, "resumed run %s failed: %s", tag, lu_slurp_tag(j->dir, tag, "err"));
    char t_ref[32][32], t_res[32][32];
    double v_ref[32], v_res[32];
    int nr = losses(j, ref, t_ref, v_ref, 32), ns = losses(j, tag, t_res, v_res, 32);
    cr_assert_eq(nr, 20, "reference has %d steps", nr);
    cr_assert_eq(ns, 10, "resumed run %s logged %d steps, want 10 (steps 10..19)", tag, ns);
    for (int i = 0; i < 10; i++) {
        if (bitwise)
            cr_assert_str_eq(t_res[i], t_ref[10 + i], "%s step %d: %s vs uninterrupted %s", tag, 10 + i, t_res[i],
                             t_ref[10 + i]);
        double rel = fabs(v_res[i] - v_ref[10 + i]) / fabs(v_ref[10 + i]);
        cr_assert_leq(rel, 1e-5, "%s step %d: %.9g vs %.9g (rel %.2e)", tag, 10 + i, v_res[i], v_ref[10 + i], rel);
    }
    free(res);
    free(ck);
}

/* checkpoint.interval = -1: a run that saves nothing, not even at the end (0 saves at the end, which the
 * other tests resume from). */
Test(resume, interval_minus_one_saves_nothing, .timeout = 240)
{
    struct job j;
    job_setup(&j);
    char *ck = opt("--checkpoint.dir=%s/ck-%s", j.dir, "never");
    const char *args[] = {ck, "--checkpoint.interval=-1", "--train.max_steps=4", NULL};
    int rc = job_run(&j, "never", 2, args, NULL);
    cr_assert_eq(rc, 0, "run failed: %s", lu_slurp_tag(j.dir, "never", "err"));
    char p[FSDP_PATH_MAX];
    snprintf(p, sizeof p, "%s/ck-never", j.dir);
    struct stat st;
    cr_assert(stat(p, &st) != 0, "checkpoint.interval = -1, but %s was created", p);
    free(ck);
    lu_rm_rf(j.dir);
}

Test(resume, sharded_exact_at_same_world_and_resharded_elsewhere, .timeout = 240)
{
    struct job j;
    job_setup(&j);
    straight(&j, "ref", "SHARDED_STATE_DICT");
    resume_and_compare(&j, "ref", "ck-ref/fsdp_sharded_cpt10", "same", 2, NULL, true);
    const char *v1sgo[] = {"--fsdp.version=1", "--fsdp.sharding_strategy=SHARD_GRAD_OP", NULL};
    resume_and_compare(&j, "ref", "ck-ref/fsdp_sharded_cpt10", "w3v1", 3, v1sgo, false);
    const char *hybrid[] = {"--fsdp.sharding_strategy=HYBRID_SHARD", "--fsdp.hybrid_shard_size=2", NULL};
    resume_and_compare(&j, "ref", "ck-ref/fsdp_sharded_cpt10", "w4hy", 4, hybrid, false);
    resume_and_compare(&j, "ref", "ck-ref/fsdp_sharded_cpt10", "w1", 1, NULL, false);
    lu_rm_rf(j.dir);
}

Test(resume, full_state_dict_exact_and_resharded, .timeout = 240)
{
    struct job j;
    job_setup(&j);
    straight(&j, "ref", "FULL_STATE_DICT");
    char p[FSDP_PATH_MAX];
    snprintf(p, sizeof p, "%s/ck-ref/fsdp_cpt10/model.safetensors", j.dir);
    cr_assert_eq(access(p, R_OK), 0, "no %s", p);
    resume_and_compare(&j, "ref", "ck-ref/fsdp_cpt10", "same", 2, NULL, true);
    const char *ns[] = {"--fsdp.sharding_strategy=NO_SHARD", NULL};
    resume_and_compare(&j, "ref", "ck-ref/fsdp_cpt10", "w3ns", 3, ns, false);
    lu_rm_rf(j.dir);
}

Test(resume, sigkill_of_a_random_rank_recovers_from_latest, .timeout = 240)
{
    struct job j;
    job_setup(&j);
    straight(&j, "ref", "SHARDED_STATE_DICT");
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    int rank = rand() % 2, step = 6 + rand() % 13; /* a checkpoint every 5 steps: 5, 10, 15 */
    char fault[64];
    snprintf(fault, sizeof fault, "FSDP_FAULT_KILL=%d:%d", step, rank);
    char *ck = opt("--checkpoint.dir=%s/ck-%s", j.dir, "crash");
    const char *args[] = {ck, "--checkpoint.interval=5", NULL};
    const char *env[] = {fault, NULL};
    int rc = job_run(&j, "crash", 2, args, env);
    char *err = lu_slurp_tag(j.dir, "crash", "err");
    cr_assert_eq(rc, 0, "%s: the job did not recover: %s", fault, err);
    cr_assert(strstr(err, "SIGKILL") && strstr(err, "restarting"), "%s: no restart seen: %s", fault, err);
    char want[64], logdir[4300];
    snprintf(want, sizeof want, "fsdp_sharded_cpt%d", (step / 5) * 5);
    snprintf(logdir, sizeof logdir, "%s/crash", j.dir);
    cJSON *sum = tu_summary_load(logdir, 0);
    const char *from = tu_json_str(sum, "checkpoint.resumed.path");
    cr_assert(step < 5 || (from && strstr(from, want)), "%s: did not resume from %s (the run summary says %s): %s",
              fault, want, from ? from : "none", err);
    cJSON_Delete(sum);
    char t_ref[32][32], t_c[64][32];
    double v_ref[32], v_c[64];
    int nr = losses(&j, "ref", t_ref, v_ref, 32), nc = losses(&j, "crash", t_c, v_c, 64);
    cr_assert_geq(nc, 20);
    cr_assert_str_eq(t_c[nc - 1], t_ref[nr - 1], "%s: final loss %s, uninterrupted %s", fault, t_c[nc - 1],
                     t_ref[nr - 1]);
    free(ck);
    free(err);
    lu_rm_rf(j.dir);
}

/* TensorBoard's own reader after a crash and a resume: rank 1 dies at step 13, the job restarts from the
 * step-10 checkpoint and logs steps 10..19 again into a second event file. TensorBoard must show each step
 * once (the resumed file starts with a SessionLog START at step 10), with metrics.jsonl's values bit for bit
 * as float32. */
Test(resume, tensorboard_shows_each_step_once_after_a_crash, .timeout = 240)
{
    char py[FSDP_PATH_MAX], script[FSDP_PATH_MAX];
    if (!tu_venv_bin("python", py, sizeof py))
        cr_skip_test("no PyPI venv with tensorboard at %s (.ci/run makes it; FSDP_TORCH_VENV names another)", py);
    snprintf(script, sizeof script, "%s/tests/resume/tb_scalars.py", getenv("FSDP_SOURCE_ROOT"));
    struct job j;
    job_setup(&j);
    char *ck = opt("--checkpoint.dir=%s/ck-%s", j.dir, "tb");
    const char *args[] = {ck, "--checkpoint.interval=5", NULL};
    const char *env[] = {"FSDP_FAULT_KILL=13:1", NULL};
    int rc = job_run(&j, "tb", 2, args, env);
    cr_assert_eq(rc, 0, "the job did not recover: %s", lu_slurp_tag(j.dir, "tb", "err"));
    char logdir[FSDP_PATH_MAX];
    snprintf(logdir, sizeof logdir, "%s/tb", j.dir);
    int files = 0;
    DIR *d = opendir(logdir);
    cr_assert_not_null(d);
    for (struct dirent *e; (e = readdir(d));)
        files += strncmp(e->d_name, "events.out.tfevents.", 20) == 0;
    closedir(d);
    cr_assert_eq(files, 2, "one event file per attempt, found %d", files);

    const char *argv[] = {py, script, logdir, NULL};
    int code = lu_exit_code(lu_wait(lu_spawn(argv, j.dir, "tbread", NULL), 120));
    char *out = lu_slurp_tag(j.dir, "tbread", "out");
    cr_assert_eq(code, 0, "tb_scalars.py failed: %s", lu_slurp_tag(j.dir, "tbread", "err"));
    cJSON *tb = cJSON_Parse(out);
    cr_assert_not_null(tb, "not JSON: %s", out);

    /* metrics.jsonl: one row per step 0..19 (trimmed at the resume point, then extended) */
    char path[FSDP_PATH_MAX];
    tu_pathf(path, sizeof path, "%s/metrics.jsonl", logdir);
    char *text = tu_slurp(path);
    static const char *const keys[] = {"loss", "lr", "grad_norm", "tokens_per_s"};
    static const char *const tags[] = {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s"};
    double col[4][20];
    int rows = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), rows++) {
        cJSON *row = cJSON_Parse(line);
        cr_assert(row && rows < 20, "metrics.jsonl row %d: %s", rows, line);
        cr_assert_eq(cJSON_GetObjectItem(row, "step")->valueint, rows, "metrics.jsonl steps in order, once: %s", line);
        for (int k = 0; k < 4; k++)
            col[k][rows] = cJSON_GetObjectItem(row, keys[k])->valuedouble;
        cJSON_Delete(row);
    }
    cr_assert_eq(rows, 20);
    for (int k = 0; k < 4; k++) {
        const cJSON *series = cJSON_GetObjectItem(tb, tags[k]);
        cr_assert(cJSON_IsArray(series), "TensorBoard has no %s: %s", tags[k], out);
        cr_assert_eq(cJSON_GetArraySize(series), 20, "TensorBoard shows %d %s points, want steps 0..19 once: %s",
                     cJSON_GetArraySize(series), tags[k], out);
        for (int s = 0; s < 20; s++) {
            const cJSON *pt = cJSON_GetArrayItem(series, s);
            int step = cJSON_GetArrayItem(pt, 0)->valueint;
            double v = cJSON_GetArrayItem(pt, 1)->valuedouble;
            cr_assert_eq(step, s, "%s: point %d is step %d", tags[k], s, step);
            cr_assert((float)v == (float)col[k][s], "%s step %d: TensorBoard %.9g, metrics.jsonl %.9g", tags[k], s, v,
                      col[k][s]);
        }
    }
    cJSON_Delete(tb);
    free(text);
    free(out);
    free(ck);
    lu_rm_rf(j.dir);
}

/* Runs a 10-step job with a checkpoint every 5 steps on a disk that fills up, in a child that owns the
 * simulated disk: a small tmpfs in a private mount namespace (room for the step-5 checkpoint, not for
 * the step-10 one), else a file size limit (no rank file fits: the step-5 save fails). The child checks
 * what the disk holds afterwards (the tmpfs is gone with it) and writes a verdict to dir/disk.verdict. */
static void disk_full_child(struct job *j, const char *ckdir, int pfd)
{
    char *ck = opt("--checkpoint.dir=%s%s", ckdir, "");
    const char *args[] = {ck, "--checkpoint.interval=5", "--checkpoint.keep_last=0", "--train.max_steps=10", NULL};
    char mode = 't';
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", ckdir, "tmpfs", 0, "size=614400") != 0) {
        struct rlimit lim = {100 * 1024, 100 * 1024};
        mode = setrlimit(RLIMIT_FSIZE, &lim) == 0 ? 'r' : 'x';
        signal(SIGXFSZ, SIG_IGN);
    }
    if (write(pfd, &mode, 1) != 1 || mode == 'x')
        _exit(0);
    int rc = job_run(j, "full", 2, args, NULL);
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_FSIZE, &unlimited);
    char verdict[4600] = "ok", path[4400];
    int r = ckpt_resolve(ckdir, "latest", path, sizeof path);
    if (rc == 0)
        snprintf(verdict, sizeof verdict, "the job exited 0 after a failed save");
    else if (mode == 't' && (r != 0 || !strstr(path, "fsdp_sharded_cpt5")))
        snprintf(verdict, sizeof verdict, "latest should still be the step-5 checkpoint: rc %d, %s", r, path);
    else if (mode == 'r' && r != FSDP_ENOTFOUND)
        snprintf(verdict, sizeof verdict, "a failed first save left a checkpoint visible: %s", path);
    if (mode == 't' && !strcmp(verdict, "ok")) {
        struct ckpt_reader *cr = NULL;
        uint64_t bytes = 0;
        if (ckpt_open(ckdir, "latest", NULL, &cr) != 0 || ckpt_verify(cr, &bytes) != 0)
            snprintf(verdict, sizeof verdict, "the step-5 checkpoint is damaged: %s", error_message());
        ckpt_close(cr);
    }
    char vf[FSDP_PATH_MAX];
    snprintf(vf, sizeof vf, "%s/disk.verdict", j->dir);
    FILE *f = fopen(vf, "w");
    if (f) {
        fputs(verdict, f);
        fclose(f);
    }
    _exit(0);
}

Test(resume, disk_full_stops_training_and_keeps_the_earlier_checkpoint, .timeout = 240)
{
    struct job j;
    job_setup(&j);
    char ckdir[FSDP_PATH_MAX];
    snprintf(ckdir, sizeof ckdir, "%s/ck-full", j.dir);
    mkdir(ckdir, 0755);
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(pfd[0]);
        disk_full_child(&j, ckdir, pfd[1]);
    }
    close(pfd[1]);
    char mode = 'x';
    if (read(pfd[0], &mode, 1) != 1)
        mode = 'x';
    close(pfd[0]);
    waitpid(pid, NULL, 0);
    if (mode == 'x')
        cr_skip_test("cannot simulate a full disk here (no tmpfs mount in a namespace, no RLIMIT_FSIZE)");
    const char *how = mode == 't' ? "tmpfs" : "RLIMIT_FSIZE";
    char vf[FSDP_PATH_MAX];
    snprintf(vf, sizeof vf, "%s/disk.verdict", j.dir);
    char *verdict = tu_slurp(vf);
    char *err = lu_slurp_tag(j.dir, "full", "err");
    cr_assert_str_eq(verdict, "ok", "(%s) %s; job stderr: %s", how, verdict, err);
    const char *want = mode == 't' ? "checkpoint at step 10" : "checkpoint at step 5";
    cr_assert(strstr(err, want) && strstr(err, "earlier checkpoints are intact"),
              "(%s) the failure does not name the save (%s) and say earlier ones are intact: %s", how, want, err);
    free(verdict);
    free(err);
    lu_rm_rf(j.dir);
}

/* fsdp's evaluation of a checkpoint (read through the checkpoint reader, as a resume does) against
 * PyTorch's evaluation of the model file fsdp-ckpt export made from it. */
Test(resume, exported_model_matches_pytorch_logits, .timeout = 240)
{
    struct job j;
    job_setup(&j);
    straight(&j, "ref", "SHARDED_STATE_DICT");
    char ck[FSDP_PATH_MAX], out[FSDP_PATH_MAX], batch[FSDP_PATH_MAX], ref[FSDP_PATH_MAX];
    snprintf(ck, sizeof ck, "%s/ck-ref/fsdp_sharded_cpt20", j.dir);
    snprintf(out, sizeof out, "%s/export.safetensors", j.dir);
    snprintf(batch, sizeof batch, "%s/batch.safetensors", j.dir);
    snprintf(ref, sizeof ref, "%s/torch.safetensors", j.dir);
    const char *ex[] = {lu_build_path("worker/fsdp-ckpt"), "export", ck, out, NULL};
    cr_assert_eq(lu_exit_code(lu_wait(lu_spawn(ex, j.dir, "export", NULL), 60)), 0, "export: %s",
                 lu_slurp_tag(j.dir, "export", "err"));

    struct ckpt_reader *r = NULL;
    cr_assert_eq(ckpt_open(ck, NULL, NULL, &r), 0, "%s", error_message());
    const struct model_layout *l = ckpt_reader_layout(r);
    struct model *m = NULL;
    enum { B = 2, T = 16 };
    cr_assert_eq(model_create(&m, &l->config, kernels_cpu(), B, T), 0, "%s", error_message());
    float *params = calloc(l->numel, sizeof(float));
    for (int p = 0; p < l->n_params; p++)
        cr_assert_eq(ckpt_read(r, CKPT_PARAM, p, 0, l->params[p].numel, params + l->params[p].offset), 0, "%s",
                     error_message());
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 37 + 11) % 256;
        tgt[i] = (i * 53 + 5) % 256;
    }
    cr_assert_eq(model_set_batch(m, tok, tgt), 0);
    float loss = 0;
    cr_assert_eq(model_forward(m, params, &loss), 0, "%s", error_message());
    const float *logits = model_logits(m);

    struct safetensors_entry e[2] = {{.name = "tokens", .dtype = SAFETENSORS_I32, .ndim = 2, .shape = {B, T}, .data = tok},
                                     {.name = "targets", .dtype = SAFETENSORS_I32, .ndim = 2, .shape = {B, T}, .data = tgt}};
    cr_assert_eq(safetensors_write(batch, e, 2, NULL, 0, NULL, NULL), 0, "%s", error_message());
    char script[FSDP_PATH_MAX];
    snprintf(script, sizeof script, "%s/tests/model/torch_ref.py", getenv("FSDP_SOURCE_ROOT"));
    const char *py[] = {"/usr/bin/python3", script, "--weights", out, "--batch", batch, "--n_head", "2", "--out", ref,
                        "--fp64", NULL};
    int rc = lu_exit_code(lu_wait(lu_spawn(py, j.dir, "torch", NULL), 120));
    cr_assert_eq(rc, 0, "torch_ref.py: %s", lu_slurp_tag(j.dir, "torch", "err"));
    struct safetensors_file *f = NULL;
    cr_assert_eq(safetensors_open(&f, ref), 0, "%s", error_message());
    const struct safetensors_tensor *t = safetensors_find(f, "logits");
    cr_assert(t && t->dtype == SAFETENSORS_F32 && t->shape[0] == B * T && t->shape[1] == 256, "torch logits shape");
    float *tl = malloc((size_t)t->numel * sizeof(float));
    cr_assert_eq(safetensors_read(f, t, 0, tl, (size_t)t->numel * sizeof(float)), 0);
    double worst = 0, scale = 0;
    for (int i = 0; i < B * T; i++)
        for (int v = 0; v < 256; v++)
            scale = fmax(scale, fabs(tl[i * 256 + v]));
    for (int i = 0; i < B * T; i++)
        for (int v = 0; v < 256; v++)
            worst = fmax(worst, fabs((double)logits[(size_t)i * l->vocab_padded + v] - tl[i * 256 + v]) / scale);
    cr_assert_leq(worst, 1e-5, "logits differ from PyTorch's by %.2e relative (max |logit| %.3f)", worst, scale);
    free(tl);
    safetensors_close(f);
    free(params);
    model_destroy(m);
    ckpt_close(r);
    lu_rm_rf(j.dir);
}

/* offload_params: on a GPU the shards live in host memory and every collective runs on device copies.
 * FSDP_TEST_OFFLOAD=1 runs that staging path on the CPU backend; the math must not change, and its
 * checkpoints (written from host memory) must resume exactly. */
Test(resume, offload_staging_path_matches_and_resumes, .timeout = 240)
{
    struct job j;
    job_setup(&j);
    straight(&j, "ref", "SHARDED_STATE_DICT");
    char *ck = opt("--checkpoint.dir=%s/ck-%s", j.dir, "off");
    const char *args[] = {ck, "--checkpoint.interval=10", "--checkpoint.keep_last=0", "--fsdp.offload_params=true",
                          "--fsdp.sharding_strategy=HYBRID_SHARD", "--fsdp.hybrid_shard_size=2", NULL};
    const char *env[] = {"FSDP_TEST_OFFLOAD=1", NULL};
    int rc = job_run(&j, "off", 4, args, env);
    cr_assert_eq(rc, 0, "offload run failed: %s", lu_slurp_tag(j.dir, "off", "err"));
    char t_ref[32][32], t_off[32][32];
    double v_ref[32], v_off[32];
    int nr = losses(&j, "ref", t_ref, v_ref, 32), no = losses(&j, "off", t_off, v_off, 32);
    cr_assert_eq(no, nr);
    for (int i = 0; i < nr; i++)
        cr_assert_leq(fabs(v_off[i] - v_ref[i]) / fabs(v_ref[i]), 1e-5, "step %d: offload %s vs %s", i, t_off[i],
                      t_ref[i]);
    const char *more[] = {"--fsdp.offload_params=true", NULL};
    resume_and_compare(&j, "ref", "ck-off/fsdp_sharded_cpt10", "offres", 2, more, false);
    free(ck);
    lu_rm_rf(j.dir);
}

/* The Llama's checkpoints: sharded, resumed exactly at the same world size and resharded at others (versions,
 * strategies); full, holding LlamaForCausalLM's names, resumed elsewhere; and the offload staging path. */
Test(resume, llama_sharded_and_full_resharded, .timeout = 240)
{
    struct job j;
    job_setup_model(&j, TINY_LLAMA);
    straight(&j, "ref", "SHARDED_STATE_DICT");
    resume_and_compare(&j, "ref", "ck-ref/fsdp_sharded_cpt10", "same", 2, NULL, true);
    const char *v1sgo[] = {"--fsdp.version=1", "--fsdp.sharding_strategy=SHARD_GRAD_OP", NULL};
    resume_and_compare(&j, "ref", "ck-ref/fsdp_sharded_cpt10", "w3v1", 3, v1sgo, false);
    const char *hybrid[] = {"--fsdp.sharding_strategy=HYBRID_SHARD", "--fsdp.hybrid_shard_size=2", NULL};
    resume_and_compare(&j, "ref", "ck-ref/fsdp_sharded_cpt10", "w4hy", 4, hybrid, false);
    resume_and_compare(&j, "ref", "ck-ref/fsdp_sharded_cpt10", "w1", 1, NULL, false);
    /* the checkpoint records the Llama config, and the reader refuses another shape naming both */
    const char *tied[] = {"--model.tie_word_embeddings=true", NULL};
    char *res = opt("--checkpoint.resume_from=%s/%s", j.dir, "ck-ref/fsdp_sharded_cpt10");
    char *ck = opt("--checkpoint.dir=%s/ck-%s", j.dir, "tied");
    const char *args[] = {res, ck, tied[0], NULL};
    cr_assert_neq(job_run(&j, "tied", 2, args, NULL), 0, "a tied Llama resumed from an untied checkpoint");
    char *err = lu_slurp_tag(j.dir, "tied", "err");
    cr_assert(strstr(err, "wrong model shape: the checkpoint holds llama n_layer 2, n_head 4, n_embd 32, vocab_size 256, "
                          "block_size 16, n_kv_head 2, intermediate_size 64, untied head but the configured model is "
                          "llama n_layer 2, n_head 4, n_embd 32, vocab_size 256, block_size 16, n_kv_head 2, "
                          "intermediate_size 64, tied head"),
              "%s", err);
    free(err);
    free(res);
    free(ck);

    struct job f;
    job_setup_model(&f, TINY_LLAMA);
    straight(&f, "ref", "FULL_STATE_DICT");
    char p[FSDP_PATH_MAX];
    snprintf(p, sizeof p, "%s/ck-ref/fsdp_cpt10/model.safetensors", f.dir);
    struct safetensors_file *sf = NULL;
    cr_assert_eq(safetensors_open(&sf, p), 0, "%s", error_message());
    const struct safetensors_tensor *t = safetensors_find(sf, "model.layers.1.self_attn.k_proj.weight");
    cr_assert(t && t->shape[0] == 16 && t->shape[1] == 32, "no (16, 32) k_proj in %s", p);
    cr_assert_not_null(safetensors_find(sf, "lm_head.weight"));
    cr_assert_eq(safetensors_find(sf, "model.embed_tokens.weight")->shape[0], 256);
    safetensors_close(sf);
    const char *ns[] = {"--fsdp.sharding_strategy=NO_SHARD", NULL};
    resume_and_compare(&f, "ref", "ck-ref/fsdp_cpt10", "w3ns", 3, ns, false);
    const char *v1[] = {"--fsdp.version=1", NULL};
    resume_and_compare(&f, "ref", "ck-ref/fsdp_cpt10", "w4v1", 4, v1, false);

    /* offload staging: the same losses as the reference */
    char *ckoff = opt("--checkpoint.dir=%s/ck-%s", f.dir, "off");
    const char *off[] = {ckoff, "--fsdp.offload_params=true", "--fsdp.sharding_strategy=HYBRID_SHARD",
                         "--fsdp.hybrid_shard_size=2", NULL};
    const char *env[] = {"FSDP_TEST_OFFLOAD=1", NULL};
    cr_assert_eq(job_run(&f, "off", 4, off, env), 0, "offload run failed: %s", lu_slurp_tag(f.dir, "off", "err"));
    char t_ref[32][32], t_off[32][32];
    double v_ref[32], v_off[32];
    int nr = losses(&f, "ref", t_ref, v_ref, 32), no = losses(&f, "off", t_off, v_off, 32);
    cr_assert_eq(no, nr);
    for (int i = 0; i < nr; i++)
        cr_assert_leq(fabs(v_off[i] - v_ref[i]) / fabs(v_ref[i]), 1e-5, "step %d: offload %s vs %s", i, t_off[i],
                      t_ref[i]);
    free(ckoff);
    lu_rm_rf(j.dir);
    lu_rm_rf(f.dir);
}
