#include "rendezvous/store_auth.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include <nettle/hmac.h>
#include <nettle/memops.h>

#include "common/error.h"

static const char key_label[] = "fsdpc store key v2";
static const char status_label[] = "fsdpc status page v1";

void store_auth_key(const char *run_id, const char *secret, uint8_t key[STORE_KEY_BYTES])
{
    struct hmac_sha256_ctx ctx;
    const char *sec = secret ? secret : "";
    hmac_sha256_set_key(&ctx, strlen(sec), (const uint8_t *)sec);
    hmac_sha256_update(&ctx, sizeof key_label, (const uint8_t *)key_label); /* with its NUL: a separator */
    hmac_sha256_update(&ctx, strlen(run_id), (const uint8_t *)run_id);
    hmac_sha256_digest(&ctx, STORE_KEY_BYTES, key);
}

void store_auth_status_token(const char *run_id, const char *secret, char out[STORE_STATUS_TOKEN_CHARS + 1])
{
    struct hmac_sha256_ctx ctx;
    const char *sec = secret ? secret : "";
    uint8_t mac[SHA256_DIGEST_SIZE];
    hmac_sha256_set_key(&ctx, strlen(sec), (const uint8_t *)sec);
    hmac_sha256_update(&ctx, sizeof status_label, (const uint8_t *)status_label); /* with its NUL */
    hmac_sha256_update(&ctx, strlen(run_id), (const uint8_t *)run_id);
    hmac_sha256_digest(&ctx, sizeof mac, mac);
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof mac; i++) {
        out[2 * i] = hex[mac[i] >> 4];
        out[2 * i + 1] = hex[mac[i] & 15];
    }
    out[STORE_STATUS_TOKEN_CHARS] = 0;
}

/* Length-prefixed, so no two different inputs run together into the same bytes. */
static void mac_field(struct hmac_sha256_ctx *ctx, const void *p, size_t n)
{
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    hmac_sha256_update(ctx, sizeof len, len);
    hmac_sha256_update(ctx, n, p);
}

void store_auth_mac(const uint8_t key[STORE_KEY_BYTES], char side, const void *run_id, size_t run_id_len,
                    const uint8_t *client_nonce, size_t client_nonce_len, const uint8_t *server_nonce,
                    size_t server_nonce_len, uint8_t mac[32])
{
    struct hmac_sha256_ctx ctx;
    hmac_sha256_set_key(&ctx, STORE_KEY_BYTES, key);
    const char label[] = {'f', 's', 'd', 'p', 'c', ' ', side};
    mac_field(&ctx, label, sizeof label);
    mac_field(&ctx, run_id, run_id_len);
    mac_field(&ctx, client_nonce, client_nonce_len);
    mac_field(&ctx, server_nonce, server_nonce_len);
    hmac_sha256_digest(&ctx, SHA256_DIGEST_SIZE, mac);
}

bool store_auth_equal(const uint8_t *a, const uint8_t *b, size_t n) { return memeql_sec(a, b, n) != 0; }

int store_auth_random(uint8_t *out, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(out + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return error_set(FSDP_EIO, "no random bytes from the kernel (getrandom: %s)", strerror(errno));
        got += (size_t)r;
    }
    return 0;
}
