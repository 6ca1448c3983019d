#include "common/fs.h"
#include "tests/util/tu_summary.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/util/tu_file.h"

cJSON *tu_summary_load(const char *logdir, int rank)
{
    char path[FSDP_PATH_MAX];
    snprintf(path, sizeof path, "%s/run_summary.rank%d.json", logdir, rank);
    char *text = tu_slurp(path);
    cJSON *o = text && *text ? cJSON_Parse(text) : NULL;
    free(text);
    return o;
}

const cJSON *tu_json_at(const cJSON *o, const char *path)
{
    char name[256];
    for (const char *p = path; o && *p;) {
        size_t n = strcspn(p, ".");
        if (n >= sizeof name)
            return NULL;
        memcpy(name, p, n);
        name[n] = 0;
        o = cJSON_GetObjectItemCaseSensitive(o, name);
        p += n + (p[n] == '.');
    }
    return o;
}

double tu_json_num(const cJSON *o, const char *path)
{
    const cJSON *x = tu_json_at(o, path);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

const char *tu_json_str(const cJSON *o, const char *path)
{
    const cJSON *x = tu_json_at(o, path);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static bool matches(const cJSON *o, const cJSON *pat)
{
    if (!o)
        return false;
    if (cJSON_IsObject(pat)) {
        if (!cJSON_IsObject(o))
            return false;
        const cJSON *m;
        cJSON_ArrayForEach(m, pat)
        {
            if (!matches(cJSON_GetObjectItemCaseSensitive(o, m->string), m))
                return false;
        }
        return true;
    }
    if (cJSON_IsArray(pat)) {
        if (!cJSON_IsArray(o))
            return false;
        const cJSON *want, *have;
        cJSON_ArrayForEach(want, pat)
        {
            bool found = false;
            cJSON_ArrayForEach(have, o)
            {
                found = found || matches(have, want);
            }
            if (!found)
                return false;
        }
        return true;
    }
    return cJSON_Compare(o, pat, true);
}

const char *tu_json_raw(const char *row, const char *key, size_t *len)
{
    char pat[256];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(row, pat);
    if (!p)
        return NULL;
    p += strlen(pat);
    *len = strcspn(p, ",}");
    return p;
}

bool tu_json_matches(const cJSON *o, const char *pattern)
{
    cJSON *pat = cJSON_Parse(pattern);
    bool ok = pat && matches(o, pat);
    cJSON_Delete(pat);
    return ok;
}
