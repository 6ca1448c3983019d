/* Whole-model weights as safetensors with Hugging Face GPT-2 names, so files from HF (GPT2Model or
 * GPT2LMHeadModel, prefix "transformer.") load directly and our files load in HF. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/safetensors.h"
#include "worker/model/model.h"

static const char prefix[] = "transformer.";

/* Buffers HF stores beside the weights: the causal masks and the LM head tied to wte. Matched by exact
 * name, since a suffix test for "attn.bias" would also hit "c_attn.bias". */
static bool ignored_name(const char *name, int n_layer)
{
    if (strcmp(name, "lm_head.weight") == 0)
        return true;
    int i;
    char buf[MODEL_NAME_MAX];
    if (sscanf(name, "h.%d.", &i) != 1 || i < 0 || i >= n_layer)
        return false;
    snprintf(buf, sizeof buf, "h.%d.attn.bias", i);
    if (strcmp(name, buf) == 0)
        return true;
    snprintf(buf, sizeof buf, "h.%d.attn.masked_bias", i);
    return strcmp(name, buf) == 0;
}

static int check_shape(const char *path, const struct model_layout *l, const struct model_param *p,
                       const struct safetensors_tensor *t)
{
    bool is_wpe = strcmp(p->name, "wpe.weight") == 0;
    bool ok = t->ndim == p->ndim && t->shape[0] == p->init_rows && (p->ndim == 1 || t->shape[1] == p->shape[1]);
    /* A longer position table (HF's 1024) serves any block_size up to its length. */
    if (is_wpe && t->ndim == 2 && t->shape[0] >= p->shape[0] && t->shape[1] == p->shape[1])
        ok = true;
    if (ok)
        return 0;
    char got[96] = "(", want[64];
    for (int d = 0; d < t->ndim; d++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    strncat(got, ")", sizeof got - strlen(got) - 1);
    if (p->ndim == 1)
        snprintf(want, sizeof want, "(%d)", p->init_rows);
    else
        snprintf(want, sizeof want, "(%s%d, %d)", is_wpe ? ">= " : "", p->init_rows, p->shape[1]);
    return error_set(FSDP_EINVAL,
                     "%s: tensor '%s' has shape %s but the config (n_layer %d, n_embd %d, vocab_size %d, "
                     "block_size %d) needs %s",
                     path, t->name, got, l->config.n_layer, l->config.n_embd, l->config.vocab_size,
                     l->config.block_size, want);
}

static int read_param(struct safetensors_file *f, const struct safetensors_tensor *t,
                      const struct model_param *p, float *dst)
{
    size_t real = (size_t)p->init_rows * p->shape[1];
    size_t es = safetensors_dtype_size(t->dtype);
    uint16_t *tmp = NULL;
    int rc = 0;
    if (t->dtype == SAFETENSORS_F32) {
        FSDP_TRY(safetensors_read(f, t, 0, dst, real * es));
    } else {
        if (!(tmp = malloc(real * es + 1)))
            return error_set(FSDP_ENOMEM, "out of memory reading %s", t->name);
        FSDP_TRY_GOTO(safetensors_read(f, t, 0, tmp, real * es), rc, out);
        for (size_t i = 0; i < real; i++)
            dst[i] = t->dtype == SAFETENSORS_BF16 ? kernels_bf16_to_f32(tmp[i]) : kernels_f16_to_f32(tmp[i]);
    }
    memset(dst + real, 0, (p->numel - real) * sizeof *dst); /* vocabulary padding */
out:
    free(tmp);
    return rc;
}

int model_weights_load(const struct model_layout *l, const char *path, float *host)
{
    struct safetensors_file *f;
    FSDP_TRY(safetensors_open(&f, path));
    int rc = 0;
    const struct safetensors_tensor **src = calloc((size_t)l->n_params, sizeof *src);
    if (!src) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < f->n_tensors; i++) {
        const struct safetensors_tensor *t = &f->tensors[i];
        const char *name = strncmp(t->name, prefix, sizeof prefix - 1) == 0 ? t->name + sizeof prefix - 1
                                                                            : t->name;
        if (ignored_name(name, l->config.n_layer))
            continue;
        int p = model_layout_find(l, name);
        if (p < 0)
            rc = error_set(FSDP_EINVAL,
                           "%s: tensor '%s' is not a parameter of %s with n_layer %d; check the file and the "
                           "model config",
                           path, t->name, l->config.model_family, l->config.n_layer);
        else if (src[p])
            rc = error_set(FSDP_EINVAL, "%s: tensor '%s' appears twice (as '%s' and '%s')", path, name,
                           src[p]->name, t->name);
        else if (t->dtype != SAFETENSORS_F32 && t->dtype != SAFETENSORS_F16 && t->dtype != SAFETENSORS_BF16)
            rc = error_set(FSDP_EINVAL, "%s: tensor '%s' has dtype %s; weights must be F32, F16 or BF16", path,
                           t->name, safetensors_dtype_name(t->dtype));
        else
            rc = check_shape(path, l, &l->params[p], t);
        if (rc)
            goto out;
        src[p] = t;
    }
    for (int p = 0; p < l->n_params; p++)
        if (!src[p]) {
            rc = error_set(FSDP_EINVAL, "%s: tensor '%s' is missing (model %s, n_layer %d)", path,
                           l->params[p].name, l->config.model_family, l->config.n_layer);
            goto out;
        }
    for (int p = 0; p < l->n_params; p++)
        FSDP_TRY_GOTO(read_param(f, src[p], &l->params[p], host + l->params[p].offset), rc, out);
out:
    free(src);
    safetensors_close(f);
    return rc;
}

int model_weights_save(const struct model_layout *l, const char *path, const float *host)
{
    struct safetensors_entry *e = calloc((size_t)l->n_params, sizeof *e);
    if (!e)
        return error_set(FSDP_ENOMEM, "out of memory");
    /* Module order (wte, wpe, h.0 ... h.L-1, ln_f) as HF writes it, not flat-buffer order. */
    int n = 0;
    for (int m = 0; m < l->n_modules; m++) {
        const struct model_module *mod = &l->modules[m];
        for (int i = 0; i < mod->n_params; i++) {
            const struct model_param *p = &l->params[mod->first_param + i];
            e[n] = (struct safetensors_entry){.name = p->name, .dtype = SAFETENSORS_F32, .ndim = p->ndim,
                                              .shape = {p->init_rows, p->shape[1]}, .data = host + p->offset};
            n++;
        }
    }
    struct safetensors_meta meta = {.key = "format", .value = "pt"};
    int rc = safetensors_write(path, e, (size_t)n, &meta, 1, NULL, NULL);
    free(e);
    return rc;
}
