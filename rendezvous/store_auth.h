/* The store's authentication: which secret a job uses, the key derived from it, and the MACs of fsdpc's
 * handshake. The key is HMAC-SHA256(secret, "fsdpc store key v2" + run id), so one secret gives each run id
 * its own key; the handshake proves both ends hold it (a MAC over both ends' nonces) without sending it. */
#ifndef FSDP_RENDEZVOUS_STORE_AUTH_H
#define FSDP_RENDEZVOUS_STORE_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STORE_KEY_BYTES 32u

/* ---- store_auth.c: key, MACs, nonces ---- */

void store_auth_key(const char *run_id, const char *secret, uint8_t key[STORE_KEY_BYTES]);
/* The MAC one side of a connection sends: side 'c' (client) or 's' (server), over the run id and both
 * nonces. */
void store_auth_mac(const uint8_t key[STORE_KEY_BYTES], char side, const void *run_id, size_t run_id_len,
                    const uint8_t *client_nonce, size_t client_nonce_len, const uint8_t *server_nonce,
                    size_t server_nonce_len, uint8_t mac[32]);
/* Compares in time independent of where the bytes differ. */
bool store_auth_equal(const uint8_t *a, const uint8_t *b, size_t n);
/* n random bytes (getrandom); 0 or FSDP_EIO. */
int store_auth_random(uint8_t *out, size_t n);

/* The status page's read-only credential (fsdp-launch --status_port): 64 hex digits of
 * HMAC-SHA256(secret, "fsdpc status page v1\0" + run id). One-way, and under another label than the store's
 * key, so whoever sniffs it off the page's cleartext HTTP learns neither the secret nor the key: it opens
 * no store session (docs/store.md, docs/launcher.md). */
#define STORE_STATUS_TOKEN_CHARS 64u
void store_auth_status_token(const char *run_id, const char *secret, char out[STORE_STATUS_TOKEN_CHARS + 1]);

/* ---- store_secret.c: where the secret comes from ---- */

enum store_secret_source { STORE_SECRET_NONE, STORE_SECRET_ENV, STORE_SECRET_FILE };

/* The job's secret: FSDP_RDZV_TOKEN when set (even empty), else the contents of FSDP_RDZV_TOKEN_FILE or of
 * the default file ($XDG_CONFIG_HOME/fsdpc/rdzv_token, else ~/.config/fsdpc/rdzv_token) when it exists,
 * trailing whitespace removed. *secret is malloc'd (NULL with STORE_SECRET_NONE); path (cap bytes) gets
 * the file used. A file that is not a regular file owned by the user, is readable or writable by others,
 * is empty or over 4 KiB, or cannot be read is an error (FSDP_EINVAL / FSDP_EIO) naming it. */
int store_secret_load(char **secret, enum store_secret_source *source, char *path, size_t cap);

#endif
