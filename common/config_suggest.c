/* "Did you mean ...?": the nearest declared name to a mistyped one, by edit distance. */
#include "common/config.h"

#include <stdio.h>
#include <string.h>

#define NAME_CAP 128

int config_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la >= NAME_CAP || lb >= NAME_CAP)
        return 255;
    int prev[NAME_CAP + 1], cur[NAME_CAP + 1];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, (lb + 1) * sizeof *prev);
    }
    return prev[lb] > 255 ? 255 : prev[lb];
}

/* Close enough to be a typo rather than a different word: a third of the length, at least 2 edits. */
static int max_distance(const char *name)
{
    int n = (int)strlen(name) / 3;
    return n < 2 ? 2 : n;
}

static void consider(const char *typed, const char *cand_norm, const char *shown, int *best, char *buf,
                     size_t cap)
{
    int d = config_edit_distance(typed, cand_norm);
    if (d < *best) {
        *best = d;
        snprintf(buf, cap, "%s", shown);
    }
}

const char *config_suggest_key(const struct config_schema *schema, const char *name, char *buf, size_t cap)
{
    char typed[NAME_CAP], norm[NAME_CAP], full[2 * NAME_CAP + 2], shown[2 * NAME_CAP + 2];
    config_normalize_name(typed, name, sizeof typed);
    bool dotted = strchr(typed, '.') != NULL;
    int best = max_distance(typed) + 1;
    for (size_t i = 0; i < schema->n_keys; i++) {
        const struct config_key *key = &schema->keys[i];
        snprintf(shown, sizeof shown, "%s.%s", key->section, key->name);
        config_normalize_name(full, shown, sizeof full);
        consider(typed, full, shown, &best, buf, cap);
        if (!dotted) {
            /* "micro_bach" is compared with the key part too, and still answered with the full name. */
            config_normalize_name(norm, key->name, sizeof norm);
            consider(typed, norm, shown, &best, buf, cap);
            for (const char *const *f = key->flags; f && *f; f++) {
                config_normalize_name(norm, *f, sizeof norm);
                consider(typed, norm, *f, &best, buf, cap);
            }
        } else {
            /* "[train] micro_bach" reaches us as "train.micro_bach"; a wrong section with a right key
             * ("optim.micro_batch") should still find train.micro_batch. */
            const char *dot = strchr(typed, '.');
            config_normalize_name(norm, key->name, sizeof norm);
            if (config_edit_distance(dot + 1, norm) == 0)
                consider(typed, typed, shown, &best, buf, cap);
        }
    }
    return best <= max_distance(typed) ? buf : NULL;
}

const char *config_suggest_section(const struct config_schema *schema, const char *name)
{
    char typed[NAME_CAP], norm[NAME_CAP];
    config_normalize_name(typed, name, sizeof typed);
    int best = max_distance(typed) + 1;
    const char *found = NULL;
    for (size_t i = 0; i < schema->n_sections; i++) {
        config_normalize_name(norm, schema->sections[i].name, sizeof norm);
        int d = config_edit_distance(typed, norm);
        if (d < best) {
            best = d;
            found = schema->sections[i].name;
        }
    }
    return found;
}
