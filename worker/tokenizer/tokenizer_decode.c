/* Decoding. With the ByteLevel decoder alone (GPT-2, Llama 3, Qwen2), each id's bytes were worked out at
 * load, so decoding is a concatenation. Any other decoder runs as `tokenizers` runs it: the ids become
 * their token texts, each decoder of the Sequence rewrites that list (Replace, ByteFallback, Fuse,
 * Strip, Metaspace, ByteLevel), and the result is the list joined; without a decoder the texts are
 * joined with spaces. */
#include "worker/tokenizer/tokenizer_internal.h"

#include "common/error.h"

#include <stdlib.h>

const unsigned char *tokenizer_token_bytes(const struct tokenizer *t, uint32_t id, size_t *len)
{
    if (id >= t->n_ids || !t->id_bytes[id]) {
        *len = 0;
        return NULL;
    }
    *len = t->id_bytes_len[id];
    return t->id_bytes[id];
}

/* A list of byte strings, each malloc'ed. */
struct toks {
    char **s;
    size_t *n;
    size_t count, cap;
};

static void toks_free(struct toks *l)
{
    for (size_t i = 0; i < l->count; i++)
        free(l->s[i]);
    free(l->s);
    free(l->n);
    memset(l, 0, sizeof *l);
}

/* Takes ownership of s (freed on failure). */
static int toks_push(struct toks *l, char *s, size_t n)
{
    if (!s)
        return error_set(FSDP_ENOMEM, "out of memory decoding");
    if (l->count == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        char **ns = realloc(l->s, cap * sizeof *ns);
        if (ns)
            l->s = ns;
        size_t *nn = realloc(l->n, cap * sizeof *nn);
        if (nn)
            l->n = nn;
        if (!ns || !nn) {
            free(s);
            return error_set(FSDP_ENOMEM, "out of memory decoding");
        }
        l->cap = cap;
    }
    l->s[l->count] = s;
    l->n[l->count++] = n;
    return 0;
}

static char *dup_bytes(const void *p, size_t n)
{
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, p, n);
        s[n] = '\0';
    }
    return s;
}

/* Every a in s replaced by b, into a new string (a copy when a is empty). */
static char *replace_all(const char *s, size_t n, const char *a, size_t an, const char *b, size_t bn, size_t *out_n)
{
    if (an == 0) {
        *out_n = n;
        return dup_bytes(s, n);
    }
    size_t count = 0;
    for (size_t i = 0; i + an <= n;)
        if (memcmp(s + i, a, an) == 0) {
            count++;
            i += an;
        } else {
            i++;
        }
    char *d = malloc(n - count * an + count * bn + 1);
    if (!d)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (i + an <= n && memcmp(s + i, a, an) == 0) {
            memcpy(d + k, b, bn);
            k += bn;
            i += an;
        } else {
            d[k++] = s[i++];
        }
    }
    d[k] = '\0';
    *out_n = k;
    return d;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                                                                       : -1;
}

/* The byte of a <0xXX> token (Rust's u8::from_str_radix on XX, which also takes "+X"), -1 otherwise. */
static int fallback_byte(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    if (s[3] == '+' && lo >= 0)
        return lo;
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static int fuse(struct toks *l, char *s, size_t n)
{
    toks_free(l);
    return toks_push(l, s, n);
}

static char *join(const struct toks *l, const char *sep, size_t *out_n)
{
    size_t total = 0, sn = strlen(sep);
    for (size_t i = 0; i < l->count; i++)
        total += l->n[i] + (i ? sn : 0);
    char *d = malloc(total + 1);
    if (!d)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < l->count; i++) {
        if (i) {
            memcpy(d + k, sep, sn);
            k += sn;
        }
        memcpy(d + k, l->s[i], l->n[i]);
        k += l->n[i];
    }
    d[k] = '\0';
    *out_n = k;
    return d;
}

static int step_byte_fallback(struct toks *l)
{
    struct toks out = {0};
    unsigned char *run = malloc(l->count + 1);
    if (!run)
        return error_set(FSDP_ENOMEM, "out of memory decoding");
    size_t rn = 0;
    int rc = 0;
    for (size_t i = 0; i <= l->count && rc == 0; i++) {
        int b = i < l->count ? fallback_byte(l->s[i], l->n[i]) : -1;
        if (b >= 0) {
            run[rn++] = (unsigned char)b;
            continue;
        }
        if (rn) {
            if (tokenizer_utf8_check((const char *)run, rn) == rn) {
                rc = toks_push(&out, dup_bytes(run, rn), rn);
            } else {
                for (size_t k = 0; k < rn && rc == 0; k++)
                    rc = toks_push(&out, dup_bytes("\xef\xbf\xbd", 3), 3);
            }
            rn = 0;
        }
        if (i < l->count && rc == 0) {
            rc = toks_push(&out, l->s[i], l->n[i]);
            l->s[i] = NULL;
        }
    }
    free(run);
    toks_free(l);
    *l = out;
    return rc;
}

/* The characters a token ends or starts with, as tokenizers' Strip counts them. */
static char *strip(const char *s, size_t n, const struct tok_dec *d, size_t *out_n)
{
    size_t a = 0, b = n;
    for (size_t i = 0; i < d->start && a + d->an <= n && memcmp(s + a, d->a, d->an) == 0; i++)
        a += d->an;
    for (size_t i = 0; i < d->stop && b >= a + d->an && memcmp(s + b - d->an, d->a, d->an) == 0; i++)
        b -= d->an;
    *out_n = b - a;
    return dup_bytes(s + a, b - a);
}

static int step_byte_level(struct toks *l)
{
    size_t total = 0;
    for (size_t i = 0; i < l->count; i++)
        total += l->n[i];
    unsigned char *d = malloc(total + 1);
    if (!d)
        return error_set(FSDP_ENOMEM, "out of memory decoding");
    size_t k = 0;
    for (size_t i = 0; i < l->count; i++) {
        const unsigned char *s = (const unsigned char *)l->s[i];
        size_t n = l->n[i], start = k, len;
        bool bytes = true;
        for (size_t j = 0; j < n && bytes; j += len) {
            int b = tok_char_byte(tok_utf8_next(s + j, n - j, &len));
            if (b < 0)
                bytes = false;
            else
                d[k++] = (unsigned char)b;
        }
        if (!bytes) {
            memcpy(d + start, s, n);
            k = start + n;
        }
    }
    char *fixed;
    size_t fn, replaced;
    int rc = tokenizer_utf8_repair((const char *)d, k, &fixed, &fn, &replaced);
    free(d);
    return rc ? rc : fuse(l, fixed, fn);
}

static int run_chain(const struct tokenizer *t, struct toks *l)
{
    for (int s = 0; s < t->n_decs; s++) {
        const struct tok_dec *d = &t->decs[s];
        switch (d->kind) {
        case TOK_DEC_BYTE_FALLBACK:
            FSDP_TRY(step_byte_fallback(l));
            break;
        case TOK_DEC_FUSE: {
            size_t n = 0;
            char *all = join(l, "", &n); /* before fuse reads n */
            FSDP_TRY(fuse(l, all, n));
            break;
        }
        case TOK_DEC_BYTE_LEVEL:
            FSDP_TRY(step_byte_level(l));
            break;
        case TOK_DEC_REPLACE:
        case TOK_DEC_STRIP:
        case TOK_DEC_METASPACE:
            for (size_t i = 0; i < l->count; i++) {
                size_t n = 0;
                char *r;
                if (d->kind == TOK_DEC_STRIP)
                    r = strip(l->s[i], l->n[i], d, &n);
                else if (d->kind == TOK_DEC_REPLACE)
                    r = replace_all(l->s[i], l->n[i], d->a, d->an, d->b, d->bn, &n);
                else /* the first token's "▁" are dropped, as tokenizers' Metaspace decoder does */
                    r = replace_all(l->s[i], l->n[i], d->a, d->an, " ", i == 0 && d->prepend ? 0 : 1, &n);
                if (!r)
                    return error_set(FSDP_ENOMEM, "out of memory decoding");
                free(l->s[i]);
                l->s[i] = r;
                l->n[i] = n;
            }
            break;
        }
    }
    return 0;
}

int tok_dec_token_bytes(const struct tokenizer *t, const char *text, size_t n, char **out, size_t *out_n)
{
    bool fallback = false;
    for (int s = 0; s < t->n_decs; s++)
        fallback |= t->decs[s].kind == TOK_DEC_BYTE_FALLBACK;
    int b = fallback ? fallback_byte(text, n) : -1;
    if (b >= 0) {
        char c = (char)b;
        *out = dup_bytes(&c, 1);
        *out_n = 1;
        return *out ? 0 : error_set(FSDP_ENOMEM, "out of memory");
    }
    char *cur = dup_bytes(text, n);
    size_t cn = n;
    for (int s = 0; s < t->n_decs && cur; s++) {
        const struct tok_dec *d = &t->decs[s];
        if (d->kind != TOK_DEC_REPLACE && d->kind != TOK_DEC_METASPACE)
            continue;
        char *r = replace_all(cur, cn, d->a, d->an, d->kind == TOK_DEC_REPLACE ? d->b : " ",
                              d->kind == TOK_DEC_REPLACE ? d->bn : 1, &cn);
        free(cur);
        cur = r;
    }
    *out = cur;
    *out_n = cn;
    return cur ? 0 : error_set(FSDP_ENOMEM, "out of memory");
}

int tokenizer_decode(const struct tokenizer *t, const uint32_t *ids, size_t n, bool skip_special, char **out,
                     size_t *len)
{
    *out = NULL;
    *len = 0;
    if (!t->decoder_ok)
        return error_set(FSDP_EUNSUPPORTED, "%s", t->decoder_error);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= t->n_ids || !t->id_bytes[ids[i]])
            return error_set(FSDP_EINVAL, "%s: id %u at position %zu is not a token of this tokenizer (vocab_size "
                             "%u)", t->name, ids[i], i, t->n_ids);
        if (!(skip_special && t->id_special[ids[i]]))
            total += t->id_bytes_len[ids[i]];
    }
    if (!t->decoder_bytelevel) {
        struct toks l = {0};
        int rc = 0;
        for (size_t i = 0; i < n && rc == 0; i++) {
            const char *s = t->id_text[ids[i]];
            if (!(skip_special && t->id_special[ids[i]]))
                rc = toks_push(&l, dup_bytes(s, strlen(s)), strlen(s));
        }
        if (rc == 0)
            rc = run_chain(t, &l);
        if (rc == 0 && !(*out = join(&l, t->decoder_null ? " " : "", len)))
            rc = error_set(FSDP_ENOMEM, "out of memory decoding %zu ids", n);
        toks_free(&l);
        return rc;
    }
    char *s = malloc(total + 1);
    if (!s)
        return error_set(FSDP_ENOMEM, "out of memory decoding %zu ids", n);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip_special && t->id_special[ids[i]])
            continue;
        memcpy(s + k, t->id_bytes[ids[i]], t->id_bytes_len[ids[i]]);
        k += t->id_bytes_len[ids[i]];
    }
    s[k] = '\0';
    *out = s;
    *len = k;
    return 0;
}
