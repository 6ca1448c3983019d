/* model.init_from and checkpoint.resume_from, checked and applied before any work (train_sources.h). */
#include "worker/train/train_sources.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/fs.h"
#include "worker/ckpt/ckpt.h"
#include "worker/model/model_hf.h"

/* Where the current value of key k came from, for the message. */
static void describe_source(const struct config *cfg, int k, char *out, size_t cap)
{
    const struct config_value *v = &cfg->values[k];
    if (v->source == CONFIG_SRC_FILE)
        snprintf(out, cap, "%s line %d", cfg->file ? cfg->file : "the config file", v->line);
    else if (v->source == CONFIG_SRC_CLI)
        snprintf(out, cap, "command line");
    else
        snprintf(out, cap, "set by the program");
}

static bool same(const struct config_key *key, const struct config_value *a, const struct config_value *b)
{
    switch (key->type) {
    case CONFIG_INT: return a->v.i == b->v.i;
    case CONFIG_FLOAT: return fabs(a->v.f - b->v.f) <= 1e-6 * fabs(b->v.f);
    case CONFIG_BOOL: return a->v.b == b->v.b;
    case CONFIG_ENUM: return a->v.e == b->v.e;
    default: return strcmp(a->text ? a->text : "", b->text ? b->text : "") == 0;
    }
}

static int apply_setting(struct config *cfg, const struct model_hf_setting *s, const char *json)
{
    char name[64];
    snprintf(name, sizeof name, "model.%s", s->key);
    int k = config_find_key(cfg->schema, name);
    if (k < 0)
        return error_set(FSDP_EUNSUPPORTED, "%s: \"%s\" sets [model] %s, which this fsdp-worker does not have", json,
                         s->hf_key, s->key);
    const struct config_key *key = &cfg->schema->keys[k];
    struct config_value hf;
    if (config_value_parse(key, s->value, &hf) != 0)
        return error_set(FSDP_EINVAL, "%s: \"%s\" = %s cannot be [model] %s here: %s", json, s->hf_key, s->value,
                         s->key, error_message());
    struct config_value *cur = &cfg->values[k];
    int rc = 0;
    if (cur->source == CONFIG_SRC_DEFAULT) {
        rc = config_set_index(cfg, k, s->value, CONFIG_SRC_API, 0);
    } else if (!same(key, cur, &hf) &&
               !(s->at_most && key->type == CONFIG_INT && cur->v.i < hf.v.i && cur->v.i >= 1)) {
        char where[FSDP_PATH_MAX + 32]; /* the config file's path and " line N" */
        describe_source(cfg, k, where, sizeof where);
        const char *place = cur->source == CONFIG_SRC_CLI ? "on the command line" : "in the config file";
        char fix[160];
        if (s->at_most)
            snprintf(fix, sizeof fix, "set %s to at most %s %s, or drop it", s->key, s->value, place);
        else
            snprintf(fix, sizeof fix, "drop %s %s", s->key, place);
        rc = error_set(FSDP_EINVAL,
                       "[model] %s = %s (%s) disagrees with \"%s\": %s in %s, the model.init_from directory; its "
                       "weights have that shape: %s",
                       s->key, cur->text ? cur->text : "", where, s->hf_key, s->value, json, fix);
    }
    free(hf.text);
    return rc;
}

/* config.json's settings over cfg's [model] keys. */
static int apply_hf_config(struct config *cfg, const char *dir)
{
    struct model_hf_config *hc = malloc(sizeof *hc);
    if (!hc)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    FSDP_TRY_GOTO(model_hf_config_read(dir, hc), rc, out);
    for (int i = 0; i < hc->n_settings; i++)
        FSDP_TRY_GOTO(apply_setting(cfg, &hc->settings[i], hc->path), rc, out);
out:
    free(hc);
    return rc;
}

int train_sources_apply(struct config *cfg)
{
    const char *from = config_get_string(cfg, "model", "init_from");
    if (from[0]) {
        FSDP_TRY(model_weights_check_path(from, "model.init_from"));
        if (model_hf_is_dir(from))
            FSDP_TRY(apply_hf_config(cfg, from));
    }
    return ckpt_check_resume_target(NULL, config_get_string(cfg, "checkpoint", "resume_from"));
}

/* What DATA_DIR/meta.json (fsdp-prepare-data's record) says: 1 with the tokenizer's path, 0 for byte tokens,
 * -1 without a usable meta.json. The rule is run_tokenizer.c's, which tools use to find the same file. */
static int tokenizer_from_meta(const char *data_dir, char *out, size_t cap)
{
    char path[FSDP_PATH_MAX];
    if (snprintf(path, sizeof path, "%s/meta.json", data_dir) >= (int)sizeof path)
        return -1; /* a path that long names no file here: as without a meta.json */
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *root = cJSON_Parse(buf);
    const cJSON *tok = root ? cJSON_GetObjectItemCaseSensitive(root, "tokenizer") : NULL;
    int rc = cJSON_IsNull(tok) ? 0 : cJSON_IsString(tok) ? 1 : -1;
    if (rc == 1 && snprintf(out, cap, "%s/%s", data_dir, tok->valuestring) >= (int)cap)
        rc = -1; /* cut, it would name another file */
    cJSON_Delete(root);
    return rc;
}

bool train_tokenizer_find(const char *train_file, char *out, size_t cap)
{
    if (!train_file || !train_file[0])
        return false;
    char dir[FSDP_PATH_MAX];
    const char *slash = strrchr(train_file, '/');
    if (snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - train_file) : 1, slash ? train_file : ".") >=
        (int)sizeof dir)
        return false; /* longer than any path a file can have */
    int m = tokenizer_from_meta(dir, out, cap);
    if (m == 0)
        return false;
    if (m < 0 && snprintf(out, cap, "%s/%s", dir, MODEL_HF_TOKENIZER) >= (int)cap)
        return false;
    struct stat st;
    return stat(out, &st) == 0 && S_ISREG(st.st_mode);
}
