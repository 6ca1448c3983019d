/* Shared between the checkpoint writers, the reader and fsdp-ckpt: the in-memory form of metadata.json
 * and the file-system steps of an atomic commit. Not part of the engine's API (worker/ckpt.h). */
#ifndef FSDP_WORKER_CKPT_INTERNAL_H
#define FSDP_WORKER_CKPT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/ckpt/ckpt.h"

#define CKPT_META_FILE "metadata.json"
#define CKPT_TMP_PREFIX ".tmp_"
#define CKPT_FORMAT_NAME "fsdpc-checkpoint"
#define CKPT_FORMAT_VERSION 1

struct ckpt_meta_piece {
    int kind, param, rank, file;
    uint64_t begin, count; /* elements of the tensor */
    uint64_t offset;       /* absolute byte offset of element `begin` in the file */
    uint32_t *crcs;        /* one per CKPT_CRC_BLOCK bytes of the piece, the last one shorter */
    size_t n_crcs;
};

struct ckpt_meta_file {
    char *name; /* relative to the checkpoint directory */
    uint64_t bytes;
    /* The safetensors header (u64 length + JSON): the block CRCs cover only the data, and other tools
     * read the header, so it has a CRC of its own. */
    uint64_t header_bytes;
    uint32_t header_crc;
};

struct ckpt_meta {
    bool sharded;
    struct ckpt_state state; /* config_text points into config_text below */
    char *config_text;
    int vocab_padded;
    struct ckpt_meta_file *files;
    int n_files;
    struct ckpt_meta_piece *pieces;
    size_t n_pieces;
};

void ckpt_meta_free(struct ckpt_meta *m);
/* Writes dir/metadata.json (with its own CRC32C inside) and fsyncs it. */
int ckpt_meta_write(const char *dir, const struct ckpt_meta *m, const struct model_layout *layout);
/* Parses dir/metadata.json, checking its CRC and structure (names are matched against layout later). The
 * pieces' param fields hold indices into the returned tensor-name list. */
int ckpt_meta_read(const char *dir, struct ckpt_meta *m, char ***tensor_names, int *n_tensors);
/* The same from the file's text (len bytes; path names it in messages). The text is changed while its CRC is
 * computed and restored before the call returns. On failure m and *tensor_names (*n_tensors of them) hold
 * what was parsed so far: free them as after a success. */
int ckpt_meta_parse(const char *path, char *text, size_t len, struct ckpt_meta *m, char ***tensor_names,
                    int *n_tensors);

/* Number of elements of parameter p that a full checkpoint stores (wte without padding rows). */
size_t ckpt_param_real_numel(const struct model_param *p);
/* Pieces of every kind/param sorted by (kind, param, begin) must tile [0, end) exactly, end = numel or
 * the real numel (full format). what names the source in errors. */
int ckpt_check_coverage(struct ckpt_meta_piece *pieces, size_t n, const struct model_layout *l, bool full,
                        const char *what);

/* ---- file system (ckpt_fs.c) ---- */
/* snprintf into a FSDP_PATH_MAX buffer; a path that does not fit is cut (and then fails to open with a
 * message naming it) rather than overflowing. */
void ckpt_pathf(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ckpt_fsync_dir(const char *dir);
int ckpt_mkdir(const char *dir); /* EEXIST is fine */
void ckpt_remove_tree(const char *path);
/* write() of everything, or an FSDP_EIO error naming path and the cause (disk full spelled out). */
int ckpt_write_all(int fd, const void *buf, size_t n, const char *path);
int ckpt_pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *path);
/* pwrite of count floats at off, computing their block CRCs into crcs (ceil(bytes / CKPT_CRC_BLOCK)) on
 * the way and starting the disk's writeback of each chunk at once (sync_file_range), so checksumming,
 * copying into the page cache and the device's writes overlap and the final fsync has little left. */
int ckpt_write_crc(int fd, uint64_t off, const float *data, size_t count, uint32_t *crcs, const char *path);
/* CRC32C of the first `bytes` bytes of fd. */
int ckpt_crc_prefix(int fd, uint64_t bytes, uint32_t *crc, const char *path);
int ckpt_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path);
/* tmp (a directory under root) becomes root/name: fsync, rename, `latest` := name (temp + fsync + rename),
 * then prune to keep_last. An existing root/name is FSDP_EEXIST: a committed checkpoint is never replaced. */
int ckpt_commit_dir(const char *root, const char *tmp, const char *name, int keep_last);
/* "fsdp_sharded_cpt12" / "fsdp_cpt12" -> 12; -1 when name is not a checkpoint name. */
int64_t ckpt_name_step(const char *name);

#endif
