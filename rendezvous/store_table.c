#include "rendezvous/store_table.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "rendezvous/store_auth.h"

static uint64_t hash_key(const struct store_table *t, int ns, const void *key, size_t n)
{
    const uint8_t *b = key;
    uint64_t h = 1469598103934665603ull ^ t->seed;
    h = (h ^ (uint8_t)ns) * 1099511628211ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

int store_table_init(struct store_table *t)
{
    memset(t, 0, sizeof *t);
    /* A seed the peers cannot know keeps them from choosing keys that all land in one chain. */
    uint8_t s[8] = {0};
    if (store_auth_random(s, sizeof s) == 0)
        memcpy(&t->seed, s, sizeof t->seed);
    t->nbuckets = 64;
    t->buckets = calloc(t->nbuckets, sizeof *t->buckets);
    return t->buckets ? 0 : error_set(FSDP_ENOMEM, "out of memory creating the store table");
}

static void queue_free(struct store_entry *e)
{
    for (struct store_qitem *q = e->qhead; q;) {
        struct store_qitem *next = q->next;
        free(q);
        q = next;
    }
    e->qhead = e->qtail = NULL;
    e->qlen = e->qbytes = 0;
}

static void entry_free(struct store_entry *e)
{
    queue_free(e);
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

struct store_entry *store_table_find(const struct store_table *t, int ns, const void *key, size_t key_len)
{
    uint64_t h = hash_key(t, ns, key, key_len);
    for (struct store_entry *e = t->buckets[h & (t->nbuckets - 1)]; e; e = e->next)
        if (e->hash == h && e->ns == ns && e->key_len == key_len && memcmp(e->key, key, key_len) == 0)
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

struct store_entry *store_table_get_or_add(struct store_table *t, int ns, const void *key, size_t key_len)
{
    struct store_entry *e = store_table_find(t, ns, key, key_len);
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
    if (key_len)
        memcpy(e->key, key, key_len);
    e->key_len = key_len;
    e->ns = (uint8_t)ns;
    e->hash = hash_key(t, ns, key, key_len);
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
        t->nvalues[e->ns]++;
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

void store_table_clear_value(struct store_table *t, struct store_entry *e)
{
    if (e->has_value)
        t->nvalues[e->ns]--;
    free(e->value);
    e->value = NULL;
    e->value_len = 0;
    e->has_value = false;
}

int store_table_queue_push(struct store_entry *e, const void *value, size_t len)
{
    struct store_qitem *q = malloc(sizeof *q + (len ? len : 1));
    if (!q)
        return error_set(FSDP_ENOMEM, "out of memory queueing a value of %zu bytes", len);
    q->next = NULL;
    q->len = len;
    if (len)
        memcpy(q->data, value, len);
    if (e->qtail)
        e->qtail->next = q;
    else
        e->qhead = q;
    e->qtail = q;
    e->qlen++;
    e->qbytes += len + STORE_QITEM_OVERHEAD;
    return 0;
}

struct store_qitem *store_table_queue_pop(struct store_entry *e)
{
    struct store_qitem *q = e->qhead;
    if (!q)
        return NULL;
    e->qhead = q->next;
    if (!e->qhead)
        e->qtail = NULL;
    e->qlen--;
    e->qbytes -= q->len + STORE_QITEM_OVERHEAD;
    return q;
}

bool store_table_entry_present(const struct store_entry *e) { return e && (e->has_value || e->qlen > 0); }

size_t store_table_entry_bytes(const struct store_entry *e)
{
    if (!e->has_value && e->qlen == 0)
        return 0;
    return STORE_ENTRY_OVERHEAD + e->key_len + (e->has_value ? e->value_len : 0) + e->qbytes;
}

static void unlink_entry(struct store_table *t, struct store_entry *e)
{
    struct store_entry **pp = &t->buckets[e->hash & (t->nbuckets - 1)];
    while (*pp && *pp != e)
        pp = &(*pp)->next;
    if (*pp)
        *pp = e->next;
    t->nentries--;
}

void store_table_release_if_unused(struct store_table *t, struct store_entry *e)
{
    if (e->has_value || e->qlen > 0 || e->waiters)
        return;
    unlink_entry(t, e);
    entry_free(e);
}

void store_table_each(struct store_table *t, int ns, void (*fn)(struct store_entry *e, void *arg), void *arg)
{
    for (size_t i = 0; i < t->nbuckets; i++) {
        struct store_entry **pp = &t->buckets[i];
        while (*pp) {
            struct store_entry *e = *pp;
            if (e->ns == ns)
                fn(e, arg);
            if (e->ns == ns && !e->has_value && e->qlen == 0 && !e->waiters) {
                *pp = e->next;
                t->nentries--;
                entry_free(e);
            } else {
                pp = &e->next;
            }
        }
    }
}
