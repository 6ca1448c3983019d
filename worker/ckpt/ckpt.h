/* Checkpoints: the storage layer under the FSDP engine's save and resume (docs/checkpoints.md).
 *
 * Two formats, one reader:
 * - SHARDED_STATE_DICT: directory fsdp_sharded_cpt{step}/ with one file per rank,
 *   fsdp_sharded_cpt{step}_rank{r} (a safetensors file of that rank's pieces), and metadata.json (rank 0).
 * - FULL_STATE_DICT: directory fsdp_cpt{step}/, a Hugging Face model directory that from_pretrained opens
 *   (config.json; model.safetensors: the model under the family's Hugging Face names, F32, wte without
 *   vocabulary padding rows) plus optimizer.safetensors ("exp_avg.<name>", "exp_avg_sq.<name>") and
 *   metadata.json.
 * Both copy the run's tokenizer.json (state->tokenizer) into the directory when there is one.
 * metadata.json holds the scalar state and, for every tensor and kind, where each piece lives and a
 * CRC32C per block of CKPT_CRC_BLOCK bytes, so a reader checks exactly the bytes it reads.
 *
 * Every save builds a hidden temporary directory (.tmp_<name>) under the checkpoint root, fsyncs it,
 * renames it to its final name and only then rewrites the `latest` pointer; pruning of old checkpoints
 * comes after that. A reader therefore never sees a partial checkpoint. */
#ifndef FSDP_WORKER_CKPT_H
#define FSDP_WORKER_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "common/fs.h"
#include "worker/model/model.h"

enum ckpt_kind {
    CKPT_PARAM = 0,  /* fp32 master weights */
    CKPT_EXP_AVG,    /* AdamW first moment */
    CKPT_EXP_AVG_SQ, /* AdamW second moment */
    CKPT_KINDS,
};

/* Bytes covered by one CRC32C; a read verifies every block it touches (at most one block beyond each end
 * of the requested range is read in addition). */
#define CKPT_CRC_BLOCK (1u << 20)
#define CKPT_LATEST "latest"
#define CKPT_LOCK_FILE ".lock"

struct ckpt_state {
    int64_t step; /* optimizer steps done; the data position is a pure function of it */
    double loss_scale;
    int64_t scaler_good_steps;
    int world_size;
    char strategy[32]; /* FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, NO_SHARD */
    int fsdp_version;
    const char *config_text; /* effective INI (--print-config); owned by the caller on save, by the reader on load */
    struct model_config model;
    const char *tokenizer; /* save: the run's tokenizer.json, copied into the checkpoint (NULL: none) */
};

/* Elements [begin, begin + count) of the row-major tensor (layout shape, vocabulary padding included) of
 * parameter `param` of kind `kind`. */
struct ckpt_piece {
    int kind;
    int param;
    size_t begin, count;
    const float *data;
};

/* "param", "exp_avg", "exp_avg_sq"; NULL when out of range. */
const char *ckpt_kind_name(int kind);

/* ---- SHARDED_STATE_DICT, in the phases the engine separates with barriers ---- */
/* `rank` and `world` count the WRITERS: one per distinct set of pieces. Under HYBRID_SHARD / NO_SHARD the
 * replicas hold the same pieces, so only replica 0 writes, with rank = its rank in the shard group and
 * world = the shard group size; state->world_size stays the job's world size. Piece data is host memory.
 * Every writer: writes its pieces into <root>/.tmp_fsdp_sharded_cpt{step}/fsdp_sharded_cpt{step}_rank{rank}
 * and fsyncs it. Pieces must not overlap (checked). ENOSPC: the file is removed, FSDP_EIO says so. */
int ckpt_sharded_write_rank(const char *ckpt_root, int64_t step, int rank, const struct model_layout *layout,
                            const struct ckpt_piece *pieces, size_t n);
/* Writer 0 after all writers wrote: checks every rank file, that the pieces of all ranks cover every tensor
 * of every kind exactly, writes metadata.json, fsyncs, renames the directory to fsdp_sharded_cpt{step},
 * updates `latest`, then removes all but the newest keep_last checkpoints (0 = keep all). On failure the
 * temporary directory is removed and earlier checkpoints are untouched. */
int ckpt_sharded_commit(const char *ckpt_root, int64_t step, int world, const struct model_layout *layout,
                        const struct ckpt_state *state, int keep_last);
/* Removes the temporary directory of a failed save (any rank; idempotent). */
void ckpt_sharded_abort(const char *ckpt_root, int64_t step);

/* ---- FULL_STATE_DICT: rank 0 writes tensors as the engine gathers them ---- */
struct ckpt_full_writer;
/* Creates the temporary directory and both files with their headers (every offset is known from the
 * layout); the data is then written with one pwrite per tensor, in any order. */
int ckpt_full_open(const char *ckpt_root, int64_t step, const struct model_layout *layout,
                   struct ckpt_full_writer **out);
/* full_tensor: the whole tensor of parameter `param` in the layout's shape (padding rows are dropped). */
int ckpt_full_put(struct ckpt_full_writer *w, int kind, int param, const float *full_tensor);
/* Checks every tensor of every kind was put, fsyncs, writes metadata.json, renames, updates `latest`,
 * prunes; frees w whatever the result (on failure as ckpt_full_abort). */
int ckpt_full_commit(struct ckpt_full_writer *w, const struct ckpt_state *state, int keep_last);
/* Removes the temporary directory and frees w. NULL is allowed. */
void ckpt_full_abort(struct ckpt_full_writer *w);

/* ---- loading (both formats, any world size) ---- */
/* A reader keeps open descriptors and one 16 MiB read buffer; use one reader per thread. */
struct ckpt_reader;
/* which: "latest" (the checkpoint `latest` under ckpt_root names), a checkpoint directory name under
 * ckpt_root, or a path; NULL = ckpt_root is itself a checkpoint directory. Validates metadata.json (its
 * CRC), the model config against layout (layout may be NULL: then the checkpoint's own config is used,
 * for tools), every data file's presence and size. Reads no tensor data. */
int ckpt_open(const char *ckpt_root_or_dir, const char *which, const struct model_layout *layout,
              struct ckpt_reader **out);
const struct ckpt_state *ckpt_reader_state(const struct ckpt_reader *r);
/* The layout the checkpoint was checked against (the caller's, or one built from the checkpoint). */
const struct model_layout *ckpt_reader_layout(const struct ckpt_reader *r);
/* "sharded" or "full". */
const char *ckpt_reader_format(const struct ckpt_reader *r);
/* The checkpoint directory. */
const char *ckpt_reader_path(const struct ckpt_reader *r);
/* Elements [begin, begin + count) of the tensor (layout shape) into dst, read with pread of only the
 * needed blocks, each block's CRC32C verified. Padding rows absent from a full checkpoint read as 0. */
int ckpt_read(struct ckpt_reader *r, int kind, int param, size_t begin, size_t count, float *dst);
/* Reads every byte of every file: file sizes, headers and all block CRCs (fsdp-ckpt inspect). */
int ckpt_verify(struct ckpt_reader *r, uint64_t *bytes_checked);
void ckpt_close(struct ckpt_reader *r);

/* Copies the tokenizer file src (may be NULL: nothing to do) into dir as tokenizer.json, with
 * tokenizer_config.json and special_tokens_map.json when they lie beside it, each fsynced. */
int ckpt_copy_tokenizer(const char *dir, const char *src);

/* A resume_from value that names a file where a checkpoint directory belongs (fsdp_cpt4000.pth, a
 * .safetensors file, a file inside a checkpoint) or a Hugging Face model directory: FSDP_EINVAL with what
 * to pass instead (the directory beside or above it, or model.init_from); 0 for anything else, including
 * paths that do not exist (ckpt_resolve reports those). which is looked up under root (may be NULL) when
 * it does not exist as given. */
int ckpt_check_resume_target(const char *root, const char *which);
/* "latest" or a name/path -> the checkpoint directory's path; FSDP_ENOTFOUND when there is none. Runs
 * ckpt_check_resume_target first. "latest" is ckpt_find_latest's choice, with its note (if any) logged as
 * a warning. */
int ckpt_resolve(const char *ckpt_root, const char *which, char *out, size_t cap);

/* `latest` under ckpt_root: the newest committed checkpoint there, i.e. the highest step among its
 * fsdp_sharded_cpt<N>/ and fsdp_cpt<N>/ directories (saves in progress, `.tmp_*`, are not checkpoints).
 * The `latest` file names it after every commit and is only a pointer: when it is missing, unreadable,
 * holds no checkpoint name, names a deleted checkpoint or an older one (a save stopped between its commit
 * and the pointer's update), the newest directory still wins and `note` says what was wrong with the
 * pointer. path is "" (step -1) when the root holds no checkpoint at all (or does not exist). */
struct ckpt_latest {
    char path[FSDP_PATH_MAX];
    int64_t step;
    char older[256]; /* the next older checkpoint's name, "" when none */
    char note[1024]; /* "" when the pointer agreed */
};
int ckpt_find_latest(const char *ckpt_root, struct ckpt_latest *out);
/* The committed checkpoints under ckpt_root with a step above `step`, oldest first, as a ", "-separated
 * list into names (cut to fit cap); returns how many there are. */
int ckpt_list_after(const char *ckpt_root, int64_t step, char *names, size_t cap);

/* One saving job per checkpoint directory: an exclusive flock on <ckpt_root>/.lock, held through *fd until
 * ckpt_unlock (or the process's end, however it ends). owner (one line: host, pid, run id) is written into
 * the file for the message another job gets: FSDP_EEXIST naming the holder, after waiting up to wait_s for
 * it to let go (0: refuse at once). ckpt_root must exist. */
int ckpt_lock(const char *ckpt_root, const char *owner, double wait_s, int *fd);
void ckpt_unlock(int fd);

#endif
