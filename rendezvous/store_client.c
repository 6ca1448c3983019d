/* The blocking store client: one TCP connection, one request in flight, every socket wait bounded by poll.
 * The server enforces the timeout of GET/WAIT itself and answers TIMEOUT with the keys still missing, so
 * the connection stays usable after a timeout; the client's own poll deadline (timeout + margin) only
 * catches a server that hangs or vanishes. */
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

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/store_protocol.h"

/* Slack on top of a server-side wait before the client gives up on the server itself. */
#define CLIENT_REPLY_MARGIN_S 10.0

struct store_client {
    int fd;
    bool broken; /* the stream is out of step (half a reply read): every later call fails */
    double default_timeout_s;
    char addr[300]; /* "host:port" for messages */
    char *host, *run_id, *secret; /* what store_client_clone reconnects with */
    int port;
    struct store_buf out;
    uint8_t *in;
    size_t in_len, in_cap;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int poll_ms(double deadline)
{
    double left = deadline - now_s();
    if (left <= 0)
        return 0;
    return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

/* Keys are shown in messages; a 1 KiB key would drown them. */
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

static int recv_exact(struct store_client *c, uint8_t *p, size_t n, double deadline, double waited_s,
                      const char *what)
{
    while (n > 0) {
        ssize_t r = recv(c->fd, p, n, 0);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0)
            return fail_closed(c, what);
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
            int pr = poll(&pfd, 1, poll_ms(deadline));
            if (pr == 0) {
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

/* Sends the frame in c->out and reads one reply into c->in; *status is its first byte and the reader is
 * positioned after it. */
static int client_roundtrip(struct store_client *c, double wait_s, const char *what, uint8_t *status,
                            struct store_reader *r)
{
    if (c->broken)
        return error_set(FSDP_ECLOSED, "the connection to store at %s is unusable after an earlier error", c->addr);
    FSDP_TRY(store_buf_end(&c->out));
    double deadline = now_s() + wait_s;
    FSDP_TRY(send_all(c, c->out.data, c->out.len, deadline, what));
    /* Poll before the first recv: the reply is rarely there yet, and this saves a recv that would
     * only say EAGAIN. */
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
    while (poll(&pfd, 1, poll_ms(deadline)) < 0 && errno == EINTR)
        ;
    uint8_t hdr[STORE_FRAME_HEADER_BYTES];
    FSDP_TRY(recv_exact(c, hdr, sizeof hdr, deadline, wait_s, what));
    uint32_t n = store_le32(hdr);
    if (n == 0 || n > STORE_MAX_FRAME_BYTES) {
        c->broken = true;
        return error_set(FSDP_EPROTO, "store at %s sent a reply of %u bytes while %s: is it an fsdpc store?",
                         c->addr, n, what);
    }
    if (n > c->in_cap) {
        uint8_t *p = realloc(c->in, n);
        if (!p) {
            c->broken = true;
            return error_set(FSDP_ENOMEM, "out of memory for a %u-byte store reply", n);
        }
        c->in = p;
        c->in_cap = n;
    }
    FSDP_TRY(recv_exact(c, c->in, n, deadline, wait_s, what));
    c->in_len = n;
    store_reader_init(r, c->in, n);
    *status = store_reader_u8(r);
    return 0;
}

/* Maps a non-OK status (whose body is a message) to an error. */
static int status_error(struct store_client *c, uint8_t status, struct store_reader *r, const char *what)
{
    size_t n;
    const uint8_t *msg = store_reader_bytes(r, &n);
    int len = n > 400 ? 400 : (int)n;
    switch (status) {
    case STORE_ST_REFUSED:
        c->broken = true;
        return error_set(FSDP_EREFUSED, "store at %s %.*s", c->addr, len, (const char *)msg);
    case STORE_ST_INVALID:
        return error_set(FSDP_EINVAL, "store at %s rejected the request while %s: %.*s", c->addr, what, len,
                         (const char *)msg);
    case STORE_ST_TOO_LARGE:
        return error_set(FSDP_ERANGE, "store at %s rejected the request while %s: %.*s", c->addr, what, len,
                         (const char *)msg);
    case STORE_ST_PROTO:
        c->broken = true;
        return error_set(FSDP_EPROTO, "store at %s could not parse our request while %s: %.*s", c->addr, what,
                         len, (const char *)msg);
    default:
        c->broken = true;
        return error_set(FSDP_EPROTO, "store at %s answered with unknown status %u while %s", c->addr, status,
                         what);
    }
}

static int reply_malformed(struct store_client *c, const char *what)
{
    c->broken = true;
    return error_set(FSDP_EPROTO, "store at %s sent a malformed reply while %s", c->addr, what);
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

static int check_value(const char *key, size_t len)
{
    char shown[80];
    if (len > STORE_MAX_VALUE_BYTES)
        return error_set(FSDP_ERANGE, "value of %zu bytes for key '%s' exceeds STORE_MAX_VALUE_BYTES (%u)", len,
                         key_shown(key, shown), (unsigned)STORE_MAX_VALUE_BYTES);
    return 0;
}

static double wait_seconds(const struct store_client *c, double timeout_s)
{
    double t = timeout_s > 0 ? timeout_s : c->default_timeout_s;
    return t > 4e6 ? 4e6 : t; /* fits the u32 milliseconds of the wire */
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
            double step = now_s() + 5.0;
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

static int client_hello(struct store_client *c, const struct store_client_options *o, double wait_s)
{
    store_buf_begin(&c->out, STORE_OP_HELLO);
    store_buf_put_u32(&c->out, STORE_MAGIC);
    store_buf_put_u16(&c->out, STORE_PROTOCOL_VERSION);
    store_buf_put_str(&c->out, o->run_id);
    store_buf_put_str(&c->out, o->secret);
    uint8_t st;
    struct store_reader r;
    FSDP_TRY(client_roundtrip(c, wait_s, "joining (handshake)", &st, &r));
    if (st != STORE_ST_OK)
        return status_error(c, st, &r, "joining (handshake)");
    store_reader_u16(&r);
    return store_reader_done(&r) ? 0 : reply_malformed(c, "joining (handshake)");
}

int store_client_connect(const struct store_client_options *opts, struct store_client **out)
{
    *out = NULL;
    if (!opts || !opts->host || !opts->run_id)
        return error_set(FSDP_EINVAL, "store_client_connect: host and run id are required");
    if (opts->port <= 0 || opts->port > 65535)
        return error_set(FSDP_EINVAL, "store port %d is outside 1..65535", opts->port);
    struct store_client *c = calloc(1, sizeof *c);
    if (!c)
        return error_set(FSDP_ENOMEM, "out of memory creating a store client");
    c->fd = -1;
    c->default_timeout_s = opts->default_timeout_s > 0 ? opts->default_timeout_s : 300.0;
    snprintf(c->addr, sizeof c->addr, "%s:%d", opts->host, opts->port);
    store_buf_init(&c->out);
    c->port = opts->port;
    c->host = strdup(opts->host);
    c->run_id = strdup(opts->run_id);
    c->secret = opts->secret ? strdup(opts->secret) : NULL;
    int rc = 0;
    if (!c->host || !c->run_id || (opts->secret && !c->secret)) {
        rc = error_set(FSDP_ENOMEM, "out of memory creating a store client");
        goto fail;
    }
    double connect_s = opts->connect_timeout_s > 0 ? opts->connect_timeout_s : 30.0;
    double start = now_s(), deadline = start + connect_s;
    double backoff = 0.02;
    int err = 0;
    for (;;) {
        int fd;
        if (connect_once(opts->host, opts->port, &fd, deadline, &err) == 0) {
            c->fd = fd;
            c->broken = false;
            double left = deadline - now_s();
            rc = client_hello(c, opts, left > 5.0 ? left : 5.0);
            /* A server that is starting or restarting may drop us; anything else is an answer. */
            if (rc != FSDP_ECLOSED)
                break;
            close(c->fd);
            c->fd = -1;
            err = ECONNRESET;
        }
        /* The last try lands on the deadline, so "tried for N s" in the message is what happened. */
        double left = deadline - now_s();
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
    free(c->in);
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
                                      .connect_timeout_s = 30, .default_timeout_s = default_timeout_s};
    return store_client_connect(&co, out);
}

int store_client_fd(const struct store_client *c) { return c ? c->fd : -1; }

/* ---- operations ---- */

/* A request without a server-side wait: the default timeout bounds a hung server. */
static int simple_roundtrip(struct store_client *c, const char *what, struct store_reader *r)
{
    uint8_t st;
    FSDP_TRY(client_roundtrip(c, c->default_timeout_s, what, &st, r));
    return st == STORE_ST_OK ? 0 : status_error(c, st, r, what);
}

static void what_key(char *buf, size_t n, const char *verb, const char *key)
{
    char shown[80];
    snprintf(buf, n, "%s key '%s'", verb, key_shown(key, shown));
}

/* SET and APPEND: a key and a value in, an empty reply out. */
static int key_value_op(struct store_client *c, int op, const char *verb, const char *key, const void *value,
                        size_t len)
{
    FSDP_TRY(check_key(key));
    FSDP_TRY(check_value(key, len));
    char what[128];
    what_key(what, sizeof what, verb, key);
    store_buf_begin(&c->out, op);
    store_buf_put_str(&c->out, key);
    store_buf_put_bytes(&c->out, value, len);
    struct store_reader r;
    FSDP_TRY(simple_roundtrip(c, what, &r));
    if (!store_reader_done(&r))
        return reply_malformed(c, what);
    return 0;
}

int store_client_set(struct store_client *c, const char *key, const void *value, size_t len)
{
    return key_value_op(c, STORE_OP_SET, "setting", key, value, len);
}

static int copy_out(const uint8_t *p, size_t n, void **value, size_t *len)
{
    uint8_t *v = malloc(n + 1);
    if (!v)
        return error_set(FSDP_ENOMEM, "out of memory for a %zu-byte store value", n);
    if (n)
        memcpy(v, p, n);
    v[n] = '\0';
    *value = v;
    if (len)
        *len = n;
    return 0;
}

int store_client_get(struct store_client *c, const char *key, void **value, size_t *len, double timeout_s)
{
    *value = NULL;
    if (len)
        *len = 0;
    FSDP_TRY(check_key(key));
    double t = wait_seconds(c, timeout_s);
    char what[128], shown[80];
    what_key(what, sizeof what, "waiting for", key);
    store_buf_begin(&c->out, STORE_OP_GET);
    store_buf_put_u32(&c->out, (uint32_t)(t * 1000.0));
    store_buf_put_str(&c->out, key);
    uint8_t st;
    struct store_reader r;
    FSDP_TRY(client_roundtrip(c, t + CLIENT_REPLY_MARGIN_S, what, &st, &r));
    if (st == STORE_ST_TIMEOUT)
        return error_set(FSDP_ETIMEDOUT, "timed out after %.1f s waiting for key '%s' at store %s", t,
                         key_shown(key, shown), c->addr);
    if (st != STORE_ST_OK)
        return status_error(c, st, &r, what);
    size_t n;
    const uint8_t *p = store_reader_bytes(&r, &n);
    if (!store_reader_done(&r))
        return reply_malformed(c, what);
    return copy_out(p, n, value, len);
}

int store_client_add(struct store_client *c, const char *key, int64_t delta, int64_t *result)
{
    FSDP_TRY(check_key(key));
    char what[128];
    what_key(what, sizeof what, "adding to", key);
    store_buf_begin(&c->out, STORE_OP_ADD);
    store_buf_put_str(&c->out, key);
    store_buf_put_u64(&c->out, (uint64_t)delta);
    struct store_reader r;
    FSDP_TRY(simple_roundtrip(c, what, &r));
    int64_t v = (int64_t)store_reader_u64(&r);
    if (!store_reader_done(&r))
        return reply_malformed(c, what);
    if (result)
        *result = v;
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
    FSDP_TRY(check_value(key, expected_len));
    FSDP_TRY(check_value(key, desired_len));
    char what[128];
    what_key(what, sizeof what, "compare-and-setting", key);
    store_buf_begin(&c->out, STORE_OP_COMPARE_SET);
    store_buf_put_str(&c->out, key);
    store_buf_put_u8(&c->out, expected == NULL && expected_len == 0); /* expect the key to be missing */
    store_buf_put_bytes(&c->out, expected, expected_len);
    store_buf_put_bytes(&c->out, desired, desired_len);
    struct store_reader r;
    FSDP_TRY(simple_roundtrip(c, what, &r));
    store_reader_u8(&r); /* exists: an empty value and a missing key both read as length 0 */
    size_t n;
    const uint8_t *p = store_reader_bytes(&r, &n);
    if (!store_reader_done(&r))
        return reply_malformed(c, what);
    return actual ? copy_out(p, n, actual, actual_len) : 0;
}

static int put_keys(struct store_client *c, const char *const *keys, size_t nkeys)
{
    if (nkeys > STORE_MAX_WAIT_KEYS)
        return error_set(FSDP_ERANGE, "%zu keys in one request exceed the limit of %u", nkeys,
                         STORE_MAX_WAIT_KEYS);
    for (size_t i = 0; i < nkeys; i++) {
        FSDP_TRY(check_key(keys[i]));
    }
    store_buf_put_u32(&c->out, (uint32_t)nkeys);
    for (size_t i = 0; i < nkeys; i++)
        store_buf_put_str(&c->out, keys[i]);
    return 0;
}

int store_client_check(struct store_client *c, const char *const *keys, size_t nkeys, bool *all_exist)
{
    store_buf_begin(&c->out, STORE_OP_CHECK);
    FSDP_TRY(put_keys(c, keys, nkeys));
    struct store_reader r;
    FSDP_TRY(simple_roundtrip(c, "checking keys", &r));
    uint8_t all = store_reader_u8(&r);
    if (!store_reader_done(&r))
        return reply_malformed(c, "checking keys");
    *all_exist = all != 0;
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
    double t = wait_seconds(c, timeout_s);
    store_buf_begin(&c->out, STORE_OP_WAIT);
    store_buf_put_u32(&c->out, (uint32_t)(t * 1000.0));
    FSDP_TRY(put_keys(c, keys, nkeys));
    char list[300], what[400];
    keys_shown(list, sizeof list, keys, nkeys);
    snprintf(what, sizeof what, "waiting for keys %s", list);
    uint8_t st;
    struct store_reader r;
    FSDP_TRY(client_roundtrip(c, t + CLIENT_REPLY_MARGIN_S, what, &st, &r));
    if (st == STORE_ST_OK)
        return store_reader_done(&r) ? 0 : reply_malformed(c, what);
    if (st != STORE_ST_TIMEOUT)
        return status_error(c, st, &r, what);
    /* Name the keys that are still missing, which is what the user has to chase. */
    uint32_t n = store_reader_u32(&r);
    char missing[300];
    size_t off = 0;
    missing[0] = '\0';
    for (uint32_t i = 0; i < n && !r.bad; i++) {
        size_t klen;
        const uint8_t *k = store_reader_bytes(&r, &klen);
        if (off > 200) {
            snprintf(missing + off, sizeof missing - off, " and %u more", n - i);
            break;
        }
        off += (size_t)snprintf(missing + off, sizeof missing - off, "%s'%.*s'", i ? ", " : "",
                                klen > 64 ? 64 : (int)klen, (const char *)k);
    }
    return error_set(FSDP_ETIMEDOUT, "timed out after %.1f s waiting for keys at store %s: %u of %zu missing: %s",
                     t, c->addr, n, nkeys, missing);
}

int store_client_delete(struct store_client *c, const char *key, bool *existed)
{
    FSDP_TRY(check_key(key));
    char what[128];
    what_key(what, sizeof what, "deleting", key);
    store_buf_begin(&c->out, STORE_OP_DELETE);
    store_buf_put_str(&c->out, key);
    struct store_reader r;
    FSDP_TRY(simple_roundtrip(c, what, &r));
    uint8_t e = store_reader_u8(&r);
    if (!store_reader_done(&r))
        return reply_malformed(c, what);
    if (existed)
        *existed = e != 0;
    return 0;
}

int store_client_num_keys(struct store_client *c, int64_t *n)
{
    store_buf_begin(&c->out, STORE_OP_NUM_KEYS);
    struct store_reader r;
    FSDP_TRY(simple_roundtrip(c, "counting keys", &r));
    int64_t v = (int64_t)store_reader_u64(&r);
    if (!store_reader_done(&r))
        return reply_malformed(c, "counting keys");
    *n = v;
    return 0;
}

int store_client_append(struct store_client *c, const char *key, const void *value, size_t len)
{
    return key_value_op(c, STORE_OP_APPEND, "appending to", key, value, len);
}

int store_client_ping(struct store_client *c)
{
    store_buf_begin(&c->out, STORE_OP_PING);
    struct store_reader r;
    FSDP_TRY(simple_roundtrip(c, "pinging", &r));
    if (!store_reader_done(&r))
        return reply_malformed(c, "pinging");
    return 0;
}
