/* Settings a launcher hands down to the program it starts (FSDP_LAUNCH_CONFIG): fsdp-launch translates an
 * accelerate YAML and its own accelerate-style flags into "section.key" values and passes them in one JSON
 * text, in two layers, so that the program applies the YAML under its INI file and the launcher's command
 * line over it. */
#include "common/config.h"

#include <cjson/cJSON.h>
#include <string.h>

#include "common/error.h"

int config_apply_launch(struct config *cfg, const char *json, enum config_launch_layer layer)
{
    if (!json || !*json)
        return 0;
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return error_set(FSDP_EINVAL, "FSDP_LAUNCH_CONFIG is not a JSON object (it is written by fsdp-launch; "
                         "unset it when starting the program by hand)");
    }
    const char *name = layer == CONFIG_LAUNCH_UNDER_FILE ? "under_file" : "over_file";
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, name);
    int rc = 0;
    if (list && !cJSON_IsArray(list))
        rc = error_set(FSDP_EINVAL, "FSDP_LAUNCH_CONFIG: \"%s\" must be a list", name);
    const cJSON *e;
    cJSON_ArrayForEach(e, list)
    {
        if (rc)
            break;
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(e, "key");
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, "value");
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(e, "origin");
        if (!cJSON_IsString(k) || !cJSON_IsString(v)) {
            rc = error_set(FSDP_EINVAL, "FSDP_LAUNCH_CONFIG: every entry of \"%s\" needs string \"key\" and \"value\"",
                           name);
            break;
        }
        const char *origin = cJSON_IsString(o) ? o->valuestring : "the launcher";
        int idx = config_find_key(cfg->schema, k->valuestring);
        if (idx < 0) {
            rc = error_set(FSDP_EINVAL, "%s: %s has no key '%s' (the launcher passed it in FSDP_LAUNCH_CONFIG)",
                           origin, cfg->schema->program, k->valuestring);
            break;
        }
        rc = config_set_index_origin(cfg, idx, v->valuestring, CONFIG_SRC_LAUNCH, 0, origin);
        if (rc) {
            char why[1024];
            snprintf(why, sizeof why, "%s", error_message());
            const struct config_key *key = &cfg->schema->keys[idx];
            rc = error_set(rc, "%s: bad value for %s.%s: %s", origin, key->section, key->name, why);
        }
    }
    cJSON_Delete(root);
    return rc;
}
