/* One reader of /proc/self/status for the resident-memory figures: the training loop, its status record
 * and the checkpoint glue each used to parse it themselves. */
#include "common/rss.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The "Field:   N kB" line of /proc/self/status, in bytes; 0 when absent. */
static size_t status_bytes(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    size_t n = strlen(field), kib = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            kib = strtoull(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kib * 1024;
}

size_t rss_now(void)
{
    return status_bytes("VmRSS");
}

size_t rss_peak(void)
{
    return status_bytes("VmHWM");
}

size_t rss_peak_reset(void)
{
    /* "5" resets the peak RSS mark (Documentation/filesystems/proc.rst, clear_refs). */
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
    return rss_now();
}
