/* From raw text to pre-tokens: added tokens are cut out first (leftmost, longest at that start; the
 * tokens matched on raw text, then, after the normalizers (tokenizer_normalize.c), those matched on
 * normalized text, as `tokenizers` does), then each stretch between them goes through the pre-tokenizer
 * steps (Split patterns, Metaspace, ByteLevel's regex), and each resulting piece is handed on. Patterns run on PCRE2 with UTF and UCP; Oniguruma's meaning of
 * \s (the 25 White_Space characters; PCRE2 adds U+180E), \w (letters, marks, numbers, connector
 * punctuation) and \h (a hex digit) is written out as classes before compiling, and ^ $ are line
 * anchors, as in Oniguruma's Ruby syntax. */
#include "worker/tokenizer/tokenizer_internal.h"

#include "common/error.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>

#define WS_BODY                                                                                                  \
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
#define NOT_WS_BODY                                                                                              \
    "\\x{0}-\\x{8}\\x{e}-\\x{1f}\\x{21}-\\x{84}\\x{86}-\\x{9f}\\x{a1}-\\x{167f}\\x{1681}-\\x{1fff}\\x{200b}-"    \
    "\\x{2027}\\x{202a}-\\x{202e}\\x{2030}-\\x{205e}\\x{2060}-\\x{2fff}\\x{3001}-\\x{10ffff}"
#define WORD_BODY "\\p{L}\\p{M}\\p{N}\\p{Pc}"
#define HEX_BODY "0-9a-fA-F"

struct strbuf {
    char *s;
    size_t n, cap;
    bool oom;
};

static void sb_add(struct strbuf *b, const char *p, size_t n)
{
    if (b->oom)
        return;
    if (b->cap - b->n < n + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n + 1)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
    memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void sb_str(struct strbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* Oniguruma's classes spelled for PCRE2. A negated class inside [...] has no PCRE2 spelling except \S
 * (written as ranges): those are refused. */
static int rewrite(const char *pat, size_t len, struct strbuf *out, const char *name, const char *what)
{
    bool in_class = false;
    size_t body = 0;
    for (size_t i = 0; i < len;) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char d = pat[i + 1];
            if (d == 'Q') {
                const char *e = NULL;
                for (size_t j = i + 2; j + 1 < len; j++)
                    if (pat[j] == '\\' && pat[j + 1] == 'E') {
                        e = pat + j + 2;
                        break;
                    }
                size_t end = e ? (size_t)(e - pat) : len;
                sb_add(out, pat + i, end - i);
                i = end;
                continue;
            }
            const char *cls = NULL;
            bool neg = false;
            switch (d) {
            case 's': cls = WS_BODY; break;
            case 'S': cls = in_class ? NOT_WS_BODY : WS_BODY; neg = !in_class; break;
            case 'w': cls = WORD_BODY; break;
            case 'W': cls = WORD_BODY; neg = true; break;
            case 'h': cls = HEX_BODY; break;
            case 'H': cls = HEX_BODY; neg = true; break;
            default: break;
            }
            if (!cls) {
                sb_add(out, pat + i, 2);
                i += 2;
                continue;
            }
            if (in_class) {
                if (neg)
                    return error_set(FSDP_EUNSUPPORTED, "%s: %s: \\%c inside [...] at offset %zu has no PCRE2 "
                                     "equivalent of Oniguruma's meaning; write the class out", name, what, d, i);
                sb_str(out, cls);
            } else {
                sb_str(out, neg ? "[^" : "[");
                sb_str(out, cls);
                sb_str(out, "]");
            }
            i += 2;
            continue;
        }
        if (in_class) {
            if (c == '[' && i + 1 < len && pat[i + 1] == ':') {
                const char *e = strstr(pat + i + 2, ":]");
                size_t end = e && (size_t)(e - pat) + 2 <= len ? (size_t)(e - pat) + 2 : i + 1;
                sb_add(out, pat + i, end - i);
                i = end;
                continue;
            }
            if (c == '[')
                return error_set(FSDP_EUNSUPPORTED, "%s: %s: a nested character class at offset %zu (Oniguruma's "
                                 "[a-z&&[...]] set operations) is not supported", name, what, i);
            if (c == ']' && i > body)
                in_class = false;
            sb_add(out, &c, 1);
            i++;
            continue;
        }
        sb_add(out, &c, 1);
        i++;
        if (c == '[') {
            in_class = true;
            if (i < len && pat[i] == '^')
                sb_add(out, pat + i++, 1);
            body = i; /* a ']' right here is a literal */
        }
    }
    if (out->oom)
        return error_set(FSDP_ENOMEM, "out of memory compiling a pattern");
    if (!out->s)
        sb_add(out, "", 0);
    return 0;
}

int tok_regex_compile(struct tok_regex *re, const char *pattern, size_t len, bool literal, const char *name,
                      const char *what)
{
    memset(re, 0, sizeof *re);
    struct strbuf b = {0};
    int rc = 0;
    if (literal) {
        for (size_t i = 0; i < len; i++) {
            unsigned char c = (unsigned char)pattern[i];
            if (c < 0x80 && !isalnum(c))
                sb_add(&b, "\\", 1);
            sb_add(&b, pattern + i, 1);
        }
        if (!b.s)
            sb_add(&b, "", 0);
        if (b.oom) {
            rc = error_set(FSDP_ENOMEM, "out of memory compiling a pattern");
            goto done;
        }
    } else {
        FSDP_TRY_GOTO(rewrite(pattern, len, &b, name, what), rc, done);
    }
    int err;
    PCRE2_SIZE off;
    re->code = pcre2_compile((PCRE2_SPTR)b.s, b.n, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &off, NULL);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        rc = error_set(FSDP_EINVAL, "%s: %s: the pattern does not compile (%s, near offset %zu of \"%.*s\")", name,
                       what, (char *)msg, (size_t)off, (int)(len > 200 ? 200 : len), pattern);
        goto done;
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    re->md = pcre2_match_data_create(1, NULL);
    re->mctx = pcre2_match_context_create(NULL);
    if (!re->md || !re->mctx) {
        rc = error_set(FSDP_ENOMEM, "out of memory compiling a pattern");
        goto done;
    }
    if (re->jit) {
        /* Patterns like \s+(?!\S) backtrack over whole runs: a long run of spaces needs more than
         * PCRE2's 32 KiB default; past this limit the match reruns in the interpreter. */
        re->jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, NULL);
        if (re->jit_stack)
            pcre2_jit_stack_assign(re->mctx, NULL, re->jit_stack);
    }
done:
    free(b.s);
    if (rc < 0)
        tok_regex_free(re);
    return rc;
}

void tok_regex_free(struct tok_regex *re)
{
    if (re->jit_stack)
        pcre2_jit_stack_free(re->jit_stack);
    pcre2_match_context_free(re->mctx);
    pcre2_match_data_free(re->md);
    pcre2_code_free(re->code);
    memset(re, 0, sizeof *re);
}

/* Next match at or after `from`: 1 with its bounds, 0 when there is none. */
static int rx_search(struct tok_regex *re, const unsigned char *s, size_t n, size_t from, size_t *ms, size_t *me)
{
    int rc;
    if (re->jit) {
        rc = pcre2_jit_match(re->code, s, n, from, 0, re->md, re->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re->code, s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, re->md, re->mctx);
    } else {
        rc = pcre2_match(re->code, s, n, from, PCRE2_NO_UTF_CHECK, re->md, re->mctx);
    }
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return error_set(FSDP_EINVAL, "pre-tokenizer pattern failed on a piece of %zu bytes: %s", n, (char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(re->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

struct pt {
    struct tokenizer *t;
    tok_emit_fn emit;
    void *ctx;
    /* while a normalized stretch is cut: its end in the raw text. Offsets inside it are offsets of the
     * normalized text, which is longer or shorter; reported ends are held at or below this, so they stay
     * in order and the runs of tokenizer_encode_runs still add up to the raw text's length. */
    size_t clamp;
};

static int run_step(struct pt *c, int k, const unsigned char *p, size_t n, size_t end, bool first);

/* The elements of one Split, folded by its behavior with at most one element held back. */
struct fold {
    struct pt *c;
    int k;
    const unsigned char *p;
    size_t n, end;
    enum tok_behavior behavior;
    bool first; /* p starts at offset 0 of the text */
    bool has, held_match, prev_match;
    size_t a, b;
};

static int out(struct fold *f, size_t a, size_t b)
{
    if (b <= a)
        return 0; /* empty pieces are dropped, as tokenizers' split does */
    return run_step(f->c, f->k + 1, f->p + a, b - a, f->end - (f->n - b), f->first && a == 0);
}

static int flush(struct fold *f)
{
    if (!f->has)
        return 0;
    f->has = false;
    return out(f, f->a, f->b);
}

static int element(struct fold *f, size_t a, size_t b, bool is_match)
{
    switch (f->behavior) {
    case TOK_ISOLATED:
        return out(f, a, b);
    case TOK_REMOVED:
        return is_match ? 0 : out(f, a, b);
    case TOK_MERGED_WITH_PREVIOUS:
    case TOK_CONTIGUOUS: {
        bool extend = f->behavior == TOK_CONTIGUOUS ? is_match == f->prev_match : is_match && !f->prev_match;
        f->prev_match = is_match;
        if (extend && f->has) {
            f->b = b;
            return 0;
        }
        FSDP_TRY(flush(f));
        f->has = true;
        f->a = a;
        f->b = b;
        return 0;
    }
    case TOK_MERGED_WITH_NEXT:
        /* a match joins the piece after it when that piece is not a match */
        if (f->has) {
            if (!is_match) {
                f->has = false;
                return out(f, f->a, b);
            }
            FSDP_TRY(flush(f));
        }
        if (is_match) {
            f->has = true;
            f->a = a;
            f->b = b;
            return 0;
        }
        return out(f, a, b);
    }
    return 0;
}

static int prefix_reserve(struct tokenizer *t, int k, size_t n)
{
    if (t->prefix_cap[k] >= n)
        return 0;
    size_t cap = 2 * n;
    char *b = realloc(t->prefix_buf[k], cap);
    if (!b)
        return error_set(FSDP_ENOMEM, "out of memory for a piece of %zu bytes", n);
    t->prefix_buf[k] = b;
    t->prefix_cap[k] = cap;
    return 0;
}

static const char meta[] = "\xe2\x96\x81"; /* U+2581, SentencePiece's word boundary */

/* Metaspace: every space becomes "▁", then "▁" goes before the piece when the scheme says so and the
 * piece does not start with one (tokenizers' Metaspace::pre_tokenize). */
static int metaspace(struct tokenizer *t, int k, const unsigned char **p_io, size_t *n_io, bool first)
{
    const unsigned char *p = *p_io;
    size_t n = *n_io, spaces = 0;
    for (size_t i = 0; i < n; i++)
        spaces += p[i] == ' ';
    bool starts = n >= 3 ? memcmp(p, meta, 3) == 0 || p[0] == ' ' : n > 0 && p[0] == ' ';
    const struct tok_step *st = &t->steps[k];
    bool prepend = !starts && (st->prepend == TOK_PREPEND_ALWAYS || (st->prepend == TOK_PREPEND_FIRST && first));
    if (!spaces && !prepend)
        return 0;
    FSDP_TRY(prefix_reserve(t, k, n + 2 * spaces + 3 + 1));
    char *d = t->prefix_buf[k];
    size_t m = 0;
    if (prepend) {
        memcpy(d, meta, 3);
        m = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (p[i] == ' ') {
            memcpy(d + m, meta, 3);
            m += 3;
        } else {
            d[m++] = (char)p[i];
        }
    }
    *p_io = (const unsigned char *)d;
    *n_io = m;
    return 0;
}

static int run_step(struct pt *c, int k, const unsigned char *p, size_t n, size_t end, bool first)
{
    struct tokenizer *t = c->t;
    if (k == t->n_steps)
        return n ? c->emit(c->ctx, p, n, false, 0, end < c->clamp ? end : c->clamp) : 0;
    struct tok_step *st = &t->steps[k];
    if (st->metaspace) {
        FSDP_TRY(metaspace(t, k, &p, &n, first));
    } else if (st->add_prefix_space && (n == 0 || p[0] != ' ')) {
        FSDP_TRY(prefix_reserve(t, k, n + 1));
        t->prefix_buf[k][0] = ' ';
        memcpy(t->prefix_buf[k] + 1, p, n);
        p = (const unsigned char *)t->prefix_buf[k];
        n++;
    }
    if (!st->re.code)
        return run_step(c, k + 1, p, n, end, first);
    struct fold f = {.c = c, .k = k, .p = p, .n = n, .end = end, .behavior = st->behavior, .first = first};
    /* Oniguruma's iteration (tokenizers' SysRegex::find_iter): an empty match right where the previous
     * match ended is skipped by moving the search on one character. */
    size_t from = 0, prev = 0, last_match_end = SIZE_MAX;
    while (from <= n) {
        size_t ms = 0, me = 0;
        int found = rx_search(&st->re, p, n, from, &ms, &me);
        FSDP_TRY(found);
        if (!found)
            break;
        if (ms == me && me == last_match_end) {
            size_t k1 = 1;
            if (from < n)
                tok_utf8_next(p + from, n - from, &k1);
            from += k1;
            continue;
        }
        from = me;
        last_match_end = me;
        if (prev != ms)
            FSDP_TRY(element(&f, prev, ms, st->invert));
        FSDP_TRY(element(&f, ms, me, !st->invert));
        prev = me;
    }
    if (prev != n)
        FSDP_TRY(element(&f, prev, n, st->invert));
    return flush(&f);
}

/* The added token with the longest content that starts at s, or NULL. tokens[] is sorted by content, so
 * the candidates sharing s's first k bytes are a range whose shortest member (if exactly k long) is its
 * first. */
static const struct tok_added *longest_at(const struct tok_added_set *set, const unsigned char *s, size_t n)
{
    size_t lo = 0, hi = set->n;
    const struct tok_added *best = NULL;
    for (size_t k = 0;; k++) {
        while (lo < hi && set->v[lo]->len == k)
            best = set->v[lo++];
        if (lo == hi || k == n)
            return best;
        unsigned char ch = s[k];
        size_t l = lo, h = hi;
        while (l < h) {
            size_t m = (l + h) / 2;
            if ((unsigned char)set->v[m]->content[k] < ch)
                l = m + 1;
            else
                h = m;
        }
        size_t first = l;
        h = hi;
        while (l < h) {
            size_t m = (l + h) / 2;
            if ((unsigned char)set->v[m]->content[k] <= ch)
                l = m + 1;
            else
                h = m;
        }
        lo = first;
        hi = l;
    }
}

static bool is_word_char(struct tokenizer *t, const unsigned char *s, size_t n)
{
    return pcre2_match(t->word_re.code, s, n, 0, PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED, t->word_re.md, NULL) >= 0;
}

static int segment(struct pt *c, int pass, const unsigned char *s, size_t n, size_t base);

/* A stretch without added tokens: after the raw pass, it is normalized and searched for the added tokens
 * matched on normalized text; after that, pre-tokenized. */
static int gap(struct pt *c, int pass, const unsigned char *s, size_t n, size_t base)
{
    if (n == 0)
        return 0;
    if (pass == 1)
        return run_step(c, 0, s, n, base + n, base == 0);
    if (c->t->n_norms == 0)
        return segment(c, 1, s, n, base);
    const unsigned char *ns;
    size_t nn;
    FSDP_TRY(tok_normalize(c->t, s, n, &ns, &nn));
    c->clamp = base + n;
    int rc = nn ? segment(c, 1, ns, nn, base) : 0;
    c->clamp = SIZE_MAX;
    return rc;
}

/* tokenizers' AddedVocabulary::find_matches on one stretch of text. */
static int segment(struct pt *c, int pass, const unsigned char *s, size_t n, size_t base)
{
    struct tokenizer *t = c->t;
    const struct tok_added_set *set = pass == 0 ? &t->raw_set : &t->norm_set;
    if (set->n == 0)
        return gap(c, pass, s, n, base);
    size_t done = 0, i = 0;
    while (i < n) {
        while (i < n && !set->first[s[i]])
            i++;
        if (i == n)
            break;
        const struct tok_added *tok = longest_at(set, s + i, n - i);
        if (!tok) {
            i++;
            continue;
        }
        size_t start = i, stop = i + tok->len;
        i = stop;
        if (tok->single_word) {
            size_t k;
            bool word_before = start > 0 && (tok_utf8_prev(s, start, &k), is_word_char(t, s + start - k, k));
            bool word_after = false;
            if (stop < n) {
                tok_utf8_next(s + stop, n - stop, &k);
                word_after = is_word_char(t, s + stop, k);
            }
            if (word_before || word_after)
                continue;
        }
        if (tok->lstrip) {
            size_t ns = start, k;
            while (ns > 0 && tok_is_white_space(tok_utf8_prev(s, ns, &k)))
                ns -= k;
            start = ns > done ? ns : done;
        }
        if (tok->rstrip) {
            size_t k;
            while (stop < n && tok_is_white_space(tok_utf8_next(s + stop, n - stop, &k)))
                stop += k;
            i = stop;
        }
        if (done < start)
            FSDP_TRY(gap(c, pass, s + done, start - done, base + done));
        FSDP_TRY(c->emit(c->ctx, s + start, stop - start, true, tok->id,
                         base + stop < c->clamp ? base + stop : c->clamp));
        done = stop;
    }
    return done < n ? gap(c, pass, s + done, n - done, base + done) : 0;
}

int tok_pretok_run(struct tokenizer *t, const unsigned char *text, size_t len, tok_emit_fn emit, void *ctx)
{
    struct pt c = {.t = t, .emit = emit, .ctx = ctx, .clamp = SIZE_MAX};
    return segment(&c, 0, text, len, 0);
}
