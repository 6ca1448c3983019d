/* The rendezvous key-value store: a server (libevent, hosted by the launcher of node 0) and a blocking
 * client used by launchers and workers. Wire protocol, limits and messages: docs/store.md.
 *
 * Every call returns 0 or a negative enum fsdp_error; on failure error_message() says what happened,
 * naming the key(s) waited for and the server address. Waits take a timeout in seconds (<= 0 means the
 * client's default, set at connect). A client is not thread-safe: use one per thread. */
#ifndef FSDP_RENDEZVOUS_STORE_H
#define FSDP_RENDEZVOUS_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STORE_PROTOCOL_VERSION 1
#define STORE_MAX_KEY_BYTES 1024            /* longer keys are refused */
#define STORE_MAX_VALUE_BYTES (16u << 20)   /* 16 MiB; longer values (and APPEND results) refused */

/* ---- server ---- */
struct store_server;

struct store_server_options {
    const char *bind_addr; /* NULL or "" = all interfaces (0.0.0.0) */
    int port;              /* 0 = pick a free port (see store_server_port) */
    const char *run_id;    /* job token part 1: clients of another run id are refused */
    const char *secret;    /* job token part 2 (FSDP_RDZV_TOKEN), NULL = none */
    double idle_timeout_s; /* a connection that has not completed its handshake by then is closed; 0 = 10 s */
};

/* Binds and starts serving on a background thread with its own event_base. Fails with FSDP_EEXIST and a
 * message naming the address and port when the port is in use. */
int store_server_start(const struct store_server_options *opts, struct store_server **out);
int store_server_port(const struct store_server *s);
/* Stops the thread, closes every connection, frees everything. NULL is accepted. */
void store_server_stop(struct store_server *s);

/* ---- client ---- */
struct store_client;

struct store_client_options {
    const char *host;          /* name or address of the server */
    int port;
    const char *run_id;
    const char *secret;        /* NULL = none */
    double connect_timeout_s;  /* keep retrying a refused/unreachable server this long; 0 = 30 s */
    double default_timeout_s;  /* waits with timeout <= 0 use this; 0 = 300 s */
};

int store_client_connect(const struct store_client_options *opts, struct store_client **out);
void store_client_close(struct store_client *c); /* NULL accepted */
/* A second connection to the same server with the same token, for another thread (a client is not
 * thread-safe); default_timeout_s as in the options (<= 0: 300 s). */
int store_client_clone(const struct store_client *c, double default_timeout_s, struct store_client **out);
/* The socket fd, for poll()-based callers that want to notice a dead server. */
int store_client_fd(const struct store_client *c);

int store_client_set(struct store_client *c, const char *key, const void *value, size_t len);
/* Waits until key exists (or timeout), then returns a malloc'd copy (NUL-terminated for convenience,
 * the terminator not counted in *len). */
int store_client_get(struct store_client *c, const char *key, void **value, size_t *len, double timeout_s);
/* Atomic: value (decimal int64 text, missing = 0) += delta; returns the new value in *result. */
int store_client_add(struct store_client *c, const char *key, int64_t delta, int64_t *result);
/* Atomic: if key's value equals expected (or key is missing and expected_len == 0 with expected NULL),
 * set it to desired. *actual (malloc'd) receives the value after the operation either way. */
int store_client_compare_set(struct store_client *c, const char *key, const void *expected, size_t expected_len,
                             const void *desired, size_t desired_len, void **actual, size_t *actual_len);
/* Does every key exist right now? */
int store_client_check(struct store_client *c, const char *const *keys, size_t nkeys, bool *all_exist);
/* Waits until every key exists. */
int store_client_wait(struct store_client *c, const char *const *keys, size_t nkeys, double timeout_s);
int store_client_delete(struct store_client *c, const char *key, bool *existed);
int store_client_num_keys(struct store_client *c, int64_t *n);
/* Appends bytes to key's value (creating it); returns nothing. */
int store_client_append(struct store_client *c, const char *key, const void *value, size_t len);
int store_client_ping(struct store_client *c);
/* All `world` participants call this with the same name; returns when all have arrived. Reusable with
 * the same name (each use is a new round). The timeout message says how many arrived of how many. */
int store_client_barrier(struct store_client *c, const char *name, int world, double timeout_s);

#endif
