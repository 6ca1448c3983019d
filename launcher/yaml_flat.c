/* A YAML file as flat `dotted.key = text` items, read with libyaml's event parser. */
#include "launcher/yaml_flat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "common/error.h"
#include "common/fs.h"

#define MAX_DEPTH 8

struct reader {
    yaml_parser_t p;
    const char *path;
    struct yaml_flat *out;
    int cap;
};

static int fail(struct reader *r, const yaml_event_t *e, const char *fmt, const char *arg)
{
    char msg[512];
    snprintf(msg, sizeof msg, fmt, arg);
    return error_set(FSDP_EINVAL, "%s:%zu: %s", r->path, e ? (size_t)e->start_mark.line + 1 : (size_t)0, msg);
}

static int next(struct reader *r, yaml_event_t *e)
{
    if (yaml_parser_parse(&r->p, e))
        return 0;
    return error_set(FSDP_EINVAL, "%s:%zu: not valid YAML: %s%s%s", r->path, (size_t)r->p.problem_mark.line + 1,
                     r->p.problem ? r->p.problem : "syntax error", r->p.context ? " " : "",
                     r->p.context ? r->p.context : "");
}

static int add(struct reader *r, const char *key, const char *value, int line, bool is_null, bool is_mapping)
{
    for (int i = 0; i < r->out->n; i++)
        if (strcmp(r->out->items[i].key, key) == 0)
            return error_set(FSDP_EINVAL, "%s:%d: key '%s' is given twice (also on line %d)", r->path, line, key,
                             r->out->items[i].line);
    if (r->out->n >= YAML_FLAT_MAX_ITEMS)
        return error_set(FSDP_EINVAL, "%s:%d: more than %d keys; an accelerate config has a few dozen", r->path, line,
                         YAML_FLAT_MAX_ITEMS);
    if (r->out->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 32;
        struct yaml_item *it = realloc(r->out->items, (size_t)cap * sizeof *it);
        if (!it)
            return error_set(FSDP_ENOMEM, "out of memory reading %s", r->path);
        r->out->items = it;
        r->cap = cap;
    }
    struct yaml_item *it = &r->out->items[r->out->n];
    memset(it, 0, sizeof *it);
    snprintf(it->key, sizeof it->key, "%s", key);
    if (strlen(value) >= sizeof it->value)
        return error_set(FSDP_EINVAL, "%s:%d: the value of '%s' is longer than %d characters", r->path, line, key,
                         YAML_FLAT_VALUE_MAX - 1);
    snprintf(it->value, sizeof it->value, "%s", value);
    it->line = line;
    it->is_null = is_null;
    it->is_mapping = is_mapping;
    r->out->n++;
    return 0;
}

static bool scalar_is_null(const yaml_event_t *e)
{
    if (e->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)e->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

static int node(struct reader *r, yaml_event_t *e, const char *key, int depth);

/* A list of scalars becomes one comma-joined text (accelerate writes class lists either way). */
static int sequence(struct reader *r, const char *key, int line)
{
    char joined[YAML_FLAT_VALUE_MAX * 2] = "";
    size_t len = 0;
    for (;;) {
        yaml_event_t e;
        int rc = next(r, &e);
        if (rc)
            return rc;
        if (e.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&e);
            break;
        }
        if (e.type != YAML_SCALAR_EVENT) {
            rc = fail(r, &e, "'%s' is a list of lists or mappings; only lists of plain values are read", key);
            yaml_event_delete(&e);
            return rc;
        }
        const char *v = (const char *)e.data.scalar.value;
        if (len + strlen(v) + 2 >= sizeof joined) {
            rc = fail(r, &e, "the list '%s' is too long", key);
            yaml_event_delete(&e);
            return rc;
        }
        len += (size_t)snprintf(joined + len, sizeof joined - len, "%s%s", len ? "," : "", v);
        yaml_event_delete(&e);
    }
    return add(r, key, joined, line, false, false);
}

static int mapping(struct reader *r, const char *prefix, int line, int depth)
{
    if (depth >= MAX_DEPTH)
        return error_set(FSDP_EINVAL, "%s:%d: mappings nested deeper than %d levels", r->path, line, MAX_DEPTH);
    bool empty = true;
    for (;;) {
        yaml_event_t k;
        int rc = next(r, &k);
        if (rc)
            return rc;
        if (k.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&k);
            break;
        }
        if (k.type != YAML_SCALAR_EVENT) {
            rc = fail(r, &k, "a key under '%s' is not a plain name", prefix[0] ? prefix : "the top level");
            yaml_event_delete(&k);
            return rc;
        }
        char key[YAML_FLAT_KEY_MAX];
        int n = snprintf(key, sizeof key, "%s%s%s", prefix, prefix[0] ? "." : "", (const char *)k.data.scalar.value);
        yaml_event_delete(&k);
        if (n < 0 || (size_t)n >= sizeof key)
            return error_set(FSDP_EINVAL, "%s:%d: key path longer than %d characters", r->path, line,
                             YAML_FLAT_KEY_MAX - 1);
        yaml_event_t v;
        rc = next(r, &v);
        if (!rc)
            rc = node(r, &v, key, depth + 1);
        yaml_event_delete(&v);
        if (rc)
            return rc;
        empty = false;
    }
    if (empty && prefix[0])
        return add(r, prefix, "", line, false, true);
    return 0;
}

static int node(struct reader *r, yaml_event_t *e, const char *key, int depth)
{
    int line = (int)e->start_mark.line + 1;
    switch (e->type) {
    case YAML_SCALAR_EVENT:
        return add(r, key, (const char *)e->data.scalar.value, line, scalar_is_null(e), false);
    case YAML_SEQUENCE_START_EVENT: return sequence(r, key, line);
    case YAML_MAPPING_START_EVENT: return mapping(r, key, line, depth);
    case YAML_ALIAS_EVENT: return fail(r, e, "'%s' uses an alias (*name); write the value out", key);
    default: return fail(r, e, "unexpected YAML event under '%s'", key);
    }
}

int yaml_flat_read(const char *path, struct yaml_flat *out)
{
    memset(out, 0, sizeof *out);
    /* the type is checked before any blocking open: fopen of a FIFO with no writer would hang the launcher */
    int fd = fs_open_regular(path, "accelerate config file");
    if (fd < 0)
        return fd;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return error_set(FSDP_EIO, "accelerate config file %s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size > YAML_FLAT_MAX_BYTES) {
        int rc = error_set(FSDP_EINVAL, "%s is %lld bytes; an accelerate config file is at most %d bytes", path,
                           (long long)st.st_size, YAML_FLAT_MAX_BYTES);
        fclose(f);
        return rc;
    }
    struct reader r = {.path = path, .out = out};
    if (!yaml_parser_initialize(&r.p)) {
        fclose(f);
        return error_set(FSDP_ENOMEM, "out of memory reading %s", path);
    }
    yaml_parser_set_input_file(&r.p, f);
    int rc = 0;
    bool done = false, top = false;
    while (!rc && !done) {
        yaml_event_t e;
        if ((rc = next(&r, &e)))
            break;
        switch (e.type) {
        case YAML_STREAM_START_EVENT:
        case YAML_DOCUMENT_START_EVENT:
        case YAML_DOCUMENT_END_EVENT: break;
        case YAML_STREAM_END_EVENT: done = true; break;
        case YAML_MAPPING_START_EVENT:
            if (top)
                rc = fail(&r, &e, "%s holds more than one YAML document; keep one", path);
            else
                rc = mapping(&r, "", (int)e.start_mark.line + 1, 0);
            top = true;
            break;
        default: rc = fail(&r, &e, "the top level of %s must be a mapping of keys (key: value)", path); break;
        }
        yaml_event_delete(&e);
    }
    if (!rc && !top)
        rc = error_set(FSDP_EINVAL, "%s is empty: expected an accelerate config (key: value lines)", path);
    yaml_parser_delete(&r.p);
    fclose(f);
    if (rc)
        yaml_flat_free(out);
    return rc;
}

void yaml_flat_free(struct yaml_flat *y)
{
    free(y->items);
    y->items = NULL;
    y->n = 0;
}
