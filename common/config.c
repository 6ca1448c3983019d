/* The config object: one value per schema key, name lookup with normalised spellings, typed getters. */
#include "common/config.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"

#define NAME_CAP 128

int config_find_section(const struct config_schema *schema, const char *name)
{
    char want[NAME_CAP], have[NAME_CAP];
    config_normalize_name(want, name, sizeof want);
    for (size_t i = 0; i < schema->n_sections; i++) {
        config_normalize_name(have, schema->sections[i].name, sizeof have);
        if (strcmp(want, have) == 0)
            return (int)i;
    }
    return -1;
}

static bool key_name_is(const struct config_key *key, const char *norm)
{
    char have[NAME_CAP];
    config_normalize_name(have, key->name, sizeof have);
    return strcmp(have, norm) == 0;
}

int config_find_key(const struct config_schema *schema, const char *name)
{
    char norm[2 * NAME_CAP], sec[NAME_CAP];
    config_normalize_name(norm, name, sizeof norm);
    const char *dot = strchr(norm, '.');
    if (dot) {
        size_t slen = (size_t)(dot - norm);
        for (size_t i = 0; i < schema->n_keys; i++) {
            config_normalize_name(sec, schema->keys[i].section, sizeof sec);
            if (strlen(sec) == slen && strncmp(sec, norm, slen) == 0 && key_name_is(&schema->keys[i], dot + 1))
                return (int)i;
        }
        return -1;
    }
    for (size_t i = 0; i < schema->n_keys; i++) {
        const char *const *f = schema->keys[i].flags;
        for (; f && *f; f++) {
            char have[NAME_CAP];
            config_normalize_name(have, *f, sizeof have);
            if (strcmp(have, norm) == 0)
                return (int)i;
        }
    }
    /* A bare key name is accepted when exactly one section has it ("micro_batch" but not "seed"). */
    int found = -1;
    for (size_t i = 0; i < schema->n_keys; i++) {
        if (key_name_is(&schema->keys[i], norm)) {
            if (found >= 0)
                return -1;
            found = (int)i;
        }
    }
    return found;
}

int config_set_index_origin(struct config *cfg, int k, const char *text, enum config_source source, int line,
                            const char *origin)
{
    const struct config_key *key = &cfg->schema->keys[k];
    struct config_value v;
    FSDP_TRY(config_value_parse(key, text, &v));
    v.source = source;
    v.line = line;
    v.origin = NULL;
    if (origin && !(v.origin = strdup(origin))) {
        free(v.text);
        return error_set(FSDP_ENOMEM, "out of memory setting %s.%s", key->section, key->name);
    }
    free(cfg->values[k].text);
    free(cfg->values[k].origin);
    cfg->values[k] = v;
    return 0;
}

int config_set_index(struct config *cfg, int k, const char *text, enum config_source source, int line)
{
    return config_set_index_origin(cfg, k, text, source, line, NULL);
}

int config_create(const struct config_schema *schema, struct config **out)
{
    struct config *cfg = calloc(1, sizeof *cfg);
    if (!cfg || !(cfg->values = calloc(schema->n_keys ? schema->n_keys : 1, sizeof *cfg->values))) {
        free(cfg);
        return error_set(FSDP_ENOMEM, "out of memory creating the config");
    }
    cfg->schema = schema;
    for (size_t i = 0; i < schema->n_keys; i++) {
        const struct config_key *key = &schema->keys[i];
        if (config_find_section(schema, key->section) < 0) {
            config_destroy(cfg);
            return error_set(FSDP_EINVAL, "schema bug: key %s.%s is in an undeclared section", key->section,
                             key->name);
        }
        int rc = config_set_index(cfg, (int)i, key->def ? key->def : "", CONFIG_SRC_DEFAULT, 0);
        if (rc) {
            char why[512];
            snprintf(why, sizeof why, "%s", error_message());
            config_destroy(cfg);
            return error_set(rc, "schema bug: default of %s.%s: %s", key->section, key->name, why);
        }
    }
    *out = cfg;
    return 0;
}

void config_destroy(struct config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; cfg->values && i < cfg->schema->n_keys; i++) {
        free(cfg->values[i].text);
        free(cfg->values[i].origin);
    }
    free(cfg->values);
    free(cfg->file);
    free(cfg);
}

int config_set(struct config *cfg, const char *name, const char *text)
{
    int k = config_find_key(cfg->schema, name);
    if (k < 0)
        return error_set(FSDP_ENOTFOUND, "unknown config key '%s'", name);
    int rc = config_set_index(cfg, k, text, CONFIG_SRC_API, 0);
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", error_message());
        return error_set(rc, "%s.%s: %s", cfg->schema->keys[k].section, cfg->schema->keys[k].name, why);
    }
    return 0;
}

/* Getters are called with names the program itself declared, so a miss is a bug to fix, not input to
 * report: abort loudly at the first run rather than return a made-up value. */
static const struct config_value *lookup(const struct config *cfg, const char *section, const char *name,
                                         int type_a, int type_b)
{
    for (size_t i = 0; i < cfg->schema->n_keys; i++) {
        const struct config_key *key = &cfg->schema->keys[i];
        if (strcmp(key->section, section) == 0 && strcmp(key->name, name) == 0) {
            if ((int)key->type != type_a && (int)key->type != type_b && type_a >= 0) {
                log_error("config: %s.%s is a %s, read as another type", section, name,
                          config_type_name(key->type));
                abort();
            }
            return &cfg->values[i];
        }
    }
    log_error("config: no key %s.%s in the schema of %s", section, name, cfg->schema->program);
    abort();
}

long long config_get_int(const struct config *cfg, const char *section, const char *name)
{
    return lookup(cfg, section, name, CONFIG_INT, CONFIG_INT)->v.i;
}

double config_get_float(const struct config *cfg, const char *section, const char *name)
{
    return lookup(cfg, section, name, CONFIG_FLOAT, CONFIG_FLOAT)->v.f;
}

bool config_get_bool(const struct config *cfg, const char *section, const char *name)
{
    return lookup(cfg, section, name, CONFIG_BOOL, CONFIG_BOOL)->v.b;
}

int config_get_enum(const struct config *cfg, const char *section, const char *name)
{
    return lookup(cfg, section, name, CONFIG_ENUM, CONFIG_ENUM)->v.e;
}

const char *config_get_string(const struct config *cfg, const char *section, const char *name)
{
    const struct config_value *v = lookup(cfg, section, name, -1, -1);
    int k = (int)(v - cfg->values);
    enum config_type t = cfg->schema->keys[k].type;
    if (t != CONFIG_STRING && t != CONFIG_PATH && t != CONFIG_ENUM) {
        log_error("config: %s.%s is a %s, read as text", section, name, config_type_name(t));
        abort();
    }
    return v->text ? v->text : "";
}

bool config_is_set(const struct config *cfg, const char *section, const char *name)
{
    return lookup(cfg, section, name, -1, -1)->text != NULL;
}
