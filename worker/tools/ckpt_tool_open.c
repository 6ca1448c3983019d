/* fsdp-ckpt's CKPT argument: a checkpoint directory, a root holding `latest`, or ROOT:latest, resolved the
 * way every subcommand needs it; and the model source that also takes a Hugging Face directory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "worker/ckpt/ckpt.h"
#include "worker/tools/ckpt_tool.h"
#include "worker/tools/run_tokenizer.h"

int ckpt_tool_open(const char *target, struct ckpt_reader **out)
{
    char root[4096];
    snprintf(root, sizeof root, "%s", target);
    size_t n = strlen(root);
    if (n > 7 && strcmp(root + n - 7, ":latest") == 0) {
        root[n - 7] = '\0';
        return ckpt_open(root, CKPT_LATEST, NULL, out);
    }
    char meta[4200];
    struct stat st;
    snprintf(meta, sizeof meta, "%s/metadata.json", root);
    if (stat(meta, &st) != 0) {
        snprintf(meta, sizeof meta, "%s/%s", root, CKPT_LATEST);
        if (stat(meta, &st) == 0)
            return ckpt_open(root, CKPT_LATEST, NULL, out);
    }
    return ckpt_open(root, NULL, NULL, out);
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}


/* A Hugging Face directory: the layout from its config.json, the weights checked against it. */
static int open_hf(const char *dir, struct ckpt_tool_model *m)
{
    struct model_hf_config *hc = malloc(sizeof *hc);
    if (!hc)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    FSDP_TRY_GOTO(model_hf_config_read(dir, hc), rc, out);
    FSDP_TRY_GOTO(model_layout_build(&m->own, &hc->config), rc, out);
    m->l = &m->own;
    FSDP_TRY_GOTO(model_weights_open(m->l, dir, "model", &m->hf), rc, out);
out:
    free(hc);
    return rc;
}

int ckpt_tool_model_open(const char *target, struct ckpt_tool_model *m)
{
    memset(m, 0, sizeof *m);
    m->step = -1;
    char meta[4200];
    snprintf(meta, sizeof meta, "%s/metadata.json", target);
    int rc = 0;
    struct stat st;
    size_t n = strlen(target);
    bool latest = n > 7 && strcmp(target + n - 7, ":latest") == 0;
    if (!latest && stat(target, &st) != 0) {
        rc = error_set(FSDP_ENOTFOUND, "%s: no such directory (pass a checkpoint directory, a checkpoint root, "
                                       "ROOT:latest or a Hugging Face model directory)", target);
        goto fail;
    }
    if (!latest && !S_ISDIR(st.st_mode)) {
        rc = error_set(FSDP_EINVAL, "%s: a file; pass the directory that holds it (a checkpoint or a Hugging Face "
                                    "model directory with config.json)", target);
        goto fail;
    }
    if (model_hf_is_dir(target) && !is_file(meta)) {
        snprintf(m->path, sizeof m->path, "%s", target);
        FSDP_TRY_GOTO(open_hf(target, m), rc, fail);
    } else {
        FSDP_TRY_GOTO(ckpt_tool_open(target, &m->ckpt), rc, fail);
        m->l = ckpt_reader_layout(m->ckpt);
        m->step = ckpt_reader_state(m->ckpt)->step;
        snprintf(m->path, sizeof m->path, "%s", ckpt_reader_path(m->ckpt));
    }
    /* the run's tokenizer: in the directory, else beside the training data (none for byte tokens) */
    if (run_tokenizer_find(m->path, m->ckpt ? ckpt_reader_state(m->ckpt)->config_text : NULL, m->tokenizer,
                           sizeof m->tokenizer) != 0) {
        m->tokenizer[0] = '\0';
        error_clear();
    }
    return 0;
fail:
    ckpt_tool_model_close(m);
    return rc;
}

int ckpt_tool_model_read(struct ckpt_tool_model *m, int p, size_t begin, size_t count, float *dst)
{
    return m->ckpt ? ckpt_read(m->ckpt, CKPT_PARAM, p, begin, count, dst)
                   : model_weights_read(m->hf, p, begin, count, dst);
}

void ckpt_tool_model_close(struct ckpt_tool_model *m)
{
    ckpt_close(m->ckpt);
    model_weights_close(m->hf);
    if (m->l == &m->own)
        model_layout_free(&m->own);
    memset(m, 0, sizeof *m);
}
