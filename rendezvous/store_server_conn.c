/* What the parts of the store server share about a connection: its state's limits, writing to it,
 * refusing it (its log line limited, for what a flood repeats), and reading on after a wait. Calls nothing
 * of the server's other files. */
#include <stdarg.h>
#include <stdio.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "common/clock.h"
#include "common/log.h"
#include "rendezvous/store_server_internal.h"

bool store_server_greeted(const struct store_conn *c)
{
    return c->state == CONN_TORCH || c->state == CONN_FSDP || (c->state == CONN_VALIDATED && !c->srv->torch_off);
}

const struct store_parse_limits *store_server_limits(const struct store_conn *c)
{
    switch (c->state) {
    case CONN_FSDP: return &store_limits_fsdp;
    case CONN_TORCH: return &store_limits_torch;
    case CONN_VALIDATED: return c->srv->torch_off ? &store_limits_handshake : &store_limits_torch;
    default: return &store_limits_handshake;
    }
}

/* libevent gives each piece added to a buffer that does not fit its last chain a chain of its own, rounded
 * up to a power of two with its header: a 1 MiB value would take 2 MiB, and the budget (which counts the
 * bytes queued) would see half the memory unsent replies hold. Pieces of a power of two less the header
 * room get chains of about their size. */
#define WRITE_PIECE_BYTES ((64u << 10) - 256u)

void store_server_write(struct store_conn *c, const void *p, size_t n)
{
    const uint8_t *at = p;
    while (n > 0) {
        size_t piece = n < WRITE_PIECE_BYTES ? n : WRITE_PIECE_BYTES;
        bufferevent_write(c->bev, at, piece);
        at += piece;
        n -= piece;
    }
}

void store_server_log_limited(struct store_log_limit *lim, const char *fmt, ...)
{
    double now = clock_now_s();
    if (lim->last_s != 0 && now - lim->last_s < 1.0) {
        lim->quiet++;
        return;
    }
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (lim->quiet)
        log_warn("%s (and %lu more such lines left out since the last one)", msg, lim->quiet);
    else
        log_warn("%s", msg);
    lim->last_s = now;
    lim->quiet = 0;
}

static bool refuse_v(struct store_conn *c, struct store_log_limit *lim, uint8_t status, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (lim)
        store_server_log_limited(lim, "store: closing %s: %s", c->peer, msg);
    else
        log_warn("store: closing %s: %s", c->peer, msg);
    if (c->fsdp_client) {
        struct store_buf *b = &c->srv->out;
        store_buf_reset(b);
        store_buf_put_u8(b, status);
        store_buf_put_str(b, msg);
        if (!b->failed)
            store_server_write(c, b->data, b->len);
    }
    return false;
}

bool store_server_refuse(struct store_conn *c, uint8_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    refuse_v(c, NULL, status, fmt, ap);
    va_end(ap);
    return false;
}

bool store_server_refuse_limited(struct store_conn *c, struct store_log_limit *lim, uint8_t status, const char *fmt,
                                 ...)
{
    va_list ap;
    va_start(ap, fmt);
    refuse_v(c, lim, status, fmt, ap);
    va_end(ap);
    return false;
}

void store_server_resume(struct store_conn *c)
{
    /* On the next loop turn, never from inside the write that woke the wait, so table walks are not
     * re-entered. */
    if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
        bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}
