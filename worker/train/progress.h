/* Rank 0's progress line: step/total, loss, lr, grad norm, tokens/s, MFU, memory and ETA. On a terminal
 * the line is redrawn in place (carriage return + clear to end of line) at every update; into a file or a
 * pipe (a launcher log, CI) it is printed as a normal line every `interval` steps, because carriage
 * returns make logs unreadable. */
#ifndef FSDP_WORKER_PROGRESS_H
#define FSDP_WORKER_PROGRESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct progress_stats {
    int64_t step;        /* 0-based step just finished */
    double loss, lr, grad_norm, tokens_per_s;
    double mfu;          /* model FLOPs utilisation in [0, 1]; < 0 when unknown (no peak FLOP/s for the device) */
    double mem_bytes;    /* peak device memory of this rank; < 0 when unknown */
};

struct progress {
    FILE *out;
    int tty;
    int64_t total_steps, interval, first_step;
    double start_s; /* monotonic seconds at first_step, for the ETA */
    int drawn;      /* a partial line is on the terminal */
};

/* first_step: the step this run starts at (resume), so the ETA measures this run's speed only.
 * tty < 0: decide by isatty(fileno(out)); 0/1 force a mode (tests). */
void progress_init(struct progress *p, FILE *out, int tty, int64_t first_step, int64_t total_steps,
                   int64_t interval);
/* Called after every step; prints when the mode says so. */
void progress_update(struct progress *p, const struct progress_stats *s);
/* Ends the in-place line so the next output starts on a fresh line. */
void progress_finish(struct progress *p);

/* The line's text without terminator; elapsed_s is the time since first_step started. */
int progress_format(char *buf, size_t cap, const struct progress_stats *s, int64_t first_step,
                    int64_t total_steps, double elapsed_s);

#endif
