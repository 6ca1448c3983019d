/* Shared-memory collectives between the ranks of one host.
 *
 * Segment: a control page (futex barrier, abort flag + message, pids, per-rank arrival epochs) then two
 * banks of n slots. A collective moves its buffers in pieces of at most one slot per rank; the banks
 * alternate between pieces, so one piece's readers never race the next piece's writers and most pieces
 * need a single barrier. Every wait is a futex wait in the kernel with a short timeout slice, after which
 * the waiter checks the deadline, the abort flag and whether the missing peers are still alive: a dead
 * rank is reported within a slice, a stuck one at the deadline.
 *
 * Registered buffers (comm_mem_alloc, comm_mem.h): at the first barrier of every operation each rank has
 * published where its buffers live (memfd, allocation id, offset) in the control page, for the bank of
 * the operation's first piece. When every rank's buffers are registered, peers map each other's buffers
 * (cached per peer) and the data moves with one copy, straight from a peer's buffer into the reader's
 * (see the direct_* functions); otherwise it moves through the slots in pieces. Ranks that hoped for the direct
 * path stage their first piece only once they know the group is mixed, then all sync once more. A reader
 * maps a peer's pages only while it reads them and the next operation reads the same ranges (faulted in
 * by the read, dropped by the first operation that does not read them again), since every page mapped
 * here counts in this process's RSS as users measure it (peer_span_keep, peer_spans_retire). */
#include "comm/comm_shm.h"
#include "common/clock.h"
#include "comm/comm_internal.h"
#include "comm/comm_mem.h"
#include "common/error.h"
#include "common/log.h"
#include "common/settings.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SLICE_S 0.1
#define PEER_MAPS 16 /* cached mappings of one peer's registered buffers */
#define KEPT_MAX 64  /* peer spans one operation may leave mapped (more are dropped at once) */

/* Where one rank's buffer of the current operation lives (comm_mem_ref, as a peer needs it). */
struct shm_buf {
    int32_t fd;
    uint32_t pad;
    uint64_t id, map_bytes, off;
};

struct shm_desc {
    uint32_t valid; /* this rank's buffers are all registered */
    uint32_t pad;
    uint64_t frees; /* comm_mem_free_count() of the owner: peers drop stale mappings when it moves */
    struct shm_buf in, out;
};

struct shm_ctrl {
    _Atomic uint32_t release; /* futex word: epoch of the last completed barrier */
    _Atomic uint32_t aborted;
    _Atomic uint64_t count; /* total arrivals; the last arrival of epoch e makes it e * n */
    int32_t abort_rank;
    uint32_t abort_epoch; /* the aborting rank's barrier epoch: barriers before it completed for everyone */
    uint32_t n;
    uint64_t slot_bytes;
    char abort_msg[480];
    int32_t pid[SHM_MAX_LOCAL];
    _Atomic uint32_t arrive[SHM_MAX_LOCAL]; /* epoch each rank last arrived at */
    int32_t seg_fd;                          /* the creator's fd of this segment, for the probe */
    uint32_t probe[SHM_MAX_LOCAL];           /* 1: this rank can map peers' memory by /proc/<pid>/fd */
    struct shm_desc desc[2][SHM_MAX_LOCAL];  /* per bank of an operation's first piece */
};

struct peer_map {
    uint64_t id;
    unsigned char *base;
    size_t bytes;
};

struct peer_cache {
    uint64_t frees;
    int n, next;
    struct peer_map m[PEER_MAPS];
};

/* Which peer pages a reader keeps mapped after reading them (FSDP_COMM_SHM_KEEP_PEER_PAGES). */
enum peer_pages {
    PEER_PAGES_LAST, /* what the latest operation read: repeated operations on the same buffers fault nothing */
    PEER_PAGES_NONE, /* nothing: dropped right after each read */
    PEER_PAGES_ALL,  /* everything ever read */
};

/* A peer range an operation read, widened to whole fault-around windows; identified by the mapping it
 * lies in, so that a span whose mapping was replaced since is never dropped (its address may be reused). */
struct kept_span {
    int q, slot;
    const unsigned char *base;
    uintptr_t lo, hi;
};

struct shm_group {
    struct shm_ctrl *ctrl;
    unsigned char *data;
    size_t map_bytes, slot;
    int n, me;
    uint32_t epoch;
    int bank;
    int seg_fd; /* creator only: kept open so peers can probe /proc/<pid>/fd */
    bool direct;
    enum peer_pages peer_pages;
    struct kept_span kept_prev[KEPT_MAX], kept_cur[KEPT_MAX]; /* the previous and the current operation's */
    int nkept_prev, nkept_cur;
    size_t page;
    struct peer_cache *peers; /* [n] */
    int global[SHM_MAX_LOCAL];
};

static size_t ctrl_bytes(void)
{
    return (sizeof(struct shm_ctrl) + 4095) & ~(size_t)4095;
}

size_t shm_segment_bytes(int n, size_t slot_bytes)
{
    return ctrl_bytes() + 2 * (size_t)n * slot_bytes;
}

static int peer_pages_from_env(enum peer_pages *out)
{
    int v = 0;
    int rc = settings_get_enum(SETTING_COMM_SHM_KEEP_PEER_PAGES, &v);
    const char *name = settings_entry(SETTING_COMM_SHM_KEEP_PEER_PAGES)->values[v].name;
    *out = strcmp(name, "0") == 0 ? PEER_PAGES_NONE : strcmp(name, "1") == 0 ? PEER_PAGES_ALL : PEER_PAGES_LAST;
    return rc;
}

int shm_check_env(void)
{
    enum peer_pages unused;
    return peer_pages_from_env(&unused);
}

int shm_sweep_stale(const char *prefix)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    int removed = 0;
    size_t plen = strlen(prefix);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, plen) != 0)
            continue;
        const char *dash = strrchr(e->d_name, '-');
        char *end;
        long pid = dash ? strtol(dash + 1, &end, 10) : 0;
        if (!dash || dash[1] < '0' || dash[1] > '9' || *end || pid <= 1 || pid > INT_MAX)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
            st.st_uid != geteuid())
            continue;
        /* EPERM means the pid lives (another user's process): only ESRCH is a dead leader. */
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char name[NAME_MAX + 2];
        snprintf(name, sizeof(name), "/%s", e->d_name);
        if (shm_unlink(name) == 0) {
            log_debug("shm: removed %s, left behind by pid %ld, which no longer exists", name, pid);
            removed++;
        }
    }
    closedir(d);
    return removed;
}

int shm_group_attach(const char *name, bool create, int local_rank, int n, const int *global_ranks,
                     size_t slot_bytes, struct shm_group **out)
{
    *out = NULL;
    if (n < 1 || n > SHM_MAX_LOCAL || local_rank < 0 || local_rank >= n)
        return error_set(FSDP_EINVAL, "shm: %d ranks on one host (at most %d), local rank %d", n, SHM_MAX_LOCAL,
                         local_rank);
    enum peer_pages pages;
    FSDP_TRY(peer_pages_from_env(&pages));
    size_t bytes = shm_segment_bytes(n, slot_bytes);
    int fd = shm_open(name, create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
    if (fd < 0)
        return error_set(errno == EEXIST ? FSDP_EEXIST : FSDP_EIO, "shm: shm_open(%s) failed: %s", name,
                         strerror(errno));
    void *p = MAP_FAILED;
    struct shm_group *g = NULL;
    struct peer_cache *pc = NULL;
    int rc = 0;
    if (create && ftruncate(fd, (off_t)bytes) != 0) {
        rc = error_set(FSDP_EIO, "shm: cannot size %s to %zu bytes: %s (is /dev/shm full?)", name, bytes,
                       strerror(errno));
        shm_unlink(name);
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < bytes) {
        rc = error_set(FSDP_EPROTO, "shm: segment %s is smaller than the %zu bytes expected", name, bytes);
        goto fail;
    }
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    if (!create || p == MAP_FAILED) {
        close(fd);
        fd = -1;
    }
    if (p == MAP_FAILED) {
        rc = error_set(FSDP_ENOMEM, "shm: mmap of %zu bytes failed: %s", bytes, strerror(e));
        goto fail;
    }
    g = calloc(1, sizeof(*g));
    pc = calloc((size_t)n, sizeof(*pc));
    if (!g || !pc) {
        rc = error_set(FSDP_ENOMEM, "shm: out of memory");
        goto fail;
    }
    g->seg_fd = fd;
    g->peers = pc;
    g->page = (size_t)sysconf(_SC_PAGESIZE);
    g->peer_pages = pages;
    g->ctrl = p;
    g->data = (unsigned char *)p + ctrl_bytes();
    g->map_bytes = bytes;
    g->slot = slot_bytes;
    g->n = n;
    g->me = local_rank;
    for (int i = 0; i < n; i++)
        g->global[i] = global_ranks ? global_ranks[i] : i;
    /* The creator's ftruncate zeroed the segment, so the control words start at epoch 0. */
    g->ctrl->pid[local_rank] = (int32_t)getpid();
    if (create) {
        g->ctrl->n = (uint32_t)n;
        g->ctrl->slot_bytes = slot_bytes;
        g->ctrl->seg_fd = fd;
    }
    /* Can this rank map a peer's memfd? The creator's segment fd stands in for one. FSDP_COMM_SHM_DIRECT=0
     * votes no, so every rank agrees on the path even if only some ranks set it. */
    bool ok = settings_bool(SETTING_COMM_SHM_DIRECT);
    if (ok && !create) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)g->ctrl->pid[0], (int)g->ctrl->seg_fd);
        int pfd = open(path, O_RDONLY | O_CLOEXEC);
        if (pfd < 0)
            log_info("shm: rank %d cannot open %s (%s): registered buffers take the staged path",
                     g->global[local_rank], path, strerror(errno));
        else
            close(pfd);
        ok = pfd >= 0;
    }
    g->ctrl->probe[local_rank] = ok ? 1 : 2;
    *out = g;
    return 0;
fail:
    free(g);
    free(pc);
    if (p != MAP_FAILED)
        munmap(p, bytes);
    if (fd >= 0)
        close(fd);
    return rc;
}

void shm_group_ready(struct shm_group *g)
{
    g->direct = true;
    for (int i = 0; i < g->n; i++)
        g->direct = g->direct && g->ctrl->probe[i] == 1;
}

static void peer_drop_all(struct peer_cache *pc)
{
    for (int i = 0; i < pc->n; i++)
        munmap(pc->m[i].base, pc->m[i].bytes);
    pc->n = pc->next = 0;
}

void shm_group_detach(struct shm_group *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n; i++)
        peer_drop_all(&g->peers[i]);
    free(g->peers);
    if (g->seg_fd >= 0)
        close(g->seg_fd);
    munmap(g->ctrl, g->map_bytes);
    free(g);
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

/* A zombie still answers kill(pid, 0), and a killed rank stays one until its parent reaps it: read the
 * state from /proc instead. */
static bool pid_dead(int pid)
{
    if (pid <= 0)
        return false; /* not attached yet: the deadline covers it */
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) /* gone; any other failure (no fd left, no memory) proves nothing, and the deadline covers it */
        return errno == ENOENT || errno == ESRCH;
    size_t len = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[len] = 0;
    char *rp = strrchr(buf, ')');
    if (!rp || rp[1] != ' ')
        return false;
    return rp[2] == 'Z' || rp[2] == 'X';
}

void shm_abort(struct shm_group *g, const char *why)
{
    uint32_t zero = 0;
    if (atomic_compare_exchange_strong(&g->ctrl->aborted, &zero, 2)) {
        g->ctrl->abort_rank = g->global[g->me];
        g->ctrl->abort_epoch = g->epoch;
        snprintf(g->ctrl->abort_msg, sizeof(g->ctrl->abort_msg), "%s", why);
        atomic_store(&g->ctrl->aborted, 1);
    }
    futex(&g->ctrl->release, FUTEX_WAKE, INT_MAX, NULL);
}

static int fail_aborted(struct shm_group *g)
{
    return error_set(FSDP_EABORTED, "rank %d failed first: %s", g->ctrl->abort_rank, g->ctrl->abort_msg);
}

static _Atomic uint64_t barriers_entered;

uint64_t shm_barrier_count(void)
{
    return atomic_load(&barriers_entered);
}

int shm_barrier(struct shm_group *g, double deadline)
{
    struct shm_ctrl *c = g->ctrl;
    uint32_t e = ++g->epoch;
    atomic_fetch_add_explicit(&barriers_entered, 1, memory_order_relaxed);
    atomic_store(&c->arrive[g->me], e);
    uint64_t total = atomic_fetch_add(&c->count, 1) + 1;
    if (total == (uint64_t)e * (uint64_t)g->n) {
        atomic_store(&c->release, e);
        futex(&c->release, FUTEX_WAKE, INT_MAX, NULL);
        /* Everyone arrived, so this barrier completed; an abort counts only if it was raised in this barrier
         * or earlier. A peer released here may already have failed in a later one (its next op found the
         * rank that died right after this barrier), and that must not fail an operation that finished. */
        return atomic_load(&c->aborted) == 1 && (int32_t)(c->abort_epoch - e) <= 0 ? fail_aborted(g) : 0;
    }
    for (;;) {
        uint32_t v = atomic_load(&c->release);
        if ((int32_t)(v - e) >= 0)
            return 0;
        if (atomic_load(&c->aborted) == 1) {
            /* the release may have landed between the two loads */
            if ((int32_t)(atomic_load(&c->release) - e) >= 0)
                return 0;
            return fail_aborted(g);
        }
        char missing[256] = "";
        size_t mlen = 0;
        int dead = -1, nmissing = 0;
        for (int i = 0; i < g->n; i++) {
            if ((int32_t)(atomic_load(&c->arrive[i]) - e) >= 0)
                continue;
            /* Read arrive[i] again after seeing the process gone: a peer may arrive, complete this barrier
             * as its last arriver and exit between the first read and pid_dead (the end of a job does exactly
             * that); only a peer that is gone and still has not arrived never will. */
            if (dead < 0 && pid_dead(c->pid[i]) && (int32_t)(atomic_load(&c->arrive[i]) - e) < 0)
                dead = i;
            nmissing++;
            if (mlen < sizeof(missing) - 16)
                mlen += (size_t)snprintf(missing + mlen, sizeof(missing) - mlen, "%s%d", mlen ? ", " : "",
                                         g->global[i]);
        }
        if (dead >= 0) {
            /* The barrier numbers tell a rank that died before this barrier (it last arrived at the one
             * before) from ranks that disagree on how many barriers an operation takes (any other gap). */
            char why[240];
            snprintf(why, sizeof(why),
                     "rank %d (pid %d) died (its process is gone or a zombie) before shared-memory barrier %u "
                     "(it last arrived at %u)",
                     g->global[dead], c->pid[dead], e, (unsigned)atomic_load(&c->arrive[dead]));
            shm_abort(g, why);
            return error_set(FSDP_ECLOSED, "%s; look at that rank's log and exit status for the cause", why);
        }
        double now = clock_now_s();
        if (now >= deadline) {
            char why[400];
            snprintf(why, sizeof(why), "rank%s %s did not arrive at the shared-memory barrier in time",
                     nmissing > 1 ? "s" : "", missing);
            shm_abort(g, why);
            return error_set(FSDP_ETIMEDOUT,
                             "%s; check whether they are stuck or slow, or raise FSDP_COMM_TIMEOUT_S", why);
        }
        double w = deadline - now < SLICE_S ? deadline - now : SLICE_S;
        struct timespec ts = {.tv_sec = (time_t)w, .tv_nsec = (long)((w - (double)(time_t)w) * 1e9)};
        futex(&c->release, FUTEX_WAIT, v, &ts);
    }
}

static unsigned char *slot(struct shm_group *g, int bank, int r)
{
    return g->data + ((size_t)bank * (size_t)g->n + (size_t)r) * g->slot;
}

/* Rank q's share [*lo, *hi) of p elements, as even as possible. */
static void share(size_t p, int n, int q, size_t *lo, size_t *hi)
{
    size_t base = p / (size_t)n, rem = p % (size_t)n, uq = (size_t)q;
    *lo = uq * base + (uq < rem ? uq : rem);
    *hi = *lo + base + (uq < rem ? 1 : 0);
}

static int next_bank(struct shm_group *g)
{
    int b = g->bank;
    g->bank ^= 1;
    return b;
}

static void buf_of(const struct comm_mem_ref *r, struct shm_buf *b)
{
    *b = (struct shm_buf){.fd = r->fd, .id = r->id, .map_bytes = r->map_bytes, .off = r->off};
}

/* Publishes this rank's buffers for the operation starting on bank b; true when they are all registered
 * (out NULL: only in matters). */
static bool publish(struct shm_group *g, int b, const void *in, size_t in_bytes, const void *out,
                    size_t out_bytes)
{
    struct shm_desc *d = &g->ctrl->desc[b][g->me];
    d->valid = 0;
    struct comm_mem_ref ri, ro;
    if (!g->direct || !comm_mem_lookup(in, in_bytes, &ri) || (out && !comm_mem_lookup(out, out_bytes, &ro)))
        return false;
    buf_of(&ri, &d->in);
    if (out)
        buf_of(&ro, &d->out);
    d->frees = comm_mem_free_count();
    d->valid = 1;
    return true;
}

static int count_valid(struct shm_group *g, int b)
{
    int k = 0;
    for (int i = 0; i < g->n; i++)
        k += g->ctrl->desc[b][i].valid == 1;
    return k;
}

/* Dropping a range of a peer mapping: this process's page table entries for it go, so that its RSS
 * (VmRSS, RssShmem, VmHWM, what top and sacct report) stops counting those pages. On a MAP_SHARED mapping
 * of a memfd MADV_DONTNEED only unmaps: the data stays in the owner's memfd, the next read maps the same
 * pages again, and concurrent readers of the range (another thread, another rank) are unaffected. The
 * mapping itself stays cached: mmap, and opening /proc/<pid>/fd, cost more. */
static void peer_range_drop(uintptr_t lo, uintptr_t hi)
{
    if (hi <= lo)
        return;
    if (madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0) {
        static _Atomic bool warned;
        if (!atomic_exchange(&warned, true))
            log_warn("shm: madvise(MADV_DONTNEED) of a peer's buffer failed (%s): peers' pages stay in this "
                     "rank's RSS (the data is not copied; only the accounting shows it twice)",
                     strerror(errno));
    }
}

/* After reading a peer range. Faulting pages in and dropping them again costs up to half of a copy's
 * bandwidth; an operation repeated on the same buffers (a benchmark, a loop over one bucket) need not pay
 * it every time, while a stream of operations on different buffers (FSDP's units) pays it anyway. So by
 * default the pages read stay mapped until an operation reads other ranges (peer_spans_retire): a rank's
 * RSS then counts at most two operations' worth of its peers' pages, the size of the largest collective
 * rather than of the peers' whole arenas. */
static void peer_span_keep(struct shm_group *g, const void *p, size_t len)
{
    if (g->peer_pages == PEER_PAGES_ALL || len == 0)
        return;
    /* A read fault on a shared file mapping also maps the neighbours already in the page cache
     * (fault-around: the aligned 64 KiB window by default), so dropping only the pages read left up to 15
     * pages past either end mapped: 8.4 MiB of each peer's arena after a step of a 144-unit model. So the
     * span is widened to that window (page-aligned too), clamped to the mapping it lies in. */
    const uintptr_t window = 64 << 10;
    uintptr_t lo = (uintptr_t)p & ~(window - 1), hi = ((uintptr_t)p + len + window - 1) & ~(window - 1);
    for (int q = 0; q < g->n; q++)
        for (int i = 0; i < g->peers[q].n; i++) {
            const struct peer_map *m = &g->peers[q].m[i];
            uintptr_t mb = (uintptr_t)m->base, me = mb + ((m->bytes + g->page - 1) & ~(uintptr_t)(g->page - 1));
            if ((uintptr_t)p < mb || (uintptr_t)p >= me)
                continue;
            lo = lo < mb ? mb : lo;
            hi = hi > me ? me : hi;
            if (g->peer_pages == PEER_PAGES_NONE) {
                peer_range_drop(lo, hi);
                return;
            }
            for (int j = 0; j < g->nkept_cur; j++) { /* extend an overlapping or touching span */
                struct kept_span *k = &g->kept_cur[j];
                if (k->q == q && k->slot == i && k->base == m->base && lo <= k->hi && k->lo <= hi) {
                    k->lo = lo < k->lo ? lo : k->lo;
                    k->hi = hi > k->hi ? hi : k->hi;
                    return;
                }
            }
            if (g->nkept_cur == KEPT_MAX) {
                peer_range_drop(lo, hi);
                return;
            }
            g->kept_cur[g->nkept_cur++] = (struct kept_span){.q = q, .slot = i, .base = m->base, .lo = lo, .hi = hi};
            return;
        }
    /* not a peer mapping: nothing of another rank to drop */
}

/* Drops [lo, hi) of the previous operation's span k minus what the current operation's spans (from the
 * j-th on) still cover. */
static void kept_drop_minus(const struct shm_group *g, const struct kept_span *k, uintptr_t lo, uintptr_t hi,
                            int j)
{
    for (; j < g->nkept_cur; j++) {
        const struct kept_span *c = &g->kept_cur[j];
        if (c->q != k->q || c->slot != k->slot || c->base != k->base || c->hi <= lo || hi <= c->lo)
            continue;
        if (c->lo > lo)
            kept_drop_minus(g, k, lo, c->lo, j + 1);
        if (c->hi < hi)
            kept_drop_minus(g, k, c->hi, hi, j + 1);
        return;
    }
    peer_range_drop(lo, hi);
}

/* At the end of an operation: drop what the previous one read and this one did not; this one's spans
 * become the previous. A span whose mapping has been unmapped or replaced since is skipped: its pages are
 * gone with it, and its addresses may now belong to something else. */
static void peer_spans_retire(struct shm_group *g)
{
    if (g->peer_pages != PEER_PAGES_LAST)
        return;
    for (int i = 0; i < g->nkept_prev; i++) {
        const struct kept_span *k = &g->kept_prev[i];
        const struct peer_cache *pc = &g->peers[k->q];
        if (k->slot >= pc->n || pc->m[k->slot].base != k->base)
            continue;
        /* The slot may hold another mapping at the same address by now: stay inside the current one. */
        uintptr_t end = (uintptr_t)k->base + ((pc->m[k->slot].bytes + g->page - 1) & ~(uintptr_t)(g->page - 1));
        kept_drop_minus(g, k, k->lo, k->hi < end ? k->hi : end, 0);
    }
    memcpy(g->kept_prev, g->kept_cur, (size_t)g->nkept_cur * sizeof(g->kept_cur[0]));
    g->nkept_prev = g->nkept_cur;
    g->nkept_cur = 0;
}

/* Peer q's buffer described by sb, mapped read-only into this process (cached by allocation id). A
 * failure aborts the group so the peers do not wait for this rank until the deadline. */
static int peer_ptr(struct shm_group *g, int q, const struct shm_desc *d, const struct shm_buf *sb,
                    const unsigned char **out)
{
    struct peer_cache *pc = &g->peers[q];
    if (pc->frees != d->frees) {
        peer_drop_all(pc);
        pc->frees = d->frees;
    }
    for (int i = 0; i < pc->n; i++)
        if (pc->m[i].id == sb->id) {
            *out = pc->m[i].base + sb->off;
            return 0;
        }
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)g->ctrl->pid[q], (int)sb->fd);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    /* No MAP_POPULATE: the allocation is often the peer's whole persistent arena (its params, grads and
     * optimizer state), and every page mapped here counts in this process's RSS. */
    void *p = fd < 0 ? MAP_FAILED : mmap(NULL, sb->map_bytes, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    if (fd >= 0)
        close(fd);
    if (p == MAP_FAILED) {
        char why[300];
        /* The usual reason is that the owner is dying: its fds close before it turns into a zombie, so
         * give it a moment to finish dying, then say so, as every other wait does. */
        bool dead = pid_dead(g->ctrl->pid[q]);
        for (int k = 0; k < 200 && !dead && e == ENOENT; k++) {
            const struct timespec ms10 = {0, 10 * 1000 * 1000};
            nanosleep(&ms10, NULL);
            dead = pid_dead(g->ctrl->pid[q]);
        }
        if (dead) {
            snprintf(why, sizeof(why), "rank %d (pid %d) died (its process is gone or a zombie)", g->global[q],
                     (int)g->ctrl->pid[q]);
            shm_abort(g, why);
            return error_set(FSDP_ECLOSED, "%s; look at that rank's log and exit status for the cause", why);
        }
        snprintf(why, sizeof(why), "rank %d cannot map rank %d's registered buffer (%s, %llu bytes): %s",
                 g->global[g->me], g->global[q], path, (unsigned long long)sb->map_bytes, strerror(e));
        shm_abort(g, why);
        return error_set(FSDP_EIO, "%s", why);
    }
    int slotno;
    if (pc->n < PEER_MAPS) {
        slotno = pc->n++;
    } else {
        slotno = pc->next;
        munmap(pc->m[slotno].base, pc->m[slotno].bytes);
        pc->next = (slotno + 1) % PEER_MAPS;
    }
    pc->m[slotno] = (struct peer_map){.id = sb->id, .base = p, .bytes = sb->map_bytes};
    *out = (const unsigned char *)p + sb->off;
    return 0;
}

static int peer_in(struct shm_group *g, int b, int q, const unsigned char **out)
{
    const struct shm_desc *d = &g->ctrl->desc[b][q];
    return peer_ptr(g, q, d, &d->in, out);
}

static int peer_out(struct shm_group *g, int b, int q, const unsigned char **out)
{
    const struct shm_desc *d = &g->ctrl->desc[b][q];
    return peer_ptr(g, q, d, &d->out, out);
}

static _Atomic uint64_t direct_ops;

uint64_t shm_direct_count(void)
{
    return atomic_load(&direct_ops);
}

/* ---- one copy: every rank's buffers are registered ----
 * Each ends with a barrier: a rank's buffers must not change (or be freed) while peers still read them. */

static int direct_all_gather(struct shm_group *g, int b, const void *in, void *out, size_t bpr, double deadline)
{
    unsigned char *dst = out;
    unsigned char *own = dst + (size_t)g->me * bpr;
    const unsigned char *src0 = in;
    if (src0 + bpr <= own || own + bpr <= src0)
        comm_copy_stream(own, in, bpr);
    else if (own != src0)
        memmove(own, in, bpr);
    /* Start with the next rank so that ranks do not all read the same peer at once. */
    for (int k = 1; k < g->n; k++) {
        int q = (g->me + k) % g->n;
        const unsigned char *src;
        FSDP_TRY(peer_in(g, b, q, &src));
        comm_copy_stream(dst + (size_t)q * bpr, src, bpr);
        peer_span_keep(g, src, bpr);
    }
    int rc_end = shm_barrier(g, deadline);
    peer_spans_retire(g);
    return rc_end;
}

static int direct_reduce_scatter(struct shm_group *g, int b, const void *in, void *out, size_t count,
                                 enum dtype dtype, enum comm_op op, int divisor, double deadline)
{
    size_t es = dtype_size(dtype), blk = (size_t)g->me * count * es;
    const void *srcs[SHM_MAX_LOCAL];
    for (int s = 0; s < g->n; s++) {
        const unsigned char *p = in;
        if (s != g->me)
            FSDP_TRY(peer_in(g, b, s, &p));
        srcs[s] = p + blk;
    }
    comm_reduce_arrays_stream(dtype, op, srcs, g->n, out, count, divisor);
    for (int s = 0; s < g->n; s++)
        if (s != g->me)
            peer_span_keep(g, srcs[s], count * es);
    int rc_end = shm_barrier(g, deadline);
    peer_spans_retire(g);
    return rc_end;
}

/* Reduce-scatter into this rank's share of out, then gather the other shares from the peers' outs. */
static int direct_all_reduce(struct shm_group *g, int b, const void *in, void *out, size_t count,
                             enum dtype dtype, enum comm_op op, int divisor, double deadline)
{
    size_t es = dtype_size(dtype), lo, hi;
    const unsigned char *pin[SHM_MAX_LOCAL], *pout[SHM_MAX_LOCAL];
    for (int s = 0; s < g->n; s++) {
        pin[s] = in;
        pout[s] = out;
        if (s != g->me) {
            FSDP_TRY(peer_in(g, b, s, &pin[s]));
            FSDP_TRY(peer_out(g, b, s, &pout[s]));
        }
    }
    unsigned char *dst = out;
    share(count, g->n, g->me, &lo, &hi);
    if (hi > lo) {
        const void *srcs[SHM_MAX_LOCAL];
        for (int s = 0; s < g->n; s++)
            srcs[s] = pin[s] + lo * es;
        comm_reduce_arrays_stream(dtype, op, srcs, g->n, dst + lo * es, hi - lo, divisor);
        for (int s = 0; s < g->n; s++)
            if (s != g->me)
                peer_span_keep(g, srcs[s], (hi - lo) * es);
    }
    FSDP_TRY(shm_barrier(g, deadline));
    for (int k = 1; k < g->n; k++) {
        int q = (g->me + k) % g->n;
        share(count, g->n, q, &lo, &hi);
        if (hi > lo) {
            comm_copy_stream(dst + lo * es, pout[q] + lo * es, (hi - lo) * es);
            peer_span_keep(g, pout[q] + lo * es, (hi - lo) * es);
        }
    }
    int rc = shm_barrier(g, deadline);
    peer_spans_retire(g);
    return rc;
}

static int direct_broadcast(struct shm_group *g, int b, void *buf, size_t bytes, int root, double deadline)
{
    if (g->me != root) {
        const unsigned char *src;
        FSDP_TRY(peer_in(g, b, root, &src));
        comm_copy_stream(buf, src, bytes);
        peer_span_keep(g, src, bytes);
    }
    int rc_end = shm_barrier(g, deadline);
    peer_spans_retire(g);
    return rc_end;
}

/* ---- staged through the slots ---- */

static void ag_stage(struct shm_group *g, int b, const unsigned char *src, unsigned char *dst, size_t bpr,
                     size_t off, size_t len)
{
    memcpy(slot(g, b, g->me), src + off, len);
    /* The own block goes out now, while the piece is still in cache and before waiting for the
     * others (nothing to do in place). */
    unsigned char *own = dst + (size_t)g->me * bpr + off;
    if (own != src + off)
        memmove(own, src + off, len);
}

static void ag_finish(struct shm_group *g, int b, unsigned char *dst, size_t bpr, size_t off, size_t len)
{
    for (int q = 0; q < g->n; q++)
        if (q != g->me)
            memcpy(dst + (size_t)q * bpr + off, slot(g, b, q), len);
}

/* The first barrier of an operation: returns < 0 on error, 1 when every rank published registered
 * buffers (take the direct path), else 0 after making sure piece 0 is staged by everyone: ranks that
 * skipped staging (mine) stage it now and, in a mixed group, all sync once more. */
static int first_sync(struct shm_group *g, int b, bool mine, void (*stage)(void *), void *arg, double deadline)
{
    FSDP_TRY(shm_barrier(g, deadline));
    int nreg = count_valid(g, b);
    if (nreg == g->n)
        return 1;
    if (mine)
        stage(arg);
    if (nreg > 0)
        FSDP_TRY(shm_barrier(g, deadline));
    return 0;
}

struct ag_args {
    struct shm_group *g;
    int b;
    const unsigned char *src;
    unsigned char *dst;
    size_t bpr, len;
};

static void ag_stage0(void *a)
{
    struct ag_args *x = a;
    ag_stage(x->g, x->b, x->src, x->dst, x->bpr, 0, x->len);
}

int shm_all_gather(struct shm_group *g, const void *in, void *out, size_t bpr, double deadline)
{
    if (bpr == 0)
        return 0;
    const unsigned char *src = in;
    unsigned char *dst = out;
    int b = next_bank(g);
    struct ag_args a = {g, b, src, dst, bpr, bpr < g->slot ? bpr : g->slot};
    bool mine = publish(g, b, in, bpr, NULL, 0);
    if (!mine)
        ag_stage0(&a);
    int rc = first_sync(g, b, mine, ag_stage0, &a, deadline);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        atomic_fetch_add(&direct_ops, 1);
        return direct_all_gather(g, b, in, out, bpr, deadline);
    }
    ag_finish(g, b, dst, bpr, 0, a.len);
    for (size_t off = a.len; off < bpr; off += g->slot) {
        size_t len = bpr - off < g->slot ? bpr - off : g->slot;
        b = next_bank(g);
        ag_stage(g, b, src, dst, bpr, off, len);
        FSDP_TRY(shm_barrier(g, deadline));
        ag_finish(g, b, dst, bpr, off, len);
    }
    return 0;
}

struct ar_args {
    struct shm_group *g;
    int b;
    const unsigned char *src;
    size_t bytes;
};

static void ar_stage0(void *a)
{
    struct ar_args *x = a;
    memcpy(slot(x->g, x->b, x->g->me), x->src, x->bytes);
}

/* After piece [off, off + p) is staged on bank b: each rank reduces its share into slot 0 (every rank has
 * read slot 0's copy of that share by then), sync, everyone copies the reduced piece out. */
static int ar_finish(struct shm_group *g, int b, unsigned char *dst, size_t off, size_t p, enum dtype dtype,
                     enum comm_op op, int divisor, double deadline)
{
    size_t es = dtype_size(dtype), lo, hi;
    share(p, g->n, g->me, &lo, &hi);
    if (hi > lo) {
        const void *srcs[SHM_MAX_LOCAL];
        for (int s = 0; s < g->n; s++)
            srcs[s] = slot(g, b, s) + lo * es;
        comm_reduce_arrays(dtype, op, srcs, g->n, slot(g, b, 0) + lo * es, hi - lo, divisor);
    }
    FSDP_TRY(shm_barrier(g, deadline));
    memcpy(dst + off * es, slot(g, b, 0), p * es);
    return 0;
}

int shm_all_reduce(struct shm_group *g, const void *in, void *out, size_t count, enum dtype dtype,
                   enum comm_op op, int divisor, double deadline)
{
    if (count == 0)
        return 0;
    size_t es = dtype_size(dtype), per = g->slot / es;
    const unsigned char *src = in;
    unsigned char *dst = out;
    int b = next_bank(g);
    size_t p = count < per ? count : per;
    struct ar_args a = {g, b, src, p * es};
    bool mine = publish(g, b, in, count * es, out, count * es);
    if (!mine)
        ar_stage0(&a);
    int rc = first_sync(g, b, mine, ar_stage0, &a, deadline);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        atomic_fetch_add(&direct_ops, 1);
        return direct_all_reduce(g, b, in, out, count, dtype, op, divisor, deadline);
    }
    FSDP_TRY(ar_finish(g, b, dst, 0, p, dtype, op, divisor, deadline));
    for (size_t off = p; off < count; off += per) {
        p = count - off < per ? count - off : per;
        b = next_bank(g);
        memcpy(slot(g, b, g->me), src + off * es, p * es);
        FSDP_TRY(shm_barrier(g, deadline));
        FSDP_TRY(ar_finish(g, b, dst, off, p, dtype, op, divisor, deadline));
    }
    return 0;
}

struct rs_args {
    struct shm_group *g;
    int b;
    const unsigned char *src;
    size_t count, off, p, es;
};

/* Only the blocks other ranks reduce go through the segment; this rank's own block is read straight
 * from its input (same values, same rank order: the same bits). */
static void rs_stage(void *a)
{
    struct rs_args *x = a;
    unsigned char *mine = slot(x->g, x->b, x->g->me);
    for (int q = 0; q < x->g->n; q++)
        if (q != x->g->me)
            memcpy(mine + (size_t)q * x->p * x->es, x->src + ((size_t)q * x->count + x->off) * x->es, x->p * x->es);
}

static void rs_finish(const struct rs_args *x, unsigned char *dst, enum dtype dtype, enum comm_op op,
                      int divisor)
{
    struct shm_group *g = x->g;
    const void *srcs[SHM_MAX_LOCAL];
    for (int s = 0; s < g->n; s++)
        srcs[s] = s == g->me ? x->src + ((size_t)g->me * x->count + x->off) * x->es
                             : slot(g, x->b, s) + (size_t)g->me * x->p * x->es;
    comm_reduce_arrays(dtype, op, srcs, g->n, dst + x->off * x->es, x->p, divisor);
}

int shm_reduce_scatter(struct shm_group *g, const void *in, void *out, size_t count, enum dtype dtype,
                       enum comm_op op, int divisor, double deadline)
{
    if (count == 0)
        return 0;
    size_t es = dtype_size(dtype), per = g->slot / (es * (size_t)g->n);
    unsigned char *dst = out;
    struct rs_args a = {g, next_bank(g), in, count, 0, count < per ? count : per, es};
    bool mine = publish(g, a.b, in, count * es * (size_t)g->n, NULL, 0);
    if (!mine)
        rs_stage(&a);
    int rc = first_sync(g, a.b, mine, rs_stage, &a, deadline);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        atomic_fetch_add(&direct_ops, 1);
        return direct_reduce_scatter(g, a.b, in, out, count, dtype, op, divisor, deadline);
    }
    rs_finish(&a, dst, dtype, op, divisor);
    for (a.off = a.p; a.off < count; a.off += per) {
        a.p = count - a.off < per ? count - a.off : per;
        a.b = next_bank(g);
        rs_stage(&a);
        FSDP_TRY(shm_barrier(g, deadline));
        rs_finish(&a, dst, dtype, op, divisor);
    }
    return 0;
}

int shm_broadcast(struct shm_group *g, void *buf, size_t bytes, int root, double deadline)
{
    if (bytes == 0)
        return 0;
    unsigned char *p = buf;
    int b = next_bank(g);
    size_t len = bytes < g->slot ? bytes : g->slot;
    /* Only the root's buffer is read by others, so only its registration decides (no mixed case). */
    bool mine = g->me == root && publish(g, b, buf, bytes, NULL, 0);
    if (g->me != root)
        g->ctrl->desc[b][g->me].valid = 0;
    if (g->me == root && !mine)
        memcpy(slot(g, b, 0), p, len);
    FSDP_TRY(shm_barrier(g, deadline));
    if (g->ctrl->desc[b][root].valid == 1) {
        atomic_fetch_add(&direct_ops, 1);
        return direct_broadcast(g, b, buf, bytes, root, deadline);
    }
    for (size_t off = 0;;) {
        if (g->me != root)
            memcpy(p + off, slot(g, b, 0), len);
        off += len;
        if (off >= bytes)
            return 0;
        len = bytes - off < g->slot ? bytes - off : g->slot;
        b = next_bank(g);
        if (g->me == root)
            memcpy(slot(g, b, 0), p + off, len);
        FSDP_TRY(shm_barrier(g, deadline));
    }
}
