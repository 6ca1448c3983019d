/* Logging shared by every program: levels, a "[rank N]" prefix, and seconds since start on a monotonic
 * clock, so that lines of different ranks can be ordered when they are merged. Each line is written with
 * one write(2) call, so lines of concurrent processes never interleave inside a line. */
#ifndef FSDP_COMMON_LOG_H
#define FSDP_COMMON_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3, LOG_OFF = 4 };

/* prog: short program name shown on each line; reads FSDP_LOG_LEVEL (debug|info|warn|error|off). */
void log_init(const char *prog);
void log_set_rank(int rank); /* rank < 0: no rank prefix */
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* Parses a level name (case-insensitive, "warning" accepted); returns 0 or -1 if unknown. */
int log_parse_level(const char *name, enum log_level *out);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_vmsg(enum log_level level, const char *fmt, va_list ap);

#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

/* Where lines go instead of write(2) on stderr (NULL: back to stderr). A program whose stderr may stall
 * (fsdp-launch's console) queues them elsewhere; sink gets one whole line, newline included. */
void log_set_sink(void (*sink)(const char *line, size_t len));

/* Whether the latest error line printed by this process said exactly `text` (its message part). */
bool log_error_is_last(const char *text);

/* Seconds on the monotonic clock since log_init (or first use). */
double log_elapsed_s(void);

#endif
