#include "tests/util/tu_store.h"

#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/error.h"
#include "rendezvous/store.h"
#include "tests/util/tu_netns.h"

int tu_store_spawn(const char *bind_addr, const char *run_id, const char *netns, pid_t *pid)
{
    int pfd[2];
    *pid = -1;
    if (pipe(pfd) != 0)
        return -1;
    fflush(NULL);
    pid_t p = fork();
    if (p < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (p == 0) {
        /* a failed assertion ends the test without reaching its reap: the store must not outlive it */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(pfd[0]);
        struct store_server_options so = {.bind_addr = bind_addr, .port = 0, .run_id = run_id};
        struct store_server *srv = NULL;
        int port = -1;
        if (netns && tu_netns_enter(netns) != 0)
            fprintf(stderr, "store: cannot enter netns %s\n", netns);
        else if (store_server_start(&so, &srv) == 0)
            port = store_server_port(srv);
        else
            fprintf(stderr, "store: %s\n", error_message());
        if (write(pfd[1], &port, sizeof port) != (ssize_t)sizeof port)
            _exit(1);
        close(pfd[1]);
        for (;;)
            pause();
    }
    close(pfd[1]);
    int port = -1;
    ssize_t got = read(pfd[0], &port, sizeof port);
    close(pfd[0]);
    if (got != (ssize_t)sizeof port || port <= 0) {
        tu_store_reap(p);
        return -1;
    }
    *pid = p;
    return port;
}

void tu_store_reap(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}
