/* Store operations, limits, waits, tokens and barriers against a real server over loopback. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "rendezvous/store_auth.h"
#include "store_test_util.h"

static void get_str(struct store_client *c, const char *key, const char *expect)
{
    void *v = NULL;
    size_t n = 0;
    cr_assert_eq(store_client_get(c, key, &v, &n, 10), 0, "get %s: %s", key, error_message());
    cr_assert_eq(n, strlen(expect));
    cr_assert_str_eq(v, expect);
    free(v);
}

Test(store, set_get_overwrite_binary)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    cr_assert_eq(store_client_set(c, "a", "hello", 5), 0, "%s", error_message());
    get_str(c, "a", "hello");
    cr_assert_eq(store_client_set(c, "a", "bye", 3), 0);
    get_str(c, "a", "bye");
    uint8_t bin[256];
    for (int i = 0; i < 256; i++)
        bin[i] = (uint8_t)i;
    cr_assert_eq(store_client_set(c, "bin", bin, sizeof bin), 0);
    void *v;
    size_t n;
    cr_assert_eq(store_client_get(c, "bin", &v, &n, 5), 0);
    cr_assert_eq(n, 256);
    cr_assert_eq(memcmp(v, bin, 256), 0);
    free(v);
    cr_assert_eq(store_client_set(c, "empty", "", 0), 0);
    get_str(c, "empty", "");
    /* a second client sees the same data */
    struct store_client *c2 = test_client(s);
    get_str(c2, "a", "bye");
    store_client_close(c2);
    store_client_close(c);
    store_server_stop(s);
}

struct delayed_set {
    int port;
    const char *key;
    double delay_s;
};

static void *delayed_set_thread(void *arg)
{
    struct delayed_set *d = arg;
    test_sleep(d->delay_s);
    struct store_client *c = NULL;
    if (test_connect_opts(d->port, "job", NULL, 10, &c) == 0) {
        store_client_set(c, d->key, "late", 4);
        store_client_close(c);
    }
    return NULL;
}

Test(store, get_waits_for_key)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    struct delayed_set d = {store_server_port(s), "later", 0.3};
    pthread_t t;
    pthread_create(&t, NULL, delayed_set_thread, &d);
    double t0 = test_now();
    get_str(c, "later", "late");
    cr_assert_geq(test_now() - t0, 0.25, "GET returned before the key was set");
    pthread_join(t, NULL);
    store_client_close(c);
    store_server_stop(s);
}

Test(store, get_timeout_names_key_and_stays_usable)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    void *v = NULL;
    size_t n;
    double t0 = test_now();
    int rc = store_client_get(c, "never/set", &v, &n, 0.3);
    double dt = test_now() - t0;
    cr_assert_eq(rc, FSDP_ETIMEDOUT, "rc %d: %s", rc, error_message());
    cr_assert_null(v);
    cr_assert_geq(dt, 0.25);
    cr_assert_lt(dt, 8.0);
    cr_assert(strstr(error_message(), "'never/set'"), "%s", error_message());
    cr_assert(strstr(error_message(), "127.0.0.1:"), "%s", error_message());
    cr_assert(strstr(error_message(), "0.3 s"), "%s", error_message());
    /* the placeholder of the timed-out wait is no key */
    int64_t nk = -1;
    cr_assert_eq(store_client_num_keys(c, &nk), 0);
    cr_assert_eq(nk, 0);
    cr_assert_eq(store_client_ping(c), 0, "%s", error_message());
    store_client_close(c);
    store_server_stop(s);
}

Test(store, add_counts_atomically)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    int64_t r = 0;
    cr_assert_eq(store_client_add(c, "n", 5, &r), 0);
    cr_assert_eq(r, 5);
    cr_assert_eq(store_client_add(c, "n", -7, &r), 0);
    cr_assert_eq(r, -2);
    get_str(c, "n", "-2");
    cr_assert_eq(store_client_set(c, "text", "abc", 3), 0);
    cr_assert_eq(store_client_add(c, "text", 1, &r), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "not a decimal integer"), "%s", error_message());
    cr_assert_eq(store_client_set(c, "big", "9223372036854775807", 19), 0);
    cr_assert_eq(store_client_add(c, "big", 1, &r), FSDP_ERANGE);
    get_str(c, "big", "9223372036854775807");
    cr_assert_eq(store_client_ping(c), 0);
    store_client_close(c);
    store_server_stop(s);
}

struct adder {
    int port;
    int times;
};

static void *adder_thread(void *arg)
{
    struct adder *a = arg;
    struct store_client *c = NULL;
    if (test_connect_opts(a->port, "job", NULL, 20, &c) != 0)
        return (void *)1;
    for (int i = 0; i < a->times; i++)
        if (store_client_add(c, "ctr", 1, NULL) != 0)
            return (void *)1;
    store_client_close(c);
    return NULL;
}

Test(store, add_from_many_clients)
{
    struct store_server *s = test_server("job", NULL, 0);
    enum { T = 8, N = 200 };
    pthread_t t[T];
    struct adder a = {store_server_port(s), N};
    for (int i = 0; i < T; i++)
        pthread_create(&t[i], NULL, adder_thread, &a);
    for (int i = 0; i < T; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        cr_assert_null(ret);
    }
    struct store_client *c = test_client(s);
    int64_t r;
    cr_assert_eq(store_client_add(c, "ctr", 0, &r), 0);
    cr_assert_eq(r, T * N);
    store_client_close(c);
    store_server_stop(s);
}

Test(store, compare_set)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    void *act;
    size_t n;
    /* missing + expect missing: set */
    cr_assert_eq(store_client_compare_set(c, "k", NULL, 0, "v1", 2, &act, &n), 0, "%s", error_message());
    cr_assert_str_eq(act, "v1");
    free(act);
    /* mismatch: unchanged, actual returned */
    cr_assert_eq(store_client_compare_set(c, "k", "zz", 2, "v2", 2, &act, &n), 0);
    cr_assert_str_eq(act, "v1");
    free(act);
    /* expect missing but present: unchanged */
    cr_assert_eq(store_client_compare_set(c, "k", NULL, 0, "v3", 2, &act, &n), 0);
    cr_assert_str_eq(act, "v1");
    free(act);
    /* match: swapped */
    cr_assert_eq(store_client_compare_set(c, "k", "v1", 2, "v2", 2, &act, &n), 0);
    cr_assert_str_eq(act, "v2");
    free(act);
    get_str(c, "k", "v2");
    /* missing key, non-missing expectation: stays missing */
    cr_assert_eq(store_client_compare_set(c, "absent", "x", 1, "y", 1, &act, &n), 0);
    cr_assert_eq(n, 0);
    free(act);
    bool all;
    const char *keys[] = {"absent"};
    cr_assert_eq(store_client_check(c, keys, 1, &all), 0);
    cr_assert_not(all);
    store_client_close(c);
    store_server_stop(s);
}

Test(store, check_delete_num_keys)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    int64_t nk;
    cr_assert_eq(store_client_num_keys(c, &nk), 0);
    cr_assert_eq(nk, 0);
    cr_assert_eq(store_client_set(c, "x", "1", 1), 0);
    cr_assert_eq(store_client_set(c, "y", "2", 1), 0);
    cr_assert_eq(store_client_num_keys(c, &nk), 0);
    cr_assert_eq(nk, 2);
    bool all;
    const char *xy[] = {"x", "y"}, *xz[] = {"x", "z"};
    cr_assert_eq(store_client_check(c, xy, 2, &all), 0);
    cr_assert(all);
    cr_assert_eq(store_client_check(c, xz, 2, &all), 0);
    cr_assert_not(all);
    bool existed;
    cr_assert_eq(store_client_delete(c, "x", &existed), 0);
    cr_assert(existed);
    cr_assert_eq(store_client_delete(c, "x", &existed), 0);
    cr_assert_not(existed);
    cr_assert_eq(store_client_check(c, xy, 2, &all), 0);
    cr_assert_not(all);
    cr_assert_eq(store_client_num_keys(c, &nk), 0);
    cr_assert_eq(nk, 1);
    store_client_close(c);
    store_server_stop(s);
}

Test(store, append)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    cr_assert_eq(store_client_append(c, "log", "ab", 2), 0);
    cr_assert_eq(store_client_append(c, "log", "cd", 2), 0);
    cr_assert_eq(store_client_append(c, "log", "", 0), 0);
    get_str(c, "log", "abcd");
    store_client_close(c);
    store_server_stop(s);
}

Test(store, wait_many_keys_and_timeout_names_missing)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    cr_assert_eq(store_client_set(c, "w/a", "1", 1), 0);
    const char *keys[] = {"w/a", "w/b", "w/c", "w/b"};
    int rc = store_client_wait(c, keys, 4, 0.3);
    cr_assert_eq(rc, FSDP_ETIMEDOUT);
    const char *m = error_message();
    cr_assert(strstr(m, "'w/b'") && strstr(m, "'w/c'"), "%s", m);
    cr_assert_null(strstr(m, "'w/a'"), "present key named as missing: %s", m);
    cr_assert(strstr(m, "127.0.0.1:"), "%s", m);
    struct delayed_set d1 = {store_server_port(s), "w/b", 0.1}, d2 = {store_server_port(s), "w/c", 0.3};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, delayed_set_thread, &d1);
    pthread_create(&t2, NULL, delayed_set_thread, &d2);
    double t0 = test_now();
    cr_assert_eq(store_client_wait(c, keys, 4, 20), 0, "%s", error_message());
    cr_assert_geq(test_now() - t0, 0.25);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    cr_assert_eq(store_client_wait(c, keys, 4, 1), 0);
    store_client_close(c);
    store_server_stop(s);
}

Test(store, many_waiters_on_one_key)
{
    struct store_server *s = test_server("job", NULL, 0);
    enum { W = 16 };
    struct store_client *cs[W];
    /* Park W WAITs by hand: send the requests now, read the replies after the SET. */
    for (int i = 0; i < W; i++)
        cs[i] = test_client(s);
    int fds[W];
    struct store_buf b;
    store_buf_init(&b);
    for (int i = 0; i < W; i++) {
        fds[i] = raw_authed(store_server_port(s), "job", NULL);
        req_begin(&b, STORE_OP_WAIT);
        store_buf_put_u64(&b, 1);
        store_buf_put_str(&b, "go");
        raw_send_buf(fds[i], &b);
    }
    store_buf_free(&b);
    test_sleep(0.1);
    uint8_t r[2];
    cr_assert_eq(raw_recv(fds[0], r, 2, 0.2), -1, "WAIT answered before the key was set");
    cr_assert_eq(store_client_set(cs[0], "go", "now", 3), 0);
    for (int i = 0; i < W; i++) {
        cr_assert_eq(raw_recv(fds[i], r, 2, 10), 2);
        cr_assert_eq(r[0], STORE_ST_OK);
        cr_assert_eq(r[1], STORE_WAIT_STOP);
        close(fds[i]);
        get_str(cs[i], "go", "now");
        store_client_close(cs[i]);
    }
    store_server_stop(s);
}

Test(store, key_and_value_limits)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    char *key = malloc(STORE_MAX_KEY_BYTES + 2);
    memset(key, 'k', STORE_MAX_KEY_BYTES + 1);
    key[STORE_MAX_KEY_BYTES + 1] = '\0';
    cr_assert_eq(store_client_set(c, key, "v", 1), FSDP_ERANGE);
    cr_assert(strstr(error_message(), "STORE_MAX_KEY_BYTES"), "%s", error_message());
    key[STORE_MAX_KEY_BYTES] = '\0'; /* exactly the limit is fine */
    cr_assert_eq(store_client_set(c, key, "v", 1), 0, "%s", error_message());
    get_str(c, key, "v");
    cr_assert_eq(store_client_set(c, "", "v", 1), FSDP_EINVAL);
    size_t big = STORE_MAX_VALUE_BYTES;
    char *val = malloc(big + 1);
    memset(val, 'x', big + 1);
    cr_assert_eq(store_client_set(c, "v", val, big + 1), FSDP_ERANGE);
    cr_assert(strstr(error_message(), "STORE_MAX_VALUE_BYTES"), "%s", error_message());
    cr_assert_eq(store_client_set(c, "v", val, big), 0, "%s", error_message());
    void *got;
    size_t n;
    cr_assert_eq(store_client_get(c, "v", &got, &n, 10), 0);
    cr_assert_eq(n, big);
    free(got);
    /* the server itself refuses an APPEND that grows past the limit */
    cr_assert_eq(store_client_append(c, "v", "y", 1), FSDP_ERANGE);
    cr_assert(strstr(error_message(), "STORE_MAX_VALUE_BYTES"), "%s", error_message());
    cr_assert_eq(store_client_ping(c), 0, "connection survives a refused request: %s", error_message());
    free(val);
    free(key);
    store_client_close(c);
    store_server_stop(s);
}

Test(store, wrong_run_id_or_secret_refused)
{
    struct store_server *s = test_server("job", "s3cret", 0);
    int port = store_server_port(s);
    struct store_client *c = NULL;
    int rc = test_connect_opts(port, "other-job", "s3cret", 5, &c);
    cr_assert_eq(rc, FSDP_EREFUSED, "rc %d: %s", rc, error_message());
    cr_assert_null(c);
    char expect[128];
    snprintf(expect, sizeof expect, "store at 127.0.0.1:%d belongs to another job (run id differs)", port);
    cr_assert(strstr(error_message(), expect), "%s", error_message());
    cr_assert(strstr(error_message(), "FSDP_RDZV_TOKEN"), "%s", error_message());
    rc = test_connect_opts(port, "job", "wrong", 5, &c);
    cr_assert_eq(rc, FSDP_EREFUSED);
    cr_assert(strstr(error_message(), "token differs"), "%s", error_message());
    cr_assert_null(strstr(error_message(), "s3cret"), "secret leaked: %s", error_message());
    rc = test_connect_opts(port, "job", NULL, 5, &c);
    cr_assert_eq(rc, FSDP_EREFUSED);
    rc = test_connect_opts(port, "job", "s3cret", 5, &c);
    cr_assert_eq(rc, 0, "%s", error_message());
    cr_assert_eq(store_client_ping(c), 0);
    store_client_close(c);
    store_server_stop(s);
}

/* The status page's token (docs/launcher.md) is what a sniffer of its cleartext HTTP gets: used as the
 * store secret it opens no session, and it gives away neither the secret nor the store key. */
Test(store, status_page_token_opens_no_store_session)
{
    struct store_server *s = test_server("job", "s3cret", 0);
    int port = store_server_port(s);
    char tok[STORE_STATUS_TOKEN_CHARS + 1], again[STORE_STATUS_TOKEN_CHARS + 1], other[STORE_STATUS_TOKEN_CHARS + 1];
    store_auth_status_token("job", "s3cret", tok);
    store_auth_status_token("job", "s3cret", again);
    store_auth_status_token("other-job", "s3cret", other);
    cr_assert_eq(strlen(tok), STORE_STATUS_TOKEN_CHARS);
    cr_assert_eq(strspn(tok, "0123456789abcdef"), STORE_STATUS_TOKEN_CHARS, "%s", tok);
    cr_assert_str_eq(tok, again, "derived, so every launcher of the job gives the same");
    cr_assert_str_neq(tok, other, "each run id has its own");
    cr_assert_null(strstr(tok, "s3cret"));
    uint8_t key[STORE_KEY_BYTES];
    store_auth_key("job", "s3cret", key);
    char key_hex[2 * STORE_KEY_BYTES + 1];
    for (unsigned i = 0; i < STORE_KEY_BYTES; i++)
        snprintf(key_hex + 2 * i, 3, "%02x", key[i]);
    cr_assert_str_neq(tok, key_hex, "the page's token must not be the store's key");
    struct store_client *c = NULL;
    int rc = test_connect_opts(port, "job", tok, 5, &c);
    cr_assert_eq(rc, FSDP_EREFUSED, "the status token opened a store session: rc %d %s", rc, error_message());
    cr_assert_null(c);
    cr_assert(strstr(error_message(), "token differs"), "%s", error_message());
    rc = test_connect_opts(port, "job", key_hex, 5, &c);
    cr_assert_eq(rc, FSDP_EREFUSED);
    rc = test_connect_opts(port, "job", "s3cret", 5, &c);
    cr_assert_eq(rc, 0, "%s", error_message());
    store_client_close(c);
    store_server_stop(s);
}

/* A clone is a second connection with the same token (a secret-protected server accepts it) and its
 * own default timeout; it outlives the client it was made from. */
Test(store, clone_connects_with_same_token)
{
    struct store_server *s = test_server("job", "s3cret", 0);
    struct store_client *c = NULL, *k = NULL;
    cr_assert_eq(test_connect_opts(store_server_port(s), "job", "s3cret", 5, &c), 0, "%s", error_message());
    cr_assert_eq(store_client_clone(c, 0.5, &k), 0, "%s", error_message());
    cr_assert_eq(store_client_set(c, "from-original", "1", 1), 0);
    get_str(k, "from-original", "1");
    store_client_close(c);
    void *v = NULL;
    size_t n = 0;
    double t0 = test_now();
    cr_assert_eq(store_client_get(k, "never", &v, &n, 0), FSDP_ETIMEDOUT, "%s", error_message());
    cr_expect_lt(test_now() - t0, 5, "the clone's default timeout (0.5 s) was not used");
    cr_assert_eq(store_client_ping(k), 0, "%s", error_message());
    store_client_close(k);
    store_server_stop(s);
}

Test(store, port_in_use)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_server_options o = {.bind_addr = "127.0.0.1", .port = store_server_port(s), .run_id = "job"};
    struct store_server *s2 = NULL;
    int rc = store_server_start(&o, &s2);
    cr_assert_eq(rc, FSDP_EEXIST, "rc %d: %s", rc, error_message());
    cr_assert_null(s2);
    char expect[96];
    snprintf(expect, sizeof expect, "address 127.0.0.1:%d is already in use", store_server_port(s));
    cr_assert(strstr(error_message(), expect), "%s", error_message());
    store_server_stop(s);
}

Test(store, connect_gives_up_with_message)
{
    /* A port nobody listens on: bind one, note it, close it. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    int port = ntohs(a.sin_port);
    close(fd);
    struct store_client *c = NULL;
    double t0 = test_now();
    int rc = test_connect_opts(port, "job", NULL, 0.5, &c);
    double dt = test_now() - t0;
    cr_assert_eq(rc, FSDP_ETIMEDOUT, "rc %d: %s", rc, error_message());
    cr_assert_geq(dt, 0.3);
    cr_assert_lt(dt, 10);
    char expect[96];
    snprintf(expect, sizeof expect, "could not reach store at 127.0.0.1:%d for", port);
    cr_assert(strstr(error_message(), expect), "%s", error_message());
}

static void *late_server_thread(void *arg)
{
    int *port = arg;
    test_sleep(0.4);
    struct store_server_options o = {.bind_addr = "127.0.0.1", .port = *port, .run_id = "job"};
    struct store_server *s = NULL;
    if (store_server_start(&o, &s) != 0)
        return NULL;
    return s;
}

Test(store, connect_retries_until_server_appears)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    int port = ntohs(a.sin_port);
    close(fd);
    pthread_t t;
    pthread_create(&t, NULL, late_server_thread, &port);
    struct store_client *c = NULL;
    int rc = test_connect_opts(port, "job", NULL, 20, &c);
    void *srv;
    pthread_join(t, &srv);
    cr_assert_not_null(srv, "late server could not bind its port");
    cr_assert_eq(rc, 0, "%s", error_message());
    cr_assert_eq(store_client_ping(c), 0);
    store_client_close(c);
    store_server_stop(srv);
}

struct blocked_get {
    int port;
    int rc;
    char msg[512];
    double took;
};

static void *blocked_get_thread(void *arg)
{
    struct blocked_get *b = arg;
    struct store_client *c = NULL;
    b->rc = test_connect_opts(b->port, "job", NULL, 10, &c);
    if (b->rc != 0)
        return NULL;
    void *v;
    size_t n;
    double t0 = test_now();
    b->rc = store_client_get(c, "never", &v, &n, 60);
    b->took = test_now() - t0;
    snprintf(b->msg, sizeof b->msg, "%s", error_message());
    store_client_close(c);
    return NULL;
}

Test(store, server_stop_unblocks_waiting_client)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct blocked_get b = {.port = store_server_port(s)};
    pthread_t t;
    pthread_create(&t, NULL, blocked_get_thread, &b);
    test_sleep(0.3);
    store_server_stop(s);
    pthread_join(t, NULL);
    cr_assert_eq(b.rc, FSDP_ECLOSED, "rc %d: %s", b.rc, b.msg);
    cr_assert_lt(b.took, 10.0);
    char expect[64];
    snprintf(expect, sizeof expect, "store at 127.0.0.1:%d", b.port);
    cr_assert(strstr(b.msg, expect), "%s", b.msg);
    cr_assert(strstr(b.msg, "'never'"), "%s", b.msg);
}

struct barrier_arg {
    int port;
    int world;
    int rounds;
    int *counter; /* participants past each round, to catch an early release */
    pthread_mutex_t *mu;
    int fail;
};

static void *barrier_thread(void *arg)
{
    struct barrier_arg *a = arg;
    struct store_client *c = NULL;
    if (test_connect_opts(a->port, "job", NULL, 30, &c) != 0) {
        a->fail = 1;
        return NULL;
    }
    for (int r = 0; r < a->rounds; r++) {
        pthread_mutex_lock(a->mu);
        a->counter[r]++;
        pthread_mutex_unlock(a->mu);
        if (store_client_barrier(c, "b", a->world, 60) != 0) {
            a->fail = 2;
            break;
        }
        pthread_mutex_lock(a->mu);
        int arrived = a->counter[r];
        pthread_mutex_unlock(a->mu);
        if (arrived != a->world) {
            a->fail = 3; /* released before everyone arrived */
            break;
        }
    }
    store_client_close(c);
    return NULL;
}

Test(store, barrier_many_participants_reused)
{
    struct store_server *s = test_server("job", NULL, 0);
    enum { W = 32, R = 5 };
    int counter[R] = {0};
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    struct barrier_arg args[W];
    pthread_t t[W];
    for (int i = 0; i < W; i++) {
        args[i] = (struct barrier_arg){store_server_port(s), W, R, counter, &mu, 0};
        pthread_create(&t[i], NULL, barrier_thread, &args[i]);
    }
    for (int i = 0; i < W; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(args[i].fail, 0, "participant %d failed with %d", i, args[i].fail);
    }
    store_server_stop(s);
}

Test(store, barrier_timeout_says_who_arrived)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    int rc = store_client_barrier(c, "lonely", 3, 0.3);
    cr_assert_eq(rc, FSDP_ETIMEDOUT);
    cr_assert(strstr(error_message(), "1 of 3 participants"), "%s", error_message());
    cr_assert(strstr(error_message(), "'lonely'"), "%s", error_message());
    cr_assert_eq(store_client_barrier(c, "bad", 0, 1), FSDP_EINVAL);
    store_client_close(c);
    store_server_stop(s);
}

/* The launcher hosts the server and forks+execs workers: they must not inherit the server's sockets,
 * or a stopped server's connections would stay open in them and its clients would never see EOF. */
Test(store, exec_child_does_not_keep_connections_open)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct blocked_get b = {.port = store_server_port(s)};
    pthread_t t;
    pthread_create(&t, NULL, blocked_get_thread, &b);
    test_sleep(0.3);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        execl("/bin/sleep", "sleep", "20", (char *)NULL);
        _exit(127);
    }
    test_sleep(0.2);
    store_server_stop(s);
    pthread_join(t, NULL);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    cr_assert_eq(b.rc, FSDP_ECLOSED, "rc %d: %s", b.rc, b.msg);
    cr_assert_lt(b.took, 10.0, "client saw the close only after %.1f s", b.took);
}

/* A launcher that crashes (SIGKILL, no cleanup) must release its clients just as promptly. */
Test(store, killed_server_process_unblocks_waiting_client)
{
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct store_server_options o = {.bind_addr = "127.0.0.1", .port = 0, .run_id = "job"};
        struct store_server *s = NULL;
        int port = store_server_start(&o, &s) == 0 ? store_server_port(s) : -1;
        if (write(pfd[1], &port, sizeof port) != sizeof port)
            _exit(1);
        pause();
        _exit(0);
    }
    close(pfd[1]);
    int port = -1;
    cr_assert_eq(read(pfd[0], &port, sizeof port), (ssize_t)sizeof port);
    close(pfd[0]);
    cr_assert_gt(port, 0, "server process could not start");
    struct blocked_get b = {.port = port};
    pthread_t t;
    pthread_create(&t, NULL, blocked_get_thread, &b);
    test_sleep(0.3);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    pthread_join(t, NULL);
    cr_assert_eq(b.rc, FSDP_ECLOSED, "rc %d: %s", b.rc, b.msg);
    cr_assert_lt(b.took, 10.0);
    char expect[64];
    snprintf(expect, sizeof expect, "store at 127.0.0.1:%d", port);
    cr_assert(strstr(b.msg, expect), "%s", b.msg);
}

/* ---- c10d's protocol: PyTorch clients' key space, strict integers ---- */

/* Counters are decimal text and nothing else: " 12" (c10d's stoll would take it), "+12", "12 " are not. */
Test(store, add_refuses_counters_that_are_not_strict_decimals)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    const char *bad[] = {" 12", "+12", "12 ", "0x1", "1e3", "", "-", "1-", "99999999999999999999", "\t7"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(store_client_set(c, "ctr", bad[i], strlen(bad[i])), 0);
        int64_t r = 0;
        int rc = store_client_add(c, "ctr", 1, &r);
        cr_assert_eq(rc, FSDP_EINVAL, "ADD accepted '%s' (result %ld)", bad[i], (long)r);
        cr_assert(strstr(error_message(), "not a decimal integer"), "%s", error_message());
        get_str(c, "ctr", bad[i]); /* unchanged */
    }
    const char *good[] = {"12", "-12", "0", "-0", "007", "9223372036854775806", "-9223372036854775808"};
    const int64_t want[] = {13, -11, 1, 1, 8, INT64_MAX, INT64_MIN + 1};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        cr_assert_eq(store_client_set(c, "ctr", good[i], strlen(good[i])), 0);
        int64_t r = 0;
        cr_assert_eq(store_client_add(c, "ctr", 1, &r), 0, "'%s': %s", good[i], error_message());
        cr_assert_eq(r, want[i], "'%s' + 1 = %ld", good[i], (long)r);
    }
    /* a PyTorch client is dropped instead, as c10d's server drops a request that throws */
    struct store_client *p = test_plain_client(store_server_port(s));
    cr_assert_eq(store_client_set(p, "ctr", " 12", 3), 0);
    cr_assert_eq(store_client_add(p, "ctr", 1, NULL), FSDP_ECLOSED, "%s", error_message());
    store_client_close(p);
    cr_assert_eq(store_client_ping(c), 0);
    store_client_close(c);
    store_server_stop(s);
}

/* The client in plain mode speaks c10d as PyTorch's does: its keys are PyTorch clients' keys, which
 * fsdpc's clients do not see (and the other way round). */
Test(store, plain_clients_have_their_own_key_space)
{
    struct store_server *s = test_server("job", "s3cret", 0);
    int port = store_server_port(s);
    struct store_client *f = NULL;
    cr_assert_eq(test_connect_opts(port, "job", "s3cret", 5, &f), 0, "%s", error_message());
    struct store_client *p = test_plain_client(port);
    cr_assert_eq(store_client_set(f, "rdzv/g0/failed", "fsdp", 4), 0);
    cr_assert_eq(store_client_set(p, "rdzv/g0/failed", "torch", 5), 0);
    get_str(f, "rdzv/g0/failed", "fsdp");
    get_str(p, "rdzv/g0/failed", "torch");
    cr_assert_eq(store_client_set(p, "only-torch", "1", 1), 0);
    bool all = true;
    const char *k[] = {"only-torch"};
    cr_assert_eq(store_client_check(f, k, 1, &all), 0);
    cr_assert_not(all, "an fsdpc client sees a PyTorch client's key");
    int64_t nf = 0, np = 0;
    cr_assert_eq(store_client_num_keys(f, &nf), 0);
    cr_assert_eq(store_client_num_keys(p, &np), 0);
    cr_assert_eq(nf, 1);
    cr_assert_eq(np, 2);
    /* plain ops: add, compare_set with c10d's semantics, delete, append, wait with timeout */
    int64_t r = 0;
    cr_assert_eq(store_client_add(p, "n", 3, &r), 0);
    cr_assert_eq(r, 3);
    void *act = NULL;
    size_t n = 0;
    cr_assert_eq(store_client_compare_set(p, "cas", "", 0, "a", 1, &act, &n), 0, "%s", error_message());
    cr_assert_str_eq(act, "a");
    free(act);
    cr_assert_eq(store_client_compare_set(p, "cas", "zz", 2, "b", 1, &act, &n), 0);
    cr_assert_str_eq(act, "a");
    free(act);
    cr_assert_eq(store_client_append(p, "cas", "c", 1), 0);
    get_str(p, "cas", "ac");
    bool existed = false;
    cr_assert_eq(store_client_delete(p, "cas", &existed), 0);
    cr_assert(existed);
    void *v = NULL;
    double t0 = test_now();
    cr_assert_eq(store_client_get(p, "cas", &v, &n, 0.3), FSDP_ETIMEDOUT, "%s", error_message());
    cr_assert_geq(test_now() - t0, 0.25);
    cr_assert_eq(store_client_ping(p), 0, "the connection stays usable after a cancelled wait: %s", error_message());
    /* fsdpc's clients can empty PyTorch clients' key space (a new generation of workers) */
    int64_t removed = 0;
    cr_assert_eq(store_client_reset_torch_keys(f, &removed), 0, "%s", error_message());
    cr_assert_eq(removed, 3);
    cr_assert_eq(store_client_num_keys(p, &np), 0);
    cr_assert_eq(np, 0);
    get_str(f, "rdzv/g0/failed", "fsdp");
    cr_assert_eq(store_client_reset_torch_keys(p, NULL), FSDP_EUNSUPPORTED);
    store_client_close(p);
    store_client_close(f);
    store_server_stop(s);
}

Test(store, torch_off_refuses_plain_clients)
{
    struct store_server_options o = {.run_id = "job", .torch_off = true};
    struct store_server *s = test_server_opts(&o);
    struct store_client *p = test_plain_client(store_server_port(s)); /* VALIDATE and PING pass */
    cr_assert_eq(store_client_set(p, "k", "v", 1), 0);                /* sent without a reply, as c10d does */
    int rc = store_client_num_keys(p, &(int64_t){0});
    cr_assert_eq(rc, FSDP_ECLOSED, "rc %d: %s", rc, error_message());
    store_client_close(p);
    struct store_client *c = test_client(s);
    int64_t nk = -1;
    cr_assert_eq(store_client_num_keys(c, &nk), 0);
    cr_assert_eq(nk, 0);
    store_client_close(c);
    store_server_stop(s);
}

/* PyTorch clients' keys hold at most torch_conn_bytes_max per connection, and with everything else they make
 * the store hold (here: the next SET while it is received) at most unauth_bytes_max in all; the connection
 * that would pass a limit is dropped, what was stored stays. */
Test(store, torch_key_space_limits)
{
    struct store_server_options o = {.run_id = "job", .torch_conn_bytes_max = 100000, .unauth_bytes_max = 250000};
    struct store_server *s = test_server_opts(&o);
    int port = store_server_port(s);
    static char val[30000];
    memset(val, 'v', sizeof val);
    int stored[4] = {0};
    for (int k = 0; k < 4; k++) {
        struct store_client *p = test_plain_client(port);
        int rc = 0;
        for (int i = 0; i < 10 && rc == 0; i++) {
            char key[32];
            snprintf(key, sizeof key, "c%d/k%d", k, i);
            if ((rc = store_client_set(p, key, val, sizeof val)) == 0 && (rc = store_client_ping(p)) == 0)
                stored[k]++;
        }
        cr_assert_eq(rc, FSDP_ECLOSED, "connection %d was never stopped: %s", k, error_message());
        store_client_close(p);
    }
    /* 3 values of ~30 KB fit in 100 KB per connection; 8 in 250 KB in all */
    cr_assert_eq(stored[0], 3);
    cr_assert_eq(stored[1], 3);
    cr_assert_eq(stored[2], 2, "the overall limit did not stop the third connection");
    cr_assert_eq(stored[3], 0);
    /* overwriting with less and deleting stay possible */
    struct store_client *p = test_plain_client(port);
    cr_assert_eq(store_client_set(p, "c0/k0", "x", 1), 0);
    bool existed;
    cr_assert_eq(store_client_delete(p, "c0/k1", &existed), 0);
    cr_assert(existed);
    cr_assert_eq(store_client_set(p, "again", val, sizeof val), 0);
    cr_assert_eq(store_client_ping(p), 0, "%s", error_message());
    store_client_close(p);
    /* fsdpc's own clients are not limited */
    struct store_client *c = test_client(s);
    for (int i = 0; i < 20; i++) {
        char key[32];
        snprintf(key, sizeof key, "f%d", i);
        cr_assert_eq(store_client_set(c, key, val, sizeof val), 0, "%s", error_message());
    }
    store_client_close(c);
    store_server_stop(s);
}

static void put_key(struct store_buf *b, const char *k) { store_buf_put_str(b, k); }

/* Every c10d op a PyTorch 2.x client sends, byte for byte, on a raw socket (the real client is tested in
 * test_store_torch.c when PyTorch is installed). */
Test(store, c10d_ops_on_the_wire)
{
    struct store_server *s = test_server("job", NULL, 0);
    int fd = raw_connect(store_server_port(s)), fd2 = raw_connect(store_server_port(s));
    struct store_buf b;
    store_buf_init(&b);
    raw_validate(fd);
    raw_validate(fd2);
    req_begin(&b, STORE_OP_PING);
    store_buf_put_u32(&b, 0xabcd1234);
    raw_send_buf(fd, &b);
    uint8_t r4[4];
    cr_assert_eq(raw_recv(fd, r4, 4, 10), 4);
    cr_assert_eq(store_le32(r4), 0xabcd1234);
    /* MULTI_SET, MULTI_GET (a missing key reads as empty) */
    req_begin(&b, STORE_OP_MULTI_SET);
    store_buf_put_u64(&b, 2);
    put_key(&b, "/a");
    store_buf_put_bytes(&b, "1", 1);
    put_key(&b, "/b");
    store_buf_put_bytes(&b, "22", 2);
    raw_send_buf(fd, &b);
    req_begin(&b, STORE_OP_MULTI_GET);
    store_buf_put_u64(&b, 3);
    put_key(&b, "/b");
    put_key(&b, "/missing");
    put_key(&b, "/a");
    raw_send_buf(fd, &b);
    char v[8];
    cr_assert_eq(raw_recv_u64(fd), 2);
    cr_assert_eq(raw_recv(fd, v, 2, 10), 2);
    cr_assert_eq(memcmp(v, "22", 2), 0);
    cr_assert_eq(raw_recv_u64(fd), 0);
    cr_assert_eq(raw_recv_u64(fd), 1);
    cr_assert_eq(raw_recv(fd, v, 1, 10), 1);
    /* queues: WAIT on an empty queue parks, a push from another connection releases it */
    req_begin(&b, STORE_OP_WAIT);
    store_buf_put_u64(&b, 1);
    put_key(&b, "/q");
    raw_send_buf(fd, &b);
    uint8_t one;
    cr_assert_eq(raw_recv(fd, &one, 1, 0.2), -1, "WAIT on an empty queue answered");
    req_begin(&b, STORE_OP_QUEUE_PUSH);
    put_key(&b, "/q");
    store_buf_put_bytes(&b, "x", 1);
    raw_send_buf(fd2, &b);
    raw_send_buf(fd2, &b);
    cr_assert_eq(raw_recv(fd, &one, 1, 10), 1);
    cr_assert_eq(one, STORE_WAIT_STOP);
    req_begin(&b, STORE_OP_QUEUE_LEN);
    put_key(&b, "/q");
    raw_send_buf(fd, &b);
    cr_assert_eq(raw_recv_u64(fd), 2);
    req_begin(&b, STORE_OP_QUEUE_POP);
    put_key(&b, "/q");
    raw_send_buf(fd, &b);
    cr_assert_eq(raw_recv_u64(fd), 2);
    cr_assert_eq(raw_recv_u64(fd), 1);
    cr_assert_eq(raw_recv(fd, v, 1, 10), 1);
    cr_assert_eq(v[0], 'x');
    req_begin(&b, STORE_OP_QUEUE_POP);
    put_key(&b, "/empty");
    raw_send_buf(fd, &b);
    cr_assert_eq(raw_recv_u64(fd), 0);
    /* LIST_KEYS: values only, not queues */
    req_begin(&b, STORE_OP_LIST_KEYS);
    raw_send_buf(fd, &b);
    cr_assert_eq(raw_recv_u64(fd), 2);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(raw_recv_u64(fd), 2);
        cr_assert_eq(raw_recv(fd, v, 2, 10), 2);
        cr_assert(memcmp(v, "/a", 2) == 0 || memcmp(v, "/b", 2) == 0);
    }
    /* CANCEL_WAIT: the wait ends, WAIT_CANCELED comes back, the connection goes on */
    req_begin(&b, STORE_OP_WAIT);
    store_buf_put_u64(&b, 1);
    put_key(&b, "/never");
    raw_send_buf(fd, &b);
    req_begin(&b, STORE_OP_CANCEL_WAIT);
    raw_send_buf(fd, &b);
    cr_assert_eq(raw_recv(fd, &one, 1, 10), 1);
    cr_assert_eq(one, STORE_WAIT_CANCELED);
    /* BARRIER: the first of two waits, the second releases both */
    req_begin(&b, STORE_OP_BARRIER);
    put_key(&b, "/bar");
    store_buf_put_u64(&b, 2);
    raw_send_buf(fd, &b);
    cr_assert_eq(raw_recv(fd, &one, 1, 0.2), -1, "BARRIER released with one of two");
    raw_send_buf(fd2, &b);
    cr_assert_eq(raw_recv(fd2, &one, 1, 10), 1);
    cr_assert_eq(one, STORE_WAIT_STOP);
    cr_assert_eq(raw_recv(fd, &one, 1, 10), 1);
    cr_assert_eq(one, STORE_WAIT_STOP);
    /* GETNUMKEYS counts PyTorch clients' keys: /a, /b, /bar */
    req_begin(&b, STORE_OP_GETNUMKEYS);
    raw_send_buf(fd, &b);
    cr_assert_eq(raw_recv_u64(fd), 3);
    /* RESET_TORCH is not for them */
    req_begin(&b, STORE_OP_RESET_TORCH);
    raw_send_buf(fd, &b);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    store_buf_free(&b);
    close(fd);
    close(fd2);
    store_server_stop(s);
}
