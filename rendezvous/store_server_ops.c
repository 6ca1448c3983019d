/* The server's request handling: handshake, every operation, and the waiters of GET/WAIT. A request that
 * must wait parks one link per missing key on that key's table entry; a write to the key walks exactly
 * those links. All of it runs on the server thread, so nothing here locks. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/store_server_internal.h"

/* ---- replies ---- */

static void reply_send(struct store_conn *c)
{
    struct store_buf *b = &c->srv->out;
    if (store_buf_end(b) != 0) {
        log_warn("store: could not build a reply for %s: %s", c->peer, error_message());
        return;
    }
    bufferevent_write(c->bev, b->data, b->len);
}

static void reply_status(struct store_conn *c, uint8_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void reply_status(struct store_conn *c, uint8_t status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    store_buf_begin(&c->srv->out, status);
    store_buf_put_str(&c->srv->out, msg);
    reply_send(c);
}

static void reply_ok(struct store_conn *c)
{
    store_buf_begin(&c->srv->out, STORE_ST_OK);
    reply_send(c);
}

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
    if (w->timer)
        event_free(w->timer);
    w->conn->waiter = NULL;
    free(w);
}

/* ---- waking waiters ---- */

static void waiter_complete(struct store_waiter *w)
{
    struct store_conn *c = w->conn;
    struct store_server *s = c->srv;
    store_server_free_waiter(s, w);
    /* A frame the peer pipelined behind the wait is read on the next loop turn, never from inside the
     * SET that woke us, so table walks are not re-entered. */
    if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
        bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

static void reply_value(struct store_conn *c, const struct store_entry *e)
{
    store_buf_begin(&c->srv->out, STORE_ST_OK);
    store_buf_put_bytes(&c->srv->out, e->value, e->value_len);
    reply_send(c);
}

/* Called after e got a value: every request waiting for it loses one missing key. */
static void entry_wake(struct store_server *s, struct store_entry *e)
{
    (void)s;
    while (e->waiters) {
        struct store_wait_link *l = e->waiters;
        e->waiters = l->next;
        if (l->next)
            l->next->prev = NULL;
        l->entry = NULL;
        l->prev = l->next = NULL;
        struct store_waiter *w = l->waiter;
        if (--w->missing == 0) {
            if (w->op == STORE_OP_GET)
                reply_value(w->conn, e);
            else
                reply_ok(w->conn);
            waiter_complete(w);
        }
    }
}

static void waiter_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct store_waiter *w = arg;
    struct store_buf *b = &w->conn->srv->out;
    store_buf_begin(b, STORE_ST_TIMEOUT);
    store_buf_put_u32(b, (uint32_t)w->missing);
    for (size_t i = 0; i < w->nlinks; i++)
        if (w->links[i].entry)
            store_buf_put_bytes(b, w->links[i].entry->key, w->links[i].entry->key_len);
    reply_send(w->conn);
    waiter_complete(w);
}

/* Parks the request on every missing key; returns false if it could not (out of memory). */
static bool waiter_park(struct store_conn *c, uint8_t op, struct store_entry **missing, size_t n, uint32_t timeout_ms)
{
    struct store_server *s = c->srv;
    struct store_waiter *w = calloc(1, sizeof *w + n * sizeof w->links[0]);
    if (!w)
        return false;
    w->conn = c;
    w->op = op;
    w->missing = n;
    w->nlinks = n;
    w->timer = evtimer_new(s->base, waiter_timeout_cb, w);
    if (!w->timer) {
        free(w);
        return false;
    }
    c->waiter = w;
    for (size_t i = 0; i < n; i++) {
        struct store_wait_link *l = &w->links[i];
        l->waiter = w;
        l->entry = missing[i];
        l->next = missing[i]->waiters;
        if (l->next)
            l->next->prev = l;
        missing[i]->waiters = l;
    }
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    event_add(w->timer, &tv);
    return true;
}

/* ---- request handlers: each returns false when the connection must be dropped ---- */

static bool key_ok(struct store_conn *c, size_t key_len)
{
    if (key_len == 0) {
        reply_status(c, STORE_ST_INVALID, "empty key");
        return false;
    }
    if (key_len > STORE_MAX_KEY_BYTES) {
        reply_status(c, STORE_ST_TOO_LARGE, "key of %zu bytes exceeds STORE_MAX_KEY_BYTES (%d)", key_len,
                     STORE_MAX_KEY_BYTES);
        return false;
    }
    return true;
}

static bool value_ok(struct store_conn *c, size_t len)
{
    if (len > STORE_MAX_VALUE_BYTES) {
        reply_status(c, STORE_ST_TOO_LARGE, "value of %zu bytes exceeds STORE_MAX_VALUE_BYTES (%u)", len,
                     (unsigned)STORE_MAX_VALUE_BYTES);
        return false;
    }
    return true;
}

static void reply_oom(struct store_conn *c) { reply_status(c, STORE_ST_INVALID, "store server out of memory"); }

static void op_set(struct store_conn *c, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
    struct store_server *s = c->srv;
    if (!key_ok(c, klen) || !value_ok(c, vlen))
        return;
    struct store_entry *e = store_table_get_or_add(&s->table, key, klen);
    if (!e || store_table_set_value(&s->table, e, val, vlen) != 0) {
        if (e)
            store_table_release_if_unused(&s->table, e);
        return reply_oom(c);
    }
    reply_ok(c);
    entry_wake(s, e);
}

static void op_get(struct store_conn *c, uint32_t timeout_ms, const uint8_t *key, size_t klen)
{
    struct store_server *s = c->srv;
    if (!key_ok(c, klen))
        return;
    struct store_entry *e = store_table_get_or_add(&s->table, key, klen);
    if (!e)
        return reply_oom(c);
    if (e->has_value)
        return reply_value(c, e);
    if (!waiter_park(c, STORE_OP_GET, &e, 1, timeout_ms)) {
        store_table_release_if_unused(&s->table, e);
        reply_oom(c);
    }
}

static bool parse_int64(const uint8_t *p, size_t n, int64_t *out)
{
    char buf[32];
    if (n == 0 || n >= sizeof buf)
        return false;
    memcpy(buf, p, n);
    buf[n] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

static void op_add(struct store_conn *c, const uint8_t *key, size_t klen, int64_t delta)
{
    struct store_server *s = c->srv;
    if (!key_ok(c, klen))
        return;
    struct store_entry *e = store_table_get_or_add(&s->table, key, klen);
    if (!e)
        return reply_oom(c);
    int64_t v = 0;
    if (e->has_value && !parse_int64(e->value, e->value_len, &v))
        return reply_status(c, STORE_ST_INVALID, "ADD on a value that is not a decimal integer (%zu bytes)",
                            e->value_len);
    if ((delta > 0 && v > INT64_MAX - delta) || (delta < 0 && v < INT64_MIN - delta)) {
        store_table_release_if_unused(&s->table, e);
        return reply_status(c, STORE_ST_TOO_LARGE, "ADD overflows int64 (%" PRId64 " + %" PRId64 ")", v, delta);
    }
    v += delta;
    char text[32];
    int n = snprintf(text, sizeof text, "%" PRId64, v);
    if (store_table_set_value(&s->table, e, text, (size_t)n) != 0) {
        store_table_release_if_unused(&s->table, e);
        return reply_oom(c);
    }
    store_buf_begin(&s->out, STORE_ST_OK);
    store_buf_put_u64(&s->out, (uint64_t)v);
    reply_send(c);
    entry_wake(s, e);
}

static void op_compare_set(struct store_conn *c, const uint8_t *key, size_t klen, bool expect_missing,
                           const uint8_t *exp, size_t elen, const uint8_t *des, size_t dlen)
{
    struct store_server *s = c->srv;
    if (!key_ok(c, klen) || !value_ok(c, dlen))
        return;
    struct store_entry *e = store_table_get_or_add(&s->table, key, klen);
    if (!e)
        return reply_oom(c);
    bool match = expect_missing ? !e->has_value
                                : (e->has_value && e->value_len == elen && memcmp(e->value, exp, elen) == 0);
    if (match && store_table_set_value(&s->table, e, des, dlen) != 0) {
        store_table_release_if_unused(&s->table, e);
        return reply_oom(c);
    }
    store_buf_begin(&s->out, STORE_ST_OK);
    store_buf_put_u8(&s->out, e->has_value);
    store_buf_put_bytes(&s->out, e->value, e->value_len);
    reply_send(c);
    if (match)
        entry_wake(s, e);
    else
        store_table_release_if_unused(&s->table, e);
}

/* CHECK and WAIT share the key-list layout: u32 n, then n keys. */
/* Returns false for a malformed request (the connection is then dropped). */
static bool op_check_wait(struct store_conn *c, uint8_t op, uint32_t timeout_ms, struct store_reader *r)
{
    struct store_server *s = c->srv;
    uint32_t n = store_reader_u32(r);
    if (n > STORE_MAX_WAIT_KEYS) {
        reply_status(c, STORE_ST_TOO_LARGE, "%u keys in one %s exceed the limit of %u", n, store_op_name(op),
                     STORE_MAX_WAIT_KEYS);
        return true;
    }
    struct store_entry **missing = malloc((n ? n : 1) * sizeof *missing);
    if (!missing) {
        reply_oom(c);
        return true;
    }
    size_t nmissing = 0;
    bool failed = false;
    for (uint32_t i = 0; i < n && !failed; i++) {
        size_t klen;
        const uint8_t *key = store_reader_bytes(r, &klen);
        if (r->bad)
            break;
        if (!key_ok(c, klen)) {
            failed = true;
            break;
        }
        struct store_entry *e = op == STORE_OP_WAIT ? store_table_get_or_add(&s->table, key, klen)
                                                    : store_table_find(&s->table, key, klen);
        if (op == STORE_OP_WAIT && !e) {
            reply_oom(c);
            failed = true;
            break;
        }
        if (e && e->has_value)
            continue;
        bool dup = false; /* the same key twice must not count twice */
        for (size_t j = 0; j < nmissing && e; j++)
            dup |= missing[j] == e;
        if (!dup)
            missing[nmissing++] = e;
    }
    if (r->bad || failed || !store_reader_done(r)) {
        for (size_t i = 0; op == STORE_OP_WAIT && i < nmissing; i++)
            store_table_release_if_unused(&s->table, missing[i]);
        free(missing);
        if (failed)
            return true;
        log_warn("store: closing %s: malformed %s frame", c->peer, store_op_name(op));
        reply_status(c, STORE_ST_PROTO, "malformed %s request", store_op_name(op));
        return false;
    }
    if (op == STORE_OP_CHECK) {
        store_buf_begin(&s->out, STORE_ST_OK);
        store_buf_put_u8(&s->out, nmissing == 0);
        reply_send(c);
    } else if (nmissing == 0) {
        reply_ok(c);
    } else if (!waiter_park(c, STORE_OP_WAIT, missing, nmissing, timeout_ms)) {
        for (size_t i = 0; i < nmissing; i++)
            store_table_release_if_unused(&s->table, missing[i]);
        reply_oom(c);
    }
    free(missing);
    return true;
}

static void op_delete(struct store_conn *c, const uint8_t *key, size_t klen)
{
    struct store_server *s = c->srv;
    if (!key_ok(c, klen))
        return;
    struct store_entry *e = store_table_find(&s->table, key, klen);
    bool existed = e && e->has_value;
    if (existed)
        store_table_clear_value(&s->table, e);
    store_buf_begin(&s->out, STORE_ST_OK);
    store_buf_put_u8(&s->out, existed);
    reply_send(c);
}

static void op_append(struct store_conn *c, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
    struct store_server *s = c->srv;
    if (!key_ok(c, klen))
        return;
    struct store_entry *e = store_table_get_or_add(&s->table, key, klen);
    if (!e)
        return reply_oom(c);
    size_t old = e->has_value ? e->value_len : 0;
    if (old + vlen > STORE_MAX_VALUE_BYTES) {
        store_table_release_if_unused(&s->table, e);
        return reply_status(c, STORE_ST_TOO_LARGE,
                            "APPEND would make a value of %zu bytes, over STORE_MAX_VALUE_BYTES (%u)", old + vlen,
                            (unsigned)STORE_MAX_VALUE_BYTES);
    }
    uint8_t *v = malloc(old + vlen ? old + vlen : 1);
    if (!v) {
        store_table_release_if_unused(&s->table, e);
        return reply_oom(c);
    }
    if (old)
        memcpy(v, e->value, old);
    if (vlen)
        memcpy(v + old, val, vlen);
    store_table_adopt_value(&s->table, e, v, old + vlen);
    reply_ok(c);
    entry_wake(s, e);
}

static bool handle_hello(struct store_conn *c, struct store_reader *r)
{
    struct store_server *s = c->srv;
    uint32_t magic = store_reader_u32(r);
    uint16_t version = store_reader_u16(r);
    if (r->bad || magic != STORE_MAGIC) {
        log_warn("store: closing %s: not an fsdpc store client (bad handshake)", c->peer);
        reply_status(c, STORE_ST_REFUSED, "not an fsdpc store handshake (bad magic)");
        return false;
    }
    if (version != STORE_PROTOCOL_VERSION) {
        log_warn("store: refusing %s: protocol version %u, this server speaks %d", c->peer, version,
                 STORE_PROTOCOL_VERSION);
        reply_status(c, STORE_ST_REFUSED,
                     "speaks store protocol version %d, the client speaks version %u: run the same fsdpc "
                     "version on every node",
                     STORE_PROTOCOL_VERSION, version);
        return false;
    }
    size_t idlen, seclen;
    const uint8_t *id = store_reader_bytes(r, &idlen);
    const uint8_t *sec = store_reader_bytes(r, &seclen);
    if (!store_reader_done(r)) {
        reply_status(c, STORE_ST_REFUSED, "malformed handshake");
        return false;
    }
    if (idlen != strlen(s->run_id) || memcmp(id, s->run_id, idlen) != 0) {
        log_warn("store: refusing %s: run id differs (another job?)", c->peer);
        reply_status(c, STORE_ST_REFUSED,
                     "belongs to another job (run id differs): check --rdzv_id / FSDP_RDZV_TOKEN");
        return false;
    }
    if (seclen != strlen(s->secret) || memcmp(sec, s->secret, seclen) != 0) {
        log_warn("store: refusing %s: job token differs", c->peer);
        reply_status(c, STORE_ST_REFUSED,
                     "belongs to another job (token differs): check --rdzv_id / FSDP_RDZV_TOKEN");
        return false;
    }
    c->greeted = true;
    event_del(c->stall_timer);
    store_buf_begin(&s->out, STORE_ST_OK);
    store_buf_put_u16(&s->out, STORE_PROTOCOL_VERSION);
    reply_send(c);
    return true;
}

bool store_server_handle_frame(struct store_conn *c, const uint8_t *payload, size_t n)
{
    struct store_reader rd, *r = &rd;
    store_reader_init(r, payload, n);
    uint8_t op = store_reader_u8(r);
    if (!c->greeted) {
        if (op == STORE_OP_HELLO)
            return handle_hello(c, r);
        log_warn("store: closing %s: first frame is op 0x%02x, not a handshake", c->peer, op);
        reply_status(c, STORE_ST_REFUSED, "the first frame must be the handshake");
        return false;
    }
    size_t klen = 0, vlen = 0, elen = 0;
    const uint8_t *key = NULL, *val = NULL, *exp = NULL;
    uint32_t timeout_ms = 0;
    int64_t delta = 0;
    uint8_t flag = 0;
    switch (op) {
    case STORE_OP_SET:
    case STORE_OP_APPEND:
        key = store_reader_bytes(r, &klen);
        val = store_reader_bytes(r, &vlen);
        break;
    case STORE_OP_GET:
        timeout_ms = store_reader_u32(r);
        key = store_reader_bytes(r, &klen);
        break;
    case STORE_OP_ADD:
        key = store_reader_bytes(r, &klen);
        delta = (int64_t)store_reader_u64(r);
        break;
    case STORE_OP_COMPARE_SET:
        key = store_reader_bytes(r, &klen);
        flag = store_reader_u8(r);
        exp = store_reader_bytes(r, &elen);
        val = store_reader_bytes(r, &vlen);
        break;
    case STORE_OP_CHECK:
        return op_check_wait(c, op, 0, r);
    case STORE_OP_WAIT:
        timeout_ms = store_reader_u32(r);
        return op_check_wait(c, op, timeout_ms, r);
    case STORE_OP_DELETE:
        key = store_reader_bytes(r, &klen);
        break;
    case STORE_OP_NUM_KEYS:
    case STORE_OP_PING:
        break;
    default:
        log_warn("store: closing %s: unknown op 0x%02x", c->peer, op);
        reply_status(c, STORE_ST_PROTO, "unknown op 0x%02x", op);
        return false;
    }
    if (!store_reader_done(r)) {
        log_warn("store: closing %s: malformed %s frame (%zu bytes)", c->peer, store_op_name(op), n);
        reply_status(c, STORE_ST_PROTO, "malformed %s request", store_op_name(op));
        return false;
    }
    switch (op) {
    case STORE_OP_SET: op_set(c, key, klen, val, vlen); break;
    case STORE_OP_APPEND: op_append(c, key, klen, val, vlen); break;
    case STORE_OP_GET: op_get(c, timeout_ms, key, klen); break;
    case STORE_OP_ADD: op_add(c, key, klen, delta); break;
    case STORE_OP_COMPARE_SET: op_compare_set(c, key, klen, flag != 0, exp, elen, val, vlen); break;
    case STORE_OP_DELETE: op_delete(c, key, klen); break;
    case STORE_OP_NUM_KEYS:
        store_buf_begin(&c->srv->out, STORE_ST_OK);
        store_buf_put_u64(&c->srv->out, (uint64_t)c->srv->table.nvalues);
        reply_send(c);
        break;
    case STORE_OP_PING: reply_ok(c); break;
    }
    return true;
}
