/* The communicator core: option defaults, the backend choice (by name, through comm_registry.c),
 * comm_split through the store, and the progress thread that runs every operation (blocking forms are
 * async + wait) in issue order. Errors are decorated here with the collective, its sequence number, the
 * group and this rank, and make the communicator broken: once one collective failed the ranks are out of
 * step, so later ones fail fast. */
#include "comm/comm_internal.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "common/settings.h"
#include "rendezvous/store.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct comm_work {
    struct comm_req req;
    struct comm *comm;
    struct comm_work *next;
    bool launched; /* comm_backend.launch has queued it (or it failed before it could run: status is set) */
    bool polled;   /* the oldest launched work: its deadline now runs */
    bool done;
    int status;
    void *mem;     /* COMM_K_MEM_ALLOC: the buffer */
    char msg[768];
};

/* Where operations wait for their progress thread: one per communicator, or, for a serial backend, one
 * for all of the process's communicators of that backend (comm_backend.serial). Its mutex also guards
 * the communicators' pending counts and broken state. */
struct comm_queue {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct comm_work *head, *tail;
    /* The first work not yet launched or run; those before it (from head) are launched and in flight. */
    struct comm_work *next_run;
    bool stop;
    int refs;
};

struct comm {
    struct comm_info info;
    struct comm_options opts;
    const struct comm_backend *be;
    void *state;
    bool serial; /* on the process's shared queue */
    int nsplits;
    uint64_t seq;
    struct comm_queue *q;
    int pending; /* queued or running works of this communicator */
    int broken;
    char broken_msg[768];
};

int comm_rank(const struct comm *c) { return c->info.rank; }
int comm_size(const struct comm *c) { return c->info.size; }
const char *comm_group(const struct comm *c) { return c->info.group; }
const char *comm_backend_name(const struct comm *c) { return c->be->name; }
uint64_t comm_work_seq(const struct comm_work *w) { return w->req.seq; }

/* The core's own steps (COMM_K_SPLIT and after) are not operations of the group: they run on a broken
 * communicator too (a free or a destroy must), and are never counted as its collectives. */
static bool core_step(enum comm_kind k)
{
    return k >= COMM_K_SPLIT;
}

static int run_work(struct comm *c, struct comm_work *w)
{
    const struct comm_req *r = &w->req;
    switch (r->kind) {
    case COMM_K_SPLIT:
        return c->be->split(c->state, r->child, r->color, r->key, r->child_state);
    case COMM_K_INIT:
        return c->be->init(&c->info, &c->state);
    case COMM_K_FINI:
        c->be->fini(c->state);
        c->state = NULL;
        return 0;
    case COMM_K_MEM_ALLOC:
        w->mem = c->be->mem_alloc(c->state, r->count);
        return w->mem ? 0 : FSDP_ENOMEM;
    case COMM_K_MEM_FREE:
        return c->be->mem_free(c->state, r->out);
    default:
        return c->be->run(c->state, r);
    }
}

/* With q->mu held: w (the queue's oldest) has finished with rc; a failed operation or split breaks its group. */
static void work_complete(struct comm_queue *q, struct comm_work *w, int rc)
{
    struct comm *c = w->comm;
    /* Only operations and splits break a group: a failed allocation, free, init or destroy leaves the
     * peers in step (and is reported to its caller). */
    if (rc && !c->broken && (!core_step(w->req.kind) || w->req.kind == COMM_K_SPLIT)) {
        c->broken = rc;
        snprintf(c->broken_msg, sizeof(c->broken_msg), "%s", w->msg);
        log_error("%s", w->msg);
    }
    q->head = w->next;
    if (!q->head)
        q->tail = NULL;
    if (q->next_run == w)
        q->next_run = w->next;
    c->pending--;
    w->status = rc;
    w->done = true;
    pthread_cond_broadcast(&q->cv);
}

static void work_fail_msg(struct comm_work *w, int rc)
{
    struct comm *c = w->comm;
    if (rc)
        snprintf(w->msg, sizeof(w->msg), "comm: %s #%llu in group '%s' failed on rank %d of %d (%s backend, timeout "
                 "%.0f s): %s", comm_kind_name(w->req.kind), (unsigned long long)w->req.seq, c->info.group,
                 c->info.rank, c->info.size, c->be->name, c->info.timeout_s, error_message());
}

/* With q->mu held: the status of a work of a broken group, which is not run. */
static int work_skip(struct comm_work *w)
{
    struct comm *c = w->comm;
    if (c->be->release)
        c->be->release(c->state, &w->req);
    snprintf(w->msg, sizeof(w->msg), "comm: %s #%llu in group '%s' not run (rank %d): an earlier collective failed: "
             "%.600s", comm_kind_name(w->req.kind), (unsigned long long)w->req.seq, c->info.group, c->info.rank,
             c->broken_msg);
    return c->broken;
}

/* Runs q->next_run to completion (mu held on entry and return; released while it runs). */
static void progress_run(struct comm_queue *q, struct comm_work *w)
{
    struct comm *c = w->comm;
    int rc = core_step(w->req.kind) ? 0 : c->broken;
    if (rc) {
        rc = work_skip(w);
    } else {
        pthread_mutex_unlock(&q->mu);
        w->req.deadline = clock_now_s() + c->info.timeout_s;
        error_clear();
        rc = run_work(c, w);
        work_fail_msg(w, rc);
        pthread_mutex_lock(&q->mu);
    }
    work_complete(q, w, rc);
}

/* Launches q->next_run (mu held on entry and return). A failure, or a broken group, leaves it launched with
 * its status set: it completes, in order, when it is the oldest. */
static void progress_launch(struct comm_queue *q, struct comm_work *w)
{
    struct comm *c = w->comm;
    q->next_run = w->next;
    int rc = c->broken;
    if (rc) {
        rc = work_skip(w);
    } else {
        pthread_mutex_unlock(&q->mu);
        w->req.deadline = clock_now_s() + c->info.timeout_s; /* for the enqueue itself */
        error_clear();
        rc = c->be->launch(c->state, &w->req);
        work_fail_msg(w, rc);
        pthread_mutex_lock(&q->mu);
        if (rc && !c->broken) { /* later operations of the group fail fast, as after a failed run() */
            c->broken = rc;
            snprintf(c->broken_msg, sizeof(c->broken_msg), "%s", w->msg);
            log_error("%s", w->msg);
        }
    }
    w->status = rc;
    w->launched = true;
    pthread_cond_broadcast(&q->cv);
}

/* Polls the oldest launched work once (mu held on entry and return): true if it completed. Its deadline
 * starts when it becomes the oldest, as a run() operation's starts when the one before it ends. */
static bool progress_poll(struct comm_queue *q, struct comm_work *w)
{
    struct comm *c = w->comm;
    if (w->status) {
        work_complete(q, w, w->status);
        return true;
    }
    if (!w->polled) {
        w->polled = true;
        w->req.deadline = clock_now_s() + c->info.timeout_s;
    }
    pthread_mutex_unlock(&q->mu);
    bool done = false;
    error_clear();
    int rc = c->be->poll(c->state, &w->req, &done);
    work_fail_msg(w, rc);
    pthread_mutex_lock(&q->mu);
    if (rc || done) {
        work_complete(q, w, rc);
        return true;
    }
    return false;
}

/* Sleeps on the queue's condition (so a new work wakes it at once) between polls of the oldest launched
 * work: yields for its first 100 us (most collectives of a step end within that), then naps of 20 us
 * doubling to 1 ms. */
static void progress_nap(struct comm_queue *q, double t0, long *nap_ns)
{
    if (clock_now_s() - t0 < 1e-4) {
        pthread_mutex_unlock(&q->mu);
        sched_yield();
        pthread_mutex_lock(&q->mu);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += *nap_ns;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&q->cv, &q->mu, &ts);
    *nap_ns = *nap_ns < 500000 ? 2 * *nap_ns : 1000000;
}

/* The progress thread. Operations of a backend with launch() are launched as they come and completed in
 * order as poll() sees them end; anything else (a backend without it, the core's own steps) runs to the end
 * with run_work() once every launched operation before it has completed, so allocations, splits and
 * finalize never overlap the backend's operations. */
static void *progress_main(void *arg)
{
    struct comm_queue *q = arg;
    struct comm_work *oldest = NULL;
    double t0 = 0;
    long nap_ns = 20000;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        struct comm_work *w = q->next_run;
        bool inflight = q->head && q->head != q->next_run;
        if (w && w->comm->be->launch && !core_step(w->req.kind)) {
            progress_launch(q, w);
        } else if (inflight) {
            if (q->head != oldest) {
                oldest = q->head;
                t0 = clock_now_s();
                nap_ns = 20000;
            }
            if (!progress_poll(q, q->head))
                progress_nap(q, t0, &nap_ns);
        } else if (w) {
            progress_run(q, w);
        } else if (q->stop) {
            break;
        } else {
            pthread_cond_wait(&q->cv, &q->mu);
        }
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* ---- queues ---- */

static pthread_mutex_t serial_mu = PTHREAD_MUTEX_INITIALIZER;
static struct comm_queue *serial_q;

static struct comm_queue *queue_new(void)
{
    struct comm_queue *q = calloc(1, sizeof(*q));
    if (!q)
        return NULL;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    if (pthread_create(&q->thread, NULL, progress_main, q) != 0) {
        pthread_mutex_destroy(&q->mu);
        pthread_cond_destroy(&q->cv);
        free(q);
        return NULL;
    }
    q->refs = 1;
    return q;
}

static void queue_stop(struct comm_queue *q)
{
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}

/* c's queue: its own, or the process's serial one (made by its first user). */
static int queue_attach(struct comm *c)
{
    if (!c->serial) {
        c->q = queue_new();
    } else {
        pthread_mutex_lock(&serial_mu);
        if (serial_q)
            serial_q->refs++;
        else
            serial_q = queue_new();
        c->q = serial_q;
        pthread_mutex_unlock(&serial_mu);
    }
    return c->q ? 0 : error_set(FSDP_ENOMEM, "comm: cannot start the progress thread");
}

/* After c's last work finished: the last user of a queue stops its thread. */
static void queue_detach(struct comm *c)
{
    struct comm_queue *q = c->q;
    c->q = NULL;
    if (!q)
        return;
    if (!c->serial) {
        queue_stop(q);
        return;
    }
    pthread_mutex_lock(&serial_mu);
    bool last = --q->refs == 0;
    if (last)
        serial_q = NULL;
    pthread_mutex_unlock(&serial_mu);
    if (last)
        queue_stop(q);
}

static bool group_ok(const char *g)
{
    size_t n = strlen(g);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = g[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
              ch == '.' || ch == '-'))
            return false;
    }
    return true;
}

/* The communicator object of a group, before its backend state exists. */
static int comm_new(struct store_client *store, int rank, int size, const char *group,
                    const struct comm_options *o, const struct comm_backend *be, struct comm **out)
{
    struct comm *c = calloc(1, sizeof(*c));
    if (!c)
        return error_set(FSDP_ENOMEM, "comm_create: out of memory");
    c->opts = *o;
    c->be = be;
    /* FSDP_TEST_COMM_SERIAL=1 runs any backend as a serial one does, so the path is tested without NCCL. */
    c->serial = be->serial || settings_bool(SETTING_TEST_COMM_SERIAL);
    c->info.store = store;
    c->info.rank = rank;
    c->info.size = size;
    c->info.generation = o->generation;
    c->info.device = o->device;
    c->info.timeout_s = o->timeout_s;
    /* Callers pass names of at most 64 characters (group_ok, or a split's "%.40s.<n>c<color>"). */
    snprintf(c->info.group, sizeof(c->info.group), "%.64s", group);
    snprintf(c->info.key_prefix, sizeof(c->info.key_prefix), "comm/%.64s/%d", group, o->generation);
    *out = c;
    return 0;
}

static int enqueue(struct comm *c, const struct comm_req *req, struct comm_work **out);
static int work_wait(struct comm_work *w, void **mem);

/* Queues one request and waits for it to finish. */
static int enqueue_wait(struct comm *c, const struct comm_req *req)
{
    struct comm_work *w = NULL;
    FSDP_TRY(enqueue(c, req, &w));
    return work_wait(w, NULL);
}

/* Gives c, whose backend state a split just made, its queue; on failure frees that state. */
static int comm_start(struct comm *c)
{
    int rc = queue_attach(c);
    if (rc)
        c->be->fini(c->state);
    return rc;
}

/* Makes c's backend state and its queue. A serial backend's init runs on the shared progress thread, in
 * issue order with the operations of the process's other communicators. */
static int comm_open(struct comm *c)
{
    if (!c->serial) {
        FSDP_TRY(c->be->init(&c->info, &c->state));
        return comm_start(c);
    }
    FSDP_TRY(queue_attach(c));
    int rc = enqueue_wait(c, &(struct comm_req){.kind = COMM_K_INIT});
    if (rc)
        queue_detach(c);
    return rc;
}

int comm_create(struct store_client *store, int rank, int size, const char *group,
                const struct comm_options *opts, struct comm **out)
{
    *out = NULL;
    if (!store || size < 1 || rank < 0 || rank >= size || !group)
        return error_set(FSDP_EINVAL, "comm_create: rank %d of %d (store %s)", rank, size, store ? "set" : "NULL");
    if (!group_ok(group))
        return error_set(FSDP_EINVAL, "comm_create: group name '%s' must be 1-64 chars of [A-Za-z0-9_.-]", group);
    struct comm_options o = opts ? *opts : (struct comm_options){.generation = -1, .device = -1};
    const char *bname = o.backend;
    if (!bname) {
        int b = 0;
        if (settings_get_enum(SETTING_COMM_BACKEND, &b) != 0)
            return error_set(FSDP_EINVAL, "comm_create: %s", error_message());
        bname = settings_entry(SETTING_COMM_BACKEND)->values[b].name;
    }
    const struct comm_backend *be = NULL;
    int found = comm_backend_find(bname, &be);
    if (found)
        return error_set(found, "comm_create: %s", error_message());
    if (o.generation < 0)
        o.generation = (int)settings_int(SETTING_RDZV_GENERATION);
    if (o.timeout_s <= 0)
        o.timeout_s = settings_double(SETTING_COMM_TIMEOUT_S);
    if (o.device < 0) {
        const char *lr = getenv("LOCAL_RANK");
        o.device = lr ? atoi(lr) : 0;
    }
    o.backend = be->name;

    struct comm *c = NULL;
    FSDP_TRY(comm_new(store, rank, size, group, &o, be, &c));
    int rc = comm_open(c);
    if (rc) {
        rc = error_set(rc, "comm_create: group '%s' rank %d of %d (%s backend): %s", group, rank, size, be->name,
                       error_message());
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void comm_destroy(struct comm *c)
{
    if (!c)
        return;
    if (c->serial) {
        /* After the operations queued before it, on the thread that runs them. */
        if (enqueue_wait(c, &(struct comm_req){.kind = COMM_K_FINI}) != 0)
            log_error("%s", error_message());
        queue_detach(c);
    } else {
        /* The thread runs what is queued before it stops; then nothing uses the state. */
        queue_detach(c);
        c->be->fini(c->state);
    }
    free(c);
}

struct split_entry {
    int color, key, rank;
};

static int split_cmp(const void *a, const void *b)
{
    const struct split_entry *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* A backend with a split hook (NCCL: ncclCommSplit) derives the child from the parent in a collective over
 * every rank of the parent, which must not overlap the parent's other operations. It is queued on the
 * parent as a COMM_K_SPLIT request and waited for, rather than called here after draining the queue:
 * both are ordered (one thread issues operations), but only the queue keeps the backend's state (its
 * NCCL communicator, stream, current device) touched by the progress thread alone, refuses the split on a
 * broken parent with the first error (instead of calling into an aborted communicator), and gives its
 * failure the same message as any collective (sequence number, group, rank). A rank that could not make
 * its child object still takes part, with no color, so that its peers' split returns (with a group one
 * short, which their backend reports) instead of waiting forever. */
static int split_backend(struct comm *c, int color, int rank, int size, const char *name, struct comm **out)
{
    struct comm *child = NULL;
    int made = 0;
    char why[512] = "";
    if (color != COMM_SPLIT_NONE && (made = comm_new(c->info.store, rank, size, name, &c->opts, c->be, &child)))
        snprintf(why, sizeof(why), "%s", error_message());
    struct comm_req r = {.kind = COMM_K_SPLIT, .color = child ? color : COMM_SPLIT_NONE, .key = rank,
                         .child = child ? &child->info : NULL, .child_state = child ? &child->state : NULL};
    int rc = enqueue_wait(c, &r);
    if (made)
        return error_set(made, "comm_split of group '%s' into '%s' on rank %d: %s", c->info.group, name,
                         c->info.rank, why);
    if (rc) {
        free(child); /* a failed split leaves no backend state behind */
        return rc;
    }
    if (child)
        FSDP_TRY(comm_start(child));
    *out = child;
    return 0;
}

int comm_split(struct comm *c, int color, int key, struct comm **out)
{
    *out = NULL;
    if (color < COMM_SPLIT_NONE)
        return error_set(FSDP_EINVAL, "comm_split: color %d (use >= 0 or COMM_SPLIT_NONE)", color);
    int n = c->nsplits++, size = c->info.size, rc = 0;
    char k[256], v[64];
    snprintf(k, sizeof(k), "%s/split%d/%d", c->info.key_prefix, n, c->info.rank);
    snprintf(v, sizeof(v), "%d %d", color, key);
    FSDP_TRY(store_client_set(c->info.store, k, v, strlen(v)));
    struct split_entry *e = calloc((size_t)size, sizeof(*e));
    if (!e)
        return error_set(FSDP_ENOMEM, "comm_split: out of memory");
    int m = 0, me = -1;
    double deadline = clock_now_s() + c->info.timeout_s;
    for (int r = 0; r < size; r++) {
        snprintf(k, sizeof(k), "%s/split%d/%d", c->info.key_prefix, n, r);
        void *val = NULL;
        size_t len = 0;
        double left = deadline - clock_now_s();
        if ((rc = store_client_get(c->info.store, k, &val, &len, left > 0.01 ? left : 0.01)) != 0) {
            rc = error_set(rc, "comm_split #%d of group '%s': rank %d did not arrive: %s", n, c->info.group, r,
                           error_message());
            free(e);
            return rc;
        }
        int col = 0, ky = 0;
        sscanf((char *)val, "%d %d", &col, &ky);
        free(val);
        if (col == color && color != COMM_SPLIT_NONE)
            e[m++] = (struct split_entry){col, ky, r};
    }
    if (color != COMM_SPLIT_NONE) {
        qsort(e, (size_t)m, sizeof(*e), split_cmp);
        for (int i = 0; i < m; i++)
            if (e[i].rank == c->info.rank)
                me = i;
    }
    free(e);
    char name[128];
    snprintf(name, sizeof(name), "%.40s.%dc%d", c->info.group, n, color);
    if (c->be->split)
        return split_backend(c, color, me, m, name, out);
    return color == COMM_SPLIT_NONE ? 0 : comm_create(c->info.store, me, m, name, &c->opts, out);
}

static int enqueue(struct comm *c, const struct comm_req *req, struct comm_work **out)
{
    *out = NULL;
    struct comm_work *w = calloc(1, sizeof(*w));
    if (!w)
        return error_set(FSDP_ENOMEM, "comm: out of memory");
    w->req = *req;
    w->comm = c;
    struct comm_queue *q = c->q;
    pthread_mutex_lock(&q->mu);
    /* Sequence numbers count the group's operations and splits only, so that they agree across ranks
     * whatever each allocates. */
    w->req.seq = core_step(req->kind) && req->kind != COMM_K_SPLIT ? 0 : ++c->seq;
    if (q->tail)
        q->tail->next = w;
    else
        q->head = w;
    q->tail = w;
    if (!q->next_run)
        q->next_run = w;
    c->pending++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    *out = w;
    return 0;
}

static int check_p2p(struct comm *c, const struct comm_req *r)
{
    if (r->np2p < 0 || r->np2p > COMM_P2P_MAX || (r->np2p && !r->p2p))
        return error_set(FSDP_EINVAL, "comm_sendrecv: %d operations (use 0 to %d)", r->np2p, COMM_P2P_MAX);
    for (int i = 0; i < r->np2p; i++) {
        const struct comm_p2p *o = &r->p2p[i];
        if (o->kind != COMM_P2P_SEND && o->kind != COMM_P2P_RECV)
            return error_set(FSDP_EINVAL, "comm_sendrecv: operation %d has unknown kind %d", i, (int)o->kind);
        if (!dtype_valid(o->dtype))
            return error_set(FSDP_EINVAL, "comm_sendrecv: operation %d has unknown dtype %d", i, (int)o->dtype);
        if (o->count && !o->buf)
            return error_set(FSDP_EINVAL, "comm_sendrecv: operation %d has a NULL buffer for %zu elements", i,
                             o->count);
        if (o->peer < 0 || o->peer >= c->info.size || o->peer == c->info.rank)
            return error_set(FSDP_EINVAL, "comm_sendrecv: operation %d: peer %d is not another rank of group "
                             "'%s' (size %d)", i, o->peer, c->info.group, c->info.size);
    }
    return 0;
}

static int check_args(struct comm *c, const struct comm_req *r)
{
    const char *op = comm_kind_name(r->kind);
    if (r->kind == COMM_K_SENDRECV)
        return check_p2p(c, r);
    if (!dtype_valid(r->dtype))
        return error_set(FSDP_EINVAL, "comm_%s: unknown dtype %d", op, (int)r->dtype);
    if ((unsigned)r->op > COMM_MAX)
        return error_set(FSDP_EINVAL, "comm_%s: unknown reduction %d", op, (int)r->op);
    if (r->count && (r->kind != COMM_K_BARRIER) && ((!r->in && r->kind != COMM_K_RECV && r->kind != COMM_K_BROADCAST) ||
                                                    (!r->out && r->kind != COMM_K_SEND)))
        return error_set(FSDP_EINVAL, "comm_%s: NULL buffer for %zu elements", op, r->count);
    if (r->kind == COMM_K_ALL_TO_ALL && r->count) {
        size_t bytes = (size_t)c->info.size * r->count * dtype_size(r->dtype);
        const char *a = r->in, *b = r->out;
        if (a < b + bytes && b < a + bytes)
            return error_set(FSDP_EINVAL, "comm_all_to_all: out overlaps in (%zu bytes each)", bytes);
    }
    if ((r->kind == COMM_K_SEND || r->kind == COMM_K_RECV || r->kind == COMM_K_BROADCAST) &&
        (r->peer < 0 || r->peer >= c->info.size || (r->kind != COMM_K_BROADCAST && r->peer == c->info.rank)))
        return error_set(FSDP_EINVAL, "comm_%s: peer/root %d is not another rank of group '%s' (size %d)", op,
                         r->peer, c->info.group, c->info.size);
    return 0;
}

static int submit(struct comm *c, struct comm_req r, struct comm_work **work)
{
    *work = NULL;
    FSDP_TRY(check_args(c, &r));
    if (c->be->issue)
        FSDP_TRY(c->be->issue(c->state, &r));
    int rc = enqueue(c, &r, work);
    if (rc && c->be->release)
        c->be->release(c->state, &r);
    return rc;
}

/* Waits for w (no deadline here: the operation itself gives up at its own deadline, every wait inside it
 * has one, and those queued before it do the same, so this returns within (queue length) x timeout),
 * takes its result (and a COMM_K_MEM_ALLOC's buffer) and frees it. */
static int work_wait(struct comm_work *w, void **mem)
{
    struct comm_queue *q = w->comm->q;
    pthread_mutex_lock(&q->mu);
    while (!w->done)
        pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
    int rc = w->status;
    if (rc)
        error_set(rc, "%s", w->msg);
    if (mem)
        *mem = w->mem;
    struct comm *c = w->comm;
    if (w->launched && c->be->release)
        c->be->release(c->state, &w->req);
    free((void *)w->req.p2p);
    free(w);
    return rc;
}

int comm_work_wait(struct comm_work *w)
{
    if (!w)
        return error_set(FSDP_EINVAL, "comm_work_wait: NULL handle");
    return work_wait(w, NULL);
}

int comm_work_order(struct comm_work *w)
{
    if (!w)
        return error_set(FSDP_EINVAL, "comm_work_order: NULL handle");
    struct comm *c = w->comm;
    struct comm_queue *q = c->q;
    pthread_mutex_lock(&q->mu);
    /* launched comes at once unless the thread is running a core step; a backend without launch() is done */
    while (!w->done && !w->launched)
        pthread_cond_wait(&q->cv, &q->mu);
    bool done = w->done;
    int rc = w->status;
    pthread_mutex_unlock(&q->mu);
    if (rc)
        return error_set(rc, "%s", w->msg);
    return done ? 0 : c->be->order(c->state, &w->req);
}

int comm_work_test(struct comm_work *w, bool *done)
{
    if (!w)
        return error_set(FSDP_EINVAL, "comm_work_test: NULL handle");
    struct comm_queue *q = w->comm->q;
    pthread_mutex_lock(&q->mu);
    *done = w->done;
    pthread_mutex_unlock(&q->mu);
    return 0;
}

static int run_sync(struct comm *c, struct comm_req r)
{
    struct comm_work *w;
    FSDP_TRY(submit(c, r, &w));
    return comm_work_wait(w);
}

int comm_all_gather_async(struct comm *c, const void *in, void *out, size_t count, enum dtype dtype,
                          struct comm_work **work)
{
    return submit(c, (struct comm_req){.kind = COMM_K_ALL_GATHER, .in = in, .out = out, .count = count,
                                       .dtype = dtype}, work);
}

int comm_reduce_scatter_async(struct comm *c, const void *in, void *out, size_t count, enum dtype dtype,
                              enum comm_op op, struct comm_work **work)
{
    return submit(c, (struct comm_req){.kind = COMM_K_REDUCE_SCATTER, .in = in, .out = out, .count = count,
                                       .dtype = dtype, .op = op}, work);
}

int comm_all_reduce_async(struct comm *c, const void *in, void *out, size_t count, enum dtype dtype,
                          enum comm_op op, struct comm_work **work)
{
    return submit(c, (struct comm_req){.kind = COMM_K_ALL_REDUCE, .in = in, .out = out, .count = count,
                                       .dtype = dtype, .op = op}, work);
}

int comm_broadcast_async(struct comm *c, void *buf, size_t count, enum dtype dtype, int root,
                         struct comm_work **work)
{
    return submit(c, (struct comm_req){.kind = COMM_K_BROADCAST, .in = buf, .out = buf, .count = count,
                                       .dtype = dtype, .peer = root}, work);
}

int comm_all_to_all_async(struct comm *c, const void *in, void *out, size_t count, enum dtype dtype,
                          struct comm_work **work)
{
    return submit(c, (struct comm_req){.kind = COMM_K_ALL_TO_ALL, .in = in, .out = out, .count = count,
                                       .dtype = dtype}, work);
}

int comm_send_async(struct comm *c, const void *buf, size_t count, enum dtype dtype, int peer,
                    struct comm_work **work)
{
    return submit(c, (struct comm_req){.kind = COMM_K_SEND, .in = buf, .count = count, .dtype = dtype,
                                       .peer = peer}, work);
}

int comm_recv_async(struct comm *c, void *buf, size_t count, enum dtype dtype, int peer,
                    struct comm_work **work)
{
    return submit(c, (struct comm_req){.kind = COMM_K_RECV, .out = buf, .count = count, .dtype = dtype,
                                       .peer = peer}, work);
}

/* The batch is copied: the caller's array may go as soon as this returns (its buffers may not). */
int comm_sendrecv_async(struct comm *c, const struct comm_p2p *ops, int n, struct comm_work **work)
{
    *work = NULL;
    if (n < 0 || n > COMM_P2P_MAX || (n && !ops))
        return error_set(FSDP_EINVAL, "comm_sendrecv: %d operations (use 0 to %d)", n, COMM_P2P_MAX);
    struct comm_p2p *copy = malloc((size_t)(n ? n : 1) * sizeof *copy);
    if (!copy)
        return error_set(FSDP_ENOMEM, "comm_sendrecv: out of memory");
    if (n)
        memcpy(copy, ops, (size_t)n * sizeof *copy);
    int rc = submit(c, (struct comm_req){.kind = COMM_K_SENDRECV, .p2p = copy, .np2p = n}, work);
    if (rc)
        free(copy);
    return rc;
}

int comm_sendrecv(struct comm *c, const struct comm_p2p *ops, int n)
{
    struct comm_work *w;
    FSDP_TRY(comm_sendrecv_async(c, ops, n, &w));
    return comm_work_wait(w);
}

int comm_all_gather(struct comm *c, const void *in, void *out, size_t count, enum dtype dtype)
{
    return run_sync(c, (struct comm_req){.kind = COMM_K_ALL_GATHER, .in = in, .out = out, .count = count,
                                         .dtype = dtype});
}

int comm_reduce_scatter(struct comm *c, const void *in, void *out, size_t count, enum dtype dtype,
                        enum comm_op op)
{
    return run_sync(c, (struct comm_req){.kind = COMM_K_REDUCE_SCATTER, .in = in, .out = out, .count = count,
                                         .dtype = dtype, .op = op});
}

int comm_all_reduce(struct comm *c, const void *in, void *out, size_t count, enum dtype dtype,
                    enum comm_op op)
{
    return run_sync(c, (struct comm_req){.kind = COMM_K_ALL_REDUCE, .in = in, .out = out, .count = count,
                                         .dtype = dtype, .op = op});
}

int comm_broadcast(struct comm *c, void *buf, size_t count, enum dtype dtype, int root)
{
    return run_sync(c, (struct comm_req){.kind = COMM_K_BROADCAST, .in = buf, .out = buf, .count = count,
                                         .dtype = dtype, .peer = root});
}

int comm_barrier(struct comm *c)
{
    return run_sync(c, (struct comm_req){.kind = COMM_K_BARRIER});
}

int comm_all_to_all(struct comm *c, const void *in, void *out, size_t count, enum dtype dtype)
{
    return run_sync(c, (struct comm_req){.kind = COMM_K_ALL_TO_ALL, .in = in, .out = out, .count = count,
                                         .dtype = dtype});
}

int comm_send(struct comm *c, const void *buf, size_t count, enum dtype dtype, int peer)
{
    return run_sync(c, (struct comm_req){.kind = COMM_K_SEND, .in = buf, .count = count, .dtype = dtype,
                                         .peer = peer});
}

int comm_recv(struct comm *c, void *buf, size_t count, enum dtype dtype, int peer)
{
    return run_sync(c, (struct comm_req){.kind = COMM_K_RECV, .out = buf, .count = count, .dtype = dtype,
                                         .peer = peer});
}

void *comm_mem_alloc(struct comm *c, size_t bytes)
{
    if (!c) {
        error_set(FSDP_EINVAL, "comm_mem_alloc: NULL communicator");
        return NULL;
    }
    if (c->be->mem_alloc && c->serial) {
        struct comm_work *w = NULL;
        void *p = NULL;
        if (enqueue(c, &(struct comm_req){.kind = COMM_K_MEM_ALLOC, .count = bytes}, &w) == 0)
            work_wait(w, &p);
        return p;
    }
    if (c->be->mem_alloc)
        return c->be->mem_alloc(c->state, bytes);
    /* Cache-line aligned, and aligned_alloc wants a multiple of the alignment. */
    void *p = aligned_alloc(64, bytes ? (bytes + 63) & ~(size_t)63 : 64);
    if (!p)
        error_set(FSDP_ENOMEM, "comm_mem_alloc: out of memory for %zu bytes", bytes);
    return p;
}

void comm_mem_free(struct comm *c, void *p)
{
    if (!p)
        return;
    if (!c || !c->be->mem_free) {
        free(p);
        return;
    }
    int rc = c->serial ? enqueue_wait(c, &(struct comm_req){.kind = COMM_K_MEM_FREE, .out = p})
                       : c->be->mem_free(c->state, p);
    if (rc != 0)
        log_error("%s", error_message());
}
