/* The one budget of what connections without the job's token can make the server hold. Nobody can tell a
 * PyTorch job's worker from a hostile client, so everything such a connection makes the server keep
 * beyond a fixed read window is charged to one counter with one maximum (STORE_UNAUTH_BYTES_MAX):
 *   - PyTorch clients' keys, values and queued items (store_server_ops.c charges them on each write);
 *   - their waiting requests: the waiter and, per key, a placeholder entry (store_server_ops.c);
 *   - a request larger than the read window while it arrives (store_server.c reserves it);
 *   - unsent replies: the output buffer's length, followed by a callback as it grows and drains.
 * Something that does not fit is refused and its connection closed, as c10d's server closes a client
 * whose request fails; a reply is checked before it is built, so a refused one never exists. What a
 * connection holds is given back when it goes (keys stay: they are the store's data). Authenticated
 * connections are never charged, so a hostile client that fills the budget cannot starve the job.
 *
 * The counters are written on the server thread only; store_server_stats reads them from any thread, so
 * every access is atomic (relaxed: each is a figure of its own). */
#include <malloc.h>
#include <pthread.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "rendezvous/store_server_internal.h"

/* Freed memory is given back to the system this long after a connection that drew on the budget went. */
#define TRIM_DELAY_S 0.2

static size_t load(const size_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

bool store_budget_counts(const struct store_conn *c) { return c->state != CONN_FSDP; }

void store_budget_add(struct store_server *s, size_t n)
{
    size_t now = __atomic_add_fetch(&s->unauth_bytes, n, __ATOMIC_RELAXED);
    if (now > load(&s->unauth_bytes_peak))
        __atomic_store_n(&s->unauth_bytes_peak, now, __ATOMIC_RELAXED);
}

void store_budget_sub(struct store_server *s, size_t n) { __atomic_sub_fetch(&s->unauth_bytes, n, __ATOMIC_RELAXED); }

bool store_budget_room(struct store_conn *c, size_t n, const char *what)
{
    struct store_server *s = c->srv;
    if (!store_budget_counts(c))
        return true;
    size_t used = load(&s->unauth_bytes);
    if (n <= s->unauth_bytes_max && used <= s->unauth_bytes_max - n)
        return true;
    __atomic_add_fetch(&s->budget_refusals, 1, __ATOMIC_RELAXED);
    return store_server_refuse_limited(c, &s->budget_log, STORE_ST_TOO_LARGE,
                                       "%s needs %zu bytes, more than is left of the budget of connections without "
                                       "the job's token (%zu of %zu bytes held)", what, n, used, s->unauth_bytes_max);
}

bool store_budget_take(struct store_conn *c, size_t n, const char *what)
{
    if (!store_budget_room(c, n, what))
        return false;
    if (store_budget_counts(c))
        store_budget_add(c->srv, n);
    return true;
}

/* Called by libevent on every change of the output buffer, at once (not deferred). */
static void output_changed(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    (void)buf;
    struct store_conn *c = arg;
    size_t now = info->orig_size + info->n_added - info->n_deleted;
    if (now > c->out_charged)
        store_budget_add(c->srv, now - c->out_charged);
    else
        store_budget_sub(c->srv, c->out_charged - now);
    c->out_charged = now;
}

void store_budget_watch_output(struct store_conn *c)
{
    c->out_watch = evbuffer_add_cb(bufferevent_get_output(c->bev), output_changed, c);
}

void store_budget_unwatch_output(struct store_conn *c)
{
    if (c->out_watch)
        evbuffer_remove_cb_entry(bufferevent_get_output(c->bev), c->out_watch);
    c->out_watch = NULL;
    store_budget_sub(c->srv, c->out_charged);
    c->out_charged = 0;
}

/* Unsent replies are written in pieces that get 64 KiB chains (store_server_conn.c), requests arrive in
 * chains of up to 16 KiB and are made contiguous in one allocation, waits park keys of up to 8 KiB. glibc
 * serves 64 KiB and more from its heaps once a large block has been freed (its mmap threshold grows), and
 * a flood's churn then leaves tens of MiB free but resident in the server thread's arena between trims
 * (the load test's launcher peaked 99-112 MB against 70-74 with this). A fixed threshold of 64 KiB gives
 * each such block its own mapping, returned to the system when freed, so what the budget counts is what
 * is resident. Process-wide: set by the first server started (a launcher hosts one). */
#define MMAP_THRESHOLD_BYTES (64 * 1024)

static pthread_once_t g_allocator_once = PTHREAD_ONCE_INIT;

static void allocator_init(void)
{
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
#endif
}

void store_budget_init_allocator(void) { pthread_once(&g_allocator_once, allocator_init); }

static void trim_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

/* A flood of big replies or waits leaves the server thread's malloc arena large after the connections
 * went; glibc keeps it unless asked. Asking walks the free lists, so only once the budget was drawn on,
 * and once for a burst of closes: TRIM_DELAY_S after the first of them. */
void store_budget_trim(struct store_server *s)
{
    if (load(&s->unauth_bytes_peak) < (1u << 20))
        return;
    if (!s->trim_ev && !(s->trim_ev = evtimer_new(s->base, trim_cb, s)))
        return;
    struct timeval tv = {.tv_sec = 0, .tv_usec = (suseconds_t)(TRIM_DELAY_S * 1e6)};
    if (!event_pending(s->trim_ev, EV_TIMEOUT, NULL))
        event_add(s->trim_ev, &tv);
}

void store_server_stats(const struct store_server *s, struct store_server_stats *out)
{
    *out = (struct store_server_stats){0};
    if (!s)
        return;
    out->unauth_bytes = load(&s->unauth_bytes);
    out->unauth_bytes_max = s->unauth_bytes_max;
    out->unauth_bytes_peak = load(&s->unauth_bytes_peak);
    out->budget_refusals = __atomic_load_n(&s->budget_refusals, __ATOMIC_RELAXED);
    out->auth_failures = __atomic_load_n(&s->auth_failures, __ATOMIC_RELAXED);
    out->auth_delayed = __atomic_load_n(&s->auth_delayed, __ATOMIC_RELAXED);
    out->auth_dropped = __atomic_load_n(&s->auth_dropped, __ATOMIC_RELAXED);
    out->auth_waiting = load(&s->auth_waiting);
}
