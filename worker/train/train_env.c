/* Where this rank stands: rank, world and node sizes from the torchrun environment (one rank when none is
 * set, as `python train.py` runs), and the store that bootstraps the communicators. Under fsdp-launch the
 * store is the launcher's (FSDP_STORE_PREFIX says so); under another torchrun-compatible launcher,
 * MASTER_PORT belongs to that launcher's own store, so rank 0 hosts ours next to it (FSDP_STORE_PORT,
 * default MASTER_PORT + 1), listening on MASTER_ADDR, with the job's secret (FSDP_RDZV_TOKEN or the
 * secret file). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/settings.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/store_auth.h"
#include "worker/train/train_env.h"

static int env_int(const char *name, int def, int min, int *out)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        *out = def;
        return 0;
    }
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < min || x > 1 << 24)
        return error_set(FSDP_EINVAL, "environment: %s=%s is not an integer >= %d", name, v, min);
    *out = (int)x;
    return 0;
}

int train_env_open(struct train_env *e)
{
    memset(e, 0, sizeof *e);
    FSDP_TRY(env_int("WORLD_SIZE", 1, 1, &e->world_size));
    FSDP_TRY(env_int("RANK", 0, 0, &e->rank));
    FSDP_TRY(env_int("LOCAL_RANK", e->rank, 0, &e->local_rank));
    FSDP_TRY(env_int("LOCAL_WORLD_SIZE", e->world_size, 1, &e->local_world_size));
    FSDP_TRY(env_int("TORCHELASTIC_RESTART_COUNT", 0, 0, &e->restart_count));
    if (e->rank >= e->world_size)
        return error_set(FSDP_EINVAL, "environment: RANK=%d is not below WORLD_SIZE=%d", e->rank, e->world_size);
    const char *run_id = getenv("TORCHELASTIC_RUN_ID");
    snprintf(e->run_id, sizeof e->run_id, "%s", run_id && *run_id ? run_id : "local");
    if (e->world_size == 1)
        return 0;
    if (settings_get_raw(SETTING_STORE_PREFIX)) {
        struct rdzv_worker w;
        FSDP_TRY(rdzv_worker_connect(&w, 120));
        e->store = w.client;
        return 0;
    }
    /* A foreign launcher: host our store beside its own. */
    const char *addr = getenv("MASTER_ADDR");
    int mport = 0, port = 0;
    FSDP_TRY(env_int("MASTER_PORT", 29500, 1, &mport));
    long sport = (long)mport + 1;
    FSDP_TRY(settings_get_int(SETTING_STORE_PORT, &sport));
    port = (int)sport;
    if (!addr || !*addr)
        return error_set(FSDP_EINVAL, "environment: WORLD_SIZE=%d but MASTER_ADDR is not set; start the workers with "
                         "fsdp-launch or torchrun", e->world_size);
    char *secret = NULL, file[FSDP_PATH_MAX];
    enum store_secret_source source;
    FSDP_TRY(store_secret_load(&secret, &source, file, sizeof file));
    bool multi_node = e->world_size > e->local_world_size;
    if (!secret && multi_node && e->rank == 0)
        log_warn("SECURITY: fsdp's store for this multi-node job (rank 0, port %d) has no secret: any host that can "
                 "reach it can read the rendezvous and end the job; set the same FSDP_RDZV_TOKEN for every rank, "
                 "or create ~/.config/fsdpc/rdzv_token (mode 600) on every node (docs/launcher.md, \"Security\")",
                 port);
    int rc;
    if (e->rank == 0) {
        /* On MASTER_ADDR, where the other ranks look for it; a name that is loopback here (Debian maps the
         * host's own name to 127.0.1.1) would hide it from other nodes, so those get every interface. */
        const char *bind = rdzv_loopback_name(addr, NULL, 0) && multi_node ? "0.0.0.0" : addr;
        struct store_server_options so = {.bind_addr = bind, .port = port, .run_id = e->run_id, .secret = secret,
                                          .torch_off = true};
        rc = store_server_start(&so, &e->server);
        if (rc) {
            free(secret);
            return error_set(rc, "rank 0 hosts the fsdp store on port %d (FSDP_STORE_PORT, default MASTER_PORT + 1): %s",
                             port, error_message());
        }
    }
    struct store_client_options co = {.host = addr, .port = port, .run_id = e->run_id, .secret = secret,
                                      .default_timeout_s = 600};
    char who[32];
    snprintf(who, sizeof who, "rank %d", e->rank);
    rc = rdzv_store_connect(&co, 120, who, "rank 0's fsdp store, beside the launcher's", &e->store);
    free(secret);
    if (rc)
        return error_set(rc, "connecting to rank 0's fsdp store at %s:%d: %s", co.host, port, error_message());
    log_debug("store: rank 0 hosts it on port %d beside the launcher's", port);
    return 0;
}

void train_env_close(struct train_env *e)
{
    store_client_close(e->store);
    e->store = NULL;
    store_server_stop(e->server);
    e->server = NULL;
}

/* "./runs/<run_id>" -> "./runs/<the run id>" */
int train_expand_run_id(char *out, size_t cap, const char *pattern, const char *run_id, const char *key)
{
    const char *at = strstr(pattern, "<run_id>");
    if (!at)
        return fs_path_format(out, cap, key, "%s", pattern);
    return fs_path_format(out, cap, key, "%.*s%s%s", (int)(at - pattern), pattern, run_id, at + strlen("<run_id>"));
}
