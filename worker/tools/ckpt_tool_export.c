/* fsdp-ckpt export / merge: a model out of a checkpoint (or a Hugging Face directory) as a Hugging Face
 * directory that from_pretrained opens unchanged (config.json, model.safetensors or an index and shards
 * past --max_shard_size, the tokenizer files), or as one bare safetensors file. Tensors are streamed range
 * by range, so memory stays bounded whatever the model size. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/fs.h"
#include "common/safetensors.h"
#include "worker/tools/ckpt_tool.h"
#include "worker/tools/ckpt_tool_args.h"

/* transformers' save_pretrained default (5.x), as --help shows it and in bytes. */
#define DEFAULT_MAX_SHARD "50GB"
#define DEFAULT_MAX_SHARD_BYTES 50000000000ull

struct export_opts {
    const char *src, *out, *tokenizer;
    int dtype; /* enum safetensors_dtype */
    uint64_t max_shard;
    bool merge;
};

struct export_ctx {
    struct ckpt_tool_model *m;
    enum safetensors_dtype dtype;
    const int *param_of; /* entry index -> layout parameter */
    float *tmp;
    size_t tmp_cap;
};

/* Supplies bytes of one entry (the writer asks for 4 MiB at a time). */
static int export_fill(void *vctx, size_t index, uint64_t offset, void *buf, size_t bytes)
{
    struct export_ctx *c = vctx;
    size_t es = safetensors_dtype_size(c->dtype);
    size_t begin = (size_t)(offset / es), count = bytes / es;
    float *dst = c->dtype == SAFETENSORS_F32 ? buf : NULL;
    if (!dst) {
        if (count > c->tmp_cap) {
            free(c->tmp);
            if (!(c->tmp = malloc(count * sizeof *c->tmp)))
                return error_set(FSDP_ENOMEM, "out of memory");
            c->tmp_cap = count;
        }
        dst = c->tmp;
    }
    int rc = ckpt_tool_model_read(c->m, c->param_of[index], begin, count, dst);
    if (rc != 0)
        return rc;
    uint16_t *h = buf;
    for (size_t i = 0; i < count && c->dtype != SAFETENSORS_F32; i++)
        h[i] = c->dtype == SAFETENSORS_BF16 ? dtype_f32_to_bf16(dst[i]) : dtype_f32_to_f16(dst[i]);
    return 0;
}

/* Sizes as transformers writes them: an integer of bytes, or a number with B, KB, MB, GB, TB (powers of
 * 1000) or KiB, MiB, GiB, TiB (powers of 1024), case-insensitive. */
static int parse_size(const char *text, uint64_t *out)
{
    char *end;
    double v = strtod(text, &end);
    while (*end == ' ')
        end++;
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1},      {"b", 1},          {"kb", 1e3},         {"mb", 1e6},         {"gb", 1e9},
                 {"tb", 1e12}, {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
    char unit[8] = "";
    size_t n = strlen(end);
    for (size_t i = 0; i < n && i < sizeof unit - 1; i++)
        unit[i] = (char)tolower((unsigned char)end[i]);
    if (end == text || n >= sizeof unit || !(v > 0) || !isfinite(v))
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(unit, units[i].unit) == 0) {
            *out = (uint64_t)(v * units[i].mult);
            return *out > 0 ? 0 : -1;
        }
    return -1;
}

static int parse_max_shard(const char *v, void *field)
{
    return parse_size(v, field);
}

static const struct export_opts export_defaults = {.dtype = SAFETENSORS_F32, .max_shard = DEFAULT_MAX_SHARD_BYTES};
static const struct export_opts merge_defaults = {.dtype = SAFETENSORS_F32, .max_shard = DEFAULT_MAX_SHARD_BYTES,
                                                  .merge = true};

#define F(x) offsetof(struct export_opts, x)
#define OUT_HELP "the directory to write, made when missing; or a file ending in .safetensors"
static const struct ckpt_arg export_args[] = {
    {"MODEL", F(src), "a checkpoint directory, root or ROOT:latest, or a Hugging Face model directory"},
    {"OUT_DIR|OUT.safetensors", F(out), OUT_HELP},
};
static const struct ckpt_arg merge_args[] = {
    {"CKPT", F(src), "a checkpoint directory, a root holding latest, or ROOT:latest"},
    {"OUT_DIR|OUT.safetensors", F(out), OUT_HELP},
};
static const struct ckpt_choice dtypes[] = {
    {"f32", SAFETENSORS_F32, false},  {"fp32", SAFETENSORS_F32, true}, {"float32", SAFETENSORS_F32, true},
    {"bf16", SAFETENSORS_BF16, false}, {"bfloat16", SAFETENSORS_BF16, true},
    {"f16", SAFETENSORS_F16, false},  {"fp16", SAFETENSORS_F16, true}, {"float16", SAFETENSORS_F16, true},
    {NULL, 0, false},
};
static const struct ckpt_opt export_options[] = {
    {.name = "--dtype", .kind = CKPT_OPT_CHOICE, .field = F(dtype), .choices = dtypes, .def = "f32",
     .help = "the weights' dtype, rounded to nearest even"},
    {.name = "--max_shard_size", .metavar = "SIZE", .kind = CKPT_OPT_PARSE, .field = F(max_shard),
     .parse = parse_max_shard, .allowed = "a size such as 5GB, 500MB, 2GiB or a byte count", .def = DEFAULT_MAX_SHARD,
     .help = "a directory's weights in shards of at most SIZE (and an index), as save_pretrained cuts them"},
    {.name = "--tokenizer", .metavar = "FILE", .kind = CKPT_OPT_TEXT, .field = F(tokenizer),
     .allowed = "a tokenizer.json", .def = "the run's (docs/data.md)",
     .help = "copied into the directory, with tokenizer_config.json and special_tokens_map.json beside it"},
};
#undef F

/* A name export writes through a temporary file (fs_create_temp: "<name>.tmp.<hex>"): the weights, their
 * shards, the index, config.json; or `file`, the bare file of export to a .safetensors path. */
static bool is_export_temp(const char *n, const char *file)
{
    const char *t = strstr(n, ".tmp.");
    if (!t || t == n || t[5] == '\0' || strspn(t + 5, "0123456789abcdef") != strlen(t + 5))
        return false;
    size_t len = (size_t)(t - n);
    int a, b, used = 0;
    char base[256];
    if (len >= sizeof base)
        return false;
    memcpy(base, n, len);
    base[len] = '\0';
    if (file)
        return strcmp(base, file) == 0;
    return strcmp(base, MODEL_HF_WEIGHTS) == 0 || strcmp(base, MODEL_HF_INDEX) == 0 ||
           strcmp(base, MODEL_HF_CONFIG) == 0 ||
           (sscanf(base, "model-%5d-of-%5d.safetensors%n", &a, &b, &used) == 2 && base[used] == '\0');
}

/* Temporary files an export killed before its rename left in dir: nothing renames them later, and each can
 * be as large as the model. Only export's own names are touched (is_export_temp). */
static void remove_stale_temps(const char *dir, const char *file)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[FSDP_PATH_MAX + 256]; /* dir and an entry's name (at most 255 bytes) */
    while (d && (e = readdir(d))) {
        if (!is_export_temp(e->d_name, file))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) == 0)
            fprintf(stderr, "fsdp-ckpt: removed %s, left by an export that did not finish\n", path);
    }
    if (d)
        closedir(d);
}

/* The directories of path that do not exist yet, deepest first in created[] (at most cap): what a failed
 * export removes again, so that it leaves no empty directory behind. Returns how many. */
static int missing_dirs(const char *path, char created[][FSDP_PATH_MAX], int cap)
{
    char p[FSDP_PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    int n = 0;
    struct stat st;
    while (n < cap && p[0] && stat(p, &st) != 0 && errno == ENOENT) {
        snprintf(created[n++], FSDP_PATH_MAX, "%s", p);
        char *slash = strrchr(p, '/');
        while (slash && slash > p && slash[1] == '\0') { /* "a/b/" */
            *slash = '\0';
            slash = strrchr(p, '/');
        }
        if (!slash || slash == p)
            break;
        *slash = '\0';
    }
    return n;
}

/* Undoes what a failed export made in the directories it created (created[0] the deepest): the files in
 * it, then the directories, so a retry or a typo leaves nothing behind. A directory that existed before is
 * left alone (its earlier export, if any, is still consistent: every file is renamed into place whole). */
static void remove_created(char created[][FSDP_PATH_MAX], int n)
{
    if (n == 0)
        return;
    DIR *d = opendir(created[0]);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            unlinkat(dirfd(d), e->d_name, 0);
    if (d)
        closedir(d);
    for (int i = 0; i < n; i++)
        if (rmdir(created[i]) != 0)
            break;
}

static size_t real_numel(const struct model_param *p)
{
    return (size_t)p->init_rows * (size_t)p->shape[1];
}

/* One bare file with the layout's names, as fsdpc always wrote it (GPT2Model-style names). */
static int export_file(struct ckpt_tool_model *m, const struct export_opts *o)
{
    const struct model_layout *l = m->l;
    char dir[FSDP_PATH_MAX];
    const char *slash = strrchr(o->out, '/');
    FSDP_TRY(fs_path_format(dir, sizeof dir, "the export file", "%s", o->out)); /* the whole path fits */
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - o->out) : 1, slash ? o->out : ".");
    remove_stale_temps(dir[0] ? dir : "/", slash ? slash + 1 : o->out);
    struct safetensors_entry *e = calloc((size_t)l->n_params, sizeof *e);
    int *param_of = calloc((size_t)l->n_params, sizeof *param_of);
    struct export_ctx c = {.m = m, .dtype = o->dtype, .param_of = param_of};
    int rc = 0;
    if (!e || !param_of) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    for (int p = 0; p < l->n_params; p++) {
        const struct model_param *mp = &l->params[p];
        e[p] = (struct safetensors_entry){.name = mp->name, .dtype = o->dtype, .ndim = mp->ndim,
                                          .shape = {mp->init_rows, mp->ndim == 2 ? mp->shape[1] : 0}};
        param_of[p] = p;
    }
    char step[32];
    snprintf(step, sizeof step, "%" PRId64, m->step);
    struct safetensors_meta meta[2] = {{.key = "format", .value = "pt"}, {.key = "fsdpc_step", .value = step}};
    FSDP_TRY_GOTO(safetensors_write(o->out, e, (size_t)l->n_params, meta, m->step >= 0 ? 2 : 1, export_fill, &c),
                  rc, out);
out:
    free(c.tmp);
    free(e);
    free(param_of);
    return rc;
}

/* Weight files of an earlier export that this one does not rewrite (a different shard count), removed
 * as save_pretrained removes them so the directory holds one consistent model. */
static void remove_stale(const char *dir, int n_shards)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char keep[64], path[FSDP_PATH_MAX + 256]; /* dir and an entry's name (at most 255 bytes) */
    snprintf(keep, sizeof keep, "-of-%05d.safetensors", n_shards);
    while (d && (e = readdir(d))) {
        const char *n = e->d_name;
        int a, b, used = 0;
        bool shard = sscanf(n, "model-%5d-of-%5d.safetensors%n", &a, &b, &used) == 2 && n[used] == '\0';
        bool stale = (shard && (n_shards == 1 || !strstr(n, keep))) ||
                     (n_shards > 1 && strcmp(n, MODEL_HF_WEIGHTS) == 0) ||
                     (n_shards == 1 && strcmp(n, MODEL_HF_INDEX) == 0);
        if (stale) {
            snprintf(path, sizeof path, "%s/%s", dir, n);
            unlink(path);
        }
    }
    if (d)
        closedir(d);
}

static int write_index(const char *dir, const struct model_layout *l, char (*names)[MODEL_NAME_MAX + 32],
                       const int *shard_of, int n_shards, uint64_t total_bytes)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata"), *map = cJSON_AddObjectToObject(root, "weight_map");
    char *text = NULL;
    int rc = 0;
    if (!meta || !map || !cJSON_AddNumberToObject(meta, "total_parameters", (double)l->numel_real) ||
        !cJSON_AddNumberToObject(meta, "total_size", (double)total_bytes)) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    for (int p = 0; p < l->n_params; p++) {
        char file[64];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", shard_of[p] + 1, n_shards);
        if (!cJSON_AddStringToObject(map, names[p], file)) {
            rc = error_set(FSDP_ENOMEM, "out of memory");
            goto out;
        }
    }
    if (!(text = cJSON_Print(root))) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    char path[FSDP_PATH_MAX];
    FSDP_TRY_GOTO(fs_path_format(path, sizeof path, "the export directory", "%s/%s", dir, MODEL_HF_INDEX), rc, out);
    size_t len = strlen(text);
    text[len] = '\n';
    FSDP_TRY_GOTO(fs_write_atomic(path, text, len + 1), rc, out);
out:
    free(text);
    cJSON_Delete(root);
    return rc;
}

/* A Hugging Face directory: config.json, the weights (sharded past max_shard), the tokenizer files. */
static int export_dir(struct ckpt_tool_model *m, const struct export_opts *o, int *shards_out)
{
    const struct model_layout *l = m->l;
    char created[8][FSDP_PATH_MAX];
    FSDP_TRY(fs_path_format(created[0], sizeof created[0], "the export directory", "%s", o->out));
    int n_created = missing_dirs(o->out, created, 8);
    FSDP_TRY(fs_mkdir_p(o->out, "export directory"));
    remove_stale_temps(o->out, NULL);
    size_t n = (size_t)l->n_params, es = safetensors_dtype_size(o->dtype);
    char(*names)[MODEL_NAME_MAX + 32] = calloc(n, sizeof *names);
    int *shard_of = calloc(n, sizeof *shard_of), *param_of = calloc(n, sizeof *param_of);
    struct safetensors_entry *e = calloc(n, sizeof *e);
    struct export_ctx c = {.m = m, .dtype = o->dtype, .param_of = param_of};
    int rc = 0;
    if (!names || !shard_of || !param_of || !e) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    /* Shards filled in layout order, a new one when the next tensor would pass the limit (a tensor larger
     * than the limit gets a shard of its own), as save_pretrained cuts them. */
    int n_shards = 1;
    uint64_t in_shard = 0, total = 0;
    for (int p = 0; p < (int)n; p++) {
        model_hf_param_name(l, p, names[p], sizeof names[p]);
        uint64_t bytes = real_numel(&l->params[p]) * es;
        if (in_shard > 0 && in_shard + bytes > o->max_shard) {
            n_shards++;
            in_shard = 0;
        }
        shard_of[p] = n_shards - 1;
        in_shard += bytes;
        total += bytes;
    }
    *shards_out = n_shards;
    char step[32];
    snprintf(step, sizeof step, "%" PRId64, m->step);
    struct safetensors_meta meta[2] = {{.key = "format", .value = "pt"}, {.key = "fsdpc_step", .value = step}};
    for (int s = 0; s < n_shards; s++) {
        size_t k = 0;
        for (int p = 0; p < (int)n; p++) {
            if (shard_of[p] != s)
                continue;
            const struct model_param *mp = &l->params[p];
            e[k] = (struct safetensors_entry){.name = names[p], .dtype = o->dtype, .ndim = mp->ndim,
                                              .shape = {mp->init_rows, mp->ndim == 2 ? mp->shape[1] : 0}};
            param_of[k++] = p;
        }
        char path[FSDP_PATH_MAX];
        if (n_shards == 1)
            rc = fs_path_format(path, sizeof path, "the export directory", "%s/%s", o->out, MODEL_HF_WEIGHTS);
        else
            rc = fs_path_format(path, sizeof path, "the export directory", "%s/model-%05d-of-%05d.safetensors",
                                o->out, s + 1, n_shards);
        if (rc)
            goto out;
        FSDP_TRY_GOTO(safetensors_write(path, e, k, meta, m->step >= 0 ? 2 : 1, export_fill, &c), rc, out);
    }
    if (n_shards > 1)
        FSDP_TRY_GOTO(write_index(o->out, l, names, shard_of, n_shards, total), rc, out);
    remove_stale(o->out, n_shards);
    const char *tok = o->tokenizer ? o->tokenizer : (m->tokenizer[0] ? m->tokenizer : NULL);
    struct model_hf_tokens tokens = {-1, -1};
    if (tok)
        FSDP_TRY_GOTO(model_hf_tokenizer_tokens(tok, &tokens), rc, out);
    static const char *const torch_names[] = {[SAFETENSORS_F32] = "float32", [SAFETENSORS_BF16] = "bfloat16",
                                              [SAFETENSORS_F16] = "float16"};
    FSDP_TRY_GOTO(model_hf_config_write(l, o->out, &tokens, torch_names[o->dtype]), rc, out);
    /* A directory exported from itself already holds its tokenizer. */
    char here[FSDP_PATH_MAX];
    FSDP_TRY_GOTO(fs_path_format(here, sizeof here, "the export directory", "%s/%s", o->out, MODEL_HF_TOKENIZER),
                  rc, out);
    if (tok && strcmp(tok, here) != 0)
        FSDP_TRY_GOTO(ckpt_copy_tokenizer(o->out, tok), rc, out);
out:
    if (rc != 0)
        remove_created(created, n_created);
    free(c.tmp);
    free(names);
    free(shard_of);
    free(param_of);
    free(e);
    return rc;
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int export_run(const void *opts)
{
    const struct export_opts o = *(const struct export_opts *)opts;
    struct ckpt_tool_model m;
    if (ckpt_tool_model_open(o.src, &m) != 0) {
        fprintf(stderr, "fsdp-ckpt: %s\n", error_message());
        return 1;
    }
    if (o.merge && m.ckpt && strcmp(ckpt_reader_format(m.ckpt), "sharded") != 0)
        fprintf(stderr, "fsdp-ckpt: note: %s is already a full checkpoint; writing its model anyway\n", m.path);
    bool file = has_suffix(o.out, ".safetensors");
    int shards = 1;
    int rc = file ? export_file(&m, &o) : export_dir(&m, &o, &shards);
    if (rc != 0) {
        fprintf(stderr, "fsdp-ckpt: %s\n", error_message());
    } else {
        char from[64];
        if (m.ckpt)
            snprintf(from, sizeof from, "%s, step %" PRId64, ckpt_reader_format(m.ckpt), m.step);
        else
            snprintf(from, sizeof from, "Hugging Face directory");
        printf("wrote %s (%s, %d tensors, %s%s%s%s)\n", o.out, from, m.l->n_params, safetensors_dtype_name(o.dtype),
               file ? "" : shards > 1 ? ", sharded" : "", file ? "" : ", config.json",
               !file && (o.tokenizer || m.tokenizer[0]) ? ", tokenizer" : "");
    }
    ckpt_tool_model_close(&m);
    return rc == 0 ? 0 : 1;
}

const struct ckpt_tool_cmd ckpt_tool_export_cmd = {
    .name = "export",
    .about = "writes a Hugging Face directory that from_pretrained opens (config.json, model.safetensors or shards "
             "and an index, the tokenizer files); OUT.safetensors instead: one bare weights file",
    .args = export_args,
    .n_args = 2,
    .opts = export_options,
    .n_opts = sizeof export_options / sizeof export_options[0],
    .defaults = &export_defaults,
    .opts_size = sizeof(struct export_opts),
    .run = export_run,
};

const struct ckpt_tool_cmd ckpt_tool_merge_cmd = {
    .name = "merge",
    .about = "export in f32: a sharded checkpoint's model in one place",
    .args = merge_args,
    .n_args = 2,
    .defaults = &merge_defaults,
    .opts_size = sizeof(struct export_opts),
    .run = export_run,
};
