#include "rendezvous/store_table.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"

static uint64_t hash_bytes(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

int store_table_init(struct store_table *t)
{
    memset(t, 0, sizeof *t);
    t->nbuckets = 64;
    t->buckets = calloc(t->nbuckets, sizeof *t->buckets);
    return t->buckets ? 0 : error_set(FSDP_ENOMEM, "out of memory creating the store table");
}

static void entry_free(struct store_entry *e)
{
    free(e->key);
    free(e->value);
    free(e);
}

void store_table_free(struct store_table *t)
{
    for (size_t i = 0; t->buckets && i < t->nbuckets; i++) {
        struct store_entry *e = t->buckets[i];
        while (e) {
            struct store_entry *next = e->next;
            entry_free(e);
            e = next;
        }
    }
    free(t->buckets);
    memset(t, 0, sizeof *t);
}

struct store_entry *store_table_find(const struct store_table *t, const void *key, size_t key_len)
{
    uint64_t h = hash_bytes(key, key_len);
    for (struct store_entry *e = t->buckets[h & (t->nbuckets - 1)]; e; e = e->next)
        if (e->hash == h && e->key_len == key_len && memcmp(e->key, key, key_len) == 0)
            return e;
    return NULL;
}

static void table_grow(struct store_table *t)
{
    size_t n = t->nbuckets * 2;
    struct store_entry **b = calloc(n, sizeof *b);
    if (!b)
        return; /* a longer chain is slower, not wrong */
    for (size_t i = 0; i < t->nbuckets; i++) {
        struct store_entry *e = t->buckets[i];
        while (e) {
            struct store_entry *next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
            e = next;
        }
    }
    free(t->buckets);
    t->buckets = b;
    t->nbuckets = n;
}

struct store_entry *store_table_get_or_add(struct store_table *t, const void *key, size_t key_len)
{
    struct store_entry *e = store_table_find(t, key, key_len);
    if (e)
        return e;
    e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->key = malloc(key_len ? key_len : 1);
    if (!e->key) {
        free(e);
        return NULL;
    }
    memcpy(e->key, key, key_len);
    e->key_len = key_len;
    e->hash = hash_bytes(key, key_len);
    if (t->nentries >= t->nbuckets)
        table_grow(t);
    size_t i = e->hash & (t->nbuckets - 1);
    e->next = t->buckets[i];
    t->buckets[i] = e;
    t->nentries++;
    return e;
}

void store_table_adopt_value(struct store_table *t, struct store_entry *e, uint8_t *value, size_t len)
{
    free(e->value);
    e->value = value;
    e->value_len = len;
    if (!e->has_value)
        t->nvalues++;
    e->has_value = true;
}

int store_table_set_value(struct store_table *t, struct store_entry *e, const void *value, size_t len)
{
    uint8_t *v = malloc(len ? len : 1);
    if (!v)
        return error_set(FSDP_ENOMEM, "out of memory storing a value of %zu bytes", len);
    if (len)
        memcpy(v, value, len);
    store_table_adopt_value(t, e, v, len);
    return 0;
}

void store_table_release_if_unused(struct store_table *t, struct store_entry *e)
{
    if (e->has_value || e->waiters)
        return;
    struct store_entry **pp = &t->buckets[e->hash & (t->nbuckets - 1)];
    while (*pp && *pp != e)
        pp = &(*pp)->next;
    if (*pp)
        *pp = e->next;
    t->nentries--;
    entry_free(e);
}

void store_table_clear_value(struct store_table *t, struct store_entry *e)
{
    if (e->has_value)
        t->nvalues--;
    free(e->value);
    e->value = NULL;
    e->value_len = 0;
    e->has_value = false;
    store_table_release_if_unused(t, e);
}
