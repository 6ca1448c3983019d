#include "tests/util/tu_file.h"

#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

char *tu_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    while (s) {
        if (n + 4096 + 1 > cap) {
            char *t = realloc(s, cap *= 2);
            if (!t) {
                free(s);
                s = NULL;
                break;
            }
            s = t;
        }
        size_t r = fread(s + n, 1, 4096, f);
        n += r;
        if (r == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (s && bad) {
        free(s);
        errno = EIO;
        return NULL;
    }
    if (!s) {
        errno = ENOMEM;
        return NULL;
    }
    s[n] = 0;
    if (len)
        *len = n;
    return s;
}

char *tu_slurp(const char *path)
{
    char *s = tu_read_file(path, NULL);
    return s || errno == ENOMEM ? s : strdup("");
}

int tu_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int bad = fwrite(data, 1, len, f) != len;
    bad |= fclose(f) != 0;
    return bad ? -1 : 0;
}

int tu_write_text(const char *path, const char *text) { return tu_write_file(path, text, strlen(text)); }

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0; /* go on: what stays is found by the check below */
}

int tu_rm_tree(const char *dir)
{
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    struct stat st;
    return lstat(dir, &st) == 0 ? -1 : 0;
}

bool tu_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

char *tu_pathf_or_exit(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) {
        fprintf(stderr, "path too long (%d bytes, room for %zu): %s...\n", n, cap - 1, buf);
        exit(2);
    }
    return buf;
}
