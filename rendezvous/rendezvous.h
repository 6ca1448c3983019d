/* Rendezvous of the launchers over the store, and the worker side of the same contract.
 *
 * Launcher side: node 0's launcher hosts the store; every launcher joins generation g with its node
 * rank, and once all --nnodes have joined, node n's workers get global ranks n*nproc_per_node + local.
 * Each restart is a new generation, and every key of a generation lives under "rdzv/g<g>/", so a
 * launcher or worker never reads a stale key of an earlier attempt. Failures (the first one published
 * wins: it is the root cause), heartbeats and the exit barrier are keys of the generation too.
 *
 * Worker side (environment set by fsdp-launch): MASTER_ADDR, MASTER_PORT = the store;
 * TORCHELASTIC_RUN_ID = the run id; FSDP_RDZV_TOKEN = the job's secret (absent = none): the key of the
 * handshake derives from both;
 * FSDP_STORE_PREFIX = "worker/g<g>/", the key prefix of this attempt; RANK, WORLD_SIZE, LOCAL_RANK. */
#ifndef FSDP_RENDEZVOUS_RENDEZVOUS_H
#define FSDP_RENDEZVOUS_RENDEZVOUS_H

#include <stdbool.h>
#include <stddef.h>

#include "rendezvous/store.h"

/* ---- launcher side ---- */
struct rdzv;

struct rdzv_options {
    const char *master_addr;
    int master_port;        /* node 0: 0 = pick a free port (rdzv_port tells which) */
    const char *bind_addr;  /* node 0 only; NULL = all interfaces */
    bool torch_off;         /* node 0 only: refuse PyTorch TCPStore clients */
    const char *run_id;
    const char *secret;     /* NULL = none */
    int nnodes;
    int node_rank;
    int nproc_per_node;
    const char *host;       /* this node's name, shown in other nodes' messages */
    double timeout_s;       /* reaching the store and waiting for every node to join */
    double heartbeat_timeout_s; /* a node silent this long is lost; 0 = 10 s */
    const char *const *node_hosts; /* optional names of nodes 0..nnodes-1 (SLURM), for messages */
    /* Called about every 100 ms while waiting for the store; returning true abandons rdzv_open with
     * FSDP_EABORTED (a launcher answering SIGINT/SIGTERM while node 0 is not up yet). NULL: never. */
    bool (*should_stop)(void *arg);
    void *stop_arg;
};

struct rdzv_assignment {
    int generation;
    int rank_base;  /* global rank of local rank 0 */
    int world_size;
    char prefix[64]; /* FSDP_STORE_PREFIX for this generation's workers */
};

/* Node 0 starts the store (FSDP_EEXIST with address and port when the port is taken), then every node
 * connects (FSDP_ETIMEDOUT naming address, port and how long it tried; FSDP_EREFUSED on a wrong token;
 * FSDP_EABORTED when should_stop said so) and checks that nnodes and nproc_per_node agree with the job's.
 * While the store cannot be reached yet it says so once at info level, then every few seconds at debug. */
int rdzv_open(const struct rdzv_options *opts, struct rdzv **out);
int rdzv_port(const struct rdzv *r);
bool rdzv_is_host(const struct rdzv *r);

/* Joins the first generation >= min_generation whose slot for this node is free, and waits until all
 * nodes joined it and node 0 opened it (after emptying PyTorch clients' key space, so no worker of the
 * new generation reads a key of an earlier one). A slot held by another live launcher is FSDP_EREFUSED (duplicate node rank); the
 * timeout (FSDP_ETIMEDOUT) lists the node ranks (and hosts) still missing. should_stop, when given, is
 * called about every 100 ms; returning true abandons the wait with FSDP_EABORTED. */
int rdzv_join(struct rdzv *r, int min_generation, bool (*should_stop)(void *), void *arg,
              struct rdzv_assignment *out);

/* Publishes a failure of generation g (a JSON text); the first published record wins and is returned
 * in *root (malloc'd), so every node reports the same root cause. */
int rdzv_publish_failure(struct rdzv *r, int generation, const char *record, char **root);

struct rdzv_status {
    char *failure;  /* malloc'd root-cause record once any node published one, else NULL */
    int lost_node;  /* a node whose heartbeat stopped, or -1 */
    int done_nodes; /* nodes whose workers all succeeded */
};
/* One monitor tick: beats this node's heartbeat and reads the generation's state. FSDP_ECLOSED or
 * FSDP_EIO mean the store (node 0) is gone. */
int rdzv_poll(struct rdzv *r, int generation, struct rdzv_status *st);
/* This node's workers all exited 0 in generation g. */
int rdzv_mark_done(struct rdzv *r, int generation);
/* Exit handshake: non-hosts say goodbye; the host waits (up to timeout_s) for every goodbye, so it
 * never stops the store under a node that is still reading it. */
int rdzv_finish(struct rdzv *r, int generation, double timeout_s);
void rdzv_close(struct rdzv *r);

/* store_client_connect for up to timeout_s, saying once at info level, then every few seconds at debug, that
 * `who` ("rank 3") waits for the store of `whose` ("rank 0's fsdp store") while it cannot be reached (what
 * rdzv_open and rdzv_worker_connect do); co's connect_timeout_s is ignored. For a worker that reaches a store
 * of its own choosing. */
int rdzv_store_connect(const struct store_client_options *co, double timeout_s, const char *who, const char *whose,
                       struct store_client **out);

/* Is addr a host name (not an address as written) that resolves only to loopback addresses here? Such a
 * store is out of other nodes' reach (Debian maps a host's own name to 127.0.1.1). shown (cap bytes, may be
 * NULL) gets the address it resolved to. */
bool rdzv_loopback_name(const char *addr, char *shown, size_t cap);

/* ---- worker side ---- */
struct rdzv_worker {
    struct store_client *client;
    char prefix[64];
    int rank, world_size, local_rank;
};

/* Reads the environment above and connects (timeout_s <= 0: 60 s), saying once at info level, then every
 * few seconds at debug, what it waits for while the store cannot be reached. */
int rdzv_worker_connect(struct rdzv_worker *w, double timeout_s);
/* prefix + name into buf; FSDP_ERANGE when it does not fit. */
int rdzv_worker_key(const struct rdzv_worker *w, const char *name, char *buf, size_t cap);
/* A barrier of all WORLD_SIZE ranks of this attempt. */
int rdzv_worker_barrier(struct rdzv_worker *w, const char *name, double timeout_s);
void rdzv_worker_close(struct rdzv_worker *w);

#endif
