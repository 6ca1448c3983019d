/* The parser and the help printer of fsdp-ckpt's command tables (ckpt_tool_args.h). Errors follow
 * fsdp-launch's form: the flag, the value in single quotes, and what is allowed. */
#include "worker/tools/ckpt_tool_args.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* Appends to a text of cap bytes (what does not fit is cut: texts shown to the user). */
static void add(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add(char *buf, size_t cap, const char *fmt, ...)
{
    size_t n = strlen(buf);
    if (n + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

/* The listed spellings of a choice: "f32, bf16 or f16" (sep ", ", last " or ") or "f32|bf16|f16". */
static void choice_list(const struct ckpt_opt *o, const char *sep, const char *last, char *buf, size_t cap)
{
    int n = 0, k = 0;
    for (const struct ckpt_choice *c = o->choices; c->name; c++)
        n += !c->alias;
    buf[0] = '\0';
    for (const struct ckpt_choice *c = o->choices; c->name; c++) {
        if (c->alias)
            continue;
        add(buf, cap, "%s%s", k == 0 ? "" : k == n - 1 ? last : sep, c->name);
        k++;
    }
}

/* What a value of o may be, as help and messages say it. */
static const char *allowed(const struct ckpt_opt *o, char *buf, size_t cap)
{
    buf[0] = '\0';
    switch (o->kind) {
    case CKPT_OPT_INT:
        if (o->clamp || o->hi >= 0x1p62)
            add(buf, cap, "an integer >= %.0f", o->lo);
        else
            add(buf, cap, "an integer in [%.0f, %.0f]", o->lo, o->hi);
        return buf;
    case CKPT_OPT_NUMBER:
        if (isinf(o->hi))
            add(buf, cap, "a number >= %g", o->lo);
        else
            add(buf, cap, "a number in [%g, %g]", o->lo, o->hi);
        return buf;
    case CKPT_OPT_CHOICE:
        choice_list(o, ", ", " or ", buf, cap);
        return buf;
    case CKPT_OPT_TEXT:
    case CKPT_OPT_PARSE:
        break;
    }
    return o->allowed;
}

static const char *metavar(const struct ckpt_opt *o, char *buf, size_t cap)
{
    if (o->metavar)
        return o->metavar;
    choice_list(o, "|", "|", buf, cap);
    return buf;
}

static void synopsis(const struct ckpt_tool_cmd *cmd, char *buf, size_t cap)
{
    char mv[128];
    buf[0] = '\0';
    add(buf, cap, "%s", cmd->name);
    for (int i = 0; i < cmd->n_args; i++)
        add(buf, cap, " %s", cmd->args[i].name);
    for (int i = 0; i < cmd->n_opts; i++) {
        const struct ckpt_opt *o = &cmd->opts[i];
        add(buf, cap, o->required ? " %s %s" : " [%s %s]", o->name, metavar(o, mv, sizeof mv));
    }
}

/* Writes text from column col (the cursor's), wrapped at WRAP columns to lines indented by indent, and a
 * newline. */
#define WRAP 110
static void wrap(FILE *out, int col, int indent, const char *text)
{
    for (bool first = true; *text; first = false) {
        size_t word = 0; /* a word ends at a space outside brackets: "[--top_k K]" stays on one line */
        for (int depth = 0; text[word] && (text[word] != ' ' || depth > 0); word++)
            depth += (text[word] == '[') - (text[word] == ']' && depth > 0);
        if (!first && col + 1 + (int)word > WRAP) {
            fprintf(out, "\n%*s", indent, "");
            col = indent;
        } else if (!first) {
            fputc(' ', out);
            col++;
        }
        fwrite(text, 1, word, out);
        col += (int)word;
        text += word;
        text += strspn(text, " ");
    }
    fputc('\n', out);
}

void ckpt_tool_args_commands(const struct ckpt_tool_cmd *const *cmds, int n, FILE *out)
{
    char s[1024];
    for (int i = 0; i < n; i++) {
        synopsis(cmds[i], s, sizeof s);
        fprintf(out, "  ");
        wrap(out, 2, 8, s);
        fprintf(out, "      ");
        wrap(out, 6, 6, cmds[i]->about);
        if (cmds[i]->alias)
            fprintf(out, "      (%s is the same command)\n", cmds[i]->alias);
    }
}

void ckpt_tool_args_help(const struct ckpt_tool_cmd *cmd, FILE *out)
{
    char s[1024], mv[128], al[256];
    synopsis(cmd, s, sizeof s);
    fprintf(out, "usage: fsdp-ckpt ");
    wrap(out, 17, 8, s);
    wrap(out, 0, 0, cmd->about);
    if (cmd->alias)
        fprintf(out, "fsdp-ckpt %s is the same command.\n", cmd->alias);
    fputc('\n', out);
    int width = 8;
    for (int i = 0; i < cmd->n_args; i++) {
        int w = (int)strlen(cmd->args[i].name);
        width = w > width ? w : width;
    }
    for (int i = 0; i < cmd->n_opts; i++) {
        int w = (int)(strlen(cmd->opts[i].name) + 1 + strlen(metavar(&cmd->opts[i], mv, sizeof mv)));
        width = w > width ? w : width;
    }
    int indent = 2 + width + 2;
    for (int i = 0; i < cmd->n_args; i++) {
        fprintf(out, "  %-*s  ", width, cmd->args[i].name);
        wrap(out, indent, indent, cmd->args[i].help);
    }
    for (int i = 0; i < cmd->n_opts; i++) {
        const struct ckpt_opt *o = &cmd->opts[i];
        char flag[160], what[512];
        snprintf(flag, sizeof flag, "%s %s", o->name, metavar(o, mv, sizeof mv));
        fprintf(out, "  %-*s  ", width, flag);
        wrap(out, indent, indent, o->help);
        snprintf(what, sizeof what, "%s%s%s%s", allowed(o, al, sizeof al), o->required ? "; required" : "",
                 o->def ? "; default " : "", o->def ? o->def : "");
        fprintf(out, "%*s", indent, "");
        wrap(out, indent, indent, what);
    }
    if (cmd->n_opts > 0)
        fprintf(out, "\nA value follows its flag (--flag VALUE) or is joined to it (--flag=VALUE); '-' and '_' in a "
                     "flag's name are one.\n");
}

/* The option arg (--name or --name=value) names; -1 when none. '-' and '_' after the leading "--" are one. */
static int find(const struct ckpt_tool_cmd *cmd, const char *arg)
{
    size_t len = strcspn(arg, "=");
    for (int i = 0; i < cmd->n_opts; i++) {
        const char *name = cmd->opts[i].name;
        if (strlen(name) != len || strncmp(arg, name, 2) != 0)
            continue;
        size_t k = 2;
        while (k < len && (arg[k] == name[k] || (strchr("-_", arg[k]) && strchr("-_", name[k]))))
            k++;
        if (k == len)
            return i;
    }
    return -1;
}

/* An integer written as one (200) or as a number with an integral value (2e2, 200.0). */
static int parse_integer(const struct ckpt_opt *o, const char *v, long long *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    bool whole = *v && !*end && errno == 0;
    double d = (double)x;
    if (!whole) {
        errno = 0;
        d = strtod(v, &end);
        if (!*v || *end || isnan(d) || d != floor(d))
            return -1;
    }
    if (d < o->lo)
        return -1;
    if (d > o->hi || (!whole && d >= 0x1p63)) {
        if (!o->clamp)
            return -1;
        *out = (long long)o->hi;
        return 0;
    }
    *out = whole ? x : (long long)d;
    return 0;
}

static int parse_number(const struct ckpt_opt *o, const char *v, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (!*v || *end || errno || !isfinite(d) || d < o->lo || d > o->hi)
        return -1;
    *out = d;
    return 0;
}

static int parse_choice(const struct ckpt_opt *o, const char *v, int *out)
{
    for (const struct ckpt_choice *c = o->choices; c->name; c++)
        if (strcmp(v, c->name) == 0) {
            *out = c->value;
            return 0;
        }
    return -1;
}

static int apply(const struct ckpt_opt *o, const char *v, void *opts)
{
    void *field = (char *)opts + o->field;
    int rc = 0;
    switch (o->kind) {
    case CKPT_OPT_TEXT:
        *(const char **)field = v;
        break;
    case CKPT_OPT_INT:
        rc = parse_integer(o, v, field);
        break;
    case CKPT_OPT_NUMBER:
        rc = parse_number(o, v, field);
        break;
    case CKPT_OPT_CHOICE:
        rc = parse_choice(o, v, field);
        break;
    case CKPT_OPT_PARSE:
        rc = o->parse(v, field);
        break;
    }
    char al[256];
    if (rc != 0)
        return error_set(FSDP_EINVAL, "%s: '%s' is not %s", o->name, v, allowed(o, al, sizeof al));
    return 0;
}

static int unknown_flag(const struct ckpt_tool_cmd *cmd, const char *arg)
{
    if (cmd->n_opts == 0)
        return error_set(FSDP_EINVAL, "unknown flag '%s': fsdp-ckpt %s takes no flags (fsdp-ckpt %s --help)", arg,
                         cmd->name, cmd->name);
    char list[512] = "";
    for (int i = 0; i < cmd->n_opts; i++)
        add(list, sizeof list, "%s%s", i == 0 ? "" : i == cmd->n_opts - 1 ? " and " : ", ", cmd->opts[i].name);
    return error_set(FSDP_EINVAL, "unknown flag '%s'; its flags are %s (fsdp-ckpt %s --help)", arg, list, cmd->name);
}

int ckpt_tool_args_parse(const struct ckpt_tool_cmd *cmd, int argc, char **argv, void *opts)
{
    memcpy(opts, cmd->defaults, cmd->opts_size);
    bool seen[32] = {false};
    if (cmd->n_opts > (int)(sizeof seen / sizeof seen[0]))
        return error_set(FSDP_EINVAL, "internal: fsdp-ckpt %s has more than 32 flags", cmd->name);
    char usage[1024];
    synopsis(cmd, usage, sizeof usage);
    int n_args = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            if (n_args == cmd->n_args)
                return error_set(FSDP_EINVAL, "unexpected argument '%s'; usage: fsdp-ckpt %s", a, usage);
            *(const char **)((char *)opts + cmd->args[n_args++].field) = a;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            ckpt_tool_args_help(cmd, stdout);
            return 1;
        }
        int k = find(cmd, a);
        if (k < 0)
            return unknown_flag(cmd, a);
        const struct ckpt_opt *o = &cmd->opts[k];
        const char *eq = strchr(a, '=');
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        char al[256];
        if (!v)
            return error_set(FSDP_EINVAL, "%s needs a value (%s)", o->name, allowed(o, al, sizeof al));
        FSDP_TRY(apply(o, v, opts));
        seen[k] = true;
    }
    if (n_args < cmd->n_args)
        return error_set(FSDP_EINVAL, "missing %s (%s); usage: fsdp-ckpt %s", cmd->args[n_args].name,
                         cmd->args[n_args].help, usage);
    for (int k = 0; k < cmd->n_opts; k++)
        if (cmd->opts[k].required && !seen[k])
            return error_set(FSDP_EINVAL, "%s %s is required (%s); usage: fsdp-ckpt %s", cmd->opts[k].name,
                             cmd->opts[k].metavar, cmd->opts[k].help, usage);
    return 0;
}
