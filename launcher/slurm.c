#include "launcher/slurm.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* Hostlists are short (a few thousand names at most); a growable array keeps the expansion simple. */
struct host_vec {
    char **v;
    size_t n, cap;
};

static int vec_push(struct host_vec *hv, const char *s, size_t len)
{
    if (hv->n == hv->cap) {
        size_t cap = hv->cap ? hv->cap * 2 : 16;
        char **v = realloc(hv->v, cap * sizeof *v);
        if (!v)
            return error_set(FSDP_ENOMEM, "out of memory expanding the SLURM nodelist");
        hv->v = v;
        hv->cap = cap;
    }
    char *c = strndup(s, len);
    if (!c)
        return error_set(FSDP_ENOMEM, "out of memory expanding the SLURM nodelist");
    hv->v[hv->n++] = c;
    return 0;
}

/* Expands one name that may hold bracket groups, e.g. "rack[1-2]-gpu[01-02]": the first group is
 * expanded and the remainder recursed on, so every combination comes out in SLURM's order. */
static int expand_name(struct host_vec *hv, const char *prefix, const char *name, size_t len)
{
    const char *lb = memchr(name, '[', len);
    if (!lb) {
        size_t plen = strlen(prefix);
        char *full = malloc(plen + len + 1);
        if (!full)
            return error_set(FSDP_ENOMEM, "out of memory expanding the SLURM nodelist");
        memcpy(full, prefix, plen);
        memcpy(full + plen, name, len);
        full[plen + len] = 0;
        int rc = vec_push(hv, full, plen + len);
        free(full);
        return rc;
    }
    const char *rb = memchr(lb, ']', len - (size_t)(lb - name));
    if (!rb || rb == lb + 1)
        return error_set(FSDP_EINVAL, "SLURM nodelist: unbalanced or empty brackets in '%.*s'", (int)len, name);
    size_t plen = strlen(prefix);
    size_t head = (size_t)(lb - name);
    const char *rest = rb + 1;
    size_t rest_len = len - (size_t)(rest - name);
    const char *p = lb + 1;
    while (p < rb) {
        const char *comma = memchr(p, ',', (size_t)(rb - p));
        const char *end = comma ? comma : rb;
        const char *dash = memchr(p, '-', (size_t)(end - p));
        const char *lo_end = dash ? dash : end;
        int width = (int)(lo_end - p);
        for (const char *q = p; q < end; q++)
            if (!isdigit((unsigned char)*q) && q != dash)
                return error_set(FSDP_EINVAL, "SLURM nodelist: '%.*s' is not a number or range in '%.*s'",
                                 (int)(end - p), p, (int)len, name);
        if (width == 0 || (dash && dash + 1 == end))
            return error_set(FSDP_EINVAL, "SLURM nodelist: empty range bound in '%.*s'", (int)len, name);
        long lo = strtol(p, NULL, 10);
        long hi = dash ? strtol(dash + 1, NULL, 10) : lo;
        if (hi < lo || hi - lo > 100000)
            return error_set(FSDP_EINVAL, "SLURM nodelist: bad range '%.*s' in '%.*s'", (int)(end - p), p,
                             (int)len, name);
        for (long i = lo; i <= hi; i++) {
            char *np = malloc(plen + head + 32);
            if (!np)
                return error_set(FSDP_ENOMEM, "out of memory expanding the SLURM nodelist");
            snprintf(np, plen + head + 32, "%s%.*s%0*ld", prefix, (int)head, name, width, i);
            int rc = expand_name(hv, np, rest, rest_len);
            free(np);
            if (rc)
                return rc;
        }
        p = comma ? comma + 1 : rb;
    }
    return 0;
}

int slurm_expand_nodelist(const char *list, char ***hosts, size_t *nhosts)
{
    struct host_vec hv = {0};
    const char *p = list;
    *hosts = NULL;
    *nhosts = 0;
    int rc = 0;
    while (*p) {
        /* Names are separated by commas outside brackets only. */
        const char *q = p;
        int depth = 0;
        while (*q && (depth > 0 || *q != ',')) {
            if (*q == '[')
                depth++;
            else if (*q == ']')
                depth--;
            q++;
        }
        if (q > p)
            FSDP_TRY_GOTO(expand_name(&hv, "", p, (size_t)(q - p)), rc, fail);
        p = *q ? q + 1 : q;
    }
    if (hv.n == 0) {
        rc = error_set(FSDP_EINVAL, "SLURM nodelist '%s' names no host", list);
        goto fail;
    }
    *hosts = hv.v;
    *nhosts = hv.n;
    return 0;
fail:
    slurm_free_hosts(hv.v, hv.n);
    return rc;
}

void slurm_free_hosts(char **hosts, size_t nhosts)
{
    for (size_t i = 0; i < nhosts; i++)
        free(hosts[i]);
    free(hosts);
}
