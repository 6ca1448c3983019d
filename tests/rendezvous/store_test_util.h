/* Helpers shared by the store tests: a server on a free loopback port, clients, and raw sockets for
 * forging requests (c10d's framing: an op byte and its fields, no length prefix). */
#ifndef FSDP_TESTS_STORE_TEST_UTIL_H
#define FSDP_TESTS_STORE_TEST_UTIL_H

#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>

#include "common/error.h"
#include "rendezvous/store.h"
#include "rendezvous/store_auth.h"
#include "rendezvous/store_protocol.h"

static inline struct store_server *test_server_opts(struct store_server_options *o)
{
    o->bind_addr = "127.0.0.1";
    struct store_server *s = NULL;
    int rc = store_server_start(o, &s);
    cr_assert_eq(rc, 0, "server start: %s", error_message());
    cr_assert_gt(store_server_port(s), 0);
    return s;
}

static inline struct store_server *test_server(const char *run_id, const char *secret, double idle_s)
{
    struct store_server_options o = {.run_id = run_id, .secret = secret, .idle_timeout_s = idle_s};
    return test_server_opts(&o);
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

/* A client speaking plain c10d, as PyTorch's does (no handshake: PyTorch clients' key space). */
static inline struct store_client *test_plain_client(int port)
{
    struct store_client_options o = {.host = "127.0.0.1", .port = port, .plain = true, .connect_timeout_s = 30,
                                     .default_timeout_s = 60};
    struct store_client *c = NULL;
    int rc = store_client_connect(&o, &c);
    cr_assert_eq(rc, 0, "plain connect: %s", error_message());
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

/* The same from 127.0.0.N (loopback has the whole /8), so a test can play several source addresses. */
static inline int raw_connect_from(int port, int n)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK + (uint32_t)n - 1)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&me, sizeof me), 0, "bind 127.0.0.%d: %s", n, strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
    return fd;
}

/* A guess that waits for nothing: VALIDATE, HELLO and a wrong AUTH for run id "job" in one send, from
 * 127.0.0.src (a guesser that reads an immediate OK as success needs no verdict to go on). */
static inline int raw_fire_guess(int port, int src)
{
    int fd = raw_connect_from(port, src);
    uint8_t nonce[32] = {5}, mac[32] = {(uint8_t)fd};
    struct store_buf b;
    store_buf_init(&b);
    store_buf_put_u8(&b, STORE_OP_VALIDATE);
    store_buf_put_u32(&b, STORE_VALIDATE_MAGIC);
    store_buf_put_u8(&b, STORE_OP_HELLO);
    store_buf_put_u32(&b, STORE_HELLO_MAGIC);
    store_buf_put_u16(&b, STORE_PROTOCOL_VERSION);
    store_buf_put_str(&b, "job");
    store_buf_put_bytes(&b, nonce, sizeof nonce);
    store_buf_put_u8(&b, STORE_OP_AUTH);
    store_buf_put_bytes(&b, mac, sizeof mac);
    cr_assert(!b.failed);
    cr_assert_eq(send(fd, b.data, b.len, MSG_NOSIGNAL), (ssize_t)b.len, "send: %s", strerror(errno));
    store_buf_free(&b);
    return fd;
}

static inline void raw_send(int fd, const void *p, size_t n)
{
    cr_assert_eq(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n, "send: %s", strerror(errno));
}

static inline void raw_send_buf(int fd, struct store_buf *b)
{
    cr_assert(!b->failed);
    raw_send(fd, b->data, b->len);
}

/* Reads exactly n bytes; returns n, 0 on EOF, -1 at the timeout. */
static inline long raw_recv(int fd, void *buf, size_t n, double timeout_s)
{
    double deadline = test_now() + timeout_s;
    size_t got = 0;
    while (got < n) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)((deadline - test_now()) * 1000);
        if (left <= 0 || poll(&p, 1, left) == 0)
            return -1;
        ssize_t r = recv(fd, (uint8_t *)buf + got, n - got, 0);
        if (r <= 0)
            return 0;
        got += (size_t)r;
    }
    return (long)n;
}

static inline uint64_t raw_recv_u64(int fd)
{
    uint8_t b[8];
    cr_assert_eq(raw_recv(fd, b, 8, 10), 8);
    return store_le64(b);
}

/* An fsdpc error reply: status byte, then the message (into msg, cap bytes). */
static inline uint8_t raw_recv_status(int fd, char *msg, size_t cap)
{
    uint8_t st = 0xff;
    cr_assert_eq(raw_recv(fd, &st, 1, 10), 1, "no status byte");
    if (msg)
        msg[0] = 0;
    if (st != STORE_ST_OK) {
        uint64_t n = raw_recv_u64(fd);
        cr_assert_lt(n, 4096);
        char tmp[4096];
        cr_assert_eq(raw_recv(fd, tmp, (size_t)n, 10), (long)n);
        if (msg)
            snprintf(msg, cap, "%.*s", (int)n, tmp);
    }
    return st;
}

static inline void raw_validate(int fd)
{
    uint8_t v[5] = {STORE_OP_VALIDATE, 0xce, 0xf7, 0x85, 0x3c};
    raw_send(fd, v, sizeof v);
}

/* VALIDATE + HELLO(version, run id); returns the status of HELLO's reply and leaves the server nonce in
 * snonce (32 bytes) when OK. */
static inline uint8_t raw_hello(int fd, uint16_t version, const char *run_id, const uint8_t cnonce[32],
                                uint8_t snonce[32], char *msg, size_t cap)
{
    struct store_buf b;
    store_buf_init(&b);
    store_buf_put_u8(&b, STORE_OP_VALIDATE);
    store_buf_put_u32(&b, STORE_VALIDATE_MAGIC);
    store_buf_put_u8(&b, STORE_OP_HELLO);
    store_buf_put_u32(&b, STORE_HELLO_MAGIC);
    store_buf_put_u16(&b, version);
    store_buf_put_str(&b, run_id);
    store_buf_put_bytes(&b, cnonce, 32);
    raw_send_buf(fd, &b);
    store_buf_free(&b);
    uint8_t st = raw_recv_status(fd, msg, cap);
    if (st == STORE_ST_OK) {
        uint8_t ver[2];
        cr_assert_eq(raw_recv(fd, ver, 2, 10), 2);
        cr_assert_eq(raw_recv_u64(fd), 32);
        cr_assert_eq(raw_recv(fd, snonce, 32, 10), 32);
    }
    return st;
}

/* A raw connection through fsdpc's whole handshake: every reply after it starts with a status byte. */
static inline int raw_authed(int port, const char *run_id, const char *secret)
{
    int fd = raw_connect(port);
    uint8_t cn[32] = {1, 2, 3}, sn[32];
    cr_assert_eq(raw_hello(fd, STORE_PROTOCOL_VERSION, run_id, cn, sn, NULL, 0), STORE_ST_OK);
    uint8_t key[STORE_KEY_BYTES], mac[32];
    store_auth_key(run_id, secret, key);
    store_auth_mac(key, 'c', run_id, strlen(run_id), cn, 32, sn, 32, mac);
    struct store_buf b;
    store_buf_init(&b);
    store_buf_put_u8(&b, STORE_OP_AUTH);
    store_buf_put_bytes(&b, mac, 32);
    raw_send_buf(fd, &b);
    store_buf_free(&b);
    cr_assert_eq(raw_recv_status(fd, NULL, 0), STORE_ST_OK);
    cr_assert_eq(raw_recv_u64(fd), 32);
    uint8_t smac[32];
    cr_assert_eq(raw_recv(fd, smac, 32, 10), 32);
    return fd;
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

/* Starts a request in b: the op byte. */
static inline void req_begin(struct store_buf *b, uint8_t op)
{
    store_buf_reset(b);
    store_buf_put_u8(b, op);
}

#endif
