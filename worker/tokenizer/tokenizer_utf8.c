/* UTF-8 checks (Unicode's Table 3-7 of well-formed byte sequences) and the repair Python's
 * errors="replace" makes, so text that is not UTF-8 is either refused or encoded as `tokenizers` would see
 * it after Python decoded it. */
#include "worker/tokenizer/tokenizer.h"
#include "worker/tokenizer/tokenizer_internal.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>

/* Length of the well-formed prefix of the sequence starting at s[0] (n > 0 bytes available): the whole
 * sequence length when it is complete and valid (*ok set), else the length of its maximal valid
 * subpart (at least 1, *ok clear). */
static size_t seq_len(const unsigned char *s, size_t n, bool *ok)
{
    unsigned char c = s[0];
    *ok = false;
    size_t need;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c < 0x80) {
        *ok = true;
        return 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else {
        return 1;
    }
    size_t k = 1;
    for (; k < need; k++) {
        if (k >= n)
            return k;
        unsigned char b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf))
            return k;
    }
    *ok = true;
    return need;
}

size_t tokenizer_utf8_check(const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        if (len - i >= 8) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        bool ok;
        size_t k = seq_len(s + i, len - i, &ok);
        if (!ok)
            return i;
        i += k;
    }
    return len;
}

int tokenizer_utf8_repair(const char *text, size_t len, char **out, size_t *out_len, size_t *replaced)
{
    const unsigned char *s = (const unsigned char *)text;
    *replaced = 0;
    /* U+FFFD is 3 bytes and replaces at least 1 byte */
    char *o = malloc(3 * len + 1);
    if (!o)
        return error_set(FSDP_ENOMEM, "out of memory repairing %zu bytes of text", len);
    size_t i = 0, j = 0;
    while (i < len) {
        size_t good = tokenizer_utf8_check(text + i, len - i);
        memcpy(o + j, s + i, good);
        i += good;
        j += good;
        if (i == len)
            break;
        bool ok;
        i += seq_len(s + i, len - i, &ok);
        memcpy(o + j, "\xef\xbf\xbd", 3);
        j += 3;
        (*replaced)++;
    }
    o[j] = '\0';
    *out = o;
    *out_len = j;
    return 0;
}

uint32_t tok_utf8_next(const unsigned char *s, size_t n, size_t *k)
{
    unsigned char c = s[0];
    if (c < 0x80 || n < 2) {
        *k = 1;
        return c;
    }
    if (c < 0xe0) {
        *k = 2;
        return (uint32_t)(c & 0x1f) << 6 | (s[1] & 0x3f);
    }
    if (c < 0xf0 || n < 4) {
        *k = n < 3 ? n : 3;
        return n < 3 ? 0xfffd : (uint32_t)(c & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    }
    *k = 4;
    return (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 | (uint32_t)(s[2] & 0x3f) << 6 | (s[3] & 0x3f);
}

uint32_t tok_utf8_prev(const unsigned char *s, size_t n, size_t *k)
{
    size_t b = n - 1;
    while (b > 0 && n - b < 4 && (s[b] & 0xc0) == 0x80)
        b--;
    return tok_utf8_next(s + b, n - b, k);
}

size_t tok_utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

bool tok_is_white_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}
