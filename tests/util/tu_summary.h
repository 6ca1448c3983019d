/* Reading what a training run records for machines: the run summary fsdp-worker writes per rank
 * (log.dir/run_summary.rank<R>.json, docs/data.md), values in it by path, and the exact text of a value
 * in a metrics.jsonl row (how a number was printed). */
#ifndef FSDP_TESTS_UTIL_TU_SUMMARY_H
#define FSDP_TESTS_UTIL_TU_SUMMARY_H

#include <cjson/cJSON.h>
#include <stdbool.h>

/* Rank `rank`'s summary in logdir, parsed (cJSON_Delete it), or NULL when it is missing or not JSON. */
cJSON *tu_summary_load(const char *logdir, int rank);

/* The value at a dotted path of object members ("memory.peak_rss_bytes"), or NULL. */
const cJSON *tu_json_at(const cJSON *o, const char *path);
/* The number at path, or NAN when it is absent, null or not a number. */
double tu_json_num(const cJSON *o, const char *path);
/* The string at path, or NULL. */
const char *tu_json_str(const cJSON *o, const char *path);

/* Whether o holds what the JSON text `pattern` says: each member of a pattern object is in o with a
 * matching value, each element of a pattern array matches some element of o's array, and other values are
 * equal. `{"plan":{"units":[{"name":"h.1"}]}}` asks for a unit named h.1. A pattern that is not JSON
 * matches nothing. */
bool tu_json_matches(const cJSON *o, const char *pattern);

/* The text of member key's value in a one-line JSON object of numbers and nulls (a metrics.jsonl row),
 * as printed: a pointer into row and its length (up to the next ',' or '}'), or NULL when key is absent. */
const char *tu_json_raw(const char *row, const char *key, size_t *len);

#endif
