/* fsdp-launch on one node, run for real: the worker environment, restarts, signals, logs. */
#include "tests/util/launch_util.h"

#include <sys/socket.h>
#include <netinet/in.h>

static char *env_value(const char *text, const char *name)
{
    static char v[512];
    char key[128];
    snprintf(key, sizeof key, "\n%s=", name);
    char *all = malloc(strlen(text) + 2);
    all[0] = '\n';
    strcpy(all + 1, text);
    char *p = strstr(all, key);
    v[0] = 0;
    if (p) {
        p += strlen(key);
        size_t n = strcspn(p, "\n");
        snprintf(v, sizeof v, "%.*s", (int)n, p);
    }
    free(all);
    return p ? v : NULL;
}

Test(launch, env_contract_four_ranks, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc-per-node=4", "--max_restarts", "2", "--role", "trainer",
                          "--rdzv_id", "envrun", LU_PROBE, "env", dir, NULL};
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    int port = lu_read_port(dir, "launch", 30);
    int st = lu_wait(p, 40);
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_assert_eq(lu_exit_code(st), 0, "launcher exit %d, stderr:\n%s", lu_exit_code(st), err);
    cr_assert_gt(port, 0, "no port printed in:\n%s", err);
    cr_assert(strstr(err, "OMP_NUM_THREADS not set"), "no OMP notice in:\n%s", err);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    char omp[32], ports[32];
    snprintf(omp, sizeof omp, "%ld", cores / 4 > 0 ? cores / 4 : 1);
    snprintf(ports, sizeof ports, "%d", port);
    char token[256] = "";
    for (int r = 0; r < 4; r++) {
        char path[FSDP_PATH_MAX], want[32];
        snprintf(path, sizeof path, "%s/env.%d", dir, r);
        char *t = tu_slurp(path);
        cr_assert(t[0], "rank %d wrote no environment", r);
        snprintf(want, sizeof want, "%d", r);
        cr_expect_str_eq(env_value(t, "RANK"), want);
        cr_expect_str_eq(env_value(t, "LOCAL_RANK"), want);
        cr_expect_str_eq(env_value(t, "ROLE_RANK"), want);
        cr_expect_str_eq(env_value(t, "WORLD_SIZE"), "4");
        cr_expect_str_eq(env_value(t, "LOCAL_WORLD_SIZE"), "4");
        cr_expect_str_eq(env_value(t, "ROLE_WORLD_SIZE"), "4");
        cr_expect_str_eq(env_value(t, "GROUP_RANK"), "0");
        cr_expect_str_eq(env_value(t, "GROUP_WORLD_SIZE"), "1");
        cr_expect_str_eq(env_value(t, "ROLE_NAME"), "trainer");
        cr_expect_str_eq(env_value(t, "MASTER_ADDR"), "127.0.0.1");
        cr_expect_str_eq(env_value(t, "MASTER_PORT"), ports);
        cr_expect_str_eq(env_value(t, "TORCHELASTIC_RESTART_COUNT"), "0");
        cr_expect_str_eq(env_value(t, "TORCHELASTIC_MAX_RESTARTS"), "2");
        cr_expect_str_eq(env_value(t, "TORCHELASTIC_RUN_ID"), "envrun");
        cr_expect_str_eq(env_value(t, "FSDP_STORE_PREFIX"), "worker/g0/");
        cr_expect_str_eq(env_value(t, "OMP_NUM_THREADS"), omp);
        const char *tok = env_value(t, "FSDP_RDZV_TOKEN");
        cr_expect(tok && strcmp(tok, "<unset>") != 0 && strlen(tok) >= 16, "rank %d: no generated token", r);
        if (r == 0)
            snprintf(token, sizeof token, "%s", tok ? tok : "");
        else
            cr_expect_str_eq(tok ? tok : "", token, "ranks got different tokens");
        free(t);
    }
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

Test(launch, user_omp_and_token_kept, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "2", LU_PROBE, "env", dir, NULL};
    const char *env[] = {"OMP_NUM_THREADS=3", "FSDP_RDZV_TOKEN=sekrit", NULL};
    pid_t p = lu_spawn(argv, dir, "launch", env);
    int st = lu_wait(p, 40);
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_assert_eq(lu_exit_code(st), 0, "stderr:\n%s", err);
    cr_expect_null(strstr(err, "OMP_NUM_THREADS not set"), "notice printed although the user set it");
    char path[FSDP_PATH_MAX];
    snprintf(path, sizeof path, "%s/env.1", dir);
    char *t = tu_slurp(path);
    cr_expect_str_eq(env_value(t, "OMP_NUM_THREADS"), "3");
    cr_expect_str_eq(env_value(t, "FSDP_RDZV_TOKEN"), "sekrit");
    free(t);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

Test(launch, failure_stops_all_ranks_and_reports_root_cause, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "3", LU_PROBE, "fail", dir, "1", "7", NULL};
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    int pids[3];
    cr_assert_eq(lu_read_pids(dir, 3, pids, 30), 3, "workers did not start");
    int st = lu_wait(p, 30);
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_assert_eq(lu_exit_code(st), 7, "launcher exit %d, stderr:\n%s", lu_exit_code(st), err);
    cr_expect_geq(lu_wait_pids_dead(pids, 3, 5), 0, "workers outlived the launcher");
    cr_expect(strstr(err, "Root cause (first failure): rank 1 (local rank 1) on node 0"), "summary:\n%s", err);
    cr_expect(strstr(err, "exit code 7"), "summary:\n%s", err);
    cr_expect(strstr(err, "rank 1 giving up with exit code 7"), "no stderr tail in:\n%s", err);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

/* Started with SIGCHLD ignored (a disposition that survives exec: some supervisors and scripts leave it so),
 * the kernel would reap the workers itself and the launcher would never learn they ended; it resets
 * SIGCHLD, so a failing rank still ends the job with its exit code. */
Test(launch, sigchld_ignored_by_the_parent_still_reports_the_failure, .timeout = 90)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "2", LU_PROBE, "fail", dir, "1", "7", NULL};
    struct sigaction ign = {.sa_handler = SIG_IGN}, old;
    cr_assert_eq(sigaction(SIGCHLD, &ign, &old), 0);
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    cr_assert_eq(sigaction(SIGCHLD, &old, NULL), 0);
    int st = lu_wait(p, 30);
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_assert_eq(lu_exit_code(st), 7, "launcher exit %d, stderr:\n%s", lu_exit_code(st), err);
    cr_expect(strstr(err, "Root cause (first failure): rank 1 (local rank 1) on node 0"), "summary:\n%s", err);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

/* Ranks that stop because another failed exit 3; the rank that failed first may be reaped after them
 * (a killed process's threads still exiting). Runs the probe's "peerfirst" mode: every rank but `bad`
 * exits 3 at once, `bad` exits 9 `delay` seconds later; checks the launcher's exit code and the rank it
 * names as the root cause. */
static void peerfirst_case(const char *nproc, const char *bad, const char *delay, int want_code, int want_rank,
                           const char *want_tail)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", nproc, LU_PROBE, "peerfirst", dir, bad, "9",
                          delay, NULL};
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    int st = lu_wait(p, 30);
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_assert_eq(lu_exit_code(st), want_code, "launcher exit %d, stderr:\n%s", lu_exit_code(st), err);
    char want[128];
    snprintf(want, sizeof want, "Root cause (first failure): rank %d (local rank %d) on node 0", want_rank, want_rank);
    cr_expect(strstr(err, want), "summary (want rank %d):\n%s", want_rank, err);
    if (want_tail)
        cr_expect(strstr(err, want_tail), "the root cause's stderr tail is missing:\n%s", err);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

/* The launcher looks 0.5 s longer for a failure that is not a consequence and names it... */
Test(launch, root_cause_is_not_a_rank_that_followed_a_peer, .timeout = 60)
{
    peerfirst_case("3", "2", "0.15", 9, 2, "failing for real");
}

/* ... but only for a moment: with no other failure within it, the first one stands. */
Test(launch, root_cause_search_is_bounded, .timeout = 60)
{
    peerfirst_case("2", "1", "20", 3, 0, "another rank failed");
}

Test(launch, restart_after_first_attempt_fails, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "2", "--max_restarts", "1", "--log_dir", dir,
                          LU_PROBE, "failfirst", dir, NULL};
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    int st = lu_wait(p, 40);
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_assert_eq(lu_exit_code(st), 0, "launcher exit %d, stderr:\n%s", lu_exit_code(st), err);
    cr_expect(strstr(err, "restarting the job"), "no restart notice:\n%s", err);
    for (int r = 0; r < 2; r++) {
        char path[FSDP_PATH_MAX];
        snprintf(path, sizeof path, "%s/ok.%d", dir, r);
        char *t = tu_slurp(path);
        cr_expect_str_eq(t, "1\n", "rank %d did not see TORCHELASTIC_RESTART_COUNT=1", r);
        free(t);
    }
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

Test(launch, no_restart_left_exits_with_code, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "2", LU_PROBE, "failfirst", dir, NULL};
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    int st = lu_wait(p, 40);
    cr_assert_eq(lu_exit_code(st), 4);
    lu_rm_rf(dir);
    free(dir);
}

Test(launch, sigkill_of_launcher_leaves_no_worker, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "3", LU_PROBE, "sleep", dir, NULL};
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    int pids[3];
    cr_assert_eq(lu_read_pids(dir, 3, pids, 30), 3, "workers did not start");
    kill(p, SIGKILL);
    lu_wait(p, 10);
    cr_expect_geq(lu_wait_pids_dead(pids, 3, 5), 0, "a worker outlived its SIGKILLed launcher");
    for (int i = 0; i < 3; i++)
        kill(pids[i], SIGKILL);
    lu_rm_rf(dir);
    free(dir);
}

/* A worker that is a wrapper script running the real program without exec: the program is the launcher's
 * grandchild, out of reach of the worker's parent-death signal. A SIGKILLed launcher must still leave
 * nothing running (the guard kills the workers' process groups). */
Test(launch, sigkill_of_launcher_kills_grandchildren_of_a_wrapper_script, .timeout = 60)
{
    char *dir = lu_tmpdir();
    char script[FSDP_PATH_MAX], text[9000];
    snprintf(script, sizeof script, "%s/wrapper.sh", dir);
    snprintf(text, sizeof text, "#!/bin/sh\n'%s' sleep '%s'\necho the probe ended\n", LU_PROBE, dir);
    lu_write_text(script, text);
    cr_assert_eq(chmod(script, 0755), 0);
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "2", script, NULL};
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    int pids[2];
    cr_assert_eq(lu_read_pids(dir, 2, pids, 30), 2, "workers did not start");
    for (int i = 0; i < 2; i++) {
        char path[64], stat[512] = "";
        snprintf(path, sizeof path, "/proc/%d/stat", pids[i]);
        FILE *f = fopen(path, "r");
        cr_assert_not_null(f);
        cr_assert_not_null(fgets(stat, sizeof stat, f));
        fclose(f);
        int ppid = 0;
        cr_assert_eq(sscanf(strrchr(stat, ')') + 2, "%*c %d", &ppid), 1);
        cr_assert_neq(ppid, (int)p, "the probe is the launcher's own child: the wrapper exec'd it");
    }
    kill(p, SIGKILL);
    lu_wait(p, 10);
    double took = lu_wait_pids_dead(pids, 2, 5);
    for (int i = 0; i < 2; i++)
        kill(pids[i], SIGKILL);
    cr_assert_geq(took, 0, "a wrapper script's child outlived its SIGKILLed launcher");
    lu_rm_rf(dir);
    free(dir);
}

/* `fsdp-launch ... | sleep 20`: a console that stops reading while a rank prints 10 MB. Supervision goes
 * on (the other rank's failure is seen and the job stops at once), the log file has all 10 MB, and the
 * console got what fit in its queue. */
Test(launch, stalled_console_never_blocks_supervision, .timeout = 60)
{
    char *dir = lu_tmpdir();
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    char err[FSDP_PATH_MAX];
    snprintf(err, sizeof err, "%s/launch.err", dir);
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "2", "--log_dir", dir, "--rdzv_id", "stall",
                          LU_PROBE, "bigout", dir, NULL};
    double t0 = tu_now();
    pid_t p = fork();
    cr_assert_geq(p, 0);
    if (p == 0) {
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (e < 0 || dup2(pfd[1], 1) != 1 || dup2(e, 2) != 2)
            _exit(120);
        close(pfd[0]);
        execv(argv[0], (char *const *)argv);
        _exit(121);
    }
    close(pfd[1]);
    int st = lu_wait(p, 30); /* the test never reads the pipe until the launcher is gone */
    double took = tu_now() - t0;
    char *text = tu_slurp(err);
    cr_assert_eq(lu_exit_code(st), 7, "exit %d after %.1f s (a launcher blocked on its console never reaps):\n%s",
                 lu_exit_code(st), took, text);
    cr_assert_lt(took, 20, "the launcher took %.1f s", took);
    char log[FSDP_PATH_MAX];
    snprintf(log, sizeof log, "%s/stall/attempt_0/0/stdout.log", dir);
    struct stat sb;
    cr_assert_eq(stat(log, &sb), 0, "%s", log);
    cr_assert_eq(sb.st_size, 100 * 100000, "the log file has %lld bytes, not all 10 MB", (long long)sb.st_size);
    char buf[65536];
    size_t total = 0;
    for (ssize_t n; (n = read(pfd[0], buf, sizeof buf)) > 0;)
        total += (size_t)n;
    close(pfd[0]);
    cr_assert_lt(total, 100 * 100000, "the console got everything (%zu bytes): nothing stalled?", total);
    free(text);
    lu_rm_rf(dir);
    free(dir);
}

/* The first number of the first and of the last line of a log file ("out 00001234 ..."). */
static void line_range(const char *path, long *first, long *last, long long *bytes)
{
    char *t = tu_slurp(path);
    size_t n = strlen(t);
    *bytes = (long long)n;
    *first = n > 12 ? atol(t + 4) : -1;
    char *end = n > 1 ? t + n - 1 : t;
    while (end > t && end[-1] != '\n')
        end--;
    *last = *end ? atol(end + 4) : -1;
    free(t);
}

/* --log_max_bytes 8k: each stream's file is rotated into FILE.1 at 8 KiB, both stay under it, and together
 * they hold the newest lines without a gap; the console still gets everything. */
Test(launch, log_max_bytes_rotates_log_files, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--rdzv_id", "rot", "--log_dir", dir, "--log_max_bytes", "8k",
                          LU_PROBE, "lines", "1000", NULL};
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    cr_assert_eq(lu_exit_code(lu_wait(p, 40)), 0, "%s", lu_slurp_tag(dir, "launch", "err"));
    static const char *const streams[] = {"stdout", "stderr"};
    for (int i = 0; i < 2; i++) {
        char cur[FSDP_PATH_MAX], old[FSDP_PATH_MAX];
        snprintf(cur, sizeof cur, "%s/rot/attempt_0/0/%s.log", dir, streams[i]);
        tu_pathf(old, sizeof old, "%s.1", cur);
        long f1, l1, f0, l0;
        long long b1, b0;
        line_range(old, &f1, &l1, &b1);
        line_range(cur, &f0, &l0, &b0);
        cr_expect(b0 <= 8192 && b1 <= 8192 && b1 > 8000, "%s: %lld and %lld bytes", streams[i], b1, b0);
        cr_expect_eq(l0, 999, "%s: the current file ends at line %ld", streams[i], l0);
        cr_expect_eq(f0, l1 + 1, "%s: gap between %s.1 (last %ld) and the current file (first %ld)", streams[i],
                     streams[i], l1, f0);
        cr_expect_eq(b1, (l1 - f1 + 1) * 100, "%s.1 holds cut lines", streams[i]);
    }
    char *out = lu_slurp_tag(dir, "launch", "out");
    cr_expect_eq(strlen(out), 100000u, "the console got %zu bytes of stdout", strlen(out));
    free(out);
    lu_rm_rf(dir);
    free(dir);
}

/* ignored_at_start: the launcher starts with sig ignored, as a job script's `fsdp-launch ... &` starts it
 * with SIGINT and SIGQUIT ignored and nohup with SIGHUP ignored; a SIG_IGN survives exec, so workers that
 * inherited it would never get the signal forwarded to them. */
static void signal_exits_cleanly_ex(int sig, bool ignored_at_start)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "2", LU_PROBE, "sleep", dir, NULL};
    struct sigaction ign = {.sa_handler = SIG_IGN}, old;
    if (ignored_at_start)
        cr_assert_eq(sigaction(sig, &ign, &old), 0);
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    if (ignored_at_start)
        cr_assert_eq(sigaction(sig, &old, NULL), 0);
    int pids[2];
    cr_assert_eq(lu_read_pids(dir, 2, pids, 30), 2, "workers did not start");
    double t0 = tu_now();
    kill(p, sig);
    int st = lu_wait(p, 20);
    double took = tu_now() - t0;
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_expect_eq(lu_exit_code(st), 128 + sig, "exit %d, stderr:\n%s", lu_exit_code(st), err);
    cr_expect_lt(took, 10, "launcher took %.1f s to stop", took);
    cr_expect_geq(lu_wait_pids_dead(pids, 2, 5), 0, "workers left running");
    cr_expect(strstr(err, "forwarding it to the workers"), "stderr:\n%s", err);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

static void signal_exits_cleanly(int sig)
{
    signal_exits_cleanly_ex(sig, false);
}

Test(launch, sigint_gives_clean_exit, .timeout = 60) { signal_exits_cleanly(SIGINT); }
Test(launch, sigterm_gives_clean_exit, .timeout = 60) { signal_exits_cleanly(SIGTERM); }
Test(launch, sighup_gives_clean_exit, .timeout = 60) { signal_exits_cleanly(SIGHUP); }
Test(launch, sigquit_gives_clean_exit, .timeout = 60) { signal_exits_cleanly(SIGQUIT); }

/* Started in the background by a script (SIGINT, SIGQUIT ignored) or under nohup (SIGHUP ignored): the
 * signal still stops the job at once, the workers getting it too. */
Test(launch, signals_ignored_by_the_starting_shell_still_stop_the_workers, .timeout = 120)
{
    signal_exits_cleanly_ex(SIGINT, true);
    signal_exits_cleanly_ex(SIGQUIT, true);
    signal_exits_cleanly_ex(SIGHUP, true);
}

/* A worker that ignores SIGTERM is SIGKILLed --shutdown_timeout seconds after it. */
Test(launch, shutdown_timeout_escalates_to_sigkill, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "2", "--shutdown-timeout", "1", LU_PROBE,
                          "stubborn", dir, NULL};
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    int pids[2];
    cr_assert_eq(lu_read_pids(dir, 2, pids, 30), 2, "workers did not start");
    double t0 = tu_now();
    kill(p, SIGTERM);
    int st = lu_wait(p, 30);
    double took = tu_now() - t0;
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_expect_eq(lu_exit_code(st), 128 + SIGTERM, "exit %d, stderr:\n%s", lu_exit_code(st), err);
    cr_expect_geq(took, 0.9, "SIGKILL came before --shutdown_timeout (%.2f s)", took);
    cr_expect_lt(took, 10, "launcher took %.1f s to stop", took);
    cr_expect(strstr(err, "still running 1.0 s after SIGTERM (--shutdown_timeout): sending SIGKILL"), "stderr:\n%s",
              err);
    cr_expect_geq(lu_wait_pids_dead(pids, 2, 5), 0, "workers left running");
    for (int i = 0; i < 2; i++)
        kill(pids[i], SIGKILL);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

Test(launch, log_dir_layout_and_tee, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "2", "--rdzv_id", "logrun", "--log_dir", dir,
                          "--tee", "3", "--local_ranks_filter", "1", LU_PROBE, "talk", NULL};
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    int st = lu_wait(p, 40);
    char *out = lu_slurp_tag(dir, "launch", "out");
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_assert_eq(lu_exit_code(st), 0, "stderr:\n%s", err);
    for (int r = 0; r < 2; r++) {
        char path[FSDP_PATH_MAX], want[128];
        snprintf(path, sizeof path, "%s/logrun/attempt_0/%d/stdout.log", dir, r);
        char *t = tu_slurp(path);
        snprintf(want, sizeof want, "out line 1 of rank %d\nout line 2 of rank %d\n", r, r);
        cr_expect_str_eq(t, want, "%s", path);
        free(t);
        snprintf(path, sizeof path, "%s/logrun/attempt_0/%d/stderr.log", dir, r);
        t = tu_slurp(path);
        snprintf(want, sizeof want, "err line of rank %d\n", r);
        cr_expect_str_eq(t, want, "%s", path);
        free(t);
    }
    /* Only local rank 1 passes the filter, and tee prefixes its lines. */
    cr_expect_str_eq(out, "[rank 1]:out line 1 of rank 1\n[rank 1]:out line 2 of rank 1\n");
    cr_expect(strstr(err, "[rank 1]:err line of rank 1\n"), "stderr:\n%s", err);
    cr_expect_null(strstr(err, "rank 0\n"), "filtered rank 0 reached the console:\n%s", err);
    free(out);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

/* Four ranks write long lines at once, each line cut across several pipe writes: every console line
 * must still be one rank's whole line. */
Test(launch, lines_of_ranks_never_interleave, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "4", LU_PROBE, "flood", NULL};
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    int st = lu_wait(p, 40);
    char *out = lu_slurp_tag(dir, "launch", "out");
    cr_assert_eq(lu_exit_code(st), 0);
    int per_rank[4] = {0}, bad = 0;
    for (char *l = out; *l;) {
        char *nl = strchr(l, '\n');
        size_t n = nl ? (size_t)(nl - l) : strlen(l);
        int r = l[0] - 'a';
        bool whole = n == 5000 && r >= 0 && r < 4;
        for (size_t i = 0; whole && i < n; i++)
            whole = l[i] == l[0];
        if (whole)
            per_rank[r]++;
        else
            bad++;
        l = nl ? nl + 1 : l + n;
    }
    cr_expect_eq(bad, 0, "%d mixed or cut lines on the console", bad);
    for (int r = 0; r < 4; r++)
        cr_expect_eq(per_rank[r], 400, "rank %d: %d whole lines of 400", r, per_rank[r]);
    free(out);
    lu_rm_rf(dir);
    free(dir);
}

Test(launch, redirects_keep_stream_off_console, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "1", "--rdzv_id", "r", "--log_dir", dir,
                          "--redirects", "0:1", LU_PROBE, "talk", NULL};
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    int st = lu_wait(p, 40);
    char *out = lu_slurp_tag(dir, "launch", "out");
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_assert_eq(lu_exit_code(st), 0, "stderr:\n%s", err);
    cr_expect_str_eq(out, "", "redirected stdout reached the console");
    cr_expect(strstr(err, "err line of rank 0\n"), "stderr (not redirected) missing:\n%s", err);
    char path[FSDP_PATH_MAX];
    snprintf(path, sizeof path, "%s/r/attempt_0/0/stdout.log", dir);
    char *t = tu_slurp(path);
    cr_expect(strstr(t, "out line 2 of rank 0"), "%s: %s", path, t);
    free(t);
    free(out);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

Test(launch, program_found_next_to_launcher_and_demo_runs, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "3", "fsdp-rdzv-demo", NULL};
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    int st = lu_wait(p, 40);
    char *out = lu_slurp_tag(dir, "launch", "out");
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_assert_eq(lu_exit_code(st), 0, "stderr:\n%s", err);
    for (int r = 0; r < 3; r++) {
        char want[64];
        snprintf(want, sizeof want, "rank %d of 3 (local rank %d)", r, r);
        cr_expect(strstr(out, want), "missing '%s' in:\n%s", want, out);
    }
    free(out);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

/* One knob for the whole job: --log_level (else the launcher's FSDP_LOG_LEVEL) sets the launcher's own
 * level and reaches every worker as FSDP_LOG_LEVEL, overriding what the workers would inherit. */
Test(launch, log_level_flag_reaches_workers, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "2", "--log-level", "debug", LU_PROBE, "env",
                          dir, NULL};
    const char *env[] = {"FSDP_LOG_LEVEL=error", NULL};
    pid_t p = lu_spawn(argv, dir, "launch", env);
    int st = lu_wait(p, 40);
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_assert_eq(lu_exit_code(st), 0, "stderr:\n%s", err);
    cr_expect(strstr(err, "] D: node 0 of 1"), "the launcher did not log at debug level:\n%s", err);
    for (int r = 0; r < 2; r++) {
        char path[FSDP_PATH_MAX];
        snprintf(path, sizeof path, "%s/env.%d", dir, r);
        char *t = tu_slurp(path);
        cr_expect_str_eq(env_value(t, "FSDP_LOG_LEVEL"), "debug", "rank %d", r);
        free(t);
    }
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

Test(launch, log_level_environment_reaches_workers, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "2", LU_PROBE, "env", dir, NULL};
    const char *env[] = {"FSDP_LOG_LEVEL=WARN", NULL};
    pid_t p = lu_spawn(argv, dir, "launch", env);
    int st = lu_wait(p, 40);
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_assert_eq(lu_exit_code(st), 0, "stderr:\n%s", err);
    cr_expect_null(strstr(err, "OMP_NUM_THREADS not set"), "an info line passed FSDP_LOG_LEVEL=WARN:\n%s", err);
    for (int r = 0; r < 2; r++) {
        char path[FSDP_PATH_MAX];
        snprintf(path, sizeof path, "%s/env.%d", dir, r);
        char *t = tu_slurp(path);
        cr_expect_str_eq(env_value(t, "FSDP_LOG_LEVEL"), "warn", "rank %d", r);
        free(t);
    }
    free(err);
    lu_rm_rf(dir);
    free(dir);
}
