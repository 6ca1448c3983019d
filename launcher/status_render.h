/* The status page's three views of one snapshot (the /api/status JSON object, docs/launcher.md): Prometheus
 * text and the HTML page with its server-drawn SVG plots. Every string of the snapshot is escaped. */
#ifndef FSDP_LAUNCHER_STATUS_RENDER_H
#define FSDP_LAUNCHER_STATUS_RENDER_H

#include <cjson/cJSON.h>
#include <stdbool.h>

/* malloc'd text, NULL when out of memory. */
char *status_render_prometheus(const cJSON *snap);
/* live: the page polls `/?fragment=1` (with the page's own query, so a token carries over) and swaps its
 * content in place; fragment: only the content, for that poll. */
char *status_render_html(const cJSON *snap, bool live, bool fragment);

#endif
