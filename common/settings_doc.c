/* The Markdown reference of the settings table. docs/environment.md is this output, and a test compares
 * them, so the reference cannot drift from the table. */
#include "common/settings.h"

#include <string.h>

#include "common/error.h"

static const char *type_name(enum setting_type t)
{
    switch (t) {
    case SETTING_BOOL: return "bool";
    case SETTING_INT: return "int";
    case SETTING_DOUBLE: return "number";
    case SETTING_STRING: return "string";
    case SETTING_ENUM: return "enum";
    }
    return "?";
}

/* Table cells must not contain '|'. */
static void cell(FILE *out, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '|')
            fputs("\\|", out);
        else
            fputc(*s, out);
    }
}

static void default_cell(FILE *out, const struct setting *s)
{
    if (s->def)
        fprintf(out, "`%s`", s->def);
    if (s->def && s->def_doc)
        fputs(": ", out);
    if (s->def_doc)
        cell(out, s->def_doc);
    if (!s->def && !s->def_doc)
        fputs("unset", out);
}

static void allowed_cell(FILE *out, const struct setting *s)
{
    switch (s->type) {
    case SETTING_BOOL: fputs("`1`, `0`", out); break;
    case SETTING_INT:
        if (s->max > s->min)
            fprintf(out, "%.0f to %.0f", s->min, s->max);
        else
            fprintf(out, ">= %.0f", s->min);
        break;
    case SETTING_DOUBLE:
        if (s->max > s->min)
            fprintf(out, "%g to %g", s->min, s->max);
        else
            fprintf(out, "%s %g", s->min_exclusive ? ">" : ">=", s->min);
        break;
    case SETTING_STRING: cell(out, s->format); break;
    case SETTING_ENUM:
        for (size_t i = 0; s->values[i].name; i++) {
            fprintf(out, "%s`%s`", i ? ", " : "", s->values[i].name);
            if (s->values[i].doc) {
                fputs(" (", out);
                cell(out, s->values[i].doc);
                fputs(")", out);
            }
        }
        for (size_t i = 0; s->aliases && s->aliases[i].from; i++)
            fprintf(out, "%s`%s` = `%s`%s", i ? ", " : " (also ", s->aliases[i].from, s->aliases[i].to,
                    s->aliases[i + 1].from ? "" : ")");
        break;
    }
}

static void readers_cell(FILE *out, unsigned readers)
{
    static const struct { unsigned bit; const char *name; } names[] = {
        {SETTING_BY_LAUNCH, "fsdp-launch"},
        {SETTING_BY_WORKER, "fsdp-worker"},
        {SETTING_BY_PREPARE_DATA, "fsdp-prepare-data"},
        {SETTING_BY_DEMO, "fsdp-rdzv-demo"},
        {SETTING_BY_COMM, "comm_create"},
        {SETTING_BY_TESTS, "tests"},
    };
    bool first = true;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (readers & names[i].bit) {
            fprintf(out, "%s%s", first ? "" : ", ", names[i].name);
            first = false;
        }
    }
}

static void section(FILE *out, const char *title, const char *intro, bool test_only, bool harness)
{
    fprintf(out, "\n## %s\n\n%s\n\n", title, intro);
    fputs("| variable | type | default | allowed | read by | description |\n", out);
    fputs("|---|---|---|---|---|---|\n", out);
    for (int i = 0; i < SETTING_COUNT; i++) {
        const struct setting *s = settings_entry((enum setting_id)i);
        if (s->test_only != test_only || (s->readers == SETTING_BY_TESTS) != harness)
            continue;
        fprintf(out, "| `%s` | %s | ", s->name, type_name(s->type));
        default_cell(out, s);
        fputs(" | ", out);
        allowed_cell(out, s);
        fputs(" | ", out);
        readers_cell(out, s->readers);
        fputs(" | ", out);
        cell(out, s->doc);
        if (s->launcher_sets)
            fputs(" fsdp-launch sets it for its workers.", out);
        fputs(" |\n", out);
    }
}

int settings_print_markdown(FILE *out)
{
    fputs("# Environment settings\n\n"
          "<!-- Generated from the settings table (common/settings_table.c) by `fsdp-worker --help-env=markdown`;\n"
          "     do not edit by hand. -->\n\n"
          "Every `FSDP_*` environment variable that fsdpc's programs, libraries and tests read. The programs\n"
          "and libraries read them only through common/settings.h, which checks each value against this\n"
          "table; a test fails when a source or a page of docs/ names an `FSDP_*` variable that is not in it.\n\n"
          "An empty value counts as unset, except for",
          out);
    const char *sep = " ";
    for (int i = 0; i < SETTING_COUNT; i++) {
        const struct setting *s = settings_entry((enum setting_id)i);
        if (s->empty_is_value) {
            fprintf(out, "%s`%s`", sep, s->name);
            sep = ", ";
        }
    }
    fputs(", where it is a value.\n"
          "Booleans accept `1`/`0`, `true`/`false`, `yes`/`no` and `on`/`off`; enum values ignore case.\n"
          "A value a setting does not allow is reported with the variable, the value and what is allowed:\n"
          "as an error where the description says so, otherwise as a warning (once per process), after\n"
          "which the default applies.\n\n"
          "*read by*: the programs; `comm_create` is the collectives library, for callers that leave the\n"
          "matching `struct comm_options` field unset (fsdp-worker sets the backend and the generation).\n"
          "The torchrun variables (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...) are in [launcher.md](launcher.md).\n",
          out);
    section(out, "Settings", "For runs.", false, false);
    section(out, "Test hooks",
            "Read by the programs, set by tests to reach a path or a failure that a run does not reach by "
            "itself;\nnot knobs for runs.",
            true, false);
    section(out, "Test suite",
            "Read by the tests and benchmarks only (`meson test` sets the first two).", true, true);
    if (fflush(out) != 0 || ferror(out))
        return error_set(FSDP_EIO, "cannot write the environment reference");
    return 0;
}
