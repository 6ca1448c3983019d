/* safetensors files: a generic reader (validated header, tensor list, pread of any byte range of one
 * tensor, so a checkpoint loader can read only the rows a rank owns) and an atomic writer (temp file +
 * fsync + rename, so a crash never leaves a half-written file under the final name).
 *
 * Format: u64 LE header length N, N bytes of JSON (padded with spaces to a multiple of 8), then the data.
 * Every error names the file and, where one is involved, the tensor. */
#ifndef FSDP_COMMON_SAFETENSORS_H
#define FSDP_COMMON_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

enum safetensors_dtype {
    SAFETENSORS_F64 = 0,
    SAFETENSORS_F32,
    SAFETENSORS_F16,
    SAFETENSORS_BF16,
    SAFETENSORS_I64,
    SAFETENSORS_I32,
    SAFETENSORS_I16,
    SAFETENSORS_I8,
    SAFETENSORS_U64,
    SAFETENSORS_U32,
    SAFETENSORS_U16,
    SAFETENSORS_U8,
    SAFETENSORS_BOOL,
    SAFETENSORS_DTYPE_COUNT,
};

#define SAFETENSORS_MAX_DIMS 8
/* Headers larger than this are rejected before allocating (the reference implementation uses 100 MB). */
#define SAFETENSORS_MAX_HEADER (100u * 1024 * 1024)

struct safetensors_tensor {
    char *name;
    enum safetensors_dtype dtype;
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end; /* data_offsets, relative to the start of the data section */
};

struct safetensors_meta {
    char *key, *value;
};

struct safetensors_file {
    char *path;
    int fd;
    uint64_t file_size;
    uint64_t data_start; /* 8 + header length */
    size_t n_tensors;
    struct safetensors_tensor *tensors; /* in header order */
    size_t n_meta;
    struct safetensors_meta *meta;
};

/* "F32" etc.; NULL for an out-of-range value. */
const char *safetensors_dtype_name(enum safetensors_dtype dtype);
/* 0 and *out set, or FSDP_EINVAL for an unknown name. */
int safetensors_dtype_parse(const char *name, enum safetensors_dtype *out);
size_t safetensors_dtype_size(enum safetensors_dtype dtype);

/* Opens path and validates the whole header against the file (JSON, dtypes, shapes vs byte counts,
 * offsets contiguous from 0 without holes or overlaps, total length). On success *out owns the fd. */
int safetensors_open(struct safetensors_file **out, const char *path);
void safetensors_close(struct safetensors_file *f);
/* The tensor named name, or NULL. */
const struct safetensors_tensor *safetensors_find(const struct safetensors_file *f, const char *name);
/* The metadata value for key, or NULL. */
const char *safetensors_meta_get(const struct safetensors_file *f, const char *key);
/* Reads bytes [offset, offset + bytes) of tensor t's data into dst (pread: safe from several threads). */
int safetensors_read(const struct safetensors_file *f, const struct safetensors_tensor *t,
                     uint64_t offset, void *dst, size_t bytes);

/* One tensor to write: data holds numel x dtype size bytes, or is NULL when the writer's fill callback
 * provides it (streaming large tensors without one contiguous host copy). */
struct safetensors_entry {
    const char *name;
    enum safetensors_dtype dtype;
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    const void *data;
};

/* Supplies bytes [offset, offset + bytes) of entry index's data into buf; returns 0 or an error code. */
typedef int (*safetensors_fill_fn)(void *ctx, size_t index, uint64_t offset, void *buf, size_t bytes);

/* Writes the entries in the given order (data offsets follow that order), with optional string metadata
 * (meta may be NULL when n_meta is 0). Atomic: the file appears under path only when complete and synced.
 * fill may be NULL when every entry has data. */
int safetensors_write(const char *path, const struct safetensors_entry *entries, size_t n_entries,
                      const struct safetensors_meta *meta, size_t n_meta, safetensors_fill_fn fill,
                      void *fill_ctx);

/* The bytes a file of these entries starts with (u64 length + padded JSON; the data follows, entries in
 * the given order), so a caller can write a file in its own way: one streaming pass, pwrite of each
 * tensor as it becomes available, its own checksums. *out (malloc'ed) holds *out_bytes bytes. */
int safetensors_header(const char *path, const struct safetensors_entry *entries, size_t n_entries,
                       const struct safetensors_meta *meta, size_t n_meta, void **out, size_t *out_bytes);

#endif
