#include "common/tfevents.h"

#include "common/crc32c.h"
#include "common/error.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct tfevents_writer {
    int fd;
    char *path;
};

/* A bounded output cursor: encoders write through it and report overflow once at the end, which keeps
 * each encoder free of per-field length checks. */
struct pb_out {
    uint8_t *buf;
    size_t cap, len;
    int overflow;
};

static void pb_bytes(struct pb_out *o, const void *p, size_t n)
{
    if (o->overflow || n > o->cap - o->len) {
        o->overflow = 1;
        return;
    }
    memcpy(o->buf + o->len, p, n);
    o->len += n;
}

static void pb_varint(struct pb_out *o, uint64_t v)
{
    uint8_t tmp[10];
    size_t n = 0;
    do {
        tmp[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_bytes(o, tmp, n);
}

static size_t pb_varint_size(uint64_t v)
{
    size_t n = 1;
    while (v > 0x7f) {
        v >>= 7;
        n++;
    }
    return n;
}

static void pb_u8(struct pb_out *o, uint8_t b) { pb_bytes(o, &b, 1); }

static void pb_le(struct pb_out *o, uint64_t v, int nbytes)
{
    uint8_t tmp[8];
    for (int i = 0; i < nbytes; i++)
        tmp[i] = (uint8_t)(v >> (8 * i));
    pb_bytes(o, tmp, (size_t)nbytes);
}

static void pb_double(struct pb_out *o, double d)
{
    uint64_t bits;
    memcpy(&bits, &d, 8);
    pb_le(o, bits, 8);
}

static void pb_float(struct pb_out *o, float f)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    pb_le(o, bits, 4);
}

/* Event fields 1 (wall_time, fixed64 double) and 2 (step, varint). */
static void pb_event_head(struct pb_out *o, double wall_time, int64_t step, int with_step)
{
    pb_u8(o, 0x09);
    pb_double(o, wall_time);
    if (with_step) {
        pb_u8(o, 0x10);
        pb_varint(o, (uint64_t)step);
    }
}

int tfevents_encode_version(uint8_t *buf, size_t cap, double wall_time)
{
    static const char version[] = "brain.Event:2";
    struct pb_out o = {buf, cap, 0, 0};
    pb_event_head(&o, wall_time, 0, 0);
    pb_u8(&o, 0x1a);
    pb_varint(&o, sizeof version - 1);
    pb_bytes(&o, version, sizeof version - 1);
    if (o.overflow || o.len > INT_MAX)
        return error_set(FSDP_ERANGE, "tfevents: version record does not fit in %zu bytes", cap);
    return (int)o.len;
}

int tfevents_encode_session_start(uint8_t *buf, size_t cap, double wall_time, int64_t step)
{
    struct pb_out o = {buf, cap, 0, 0};
    pb_event_head(&o, wall_time, step, 1);
    pb_u8(&o, 0x3a); /* Event.session_log (field 7) */
    pb_varint(&o, 2);
    pb_u8(&o, 0x08); /* SessionLog.status = START (1) */
    pb_u8(&o, 0x01);
    if (o.overflow || o.len > INT_MAX)
        return error_set(FSDP_ERANGE, "tfevents: session record does not fit in %zu bytes", cap);
    return (int)o.len;
}

int tfevents_encode_scalars(uint8_t *buf, size_t cap, double wall_time, int64_t step, size_t n,
                            const char *const *tags, const float *values)
{
    /* Lengths come before the nested messages, so compute the Summary's size first. */
    size_t summary_len = 0;
    for (size_t i = 0; i < n; i++) {
        size_t tag_len = strlen(tags[i]);
        size_t value_len = 1 + pb_varint_size(tag_len) + tag_len + 1 + 4;
        summary_len += 1 + pb_varint_size(value_len) + value_len;
    }
    struct pb_out o = {buf, cap, 0, 0};
    pb_event_head(&o, wall_time, step, 1);
    pb_u8(&o, 0x2a);
    pb_varint(&o, summary_len);
    for (size_t i = 0; i < n; i++) {
        size_t tag_len = strlen(tags[i]);
        size_t value_len = 1 + pb_varint_size(tag_len) + tag_len + 1 + 4;
        pb_u8(&o, 0x0a); /* Summary.value */
        pb_varint(&o, value_len);
        pb_u8(&o, 0x0a); /* Value.tag */
        pb_varint(&o, tag_len);
        pb_bytes(&o, tags[i], tag_len);
        pb_u8(&o, 0x15); /* Value.simple_value */
        pb_float(&o, values[i]);
    }
    if (o.overflow || o.len > INT_MAX)
        return error_set(FSDP_ERANGE, "tfevents: event of %zu scalars does not fit in %zu bytes", n, cap);
    return (int)o.len;
}

int tfevents_frame_record(uint8_t *out, size_t cap, const uint8_t *data, size_t len)
{
    if (cap < len + TFEVENTS_FRAME_OVERHEAD || len + TFEVENTS_FRAME_OVERHEAD > INT_MAX)
        return error_set(FSDP_ERANGE, "tfevents: record of %zu bytes does not fit in %zu", len, cap);
    struct pb_out o = {out, cap, 0, 0};
    pb_le(&o, len, 8);
    pb_le(&o, crc32c_mask(crc32c(out, 8)), 4);
    pb_bytes(&o, data, len);
    pb_le(&o, crc32c_mask(crc32c(data, len)), 4);
    return (int)o.len;
}

static int tfevents_write_record(struct tfevents_writer *w, const uint8_t *data, size_t len)
{
    uint8_t stack[1024];
    size_t cap = len + TFEVENTS_FRAME_OVERHEAD;
    uint8_t *rec = cap <= sizeof stack ? stack : malloc(cap);
    if (!rec)
        return error_set(FSDP_ENOMEM, "tfevents: out of memory for a %zu-byte record", cap);
    int n, rc = 0;
    FSDP_TRY_GOTO(n = tfevents_frame_record(rec, cap, data, len), rc, out);
    /* One write per record: a reader (or a crash) never sees half a record unless the disk fills up. */
    size_t done = 0;
    while (done < (size_t)n) {
        ssize_t k = write(w->fd, rec + done, (size_t)n - done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            rc = error_set(FSDP_EIO, "tfevents: cannot write %s: %s", w->path, strerror(errno));
            goto out;
        }
        done += (size_t)k;
    }
out:
    if (rec != stack)
        free(rec);
    return rc;
}

int tfevents_write_scalars(struct tfevents_writer *w, double wall_time, int64_t step, size_t n,
                           const char *const *tags, const float *values)
{
    size_t cap = 32;
    for (size_t i = 0; i < n; i++)
        cap += strlen(tags[i]) + 32;
    uint8_t stack[1024];
    uint8_t *buf = cap <= sizeof stack ? stack : malloc(cap);
    if (!buf)
        return error_set(FSDP_ENOMEM, "tfevents: out of memory for %zu scalars", n);
    int len, rc = 0;
    FSDP_TRY_GOTO(len = tfevents_encode_scalars(buf, cap, wall_time, step, n, tags, values), rc, out);
    FSDP_TRY_GOTO(tfevents_write_record(w, buf, (size_t)len), rc, out);
out:
    if (buf != stack)
        free(buf);
    return rc;
}

int tfevents_write_session_start(struct tfevents_writer *w, double wall_time, int64_t step)
{
    uint8_t buf[64];
    int len = tfevents_encode_session_start(buf, sizeof buf, wall_time, step);
    return len < 0 ? len : tfevents_write_record(w, buf, (size_t)len);
}

static double tfevents_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tfevents_open(const char *dir, struct tfevents_writer **out)
{
    *out = NULL;
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0)
        strcpy(host, "localhost");
    host[sizeof host - 1] = '\0';
    double now = tfevents_now();
    struct tfevents_writer *w = calloc(1, sizeof *w);
    if (!w)
        return error_set(FSDP_ENOMEM, "tfevents: out of memory");
    w->fd = -1;
    int rc = 0;
    /* A restarted job can start within the same second as the run it replaces; O_EXCL and a .<pid>.<n>
     * suffix keep the earlier file intact rather than interleaving two runs in one file. */
    for (int attempt = 0; attempt < 100 && w->fd < 0; attempt++) {
        free(w->path);
        int n = attempt == 0 ? asprintf(&w->path, "%s/events.out.tfevents.%lld.%s", dir, (long long)now, host)
                             : asprintf(&w->path, "%s/events.out.tfevents.%lld.%s.%ld.%d", dir, (long long)now,
                                        host, (long)getpid(), attempt);
        if (n < 0) {
            w->path = NULL;
            rc = error_set(FSDP_ENOMEM, "tfevents: out of memory");
            goto fail;
        }
        w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (w->fd < 0 && errno != EEXIST)
            break;
    }
    if (w->fd < 0) {
        rc = error_set(FSDP_EIO, "tfevents: cannot create %s: %s (check that the log directory exists "
                                 "and is writable)", w->path, strerror(errno));
        goto fail;
    }
    uint8_t buf[64];
    int len;
    FSDP_TRY_GOTO(len = tfevents_encode_version(buf, sizeof buf, now), rc, fail);
    FSDP_TRY_GOTO(tfevents_write_record(w, buf, (size_t)len), rc, fail);
    *out = w;
    return 0;
fail:
    tfevents_close(w);
    return rc;
}

const char *tfevents_path(const struct tfevents_writer *w) { return w->path; }

void tfevents_close(struct tfevents_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    free(w->path);
    free(w);
}
