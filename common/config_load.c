/* INI files through inih, with the checks inih does not do: over-long lines (Debian's inih 55 cuts them
 * silently), unknown sections and keys, duplicate keys, and file:line in every message. */
#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"

struct load_ctx {
    struct config *cfg;
    const char *name; /* file name for messages */
    const char *pos;  /* next unread byte of the text */
    int line;         /* line most recently handed to inih: the one its handler is called for */
    int *seen_line;   /* per key: line that set it in this file, 0 = not yet */
    int rc;           /* first error; later ones are not reported over it */
};

static int fail_at(struct load_ctx *ctx, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_at(struct load_ctx *ctx, int code, const char *fmt, ...)
{
    if (ctx->rc)
        return 0;
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ctx->rc = error_set(code, "%s:%d: %s", ctx->name, ctx->line, msg);
    return 0;
}

static void known_sections(const struct config_schema *schema, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < schema->n_sections && len < cap; i++) {
        int n = snprintf(buf + len, cap - len, "%s[%s]", i ? ", " : "", schema->sections[i].name);
        if (n > 0)
            len += (size_t)n;
    }
}

static void check_section_header(struct load_ctx *ctx, const char *line)
{
    const char *end = strchr(line, ']');
    if (!end)
        return; /* inih reports it as a syntax error */
    char name[128];
    const char *s = line + 1;
    while (s < end && isspace((unsigned char)*s))
        s++;
    size_t n = (size_t)(end - s);
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    snprintf(name, sizeof name, "%.*s", (int)n, s);
    if (config_find_section(ctx->cfg->schema, name) >= 0)
        return;
    char known[512];
    known_sections(ctx->cfg->schema, known, sizeof known);
    const char *near = config_suggest_section(ctx->cfg->schema, name);
    if (near)
        fail_at(ctx, FSDP_EINVAL, "unknown section [%s]; did you mean [%s]? Known sections: %s", name, near, known);
    else
        fail_at(ctx, FSDP_EINVAL, "unknown section [%s]; known sections: %s", name, known);
}

/* Hands inih one line at a time so that the handler knows its line number, and strips leading blanks so
 * that an indented key is a key, not inih's continuation of the previous value. */
static char *reader(char *str, int num, void *stream)
{
    struct load_ctx *ctx = stream;
    if (!*ctx->pos)
        return NULL;
    const char *nl = strchr(ctx->pos, '\n');
    size_t len = nl ? (size_t)(nl - ctx->pos) + 1 : strlen(ctx->pos);
    const char *s = ctx->pos;
    ctx->pos += len;
    ctx->line++;
    while (len > 1 && (*s == ' ' || *s == '\t')) {
        s++;
        len--;
    }
    if (len >= (size_t)num)
        len = (size_t)num - 1; /* cannot happen: lines were length-checked before parsing */
    memcpy(str, s, len);
    str[len] = '\0';
    if (str[0] == '[')
        check_section_header(ctx, str);
    return str;
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
    struct load_ctx *ctx = user;
    const struct config_schema *schema = ctx->cfg->schema;
    if (ctx->rc)
        return 0;
    char full[300];
    if (*section) {
        if (config_find_section(schema, section) < 0)
            return 0; /* already reported by the reader */
        snprintf(full, sizeof full, "%s.%s", section, name);
    } else {
        snprintf(full, sizeof full, "%s", name); /* before any [section]: flat names */
    }
    int k = (*section && strchr(name, '.')) ? -1 : config_find_key(schema, full);
    if (k < 0) {
        char near[300];
        const char *s = config_suggest_key(schema, full, near, sizeof near);
        const char *where = *section ? section : "";
        if (s)
            return fail_at(ctx, FSDP_EINVAL, "unknown key '%s'%s%s%s; did you mean '%s'?", name,
                           *where ? " in [" : " before any [section]", where, *where ? "]" : "", s);
        return fail_at(ctx, FSDP_EINVAL, "unknown key '%s'%s%s%s (see docs/config.md for the keys)", name,
                       *where ? " in [" : " before any [section]", where, *where ? "]" : "");
    }
    const struct config_key *key = &schema->keys[k];
    if (ctx->seen_line[k])
        return fail_at(ctx, FSDP_EINVAL, "duplicate key %s.%s: set on line %d and again on line %d",
                       key->section, key->name, ctx->seen_line[k], ctx->line);
    ctx->seen_line[k] = ctx->line;
    /* "key =; note" is "key = ; note" without the space: a comment, as --print-config would write it back
     * (inih starts an inline comment only at a ';' after white space) */
    if (value[0] == ';')
        value = "";
    char origin[320];
    snprintf(origin, sizeof origin, "%s:%d", ctx->name, ctx->line);
    int rc = config_set_index_origin(ctx->cfg, k, value, CONFIG_SRC_FILE, ctx->line, origin);
    if (rc) {
        char why[1024];
        snprintf(why, sizeof why, "%s", error_message());
        return fail_at(ctx, rc, "bad value for %s.%s: %s", key->section, key->name, why);
    }
    return 1;
}

/* Finds the first line longer than CONFIG_MAX_LINE (not counting the line break); 0 if none. */
static int find_long_line(const char *text, size_t *len_out)
{
    int line = 1;
    for (const char *p = text; *p; line++) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        size_t shown = len && p[len - 1] == '\r' ? len - 1 : len;
        if (shown > CONFIG_MAX_LINE) {
            *len_out = shown;
            return line;
        }
        if (!nl)
            break;
        p = nl + 1;
    }
    return 0;
}

int config_load_string(struct config *cfg, const char *text, const char *name)
{
    size_t long_len;
    int long_line = find_long_line(text, &long_len);
    if (long_line)
        return error_set(FSDP_EINVAL,
                         "%s:%d: line is %zu characters long; the limit is %d (longer lines would be cut by "
                         "the INI parser). Shorten it, e.g. use a shorter path",
                         name, long_line, long_len, CONFIG_MAX_LINE);
    struct load_ctx ctx = {.cfg = cfg, .name = name, .pos = text};
    ctx.seen_line = calloc(cfg->schema->n_keys ? cfg->schema->n_keys : 1, sizeof *ctx.seen_line);
    if (!ctx.seen_line)
        return error_set(FSDP_ENOMEM, "out of memory reading %s", name);
    int r = ini_parse_stream(reader, &ctx, handler, &ctx);
    free(ctx.seen_line);
    if (ctx.rc)
        return ctx.rc;
    if (r > 0) {
        /* Re-find the offending line for the message; inih only says which one. */
        const char *p = text;
        for (int i = 1; i < r && p; i++) {
            p = strchr(p, '\n');
            p = p ? p + 1 : NULL;
        }
        int n = p ? (int)strcspn(p, "\r\n") : 0;
        return error_set(FSDP_EINVAL, "%s:%d: cannot parse '%.*s': expected [section], key = value or a ; comment",
                         name, r, n, p ? p : "");
    }
    if (r < 0)
        return error_set(FSDP_ENOMEM, "out of memory parsing %s", name);
    return 0;
}

int config_load_file(struct config *cfg, const char *path)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below as not a regular file. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return error_set(errno == ENOENT ? FSDP_ENOTFOUND : FSDP_EIO, "cannot open config file '%s': %s", path,
                         strerror(errno));
    char *text = NULL;
    int rc = 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = error_set(FSDP_EINVAL, "config file '%s' is not a regular file (a device, FIFO or directory); give "
                       "the path of an INI file", path);
        goto out;
    }
    if (st.st_size > CONFIG_MAX_FILE_BYTES) {
        rc = error_set(FSDP_EINVAL, "config file '%s' is %lld bytes; the limit is %d: is it really an INI file?",
                       path, (long long)st.st_size, CONFIG_MAX_FILE_BYTES);
        goto out;
    }
    /* One byte more than the limit: a file that grew since fstat is caught as well. */
    text = malloc(CONFIG_MAX_FILE_BYTES + 2);
    if (!text) {
        rc = error_set(FSDP_ENOMEM, "out of memory reading '%s'", path);
        goto out;
    }
    size_t len = 0;
    while (len <= CONFIG_MAX_FILE_BYTES) {
        ssize_t n = read(fd, text + len, CONFIG_MAX_FILE_BYTES + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = error_set(FSDP_EIO, "cannot read config file '%s': %s", path, strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    if (len > CONFIG_MAX_FILE_BYTES) {
        rc = error_set(FSDP_EINVAL, "config file '%s' grew beyond %d bytes while it was read", path,
                       CONFIG_MAX_FILE_BYTES);
        goto out;
    }
    text[len] = '\0';
    if (strlen(text) != len) {
        rc = error_set(FSDP_EINVAL, "%s: contains a NUL byte; a config file is text", path);
        goto out;
    }
    FSDP_TRY_GOTO(config_load_string(cfg, text, path), rc, out);
    free(cfg->file);
    cfg->file = strdup(path);
out:
    close(fd);
    free(text);
    return rc;
}
