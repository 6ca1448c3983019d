/* The Markdown reference of a schema. docs/config.md is this output, and a test regenerates it, so the
 * reference cannot drift from the code. */
#include "common/config.h"

#include <string.h>

#include "common/error.h"

/* Table cells must not contain '|'; names go in backticks. */
static void cell(FILE *out, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '|')
            fputs("\\|", out);
        else
            fputc(*s, out);
    }
}

static void allowed_cell(FILE *out, const struct config_key *key)
{
    switch (key->type) {
    case CONFIG_INT:
        if (key->min < key->max)
            fprintf(out, "%.0f to %.0f", key->min, key->max);
        break;
    case CONFIG_FLOAT:
        if (key->min < key->max)
            fprintf(out, "%g to %g", key->min, key->max);
        break;
    case CONFIG_BOOL: fputs("true, false", out); break;
    case CONFIG_ENUM:
        for (size_t i = 0; key->values && key->values[i]; i++)
            fprintf(out, "%s`%s`", i ? ", " : "", key->values[i]);
        if (key->value_aliases && key->value_aliases[0].from) {
            fputs(" (also ", out);
            for (size_t i = 0; key->value_aliases[i].from; i++) {
                fprintf(out, "%s`", i ? ", " : "");
                cell(out, key->value_aliases[i].from);
                fprintf(out, "` = `%s`", key->value_aliases[i].to);
            }
            fputs(")", out);
        }
        break;
    default: break;
    }
}

int config_print_markdown(const struct config_schema *schema, FILE *out)
{
    fprintf(out, "# %s configuration reference\n\n", schema->program);
    fprintf(out, "<!-- Generated from the schema by `%s --help-config=markdown`; do not edit by hand. -->\n\n",
            schema->program);
    fprintf(out,
            "Configuration is an INI file read against the schema below; command-line options override it:\n"
            "`--section.key=value` or `--section.key value`, or a flat flag from the *flags* column\n"
            "(accelerate-style, e.g. `--fsdp_version=2`). A key name that exists in only one section may\n"
            "also be given without its section. Booleans given as a bare flag mean `true`.\n\n"
            "Spellings are normalised: names ignore case and treat `-` like `_`; enum values ignore case\n"
            "and accept the aliases listed; booleans accept true/false, 1/0, yes/no, on/off.\n"
            "Comments are lines starting with `;` or `#`, and a `;` after white space ends a value\n"
            "(`lr = 0.1 ; note`); a value that starts with `;` (`dir =; note`) is an empty one.\n"
            "An unknown section or key, a bad value, a duplicate key or a line longer than %d characters\n"
            "is an error naming the file and line. `--print-config` prints the effective configuration\n"
            "in INI form, which loads back unchanged, each value that is not a default under a `; from ...`\n"
            "line naming where it came from. `--log_level=debug|info|warn|error` sets the log level.\n\n"
            "Under fsdp-launch, settings from an accelerate config (`--config_file`) apply under the file and\n"
            "fsdp-launch's accelerate-style flags over it, before this program's own flags: YAML < INI <\n"
            "command line ([launcher.md](launcher.md#one-order-of-precedence)).\n",
            CONFIG_MAX_LINE);
    for (size_t s = 0; s < schema->n_sections; s++) {
        const char *section = schema->sections[s].name;
        fprintf(out, "\n## [%s]\n\n", section);
        if (schema->sections[s].help && *schema->sections[s].help)
            fprintf(out, "%s\n\n", schema->sections[s].help);
        fputs("| key | type | default | allowed | flags | description |\n", out);
        fputs("|---|---|---|---|---|---|\n", out);
        for (size_t i = 0; i < schema->n_keys; i++) {
            const struct config_key *key = &schema->keys[i];
            if (strcmp(key->section, section) != 0)
                continue;
            fprintf(out, "| `%s` | %s | ", key->name, config_type_name(key->type));
            if (key->def && *key->def) {
                fputc('`', out);
                cell(out, key->def);
                fputc('`', out);
            } else {
                fputs("unset", out);
            }
            fputs(" | ", out);
            allowed_cell(out, key);
            fputs(" | ", out);
            for (size_t f = 0; key->flags && key->flags[f]; f++)
                fprintf(out, "%s`--%s`", f ? ", " : "", key->flags[f]);
            fputs(" | ", out);
            cell(out, key->help);
            fputs(" |\n", out);
        }
    }
    if (fflush(out) != 0 || ferror(out))
        return error_set(FSDP_EIO, "cannot write the config reference");
    return 0;
}
