/* Small file-system helpers shared by the programs. */
#ifndef FSDP_COMMON_FS_H
#define FSDP_COMMON_FS_H

#include <stddef.h>

/* The size of a buffer that holds a path (Linux's PATH_MAX): one size everywhere, so a path copied from
 * one buffer into another always fits. A path joined from a directory and a name can still be longer:
 * check snprintf's result and name the path that is too long rather than use a truncated one. */
#define FSDP_PATH_MAX 4096

/* snprintf into a path buffer of cap bytes (FSDP_PATH_MAX, or that plus room for a known suffix): 0, or
 * FSDP_ERANGE with error_set saying that `what` ("checkpoint.dir", "the metrics file") would be longer than
 * cap - 1 bytes, so no caller goes on with a truncated path. */
int fs_path_format(char *out, size_t cap, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Creates dir and its missing parents (like mkdir -p; existing ones are fine). what names the directory's
 * role in the error ("log directory", "checkpoint.dir"), which says the path and the cause. */
int fs_mkdir_p(const char *dir, const char *what);

/* Creates a new empty file beside path, named "<path>.tmp.<unique>", for an atomic replace of path: the
 * file gets mode 0666 less the process umask, as any file the user creates (mkstemp's 0600 would not).
 * tmp (cap bytes) receives its name. Returns the open descriptor (O_RDWR | O_CLOEXEC) or a negative
 * error code with error_set naming path. */
int fs_create_temp(const char *path, char *tmp, size_t cap);

/* fsyncs fd, closes it and renames tmp over path, then fsyncs path's directory so the rename is durable.
 * On failure tmp is removed and the error names path. fd is closed in every case. */
int fs_commit_temp(int fd, const char *tmp, const char *path);

/* Writes bytes to path atomically (fs_create_temp, write, fs_commit_temp). */
int fs_write_atomic(const char *path, const void *data, size_t bytes);

/* Opens path read-only (O_CLOEXEC) after checking it is a regular file: a FIFO, a socket or a device given
 * where a file is expected would block the reader forever or never end. The open uses O_NONBLOCK, so a FIFO
 * with no writer does not block it, and the descriptor is made blocking again before it is returned.
 * Returns the descriptor, or FSDP_ENOTFOUND (path does not exist), FSDP_EINVAL (not a regular file) or
 * FSDP_EIO, each with error_set naming path as `what path` ("checkpoint shard /x/y: ..."). */
int fs_open_regular(const char *path, const char *what);

#endif
