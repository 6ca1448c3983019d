/* --print-config: the effective values in INI form. The output is a valid input: loading it gives the
 * same config, and printing that again gives the same bytes (values are stored in canonical text). */
#include "common/config.h"

#include <string.h>

#include "common/error.h"

int config_print_ini(const struct config *cfg, FILE *out)
{
    const struct config_schema *schema = cfg->schema;
    fprintf(out, "# %s configuration: effective values (defaults, file, then command line)\n", schema->program);
    for (size_t s = 0; s < schema->n_sections; s++) {
        const char *section = schema->sections[s].name;
        fprintf(out, "\n[%s]\n", section);
        for (size_t i = 0; i < schema->n_keys; i++) {
            const struct config_key *key = &schema->keys[i];
            if (strcmp(key->section, section) != 0)
                continue;
            const char *text = cfg->values[i].text;
            if (text)
                fprintf(out, "%s = %s\n", key->name, text);
            else
                fprintf(out, "%s =\n", key->name);
        }
    }
    if (fflush(out) != 0 || ferror(out))
        return error_set(FSDP_EIO, "cannot write the config");
    return 0;
}
