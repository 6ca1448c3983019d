/* metadata.json: the one description of a checkpoint that every reader starts from (scalar state, model
 * config, files, and where every piece of every tensor lives with its block CRCs). It carries its own
 * CRC32C as its first key ("metadata_crc32c", computed with those 8 hex digits set to '0'), so it stays
 * plain JSON that jq reads and still cannot be silently corrupted. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/error.h"
#include "worker/ckpt/ckpt_internal.h"

static const char *const kind_names[CKPT_KINDS] = {"param", "exp_avg", "exp_avg_sq"};
static const char crc_key[] = "\"metadata_crc32c\":";

const char *ckpt_kind_name(int kind)
{
    return kind >= 0 && kind < CKPT_KINDS ? kind_names[kind] : NULL;
}

static int kind_parse(const char *s)
{
    for (int k = 0; k < CKPT_KINDS; k++)
        if (strcmp(s, kind_names[k]) == 0)
            return k;
    return -1;
}

size_t ckpt_param_real_numel(const struct model_param *p)
{
    return (size_t)p->init_rows * (p->ndim == 2 ? (size_t)p->shape[1] : 1);
}

static int cmp_piece(const void *a, const void *b)
{
    const struct ckpt_meta_piece *x = a, *y = b;
    if (x->kind != y->kind)
        return x->kind - y->kind;
    if (x->param != y->param)
        return x->param - y->param;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

int ckpt_check_coverage(struct ckpt_meta_piece *pieces, size_t n, const struct model_layout *l, bool full,
                        const char *what)
{
    qsort(pieces, n, sizeof *pieces, cmp_piece);
    size_t i = 0;
    for (int k = 0; k < CKPT_KINDS; k++)
        for (int p = 0; p < l->n_params; p++) {
            const struct model_param *mp = &l->params[p];
            uint64_t end = full ? ckpt_param_real_numel(mp) : mp->numel, pos = 0;
            for (; i < n && pieces[i].kind == k && pieces[i].param == p; i++) {
                const struct ckpt_meta_piece *q = &pieces[i];
                if (q->begin != pos)
                    return error_set(FSDP_EINVAL,
                                     "%s: %s of '%s': %s at element %llu (piece of rank %d starts at %llu)", what,
                                     kind_names[k], mp->name, q->begin > pos ? "gap" : "overlap",
                                     (unsigned long long)pos, q->rank, (unsigned long long)q->begin);
                pos += q->count;
            }
            if (pos != end)
                return error_set(FSDP_EINVAL,
                                 "%s: %s of '%s': pieces cover %llu of its %llu elements (a rank's pieces are "
                                 "missing or the model shape differs)",
                                 what, kind_names[k], mp->name, (unsigned long long)pos, (unsigned long long)end);
        }
    if (i != n)
        return error_set(FSDP_EINVAL, "%s: a piece names a tensor or kind outside the model", what);
    return 0;
}

void ckpt_meta_free(struct ckpt_meta *m)
{
    for (int i = 0; i < m->n_files; i++)
        free(m->files[i].name);
    for (size_t i = 0; i < m->n_pieces; i++)
        free(m->pieces[i].crcs);
    free(m->files);
    free(m->pieces);
    free(m->config_text);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- write */

static cJSON *shape_json(int ndim, int d0, int d1)
{
    cJSON *a = cJSON_CreateArray();
    cJSON_AddItemToArray(a, cJSON_CreateNumber(d0));
    if (ndim == 2)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(d1));
    return a;
}

static cJSON *build(const struct ckpt_meta *m, const struct model_layout *l)
{
    const struct ckpt_state *s = &m->state;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "metadata_crc32c", "00000000");
    cJSON_AddStringToObject(root, "format", CKPT_FORMAT_NAME);
    cJSON_AddNumberToObject(root, "format_version", CKPT_FORMAT_VERSION);
    cJSON_AddStringToObject(root, "state_dict_type", m->sharded ? "SHARDED_STATE_DICT" : "FULL_STATE_DICT");
    cJSON_AddNumberToObject(root, "step", (double)s->step);
    /* The data order is a pure function of the step, so the step is the data position; the model init
     * is a pure function of the seed, and nothing else in training draws random numbers. */
    cJSON_AddNumberToObject(root, "data_position", (double)s->step);
    cJSON_AddNumberToObject(root, "world_size", s->world_size);
    cJSON_AddStringToObject(root, "strategy", s->strategy);
    cJSON_AddNumberToObject(root, "fsdp_version", s->fsdp_version);
    cJSON_AddNumberToObject(root, "loss_scale", s->loss_scale);
    cJSON_AddNumberToObject(root, "scaler_good_steps", (double)s->scaler_good_steps);
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "model_family", s->model.model_family);
    cJSON_AddNumberToObject(model, "n_layer", s->model.n_layer);
    cJSON_AddNumberToObject(model, "n_head", s->model.n_head);
    cJSON_AddNumberToObject(model, "n_embd", s->model.n_embd);
    cJSON_AddNumberToObject(model, "head_dim", model_head_dim(&s->model));
    cJSON_AddNumberToObject(model, "vocab_size", s->model.vocab_size);
    cJSON_AddNumberToObject(model, "vocab_padded", l->vocab_padded);
    cJSON_AddNumberToObject(model, "block_size", s->model.block_size);
    /* the Llama keys (0 / defaults for a family that does not read them) */
    cJSON_AddNumberToObject(model, "n_kv_head", s->model.n_kv_head);
    cJSON_AddNumberToObject(model, "intermediate_size", s->model.intermediate_size);
    cJSON_AddNumberToObject(model, "rope_theta", s->model.rope_theta);
    cJSON_AddNumberToObject(model, "rms_norm_eps", s->model.rms_norm_eps);
    cJSON_AddBoolToObject(model, "tie_word_embeddings", s->model.tie_word_embeddings);
    if (s->model.sliding_window > 0) { /* absent: no window (and in older checkpoints) */
        cJSON_AddNumberToObject(model, "sliding_window", s->model.sliding_window);
        cJSON_AddNumberToObject(model, "max_window_layers", s->model.max_window_layers);
    }
    if (s->model.rope_scaling == MODEL_ROPE_LLAMA3) { /* absent: no scaling (and in older checkpoints) */
        cJSON *rs = cJSON_AddObjectToObject(model, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", s->model.rope_factor);
        cJSON_AddNumberToObject(rs, "low_freq_factor", s->model.rope_low_freq_factor);
        cJSON_AddNumberToObject(rs, "high_freq_factor", s->model.rope_high_freq_factor);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", s->model.rope_original_max_position);
    }
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)s->model.seed);
    cJSON_AddStringToObject(model, "seed", seed);
    cJSON_AddStringToObject(root, "config", s->config_text ? s->config_text : "");
    cJSON_AddNumberToObject(root, "crc_block_bytes", CKPT_CRC_BLOCK);
    cJSON *files = cJSON_AddArrayToObject(root, "files");
    for (int i = 0; i < m->n_files; i++) {
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "name", m->files[i].name);
        cJSON_AddNumberToObject(f, "bytes", (double)m->files[i].bytes);
        cJSON_AddNumberToObject(f, "header_bytes", (double)m->files[i].header_bytes);
        cJSON_AddNumberToObject(f, "header_crc32c", m->files[i].header_crc);
        cJSON_AddItemToArray(files, f);
    }
    cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
    size_t pi = 0; /* pieces are sorted by (kind, param, begin) */
    cJSON **per = calloc((size_t)l->n_params * CKPT_KINDS, sizeof *per);
    if (!per) {
        cJSON_Delete(root);
        return NULL;
    }
    for (int p = 0; p < l->n_params; p++) {
        const struct model_param *mp = &l->params[p];
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "name", mp->name);
        cJSON_AddStringToObject(t, "dtype", "F32");
        cJSON_AddItemToObject(t, "shape", shape_json(mp->ndim, mp->shape[0], mp->shape[1]));
        cJSON_AddItemToObject(t, "stored_shape",
                              shape_json(mp->ndim, m->sharded ? mp->shape[0] : mp->init_rows, mp->shape[1]));
        cJSON *pieces = cJSON_AddObjectToObject(t, "pieces");
        for (int k = 0; k < CKPT_KINDS; k++)
            per[(size_t)p * CKPT_KINDS + k] = cJSON_AddArrayToObject(pieces, kind_names[k]);
        cJSON_AddItemToArray(tensors, t);
    }
    for (; pi < m->n_pieces; pi++) {
        const struct ckpt_meta_piece *q = &m->pieces[pi];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", q->rank);
        cJSON_AddNumberToObject(o, "file", q->file);
        cJSON_AddNumberToObject(o, "begin", (double)q->begin);
        cJSON_AddNumberToObject(o, "count", (double)q->count);
        cJSON_AddNumberToObject(o, "offset", (double)q->offset);
        cJSON *c = cJSON_AddArrayToObject(o, "crc32c");
        for (size_t j = 0; j < q->n_crcs; j++)
            cJSON_AddItemToArray(c, cJSON_CreateNumber(q->crcs[j]));
        cJSON_AddItemToArray(per[(size_t)q->param * CKPT_KINDS + q->kind], o);
    }
    free(per);
    return root;
}

int ckpt_meta_write(const char *dir, const struct ckpt_meta *m, const struct model_layout *l)
{
    cJSON *root = build(m, l);
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text)
        return error_set(FSDP_ENOMEM, "out of memory building %s", CKPT_META_FILE);
    char *at = strstr(text, crc_key);
    char *q = at ? strchr(at + sizeof crc_key - 1, '"') : NULL;
    size_t len = strlen(text);
    char path[FSDP_PATH_MAX];
    int rc = 0, fd = -1;
    if (!q) {
        rc = error_set(FSDP_EINVAL, "internal: metadata CRC field missing");
        goto out;
    }
    char hex[9];
    snprintf(hex, sizeof hex, "%08x", crc32c(text, len));
    memcpy(q + 1, hex, 8);
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_META_FILE);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = error_set(FSDP_EIO, "%s: cannot create: %s", path, strerror(errno));
        goto out;
    }
    FSDP_TRY_GOTO(ckpt_write_all(fd, text, len, path), rc, out);
    FSDP_TRY_GOTO(ckpt_write_all(fd, "\n", 1, path), rc, out);
    if (fsync(fd) != 0)
        rc = error_set(FSDP_EIO, "%s: fsync: %s", path, strerror(errno));
out:
    if (fd >= 0 && close(fd) != 0 && rc == 0)
        rc = error_set(FSDP_EIO, "%s: close: %s", path, strerror(errno));
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- read */

static int get_num(const cJSON *o, const char *key, double *out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(j))
        return -1;
    *out = j->valuedouble;
    return 0;
}

static int get_u64(const cJSON *o, const char *key, uint64_t *out)
{
    double d;
    if (get_num(o, key, &d) != 0 || !(d >= 0) || d > 9007199254740992.0 || d != (double)(uint64_t)d)
        return -1;
    *out = (uint64_t)d;
    return 0;
}

static int get_int(const cJSON *o, const char *key, int *out)
{
    uint64_t v;
    if (get_u64(o, key, &v) != 0 || v > 0x7fffffff)
        return -1;
    *out = (int)v;
    return 0;
}

static int read_text(const char *path, char **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return error_set(FSDP_ENOTFOUND,
                             "%s: missing (not a checkpoint directory, or a save that never completed)", path);
        return error_set(FSDP_EIO, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat st;
    int rc = 0;
    char *text = NULL;
    if (fstat(fd, &st) != 0 || st.st_size > (1ll << 31) || !(text = malloc((size_t)st.st_size + 1))) {
        rc = error_set(FSDP_EIO, "%s: cannot read (size %lld)", path, (long long)st.st_size);
        goto fail;
    }
    FSDP_TRY_GOTO(ckpt_pread_all(fd, text, (size_t)st.st_size, 0, path), rc, fail);
    close(fd);
    text[st.st_size] = '\0';
    *out = text;
    *len = (size_t)st.st_size;
    return 0;
fail:
    close(fd);
    free(text);
    return rc;
}

static int parse_piece(const char *path, const cJSON *o, int kind, int tensor, int n_files,
                       struct ckpt_meta_piece *q)
{
    q->kind = kind;
    q->param = tensor;
    if (get_int(o, "rank", &q->rank) || get_int(o, "file", &q->file) || q->file >= n_files ||
        get_u64(o, "begin", &q->begin) || get_u64(o, "count", &q->count) || get_u64(o, "offset", &q->offset))
        return error_set(FSDP_EINVAL, "%s: a piece lacks rank/file/begin/count/offset or names no listed file",
                         path);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "crc32c");
    size_t want = (q->count * sizeof(float) + CKPT_CRC_BLOCK - 1) / CKPT_CRC_BLOCK;
    if (!cJSON_IsArray(c) || (size_t)cJSON_GetArraySize(c) != want)
        return error_set(FSDP_EINVAL, "%s: a piece has no crc32c list of %zu block checksums", path, want);
    q->crcs = malloc((want ? want : 1) * sizeof *q->crcs);
    if (!q->crcs)
        return error_set(FSDP_ENOMEM, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, c)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 4294967295.0)
            return error_set(FSDP_EINVAL, "%s: a block checksum is not a 32-bit number", path);
        q->crcs[q->n_crcs++] = (uint32_t)e->valuedouble;
    }
    return 0;
}

static int parse(const char *path, const cJSON *root, struct ckpt_meta *m, char ***names_out, int *n_out)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "state_dict_type");
    const cJSON *strategy = cJSON_GetObjectItemCaseSensitive(root, "strategy");
    const cJSON *config = cJSON_GetObjectItemCaseSensitive(root, "config");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    int version = 0;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, CKPT_FORMAT_NAME) != 0)
        return error_set(FSDP_EINVAL, "%s: not an fsdpc checkpoint (format is not \"%s\")", path, CKPT_FORMAT_NAME);
    if (get_int(root, "format_version", &version) || version != CKPT_FORMAT_VERSION)
        return error_set(FSDP_EUNSUPPORTED, "%s: format_version %d; this build reads version %d", path, version,
                         CKPT_FORMAT_VERSION);
    if (!cJSON_IsString(type) || !cJSON_IsString(strategy) || !cJSON_IsString(config) || !cJSON_IsObject(model))
        return error_set(FSDP_EINVAL, "%s: missing state_dict_type, strategy, config or model", path);
    m->sharded = strcmp(type->valuestring, "SHARDED_STATE_DICT") == 0;
    if (!m->sharded && strcmp(type->valuestring, "FULL_STATE_DICT") != 0)
        return error_set(FSDP_EINVAL, "%s: unknown state_dict_type \"%s\"", path, type->valuestring);
    struct ckpt_state *s = &m->state;
    uint64_t step, good;
    double ls;
    const cJSON *fam = cJSON_GetObjectItemCaseSensitive(model, "model_family");
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(model, "seed");
    model_config_default(&s->model);
    /* Counts are whole numbers a double holds exactly (get_u64); a loss scale is a positive finite number. */
    if (get_u64(root, "step", &step) || get_num(root, "loss_scale", &ls) || !isfinite(ls) || !(ls > 0) ||
        get_u64(root, "scaler_good_steps", &good) || get_int(root, "world_size", &s->world_size) ||
        get_int(root, "fsdp_version", &s->fsdp_version) || !cJSON_IsString(fam) ||
        get_int(model, "n_layer", &s->model.n_layer) || get_int(model, "n_head", &s->model.n_head) ||
        get_int(model, "n_embd", &s->model.n_embd) || get_int(model, "vocab_size", &s->model.vocab_size) ||
        get_int(model, "block_size", &s->model.block_size) || get_int(model, "vocab_padded", &m->vocab_padded))
        return error_set(FSDP_EINVAL, "%s: missing or malformed scalar state or model config", path);
    s->step = (int64_t)step;
    s->loss_scale = ls;
    s->scaler_good_steps = (int64_t)good;
    snprintf(s->strategy, sizeof s->strategy, "%s", strategy->valuestring);
    snprintf(s->model.model_family, sizeof s->model.model_family, "%s", fam->valuestring);
    if (cJSON_IsString(seed))
        s->model.seed = strtoull(seed->valuestring, NULL, 10);
    /* optional: absent from checkpoints of families without them */
    /* absent from checkpoints written before head_dim was a key: n_embd / n_head */
    if (cJSON_GetObjectItemCaseSensitive(model, "head_dim") &&
        (get_int(model, "head_dim", &s->model.head_dim) || s->model.head_dim < 1))
        return error_set(FSDP_EINVAL, "%s: malformed model.head_dim", path);
    double theta, eps;
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(model, "tie_word_embeddings");
    if ((cJSON_GetObjectItemCaseSensitive(model, "n_kv_head") && get_int(model, "n_kv_head", &s->model.n_kv_head)) ||
        (cJSON_GetObjectItemCaseSensitive(model, "intermediate_size") &&
         get_int(model, "intermediate_size", &s->model.intermediate_size)) ||
        (tie && !cJSON_IsBool(tie)))
        return error_set(FSDP_EINVAL, "%s: malformed n_kv_head, intermediate_size or tie_word_embeddings", path);
    if (get_num(model, "rope_theta", &theta) == 0)
        s->model.rope_theta = (float)theta;
    if (get_num(model, "rms_norm_eps", &eps) == 0)
        s->model.rms_norm_eps = (float)eps;
    s->model.tie_word_embeddings = cJSON_IsTrue(tie);
    if ((cJSON_GetObjectItemCaseSensitive(model, "sliding_window") &&
         (get_int(model, "sliding_window", &s->model.sliding_window) || s->model.sliding_window < 0)) ||
        (cJSON_GetObjectItemCaseSensitive(model, "max_window_layers") &&
         (get_int(model, "max_window_layers", &s->model.max_window_layers) || s->model.max_window_layers < 0)))
        return error_set(FSDP_EINVAL, "%s: malformed model.sliding_window or model.max_window_layers", path);
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(model, "rope_scaling");
    if (rs) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        double f, lo, hi;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "llama3") != 0 || get_num(rs, "factor", &f) ||
            get_num(rs, "low_freq_factor", &lo) || get_num(rs, "high_freq_factor", &hi) ||
            get_int(rs, "original_max_position_embeddings", &s->model.rope_original_max_position))
            return error_set(FSDP_EINVAL, "%s: malformed model.rope_scaling (rope_type \"llama3\" and its four numbers)",
                             path);
        s->model.rope_scaling = MODEL_ROPE_LLAMA3;
        s->model.rope_factor = (float)f;
        s->model.rope_low_freq_factor = (float)lo;
        s->model.rope_high_freq_factor = (float)hi;
    }
    if (!(m->config_text = strdup(config->valuestring)))
        return error_set(FSDP_ENOMEM, "out of memory");
    s->config_text = m->config_text;

    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    if (!cJSON_IsArray(files) || !cJSON_IsArray(tensors))
        return error_set(FSDP_EINVAL, "%s: missing files or tensors list", path);
    int nf = cJSON_GetArraySize(files), nt = cJSON_GetArraySize(tensors);
    m->files = calloc(nf ? (size_t)nf : 1, sizeof *m->files);
    char **names = calloc(nt ? (size_t)nt : 1, sizeof *names);
    *names_out = names;
    if (!m->files || !names)
        return error_set(FSDP_ENOMEM, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, files)
    {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
        struct ckpt_meta_file *f = &m->files[m->n_files];
        uint64_t hcrc;
        if (!cJSON_IsString(n) || strchr(n->valuestring, '/') || get_u64(e, "bytes", &f->bytes) ||
            get_u64(e, "header_bytes", &f->header_bytes) || get_u64(e, "header_crc32c", &hcrc) ||
            hcrc > 0xffffffffu || f->header_bytes > f->bytes)
            return error_set(FSDP_EINVAL, "%s: a file entry lacks a plain name, bytes or header checksum", path);
        f->header_crc = (uint32_t)hcrc;
        if (!(f->name = strdup(n->valuestring)))
            return error_set(FSDP_ENOMEM, "out of memory");
        m->n_files++;
    }
    size_t cap = 0;
    cJSON_ArrayForEach(e, tensors)
    {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *pieces = cJSON_GetObjectItemCaseSensitive(e, "pieces");
        if (!cJSON_IsString(n) || !cJSON_IsObject(pieces))
            return error_set(FSDP_EINVAL, "%s: a tensor entry lacks name or pieces", path);
        int ti = *n_out;
        if (!(names[ti] = strdup(n->valuestring)))
            return error_set(FSDP_ENOMEM, "out of memory");
        (*n_out)++;
        const cJSON *list;
        cJSON_ArrayForEach(list, pieces)
        {
            int kind = kind_parse(list->string);
            if (kind < 0 || !cJSON_IsArray(list))
                return error_set(FSDP_EINVAL, "%s: tensor '%s': unknown kind \"%s\"", path, names[ti], list->string);
            const cJSON *o;
            cJSON_ArrayForEach(o, list)
            {
                if (m->n_pieces == cap) {
                    cap = cap ? 2 * cap : 64;
                    struct ckpt_meta_piece *np = realloc(m->pieces, cap * sizeof *np);
                    if (!np)
                        return error_set(FSDP_ENOMEM, "out of memory");
                    m->pieces = np;
                }
                struct ckpt_meta_piece *q = &m->pieces[m->n_pieces];
                memset(q, 0, sizeof *q);
                m->n_pieces++;
                FSDP_TRY(parse_piece(path, o, kind, ti, m->n_files, q));
            }
        }
    }
    return 0;
}

int ckpt_meta_parse(const char *path, char *text, size_t len, struct ckpt_meta *m, char ***tensor_names,
                    int *n_tensors)
{
    memset(m, 0, sizeof *m);
    *tensor_names = NULL;
    *n_tensors = 0;
    char *at = memmem(text, len, crc_key, sizeof crc_key - 1);
    char *q = at ? memchr(at + sizeof crc_key - 1, '"', len - (size_t)(at + sizeof crc_key - 1 - text)) : NULL;
    if (!q || (size_t)(q - text) + 9 > len)
        return error_set(FSDP_EINVAL, "%s: no metadata_crc32c field (not an fsdpc checkpoint, or damaged)", path);
    char stored[9];
    memcpy(stored, q + 1, 8);
    stored[8] = '\0';
    memset(q + 1, '0', 8);
    /* The file ends with a newline that the CRC does not cover. */
    size_t body = len && text[len - 1] == '\n' ? len - 1 : len;
    char want[9];
    snprintf(want, sizeof want, "%08x", crc32c(text, body));
    memcpy(q + 1, stored, 8);
    if (strcmp(stored, want) != 0)
        return error_set(FSDP_EINVAL, "%s: CRC32C mismatch (stored %s, computed %s): the metadata file is "
                                      "corrupted or was edited",
                         path, stored, want);
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root)
        return error_set(FSDP_EINVAL, "%s: not valid JSON", path);
    int rc = parse(path, root, m, tensor_names, n_tensors);
    cJSON_Delete(root);
    return rc;
}

int ckpt_meta_read(const char *dir, struct ckpt_meta *m, char ***tensor_names, int *n_tensors)
{
    memset(m, 0, sizeof *m);
    *tensor_names = NULL;
    *n_tensors = 0;
    char path[FSDP_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_META_FILE);
    char *text = NULL;
    size_t len = 0;
    FSDP_TRY(read_text(path, &text, &len));
    int rc = ckpt_meta_parse(path, text, len, m, tensor_names, n_tensors);
    free(text);
    return rc;
}
