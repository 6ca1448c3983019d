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
    uint8_t op; /* WAIT or BARRIER */
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
    TIER_HANDSHAKE, /* NEW, VALIDATED, HELLO: not yet a client of either kind */
    TIER_TORCH,     /* PyTorch clients */
    TIER_COUNT,
    TIER_NONE = -1, /* authenticated (never counted), or not queued */
};

struct store_conn_queue {
    struct store_conn *head, *tail; /* head: idle longest */
};

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
    size_t need;      /* bytes the next request needs before it is worth parsing again */
    size_t inflight;  /* bytes of srv->unauth_inflight this connection's partial request holds */
    size_t held;      /* bytes PyTorch clients' entries charged to this connection hold */
    size_t watermark; /* the read high-watermark set on bev */
    uint8_t client_nonce[STORE_NONCE_MAX_BYTES], server_nonce[STORE_NONCE_BYTES];
    size_t client_nonce_len;
    char peer[INET6_ADDRSTRLEN + 8];
};

struct store_server {
    struct event_base *base;
    struct evconnlistener *listener;
    struct event *accept_resume; /* re-enables accepting after running out of descriptors */
    double accept_warned_s;      /* monotonic time of the last "accept failed" warning; 0 = none yet */
    unsigned long accept_quiet;  /* accept failures since then, not logged */
    struct event *stop_ev; /* activated from another thread: a loopbreak sent before the loop runs is lost */
    pthread_t thread;
    bool thread_started;
    struct store_table table;
    struct store_conn *conns;
    char *run_id;
    uint8_t key[STORE_KEY_BYTES];
    bool torch_off;
    size_t torch_bytes, torch_bytes_max, torch_conn_bytes_max;
    size_t unauth_inflight, unauth_inflight_max;
    size_t out_max;
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

/* ---- store_server_cap.c ---- */

/* Queues the connection by its state and time of its last request (call after accepting it and after each
 * request it completes); an authenticated one leaves the count. */
void store_server_cap_touch(struct store_conn *c);
/* Takes the connection out of the count (it is being freed). */
void store_server_cap_forget(struct store_conn *c);
/* Over the cap: the connection to close to make room (logged, at most once a second), else NULL. */
struct store_conn *store_server_cap_victim(struct store_server *s);

/* ---- store_server_auth.c: returns false when the connection must be closed after flushing ---- */

/* A request of a connection that is not yet a torch client nor authenticated. *handled is false when the
 * request is a torch client's first op, which the caller then runs as one. */
bool store_server_handshake(struct store_conn *c, const struct store_request *req, bool *handled);

/* ---- store_server_ops.c ---- */

/* Runs one request of a torch client or an authenticated one. */
bool store_server_op(struct store_conn *c, const struct store_request *req);
/* Unparks a waiter from every key it still waits for and frees it. */
void store_server_free_waiter(struct store_server *s, struct store_waiter *w);
/* The connection goes away: the entries it was charged for stay, charged to nobody. */
void store_server_forget_owner(struct store_server *s, struct store_conn *c);

#endif
