/* The CUDA host emulator's NCCL: the NCCL 2.28 API (the calls fsdpc makes, see comm/comm_nccl.c) between ranks
 * that are processes of one machine, through POSIX shared memory. Test infrastructure, for correctness, not
 * speed: the emulator library provides these symbols instead of libnccl.
 *
 * Communicators. ncclGetUniqueId writes a magic and a fresh shared-memory name ("/fsdpc-emu-nccl-<pid>-<64 random
 * bits>") into the id; ncclCommInitRank* of every rank opens that name (the O_CREAT|O_EXCL winner sizes and
 * initialises the segment, the others wait for its ready word), claims its rank's record (pid, /proc start
 * time), waits for every rank, and then unlinks the name: after a normal run nothing is left in /dev/shm, and a
 * failed or aborted init unlinks it too. Only a job whose every rank is killed during init leaves its segment.
 * ncclCommSplit exchanges (color, key) through the parent's segment and makes each child's segment the same way,
 * under a name every member derives from the parent's name, the split's sequence number and the color.
 * Nonblocking communicators (config->blocking == 0) run init, split and finalize on a background thread; the
 * call answers ncclInProgress and ncclCommGetAsyncError says ncclInProgress until it is done. A split writes the
 * child's handle into *newcomm only when it is complete (NOCOLOR: NULL). Blocking ones run the same steps in the
 * call.
 *
 * Segment of a communicator of n ranks (n <= NCCL_EMU_MAX_RANKS = 16), sized once and reserved with
 * posix_fallocate (a full /dev/shm is an init error, never a SIGBUS in the middle of a collective):
 *   header (36 KiB): ready word, futex doorbell, one record per rank (attach state, status, pid, start time,
 *                    collective and control arrival counters, the signature of its current collective, split
 *                    color/key), head/tail counters of the n x n point-to-point rings
 *   staging:  n x 1 MiB, each rank's slot as two 512 KiB halves used by alternate phases
 *   rings:    n x n x 128 KiB, one byte ring per ordered pair (self included) for send/recv
 * so 36 KiB + n MiB + n^2 x 128 KiB: 2.6 MiB for 2 ranks, 6 MiB for 4, 16 MiB for 8, 48 MiB for 16.
 * Process memory besides: the communicator (about 1 KiB) and each queued op (its items).
 *
 * Collectives. Each call queues one op on its stream (emu_enqueue); the op moves the data through the staging
 * slots in phases of at most half a slot per rank: a rank copies its part into its slot's half (phase & 1),
 * publishes its arrival counter, waits until every rank has arrived at that phase, then computes its output from
 * all slots. The halves alternate, so a rank writing phase p + 2 has seen everyone arrive at p + 1, after they
 * had read phase p: one barrier per phase. Reductions load every rank's value as fp32, combine them in rank
 * order 0..n-1 in fp32 and round once to the output type (bf16/f16 round to nearest even, common/dtype.h);
 * ncclAvg is that sum divided by n. Every rank runs the same arithmetic on the same bits, so every rank gets
 * identical bits. All ranks also publish the collective's signature (kind, count, type, op, root): a rank
 * whose peers issued a different collective fails with ncclInvalidUsage instead of mixing data.
 *
 * Groups. ncclGroupStart/End nest per thread; the calls inside are collected and the outermost End queues one
 * op per stream holding them all. The op progresses its sends and receives together (each ordered pair's
 * messages in issue order, each through its ring in pieces, with a header carrying the byte count), so ranks
 * that both send first, or send messages larger than a ring, still complete. Collectives in a group run in
 * issue order among themselves, progressing alongside the sends and receives.
 *
 * Waiting. Every wait is bounded: it yields for 100 us, then sleeps on the segment's futex doorbell (every
 * arrival, ring move and status change rings it) in slices of at most 10 ms, or naps doubling from 20 us to
 * 1 ms where there is no doorbell to sleep on. After each slice it checks the communicator's abort flag, every
 * 10 ms whether the peers it waits for are still there (/proc/<pid>/stat: gone, a zombie or a new process with
 * the pid means dead; or a status the peer set: aborted, finalized/destroyed, failed), and its bound:
 * 0.9 x FSDP_COMM_TIMEOUT_S (600 s when unset; for an op, since its last progress), so the emulator's own error
 * reaches fsdpc before fsdpc's deadline and a split never completes after its caller gave up on it. A peer that
 * died, aborted, departed or failed while this rank waits for it (what it wrote before is still used: the wait
 * looks once more before blaming it) makes the op stop and the communicator's async error ncclRemoteError,
 * with ncclGetLastError naming the rank and pid; later calls on it return that error at once, and queued ops of
 * it return without doing anything. The stream goes on after a failed op. ncclCommAbort sets the abort flag and
 * rings the doorbell (a waiting op returns at once, at worst within a slice) and marks the rank aborted for its
 * peers; the communicator is freed when the last op holding it is released. Ops of one communicator never
 * overlap (they share its phases and rings): one queued on another stream waits for the running one.
 *
 * Not emulated: more than one rank per process per communicator in one group init (ncclCommInitAll and inits
 * inside a group run at once), user-defined reduction ops, reductions of integer or fp64/fp8 types (copies of
 * them work: all_gather, broadcast, send/recv), ncclCommRegister and windows. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common/clock.h"
#include "common/settings.h"
#include "gpu/emu/emu.h"

#include "common/dtype.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NCCL_EMU_MAX_RANKS 16
#define NCCL_EMU_STAGE_BYTES ((size_t)1 << 20) /* one rank's staging slot: two halves */
#define NCCL_EMU_HALF_BYTES (NCCL_EMU_STAGE_BYTES / 2)
#define NCCL_EMU_RING_BYTES ((size_t)128 << 10) /* one ordered pair's ring; a multiple of the header */
#define NCCL_EMU_MSG_HDR 16                     /* a message's header in a ring; payloads are padded to it */
#define NCCL_EMU_MSG_MAGIC 0x4753454du          /* "MESG" */
#define NCCL_EMU_ID_MAGIC 0x4e554d45u           /* "EMUN": an id from this emulator's ncclGetUniqueId */
#define NCCL_EMU_SHM_READY 0x59444552u          /* the creator has initialised the segment */
#define NCCL_EMU_SHM_BROKEN 0x4e4b5242u         /* the creator failed; it has unlinked the name */
#define NCCL_EMU_COMM_MAGIC 0x6d6d6f63u
#define NCCL_EMU_LAYOUT 1u
#define NCCL_EMU_PREFIX "/fsdpc-emu-nccl-"
#define NCCL_EMU_CONFIG_MAGIC 0xcafebeefu
#define NCCL_EMU_SLICE_NS 10000000L /* the longest sleep between checks of abort, peers and bound: 10 ms */
#define NCCL_EMU_YIELD_S 1e-4       /* yield, not sleep, this long after the last progress */
#define NCCL_EMU_BLK 256            /* elements reduced per block (fp32 accumulators on the stack) */

_Static_assert(ATOMIC_LONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "the shared segment needs lock-free 32- and 64-bit atomics");
_Static_assert(NCCL_EMU_RING_BYTES % NCCL_EMU_MSG_HDR == 0, "headers must never wrap around a ring");

/* ------------------------------------------------------------------------------------------------------------
 * The shared segment */

enum nccl_emu_status { /* a rank's status in its record, for its peers */
    NCCL_EMU_ST_NONE = 0,
    NCCL_EMU_ST_RUNNING = 1,
    NCCL_EMU_ST_FAILED = 2,   /* an op of it failed: it will not take part in anything more */
    NCCL_EMU_ST_DEPARTED = 3, /* finalized or destroyed */
    NCCL_EMU_ST_ABORTED = 4,
};

enum nccl_emu_kind {
    NCCL_EMU_ALL_REDUCE,
    NCCL_EMU_REDUCE,
    NCCL_EMU_BROADCAST,
    NCCL_EMU_ALL_GATHER,
    NCCL_EMU_REDUCE_SCATTER,
    NCCL_EMU_SEND,
    NCCL_EMU_RECV,
};

/* What a rank says it is running in a phase, compared by every rank before using the phase's data. */
struct nccl_emu_sig {
    int32_t kind, type, redop, root;
    uint64_t count;
};

struct nccl_emu_shm_rank {
    _Alignas(64) _Atomic uint32_t attached; /* 0 free, 1 being claimed, 2 present (pid, start are valid) */
    _Atomic uint32_t status;                /* enum nccl_emu_status */
    int32_t pid;
    uint32_t pad;
    uint64_t start_ticks;               /* /proc/<pid>/stat field 22: tells a reused pid from the rank */
    _Atomic uint64_t coll_arrive;       /* collective phases this rank has published */
    _Atomic uint64_t ctrl_arrive;       /* control phases (split, finalize) this rank has reached */
    struct nccl_emu_sig sig[2];         /* per staging half */
    int32_t color[2], key[2];           /* per control half: the split's arguments */
};

struct nccl_emu_shm_ring { /* head written by the sender only, tail by the receiver only: byte counts */
    _Alignas(64) _Atomic uint64_t head;
    _Alignas(64) _Atomic uint64_t tail;
};

struct nccl_emu_shm {
    _Atomic uint32_t ready;
    uint32_t layout;
    uint32_t nranks;
    uint32_t pad;
    uint64_t bytes;
    _Alignas(64) _Atomic uint32_t doorbell; /* futex word: bumped by every change a waiter may wait for */
    _Atomic uint32_t sleepers;              /* waiters in FUTEX_WAIT: a bump wakes only when there are some */
    struct nccl_emu_shm_rank rank[NCCL_EMU_MAX_RANKS];
    struct nccl_emu_shm_ring ring[NCCL_EMU_MAX_RANKS * NCCL_EMU_MAX_RANKS];
};

struct nccl_emu_msg { /* a message's header in a ring */
    uint64_t bytes;
    uint32_t magic;
    uint32_t pad;
};
_Static_assert(sizeof(struct nccl_emu_msg) == NCCL_EMU_MSG_HDR, "message header size");

static size_t nccl_emu_hdr_bytes(void)
{
    return (sizeof(struct nccl_emu_shm) + 4095) & ~(size_t)4095;
}

static size_t nccl_emu_shm_bytes(int n)
{
    return nccl_emu_hdr_bytes() + (size_t)n * NCCL_EMU_STAGE_BYTES + (size_t)n * n * NCCL_EMU_RING_BYTES;
}

/* ------------------------------------------------------------------------------------------------------------
 * The process's communicator */

enum nccl_emu_task { NCCL_EMU_TASK_INIT, NCCL_EMU_TASK_SPLIT, NCCL_EMU_TASK_FINALIZE };

struct ncclComm {
    uint32_t magic;
    _Atomic int refs; /* the handle, plus one per queued op; the last one frees */
    int rank, nranks;
    bool blocking;
    char name[96];  /* the segment's shm name */
    char tag[24];   /* the pid part of the name, kept by split children (the tests find leftovers by it) */
    char label[64]; /* config->commName, for messages */
    double bound_s; /* every wait's bound */
    struct nccl_emu_shm *shm;
    size_t shm_bytes;
    unsigned char *stage, *rings;
    bool unlinked; /* the name is gone (all ranks attached, or unlinked after a failure) */
    _Atomic bool aborted;
    struct ncclComm *split_parent; /* while a split makes this child: aborting the parent stops it too */
    _Atomic bool finalized;
    _Atomic bool bg_busy; /* init, split or finalize under way: ncclInProgress */
    _Atomic int async_err;
    _Atomic long pending; /* queued ops not yet released: finalize waits for none */
    _Atomic bool op_busy; /* an op of this communicator is running (ops of one communicator never overlap) */
    uint64_t coll_phase;  /* collective phases done: only the op holding op_busy touches it */
    uint64_t ctrl_phase;  /* control phases done: only the one init/split/finalize task */
    pthread_mutex_t mu;   /* err, bg and bg_joinable */
    char err[640];        /* the async error's message, written once before async_err is set */
    pthread_t bg;
    bool bg_joinable;
    struct { /* the background task's arguments */
        enum nccl_emu_task task;
        int color, key;
        ncclComm_t *newcomm;
        bool child_blocking;
        char child_label[64];
    } bgt;
};

/* ------------------------------------------------------------------------------------------------------------
 * Errors and messages */

static _Thread_local char nccl_emu_tl_last[640]; /* this thread's last failed call */
static char nccl_emu_last[640];                   /* any thread's, for ncclGetLastError(NULL) */
static _Thread_local char nccl_emu_tl_copy[640];
static pthread_mutex_t nccl_emu_last_mu = PTHREAD_MUTEX_INITIALIZER;

/* NCCL_DEBUG=WARN (or INFO, TRACE) prints failures on stderr, as NCCL's WARN lines; quiet otherwise, since
 * tests of failure paths make many on purpose. */
static bool nccl_emu_debug(void)
{
    const char *v = getenv("NCCL_DEBUG");
    return v && (!strcasecmp(v, "WARN") || !strcasecmp(v, "INFO") || !strcasecmp(v, "TRACE"));
}

static void nccl_emu_note_str(const char *msg)
{
    snprintf(nccl_emu_tl_last, sizeof nccl_emu_tl_last, "%s", msg);
    pthread_mutex_lock(&nccl_emu_last_mu);
    snprintf(nccl_emu_last, sizeof nccl_emu_last, "%s", msg);
    pthread_mutex_unlock(&nccl_emu_last_mu);
    if (nccl_emu_debug())
        fprintf(stderr, "fsdpc NCCL emulator [pid %d] WARN %s\n", (int)getpid(), msg);
}

/* A failed call's message (ncclGetLastError); returns code for `return nccl_emu_note(code, ...)`. */
__attribute__((format(printf, 2, 3))) static ncclResult_t nccl_emu_note(ncclResult_t code, const char *fmt, ...)
{
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nccl_emu_note_str(msg);
    return code;
}

/* Makes code the communicator's async error unless it already has one (the first error stays, with its
 * message); returns the error the communicator now has. */
static ncclResult_t nccl_emu_set_error(struct ncclComm *c, ncclResult_t code, const char *msg)
{
    pthread_mutex_lock(&c->mu);
    int have = atomic_load(&c->async_err);
    if (have == ncclSuccess) {
        if (c->label[0])
            snprintf(c->err, sizeof c->err, "%s (communicator '%s', rank %d of %d)", msg, c->label, c->rank,
                     c->nranks);
        else
            snprintf(c->err, sizeof c->err, "%s (rank %d of %d)", msg, c->rank, c->nranks);
        atomic_store(&c->async_err, code);
        have = code;
        nccl_emu_note_str(c->err);
    }
    pthread_mutex_unlock(&c->mu);
    return (ncclResult_t)have;
}

/* ------------------------------------------------------------------------------------------------------------
 * Time, sleeping, the doorbell, peers */

/* 0.9 x FSDP_COMM_TIMEOUT_S (common/settings.h; read at each init and split, since tests set it per process): a
 * little under fsdpc's own deadline, so a split never writes its child's handle after fsdpc gave up on it. */
static double nccl_emu_bound_s(void)
{
    return 0.9 * settings_double(SETTING_COMM_TIMEOUT_S);
}

static long nccl_emu_futex(_Atomic uint32_t *word, int op, uint32_t val, const struct timespec *ts)
{
    /* not FUTEX_PRIVATE_FLAG: the word is shared between processes */
    return syscall(SYS_futex, (void *)word, op, val, ts, NULL, 0);
}

/* After a change a peer may be waiting for: bump the doorbell and wake its sleepers. */
static void nccl_emu_ring_bell(struct nccl_emu_shm *s)
{
    atomic_fetch_add(&s->doorbell, 1);
    if (atomic_load(&s->sleepers))
        nccl_emu_futex(&s->doorbell, FUTEX_WAKE, INT_MAX, NULL);
}

/* One pause of a wait loop. The caller read the doorbell (seen) before checking its condition: a change since
 * then bumped it, so the futex wait returns at once instead of missing it. Yields for 100 us after the last
 * progress (t0), then sleeps on the doorbell for a slice (bell != NULL) or naps of *nap_ns doubling to 1 ms. */
static void nccl_emu_pause(double t0, long *nap_ns, struct nccl_emu_shm *bell, uint32_t seen, long slice_ns)
{
    if (clock_now_s() - t0 < NCCL_EMU_YIELD_S) {
        sched_yield();
        return;
    }
    if (bell) {
        struct timespec ts = {0, slice_ns};
        atomic_fetch_add(&bell->sleepers, 1);
        if (atomic_load(&bell->doorbell) == seen)
            nccl_emu_futex(&bell->doorbell, FUTEX_WAIT, seen, &ts);
        atomic_fetch_sub(&bell->sleepers, 1);
        return;
    }
    struct timespec ts = {0, *nap_ns};
    nanosleep(&ts, NULL);
    *nap_ns = *nap_ns < 500000 ? 2 * *nap_ns : 1000000;
}

/* /proc/<pid>/stat's fields: the state letter and field 22, the start time in clock ticks. 1 when read. */
static int nccl_emu_proc_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ESRCH ? 0 : -1;
    ssize_t k = read(fd, buf, sizeof buf - 1);
    int saved = errno;
    close(fd);
    if (k <= 0)
        return k == 0 || saved == ESRCH ? 0 : -1;
    buf[k] = '\0';
    /* the command name (field 2) may hold spaces and parentheses: fields 3.. follow the last ')' */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || !p[2])
        return -1;
    *state = p[2];
    char *f = p + 2;
    for (int i = 3; i < 22 && f; i++) {
        f = strchr(f, ' ');
        if (f)
            f++;
    }
    *start = f ? strtoull(f, NULL, 10) : 0;
    return 1;
}

static uint64_t nccl_emu_proc_start(pid_t pid)
{
    char st = 0;
    uint64_t start = 0;
    return nccl_emu_proc_stat(pid, &st, &start) == 1 ? start : 0;
}

/* False once the process is gone, a zombie (a killed rank stays one until its parent reaps it, and a zombie
 * still answers kill(pid, 0)), or another process that got its pid. */
static bool nccl_emu_proc_alive(pid_t pid, uint64_t start)
{
    char st = 0;
    uint64_t now_start = 0;
    int r = nccl_emu_proc_stat(pid, &st, &now_start);
    if (r == 0)
        return false;
    if (r == 1)
        return !(st == 'Z' || st == 'X' || st == 'x') && (!start || !now_start || now_start == start);
    /* /proc unreadable here: EPERM means the pid lives (another user's process): only ESRCH is death */
    return kill(pid, 0) == 0 || errno != ESRCH;
}

/* How badly peer q is gone (0: present), in the order a message prefers them. */
enum { NCCL_EMU_GONE_NOT, NCCL_EMU_GONE_FAILED, NCCL_EMU_GONE_DEPARTED, NCCL_EMU_GONE_ABORTED, NCCL_EMU_GONE_DEAD };

static int nccl_emu_peer_gone(const struct ncclComm *c, int q)
{
    struct nccl_emu_shm_rank *r = &c->shm->rank[q];
    if (q == c->rank || atomic_load(&r->attached) != 2)
        return NCCL_EMU_GONE_NOT; /* a peer that never attached has no pid to watch: its bound catches it */
    if (!nccl_emu_proc_alive(r->pid, r->start_ticks))
        return NCCL_EMU_GONE_DEAD;
    switch (atomic_load(&r->status)) {
    case NCCL_EMU_ST_ABORTED: return NCCL_EMU_GONE_ABORTED;
    case NCCL_EMU_ST_DEPARTED: return NCCL_EMU_GONE_DEPARTED;
    case NCCL_EMU_ST_FAILED: return NCCL_EMU_GONE_FAILED;
    default: return NCCL_EMU_GONE_NOT;
    }
}

/* The peers of mask that are gone; *worst gets the one a message names first (-1 when none). */
static uint64_t nccl_emu_gone_mask(const struct ncclComm *c, uint64_t mask, int *worst, int *worst_how)
{
    uint64_t g = 0;
    *worst = -1;
    *worst_how = NCCL_EMU_GONE_NOT;
    for (int q = 0; q < c->nranks; q++) {
        if (!(mask >> q & 1))
            continue;
        int how = nccl_emu_peer_gone(c, q);
        if (how == NCCL_EMU_GONE_NOT)
            continue;
        g |= (uint64_t)1 << q;
        if (how > *worst_how) {
            *worst = q;
            *worst_how = how;
        }
    }
    return g;
}

static void nccl_emu_gone_message(const struct ncclComm *c, int q, int how, const char *what, char *buf,
                                  size_t size)
{
    int pid = c->shm->rank[q].pid;
    switch (how) {
    case NCCL_EMU_GONE_DEAD: snprintf(buf, size, "peer rank %d (pid %d) exited during %s", q, pid, what); break;
    case NCCL_EMU_GONE_ABORTED:
        snprintf(buf, size, "peer rank %d (pid %d) aborted its communicator during %s", q, pid, what);
        break;
    case NCCL_EMU_GONE_DEPARTED:
        snprintf(buf, size, "peer rank %d (pid %d) finalized or destroyed its communicator before taking part in %s",
                 q, pid, what);
        break;
    default:
        snprintf(buf, size, "peer rank %d (pid %d) stopped during %s after an error of its own (see its log)", q,
                 pid, what);
    }
}

/* "ranks 1, 3" of a mask, for a timeout's message. */
static void nccl_emu_mask_text(uint64_t m, char *buf, size_t size)
{
    size_t at = (size_t)snprintf(buf, size, "rank%s", (m & (m - 1)) ? "s" : "");
    for (int q = 0; q < 64 && at < size; q++)
        if (m >> q & 1)
            at += (size_t)snprintf(buf + at, size - at, "%s%d", at > 5 ? ", " : " ", q);
}

/* Marks this rank's status for its peers (from RUNNING only: an abort or departure is never undone). */
static void nccl_emu_mark(struct ncclComm *c, uint32_t status)
{
    if (!c->shm)
        return;
    uint32_t running = NCCL_EMU_ST_RUNNING;
    if (atomic_compare_exchange_strong(&c->shm->rank[c->rank].status, &running, status))
        nccl_emu_ring_bell(c->shm);
}

/* ------------------------------------------------------------------------------------------------------------
 * Communicator lifetime */

static struct ncclComm *nccl_emu_comm_new(int nranks, int rank, bool blocking, const char *label)
{
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->magic = NCCL_EMU_COMM_MAGIC;
    atomic_init(&c->refs, 1);
    c->rank = rank;
    c->nranks = nranks;
    c->blocking = blocking;
    c->bound_s = nccl_emu_bound_s();
    snprintf(c->label, sizeof c->label, "%s", label ? label : "");
    atomic_init(&c->async_err, ncclSuccess);
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

static void nccl_emu_unref(struct ncclComm *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    if (c->shm)
        munmap(c->shm, c->shm_bytes);
    pthread_mutex_destroy(&c->mu);
    c->magic = 0;
    free(c);
}

static bool nccl_emu_is_aborted(const struct ncclComm *c)
{
    return atomic_load(&c->aborted) || (c->split_parent && atomic_load(&c->split_parent->aborted));
}

static bool nccl_emu_valid(const struct ncclComm *c)
{
    return c && c->magic == NCCL_EMU_COMM_MAGIC;
}

/* The name goes once every rank has it open, or when this rank's init failed: never left behind. */
static void nccl_emu_unlink(struct ncclComm *c)
{
    if (!c->unlinked && c->name[0])
        shm_unlink(c->name); /* ENOENT: a peer was first */
    c->unlinked = true;
}

/* Waits until fn(c, arg) returns no rank (a mask of the ranks it waits for), bounded by deadline, the abort flag
 * and the peers' presence. what names the step in messages. */
typedef uint64_t (*nccl_emu_missing_fn)(const struct ncclComm *c, uint64_t arg);

static ncclResult_t nccl_emu_await(struct ncclComm *c, const char *what, double deadline, nccl_emu_missing_fn fn,
                                   uint64_t arg)
{
    double t0 = clock_now_s(), next_check = t0 + 0.01;
    long nap_ns = 20000;
    char msg[512];
    for (;;) {
        uint32_t seen = atomic_load(&c->shm->doorbell);
        uint64_t m = fn(c, arg);
        if (!m)
            return ncclSuccess;
        if (nccl_emu_is_aborted(c)) {
            snprintf(msg, sizeof msg, "%s: the communicator was aborted", what);
            return nccl_emu_set_error(c, ncclInvalidUsage, msg);
        }
        double now = clock_now_s();
        if (now >= next_check) {
            next_check = now + 0.01;
            int q, how;
            uint64_t g = nccl_emu_gone_mask(c, m, &q, &how);
            /* a peer's arrival may have come just before it went: look again before blaming it */
            if (g && (fn(c, arg) & g)) {
                nccl_emu_gone_message(c, q, how, what, msg, sizeof msg);
                nccl_emu_mark(c, NCCL_EMU_ST_FAILED);
                return nccl_emu_set_error(c, ncclRemoteError, msg);
            }
        }
        if (now >= deadline) {
            char who[128];
            nccl_emu_mask_text(m, who, sizeof who);
            snprintf(msg, sizeof msg, "%s: %s did not arrive within %.1f s (0.9 x FSDP_COMM_TIMEOUT_S)", what, who,
                     c->bound_s);
            nccl_emu_mark(c, NCCL_EMU_ST_FAILED);
            return nccl_emu_set_error(c, ncclRemoteError, msg);
        }
        nccl_emu_pause(t0, &nap_ns, c->shm, seen, NCCL_EMU_SLICE_NS);
    }
}

static uint64_t nccl_emu_unattached(const struct ncclComm *c, uint64_t arg)
{
    (void)arg;
    uint64_t m = 0;
    for (int q = 0; q < c->nranks; q++)
        if (atomic_load(&c->shm->rank[q].attached) != 2)
            m |= (uint64_t)1 << q;
    return m;
}

static uint64_t nccl_emu_ctrl_missing(const struct ncclComm *c, uint64_t phase)
{
    uint64_t m = 0;
    for (int q = 0; q < c->nranks; q++)
        if (atomic_load(&c->shm->rank[q].ctrl_arrive) < phase)
            m |= (uint64_t)1 << q;
    return m;
}

/* Finalize's barrier: a peer that destroyed the communicator without finalizing it has left as a finalize
 * would (NCCL's ncclCommDestroy finalizes implicitly): it counts as arrived. */
static uint64_t nccl_emu_fin_missing(const struct ncclComm *c, uint64_t phase)
{
    uint64_t m = nccl_emu_ctrl_missing(c, phase);
    for (int q = 0; q < c->nranks; q++)
        if ((m >> q & 1) && atomic_load(&c->shm->rank[q].status) == NCCL_EMU_ST_DEPARTED)
            m &= ~((uint64_t)1 << q);
    return m;
}

/* Opens (or creates) the segment and maps it: the init's first half. */
static ncclResult_t nccl_emu_attach(struct ncclComm *c, double deadline)
{
    size_t bytes = nccl_emu_shm_bytes(c->nranks);
    char msg[512];
    int fd = -1;
    bool creator = false;
    double t0 = clock_now_s();
    long nap_ns = 20000;
    for (;;) {
        fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) {
            creator = true;
            break;
        }
        if (errno == EEXIST) {
            fd = shm_open(c->name, O_RDWR | O_CLOEXEC, 0);
            if (fd >= 0)
                break;
        }
        if (errno != ENOENT) { /* ENOENT: the creator unlinked it between our two opens: try again */
            snprintf(msg, sizeof msg, "init: shm_open(%s): %s", c->name, strerror(errno));
            return nccl_emu_set_error(c, ncclSystemError, msg);
        }
        if (nccl_emu_is_aborted(c) || clock_now_s() >= deadline) {
            snprintf(msg, sizeof msg, "init: could not open %s", c->name);
            return nccl_emu_set_error(c, ncclSystemError, msg);
        }
        nccl_emu_pause(t0, &nap_ns, NULL, 0, 0);
    }
    if (creator) {
        int e = ftruncate(fd, (off_t)bytes) ? errno : posix_fallocate(fd, 0, (off_t)bytes);
        void *m = e ? MAP_FAILED : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            if (!e)
                e = errno;
            /* the peers waiting for the ready word learn at once that it will not come */
            void *h = mmap(NULL, sizeof(struct nccl_emu_shm), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (h != MAP_FAILED) {
                atomic_store(&((struct nccl_emu_shm *)h)->ready, NCCL_EMU_SHM_BROKEN);
                munmap(h, sizeof(struct nccl_emu_shm));
            }
            close(fd);
            nccl_emu_unlink(c);
            snprintf(msg, sizeof msg, "init: cannot reserve %zu bytes of shared memory for %d ranks (%s): is /dev/shm "
                     "full?", bytes, c->nranks, strerror(e));
            return nccl_emu_set_error(c, ncclSystemError, msg);
        }
        close(fd);
        c->shm = m;
        c->shm_bytes = bytes;
        c->shm->layout = NCCL_EMU_LAYOUT;
        c->shm->nranks = (uint32_t)c->nranks;
        c->shm->bytes = bytes;
        atomic_store(&c->shm->ready, NCCL_EMU_SHM_READY);
    } else {
        /* the creator sizes the segment in one ftruncate: it is 0 bytes, then all of them */
        struct stat st;
        for (;;) {
            if (fstat(fd, &st) != 0) {
                snprintf(msg, sizeof msg, "init: fstat(%s): %s", c->name, strerror(errno));
                close(fd);
                return nccl_emu_set_error(c, ncclSystemError, msg);
            }
            if (st.st_size > 0)
                break;
            if (nccl_emu_is_aborted(c) || clock_now_s() >= deadline) {
                close(fd);
                nccl_emu_unlink(c);
                snprintf(msg, sizeof msg, "init: the rank that created %s never sized it within %.1f s", c->name,
                         c->bound_s);
                return nccl_emu_set_error(c, ncclRemoteError, msg);
            }
            nccl_emu_pause(t0, &nap_ns, NULL, 0, 0);
        }
        if ((size_t)st.st_size != bytes) {
            close(fd);
            snprintf(msg, sizeof msg, "init: the ranks disagree on the number of ranks: this rank says %d, the "
                     "communicator was created for another count (%lld bytes of shared memory, not %zu)", c->nranks,
                     (long long)st.st_size, bytes);
            return nccl_emu_set_error(c, ncclInvalidArgument, msg);
        }
        void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        int e = errno;
        close(fd);
        if (m == MAP_FAILED) {
            snprintf(msg, sizeof msg, "init: mmap of %zu bytes: %s", bytes, strerror(e));
            return nccl_emu_set_error(c, ncclSystemError, msg);
        }
        c->shm = m;
        c->shm_bytes = bytes;
        for (;;) {
            uint32_t r = atomic_load(&c->shm->ready);
            if (r == NCCL_EMU_SHM_READY)
                break;
            if (r == NCCL_EMU_SHM_BROKEN || nccl_emu_is_aborted(c) || clock_now_s() >= deadline) {
                nccl_emu_unlink(c);
                snprintf(msg, sizeof msg, "init: the rank that created %s failed before initialising it", c->name);
                return nccl_emu_set_error(c, ncclRemoteError, msg);
            }
            nccl_emu_pause(t0, &nap_ns, NULL, 0, 0);
        }
        if (c->shm->nranks != (uint32_t)c->nranks || c->shm->layout != NCCL_EMU_LAYOUT) {
            snprintf(msg, sizeof msg, "init: the ranks disagree on the number of ranks: this rank says %d, the "
                     "creator %u", c->nranks, c->shm->nranks);
            return nccl_emu_set_error(c, ncclInvalidArgument, msg);
        }
    }
    c->stage = (unsigned char *)c->shm + nccl_emu_hdr_bytes();
    c->rings = c->stage + (size_t)c->nranks * NCCL_EMU_STAGE_BYTES;
    return ncclSuccess;
}

/* The init: attach, claim this rank's record, wait for every rank, unlink the name. */
static ncclResult_t nccl_emu_init_task(struct ncclComm *c, double deadline)
{
    ncclResult_t r = nccl_emu_attach(c, deadline);
    if (r != ncclSuccess) {
        nccl_emu_unlink(c);
        return r;
    }
    struct nccl_emu_shm_rank *me = &c->shm->rank[c->rank];
    uint32_t free_slot = 0;
    if (!atomic_compare_exchange_strong(&me->attached, &free_slot, 1)) {
        char msg[256];
        snprintf(msg, sizeof msg, "init: rank %d joined twice (two processes passed the same rank and id)", c->rank);
        nccl_emu_unlink(c);
        return nccl_emu_set_error(c, ncclInvalidUsage, msg);
    }
    me->pid = (int32_t)getpid();
    me->start_ticks = nccl_emu_proc_start(getpid());
    atomic_store(&me->status, NCCL_EMU_ST_RUNNING);
    atomic_store(&me->attached, 2);
    nccl_emu_ring_bell(c->shm);
    r = nccl_emu_await(c, "init", deadline, nccl_emu_unattached, 0);
    nccl_emu_unlink(c);
    return r;
}

/* fnv-1a: the child's segment name, which every member computes alike from what they share. */
static uint64_t nccl_emu_hash(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The split, on the parent: exchange (color, key) in a control phase, then make this rank's child. */
static ncclResult_t nccl_emu_split_task(struct ncclComm *p, double deadline)
{
    struct nccl_emu_shm *s = p->shm;
    uint64_t ph = p->ctrl_phase;
    int half = (int)(ph & 1);
    s->rank[p->rank].color[half] = p->bgt.color;
    s->rank[p->rank].key[half] = p->bgt.key;
    atomic_store(&s->rank[p->rank].ctrl_arrive, ph + 1);
    nccl_emu_ring_bell(s);
    ncclResult_t r = nccl_emu_await(p, "split", deadline, nccl_emu_ctrl_missing, ph + 1);
    if (r != ncclSuccess)
        return r;
    int color[NCCL_EMU_MAX_RANKS], key[NCCL_EMU_MAX_RANKS];
    for (int q = 0; q < p->nranks; q++) {
        color[q] = s->rank[q].color[half];
        key[q] = s->rank[q].key[half];
    }
    p->ctrl_phase = ph + 1;
    if (p->bgt.color == NCCL_SPLIT_NOCOLOR)
        return ncclSuccess;
    /* members of this color ordered by (key, parent rank) */
    int n = 0, me = 0;
    for (int q = 0; q < p->nranks; q++) {
        if (color[q] != p->bgt.color)
            continue;
        n++;
        if (key[q] < key[p->rank] || (key[q] == key[p->rank] && q < p->rank))
            me++;
    }
    struct ncclComm *c = nccl_emu_comm_new(n, me, p->bgt.child_blocking, p->bgt.child_label);
    if (!c)
        return nccl_emu_set_error(p, ncclSystemError, "split: out of memory");
    snprintf(c->tag, sizeof c->tag, "%s", p->tag);
    uint64_t h = nccl_emu_hash(0xcbf29ce484222325ull, p->name, strlen(p->name));
    h = nccl_emu_hash(h, &ph, sizeof ph);
    h = nccl_emu_hash(h, &p->bgt.color, sizeof p->bgt.color);
    snprintf(c->name, sizeof c->name, NCCL_EMU_PREFIX "%s-%016llx", c->tag, (unsigned long long)h);
    atomic_store(&c->bg_busy, true);
    c->split_parent = p;
    r = nccl_emu_init_task(c, deadline);
    c->split_parent = NULL;
    atomic_store(&c->bg_busy, false);
    if (r != ncclSuccess) {
        char msg[700];
        snprintf(msg, sizeof msg, "split (color %d, key %d): making the child failed: %s", p->bgt.color, p->bgt.key,
                 c->err);
        atomic_store(&c->aborted, true);
        nccl_emu_mark(c, NCCL_EMU_ST_ABORTED);
        nccl_emu_unref(c);
        return nccl_emu_set_error(p, r, msg);
    }
    /* fsdpc polls the handle through a volatile: the child is complete before it appears */
    __atomic_store_n(p->bgt.newcomm, c, __ATOMIC_RELEASE);
    return ncclSuccess;
}

/* Finalize: every op of this communicator done, then a control barrier with the peers. */
static ncclResult_t nccl_emu_finalize_task(struct ncclComm *c, double deadline)
{
    double t0 = clock_now_s();
    long nap_ns = 20000;
    char msg[256];
    while (atomic_load(&c->pending) > 0) {
        if (atomic_load(&c->aborted))
            return nccl_emu_set_error(c, ncclInvalidUsage, "finalize: the communicator was aborted");
        if (clock_now_s() >= deadline) {
            snprintf(msg, sizeof msg, "finalize: %ld operations of this communicator were still queued or running "
                     "after %.1f s", atomic_load(&c->pending), c->bound_s);
            return nccl_emu_set_error(c, ncclInternalError, msg);
        }
        nccl_emu_pause(t0, &nap_ns, NULL, 0, 0);
    }
    ncclResult_t r = atomic_load(&c->async_err);
    if (r != ncclSuccess)
        return r;
    uint64_t ph = c->ctrl_phase;
    atomic_store(&c->shm->rank[c->rank].ctrl_arrive, ph + 1);
    nccl_emu_ring_bell(c->shm);
    r = nccl_emu_await(c, "finalize", deadline, nccl_emu_fin_missing, ph + 1);
    if (r != ncclSuccess)
        return r;
    c->ctrl_phase = ph + 1;
    atomic_store(&c->finalized, true);
    nccl_emu_mark(c, NCCL_EMU_ST_DEPARTED);
    return ncclSuccess;
}

static ncclResult_t nccl_emu_task_run(struct ncclComm *c)
{
    double deadline = clock_now_s() + c->bound_s;
    switch (c->bgt.task) {
    case NCCL_EMU_TASK_INIT: return nccl_emu_init_task(c, deadline);
    case NCCL_EMU_TASK_SPLIT: return nccl_emu_split_task(c, deadline);
    case NCCL_EMU_TASK_FINALIZE: return nccl_emu_finalize_task(c, deadline);
    }
    return ncclInternalError;
}

static void *nccl_emu_bg_main(void *arg)
{
    struct ncclComm *c = arg;
    nccl_emu_task_run(c);
    atomic_store(&c->bg_busy, false);
    return NULL;
}

/* Joins the finished (or finishing: bounded) background thread, if there is one. */
static void nccl_emu_bg_join(struct ncclComm *c)
{
    pthread_mutex_lock(&c->mu);
    bool j = c->bg_joinable;
    pthread_t t = c->bg;
    c->bg_joinable = false;
    pthread_mutex_unlock(&c->mu);
    if (j)
        pthread_join(t, NULL);
}

/* Runs c->bgt: in the call (blocking) or on a background thread (nonblocking: ncclInProgress). */
static ncclResult_t nccl_emu_task_start(struct ncclComm *c, bool blocking)
{
    if (blocking) {
        /* held while it runs: an ncclCommAbort from another thread frees it only after */
        atomic_fetch_add(&c->refs, 1);
        atomic_store(&c->bg_busy, true);
        ncclResult_t r = nccl_emu_task_run(c);
        atomic_store(&c->bg_busy, false);
        nccl_emu_unref(c);
        return r;
    }
    nccl_emu_bg_join(c);
    atomic_store(&c->bg_busy, true);
    pthread_mutex_lock(&c->mu);
    int e = pthread_create(&c->bg, NULL, nccl_emu_bg_main, c);
    c->bg_joinable = e == 0;
    pthread_mutex_unlock(&c->mu);
    if (e) {
        atomic_store(&c->bg_busy, false);
        char msg[128];
        snprintf(msg, sizeof msg, "cannot start the communicator's thread: %s", strerror(e));
        return nccl_emu_set_error(c, ncclSystemError, msg);
    }
    return ncclInProgress;
}

/* ------------------------------------------------------------------------------------------------------------
 * Types and reductions */

static size_t nccl_emu_type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
    }
}

static bool nccl_emu_type_reducible(ncclDataType_t t)
{
    return t == ncclFloat32 || t == ncclBfloat16 || t == ncclFloat16;
}

static const char *nccl_emu_kind_name(int kind)
{
    static const char *const names[] = {"all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "send",
                                        "recv"};
    return kind >= 0 && kind <= NCCL_EMU_RECV ? names[kind] : "?";
}

static bool nccl_emu_is_p2p(int kind)
{
    return kind == NCCL_EMU_SEND || kind == NCCL_EMU_RECV;
}

static void nccl_emu_load(ncclDataType_t t, const unsigned char *src, float *out, size_t m)
{
    if (t == ncclFloat32) {
        memcpy(out, src, m * sizeof(float));
    } else if (t == ncclBfloat16) {
        const uint16_t *h = (const uint16_t *)src;
        for (size_t i = 0; i < m; i++)
            out[i] = dtype_bf16_to_f32(h[i]);
    } else {
        const uint16_t *h = (const uint16_t *)src;
        for (size_t i = 0; i < m; i++)
            out[i] = dtype_f16_to_f32(h[i]);
    }
}

static void nccl_emu_store(ncclDataType_t t, unsigned char *dst, const float *in, size_t m)
{
    if (t == ncclFloat32) {
        memcpy(dst, in, m * sizeof(float));
    } else if (t == ncclBfloat16) {
        uint16_t *h = (uint16_t *)dst;
        for (size_t i = 0; i < m; i++)
            h[i] = dtype_f32_to_bf16(in[i]);
    } else {
        uint16_t *h = (uint16_t *)dst;
        for (size_t i = 0; i < m; i++)
            h[i] = dtype_f32_to_f16(in[i]);
    }
}

/* fmaxf/fminf without libm: a NaN operand yields the other one, as CUDA's fmaxf does. */
static float nccl_emu_max(float a, float b)
{
    return a != a ? b : b != b ? a : a > b ? a : b;
}

static float nccl_emu_min(float a, float b)
{
    return a != a ? b : b != b ? a : a < b ? a : b;
}

/* dst[i] = src[0][i] op src[1][i] op ... op src[n-1][i], in fp32 in rank order, rounded once. */
static void nccl_emu_reduce(ncclDataType_t t, ncclRedOp_t op, int n, const unsigned char *const *src,
                            unsigned char *dst, size_t len)
{
    size_t es = nccl_emu_type_size(t);
    float acc[NCCL_EMU_BLK], v[NCCL_EMU_BLK];
    for (size_t b = 0; b < len; b += NCCL_EMU_BLK) {
        size_t m = len - b < NCCL_EMU_BLK ? len - b : NCCL_EMU_BLK;
        nccl_emu_load(t, src[0] + b * es, acc, m);
        for (int q = 1; q < n; q++) {
            nccl_emu_load(t, src[q] + b * es, v, m);
            switch (op) {
            case ncclSum:
            case ncclAvg:
                for (size_t i = 0; i < m; i++)
                    acc[i] += v[i];
                break;
            case ncclProd:
                for (size_t i = 0; i < m; i++)
                    acc[i] *= v[i];
                break;
            case ncclMax:
                for (size_t i = 0; i < m; i++)
                    acc[i] = nccl_emu_max(acc[i], v[i]);
                break;
            default:
                for (size_t i = 0; i < m; i++)
                    acc[i] = nccl_emu_min(acc[i], v[i]);
            }
        }
        if (op == ncclAvg)
            for (size_t i = 0; i < m; i++)
                acc[i] /= (float)n;
        nccl_emu_store(t, dst + b * es, acc, m);
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * Ops: collectives and messages queued on a stream */

struct nccl_emu_item {
    struct ncclComm *comm;
    cudaStream_t stream;
    int kind;
    const void *send; /* host-view addresses, as the caller gave them */
    void *recv;
    size_t count; /* elements: per rank for all_gather (sendcount) and reduce_scatter (recvcount) */
    ncclDataType_t type;
    ncclRedOp_t redop;
    int peer; /* the root of reduce and broadcast; the peer of send and recv */
    /* progress, on the op's thread */
    int ci; /* index of comm in the op's comms */
    const unsigned char *ds;
    unsigned char *dr;
    size_t es, per, steps, step; /* collectives: elements per phase (per destination for reduce_scatter) */
    bool waiting;                /* a collective's phase is published; waiting for the peers' */
    uint64_t phase;
    bool hdr;                  /* a message's header is in the ring */
    uint64_t bytes, span, moved; /* a message's bytes, padded to the header size, and how many moved */
    bool done;
};

struct nccl_emu_op {
    int nitems, ncomms;
    struct ncclComm **comms; /* distinct, ordered by address: claimed in that order */
    bool *claimed;           /* per comm: this op holds its op_busy */
    bool *live;              /* per comm: claimed, not failed or aborted during this op */
    struct nccl_emu_item *items;
};

static unsigned char *nccl_emu_slot(const struct ncclComm *c, int q, uint64_t phase)
{
    return c->stage + (size_t)q * NCCL_EMU_STAGE_BYTES + (size_t)(phase & 1) * NCCL_EMU_HALF_BYTES;
}

static struct nccl_emu_sig nccl_emu_item_sig(const struct nccl_emu_item *it)
{
    bool red = it->kind == NCCL_EMU_ALL_REDUCE || it->kind == NCCL_EMU_REDUCE || it->kind == NCCL_EMU_REDUCE_SCATTER;
    bool rooted = it->kind == NCCL_EMU_REDUCE || it->kind == NCCL_EMU_BROADCAST;
    struct nccl_emu_sig s = {it->kind, (int32_t)it->type, red ? (int32_t)it->redop : -1, rooted ? it->peer : -1,
                             it->count};
    return s;
}

/* A step's failure: the op fails the item's communicator with this. */
struct nccl_emu_fail {
    ncclResult_t code;
    char msg[512];
};

/* One collective's progress: publish a phase, or consume it once every rank published it. 1 when it moved,
 * 0 when it waits for peers, -1 when it failed (*f says why). */
static int nccl_emu_coll_step(struct nccl_emu_item *it, struct nccl_emu_fail *f)
{
    struct ncclComm *c = it->comm;
    struct nccl_emu_shm *s = c->shm;
    int n = c->nranks, me = c->rank;
    size_t es = it->es;
    int moved = 0;
    while (!it->done) {
        size_t off = it->step * it->per;
        size_t len = it->count - off < it->per ? it->count - off : it->per;
        if (!it->waiting) {
            it->phase = c->coll_phase;
            unsigned char *slot = nccl_emu_slot(c, me, it->phase);
            switch (it->kind) {
            case NCCL_EMU_ALL_REDUCE:
            case NCCL_EMU_REDUCE:
            case NCCL_EMU_ALL_GATHER: memcpy(slot, it->ds + off * es, len * es); break;
            case NCCL_EMU_BROADCAST:
                if (me == it->peer)
                    memcpy(slot, it->ds + off * es, len * es);
                break;
            case NCCL_EMU_REDUCE_SCATTER:
                for (int d = 0; d < n; d++)
                    memcpy(slot + (size_t)d * it->per * es, it->ds + ((size_t)d * it->count + off) * es, len * es);
                break;
            }
            s->rank[me].sig[it->phase & 1] = nccl_emu_item_sig(it);
            atomic_store(&s->rank[me].coll_arrive, it->phase + 1);
            nccl_emu_ring_bell(s);
            it->waiting = true;
            moved = 1;
        }
        for (int q = 0; q < n; q++)
            if (atomic_load(&s->rank[q].coll_arrive) < it->phase + 1)
                return moved;
        /* Every rank published this phase (none can be further on: the next phase needs this rank too). */
        struct nccl_emu_sig mine = nccl_emu_item_sig(it);
        for (int q = 0; q < n; q++) {
            struct nccl_emu_sig o = s->rank[q].sig[it->phase & 1];
            if (memcmp(&o, &mine, sizeof o)) {
                f->code = ncclInvalidUsage;
                snprintf(f->msg, sizeof f->msg, "%s (count %llu, type %d, op %d, root %d): rank %d issued %s (count "
                         "%llu, type %d, op %d, root %d) at the same point: every rank must issue the same "
                         "collectives in the same order", nccl_emu_kind_name(it->kind),
                         (unsigned long long)mine.count, mine.type, mine.redop, mine.root, q,
                         nccl_emu_kind_name(o.kind), (unsigned long long)o.count, o.type, o.redop, o.root);
                return -1;
            }
        }
        const unsigned char *src[NCCL_EMU_MAX_RANKS];
        switch (it->kind) {
        case NCCL_EMU_ALL_REDUCE:
        case NCCL_EMU_REDUCE:
            if (it->kind == NCCL_EMU_ALL_REDUCE || me == it->peer) {
                for (int q = 0; q < n; q++)
                    src[q] = nccl_emu_slot(c, q, it->phase);
                nccl_emu_reduce(it->type, it->redop, n, src, it->dr + off * es, len);
            }
            break;
        case NCCL_EMU_BROADCAST:
            memcpy(it->dr + off * es, nccl_emu_slot(c, it->peer, it->phase), len * es);
            break;
        case NCCL_EMU_ALL_GATHER:
            for (int q = 0; q < n; q++)
                memcpy(it->dr + ((size_t)q * it->count + off) * es, nccl_emu_slot(c, q, it->phase), len * es);
            break;
        case NCCL_EMU_REDUCE_SCATTER:
            for (int q = 0; q < n; q++)
                src[q] = nccl_emu_slot(c, q, it->phase) + (size_t)me * it->per * es;
            nccl_emu_reduce(it->type, it->redop, n, src, it->dr + off * es, len);
            break;
        }
        c->coll_phase = it->phase + 1;
        it->waiting = false;
        if (++it->step == it->steps)
            it->done = true;
        moved = 1;
        emu_random_delay();
    }
    return moved;
}

/* One message's progress through its ring (this rank -> peer for a send, peer -> this rank for a recv). */
static int nccl_emu_p2p_step(struct nccl_emu_item *it, struct nccl_emu_fail *f)
{
    struct ncclComm *c = it->comm;
    int n = c->nranks, me = c->rank;
    bool send = it->kind == NCCL_EMU_SEND;
    size_t ri = send ? (size_t)me * n + it->peer : (size_t)it->peer * n + me;
    struct nccl_emu_shm_ring *ring = &c->shm->ring[ri];
    unsigned char *data = c->rings + ri * NCCL_EMU_RING_BYTES;
    int moved = 0;
    if (send) {
        uint64_t head = atomic_load_explicit(&ring->head, memory_order_relaxed); /* ours alone */
        uint64_t room = NCCL_EMU_RING_BYTES - (head - atomic_load(&ring->tail));
        if (!it->hdr) {
            if (room < NCCL_EMU_MSG_HDR)
                return 0;
            struct nccl_emu_msg m = {it->bytes, NCCL_EMU_MSG_MAGIC, 0};
            memcpy(data + head % NCCL_EMU_RING_BYTES, &m, sizeof m);
            head += NCCL_EMU_MSG_HDR;
            room -= NCCL_EMU_MSG_HDR;
            it->hdr = true;
            moved = 1;
        }
        while (room && it->moved < it->span) {
            uint64_t pos = head % NCCL_EMU_RING_BYTES, k = it->span - it->moved;
            if (k > room)
                k = room;
            if (k > NCCL_EMU_RING_BYTES - pos)
                k = NCCL_EMU_RING_BYTES - pos;
            if (it->moved < it->bytes) /* the padding after the payload carries nothing */
                memcpy(data + pos, it->ds + it->moved, it->bytes - it->moved < k ? it->bytes - it->moved : k);
            head += k;
            room -= k;
            it->moved += k;
            moved = 1;
        }
        if (moved) {
            atomic_store(&ring->head, head);
            nccl_emu_ring_bell(c->shm);
        }
    } else {
        uint64_t tail = atomic_load_explicit(&ring->tail, memory_order_relaxed);
        uint64_t avail = atomic_load(&ring->head) - tail;
        if (!it->hdr) {
            if (avail < NCCL_EMU_MSG_HDR)
                return 0;
            struct nccl_emu_msg m;
            memcpy(&m, data + tail % NCCL_EMU_RING_BYTES, sizeof m);
            if (m.magic != NCCL_EMU_MSG_MAGIC || m.bytes != it->bytes) {
                f->code = ncclInvalidUsage;
                if (m.magic != NCCL_EMU_MSG_MAGIC)
                    snprintf(f->msg, sizeof f->msg, "recv from rank %d: the channel is corrupt (no message header)",
                             it->peer);
                else
                    snprintf(f->msg, sizeof f->msg, "recv from rank %d: it sent %llu bytes, this recv expects %llu "
                             "(sends and recvs must match in count and type, in issue order)", it->peer,
                             (unsigned long long)m.bytes, (unsigned long long)it->bytes);
                return -1;
            }
            tail += NCCL_EMU_MSG_HDR;
            avail -= NCCL_EMU_MSG_HDR;
            it->hdr = true;
            moved = 1;
        }
        while (avail && it->moved < it->span) {
            uint64_t pos = tail % NCCL_EMU_RING_BYTES, k = it->span - it->moved;
            if (k > avail)
                k = avail;
            if (k > NCCL_EMU_RING_BYTES - pos)
                k = NCCL_EMU_RING_BYTES - pos;
            if (it->moved < it->bytes)
                memcpy(it->dr + it->moved, data + pos, it->bytes - it->moved < k ? it->bytes - it->moved : k);
            tail += k;
            avail -= k;
            it->moved += k;
            moved = 1;
        }
        if (moved) {
            atomic_store(&ring->tail, tail);
            nccl_emu_ring_bell(c->shm);
        }
    }
    if (it->moved == it->span && it->hdr) {
        it->done = true;
        emu_random_delay();
    }
    return moved;
}

/* Whether item i may progress now: the first unfinished collective of its communicator, or its communicator's
 * first unfinished send to (recv from) its peer. Collectives and each pair's messages keep their issue order;
 * everything else progresses together. */
static bool nccl_emu_item_active(const struct nccl_emu_op *op, int i)
{
    const struct nccl_emu_item *it = &op->items[i];
    if (it->done)
        return false;
    for (int j = 0; j < i; j++) {
        const struct nccl_emu_item *o = &op->items[j];
        if (o->done || o->comm != it->comm)
            continue;
        if (nccl_emu_is_p2p(it->kind) ? o->kind == it->kind && o->peer == it->peer : !nccl_emu_is_p2p(o->kind))
            return false;
    }
    return true;
}

/* The peers comm k's active items wait for, and (first) the name of the step waiting for them. */
static uint64_t nccl_emu_op_blocked(const struct nccl_emu_op *op, int k, uint64_t only, const char **what)
{
    uint64_t m = 0;
    for (int i = 0; i < op->nitems; i++) {
        const struct nccl_emu_item *it = &op->items[i];
        if (it->ci != k || !nccl_emu_item_active(op, i))
            continue;
        uint64_t b = 0;
        if (nccl_emu_is_p2p(it->kind)) {
            b = (uint64_t)1 << it->peer;
        } else if (it->waiting) {
            for (int q = 0; q < it->comm->nranks; q++)
                if (atomic_load(&it->comm->shm->rank[q].coll_arrive) < it->phase + 1)
                    b |= (uint64_t)1 << q;
        }
        if (what && (b & only) && !*what)
            *what = nccl_emu_kind_name(it->kind);
        m |= b;
    }
    return m;
}

/* Ends comm k's part of the op: its remaining items are dropped; with code != ncclSuccess the communicator
 * gets the error and its peers see this rank failed. */
static void nccl_emu_op_drop(struct nccl_emu_op *op, int k, ncclResult_t code, const char *msg)
{
    struct ncclComm *c = op->comms[k];
    if (code != ncclSuccess) {
        nccl_emu_set_error(c, code, msg);
        nccl_emu_mark(c, NCCL_EMU_ST_FAILED);
    }
    for (int i = 0; i < op->nitems; i++)
        if (op->items[i].ci == k)
            op->items[i].done = true;
    op->live[k] = false;
}

static int nccl_emu_op_sweep(struct nccl_emu_op *op)
{
    int moved = 0;
    for (int i = 0; i < op->nitems; i++) {
        if (!nccl_emu_item_active(op, i))
            continue;
        struct nccl_emu_item *it = &op->items[i];
        struct nccl_emu_fail f = {ncclSuccess, ""};
        int r = nccl_emu_is_p2p(it->kind) ? nccl_emu_p2p_step(it, &f) : nccl_emu_coll_step(it, &f);
        if (r < 0)
            nccl_emu_op_drop(op, it->ci, f.code, f.msg);
        else
            moved |= r;
    }
    return moved;
}

/* Claims comm c for this op (ops of one communicator never overlap: they share its phases and rings), waiting
 * while an op on another stream has it. False when the communicator is aborted, failed or the wait too long. */
static bool nccl_emu_claim(struct ncclComm *c)
{
    double t0 = clock_now_s();
    long nap_ns = 20000;
    for (;;) {
        if (atomic_load(&c->aborted) || atomic_load(&c->async_err) != ncclSuccess)
            return false;
        bool idle = false;
        if (atomic_compare_exchange_strong(&c->op_busy, &idle, true))
            return true;
        if (clock_now_s() - t0 > c->bound_s) {
            char msg[256];
            snprintf(msg, sizeof msg, "an op waited %.1f s for another op of the same communicator (queued on "
                     "another stream) to finish", c->bound_s);
            nccl_emu_set_error(c, ncclInternalError, msg);
            nccl_emu_mark(c, NCCL_EMU_ST_FAILED);
            return false;
        }
        nccl_emu_pause(t0, &nap_ns, NULL, 0, 0);
    }
}

static void nccl_emu_op_run(void *arg)
{
    struct nccl_emu_op *op = arg;
    for (int k = 0; k < op->ncomms; k++)
        op->live[k] = op->claimed[k] = nccl_emu_claim(op->comms[k]);
    for (int i = 0; i < op->nitems; i++) {
        struct nccl_emu_item *it = &op->items[i];
        if (!op->live[it->ci]) {
            it->done = true; /* aborted or failed before: the op does nothing, the stream goes on */
            continue;
        }
        int n = it->comm->nranks;
        it->es = nccl_emu_type_size(it->type);
        it->ds = it->send ? emu_dev(it->send) : NULL;
        it->dr = it->recv ? emu_dev(it->recv) : NULL;
        if (nccl_emu_is_p2p(it->kind)) {
            it->bytes = (uint64_t)it->count * it->es;
            it->span = (it->bytes + NCCL_EMU_MSG_HDR - 1) / NCCL_EMU_MSG_HDR * NCCL_EMU_MSG_HDR;
            it->done = it->bytes == 0; /* NCCL skips empty messages on both sides */
        } else {
            it->per = NCCL_EMU_HALF_BYTES / it->es / (it->kind == NCCL_EMU_REDUCE_SCATTER ? (size_t)n : 1);
            it->steps = (it->count + it->per - 1) / it->per;
            it->done = it->steps == 0;
        }
    }
    double t0 = clock_now_s(), next_check = t0 + 0.01; /* t0: the last progress */
    long nap_ns = 20000;
    for (;;) {
        int live = 0, one = -1;
        for (int k = 0; k < op->ncomms; k++)
            if (op->live[k]) {
                live++;
                one = k;
            }
        /* one communicator: sleep on its doorbell, which every relevant change rings; several: nap */
        struct nccl_emu_shm *bell = live == 1 ? op->comms[one]->shm : NULL;
        uint32_t seen = bell ? atomic_load(&bell->doorbell) : 0;
        int moved = nccl_emu_op_sweep(op);
        bool all = true;
        for (int i = 0; i < op->nitems && all; i++)
            all = op->items[i].done;
        if (all)
            break;
        if (moved) {
            t0 = clock_now_s();
            nap_ns = 20000;
            continue;
        }
        double now = clock_now_s();
        bool check = now >= next_check;
        if (check)
            next_check = now + 0.01;
        for (int k = 0; k < op->ncomms; k++) {
            if (!op->live[k])
                continue;
            struct ncclComm *c = op->comms[k];
            if (atomic_load(&c->aborted)) {
                nccl_emu_op_drop(op, k, ncclSuccess, NULL);
                continue;
            }
            if (check) {
                int q, how;
                uint64_t g = nccl_emu_gone_mask(c, nccl_emu_op_blocked(op, k, ~(uint64_t)0, NULL), &q, &how);
                if (g) {
                    /* what a peer wrote before it went may finish the step: sweep once more before blaming it */
                    nccl_emu_op_sweep(op);
                    const char *what = NULL;
                    uint64_t still = op->live[k] ? nccl_emu_op_blocked(op, k, g, &what) & g : 0;
                    if (still) {
                        char msg[512];
                        nccl_emu_gone_mask(c, still, &q, &how);
                        nccl_emu_gone_message(c, q, how, what ? what : "an operation", msg, sizeof msg);
                        nccl_emu_op_drop(op, k, ncclRemoteError, msg);
                    }
                    continue;
                }
            }
            /* bounded since the last progress: a long transfer that moves is no hang */
            if (now - t0 > c->bound_s) {
                const char *what = NULL;
                uint64_t b = nccl_emu_op_blocked(op, k, ~(uint64_t)0, &what);
                char who[128], msg[512];
                nccl_emu_mask_text(b, who, sizeof who);
                snprintf(msg, sizeof msg, "%s: waited %.1f s (0.9 x FSDP_COMM_TIMEOUT_S) for %s, which did not take "
                         "part", what ? what : "an operation", c->bound_s, who);
                nccl_emu_op_drop(op, k, ncclRemoteError, msg);
            }
        }
        if (bell && !op->live[one])
            continue; /* just dropped: the op ends now, without sleeping a slice first */
        nccl_emu_pause(t0, &nap_ns, bell, seen, NCCL_EMU_SLICE_NS);
    }
    for (int k = 0; k < op->ncomms; k++)
        if (op->claimed[k])
            atomic_store(&op->comms[k]->op_busy, false);
}

static void nccl_emu_op_release(void *arg)
{
    struct nccl_emu_op *op = arg;
    for (int k = 0; k < op->ncomms; k++) {
        atomic_fetch_sub(&op->comms[k]->pending, 1);
        nccl_emu_unref(op->comms[k]);
    }
    free(op);
}

static int nccl_emu_cmp_comm(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (struct ncclComm *const *)a, y = (uintptr_t) * (struct ncclComm *const *)b;
    return x < y ? -1 : x > y;
}

/* Queues items (all of one stream, in issue order) as one op. */
static ncclResult_t nccl_emu_queue(const struct nccl_emu_item *items, int n)
{
    size_t bytes = sizeof(struct nccl_emu_op) + (size_t)n * (sizeof(struct nccl_emu_item) + sizeof(struct ncclComm *))
                   + 2 * (size_t)n * sizeof(bool);
    struct nccl_emu_op *op = calloc(1, bytes);
    if (!op)
        return nccl_emu_note(ncclSystemError, "out of memory queueing %d NCCL operations", n);
    op->items = (struct nccl_emu_item *)(op + 1);
    op->comms = (struct ncclComm **)(op->items + n);
    op->claimed = (bool *)(op->comms + n);
    op->live = op->claimed + n;
    op->nitems = n;
    memcpy(op->items, items, (size_t)n * sizeof *items);
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < op->ncomms && op->comms[k] != items[i].comm)
            k++;
        if (k == op->ncomms)
            op->comms[op->ncomms++] = items[i].comm;
    }
    qsort(op->comms, (size_t)op->ncomms, sizeof *op->comms, nccl_emu_cmp_comm);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < op->ncomms; k++)
            if (op->comms[k] == op->items[i].comm)
                op->items[i].ci = k;
    for (int k = 0; k < op->ncomms; k++) {
        atomic_fetch_add(&op->comms[k]->refs, 1);
        atomic_fetch_add(&op->comms[k]->pending, 1);
    }
    const char *what = n > 1 ? "nccl group" : nccl_emu_kind_name(items[0].kind);
    /* emu_enqueue releases the op also when it cannot queue it: op is not touched after this */
    cudaError_t e = emu_enqueue(items[0].stream, what, nccl_emu_op_run, op, nccl_emu_op_release);
    if (e != cudaSuccess)
        return nccl_emu_note(ncclUnhandledCudaError, "%s: queueing on stream %p failed (CUDA error %d)", what,
                             (void *)items[0].stream, (int)e);
    return ncclSuccess;
}

/* One op per stream, each holding that stream's items in issue order. */
static ncclResult_t nccl_emu_submit(const struct nccl_emu_item *items, int n)
{
    if (n == 1)
        return nccl_emu_queue(items, 1);
    struct nccl_emu_item *buf = malloc((size_t)n * sizeof *buf);
    bool *taken = calloc((size_t)n, sizeof *taken);
    if (!buf || !taken) {
        free(buf);
        free(taken);
        return nccl_emu_note(ncclSystemError, "out of memory queueing a group of %d NCCL operations", n);
    }
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < n && r == ncclSuccess; i++) {
        if (taken[i])
            continue;
        int m = 0;
        for (int j = i; j < n; j++)
            if (!taken[j] && items[j].stream == items[i].stream) {
                taken[j] = true;
                buf[m++] = items[j];
            }
        r = nccl_emu_queue(buf, m);
    }
    free(buf);
    free(taken);
    return r;
}

/* ------------------------------------------------------------------------------------------------------------
 * Groups: per thread */

static _Thread_local int nccl_emu_depth;
static _Thread_local struct nccl_emu_item *nccl_emu_gitems;
static _Thread_local int nccl_emu_gcount, nccl_emu_gcap;
static _Thread_local ncclResult_t nccl_emu_gerr; /* the first failed call of the open group */

ncclResult_t ncclGroupStart(void)
{
    if (nccl_emu_depth == 0) {
        nccl_emu_gcount = 0;
        nccl_emu_gerr = ncclSuccess;
    }
    nccl_emu_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (nccl_emu_depth == 0)
        return nccl_emu_note(ncclInvalidUsage, "ncclGroupEnd: no group is open (ncclGroupStart was not called)");
    if (--nccl_emu_depth > 0)
        return ncclSuccess;
    ncclResult_t r = nccl_emu_gerr;
    /* as NCCL: a group with a failed call inside queues nothing */
    if (r == ncclSuccess && nccl_emu_gcount > 0)
        r = nccl_emu_submit(nccl_emu_gitems, nccl_emu_gcount);
    /* the array goes with the group: a thread that exits holds nothing */
    free(nccl_emu_gitems);
    nccl_emu_gitems = NULL;
    nccl_emu_gcount = nccl_emu_gcap = 0;
    nccl_emu_gerr = ncclSuccess;
    return r;
}

/* A call's item: queued now outside a group, at the outermost ncclGroupEnd inside one. */
static ncclResult_t nccl_emu_add(const struct nccl_emu_item *it)
{
    if (nccl_emu_depth == 0)
        return nccl_emu_submit(it, 1);
    if (nccl_emu_gcount == nccl_emu_gcap) {
        int cap = nccl_emu_gcap ? 2 * nccl_emu_gcap : 16;
        struct nccl_emu_item *p = realloc(nccl_emu_gitems, (size_t)cap * sizeof *p);
        if (!p)
            return nccl_emu_note(ncclSystemError, "out of memory growing a group to %d operations", cap);
        nccl_emu_gitems = p;
        nccl_emu_gcap = cap;
    }
    nccl_emu_gitems[nccl_emu_gcount++] = *it;
    return ncclSuccess;
}

/* A call's failure inside a group fails the group too (ncclGroupEnd returns it). */
static ncclResult_t nccl_emu_call_result(ncclResult_t r)
{
    if (r != ncclSuccess && nccl_emu_depth > 0 && nccl_emu_gerr == ncclSuccess)
        nccl_emu_gerr = r;
    return r;
}

/* ------------------------------------------------------------------------------------------------------------
 * The API: collectives and messages */

static ncclResult_t nccl_emu_usable(const struct ncclComm *c, const char *fn)
{
    if (!nccl_emu_valid(c))
        return nccl_emu_note(ncclInvalidArgument, "%s: comm is NULL or not a communicator", fn);
    ncclResult_t e = atomic_load(&c->async_err);
    if (e != ncclSuccess)
        return nccl_emu_note(e, "%s: the communicator has an error: %s", fn, c->err);
    if (atomic_load(&c->aborted))
        return nccl_emu_note(ncclInvalidUsage, "%s: the communicator was aborted", fn);
    if (atomic_load(&c->bg_busy))
        return nccl_emu_note(ncclInvalidUsage, "%s: the communicator's init, split or finalize has not finished "
                             "(ncclCommGetAsyncError says ncclInProgress)", fn);
    if (atomic_load(&c->finalized))
        return nccl_emu_note(ncclInvalidUsage, "%s: the communicator was finalized", fn);
    return ncclSuccess;
}

/* NCCL buffers are device memory: a host pointer is refused here (emu_check_device_range also records it as
 * the device's error, as the kernel's fault on a real GPU would). */
static ncclResult_t nccl_emu_check_buf(const char *fn, const char *what, const void *p, size_t bytes)
{
    if (!bytes)
        return ncclSuccess;
    if (!p)
        return nccl_emu_note(ncclInvalidArgument, "%s: %s is NULL", fn, what);
    if (emu_check_device_range(fn, what, p, bytes) != 0)
        return nccl_emu_note(ncclInvalidArgument, "%s: %s [%p, +%zu bytes) is not inside one live device allocation "
                             "(NCCL buffers must come from cudaMalloc or ncclMemAlloc)", fn, what, p, bytes);
    return ncclSuccess;
}

static ncclResult_t nccl_emu_op_call(const char *fn, int kind, const void *send, void *recv, size_t count,
                                     ncclDataType_t type, ncclRedOp_t redop, int peer, ncclComm_t comm,
                                     cudaStream_t stream)
{
    ncclResult_t r = nccl_emu_usable(comm, fn);
    if (r != ncclSuccess)
        return r;
    int n = comm->nranks, me = comm->rank;
    size_t es = nccl_emu_type_size(type);
    if (!es)
        return nccl_emu_note(ncclInvalidArgument, "%s: datatype %d is not a type the emulator knows", fn, (int)type);
    bool red = kind == NCCL_EMU_ALL_REDUCE || kind == NCCL_EMU_REDUCE || kind == NCCL_EMU_REDUCE_SCATTER;
    if (red && !nccl_emu_type_reducible(type))
        return nccl_emu_note(ncclInvalidArgument, "%s: reductions of datatype %d are not emulated (only ncclFloat32, "
                             "ncclBfloat16 and ncclFloat16; other types can be copied: all_gather, broadcast, "
                             "send/recv)", fn, (int)type);
    if (red && (redop < ncclSum || redop > ncclAvg))
        return nccl_emu_note(ncclInvalidArgument, "%s: reduction op %d is not emulated (ncclSum, ncclProd, ncclMax, "
                             "ncclMin and ncclAvg are; user-defined ops are not)", fn, (int)redop);
    bool rooted = kind == NCCL_EMU_REDUCE || kind == NCCL_EMU_BROADCAST;
    if ((rooted || nccl_emu_is_p2p(kind)) && (peer < 0 || peer >= n))
        return nccl_emu_note(ncclInvalidArgument, "%s: %s %d is not a rank of this communicator of %d", fn,
                             rooted ? "root" : "peer", peer, n);
    if (count > SIZE_MAX / es / (size_t)n)
        return nccl_emu_note(ncclInvalidArgument, "%s: count %zu is too large", fn, count);
    size_t one = count * es, all = one * (size_t)n;
    size_t sb = 0, rb = 0;
    switch (kind) {
    case NCCL_EMU_ALL_REDUCE: sb = rb = one; break;
    case NCCL_EMU_REDUCE: sb = one, rb = me == peer ? one : 0; break;
    case NCCL_EMU_BROADCAST: sb = me == peer ? one : 0, rb = one; break;
    case NCCL_EMU_ALL_GATHER: sb = one, rb = all; break;
    case NCCL_EMU_REDUCE_SCATTER: sb = all, rb = one; break;
    case NCCL_EMU_SEND: sb = one; break;
    case NCCL_EMU_RECV: rb = one; break;
    }
    if ((r = nccl_emu_check_buf(fn, "sendbuff", send, sb)) != ncclSuccess ||
        (r = nccl_emu_check_buf(fn, "recvbuff", recv, rb)) != ncclSuccess)
        return r;
    struct nccl_emu_item it = {.comm = comm, .stream = stream, .kind = kind, .send = sb ? send : NULL,
                               .recv = rb ? recv : NULL, .count = count, .type = type, .redop = redop, .peer = peer};
    return nccl_emu_add(&it);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return nccl_emu_call_result(nccl_emu_op_call("ncclAllReduce", NCCL_EMU_ALL_REDUCE, sendbuff, recvbuff, count,
                                                 datatype, op, 0, comm, stream));
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream)
{
    return nccl_emu_call_result(nccl_emu_op_call("ncclReduce", NCCL_EMU_REDUCE, sendbuff, recvbuff, count, datatype,
                                                 op, root, comm, stream));
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream)
{
    return nccl_emu_call_result(nccl_emu_op_call("ncclBroadcast", NCCL_EMU_BROADCAST, sendbuff, recvbuff, count,
                                                 datatype, ncclSum, root, comm, stream));
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream)
{
    return nccl_emu_call_result(nccl_emu_op_call("ncclBcast", NCCL_EMU_BROADCAST, buff, buff, count, datatype,
                                                 ncclSum, root, comm, stream));
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream)
{
    return nccl_emu_call_result(nccl_emu_op_call("ncclAllGather", NCCL_EMU_ALL_GATHER, sendbuff, recvbuff, sendcount,
                                                 datatype, ncclSum, 0, comm, stream));
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return nccl_emu_call_result(nccl_emu_op_call("ncclReduceScatter", NCCL_EMU_REDUCE_SCATTER, sendbuff, recvbuff,
                                                 recvcount, datatype, op, 0, comm, stream));
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return nccl_emu_call_result(nccl_emu_op_call("ncclSend", NCCL_EMU_SEND, sendbuff, NULL, count, datatype, ncclSum,
                                                 peer, comm, stream));
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return nccl_emu_call_result(nccl_emu_op_call("ncclRecv", NCCL_EMU_RECV, NULL, recvbuff, count, datatype, ncclSum,
                                                 peer, comm, stream));
}

/* NCCL's all-to-all: block p of sendbuff to rank p, block p of recvbuff from it; one group of messages. */
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream)
{
    ncclResult_t r = nccl_emu_usable(comm, "ncclAlltoAll");
    size_t es = nccl_emu_type_size(datatype);
    if (r == ncclSuccess && !es)
        r = nccl_emu_note(ncclInvalidArgument, "ncclAlltoAll: datatype %d is not a type the emulator knows",
                          (int)datatype);
    if (r != ncclSuccess)
        return nccl_emu_call_result(r);
    ncclGroupStart();
    for (int p = 0; p < comm->nranks && r == ncclSuccess; p++) {
        r = ncclSend((const char *)sendbuff + (size_t)p * count * es, count, datatype, p, comm, stream);
        if (r == ncclSuccess)
            r = ncclRecv((char *)recvbuff + (size_t)p * count * es, count, datatype, p, comm, stream);
    }
    ncclResult_t e = ncclGroupEnd();
    return nccl_emu_call_result(r != ncclSuccess ? r : e);
}

/* ------------------------------------------------------------------------------------------------------------
 * The API: communicators */

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return nccl_emu_note(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return nccl_emu_note(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    static _Atomic uint64_t calls;
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        rnd = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 40) ^
              (atomic_fetch_add(&calls, 1) * 0x9e3779b97f4a7c15ull);
    }
    memset(uniqueId, 0, sizeof *uniqueId);
    uint32_t magic = NCCL_EMU_ID_MAGIC;
    memcpy(uniqueId->internal, &magic, sizeof magic);
    snprintf(uniqueId->internal + 8, NCCL_UNIQUE_ID_BYTES - 8, NCCL_EMU_PREFIX "%d-%016llx", (int)getpid(),
             (unsigned long long)rnd);
    return ncclSuccess;
}

/* The shm name an id carries, and its pid part (the tag); false for an id not from ncclGetUniqueId above. */
static bool nccl_emu_id_parse(const ncclUniqueId *id, char *name, size_t name_size, char *tag, size_t tag_size)
{
    uint32_t magic;
    memcpy(&magic, id->internal, sizeof magic);
    const char *s = id->internal + 8;
    size_t len = strnlen(s, NCCL_UNIQUE_ID_BYTES - 8);
    size_t pre = strlen(NCCL_EMU_PREFIX);
    if (magic != NCCL_EMU_ID_MAGIC || len == NCCL_UNIQUE_ID_BYTES - 8 || len >= name_size || len <= pre ||
        strncmp(s, NCCL_EMU_PREFIX, pre) != 0 || strchr(s + 1, '/'))
        return false;
    const char *dash = strchr(s + pre, '-');
    if (!dash || (size_t)(dash - (s + pre)) >= tag_size)
        return false;
    memcpy(name, s, len + 1);
    memcpy(tag, s + pre, (size_t)(dash - (s + pre)));
    tag[dash - (s + pre)] = '\0';
    return true;
}

/* config's blocking flag and name, def when config leaves them undefined; false for a config not made with
 * NCCL_CONFIG_INITIALIZER. */
static bool nccl_emu_config(const ncclConfig_t *config, bool def, bool *blocking, const char **label)
{
    *blocking = def;
    if (!config)
        return true;
    if (config->magic != NCCL_EMU_CONFIG_MAGIC || config->size < offsetof(ncclConfig_t, cgaClusterSize))
        return false;
    if (config->blocking != NCCL_CONFIG_UNDEF_INT)
        *blocking = config->blocking != 0;
    if (label && config->size >= offsetof(ncclConfig_t, commName) + sizeof config->commName && config->commName)
        *label = config->commName;
    return true;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config)
{
    if (!comm)
        return nccl_emu_note(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = NULL;
    if (nranks < 1 || nranks > NCCL_EMU_MAX_RANKS)
        return nccl_emu_note(ncclInvalidArgument, "ncclCommInitRank: nranks %d: the emulator supports 1 to %d ranks",
                             nranks, NCCL_EMU_MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return nccl_emu_note(ncclInvalidArgument, "ncclCommInitRank: rank %d is not in [0, %d)", rank, nranks);
    char name[96], tag[24];
    if (!nccl_emu_id_parse(&commId, name, sizeof name, tag, sizeof tag))
        return nccl_emu_note(ncclInvalidArgument, "ncclCommInitRank: the id did not come from the emulator's "
                             "ncclGetUniqueId (a real NCCL id cannot be used with it)");
    bool blocking;
    const char *label = NULL;
    if (!nccl_emu_config(config, true, &blocking, &label))
        return nccl_emu_note(ncclInvalidArgument, "ncclCommInitRankConfig: config was not initialised with "
                             "NCCL_CONFIG_INITIALIZER");
    struct ncclComm *c = nccl_emu_comm_new(nranks, rank, blocking, label);
    if (!c)
        return nccl_emu_note(ncclSystemError, "ncclCommInitRank: out of memory");
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(c->tag, sizeof c->tag, "%s", tag);
    c->bgt.task = NCCL_EMU_TASK_INIT;
    if (!blocking) {
        *comm = c; /* ncclInProgress: the caller settles it with ncclCommGetAsyncError (or aborts it) */
        return nccl_emu_task_start(c, false);
    }
    ncclResult_t r = nccl_emu_task_start(c, true);
    if (r != ncclSuccess) {
        atomic_store(&c->aborted, true);
        nccl_emu_mark(c, NCCL_EMU_ST_ABORTED);
        nccl_emu_unlink(c);
        nccl_emu_unref(c);
        return r;
    }
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    if (!newcomm)
        return nccl_emu_note(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
    *newcomm = NULL;
    ncclResult_t r = nccl_emu_usable(comm, "ncclCommSplit");
    if (r != ncclSuccess)
        return r;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return nccl_emu_note(ncclInvalidArgument, "ncclCommSplit: color %d is negative and not NCCL_SPLIT_NOCOLOR",
                             color);
    bool blocking;
    const char *label = comm->label;
    if (!nccl_emu_config(config, comm->blocking, &blocking, &label))
        return nccl_emu_note(ncclInvalidArgument, "ncclCommSplit: config was not initialised with "
                             "NCCL_CONFIG_INITIALIZER");
    comm->bgt.task = NCCL_EMU_TASK_SPLIT;
    comm->bgt.color = color;
    comm->bgt.key = key;
    comm->bgt.newcomm = newcomm;
    comm->bgt.child_blocking = blocking;
    snprintf(comm->bgt.child_label, sizeof comm->bgt.child_label, "%s", label);
    /* the split is an operation of the parent, nonblocking when the child is: the parent's state says
     * ncclInProgress until the child's handle is in *newcomm */
    return nccl_emu_task_start(comm, blocking);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    ncclResult_t r = nccl_emu_usable(comm, "ncclCommFinalize");
    if (r != ncclSuccess)
        return r;
    comm->bgt.task = NCCL_EMU_TASK_FINALIZE;
    return nccl_emu_task_start(comm, comm->blocking);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    if (!nccl_emu_valid(comm))
        return nccl_emu_note(ncclInvalidArgument, "ncclCommDestroy: not a communicator");
    /* a communicator still initialising, splitting or finalizing is aborted rather than waited for */
    if (atomic_load(&comm->bg_busy))
        atomic_store(&comm->aborted, true);
    nccl_emu_bg_join(comm);
    if (!atomic_load(&comm->aborted) && !atomic_load(&comm->finalized) &&
        atomic_load(&comm->async_err) == ncclSuccess) {
        /* not finalized: its queued ops still finish first (bounded) */
        double t0 = clock_now_s();
        long nap_ns = 20000;
        while (atomic_load(&comm->pending) > 0 && clock_now_s() - t0 < comm->bound_s &&
               atomic_load(&comm->async_err) == ncclSuccess)
            nccl_emu_pause(t0, &nap_ns, NULL, 0, 0);
    }
    nccl_emu_mark(comm, atomic_load(&comm->aborted) ? NCCL_EMU_ST_ABORTED : NCCL_EMU_ST_DEPARTED);
    nccl_emu_unlink(comm);
    nccl_emu_unref(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    if (!nccl_emu_valid(comm))
        return nccl_emu_note(ncclInvalidArgument, "ncclCommAbort: not a communicator");
    atomic_store(&comm->aborted, true);
    /* init, split or finalize sees the flag within a slice; after the join, shm is no longer being set up */
    nccl_emu_bg_join(comm);
    if (comm->shm) {
        /* a failed rank is marked aborted too, for the peers' messages; a departed one stays departed */
        _Atomic uint32_t *st = &comm->shm->rank[comm->rank].status;
        uint32_t was = atomic_load(st);
        while ((was == NCCL_EMU_ST_RUNNING || was == NCCL_EMU_ST_FAILED) &&
               !atomic_compare_exchange_weak(st, &was, NCCL_EMU_ST_ABORTED))
            ;
        nccl_emu_ring_bell(comm->shm); /* wakes this process's waiting op at once */
    }
    nccl_emu_unlink(comm);
    nccl_emu_unref(comm); /* a queued or running op still holds it: freed when that op is released */
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!nccl_emu_valid(comm) || !count)
        return nccl_emu_note(ncclInvalidArgument, "ncclCommCount: comm or count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!nccl_emu_valid(comm) || !rank)
        return nccl_emu_note(ncclInvalidArgument, "ncclCommUserRank: comm or rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!nccl_emu_valid(comm) || !device)
        return nccl_emu_note(ncclInvalidArgument, "ncclCommCuDevice: comm or device is NULL");
    *device = 0; /* the emulator has one device */
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!nccl_emu_valid(comm) || !asyncError)
        return nccl_emu_note(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
    ncclResult_t e = atomic_load(&comm->async_err);
    *asyncError = e != ncclSuccess ? e : atomic_load(&comm->bg_busy) ? ncclInProgress : ncclSuccess;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

/* The communicator's async error's message when it has one; else this thread's last failed call's; else any
 * thread's. */
const char *ncclGetLastError(ncclComm_t comm)
{
    if (nccl_emu_valid(comm) && atomic_load(&comm->async_err) != ncclSuccess)
        return comm->err;
    if (nccl_emu_tl_last[0])
        return nccl_emu_tl_last;
    pthread_mutex_lock(&nccl_emu_last_mu);
    snprintf(nccl_emu_tl_copy, sizeof nccl_emu_tl_copy, "%s", nccl_emu_last);
    pthread_mutex_unlock(&nccl_emu_last_mu);
    return nccl_emu_tl_copy;
}

ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    if (!ptr)
        return nccl_emu_note(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    cudaError_t e = emu_device_alloc(ptr, size);
    if (e != cudaSuccess)
        return nccl_emu_note(ncclUnhandledCudaError, "ncclMemAlloc: %zu bytes: CUDA error %d", size, (int)e);
    return ncclSuccess;
}

ncclResult_t ncclMemFree(void *ptr)
{
    if (!ptr)
        return ncclSuccess;
    cudaError_t e = emu_device_free(ptr);
    if (e != cudaSuccess)
        return nccl_emu_note(ncclUnhandledCudaError, "ncclMemFree(%p): CUDA error %d (not from ncclMemAlloc?)", ptr,
                             (int)e);
    return ncclSuccess;
}
