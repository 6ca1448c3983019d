/* A progress bar for work measured in bytes (fsdp-prepare-data): on a terminal, one line redrawn in place
 * at most 10 times a second,
 *   encoding [#########...........]  45%  12.3/27.0 MB  15.2 MB/s  eta 0m01s
 * and nothing when the output is not a terminal (a log, a pipe), where the tool's summary lines say
 * enough. The training loop's progress line (worker/train/progress.c) counts steps and losses; this one
 * counts bytes. */
#ifndef FSDP_TOOLS_BYTE_PROGRESS_H
#define FSDP_TOOLS_BYTE_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct byte_progress {
    FILE *out;
    bool on;
    const char *label;
    uint64_t total;
    double start_s, last_s;
    bool drawn;
};

/* on < 0: draw when out is a terminal; 0/1 force it (tests, --progress/--no-progress). */
void byte_progress_init(struct byte_progress *p, FILE *out, int on, const char *label, uint64_t total);
/* done: bytes finished so far; draws when the last drawing is at least 0.1 s old. */
void byte_progress_update(struct byte_progress *p, uint64_t done);
/* Draws the final state and ends the line. */
void byte_progress_finish(struct byte_progress *p, uint64_t done);
/* The line without terminator; width is the bar's width in characters. */
int byte_progress_format(char *buf, size_t cap, const char *label, uint64_t done, uint64_t total, double elapsed_s,
                         int width);

#endif
