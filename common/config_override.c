/* The command line: program flags every program shares and `--key=value` overrides, which are applied
 * after the file so that they win over it. */
#include "common/config.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"
#include "common/log.h"

static bool flag_is(const char *arg, const char *name, const char **value)
{
    /* Flags are compared like keys: --print-config and --print_config are the same flag. */
    char a[128], n[128];
    size_t len = strcspn(arg, "=");
    if (len >= sizeof a)
        return false;
    memcpy(a, arg, len);
    a[len] = '\0';
    config_normalize_name(a, a, sizeof a);
    config_normalize_name(n, name, sizeof n);
    if (strcmp(a, n) != 0)
        return false;
    *value = arg[len] == '=' ? arg + len + 1 : NULL;
    return true;
}

static int add_override(struct config_cli *cli, int k, const char *text)
{
    int *keys = realloc(cli->override_key, (size_t)(cli->n_overrides + 1) * sizeof *keys);
    if (keys)
        cli->override_key = keys;
    const char **texts = realloc(cli->override_text, (size_t)(cli->n_overrides + 1) * sizeof *texts);
    if (texts)
        cli->override_text = texts;
    if (!keys || !texts)
        return error_set(FSDP_ENOMEM, "out of memory parsing the command line");
    cli->override_key[cli->n_overrides] = k;
    cli->override_text[cli->n_overrides] = text;
    cli->n_overrides++;
    return 0;
}

static int unknown_flag(const struct config_schema *schema, const char *flag)
{
    char near[300], name[256];
    size_t len = strcspn(flag, "=");
    snprintf(name, sizeof name, "%.*s", (int)len, flag);
    const char *s = config_suggest_key(schema, name, near, sizeof near);
    if (s)
        return error_set(FSDP_EINVAL, "unknown option '--%s'; did you mean '--%s'?", name, s);
    return error_set(FSDP_EINVAL, "unknown option '--%s'; run %s --help for the options", name, schema->program);
}

/* A key flag without '=': the next argument is its value, except for flags that have a bare meaning
 * (booleans), which take the next argument only when it is a value of theirs. */
static int take_key_flag(const struct config_schema *schema, struct config_cli *cli, int k, const char *value,
                         int argc, char **argv, int *i)
{
    const struct config_key *key = &schema->keys[k];
    if (value)
        return add_override(cli, k, value);
    if (*i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0) {
        struct config_value probe;
        bool fits = config_value_parse(key, argv[*i + 1], &probe) == 0;
        if (fits)
            free(probe.text);
        if (!key->bare || fits) {
            (*i)++;
            return add_override(cli, k, argv[*i]);
        }
    }
    if (key->bare)
        return add_override(cli, k, key->bare);
    return error_set(FSDP_EINVAL, "option '%s' needs a value: %s=VALUE or %s VALUE", argv[*i], argv[*i], argv[*i]);
}

int config_cli_parse(const struct config_schema *schema, int argc, char **argv, struct config_cli *cli)
{
    memset(cli, 0, sizeof *cli);
    cli->positional = calloc((size_t)(argc > 0 ? argc : 1), sizeof *cli->positional);
    if (!cli->positional)
        return error_set(FSDP_ENOMEM, "out of memory parsing the command line");
    bool only_positional = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *value;
        if (only_positional || arg[0] != '-' || strcmp(arg, "-") == 0) {
            cli->positional[cli->n_positional++] = arg;
            continue;
        }
        if (strcmp(arg, "--") == 0) {
            only_positional = true;
            continue;
        }
        if (strcmp(arg, "-h") == 0 || flag_is(arg, "--help", &value)) {
            cli->help = true;
            continue;
        }
        if (flag_is(arg, "--print-config", &value)) {
            cli->print_config = true;
            continue;
        }
        if (flag_is(arg, "--help-config", &value)) {
            cli->help_config = value ? value : "markdown";
            continue;
        }
        if (flag_is(arg, "--help-env", &value)) {
            cli->help_env = value ? value : "markdown";
            continue;
        }
        if (flag_is(arg, "--log-level", &value)) {
            if (!value && i + 1 < argc)
                value = argv[++i];
            enum log_level level;
            if (!value || log_parse_level(value, &level) != 0)
                return error_set(FSDP_EINVAL, "--log_level=%s is not a level; use debug, info, warn or error",
                                 value ? value : "");
            log_set_level(level);
            continue;
        }
        const char *name = arg + (arg[1] == '-' ? 2 : 1);
        char key_name[256];
        size_t len = strcspn(name, "=");
        if (len >= sizeof key_name)
            return unknown_flag(schema, name);
        memcpy(key_name, name, len);
        key_name[len] = '\0';
        int k = config_find_key(schema, key_name);
        if (k < 0)
            return unknown_flag(schema, name);
        FSDP_TRY(take_key_flag(schema, cli, k, name[len] == '=' ? name + len + 1 : NULL, argc, argv, &i));
    }
    return 0;
}

int config_cli_apply(const struct config_cli *cli, struct config *cfg)
{
    for (int i = 0; i < cli->n_overrides; i++) {
        int k = cli->override_key[i];
        int rc = config_set_index_origin(cfg, k, cli->override_text[i], CONFIG_SRC_CLI, 0, "command line");
        if (rc) {
            char why[1024];
            snprintf(why, sizeof why, "%s", error_message());
            const struct config_key *key = &cfg->schema->keys[k];
            return error_set(rc, "command line: bad value for %s.%s: %s", key->section, key->name, why);
        }
    }
    return 0;
}

void config_cli_free(struct config_cli *cli)
{
    free(cli->positional);
    free(cli->override_key);
    free(cli->override_text);
    memset(cli, 0, sizeof *cli);
}
