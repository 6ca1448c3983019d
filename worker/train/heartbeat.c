#include "worker/train/heartbeat.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/settings.h"

static int g_fd = -1;

/* A program that started this rank (a wrapper script) may outlive it holding the pipe open: say the rank
 * ended, so its silence from now on is not taken for a stop. */
static void say_end(void)
{
    ssize_t n = write(g_fd, "e", 1);
    (void)n;
}

static void *beat(void *arg)
{
    int fd = (int)(long)arg;
    /* A launcher gone makes the write fail with EPIPE; SIGPIPE, blocked here, would otherwise end the rank
     * before its parent-death signal says why. */
    sigset_t pipe_only;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, NULL);
    const struct timespec gap = {.tv_sec = 0, .tv_nsec = (long)(HEARTBEAT_INTERVAL_S * 1e9)};
    for (;;) {
        ssize_t n = write(fd, "b", 1);
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            break; /* the launcher closed its end: nobody listens */
        nanosleep(&gap, NULL);
    }
    close(fd);
    return NULL;
}

void heartbeat_start(void)
{
    long fd = -1;
    if (!settings_get_raw(SETTING_HEARTBEAT_FD) || settings_get_int(SETTING_HEARTBEAT_FD, &fd) != 0 || fd < 0)
        return;
    int flags = fcntl((int)fd, F_GETFL);
    if (flags < 0 || (flags & O_ACCMODE) == O_RDONLY) {
        log_warn("FSDP_HEARTBEAT_FD=%ld is not a descriptor this process can write: no heartbeat to fsdp-launch",
                 fd);
        return;
    }
    /* never blocks on a launcher that stopped reading, and stays out of the programs this rank starts */
    fcntl((int)fd, F_SETFL, flags | O_NONBLOCK);
    fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    pthread_attr_t at;
    pthread_t t;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* signals stay the main thread's business */
    int rc = pthread_create(&t, &at, beat, (void *)fd);
    if (rc == 0) {
        g_fd = (int)fd;
        atexit(say_end);
    }
    if (rc != 0)
        log_warn("cannot start the heartbeat thread (%s): fsdp-launch will not see this rank stop", strerror(rc));
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&at);
}
