/* The status snapshot as Prometheus text and as the HTML page with server-drawn SVG plots (status_render.h). */
#include "launcher/status_render.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growing text buffer; a failed allocation sets oom and later appends do nothing. */
struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void sb_add(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(struct sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        sb_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* HTML text and attribute escaping: & < > " ' are the characters that can end text or an attribute. */
static void sb_html(struct sbuf *b, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': sb_str(b, "&amp;"); break;
        case '<': sb_str(b, "&lt;"); break;
        case '>': sb_str(b, "&gt;"); break;
        case '"': sb_str(b, "&quot;"); break;
        case '\'': sb_str(b, "&#39;"); break;
        default: sb_add(b, s, 1);
        }
    }
}

/* Prometheus label values escape backslash, double quote and newline. */
static void sb_label(struct sbuf *b, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '\\')
            sb_str(b, "\\\\");
        else if (*s == '"')
            sb_str(b, "\\\"");
        else if (*s == '\n')
            sb_str(b, "\\n");
        else
            sb_add(b, s, 1);
    }
}

static char *sb_take(struct sbuf *b)
{
    if (b->oom || !b->p) {
        free(b->p);
        return NULL;
    }
    return b->p;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static const char *const STATES[] = {"starting", "running", "stale", "succeeded", "failed"};

static void prom_metric(struct sbuf *b, const char *name, const char *type, const char *help)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void prom_value(struct sbuf *b, double v)
{
    if (isnan(v))
        sb_str(b, " NaN\n");
    else
        sb_printf(b, " %.17g\n", v);
}

static void prom_rank_series(struct sbuf *b, const cJSON *snap, const char *name, const char *type, const char *help,
                             const char *key)
{
    prom_metric(b, name, type, help);
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(snap, "ranks"))
    {
        double v = num(r, key);
        if (isnan(v) && !cJSON_GetObjectItemCaseSensitive(r, "step"))
            continue; /* no record yet */
        sb_printf(b, "%s{run_id=\"", name);
        sb_label(b, str(snap, "run_id"));
        sb_printf(b, "\",rank=\"%d\"}", (int)num(r, "rank"));
        prom_value(b, v);
    }
}

char *status_render_prometheus(const cJSON *snap)
{
    struct sbuf b = {0};
    prom_rank_series(&b, snap, "fsdp_step", "gauge", "Optimizer steps done by the rank.", "step");
    prom_rank_series(&b, snap, "fsdp_max_steps", "gauge", "Steps the run will take.", "max_steps");
    prom_rank_series(&b, snap, "fsdp_loss", "gauge", "Training loss of the rank's last logged step.", "loss");
    prom_rank_series(&b, snap, "fsdp_val_loss", "gauge", "Last validation loss.", "val_loss");
    prom_rank_series(&b, snap, "fsdp_tokens_per_second", "gauge", "Tokens per second of the whole job at the rank's last step.",
                     "tokens_per_s");
    prom_rank_series(&b, snap, "fsdp_mfu", "gauge", "Model FLOPs utilisation (0..1) of the last step.", "mfu");
    prom_rank_series(&b, snap, "fsdp_peak_rss_bytes", "gauge", "Peak resident bytes of the rank's process.",
                     "peak_rss_bytes");
    prom_rank_series(&b, snap, "fsdp_gather_wait_seconds_total", "counter", "Time waited on all-gathers.",
                     "gather_wait_s");
    prom_rank_series(&b, snap, "fsdp_reduce_wait_seconds_total", "counter", "Time waited on reductions.",
                     "reduce_wait_s");
    prom_rank_series(&b, snap, "fsdp_report_age_seconds", "gauge", "Seconds since the rank's record last changed.",
                     "age_s");
    prom_metric(&b, "fsdp_memory_bytes", "gauge", "Engine memory of the rank by category.");
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(snap, "ranks"))
    {
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(r, "memory"))
        {
            if (!cJSON_IsNumber(c))
                continue;
            sb_str(&b, "fsdp_memory_bytes{run_id=\"");
            sb_label(&b, str(snap, "run_id"));
            sb_printf(&b, "\",rank=\"%d\",category=\"", (int)num(r, "rank"));
            sb_label(&b, c->string);
            sb_str(&b, "\"}");
            prom_value(&b, c->valuedouble);
        }
    }
    prom_metric(&b, "fsdp_rank_state", "gauge", "1 for the rank's state (starting, running, stale, succeeded, failed).");
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(snap, "ranks"))
    {
        for (size_t i = 0; i < sizeof STATES / sizeof *STATES; i++) {
            sb_str(&b, "fsdp_rank_state{run_id=\"");
            sb_label(&b, str(snap, "run_id"));
            sb_printf(&b, "\",rank=\"%d\",state=\"%s\"} %d\n", (int)num(r, "rank"), STATES[i],
                      strcmp(str(r, "state"), STATES[i]) == 0);
        }
    }
    prom_metric(&b, "fsdp_restarts", "gauge", "Restarts of the job so far.");
    sb_str(&b, "fsdp_restarts{run_id=\"");
    sb_label(&b, str(snap, "run_id"));
    sb_str(&b, "\"}");
    prom_value(&b, num(snap, "restarts"));
    prom_metric(&b, "fsdp_failed", "gauge", "1 once the current attempt has a root-cause failure record.");
    sb_str(&b, "fsdp_failed{run_id=\"");
    sb_label(&b, str(snap, "run_id"));
    sb_printf(&b, "\"} %d\n", cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(snap, "failure")) ? 1 : 0);
    return sb_take(&b);
}

/* ---- HTML ---- */

static void fmt_bytes(char *out, size_t cap, double v)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    if (isnan(v))
        snprintf(out, cap, "-");
    else
        snprintf(out, cap, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

static void fmt_num(char *out, size_t cap, const char *fmt, double v)
{
    if (isnan(v))
        snprintf(out, cap, "-");
    else
        snprintf(out, cap, fmt, v);
}

static void fmt_dur(char *out, size_t cap, double s)
{
    if (isnan(s) || s < 0)
        snprintf(out, cap, "-");
    else if (s < 120)
        snprintf(out, cap, "%.0f s", s);
    else if (s < 7200)
        snprintf(out, cap, "%.0f min %02.0f s", floor(s / 60), fmod(s, 60));
    else
        snprintf(out, cap, "%.0f h %02.0f min", floor(s / 3600), fmod(floor(s / 60), 60));
}

#define PLOT_W 420
#define PLOT_H 200
#define PAD_L 70
#define PAD_B 26
#define PAD_T 10
#define PAD_R 10

/* One SVG line plot of up to two series (x = step); the axes show their ranges. */
static void svg_plot(struct sbuf *b, const char *title, const char *id, const cJSON *s1, const char *c1,
                     const char *l1, const cJSON *s2, const char *c2, const char *l2)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    const cJSON *ser[2] = {s1, s2};
    int n = 0;
    for (int k = 0; k < 2; k++) {
        const cJSON *p;
        cJSON_ArrayForEach(p, ser[k])
        {
            double x = cJSON_GetArrayItem(p, 0) ? cJSON_GetArrayItem(p, 0)->valuedouble : NAN;
            double y = cJSON_GetArrayItem(p, 1) ? cJSON_GetArrayItem(p, 1)->valuedouble : NAN;
            if (!isfinite(x) || !isfinite(y))
                continue;
            x0 = fmin(x0, x);
            x1 = fmax(x1, x);
            y0 = fmin(y0, y);
            y1 = fmax(y1, y);
            n++;
        }
    }
    sb_printf(b, "<figure class=\"plot\"><figcaption>");
    sb_html(b, title);
    sb_printf(b, "</figcaption><svg id=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                 "viewBox=\"0 0 %d %d\" role=\"img\">",
              id, PLOT_W, PLOT_H, PLOT_W, PLOT_H);
    sb_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fff\" stroke=\"#bbb\"/>", PAD_L, PAD_T,
              PLOT_W - PAD_L - PAD_R, PLOT_H - PAD_T - PAD_B);
    if (n == 0) {
        sb_printf(b, "<text x=\"%d\" y=\"%d\" fill=\"#888\">no data yet</text></svg></figure>", PAD_L + 10,
                  PLOT_H / 2);
        return;
    }
    if (x1 <= x0)
        x1 = x0 + 1;
    if (y1 <= y0) {
        y1 += fabs(y1) * 0.05 + 1e-6;
        y0 -= fabs(y0) * 0.05 + 1e-6;
    }
    double w = PLOT_W - PAD_L - PAD_R, h = PLOT_H - PAD_T - PAD_B;
    sb_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"end\">%.4g</text>", PAD_L - 4, PAD_T + 10, y1);
    sb_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"end\">%.4g</text>", PAD_L - 4,
              PLOT_H - PAD_B, y0);
    sb_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"11\">%.0f</text>", PAD_L, PLOT_H - 8, x0);
    sb_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"end\">step %.0f</text>", PLOT_W - PAD_R,
              PLOT_H - 8, x1);
    const char *col[2] = {c1, c2}, *lab[2] = {l1, l2};
    for (int k = 0; k < 2; k++) {
        if (!ser[k] || cJSON_GetArraySize(ser[k]) == 0)
            continue;
        sb_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", col[k]);
        const cJSON *p;
        cJSON_ArrayForEach(p, ser[k])
        {
            double x = cJSON_GetArrayItem(p, 0) ? cJSON_GetArrayItem(p, 0)->valuedouble : NAN;
            double y = cJSON_GetArrayItem(p, 1) ? cJSON_GetArrayItem(p, 1)->valuedouble : NAN;
            if (isfinite(x) && isfinite(y))
                sb_printf(b, "%.1f,%.1f ", PAD_L + (x - x0) / (x1 - x0) * w, PAD_T + (y1 - y) / (y1 - y0) * h);
        }
        sb_str(b, "\"/>");
        sb_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"%s\">", PLOT_W - PAD_R - 90, PAD_T + 14 + 13 * k,
                  col[k]);
        sb_html(b, lab[k]);
        sb_str(b, "</text>");
    }
    sb_str(b, "</svg></figure>");
}

static void content(struct sbuf *b, const cJSON *snap)
{
    char t1[64], t2[64], t3[64];
    sb_str(b, "<h1>fsdpc job <span class=\"runid\">");
    sb_html(b, str(snap, "run_id"));
    sb_str(b, "</span></h1>\n<p class=\"job\">");
    fmt_dur(t1, sizeof t1, num(snap, "elapsed_s"));
    fmt_dur(t2, sizeof t2, num(snap, "eta_s"));
    fmt_num(t3, sizeof t3, "%.0f", num(snap, "nnodes"));
    sb_printf(b, "%s &middot; nodes %s &middot; ranks %.0f &middot; restarts %.0f &middot; elapsed %s &middot; ETA %s",
              cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(snap, "live")) ? "live" : "finished run (from its files)",
              t3, num(snap, "world_size"), num(snap, "restarts"), t1, t2);
    sb_str(b, "</p>\n");
    const cJSON *fail = cJSON_GetObjectItemCaseSensitive(snap, "failure");
    bool previous = false;
    if (!cJSON_IsObject(fail)) {
        fail = cJSON_GetObjectItemCaseSensitive(snap, "previous_failure");
        previous = true;
    }
    if (cJSON_IsObject(fail)) {
        sb_str(b, "<section class=\"rootcause\" id=\"rootcause\"><h2>");
        sb_str(b, previous ? "Root cause of the previous attempt (the job restarted)" : "Root cause");
        sb_str(b, "</h2><p>");
        double rank = num(fail, "rank");
        if (!isnan(rank))
            sb_printf(b, "rank %.0f ", rank);
        sb_str(b, "(");
        sb_html(b, str(fail, "host"));
        sb_str(b, "): ");
        sb_html(b, str(fail, "status"));
        if (*str(fail, "reason")) {
            sb_str(b, " &mdash; ");
            sb_html(b, str(fail, "reason"));
        }
        sb_str(b, "</p><pre>");
        sb_html(b, str(fail, "stderr_tail"));
        sb_str(b, "</pre></section>\n");
    }
    sb_str(b, "<table id=\"ranks\"><thead><tr><th>rank</th><th>host</th><th>pid</th><th>state</th><th>step</th>"
              "<th>loss</th><th>tokens/s</th><th>MFU</th><th>memory by category</th>"
              "<th>peak RSS</th><th>gather wait</th><th>reduce wait</th><th>age</th></tr></thead><tbody>\n");
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(snap, "ranks"))
    {
        const char *state = str(r, "state");
        sb_printf(b, "<tr class=\"st-");
        sb_html(b, state);
        sb_printf(b, "\"><td>%.0f</td><td>", num(r, "rank"));
        sb_html(b, str(r, "host"));
        fmt_num(t1, sizeof t1, "%.0f", num(r, "pid"));
        sb_printf(b, "</td><td>%s</td><td>", t1);
        sb_html(b, state);
        if (*str(r, "exit")) {
            sb_str(b, ": ");
            sb_html(b, str(r, "exit"));
        }
        if (*str(r, "previous_exit")) {
            sb_str(b, " (previous attempt: ");
            sb_html(b, str(r, "previous_exit"));
            sb_str(b, ")");
        }
        fmt_num(t1, sizeof t1, "%.0f", num(r, "step"));
        fmt_num(t2, sizeof t2, "%.0f", num(r, "max_steps"));
        sb_printf(b, "</td><td>%s / %s</td>", t1, t2);
        fmt_num(t1, sizeof t1, "%.4f", num(r, "loss"));
        fmt_num(t2, sizeof t2, "%.0f", num(r, "tokens_per_s"));
        fmt_num(t3, sizeof t3, "%.1f%%", num(r, "mfu") * 100);
        sb_printf(b, "<td>%s</td><td>%s</td><td>%s</td><td>", t1, t2, t3);
        const cJSON *c;
        bool first = true;
        cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(r, "memory"))
        {
            fmt_bytes(t1, sizeof t1, c->valuedouble);
            if (!first)
                sb_str(b, " / ");
            sb_str(b, "<span title=\"");
            sb_html(b, c->string);
            sb_printf(b, "\">%s</span>", t1);
            first = false;
        }
        if (first)
            sb_str(b, "-");
        fmt_bytes(t1, sizeof t1, num(r, "peak_rss_bytes"));
        fmt_num(t2, sizeof t2, "%.2f s", num(r, "gather_wait_s"));
        fmt_num(t3, sizeof t3, "%.2f s", num(r, "reduce_wait_s"));
        sb_printf(b, "</td><td>%s</td><td>%s</td><td>%s</td>", t1, t2, t3);
        fmt_num(t1, sizeof t1, "%.1f s", num(r, "age_s"));
        sb_printf(b, "<td>%s</td></tr>\n", t1);
    }
    sb_str(b, "</tbody></table>\n<div class=\"plots\">");
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(snap, "history");
    svg_plot(b, "loss", "plot-loss", cJSON_GetObjectItemCaseSensitive(h, "loss"), "#1f77b4", "train loss",
             cJSON_GetObjectItemCaseSensitive(h, "val_loss"), "#d62728", "val loss");
    svg_plot(b, "tokens per second", "plot-tps", cJSON_GetObjectItemCaseSensitive(h, "tokens_per_s"), "#2ca02c",
             "tokens/s", NULL, "", "");
    sb_str(b, "</div>\n");
}

static const char STYLE[] =
    "body{font-family:sans-serif;margin:1em 2em;color:#222}h1{font-size:1.4em}.runid{font-family:monospace}"
    "table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
    "th{background:#eee}tr.st-failed td{background:#fdd}tr.st-stale td{background:#ffe9b3}"
    "tr.st-succeeded td{background:#e4f7e4}.plots{display:flex;flex-wrap:wrap;gap:1em;margin-top:1em}"
    ".plot{margin:0}.rootcause{border:2px solid #c00;background:#fff4f4;padding:.5em 1em;margin:1em 0}"
    ".rootcause pre{white-space:pre-wrap;font-size:.85em;max-height:20em;overflow:auto}";

/* Polls the same URL (its query, hence a token, carried over) with fragment=1 every 2 s and swaps the
 * content in place; a failed poll keeps the last content and says so. */
static const char SCRIPT[] =
    "(function(){var c=document.getElementById('content'),n=document.getElementById('note');"
    "function tick(){var q=new URLSearchParams(location.search);q.set('fragment','1');"
    "fetch(location.pathname+'?'+q.toString(),{cache:'no-store'}).then(function(r){if(!r.ok)throw r.status;"
    "return r.text()}).then(function(t){c.innerHTML=t;n.textContent=''}).catch(function(){"
    "n.textContent='(launcher not answering: showing the last state)'}).finally(function(){setTimeout(tick,2000)})}"
    "setTimeout(tick,2000)})();";

char *status_render_html(const cJSON *snap, bool live, bool fragment)
{
    struct sbuf b = {0};
    if (fragment) {
        content(&b, snap);
        return sb_take(&b);
    }
    sb_str(&b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>fsdpc ");
    sb_html(&b, str(snap, "run_id"));
    sb_str(&b, "</title><style>");
    sb_add(&b, STYLE, sizeof STYLE - 1);
    sb_str(&b, "</style></head><body><div id=\"content\">\n");
    content(&b, snap);
    sb_str(&b, "</div><p id=\"note\" style=\"color:#a00\"></p>");
    if (live) {
        sb_str(&b, "<script>");
        sb_add(&b, SCRIPT, sizeof SCRIPT - 1);
        sb_str(&b, "</script>");
    }
    sb_str(&b, "</body></html>\n");
    return sb_take(&b);
}
