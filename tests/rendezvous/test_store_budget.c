/* What clients without the job's token can make the store hold: one budget for their keys, waits, requests
 * and unsent replies, whatever they send (MULTI_GET bombs that never read, WAIT bombs), given back when
 * their connections close, while the job's authenticated traffic goes on; and the throttle on failed
 * AUTHs. The server runs in this process, so its memory is this process's RSS. */
#include <fcntl.h>
#include <stdlib.h>

#include "common/rss.h"
#include "store_test_util.h"

static long rss_kb(void)
{
    return (long)(rss_now() / 1024);
}

/* Under AddressSanitizer freed memory sits in its quarantine and every allocation has shadow and redzones, so
 * RSS says nothing about what the store holds: there the tests check the charged bytes (store_server_stats)
 * only, and the plain build checks RSS too. */
#ifdef __SANITIZE_ADDRESS__
#define RSS_MEANS_HELD false
#else
#define RSS_MEANS_HELD true
#endif

static struct store_server_stats stats_of(struct store_server *s)
{
    struct store_server_stats st;
    store_server_stats(s, &st);
    return st;
}

/* Waits until the budget holds `want` bytes again (connections are closed asynchronously); returns it. */
static size_t budget_settles_at(struct store_server *s, size_t want)
{
    double t0 = test_now();
    size_t now;
    while ((now = stats_of(s).unauth_bytes) != want && test_now() - t0 < 5)
        test_sleep(0.01);
    return now;
}

/* Waits (at most 10 s) until ok(stats) holds; returns the stats then. */
static struct store_server_stats stats_when(struct store_server *s, bool (*ok)(const struct store_server_stats *))
{
    double t0 = test_now();
    struct store_server_stats st = stats_of(s);
    while (!ok(&st) && test_now() - t0 < 10) {
        test_sleep(0.01);
        st = stats_of(s);
    }
    return st;
}

/* A PyTorch-protocol connection (VALIDATE sent) that reads as little as the kernel allows. */
static int torch_conn(int port, bool small_rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    if (small_rcvbuf) {
        int rcv = 4096;
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
    raw_validate(fd);
    return fd;
}

static void sync_ping(int fd)
{
    struct store_buf b;
    store_buf_init(&b);
    req_begin(&b, STORE_OP_PING);
    store_buf_put_u32(&b, 77);
    raw_send_buf(fd, &b);
    uint8_t r[4];
    cr_assert_eq(raw_recv(fd, r, 4, 10), 4, "no PING reply");
    store_buf_free(&b);
}

enum { VALUES = 7, VALUE_BYTES = 1 << 20 };

/* Seven 1 MiB values in PyTorch clients' key space, as the bombs below ask for them. */
static void store_values(int port)
{
    int fd = torch_conn(port, false);
    struct store_buf b;
    store_buf_init(&b);
    char *val = malloc(VALUE_BYTES);
    memset(val, 'v', VALUE_BYTES);
    for (int i = 0; i < VALUES; i++) {
        char key[16];
        snprintf(key, sizeof key, "/v%d", i);
        req_begin(&b, STORE_OP_SET);
        store_buf_put_str(&b, key);
        store_buf_put_bytes(&b, val, VALUE_BYTES);
        raw_send_buf(fd, &b);
    }
    sync_ping(fd);
    free(val);
    store_buf_free(&b);
    close(fd);
}

/* 30 connections each MULTI_GET all seven values (a 7 MiB reply) and never read. Unbounded, that is 210
 * MiB of replies; within a 16 MiB budget (7 MiB of it the keys) one or two replies are built and the other
 * connections are closed. The job's client still stores and reads a 4 MiB value meanwhile. */
Test(store_budget, multi_get_bombs_stay_within_the_budget, .timeout = 60)
{
    struct store_server_options o = {.run_id = "job", .unauth_bytes_max = 16u << 20};
    struct store_server *s = test_server_opts(&o);
    int port = store_server_port(s);
    store_values(port);
    test_sleep(0.1); /* the server drains the PING's reply just after the peer may have read it */
    size_t keys = stats_of(s).unauth_bytes;
    cr_assert_gt(keys, (size_t)VALUES * VALUE_BYTES, "the keys are charged to the budget (%zu)", keys);
    long base = rss_kb(), peak = base;
    struct store_buf b;
    store_buf_init(&b);
    req_begin(&b, STORE_OP_MULTI_GET);
    store_buf_put_u64(&b, VALUES);
    for (int i = 0; i < VALUES; i++) {
        char key[16];
        snprintf(key, sizeof key, "/v%d", i);
        store_buf_put_str(&b, key);
    }
    enum { BOMBS = 30 };
    int fd[BOMBS];
    for (int i = 0; i < BOMBS; i++) {
        fd[i] = torch_conn(port, true);
        raw_send_buf(fd[i], &b);
        test_sleep(0.01);
        long r = rss_kb();
        peak = r > peak ? r : peak;
    }
    /* the job's own traffic is not charged: it goes on with the budget full */
    struct store_client *c = test_client(s);
    char *val = malloc(4u << 20);
    memset(val, 'j', 4u << 20);
    cr_assert_eq(store_client_set(c, "job/big", val, 4u << 20), 0, "%s", error_message());
    void *got;
    size_t n;
    cr_assert_eq(store_client_get(c, "job/big", &got, &n, 10), 0, "%s", error_message());
    cr_assert_eq(n, 4u << 20);
    free(got);
    free(val);
    test_sleep(0.3);
    long r = rss_kb();
    peak = r > peak ? r : peak;
    struct store_server_stats st = stats_of(s);
    cr_assert_leq(st.unauth_bytes_peak, st.unauth_bytes_max, "peak %zu over the budget", st.unauth_bytes_peak);
    cr_assert_geq(st.budget_refusals, BOMBS - 3, "only %llu of %d bombs refused",
                  (unsigned long long)st.budget_refusals, BOMBS);
    cr_assert(!RSS_MEANS_HELD || peak - base < 32 * 1024, "RSS went from %ld to %ld kB", base, peak);
    for (int i = 0; i < BOMBS; i++)
        close(fd[i]);
    size_t left = budget_settles_at(s, keys);
    cr_assert_eq(left, keys, "what the bombs held was not given back: %zu, %zu before", left, keys);
    store_buf_free(&b);
    store_client_close(c);
    store_server_stop(s);
}

/* A WAIT on `nkeys` missing keys of 8000 bytes each, with `tag` making them unique to this connection. */
static void send_wait_bomb(int fd, int tag, int nkeys)
{
    static char key[8000];
    struct store_buf b;
    store_buf_init(&b);
    req_begin(&b, STORE_OP_WAIT);
    store_buf_put_u64(&b, (uint64_t)nkeys);
    for (int k = 0; k < nkeys; k++) {
        memset(key, 'w', sizeof key - 1);
        snprintf(key, 32, "/%d/%d/", tag, k);
        key[strlen(key)] = 'w';
        store_buf_put_str(&b, key);
    }
    /* A hostile client: the server may close the connection while the 2 MiB request is still being sent
     * (the budget is full), so a short or failed send is what the test provokes, not an error of the test. */
    cr_assert(!b.failed);
    for (size_t off = 0; off < b.len;) {
        ssize_t n = send(fd, b.data + off, b.len - off, MSG_NOSIGNAL);
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    store_buf_free(&b);
}

enum { WAIT_BOMBS = 40, WAIT_KEYS = 256 };

static bool most_refused(const struct store_server_stats *st) { return st->budget_refusals >= WAIT_BOMBS - 5; }

/* 40 connections each WAIT on 256 missing keys of 8 KB (2 MiB of placeholders each, 80 MiB in all): within
 * an 8 MiB budget three fit and the others are closed. */
Test(store_budget, wait_bombs_stay_within_the_budget, .timeout = 60)
{
    struct store_server_options o = {.run_id = "job", .unauth_bytes_max = 8u << 20};
    struct store_server *s = test_server_opts(&o);
    int port = store_server_port(s);
    struct store_client *c = test_client(s);
    long base = rss_kb(), peak = base;
    enum { BOMBS = WAIT_BOMBS };
    int fd[BOMBS];
    for (int i = 0; i < BOMBS; i++) {
        fd[i] = torch_conn(port, false);
        send_wait_bomb(fd[i], i, WAIT_KEYS);
        long r = rss_kb();
        peak = r > peak ? r : peak;
    }
    struct store_server_stats st = stats_when(s, most_refused);
    long r = rss_kb();
    peak = r > peak ? r : peak;
    cr_assert_leq(st.unauth_bytes_peak, st.unauth_bytes_max, "peak %zu over the budget", st.unauth_bytes_peak);
    cr_assert_gt(st.unauth_bytes, 4u << 20, "the waits that fit are charged (%zu)", st.unauth_bytes);
    cr_assert_geq(st.budget_refusals, BOMBS - 5, "only %llu of %d WAIT bombs refused",
                  (unsigned long long)st.budget_refusals, BOMBS);
    cr_assert(!RSS_MEANS_HELD || peak - base < 32 * 1024, "RSS went from %ld to %ld kB", base, peak);
    /* the job's waits are not charged */
    cr_assert_eq(store_client_set(c, "k", "v", 1), 0, "%s", error_message());
    for (int i = 0; i < BOMBS; i++)
        close(fd[i]);
    cr_assert_eq(budget_settles_at(s, 0), 0, "the waits were not given back when their connections closed");
    store_client_close(c);
    store_server_stop(s);
}

static bool twenty_parked(const struct store_server_stats *st) { return st->unauth_bytes >= 20u * 2 * 1000 * 1000; }

/* Within the default budget 20 such WAITs (40 MiB) all fit; once their connections close, the budget is
 * empty again and the memory goes back to the system. */
Test(store_budget, wait_memory_is_given_back_when_connections_close, .timeout = 60)
{
    struct store_server *s = test_server("job", NULL, 0);
    int port = store_server_port(s);
    long base = rss_kb();
    enum { BOMBS = 20 };
    int fd[BOMBS];
    for (int i = 0; i < BOMBS; i++) {
        fd[i] = torch_conn(port, false);
        send_wait_bomb(fd[i], i, WAIT_KEYS);
    }
    struct store_server_stats st = stats_when(s, twenty_parked);
    cr_assert_eq(st.budget_refusals, 0);
    cr_assert_gt(st.unauth_bytes, (size_t)BOMBS * 2 * 1000 * 1000, "the waits are charged (%zu)", st.unauth_bytes);
    long held = rss_kb();
    cr_assert(!RSS_MEANS_HELD || held - base > 30 * 1024, "the waits hold memory (RSS %ld -> %ld kB)", base, held);
    for (int i = 0; i < BOMBS; i++)
        close(fd[i]);
    cr_assert_eq(budget_settles_at(s, 0), 0, "the waits were not given back when their connections closed");
    test_sleep(0.5);
    long after = rss_kb();
    cr_assert(!RSS_MEANS_HELD || after - base < 12 * 1024,
              "RSS %ld kB after the connections closed (from %ld, %ld while held)", after, base, held);
    store_server_stop(s);
}

/* ---- the AUTH throttle ---- */

/* One guess from 127.0.0.src: HELLO, then AUTH with a wrong MAC; waits up to wait_s for the verdict.
 * Returns 1 when the refusal came, 0 when it did not come in time (fd is left open in *held), -1 on
 * anything else. */
static int guess(int port, int src, double wait_s, int *held)
{
    int fd = raw_connect_from(port, src);
    uint8_t cn[32] = {9}, sn[32];
    cr_assert_eq(raw_hello(fd, STORE_PROTOCOL_VERSION, "job", cn, sn, NULL, 0), STORE_ST_OK);
    uint8_t mac[32] = {0};
    struct store_buf b;
    store_buf_init(&b);
    store_buf_put_u8(&b, STORE_OP_AUTH);
    store_buf_put_bytes(&b, mac, sizeof mac);
    raw_send_buf(fd, &b);
    store_buf_free(&b);
    uint8_t st;
    long r = raw_recv(fd, &st, 1, wait_s);
    if (r < 0) {
        *held = fd;
        return 0;
    }
    close(fd);
    return r == 1 && st == STORE_ST_REFUSED ? 1 : -1;
}

/* Guessing the key from one address (127.0.0.2) gets 10 verdicts at once and then 5 a second; the guesses
 * past that wait, unchecked, for their turn (their connections held), and the job's client, from another
 * address, is answered at once meanwhile. */
Test(store_budget, auth_guesses_are_throttled, .timeout = 60)
{
    struct store_server *s = test_server("job", "s3cret", 0);
    int port = store_server_port(s);
    enum { MAX_HELD = 200 };
    int held[MAX_HELD], nheld = 0, verdicts = 0, guesses = 0;
    double t0 = test_now();
    while (test_now() - t0 < 2.0 && nheld < MAX_HELD) {
        int fd = -1;
        int r = guess(port, 2, 0.05, &fd);
        cr_assert_geq(r, 0, "a guess got something other than a refusal");
        guesses++;
        verdicts += r;
        if (r == 0)
            held[nheld++] = fd;
    }
    double spent = test_now() - t0;
    /* the job's client, while the guesser's AUTHs wait */
    cr_assert_gt(stats_of(s).auth_waiting, 0, "no guess waits for the throttle");
    double c0 = test_now();
    struct store_client *c = NULL;
    cr_assert_eq(test_connect_opts(port, "job", "s3cret", 10, &c), 0, "%s", error_message());
    double took = test_now() - c0;
    cr_assert_lt(took, 0.5, "the job's AUTH took %.2f s", took);
    cr_assert_eq(store_client_set(c, "k", "v", 1), 0, "%s", error_message());
    /* 10 at once, 5 a second after that (and some slack for timing) */
    int allowed = 10 + (int)(5 * spent) + 3;
    cr_assert_leq(verdicts, allowed, "%d of %d guesses answered in %.1f s (at most %d expected)", verdicts, guesses,
                  spent, allowed);
    cr_assert_gt(nheld, 0);
    struct store_server_stats st = stats_of(s);
    cr_assert_leq(st.auth_failures, (uint64_t)allowed, "%llu guesses checked", (unsigned long long)st.auth_failures);
    cr_assert_geq(st.auth_delayed, (uint64_t)nheld);
    /* a held guess gets its refusal in the end: it is the first in its address's queue */
    uint8_t v;
    cr_assert_eq(raw_recv(held[0], &v, 1, 12), 1, "a delayed verdict never came");
    cr_assert_eq(v, STORE_ST_REFUSED);
    for (int i = 0; i < nheld; i++)
        close(held[i]);
    store_client_close(c);
    store_server_stop(s);
}

/* Fires n guesses from `sources` addresses (127.0.0.2 on) without waiting; returns when they were sent. */
static void fire_guesses(int port, int *fd, int n, int sources)
{
    for (int i = 0; i < n; i++)
        fd[i] = raw_fire_guess(port, 2 + i % sources);
}

/* Waits until t0 + s. */
static void sleep_until(double t0, double s)
{
    double left = t0 + s - test_now();
    if (left > 0)
        test_sleep(left);
}

/* 120 guesses from one address, none waiting for its verdict: the server checks them at the address's
 * bucket rate (10 at once, then 5 a second), not as fast as they come (it used to check every MAC at once
 * and only delay the refusals, so a client reading an immediate OK as success guessed without limit). */
Test(store_budget, guesses_that_do_not_wait_are_checked_at_the_source_rate, .timeout = 60)
{
    struct store_server *s = test_server("job", "s3cret", 0);
    int port = store_server_port(s);
    enum { N = 120 };
    int fd[N];
    double t0 = test_now();
    fire_guesses(port, fd, N, 1);
    sleep_until(t0, 2.0);
    struct store_server_stats st = stats_of(s);
    double spent = test_now() - t0;
    double allowed = 10 + 5 * spent + 1;
    cr_assert_leq((double)st.auth_failures, allowed, "%llu of %d guesses checked in %.2f s (at most %.0f)",
                  (unsigned long long)st.auth_failures, N, spent, allowed);
    cr_assert_geq(st.auth_failures, 10, "the burst was not checked (%llu)", (unsigned long long)st.auth_failures);
    for (int i = 0; i < N; i++)
        close(fd[i]);
    store_server_stop(s);
}

/* 400 guesses from 40 addresses at once: together they are checked at the rate of the bucket of all
 * sources (100 at once, then 50 a second), and the job's client, from another address, gets in meanwhile
 * (its turn comes round among the sources that wait, it is not queued behind 400 guesses). */
Test(store_budget, guesses_from_many_sources_are_checked_at_the_global_rate, .timeout = 60)
{
    struct store_server *s = test_server("job", "s3cret", 0);
    int port = store_server_port(s);
    enum { N = 400, SOURCES = 40 };
    int fd[N];
    double t0 = test_now();
    fire_guesses(port, fd, N, SOURCES);
    double c0 = test_now();
    struct store_client *c = NULL;
    cr_assert_eq(test_connect_opts(port, "job", "s3cret", 10, &c), 0, "%s", error_message());
    double took = test_now() - c0;
    cr_assert_lt(took, 2.0, "the job's client took %.2f s to get in through the guesses", took);
    cr_assert_eq(store_client_set(c, "k", "v", 1), 0, "%s", error_message());
    sleep_until(t0, 2.0);
    struct store_server_stats st = stats_of(s);
    double spent = test_now() - t0;
    double allowed = 100 + 50 * spent + 1;
    cr_assert_leq((double)st.auth_failures, allowed, "%llu of %d guesses checked in %.2f s (at most %.0f)",
                  (unsigned long long)st.auth_failures, N, spent, allowed);
    cr_assert_geq(st.auth_failures, 100, "the burst was not checked (%llu)", (unsigned long long)st.auth_failures);
    for (int i = 0; i < N; i++)
        close(fd[i]);
    store_client_close(c);
    store_server_stop(s);
}

static bool keys_only(const struct store_server_stats *st)
{
    return st->unauth_bytes <= (size_t)VALUES * (VALUE_BYTES + 64 + 3);
}

/* A MULTI_GET reply nobody reads holds the budget only for the idle timeout: the connection is closed when
 * its replies stop draining that long. */
Test(store_budget, unread_replies_are_dropped_after_the_idle_timeout, .timeout = 30)
{
    struct store_server *s = test_server("job", NULL, 0.5);
    int port = store_server_port(s);
    store_values(port);
    int fd = torch_conn(port, true);
    struct store_buf b;
    store_buf_init(&b);
    req_begin(&b, STORE_OP_MULTI_GET);
    store_buf_put_u64(&b, VALUES);
    for (int i = 0; i < VALUES; i++) {
        char key[16];
        snprintf(key, sizeof key, "/v%d", i);
        store_buf_put_str(&b, key);
    }
    raw_send_buf(fd, &b);
    store_buf_free(&b);
    test_sleep(0.1);
    size_t keys = (size_t)VALUES * (VALUE_BYTES + 64 + 3);
    cr_assert_gt(stats_of(s).unauth_bytes, keys + (1u << 20), "the reply is charged (%zu)", stats_of(s).unauth_bytes);
    double t0 = test_now();
    size_t left = stats_when(s, keys_only).unauth_bytes;
    cr_assert_eq(left, keys, "the unread reply still holds the budget: %zu, keys %zu", left, keys);
    cr_assert_lt(test_now() - t0, 5.0);
    /* the socket was closed: after what the kernel had buffered comes the end */
    cr_assert_geq(raw_wait_closed(fd, 10), 0, "the connection was not closed");
    close(fd);
    store_server_stop(s);
}
