/* Helpers of the tokenizer and tools tests (tests/tokenizer/, tests/tools/): a temporary directory per test,
 * running the tools and the Python peer (tests/tokenizer/tokenizer_ref.py), reading token files (whole files
 * and paths: tests/util/tu_check.h). */
#ifndef FSDP_TESTS_UTIL_TOOLTEST_H
#define FSDP_TESTS_UTIL_TOOLTEST_H

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "tests/util/tu_check.h"
#include "tests/util/tu_proc.h"
#include "tests/util/tu_venv.h"
#include "worker/data/data_format.h"

static char tt_dir[64];

static inline void tt_setup(void) { tu_mkdtemp(tt_dir, sizeof tt_dir, "fsdp-tools"); }

static inline void tt_teardown(void) { tu_rm_tree(tt_dir); }

/* tt_dir/rel (a static buffer per call site is not needed: callers copy) */
static inline const char *tt_path(char *buf, size_t cap, const char *rel)
{
    snprintf(buf, cap, "%s/%s", tt_dir, rel);
    return buf;
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
        *out = tu_read_ok(log, NULL);
    return rc;
}

/* The venv's python running tests/tokenizer/tokenizer_ref.py with the arguments (printf-style); asserts exit 0
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
    tu_source_path(script, sizeof script, "tests/tokenizer/tokenizer_ref.py");
    tt_path(log, sizeof log, ".py.out");
    snprintf(cmd, sizeof cmd, "'%s' '%s' %s > '%s' 2>&1", python, script, args, log);
    int rc = tu_sh(cmd);
    char *out = tu_read_ok(log, NULL);
    cr_assert_eq(rc, 0, "tokenizer_ref.py %s failed:\n%s", args, out);
    return out;
}

/* Token ids of a token file of any format, as uint32. */
static inline uint32_t *tt_tokens(const char *path, size_t *n, enum data_format *fmt)
{
    size_t len;
    char *raw = tu_read_ok(path, &len);
    size_t hdr;
    int64_t count;
    cr_assert_eq(data_format_detect(raw, len, path, fmt, &hdr, &count), 0, "%s", error_message());
    size_t tb = (size_t)data_format_token_bytes(*fmt);
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
