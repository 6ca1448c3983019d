/* The store server: one thread running its own event_base, so the launcher that hosts it keeps its main
 * loop. Every connection is a bufferevent; a request that must wait (GET, WAIT) parks a waiter on the
 * entries of its missing keys and stops reading that connection's frames until it is answered, which keeps
 * one reply per request in order without per-request ids. */
#include "rendezvous/store.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/store_protocol.h"
#include "rendezvous/store_table.h"

struct conn;

struct store_wait_link {
    struct store_wait_link *prev, *next; /* in entry->waiters */
    struct store_entry *entry;           /* NULL once the key arrived */
    struct waiter *waiter;
};

struct waiter {
    struct conn *conn;
    uint8_t op; /* GET or WAIT */
    size_t missing;
    size_t nlinks;
    struct event *timer;
    struct store_wait_link links[];
};

struct conn {
    struct store_server *srv;
    struct conn *prev, *next;
    struct bufferevent *bev;
    struct event *stall_timer; /* handshake deadline, then: deadline for finishing a started frame */
    struct waiter *waiter;
    bool greeted;
    bool closing; /* the last reply is being flushed, then the connection goes */
    char peer[INET6_ADDRSTRLEN + 8];
};

struct store_server {
    struct event_base *base;
    struct evconnlistener *listener;
    struct event *accept_resume; /* re-enables accepting after running out of descriptors */
    struct event *stop_ev; /* activated from another thread: a loopbreak sent before the loop runs is lost */
    pthread_t thread;
    bool thread_started;
    struct store_table table;
    struct conn *conns;
    char *run_id;
    char *secret;
    struct timeval idle_tv;
    int port;
    char addr[INET6_ADDRSTRLEN + 8];
    struct store_buf out; /* reply scratch: the loop is single-threaded */
};

static void conn_read_cb(struct bufferevent *bev, void *arg);

/* ---- replies ---- */

static void reply_send(struct conn *c)
{
    struct store_buf *b = &c->srv->out;
    if (store_buf_end(b) != 0) {
        log_warn("store: could not build a reply for %s: %s", c->peer, error_message());
        return;
    }
    bufferevent_write(c->bev, b->data, b->len);
}

static void reply_status(struct conn *c, uint8_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void reply_status(struct conn *c, uint8_t status, const char *fmt, ...)
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

static void reply_ok(struct conn *c)
{
    store_buf_begin(&c->srv->out, STORE_ST_OK);
    reply_send(c);
}

/* ---- connection lifetime ---- */

static void waiter_free(struct store_server *s, struct waiter *w)
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

static void conn_free(struct conn *c)
{
    struct store_server *s = c->srv;
    if (c->waiter)
        waiter_free(s, c->waiter);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->stall_timer)
        event_free(c->stall_timer);
    if (c->bev)
        bufferevent_free(c->bev);
    free(c);
}

static void conn_write_cb(struct bufferevent *bev, void *arg)
{
    (void)bev;
    struct conn *c = arg;
    if (c->closing)
        conn_free(c);
}

/* Lets the peer read why it is dropped before the socket goes. */
static void conn_close_after_flush(struct conn *c)
{
    c->closing = true;
    if (c->waiter)
        waiter_free(c->srv, c->waiter);
    bufferevent_disable(c->bev, EV_READ);
    event_del(c->stall_timer);
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        conn_free(c);
    /* else conn_write_cb frees it once the output is flushed; a peer that never reads gets the
     * stall timer instead */
    else
        event_add(c->stall_timer, &c->srv->idle_tv);
}

static void conn_event_cb(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    struct conn *c = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        if (c->waiter)
            log_debug("store: %s disconnected while waiting", c->peer);
        conn_free(c);
    }
}

static void conn_stall_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct conn *c = arg;
    if (!c->closing)
        log_warn("store: closing %s: %s within %.1f s", c->peer,
                 c->greeted ? "a started frame was not completed" : "no handshake",
                 (double)c->srv->idle_tv.tv_sec + c->srv->idle_tv.tv_usec / 1e6);
    conn_free(c);
}

/* ---- waking waiters ---- */

static void waiter_complete(struct waiter *w)
{
    struct conn *c = w->conn;
    struct store_server *s = c->srv;
    waiter_free(s, w);
    /* A frame the peer pipelined behind the wait is read on the next loop turn, never from inside the
     * SET that woke us, so table walks are not re-entered. */
    if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
        bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

static void reply_value(struct conn *c, const struct store_entry *e)
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
        struct waiter *w = l->waiter;
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
    struct waiter *w = arg;
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
static bool waiter_park(struct conn *c, uint8_t op, struct store_entry **missing, size_t n, uint32_t timeout_ms)
{
    struct store_server *s = c->srv;
    struct waiter *w = calloc(1, sizeof *w + n * sizeof w->links[0]);
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

static bool key_ok(struct conn *c, size_t key_len)
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

static bool value_ok(struct conn *c, size_t len)
{
    if (len > STORE_MAX_VALUE_BYTES) {
        reply_status(c, STORE_ST_TOO_LARGE, "value of %zu bytes exceeds STORE_MAX_VALUE_BYTES (%u)", len,
                     (unsigned)STORE_MAX_VALUE_BYTES);
        return false;
    }
    return true;
}

static void reply_oom(struct conn *c) { reply_status(c, STORE_ST_INVALID, "store server out of memory"); }

static void op_set(struct conn *c, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
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

static void op_get(struct conn *c, uint32_t timeout_ms, const uint8_t *key, size_t klen)
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

static void op_add(struct conn *c, const uint8_t *key, size_t klen, int64_t delta)
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

static void op_compare_set(struct conn *c, const uint8_t *key, size_t klen, bool expect_missing,
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
static bool op_check_wait(struct conn *c, uint8_t op, uint32_t timeout_ms, struct store_reader *r)
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

static void op_delete(struct conn *c, const uint8_t *key, size_t klen)
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

static void op_append(struct conn *c, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
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

static bool handle_hello(struct conn *c, struct store_reader *r)
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

/* Returns false when the connection must be closed (after flushing the reply already queued). */
static bool handle_frame(struct conn *c, const uint8_t *payload, size_t n)
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

static void conn_read_cb(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    while (!c->waiter && !c->closing) {
        size_t avail = evbuffer_get_length(in);
        if (avail < STORE_FRAME_HEADER_BYTES) {
            if (c->greeted && avail == 0)
                event_del(c->stall_timer);
            else if (c->greeted && !event_pending(c->stall_timer, EV_TIMEOUT, NULL))
                event_add(c->stall_timer, &c->srv->idle_tv);
            return;
        }
        uint8_t hdr[STORE_FRAME_HEADER_BYTES];
        evbuffer_copyout(in, hdr, sizeof hdr);
        uint32_t n = store_le32(hdr);
        if (n == 0 || n > STORE_MAX_FRAME_BYTES) {
            log_warn("store: closing %s: frame length %u outside 1..%u", c->peer, n,
                     (unsigned)STORE_MAX_FRAME_BYTES);
            conn_free(c);
            return;
        }
        if (avail < STORE_FRAME_HEADER_BYTES + (size_t)n) {
            /* Armed once per frame, not per byte, so trickling a frame cannot keep a connection forever. */
            if (c->greeted && !event_pending(c->stall_timer, EV_TIMEOUT, NULL))
                event_add(c->stall_timer, &c->srv->idle_tv);
            return;
        }
        if (c->greeted)
            event_del(c->stall_timer);
        uint8_t *frame = evbuffer_pullup(in, STORE_FRAME_HEADER_BYTES + (ssize_t)n);
        if (!frame) {
            conn_free(c);
            return;
        }
        bool keep = handle_frame(c, frame + STORE_FRAME_HEADER_BYTES, n);
        evbuffer_drain(in, STORE_FRAME_HEADER_BYTES + (size_t)n);
        if (!keep) {
            conn_close_after_flush(c);
            return;
        }
    }
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
    (void)l;
    (void)salen;
    struct store_server *s = arg;
    struct conn *c = calloc(1, sizeof *c);
    if (!c) {
        evutil_closesocket(fd);
        return;
    }
    c->srv = s;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
    }
    snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (!c->bev)
        evutil_closesocket(fd);
    c->stall_timer = evtimer_new(s->base, conn_stall_cb, c);
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    if (!c->bev || !c->stall_timer) {
        conn_free(c);
        return;
    }
    /* Bounds what one peer can make us buffer: one maximal frame. */
    bufferevent_setwatermark(c->bev, EV_READ, 0, STORE_FRAME_HEADER_BYTES + STORE_MAX_FRAME_BYTES);
    bufferevent_setcb(c->bev, conn_read_cb, conn_write_cb, conn_event_cb, c);
    if (bufferevent_enable(c->bev, EV_READ | EV_WRITE) != 0 || event_add(c->stall_timer, &s->idle_tv) != 0)
        conn_free(c);
}

static void accept_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    evconnlistener_enable(((struct store_server *)arg)->listener);
}

/* Out of descriptors, the pending connection stays in the backlog and the listener would fire again at
 * once: pause accepting briefly instead of spinning (the waiting client keeps its connect timeout). */
static void accept_error_cb(struct evconnlistener *l, void *arg)
{
    struct store_server *s = arg;
    int err = EVUTIL_SOCKET_ERROR();
    log_warn("store: accept failed: %s (raise the open-files limit for more clients)",
             evutil_socket_error_to_string(err));
    struct timeval pause = {.tv_sec = 0, .tv_usec = 100 * 1000};
    if (evconnlistener_disable(l) == 0 && event_add(s->accept_resume, &pause) != 0)
        evconnlistener_enable(l);
}

static void stop_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    event_base_loopbreak(((struct store_server *)arg)->base);
}

static void *server_thread(void *arg)
{
    struct store_server *s = arg;
    event_base_dispatch(s->base);
    return NULL;
}

/* Every client holds one socket here; the default soft limit (1024) is below the 1024 clients we promise. */
static void raise_nofile_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            log_debug("store: could not raise the open-files limit: %s", strerror(errno));
    }
}

static pthread_once_t g_threads_once = PTHREAD_ONCE_INIT;
static int g_threads_rc;
static void threads_init(void) { g_threads_rc = evthread_use_pthreads(); }

static int bind_listener(const char *bind_addr, int port, int *fd_out)
{
    const char *host = bind_addr && *bind_addr ? bind_addr : "0.0.0.0";
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, portstr, &hints, &res);
    if (gai != 0)
        return error_set(FSDP_EINVAL, "cannot bind the store to %s:%d: %s", host, port, gai_strerror(gai));
    int rc = FSDP_EIO;
    int err = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        /* Only to skip TIME_WAIT of a previous run; Linux still refuses a port someone listens on. */
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 4096) == 0) {
            *fd_out = fd;
            rc = 0;
            break;
        }
        err = errno;
        close(fd);
    }
    freeaddrinfo(res);
    if (rc == 0)
        return 0;
    if (err == EADDRINUSE)
        return error_set(FSDP_EEXIST,
                         "address %s:%d is already in use (another job or program listens there): pick "
                         "another --master_port or stop that program",
                         host, port);
    return error_set(FSDP_EIO, "cannot listen on %s:%d for the store: %s", host, port, strerror(err));
}

int store_server_start(const struct store_server_options *opts, struct store_server **out)
{
    *out = NULL;
    if (!opts || !opts->run_id)
        return error_set(FSDP_EINVAL, "store_server_start: options with a run id are required");
    if (opts->port < 0 || opts->port > 65535)
        return error_set(FSDP_EINVAL, "store port %d is outside 0..65535", opts->port);
    pthread_once(&g_threads_once, threads_init);
    if (g_threads_rc != 0)
        return error_set(FSDP_EIO, "libevent has no pthreads support");
    raise_nofile_limit();

    struct store_server *s = calloc(1, sizeof *s);
    if (!s)
        return error_set(FSDP_ENOMEM, "out of memory starting the store");
    store_buf_init(&s->out);
    double idle = opts->idle_timeout_s > 0 ? opts->idle_timeout_s : 10.0;
    s->idle_tv.tv_sec = (time_t)idle;
    s->idle_tv.tv_usec = (suseconds_t)((idle - (double)s->idle_tv.tv_sec) * 1e6);
    s->run_id = strdup(opts->run_id);
    s->secret = strdup(opts->secret ? opts->secret : "");
    int fd = -1;
    int rc = 0;
    if (!s->run_id || !s->secret || store_table_init(&s->table) != 0)
        rc = error_set(FSDP_ENOMEM, "out of memory starting the store");
    if (rc == 0)
        rc = bind_listener(opts->bind_addr, opts->port, &fd);
    if (rc == 0) {
        s->base = event_base_new();
        if (s->base) {
            s->stop_ev = event_new(s->base, -1, 0, stop_cb, s);
            s->accept_resume = evtimer_new(s->base, accept_resume_cb, s);
        }
        if (s->stop_ev && s->accept_resume)
            s->listener = evconnlistener_new(s->base, accept_cb, s,
                                             LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1, fd);
        if (!s->listener) {
            close(fd);
            rc = error_set(FSDP_EIO, "libevent could not set up the store listener");
        }
    }
    if (rc == 0) {
        evconnlistener_set_error_cb(s->listener, accept_error_cb);
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        getsockname(fd, (struct sockaddr *)&ss, &sl);
        s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                  : ((struct sockaddr_in *)&ss)->sin_port);
        snprintf(s->addr, sizeof s->addr, "%s:%d", opts->bind_addr && *opts->bind_addr ? opts->bind_addr : "0.0.0.0",
                 s->port);
        /* The hosting launcher handles signals on its main thread; the server thread must never take one
         * (and a write to a dead peer must give EPIPE, not kill the launcher with SIGPIPE). */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int prc = pthread_create(&s->thread, NULL, server_thread, s);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (prc != 0)
            rc = error_set(FSDP_EIO, "cannot start the store thread: %s", strerror(prc));
        else
            s->thread_started = true;
    }
    if (rc != 0) {
        store_server_stop(s);
        return rc;
    }
    log_info("store: listening on %s", s->addr);
    *out = s;
    return 0;
}

int store_server_port(const struct store_server *s) { return s ? s->port : -1; }

void store_server_stop(struct store_server *s)
{
    if (!s)
        return;
    if (s->thread_started) {
        event_active(s->stop_ev, EV_READ, 0);
        pthread_join(s->thread, NULL);
    }
    while (s->conns)
        conn_free(s->conns);
    if (s->listener)
        evconnlistener_free(s->listener);
    if (s->stop_ev)
        event_free(s->stop_ev);
    if (s->accept_resume)
        event_free(s->accept_resume);
    if (s->base)
        event_base_free(s->base);
    store_table_free(&s->table);
    store_buf_free(&s->out);
    free(s->run_id);
    free(s->secret);
    free(s);
}
