/* `fsdp-launch status DIR`: the status page from a run's files (status_files.h). */
#include "launcher/status_files.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"
#include "launcher/status_render.h"

#define MAX_RANKS 65536
#define HISTORY_CAP 2048

/* The whole of a run summary (a few KiB). NULL with error_message() set: FSDP_ENOTFOUND when the file does
 * not exist (a rank that did not finish), another code when it is there but cannot be read (a FIFO would
 * block the reader forever: fs_open_regular refuses it). */
static char *slurp(const char *path, int *rc)
{
    int fd = fs_open_regular(path, "run summary");
    if (fd < 0) {
        *rc = fd;
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        *rc = error_set(FSDP_ENOMEM, "out of memory reading %s", path);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (len + 1 >= cap) {
            char *p = realloc(buf, cap *= 2);
            if (!p)
                free(buf);
            buf = p;
        }
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf) {
        *rc = error_set(FSDP_ENOMEM, "out of memory reading %s", path);
        return NULL;
    }
    if (bad) {
        free(buf);
        *rc = error_set(FSDP_EIO, "run summary %s: read error", path);
        return NULL;
    }
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

/* One curve of the history while metrics.jsonl is read: plain [x, y] pairs, so reading stays linear in the
 * file (a cJSON array thinned by index was quadratic: minutes for a 200,000-step run). */
struct curve {
    double *xy;
    size_t n, cap;
};

static int curve_push(struct curve *c, double x, double y)
{
    if (!isfinite(x) || !isfinite(y))
        return 0;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 1024;
        double *p = realloc(c->xy, cap * 2 * sizeof *p);
        if (!p)
            return error_set(FSDP_ENOMEM, "out of memory reading metrics.jsonl");
        c->xy = p;
        c->cap = cap;
    }
    c->xy[2 * c->n] = x;
    c->xy[2 * c->n + 1] = y;
    c->n++;
    return 0;
}

/* The curve as the JSON array of the page: at most HISTORY_CAP points, every k-th and always the last. */
static cJSON *curve_to_json(const struct curve *c)
{
    cJSON *arr = cJSON_CreateArray();
    if (!arr || c->n == 0)
        return arr;
    /* k such that ceil((n-1)/k) points before the last plus the last fit in HISTORY_CAP */
    size_t k = c->n <= HISTORY_CAP ? 1 : (c->n - 1 + HISTORY_CAP - 2) / (HISTORY_CAP - 1);
    for (size_t i = 0; i < c->n; i++) {
        if (i % k && i != c->n - 1)
            continue;
        cJSON *p = cJSON_CreateDoubleArray(c->xy + 2 * i, 2);
        if (!p) {
            cJSON_Delete(arr);
            return NULL;
        }
        cJSON_AddItemToArray(arr, p); /* O(1): cJSON keeps the last child in the first's prev */
    }
    return arr;
}

/* The fields of one metrics.jsonl record the page uses; NAN when absent or not a number. */
struct metrics_fields {
    double step, loss, val_loss, tps;
};

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
        p++;
    return p;
}

/* Plain decimals ("-12.375", "1200") as strtod reads them, without its cost: a mantissa below 2^53 and at
 * most 22 decimals are both exact doubles, so one division rounds correctly (Clinger's fast path) and gives
 * strtod's result. false for anything else (exponents, long mantissas), which strtod then reads. */
static bool number_fast(const char *p, const char *q, double *out)
{
    static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                     1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    bool neg = p < q && *p == '-';
    if (neg)
        p++;
    uint64_t m = 0;
    int digits = 0, frac = -1;
    for (; p < q; p++) {
        if (*p == '.' && frac < 0) {
            frac = 0;
            continue;
        }
        if (*p < '0' || *p > '9' || ++digits > 15)
            return false;
        m = m * 10 + (uint64_t)(*p - '0');
        if (frac >= 0)
            frac++;
    }
    if (digits == 0 || frac == 0)
        return false; /* "-", "." or "1.": strtod (and cJSON) decide */
    double v = (double)m / POW10[frac < 0 ? 0 : frac];
    *out = neg ? -v : v;
    return true;
}

/* The record as the worker writes it (metrics_format_line: one flat object of numbers) without building a
 * cJSON tree: cJSON_Parse costs an allocation per member and would cap the reader near a million lines a
 * second. Returns false for anything else (nesting, escapes in a key, a number cJSON would not take), which
 * the caller then hands to cJSON, so both paths read the same records. */
static bool metrics_scan_flat(const char *p, const char *end, struct metrics_fields *m)
{
    *m = (struct metrics_fields){NAN, NAN, NAN, NAN};
    bool seen[4] = {false};
    p = skip_ws(p, end);
    if (p == end || *p++ != '{')
        return false;
    p = skip_ws(p, end);
    if (p < end && *p == '}')
        return true;
    for (;;) {
        if (p == end || *p++ != '"')
            return false;
        const char *key = p;
        while (p < end && *p != '"' && *p != '\\')
            p++;
        if (p == end || *p == '\\')
            return false;
        size_t klen = (size_t)(p - key);
        p = skip_ws(p + 1, end);
        if (p == end || *p++ != ':')
            return false;
        p = skip_ws(p, end);
        if (p == end)
            return false;
        /* the first of duplicate keys wins, as with cJSON_GetObjectItemCaseSensitive */
        static const char *const KEYS[4] = {"step", "loss", "val_loss", "tokens_per_s"};
        static const size_t KEY_LEN[4] = {4, 4, 8, 12};
        double *dst[4] = {&m->step, &m->loss, &m->val_loss, &m->tps};
        int want = -1;
        for (int i = 0; i < 4 && want < 0; i++)
            if (!seen[i] && KEY_LEN[i] == klen && memcmp(KEYS[i], key, klen) == 0)
                want = i;
        if (*p == '-' || (*p >= '0' && *p <= '9')) {
            /* only the characters cJSON's parse_number takes: strtod alone would also take "-inf", "nan" or
             * hex, which cJSON refuses; it stops before q on anything malformed ("1-2"), so the ends agree */
            const char *q = p;
            while (q < end && ((*q >= '0' && *q <= '9') || *q == '-' || *q == '+' || *q == '.' || *q == 'e' ||
                               *q == 'E'))
                q++;
            if (want >= 0) {
                double v;
                if (!number_fast(p, q, &v)) {
                    char *e;
                    v = strtod(p, &e);
                    if (e != q)
                        return false;
                }
                *dst[want] = v;
            }
            p = q;
        } else if ((size_t)(end - p) >= 4 && memcmp(p, "null", 4) == 0)
            p += 4;
        else if ((size_t)(end - p) >= 4 && memcmp(p, "true", 4) == 0)
            p += 4;
        else if ((size_t)(end - p) >= 5 && memcmp(p, "false", 5) == 0)
            p += 5;
        else if (*p == '"') {
            for (p++; p < end && *p != '"'; p++)
                if (*p == '\\')
                    p++;
            if (p >= end)
                return false;
            p++;
        } else
            return false; /* an object or array: cJSON decides */
        if (want >= 0)
            seen[want] = true;
        p = skip_ws(p, end);
        if (p == end)
            return false;
        if (*p == '}')
            return true;
        if (*p++ != ',')
            return false;
        p = skip_ws(p, end);
    }
}

static bool metrics_parse_line(const char *line, size_t len, struct metrics_fields *m)
{
    if (metrics_scan_flat(line, line + len, m))
        return true;
    cJSON *o = cJSON_ParseWithLength(line, len);
    if (!o)
        return false;
    *m = (struct metrics_fields){num(o, "step"), num(o, "loss"), num(o, "val_loss"), num(o, "tokens_per_s")};
    cJSON_Delete(o);
    return true;
}

struct metrics_read {
    bool present;
    struct curve loss, val, tps;
    double last_tps, last_step;
};

/* Reads dir/metrics.jsonl line by line into m (absent: m->present false). */
static int metrics_read(const char *path, struct metrics_read *m)
{
    m->last_tps = m->last_step = NAN;
    int fd = fs_open_regular(path, "metrics file");
    if (fd == FSDP_ENOTFOUND) {
        error_clear();
        return 0;
    }
    if (fd < 0)
        return fd;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return error_set(FSDP_ENOMEM, "out of memory reading %s", path);
    }
    m->present = true;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        struct metrics_fields x;
        if (len == 0 || !metrics_parse_line(line, (size_t)len, &x))
            continue;
        double s = x.step + 1; /* metrics.jsonl counts from 0; the page counts steps done */
        FSDP_TRY_GOTO(curve_push(&m->loss, s, x.loss), rc, out);
        FSDP_TRY_GOTO(curve_push(&m->val, s, x.val_loss), rc, out);
        FSDP_TRY_GOTO(curve_push(&m->tps, s, x.tps), rc, out);
        if (isfinite(x.tps))
            m->last_tps = x.tps;
        m->last_step = s;
    }
    if (ferror(f))
        rc = error_set(FSDP_EIO, "metrics file %s: read error", path);
out:
    free(line);
    fclose(f);
    return rc;
}

static void metrics_free(struct metrics_read *m)
{
    free(m->loss.xy);
    free(m->val.xy);
    free(m->tps.xy);
}

cJSON *status_files_snapshot(const char *dir)
{
    char path[FSDP_PATH_MAX + 32]; /* dir and "/run_summary.rank<R>.json" */
    /* the longest name read below: when it fits, no snprintf here truncates */
    if (fs_path_format(path, sizeof path, "the run's log directory", "%s/run_summary.rank%d.json", dir,
                       MAX_RANKS - 1) != 0)
        return NULL;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    struct metrics_read mr = {0};
    char *run_id = NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON *ranks = cJSON_CreateArray();
    cJSON *h = cJSON_CreateObject();
    if (!o || !ranks || !h) {
        error_set(FSDP_ENOMEM, "out of memory reading %s", dir);
        goto fail;
    }
    if (metrics_read(path, &mr) < 0)
        goto fail;
    double last_tps = mr.last_tps, last_step = mr.last_step;
    double world = NAN, restarts = 0;
    int found = 0;
    for (int r = 0; r < MAX_RANKS; r++) {
        snprintf(path, sizeof path, "%s/run_summary.rank%d.json", dir, r);
        int src = 0;
        char *text = slurp(path, &src);
        if (!text && src != FSDP_ENOTFOUND)
            goto fail;
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
        /* a copy: s is deleted at the end of this iteration */
        if (cJSON_IsString(rid) && *rid->valuestring && !run_id && !(run_id = strdup(rid->valuestring))) {
            cJSON_Delete(s);
            cJSON_Delete(x);
            error_set(FSDP_ENOMEM, "out of memory reading %s", dir);
            goto fail;
        }
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
        cJSON_Delete(s);
    }
    if (!found && !mr.present) {
        error_set(FSDP_ENOTFOUND, "%s: neither metrics.jsonl nor run_summary.rank<R>.json found; give the run's "
                  "log.dir (the worker's [log] dir)", dir);
        goto fail;
    }
    cJSON *loss = curve_to_json(&mr.loss), *val = curve_to_json(&mr.val), *tps = curve_to_json(&mr.tps);
    cJSON_AddItemToObject(h, "loss", loss);
    cJSON_AddItemToObject(h, "val_loss", val);
    cJSON_AddItemToObject(h, "tokens_per_s", tps);
    if (!loss || !val || !tps) {
        error_set(FSDP_ENOMEM, "out of memory reading %s", dir);
        goto fail;
    }
    cJSON_AddStringToObject(o, "run_id", run_id ? run_id : "");
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
    cJSON_AddItemToObject(o, "history", h);
    free(run_id);
    metrics_free(&mr);
    return o;
fail:
    free(run_id);
    cJSON_Delete(o);
    cJSON_Delete(ranks);
    cJSON_Delete(h);
    metrics_free(&mr);
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
