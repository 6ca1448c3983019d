/* Encoding: pre-tokens from tokenizer_pretok.c through BPE (tokenizer_bpe.c) into ids, whole or in runs
 * that end on pre-token boundaries. */
#include "worker/tokenizer/tokenizer_internal.h"

#include "common/error.h"

struct enc {
    struct tokenizer *t;
    struct tokenizer_ids *out;
    /* runs */
    size_t chunk, run_start; /* text offset where the current run began */
    tokenizer_run_fn fn;
    void *ctx;
};

static int enc_emit(void *ctx, const unsigned char *p, size_t n, bool is_added, uint32_t id, size_t end)
{
    struct enc *e = ctx;
    FSDP_TRY(is_added ? tokenizer_ids_push(e->out, id) : tok_bpe_piece(&e->t->bpe, p, n, e->out));
    if (!e->fn || end - e->run_start < e->chunk)
        return 0;
    int rc = e->fn(e->ctx, e->out->v, e->out->n, end - e->run_start);
    e->out->n = 0;
    e->run_start = end;
    return rc;
}

int tokenizer_encode(struct tokenizer *t, const char *text, size_t len, struct tokenizer_ids *out)
{
    struct enc e = {.t = t, .out = out};
    return tok_pretok_run(t, (const unsigned char *)text, len, enc_emit, &e);
}

int tokenizer_encode_runs(struct tokenizer *t, const char *text, size_t len, size_t chunk_bytes,
                          tokenizer_run_fn fn, void *ctx)
{
    struct tokenizer_ids ids = {0};
    struct enc e = {.t = t, .out = &ids, .chunk = chunk_bytes ? chunk_bytes : 1, .fn = fn, .ctx = ctx};
    int rc = 0;
    FSDP_TRY_GOTO(tok_pretok_run(t, (const unsigned char *)text, len, enc_emit, &e), rc, done);
    /* the text after the last piece that closed a run (or all of it) */
    if (ids.n || e.run_start < len)
        rc = fn(ctx, ids.v, ids.n, len - e.run_start);
done:
    tokenizer_ids_free(&ids);
    return rc;
}

struct pieces {
    tokenizer_piece_fn fn;
    void *ctx;
};

static int piece_emit(void *ctx, const unsigned char *p, size_t n, bool is_added, uint32_t id, size_t end)
{
    (void)id;
    (void)end;
    struct pieces *c = ctx;
    return c->fn(c->ctx, (const char *)p, n, is_added);
}

int tokenizer_pieces(struct tokenizer *t, const char *text, size_t len, tokenizer_piece_fn fn, void *ctx)
{
    struct pieces c = {fn, ctx};
    return tok_pretok_run(t, (const unsigned char *)text, len, piece_emit, &c);
}
