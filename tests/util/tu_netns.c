#include "tests/util/tu_netns.h"

#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include "tests/util/tu_proc.h"

int tu_netns_pair_make(struct tu_netns_pair *p, char tag, int net)
{
    int id = getpid() % 100000, oct = 1 + id % 250;
    for (int i = 0; i < 2; i++) {
        snprintf(p->ns[i], sizeof p->ns[i], "f%c%d%c", tag, id, 'a' + i);
        snprintf(p->addr[i], sizeof p->addr[i], "10.%d.%d.%d", net, oct, 1 + i);
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "ip netns add %s && ip netns add %s && ip link add %c%da type veth peer name %c%db && "
             "ip link set %c%da netns %s && ip link set %c%db netns %s && "
             "ip -n %s addr add %s/24 dev %c%da && ip -n %s addr add %s/24 dev %c%db && "
             "ip -n %s link set %c%da up && ip -n %s link set %c%db up && "
             "ip -n %s link set lo up && ip -n %s link set lo up",
             p->ns[0], p->ns[1], tag, id, tag, id, tag, id, p->ns[0], tag, id, p->ns[1], p->ns[0], p->addr[0], tag,
             id, p->ns[1], p->addr[1], tag, id, p->ns[0], tag, id, p->ns[1], tag, id, p->ns[0], p->ns[1]);
    if (tu_sh(cmd) == 0)
        return 0;
    tu_netns_pair_remove(p);
    return -1;
}

void tu_netns_pair_remove(const struct tu_netns_pair *p)
{
    /* deleting a namespace deletes the veth end in it, and with it the peer */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ip netns del %s; ip netns del %s", p->ns[0], p->ns[1]);
    tu_sh(cmd);
}

int tu_netns_enter(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "/run/netns/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = setns(fd, CLONE_NEWNET);
    close(fd);
    return rc;
}
