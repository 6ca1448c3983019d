#include "worker/train/metrics.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/tfevents.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct metrics {
    int fd;
    char *jsonl_path;
    struct tfevents_writer *events;
};

/* Appends to buf at *len; sets *len past cap on overflow so the caller checks once. */
static void metrics_append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    if (*len >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    *len = n < 0 ? cap : *len + (size_t)n;
}

/* Values are written as the float32 TensorBoard stores, in the fewest digits that a JSON reader's double,
 * rounded to float32, turns back into the same float (at most 9), so the two records agree bit for bit. */
static void metrics_append_float(char *buf, size_t cap, size_t *len, const char *key, double v)
{
    float f = (float)v;
    if (isfinite(f)) {
        char text[32];
        int digits = 1;
        for (; digits < 9; digits++) {
            snprintf(text, sizeof text, "%.*g", digits, (double)f);
            if ((float)strtod(text, NULL) == f)
                break;
        }
        /* 1000, not 1e+03, for numbers people read (the value is the same) */
        double a = fabs((double)f);
        do
            snprintf(text, sizeof text, "%.*g", digits++, (double)f);
        while (strchr(text, 'e') && a >= 1e-4 && a < 1e15 && digits <= 17);
        metrics_append(buf, cap, len, ",\"%s\":%s", key, text);
    }
    else
        metrics_append(buf, cap, len, ",\"%s\":null", key);
}

int metrics_format_line(char *buf, size_t cap, const struct metrics_row *row)
{
    size_t len = 0;
    metrics_append(buf, cap, &len, "{\"step\":%lld", (long long)row->step);
    metrics_append_float(buf, cap, &len, "loss", row->loss);
    metrics_append_float(buf, cap, &len, "lr", row->lr);
    metrics_append_float(buf, cap, &len, "grad_norm", row->grad_norm);
    metrics_append_float(buf, cap, &len, "tokens_per_s", row->tokens_per_s);
    if (row->has_val)
        metrics_append_float(buf, cap, &len, "val_loss", row->val_loss);
    metrics_append(buf, cap, &len, "}\n");
    if (len >= cap)
        return error_set(FSDP_ERANGE, "metrics: line does not fit in %zu bytes", cap);
    return (int)len;
}

int metrics_open(const char *dir, int64_t first_step, struct metrics **out)
{
    *out = NULL;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return error_set(FSDP_EIO, "metrics: cannot create log directory %s: %s", dir, strerror(errno));
    struct metrics *m = calloc(1, sizeof *m);
    if (!m)
        return error_set(FSDP_ENOMEM, "metrics: out of memory");
    m->fd = -1;
    int rc = 0;
    if (asprintf(&m->jsonl_path, "%s/metrics.jsonl", dir) < 0) {
        m->jsonl_path = NULL;
        rc = error_set(FSDP_ENOMEM, "metrics: out of memory");
        goto fail;
    }
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_APPEND | (first_step > 0 ? 0 : O_TRUNC);
    m->fd = open(m->jsonl_path, flags, 0644);
    if (m->fd < 0) {
        rc = error_set(FSDP_EIO, "metrics: cannot open %s: %s", m->jsonl_path, strerror(errno));
        goto fail;
    }
    FSDP_TRY_GOTO(tfevents_open(dir, &m->events), rc, fail);
    /* This run (re)writes every step from first_step on; TensorBoard forgets what older files say about
     * those steps when it reads this record, as metrics.jsonl was trimmed for them. */
    FSDP_TRY_GOTO(tfevents_write_session_start(m->events, clock_wall_s(), first_step), rc, fail);
    *out = m;
    return 0;
fail:
    metrics_close(m);
    return rc;
}

const char *metrics_events_path(const struct metrics *m) { return tfevents_path(m->events); }

int metrics_log(struct metrics *m, const struct metrics_row *row)
{
    char line[512];
    int len;
    FSDP_TRY(len = metrics_format_line(line, sizeof line, row));
    /* O_APPEND + one write: the line lands whole, and reaches the file before this returns. */
    ssize_t k;
    do
        k = write(m->fd, line, (size_t)len);
    while (k < 0 && errno == EINTR);
    if (k != len)
        return error_set(FSDP_EIO, "metrics: cannot write %s: %s", m->jsonl_path,
                         k < 0 ? strerror(errno) : "short write (disk full?)");
    const char *tags[5] = {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "val/loss"};
    float values[5] = {(float)row->loss, (float)row->lr, (float)row->grad_norm, (float)row->tokens_per_s,
                       (float)row->val_loss};
    return tfevents_write_scalars(m->events, clock_wall_s(), row->step, row->has_val ? 5 : 4, tags, values);
}

void metrics_close(struct metrics *m)
{
    if (!m)
        return;
    if (m->fd >= 0)
        close(m->fd);
    tfevents_close(m->events);
    free(m->jsonl_path);
    free(m);
}
