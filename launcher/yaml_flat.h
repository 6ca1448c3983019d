/* A YAML file (libyaml) as a flat list of `dotted.key = text` items with their line numbers: what an
 * accelerate config needs (nested mappings of scalars, lists of scalars). JSON, which YAML contains, reads
 * the same way, so `accelerate config default`'s JSON files load too. */
#ifndef FSDP_LAUNCHER_YAML_FLAT_H
#define FSDP_LAUNCHER_YAML_FLAT_H

#include <stdbool.h>

#define YAML_FLAT_KEY_MAX 128
#define YAML_FLAT_VALUE_MAX 512
/* An accelerate config is a few dozen keys: larger files are refused before parsing, and the key count is
 * bounded too, so a hostile file costs neither memory nor the time of the duplicate-key checks. */
#define YAML_FLAT_MAX_BYTES (1 << 20)
#define YAML_FLAT_MAX_ITEMS 4096

struct yaml_item {
    char key[YAML_FLAT_KEY_MAX];     /* "fsdp_config.fsdp_version" */
    char value[YAML_FLAT_VALUE_MAX]; /* the scalar's text; a list of scalars joined with ',' */
    int line;                        /* 1-based line of the value */
    bool is_null;                    /* null, ~ or nothing: the key is present but unset */
    bool is_mapping;                 /* an empty mapping ({}): present, holds nothing */
};

struct yaml_flat {
    struct yaml_item *items;
    int n;
};

/* Reads path; errors (FSDP_EIO, FSDP_EINVAL) name the file and line: syntax errors as libyaml reports them,
 * a top level that is not a mapping, anchors/aliases, lists of mappings, keys given twice, values longer
 * than YAML_FLAT_VALUE_MAX. */
int yaml_flat_read(const char *path, struct yaml_flat *out);
void yaml_flat_free(struct yaml_flat *y);

#endif
