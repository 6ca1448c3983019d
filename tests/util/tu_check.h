/* The Criterion-asserting forms of the file helpers (tu_file.h) and the paths the tests find things by, for
 * the unit and integration tests of every folder: a failure ends the test with a message naming the path.
 * Header-only, as Criterion's asserts must run in the test's own process. */
#ifndef FSDP_TESTS_UTIL_TU_CHECK_H
#define FSDP_TESTS_UTIL_TU_CHECK_H

#include <criterion/criterion.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/util/tu_file.h"

/* buf = "$FSDP_SOURCE_ROOT/rel" (what the source tree holds: corpora, fixtures, examples, scripts). */
static inline const char *tu_source_path(char *buf, size_t cap, const char *rel)
{
    const char *root = getenv("FSDP_SOURCE_ROOT");
    cr_assert_not_null(root, "FSDP_SOURCE_ROOT is not set: run through meson test");
    cr_assert_lt((size_t)snprintf(buf, cap, "%s/%s", root, rel), cap, "path too long: %s/%s", root, rel);
    return buf;
}

/* buf = "$FSDP_BUILD_ROOT/rel" (the programs under test, never found through PATH). */
static inline const char *tu_build_path(char *buf, size_t cap, const char *rel)
{
    const char *root = getenv("FSDP_BUILD_ROOT");
    cr_assert_not_null(root, "FSDP_BUILD_ROOT is not set: run through meson test");
    cr_assert_lt((size_t)snprintf(buf, cap, "%s/%s", root, rel), cap, "path too long: %s/%s", root, rel);
    return buf;
}

/* snprintf into a path buffer, asserting the path fits: a cut one would point the test at another file. */
static inline char *tu_pathf(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline char *tu_pathf(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    cr_assert(n >= 0 && (size_t)n < cap, "path too long (%d bytes, room for %zu): %s...", n, cap - 1, buf);
    return buf;
}

/* A new directory /tmp/<prefix>-XXXXXX (mkdtemp) in buf; remove it with tu_rm_tree. */
static inline char *tu_mkdtemp(char *buf, size_t cap, const char *prefix)
{
    cr_assert_lt((size_t)snprintf(buf, cap, "/tmp/%s-XXXXXX", prefix), cap);
    cr_assert_not_null(mkdtemp(buf), "mkdtemp %s: %s", buf, strerror(errno));
    return buf;
}

/* tu_read_file, asserting it could. */
static inline char *tu_read_ok(const char *path, size_t *len)
{
    char *s = tu_read_file(path, len);
    cr_assert_not_null(s, "cannot read %s: %s", path, strerror(errno));
    return s;
}

/* tu_write_file, asserting it could. */
static inline void tu_write_ok(const char *path, const void *data, size_t len)
{
    cr_assert_eq(tu_write_file(path, data, len), 0, "cannot write %s: %s", path, strerror(errno));
}

/* Copies the file from to the file to. */
static inline void tu_copy_ok(const char *from, const char *to)
{
    size_t n;
    char *s = tu_read_ok(from, &n);
    tu_write_ok(to, s, n);
    free(s);
}

#endif
