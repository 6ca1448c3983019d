/* TCP between the ranks of a communicator: a full mesh of connections bootstrapped through the store,
 * and one primitive, tcp_exchange, that moves a set of sends and receives on several connections at
 * once with poll(), so that every transfer of a step is in flight together (no ordering deadlocks,
 * both directions of a link busy). */
#ifndef FSDP_COMM_TCP_H
#define FSDP_COMM_TCP_H

#include <stddef.h>

struct store_client;
struct tcp_mesh;

struct tcp_xfer {
    int peer;          /* rank in the communicator */
    const void *sbuf;  /* bytes to send to peer (slen 0 = none) */
    size_t slen;
    void *rbuf;        /* bytes to receive from peer (rlen 0 = none) */
    size_t rlen;
};

/* Collective over the communicator: each rank publishes its listening address under
 * "<key_prefix>/tcp/<rank>" and connects to every lower rank. addr: the address peers reach this rank at
 * (the one its store connection uses). */
int tcp_mesh_create(struct store_client *store, const char *key_prefix, int rank, int size, double deadline,
                    struct tcp_mesh **out);
void tcp_mesh_destroy(struct tcp_mesh *m);
/* Runs all transfers to completion or fails naming the peer (closed connection) or the peers whose
 * transfers were unfinished at the deadline. */
int tcp_exchange(struct tcp_mesh *m, struct tcp_xfer *x, int nx, double deadline);

#endif
