/* The throttle on failed AUTHs: guessing the job's key costs the guesser time. Each source address, and
 * all of them together, has a token bucket of failures answered at once (AUTH_PEER_* and AUTH_ALL_*);
 * past it, a failure's verdict (the refusal, then the close) waits until the bucket has refilled for it,
 * at most AUTH_MAX_DELAY_S, while its connection stays open and unread. Only failures take tokens and the
 * MAC is checked before anything waits, so a correct AUTH, the job's, is answered at once whatever
 * others guess. Waiting never blocks the loop: the connection's timer carries the verdict.
 *
 * Each connection gets one guess (a fresh server nonce per HELLO, closed after the verdict), so a guesser
 * that waits for verdicts gets AUTH_ALL_RATE of them a second; one that does not wait still holds each
 * connection until its verdict, and connections without the token are capped (store_server_cap.c). */
#include <string.h>

#include "common/clock.h"
#include "rendezvous/store_server_internal.h"

#define AUTH_PEER_RATE 5.0    /* failures per second refilled, per source address */
#define AUTH_PEER_BURST 10.0  /* answered at once after a quiet spell */
#define AUTH_ALL_RATE 50.0    /* the same over every source */
#define AUTH_ALL_BURST 100.0
#define AUTH_MAX_DELAY_S 10.0 /* the longest a verdict waits (the debt stops growing there) */

/* Takes a failure's token; returns the wait before its verdict. */
static double bucket_take(struct store_auth_bucket *b, double rate, double burst, double now)
{
    if (b->at_s == 0)
        b->tokens = burst;
    else
        b->tokens += (now - b->at_s) * rate;
    if (b->tokens > burst)
        b->tokens = burst;
    b->at_s = now;
    b->tokens -= 1.0;
    if (b->tokens < -AUTH_MAX_DELAY_S * rate)
        b->tokens = -AUTH_MAX_DELAY_S * rate;
    return b->tokens >= 0 ? 0.0 : -b->tokens / rate;
}

/* The peer's bucket: its slot, or the slot updated longest ago (a source quiet that long has a full
 * bucket again, so reusing its slot forgives nothing that still matters). */
static struct store_auth_bucket *peer_bucket(struct store_server *s, const struct store_conn *c)
{
    struct store_auth_peer *oldest = &s->auth_peers[0];
    for (size_t i = 0; i < STORE_AUTH_PEERS; i++) {
        struct store_auth_peer *p = &s->auth_peers[i];
        if (p->family == c->peer_family && memcmp(p->addr, c->peer_addr, sizeof p->addr) == 0)
            return &p->bucket;
        if (p->family == 0 || (oldest->family != 0 && p->bucket.at_s < oldest->bucket.at_s))
            oldest = p;
    }
    memcpy(oldest->addr, c->peer_addr, sizeof oldest->addr);
    oldest->family = c->peer_family;
    oldest->bucket = (struct store_auth_bucket){0};
    return &oldest->bucket;
}

double store_throttle_auth_failure(struct store_conn *c)
{
    struct store_server *s = c->srv;
    double now = clock_now_s();
    double mine = bucket_take(peer_bucket(s, c), AUTH_PEER_RATE, AUTH_PEER_BURST, now);
    double all = bucket_take(&s->auth_all, AUTH_ALL_RATE, AUTH_ALL_BURST, now);
    return mine > all ? mine : all;
}
