/* Whole-file reads and writes for the tests and benchmarks. */
#ifndef FSDP_TESTS_UTIL_TU_FILE_H
#define FSDP_TESTS_UTIL_TU_FILE_H

/* The file's bytes as a NUL-terminated string the caller frees; "" (allocated) when it cannot be read, so
 * a test can show what a program left even when it left nothing. NULL only when out of memory. */
char *tu_slurp(const char *path);

/* Writes text to path (created or truncated); 0, or -1 with errno set. */
int tu_write_text(const char *path, const char *text);

#endif
