/* The one checkpoint reader for both formats and any world size: a rank asks for the element ranges it
 * owns under its own sharding, and the reader maps them onto the pieces the saving ranks wrote, reading
 * only the CRC blocks that overlap them (pread, never a whole file) and verifying each block it reads. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/error.h"
#include "common/fs.h"
#include "common/safetensors.h"
#include "worker/ckpt/ckpt_internal.h"

/* Blocks read per pread: large enough for disk throughput, small enough to bound the reader's memory. */
#define READ_BLOCKS 16

struct ckpt_reader {
    char dir[FSDP_PATH_MAX];
    struct ckpt_meta meta;
    struct model_layout own_layout;
    bool own;
    const struct model_layout *l;
    int *fds;
    char **paths;
    size_t *first; /* per (kind, param) slot: index of its first piece; first[slot + 1] ends it */
    char *buf;
};

static size_t slot(const struct ckpt_reader *r, int kind, int param)
{
    return (size_t)kind * (size_t)r->l->n_params + (size_t)param;
}

void ckpt_close(struct ckpt_reader *r)
{
    if (!r)
        return;
    for (int i = 0; r->fds && i < r->meta.n_files; i++)
        if (r->fds[i] >= 0)
            close(r->fds[i]);
    for (int i = 0; r->paths && i < r->meta.n_files; i++)
        free(r->paths[i]);
    free(r->fds);
    free(r->paths);
    free(r->first);
    free(r->buf);
    ckpt_meta_free(&r->meta);
    if (r->own)
        model_layout_free(&r->own_layout);
    free(r);
}

static void describe(char *out, size_t cap, const struct model_config *c)
{
    int n = snprintf(out, cap, "%s n_layer %d, n_head %d, n_embd %d, vocab_size %d, block_size %d", c->model_family,
                     c->n_layer, c->n_head, c->n_embd, c->vocab_size, c->block_size);
    if (c->n_head > 0 && model_head_dim(c) * c->n_head != c->n_embd && n > 0 && (size_t)n < cap)
        n += snprintf(out + n, cap - (size_t)n, ", head_dim %d", model_head_dim(c));
    if (c->n_kv_head && n > 0 && (size_t)n < cap) /* a family that reads the Llama keys */
        snprintf(out + n, cap - (size_t)n, ", n_kv_head %d, intermediate_size %d, %s head", c->n_kv_head,
                 c->intermediate_size, c->tie_word_embeddings ? "tied" : "untied");
}

static int check_model(struct ckpt_reader *r, const struct model_layout *l)
{
    const struct model_config *a = &r->meta.state.model, *b = &l->config;
    if (strcmp(a->model_family, b->model_family) == 0 && a->n_layer == b->n_layer && a->n_head == b->n_head &&
        a->n_embd == b->n_embd && model_head_dim(a) == model_head_dim(b) && a->vocab_size == b->vocab_size && a->block_size == b->block_size &&
        a->n_kv_head == b->n_kv_head && a->intermediate_size == b->intermediate_size &&
        a->tie_word_embeddings == b->tie_word_embeddings &&
        (!r->meta.sharded || r->meta.vocab_padded == l->vocab_padded)) /* full files hold real rows only */
        return 0;
    char x[256], y[256];
    describe(x, sizeof x, a);
    describe(y, sizeof y, b);
    return error_set(FSDP_EINVAL,
                     "%s/%s: wrong model shape: the checkpoint holds %s but the configured model is %s; use the "
                     "[model] settings the checkpoint was saved with",
                     r->dir, CKPT_META_FILE, x, y);
}

/* Tensor names in metadata.json -> parameter indices of the layout; every parameter exactly once. */
static int map_tensors(struct ckpt_reader *r, char **names, int n)
{
    const struct model_layout *l = r->l;
    int *map = malloc((n ? (size_t)n : 1) * sizeof *map);
    char *seen = calloc((size_t)l->n_params, 1);
    int rc = 0;
    if (!map || !seen) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        map[i] = model_layout_find(l, names[i]);
        if (map[i] < 0 || seen[map[i]]) {
            rc = error_set(FSDP_EINVAL, "%s/%s: tensor '%s' is %s", r->dir, CKPT_META_FILE, names[i],
                           map[i] < 0 ? "not a parameter of this model" : "listed twice");
            goto out;
        }
        seen[map[i]] = 1;
    }
    for (int p = 0; p < l->n_params; p++)
        if (!seen[p]) {
            rc = error_set(FSDP_EINVAL, "%s/%s: parameter '%s' is missing", r->dir, CKPT_META_FILE, l->params[p].name);
            goto out;
        }
    for (size_t i = 0; i < r->meta.n_pieces; i++)
        r->meta.pieces[i].param = map[r->meta.pieces[i].param];
out:
    free(map);
    free(seen);
    return rc;
}

static int open_files(struct ckpt_reader *r)
{
    struct ckpt_meta *m = &r->meta;
    r->fds = malloc((m->n_files ? (size_t)m->n_files : 1) * sizeof *r->fds);
    r->paths = calloc(m->n_files ? (size_t)m->n_files : 1, sizeof *r->paths);
    if (!r->fds || !r->paths)
        return error_set(FSDP_ENOMEM, "out of memory");
    for (int i = 0; i < m->n_files; i++)
        r->fds[i] = -1;
    for (int i = 0; i < m->n_files; i++) {
        size_t len = strlen(r->dir) + strlen(m->files[i].name) + 2;
        if (!(r->paths[i] = malloc(len)))
            return error_set(FSDP_ENOMEM, "out of memory");
        snprintf(r->paths[i], len, "%s/%s", r->dir, m->files[i].name);
        const char *p = r->paths[i];
        /* a FIFO or device in a shard's place would block the reader forever: regular files only */
        int fd = fs_open_regular(p, m->sharded ? "checkpoint rank file" : "checkpoint file");
        if (fd == FSDP_ENOTFOUND)
            return error_set(FSDP_ENOTFOUND, "%s: missing %s file (listed in %s)", p,
                             m->sharded ? "rank" : "checkpoint", CKPT_META_FILE);
        if (fd < 0)
            return fd;
        r->fds[i] = fd;
        struct stat st;
        if (fstat(r->fds[i], &st) != 0)
            return error_set(FSDP_EIO, "%s: cannot stat: %s", p, strerror(errno));
        if ((uint64_t)st.st_size != m->files[i].bytes)
            return error_set(FSDP_EINVAL, "%s: %s: %llu bytes, but %s records %llu", p,
                             (uint64_t)st.st_size < m->files[i].bytes ? "truncated" : "wrong size",
                             (unsigned long long)st.st_size, CKPT_META_FILE, (unsigned long long)m->files[i].bytes);
        uint32_t hc;
        FSDP_TRY(ckpt_crc_prefix(r->fds[i], m->files[i].header_bytes, &hc, p));
        if (hc != m->files[i].header_crc)
            return error_set(FSDP_EINVAL, "%s: CRC32C mismatch in the safetensors header (first %llu bytes): the file is "
                                          "corrupted; resume from an earlier checkpoint",
                             p, (unsigned long long)m->files[i].header_bytes);
    }
    for (size_t i = 0; i < m->n_pieces; i++) {
        const struct ckpt_meta_piece *q = &m->pieces[i];
        if (q->offset > m->files[q->file].bytes || q->count * sizeof(float) > m->files[q->file].bytes - q->offset)
            return error_set(FSDP_EINVAL, "%s: a piece of '%s' lies beyond the end of the file", r->paths[q->file],
                             r->l->params[q->param].name);
    }
    return 0;
}

/* The checkpoint's metadata, checked against the configured layout (or building the layout it records when
 * none is given), its tensor names mapped onto the layout's parameters. */
static int open_meta(struct ckpt_reader *r, const char *root, const char *which, const struct model_layout *layout)
{
    char **names = NULL;
    int n_names = 0, rc = 0;
    FSDP_TRY_GOTO(ckpt_resolve(root, which, r->dir, sizeof r->dir), rc, out);
    FSDP_TRY_GOTO(ckpt_meta_read(r->dir, &r->meta, &names, &n_names), rc, out);
    if (layout) {
        r->l = layout;
        FSDP_TRY_GOTO(check_model(r, layout), rc, out);
    } else {
        FSDP_TRY_GOTO(model_layout_build(&r->own_layout, &r->meta.state.model), rc, out);
        r->own = true;
        r->l = &r->own_layout;
    }
    FSDP_TRY_GOTO(map_tensors(r, names, n_names), rc, out);
out:
    for (int i = 0; i < n_names; i++)
        free(names[i]);
    free(names);
    return rc;
}

int ckpt_open(const char *root, const char *which, const struct model_layout *layout, struct ckpt_reader **out)
{
    *out = NULL;
    struct ckpt_reader *r = calloc(1, sizeof *r);
    if (!r)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    FSDP_TRY_GOTO(open_meta(r, root, which, layout), rc, fail);
    char what[FSDP_PATH_MAX + 32]; /* the directory and "/metadata.json" */
    snprintf(what, sizeof what, "%s/%s", r->dir, CKPT_META_FILE);
    FSDP_TRY_GOTO(ckpt_check_coverage(r->meta.pieces, r->meta.n_pieces, r->l, !r->meta.sharded, what), rc, fail);
    FSDP_TRY_GOTO(open_files(r), rc, fail);
    size_t slots = (size_t)CKPT_KINDS * (size_t)r->l->n_params;
    if (!(r->first = calloc(slots + 1, sizeof *r->first)) || !(r->buf = malloc((size_t)READ_BLOCKS * CKPT_CRC_BLOCK))) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto fail;
    }
    /* Pieces are sorted by (kind, param, begin) after the coverage check. */
    size_t i = 0;
    for (size_t s = 0; s <= slots; s++) {
        r->first[s] = i;
        while (i < r->meta.n_pieces && slot(r, r->meta.pieces[i].kind, r->meta.pieces[i].param) == s)
            i++;
    }
    *out = r;
    return 0;
fail:
    ckpt_close(r);
    return rc;
}

const struct ckpt_state *ckpt_reader_state(const struct ckpt_reader *r)
{
    return &r->meta.state;
}

const struct model_layout *ckpt_reader_layout(const struct ckpt_reader *r)
{
    return r->l;
}

const char *ckpt_reader_format(const struct ckpt_reader *r)
{
    return r->meta.sharded ? "sharded" : "full";
}

const char *ckpt_reader_path(const struct ckpt_reader *r)
{
    return r->dir;
}

/* Bytes [lo, hi) of piece q, extended to whole CRC blocks, are read and verified; then the requested
 * part is copied to dst (may be NULL: verify only). */
static int read_piece(struct ckpt_reader *r, const struct ckpt_meta_piece *q, uint64_t lo, uint64_t hi, char *dst)
{
    uint64_t total = q->count * sizeof(float);
    uint64_t j = lo / CKPT_CRC_BLOCK, jend = (hi + CKPT_CRC_BLOCK - 1) / CKPT_CRC_BLOCK;
    const char *path = r->paths[q->file];
    while (j < jend) {
        uint64_t nb = jend - j < READ_BLOCKS ? jend - j : READ_BLOCKS;
        uint64_t b0 = j * CKPT_CRC_BLOCK, b1 = (j + nb) * CKPT_CRC_BLOCK < total ? (j + nb) * CKPT_CRC_BLOCK : total;
        FSDP_TRY(ckpt_pread_all(r->fds[q->file], r->buf, b1 - b0, q->offset + b0, path));
        for (uint64_t k = 0; k < nb; k++) {
            uint64_t s = k * CKPT_CRC_BLOCK, e = s + CKPT_CRC_BLOCK < b1 - b0 ? s + CKPT_CRC_BLOCK : b1 - b0;
            uint32_t c = crc32c(r->buf + s, e - s);
            if (c != q->crcs[j + k])
                return error_set(FSDP_EINVAL,
                                 "%s: CRC32C mismatch in %s of '%s' (rank %d's piece, bytes %llu-%llu of the file): "
                                 "the checkpoint file is corrupted; resume from an earlier checkpoint",
                                 path, ckpt_kind_name(q->kind), r->l->params[q->param].name, q->rank,
                                 (unsigned long long)(q->offset + b0 + s), (unsigned long long)(q->offset + b0 + e));
        }
        if (dst) {
            uint64_t c0 = lo > b0 ? lo : b0, c1 = hi < b1 ? hi : b1;
            if (c1 > c0)
                memcpy(dst + (c0 - lo), r->buf + (c0 - b0), c1 - c0);
        }
        j += nb;
    }
    return 0;
}

int ckpt_read(struct ckpt_reader *r, int kind, int param, size_t begin, size_t count, float *dst)
{
    if (kind < 0 || kind >= CKPT_KINDS || param < 0 || param >= r->l->n_params)
        return error_set(FSDP_EINVAL, "checkpoint read: kind %d / param %d out of range", kind, param);
    const struct model_param *mp = &r->l->params[param];
    if (begin > mp->numel || count > mp->numel - begin)
        return error_set(FSDP_ERANGE, "checkpoint read: [%zu, +%zu) outside '%s' (%zu elements)", begin, count,
                         mp->name, mp->numel);
    size_t end = begin + count, covered = begin;
    size_t s = slot(r, kind, param);
    for (size_t i = r->first[s]; i < r->first[s + 1]; i++) {
        const struct ckpt_meta_piece *q = &r->meta.pieces[i];
        size_t a = begin > q->begin ? begin : (size_t)q->begin;
        size_t b = end < q->begin + q->count ? end : (size_t)(q->begin + q->count);
        if (a >= b)
            continue;
        FSDP_TRY(read_piece(r, q, (a - q->begin) * sizeof(float), (b - q->begin) * sizeof(float),
                            (char *)(dst + (a - begin))));
        if (b > covered)
            covered = b;
    }
    /* Only a full checkpoint leaves elements out: the vocabulary padding rows, which are zero. */
    if (covered < end)
        memset(dst + (covered - begin), 0, (end - covered) * sizeof(float));
    return 0;
}

int ckpt_verify(struct ckpt_reader *r, uint64_t *bytes_checked)
{
    uint64_t total = 0;
    for (int f = 0; f < r->meta.n_files; f++) {
        struct safetensors_file *sf;
        FSDP_TRY(safetensors_open(&sf, r->paths[f]));
        safetensors_close(sf);
    }
    for (size_t i = 0; i < r->meta.n_pieces; i++) {
        const struct ckpt_meta_piece *q = &r->meta.pieces[i];
        FSDP_TRY(read_piece(r, q, 0, q->count * sizeof(float), NULL));
        total += q->count * sizeof(float);
    }
    if (bytes_checked)
        *bytes_checked = total;
    return 0;
}
