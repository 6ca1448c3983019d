/* The start of every connection: c10d's VALIDATE, then either PyTorch's first op (a torch client, when the
 * torch protocol is on) or fsdpc's handshake: HELLO (run id, client nonce) answered with the server's
 * nonce, then AUTH, a MAC over both nonces under the job's key, answered with the server's own MAC. The
 * MAC is checked when the throttle lets it (store_server_throttle.c): at once unless AUTHs are being
 * guessed, and then in turn; the verdict is sent as soon as it is checked. */
#include <string.h>

#include <event2/bufferevent.h>
#include <event2/event.h>

#include "common/log.h"
#include "rendezvous/store_server_internal.h"

static bool reply_status(struct store_conn *c, struct store_buf *b)
{
    if (b->failed)
        return store_server_refuse(c, STORE_ST_INVALID, "store server out of memory");
    if (!store_budget_room(c, b->len, "a handshake reply"))
        return false;
    store_server_write(c, b->data, b->len);
    return true;
}

/* The message names what to check on the client's side; a guesser repeats it, so the line is limited. */
static bool refuse_token(struct store_conn *c)
{
    return store_server_refuse_limited(c, &c->srv->auth_log, STORE_ST_REFUSED,
                                       "belongs to another job (token differs): check --rdzv_id / FSDP_RDZV_TOKEN");
}

static bool hello(struct store_conn *c, const struct store_request *req)
{
    struct store_server *s = c->srv;
    c->fsdp_client = true;
    if (req->u32 != STORE_HELLO_MAGIC)
        return store_server_refuse(c, STORE_ST_REFUSED, "not an fsdpc store handshake (bad magic)");
    if (req->version != STORE_PROTOCOL_VERSION)
        return store_server_refuse(c, STORE_ST_REFUSED,
                                   "speaks store protocol version %d, the client speaks version %u: run the same "
                                   "fsdpc version on every node",
                                   STORE_PROTOCOL_VERSION, req->version);
    if (req->key_len != strlen(s->run_id) || memcmp(req->key, s->run_id, req->key_len) != 0)
        return store_server_refuse(c, STORE_ST_REFUSED,
                                   "belongs to another job (run id differs): check --rdzv_id / FSDP_RDZV_TOKEN");
    if (req->value_len < 16)
        return store_server_refuse(c, STORE_ST_PROTO, "HELLO with a nonce of %llu bytes (16 at least)",
                                   (unsigned long long)req->value_len);
    memcpy(c->client_nonce, req->value, req->value_len);
    c->client_nonce_len = req->value_len;
    if (store_auth_random(c->server_nonce, sizeof c->server_nonce) != 0)
        return store_server_refuse(c, STORE_ST_INVALID, "store server has no random bytes for the handshake");
    c->state = CONN_HELLO;
    event_add(c->stall_timer, &s->idle_tv); /* a fresh deadline for AUTH */
    struct store_buf *b = &s->out;
    store_buf_reset(b);
    store_buf_put_u8(b, STORE_ST_OK);
    store_buf_put_u16(b, STORE_PROTOCOL_VERSION);
    store_buf_put_bytes(b, c->server_nonce, sizeof c->server_nonce);
    return reply_status(c, b);
}

bool store_server_auth_check(struct store_conn *c)
{
    struct store_server *s = c->srv;
    uint8_t want[STORE_MAC_BYTES];
    store_auth_mac(s->key, 'c', s->run_id, strlen(s->run_id), c->client_nonce, c->client_nonce_len, c->server_nonce,
                   sizeof c->server_nonce, want);
    bool ok = c->auth_mac_ok && store_auth_equal(c->auth_mac, want, STORE_MAC_BYTES);
    store_throttle_auth_done(c, !ok);
    if (!ok) {
        __atomic_add_fetch(&s->auth_failures, 1, __ATOMIC_RELAXED);
        return refuse_token(c);
    }
    uint8_t mine[STORE_MAC_BYTES];
    store_auth_mac(s->key, 's', s->run_id, strlen(s->run_id), c->client_nonce, c->client_nonce_len, c->server_nonce,
                   sizeof c->server_nonce, mine);
    c->state = CONN_FSDP;
    store_budget_unwatch_output(c); /* the job's own: never charged, and may read its replies slowly */
    bufferevent_set_timeouts(c->bev, NULL, NULL);
    event_del(c->stall_timer);
    log_debug("store: %s authenticated", c->peer);
    struct store_buf *b = &s->out;
    store_buf_reset(b);
    store_buf_put_u8(b, STORE_ST_OK);
    store_buf_put_bytes(b, mine, sizeof mine);
    return reply_status(c, b);
}

static bool auth(struct store_conn *c, const struct store_request *req)
{
    struct store_server *s = c->srv;
    c->auth_mac_ok = req->value_len == STORE_MAC_BYTES;
    memset(c->auth_mac, 0, sizeof c->auth_mac);
    if (c->auth_mac_ok)
        memcpy(c->auth_mac, req->value, STORE_MAC_BYTES);
    if (store_throttle_auth_admit(c))
        return store_server_auth_check(c);
    /* Its turn comes on s->auth_ev (store_server.c); the handshake deadline started by HELLO still runs.
     * Meanwhile its requests are not run, but the socket is still read (up to the read window), so a peer
     * that goes away leaves the queue at once instead of holding its place. */
    __atomic_add_fetch(&s->auth_delayed, 1, __ATOMIC_RELAXED);
    return true;
}

bool store_server_handshake(struct store_conn *c, const struct store_request *req, bool *handled)
{
    struct store_server *s = c->srv;
    *handled = true;
    switch (c->state) {
    case CONN_NEW:
        if (req->op != STORE_OP_VALIDATE)
            return store_server_refuse(c, STORE_ST_PROTO, "not a TCPStore client: its first request is op 0x%02x, "
                                       "not VALIDATE", req->op);
        if (req->u32 != STORE_VALIDATE_MAGIC)
            return store_server_refuse(c, STORE_ST_PROTO, "VALIDATE with magic 0x%08x, not c10d's", req->u32);
        c->state = CONN_VALIDATED;
        if (store_server_greeted(c))
            event_del(c->stall_timer);
        return true;
    case CONN_VALIDATED:
        if (req->op == STORE_OP_PING) {
            uint8_t echo[4] = {(uint8_t)req->u32, (uint8_t)(req->u32 >> 8), (uint8_t)(req->u32 >> 16),
                               (uint8_t)(req->u32 >> 24)};
            if (!store_budget_room(c, sizeof echo, "a PING reply"))
                return false;
            store_server_write(c, echo, sizeof echo);
            return true;
        }
        if (req->op == STORE_OP_HELLO)
            return hello(c, req);
        if (s->torch_off)
            return store_server_refuse(c, STORE_ST_PROTO, "a PyTorch TCPStore client (op %s), and this store refuses "
                                       "them (--no_torch_store)", store_op_name(req->op));
        c->state = CONN_TORCH;
        *handled = false;
        return true;
    case CONN_HELLO:
        if (req->op != STORE_OP_AUTH)
            return store_server_refuse(c, STORE_ST_PROTO, "op %s during the handshake (AUTH expected)",
                                       store_op_name(req->op));
        return auth(c, req);
    default:
        return store_server_refuse(c, STORE_ST_PROTO, "handshake request in state %d", (int)c->state);
    }
}
