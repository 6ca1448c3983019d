/* One reader of /proc/<pid>/status for the resident-memory figures: the training loop, its status record,
 * the checkpoint glue and the tests each used to parse it themselves. */
#include "common/rss.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

long rss_status_kib(int pid, const char *field)
{
    char path[64];
    if (pid > 0)
        snprintf(path, sizeof path, "/proc/%d/status", pid);
    else
        snprintf(path, sizeof path, "/proc/self/status");
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[256];
    size_t n = strlen(field);
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            kib = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kib;
}

/* A field of this process's status in bytes; 0 when absent. */
static size_t status_bytes(const char *field)
{
    long kib = rss_status_kib(0, field);
    return kib < 0 ? 0 : (size_t)kib * 1024;
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
