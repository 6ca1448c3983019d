/* The store under hostile or broken peers: each bad connection is closed alone and everyone else keeps
 * being served; plus 1024 concurrent clients, and the cap on connections without the token (idle ones make
 * room, the job's ranks always get in). */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <fcntl.h>

#include "store_test_util.h"

/* A client connected before the trouble and one connected after must both still work. */
static void assert_serving(struct store_server *s, struct store_client *before)
{
    cr_assert_eq(store_client_set(before, "alive", "yes", 3), 0, "old client: %s", error_message());
    struct store_client *after = test_client(s);
    void *v;
    size_t n;
    cr_assert_eq(store_client_get(after, "alive", &v, &n, 10), 0, "new client: %s", error_message());
    cr_assert_str_eq(v, "yes");
    free(v);
    store_client_close(after);
}

static int greeted_raw(struct store_server *s) { return raw_authed(store_server_port(s), "job", NULL); }

Test(store_robust, garbage_before_handshake_closed)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    int fd = raw_connect(store_server_port(s));
    const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"; /* 'G' is no c10d op */
    raw_send(fd, http, sizeof http - 1);
    cr_assert_geq(raw_wait_closed(fd, 10), 0, "server kept a connection that sent garbage");
    close(fd);
    assert_serving(s, c);
    store_client_close(c);
    store_server_stop(s);
}

/* A length over its limit closes the connection as soon as the length is read, before any of the bytes it
 * announces: nothing is buffered for it. */
Test(store_robust, oversized_request_closed)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    struct store_buf b;
    store_buf_init(&b);
    /* an authenticated client: key over STORE_MAX_KEY_BYTES, value over STORE_MAX_VALUE_BYTES */
    int fd = greeted_raw(s);
    req_begin(&b, STORE_OP_SET);
    store_buf_put_u64(&b, STORE_MAX_KEY_BYTES + 1);
    raw_send_buf(fd, &b);
    char msg[512];
    cr_assert_eq(raw_recv_status(fd, msg, sizeof msg), STORE_ST_PROTO);
    cr_assert(strstr(msg, "key of 8193 bytes"), "%s", msg);
    cr_assert_geq(raw_wait_closed(fd, 10), 0, "server kept a connection announcing an oversized key");
    close(fd);
    fd = greeted_raw(s);
    req_begin(&b, STORE_OP_SET);
    store_buf_put_str(&b, "k");
    store_buf_put_u64(&b, (uint64_t)STORE_MAX_VALUE_BYTES + 1);
    raw_send_buf(fd, &b);
    cr_assert_eq(raw_recv_status(fd, msg, sizeof msg), STORE_ST_PROTO);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    /* a PyTorch client: c10d's own value limit (8 MiB), a length of 2^63 */
    fd = raw_connect(store_server_port(s));
    raw_validate(fd);
    req_begin(&b, STORE_OP_SET);
    store_buf_put_str(&b, "/k");
    store_buf_put_u64(&b, (uint64_t)STORE_TORCH_MAX_VALUE_BYTES + 1);
    raw_send_buf(fd, &b);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    fd = raw_connect(store_server_port(s));
    raw_validate(fd);
    req_begin(&b, STORE_OP_GET);
    store_buf_put_u64(&b, 1ull << 63);
    raw_send_buf(fd, &b);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    /* before the handshake: a HELLO announcing a run id of 1 MB */
    fd = raw_connect(store_server_port(s));
    req_begin(&b, STORE_OP_VALIDATE);
    store_buf_put_u32(&b, STORE_VALIDATE_MAGIC);
    store_buf_put_u8(&b, STORE_OP_HELLO);
    store_buf_put_u32(&b, STORE_HELLO_MAGIC);
    store_buf_put_u16(&b, STORE_PROTOCOL_VERSION);
    store_buf_put_u64(&b, 1 << 20);
    raw_send_buf(fd, &b);
    cr_assert_eq(raw_recv_status(fd, msg, sizeof msg), STORE_ST_PROTO);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    store_buf_free(&b);
    assert_serving(s, c);
    store_client_close(c);
    store_server_stop(s);
}

Test(store_robust, truncated_request_closed_after_idle_timeout)
{
    struct store_server *s = test_server("job", NULL, 0.5);
    struct store_client *c = test_client(s);
    int fd = greeted_raw(s);
    uint8_t part[15] = {STORE_OP_SET, 100, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6}; /* a 100-byte key, 6 sent */
    raw_send(fd, part, sizeof part);
    double waited = raw_wait_closed(fd, 15);
    cr_assert_geq(waited, 0.3, "closed after %.2f s, before the idle timeout", waited);
    close(fd);
    /* the same from a PyTorch client */
    fd = raw_connect(store_server_port(s));
    raw_validate(fd);
    raw_send(fd, part, sizeof part);
    waited = raw_wait_closed(fd, 15);
    cr_assert_geq(waited, 0.3);
    close(fd);
    assert_serving(s, c);
    /* a client that only idles between requests is not a stalled request */
    test_sleep(0.8);
    cr_assert_eq(store_client_ping(c), 0, "idle greeted client was dropped: %s", error_message());
    store_client_close(c);
    store_server_stop(s);
}

Test(store_robust, malformed_requests_answered_then_closed)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    struct store_buf b;
    store_buf_init(&b);
    char msg[512];
    /* unknown op */
    int fd = greeted_raw(s);
    req_begin(&b, 0x7f);
    raw_send_buf(fd, &b);
    cr_assert_eq(raw_recv_status(fd, msg, sizeof msg), STORE_ST_PROTO);
    cr_assert(strstr(msg, "unknown op"), "%s", msg);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    /* fsdpc's handshake again after it is done */
    fd = greeted_raw(s);
    req_begin(&b, STORE_OP_AUTH);
    store_buf_put_bytes(&b, "0123456789abcdef0123456789abcdef", 32);
    raw_send_buf(fd, &b);
    cr_assert_eq(raw_recv_status(fd, msg, sizeof msg), STORE_ST_PROTO);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    /* a request before VALIDATE */
    fd = raw_connect(store_server_port(s));
    req_begin(&b, STORE_OP_PING);
    store_buf_put_u32(&b, 1);
    raw_send_buf(fd, &b);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    /* VALIDATE with another magic */
    fd = raw_connect(store_server_port(s));
    req_begin(&b, STORE_OP_VALIDATE);
    store_buf_put_u32(&b, 0xdeadbeef);
    raw_send_buf(fd, &b);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    /* AUTH without HELLO, from a client that never said HELLO: a PyTorch client's unknown op */
    fd = raw_connect(store_server_port(s));
    raw_validate(fd);
    req_begin(&b, STORE_OP_AUTH);
    store_buf_put_bytes(&b, "0123456789abcdef0123456789abcdef", 32);
    raw_send_buf(fd, &b);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    /* WAIT with more keys than allowed */
    fd = greeted_raw(s);
    req_begin(&b, STORE_OP_WAIT);
    store_buf_put_u64(&b, STORE_MAX_KEYS + 1);
    raw_send_buf(fd, &b);
    cr_assert_eq(raw_recv_status(fd, msg, sizeof msg), STORE_ST_PROTO);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    store_buf_free(&b);
    assert_serving(s, c);
    int64_t nk;
    cr_assert_eq(store_client_num_keys(c, &nk), 0);
    cr_assert_eq(nk, 1, "malformed requests left keys behind");
    store_client_close(c);
    store_server_stop(s);
}

Test(store_robust, silent_client_closed_after_idle_timeout)
{
    struct store_server *s = test_server("job", NULL, 0.5);
    struct store_client *c = test_client(s);
    int fd = raw_connect(store_server_port(s));
    double waited = raw_wait_closed(fd, 15);
    cr_assert_geq(waited, 0.3, "silent client closed after %.2f s", waited);
    close(fd);
    /* half a VALIDATE is no better */
    fd = raw_connect(store_server_port(s));
    raw_send(fd, "\0\xce\xf7", 3);
    waited = raw_wait_closed(fd, 15);
    cr_assert_geq(waited, 0.3);
    close(fd);
    /* HELLO answered, AUTH never sent */
    fd = raw_connect(store_server_port(s));
    uint8_t cn[32] = {0}, sn[32];
    cr_assert_eq(raw_hello(fd, STORE_PROTOCOL_VERSION, "job", cn, sn, NULL, 0), STORE_ST_OK);
    waited = raw_wait_closed(fd, 15);
    cr_assert_geq(waited, 0.3);
    close(fd);
    /* a PyTorch client that validated may idle, as under c10d's server */
    fd = raw_connect(store_server_port(s));
    raw_validate(fd);
    cr_assert_lt(raw_wait_closed(fd, 1.0), 0, "a validated PyTorch client was dropped while idle");
    close(fd);
    assert_serving(s, c);
    store_client_close(c);
    store_server_stop(s);
}

/* With the torch protocol off, a connection has the handshake deadline until it authenticates. */
Test(store_robust, torch_off_validated_client_closed_after_idle_timeout)
{
    struct store_server_options o = {.run_id = "job", .idle_timeout_s = 0.5, .torch_off = true};
    struct store_server *s = test_server_opts(&o);
    int fd = raw_connect(store_server_port(s));
    raw_validate(fd);
    double waited = raw_wait_closed(fd, 15);
    cr_assert_geq(waited, 0.3);
    close(fd);
    store_server_stop(s);
}

Test(store_robust, wrong_version_and_magic_refused)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    int fd = raw_connect(store_server_port(s));
    uint8_t cn[32] = {0}, sn[32];
    char msg[512];
    cr_assert_eq(raw_hello(fd, STORE_PROTOCOL_VERSION + 1, "job", cn, sn, msg, sizeof msg), STORE_ST_REFUSED);
    cr_assert(strstr(msg, "protocol version 2, the client speaks version 3"), "%s", msg);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    fd = raw_connect(store_server_port(s));
    struct store_buf b;
    store_buf_init(&b);
    req_begin(&b, STORE_OP_VALIDATE);
    store_buf_put_u32(&b, STORE_VALIDATE_MAGIC);
    store_buf_put_u8(&b, STORE_OP_HELLO);
    store_buf_put_u32(&b, 0xdeadbeef);
    store_buf_put_u16(&b, STORE_PROTOCOL_VERSION);
    store_buf_put_str(&b, "job");
    store_buf_put_bytes(&b, cn, 32);
    raw_send_buf(fd, &b);
    store_buf_free(&b);
    cr_assert_eq(raw_recv_status(fd, msg, sizeof msg), STORE_ST_REFUSED);
    cr_assert(strstr(msg, "bad magic"), "%s", msg);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    assert_serving(s, c);
    store_client_close(c);
    store_server_stop(s);
}

static void send_wait(int fd, const char *key)
{
    struct store_buf b;
    store_buf_init(&b);
    req_begin(&b, STORE_OP_WAIT);
    store_buf_put_u64(&b, 1);
    store_buf_put_str(&b, key);
    raw_send_buf(fd, &b);
    store_buf_free(&b);
}

Test(store_robust, disconnect_mid_wait_does_not_disturb_others)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    int quitter = greeted_raw(s), stayer = greeted_raw(s);
    send_wait(quitter, "k");
    send_wait(stayer, "k");
    test_sleep(0.1);
    close(quitter);
    /* a real client blocked in GET, killed outright */
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct store_client *cc = NULL;
        if (test_connect_opts(store_server_port(s), "job", NULL, 10, &cc) != 0)
            _exit(2);
        void *v;
        size_t n;
        store_client_get(cc, "k", &v, &n, 30);
        _exit(3);
    }
    test_sleep(0.3);
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFSIGNALED(st), "child finished its GET on its own (status %d)", st);
    test_sleep(0.1);
    cr_assert_eq(store_client_set(c, "k", "val", 3), 0, "%s", error_message());
    uint8_t r[2];
    cr_assert_eq(raw_recv(stayer, r, 2, 10), 2);
    cr_assert_eq(r[0], STORE_ST_OK);
    cr_assert_eq(r[1], STORE_WAIT_STOP);
    close(stayer);
    int64_t nk;
    cr_assert_eq(store_client_num_keys(c, &nk), 0);
    cr_assert_eq(nk, 1);
    assert_serving(s, c);
    store_client_close(c);
    store_server_stop(s);
}

Test(store_robust, pipelined_requests_answered_in_order)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    int fd = greeted_raw(s);
    struct store_buf b;
    store_buf_init(&b);
    /* WAIT (parks) and PING in one write: the PING is answered after the WAIT */
    req_begin(&b, STORE_OP_WAIT);
    store_buf_put_u64(&b, 1);
    store_buf_put_str(&b, "p");
    store_buf_put_u8(&b, STORE_OP_PING);
    store_buf_put_u32(&b, 77);
    raw_send_buf(fd, &b);
    uint8_t r[8];
    cr_assert_eq(raw_recv(fd, r, 1, 0.3), -1, "a reply arrived before the key was set");
    cr_assert_eq(store_client_set(c, "p", "1", 1), 0);
    cr_assert_eq(raw_recv(fd, r, 2, 10), 2);
    cr_assert_eq(r[0], STORE_ST_OK);
    cr_assert_eq(r[1], STORE_WAIT_STOP);
    cr_assert_eq(raw_recv(fd, r, 5, 10), 5);
    cr_assert_eq(r[0], STORE_ST_OK);
    cr_assert_eq(store_le32(r + 1), 77);
    /* SET, ADD, GET, PING in one write: four replies in order */
    req_begin(&b, STORE_OP_SET);
    store_buf_put_str(&b, "n");
    store_buf_put_bytes(&b, "40", 2);
    store_buf_put_u8(&b, STORE_OP_ADD);
    store_buf_put_str(&b, "n");
    store_buf_put_u64(&b, 2);
    store_buf_put_u8(&b, STORE_OP_GET);
    store_buf_put_str(&b, "n");
    store_buf_put_u8(&b, STORE_OP_PING);
    store_buf_put_u32(&b, 5);
    raw_send_buf(fd, &b);
    uint8_t all[1 + 9 + 11 + 5];
    cr_assert_eq(raw_recv(fd, all, sizeof all, 10), (long)sizeof all);
    cr_assert_eq(all[0], STORE_ST_OK);
    cr_assert_eq(all[1], STORE_ST_OK);
    cr_assert_eq(store_le64(all + 2), 42);
    cr_assert_eq(all[10], STORE_ST_OK);
    cr_assert_eq(store_le64(all + 11), 2);
    cr_assert_eq(memcmp(all + 19, "42", 2), 0);
    cr_assert_eq(all[21], STORE_ST_OK);
    cr_assert_eq(store_le32(all + 22), 5);
    /* a CANCEL_WAIT right behind a WAIT is read while the WAIT waits */
    req_begin(&b, STORE_OP_WAIT);
    store_buf_put_u64(&b, 1);
    store_buf_put_str(&b, "never");
    raw_send_buf(fd, &b);
    cr_assert_eq(raw_recv(fd, r, 1, 0.2), -1);
    req_begin(&b, STORE_OP_CANCEL_WAIT);
    raw_send_buf(fd, &b);
    cr_assert_eq(raw_recv(fd, r, 2, 10), 2);
    cr_assert_eq(r[1], STORE_WAIT_CANCELED);
    store_buf_free(&b);
    close(fd);
    store_client_close(c);
    store_server_stop(s);
}

/* Connections without fsdpc's token reserve requests larger than their read window from their one budget
 * while the requests arrive; one that would pass it is closed at once, the others are not disturbed. */
Test(store_robust, unauthenticated_big_requests_share_a_budget)
{
    struct store_server_options o = {.run_id = "job", .unauth_bytes_max = 1 << 20};
    struct store_server *s = test_server_opts(&o);
    struct store_client *c = test_client(s);
    int fd[3];
    struct store_buf b;
    store_buf_init(&b);
    for (int i = 0; i < 3; i++) {
        fd[i] = raw_connect(store_server_port(s));
        raw_validate(fd[i]);
        req_begin(&b, STORE_OP_SET);
        store_buf_put_str(&b, "/big");
        store_buf_put_u64(&b, 600 * 1024); /* announced; 1 KB sent */
        for (int k = 0; k < 1024; k++)
            store_buf_put_u8(&b, 'x');
        raw_send_buf(fd[i], &b);
        test_sleep(0.1);
    }
    cr_assert_lt(raw_wait_closed(fd[0], 0.3), 0, "the first big request was refused");
    cr_assert_geq(raw_wait_closed(fd[1], 10), 0, "the second one passed the 1 MiB budget");
    cr_assert_geq(raw_wait_closed(fd[2], 10), 0);
    /* the first finishes its request and is served */
    static char rest[600 * 1024 - 1024];
    memset(rest, 'x', sizeof rest);
    raw_send(fd[0], rest, sizeof rest);
    req_begin(&b, STORE_OP_GETNUMKEYS);
    raw_send_buf(fd[0], &b);
    cr_assert_eq(raw_recv_u64(fd[0]), 1);
    for (int i = 0; i < 3; i++)
        close(fd[i]);
    store_buf_free(&b);
    assert_serving(s, c);
    store_client_close(c);
    store_server_stop(s);
}

/* A client that sends requests without reading the replies stops being read once its unsent replies
 * pass out_max: the server holds about out_max plus one reply for it, not one reply per request. Each
 * request names an 8 KB key and asks for its 16 KB value, so the socket buffers on both sides fill after
 * some thousand requests; a server that kept reading would take all 20000 (320 MB of replies). */
Test(store_robust, unread_replies_stop_reading)
{
    struct store_server_options o = {.run_id = "job", .out_max = 64 * 1024};
    struct store_server *s = test_server_opts(&o);
    struct store_client *c = test_client(s);
    static char val[16 << 10], key[8000];
    memset(val, 'v', sizeof val);
    memset(key, 'k', sizeof key - 1);
    cr_assert_eq(store_client_set(c, key, val, sizeof val), 0);
    int fd = greeted_raw(s);
    int rcv = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    struct store_buf b;
    store_buf_init(&b);
    req_begin(&b, STORE_OP_GET);
    store_buf_put_str(&b, key);
    enum { REQUESTS = 20000 };
    int sent = 0;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    double t0 = test_now(), last_progress = t0;
    size_t off = 0; /* into the request being sent */
    while (sent < REQUESTS && test_now() - last_progress < 1.0 && test_now() - t0 < 20) {
        ssize_t w = send(fd, b.data + off, b.len - off, MSG_NOSIGNAL);
        if (w > 0) {
            last_progress = test_now();
            if ((off += (size_t)w) == b.len) {
                sent++;
                off = 0;
            }
        } else {
            test_sleep(0.01);
        }
    }
    cr_assert_lt(sent, REQUESTS, "the server kept reading requests whose replies were not read");
    assert_serving(s, c);
    /* reading the replies lets it go on */
    store_buf_free(&b);
    close(fd);
    store_client_close(c);
    store_server_stop(s);
}

/* A peer that speaks c10d but not fsdpc's handshake (a PyTorch TCPStore): it echoes the PING, then drops
 * the connection at HELLO. The client says so instead of retrying until its timeout. */
static void *plain_tcpstore_thread(void *arg)
{
    int lfd = *(int *)arg;
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    uint8_t buf[256];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n >= 10)
        send(fd, buf + 6, 4, MSG_NOSIGNAL); /* VALIDATE (5 bytes), PING op, its nonce */
    close(fd);
    return NULL;
}

/* ---- 1024 concurrent clients ---- */

enum { MANY = 1024 };

struct many_arg {
    int port;
    int id;
    int fail;
    char msg[256];
};

static void *many_thread(void *arg)
{
    struct many_arg *a = arg;
    struct store_client *c = NULL;
    int rc = test_connect_opts(a->port, "job", NULL, 60, &c);
    if (rc == 0) {
        char key[32], val[32];
        snprintf(key, sizeof key, "client/%d", a->id);
        snprintf(val, sizeof val, "%d", a->id * 7);
        rc = store_client_set(c, key, val, strlen(val));
        /* everyone is connected at once inside the barrier */
        if (rc == 0)
            rc = store_client_barrier(c, "all", MANY, 90);
        /* and reads a neighbour's key, which exists because the neighbour passed the barrier too */
        snprintf(key, sizeof key, "client/%d", (a->id + 1) % MANY);
        void *v = NULL;
        size_t n;
        if (rc == 0)
            rc = store_client_get(c, key, &v, &n, 10);
        if (rc == 0 && atoi(v) != ((a->id + 1) % MANY) * 7)
            rc = FSDP_EPROTO;
        free(v);
    }
    if (rc != 0) {
        a->fail = rc;
        snprintf(a->msg, sizeof a->msg, "%s", error_message());
    }
    store_client_close(c);
    return NULL;
}

Test(store_robust, clients_1024_concurrent, .timeout = 100)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_max < 2 * MANY + 64)
        cr_skip_test("open-files hard limit %lu is below %d", (unsigned long)rl.rlim_max, 2 * MANY + 64);
    struct store_server *s = test_server("job", NULL, 60); /* start raises the soft limit for us too */
    static struct many_arg args[MANY];
    static pthread_t t[MANY];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (int i = 0; i < MANY; i++) {
        args[i] = (struct many_arg){.port = store_server_port(s), .id = i};
        cr_assert_eq(pthread_create(&t[i], &attr, many_thread, &args[i]), 0, "thread %d", i);
    }
    int failed = 0, first = -1;
    for (int i = 0; i < MANY; i++) {
        pthread_join(t[i], NULL);
        if (args[i].fail) {
            failed++;
            if (first < 0)
                first = i;
        }
    }
    cr_assert_eq(failed, 0, "%d clients failed; first (%d): %s", failed, first, first >= 0 ? args[first].msg : "");
    struct store_client *c = test_client(s);
    int64_t nk;
    cr_assert_eq(store_client_num_keys(c, &nk), 0);
    cr_assert_eq(nk, MANY + 2, "keys: %ld", (long)nk); /* MANY client keys + barrier count + done */
    store_client_close(c);
    store_server_stop(s);
}

#include <dirent.h>

static int highest_open_fd(void)
{
    DIR *d = opendir("/proc/self/fd");
    cr_assert_not_null(d);
    int hi = -1;
    for (struct dirent *e; (e = readdir(d));)
        if (atoi(e->d_name) > hi)
            hi = atoi(e->d_name);
    closedir(d);
    return hi;
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

/* Out of descriptors the server must neither spin on accept nor lose the clients in its backlog: they
 * get in once descriptors are available again. */
Test(store_robust, out_of_descriptors_pauses_accepting)
{
    struct store_server *s = test_server("job", NULL, 0);
    int port = store_server_port(s);
    struct rlimit saved;
    getrlimit(RLIMIT_NOFILE, &saved);
    struct rlimit tight = {.rlim_cur = (rlim_t)highest_open_fd() + 3, .rlim_max = saved.rlim_max};
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &tight), 0); /* before the clients exist (as in warns_once) */
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        setrlimit(RLIMIT_NOFILE, &saved);
        struct store_client *cs[8];
        for (int i = 0; i < 8; i++)
            if (test_connect_opts(port, "job", NULL, 30, &cs[i]) != 0 || store_client_ping(cs[i]) != 0)
                _exit(10 + i);
        for (int i = 0; i < 8; i++)
            store_client_close(cs[i]);
        _exit(0);
    }
    double cpu0 = cpu_seconds();
    test_sleep(1.0);
    double busy = cpu_seconds() - cpu0;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &saved), 0);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "clients failed (status 0x%x)", st);
    cr_assert_lt(busy, 0.1, "server spun on accept: %.2f s of CPU in 1 s", busy);
    store_server_stop(s);
}

/* ---- the client against peers that are not a working store ---- */

struct fake_server {
    int lfd;
    const char *reply; /* sent after reading the handshake; NULL = say nothing */
    size_t reply_len;
};

static void *fake_server_thread(void *arg)
{
    struct fake_server *f = arg;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    char buf[256];
    if (recv(fd, buf, sizeof buf, 0) > 0 && f->reply)
        send(fd, f->reply, f->reply_len, MSG_NOSIGNAL);
    /* hold the connection until the client gives up */
    while (recv(fd, buf, sizeof buf, 0) > 0)
        ;
    close(fd);
    return NULL;
}

static int fake_listen(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(fd, 4), 0);
    return fd;
}

static int fake_port(int fd)
{
    struct sockaddr_in a;
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    return ntohs(a.sin_port);
}

Test(store_robust, client_against_silent_peer_times_out)
{
    struct fake_server f = {.lfd = fake_listen()};
    pthread_t t;
    pthread_create(&t, NULL, fake_server_thread, &f);
    struct store_client *c = NULL;
    double t0 = test_now();
    int rc = test_connect_opts(fake_port(f.lfd), "job", NULL, 1, &c);
    double dt = test_now() - t0;
    cr_assert_eq(rc, FSDP_ETIMEDOUT, "rc %d: %s", rc, error_message());
    cr_assert_lt(dt, 15);
    char expect[96];
    snprintf(expect, sizeof expect, "no reply from store at 127.0.0.1:%d", fake_port(f.lfd));
    cr_assert(strstr(error_message(), expect), "%s", error_message());
    cr_assert(strstr(error_message(), "handshake"), "%s", error_message());
    pthread_join(t, NULL);
    close(f.lfd);
}

Test(store_robust, client_against_foreign_peer_protocol_error)
{
    static const char http[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    struct fake_server f = {.lfd = fake_listen(), .reply = http, .reply_len = sizeof http - 1};
    pthread_t t;
    pthread_create(&t, NULL, fake_server_thread, &f);
    struct store_client *c = NULL;
    int rc = test_connect_opts(fake_port(f.lfd), "job", NULL, 5, &c);
    cr_assert_eq(rc, FSDP_EPROTO, "rc %d: %s", rc, error_message());
    cr_assert(strstr(error_message(), "is it an fsdpc store?"), "%s", error_message());
    pthread_join(t, NULL);
    close(f.lfd);
}

Test(store_robust, client_against_plain_tcpstore_says_so)
{
    int lfd = fake_listen();
    pthread_t t;
    pthread_create(&t, NULL, plain_tcpstore_thread, &lfd);
    struct store_client *c = NULL;
    double t0 = test_now();
    int rc = test_connect_opts(fake_port(lfd), "job", NULL, 20, &c);
    cr_assert_eq(rc, FSDP_EPROTO, "rc %d: %s", rc, error_message());
    cr_assert_lt(test_now() - t0, 5, "the client retried an answer");
    cr_assert(strstr(error_message(), "not fsdpc's handshake"), "%s", error_message());
    pthread_join(t, NULL);
    close(lfd);
}

/* Out of descriptors for 1.5 s (the server retries every 100 ms): one "accept failed" warning, not one per
 * retry (it used to log about 15 here, ten a second for as long as the shortage lasted). The warnings go to
 * stderr, redirected to a file for the test. */
Test(store_robust, out_of_descriptors_warns_once)
{
    char path[] = "/tmp/fsdp-store-warn-XXXXXX";
    int logfd = mkstemp(path);
    cr_assert_geq(logfd, 0);
    int saved_err = dup(2);
    cr_assert_eq(dup2(logfd, 2), 2);
    struct store_server *s = test_server("job", NULL, 0);
    int port = store_server_port(s);
    struct rlimit saved;
    getrlimit(RLIMIT_NOFILE, &saved);
    /* no descriptor left at all: the holes below the highest one filled (the sanitizer build leaves some,
     * and accept would fill them), the limit just above it */
    int fillers[256], n_fill = 0, hi = highest_open_fd();
    for (int fd; n_fill < 256 && (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) {
        fillers[n_fill++] = fd;
        if (fd > hi)
            break;
    }
    struct rlimit tight = {.rlim_cur = (rlim_t)highest_open_fd() + 1, .rlim_max = saved.rlim_max};
    /* tight before the clients exist: a client that connected before it would be accepted, and the test
     * would see no shortage at all (it did, in CI's sanitizer build) */
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &tight), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        setrlimit(RLIMIT_NOFILE, &saved);
        struct store_client *cs[8];
        for (int i = 0; i < 8; i++)
            if (test_connect_opts(port, "job", NULL, 30, &cs[i]) != 0 || store_client_ping(cs[i]) != 0)
                _exit(10 + i);
        for (int i = 0; i < 8; i++)
            store_client_close(cs[i]);
        _exit(0);
    }
    test_sleep(1.5);
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &saved), 0);
    for (int i = 0; i < n_fill; i++)
        close(fillers[i]);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    store_server_stop(s);
    dup2(saved_err, 2);
    close(saved_err);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "clients failed (status 0x%x)", st);
    char text[1 << 16];
    ssize_t n = pread(logfd, text, sizeof text - 1, 0);
    close(logfd);
    unlink(path);
    cr_assert_geq(n, 0);
    text[n] = '\0';
    int warnings = 0;
    for (const char *p = text; (p = strstr(p, "accept failed")); p++)
        warnings++;
    cr_assert_eq(warnings, 1, "%d \"accept failed\" warnings in 1.5 s:\n%s", warnings, text);
}

/* ---- the cap on connections without the job's token (docs/store.md, "Connections") ---- */

/* stderr (where the server's warnings go) into a temporary file, until log_capture_end. */
struct log_capture {
    char path[64];
    int fd, saved;
};

static void log_capture_begin(struct log_capture *lc)
{
    snprintf(lc->path, sizeof lc->path, "/tmp/fsdp-store-cap-XXXXXX");
    lc->fd = mkstemp(lc->path);
    cr_assert_geq(lc->fd, 0);
    lc->saved = dup(2);
    cr_assert_eq(dup2(lc->fd, 2), 2);
}

/* Restores stderr; returns what was written (malloc'd). */
static char *log_capture_end(struct log_capture *lc)
{
    dup2(lc->saved, 2);
    close(lc->saved);
    char *text = calloc(1, 1 << 16);
    ssize_t n = pread(lc->fd, text, (1 << 16) - 1, 0);
    text[n > 0 ? n : 0] = '\0';
    close(lc->fd);
    unlink(lc->path);
    return text;
}

static int count_of(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p++)
        n++;
    return n;
}

/* "127.0.0.1:PORT" of fd's own end, as the server names the peer. */
static void local_name(int fd, char *out, size_t cap)
{
    struct sockaddr_in a;
    socklen_t sl = sizeof a;
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
    snprintf(out, cap, "127.0.0.1:%d", ntohs(a.sin_port));
}

/* VALIDATE and a PING on a raw connection, answered: the server has read both. */
static int raw_validated(int port)
{
    int fd = raw_connect(port);
    uint8_t b[10] = {STORE_OP_VALIDATE, 0xce, 0xf7, 0x85, 0x3c, STORE_OP_PING, 7, 0, 0, 0}, echo[4];
    raw_send(fd, b, sizeof b);
    cr_assert_eq(raw_recv(fd, echo, 4, 10), 4, "no PING echo");
    return fd;
}

static bool raw_pings(int fd)
{
    uint8_t b[5] = {STORE_OP_PING, 9, 0, 0, 0}, echo[4];
    return send(fd, b, sizeof b, MSG_NOSIGNAL) == (ssize_t)sizeof b && raw_recv(fd, echo, 4, 5) == 4 &&
           echo[0] == 9;
}

static const char CAP_LINE[] = "connections without the job's token reached the cap";

/* Cap 4: a PyTorch client that works and three connections that validated and went idle fill it. A fifth
 * connection closes the idle one that waited longest, with one line naming it; the PyTorch client and the
 * others are kept. Without a cap every one of them stayed open (validated connections have no deadline). */
Test(store_robust, past_the_cap_the_idlest_connection_is_closed_and_named)
{
    struct log_capture lc;
    log_capture_begin(&lc);
    struct store_server_options o = {.run_id = "job", .idle_timeout_s = 60, .max_unauth_conns = 4};
    struct store_server *s = test_server_opts(&o);
    int port = store_server_port(s);
    struct store_client *torch = test_plain_client(port);
    cr_assert_eq(store_client_set(torch, "k", "v", 1), 0, "%s", error_message());
    int idle[3];
    for (int i = 0; i < 3; i++)
        idle[i] = raw_validated(port);
    char first[64];
    local_name(idle[0], first, sizeof first);
    test_sleep(1.2); /* idle long enough to be the suspects */
    cr_assert_eq(store_client_set(torch, "k", "w", 1), 0, "%s", error_message());
    int fifth = raw_validated(port);
    double closed = raw_wait_closed(idle[0], 5);
    char *log = log_capture_end(&lc);
    cr_assert_geq(closed, 0, "the idlest connection was not closed at the cap:\n%s", log);
    for (int i = 1; i < 3; i++)
        cr_assert(raw_pings(idle[i]), "idle connection %d closed too", i);
    cr_assert(raw_pings(fifth), "the newcomer was closed");
    void *v = NULL;
    size_t n;
    cr_assert_eq(store_client_get(torch, "k", &v, &n, 5), 0, "the PyTorch client was closed: %s", error_message());
    free(v);
    cr_assert_eq(count_of(log, CAP_LINE), 1, "want one cap line:\n%s", log);
    const char *line = strstr(log, CAP_LINE);
    const char *eol = strchr(line, '\n');
    char *peer = strstr(line, first);
    cr_assert(peer && (!eol || peer < eol), "the cap line does not name %s:\n%s", first, log);
    cr_assert(strstr(line, "still in its handshake"), "%s", log);
    free(log);
    for (int i = 0; i < 3; i++)
        close(idle[i]);
    close(fifth);
    store_client_close(torch);
    store_server_stop(s);
}

/* Authenticated connections are the job's and never count: ten of them and a full cap of idle ones. */
Test(store_robust, authenticated_connections_are_not_counted)
{
    struct store_server_options o = {.run_id = "job", .idle_timeout_s = 60, .max_unauth_conns = 4};
    struct store_server *s = test_server_opts(&o);
    int port = store_server_port(s);
    struct store_client *ranks[10];
    for (int i = 0; i < 10; i++)
        ranks[i] = test_client(s);
    int idle[4];
    for (int i = 0; i < 4; i++)
        idle[i] = raw_validated(port);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(store_client_ping(ranks[i]), 0, "rank %d: %s", i, error_message());
    for (int i = 0; i < 4; i++)
        cr_assert(raw_pings(idle[i]), "idle connection %d closed below the cap", i);
    for (int i = 0; i < 10; i++)
        store_client_close(ranks[i]);
    for (int i = 0; i < 4; i++)
        close(idle[i]);
    store_server_stop(s);
}

/* A rank in the middle of its handshake (HELLO answered, AUTH about to go) while, in that round trip, far
 * more than the cap of new connections arrive: idle ones that send nothing and guessers from another
 * address whose AUTHs wait for the throttle. Room is made by closing those, never the rank's connection:
 * its AUTH is answered. The cap used to close the connection in its handshake idle longest, which was the
 * rank's, and the job lost a rank to a flood during its handshakes. */
Test(store_robust, a_rank_in_its_handshake_outlives_a_flood_at_the_cap, .timeout = 60)
{
    struct store_server_options o = {.run_id = "job", .secret = "s3cret", .idle_timeout_s = 60,
                                     .max_unauth_conns = 16};
    struct store_server *s = test_server_opts(&o);
    int port = store_server_port(s);
    int rank = raw_connect(port);
    uint8_t cn[32] = {1, 2, 3}, sn[32];
    cr_assert_eq(raw_hello(rank, STORE_PROTOCOL_VERSION, "job", cn, sn, NULL, 0), STORE_ST_OK);
    enum { SILENT = 100, GUESSES = 100 };
    int flood[SILENT + GUESSES];
    for (int i = 0; i < SILENT; i++)
        flood[i] = raw_connect(port);
    for (int i = 0; i < GUESSES; i++)
        flood[SILENT + i] = raw_fire_guess(port, 2);
    test_sleep(0.2); /* the server has taken them all in */
    uint8_t key[STORE_KEY_BYTES], mac[32];
    store_auth_key("job", "s3cret", key);
    store_auth_mac(key, 'c', "job", 3, cn, 32, sn, 32, mac);
    struct store_buf b;
    store_buf_init(&b);
    store_buf_put_u8(&b, STORE_OP_AUTH);
    store_buf_put_bytes(&b, mac, 32);
    raw_send_buf(rank, &b);
    store_buf_free(&b);
    uint8_t st = 0xff;
    cr_assert_eq(raw_recv(rank, &st, 1, 10), 1, "the rank's connection was closed in its handshake");
    cr_assert_eq(st, STORE_ST_OK);
    for (int i = 0; i < SILENT + GUESSES; i++)
        close(flood[i]);
    close(rank);
    store_server_stop(s);
}

/* The attacker of the next test: in a child (no cr_* here), its own open-files limit. Opens `hold`
 * connections that validate and go idle, says so on `ready`, then opens one more every 10 ms until `stop`
 * closes (or 20 s pass). */
static int flood_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    uint8_t v[5] = {STORE_OP_VALIDATE, 0xce, 0xf7, 0x85, 0x3c};
    if (send(fd, v, sizeof v, MSG_NOSIGNAL) != (ssize_t)sizeof v) {
        close(fd);
        return -1;
    }
    return fd;
}

static void flood_child(int port, int hold, int ready, int stop)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    int opened = 0;
    for (int i = 0; i < hold; i++)
        opened += flood_connect(port) >= 0;
    if (write(ready, &opened, sizeof opened) != (ssize_t)sizeof opened)
        _exit(1);
    for (int i = 0; i < 2000; i++) {
        struct pollfd p = {.fd = stop, .events = POLLIN};
        if (poll(&p, 1, 10) != 0)
            break;
        flood_connect(port);
    }
    _exit(0);
}

/* The launcher's open-files limit at 256 (cap: 128) and 400 idle connections, with more arriving every 10
 * ms: ranks still get in, a rank connected before keeps working, and a restarted rank reconnects. Without
 * the cap the idle connections took every descriptor and a rank's connection waited in the backlog until
 * its connect timeout. The cap line comes at most once a second. */
Test(store_robust, ranks_get_in_while_idle_clients_fill_the_cap, .timeout = 90)
{
    int ready[2], stop[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(stop), 0);
    int portpipe[2];
    cr_assert_eq(pipe(portpipe), 0);
    pid_t pid = fork(); /* before the limit goes down: the attacker keeps the hard limit */
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(ready[0]);
        close(stop[1]);
        close(portpipe[1]);
        int port = 0;
        if (read(portpipe[0], &port, sizeof port) != (ssize_t)sizeof port || port <= 0)
            _exit(1);
        flood_child(port, 400, ready[1], stop[0]);
    }
    close(ready[1]);
    close(stop[0]);
    close(portpipe[0]);
    struct rlimit tight = {.rlim_cur = 256, .rlim_max = 256};
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &tight), 0);
    struct log_capture lc;
    log_capture_begin(&lc);
    double t0 = test_now();
    struct store_server *s = test_server("job", NULL, 60);
    int port = store_server_port(s);
    struct store_client *before = test_client(s);
    cr_assert_eq(write(portpipe[1], &port, sizeof port), (ssize_t)sizeof port);
    close(portpipe[1]);
    int opened = 0;
    cr_assert_eq(read(ready[0], &opened, sizeof opened), (ssize_t)sizeof opened);
    cr_assert_eq(opened, 400, "the attacker opened %d connections", opened);
    /* a rank joins while the flood goes on; then it restarts and joins again */
    for (int round = 0; round < 2; round++) {
        struct store_client *rank = NULL;
        int rc = test_connect_opts(port, "job", NULL, 10, &rank);
        cr_assert_eq(rc, 0, "round %d: a rank could not join while the cap was full: %s", round, error_message());
        char val[8];
        snprintf(val, sizeof val, "r%d", round);
        cr_assert_eq(store_client_set(rank, "rank", val, strlen(val)), 0, "%s", error_message());
        void *v = NULL;
        size_t n;
        cr_assert_eq(store_client_get(before, "rank", &v, &n, 5), 0, "the earlier rank: %s", error_message());
        cr_assert_str_eq(v, val);
        free(v);
        store_client_close(rank);
    }
    close(stop[1]);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert_eq(store_client_ping(before), 0, "the earlier rank was closed: %s", error_message());
    store_client_close(before);
    store_server_stop(s);
    double took = test_now() - t0;
    char *log = log_capture_end(&lc);
    int lines = count_of(log, CAP_LINE);
    cr_assert(lines >= 1 && lines <= (int)took + 2, "%d cap lines in %.1f s:\n%.3000s", lines, took, log);
    cr_assert(strstr(log, "(128): closing 127.0.0.1:"), "the cap is not half the open-files limit:\n%.3000s", log);
    free(log);
}
