/* --print-config: the effective values in INI form. The output is a valid input: loading it gives the
 * same config, and printing that again gives the same bytes (values are stored in canonical text). The
 * variant with origins adds a comment line above each value that is not the default. */
#include "common/config.h"

#include <string.h>

#include "common/error.h"

static int print_ini(const struct config *cfg, FILE *out, bool origins)
{
    const struct config_schema *schema = cfg->schema;
    fprintf(out, "# %s configuration: effective values (defaults, file, then command line)\n", schema->program);
    if (origins)
        fprintf(out, "# '; from X' above a value says where it came from; values without one are defaults\n");
    for (size_t s = 0; s < schema->n_sections; s++) {
        const char *section = schema->sections[s].name;
        fprintf(out, "\n[%s]\n", section);
        for (size_t i = 0; i < schema->n_keys; i++) {
            const struct config_key *key = &schema->keys[i];
            if (strcmp(key->section, section) != 0)
                continue;
            const struct config_value *v = &cfg->values[i];
            if (origins && v->source != CONFIG_SRC_DEFAULT)
                fprintf(out, "; from %s\n", v->origin ? v->origin : v->source == CONFIG_SRC_API ? "the program" : "?");
            if (v->text)
                fprintf(out, "%s = %s\n", key->name, v->text);
            else
                fprintf(out, "%s =\n", key->name);
        }
    }
    if (fflush(out) != 0 || ferror(out))
        return error_set(FSDP_EIO, "cannot write the config");
    return 0;
}

int config_print_ini(const struct config *cfg, FILE *out) { return print_ini(cfg, out, false); }

int config_print_ini_origins(const struct config *cfg, FILE *out) { return print_ini(cfg, out, true); }
