/* Whole files and directory trees for the tests and benchmarks. No Criterion here (the benchmarks link it
 * too): a failure is a return value; tests/util/tu_check.h has the asserting forms. */
#ifndef FSDP_TESTS_UTIL_TU_FILE_H
#define FSDP_TESTS_UTIL_TU_FILE_H

#include <stdbool.h>
#include <stddef.h>

/* The file's bytes as a NUL-terminated string the caller frees; "" (allocated) when it cannot be read, so
 * a test can show what a program left even when it left nothing. NULL only when out of memory. */
char *tu_slurp(const char *path);

/* The file's bytes (binary: *len is their count, len may be NULL), NUL-terminated for text; NULL with errno
 * set when it cannot be read. */
char *tu_read_file(const char *path, size_t *len);

/* Writes len bytes to path (created or truncated); 0, or -1 with errno set. */
int tu_write_file(const char *path, const void *data, size_t len);

/* Writes text to path (created or truncated); 0, or -1 with errno set. */
int tu_write_text(const char *path, const char *text);

/* Removes dir and everything under it, following no symbolic link; 0, or -1 when something stayed. */
int tu_rm_tree(const char *dir);

/* Whether something exists at path. */
bool tu_exists(const char *path);

/* snprintf into a path buffer of cap bytes for a program without Criterion (a benchmark): a path that would
 * not fit ends the program (status 2, naming it on stderr) rather than let it use a cut one. Tests use
 * tu_pathf (tu_check.h). */
char *tu_pathf_or_exit(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
