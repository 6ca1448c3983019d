/* Helpers shared by the store tests: a server on a free loopback port, clients, and raw sockets for
 * forging frames. */
#ifndef FSDP_TESTS_STORE_TEST_UTIL_H
#define FSDP_TESTS_STORE_TEST_UTIL_H

#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>

#include "common/error.h"
#include "rendezvous/store.h"
#include "rendezvous/store_protocol.h"

static inline struct store_server *test_server(const char *run_id, const char *secret, double idle_s)
{
    struct store_server_options o = {.bind_addr = "127.0.0.1", .port = 0, .run_id = run_id, .secret = secret,
                                     .idle_timeout_s = idle_s};
    struct store_server *s = NULL;
    int rc = store_server_start(&o, &s);
    cr_assert_eq(rc, 0, "server start: %s", error_message());
    cr_assert_gt(store_server_port(s), 0);
    return s;
}

static inline int test_connect_opts(int port, const char *run_id, const char *secret, double connect_s,
                                    struct store_client **out)
{
    struct store_client_options o = {.host = "127.0.0.1", .port = port, .run_id = run_id, .secret = secret,
                                     .connect_timeout_s = connect_s, .default_timeout_s = 60};
    return store_client_connect(&o, out);
}

static inline struct store_client *test_client(struct store_server *s)
{
    struct store_client *c = NULL;
    int rc = test_connect_opts(store_server_port(s), "job", NULL, 30, &c);
    cr_assert_eq(rc, 0, "connect: %s", error_message());
    return c;
}

static inline double test_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static inline void test_sleep(double s)
{
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* A plain blocking loopback socket to the server. */
static inline int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
    return fd;
}

static inline void raw_send(int fd, const void *p, size_t n)
{
    cr_assert_eq(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n, "send: %s", strerror(errno));
}

static inline void raw_send_buf(int fd, struct store_buf *b)
{
    cr_assert_eq(store_buf_end(b), 0);
    raw_send(fd, b->data, b->len);
}

static inline void raw_hello(int fd, uint16_t version, const char *run_id)
{
    struct store_buf b;
    store_buf_init(&b);
    store_buf_begin(&b, STORE_OP_HELLO);
    store_buf_put_u32(&b, STORE_MAGIC);
    store_buf_put_u16(&b, version);
    store_buf_put_str(&b, run_id);
    store_buf_put_str(&b, "");
    raw_send_buf(fd, &b);
    store_buf_free(&b);
}

/* Reads one reply frame with a deadline; returns its payload length, 0 on EOF, -1 on timeout. */
static inline long raw_recv_frame(int fd, uint8_t *buf, size_t cap, double timeout_s)
{
    double deadline = test_now() + timeout_s;
    size_t got = 0, want = STORE_FRAME_HEADER_BYTES;
    uint8_t hdr[4];
    while (got < want) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)((deadline - test_now()) * 1000);
        if (left <= 0 || poll(&p, 1, left) == 0)
            return -1;
        uint8_t *dst = want == 4 ? hdr + got : buf + got;
        ssize_t r = recv(fd, dst, want - got, 0);
        if (r <= 0)
            return 0;
        got += (size_t)r;
        if (want == 4 && got == 4) {
            want = store_le32(hdr);
            cr_assert_leq(want, cap);
            got = 0;
        }
    }
    return (long)want;
}

/* Waits until the server closes fd (EOF or reset); returns seconds waited or -1 after timeout_s. */
static inline double raw_wait_closed(int fd, double timeout_s)
{
    double t0 = test_now(), deadline = t0 + timeout_s;
    uint8_t junk[4096];
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)((deadline - test_now()) * 1000);
        if (left <= 0 || poll(&p, 1, left) == 0)
            return -1;
        ssize_t r = recv(fd, junk, sizeof junk, 0);
        if (r <= 0)
            return test_now() - t0;
    }
}

#endif
