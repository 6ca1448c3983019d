#include "launcher/agent.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "launcher/workers.h"

enum outcome { OUT_OK, OUT_FAILED, OUT_STORE_LOST, OUT_SIGNALLED };

#define TAIL_LINES 10
#define GOODBYE_TIMEOUT_S 5.0

/* Drains the signalfd. SIGCHLD only says "reap now"; a terminating signal is remembered and returned. */
static int read_signals(struct agent *ag, bool *child)
{
    struct signalfd_siginfo si;
    int term = 0;
    while (read(ag->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if ((int)si.ssi_signo == SIGCHLD) {
            if (child)
                *child = true;
        } else {
            term = (int)si.ssi_signo;
        }
    }
    if (term && !ag->pending_signal)
        ag->pending_signal = term;
    return term;
}

static bool join_should_stop(void *arg)
{
    struct agent *ag = arg;
    read_signals(ag, NULL);
    return ag->pending_signal != 0;
}

static char *make_record(struct agent *ag, const char *reason, const struct worker *w, int exitcode, bool fatal,
                         int generation)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "reason", reason);
    cJSON_AddNumberToObject(o, "node", ag->a->node_rank);
    cJSON_AddStringToObject(o, "host", ag->host);
    cJSON_AddNumberToObject(o, "generation", generation);
    cJSON_AddNumberToObject(o, "exitcode", exitcode);
    cJSON_AddBoolToObject(o, "fatal", fatal);
    /* a rank whose heartbeat stopped is still running: its time is that of its last beat */
    double now = clock_now_s();
    cJSON_AddNumberToObject(o, "time", w && !w->running          ? w->exit_wall_s
                                       : w && w->hb_silent_s > 0 ? clock_wall_s() - (now - w->last_beat_s)
                                                                 : clock_wall_s());
    if (w) {
        char st[256];
        if (w->hb_silent_s > 0) {
            char why[160];
            workers_describe_proc_state(w->pid, why, sizeof why);
            snprintf(st, sizeof st, "no heartbeat for %.1f s while %s", w->hb_silent_s, why);
            cJSON_AddNumberToObject(o, "heartbeat_age_s", w->hb_silent_s);
        } else {
            workers_describe_status(w->status, st, sizeof st);
        }
        cJSON_AddNumberToObject(o, "rank", w->rank);
        cJSON_AddNumberToObject(o, "local_rank", w->local_rank);
        cJSON_AddNumberToObject(o, "pid", w->pid);
        cJSON_AddStringToObject(o, "status", st);
        cJSON_AddStringToObject(o, "stderr_tail", output_tail(&w->err, TAIL_LINES));
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* Prints the root cause the way a user reads it first: who, where, how, when, and its last words. */
static int report_failure(const char *record)
{
    cJSON *o = cJSON_Parse(record);
    if (!o) {
        log_error("job failed; root-cause record unreadable: %s", record);
        return 1;
    }
    const cJSON *ec = cJSON_GetObjectItem(o, "exitcode");
    int code = cJSON_IsNumber(ec) && ec->valueint > 0 ? ec->valueint : 1;
    const char *reason = cJSON_GetStringValue(cJSON_GetObjectItem(o, "reason"));
    const char *host = cJSON_GetStringValue(cJSON_GetObjectItem(o, "host"));
    const cJSON *t = cJSON_GetObjectItem(o, "time");
    char when[64] = "?";
    if (cJSON_IsNumber(t)) {
        time_t secs = (time_t)t->valuedouble;
        struct tm tm;
        gmtime_r(&secs, &tm);
        int ms = (int)((t->valuedouble - (double)secs) * 1000);
        size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(when + n, sizeof when - n, ".%03dZ", ms);
    }
    const cJSON *rank = cJSON_GetObjectItem(o, "rank");
    char msg[OUTPUT_TAIL_BYTES + 1024];
    int n;
    if (cJSON_IsNumber(rank)) {
        const char *tail = cJSON_GetStringValue(cJSON_GetObjectItem(o, "stderr_tail"));
        n = snprintf(msg, sizeof msg,
                     "job failed. Root cause (first failure): rank %d (local rank %d) on node %d, host %s, pid %d: "
                     "%s at %s\n  last lines of rank %d's stderr:\n%s",
                     rank->valueint, cJSON_GetObjectItem(o, "local_rank")->valueint,
                     cJSON_GetObjectItem(o, "node")->valueint, host ? host : "?",
                     cJSON_GetObjectItem(o, "pid")->valueint,
                     cJSON_GetStringValue(cJSON_GetObjectItem(o, "status")), when, rank->valueint,
                     tail && *tail ? "" : "    (nothing)");
        size_t used = n > 0 && (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
        /* Indent the tail so it reads as part of the summary. */
        for (const char *p = tail ? tail : ""; *p && used + 8 < sizeof msg;) {
            const char *nl = strchr(p, '\n');
            size_t len = nl ? (size_t)(nl - p) : strlen(p);
            int w = snprintf(msg + used, sizeof msg - used, "    %.*s\n", (int)len, p);
            used += w > 0 ? (size_t)w : 0;
            if (used >= sizeof msg)
                used = sizeof msg - 1;
            p = nl ? nl + 1 : p + len;
        }
        while (used > 0 && msg[used - 1] == '\n')
            msg[--used] = 0;
    } else {
        n = snprintf(msg, sizeof msg, "job failed. Root cause: %s (node %d, host %s, at %s)", reason ? reason : "?",
                     cJSON_GetObjectItem(o, "node") ? cJSON_GetObjectItem(o, "node")->valueint : -1,
                     host ? host : "?", when);
    }
    (void)n;
    log_error("%s", msg);
    cJSON_Delete(o);
    return code;
}

static bool record_fatal(const char *record)
{
    cJSON *o = cJSON_Parse(record);
    bool fatal = o && cJSON_IsTrue(cJSON_GetObjectItem(o, "fatal"));
    cJSON_Delete(o);
    return fatal;
}

/* Waits for pipes and signals until the deadline; pumps output and reaps. Returns the index of the
 * first worker seen failing in this call, or -1. */
static int wait_events(struct agent *ag, struct worker_group *g, double deadline, bool *child_seen)
{
    struct pollfd *pf = calloc((size_t)(3 * g->n + 1), sizeof *pf);
    struct out_stream **who = calloc((size_t)(3 * g->n + 1), sizeof *who);
    struct worker **beats = calloc((size_t)(3 * g->n + 1), sizeof *beats); /* the heartbeat pipes' ranks */
    int first_failed = -1;
    if (!pf || !who || !beats) {
        free(pf);
        free(who);
        free(beats);
        sleep(0);
        return -1;
    }
    int n = 0;
    pf[n++] = (struct pollfd){.fd = ag->sigfd, .events = POLLIN};
    for (int i = 0; i < g->n; i++) {
        struct out_stream *s[2] = {&g->w[i].out, &g->w[i].err};
        for (int k = 0; k < 2; k++)
            if (s[k]->fd >= 0) {
                who[n] = s[k];
                pf[n++] = (struct pollfd){.fd = s[k]->fd, .events = POLLIN};
            }
        if (g->w[i].hb_fd >= 0) {
            beats[n] = &g->w[i];
            pf[n++] = (struct pollfd){.fd = g->w[i].hb_fd, .events = POLLIN};
        }
    }
    int timeout_ms = -1;
    if (isfinite(deadline)) {
        double left = deadline - clock_now_s();
        timeout_ms = left <= 0 ? 0 : (int)ceil(left * 1000);
    }
    int pr = poll(pf, (nfds_t)n, timeout_ms);
    if (pr > 0) {
        double now = clock_now_s();
        for (int i = 1; i < n; i++)
            if (pf[i].revents && beats[i])
                workers_pump_heartbeat(beats[i], now);
            else if (pf[i].revents)
                output_pump(who[i]);
        if (pf[0].revents) {
            bool child = false;
            int sig = read_signals(ag, &child);
            if (sig) {
                /* Forwarded as torchrun does; the workers get the chance to exit cleanly. */
                log_warn("received SIG%s: forwarding it to the workers and stopping the job", sigabbrev_np(sig));
                workers_signal(g, sig);
            }
            if (child && child_seen)
                *child_seen = true;
        }
    }
    workers_reap(g, &first_failed);
    free(pf);
    free(who);
    free(beats);
    return first_failed;
}

/* SIGTERM (unless a forwarded signal already asked them), then SIGKILL after --shutdown_timeout. */
static void teardown(struct agent *ag, struct worker_group *g, bool already_signalled)
{
    if (g->running > 0 && !already_signalled) {
        workers_signal(g, SIGTERM);
        workers_signal(g, SIGCONT); /* a stopped rank (SIGSTOP) acts on the SIGTERM only once continued */
    }
    double kill_at = clock_now_s() + ag->a->shutdown_timeout_s;
    bool killed = false;
    int seen_signal = ag->pending_signal;
    while (g->running > 0) {
        double now = clock_now_s();
        if (!killed && now >= kill_at) {
            log_warn("%d worker(s) still running %.1f s after SIGTERM (--shutdown_timeout): sending SIGKILL",
                     g->running, ag->a->shutdown_timeout_s);
            workers_signal(g, SIGKILL);
            killed = true;
        }
        wait_events(ag, g, killed ? now + 0.1 : kill_at, NULL);
        if (ag->pending_signal && ag->pending_signal != seen_signal && !killed) {
            /* A second signal while stopping: the user wants it over now. */
            workers_signal(g, SIGKILL);
            killed = true;
        }
    }
    for (int i = 0; i < g->n; i++) {
        char st[64];
        workers_describe_status(g->w[i].status, st, sizeof st);
        log_debug("rank %d (local rank %d, pid %d) ended: %s", g->w[i].rank, g->w[i].local_rank, (int)g->w[i].pid, st);
        char shown[128];
        if (g->w[i].hb_silent_s > 0)
            snprintf(shown, sizeof shown, "no heartbeat for %.1f s, then %s", g->w[i].hb_silent_s, st);
        else
            snprintf(shown, sizeof shown, "%s", st);
        status_server_note_exit(ag->status, g->w[i].rank, shown,
                                workers_exit_code(g->w[i].status) == 0 && g->w[i].hb_silent_s <= 0);
    }
    /* Let the pipes give their last lines (writers may be grandchildren: bounded). */
    double drain_until = clock_now_s() + 1.0;
    for (;;) {
        bool open = false;
        for (int i = 0; i < g->n; i++)
            open = open || g->w[i].out.fd >= 0 || g->w[i].err.fd >= 0;
        if (!open || clock_now_s() >= drain_until)
            break;
        wait_events(ag, g, drain_until, NULL);
    }
}

struct run_result {
    enum outcome outcome;
    char *root; /* failure record (malloc'd) for OUT_FAILED / OUT_SIGNALLED */
};

static char *publish(struct agent *ag, int gen, char *record)
{
    if (ag->a->nnodes == 1 || !record)
        return record;
    char *root = NULL;
    if (rdzv_publish_failure(ag->r, gen, record, &root)) {
        log_warn("could not publish the failure to the store: %s", error_message());
        return record;
    }
    free(record);
    return root;
}

/* fsdp-worker's exit code for "stopped because another rank failed" (worker/main.c). */
#define EXIT_PEER_FAILED 3
/* How long the root cause is looked for after a rank that failed because of another one. */
#define ROOT_GRACE_S 0.5

/* The first failure reaped is not always the first that happened: a rank killed by a signal is seen dead
 * by its peers (its main thread is a zombie) while its other threads still exit, and until they have,
 * it cannot be reaped, so a peer that reports it and exits (code 3) can be reaped first. When the failure
 * at hand is such a consequence, wait up to ROOT_GRACE_S (output pumped, nothing signalled) for a
 * failure that is not, and take the earliest one reaped; without one, the first failure stands. */
/* The earliest reaped local failure that is not a consequence of another's (exit code 3), or -1. */
static int earliest_own_failure(const struct worker_group *g)
{
    int best = -1;
    for (int i = 0; i < g->n; i++) {
        const struct worker *w = &g->w[i];
        int code = w->running ? 0 : workers_exit_code(w->status);
        if (code != 0 && code != EXIT_PEER_FAILED && (best < 0 || w->exit_wall_s < g->w[best].exit_wall_s))
            best = i;
    }
    return best;
}

static int root_find(struct agent *ag, struct worker_group *g, int failed)
{
    if (workers_exit_code(g->w[failed].status) != EXIT_PEER_FAILED)
        return failed;
    double until = clock_now_s() + ROOT_GRACE_S;
    for (;;) {
        int best = earliest_own_failure(g);
        if (best >= 0)
            return best;
        if (g->running == 0 || ag->pending_signal || clock_now_s() >= until)
            return failed;
        wait_events(ag, g, fmin(until, clock_now_s() + 0.05), NULL);
    }
}

/* How long a node whose failure is only a consequence (exit 3) waits for another node's root cause. */
#define ROOT_GRACE_NODES_S 2.0

/* On several nodes a local rank that exits 3 usually followed a rank of another node, which that node's
 * launcher is about to publish; publishing the consequence first would make it the job's root cause
 * (first published wins). So wait up to ROOT_GRACE_NODES_S, pumping output and polling the store, for
 * another node's record (returned, malloc'd) or for a local failure that is not a consequence (put in
 * *failed; NULL returned). With neither, NULL: the consequence is published after all. */
static char *root_await_remote(struct agent *ag, struct worker_group *g, int gen, int *failed)
{
    double until = clock_now_s() + ROOT_GRACE_NODES_S;
    while (!ag->pending_signal) {
        struct rdzv_status st;
        if (rdzv_poll(ag->r, gen, &st))
            return NULL;
        if (st.failure)
            return st.failure;
        int own = earliest_own_failure(g);
        if (own >= 0) {
            *failed = own;
            return NULL;
        }
        if (clock_now_s() >= until)
            return NULL;
        wait_events(ag, g, fmin(until, clock_now_s() + 0.05), NULL);
    }
    return NULL;
}

/* A failure of exit code 2 (a training error, such as a collective's timeout) or 3 (a peer failed) while a
 * local rank has missed this many seconds of fsdp-worker's 0.5 s heartbeats is taken to follow from that
 * rank: it stopped (SIGSTOP, frozen), and its peers timed out waiting on it. */
#define RANK_SUSPECT_SILENT_S 2.0

/* The root cause when a local rank's heartbeat stopped while its process lives (docs/launcher.md, "Ranks'
 * heartbeats"): names the rank, its node, how long it has been silent and what its process is doing. */
static struct run_result heartbeat_lost(struct agent *ag, struct worker_group *g, int gen, int silent,
                                        const struct worker *after)
{
    struct worker *w = &g->w[silent];
    w->hb_silent_s = clock_now_s() - w->last_beat_s;
    char why[160];
    workers_describe_proc_state(w->pid, why, sizeof why);
    char follow[128] = "";
    if (after) {
        char st[64];
        workers_describe_status(after->status, st, sizeof st);
        snprintf(follow, sizeof follow, "; rank %d's failure (%s) followed from it", after->rank, st);
    }
    log_error("rank %d (local rank %d, pid %d) on node %d sent no heartbeat for %.1f s while %s%s; stopping every "
              "rank", w->rank, w->local_rank, (int)w->pid, ag->a->node_rank, w->hb_silent_s, why, follow);
    struct run_result res = {OUT_FAILED, NULL};
    res.root = publish(ag, gen, make_record(ag, "rank stopped sending heartbeats", w, 1, false, gen));
    return res;
}

static struct run_result supervise(struct agent *ag, struct worker_group *g, int gen)
{
    const struct launch_args *a = ag->a;
    struct run_result res = {OUT_OK, NULL};
    bool multi = a->nnodes > 1;
    bool done_marked = false;
    double next_tick = clock_now_s() + a->monitor_interval_s;
    for (;;) {
        /* single node too: the ranks' heartbeats are checked every --monitor_interval */
        int failed = wait_events(ag, g, next_tick, NULL);
        if (failed >= 0) {
            int code = workers_exit_code(g->w[failed].status);
            int silent = code == 2 || code == EXIT_PEER_FAILED
                             ? workers_silent(g, clock_now_s(), RANK_SUSPECT_SILENT_S)
                             : -1;
            if (silent >= 0)
                return heartbeat_lost(ag, g, gen, silent, &g->w[failed]);
            failed = root_find(ag, g, failed);
            if (multi && workers_exit_code(g->w[failed].status) == EXIT_PEER_FAILED) {
                char *remote = root_await_remote(ag, g, gen, &failed);
                if (remote) {
                    log_error("rank %d (local rank %d) stopped because another rank failed, and another node "
                              "reported that failure; stopping every local rank",
                              g->w[failed].rank, g->w[failed].local_rank);
                    res.outcome = OUT_FAILED;
                    res.root = remote;
                    return res;
                }
            }
            const struct worker *w = &g->w[failed];
            /* Output still in the pipe belongs in the summary's tail. */
            while (output_pump((struct out_stream *)&w->err) == 0 && w->err.fd >= 0) {
                struct pollfd p = {.fd = w->err.fd, .events = POLLIN};
                if (poll(&p, 1, 200) <= 0)
                    break;
            }
            char st[64];
            workers_describe_status(w->status, st, sizeof st);
            log_error("rank %d (local rank %d, pid %d) failed: %s; stopping every rank", w->rank, w->local_rank,
                      (int)w->pid, st);
            res.outcome = OUT_FAILED;
            res.root = publish(ag, gen, make_record(ag, "worker failed", w, workers_exit_code(w->status), false, gen));
            return res;
        }
        if (ag->pending_signal) {
            char reason[128];
            snprintf(reason, sizeof reason, "fsdp-launch on node %d (%s) received SIG%s", a->node_rank, ag->host,
                     sigabbrev_np(ag->pending_signal));
            res.outcome = OUT_SIGNALLED;
            res.root = publish(ag, gen, make_record(ag, reason, NULL, 128 + ag->pending_signal, true, gen));
            return res;
        }
        int silent = workers_silent(g, clock_now_s(), ag->heartbeat_timeout_s);
        if (silent >= 0)
            return heartbeat_lost(ag, g, gen, silent, NULL);
        if (g->running == 0 && !done_marked) {
            done_marked = true;
            if (!multi)
                return res;
            if (rdzv_mark_done(ag->r, gen)) {
                res.outcome = OUT_STORE_LOST;
                return res;
            }
            log_info("all %d local workers succeeded; waiting for the other nodes", g->n);
            next_tick = clock_now_s();
        }
        if (clock_now_s() < next_tick)
            continue;
        next_tick = clock_now_s() + a->monitor_interval_s;
        if (!multi)
            continue;
        struct rdzv_status st;
        if (rdzv_poll(ag->r, gen, &st)) {
            res.outcome = OUT_STORE_LOST;
            return res;
        }
        if (st.failure) {
            res.outcome = OUT_FAILED;
            res.root = st.failure;
            log_error("another node reported a failure; stopping every local rank");
            return res;
        }
        if (st.lost_node >= 0) {
            char reason[256];
            snprintf(reason, sizeof reason, "node %d stopped sending heartbeats: its fsdp-launch died or its network "
                     "is down", st.lost_node);
            log_error("%s", reason);
            res.outcome = OUT_FAILED;
            res.root = publish(ag, gen, make_record(ag, reason, NULL, 1, false, gen));
            return res;
        }
        if (done_marked && st.done_nodes >= a->nnodes)
            return res;
    }
}

int agent_run(struct agent *ag)
{
    const struct launch_args *a = ag->a;
    int min_gen = 0;
    for (;;) {
        struct rdzv_assignment as;
        double t0 = clock_now_s();
        int rc = rdzv_join(ag->r, min_gen, join_should_stop, ag, &as);
        if (rc == FSDP_EABORTED || ag->pending_signal) {
            log_warn("received SIG%s while waiting for the other nodes; exiting", sigabbrev_np(ag->pending_signal));
            return 128 + ag->pending_signal;
        }
        if (rc) {
            log_error("%s", error_message());
            return 1;
        }
        status_server_note_attempt(ag->status, as.generation, as.generation);
        if (a->nnodes > 1)
            log_info("generation %d: all %d nodes joined in %.2f s; ranks %d..%d of %d", as.generation, a->nnodes,
                     clock_now_s() - t0, as.rank_base, as.rank_base + a->nproc_per_node - 1, as.world_size);
        struct spawn_env env = {.program = ag->program, .argv = ag->argv, .launch_config = ag->launch_config,
                                .host = ag->host, .master_port = rdzv_port(ag->r),
                                .secret = ag->secret, .omp_threads = ag->omp_threads,
                                .restart_count = as.generation};
        struct worker_group g;
        struct run_result res;
        rc = workers_spawn(&g, a, &as, &env);
        if (rc) {
            log_error("cannot start the workers: %s", error_message());
            char reason[512];
            snprintf(reason, sizeof reason, "node %d could not start its workers: %s", a->node_rank, error_message());
            res.outcome = OUT_FAILED;
            res.root = publish(ag, as.generation, make_record(ag, reason, NULL, 1, true, as.generation));
        } else {
            res = supervise(ag, &g, as.generation);
            teardown(ag, &g, res.outcome == OUT_SIGNALLED);
            workers_release(&g);
        }
        if (res.outcome == OUT_STORE_LOST) {
            log_error("lost the rendezvous store on node 0 (%s:%d): %s. The node hosting the store went away, so "
                      "this node stops too", a->master_addr, rdzv_port(ag->r), error_message());
            return 1;
        }
        if (res.outcome == OUT_OK) {
            if (a->nnodes > 1 && rdzv_finish(ag->r, as.generation, GOODBYE_TIMEOUT_S))
                log_warn("%s", error_message());
            return 0;
        }
        status_server_note_failure(ag->status, res.root);
        int code = report_failure(res.root ? res.root : "{}");
        bool fatal = res.root && record_fatal(res.root);
        free(res.root);
        if (res.outcome == OUT_SIGNALLED)
            code = 128 + ag->pending_signal;
        if (!fatal && res.outcome == OUT_FAILED && as.generation < a->max_restarts && !ag->pending_signal) {
            log_warn("restarting the job: attempt %d of at most %d restarts", as.generation + 1, a->max_restarts);
            min_gen = as.generation + 1;
            continue;
        }
        if (a->nnodes > 1)
            rdzv_finish(ag->r, as.generation, GOODBYE_TIMEOUT_S);
        return code;
    }
}
