/* The store under hostile or broken peers: each bad connection is closed alone and everyone else keeps
 * being served; plus 1024 concurrent clients. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>

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

static int greeted_raw(struct store_server *s)
{
    int fd = raw_connect(store_server_port(s));
    raw_hello(fd, STORE_PROTOCOL_VERSION, "job");
    uint8_t buf[64];
    cr_assert_gt(raw_recv_frame(fd, buf, sizeof buf, 10), 0);
    cr_assert_eq(buf[0], STORE_ST_OK);
    return fd;
}

Test(store_robust, garbage_before_handshake_closed)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    int fd = raw_connect(store_server_port(s));
    const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"; /* "GET " reads as a ~540 MB length */
    raw_send(fd, http, sizeof http - 1);
    cr_assert_geq(raw_wait_closed(fd, 10), 0, "server kept a connection that sent garbage");
    close(fd);
    assert_serving(s, c);
    store_client_close(c);
    store_server_stop(s);
}

Test(store_robust, oversized_frame_closed)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    int fd = greeted_raw(s);
    uint8_t hdr[5];
    uint32_t n = STORE_MAX_FRAME_BYTES + 1;
    for (int i = 0; i < 4; i++)
        hdr[i] = (uint8_t)(n >> (8 * i));
    hdr[4] = STORE_OP_SET;
    raw_send(fd, hdr, sizeof hdr);
    cr_assert_geq(raw_wait_closed(fd, 10), 0, "server kept a connection announcing an oversized frame");
    close(fd);
    /* a zero-length frame is no frame either */
    fd = greeted_raw(s);
    raw_send(fd, "\0\0\0\0", 4);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    assert_serving(s, c);
    store_client_close(c);
    store_server_stop(s);
}

Test(store_robust, truncated_frame_closed_after_idle_timeout)
{
    struct store_server *s = test_server("job", NULL, 0.5);
    struct store_client *c = test_client(s);
    int fd = greeted_raw(s);
    uint8_t part[10] = {100, 0, 0, 0, STORE_OP_SET, 1, 2, 3, 4, 5}; /* announces 100 bytes, sends 6 */
    raw_send(fd, part, sizeof part);
    double waited = raw_wait_closed(fd, 15);
    cr_assert_geq(waited, 0.3, "closed after %.2f s, before the idle timeout", waited);
    close(fd);
    assert_serving(s, c);
    /* a client that only idles between requests is not a stalled frame */
    test_sleep(0.8);
    cr_assert_eq(store_client_ping(c), 0, "idle greeted client was dropped: %s", error_message());
    store_client_close(c);
    store_server_stop(s);
}

Test(store_robust, malformed_frame_answered_then_closed)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    int fd = greeted_raw(s);
    /* SET whose key length runs past the end of the frame */
    struct store_buf b;
    store_buf_init(&b);
    store_buf_begin(&b, STORE_OP_SET);
    store_buf_put_u32(&b, 500);
    store_buf_put_raw(&b, "abc", 3);
    raw_send_buf(fd, &b);
    uint8_t buf[600];
    long n = raw_recv_frame(fd, buf, sizeof buf, 10);
    cr_assert_gt(n, 0);
    cr_assert_eq(buf[0], STORE_ST_PROTO);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    /* unknown op */
    fd = greeted_raw(s);
    store_buf_begin(&b, 0x7f);
    raw_send_buf(fd, &b);
    n = raw_recv_frame(fd, buf, sizeof buf, 10);
    cr_assert_gt(n, 0);
    cr_assert_eq(buf[0], STORE_ST_PROTO);
    cr_assert(memmem(buf, (size_t)n, "unknown op", 10));
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    /* a request before the handshake */
    fd = raw_connect(store_server_port(s));
    store_buf_begin(&b, STORE_OP_PING);
    raw_send_buf(fd, &b);
    n = raw_recv_frame(fd, buf, sizeof buf, 10);
    cr_assert_gt(n, 0);
    cr_assert_eq(buf[0], STORE_ST_REFUSED);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    /* WAIT with a key count that does not match its keys */
    fd = greeted_raw(s);
    store_buf_begin(&b, STORE_OP_WAIT);
    store_buf_put_u32(&b, 1000);
    store_buf_put_u32(&b, 3);
    store_buf_put_str(&b, "only-one");
    raw_send_buf(fd, &b);
    n = raw_recv_frame(fd, buf, sizeof buf, 10);
    cr_assert_gt(n, 0);
    cr_assert_eq(buf[0], STORE_ST_PROTO);
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
    /* half a handshake is no better */
    fd = raw_connect(store_server_port(s));
    raw_send(fd, "\x20\0\0\0\x01", 5);
    waited = raw_wait_closed(fd, 15);
    cr_assert_geq(waited, 0.3);
    close(fd);
    assert_serving(s, c);
    store_client_close(c);
    store_server_stop(s);
}

Test(store_robust, wrong_version_and_magic_refused)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    int fd = raw_connect(store_server_port(s));
    raw_hello(fd, STORE_PROTOCOL_VERSION + 1, "job");
    uint8_t buf[600];
    long n = raw_recv_frame(fd, buf, sizeof buf, 10);
    cr_assert_gt(n, 5);
    cr_assert_eq(buf[0], STORE_ST_REFUSED);
    char msg[600] = {0};
    memcpy(msg, buf + 5, (size_t)n - 5);
    cr_assert(strstr(msg, "protocol version 1, the client speaks version 2"), "%s", msg);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    fd = raw_connect(store_server_port(s));
    struct store_buf b;
    store_buf_init(&b);
    store_buf_begin(&b, STORE_OP_HELLO);
    store_buf_put_u32(&b, 0xdeadbeef);
    store_buf_put_u16(&b, STORE_PROTOCOL_VERSION);
    raw_send_buf(fd, &b);
    store_buf_free(&b);
    n = raw_recv_frame(fd, buf, sizeof buf, 10);
    cr_assert_gt(n, 0);
    cr_assert_eq(buf[0], STORE_ST_REFUSED);
    cr_assert_geq(raw_wait_closed(fd, 10), 0);
    close(fd);
    assert_serving(s, c);
    store_client_close(c);
    store_server_stop(s);
}

static void send_get(int fd, const char *key, uint32_t timeout_ms)
{
    struct store_buf b;
    store_buf_init(&b);
    store_buf_begin(&b, STORE_OP_GET);
    store_buf_put_u32(&b, timeout_ms);
    store_buf_put_str(&b, key);
    raw_send_buf(fd, &b);
    store_buf_free(&b);
}

Test(store_robust, disconnect_mid_get_does_not_disturb_others)
{
    struct store_server *s = test_server("job", NULL, 0);
    struct store_client *c = test_client(s);
    int quitter = greeted_raw(s), stayer = greeted_raw(s);
    send_get(quitter, "k", 30000);
    send_get(stayer, "k", 30000);
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
    uint8_t buf[64];
    long n = raw_recv_frame(stayer, buf, sizeof buf, 10);
    cr_assert_eq(n, 1 + 4 + 3);
    cr_assert_eq(buf[0], STORE_ST_OK);
    cr_assert_eq(memcmp(buf + 5, "val", 3), 0);
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
    /* GET (waits) and PING in one write: the PING must be answered after the GET */
    struct store_buf b;
    store_buf_init(&b);
    store_buf_begin(&b, STORE_OP_GET);
    store_buf_put_u32(&b, 30000);
    store_buf_put_str(&b, "p");
    cr_assert_eq(store_buf_end(&b), 0);
    struct store_buf b2;
    store_buf_init(&b2);
    store_buf_begin(&b2, STORE_OP_PING);
    cr_assert_eq(store_buf_end(&b2), 0);
    store_buf_put_raw(&b, b2.data, b2.len);
    raw_send(fd, b.data, b.len);
    store_buf_free(&b);
    store_buf_free(&b2);
    uint8_t buf[64];
    cr_assert_eq(raw_recv_frame(fd, buf, sizeof buf, 0.3), -1, "a reply arrived before the key was set");
    cr_assert_eq(store_client_set(c, "p", "1", 1), 0);
    cr_assert_eq(raw_recv_frame(fd, buf, sizeof buf, 10), 1 + 4 + 1);
    cr_assert_eq(buf[0], STORE_ST_OK);
    cr_assert_eq(raw_recv_frame(fd, buf, sizeof buf, 10), 1);
    cr_assert_eq(buf[0], STORE_ST_OK);
    close(fd);
    store_client_close(c);
    store_server_stop(s);
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
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &tight), 0);
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
