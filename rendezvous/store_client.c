/* The blocking store client: one TCP connection speaking c10d TCPStore's protocol, one request in flight,
 * every socket wait bounded by poll. Against fsdpc's server it first proves it holds the job's key (HELLO,
 * AUTH) and then gets a status byte before every reply; `plain` speaks c10d as PyTorch's own client does,
 * for PyTorch's TCPStore servers. Waits are timed here, as PyTorch's client times them: on timeout the
 * client sends CANCEL_WAIT and the connection stays usable. */
#include "rendezvous/store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "rendezvous/store_auth.h"
#include "rendezvous/store_protocol.h"

/* How long the answer to CANCEL_WAIT may take, and the slack a server gets for anything else. */
#define CANCEL_REPLY_S 10.0
/* Missing keys a wait timeout checks one by one to name them. */
#define NAME_MISSING_MAX 4096u

struct store_client {
    int fd;
    bool broken; /* the stream is out of step (half a reply read): every later call fails */
    bool plain;
    double default_timeout_s;
    char addr[300]; /* "host:port" for messages */
    char *host, *run_id, *secret; /* what store_client_clone reconnects with */
    int port;
    struct store_buf out;
    size_t rpos, rlen;
    uint8_t rbuf[16384];
};

static int poll_ms(double deadline)
{
    double left = deadline - clock_now_s();
    if (left <= 0)
        return 0;
    return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

/* Keys are shown in messages; an 8 KiB key would drown them. */
static const char *key_shown(const char *key, char buf[80])
{
    size_t n = strlen(key);
    if (n < 72)
        return key;
    snprintf(buf, 80, "%.64s...", key);
    return buf;
}

static int fail_closed(struct store_client *c, const char *what)
{
    c->broken = true;
    return error_set(FSDP_ECLOSED,
                     "store at %s closed the connection while %s: the store server (launcher of node 0) "
                     "stopped or died",
                     c->addr, what);
}

static int send_all(struct store_client *c, const uint8_t *p, size_t n, double deadline, const char *what)
{
    while (n > 0) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
            int pr = poll(&pfd, 1, poll_ms(deadline));
            if (pr == 0) {
                c->broken = true;
                return error_set(FSDP_ETIMEDOUT, "store at %s did not accept our request while %s", c->addr,
                                 what);
            }
            continue;
        }
        if (errno == EPIPE || errno == ECONNRESET)
            return fail_closed(c, what);
        c->broken = true;
        return error_set(FSDP_EIO, "sending to store at %s failed while %s: %s", c->addr, what, strerror(errno));
    }
    return 0;
}

/* Sends the request built in c->out. */
static int client_send(struct store_client *c, double deadline, const char *what)
{
    if (c->broken)
        return error_set(FSDP_ECLOSED, "the connection to store at %s is unusable after an earlier error", c->addr);
    if (c->out.failed)
        return error_set(FSDP_ENOMEM, "out of memory building a store request while %s", what);
    return send_all(c, c->out.data, c->out.len, deadline, what);
}

/* Waits until a reply byte is buffered or readable: 1, or 0 at the deadline (nothing marked broken). */
static int readable(struct store_client *c, double deadline)
{
    if (c->rpos < c->rlen)
        return 1;
    for (;;) {
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        int pr = poll(&pfd, 1, poll_ms(deadline));
        if (pr > 0)
            return 1;
        if (pr == 0)
            return 0;
        if (errno != EINTR)
            return 1; /* let the read report it */
    }
}

/* Reads exactly n bytes of reply. */
static int recv_exact(struct store_client *c, void *dst, size_t n, double deadline, double waited_s,
                      const char *what)
{
    uint8_t *p = dst;
    size_t have = c->rlen - c->rpos;
    size_t take = have < n ? have : n;
    memcpy(p, c->rbuf + c->rpos, take);
    c->rpos += take;
    p += take;
    n -= take;
    while (n > 0) {
        /* Small reads go through the buffer (a reply usually arrives in one piece), large ones straight in. */
        bool buffered = n < sizeof c->rbuf;
        ssize_t r = buffered ? recv(c->fd, c->rbuf, sizeof c->rbuf, 0) : recv(c->fd, p, n, 0);
        if (r > 0) {
            if (buffered) {
                c->rpos = 0;
                c->rlen = (size_t)r;
                take = (size_t)r < n ? (size_t)r : n;
                memcpy(p, c->rbuf, take);
                c->rpos = take;
            } else {
                take = (size_t)r;
            }
            p += take;
            n -= take;
            continue;
        }
        if (r == 0)
            return fail_closed(c, what);
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (!readable(c, deadline)) {
                c->broken = true;
                return error_set(FSDP_ETIMEDOUT, "no reply from store at %s for %.1f s while %s", c->addr,
                                 waited_s, what);
            }
            continue;
        }
        if (errno == ECONNRESET)
            return fail_closed(c, what);
        c->broken = true;
        return error_set(FSDP_EIO, "receiving from store at %s failed while %s: %s", c->addr, what,
                         strerror(errno));
    }
    return 0;
}

struct rd {
    struct store_client *c;
    double deadline, waited_s;
    const char *what;
};

static int rd_u8(struct rd *r, uint8_t *v) { return recv_exact(r->c, v, 1, r->deadline, r->waited_s, r->what); }

static int rd_u32(struct rd *r, uint32_t *v)
{
    uint8_t b[4];
    int rc = recv_exact(r->c, b, 4, r->deadline, r->waited_s, r->what);
    *v = rc ? 0 : store_le32(b);
    return rc;
}

static int rd_u64(struct rd *r, uint64_t *v)
{
    uint8_t b[8];
    int rc = recv_exact(r->c, b, 8, r->deadline, r->waited_s, r->what);
    *v = rc ? 0 : store_le64(b);
    return rc;
}

/* u64 length + bytes into a malloc'd copy (NUL-terminated, not counted); lengths over max are a server
 * that is not a store. */
static int rd_bytes(struct rd *r, uint64_t max, void **out, size_t *len)
{
    uint64_t n;
    *out = NULL;
    FSDP_TRY(rd_u64(r, &n));
    if (n > max) {
        r->c->broken = true;
        return error_set(FSDP_EPROTO, "store at %s sent a field of %llu bytes while %s: is it an fsdpc store?",
                         r->c->addr, (unsigned long long)n, r->what);
    }
    uint8_t *v = malloc((size_t)n + 1);
    if (!v) {
        r->c->broken = true;
        return error_set(FSDP_ENOMEM, "out of memory for a %llu-byte store reply", (unsigned long long)n);
    }
    int rc = recv_exact(r->c, v, (size_t)n, r->deadline, r->waited_s, r->what);
    if (rc) {
        free(v);
        return rc;
    }
    v[n] = 0;
    *out = v;
    if (len)
        *len = (size_t)n;
    return 0;
}

/* The status byte of an fsdpc reply (nothing in plain mode). A status other than OK comes with a message;
 * NOT_FOUND returns FSDP_ENOTFOUND without a message of its own (the caller knows what is missing). */
static int rd_status(struct rd *r)
{
    struct store_client *c = r->c;
    if (c->plain)
        return 0;
    uint8_t st;
    FSDP_TRY(rd_u8(r, &st));
    if (st == STORE_ST_OK)
        return 0;
    void *msg = NULL;
    size_t n = 0;
    if (st > STORE_ST_PROTO) {
        c->broken = true;
        return error_set(FSDP_EPROTO, "store at %s answered with unknown status %u while %s: is it an fsdpc store?",
                         c->addr, st, r->what);
    }
    FSDP_TRY(rd_bytes(r, 4096, &msg, &n));
    int len = n > 400 ? 400 : (int)n;
    int rc;
    switch (st) {
    case STORE_ST_NOT_FOUND: rc = FSDP_ENOTFOUND; break;
    case STORE_ST_REFUSED:
        c->broken = true;
        rc = error_set(FSDP_EREFUSED, "store at %s %.*s", c->addr, len, (const char *)msg);
        break;
    case STORE_ST_INVALID:
        rc = error_set(FSDP_EINVAL, "store at %s rejected the request while %s: %.*s", c->addr, r->what, len,
                       (const char *)msg);
        break;
    case STORE_ST_TOO_LARGE:
        rc = error_set(FSDP_ERANGE, "store at %s rejected the request while %s: %.*s", c->addr, r->what, len,
                       (const char *)msg);
        break;
    default:
        c->broken = true;
        rc = error_set(FSDP_EPROTO, "store at %s could not parse our request while %s: %.*s", c->addr, r->what, len,
                       (const char *)msg);
        break;
    }
    free(msg);
    return rc;
}

/* Sends c->out and reads the status of its reply; the rest of the reply is the caller's to read. */
static int roundtrip(struct store_client *c, struct rd *r, const char *what)
{
    *r = (struct rd){.c = c, .deadline = clock_now_s() + c->default_timeout_s, .waited_s = c->default_timeout_s,
                     .what = what};
    FSDP_TRY(client_send(c, r->deadline, what));
    return rd_status(r);
}

static int check_key(const char *key)
{
    if (!key || !*key)
        return error_set(FSDP_EINVAL, "store keys must be non-empty strings");
    size_t n = strlen(key);
    char shown[80];
    if (n > STORE_MAX_KEY_BYTES)
        return error_set(FSDP_ERANGE, "key '%s' of %zu bytes exceeds STORE_MAX_KEY_BYTES (%d)",
                         key_shown(key, shown), n, STORE_MAX_KEY_BYTES);
    return 0;
}

static uint64_t value_limit(const struct store_client *c)
{
    return c->plain ? STORE_TORCH_MAX_VALUE_BYTES : STORE_MAX_VALUE_BYTES;
}

static int check_value(const struct store_client *c, const char *key, size_t len)
{
    char shown[80];
    if (len > value_limit(c))
        return error_set(FSDP_ERANGE, "value of %zu bytes for key '%s' exceeds %s (%llu)", len,
                         key_shown(key, shown), c->plain ? "PyTorch's TCPStore limit" : "STORE_MAX_VALUE_BYTES",
                         (unsigned long long)value_limit(c));
    return 0;
}

static double wait_seconds(const struct store_client *c, double timeout_s)
{
    return timeout_s > 0 ? timeout_s : c->default_timeout_s;
}

static void begin(struct store_client *c, uint8_t op)
{
    store_buf_reset(&c->out);
    store_buf_put_u8(&c->out, op);
}

/* ---- connect + handshake ---- */

static int connect_once(const char *host, int port, int *fd_out, double deadline, int *err)
{
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, portstr, &hints, &res);
    if (gai != 0) {
        *err = -gai; /* negative: a resolver error, reported with gai_strerror */
        return -1;
    }
    int ok = -1;
    for (struct addrinfo *ai = res; ai && ok != 0; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            *err = errno;
            continue;
        }
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            double step = clock_now_s() + 5.0;
            int pr = poll(&pfd, 1, poll_ms(step < deadline ? step : deadline));
            int soerr = ETIMEDOUT;
            socklen_t sl = sizeof soerr;
            if (pr > 0)
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            rc = soerr ? -1 : 0;
            errno = soerr;
        }
        if (rc == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            *fd_out = fd;
            ok = 0;
        } else {
            *err = errno;
            close(fd);
        }
    }
    freeaddrinfo(res);
    return ok;
}

/* VALIDATE and PING as PyTorch's client sends them, then (not plain) HELLO and AUTH. *answered turns true
 * once the peer echoed the PING: from then on a failure is an answer, not a server still starting, except
 * a close without a verdict on AUTH. */
static int client_handshake(struct store_client *c, double wait_s, bool *answered)
{
    const char *what = "joining (handshake)";
    struct rd r = {.c = c, .deadline = clock_now_s() + wait_s, .waited_s = wait_s, .what = what};
    uint8_t cnonce[STORE_NONCE_BYTES];
    uint32_t ping = (uint32_t)getpid();
    FSDP_TRY(store_auth_random(cnonce, sizeof cnonce));
    begin(c, STORE_OP_VALIDATE);
    store_buf_put_u32(&c->out, STORE_VALIDATE_MAGIC);
    store_buf_put_u8(&c->out, STORE_OP_PING);
    store_buf_put_u32(&c->out, ping);
    if (!c->plain) {
        store_buf_put_u8(&c->out, STORE_OP_HELLO);
        store_buf_put_u32(&c->out, STORE_HELLO_MAGIC);
        store_buf_put_u16(&c->out, STORE_PROTOCOL_VERSION);
        store_buf_put_str(&c->out, c->run_id);
        store_buf_put_bytes(&c->out, cnonce, sizeof cnonce);
    }
    uint32_t echo = 0;
    FSDP_TRY(client_send(c, r.deadline, what));
    FSDP_TRY(rd_u32(&r, &echo));
    if (echo != ping) {
        c->broken = true;
        return error_set(FSDP_EPROTO, "store at %s answered the handshake with bytes of another protocol: is it an "
                         "fsdpc store?", c->addr);
    }
    *answered = true;
    if (c->plain)
        return 0;
    int rc = rd_status(&r);
    if (rc == FSDP_ECLOSED)
        return error_set(FSDP_EPROTO, "store at %s speaks c10d's TCPStore protocol but not fsdpc's handshake: is it "
                         "a PyTorch TCPStore instead of fsdp-launch's store?", c->addr);
    FSDP_TRY(rc);
    uint8_t version[2]; /* the server's; a server of another version refused HELLO already */
    void *snonce = NULL;
    size_t snl = 0;
    FSDP_TRY(recv_exact(c, version, sizeof version, r.deadline, r.waited_s, what));
    FSDP_TRY(rd_bytes(&r, STORE_NONCE_MAX_BYTES, &snonce, &snl));
    uint8_t key[STORE_KEY_BYTES], mac[STORE_MAC_BYTES], want[STORE_MAC_BYTES];
    store_auth_key(c->run_id, c->secret, key);
    store_auth_mac(key, 'c', c->run_id, strlen(c->run_id), cnonce, sizeof cnonce, snonce, snl, mac);
    store_auth_mac(key, 's', c->run_id, strlen(c->run_id), cnonce, sizeof cnonce, snonce, snl, want);
    free(snonce);
    begin(c, STORE_OP_AUTH);
    store_buf_put_bytes(&c->out, mac, sizeof mac);
    void *smac = NULL;
    size_t sml = 0;
    FSDP_TRY(client_send(c, r.deadline, what));
    rc = rd_status(&r);
    /* Closed without a verdict: its AUTH waited for the server's throttle on AUTHs past the handshake
     * deadline, or the cap on connections without the token made room (docs/store.md): try again. */
    if (rc == FSDP_ECLOSED)
        *answered = false;
    FSDP_TRY(rc);
    FSDP_TRY(rd_bytes(&r, STORE_NONCE_MAX_BYTES, &smac, &sml));
    bool ok = sml == STORE_MAC_BYTES && store_auth_equal(smac, want, STORE_MAC_BYTES);
    free(smac);
    if (!ok) {
        c->broken = true;
        return error_set(FSDP_EREFUSED, "store at %s could not prove it knows this job's secret (run id and "
                         "FSDP_RDZV_TOKEN): another program listens there?", c->addr);
    }
    return 0;
}

int store_client_connect(const struct store_client_options *opts, struct store_client **out)
{
    *out = NULL;
    if (!opts || !opts->host || (!opts->run_id && !opts->plain))
        return error_set(FSDP_EINVAL, "store_client_connect: host and run id are required");
    if (opts->port <= 0 || opts->port > 65535)
        return error_set(FSDP_EINVAL, "store port %d is outside 1..65535", opts->port);
    if (!opts->plain && strlen(opts->run_id) > 1024)
        return error_set(FSDP_EINVAL, "run id of %zu bytes is longer than 1024", strlen(opts->run_id));
    struct store_client *c = calloc(1, sizeof *c);
    if (!c)
        return error_set(FSDP_ENOMEM, "out of memory creating a store client");
    c->fd = -1;
    c->plain = opts->plain;
    c->default_timeout_s = opts->default_timeout_s > 0 ? opts->default_timeout_s : 300.0;
    snprintf(c->addr, sizeof c->addr, "%s:%d", opts->host, opts->port);
    store_buf_init(&c->out);
    c->port = opts->port;
    c->host = strdup(opts->host);
    c->run_id = strdup(opts->run_id ? opts->run_id : "");
    c->secret = opts->secret ? strdup(opts->secret) : NULL;
    int rc = 0;
    if (!c->host || !c->run_id || (opts->secret && !c->secret)) {
        rc = error_set(FSDP_ENOMEM, "out of memory creating a store client");
        goto fail;
    }
    double connect_s = opts->connect_timeout_s > 0 ? opts->connect_timeout_s : 30.0;
    double start = clock_now_s(), deadline = start + connect_s;
    double backoff = 0.02;
    int err = 0;
    for (;;) {
        int fd;
        if (connect_once(opts->host, opts->port, &fd, deadline, &err) == 0) {
            c->fd = fd;
            c->broken = false;
            c->rpos = c->rlen = 0;
            double left = deadline - clock_now_s();
            bool answered = false;
            rc = client_handshake(c, left > 5.0 ? left : 5.0, &answered);
            /* A server that is starting or restarting may drop us; anything else is an answer. */
            if (rc != FSDP_ECLOSED || answered)
                break;
            close(c->fd);
            c->fd = -1;
            err = ECONNRESET;
        }
        /* The last try lands on the deadline, so "tried for N s" in the message is what happened. */
        double left = deadline - clock_now_s();
        if (left <= 0) {
            char why[128];
            snprintf(why, sizeof why, "%s", err < 0 ? gai_strerror(-err) : strerror(err));
            rc = error_set(FSDP_ETIMEDOUT,
                           "could not reach store at %s for %g s (last error: %s): is the launcher of node 0 "
                           "running and --master_addr/--master_port right?",
                           c->addr, connect_s, why);
            break;
        }
        double nap = backoff < left ? backoff : left;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(nap * 1e9)};
        nanosleep(&ts, NULL);
        backoff = backoff * 2 > 0.5 ? 0.5 : backoff * 2;
    }
    if (rc != 0)
        goto fail;
    *out = c;
    return 0;
fail:
    store_client_close(c);
    return rc;
}

void store_client_close(struct store_client *c)
{
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    store_buf_free(&c->out);
    free(c->host);
    free(c->run_id);
    free(c->secret);
    free(c);
}

int store_client_clone(const struct store_client *c, double default_timeout_s, struct store_client **out)
{
    *out = NULL;
    if (!c)
        return error_set(FSDP_EINVAL, "store_client_clone: no client");
    struct store_client_options co = {.host = c->host, .port = c->port, .run_id = c->run_id, .secret = c->secret,
                                      .plain = c->plain, .connect_timeout_s = 30,
                                      .default_timeout_s = default_timeout_s};
    return store_client_connect(&co, out);
}

int store_client_fd(const struct store_client *c) { return c ? c->fd : -1; }

/* ---- operations ---- */

static void what_key(char *buf, size_t n, const char *verb, const char *key)
{
    char shown[80];
    snprintf(buf, n, "%s key '%s'", verb, key_shown(key, shown));
}

/* SET and APPEND: a key and a value in, nothing out (plain: no reply at all, as in c10d). */
static int key_value_op(struct store_client *c, int op, const char *verb, const char *key, const void *value,
                        size_t len)
{
    FSDP_TRY(check_key(key));
    FSDP_TRY(check_value(c, key, len));
    char what[128];
    what_key(what, sizeof what, verb, key);
    begin(c, (uint8_t)op);
    store_buf_put_str(&c->out, key);
    store_buf_put_bytes(&c->out, value, len);
    struct rd r;
    return roundtrip(c, &r, what);
}

int store_client_set(struct store_client *c, const char *key, const void *value, size_t len)
{
    return key_value_op(c, STORE_OP_SET, "setting", key, value, len);
}

int store_client_append(struct store_client *c, const char *key, const void *value, size_t len)
{
    return key_value_op(c, STORE_OP_APPEND, "appending to", key, value, len);
}

/* WAIT for keys until the deadline. On timeout: CANCEL_WAIT, and *timed_out (the connection stays in
 * step: c10d answers STOP_WAITING first when the keys arrived meanwhile, then WAIT_CANCELED). */
static int wait_keys(struct store_client *c, const char *const *keys, size_t nkeys, double t, const char *what,
                     bool *timed_out)
{
    *timed_out = false;
    begin(c, STORE_OP_WAIT);
    store_buf_put_u64(&c->out, nkeys);
    for (size_t i = 0; i < nkeys; i++)
        store_buf_put_str(&c->out, keys[i]);
    double deadline = clock_now_s() + t;
    FSDP_TRY(client_send(c, deadline + CANCEL_REPLY_S, what));
    struct rd r = {.c = c, .deadline = deadline + CANCEL_REPLY_S, .waited_s = t, .what = what};
    uint8_t resp = 0;
    if (readable(c, deadline)) {
        FSDP_TRY(rd_status(&r));
        FSDP_TRY(rd_u8(&r, &resp));
        if (resp != STORE_WAIT_STOP) {
            c->broken = true;
            return error_set(FSDP_EPROTO, "store at %s answered WAIT with %u while %s", c->addr, resp, what);
        }
        return 0;
    }
    begin(c, STORE_OP_CANCEL_WAIT);
    FSDP_TRY(client_send(c, clock_now_s() + CANCEL_REPLY_S, what));
    r.deadline = clock_now_s() + CANCEL_REPLY_S;
    FSDP_TRY(rd_status(&r));
    FSDP_TRY(rd_u8(&r, &resp));
    if (resp == STORE_WAIT_STOP) { /* arrived just now: the cancel's own answer follows */
        FSDP_TRY(rd_status(&r));
        FSDP_TRY(rd_u8(&r, &resp));
        if (resp == STORE_WAIT_CANCELED)
            return 0;
    }
    if (resp != STORE_WAIT_CANCELED) {
        c->broken = true;
        return error_set(FSDP_EPROTO, "store at %s answered CANCEL_WAIT with %u while %s", c->addr, resp, what);
    }
    *timed_out = true;
    return 0;
}

static int get_once(struct store_client *c, const char *key, const char *what, void **value, size_t *len)
{
    begin(c, STORE_OP_GET);
    store_buf_put_str(&c->out, key);
    struct rd r;
    FSDP_TRY(roundtrip(c, &r, what));
    return rd_bytes(&r, value_limit(c), value, len);
}

int store_client_get(struct store_client *c, const char *key, void **value, size_t *len, double timeout_s)
{
    *value = NULL;
    if (len)
        *len = 0;
    FSDP_TRY(check_key(key));
    double t = wait_seconds(c, timeout_s);
    double deadline = clock_now_s() + t;
    char what[128], shown[80];
    what_key(what, sizeof what, "waiting for", key);
    /* fsdpc's server says NOT_FOUND, so a key that is there costs one round trip; c10d's GET of a
     * missing key answers an empty value, so plain mode waits first, as PyTorch's client does. */
    if (!c->plain) {
        int rc = get_once(c, key, what, value, len);
        if (rc != FSDP_ENOTFOUND)
            return rc;
    }
    for (;;) {
        bool timed_out;
        double left = deadline - clock_now_s();
        FSDP_TRY(wait_keys(c, &key, 1, left > 0 ? left : 0, what, &timed_out));
        if (timed_out)
            return error_set(FSDP_ETIMEDOUT, "timed out after %.1f s waiting for key '%s' at store %s", t,
                             key_shown(key, shown), c->addr);
        int rc = get_once(c, key, what, value, len);
        if (rc != FSDP_ENOTFOUND) /* deleted between the wait and the read: wait again */
            return rc;
    }
}

int store_client_add(struct store_client *c, const char *key, int64_t delta, int64_t *result)
{
    FSDP_TRY(check_key(key));
    char what[128];
    what_key(what, sizeof what, "adding to", key);
    begin(c, STORE_OP_ADD);
    store_buf_put_str(&c->out, key);
    store_buf_put_u64(&c->out, (uint64_t)delta);
    struct rd r;
    uint64_t v = 0;
    FSDP_TRY(roundtrip(c, &r, what));
    FSDP_TRY(rd_u64(&r, &v));
    if (result)
        *result = (int64_t)v;
    return 0;
}

int store_client_compare_set(struct store_client *c, const char *key, const void *expected, size_t expected_len,
                             const void *desired, size_t desired_len, void **actual, size_t *actual_len)
{
    if (actual)
        *actual = NULL;
    if (actual_len)
        *actual_len = 0;
    FSDP_TRY(check_key(key));
    FSDP_TRY(check_value(c, key, expected_len));
    FSDP_TRY(check_value(c, key, desired_len));
    char what[128];
    what_key(what, sizeof what, "compare-and-setting", key);
    begin(c, STORE_OP_COMPARE_SET);
    store_buf_put_str(&c->out, key);
    store_buf_put_bytes(&c->out, expected, expected_len);
    store_buf_put_bytes(&c->out, desired, desired_len);
    struct rd r;
    int rc = roundtrip(c, &r, what);
    void *v = NULL;
    size_t n = 0;
    if (rc == FSDP_ENOTFOUND) { /* the key is still missing */
        error_clear();
        v = calloc(1, 1);
        if (!v)
            return error_set(FSDP_ENOMEM, "out of memory");
    } else {
        FSDP_TRY(rc);
        FSDP_TRY(rd_bytes(&r, value_limit(c), &v, &n));
    }
    if (actual) {
        *actual = v;
        if (actual_len)
            *actual_len = n;
    } else {
        free(v);
    }
    return 0;
}

static int put_keys(struct store_client *c, const char *const *keys, size_t nkeys)
{
    if (nkeys > STORE_MAX_KEYS)
        return error_set(FSDP_ERANGE, "%zu keys in one request exceed the limit of %u", nkeys, STORE_MAX_KEYS);
    for (size_t i = 0; i < nkeys; i++)
        FSDP_TRY(check_key(keys[i]));
    store_buf_put_u64(&c->out, nkeys);
    for (size_t i = 0; i < nkeys; i++)
        store_buf_put_str(&c->out, keys[i]);
    return 0;
}

int store_client_check(struct store_client *c, const char *const *keys, size_t nkeys, bool *all_exist)
{
    begin(c, STORE_OP_CHECK);
    FSDP_TRY(put_keys(c, keys, nkeys));
    struct rd r;
    uint8_t v = 0;
    FSDP_TRY(roundtrip(c, &r, "checking keys"));
    FSDP_TRY(rd_u8(&r, &v));
    *all_exist = v == STORE_CHECK_READY;
    return 0;
}

/* "'a', 'b', 'c' and 2 more" */
static void keys_shown(char *buf, size_t n, const char *const *keys, size_t nkeys)
{
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < nkeys && off < n; i++) {
        char shown[80];
        if (off > 200) {
            snprintf(buf + off, n - off, " and %zu more", nkeys - i);
            return;
        }
        off += (size_t)snprintf(buf + off, n - off, "%s'%s'", i ? ", " : "", key_shown(keys[i], shown));
    }
}

int store_client_wait(struct store_client *c, const char *const *keys, size_t nkeys, double timeout_s)
{
    store_buf_reset(&c->out);
    FSDP_TRY(put_keys(c, keys, nkeys)); /* checks the keys; wait_keys builds the request */
    double t = wait_seconds(c, timeout_s);
    char list[300], what[400];
    keys_shown(list, sizeof list, keys, nkeys);
    snprintf(what, sizeof what, "waiting for keys %s", list);
    bool timed_out;
    FSDP_TRY(wait_keys(c, keys, nkeys, t, what, &timed_out));
    if (!timed_out)
        return 0;
    /* Name the keys that are still missing, which is what the user has to chase. */
    const char **missing = malloc((nkeys ? nkeys : 1) * sizeof *missing);
    size_t nmissing = 0, checked = nkeys < NAME_MISSING_MAX ? nkeys : NAME_MISSING_MAX;
    for (size_t i = 0; missing && i < checked; i++) {
        bool here = false;
        const char *one[1] = {keys[i]};
        int rc = store_client_check(c, one, 1, &here);
        if (rc) {
            free(missing);
            return rc;
        }
        if (!here)
            missing[nmissing++] = keys[i];
    }
    char names[300] = "?";
    if (missing)
        keys_shown(names, sizeof names, missing, nmissing);
    free(missing);
    return error_set(FSDP_ETIMEDOUT, "timed out after %.1f s waiting for keys at store %s: %zu of %zu missing%s: %s",
                     t, c->addr, nmissing, nkeys, checked < nkeys ? " among the first checked" : "", names);
}

int store_client_delete(struct store_client *c, const char *key, bool *existed)
{
    FSDP_TRY(check_key(key));
    char what[128];
    what_key(what, sizeof what, "deleting", key);
    begin(c, STORE_OP_DELETE_KEY);
    store_buf_put_str(&c->out, key);
    struct rd r;
    uint64_t v = 0;
    FSDP_TRY(roundtrip(c, &r, what));
    FSDP_TRY(rd_u64(&r, &v));
    if (existed)
        *existed = v != 0;
    return 0;
}

int store_client_num_keys(struct store_client *c, int64_t *n)
{
    begin(c, STORE_OP_GETNUMKEYS);
    struct rd r;
    uint64_t v = 0;
    FSDP_TRY(roundtrip(c, &r, "counting keys"));
    FSDP_TRY(rd_u64(&r, &v));
    *n = (int64_t)v;
    return 0;
}

int store_client_ping(struct store_client *c)
{
    uint32_t nonce = (uint32_t)(clock_now_s() * 1e6), echo = 0;
    begin(c, STORE_OP_PING);
    store_buf_put_u32(&c->out, nonce);
    struct rd r;
    FSDP_TRY(roundtrip(c, &r, "pinging"));
    FSDP_TRY(rd_u32(&r, &echo));
    if (echo != nonce) {
        c->broken = true;
        return error_set(FSDP_EPROTO, "store at %s answered PING %u with %u", c->addr, nonce, echo);
    }
    return 0;
}

int store_client_reset_torch_keys(struct store_client *c, int64_t *removed)
{
    if (c->plain)
        return error_set(FSDP_EUNSUPPORTED, "store_client_reset_torch_keys needs fsdpc's handshake (not plain)");
    begin(c, STORE_OP_RESET_TORCH);
    struct rd r;
    uint64_t v = 0;
    FSDP_TRY(roundtrip(c, &r, "emptying PyTorch clients' keys"));
    FSDP_TRY(rd_u64(&r, &v));
    if (removed)
        *removed = (int64_t)v;
    return 0;
}
