/* The tokenizer's hash tables: byte strings -> two u32 values (vocabulary, added tokens, the piece cache)
 * and id pairs -> (rank, merged id) (the merges). Open addressing, linear probing, power-of-two sizes;
 * a table grows when half full. */
#ifndef FSDP_TOKENIZER_HASH_H
#define FSDP_TOKENIZER_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* 64-bit hash of a byte string, never 0 (0 marks an empty slot). */
static inline uint64_t tok_hash(const void *key, size_t n)
{
    const unsigned char *s = key;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ ((uint64_t)n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, s, n);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 29;
    }
    h = (h ^ (h >> 32)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h | 1;
}

struct tok_map_entry {
    uint64_t hash; /* 0: empty */
    uint32_t off, len; /* the key in keys[] */
    uint32_t a, b;     /* the values */
};

struct tok_map {
    struct tok_map_entry *e;
    size_t cap, n;
    char *keys;
    size_t keys_n, keys_cap;
};

int tok_map_init(struct tok_map *m, size_t expected);
void tok_map_free(struct tok_map *m);
/* Empties the table and its key store, keeping their memory. */
void tok_map_clear(struct tok_map *m);
/* Inserts key -> (a, b), or overwrites the values of an existing key. */
int tok_map_put(struct tok_map *m, const void *key, size_t n, uint64_t hash, uint32_t a, uint32_t b);

static inline const struct tok_map_entry *tok_map_get(const struct tok_map *m, const void *key, size_t n,
                                                      uint64_t hash)
{
    size_t mask = m->cap - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        const struct tok_map_entry *e = &m->e[i];
        if (e->hash == 0)
            return NULL;
        if (e->hash == hash && e->len == n && memcmp(m->keys + e->off, key, n) == 0)
            return e;
    }
}

static inline const char *tok_map_key(const struct tok_map *m, const struct tok_map_entry *e)
{
    return m->keys + e->off;
}

/* (left, right) -> (rank, merged id). */
struct tok_pair_entry {
    uint64_t key; /* UINT64_MAX: empty */
    uint32_t rank, id;
};

struct tok_pairs {
    struct tok_pair_entry *e;
    size_t cap, n;
};

int tok_pairs_init(struct tok_pairs *p, size_t expected);
void tok_pairs_free(struct tok_pairs *p);
/* Inserts or overwrites (a repeated pair keeps the last rank, as `tokenizers` does). */
int tok_pairs_put(struct tok_pairs *p, uint32_t left, uint32_t right, uint32_t rank, uint32_t id);

static inline uint64_t tok_pair_slot(uint64_t key)
{
    key *= 0x9e3779b97f4a7c15ull;
    return key ^ (key >> 29);
}

static inline bool tok_pairs_get(const struct tok_pairs *p, uint32_t left, uint32_t right, uint32_t *rank,
                                 uint32_t *id)
{
    uint64_t key = (uint64_t)left << 32 | right;
    size_t mask = p->cap - 1;
    for (size_t i = tok_pair_slot(key) & mask;; i = (i + 1) & mask) {
        const struct tok_pair_entry *e = &p->e[i];
        if (e->key == key) {
            *rank = e->rank;
            *id = e->id;
            return true;
        }
        if (e->key == UINT64_MAX)
            return false;
    }
}

#endif
