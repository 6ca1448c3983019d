#include "worker/tools/byte_progress.h"

#include "common/log.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

void byte_progress_init(struct byte_progress *p, FILE *out, int on, const char *label, uint64_t total)
{
    memset(p, 0, sizeof *p);
    p->out = out;
    p->on = on < 0 ? isatty(fileno(out)) != 0 : on != 0;
    p->label = label;
    p->total = total;
    p->start_s = log_elapsed_s();
    p->last_s = -1;
}

int byte_progress_format(char *buf, size_t cap, const char *label, uint64_t done, uint64_t total, double elapsed_s,
                         int width)
{
    double frac = total ? (double)done / (double)total : 1.0;
    frac = frac > 1 ? 1 : frac;
    char bar[128];
    width = width < 1 ? 1 : width > 100 ? 100 : width;
    int full = (int)(frac * width);
    for (int i = 0; i < width; i++)
        bar[i] = i < full ? '#' : '.';
    bar[width] = '\0';
    double rate = elapsed_s > 0 ? (double)done / elapsed_s : 0;
    char eta[32];
    if (rate > 0 && done <= total) {
        long long s = llround((double)(total - done) / rate);
        snprintf(eta, sizeof eta, "%lldm%02llds", s / 60, s % 60);
    } else {
        snprintf(eta, sizeof eta, "?");
    }
    return snprintf(buf, cap, "%s [%s] %3.0f%%  %.1f/%.1f MB  %.1f MB/s  eta %s", label, bar, 100 * frac,
                    (double)done / 1e6, (double)total / 1e6, rate / 1e6, eta);
}

static void draw(struct byte_progress *p, uint64_t done)
{
    char line[256];
    byte_progress_format(line, sizeof line, p->label, done, p->total, log_elapsed_s() - p->start_s, 30);
    fprintf(p->out, "\r%s\033[K", line);
    fflush(p->out);
    p->drawn = true;
}

void byte_progress_update(struct byte_progress *p, uint64_t done)
{
    if (!p->on)
        return;
    double now = log_elapsed_s();
    if (p->last_s >= 0 && now - p->last_s < 0.1)
        return;
    p->last_s = now;
    draw(p, done);
}

void byte_progress_finish(struct byte_progress *p, uint64_t done)
{
    if (!p->on)
        return;
    draw(p, done);
    fputc('\n', p->out);
    fflush(p->out);
    p->drawn = false;
}
