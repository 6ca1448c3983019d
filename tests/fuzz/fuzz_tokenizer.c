/* libFuzzer target: the tokenizer's encode and decode on any text (fsdp-prepare-data hands it whatever
 * files a user has), with the committed Qwen2 and SentencePiece fixtures (tests/tokenizer/data/fixtures/).
 * The input, made UTF-8 as --invalid-utf8 replace does, must encode; beyond not crashing, the merge
 * strategies must agree (the heap and the quadratic scan; for SentencePiece, word by word and whole),
 * the runs of tokenizer_encode_runs must give the same ids and add up to the text's length, and the ids
 * must decode. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/tokenizer/tokenizer.h"
#include "worker/tokenizer/tokenizer_internal.h"

static struct tokenizer *toks[3];
static const char *const names[3] = {"qwen2", "spm", "spm_legacy"};

static void load_all(void)
{
    for (int i = 0; i < 3; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.json", FSDP_TOKENIZER_FIXTURES, names[i]);
        if (tokenizer_load(path, &toks[i]) != 0) {
            fprintf(stderr, "fuzz_tokenizer: cannot load %s\n", path);
            abort();
        }
    }
}

struct runs {
    struct tokenizer_ids ids;
    size_t bytes;
};

static int collect(void *ctx, const uint32_t *ids, size_t n, size_t text_bytes)
{
    struct runs *r = ctx;
    r->bytes += text_bytes;
    for (size_t i = 0; i < n; i++)
        if (tokenizer_ids_push(&r->ids, ids[i]) != 0)
            return -1;
    return 0;
}

static bool same(const struct tokenizer_ids *a, const struct tokenizer_ids *b)
{
    return a->n == b->n && (a->n == 0 || memcmp(a->v, b->v, a->n * sizeof *a->v) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!toks[0])
        load_all();
    char *text;
    size_t len, replaced;
    if (tokenizer_utf8_repair((const char *)data, size, &text, &len, &replaced) != 0)
        abort();
    for (int i = 0; i < 3; i++) {
        struct tokenizer *t = toks[i];
        struct tokenizer_ids a = {0}, b = {0};
        struct runs r = {0};
        if (tokenizer_encode(t, text, len, &a) != 0)
            abort();
        /* every piece through the scan (no heap, no cache), and for SentencePiece no word cutting */
        bool split = t->bpe.split_meta;
        t->bpe.split_meta = false;
        tokenizer_set_heap_threshold(t, SIZE_MAX);
        tokenizer_set_cache(t, false);
        int rc = len <= 4096 ? tokenizer_encode(t, text, len, &b) : 0;
        t->bpe.split_meta = split;
        tokenizer_set_heap_threshold(t, 64);
        tokenizer_set_cache(t, true);
        if (rc != 0 || (len <= 4096 && !same(&a, &b))) {
            fprintf(stderr, "fuzz_tokenizer: %s: the merge strategies disagree\n", names[i]);
            abort();
        }
        if (tokenizer_encode_runs(t, text, len, 16, collect, &r) != 0 || !same(&a, &r.ids) || r.bytes != len) {
            fprintf(stderr, "fuzz_tokenizer: %s: runs differ from the encoding or cover %zu of %zu bytes\n",
                    names[i], r.bytes, len);
            abort();
        }
        char *back;
        size_t blen;
        if (tokenizer_decode(t, a.v, a.n, false, &back, &blen) != 0)
            abort();
        free(back);
        tokenizer_ids_free(&a);
        tokenizer_ids_free(&b);
        tokenizer_ids_free(&r.ids);
    }
    free(text);
    return 0;
}
