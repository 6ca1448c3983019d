/* The config.json helpers families read and write their keys with (model_internal.h): typed reads that
 * name the file and the key, and the record of which [model] setting each key implies. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "worker/model/model_hf_internal.h"

/* The shortest decimal that reads back as v (1e-05, not 9.99999975e-06; 500000, not 5e+05). */
static void shortest(float v, char *out, size_t cap)
{
    if (v == floorf(v) && fabsf(v) < 1e9f) {
        snprintf(out, cap, "%.0f", (double)v);
        return;
    }
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(out, cap, "%.*g", prec, (double)v);
        if (strtof(out, NULL) == v)
            return;
    }
}

static const cJSON *item(const struct model_hf_json *j, const char *hf_key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j->root, hf_key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

int model_hf_json_setting(struct model_hf_json *j, const char *ini_key, const char *value, const char *hf_key)
{
    struct model_hf_config *o = j->out;
    if (o->n_settings >= MODEL_HF_MAX_SETTINGS)
        return error_set(FSDP_ERANGE, "%s: more than %d [model] settings", j->path, MODEL_HF_MAX_SETTINGS);
    struct model_hf_setting *s = &o->settings[o->n_settings++];
    memset(s, 0, sizeof *s);
    snprintf(s->key, sizeof s->key, "%s", ini_key);
    snprintf(s->value, sizeof s->value, "%s", value);
    snprintf(s->hf_key, sizeof s->hf_key, "%s", hf_key);
    return 0;
}

static int record(struct model_hf_json *j, const char *ini_key, const char *hf_key, const char *value, int flags)
{
    if (!ini_key)
        return 0;
    FSDP_TRY(model_hf_json_setting(j, ini_key, value, hf_key));
    j->out->settings[j->out->n_settings - 1].at_most = (flags & MODEL_HF_AT_MOST) != 0;
    return 0;
}

static int missing(const struct model_hf_json *j, const char *hf_key, const char *type)
{
    return error_set(FSDP_EINVAL, "%s: \"%s\" is missing; it must be %s", j->path, hf_key, type);
}

int model_hf_json_int(struct model_hf_json *j, const char *hf_key, const char *ini_key, int def, int flags, int *dst)
{
    const cJSON *v = item(j, hf_key);
    if (!v && (flags & MODEL_HF_REQUIRED))
        return missing(j, hf_key, "an integer");
    if (v && (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || fabs(v->valuedouble) > 2147483647.0))
        return error_set(FSDP_EINVAL, "%s: \"%s\" must be an integer", j->path, hf_key);
    *dst = v ? (int)v->valuedouble : def;
    char text[32];
    snprintf(text, sizeof text, "%d", *dst);
    return record(j, ini_key, hf_key, text, flags);
}

int model_hf_json_float(struct model_hf_json *j, const char *hf_key, const char *ini_key, double def, int flags,
                        float *dst)
{
    const cJSON *v = item(j, hf_key);
    if (!v && (flags & MODEL_HF_REQUIRED))
        return missing(j, hf_key, "a number");
    if (v && (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)))
        return error_set(FSDP_EINVAL, "%s: \"%s\" must be a number", j->path, hf_key);
    *dst = (float)(v ? v->valuedouble : def);
    char text[32];
    shortest(*dst, text, sizeof text);
    return record(j, ini_key, hf_key, text, flags);
}

int model_hf_json_bool(struct model_hf_json *j, const char *hf_key, const char *ini_key, bool def, int flags,
                       bool *dst)
{
    const cJSON *v = item(j, hf_key);
    if (!v && (flags & MODEL_HF_REQUIRED))
        return missing(j, hf_key, "true or false");
    if (v && !cJSON_IsBool(v))
        return error_set(FSDP_EINVAL, "%s: \"%s\" must be true or false", j->path, hf_key);
    *dst = v ? cJSON_IsTrue(v) : def;
    return record(j, ini_key, hf_key, *dst ? "true" : "false", flags);
}

int model_hf_json_expect_str(struct model_hf_json *j, const char *hf_key, const char *const *allowed, const char *what)
{
    const cJSON *v = item(j, hf_key);
    if (!v)
        return 0;
    for (int i = 0; cJSON_IsString(v) && allowed[i]; i++)
        if (strcmp(v->valuestring, allowed[i]) == 0)
            return 0;
    char *text = cJSON_PrintUnformatted(v);
    int rc = error_set(FSDP_EUNSUPPORTED, "%s: \"%s\" is %s, but %s", j->path, hf_key, text ? text : "?", what);
    free(text);
    return rc;
}

int model_hf_json_expect_num(struct model_hf_json *j, const char *hf_key, double want, const char *what)
{
    const cJSON *v = item(j, hf_key);
    if (!v || (cJSON_IsNumber(v) && fabs(v->valuedouble - want) <= 1e-6 * fabs(want)))
        return 0;
    char *text = cJSON_PrintUnformatted(v);
    int rc = error_set(FSDP_EUNSUPPORTED, "%s: \"%s\" is %s, but %s", j->path, hf_key, text ? text : "?", what);
    free(text);
    return rc;
}

int model_hf_json_expect_bool(struct model_hf_json *j, const char *hf_key, bool want, const char *what)
{
    const cJSON *v = item(j, hf_key);
    if (!v || (cJSON_IsBool(v) && cJSON_IsTrue(v) == want))
        return 0;
    char *text = cJSON_PrintUnformatted(v);
    int rc = error_set(FSDP_EUNSUPPORTED, "%s: \"%s\" is %s, but %s", j->path, hf_key, text ? text : "?", what);
    free(text);
    return rc;
}

int model_hf_json_add_float(cJSON *obj, const char *key, float v)
{
    char text[32];
    shortest(v, text, sizeof text);
    return cJSON_AddNumberToObject(obj, key, strtod(text, NULL)) ? 0 : error_set(FSDP_ENOMEM, "out of memory");
}
