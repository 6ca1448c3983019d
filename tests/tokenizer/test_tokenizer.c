/* The tokenizer without any peer: small tokenizer.json files written here, whose ids and pre-tokens follow
 * from the rules by hand (the edge cases checked against tokenizers 0.23 in the project's notes), the
 * format's options and refusals, decoding, the UTF-8 checks, and the merge loops and cache agreeing with
 * each other on the committed examples/tokenizer.json. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "worker/tokenizer/tokenizer.h"
#include "worker/tokenizer/tokenizer_internal.h"

#include <utf8proc.h>

/* ---- building tokenizer.json text ---- */

struct jb {
    char s[1 << 16];
    size_t n;
};

static void jb_add(struct jb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jb_add(struct jb *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    b->n += (size_t)vsnprintf(b->s + b->n, sizeof b->s - b->n, fmt, ap);
    va_end(ap);
    cr_assert(b->n < sizeof b->s);
}

/* A JSON string of UTF-8 text (escapes quotes, backslashes and control characters). */
static void jb_str(struct jb *b, const char *s)
{
    jb_add(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            jb_add(b, "\\%c", c);
        else if (c < 0x20)
            jb_add(b, "\\u%04x", c);
        else
            jb_add(b, "%c", c);
    }
    jb_add(b, "\"");
}

static const char GPT2_PRE[] = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,"
                               "\"use_regex\":true}";
static const char LLAMA3_PRE[] =
    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+"
    "[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}]}";

/* vocab: the 256 byte characters (id = byte), then `extra` (ids 256, 257, ...); merges as given (JSON
 * array text); added: the added_tokens array text (or NULL). */
static struct tokenizer *make(const char *pre, const char *const *extra, const char *merges, const char *added,
                              const char *model_extra)
{
    static struct jb b;
    b.n = 0;
    jb_add(&b, "{\"version\":\"1.0\",\"added_tokens\":%s,\"normalizer\":null,\"pre_tokenizer\":%s,",
           added ? added : "[]", pre);
    jb_add(&b, "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",%s\"vocab\":{",
           model_extra ? model_extra : "");
    for (int c = 0; c < 256; c++) {
        char ch[8] = {0};
        tok_utf8_put(tok_byte_char((unsigned char)c), ch);
        jb_str(&b, ch);
        jb_add(&b, ":%d,", c);
    }
    int id = 256;
    for (int i = 0; extra && extra[i]; i++) {
        jb_str(&b, extra[i]);
        jb_add(&b, ":%d,", id++);
    }
    b.n--; /* the last comma */
    jb_add(&b, "},\"merges\":%s}}", merges ? merges : "[]");
    struct tokenizer *t;
    cr_assert_eq(tokenizer_load_string(b.s, b.n, "test.json", &t), 0, "%s", error_message());
    return t;
}

/* The error message of a tokenizer.json that must be refused. */
static const char *refuse(const char *json)
{
    struct tokenizer *t = NULL;
    int rc = tokenizer_load_string(json, strlen(json), "bad.json", &t);
    cr_assert_lt(rc, 0, "accepted: %s", json);
    cr_assert_null(t);
    return error_message();
}

static size_t encode(struct tokenizer *t, const char *text, uint32_t *out, size_t cap)
{
    struct tokenizer_ids ids = {0};
    cr_assert_eq(tokenizer_utf8_check(text, strlen(text)), strlen(text));
    cr_assert_eq(tokenizer_encode(t, text, strlen(text), &ids), 0, "%s", error_message());
    cr_assert_leq(ids.n, cap);
    memcpy(out, ids.v, ids.n * sizeof *out);
    size_t n = ids.n;
    tokenizer_ids_free(&ids);
    return n;
}

struct pieces {
    char s[4096];
    size_t n;
};

static int add_piece(void *ctx, const char *p, size_t n, bool is_added)
{
    struct pieces *ps = ctx;
    ps->n += (size_t)snprintf(ps->s + ps->n, sizeof ps->s - ps->n, "%s%.*s%s|", is_added ? "<" : "", (int)n, p,
                              is_added ? ">" : "");
    return 0;
}

/* The pre-tokens of text joined with '|' (added tokens in <>). */
static const char *pieces(struct tokenizer *t, const char *text)
{
    static struct pieces ps;
    ps.n = 0;
    ps.s[0] = '\0';
    cr_assert_eq(tokenizer_pieces(t, text, strlen(text), add_piece, &ps), 0, "%s", error_message());
    return ps.s;
}

/* ---- BPE ---- */

Test(tokenizer, merges_lowest_rank_first)
{
    /* The notes' worked example of GPT-2's " training": i n twice (left first), r a, Ġ t, in g, ra in,
     * Ġt rain, Ġtrain ing. Ranks here are list positions; unrelated merges fill the gaps. */
    const char *extra[] = {"in", "ra", "Ġt", "ing", "rain", "Ġtrain", "Ġtraining", "tr", NULL};
    const char *merges = "[[\"i\",\"n\"],[\"r\",\"a\"],[\"Ġ\",\"t\"],[\"in\",\"g\"],[\"ra\",\"in\"],"
                         "[\"Ġt\",\"rain\"],[\"Ġtrain\",\"ing\"],[\"t\",\"r\"]]";
    struct tokenizer *t = make(GPT2_PRE, extra, merges, NULL, NULL);
    uint32_t ids[64];
    cr_assert_eq(encode(t, " training", ids, 64), 1);
    cr_assert_eq(ids[0], 262u); /* Ġtraining */
    /* "tra": t r has the lowest rank among t r / r a? No: r a (1) beats t r (7): t, ra. */
    cr_assert_eq(encode(t, "tra", ids, 64), 2);
    cr_assert(ids[0] == 't' && ids[1] == 257);
    cr_assert_eq(tokenizer_vocab_size(t), 264u);
    cr_assert_eq(tokenizer_merge_count(t), 8u);
    tokenizer_free(t);
}

Test(tokenizer, equal_ranks_merge_leftmost_and_new_pairs_compete)
{
    const char *extra[] = {"aa", "aaa", NULL};
    struct tokenizer *t = make(GPT2_PRE, extra, "[[\"a\",\"a\"],[\"aa\",\"a\"]]", NULL, NULL);
    uint32_t ids[64];
    /* aaaa: (a a) at 0 first -> aa a a; (a a) at 1 is gone, (a a) at 2 -> aa aa; (aa aa) has no merge. */
    cr_assert_eq(encode(t, "aaaa", ids, 64), 2);
    cr_assert(ids[0] == 256 && ids[1] == 256);
    /* aaa: aa a, then the new pair (aa a) -> aaa */
    cr_assert_eq(encode(t, "aaa", ids, 64), 1);
    cr_assert_eq(ids[0], 257u);
    /* the heap merge gives the same on long runs */
    char run[1001];
    memset(run, 'a', 1000);
    run[1000] = '\0';
    uint32_t *a = malloc(2000 * sizeof *a), *h = malloc(2000 * sizeof *h);
    tokenizer_set_heap_threshold(t, SIZE_MAX); /* the scan, however long the piece */
    size_t na = encode(t, run, a, 2000);
    tokenizer_set_heap_threshold(t, 1);
    tokenizer_set_cache(t, false);
    size_t nh = encode(t, run, h, 2000);
    cr_assert_eq(na, nh);
    cr_assert_arr_eq(a, h, na * sizeof *a);
    cr_assert_eq(na, 500u); /* 1000 a = 500 aa: (aa a) never forms with a left-to-right pairing */
    free(a);
    free(h);
    tokenizer_free(t);
}

Test(tokenizer, merges_as_strings_and_repeats_keep_the_last_rank)
{
    const char *extra[] = {"ab", "bc", NULL};
    /* "b c" first (rank 0), then "a b" (1), then "b c" again: its rank becomes 2, so a b wins on abc */
    struct tokenizer *t = make(GPT2_PRE, extra, "[\"b c\",\"a b\",\"b c\"]", NULL, NULL);
    uint32_t ids[8];
    cr_assert_eq(encode(t, "abc", ids, 8), 2);
    cr_assert(ids[0] == 256 && ids[1] == 'c');
    tokenizer_free(t);
}

Test(tokenizer, ignore_merges_takes_a_whole_vocab_piece)
{
    /* "xyz" is a token but no merges build it: only ignore_merges gives it. */
    const char *extra[] = {"xyz", NULL};
    struct tokenizer *t = make(GPT2_PRE, extra, "[]", NULL, "\"ignore_merges\":true,");
    uint32_t ids[8];
    cr_assert_eq(encode(t, "xyz", ids, 8), 1);
    cr_assert_eq(ids[0], 256u);
    tokenizer_free(t);
    t = make(GPT2_PRE, extra, "[]", NULL, NULL);
    cr_assert_eq(encode(t, "xyz", ids, 8), 3);
    tokenizer_free(t);
}

/* ---- pre-tokenizers: the notes' edge cases (tokenizers 0.23) ---- */

Test(tokenizer, gpt2_and_llama3_pieces)
{
    struct tokenizer *g = make(GPT2_PRE, NULL, NULL, NULL, NULL), *l = make(LLAMA3_PRE, NULL, NULL, NULL, NULL);
    static const struct {
        const char *text, *gpt2, *llama3;
    } cases[] = {
        {"a\r\nb", "a|\r|\n|b|", "a|\r\n|b|"},
        {"\tword", "\t|word|", "\tword|"},
        {"   word", "  | word|", "  | word|"},
        {"hi   ", "hi|   |", "hi|   |"},
        {"1234567", "1234567|", "123|456|7|"},
        {" 12", " 12|", " |12|"},
        {"e\xcc\x81te", "e|\xcc\x81|te|", "e|\xcc\x81te|"},
        {"IT'S it's", "IT|'|S| it|'s|", "IT|'S| it|'s|"},
        /* U+180E is not White_Space for Oniguruma (PCRE2's \s would take it) */
        {" \xe1\xa0\x8e" "b", " \xe1\xa0\x8e|b|", " \xe1\xa0\x8e|b|"},
        /* an emoji ZWJ sequence stays one piece */
        {"\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb!", "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb!|",
         "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb!|"},
        {"", "", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_expect_str_eq(pieces(g, cases[i].text), cases[i].gpt2, "gpt2, case %zu", i);
        cr_expect_str_eq(pieces(l, cases[i].text), cases[i].llama3, "llama3, case %zu", i);
    }
    cr_assert_str_eq(tokenizer_style(g), "ByteLevel");
    cr_assert_str_eq(tokenizer_style(l), "Split+ByteLevel");
    tokenizer_free(g);
    tokenizer_free(l);
}

static struct tokenizer *split_on_dash(const char *behavior, bool invert)
{
    char pre[512];
    snprintf(pre, sizeof pre,
             "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},"
             "\"behavior\":\"%s\",\"invert\":%s},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
             "\"use_regex\":false}]}",
             behavior, invert ? "true" : "false");
    return make(pre, NULL, NULL, NULL, NULL);
}

Test(tokenizer, split_behaviors)
{
    /* tokenizers' own example for SplitDelimiterBehavior, empty pieces dropped */
    static const struct {
        const char *behavior, *want;
    } cases[] = {
        {"Removed", "the|final|countdown|"},
        {"Isolated", "the|-|final|-|-|countdown|"},
        {"MergedWithPrevious", "the-|final-|-|countdown|"},
        {"MergedWithNext", "the|-final|-|-countdown|"},
        {"Contiguous", "the|-|final|--|countdown|"},
    };
    for (size_t i = 0; i < 5; i++) {
        struct tokenizer *t = split_on_dash(cases[i].behavior, false);
        cr_expect_str_eq(pieces(t, "the-final--countdown"), cases[i].want, "%s", cases[i].behavior);
        tokenizer_free(t);
    }
    /* invert: the pattern's matches are the pieces kept, the rest is what Removed removes */
    struct tokenizer *t = split_on_dash("Removed", true);
    cr_assert_str_eq(pieces(t, "the-final--countdown"), "-|-|-|");
    tokenizer_free(t);
}

Test(tokenizer, add_prefix_space_prepends_to_each_piece)
{
    struct tokenizer *t = make("{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}", NULL, NULL,
                               "[{\"id\":256,\"content\":\"<s>\",\"special\":true}]", NULL);
    cr_assert_str_eq(pieces(t, "hi there<s>you"), " hi| there|<<s>>| you|");
    cr_assert_str_eq(pieces(t, " hi"), " hi|");
    tokenizer_free(t);
}

/* ---- added tokens ---- */

Test(tokenizer, added_tokens_leftmost_longest_and_flags)
{
    const char *added =
        "[{\"id\":256,\"content\":\"<|a|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
        "\"normalized\":false,\"special\":true},"
        "{\"id\":257,\"content\":\"<|a|>b\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
        "\"normalized\":false,\"special\":true},"
        "{\"id\":258,\"content\":\"[M]\",\"single_word\":false,\"lstrip\":true,\"rstrip\":true,"
        "\"normalized\":true,\"special\":false},"
        "{\"id\":259,\"content\":\"ono\",\"single_word\":true,\"lstrip\":false,\"rstrip\":false,"
        "\"normalized\":true,\"special\":false}]";
    struct tokenizer *t = make(GPT2_PRE, NULL, NULL, added, NULL);
    /* longest at the leftmost start; no pre-token spans an added token */
    cr_assert_str_eq(pieces(t, "x<|a|>by<|a|>"), "x|<<|a|>b>|y|<<|a|>>|");
    /* lstrip/rstrip take the whitespace next to the token (Unicode White_Space, tab and U+3000 too) */
    cr_assert_str_eq(pieces(t, "a \t[M]\xe3\x80\x80 b"), "a|< \t[M]\xe3\x80\x80 >|b|");
    /* single_word: not inside a word (letters, marks, digits, '_'), fine next to punctuation */
    cr_assert_str_eq(pieces(t, "ono mono ono_ (ono)"), "<ono>| mono| ono|_| (|<ono>|)|");
    uint32_t ids[16];
    cr_assert_eq(encode(t, "<|a|>", ids, 16), 1);
    cr_assert_eq(ids[0], 256u);
    cr_assert(tokenizer_is_special(t, 256) && !tokenizer_is_special(t, 258));
    uint32_t id;
    cr_assert_eq(tokenizer_token_id(t, "[M]", &id), 0);
    cr_assert_eq(id, 258u);
    cr_assert_eq(tokenizer_token_id(t, "Ġ", &id), 0);
    cr_assert_eq(id, (uint32_t)' ');
    cr_assert_eq(tokenizer_token_id(t, "nope", &id), FSDP_ENOTFOUND);
    tokenizer_free(t);
}

Test(tokenizer, added_token_ids_follow_tokenizers)
{
    /* a content already in the vocabulary keeps its id; new ones count from the vocabulary's size */
    const char *extra[] = {"<x>", NULL};
    const char *added = "[{\"id\":9,\"content\":\"<y>\",\"special\":true},{\"id\":256,\"content\":\"<x>\","
                        "\"special\":true},{\"id\":9,\"content\":\"<z>\",\"special\":true}]";
    struct tokenizer *t = make(GPT2_PRE, extra, NULL, added, NULL);
    uint32_t id;
    cr_assert_eq(tokenizer_token_id(t, "<y>", &id), 0);
    cr_assert_eq(id, 257u);
    cr_assert_eq(tokenizer_token_id(t, "<x>", &id), 0);
    cr_assert_eq(id, 256u);
    cr_assert_eq(tokenizer_token_id(t, "<z>", &id), 0);
    cr_assert_eq(id, 258u);
    cr_assert_eq(tokenizer_vocab_size(t), 259u);
    tokenizer_free(t);
}

/* ---- unknown bytes ---- */

Test(tokenizer, missing_bytes_dropped_unk_or_fallback)
{
    /* a vocabulary without 'b' (byte 0x62) */
    static struct jb b;
    b.n = 0;
    jb_add(&b, "{\"pre_tokenizer\":%s,\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"c\":1,\"<unk>\":2,\"<0x62>\":3}",
           GPT2_PRE);
    struct tokenizer *t;
    static char json[sizeof b.s + 128];
    snprintf(json, sizeof json, "%s}}", b.s);
    cr_assert_eq(tokenizer_load_string(json, strlen(json), "t.json", &t), 0, "%s", error_message());
    uint32_t ids[8];
    cr_assert_eq(encode(t, "abbc", ids, 8), 2); /* dropped */
    tokenizer_free(t);
    snprintf(json, sizeof json, "%s,\"unk_token\":\"<unk>\"}}", b.s);
    cr_assert_eq(tokenizer_load_string(json, strlen(json), "t.json", &t), 0, "%s", error_message());
    cr_assert_eq(encode(t, "abbc", ids, 8), 4);
    cr_assert(ids[0] == 0 && ids[1] == 2 && ids[2] == 2 && ids[3] == 1);
    tokenizer_free(t);
    snprintf(json, sizeof json, "%s,\"unk_token\":\"<unk>\",\"fuse_unk\":true}}", b.s);
    cr_assert_eq(tokenizer_load_string(json, strlen(json), "t.json", &t), 0, "%s", error_message());
    cr_assert_eq(encode(t, "abbc", ids, 8), 3);
    tokenizer_free(t);
    snprintf(json, sizeof json, "%s,\"unk_token\":\"<unk>\",\"byte_fallback\":true}}", b.s);
    cr_assert_eq(tokenizer_load_string(json, strlen(json), "t.json", &t), 0, "%s", error_message());
    cr_assert_eq(encode(t, "ab", ids, 8), 2);
    cr_assert(ids[0] == 0 && ids[1] == 3);
    tokenizer_free(t);
}

/* ---- what is refused, and the key each message names ---- */

/* A model and a valid ByteLevel pre-tokenizer around a model object's inside. */
#define BL "{\"type\":\"ByteLevel\",\"add_prefix_space\":false}"
#define WITH_MODEL(m) "{\"model\":{\"type\":\"BPE\"," m "},\"pre_tokenizer\":" BL "}"

Test(tokenizer, refusals_name_the_key)
{
    cr_assert(strstr(refuse("{\"model\":"), "not valid JSON"));
    cr_assert(strstr(refuse("[1]"), "not a tokenizer.json"));
    cr_assert(strstr(refuse("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}"), "model.type is WordPiece"));
    cr_assert(strstr(refuse("{\"model\":{\"vocab\":{\"a\":0}},\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}"),
                     "add_prefix_space must be"));
    cr_assert(strstr(refuse("{\"model\":{\"vocab\":{\"a\":0}},\"pre_tokenizer\":{\"type\":\"Sequence\","
                            "\"pretokenizers\":[{\"type\":\"Metaspace\"}," BL "]}}"),
                     "ByteLevel after Metaspace"));
    cr_assert(strstr(refuse("{\"model\":{\"vocab\":{\"a\":0}},\"pre_tokenizer\":{\"type\":\"Metaspace\","
                            "\"replacement\":\"_\"}}"),
                     "pre_tokenizer.replacement must be"));
    cr_assert(strstr(refuse("{\"model\":{\"vocab\":{\"a\":0}},\"pre_tokenizer\":{\"type\":\"Metaspace\","
                            "\"prepend_scheme\":\"sometimes\"}}"),
                     "prepend_scheme must be first, always or never"));
    cr_assert(strstr(refuse("{\"model\":{\"vocab\":{\"a\":0}},\"pre_tokenizer\":{\"type\":\"Whitespace\"}}"),
                     "Whitespace pre-tokenizer"));
    cr_assert(strstr(refuse("{\"model\":{\"vocab\":{\"a\":0}},\"normalizer\":{\"type\":\"Lowercase\"},"
                            "\"pre_tokenizer\":" BL "}"), "normalizer is Lowercase: supported normalizers are NFC"));
    cr_assert(strstr(refuse("{\"model\":{\"vocab\":{\"a\":0}},\"normalizer\":{\"type\":\"Sequence\","
                            "\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"Replace\",\"pattern\":{\"Regex\":\" +\"},"
                            "\"content\":\" \"}]}}"), "normalizer.normalizers[1].pattern must be {\"String\""));
    cr_assert(strstr(refuse(WITH_MODEL("\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]")), "model.merges[0]"));
    cr_assert(strstr(refuse(WITH_MODEL("\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\",[\"a\",\"b\"]]")),
                     "mixes"));
    cr_assert(strstr(refuse(WITH_MODEL("\"vocab\":{\"a\":0,\"b\":0}")), "two tokens"));
    cr_assert(strstr(refuse(WITH_MODEL("\"vocab\":{\"a\":-1}")), "model.vocab"));
    cr_assert(strstr(refuse(WITH_MODEL("\"vocab\":{\"a\":0},\"dropout\":0.1")), "model.dropout"));
    cr_assert(strstr(refuse(WITH_MODEL("\"vocab\":{\"a\":0},\"unk_token\":\"<unk>\"")), "model.unk_token"));
    cr_assert(strstr(refuse("{\"model\":{\"vocab\":{\"a\":0}},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":"
                            "{\"Regex\":\"(\"},\"behavior\":\"Isolated\"}}"),
                     "pre_tokenizer.pattern: the pattern does not compile"));
    cr_assert(strstr(refuse("{\"model\":{\"vocab\":{\"a\":0}},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":"
                            "{\"Regex\":\"a\"},\"behavior\":\"Sideways\"}}"),
                     "behavior must be one of"));
    cr_assert(strstr(refuse("{\"model\":{\"vocab\":{\"a\":0}},\"pre_tokenizer\":{\"type\":\"Sequence\","
                            "\"pretokenizers\":[" BL ",{\"type\":\"Split\",\"pattern\":{\"String\":\"a\"},"
                            "\"behavior\":\"Isolated\"}]}}"),
                     "comes after ByteLevel"));
    struct tokenizer *t = NULL;
    cr_assert_eq(tokenizer_load("/nonexistent/tokenizer.json", &t), FSDP_ENOTFOUND);
    cr_assert(strstr(error_message(), "/nonexistent/tokenizer.json"));
}

Test(tokenizer, oniguruma_classes_in_patterns)
{
    /* \s without U+180E, \w with marks, \h a hex digit; a negated class inside [...] is refused */
    struct tokenizer *t = split_on_dash("Isolated", false);
    tokenizer_free(t);
    char pre[512];
    snprintf(pre, sizeof pre, "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
             "\"\\\\s+|\\\\w+|\\\\h+\"},\"behavior\":\"Isolated\"},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
             "\"use_regex\":false}]}");
    t = make(pre, NULL, NULL, NULL, NULL);
    cr_assert_str_eq(pieces(t, "e\xcc\x81t\xe1\xa0\x8e x"), "e\xcc\x81t|\xe1\xa0\x8e| |x|");
    tokenizer_free(t);
    snprintf(pre, sizeof pre, "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
             "\"[\\\\Wa]\"},\"behavior\":\"Isolated\"},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
             "\"use_regex\":false}]}");
    char json[2048];
    snprintf(json, sizeof json, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"pre_tokenizer\":%s}", pre);
    cr_assert(strstr(refuse(json), "\\W inside [...]"));
}

/* ---- decoding ---- */

Test(tokenizer, decode_round_trip_and_specials)
{
    const char *added = "[{\"id\":256,\"content\":\"<|endoftext|>\",\"special\":true,\"normalized\":false}]";
    struct tokenizer *t = make(GPT2_PRE, NULL, NULL, added, NULL);
    const char text[] = "h\xc3\xa9llo\r\n\t<|endoftext|>\xf0\x9f\x98\x80 \x00" "end";
    size_t len = sizeof text - 1;
    struct tokenizer_ids ids = {0};
    cr_assert_eq(tokenizer_encode(t, text, len, &ids), 0, "%s", error_message());
    char *back;
    size_t blen;
    cr_assert_eq(tokenizer_decode(t, ids.v, ids.n, false, &back, &blen), 0, "%s", error_message());
    cr_assert_eq(blen, len);
    cr_assert_arr_eq(back, text, len);
    free(back);
    cr_assert_eq(tokenizer_decode(t, ids.v, ids.n, true, &back, &blen), 0);
    cr_assert_eq(blen, len - strlen("<|endoftext|>"));
    free(back);
    uint32_t bad = 4000;
    cr_assert_lt(tokenizer_decode(t, &bad, 1, false, &back, &blen), 0);
    cr_assert(strstr(error_message(), "id 4000"));
    size_t n;
    const unsigned char *b = tokenizer_token_bytes(t, ' ', &n);
    cr_assert(b && n == 1 && b[0] == ' ');
    tokenizer_ids_free(&ids);
    tokenizer_free(t);
}

/* ---- UTF-8 ---- */

Test(tokenizer, utf8_check_and_python_style_repair)
{
    static const struct {
        const char *in;
        size_t len, valid, replaced;
        const char *out;
    } cases[] = {
        {"plain", 5, 5, 0, "plain"},
        {"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80", 9, 9, 0, "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80"},
        {"a\xe2\x82" "b", 4, 1, 1, "a\xef\xbf\xbd" "b"},         /* truncated: one U+FFFD */
        {"\xf0\x80\x80", 3, 0, 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* overlong: each byte */
        {"\xed\xa0\x80", 3, 0, 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* surrogate */
        {"\xc0\xaf", 2, 0, 2, "\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xf4\x90\x80\x80", 4, 0, 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* > U+10FFFF */
        {"ok\xff", 3, 2, 1, "ok\xef\xbf\xbd"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_expect_eq(tokenizer_utf8_check(cases[i].in, cases[i].len), cases[i].valid, "case %zu", i);
        char *out;
        size_t n, rep;
        cr_assert_eq(tokenizer_utf8_repair(cases[i].in, cases[i].len, &out, &n, &rep), 0);
        cr_expect_eq(rep, cases[i].replaced, "case %zu", i);
        cr_expect(n == strlen(cases[i].out) && memcmp(out, cases[i].out, n) == 0, "case %zu", i);
        free(out);
    }
}

/* ---- the committed example tokenizer: scan, heap and cache agree; runs concatenate to the whole ---- */

static char *read_text(const char *rel, size_t *len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", getenv("FSDP_SOURCE_ROOT"), rel);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    s[n] = '\0';
    *len = (size_t)n;
    return s;
}

static struct tokenizer *example(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/examples/tokenizer.json", getenv("FSDP_SOURCE_ROOT"));
    struct tokenizer *t;
    cr_assert_eq(tokenizer_load(path, &t), 0, "%s", error_message());
    return t;
}

struct runs {
    struct tokenizer_ids all;
    size_t bytes, calls;
};

static int collect_run(void *ctx, const uint32_t *ids, size_t n, size_t text_bytes)
{
    struct runs *r = ctx;
    cr_assert_eq(tokenizer_ids_reserve(&r->all, n), 0);
    memcpy(r->all.v + r->all.n, ids, n * sizeof *ids);
    r->all.n += n;
    r->bytes += text_bytes;
    r->calls++;
    return 0;
}

Test(tokenizer, example_scan_heap_cache_and_runs_agree)
{
    cr_assert_not_null(getenv("FSDP_SOURCE_ROOT"), "run through meson test");
    size_t len;
    char *text = read_text("tests/tokenizer/data/mixed.txt", &len);
    cr_assert_eq(tokenizer_utf8_check(text, len), len);
    struct tokenizer *t = example();
    struct tokenizer_ids ref = {0}, again = {0}, heap = {0};
    cr_assert_eq(tokenizer_encode(t, text, len, &ref), 0, "%s", error_message());
    cr_assert_eq(tokenizer_encode(t, text, len, &again), 0); /* now from the cache */
    tokenizer_set_cache(t, false);
    tokenizer_set_heap_threshold(t, 1);
    cr_assert_eq(tokenizer_encode(t, text, len, &heap), 0);
    cr_assert_eq(again.n, ref.n);
    cr_assert_eq(heap.n, ref.n);
    cr_assert_arr_eq(again.v, ref.v, ref.n * sizeof *ref.v);
    cr_assert_arr_eq(heap.v, ref.v, ref.n * sizeof *ref.v);
    uint64_t hits, misses;
    tokenizer_cache_stats(t, &hits, &misses);
    cr_assert_gt(hits, 0u);
    char *back;
    size_t blen;
    cr_assert_eq(tokenizer_decode(t, ref.v, ref.n, false, &back, &blen), 0);
    cr_assert(blen == len && memcmp(back, text, len) == 0, "decode(encode(text)) != text");
    free(back);
    for (size_t chunk = 1; chunk <= 4096; chunk *= 8) {
        struct runs r = {0};
        cr_assert_eq(tokenizer_encode_runs(t, text, len, chunk, collect_run, &r), 0);
        cr_assert_eq(r.bytes, len, "chunk %zu", chunk);
        cr_assert_eq(r.all.n, ref.n, "chunk %zu", chunk);
        cr_assert_arr_eq(r.all.v, ref.v, ref.n * sizeof *ref.v);
        cr_assert_geq(r.calls, len / (chunk + 200), "chunk %zu: %zu runs", chunk, r.calls);
        tokenizer_ids_free(&r.all);
    }
    tokenizer_ids_free(&ref);
    tokenizer_ids_free(&again);
    tokenizer_ids_free(&heap);
    tokenizer_free(t);
    free(text);
}

/* Decoders: none joins the token texts with spaces (as tokenizers does); one this tokenizer cannot run
 * fails decode with the list of those it can, while encoding still works. */
Test(tokenizer, decoder_null_and_unsupported)
{
    const char *base = "{\"model\":{\"vocab\":{\"a\":0,\"b\":1}},\"pre_tokenizer\":null,\"decoder\":%s}";
    char json[512];
    struct tokenizer *t;
    snprintf(json, sizeof json, base, "null");
    cr_assert_eq(tokenizer_load_string(json, strlen(json), "t.json", &t), 0, "%s", error_message());
    uint32_t ids[] = {0, 1, 0};
    char *out;
    size_t n;
    cr_assert_eq(tokenizer_decode(t, ids, 3, false, &out, &n), 0, "%s", error_message());
    cr_expect_str_eq(out, "a b a");
    free(out);
    tokenizer_free(t);
    snprintf(json, sizeof json, base, "{\"type\":\"WordPiece\",\"prefix\":\"##\"}");
    cr_assert_eq(tokenizer_load_string(json, strlen(json), "t.json", &t), 0, "%s", error_message());
    struct tokenizer_ids enc = {0};
    cr_assert_eq(tokenizer_encode(t, "ab", 2, &enc), 0, "%s", error_message());
    cr_expect_eq(enc.n, 2);
    tokenizer_ids_free(&enc);
    cr_assert_lt(tokenizer_decode(t, ids, 3, false, &out, &n), 0);
    cr_expect(strstr(error_message(), "decoder is WordPiece: supported decoders are ByteLevel"), "%s",
              error_message());
    tokenizer_free(t);
    snprintf(json, sizeof json, base, "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
             "{\"Regex\":\" +\"},\"content\":\" \"}]}");
    cr_assert_eq(tokenizer_load_string(json, strlen(json), "t.json", &t), 0, "%s", error_message());
    cr_assert_lt(tokenizer_decode(t, ids, 3, false, &out, &n), 0);
    cr_expect(strstr(error_message(), "decoder.decoders[0].pattern is not a non-empty"), "%s", error_message());
    tokenizer_free(t);
}

/* The normal forms cut the text between ASCII characters and normalize only the spans between: on random
 * text dense in the cases that matter (combining marks after ASCII letters, at the start and the end,
 * Hangul jamo, precomposed and compatibility characters) the result is utf8proc's on the whole text. */
Test(tokenizer, normal_forms_by_spans_equal_whole_text)
{
    static const char *const pieces[] = {"a", "e", "A", " ", "  ", "\n", "x", "1", "\xcc\x81", "\xcc\x80",
                                         "\xcc\xa7", "\xcd\x85", "\xc3\xa9", "\xe1\x84\x80", "\xe1\x85\xa1",
                                         "\xe1\x86\xa8", "\xea\xb0\x80", "\xef\xac\x81", "\xe2\x91\xa0",
                                         "\xef\xbc\xa1", "\xe2\x84\xab", "\xe4\xb8\xad", "\xf0\x9f\x98\x80"};
    static const char *const forms[] = {"NFC", "NFKC", "NFD", "NFKD"};
    static const utf8proc_option_t opts[] = {UTF8PROC_COMPOSE, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, UTF8PROC_DECOMPOSE,
                                             UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
    const size_t np = sizeof pieces / sizeof *pieces;
    unsigned seed = 12345;
    for (int f = 0; f < 4; f++) {
        char json[256];
        snprintf(json, sizeof json, "{\"model\":{\"vocab\":{\"a\":0}},\"normalizer\":{\"type\":\"%s\"},"
                 "\"pre_tokenizer\":null}", forms[f]);
        struct tokenizer *t;
        cr_assert_eq(tokenizer_load_string(json, strlen(json), "nf.json", &t), 0, "%s", error_message());
        for (int round = 0; round < 400; round++) {
            char text[512];
            size_t n = 0;
            int k = 1 + (int)(seed % 40);
            for (int i = 0; i < k; i++) {
                seed = seed * 1103515245u + 12345u;
                const char *p = pieces[(seed >> 8) % np];
                memcpy(text + n, p, strlen(p));
                n += strlen(p);
            }
            const unsigned char *got;
            size_t gn;
            cr_assert_eq(tok_normalize(t, (const unsigned char *)text, n, &got, &gn), 0, "%s", error_message());
            utf8proc_uint8_t *want = NULL;
            utf8proc_ssize_t wn = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)n, &want,
                                               UTF8PROC_STABLE | opts[f]);
            cr_assert_geq(wn, 0);
            cr_expect(gn == (size_t)wn && memcmp(got, want, gn) == 0, "%s of \"%.*s\": \"%.*s\", utf8proc \"%s\"",
                      forms[f], (int)n, text, (int)gn, got, want);
            free(want);
        }
        tokenizer_free(t);
    }
}
