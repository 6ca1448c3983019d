/* fsdp-ckpt eval: the mean loss of a checkpoint or a Hugging Face directory on a token file, so a user
 * can check a model without training it. Batches are consecutive windows from the start of the file
 * (data.h's sequential order: batch k, row r starts at token (k * batch + r) * block_size), the same for
 * every model, so two models' figures compare. Runs on the CPU kernels. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/error.h"
#include "common/fs.h"
#include "kernels/kernels.h"
#include "worker/tools/ckpt_tool.h"
#include "worker/train/data.h"

struct eval_opts {
    const char *src, *data, *json;
    long long steps, batch, block;
};

static int parse(int argc, char **argv, struct eval_opts *o)
{
    *o = (struct eval_opts){.steps = 0, .batch = 8, .block = 0};
    static const char *const flags[] = {"--data", "--steps", "--batch", "--block_size", "--json"};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int f = -1;
        for (int k = 0; k < 5; k++) {
            size_t n = strlen(flags[k]);
            if (strncmp(a, flags[k], n) == 0 && (a[n] == '=' || a[n] == '\0')) {
                f = k;
                v = a[n] == '=' ? a + n + 1 : (i + 1 < argc ? argv[++i] : NULL);
            }
        }
        if (f < 0 && a[0] != '-' && !o->src) {
            o->src = a;
            continue;
        }
        if (f < 0 || !v) {
            fprintf(stderr, "fsdp-ckpt eval: %s \"%s\"\n", f < 0 ? "unknown argument" : "missing value for", a);
            return 2;
        }
        if (f == 0) {
            o->data = v;
        } else if (f == 4) {
            o->json = v;
        } else {
            char *end;
            errno = 0;
            long long x = strtoll(v, &end, 10);
            if (*end || errno || x < 1 || x > 1000000000) {
                fprintf(stderr, "fsdp-ckpt eval: %s needs a positive integer (got \"%s\")\n", flags[f], v);
                return 2;
            }
            *(f == 1 ? &o->steps : f == 2 ? &o->batch : &o->block) = x;
        }
    }
    if (!o->src || !o->data) {
        fprintf(stderr, "usage: fsdp-ckpt eval CKPT_OR_HF_DIR --data TOKENS.bin [--steps N] [--batch B] "
                        "[--block_size T] [--json OUT.json]\n");
        return 2;
    }
    return 0;
}

static int write_json(const char *path, const struct eval_opts *o, const struct ckpt_tool_model *m, double loss,
                      long long tokens, long long steps, long long block)
{
    cJSON *r = cJSON_CreateObject();
    bool ok = r && cJSON_AddStringToObject(r, "model", m->path) && cJSON_AddStringToObject(r, "data", o->data) &&
              (m->step >= 0 ? cJSON_AddNumberToObject(r, "step", (double)m->step) != NULL
                            : cJSON_AddNullToObject(r, "step") != NULL) &&
              cJSON_AddNumberToObject(r, "loss", loss) && cJSON_AddNumberToObject(r, "perplexity", exp(loss)) &&
              cJSON_AddNumberToObject(r, "tokens", (double)tokens) &&
              cJSON_AddNumberToObject(r, "steps", (double)steps) &&
              cJSON_AddNumberToObject(r, "batch", (double)o->batch) &&
              cJSON_AddNumberToObject(r, "block_size", (double)block);
    char *text = ok ? cJSON_PrintUnformatted(r) : NULL;
    cJSON_Delete(r);
    if (!text)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    size_t len = strlen(text);
    text[len] = '\n';
    if (strcmp(path, "-") == 0)
        fwrite(text, 1, len + 1, stdout);
    else
        rc = fs_write_atomic(path, text, len + 1);
    free(text);
    return rc;
}

/* Mean loss of the model over `steps` batches of d: sum of per-token losses over all targets. */
static int mean_loss(struct ckpt_tool_model *m, struct data_file *d, long long steps, long long B, long long T,
                     double *mean, long long *tokens)
{
    const struct model_layout *l = m->l;
    const struct kernels *k = kernels_cpu();
    struct model *model = NULL;
    int32_t *tok = NULL, *tgt = NULL;
    int rc = 0;
    float *params = k->mem_alloc(l->numel * sizeof *params);
    if (!params) {
        rc = error_set(FSDP_ENOMEM, "out of memory for %zu parameters", l->numel);
        goto out;
    }
    for (int p = 0; p < l->n_params; p++)
        FSDP_TRY_GOTO(ckpt_tool_model_read_finite(m, p, params + l->params[p].offset), rc, out);
    FSDP_TRY_GOTO(model_create(&model, &l->config, k, (int)B, (int)T), rc, out);
    tok = malloc((size_t)(B * T) * sizeof *tok);
    tgt = malloc((size_t)(B * T) * sizeof *tgt);
    if (!tok || !tgt) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    double sum = 0;
    *tokens = 0;
    for (long long s = 0; s < steps; s++) {
        float loss;
        FSDP_TRY_GOTO(data_get_rows(d, s, 0, B, tok, tgt), rc, out);
        FSDP_TRY_GOTO(model_set_batch(model, tok, tgt), rc, out);
        FSDP_TRY_GOTO(model_forward(model, params, &loss), rc, out);
        int n = model_batch_targets(model);
        sum += (double)loss * n;
        *tokens += n;
    }
    *mean = *tokens ? sum / (double)*tokens : NAN;
out:
    free(tok);
    free(tgt);
    model_destroy(model);
    if (params)
        k->mem_free(params);
    return rc;
}

int ckpt_tool_eval(int argc, char **argv)
{
    struct eval_opts o;
    int st = parse(argc, argv, &o);
    if (st)
        return st;
    struct ckpt_tool_model m;
    if (ckpt_tool_model_open(o.src, &m) != 0) {
        fprintf(stderr, "fsdp-ckpt eval: %s\n", error_message());
        return 1;
    }
    const struct model_config *cfg = &m.l->config;
    struct data_file *d = NULL;
    int rc = 0;
    if (o.block > cfg->block_size) {
        rc = error_set(FSDP_EINVAL, "--block_size %lld is longer than the model's context (block_size %d)", o.block,
                       cfg->block_size);
        goto out;
    }
    long long T = o.block ? o.block : cfg->block_size, B = o.batch;
    struct data_options dopt = {.block_size = T, .vocab_size = cfg->vocab_size, .batch_rows = B,
                                .order = DATA_ORDER_SEQUENTIAL, .seed = 0, .stream = DATA_STREAM_VAL};
    FSDP_TRY_GOTO(data_open(o.data, &dopt, &d), rc, out);
    /* Windows that fit without wrapping; --steps asks for fewer (or, past the end, wraps as training does). */
    long long fit = (data_num_tokens(d) - 1) / (T * B);
    long long steps = o.steps ? o.steps : fit;
    if (steps < 1) {
        rc = error_set(FSDP_EINVAL, "%s: %lld tokens hold no batch of %lld x %lld tokens; lower --batch or --block_size",
                       o.data, (long long)data_num_tokens(d), B, T);
        goto out;
    }
    double mean = NAN;
    long long tokens = 0;
    FSDP_TRY_GOTO(mean_loss(&m, d, steps, B, T, &mean, &tokens), rc, out);
    printf("loss %.6f (perplexity %.3f) of %s on %s: %lld tokens, %lld batch(es) of %lld x %lld\n", mean, exp(mean),
           m.path, o.data, tokens, steps, B, T);
    if (o.json)
        FSDP_TRY_GOTO(write_json(o.json, &o, &m, mean, tokens, steps, T), rc, out);
out:
    if (rc)
        fprintf(stderr, "fsdp-ckpt eval: %s\n", error_message());
    fflush(stdout);
    data_close(d);
    ckpt_tool_model_close(&m);
    return rc ? 1 : 0;
}
