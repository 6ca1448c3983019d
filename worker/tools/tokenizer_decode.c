/* Decoding: each id's bytes were worked out at load (the ByteLevel decoder's rule), so decoding is a
 * concatenation. */
#include "worker/tools/tokenizer_internal.h"

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
