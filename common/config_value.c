/* Value syntax: parsing text against one key's type, range and enum values, and the canonical text that
 * --print-config writes (so that printing, reloading and printing again is byte-identical). */
#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"

const char *config_type_name(enum config_type type)
{
    switch (type) {
    case CONFIG_INT: return "int";
    case CONFIG_FLOAT: return "float";
    case CONFIG_BOOL: return "bool";
    case CONFIG_STRING: return "string";
    case CONFIG_ENUM: return "enum";
    case CONFIG_PATH: return "path";
    }
    return "?";
}

void config_normalize_name(char *dst, const char *src, size_t cap)
{
    size_t n = 0;
    for (; src[n] && n + 1 < cap; n++)
        dst[n] = src[n] == '-' ? '_' : (char)tolower((unsigned char)src[n]);
    if (cap)
        dst[n] = '\0';
}

static bool key_has_range(const struct config_key *key) { return key->min < key->max; }

static void append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    if (*len >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len = *len + (size_t)n < cap ? *len + (size_t)n : cap;
}

void config_describe_allowed(const struct config_key *key, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    switch (key->type) {
    case CONFIG_INT:
        if (key_has_range(key))
            append(buf, cap, &len, "an integer in [%.0f, %.0f]", key->min, key->max);
        else
            append(buf, cap, &len, "an integer");
        break;
    case CONFIG_FLOAT:
        if (key_has_range(key))
            append(buf, cap, &len, "a number in [%g, %g]", key->min, key->max);
        else
            append(buf, cap, &len, "a number");
        break;
    case CONFIG_BOOL: append(buf, cap, &len, "a boolean: true/false, 1/0, yes/no, on/off"); break;
    case CONFIG_STRING: append(buf, cap, &len, "text (empty = unset)"); break;
    case CONFIG_PATH: append(buf, cap, &len, "a path (empty = unset)"); break;
    case CONFIG_ENUM:
        append(buf, cap, &len, "one of: ");
        for (size_t i = 0; key->values && key->values[i]; i++)
            append(buf, cap, &len, "%s%s", i ? ", " : "", key->values[i]);
        if (key->value_aliases && key->value_aliases[0].from) {
            append(buf, cap, &len, " (also ");
            for (size_t i = 0; key->value_aliases[i].from; i++)
                append(buf, cap, &len, "%s%s = %s", i ? ", " : "", key->value_aliases[i].from,
                       key->value_aliases[i].to);
            append(buf, cap, &len, ")");
        }
        break;
    }
    if (config_key_optional(key) && (key->type == CONFIG_INT || key->type == CONFIG_FLOAT || key->type == CONFIG_BOOL))
        append(buf, cap, &len, " (empty = unset)");
}

bool config_key_optional(const struct config_key *key)
{
    return !key->def || !*key->def;
}

static int fail(const struct config_key *key, const char *text)
{
    char allowed[1024];
    config_describe_allowed(key, allowed, sizeof allowed);
    return error_set(FSDP_EINVAL, "'%s' is not valid; expected %s", text, allowed);
}

/* Shortest of %.15g..%.17g that reads back to the same double, so 0.1 prints as 0.1 and still
 * round-trips exactly. */
static void format_double(double x, char *buf, size_t cap)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    /* A float key printed as "2" would read back fine, but "2.0" says float to a reader. */
    if (!strpbrk(buf, ".eEn") && strlen(buf) + 3 < cap)
        strcat(buf, ".0");
}

static bool names_equal(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        char ca = *a == '-' ? '_' : (char)tolower((unsigned char)*a);
        char cb = *b == '-' ? '_' : (char)tolower((unsigned char)*b);
        if (ca != cb)
            return false;
    }
    return *a == *b;
}

static int parse_enum(const struct config_key *key, const char *s, struct config_value *out)
{
    const char *canon = NULL;
    if (key->value_aliases)
        for (size_t i = 0; key->value_aliases[i].from && !canon; i++)
            if (names_equal(s, key->value_aliases[i].from))
                canon = key->value_aliases[i].to;
    if (!canon)
        canon = s;
    for (int i = 0; key->values && key->values[i]; i++) {
        if (names_equal(canon, key->values[i])) {
            out->v.e = i;
            out->text = strdup(key->values[i]);
            return out->text ? 0 : error_set(FSDP_ENOMEM, "out of memory");
        }
    }
    return fail(key, s);
}

static int parse_bool(const struct config_key *key, const char *s, struct config_value *out)
{
    static const char *const yes[] = {"true", "1", "yes", "on"};
    static const char *const no[] = {"false", "0", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0 || strcasecmp(s, no[i]) == 0) {
            out->v.b = strcasecmp(s, yes[i]) == 0;
            out->text = strdup(out->v.b ? "true" : "false");
            return out->text ? 0 : error_set(FSDP_ENOMEM, "out of memory");
        }
    }
    return fail(key, s);
}

static int parse_number(const struct config_key *key, const char *s, struct config_value *out)
{
    char *end;
    char buf[64];
    errno = 0;
    if (key->type == CONFIG_INT) {
        long long x = strtoll(s, &end, 10);
        if (end == s || *end || errno == ERANGE)
            return fail(key, s);
        if (key_has_range(key) && ((double)x < key->min || (double)x > key->max))
            return fail(key, s);
        out->v.i = x;
        snprintf(buf, sizeof buf, "%lld", x);
    } else {
        double x = strtod(s, &end);
        if (end == s || *end || !isfinite(x))
            return fail(key, s);
        if (key_has_range(key) && (x < key->min || x > key->max))
            return fail(key, s);
        out->v.f = x;
        format_double(x, buf, sizeof buf);
    }
    out->text = strdup(buf);
    return out->text ? 0 : error_set(FSDP_ENOMEM, "out of memory");
}

/* Text values must survive an INI round trip: inih strips surrounding spaces and treats " ;" as the start
 * of a comment, and a value must fit on one line. */
static int parse_text(const struct config_key *key, const char *s, struct config_value *out)
{
    size_t n = strlen(s);
    if (n > CONFIG_MAX_VALUE)
        return error_set(FSDP_EINVAL, "value is %zu characters; the limit is %d", n, CONFIG_MAX_VALUE);
    for (size_t i = 0; i < n; i++) {
        if (iscntrl((unsigned char)s[i]))
            return error_set(FSDP_EINVAL, "value contains a control character (expected %s)",
                             key->type == CONFIG_PATH ? "a path" : "one line of text");
        if (s[i] == ';' && i > 0 && isspace((unsigned char)s[i - 1]))
            return error_set(FSDP_EINVAL, "value '%s' contains ' ;', which an INI file reads as a comment",
                             s);
    }
    if (n == 0) {
        out->text = NULL; /* unset */
        return 0;
    }
    out->text = strdup(s);
    return out->text ? 0 : error_set(FSDP_ENOMEM, "out of memory");
}

int config_value_parse(const struct config_key *key, const char *text, struct config_value *out)
{
    /* Trim like inih does, so a command-line value and a file value of the same text agree. */
    while (isspace((unsigned char)*text))
        text++;
    size_t n = strlen(text);
    while (n && isspace((unsigned char)text[n - 1]))
        n--;
    char *s = strndup(text, n);
    if (!s)
        return error_set(FSDP_ENOMEM, "out of memory");
    struct config_value v = {0};
    int rc;
    /* A number or boolean without a default is optional: empty text leaves it unset (text NULL), as for
     * strings, so --print-config's "key =" loads back. Keys with a default keep refusing empty text. */
    if (n == 0 && config_key_optional(key)) {
        free(s);
        *out = v;
        return 0;
    }
    switch (key->type) {
    case CONFIG_INT:
    case CONFIG_FLOAT: rc = parse_number(key, s, &v); break;
    case CONFIG_BOOL: rc = parse_bool(key, s, &v); break;
    case CONFIG_ENUM: rc = parse_enum(key, s, &v); break;
    default: rc = parse_text(key, s, &v); break;
    }
    free(s);
    if (rc == 0)
        *out = v;
    return rc;
}
