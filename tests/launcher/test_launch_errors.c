/* The errors a user meets first: each must come before any work, say what is wrong, and exit non-zero. */
#include "tests/util/launch_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

/* Runs the launcher to completion; returns its exit code and its stderr in *err. */
static int run_launch(const char *const *argv, const char *const *env, double timeout_s, char **err)
{
    char *dir = lu_tmpdir();
    pid_t p = lu_spawn(argv, dir, "launch", env);
    int st = lu_wait(p, timeout_s);
    *err = lu_slurp_tag(dir, "launch", "err");
    lu_rm_rf(dir);
    free(dir);
    return lu_exit_code(st);
}

static void expect_error(const char *const *argv, int code, const char *needle)
{
    char *err;
    int rc = run_launch(argv, NULL, 30, &err);
    cr_expect_eq(rc, code, "exit %d (want %d), stderr:\n%s", rc, code, err);
    cr_expect(strstr(err, needle), "stderr lacks '%s':\n%s", needle, err);
    free(err);
}

Test(launch_errors, nproc_not_positive)
{
    const char *a[] = {LU_LAUNCH, "--nproc_per_node", "0", "/bin/true", NULL};
    expect_error(a, 2, "'0' is not a positive number of workers");
    const char *b[] = {LU_LAUNCH, "--nproc-per-node=-3", "/bin/true", NULL};
    expect_error(b, 2, "'-3' is not a positive number of workers");
    const char *c[] = {LU_LAUNCH, "--nproc_per_node", "many", "/bin/true", NULL};
    expect_error(c, 2, "'many' is not a positive number");
}

Test(launch_errors, missing_program)
{
    const char *a[] = {LU_LAUNCH, "--standalone", "no-such-program-xyz", NULL};
    expect_error(a, 2, "program 'no-such-program-xyz' not found in PATH nor next to fsdp-launch");
    const char *b[] = {LU_LAUNCH, "--standalone", "/nonexistent/prog", NULL};
    expect_error(b, 2, "program '/nonexistent/prog' does not exist");
    const char *c[] = {LU_LAUNCH, "--standalone", NULL};
    expect_error(c, 2, "no program to run");
}

Test(launch_errors, bad_flags)
{
    const char *a[] = {LU_LAUNCH, "--nproc_per_nod", "2", "/bin/true", NULL};
    expect_error(a, 2, "unknown flag '--nproc_per_nod'");
    const char *b[] = {LU_LAUNCH, "--nnodes", "2", "--node_rank", "2", "/bin/true", NULL};
    expect_error(b, 2, "--node_rank 2 is out of range: --nnodes is 2");
    const char *c[] = {LU_LAUNCH, "--master_port", "70000", "/bin/true", NULL};
    expect_error(c, 2, "--master_port: '70000' is not an integer in [0, 65535]");
    const char *d[] = {LU_LAUNCH, "--max_restarts", NULL};
    expect_error(d, 2, "--max_restarts needs a value");
    const char *e[] = {LU_LAUNCH, "--nnodes", "1:4", "/bin/true", NULL};
    expect_error(e, 2, "'1:4' asks for elastic membership (between 1 and 4 nodes), which fsdp-launch does not do");
    const char *f[] = {LU_LAUNCH, "--tee", "5", "/bin/true", NULL};
    expect_error(f, 2, "--tee: '5' is not 0, 1, 2, 3");
    const char *g[] = {LU_LAUNCH, "--nnodes", "2", "--node_rank", "1", "--master_port", "0", "/bin/true", NULL};
    expect_error(g, 2, "only works on node 0");
}

Test(launch_errors, pet_environment_is_read_and_checked)
{
    char *err;
    const char *a[] = {LU_LAUNCH, "/bin/true", NULL};
    const char *env[] = {"PET_NPROC_PER_NODE=zero", NULL};
    int rc = run_launch(a, env, 30, &err);
    cr_expect_eq(rc, 2);
    cr_expect(strstr(err, "PET_NPROC_PER_NODE: 'zero'"), "stderr:\n%s", err);
    free(err);
}

static int listening_socket(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    cr_assert(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(fd, 4) == 0);
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    *port = ntohs(sa.sin_port);
    return fd;
}

Test(launch_errors, port_already_in_use)
{
    int port;
    int fd = listening_socket(&port);
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    const char *a[] = {LU_LAUNCH, "--master_port", ports, "--nnodes", "2", "/bin/true", NULL};
    char *err;
    int rc = run_launch(a, NULL, 30, &err);
    cr_expect_eq(rc, 1, "stderr:\n%s", err);
    cr_expect(strstr(err, "already in use"), "stderr:\n%s", err);
    cr_expect(strstr(err, ports), "port not named:\n%s", err);
    const char *first = strstr(err, "already in use");
    cr_expect(first && !strstr(first + 1, "already in use"), "message repeated or garbled:\n%s", err);
    free(err);
    close(fd);
}

Test(launch_errors, master_unreachable_names_address_and_time)
{
    int port;
    int fd = listening_socket(&port);
    close(fd); /* nothing listens there now */
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    const char *a[] = {LU_LAUNCH, "--nnodes", "2", "--node_rank", "1", "--master_addr", "127.0.0.1", "--master_port",
                       ports, "--rdzv_timeout", "1", "/bin/true", NULL};
    char *err;
    double t0 = tu_now();
    int rc = run_launch(a, NULL, 30, &err);
    double took = tu_now() - t0;
    char want[128];
    snprintf(want, sizeof want, "cannot reach the rendezvous store at 127.0.0.1:%d (tried for 1 s)", port);
    cr_expect_eq(rc, 1, "stderr:\n%s", err);
    cr_expect(strstr(err, want), "stderr:\n%s", err);
    cr_expect_geq(took, 0.95, "gave up after %.2f s but said it tried for 1 s", took);
    cr_expect(strstr(err, "Connection refused"), "the last connect error is not named:\n%s", err);
    free(err);
}

Test(launch_errors, wrong_token_refused, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *n0[] = {LU_LAUNCH, "--nnodes", "2", "--node_rank", "0", "--master_port", "0", "--rdzv_timeout", "20",
                        "--rdzv_id", "tok", LU_PROBE, "barrier", NULL};
    const char *env0[] = {"FSDP_RDZV_TOKEN=right", NULL};
    pid_t p0 = lu_spawn(n0, dir, "n0", env0);
    int port = lu_read_port(dir, "n0", 30);
    cr_assert_gt(port, 0);
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    const char *n1[] = {LU_LAUNCH, "--nnodes", "2", "--node_rank", "1", "--master_port", ports, "--rdzv_timeout", "5",
                        "--rdzv_id", "tok", LU_PROBE, "barrier", NULL};
    const char *env1[] = {"FSDP_RDZV_TOKEN=wrong", NULL};
    char *err;
    int rc = run_launch(n1, env1, 30, &err);
    cr_expect_eq(rc, 1, "stderr:\n%s", err);
    cr_expect(strstr(err, "refused node 1") && strstr(err, "FSDP_RDZV_TOKEN"), "stderr:\n%s", err);
    free(err);
    kill(p0, SIGTERM);
    lu_wait(p0, 20);
    lu_rm_rf(dir);
    free(dir);
}

Test(launch_errors, join_timeout_names_missing_nodes, .timeout = 60)
{
    const char *a[] = {LU_LAUNCH, "--nnodes", "3", "--node_rank", "0", "--master_port", "0", "--rdzv_timeout", "1",
                       "/bin/true", NULL};
    char *err;
    int rc = run_launch(a, NULL, 30, &err);
    cr_expect_eq(rc, 1, "stderr:\n%s", err);
    cr_expect(strstr(err, "1 of 3 nodes joined generation 0; missing node ranks: 1, 2"), "stderr:\n%s", err);
    free(err);
}

Test(launch_errors, join_timeout_names_missing_slurm_hosts, .timeout = 60)
{
    const char *a[] = {LU_LAUNCH, "--master_port", "0", "--rdzv_timeout", "1", "/bin/true", NULL};
    const char *env[] = {"SLURM_JOB_ID=4242", "SLURM_JOB_NODELIST=localhost,gpu[07-08]", "SLURM_JOB_NUM_NODES=3",
                         "SLURM_NODEID=0", "PET_MASTER_ADDR=127.0.0.1", NULL};
    char *err;
    int rc = run_launch(a, env, 30, &err);
    cr_expect_eq(rc, 1, "stderr:\n%s", err);
    cr_expect(strstr(err, "missing node ranks: 1 (host gpu07), 2 (host gpu08)"), "stderr:\n%s", err);
    free(err);
}

/* A closed loopback port: nothing answers there, and connecting is refused at once. */
static int closed_port(void)
{
    int port;
    int fd = listening_socket(&port);
    close(fd);
    return port;
}

/* Node 1 while node 0 is not up: SIGINT/SIGTERM end the launcher at once with 128 + signal, not after
 * --rdzv_timeout (900 s by default). */
static void signal_while_connecting(int sig)
{
    char ports[16];
    snprintf(ports, sizeof ports, "%d", closed_port());
    const char *a[] = {LU_LAUNCH, "--nnodes", "2", "--node_rank", "1", "--master_addr", "127.0.0.1", "--master_port",
                       ports, "/bin/true", NULL};
    char *dir = lu_tmpdir();
    pid_t p = lu_spawn(a, dir, "launch", NULL);
    tu_nap(0.5);
    double t0 = tu_now();
    kill(p, sig);
    int st = lu_wait(p, 10);
    double took = tu_now() - t0;
    char *err = lu_slurp_tag(dir, "launch", "err");
    char want[128];
    snprintf(want, sizeof want, "received SIG%s while connecting to the rendezvous store at 127.0.0.1:%s",
             sigabbrev_np(sig), ports);
    cr_expect_eq(lu_exit_code(st), 128 + sig, "exit %d after %.1f s, stderr:\n%s", lu_exit_code(st), took, err);
    cr_expect_lt(took, 2.0, "answered the signal after %.1f s", took);
    cr_expect(strstr(err, want), "stderr lacks '%s':\n%s", want, err);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

Test(launch_errors, sigterm_while_connecting_to_the_store, .timeout = 30) { signal_while_connecting(SIGTERM); }
Test(launch_errors, sigint_while_connecting_to_the_store, .timeout = 30) { signal_while_connecting(SIGINT); }

/* Node 0 waiting for node 1 to join: SIGTERM ends it at once as well. */
Test(launch_errors, sigterm_while_waiting_for_the_other_nodes, .timeout = 30)
{
    const char *a[] = {LU_LAUNCH, "--nnodes", "2", "--node_rank", "0", "--master_addr", "127.0.0.1", "--master_port",
                       "0", "/bin/true", NULL};
    char *dir = lu_tmpdir();
    pid_t p = lu_spawn(a, dir, "launch", NULL);
    cr_assert_gt(lu_read_port(dir, "launch", 20), 0, "node 0 did not start its store");
    tu_nap(0.3);
    double t0 = tu_now();
    kill(p, SIGTERM);
    int st = lu_wait(p, 10);
    double took = tu_now() - t0;
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_expect_eq(lu_exit_code(st), 128 + SIGTERM, "exit %d after %.1f s, stderr:\n%s", lu_exit_code(st), took, err);
    cr_expect_lt(took, 2.0, "answered the signal after %.1f s", took);
    cr_expect(strstr(err, "received SIGTERM while waiting for the other nodes"), "stderr:\n%s", err);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

static int count(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* A worker whose store is unreachable says what it waits for: once at info level, then every few seconds
 * at debug level. */
Test(launch_errors, worker_waiting_for_the_store_says_so, .timeout = 40)
{
    int port = closed_port();
    char mport[32], want[128];
    snprintf(mport, sizeof mport, "MASTER_PORT=%d", port);
    const char *env[] = {"MASTER_ADDR=127.0.0.1", mport, "RANK=1", "LOCAL_RANK=1", "WORLD_SIZE=2",
                         "TORCHELASTIC_RUN_ID=w", "FSDP_STORE_PREFIX=worker/g0/", "FSDP_LOG_LEVEL=debug", NULL};
    const char *a[] = {LU_PROBE, "barrier", NULL};
    char *dir = lu_tmpdir();
    pid_t p = lu_spawn(a, dir, "probe", env);
    char *err = NULL;
    snprintf(want, sizeof want, "D: rank 1: still waiting for the rendezvous store at 127.0.0.1:%d", port);
    for (double end = tu_now() + 20; tu_now() < end; tu_nap(0.1)) { /* the first debug line comes after 3 s */
        free(err);
        err = lu_slurp_tag(dir, "probe", "err");
        if (strstr(err, want))
            break;
    }
    kill(p, SIGKILL);
    lu_wait(p, 5);
    free(err);
    err = lu_slurp_tag(dir, "probe", "err");
    snprintf(want, sizeof want, "I: rank 1: waiting for the rendezvous store at 127.0.0.1:%d", port);
    cr_expect_eq(count(err, want), 1, "want one '%s':\n%s", want, err);
    snprintf(want, sizeof want, "D: rank 1: still waiting for the rendezvous store at 127.0.0.1:%d", port);
    cr_expect_geq(count(err, want), 1, "want '%s' lines:\n%s", want, err);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

/* A program that is found but cannot be executed: the worker's exit code 127 and a line naming the path
 * and errno (a file without #! that is no binary; a script whose interpreter is missing). */
Test(launch_errors, execve_failure_names_path_and_errno, .timeout = 30)
{
    char *dir = lu_tmpdir();
    static const struct {
        const char *name, *text, *why;
    } cases[] = {
        {"garbage", "this is not a program\n", "Exec format error (ENOEXEC)"},
        {"script", "#!/nonexistent/fsdpc-interpreter\necho hi\n", "No such file or directory (ENOENT)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char prog[FSDP_PATH_MAX];
        snprintf(prog, sizeof prog, "%s/%s", dir, cases[i].name);
        lu_write_text(prog, cases[i].text);
        cr_assert_eq(chmod(prog, 0755), 0);
        const char *a[] = {LU_LAUNCH, "--standalone", prog, NULL};
        char *err;
        int rc = run_launch(a, NULL, 30, &err);
        char want[4400];
        snprintf(want, sizeof want, "fsdp-launch: cannot execute %s: %s", prog, cases[i].why);
        cr_expect_eq(rc, 127, "%s: exit %d, stderr:\n%s", cases[i].name, rc, err);
        cr_expect(strstr(err, want), "stderr lacks '%s':\n%s", want, err);
        free(err);
    }
    lu_rm_rf(dir);
    free(dir);
}
