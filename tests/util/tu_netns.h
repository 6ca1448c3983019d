/* Two "hosts" on one machine: network namespaces joined by a veth pair (ip netns, iproute2; needs root). */
#ifndef FSDP_TESTS_UTIL_TU_NETNS_H
#define FSDP_TESTS_UTIL_TU_NETNS_H

struct tu_netns_pair {
    char ns[2][32];   /* the namespaces' names (ip netns exec NAME ...) */
    char addr[2][32]; /* each side's IPv4 address on the veth */
};

/* Makes the pair with the loopback and the veth up in both. Names come from tag and this process's id:
 * tests run in parallel and a crashed run's leftovers must not collide; a test binary gives its own tag
 * and net (addresses 10.<net>.<id % 250 + 1>.1 and .2/24). Returns 0, or -1 where it cannot (no root or
 * no iproute2), having removed whatever it made. */
int tu_netns_pair_make(struct tu_netns_pair *p, char tag, int net);
void tu_netns_pair_remove(const struct tu_netns_pair *p);

/* Moves the calling (single-threaded, freshly forked) process into the named namespace; 0 or -1. */
int tu_netns_enter(const char *name);

#endif
