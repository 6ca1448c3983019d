/* mkdir -p: every program creates nested output directories (logs, metrics, checkpoints). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/fs.h"

int fs_mkdir_p(const char *dir, const char *what)
{
    char tmp[PATH_MAX];
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
