/* The rendezvous key-value store: a server (libevent, hosted by the launcher of node 0) and a blocking
 * client used by launchers and workers. It speaks c10d TCPStore's wire protocol, so PyTorch's TCPStore
 * clients work against the server (in a key space of their own) and the client works against PyTorch's
 * TCPStore server (`plain`); fsdpc's clients add a token handshake and reach fsdpc's key space. Wire
 * protocol, limits and messages: docs/store.md.
 *
 * Every call returns 0 or a negative enum fsdp_error; on failure error_message() says what happened,
 * naming the key(s) waited for and the server address. Waits take a timeout in seconds (<= 0 means the
 * client's default, set at connect). A client is not thread-safe: use one per thread. */
#ifndef FSDP_RENDEZVOUS_STORE_H
#define FSDP_RENDEZVOUS_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STORE_PROTOCOL_VERSION 2          /* of fsdpc's handshake (HELLO); c10d's ops have none */
#define STORE_MAX_KEY_BYTES 8192           /* c10d's MAX_STRING_LEN; longer keys are refused */
#define STORE_MAX_VALUE_BYTES (16u << 20)  /* 16 MiB; longer values (and APPEND results) refused */
#define STORE_MAX_KEYS 131072u             /* keys of one CHECK / WAIT (c10d's MAX_KEY_COUNT) */

/* The one budget of what connections without the job's token (PyTorch clients, handshakes) may make the
 * server hold: their keys, values and queued items, their waiting requests, their requests being received
 * past the read window, their unsent replies (docs/store.md, "Limits"). */
#define STORE_UNAUTH_BYTES_MAX (64u << 20)
/* Of that budget, PyTorch clients' keys charged to one connection (their latest writer). */
#define STORE_TORCH_CONN_BYTES_MAX (16u << 20)
#define STORE_OUT_MAX (1u << 20)
/* Connections that have not proven the job's token (still in their handshake, or PyTorch clients) kept at
 * once; past it the server closes the one idle longest to make room (docs/store.md, "Connections"). */
#define STORE_MAX_UNAUTH_CONNS 1024u

/* ---- server ---- */
struct store_server;

struct store_server_options {
    const char *bind_addr; /* NULL or "" = all interfaces (0.0.0.0) */
    int port;              /* 0 = pick a free port (see store_server_port) */
    const char *run_id;    /* the job's id: clients of another run id are refused */
    const char *secret;    /* with the run id, derives the key fsdpc clients prove they hold; NULL = none */
    double idle_timeout_s; /* a connection that has not completed its handshake by then is closed, and so is
                            * one that leaves a request half sent this long; 0 = 10 s */
    bool torch_off;        /* refuse PyTorch TCPStore clients (fsdp-launch --no_torch_store) */
    /* Limits for clients without the token (0 = the STORE_* default above): the budget of everything they
     * make the server hold, and the bytes of PyTorch clients' keys charged to one connection. */
    size_t unauth_bytes_max, torch_conn_bytes_max;
    size_t out_max; /* unsent reply bytes of a connection beyond which its next requests wait; 0 = 1 MiB */
    /* Connections without the token kept at once; 0 = STORE_MAX_UNAUTH_CONNS. Lowered to half the open-files
     * limit, so the cap is met before descriptors run out; authenticated connections are not counted. */
    size_t max_unauth_conns;
};

/* Binds and starts serving on a background thread with its own event_base. Fails with FSDP_EEXIST and a
 * message naming the address and port when the port is in use. */
int store_server_start(const struct store_server_options *opts, struct store_server **out);
int store_server_port(const struct store_server *s);
/* What the server holds for connections without the token, and what the AUTH throttle did and holds; safe to read
 * from any thread (each field on its own, not as one snapshot). */
struct store_server_stats {
    size_t unauth_bytes;      /* charged to the budget now */
    size_t unauth_bytes_max;  /* the budget */
    size_t unauth_bytes_peak; /* the most charged at once since start */
    uint64_t budget_refusals; /* connections closed because a reply, wait, key or request did not fit */
    uint64_t auth_failures;   /* AUTHs checked and found wrong */
    uint64_t auth_delayed;    /* AUTHs that waited for the throttle before being checked */
    uint64_t auth_dropped;    /* of those, closed unchecked (handshake deadline, cap, peer gone) */
    size_t auth_waiting;      /* AUTHs waiting for the throttle now */
};
void store_server_stats(const struct store_server *s, struct store_server_stats *out);
/* Stops the thread, closes every connection, frees everything. NULL is accepted. */
void store_server_stop(struct store_server *s);

/* ---- client ---- */
struct store_client;

struct store_client_options {
    const char *host;          /* name or address of the server */
    int port;
    const char *run_id;
    const char *secret;        /* NULL = none */
    bool plain;                /* speak plain c10d TCPStore (no handshake, PyTorch clients' key space): for
                                * PyTorch's own TCPStore servers; run_id and secret are not used */
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
/* Atomic, with c10d's semantics: expected_len == 0 matches a missing key (or an empty value); otherwise the
 * value must equal expected byte for byte. On a match the value becomes desired. *actual (malloc'd)
 * receives the value after the operation either way (empty when the key is still missing). */
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
/* Empties PyTorch clients' key space (fsdpc's own keys stay); *removed (may be NULL) gets the number of
 * keys and queues removed. Not in plain mode. */
int store_client_reset_torch_keys(struct store_client *c, int64_t *removed);
/* All `world` participants call this with the same name; returns when all have arrived. Reusable with
 * the same name (each use is a new round). The timeout message says how many arrived of how many. */
int store_client_barrier(struct store_client *c, const char *name, int world, double timeout_s);

#endif
