/* Streams and events of the CUDA host emulator (emu.h): each stream is an ordered queue of ops run by its own
 * worker thread, so two streams really run at once and a missing cudaStreamWaitEvent or stream synchronisation
 * is a real race (FSDP_GPU_EMU_DELAY_US makes it lose often). Events count records: a record is an op that marks
 * the event complete up to its own record, and a wait is an op that blocks its stream until the event has
 * completed the record made before the wait was queued, as CUDA defines them. Also the sticky error, the
 * settings and the random delays. */
#include "gpu/emu/emu.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/settings.h"
#include "gpu/emu/emu_internal.h"

struct emu_op {
    emu_op_fn run, release;
    void *arg;
    const char *what;
    uint64_t seq;
    struct emu_op *next;
};

struct CUstream_st {
    pthread_t thread;
    pthread_cond_t cv; /* new ops, or stopping */
    struct emu_op *head, *tail;
    uint64_t queued, done;
    bool stopping;
    unsigned flags;
    int id;
    const char *running; /* the op the worker runs now (for messages) */
    struct CUstream_st *next_stream;
};

struct CUevent_st {
    uint64_t recorded, completed;
    double time_s;
    unsigned flags;
    int refs; /* the handle and every queued op that names the event */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER; /* any op finished */
static struct CUstream_st *streams;                       /* every live stream, the legacy one included */
static struct CUstream_st *legacy;
static int next_id;
static cudaError_t sticky = cudaSuccess;
__thread const char *emu_current_op;

/* How long a host wait (a stream or event synchronisation) may take before the emulator calls the device
 * hung: a real device has no such bound, but a test must never hang. */
#define HANG_S 600.0

/* ---- settings and delays ---- */

static pthread_once_t settings_once = PTHREAD_ONCE_INIT;
static unsigned delay_us;
static uint64_t seed;

static void settings_read(void)
{
    delay_us = (unsigned)settings_int(SETTING_GPU_EMU_DELAY_US);
    seed = settings_get_raw(SETTING_GPU_EMU_SEED) ? (uint64_t)settings_int(SETTING_GPU_EMU_SEED)
                                                  : ((uint64_t)getpid() << 32) ^ (uint64_t)(clock_now_s() * 1e9);
}

unsigned emu_delay_us(void)
{
    pthread_once(&settings_once, settings_read);
    return delay_us;
}

/* splitmix64 per thread, seeded from the run's seed and the thread */
static uint64_t rand_next(void)
{
    static __thread uint64_t state;
    static __thread bool seeded;
    if (!seeded) {
        pthread_once(&settings_once, settings_read);
        state = seed ^ (uint64_t)(uintptr_t)&state;
        seeded = true;
    }
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void emu_random_delay(void)
{
    unsigned d = emu_delay_us();
    if (!d)
        return;
    uint64_t us = rand_next() % d;
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* ---- the sticky error ---- */

void emu_fail(cudaError_t e, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fsdpc CUDA emulator: %s\n", msg);
    pthread_mutex_lock(&mu);
    if (sticky == cudaSuccess)
        sticky = e;
    pthread_cond_broadcast(&done_cv);
    pthread_mutex_unlock(&mu);
}

cudaError_t emu_sticky_error(void)
{
    return __atomic_load_n(&sticky, __ATOMIC_ACQUIRE);
}

/* ---- the stream trace (FSDP_GPU_EMU_TRACE_DIR) ----
 * Every op's start and end on its stream, written at exit as DIR/trace-PID.json in the Chrome trace-event format
 * (chrome://tracing, Perfetto: one row per stream), to see what overlaps what. The host's waits for the device
 * (stream, device and event synchronisations, synchronous copies) are events too, category "host_wait", on the
 * waiting thread's row with args.main_thread: what a step costs in host round trips. At most TRACE_MAX events
 * are kept (32 bytes each: 32 MiB); later ones are counted and dropped. */
#define TRACE_MAX 1000000

struct trace_event {
    const char *what; /* the op's static name */
    int stream;       /* a stream's id, or the waiting thread's id for a host wait */
    bool host_wait, main_thread;
    double t0, t1;
};

static bool trace_on;
static struct trace_event *trace;
static size_t trace_n, trace_dropped;
static double trace_origin;
static char trace_dir[FSDP_PATH_MAX];

static void trace_add(const struct trace_event *e)
{
    pthread_mutex_lock(&mu);
    if (trace_n < TRACE_MAX)
        trace[trace_n++] = *e;
    else
        trace_dropped++;
    pthread_mutex_unlock(&mu);
}

/* A host thread waited for the device from t0 until now. */
static void trace_host_wait(const char *what, double t0)
{
    if (!trace_on)
        return;
    pid_t tid = gettid();
    trace_add(&(struct trace_event){.what = what, .stream = (int)tid, .host_wait = true,
                                    .main_thread = tid == getpid(), .t0 = t0, .t1 = clock_now_s()});
}

/* JSON string of an op's name: the names are the sources' own (kernel templates, API names), quotes escaped. */
static void trace_name(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++)
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
    fputc('"', f);
}

static void trace_write(void)
{
    char path[FSDP_PATH_MAX], tmp[FSDP_PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/trace-%d.json", trace_dir, (int)getpid());
    int m = n >= 0 && (size_t)n < sizeof path ? snprintf(tmp, sizeof tmp, "%s.tmp", path) : -1;
    if (m < 0 || (size_t)m >= sizeof tmp) {
        /* a cut name would write the trace somewhere else */
        fprintf(stderr, "fsdpc CUDA emulator: the stream trace's path under %s is over %d bytes; no trace written\n",
                trace_dir, FSDP_PATH_MAX - 1);
        return;
    }
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "fsdpc CUDA emulator: cannot write the stream trace %s\n", tmp);
        return;
    }
    pthread_mutex_lock(&mu);
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped_ops\":%zu},\"traceEvents\":[", trace_dropped);
    for (size_t i = 0; i < trace_n; i++) {
        const struct trace_event *e = &trace[i];
        fprintf(f, "%s\n{\"name\":", i ? "," : "");
        trace_name(f, e->what);
        fprintf(f, ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f", (int)getpid(), e->stream,
                (e->t0 - trace_origin) * 1e6, (e->t1 - e->t0) * 1e6);
        if (e->host_wait)
            fprintf(f, ",\"cat\":\"host_wait\",\"args\":{\"main_thread\":%s}", e->main_thread ? "true" : "false");
        fputc('}', f);
    }
    pthread_mutex_unlock(&mu);
    fprintf(f, "\n]}\n");
    if (fclose(f) == 0)
        rename(tmp, path);
}

static void trace_start(void)
{
    const char *dir = settings_get_string(SETTING_GPU_EMU_TRACE_DIR);
    if (!dir || !*dir)
        return;
    if (strlen(dir) >= sizeof trace_dir) {
        fprintf(stderr, "fsdpc CUDA emulator: FSDP_GPU_EMU_TRACE_DIR is over %d bytes; no stream trace\n",
                FSDP_PATH_MAX - 1);
        return;
    }
    trace = malloc(TRACE_MAX * sizeof *trace);
    if (!trace)
        return;
    snprintf(trace_dir, sizeof trace_dir, "%s", dir);
    trace_origin = clock_now_s();
    trace_on = true;
    atexit(trace_write);
}

/* ---- streams ---- */

static void *worker_main(void *arg)
{
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!s->head && !s->stopping)
            pthread_cond_wait(&s->cv, &mu);
        struct emu_op *op = s->head;
        if (!op)
            break; /* stopping, and drained */
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->running = op->what;
        pthread_mutex_unlock(&mu);
        emu_random_delay();
        emu_current_op = op->what;
        double t0 = trace_on ? clock_now_s() : 0;
        op->run(op->arg);
        if (trace_on)
            trace_add(&(struct trace_event){.what = op->what, .stream = s->id, .t0 = t0, .t1 = clock_now_s()});
        emu_current_op = NULL;
        if (op->release)
            op->release(op->arg);
        pthread_mutex_lock(&mu);
        s->running = NULL;
        s->done = op->seq;
        free(op);
        pthread_cond_broadcast(&done_cv);
    }
    /* a destroyed stream: unlinked by cudaStreamDestroy, freed here once its last op ran */
    pthread_mutex_unlock(&mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return NULL;
}

static cudaError_t stream_start(struct CUstream_st **out, unsigned flags)
{
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return cudaErrorMemoryAllocation;
    pthread_cond_init(&s->cv, NULL);
    s->flags = flags;
    /* the workers take no signals: the host's threads (and a signalfd) must see them all */
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    sigdelset(&all, SIGABRT);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&s->thread, &at, worker_main, s);
    pthread_attr_destroy(&at);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&s->cv);
        free(s);
        return cudaErrorMemoryAllocation;
    }
    pthread_mutex_lock(&mu);
    s->id = next_id++;
    s->next_stream = streams;
    streams = s;
    pthread_mutex_unlock(&mu);
    *out = s;
    return cudaSuccess;
}

static pthread_once_t legacy_once = PTHREAD_ONCE_INIT;
static cudaError_t legacy_rc;

static void legacy_start(void)
{
    trace_start();
    legacy_rc = stream_start(&legacy, 0);
}

/* The stream an API call names: NULL, cudaStreamLegacy and cudaStreamPerThread are the legacy default stream
 * (one per process here; its implicit synchronisation with blocking streams is not modelled: docs). */
static struct CUstream_st *stream_of(cudaStream_t st)
{
    if (st == NULL || st == cudaStreamLegacy || st == cudaStreamPerThread) {
        pthread_once(&legacy_once, legacy_start);
        return legacy_rc == cudaSuccess ? legacy : NULL;
    }
    return st;
}

cudaError_t emu_enqueue(cudaStream_t stream, const char *what, emu_op_fn run, void *arg, emu_op_fn release)
{
    struct CUstream_st *s = stream_of(stream);
    struct emu_op *op = s ? calloc(1, sizeof *op) : NULL;
    if (!op) {
        if (release)
            release(arg);
        return cudaErrorMemoryAllocation;
    }
    op->run = run;
    op->release = release;
    op->arg = arg;
    op->what = what;
    pthread_mutex_lock(&mu);
    op->seq = ++s->queued;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

uint64_t emu_stream_last(cudaStream_t stream)
{
    struct CUstream_st *s = stream_of(stream);
    pthread_mutex_lock(&mu);
    uint64_t q = s ? s->queued : 0;
    pthread_mutex_unlock(&mu);
    return q;
}

/* Waits (mu held) on done_cv until pred, at most HANG_S: false at the bound. */
static bool wait_until(bool (*pred)(void *, uint64_t), void *obj, uint64_t target)
{
    double deadline = clock_now_s() + HANG_S;
    while (!pred(obj, target)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&done_cv, &mu, &ts);
        if (clock_now_s() > deadline)
            return false;
    }
    return true;
}

static bool stream_reached(void *obj, uint64_t seq)
{
    return ((struct CUstream_st *)obj)->done >= seq;
}

cudaError_t emu_stream_wait(cudaStream_t stream, uint64_t seq)
{
    struct CUstream_st *s = stream_of(stream);
    if (!s)
        return cudaErrorInvalidResourceHandle;
    double t0 = trace_on ? clock_now_s() : 0;
    pthread_mutex_lock(&mu);
    bool ok = wait_until(stream_reached, s, seq);
    const char *running = s->running;
    pthread_mutex_unlock(&mu);
    trace_host_wait("host waits for a stream", t0);
    if (!ok) {
        emu_fail(cudaErrorLaunchTimeout, "stream %d: the op '%s' has not finished after %.0f s (a wait for an event "
                 "that is never recorded, or a collective whose peers never come?)", s->id,
                 running ? running : "?", HANG_S);
        return cudaErrorLaunchTimeout;
    }
    return emu_sticky_error();
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags)
{
    if (!out)
        return cudaErrorInvalidValue;
    pthread_once(&legacy_once, legacy_start); /* the legacy stream first: it starts the trace */
    return stream_start(out, flags);
}

cudaError_t cudaStreamCreate(cudaStream_t *out)
{
    return cudaStreamCreateWithFlags(out, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t st)
{
    if (!st || st == legacy || st == cudaStreamLegacy || st == cudaStreamPerThread)
        return cudaErrorInvalidResourceHandle;
    /* as CUDA: returns at once; the work queued before still runs, then the worker frees the stream */
    pthread_mutex_lock(&mu);
    for (struct CUstream_st **p = &streams; *p; p = &(*p)->next_stream)
        if (*p == st) {
            *p = st->next_stream;
            break;
        }
    st->stopping = true;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
    return emu_stream_wait(st, emu_stream_last(st));
}

/* What a query answers: the sticky error, else whether idle(obj) holds now (read under mu). */
static cudaError_t query(bool (*idle)(void *), void *obj)
{
    cudaError_t e = emu_sticky_error();
    if (e != cudaSuccess)
        return e;
    pthread_mutex_lock(&mu);
    bool done = idle(obj);
    pthread_mutex_unlock(&mu);
    return done ? cudaSuccess : cudaErrorNotReady;
}

static bool stream_idle(void *obj)
{
    struct CUstream_st *s = obj;
    return s->done >= s->queued;
}

cudaError_t cudaStreamQuery(cudaStream_t st)
{
    struct CUstream_st *s = stream_of(st);
    return s ? query(stream_idle, s) : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaDeviceSynchronize(void)
{
    struct CUstream_st *all[256];
    uint64_t upto[256];
    int n = 0;
    stream_of(NULL);
    pthread_mutex_lock(&mu);
    for (struct CUstream_st *s = streams; s && n < 256; s = s->next_stream) {
        all[n] = s;
        upto[n++] = s->queued;
    }
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < n; i++) {
        cudaError_t e = emu_stream_wait(all[i], upto[i]);
        if (e != cudaSuccess)
            return e;
    }
    return emu_sticky_error();
}

/* ---- events ---- */

static void event_unref(struct CUevent_st *ev)
{
    pthread_mutex_lock(&mu);
    bool last = --ev->refs == 0;
    pthread_mutex_unlock(&mu);
    if (last)
        free(ev);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags)
{
    if (!out)
        return cudaErrorInvalidValue;
    struct CUevent_st *ev = calloc(1, sizeof *ev);
    if (!ev)
        return cudaErrorMemoryAllocation;
    ev->flags = flags;
    ev->refs = 1;
    *out = ev;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *out)
{
    return cudaEventCreateWithFlags(out, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
    if (!ev)
        return cudaErrorInvalidResourceHandle;
    event_unref(ev); /* ops still queued keep it until they ran, as CUDA allows */
    return cudaSuccess;
}

struct event_op {
    struct CUevent_st *ev;
    uint64_t gen;
};

static void record_run(void *arg)
{
    struct event_op *o = arg;
    pthread_mutex_lock(&mu);
    if (o->ev->completed < o->gen) {
        o->ev->completed = o->gen;
        o->ev->time_s = clock_now_s();
    }
    pthread_cond_broadcast(&done_cv);
    pthread_mutex_unlock(&mu);
}

static void event_op_release(void *arg)
{
    struct event_op *o = arg;
    event_unref(o->ev);
    free(o);
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st)
{
    if (!ev)
        return cudaErrorInvalidResourceHandle;
    struct event_op *o = malloc(sizeof *o);
    if (!o)
        return cudaErrorMemoryAllocation;
    pthread_mutex_lock(&mu);
    o->ev = ev;
    o->gen = ++ev->recorded;
    ev->refs++;
    pthread_mutex_unlock(&mu);
    return emu_enqueue(st, "cudaEventRecord", record_run, o, event_op_release);
}

static bool event_reached(void *obj, uint64_t gen)
{
    return ((struct CUevent_st *)obj)->completed >= gen || emu_sticky_error() != cudaSuccess;
}

static void wait_run(void *arg)
{
    struct event_op *o = arg;
    pthread_mutex_lock(&mu);
    bool ok = wait_until(event_reached, o->ev, o->gen);
    pthread_mutex_unlock(&mu);
    if (!ok)
        emu_fail(cudaErrorLaunchTimeout, "cudaStreamWaitEvent: the event's record has not completed after %.0f s",
                 HANG_S);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t ev, unsigned int flags)
{
    (void)flags;
    if (!ev)
        return cudaErrorInvalidResourceHandle;
    struct event_op *o = malloc(sizeof *o);
    if (!o)
        return cudaErrorMemoryAllocation;
    pthread_mutex_lock(&mu);
    o->ev = ev;
    o->gen = ev->recorded; /* the record made before this call; none (0): nothing to wait for */
    ev->refs++;
    pthread_mutex_unlock(&mu);
    return emu_enqueue(st, "cudaStreamWaitEvent", wait_run, o, event_op_release);
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
    if (!ev)
        return cudaErrorInvalidResourceHandle;
    double t0 = trace_on ? clock_now_s() : 0;
    pthread_mutex_lock(&mu);
    bool ok = wait_until(event_reached, ev, ev->recorded);
    pthread_mutex_unlock(&mu);
    trace_host_wait("host waits for an event", t0);
    if (!ok) {
        emu_fail(cudaErrorLaunchTimeout, "cudaEventSynchronize: the event has not completed after %.0f s", HANG_S);
        return cudaErrorLaunchTimeout;
    }
    return emu_sticky_error();
}

static bool event_idle(void *obj)
{
    struct CUevent_st *ev = obj;
    return ev->completed >= ev->recorded;
}

cudaError_t cudaEventQuery(cudaEvent_t ev)
{
    return ev ? query(event_idle, ev) : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!ms || !start || !end)
        return cudaErrorInvalidValue;
    if ((start->flags | end->flags) & cudaEventDisableTiming)
        return cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&mu);
    bool done = start->completed && end->completed && start->completed >= start->recorded &&
                end->completed >= end->recorded;
    *ms = (float)((end->time_s - start->time_s) * 1e3);
    pthread_mutex_unlock(&mu);
    return done ? cudaSuccess : cudaErrorNotReady;
}
