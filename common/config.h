/* Typed configuration read against a declared schema: INI files (inih), command-line overrides that win
 * over the file, printing in INI form that loads back unchanged, and reference docs generated from the
 * same schema. A program declares its keys once (struct config_schema) and everything else -- parsing,
 * spelling normalisation, range and enum checks, error messages with suggestions, docs -- follows. */
#ifndef FSDP_COMMON_CONFIG_H
#define FSDP_COMMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Debian's inih 55 cuts lines at ~197 characters and parses the rest as a new line; we refuse longer
 * lines ourselves so that a cut value can never be used silently. */
#define CONFIG_MAX_LINE 190
/* A config file is a regular file of at most this many bytes (a device or FIFO would read forever). */
#define CONFIG_MAX_FILE_BYTES (1 << 20)
/* Longest value text (a value must fit on one line together with its key). */
#define CONFIG_MAX_VALUE 180

enum config_type {
    CONFIG_INT,    /* 64-bit signed integer, optional inclusive range [min, max] */
    CONFIG_FLOAT,  /* double, optional inclusive range [min, max] */
    CONFIG_BOOL,   /* true/false/1/0/yes/no/on/off, printed as true/false */
    CONFIG_STRING, /* free text; empty = unset */
    CONFIG_ENUM,   /* one of values[] (case and '-'/'_' insensitive, or an alias) */
    CONFIG_PATH,   /* file-system path, not checked for existence here; empty = unset */
};

/* Another spelling of an enum value, e.g. {"sharded", "SHARDED_STATE_DICT"} or {"1", "FULL_SHARD"}. */
struct config_alias {
    const char *from;
    const char *to;
};

struct config_key {
    const char *section;
    const char *name;
    enum config_type type;
    const char *def;                          /* default in value syntax; NULL or "" = unset */
    double min, max;                          /* INT/FLOAT range, used only when min < max */
    const char *const *values;                /* ENUM: canonical values, NULL-terminated */
    const struct config_alias *value_aliases; /* ENUM: other spellings, {NULL, NULL}-terminated */
    const char *const *flags;                 /* flat command-line names (accelerate style), NULL-terminated */
    const char *bare;                         /* value meant by a flag given without a value ("true" for BOOL) */
    const char *help;                         /* one line */
};

struct config_section {
    const char *name;
    const char *help;
};

struct config_schema {
    const char *program;
    const struct config_section *sections;
    size_t n_sections;
    const struct config_key *keys;
    size_t n_keys;
};

/* Where a value came from, for error messages about conflicts and for --print-config debugging. */
/* CONFIG_SRC_LAUNCH: given by the launcher (an accelerate YAML or fsdp-launch's own flags, passed in
 * FSDP_LAUNCH_CONFIG; see config_apply_launch). */
enum config_source { CONFIG_SRC_DEFAULT = 0, CONFIG_SRC_FILE, CONFIG_SRC_CLI, CONFIG_SRC_API, CONFIG_SRC_LAUNCH };

struct config_value {
    char *text; /* canonical text (what --print-config writes); NULL = unset */
    union {
        long long i;
        double f;
        bool b;
        int e; /* index into values[] */
    } v;
    enum config_source source;
    int line;     /* CONFIG_SRC_FILE: 1-based line of the file */
    char *origin; /* where the value came from in words ("run.ini:3", "command line"); NULL = default */
};

struct config {
    const struct config_schema *schema;
    struct config_value *values; /* one per schema key, same order */
    char *file;                  /* last file loaded, for messages */
};

/* --- config.c: lifetime, lookup, typed access ------------------------------------------------------- */

/* Creates a config holding every key's default; fails (FSDP_EINVAL) if a default violates its own key. */
int config_create(const struct config_schema *schema, struct config **out);
void config_destroy(struct config *cfg);
/* Index of the key "section.key" or of a flat flag name, after normalising case and '-'/'_'; -1 if none. */
int config_find_key(const struct config_schema *schema, const char *name);
int config_find_section(const struct config_schema *schema, const char *name);
/* Parses text for key index k and stores it (source/line recorded). Errors name the key and what is allowed. */
int config_set_index(struct config *cfg, int k, const char *text, enum config_source source, int line);
/* The same, recording origin (copied) for --print-config. */
int config_set_index_origin(struct config *cfg, int k, const char *text, enum config_source source, int line,
                            const char *origin);
/* Sets "section.key" (or a flat flag name) from text, as the API source. */
int config_set(struct config *cfg, const char *name, const char *text);

/* Typed getters for keys the program declared; a wrong name or type is a programming error and aborts. */
long long config_get_int(const struct config *cfg, const char *section, const char *name);
double config_get_float(const struct config *cfg, const char *section, const char *name);
bool config_get_bool(const struct config *cfg, const char *section, const char *name);
int config_get_enum(const struct config *cfg, const char *section, const char *name);
/* STRING, PATH and ENUM: the canonical text, "" when unset (never NULL). */
const char *config_get_string(const struct config *cfg, const char *section, const char *name);
bool config_is_set(const struct config *cfg, const char *section, const char *name);

/* --- config_value.c: value syntax ------------------------------------------------------------------- */

/* Normalises a spelling for comparison: lower case, '-' becomes '_'. dst must hold strlen(src) + 1. */
void config_normalize_name(char *dst, const char *src, size_t cap);
/* Parses text against key into *out (text included); on failure sets an error naming the allowed values. */
int config_value_parse(const struct config_key *key, const char *text, struct config_value *out);
/* Writes what the key accepts ("an integer in [1, 64]", "one of: a, b (also: 1 = a)") into buf. */
void config_describe_allowed(const struct config_key *key, char *buf, size_t cap);
const char *config_type_name(enum config_type type);

/* --- config_suggest.c: "did you mean" --------------------------------------------------------------- */

/* Levenshtein distance, capped at 255. */
int config_edit_distance(const char *a, const char *b);
/* The schema key ("section.key") or flat flag nearest to a mistyped name, NULL if nothing is close. */
const char *config_suggest_key(const struct config_schema *schema, const char *name, char *buf, size_t cap);
const char *config_suggest_section(const struct config_schema *schema, const char *name);

/* --- config_load.c: INI files ----------------------------------------------------------------------- */

/* Loads an INI file over cfg. Errors name the file and line: unknown section (lists known ones), unknown
 * key (suggests the nearest), bad value (lists what is allowed), duplicate key (names both lines),
 * over-long line, syntax error. Over-long lines are found before anything is applied; after any other
 * error cfg may hold part of the file, so discard it. */
int config_load_file(struct config *cfg, const char *path);
/* Same for text already in memory; name is used in messages in place of a file name. */
int config_load_string(struct config *cfg, const char *text, const char *name);

/* --- config_override.c: the command line ------------------------------------------------------------ */

/* Program-level flags every program shares, plus the overrides collected from argv. */
struct config_cli {
    bool help;
    bool print_config;
    const char *help_config; /* --help-config[=markdown|ini]: "markdown" when given bare */
    const char *help_env;    /* --help-env[=markdown]: the FSDP_* settings (common/settings.h) */
    const char **positional; /* arguments that are not flags, in order */
    int n_positional;
    /* overrides: key index + value text, in command-line order (a later one wins) */
    int *override_key;
    const char **override_text;
    int n_overrides;
};

/* Parses argv[1..argc-1]: --help/-h, --print-config, --help-config[=FMT], --help-env[=FMT], --log_level=L (applied at once
 * with log_set_level), `--section.key=value`, `--section.key value`, flat flags (`--fsdp_version=2`) and
 * bare flags (`--fsdp_offload_params`). Strings point into argv. Unknown flags fail with a suggestion. */
int config_cli_parse(const struct config_schema *schema, int argc, char **argv, struct config_cli *cli);
/* Applies the collected overrides to cfg (call after loading the file, so they win over it). */
int config_cli_apply(const struct config_cli *cli, struct config *cfg);
void config_cli_free(struct config_cli *cli);

/* --- config_print.c: INI output ------------------------------------------------------------------- */

/* Writes every key's effective value in INI form; config_load_* reads it back to the same config. */
int config_print_ini(const struct config *cfg, FILE *out);
/* The same, with a comment line `; from ORIGIN` above every value that is not the default: what
 * --print-config shows. Loads back to the same values. */
int config_print_ini_origins(const struct config *cfg, FILE *out);

/* --- config_launch.c: settings handed down by a launcher -------------------------------------------- */

/* Which part of FSDP_LAUNCH_CONFIG to apply: the layer under the INI file (an accelerate YAML) or the one
 * over it (the launcher's command line), so that YAML < INI < command line holds across programs. */
enum config_launch_layer { CONFIG_LAUNCH_UNDER_FILE, CONFIG_LAUNCH_OVER_FILE };
/* Applies one layer of a launcher's settings, JSON text
 * {"under_file": [{"key": "fsdp.version", "value": "2", "origin": "acc.yaml:4 (fsdp_config.fsdp_version)"}],
 *  "over_file": [...]}, with source CONFIG_SRC_LAUNCH. NULL or "" applies nothing. Errors name the key and
 * the origin. */
int config_apply_launch(struct config *cfg, const char *json, enum config_launch_layer layer);

/* --- config_doc.c: reference docs ---------------------------------------------------------------- */

/* Writes the Markdown reference of a schema (the text of docs/config.md for fsdp-worker). */
int config_print_markdown(const struct config_schema *schema, FILE *out);

#endif
