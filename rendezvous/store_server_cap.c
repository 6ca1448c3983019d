/* The cap on connections that have not proven the job's token, and who makes room when it is reached.
 *
 * Every connection starts without the token, so nobody can tell a rank of the job from a hostile client
 * at accept time: refusing newcomers at the cap would lock the job out as surely as running out of
 * descriptors does. So a newcomer is always accepted, and when that takes the count past the cap the
 * server closes the connection that is the least likely to be the job's and the most idle:
 *   1. one still in its handshake (nothing sent, or only VALIDATE and PINGs, or HELLO without AUTH) that
 *      has been idle for SUSPECT_IDLE_S: a real client, fsdpc's or PyTorch's, sends its next handshake
 *      request within a round trip, so this is an idle probe (the first to go);
 *   2. else the PyTorch client idle longest (they carry no credential: under torchrun any process that
 *      reaches the port is one, and a PyTorch job's own workers are protected only as far as the cap
 *      exceeds the job's own connections, which fsdp-launch sizes it for);
 *   3. else the connection in its handshake idle longest (a flood of fresh connections).
 * A connection that authenticates leaves the count at once and is never closed for the cap, so the job's
 * fsdpc ranks, launchers and a restart's new workers always get in: a rank's handshake is two round trips
 * during which its connection is the freshest one, and it would be closed only if more than the cap of
 * other connections arrived or made a request within that time. "Idle" counts from the last complete
 * request (or the accept), so trickling a request's bytes does not keep a connection young (and the
 * stall timer closes it anyway). */
#include <stdio.h>

#include "common/clock.h"
#include "common/log.h"
#include "rendezvous/store_server_internal.h"

#define SUSPECT_IDLE_S 1.0
#define CAP_WARN_INTERVAL_S 1.0

static void queue_remove(struct store_server *s, struct store_conn *c)
{
    if (c->tier == TIER_NONE)
        return;
    struct store_conn_queue *q = &s->idle[c->tier];
    if (c->idle_prev)
        c->idle_prev->idle_next = c->idle_next;
    else
        q->head = c->idle_next;
    if (c->idle_next)
        c->idle_next->idle_prev = c->idle_prev;
    else
        q->tail = c->idle_prev;
    c->idle_prev = c->idle_next = NULL;
    c->tier = TIER_NONE;
    s->unauth_conns--;
}

void store_server_cap_forget(struct store_conn *c) { queue_remove(c->srv, c); }

void store_server_cap_touch(struct store_conn *c)
{
    struct store_server *s = c->srv;
    queue_remove(s, c);
    if (c->state == CONN_FSDP)
        return;
    c->tier = c->state == CONN_TORCH ? TIER_TORCH : TIER_HANDSHAKE;
    c->active_s = clock_now_s();
    struct store_conn_queue *q = &s->idle[c->tier];
    c->idle_prev = q->tail;
    c->idle_next = NULL;
    if (q->tail)
        q->tail->idle_next = c;
    else
        q->head = c;
    q->tail = c;
    s->unauth_conns++;
}

struct store_conn *store_server_cap_victim(struct store_server *s)
{
    if (s->unauth_conns <= s->max_unauth_conns)
        return NULL;
    double now = clock_now_s();
    struct store_conn *hs = s->idle[TIER_HANDSHAKE].head, *torch = s->idle[TIER_TORCH].head;
    struct store_conn *v = hs && now - hs->active_s >= SUSPECT_IDLE_S ? hs : torch ? torch : hs;
    if (!v)
        return NULL;
    if (s->cap_warned_s == 0 || now - s->cap_warned_s >= CAP_WARN_INTERVAL_S) {
        char more[96] = "";
        if (s->cap_quiet)
            snprintf(more, sizeof more, " (and %lu more since the last such line)", s->cap_quiet);
        log_warn("store: connections without the job's token reached the cap (%zu): closing %s, %s idle for %.1f s, "
                 "to make room%s", s->max_unauth_conns, v->peer,
                 v->tier == TIER_TORCH ? "a PyTorch client" : "a connection still in its handshake",
                 now - v->active_s, more);
        s->cap_warned_s = now;
        s->cap_quiet = 0;
    } else {
        s->cap_quiet++;
    }
    return v;
}
