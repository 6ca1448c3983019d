/* Two launchers as two nodes over loopback (and over a veth pair between network namespaces): joining,
 * global ranks, failure propagation, restarts, lost nodes, a lost store host, duplicate node ranks. */
#include "tests/util/launch_util.h"
#include "tests/util/tu_netns.h"

#include <sched.h>

#define MAXARGS 40

/* Builds "fsdp-launch --nnodes 2 --node_rank R --nproc_per_node N --master_port P EXTRA... PROBE MODE DIR". */
static void node_argv(const char **argv, char *bufs, int rank, int nproc, int port, const char *const *extra,
                      const char *mode, const char *dir)
{
    int k = 0;
    argv[k++] = LU_LAUNCH;
    argv[k++] = "--nnodes";
    argv[k++] = "2";
    argv[k++] = "--node_rank";
    argv[k++] = rank ? "1" : "0";
    argv[k++] = "--nproc_per_node";
    snprintf(bufs, 16, "%d", nproc);
    argv[k++] = bufs;
    argv[k++] = "--master_port";
    snprintf(bufs + 16, 16, "%d", port);
    argv[k++] = bufs + 16;
    for (int i = 0; extra && extra[i]; i++)
        argv[k++] = extra[i];
    argv[k++] = LU_PROBE;
    argv[k++] = mode;
    argv[k++] = dir;
    argv[k] = NULL;
}

struct pair {
    pid_t p0, p1;
    int port;
};

static struct pair start_pair(const char *dir, int nproc, const char *const *extra, const char *mode,
                              const char *const *env)
{
    struct pair pr;
    const char *a0[MAXARGS], *a1[MAXARGS];
    char b0[32], b1[32];
    node_argv(a0, b0, 0, nproc, 0, extra, mode, dir);
    pr.p0 = lu_spawn(a0, dir, "n0", env);
    pr.port = lu_read_port(dir, "n0", 30);
    cr_assert_gt(pr.port, 0, "node 0 printed no port");
    node_argv(a1, b1, 1, nproc, pr.port, extra, mode, dir);
    pr.p1 = lu_spawn(a1, dir, "n1", env);
    return pr;
}

static void finish(char *dir)
{
    lu_rm_rf(dir);
    free(dir);
}

Test(launch_multinode, two_nodes_join_and_get_global_ranks, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *extra[] = {"--rdzv_id", "pair", NULL};
    struct pair pr = start_pair(dir, 2, extra, "env", NULL);
    int s0 = lu_wait(pr.p0, 40), s1 = lu_wait(pr.p1, 40);
    char *e0 = lu_slurp_tag(dir, "n0", "err"), *e1 = lu_slurp_tag(dir, "n1", "err");
    cr_assert_eq(lu_exit_code(s0), 0, "node 0:\n%s", e0);
    cr_assert_eq(lu_exit_code(s1), 0, "node 1:\n%s", e1);
    for (int r = 0; r < 4; r++) {
        char path[FSDP_PATH_MAX], want[64];
        snprintf(path, sizeof path, "%s/env.%d", dir, r);
        char *t = tu_slurp(path);
        snprintf(want, sizeof want, "\nLOCAL_RANK=%d\n", r % 2);
        cr_expect(strstr(t, want), "rank %d: %s", r, t);
        snprintf(want, sizeof want, "\nGROUP_RANK=%d\n", r / 2);
        cr_expect(strstr(t, want), "rank %d: %s", r, t);
        cr_expect(strstr(t, "\nWORLD_SIZE=4\n") && strstr(t, "\nGROUP_WORLD_SIZE=2\n"), "rank %d: %s", r, t);
        cr_expect(strstr(t, "\nFSDP_RDZV_TOKEN=<unset>\n"), "multi-node token must come from the user: %s", t);
        free(t);
    }
    free(e0);
    free(e1);
    finish(dir);
}

static void append_args(const char **argv, const char *const *more)
{
    int k = 0;
    while (argv[k])
        k++;
    for (int i = 0; more[i]; i++)
        argv[k++] = more[i];
    argv[k] = NULL;
}

Test(launch_multinode, failing_rank_stops_both_nodes, .timeout = 60)
{
    char *dir = lu_tmpdir();
    /* rank 3 lives on node 1; node 0's ranks must learn of it through the store. */
    const char *a0[MAXARGS], *a1[MAXARGS];
    char b0[32], b1[32];
    const char *extra[] = {"--rdzv_id", "fail", NULL};
    const char *more[] = {"3", "3", NULL};
    node_argv(a0, b0, 0, 2, 0, extra, "fail", dir);
    append_args(a0, more);
    pid_t p0 = lu_spawn(a0, dir, "n0", NULL);
    int port = lu_read_port(dir, "n0", 30);
    cr_assert_gt(port, 0);
    node_argv(a1, b1, 1, 2, port, extra, "fail", dir);
    append_args(a1, more);
    pid_t p1 = lu_spawn(a1, dir, "n1", NULL);
    int pids[4];
    cr_assert_eq(lu_read_pids(dir, 4, pids, 30), 4, "ranks did not start");
    double t0 = tu_now();
    int s1 = lu_wait(p1, 30), s0 = lu_wait(p0, 30);
    double all_dead = lu_wait_pids_dead(pids, 4, 10);
    char *e0 = lu_slurp_tag(dir, "n0", "err"), *e1 = lu_slurp_tag(dir, "n1", "err");
    cr_expect_eq(lu_exit_code(s0), 3, "node 0:\n%s", e0);
    cr_expect_eq(lu_exit_code(s1), 3, "node 1:\n%s", e1);
    cr_expect(all_dead >= 0 && tu_now() - t0 < 5 + 1, "ranks still alive %.1f s after the failure", tu_now() - t0);
    cr_expect(strstr(e0, "Root cause (first failure): rank 3 (local rank 1) on node 1"), "node 0:\n%s", e0);
    cr_expect(strstr(e0, "rank 3 giving up with exit code 3"), "node 0 lacks the remote stderr tail:\n%s", e0);
    free(e0);
    free(e1);
    finish(dir);
}

/* One rank per node: rank 0 (node 0) exits 3, fsdp-worker's "another rank failed", as soon as both ranks
 * run; rank 1 (node 1) exits 9 `delay` seconds later, the real failure. Node 0's launcher reaps its
 * consequence first; both nodes must still name the real failure unless it came after node 0 stopped
 * waiting for it (2 s). */
static void peerfirst_nodes(const char *delay, int want_code, int want_rank)
{
    char *dir = lu_tmpdir();
    const char *a0[MAXARGS], *a1[MAXARGS];
    char b0[32], b1[32];
    const char *extra[] = {"--rdzv_id", "peerfirst", NULL};
    const char *more[] = {"1", "9", delay, NULL};
    node_argv(a0, b0, 0, 1, 0, extra, "peerfirst", dir);
    append_args(a0, more);
    pid_t p0 = lu_spawn(a0, dir, "n0", NULL);
    int port = lu_read_port(dir, "n0", 30);
    cr_assert_gt(port, 0, "node 0 printed no port");
    node_argv(a1, b1, 1, 1, port, extra, "peerfirst", dir);
    append_args(a1, more);
    pid_t p1 = lu_spawn(a1, dir, "n1", NULL);
    int s0 = lu_wait(p0, 40), s1 = lu_wait(p1, 40);
    char *e0 = lu_slurp_tag(dir, "n0", "err"), *e1 = lu_slurp_tag(dir, "n1", "err");
    char want[128];
    snprintf(want, sizeof want, "Root cause (first failure): rank %d (local rank 0) on node %d", want_rank, want_rank);
    cr_expect_eq(lu_exit_code(s0), want_code, "node 0:\n%s", e0);
    cr_expect_eq(lu_exit_code(s1), want_code, "node 1:\n%s", e1);
    cr_expect(strstr(e0, want), "node 0 (want rank %d):\n%s", want_rank, e0);
    cr_expect(strstr(e1, want), "node 1 (want rank %d):\n%s", want_rank, e1);
    free(e0);
    free(e1);
    finish(dir);
}

Test(launch_multinode, root_cause_is_the_other_nodes_failure_not_the_local_consequence, .timeout = 60)
{
    peerfirst_nodes("0.3", 9, 1);
}

Test(launch_multinode, root_cause_wait_for_other_nodes_is_bounded, .timeout = 60)
{
    peerfirst_nodes("20", 3, 0);
}

Test(launch_multinode, restart_on_both_nodes, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *extra[] = {"--max_restarts", "2", "--rdzv_id", "restart", NULL};
    struct pair pr = start_pair(dir, 2, extra, "failfirst", NULL);
    int s0 = lu_wait(pr.p0, 40), s1 = lu_wait(pr.p1, 40);
    char *e0 = lu_slurp_tag(dir, "n0", "err"), *e1 = lu_slurp_tag(dir, "n1", "err");
    cr_assert_eq(lu_exit_code(s0), 0, "node 0:\n%s", e0);
    cr_assert_eq(lu_exit_code(s1), 0, "node 1:\n%s", e1);
    for (int r = 0; r < 4; r++) {
        char path[FSDP_PATH_MAX];
        snprintf(path, sizeof path, "%s/ok.%d", dir, r);
        char *t = tu_slurp(path);
        cr_expect_str_eq(t, "1\n", "rank %d", r);
        free(t);
    }
    free(e0);
    free(e1);
    finish(dir);
}

Test(launch_multinode, duplicate_node_rank_refused, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *extra[] = {"--rdzv_timeout", "30", NULL};
    const char *env[] = {"FSDP_HEARTBEAT_TIMEOUT=1", NULL};
    struct pair pr = start_pair(dir, 1, extra, "sleep", env);
    int pids[2];
    cr_assert_eq(lu_read_pids(dir, 2, pids, 30), 2);
    const char *a[MAXARGS];
    char b[32];
    node_argv(a, b, 1, 1, pr.port, extra, "sleep", dir);
    pid_t dup = lu_spawn(a, dir, "dup", env);
    int sd = lu_wait(dup, 30);
    char *ed = lu_slurp_tag(dir, "dup", "err");
    cr_expect_eq(lu_exit_code(sd), 1, "duplicate:\n%s", ed);
    cr_expect(strstr(ed, "node rank 1 already joined the job"), "duplicate:\n%s", ed);
    kill(pr.p1, SIGTERM);
    kill(pr.p0, SIGTERM);
    lu_wait(pr.p1, 30);
    lu_wait(pr.p0, 30);
    cr_expect_geq(lu_wait_pids_dead(pids, 2, 5), 0);
    free(ed);
    finish(dir);
}

Test(launch_multinode, lost_node_is_noticed_and_rejoins, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *extra[] = {"--max_restarts", "1", "--rdzv_timeout", "30", NULL};
    const char *env[] = {"FSDP_HEARTBEAT_TIMEOUT=1.5", NULL};
    struct pair pr = start_pair(dir, 1, extra, "sleepfirst", env);
    int pids[2];
    cr_assert_eq(lu_read_pids(dir, 2, pids, 30), 2);
    kill(pr.p1, SIGKILL);
    lu_wait(pr.p1, 10);
    /* node 1 comes back: a fresh launcher with the same node rank rejoins the next generation */
    const char *a[MAXARGS];
    char b[32];
    node_argv(a, b, 1, 1, pr.port, extra, "sleepfirst", dir);
    pid_t again = lu_spawn(a, dir, "n1b", env);
    int s0 = lu_wait(pr.p0, 40), s1 = lu_wait(again, 40);
    char *e0 = lu_slurp_tag(dir, "n0", "err"), *e1 = lu_slurp_tag(dir, "n1b", "err");
    cr_expect_eq(lu_exit_code(s0), 0, "node 0:\n%s", e0);
    cr_expect_eq(lu_exit_code(s1), 0, "node 1 again:\n%s", e1);
    cr_expect(strstr(e0, "node 1 stopped sending heartbeats"), "node 0:\n%s", e0);
    cr_expect_geq(lu_wait_pids_dead(pids, 2, 5), 0);
    for (int r = 0; r < 2; r++) {
        char path[FSDP_PATH_MAX];
        snprintf(path, sizeof path, "%s/ok.%d", dir, r);
        char *t = tu_slurp(path);
        cr_expect_str_eq(t, "1\n", "rank %d", r);
        free(t);
    }
    free(e0);
    free(e1);
    finish(dir);
}

Test(launch_multinode, lost_node_without_restarts_ends_job, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *env[] = {"FSDP_HEARTBEAT_TIMEOUT=1", NULL};
    struct pair pr = start_pair(dir, 1, NULL, "sleep", env);
    int pids[2];
    cr_assert_eq(lu_read_pids(dir, 2, pids, 30), 2);
    kill(pr.p1, SIGKILL);
    lu_wait(pr.p1, 10);
    int s0 = lu_wait(pr.p0, 30);
    char *e0 = lu_slurp_tag(dir, "n0", "err");
    cr_expect_eq(lu_exit_code(s0), 1, "node 0:\n%s", e0);
    cr_expect(strstr(e0, "node 1 stopped sending heartbeats"), "node 0:\n%s", e0);
    cr_expect_geq(lu_wait_pids_dead(pids, 2, 5), 0);
    free(e0);
    finish(dir);
}

Test(launch_multinode, store_host_gone_ends_other_nodes, .timeout = 60)
{
    char *dir = lu_tmpdir();
    struct pair pr = start_pair(dir, 1, NULL, "sleep", NULL);
    int pids[2];
    cr_assert_eq(lu_read_pids(dir, 2, pids, 30), 2);
    kill(pr.p0, SIGKILL);
    lu_wait(pr.p0, 10);
    int s1 = lu_wait(pr.p1, 30);
    char *e1 = lu_slurp_tag(dir, "n1", "err");
    cr_expect_eq(lu_exit_code(s1), 1, "node 1:\n%s", e1);
    cr_expect(strstr(e1, "The node hosting the store went away"), "node 1:\n%s", e1);
    cr_expect_geq(lu_wait_pids_dead(pids, 2, 5), 0);
    free(e1);
    finish(dir);
}

/* ---- two network namespaces joined by a veth pair ---- */

Test(launch_multinode, two_network_namespaces_over_veth, .timeout = 90)
{
    struct tu_netns_pair np;
    if (tu_netns_pair_make(&np, 'l', 213) != 0)
        cr_skip_test("cannot create network namespaces and a veth pair here (needs root and iproute2)");
    const char *ns0 = np.ns[0], *ns1 = np.ns[1], *addr = np.addr[0];
    char *dir = lu_tmpdir();
    const char *a0[] = {"/usr/bin/ip", "netns", "exec", ns0, LU_LAUNCH, "--nnodes", "2", "--node_rank", "0",
                        "--nproc_per_node", "2", "--master_addr", addr, "--master_port", "0", "--rdzv_timeout", "30",
                        LU_PROBE, "env", dir, NULL};
    pid_t p0 = lu_spawn(a0, dir, "n0", NULL);
    int port = lu_read_port(dir, "n0", 30);
    pid_t p1 = -1;
    if (port > 0) {
        char ports[16];
        snprintf(ports, sizeof ports, "%d", port);
        const char *a1[] = {"/usr/bin/ip", "netns", "exec", ns1, LU_LAUNCH, "--nnodes", "2", "--node_rank", "1",
                            "--nproc_per_node", "2", "--master_addr", addr, "--master_port", ports,
                            "--rdzv_timeout", "30", LU_PROBE, "env", dir, NULL};
        p1 = lu_spawn(a1, dir, "n1", NULL);
    }
    int s0 = lu_wait(p0, 40), s1 = p1 > 0 ? lu_wait(p1, 40) : -1;
    char *e0 = lu_slurp_tag(dir, "n0", "err"), *e1 = lu_slurp_tag(dir, "n1", "err");
    tu_netns_pair_remove(&np);
    cr_assert_gt(port, 0, "node 0 printed no port:\n%s", e0);
    cr_expect_eq(lu_exit_code(s0), 0, "node 0:\n%s", e0);
    cr_expect_eq(lu_exit_code(s1), 0, "node 1:\n%s", e1);
    char path[FSDP_PATH_MAX];
    snprintf(path, sizeof path, "%s/env.3", dir);
    char *t = tu_slurp(path);
    char want[64];
    snprintf(want, sizeof want, "\nMASTER_ADDR=%s\n", addr);
    cr_expect(strstr(t, want) && strstr(t, "\nGROUP_RANK=1\n"), "rank 3 env:\n%s", t);
    free(t);
    free(e0);
    free(e1);
    finish(dir);
}
