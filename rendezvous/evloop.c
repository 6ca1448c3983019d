/* An event_base on a thread of its own (evloop.h): start, stop, free. */
#include "rendezvous/evloop.h"

#include <signal.h>
#include <string.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "common/error.h"

static pthread_once_t g_threads_once = PTHREAD_ONCE_INIT;
static int g_threads_rc;
static void threads_init(void) { g_threads_rc = evthread_use_pthreads(); }

static void stop_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    event_base_loopbreak(((struct evloop *)arg)->base);
}

int evloop_init(struct evloop *l, const char *what)
{
    memset(l, 0, sizeof *l);
    pthread_once(&g_threads_once, threads_init);
    if (g_threads_rc != 0)
        return error_set(FSDP_EIO, "libevent has no pthreads support for %s", what);
    l->base = event_base_new();
    if (l->base)
        l->stop_ev = event_new(l->base, -1, 0, stop_cb, l);
    if (!l->stop_ev)
        return error_set(FSDP_EIO, "libevent could not set up %s", what);
    return 0;
}

static void *loop_thread(void *arg)
{
    struct evloop *l = arg;
    if (l->first)
        l->first(l->arg);
    event_base_dispatch(l->base);
    return NULL;
}

int evloop_start(struct evloop *l, const char *what, void (*first)(void *), void *arg)
{
    l->first = first;
    l->arg = arg;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int prc = pthread_create(&l->thread, NULL, loop_thread, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (prc != 0)
        return error_set(FSDP_EIO, "cannot start %s's thread: %s", what, strerror(prc));
    l->started = true;
    return 0;
}

void evloop_stop(struct evloop *l)
{
    if (!l->started)
        return;
    event_active(l->stop_ev, EV_READ, 0);
    pthread_join(l->thread, NULL);
    l->started = false;
}

void evloop_free(struct evloop *l)
{
    if (l->stop_ev)
        event_free(l->stop_ev);
    if (l->base)
        event_base_free(l->base);
    l->stop_ev = NULL;
    l->base = NULL;
}
