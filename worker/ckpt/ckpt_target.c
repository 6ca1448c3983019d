/* What a user passes as checkpoint.resume_from, checked before anything is read: the habits of PyTorch
 * scripts (a .pth / .bin file, the .safetensors file inside a checkpoint, a Hugging Face model directory)
 * get a message that says what to pass instead of a bare "not found". */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "worker/ckpt/ckpt_internal.h"

static bool has_suffix(const char *s, const char *suffix, size_t *stem)
{
    size_t n = strlen(s), m = strlen(suffix);
    if (n <= m || strcmp(s + n - m, suffix) != 0)
        return false;
    *stem = n - m;
    return true;
}

static bool is_checkpoint_dir(const char *dir)
{
    char p[FSDP_PATH_MAX + 32]; /* dir and "/metadata.json" */
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, CKPT_META_FILE);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* dir of path ("." when it has none) into out. */
static void parent_of(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(out, cap, ".");
    else if (slash == path)
        snprintf(out, cap, "/");
    else
        snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

int ckpt_check_resume_target(const char *root, const char *which)
{
    static const char *const pickles[] = {".pth", ".pt", ".bin", ".ckpt", ".pkl", NULL};
    static const char hint[] = "a checkpoint directory (fsdp_cpt<step> or fsdp_sharded_cpt<step> under "
                               "[checkpoint] dir, the one holding metadata.json) or latest";
    if (!which || !*which || strcmp(which, CKPT_LATEST) == 0)
        return 0;
    char path[FSDP_PATH_MAX], stem[FSDP_PATH_MAX], parent[FSDP_PATH_MAX];
    struct stat st;
    /* A bare name is looked up under root when it is not a path that exists as given. */
    if (root && which[0] != '/' && stat(which, &st) != 0)
        snprintf(path, sizeof path, "%s/%s", root, which);
    else
        snprintf(path, sizeof path, "%s", which);
    for (int i = 0; pickles[i]; i++) {
        size_t n;
        if (!has_suffix(path, pickles[i], &n))
            continue;
        snprintf(stem, sizeof stem, "%.*s", (int)n, path);
        if (is_checkpoint_dir(stem))
            return error_set(FSDP_EINVAL,
                             "checkpoint.resume_from = %s: fsdpc checkpoints are directories, not PyTorch %s files; "
                             "pass the directory: resume_from = %s",
                             which, pickles[i], stem);
        return error_set(FSDP_EINVAL,
                         "checkpoint.resume_from = %s: fsdpc does not resume from PyTorch %s files (torch.save pickles); "
                         "pass %s",
                         which, pickles[i], hint);
    }
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        char cfg[FSDP_PATH_MAX + 32]; /* path and "/config.json" */
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        if (!is_checkpoint_dir(path) && stat(cfg, &st) == 0)
            return error_set(FSDP_EINVAL,
                             "checkpoint.resume_from = %s: this is a Hugging Face model directory (config.json, no "
                             "metadata.json), which holds weights but no training state; to start a run from its "
                             "weights set model.init_from = %s and leave resume_from unset",
                             which, which);
        return 0;
    }
    size_t n;
    bool st_file = has_suffix(path, ".safetensors", &n);
    if (st_file || (stat(path, &st) == 0 && !S_ISDIR(st.st_mode))) {
        parent_of(path, parent, sizeof parent);
        if (is_checkpoint_dir(parent))
            return error_set(FSDP_EINVAL,
                             "checkpoint.resume_from = %s: this is a file inside the checkpoint %s; pass the "
                             "directory: resume_from = %s",
                             which, parent, parent);
        if (st_file)
            return error_set(FSDP_EINVAL,
                             "checkpoint.resume_from = %s: a safetensors file holds weights, not training state; pass "
                             "%s; to start a run from these weights set model.init_from = %s instead",
                             which, hint, which);
        return error_set(FSDP_EINVAL, "checkpoint.resume_from = %s: a file, not a checkpoint directory; pass %s",
                         which, hint);
    }
    return 0;
}
