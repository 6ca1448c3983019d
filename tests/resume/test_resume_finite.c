/* A checkpoint whose weights or Adam moments hold NaN or an infinity (saved after its run diverged, or
 * damaged and re-checksummed) is refused at resume, before the first step, naming the checkpoint, the
 * tensor, the kind and the element, instead of training on and reporting this run's "divergence". The
 * checkpoints are real: a run saves one, the test copies it through the checkpoint library (so every CRC
 * matches) with one value changed, and a copy with nothing changed resumes, so the refusal is the value's. */
#include <math.h>

#include "common/error.h"
#include "tests/resume/rtest.h"
#include "worker/ckpt/ckpt.h"

/* Copies the checkpoint `latest` under src into a full checkpoint under dst (same step), with element
 * `at` of parameter `param`'s kind `kind` set to `bad` unless bad is 0. Returns the parameter's name. */
static char *copy_with(const char *src, const char *dst, int kind, int param, size_t at, float bad)
{
    struct ckpt_reader *r = NULL;
    cr_assert_eq(ckpt_open(src, "latest", NULL, &r), 0, "%s", error_message());
    const struct model_layout *l = ckpt_reader_layout(r);
    struct ckpt_state st = *ckpt_reader_state(r);
    st.tokenizer = NULL;
    struct ckpt_full_writer *w = NULL;
    cr_assert_eq(fs_mkdir_p(dst, "the copy's checkpoint dir"), 0, "%s", error_message());
    cr_assert_eq(ckpt_full_open(dst, st.step, l, &w), 0, "%s", error_message());
    cr_assert(param < l->n_params && at < l->params[param].numel);
    for (int p = 0; p < l->n_params; p++)
        for (int k = 0; k < 3; k++) {
            size_t n = l->params[p].numel;
            float *t = malloc(n * sizeof *t);
            cr_assert_not_null(t);
            cr_assert_eq(ckpt_read(r, k, p, 0, n, t), 0, "%s", error_message());
            if (bad != 0 && p == param && k == kind)
                t[at] = bad;
            cr_assert_eq(ckpt_full_put(w, k, p, t), 0, "%s", error_message());
            free(t);
        }
    cr_assert_eq(ckpt_full_commit(w, &st, 0), 0, "%s", error_message());
    char *name = strdup(l->params[param].name);
    ckpt_close(r);
    return name;
}

/* Resumes from `latest` under ck for the remaining steps; returns the exit code, *err the run's stderr. */
static int resume_from(struct job *j, const char *tag, const char *ck, char **err)
{
    char *dir = opt("--checkpoint.dir=%s%s", ck, "");
    const char *args[] = {dir, "--checkpoint.interval=10", "--checkpoint.resume_from=latest", NULL};
    int rc = job_run_alone(j, tag, args, NULL);
    *err = lu_slurp_tag(j->dir, tag, "err");
    free(dir);
    return rc;
}

Test(resume_finite, non_finite_weights_or_moments_in_a_checkpoint_are_named, .timeout = 240)
{
    struct job j;
    job_setup(&j);
    char ck[FSDP_PATH_MAX];
    tu_pathf(ck, sizeof ck, "%s/ck", j.dir);
    char *dir = opt("--checkpoint.dir=%s%s", ck, "");
    const char *first[] = {dir, "--checkpoint.interval=10", "--train.max_steps=10", NULL};
    cr_assert_eq(job_run_alone(&j, "first", first, NULL), 0, "first run: %s", lu_slurp_tag(j.dir, "first", "err"));
    free(dir);

    /* the copy itself resumes: what is refused below is the value, not the copy */
    char clean[FSDP_PATH_MAX];
    tu_pathf(clean, sizeof clean, "%s/clean", j.dir);
    free(copy_with(ck, clean, 0, 0, 0, 0));
    char *err = NULL;
    int rc = resume_from(&j, "clean", clean, &err);
    cr_assert_eq(rc, 0, "resuming from the unchanged copy failed: %s", err);
    free(err);

    static const struct {
        const char *tag;
        int kind, param;
        size_t at;
        float bad;
        const char *holds, *kind_note; /* kind_note: NULL for the weights, which name no kind */
    } cases[] = {
        {"weights", 0, 1, 5, INFINITY, "holds an infinity at element 5", NULL},
        {"exp_avg", 1, 2, 3, NAN, "holds NaN at element 3", "(Adam exp_avg)"},
        {"exp_avg_sq", 2, 3, 7, NAN, "holds NaN at element 7", "(Adam exp_avg_sq)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char bad[FSDP_PATH_MAX];
        tu_pathf(bad, sizeof bad, "%s/%s", j.dir, cases[i].tag);
        char *name = copy_with(ck, bad, cases[i].kind, cases[i].param, cases[i].at, cases[i].bad);
        rc = resume_from(&j, cases[i].tag, bad, &err);
        cr_assert_neq(rc, 0, "%s: resumed from a checkpoint holding %s: %s", cases[i].tag, cases[i].holds, err);
        char tensor[256];
        snprintf(tensor, sizeof tensor, "tensor '%s' %s", name, cases[i].holds);
        cr_assert(strstr(err, tensor) && strstr(err, "the weights were not finite before training started"),
                  "%s: the error does not name \"%s\": %s", cases[i].tag, tensor, err);
        cr_assert(strstr(err, bad), "%s: the error does not name the checkpoint under %s: %s", cases[i].tag, bad,
                  err);
        if (cases[i].kind_note)
            cr_assert(strstr(err, cases[i].kind_note), "%s: the error does not say %s: %s", cases[i].tag,
                      cases[i].kind_note, err);
        else
            cr_assert_null(strstr(err, "(Adam"), "%s: weights named as a moment: %s", cases[i].tag, err);
        cr_assert_null(strstr(err, "loss diverged"), "%s: reported as this run's divergence: %s", cases[i].tag, err);
        /* refused before the first step: the run wrote no metrics row */
        char metrics[FSDP_PATH_MAX + 64];
        snprintf(metrics, sizeof metrics, "%s/%s/metrics.jsonl", j.dir, cases[i].tag);
        char *rows = tu_slurp(metrics);
        cr_assert(!rows || !strstr(rows, "\"loss\""), "%s: steps were trained: %s", cases[i].tag, rows);
        free(rows);
        free(name);
        free(err);
    }
    lu_rm_rf(j.dir);
}
