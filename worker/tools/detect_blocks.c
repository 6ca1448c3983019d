/* Block detection: the model's class table (worker/model's model_class_table), where the model's shape
 * comes from (the config or model.init_from), the JSON cache, and the table as text or JSON. */
#include "worker/tools/detect_blocks.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/config.h"
#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "common/settings.h"
#include "worker/ckpt/ckpt.h"
#include "worker/config/worker_config.h"
#include "worker/model/model.h"
#include "worker/model/model_hf.h"
#include "worker/train/train.h"

#define CACHE_VERSION 1

struct opts {
    bool json, refresh, clear;
    char cache[FSDP_PATH_MAX];
};

static bool is_flag(const char *arg, const char *name)
{
    /* --detect-blocks and --detect_blocks are the same flag */
    if (strncmp(arg, "--", 2) != 0)
        return false;
    for (arg += 2; *arg && *name; arg++, name++)
        if (*arg != *name && !((*arg == '-' || *arg == '_') && (*name == '-' || *name == '_')))
            return false;
    return !*arg && !*name;
}

bool detect_blocks_wanted(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            break;
        if (is_flag(argv[i], "detect-blocks") || is_flag(argv[i], "clear-cache"))
            return true;
    }
    return false;
}

/* $XDG_CACHE_HOME/fsdpc/fsdp_block_cache.json; XDG wants an absolute path, else ~/.cache. */
static int cache_path(char *out, size_t cap)
{
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (xdg && xdg[0] == '/')
        n = snprintf(out, cap, "%s/fsdpc/fsdp_block_cache.json", xdg);
    else if (home && home[0])
        n = snprintf(out, cap, "%s/.cache/fsdpc/fsdp_block_cache.json", home);
    else
        return error_set(FSDP_ENOTFOUND, "neither XDG_CACHE_HOME nor HOME is set: no place for the block cache");
    return n > 0 && (size_t)n < cap ? 0 : error_set(FSDP_ERANGE, "cache path too long");
}

/* ---- where the model comes from -------------------------------------------------------------------- */

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool file_in(const char *dir, const char *name, char *out, size_t cap)
{
    struct stat st;
    int n = snprintf(out, cap, "%s/%s", dir, name);
    return n > 0 && (size_t)n < cap && stat(out, &st) == 0 && S_ISREG(st.st_mode);
}

/* "realpath size mtime_ns" of a file: what says it is the same checkpoint as when it was cached. */
static void identity_add(char *id, size_t cap, const char *path)
{
    char real[PATH_MAX]; /* realpath writes up to PATH_MAX bytes */
    struct stat st;
    size_t n = strlen(id);
    if (!realpath(path, real) || stat(real, &st) != 0) {
        snprintf(id + n, cap - n, "%s%s?", n ? ";" : "", path);
        return;
    }
    snprintf(id + n, cap - n, "%s%s@%lld:%lld.%09ld", n ? ";" : "", real, (long long)st.st_size,
             (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
}

/* A Hugging Face directory: the family and shape its config.json gives (model_hf.h: the family's own
 * keys), over the configured ones; the rest of the config (init, seed, init_from) stays. */
static int hf_config(const char *dir, struct model_config *mc)
{
    struct model_hf_config *hc = malloc(sizeof *hc);
    if (!hc)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    FSDP_TRY_GOTO(model_hf_config_read(dir, hc), rc, out);
    struct model_config keep = *mc;
    *mc = hc->config;
    mc->init_std = keep.init_std;
    mc->seed = keep.seed;
    mc->activation_checkpointing = keep.activation_checkpointing;
    snprintf(mc->init_from, sizeof mc->init_from, "%s", keep.init_from);
out:
    free(hc);
    return rc;
}

/* A safetensors file: its tensors must be the configured model's (names with or without "transformer.",
 * shapes; the vocabulary without its padding rows). */
static int check_safetensors(const char *path, const struct model_config *mc)
{
    struct model_layout l;
    int rc = model_layout_build(&l, mc);
    if (rc)
        return rc;
    struct safetensors_file *f;
    rc = safetensors_open(&f, path);
    for (int p = 0; !rc && p < l.n_params; p++) {
        const struct model_param *mp = &l.params[p];
        const struct safetensors_tensor *t = safetensors_find(f, mp->name);
        char prefixed[MODEL_NAME_MAX + 16];
        snprintf(prefixed, sizeof prefixed, "transformer.%s", mp->name);
        if (!t)
            t = safetensors_find(f, prefixed);
        long long rows = mp->init_rows, cols = mp->ndim > 1 ? mp->shape[1] : 0;
        if (!t)
            rc = error_set(FSDP_EINVAL, "model.init_from = %s has no tensor %s: it is not this model (check model.*)",
                           path, mp->name);
        else if (t->ndim != mp->ndim || t->shape[0] != rows || (mp->ndim > 1 && t->shape[1] != cols))
            rc = error_set(FSDP_EINVAL,
                           "model.init_from = %s: %s is %lld x %lld there, the configured model wants %lld x %lld; set "
                           "model.* to the checkpoint's shape",
                           path, mp->name, (long long)t->shape[0], t->ndim > 1 ? (long long)t->shape[1] : 1LL, rows,
                           cols ? cols : 1LL);
    }
    if (f)
        safetensors_close(f);
    model_layout_free(&l);
    return rc;
}

/* The model to describe: the config's, or model.init_from's. *id gets the checkpoint identity ("" = none),
 * *source a description of where the shape came from. */
static int resolve_model(const struct worker_config *wc, struct model_config *mc, char *id, size_t idcap,
                         char *source, size_t srccap)
{
    train_model_config(wc, mc);
    id[0] = 0;
    const char *from = wc->model.init_from;
    if (!from[0]) {
        snprintf(source, srccap, "the config (random init)");
        return 0;
    }
    char file[FSDP_PATH_MAX];
    if (is_dir(from) && file_in(from, "metadata.json", file, sizeof file)) {
        struct ckpt_reader *r;
        int rc = ckpt_open(from, NULL, NULL, &r);
        if (rc)
            return rc;
        char keep[sizeof mc->init_from];
        snprintf(keep, sizeof keep, "%s", mc->init_from);
        *mc = ckpt_reader_state(r)->model;
        snprintf(mc->init_from, sizeof mc->init_from, "%s", keep);
        ckpt_close(r);
        identity_add(id, idcap, file);
        snprintf(source, srccap, "fsdpc checkpoint %s", from);
        return 0;
    }
    if (is_dir(from) && file_in(from, "config.json", file, sizeof file)) {
        FSDP_TRY(hf_config(from, mc));
        identity_add(id, idcap, file);
        if (file_in(from, "model.safetensors", file, sizeof file))
            identity_add(id, idcap, file);
        snprintf(source, srccap, "Hugging Face directory %s", from);
        return 0;
    }
    struct stat st;
    if (stat(from, &st) != 0)
        return error_set(FSDP_ENOTFOUND, "model.init_from = %s does not exist", from);
    if (is_dir(from))
        return error_set(FSDP_EINVAL, "model.init_from = %s is a directory with neither metadata.json (an fsdpc "
                         "checkpoint) nor config.json (a Hugging Face model)", from);
    FSDP_TRY(check_safetensors(from, mc));
    identity_add(id, idcap, from);
    snprintf(source, srccap, "safetensors file %s (shape from the config, checked against the file)", from);
    return 0;
}

/* ---- the table ------------------------------------------------------------------------------------- */

static cJSON *detect_table(const struct model_config *mc, const char *id, const char *source)
{
    struct model_layout l;
    if (model_layout_build(&l, mc) != 0)
        return NULL;
    struct model_class_row *rows = NULL;
    int n = 0;
    if (model_class_table(&l, &rows, &n) != 0) {
        model_layout_free(&l);
        return NULL;
    }
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "model_family", mc->model_family);
    cJSON *shape = cJSON_AddObjectToObject(e, "shape");
    cJSON_AddNumberToObject(shape, "n_layer", mc->n_layer);
    cJSON_AddNumberToObject(shape, "n_head", mc->n_head);
    cJSON_AddNumberToObject(shape, "n_embd", mc->n_embd);
    cJSON_AddNumberToObject(shape, "vocab_size", mc->vocab_size);
    cJSON_AddNumberToObject(shape, "block_size", mc->block_size);
    cJSON_AddStringToObject(e, "init_from", mc->init_from);
    cJSON_AddStringToObject(e, "checkpoint_identity", id);
    cJSON_AddStringToObject(e, "source", source);
    cJSON_AddNumberToObject(e, "total_parameter_count", (double)l.numel_real);
    cJSON *classes = cJSON_AddArrayToObject(e, "classes");
    char suggested[512] = "", suggested_hf[512] = "";
    for (int i = 0; i < n; i++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "class_name", rows[i].class_name);
        cJSON_AddStringToObject(c, "hf_class_name", rows[i].hf_name);
        cJSON_AddNumberToObject(c, "count", rows[i].count);
        cJSON_AddNumberToObject(c, "params_each_min", (double)rows[i].params_min);
        cJSON_AddNumberToObject(c, "params_each_max", (double)rows[i].params_max);
        cJSON_AddNumberToObject(c, "params_total", (double)rows[i].params_total);
        cJSON_AddNumberToObject(c, "share", l.numel_real ? (double)rows[i].params_total / (double)l.numel_real : 0);
        cJSON_AddStringToObject(c, "fsdp_unit", rows[i].is_root ? "root" : rows[i].can_be_unit ? "yes" : "no");
        cJSON_AddStringToObject(c, "example", rows[i].example);
        cJSON_AddItemToArray(classes, c);
        if (rows[i].can_be_unit) {
            size_t k = strlen(suggested), h = strlen(suggested_hf);
            snprintf(suggested + k, sizeof suggested - k, "%s%s", k ? "," : "", rows[i].class_name);
            snprintf(suggested_hf + h, sizeof suggested_hf - h, "%s%s", h ? "," : "", rows[i].hf_name);
        }
    }
    cJSON_AddStringToObject(e, "suggested_transformer_layer_cls_to_wrap", suggested);
    cJSON_AddStringToObject(e, "suggested_hf_class_names", suggested_hf);
    cJSON_AddNumberToObject(e, "detected_at", (double)time(NULL));
    free(rows);
    model_layout_free(&l);
    return e;
}

static void thousands(char *out, size_t cap, double v)
{
    char digits[32];
    snprintf(digits, sizeof digits, "%.0f", v);
    size_t n = strlen(digits), k = 0;
    for (size_t i = 0; i < n && k + 2 < cap; i++) {
        if (i && (n - i) % 3 == 0)
            out[k++] = ',';
        out[k++] = digits[i];
    }
    out[k] = 0;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static void print_table(const cJSON *e, bool cached, const char *cache)
{
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    char total[48];
    thousands(total, sizeof total, num(e, "total_parameter_count"));
    printf("Model %s: %.0f layers, %.0f heads, n_embd %.0f, vocab %.0f, context %.0f: %s parameters\n",
           str(e, "model_family"), num(shape, "n_layer"), num(shape, "n_head"), num(shape, "n_embd"),
           num(shape, "vocab_size"), num(shape, "block_size"), total);
    printf("From %s\n\n", str(e, "source"));
    printf("%-22s %-16s %6s %16s %16s %7s  %-9s %s\n", "class", "Hugging Face", "count", "params each", "params total",
           "share", "FSDP unit", "e.g.");
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(e, "classes"))
    {
        char each[64], lo[32], hi[32], tot[32];
        thousands(lo, sizeof lo, num(c, "params_each_min"));
        thousands(hi, sizeof hi, num(c, "params_each_max"));
        thousands(tot, sizeof tot, num(c, "params_total"));
        if (num(c, "params_each_min") == num(c, "params_each_max"))
            snprintf(each, sizeof each, "%s", lo);
        else
            snprintf(each, sizeof each, "%s-%s", lo, hi);
        printf("%-22s %-16s %6.0f %16s %16s %6.1f%%  %-9s %s\n", str(c, "class_name"), str(c, "hf_class_name"),
               num(c, "count"), each, tot, 100 * num(c, "share"), str(c, "fsdp_unit"), str(c, "example"));
    }
    printf("\n(shares of nested classes overlap: a block's parameters also count in the ModuleList that holds it)\n");
    printf("Suggested: transformer_layer_cls_to_wrap = %s   (Hugging Face names, also accepted: %s)\n",
           str(e, "suggested_transformer_layer_cls_to_wrap"), str(e, "suggested_hf_class_names"));
    if (cached)
        printf("(from the cache %s; --refresh recomputes)\n", cache);
}

/* ---- the cache ------------------------------------------------------------------------------------- */

static cJSON *cache_load(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return cJSON_CreateObject();
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    char buf[8192];
    size_t r;
    while (mem && (r = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, r, mem);
    fclose(f);
    if (mem)
        fclose(mem);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *entries = cJSON_GetObjectItemCaseSensitive(root, "entries");
    if (!cJSON_IsObject(root) || !cJSON_IsObject(entries) || num(root, "version") != CACHE_VERSION) {
        log_warn("block cache %s is not a cache of this version (corrupt or old): replacing it", path);
        cJSON_Delete(root);
        return cJSON_CreateObject();
    }
    return root;
}

/* Written to a temporary file and renamed, so a reader never sees half a cache. */
static int cache_save(const char *path, cJSON *root)
{
    char dir[FSDP_PATH_MAX];
    FSDP_TRY(fs_path_format(dir, sizeof dir, "block cache", "%s", path));
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    int rc = fs_mkdir_p(dir, "block cache directory");
    if (rc)
        return rc;
    char *text = cJSON_Print(root);
    if (!text)
        return error_set(FSDP_ENOMEM, "out of memory writing the block cache");
    char tmp[FSDP_PATH_MAX + 32]; /* path (it fits FSDP_PATH_MAX: checked above) and ".tmp.<pid>" */
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    bool ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    ok = f && fclose(f) == 0 && ok;
    free(text);
    if (!ok || rename(tmp, path) != 0) {
        rc = error_set(FSDP_EIO, "cannot write the block cache %s: %s", path, strerror(errno));
        unlink(tmp);
    }
    return rc;
}

static void cache_key(const struct model_config *mc, const char *id, char *out, size_t cap)
{
    snprintf(out, cap, "%s|n_layer=%d,n_head=%d,n_embd=%d,head_dim=%d,vocab_size=%d,block_size=%d|%s",
             mc->model_family, mc->n_layer, mc->n_head, mc->n_embd, model_head_dim(mc), mc->vocab_size,
             mc->block_size, id);
}

/* ---- the command ----------------------------------------------------------------------------------- */

static int load_config(int argc, char **argv, struct worker_config *wc)
{
    const struct config_schema *schema = worker_config_schema();
    struct config_cli cli;
    struct config *cfg = NULL;
    int rc = config_cli_parse(schema, argc, argv, &cli);
    if (!rc && cli.n_positional > 1)
        rc = error_set(FSDP_EINVAL, "--detect-blocks takes one config file, got %d arguments", cli.n_positional);
    if (!rc)
        rc = config_create(schema, &cfg);
    const char *launch = settings_get_raw(SETTING_LAUNCH_CONFIG);
    if (!rc)
        rc = config_apply_launch(cfg, launch, CONFIG_LAUNCH_UNDER_FILE);
    if (!rc && cli.n_positional == 1)
        rc = config_load_file(cfg, cli.positional[0]);
    if (!rc)
        rc = config_apply_launch(cfg, launch, CONFIG_LAUNCH_OVER_FILE);
    if (!rc)
        rc = config_cli_apply(&cli, cfg);
    if (!rc)
        rc = worker_config_view(cfg, wc);
    config_destroy(cfg);
    config_cli_free(&cli);
    return rc;
}

int detect_blocks_main(int argc, char **argv)
{
    struct opts o = {0};
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest)
        return 1;
    int n = 0;
    bool detect = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (i > 0 && is_flag(a, "detect-blocks"))
            detect = true;
        else if (i > 0 && is_flag(a, "json"))
            o.json = true;
        else if (i > 0 && is_flag(a, "refresh"))
            o.refresh = true;
        else if (i > 0 && is_flag(a, "clear-cache"))
            o.clear = true;
        else
            rest[n++] = argv[i];
    }
    int status = 1;
    if (cache_path(o.cache, sizeof o.cache) != 0 && (o.clear || !o.refresh)) {
        log_warn("%s; detecting without it", error_message());
        o.cache[0] = 0;
    }
    if (o.clear) {
        if (o.cache[0] && unlink(o.cache) == 0)
            log_info("removed the block cache %s", o.cache);
        else if (o.cache[0] && errno != ENOENT)
            log_warn("cannot remove %s: %s", o.cache, strerror(errno));
        else
            log_info("no block cache at %s", o.cache[0] ? o.cache : "(none)");
        if (!detect) {
            free(rest);
            return 0;
        }
    }
    struct worker_config wc;
    struct model_config mc;
    /* two paths and their sizes and times; one path and its kind; the id and the shapes */
    char id[FSDP_PATH_MAX * 2 + 128], source[FSDP_PATH_MAX + 128], key[FSDP_PATH_MAX * 2 + 256];
    if (load_config(n, rest, &wc) != 0 || resolve_model(&wc, &mc, id, sizeof id, source, sizeof source) != 0) {
        log_error("--detect-blocks: %s", error_message());
        free(rest);
        return 1;
    }
    free(rest);
    cache_key(&mc, id, key, sizeof key);
    cJSON *cache = o.cache[0] ? cache_load(o.cache) : cJSON_CreateObject();
    if (!cJSON_GetObjectItemCaseSensitive(cache, "entries")) {
        cJSON_AddNumberToObject(cache, "version", CACHE_VERSION);
        cJSON_AddObjectToObject(cache, "entries");
    }
    cJSON *entries = cJSON_GetObjectItemCaseSensitive(cache, "entries");
    cJSON *entry = o.refresh ? NULL : cJSON_GetObjectItemCaseSensitive(entries, key);
    bool cached = entry != NULL;
    if (!entry) {
        entry = detect_table(&mc, id, source);
        if (!entry) {
            log_error("--detect-blocks: %s", error_message());
            goto out;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(entries, key);
        cJSON_AddItemToObject(entries, key, entry);
        if (o.cache[0] && cache_save(o.cache, cache) != 0)
            log_warn("%s (the table is still right)", error_message());
    }
    if (o.json) {
        cJSON *out = cJSON_Duplicate(entry, 1);
        cJSON_AddBoolToObject(out, "cached", cached);
        cJSON_AddStringToObject(out, "cache_file", o.cache);
        cJSON_AddStringToObject(out, "cache_key", key);
        char *text = cJSON_Print(out);
        cJSON_Delete(out);
        if (text)
            printf("%s\n", text);
        free(text);
    } else {
        print_table(entry, cached, o.cache);
    }
    status = fflush(stdout) == 0 ? 0 : 1;
out:
    cJSON_Delete(cache);
    return status;
}
