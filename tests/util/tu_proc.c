#include "tests/util/tu_proc.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double tu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void tu_nap(double seconds)
{
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
}

pid_t tu_spawn(const char *const *argv, const char *out, const char *err, const char *const *env_set)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    for (int i = 0; env_set && env_set[i]; i++) {
        const char *eq = strchr(env_set[i], '=');
        char name[256];
        if (!eq)
            continue;
        snprintf(name, sizeof name, "%.*s", (int)(eq - env_set[i]), env_set[i]);
        if (eq[1])
            setenv(name, eq + 1, 1);
        else
            unsetenv(name);
    }
    int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fe = strcmp(out, err) == 0 ? dup(fo) : open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fo < 0 || fe < 0)
        _exit(126);
    dup2(fo, 1);
    dup2(fe, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
}

int tu_run(const char *const *argv, const char *out, const char *err, const char *const *env_set)
{
    pid_t pid = tu_spawn(argv, out, err, env_set);
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int tu_sh(const char *cmd)
{
    fflush(NULL);
    pid_t p = fork();
    if (p < 0)
        return -1;
    if (p == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int st;
    if (waitpid(p, &st, 0) != p)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int tu_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && getsockname(fd, (struct sockaddr *)&sa, &len) == 0;
    close(fd);
    return ok ? ntohs(sa.sin_port) : -1;
}
