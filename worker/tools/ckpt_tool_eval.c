/* fsdp-ckpt eval: the mean loss of a checkpoint or a Hugging Face directory on a token file, so a user
 * can check a model without training it. Batches are consecutive windows from the start of the file
 * (data.h's sequential order: batch k, row r starts at token (k * batch + r) * block_size), the same for
 * every model, so two models' figures compare. Runs on the CPU kernels. */
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/error.h"
#include "common/fs.h"
#include "kernels/kernels.h"
#include "worker/tools/ckpt_tool.h"
#include "worker/tools/ckpt_tool_args.h"
#include "worker/train/data.h"

struct eval_opts {
    const char *src, *data, *json;
    long long steps, batch, block; /* steps, block 0: every whole batch, the model's block_size */
};

static const struct eval_opts eval_defaults = {.steps = 0, .batch = 8, .block = 0};

#define F(x) offsetof(struct eval_opts, x)
static const struct ckpt_arg eval_args[] = {
    {"MODEL", F(src), "a checkpoint directory, root or ROOT:latest, or a Hugging Face model directory"},
};
static const struct ckpt_opt eval_options[] = {
    {.name = "--data", .metavar = "TOKENS.bin", .kind = CKPT_OPT_TEXT, .field = F(data), .required = true,
     .allowed = "a token file of fsdp-prepare-data", .help = "the tokens the loss is measured on"},
    {.name = "--steps", .metavar = "N", .kind = CKPT_OPT_INT, .field = F(steps), .lo = 1, .hi = 1e9,
     .def = "every whole batch the file holds", .help = "batches to evaluate; past the file's end they wrap"},
    {.name = "--batch", .metavar = "B", .kind = CKPT_OPT_INT, .field = F(batch), .lo = 1, .hi = 1e9, .def = "8",
     .help = "rows of a batch"},
    {.name = "--block_size", .metavar = "T", .kind = CKPT_OPT_INT, .field = F(block), .lo = 1, .hi = 1e9,
     .def = "the model's block_size", .help = "tokens of a row, at most the model's block_size"},
    {.name = "--json", .metavar = "OUT.json", .kind = CKPT_OPT_TEXT, .field = F(json),
     .allowed = "a file, or - for stdout",
     .help = "also writes model, data, step, loss, perplexity, tokens, steps, batch and block_size as JSON"},
};
#undef F

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

static int eval_run(const void *opts)
{
    const struct eval_opts o = *(const struct eval_opts *)opts;
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

const struct ckpt_tool_cmd ckpt_tool_eval_cmd = {
    .name = "eval",
    .alias = "score",
    .about = "prints the mean loss (and perplexity) of the model on a token file, on the CPU: batch k, row r is "
             "the window starting at token (k x B + r) x T",
    .args = eval_args,
    .n_args = 1,
    .opts = eval_options,
    .n_opts = sizeof eval_options / sizeof eval_options[0],
    .defaults = &eval_defaults,
    .opts_size = sizeof(struct eval_opts),
    .run = eval_run,
};
