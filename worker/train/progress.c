#include "worker/train/progress.h"

#include "common/log.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

void progress_init(struct progress *p, FILE *out, int tty, int64_t first_step, int64_t total_steps,
                   int64_t interval)
{
    memset(p, 0, sizeof *p);
    p->out = out;
    p->tty = tty < 0 ? isatty(fileno(out)) : tty;
    p->first_step = first_step;
    p->total_steps = total_steps;
    p->interval = interval > 0 ? interval : 1;
    p->start_s = log_elapsed_s();
}

static void format_duration(char *buf, size_t cap, double s)
{
    if (!isfinite(s) || s < 0) {
        snprintf(buf, cap, "?");
        return;
    }
    long long t = llround(s);
    if (t >= 3600)
        snprintf(buf, cap, "%lldh%02lldm", t / 3600, t / 60 % 60);
    else
        snprintf(buf, cap, "%lldm%02llds", t / 60, t % 60);
}

int progress_format(char *buf, size_t cap, const struct progress_stats *s, int64_t first_step,
                    int64_t total_steps, double elapsed_s)
{
    char eta[32], mfu[16], mem[24];
    int64_t done = s->step + 1 - first_step;
    double per_step = done > 0 ? elapsed_s / (double)done : NAN;
    format_duration(eta, sizeof eta, per_step * (double)(total_steps - s->step - 1));
    if (s->mfu >= 0)
        snprintf(mfu, sizeof mfu, "%.1f%%", 100.0 * s->mfu);
    else
        snprintf(mfu, sizeof mfu, "-");
    if (s->mem_bytes >= 1024.0 * 1024 * 1024)
        snprintf(mem, sizeof mem, "%.2fGiB", s->mem_bytes / (1024.0 * 1024 * 1024));
    else if (s->mem_bytes >= 0)
        snprintf(mem, sizeof mem, "%.0fMiB", s->mem_bytes / (1024.0 * 1024));
    else
        snprintf(mem, sizeof mem, "-");
    return snprintf(buf, cap, "step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s | mfu %s | "
                    "mem %s | eta %s", (long long)(s->step + 1), (long long)total_steps, s->loss, s->lr,
                    s->grad_norm, s->tokens_per_s, mfu, mem, eta);
}

void progress_update(struct progress *p, const struct progress_stats *s)
{
    int last = s->step + 1 >= p->total_steps;
    if (!p->tty && !last && (s->step + 1) % p->interval != 0)
        return;
    char line[256];
    progress_format(line, sizeof line, s, p->first_step, p->total_steps, log_elapsed_s() - p->start_s);
    if (p->tty) {
        /* \033[K clears what a longer previous line left behind. */
        fprintf(p->out, "\r%s\033[K", line);
        p->drawn = 1;
    } else {
        fprintf(p->out, "%s\n", line);
    }
    fflush(p->out);
}

void progress_finish(struct progress *p)
{
    if (p->tty && p->drawn) {
        fputc('\n', p->out);
        fflush(p->out);
    }
    p->drawn = 0;
}
