/* Typed reads of the FSDP_* settings: each value is parsed and checked against its table entry, and a value
 * the entry does not allow is an error naming the variable, the value and what is allowed. */
#include "common/settings.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"

static bool parse_bool(const char *v, bool *out)
{
    static const char *const on[] = {"1", "true", "yes", "on"}, *const off[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < sizeof on / sizeof on[0]; i++) {
        if (strcasecmp(v, on[i]) == 0) {
            *out = true;
            return true;
        }
        if (strcasecmp(v, off[i]) == 0) {
            *out = false;
            return true;
        }
    }
    return false;
}

static bool parse_int(const struct setting *s, const char *v, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < s->min || (s->max > s->min && x > s->max))
        return false;
    *out = x;
    return true;
}

static bool parse_double(const struct setting *s, const char *v, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(x) || x < s->min || (s->min_exclusive && x <= s->min) ||
        (s->max > s->min && x > s->max))
        return false;
    *out = x;
    return true;
}

static bool parse_enum(const struct setting *s, const char *v, int *out)
{
    for (const struct setting_alias *a = s->aliases; a && a->from; a++) {
        if (strcasecmp(v, a->from) == 0) {
            v = a->to;
            break;
        }
    }
    for (int i = 0; s->values && s->values[i].name; i++) {
        if (strcasecmp(v, s->values[i].name) == 0) {
            *out = i;
            return true;
        }
    }
    return false;
}

/* What the entry allows, as one clause for an error message. */
static void describe_allowed(const struct setting *s, char *buf, size_t cap)
{
    switch (s->type) {
    case SETTING_BOOL: snprintf(buf, cap, "is not a boolean: use 1 or 0 (also true/false, yes/no, on/off)"); break;
    case SETTING_INT:
        if (s->max > s->min)
            snprintf(buf, cap, "is not an integer from %.0f to %.0f", s->min, s->max);
        else
            snprintf(buf, cap, "is not an integer >= %.0f", s->min);
        break;
    case SETTING_DOUBLE:
        if (s->max > s->min)
            snprintf(buf, cap, "is not a number from %g to %g", s->min, s->max);
        else
            snprintf(buf, cap, "is not a number %s %g", s->min_exclusive ? ">" : ">=", s->min);
        break;
    case SETTING_ENUM: {
        size_t used = (size_t)snprintf(buf, cap, ": allowed are ");
        for (int i = 0; s->values[i].name && used < cap; i++) {
            const struct setting_value *val = &s->values[i];
            bool is_def = s->def && strcmp(s->def, val->name) == 0;
            const char *sep = i == 0 ? "" : s->values[i + 1].name ? ", " : " and ";
            int n;
            if (val->doc)
                n = snprintf(buf + used, cap - used, "%s%s (%s%s)", sep, val->name, is_def ? "the default: " : "",
                             val->doc);
            else
                n = snprintf(buf + used, cap - used, "%s%s%s", sep, val->name, is_def ? " (the default)" : "");
            used += n > 0 ? (size_t)n : 0;
        }
        break;
    }
    default: snprintf(buf, cap, "is not allowed"); break;
    }
}

static int invalid(const struct setting *s, const char *v)
{
    char allowed[512];
    describe_allowed(s, allowed, sizeof allowed);
    return error_set(FSDP_EINVAL, "%s=%s%s%s", s->name, v, s->type == SETTING_ENUM ? "" : " ", allowed);
}

/* The entry of id when it has the type the caller reads it as; a mismatch is a programming error. */
static const struct setting *typed(enum setting_id id, enum setting_type type, int *rc)
{
    const struct setting *s = settings_entry(id);
    *rc = 0;
    if (!s || s->type != type)
        *rc = error_set(FSDP_EINVAL, "settings: %s is not a setting of the type read", s ? s->name : "(no id)");
    return *rc ? NULL : s;
}

const char *settings_get_raw(enum setting_id id)
{
    const struct setting *s = settings_entry(id);
    const char *v = s ? getenv(s->name) : NULL;
    return v && !*v && !s->empty_is_value ? NULL : v;
}

const char *settings_get_string(enum setting_id id)
{
    const struct setting *s = settings_entry(id);
    const char *v = settings_get_raw(id);
    return v ? v : s ? s->def : NULL;
}

int settings_get_bool(enum setting_id id, bool *out)
{
    int rc;
    const struct setting *s = typed(id, SETTING_BOOL, &rc);
    if (rc)
        return rc;
    if (s->def)
        parse_bool(s->def, out);
    const char *v = settings_get_raw(id);
    return v && !parse_bool(v, out) ? invalid(s, v) : 0;
}

int settings_get_int(enum setting_id id, long *out)
{
    int rc;
    const struct setting *s = typed(id, SETTING_INT, &rc);
    if (rc)
        return rc;
    if (s->def)
        parse_int(s, s->def, out);
    const char *v = settings_get_raw(id);
    return v && !parse_int(s, v, out) ? invalid(s, v) : 0;
}

int settings_get_double(enum setting_id id, double *out)
{
    int rc;
    const struct setting *s = typed(id, SETTING_DOUBLE, &rc);
    if (rc)
        return rc;
    if (s->def)
        parse_double(s, s->def, out);
    const char *v = settings_get_raw(id);
    return v && !parse_double(s, v, out) ? invalid(s, v) : 0;
}

int settings_get_enum(enum setting_id id, int *out)
{
    int rc;
    const struct setting *s = typed(id, SETTING_ENUM, &rc);
    if (rc)
        return rc;
    if (s->def)
        parse_enum(s, s->def, out);
    const char *v = settings_get_raw(id);
    return v && !parse_enum(s, v, out) ? invalid(s, v) : 0;
}
