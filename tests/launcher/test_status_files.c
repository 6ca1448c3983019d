/* `fsdp-launch status LOG_DIR` (launcher/status_files.c) on hand-made log directories: a run summary of a
 * rank >= 64 carrying the run id (it was freed before use), a metrics.jsonl too large for a quadratic reader,
 * and a FIFO in place of metrics.jsonl or a run summary (it hung the reader). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/error.h"
#include "launcher/status_files.h"
#include "launcher/status_render.h"
#include "tests/util/launch_util.h"

static void write_summary(const char *dir, int rank, const char *json)
{
    char path[FSDP_PATH_MAX];
    snprintf(path, sizeof path, "%s/run_summary.rank%d.json", dir, rank);
    lu_write_text(path, json);
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double jnum(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* The run id comes from the first summary that has one; here that is rank 70's, whose cJSON tree the
 * reader used to delete before copying the string (ASan: heap-use-after-free; without ASan the allocator's
 * free-list pointer overwrote the first bytes of the id). */
Test(status_files, run_id_from_a_rank_above_63)
{
    char *dir = lu_tmpdir();
    write_summary(dir, 0, "{\"world_size\": 72, \"steps\": {\"first\": 0, \"run\": 5, \"max_steps\": 5}}");
    write_summary(dir, 70, "{\"world_size\": 72, \"run_id\": \"a-run-id-long-enough-to-be-clobbered\","
                           " \"steps\": {\"first\": 0, \"run\": 5, \"max_steps\": 5}}");
    cJSON *snap = status_files_snapshot(dir);
    cr_assert(snap, "%s", error_message());
    cr_assert_str_eq(jstr(snap, "run_id"), "a-run-id-long-enough-to-be-clobbered");
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(snap, "ranks");
    cr_assert_eq(cJSON_GetArraySize(ranks), 72);
    cr_assert_str_eq(jstr(cJSON_GetArrayItem(ranks, 70), "state"), "succeeded");
    cr_assert_str_eq(jstr(cJSON_GetArrayItem(ranks, 1), "state"), "unknown");
    cJSON_Delete(snap);
    lu_rm_rf(dir);
    free(dir);
}

/* 300,000 steps (with a restart in the middle repeating steps, a val_loss every 100 steps and a few lines
 * that are not records): the reader used to thin its curves by deleting from a linked list by index, which
 * took minutes. Bounded by the test's timeout, not timed. */
Test(status_files, a_large_metrics_file_renders, .timeout = 120)
{
    char *dir = lu_tmpdir();
    char path[FSDP_PATH_MAX];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    const int n = 300000;
    for (int i = 0; i < n; i++) {
        if (i % 100 == 99)
            fprintf(f, "{\"step\":%d,\"loss\":%.4f,\"lr\":0.0003,\"grad_norm\":1.25,\"tokens_per_s\":%d,"
                       "\"val_loss\":%.4f}\n", i, 5.0 - i * 1e-5, 1000 + i % 7, 5.5 - i * 1e-5);
        else
            fprintf(f, "{\"step\":%d,\"loss\":%.4f,\"lr\":0.0003,\"grad_norm\":1.25,\"tokens_per_s\":%d}\n", i,
                    5.0 - i * 1e-5, 1000 + i % 7);
        if (i == 1000)
            fputs("not json\n\n{\"step\": \"x\"}\n", f);
    }
    fclose(f);
    write_summary(dir, 0, "{\"world_size\": 1, \"run_id\": \"big\", \"steps\": {\"first\": 0, \"run\": 300000,"
                          " \"max_steps\": 300000}}");
    cJSON *snap = status_files_snapshot(dir);
    cr_assert(snap, "%s", error_message());
    cr_assert_eq(jnum(snap, "last_logged_step"), n);
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(snap, "history");
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(h, "loss");
    const cJSON *val = cJSON_GetObjectItemCaseSensitive(h, "val_loss");
    int nl = cJSON_GetArraySize(loss), nv = cJSON_GetArraySize(val);
    cr_assert(nl > 1000 && nl <= 2048, "%d loss points", nl);
    cr_assert(nv > 1000 && nv <= 2048, "%d val_loss points", nv);
    /* the first point and the last are kept */
    cr_assert_eq(cJSON_GetArrayItem(cJSON_GetArrayItem(loss, 0), 0)->valuedouble, 1);
    cr_assert_eq(cJSON_GetArrayItem(cJSON_GetArrayItem(loss, nl - 1), 0)->valuedouble, n);
    cr_assert_eq(cJSON_GetArrayItem(cJSON_GetArrayItem(val, nv - 1), 0)->valuedouble, n);
    cr_assert_eq(jnum(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(snap, "ranks"), 0), "tokens_per_s"),
                 1000 + (n - 1) % 7);
    char *html = status_render_html(snap, false, false);
    cr_assert(html && strstr(html, "id=\"plot-loss\"") && strstr(html, "<polyline"), "no plot in the page");
    free(html);
    cJSON_Delete(snap);
    lu_rm_rf(dir);
    free(dir);
}

/* Points of few lines are all kept, in file order, and the curves skip missing values. */
Test(status_files, small_metrics_file_keeps_every_point)
{
    char *dir = lu_tmpdir();
    char path[FSDP_PATH_MAX];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    lu_write_text(path, "{\"step\":0,\"loss\":4,\"tokens_per_s\":10}\n"
                        "{\"step\":1,\"loss\":3.5,\"tokens_per_s\":null,\"val_loss\":3.75}\n"
                        "{\"step\":2,\"loss\":3}"); /* no final newline: a rank killed mid-write */
    cJSON *snap = status_files_snapshot(dir);
    cr_assert(snap, "%s", error_message());
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(snap, "history");
    char *loss = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(h, "loss"));
    char *val = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(h, "val_loss"));
    char *tps = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(h, "tokens_per_s"));
    cr_assert_str_eq(loss, "[[1,4],[2,3.5],[3,3]]");
    cr_assert_str_eq(val, "[[2,3.75]]");
    cr_assert_str_eq(tps, "[[1,10]]");
    cr_assert_eq(jnum(snap, "last_logged_step"), 3);
    free(loss);
    free(val);
    free(tps);
    cJSON_Delete(snap);
    lu_rm_rf(dir);
    free(dir);
}

/* A FIFO with no writer blocks open(2) and read(2) forever: run in a child with a deadline. */
static void expect_fifo_refused(const char *name)
{
    char *dir = lu_tmpdir();
    char path[FSDP_PATH_MAX];
    write_summary(dir, 0,
                  "{\"world_size\": 1, \"run_id\": \"r\", \"steps\": {\"first\": 0, \"run\": 1, \"max_steps\": 1}}");
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
    cr_assert_eq(mkfifo(path, 0644), 0, "mkfifo: %s", strerror(errno));
    int pipefd[2];
    cr_assert_eq(pipe(pipefd), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(pipefd[0]);
        cJSON *snap = status_files_snapshot(dir);
        const char *msg = snap ? "" : error_message();
        ssize_t w = write(pipefd[1], msg, strlen(msg));
        (void)w;
        _exit(snap ? 3 : 0);
    }
    close(pipefd[1]);
    int st = lu_wait(pid, 10);
    char msg[2048] = {0};
    ssize_t got = read(pipefd[0], msg, sizeof msg - 1);
    (void)got;
    close(pipefd[0]);
    cr_assert(WIFEXITED(st), "the reader hung on the FIFO %s", path);
    cr_assert_eq(WEXITSTATUS(st), 0, "a FIFO as %s was read as a file", name);
    cr_assert(strstr(msg, name) && strstr(msg, "not a regular file"), "message: %s", msg);
    lu_rm_rf(dir);
    free(dir);
}

Test(status_files, fifo_as_metrics_is_refused, .timeout = 30)
{
    expect_fifo_refused("metrics.jsonl");
}

Test(status_files, fifo_as_run_summary_is_refused, .timeout = 30)
{
    expect_fifo_refused("run_summary.rank0.json");
}
