/* What the parts of the store server share about a connection: its state's limits, writing to it,
 * refusing it, and reading on after a wait. Calls nothing of the server's other files. */
#include <stdarg.h>
#include <stdio.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

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

void store_server_write(struct store_conn *c, const void *p, size_t n) { bufferevent_write(c->bev, p, n); }

bool store_server_refuse(struct store_conn *c, uint8_t status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
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

void store_server_resume(struct store_conn *c)
{
    /* On the next loop turn, never from inside the write that woke the wait, so table walks are not
     * re-entered. */
    if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
        bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}
