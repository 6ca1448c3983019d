/* Cores and GPUs of this node. The launcher does not link CUDA (it must start on machines without a
 * driver), so GPUs are counted the way the driver exposes them. */
#include "launcher/devices.h"

#include <ctype.h>
#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int devices_count_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Calls f for each visible entry of CUDA_VISIBLE_DEVICES ("-1" hides it and every later one); returns the
 * count. */
static int visible_entries(const char *vis, int want, char *out, unsigned cap)
{
    int n = 0;
    for (const char *p = vis; *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == 2 && strncmp(p, "-1", 2) == 0)
            break;
        if (len > 0) {
            if (n == want && out)
                snprintf(out, cap, "%.*s", (int)len, p);
            n++;
        }
        p = c ? c + 1 : p + len;
    }
    return n;
}

int devices_count_gpus(void)
{
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis)
        return visible_entries(vis, -1, NULL, 0);
    int n = 0;
    DIR *d = opendir("/dev");
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *s = e->d_name;
        if (strncmp(s, "nvidia", 6) == 0 && isdigit((unsigned char)s[6])) {
            const char *q = s + 6;
            while (isdigit((unsigned char)*q))
                q++;
            if (!*q)
                n++;
        }
    }
    closedir(d);
    return n;
}

int devices_gpu_id(int index, char *out, unsigned cap)
{
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (!vis) {
        snprintf(out, cap, "%d", index);
        return 0;
    }
    return visible_entries(vis, index, out, cap) > index ? 0 : -1;
}
