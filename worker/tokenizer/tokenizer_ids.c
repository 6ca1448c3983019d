#include "worker/tokenizer/tokenizer_ids.h"

#include "common/error.h"

#include <stdlib.h>

int tokenizer_ids_reserve(struct tokenizer_ids *ids, size_t more)
{
    if (ids->cap - ids->n >= more)
        return 0;
    size_t cap = ids->cap ? ids->cap : 1024;
    while (cap - ids->n < more)
        cap *= 2;
    uint32_t *v = realloc(ids->v, cap * sizeof *v);
    if (!v)
        return error_set(FSDP_ENOMEM, "out of memory for %zu token ids", cap);
    ids->v = v;
    ids->cap = cap;
    return 0;
}

void tokenizer_ids_free(struct tokenizer_ids *ids)
{
    free(ids->v);
    ids->v = NULL;
    ids->n = ids->cap = 0;
}
