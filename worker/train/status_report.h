/* Every rank's live record for fsdp-launch's status page: after each logged step the rank sets the store key
 * "status/rank<R>" to a small JSON object (step, loss, tokens/s, MFU, memory by category, peak RSS, waits on
 * gathers and reductions). A second store connection carries it, so the communicators' own connection never
 * sees it; writes are at most one every STATUS_REPORT_MIN_INTERVAL_S, and a failed write is dropped (the page
 * then shows the rank stale), never an error of the run. Format: docs/launcher.md. */
#ifndef FSDP_WORKER_STATUS_REPORT_H
#define FSDP_WORKER_STATUS_REPORT_H

#include <stdint.h>

#include "rendezvous/store.h"
#include "worker/fsdp/fsdp.h"

#define STATUS_REPORT_MIN_INTERVAL_S 0.25

struct status_report;

struct status_report_step {
    int64_t step, max_steps;  /* steps done, of the run's total */
    double loss, tokens_per_s, mfu; /* mfu < 0: unknown */
    double val_loss;          /* NaN: none yet */
    int64_t val_step;
};

/* NULL store (one rank, no launcher): *out = NULL and every call below does nothing. */
int status_report_open(struct store_client *store, int rank, int restart_count, struct status_report **out);
/* force: write even inside the interval (the last step). */
void status_report_step(struct status_report *r, const struct status_report_step *s, const struct fsdp *f, bool force);
void status_report_close(struct status_report *r);

#endif
