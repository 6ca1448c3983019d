/* Encoding one chunk of fsdp-prepare-data's input (prepare_chunk.h): the UTF-8 check or repair and the
 * tokenizer's runs of each document, recorded for the writer. Runs on the pool's threads, each with its own
 * tokenizer. */
#include "worker/tools/prepare_chunk.h"

#include "common/error.h"
#include "worker/tools/prepare_input.h"

#include <stdlib.h>
#include <string.h>

/* Grows an array of `size`-byte elements to hold `need`. */
static int reserve(void **v, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *p = realloc(*v, c * size);
    if (!p)
        return error_set(FSDP_ENOMEM, "out of memory");
    *v = p;
    *cap = c;
    return 0;
}

static int run_out(void *ctx, const uint32_t *ids, size_t n, size_t text_bytes)
{
    struct prepare_chunk *c = ctx;
    FSDP_TRY(reserve((void **)&c->runs, &c->runs_cap, c->n_runs + 1, sizeof *c->runs));
    FSDP_TRY(reserve((void **)&c->ids, &c->ids_cap, c->n_ids + n, sizeof *c->ids));
    memcpy(c->ids + c->n_ids, ids, n * sizeof *ids);
    c->n_ids += n;
    c->runs[c->n_runs++] = (struct prepare_run){.n = n, .text_bytes = text_bytes};
    c->docs[c->n_docs - 1].n_runs++;
    return 0;
}

static int new_doc(struct prepare_chunk *c)
{
    FSDP_TRY(reserve((void **)&c->docs, &c->docs_cap, c->n_docs + 1, sizeof *c->docs));
    c->docs[c->n_docs++] = (struct prepare_chunk_doc){.first_run = c->n_runs};
    return 0;
}

/* One document's text with a tokenizer: its UTF-8 checked (or repaired), then its runs. */
static int encode_text(struct tokenizer *t, const struct prepare_encode_opts *o, struct prepare_chunk *c,
                       const char *text, size_t len)
{
    FSDP_TRY(new_doc(c));
    char *repaired = NULL;
    size_t n = len, bad_at = tokenizer_utf8_check(text, len);
    if (bad_at < len) {
        if (o->invalid_utf8 == PREPARE_UTF8_SKIP) {
            c->docs[c->n_docs - 1].skipped = true;
            c->utf8_skipped++;
            return 1;
        }
        if (o->invalid_utf8 == PREPARE_UTF8_ERROR)
            return error_set(FSDP_EINVAL, "%s: not UTF-8 (invalid byte 0x%02x at offset %zu); convert it (iconv), or "
                             "pass --invalid-utf8 replace (U+FFFD, as Python's errors=\"replace\") or --invalid-utf8 "
                             "skip", c->path, (unsigned char)text[bad_at], bad_at);
        size_t replaced;
        FSDP_TRY(tokenizer_utf8_repair(text, len, &repaired, &n, &replaced));
        c->utf8_replaced += replaced;
        text = repaired;
    }
    int rc = tokenizer_encode_runs(t, text, n, o->run_bytes, run_out, c);
    free(repaired);
    return rc < 0 ? rc : 0;
}

struct jsonl_ctx {
    struct tokenizer *t;
    const struct prepare_encode_opts *o;
    struct prepare_chunk *c;
};

static int jsonl_doc(void *ctx, const struct prepare_doc *d)
{
    struct jsonl_ctx *j = ctx;
    struct prepare_chunk *c = j->c;
    c->documents++;
    if (j->t) {
        int rc = encode_text(j->t, j->o, c, d->text, d->len);
        return rc < 0 ? rc : 0;
    }
    FSDP_TRY(new_doc(c));
    FSDP_TRY(reserve((void **)&c->bytes, &c->bytes_cap, c->n_bytes + d->len, 1));
    memcpy(c->bytes + c->n_bytes, d->text, d->len);
    struct prepare_chunk_doc *doc = &c->docs[c->n_docs - 1];
    doc->off = c->n_bytes;
    doc->len = d->len;
    c->n_bytes += d->len;
    return 0;
}

static int encode(struct tokenizer *t, const struct prepare_encode_opts *o, struct prepare_chunk *c)
{
    switch (c->kind) {
    case PREPARE_CHUNK_SKIP:
        return 0;
    case PREPARE_CHUNK_TEXT:
        if (t) {
            int rc = encode_text(t, o, c, (const char *)c->data, c->len);
            FSDP_TRY(rc);
            c->documents += rc == 0;
            return 0;
        }
        FSDP_TRY(new_doc(c));
        c->docs[0].in_input = true;
        c->docs[0].len = c->len;
        c->documents++;
        return 0;
    case PREPARE_CHUNK_JSONL: {
        struct jsonl_ctx j = {.t = t, .o = o, .c = c};
        int rc = prepare_input_jsonl(c->path, c->data, c->len, c->first_line, o->text_field, o->skip_bad_lines,
                                     &c->bad_lines, jsonl_doc, &j);
        return rc < 0 ? rc : 0;
    }
    }
    return error_set(FSDP_EINVAL, "unknown chunk kind %d", (int)c->kind);
}

void prepare_chunk_encode(struct tokenizer *t, const struct prepare_encode_opts *o, struct prepare_chunk *c)
{
    int rc = encode(t, o, c);
    if (rc < 0) {
        c->rc = rc;
        c->error = strdup(error_message()); /* set on this thread: the writer reports it on its own */
    }
}

void prepare_chunk_free_output(struct prepare_chunk *c)
{
    free(c->docs);
    free(c->runs);
    free(c->ids);
    free(c->bytes);
    free(c->error);
    c->docs = NULL;
    c->runs = NULL;
    c->ids = NULL;
    c->bytes = NULL;
    c->error = NULL;
}
