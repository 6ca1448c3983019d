/* fsdp-launch --status_port through real HTTP over loopback during a 2-rank CPU training job (fsdp-worker):
 * /api/status and /metrics while it runs, the root cause after a rank is SIGKILLed and the job restarted,
 * escaping of a hostile run id, malformed and oversized requests, many concurrent clients, a client that
 * never reads (the job still finishes), a non-loopback bind without a token refused, slowloris and silent
 * clients dropped by the request deadline, the connection cap, and clients of another host (a second
 * network namespace) let in by the page's own read-only token only, never by the store secret, and a
 * SIGSTOPped rank named by its stopped heartbeat, also when its peer's collective times out first. */
#include "tests/util/launch_util.h"
#include "tests/util/tu_netns.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#define TINY                                                                                                   \
    "[model]\nn_layer = 2\nn_head = 2\nn_embd = 32\nvocab_size = 256\nblock_size = 16\n"                       \
    "[train]\ndevice = cpu\ntrain_batch = 12\nmicro_batch = 1\nmax_steps = %d\neval_interval = 20\n"           \
    "[optim]\nlr = 0.003\nwarmup_steps = 2\n"

struct job {
    char *dir;
    char ini[FSDP_PATH_MAX];
    pid_t pid;
    int port;
};

static void job_start(struct job *j, int max_steps, const char *run_id, const char *const *env, const char *stale)
{
    j->dir = lu_tmpdir();
    char data[FSDP_PATH_MAX], docs[FSDP_PATH_MAX];
    snprintf(data, sizeof data, "%s/data", j->dir);
    snprintf(docs, sizeof docs, "%s/tests/data/corpus", getenv("FSDP_SOURCE_ROOT"));
    const char *pargv[] = {lu_build_path("worker/fsdp-prepare-data"), "-o", data, docs, NULL};
    pid_t p = lu_spawn(pargv, j->dir, "prep", NULL);
    cr_assert_eq(lu_exit_code(lu_wait(p, 60)), 0, "fsdp-prepare-data: %s", lu_slurp_tag(j->dir, "prep", "err"));
    char text[16384], head[1024];
    snprintf(head, sizeof head, TINY, max_steps);
    snprintf(text, sizeof text, "%s[data]\ntrain_file = %s/train.bin\nval_file = %s/val.bin\n", head, data, data);
    snprintf(j->ini, sizeof j->ini, "%s/tiny.ini", j->dir);
    lu_write_text(j->ini, text);
    char logdir[FSDP_PATH_MAX];
    snprintf(logdir, sizeof logdir, "--log.dir=%s/logs", j->dir);
    /* checkpoints in the test's own directory: under the default ./runs/RUN_ID/checkpoints a later run of the
     * suite would resume at max_steps and end before the page is asked anything */
    char ckdir[FSDP_PATH_MAX];
    snprintf(ckdir, sizeof ckdir, "--checkpoint.dir=%s/ck", j->dir);
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "2", "--max_restarts", "1",
                          "--status_port", "0", "--status_stale_timeout", stale, "--run_id", run_id, lu_build_path("worker/fsdp-worker"), j->ini,
                          logdir, ckdir, NULL};
    const char *envs[8] = {"OMP_NUM_THREADS=1"};
    int m = 1;
    for (int i = 0; env && env[i]; i++)
        envs[m++] = env[i];
    envs[m] = NULL;
    j->pid = lu_spawn(argv, j->dir, "job", envs);
    j->port = -1;
    double end = tu_now() + 60;
    while (j->port < 0 && tu_now() < end) {
        char *s = lu_slurp_tag(j->dir, "job", "err");
        char *at = strstr(s, "fsdp-launch: status page on http://127.0.0.1:");
        if (at && strchr(at, '\n'))
            j->port = atoi(at + strlen("fsdp-launch: status page on http://127.0.0.1:"));
        free(s);
        if (j->port < 0)
            tu_nap(0.02);
    }
    cr_assert_gt(j->port, 0, "no status page address printed: %s", lu_slurp_tag(j->dir, "job", "err"));
}

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect to the status page: %s", strerror(errno));
    return fd;
}

/* Sends raw bytes, reads the whole answer (the server closes: Connection: close) within timeout_s. */
static char *http_raw(int port, const char *req, size_t len, double timeout_s)
{
    int fd = connect_to(port);
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, req + off, len - off, MSG_NOSIGNAL);
        if (n <= 0)
            break; /* the server may close on an oversized request before reading it all */
        off += (size_t)n;
    }
    size_t cap = 1 << 16, got = 0;
    char *buf = malloc(cap);
    double end = tu_now() + timeout_s;
    while (tu_now() < end) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        if (got + 4096 > cap)
            buf = realloc(buf, cap *= 2);
        ssize_t n = recv(fd, buf + got, cap - got - 1, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    buf[got] = 0;
    close(fd);
    return buf;
}

static char *http_get(int port, const char *path, int *code)
{
    char req[512];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
    char *r = http_raw(port, req, (size_t)n, 10);
    *code = strncmp(r, "HTTP/1.", 7) == 0 ? atoi(r + 9) : -1;
    char *body = strstr(r, "\r\n\r\n");
    char *out = strdup(body ? body + 4 : "");
    free(r);
    return out;
}

static cJSON *get_status(int port)
{
    int code;
    char *b = http_get(port, "/api/status", &code);
    cr_assert_eq(code, 200, "/api/status answered %d: %s", code, b);
    cJSON *o = cJSON_Parse(b);
    cr_assert(o, "/api/status is not JSON: %s", b);
    free(b);
    return o;
}

static double jnum(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* Polls /api/status until both ranks report a step >= min_step (and, when want_restarts >= 0, the job has
 * restarted that often); returns that snapshot. */
static cJSON *wait_running(struct job *j, int min_step, int want_restarts, double timeout_s)
{
    double end = tu_now() + timeout_s;
    while (tu_now() < end) {
        cJSON *o = get_status(j->port);
        const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(o, "ranks");
        bool ok = cJSON_GetArraySize(ranks) == 2 && (want_restarts < 0 || jnum(o, "restarts") == want_restarts);
        for (int r = 0; ok && r < 2; r++) {
            const cJSON *x = cJSON_GetArrayItem(ranks, r);
            ok = jnum(x, "step") >= min_step && strcmp(jstr(x, "state"), "running") == 0 &&
                 (want_restarts < 0 || jnum(x, "restart") == want_restarts);
        }
        if (ok)
            return o;
        cJSON_Delete(o);
        tu_nap(0.05);
    }
    cr_assert_fail("the ranks never reported step %d (restarts %d): %s", min_step, want_restarts,
                   lu_slurp_tag(j->dir, "job", "err"));
    return NULL;
}

static void job_finish(struct job *j, int want)
{
    int code = lu_exit_code(lu_wait(j->pid, 240));
    cr_assert_eq(code, want, "fsdp-launch exited %d: %s", code, lu_slurp_tag(j->dir, "job", "err"));
    lu_rm_rf(j->dir);
    free(j->dir);
}

Test(launch_status, json_metrics_and_page_during_a_two_rank_job, .timeout = 240)
{
    struct job j;
    job_start(&j, 100000, "run<script>alert(1)<img onerror=x>", NULL, "30");
    cJSON *o = wait_running(&j, 25, 0, 120);
    cr_assert_str_eq(jstr(o, "run_id"), "run<script>alert(1)<img onerror=x>");
    cr_assert_eq(jnum(o, "world_size"), 2);
    cr_assert_eq(jnum(o, "nnodes"), 1);
    for (int r = 0; r < 2; r++) {
        const cJSON *x = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "ranks"), r);
        cr_assert_eq(jnum(x, "rank"), r);
        cr_assert_gt(jnum(x, "pid"), 0);
        cr_assert_gt(jnum(x, "loss"), 0);
        cr_assert_gt(jnum(x, "tokens_per_s"), 0);
        cr_assert_gt(jnum(x, "peak_rss_bytes"), 0);
        cr_assert_eq(jnum(x, "max_steps"), 100000);
        const cJSON *mem = cJSON_GetObjectItemCaseSensitive(x, "memory");
        cr_assert_gt(jnum(mem, "params"), 0, "rank %d memory: no params", r);
        cr_assert_gt(jnum(mem, "optimizer"), 0);
    }
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "history");
    cr_assert_gt(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(h, "loss")), 0);
    cr_assert_gt(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(h, "val_loss")), 0, "no val-loss point by step 25");
    cr_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "failure")));
    cJSON_Delete(o);

    int code;
    char *m = http_get(j.port, "/metrics", &code);
    cr_assert_eq(code, 200);
    cr_assert(strstr(m, "# TYPE fsdp_step gauge\n"), "%s", m);
    const char *want[] = {"fsdp_step{run_id=\"run<script>alert(1)<img onerror=x>\",rank=\"0\"} ",
                          "fsdp_step{run_id=\"run<script>alert(1)<img onerror=x>\",rank=\"1\"} ",
                          "fsdp_loss{run_id=\"run<script>alert(1)<img onerror=x>\",rank=\"1\"} ",
                          "fsdp_tokens_per_second{run_id=\"run<script>alert(1)<img onerror=x>\",rank=\"0\"} ",
                          "fsdp_memory_bytes{run_id=\"run<script>alert(1)<img onerror=x>\",rank=\"1\",category=\"params\"} ",
                          "fsdp_rank_state{run_id=\"run<script>alert(1)<img onerror=x>\",rank=\"0\",state=\"running\"} 1\n"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(m, want[i]), "/metrics lacks '%s':\n%s", want[i], m);
    free(m);

    char *page = http_get(j.port, "/", &code);
    cr_assert_eq(code, 200);
    cr_assert(strstr(page, "run&lt;script&gt;alert(1)&lt;img onerror=x&gt;"), "run id not escaped: %s", page);
    cr_assert_null(strstr(page, "<script>alert"), "the run id ran as a script: %s", page);
    cr_assert(strstr(page, "<table id=\"ranks\">") && strstr(page, "<svg id=\"plot-loss\"") &&
                  strstr(page, "<polyline"),
              "no rank table or loss plot: %s", page);
    free(page);
    char *frag = http_get(j.port, "/?fragment=1", &code);
    cr_assert_eq(code, 200);
    cr_assert(strstr(frag, "<table id=\"ranks\">") && !strstr(frag, "<html"), "%s", frag);
    free(frag);
    char *nf = http_get(j.port, "/nope", &code);
    cr_assert_eq(code, 404);
    free(nf);

    kill(j.pid, SIGTERM);
    job_finish(&j, 128 + SIGTERM);
}

Test(launch_status, killed_rank_shows_its_root_cause_after_the_restart, .timeout = 240)
{
    struct job j;
    const char *env[] = {"FSDP_FAULT_KILL=15:1", NULL};
    job_start(&j, 100000, "killed", env, "30");
    cJSON *o = wait_running(&j, 3, 1, 180);
    cr_assert_eq(jnum(o, "generation"), 1);
    const cJSON *pf = cJSON_GetObjectItemCaseSensitive(o, "previous_failure");
    cr_assert(cJSON_IsObject(pf), "no previous failure after the restart: %s", cJSON_PrintUnformatted(o));
    cr_assert_eq(jnum(pf, "rank"), 1);
    cr_assert(strstr(jstr(pf, "status"), "SIGKILL"), "root cause status '%s'", jstr(pf, "status"));
    cr_assert(strstr(jstr(pf, "stderr_tail"), "FSDP_FAULT_KILL"), "stderr tail: '%s'", jstr(pf, "stderr_tail"));
    const cJSON *r1 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "ranks"), 1);
    cr_assert(strstr(jstr(r1, "previous_exit"), "SIGKILL"), "rank 1 previous exit '%s'", jstr(r1, "previous_exit"));
    cr_assert_eq(jnum(r1, "restart"), 1);
    cJSON_Delete(o);
    int code;
    char *page = http_get(j.port, "/", &code);
    cr_assert(strstr(page, "id=\"rootcause\"") && strstr(page, "FSDP_FAULT_KILL"), "no root-cause box: %s", page);
    free(page);
    char *m = http_get(j.port, "/metrics", &code);
    cr_assert(strstr(m, "fsdp_restarts{run_id=\"killed\"} 1\n"), "%s", m);
    free(m);
    kill(j.pid, SIGTERM);
    job_finish(&j, 128 + SIGTERM);
}

Test(launch_status, bad_requests_many_clients_and_a_slow_client, .timeout = 240)
{
    struct job j;
    job_start(&j, 400, "abuse", NULL, "30");
    cJSON_Delete(wait_running(&j, 1, 0, 120));
    /* A client that sends half a request and never reads: held open for the whole job. */
    int slow = connect_to(j.port);
    const char *half = "GET /api/status HTTP/1.1\r\nHost: x\r\n";
    cr_assert_gt(send(slow, half, strlen(half), MSG_NOSIGNAL), 0);
    int slow2 = connect_to(j.port);
    const char *full = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"; /* answered, never read */
    cr_assert_gt(send(slow2, full, strlen(full), MSG_NOSIGNAL), 0);

    const char *garbage = "\x01\x02 not http at all\r\n\r\n";
    char *r = http_raw(j.port, garbage, strlen(garbage), 10);
    cr_assert(r[0] == 0 || strncmp(r, "HTTP/1.1 400", 12) == 0, "garbage answered: %s", r);
    free(r);
    size_t big = 64 * 1024;
    char *huge = malloc(big + 64);
    int n = snprintf(huge, big + 64, "GET /api/status HTTP/1.1\r\nX-Big: ");
    memset(huge + n, 'a', big);
    memcpy(huge + n + big, "\r\n\r\n", 5);
    r = http_raw(j.port, huge, (size_t)n + big + 4, 10);
    cr_assert(r[0] == 0 || strncmp(r, "HTTP/1.1 4", 10) == 0, "oversized headers answered: %.200s", r);
    cr_assert_null(strstr(r, "\"ranks\""), "oversized request was served");
    free(r);
    free(huge);
    const char *post = "POST /api/status HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi";
    r = http_raw(j.port, post, strlen(post), 10);
    cr_assert(strncmp(r, "HTTP/1.1 405", 12) == 0, "POST answered: %s", r);
    free(r);

    /* 64 clients at once, each a full request; every one gets a 200 JSON answer. */
    enum { NC = 64 };
    int fds[NC];
    const char *req = "GET /api/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    for (int i = 0; i < NC; i++) {
        fds[i] = connect_to(j.port);
        cr_assert_eq(send(fds[i], req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    }
    for (int i = 0; i < NC; i++) {
        char buf[65536];
        size_t got = 0;
        double end = tu_now() + 20;
        while (tu_now() < end && got < sizeof buf - 1) {
            struct pollfd pf = {.fd = fds[i], .events = POLLIN};
            if (poll(&pf, 1, 100) <= 0)
                continue;
            ssize_t k = recv(fds[i], buf + got, sizeof buf - 1 - got, 0);
            if (k <= 0)
                break;
            got += (size_t)k;
        }
        buf[got] = 0;
        cr_assert(strncmp(buf, "HTTP/1.1 200", 12) == 0 && strstr(buf, "\"ranks\""), "client %d: %.200s", i, buf);
        close(fds[i]);
    }
    /* The server still answers, and the job finishes its 400 steps with the slow clients still connected. */
    cJSON_Delete(get_status(j.port));
    int code = lu_exit_code(lu_wait(j.pid, 200));
    cr_assert_eq(code, 0, "the job did not finish with a slow client connected: %s", lu_slurp_tag(j.dir, "job", "err"));
    close(slow);
    close(slow2);

    /* The finished run's page from its files: fsdp-launch status LOG_DIR. */
    char logs[FSDP_PATH_MAX], out[FSDP_PATH_MAX], html[FSDP_PATH_MAX];
    snprintf(logs, sizeof logs, "%s/logs", j.dir);
    snprintf(out, sizeof out, "%s/status.json", j.dir);
    snprintf(html, sizeof html, "%s/status.html", j.dir);
    const char *sj[] = {LU_LAUNCH, "status", logs, "--json", "-o", out, NULL};
    cr_assert_eq(lu_exit_code(lu_wait(lu_spawn(sj, j.dir, "sj", NULL), 30)), 0, "%s", lu_slurp_tag(j.dir, "sj", "err"));
    char *text = tu_slurp(out);
    cJSON *o = cJSON_Parse(text);
    cr_assert(o, "fsdp-launch status --json: %s", text);
    cr_assert_str_eq(jstr(o, "run_id"), "abuse");
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(o, "live")));
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(o, "ranks")), 2);
    for (int r = 0; r < 2; r++) {
        const cJSON *x = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "ranks"), r);
        cr_assert_str_eq(jstr(x, "state"), "succeeded");
        cr_assert_eq(jnum(x, "step"), 400);
        cr_assert_gt(jnum(cJSON_GetObjectItemCaseSensitive(x, "memory"), "params"), 0);
    }
    const cJSON *hist = cJSON_GetObjectItemCaseSensitive(o, "history");
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(hist, "loss")), 400);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(hist, "val_loss")), 20);
    cJSON_Delete(o);
    free(text);
    const char *sh[] = {LU_LAUNCH, "status", logs, "-o", html, NULL};
    cr_assert_eq(lu_exit_code(lu_wait(lu_spawn(sh, j.dir, "sh", NULL), 30)), 0, "%s", lu_slurp_tag(j.dir, "sh", "err"));
    text = tu_slurp(html);
    cr_assert(strstr(text, "<table id=\"ranks\">") && strstr(text, "<svg id=\"plot-loss\"") && !strstr(text, "<script>"),
              "%s", text);
    free(text);
    const char *bad[] = {LU_LAUNCH, "status", j.dir, NULL}; /* not a log.dir */
    cr_assert_eq(lu_exit_code(lu_wait(lu_spawn(bad, j.dir, "bad", NULL), 30)), 1);
    char *err = lu_slurp_tag(j.dir, "bad", "err");
    cr_assert(strstr(err, "neither metrics.jsonl nor run_summary.rank<R>.json found"), "%s", err);
    free(err);
    lu_rm_rf(j.dir);
    free(j.dir);
}

Test(launch_status, a_stopped_rank_is_shown_stale, .timeout = 240)
{
    struct job j;
    job_start(&j, 100000, "stale", NULL, "1");
    cJSON *o = wait_running(&j, 2, 0, 120);
    int pid1 = (int)jnum(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "ranks"), 1), "pid");
    cJSON_Delete(o);
    cr_assert_gt(pid1, 0);
    kill(pid1, SIGSTOP);
    bool stale = false;
    double end = tu_now() + 20;
    while (!stale && tu_now() < end) {
        o = get_status(j.port);
        const cJSON *x = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "ranks"), 1);
        stale = strcmp(jstr(x, "state"), "stale") == 0 && jnum(x, "age_s") >= 1;
        cJSON_Delete(o);
        tu_nap(0.1);
    }
    int code;
    char *m = http_get(j.port, "/metrics", &code);
    kill(pid1, SIGCONT);
    cr_assert(stale, "rank 1 stopped but never shown stale");
    cr_assert(strstr(m, "fsdp_rank_state{run_id=\"stale\",rank=\"1\",state=\"stale\"} 1\n"), "%s", m);
    free(m);
    cJSON_Delete(wait_running(&j, 2, 0, 60)); /* running again once it moves */
    kill(j.pid, SIGTERM);
    job_finish(&j, 128 + SIGTERM);
}

/* chromium from PATH, or NULL. */
static char *find_chromium(void)
{
    const char *path = getenv("PATH");
    char *dup = strdup(path ? path : "/usr/bin:/bin");
    char *save = NULL;
    for (char *d = strtok_r(dup, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        char p[FSDP_PATH_MAX];
        snprintf(p, sizeof p, "%s/chromium", d);
        if (access(p, X_OK) == 0) {
            free(dup);
            return strdup(p);
        }
    }
    free(dup);
    return NULL;
}

/* A real browser loads the page during a run: its DOM after the page's own refreshes holds the rank table
 * and the loss plot, and a screenshot of it is a PNG of some size. */
Test(launch_status, headless_chromium_renders_the_page, .timeout = 240)
{
    char *chromium = find_chromium();
    if (!chromium)
        cr_skip_test("chromium not installed (apt-get install chromium): the browser test is skipped");
    struct job j;
    job_start(&j, 100000, "browser<b>", NULL, "30");
    cJSON_Delete(wait_running(&j, 25, 0, 120));
    char url[64], shot[FSDP_PATH_MAX], prof[FSDP_PATH_MAX + 32]; /* + 32: "--key=" and a path */
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", j.port);
    snprintf(shot, sizeof shot, "%s/shot.png", j.dir);
    snprintf(prof, sizeof prof, "--user-data-dir=%s/profile", j.dir);
    const char *dom[] = {chromium, "--headless", "--no-sandbox", "--disable-gpu", prof, "--virtual-time-budget=5000",
                         "--dump-dom", url, NULL};
    int code = lu_exit_code(lu_wait(lu_spawn(dom, j.dir, "dom", NULL), 90));
    char *html = lu_slurp_tag(j.dir, "dom", "out");
    cr_assert_eq(code, 0, "chromium --dump-dom: %s", lu_slurp_tag(j.dir, "dom", "err"));
    cr_assert(strstr(html, "<table id=\"ranks\">") && strstr(html, "id=\"plot-loss\"") && strstr(html, "<polyline"),
              "the browser's DOM has no rank table or loss plot: %s", html);
    cr_assert(strstr(html, "browser&lt;b&gt;") && !strstr(html, "browser<b>"), "run id not shown as text: %s", html);
    free(html);
    const char *ss[] = {chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", prof,
                        "--window-size=1300,820", "--virtual-time-budget=3000", NULL, url, NULL};
    char shot_opt[FSDP_PATH_MAX + 32]; /* + 32: "--key=" and a path */
    snprintf(shot_opt, sizeof shot_opt, "--screenshot=%s", shot);
    ss[8] = shot_opt;
    code = lu_exit_code(lu_wait(lu_spawn(ss, j.dir, "shot", NULL), 90));
    cr_assert_eq(code, 0, "chromium --screenshot: %s", lu_slurp_tag(j.dir, "shot", "err"));
    char *png = tu_slurp(shot);
    cr_assert(png && memcmp(png, "\x89PNG", 4) == 0, "no PNG screenshot at %s", shot);
    free(png);
    struct stat st;
    cr_assert(stat(shot, &st) == 0 && st.st_size > 10000, "screenshot too small to show the page");
    free(chromium);
    kill(j.pid, SIGTERM);
    job_finish(&j, 128 + SIGTERM);
}

Test(launch_status, non_loopback_address_needs_a_token, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--nnodes", "2", "--node_rank", "0", "--master_port", "0",
                          "--status_port", "0", "--status_addr", "0.0.0.0", LU_PROBE, NULL};
    const char *env[] = {"FSDP_RDZV_TOKEN=", NULL};
    int code = lu_exit_code(lu_wait(lu_spawn(argv, dir, "t", env), 30));
    char *err = lu_slurp_tag(dir, "t", "err");
    cr_assert_eq(code, 1, "%s", err);
    cr_assert(strstr(err, "--status_addr 0.0.0.0") && strstr(err, "FSDP_RDZV_TOKEN"), "%s", err);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

/* One node without FSDP_RDZV_TOKEN or a secret file runs with a random store secret nobody knows: a page
 * on 0.0.0.0 would then start and answer every other host 401 forever. docs/launcher.md says it is refused
 * at start; it used to start. */
Test(launch_status, one_node_without_a_user_token_refuses_a_public_address, .timeout = 60)
{
    char *dir = lu_tmpdir();
    char xdg[FSDP_PATH_MAX], home[FSDP_PATH_MAX];
    snprintf(xdg, sizeof xdg, "XDG_CONFIG_HOME=%s", dir);
    snprintf(home, sizeof home, "HOME=%s", dir);
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "1", "--status_port", "0",
                          "--status_addr", "0.0.0.0", "/bin/true", NULL};
    const char *env[] = {"FSDP_RDZV_TOKEN=", "FSDP_RDZV_TOKEN_FILE=", xdg, home, NULL}; /* no secret file there */
    int code = lu_exit_code(lu_wait(lu_spawn(argv, dir, "t", env), 30));
    char *err = lu_slurp_tag(dir, "t", "err");
    cr_assert_eq(code, 1, "%s", err);
    cr_assert(strstr(err, "--status_addr 0.0.0.0: a status page reachable from other hosts needs the job's token"),
              "%s", err);
    cr_assert_null(strstr(err, "status page on http://"), "the page started: %s", err);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

/* True when the n bytes at s are well-formed UTF-8 (the rules of RFC 3629). */
static bool utf8_ok(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80                   ? 1
                     : c >= 0xC2 && c <= 0xDF ? 2
                     : c >= 0xE0 && c <= 0xEF ? 3
                     : c >= 0xF0 && c <= 0xF4 ? 4
                                              : 0;
        if (len == 0 || i + len > n)
            return false;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) || (c == 0xF0 && s[i + 1] < 0x90) ||
            (c == 0xF4 && s[i + 1] > 0x8F))
            return false;
        i += len;
    }
    return true;
}

/* A rank whose stderr holds bytes that are not UTF-8 (here 0xFF 0xFE, a truncated sequence and a
 * surrogate) fails, the job restarts: /api/status carries the previous attempt's root cause with that tail,
 * which must be UTF-8 JSON with U+FFFD in place of the bad bytes (they went in raw). And HEAD gets GET's
 * headers without a body (it got the body). */
Test(launch_status, head_has_no_body_and_invalid_utf8_is_replaced, .timeout = 120)
{
    char *dir = lu_tmpdir();
    const char *script = "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then "
                         "printf 'bad \\377\\376 bytes \\303 and \\355\\240\\200 end\\n' >&2; exit 1; fi; sleep 60";
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "1", "--max_restarts", "1",
                          "--status_port", "0", "/bin/sh", "-c", script, NULL};
    struct job j = {.dir = dir};
    j.pid = lu_spawn(argv, dir, "job", NULL);
    j.port = -1;
    double end = tu_now() + 60;
    const char *mark = "fsdp-launch: status page on http://127.0.0.1:";
    while (j.port < 0 && tu_now() < end) {
        char *s = lu_slurp_tag(dir, "job", "err");
        char *at = strstr(s, mark);
        if (at && strchr(at, '\n'))
            j.port = atoi(at + strlen(mark));
        free(s);
        if (j.port < 0)
            tu_nap(0.02);
    }
    cr_assert_gt(j.port, 0, "no status page address printed: %s", lu_slurp_tag(dir, "job", "err"));
    cJSON *o = NULL;
    char *raw = NULL;
    end = tu_now() + 60;
    while (tu_now() < end) {
        int code;
        raw = http_get(j.port, "/api/status", &code);
        cr_assert_eq(code, 200, "%s", raw);
        o = cJSON_Parse(raw);
        if (o && cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(o, "previous_failure")))
            break;
        cJSON_Delete(o);
        o = NULL;
        free(raw);
        raw = NULL;
        tu_nap(0.1);
    }
    cr_assert_not_null(o, "no previous_failure in /api/status: %s", lu_slurp_tag(dir, "job", "err"));
    cr_assert(utf8_ok((const unsigned char *)raw, strlen(raw)), "/api/status is not UTF-8: %s", raw);
    const char *tail = jstr(cJSON_GetObjectItemCaseSensitive(o, "previous_failure"), "stderr_tail");
#define FFFD "\xEF\xBF\xBD"
    cr_assert(strstr(tail, "bad " FFFD FFFD " bytes " FFFD " and " FFFD FFFD FFFD " end"), "stderr_tail: %s", tail);
#undef FFFD
    cJSON_Delete(o);
    free(raw);
    /* the page (HTML) is UTF-8 too */
    int code;
    char *page = http_get(j.port, "/", &code);
    cr_assert_eq(code, 200);
    cr_assert(utf8_ok((const unsigned char *)page, strlen(page)), "the page is not UTF-8");
    size_t page_len = strlen(page);
    free(page);
    /* HEAD: status and headers, Content-Length of what GET sends, no body */
    const char *paths[] = {"/api/status", "/metrics", "/nowhere"};
    for (int i = 0; i < 3; i++) {
        char req[256];
        int n = snprintf(req, sizeof req, "HEAD %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", paths[i]);
        char *r = http_raw(j.port, req, (size_t)n, 10);
        cr_assert(strncmp(r, "HTTP/1.1 ", 9) == 0, "HEAD %s: %s", paths[i], r);
        char *body = strstr(r, "\r\n\r\n");
        cr_assert_not_null(body, "HEAD %s: no end of headers: %s", paths[i], r);
        cr_assert_eq(body[4], '\0', "HEAD %s got a body: %s", paths[i], body + 4);
        cr_assert(strcasestr(r, "Content-Length:"), "HEAD %s: no Content-Length: %s", paths[i], r);
        free(r);
    }
    char req[256];
    int n = snprintf(req, sizeof req, "HEAD / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    char *r = http_raw(j.port, req, (size_t)n, 10);
    char *cl = strcasestr(r, "Content-Length:");
    cr_assert_not_null(cl, "%s", r);
    long got = atol(cl + strlen("Content-Length:"));
    cr_assert(got > 1000 && labs(got - (long)page_len) < 200, "HEAD / Content-Length %ld, GET / sent %zu bytes", got,
              page_len);
    free(r);
    kill(j.pid, SIGTERM);
    lu_wait(j.pid, 30);
    lu_rm_rf(dir);
    free(dir);
}

/* The launcher out of descriptors (open-files limit 40, 40 idle clients): accept() fails until a client
 * leaves. libevent retried at once and logged every failure ("Error from accept() call": millions of lines,
 * a core spinning); the page now pauses its listener 0.25 s at a time and warns at most once a second, and
 * serves again once descriptors are back. */
Test(launch_status, out_of_descriptors_backs_off_and_warns_once_a_second, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {"/bin/sh", "-c", "ulimit -n 40 && exec \"$0\" \"$@\"", LU_LAUNCH, "--standalone",
                          "--nproc_per_node", "1", "--status_port", "0", LU_PROBE, "sleep", dir, NULL};
    pid_t pid = lu_spawn(argv, dir, "job", NULL);
    int port = -1;
    double end = tu_now() + 30;
    const char *mark = "fsdp-launch: status page on http://127.0.0.1:";
    while (port < 0 && tu_now() < end) {
        char *s = lu_slurp_tag(dir, "job", "err");
        char *at = strstr(s, mark);
        if (at && strchr(at, '\n'))
            port = atoi(at + strlen(mark));
        free(s);
        if (port < 0)
            tu_nap(0.02);
    }
    cr_assert_gt(port, 0, "no status page address printed: %s", lu_slurp_tag(dir, "job", "err"));
    int fds[40];
    for (int i = 0; i < 40; i++)
        fds[i] = connect_to(port); /* the backlog takes them all; the launcher accepts what it can */
    tu_nap(2.5);
    char *err = lu_slurp_tag(dir, "job", "err");
    int warned = 0, raw = 0;
    for (const char *p = err; (p = strstr(p, "accept failed")); p++)
        warned++;
    for (const char *p = err; (p = strstr(p, "Error from accept")); p++)
        raw++;
    cr_assert(lu_pid_alive(pid), "the launcher died out of descriptors: %s", err);
    cr_assert(warned >= 1 && warned <= 4 && raw == 0, "%d warnings (%d from libevent) in 2.5 s:\n%.3000s", warned,
              raw, err);
    free(err);
    for (int i = 0; i < 40; i++)
        close(fds[i]);
    /* descriptors back: served again (within the pause) */
    end = tu_now() + 10;
    int code = -1;
    while (code != 200 && tu_now() < end) {
        char *b = http_get(port, "/api/status", &code);
        free(b);
        if (code != 200)
            tu_nap(0.1);
    }
    cr_assert_eq(code, 200, "the page did not serve again once descriptors were free");
    kill(pid, SIGTERM);
    lu_wait(pid, 30);
    lu_rm_rf(dir);
    free(dir);
}

/* ---- the page's connection cap and request deadline (docs/launcher.md) ---- */

/* The launcher of the test below, stopped by its .fini even when an assertion ends the test early. */
static pid_t g_sleeping = -1;

static void stop_sleeping_job(void)
{
    if (g_sleeping > 0 && lu_pid_alive(g_sleeping)) {
        kill(g_sleeping, SIGTERM);
        lu_wait(g_sleeping, 30);
    }
    g_sleeping = -1;
}

/* fsdp-launch with a status page and one rank that sleeps; returns the page's port. */
static int sleeping_job(const char *dir, pid_t *pid)
{
    const char *argv[] = {LU_LAUNCH, "--standalone", "--nproc_per_node", "1", "--status_port", "0", LU_PROBE,
                          "sleep", dir, NULL};
    *pid = g_sleeping = lu_spawn(argv, dir, "job", NULL);
    int port = -1;
    double end = tu_now() + 30;
    const char *mark = "fsdp-launch: status page on http://127.0.0.1:";
    while (port < 0 && tu_now() < end) {
        char *s = lu_slurp_tag(dir, "job", "err");
        char *at = strstr(s, mark);
        if (at && strchr(at, '\n'))
            port = atoi(at + strlen(mark));
        free(s);
        if (port < 0)
            tu_nap(0.02);
    }
    cr_assert_gt(port, 0, "no status page address printed: %s", lu_slurp_tag(dir, "job", "err"));
    return port;
}

/* Whether the server closed fd (EOF or reset); reads and drops whatever else came. */
static bool peer_closed(int fd)
{
    char buf[4096];
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 0) <= 0)
            return false;
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n <= 0)
            return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    }
}

/* One whole response on a kept-alive connection (headers, then Content-Length bytes); its status code, or
 * -1 when none came within timeout_s. */
static int read_response(int fd, double timeout_s)
{
    char buf[1 << 16];
    size_t got = 0;
    double end = tu_now() + timeout_s;
    while (tu_now() < end && got < sizeof buf - 1) {
        buf[got] = 0;
        char *eoh = strstr(buf, "\r\n\r\n");
        if (eoh) {
            char *cl = strcasestr(buf, "Content-Length:");
            size_t want = (size_t)(eoh + 4 - buf) + (cl && cl < eoh ? (size_t)atol(cl + 15) : 0);
            if (got >= want)
                return strncmp(buf, "HTTP/1.", 7) == 0 ? atoi(buf + 9) : -1;
        }
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return -1;
}

/* Slowloris: a client that sends its headers a byte every 0.5 s, and one that sends nothing, are both
 * dropped about 5 s after they connect (REQUEST_TIMEOUT_S), while a kept-alive client asking every second
 * stays. evhttp's own 10 s timeout restarted at each byte: the trickling client was held forever and the
 * silent one for 10 s. */
Test(launch_status, slowloris_and_silent_clients_are_dropped_within_the_request_timeout, .timeout = 60,
     .fini = stop_sleeping_job)
{
    char *dir = lu_tmpdir();
    pid_t pid;
    int port = sleeping_job(dir, &pid);
    int silent = connect_to(port), slow = connect_to(port), kept = connect_to(port);
    double t0 = tu_now(), silent_at = -1, slow_at = -1;
    const char *start = "GET /api/status HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    cr_assert_gt(send(slow, start, strlen(start), MSG_NOSIGNAL), 0);
    const char *req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    int answered = 0;
    for (int tick = 0; tick < 24 && (silent_at < 0 || slow_at < 0); tick++) { /* 12 s at most */
        if (slow_at < 0)
            send(slow, "a", 1, MSG_NOSIGNAL);
        if (tick % 2 == 0 && tu_now() - t0 < 8) {
            cr_assert_eq(send(kept, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req),
                         "the kept-alive client was dropped after %.1f s", tu_now() - t0);
            cr_assert_eq(read_response(kept, 3), 200, "the kept-alive client got no answer after %.1f s",
                         tu_now() - t0);
            answered++;
        }
        tu_nap(0.5);
        if (silent_at < 0 && peer_closed(silent))
            silent_at = tu_now() - t0;
        if (slow_at < 0 && peer_closed(slow))
            slow_at = tu_now() - t0;
    }
    cr_assert(silent_at >= 3 && silent_at < 8, "the silent client was dropped after %.1f s (-1: never)", silent_at);
    cr_assert(slow_at >= 3 && slow_at < 8, "the trickling client was dropped after %.1f s (-1: never)", slow_at);
    cr_assert_geq(answered, 4);
    close(silent);
    close(slow);
    close(kept);
    int code;
    free(http_get(port, "/api/status", &code));
    cr_assert_eq(code, 200, "the page stopped serving");
    stop_sleeping_job();
    lu_rm_rf(dir);
    free(dir);
}

/* 128 idle connections (the cap) pause the listener: the 129th client waits, with one line in the log, and
 * is answered as soon as one of them closes. Then two seconds of churn at the cap (one closed and one
 * opened every 10 ms) log it at most once a second. Without a cap every client was accepted and held. */
Test(launch_status, connections_past_the_cap_wait_and_the_cap_is_logged_once_a_second, .timeout = 60,
     .fini = stop_sleeping_job)
{
    char *dir = lu_tmpdir();
    pid_t pid;
    int port = sleeping_job(dir, &pid);
    enum { CAP = 128 };
    static const char line[] = "status page: 128 connections open, the most it serves at once";
    int idle[CAP];
    double t0 = tu_now();
    for (int i = 0; i < CAP; i++)
        idle[i] = connect_to(port);
    int late = connect_to(port);
    const char *req = "GET /api/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    cr_assert_eq(send(late, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    struct pollfd pf = {.fd = late, .events = POLLIN};
    int early = poll(&pf, 1, 1000);
    char *err = lu_slurp_tag(dir, "job", "err");
    cr_assert_lt(tu_now() - t0, 4, "too slow to test before the idle connections time out");
    cr_assert_eq(early, 0, "the client past the cap was answered at once");
    int lines = 0;
    for (const char *p = err; (p = strstr(p, line)); p++)
        lines++;
    cr_assert_eq(lines, 1, "%d cap lines:\n%.3000s", lines, err);
    free(err);
    close(idle[0]);
    cr_assert_eq(read_response(late, 3), 200, "the waiting client was not answered once a connection closed");
    close(late);
    /* churn at the cap */
    double c0 = tu_now();
    for (int i = 1; i < CAP && tu_now() - c0 < 2; i++) {
        close(idle[i]);
        idle[i] = connect_to(port);
        tu_nap(0.01);
    }
    double took = tu_now() - t0;
    err = lu_slurp_tag(dir, "job", "err");
    lines = 0;
    for (const char *p = err; (p = strstr(p, line)); p++)
        lines++;
    cr_assert(lines >= 1 && lines <= (int)took + 1, "%d cap lines in %.1f s:\n%.3000s", lines, took, err);
    free(err);
    for (int i = 1; i < CAP; i++)
        close(idle[i]);
    int code = -1;
    double end = tu_now() + 10;
    while (code != 200 && tu_now() < end) {
        free(http_get(port, "/api/status", &code));
        if (code != 200)
            tu_nap(0.1);
    }
    cr_assert_eq(code, 200, "the page did not serve again once the idle connections left");
    stop_sleeping_job();
    lu_rm_rf(dir);
    free(dir);
}

/* ---- clients of other hosts: the page's own token, never the store secret (docs/launcher.md) ---- */

/* A GET from a forked child (no cr_*): the status code, or -1 when no answer came within 10 s. */
static int child_get(const char *addr, int port, const char *path, const char *bearer)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (fd < 0 || inet_pton(AF_INET, addr, &a.sin_addr) != 1 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        return -1;
    char req[1024];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s\r\n%s%s%sConnection: close\r\n\r\n", path,
                     addr, bearer ? "Authorization: Bearer " : "", bearer ? bearer : "", bearer ? "\r\n" : "");
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n)
        return -1;
    char buf[64] = "";
    size_t got = 0;
    double end = tu_now() + 10;
    while (got < 12 && tu_now() < end) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = 0;
    return strncmp(buf, "HTTP/1.", 7) == 0 ? atoi(buf + 9) : -1;
}

Test(launch_status, other_hosts_need_the_page_token_never_the_store_secret, .timeout = 90)
{
    struct tu_netns_pair np;
    if (tu_netns_pair_make(&np, 's', 214) != 0)
        cr_skip_test("cannot create network namespaces and a veth pair here (needs root and iproute2)");
    char *dir = lu_tmpdir();
    const char *secret = "s3cret-of-the-store";
    const char *argv[] = {"/usr/bin/ip", "netns", "exec", np.ns[0], LU_LAUNCH, "--standalone", "--nproc_per_node",
                          "1", "--status_port", "0", "--status_addr", "0.0.0.0", "--run_id", "tokjob", LU_PROBE,
                          "sleep", dir, NULL};
    const char *env[] = {"FSDP_RDZV_TOKEN=s3cret-of-the-store", NULL};
    g_sleeping = lu_spawn(argv, dir, "job", env);
    const char *mark = "fsdp-launch: status page on http://0.0.0.0:";
    int port = -1;
    char token[128] = "";
    double end = tu_now() + 30;
    while (port < 0 && tu_now() < end) {
        char *s = lu_slurp_tag(dir, "job", "err");
        char *at = strstr(s, mark), *t = at ? strstr(at, "/?token=") : NULL;
        if (at && t && strchr(at, '\n')) {
            port = atoi(at + strlen(mark));
            snprintf(token, sizeof token, "%.*s", (int)strcspn(t + 8, " \n"), t + 8);
        }
        free(s);
        if (port < 0)
            tu_nap(0.02);
    }
    char *err = lu_slurp_tag(dir, "job", "err");
    if (port < 0) {
        stop_sleeping_job();
        tu_netns_pair_remove(&np);
        cr_assert_fail("no status page address with a token printed: %s", err);
    }
    cr_assert_null(strstr(err, secret), "the launcher printed the store secret: %s", err);
    cr_assert_eq(strlen(token), 64, "token %s", token);
    char bad[128];
    snprintf(bad, sizeof bad, "%.63s0", token);
    if (strcmp(bad, token) == 0)
        bad[62] = bad[62] == '0' ? '1' : '0';
    /* the asks, each from the other namespace (so not loopback), and the codes they must get */
    char q_tok[256], q_secret[256], q_bad[256], page[256];
    snprintf(q_tok, sizeof q_tok, "/api/status?token=%s", token);
    snprintf(q_secret, sizeof q_secret, "/api/status?token=%s", secret);
    snprintf(q_bad, sizeof q_bad, "/api/status?token=%s", bad);
    snprintf(page, sizeof page, "/?token=%s", token);
    struct ask {
        const char *path, *bearer;
        int want;
    } asks[] = {{"/api/status", NULL, 401},   {q_secret, NULL, 401},     {"/metrics", secret, 401},
                {q_bad, NULL, 401},           {"/api/status", bad, 401}, {q_tok, NULL, 200},
                {"/api/status", token, 200},  {"/metrics", token, 200},  {page, NULL, 200}};
    enum { NASK = sizeof asks / sizeof asks[0] };
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t c = fork();
    cr_assert(c >= 0);
    if (c == 0) {
        int codes[NASK];
        bool in = tu_netns_enter(np.ns[1]) == 0;
        for (int i = 0; i < NASK; i++)
            codes[i] = in ? child_get(np.addr[0], port, asks[i].path, asks[i].bearer) : -2;
        ssize_t w = write(fds[1], codes, sizeof codes);
        _exit(w == (ssize_t)sizeof codes ? 0 : 1);
    }
    close(fds[1]);
    int codes[NASK];
    ssize_t got = read(fds[0], codes, sizeof codes);
    close(fds[0]);
    lu_wait(c, 30);
    stop_sleeping_job();
    tu_netns_pair_remove(&np);
    cr_assert_eq(got, (ssize_t)sizeof codes, "the client in the other namespace gave no answers");
    for (int i = 0; i < NASK; i++)
        cr_expect_eq(codes[i], asks[i].want, "GET %s%s%s answered %d, not %d", asks[i].path,
                     asks[i].bearer ? " with Bearer " : "", asks[i].bearer ? asks[i].bearer : "", codes[i],
                     asks[i].want);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

/* ---- a rank whose heartbeat stops while its process lives (docs/launcher.md, "Ranks' heartbeats") ---- */

/* SIGSTOPs rank 1 once both ranks run; returns the /api/status snapshot once the job has restarted (its
 * previous_failure is the root cause), with *took_s the seconds from the stop to that. */
static cJSON *stop_rank1_until_restart(struct job *j, double limit_s, double *took_s)
{
    cJSON *o = wait_running(j, 2, 0, 120);
    int pid1 = (int)jnum(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "ranks"), 1), "pid");
    cJSON_Delete(o);
    cr_assert_gt(pid1, 0);
    double t0 = tu_now();
    kill(pid1, SIGSTOP);
    while (tu_now() < t0 + limit_s) {
        o = get_status(j->port);
        if (jnum(o, "restarts") >= 1 && cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(o, "previous_failure"))) {
            *took_s = tu_now() - t0;
            cr_assert(!lu_pid_alive(pid1), "the stopped rank (pid %d) outlived its attempt", pid1);
            return o;
        }
        cJSON_Delete(o);
        tu_nap(0.1);
    }
    kill(pid1, SIGCONT);
    cr_assert_fail("rank 1 stopped %.0f s ago and the job did not restart: %s", limit_s,
                   lu_slurp_tag(j->dir, "job", "err"));
    return NULL;
}

static void expect_rank1_named(const cJSON *o, const struct job *j)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "previous_failure");
    char *text = cJSON_PrintUnformatted(f);
    cr_expect_eq(jnum(f, "rank"), 1, "root cause %s\n%s", text, lu_slurp_tag(j->dir, "job", "err"));
    cr_expect_eq(jnum(f, "node"), 0, "%s", text);
    cr_expect_str_eq(jstr(f, "reason"), "rank stopped sending heartbeats", "%s", text);
    cr_expect(strstr(jstr(f, "status"), "stopped by a signal"), "%s", text);
    cr_expect_geq(jnum(f, "heartbeat_age_s"), 2, "%s", text);
    const cJSON *r1 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "ranks"), 1);
    cr_expect(strncmp(jstr(r1, "previous_exit"), "no heartbeat for ", 17) == 0, "rank 1's previous_exit: %s",
              jstr(r1, "previous_exit"));
    free(text);
}

Test(launch_status, a_sigstopped_rank_is_named_within_the_heartbeat_timeout, .timeout = 240)
{
    struct job j;
    const char *env[] = {"FSDP_HEARTBEAT_TIMEOUT=3", NULL};
    job_start(&j, 100000, "hbstop", env, "30");
    double took = 0;
    cJSON *o = stop_rank1_until_restart(&j, 30, &took);
    /* silence counts from the last beat, up to 0.5 s before the stop */
    cr_expect_geq(took, 2.4, "declared before the 3 s heartbeat timeout: %.2f s", took);
    expect_rank1_named(o, &j);
    cJSON_Delete(o);
    kill(j.pid, SIGTERM);
    job_finish(&j, 128 + SIGTERM);
}

/* With the collectives' timeout (5 s) shorter than the heartbeat timeout (60 s), rank 0 fails first, on its
 * timeout waiting for rank 1: the root cause is still rank 1, whose heartbeat stopped. */
Test(launch_status, a_peer_timing_out_on_a_stopped_rank_names_the_stopped_one, .timeout = 240)
{
    struct job j;
    const char *env[] = {"FSDP_HEARTBEAT_TIMEOUT=60", "FSDP_COMM_TIMEOUT_S=5", NULL};
    job_start(&j, 100000, "hbpeer", env, "30");
    double took = 0;
    cJSON *o = stop_rank1_until_restart(&j, 45, &took);
    cr_expect_lt(took, 40, "named by the heartbeat timeout (60 s) rather than at rank 0's failure: %.1f s", took);
    expect_rank1_named(o, &j);
    cJSON_Delete(o);
    kill(j.pid, SIGTERM);
    job_finish(&j, 128 + SIGTERM);
}
