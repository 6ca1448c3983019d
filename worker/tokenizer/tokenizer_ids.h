/* A growing array of token ids, what the tokenizer appends to. */
#ifndef FSDP_TOKENIZER_IDS_H
#define FSDP_TOKENIZER_IDS_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer_ids {
    uint32_t *v;
    size_t n, cap;
};

/* Makes room for `more` ids beyond n (FSDP_ENOMEM with a message when that fails). */
int tokenizer_ids_reserve(struct tokenizer_ids *ids, size_t more);
/* Appends one id. */
static inline int tokenizer_ids_push(struct tokenizer_ids *ids, uint32_t id)
{
    if (ids->n == ids->cap) {
        int rc = tokenizer_ids_reserve(ids, 1);
        if (rc < 0)
            return rc;
    }
    ids->v[ids->n++] = id;
    return 0;
}
void tokenizer_ids_free(struct tokenizer_ids *ids);

#endif
