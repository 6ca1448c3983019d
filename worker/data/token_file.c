#include "worker/data/token_file.h"

#include "common/error.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int write_all(int fd, const void *buf, size_t len, const char *path)
{
    const char *p = buf;
    while (len) {
        ssize_t k = write(fd, p, len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return error_set(FSDP_EIO, "%s: cannot write: %s", path, k < 0 ? strerror(errno) : "short write");
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

int token_file_open(struct token_file *f, const char *dir, const char *name, enum data_format format)
{
    f->fd = -1;
    f->format = format;
    f->tokens = 0;
    f->buffered = 0;
    f->final_path = f->tmp_path = NULL;
    if (asprintf(&f->final_path, "%s/%s", dir, name) < 0 || asprintf(&f->tmp_path, "%s/.%s.XXXXXX", dir, name) < 0) {
        f->tmp_path = NULL;
        return error_set(FSDP_ENOMEM, "out of memory");
    }
    f->fd = mkstemp(f->tmp_path);
    if (f->fd < 0) {
        free(f->tmp_path);
        f->tmp_path = NULL;
        return error_set(FSDP_EIO, "%s: cannot create a file in the output directory: %s", f->final_path,
                         strerror(errno));
    }
    if (format != DATA_FORMAT_NANOGPT) {
        int32_t header[DATA_LLMC_HEADER_INTS] = {0}; /* the count is filled in at commit */
        return write_all(f->fd, header, sizeof header, f->tmp_path);
    }
    return 0;
}

static int flush(struct token_file *f)
{
    int rc = write_all(f->fd, f->buf, f->buffered, f->tmp_path);
    f->buffered = 0;
    return rc;
}

/* Little-endian hosts only (the build targets x86-64 and arm64): the in-memory integers are the format.
 * Whole buffers at a time, in loops the compiler vectorizes: with -j this runs on the one writing thread,
 * beside the encoding threads, and was its largest cost. */
int token_file_put(struct token_file *f, const uint32_t *ids, size_t n)
{
    size_t tb = (size_t)data_format_token_bytes(f->format);
    for (size_t done = 0; done < n;) {
        if (sizeof f->buf - f->buffered < tb)
            FSDP_TRY(flush(f));
        size_t k = (sizeof f->buf - f->buffered) / tb;
        if (k > n - done)
            k = n - done;
        const uint32_t *src = ids + done;
        unsigned char *dst = f->buf + f->buffered;
        if (tb == 4) {
            memcpy(dst, src, k * 4);
        } else {
            uint32_t high = 0;
            for (size_t i = 0; i < k; i++)
                high |= src[i];
            if (high > UINT16_MAX) {
                size_t i = 0;
                while (src[i] <= UINT16_MAX)
                    i++;
                return error_set(FSDP_ERANGE, "%s: token id %u does not fit the uint16 tokens of the %s format",
                                 f->final_path, src[i], data_format_name(f->format));
            }
            for (size_t i = 0; i < k; i++) {
                uint16_t v = (uint16_t)src[i];
                memcpy(dst + 2 * i, &v, 2);
            }
        }
        f->buffered += k * tb;
        done += k;
    }
    f->tokens += (int64_t)n;
    return 0;
}

int token_file_put_bytes(struct token_file *f, const unsigned char *bytes, size_t n)
{
    uint32_t ids[1024];
    for (size_t off = 0; off < n; off += 1024) {
        size_t k = n - off < 1024 ? n - off : 1024;
        for (size_t i = 0; i < k; i++)
            ids[i] = bytes[off + i];
        FSDP_TRY(token_file_put(f, ids, k));
    }
    return 0;
}

int token_file_commit(struct token_file *f)
{
    FSDP_TRY(flush(f));
    if (f->format != DATA_FORMAT_NANOGPT) {
        if (f->tokens > INT32_MAX)
            return error_set(FSDP_ERANGE, "%s: %lld tokens do not fit llm.c's int32 count; use the nanoGPT "
                             "format", f->final_path, (long long)f->tokens);
        bool u32 = f->format == DATA_FORMAT_LLMC_U32;
        int32_t head[3] = {u32 ? DATA_LLMC_U32_MAGIC : DATA_LLMC_MAGIC,
                           u32 ? DATA_LLMC_U32_VERSION : DATA_LLMC_VERSION, (int32_t)f->tokens};
        if (pwrite(f->fd, head, sizeof head, 0) != (ssize_t)sizeof head)
            return error_set(FSDP_EIO, "%s: cannot write the header: %s", f->tmp_path, strerror(errno));
    }
    if (fsync(f->fd) != 0)
        return error_set(FSDP_EIO, "%s: fsync failed: %s", f->tmp_path, strerror(errno));
    if (fchmod(f->fd, 0644) != 0)
        return error_set(FSDP_EIO, "%s: chmod failed: %s", f->tmp_path, strerror(errno));
    if (rename(f->tmp_path, f->final_path) != 0)
        return error_set(FSDP_EIO, "%s: cannot rename into place: %s", f->final_path, strerror(errno));
    free(f->tmp_path);
    f->tmp_path = NULL;
    return 0;
}

void token_file_cleanup(struct token_file *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
    if (f->tmp_path)
        unlink(f->tmp_path);
    free(f->tmp_path);
    free(f->final_path);
    f->tmp_path = f->final_path = NULL;
}

int token_file_write_small(const char *dir, const char *name, const void *data, size_t len)
{
    struct token_file *f = malloc(sizeof *f);
    if (!f)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    FSDP_TRY_GOTO(token_file_open(f, dir, name, DATA_FORMAT_NANOGPT), rc, out);
    FSDP_TRY_GOTO(write_all(f->fd, data, len, f->tmp_path), rc, out);
    FSDP_TRY_GOTO(token_file_commit(f), rc, out);
out:
    token_file_cleanup(f);
    free(f);
    return rc;
}
