/* Helpers shared by the worker tests: temp directories that are removed afterwards, token files. */
#ifndef FSDP_TESTS_WORKER_WTEST_H
#define FSDP_TESTS_WORKER_WTEST_H

#include <criterion/criterion.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int wtest_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static inline void wtest_rm_tree(const char *dir) { nftw(dir, wtest_rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static inline void wtest_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

/* Reads a whole file into a malloc'd buffer (NUL-terminated for convenience). */
static inline char *wtest_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    size_t k;
    while ((k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap)
            buf = realloc(buf, (cap *= 2) + 1);
    }
    fclose(f);
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}

#endif
