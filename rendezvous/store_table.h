/* The server's key table: a chained hash table (FNV-1a from a per-table random seed, doubled when the load
 * passes 1) whose entries also carry the requests waiting on that key, so a write wakes exactly its
 * waiters without a scan, and the key's queue (c10d's QUEUE_* ops). Keys live in namespaces (PyTorch
 * clients' and fsdpc's), so the same bytes in two namespaces are two keys. An entry exists while it has a
 * value, a queued item or a waiter; one with only waiters is a placeholder. */
#ifndef FSDP_RENDEZVOUS_STORE_TABLE_H
#define FSDP_RENDEZVOUS_STORE_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum store_ns { STORE_NS_TORCH = 0, STORE_NS_FSDP = 1, STORE_NS_COUNT };

/* Bookkeeping an entry and a queued item cost beyond their bytes, counted so that many tiny keys are not
 * free (store_table_entry_bytes). */
#define STORE_ENTRY_OVERHEAD 64u
#define STORE_QITEM_OVERHEAD 32u

struct store_wait_link; /* owned by the server: one per (waiting request, key) */

struct store_qitem {
    struct store_qitem *next;
    size_t len;
    uint8_t data[];
};

struct store_entry {
    struct store_entry *next; /* bucket chain */
    uint64_t hash;
    uint8_t ns;
    uint8_t *key;
    size_t key_len;
    uint8_t *value; /* NULL when has_value is false */
    size_t value_len;
    bool has_value;
    struct store_qitem *qhead, *qtail;
    size_t qlen, qbytes;
    struct store_wait_link *waiters; /* head of a doubly linked list */
    /* What the server charged for this entry (store_table_entry_bytes when it last did) and to whom: the
     * table only carries these for it. */
    size_t charged;
    void *owner;
};

struct store_table {
    struct store_entry **buckets;
    size_t nbuckets;
    size_t nentries;                /* including placeholders */
    size_t nvalues[STORE_NS_COUNT]; /* entries with a value: what GETNUMKEYS reports */
    uint64_t seed;
};

int store_table_init(struct store_table *t);
/* Frees every entry; the caller must have released all waiters first. */
void store_table_free(struct store_table *t);
struct store_entry *store_table_find(const struct store_table *t, int ns, const void *key, size_t key_len);
/* Finds or inserts a placeholder; NULL only when out of memory. */
struct store_entry *store_table_get_or_add(struct store_table *t, int ns, const void *key, size_t key_len);
/* Replaces the value (copying it); 0 or FSDP_ENOMEM. */
int store_table_set_value(struct store_table *t, struct store_entry *e, const void *value, size_t len);
/* Takes ownership of a malloc'd buffer as the new value. */
void store_table_adopt_value(struct store_table *t, struct store_entry *e, uint8_t *value, size_t len);
/* Drops the value (the queue stays). Call store_table_release_if_unused afterwards. */
void store_table_clear_value(struct store_table *t, struct store_entry *e);
/* Appends a copy to the key's queue; 0 or FSDP_ENOMEM. */
int store_table_queue_push(struct store_entry *e, const void *value, size_t len);
/* Removes the queue's first item and returns it (the caller frees it); NULL when empty. */
struct store_qitem *store_table_queue_pop(struct store_entry *e);
/* Frees e if it has no value, no queued item and no waiter. */
void store_table_release_if_unused(struct store_table *t, struct store_entry *e);
/* Does the key count as present for CHECK / WAIT: a value or a non-empty queue. */
bool store_table_entry_present(const struct store_entry *e);
/* Bytes an entry holds for the limits on PyTorch clients: key, value and queue, plus a fixed overhead;
 * 0 when it holds nothing. */
size_t store_table_entry_bytes(const struct store_entry *e);
/* Calls fn for every entry of namespace ns; fn may clear the entry's value and queue but must not free
 * it (entries left unused are freed after fn returns). */
void store_table_each(struct store_table *t, int ns, void (*fn)(struct store_entry *e, void *arg), void *arg);

#endif
