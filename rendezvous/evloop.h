/* A libevent event_base run by a thread of its own: for a server inside a process whose main thread has
 * its own loop (the store server, the launcher's status page). One home for what both need: libevent made
 * thread-safe once per process, a stop that works from any thread even before the loop runs, a thread
 * that takes no signal (the hosting program handles them on its main thread, and a write to a dead peer
 * gives EPIPE instead of killing it with SIGPIPE). */
#ifndef FSDP_RENDEZVOUS_EVLOOP_H
#define FSDP_RENDEZVOUS_EVLOOP_H

#include <pthread.h>
#include <stdbool.h>

struct event_base;
struct event;

struct evloop {
    struct event_base *base;
    struct event *stop_ev; /* activated from another thread: a loopbreak sent before the loop runs is lost */
    pthread_t thread;
    bool started;
    void (*first)(void *); /* run on the loop's thread before it dispatches; NULL = nothing */
    void *arg;
};

/* Makes libevent thread-safe (once per process) and creates the base; what (e.g. "the store") names the
 * server in the error. Returns 0 or a negative enum fsdp_error with error_message() set. On failure,
 * evloop_free still frees what was made. */
int evloop_init(struct evloop *l, const char *what);
/* Starts the thread (every signal blocked on it); first(arg), if given, runs on it before the loop. */
int evloop_start(struct evloop *l, const char *what, void (*first)(void *), void *arg);
/* Stops the loop and joins its thread (nothing when it was not started); the base stays for the caller
 * to free what it put on it. */
void evloop_stop(struct evloop *l);
/* Frees the base (after evloop_stop and after the caller freed its events). */
void evloop_free(struct evloop *l);

#endif
