/* Helpers of the tests/tools tests: a temporary directory per test, whole files, running the tools and the
 * Python peer, reading token files. */
#ifndef FSDP_TESTS_TOOLS_TOOLTEST_H
#define FSDP_TESTS_TOOLS_TOOLTEST_H

#include <criterion/criterion.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/util/tu_proc.h"
#include "tests/util/tu_venv.h"
#include "worker/train/data.h"

static char tt_dir[64];

static int tt_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static inline void tt_setup(void)
{
    strcpy(tt_dir, "/tmp/fsdp-tools-XXXXXX");
    cr_assert_not_null(mkdtemp(tt_dir));
}

static inline void tt_teardown(void) { nftw(tt_dir, tt_rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* tt_dir/rel (a static buffer per call site is not needed: callers copy) */
static inline const char *tt_path(char *buf, size_t cap, const char *rel)
{
    snprintf(buf, cap, "%s/%s", tt_dir, rel);
    return buf;
}

static inline const char *tt_src(char *buf, size_t cap, const char *rel)
{
    const char *root = getenv("FSDP_SOURCE_ROOT");
    cr_assert_not_null(root, "FSDP_SOURCE_ROOT is not set (run through meson test)");
    snprintf(buf, cap, "%s/%s", root, rel);
    return buf;
}

static inline const char *tt_bin(char *buf, size_t cap, const char *rel)
{
    const char *root = getenv("FSDP_BUILD_ROOT");
    cr_assert_not_null(root, "FSDP_BUILD_ROOT is not set (run through meson test)");
    snprintf(buf, cap, "%s/%s", root, rel);
    return buf;
}

/* The whole file, NUL-terminated; *len its size (len may be NULL). */
static inline char *tt_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    s[n] = '\0';
    if (len)
        *len = (size_t)n;
    return s;
}

static inline void tt_write(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

static inline void tt_copy(const char *from, const char *to)
{
    size_t n;
    char *s = tt_read(from, &n);
    tt_write(to, s, n);
    free(s);
}

/* Runs argv (NULL-terminated) with stdout and stderr into tt_dir/.out; returns the exit code, the output in
 * *out (malloc'ed) when out is not NULL. */
static inline int tt_run(const char *const *argv, char **out)
{
    char log[128];
    tt_path(log, sizeof log, ".out");
    int rc = tu_run(argv, log, log, NULL);
    cr_assert_neq(rc, -1, "cannot start %s", argv[0]);
    if (out)
        *out = tt_read(log, NULL);
    return rc;
}

/* The venv's python running tests/tools/tokenizer_ref.py with the arguments (printf-style); asserts exit 0
 * and returns its output. */
static inline char *tt_ref(const char *python, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline char *tt_ref(const char *python, const char *fmt, ...)
{
    static char args[16384], cmd[20480];
    char script[1024], log[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    tt_src(script, sizeof script, "tests/tools/tokenizer_ref.py");
    tt_path(log, sizeof log, ".py.out");
    snprintf(cmd, sizeof cmd, "'%s' '%s' %s > '%s' 2>&1", python, script, args, log);
    int rc = tu_sh(cmd);
    char *out = tt_read(log, NULL);
    cr_assert_eq(rc, 0, "tokenizer_ref.py %s failed:\n%s", args, out);
    return out;
}

/* Token ids of a token file of any format, as uint32. */
static inline uint32_t *tt_tokens(const char *path, size_t *n, enum data_format *fmt)
{
    size_t len;
    char *raw = tt_read(path, &len);
    int32_t head[3] = {0, 0, 0};
    if (len >= 12)
        memcpy(head, raw, sizeof head);
    size_t hdr = 0, tb = 2;
    *fmt = DATA_FORMAT_NANOGPT;
    if (head[0] == DATA_LLMC_MAGIC || head[0] == DATA_LLMC_U32_MAGIC) {
        hdr = 1024;
        tb = head[0] == DATA_LLMC_U32_MAGIC ? 4 : 2;
        *fmt = tb == 4 ? DATA_FORMAT_LLMC_U32 : DATA_FORMAT_LLMC;
        cr_assert_eq(head[1], tb == 4 ? DATA_LLMC_U32_VERSION : DATA_LLMC_VERSION);
        cr_assert_eq((size_t)head[2] * tb, len - hdr, "%s: header count", path);
    }
    *n = (len - hdr) / tb;
    uint32_t *ids = malloc((*n + 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++) {
        if (tb == 4) {
            memcpy(&ids[i], raw + hdr + 4 * i, 4);
        } else {
            uint16_t v;
            memcpy(&v, raw + hdr + 2 * i, 2);
            ids[i] = v;
        }
    }
    free(raw);
    return ids;
}

#endif
