/* fsdp-prepare-data's inputs (prepare_input.h): compressed files read through zlib and libzstd, JSON Lines
 * through cJSON. A file is read once, up to the size it had when opened; compressed data is decompressed
 * from those bytes. */
#include "worker/tools/prepare_input.h"

#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

/* Grows *buf to hold at least need bytes (doubling), never past max: past it the input is refused. */
static int grow(unsigned char **buf, size_t *cap, size_t need, size_t max, const char *path)
{
    if (need <= *cap)
        return 0;
    if (need > max)
        return error_set(FSDP_ERANGE, "%s: more than %zu bytes once decompressed (the bound on one input file); "
                         "split it into smaller files", path, max);
    size_t c = *cap ? *cap : 65536;
    while (c < need)
        c = c > max / 2 ? max : 2 * c;
    unsigned char *p = realloc(*buf, c);
    if (!p)
        return error_set(FSDP_ENOMEM, "%s: out of memory", path);
    *buf = p;
    *cap = c;
    return 0;
}

/* Reads at most the size the file had when it was opened (fstat on the descriptor): a file that grows while
 * it is read (a log being written, a download still running) would otherwise be read for as long as it grows,
 * and its tail would be a partial record. What was appended is left out, with a warning. */
int prepare_input_read_file(const char *path, const char *what, size_t max, unsigned char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    int fd = fs_open_regular(path, what);
    if (fd < 0)
        return fd;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = error_set(FSDP_EIO, "%s %s: cannot stat: %s", what, path, strerror(errno));
        goto out;
    }
    size_t size = (size_t)st.st_size;
    if ((uint64_t)st.st_size > (uint64_t)max) {
        rc = error_set(FSDP_ERANGE, "%s: more than %zu bytes (the bound on one input file)", path, max);
        goto out;
    }
    if (!(*data = malloc(size ? size : 1))) {
        rc = error_set(FSDP_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    while (*len < size) {
        ssize_t k = read(fd, *data + *len, size - *len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            rc = error_set(FSDP_EIO, "%s: read error: %s", path, strerror(errno));
            goto out;
        }
        if (k == 0)
            break; /* truncated while read: what is there is the file */
        *len += (size_t)k;
    }
    struct stat now;
    if (fstat(fd, &now) == 0 && now.st_size > st.st_size)
        log_warn("%s grew while it was read (from %lld to %lld bytes): only its first %lld bytes, its size when it "
                 "was opened, are used", path, (long long)st.st_size, (long long)now.st_size, (long long)st.st_size);
out:
    close(fd);
    if (rc < 0) {
        free(*data);
        *data = NULL;
        *len = 0;
    }
    return rc;
}

/* gzip members, concatenated ones too, from the bytes read; after the last member anything that is not
 * another member is ignored, as gzip -d and zlib's gzread do. */
static int read_gzip(const char *path, size_t max, const unsigned char *src, size_t src_len, unsigned char **data,
                     size_t *len)
{
    z_stream z = {0};
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK)
        return error_set(FSDP_ENOMEM, "%s: out of memory", path);
    size_t cap = 0, pos = 0;
    int rc = 0, zr = Z_OK;
    for (;;) {
        FSDP_TRY_GOTO(grow(data, &cap, *len + 65536, max + 65536, path), rc, out);
        size_t in_n = src_len - pos > (1u << 30) ? (1u << 30) : src_len - pos;
        size_t out_n = cap - *len > (1u << 30) ? (1u << 30) : cap - *len;
        z.next_in = (unsigned char *)src + pos;
        z.avail_in = (uInt)in_n;
        z.next_out = *data + *len;
        z.avail_out = (uInt)out_n;
        zr = inflate(&z, Z_NO_FLUSH);
        pos += in_n - z.avail_in;
        *len += out_n - z.avail_out;
        if (*len > max) {
            rc = grow(data, &cap, *len, max, path);
            goto out;
        }
        if (zr == Z_STREAM_END) {
            if (src_len - pos < 2 || src[pos] != 0x1f || src[pos + 1] != 0x8b)
                break;
            inflateReset(&z);
            continue;
        }
        if (zr != Z_OK && zr != Z_BUF_ERROR) {
            rc = error_set(FSDP_EIO, "%s: not valid gzip: %s", path, z.msg ? z.msg : "data error");
            goto out;
        }
        if (pos == src_len && z.avail_out > 0) {
            rc = error_set(FSDP_EIO, "%s: not valid gzip: unexpected end of file", path);
            goto out;
        }
    }
out:
    inflateEnd(&z);
    return rc;
}

static int read_zstd(const char *path, size_t max, const unsigned char *src, size_t src_len, unsigned char **data,
                     size_t *len)
{
    ZSTD_DStream *z = ZSTD_createDStream();
    if (!z)
        return error_set(FSDP_ENOMEM, "%s: out of memory", path);
    ZSTD_initDStream(z);
    ZSTD_inBuffer in = {src, src_len, 0};
    size_t cap = 0, last = 1;
    int rc = 0;
    while (in.pos < in.size) {
        FSDP_TRY_GOTO(grow(data, &cap, *len + ZSTD_DStreamOutSize(), max + ZSTD_DStreamOutSize(), path), rc, out);
        ZSTD_outBuffer o = {*data, cap, *len};
        last = ZSTD_decompressStream(z, &o, &in);
        if (ZSTD_isError(last)) {
            rc = error_set(FSDP_EIO, "%s: not valid zstd: %s", path, ZSTD_getErrorName(last));
            goto out;
        }
        *len = o.pos;
        if (*len > max) {
            rc = grow(data, &cap, *len, max, path);
            goto out;
        }
    }
    if (last != 0) /* the last frame stopped in the middle */
        rc = error_set(FSDP_EIO, "%s: truncated zstd data", path);
out:
    ZSTD_freeDStream(z);
    return rc;
}

int prepare_input_read(const char *path, size_t max_bytes, unsigned char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    unsigned char *raw;
    size_t raw_len;
    int rc = prepare_input_read_file(path, "input file", max_bytes, &raw, &raw_len);
    if (rc < 0)
        return rc;
    static const unsigned char gz[2] = {0x1f, 0x8b}, zst[4] = {0x28, 0xb5, 0x2f, 0xfd};
    if (raw_len >= 2 && memcmp(raw, gz, 2) == 0) {
        rc = read_gzip(path, max_bytes, raw, raw_len, data, len);
        free(raw);
    } else if (raw_len >= 4 && memcmp(raw, zst, 4) == 0) {
        rc = read_zstd(path, max_bytes, raw, raw_len, data, len);
        free(raw);
    } else {
        *data = raw;
        *len = raw_len;
        return 0;
    }
    if (rc < 0) {
        free(*data);
        *data = NULL;
        *len = 0;
    }
    return rc;
}

static bool ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && strncmp(s + n - k, suffix, k) == 0;
}

bool prepare_input_is_jsonl(const char *path)
{
    size_t n = strlen(path);
    if (ends_with(path, n, ".gz"))
        n -= 3;
    else if (ends_with(path, n, ".zst"))
        n -= 4;
    return ends_with(path, n, ".jsonl") || ends_with(path, n, ".json");
}

int prepare_input_jsonl(const char *path, const unsigned char *data, size_t len, size_t first_line, const char *field,
                        bool skip_bad, size_t *bad, int (*fn)(void *ctx, const struct prepare_doc *doc), void *ctx)
{
    size_t line = first_line - 1, pos = 0;
    char *buf = NULL;
    size_t buf_cap = 0;
    int rc = 0;
    while (pos < len) {
        const unsigned char *nl = memchr(data + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - data) : len, n = end - pos;
        line++;
        const char *start = (const char *)data + pos;
        pos = end + 1;
        size_t lead = 0;
        while (lead < n && (start[lead] == ' ' || start[lead] == '\t' || start[lead] == '\r'))
            lead++;
        if (lead == n)
            continue; /* a blank line */
        if (n + 1 > buf_cap) {
            char *b = realloc(buf, n + 1);
            if (!b) {
                rc = error_set(FSDP_ENOMEM, "out of memory");
                goto out;
            }
            buf = b;
            buf_cap = n + 1;
        }
        memcpy(buf, start, n);
        buf[n] = '\0';
        cJSON *obj = cJSON_ParseWithLength(buf, n);
        const cJSON *v = cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, field) : NULL;
        if (!cJSON_IsString(v)) {
            const char *why = !obj ? "is not JSON" : !cJSON_IsObject(obj) ? "is not a JSON object"
                              : v ? "has a field that is not a string" : "has no such field";
            cJSON_Delete(obj);
            if (skip_bad) {
                (*bad)++;
                continue;
            }
            rc = error_set(FSDP_EINVAL, "%s:%zu: the line %s (the documents are the \"%s\" strings; --text-field "
                           "NAME names another field, --skip-bad-lines counts such lines instead)", path, line,
                           why, field);
            goto out;
        }
        struct prepare_doc doc = {.text = v->valuestring, .len = strlen(v->valuestring)};
        rc = fn(ctx, &doc);
        cJSON_Delete(obj);
        if (rc < 0)
            goto out;
    }
out:
    free(buf);
    return rc;
}
