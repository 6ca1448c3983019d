/* fsdp-launch: a torchrun-compatible launcher (see docs/launcher.md). */
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/settings.h"
#include "launcher/agent.h"
#include "launcher/args.h"
#include "launcher/command.h"
#include "launcher/console.h"
#include "launcher/guard.h"
#include "launcher/status_files.h"
#include "launcher/wizard.h"
#include "launcher/workers.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/store_auth.h"

static void random_token(char *out, size_t nbytes)
{
    unsigned char buf[32];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, buf, nbytes) : -1;
    if (fd >= 0)
        close(fd);
    for (size_t i = 0; i < nbytes; i++)
        sprintf(out + 2 * i, "%02x", got == (ssize_t)nbytes ? buf[i] : (unsigned)(rand() & 0xff));
}

/* Several nodes and no secret: anyone who reaches the port can read the rendezvous and end the job. */
static void warn_open_store(const struct launch_args *a)
{
    if (a->nnodes == 1)
        return;
    log_warn("************************************************************************************");
    log_warn("SECURITY: the store of this %d-node job has no secret: any host that can reach %s:%d can",
             a->nnodes, a->master_addr, a->master_port);
    log_warn("read the rendezvous (NCCL unique ids), inject a failure record that ends the job, or join it.");
    log_warn("Set the same FSDP_RDZV_TOKEN on every node, or create ~/.config/fsdpc/rdzv_token (mode 600)%s",
             strcmp(a->run_id, "none") == 0 ? "," : "");
    if (strcmp(a->run_id, "none") == 0)
        log_warn("and give every node the same --rdzv_id (the run id is 'none').");
    log_warn("See docs/launcher.md, \"Security\".");
    log_warn("************************************************************************************");
}

/* A store on a name that is loopback here is out of the other nodes' reach. */
static void warn_loopback_bind(const char *addr)
{
    char shown[64];
    if (rdzv_loopback_name(addr, shown, sizeof shown))
        log_warn("the store listens on %s, which is %s (loopback) on this host: the other nodes cannot reach it; "
                 "pass --local_addr with this node's address (or 0.0.0.0)", addr, shown);
}

/* A slow --monitor_interval must not make a live node look lost: allow at least three missed beats. */
static double heartbeat_timeout(double wanted, double monitor_interval)
{
    return wanted > 3 * monitor_interval ? wanted : 3 * monitor_interval;
}

/* Before any worker exists, a stopping signal ends the launcher at once (the rendezvous waits poll this). */
struct early_stop {
    int sigfd;
    int signo;
};

static bool stop_requested(void *arg)
{
    struct early_stop *es = arg;
    struct signalfd_siginfo si;
    while (read(es->sigfd, &si, sizeof si) == (ssize_t)sizeof si)
        if ((int)si.ssi_signo != SIGCHLD && !es->signo)
            es->signo = (int)si.ssi_signo;
    return es->signo != 0;
}

/* SIGCHLD (reap) and the signals the launcher answers (--signals_to_handle). */
static void handled_signals(const struct launch_args *a, sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGCHLD);
    for (int i = 0; i < a->n_signals; i++)
        sigaddset(set, a->signals[i]);
}

static int run(struct launch_args *a, struct launch_command *cmd);

int main(int argc, char **argv)
{
    log_init("fsdp-launch");
    if (argc > 1 && strcmp(argv[1], "config") == 0)
        return wizard_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "status") == 0)
        return status_files_main(argc - 1, argv + 1);
    struct launch_args a;
    int rc = launch_args_parse(argc, argv, &a);
    if (rc == 1)
        return 0;
    if (rc) {
        log_error("%s", error_message());
        launch_args_free(&a);
        return 2;
    }
    log_set_level(a.log_level);
    if (a.print_config) {
        rc = launch_args_print(&a, stdout, a.print_config_json);
        if (rc)
            log_error("%s", error_message());
        launch_args_free(&a);
        return rc ? 1 : 0;
    }
    if (a.n_ignored) {
        /* Once, by this launcher (not by every worker). */
        char list[4096];
        size_t n = 0;
        list[0] = 0;
        for (int i = 0; i < a.n_ignored && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? "; " : "", a.ignored[i]);
        log_info("%s: ignored (no meaning for fsdpc): %s", a.config_file, list);
    }
    struct launch_command cmd;
    if (command_build(&a, &cmd)) {
        log_error("%s", error_message());
        launch_args_free(&a);
        return 2;
    }
    /* Blocked before any thread exists (the console's, the store server's), so every signal lands in the
     * signalfd that run() reads. */
    sigset_t set;
    handled_signals(&a, &set);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* A SIGCHLD ignored by whoever started the launcher (the disposition survives exec) makes the kernel
     * reap the workers itself: waitpid would never report them, and the job would wait for them forever. */
    signal(SIGCHLD, SIG_DFL);
    /* Before any thread exists: the guard is a plain fork. */
    if (guard_start())
        log_warn("%s: grandchildren of a worker may outlive a SIGKILLed launcher", error_message());
    if (console_start())
        log_warn("%s: console output is written directly", error_message());
    int code = run(&a, &cmd);
    console_stop(2.0);
    return code;
}

/* One exit path: whatever run() got as far as opening is closed there, in the reverse order. */
static int run(struct launch_args *pa, struct launch_command *pcmd)
{
    struct launch_args a = *pa;
    struct launch_command cmd = *pcmd;
    int code = 1;
    char *loaded = NULL;
    struct rdzv *r = NULL;
    struct status_server *status = NULL;
    if (a.redirects[0] && !a.log_dir[0])
        log_warn("--redirects has no effect without --log_dir (output would be lost): ignoring it");
    if (a.log_max_bytes && !a.log_dir[0])
        log_warn("--log_max_bytes has no effect without --log_dir: ignoring it");
    char *launch_config = launch_args_settings_json(&a);
    sigset_t set;
    handled_signals(&a, &set);
    int sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sigfd < 0) {
        log_error("signalfd failed");
        goto out;
    }

    char host[256] = "?";
    if (a.local_addr[0])
        snprintf(host, sizeof host, "%s", a.local_addr);
    else
        gethostname(host, sizeof host - 1);
    /* The job's secret (docs/launcher.md, "Security"): FSDP_RDZV_TOKEN, else the user's secret file. One
     * node needs nobody else to know it, so a random one keeps strangers off the port; several nodes must
     * share it, so without one the store is open, which is said loudly. */
    char token[65], secret_file[FSDP_PATH_MAX];
    enum store_secret_source secret_source;
    if (store_secret_load(&loaded, &secret_source, secret_file, sizeof secret_file)) {
        log_error("%s", error_message());
        code = 2;
        goto out;
    }
    const char *secret = loaded;
    if (!secret && a.nnodes == 1) {
        random_token(token, 16);
        secret = token;
    }
    if (secret_source == STORE_SECRET_FILE)
        log_debug("store secret read from %s", secret_file);
    const char *bind_addr = a.local_addr[0] ? a.local_addr : a.master_addr;
    if (!secret)
        warn_open_store(&a);
    if (a.nnodes > 1 && a.node_rank == 0)
        warn_loopback_bind(bind_addr);
    char omp[24];
    const char *omp_threads = NULL;
    if (a.omp_threads > 0) {
        snprintf(omp, sizeof omp, "%d", a.omp_threads);
        omp_threads = omp;
    } else if (!getenv("OMP_NUM_THREADS")) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        long t = cores / a.nproc_per_node;
        snprintf(omp, sizeof omp, "%ld", t < 1 ? 1 : t);
        omp_threads = omp;
        log_info("OMP_NUM_THREADS not set: using %s per worker (%ld cores / %d workers); set it to override", omp,
                 cores, a.nproc_per_node);
    }

    /* The store listens on --local_addr, else on --master_addr (the address the other nodes use), never on
     * every interface unless asked to (0.0.0.0). */
    double hb_timeout = heartbeat_timeout(a.heartbeat_timeout_s > 0 ? a.heartbeat_timeout_s
                                                                    : settings_double(SETTING_HEARTBEAT_TIMEOUT),
                                          a.monitor_interval_s);
    struct rdzv_options ro = {.master_addr = a.master_addr, .master_port = a.master_port,
                              .bind_addr = bind_addr, .torch_off = a.no_torch_store, .run_id = a.run_id,
                              .secret = secret,
                              .nnodes = a.nnodes, .node_rank = a.node_rank, .nproc_per_node = a.nproc_per_node,
                              .host = host, .timeout_s = a.rdzv_timeout_s,
                              .heartbeat_timeout_s = hb_timeout,
                              .node_hosts = a.slurm_nhosts >= a.nnodes ? (const char *const *)a.slurm_hosts : NULL};
    struct early_stop es = {.sigfd = sigfd};
    ro.should_stop = stop_requested;
    ro.stop_arg = &es;
    int rc = rdzv_open(&ro, &r);
    if (rc == FSDP_EABORTED && es.signo) {
        log_warn("received SIG%s while connecting to the rendezvous store at %s:%d; exiting",
                 sigabbrev_np(es.signo), a.master_addr, a.master_port);
        code = 128 + es.signo;
        goto out;
    }
    if (rc) {
        log_error("%s", error_message());
        goto out;
    }
    if (a.node_rank == 0 && (a.master_port == 0 || a.standalone)) {
        /* Printed whatever the log level: other nodes and scripts need this port. */
        char line[400];
        int n = snprintf(line, sizeof line, "fsdp-launch: store listening on %s:%d\n", a.master_addr, rdzv_port(r));
        console_write(2, line, (size_t)n);
    }
    log_debug("node %d of %d (%s), run id %s, store %s:%d, program %s", a.node_rank, a.nnodes, host, a.run_id,
              a.master_addr, rdzv_port(r), cmd.program);

    if (a.node_rank == 0 && a.status_port >= 0) {
        struct status_server_options so = {.bind_addr = a.status_addr, .port = a.status_port, .store_host = "127.0.0.1",
                                           .store_port = rdzv_port(r), .run_id = a.run_id, .secret = secret,
                                           .nnodes = a.nnodes, .world_size = a.nnodes * a.nproc_per_node,
                                           .stale_s = a.status_stale_s};
        if (status_server_start(&so, &status)) {
            log_error("%s", error_message());
            goto out;
        }
        /* Printed whatever the log level, like the store's port: scripts and users need it. */
        if (status_server_public(status) && status_server_token(status)[0])
            /* the page's read-only token, never the store secret: this line lands in job logs */
            dprintf(2, "fsdp-launch: status page on http://%s:%d/?token=%s (a read-only token for other hosts)\n",
                    a.status_addr, status_server_port(status), status_server_token(status));
        else
            dprintf(2, "fsdp-launch: status page on http://%s:%d/\n", a.status_addr, status_server_port(status));
    }
    struct agent ag = {.a = &a, .r = r, .sigfd = sigfd, .host = host, .program = cmd.program, .argv = cmd.argv,
                       .launch_config = launch_config, .secret = secret, .omp_threads = omp_threads,
                       .pending_signal = es.signo, .status = status, .heartbeat_timeout_s = hb_timeout};
    code = agent_run(&ag);
out:
    /* The status server and the store use the secret (loaded): they stop first. */
    status_server_stop(status);
    rdzv_close(r);
    free(loaded);
    if (sigfd >= 0)
        close(sigfd);
    command_free(&cmd);
    free(launch_config);
    launch_args_free(&a);
    return code;
}
