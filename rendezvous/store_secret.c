/* Where a job's store secret comes from: the environment, or a file only its owner can read (the way ssh
 * treats private keys: a file others can read is refused, not used). */
#include "rendezvous/store_auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fs.h"
#include "common/settings.h"

#define SECRET_FILE_MAX 4096

static void default_path(char *out, size_t cap)
{
    const char *xdg = getenv("XDG_CONFIG_HOME");
    const char *home = getenv("HOME");
    if (xdg && xdg[0] == '/')
        snprintf(out, cap, "%s/fsdpc/rdzv_token", xdg);
    else if (home && *home)
        snprintf(out, cap, "%s/.config/fsdpc/rdzv_token", home);
    else
        out[0] = 0;
}

static int read_secret_file(const char *path, char **secret)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return error_set(FSDP_EIO, "cannot read the store secret file %s: %s", path, strerror(errno));
    struct stat st;
    char buf[SECRET_FILE_MAX + 1];
    size_t n = 0;
    ssize_t got;
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = error_set(FSDP_EIO, "cannot read the store secret file %s: %s", path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = error_set(FSDP_EINVAL, "the store secret file %s is not a regular file", path);
        goto done;
    }
    if (st.st_uid != getuid()) {
        rc = error_set(FSDP_EINVAL, "the store secret file %s belongs to uid %u, not to you (uid %u): use a file of "
                       "your own", path, (unsigned)st.st_uid, (unsigned)getuid());
        goto done;
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        rc = error_set(FSDP_EINVAL, "the store secret file %s is accessible by others (mode %03o): run chmod 600 %s",
                       path, (unsigned)(st.st_mode & 0777), path);
        goto done;
    }
    if (st.st_size > SECRET_FILE_MAX) {
        rc = error_set(FSDP_EINVAL, "the store secret file %s has %lld bytes, more than %d", path,
                       (long long)st.st_size, SECRET_FILE_MAX);
        goto done;
    }
    if ((got = read(fd, buf, SECRET_FILE_MAX)) < 0) {
        rc = error_set(FSDP_EIO, "cannot read the store secret file %s: %s", path, strerror(errno));
        goto done;
    }
    n = (size_t)got < SECRET_FILE_MAX ? (size_t)got : SECRET_FILE_MAX;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--;
    buf[n] = 0;
    if (n == 0)
        rc = error_set(FSDP_EINVAL, "the store secret file %s is empty", path);
    else if (strlen(buf) != n)
        rc = error_set(FSDP_EINVAL, "the store secret file %s holds a NUL byte: write the secret as text", path);
    else if (!(*secret = strdup(buf)))
        rc = error_set(FSDP_ENOMEM, "out of memory");
done:
    close(fd);
    return rc;
}

int store_secret_load(char **secret, enum store_secret_source *source, char *path, size_t cap)
{
    *secret = NULL;
    *source = STORE_SECRET_NONE;
    if (cap)
        path[0] = 0;
    const char *env = settings_get_raw(SETTING_RDZV_TOKEN);
    if (env) {
        *secret = strdup(env);
        if (!*secret)
            return error_set(FSDP_ENOMEM, "out of memory");
        *source = STORE_SECRET_ENV;
        return 0;
    }
    char def[FSDP_PATH_MAX];
    const char *file = settings_get_raw(SETTING_RDZV_TOKEN_FILE);
    if (!file) {
        default_path(def, sizeof def);
        /* The default file is optional; one named in FSDP_RDZV_TOKEN_FILE is not. */
        struct stat st;
        if (!def[0] || (lstat(def, &st) != 0 && errno == ENOENT))
            return 0;
        file = def;
    }
    if (cap)
        snprintf(path, cap, "%s", file);
    int rc = read_secret_file(file, secret);
    if (rc == 0)
        *source = STORE_SECRET_FILE;
    return rc;
}
