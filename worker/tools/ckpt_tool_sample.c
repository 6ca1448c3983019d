/* fsdp-ckpt sample: text from a checkpoint, so a user sees what the model learned. With the run's
 * tokenizer (--tokenizer, or found from the checkpoint: worker/tools/run_tokenizer.h) the prompt is
 * encoded and the ids decoded with it; without one tokens are bytes (fsdp-prepare-data's default: token
 * = byte value, vocab_size 256) and ids >= 256 are printed as <id>. Runs on the CPU kernels: a sample of a
 * few hundred tokens needs no GPU. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fs.h"
#include "kernels/kernels.h"
#include "worker/tokenizer/tokenizer.h"
#include "worker/tools/ckpt_tool.h"
#include "worker/tools/ckpt_tool_args.h"
#include "worker/tools/run_tokenizer.h"

#include <sys/stat.h>

struct sample_opts {
    const char *target, *prompt, *tokenizer;
    double temperature;
    long long top_k, length, seed;
};

static const struct sample_opts sample_defaults = {
    .prompt = "\n", .temperature = 0.8, .top_k = 200, .length = 200, .seed = 1337};

#define F(x) offsetof(struct sample_opts, x)
static const struct ckpt_arg sample_args[] = {
    {"MODEL", F(target), "a checkpoint directory, root or ROOT:latest, or a Hugging Face model directory"},
};
static const struct ckpt_opt sample_options[] = {
    {.name = "--prompt", .metavar = "TEXT", .kind = CKPT_OPT_TEXT, .field = F(prompt),
     .allowed = "any text; UTF-8 with a tokenizer", .def = "\"\\n\"",
     .help = "the text the sample continues, printed first"},
    {.name = "--temperature", .metavar = "T", .kind = CKPT_OPT_NUMBER, .field = F(temperature), .lo = 0,
     .hi = INFINITY, .def = "0.8", .help = "divides the logits before the softmax; 0 = greedy (the likeliest token)"},
    {.name = "--top_k", .metavar = "K", .kind = CKPT_OPT_INT, .field = F(top_k), .lo = 0, .hi = 1e9, .clamp = true,
     .def = "200", .help = "samples among the K likeliest tokens only; 0 = all"},
    {.name = "--length", .metavar = "N", .kind = CKPT_OPT_INT, .field = F(length), .lo = 0, .hi = 1e9,
     .clamp = true, .def = "200", .help = "tokens to sample"},
    {.name = "--seed", .metavar = "S", .kind = CKPT_OPT_INT, .field = F(seed), .lo = 0, .hi = 0x1p63, .def = "1337",
     .help = "the sampler's seed: the same seed gives the same text on every machine"},
    {.name = "--tokenizer", .metavar = "FILE", .kind = CKPT_OPT_TEXT, .field = F(tokenizer),
     .allowed = "a tokenizer.json or a directory holding one", .def = "the run's (docs/data.md)",
     .help = "decodes with this tokenizer"},
};
#undef F

/* splitmix64: a seeded, portable stream, so --seed gives the same text on every machine. */
static double next_uniform(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Picks a token from one row of logits: top-k cut, temperature, softmax, inverse CDF. temperature 0 is
 * greedy (argmax). */
static int pick(const float *logits, int v, const struct sample_opts *o, float *scratch, uint64_t *rng)
{
    int best = 0;
    for (int i = 1; i < v; i++)
        if (logits[i] > logits[best])
            best = i;
    if (o->temperature == 0)
        return best;
    float cut = -INFINITY;
    if (o->top_k > 0 && o->top_k < v) {
        memcpy(scratch, logits, (size_t)v * sizeof *scratch);
        qsort(scratch, (size_t)v, sizeof *scratch, cmp_desc);
        cut = scratch[o->top_k - 1];
    }
    double sum = 0;
    for (int i = 0; i < v; i++)
        sum += logits[i] >= cut ? exp((logits[i] - logits[best]) / o->temperature) : 0.0;
    double u = next_uniform(rng) * sum, acc = 0;
    for (int i = 0; i < v; i++) {
        if (logits[i] < cut)
            continue;
        acc += exp((logits[i] - logits[best]) / o->temperature);
        if (u < acc)
            return i;
    }
    return best;
}

static void print_token(const struct tokenizer *tok, int t)
{
    size_t n;
    const unsigned char *b = tok ? tokenizer_token_bytes(tok, (uint32_t)t, &n) : NULL;
    if (b)
        fwrite(b, 1, n, stdout);
    else if (!tok && t < 256)
        putchar(t);
    else
        printf("<%d>", t);
}

/* The tokenizer --tokenizer names (a tokenizer.json or a directory holding one), else the run's (NULL
 * when the run used byte tokens). */
static int open_tokenizer(const struct sample_opts *o, const struct ckpt_tool_model *src, int vocab,
                          struct tokenizer **out)
{
    *out = NULL;
    char path[FSDP_PATH_MAX];
    struct stat st;
    if (o->tokenizer) {
        FSDP_TRY(fs_path_format(path, sizeof path, "--tokenizer", "%s%s", o->tokenizer,
                                stat(o->tokenizer, &st) == 0 && S_ISDIR(st.st_mode) ? "/tokenizer.json" : ""));
    } else {
        int rc = run_tokenizer_find(src->path, src->ckpt ? ckpt_reader_state(src->ckpt)->config_text : NULL, path,
                                    sizeof path);
        if (rc == FSDP_ENOTFOUND) {
            if (vocab > 256)
                fprintf(stderr, "fsdp-ckpt sample: %s; ids above 255 print as <id> (--tokenizer FILE decodes "
                        "them)\n", error_message());
            return 0;
        }
        if (rc < 0)
            return rc;
    }
    int rc = tokenizer_load(path, out);
    if (rc == 0 && tokenizer_vocab_size(*out) > (uint32_t)vocab)
        rc = error_set(FSDP_EINVAL, "%s has %u ids but the model's vocab_size is %d: not the tokenizer of this "
                       "model", path, tokenizer_vocab_size(*out), vocab);
    if (rc < 0) {
        tokenizer_free(*out);
        *out = NULL;
    }
    return rc;
}

static int sample_run(const void *opts)
{
    const struct sample_opts o = *(const struct sample_opts *)opts;
    struct ckpt_tool_model src;
    if (ckpt_tool_model_open(o.target, &src) != 0) {
        fprintf(stderr, "fsdp-ckpt: %s\n", error_message());
        return 1;
    }
    const struct model_layout *l = src.l;
    const struct kernels *k = kernels_cpu();
    int T = l->config.block_size, V = l->config.vocab_size, VP = l->vocab_padded;
    size_t plen = strlen(o.prompt);
    float *params = NULL, *scratch = NULL;
    int32_t *ctx = NULL, *tok = NULL, *tgt = NULL;
    struct model *m = NULL;
    struct tokenizer *tz = NULL;
    struct tokenizer_ids pids = {0};
    int rc = 0;
    FSDP_TRY_GOTO(open_tokenizer(&o, &src, V, &tz), rc, out);
    if (tz) {
        if (tokenizer_utf8_check(o.prompt, plen) != plen) {
            rc = error_set(FSDP_EINVAL, "--prompt is not UTF-8");
            goto out;
        }
        FSDP_TRY_GOTO(tokenizer_encode(tz, o.prompt, plen, &pids), rc, out);
        if (pids.n == 0) /* an empty prompt starts where a document would: after a newline */
            FSDP_TRY_GOTO(tokenizer_encode(tz, "\n", 1, &pids), rc, out);
    }
    for (size_t i = 0; !tz && i < plen; i++)
        if ((unsigned char)o.prompt[i] >= (unsigned)V) {
            rc = error_set(FSDP_EINVAL, "prompt byte %u at %zu is outside the vocabulary (vocab_size %d)",
                           (unsigned char)o.prompt[i], i, V);
            goto out;
        }
    if (!(params = k->mem_alloc(l->numel * sizeof *params))) {
        rc = error_set(FSDP_ENOMEM, "out of memory for %zu parameters", l->numel);
        goto out;
    }
    for (int p = 0; p < l->n_params; p++)
        FSDP_TRY_GOTO(ckpt_tool_model_read_finite(&src, p, params + l->params[p].offset), rc, out);
    FSDP_TRY_GOTO(model_create(&m, &l->config, k, 1, T), rc, out);
    size_t ctx_cap = (tz ? pids.n : plen) + (size_t)o.length + 1;
    ctx = malloc(ctx_cap * sizeof *ctx);
    tok = malloc((size_t)T * sizeof *tok);
    tgt = malloc((size_t)T * sizeof *tgt);
    scratch = malloc((size_t)V * sizeof *scratch);
    if (!ctx || !tok || !tgt || !scratch) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    size_t n = 0;
    for (size_t i = 0; tz && i < pids.n; i++)
        ctx[n++] = (int32_t)pids.v[i];
    for (size_t i = 0; !tz && i < plen; i++)
        ctx[n++] = (unsigned char)o.prompt[i];
    if (n == 0)
        ctx[n++] = '\n' < V ? '\n' : 0; /* an empty prompt starts from a newline, as a document would */
    fwrite(o.prompt, 1, plen, stdout);
    uint64_t rng = (uint64_t)o.seed;
    for (long long g = 0; g < o.length; g++) {
        /* The model is causal: positions after the context do not change the logits at its end, so the
         * window is padded with token 0 rather than rebuilding the model for every length. */
        size_t w = n < (size_t)T ? n : (size_t)T, start = n - w;
        for (int i = 0; i < T; i++) {
            tok[i] = (size_t)i < w ? ctx[start + i] : 0;
            tgt[i] = -1;
        }
        float loss;
        FSDP_TRY_GOTO(model_set_batch(m, tok, tgt), rc, out);
        FSDP_TRY_GOTO(model_forward(m, params, &loss), rc, out);
        const float *logits = model_logits(m) + (w - 1) * (size_t)VP;
        int t = pick(logits, V, &o, scratch, &rng);
        ctx[n++] = t;
        print_token(tz, t);
    }
    putchar('\n');
out:
    fflush(stdout);
    if (rc != 0)
        fprintf(stderr, "fsdp-ckpt sample: %s\n", error_message());
    model_destroy(m);
    k->mem_free(params);
    free(ctx);
    free(tok);
    free(tgt);
    free(scratch);
    tokenizer_ids_free(&pids);
    tokenizer_free(tz);
    ckpt_tool_model_close(&src);
    return rc == 0 ? 0 : 1;
}

const struct ckpt_tool_cmd ckpt_tool_sample_cmd = {
    .name = "sample",
    .about = "prints the prompt and N tokens sampled from the model (on the CPU), decoded with the run's tokenizer "
             "when it has one (docs/data.md); else tokens are bytes",
    .args = sample_args,
    .n_args = 1,
    .opts = sample_options,
    .n_opts = sizeof sample_options / sizeof sample_options[0],
    .defaults = &sample_defaults,
    .opts_size = sizeof(struct sample_opts),
    .run = sample_run,
};
