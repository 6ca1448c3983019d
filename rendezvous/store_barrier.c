/* The barrier is built on ADD + WAIT so the server needs no barrier state: the n-th arrival (counting from
 * 1 across all rounds) belongs to round (n-1)/world, and the arrival that completes a round publishes its
 * "done" key, which every participant of that round waits for. Rounds therefore reuse one counter. */
#include "rendezvous/store.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"

int store_client_barrier(struct store_client *c, const char *name, int world, double timeout_s)
{
    if (!name || !*name || world <= 0)
        return error_set(FSDP_EINVAL, "store barrier needs a name and a positive participant count (got %d)",
                         world);
    if (strlen(name) > STORE_MAX_KEY_BYTES - 64)
        return error_set(FSDP_ERANGE, "barrier name of %zu bytes is too long", strlen(name));
    char count_key[STORE_MAX_KEY_BYTES + 1], done_key[STORE_MAX_KEY_BYTES + 1];
    snprintf(count_key, sizeof count_key, "__barrier/%s/count", name);
    int64_t n;
    FSDP_TRY(store_client_add(c, count_key, 1, &n));
    int64_t round = (n - 1) / world;
    snprintf(done_key, sizeof done_key, "__barrier/%s/done/%" PRId64, name, round);
    if (n % world == 0) {
        FSDP_TRY(store_client_set(c, done_key, "1", 1));
    }
    const char *keys[] = {done_key};
    int rc = store_client_wait(c, keys, 1, timeout_s);
    if (rc != FSDP_ETIMEDOUT)
        return rc;
    char first[512];
    snprintf(first, sizeof first, "%s", error_message());
    int64_t now = n;
    if (store_client_add(c, count_key, 0, &now) != 0)
        now = n;
    int64_t arrived = now - round * world;
    if (arrived > world)
        arrived = world;
    return error_set(FSDP_ETIMEDOUT, "barrier '%s' (round %" PRId64 ") timed out: %" PRId64 " of %d participants "
                     "arrived (%s)", name, round, arrived, world, first);
}
