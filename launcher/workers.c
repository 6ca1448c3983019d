#include "launcher/workers.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"
#include "launcher/devices.h"
#include "launcher/guard.h"

extern char **environ;

/* In a forked child whose execve failed: "fsdp-launch: cannot execute PATH: DESCRIPTION (ENAME)" on its
 * stderr (the worker's pipe), from async-signal-safe pieces only (strerrordesc_np and strerrorname_np
 * return static strings). */
static void exec_failed(const char *path, int err)
{
    char msg[FSDP_PATH_MAX + 256]; /* the path and the words around it */
    size_t n = 0;
    const char *parts[] = {"fsdp-launch: cannot execute ", path, ": ", strerrordesc_np(err), " (",
                           strerrorname_np(err), ")", err == ENOEXEC ? ": not a binary, and no #! line" : "",
                           err == ENOENT ? ": the program or its #! interpreter is missing" : "", "\n"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        for (const char *p = parts[i] ? parts[i] : "?"; *p && n < sizeof msg - 2; p++)
            msg[n++] = *p;
    if (msg[n - 1] != '\n')
        msg[n++] = '\n';
    ssize_t ignored = write(2, msg, n);
    (void)ignored;
}

/* torchrun's variables replace any inherited ones of the same name. */
static const char *const overridden[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "FSDP_RDZV_TOKEN",
    "FSDP_STORE_PREFIX", "OMP_NUM_THREADS", "FSDP_LOG_LEVEL", "FSDP_LAUNCH_CONFIG", "FSDP_HEARTBEAT_FD", NULL};

static bool is_overridden(const char *entry)
{
    for (int i = 0; overridden[i]; i++) {
        size_t n = strlen(overridden[i]);
        if (strncmp(entry, overridden[i], n) == 0 && entry[n] == '=')
            return true;
    }
    return false;
}

static char *strdup_prefixed(const char *prefix, const char *value)
{
    char *s = malloc(strlen(prefix) + strlen(value) + 1);
    if (s)
        sprintf(s, "%s%s", prefix, value);
    return s;
}

/* Built in the parent: after fork only async-signal-safe calls are allowed (the store server thread
 * may hold malloc's lock at the moment of fork), so the child only calls execve. */
static char **build_env(const struct launch_args *a, const struct rdzv_assignment *as, const struct spawn_env *e,
                        int local_rank, int hb_fd)
{
    size_t n = 0;
    for (char **p = environ; *p; p++)
        n++;
    char **env = calloc(n + 32, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    bool set_gpus = a->gpu_ids[0] || a->virtual_local_rank;
    for (char **p = environ; *p; p++)
        if (!is_overridden(*p) && !(set_gpus && strncmp(*p, "CUDA_VISIBLE_DEVICES=", 21) == 0))
            env[k++] = strdup(*p);
    int rank = as->rank_base + local_rank;
    char v[1024];
#define ADD(...)                                   \
    do {                                           \
        snprintf(v, sizeof v, __VA_ARGS__);        \
        env[k++] = strdup(v);                      \
    } while (0)
    ADD("RANK=%d", rank);
    /* --virtual_local_rank: every worker is local rank 0 of a node that shows it one GPU. */
    ADD("LOCAL_RANK=%d", a->virtual_local_rank ? 0 : local_rank);
    ADD("WORLD_SIZE=%d", as->world_size);
    ADD("LOCAL_WORLD_SIZE=%d", a->nproc_per_node);
    ADD("GROUP_RANK=%d", a->node_rank);
    ADD("GROUP_WORLD_SIZE=%d", a->nnodes);
    ADD("ROLE_NAME=%s", a->role);
    ADD("ROLE_RANK=%d", rank);
    ADD("ROLE_WORLD_SIZE=%d", as->world_size);
    ADD("MASTER_ADDR=%s", a->master_addr);
    ADD("MASTER_PORT=%d", e->master_port);
    ADD("TORCHELASTIC_RESTART_COUNT=%d", e->restart_count);
    ADD("TORCHELASTIC_MAX_RESTARTS=%d", a->max_restarts);
    ADD("TORCHELASTIC_RUN_ID=%s", a->run_id);
    /* As torchrun: PyTorch workers then open a TCPStore client on MASTER_ADDR:MASTER_PORT, our store,
     * instead of rank 0 hosting one there. */
    if (!a->no_torch_store)
        ADD("TORCHELASTIC_USE_AGENT_STORE=True");
    if (!getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING"))
        ADD("TORCH_NCCL_ASYNC_ERROR_HANDLING=1");
    ADD("FSDP_STORE_PREFIX=%s", as->prefix);
    ADD("FSDP_HEARTBEAT_FD=%d", hb_fd);
    /* --log_level (else the launcher's own FSDP_LOG_LEVEL) reaches the workers: one knob for the job. */
    static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};
    ADD("FSDP_LOG_LEVEL=%s", level_names[a->log_level >= LOG_DEBUG && a->log_level <= LOG_OFF ? a->log_level
                                                                                              : LOG_INFO]);
    if (e->secret)
        ADD("FSDP_RDZV_TOKEN=%s", e->secret);
    if (set_gpus) {
        char gpu[64] = "";
        if (a->virtual_local_rank) {
            /* The worker's GPU among those --gpu_ids (else CUDA_VISIBLE_DEVICES) shows. */
            const char *p = a->gpu_ids;
            for (int i = 0; *p && i < local_rank; i++)
                p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p);
            if (a->gpu_ids[0])
                snprintf(gpu, sizeof gpu, "%.*s", (int)strcspn(p, ","), p);
            else if (devices_gpu_id(local_rank, gpu, sizeof gpu) != 0)
                snprintf(gpu, sizeof gpu, "-1");
            ADD("CUDA_VISIBLE_DEVICES=%s", gpu);
        } else {
            ADD("CUDA_VISIBLE_DEVICES=%s", a->gpu_ids);
        }
    }
    if (e->omp_threads)
        ADD("OMP_NUM_THREADS=%s", e->omp_threads);
    else if (getenv("OMP_NUM_THREADS"))
        ADD("OMP_NUM_THREADS=%s", getenv("OMP_NUM_THREADS"));
#undef ADD
    if (e->launch_config)
        env[k++] = strdup_prefixed("FSDP_LAUNCH_CONFIG=", e->launch_config);
    for (size_t i = 0; i < k; i++)
        if (!env[i]) {
            for (size_t j = 0; j < k; j++)
                free(env[j]);
            free(env);
            return NULL;
        }
    return env;
}

static void free_env(char **env)
{
    if (!env)
        return;
    for (char **p = env; *p; p++)
        free(*p);
    free(env);
}

/* torchrun's --log_line_prefix_template: ${role_name}, ${local_rank}, ${rank}, ${hostname}. */
static void render_prefix(const char *tmpl, const char *role, int local_rank, int rank, const char *host, char *out,
                          size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (const char *p = tmpl; *p && n + 1 < cap;) {
        char num[16];
        const char *sub = NULL;
        size_t skip = 0;
        if (!strncmp(p, "${role_name}", 12))
            sub = role, skip = 12;
        else if (!strncmp(p, "${local_rank}", 13))
            snprintf(num, sizeof num, "%d", local_rank), sub = num, skip = 13;
        else if (!strncmp(p, "${rank}", 7))
            snprintf(num, sizeof num, "%d", rank), sub = num, skip = 7;
        else if (!strncmp(p, "${hostname}", 11))
            sub = host, skip = 11;
        if (sub) {
            n += (size_t)snprintf(out + n, cap - n, "%s", sub);
            p += skip;
        } else {
            out[n++] = *p++;
            out[n] = 0;
        }
        if (n >= cap)
            n = cap - 1;
    }
}

static int open_log(const char *dir, const char *name)
{
    char path[FSDP_PATH_MAX];
    if (fs_path_format(path, sizeof path, "log file", "%s/%s", dir, name) != 0)
        return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        error_set(FSDP_EIO, "cannot create log file %s: %s", path, strerror(errno));
    return fd;
}

static int spawn_one(struct worker *w, const struct launch_args *a, const struct rdzv_assignment *as,
                     const struct spawn_env *e)
{
    int outp[2] = {-1, -1}, errp[2] = {-1, -1}, hbp[2] = {-1, -1};
    int log_out = -1, log_err = -1;
    char **env = NULL;
    int rc = 0;
    char logdir[FSDP_PATH_MAX] = "";
    if (a->log_dir[0]) {
        FSDP_TRY(fs_path_format(logdir, sizeof logdir, "log directory", "%s/%s/attempt_%d/%d", a->log_dir, a->run_id,
                                e->restart_count, w->local_rank));
        FSDP_TRY(fs_mkdir_p(logdir, "log directory"));
        log_out = open_log(logdir, "stdout.log");
        log_err = log_out >= 0 ? open_log(logdir, "stderr.log") : -1;
        if (log_err < 0) {
            rc = FSDP_EIO;
            goto fail;
        }
    }
    if (pipe2(outp, O_CLOEXEC) || pipe2(errp, O_CLOEXEC) || pipe2(hbp, O_CLOEXEC)) {
        rc = error_set(FSDP_EIO, "pipe: %s", strerror(errno));
        goto fail;
    }
    env = build_env(a, as, e, w->local_rank, hbp[1]);
    if (!env) {
        rc = error_set(FSDP_ENOMEM, "out of memory building the worker environment");
        goto fail;
    }
    pid_t parent = getpid();
    sigset_t none;
    sigemptyset(&none);
    /* What the child resets before execve. A disposition of SIG_IGN survives fork and exec, and a job script
     * that starts the launcher in the background (`fsdp-launch ... &`) or under nohup hands it SIGINT and
     * SIGQUIT (or SIGHUP) ignored: the launcher still reads them (blocked signals reach its signalfd), but
     * workers that inherited the SIG_IGN would never receive the ones it forwards, and the job would wait
     * --shutdown_timeout. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    pid_t pid = fork();
    if (pid < 0) {
        rc = error_set(FSDP_EIO, "fork: %s", strerror(errno));
        goto fail;
    }
    if (pid == 0) {
        /* Child: async-signal-safe calls only until execve. */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) /* the launcher died before prctl took effect */
            _exit(128 + SIGKILL);
        sigaction(SIGPIPE, &dfl, NULL);
        for (int i = 0; i < a->n_signals; i++)
            sigaction(a->signals[i], &dfl, NULL);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(outp[1], 1);
        dup2(errp[1], 2);
        fcntl(hbp[1], F_SETFD, 0); /* the heartbeat's end, the only pipe kept across execve */
        execve(e->program, e->argv, env);
        exec_failed(e->program, errno);
        _exit(127);
    }
    setpgid(pid, pid); /* also from the parent, so signalling the group never races the child's own call */
    guard_watch(pid);
    free_env(env);
    close(outp[1]);
    close(errp[1]);
    close(hbp[1]);
    fcntl(hbp[0], F_SETFL, O_NONBLOCK);
    w->hb_fd = hbp[0];
    fcntl(outp[0], F_SETFL, O_NONBLOCK);
    fcntl(errp[0], F_SETFL, O_NONBLOCK);
    int rank = w->rank;
    bool shown = launch_rank_shown(a, w->local_rank);
    int red = a->log_dir[0] ? launch_std_mask(a->redirects, w->local_rank) : 0;
    int tee = launch_std_mask(a->tee, w->local_rank);
    bool out_console = shown && ((tee & 1) || !(red & 1));
    bool err_console = shown && ((tee & 2) || !(red & 2));
    output_init(&w->out, outp[0], out_console ? 1 : -1, log_out, (tee & 1) != 0, rank, false);
    output_init(&w->err, errp[0], err_console ? 2 : -1, log_err, (tee & 2) != 0, rank, true);
    if (a->log_dir[0] && a->log_max_bytes > 0) {
        char path[FSDP_PATH_MAX]; /* fits: open_log opened these two above */
        snprintf(path, sizeof path, "%s/stdout.log", logdir);
        output_set_rotation(&w->out, path, (unsigned long long)a->log_max_bytes);
        snprintf(path, sizeof path, "%s/stderr.log", logdir);
        output_set_rotation(&w->err, path, (unsigned long long)a->log_max_bytes);
    }
    if (a->prefix_template[0]) {
        char prefix[128];
        render_prefix(a->prefix_template, a->role, w->local_rank, rank, e->host, prefix, sizeof prefix);
        output_set_prefix(&w->out, prefix);
        output_set_prefix(&w->err, prefix);
    }
    w->pid = pid;
    w->running = true;
    return 0;
fail:
    free_env(env);
    for (int i = 0; i < 2; i++) {
        if (outp[i] >= 0)
            close(outp[i]);
        if (errp[i] >= 0)
            close(errp[i]);
        if (hbp[i] >= 0)
            close(hbp[i]);
    }
    if (log_out >= 0)
        close(log_out);
    if (log_err >= 0)
        close(log_err);
    return rc;
}

/* torchrun's comma_separated_list: items split at ',', with ",," standing for a comma inside one. */
static char **split_needles(const char *text)
{
    size_t n = 2;
    for (const char *p = text; *p; p++)
        n += *p == ',';
    char **v = calloc(n, sizeof *v);
    char *buf = malloc(strlen(text) + 1);
    if (!v || !buf) {
        free(v);
        free(buf);
        return NULL;
    }
    size_t k = 0, len = 0;
    for (const char *p = text;; p++) {
        if (*p == ',' && p[1] == ',') {
            buf[len++] = ',';
            p++;
            continue;
        }
        if (*p == ',' || !*p) {
            buf[len] = 0;
            if (len && !(v[k++] = strdup(buf)))
                break;
            len = 0;
            if (!*p)
                break;
            continue;
        }
        buf[len++] = *p;
    }
    free(buf);
    return v;
}

static void free_needles(char **v)
{
    for (char **p = v; p && *p; p++)
        free(*p);
    free(v);
}

/* <log_dir>/<run_id>/attempt_<n>/filtered_{stdout,stderr}.log, shared by every rank of this node. */
static int open_filtered(struct worker_group *g, const struct launch_args *a, const struct spawn_env *e)
{
    for (int k = 0; k < 2; k++) {
        if (!a->dup_filters[k][0])
            continue;
        char dir[FSDP_PATH_MAX];
        FSDP_TRY(fs_path_format(dir, sizeof dir, "log directory", "%s/%s/attempt_%d", a->log_dir, a->run_id,
                                e->restart_count));
        FSDP_TRY(fs_mkdir_p(dir, "log directory"));
        g->filters[k] = split_needles(a->dup_filters[k]);
        if (!g->filters[k])
            return error_set(FSDP_ENOMEM, "out of memory");
        g->filtered_fd[k] = open_log(dir, k ? "filtered_stderr.log" : "filtered_stdout.log");
        if (g->filtered_fd[k] < 0)
            return FSDP_EIO;
    }
    return 0;
}

int workers_spawn(struct worker_group *g, const struct launch_args *a, const struct rdzv_assignment *as,
                  const struct spawn_env *e)
{
    memset(g, 0, sizeof *g);
    g->filtered_fd[0] = g->filtered_fd[1] = -1;
    g->w = calloc((size_t)a->nproc_per_node, sizeof *g->w);
    if (!g->w)
        return error_set(FSDP_ENOMEM, "out of memory");
    int frc = open_filtered(g, a, e);
    if (frc) {
        workers_release(g);
        return frc;
    }
    for (int i = 0; i < a->nproc_per_node; i++) {
        struct worker *w = &g->w[i];
        w->local_rank = i;
        w->rank = as->rank_base + i;
        w->out.fd = w->err.fd = w->out.log_fd = w->err.log_fd = w->hb_fd = -1;
        int rc = spawn_one(w, a, as, e);
        if (rc) {
            g->n = i;
            workers_signal(g, SIGKILL);
            while (g->running > 0 && waitpid(-1, NULL, 0) > 0)
                g->running--;
            workers_release(g);
            return rc;
        }
        output_set_filter(&w->out, g->filtered_fd[0], g->filters[0]);
        output_set_filter(&w->err, g->filtered_fd[1], g->filters[1]);
        g->n = i + 1;
        g->running++;
    }
    return 0;
}

int workers_reap(struct worker_group *g, int *first_failed)
{
    int reaped = 0;
    *first_failed = -1;
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0)
            break;
        for (int i = 0; i < g->n; i++) {
            struct worker *w = &g->w[i];
            if (w->pid != pid || !w->running)
                continue;
            w->running = false;
            w->status = st;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            w->exit_wall_s = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
            g->running--;
            reaped++;
            if (workers_exit_code(st) != 0 && *first_failed < 0)
                *first_failed = i;
        }
    }
    return reaped;
}

void workers_signal(struct worker_group *g, int sig)
{
    for (int i = 0; i < g->n; i++)
        if (g->w[i].running)
            kill(-g->w[i].pid, sig);
}

void workers_release(struct worker_group *g)
{
    for (int i = 0; i < g->n; i++) {
        struct worker *w = &g->w[i];
        if (w->pid > 0) {
            kill(-w->pid, SIGKILL); /* grandchildren left in the group */
            guard_forget(w->pid);
        }
        output_close(&w->out);
        output_close(&w->err);
        if (w->hb_fd >= 0)
            close(w->hb_fd);
    }
    for (int k = 0; k < 2; k++) {
        if (g->filtered_fd[k] >= 0)
            close(g->filtered_fd[k]);
        free_needles(g->filters[k]);
    }
    free(g->w);
    memset(g, 0, sizeof *g);
    g->filtered_fd[0] = g->filtered_fd[1] = -1;
}

void workers_pump_heartbeat(struct worker *w, double now)
{
    char buf[256];
    for (;;) {
        ssize_t n = read(w->hb_fd, buf, sizeof buf);
        if (n > 0) {
            w->beating = true;
            w->last_beat_s = now;
            if (memchr(buf, 'e', (size_t)n)) {
                /* the rank ended (exit): what started it may live on, holding the pipe, and beat no more */
                close(w->hb_fd);
                w->hb_fd = -1;
                w->beating = false;
                return;
            }
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
            /* its writer is gone: the rank is ending (its exit tells the rest) */
            close(w->hb_fd);
            w->hb_fd = -1;
            w->beating = false;
        }
        return;
    }
}

int workers_silent(const struct worker_group *g, double now, double limit_s)
{
    int best = -1;
    for (int i = 0; i < g->n; i++) {
        const struct worker *w = &g->w[i];
        if (w->running && w->beating && w->hb_fd >= 0 && now - w->last_beat_s > limit_s &&
            (best < 0 || w->last_beat_s < g->w[best].last_beat_s))
            best = i;
    }
    return best;
}

void workers_describe_proc_state(pid_t pid, char *buf, size_t cap)
{
    char path[64], text[512] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, text, sizeof text - 1) : -1;
    if (fd >= 0)
        close(fd);
    /* "pid (comm) S ...": the state follows the last ')' (comm may hold any byte) */
    const char *rp = n > 0 ? strrchr(text, ')') : NULL;
    char st = rp && rp[1] == ' ' ? rp[2] : '?';
    const char *what = st == 'T'   ? "its process is stopped by a signal (SIGSTOP or SIGTSTP)"
                       : st == 't' ? "its process is stopped by a debugger"
                       : st == 'D' ? "its process is in uninterruptible sleep (disk or device I/O)"
                       : st == 'Z' ? "its process is exiting"
                       : st == '?' ? "its process state is unknown"
                                   : "its process runs, but its heartbeat thread is not scheduled (overloaded host?)";
    snprintf(buf, cap, "%s", what);
}

void workers_describe_status(int status, char *buf, size_t cap)
{
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        snprintf(buf, cap, "signal %d (SIG%s)", sig, sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
    } else {
        snprintf(buf, cap, "exit code %d", WEXITSTATUS(status));
    }
}

int workers_exit_code(int status)
{
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}
