/* One job per checkpoint directory: the saving job holds an flock on <dir>/.lock for its whole run, so a
 * second job given the same directory (the same run id in the same working directory) is refused before
 * it writes anything, instead of interleaving its saves with the first one's. The file holds the holder's
 * description for the refusal message; the lock itself is the kernel's and goes away with the process,
 * however it ends. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "worker/ckpt/ckpt_internal.h"

static void holder_text(int fd, char *out, size_t cap)
{
    ssize_t n = pread(fd, out, cap - 1, 0);
    out[n > 0 ? n : 0] = '\0';
    out[strcspn(out, "\n")] = '\0';
    if (!out[0])
        snprintf(out, cap, "unknown (the file is empty)");
}

int ckpt_lock(const char *root, const char *owner, double wait_s, int *fd_out)
{
    *fd_out = -1;
    char path[FSDP_PATH_MAX];
    ckpt_pathf(path, "%s/%s", root, CKPT_LOCK_FILE);
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0)
        return error_set(FSDP_EIO, "%s: cannot open the checkpoint directory's lock file: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return error_set(FSDP_EINVAL, "%s is not a regular file; remove it", path);
    }
    double t0 = clock_now_s();
    bool said = false;
    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            break;
        int err = errno;
        char holder[512];
        holder_text(fd, holder, sizeof holder);
        if (err != EWOULDBLOCK && err != EINTR) {
            close(fd);
            return error_set(FSDP_EIO, "%s: flock failed: %s", path, strerror(err));
        }
        double waited = clock_now_s() - t0;
        if (waited >= wait_s) {
            close(fd);
            return error_set(FSDP_EEXIST, "checkpoint directory %s is in use by another job: %s (it holds %s%s). "
                             "Two jobs saving into one directory would overwrite each other's checkpoints: stop "
                             "that job, or give this one another run id (--rdzv_id) or [checkpoint] dir",
                             root, holder, path, wait_s > 0 ? ", and did not release it in time" : "");
        }
        if (!said) {
            log_info("%s is held by %s; waiting up to %.0f s for it (an earlier attempt of this job stopping)",
                     path, holder, wait_s);
            said = true;
        }
        struct timespec nap = {0, 100 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    char line[768];
    int n = snprintf(line, sizeof line, "%s\n", owner);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n)
        log_warn("%s: cannot record this job in the lock file: %s", path, strerror(errno));
    *fd_out = fd;
    return 0;
}

void ckpt_unlock(int fd)
{
    if (fd >= 0)
        close(fd); /* the file stays: removing it would race a job that just opened it */
}
