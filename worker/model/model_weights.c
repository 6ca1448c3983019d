/* Weights from Hugging Face files, read by byte ranges: a Hugging Face directory (model.safetensors, or
 * model.safetensors.index.json and its shards), a bare safetensors file, or an index file. Opening reads
 * only the safetensors headers and checks every tensor against the layout; a read is one pread of exactly
 * the bytes asked for, so a rank that initialises only its shards reads only those bytes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/safetensors.h"
#include "worker/model/model_hf_internal.h"

/* Elements converted per pread when a file holds BF16 or F16. */
#define CONVERT_CHUNK (1u << 20)

struct model_weights {
    const struct model_layout *l;
    const struct model_family *fam;
    char path[FSDP_PATH_MAX];
    struct safetensors_file **files;
    int n_files;
    /* per layout parameter: its file and tensor */
    int *file_of;
    const struct safetensors_tensor **tensor_of;
    uint16_t *buf; /* CONVERT_CHUNK half-precision elements */
    uint64_t bytes_read;
};

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool exists(const char *dir, const char *name, bool want_dir)
{
    char p[FSDP_PATH_MAX + 64];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && (want_dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
}

/* torch.save writes a zip archive (PK\3\4) since 1.6 and a bare pickle (protocol byte 0x80) before. */
static bool looks_like_pickle(const char *path)
{
    static const char *const suffixes[] = {".bin", ".pt", ".pth", ".ckpt", ".pkl", NULL};
    for (int i = 0; suffixes[i]; i++)
        if (has_suffix(path, suffixes[i]))
            return true;
    FILE *f = fopen(path, "rb");
    unsigned char b[4] = {0};
    size_t n = f ? fread(b, 1, 4, f) : 0;
    if (f)
        fclose(f);
    return (n == 4 && b[0] == 'P' && b[1] == 'K' && b[2] == 3 && b[3] == 4) || (n >= 2 && b[0] == 0x80 && b[1] <= 5);
}

static int pickle_error(const char *what, const char *path, const char *pickle)
{
    return error_set(FSDP_EUNSUPPORTED,
                     "%s = %s: %s is a PyTorch pickle, and pickles are not read (loading one can run arbitrary code); "
                     "convert it once to safetensors: python -c \"import torch; from safetensors.torch import "
                     "save_file; sd = torch.load('%s', map_location='cpu', weights_only=True); save_file({k: "
                     "v.contiguous().clone() for k, v in sd.items()}, 'model.safetensors')\" (for a Hugging Face "
                     "directory: AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(OUT) writes "
                     "model.safetensors), then point %s at the result",
                     what, path, pickle, pickle, what);
}

static int add_file(struct model_weights *w, const char *path)
{
    for (int i = 0; i < w->n_files; i++)
        if (strcmp(w->files[i]->path, path) == 0)
            return i;
    struct safetensors_file **v = realloc(w->files, (size_t)(w->n_files + 1) * sizeof *v);
    if (!v)
        return error_set(FSDP_ENOMEM, "out of memory");
    w->files = v;
    FSDP_TRY(safetensors_open(&w->files[w->n_files], path));
    return w->n_files++;
}

/* model.safetensors.index.json: {"metadata": {...}, "weight_map": {"name": "shard file", ...}}. Every
 * shard it names is opened (headers only), and each name must be in the shard the map gives. */
static int open_index(struct model_weights *w, const char *index_path, const char *dir)
{
    FILE *f = fopen(index_path, "rb");
    if (!f)
        return error_set(FSDP_EIO, "%s: cannot open: %s", index_path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = len >= 0 && len < (64l << 20) ? malloc((size_t)len + 1) : NULL;
    size_t got = text ? fread(text, 1, (size_t)len, f) : 0;
    fclose(f);
    if (!text || got != (size_t)len) {
        free(text);
        return error_set(FSDP_EINVAL, "%s: cannot read the index", index_path);
    }
    text[len] = '\0';
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map"), *e;
    int rc = 0;
    if (!cJSON_IsObject(map)) {
        rc = error_set(FSDP_EINVAL, "%s: no \"weight_map\" object (not a safetensors index)", index_path);
        goto out;
    }
    cJSON_ArrayForEach(e, map)
    {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/')) {
            rc = error_set(FSDP_EINVAL, "%s: weight_map entry \"%s\" must name a shard file in the directory",
                           index_path, e->string);
            goto out;
        }
        char p[FSDP_PATH_MAX + 256];
        snprintf(p, sizeof p, "%s/%s", dir, e->valuestring);
        int fi = add_file(w, p);
        FSDP_TRY_GOTO(fi, rc, out);
        if (!safetensors_find(w->files[fi], e->string)) {
            rc = error_set(FSDP_EINVAL, "%s: \"%s\" is mapped to %s, which does not hold it", index_path, e->string,
                           e->valuestring);
            goto out;
        }
    }
    if (w->n_files == 0)
        rc = error_set(FSDP_EINVAL, "%s: the weight_map is empty", index_path);
out:
    cJSON_Delete(root);
    return rc;
}

static int check_shape(const struct model_weights *w, const struct model_param *p, const struct safetensors_tensor *t,
                       const char *file)
{
    const struct model_layout *l = w->l;
    bool longer = p->position_rows; /* a longer position table serves any block_size up to its length */
    bool ok = t->ndim == p->ndim && t->shape[0] == p->init_rows && (p->ndim == 1 || t->shape[1] == p->shape[1]);
    if (longer && t->ndim == 2 && t->shape[0] >= p->shape[0] && t->shape[1] == p->shape[1])
        ok = true;
    if (ok)
        return 0;
    char got[96] = "(", want[64];
    for (int d = 0; d < t->ndim; d++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    strncat(got, ")", sizeof got - strlen(got) - 1);
    if (p->ndim == 1)
        snprintf(want, sizeof want, "(%d)", p->init_rows);
    else
        snprintf(want, sizeof want, "(%s%d, %d)", longer ? ">= " : "", p->init_rows, p->shape[1]);
    return error_set(FSDP_EINVAL,
                     "%s: tensor '%s' has shape %s but the config (%s, n_layer %d, n_embd %d, vocab_size %d, "
                     "block_size %d) needs %s",
                     file, t->name, got, l->config.model_family, l->config.n_layer, l->config.n_embd,
                     l->config.vocab_size, l->config.block_size, want);
}

/* Every tensor of every file -> a layout parameter (prefix optional), a buffer the family ignores, or an
 * error; then every parameter must have been found. */
static int map_tensors(struct model_weights *w)
{
    const struct model_layout *l = w->l;
    const char *prefix = w->fam->hf ? w->fam->hf->prefix : "";
    size_t plen = strlen(prefix);
    for (int fi = 0; fi < w->n_files; fi++) {
        const struct safetensors_file *f = w->files[fi];
        for (size_t i = 0; i < f->n_tensors; i++) {
            const struct safetensors_tensor *t = &f->tensors[i];
            const char *name = plen && strncmp(t->name, prefix, plen) == 0 ? t->name + plen : t->name;
            int p = model_layout_find(l, name);
            if (p < 0 && w->fam->hf && w->fam->hf->ignored(&l->config, name))
                continue;
            if (p < 0)
                return error_set(FSDP_EINVAL,
                                 "%s: tensor '%s' is not a parameter of %s with n_layer %d; check the file and the "
                                 "model config",
                                 f->path, t->name, l->config.model_family, l->config.n_layer);
            if (w->tensor_of[p])
                return error_set(FSDP_EINVAL, "%s: tensor '%s' appears twice (as '%s' and '%s')", f->path, name,
                                 w->tensor_of[p]->name, t->name);
            if (t->dtype != SAFETENSORS_F32 && t->dtype != SAFETENSORS_F16 && t->dtype != SAFETENSORS_BF16)
                return error_set(FSDP_EINVAL, "%s: tensor '%s' has dtype %s; weights must be F32, F16 or BF16",
                                 f->path, t->name, safetensors_dtype_name(t->dtype));
            FSDP_TRY(check_shape(w, &l->params[p], t, f->path));
            w->tensor_of[p] = t;
            w->file_of[p] = fi;
        }
    }
    for (int p = 0; p < l->n_params; p++)
        if (!w->tensor_of[p])
            return error_set(FSDP_EINVAL, "%s: tensor '%s' is missing (model %s, n_layer %d)", w->path,
                             l->params[p].name, l->config.model_family, l->config.n_layer);
    return 0;
}

enum source { SRC_WEIGHTS, SRC_INDEX, SRC_FILE, SRC_INDEX_FILE };

/* What path is -> which files to open, or the message that says what to pass instead. */
static int classify(const char *path, const char *what, enum source *src)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return error_set(errno == ENOENT ? FSDP_ENOTFOUND : FSDP_EIO, "%s = %s: %s", what, path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        if (looks_like_pickle(path))
            return pickle_error(what, path, path);
        *src = has_suffix(path, ".json") ? SRC_INDEX_FILE : SRC_FILE;
        return 0;
    }
    if (exists(path, MODEL_HF_WEIGHTS, false)) {
        *src = SRC_WEIGHTS;
        return 0;
    }
    if (exists(path, MODEL_HF_INDEX, false)) {
        *src = SRC_INDEX;
        return 0;
    }
    static const char *const pickles[] = {"pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt",
                                          "model.pth", NULL};
    char p[FSDP_PATH_MAX + 64];
    for (int i = 0; pickles[i]; i++)
        if (exists(path, pickles[i], false)) {
            snprintf(p, sizeof p, "%s/%s", path, pickles[i]);
            return pickle_error(what, path, p);
        }
    if (exists(path, "metadata.json", false))
        return error_set(FSDP_EINVAL,
                         "%s = %s: this is an fsdpc training checkpoint without config.json (sharded); to continue "
                         "that run set checkpoint.resume_from = %s; to start a new run from its weights, write a "
                         "Hugging Face directory first: fsdp-ckpt export %s OUT_DIR, then %s = OUT_DIR",
                         what, path, path, path, what);
    return error_set(FSDP_ENOTFOUND,
                     "%s = %s: the directory holds neither %s nor %s; pass a directory written by save_pretrained or "
                     "fsdp-ckpt export, or a .safetensors file",
                     what, path, MODEL_HF_WEIGHTS, MODEL_HF_INDEX);
}

int model_weights_check_path(const char *path, const char *what)
{
    enum source src;
    return classify(path, what ? what : "weights", &src);
}

int model_weights_open(const struct model_layout *l, const char *path, const char *what, struct model_weights **out)
{
    *out = NULL;
    if (!what)
        what = "weights";
    struct model_weights *w = calloc(1, sizeof *w);
    if (!w)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    w->l = l;
    snprintf(w->path, sizeof w->path, "%s", path);
    if (!(w->fam = model_family_find(l->config.model_family))) {
        rc = FSDP_EINVAL;
        goto fail;
    }
    w->file_of = calloc((size_t)l->n_params + 1, sizeof *w->file_of);
    w->tensor_of = calloc((size_t)l->n_params + 1, sizeof *w->tensor_of);
    if (!w->file_of || !w->tensor_of) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto fail;
    }
    enum source src;
    FSDP_TRY_GOTO(classify(path, what, &src), rc, fail);
    char p[FSDP_PATH_MAX + 64];
    if (src == SRC_WEIGHTS || src == SRC_FILE) {
        snprintf(p, sizeof p, src == SRC_WEIGHTS ? "%s/" MODEL_HF_WEIGHTS : "%s", path);
        FSDP_TRY_GOTO(add_file(w, p), rc, fail);
    } else if (src == SRC_INDEX) {
        snprintf(p, sizeof p, "%s/%s", path, MODEL_HF_INDEX);
        FSDP_TRY_GOTO(open_index(w, p, path), rc, fail);
    } else {
        /* an index file named directly: its shards lie beside it */
        const char *slash = strrchr(path, '/');
        if (!slash)
            snprintf(p, sizeof p, ".");
        else
            snprintf(p, sizeof p, "%.*s", slash == path ? 1 : (int)(slash - path), path);
        FSDP_TRY_GOTO(open_index(w, path, p), rc, fail);
    }
    FSDP_TRY_GOTO(map_tensors(w), rc, fail);
    *out = w;
    return 0;
fail:
    model_weights_close(w);
    return rc;
}

int model_weights_read(struct model_weights *w, int p, size_t begin, size_t count, float *dst)
{
    const struct model_layout *l = w->l;
    if (p < 0 || p >= l->n_params)
        return error_set(FSDP_EINVAL, "weights read: parameter %d out of range", p);
    const struct model_param *mp = &l->params[p];
    if (begin > mp->numel || count > mp->numel - begin)
        return error_set(FSDP_ERANGE, "weights read: [%zu, +%zu) outside '%s' (%zu elements)", begin, count, mp->name,
                         mp->numel);
    const struct safetensors_file *f = w->files[w->file_of[p]];
    const struct safetensors_tensor *t = w->tensor_of[p];
    /* The file's first `real` elements are the layout's (a longer wpe has more rows after them); the rest,
     * vocabulary padding, are zero. */
    size_t real = (size_t)mp->init_rows * (size_t)mp->shape[1];
    size_t n = begin < real ? (count < real - begin ? count : real - begin) : 0;
    size_t es = safetensors_dtype_size(t->dtype);
    if (t->dtype == SAFETENSORS_F32) {
        FSDP_TRY(safetensors_read(f, t, (uint64_t)begin * es, dst, n * es));
    } else {
        if (!w->buf && n > 0 && !(w->buf = malloc((size_t)CONVERT_CHUNK * sizeof *w->buf)))
            return error_set(FSDP_ENOMEM, "out of memory");
        for (size_t done = 0; done < n; done += CONVERT_CHUNK) {
            size_t m = n - done < CONVERT_CHUNK ? n - done : CONVERT_CHUNK;
            FSDP_TRY(safetensors_read(f, t, (uint64_t)(begin + done) * es, w->buf, m * es));
            for (size_t i = 0; i < m; i++)
                dst[done + i] = t->dtype == SAFETENSORS_BF16 ? dtype_bf16_to_f32(w->buf[i]) : dtype_f16_to_f32(w->buf[i]);
        }
    }
    w->bytes_read += (uint64_t)n * es;
    if (n < count)
        memset(dst + n, 0, (count - n) * sizeof *dst);
    return 0;
}

uint64_t model_weights_bytes_read(const struct model_weights *w)
{
    return w->bytes_read;
}

const char *model_weights_dtype(const struct model_weights *w, int p)
{
    return safetensors_dtype_name(w->tensor_of[p]->dtype);
}

void model_weights_close(struct model_weights *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->n_files; i++)
        safetensors_close(w->files[i]);
    free(w->files);
    free(w->file_of);
    free(w->tensor_of);
    free(w->buf);
    free(w);
}

int model_weights_load(const struct model_layout *l, const char *path, float *host)
{
    struct model_weights *w;
    FSDP_TRY(model_weights_open(l, path, "model.init_from", &w));
    int rc = 0;
    for (int p = 0; p < l->n_params; p++)
        FSDP_TRY_GOTO(model_weights_read(w, p, 0, l->params[p].numel, host + l->params[p].offset), rc, out);
out:
    model_weights_close(w);
    return rc;
}

int model_weights_save(const struct model_layout *l, const char *path, const float *host)
{
    struct safetensors_entry *e = calloc((size_t)l->n_params, sizeof *e);
    if (!e)
        return error_set(FSDP_ENOMEM, "out of memory");
    /* Module order (wte, wpe, h.0 ... h.L-1, ln_f) as HF writes it, not flat-buffer order. */
    int n = 0;
    for (int m = 0; m < l->n_modules; m++) {
        const struct model_module *mod = &l->modules[m];
        for (int i = 0; i < mod->n_params; i++) {
            const struct model_param *p = &l->params[mod->first_param + i];
            e[n] = (struct safetensors_entry){.name = p->name, .dtype = SAFETENSORS_F32, .ndim = p->ndim,
                                              .shape = {p->init_rows, p->shape[1]}, .data = host + p->offset};
            n++;
        }
    }
    struct safetensors_meta meta = {.key = "format", .value = "pt"};
    int rc = safetensors_write(path, e, (size_t)n, &meta, 1, NULL, NULL);
    free(e);
    return rc;
}
