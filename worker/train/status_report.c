/* The rank's live record in the store for fsdp-launch's status page (see status_report.h). */
#include "worker/train/status_report.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "common/rss.h"

struct status_report {
    struct store_client *client;
    int rank, restart_count;
    char key[48], host[256];
    double last_write;
    bool warned;
};

int status_report_open(struct store_client *store, int rank, int restart_count, struct status_report **out)
{
    *out = NULL;
    if (!store)
        return 0;
    struct status_report *r = calloc(1, sizeof *r);
    if (!r)
        return error_set(FSDP_ENOMEM, "out of memory for the status report");
    int rc = store_client_clone(store, 10, &r->client);
    if (rc) {
        free(r);
        return rc;
    }
    r->rank = rank;
    r->restart_count = restart_count;
    r->last_write = -1e9;
    snprintf(r->key, sizeof r->key, "status/rank%d", rank);
    if (gethostname(r->host, sizeof r->host - 1))
        snprintf(r->host, sizeof r->host, "?");
    *out = r;
    return 0;
}

static void add_num(cJSON *o, const char *k, double v)
{
    if (isfinite(v))
        cJSON_AddNumberToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

void status_report_step(struct status_report *r, const struct status_report_step *s, const struct fsdp *f, bool force)
{
    if (!r)
        return;
    double now = clock_now_s();
    if (!force && now - r->last_write < STATUS_REPORT_MIN_INTERVAL_S)
        return;
    r->last_write = now;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return;
    cJSON_AddNumberToObject(o, "rank", r->rank);
    cJSON_AddStringToObject(o, "host", r->host);
    cJSON_AddNumberToObject(o, "pid", (double)getpid());
    cJSON_AddNumberToObject(o, "restart", r->restart_count);
    cJSON_AddNumberToObject(o, "step", (double)s->step);
    cJSON_AddNumberToObject(o, "max_steps", (double)s->max_steps);
    add_num(o, "loss", s->loss);
    add_num(o, "val_loss", s->val_loss);
    cJSON_AddNumberToObject(o, "val_step", (double)s->val_step);
    add_num(o, "tokens_per_s", s->tokens_per_s);
    add_num(o, "mfu", s->mfu >= 0 ? s->mfu : NAN);
    cJSON *mem = cJSON_AddObjectToObject(o, "memory");
    const struct fsdp_mem_stats *ms = f ? fsdp_get_mem(f) : NULL;
    if (ms && mem)
        for (int c = 0; c < FSDP_MEM_COUNT; c++)
            cJSON_AddNumberToObject(mem, fsdp_mem_name((enum fsdp_mem)c), (double)ms->now[c]);
    cJSON_AddNumberToObject(o, "memory_peak_bytes", ms ? (double)ms->peak_total : 0);
    cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)rss_peak());
    const struct fsdp_timing *ft = f ? fsdp_get_timing(f) : NULL;
    cJSON_AddNumberToObject(o, "gather_wait_s", ft ? ft->gather_wait_s : 0);
    cJSON_AddNumberToObject(o, "reduce_wait_s", ft ? ft->reduce_wait_s : 0);
    cJSON_AddNumberToObject(o, "time", clock_wall_s());
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text)
        return;
    if (store_client_set(r->client, r->key, text, strlen(text)) && !r->warned) {
        log_warn("status report of rank %d not written (the status page shows it stale): %s", r->rank,
                 error_message());
        r->warned = true;
    }
    free(text);
}

void status_report_close(struct status_report *r)
{
    if (!r)
        return;
    store_client_close(r->client);
    free(r);
}
