/* Shared-memory collectives between the ranks of one host.
 *
 * Segment: a control page (futex barrier, abort flag + message, pids, per-rank arrival epochs) then two
 * banks of n slots. A collective moves its buffers in pieces of at most one slot per rank; the banks
 * alternate between pieces, so one piece's readers never race the next piece's writers and most pieces
 * need a single barrier. Every wait is a futex wait in the kernel with a short timeout slice, after which
 * the waiter checks the deadline, the abort flag and whether the missing peers are still alive: a dead
 * rank is reported within a slice, a stuck one at the deadline. */
#include "comm/comm_shm.h"
#include "comm/comm_internal.h"
#include "common/error.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

struct shm_ctrl {
    _Atomic uint32_t release; /* futex word: epoch of the last completed barrier */
    _Atomic uint32_t aborted;
    _Atomic uint64_t count; /* total arrivals; the last arrival of epoch e makes it e * n */
    int32_t abort_rank;
    uint32_t n;
    uint64_t slot_bytes;
    char abort_msg[480];
    int32_t pid[SHM_MAX_LOCAL];
    _Atomic uint32_t arrive[SHM_MAX_LOCAL]; /* epoch each rank last arrived at */
};

struct shm_group {
    struct shm_ctrl *ctrl;
    unsigned char *data;
    size_t map_bytes, slot;
    int n, me;
    uint32_t epoch;
    int bank;
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

int shm_group_attach(const char *name, bool create, int local_rank, int n, const int *global_ranks,
                     size_t slot_bytes, struct shm_group **out)
{
    *out = NULL;
    if (n < 1 || n > SHM_MAX_LOCAL || local_rank < 0 || local_rank >= n)
        return error_set(FSDP_EINVAL, "shm: %d ranks on one host (at most %d), local rank %d", n, SHM_MAX_LOCAL,
                         local_rank);
    size_t bytes = shm_segment_bytes(n, slot_bytes);
    int fd = shm_open(name, create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
    if (fd < 0)
        return error_set(errno == EEXIST ? FSDP_EEXIST : FSDP_EIO, "shm: shm_open(%s) failed: %s", name,
                         strerror(errno));
    if (create && ftruncate(fd, (off_t)bytes) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        return error_set(FSDP_EIO, "shm: cannot size %s to %zu bytes: %s (is /dev/shm full?)", name, bytes,
                         strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < bytes) {
        close(fd);
        return error_set(FSDP_EPROTO, "shm: segment %s is smaller than the %zu bytes expected", name, bytes);
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return error_set(FSDP_ENOMEM, "shm: mmap of %zu bytes failed: %s", bytes, strerror(e));
    struct shm_group *g = calloc(1, sizeof(*g));
    if (!g) {
        munmap(p, bytes);
        return error_set(FSDP_ENOMEM, "shm: out of memory");
    }
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
    }
    *out = g;
    return 0;
}

void shm_group_detach(struct shm_group *g)
{
    if (!g)
        return;
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
    if (!f)
        return true;
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
        snprintf(g->ctrl->abort_msg, sizeof(g->ctrl->abort_msg), "%s", why);
        atomic_store(&g->ctrl->aborted, 1);
    }
    futex(&g->ctrl->release, FUTEX_WAKE, INT_MAX, NULL);
}

static int fail_aborted(struct shm_group *g)
{
    return error_set(FSDP_EABORTED, "rank %d failed first: %s", g->ctrl->abort_rank, g->ctrl->abort_msg);
}

int shm_barrier(struct shm_group *g, double deadline)
{
    struct shm_ctrl *c = g->ctrl;
    uint32_t e = ++g->epoch;
    atomic_store(&c->arrive[g->me], e);
    uint64_t total = atomic_fetch_add(&c->count, 1) + 1;
    if (total == (uint64_t)e * (uint64_t)g->n) {
        atomic_store(&c->release, e);
        futex(&c->release, FUTEX_WAKE, INT_MAX, NULL);
        return atomic_load(&c->aborted) == 1 ? fail_aborted(g) : 0;
    }
    for (;;) {
        uint32_t v = atomic_load(&c->release);
        if ((int32_t)(v - e) >= 0)
            return 0;
        if (atomic_load(&c->aborted) == 1)
            return fail_aborted(g);
        char missing[256] = "";
        size_t mlen = 0;
        int dead = -1, nmissing = 0;
        for (int i = 0; i < g->n; i++) {
            if ((int32_t)(atomic_load(&c->arrive[i]) - e) >= 0)
                continue;
            if (pid_dead(c->pid[i]) && dead < 0)
                dead = i;
            nmissing++;
            if (mlen < sizeof(missing) - 16)
                mlen += (size_t)snprintf(missing + mlen, sizeof(missing) - mlen, "%s%d", mlen ? ", " : "",
                                         g->global[i]);
        }
        if (dead >= 0) {
            char why[200];
            snprintf(why, sizeof(why), "rank %d (pid %d) died (its process is gone or a zombie)",
                     g->global[dead], c->pid[dead]);
            shm_abort(g, why);
            return error_set(FSDP_ECLOSED, "%s; look at that rank's log and exit status for the cause", why);
        }
        double now = comm_now_s();
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

int shm_all_gather(struct shm_group *g, const void *in, void *out, size_t bpr, double deadline)
{
    const unsigned char *src = in;
    unsigned char *dst = out;
    for (size_t off = 0; off < bpr; off += g->slot) {
        size_t len = bpr - off < g->slot ? bpr - off : g->slot;
        int b = g->bank;
        g->bank ^= 1;
        memcpy(slot(g, b, g->me), src + off, len);
        /* The own block goes out now, while the piece is still in cache and before waiting for the
         * others (nothing to do in place). */
        unsigned char *own = dst + (size_t)g->me * bpr + off;
        if (own != src + off)
            memmove(own, src + off, len);
        int rc = shm_barrier(g, deadline);
        if (rc)
            return rc;
        for (int q = 0; q < g->n; q++)
            if (q != g->me)
                memcpy(dst + (size_t)q * bpr + off, slot(g, b, q), len);
    }
    return 0;
}

/* Rank q's share [*lo, *hi) of p elements, as even as possible. */
static void share(size_t p, int n, int q, size_t *lo, size_t *hi)
{
    size_t base = p / (size_t)n, rem = p % (size_t)n, uq = (size_t)q;
    *lo = uq * base + (uq < rem ? uq : rem);
    *hi = *lo + base + (uq < rem ? 1 : 0);
}

int shm_all_reduce(struct shm_group *g, const void *in, void *out, size_t count, enum comm_dtype dtype,
                   enum comm_op op, int divisor, double deadline)
{
    size_t es = comm_dtype_size(dtype), per = g->slot / es;
    const unsigned char *src = in;
    unsigned char *dst = out;
    for (size_t off = 0; off < count; off += per) {
        size_t p = count - off < per ? count - off : per;
        int b = g->bank;
        g->bank ^= 1;
        memcpy(slot(g, b, g->me), src + off * es, p * es);
        int rc = shm_barrier(g, deadline);
        if (rc)
            return rc;
        size_t lo, hi;
        share(p, g->n, g->me, &lo, &hi);
        if (hi > lo) {
            const void *srcs[SHM_MAX_LOCAL];
            for (int s = 0; s < g->n; s++)
                srcs[s] = slot(g, b, s) + lo * es;
            /* The result goes to slot 0's copy of this share: every rank has read it by now. */
            comm_reduce_arrays(dtype, op, srcs, g->n, slot(g, b, 0) + lo * es, hi - lo, divisor);
        }
        rc = shm_barrier(g, deadline);
        if (rc)
            return rc;
        memcpy(dst + off * es, slot(g, b, 0), p * es);
    }
    return 0;
}

int shm_reduce_scatter(struct shm_group *g, const void *in, void *out, size_t count, enum comm_dtype dtype,
                       enum comm_op op, int divisor, double deadline)
{
    size_t es = comm_dtype_size(dtype), per = g->slot / (es * (size_t)g->n);
    const unsigned char *src = in;
    unsigned char *dst = out;
    for (size_t off = 0; off < count; off += per) {
        size_t p = count - off < per ? count - off : per;
        int b = g->bank;
        g->bank ^= 1;
        /* Only the blocks other ranks reduce go through the segment; this rank's own block is read
         * straight from its input (same values, same rank order: the same bits). */
        unsigned char *mine = slot(g, b, g->me);
        for (int q = 0; q < g->n; q++)
            if (q != g->me)
                memcpy(mine + (size_t)q * p * es, src + ((size_t)q * count + off) * es, p * es);
        int rc = shm_barrier(g, deadline);
        if (rc)
            return rc;
        const void *srcs[SHM_MAX_LOCAL];
        for (int s = 0; s < g->n; s++)
            srcs[s] = s == g->me ? src + ((size_t)g->me * count + off) * es : slot(g, b, s) + (size_t)g->me * p * es;
        comm_reduce_arrays(dtype, op, srcs, g->n, dst + off * es, p, divisor);
    }
    return 0;
}

int shm_broadcast(struct shm_group *g, void *buf, size_t bytes, int root, double deadline)
{
    unsigned char *p = buf;
    for (size_t off = 0; off < bytes; off += g->slot) {
        size_t len = bytes - off < g->slot ? bytes - off : g->slot;
        int b = g->bank;
        g->bank ^= 1;
        if (g->me == root)
            memcpy(slot(g, b, 0), p + off, len);
        int rc = shm_barrier(g, deadline);
        if (rc)
            return rc;
        if (g->me != root)
            memcpy(p + off, slot(g, b, 0), len);
    }
    return 0;
}
