#include "worker/tokenizer/tokenizer_hash.h"

#include "common/error.h"

#include <stdlib.h>

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

int tok_map_init(struct tok_map *m, size_t expected)
{
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(2 * expected + 1);
    m->e = calloc(m->cap, sizeof *m->e);
    return m->e ? 0 : error_set(FSDP_ENOMEM, "out of memory for a table of %zu entries", m->cap);
}

void tok_map_free(struct tok_map *m)
{
    free(m->e);
    free(m->keys);
    memset(m, 0, sizeof *m);
}

void tok_map_clear(struct tok_map *m)
{
    memset(m->e, 0, m->cap * sizeof *m->e);
    m->n = 0;
    m->keys_n = 0;
}

static int map_grow(struct tok_map *m)
{
    size_t cap = m->cap * 2;
    struct tok_map_entry *e = calloc(cap, sizeof *e);
    if (!e)
        return error_set(FSDP_ENOMEM, "out of memory for a table of %zu entries", cap);
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->e[i].hash)
            continue;
        size_t j = m->e[i].hash & (cap - 1);
        while (e[j].hash)
            j = (j + 1) & (cap - 1);
        e[j] = m->e[i];
    }
    free(m->e);
    m->e = e;
    m->cap = cap;
    return 0;
}

int tok_map_put(struct tok_map *m, const void *key, size_t n, uint64_t hash, uint32_t a, uint32_t b)
{
    if (n > UINT32_MAX)
        return error_set(FSDP_ERANGE, "a token of %zu bytes is too long", n);
    if (2 * (m->n + 1) > m->cap)
        FSDP_TRY(map_grow(m));
    size_t mask = m->cap - 1, i = hash & mask;
    for (; m->e[i].hash; i = (i + 1) & mask) {
        struct tok_map_entry *e = &m->e[i];
        if (e->hash == hash && e->len == n && memcmp(m->keys + e->off, key, n) == 0) {
            e->a = a;
            e->b = b;
            return 0;
        }
    }
    if (m->keys_cap - m->keys_n < n) {
        size_t cap = m->keys_cap ? m->keys_cap : 4096;
        while (cap - m->keys_n < n)
            cap *= 2;
        if (cap > UINT32_MAX)
            return error_set(FSDP_ERANGE, "the tokenizer's tables outgrew 4 GiB of keys");
        char *k = realloc(m->keys, cap);
        if (!k)
            return error_set(FSDP_ENOMEM, "out of memory for %zu bytes of keys", cap);
        m->keys = k;
        m->keys_cap = cap;
    }
    memcpy(m->keys + m->keys_n, key, n);
    m->e[i] = (struct tok_map_entry){.hash = hash, .off = (uint32_t)m->keys_n, .len = (uint32_t)n, .a = a, .b = b};
    m->keys_n += n;
    m->n++;
    return 0;
}

int tok_pairs_init(struct tok_pairs *p, size_t expected)
{
    p->cap = pow2_at_least(2 * expected + 1);
    p->n = 0;
    p->e = malloc(p->cap * sizeof *p->e);
    if (!p->e)
        return error_set(FSDP_ENOMEM, "out of memory for a table of %zu merges", p->cap);
    for (size_t i = 0; i < p->cap; i++)
        p->e[i].key = UINT64_MAX;
    return 0;
}

void tok_pairs_free(struct tok_pairs *p)
{
    free(p->e);
    memset(p, 0, sizeof *p);
}

int tok_pairs_put(struct tok_pairs *p, uint32_t left, uint32_t right, uint32_t rank, uint32_t id)
{
    uint64_t key = (uint64_t)left << 32 | right;
    if (2 * (p->n + 1) > p->cap) {
        size_t cap = p->cap * 2;
        struct tok_pair_entry *e = malloc(cap * sizeof *e);
        if (!e)
            return error_set(FSDP_ENOMEM, "out of memory for a table of %zu merges", cap);
        for (size_t i = 0; i < cap; i++)
            e[i].key = UINT64_MAX;
        for (size_t i = 0; i < p->cap; i++) {
            if (p->e[i].key == UINT64_MAX)
                continue;
            size_t j = tok_pair_slot(p->e[i].key) & (cap - 1);
            while (e[j].key != UINT64_MAX)
                j = (j + 1) & (cap - 1);
            e[j] = p->e[i];
        }
        free(p->e);
        p->e = e;
        p->cap = cap;
    }
    size_t mask = p->cap - 1, i = tok_pair_slot(key) & mask;
    for (; p->e[i].key != UINT64_MAX; i = (i + 1) & mask) {
        if (p->e[i].key == key) {
            p->e[i].rank = rank;
            p->e[i].id = id;
            return 0;
        }
    }
    p->e[i] = (struct tok_pair_entry){.key = key, .rank = rank, .id = id};
    p->n++;
    return 0;
}
