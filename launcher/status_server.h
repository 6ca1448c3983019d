/* fsdp-launch's live status page on node 0 (--status_port): an HTTP server (libevent's evhttp, own thread)
 * serving "/" (an HTML page that refreshes itself), "/api/status" (the same as JSON) and "/metrics"
 * (Prometheus text). Its data: every rank's record in the store ("status/rank<R>", written by fsdp-worker:
 * worker/train/status_report.h), the generation's failure record, and what this launcher saw of its own
 * workers (exits, the root cause). It binds 127.0.0.1 unless told otherwise; a client from any other
 * address must give the page's own read-only token (Authorization: Bearer TOKEN or ?token=TOKEN), derived
 * one-way from the store secret (store_auth_status_token): the secret itself is never accepted, as HTTP here
 * is cleartext. docs/launcher.md. */
#ifndef FSDP_LAUNCHER_STATUS_SERVER_H
#define FSDP_LAUNCHER_STATUS_SERVER_H

#include <stdbool.h>

struct status_server;

struct status_server_options {
    const char *bind_addr;  /* NULL = 127.0.0.1 */
    int port;               /* 0 = a free port (status_server_port) */
    const char *store_host; /* the store this launcher hosts */
    int store_port;
    const char *run_id;
    const char *secret;     /* the store's secret: to read the store, and the page token's source; NULL = none
                             * (loopback clients only) */
    int nnodes, world_size;
    double stale_s;         /* a rank whose record has not changed this long is shown stale; 0 = 30 s */
    double poll_s;          /* store reads this often; 0 = 0.5 s */
};

/* Binds and starts serving. FSDP_EEXIST naming the address when the port is taken; FSDP_EINVAL when a
 * non-loopback address is asked for without a token. */
int status_server_start(const struct status_server_options *opts, struct status_server **out);
int status_server_port(const struct status_server *s);
/* The page's read-only token for clients of other hosts (64 hex digits), "" without a secret. */
const char *status_server_token(const struct status_server *s);
/* Whether it listens on an address other hosts may reach (so they need the token). */
bool status_server_public(const struct status_server *s);
/* What the launcher knows (thread-safe; NULL s accepted): a new attempt (generation g, restarts so far),
 * the end of a local rank (`state` as workers_describe_status says it, ok = exit code 0), the root cause. */
void status_server_note_attempt(struct status_server *s, int generation, int restarts);
void status_server_note_exit(struct status_server *s, int rank, const char *state, bool ok);
void status_server_note_failure(struct status_server *s, const char *record);
void status_server_stop(struct status_server *s);

#endif
