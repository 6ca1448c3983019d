#include "launcher/console.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"

struct queue {
    int fd;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* the writer waits for bytes or for the stop */
    pthread_cond_t drained; /* console_stop waits for progress */
    char *buf;              /* ring of CONSOLE_QUEUE_BYTES */
    size_t head, len;       /* next byte to write, bytes queued */
    unsigned long long written; /* bytes the writer has written so far (progress for console_stop) */
    bool in_write;          /* the writer is inside write(), since write_started (monotonic seconds) */
    double write_started;
    unsigned long dropped;  /* lines dropped since the last notice */
    bool dead;              /* the console returned an error: discard everything from now on */
    bool stop;
    pthread_t thread;
};

/* A console whose writer has been stuck in one write() this long is stalled: lines that do not fit are
 * dropped instead of waited for. Until then a full queue makes the caller wait for room, so a console that
 * is merely slower than the workers (a file, a busy terminal) loses nothing. */
#define STALL_S 0.25
#define WRITE_CHUNK (64u << 10)

static struct queue g_q[2];

static void deadline_in(struct timespec *ts, double s)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += (time_t)s;
    ts->tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}
static bool g_started;

static void write_direct(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* a closed console must not stop supervision */
        p += w;
        n -= (size_t)w;
    }
}

static void *writer(void *arg)
{
    struct queue *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->len == 0 && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->len == 0 && q->stop)
            break;
        /* At most WRITE_CHUNK per call: a console that reads slowly still shows progress often. */
        size_t n = q->len < CONSOLE_QUEUE_BYTES - q->head ? q->len : CONSOLE_QUEUE_BYTES - q->head;
        n = n < WRITE_CHUNK ? n : WRITE_CHUNK;
        const char *p = q->buf + q->head;
        q->in_write = true;
        q->write_started = clock_now_s();
        pthread_mutex_unlock(&q->mu);
        ssize_t w;
        do
            w = write(q->fd, p, n);
        while (w < 0 && errno == EINTR);
        pthread_mutex_lock(&q->mu);
        q->in_write = false;
        if (w <= 0) {
            q->dead = true;
            q->len = 0;
        } else {
            q->head = (q->head + (size_t)w) % CONSOLE_QUEUE_BYTES;
            q->len -= (size_t)w;
            q->written += (unsigned long long)w;
        }
        pthread_cond_broadcast(&q->drained);
        if (q->dead)
            break;
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* With q->mu held: appends n bytes if they fit. */
static bool put(struct queue *q, const char *p, size_t n)
{
    if (n > CONSOLE_QUEUE_BYTES - q->len)
        return false;
    size_t tail = (q->head + q->len) % CONSOLE_QUEUE_BYTES;
    size_t first = n < CONSOLE_QUEUE_BYTES - tail ? n : CONSOLE_QUEUE_BYTES - tail;
    memcpy(q->buf + tail, p, first);
    memcpy(q->buf, p + first, n - first);
    q->len += n;
    return true;
}

/* With q->mu held: appends n bytes, waiting for room while the writer is not stalled. */
static bool put_or_wait(struct queue *q, const char *p, size_t n)
{
    while (!put(q, p, n)) {
        double stuck = q->in_write ? clock_now_s() - q->write_started : 0;
        if (q->dead || stuck >= STALL_S || n > CONSOLE_QUEUE_BYTES)
            return false;
        pthread_cond_signal(&q->cv);
        struct timespec ts;
        deadline_in(&ts, STALL_S - stuck);
        pthread_cond_timedwait(&q->drained, &q->mu, &ts);
    }
    return true;
}

void console_write(int fd, const char *p, size_t n)
{
    if (!g_started || (fd != 1 && fd != 2)) {
        write_direct(fd, p, n);
        return;
    }
    struct queue *q = &g_q[fd - 1];
    pthread_mutex_lock(&q->mu);
    if (!q->dead) {
        if (q->dropped) {
            char note[200];
            int k = snprintf(note, sizeof note,
                             "fsdp-launch: %lu line(s) of output dropped here: the console did not keep up "
                             "(--log_dir files keep every line)\n", q->dropped);
            if (put_or_wait(q, note, (size_t)k))
                q->dropped = 0;
        }
        if (q->dropped || !put_or_wait(q, p, n))
            q->dropped += !q->dead;
        pthread_cond_signal(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
}

static void log_sink(const char *line, size_t len)
{
    console_write(2, line, len);
}

int console_start(void)
{
    for (int i = 0; i < 2; i++) {
        struct queue *q = &g_q[i];
        memset(q, 0, sizeof *q);
        q->fd = i + 1;
        q->buf = malloc(CONSOLE_QUEUE_BYTES);
        if (!q->buf)
            return error_set(FSDP_ENOMEM, "out of memory for the console queues");
        pthread_mutex_init(&q->mu, NULL);
        pthread_cond_init(&q->cv, NULL);
        pthread_cond_init(&q->drained, NULL);
    }
    for (int i = 0; i < 2; i++)
        if (pthread_create(&g_q[i].thread, NULL, writer, &g_q[i]) != 0) {
            if (i == 1) { /* stop the first */
                pthread_mutex_lock(&g_q[0].mu);
                g_q[0].stop = true;
                pthread_cond_signal(&g_q[0].cv);
                pthread_mutex_unlock(&g_q[0].mu);
                pthread_join(g_q[0].thread, NULL);
            }
            return error_set(FSDP_EIO, "cannot start the console writer threads");
        }
    g_started = true;
    log_set_sink(log_sink);
    return 0;
}

void console_stop(double timeout_s)
{
    if (!g_started)
        return;
    log_set_sink(NULL);
    for (int i = 0; i < 2; i++) {
        struct queue *q = &g_q[i];
        pthread_mutex_lock(&q->mu);
        bool stalled = false;
        while (q->len > 0 && !q->dead && !stalled) {
            unsigned long long before = q->written;
            struct timespec ts;
            deadline_in(&ts, timeout_s);
            while (q->len > 0 && !q->dead && q->written == before)
                if (pthread_cond_timedwait(&q->drained, &q->mu, &ts) == ETIMEDOUT)
                    break;
            stalled = q->written == before && q->len > 0;
        }
        q->stop = true;
        bool wait = !stalled;
        pthread_cond_signal(&q->cv);
        pthread_mutex_unlock(&q->mu);
        /* A writer stuck in write() on a console that never reads is left behind: exit ends it. */
        if (wait)
            pthread_join(q->thread, NULL);
        else
            pthread_detach(q->thread);
    }
    g_started = false;
}
