/* Collectives whose results the step reads on the device: the engine queues the kernels that read them right
 * after comm_work_order (NCCL: the compute stream waits for the collective's event), and keeps the handles
 * here until the end of the step, where their status is taken. The host never waits for a gather, a
 * reduce-scatter or the norm's all-gather in the middle of a step; on backends that cannot order device work
 * (the CPU), comm_work_order itself waits, as before. */
#include "worker/fsdp/fsdp_internal.h"

#include "common/error.h"

#include <stdlib.h>

/* Handles kept at most: a step of a large model issues a few per unit; loops without a step end (evaluation)
 * take the status of their old ones here, with one host wait per FSDP_ORDERED_MAX collectives. */
#define FSDP_ORDERED_MAX 1024

int fsdp_comm_order(struct fsdp *f, struct comm_work *w)
{
    int rc = comm_work_order(w);
    if (rc == 0 && f->n_ordered == FSDP_ORDERED_MAX)
        rc = fsdp_ordered_drain(f);
    if (rc == 0 && f->n_ordered == f->cap_ordered) {
        int cap = f->cap_ordered ? 2 * f->cap_ordered : 64;
        struct comm_work **grown = realloc(f->ordered, (size_t)cap * sizeof *grown);
        if (!grown)
            rc = error_set(FSDP_ENOMEM, "fsdp: out of memory");
        else
            f->ordered = grown, f->cap_ordered = cap;
    }
    if (rc) {
        comm_work_wait(w); /* frees the handle; the first error is the one passed up */
        return rc;
    }
    f->ordered[f->n_ordered++] = w;
    f->timing.ordered++;
    return 0;
}

int fsdp_ordered_drain(struct fsdp *f)
{
    int rc = 0;
    for (int i = 0; i < f->n_ordered; i++) {
        if (rc) { /* the first error is the one passed up: later waits must not replace its message */
            comm_work_wait(f->ordered[i]);
            continue;
        }
        rc = comm_work_wait(f->ordered[i]);
    }
    f->n_ordered = 0;
    return rc;
}
