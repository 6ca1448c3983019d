/* The FSDP_* settings table (common/settings.h): every entry is well formed, each type parses what it
 * allows and refuses the rest with a message naming the variable and what is allowed, reads that cannot
 * fail warn once and take the default, docs/environment.md is the table's reference, and no source, page
 * of docs/ or script names an FSDP_* variable the table lacks (nor reads one past the accessors). */
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "common/settings.h"

static const char *name_of(enum setting_id id) { return settings_entry(id)->name; }

/* --- the table ----------------------------------------------------------------------------------- */

Test(settings, every_entry_is_well_formed)
{
    for (int i = 0; i < SETTING_COUNT; i++) {
        const struct setting *s = settings_entry((enum setting_id)i);
        cr_assert_not_null(s);
        cr_assert_eq(s->id, i, "entry %d has id %d: the table and enum setting_id are out of order", i, s->id);
        cr_assert(s->name && strncmp(s->name, "FSDP_", 5) == 0 && strlen(s->name) > 5, "entry %d: %s", i, s->name);
        for (const char *c = s->name; *c; c++)
            cr_assert(isupper((unsigned char)*c) || isdigit((unsigned char)*c) || *c == '_', "%s", s->name);
        cr_assert_eq(settings_find(s->name), s, "%s is found as another entry", s->name);
        cr_assert(s->doc && *s->doc && !strchr(s->doc, '\n'), "%s: one line of doc", s->name);
        cr_assert_neq(s->readers, 0u, "%s: nobody reads it", s->name);
        cr_assert(s->readers != SETTING_BY_TESTS || s->test_only, "%s: read by tests only, so a test hook",
                  s->name);
        cr_assert(s->def || s->def_doc, "%s: say what unset means", s->name);
        if (s->type == SETTING_STRING)
            cr_assert(s->format && *s->format, "%s: a string says what it holds", s->name);
        if (s->type == SETTING_ENUM) {
            cr_assert(s->values && s->values[0].name, "%s: an enum without values", s->name);
            for (const struct setting_alias *a = s->aliases; a && a->from; a++) {
                bool found = false;
                for (int v = 0; s->values[v].name; v++)
                    found |= strcmp(s->values[v].name, a->to) == 0;
                cr_assert(found, "%s: alias %s names no value", s->name, a->from);
            }
        }
        /* The default is a value the entry allows: read with the variable unset, it parses. */
        unsetenv(s->name);
        bool b;
        long n;
        double d;
        int e;
        int rc = 0;
        switch (s->type) {
        case SETTING_BOOL: rc = settings_get_bool(s->id, &b); break;
        case SETTING_INT: rc = settings_get_int(s->id, &n); break;
        case SETTING_DOUBLE: rc = settings_get_double(s->id, &d); break;
        case SETTING_ENUM: rc = settings_get_enum(s->id, &e); break;
        case SETTING_STRING: break;
        }
        cr_assert_eq(rc, 0, "%s: %s", s->name, error_message());
        if (s->def && s->type != SETTING_STRING) {
            setenv(s->name, s->def, 1);
            switch (s->type) {
            case SETTING_BOOL: rc = settings_get_bool(s->id, &b); break;
            case SETTING_INT: rc = settings_get_int(s->id, &n); break;
            case SETTING_DOUBLE: rc = settings_get_double(s->id, &d); break;
            case SETTING_ENUM: rc = settings_get_enum(s->id, &e); break;
            case SETTING_STRING: break;
            }
            cr_assert_eq(rc, 0, "%s: its default %s is not allowed: %s", s->name, s->def, error_message());
            unsetenv(s->name);
        }
        for (int j = 0; j < i; j++)
            cr_assert_str_neq(settings_entry((enum setting_id)j)->name, s->name, "%s twice", s->name);
    }
    cr_assert_null(settings_find("FSDP"));
    cr_assert_null(settings_entry(SETTING_COUNT));
}

Test(settings, test_hooks_are_marked)
{
    cr_assert(settings_entry(SETTING_FAULT_KILL)->test_only);
    cr_assert(settings_entry(SETTING_TEST_OFFLOAD)->test_only);
    cr_assert(settings_entry(SETTING_COMM_HOST_ID)->test_only);
    cr_assert_not(settings_entry(SETTING_COMM_TIMEOUT_S)->test_only);
    cr_assert_not(settings_entry(SETTING_LOG_LEVEL)->test_only);
}

/* --- typed reads ----------------------------------------------------------------------------------- */

Test(settings, bool_spellings_and_a_bad_value)
{
    const char *on[] = {"1", "true", "YES", "On"}, *off[] = {"0", "False", "no", "OFF"};
    bool v;
    for (size_t i = 0; i < 4; i++) {
        setenv(name_of(SETTING_COMM_FORCE_TCP), on[i], 1);
        cr_assert_eq(settings_get_bool(SETTING_COMM_FORCE_TCP, &v), 0, "%s", on[i]);
        cr_assert(v, "%s", on[i]);
        setenv(name_of(SETTING_COMM_FORCE_TCP), off[i], 1);
        cr_assert_eq(settings_get_bool(SETTING_COMM_FORCE_TCP, &v), 0, "%s", off[i]);
        cr_assert_not(v, "%s", off[i]);
    }
    setenv(name_of(SETTING_COMM_SHM_DIRECT), "", 1);
    cr_assert_eq(settings_get_bool(SETTING_COMM_SHM_DIRECT, &v), 0);
    cr_assert(v, "empty is unset: the default, 1");
    setenv(name_of(SETTING_COMM_SHM_DIRECT), "maybe", 1);
    v = false;
    cr_assert_eq(settings_get_bool(SETTING_COMM_SHM_DIRECT, &v), FSDP_EINVAL);
    cr_assert(v, "a bad value leaves the default");
    cr_assert_str_eq(error_message(),
                     "FSDP_COMM_SHM_DIRECT=maybe is not a boolean: use 1 or 0 (also true/false, yes/no, on/off)");
}

Test(settings, int_range_and_defaults)
{
    long v = 0;
    cr_assert_eq(settings_get_int(SETTING_COMM_SHM_SLOT_KIB, &v), 0);
    cr_assert_eq(v, 1024);
    setenv(name_of(SETTING_COMM_SHM_SLOT_KIB), "2048", 1);
    cr_assert_eq(settings_get_int(SETTING_COMM_SHM_SLOT_KIB, &v), 0);
    cr_assert_eq(v, 2048);
    const char *bad[] = {"63", "12x", "0x40", "4194305", "99999999999999999999999", " "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv(name_of(SETTING_COMM_SHM_SLOT_KIB), bad[i], 1);
        v = 0;
        cr_assert_eq(settings_get_int(SETTING_COMM_SHM_SLOT_KIB, &v), FSDP_EINVAL, "%s", bad[i]);
        cr_assert_eq(v, 1024, "%s", bad[i]);
        cr_assert(strstr(error_message(), "is not an integer from 64 to 4194304"), "%s", error_message());
    }
    /* No default in the table: the caller's value stands when unset, and when the value is bad. */
    unsetenv(name_of(SETTING_STORE_PORT));
    v = 29501;
    cr_assert_eq(settings_get_int(SETTING_STORE_PORT, &v), 0);
    cr_assert_eq(v, 29501);
    setenv(name_of(SETTING_STORE_PORT), "65536", 1);
    cr_assert_eq(settings_get_int(SETTING_STORE_PORT, &v), FSDP_EINVAL);
    cr_assert_eq(v, 29501);
    cr_assert_str_eq(error_message(), "FSDP_STORE_PORT=65536 is not an integer from 1 to 65535");
    setenv(name_of(SETTING_STORE_PORT), "40000", 1);
    cr_assert_eq(settings_get_int(SETTING_STORE_PORT, &v), 0);
    cr_assert_eq(v, 40000);
}

Test(settings, double_must_be_finite_and_in_range)
{
    double v = 0;
    cr_assert_eq(settings_get_double(SETTING_COMM_TIMEOUT_S, &v), 0);
    cr_assert_float_eq(v, 600.0, 0);
    setenv(name_of(SETTING_COMM_TIMEOUT_S), "2.5", 1);
    cr_assert_eq(settings_get_double(SETTING_COMM_TIMEOUT_S, &v), 0);
    cr_assert_float_eq(v, 2.5, 0);
    const char *bad[] = {"0", "-1", "nan", "inf", "1e999", "5s"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv(name_of(SETTING_COMM_TIMEOUT_S), bad[i], 1);
        cr_assert_eq(settings_get_double(SETTING_COMM_TIMEOUT_S, &v), FSDP_EINVAL, "%s", bad[i]);
        cr_assert_float_eq(v, 600.0, 0, "%s", bad[i]);
        cr_assert(strstr(error_message(), "is not a number > 0"), "%s", error_message());
    }
}

Test(settings, enum_values_aliases_and_case)
{
    int v = -1;
    cr_assert_eq(settings_get_enum(SETTING_LOG_LEVEL, &v), 0);
    cr_assert_str_eq(settings_entry(SETTING_LOG_LEVEL)->values[v].name, "info");
    setenv(name_of(SETTING_LOG_LEVEL), "WARNING", 1);
    cr_assert_eq(settings_get_enum(SETTING_LOG_LEVEL, &v), 0);
    cr_assert_str_eq(settings_entry(SETTING_LOG_LEVEL)->values[v].name, "warn");
    setenv(name_of(SETTING_LOG_LEVEL), "Error", 1);
    cr_assert_eq(settings_get_enum(SETTING_LOG_LEVEL, &v), 0);
    cr_assert_str_eq(settings_entry(SETTING_LOG_LEVEL)->values[v].name, "error");
    setenv(name_of(SETTING_LOG_LEVEL), "verbose", 1);
    cr_assert_eq(settings_get_enum(SETTING_LOG_LEVEL, &v), FSDP_EINVAL);
    cr_assert_str_eq(error_message(), "FSDP_LOG_LEVEL=verbose: allowed are debug, info (the default), warn, error and off");
    setenv(name_of(SETTING_COMM_SHM_KEEP_PEER_PAGES), "sometimes", 1);
    cr_assert_eq(settings_get_enum(SETTING_COMM_SHM_KEEP_PEER_PAGES, &v), FSDP_EINVAL);
    cr_assert_eq(v, 0, "the default, last");
    cr_assert_str_eq(error_message(),
                     "FSDP_COMM_SHM_KEEP_PEER_PAGES=sometimes: allowed are last (the default: the pages the latest "
                     "operation read), 0 (none: every read faults them in) and 1 (all ever read; RSS counts them)");
}

Test(settings, strings_and_empty_values)
{
    setenv(name_of(SETTING_GPU_MODULE), "", 1);
    cr_assert_null(settings_get_string(SETTING_GPU_MODULE), "an empty path is unset");
    setenv(name_of(SETTING_GPU_MODULE), "/x/libfsdp_gpu.so", 1);
    cr_assert_str_eq(settings_get_string(SETTING_GPU_MODULE), "/x/libfsdp_gpu.so");
    unsetenv(name_of(SETTING_RDZV_TOKEN));
    cr_assert_null(settings_get_raw(SETTING_RDZV_TOKEN));
    setenv(name_of(SETTING_RDZV_TOKEN), "", 1);
    cr_assert_str_eq(settings_get_raw(SETTING_RDZV_TOKEN), "", "an empty token is a token");
    setenv(name_of(SETTING_STORE_PREFIX), "", 1);
    cr_assert_str_eq(settings_get_string(SETTING_STORE_PREFIX), "");
}

Test(settings, reading_as_another_type_is_an_error)
{
    bool b;
    cr_assert_eq(settings_get_bool(SETTING_COMM_TIMEOUT_S, &b), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "FSDP_COMM_TIMEOUT_S"), "%s", error_message());
}

/* --- reads that cannot fail, and the log level ------------------------------------------------------ */

static char *stderr_of(void (*fn)(void))
{
    char path[] = "/tmp/fsdp_settingsXXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    static char buf[8192];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    buf[n < 0 ? 0 : n] = '\0';
    close(fd);
    unlink(path);
    return buf;
}

static double got_timeouts[2];
static long got_slot;

static void read_bad_values_twice(void)
{
    setenv(name_of(SETTING_COMM_TIMEOUT_S), "soon", 1);
    setenv(name_of(SETTING_COMM_SHM_SLOT_KIB), "32", 1);
    got_timeouts[0] = settings_double(SETTING_COMM_TIMEOUT_S);
    got_timeouts[1] = settings_double(SETTING_COMM_TIMEOUT_S);
    got_slot = settings_int(SETTING_COMM_SHM_SLOT_KIB);
}

Test(settings, a_bad_value_warns_once_and_gives_the_default)
{
    char *err = stderr_of(read_bad_values_twice);
    cr_assert_float_eq(got_timeouts[0], 600.0, 0);
    cr_assert_float_eq(got_timeouts[1], 600.0, 0);
    cr_assert_eq(got_slot, 1024);
    const char *w = strstr(err, "FSDP_COMM_TIMEOUT_S=soon is not a number > 0; using the default, 600");
    cr_assert(w, "%s", err);
    cr_assert_null(strstr(w + 1, "FSDP_COMM_TIMEOUT_S=soon"), "warned twice:\n%s", err);
    cr_assert(strstr(err, "FSDP_COMM_SHM_SLOT_KIB=32 is not an integer from 64 to 4194304; using the default, 1024"),
              "%s", err);
}

static void init_with_bad_level(void)
{
    setenv(name_of(SETTING_LOG_LEVEL), "loud", 1);
    log_init("t");
}

Test(settings, a_bad_log_level_warns_and_keeps_info)
{
    char *err = stderr_of(init_with_bad_level);
    cr_assert(strstr(err, "FSDP_LOG_LEVEL=loud: allowed are debug"), "%s", err);
    cr_assert_eq(log_get_level(), LOG_INFO);
    setenv(name_of(SETTING_LOG_LEVEL), "warning", 1);
    log_init("t");
    cr_assert_eq(log_get_level(), LOG_WARN);
}

/* --- docs/environment.md --------------------------------------------------------------------------- */

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
            }
            buf = bigger;
        }
    }
    fclose(f);
    if (buf)
        buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

static const char *source_root(void)
{
    const char *src = getenv("FSDP_SOURCE_ROOT");
    cr_assert(src && *src, "FSDP_SOURCE_ROOT is not set: run the test through meson test");
    return src;
}

Test(settings, docs_environment_md_is_generated_from_the_table)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/environment.md", source_root());
    char *doc = slurp(path, NULL);
    cr_assert_not_null(doc, "cannot read %s", path);
    char *gen = NULL;
    size_t gen_len = 0;
    FILE *out = open_memstream(&gen, &gen_len);
    cr_assert_eq(settings_print_markdown(out), 0, "%s", error_message());
    fclose(out);
    cr_assert_str_eq(doc, gen, "docs/environment.md is stale: regenerate it with `ninja -C BUILD env-docs`");
    snprintf(path, sizeof path, "%s/README.md", source_root());
    char *readme = slurp(path, NULL);
    cr_assert(readme && strstr(readme, "(docs/environment.md)"), "README.md's docs list does not link it");
    free(readme);
    free(doc);
    free(gen);
}

/* --- the sources, docs and scripts against the table ---------------------------------------------- */

struct scan {
    char *code_names[512]; /* FSDP_* identifiers of C code (error codes, guards, macros): not settings */
    int n_code_names;
    bool id_used[SETTING_COUNT];    /* SETTING_<X> in code outside common/settings* and tests/ */
    bool named_by_tests[SETTING_COUNT]; /* the name in a string of tests/ or a meson.build */
    char report[16384];
    size_t used;
    int problems;
};

static void problem(struct scan *sc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(struct scan *sc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (sc->used < sizeof sc->report - 1) {
        int n = vsnprintf(sc->report + sc->used, sizeof sc->report - sc->used, fmt, ap);
        sc->used += n > 0 ? (size_t)n : 0;
        if (sc->used > sizeof sc->report - 1)
            sc->used = sizeof sc->report - 1;
    }
    va_end(ap);
    sc->problems++;
}

static bool is_word(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* Calls fn for each FSDP_<X> word of text[0..len); a word with nothing after FSDP_ is a prefix, not a name. */
static void each_fsdp_word(const char *text, size_t len, void (*fn)(struct scan *, const char *, void *),
                           struct scan *sc, void *arg)
{
    for (size_t i = 0; i + 5 < len; i++) {
        if (memcmp(text + i, "FSDP_", 5) != 0 || (i > 0 && is_word(text[i - 1])))
            continue;
        size_t j = i + 5;
        while (j < len && (isupper((unsigned char)text[j]) || isdigit((unsigned char)text[j]) || text[j] == '_'))
            j++;
        if (j > i + 5 && !(j < len && is_word(text[j]))) {
            char word[128];
            snprintf(word, sizeof word, "%.*s", (int)(j - i), text + i);
            fn(sc, word, arg);
        }
        i = j;
    }
}

struct where {
    const char *file;
    int line;
    bool in_tests;
    bool getenv_arg; /* the string is getenv's argument, outside tests/ and common/settings* */
    size_t offset;   /* of the word being checked, to tell a string that starts with it */
};

static void check_string_word(struct scan *sc, const char *word, void *arg)
{
    struct where *w = arg;
    const struct setting *s = settings_find(word);
    if (!s)
        problem(sc, "%s:%d: \"%s\" is no setting of common/settings_table.c\n", w->file, w->line, word);
    else if (w->in_tests)
        sc->named_by_tests[s->id] = true;
    if (s && w->getenv_arg)
        problem(sc, "%s:%d: reads %s with getenv: read it through common/settings.h\n", w->file, w->line, word);
    w->getenv_arg = false;
}

static void note_code_name(struct scan *sc, const char *name)
{
    for (int i = 0; i < sc->n_code_names; i++)
        if (strcmp(sc->code_names[i], name) == 0)
            return;
    if (sc->n_code_names < (int)(sizeof sc->code_names / sizeof sc->code_names[0]))
        sc->code_names[sc->n_code_names++] = strdup(name);
}

/* A small C lexer: comments are skipped, string literals are checked word by word, identifiers are
 * collected, and getenv( or secure_getenv( followed by a literal is a direct read. */
static void scan_c(struct scan *sc, const char *rel, const char *p)
{
    bool in_tests = strncmp(rel, "tests/", 6) == 0;
    bool settings_file = strncmp(rel, "common/settings", 15) == 0;
    enum { NONE, GETENV, GETENV_PAREN } call = NONE;
    int line = 1;
    while (*p) {
        if (*p == '\n') {
            line++;
            p++;
        } else if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n')
                p++;
        } else if (p[0] == '/' && p[1] == '*') {
            for (p += 2; *p && !(p[0] == '*' && p[1] == '/'); p++)
                line += *p == '\n';
            p += *p ? 2 : 0;
        } else if (*p == '"' || *p == '\'') {
            char quote = *p++;
            const char *start = p;
            int start_line = line;
            for (; *p && *p != quote; p++) {
                if (*p == '\\' && p[1])
                    p++;
                line += *p == '\n';
            }
            if (quote == '"') {
                struct where w = {.file = rel, .line = start_line, .in_tests = in_tests,
                                  .getenv_arg = call == GETENV_PAREN && !in_tests && !settings_file &&
                                                strncmp(start, "FSDP_", 5) == 0};
                each_fsdp_word(start, (size_t)(p - start), check_string_word, sc, &w);
            }
            p += *p ? 1 : 0;
            call = NONE;
        } else if (isalpha((unsigned char)*p) || *p == '_') {
            const char *start = p;
            while (is_word(*p))
                p++;
            char word[128];
            snprintf(word, sizeof word, "%.*s", (int)(p - start), start);
            if (strncmp(word, "FSDP_", 5) == 0)
                note_code_name(sc, word);
            if (strncmp(word, "SETTING_", 8) == 0 && !in_tests && !settings_file) {
                char name[140];
                snprintf(name, sizeof name, "FSDP_%s", word + 8);
                const struct setting *s = settings_find(name);
                if (s)
                    sc->id_used[s->id] = true;
            }
            call = strcmp(word, "getenv") == 0 || strcmp(word, "secure_getenv") == 0 ? GETENV : NONE;
        } else if (isdigit((unsigned char)*p)) {
            while (is_word(*p) || *p == '.')
                p++;
            call = NONE;
        } else {
            if (*p == '(' && call == GETENV)
                call = GETENV_PAREN;
            else if (!isspace((unsigned char)*p))
                call = NONE;
            p++;
        }
    }
}

struct doc_where {
    const char *file;
    int line;
    bool code_names_count; /* docs may name C identifiers (error codes) too */
};

static void check_doc_word(struct scan *sc, const char *word, void *arg)
{
    struct doc_where *w = arg;
    if (settings_find(word))
        return;
    for (int i = 0; w->code_names_count && i < sc->n_code_names; i++)
        if (strcmp(sc->code_names[i], word) == 0)
            return;
    problem(sc, "%s:%d: %s is no setting of common/settings_table.c%s\n", w->file, w->line, word,
            w->code_names_count ? " nor a name in the C sources" : "");
}

/* Markdown and shell: every FSDP_ word, line by line. */
static void scan_text(struct scan *sc, const char *rel, const char *text, bool code_names_count)
{
    int line = 1;
    for (const char *p = text; *p; line++) {
        size_t len = strcspn(p, "\n");
        struct doc_where w = {.file = rel, .line = line, .code_names_count = code_names_count};
        each_fsdp_word(p, len, check_doc_word, sc, &w);
        p += len + (p[len] == '\n');
    }
}

/* meson.build: a whole single-quoted 'FSDP_X' names an environment variable (env.set('FSDP_X', ...)). */
static void scan_meson(struct scan *sc, const char *rel, const char *text)
{
    int line = 1;
    for (const char *p = text; *p; p++) {
        line += *p == '\n';
        if (*p != '\'' || strncmp(p + 1, "FSDP_", 5) != 0)
            continue;
        size_t n = strspn(p + 1, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
        if (p[1 + n] != '\'')
            continue;
        char word[128];
        snprintf(word, sizeof word, "%.*s", (int)n, p + 1);
        const struct setting *s = settings_find(word);
        if (!s)
            problem(sc, "%s:%d: '%s' is no setting of common/settings_table.c\n", rel, line, word);
        else
            sc->named_by_tests[s->id] = true;
        p += n + 1;
    }
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

enum pass { PASS_CODE, PASS_TEXT };

/* Walks the tree below root (hidden entries and meson build directories skipped). The C pass comes
 * first so that the docs pass knows the code's own FSDP_ names. */
static void walk(struct scan *sc, const char *root, const char *rel, enum pass pass)
{
    char dir[2048];
    snprintf(dir, sizeof dir, "%s%s%s", root, *rel ? "/" : "", rel);
    char probe[2100];
    snprintf(probe, sizeof probe, "%s/meson-private", dir);
    struct stat st;
    if (stat(probe, &st) == 0)
        return;
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s", dir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char child_rel[1024], path[3100];
        snprintf(child_rel, sizeof child_rel, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        snprintf(path, sizeof path, "%s/%s", root, child_rel);
        if (stat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            walk(sc, root, child_rel, pass);
            continue;
        }
        bool c_like = ends_with(e->d_name, ".c") || ends_with(e->d_name, ".h") || ends_with(e->d_name, ".cu");
        bool meson = strcmp(e->d_name, "meson.build") == 0;
        bool doc = ends_with(e->d_name, ".md");
        bool shell = ends_with(e->d_name, ".sh") || ends_with(e->d_name, ".sbatch");
        if (pass == PASS_CODE ? !(c_like || meson) : !(doc || shell))
            continue;
        char *text = slurp(path, NULL);
        cr_assert_not_null(text, "cannot read %s", path);
        if (c_like)
            scan_c(sc, child_rel, text);
        else if (meson)
            scan_meson(sc, child_rel, text);
        else
            scan_text(sc, child_rel, text, doc);
        free(text);
    }
    closedir(d);
}

static struct scan *scan_tree(const char *root)
{
    struct scan *sc = calloc(1, sizeof *sc);
    cr_assert_not_null(sc);
    walk(sc, root, "", PASS_CODE);
    walk(sc, root, "", PASS_TEXT);
    return sc;
}

static void scan_free(struct scan *sc)
{
    for (int i = 0; i < sc->n_code_names; i++)
        free(sc->code_names[i]);
    free(sc);
}

Test(settings, sources_docs_and_scripts_name_only_settings, .timeout = 60)
{
    struct scan *sc = scan_tree(source_root());
    cr_assert_gt(sc->n_code_names, 5, "the C sources were not found under %s", source_root());
    cr_assert_eq(sc->problems, 0, "%d places disagree with common/settings_table.c:\n%s", sc->problems, sc->report);
    /* No stale entries: a setting for the programs is read through its id, a test hook's name is set by a
     * test, and the suite's own variables are named in tests/ or a meson.build. */
    for (int i = 0; i < SETTING_COUNT; i++) {
        const struct setting *s = settings_entry((enum setting_id)i);
        if (s->readers != SETTING_BY_TESTS)
            cr_expect(sc->id_used[i], "%s: no source outside tests/ reads SETTING_%s", s->name, s->name + 5);
        if (s->test_only)
            cr_expect(sc->named_by_tests[i], "%s is a test hook that no test sets", s->name);
    }
    scan_free(sc);
}

static void put_file(const char *root, const char *rel, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    mkdir(path, 0700);
    *slash = '/';
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

/* The scan itself finds what it is meant to: a name missing from the table in a string, a direct read,
 * a doc naming a missing variable, a meson env name; and lets comments, C identifiers and settings be. */
Test(settings, the_scan_finds_names_outside_the_table)
{
    char root[] = "/tmp/fsdp_scanXXXXXX";
    cr_assert_not_null(mkdtemp(root));
    /* Names outside the table are put together at run time: as literals here, the scan of this very file
     * would find them. */
    char bogus[64], einval[64], text[1024];
    snprintf(bogus, sizeof bogus, "%s_%s", "FSDP", "NO_SUCH_SETTING");
    snprintf(einval, sizeof einval, "%s_%s", "FSDP", "EINVAL");
    snprintf(text, sizeof text,
             "/* %s in a comment is fine */\n"
             "int f(void) { return %s; }\n"
             "const char *a = getenv(\"%s\");\n"
             "const char *b = getenv ( \"%s\" );\n"
             "const char *c = \"%s=1\";\n"
             "const char d = '\"';\n",
             bogus, einval, name_of(SETTING_COMM_FORCE_TCP), bogus, name_of(SETTING_RUN_ID));
    put_file(root, "comm/x.c", text);
    snprintf(text, sizeof text, "const char *t = getenv(\"%s\");\n", name_of(SETTING_COMM_FORCE_TCP));
    put_file(root, "tests/t.c", text);
    snprintf(text, sizeof text, "`%s`, `%s=1` and `%s`\n", einval, name_of(SETTING_RUN_ID), bogus);
    put_file(root, "docs/x.md", text);
    snprintf(text, sizeof text, "env.set('%s', '1')\nargs = ['-DFSDP_X=1']\n", bogus);
    put_file(root, "tests/meson.build", text);
    struct scan *sc = scan_tree(root);
    char want[4][128];
    snprintf(want[0], sizeof want[0], "comm/x.c:3: reads %s with getenv", name_of(SETTING_COMM_FORCE_TCP));
    snprintf(want[1], sizeof want[1], "comm/x.c:4: \"%s\" is no setting", bogus);
    snprintf(want[2], sizeof want[2], "docs/x.md:1: %s is no setting", bogus);
    snprintf(want[3], sizeof want[3], "tests/meson.build:1: '%s' is no setting", bogus);
    for (size_t i = 0; i < 4; i++)
        cr_expect(strstr(sc->report, want[i]), "missing \"%s\" in:\n%s", want[i], sc->report);
    cr_expect_eq(sc->problems, 4, "%s", sc->report);
    scan_free(sc);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    cr_assert_eq(system(cmd), 0);
}
