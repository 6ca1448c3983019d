/* Internals shared by the two halves of the store server: store_server.c (thread, listener, connections,
 * framing) and store_server_ops.c (handshake, operations, waiters). Not part of the public API. */
#ifndef FSDP_RENDEZVOUS_STORE_SERVER_INTERNAL_H
#define FSDP_RENDEZVOUS_STORE_SERVER_INTERNAL_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/time.h>

#include "rendezvous/store.h"
#include "rendezvous/store_protocol.h"
#include "rendezvous/store_table.h"

struct store_conn;
struct store_waiter;

struct store_wait_link {
    struct store_wait_link *prev, *next; /* in entry->waiters */
    struct store_entry *entry;           /* NULL once the key arrived */
    struct store_waiter *waiter;
};

struct store_waiter {
    struct store_conn *conn;
    uint8_t op; /* GET or WAIT */
    size_t missing;
    size_t nlinks;
    struct event *timer;
    struct store_wait_link links[];
};

struct store_conn {
    struct store_server *srv;
    struct store_conn *prev, *next;
    struct bufferevent *bev;
    struct event *stall_timer; /* handshake deadline, then: deadline for finishing a started frame */
    struct store_waiter *waiter;
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
    struct store_conn *conns;
    char *run_id;
    char *secret;
    struct timeval idle_tv;
    int port;
    char addr[INET6_ADDRSTRLEN + 8];
    struct store_buf out; /* reply scratch: the loop is single-threaded */
};

/* Answers one complete frame of c (payload without the length field). Returns false when the connection
 * must be closed once the reply already queued has been flushed. */
bool store_server_handle_frame(struct store_conn *c, const uint8_t *payload, size_t n);
/* Unparks a waiter from every key it still waits for and frees it (its connection is going away). */
void store_server_free_waiter(struct store_server *s, struct store_waiter *w);

#endif
