/* mkdir -p and atomic file replacement: every program creates nested output directories (logs, metrics,
 * checkpoints) and writes files that must never be seen half-written. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fs.h"

int fs_path_format(char *out, size_t cap, const char *what, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < cap)
        return 0;
    /* out holds the path's first cap - 1 bytes: enough to say which one it is */
    return error_set(FSDP_ERANGE, "%s: the path \"%.200s...\" is %d bytes, over the %zu a path may have here: "
                     "use a shorter directory", what, cap ? out : "", n, cap ? cap - 1 : 0);
}

int fs_mkdir_p(const char *dir, const char *what)
{
    char tmp[FSDP_PATH_MAX];
    int n = snprintf(tmp, sizeof tmp, "%s", dir);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return error_set(FSDP_ERANGE, "%s path too long: %s", what, dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(tmp, 0755) && errno != EEXIST)
            return error_set(FSDP_EIO, "cannot create %s %s: %s", what, tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) && errno != EEXIST)
        return error_set(FSDP_EIO, "cannot create %s %s: %s", what, tmp, strerror(errno));
    return 0;
}

int fs_create_temp(const char *path, char *tmp, size_t cap)
{
    /* O_EXCL with a name from the pid, the clock and a counter: unique without mkstemp, whose fixed 0600
     * mode would ignore the umask a user chose for the files they make. */
    static unsigned counter;
    for (int attempt = 0; attempt < 100; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned long tag = ((unsigned long)ts.tv_nsec ^ ((unsigned long)getpid() << 20)) +
                            __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED) * 7919ul;
        int n = snprintf(tmp, cap, "%s.tmp.%lx", path, tag);
        if (n < 0 || (size_t)n >= cap)
            return error_set(FSDP_ERANGE, "%s: path too long", path);
        int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0)
            return fd;
        if (errno != EEXIST)
            return error_set(FSDP_EIO, "%s: cannot create a temporary file beside it: %s", path, strerror(errno));
    }
    return error_set(FSDP_EIO, "%s: cannot create a temporary file beside it: every name tried exists", path);
}

int fs_commit_temp(int fd, const char *tmp, const char *path)
{
    int rc = 0;
    if (fsync(fd) != 0)
        rc = error_set(FSDP_EIO, "%s: fsync: %s", path, strerror(errno));
    if (close(fd) != 0 && rc == 0)
        rc = error_set(FSDP_EIO, "%s: close: %s", path, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = error_set(FSDP_EIO, "%s: rename from %s: %s", path, tmp, strerror(errno));
    if (rc != 0) {
        unlink(tmp);
        return rc;
    }
    /* The rename is durable only once the directory entry itself is synced. */
    char *dcopy = strdup(path);
    int dfd = dcopy ? open(dirname(dcopy), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(dcopy);
    return 0;
}

int fs_write_atomic(const char *path, const void *data, size_t bytes)
{
    char tmp[FSDP_PATH_MAX + 32]; /* path and fs_create_temp's ".tmp.<hex>" */
    int fd = fs_create_temp(path, tmp, sizeof tmp);
    if (fd < 0)
        return fd;
    const char *p = data;
    while (bytes > 0) {
        ssize_t w = write(fd, p, bytes);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int rc = error_set(FSDP_EIO, "%s: write failed: %s", path, w < 0 ? strerror(errno) : "no progress");
            close(fd);
            unlink(tmp);
            return rc;
        }
        p += w;
        bytes -= (size_t)w;
    }
    return fs_commit_temp(fd, tmp, path);
}

int fs_open_regular(const char *path, const char *what)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return error_set(e == ENOENT ? FSDP_ENOTFOUND : FSDP_EIO, "%s %s: cannot open: %s", what, path,
                         strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return error_set(FSDP_EIO, "%s %s: cannot stat: %s", what, path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        const char *kind = S_ISFIFO(st.st_mode)  ? "a FIFO"
                           : S_ISDIR(st.st_mode)  ? "a directory"
                           : S_ISSOCK(st.st_mode) ? "a socket"
                           : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                       : "a special file";
        return error_set(FSDP_EINVAL, "%s %s is not a regular file (it is %s); give a regular file", what, path,
                         kind);
    }
    /* O_NONBLOCK was only for the open: a regular file reads the same either way, but a caller that hands
     * the descriptor to fdopen or mmap expects ordinary blocking semantics */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}
