/* Kernel-table calls that tests make with host results: the cross-entropy's loss sum, which the table adds to
 * an accumulator in device memory (kernels.h), read back here through a fresh zeroed one. */
#ifndef FSDP_TESTS_UTIL_TU_KERNELS_H
#define FSDP_TESTS_UTIL_TU_KERNELS_H

#include <stdint.h>

#include "kernels/kernels.h"

/* crossentropy_forward_backward with *sum (host, may be NULL) = the loss sum of this call. The read back
 * synchronises, so a bad target the device found is returned here too. */
static inline int tu_xent(const struct kernels *k, float *losses, double *sum, float *dlogits, const float *logits,
                          const int32_t *targets, int n, int v, int vp, float dloss)
{
    double *acc = sum ? k->mem_alloc(sizeof *acc) : NULL;
    if (sum && !acc)
        return -1;
    int rc = acc ? k->mem_set(acc, 0, sizeof *acc) : 0;
    if (rc == 0)
        rc = k->crossentropy_forward_backward(losses, acc, dlogits, logits, targets, n, v, vp, dloss);
    if (rc == 0 && acc)
        rc = k->mem_copy(sum, acc, sizeof *sum, KERNELS_COPY_D2H);
    k->mem_free(acc);
    return rc;
}

#endif
