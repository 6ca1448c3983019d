/* SHARDED_STATE_DICT save: each rank writes its own pieces as one safetensors file (so any safetensors
 * tool can look inside a shard), with block CRCs in its __metadata__; rank 0 then gathers every rank's
 * piece table from the file headers alone (no data read), checks that together they tile every tensor,
 * and commits the directory. */
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

static void sharded_names(const char *root, int64_t step, char *tmp, char *name, size_t cap)
{
    snprintf(name, cap, "fsdp_sharded_cpt%" PRId64, step);
    snprintf(tmp, FSDP_PATH_MAX, "%s/%s%s", root, CKPT_TMP_PREFIX, name);
}

static void entry_name(char *out, size_t cap, int kind, const char *param, size_t begin)
{
    snprintf(out, cap, "%s.%s@%zu", ckpt_kind_name(kind), param, begin);
}

/* Inverse of entry_name: kind names are tried longest first ("exp_avg_sq." before "exp_avg."). */
static int entry_parse(const char *s, const struct model_layout *l, int *kind, int *param, uint64_t *begin)
{
    static const int order[CKPT_KINDS] = {CKPT_EXP_AVG_SQ, CKPT_EXP_AVG, CKPT_PARAM};
    for (int i = 0; i < CKPT_KINDS; i++) {
        const char *k = ckpt_kind_name(order[i]);
        size_t kl = strlen(k);
        if (strncmp(s, k, kl) != 0 || s[kl] != '.')
            continue;
        const char *at = strrchr(s, '@');
        if (!at || at - (s + kl + 1) >= MODEL_NAME_MAX)
            return -1;
        char name[MODEL_NAME_MAX];
        memcpy(name, s + kl + 1, (size_t)(at - (s + kl + 1)));
        name[at - (s + kl + 1)] = '\0';
        char *end;
        errno = 0;
        unsigned long long b = strtoull(at + 1, &end, 10);
        if (*end || errno || (*param = model_layout_find(l, name)) < 0)
            return -1;
        *kind = order[i];
        *begin = b;
        return 0;
    }
    return -1;
}

static int cmp_ptr_piece(const void *a, const void *b)
{
    const struct ckpt_piece *x = *(const struct ckpt_piece *const *)a, *y = *(const struct ckpt_piece *const *)b;
    if (x->kind != y->kind)
        return x->kind - y->kind;
    if (x->param != y->param)
        return x->param - y->param;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

static int check_pieces(const struct model_layout *l, const struct ckpt_piece *pieces, size_t n, int rank)
{
    const struct ckpt_piece **s = malloc((n ? n : 1) * sizeof *s);
    if (!s)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        const struct ckpt_piece *p = &pieces[i];
        s[i] = p;
        if (p->kind < 0 || p->kind >= CKPT_KINDS || p->param < 0 || p->param >= l->n_params) {
            rc = error_set(FSDP_EINVAL, "checkpoint rank %d: piece %zu has kind %d / param %d out of range", rank,
                           i, p->kind, p->param);
            goto out;
        }
        if (p->begin > l->params[p->param].numel || p->count > l->params[p->param].numel - p->begin ||
            (p->count && !p->data)) {
            rc = error_set(FSDP_EINVAL, "checkpoint rank %d: piece [%zu, +%zu) of %s '%s' (%zu elements) is out "
                                        "of range or has no data",
                           rank, p->begin, p->count, ckpt_kind_name(p->kind), l->params[p->param].name,
                           l->params[p->param].numel);
            goto out;
        }
    }
    qsort(s, n, sizeof *s, cmp_ptr_piece);
    for (size_t i = 1; i < n; i++)
        if (s[i]->kind == s[i - 1]->kind && s[i]->param == s[i - 1]->param &&
            s[i]->begin < s[i - 1]->begin + s[i - 1]->count) {
            rc = error_set(FSDP_EINVAL, "checkpoint rank %d: pieces of %s '%s' overlap at element %zu", rank,
                           ckpt_kind_name(s[i]->kind), l->params[s[i]->param].name, s[i]->begin);
            goto out;
        }
out:
    free(s);
    return rc;
}

/* The CRC list of one piece as __metadata__ text: comma-separated 8-digit hex. */
static char *crc_text(const uint32_t *c, size_t n)
{
    char *t = malloc(n * 9 + 1);
    if (!t)
        return NULL;
    size_t pos = 0;
    t[0] = '\0';
    for (size_t i = 0; i < n; i++)
        pos += (size_t)snprintf(t + pos, 10, i ? ",%08x" : "%08x", c[i]);
    return t;
}

int ckpt_sharded_write_rank(const char *root, int64_t step, int rank, const struct model_layout *l,
                            const struct ckpt_piece *pieces, size_t n)
{
    FSDP_TRY(check_pieces(l, pieces, n, rank));
    char tmp[FSDP_PATH_MAX], name[256], path[FSDP_PATH_MAX];
    sharded_names(root, step, tmp, name, sizeof name);
    ckpt_pathf(path, "%s/%s_rank%d", tmp, name, rank);
    FSDP_TRY(ckpt_mkdir(root));
    FSDP_TRY(ckpt_mkdir(tmp));

    /* n entries + n CRC lists + 3 fixed metadata keys. The CRC lists are fixed-width hex, so the header
     * is sized with zeros first, the data written (and checksummed) behind it in one pass, and the real
     * header, of the same length, written last. */
    struct safetensors_entry *ent = calloc(n ? n : 1, sizeof *ent);
    struct safetensors_meta *meta = calloc(n + 3, sizeof *meta);
    char *names = malloc((n ? n : 1) * 2 * (MODEL_NAME_MAX + 48));
    uint32_t **crcs = calloc(n ? n : 1, sizeof *crcs);
    char fixed[3][32];
    void *header = NULL;
    size_t hbytes = 0;
    int rc = 0, fd = -1;
    if (!ent || !meta || !names || !crcs) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    snprintf(fixed[0], sizeof fixed[0], "%" PRId64, step);
    snprintf(fixed[1], sizeof fixed[1], "%d", rank);
    meta[0] = (struct safetensors_meta){.key = "format", .value = "fsdpc-shard"};
    meta[1] = (struct safetensors_meta){.key = "step", .value = fixed[0]};
    meta[2] = (struct safetensors_meta){.key = "rank", .value = fixed[1]};
    for (size_t i = 0; i < n; i++) {
        const struct ckpt_piece *p = &pieces[i];
        char *en = names + i * 2 * (MODEL_NAME_MAX + 48), *ck = en + MODEL_NAME_MAX + 48;
        entry_name(en, MODEL_NAME_MAX + 48, p->kind, l->params[p->param].name, p->begin);
        snprintf(ck, MODEL_NAME_MAX + 48, "crc32c.%s", en);
        ent[i] = (struct safetensors_entry){
            .name = en, .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {(int64_t)p->count}, .data = p->data};
        size_t nc = (p->count * sizeof(float) + CKPT_CRC_BLOCK - 1) / CKPT_CRC_BLOCK;
        crcs[i] = calloc(nc ? nc : 1, sizeof *crcs[i]);
        meta[3 + i].key = ck;
        meta[3 + i].value = crcs[i] ? crc_text(crcs[i], nc) : NULL;
        if (!meta[3 + i].value) {
            rc = error_set(FSDP_ENOMEM, "out of memory");
            goto out;
        }
    }
    FSDP_TRY_GOTO(safetensors_header(path, ent, n, meta, n + 3, &header, &hbytes), rc, out);
    if ((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
        rc = error_set(FSDP_EIO, "%s: cannot create: %s", path, strerror(errno));
        goto out;
    }
    uint64_t pos = hbytes;
    for (size_t i = 0; i < n; i++) {
        FSDP_TRY_GOTO(ckpt_write_crc(fd, pos, pieces[i].data, pieces[i].count, crcs[i], path), rc, out);
        pos += pieces[i].count * sizeof(float);
        size_t nc = (pieces[i].count * sizeof(float) + CKPT_CRC_BLOCK - 1) / CKPT_CRC_BLOCK;
        free(meta[3 + i].value);
        if (!(meta[3 + i].value = crc_text(crcs[i], nc))) {
            rc = error_set(FSDP_ENOMEM, "out of memory");
            goto out;
        }
    }
    size_t again = 0;
    free(header);
    header = NULL;
    FSDP_TRY_GOTO(safetensors_header(path, ent, n, meta, n + 3, &header, &again), rc, out);
    if (again != hbytes) {
        rc = error_set(FSDP_EINVAL, "internal: shard header changed length (%zu -> %zu)", hbytes, again);
        goto out;
    }
    FSDP_TRY_GOTO(ckpt_pwrite_all(fd, header, hbytes, 0, path), rc, out);
    if (fsync(fd) != 0)
        rc = error_set(FSDP_EIO, "%s: fsync: %s", path, strerror(errno));
out:
    if (fd >= 0 && close(fd) != 0 && rc == 0)
        rc = error_set(FSDP_EIO, "%s: close: %s", path, strerror(errno));
    if (fd >= 0 && rc != 0)
        unlink(path); /* a partial shard must not be mistaken for a finished one by the commit */
    free(header);
    for (size_t i = 0; meta && i < n; i++)
        free(meta[3 + i].value);
    for (size_t i = 0; crcs && i < n; i++)
        free(crcs[i]);
    free(crcs);
    free(ent);
    free(meta);
    free(names);
    return rc;
}

static int parse_crcs(const char *text, struct ckpt_meta_piece *q)
{
    size_t want = (q->count * sizeof(float) + CKPT_CRC_BLOCK - 1) / CKPT_CRC_BLOCK;
    q->crcs = malloc((want ? want : 1) * sizeof *q->crcs);
    if (!q->crcs)
        return -1;
    const char *s = text;
    for (q->n_crcs = 0; q->n_crcs < want; q->n_crcs++) {
        char *end;
        unsigned long v = strtoul(s, &end, 16);
        if (end == s || v > 0xffffffffu)
            return -1;
        q->crcs[q->n_crcs] = (uint32_t)v;
        s = *end == ',' ? end + 1 : end;
    }
    return *s ? -1 : 0;
}

/* Reads one rank file's header into m (file index = rank). */
static int gather_rank(struct ckpt_meta *m, size_t *cap, const char *path, int rank, int64_t step,
                       const struct model_layout *l)
{
    struct safetensors_file *f;
    int rc = safetensors_open(&f, path);
    if (rc == FSDP_ENOTFOUND)
        return error_set(FSDP_ENOTFOUND, "%s: missing: rank %d did not write its shard (it failed or has not "
                                         "reached the checkpoint barrier)",
                         path, rank);
    if (rc != 0)
        return rc;
    const char *fs = safetensors_meta_get(f, "step"), *fr = safetensors_meta_get(f, "rank");
    char want_step[32], want_rank[32];
    snprintf(want_step, sizeof want_step, "%" PRId64, step);
    snprintf(want_rank, sizeof want_rank, "%d", rank);
    if (!fs || !fr || strcmp(fs, want_step) != 0 || strcmp(fr, want_rank) != 0) {
        rc = error_set(FSDP_EINVAL, "%s: header says step %s rank %s, expected step %s rank %s", path,
                       fs ? fs : "?", fr ? fr : "?", want_step, want_rank);
        goto out;
    }
    for (size_t i = 0; i < f->n_tensors; i++) {
        const struct safetensors_tensor *t = &f->tensors[i];
        if (m->n_pieces == *cap) {
            *cap = *cap ? 2 * *cap : 64;
            struct ckpt_meta_piece *np = realloc(m->pieces, *cap * sizeof *np);
            if (!np) {
                rc = error_set(FSDP_ENOMEM, "out of memory");
                goto out;
            }
            m->pieces = np;
        }
        struct ckpt_meta_piece *q = &m->pieces[m->n_pieces];
        memset(q, 0, sizeof *q);
        m->n_pieces++;
        q->rank = q->file = rank;
        q->count = t->numel;
        q->offset = f->data_start + t->begin;
        char key[MODEL_NAME_MAX + 64];
        snprintf(key, sizeof key, "crc32c.%s", t->name);
        const char *crc = safetensors_meta_get(f, key);
        if (t->dtype != SAFETENSORS_F32 || t->ndim != 1 || entry_parse(t->name, l, &q->kind, &q->param, &q->begin)) {
            rc = error_set(FSDP_EINVAL, "%s: tensor '%s' is not a shard of this model (F32 1-D "
                                        "\"<kind>.<parameter>@<begin>\")",
                           path, t->name);
            goto out;
        }
        if (!crc || parse_crcs(crc, q) != 0) {
            rc = error_set(FSDP_EINVAL, "%s: tensor '%s' has no valid block CRC list", path, t->name);
            goto out;
        }
    }
    struct ckpt_meta_file *mf = &m->files[rank];
    mf->bytes = f->file_size;
    mf->header_bytes = f->data_start;
    FSDP_TRY_GOTO(ckpt_crc_prefix(f->fd, f->data_start, &mf->header_crc, path), rc, out);
    mf->name = strdup(strrchr(path, '/') + 1);
    if (!mf->name)
        rc = error_set(FSDP_ENOMEM, "out of memory");
out:
    safetensors_close(f);
    return rc;
}

/* Rank files from a crashed attempt at a larger world size would otherwise ride along. */
static void remove_extra_ranks(const char *tmp, const char *name, int world)
{
    for (int r = world;; r++) {
        char path[FSDP_PATH_MAX];
        ckpt_pathf(path, "%s/%s_rank%d", tmp, name, r);
        if (unlink(path) != 0)
            break;
    }
}

int ckpt_sharded_commit(const char *root, int64_t step, int world, const struct model_layout *l,
                        const struct ckpt_state *state, int keep_last)
{
    char tmp[FSDP_PATH_MAX], name[256];
    sharded_names(root, step, tmp, name, sizeof name);
    if (world < 1 || state->step != step)
        return error_set(FSDP_EINVAL, "checkpoint commit: %d writers / step %" PRId64 " (state step %" PRId64 ")",
                         world, step, state->step);
    struct ckpt_meta m = {.sharded = true, .state = *state, .vocab_padded = l->vocab_padded};
    m.files = calloc((size_t)world, sizeof *m.files);
    int rc = 0;
    if (!m.files) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    m.n_files = world; /* only with the array: ckpt_meta_free walks n_files entries */
    size_t cap = 0;
    for (int r = 0; r < world; r++) {
        char path[FSDP_PATH_MAX];
        ckpt_pathf(path, "%s/%s_rank%d", tmp, name, r);
        FSDP_TRY_GOTO(gather_rank(&m, &cap, path, r, step, l), rc, out);
    }
    FSDP_TRY_GOTO(ckpt_check_coverage(m.pieces, m.n_pieces, l, false, tmp), rc, out);
    remove_extra_ranks(tmp, name, world);
    FSDP_TRY_GOTO(ckpt_meta_write(tmp, &m, l), rc, out);
    FSDP_TRY_GOTO(ckpt_copy_tokenizer(tmp, state->tokenizer), rc, out);
    FSDP_TRY_GOTO(ckpt_commit_dir(root, tmp, name, keep_last), rc, out);
out:
    m.state.config_text = NULL;
    ckpt_meta_free(&m);
    if (rc != 0) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", error_message());
        ckpt_remove_tree(tmp);
        return error_set(rc, "checkpoint step %" PRId64 " not saved: %s", step, msg);
    }
    log_info("checkpoint: saved %s/%s (sharded, world %d)", root, name, world);
    return 0;
}

void ckpt_sharded_abort(const char *root, int64_t step)
{
    char tmp[FSDP_PATH_MAX], name[256];
    sharded_names(root, step, tmp, name, sizeof name);
    ckpt_remove_tree(tmp);
}
