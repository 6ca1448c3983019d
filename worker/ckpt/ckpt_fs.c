/* The file-system half of a checkpoint: durable writes, the atomic rename of a finished directory, the
 * `latest` pointer and pruning (name resolution is ckpt_latest.c). Ordering is the whole point here:
 * nothing that was complete is removed before its replacement is complete and durable. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/error.h"
#include "common/log.h"
#include "worker/ckpt/ckpt_internal.h"

static int io_error(const char *path, const char *what, int err)
{
    if (err == ENOSPC || err == EDQUOT || err == EFBIG)
        return error_set(FSDP_EIO,
                         "%s: %s failed: %s (disk full: free space or point [checkpoint] dir elsewhere; "
                         "earlier checkpoints are intact)",
                         path, what, strerror(err));
    return error_set(FSDP_EIO, "%s: %s failed: %s", path, what, strerror(err));
}

void ckpt_pathf(char *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, FSDP_PATH_MAX, fmt, ap);
    va_end(ap);
}

int ckpt_write_all(int fd, const void *buf, size_t n, const char *path)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return io_error(path, "write", w < 0 ? errno : ENOSPC);
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int ckpt_pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *path)
{
    const char *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return io_error(path, "write", w < 0 ? errno : ENOSPC);
        p += w;
        off += (uint64_t)w;
        n -= (size_t)w;
    }
    return 0;
}

int ckpt_write_crc(int fd, uint64_t off, const float *data, size_t count, uint32_t *crcs, const char *path)
{
    enum { CHUNK_BLOCKS = 8 };
    const char *p = (const char *)data;
    size_t bytes = count * sizeof(float);
    for (size_t done = 0, blk = 0; done < bytes; blk += CHUNK_BLOCKS) {
        size_t n = bytes - done < (size_t)CHUNK_BLOCKS * CKPT_CRC_BLOCK ? bytes - done
                                                                         : (size_t)CHUNK_BLOCKS * CKPT_CRC_BLOCK;
        for (size_t b = 0; b * CKPT_CRC_BLOCK < n; b++) {
            size_t len = n - b * CKPT_CRC_BLOCK < CKPT_CRC_BLOCK ? n - b * CKPT_CRC_BLOCK : CKPT_CRC_BLOCK;
            crcs[blk + b] = crc32c(p + done + b * CKPT_CRC_BLOCK, len);
        }
        FSDP_TRY(ckpt_pwrite_all(fd, p + done, n, off + done, path));
        /* Only a hint: where unsupported, the fsync at the end does all the work. */
        sync_file_range(fd, (off_t)(off + done), (off_t)n, SYNC_FILE_RANGE_WRITE);
        done += n;
    }
    return 0;
}

int ckpt_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path)
{
    char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return error_set(FSDP_EIO, "%s: read failed: %s", path, strerror(errno));
        if (r == 0)
            return error_set(FSDP_EIO, "%s: file ends at byte %llu, before the data the metadata records "
                                       "(truncated checkpoint file)",
                             path, (unsigned long long)off);
        p += r;
        off += (uint64_t)r;
        n -= (size_t)r;
    }
    return 0;
}

int ckpt_crc_prefix(int fd, uint64_t bytes, uint32_t *crc, const char *path)
{
    char buf[65536];
    uint32_t c = 0;
    for (uint64_t off = 0; off < bytes;) {
        size_t n = bytes - off < sizeof buf ? (size_t)(bytes - off) : sizeof buf;
        FSDP_TRY(ckpt_pread_all(fd, buf, n, off, path));
        c = crc32c_update(c, buf, n);
        off += n;
    }
    *crc = c;
    return 0;
}

int ckpt_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return error_set(FSDP_EIO, "%s: cannot open directory: %s", dir, strerror(errno));
    int rc = fsync(fd) == 0 ? 0 : io_error(dir, "fsync", errno);
    close(fd);
    return rc;
}

int ckpt_mkdir(const char *dir)
{
    if (mkdir(dir, 0755) == 0 || errno == EEXIST)
        return 0;
    /* The parent may be missing too (a fresh [checkpoint] dir two levels deep). */
    char tmp[FSDP_PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *s = tmp + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                break;
            *s = '/';
        }
    if (mkdir(dir, 0755) == 0 || errno == EEXIST)
        return 0;
    return io_error(dir, "mkdir", errno);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)ftw;
    if (flag == FTW_DP)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

void ckpt_remove_tree(const char *path)
{
    nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int64_t ckpt_name_step(const char *name)
{
    const char *digits = NULL;
    if (strncmp(name, "fsdp_sharded_cpt", 16) == 0)
        digits = name + 16;
    else if (strncmp(name, "fsdp_cpt", 8) == 0)
        digits = name + 8;
    if (!digits || !*digits)
        return -1;
    int64_t v = 0;
    for (const char *c = digits; *c; c++) {
        if (*c < '0' || *c > '9' || v > INT64_MAX / 10 - 10)
            return -1;
        v = v * 10 + (*c - '0');
    }
    return v;
}

static int write_latest(const char *root, const char *name)
{
    char tmp[FSDP_PATH_MAX], final[FSDP_PATH_MAX];
    snprintf(final, sizeof final, "%s/%s", root, CKPT_LATEST);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", root, CKPT_LATEST);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return io_error(tmp, "create", errno);
    char line[FSDP_PATH_MAX];
    int n = snprintf(line, sizeof line, "%s\n", name);
    int rc = 0;
    FSDP_TRY_GOTO(ckpt_write_all(fd, line, (size_t)n, tmp), rc, fail);
    if (fsync(fd) != 0) {
        rc = io_error(tmp, "fsync", errno);
        goto fail;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, final) != 0) {
        rc = io_error(final, "rename", errno);
        goto fail;
    }
    return ckpt_fsync_dir(root);
fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    return rc;
}

struct found {
    char name[256];
    int64_t step;
};

static int cmp_found_desc(const void *a, const void *b)
{
    const struct found *x = a, *y = b;
    return (x->step < y->step) - (x->step > y->step);
}

/* Keeps the keep_last newest complete checkpoints (by step) and always `keep` (the one just written). */
static void prune(const char *root, const char *keep, int keep_last)
{
    if (keep_last <= 0)
        return;
    DIR *d = opendir(root);
    if (!d)
        return;
    struct found *list = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t step = ckpt_name_step(e->d_name);
        if (step < 0 || strlen(e->d_name) >= sizeof list->name)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            struct found *nl = realloc(list, cap * sizeof *list);
            if (!nl)
                break;
            list = nl;
        }
        snprintf(list[n].name, sizeof list[n].name, "%s", e->d_name);
        list[n++].step = step;
    }
    closedir(d);
    qsort(list, n, sizeof *list, cmp_found_desc);
    int kept = 1; /* `keep` itself */
    for (size_t i = 0; i < n; i++) {
        if (strcmp(list[i].name, keep) == 0)
            continue;
        if (kept < keep_last) {
            kept++;
            continue;
        }
        char path[FSDP_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", root, list[i].name);
        log_info("checkpoint: removing %s (keep_last %d)", path, keep_last);
        ckpt_remove_tree(path);
    }
    free(list);
    ckpt_fsync_dir(root);
}

int ckpt_commit_dir(const char *root, const char *tmp, const char *name, int keep_last)
{
    char final[FSDP_PATH_MAX];
    snprintf(final, sizeof final, "%s/%s", root, name);
    FSDP_TRY(ckpt_fsync_dir(tmp));
    /* A committed checkpoint is never replaced: it may be the only copy of another run's (or an earlier
     * attempt's) state. The worker refuses such a run before it starts (docs/checkpoints.md). */
    struct stat st;
    if (lstat(final, &st) == 0)
        return error_set(FSDP_EEXIST, "%s already exists: a committed checkpoint is never replaced; move it "
                         "away or save into another [checkpoint] dir", final);
    if (rename(tmp, final) != 0)
        return io_error(final, "rename", errno);
    FSDP_TRY(ckpt_fsync_dir(root));
    FSDP_TRY(write_latest(root, name));
    prune(root, name, keep_last);
    return 0;
}

static int copy_file(const char *src, const char *dst)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return io_error(src, "open", errno);
    int rc = 0;
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        rc = io_error(dst, "create", errno);
        goto done;
    }
    char buf[1 << 16];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = io_error(src, "read", errno);
            goto done;
        }
        FSDP_TRY_GOTO(ckpt_write_all(out, buf, (size_t)n, dst), rc, done);
    }
    if (fsync(out) != 0)
        rc = io_error(dst, "fsync", errno);
done:
    close(in);
    if (out >= 0 && close(out) != 0 && rc == 0)
        rc = io_error(dst, "close", errno);
    return rc;
}

int ckpt_copy_tokenizer(const char *dir, const char *src)
{
    if (!src || !*src)
        return 0;
    char dst[FSDP_PATH_MAX], side[FSDP_PATH_MAX], parent[FSDP_PATH_MAX];
    ckpt_pathf(dst, "%s/tokenizer.json", dir);
    FSDP_TRY(copy_file(src, dst));
    const char *slash = strrchr(src, '/');
    snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash - src) : 1, slash ? src : ".");
    static const char *const extra[] = {"tokenizer_config.json", "special_tokens_map.json", NULL};
    struct stat st;
    for (int i = 0; extra[i]; i++) {
        ckpt_pathf(side, "%s/%s", parent, extra[i]);
        if (stat(side, &st) != 0)
            continue;
        ckpt_pathf(dst, "%s/%s", dir, extra[i]);
        FSDP_TRY(copy_file(side, dst));
    }
    return 0;
}
