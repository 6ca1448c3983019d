/* The normalizers of a tokenizer.json, applied to each stretch of text between the added tokens matched
 * on raw text, as `tokenizers` does: the Unicode normal forms (NFC for Qwen2, NFKC, NFD, NFKD) through
 * utf8proc, whose tables follow the Unicode standard rather than a copy kept here, and the literal
 * Prepend and Replace that older SentencePiece conversions (Llama 2, Gemma) use instead of Metaspace. */
#include "worker/tools/tokenizer_internal.h"

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

static bool all_ascii(const unsigned char *s, size_t n)
{
    unsigned char acc = 0;
    for (size_t i = 0; i < n; i++)
        acc |= s[i];
    return acc < 0x80;
}

/* One normal form into buffer `which`. ASCII text is in every normal form already: the common case costs
 * one pass over the bytes. */
static int normal_form(struct tokenizer *t, enum tok_norm_kind kind, const unsigned char *s, size_t n, int which,
                       const unsigned char **out, size_t *out_n)
{
    if (all_ascii(s, n)) {
        *out = s;
        *out_n = n;
        return 0;
    }
    utf8proc_option_t opt = UTF8PROC_STABLE;
    opt |= kind == TOK_NORM_NFC || kind == TOK_NORM_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
    if (kind == TOK_NORM_NFKC || kind == TOK_NORM_NFKD)
        opt |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t k = utf8proc_map(s, (utf8proc_ssize_t)n, &dst, opt);
    if (k < 0)
        return error_set(k == UTF8PROC_ERROR_NOMEM ? FSDP_ENOMEM : FSDP_EINVAL, "%s: normalizing a text of %zu bytes: "
                         "%s", t->name, n, utf8proc_errmsg(k));
    int rc = reserve(t, which, (size_t)k + 1);
    if (rc == 0) {
        memcpy(t->norm_buf[which], dst, (size_t)k);
        *out = (const unsigned char *)t->norm_buf[which];
        *out_n = (size_t)k;
    }
    free(dst);
    return rc;
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
    for (int i = 0; i < 2; i++) {
        free(t->norm_buf[i]);
        t->norm_buf[i] = NULL;
        t->norm_cap[i] = 0;
    }
    t->n_norms = 0;
}
