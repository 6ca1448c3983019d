/* TCP mesh and the poll()-driven exchange used for everything that crosses hosts (and for send/recv). */
#include "comm/comm_tcp.h"
#include "common/clock.h"
#include "comm/comm_internal.h"
#include "common/error.h"
#include "rendezvous/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MESH_MAGIC 0x46534443u /* "FSDC" */

struct tcp_mesh {
    int rank, size;
    int *fd; /* fd[peer], -1 for self */
};

static int poll_ms(double deadline)
{
    double left = deadline - clock_now_s();
    if (left <= 0)
        return 0;
    return left > 0.5 ? 500 : (int)(left * 1000) + 1;
}

static void tune(int fd)
{
    int one = 1, buf = 4 << 20;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Blocking-with-deadline full read/write on a non-blocking fd, for the handshake only. */
static int io_full(int fd, void *buf, size_t len, bool wr, double deadline)
{
    unsigned char *p = buf;
    while (len) {
        ssize_t k = wr ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (k > 0) {
            p += k;
            len -= (size_t)k;
            continue;
        }
        if (k == 0)
            return FSDP_ECLOSED;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return FSDP_EIO;
        if (clock_now_s() >= deadline)
            return FSDP_ETIMEDOUT;
        struct pollfd pf = {.fd = fd, .events = wr ? POLLOUT : POLLIN};
        poll(&pf, 1, poll_ms(deadline));
    }
    return 0;
}

static int connect_to(const char *host, const char *port, double deadline, int *out)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0)
        return error_set(FSDP_EIO, "cannot resolve %s: %s", host, gai_strerror(rc));
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return error_set(FSDP_EIO, "socket: %s", strerror(errno));
    }
    tune(fd);
    rc = connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (rc != 0 && errno != EINPROGRESS) {
        rc = error_set(FSDP_EIO, "connect to %s:%s failed: %s", host, port, strerror(errno));
        goto fail;
    }
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    while (clock_now_s() < deadline && poll(&pf, 1, poll_ms(deadline)) == 0) {
    }
    int err = 0;
    socklen_t el = sizeof(err);
    if (!(pf.revents & (POLLOUT | POLLERR | POLLHUP)) || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 ||
        err != 0) {
        rc = error_set(FSDP_EIO, "connect to %s:%s failed: %s", host, port, err ? strerror(err) : "timed out");
        goto fail;
    }
    *out = fd;
    return 0;
fail:
    close(fd);
    return rc;
}

int tcp_mesh_create(struct store_client *store, const char *key_prefix, int rank, int size, double deadline,
                    struct tcp_mesh **out)
{
    *out = NULL;
    struct tcp_mesh *m = calloc(1, sizeof(*m));
    int *fds = calloc((size_t)size, sizeof(int));
    int lfd = -1, rc = 0;
    if (!m || !fds) {
        free(m);
        free(fds);
        return error_set(FSDP_ENOMEM, "tcp: out of memory");
    }
    m->rank = rank;
    m->size = size;
    m->fd = fds;
    for (int i = 0; i < size; i++)
        fds[i] = -1;

    /* Listen on the address this rank's store connection leaves from: peers can reach it. */
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(store_client_fd(store), (struct sockaddr *)&ss, &sl) != 0) {
        rc = error_set(FSDP_EIO, "tcp: getsockname on the store connection: %s", strerror(errno));
        goto fail;
    }
    if (ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&ss)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
    lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&ss, sl) != 0 || listen(lfd, 256) != 0 ||
        getsockname(lfd, (struct sockaddr *)&ss, &sl) != 0) {
        rc = error_set(FSDP_EIO, "tcp: cannot listen: %s", strerror(errno));
        goto fail;
    }
    fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK);
    char host[128], port[16], key[256], val[160];
    if (getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        rc = error_set(FSDP_EIO, "tcp: getnameinfo failed");
        goto fail;
    }
    snprintf(key, sizeof(key), "%s/tcp/%d", key_prefix, rank);
    snprintf(val, sizeof(val), "%s %s", host, port);
    FSDP_TRY_GOTO(store_client_set(store, key, val, strlen(val)), rc, fail);

    for (int peer = 0; peer < rank; peer++) {
        snprintf(key, sizeof(key), "%s/tcp/%d", key_prefix, peer);
        void *v = NULL;
        size_t vl = 0;
        double left = deadline - clock_now_s();
        FSDP_TRY_GOTO(store_client_get(store, key, &v, &vl, left > 0.01 ? left : 0.01), rc, fail);
        char ph[128] = "", pp[16] = "";
        sscanf((char *)v, "%127s %15s", ph, pp);
        free(v);
        if ((rc = connect_to(ph, pp, deadline, &fds[peer])) != 0) {
            rc = error_set(rc, "tcp: rank %d: %s", peer, error_message());
            goto fail;
        }
        uint32_t hello[2] = {MESH_MAGIC, (uint32_t)rank};
        if ((rc = io_full(fds[peer], hello, sizeof(hello), true, deadline)) != 0) {
            rc = error_set(rc, "tcp: handshake with rank %d failed (%s)", peer, error_name(rc));
            goto fail;
        }
    }
    for (int got = 0; got < size - 1 - rank;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                rc = error_set(FSDP_EIO, "tcp: accept: %s", strerror(errno));
                goto fail;
            }
            if (clock_now_s() >= deadline) {
                char miss[256] = "";
                size_t ml = 0;
                for (int p = rank + 1; p < size && ml < sizeof(miss) - 16; p++)
                    if (fds[p] < 0)
                        ml += (size_t)snprintf(miss + ml, sizeof(miss) - ml, "%s%d", ml ? ", " : "", p);
                rc = error_set(FSDP_ETIMEDOUT, "tcp: rank%s %s did not connect in time", strchr(miss, ',') ? "s" : "",
                               miss);
                goto fail;
            }
            struct pollfd pf = {.fd = lfd, .events = POLLIN};
            poll(&pf, 1, poll_ms(deadline));
            continue;
        }
        tune(fd);
        uint32_t hello[2];
        rc = io_full(fd, hello, sizeof(hello), false, deadline);
        if (rc != 0 || hello[0] != MESH_MAGIC || (int)hello[1] <= rank || (int)hello[1] >= size ||
            fds[hello[1]] >= 0) {
            close(fd); /* a stray connection; keep waiting for the real ones */
            rc = 0;
            continue;
        }
        fds[hello[1]] = fd;
        got++;
    }
    close(lfd);
    *out = m;
    return 0;
fail:
    if (lfd >= 0)
        close(lfd);
    tcp_mesh_destroy(m);
    return rc;
}

void tcp_mesh_destroy(struct tcp_mesh *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->size; i++)
        if (m->fd[i] >= 0)
            close(m->fd[i]);
    free(m->fd);
    free(m);
}

int tcp_exchange(struct tcp_mesh *m, struct tcp_xfer *x, int nx, double deadline)
{
    enum { MAXX = 256 };
    if (nx > MAXX)
        return error_set(FSDP_EINVAL, "tcp: %d transfers in one step (at most %d)", nx, MAXX);
    size_t sent[MAXX] = {0}, recvd[MAXX] = {0};
    struct pollfd pf[MAXX];
    for (int i = 0; i < nx; i++)
        if (x[i].peer < 0 || x[i].peer >= m->size || m->fd[x[i].peer] < 0)
            return error_set(FSDP_EINVAL, "tcp: no connection to rank %d", x[i].peer);
    for (;;) {
        int np = 0, idx[MAXX];
        for (int i = 0; i < nx; i++) {
            short ev = 0;
            if (sent[i] < x[i].slen)
                ev |= POLLOUT;
            if (recvd[i] < x[i].rlen)
                ev |= POLLIN;
            if (!ev)
                continue;
            pf[np] = (struct pollfd){.fd = m->fd[x[i].peer], .events = ev};
            idx[np++] = i;
        }
        if (np == 0)
            return 0;
        if (clock_now_s() >= deadline) {
            char miss[256] = "";
            size_t ml = 0;
            for (int k = 0; k < np && ml < sizeof(miss) - 16; k++)
                ml += (size_t)snprintf(miss + ml, sizeof(miss) - ml, "%s%d", ml ? ", " : "", x[idx[k]].peer);
            return error_set(FSDP_ETIMEDOUT,
                             "rank%s %s did not complete TCP transfers in time; check whether they are "
                             "stuck or slow, or raise FSDP_COMM_TIMEOUT_S", np > 1 ? "s" : "", miss);
        }
        int r = poll(pf, (nfds_t)np, poll_ms(deadline));
        if (r < 0 && errno != EINTR)
            return error_set(FSDP_EIO, "tcp: poll: %s", strerror(errno));
        for (int k = 0; k < np && r > 0; k++) {
            int i = idx[k];
            short re = pf[k].revents;
            if (!re)
                continue;
            if ((re & POLLIN) && recvd[i] < x[i].rlen) {
                ssize_t got = recv(pf[k].fd, (char *)x[i].rbuf + recvd[i], x[i].rlen - recvd[i], 0);
                if (got == 0)
                    return error_set(FSDP_ECLOSED, "rank %d closed its connection (it died or gave up); look "
                                     "at that rank's log", x[i].peer);
                if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                    return error_set(FSDP_ECLOSED, "connection to rank %d failed: %s (it probably died)",
                                     x[i].peer, strerror(errno));
                if (got > 0)
                    recvd[i] += (size_t)got;
            }
            if ((re & (POLLOUT | POLLERR | POLLHUP)) && sent[i] < x[i].slen) {
                ssize_t put = send(pf[k].fd, (const char *)x[i].sbuf + sent[i], x[i].slen - sent[i],
                                   MSG_NOSIGNAL | MSG_DONTWAIT);
                if (put < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                    return error_set(FSDP_ECLOSED, "connection to rank %d failed: %s (it probably died)",
                                     x[i].peer, strerror(errno));
                if (put > 0)
                    sent[i] += (size_t)put;
            } else if ((re & (POLLERR | POLLHUP)) && !(re & POLLIN)) {
                return error_set(FSDP_ECLOSED, "connection to rank %d broke (it probably died)", x[i].peer);
            }
        }
    }
}
