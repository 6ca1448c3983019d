/* The normalizers of a tokenizer.json, applied to each stretch of text between the added tokens matched
 * on raw text, as `tokenizers` does: the Unicode normal forms (NFC for Qwen2, NFKC, NFD, NFKD) through
 * utf8proc, whose tables follow the Unicode standard rather than a copy kept here, and the literal
 * Prepend and Replace that older SentencePiece conversions (Llama 2, Gemma) use instead of Metaspace. */
#include "worker/tokenizer/tokenizer_internal.h"

#include "common/error.h"

#include <stdlib.h>
#include <utf8proc.h>

static int reserve(struct tokenizer *t, int which, size_t n)
{
    if (t->norm_cap[which] >= n)
        return 0;
    size_t cap = t->norm_cap[which] ? t->norm_cap[which] : 4096;
    while (cap < n)
        cap *= 2;
    char *b = realloc(t->norm_buf[which], cap);
    if (!b)
        return error_set(FSDP_ENOMEM, "out of memory normalizing a text of %zu bytes", n);
    t->norm_buf[which] = b;
    t->norm_cap[which] = cap;
    return 0;
}

/* Normalizes s[0..n) with utf8proc and appends the UTF-8 to buffer `which` at *k. The code points go
 * through t->norm_cp, reused, so most calls allocate nothing. */
static int normalize_span(struct tokenizer *t, utf8proc_option_t opt, const unsigned char *s, size_t n, int which,
                          size_t *k)
{
    utf8proc_ssize_t m = utf8proc_decompose(s, (utf8proc_ssize_t)n, t->norm_cp, (utf8proc_ssize_t)t->norm_cp_cap, opt);
    if (m >= 0 && (size_t)m > t->norm_cp_cap) {
        size_t cap = t->norm_cp_cap ? t->norm_cp_cap : 1024;
        while (cap < (size_t)m)
            cap *= 2;
        int32_t *cp = realloc(t->norm_cp, cap * sizeof *cp);
        if (!cp)
            return error_set(FSDP_ENOMEM, "out of memory normalizing a text of %zu bytes", n);
        t->norm_cp = cp;
        t->norm_cp_cap = cap;
        m = utf8proc_decompose(s, (utf8proc_ssize_t)n, t->norm_cp, (utf8proc_ssize_t)t->norm_cp_cap, opt);
    }
    /* composes (NFC, NFKC) and writes UTF-8 over the code points, which have room for it */
    if (m >= 0)
        m = utf8proc_reencode(t->norm_cp, m, opt);
    if (m < 0)
        return error_set(m == UTF8PROC_ERROR_NOMEM ? FSDP_ENOMEM : FSDP_EINVAL, "%s: normalizing a text of %zu "
                         "bytes: %s", t->name, n, utf8proc_errmsg(m));
    FSDP_TRY(reserve(t, which, *k + (size_t)m + 1));
    memcpy(t->norm_buf[which] + *k, t->norm_cp, (size_t)m);
    *k += (size_t)m;
    return 0;
}

/* One normal form into buffer `which`. ASCII is in every normal form and no ASCII character combines
 * with the character before it, so the text is cut between any two ASCII characters and only the spans
 * holding other characters (with the ASCII character before them, which may be the first half of a
 * composition) go through utf8proc: mostly-ASCII text costs a pass over its bytes. */
static int normal_form(struct tokenizer *t, enum tok_norm_kind kind, const unsigned char *s, size_t n, int which,
                       const unsigned char **out, size_t *out_n)
{
    size_t j = 0;
    while (j < n && s[j] < 0x80)
        j++;
    if (j == n) {
        *out = s;
        *out_n = n;
        return 0;
    }
    utf8proc_option_t opt = UTF8PROC_STABLE;
    opt |= kind == TOK_NORM_NFC || kind == TOK_NORM_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
    if (kind == TOK_NORM_NFKC || kind == TOK_NORM_NFKD)
        opt |= UTF8PROC_COMPAT;
    FSDP_TRY(reserve(t, which, n + 1));
    size_t k = 0, i = 0;
    while (i < n) {
        while (j < n && s[j] < 0x80)
            j++;
        size_t start = j > i ? j - 1 : j; /* j == i only at the start of the text */
        if (j == n)
            start = n;
        FSDP_TRY(reserve(t, which, k + (start - i) + 1));
        memcpy(t->norm_buf[which] + k, s + i, start - i);
        k += start - i;
        if (start == n)
            break;
        /* the span ends at an ASCII character followed by another or by the end */
        size_t e = j;
        while (e < n && !(s[e] < 0x80 && (e + 1 == n || s[e + 1] < 0x80)))
            e++;
        FSDP_TRY(normalize_span(t, opt, s + start, e - start, which, &k));
        i = j = e;
    }
    *out = (const unsigned char *)t->norm_buf[which];
    *out_n = k;
    return 0;
}

/* Prepend or Replace into buffer `which`. */
static int literal(struct tokenizer *t, const struct tok_norm *nm, const unsigned char *s, size_t n, int which,
                   const unsigned char **out, size_t *out_n)
{
    if (nm->kind == TOK_NORM_PREPEND) {
        if (n == 0) {
            *out = s;
            *out_n = 0;
            return 0;
        }
        FSDP_TRY(reserve(t, which, nm->an + n + 1));
        memcpy(t->norm_buf[which], nm->a, nm->an);
        memcpy(t->norm_buf[which] + nm->an, s, n);
        *out = (const unsigned char *)t->norm_buf[which];
        *out_n = nm->an + n;
        return 0;
    }
    size_t count = 0;
    for (size_t i = 0; i + nm->an <= n;) {
        const unsigned char *hit = memchr(s + i, nm->a[0], n - i - nm->an + 1);
        if (!hit)
            break;
        i = (size_t)(hit - s);
        if (memcmp(hit, nm->a, nm->an) == 0) {
            count++;
            i += nm->an;
        } else {
            i++;
        }
    }
    if (count == 0) {
        *out = s;
        *out_n = n;
        return 0;
    }
    size_t total = n - count * nm->an + count * nm->bn;
    FSDP_TRY(reserve(t, which, total + 1));
    char *d = t->norm_buf[which];
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (i + nm->an <= n && s[i] == (unsigned char)nm->a[0] && memcmp(s + i, nm->a, nm->an) == 0) {
            memcpy(d + k, nm->b, nm->bn);
            k += nm->bn;
            i += nm->an;
        } else {
            d[k++] = (char)s[i++];
        }
    }
    *out = (const unsigned char *)d;
    *out_n = k;
    return 0;
}

int tok_normalize(struct tokenizer *t, const unsigned char *s, size_t n, const unsigned char **out, size_t *out_n)
{
    const unsigned char *cur = s;
    size_t cur_n = n;
    for (int i = 0; i < t->n_norms; i++) {
        /* write into the buffer the current text is not in */
        int which = cur == (const unsigned char *)t->norm_buf[0] ? 1 : 0;
        const struct tok_norm *nm = &t->norms[i];
        if (nm->kind == TOK_NORM_PREPEND || nm->kind == TOK_NORM_REPLACE)
            FSDP_TRY(literal(t, nm, cur, cur_n, which, &cur, &cur_n));
        else
            FSDP_TRY(normal_form(t, nm->kind, cur, cur_n, which, &cur, &cur_n));
    }
    *out = cur;
    *out_n = cur_n;
    return 0;
}

void tok_norm_free(struct tokenizer *t)
{
    for (int i = 0; i < t->n_norms; i++) {
        free(t->norms[i].a);
        free(t->norms[i].b);
    }
    free(t->norm_cp);
    t->norm_cp = NULL;
    t->norm_cp_cap = 0;
    for (int i = 0; i < 2; i++) {
        free(t->norm_buf[i]);
        t->norm_buf[i] = NULL;
        t->norm_cap[i] = 0;
    }
    t->n_norms = 0;
}
