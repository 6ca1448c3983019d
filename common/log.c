#include "common/log.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/settings.h"

static struct {
    char prog[32];
    int rank;
    enum log_level level;
    struct timespec start;
    int started;
} g_log = {.prog = "fsdp", .rank = -1, .level = LOG_INFO};

static void (*g_sink)(const char *line, size_t len);

void log_set_sink(void (*sink)(const char *line, size_t len)) { __atomic_store_n(&g_sink, sink, __ATOMIC_RELEASE); }

static double timespec_diff_s(const struct timespec *a, const struct timespec *b)
{
    return (double)(a->tv_sec - b->tv_sec) + (double)(a->tv_nsec - b->tv_nsec) * 1e-9;
}

static void log_ensure_start(void)
{
    if (!g_log.started) {
        clock_gettime(CLOCK_MONOTONIC, &g_log.start);
        g_log.started = 1;
    }
}

int log_parse_level(const char *name, enum log_level *out)
{
    static const struct { const char *name; enum log_level level; } names[] = {
        {"debug", LOG_DEBUG}, {"info", LOG_INFO},   {"warn", LOG_WARN},
        {"warning", LOG_WARN}, {"error", LOG_ERROR}, {"off", LOG_OFF},
    };
    if (!name)
        return -1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcasecmp(name, names[i].name) == 0) {
            *out = names[i].level;
            return 0;
        }
    }
    return -1;
}

void log_init(const char *prog)
{
    log_ensure_start();
    if (prog)
        snprintf(g_log.prog, sizeof g_log.prog, "%s", prog);
    /* Unset leaves the level as it is: info, or what log_set_level chose. */
    int i = 0;
    enum log_level lvl;
    if (settings_get_enum(SETTING_LOG_LEVEL, &i) != 0)
        log_warn("%s", error_message());
    else if (settings_get_raw(SETTING_LOG_LEVEL) &&
             log_parse_level(settings_entry(SETTING_LOG_LEVEL)->values[i].name, &lvl) == 0)
        g_log.level = lvl;
}

void log_set_rank(int rank) { g_log.rank = rank; }
void log_set_level(enum log_level level) { g_log.level = level; }
enum log_level log_get_level(void) { return g_log.level; }

double log_elapsed_s(void)
{
    log_ensure_start();
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return timespec_diff_s(&now, &g_log.start);
}

/* The text of the latest error line, so that a program about to report the error that stopped it can tell
 * that a lower layer (a collective's progress thread) already printed the same words. */
static pthread_mutex_t g_last_error_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_last_error[4096];

bool log_error_is_last(const char *text)
{
    pthread_mutex_lock(&g_last_error_mu);
    bool same = text && g_last_error[0] && strcmp(g_last_error, text) == 0;
    pthread_mutex_unlock(&g_last_error_mu);
    return same;
}

void log_vmsg(enum log_level level, const char *fmt, va_list ap)
{
    if (level < g_log.level || level >= LOG_OFF)
        return;
    static const char tags[] = "DIWE";
    char line[4096];
    int n;
    if (g_log.rank >= 0)
        n = snprintf(line, sizeof line, "[%9.3f] [%s] [rank %d] %c: ", log_elapsed_s(), g_log.prog,
                     g_log.rank, tags[level]);
    else
        n = snprintf(line, sizeof line, "[%9.3f] [%s] %c: ", log_elapsed_s(), g_log.prog, tags[level]);
    if (n < 0)
        return;
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    if (m < 0)
        return;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    if (level == LOG_ERROR) {
        pthread_mutex_lock(&g_last_error_mu);
        snprintf(g_last_error, sizeof g_last_error, "%.*s", (int)(len - (size_t)n), line + n);
        pthread_mutex_unlock(&g_last_error_mu);
    }
    line[len++] = '\n';
    void (*sink)(const char *, size_t) = __atomic_load_n(&g_sink, __ATOMIC_ACQUIRE);
    if (sink) {
        sink(line, len);
        return;
    }
    /* One write per line: concurrent ranks sharing a terminal or file never split each other's lines. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vmsg(level, fmt, ap);
    va_end(ap);
}
