/* `fsdp-launch status DIR`: the status page from a run's files (status_files.h). */
#include "launcher/status_files.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "launcher/status_render.h"

#define MAX_RANKS 65536
#define HISTORY_CAP 2048

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (len + 1 >= cap) {
            char *p = realloc(buf, cap *= 2);
            if (!p) {
                free(buf);
                buf = NULL;
            }
            buf = p;
        }
    }
    fclose(f);
    if (buf)
        buf[len] = 0;
    return buf;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static void add_num(cJSON *o, const char *k, double v)
{
    if (isfinite(v))
        cJSON_AddNumberToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

static void push_point(cJSON *arr, double x, double y)
{
    if (!isfinite(x) || !isfinite(y))
        return;
    double p[2] = {x, y};
    cJSON_AddItemToArray(arr, cJSON_CreateDoubleArray(p, 2));
}

/* Keeps at most HISTORY_CAP points of a curve (every k-th, the last always kept). */
static void thin(cJSON *arr)
{
    int n = cJSON_GetArraySize(arr);
    if (n <= HISTORY_CAP)
        return;
    int k = (n + HISTORY_CAP - 1) / HISTORY_CAP;
    for (int i = n - 2; i >= 0; i--)
        if (i % k)
            cJSON_DeleteItemFromArray(arr, i);
}

cJSON *status_files_snapshot(const char *dir)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    char *metrics = slurp(path);
    cJSON *o = cJSON_CreateObject();
    cJSON *ranks = cJSON_CreateArray();
    cJSON *h = cJSON_CreateObject();
    cJSON *loss = cJSON_CreateArray(), *val = cJSON_CreateArray(), *tps = cJSON_CreateArray();
    if (!o || !ranks || !h || !loss || !val || !tps) {
        error_set(FSDP_ENOMEM, "out of memory reading %s", dir);
        goto fail;
    }
    double last_tps = NAN, last_step = NAN;
    for (char *line = metrics; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        cJSON *m = cJSON_Parse(line);
        if (m) {
            double s = num(m, "step") + 1; /* metrics.jsonl counts from 0; the page counts steps done */
            push_point(loss, s, num(m, "loss"));
            push_point(val, s, num(m, "val_loss"));
            push_point(tps, s, num(m, "tokens_per_s"));
            if (isfinite(num(m, "tokens_per_s")))
                last_tps = num(m, "tokens_per_s");
            last_step = s;
            cJSON_Delete(m);
        }
        line = nl ? nl + 1 : NULL;
    }
    thin(loss);
    thin(val);
    thin(tps);
    const char *run_id = "";
    double world = NAN, restarts = 0;
    int found = 0;
    cJSON *summaries[64] = {0};
    for (int r = 0; r < MAX_RANKS; r++) {
        snprintf(path, sizeof path, "%s/run_summary.rank%d.json", dir, r);
        char *text = slurp(path);
        if (!text && (r >= world || (isnan(world) && r > 0)))
            break;
        cJSON *s = text ? cJSON_Parse(text) : NULL;
        free(text);
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "rank", r);
        if (!s) {
            cJSON_AddStringToObject(x, "state", "unknown");
            cJSON_AddStringToObject(x, "exit", "no run summary: the rank did not finish");
            cJSON_AddItemToArray(ranks, x);
            continue;
        }
        found++;
        if (isnan(world))
            world = num(s, "world_size");
        const cJSON *rid = cJSON_GetObjectItemCaseSensitive(s, "run_id");
        if (r < 64)
            summaries[r] = s; /* keeps run_id's string alive */
        if (cJSON_IsString(rid) && !*run_id)
            run_id = rid->valuestring;
        restarts = fmax(restarts, num(s, "restart_count"));
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(s, "steps");
        cJSON_AddStringToObject(x, "host", "");
        cJSON_AddNumberToObject(x, "step", num(st, "first") + num(st, "run"));
        cJSON_AddNumberToObject(x, "max_steps", num(st, "max_steps"));
        add_num(x, "loss", num(s, "final_loss"));
        add_num(x, "val_loss", num(s, "final_val_loss"));
        add_num(x, "tokens_per_s", last_tps);
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(s, "mfu_terms");
        double peak = num(mt, "peak_flops"), fpt = num(mt, "flops_per_token");
        add_num(x, "mfu", peak > 0 && isfinite(world) ? last_tps * fpt / (peak * world) : NAN);
        const cJSON *mem = cJSON_GetObjectItemCaseSensitive(s, "memory");
        cJSON *pk = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(mem, "peak_bytes"), true);
        cJSON_AddItemToObject(x, "memory", pk ? pk : cJSON_CreateObject());
        add_num(x, "memory_peak_bytes", num(mem, "peak_total_bytes"));
        add_num(x, "peak_rss_bytes", num(mem, "peak_rss_bytes"));
        const cJSON *co = cJSON_GetObjectItemCaseSensitive(s, "collectives");
        add_num(x, "gather_wait_s", num(co, "gather_wait_s"));
        add_num(x, "reduce_wait_s", num(co, "reduce_wait_s"));
        bool done = num(st, "first") + num(st, "run") >= num(st, "max_steps");
        cJSON_AddStringToObject(x, "state", done ? "succeeded" : "failed");
        cJSON_AddStringToObject(x, "exit", done ? "" : "stopped before max_steps");
        cJSON_AddItemToArray(ranks, x);
        if (r >= 64)
            cJSON_Delete(s);
    }
    if (!found && !metrics) {
        error_set(FSDP_ENOTFOUND, "%s: neither metrics.jsonl nor run_summary.rank<R>.json found; give the run's "
                  "log.dir (the worker's [log] dir)", dir);
        goto fail;
    }
    cJSON_AddStringToObject(o, "run_id", run_id);
    cJSON_AddBoolToObject(o, "live", false);
    cJSON_AddNullToObject(o, "nnodes");
    add_num(o, "world_size", isfinite(world) ? world : (double)cJSON_GetArraySize(ranks));
    cJSON_AddNumberToObject(o, "restarts", restarts);
    cJSON_AddNullToObject(o, "elapsed_s");
    cJSON_AddNullToObject(o, "eta_s");
    add_num(o, "last_logged_step", last_step);
    cJSON_AddItemToObject(o, "ranks", ranks);
    cJSON_AddNullToObject(o, "failure");
    cJSON_AddNullToObject(o, "previous_failure");
    cJSON_AddItemToObject(h, "loss", loss);
    cJSON_AddItemToObject(h, "val_loss", val);
    cJSON_AddItemToObject(h, "tokens_per_s", tps);
    cJSON_AddItemToObject(o, "history", h);
    char *copy = strdup(run_id);
    if (copy) {
        cJSON_ReplaceItemInObject(o, "run_id", cJSON_CreateString(copy));
        free(copy);
    }
    for (int r = 0; r < 64; r++)
        cJSON_Delete(summaries[r]);
    free(metrics);
    return o;
fail:
    for (int r = 0; r < 64; r++)
        cJSON_Delete(summaries[r]);
    cJSON_Delete(o);
    cJSON_Delete(ranks);
    cJSON_Delete(h);
    cJSON_Delete(loss);
    cJSON_Delete(val);
    cJSON_Delete(tps);
    free(metrics);
    return NULL;
}

static const char USAGE[] =
    "usage: fsdp-launch status LOG_DIR [--json] [-o FILE]\n"
    "  The status page of a finished or crashed run from its files in LOG_DIR (the worker's log.dir:\n"
    "  metrics.jsonl, run_summary.rank<R>.json). HTML on stdout, or with --json the /api/status object.\n";

int status_files_main(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc)
            out = argv[++i];
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(USAGE, stdout);
            return 0;
        } else if (argv[i][0] != '-' && !dir)
            dir = argv[i];
        else {
            log_error("status: unexpected argument '%s'\n%s", argv[i], USAGE);
            return 2;
        }
    }
    if (!dir) {
        log_error("status: LOG_DIR is required\n%s", USAGE);
        return 2;
    }
    cJSON *snap = status_files_snapshot(dir);
    if (!snap) {
        log_error("%s", error_message());
        return 1;
    }
    char *text = json ? cJSON_Print(snap) : status_render_html(snap, false, false);
    cJSON_Delete(snap);
    if (!text) {
        log_error("out of memory rendering the status of %s", dir);
        return 1;
    }
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) {
        log_error("-o %s: cannot write: %s", out, strerror(errno));
        free(text);
        return 1;
    }
    fputs(text, f);
    if (json)
        fputc('\n', f);
    int bad = ferror(f);
    if (out)
        bad |= fclose(f);
    free(text);
    if (bad) {
        log_error("%s: write failed", out ? out : "stdout");
        return 1;
    }
    return 0;
}
