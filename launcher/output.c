#include "launcher/output.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h"
#include "launcher/console.h"

void output_init(struct out_stream *s, int fd, int console_fd, int log_fd, bool prefix, int rank, bool keep_tail)
{
    memset(s, 0, sizeof *s);
    s->fd = fd;
    s->console_fd = console_fd;
    s->log_fd = log_fd;
    s->prefix = prefix;
    s->rank = rank;
    s->keep_tail = keep_tail;
    s->filter_fd = -1;
}

void output_set_prefix(struct out_stream *s, const char *text)
{
    snprintf(s->prefix_text, sizeof s->prefix_text, "%s", text);
}

void output_set_filter(struct out_stream *s, int fd, char *const *needles)
{
    s->filter_fd = fd;
    s->filters = needles;
}

static bool filtered(const struct out_stream *s, const char *line, size_t n)
{
    for (char *const *f = s->filters; f && *f; f++)
        if (memmem(line, n, *f, strlen(*f)))
            return true;
    return false;
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* a closed terminal must not stop supervision */
        p += w;
        n -= (size_t)w;
    }
}

void output_set_rotation(struct out_stream *s, const char *path, unsigned long long max)
{
    free(s->log_path);
    s->log_path = max ? strdup(path) : NULL;
    s->log_max = s->log_path ? max : 0;
    s->log_bytes = 0;
}

static void rotate(struct out_stream *s)
{
    char old[FSDP_PATH_MAX + 8]; /* the log's path (opened, so under FSDP_PATH_MAX) and ".1" */
    if (fs_path_format(old, sizeof old, "the rotated log", "%s.1", s->log_path) != 0)
        return; /* keep appending rather than lose lines */
    if (rename(s->log_path, old) != 0)
        return; /* keep appending rather than lose lines */
    int fd = open(s->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return; /* the old descriptor still writes into FILE.1 */
    close(s->log_fd);
    s->log_fd = fd;
    s->log_bytes = 0;
}

static void keep_tail(struct out_stream *s, const char *line, size_t n)
{
    if (n + 1 > OUTPUT_TAIL_BYTES) {
        line += n + 1 - OUTPUT_TAIL_BYTES;
        n = OUTPUT_TAIL_BYTES - 1;
    }
    if (s->tail_len + n + 1 > OUTPUT_TAIL_BYTES) {
        /* Drop whole lines from the front so the tail always starts at a line. */
        size_t drop = s->tail_len + n + 1 - OUTPUT_TAIL_BYTES;
        char *nl = memchr(s->tail + drop, '\n', s->tail_len - drop);
        drop = nl ? (size_t)(nl - s->tail) + 1 : s->tail_len;
        memmove(s->tail, s->tail + drop, s->tail_len - drop);
        s->tail_len -= drop;
    }
    memcpy(s->tail + s->tail_len, line, n);
    s->tail[s->tail_len + n] = '\n';
    s->tail_len += n + 1;
}

static void emit(struct out_stream *s, const char *line, size_t n)
{
    char out[OUTPUT_LINE_MAX + 160];
    memcpy(out, line, n);
    out[n] = '\n';
    if (s->log_fd >= 0) {
        if (s->log_max && s->log_bytes > 0 && s->log_bytes + n + 1 > s->log_max)
            rotate(s);
        write_all(s->log_fd, out, n + 1);
        s->log_bytes += n + 1;
    }
    bool to_filter = s->prefix && s->filter_fd >= 0 && filtered(s, line, n);
    if (s->prefix && (s->console_fd >= 0 || to_filter)) {
        int p = s->prefix_text[0] ? snprintf(out, 160, "%s", s->prefix_text) : snprintf(out, 32, "[rank %d]:", s->rank);
        memcpy(out + p, line, n);
        out[p + n] = '\n';
        if (s->console_fd >= 0)
            console_write(s->console_fd, out, (size_t)p + n + 1);
        if (to_filter)
            write_all(s->filter_fd, out, (size_t)p + n + 1);
    } else if (s->console_fd >= 0) {
        console_write(s->console_fd, out, n + 1);
    }
    if (s->keep_tail)
        keep_tail(s, line, n);
}

int output_pump(struct out_stream *s)
{
    if (s->fd < 0)
        return 1;
    for (;;) {
        ssize_t r = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (r <= 0) {
            output_close(s);
            return 1;
        }
        s->len += (size_t)r;
        size_t start = 0;
        for (;;) {
            char *nl = memchr(s->buf + start, '\n', s->len - start);
            if (!nl)
                break;
            emit(s, s->buf + start, (size_t)(nl - (s->buf + start)));
            start = (size_t)(nl - s->buf) + 1;
        }
        if (start == 0 && s->len == sizeof s->buf) {
            emit(s, s->buf, s->len);
            start = s->len;
        }
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
}

void output_close(struct out_stream *s)
{
    if (s->len > 0)
        emit(s, s->buf, s->len);
    s->len = 0;
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    if (s->log_fd >= 0)
        close(s->log_fd);
    s->log_fd = -1;
    free(s->log_path);
    s->log_path = NULL;
}

const char *output_tail(const struct out_stream *s, int lines)
{
    /* The tail buffer is const to callers; the summary reads it once the worker is dead. */
    size_t end = s->tail_len;
    size_t i = end;
    int seen = 0;
    while (i > 0) {
        if (s->tail[i - 1] == '\n' && i != end && ++seen >= lines)
            break;
        i--;
    }
    static __thread char copy[OUTPUT_TAIL_BYTES + 1];
    memcpy(copy, s->tail + i, end - i);
    copy[end - i] = 0;
    return copy;
}
