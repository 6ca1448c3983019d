/* One worker output stream (stdout or stderr) read from its pipe and cut into whole lines, each line
 * written with one write(2) to the log file and queued whole for the console (launcher/console.h), so lines
 * of different ranks never mix inside a line. The stderr stream also keeps its last lines for the failure
 * summary. */
#ifndef FSDP_LAUNCHER_OUTPUT_H
#define FSDP_LAUNCHER_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>

#define OUTPUT_LINE_MAX 8192 /* a longer line is cut into pieces of this size */
#define OUTPUT_TAIL_BYTES 4096

struct out_stream {
    int fd;         /* read end of the worker's pipe; -1 once closed */
    int console_fd; /* 1 or 2, or -1 when this stream is not shown */
    int log_fd;     /* -1 without --log_dir */
    bool prefix;    /* "[rank N]:" (or prefix_text) on console lines (--tee) */
    char prefix_text[128]; /* --log_line_prefix_template, rendered for this worker; "" = "[rank N]:" */
    int filter_fd;         /* --duplicate_*_filters: tee'd lines with a needle go here too; -1 = none */
    char *const *filters;  /* the needles (NULL-terminated), owned by the worker group */
    int rank;
    char buf[OUTPUT_LINE_MAX];
    size_t len;
    bool keep_tail;
    char tail[OUTPUT_TAIL_BYTES];
    size_t tail_len;
    char *log_path;          /* for rotation; NULL = never rotated */
    unsigned long long log_bytes, log_max;
};

void output_init(struct out_stream *s, int fd, int console_fd, int log_fd, bool prefix, int rank, bool keep_tail);
/* Rotates the log file at path (log_fd) when a line would take it past max bytes: path becomes path.1
 * (replacing an older one) and a new path is started, so a stream keeps at most about 2 x max bytes on
 * disk and lines are never cut. A line longer than max goes alone into a fresh file. */
void output_set_rotation(struct out_stream *s, const char *path, unsigned long long max);
/* The prefix of --tee lines, in place of "[rank N]:". */
void output_set_prefix(struct out_stream *s, const char *text);
/* --tee lines containing any of needles are also written (prefixed) to fd. */
void output_set_filter(struct out_stream *s, int fd, char *const *needles);
/* Reads what the pipe has now. Returns 1 at end of file (the stream is then flushed and closed), 0
 * otherwise. */
int output_pump(struct out_stream *s);
/* Emits a last partial line and closes the pipe and the log file. */
void output_close(struct out_stream *s);
/* The last `lines` lines of the tail, as one string inside the stream (valid until the next pump). */
const char *output_tail(const struct out_stream *s, int lines);

#endif
