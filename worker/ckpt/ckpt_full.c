/* FULL_STATE_DICT save on rank 0. The directory is a Hugging Face model directory (config.json and
 * model.safetensors under the family's Hugging Face names) plus the optimizer state and metadata.json.
 * Both safetensors headers are written first (every tensor's offset follows from the layout), then each
 * tensor lands with one pwrite as soon as the engine has gathered it, so rank 0 never holds more than the
 * unit being gathered; the block CRCs are computed on the way. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "worker/ckpt/ckpt_internal.h"
#include "worker/model/model_hf.h"

enum { FILE_MODEL, FILE_OPTIM, N_FILES };

struct ckpt_full_writer {
    char root[FSDP_PATH_MAX], tmp[FSDP_PATH_MAX], name[256];
    char path[N_FILES][FSDP_PATH_MAX], file_name[N_FILES][300];
    int64_t step;
    const struct model_layout *l;
    int fd[N_FILES];
    uint64_t header_bytes[N_FILES];
    /* per (kind, param): absolute offset in its file and, once put, the block CRCs */
    uint64_t *offset;
    uint32_t **crcs;
    size_t *n_crcs;
};

static size_t slot(const struct ckpt_full_writer *w, int kind, int param)
{
    return (size_t)kind * (size_t)w->l->n_params + (size_t)param;
}

static int file_of(int kind)
{
    return kind == CKPT_PARAM ? FILE_MODEL : FILE_OPTIM;
}

static void writer_free(struct ckpt_full_writer *w)
{
    for (int f = 0; f < N_FILES; f++)
        if (w->fd[f] >= 0)
            close(w->fd[f]);
    for (size_t i = 0; w->crcs && i < (size_t)CKPT_KINDS * w->l->n_params; i++)
        free(w->crcs[i]);
    free(w->crcs);
    free(w->n_crcs);
    free(w->offset);
    free(w);
}

void ckpt_full_abort(struct ckpt_full_writer *w)
{
    if (!w)
        return;
    for (int f = 0; f < N_FILES; f++)
        if (w->fd[f] >= 0) {
            close(w->fd[f]);
            w->fd[f] = -1;
        }
    ckpt_remove_tree(w->tmp);
    writer_free(w);
}

/* Writes the header of one file and records where each of its tensors' data starts. */
static int write_header(struct ckpt_full_writer *w, int file)
{
    const struct model_layout *l = w->l;
    int per = file == FILE_MODEL ? 1 : 2;
    size_t n = (size_t)l->n_params * per;
    struct safetensors_entry *e = calloc(n, sizeof *e);
    char(*names)[MODEL_NAME_MAX + 32] = calloc(n, sizeof *names);
    void *hdr = NULL;
    int rc = 0;
    if (!e || !names) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    for (int p = 0; p < l->n_params; p++)
        for (int j = 0; j < per; j++) {
            const struct model_param *mp = &l->params[p];
            size_t i = (size_t)p * per + j;
            if (file == FILE_MODEL)
                model_hf_param_name(l, p, names[i], sizeof names[i]);
            else
                snprintf(names[i], sizeof names[i], "%s.%s", ckpt_kind_name(CKPT_EXP_AVG + j), mp->name);
            e[i] = (struct safetensors_entry){.name = names[i], .dtype = SAFETENSORS_F32, .ndim = mp->ndim,
                                              .shape = {mp->init_rows, mp->ndim == 2 ? mp->shape[1] : 0}};
        }
    char step[32];
    snprintf(step, sizeof step, "%" PRId64, w->step);
    /* "format": "pt" is what Hugging Face's loaders look for in a PyTorch-origin file. */
    struct safetensors_meta meta[2] = {{.key = "format", .value = "pt"}, {.key = "fsdpc_step", .value = step}};
    size_t hbytes = 0;
    FSDP_TRY_GOTO(safetensors_header(w->path[file], e, n, meta, 2, &hdr, &hbytes), rc, out);
    FSDP_TRY_GOTO(ckpt_write_all(w->fd[file], hdr, hbytes, w->path[file]), rc, out);
    uint64_t pos = hbytes;
    w->header_bytes[file] = hbytes;
    for (int p = 0; p < l->n_params; p++)
        for (int j = 0; j < per; j++) {
            int kind = file == FILE_MODEL ? CKPT_PARAM : CKPT_EXP_AVG + j;
            w->offset[slot(w, kind, p)] = pos;
            pos += ckpt_param_real_numel(&l->params[p]) * sizeof(float);
        }
    /* Sized up front: a disk that cannot hold the file fails here, before any tensor is gathered. */
    int err = posix_fallocate(w->fd[file], 0, (off_t)pos);
    if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
        rc = error_set(FSDP_EIO,
                       "%s: cannot reserve %llu bytes: %s (disk full: free space or point [checkpoint] dir "
                       "elsewhere; earlier checkpoints are intact)",
                       w->path[file], (unsigned long long)pos, strerror(err));
    }
out:
    free(hdr);
    free(e);
    free(names);
    return rc;
}

int ckpt_full_open(const char *root, int64_t step, const struct model_layout *l, struct ckpt_full_writer **out)
{
    *out = NULL;
    struct ckpt_full_writer *w = calloc(1, sizeof *w);
    if (!w)
        return error_set(FSDP_ENOMEM, "out of memory");
    w->fd[0] = w->fd[1] = -1;
    w->l = l;
    w->step = step;
    size_t slots = (size_t)CKPT_KINDS * l->n_params;
    w->offset = calloc(slots, sizeof *w->offset);
    w->crcs = calloc(slots, sizeof *w->crcs);
    w->n_crcs = calloc(slots, sizeof *w->n_crcs);
    if (!w->offset || !w->crcs || !w->n_crcs) {
        writer_free(w);
        return error_set(FSDP_ENOMEM, "out of memory");
    }
    snprintf(w->root, sizeof w->root, "%s", root);
    snprintf(w->name, sizeof w->name, "fsdp_cpt%" PRId64, step);
    snprintf(w->tmp, sizeof w->tmp, "%s/%s%s", root, CKPT_TMP_PREFIX, w->name);
    snprintf(w->file_name[FILE_MODEL], sizeof w->file_name[0], "%s", MODEL_HF_WEIGHTS);
    snprintf(w->file_name[FILE_OPTIM], sizeof w->file_name[1], "optimizer.safetensors");
    int rc = 0;
    FSDP_TRY_GOTO(ckpt_mkdir(root), rc, fail);
    ckpt_remove_tree(w->tmp); /* leftovers of a save of this step that crashed */
    FSDP_TRY_GOTO(ckpt_mkdir(w->tmp), rc, fail);
    for (int f = 0; f < N_FILES; f++) {
        ckpt_pathf(w->path[f], "%s/%s", w->tmp, w->file_name[f]);
        w->fd[f] = open(w->path[f], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (w->fd[f] < 0) {
            rc = error_set(FSDP_EIO, "%s: cannot create: %s", w->path[f], strerror(errno));
            goto fail;
        }
        FSDP_TRY_GOTO(write_header(w, f), rc, fail);
    }
    *out = w;
    return 0;
fail:
    ckpt_full_abort(w);
    return rc;
}

int ckpt_full_put(struct ckpt_full_writer *w, int kind, int param, const float *t)
{
    if (kind < 0 || kind >= CKPT_KINDS || param < 0 || param >= w->l->n_params)
        return error_set(FSDP_EINVAL, "checkpoint: put of kind %d param %d out of range", kind, param);
    size_t s = slot(w, kind, param);
    const struct model_param *mp = &w->l->params[param];
    if (w->crcs[s])
        return error_set(FSDP_EINVAL, "checkpoint: %s of '%s' put twice", ckpt_kind_name(kind), mp->name);
    size_t n = ckpt_param_real_numel(mp);
    int f = file_of(kind);
    size_t nc = (n * sizeof(float) + CKPT_CRC_BLOCK - 1) / CKPT_CRC_BLOCK;
    uint32_t *crcs = malloc((nc ? nc : 1) * sizeof *crcs);
    if (!crcs)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    FSDP_TRY_GOTO(ckpt_write_crc(w->fd[f], w->offset[s], t, n, crcs, w->path[f]), rc, fail);
    w->crcs[s] = crcs;
    w->n_crcs[s] = nc;
    return 0;
fail:
    free(crcs);
    return rc;
}

static int finish(struct ckpt_full_writer *w, const struct ckpt_state *state, int keep_last)
{
    const struct model_layout *l = w->l;
    struct ckpt_meta m = {.sharded = false, .state = *state, .vocab_padded = l->vocab_padded};
    struct ckpt_meta_file files[N_FILES];
    m.files = files;
    m.n_files = N_FILES;
    int rc = 0;
    for (int k = 0; k < CKPT_KINDS; k++)
        for (int p = 0; p < l->n_params; p++)
            if (!w->crcs[slot(w, k, p)]) {
                rc = error_set(FSDP_EINVAL, "checkpoint: %s of '%s' was never put; the full checkpoint is incomplete",
                               ckpt_kind_name(k), l->params[p].name);
                goto out;
            }
    for (int f = 0; f < N_FILES; f++) {
        struct stat st;
        if (fsync(w->fd[f]) != 0 || fstat(w->fd[f], &st) != 0) {
            rc = error_set(FSDP_EIO, "%s: fsync: %s", w->path[f], strerror(errno));
            goto out;
        }
        files[f].name = w->file_name[f];
        files[f].bytes = (uint64_t)st.st_size;
        files[f].header_bytes = w->header_bytes[f];
        FSDP_TRY_GOTO(ckpt_crc_prefix(w->fd[f], w->header_bytes[f], &files[f].header_crc, w->path[f]), rc, out);
    }
    size_t n = (size_t)CKPT_KINDS * l->n_params;
    if (!(m.pieces = calloc(n, sizeof *m.pieces))) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    for (int k = 0; k < CKPT_KINDS; k++)
        for (int p = 0; p < l->n_params; p++) {
            size_t s = slot(w, k, p);
            m.pieces[m.n_pieces++] = (struct ckpt_meta_piece){
                .kind = k, .param = p, .rank = 0, .file = file_of(k), .begin = 0,
                .count = ckpt_param_real_numel(&l->params[p]), .offset = w->offset[s], .crcs = w->crcs[s],
                .n_crcs = w->n_crcs[s]};
        }
    FSDP_TRY_GOTO(ckpt_check_coverage(m.pieces, m.n_pieces, l, true, w->tmp), rc, out);
    FSDP_TRY_GOTO(ckpt_meta_write(w->tmp, &m, l), rc, out);
    /* What from_pretrained needs beside the weights: config.json (special ids from the tokenizer). */
    struct model_hf_tokens tokens = {-1, -1};
    if (state->tokenizer && state->tokenizer[0])
        FSDP_TRY_GOTO(model_hf_tokenizer_tokens(state->tokenizer, &tokens), rc, out);
    FSDP_TRY_GOTO(model_hf_config_write(l, w->tmp, &tokens, "float32"), rc, out);
    FSDP_TRY_GOTO(ckpt_copy_tokenizer(w->tmp, state->tokenizer), rc, out);
out:
    free(m.pieces); /* the CRC arrays stay owned by w */
    for (int f = 0; f < N_FILES; f++)
        if (w->fd[f] >= 0) {
            if (close(w->fd[f]) != 0 && rc == 0)
                rc = error_set(FSDP_EIO, "%s: close: %s", w->path[f], strerror(errno));
            w->fd[f] = -1;
        }
    if (rc)
        return rc;
    return ckpt_commit_dir(w->root, w->tmp, w->name, keep_last);
}

int ckpt_full_commit(struct ckpt_full_writer *w, const struct ckpt_state *state, int keep_last)
{
    int rc = state->step == w->step ? finish(w, state, keep_last)
                                    : error_set(FSDP_EINVAL, "checkpoint: state step %" PRId64 " but writer step %" PRId64,
                                                state->step, w->step);
    if (rc != 0) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", error_message());
        int64_t step = w->step;
        ckpt_full_abort(w);
        return error_set(rc, "checkpoint step %" PRId64 " not saved: %s", step, msg);
    }
    log_info("checkpoint: saved %s/%s (full)", w->root, w->name);
    writer_free(w);
    return 0;
}
