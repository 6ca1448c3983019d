/* The ordered work pool of fsdp-prepare-data (prepare_pool.h): a ring of max_jobs slots under one mutex.
 * Jobs are numbered as pushed; workers take the lowest queued number, and pop hands back the lowest number
 * in flight once it is done, so the order of the output is the order of the input. */
#include "worker/tools/prepare_pool.h"

#include "common/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum slot_state { SLOT_QUEUED, SLOT_RUNNING, SLOT_DONE };

struct slot {
    void *job;
    size_t bytes;
    enum slot_state state;
};

struct worker {
    struct prepare_pool *pool;
    int index;
    pthread_t thread;
    bool started;
    void *state;
};

struct prepare_pool {
    struct prepare_pool_config cfg;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    struct slot *slots;
    /* job numbers: [head, tail) are in flight, [next, tail) are queued */
    size_t head, next, tail, bytes;
    bool stopping;
    int inits_done, init_rc;
    char *init_error;
    struct worker *workers;
    void *inline_state; /* one thread: the caller's state */
};

static struct slot *slot_of(struct prepare_pool *p, size_t n) { return &p->slots[n % p->cfg.max_jobs]; }

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct prepare_pool *p = w->pool;
    int rc = p->cfg.init ? p->cfg.init(p->cfg.ctx, w->index, &w->state) : 0;
    pthread_mutex_lock(&p->mu);
    if (rc < 0 && p->init_rc == 0) {
        p->init_rc = rc;
        p->init_error = strdup(error_message()); /* the message is this thread's: carry it to the starter */
    }
    p->inits_done++;
    pthread_cond_broadcast(&p->done_cv);
    while (rc == 0) {
        while (!p->stopping && p->next == p->tail)
            pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->stopping)
            break;
        struct slot *s = slot_of(p, p->next++);
        s->state = SLOT_RUNNING;
        pthread_mutex_unlock(&p->mu);
        p->cfg.work(w->state, s->job);
        pthread_mutex_lock(&p->mu);
        s->state = SLOT_DONE;
        pthread_cond_broadcast(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void stop_threads(struct prepare_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; p->workers && i < p->cfg.threads; i++) {
        struct worker *w = &p->workers[i];
        if (!w->started)
            continue;
        pthread_join(w->thread, NULL);
        if (p->cfg.fini && w->state)
            p->cfg.fini(p->cfg.ctx, w->index, w->state);
    }
}

void prepare_pool_stop(struct prepare_pool *p)
{
    if (!p)
        return;
    if (p->cfg.threads > 1)
        stop_threads(p);
    else if (p->cfg.fini && p->inline_state)
        p->cfg.fini(p->cfg.ctx, 0, p->inline_state);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p->init_error);
    free(p->workers);
    free(p->slots);
    free(p);
}

int prepare_pool_start(const struct prepare_pool_config *cfg, struct prepare_pool **out)
{
    *out = NULL;
    struct prepare_pool *p = calloc(1, sizeof *p);
    if (!p)
        return error_set(FSDP_ENOMEM, "out of memory");
    p->cfg = *cfg;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    if (!(p->slots = calloc(cfg->max_jobs, sizeof *p->slots))) {
        prepare_pool_stop(p);
        return error_set(FSDP_ENOMEM, "out of memory");
    }
    if (cfg->threads == 1) {
        int rc = cfg->init ? cfg->init(cfg->ctx, 0, &p->inline_state) : 0;
        if (rc < 0) {
            prepare_pool_stop(p);
            return rc;
        }
        *out = p;
        return 0;
    }
    if (!(p->workers = calloc((size_t)cfg->threads, sizeof *p->workers))) {
        prepare_pool_stop(p);
        return error_set(FSDP_ENOMEM, "out of memory");
    }
    int started = 0, rc = 0;
    for (int i = 0; i < cfg->threads; i++) {
        struct worker *w = &p->workers[i];
        w->pool = p;
        w->index = i;
        int e = pthread_create(&w->thread, NULL, worker_main, w);
        if (e != 0) {
            rc = error_set(FSDP_ENOMEM, "cannot start thread %d of %d: %s; lower -j", i + 1, cfg->threads,
                           strerror(e));
            break;
        }
        w->started = true;
        started++;
    }
    pthread_mutex_lock(&p->mu);
    while (p->inits_done < started)
        pthread_cond_wait(&p->done_cv, &p->mu);
    if (rc == 0 && p->init_rc < 0)
        rc = error_set(p->init_rc, "%s", p->init_error ? p->init_error : "out of memory");
    pthread_mutex_unlock(&p->mu);
    if (rc < 0) {
        prepare_pool_stop(p);
        return rc;
    }
    *out = p;
    return 0;
}

bool prepare_pool_has_room(struct prepare_pool *p, size_t bytes)
{
    pthread_mutex_lock(&p->mu);
    size_t n = p->tail - p->head;
    bool room = n < p->cfg.max_jobs && (n == 0 || p->bytes + bytes <= p->cfg.max_bytes);
    pthread_mutex_unlock(&p->mu);
    return room;
}

void prepare_pool_push(struct prepare_pool *p, void *job, size_t bytes)
{
    pthread_mutex_lock(&p->mu);
    struct slot *s = slot_of(p, p->tail);
    *s = (struct slot){.job = job, .bytes = bytes, .state = SLOT_QUEUED};
    p->bytes += bytes;
    p->tail++;
    if (p->cfg.threads > 1) {
        pthread_cond_signal(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
        return;
    }
    p->next++;
    pthread_mutex_unlock(&p->mu);
    p->cfg.work(p->inline_state, job);
    s->state = SLOT_DONE;
}

void *prepare_pool_pop(struct prepare_pool *p, bool wait)
{
    pthread_mutex_lock(&p->mu);
    void *job = NULL;
    while (p->head != p->tail) {
        struct slot *s = slot_of(p, p->head);
        if (s->state == SLOT_DONE) {
            job = s->job;
            p->bytes -= s->bytes;
            p->head++;
            break;
        }
        if (!wait)
            break;
        pthread_cond_wait(&p->done_cv, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return job;
}

void prepare_pool_cancel(struct prepare_pool *p)
{
    pthread_mutex_lock(&p->mu);
    for (; p->next != p->tail; p->next++)
        slot_of(p, p->next)->state = SLOT_DONE;
    pthread_mutex_unlock(&p->mu);
}
