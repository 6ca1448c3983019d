/* The cap on connections that have not proven the job's token, and who makes room when it is reached.
 *
 * Every connection starts without the token, so nobody can tell a rank of the job from a hostile client
 * at accept time: refusing newcomers at the cap would lock the job out as surely as running out of
 * descriptors does. So a newcomer is always accepted, and when that takes the count past the cap the
 * server closes the connection that is the least likely to be the job's, in this order:
 *   1. one in its handshake, not waiting for the AUTH throttle, idle for SUSPECT_IDLE_S (nothing sent,
 *      or only VALIDATE and PINGs, or HELLO without AUTH): a real client, fsdpc's or PyTorch's, sends its
 *      next handshake request within a round trip, so this is an idle probe, the idlest first;
 *   2. the PyTorch client idle longest (they carry no credential: under torchrun any process that reaches
 *      the port is one, and a PyTorch job's own workers are protected only as far as the cap exceeds the
 *      job's own connections, which fsdp-launch sizes it for);
 *   3. the connection idle longest that has sent nothing valid yet, other than the newcomer (a flood of
 *      idle connections);
 *   4. the newest waiting AUTH of the source address with the most AUTHs waiting for the throttle (a
 *      guesser's: a rank's AUTH waits only while others guess, and behind fewer of its own address);
 *   5. else the newcomer itself (its client retries).
 * A connection on its way through the handshake (VALIDATE or HELLO answered, for less than
 * SUSPECT_IDLE_S) is never closed for the cap, and one that authenticates leaves the count at once: so a
 * rank that connects and authenticates promptly is not closed however many idle connections others open
 * around its handshake, and the job's ranks, launchers and a restart's new workers get in. "Idle" counts
 * from the last complete request (or the accept), so trickling a request's bytes does not keep a
 * connection young (and the stall timer closes it anyway). */
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
    c->tier = c->state == CONN_TORCH ? TIER_TORCH
              : c->auth_waiting      ? TIER_AUTH
              : c->state == CONN_NEW ? TIER_SILENT
                                     : TIER_HANDSHAKE;
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

static const char *what_it_is(const struct store_conn *c, const struct store_conn *newcomer)
{
    if (c == newcomer)
        return "the newcomer (nothing else may go)";
    switch (c->tier) {
    case TIER_TORCH: return "a PyTorch client";
    case TIER_AUTH: return "an AUTH waiting for the throttle";
    case TIER_SILENT: return "a connection that sent nothing valid";
    default: return "a connection still in its handshake";
    }
}

/* The idlest of two queue heads (either may be NULL). */
static struct store_conn *idler(struct store_conn *a, struct store_conn *b)
{
    return !a ? b : !b ? a : a->active_s <= b->active_s ? a : b;
}

static struct store_conn *pick(struct store_server *s, struct store_conn *newcomer, double now)
{
    struct store_conn *probe = idler(s->idle[TIER_SILENT].head, s->idle[TIER_HANDSHAKE].head);
    if (probe && probe != newcomer && now - probe->active_s >= SUSPECT_IDLE_S)
        return probe;
    if (s->idle[TIER_TORCH].head)
        return s->idle[TIER_TORCH].head;
    struct store_conn *silent = s->idle[TIER_SILENT].head;
    if (silent == newcomer)
        silent = silent->idle_next;
    if (silent)
        return silent;
    struct store_conn *guess = store_throttle_auth_crowded(s);
    return guess ? guess : newcomer;
}

struct store_conn *store_server_cap_victim(struct store_server *s, struct store_conn *newcomer)
{
    if (s->unauth_conns <= s->max_unauth_conns)
        return NULL;
    double now = clock_now_s();
    struct store_conn *v = pick(s, newcomer, now);
    if (!v)
        return NULL;
    if (s->cap_warned_s == 0 || now - s->cap_warned_s >= CAP_WARN_INTERVAL_S) {
        char more[96] = "";
        if (s->cap_quiet)
            snprintf(more, sizeof more, " (and %lu more since the last such line)", s->cap_quiet);
        log_warn("store: connections without the job's token reached the cap (%zu): closing %s, %s idle for %.1f s, "
                 "to make room%s", s->max_unauth_conns, v->peer, what_it_is(v, newcomer),
                 now - v->active_s, more);
        s->cap_warned_s = now;
        s->cap_quiet = 0;
    } else {
        s->cap_quiet++;
    }
    return v;
}
