/* c10d's ops on the key table, for PyTorch clients (c10d's replies; an error drops the connection, as
 * c10d's own server does) and for authenticated fsdpc clients (a status byte before each reply; most
 * errors are a status and the connection stays). A request that must wait (WAIT on missing keys, BARRIER
 * before the last arrival) parks one link per key on that key's entry; a write to the key walks exactly
 * those links. What a PyTorch client makes the server hold (its keys, its waits, its replies) is charged
 * to the budget of connections without the token (store_server_budget.c) and checked before it is made;
 * its keys also against a limit per connection. All of it runs on the server thread, so nothing here
 * locks. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/store_server_internal.h"

static bool is_fsdp(const struct store_conn *c) { return c->state == CONN_FSDP; }
static int conn_ns(const struct store_conn *c) { return is_fsdp(c) ? STORE_NS_FSDP : STORE_NS_TORCH; }

/* ---- replies ---- */

static struct store_buf *reply_begin(struct store_conn *c)
{
    struct store_buf *b = &c->srv->out;
    store_buf_reset(b);
    if (is_fsdp(c))
        store_buf_put_u8(b, STORE_ST_OK);
    return b;
}

/* An error: an fsdpc client gets it as a status and keeps its connection (PROTO aside); a PyTorch client
 * is dropped, as c10d's server drops a client whose request throws. */
static bool fail(struct store_conn *c, uint8_t status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static bool fail(struct store_conn *c, uint8_t status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!is_fsdp(c) || status == STORE_ST_PROTO)
        return store_server_refuse(c, status, "%s", msg);
    struct store_buf *b = &c->srv->out;
    store_buf_reset(b);
    store_buf_put_u8(b, status);
    store_buf_put_str(b, msg);
    if (!b->failed)
        store_server_write(c, b->data, b->len);
    return true;
}

static bool reply_send(struct store_conn *c)
{
    struct store_buf *b = &c->srv->out;
    if (b->failed)
        return fail(c, STORE_ST_INVALID, "store server out of memory building a reply");
    if (!store_budget_room(c, b->len, "a reply"))
        return false;
    if (b->len)
        store_server_write(c, b->data, b->len);
    return true;
}

/* A reply that carries stored values (GET, COMPARE_SET, QUEUE_POP, MULTI_GET, LIST_KEYS), `body` bytes
 * after the status byte: checked against the budget before anything is built, then written straight into
 * the connection's output, piece by piece (the scratch buffer would keep the largest reply's size). */
static bool big_begin(struct store_conn *c, uint64_t body, const char *what)
{
    if (!store_budget_room(c, (size_t)body + 1, what))
        return false;
    if (is_fsdp(c)) {
        uint8_t ok = STORE_ST_OK;
        store_server_write(c, &ok, 1);
    }
    return true;
}

static void big_put_u64(struct store_conn *c, uint64_t v)
{
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(v >> (8 * i));
    store_server_write(c, le, sizeof le);
}

static void big_put_bytes(struct store_conn *c, const void *p, size_t n)
{
    big_put_u64(c, n);
    if (n)
        store_server_write(c, p, n);
}

/* The reply of ops whose c10d reply is empty (SET, APPEND, MULTI_SET, QUEUE_PUSH). */
static bool reply_done(struct store_conn *c)
{
    reply_begin(c);
    return reply_send(c);
}

static bool reply_oom(struct store_conn *c) { return fail(c, STORE_ST_INVALID, "store server out of memory"); }

/* ---- what PyTorch clients' keys hold ---- */

/* Would entry e holding new_bytes keep PyTorch clients within their limits when c writes it (the budget
 * of connections without the token, and the keys charged to c)? When not, the connection (a PyTorch
 * client's) is refused: false. */
static bool torch_room(struct store_conn *c, const struct store_entry *e, size_t new_bytes)
{
    struct store_server *s = c->srv;
    if (e->ns != STORE_NS_TORCH || new_bytes <= e->charged)
        return true;
    size_t mine = e->owner == c ? e->charged : 0;
    if (c->held - mine + new_bytes > s->torch_conn_bytes_max)
        return fail(c, STORE_ST_TOO_LARGE, "keys written by this connection would hold %zu bytes, over the limit "
                    "of %zu per connection", c->held - mine + new_bytes, s->torch_conn_bytes_max);
    return store_budget_room(c, new_bytes - e->charged, "a key");
}

/* Charges e's bytes to its latest writer c (NULL: nobody), and to the budget. */
static void charge(struct store_server *s, struct store_conn *c, struct store_entry *e)
{
    if (e->ns != STORE_NS_TORCH)
        return;
    size_t now = store_table_entry_bytes(e);
    if (now > e->charged)
        store_budget_add(s, now - e->charged);
    else
        store_budget_sub(s, e->charged - now);
    if (e->owner)
        ((struct store_conn *)e->owner)->held -= e->charged;
    e->owner = now && c ? c : NULL;
    if (e->owner)
        c->held += now;
    e->charged = now;
}

static void forget_one(struct store_entry *e, void *arg)
{
    if (e->owner == arg) {
        ((struct store_conn *)arg)->held -= e->charged;
        e->owner = NULL;
    }
}

void store_server_forget_owner(struct store_server *s, struct store_conn *c)
{
    store_table_each(&s->table, STORE_NS_TORCH, forget_one, c);
}

/* Bytes e would hold with a value of value_len (queue unchanged). */
static size_t bytes_with_value(const struct store_entry *e, size_t value_len)
{
    return STORE_ENTRY_OVERHEAD + e->key_len + value_len + e->qbytes;
}

/* ---- waiters ---- */

void store_server_free_waiter(struct store_server *s, struct store_waiter *w)
{
    for (size_t i = 0; i < w->nlinks; i++) {
        struct store_wait_link *l = &w->links[i];
        struct store_entry *e = l->entry;
        if (!e)
            continue;
        if (l->prev)
            l->prev->next = l->next;
        else
            e->waiters = l->next;
        if (l->next)
            l->next->prev = l->prev;
        l->entry = NULL;
        store_table_release_if_unused(&s->table, e);
    }
    store_budget_sub(s, w->charged);
    w->conn->waiter = NULL;
    free(w);
}

static void waiter_complete(struct store_waiter *w)
{
    struct store_conn *c = w->conn;
    uint8_t r[2];
    size_t n = 0;
    if (is_fsdp(c))
        r[n++] = STORE_ST_OK;
    r[n++] = STORE_WAIT_STOP;
    store_server_write(c, r, n);
    store_server_free_waiter(c->srv, w);
    store_server_resume(c);
}

static struct store_waiter *unlink_first(struct store_entry *e)
{
    struct store_wait_link *l = e->waiters;
    e->waiters = l->next;
    if (l->next)
        l->next->prev = NULL;
    l->entry = NULL;
    l->prev = l->next = NULL;
    return l->waiter;
}

/* After a write to e: every request waiting on it loses one key; those left with none are answered. */
static void entry_wake(struct store_entry *e)
{
    while (e->waiters) {
        struct store_waiter *w = unlink_first(e);
        if (--w->missing == 0)
            waiter_complete(w);
    }
}

/* After a queue push: c10d wakes waiters until one of them is answered (it will pop the item). */
static void entry_wake_one(struct store_entry *e)
{
    while (e->waiters) {
        struct store_waiter *w = unlink_first(e);
        if (--w->missing == 0) {
            waiter_complete(w);
            return;
        }
    }
}

/* What a waiter on n keys costs, with keys_bytes the bytes of those keys: the waiter, and per key its link
 * and a placeholder entry (charged even where another waiter made it: that one may go first). */
static size_t waiter_cost(size_t n, size_t keys_bytes)
{
    return sizeof(struct store_waiter) + n * (sizeof(struct store_wait_link) + STORE_ENTRY_OVERHEAD) + keys_bytes;
}

/* Parks the request on the n entries, charging `cost` (checked by the caller) unless it is authenticated;
 * false when out of memory. */
static bool waiter_park(struct store_conn *c, uint8_t op, struct store_entry **entries, size_t n, size_t cost)
{
    struct store_waiter *w = calloc(1, sizeof *w + n * sizeof w->links[0]);
    if (!w)
        return false;
    if (store_budget_counts(c)) {
        w->charged = cost;
        store_budget_add(c->srv, cost);
    }
    w->conn = c;
    w->op = op;
    w->missing = n;
    w->nlinks = n;
    c->waiter = w;
    for (size_t i = 0; i < n; i++) {
        struct store_wait_link *l = &w->links[i];
        l->waiter = w;
        l->entry = entries[i];
        l->next = entries[i]->waiters;
        if (l->next)
            l->next->prev = l;
        entries[i]->waiters = l;
    }
    return true;
}

/* ---- the ops ---- */

static uint64_t max_value(const struct store_conn *c) { return store_server_limits(c)->max_value; }

static bool op_set(struct store_conn *c, const struct store_request *r)
{
    /* The reply goes first: waking waiters writes their replies through the same scratch buffer. */
    struct store_server *s = c->srv;
    struct store_entry *e = store_table_get_or_add(&s->table, conn_ns(c), r->key, r->key_len);
    if (!e)
        return reply_oom(c);
    if (!torch_room(c, e, bytes_with_value(e, r->value_len))) {
        store_table_release_if_unused(&s->table, e);
        return false;
    }
    if (store_table_set_value(&s->table, e, r->value, r->value_len) != 0) {
        store_table_release_if_unused(&s->table, e);
        return reply_oom(c);
    }
    charge(s, c, e);
    bool keep = reply_done(c);
    entry_wake(e);
    return keep;
}

static bool op_get(struct store_conn *c, const struct store_request *r)
{
    struct store_entry *e = store_table_find(&c->srv->table, conn_ns(c), r->key, r->key_len);
    if (is_fsdp(c) && !(e && e->has_value))
        return fail(c, STORE_ST_NOT_FOUND, "key missing");
    /* c10d answers a missing key with an empty value */
    size_t n = e && e->has_value ? e->value_len : 0;
    if (!big_begin(c, 8 + (uint64_t)n, "a GET reply"))
        return false;
    big_put_bytes(c, n ? e->value : NULL, n);
    return true;
}

static bool op_add(struct store_conn *c, const struct store_request *r)
{
    struct store_server *s = c->srv;
    struct store_entry *e = store_table_get_or_add(&s->table, conn_ns(c), r->key, r->key_len);
    if (!e)
        return reply_oom(c);
    int64_t v = 0, delta = r->number;
    if (e->has_value && !store_parse_i64(e->value, e->value_len, &v))
        return fail(c, STORE_ST_INVALID, "ADD on a value that is not a decimal integer (%zu bytes)", e->value_len);
    if ((delta > 0 && v > INT64_MAX - delta) || (delta < 0 && v < INT64_MIN - delta)) {
        store_table_release_if_unused(&s->table, e);
        return fail(c, STORE_ST_TOO_LARGE, "ADD overflows int64 (%" PRId64 " + %" PRId64 ")", v, delta);
    }
    v += delta;
    char text[32];
    int n = snprintf(text, sizeof text, "%" PRId64, v);
    if (!torch_room(c, e, bytes_with_value(e, (size_t)n))) {
        store_table_release_if_unused(&s->table, e);
        return false;
    }
    if (store_table_set_value(&s->table, e, text, (size_t)n) != 0) {
        store_table_release_if_unused(&s->table, e);
        return reply_oom(c);
    }
    charge(s, c, e);
    struct store_buf *b = reply_begin(c);
    store_buf_put_u64(b, (uint64_t)v);
    bool keep = reply_send(c);
    entry_wake(e);
    return keep;
}

/* c10d's compare-and-set: an empty expected value matches a missing key; the reply is the value after the
 * op (c10d answers a missing key with the expected value; fsdpc clients get NOT_FOUND instead). */
static bool op_compare_set(struct store_conn *c, const struct store_request *r)
{
    struct store_server *s = c->srv;
    struct store_entry *e = store_table_get_or_add(&s->table, conn_ns(c), r->key, r->key_len);
    if (!e)
        return reply_oom(c);
    bool match = e->has_value ? e->value_len == r->expected_len && memcmp(e->value, r->expected, r->expected_len) == 0
                              : r->expected_len == 0;
    if (match) {
        if (!torch_room(c, e, bytes_with_value(e, r->value_len))) {
            store_table_release_if_unused(&s->table, e);
            return false;
        }
        if (store_table_set_value(&s->table, e, r->value, r->value_len) != 0) {
            store_table_release_if_unused(&s->table, e);
            return reply_oom(c);
        }
        charge(s, c, e);
    }
    if (!e->has_value) {
        store_table_release_if_unused(&s->table, e);
        if (is_fsdp(c))
            return fail(c, STORE_ST_NOT_FOUND, "key missing");
        if (!big_begin(c, 8 + r->expected_len, "a COMPARE_SET reply"))
            return false;
        big_put_bytes(c, r->expected, r->expected_len);
        return true;
    }
    bool keep = big_begin(c, 8 + (uint64_t)e->value_len, "a COMPARE_SET reply");
    if (keep)
        big_put_bytes(c, e->value, e->value_len);
    if (match)
        entry_wake(e);
    return keep;
}

static bool op_check(struct store_conn *c, const struct store_request *r)
{
    bool all = true;
    struct store_item_iter it = {0};
    const uint8_t *k;
    uint64_t kl;
    while (all && store_request_item(r, &it, &k, &kl, NULL, NULL))
        all = store_table_entry_present(store_table_find(&c->srv->table, conn_ns(c), k, kl));
    struct store_buf *b = reply_begin(c);
    store_buf_put_u8(b, all ? STORE_CHECK_READY : STORE_CHECK_NOT_READY);
    return reply_send(c);
}

static bool op_wait(struct store_conn *c, const struct store_request *r)
{
    struct store_server *s = c->srv;
    struct store_entry **missing = malloc((r->count ? r->count : 1) * sizeof *missing);
    if (!missing)
        return reply_oom(c);
    size_t n = 0, keys_bytes = 0;
    bool oom = false;
    struct store_item_iter it = {0};
    const uint8_t *k;
    uint64_t kl;
    /* What it would hold, checked before any placeholder is made. */
    if (store_budget_counts(c)) {
        while (store_request_item(r, &it, &k, &kl, NULL, NULL))
            if (!store_table_entry_present(store_table_find(&s->table, conn_ns(c), k, kl))) {
                n++;
                keys_bytes += kl;
            }
        if (n > 0 && !store_budget_room(c, waiter_cost(n, keys_bytes), "a WAIT")) {
            free(missing);
            return false;
        }
        n = keys_bytes = 0;
        it = (struct store_item_iter){0};
    }
    /* A key listed twice is parked twice and woken twice: the count stays right without a search. */
    while (!oom && store_request_item(r, &it, &k, &kl, NULL, NULL)) {
        struct store_entry *e = store_table_get_or_add(&s->table, conn_ns(c), k, kl);
        if (!e)
            oom = true;
        else if (!store_table_entry_present(e)) {
            missing[n++] = e;
            keys_bytes += kl;
        }
    }
    bool keep = true;
    if (oom || (n > 0 && !waiter_park(c, STORE_OP_WAIT, missing, n, waiter_cost(n, keys_bytes)))) {
        for (size_t i = 0; i < n; i++)
            store_table_release_if_unused(&s->table, missing[i]);
        keep = reply_oom(c);
    } else if (n == 0) {
        struct store_buf *b = reply_begin(c);
        store_buf_put_u8(b, STORE_WAIT_STOP);
        keep = reply_send(c);
    }
    free(missing);
    return keep;
}

static bool op_delete(struct store_conn *c, const struct store_request *r)
{
    struct store_server *s = c->srv;
    struct store_entry *e = store_table_find(&s->table, conn_ns(c), r->key, r->key_len);
    bool existed = e && e->has_value;
    if (existed) {
        store_table_clear_value(&s->table, e);
        charge(s, e->owner, e);
        store_table_release_if_unused(&s->table, e);
    }
    struct store_buf *b = reply_begin(c);
    store_buf_put_u64(b, existed ? 1 : 0);
    return reply_send(c);
}

static bool op_append(struct store_conn *c, const struct store_request *r)
{
    struct store_server *s = c->srv;
    struct store_entry *e = store_table_get_or_add(&s->table, conn_ns(c), r->key, r->key_len);
    if (!e)
        return reply_oom(c);
    size_t old = e->has_value ? e->value_len : 0;
    if (old + r->value_len > max_value(c)) {
        store_table_release_if_unused(&s->table, e);
        return fail(c, STORE_ST_TOO_LARGE, "APPEND would make a value of %zu bytes, over %s (%llu)",
                    old + (size_t)r->value_len, is_fsdp(c) ? "STORE_MAX_VALUE_BYTES" : "PyTorch's TCPStore value limit",
                    (unsigned long long)max_value(c));
    }
    if (!torch_room(c, e, bytes_with_value(e, old + r->value_len))) {
        store_table_release_if_unused(&s->table, e);
        return false;
    }
    uint8_t *v = malloc(old + r->value_len ? old + r->value_len : 1);
    if (!v) {
        store_table_release_if_unused(&s->table, e);
        return reply_oom(c);
    }
    if (old)
        memcpy(v, e->value, old);
    if (r->value_len)
        memcpy(v + old, r->value, r->value_len);
    store_table_adopt_value(&s->table, e, v, old + r->value_len);
    charge(s, c, e);
    bool keep = reply_done(c);
    entry_wake(e);
    return keep;
}

static bool op_multi_get(struct store_conn *c, const struct store_request *r)
{
    struct store_server *s = c->srv;
    uint64_t total = 0;
    struct store_item_iter it = {0};
    const uint8_t *k;
    uint64_t kl;
    while (store_request_item(r, &it, &k, &kl, NULL, NULL)) {
        struct store_entry *e = store_table_find(&s->table, conn_ns(c), k, kl);
        if (is_fsdp(c) && !(e && e->has_value))
            return fail(c, STORE_ST_NOT_FOUND, "key '%.*s' missing", kl > 64 ? 64 : (int)kl, (const char *)k);
        total += 8 + (e && e->has_value ? e->value_len : 0);
    }
    if (total > STORE_MAX_REPLY_BYTES)
        return fail(c, STORE_ST_TOO_LARGE, "MULTI_GET reply of %llu bytes exceeds the limit of %u",
                    (unsigned long long)total, STORE_MAX_REPLY_BYTES);
    if (!big_begin(c, total, "a MULTI_GET reply"))
        return false;
    it = (struct store_item_iter){0};
    while (store_request_item(r, &it, &k, &kl, NULL, NULL)) {
        struct store_entry *e = store_table_find(&s->table, conn_ns(c), k, kl);
        if (e && e->has_value)
            big_put_bytes(c, e->value, e->value_len);
        else
            big_put_u64(c, 0);
    }
    return true;
}

static bool op_multi_set(struct store_conn *c, const struct store_request *r)
{
    struct store_item_iter it = {0};
    const uint8_t *k, *v;
    uint64_t kl, vl;
    while (store_request_item(r, &it, &k, &kl, &v, &vl)) {
        /* Each pair is a SET; a refused one leaves the earlier ones set (as a PyTorch client sees it). */
        struct store_server *s = c->srv;
        struct store_entry *e = store_table_get_or_add(&s->table, conn_ns(c), k, kl);
        if (!e)
            return reply_oom(c);
        if (!torch_room(c, e, bytes_with_value(e, vl))) {
            store_table_release_if_unused(&s->table, e);
            return false;
        }
        if (store_table_set_value(&s->table, e, v, vl) != 0) {
            store_table_release_if_unused(&s->table, e);
            return reply_oom(c);
        }
        charge(s, c, e);
        entry_wake(e);
    }
    return reply_done(c);
}

static bool op_cancel_wait(struct store_conn *c)
{
    if (c->waiter)
        store_server_free_waiter(c->srv, c->waiter);
    struct store_buf *b = reply_begin(c);
    store_buf_put_u8(b, STORE_WAIT_CANCELED);
    return reply_send(c);
}

static bool op_queue_push(struct store_conn *c, const struct store_request *r)
{
    struct store_server *s = c->srv;
    struct store_entry *e = store_table_get_or_add(&s->table, conn_ns(c), r->key, r->key_len);
    if (!e)
        return reply_oom(c);
    size_t now = store_table_entry_bytes(e);
    size_t after = (now ? now : STORE_ENTRY_OVERHEAD + e->key_len) + r->value_len + STORE_QITEM_OVERHEAD;
    if (!torch_room(c, e, after)) {
        store_table_release_if_unused(&s->table, e);
        return false;
    }
    if (store_table_queue_push(e, r->value, r->value_len) != 0) {
        store_table_release_if_unused(&s->table, e);
        return reply_oom(c);
    }
    charge(s, c, e);
    bool keep = reply_done(c);
    entry_wake_one(e);
    return keep;
}

static bool op_queue_pop(struct store_conn *c, const struct store_request *r)
{
    struct store_server *s = c->srv;
    struct store_entry *e = store_table_find(&s->table, conn_ns(c), r->key, r->key_len);
    uint64_t qlen = e ? (uint64_t)e->qlen : 0;
    if (!big_begin(c, 8 + (qlen ? 8 + e->qhead->len : 0), "a QUEUE_POP reply"))
        return false;
    big_put_u64(c, qlen);
    struct store_qitem *q = e ? store_table_queue_pop(e) : NULL;
    if (q) {
        big_put_bytes(c, q->data, q->len);
        free(q);
        charge(s, e->owner, e);
        store_table_release_if_unused(&s->table, e);
    }
    return true;
}

static bool op_queue_len(struct store_conn *c, const struct store_request *r)
{
    struct store_entry *e = store_table_find(&c->srv->table, conn_ns(c), r->key, r->key_len);
    struct store_buf *b = reply_begin(c);
    store_buf_put_u64(b, e ? (uint64_t)e->qlen : 0);
    return reply_send(c);
}

struct list_walk {
    struct store_conn *c;
    uint64_t n, bytes;
};

static void list_count(struct store_entry *e, void *arg)
{
    struct list_walk *w = arg;
    if (e->has_value) {
        w->n++;
        w->bytes += 8 + e->key_len;
    }
}

static void list_put(struct store_entry *e, void *arg)
{
    struct list_walk *w = arg;
    if (e->has_value)
        big_put_bytes(w->c, e->key, e->key_len);
}

static bool op_list_keys(struct store_conn *c)
{
    struct store_server *s = c->srv;
    struct list_walk w = {0};
    store_table_each(&s->table, conn_ns(c), list_count, &w);
    if (w.bytes > STORE_MAX_REPLY_BYTES)
        return fail(c, STORE_ST_TOO_LARGE, "LIST_KEYS reply of %llu bytes exceeds the limit of %u",
                    (unsigned long long)w.bytes, STORE_MAX_REPLY_BYTES);
    if (!big_begin(c, 8 + w.bytes, "a LIST_KEYS reply"))
        return false;
    w.c = c;
    big_put_u64(c, w.n);
    store_table_each(&s->table, conn_ns(c), list_put, &w);
    return true;
}

/* c10d's BARRIER: the counter at key goes up by one; the arrival that takes it to world_size releases
 * everyone parked on the key (and any later write to the key would too, as in c10d). */
static bool op_barrier(struct store_conn *c, const struct store_request *r)
{
    struct store_server *s = c->srv;
    struct store_entry *e = store_table_get_or_add(&s->table, conn_ns(c), r->key, r->key_len);
    if (!e)
        return reply_oom(c);
    int64_t v = 0;
    if (e->has_value && !store_parse_i64(e->value, e->value_len, &v))
        return fail(c, STORE_ST_INVALID, "BARRIER on a value that is not a decimal integer (%zu bytes)",
                    e->value_len);
    if (v == INT64_MAX)
        return fail(c, STORE_ST_TOO_LARGE, "BARRIER counter overflows int64");
    v++;
    char text[32];
    int n = snprintf(text, sizeof text, "%" PRId64, v);
    if (!torch_room(c, e, bytes_with_value(e, (size_t)n))) {
        store_table_release_if_unused(&s->table, e);
        return false;
    }
    if (store_table_set_value(&s->table, e, text, (size_t)n) != 0) {
        store_table_release_if_unused(&s->table, e);
        return reply_oom(c);
    }
    charge(s, c, e);
    if (v < r->number) {
        struct store_entry *one[1] = {e};
        size_t cost = waiter_cost(1, 0); /* its entry holds a value, charged as a key */
        if (!store_budget_room(c, cost, "a BARRIER"))
            return false;
        return waiter_park(c, STORE_OP_BARRIER, one, 1, cost) ? true : reply_oom(c);
    }
    entry_wake(e);
    struct store_buf *b = reply_begin(c);
    store_buf_put_u8(b, STORE_WAIT_STOP);
    return reply_send(c);
}

struct reset_walk {
    struct store_server *s;
    int64_t removed;
};

static void reset_one(struct store_entry *e, void *arg)
{
    struct reset_walk *w = arg;
    if (!store_table_entry_present(e))
        return;
    w->removed++;
    store_table_clear_value(&w->s->table, e);
    for (struct store_qitem *q; (q = store_table_queue_pop(e));)
        free(q);
    charge(w->s, NULL, e);
}

static bool op_reset_torch(struct store_conn *c)
{
    struct reset_walk w = {.s = c->srv};
    store_table_each(&c->srv->table, STORE_NS_TORCH, reset_one, &w);
    log_debug("store: %s emptied PyTorch clients' key space (%" PRId64 " keys)", c->peer, w.removed);
    struct store_buf *b = reply_begin(c);
    store_buf_put_u64(b, (uint64_t)w.removed);
    return reply_send(c);
}

bool store_server_op(struct store_conn *c, const struct store_request *r)
{
    switch (r->op) {
    case STORE_OP_SET: return op_set(c, r);
    case STORE_OP_COMPARE_SET: return op_compare_set(c, r);
    case STORE_OP_GET: return op_get(c, r);
    case STORE_OP_ADD: return op_add(c, r);
    case STORE_OP_CHECK: return op_check(c, r);
    case STORE_OP_WAIT: return op_wait(c, r);
    case STORE_OP_GETNUMKEYS: {
        struct store_buf *b = reply_begin(c);
        store_buf_put_u64(b, (uint64_t)c->srv->table.nvalues[conn_ns(c)]);
        return reply_send(c);
    }
    case STORE_OP_DELETE_KEY: return op_delete(c, r);
    case STORE_OP_APPEND: return op_append(c, r);
    case STORE_OP_MULTI_GET: return op_multi_get(c, r);
    case STORE_OP_MULTI_SET: return op_multi_set(c, r);
    case STORE_OP_CANCEL_WAIT: return op_cancel_wait(c);
    case STORE_OP_PING: {
        struct store_buf *b = reply_begin(c);
        store_buf_put_u32(b, r->u32);
        return reply_send(c);
    }
    case STORE_OP_QUEUE_PUSH: return op_queue_push(c, r);
    case STORE_OP_QUEUE_POP: return op_queue_pop(c, r);
    case STORE_OP_QUEUE_LEN: return op_queue_len(c, r);
    case STORE_OP_LIST_KEYS: return op_list_keys(c);
    case STORE_OP_BARRIER: return op_barrier(c, r);
    case STORE_OP_RESET_TORCH:
        if (is_fsdp(c))
            return op_reset_torch(c);
        return fail(c, STORE_ST_PROTO, "op RESET_TORCH is for authenticated fsdpc clients only");
    default:
        return fail(c, STORE_ST_PROTO, "op %s out of place", store_op_name(r->op));
    }
}
