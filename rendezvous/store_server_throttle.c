/* The throttle on AUTHs: guessing the job's key costs the guesser time, whatever the guesser does. Each
 * source address, and all of them together, has a token bucket of failed AUTHs (AUTH_PEER_* and
 * AUTH_ALL_*). An AUTH's MAC is checked only while both buckets hold a whole token; a failure then takes
 * one from each, a success takes none (so the job's own AUTHs never drain them). An AUTH that comes while
 * a bucket is empty is not checked: it waits on its connection, unread, in its source's queue, and the
 * server checks it when its turn comes. So MACs are checked at most at the buckets' rates, also for a
 * guesser that sends AUTHs on many connections without waiting for verdicts and would read an immediate
 * OK as success (a refusal is never delayed any more: it is sent when the MAC is checked).
 *
 * Turns: the sources that wait are served round robin, one AUTH each per token of the global bucket, so a
 * rank from an address that is not guessing waits for at most one global token per source that waits
 * (0.02 s each), not behind every queued guess; within a source, first come first served. A rank from the
 * guesser's own address waits in that address's queue: nothing tells its AUTH from a guess before the
 * check. What waits is bounded by the cap on connections without the token (store_server_cap.c) and by
 * the handshake deadline, after which a waiting AUTH's connection is closed unchecked (store_server.c). */
#include <string.h>

#include <event2/event.h>

#include "common/clock.h"
#include "rendezvous/store_server_internal.h"

#define AUTH_PEER_RATE 5.0   /* failures per second refilled, per source address */
#define AUTH_PEER_BURST 10.0 /* checked at once after a quiet spell */
#define AUTH_ALL_RATE 50.0   /* the same over every source */
#define AUTH_ALL_BURST 100.0

static void bucket_refill(struct store_auth_bucket *b, double rate, double burst, double now)
{
    if (b->at_s == 0)
        b->tokens = burst;
    else
        b->tokens += (now - b->at_s) * rate;
    if (b->tokens > burst)
        b->tokens = burst;
    b->at_s = now;
}

/* Seconds until the bucket holds a whole token (0: now). */
static double bucket_wait(const struct store_auth_bucket *b, double rate)
{
    return b->tokens >= 1.0 ? 0.0 : (1.0 - b->tokens) / rate;
}

/* The peer's slot: its own, or the one of a source with nothing waiting that was used longest ago (a
 * source quiet that long has a full bucket again, so reusing its slot forgives nothing that still
 * matters). With every slot's source waiting, the newcomer shares the slot used longest ago. */
static struct store_auth_peer *peer_slot(struct store_server *s, const struct store_conn *c)
{
    struct store_auth_peer *idle = NULL, *busy = NULL;
    for (size_t i = 0; i < STORE_AUTH_PEERS; i++) {
        struct store_auth_peer *p = &s->auth_peers[i];
        if (p->family == c->peer_family && memcmp(p->addr, c->peer_addr, sizeof p->addr) == 0)
            return p;
        if (p->queued) {
            if (!busy || p->bucket.at_s < busy->bucket.at_s)
                busy = p;
        } else if (!idle || (idle->family != 0 && (p->family == 0 || p->bucket.at_s < idle->bucket.at_s))) {
            idle = p;
        }
    }
    if (!idle)
        return busy;
    memcpy(idle->addr, c->peer_addr, sizeof idle->addr);
    idle->family = c->peer_family;
    idle->bucket = (struct store_auth_bucket){0};
    return idle;
}

static void queue_push(struct store_auth_peer *p, struct store_conn *c)
{
    c->auth_next = NULL;
    c->auth_prev = p->tail;
    if (p->tail)
        p->tail->auth_next = c;
    else
        p->head = c;
    p->tail = c;
    p->queued++;
    __atomic_add_fetch(&c->srv->auth_waiting, 1, __ATOMIC_RELAXED); /* read by store_server_stats */
}

static void queue_remove(struct store_auth_peer *p, struct store_conn *c)
{
    if (c->auth_prev)
        c->auth_prev->auth_next = c->auth_next;
    else
        p->head = c->auth_next;
    if (c->auth_next)
        c->auth_next->auth_prev = c->auth_prev;
    else
        p->tail = c->auth_prev;
    c->auth_prev = c->auth_next = NULL;
    p->queued--;
    __atomic_sub_fetch(&c->srv->auth_waiting, 1, __ATOMIC_RELAXED);
}

bool store_throttle_auth_admit(struct store_conn *c)
{
    struct store_server *s = c->srv;
    double now = clock_now_s();
    struct store_auth_peer *p = peer_slot(s, c);
    c->auth_peer = p;
    bucket_refill(&p->bucket, AUTH_PEER_RATE, AUTH_PEER_BURST, now);
    bucket_refill(&s->auth_all, AUTH_ALL_RATE, AUTH_ALL_BURST, now);
    /* Checked now only when nobody waits (else it would overtake them) and both buckets have a token. */
    if (s->auth_waiting == 0 && p->bucket.tokens >= 1.0 && s->auth_all.tokens >= 1.0)
        return true;
    queue_push(p, c);
    c->auth_waiting = true;
    c->auth_waiting_since_s = now;
    /* Whose turn it is now is for the turn callback to say, on the next loop turn. */
    static const struct timeval now_tv = {0, 0};
    event_add(s->auth_ev, &now_tv);
    return false;
}

void store_throttle_auth_done(struct store_conn *c, bool failed)
{
    struct store_server *s = c->srv;
    if (failed && c->auth_peer) {
        c->auth_peer->bucket.tokens -= 1.0;
        s->auth_all.tokens -= 1.0;
    }
    c->auth_peer = NULL;
}

void store_throttle_auth_forget(struct store_conn *c)
{
    if (c->auth_waiting && c->auth_peer)
        queue_remove(c->auth_peer, c);
    c->auth_waiting = false;
    c->auth_peer = NULL;
}

struct store_conn *store_throttle_auth_next(struct store_server *s)
{
    if (s->auth_waiting == 0)
        return NULL;
    double now = clock_now_s();
    bucket_refill(&s->auth_all, AUTH_ALL_RATE, AUTH_ALL_BURST, now);
    double wait = bucket_wait(&s->auth_all, AUTH_ALL_RATE), soonest = -1;
    if (wait == 0) {
        for (size_t i = 0; i < STORE_AUTH_PEERS; i++) {
            size_t at = (s->auth_turn + i) % STORE_AUTH_PEERS;
            struct store_auth_peer *p = &s->auth_peers[at];
            if (!p->queued)
                continue;
            bucket_refill(&p->bucket, AUTH_PEER_RATE, AUTH_PEER_BURST, now);
            double w = bucket_wait(&p->bucket, AUTH_PEER_RATE);
            if (w == 0) {
                struct store_conn *c = p->head;
                queue_remove(p, c);
                c->auth_waiting = false;
                s->auth_turn = (at + 1) % STORE_AUTH_PEERS;
                return c;
            }
            if (soonest < 0 || w < soonest)
                soonest = w;
        }
        wait = soonest;
    }
    long long us = (long long)(wait * 1e6) + 1; /* not before the token is whole */
    struct timeval tv = {.tv_sec = (time_t)(us / 1000000), .tv_usec = (suseconds_t)(us % 1000000)};
    event_add(s->auth_ev, &tv);
    return NULL;
}

struct store_conn *store_throttle_auth_crowded(struct store_server *s)
{
    struct store_auth_peer *most = NULL;
    for (size_t i = 0; i < STORE_AUTH_PEERS; i++)
        if (s->auth_peers[i].queued && (!most || s->auth_peers[i].queued > most->queued))
            most = &s->auth_peers[i];
    return most ? most->tail : NULL;
}
