/* The "cpu" backend: ranks that share a host (same hostname and network namespace, found through the
 * store) use the shared-memory engine; hosts talk over TCP between their leaders (lowest rank of each
 * host). With one host everything is shared memory; with one rank per host everything is TCP.
 *
 * Cross-host reductions: leaders split the buffer into one chunk per host; every leader sends chunk h to
 * leader h, which reduces the host sums in host order (hosts ordered by their lowest rank) and sends the
 * result back to all (a reduce_scatter stops halfway: leader h receives only its own ranks' blocks). So
 * an f32 sum is (sum of host 0's ranks in rank order) + (host 1's) + ..., the same for every run with the
 * same layout. */
#include "comm/comm_internal.h"
#include "common/clock.h"
#include "comm/comm_mem.h"
#include "comm/comm_shm.h"
#include "comm/comm_tcp.h"
#include "common/error.h"
#include "common/log.h"
#include "common/settings.h"
#include "rendezvous/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The leaders' steps keep one transfer and one reduction source per host on the stack. */
#define CPU_MAX_HOSTS 256

struct cpu_state {
    int rank, size;
    int nhosts, host;       /* this rank's host index */
    int *host_of;           /* [size] host index of each rank */
    int *leader;            /* [nhosts] lowest rank of each host */
    int *local_count;       /* [nhosts] */
    int nlocal, local_rank; /* on this host */
    int locals[SHM_MAX_LOCAL];
    struct shm_group *shm; /* NULL when alone on the host */
    struct tcp_mesh *tcp;
    void *tmp;
    size_t tmp_bytes;
    /* The progress thread's own store connection, for the failure record (see resolve_failure). */
    struct store_client *oob;
    char failed_key[160];
    bool failure_resolved;
};

/* Two ranks share memory only when they see the same machine and the same network namespace: separate
 * namespaces (containers, ip netns) are separate hosts for us. Env overrides let tests fake hosts. */
static void host_id(int rank, char *buf, size_t len)
{
    const char *fake = settings_get_string(SETTING_COMM_HOST_ID);
    if (settings_bool(SETTING_COMM_FORCE_TCP)) {
        snprintf(buf, len, "tcp-only-rank-%d", rank);
        return;
    }
    if (fake) {
        snprintf(buf, len, "fake-%s", fake);
        return;
    }
    char hn[256] = "";
    gethostname(hn, sizeof(hn) - 1);
    struct stat st;
    unsigned long long netns = stat("/proc/self/ns/net", &st) == 0 ? (unsigned long long)st.st_ino : 0;
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof(boot), f))
            boot[0] = 0;
        fclose(f);
        boot[strcspn(boot, "\n")] = 0;
    }
    snprintf(buf, len, "%s/%s/%llu", hn, boot, netns);
}

static size_t slot_bytes(void)
{
    return (size_t)settings_int(SETTING_COMM_SHM_SLOT_KIB) << 10;
}

static void cpu_fini(void *state)
{
    struct cpu_state *st = state;
    if (!st)
        return;
    shm_group_detach(st->shm);
    tcp_mesh_destroy(st->tcp);
    store_client_close(st->oob);
    free(st->host_of);
    free(st->leader);
    free(st->local_count);
    free(st->tmp);
    free(st);
}

static int setup_shm(struct cpu_state *st, const struct comm_info *info, double deadline)
{
    char key[256], name[200];
    size_t sb = slot_bytes();
    const char *run = settings_get_string(SETTING_RUN_ID);
    if (!run)
        run = getenv("TORCHELASTIC_RUN_ID");
    if (!run || !*run)
        run = "local";
    int rc = 0;
    snprintf(key, sizeof(key), "%s/shm/%d", info->key_prefix, st->host);
    if (st->local_rank == 0) {
        /* A leader killed before the unlink below left its segment; its pid (the name's end) is gone. */
        shm_sweep_stale("fsdp-");
        /* The leader's pid keeps two jobs with the same run id apart. */
        snprintf(name, sizeof(name), "/fsdp-%.40s-%.64s-%d-h%d-%d", run, info->group, info->generation,
                 st->host, (int)getpid());
        FSDP_TRY(shm_group_attach(name, true, 0, st->nlocal, st->locals, sb, &st->shm));
        FSDP_TRY_GOTO(store_client_set(info->store, key, name, strlen(name)), rc, mapped);
    } else {
        void *v = NULL;
        size_t vl = 0;
        double left = deadline - clock_now_s();
        FSDP_TRY(store_client_get(info->store, key, &v, &vl, left > 0.01 ? left : 0.01));
        snprintf(name, sizeof(name), "%s", (char *)v);
        free(v);
        FSDP_TRY_GOTO(shm_group_attach(name, false, st->local_rank, st->nlocal, st->locals, sb, &st->shm), rc, mapped);
    }
    /* Unlink once everyone has mapped it: from then on a crash cannot leave anything in /dev/shm. */
    snprintf(key, sizeof(key), "%s/shm_mapped/%d", info->key_prefix, st->host);
    double left = deadline - clock_now_s();
    FSDP_TRY_GOTO(store_client_barrier(info->store, key, st->nlocal, left > 0.01 ? left : 0.01), rc, mapped);
mapped:
    if (st->local_rank == 0)
        shm_unlink(name);
    if (rc)
        return rc;
    shm_group_ready(st->shm);
    return 0;
}

static int cpu_init(const struct comm_info *info, void **state)
{
    *state = NULL;
    FSDP_TRY(shm_check_env());
    struct cpu_state *st = calloc(1, sizeof(*st));
    if (!st)
        return error_set(FSDP_ENOMEM, "comm cpu: out of memory");
    int rc = 0;
    st->rank = info->rank;
    st->size = info->size;
    st->host_of = calloc((size_t)info->size, sizeof(int));
    st->leader = calloc((size_t)info->size, sizeof(int));
    st->local_count = calloc((size_t)info->size, sizeof(int));
    char **ids = calloc((size_t)info->size, sizeof(char *));
    double deadline = clock_now_s() + info->timeout_s;
    if (!st->host_of || !st->leader || !st->local_count || !ids) {
        rc = error_set(FSDP_ENOMEM, "comm cpu: out of memory");
        goto out;
    }
    char id[512], key[256];
    host_id(info->rank, id, sizeof(id));
    snprintf(key, sizeof(key), "%s/host/%d", info->key_prefix, info->rank);
    FSDP_TRY_GOTO(store_client_set(info->store, key, id, strlen(id)), rc, out);
    for (int r = 0; r < info->size; r++) {
        snprintf(key, sizeof(key), "%s/host/%d", info->key_prefix, r);
        size_t len = 0;
        double left = deadline - clock_now_s();
        if ((rc = store_client_get(info->store, key, (void **)&ids[r], &len, left > 0.01 ? left : 0.01)) != 0) {
            rc = error_set(rc, "rank %d never published its host id: %s", r, error_message());
            goto out;
        }
        int h = -1;
        for (int q = 0; q < r && h < 0; q++)
            if (strcmp(ids[q], ids[r]) == 0)
                h = st->host_of[q];
        if (h < 0) {
            h = st->nhosts++;
            st->leader[h] = r;
        }
        st->host_of[r] = h;
        st->local_count[h]++;
    }
    if (st->nhosts > CPU_MAX_HOSTS) {
        rc = error_set(FSDP_EUNSUPPORTED, "comm cpu: group '%s' spans %d hosts; the cpu backend supports at most %d",
                       info->group, st->nhosts, CPU_MAX_HOSTS);
        goto out;
    }
    st->host = st->host_of[info->rank];
    for (int r = 0; r < info->size; r++) {
        if (st->host_of[r] != st->host)
            continue;
        if (st->nlocal == SHM_MAX_LOCAL) {
            rc = error_set(FSDP_EUNSUPPORTED, "comm cpu: more than %d ranks on one host", SHM_MAX_LOCAL);
            goto out;
        }
        if (r == info->rank)
            st->local_rank = st->nlocal;
        st->locals[st->nlocal++] = r;
    }
    log_debug("comm %s: rank %d on host %d of %d (local %d of %d)", info->group, info->rank, st->host,
              st->nhosts, st->local_rank, st->nlocal);
    if (st->nlocal > 1)
        FSDP_TRY_GOTO(setup_shm(st, info, deadline), rc, out);
    if (info->size > 1) {
        snprintf(st->failed_key, sizeof(st->failed_key), "%s/failed", info->key_prefix);
        FSDP_TRY_GOTO(store_client_clone(info->store, 10, &st->oob), rc, out);
    }
    /* The mesh serves send/recv everywhere and the leaders' cross-host steps. */
    if (info->size > 1)
        FSDP_TRY_GOTO(tcp_mesh_create(info->store, info->key_prefix, info->rank, info->size, deadline, &st->tcp), rc,
                      out);
out:
    if (ids)
        for (int r = 0; r < info->size; r++)
            free(ids[r]);
    free(ids);
    if (rc) {
        cpu_fini(st);
        return rc;
    }
    *state = st;
    return 0;
}

static void *scratch(struct cpu_state *st, size_t bytes)
{
    if (bytes <= st->tmp_bytes)
        return st->tmp;
    void *p = realloc(st->tmp, bytes);
    if (!p)
        return NULL;
    st->tmp = p;
    st->tmp_bytes = bytes;
    return p;
}

/* A rank that gives up closes its sockets, and its peers then see a reset connection and would blame
 * that rank, which is only the messenger. So every failing rank first offers its cause to the store
 * (compare-and-set on one key per communicator and generation: the first cause wins) and only then
 * returns and lets its connections close; a rank whose own error is a lost connection reports the
 * winning cause instead. The true first failure is always published before any connection it causes to
 * drop, so a secondary error never wins. */
static int resolve_failure(struct cpu_state *st, int rc)
{
    if (!st->oob || st->failure_resolved)
        return rc;
    st->failure_resolved = true;
    char mine[600];
    snprintf(mine, sizeof(mine), "rank %d: %s", st->rank, error_message());
    void *won = NULL;
    size_t wl = 0;
    if (store_client_compare_set(st->oob, st->failed_key, NULL, 0, mine, strlen(mine), &won, &wl) != 0) {
        free(won);
        return rc; /* the store is gone too: keep what we saw */
    }
    bool ours = won && wl == strlen(mine) && memcmp(won, mine, wl) == 0;
    int other = -1, off = 0;
    if (!ours && won && sscanf(won, "rank %d: %n", &other, &off) == 1 && off > 0 && other != st->rank &&
        (rc == FSDP_ECLOSED || rc == FSDP_EIO))
        error_set(rc, "rank %d failed first: %s", other, (char *)won + off);
    free(won);
    return rc;
}

/* A failure on a leader's TCP step must release the ranks of its host waiting in the segment. */
static int leader_failed(struct cpu_state *st, int rc)
{
    rc = resolve_failure(st, rc);
    if (st->shm) {
        char why[480];
        snprintf(why, sizeof(why), "%s", error_message());
        shm_abort(st->shm, why);
        error_set(rc, "%s", why);
    }
    return rc;
}

static void chunk_of(size_t n, int parts, int i, size_t *lo, size_t *len)
{
    size_t base = n / (size_t)parts, rem = n % (size_t)parts, ui = (size_t)i;
    *lo = ui * base + (ui < rem ? ui : rem);
    *len = base + (ui < rem ? 1 : 0);
}

/* Leaders only: buf (n elements, already this host's sum) becomes the sum over hosts. */
static int leaders_all_reduce(struct cpu_state *st, void *buf, size_t n, enum dtype dt, enum comm_op op,
                              int divisor, double deadline)
{
    size_t es = dtype_size(dt), mylo, mylen;
    int H = st->nhosts, me = st->host;
    chunk_of(n, H, me, &mylo, &mylen);
    unsigned char *tmp = scratch(st, mylen * es * (size_t)H + 1);
    if (!tmp)
        return error_set(FSDP_ENOMEM, "comm cpu: out of memory for %zu bytes", mylen * es * (size_t)H);
    struct tcp_xfer x[CPU_MAX_HOSTS];
    int nx = 0;
    for (int h = 0; h < H; h++) {
        if (h == me)
            continue;
        size_t lo, len;
        chunk_of(n, H, h, &lo, &len);
        x[nx++] = (struct tcp_xfer){.peer = st->leader[h], .sbuf = (unsigned char *)buf + lo * es,
                                    .slen = len * es, .rbuf = tmp + (size_t)h * mylen * es, .rlen = mylen * es};
    }
    FSDP_TRY(tcp_exchange(st->tcp, x, nx, deadline));
    const void *srcs[CPU_MAX_HOSTS];
    for (int h = 0; h < H; h++)
        srcs[h] = h == me ? (unsigned char *)buf + mylo * es : tmp + (size_t)h * mylen * es;
    comm_reduce_arrays(dt, op, srcs, H, (unsigned char *)buf + mylo * es, mylen, divisor);
    nx = 0;
    for (int h = 0; h < H; h++) {
        if (h == me)
            continue;
        size_t lo, len;
        chunk_of(n, H, h, &lo, &len);
        x[nx++] = (struct tcp_xfer){.peer = st->leader[h], .sbuf = (unsigned char *)buf + mylo * es,
                                    .slen = mylen * es, .rbuf = (unsigned char *)buf + lo * es, .rlen = len * es};
    }
    return tcp_exchange(st->tcp, x, nx, deadline);
}

static int cpu_all_reduce(struct cpu_state *st, const void *in, void *out, size_t n, enum dtype dt,
                          enum comm_op op, double deadline)
{
    int divisor = op == COMM_AVG ? st->size : 1;
    enum comm_op base = op == COMM_AVG ? COMM_SUM : op;
    size_t bytes = n * dtype_size(dt);
    if (st->nhosts == 1)
        return shm_all_reduce(st->shm, in, out, n, dt, base, divisor, deadline);
    if (st->shm)
        FSDP_TRY(shm_all_reduce(st->shm, in, out, n, dt, base, 1, deadline));
    else if (in != out && bytes)
        memcpy(out, in, bytes);
    int rc;
    if (st->local_rank == 0 && (rc = leaders_all_reduce(st, out, n, dt, base, divisor, deadline)) != 0)
        return leader_failed(st, rc);
    return st->shm ? shm_broadcast(st->shm, out, bytes, 0, deadline) : 0;
}

static int cpu_all_gather(struct cpu_state *st, const void *in, void *out, size_t count, enum dtype dt,
                          double deadline)
{
    size_t bpr = count * dtype_size(dt);
    if (st->nhosts == 1)
        return shm_all_gather(st->shm, in, out, bpr, deadline);
    size_t total = bpr * (size_t)st->size;
    unsigned char *tmp = scratch(st, total + 1);
    if (!tmp)
        return error_set(FSDP_ENOMEM, "comm cpu: out of memory for %zu bytes", total);
    int rc = 0;
    /* tmp holds the blocks host by host (each host's ranks in rank order); then they go to their ranks. */
    size_t *host_off = calloc((size_t)st->nhosts, sizeof(size_t));
    if (!host_off)
        return error_set(FSDP_ENOMEM, "comm cpu: out of memory");
    for (int h = 1; h < st->nhosts; h++)
        host_off[h] = host_off[h - 1] + (size_t)st->local_count[h - 1] * bpr;
    unsigned char *mine = tmp + host_off[st->host];
    if (st->shm)
        FSDP_TRY_GOTO(shm_all_gather(st->shm, in, mine, bpr, deadline), rc, out);
    else
        memmove(mine, in, bpr);
    if (st->local_rank == 0) {
        struct tcp_xfer x[CPU_MAX_HOSTS];
        int nx = 0;
        for (int h = 0; h < st->nhosts; h++)
            if (h != st->host)
                x[nx++] = (struct tcp_xfer){.peer = st->leader[h], .sbuf = mine,
                                            .slen = (size_t)st->nlocal * bpr, .rbuf = tmp + host_off[h],
                                            .rlen = (size_t)st->local_count[h] * bpr};
        if ((rc = tcp_exchange(st->tcp, x, nx, deadline)) != 0) {
            rc = leader_failed(st, rc);
            goto out;
        }
        size_t *seen = calloc((size_t)st->nhosts, sizeof(size_t));
        if (!seen) {
            rc = error_set(FSDP_ENOMEM, "comm cpu: out of memory");
            goto out;
        }
        for (int r = 0; r < st->size; r++) {
            int h = st->host_of[r];
            memcpy((unsigned char *)out + (size_t)r * bpr, tmp + host_off[h] + seen[h]++ * bpr, bpr);
        }
        free(seen);
    }
out:
    free(host_off);
    if (rc)
        return rc;
    return st->shm ? shm_broadcast(st->shm, out, total, 0, deadline) : 0;
}

static int cpu_reduce_scatter(struct cpu_state *st, const void *in, void *out, size_t count,
                              enum dtype dt, enum comm_op op, double deadline)
{
    if (st->nhosts == 1) {
        int divisor = op == COMM_AVG ? st->size : 1;
        return shm_reduce_scatter(st->shm, in, out, count, dt, op == COMM_AVG ? COMM_SUM : op, divisor,
                                  deadline);
    }
    /* Across hosts: each host's sum of the whole buffer meets the other hosts' at the leaders, but leader h
     * receives only the blocks of its own ranks (and sends each other leader only theirs): every link
     * carries the receiving host's share of the buffer once, half of what an all-reduce moves, and no
     * host ever holds the whole result. The host's blocks then go to its ranks through the segment. The
     * sum is in host order, each host's in rank order: bitwise the block an all-reduce gives. */
    int divisor = op == COMM_AVG ? st->size : 1;
    enum comm_op base = op == COMM_AVG ? COMM_SUM : op;
    size_t es = dtype_size(dt), blk = count * es, n = count * (size_t)st->size;
    int H = st->nhosts, me = st->host, L = st->nlocal;
    /* scratch: [host sum of the buffer, only with a segment] [blocks sent, packed per host]
     *          [blocks received, L per other host] [this host's results, L blocks] */
    size_t off_send = st->shm ? n * es : 0, off_recv = off_send + (size_t)(st->size - L) * blk;
    size_t off_mine = off_recv + (size_t)(H - 1) * (size_t)L * blk;
    unsigned char *tmp = scratch(st, off_mine + (size_t)L * blk + 1);
    if (!tmp)
        return error_set(FSDP_ENOMEM, "comm cpu: out of memory for %zu bytes", off_mine + (size_t)L * blk);
    const unsigned char *hsum = in;
    int rc = 0;
    if (st->shm) {
        FSDP_TRY(shm_all_reduce(st->shm, in, tmp, n, dt, base, 1, deadline));
        hsum = tmp;
    }
    if (st->local_rank == 0) {
        struct tcp_xfer x[CPU_MAX_HOSTS];
        int nx = 0;
        size_t so = 0, ro = 0;
        for (int g = 0; g < H; g++) {
            if (g == me)
                continue;
            unsigned char *sb = tmp + off_send + so;
            size_t k = 0;
            for (int r = 0; r < st->size; r++)
                if (st->host_of[r] == g)
                    memcpy(sb + k++ * blk, hsum + (size_t)r * blk, blk);
            x[nx++] = (struct tcp_xfer){.peer = st->leader[g], .sbuf = sb, .slen = k * blk,
                                        .rbuf = tmp + off_recv + ro, .rlen = (size_t)L * blk};
            so += k * blk;
            ro += (size_t)L * blk;
        }
        if ((rc = tcp_exchange(st->tcp, x, nx, deadline)) != 0)
            return leader_failed(st, rc);
        const void *srcs[CPU_MAX_HOSTS];
        for (int i = 0; i < L; i++) {
            for (int g = 0; g < H; g++)
                srcs[g] = g == me ? hsum + (size_t)st->locals[i] * blk
                                  : tmp + off_recv + ((size_t)(g < me ? g : g - 1) * (size_t)L + (size_t)i) * blk;
            comm_reduce_arrays(dt, base, srcs, H, tmp + off_mine + (size_t)i * blk, count, divisor);
        }
    }
    if (st->shm)
        FSDP_TRY(shm_broadcast(st->shm, tmp + off_mine, (size_t)L * blk, 0, deadline));
    memcpy(out, tmp + off_mine + (size_t)st->local_rank * blk, blk);
    return 0;
}

static int cpu_broadcast(struct cpu_state *st, void *buf, size_t bytes, int root, double deadline)
{
    if (st->nhosts == 1)
        return shm_broadcast(st->shm, buf, bytes, root, deadline);
    int rh = st->host_of[root], rc;
    if (st->host == rh && st->shm) {
        int lr = 0;
        while (st->locals[lr] != root)
            lr++;
        FSDP_TRY(shm_broadcast(st->shm, buf, bytes, lr, deadline));
    }
    if (st->local_rank == 0) {
        struct tcp_xfer x[CPU_MAX_HOSTS];
        int nx = 0;
        if (st->host == rh) {
            for (int h = 0; h < st->nhosts; h++)
                if (h != rh)
                    x[nx++] = (struct tcp_xfer){.peer = st->leader[h], .sbuf = buf, .slen = bytes};
        } else {
            x[nx++] = (struct tcp_xfer){.peer = st->leader[rh], .rbuf = buf, .rlen = bytes};
        }
        if ((rc = tcp_exchange(st->tcp, x, nx, deadline)) != 0)
            return leader_failed(st, rc);
    }
    if (st->host != rh && st->shm)
        return shm_broadcast(st->shm, buf, bytes, 0, deadline);
    return 0;
}

static int cpu_barrier(struct cpu_state *st, double deadline)
{
    if (st->shm)
        FSDP_TRY(shm_barrier(st->shm, deadline));
    if (st->nhosts == 1)
        return 0;
    if (st->local_rank == 0) {
        unsigned char one = 1, got[CPU_MAX_HOSTS];
        struct tcp_xfer x[CPU_MAX_HOSTS];
        int nx = 0;
        for (int h = 0; h < st->nhosts; h++)
            if (h != st->host)
                x[nx] = (struct tcp_xfer){.peer = st->leader[h], .sbuf = &one, .slen = 1, .rbuf = &got[nx],
                                          .rlen = 1}, nx++;
        int rc;
        if ((rc = tcp_exchange(st->tcp, x, nx, deadline)) != 0)
            return leader_failed(st, rc);
    }
    return st->shm ? shm_barrier(st->shm, deadline) : 0;
}

static int cpu_dispatch(struct cpu_state *st, const struct comm_req *q);

/* A batch of sends and receives over TCP in rounds: round k moves, for every peer at once, this rank's k-th
 * send to it and its k-th receive from it (one connection carries one stream each way, so two transfers
 * on it must not interleave). The peer's k-th receive from this rank is its own round k, so every round is
 * matched on both sides and completes as one exchange. */
static int cpu_sendrecv(struct cpu_state *st, const struct comm_p2p *ops, int n, double deadline)
{
    enum { MAXX = COMM_P2P_MAX };
    bool used[MAXX] = {false};
    int left = n;
    while (left > 0) {
        struct tcp_xfer x[MAXX];
        int nx = 0;
        for (int i = 0; i < n; i++) {
            if (used[i])
                continue;
            const struct comm_p2p *o = &ops[i];
            int at = -1;
            for (int k = 0; k < nx; k++)
                if (x[k].peer == o->peer)
                    at = k;
            bool send = o->kind == COMM_P2P_SEND;
            if (at >= 0 && (send ? x[at].sbuf != NULL : x[at].rbuf != NULL))
                continue; /* this peer already has a transfer of that direction in the round */
            if (at < 0)
                x[at = nx++] = (struct tcp_xfer){.peer = o->peer};
            size_t bytes = o->count * dtype_size(o->dtype);
            if (send) {
                x[at].sbuf = o->buf;
                x[at].slen = bytes;
            } else {
                x[at].rbuf = o->buf;
                x[at].rlen = bytes;
            }
            used[i] = true;
            left--;
        }
        FSDP_TRY(tcp_exchange(st->tcp, x, nx, deadline));
    }
    return 0;
}

/* Every pair of ranks swaps its blocks over the TCP mesh in one exchange; the own block is a copy. */
static int cpu_all_to_all(struct cpu_state *st, const void *in, void *out, size_t blk, double deadline)
{
    struct tcp_xfer *x = calloc((size_t)st->size, sizeof *x);
    if (!x)
        return error_set(FSDP_ENOMEM, "all_to_all: out of memory for %d transfers", st->size);
    int nx = 0;
    for (int p = 0; p < st->size; p++) {
        if (p == st->rank)
            continue;
        x[nx++] = (struct tcp_xfer){.peer = p, .sbuf = (const char *)in + (size_t)p * blk, .slen = blk,
                                    .rbuf = (char *)out + (size_t)p * blk, .rlen = blk};
    }
    memcpy((char *)out + (size_t)st->rank * blk, (const char *)in + (size_t)st->rank * blk, blk);
    int rc = blk ? tcp_exchange(st->tcp, x, nx, deadline) : 0;
    free(x);
    return rc;
}

static int cpu_run(void *state, const struct comm_req *q)
{
    struct cpu_state *st = state;
    int rc = cpu_dispatch(st, q);
    return rc && rc != FSDP_EINVAL ? resolve_failure(st, rc) : rc;
}

static int cpu_dispatch(struct cpu_state *st, const struct comm_req *q)
{
    size_t es = dtype_size(q->dtype);
    if (st->size == 1) {
        /* Alone: collectives are copies (or, for AVG over one rank, exact copies too). */
        if (q->kind == COMM_K_SEND || q->kind == COMM_K_RECV)
            return error_set(FSDP_EINVAL, "send/recv to rank %d in a group of one", q->peer);
        if (q->kind == COMM_K_SENDRECV) /* check_p2p let no peer through: the batch is empty */
            return 0;
        if ((q->kind == COMM_K_ALL_GATHER || q->kind == COMM_K_REDUCE_SCATTER || q->kind == COMM_K_ALL_REDUCE ||
             q->kind == COMM_K_ALL_TO_ALL) &&
            q->in != q->out && q->count)
            memmove(q->out, q->in, q->count * es);
        return 0;
    }
    switch (q->kind) {
    case COMM_K_ALL_GATHER:
        return cpu_all_gather(st, q->in, q->out, q->count, q->dtype, q->deadline);
    case COMM_K_REDUCE_SCATTER:
        return cpu_reduce_scatter(st, q->in, q->out, q->count, q->dtype, q->op, q->deadline);
    case COMM_K_ALL_REDUCE:
        return cpu_all_reduce(st, q->in, q->out, q->count, q->dtype, q->op, q->deadline);
    case COMM_K_BROADCAST:
        return cpu_broadcast(st, q->out, q->count * es, q->peer, q->deadline);
    case COMM_K_BARRIER:
        return cpu_barrier(st, q->deadline);
    case COMM_K_SEND: {
        struct tcp_xfer x = {.peer = q->peer, .sbuf = q->in, .slen = q->count * es};
        return tcp_exchange(st->tcp, &x, 1, q->deadline);
    }
    case COMM_K_RECV: {
        struct tcp_xfer x = {.peer = q->peer, .rbuf = q->out, .rlen = q->count * es};
        return tcp_exchange(st->tcp, &x, 1, q->deadline);
    }
    case COMM_K_ALL_TO_ALL:
        return cpu_all_to_all(st, q->in, q->out, q->count * es, q->deadline);
    case COMM_K_SENDRECV:
        return cpu_sendrecv(st, q->p2p, q->np2p, q->deadline);
    case COMM_K_SPLIT: /* the core's own steps never reach run() */
    case COMM_K_INIT:
    case COMM_K_FINI:
    case COMM_K_MEM_ALLOC:
    case COMM_K_MEM_FREE:
        break;
    }
    return error_set(FSDP_EINVAL, "unknown operation %d", (int)q->kind);
}

static void *cpu_mem_alloc(void *state, size_t bytes)
{
    (void)state; /* the registry is per process: children of comm_split see the same buffers */
    return comm_mem_shared_alloc(bytes);
}

static int cpu_mem_free(void *state, void *p)
{
    (void)state;
    return comm_mem_shared_free(p);
}

/* No split hook: a child's shared-memory and TCP links are made by cpu_init like any group's, after the
 * core agreed the membership through the store. */
static const struct comm_backend cpu_backend = {
    .name = "cpu", .init = cpu_init, .run = cpu_run, .fini = cpu_fini, .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free, .split = NULL};

const struct comm_backend *comm_backend_cpu(void)
{
    return &cpu_backend;
}
