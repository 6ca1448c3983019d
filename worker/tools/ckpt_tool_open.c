/* fsdp-ckpt's CKPT argument: a checkpoint directory, a root holding `latest`, or ROOT:latest, resolved the
 * way every subcommand needs it; and the model source that also takes a Hugging Face directory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/config.h"
#include "common/error.h"
#include "common/fs.h"
#include "worker/config/worker_config.h"
#include "worker/ckpt/ckpt.h"
#include "worker/tools/ckpt_tool.h"
#include "worker/tools/run_tokenizer.h"

int ckpt_tool_open(const char *target, struct ckpt_reader **out)
{
    char root[FSDP_PATH_MAX];
    FSDP_TRY(fs_path_format(root, sizeof root, "checkpoint", "%s", target));
    size_t n = strlen(root);
    if (n > 7 && strcmp(root + n - 7, ":latest") == 0) {
        root[n - 7] = '\0';
        return ckpt_open(root, CKPT_LATEST, NULL, out);
    }
    char meta[FSDP_PATH_MAX + 32]; /* root and "/metadata.json" or "/latest" */
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


/* config.json's sizes through the checks fsdp-worker gives a model.init_from directory before anything is
 * sized from them: each setting against its [model] key's bounds (the schema, as train_sources_apply
 * applies them), then the rules between keys (worker_config_view). A hostile file (n_layer 10^9) would
 * otherwise size the layout's tables and then the weights' buffer. */
static int check_hf_config(const struct model_hf_config *hc)
{
    struct config *cfg = NULL;
    struct worker_config *wc = malloc(sizeof *wc);
    int rc = wc ? config_create(worker_config_schema(), &cfg) : error_set(FSDP_ENOMEM, "out of memory");
    for (int i = 0; rc == 0 && i < hc->n_settings; i++) {
        const struct model_hf_setting *st = &hc->settings[i];
        char name[64];
        snprintf(name, sizeof name, "model.%s", st->key);
        if (config_set(cfg, name, st->value) != 0) {
            char why[512];
            snprintf(why, sizeof why, "%s", error_message());
            rc = error_set(FSDP_EINVAL, "%s: \"%s\" = %s is not a usable [model] %s: %s", hc->path, st->hf_key,
                           st->value, st->key, why);
        }
    }
    if (rc == 0 && worker_config_view(cfg, wc) != 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", error_message());
        rc = error_set(FSDP_EINVAL, "%s: %s", hc->path, why);
    }
    config_destroy(cfg);
    free(wc);
    return rc;
}

/* A Hugging Face directory: the layout from its config.json once its sizes are within bounds, the weights
 * checked against it (every tensor present with the layout's shape) before the caller allocates the model. */
static int open_hf(const char *dir, struct ckpt_tool_model *m)
{
    struct model_hf_config *hc = malloc(sizeof *hc);
    if (!hc)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    FSDP_TRY_GOTO(model_hf_config_read(dir, hc), rc, out);
    FSDP_TRY_GOTO(check_hf_config(hc), rc, out);
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
    char meta[FSDP_PATH_MAX];
    int rc = fs_path_format(meta, sizeof meta, "checkpoint", "%s/metadata.json", target);
    if (rc)
        return rc;
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
        FSDP_TRY_GOTO(fs_path_format(m->path, sizeof m->path, "model directory", "%s", target), rc, fail);
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

int ckpt_tool_model_read_finite(struct ckpt_tool_model *m, int p, float *dst)
{
    const struct model_layout *l = m->l;
    size_t n = l->params[p].numel;
    FSDP_TRY(ckpt_tool_model_read(m, p, 0, n, dst));
    for (size_t i = 0; i < n; i++)
        if (!isfinite(dst[i]))
            return error_set(FSDP_ERANGE,
                             "%s: tensor '%s' holds %s at element %zu (of %zu): these weights are not usable (the "
                             "run had diverged when they were saved, or the file is damaged); take an earlier "
                             "checkpoint", m->path, l->params[p].name, isnan(dst[i]) ? "NaN" : "an infinity", i, n);
    return 0;
}

void ckpt_tool_model_close(struct ckpt_tool_model *m)
{
    ckpt_close(m->ckpt);
    model_weights_close(m->hf);
    if (m->l == &m->own)
        model_layout_free(&m->own);
    memset(m, 0, sizeof *m);
}
