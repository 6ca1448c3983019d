/* safetensors reader and atomic writer (see safetensors.h). The header is parsed with libcjson; the
 * checks after parsing are the ones the format's reference implementation makes, so a file we accept
 * loads anywhere and a file we write is accepted by every other reader. */
#include "common/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fs.h"

static const struct {
    const char *name;
    size_t size;
} dtype_info[SAFETENSORS_DTYPE_COUNT] = {
    [SAFETENSORS_F64] = {"F64", 8},  [SAFETENSORS_F32] = {"F32", 4},   [SAFETENSORS_F16] = {"F16", 2},
    [SAFETENSORS_BF16] = {"BF16", 2}, [SAFETENSORS_I64] = {"I64", 8},  [SAFETENSORS_I32] = {"I32", 4},
    [SAFETENSORS_I16] = {"I16", 2},  [SAFETENSORS_I8] = {"I8", 1},     [SAFETENSORS_U64] = {"U64", 8},
    [SAFETENSORS_U32] = {"U32", 4},  [SAFETENSORS_U16] = {"U16", 2},   [SAFETENSORS_U8] = {"U8", 1},
    [SAFETENSORS_BOOL] = {"BOOL", 1},
};

const char *safetensors_dtype_name(enum safetensors_dtype dtype)
{
    return (unsigned)dtype < SAFETENSORS_DTYPE_COUNT ? dtype_info[dtype].name : NULL;
}

size_t safetensors_dtype_size(enum safetensors_dtype dtype)
{
    return (unsigned)dtype < SAFETENSORS_DTYPE_COUNT ? dtype_info[dtype].size : 0;
}

int safetensors_dtype_parse(const char *name, enum safetensors_dtype *out)
{
    for (int i = 0; i < SAFETENSORS_DTYPE_COUNT; i++)
        if (strcmp(name, dtype_info[i].name) == 0) {
            *out = (enum safetensors_dtype)i;
            return 0;
        }
    return error_set(FSDP_EINVAL, "unknown dtype \"%s\"", name);
}

/* ---------------------------------------------------------------- reader */

void safetensors_close(struct safetensors_file *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    for (size_t i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    for (size_t i = 0; i < f->n_meta; i++) {
        free(f->meta[i].key);
        free(f->meta[i].value);
    }
    free(f->tensors);
    free(f->meta);
    free(f->path);
    free(f);
}

/* JSON numbers are doubles: an offset or dimension must be a non-negative integer that a double holds
 * exactly (2^53), which covers any file that fits on a disk. */
static int json_to_u64(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return -1;
    double d = j->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != (double)(uint64_t)d)
        return -1;
    *out = (uint64_t)d;
    return 0;
}

static int parse_tensor(struct safetensors_file *f, const cJSON *j, struct safetensors_tensor *t)
{
    const char *p = f->path, *n = j->string;
    if (!cJSON_IsObject(j))
        return error_set(FSDP_EINVAL, "%s: tensor '%s': entry is not a JSON object", p, n);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off))
        return error_set(FSDP_EINVAL,
                         "%s: tensor '%s': needs \"dtype\" (string), \"shape\" and \"data_offsets\" (arrays)",
                         p, n);
    if (safetensors_dtype_parse(dt->valuestring, &t->dtype) != 0)
        return error_set(FSDP_EINVAL, "%s: tensor '%s': unknown dtype \"%s\"", p, n, dt->valuestring);
    int nd = cJSON_GetArraySize(sh);
    if (nd > SAFETENSORS_MAX_DIMS)
        return error_set(FSDP_EINVAL, "%s: tensor '%s': %d dimensions (at most %d)", p, n, nd,
                         SAFETENSORS_MAX_DIMS);
    t->ndim = nd;
    t->numel = 1;
    int d = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, sh)
    {
        uint64_t v;
        if (json_to_u64(e, &v) != 0 || v > INT64_MAX)
            return error_set(FSDP_EINVAL, "%s: tensor '%s': shape[%d] is not a non-negative integer", p, n,
                             d);
        if (v && t->numel > UINT64_MAX / v)
            return error_set(FSDP_EINVAL, "%s: tensor '%s': shape overflows", p, n);
        t->shape[d++] = (int64_t)v;
        t->numel *= v;
    }
    if (cJSON_GetArraySize(off) != 2 || json_to_u64(cJSON_GetArrayItem(off, 0), &t->begin) != 0 ||
        json_to_u64(cJSON_GetArrayItem(off, 1), &t->end) != 0 || t->end < t->begin)
        return error_set(FSDP_EINVAL, "%s: tensor '%s': data_offsets must be [begin, end] with begin <= end",
                         p, n);
    size_t es = safetensors_dtype_size(t->dtype);
    if (t->numel > UINT64_MAX / es || t->end - t->begin != t->numel * es)
        return error_set(FSDP_EINVAL,
                         "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but %s shape needs %llu",
                         p, n, (unsigned long long)t->begin, (unsigned long long)t->end,
                         (unsigned long long)(t->end - t->begin), dtype_info[t->dtype].name,
                         (unsigned long long)(t->numel * es));
    t->name = strdup(n);
    return t->name ? 0 : error_set(FSDP_ENOMEM, "out of memory");
}

static int parse_meta(struct safetensors_file *f, const cJSON *j)
{
    if (!cJSON_IsObject(j))
        return error_set(FSDP_EINVAL, "%s: __metadata__ is not a JSON object", f->path);
    int n = cJSON_GetArraySize(j);
    f->meta = calloc(n ? n : 1, sizeof *f->meta);
    if (!f->meta)
        return error_set(FSDP_ENOMEM, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, j)
    {
        if (!cJSON_IsString(e))
            return error_set(FSDP_EINVAL, "%s: __metadata__ value of \"%s\" is not a string", f->path,
                             e->string);
        struct safetensors_meta *m = &f->meta[f->n_meta++];
        m->key = strdup(e->string);
        m->value = strdup(e->valuestring);
        if (!m->key || !m->value)
            return error_set(FSDP_ENOMEM, "out of memory");
    }
    return 0;
}

static int cmp_by_offset(const void *a, const void *b)
{
    const struct safetensors_tensor *x = *(const struct safetensors_tensor *const *)a;
    const struct safetensors_tensor *y = *(const struct safetensors_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp((*(const struct safetensors_tensor *const *)a)->name,
                  (*(const struct safetensors_tensor *const *)b)->name);
}

/* Data must tile [0, data length) exactly: sorted by offset, each tensor starts where the previous ends. */
static int check_layout(struct safetensors_file *f)
{
    size_t n = f->n_tensors;
    struct safetensors_tensor **s = malloc((n ? n : 1) * sizeof *s);
    if (!s)
        return error_set(FSDP_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        s[i] = &f->tensors[i];
    int rc = 0;
    qsort(s, n, sizeof *s, cmp_by_name);
    for (size_t i = 1; i < n; i++)
        if (strcmp(s[i - 1]->name, s[i]->name) == 0) {
            rc = error_set(FSDP_EINVAL, "%s: tensor '%s' appears twice in the header", f->path, s[i]->name);
            goto out;
        }
    qsort(s, n, sizeof *s, cmp_by_offset);
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i]->begin > pos)
            rc = error_set(FSDP_EINVAL, "%s: tensor '%s': hole before its data (begins at %llu, expected %llu)",
                           f->path, s[i]->name, (unsigned long long)s[i]->begin, (unsigned long long)pos);
        else if (s[i]->begin < pos)
            rc = error_set(FSDP_EINVAL,
                           "%s: tensor '%s': data [%llu, %llu] overlaps the previous tensor (ends at %llu)",
                           f->path, s[i]->name, (unsigned long long)s[i]->begin,
                           (unsigned long long)s[i]->end, (unsigned long long)pos);
        else
            pos = s[i]->end;
        if (rc)
            goto out;
    }
    if (f->data_start + pos != f->file_size) {
        if (f->data_start + pos > f->file_size) {
            const struct safetensors_tensor *t = s[n - 1];
            rc = error_set(FSDP_EINVAL,
                           "%s: tensor '%s': data [%llu, %llu] runs past the end of the file (%llu data bytes); "
                           "the file is truncated or the header is wrong",
                           f->path, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                           (unsigned long long)(f->file_size - f->data_start));
        } else {
            rc = error_set(FSDP_EINVAL, "%s: %llu bytes after the last tensor's data (file length %llu)",
                           f->path, (unsigned long long)(f->file_size - f->data_start - pos),
                           (unsigned long long)f->file_size);
        }
    }
out:
    free(s);
    return rc;
}

static int parse_header(struct safetensors_file *f, const char *text, size_t len)
{
    if (len == 0 || text[0] != '{')
        return error_set(FSDP_EINVAL, "%s: header does not start with '{' (not a safetensors file?)", f->path);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        return error_set(FSDP_EINVAL, "%s: header is not valid JSON (near byte %ld of the header)", f->path,
                         at ? (long)(at - text) : -1L);
    }
    int rc = 0;
    for (const char *c = end; c < text + len; c++)
        if (*c != ' ' && *c != '\0') {
            rc = error_set(FSDP_EINVAL, "%s: unexpected bytes after the header's JSON object", f->path);
            goto out;
        }
    if (!cJSON_IsObject(root)) {
        rc = error_set(FSDP_EINVAL, "%s: header is not a JSON object", f->path);
        goto out;
    }
    int n = cJSON_GetArraySize(root);
    if (!(f->tensors = calloc(n ? n : 1, sizeof *f->tensors))) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (f->meta) {
                rc = error_set(FSDP_EINVAL, "%s: __metadata__ appears twice", f->path);
                goto out;
            }
            FSDP_TRY_GOTO(parse_meta(f, e), rc, out);
        } else {
            FSDP_TRY_GOTO(parse_tensor(f, e, &f->tensors[f->n_tensors]), rc, out);
            f->n_tensors++;
        }
    }
out:
    cJSON_Delete(root);
    return rc == 0 ? check_layout(f) : rc;
}

int safetensors_open(struct safetensors_file **out, const char *path)
{
    *out = NULL;
    struct safetensors_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return error_set(FSDP_ENOMEM, "out of memory");
    }
    int rc = 0;
    char *text = NULL;
    /* a FIFO or device named as a weights file would block the reader forever: regular files only */
    f->fd = fs_open_regular(path, "safetensors file");
    if (f->fd < 0) {
        rc = f->fd;
        goto out;
    }
    struct stat st;
    uint8_t lenbuf[8];
    if (fstat(f->fd, &st) != 0) {
        rc = error_set(FSDP_EIO, "%s: cannot stat: %s", path, strerror(errno));
        goto out;
    }
    f->file_size = (uint64_t)st.st_size;
    if (f->file_size < 8 || pread(f->fd, lenbuf, 8, 0) != 8) {
        rc = error_set(FSDP_EINVAL, "%s: file is %llu bytes, too short for a safetensors header", path,
                       (unsigned long long)f->file_size);
        goto out;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | lenbuf[i];
    if (hlen > SAFETENSORS_MAX_HEADER || hlen > f->file_size - 8) {
        rc = error_set(FSDP_EINVAL, "%s: header length %llu does not fit the file (%llu bytes) or exceeds %u",
                       path, (unsigned long long)hlen, (unsigned long long)f->file_size,
                       SAFETENSORS_MAX_HEADER);
        goto out;
    }
    f->data_start = 8 + hlen;
    text = malloc(hlen + 1);
    if (!text) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    size_t got = 0;
    while (got < hlen) {
        ssize_t r = pread(f->fd, text + got, hlen - got, 8 + got);
        if (r <= 0) {
            rc = error_set(FSDP_EIO, "%s: reading the header: %s", path, r < 0 ? strerror(errno) : "short read");
            goto out;
        }
        got += (size_t)r;
    }
    text[hlen] = '\0';
    rc = parse_header(f, text, hlen);
out:
    free(text);
    if (rc != 0) {
        safetensors_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

const struct safetensors_tensor *safetensors_find(const struct safetensors_file *f, const char *name)
{
    for (size_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

const char *safetensors_meta_get(const struct safetensors_file *f, const char *key)
{
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[i].key, key) == 0)
            return f->meta[i].value;
    return NULL;
}

int safetensors_read(const struct safetensors_file *f, const struct safetensors_tensor *t, uint64_t offset,
                     void *dst, size_t bytes)
{
    uint64_t len = t->end - t->begin;
    if (offset > len || bytes > len - offset)
        return error_set(FSDP_ERANGE, "%s: tensor '%s': read of %zu bytes at %llu is outside its %llu bytes",
                         f->path, t->name, bytes, (unsigned long long)offset, (unsigned long long)len);
    uint64_t pos = f->data_start + t->begin + offset;
    size_t got = 0;
    while (got < bytes) {
        ssize_t r = pread(f->fd, (char *)dst + got, bytes - got, (off_t)(pos + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return error_set(FSDP_EIO, "%s: tensor '%s': read failed: %s", f->path, t->name,
                             r < 0 ? strerror(errno) : "file shrank while reading");
        got += (size_t)r;
    }
    return 0;
}

/* ---------------------------------------------------------------- writer */

static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static uint64_t entry_bytes(const struct safetensors_entry *e)
{
    uint64_t n = 1;
    for (int d = 0; d < e->ndim; d++)
        n *= (uint64_t)e->shape[d];
    return n * safetensors_dtype_size(e->dtype);
}

/* Compact JSON (no spaces) in the order given, as the reference writer produces it, so the output is
 * byte-identical to files written by the Python library for the same tensors. */
static char *build_header(const char *path, const struct safetensors_entry *entries, size_t n,
                          const struct safetensors_meta *meta, size_t n_meta, int *rc)
{
    cJSON *root = cJSON_CreateObject();
    char *s = NULL;
    *rc = 0;
    if (!root) {
        *rc = error_set(FSDP_ENOMEM, "out of memory");
        return NULL;
    }
    if (n_meta) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (size_t i = 0; m && i < n_meta; i++)
            if (!cJSON_AddStringToObject(m, meta[i].key, meta[i].value))
                m = NULL;
        if (!m) {
            *rc = error_set(FSDP_ENOMEM, "out of memory");
            goto out;
        }
    }
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        const struct safetensors_entry *e = &entries[i];
        if (!safetensors_dtype_name(e->dtype) || e->ndim < 0 || e->ndim > SAFETENSORS_MAX_DIMS) {
            *rc = error_set(FSDP_EINVAL, "%s: tensor '%s': bad dtype or rank", path, e->name);
            goto out;
        }
        cJSON *t = cJSON_AddObjectToObject(root, e->name);
        cJSON *shape = t ? cJSON_CreateArray() : NULL;
        cJSON *off = shape ? cJSON_CreateArray() : NULL;
        if (!t || !cJSON_AddStringToObject(t, "dtype", safetensors_dtype_name(e->dtype)) || !shape || !off) {
            cJSON_Delete(shape);
            cJSON_Delete(off);
            *rc = error_set(FSDP_ENOMEM, "out of memory");
            goto out;
        }
        cJSON_AddItemToObject(t, "shape", shape);
        cJSON_AddItemToObject(t, "data_offsets", off);
        for (int d = 0; d < e->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->shape[d]));
        uint64_t b = entry_bytes(e);
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)pos));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(pos + b)));
        pos += b;
    }
    if (!(s = cJSON_PrintUnformatted(root)))
        *rc = error_set(FSDP_ENOMEM, "out of memory");
out:
    cJSON_Delete(root);
    return s;
}

static int write_entry_data(int fd, const char *path, const struct safetensors_entry *e, size_t index,
                            safetensors_fill_fn fill, void *ctx)
{
    uint64_t bytes = entry_bytes(e);
    if (e->data)
        return write_all(fd, e->data, bytes) == 0
                   ? 0
                   : error_set(FSDP_EIO, "%s: tensor '%s': write failed: %s", path, e->name, strerror(errno));
    if (!fill)
        return error_set(FSDP_EINVAL, "%s: tensor '%s' has no data and no fill callback", path, e->name);
    /* Stream through a bounded buffer so huge tensors never need a second full copy. */
    size_t chunk = 4u << 20;
    char *buf = malloc(chunk);
    if (!buf)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    for (uint64_t off = 0; off < bytes; off += chunk) {
        size_t n = bytes - off < chunk ? (size_t)(bytes - off) : chunk;
        FSDP_TRY_GOTO(fill(ctx, index, off, buf, n), rc, out);
        if (write_all(fd, buf, n) != 0) {
            rc = error_set(FSDP_EIO, "%s: tensor '%s': write failed: %s", path, e->name, strerror(errno));
            goto out;
        }
    }
out:
    free(buf);
    return rc;
}

int safetensors_header(const char *path, const struct safetensors_entry *entries, size_t n_entries,
                       const struct safetensors_meta *meta, size_t n_meta, void **out, size_t *out_bytes)
{
    int rc;
    *out = NULL;
    *out_bytes = 0;
    char *json = build_header(path, entries, n_entries, meta, n_meta, &rc);
    if (!json)
        return rc;
    size_t jlen = strlen(json), hlen = (jlen + 7) & ~(size_t)7;
    uint8_t *buf = malloc(8 + hlen);
    if (!buf) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(buf + 8, json, jlen);
    memset(buf + 8 + jlen, ' ', hlen - jlen);
    *out = buf;
    *out_bytes = 8 + hlen;
out:
    free(json);
    return rc;
}

int safetensors_write(const char *path, const struct safetensors_entry *entries, size_t n_entries,
                      const struct safetensors_meta *meta, size_t n_meta, safetensors_fill_fn fill,
                      void *fill_ctx)
{
    int rc;
    char *json = build_header(path, entries, n_entries, meta, n_meta, &rc);
    if (!json)
        return rc;
    size_t jlen = strlen(json), hlen = (jlen + 7) & ~(size_t)7;
    size_t cap = strlen(path) + 32;
    char *tmp = malloc(cap);
    int fd = -1;
    bool created = false; /* tmp names a file to remove on failure */
    if (!tmp) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    /* 0666 less the umask, as any file the user creates (mkstemp's 0600 would ignore the umask). */
    fd = fs_create_temp(path, tmp, cap);
    if (fd < 0) {
        rc = fd;
        goto out;
    }
    created = true;
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    static const char spaces[8] = "        ";
    if (write_all(fd, lenbuf, 8) != 0 || write_all(fd, json, jlen) != 0 ||
        write_all(fd, spaces, hlen - jlen) != 0) {
        rc = error_set(FSDP_EIO, "%s: writing the header: %s", path, strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < n_entries; i++)
        FSDP_TRY_GOTO(write_entry_data(fd, path, &entries[i], i, fill, fill_ctx), rc, out);
    /* fsync, close, rename, fsync of the directory; removes tmp itself on failure */
    rc = fs_commit_temp(fd, tmp, path);
    fd = -1;
    created = false;
out:
    if (fd >= 0)
        close(fd);
    if (rc != 0 && created)
        unlink(tmp);
    free(json);
    free(tmp);
    return rc;
}
