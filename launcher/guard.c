#include "launcher/guard.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"

/* One record per change: 'w' (watch) or 'f' (forget) and the group id; 5 bytes is below PIPE_BUF, so a
 * record is never split. */
struct record {
    char op;
    int32_t pgid;
} __attribute__((packed));

static int g_fd = -1; /* the launcher's write end; -1 without a guard */

static void send_record(char op, pid_t pgid)
{
    if (g_fd < 0)
        return;
    struct record r = {op, (int32_t)pgid};
    ssize_t w;
    do
        w = write(g_fd, &r, sizeof r);
    while (w < 0 && errno == EINTR);
    if (w != (ssize_t)sizeof r) {
        /* The guard is gone (killed by hand): say so once and carry on without it. */
        log_warn("the guard process that kills the workers' process groups if fsdp-launch dies is gone: %s",
                 w < 0 ? strerror(errno) : "short write");
        close(g_fd);
        g_fd = -1;
    }
}

void guard_watch(pid_t pgid) { send_record('w', pgid); }
void guard_forget(pid_t pgid) { send_record('f', pgid); }

/* The guard's whole life: collect groups until end of file, then kill those still listed. */
static void guard_main(int fd)
{
    pid_t *groups = NULL;
    size_t n = 0, cap = 0;
    struct record r;
    for (;;) {
        ssize_t got = read(fd, &r, sizeof r);
        if (got < 0 && errno == EINTR)
            continue;
        if (got != (ssize_t)sizeof r)
            break; /* end of file: every copy of the write end is closed, the launcher has exited */
        if (r.op == 'w') {
            if (n == cap) {
                size_t nc = cap ? 2 * cap : 64;
                pid_t *ng = realloc(groups, nc * sizeof *ng);
                if (!ng)
                    continue;
                groups = ng;
                cap = nc;
            }
            groups[n++] = r.pgid;
        } else {
            for (size_t i = 0; i < n; i++)
                if (groups[i] == r.pgid) {
                    groups[i] = groups[--n];
                    break;
                }
        }
    }
    int killed = 0;
    for (size_t i = 0; i < n; i++)
        killed += groups[i] > 1 && kill(-groups[i], SIGKILL) == 0;
    if (killed) {
        char msg[160];
        int len = snprintf(msg, sizeof msg, "fsdp-launch (guard): the launcher died; killed what was left of %d "
                           "worker process group(s)\n", killed);
        ssize_t ignored = write(2, msg, (size_t)len);
        (void)ignored;
    }
    _exit(0);
}

int guard_start(void)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return error_set(FSDP_EIO, "guard: pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        return error_set(FSDP_EIO, "guard: fork: %s", strerror(e));
    }
    if (pid == 0) {
        /* Its own session: a signal to the launcher's process group (Ctrl-C, kill -9 -PGID) or the
         * terminal's hangup does not end the guard before the launcher. */
        setsid();
        prctl(PR_SET_NAME, "fsdp-launch-gd");
        int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGTTOU, SIGTTIN, SIGTSTP};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            signal(sigs[i], SIG_IGN);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        /* Nothing of the launcher's stays open here (a pipe on stdout must close with the launcher). */
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 1);
        }
        if (dup2(p[0], 3) != 3)
            _exit(1);
        close_range(4, ~0u, 0);
        guard_main(3);
    }
    close(p[0]);
    g_fd = p[1];
    return 0;
}
