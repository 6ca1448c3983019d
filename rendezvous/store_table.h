/* The server's key table: a chained hash table (FNV-1a, doubled when the load passes 1) whose entries also
 * carry the list of requests waiting for that key, so a SET wakes exactly its waiters without a scan.
 * An entry exists while it has a value or a waiter; a waiter-only entry is a placeholder (no value). */
#ifndef FSDP_RENDEZVOUS_STORE_TABLE_H
#define FSDP_RENDEZVOUS_STORE_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct store_wait_link; /* owned by the server: one per (waiting request, missing key) */

struct store_entry {
    struct store_entry *next; /* bucket chain */
    uint64_t hash;
    uint8_t *key;
    size_t key_len;
    uint8_t *value; /* NULL when has_value is false */
    size_t value_len;
    bool has_value;
    struct store_wait_link *waiters; /* head of a doubly linked list */
};

struct store_table {
    struct store_entry **buckets;
    size_t nbuckets;
    size_t nentries; /* including placeholders */
    size_t nvalues;  /* entries with a value: what NUM_KEYS reports */
};

int store_table_init(struct store_table *t);
/* Frees every entry; the caller must have released all waiters first. */
void store_table_free(struct store_table *t);
struct store_entry *store_table_find(const struct store_table *t, const void *key, size_t key_len);
/* Finds or inserts a placeholder; NULL only when out of memory. */
struct store_entry *store_table_get_or_add(struct store_table *t, const void *key, size_t key_len);
/* Replaces the value (copying it); 0 or FSDP_ENOMEM. */
int store_table_set_value(struct store_table *t, struct store_entry *e, const void *value, size_t len);
/* Takes ownership of a malloc'd buffer as the new value. */
void store_table_adopt_value(struct store_table *t, struct store_entry *e, uint8_t *value, size_t len);
/* Drops the value; the entry goes away too unless requests still wait on it. */
void store_table_clear_value(struct store_table *t, struct store_entry *e);
/* Frees e if it has neither value nor waiters (call after removing its last waiter). */
void store_table_release_if_unused(struct store_table *t, struct store_entry *e);

#endif
