/* Internals shared by the parts of the store server: store_server.c (thread, listener, connections, reading
 * requests, limits on memory) calls store_server_auth.c (the handshakes) and store_server_ops.c (c10d's ops
 * and their waiters); all of them call store_server_conn.c (a connection's limits, writes, refusals). Not
 * part of the public API. */
#ifndef FSDP_RENDEZVOUS_STORE_SERVER_INTERNAL_H
#define FSDP_RENDEZVOUS_STORE_SERVER_INTERNAL_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/time.h>

#include "rendezvous/evloop.h"
#include "rendezvous/store.h"
#include "rendezvous/store_auth.h"
#include "rendezvous/store_protocol.h"
#include "rendezvous/store_table.h"

struct store_conn;
struct store_waiter;

struct store_wait_link {
    struct store_wait_link *prev, *next; /* in entry->waiters */
    struct store_entry *entry;           /* NULL once woken */
    struct store_waiter *waiter;
};

struct store_waiter {
    struct store_conn *conn;
    size_t charged; /* bytes of the budget of connections without the token it holds (0: authenticated) */
    uint8_t op;     /* WAIT or BARRIER */
    size_t missing;
    size_t nlinks;
    struct store_wait_link links[];
};

enum store_conn_state {
    CONN_NEW,       /* nothing yet: only VALIDATE is accepted */
    CONN_VALIDATED, /* VALIDATE (and PINGs): HELLO starts fsdpc's handshake, any other op makes a torch client */
    CONN_HELLO,     /* HELLO answered: only AUTH is accepted */
    CONN_TORCH,     /* a PyTorch TCPStore client: c10d's replies, PyTorch's key space, its limits */
    CONN_FSDP,      /* authenticated: a status byte before every reply, fsdpc's key space */
};

/* The queues of connections without the job's token, each in the order of their last complete request
 * (store_server_cap.c): who makes room when the cap is reached. */
enum store_conn_tier {
    TIER_SILENT,    /* NEW: nothing valid received yet */
    TIER_HANDSHAKE, /* VALIDATED, HELLO: on the way, not yet a client of either kind */
    TIER_AUTH,      /* its AUTH waits for the throttle (store_server_throttle.c) */
    TIER_TORCH,     /* PyTorch clients */
    TIER_COUNT,
    TIER_NONE = -1, /* authenticated (never counted), or not queued */
};

struct store_conn_queue {
    struct store_conn *head, *tail; /* head: idle longest */
};

/* A log line that may come once per connection of a flood: logged at most once a second, with the count of
 * the ones left out since. */
struct store_log_limit {
    double last_s; /* 0 = never logged */
    unsigned long quiet;
};

/* Failed AUTHs a source may have checked: a token bucket (store_server_throttle.c). */
struct store_auth_bucket {
    double tokens; /* an AUTH is checked only while this is 1 or more */
    double at_s;   /* when tokens was last brought up to date */
};

struct store_auth_peer {
    uint8_t addr[16]; /* IPv4 in the first 4 bytes, or IPv6 */
    int family;       /* 0: slot unused */
    struct store_auth_bucket bucket;
    struct store_conn *head, *tail; /* its AUTHs waiting for their turn, oldest first */
    size_t queued;
};

#define STORE_AUTH_PEERS 256

struct store_conn {
    struct store_server *srv;
    struct store_conn *prev, *next;
    struct store_conn *idle_prev, *idle_next; /* in srv->idle[tier] */
    int tier;                                 /* enum store_conn_tier */
    double active_s;                          /* accepted, or its last complete request (monotonic) */
    struct bufferevent *bev;
    /* before the handshake: its deadline; then: the deadline for finishing a started request; while
     * closing: for the peer to read the last reply */
    struct event *stall_timer;
    struct store_waiter *waiter; /* a WAIT / BARRIER not answered yet */
    enum store_conn_state state;
    bool closing;     /* the last reply is being flushed, then the connection goes */
    bool out_blocked; /* unsent replies over the limit: requests wait until they drain */
    bool fsdp_client; /* sent HELLO: replies (refusals too) start with a status byte */
    bool auth_waiting; /* its AUTH waits for the throttle, unchecked: nothing more is read */
    size_t need;      /* bytes the next request needs before it is worth parsing again */
    size_t inflight;  /* bytes of the budget a request larger than the read window holds while it arrives */
    size_t out_charged;                   /* bytes of the budget its unsent replies hold */
    struct evbuffer_cb_entry *out_watch;  /* charges them as the output buffer grows and drains */
    uint8_t peer_addr[16];                /* the peer's address, for the AUTH throttle */
    int peer_family;
    struct store_auth_peer *auth_peer;         /* while its AUTH waits or is being checked */
    struct store_conn *auth_prev, *auth_next;  /* in auth_peer's queue */
    double auth_waiting_since_s;
    uint8_t auth_mac[STORE_MAC_BYTES];         /* the waiting AUTH's MAC */
    bool auth_mac_ok;                          /* it had the MAC's length */
    size_t held;      /* bytes PyTorch clients' entries charged to this connection hold */
    size_t watermark; /* the read high-watermark set on bev */
    uint8_t client_nonce[STORE_NONCE_MAX_BYTES], server_nonce[STORE_NONCE_BYTES];
    size_t client_nonce_len;
    char peer[INET6_ADDRSTRLEN + 8];
};

struct store_server {
    struct evloop loop;
    struct event_base *base; /* loop.base */
    struct evconnlistener *listener;
    struct event *accept_resume; /* re-enables accepting after running out of descriptors */
    double accept_warned_s;      /* monotonic time of the last "accept failed" warning; 0 = none yet */
    unsigned long accept_quiet;  /* accept failures since then, not logged */
    struct store_table table;
    struct store_conn *conns;
    char *run_id;
    uint8_t key[STORE_KEY_BYTES];
    bool torch_off;
    /* The budget of connections without the token (store_server_budget.c): read from other threads by
     * store_server_stats, so these are touched with atomics. */
    size_t unauth_bytes, unauth_bytes_max, unauth_bytes_peak;
    uint64_t budget_refusals, auth_failures, auth_delayed, auth_dropped;
    size_t auth_waiting; /* AUTHs waiting for the throttle now */
    struct store_log_limit budget_log, auth_log, auth_wait_log, out_log;
    struct event *trim_ev; /* gives freed memory back to the system after a burst of closes */
    size_t torch_conn_bytes_max;
    size_t out_max;
    /* the AUTH throttle (store_server_throttle.c) */
    struct store_auth_bucket auth_all;
    struct store_auth_peer auth_peers[STORE_AUTH_PEERS];
    size_t auth_turn;       /* the slot whose waiting AUTH goes next, round robin */
    struct event *auth_ev;  /* when the next waiting AUTH may be checked (store_server.c's callback) */
    /* the cap on connections without the token (store_server_cap.c) */
    struct store_conn_queue idle[TIER_COUNT];
    size_t unauth_conns, max_unauth_conns;
    double cap_warned_s;      /* the last "cap" line; 0 = none yet */
    unsigned long cap_quiet;  /* connections closed for the cap since, not logged */
    struct timeval idle_tv;
    int port;
    char addr[INET6_ADDRSTRLEN + 8];
    struct store_buf out; /* reply scratch: the loop is single-threaded */
};

/* ---- store_server_conn.c ---- */

/* Limits of the requests a connection may send in its state. */
const struct store_parse_limits *store_server_limits(const struct store_conn *c);
/* Queues bytes for the peer. */
void store_server_write(struct store_conn *c, const void *p, size_t n);
/* Reads the connection's next requests on the next loop turn (after its wait ended). */
void store_server_resume(struct store_conn *c);
/* Is the connection past its handshake (a torch client, or authenticated)? */
bool store_server_greeted(const struct store_conn *c);
/* Sends a refusal: to an fsdpc client (or during its handshake) as status + message, to others nothing;
 * logs why. Returns false (close the connection). */
bool store_server_refuse(struct store_conn *c, uint8_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Logs like log_warn, at most once a second per limiter; a line says how many were left out before it. */
void store_server_log_limited(struct store_log_limit *lim, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* store_server_refuse, its log line through the limiter. */
bool store_server_refuse_limited(struct store_conn *c, struct store_log_limit *lim, uint8_t status, const char *fmt,
                                 ...) __attribute__((format(printf, 4, 5)));

/* ---- store_server_budget.c: what connections without the token make the server hold ---- */

/* Is c a connection whose bytes count against the budget (not authenticated)? */
bool store_budget_counts(const struct store_conn *c);
/* Charges n bytes for c if it counts and they fit; else, if it counts, refuses it (logged, limited) naming
 * what did not fit and returns false: the caller closes it. Authenticated connections always get true. */
bool store_budget_take(struct store_conn *c, size_t n, const char *what);
/* Charges n bytes without a check (for what cannot be refused any more, or has been checked). */
void store_budget_add(struct store_server *s, size_t n);
void store_budget_sub(struct store_server *s, size_t n);
/* Would n more bytes fit? (For a reply: it is charged when written, by the output watch.) */
bool store_budget_room(struct store_conn *c, size_t n, const char *what);
/* Starts charging c's unsent replies (after accepting it). */
void store_budget_watch_output(struct store_conn *c);
/* Stops charging c's unsent replies and gives back what they held (it authenticated, or is being freed). */
void store_budget_unwatch_output(struct store_conn *c);
/* Sets the allocator up so that large freed blocks go back to the system at once (once per process). */
void store_budget_init_allocator(void);
/* After a connection without the token went: gives freed memory back to the system now and then. */
void store_budget_trim(struct store_server *s);

/* ---- store_server_throttle.c: how fast AUTHs are checked, per source address and in all ---- */

/* c's AUTH came: true when it may be checked now (then call store_throttle_auth_done with the verdict);
 * else it waits in its source's queue (c->auth_waiting) and s->auth_ev is armed. */
bool store_throttle_auth_admit(struct store_conn *c);
/* c's AUTH was checked: a failure takes its tokens. */
void store_throttle_auth_done(struct store_conn *c, bool failed);
/* The next waiting AUTH whose turn it is (out of its queue; check it, then store_throttle_auth_done), or
 * NULL, with s->auth_ev armed for when the next one may go. */
struct store_conn *store_throttle_auth_next(struct store_server *s);
/* c goes away: out of its queue. */
void store_throttle_auth_forget(struct store_conn *c);
/* The newest waiting AUTH of the source with the most of them (to make room at the cap), or NULL. */
struct store_conn *store_throttle_auth_crowded(struct store_server *s);

/* ---- store_server_cap.c ---- */

/* Queues the connection by its state and time of its last request (call after accepting it and after each
 * request it completes); an authenticated one leaves the count. */
void store_server_cap_touch(struct store_conn *c);
/* Takes the connection out of the count (it is being freed). */
void store_server_cap_forget(struct store_conn *c);
/* Over the cap after accepting newcomer: the connection to close to make room (logged, at most once a
 * second; the newcomer itself when nothing else may go), else NULL. */
struct store_conn *store_server_cap_victim(struct store_server *s, struct store_conn *newcomer);

/* ---- store_server_auth.c: returns false when the connection must be closed after flushing ---- */

/* A request of a connection that is not yet a torch client nor authenticated. *handled is false when the
 * request is a torch client's first op, which the caller then runs as one. */
bool store_server_handshake(struct store_conn *c, const struct store_request *req, bool *handled);
/* Checks the AUTH that waited on c for the throttle (its MAC is in c): answers it; returns false when the
 * connection must be closed after flushing (a wrong MAC). */
bool store_server_auth_check(struct store_conn *c);

/* ---- store_server_ops.c ---- */

/* Runs one request of a torch client or an authenticated one. */
bool store_server_op(struct store_conn *c, const struct store_request *req);
/* Unparks a waiter from every key it still waits for and frees it. */
void store_server_free_waiter(struct store_server *s, struct store_waiter *w);
/* The connection goes away: the entries it was charged for stay, charged to nobody. */
void store_server_forget_owner(struct store_server *s, struct store_conn *c);

#endif
