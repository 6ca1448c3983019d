/* fsdp-launch's store from the outside: where it listens (--master_addr / --local_addr, never every
 * interface unless asked), the job's secret (environment, user-only file, a loud warning without one on
 * several nodes), what a client without the secret reaches, and the launcher's memory (RSS from /proc)
 * under clients that send huge requests before any handshake or never read their replies. */
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <arpa/inet.h>

#include "common/error.h"
#include "common/rss.h"
#include "rendezvous/store.h"
#include "rendezvous/store_protocol.h"
#include "tests/util/launch_util.h"

struct job {
    char *dir;
    pid_t pid;
    int port;
};

/* Starts fsdp-launch with the given flags (the program: sleep 60) and waits for the port it prints. */
static struct job start(const char *const *flags, const char *const *env)
{
    struct job j = {.dir = lu_tmpdir()};
    const char *argv[32] = {LU_LAUNCH};
    int n = 1;
    for (int i = 0; flags[i]; i++)
        argv[n++] = flags[i];
    argv[n++] = "--";
    argv[n++] = "/bin/sleep";
    argv[n++] = "60";
    argv[n] = NULL;
    j.pid = lu_spawn(argv, j.dir, "launch", env);
    j.port = lu_read_port(j.dir, "launch", 60);
    cr_assert_gt(j.port, 0, "no port printed; stderr:\n%s", lu_slurp_tag(j.dir, "launch", "err"));
    return j;
}

static void stop(struct job *j)
{
    kill(j->pid, SIGTERM);
    lu_wait(j->pid, 30);
    lu_rm_rf(j->dir);
    free(j->dir);
}

/* The local address of the socket listening on port, from /proc/net/tcp (IPv4), as "a.b.c.d". */
static bool listen_addr(int port, char *out, size_t cap)
{
    FILE *f = fopen("/proc/net/tcp", "r");
    cr_assert_not_null(f);
    char line[512];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned addr, p, st;
        if (sscanf(line, " %*d: %8X:%4X %*8X:%*4X %2X", &addr, &p, &st) == 3 && (int)p == port && st == 0x0A) {
            struct in_addr in = {.s_addr = addr}; /* /proc prints the address in host order of its bytes */
            inet_ntop(AF_INET, &in, out, (socklen_t)cap);
            found = true;
        }
    }
    fclose(f);
    return found;
}

/* A port P with P + 1 free too (a worker under torchrun hosts its store at MASTER_PORT + 1). Linux hands out
 * even ports to bind(0) and odd ones to connect(), so P + 1 is often some client's local port on a busy
 * machine; 0 when none is found. */
static int free_port_pair(void)
{
    for (int i = 0; i < 64; i++) {
        int p = tu_free_port();
        if (p <= 0 || p + 1 > 65535)
            continue;
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            return 0;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(p + 1))};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok)
            return p;
    }
    return 0;
}

static const char *const secret_env[] = {"FSDP_RDZV_TOKEN=s3cret", NULL};
/* For the memory tests: a sanitizer build's quarantine of freed blocks (256 MiB by default) would count as
 * the launcher's RSS; without a sanitizer the variable is ignored. */
static const char *const memory_env[] = {"FSDP_RDZV_TOKEN=s3cret",
                                         "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:quarantine_size_mb=8", NULL};

Test(store_launch, listens_on_master_addr_not_every_interface, .timeout = 120)
{
    /* node 0 of a two-node job: the store must listen where the other nodes look for it, and only there */
    const char *flags[] = {"--nnodes", "2", "--node_rank", "0", "--master_addr", "127.0.0.1", "--master_port", "0",
                           "--rdzv_timeout", "60", NULL};
    struct job j = start(flags, secret_env);
    char addr[64];
    cr_assert(listen_addr(j.port, addr, sizeof addr), "no listening socket on port %d", j.port);
    cr_assert_str_eq(addr, "127.0.0.1", "the store listens on %s", addr);
    stop(&j);
    /* --local_addr wins; a client at another local address is refused */
    const char *flags2[] = {"--nnodes", "2", "--node_rank", "0", "--master_addr", "127.0.0.1", "--local_addr",
                            "127.0.0.2", "--master_port", "0", "--rdzv_timeout", "60", NULL};
    j = start(flags2, secret_env);
    cr_assert(listen_addr(j.port, addr, sizeof addr));
    cr_assert_str_eq(addr, "127.0.0.2");
    struct store_client_options o = {.host = "127.0.0.1", .port = j.port, .plain = true, .connect_timeout_s = 0.5};
    struct store_client *c = NULL;
    cr_assert_eq(store_client_connect(&o, &c), FSDP_ETIMEDOUT, "reached a store bound to 127.0.0.2 at 127.0.0.1");
    stop(&j);
    /* every interface only when asked */
    const char *flags3[] = {"--nnodes", "2", "--node_rank", "0", "--local_addr", "0.0.0.0", "--master_port", "0",
                            "--rdzv_timeout", "60", NULL};
    j = start(flags3, secret_env);
    cr_assert(listen_addr(j.port, addr, sizeof addr));
    cr_assert_str_eq(addr, "0.0.0.0");
    stop(&j);
}

Test(store_launch, local_addr_not_of_this_host_is_an_error, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--local_addr", "192.0.2.1", "--master_port", "0", "--", "/bin/true", NULL};
    int code = lu_exit_code(lu_wait(lu_spawn(argv, dir, "launch", NULL), 30));
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_assert_eq(code, 1, "exit %d; stderr:\n%s", code, err);
    cr_assert(strstr(err, "192.0.2.1 is not an address of this host"), "%s", err);
    free(err);
    lu_rm_rf(dir);
}

/* Several nodes and no secret: the store is open to anyone who reaches it, and every launcher says so. */
Test(store_launch, multi_node_store_without_secret_warns, .timeout = 120)
{
    char *home = lu_tmpdir(), henv[FSDP_PATH_MAX + 32]; /* + 32: "KEY=" and a path */
    snprintf(henv, sizeof henv, "HOME=%s", home);
    const char *env[] = {"FSDP_RDZV_TOKEN=", "FSDP_RDZV_TOKEN_FILE=", "XDG_CONFIG_HOME=", henv, NULL};
    const char *flags[] = {"--nnodes", "2", "--node_rank", "0", "--master_port", "0", "--rdzv_timeout", "60", NULL};
    struct job j = start(flags, env);
    char *err = lu_slurp_tag(j.dir, "launch", "err");
    cr_assert(strstr(err, "SECURITY: the store of this 2-node job has no secret"), "%s", err);
    cr_assert(strstr(err, "the run id is 'none'"), "%s", err);
    free(err);
    stop(&j);
    /* with a secret: no warning */
    const char *env2[] = {"FSDP_RDZV_TOKEN=s3cret", henv, NULL};
    j = start(flags, env2);
    err = lu_slurp_tag(j.dir, "launch", "err");
    cr_assert_null(strstr(err, "SECURITY"), "%s", err);
    free(err);
    stop(&j);
    lu_rm_rf(home);
}

static void write_secret(const char *path, const char *text, mode_t mode)
{
    lu_write_text(path, text);
    cr_assert_eq(chmod(path, mode), 0);
}

/* The secret file (~/.config/fsdpc/rdzv_token, or FSDP_RDZV_TOKEN_FILE): two launchers as two nodes on
 * loopback read it and run the job; a client that does not know it is refused; a file others can read is
 * refused before anything starts. */
Test(store_launch, secret_file, .timeout = 180)
{
    char *home = lu_tmpdir(), path[FSDP_PATH_MAX], henv[FSDP_PATH_MAX + 32]; /* + 32: "KEY=" and a path */
    snprintf(henv, sizeof henv, "HOME=%s", home);
    snprintf(path, sizeof path, "%s/.config", home);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/.config/fsdpc", home);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/.config/fsdpc/rdzv_token", home);
    write_secret(path, "file-secret\n", 0600);
    const char *env[] = {"FSDP_RDZV_TOKEN=", "FSDP_RDZV_TOKEN_FILE=", "XDG_CONFIG_HOME=", henv, NULL};
    const char *flags[] = {"--nnodes", "2", "--node_rank", "0", "--master_port", "0", "--rdzv_id", "job7",
                           "--rdzv_timeout", "60", NULL};
    struct job j = start(flags, env);
    char *err = lu_slurp_tag(j.dir, "launch", "err");
    cr_assert_null(strstr(err, "SECURITY"), "the file's secret was not used:\n%s", err);
    free(err);
    struct store_client_options o = {.host = "127.0.0.1", .port = j.port, .run_id = "job7", .secret = "wrong",
                                     .connect_timeout_s = 10};
    struct store_client *c = NULL;
    cr_assert_eq(store_client_connect(&o, &c), FSDP_EREFUSED, "%s", error_message());
    o.secret = NULL;
    cr_assert_eq(store_client_connect(&o, &c), FSDP_EREFUSED, "%s", error_message());
    o.secret = "file-secret";
    cr_assert_eq(store_client_connect(&o, &c), 0, "%s", error_message());
    bool here = false;
    const char *k[] = {"rdzv/nnodes"};
    cr_assert_eq(store_client_check(c, k, 1, &here), 0);
    cr_assert(here);
    store_client_close(c);
    /* a PyTorch client reaches only its own key space: the rendezvous is not there */
    o.plain = true;
    cr_assert_eq(store_client_connect(&o, &c), 0, "%s", error_message());
    cr_assert_eq(store_client_check(c, k, 1, &here), 0);
    cr_assert_not(here, "a client without the secret sees the rendezvous");
    store_client_close(c);
    /* node 1, reading the same file, joins; both run the program and end 0 */
    char port[16];
    snprintf(port, sizeof port, "%d", j.port);
    const char *argv1[] = {LU_LAUNCH, "--nnodes", "2", "--node_rank", "1", "--master_port", port, "--rdzv_id", "job7",
                           "--rdzv_timeout", "60", "--", "/bin/true", NULL};
    int code = lu_exit_code(lu_wait(lu_spawn(argv1, j.dir, "node1", env), 120));
    cr_assert_eq(code, 0, "node 1: exit %d\n%s", code, lu_slurp_tag(j.dir, "node1", "err"));
    stop(&j);
    /* readable by others: refused, naming the file */
    write_secret(path, "file-secret\n", 0644);
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--nnodes", "2", "--node_rank", "0", "--master_port", "0", "--", "/bin/true",
                          NULL};
    code = lu_exit_code(lu_wait(lu_spawn(argv, dir, "launch", env), 30));
    err = lu_slurp_tag(dir, "launch", "err");
    cr_assert_eq(code, 2, "exit %d; stderr:\n%s", code, err);
    cr_assert(strstr(err, path) && strstr(err, "chmod 600"), "%s", err);
    free(err);
    /* FSDP_RDZV_TOKEN_FILE names a file that must exist */
    char fenv[FSDP_PATH_MAX + 32]; /* + 32: "KEY=" and a path */
    snprintf(fenv, sizeof fenv, "FSDP_RDZV_TOKEN_FILE=%s/none", home);
    const char *env3[] = {"FSDP_RDZV_TOKEN=", fenv, henv, NULL};
    code = lu_exit_code(lu_wait(lu_spawn(argv, dir, "launch3", env3), 30));
    err = lu_slurp_tag(dir, "launch3", "err");
    cr_assert_eq(code, 2, "exit %d; stderr:\n%s", code, err);
    cr_assert(strstr(err, "/none"), "%s", err);
    free(err);
    lu_rm_rf(dir);
    lu_rm_rf(home);
}

/* ---- the launcher's memory ---- */

static long rss_kb(pid_t pid)
{
    long kb = rss_status_kib(pid, "VmRSS");
    cr_assert_geq(kb, 0, "no VmRSS in /proc/%d/status", (int)pid);
    return kb;
}

static int nb_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* n connections each send head, then stream filler bytes (up to total per connection) for `seconds`,
 * never reading; returns the launcher's highest RSS (kB) seen meanwhile. The sockets stay open in fds. */
static long flood(pid_t pid, int port, int n, int *fds, const struct store_buf *head, size_t total, double seconds)
{
    static char filler[1 << 16];
    memset(filler, 'x', sizeof filler);
    size_t *sent = calloc((size_t)n, sizeof *sent);
    for (int i = 0; i < n; i++) {
        fds[i] = nb_connect(port);
        cr_assert_eq(send(fds[i], head->data, head->len, MSG_NOSIGNAL), (ssize_t)head->len);
    }
    long peak = rss_kb(pid);
    double t0 = tu_now();
    while (tu_now() - t0 < seconds) {
        for (int i = 0; i < n; i++) {
            if (fds[i] < 0 || sent[i] >= total)
                continue;
            size_t want = total - sent[i] < sizeof filler ? total - sent[i] : sizeof filler;
            ssize_t w = send(fds[i], filler, want, MSG_NOSIGNAL);
            if (w > 0)
                sent[i] += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
                sent[i] = total; /* dropped by the store */
        }
        long r = rss_kb(pid);
        peak = r > peak ? r : peak;
        tu_nap(0.005);
    }
    free(sent);
    return peak;
}

static void close_all(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        close(fds[i]);
}

/* 48 connections that each announce a 32 MiB field before any handshake (HELLO's run id), then send it:
 * every one is closed at the length, nothing is buffered. */
Test(store_launch, memory_before_the_handshake, .timeout = 180)
{
    const char *flags[] = {"--master_port", "0", "--no_torch_store", NULL};
    struct job j = start(flags, memory_env);
    tu_nap(0.3);
    long base = rss_kb(j.pid);
    struct store_buf b;
    store_buf_init(&b);
    store_buf_put_u8(&b, STORE_OP_VALIDATE);
    store_buf_put_u32(&b, STORE_VALIDATE_MAGIC);
    store_buf_put_u8(&b, STORE_OP_HELLO);
    store_buf_put_u32(&b, STORE_HELLO_MAGIC);
    store_buf_put_u16(&b, STORE_PROTOCOL_VERSION);
    store_buf_put_u64(&b, 32u << 20);
    enum { N = 48 };
    int fds[N];
    long peak = flood(j.pid, j.port, N, fds, &b, 32u << 20, 4.0);
    close_all(fds, N);
    tu_nap(0.5);
    long after = rss_kb(j.pid);
    cr_assert_lt(peak - base, 32 * 1024, "RSS went from %ld to %ld kB", base, peak);
    cr_assert_lt(after - base, 16 * 1024, "RSS %ld kB after the connections closed (from %ld)", after, base);
    store_buf_free(&b);
    stop(&j);
}

/* The same with the torch protocol on: 48 PyTorch-protocol connections each SET an 8 MiB value (c10d's
 * largest). Partial requests over 64 KiB share a 64 MiB budget and PyTorch clients' keys hold at most 64
 * MiB, so the launcher stays far below the 400 MB the requests add up to. */
Test(store_launch, memory_of_unauthenticated_pytorch_clients, .timeout = 180)
{
    const char *flags[] = {"--master_port", "0", NULL};
    struct job j = start(flags, memory_env);
    tu_nap(0.3);
    long base = rss_kb(j.pid);
    struct store_buf b;
    store_buf_init(&b);
    store_buf_put_u8(&b, STORE_OP_VALIDATE);
    store_buf_put_u32(&b, STORE_VALIDATE_MAGIC);
    store_buf_put_u8(&b, STORE_OP_SET);
    store_buf_put_str(&b, "/big");
    store_buf_put_u64(&b, STORE_TORCH_MAX_VALUE_BYTES);
    enum { N = 48 };
    int fds[N];
    long peak = flood(j.pid, j.port, N, fds, &b, STORE_TORCH_MAX_VALUE_BYTES, 6.0);
    close_all(fds, N);
    tu_nap(0.5);
    long after = rss_kb(j.pid);
    cr_assert_lt(peak - base, 200 * 1024, "RSS went from %ld to %ld kB", base, peak);
    cr_assert_lt(after - base, 120 * 1024, "RSS %ld kB after the connections closed (from %ld)", after, base);
    store_buf_free(&b);
    stop(&j);
}

/* An authenticated client that pipelines GETs of a 16 MiB value and never reads the replies: the store
 * stops reading it once about 1 MiB of replies wait (so it holds one reply), instead of building one per
 * GET. */
Test(store_launch, memory_of_a_client_that_never_reads, .timeout = 180)
{
    const char *flags[] = {"--master_port", "0", "--rdzv_id", "job8", NULL};
    struct job j = start(flags, memory_env);
    struct store_client_options o = {.host = "127.0.0.1", .port = j.port, .run_id = "job8", .secret = "s3cret",
                                     .connect_timeout_s = 10};
    struct store_client *c = NULL;
    cr_assert_eq(store_client_connect(&o, &c), 0, "%s", error_message());
    char *val = malloc(STORE_MAX_VALUE_BYTES);
    memset(val, 'v', STORE_MAX_VALUE_BYTES);
    cr_assert_eq(store_client_set(c, "big", val, STORE_MAX_VALUE_BYTES), 0, "%s", error_message());
    free(val);
    tu_nap(0.3);
    long base = rss_kb(j.pid);
    int fd = store_client_fd(c);
    int rcv = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    /* 64 GETs (1 GiB of replies) in one write, none read */
    struct store_buf b;
    store_buf_init(&b);
    for (int i = 0; i < 64; i++) {
        store_buf_put_u8(&b, STORE_OP_GET);
        store_buf_put_str(&b, "big");
    }
    cr_assert_eq(send(fd, b.data, b.len, MSG_NOSIGNAL), (ssize_t)b.len);
    long peak = base;
    double t0 = tu_now();
    while (tu_now() - t0 < 3.0) {
        long r = rss_kb(j.pid);
        peak = r > peak ? r : peak;
        tu_nap(0.005);
    }
    cr_assert_lt(peak - base, 100 * 1024, "RSS went from %ld to %ld kB", base, peak);
    store_buf_free(&b);
    store_client_close(c);
    stop(&j);
}

/* As torchrun: PyTorch workers are told the launcher's store is theirs, unless it refuses them. */
Test(store_launch, workers_get_the_agent_store_variables, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--master_port", "0", "--", "/usr/bin/env", NULL};
    const char *env[] = {"TORCH_NCCL_ASYNC_ERROR_HANDLING=", "TORCHELASTIC_USE_AGENT_STORE=False", NULL};
    cr_assert_eq(lu_exit_code(lu_wait(lu_spawn(argv, dir, "on", env), 30)), 0);
    char *out = lu_slurp_tag(dir, "on", "out");
    cr_assert(strstr(out, "\nTORCHELASTIC_USE_AGENT_STORE=True\n"), "%s", out);
    cr_assert_null(strstr(out, "TORCHELASTIC_USE_AGENT_STORE=False"), "%s", out);
    cr_assert(strstr(out, "\nTORCH_NCCL_ASYNC_ERROR_HANDLING=1\n"), "%s", out);
    free(out);
    const char *argv2[] = {LU_LAUNCH, "--master_port", "0", "--no_torch_store", "--", "/usr/bin/env", NULL};
    cr_assert_eq(lu_exit_code(lu_wait(lu_spawn(argv2, dir, "off", env), 30)), 0);
    out = lu_slurp_tag(dir, "off", "out");
    cr_assert_null(strstr(out, "TORCHELASTIC_USE_AGENT_STORE"), "%s", out);
    free(out);
    lu_rm_rf(dir);
}

/* Under another launcher (torchrun), fsdp-worker's rank 0 hosts its store at MASTER_PORT + 1: on
 * MASTER_ADDR, not every interface, and with a loud warning when the job spans nodes without a secret. */
Test(store_launch, worker_store_under_torchrun_listens_on_master_addr, .timeout = 120)
{
    char *dir = lu_tmpdir(), ini[FSDP_PATH_MAX], data[FSDP_PATH_MAX];
    snprintf(data, sizeof data, "%s/train.bin", dir);
    char zeros[4096] = {0};
    FILE *f = fopen(data, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(zeros, 1, sizeof zeros, f), sizeof zeros);
    fclose(f);
    snprintf(ini, sizeof ini, "%s/tiny.ini", dir);
    char text[8192];
    snprintf(text, sizeof text, "[model]\nn_layer = 1\nn_head = 2\nn_embd = 16\nvocab_size = 256\nblock_size = 8\n"
             "[train]\ndevice = cpu\ntrain_batch = 2\nmicro_batch = 1\nmax_steps = 1\n[data]\ntrain_file = %s\n"
             /* the run's files in the test's directory: from a checkpoint of an earlier suite run under the
              * default ./runs the worker would end before its store is looked at */
             "[log]\ndir = %s/logs\n[checkpoint]\ndir = %s/ck\n", data, dir, dir);
    lu_write_text(ini, text);
    for (int with_secret = 0, attempt = 0; with_secret < 2; with_secret++) {
    retry:;
        int port = free_port_pair();
        cr_assert_gt(port, 0);
        char penv[64], home[FSDP_PATH_MAX];
        snprintf(penv, sizeof penv, "MASTER_PORT=%d", port);
        snprintf(home, sizeof home, "HOME=%s", dir); /* no secret file there */
        const char *env[] = {"WORLD_SIZE=2", "LOCAL_WORLD_SIZE=1", "RANK=0", "LOCAL_RANK=0", "MASTER_ADDR=127.0.0.1",
                             penv, "FSDP_STORE_PREFIX=", "FSDP_RDZV_TOKEN_FILE=", "XDG_CONFIG_HOME=", home,
                             with_secret ? "FSDP_RDZV_TOKEN=s3cret" : "FSDP_RDZV_TOKEN=", "FSDP_COMM_TIMEOUT_S=30",
                             NULL};
        const char *argv[] = {lu_build_path("worker/fsdp-worker"), ini, NULL};
        const char *tag = with_secret ? "secret" : "open";
        pid_t pid = lu_spawn(argv, dir, tag, env);
        char addr[64] = "";
        double t0 = tu_now();
        int exited = 0;
        while (!listen_addr(port + 1, addr, sizeof addr) && tu_now() - t0 < 30 && !exited) {
            exited = waitpid(pid, NULL, WNOHANG) == pid;
            tu_nap(0.05);
        }
        if (!exited) {
            kill(pid, SIGKILL);
            lu_wait(pid, 10);
        }
        char *err = lu_slurp_tag(dir, tag, "err");
        /* MASTER_PORT was free but MASTER_PORT + 1 was taken by another test of the suite: another port */
        if (!addr[0] && strstr(err, "is already in use") && ++attempt < 5) {
            free(err);
            goto retry;
        }
        cr_assert_str_eq(addr, "127.0.0.1", "rank 0's store listens on '%s'; stderr:\n%s", addr, err);
        if (with_secret)
            cr_assert_null(strstr(err, "SECURITY"), "%s", err);
        else
            cr_assert(strstr(err, "SECURITY: fsdp's store for this multi-node job"), "%s", err);
        free(err);
    }
    lu_rm_rf(dir);
}
