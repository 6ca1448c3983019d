#include "rendezvous/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "common/settings.h"
#include "rendezvous/store_protocol.h"

struct rdzv {
    struct store_server *server;
    struct store_client *client;
    int port;
    int nnodes, node_rank, nproc;
    double timeout_s, hb_timeout_s;
    char addr[256];
    char host[256];
    char **node_hosts; /* NULL or nnodes names */
    /* heartbeat bookkeeping of the current generation: last counter seen and when it last moved */
    int hb_gen;
    int64_t *hb_last;
    double *hb_moved;
};

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static const char *node_name(const struct rdzv *r, int node)
{
    return r->node_hosts && r->node_hosts[node] ? r->node_hosts[node] : NULL;
}

/* Seconds between the debug lines of a wait for the store, and the length of one connection attempt (the
 * granularity at which should_stop is asked). */
#define WAIT_REPORT_S 3.0
#define CONNECT_SLICE_S 0.1

/* store_client_connect in short slices until timeout_s: between slices should_stop may end the wait, and
 * the wait is reported (once at info: what is waited for and how long at most; then at debug every
 * WAIT_REPORT_S with the last error). who says who waits ("node 1", "rank 3"). */
static int connect_patiently(struct store_client_options co, double timeout_s, const char *who, const char *whose,
                             bool (*should_stop)(void *), void *arg, struct store_client **out)
{
    double start = clock_now_s(), deadline = start + timeout_s, next_report = 0;
    bool told = false;
    for (;;) {
        double left = deadline - clock_now_s();
        co.connect_timeout_s = left < CONNECT_SLICE_S ? (left > 0.001 ? left : 0.001) : CONNECT_SLICE_S;
        int rc = store_client_connect(&co, out);
        if (rc != FSDP_ETIMEDOUT)
            return rc;
        double now = clock_now_s();
        if (now >= deadline) {
            /* The same words as the client's own timeout, over the whole wait. */
            const char *le = strstr(error_message(), "(last error: ");
            char last[200] = "";
            if (le)
                snprintf(last, sizeof last, " %.*s)", (int)strcspn(le, ")"), le);
            return error_set(rc, "could not reach store at %s:%d for %g s%s: is the launcher of node 0 running "
                             "and --master_addr/--master_port right?", co.host, co.port, timeout_s, last);
        }
        if (!told) {
            log_info("%s: waiting for the rendezvous store at %s:%d (%s), for up to %.0f s", who, co.host, co.port,
                     whose, timeout_s);
            told = true;
            next_report = now + WAIT_REPORT_S;
        } else if (now >= next_report) {
            log_debug("%s: still waiting for the rendezvous store at %s:%d: %.0f s of %.0f s [%s]", who, co.host,
                      co.port, now - start, timeout_s, error_message());
            next_report = now + WAIT_REPORT_S;
        }
        if (should_stop && should_stop(arg))
            return error_set(FSDP_EABORTED, "%s: stopped while waiting for the rendezvous store at %s:%d", who,
                             co.host, co.port);
    }
}

int rdzv_store_connect(const struct store_client_options *co, double timeout_s, const char *who, const char *whose,
                       struct store_client **out)
{
    return connect_patiently(*co, timeout_s, who, whose, NULL, NULL, out);
}

/* Keeps a value on the store equal across nodes: the first writer sets it, later ones must match. */
static int agree(struct rdzv *r, const char *key, const char *what, int value)
{
    char mine[32];
    snprintf(mine, sizeof mine, "%d", value);
    void *actual = NULL;
    size_t alen = 0;
    FSDP_TRY(store_client_compare_set(r->client, key, NULL, 0, mine, strlen(mine), &actual, &alen));
    int rc = 0;
    if (alen != strlen(mine) || memcmp(actual, mine, alen) != 0) {
        rc = error_set(FSDP_EINVAL, "node %d was started with %s %s but the job has %s %.*s: give every node the "
                       "same %s", r->node_rank, what, mine, what, (int)alen, (char *)actual, what);
    }
    free(actual);
    return rc;
}

int rdzv_open(const struct rdzv_options *o, struct rdzv **out)
{
    *out = NULL;
    struct rdzv *r = calloc(1, sizeof *r);
    if (!r)
        return error_set(FSDP_ENOMEM, "out of memory");
    r->nnodes = o->nnodes;
    r->node_rank = o->node_rank;
    r->nproc = o->nproc_per_node;
    r->timeout_s = o->timeout_s > 0 ? o->timeout_s : 900;
    r->hb_timeout_s = o->heartbeat_timeout_s > 0 ? o->heartbeat_timeout_s : 10;
    r->hb_gen = -1;
    snprintf(r->addr, sizeof r->addr, "%s", o->master_addr);
    snprintf(r->host, sizeof r->host, "%s", o->host ? o->host : "?");
    r->port = o->master_port;
    int rc = 0;
    r->hb_last = calloc((size_t)o->nnodes, sizeof *r->hb_last);
    r->hb_moved = calloc((size_t)o->nnodes, sizeof *r->hb_moved);
    if (!r->hb_last || !r->hb_moved) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto fail;
    }
    if (o->node_hosts) {
        r->node_hosts = calloc((size_t)o->nnodes, sizeof *r->node_hosts);
        if (!r->node_hosts) {
            rc = error_set(FSDP_ENOMEM, "out of memory");
            goto fail;
        }
        for (int i = 0; i < o->nnodes && o->node_hosts[i]; i++)
            r->node_hosts[i] = strdup(o->node_hosts[i]);
    }

    const char *connect_host = o->master_addr;
    if (o->node_rank == 0) {
        struct store_server_options so = {.bind_addr = o->bind_addr, .port = o->master_port, .run_id = o->run_id,
                                          .secret = o->secret, .torch_off = o->torch_off};
        /* PyTorch workers hold a store connection or two each, without the token: a job larger than the
         * default cap gets room for all of them (docs/store.md, "Connections"). */
        size_t nodes = o->nnodes > 0 ? (size_t)o->nnodes : 1;
        size_t job_conns = 2 * nodes * (size_t)(o->nproc_per_node > 0 ? o->nproc_per_node : 1) + 64;
        if (!o->torch_off && job_conns > STORE_MAX_UNAUTH_CONNS)
            so.max_unauth_conns = job_conns;
        rc = store_server_start(&so, &r->server);
        if (rc == FSDP_EEXIST) {
            /* The server's message names the address and port already; add the way out only we know. */
            rc = error_set(rc, "cannot host the store: %s (or --master_port 0 to pick a free port)", error_message());
            goto fail;
        }
        if (rc)
            goto fail;
        r->port = store_server_port(r->server);
        /* Our own server is reachable on loopback when it listens on every interface. */
        const char *b = o->bind_addr;
        connect_host = b && *b && strcmp(b, "0.0.0.0") != 0 && strcmp(b, "::") != 0 ? b : "127.0.0.1";
    }
    struct store_client_options co = {.host = connect_host, .port = r->port, .run_id = o->run_id,
                                      .secret = o->secret, .default_timeout_s = 60};
    char who[32];
    snprintf(who, sizeof who, "node %d", r->node_rank);
    rc = connect_patiently(co, r->timeout_s, who, "node 0's fsdp-launch", o->should_stop, o->stop_arg, &r->client);
    if (rc == FSDP_EABORTED)
        goto fail;
    if (rc == FSDP_EREFUSED) {
        rc = error_set(rc, "the store at %s:%d refused node %d: its run id (--rdzv_id '%s') or FSDP_RDZV_TOKEN "
                       "differs from node 0's [%s]", r->addr, r->port, r->node_rank, o->run_id, error_message());
        goto fail;
    }
    if (rc) {
        rc = error_set(rc, "cannot reach the rendezvous store at %s:%d (tried for %.0f s): is fsdp-launch running "
                       "on node 0 with this --master_addr/--master_port, and the port open? [%s]", r->addr, r->port,
                       r->timeout_s, error_message());
        goto fail;
    }
    FSDP_TRY_GOTO(agree(r, "rdzv/nnodes", "--nnodes", r->nnodes), rc, fail);
    FSDP_TRY_GOTO(agree(r, "rdzv/nproc_per_node", "--nproc_per_node", r->nproc), rc, fail);
    *out = r;
    return 0;
fail:
    rdzv_close(r);
    return rc;
}

int rdzv_port(const struct rdzv *r) { return r->port; }
bool rdzv_is_host(const struct rdzv *r) { return r->server != NULL; }

static int key_exists(struct rdzv *r, const char *key, bool *exists)
{
    const char *keys[1] = {key};
    return store_client_check(r->client, keys, 1, exists);
}

/* Lists the nodes that have not joined generation g, for the timeout message. */
static void describe_missing(struct rdzv *r, int g, char *buf, size_t cap, int *joined)
{
    size_t used = 0;
    buf[0] = 0;
    *joined = 0;
    for (int n = 0; n < r->nnodes; n++) {
        char key[64];
        snprintf(key, sizeof key, "rdzv/g%d/node/%d", g, n);
        bool ex = false;
        if (key_exists(r, key, &ex) == 0 && ex) {
            (*joined)++;
            continue;
        }
        if (used + 64 >= cap)
            continue;
        const char *h = node_name(r, n);
        int w = h ? snprintf(buf + used, cap - used, "%s%d (host %s)", used ? ", " : "", n, h)
                  : snprintf(buf + used, cap - used, "%s%d", used ? ", " : "", n);
        used += w > 0 ? (size_t)w : 0;
        if (used >= cap)
            used = cap - 1;
    }
}

static int current_generation(struct rdzv *r, int *g)
{
    bool ex = false;
    int rc = key_exists(r, "rdzv/gen", &ex);
    if (rc || !ex) {
        *g = 0;
        return rc;
    }
    void *v = NULL;
    size_t len = 0;
    FSDP_TRY(store_client_get(r->client, "rdzv/gen", &v, &len, 5));
    int64_t x = 0;
    if (!store_parse_i64(v, len, &x) || x < 0 || x > INT32_MAX - 1)
        rc = error_set(FSDP_EPROTO, "the store's rdzv/gen holds '%.32s', not a generation number", (char *)v);
    free(v);
    *g = (int)x;
    return rc;
}

/* Claims this node's slot in generation g. *taken_by receives the holder's text when another launcher
 * has it (a duplicate node rank, or our own predecessor that died). */
static int claim_slot(struct rdzv *r, int g, char **taken_by)
{
    char key[64], mine[320];
    snprintf(key, sizeof key, "rdzv/g%d/node/%d", g, r->node_rank);
    snprintf(mine, sizeof mine, "%s pid %d", r->host, (int)getpid());
    void *actual = NULL;
    size_t alen = 0;
    *taken_by = NULL;
    FSDP_TRY(store_client_compare_set(r->client, key, NULL, 0, mine, strlen(mine), &actual, &alen));
    if (alen == strlen(mine) && memcmp(actual, mine, alen) == 0)
        free(actual);
    else
        *taken_by = actual;
    return 0;
}

/* The slot of generation g is held by `holder`. If that generation already failed, its holder was our dead
 * predecessor and the others move on to g+1 (returns 0); otherwise wait one heartbeat timeout for them to
 * notice it is gone. */
static int wait_holder_failed(struct rdzv *r, int g, const char *holder, bool (*should_stop)(void *), void *arg)
{
    char fkey[64];
    snprintf(fkey, sizeof fkey, "rdzv/g%d/failed", g);
    double wait_until = clock_now_s() + r->hb_timeout_s + 2;
    bool failed = false;
    while (!failed && clock_now_s() < wait_until) {
        FSDP_TRY(key_exists(r, fkey, &failed));
        if (!failed) {
            if (should_stop && should_stop(arg))
                return error_set(FSDP_EABORTED, "rendezvous abandoned");
            sleep_s(0.1);
        }
    }
    if (!failed)
        return error_set(FSDP_EREFUSED, "node rank %d already joined the job (generation %d) from %s: is another "
                         "fsdp-launch running with the same --node_rank?", r->node_rank, g, holder);
    return 0;
}

int rdzv_join(struct rdzv *r, int min_generation, bool (*should_stop)(void *), void *arg,
              struct rdzv_assignment *out)
{
    int g = 0;
    FSDP_TRY(current_generation(r, &g));
    if (g < min_generation)
        g = min_generation;
    double t0 = clock_now_s();
    for (;;) {
        char *holder = NULL;
        FSDP_TRY(claim_slot(r, g, &holder));
        if (!holder)
            break;
        int rc = wait_holder_failed(r, g, holder, should_stop, arg);
        free(holder);
        if (rc)
            return rc;
        g++;
    }
    char key[64];
    snprintf(key, sizeof key, "rdzv/g%d/hb/%d", g, r->node_rank);
    int64_t dummy;
    FSDP_TRY(store_client_add(r->client, key, 1, &dummy));
    char gv[32];
    snprintf(gv, sizeof gv, "%d", g);
    FSDP_TRY(store_client_set(r->client, "rdzv/gen", gv, strlen(gv)));

    char **keys = calloc((size_t)r->nnodes, sizeof *keys);
    if (!keys)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    for (int n = 0; n < r->nnodes; n++) {
        if (!(keys[n] = malloc(48))) {
            rc = error_set(FSDP_ENOMEM, "out of memory");
            goto done;
        }
        snprintf(keys[n], 48, "rdzv/g%d/node/%d", g, n);
    }
    /* Once every node has joined, node 0 empties PyTorch clients' key space (keys an earlier attempt's
     * workers left would be read by this one's: c10d's keys carry no attempt) and opens the generation;
     * no node starts workers before that. Polled with short sleeps rather than one long store wait, so a
     * signal to the launcher (should_stop) is honoured within ~100 ms while nodes are still missing. */
    char open_key[64];
    snprintf(open_key, sizeof open_key, "rdzv/g%d/open", g);
    const char *open_keys[1] = {open_key};
    bool all = false, open = false;
    double pause = 0.0005;
    while (!open) {
        if (!all) {
            FSDP_TRY_GOTO(store_client_check(r->client, (const char *const *)keys, (size_t)r->nnodes, &all), rc,
                          done);
            if (all)
                pause = 0.0005; /* node 0 opens it right away */
        }
        if (all && r->server) {
            FSDP_TRY_GOTO(store_client_reset_torch_keys(r->client, NULL), rc, done);
            FSDP_TRY_GOTO(store_client_set(r->client, open_key, "1", 1), rc, done);
            break;
        }
        if (all)
            FSDP_TRY_GOTO(store_client_check(r->client, open_keys, 1, &open), rc, done);
        if (open)
            break;
        if (should_stop && should_stop(arg)) {
            rc = error_set(FSDP_EABORTED, "rendezvous abandoned");
            goto done;
        }
        if (clock_now_s() - t0 > r->timeout_s && all) {
            rc = error_set(FSDP_ETIMEDOUT, "rendezvous timed out after %.0f s (--rdzv_timeout): every node joined "
                           "generation %d but node 0 did not open it", r->timeout_s, g);
            goto done;
        }
        if (clock_now_s() - t0 > r->timeout_s) {
            char missing[1024];
            int joined = 0;
            describe_missing(r, g, missing, sizeof missing, &joined);
            rc = error_set(FSDP_ETIMEDOUT, "rendezvous timed out after %.0f s (--rdzv_timeout): %d of %d nodes "
                           "joined generation %d; missing node ranks: %s", r->timeout_s, joined, r->nnodes, g,
                           missing);
            goto done;
        }
        sleep_s(pause);
        if (pause < 0.1)
            pause *= 2;
    }
    out->generation = g;
    out->rank_base = r->node_rank * r->nproc;
    out->world_size = r->nnodes * r->nproc;
    snprintf(out->prefix, sizeof out->prefix, "worker/g%d/", g);
    /* Heartbeats restart with the generation: everyone just joined, so everyone is alive now. */
    r->hb_gen = g;
    double t = clock_now_s();
    for (int n = 0; n < r->nnodes; n++) {
        r->hb_last[n] = -1;
        r->hb_moved[n] = t;
    }
done:
    for (int n = 0; n < r->nnodes; n++)
        free(keys[n]);
    free(keys);
    return rc;
}

int rdzv_publish_failure(struct rdzv *r, int generation, const char *record, char **root)
{
    char key[64];
    snprintf(key, sizeof key, "rdzv/g%d/failed", generation);
    void *actual = NULL;
    size_t alen = 0;
    FSDP_TRY(store_client_compare_set(r->client, key, NULL, 0, record, strlen(record), &actual, &alen));
    *root = actual;
    return 0;
}

int rdzv_poll(struct rdzv *r, int g, struct rdzv_status *st)
{
    st->failure = NULL;
    st->lost_node = -1;
    st->done_nodes = 0;
    char key[64];
    int64_t v;
    snprintf(key, sizeof key, "rdzv/g%d/hb/%d", g, r->node_rank);
    FSDP_TRY(store_client_add(r->client, key, 1, &v));
    snprintf(key, sizeof key, "rdzv/g%d/failed", g);
    bool failed = false;
    FSDP_TRY(key_exists(r, key, &failed));
    if (failed) {
        size_t len;
        FSDP_TRY(store_client_get(r->client, key, (void **)&st->failure, &len, 5));
    }
    snprintf(key, sizeof key, "rdzv/g%d/done", g);
    FSDP_TRY(store_client_add(r->client, key, 0, &v));
    st->done_nodes = (int)v;
    double t = clock_now_s();
    for (int n = 0; n < r->nnodes; n++) {
        if (n == r->node_rank)
            continue;
        snprintf(key, sizeof key, "rdzv/g%d/hb/%d", g, n);
        FSDP_TRY(store_client_add(r->client, key, 0, &v));
        if (r->hb_gen == g && v != r->hb_last[n]) {
            r->hb_last[n] = v;
            r->hb_moved[n] = t;
        } else if (r->hb_gen == g && t - r->hb_moved[n] > r->hb_timeout_s && st->lost_node < 0) {
            st->lost_node = n;
        }
    }
    return 0;
}

int rdzv_mark_done(struct rdzv *r, int g)
{
    char key[64];
    int64_t v;
    snprintf(key, sizeof key, "rdzv/g%d/done", g);
    return store_client_add(r->client, key, 1, &v);
}

int rdzv_finish(struct rdzv *r, int g, double timeout_s)
{
    char key[64];
    int64_t v = 0;
    snprintf(key, sizeof key, "rdzv/g%d/bye", g);
    if (!r->server)
        return store_client_add(r->client, key, 1, &v);
    double t0 = clock_now_s();
    double pause = 0.0005;
    for (;;) {
        FSDP_TRY(store_client_add(r->client, key, 0, &v));
        if (v >= r->nnodes - 1)
            return 0;
        if (clock_now_s() - t0 > timeout_s)
            return error_set(FSDP_ETIMEDOUT, "%d of %d other nodes said goodbye before the store closed",
                             (int)v, r->nnodes - 1);
        sleep_s(pause);
        if (pause < 0.05)
            pause *= 2;
    }
}

void rdzv_close(struct rdzv *r)
{
    if (!r)
        return;
    store_client_close(r->client);
    store_server_stop(r->server);
    if (r->node_hosts)
        for (int i = 0; i < r->nnodes; i++)
            free(r->node_hosts[i]);
    free(r->node_hosts);
    free(r->hb_last);
    free(r->hb_moved);
    free(r);
}

bool rdzv_loopback_name(const char *addr, char *shown, size_t cap)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST};
    struct addrinfo *res = NULL;
    if (!addr || getaddrinfo(addr, NULL, &hints, &res) == 0) {
        if (res)
            freeaddrinfo(res);
        return false;
    }
    hints.ai_flags = 0;
    if (getaddrinfo(addr, NULL, &hints, &res) != 0)
        return false;
    bool loopback = res != NULL;
    char text[INET6_ADDRSTRLEN] = "?";
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET) {
            struct in_addr in = ((struct sockaddr_in *)ai->ai_addr)->sin_addr;
            loopback = loopback && (ntohl(in.s_addr) >> 24) == 127;
            inet_ntop(AF_INET, &in, text, sizeof text);
        } else if (ai->ai_family == AF_INET6) {
            struct in6_addr in6 = ((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
            loopback = loopback && IN6_IS_ADDR_LOOPBACK(&in6);
            inet_ntop(AF_INET6, &in6, text, sizeof text);
        }
    }
    freeaddrinfo(res);
    if (shown && cap)
        snprintf(shown, cap, "%s", text);
    return loopback;
}

/* ---- worker side ---- */

static int env_int(const char *name, int *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return error_set(FSDP_EINVAL, "%s is not set: start this program with fsdp-launch (or set MASTER_ADDR, "
                         "MASTER_PORT, RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID yourself)", name);
    int64_t x;
    if (!store_parse_i64(v, strlen(v), &x) || x < 0 || x > 1 << 30)
        return error_set(FSDP_EINVAL, "%s='%s' is not a non-negative integer", name, v);
    *out = (int)x;
    return 0;
}

int rdzv_worker_connect(struct rdzv_worker *w, double timeout_s)
{
    memset(w, 0, sizeof *w);
    int port = 0;
    FSDP_TRY(env_int("MASTER_PORT", &port));
    FSDP_TRY(env_int("RANK", &w->rank));
    FSDP_TRY(env_int("WORLD_SIZE", &w->world_size));
    if (env_int("LOCAL_RANK", &w->local_rank))
        w->local_rank = 0;
    error_clear();
    const char *addr = getenv("MASTER_ADDR");
    if (!addr || !*addr)
        return error_set(FSDP_EINVAL, "MASTER_ADDR is not set: start this program with fsdp-launch");
    const char *run_id = getenv("TORCHELASTIC_RUN_ID");
    const char *prefix = settings_get_raw(SETTING_STORE_PREFIX);
    snprintf(w->prefix, sizeof w->prefix, "%s", prefix ? prefix : "worker/");
    struct store_client_options co = {.host = addr, .port = port, .run_id = run_id ? run_id : "none",
                                      .secret = settings_get_raw(SETTING_RDZV_TOKEN),
                                      .default_timeout_s = timeout_s > 0 ? timeout_s : 300};
    char who[32];
    snprintf(who, sizeof who, "rank %d", w->rank);
    return connect_patiently(co, timeout_s > 0 ? timeout_s : 60, who, "node 0's fsdp-launch", NULL, NULL, &w->client);
}

int rdzv_worker_key(const struct rdzv_worker *w, const char *name, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "%s%s", w->prefix, name);
    if (n < 0 || (size_t)n >= cap)
        return error_set(FSDP_ERANGE, "store key '%s%s' longer than %zu bytes", w->prefix, name, cap - 1);
    return 0;
}

int rdzv_worker_barrier(struct rdzv_worker *w, const char *name, double timeout_s)
{
    char key[STORE_MAX_KEY_BYTES];
    FSDP_TRY(rdzv_worker_key(w, name, key, sizeof key));
    return store_client_barrier(w->client, key, w->world_size, timeout_s);
}

void rdzv_worker_close(struct rdzv_worker *w)
{
    store_client_close(w->client);
    w->client = NULL;
}
