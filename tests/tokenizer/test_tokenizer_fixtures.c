/* The Qwen2 and SentencePiece styles (Llama 2 / Mistral Metaspace, the older Prepend + Replace normalizer
 * form, Gemma's Replace, NFKC, <unk> without byte_fallback) against committed fixtures: tests/tokenizer/data/fixtures/ holds small
 * tokenizer.json files of each style and the ids and decode Hugging Face `tokenizers` gave for
 * tests/tokenizer/data/mixed.txt, edges.txt and special_start.txt (written by tests/tokenizer/make_fixtures.py; test_tokenizer_ref
 * checks them against the venv's tokenizers again). No venv needed. Also: the runs of an encoding of
 * normalized text add up to the raw text, and a whole document that is one pre-token (Metaspace with
 * split false) is merged in O(n log n): the same ids as the quadratic scan, and a megabyte in seconds. */
#include "common/error.h"
#include "tests/util/tooltest.h"
#include "worker/tokenizer/tokenizer.h"
#include "worker/tokenizer/tokenizer_internal.h"

#include <time.h>

TestSuite(tokenizer_fixtures, .init = tt_setup, .fini = tt_teardown);

static const char *const toks[] = {"qwen2", "qwen2_nfkc", "spm", "spm_split", "spm_always_metaspace_decoder",
                                   "spm_legacy", "spm_gemma", "spm_nfkc", "spm_unk_fused", "spm_unk"};
static const char *const texts[] = {"mixed", "edges", "special_start"};

static struct tokenizer *load(const char *name)
{
    char rel[256], p[1024];
    snprintf(rel, sizeof rel, "tests/tokenizer/data/fixtures/%s.json", name);
    struct tokenizer *t;
    cr_assert_eq(tokenizer_load(tu_source_path(p, sizeof p, rel), &t), 0, "%s", error_message());
    return t;
}

static char *text_of(const char *stem, size_t *len)
{
    char rel[256], p[1024];
    snprintf(rel, sizeof rel, "tests/tokenizer/data/%s.txt", stem);
    return tu_read_ok(tu_source_path(p, sizeof p, rel), len);
}

struct runs {
    struct tokenizer_ids ids;
    size_t bytes, calls;
};

static int collect(void *ctx, const uint32_t *ids, size_t n, size_t text_bytes)
{
    struct runs *r = ctx;
    r->bytes += text_bytes;
    r->calls++;
    for (size_t i = 0; i < n; i++)
        if (tokenizer_ids_push(&r->ids, ids[i]) != 0)
            return -1;
    return 0;
}

Test(tokenizer_fixtures, ids_and_decode_equal_tokenizers)
{
    for (size_t i = 0; i < sizeof toks / sizeof *toks; i++) {
        struct tokenizer *t = load(toks[i]);
        for (size_t j = 0; j < sizeof texts / sizeof *texts; j++) {
            size_t len, rlen, dlen;
            char *text = text_of(texts[j], &len);
            char rel[256], p[1024];
            snprintf(rel, sizeof rel, "tests/tokenizer/data/fixtures/%s__%s.ids", toks[i], texts[j]);
            uint32_t *ref = (uint32_t *)tu_read_ok(tu_source_path(p, sizeof p, rel), &rlen);
            snprintf(rel, sizeof rel, "tests/tokenizer/data/fixtures/%s__%s.decoded", toks[i], texts[j]);
            char *want = tu_read_ok(tu_source_path(p, sizeof p, rel), &dlen);
            struct tokenizer_ids ids = {0};
            cr_assert_eq(tokenizer_encode(t, text, len, &ids), 0, "%s: %s", toks[i], error_message());
            size_t n = rlen / 4, first = 0;
            while (first < n && first < ids.n && ids.v[first] == ref[first])
                first++;
            cr_expect(ids.n == n && first == n, "%s on %s: %zu ids, tokenizers %zu; first difference at %zu (%u vs %u)",
                      toks[i], texts[j], ids.n, n, first, first < ids.n ? ids.v[first] : 0,
                      first < n ? ref[first] : 0);
            char *back;
            size_t blen;
            cr_assert_eq(tokenizer_decode(t, ref, n, false, &back, &blen), 0, "%s", error_message());
            cr_expect(blen == dlen && memcmp(back, want, dlen) == 0, "%s on %s: decode differs from tokenizers' "
                      "(%zu bytes, tokenizers %zu):\n%s\n---\n%s", toks[i], texts[j], blen, dlen, back, want);
            /* runs: the same ids, and their text bytes add up to the raw text's (normalizers change lengths) */
            struct runs r = {0};
            cr_assert_eq(tokenizer_encode_runs(t, text, len, 64, collect, &r), 0, "%s", error_message());
            cr_expect(r.ids.n == ids.n && memcmp(r.ids.v, ids.v, ids.n * sizeof *ids.v) == 0, "%s on %s: runs",
                      toks[i], texts[j]);
            cr_expect_eq(r.bytes, len, "%s on %s: runs cover %zu bytes of %zu", toks[i], texts[j], r.bytes, len);
            tokenizer_ids_free(&r.ids);
            tokenizer_ids_free(&ids);
            free(back);
            free(want);
            free(ref);
            free(text);
        }
        tokenizer_free(t);
    }
}

Test(tokenizer_fixtures, styles_and_special_tokens)
{
    struct tokenizer *q = load("qwen2"), *s = load("spm"), *l = load("spm_legacy"), *g = load("spm_gemma");
    cr_expect_str_eq(tokenizer_style(q), "NFC+Split+ByteLevel");
    cr_expect_str_eq(tokenizer_style(s), "Metaspace+SentencePiece");
    cr_expect_str_eq(tokenizer_style(l), "Prepend+Replace+SentencePiece");
    cr_expect_str_eq(tokenizer_style(g), "Replace+Split+SentencePiece");
    uint32_t id;
    cr_assert_eq(tokenizer_token_id(s, "</s>", &id), 0);
    cr_expect_eq(id, 2);
    cr_expect(tokenizer_is_special(s, id));
    /* one token alone: "▁" is a space, <0x41> the byte 'A' (fsdp-ckpt sample prints these) */
    size_t n;
    cr_assert_eq(tokenizer_token_id(s, "<0x41>", &id), 0);
    const unsigned char *b = tokenizer_token_bytes(s, id, &n);
    cr_expect(n == 1 && b[0] == 'A');
    cr_assert_eq(tokenizer_token_id(s, "\xe2\x96\x81", &id), 0);
    b = tokenizer_token_bytes(s, id, &n);
    cr_expect(n == 1 && b[0] == ' ');
    /* decode drops special tokens when asked; the ByteFallback of an incomplete character is U+FFFD */
    uint32_t ids[3];
    cr_assert_eq(tokenizer_token_id(s, "<s>", &ids[0]), 0);
    cr_assert_eq(tokenizer_token_id(s, "<0xE4>", &ids[1]), 0);
    cr_assert_eq(tokenizer_token_id(s, "</s>", &ids[2]), 0);
    char *out;
    cr_assert_eq(tokenizer_decode(s, ids, 3, true, &out, &n), 0);
    cr_expect_str_eq(out, "\xef\xbf\xbd");
    free(out);
    cr_assert_eq(tokenizer_decode(s, ids, 3, false, &out, &n), 0);
    cr_expect_str_eq(out, "<s>\xef\xbf\xbd</s>");
    free(out);
    tokenizer_free(q);
    tokenizer_free(s);
    tokenizer_free(l);
    tokenizer_free(g);
}

/* A document of `n` bytes without spaces except the first: one pre-token under Metaspace split false. */
static char *long_doc(size_t n)
{
    size_t len;
    char *base = text_of("mixed", &len);
    char *d = malloc(n + 4);
    size_t k = 0;
    while (k < n) {
        for (size_t i = 0; i < len && k < n; i++)
            d[k++] = base[i] == ' ' ? '_' : base[i];
    }
    while (k > 0 && ((unsigned char)d[k - 1] & 0xc0) == 0x80) /* cut at a character boundary */
        k--;
    if (k > 0 && (unsigned char)d[k - 1] >= 0xc0)
        k--;
    d[k] = '\0';
    free(base);
    return d;
}

Test(tokenizer_fixtures, one_long_pre_token_merges_in_n_log_n, .timeout = 60)
{
    struct tokenizer *t = load("spm");
    /* the heap merge gives the scan's ids (8 KiB: the scan is quadratic) */
    char *d = long_doc(8192);
    struct tokenizer_ids a = {0}, b = {0};
    cr_assert_eq(tokenizer_encode(t, d, strlen(d), &a), 0, "%s", error_message());
    tokenizer_set_heap_threshold(t, SIZE_MAX);
    cr_assert_eq(tokenizer_encode(t, d, strlen(d), &b), 0, "%s", error_message());
    cr_expect(a.n == b.n && memcmp(a.v, b.v, a.n * sizeof *a.v) == 0, "heap and scan merges differ");
    cr_expect_lt(a.n, strlen(d), "the long piece was merged: %zu ids for %zu bytes", a.n, strlen(d));
    tokenizer_set_heap_threshold(t, 64);
    free(d);
    /* 4 MiB as one piece: quadratic merging would take hours, O(n log n) well under a second per MiB */
    d = long_doc(4u << 20);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    a.n = 0;
    cr_assert_eq(tokenizer_encode(t, d, strlen(d), &a), 0, "%s", error_message());
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_expect_lt(s, 20.0, "4 MiB as one pre-token took %.1f s", s);
    cr_log_info("4 MiB single pre-token: %.2f s, %zu ids", s, a.n);
    tokenizer_ids_free(&a);
    tokenizer_ids_free(&b);
    free(d);
    tokenizer_free(t);
}

/* Word by word (split_meta) and whole-piece merging agree on a long natural text, and a vocabulary with a
 * merge that crosses a "▁" after a letter turns word-by-word merging off. */
Test(tokenizer_fixtures, word_by_word_merging_only_where_no_merge_crosses)
{
    struct tokenizer *t = load("spm");
    cr_assert(t->bpe.split_meta, "the spm fixture's merges never cross a ▁ after a letter");
    size_t len;
    char *base = text_of("mixed", &len);
    char *d = malloc(3 * len + 1);
    for (int i = 0; i < 3; i++)
        memcpy(d + i * len, base, len);
    struct tokenizer_ids a = {0}, b = {0};
    cr_assert_eq(tokenizer_encode(t, d, 3 * len, &a), 0, "%s", error_message());
    t->bpe.split_meta = false;
    tokenizer_set_cache(t, false);
    cr_assert_eq(tokenizer_encode(t, d, 3 * len, &b), 0, "%s", error_message());
    cr_expect(a.n == b.n && memcmp(a.v, b.v, a.n * sizeof *a.v) == 0, "word by word: %zu ids, whole: %zu", a.n, b.n);
    tokenizer_free(t);
    free(d);
    free(base);
    /* "a ▁b" is a merge: cutting "▁a▁b..." before the second ▁ would give a, ▁b instead of a▁b */
#define M "\xe2\x96\x81"
    static const char json[] =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"" M "\":1,\"b\":2,\"" M "b\":3,\"a" M "b\":4},"
        "\"merges\":[\"" M " b\",\"a " M "b\"]},\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"" M
        "\",\"prepend_scheme\":\"first\",\"split\":false}}";
#undef M
    cr_assert_eq(tokenizer_load_string(json, strlen(json), "cross.json", &t), 0, "%s", error_message());
    cr_expect_not(t->bpe.split_meta);
    char text[128] = "";
    for (int i = 0; i < 40; i++)
        strcat(text, "a b");
    a.n = 0;
    cr_assert_eq(tokenizer_encode(t, text, strlen(text), &a), 0, "%s", error_message());
    cr_assert_eq(a.n, 41);
    cr_expect_eq(a.v[0], 1);
    for (size_t i = 1; i < a.n; i++)
        cr_expect_eq(a.v[i], 4, "id %zu: %u", i, a.v[i]);
    tokenizer_free(t);
    tokenizer_ids_free(&a);
    tokenizer_ids_free(&b);
}
