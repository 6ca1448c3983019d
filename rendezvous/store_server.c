/* The store server: one thread running its own event_base, so the launcher that hosts it keeps its main
 * loop; the listener, the connections, reading and parsing their requests and the limits on what a peer
 * can make the server hold live here, the handshakes in store_server_auth.c, the ops in
 * store_server_ops.c, what all of them share about a connection in store_server_conn.c, what connections
 * without the token hold in store_server_budget.c. Requests of a connection are answered in order: while
 * one waits (WAIT, BARRIER) the ones behind it stay unread, except a CANCEL_WAIT right behind it. */
#include "rendezvous/store.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "rendezvous/store_server_internal.h"

/* What a connection may have buffered of a request before a larger one is reserved: for authenticated
 * connections (trusted up to STORE_MAX_REQUEST_BYTES, never charged) and, smaller, for the others, whose
 * larger requests draw on their budget while they arrive. The latter window is the one cost of such a
 * connection outside the budget, so it is kept to c10d's usual request sizes. */
#define SMALL_REQUEST_BYTES (64u * 1024u)
#define UNAUTH_WINDOW_BYTES STORE_HANDSHAKE_MAX_BYTES

static void set_watermark(struct store_conn *c, size_t high)
{
    if (c->watermark != high) {
        bufferevent_setwatermark(c->bev, EV_READ, 0, high);
        c->watermark = high;
    }
}

static size_t default_watermark(const struct store_conn *c)
{
    return store_budget_counts(c) ? UNAUTH_WINDOW_BYTES : SMALL_REQUEST_BYTES;
}

/* ---- connection lifetime ---- */

static void release_inflight(struct store_conn *c)
{
    store_budget_sub(c->srv, c->inflight);
    c->inflight = 0;
}

static void conn_free(struct store_conn *c)
{
    struct store_server *s = c->srv;
    if (c->waiter)
        store_server_free_waiter(s, c->waiter);
    if (c->held)
        store_server_forget_owner(s, c);
    release_inflight(c);
    if (c->auth_waiting)
        __atomic_add_fetch(&s->auth_dropped, 1, __ATOMIC_RELAXED);
    store_throttle_auth_forget(c);
    store_server_cap_forget(c);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->stall_timer)
        event_free(c->stall_timer);
    if (c->bev) {
        store_budget_unwatch_output(c);
        bufferevent_free(c->bev);
    }
    free(c);
    store_budget_trim(s);
}

/* Lets the peer read why it is dropped before the socket goes. */
static void conn_close_after_flush(struct store_conn *c)
{
    c->closing = true;
    if (c->waiter)
        store_server_free_waiter(c->srv, c->waiter);
    release_inflight(c);
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
    struct store_conn *c = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        if (c->waiter)
            log_debug("store: %s disconnected while waiting", c->peer);
        conn_free(c);
    } else if (what & BEV_EVENT_TIMEOUT) {
        /* the write timeout of a connection without the token: its peer let replies sit unread */
        store_server_log_limited(&c->srv->out_log, "store: closing %s: its replies were not read for %.1f s", c->peer,
                                 (double)c->srv->idle_tv.tv_sec + c->srv->idle_tv.tv_usec / 1e6);
        conn_free(c);
    }
}

static void conn_stall_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct store_conn *c = arg;
    if (c->auth_waiting) {
        /* the handshake's deadline passed while its AUTH waited its turn: closed unchecked */
        store_server_log_limited(&c->srv->auth_wait_log, "store: closing %s: its AUTH waited %.1f s for its turn "
                                 "(the throttle on AUTHs; %zu waiting)", c->peer,
                                 clock_now_s() - c->auth_waiting_since_s, c->srv->auth_waiting);
        conn_free(c);
        return;
    }
    if (!c->closing)
        log_warn("store: closing %s: %s within %.1f s", c->peer,
                 store_server_greeted(c) ? "a started request was not completed" : "no handshake",
                 (double)c->srv->idle_tv.tv_sec + c->srv->idle_tv.tv_usec / 1e6);
    conn_free(c);
}

/* A started request must be finished within the idle timeout (armed once per request, so trickling bytes
 * does not extend it); before the handshake, the handshake deadline runs instead. */
static void arm_stall(struct store_conn *c)
{
    if (store_server_greeted(c) && !event_pending(c->stall_timer, EV_TIMEOUT, NULL))
        event_add(c->stall_timer, &c->srv->idle_tv);
}

/* A request of `need` bytes is coming: let the input buffer hold it. Past its read window, a connection
 * without the token reserves the request from the budget all of them share (held until the request is
 * done); returns false (connection closed) when it does not fit. */
static bool reserve(struct store_conn *c, size_t need)
{
    if (need <= c->watermark)
        return true;
    if (store_budget_counts(c)) {
        if (!store_budget_take(c, need - c->inflight, "a request being received")) {
            conn_close_after_flush(c);
            return false;
        }
        c->inflight = need;
    }
    set_watermark(c, need);
    return true;
}

static void conn_process(struct store_conn *c)
{
    struct store_server *s = c->srv;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    while (!c->closing && !c->auth_waiting) {
        size_t avail = evbuffer_get_length(in);
        if (avail == 0) {
            if (store_server_greeted(c))
                event_del(c->stall_timer);
            return;
        }
        if (avail < c->need) {
            arm_stall(c);
            return;
        }
        if (!c->waiter && evbuffer_get_length(bufferevent_get_output(c->bev)) > s->out_max) {
            /* A peer that sends requests but does not read the replies stops being read. */
            c->out_blocked = true;
            return;
        }
        uint8_t *p = evbuffer_pullup(in, (ssize_t)avail);
        if (!p) {
            conn_free(c);
            return;
        }
        struct store_request req;
        enum store_parse_status st = store_request_parse(p, avail, store_server_limits(c), &req);
        if (st == STORE_PARSE_NEED_MORE) {
            if (!reserve(c, (size_t)req.size))
                return;
            c->need = (size_t)req.size;
            arm_stall(c);
            return;
        }
        if (st == STORE_PARSE_BAD) {
            if (req.op == STORE_OP_HELLO || req.op == STORE_OP_AUTH)
                c->fsdp_client = true; /* one of ours: it reads a status */
            store_server_refuse(c, STORE_ST_PROTO, "%s", req.error);
            conn_close_after_flush(c);
            return;
        }
        if (c->waiter && req.op != STORE_OP_CANCEL_WAIT)
            return; /* answered in order: it waits behind the WAIT */
        c->need = 1;
        /* Given back before the op, which may store a copy of it: the request's own bytes live on only
         * until the drain below, one request at a time (the server is one thread). */
        release_inflight(c);
        if (store_server_greeted(c))
            event_del(c->stall_timer);
        bool keep, handled = true;
        if (c->state == CONN_TORCH || c->state == CONN_FSDP)
            keep = store_server_op(c, &req);
        else if ((keep = store_server_handshake(c, &req, &handled)) && !handled)
            keep = store_server_op(c, &req);
        store_server_cap_touch(c);
        evbuffer_drain(in, (size_t)req.size);
        set_watermark(c, default_watermark(c));
        if (!keep) {
            conn_close_after_flush(c);
            return;
        }
    }
}

static void conn_read_cb(struct bufferevent *bev, void *arg)
{
    (void)bev;
    conn_process(arg);
}

static void conn_write_cb(struct bufferevent *bev, void *arg)
{
    struct store_conn *c = arg;
    size_t left = evbuffer_get_length(bufferevent_get_output(bev));
    if (c->closing) {
        if (left == 0)
            conn_free(c);
        return;
    }
    if (c->out_blocked && left <= c->srv->out_max / 2) {
        c->out_blocked = false;
        conn_process(c);
    }
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
    (void)l;
    (void)salen;
    struct store_server *s = arg;
    struct store_conn *c = calloc(1, sizeof *c);
    if (!c) {
        evutil_closesocket(fd);
        return;
    }
    c->srv = s;
    c->state = CONN_NEW;
    c->tier = TIER_NONE;
    c->need = 1;
    c->peer_family = -1;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
        memcpy(c->peer_addr, &in->sin_addr, 4);
        c->peer_family = AF_INET;
    } else if (sa->sa_family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
        memcpy(c->peer_addr, &in6->sin6_addr, 16);
        c->peer_family = AF_INET6;
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
    store_budget_watch_output(c);
    /* Counted before anything is known of it; past the cap someone idle makes room (store_server_cap.c):
     * refusing the newcomer could lock out a rank of the job. */
    store_server_cap_touch(c);
    struct store_conn *victim = store_server_cap_victim(s, c);
    bool self = victim == c; /* when nothing else may go */
    if (victim)
        conn_free(victim);
    if (self)
        return;
    /* Bounds what one peer can make us buffer before it has said who it is. */
    set_watermark(c, default_watermark(c));
    bufferevent_setwatermark(c->bev, EV_WRITE, s->out_max / 2, 0);
    /* Unsent replies hold the budget: a peer without the token that reads none of them for the idle
     * timeout is closed (the job's connections lose this timeout at AUTH). */
    bufferevent_set_timeouts(c->bev, NULL, &s->idle_tv);
    bufferevent_setcb(c->bev, conn_read_cb, conn_write_cb, conn_event_cb, c);
    if (bufferevent_enable(c->bev, EV_READ | EV_WRITE) != 0 || event_add(c->stall_timer, &s->idle_tv) != 0)
        conn_free(c);
}

/* At most one "accept failed" warning this often (seconds). */
#define ACCEPT_WARN_INTERVAL_S 60.0

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
    /* The pause below retries every 100 ms for as long as descriptors stay short: one warning a minute
     * (with the count of the ones not logged) says it as well without filling the log. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    if (s->accept_warned_s == 0 || now - s->accept_warned_s >= ACCEPT_WARN_INTERVAL_S) {
        if (s->accept_quiet)
            log_warn("store: accept failed: %s (raise the open-files limit for more clients); %lu more since the "
                     "last such warning", evutil_socket_error_to_string(err), s->accept_quiet);
        else
            log_warn("store: accept failed: %s (raise the open-files limit for more clients)",
                     evutil_socket_error_to_string(err));
        s->accept_warned_s = now;
        s->accept_quiet = 0;
    } else {
        s->accept_quiet++;
    }
    struct timeval pause = {.tv_sec = 0, .tv_usec = 100 * 1000};
    if (evconnlistener_disable(l) == 0 && event_add(s->accept_resume, &pause) != 0)
        evconnlistener_enable(l);
}

/* The throttle lets the next waiting AUTHs be checked (store_server_throttle.c). */
static void auth_turn_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct store_server *s = arg;
    struct store_conn *c;
    while ((c = store_throttle_auth_next(s))) {
        bool keep = store_server_auth_check(c);
        store_server_cap_touch(c);
        if (!keep) {
            conn_close_after_flush(c);
            continue;
        }
        store_server_resume(c);
    }
}

/* Every client holds one socket here; the default soft limit (1024) is below the 1024 clients we promise.
 * Returns the soft limit now in force (0 when unknown). */
static rlim_t raise_nofile_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit up = {.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0)
            return up.rlim_cur;
        log_debug("store: could not raise the open-files limit: %s", strerror(errno));
    }
    return rl.rlim_cur;
}

/* The cap on connections without the token: asked for (or the default), but at most half the open-files
 * limit, so that it is met, and idle ones closed, before accept() runs out of descriptors and the job's
 * ranks with it; the other half is for authenticated connections and the hosting process. */
static size_t unauth_cap(size_t asked, rlim_t nofile)
{
    size_t cap = asked ? asked : STORE_MAX_UNAUTH_CONNS;
    size_t half = nofile == 0 || nofile == RLIM_INFINITY ? SIZE_MAX : (size_t)nofile / 2;
    if (cap > half && cap > 16) {
        size_t low = half > 16 ? half : 16;
        if (asked)
            log_warn("store: keeps at most %zu connections without the job's token (half the open-files limit "
                     "%llu), fewer than the %zu asked for: raise the limit (ulimit -n) for a job with this many "
                     "PyTorch workers", low, (unsigned long long)nofile, asked);
        cap = low;
    }
    return cap;
}

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
    if (err == EADDRNOTAVAIL)
        return error_set(FSDP_EINVAL,
                         "cannot listen on %s:%d for the store: %s is not an address of this host (give "
                         "--local_addr an address of this host, or 0.0.0.0 for every interface)",
                         host, port, host);
    return error_set(FSDP_EIO, "cannot listen on %s:%d for the store: %s", host, port, strerror(err));
}

static size_t or_default(size_t v, size_t def) { return v ? v : def; }

int store_server_start(const struct store_server_options *opts, struct store_server **out)
{
    *out = NULL;
    if (!opts || !opts->run_id)
        return error_set(FSDP_EINVAL, "store_server_start: options with a run id are required");
    if (opts->port < 0 || opts->port > 65535)
        return error_set(FSDP_EINVAL, "store port %d is outside 0..65535", opts->port);
    rlim_t nofile = raise_nofile_limit();
    store_budget_init_allocator();

    struct store_server *s = calloc(1, sizeof *s);
    if (!s)
        return error_set(FSDP_ENOMEM, "out of memory starting the store");
    store_buf_init(&s->out);
    double idle = opts->idle_timeout_s > 0 ? opts->idle_timeout_s : 10.0;
    s->idle_tv.tv_sec = (time_t)idle;
    s->idle_tv.tv_usec = (suseconds_t)((idle - (double)s->idle_tv.tv_sec) * 1e6);
    s->run_id = strdup(opts->run_id);
    store_auth_key(opts->run_id, opts->secret, s->key);
    s->torch_off = opts->torch_off;
    s->unauth_bytes_max = or_default(opts->unauth_bytes_max, STORE_UNAUTH_BYTES_MAX);
    s->torch_conn_bytes_max = or_default(opts->torch_conn_bytes_max, STORE_TORCH_CONN_BYTES_MAX);
    s->out_max = or_default(opts->out_max, STORE_OUT_MAX);
    s->max_unauth_conns = unauth_cap(opts->max_unauth_conns, nofile);
    int fd = -1;
    int rc = 0;
    if (!s->run_id || store_table_init(&s->table) != 0) {
        rc = error_set(FSDP_ENOMEM, "out of memory starting the store");
        goto fail;
    }
    FSDP_TRY_GOTO(bind_listener(opts->bind_addr, opts->port, &fd), rc, fail);
    if ((rc = evloop_init(&s->loop, "the store")) != 0) {
        close(fd);
        goto fail;
    }
    s->base = s->loop.base;
    s->accept_resume = evtimer_new(s->base, accept_resume_cb, s);
    s->auth_ev = evtimer_new(s->base, auth_turn_cb, s);
    /* backlog 0: the socket already listens with 4096; -1 would make libevent listen again with 128, too
     * few for 1024 clients connecting at once */
    if (s->accept_resume && s->auth_ev)
        s->listener = evconnlistener_new(s->base, accept_cb, s, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
    if (!s->listener) {
        close(fd);
        rc = error_set(FSDP_EIO, "libevent could not set up the store listener");
        goto fail;
    }
    evconnlistener_set_error_cb(s->listener, accept_error_cb);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    snprintf(s->addr, sizeof s->addr, "%s:%d", opts->bind_addr && *opts->bind_addr ? opts->bind_addr : "0.0.0.0",
             s->port);
    /* The server thread takes no signal (evloop.h): a write to a dead peer gives EPIPE, not SIGPIPE. */
    FSDP_TRY_GOTO(evloop_start(&s->loop, "the store", NULL, NULL), rc, fail);
    log_info("store: listening on %s%s", s->addr, s->torch_off ? " (PyTorch TCPStore clients refused)" : "");
    *out = s;
    return 0;
fail:
    store_server_stop(s);
    return rc;
}

int store_server_port(const struct store_server *s) { return s ? s->port : -1; }

void store_server_stop(struct store_server *s)
{
    if (!s)
        return;
    evloop_stop(&s->loop);
    while (s->conns)
        conn_free(s->conns);
    if (s->listener)
        evconnlistener_free(s->listener);
    if (s->accept_resume)
        event_free(s->accept_resume);
    if (s->trim_ev)
        event_free(s->trim_ev);
    if (s->auth_ev)
        event_free(s->auth_ev);
    evloop_free(&s->loop);
    store_table_free(&s->table);
    store_buf_free(&s->out);
    free(s->run_id);
    free(s);
}
